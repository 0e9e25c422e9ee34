"""What does watching cost? `Trainer.fit` with and without `LiveDashboard`, and the dashboard's memory over a long run.

1. Wall time of the same training run on the embedded MNIST sample (chapter 04), plain `Trainer.fit` vs with the
   dashboard in a headless notebook ('static': nbdev-test, nbconvert; the final picture is drawn as it would be there)
   and with a simulated frontend ('widget': every picture is rendered to PNG and set on the ipywidgets Image, exactly
   as in JupyterLab, minus the browser). Runs are interleaved and repeated; the table shows the median.
   Target: overhead <= 3 % of wall time.
2. The dashboard's own memory (tracemalloc) after 1,000 and after 100,000 simulated steps. Target: within 1 MB.

    python bench/dashboard_overhead.py [--epochs 24] [--repeats 3] [--threads 1]

   The default run (24 epochs, about 20 s on a 2-core CPU) is the length of the book's own training runs on the sample;
   every run also pays one final picture (0.1-0.25 s here), so runs of a few seconds see more than 3 % (try --epochs 4).
"""
import argparse, gc, os, statistics, sys, time, tracemalloc, types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault('MPLBACKEND', 'Agg')
import torch
from torch import nn
import netlite_nb.live as live
from netlite_nb.data import mnist_sample_loaders
from netlite_nb.live import LiveDashboard
from netlite_nb.probe import MemoryReading
from netlite_nb.train import Trainer


def cnn():
    return nn.Sequential(nn.Conv2d(1, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 5 * 5, 10))


class TimedDashboard(LiveDashboard):
    "LiveDashboard that adds up the wall time spent inside its own callbacks: the overhead without the run-to-run noise."
    inside = 0.0

def _timed(name):
    def hook(self, *args):
        t = time.perf_counter()
        try: return getattr(LiveDashboard, name)(self, *args)
        finally: self.inside += time.perf_counter() - t
    return hook

for _name in ('before_fit', 'after_batch', 'after_step', 'after_validate', 'after_epoch', 'on_oom', 'after_fit'):
    setattr(TimedDashboard, _name, _timed(_name))


class _Notebook:
    "Pretend to be a notebook kernel without a frontend (what nbconvert and nbdev-test are): the final picture is drawn, then dropped."
    def __enter__(self):
        self.saved = live.frontend, live._display
        live.frontend, live._display = (lambda shell=None: 'static'), (lambda *a, **k: None)
    def __exit__(self, *exc): live.frontend, live._display = self.saved


def fit_once(mode, epochs, dls):
    torch.manual_seed(0)
    cbs = [TimedDashboard(mode=mode)] if mode else []
    tr = Trainer(cnn(), dls, callbacks=cbs, progress=False, verbose=False, plan=False, log_every=1)
    with _Notebook():
        t = time.perf_counter()
        tr.fit(epochs)
        wall = time.perf_counter() - t
    d = cbs[0] if cbs else None
    return wall, tr.step, (d.renders if d else 0), (d.draw_seconds if d else 0.0), (d.inside if d else 0.0)


def overhead(epochs, repeats):
    dls = mnist_sample_loaders(batch_size=64)
    fit_once(None, 1, dls); fit_once('widget', 1, dls)  # warm-up: once-per-process costs (kernels, matplotlib's fonts) belong to nobody
    modes = [None, 'static', 'widget']
    res = {m: [] for m in modes}
    for _ in range(repeats):
        for m in modes: res[m].append(fit_once(m, epochs, dls))
    base = statistics.median(r[0] for r in res[None])
    print(f"\n1) Trainer.fit, {epochs} epochs of the MNIST sample (small CNN, batch 64, {res[None][0][1]} steps), "
          f"median of {repeats} interleaved runs, torch threads {torch.get_num_threads()}")
    print(f"{'run':<36}{'wall s':>8}{'overhead':>10}{'paired':>9}{'pictures':>9}{'drawing s':>10}{'in callback':>13}   all walls")
    names = {None: 'plain Trainer.fit (PyTorch loop)', 'static': '+ LiveDashboard, headless notebook', 'widget': '+ LiveDashboard, simulated frontend'}
    out = {}
    for m in modes:
        walls = [r[0] for r in res[m]]
        med = statistics.median(walls)
        pics, ds, inside = (statistics.median(r[i] for r in res[m]) for i in (2, 3, 4))
        paired = statistics.median(r[0] / p[0] - 1 for r, p in zip(res[m], res[None]))  # against the plain run of the same round
        share = statistics.median(r[4] / r[0] for r in res[m])
        out[m] = (med / base - 1, paired, share)
        cols = ('', '', '') if m is None else (f"{100 * (med / base - 1):+.1f} %", f"{100 * paired:+.1f} %", f"{inside:.3f} s {100 * share:.1f} %")
        print(f"{names[m]:<36}{med:>8.2f}{cols[0]:>10}{cols[1]:>9}{pics:>9.0f}{ds:>10.2f}{cols[2]:>16}   {', '.join(f'{w:.2f}' for w in walls)}")
    print("   overhead: medians' ratio; paired: median over rounds of (run / plain run of the same round); in callback: wall time "
          "spent inside the dashboard's own methods (drawing included), the part of the overhead that run-to-run noise cannot blur.")
    return out


