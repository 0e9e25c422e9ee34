"""Samples/s of `Trainer.fit` vs a plain PyTorch loop: same model, data, optimizer and schedule, measured in the same run.

The plain loop is the least a training loop can do (forward, loss, zero_grad, backward, step, scheduler step).
The trainer adds: precision policy, accumulation bookkeeping, callbacks, history records every `log_every`
steps (with a device-memory reading), random-state snapshots for exact resume, the nan/inf check, and Ctrl-C
deferral around the update. The smaller the step, the larger that share: the `tiny` case (a 40-100-100-10 MLP at
batch 100, a step of a few hundred µs) is where it shows most.

The machine may be shared, so a single pair of runs can be off by ±30 %. Each case runs `--pairs` short pairs
(plain, trainer — the order alternating from pair to pair, so a drift in the machine's load hits both alike) and
reports the median of the per-pair ratios with its quartiles, for wall time (what a user waits for) and for the
process's CPU time (which descheduling by other processes does not inflate; exact with `--threads 1`).

    python bench/trainer_overhead.py [--case all|cnn|mlp|tiny] [--pairs 15] [--steps 150] [--threads 1]
"""
import argparse, statistics, time, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from netlite_nb.train import Trainer, warmup_cosine

CASES = {  # name -> (model, input shape, batch)
    'cnn': (lambda: nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 10)), (1, 28, 28), 64),
    'mlp': (lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)), (1, 28, 28), 64),
    'tiny': (lambda: nn.Sequential(nn.Linear(40, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10)), (40,), 100),
}

def make_model(case): torch.manual_seed(0); return CASES[case][0]()

def make_data(case, n=4096):
    g, (_, shape, bs) = torch.Generator().manual_seed(0), CASES[case]
    ds = TensorDataset(torch.rand(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g))
    return DataLoader(ds, bs, shuffle=True, generator=torch.Generator().manual_seed(0))

def clocks(): return time.perf_counter(), time.process_time()

def plain(case, dl, steps, lr=1e-3):
    model = make_model(case); opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = warmup_cosine(opt, steps, int(0.05 * steps)); model.train()
    n, step, (w0, c0) = 0, 0, clocks()
    while step < steps:
        for xb, yb in dl:
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
            n += len(yb); step += 1
            if step == steps: break
    w1, c1 = clocks()
    return n / (w1 - w0), n / (c1 - c0)

def trainer(case, dl, steps, lr=1e-3):
    t = Trainer(make_model(case), dl, device='cpu', lr=lr, progress=False, verbose=False, plan=False, seed=None, log_every=10)
    w0, c0 = clocks(); t.fit(steps=steps); w1, c1 = clocks()
    return t.samples / (w1 - w0), t.samples / (c1 - c0)

def quartiles(xs): q = statistics.quantiles(xs, n=4); return q[0], q[2]

def run_case(case, pairs, steps):
    dl = make_data(case)
    plain(case, dl, 20); trainer(case, dl, 20)  # warm up kernels and allocator
    ps, ts = [], []
    for i in range(pairs):
        if i % 2: t = trainer(case, dl, steps); p = plain(case, dl, steps)
        else: p = plain(case, dl, steps); t = trainer(case, dl, steps)
        ps.append(p); ts.append(t)
    wall = [t[0] / p[0] for p, t in zip(ps, ts)]; cpu = [t[1] / p[1] for p, t in zip(ps, ts)]
    return statistics.median(p[0] for p in ps), statistics.median(t[0] for t in ts), wall, cpu

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--case', default='all', choices=['all', *CASES]); ap.add_argument('--pairs', type=int, default=15)
    ap.add_argument('--steps', type=int, default=150)
    ap.add_argument('--threads', type=int, default=1, help='torch threads (1: CPU time is exact and the machine\'s other jobs matter less)')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"{a.pairs} pairs of {a.steps} steps per case, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'case':<6}{'batch':>6}{'plain samples/s':>17}{'Trainer samples/s':>19}{'ratio (wall)':>14}{'quartiles':>15}{'ratio (CPU)':>13}{'quartiles':>15}")
    for case in (CASES if a.case == 'all' else [a.case]):
        p, t, wall, cpu = run_case(case, a.pairs, a.steps)
        print(f"{case:<6}{CASES[case][2]:>6}{p:>17.0f}{t:>19.0f}{statistics.median(wall):>14.3f}{'%.3f–%.3f' % quartiles(wall):>15}"
              f"{statistics.median(cpu):>13.3f}{'%.3f–%.3f' % quartiles(cpu):>15}", flush=True)
    print("ratio: Trainer/plain samples/s, median of the paired runs (target >= 0.95)")
