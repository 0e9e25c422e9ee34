"""Every numbered chapter runs top to bottom in a real ipykernel, as "Run All" in Jupyter runs it.

`nbdev-test` runs the chapters in its own shell, which has no front end (`frontend()` is 'static'); a reader's kernel
(JupyterLab, Notebook 7, VS Code) is a `ZMQInteractiveShell` with a widget front end. A check that holds in one and not
the other stops the reader's "Run All", so each chapter also runs here through nbclient, with the cells `nbdev-test`
leaves out (`tst_flags` in pyproject.toml: `#| notest`, `#| slow`, `#| gpu`) blanked, in `nbs/` as working directory.

    pytest tests/test_kernel_run.py -q                     # every chapter, one test each, in WORKERS kernels at once
    python tests/test_kernel_run.py nbs/08_live.ipynb      # one chapter, printing each cell's time

NETLITE_KERNEL_CELL_TIMEOUT sets the seconds a cell may take (default 600, as `nbdev-test`'s), NETLITE_KERNEL_WORKERS how
many kernels run side by side (default one per core, at most 4).
"""
import json, os, re, sys, tempfile, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = ROOT / 'nbs'
CHAPTERS = sorted(p for p in NBS.glob('[0-9]*.ipynb'))
CELL_TIMEOUT = int(os.environ.get('NETLITE_KERNEL_CELL_TIMEOUT', '600'))

def skip_flags()->list[str]:
    "The flags whose cells `nbdev-test` leaves out by default."
    from nbdev.config import get_config
    return str(get_config(path=ROOT).get('tst_flags', '') or '').split()

def cells_to_run(nb_path:Path)->set[str]:
    "Ids of the cells `nbdev-test` would run in `nb_path` (its own rule: flags, `skip_exec`, `#| eval: false`)."
    from nbdev.test import nb_test_cells
    return {c.id for c in nb_test_cells(nb_path, skip_flags=skip_flags())}

def kernel_notebook(nb_path:Path):
    "`nb_path` as nbformat, with every code cell `nbdev-test` would skip emptied (kept, so cell numbers stay the file's)."
    import nbformat
    nb = nbformat.read(nb_path, as_version=4)
    run = cells_to_run(nb_path)
    for c in nb.cells:
        if c.cell_type == 'code' and c.get('id') not in run: c.source = ''
        if c.cell_type == 'code': c.outputs, c.execution_count = [], None
    return nb

_KERNELS = []

def _kernel_manager():
    "A manager for a `python3` kernel that is this interpreter (whatever `python` means on PATH), importing this checkout."
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager
    if not _KERNELS:
        d = Path(tempfile.mkdtemp(prefix='netlite-kernel-')) / 'python3'
        d.mkdir()
        (d / 'kernel.json').write_text(json.dumps({
            'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
            'display_name': 'Python 3 (netlite test)', 'language': 'python',
            # the chapters import the package of this checkout, as pytest's tests do
            'env': {'PYTHONPATH': os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))}}))
        _KERNELS.append(str(d.parent))
    return KernelManager(kernel_name='python3', kernel_spec_manager=KernelSpecManager(kernel_dirs=_KERNELS))

class ChapterFailed(AssertionError): pass

def run_in_kernel(nb_path:Path, timeout:int=CELL_TIMEOUT, on_cell=None)->list[tuple[int, float]]:
    "Execute `nb_path` in a fresh ipykernel, cwd `nbs/`; return (cell index, seconds) per run cell; raise `ChapterFailed` naming the cell."
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
    nb = kernel_notebook(nb_path)
    times, started = [], {}
    client = NotebookClient(nb, km=_kernel_manager(), timeout=timeout, resources={'metadata': {'path': str(nb_path.parent)}},
                            allow_errors=False, record_timing=False)
    client.on_cell_execute = lambda cell, cell_index: started.__setitem__('cell', (cell_index, time.perf_counter()))
    def _done(cell, cell_index, execute_reply=None, **kw):
        i, t0 = started['cell']
        times.append((i, time.perf_counter() - t0))
        if on_cell: on_cell(i, times[-1][1])
    client.on_cell_executed = _done
    try: client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as e:
        i = started.get('cell', (None,))[0]
        cell = nb.cells[i] if i is not None else None
        where = f"{nb_path.name} cell {i} (id {cell.get('id')}): {cell.source.strip().splitlines()[0][:100]!r}" if cell else nb_path.name
        raise ChapterFailed(f"'Run All' in a real kernel stops at {where}\n{type(e).__name__}: {_tail(str(e))}") from None
    return times

def _tail(text:str, n:int=40)->str:
    "The last `n` lines of an error's text, without IPython's colours: the traceback's end says what went wrong."
    lines = re.sub(r'\x1b\[[0-9;]*m', '', text).strip().splitlines()
    return '\n'.join(lines if len(lines) <= n else ['…'] + lines[-n:])

def _cores()->int:
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1

# kernels side by side, one per core as nbdev-test runs its notebooks (each kernel holds torch: about 1 GB)
WORKERS = int(os.environ.get('NETLITE_KERNEL_WORKERS') or min(_cores(), 4))

@pytest.fixture(scope='session')
def chapter_runs(request):
    "Every chapter this session tests, started in `WORKERS` kernels side by side; each chapter's test waits for its own run."
    from concurrent.futures import ThreadPoolExecutor
    wanted = [it.callspec.params['nb_path'] for it in request.session.items
              if getattr(it, 'originalname', None) == 'test_chapter_runs_in_a_kernel']
    with ThreadPoolExecutor(WORKERS) as pool:
        runs = {p: pool.submit(run_in_kernel, p) for p in wanted}
        yield runs
        for f in runs.values(): f.cancel()  # after -x or a ^C: the chapters not started yet never start

@pytest.mark.parametrize('nb_path', CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_in_a_kernel(nb_path, chapter_runs):
    chapter_runs[nb_path].result()

def test_a_failing_cell_is_named(tmp_path):
    "The failure names the chapter, the cell and the error, and a skipped (`#| slow`) cell does not run."
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell('x = 1'),
        nbformat.v4.new_code_cell('#| slow\nraise RuntimeError("a slow cell ran")'),
        nbformat.v4.new_code_cell('from netlite_nb.probe import frontend\nassert frontend() == "widget", frontend()'),
        nbformat.v4.new_code_cell('assert x == 2, "x is not 2"'),
        nbformat.v4.new_code_cell('raise RuntimeError("never reached")')])
    p = tmp_path / '99_demo.ipynb'
    nbformat.write(nb, p)
    with pytest.raises(ChapterFailed) as e: run_in_kernel(p, timeout=120)
    msg = str(e.value)
    assert "99_demo.ipynb cell 3" in msg and "'assert x == 2" in msg and 'x is not 2' in msg, msg
    assert 'slow cell ran' not in msg and 'never reached' not in msg and '\x1b[' not in msg, msg

if __name__ == '__main__':
    total = time.perf_counter()
    for a in sys.argv[1:] or map(str, CHAPTERS):
        t0 = time.perf_counter()
        try:
            times = run_in_kernel(Path(a).resolve(), on_cell=lambda i, s: s > 5 and print(f'  cell {i}: {s:.1f}s', flush=True))
            print(f'{Path(a).name}: ok, {time.perf_counter() - t0:.1f}s ({len(times)} cells)', flush=True)
        except ChapterFailed as e: print(f'{Path(a).name}: FAILED after {time.perf_counter() - t0:.1f}s\n{e}', flush=True)
    print(f'total {time.perf_counter() - total:.1f}s')
