"""Samples/s of `Trainer.fit` vs a plain PyTorch loop: same model, data, optimizer and schedule, measured in the same run.

The plain loop is the least a training loop can do (forward, loss, zero_grad, backward, step, scheduler step).
The trainer adds: precision policy, accumulation bookkeeping, callbacks, history records every `log_every`
steps (with a memory reading), random-state snapshots for exact resume and out-of-memory retry, the nan/inf
check, Ctrl-C deferral around the update — and, once per Trainer, chapter 04's check of the data (`check_data`).
The smaller the step, the larger that share: the `tiny` case (a 40-100-100-10 MLP at batch 100) shows it most.

Two ratios, so that a one-time cost is not mistaken for a per-step one:
- `per step`: `Trainer(check_data=False).fit` against the plain loop — the bookkeeping every step pays;
- `first fit`: `Trainer().fit` with the defaults — a fresh Trainer's first `fit` also checks the data once;
  `check ms` is that one-time cost, which a longer run spreads thinner: the CPU time of the check alone
  (`Trainer._check_data` on fresh Trainers, median of 9), since the difference of two timed runs drowns in their noise.

Why whole runs are not enough. On this 2-core VM the plain loop alone, in one process, runs a 784-256-10 MLP step at
about 2.3 ms for a while and then at about 3.4 ms, switching within a run of 150 steps (medians of 25-step blocks:
3,353 then 2,346 µs) with no change of code or memory (`--drift` shows it): every phase (data loading, forward,
backward, optimizer) speeds up and slows down together, and the slow state goes with the other core being busy.
A run of half a second is a random mix of the two states, so whole-run ratios scatter (single pairs 0.66–1.44)
and their median can sit anywhere from 0.90 to 1.00 depending on the hour — that is how a nearly idle machine
showed 0.90 for the MLP while the per-step intervals of separate processes showed no difference.

So the headline figure is measured *interleaved*: the plain loop runs in blocks of 8 steps between blocks of 8 of
the Trainer's, from a callback (`_PlainBeside`), so both loops meet the same machine within a few tens of ms. Only
steps that follow a step of their own loop are kept (the first after a switch finds the other loop's tensors in
the caches), so each step runs as it would in a run of its loop alone. The Trainer's step is the interval between
two calls of that callback; each run gives the ratio of the median step times (setup and teardown excluded), and
the bench reports the median of `--pairs` runs with its quartiles. `A/A` runs the same protocol with a second plain
loop in place of the Trainer: its distance from 1 is the method's own error. What the interleaved ratio still
contains is the Trainer's real per-step cost, its Python bookkeeping (about 140,000 instructions a step on `tiny`),
which takes more time than its count suggests: each step's tensors push it out of the caches, and the same
bookkeeping (splitting the window, the hook calls, a random-state snapshot, the record check) takes 4–8 µs warm,
12–17 µs after a 4 MB sweep and 60 µs after a 16 MB one. Interleaving step by step (blocks of 1) makes it colder
still: in one process `mlp` measured 0.956 and 0.951 with blocks of 1, 0.983 and 0.967 with blocks of 8.

The whole-run figures are printed beside it, unchanged, so nothing is hidden: rounds of four runs (plain, Trainer,
plain again, a fresh Trainer with its data check), their order rotating from round to round, as medians of the
per-round ratios with quartiles, for wall and CPU time; the fourth run gives the whole-run A/A.

`--instructions` counts the instructions of each part instead, under valgrind's callgrind (needs `valgrind`, a C
compiler and `valgrind/callgrind.h`); a count does not change with the machine's load. It runs each loop for
`--steps` and `2 × --steps` steps in one process: the difference is the cost of `--steps` steps without the setup.
`--cache` adds callgrind's cache simulation with this machine's L1d and L2 (read from sysfs): the misses per step
show whether the Trainer touches memory the plain loop does not (extra passes over parameters or gradients, copies,
per-step buffers). The simulation sees virtual addresses only: no page faults, TLB or prefetchers.

`--drift` shows the machine's drift itself: the plain loop alone, run after run, its step times in 25-step blocks
beside each core's use over the block.

    python bench/trainer_overhead.py [--case all|cnn|mlp|tiny] [--pairs 15] [--steps 150] [--threads 1] [--instructions [--cache]] [--drift]
"""
import argparse, ctypes, os, re, shutil, statistics, subprocess, sys, tempfile, time, torch
from pathlib import Path
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from netlite_nb.train import Callback, Trainer, warmup_cosine

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

