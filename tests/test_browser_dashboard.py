"""Chapter 08 as a reader sees it: a real JupyterLab, and a real Notebook 7, in headless Chromium run a training cell with
`LiveDashboard`.

Needs Debian's `chromium` (apt-get install -y chromium) and the `dev` extra (playwright, jupyterlab, notebook, ipykernel).
Playwright drives the system Chromium; `playwright install` is never needed. If the browser or the server cannot
start, the test fails and says why.
"""
import contextlib, json, os, re, secrets, shutil, signal, socket, subprocess, sys, tempfile, time, urllib.request
from pathlib import Path
import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / 'tests'
ARTIFACTS = TESTS / '_artifacts'
CHROMIUM = os.environ.get('NETLITE_CHROMIUM', '/usr/bin/chromium')
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update']

TRAIN_CELL = """\
import time
from torch import nn
from netlite_nb.data import mnist_sample_loaders
from netlite_nb.train import Trainer, Callback
from netlite_nb.live import LiveDashboard

class BiggerModelPace(Callback):
    "Pretend each step takes 50 ms more, as with a real model, so the run lasts long enough to watch."
    def after_step(self, t): time.sleep(0.05)

model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
dash = LiveDashboard(interval=0.3, max_overhead=0.5)   # the CI machine is slow and shared: allow frequent redraws
trainer = Trainer(model, mnist_sample_loaders(batch_size=64), callbacks=[dash, BiggerModelPace()], log_every=2, verbose=False)
trainer.fit(2)                                         # 126 steps: 6 s or more
print('TRAINING DONE', dash.redraws, 'redraws')"""


def _notebook()->dict:
    cells = [f"import sys\nsys.path.insert(0, {str(REPO)!r})", TRAIN_CELL]
    return {'cells': [{'cell_type': 'code', 'execution_count': None, 'metadata': {}, 'outputs': [], 'source': c} for c in cells],
            'metadata': {'kernelspec': {'display_name': 'Python 3', 'language': 'python', 'name': 'python3'}},
            'nbformat': 4, 'nbformat_minor': 5}


def _free_port()->int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _wait_for_server(url, proc, log, timeout=90):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            pytest.fail(f"The Jupyter server exited with code {proc.returncode} before answering:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200: return
        except OSError: time.sleep(0.5)
    pytest.fail(f"The Jupyter server did not answer {url} within {timeout} s:\n{log.read_text()[-3000:]}")


APPS = {  # the two frontends readers run notebooks in that we can start here (VS Code and Colab cannot be)
    'lab': dict(module='jupyterlab', url='/lab/tree/live.ipynb',
                args=['--LabApp.expose_app_in_browser=True', '--LabApp.news_url=', '--LabApp.extension_manager=readonly']),
    'notebook7': dict(module='notebook', url='/notebooks/live.ipynb',
                      args=['--JupyterNotebookApp.expose_app_in_browser=True']),
}


@contextlib.contextmanager
def serve(name:str, files:dict):
    "JupyterLab or Notebook 7 (`name` in APPS) on 127.0.0.1 with a token, a temporary root dir holding `files` (name -> notebook dict) and temporary settings; killed at the end."
    app = APPS[name]
    try: import jupyterlab, notebook, ipykernel, playwright  # noqa: F401
    except ImportError as e: pytest.fail(f"The browser test needs the dev extra (pip install -e '.[dev]'): {e}")
    root = Path(tempfile.mkdtemp(prefix='netlite_browser_'))
    for fn, nb in files.items(): (root / fn).write_text(json.dumps(nb))
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, 'PYTHONPATH': str(REPO), 'JUPYTER_CONFIG_DIR': str(root / '.cfg'), 'JUPYTER_RUNTIME_DIR': str(root / '.rt'),
           'JUPYTERLAB_SETTINGS_DIR': str(root / '.settings'), 'JUPYTERLAB_WORKSPACES_DIR': str(root / '.ws')}
    env.pop('MPLBACKEND', None)   # the kernel picks its own backend, as for a reader
    log = root / 'server.log'
    cmd = [sys.executable, '-m', app['module'], '--no-browser', '--ServerApp.ip=127.0.0.1', f'--ServerApp.port={port}',
           '--ServerApp.port_retries=0', f'--IdentityProvider.token={token}', f'--ServerApp.root_dir={root}', *app['args'],
           '--ServerApp.terminals_enabled=False', '--ServerApp.allow_root=True']  # CI containers run as root
    with open(log, 'w') as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_server(f'http://127.0.0.1:{port}/api/status?token={token}', proc, log)
        yield dict(url=f'http://127.0.0.1:{port}', token=token, root=root, log=log, name=name, path=app['url'])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)   # the server and the kernel it started, nothing else
            try: proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL); proc.wait(5)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=list(APPS))
