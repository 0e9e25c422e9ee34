"""Chapter 03's AdamW8bit against torch.optim.AdamW (and bitsandbytes where installed): step time, state bytes per parameter, accuracy on the MNIST sample.

Same model, initial weights, batch order, schedule (cosine from lr 2e-3, weight decay 0.01) for every optimizer;
final validation accuracy averaged over seeds.

    python bench/optim_state.py                  # 3 seeds x 4 optimizers, 5 epochs
    python bench/optim_state.py --seeds 0 --epochs 2
    python bench/optim_state.py --step-only      # just the step-time table (~1 minute)
    OMP_NUM_THREADS=1 python bench/optim_state.py --step-only   # the same on one thread
    python bench/optim_state.py --runs 5         # the step-time table in 5 fresh processes: medians over runs
    python bench/optim_state.py --chunks         # AdamW8bit's step time by chunk size
    python bench/optim_state.py --instructions   # instructions per step under valgrind's callgrind (load-independent; ~10 minutes)
    python bench/optim_state.py --bf16           # bf16 weights: stochastic rounding vs round-to-nearest vs fp32, 3 seeds; JSON in bench/results/optim_state/
"""
from __future__ import annotations
import argparse, json, math, os, platform, resource, statistics, subprocess, sys, time
import torch, torch.nn as nn, torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from netlite_nb.data import mnist_sample
from netlite_nb import optim
from netlite_nb.optim import AdamW, AdamW8bit, bf16_weights, state_bytes

OPTIMIZERS = {
    'torch.optim.AdamW': lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.01),
    'AdamW8bit': lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01),
    'AdamW8bit(min_8bit_size=0)': lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01, min_8bit_size=0),
    "AdamW8bit(first_moment='fp16')": lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01, first_moment='fp16'),
}


def _as_xy(ds):
    if isinstance(ds, (tuple, list)) and len(ds) == 2 and isinstance(ds[0], torch.Tensor): return ds
    if hasattr(ds, 'tensors'): return ds.tensors[:2]
    xs, ys = zip(*[ds[i] for i in range(len(ds))])
    return torch.stack(xs), torch.as_tensor(ys)


def load_data():
    "((x, y) train, (x, y) valid, source): chapter 04's embedded MNIST sample."
    tr, va = mnist_sample()
    return _as_xy(tr), _as_xy(va), 'netlite_nb.data.mnist_sample()'


def small_cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))


def train(make_opt, data, seed, epochs=5, bs=64, lr=2e-3):
    "Final validation accuracy, the per-step training losses, state bytes/param and mean optimizer-step time."
    (xt, yt), (xv, yv) = data
    torch.manual_seed(seed)
    model = small_cnn()
    opt = make_opt(model.parameters(), lr)
    steps = epochs * math.ceil(len(yt) / bs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    g = torch.Generator().manual_seed(seed)
    losses, t_step = [], 0.0
    for _ in range(epochs):
        for idx in torch.randperm(len(yt), generator=g).split(bs):
            loss = F.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad(); loss.backward()
            t0 = time.perf_counter(); opt.step(); t_step += time.perf_counter() - t0
            sched.step(); losses.append(loss.item())
    model.eval()
    with torch.no_grad(): acc = (model(xv).argmax(1) == yv).float().mean().item()
    return acc, losses, state_bytes(opt) / sum(p.numel() for p in model.parameters()), t_step / steps


def accuracy_table(seeds=(0, 1, 2), epochs=5, data=None):
    "The comparison as a printable table (the chapter runs it with one seed)."
    tr, va, src = data or load_data()
    rows, base = [], None
    for name, make in OPTIMIZERS.items():
        res = [train(make, (tr, va), s, epochs) for s in seeds]
        accs = [r[0] * 100 for r in res]
        mean = statistics.mean(accs)
        base = mean if base is None else base
        rows.append((name, mean, statistics.pstdev(accs), mean - base, res[0][2], statistics.mean(r[3] for r in res) * 1e3,
                     statistics.mean(statistics.mean(r[1][-20:]) for r in res)))
    out = [f"data: {src}; small CNN, {epochs} epochs, batch 64, cosine lr 2e-3, seeds {list(seeds)}",
           f"{'optimizer':32s} {'valid acc %':>11s} {'± std':>6s} {'Δ pp':>6s} {'state B/param':>13s} {'step ms':>8s} {'final loss':>10s}"]
    out += [f"{n:32s} {m:11.2f} {s:6.2f} {d:+6.2f} {b:13.3f} {t:8.2f} {l:10.4f}" for n, m, s, d, b, t, l in rows]
    return '\n'.join(out)


BF16 = {  # name -> (optimizer, weights in bf16?)
    'AdamW, fp32 weights': (lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.01), False),
    'AdamW8bit, fp32 weights': (lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01), False),
    'AdamW8bit, bf16 weights, stochastic rounding': (lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01, master_weights='bf16-sr'), True),
    'AdamW8bit, bf16 weights, round to nearest': (lambda p, lr: AdamW8bit(p, lr=lr, weight_decay=0.01), True),
}


