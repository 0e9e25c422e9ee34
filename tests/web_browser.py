"""Chapter 09b's page in a real browser: ONNX Runtime Web from the npm registry, Debian's Chromium driven by Playwright (as
tests/test_browser_dashboard.py drives it), the page opened from disk and served over HTTP, held-out inputs fed through the
page's own file input or form. Shared by tests/test_web.py and bench/web.py."""
import contextlib, functools, http.server, json, os, shutil, subprocess, tempfile, threading, time
from pathlib import Path
import numpy as np

CHROMIUM = os.environ.get('NETLITE_CHROMIUM', '/usr/bin/chromium')
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update']
# WebGPU without a GPU: Chromium's software Vulkan (SwiftShader) gives the page an adapter, so its WebGPU path runs (slowly)
WEBGPU_ARGS = ['--headless', '--no-sandbox', '--disable-background-networking', '--disable-component-update', '--enable-unsafe-webgpu',
               '--enable-features=Vulkan', '--use-vulkan=swiftshader', '--use-webgpu-adapter=swiftshader', '--disable-vulkan-surface', '--use-angle=swiftshader']


class Unavailable(RuntimeError):
    "Something the browser check needs is not on this machine (npm, the npm registry, Chromium, Playwright)."


@functools.lru_cache(1)
def ort_web_package(version:str)->Path:
    "onnxruntime-web `version` installed from the npm registry into a temporary folder (once per process); its package folder."
    if shutil.which('npm') is None: raise Unavailable("npm is not installed (apt-get install -y npm): ONNX Runtime Web comes from the npm registry.")
    d = Path(tempfile.mkdtemp(prefix='netlite_ortweb_'))
    r = subprocess.run(['npm', 'install', '--no-audit', '--no-fund', '--ignore-scripts', '--prefix', str(d), f'onnxruntime-web@{version}'],
                       capture_output=True, text=True, timeout=600)
    if r.returncode: raise Unavailable(f"npm could not install onnxruntime-web@{version} (is the npm registry reachable?):\n{r.stderr[-1500:]}")
    return d / 'node_modules' / 'onnxruntime-web'


@contextlib.contextmanager
def served(folder:Path):
    "`folder` over HTTP on 127.0.0.1, as `python -m http.server` serves it; yields the base URL."
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a): pass
    handler = functools.partial(Quiet, directory=str(folder))
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True); t.start()
    try: yield f"http://127.0.0.1:{srv.server_address[1]}/"
    finally: srv.shutdown(); srv.server_close()


@contextlib.contextmanager
def chromium(args=CHROMIUM_ARGS):
    "A headless Debian Chromium under Playwright, started with `args`."
    try: from playwright.sync_api import sync_playwright
    except ImportError as e: raise Unavailable(f"Playwright is not installed (the dev extra: pip install -e '.[dev]'): {e}") from None
    if not Path(CHROMIUM).exists(): raise Unavailable(f"No Chromium at {CHROMIUM}: apt-get install -y chromium, or set NETLITE_CHROMIUM.")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args, timeout=60_000)
        try: yield browser
        finally: browser.close()


def open_page(browser, url:str, cdn:str, dist:Path, elsewhere:list):
    "Open the page at `url`; requests to the pinned `cdn` are answered from the npm package's `dist`, any other remote request is refused and listed in `elsewhere`."
    page = browser.new_page(viewport={'width': 900, 'height': 760})
    def route(r):
        u = r.request.url
        if u.startswith(cdn):
            f = dist / u[len(cdn):].split('?')[0]
            ctype = 'application/wasm' if f.suffix == '.wasm' else 'text/javascript'
            return r.fulfill(status=200, body=f.read_bytes(), headers={'Access-Control-Allow-Origin': '*', 'Content-Type': ctype})
        if u.startswith(('http://127.0.0.1', 'file:', 'data:', 'blob:')): return r.continue_()
        elsewhere.append(u); return r.abort()
    page.route('**/*', route)
    console = []
    page.on('console', lambda m: console.append(m.text))
    page.goto(url)
    page.wait_for_function("document.body.dataset.ready !== '0'", timeout=600_000)
    if page.evaluate("document.body.dataset.ready") != '1':
        raise AssertionError(f"The page did not start: {page.evaluate('window.netlite.error')}\nconsole: {console[-10:]}")
    return page


def shown(page)->list[tuple[str, float]]:
    "The classes and probabilities the page displays, top first."
    return page.eval_on_selector_all('#top tr', "rs => rs.map(r => [r.cells[0].textContent, parseFloat(r.cells[1].textContent)])")


