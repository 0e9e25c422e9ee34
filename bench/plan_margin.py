"""Where a CPU plan's misses come from: every stored accuracy row (measured vs planned) next to the plan's terms, re-planned now.

    python bench/plan_margin.py terms     # re-plan each stored row of bench/results/budget_accuracy/ on the 'cpu' target (one thread,
                                          # the bench's glibc settings; rows measured on an AVX-512 CPU planned with AVX-512's kernel
                                          # models) and store measured, the stored plans and today's plan with its terms
    python bench/plan_margin.py fit       # from that file: fit the margin (a fixed part + a share of the plan's modelled bytes) on
                                          # the AMD AVX2 rows, check it on the Intel AVX-512 rows it never saw, and the other way round

A row's miss is measured - planned: what a batch chosen by the plan would overstep the plan by. A margin kept below the budget keeps
every measured step within it exactly when margin >= miss, whatever the budget; so each row checks the margin at every budget.
The plan's *modelled* bytes are the terms no tensor accounts for (`MODELLED_TERMS`: kernel scratch, MKL/oneDNN workspace, glibc's
rounding, the autograd graph's nodes); the rest of a plan is the traced tensors' exact sizes.
"""
import argparse, glob, json, os, sys, time
from pathlib import Path
from unittest import mock
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import budget_accuracy as B
ROOT = B.ROOT
OUT = ROOT / 'bench' / 'results' / 'plan_margin'

def stored_rows()->list[dict]:
    "Every accuracy row of the stored results (budget rows and the changelog left out), tagged with its set, machine and file."
    rows = []
    for f in sorted(glob.glob(str(B.RESULTS / '*.json'))):
        d = json.load(open(f))
        if d.get('bench') != 'budget_accuracy' or d['options'].get('budgets') or d['options'].get('precision') not in (None, 'fp32'): continue
        for r in d['rows']:
            if 'planned' not in r or 'budget' in r: continue
            rows.append(dict(set=d['set'], machine=d['machine'].get('isa'), vendor=d['machine'].get('cpu_vendor'), file=Path(f).name,
                             model=r['model'], batch=r['batch'], measured=r['measured'], planned=r['planned'],
                             calibrated=r.get('calibrated'), code_pages=r.get('code_pages')))
    return rows

def replan(row:dict)->dict:
    "Today's uncalibrated 'cpu' plan of a stored row: its total and terms, with the kernel models of the CPU the row was measured on."
    from netlite_nb.budget import plan_memory
    import torch, netlite_nb.memory.cpu as C
    model, batch = B.make(row['model'], row['batch'])
    isa = 'AVX512' if '512' in (row['machine'] or '') else 'AVX2'
    # the kernel models read the ISA when planning (MKL's blocking) and at import (oneDNN's channel block): both set to the row's CPU's
    with B._as_measured(), mock.patch.object(torch.backends.cpu, 'get_cpu_capability', lambda: isa), \
         mock.patch.object(C, '_CPU_BLOCK', 16 if isa == 'AVX512' else 8):
        p = plan_memory(model, batch, loss_fn=B._loss(row['model']), device_or_gpu='cpu')
    return dict(planned_now=p.total, terms=p.breakdown)

def terms(path:Path, only:str|None=None):
    "Re-plan every stored row (or only those measured on ISA `only`, keeping the others' stored terms) and store them in `path`."
    old = {(r['file'], r['model'], r['batch']): r for r in json.load(open(path))['rows']} if only and path.exists() else {}
    result = B.new_result('all', {})
    result.update(bench='plan_margin', source='bench/plan_margin.py', rows=[])
    seen = {}
    for row in stored_rows():
        if only and only not in (row['machine'] or '') and (row['file'], row['model'], row['batch']) in old:
            result['rows'].append(old[(row['file'], row['model'], row['batch'])]); continue
        key = (row['model'], row['batch'], 'AVX512' if '512' in (row['machine'] or '') else 'AVX2')
        t0 = time.process_time()
        try: seen.setdefault(key, replan(row))
        except Exception as e: seen[key] = dict(error=f'{type(e).__name__}: {str(e)[:200]}')
        result['rows'].append({**row, **seen[key]})
        print(row['set'], row['machine'], row['model'], row['batch'], f"{time.process_time() - t0:.1f} s CPU", flush=True)
        B.save_result(path, result)
    result.update(complete=True)
    B.save_result(path, result)

MODELLED_TERMS = ('kernel scratch', 'CPU kernel workspace', 'allocator rounding', 'autograd graph')  # as netlite_nb.budget states them

