"""Does a plan of the eager step hold for a `torch.compile`d model? Each model's two measured training steps, eager and compiled, next to the plan.

    python bench/compile_memory.py                       # the default cases (needs a C compiler: inductor builds its CPU kernels)
    python bench/compile_memory.py --cases resnet18:16 encdec:32

Each case runs in a fresh process with `budget_accuracy.py`'s glibc settings and one thread: one training step at the full batch
(which compiles, and allocates the optimizer state), the freed heap handed back, then the resident set's high-water mark over two
more steps; plus the bytes alive before them (weights, optimizer state, batch). The warm-up is at the full batch, unlike
`budget_accuracy.py`'s, because a compiled model would compile again for another batch size: so kernels' kept buffers are in the
baseline here, and the eager and compiled columns are measured alike. The plan is `plan_memory(compiled, ...)`, the eager step's.
"""
import argparse, ctypes, gc, os, subprocess, sys
from pathlib import Path
import torch
import torch.nn.functional as F
sys.path.insert(0, str(Path(__file__).parent))
import budget_accuracy as ba

CASES = ['resnet18:16', 'mobilenet_v2:16', 'encdec:32', 'mha:16', 'gru:32', 'tied_lm:16', 'ln_mlp:256', 'conv1d:32']

def child(name:str, bs:int, mode:str)->int:
    "Run in a fresh process: the measured bytes of two training steps of `name` at batch `bs`, eager or compiled."
    torch.set_num_threads(1)
    model, (x, y) = ba.make(name, bs)
    run = torch.compile(model) if mode == 'compiled' else model
    opt, loss_fn = torch.optim.AdamW(model.parameters(), lr=1e-3), ba._loss(name)
    ba._steps(run, opt, x, y, 1, loss_fn)  # the bench's steps, on the compiled wrapper or the model
    gc.collect(); ctypes.CDLL(None).malloc_trim(0)
    alive = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x, y,
                                                      *(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))])
    base = ba.process_rss()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')
    ba._steps(run, opt, x, y, 2, loss_fn)
    return ba._hwm() - base + alive

def measured(name, bs, mode)->int:
    out = subprocess.run([sys.executable, __file__, '--child', name, str(bs), mode], env={**os.environ, **ba.ENV, 'PYTHONPATH': str(ba.ROOT)},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])

def report(cases):
    from netlite_nb.budget import plan_memory
    import warnings
    print(f"{'model':<14}{'batch':>6}{'eager':>10}{'compiled':>11}{'compiled/eager':>16}{'plan':>10}")
    for c in cases:
        name, bs = c.split(':'); bs = int(bs)
        e, k = measured(name, bs, 'eager'), measured(name, bs, 'compiled')
        model, batch = ba.make(name, bs)
        with ba._as_measured(), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            p = plan_memory(torch.compile(model), batch, ba.LOSSES.get(name), optimizer='adamw', device_or_gpu='cpu').peak
        print(f"{name:<14}{bs:>6}{e/2**20:>8.1f}Mi{k/2**20:>9.1f}Mi{100*(k - e)/e:>+15.1f}%{p/2**20:>8.1f}Mi", flush=True)

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--child', nargs=3, help=argparse.SUPPRESS)
    ap.add_argument('--cases', nargs='+', default=CASES, metavar='MODEL:BATCH')
    a = ap.parse_args()
    if a.child: print(child(a.child[0], int(a.child[1]), a.child[2]))
    else: report(a.cases)
