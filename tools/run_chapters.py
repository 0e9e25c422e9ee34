"""Execute every chapter headless and keep its outputs, so a reader on GitHub sees the numbers and plots the prose talks about.

    python tools/run_chapters.py [nbs/07_train.ipynb ...]    # default: every numbered chapter

Each chapter runs exactly as `nbdev-test` runs it (same skipped flags, no widget frontend, so every widget shows its static
fallback), and its outputs are written back only when the whole chapter succeeds. Then pictures are made small (at most
`MAX_WIDTH` pixels wide, 8-bit palette PNG), long text outputs are cut to `MAX_LINES` lines, the paths of the machine that
ran the chapter are masked (`mask_paths`: the home directory is `~`, the interpreter `<python>`, site-packages
`<site-packages>`, temporary directories `<tmp>`, the repository `<repo>`), and `nbdev-clean` strips execution counts and
metadata (it keeps outputs).

    python tools/run_chapters.py --mask-only [nbs/09_export.ipynb ...]   # mask the stored outputs without running the chapters
"""
import base64, io, json, os, re, site, subprocess, sys, sysconfig, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_WIDTH, MAX_LINES = 720, 40

def machine_paths(repos=())->list[tuple[str, str]]:
    "This machine's paths that stored outputs must not show, each with its placeholder; the most specific first."
    import netlite_nb  # the package the chapters import may live in another checkout than this script (an editable install)
    home, cache = Path.home(), os.environ.get('XDG_CACHE_HOME')
    subs = [(r, '<repo>') for r in (ROOT, Path(netlite_nb.__file__).resolve().parents[1], *repos)]
    subs += [(p, '<site-packages>') for p in (*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_path('purelib'),
                                              sysconfig.get_path('platlib'))]
    subs += [(p, '<python>') for p in (sysconfig.get_path('stdlib'), sys.prefix, sys.base_prefix, sys.exec_prefix, Path(sys.executable).parent)]
    subs += [(cache, '<cache>')] if cache else []
    subs += [(tempfile.gettempdir(), '<tmp>'), ('/tmp', '<tmp>'), (home, '~')]
    out = {}
    for p, tag in subs:
        p = str(p).rstrip('/\\')
        if len(p) > 1 and p not in out: out[p] = tag
    return sorted(out.items(), key=lambda kv: -len(kv[0]))  # /root/.pyenv/... before /root

# mkdtemp's names: 'tmp' and 8 of [a-z0-9_]; a run's directory inside one is as random as the directory itself
_MKDTEMP = r'(?:[/\\]+tmp[a-z0-9_]{8}(?![\w-]|\.\w))?'

def mask_paths(text:str, paths:list[tuple[str, str]])->str:
    "`text` with each of `paths` (from `machine_paths`) replaced by its placeholder, where it is a whole path component (a full stop after it ends a sentence)."
    for p, tag in paths:
        for q in {p, p.replace('\\', '\\\\')}:  # a Windows path as repr() writes it, too
            tail = _MKDTEMP if tag == '<tmp>' else ''
            text = re.sub(r'(?<![\w.~-])' + re.escape(q) + r'(?![\w-]|\.\w)' + tail, lambda m: tag, text)
    return text

def _mask_output(o:dict, paths):
    "Mask the machine's paths in one stored output, in place: stream text, every text/* or JSON view, an error's text."
    def m(v): return [mask_paths(x, paths) for x in v] if isinstance(v, list) else mask_paths(v, paths) if isinstance(v, str) else v
    if 'text' in o: o['text'] = m(o['text'])
    for k, v in o.get('data', {}).items():
        if k.startswith('text/') or k.endswith('json'): o['data'][k] = m(v) if not isinstance(v, dict) else json.loads(m(json.dumps(v)))
    for k in ('ename', 'evalue', 'traceback'):
        if k in o: o[k] = m(o[k])

def mask(nb_path:Path, paths=None):
    "Mask the machine's paths in every stored output of `nb_path`."
    paths = machine_paths() if paths is None else paths
    nb = json.loads(nb_path.read_text())
    for c in nb['cells']:
        for o in c.get('outputs', []): _mask_output(o, paths)
    nb_path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')

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
    if '--mask-only' in paths:
        for nb in [Path(p) for p in paths if p != '--mask-only'] or sorted((ROOT / 'nbs').rglob('*.ipynb')): mask(nb.resolve())
        return subprocess.run(['nbdev-clean'], cwd=ROOT).returncode
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
        if ok: shrink(nb.resolve()); mask(nb.resolve())
        else: failed.append(nb.name)
    subprocess.run(['nbdev-clean'], cwd=ROOT, check=True)
    if failed: print('failed:', ', '.join(failed))
    return 1 if failed else 0

if __name__ == '__main__': sys.exit(main(sys.argv[1:]))
