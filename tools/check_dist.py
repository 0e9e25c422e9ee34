"""Check netlite_nb is ready to publish: build the sdist and wheel, `twine check` them, install the wheel into a fresh
venv and run `netlite probe` (and a strategy, the catalogue and the MNIST sample) from that install.

    python tools/check_dist.py [--outdir dist]      # .ci/run runs this

`build` and `twine` run from a venv of their own, made here (twine's readme-renderer wants a newer docutils than some
machines' other tools allow), so checking the package changes nothing in the environment it checks.

The venv reuses the already-installed dependencies (`--system-site-packages`) and gets only the wheel (`--no-deps`):
installing torch again would cost minutes and GBs and test PyPI, not this package. What that leaves unchecked is made
explicit instead: every `Requires-Dist` of the wheel must be satisfied by what the venv sees, and `netlite_nb` must be
imported from the venv's copy, not from the clone's editable install.
"""
import argparse, os, shutil, subprocess, sys, tarfile, tempfile, venv, zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / 'netlite_nb'

def data_files(root=PKG) -> list[str]:
    "Files under netlite_nb/ that are not Python sources, as wheel paths: what `package-data` has to ship."
    return sorted(str(p.relative_to(root.parent)).replace(os.sep, '/') for p in root.rglob('*')
                  if p.is_file() and p.suffix not in ('.py', '.pyc') and '__pycache__' not in p.parts)

def _bin(env_dir:Path, name:str) -> Path:
    return env_dir / ('Scripts' if os.name == 'nt' else 'bin') / (name + ('.exe' if os.name == 'nt' else ''))

def tools_python(env_dir:Path) -> Path:
    "A venv at `env_dir` with `build` and `twine`; its python."
    venv.create(env_dir, with_pip=True)
    subprocess.run([_bin(env_dir, 'python'), '-m', 'pip', 'install', '-q', '--disable-pip-version-check', 'build', 'twine'], check=True)
    return _bin(env_dir, 'python')

def build(outdir:Path, py=sys.executable) -> tuple[Path, Path]:
    "Build the sdist, then the wheel from it (as `python -m build` does); returns (sdist, wheel)."
    shutil.rmtree(outdir, ignore_errors=True)
    subprocess.run([py, '-m', 'build', '--outdir', str(outdir), str(ROOT)], check=True, stdout=subprocess.DEVNULL)
    return next(outdir.glob('*.tar.gz')), next(outdir.glob('*.whl'))

def missing_from(wheel:Path, sdist:Path|None=None) -> list[str]:
    "Package files (sources and data) that the wheel or the sdist lacks."
    want = data_files() + sorted(f"netlite_nb/{p.name}" for p in PKG.glob('*.py'))
    names = set(zipfile.ZipFile(wheel).namelist())
    gone = [f"wheel: {f}" for f in want if f not in names]
    if not any(n.endswith('.dist-info/entry_points.txt') for n in names): gone.append('wheel: entry_points.txt (the `netlite` command)')
    if sdist is not None:
        with tarfile.open(sdist) as t: snames = {n.split('/', 1)[1] for n in t.getnames() if '/' in n}
        gone += [f"sdist: {f}" for f in want + ['pyproject.toml', 'README.md', 'LICENSE'] if f not in snames]
    return gone

_SMOKE = r'''
import sys, importlib.metadata as md
from pathlib import Path
from packaging.requirements import Requirement
import netlite_nb
here = Path(netlite_nb.__file__).resolve()
assert Path(sys.prefix).resolve() in here.parents, f"netlite_nb was imported from {here}, not from the venv's wheel"
unmet = []
for r in map(Requirement, md.requires('netlite_nb') or []):
    if r.marker is not None and not r.marker.evaluate({'extra': ''}): continue
    try: v = md.version(r.name)
    except md.PackageNotFoundError: v = None
    if v is None or not r.specifier.contains(v, prereleases=True): unmet.append(f"{r} (found {v})")
assert not unmet, f"the wheel's requirements are not met: {unmet}"
from netlite_nb.strategies import load_strategy
from netlite_nb.probe import lookup_gpu
from netlite_nb.data import mnist_sample
s, g, (train, valid) = load_strategy('gtx_1050_ti'), lookup_gpu('NVIDIA GeForce GTX 1050 Ti'), mnist_sample()
print(f"netlite_nb from {here.parent}: strategy {s.name}, catalogue entry {g.name}, sample {train} + {len(valid)}; requirements met")
'''

def smoke(wheel:Path):
    "Install `wheel` alone into a fresh venv that sees the installed dependencies, then use it from there."
    with tempfile.TemporaryDirectory() as tmp:
        env_dir = Path(tmp) / 'venv'
        venv.create(env_dir, system_site_packages=True, with_pip=True)
        py = _bin(env_dir, 'python')
        subprocess.run([py, '-m', 'pip', 'install', '-q', '--no-deps', '--disable-pip-version-check', str(wheel)], check=True)
        # cwd outside the clone, so nothing can be imported from the working tree by accident
        subprocess.run([_bin(env_dir, 'netlite'), 'probe'], check=True, cwd=tmp)
        subprocess.run([py, '-c', _SMOKE], check=True, cwd=tmp)

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--outdir', default=str(ROOT / 'dist'))
    outdir = Path(ap.parse_args().outdir)
    with tempfile.TemporaryDirectory() as tmp:
        print('== build and twine in a venv of their own'); tools = tools_python(Path(tmp) / 'tools')
        print('== build the sdist and the wheel'); sdist, wheel = build(outdir, tools)
        print(f"   {sdist.name}, {wheel.name}")
        print('== twine check'); subprocess.run([tools, '-m', 'twine', 'check', '--strict', str(sdist), str(wheel)], check=True)
    print('== package files in both'); gone = missing_from(wheel, sdist)
    if gone: sys.exit('missing from the distributions:\n  ' + '\n  '.join(gone))
    print(f"   all {len(data_files())} data files and every module are in the wheel and the sdist")
    print('== the wheel installed in a fresh venv'); smoke(wheel)