def _cases(path:Path)->list[dict]:
    "The re-planned rows as cases: machine, label, miss of today's plan and of the stored calibrated plan, modelled bytes (all bytes)."
    out = []
    for r in json.load(open(path))['rows']:
        if 'terms' not in r: continue
        u = sum(r['terms'].get(k, 0) for k in MODELLED_TERMS)
        out.append(dict(machine='AVX-512' if '512' in (r['machine'] or '') else 'AVX2', set=r['set'], label=f"{r['set']}/{r['model']}:{r['batch']} ({r['file'].split('.')[1]})",
                        miss=r['measured'] - r['planned_now'], miss_cal=None if r['calibrated'] is None else r['measured'] - r['calibrated'],
                        modelled=u, total=r['planned_now'], code_pages=r['code_pages']))
    return out

def derive(cases:list[dict], fixed:int, key:str='miss')->float:
    "The smallest share k of the modelled bytes with miss <= fixed + k x modelled on every case (0 where `fixed` alone covers them)."
    return max([(c[key] - fixed) / c['modelled'] for c in cases if c[key] is not None and c[key] > fixed and c['modelled'] > 0] or [0.0])

def check(cases:list[dict], fixed:int, share:float, key:str='miss')->list[dict]:
    "The cases whose miss the margin fixed + share x modelled does not cover: where a plan could choose a batch over the budget."
    return [c for c in cases if c[key] is not None and c[key] > fixed + share * max(c['modelled'], 0)]

SPLITS = {  # (what the share is derived on, what it is checked on), as predicates on a case
    'AVX2 -> AVX-512': (lambda c: c['machine'] == 'AVX2', lambda c: c['machine'] == 'AVX-512'),
    'AVX-512 -> AVX2': (lambda c: c['machine'] == 'AVX-512', lambda c: c['machine'] == 'AVX2'),
    'default, families -> other sets': (lambda c: c['set'] in ('default', 'families'), lambda c: c['set'] not in ('default', 'families')),
    'other sets -> default, families': (lambda c: c['set'] not in ('default', 'families'), lambda c: c['set'] in ('default', 'families'))}

def fit(path:Path, fixed:int=2**20, out:Path|None=None):
    "Derive the share on each split's first part, check it on the second, derive it on every row; print and store it all."
    mi = lambda b: f"{b / 2**20:+.2f} MiB"
    cases = _cases(path)
    result = dict(bench='plan_margin', source='bench/plan_margin.py fit', terms_file=path.name, fixed=fixed, modelled_terms=list(MODELLED_TERMS),
                  date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=B._git('rev-parse', '--short=10', 'HEAD') or None, plans=['uncalibrated', 'calibrated'])
    for key, plan in (('miss', 'uncalibrated'), ('miss_cal', 'calibrated')):
        rows = [c for c in cases if c[key] is not None]
        share = derive(rows, fixed, key)
        entry = dict(rows=len(rows), share=round(share, 4), splits=[], largest=[])
        print(f"== {plan} plans ({len(rows)} rows), fixed allowance {mi(fixed)}: share derived on every row {share:.3f}")
        for name, (on, off) in SPLITS.items():
            tr, te = [c for c in rows if on(c)], [c for c in rows if off(c)]
            if not tr or not te: continue
            k = derive(tr, fixed, key)
            bad = check(te, fixed, k, key)
            entry['splits'].append(dict(split=name, derived_on=len(tr), share=round(k, 4), checked_on=len(te), over_budget=[
                dict(case=c['label'], miss=c[key], margin=int(fixed + k * c['modelled']), modelled=c['modelled']) for c in bad]))
            print(f"  {name}: share {k:.3f} from {len(tr)} rows; on the {len(te)} others {len(bad)} step(s) over the budget"
                  + ''.join(f"\n    {c['label']}: miss {mi(c[key])} > margin {mi(fixed + k * c['modelled'])} (modelled {mi(c['modelled'])})" for c in bad))
        for c in sorted(rows, key=lambda c: -c[key])[:6]:
            entry['largest'].append(dict(case=c['label'], machine=c['machine'], miss=c[key], modelled=c['modelled'], code_pages=c['code_pages']))
            print(f"    {c['machine']:7} {c['label']:55} miss {mi(c[key])} modelled {mi(c['modelled'])} code pages {c['code_pages']}")
        result[plan] = entry
    if out: B.save_result(out, result); print(f"stored: {out.relative_to(ROOT)}")

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('what', choices=['terms', 'fit'])
    ap.add_argument('--only', help="re-plan only the rows measured on this ISA (e.g. 512), keep the file's other rows")
    ap.add_argument('--file', type=Path, default=OUT / 'terms.json', help='the re-planned rows (default: bench/results/plan_margin/terms.json)')
    a = ap.parse_args()
    terms(a.file, a.only) if a.what == 'terms' else fit(a.file, out=a.file.parent / 'fit.json')
