"""The Trainer's documented path (`lr='auto'`, everything else at its default) against the best of two plain-PyTorch recipes, on
seven task families the toolkit was never tuned on, made here offline (no download is possible in CI or on this machine):

- `tabular`: five interleaved noisy spiral arms in the plane (a classic toy for nonlinear classifiers); a 3-layer MLP.
- `regression`: Friedman #1 (Friedman 1991; scikit-learn's `make_friedman1`), 10 features of which 5 matter, noise σ 1; an MLP
  with one output and mean-squared error (the Trainer is told `task='regression'`). Scored by R² on held-out data.
- `imbalanced`: ten Gaussian classes whose frequencies fall geometrically (0.6^c: the rarest is 1/100 of the commonest); an MLP.
  Scored by balanced accuracy (the mean recall over classes), which plain accuracy would hide.
- `images`: 28×28 grey images of six shapes at random places, sizes and brightness under heavy pixel noise; a textbook CNN.
- `seq-cnn`: 1-D signals of four waveforms (sine, square, triangle, sawtooth) at random frequency and phase, noise σ 0.8; a 1-D CNN.
- `seq-gru`: a memory task, the class held in the first of 12 noisy steps; a GRU that must carry it to the end (the case where
  a short rate sweep sees only a plateau).
- `text`: token sequences of 20 from a vocabulary of 100, four topics each owning 10 words, 3–6 topic words among filler words;
  an embedding-bag classifier (embedding, mean over the sequence, linear).

The plain recipes are what a careful practitioner writes without tuning: Adam at its default lr 1e-3, constant; and SGD with
momentum 0.9 at lr 0.01, constant — for the CNN on images pytorch/examples' MNIST recipe instead (Adadelta lr 1.0, StepLR γ 0.7
per pass over the data). The documented path is `Trainer(model, loader, lr='auto')` (plus `task='regression'` for the
regression, whose loss it then chooses): AdamW, weight decay 0.01, warmup and cosine, the rate found by `lr_find`. Every
recipe runs the same number of optimizer steps on the same batches of 64; the rate finder's sweeps come on top. Each cell is
the median over `--seeds` seeds (initialisation and shuffling). The target: the documented path within 1 pp of the best plain
recipe (for the regression: its held-out MSE within 5 % of the best plain one's).

    python bench/default_workflow.py [--steps 500] [--seeds 3] [--families tabular,regression,...] [--threads 1]

It writes bench/results/default_workflow/<machine>.json (machine, torch, commit, date, every run and the medians); chapter 07
renders its table from that file. Accuracy does not depend on the machine's load, so a shared machine changes only how long it takes.
"""
import argparse, math, os, platform, statistics, sys, time
from pathlib import Path
import numpy as np, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from budget_accuracy import machine, _git, _slug, save_result, ROOT  # also puts this checkout's netlite_nb first on the path
from netlite_nb.train import Trainer


def _ds(x, y): return TensorDataset(torch.as_tensor(x), torch.as_tensor(y))

def spiral(n, r, arms=5):
    y = r.integers(0, arms, n); t = r.uniform(0.1, 1, n)
    ang = y * 2 * math.pi / arms + t * 3 * math.pi + r.normal(0, 0.25, n)
    return _ds(np.stack([t * np.cos(ang), t * np.sin(ang)], 1).astype(np.float32), y)

def friedman1(n, r):
    x = r.uniform(0, 1, (n, 10)).astype(np.float32)
    y = 10 * np.sin(np.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4] + r.normal(0, 1, n)
    return _ds(x, y.astype(np.float32)[:, None])

def imbalanced(n, r, k=10):
    p = 0.6 ** np.arange(k); y = r.choice(k, n, p=p / p.sum())
    centres = np.random.default_rng(123).normal(0, 1.2, (k, 20))   # the same classes in every split
    return _ds((centres[y] + r.normal(0, 1, (n, 20))).astype(np.float32), y)

def shapes(n, r):
    yy, xx = np.mgrid[0:28, 0:28].astype(np.float32)
    x, y = np.zeros((n, 1, 28, 28), np.float32), r.integers(0, 6, n)
    for i in range(n):
        cx, cy, s = r.uniform(9, 19), r.uniform(9, 19), r.uniform(4, 8)
        dx, dy, d = xx - cx, yy - cy, np.hypot(xx - cx, yy - cy)
        m = [d < s, (d < s) & (d > s - 2), (abs(dx) < s) & (abs(dy) < s),
             (abs(dx) < s) & (abs(dy) < s) & ~((abs(dx) < s - 2) & (abs(dy) < s - 2)),
             (dy < s) & (dy > -s) & (abs(dx) < (dy + s) / 2), ((abs(dx) < 1.5) & (abs(dy) < s)) | ((abs(dy) < 1.5) & (abs(dx) < s))][y[i]]
        x[i, 0] = m * r.uniform(0.5, 1.0)
    return _ds(x + r.normal(0, 0.35, x.shape).astype(np.float32), y)

