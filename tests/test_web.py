"""Chapter 09b's page in a real browser: for a short run of the demo's recipe (MNIST digits), a short run on a folder of colour
pictures and a vector model, the page is opened in Debian's headless Chromium (driven by Playwright, as
tests/test_browser_dashboard.py does) from disk and over HTTP, with the pinned CDN copy of ONNX Runtime Web and with a local
copy; 100 held-out inputs go through the page's own file input (or form), and what it displays must agree with ONNX Runtime
in Python. ONNX Runtime Web is installed from the npm registry at test time; without npm or the registry the tests skip and
say why. Chromium requests to anywhere but the page itself and the pinned CDN (answered from the npm package) are refused.
"""
import json, sys
from pathlib import Path
import numpy as np, pytest, torch
sys.path.insert(0, str(Path(__file__).parent))
import web_browser as wb
from netlite_nb.web import ORT_WEB_BYTES, ORT_WEB_CDN, ORT_WEB_FILES, ORT_WEB_VERSION, web_page
from netlite_nb.export import run_onnx

ARTIFACTS = Path(__file__).parent / '_artifacts' / 'web'


@pytest.fixture(scope='module')
def dist():
    try: return wb.ort_web_package(ORT_WEB_VERSION) / 'dist'
    except wb.Unavailable as e: pytest.skip(str(e))


@pytest.fixture(scope='module')
def browser():
    with wb.chromium() as b: yield b


@pytest.fixture(scope='module')
def demo_run(tmp_path_factory):
    "The demo's recipe for 30 optimizer steps, exported as INT8 + FP32 (chapter 10's `run_demo`)."
    from netlite_nb.run import run_demo
    return Path(run_demo(run_dir=tmp_path_factory.mktemp('web') / 'demo', steps=30, progress=False, verbose=False).run_dir)


@pytest.fixture(scope='module')
def colour_run(tmp_path_factory):
    "A run of netlite_tiny on a folder of colour pictures of assorted sizes (chapter 10's `train_from_config`), 12 steps, INT8."
    from netlite_nb.run import train_from_config
    d = tmp_path_factory.mktemp('web')
    root = wb.colour_folder(d / 'pictures')
    cfg = {'strategy': 'cpu', 'model': {'name': 'netlite_tiny'}, 'data': {'name': 'folder', 'root': str(root), 'batch_size': 32},
           'optim': {'name': 'adamw', 'lr': 0.003}, 'train': {'steps': 12, 'seed': 0}, 'export': {'onnx': True, 'quantize': 'int8'}}
    train_from_config(cfg, run_dir=d / 'run', progress=False, verbose=False)
    return d / 'run', root


def _record(name:str, r:dict):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.json").write_text(json.dumps({k: v for k, v in r.items() if k != 'inputs'}, indent=1))


def _assert_agrees(r:dict):
    assert r['remote_requests'] == [], f"The page asked for something beyond itself and the pinned CDN: {r['remote_requests']}"
    assert r['n'] == 100 and r['top1_agreement'] >= 99, r
    assert r['max_prob_diff'] <= 1e-3, r


def test_runtime_sizes_are_the_npm_packages(dist):
    "The sizes the page states are the files of the pinned package."
    for backend, files in ORT_WEB_FILES.items():
        assert ORT_WEB_BYTES[backend] == sum((dist / f).stat().st_size for f in files), backend


@pytest.mark.parametrize('opened,offline', [('file', False), ('http', True)])  # with the colour run's pair: each way of opening with each runtime
def test_demo_page_agrees_with_onnxruntime(browser, dist, demo_run, tmp_path, opened, offline):
    from PIL import Image
    from netlite_nb.data import mnist_sample
    page = web_page(demo_run, folder=tmp_path / 'web', offline=dist.parent if offline else None)
    assert page.precision == 'int8' and page.classes == [str(i) for i in range(10)]
    va = mnist_sample(raw=True)[1]
    idx = np.random.default_rng(0).permutation(len(va))[:100]  # held out: the sample's validation digits, every class
    files = []
    for i in idx:
        files.append(tmp_path / f"digit{i}.png"); Image.fromarray(va.x[i, 0].numpy(), 'L').save(files[-1])
    x = va.x[idx].float() / 255
    r = wb.check_page(browser, page, opened, dist, ORT_WEB_CDN, files, wb.softmax(run_onnx(page.model, x)),
                      screenshot=ARTIFACTS / 'netlite_tiny.png' if (opened, offline) == ('file', False) else None)
    _record(f"demo-{opened}-{'offline' if offline else 'cdn'}", r)
    _assert_agrees(r)
    np.testing.assert_array_equal(r['inputs'], x.reshape(100, -1).numpy())  # what the page fed the model is PyTorch's input


