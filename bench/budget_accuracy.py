"""How close is `plan_memory` to a real step? Predicted peak vs. the measured peak of a fresh process, on CPU (and CUDA when present).

    python bench/budget_accuracy.py            # accuracy table: 3 models x 3 batch sizes
    python bench/budget_accuracy.py --budgets  # max_batch_size at 0.5/1/2 GiB budgets, checked by measurement
                                               # (--models cnn transformer --gib 0.5 1 to run a part)
    python bench/budget_accuracy.py --gemm     # the CPU BLAS workspace a tensor trace cannot see

CPU measurement: each case runs in a fresh `python` process with glibc told to serve every allocation above 64 KiB with its own
mmap (MALLOC_MMAP_THRESHOLD_ fixed, which also stops glibc raising the threshold as blocks are freed) and one arena
(MALLOC_ARENA_MAX=1), so a freed tensor's pages go back to the OS at once and the resident set tracks live tensors. The process
warms up the kernels on a small batch, then resets the kernel's RSS high-water mark (/proc/self/clear_refs) and runs the same
two training steps the planner traces. Measured tensor peak = peak RSS - RSS before the steps + bytes of the tensors already
alive then (weights, buffers, batch), which the planner counts too.
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path
import torch
from torch import nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
ENV = dict(MALLOC_MMAP_THRESHOLD_='65536', MALLOC_ARENA_MAX='1', MALLOC_TRIM_THRESHOLD_='0', OMP_NUM_THREADS='1')

def mlp(): return nn.Sequential(nn.Flatten(), nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))

def cnn():
    def dw(c_in, c_out):  # depthwise 3x3 + pointwise 1x1, each with BatchNorm
        return nn.Sequential(nn.Conv2d(c_in, c_in, 3, padding=1, groups=c_in, bias=False), nn.BatchNorm2d(c_in), nn.ReLU(),
                             nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         dw(32, 64), nn.MaxPool2d(2), dw(64, 128), nn.MaxPool2d(2), dw(128, 256),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))

class Transformer(nn.Module):
    def __init__(self, d=256, heads=4, layers=4):
        super().__init__()
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, 4*d, dropout=0.1, batch_first=True), layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)
    def forward(self, x): return self.head(self.blocks(x).mean(1))

MODELS = {'mlp': (mlp, (1, 28, 28), (256, 1024, 4096)), 'cnn': (cnn, (3, 64, 64), (16, 64, 128)),
          'transformer': (Transformer, (128, 256), (8, 32, 64))}

def make(name, bs, seed=0):
    f, shape, _ = MODELS[name]
    torch.manual_seed(seed)
    return f(), (torch.randn(bs, *shape), torch.randint(0, 10, (bs,)))

def _rss()->int:
    with open('/proc/self/statm') as f: return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

def _hwm()->int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM'): return int(line.split()[1]) * 1024

def _steps(model, opt, x, y, n=2):
    for _ in range(n):
        out = model(x)  # held through backward, as a loop that also computes accuracy does (and as the planner traces)
        loss = F.cross_entropy(out, y)
        loss.backward()
        del out, loss
        opt.step()
        opt.zero_grad(set_to_none=True)

def measure(name, bs)->int:
    "Run in a fresh process: the measured peak tensor bytes of two AdamW training steps."
    import gc
    torch.set_num_threads(1)
    model, (x, y) = make(name, bs)
    warm = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _steps(model, warm, x[:2], y[:2], 1)  # load kernels, fault in code pages
    del warm
    for p in model.parameters(): p.grad = None
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gc.collect()
    alive = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x, y])
    base = _rss()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')  # reset the RSS high-water mark
    _steps(model, opt, x, y, 2)
    return _hwm() - base + alive

def measured(name, bs)->int:
    out = subprocess.run([sys.executable, __file__, '--measure', name, str(bs)], env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])

def predicted(name, bs, **kw)->int:
    from netlite_nb.budget import plan_memory
    model, batch = make(name, bs)
    return plan_memory(model, batch, optimizer='adamw', **kw).peak

def accuracy_table():
    print(f"{'model':<12}{'batch':>6}{'predicted':>12}{'measured':>12}{'error':>8}")
    errs = []
    for name, (_, _, sizes) in MODELS.items():
        for bs in sizes:
            p, m = predicted(name, bs), measured(name, bs)
            errs.append((p - m) / m)
            print(f"{name:<12}{bs:>6}{p/2**20:>10.1f}Mi{m/2**20:>10.1f}Mi{100*errs[-1]:>+7.1f}%", flush=True)
    print(f"max |error| {100*max(abs(e) for e in errs):.1f}%")

def gemm_workspace()->float:
    "MiB a single large CPU matmul allocates beyond its output (the BLAS library's packing buffers): invisible to any tensor trace."
    torch.set_num_threads(1)
    a, w = torch.randn(1024, 4096), torch.randn(4096, 4096)
    a[:2] @ w  # load the kernels
    base = _rss()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')
    c = a @ w
    return (_hwm() - base - c.nbytes) / 2**20

def budgets_table(models=tuple(MODELS), budgets=(0.5, 1, 2)):
    from netlite_nb.budget import max_batch_size
    print(f"{'model':<12}{'budget':>8}{'solved':>8}{'predicted@b':>13}{'measured@b':>12}{'measured@b+1':>14}  ok")
    for name in models:
        for gb in budgets:
            model, batch = make(name, 2)
            b = max_batch_size(model, batch, budget=int(gb * 2**30), optimizer='adamw')
            p0, m0, m1 = predicted(name, b), measured(name, b), measured(name, b + 1)
            ok = m0 <= gb * 2**30 < m1
            print(f"{name:<12}{gb:>6.1f}Gi{b:>8}{p0/2**20:>11.1f}Mi{m0/2**20:>10.1f}Mi{m1/2**20:>12.1f}Mi  {'yes' if ok else 'NO'}", flush=True)

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--measure', nargs=2)
    ap.add_argument('--gemm-child', action='store_true', help=argparse.SUPPRESS)
    ap.add_argument('--budgets', action='store_true')
    ap.add_argument('--models', nargs='+', default=list(MODELS), help='models for --budgets')
    ap.add_argument('--gib', nargs='+', type=float, default=[0.5, 1, 2], help='budgets in GiB for --budgets')
    ap.add_argument('--gemm', action='store_true', help='measure the CPU BLAS workspace of one 1024x4096 @ 4096x4096 matmul')
    a = ap.parse_args()
    if a.measure: print(measure(a.measure[0], int(a.measure[1])))
    elif a.gemm_child: print(gemm_workspace())
    elif a.budgets: budgets_table(a.models, a.gib)
    elif a.gemm:
        out = subprocess.run([sys.executable, __file__, '--gemm-child'], env={**os.environ, **ENV}, capture_output=True, text=True, check=True)
        print(f"CPU matmul workspace beyond the output: {float(out.stdout):.1f} MiB")
    else: accuracy_table()