def plain_setup(case, steps, lr=1e-3):
    "(model, optimizer, schedule) of the plain loop, as the Trainer makes them."
    model = make_model(case); opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    model.train()
    return model, opt, warmup_cosine(opt, steps, int(0.05 * steps))

def plain_step(model, opt, sched, xb, yb):
    "One step of the plain loop: forward, loss, zero_grad, backward, optimizer and scheduler step."
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()

def plain(case, dl, steps, lr=1e-3, mark=None, after=None):
    "The plain loop; `after()` is called after each step (the interleaved A/A runs a second plain loop there)."
    loop, n, step = plain_setup(case, steps, lr), 0, 0
    with mark or _Clock() as c:
        while step < steps:
            for xb, yb in dl:
                plain_step(*loop, xb, yb)
                n += len(yb); step += 1
                if after is not None: after()
                if step == steps: break
    return c.rates(n)

def trainer(case, dl, steps, lr=1e-3, check_data=False, mark=None, callbacks=()):
    t = Trainer(make_model(case), dl, device='cpu', lr=lr, progress=False, verbose=False, plan=False, seed=None, log_every=10,
                check_data=check_data, callbacks=list(callbacks))
    with mark or _Clock() as c: t.fit(steps=steps)
    return c.rates(t.samples)

class _PlainBeside(Callback):
    """A second, plain loop that makes `block` steps after every `block` steps of the loop it rides on; times both loops' steps.
    Only steps that follow a step of their own loop are kept, as in a run of that loop alone: the first step after a switch
    finds the other loop's tensors in the caches."""
    def __init__(self, case, dl, steps, block=8, lr=1e-3):
        self.loop, self.dl, self.it, self.block, self.n, self.ran = plain_setup(case, steps, lr), dl, iter(dl), block, 0, True
        self.host, self.mine, self.last = [], [], None
    def after_step(self, trainer=None):
        now = time.perf_counter()
        if self.last is not None and (not self.ran or self.block == 1): self.host.append(now - self.last)  # the host's step
        self.n += 1; self.ran = self.n % self.block == 0
        if self.ran:
            for j in range(self.block):
                t0 = time.perf_counter(); self._step()
                if j or (self.block == 1 and self.n > 1): self.mine.append(time.perf_counter() - t0)
        self.last = time.perf_counter()
    def _step(self):
        try: xb, yb = next(self.it)
        except StopIteration: self.it = iter(self.dl); xb, yb = next(self.it)
        plain_step(*self.loop, xb, yb)
    def times(self): return statistics.median(self.host), statistics.median(self.mine)

def interleaved(case, dl, steps, host='trainer', block=8):
    "(host's median step, plain's median step) in seconds, the plain loop stepping in blocks between the host's blocks."
    beside = _PlainBeside(case, _same_data(dl), steps, block)
    if host == 'trainer': trainer(case, dl, steps, callbacks=[beside])
    else: plain(case, dl, steps, after=beside.after_step)
    return beside.times()

def _same_data(dl): return DataLoader(dl.dataset, dl.batch_size, shuffle=True, generator=torch.Generator().manual_seed(1))

class _Clock:
    "Wall and CPU time of a `with` block; `rates(n)` gives n per second of each."
    def __enter__(self): self.t0 = clocks(); return self
    def __exit__(self, *exc): self.t1 = clocks()
    def rates(self, n): return n / (self.t1[0] - self.t0[0]), n / (self.t1[1] - self.t0[1]), self.t1[0] - self.t0[0]

def quartiles(xs): q = statistics.quantiles(xs, n=4); return q[0], q[2]

