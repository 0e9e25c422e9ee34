"The package is publishable: the wheel carries its data, the torch floor is declared and documented, and every chapter's Colab cell is the README's."
import re, subprocess, sys, types, zipfile
from pathlib import Path
import pytest
try: import tomllib
except ModuleNotFoundError: import tomli as tomllib  # Python 3.10
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / 'tools'))
import check_dist, colab_cell

PYPROJECT = tomllib.loads((ROOT / 'pyproject.toml').read_text())
README = (ROOT / 'README.md').read_text()


def test_every_chapter_carries_the_readme_colab_cell():
    cell = colab_cell.readme_cell()
    assert cell.startswith('#| hide\n') and "'google.colab' in sys.modules" in cell, cell
    assert f"```python\n{cell}\n```" in README, 'README.md must quote the cell nbs/index.ipynb holds: run `python tools/readme.py`'
    differ = [p.name for p in colab_cell.chapters() if colab_cell.chapter_cell(p) != cell]
    assert not differ, f"run `python tools/colab_cell.py`: {differ}"
    assert len(colab_cell.chapters()) >= 14


def _run_cell(monkeypatch, in_colab:bool, installed:bool, pip_rc:int=0):
    "Run the Colab cell with Colab, an installed netlite_nb and pip's answer faked; returns the pip calls it made."
    import importlib.util
    calls = []
    def fake_pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, pip_rc, '', 'ERROR: Could not find a version that satisfies the requirement netlite_nb (from versions: none)\n'
                                                            'ERROR: No matching distribution found for netlite_nb\n' if pip_rc else '')
    monkeypatch.setattr(subprocess, 'run', fake_pip)
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: (real_find(name, *a) if installed else None) if name == 'netlite_nb' else real_find(name, *a))
    if in_colab: monkeypatch.setitem(sys.modules, 'google.colab', types.ModuleType('google.colab'))
    else: monkeypatch.delitem(sys.modules, 'google.colab', raising=False)
    exec(colab_cell.readme_cell(), {})
    return calls


def test_colab_cell_does_nothing_outside_colab(monkeypatch):
    assert _run_cell(monkeypatch, in_colab=False, installed=False, pip_rc=1) == []


def test_colab_cell_does_nothing_once_installed(monkeypatch):
    assert _run_cell(monkeypatch, in_colab=True, installed=True, pip_rc=1) == []


def test_colab_cell_installs_from_pypi_when_it_can(monkeypatch):
    calls = _run_cell(monkeypatch, in_colab=True, installed=False, pip_rc=0)
    assert len(calls) == 1 and calls[0][-1] == 'netlite_nb', calls


def test_colab_cell_says_how_to_install_when_pypi_has_no_netlite_nb(monkeypatch):
    with pytest.raises(RuntimeError) as e: _run_cell(monkeypatch, in_colab=True, installed=False, pip_rc=1)
    msg = str(e.value)
    assert 'not published there yet' in msg and '!pip install git+https://github.com/' in msg and 'pip install -e .' in msg, msg
    assert msg.endswith('pip said: ERROR: No matching distribution found for netlite_nb'), msg


def test_package_data_ships_every_data_file():
    "Every non-Python file under netlite_nb/ is matched by `[tool.setuptools.package-data]`, so the wheel carries it."
    globs = PYPROJECT['tool']['setuptools']['package-data']
    shipped = {str(f.relative_to(ROOT)).replace('\\', '/') for pkg, pats in globs.items() for pat in pats
               for f in (ROOT / pkg.replace('.', '/')).glob(pat) if f.is_file()}
    files = check_dist.data_files()
    assert {'netlite_nb/gpus.json', 'netlite_nb/mnist_5k.npz', 'netlite_nb/strategies/cpu.yaml', 'netlite_nb/configs/image_folder.yaml'} <= set(files), files
    assert set(files) <= shipped, f"not in package-data, so not in the wheel: {sorted(set(files) - shipped)}"
    assert PYPROJECT['tool']['setuptools']['packages']['find']['include'] == ['netlite_nb', 'netlite_nb.memory', 'netlite_nb.training', 'netlite_nb.strategies', 'netlite_nb.configs']


def test_missing_from_names_a_file_the_wheel_lacks(tmp_path):
    "The CI check of a built wheel fails on a wheel without the strategies (it is not a check that cannot fail)."
    whl = tmp_path / 'netlite_nb-0-py3-none-any.whl'
    keep = [f for f in check_dist.data_files() if not f.startswith('netlite_nb/strategies/')]
    with zipfile.ZipFile(whl, 'w') as z:
        for f in keep + [f"netlite_nb/{p.name}" for p in (ROOT / 'netlite_nb').glob('*.py')]: z.writestr(f, '')
        z.writestr('netlite_nb-0.dist-info/entry_points.txt', '')
    gone = check_dist.missing_from(whl)
    assert gone and all(g.startswith('wheel: netlite_nb/strategies/') for g in gone), gone
    assert len(gone) == len(list((ROOT / 'netlite_nb' / 'strategies').glob('*.yaml')))


def test_torch_floor_is_declared_and_the_readme_states_it():
    deps = PYPROJECT['project']['dependencies']
    assert 'torch>=2.6' in deps and 'torchvision>=0.21' in deps, deps
    assert '**torch ≥ 2.6**' in README
    # the Pascal line keeps the floor and stops before 2.15, the first release without CUDA 12.6 wheels
    assert '`pip install "torch>=2.6,<2.15" torchvision --index-url https://download.pytorch.org/whl/cu126`' in README
    for index in ('cu130', 'cpu', 'rocm7.14', 'xpu'): assert f"--index-url https://download.pytorch.org/whl/{index}`" in README, index


@pytest.mark.slow
def test_built_wheel_and_sdist_carry_every_package_file(tmp_path):
    "Build for real (`python -m build`, as `tools/check_dist.py` in .ci/run does) and look inside."
    import importlib.util
    py = sys.executable if importlib.util.find_spec('build') else check_dist.tools_python(tmp_path / 'tools')
    sdist, wheel = check_dist.build(tmp_path / 'dist', py)
    assert check_dist.missing_from(wheel, sdist) == []
