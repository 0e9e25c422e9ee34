"""The demo's training with every core free and with one core taken by a competing process, for several thread settings.

A laptop always runs something else. PyTorch's CPU kernels run on OpenMP threads, one per core by default, and
libgomp's threads spin-wait for each other at the end of every parallel region: when one of them is descheduled
because another process holds its core, every sibling spins until it comes back, and a run can take many times
longer than the lost core alone explains. This script measures the demo's training time (chapter 10's `run_demo`,
`--steps` optimizer steps, no export) in a fresh process per run, because the settings must be in place before torch
loads. Each setting runs idle and then with one core spinning (a Python process in a busy loop), alternated, and the
ratio busy/idle of each pair is reported as a median over `--repeats` pairs: the machine may be shared, so only
ratios measured side by side mean anything. The load average before and after says how busy the machine was.

    python bench/contention.py [--steps 40] [--repeats 3] [--settings default,passive,threads-1,passive+threads-1]

`--readme` measures what a reader runs instead: the README's "path through the book" (its Python block, read from
README.md) as a script in a fresh process, torch imported first and no thread variable in the environment, so only the
Trainer's own thread policy (chapter 07b, "Threads on a busy machine") can help. Wall time of the whole script, idle and
with one core busy, alternated; the medians and ratio are stored as JSON in bench/results/contention/, tagged with the
machine, torch, commit and date. Target: busy/idle <= 2.

    python bench/contention.py --readme [--repeats 3]
"""
import argparse, json, os, statistics, subprocess, sys, time

SETTINGS = {  # name -> environment for the training process (read before torch loads)
    'default': {},                                              # torch's own: one thread per core, libgomp's spin-wait
    'passive': {'OMP_WAIT_POLICY': 'PASSIVE'},                  # threads sleep at once when they wait
    'threads-1': {'OMP_NUM_THREADS': str(max(1, (os.cpu_count() or 2) - 1))},   # leave one core to the rest of the machine
    'spin-10k': {'GOMP_SPINCOUNT': '10000'},                    # libgomp spins 10k rounds (~tens of µs), then sleeps
    'spin-100k': {'GOMP_SPINCOUNT': '100000'},
    'spin-1k': {'GOMP_SPINCOUNT': '1000'},
    'passive+threads-1': {'OMP_WAIT_POLICY': 'PASSIVE', 'OMP_NUM_THREADS': str(max(1, (os.cpu_count() or 2) - 1))},
}
CHILD = ("import json, sys; from netlite_nb.run import run_demo; import torch\n"
         "r = run_demo(run_dir=sys.argv[2], steps=int(sys.argv[1]), export=False, progress=False, verbose=False)\n"
         "print(json.dumps({'train_s': r.train_seconds, 'threads': torch.get_num_threads(), 'acc': r.accuracy}))")