def run_case(case, pairs, steps):
    "Rounds of (plain, trainer per step, plain again, trainer first fit, interleaved Trainer, interleaved A/A) in rotating order."
    dl = make_data(case)
    plain(case, dl, 20); trainer(case, dl, 20); trainer(case, dl, 20, check_data=True)  # warm up kernels and allocator
    interleaved(case, dl, 20)
    runs = {'plain': lambda: plain(case, dl, steps), 'step': lambda: trainer(case, dl, steps),
            'again': lambda: plain(case, dl, steps), 'first': lambda: trainer(case, dl, steps, check_data=True),
            'inter': lambda: interleaved(case, dl, steps), 'inter_aa': lambda: interleaved(case, dl, steps, host='plain')}
    res = {k: [] for k in runs}
    for i in range(pairs):
        order = list(runs)[i % len(runs):] + list(runs)[:i % len(runs)]
        for k in order: res[k].append(runs[k]())
    ratio = lambda k, j: [t[j] / p[j] for p, t in zip(res['plain'], res[k])]
    check_ms = []
    for _ in range(9):
        t = Trainer(make_model(case), dl, device='cpu', progress=False, verbose=False, plan=False, seed=None)
        c0 = time.process_time(); t._check_data(); check_ms.append(1e3 * (time.process_time() - c0))
    r = {k: (ratio(k, 0), ratio(k, 1)) for k in ('step', 'first', 'again')}
    r.update({k: [p / h for h, p in res[k]] for k in ('inter', 'inter_aa')})  # samples/s of the host over the plain loop's
    r['extra_us'] = [1e6 * (h - p) for h, p in res['inter']]
    return res, r, check_ms

def fmt(xs): return f"{statistics.median(xs):.3f} ({'%.2f–%.2f' % quartiles(xs)})"

def timed(a):
    print(f"{a.pairs} rounds of {a.steps} steps per case, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at the start")
    print(f"{'':<12}{'interleaved, per step (the figure)':^58}|{'whole runs':^100}")
    print(f"{'case':<6}{'batch':>6}{'Trainer/plain':>20}{'A/A':>20}{'extra µs/step':>18}|{'plain samples/s':>16}{'A/A: wall':>20}"
          f"{'per step: wall':>22}{'first fit: wall':>22}{'CPU':>20}")
    for case in (CASES if a.case == 'all' else [a.case]):
        res, r, check_ms = run_case(case, a.pairs, a.steps)
        print(f"{case:<6}{CASES[case][2]:>6}{fmt(r['inter']):>20}{fmt(r['inter_aa']):>20}{statistics.median(r['extra_us']):>18.0f}|"
              f"{statistics.median(p[0] for p in res['plain']):>16.0f}{fmt(r['again'][0]):>20}{fmt(r['step'][0]):>22}"
              f"{fmt(r['first'][0]):>22}{fmt(r['first'][1]):>20}", flush=True)
        print(f"{'':<12}whole-run per step, CPU time: {fmt(r['step'][1])}; the data check of a first fit: {statistics.median(check_ms):.1f} ms CPU")
    print("Trainer/plain: samples/s ratio, median (quartiles) over the runs (target >= 0.95). Interleaved: the plain loop steps between the "
          "Trainer's steps, so both meet the same machine; A/A: a plain loop in the Trainer's place (the method's own error). "
          f"Whole runs: rounds in rotating order, A/A the plain loop against itself. Load average {os.getloadavg()[0]:.1f} at the end")

def drift(a):
    "The plain loop alone, run after run in one process: medians of its step times in blocks of 25 steps, and the other cores' use."
    case = 'mlp' if a.case == 'all' else a.case
    dl, stamps = make_data(case), []
    print(f"{case}: the plain loop alone, {a.pairs} runs of {a.steps} steps; µs per step, medians of 25-step blocks "
          "[% busy of each core over the block, from /proc/stat]")
    plain(case, dl, 20)
    for i in range(a.pairs):
        stamps.clear(); busy = [_busy()]
        def mark():
            stamps.append(time.perf_counter())
            if len(stamps) % 25 == 1 and len(stamps) > 1: busy.append(_busy())
        plain(case, dl, a.steps, after=mark)
        d = [1e6 * (y - x) for x, y in zip(stamps, stamps[1:])]
        blocks = [f"{statistics.median(d[j:j + 25]):6.0f}[{'/'.join(f'{100 * (1 - (i1 - i0) / max(t1 - t0, 1)):.0f}' for (i0, t0), (i1, t1) in zip(u, v))}]"
                  for j, u, v in zip(range(0, len(d), 25), busy, busy[1:])]
        print(f"run {i:2d}: " + ' '.join(blocks), flush=True)