def train_weights(make_opt, bf16:bool, data, seed, epochs=5, bs=64, lr=2e-3):
    "Final validation accuracy (%) and the mean of the last 20 training losses, with the weights (and so the forward) in bf16 or fp32."
    (xt, yt), (xv, yv) = data
    torch.manual_seed(seed)
    model = small_cnn()
    if bf16: model = bf16_weights(model)
    dt = torch.bfloat16 if bf16 else torch.float32
    opt = make_opt(model.parameters(), lr)
    steps = epochs * math.ceil(len(yt) / bs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / steps)))
    g, losses = torch.Generator().manual_seed(seed), []
    for _ in range(epochs):
        for idx in torch.randperm(len(yt), generator=g).split(bs):
            loss = F.cross_entropy(model(xt[idx].to(dt)).float(), yt[idx])
            opt.zero_grad(); loss.backward(); opt.step(); sched.step(); losses.append(loss.item())
    model.eval()
    with torch.no_grad(): acc = (model(xv.to(dt)).float().argmax(1) == yv).float().mean().item()
    return 100 * acc, statistics.mean(losses[-20:])


def _git(*args):
    try: return subprocess.run(['git', *args], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    except OSError: return ''


def _cpu_name():
    try: return next(l.split(':', 1)[1].strip() for l in open('/proc/cpuinfo') if l.startswith('model name'))
    except (OSError, StopIteration): return platform.processor() or platform.machine()


def bf16_table(seeds=(0, 1, 2), epochs=5, data=None, out=None):
    "fp32 AdamW against 8-bit AdamW with bf16 weights (stochastic rounding, round to nearest): accuracy per seed, medians; stored as JSON."
    tr, va, src = data or load_data()
    rows = {}
    for name, (make, bf16) in BF16.items():
        res = []
        for s in seeds:
            res.append(train_weights(make, bf16, (tr, va), s, epochs))
            print(f"  {name}, seed {s}: {res[-1][0]:.2f}%", flush=True)
        rows[name] = dict(accuracy=[r[0] for r in res], final_loss=[r[1] for r in res], median_accuracy=statistics.median(r[0] for r in res))
    result = dict(bench='optim_state', set='bf16', data=src, model='small_cnn', epochs=epochs, batch=64, lr='cosine from 2e-3', seeds=list(seeds),
                  machine=dict(cpu=_cpu_name(), isa=torch.backends.cpu.get_cpu_capability()), torch=torch.__version__,
                  date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None,
                  dirty=bool(_git('status', '--porcelain', '--untracked-files=no')), rows=rows)
    if out:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(out + '.tmp', 'w') as f: json.dump(result, f, indent=1); f.write('\n')
        os.replace(out + '.tmp', out)
    base = rows['AdamW, fp32 weights']['median_accuracy']
    lines = [f"data: {src}; small CNN, {epochs} epochs, batch 64, cosine lr 2e-3, seeds {list(seeds)}; medians",
             f"{'optimizer':46s} {'valid acc %':>11s} {'vs fp32 AdamW':>13s}  per seed"]
    lines += [f"{n:46s} {r['median_accuracy']:11.2f} {r['median_accuracy'] - base:+13.2f}  {', '.join(f'{a:.1f}' for a in r['accuracy'])}" for n, r in rows.items()]
    return '\n'.join(lines)


def large_tensor_state():
    "State bytes per parameter on a model made of large tensors."
    out = []
    for name, make in OPTIMIZERS.items():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048))
        o = make(m.parameters(), 1e-3)
        m(torch.randn(4, 2048)).sum().backward(); o.step()
        out.append(f"{name:32s} {state_bytes(o) / sum(p.numel() for p in m.parameters()):.3f} bytes/param")
    return '\n'.join(["state on 2 x Linear(2048, 2048) (8.4M parameters, biases included):"] + out)


def _bnb_adamw8bit():
    try: import bitsandbytes
    except Exception: return None
    return lambda p, lr: bitsandbytes.optim.AdamW8bit(p, lr=lr, weight_decay=0.01)