@pytest.mark.parametrize('opened,offline', [('http', False), ('file', True)])
def test_colour_page_resizes_as_pytorch_did(browser, dist, colour_run, tmp_path, opened, offline):
    "Pictures of 20 to 70 pixels a side, through the page's file input, become the exact tensors the run's loader made of them."
    from netlite_nb.data import image_folder
    run, root = colour_run
    page = web_page(run, folder=tmp_path / 'web', offline=dist.parent if offline else None)
    assert page.classes == ['blue', 'green', 'red'] and page.preprocess.channels == 3
    va = image_folder(root, seed=0)[1]  # the run's own held-out split
    files = [va.samples[i][0] for i in range(100)]
    x = torch.stack([va[i][0] for i in range(100)])
    r = wb.check_page(browser, page, opened, dist, ORT_WEB_CDN, files, wb.softmax(run_onnx(page.model, x)))
    _record(f"colour-{opened}-{'offline' if offline else 'cdn'}", r)
    _assert_agrees(r)
    np.testing.assert_array_equal(r['inputs'], x.reshape(100, -1).numpy())


def test_vector_page_form(browser, dist, tmp_path):
    "A vector model (chapter 06b's MLP on its blobs) through the page's form."
    from netlite_nb.fixtures import blobs, mlp
    from netlite_nb.export import export_onnx
    torch.manual_seed(0)
    ds = blobs(612, seed=1)
    model = mlp().eval()
    rep = export_onnx(model, ds.tensors[0][:64], tmp_path / 'blobs.onnx', measure_speed=False)
    page = web_page(rep.path, classes=[f"blob {i}" for i in range(10)])
    rows = ds.tensors[0][-100:].numpy()
    r = wb.check_page(browser, page, 'file', dist, ORT_WEB_CDN, rows, wb.softmax(run_onnx(rep.path, rows)))
    _assert_agrees(r)


def test_cli_export_web(demo_run, capsys):
    "`netlite export RUN --web` exports, then writes RUN/web/index.html carrying the file it exported; a wrong --offline stops before the export."
    import base64, shutil
    from netlite_nb.cli import main
    assert main(['export', str(demo_run), '--offline', '/nowhere', '--web']) != 0
    assert 'npm install onnxruntime-web@' in capsys.readouterr().err
    shutil.rmtree(demo_run / 'web', ignore_errors=True)
    assert main(['export', str(demo_run), '--fp16', '--web']) in (0, None)
    out = capsys.readouterr().out
    page = demo_run / 'web' / 'index.html'
    assert str(page) in out and page.is_file()
    cfg = json.loads(page.read_text().split('id="netlite-config">')[1].split('</script>')[0])
    assert base64.b64decode(cfg['model']['base64']) == (demo_run / 'onnx' / 'netlite_tiny.fp16.onnx').read_bytes()
    assert cfg['runtime']['base'] == ORT_WEB_CDN and cfg['classes'] == [str(i) for i in range(10)]


@pytest.mark.slow
def test_demo_page_on_webgpu(dist, demo_run, tmp_path):
    "The page's WebGPU path, on Chromium's software WebGPU (SwiftShader): minutes to load here, so `-m slow`."
    from PIL import Image
    from netlite_nb.data import mnist_sample
    page = web_page(demo_run, folder=tmp_path / 'web', precision='fp32')
    va = mnist_sample(raw=True)[1]
    files = []
    for i in range(20):
        files.append(tmp_path / f"digit{i}.png"); Image.fromarray(va.x[i, 0].numpy(), 'L').save(files[-1])
    with wb.chromium(wb.WEBGPU_ARGS) as b:
        r = wb.check_page(b, page, 'file', dist, ORT_WEB_CDN, files, wb.softmax(run_onnx(page.model, va.x[:20].float() / 255)))
    if r['backend'] != 'webgpu': pytest.skip("This Chromium gives the page no WebGPU adapter, even a software one.")
    assert r['remote_requests'] == [] and r['top1_agreement'] >= 99 and r['max_prob_diff'] <= 1e-3, r