def _busy()->list[tuple[int, int]]:
    "(idle, total) jiffies of each core (idle includes iowait)."
    rows = [l.split() for l in open('/proc/stat') if l.startswith('cpu') and l[3].isdigit()]
    return [(int(r[4]) + int(r[5]), sum(map(int, r[1:9]))) for r in rows]

# --- instruction counts under callgrind ---------------------------------------------------------------------------

_SHIM = r'''#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(const char *name) { CALLGRIND_DUMP_STATS_AT(name); CALLGRIND_STOP_INSTRUMENTATION; }
'''

class _Callgrind:
    "A `with` block counted by callgrind under the name `tag` (the process runs with --instr-atstart=no)."
    lib = None
    def __init__(self, tag): self.tag = tag
    def __enter__(self): self.lib.cg_start(); return self
    def __exit__(self, *exc): self.lib.cg_stop(self.tag.encode())
    def rates(self, n): return 0, 0, 0

def _counted(a):
    "Inside valgrind: each loop for `steps` and `2 × steps` steps, each a named callgrind dump."
    _Callgrind.lib = ctypes.CDLL(os.environ['NETLITE_CG_SHIM'])
    for case in (CASES if a.case == 'all' else [a.case]):
        dl = make_data(case)
        plain(case, dl, 20); trainer(case, dl, 20); trainer(case, dl, 20, check_data=True)
        for n in (a.steps, 2 * a.steps):
            plain(case, dl, n, mark=_Callgrind(f"{case}:plain:{n}"))
            trainer(case, dl, n, mark=_Callgrind(f"{case}:step:{n}"))
        trainer(case, dl, a.steps, check_data=True, mark=_Callgrind(f"{case}:first:{a.steps}"))

def _cache_flags()->list[str]:
    "callgrind's cache simulation with this CPU's L1d and L2 (sysfs), so that 'LL' misses are misses of the core's own L2."
    def spec(level, kind):
        for d in Path('/sys/devices/system/cpu/cpu0/cache').glob('index*'):
            r = lambda f: (d / f).read_text().strip()
            if r('level') == str(level) and r('type') in kind:
                return f"{int(r('size').rstrip('K')) * 1024},{r('ways_of_associativity')},{r('coherency_line_size')}"
        sys.exit(f"--cache: no level-{level} {'/'.join(kind)} cache in /sys/devices/system/cpu/cpu0/cache.")
    return ['--cache-sim=yes', f"--D1={spec(1, ('Data',))}", f"--LL={spec(2, ('Unified', 'Data'))}"]