class _PlainAdamW8bit(AdamW8bit):
    "AdamW8bit stepping the plain way (chapter 03's `adamw_8bit_reference`: whole tensor, fresh temporaries), for comparison."
    def _update_8bit(self, p, st, group, step_size, bc2_sqrt, decay=1.0):
        p.mul_(decay); optim.adamw_8bit_reference(p, st, group, step_size, bc2_sqrt)


class _ChunkedAdamW8bit(AdamW8bit):
    "AdamW8bit with its chunk forced to `chunk` values, for the sweep."
    def __init__(self, params, chunk, **kw): super().__init__(params, **kw); self.chunk = chunk
    def step(self, closure=None):
        sized, optim.chunk_values = optim.chunk_values, lambda device, block_size: self.chunk
        try: return super().step(closure)
        finally: optim.chunk_values = sized


def _faults():
    "Minor page faults of this process so far: a step that allocates fresh memory pays one per 4 KiB page it touches."
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _paired(makers, repeats, size):
    "Each optimizer's step on its own copy of one size x size weight, in turn, `repeats` rounds: {name: [seconds]}, the optimizers, {name: [page faults]}, {name: [CPU seconds]}."
    torch.manual_seed(0)
    w0 = torch.randn(size, size) * 0.02
    grads = [torch.randn(size, size) * 1e-3 for _ in range(3)]
    ws = {n: nn.Parameter(w0.clone()) for n in makers}
    opts = {n: make([ws[n]], 1e-3) for n, make in makers.items()}
    times, faults, cpu = {n: [] for n in makers}, {n: [] for n in makers}, {n: [] for n in makers}
    for r in range(repeats + 1):
        for n, o in opts.items():  # interleaved, so a change in the machine's load hits every optimizer alike
            ws[n].grad = grads[r % 3]
            f0, c0, t0 = _faults(), time.process_time(), time.perf_counter(); o.step()
            dt, dc, df = time.perf_counter() - t0, time.process_time() - c0, _faults() - f0
            if r: times[n].append(dt); faults[n].append(df); cpu[n].append(dc)  # the first round creates the state
    return times, opts, faults, cpu


def _ratio_cols(ts, base):
    "Median step ms, and the median and quartiles of the per-round ratio to the base's step in the same round."
    q = statistics.quantiles([t / b for t, b in zip(ts, base)], n=4, method='inclusive')
    return f"{statistics.median(ts) * 1e3:9.1f} {q[1]:8.2f} {q[0]:6.2f}–{q[2]:<5.2f}"


def step_stats(repeats=15, size=2048):
    "One size x size weight, each optimizer's step in turn for `repeats` rounds: {name: {ms, ms_q1, ms_q3, faults, ratio, ratio_q1, ratio_q3, cpu_ms, cpu_ratio, bpp}}."
    makers = {'torch.optim.AdamW': OPTIMIZERS['torch.optim.AdamW'], 'AdamW8bit (netlite_nb)': OPTIMIZERS['AdamW8bit'],
              'AdamW8bit, plain step': lambda p, lr: _PlainAdamW8bit(p, lr=lr, weight_decay=0.01)}
    if _bnb_adamw8bit(): makers['bitsandbytes.optim.AdamW8bit'] = _bnb_adamw8bit()
    times, opts, faults, cpu = _paired(makers, repeats, size)
    base, q = times['torch.optim.AdamW'], lambda xs: statistics.quantiles(xs, n=4, method='inclusive')
    out = {}
    for n, ts in times.items():
        (m1, m2, m3), (r1, r2, r3) = q([t * 1e3 for t in ts]), q([t / b for t, b in zip(ts, base)])
        out[n] = dict(ms=m2, ms_q1=m1, ms_q3=m3, faults=statistics.median(faults[n]), ratio=r2, ratio_q1=r1, ratio_q3=r3,
                      cpu_ms=statistics.median(cpu[n]) * 1e3, bpp=state_bytes(opts[n]) / size**2)
    for r in out.values(): r['cpu_ratio'] = r['cpu_ms'] / out['torch.optim.AdamW']['cpu_ms']
    return out