def jupyter_server(request):
    "The training notebook (`live.ipynb`) served by JupyterLab, then by Notebook 7."
    with serve(request.param, {'live.ipynb': _notebook()}) as srv: yield srv


def _launch(p):
    if not Path(CHROMIUM).exists():
        pytest.fail(f"No Chromium at {CHROMIUM}: install Debian's package (apt-get install -y chromium) or set NETLITE_CHROMIUM.")
    try: return p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, timeout=60_000)
    except Exception as e: pytest.fail(f"Chromium ({CHROMIUM}) did not start: {e}")


def _open(page, srv, path, console):
    "Open the notebook at `path` and wait until its kernel is idle; fail, with a screenshot, if it does not come up."
    page.goto(f"{srv['url']}{path}?token={srv['token']}", timeout=90_000)
    try:
        page.wait_for_function("""() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
            return k && k.status === 'idle'; }""", timeout=120_000)
    except Exception as e:
        page.screenshot(path=str(ARTIFACTS / f"browser_{srv['name']}_{Path(path).stem}_failed.png"))
        pytest.fail(f"{srv['name']} did not open {path} with an idle kernel: {e}\nconsole: {console[-20:]}\n"
                    f"server log: {srv['log'].read_text()[-2000:]}")


def _outputs(page)->str:
    "The text of the notebook's cell outputs (not its source)."
    return page.evaluate("() => Array.from(document.querySelectorAll('.jp-OutputArea-output')).map(e => e.innerText).join('\\n')")


def test_dashboard_updates_in_a_real_browser(jupyter_server):
    from playwright.sync_api import sync_playwright
    srv = jupyter_server
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = _launch(p)
        try:
            page = browser.new_page(viewport={'width': 1280, 'height': 900})
            console = []
            page.on('console', lambda m: console.append(f'{m.type}: {m.text}'))
            _open(page, srv, srv['path'], console)
            # Not awaited: the command's promise resolves only when every cell has run.
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")

            # Watch the plot while the cell runs: every distinct src is a redraw the reader saw.
            srcs, t0 = [], time.time()
            while time.time() - t0 < 180:
                src = page.evaluate("() => { const i = document.querySelector('img.netlite-live-plot'); return i ? i.src : null; }")
                if src and (not srcs or srcs[-1] != src):
                    srcs.append(src)
                    if len(srcs) == 3: page.screenshot(path=str(ARTIFACTS / f"browser_dashboard_{srv['name']}_running.png"))
                out = _outputs(page)
                if 'TRAINING DONE' in out or 'Traceback' in out or 'Error' in out: break
                time.sleep(0.1)
            page.wait_for_timeout(500)
            page.evaluate("() => document.querySelector('.netlite-live') && document.querySelector('.netlite-live').scrollIntoView()")
            page.screenshot(path=str(ARTIFACTS / f"browser_dashboard_{srv['name']}.png"), full_page=True)
            out = _outputs(page)
            assert 'TRAINING DONE' in out, f"the training cell did not finish:\n{out[-3000:]}\nconsole: {console[-20:]}"
            assert page.locator('.netlite-live').count() == 1, 'exactly one dashboard per run'
            assert len(srcs) >= 4, f"the plot image changed only {len(srcs) - 1} times during the run (want >= 3)"
            mem = page.inner_text('.netlite-mem')
            m = re.search(r'memory ([\d.]+) (B|KiB|MiB|GiB)', mem)
            assert m and float(m[1]) > 0, f"the memory readout shows no memory: {mem!r}"
            head = page.inner_text('.netlite-live-header')
            assert 'cpu · fp32' in head and 'step 126/126' in head, head
            # The saved notebook carries a PNG of the final plots for viewers without widgets (GitHub, nbconvert).
            page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_timeout(1500)
            with urllib.request.urlopen(f"{srv['url']}/api/contents/live.ipynb?token={srv['token']}", timeout=10) as r:
                saved = json.load(r)['content']
            outputs = [o for o in saved['cells'][1]['outputs'] if o.get('output_type') == 'display_data']
            assert len(outputs) == 1, f"one display output per run, got {len(outputs)}"
            assert {'application/vnd.jupyter.widget-view+json', 'image/png'} <= set(outputs[0]['data'])
            print(f"{srv['name']}: plot changes seen: {len(srcs) - 1}; memory readout: {mem}")
        finally:
            browser.close()