def _reader(device):
    return MemoryReading('cuda:0', allocated=2**30, reserved=3 * 2**29, peak_allocated=2**30, peak_reserved=3 * 2**29, total=4 * 2**30)


def simulated_memory(mode):
    "tracemalloc of a dashboard fed 100,000 steps by a fake trainer (real clock; the trainer keeps only its last records)."
    tr = types.SimpleNamespace(history=[], device='cuda:0', precision='fp16', plan=types.SimpleNamespace(peak=2**30), micro_batch=64,
                               accum_steps=1, total_steps=100_000, step=0)
    d = LiveDashboard(mode=mode, reader=_reader)
    gc.collect(); tracemalloc.start()
    marks, t0 = {}, time.perf_counter()
    try:
        d.before_fit(tr)
        for s in range(1, 100_001):
            tr.step = s
            tr.history.append({'step': s, 'epoch': s // 1000, 'loss': 1 / s, 'lr': 1e-3, 'time': s * 1e-3, 'samples': 64 * s})
            d.after_batch(tr); d.after_step(tr)
            if len(tr.history) > 100: del tr.history[:-10]; d.seen = len(tr.history)   # the trainer's history is not the callback's memory
            if s in (1_000, 100_000):
                d._tick(tr, force=True)  # both marks right after a redraw: the figure and its PNG exist in both
                gc.collect(); marks[s] = tracemalloc.get_traced_memory()
        d.after_fit(tr)
    finally: tracemalloc.stop()
    return marks, time.perf_counter() - t0, d


def memory():
    print("\n2) The dashboard's memory (tracemalloc, bytes allocated by Python while it runs), simulated steps with a fake 4 GB GPU")
    print(f"{'mode':<10}{'after 1k':>12}{'after 100k':>12}{'diff':>10}{'peak 1k':>12}{'peak 100k':>12}{'rows kept':>11}{'stride':>8}{'redraws':>9}{'s':>7}")
    out = {}
    for mode in ('static', 'widget'):
        marks, secs, d = simulated_memory(mode)
        (c1, p1), (c2, p2) = marks[1_000], marks[100_000]
        out[mode] = c2 - c1
        print(f"{mode:<10}{c1:>12,}{c2:>12,}{c2 - c1:>+10,}{p1:>12,}{p2:>12,}{len(d.train):>11}{d.train.stride:>8}{d.redraws:>9}{secs:>7.1f}")
    return out


def unit_costs(steps=20_000):
    "What the overhead is made of: the callback's cost per step (no redraw) and the cost of one redraw, timed directly."
    tr = types.SimpleNamespace(history=[], device='cuda:0', precision='fp16', plan=None, micro_batch=64, accum_steps=1, total_steps=steps, step=0)
    d = LiveDashboard(mode='static', reader=_reader)
    d.before_fit(tr)
    t = time.perf_counter()
    for s in range(1, steps + 1):
        tr.step = s
        tr.history.append({'step': s, 'epoch': 0, 'loss': 1 / s, 'lr': 1e-3, 'time': s * 1e-3, 'samples': 64 * s})
        d.after_batch(tr); d.after_step(tr)
    per_step = (time.perf_counter() - t) / steps
    w = LiveDashboard(mode='widget', reader=_reader)
    w.before_fit(tr); w._ingest(tr)
    t = time.perf_counter(); w._redraw(tr); first = time.perf_counter() - t  # the first picture lays out every tick and label
    t = time.perf_counter()
    for _ in range(5): w._redraw(tr)
    per_redraw = (time.perf_counter() - t) / 5
    t = time.perf_counter()
    for _ in range(100): w._redraw(tr, plots=False)
    per_header = (time.perf_counter() - t) / 100
    print(f"\n3) Unit costs: the callback's bookkeeping {per_step * 1e6:.1f} µs per step (log record every step, memory read every "
          f"{d.interval / 5:.1f} s); one header update {per_header * 1e6:.0f} µs; one picture (draw + PNG + Image.value) "
          f"{first * 1e3:.0f} ms the first time, {per_redraw * 1e3:.0f} ms after. Pictures are budgeted to max_overhead="
          f"{100 * w.max_overhead:.0f} % of the wall time so far, plus the final one: overhead ~ per-step/step-time + "
          f"{100 * w.max_overhead:.0f} % + one picture per run.")
    return per_step, per_redraw


def thread_vs_inline(n_steps=100, pictures=3):
    "Would drawing in a background thread hide its cost? Time training steps alone, with pictures drawn alongside in a thread, and the pictures alone."
    import threading
    import torch.nn.functional as F
    tr = types.SimpleNamespace(history=[{'step': s, 'epoch': 0, 'loss': 1 / s, 'lr': 1e-3, 'time': s * 1e-3, 'samples': 64 * s} for s in range(1, 300)],
                               device='cpu', precision='fp32', plan=None, micro_batch=64, accum_steps=1, total_steps=600, step=300)
    d = LiveDashboard(mode='static'); d.before_fit(tr); d._ingest(tr); d._render(tr)
    model, x, y = cnn(), torch.rand(64, 1, 28, 28), torch.randint(0, 10, (64,))
    opt = torch.optim.AdamW(model.parameters())
    def steps():
        t = time.perf_counter()
        for _ in range(n_steps):
            loss = F.cross_entropy(model(x), y); opt.zero_grad(); loss.backward(); opt.step()
        return time.perf_counter() - t
    def steps_with_thread():
        th = threading.Thread(target=lambda: [d._render(tr) for _ in range(pictures)]); th.start()
        t = steps(); th.join(); return t
    steps()
    alone = statistics.median(steps() for _ in range(3))
    threaded = statistics.median(steps_with_thread() for _ in range(3))
    t = time.perf_counter()
    for _ in range(pictures): d._render(tr)
    inline = time.perf_counter() - t
    print(f"\n4) Drawing in a background thread: {n_steps} training steps {alone:.3f} s alone, {threaded:.3f} s with {pictures} pictures "
          f"drawn in a thread alongside (+{threaded - alone:.3f} s); the same pictures drawn inline cost {inline:.3f} s. matplotlib holds "
          f"the GIL while it draws, so a thread hides little or nothing of it.")


if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--epochs', type=int, default=24)
    ap.add_argument('--repeats', type=int, default=3)
    ap.add_argument('--threads', type=int, default=1, help='torch intra-op threads (1: stable timings on a shared machine)')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ov = overhead(a.epochs, a.repeats)
    diffs = memory()
    per_step, per_redraw = unit_costs()
    thread_vs_inline()
    print(f"\nverdict: wall overhead {100 * ov['static'][0]:+.1f} % headless notebook, {100 * ov['widget'][0]:+.1f} % simulated frontend "
          f"(paired {100 * ov['static'][1]:+.1f} %, {100 * ov['widget'][1]:+.1f} %; time inside the dashboard {100 * ov['static'][2]:.1f} %, "
          f"{100 * ov['widget'][2]:.1f} %); target <= 3 %: {'met' if max(ov['static'][0], ov['widget'][0]) <= 0.03 else 'NOT met'} by the medians, "
          f"{'met' if max(ov['static'][2], ov['widget'][2]) <= 0.03 else 'NOT met'} by the time inside; memory growth 1k->100k steps "
          + ', '.join(f"{m} {v / 2**20:+.3f} MB" for m, v in diffs.items())
          + f" (target within 1 MB: {'met' if all(abs(v) < 2**20 for v in diffs.values()) else 'NOT met'})")
