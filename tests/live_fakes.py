"Stand-ins for chapter 08's tests: synthetic data for the real Trainer, a fake clock, a fake GPU reader, a fake trainer for throttling checks."
import types
import torch
from torch import nn
from netlite_nb.probe import MemoryReading

GB = 2**30


def synthetic_data(n=2048, bs=64, seed=0):
    "A (train, valid) pair of batch lists: a linear 10-class problem the Trainer learns in seconds on a CPU."
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    y = (x @ torch.randn(20, 10, generator=g)).argmax(1)
    k = n * 3 // 4
    return [(x[i:i + bs], y[i:i + bs]) for i in range(0, k, bs)], [(x[k:], y[k:])]


def small_model(): return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 10))


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
                                    'micro_batch': 64, 'accum_steps': 1, 'total_steps': 1000, 'opts': types.SimpleNamespace(verbose=False), **kw})


def run_steps(dash, tr, n, clock=None, dt=0.0):
    "Append `n` training records and call the dashboard as the Trainer would, advancing `clock` by `dt` per step."
    for _ in range(n):
        s = len(tr.history) + 1 if not tr.history else tr.history[-1]['step'] + 1
        tr.history.append(dict(step=s, epoch=0, loss=1 / s, lr=1e-3, time=s * 0.01, samples=64 * s))
        if clock is not None: clock.t += dt
        dash.before_batch(tr); dash.after_backward(tr); dash.after_step(tr); dash.after_batch(tr)