RUN_ALL_CHAPTER = '08_live.ipynb'  # the chapter whose checks differ most between nbdev-test and a front end: widgets, the dashboard

def test_run_all_on_a_chapter_in_jupyterlab():
    "A reader's first act: open a chapter in JupyterLab and 'Run All'. Every cell runs and none leaves an error (tests/test_kernel_run.py runs every chapter in a kernel without a browser)."
    from playwright.sync_api import sync_playwright
    sys.path.insert(0, str(TESTS))
    from test_kernel_run import kernel_notebook  # the chapter with the cells nbdev-test skips (#| slow, #| gpu, #| notest) emptied
    nb = json.loads(__import__('nbformat').writes(kernel_notebook(REPO / 'nbs' / RUN_ALL_CHAPTER)))
    ARTIFACTS.mkdir(exist_ok=True)
    with serve('lab', {RUN_ALL_CHAPTER: nb}) as srv, sync_playwright() as p:
        browser = _launch(p)
        try:
            page, console = browser.new_page(viewport={'width': 1280, 'height': 900}), []
            page.on('console', lambda m: console.append(f'{m.type}: {m.text}'))
            _open(page, srv, f'/lab/tree/{RUN_ALL_CHAPTER}', console)
            t0 = time.time()
            # JupyterLab's command resolves when the last cell has run, or when a cell's error stops the run
            page.evaluate("async () => { await window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            page.wait_for_function("""() => { const w = window.jupyterapp.shell.currentWidget;
                return w.sessionContext.session.kernel.status === 'idle'; }""", timeout=60_000)
            seconds = time.time() - t0
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_timeout(1500)
            with urllib.request.urlopen(f"{srv['url']}/api/contents/{RUN_ALL_CHAPTER}?token={srv['token']}", timeout=10) as r:
                saved = json.load(r)['content']
        finally: browser.close()
    code = [(i, c) for i, c in enumerate(saved['cells']) if c['cell_type'] == 'code' and c['source'].strip()]
    errors = [(i, o) for i, c in code for o in c['outputs'] if o['output_type'] == 'error']
    assert not errors, (f"'Run All' of {RUN_ALL_CHAPTER} in JupyterLab stopped at cell {errors[0][0]}: "
                        f"{errors[0][1]['ename']}: {errors[0][1]['evalue']}\n" + re.sub(r'\x1b\[[0-9;]*m', '', '\n'.join(errors[0][1]['traceback'][-8:])))
    not_run = [i for i, c in code if c.get('execution_count') is None]
    assert not not_run, f"'Run All' of {RUN_ALL_CHAPTER} in JupyterLab left cells {not_run[:10]} unrun"
    print(f"Run All of {RUN_ALL_CHAPTER} in JupyterLab: {len(code)} cells in {seconds:.0f} s")