def waves(n, r, length=64):
    y = r.integers(0, 4, n); f = r.uniform(2, 6, n)[:, None]; ph = r.uniform(0, 1, n)[:, None]
    u = (np.arange(length)[None] / length * f + ph) % 1.0
    w = np.select([y[:, None] == 0, y[:, None] == 1, y[:, None] == 2], [np.sin(2 * np.pi * u), np.sign(u - 0.5), 4 * abs(u - 0.5) - 1], 2 * u - 1)
    return _ds((w + r.normal(0, 0.8, w.shape))[:, None].astype(np.float32), y)

def memory(n, r, T=12):
    y = r.integers(0, 10, n); x = r.normal(0, 0.5, (n, T, 1)); x[:, 0, 0] = (y - 4.5) / 2
    return _ds(x.astype(np.float32), y)

def topics(n, r, vocab=100, length=20):
    y = r.integers(0, 4, n); x = r.integers(40, vocab, (n, length))   # words 40..99 are filler
    for i in range(n):
        k = r.integers(3, 7); x[i, r.choice(length, k, replace=False)] = y[i] * 10 + r.integers(0, 10, k)
    return _ds(x, y)


class GRUNet(nn.Module):
    def __init__(self): super().__init__(); self.gru, self.head = nn.GRU(1, 32, batch_first=True), nn.Linear(32, 10)
    def forward(self, x): return self.head(self.gru(x)[0][:, -1])

class BagOfWords(nn.Module):
    def __init__(self): super().__init__(); self.emb, self.head = nn.Embedding(100, 32), nn.Linear(32, 4)
    def forward(self, x): return self.head(self.emb(x).mean(1))

def mlp(d_in, d_out, h=128): return nn.Sequential(nn.Linear(d_in, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, d_out))
def cnn(): return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
                                nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 6))
def cnn1d(): return nn.Sequential(nn.Conv1d(1, 16, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(),
                                  nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(32, 4))

FAMILIES = {  # name: (data, model, score, second plain recipe)
    'tabular': (spiral, lambda: mlp(2, 5), 'accuracy', 'sgd'),
    'regression': (friedman1, lambda: mlp(10, 1, 64), 'r2', 'sgd'),
    'imbalanced': (imbalanced, lambda: mlp(20, 10), 'balanced_accuracy', 'sgd'),
    'images': (shapes, cnn, 'accuracy', 'adadelta'),
    'seq-cnn': (waves, cnn1d, 'accuracy', 'sgd'),
    'seq-gru': (memory, GRUNet, 'accuracy', 'sgd'),
    'text': (topics, BagOfWords, 'accuracy', 'sgd'),
}


def loader(ds, seed): return DataLoader(ds, 64, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(seed))

@torch.no_grad()
def score(model, ds, kind)->dict:
    model.eval(); out, y = model(ds.tensors[0]), ds.tensors[1]
    if kind == 'r2':
        mse = F.mse_loss(out, y).item()
        return {'r2': 1 - mse / y.var(unbiased=False).item(), 'mse': mse}
    pred = out.argmax(1)
    recall = [((pred == c) & (y == c)).sum().item() / (y == c).sum().item() for c in y.unique()]
    return {'accuracy': (pred == y).float().mean().item(), 'balanced_accuracy': float(np.mean(recall))}

def plain(make, recipe, train, test, kind, steps, seed)->dict:
    "The tutorial loop: forward, loss, backward, step; Adadelta's StepLR once per pass over the data."
    torch.manual_seed(seed); model = make(); dl = loader(train, seed)
    opt = {'adam': lambda p: torch.optim.Adam(p, lr=1e-3), 'sgd': lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
           'adadelta': lambda p: torch.optim.Adadelta(p, lr=1.0)}[recipe](model.parameters())
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7) if recipe == 'adadelta' else None
    loss_fn, step = (F.mse_loss if kind == 'r2' else F.cross_entropy), 0
    while step < steps:
        for xb, yb in dl:
            model.train(); loss = loss_fn(model(xb), yb)
            opt.zero_grad(); loss.backward(); opt.step(); step += 1
            if step == steps: break
        if sched is not None: sched.step()
    return {**score(model, test, kind), 'lr': opt.param_groups[0].get('initial_lr', opt.param_groups[0]['lr'])}