def step_time(repeats=15, size=2048):
    "One size x size weight: each optimizer's step in turn, `repeats` rounds; median step time, page faults, ratio to AdamW's (quartiles)."
    load0 = os.getloadavg()[0]
    stats = step_stats(repeats, size)
    out = [f"step on one {size}x{size} fp32 weight ({size * size / 1e6:.1f}M parameters), {repeats} interleaved rounds, "
           f"{torch.get_num_threads()} thread(s), chunk {optim.chunk_values(torch.device('cpu'), 256)} values, "
           f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}:",
           f"{'optimizer':32s} {'median ms':>9s} {'q1–q3 ms':>13s} {'faults/step':>11s} {'× AdamW':>8s} {'quartiles':>11s} {'CPU ms':>7s} {'CPU ×':>6s} {'state B/param':>13s}"]
    for n, r in stats.items():
        span = f"{r['ms_q1']:.1f}–{r['ms_q3']:.1f}"
        out.append(f"{n:32s} {r['ms']:9.1f} {span:>13s} {r['faults']:11.0f} {r['ratio']:8.2f} {r['ratio_q1']:6.2f}–{r['ratio_q3']:<5.2f} {r['cpu_ms']:7.1f} {r['cpu_ratio']:6.2f} {r['bpp']:13.3f}")
    out.append("faults/step: page faults of a step (fresh memory the step touches); torch.optim.AdamW's step allocates two "
               "temporaries as large as the weight, and whether the allocator hands it fresh pages, and so whether the step "
               "is fast or slow, changes from process to process. CPU ms: the process's CPU time per step (all its threads, "
               "median): what a step costs where no other job takes the cores, but it also counts OpenMP threads spinning at barriers")
    if not _bnb_adamw8bit(): out.append('(bitsandbytes not installed: pip install -e ".[bnb]" to compare with it)')
    return '\n'.join(out)


def step_runs(runs=5, rounds=15, threads=None):
    "The step-time table's medians in `runs` fresh processes (AdamW's fast or slow allocator state is set per process): per-run rows and the median over runs."
    cmd = [sys.executable, os.path.abspath(__file__), '--step-json', '--rounds', str(rounds)] + (['--threads', str(threads)] if threads else [])
    load0, res = os.getloadavg()[0], []
    for _ in range(runs):
        res.append(json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]))
    ours, adamw = 'AdamW8bit (netlite_nb)', 'torch.optim.AdamW'
    out = [f"{runs} fresh processes x {rounds} interleaved rounds, {res[0]['threads']} thread(s), "
           f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; per run, medians of the rounds:"]
    out += [f"  run {i + 1}: {adamw} {r[adamw]['ms']:.1f} ms ({r[adamw]['faults']:.0f} faults/step), "
            f"{ours} {r[ours]['ms']:.1f} ms: {r[ours]['ratio']:.2f}× AdamW; CPU time {r[adamw]['cpu_ms']:.1f} and "
            f"{r[ours]['cpu_ms']:.1f} ms: {r[ours]['cpu_ratio']:.2f}×" for i, r in enumerate(res)]
    out.append(f"{'optimizer':32s} {'median ms (lowest–highest run)':>32s} {'× AdamW (lowest–highest run)':>30s}")
    for n in res[0]:
        if n == 'threads': continue
        ms, ra = sorted(r[n]['ms'] for r in res), sorted(r[n]['ratio'] for r in res)
        out.append(f"{n:32s} {f'{statistics.median(ms):.1f} ({ms[0]:.1f}–{ms[-1]:.1f})':>32s} "
                   f"{f'{statistics.median(ra):.2f} ({ra[0]:.2f}–{ra[-1]:.2f})':>30s}")
    return '\n'.join(out)


def chunk_sweep(repeats=7, size=2048, chunks=tuple(2**k for k in range(12, 23, 2))):
    "AdamW8bit's step with the chunk forced to each size, against AdamW in the same rounds: what the chunk size costs."
    makers = {'torch.optim.AdamW': OPTIMIZERS['torch.optim.AdamW']}
    makers.update({c: (lambda c: lambda p, lr: _ChunkedAdamW8bit(p, c, lr=lr, weight_decay=0.01))(c) for c in chunks})
    times = _paired(makers, repeats, size)[0]
    out = [f"AdamW8bit's step by chunk size, one {size}x{size} weight, {repeats} interleaved rounds, {torch.get_num_threads()} thread(s) "
           f"(chosen here: {optim.chunk_values(torch.device('cpu'), 256)}):",
           f"{'chunk (values, KiB touched)':32s} {'median ms':>9s} {'× AdamW':>8s} {'quartiles':>11s}"]
    for c in chunks:
        out.append(f"{f'{c} ({c * optim._CHUNK_BYTES_PER_VALUE // 1024} KiB)':32s} {_ratio_cols(times[c], times['torch.optim.AdamW'])}")
    return '\n'.join(out)


def _callgrind_child(which, steps):
    "In a process run by callgrind with instrumentation off: turn it on around `steps` steps of one optimizer on a 2048x2048 weight."
    torch.set_num_threads(1)
    makers = {'torch.optim.AdamW': OPTIMIZERS['torch.optim.AdamW'], 'AdamW8bit (netlite_nb)': OPTIMIZERS['AdamW8bit']}
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(2048, 2048) * 0.02); grads = [torch.randn(2048, 2048) * 1e-3 for _ in range(3)]
    opt = makers[which]([w], 1e-3)
    w.grad = grads[2]; opt.step()  # the state is made outside the count
    ctl = lambda on: subprocess.run(['callgrind_control', '-i', on, str(os.getpid())], capture_output=True, check=True)
    ctl('on'); time.sleep(2)  # callgrind polls for the command; the wait runs no instructions
    for r in range(steps): w.grad = grads[r % 3]; opt.step()
    ctl('off')


