"""Execute every chapter headless and keep its outputs, so a reader on GitHub sees the numbers and plots the prose talks about.

    python tools/run_chapters.py [nbs/07_train.ipynb ...]    # default: every numbered chapter

Each chapter runs exactly as `nbdev-test` runs it (same skipped flags, no widget frontend, so every widget shows its static
fallback), and its outputs are written back only when the whole chapter succeeds. Then pictures are made small (at most
`MAX_WIDTH` pixels wide, 8-bit palette PNG), long text outputs are cut to `MAX_LINES` lines, and `nbdev-clean` strips
execution counts and metadata (it keeps outputs).
"""
import base64, io, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_WIDTH, MAX_LINES = 720, 40

def _small_png(b64:str)->str:
    from PIL import Image
    im = Image.open(io.BytesIO(base64.b64decode(b64)))
    if im.width > MAX_WIDTH: im = im.resize((MAX_WIDTH, round(im.height * MAX_WIDTH / im.width)), Image.LANCZOS)
    buf = io.BytesIO()
    im.convert('RGB').quantize(colors=256).save(buf, 'PNG', optimize=True)
    new = base64.b64encode(buf.getvalue()).decode()
    return new if len(new) < len(b64) else b64

def _cut(lines:list[str])->list[str]:
    if len(lines) <= MAX_LINES: return lines
    return lines[:MAX_LINES - 1] + [f"… ({len(lines) - MAX_LINES + 1} more lines: run the cell to see them all)\n"]

def shrink(nb_path:Path):
    "Make the saved outputs of `nb_path` small."
    nb = json.loads(nb_path.read_text())
    for c in nb['cells']:
        for o in c.get('outputs', []):
            data = o.get('data', {})
            if 'image/png' in data:
                png = data['image/png']
                data['image/png'] = _small_png(''.join(png) if isinstance(png, list) else png)
            for k in ('text/plain',):
                if k in data and isinstance(data[k], list): data[k] = _cut(data[k])
            if o.get('output_type') == 'stream': o['text'] = _cut(o['text'] if isinstance(o['text'], list) else o['text'].splitlines(True))
    nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')

def main(paths:list[str])->int:
    os.environ.setdefault('MPLBACKEND', 'Agg')
    import matplotlib; matplotlib.rcParams['figure.dpi'] = 72  # figures that do not set their own dpi come out small
    from nbdev.config import get_config
    from nbdev.test import test_nb
    flags = get_config().tst_flags.split()
    nbs = [Path(p) for p in paths] or sorted((ROOT / 'nbs').glob('[0-9]*.ipynb'))
    failed = []
    for nb in nbs:
        t = time.time()
        ok, _ = test_nb(nb.resolve(), skip_flags=flags, save=True)
        print(f"{nb.name}: {'ok' if ok else 'FAILED (outputs not saved)'} in {time.time() - t:.0f} s", flush=True)
        if ok: shrink(nb.resolve())
        else: failed.append(nb.name)
    subprocess.run(['nbdev-clean'], cwd=ROOT, check=True)
    if failed: print('failed:', ', '.join(failed))
    return 1 if failed else 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
