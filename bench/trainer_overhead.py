"""Samples/s of `Trainer.fit` vs a plain PyTorch loop: same model, data, optimizer and schedule, measured in the same run.

The plain loop is the least a training loop can do (forward, loss, zero_grad, backward, step, scheduler step).
The trainer adds: precision policy, accumulation bookkeeping, callbacks, history records every `log_every`
steps (with a device-memory reading), random-state snapshots for exact resume, and Ctrl-C deferral around the update.
Runs alternate (plain, trainer, plain, ...) and the median of `--repeats` is reported, because the CPU is shared.

    python bench/trainer_overhead.py [--steps 150] [--repeats 3] [--model cnn|mlp] [--threads 1]
"""
import argparse, statistics, time, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from netlite_nb.train import Trainer, warmup_cosine

def make_model(kind):
    torch.manual_seed(0)
    if kind == 'mlp': return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 10))

def make_data(n, bs):
    g = torch.Generator().manual_seed(0)
    ds = TensorDataset(torch.rand(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, bs, shuffle=True, generator=torch.Generator().manual_seed(0))

def plain(kind, dl, steps, lr=1e-3):
    model = make_model(kind); opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = warmup_cosine(opt, steps, int(0.05 * steps)); model.train()
    n, step, t0 = 0, 0, time.perf_counter()
    while step < steps:
        for xb, yb in dl:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
            n += len(yb); step += 1
            if step == steps: break
    return n / (time.perf_counter() - t0), loss.item()

def trainer(kind, dl, steps, lr=1e-3):
    t = Trainer(make_model(kind), dl, device='cpu', lr=lr, progress=False, verbose=False, plan=False, seed=None, log_every=10)
    t0 = time.perf_counter(); t.fit(steps=steps)
    return t.samples / (time.perf_counter() - t0), t.history[-1]['loss']

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--steps', type=int, default=150); ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--model', default='cnn'); ap.add_argument('--batch', type=int, default=64)
    ap.add_argument('--threads', type=int, default=None, help='torch threads (1 steadies timings on a busy machine)')
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    dl = make_data(4096, a.batch)
    plain(a.model, dl, 10); trainer(a.model, dl, 10)  # warm up kernels and allocator
    ps, ts = [], []
    for _ in range(a.repeats):
        ps.append(plain(a.model, dl, a.steps)[0]); ts.append(trainer(a.model, dl, a.steps)[0])
    p, t = statistics.median(ps), statistics.median(ts)
    pair = statistics.median(b / a for a, b in zip(ps, ts))  # each trainer run against the plain run just before it
    print(f"model {a.model}, batch {a.batch}, {a.steps} steps × {a.repeats} repeats, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'loop':<14}{'samples/s (median)':>20}{'all runs':>32}")
    print(f"{'plain PyTorch':<14}{p:>20.0f}{'  ' + ' '.join(f'{x:.0f}' for x in ps):>32}")
    print(f"{'Trainer.fit':<14}{t:>20.0f}{'  ' + ' '.join(f'{x:.0f}' for x in ts):>32}")
    print(f"ratio Trainer/plain: of the medians {t / p:.3f}, median of paired runs {pair:.3f} (target >= 0.95)")
