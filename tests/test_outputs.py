"Stored outputs never show the machine that made them: `tools/run_chapters.py` masks its paths, and no notebook keeps one."
import json, os, re, site, sys, tempfile
from pathlib import Path
import pytest
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import run_chapters
from run_chapters import machine_paths, mask_paths, mask

PATHS = [('/home/ada/.pyenv/versions/3.12.1/lib/python3.12/site-packages', '<site-packages>'),
         ('/home/ada/.pyenv/versions/3.12.1', '<python>'), ('/home/ada/src/netlite_nb', '<repo>'), ('/tmp', '<tmp>'),
         ('C:\\Users\\ada\\AppData\\Local\\Temp', '<tmp>'), ('/home/ada', '~')]


def test_mask_paths_replaces_each_path_by_its_placeholder():
    text = ("/home/ada/.pyenv/versions/3.12.1/lib/python3.12/site-packages/torch/jit/_script.py:1491: FutureWarning\n"
            "/home/ada/.pyenv/versions/3.12.1/lib/python3.12/warnings.py\n"
            "/home/ada/src/netlite_nb/netlite_nb/train.py:1138: UserWarning\n"
            "MNIST is not in /tmp/tmpcz4f5c_r/MNIST/raw. Path('/tmp/tmpb7q5daln/mlp.onnx') /tmp/data, into /tmp/tmpcz4f5c_r.\n"
            "cached in /home/ada/.cache/netlite_nb/kernels.json\n"
            "WindowsPath('C:\\\\Users\\\\ada\\\\AppData\\\\Local\\\\Temp\\\\tmpab_cd123\\\\run') C:\\Users\\ada\\AppData\\Local\\Temp\\x")
    assert mask_paths(text, PATHS) == (
            "<site-packages>/torch/jit/_script.py:1491: FutureWarning\n"
            "<python>/lib/python3.12/warnings.py\n"
            "<repo>/netlite_nb/train.py:1138: UserWarning\n"
            "MNIST is not in <tmp>/MNIST/raw. Path('<tmp>/mlp.onnx') <tmp>/data, into <tmp>.\n"
            "cached in ~/.cache/netlite_nb/kernels.json\n"
            "WindowsPath('<tmp>\\\\run') <tmp>\\x")


def test_mask_paths_leaves_other_paths_alone():
    "Only whole path components: /tmpfiles, /home/adam, ~/src/netlite_nb_old and a relative tmp/ are not this machine's paths."
    text = "/tmpfiles/x /home/adam/x /home/ada/src/netlite_nb_old/x /home/ada/src/netlite_nb.old runs/tmp/x a/tmp/tmpabcdefgh <tmp>/x"
    assert mask_paths(text, PATHS) == "/tmpfiles/x /home/adam/x ~/src/netlite_nb_old/x ~/src/netlite_nb.old runs/tmp/x a/tmp/tmpabcdefgh <tmp>/x"
    assert mask_paths(text, []) == text


def test_machine_paths_cover_this_machine():
    "This interpreter's site-packages and prefix, a fresh temporary directory, the home directory and the repository."
    import torch
    paths = machine_paths()
    d = tempfile.mkdtemp()
    try:
        text = f"{torch.__file__}|{sys.prefix}/lib|{d}/run/x.onnx|{Path.home()}/.cache/netlite_nb/k.json|{ROOT}/netlite_nb/train.py"
        masked = mask_paths(text, paths)
    finally: os.rmdir(d)
    parts = masked.split('|')
    assert re.fullmatch(r'<(site-packages|python)>/(lib/python[\d.]+/site-packages/)?torch/__init__\.py', parts[0]), parts[0]
    assert parts[1:] == ['<python>/lib', '<tmp>/run/x.onnx', '~/.cache/netlite_nb/k.json', '<repo>/netlite_nb/train.py'], masked


