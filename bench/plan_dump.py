"""Plans of a bench set, dumped as JSON, and two dumps compared: a refactor of the planner must not change a plan.

    python bench/plan_dump.py dump before.json [--set families] [--models a b]   # plan each model at its first batch for 'cpu', tensors only and a GTX 1650
    python bench/plan_dump.py compare before.json after.json       # every field that differs, per plan, and why (the peak, errors and notes that changed); exit 1 if any does

The CPU target's budget is the memory available at that moment, so `compare` leaves it out.
"""
import argparse, dataclasses, json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def dump(path:str, set_name:str, models:list|None=None):
    import budget_accuracy as B
    from sets import SETS
    from netlite_nb.budget import plan_memory
    out = {}
    for name, (_, _, sizes) in SETS[set_name].items():
        if models and name not in models: continue
        for tgt in ('cpu', None, 'gtx 1650'):
            model, batch = B.make(name, sizes[0])
            try: d = dataclasses.asdict(plan_memory(model, batch, loss_fn=B._loss(name), device_or_gpu=tgt))
            except Exception as e: d = {'error': f'{type(e).__name__}: {e}'}
            out[f'{name}:{sizes[0]}:{tgt}'] = d
    with open(path + '.tmp', 'w') as f: json.dump(out, f, indent=1, sort_keys=True, default=str)
    os.replace(path + '.tmp', path)

def why(old:dict, new:dict)->list[str]:
    "What explains a changed plan: its peak before and after, an error that came or went, and the notes (the plan's own reasons) that came or went."
    if 'error' in old or 'error' in new: return [f"before: {old.get('error', 'planned')[:200]}", f"after:  {new.get('error', 'planned')[:200]}"]
    lines = []
    if old.get('peak') != new.get('peak') and old.get('peak'):
        lines.append(f"peak {old['peak'] / 2**20:.2f} -> {new['peak'] / 2**20:.2f} MiB ({100 * (new['peak'] - old['peak']) / old['peak']:+.1f} %)")
    gone, came = (sorted(set(x.get('notes', [])) - set(y.get('notes', []))) for x, y in ((old, new), (new, old)))
    return lines + [f"note gone: {n[:200]}" for n in gone] + [f"note new:  {n[:200]}" for n in came]

def compare(a_path:str, b_path:str)->int:
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    diffs = {k: sorted(f for f in set(a.get(k, {})) | set(b.get(k, {})) if a.get(k, {}).get(f) != b.get(k, {}).get(f)
                       and not (f == 'budget' and k.endswith(':cpu'))) for k in set(a) | set(b)}
    diffs = {k: v for k, v in diffs.items() if v}
    for k, fs in sorted(diffs.items()):
        print(f"{k}: {', '.join(fs)}")
        for line in why(a.get(k, {}), b.get(k, {})): print(f"    {line}")
    print(f"{len(set(a) | set(b))} plans, {len(diffs)} differ")
    return 1 if diffs else 0

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('what', choices=['dump', 'compare']); ap.add_argument('paths', nargs='+'); ap.add_argument('--set', default='families'); ap.add_argument('--models', nargs='+', help='only these models of the set')
    a = ap.parse_args()
    sys.exit(dump(a.paths[0], a.set, a.models) if a.what == 'dump' else compare(*a.paths[:2]))
