"""Store the accuracy tables chapter 01 pasted (at commit CHAPTER) as results of bench/results/budget_accuracy/, tagged
source 'chapter 01 at CHAPTER': they were measured by bench/budget_accuracy.py in earlier sessions and printed, not re-run here.

    python bench/ingest_chapter01.py

Only the tables whose section names the machine and the command are taken (TABLES); figures are the printed ones (MiB to 0.1)."""
import json, re, subprocess, sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'bench'))
from budget_accuracy import OPTIONS, RESULTS, result_path, save_result

CHAPTER = '3bb35aa'  # the commit whose nbs/01_budget.ipynb the tables are read from
EPYC = dict(cpu='AMD EPYC', described='a 2-core AMD EPYC whose PyTorch reports AVX2, no AVX-512', cpu_vendor='AMD', isa='AVX2', isa_flags=['avx2'], torch_cpu_capability='AVX2', cores=2, gpu=None, gpu_driver=None)
XEON = dict(cpu='Intel Xeon', described='a 2-core Intel Xeon whose PyTorch reports AVX-512, with bf16 instructions', cpu_vendor='Intel', isa='AVX-512', isa_flags=['avx512f'],
            torch_cpu_capability='AVX512', cores=2, gpu=None, gpu_driver=None)
# (cell, code block in it) -> set, machine, options: the command and the machine the section states just above each table
TABLES = {(432, 0): ('default', EPYC, {}), (433, 0): ('families', EPYC, dict(calibrate=True)),
          (435, 0): ('brought', XEON, dict(calibrate=True)), (435, 2): ('families', XEON, dict(calibrate=True)),
          (435, 3): ('unseen', XEON, dict(calibrate=True)), (435, 4): ('variants', XEON, dict(calibrate=True))}
ROW = re.compile(r'^(\S+)\s+(\d+)\s+([\d.]+)Mi\s+([\d.]+)Mi\s+([+-]?[\d.]+)%\s+([+-]?[\d.]+) MiB\s+([+-]?[\d.]+)%(?:\s+([\d.]+)Mi\s+([+-]?[\d.]+)%)?$')
MiB = lambda x: round(float(x) * 2**20)

def rows(block:str)->list:
    "The rows of one printed accuracy table; a line that looks like a row but does not parse is an error, not skipped."
    out = []
    for line in block.splitlines():
        if not line.strip() or line.startswith(('model ', 'calibration from', 'max |error|')): continue
        m = ROW.match(line.strip())
        if not m: raise ValueError(f'not an accuracy row: {line!r}')
        name, bs, p, meas, err, tdiff, _, c, cerr = m.groups()
        row = dict(model=name, batch=int(bs), measured=MiB(meas), planned=MiB(p), error_pct=float(err), tensors_only=MiB(meas) + MiB(tdiff))
        if c: row.update(calibrated=MiB(c), calibrated_error_pct=float(cerr))
        out.append(row)
    return out

def main():
    nb = json.loads(subprocess.run(['git', 'show', f'{CHAPTER}:nbs/01_budget.ipynb'], cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    for (cell, k), (set_name, mach, opts) in TABLES.items():
        block = re.findall(r'```\n(.*?)```', ''.join(nb['cells'][cell]['source']), flags=re.S)[k]
        options = {**OPTIONS, **opts}
        result = dict(bench='budget_accuracy', set=set_name, measured_on='cpu', options=options, machine=mach, torch='2.14.1', python=None, date=None,
                      commit=None, dirty=None, source=f'chapter 01 at {CHAPTER}', rounding='MiB to 0.1, as printed', complete=True, seconds=None, rows=rows(block))
        path = result_path(set_name, mach, options).with_suffix('.chapter01.json')
        save_result(path, result)
        print(f'{path.relative_to(ROOT)}: {len(result["rows"])} rows from cell {cell}')

if __name__ == '__main__': main()