def feed_files(page, files:list)->list:
    "Each picture file through the page's file input, one at a time; what the page displayed after each."
    out = []
    for i, f in enumerate(files):
        page.set_input_files('#file', str(f))
        page.wait_for_function("n => window.netlite.count > n", arg=i, timeout=60_000)
        out.append(shown(page))
    return out


def feed_vectors(page, rows)->list:
    "Each row of numbers through the page's form; what the page displayed after each."
    out = []
    for i, r in enumerate(rows):
        page.evaluate("v => window.netlite.setFeatures(v)", [repr(float(v)) for v in r])
        page.wait_for_function("n => window.netlite.count > n", arg=i, timeout=60_000)
        out.append(shown(page))
    return out


def compare(displayed:list, probs:np.ndarray, classes:list)->dict:
    "Top-1 agreement (%) and the largest |displayed − reference| probability over the displayed classes."
    agree, worst = 0, 0.0
    for rows, p in zip(displayed, probs):
        agree += rows[0][0] == classes[int(p.argmax())]
        worst = max(worst, max(abs(v - p[classes.index(c)]) for c, v in rows))
    return dict(n=len(displayed), top1_agreement=100 * agree / len(displayed), max_prob_diff=worst)


def softmax(z:np.ndarray)->np.ndarray:
    z = z.astype(np.float64); e = np.exp(z - z.max(1, keepdims=True)); return e / e.sum(1, keepdims=True)


COLOURS = {'red': (200, 40, 40), 'green': (40, 160, 60), 'blue': (40, 70, 200)}


def colour_folder(root:Path, per_class:int=170, seed:int=0)->Path:
    "An image folder of three classes (a red, green or blue shape on a noisy background) of assorted sizes, 20 to 70 pixels a side, as PNG."
    from PIL import Image, ImageDraw
    rng = np.random.default_rng(seed)
    for name, rgb in COLOURS.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = (int(v) for v in rng.integers(20, 71, 2))  # smaller and larger than 32: the page resizes both ways
            img = Image.fromarray(rng.integers(60, 200, (h, w, 3), dtype=np.uint8), 'RGB')
            x0, y0 = rng.integers(0, w // 3), rng.integers(0, h // 3)
            box = [int(x0), int(y0), int(x0 + w // 2 + rng.integers(0, w // 3)), int(y0 + h // 2 + rng.integers(0, h // 3))]
            fill = tuple(int(np.clip(c + rng.integers(-30, 31), 0, 255)) for c in rgb)
            (ImageDraw.Draw(img).ellipse if i % 2 else ImageDraw.Draw(img).rectangle)(box, fill=fill)
            img.save(root / name / f"{i:03d}.png")
    return root


def feed_files_inputs(page, files:list)->tuple[list, np.ndarray]:
    "As `feed_files`, and the model input the page computed for each picture."
    out, xs = [], []
    for i, f in enumerate(files):
        page.set_input_files('#file', str(f))
        page.wait_for_function("n => window.netlite.count > n", arg=i, timeout=60_000)
        out.append(shown(page)); xs.append(page.evaluate("Array.from(window.netlite.last.input)"))
    return out, np.array(xs, dtype=np.float32)


def check_page(browser, page, opened:str, dist:Path, cdn:str, inputs, reference:np.ndarray, screenshot:Path|None=None)->dict:
    """Open `page` (chapter 09b's `WebPage`) `opened` 'file' (from disk) or 'http' (served), feed it `inputs` (picture files, or rows
    of numbers for a vector model) through its own input path, and compare what it displays with `reference` (the probabilities
    ONNX Runtime in Python gives for the same inputs). Returns the comparison, the page's model inputs and its timings."""
    elsewhere = []
    with served(page.path.parent) as base:
        url = page.path.as_uri() if opened == 'file' else base + page.path.name
        p = open_page(browser, url, cdn, dist, elsewhere)
        if page.preprocess.kind == 'vector': shown_rows, xs = feed_vectors(p, inputs), None
        else: shown_rows, xs = feed_files_inputs(p, inputs)
        info = p.evaluate("({backend: window.netlite.backend, load_ms: window.netlite.load_ms, times: window.netlite.times, ua: navigator.userAgent})")
        if screenshot is not None: p.screenshot(path=str(screenshot))
        p.close()
    times = info['times'][1:]  # the first inference pays for warming up
    return dict(compare(shown_rows, reference, page.classes), opened=opened, offline=page.offline, precision=page.precision,
                backend=info['backend'], load_ms=info['load_ms'], median_ms=float(np.median(times)), p90_ms=float(np.percentile(times, 90)),
                user_agent=info['ua'], remote_requests=elsewhere, inputs=xs)
