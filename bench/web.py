"""Chapter 09b's page in headless Chromium: the demo's full run (8 epochs, INT8) and a run on a folder of colour pictures,
each page opened from disk and over HTTP with the pinned CDN runtime (answered from the npm package), 100 held-out inputs
fed through the page's own file input. Records what the browser measured — top-1 agreement with ONNX Runtime in Python,
the largest difference of the displayed probabilities, the time per inference (median and 90th percentile over 99, after
one warm-up) and the time to load the runtime and the model — as JSON in bench/results/web/, tagged with the machine,
Chromium, torch, commit and date, and a screenshot of the demo's page after a prediction (bench/results/web/netlite_tiny.png),
which chapter 09b renders. The checks are those of tests/test_web.py (tests/web_browser.py), on a fully trained model.

    python bench/web.py [--out bench/results/web] [--epochs 8]

Needs npm and the npm registry (ONNX Runtime Web is installed into a temporary folder), Debian's chromium and Playwright.
"""
import argparse, json, platform, re, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np, torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / 'bench'), str(ROOT / 'tests')]
import web_browser as wb
from budget_accuracy import machine, _git, _slug, save_result
from netlite_nb.web import ORT_WEB_CDN, ORT_WEB_VERSION, web_page
from netlite_nb.export import run_onnx
from netlite_nb.data import image_folder, mnist_sample
from netlite_nb.run import run_demo, train_from_config


def demo_case(d:Path, epochs:int):
    "The demo's run, its page and 100 held-out digits as PNG files with their reference probabilities."
    from PIL import Image
    r = run_demo(run_dir=d / 'demo', epochs=epochs, progress=False, verbose=False)
    page = web_page(r.run_dir, folder=d / 'demo-web')
    va = mnist_sample(raw=True)[1]
    idx = np.random.default_rng(0).permutation(len(va))[:100]
    files = []
    for i in idx:
        files.append(d / f"digit{i}.png"); Image.fromarray(va.x[i, 0].numpy(), 'L').save(files[-1])
    return page, files, wb.softmax(run_onnx(page.model, va.x[idx].float() / 255)), dict(run='demo', epochs=epochs, accuracy=r.accuracy)


def colour_case(d:Path, steps:int=60):
    "A run of netlite_tiny on a folder of colour pictures of assorted sizes, its page, and 100 of its held-out pictures."
    root = wb.colour_folder(d / 'pictures')
    cfg = {'strategy': 'cpu', 'model': {'name': 'netlite_tiny'}, 'data': {'name': 'folder', 'root': str(root), 'batch_size': 32},
           'optim': {'name': 'adamw', 'lr': 0.003}, 'train': {'steps': steps, 'seed': 0}, 'export': {'onnx': True, 'quantize': 'int8'}}
    t = train_from_config(cfg, run_dir=d / 'colour', progress=False, verbose=False)
    page = web_page(d / 'colour', folder=d / 'colour-web')
    va = image_folder(root, seed=0)[1]
    x = torch.stack([va[i][0] for i in range(100)])
    return page, [va.samples[i][0] for i in range(100)], wb.softmax(run_onnx(page.model, x)), dict(run='colour pictures', steps=steps,
                                                                                                   accuracy=t.last_metrics.get('accuracy'))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', type=Path, default=ROOT / 'bench' / 'results' / 'web'); ap.add_argument('--epochs', type=int, default=8)
    args = ap.parse_args()
    dist = wb.ort_web_package(ORT_WEB_VERSION) / 'dist'
    chromium = (re.findall(r'\d+(?:\.\d+)+', subprocess.run([wb.CHROMIUM, '--version'], capture_output=True, text=True).stdout) or ['?'])[0]
    d, cases, t0 = Path(tempfile.mkdtemp(prefix='netlite_web_bench_')), [], time.time()
    made = [demo_case(d, args.epochs), colour_case(d)]
    args.out.mkdir(parents=True, exist_ok=True)
    with wb.chromium() as b:
        for page, inputs, ref, about in made:
            for opened in ('file', 'http'):
                shot = args.out / 'netlite_tiny.png' if (about['run'] == 'demo' and opened == 'file') else None
                r = wb.check_page(b, page, opened, dist, ORT_WEB_CDN, inputs, ref, screenshot=shot)
                r.pop('inputs')
                cases.append({**about, **r})
                print(f"{about['run']} {opened}: top-1 agreement {r['top1_agreement']:.0f}%, max prob diff {r['max_prob_diff']:.1e}, "
                      f"{r['backend']} median {r['median_ms']:.2f} ms", file=sys.stderr)
    mach = machine()
    who = '-'.join(_slug(x) for x in (mach['cpu_vendor'] or '', mach['isa'], mach['cpu'].replace(mach['cpu_vendor'] or '', '')) if x)
    save_result(args.out / f"web.{who}.json", dict(
        bench='web', measured_on='chromium', machine=mach, chromium=chromium, onnxruntime_web=ORT_WEB_VERSION, torch=torch.__version__,
        python=platform.python_version(), date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), commit=_git('rev-parse', '--short=10', 'HEAD') or None,
        dirty=bool(_git('status', '--porcelain', '--untracked-files=no')), source='bench/web.py', seconds=time.time() - t0, cases=cases))
    for f in args.out.iterdir(): f.chmod(0o644)  # readable like the repository's other files (mkstemp makes 0600)


if __name__ == '__main__': main()