def instructions(a):
    "Run this script under callgrind and print instructions per step (plain, Trainer) and the one-time costs."
    missing = [w for w, ok in (('valgrind', shutil.which('valgrind')), ('a C compiler (cc)', shutil.which('cc')),
                               ('valgrind/callgrind.h', Path('/usr/include/valgrind/callgrind.h').exists())) if not ok]
    if missing: sys.exit(f"--instructions needs {', '.join(missing)}: install valgrind (its headers come with it) and a C compiler.")
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / 'shim.c').write_text(_SHIM)
        subprocess.run(['cc', '-O2', '-shared', '-fPIC', '-o', f'{d}/shim.so', f'{d}/shim.c'], check=True)
        env = {**os.environ, 'NETLITE_CG_SHIM': f'{d}/shim.so', 'OMP_NUM_THREADS': str(a.threads)}
        args = [a2 for a2 in sys.argv[1:] if a2 != '--instructions']
        args = [a2 for a2 in args if a2 != '--cache']
        subprocess.run(['valgrind', '--tool=callgrind', '--instr-atstart=no', f'--callgrind-out-file={d}/cg.out',
                        *(_cache_flags() if a.cache else []), sys.executable, __file__, *args, '--_counted'], env=env, check=True, capture_output=True)
        counts, events = {}, {}
        for p in Path(d).glob('cg.out.*'):
            t = p.read_text(errors='replace')
            m, n = re.search(r'^desc: Trigger: Client Request: (\S+)', t, re.M), re.search(r'^totals: ([\d ]+)', t, re.M)
            e = re.search(r'^events: (.+)$', t, re.M)
            if m and n:
                counts[m.group(1)] = int(n.group(1).split()[0])
                events[m.group(1)] = dict(zip(e.group(1).split(), map(int, n.group(1).split())))
    s = a.steps
    print(f"instructions (callgrind), torch {torch.__version__}, {a.threads} threads: per step = (2×{s} steps − {s} steps) / {s}")
    print(f"{'case':<6}{'plain /step':>14}{'Trainer /step':>15}{'extra /step':>13}{'ratio':>8}{'fit setup':>12}{'data check':>13}{'first fit ratio':>17}")
    for case in (CASES if a.case == 'all' else [a.case]):
        g = lambda k, n: counts[f"{case}:{k}:{n}"]
        p, t = (g('plain', 2 * s) - g('plain', s)) / s, (g('step', 2 * s) - g('step', s)) / s
        setup, check = g('step', s) - g('plain', s) - s * (t - p), g('first', s) - g('step', s)
        print(f"{case:<6}{p:>14,.0f}{t:>15,.0f}{t - p:>13,.0f}{p / t:>8.3f}{setup:>12,.0f}{check:>13,.0f}{g('plain', s) / g('first', s):>17.3f}")
    print("ratio: plain/Trainer instructions per step (the samples/s ratio on an idle, compute-bound core); "
          f"first fit ratio: plain/Trainer for a fresh Trainer's {s}-step fit, setup and data check included")
    if a.cache: _print_misses(events, a)

def _print_misses(events:dict, a):
    "Simulated cache misses per step, plain loop against Trainer (loads and stores; L1d and the core's L2)."
    s = a.steps
    print(f"\nsimulated misses per step (callgrind --cache-sim, {' '.join(_cache_flags()[1:])}), (2×{s} − {s} steps) / {s}")
    print(f"{'case':<6}{'L1d plain':>12}{'L1d Trainer':>13}{'ratio':>8}{'L2 plain':>11}{'L2 Trainer':>12}{'ratio':>8}{'bytes read plain':>18}{'Trainer':>10}")
    for case in (CASES if a.case == 'all' else [a.case]):
        per = lambda k, ev: sum((events[f"{case}:{k}:{2 * s}"][e] - events[f"{case}:{k}:{s}"][e]) / s for e in ev)
        d1p, d1t = per('plain', ('D1mr', 'D1mw')), per('step', ('D1mr', 'D1mw'))
        l2p, l2t = per('plain', ('DLmr', 'DLmw')), per('step', ('DLmr', 'DLmw'))
        print(f"{case:<6}{d1p:>12,.0f}{d1t:>13,.0f}{d1t / d1p:>8.3f}{l2p:>11,.0f}{l2t:>12,.0f}{l2t / l2p:>8.3f}"
              f"{64 * l2p / 2**20:>15.1f} MB{64 * l2t / 2**20:>7.1f} MB")
    print("ratio: Trainer/plain misses per step; bytes read: L2 misses × 64-byte lines (what comes from L3 or memory)")

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--case', default='all', choices=['all', *CASES]); ap.add_argument('--pairs', type=int, default=15)
    ap.add_argument('--steps', type=int, default=150)
    ap.add_argument('--threads', type=int, default=1, help='torch threads (1: CPU time is exact and the machine\'s other jobs matter less)')
    ap.add_argument('--instructions', action='store_true', help='count instructions under valgrind (immune to load) instead of timing')
    ap.add_argument('--cache', action='store_true', help='with --instructions: also simulate this CPU\'s L1d and L2 and print misses per step')
    ap.add_argument('--drift', action='store_true', help='time the plain loop alone in 25-step blocks, run after run (--pairs runs): how the machine drifts')
    ap.add_argument('--_counted', action='store_true', help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a._counted: _counted(a)
    elif a.instructions: instructions(a)
    elif a.drift: drift(a)
    else: timed(a)
