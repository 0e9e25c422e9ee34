"""Held-out accuracy of the Trainer's workflows against a plain-PyTorch textbook recipe, on problems the toolkit was never tuned on.

The problems are made here, offline (no download is possible in CI or on this machine), and none is the embedded digits sample:

- `shapes`: 28×28 grey images of six shapes (disc, ring, square, frame, triangle, plus) at random places, sizes and
  brightness, under heavy pixel noise; models: a textbook 3-layer CNN and a 3-layer MLP.
- `spiral`: five interleaved noisy spiral arms in the plane (a classic toy for nonlinear classifiers); model: a 3-layer MLP.
- `digits-cnn`: the embedded digits sample (4,000 training, 1,000 held-out images) with the CNN: not a new problem, the
  check that the workflow chosen on the others is no worse where the book started.

The plain recipes are the ones a tutorial writes without tuning: for the CNN, pytorch/examples' MNIST recipe (Adadelta,
lr 1.0, StepLR γ 0.7 once per pass over the data); for the MLPs, Adam at its default lr 1e-3, constant. Every recipe runs
the same number of optimizer steps on the same batches of 64 (lr_find's sweep of up to 100 steps comes on top, and is
counted in the last column). Each cell is the median over `--seeds` seeds (model initialisation and shuffling), all measured
in this one run. Accuracy does not depend on the machine's load, so the shared machine changes only how long this takes.

    python bench/default_workflow.py [--steps 500] [--seeds 3] [--problems shapes-cnn,shapes-mlp,spiral-mlp,digits-cnn] [--threads 1]
"""
import argparse, math, statistics, time
import numpy as np, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from netlite_nb.train import Trainer

def shapes(n:int, seed:int)->TensorDataset:
    "Six shape classes drawn with numpy: random centre, size and brightness, Gaussian pixel noise of σ 0.35."
    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float32)
    x, y = np.zeros((n, 1, 28, 28), np.float32), r.integers(0, 6, n)
    for i in range(n):
        cx, cy, s = r.uniform(9, 19), r.uniform(9, 19), r.uniform(4, 8)
        dx, dy, d = xx - cx, yy - cy, np.hypot(xx - cx, yy - cy)
        m = [d < s, (d < s) & (d > s - 2), (abs(dx) < s) & (abs(dy) < s),
             (abs(dx) < s) & (abs(dy) < s) & ~((abs(dx) < s - 2) & (abs(dy) < s - 2)),
             (dy < s) & (dy > -s) & (abs(dx) < (dy + s) / 2), ((abs(dx) < 1.5) & (abs(dy) < s)) | ((abs(dy) < 1.5) & (abs(dx) < s))][y[i]]
        x[i, 0] = m * r.uniform(0.5, 1.0)
    x += r.normal(0, 0.35, x.shape).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

def spiral(n:int, seed:int, arms:int=5)->TensorDataset:
    "`arms` noisy spiral arms in the plane, one class each."
    r = np.random.default_rng(seed)
    y = r.integers(0, arms, n); t = r.uniform(0.1, 1, n)
    ang = y * 2 * math.pi / arms + t * 3 * math.pi + r.normal(0, 0.25, n)
    x = np.stack([t * np.cos(ang), t * np.sin(ang)], 1).astype(np.float32)
    return TensorDataset(torch.from_numpy(x), torch.from_numpy(y))

def cnn(): return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 6))
def cnn_for(classes): m = cnn(); m[-1] = nn.Linear(64, classes); return m
def mlp(d_in, d_out, h=256): return nn.Sequential(nn.Flatten(), nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, d_out))

PROBLEMS = {  # name: (data, model, plain recipe)
    'shapes-cnn': (shapes, cnn, 'adadelta'),
    'shapes-mlp': (shapes, lambda: mlp(784, 6), 'adam'),
    'spiral-mlp': (spiral, lambda: mlp(2, 5, 128), 'adam'),
    'digits-cnn': (None, lambda: cnn_for(10), 'adadelta'),   # the embedded digits: the check that nothing got worse there
}
RECIPES = {  # Trainer options of each workflow compared
    'defaults (lr 1e-3, cosine)': {},
    "lr='auto' (steepest>=min/10), cosine": dict(lr='auto'),
    "lr='auto' (steepest>=min/10), onecycle": dict(lr='auto', lr_schedule='onecycle'),
    "lr='auto' (min/10), cosine": dict(lr='auto', rule='min/10'),
    "lr='auto' (steepest), cosine": dict(lr='auto', rule='steepest'),
}

def _digits()->tuple:
    from netlite_nb.data import mnist_sample
    return tuple(TensorDataset(torch.stack([ds[i][0] for i in range(len(ds))]), torch.stack([ds[i][1] for i in range(len(ds))])) for ds in mnist_sample())

def loader(ds, seed): return DataLoader(ds, 64, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed))

def accuracy(model, ds)->float:
    model.eval()
    with torch.no_grad(): return (model(ds.tensors[0]).argmax(1) == ds.tensors[1]).float().mean().item()

def plain(make, recipe, train, test, steps, seed)->tuple[float, float]:
    "The tutorial loop: forward, loss, backward, step; the scheduler once per pass over the data (Adadelta's recipe)."
    torch.manual_seed(seed); model = make(); dl = loader(train, seed)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0) if recipe == 'adadelta' else torch.optim.Adam(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7) if recipe == 'adadelta' else None
    step = 0
    while step < steps:
        for xb, yb in dl:
            model.train(); loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(); loss.backward(); opt.step(); step += 1
            if step == steps: break
        if sched is not None: sched.step()
    return accuracy(model, test), 1.0 if recipe == 'adadelta' else 1e-3

def trainer(make, opts, train, test, steps, seed)->tuple[float, float]:
    torch.manual_seed(seed); model = make()
    rule = opts.get('rule')
    t = Trainer(model, loader(train, seed), device='cpu', progress=False, verbose=False, plan=False, seed=seed,
                **{k: v for k, v in opts.items() if k != 'rule'})
    if rule is not None: t.lr_found = t.lr_find(rule=rule); t._set_lr(t.lr_found.suggestion)  # then `fit` keeps the rate found
    t.fit(steps=steps)
    return accuracy(t.model, test), t.lr_found.suggestion if t.lr_found is not None else 1e-3

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=500); ap.add_argument('--seeds', type=int, default=3)
    ap.add_argument('--problems', default=','.join(PROBLEMS)); ap.add_argument('--threads', type=int, default=1)
    a = ap.parse_args(); torch.set_num_threads(a.threads)
    for name in a.problems.split(','):
        data, make, recipe = PROBLEMS[name]
        train, test = (data(6000, 1), data(2000, 2)) if data is not None else _digits()
        rows, t0 = {f"plain PyTorch ({recipe})": [plain(make, recipe, train, test, a.steps, s) for s in range(a.seeds)]}, time.time()
        for label, opts in RECIPES.items(): rows[label] = [trainer(make, opts, train, test, a.steps, s) for s in range(a.seeds)]
        base = statistics.median(acc for acc, _ in next(iter(rows.values())))
        print(f"\n{name}: {a.steps} optimizer steps of 64, held-out accuracy, median of {a.seeds} seeds ({time.time() - t0:.0f} s)")
        print(f"| recipe | accuracy | vs plain | lr used (median) |\n|---|---|---|---|")
        for label, res in rows.items():
            acc = statistics.median(r[0] for r in res); lr = statistics.median(r[1] for r in res)
            print(f"| {label} | {100 * acc:.1f} % | {100 * (acc - base):+.1f} pp | {lr:.3g} |")

if __name__ == '__main__': main()
