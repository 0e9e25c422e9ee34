"""How long `plan_memory` takes on one core: CPU seconds of the whole plan and of its trace, per model; writes bench/results/plan_time/<machine>.json.

Each round runs every model in a fresh process (after one warm-up plan there, so imports and first-call caches are not counted) and
reads `time.process_time` around `budget_accuracy.predicted` (the 'cpu' target, the bench's glibc settings) and around the trace
(`trace_step`) the plan makes, after collecting the garbage earlier plans left; the figure is the median over the rounds. `--against DIR` times another checkout of this repository (its
netlite_nb on PYTHONPATH) in the same rounds, each right after this one, so the two are measured side by side on a machine others
share, and checks that both made the same plan.

    python bench/plan_time.py [--models bigru_100 gru bigru lstm selective_scan] [--families] [--rounds 3] [--against ../old-checkout]
    (--families adds the other models of bench/sets/families.py: a plan should take a few seconds on each)
"""
import argparse, gc, json, os, statistics, subprocess, sys, time
from pathlib import Path
os.environ.setdefault('OMP_NUM_THREADS', '1')
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# a child timing another checkout imports that checkout's bench scripts, which put its own netlite_nb first on the path
if os.environ.get('PLAN_TIME_CHECKOUT'): sys.path.insert(0, os.path.join(os.environ['PLAN_TIME_CHECKOUT'], 'bench'))
from budget_accuracy import machine, _git, _slug, save_result, ROOT

MODELS = ['bigru_100', 'gru', 'bigru', 'lstm', 'selective_scan']  # issue 42's recurrent case (twelfth), the families' recurrent ones, a Python loop over time
FAMILIES = ['resnet18', 'mobilenet_v2', 'squeezenet', 'densenet121', 'encdec', 'mha', 'mha_fused', 'hand_attn', 'conv1d', 'tied_lm', 'ln_mlp']  # the rest of --families

def measure(names:list[str])->dict:
    "Per model: (plan CPU-s, trace CPU-s, events traced, planned peak) in this process, after a warm-up plan."
    import torch, budget_accuracy as B
    from sets import ALL
    from netlite_nb.memory.trace import trace_step
    assert B.ROOT.resolve() == Path(os.environ.get('PLAN_TIME_CHECKOUT', B.ROOT)).resolve(), 'timing the wrong checkout'
    out = {'_netlite_nb': str(Path(sys.modules['netlite_nb'].__file__).parent.parent)}
    import netlite_nb.memory.cpu  # registers the CPU's kernels
    import netlite_nb.budget as budget
    traces = []  # (CPU-s, events) of each trace the plan makes, timed where `plan_memory` calls it: the trace's own share of the plan
    def timed(*a, **k):
        t = time.process_time(); r = trace_step(*a, **k); traces.append((time.process_time() - t, len(r.tracker.events))); return r
    budget.trace_step = timed
    for name in names:
        bs = ALL[name][2][0]
        B.predicted(name, bs)
        gc.collect(); traces.clear()  # the garbage earlier plans left is collected before the clock starts, for both checkouts alike
        t = time.process_time(); peak = B.predicted(name, bs); plan_s = time.process_time() - t
        out[name] = dict(batch=bs, plan_s=plan_s, trace_s=sum(s for s, _ in traces), events=traces[-1][1], peak=peak)
    return out

def child(path:str|None, names:list[str])->dict:
    "`measure(names)` in a fresh process, on the netlite_nb of checkout `path` (None: this one)."
    env = {**os.environ, 'PLAN_TIME_CHECKOUT': os.path.abspath(path or ROOT)}
    r = subprocess.run([sys.executable, __file__, '--child', *names], env=env, capture_output=True, text=True, cwd=ROOT)
    if r.returncode: raise RuntimeError(f"timing {path or 'this checkout'} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.splitlines()[-1])

def commit_of(path)->str|None:
    "The commit checked out at `path`; a copy made by `git archive` has none: its COMMIT file names it."
    r = subprocess.run(['git', '-C', str(path), 'rev-parse', '--short=10', 'HEAD'], capture_output=True, text=True)
    if r.returncode == 0 and r.stdout.strip(): return r.stdout.strip()
    f = os.path.join(path, 'COMMIT')
    return open(f).read().strip() if os.path.exists(f) else None

def run(names:list[str], rounds:int, against:str|None)->dict:
    runs = {'this': [], 'against': []}
    for _ in range(rounds):
        runs['this'].append(child(None, names))
        if against: runs['against'].append(child(against, names))
    med = lambda rs, n, k: statistics.median(r[n][k] for r in rs)
    rows = []
    for n in names:
        row = dict(model=n, batch=runs['this'][0][n]['batch'], events=runs['this'][0][n]['events'], peak=runs['this'][0][n]['peak'],
                   plan_s=round(med(runs['this'], n, 'plan_s'), 2), trace_s=round(med(runs['this'], n, 'trace_s'), 2))
        if against:
            row.update(against_plan_s=round(med(runs['against'], n, 'plan_s'), 2), against_trace_s=round(med(runs['against'], n, 'trace_s'), 2),
                       same_plan=all(r[n]['peak'] == row['peak'] for r in runs['against']))
        rows.append(row)
        print(row, flush=True)
    if against and runs['this'][0]['_netlite_nb'] == runs['against'][0]['_netlite_nb']: raise RuntimeError(f"{against} imported this checkout's netlite_nb")
    return dict(bench='plan_time', machine=machine(), torch=__import__('torch').__version__, date=time.strftime('%Y-%m-%dT%H:%M:%S%z'),
                commit=_git('rev-parse', '--short=10', 'HEAD') or None, dirty=bool(_git('status', '--porcelain', '--untracked-files=no')),
                against_commit=commit_of(against) if against else None, rounds=rounds, threads=int(os.environ['OMP_NUM_THREADS']),
                source='bench/plan_time.py', rows=rows)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--models', nargs='+', default=MODELS); ap.add_argument('--rounds', type=int, default=3)
    ap.add_argument('--against', help='another checkout of this repository, timed in the same rounds'); ap.add_argument('--child', nargs='+')
    ap.add_argument('--families', action='store_true', help='also the other models of the families set')
    a = ap.parse_args()
    if a.families: a.models = a.models + [n for n in FAMILIES if n not in a.models]
    if a.child: print(json.dumps(measure(a.child))); sys.exit(0)
    res = run(a.models, a.rounds, a.against)
    m = res['machine']
    path = ROOT / 'bench' / 'results' / 'plan_time' / f"{'-'.join(_slug(x) for x in (m['cpu_vendor'] or '', m['isa'], m['cpu'].replace(m['cpu_vendor'] or '', '')) if x)}.json"
    save_result(path, res)
    print(f"wrote {path.relative_to(ROOT)}")
