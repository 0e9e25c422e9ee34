"""Write the README's Colab cell into every chapter, so all chapters install the library the same way.

    python tools/colab_cell.py            # rewrite each chapter's Colab cell from nbs/index.ipynb
    python tools/colab_cell.py --check    # exit 1 and name the chapters whose cell differs

The cell's one source is the ```python block under "**In Colab**" in nbs/index.ipynb (README.md quotes it from there).
In each chapter it is the first code cell after `#| default_exp`; only that cell's source is touched, so chapters that
other people are editing merge cleanly, and a merge conflict in that cell is resolved by running this script again.
"""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def readme_cell(index=ROOT / 'nbs' / 'index.ipynb') -> str:
    "The Colab cell as the README quotes it."
    text = '\n'.join(''.join(c['source']) for c in json.loads(Path(index).read_text())['cells'] if c['cell_type'] == 'markdown')
    m = re.search(r'\*\*In Colab\*\*.*?```python\n(.*?)\n```', text, re.S)
    if m is None: raise SystemExit(f"{index} has no ```python block under '**In Colab**': put the Colab cell back there first.")
    return m.group(1)

def chapters() -> list[Path]:
    return sorted((ROOT / 'nbs').glob('[0-9]*.ipynb'))

def colab_cell_index(nb:dict, path='notebook') -> int:
    "Index of the first code cell after the `#| default_exp` cell."
    cells = nb['cells']
    exp = next((i for i, c in enumerate(cells) if c['cell_type'] == 'code' and '#| default_exp' in ''.join(c['source'])), None)
    if exp is None: raise SystemExit(f"{path} has no `#| default_exp` cell, so it has no place for the Colab cell.")
    i = next((i for i in range(exp + 1, len(cells)) if cells[i]['cell_type'] == 'code'), None)
    if i is None or 'google.colab' not in ''.join(cells[i]['source']):
        raise SystemExit(f"{path}: the first code cell after `#| default_exp` is not the Colab cell; paste the README's cell there.")
    return i

def chapter_cell(path:Path) -> str:
    nb = json.loads(path.read_text())
    return ''.join(nb['cells'][colab_cell_index(nb, path)]['source'])

def write(path:Path, cell:str) -> bool:
    "Put `cell` into `path`; True when the file changed."
    nb = json.loads(path.read_text())
    c = nb['cells'][colab_cell_index(nb, path)]
    if ''.join(c['source']) == cell: return False
    c['source'] = cell.splitlines(keepends=True)
    path.write_text(json.dumps(nb, sort_keys=True, indent=1, ensure_ascii=False) + '\n')  # nbdev-clean's layout
    return True

if __name__ == '__main__':
    cell = readme_cell()
    if '--check' in sys.argv[1:]:
        stale = [p.name for p in chapters() if chapter_cell(p) != cell]
        if stale: sys.exit(f"Colab cell differs from the README's in: {', '.join(stale)}. Run `python tools/colab_cell.py`.")
        print(f"{len(chapters())} chapters carry the README's Colab cell")
    else:
        changed = [p.name for p in chapters() if write(p, cell)]
        print(f"rewrote the Colab cell in {len(changed)} chapter(s): {', '.join(changed) or 'none needed'}")