def instructions(steps=3):
    "Instructions per step (and per parameter) of torch.optim.AdamW and AdamW8bit on one thread, counted by callgrind: what load does not change."
    import shutil, tempfile
    if not (shutil.which('valgrind') and shutil.which('callgrind_control')):
        return "valgrind is not installed: apt-get install valgrind (it provides callgrind and callgrind_control)"
    out, counts = ["instructions per step on one 2048x2048 weight, one thread, callgrind (valgrind), "
                   f"{steps} steps counted after the first:"], {}
    for which in ('torch.optim.AdamW', 'AdamW8bit (netlite_nb)'):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run(['valgrind', '--tool=callgrind', '--instr-atstart=no', f'--callgrind-out-file={d}/cg.out', sys.executable,
                                os.path.abspath(__file__), '--callgrind-child', which, '--rounds', str(steps)],
                               capture_output=True, text=True, env={**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONHASHSEED': '0'})
        got = [l for l in r.stderr.splitlines() if 'Collected' in l]
        if r.returncode or not got: return f"callgrind run of {which} failed:\n{r.stderr[-2000:]}"
        counts[which] = int(got[-1].split()[-1]) / steps
        out.append(f"{which:32s} {counts[which] / 1e6:8.1f} M instructions/step  {counts[which] / 2048**2:6.1f} per parameter")
    out.append(f"AdamW8bit / torch.optim.AdamW: {counts['AdamW8bit (netlite_nb)'] / counts['torch.optim.AdamW']:.2f}× the instructions "
               "(AdamW waits on memory, the 8-bit step on its table reads: the time ratio is smaller)")
    return '\n'.join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--seeds', default='0,1,2')
    ap.add_argument('--epochs', type=int, default=5)
    ap.add_argument('--threads', type=int, default=None, help="PyTorch's threads (default: its own choice, which follows OMP_NUM_THREADS)")
    ap.add_argument('--rounds', type=int, default=15, help='interleaved rounds of the step-time table')
    ap.add_argument('--step-only', action='store_true', help='only the step-time table')
    ap.add_argument('--runs', type=int, default=0, help='the step-time table in this many fresh processes, summarized')
    ap.add_argument('--step-json', action='store_true', help=argparse.SUPPRESS)  # one run's medians as JSON, for --runs
    ap.add_argument('--chunks', action='store_true', help="only the step time by chunk size")
    ap.add_argument('--instructions', action='store_true', help='instructions per step under valgrind (callgrind), AdamW and AdamW8bit')
    ap.add_argument('--callgrind-child', default=None, help=argparse.SUPPRESS)  # one optimizer's steps, for --instructions
    ap.add_argument('--bf16', action='store_true', help='only the bf16-weights table (stochastic rounding vs round-to-nearest vs fp32), stored as JSON')
    a = ap.parse_args()
    if a.threads: torch.set_num_threads(a.threads)
    if a.callgrind_child: _callgrind_child(a.callgrind_child, a.rounds); return
    if a.instructions: print(instructions()); return
    if a.step_json: print(json.dumps({**step_stats(a.rounds), 'threads': torch.get_num_threads()})); return
    if a.runs: print(step_runs(a.runs, a.rounds, a.threads)); return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)\n")
    if a.chunks: print(chunk_sweep()); return
    if a.bf16:
        out = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results', 'optim_state', f"bf16.{platform.machine()}.json")
        print(bf16_table([int(s) for s in a.seeds.split(',')], a.epochs, out=out)); return
    print(step_time(a.rounds), '\n')
    if a.step_only: return
    print(large_tensor_state(), '\n')
    t0 = time.perf_counter()
    print(accuracy_table([int(s) for s in a.seeds.split(',')], a.epochs))
    print(f"\n({time.perf_counter() - t0:.0f} s)")


if __name__ == '__main__':
    main()