def test_mask_rewrites_every_kind_of_output(tmp_path):
    nb = {'cells': [{'cell_type': 'code', 'source': 'x', 'metadata': {}, 'outputs': [
        {'output_type': 'stream', 'name': 'stderr', 'text': ['/tmp/tmpab_cd123/a\n', '/home/ada/b\n']},
        {'output_type': 'execute_result', 'metadata': {}, 'data': {'text/plain': "Path('/home/ada/src/netlite_nb')",
                                                                   'text/html': ['<td>/tmp/tmpab_cd123/m.onnx</td>'], 'image/png': 'iVBOR/tmp/'}},
        {'output_type': 'error', 'ename': 'OSError', 'evalue': 'no /home/ada/x', 'traceback': ['File /home/ada/.pyenv/versions/3.12.1/y.py']}]}],
          'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    p = tmp_path / 'x.ipynb'; p.write_text(json.dumps(nb))
    mask(p, PATHS)
    s, r, e = json.loads(p.read_text())['cells'][0]['outputs']
    assert s['text'] == ['<tmp>/a\n', '~/b\n'] and r['data']['text/plain'] == "Path('<repo>')" and r['data']['text/html'] == ['<td><tmp>/m.onnx</td>']
    assert r['data']['image/png'] == 'iVBOR/tmp/' and e['evalue'] == 'no ~/x' and e['traceback'] == ['File <python>/y.py']


# --- every stored output of the book --------------------------------------------------------------------------------------
LEAKS = {'a home directory': r'(?<![\w.-])(/root/|/home/[^/\s\'"]+/|/Users/[^/\s\'"]+/|[A-Za-z]:\\{1,2}Users\\{1,2})',
         'an interpreter or package path': r'\.pyenv|(?<!<)(site|dist)-packages|[/\\](\.?venv|virtualenvs|envs|miniconda3|anaconda3|conda)[/\\]',
         'a temporary directory': r'(?<![\w.-])/tmp/tmp[a-z0-9_]{8}|/var/folders/|\\Temp\\{1,2}tmp',
         'a cache directory': r'(?<![\w.-])/[^\s\'"]+/\.cache/'}
OWN = [p for p, tag in machine_paths() if tag in ('<repo>', '<python>', '<site-packages>', '~')]  # this machine's, wherever they are


def leaks(nb_path:Path)->list[str]:
    "Each output of `nb_path` that shows a path of a machine: 'cell N (kind): the text around it'."
    found = []
    for i, c in enumerate(json.loads(nb_path.read_text())['cells']):
        for o in c.get('outputs', []):
            texts = [o.get('text', ''), o.get('evalue', ''), '\n'.join(o.get('traceback', []))]
            texts += [v for k, v in o.get('data', {}).items() if k.startswith('text/') or k.endswith('json')]
            for t in texts:
                t = ''.join(t) if isinstance(t, list) else t if isinstance(t, str) else json.dumps(t)
                hits = [(what, m) for what, pat in LEAKS.items() for m in re.finditer(pat, t)]
                hits += [('this machine\'s path', m) for p in OWN for m in re.finditer(r'(?<![\w.-])' + re.escape(p) + r'(?![\w.-])', t)]
                found += [f"cell {i} ({what}): …{t[max(0, m.start() - 40):m.end() + 40]!r}…" for what, m in hits]
    return found


def test_leaks_finds_what_the_book_must_not_show(tmp_path):
    "The scan fails on each kind of leak (it is not a check that cannot fail)."
    outs = ['/root/.cache/netlite_nb/k.json', '/home/ada/x', 'C:\\Users\\ada\\x', '/opt/venv/lib/x', '/tmp/tmpcz4f5c_r/MNIST',
            f'{ROOT}/netlite_nb/train.py', '<tmp>/MNIST and ~/.cache/netlite_nb and <site-packages>/torch']
    nb = {'cells': [{'cell_type': 'code', 'source': '', 'metadata': {}, 'outputs': [{'output_type': 'stream', 'name': 'stdout', 'text': t}]}
                    for t in outs], 'metadata': {}, 'nbformat': 4, 'nbformat_minor': 5}
    p = tmp_path / 'x.ipynb'; p.write_text(json.dumps(nb))
    cells = {int(f.split()[1]) for f in leaks(p)}
    assert cells == {0, 1, 2, 3, 4, 5}, leaks(p)


NOTEBOOKS = sorted(p for p in (ROOT / 'nbs').rglob('*.ipynb') if '.ipynb_checkpoints' not in p.parts)
@pytest.mark.parametrize('nb', [pytest.param(p, id=p.name)
                                for p in NOTEBOOKS])
def test_stored_outputs_show_no_machine(nb):
    found = leaks(nb)
    assert not found, (f"{nb.relative_to(ROOT)} shows paths of the machine that ran it; re-run it with `python tools/run_chapters.py "
                       f"{nb.relative_to(ROOT)}` (or mask it: `--mask-only`):\n" + '\n'.join(found))