def train_seconds(setting:str, steps:int, out:str)->dict:
    "One demo training run in a fresh process with `setting`'s environment; its training time in seconds."
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'OMP_WAIT_POLICY', 'MKL_NUM_THREADS', 'GOMP_SPINCOUNT', 'KMP_BLOCKTIME')}
    env.update(SETTINGS[setting])
    r = subprocess.run([sys.executable, '-c', CHILD, str(steps), out], capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode: raise RuntimeError(f"the training process failed ({setting}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def with_one_core_busy(f):
    "Run `f()` while another process spins on one core."
    spin = subprocess.Popen([sys.executable, '-c', 'while True: pass'])
    try:
        time.sleep(0.5)  # let it take its core
        return f()
    finally: spin.kill(); spin.wait()


README_PRELUDE = "import time; _t0 = time.perf_counter()\nimport torch  # first, as a reader's notebook does\n"
README_CODA = "\nprint(json.dumps({'wall_s': time.perf_counter() - _t0, 'threads': torch.get_num_threads(), 'choices': [str(c) for c in trainer.thread_choices]}))\n"


def readme_script()->str:
    "The README's path through the book as a script that prints its wall time and the trainer's thread choices as JSON."
    import re
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    blocks = re.findall(r"```python\n(.*?)```", open(os.path.join(root, 'README.md')).read(), re.S)
    path = next(b for b in blocks if 'trainer.fit(' in b and 'from netlite_nb.probe import probe' in b)
    return README_PRELUDE.replace('import torch', 'import json, torch') + path + README_CODA


def readme_seconds(out:str)->dict:
    "One run of the README's path in a fresh process, in `out`, with no thread setting in the environment."
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_NUM_THREADS', 'OMP_WAIT_POLICY', 'MKL_NUM_THREADS', 'GOMP_SPINCOUNT', 'KMP_BLOCKTIME')}
    env['PYTHONPATH'] = os.pathsep.join([root, env.get('PYTHONPATH', '')])  # this checkout's netlite_nb
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([sys.executable, '-c', readme_script()], cwd=out, capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode: raise RuntimeError(f"the README's path failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def readme_bench(repeats:int, out:str):
    "Paired runs of the README's path, idle and with one core busy; the result stored in bench/results/contention/."
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from budget_accuracy import machine, _git, _slug, save_result, ROOT
    import platform, torch
    load0, pairs, t0, mach = os.getloadavg(), [], time.time(), machine()
    who = '-'.join(_slug(x) for x in (mach['cpu_vendor'] or '', mach['isa'], mach['cpu'].replace(mach['cpu_vendor'] or '', '')) if x)
    path = ROOT / 'bench' / 'results' / 'contention' / f"readme-path.{who}.json"
    result = dict(bench='contention', case='readme-path', measured_on='cpu', repeats=repeats, machine=mach, torch=torch.__version__,
                  python=platform.python_version(), date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None,
                  dirty=bool(_git('status', '--porcelain', '--untracked-files=no')), source='bench/contention.py --readme',
                  load_before=load0[0], complete=False, pairs=pairs)
    print(f"{os.cpu_count()} cores; load average before: {load0[0]:.2f} (1 min)", flush=True)
    for i in range(repeats):
        idle = readme_seconds(out); busy = with_one_core_busy(lambda: readme_seconds(out))
        pairs.append({'idle': idle, 'busy': busy, 'ratio': busy['wall_s'] / idle['wall_s'], 'load': os.getloadavg()[0]})
        print(f"  pair {i + 1}: idle {idle['wall_s']:7.1f} s  one core busy {busy['wall_s']:7.1f} s  ratio {pairs[-1]['ratio']:.2f}\n"
              f"    idle: {idle['choices']}\n    busy: {busy['choices']}", flush=True)
        med = lambda k: statistics.median(p[k]['wall_s'] for p in pairs)
        result.update(summary=dict(idle_s=med('idle'), busy_s=med('busy'), ratio=statistics.median(p['ratio'] for p in pairs), target=2.0, pairs=len(pairs)),
                      complete=len(pairs) == repeats, load_after=os.getloadavg()[0], seconds=time.time() - t0)
        save_result(path, result)  # after every pair: an interrupted bench keeps what it measured
    summary = result['summary']
    print(f"\nthe README's path, medians of {repeats} pairs: idle {summary['idle_s']:.1f} s, one core busy {summary['busy_s']:.1f} s, "
          f"busy/idle {summary['ratio']:.2f} (target <= 2); load average after {result['load_after']:.2f}\nstored in {path.relative_to(ROOT)}")


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--readme', action='store_true', help="time the README's path through the book as a script")
    ap.add_argument('--steps', type=int, default=40); ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--settings', default=','.join(SETTINGS)); ap.add_argument('--out', default='/tmp/netlite-contention')
    a = ap.parse_args()
    if a.readme: readme_bench(a.repeats, a.out); sys.exit(0)
    names = a.settings.split(',')
    load0, rows = os.getloadavg(), {n: {'idle': [], 'busy': []} for n in names}
    print(f"{os.cpu_count()} cores; load average before: {load0[0]:.2f} (1 min), {load0[1]:.2f} (5 min)", flush=True)
    for i in range(a.repeats):
        for n in names:
            idle = train_seconds(n, a.steps, a.out)
            busy = with_one_core_busy(lambda: train_seconds(n, a.steps, a.out))
            rows[n]['idle'].append(idle['train_s']); rows[n]['busy'].append(busy['train_s']); rows[n]['threads'] = idle['threads']
            print(f"  pair {i + 1} {n:<18} idle {idle['train_s']:6.2f} s  one core busy {busy['train_s']:6.2f} s", flush=True)
    load1 = os.getloadavg()
    base = statistics.median(rows['default']['idle']) if 'default' in rows else None
    print(f"\nthe demo's training, {a.steps} steps, medians of {a.repeats} pairs; load average after: {load1[0]:.2f} (1 min)")
    print(f"{'setting':<20}{'threads':>8}{'idle s':>9}{'busy s':>9}{'busy/idle':>11}{'idle vs default':>17}")
    for n, r in rows.items():
        ratio = statistics.median(b / i for i, b in zip(r['idle'], r['busy']))
        rel = f"{statistics.median(r['idle']) / base:.2f}" if base else ''
        print(f"{n:<20}{r['threads']:>8}{statistics.median(r['idle']):>9.2f}{statistics.median(r['busy']):>9.2f}{ratio:>11.2f}{rel:>17}")
    print("target: busy/idle <= 2.5")