def documented(make, train, test, kind, steps, seed)->dict:
    "The documented path: lr='auto' and the defaults; the regression says task='regression'."
    torch.manual_seed(seed)
    t = Trainer(make(), loader(train, seed), device='cpu', progress=False, verbose=False, plan=False, lr='auto', threads=None,
                **({'task': 'regression'} if kind == 'r2' else {}))
    t.fit(steps=steps)
    f = t.lr_found
    return {**score(t.model, test, kind), 'lr': f.suggestion, 'sweeps': f.sweeps, 'fallback': f.fallback, 'decision': f.decision}

def within(doc:float, best:float, kind:str, mse_doc=None, mse_best=None)->bool:
    "The target: within 1 pp of the best plain recipe (regression: held-out MSE within 5 % of the best plain one's)."
    return mse_doc <= 1.05 * mse_best if kind == 'r2' else doc >= best - 0.01

def run_family(name, steps, seeds)->dict:
    data, make, kind, second = FAMILIES[name]
    train, test = data(6000, np.random.default_rng(1)), data(2000, np.random.default_rng(2))
    t0 = time.time()
    runs = {'plain adam 1e-3': [plain(make, 'adam', train, test, kind, steps, s) for s in range(seeds)],
            f"plain {second}": [plain(make, second, train, test, kind, steps, s) for s in range(seeds)],
            "Trainer lr='auto'": [documented(make, train, test, kind, steps, s) for s in range(seeds)]}
    med = {k: {m: statistics.median(r[m] for r in v) for m in (kind, 'lr') + (('mse',) if kind == 'r2' else ())} for k, v in runs.items()}
    plains = [k for k in runs if k.startswith('plain')]
    best = max(plains, key=lambda k: med[k][kind])
    doc = med["Trainer lr='auto'"]
    ok = within(doc[kind], med[best][kind], kind, doc.get('mse'), med[best].get('mse'))
    return dict(score=kind, steps=steps, seeds=seeds, seconds=time.time() - t0, runs=runs, medians=med, best_plain=best,
                gap=doc[kind] - med[best][kind], within_target=ok)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=500); ap.add_argument('--seeds', type=int, default=3)
    ap.add_argument('--families', default=','.join(FAMILIES)); ap.add_argument('--threads', type=int, default=1)
    ap.add_argument('--out', default=None, help='the JSON file to write (default: bench/results/default_workflow/<machine>.json)')
    a = ap.parse_args(); torch.set_num_threads(a.threads)
    mach = machine()
    who = '-'.join(_slug(x) for x in (mach['cpu_vendor'] or '', mach['isa'], mach['cpu'].replace(mach['cpu_vendor'] or '', '')) if x)
    path = Path(a.out) if a.out else ROOT / 'bench' / 'results' / 'default_workflow' / f"{who}.json"
    result = dict(bench='default_workflow', machine=mach, torch=torch.__version__, python=platform.python_version(),
                  date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None,
                  dirty=bool(_git('status', '--porcelain', '--untracked-files=no')), source='bench/default_workflow.py ' + ' '.join(sys.argv[1:]),
                  target='the documented path within 1 pp of the best plain recipe (regression: held-out MSE within 5 %)', families={}, complete=False)
    names = a.families.split(',')
    for name in names:
        fam = result['families'][name] = run_family(name, a.steps, a.seeds)
        result['complete'] = len(result['families']) == len(names)
        save_result(path, result)  # after each family: a long run that is cut short keeps what it measured
        m, kind = fam['medians'], fam['score']
        print(f"\n{name}: {a.steps} steps of 64, held-out {kind}, median of {a.seeds} seeds ({fam['seconds']:.0f} s)", flush=True)
        for label, v in m.items(): print(f"  {label:24s} {v[kind]:.4f}  lr {v['lr']:.3g}" + (f"  mse {v['mse']:.3f}" if 'mse' in v else ''))
        print(f"  documented path vs {fam['best_plain']}: {fam['gap']:+.4f} -> {'within' if fam['within_target'] else 'OUTSIDE'} the target", flush=True)
    print(f"\nwrote {path}")

if __name__ == '__main__': main()
