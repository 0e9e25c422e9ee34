"No exported cell of a chapter is over 60 lines: methods go one per cell with `@patch`, helpers beside what uses them (DESIGN.md, style)."
import json, re
from pathlib import Path
import pytest
ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 60


def long_export_cells(nb_path:Path, most:int=MAX_LINES)->list[str]:
    "Each `#| export` cell of `nb_path` longer than `most` lines: 'cell N: L lines, first line'."
    out = []
    for i, c in enumerate(json.loads(nb_path.read_text())['cells']):
        src = ''.join(c['source']); lines = src.splitlines()
        if c['cell_type'] == 'code' and re.match(r'\s*#\|\s*export\b', src) and len(lines) > most:
            out.append(f"cell {i}: {len(lines)} lines, {next((l for l in lines[1:] if l.strip()), '')[:70]!r}")
    return out


def test_the_check_sees_a_long_cell(tmp_path):
    cells = [{'cell_type': 'code', 'source': '#| export\n' + 'x = 1\n' * n, 'metadata': {}, 'outputs': []} for n in (59, 60)]
    cells.append({'cell_type': 'code', 'source': 'y = 2\n' * 80, 'metadata': {}, 'outputs': []})   # not exported: free to be long
    p = tmp_path / 'x.ipynb'; p.write_text(json.dumps({'cells': cells}))
    assert [f.split(':')[0] for f in long_export_cells(p)] == ['cell 1']


@pytest.mark.parametrize('nb', [pytest.param(p, id=p.name)
                                for p in sorted((ROOT / 'nbs').glob('[0-9]*.ipynb'))])
def test_no_exported_cell_is_over_60_lines(nb):
    long = long_export_cells(nb)
    assert not long, f"{nb.name}: split these into @patch methods or helpers of their own:\n" + '\n'.join(long)
