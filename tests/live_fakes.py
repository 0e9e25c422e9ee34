"Stand-ins for chapter 08's tests: a toy trainer with the chapter 07 `Trainer`'s attributes and callback order, a fake clock, a fake GPU reader."
import time, types
import torch
from torch import nn
from netlite_nb.probe import MemoryReading, device_memory

GB = 2**30


class ToyTrainer:
    "The chapter 07 `Trainer`'s attributes and callback order on a synthetic 10-class problem (until chapter 07 is merged)."
    def __init__(self, callbacks=(), n=2048, bs=64, seed=0, delay=0.0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 20, generator=g)
        self.y = (self.x @ torch.randn(20, 10, generator=g)).argmax(1)
        self.model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))
        self.opt = torch.optim.AdamW(self.model.parameters(), 3e-3)
        self.callbacks, self.bs, self.delay, self.history = list(callbacks), bs, delay, []
        self.device, self.precision, self.plan, self.micro_batch, self.accum_steps = 'cpu', 'fp32', None, bs, 1

    def _cb(self, name, *a):
        for c in self.callbacks: getattr(c, name)(self, *a)

    def fit(self, epochs=3):
        self.total_steps, step, t0, seen = epochs * (len(self.x) // self.bs), 0, time.perf_counter(), 0
        self._cb('before_fit')
        for epoch in range(epochs):
            self._cb('before_epoch')
            for i in range(0, len(self.x) - self.bs + 1, self.bs):
                self._cb('before_batch')
                loss = nn.functional.cross_entropy(self.model(self.x[i:i + self.bs]), self.y[i:i + self.bs])
                loss.backward(); self._cb('after_backward')
                self.opt.step(); self.opt.zero_grad(); self._cb('after_step')
                if self.delay: time.sleep(self.delay)
                step += 1; seen += self.bs
                m = device_memory('cpu')
                self.history.append(dict(step=step, epoch=epoch, loss=loss.item(), lr=3e-3, time=time.perf_counter() - t0,
                                         samples=seen, mem=m.current, mem_peak=m.peak))
                self._cb('after_batch')
            with torch.no_grad(): out = self.model(self.x[-512:])
            self.history.append(dict(step=step, epoch=epoch, valid_loss=nn.functional.cross_entropy(out, self.y[-512:]).item(),
                                     accuracy=(out.argmax(1) == self.y[-512:]).float().mean().item()))
            self._cb('after_validate'); self._cb('after_epoch')
        self._cb('after_fit')
        return self.history


class FakeClock:
    "A clock that moves only when told to."
    def __init__(self): self.t = 0.0
    def __call__(self): return self.t


def fake_reader(gb_allocated=1.0):
    "A `device -> MemoryReading` that plays a 4 GB CUDA card."
    def read(device):
        return MemoryReading('cuda:0', allocated=int(gb_allocated * GB), reserved=int(1.5 * gb_allocated * GB),
                             peak_allocated=int(1.2 * gb_allocated * GB), peak_reserved=int(1.6 * gb_allocated * GB),
                             total=4 * GB, source='fake')
    return read


def fake_trainer(**kw):
    return types.SimpleNamespace(**{'history': [], 'device': 'cuda:0', 'precision': 'fp16', 'plan': types.SimpleNamespace(peak=int(1.4 * GB)),
                                    'micro_batch': 64, 'accum_steps': 1, 'total_steps': 1000, **kw})


def run_steps(dash, tr, n, clock=None, dt=0.0):
    "Append `n` training records and call the dashboard as the Trainer would, advancing `clock` by `dt` per step."
    for _ in range(n):
        s = len(tr.history) + 1 if not tr.history else tr.history[-1]['step'] + 1
        tr.history.append(dict(step=s, epoch=0, loss=1 / s, lr=1e-3, time=s * 0.01, samples=64 * s))
        if clock is not None: clock.t += dt
        dash.before_batch(tr); dash.after_backward(tr); dash.after_step(tr); dash.after_batch(tr)
