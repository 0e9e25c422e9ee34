"""Write README.md from nbs/index.ipynb.

`nbdev-readme` renders through Quarto, which cannot be installed from a package registry (its PyPI sdist downloads
the binary at build time), so this renders the same notebook directly: markdown cells as they are, code cells that are
not `#| hide` as Python blocks. `tests/test_readme.py` checks README.md is what this script makes.
"""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def render(nb_path=ROOT / 'nbs' / 'index.ipynb') -> str:
    nb = json.loads(Path(nb_path).read_text())
    out = []
    for c in nb['cells']:
        src = ''.join(c['source']).strip('\n')
        if c['cell_type'] == 'markdown': out.append(src)
        elif c['cell_type'] == 'code':
            lines = src.splitlines()
            if any(l.strip() == '#| hide' for l in lines): continue
            code = '\n'.join(l for l in lines if not l.startswith('#|'))
            if code.strip(): out.append(f"```python\n{code}\n```")
    return '<!-- Generated from nbs/index.ipynb by tools/readme.py: edit the notebook, not this file. -->\n\n' + '\n\n'.join(out) + '\n'

if __name__ == '__main__':
    (ROOT / 'README.md').write_text(render())
    print('wrote README.md', file=sys.stderr)
