"Chapter 08 checks outside the notebook: the widget mode as a frontend sees it, the display fallbacks, bounded memory (tracemalloc)."
import base64, gc, io, re, sys, tracemalloc, warnings
from pathlib import Path
import pytest
import matplotlib.pyplot as plt
import netlite_nb.live as live
from netlite_nb.live import LiveDashboard, plot_history, plot_memory
from netlite_nb.probe import frontend

sys.path.insert(0, str(Path(__file__).parent))
from live_fakes import GB, FakeClock, fake_reader, fake_trainer, run_steps, small_model, synthetic_data
from netlite_nb.train import Trainer, InjectOOM

PNG = b'\x89PNG\r\n\x1a\n'


class FakeHandle:
    def __init__(self): self.updates = []
    def update(self, obj, **kw): self.updates.append((obj, kw))


@pytest.fixture
def shown(monkeypatch):
    "Record what the dashboard displays, as if a Jupyter frontend were there."
    calls = []
    def fake_display(obj, **kw):
        calls.append((obj, kw))
        return FakeHandle() if kw.get('display_id') else None
    monkeypatch.setattr(live, '_display', fake_display)
    monkeypatch.setattr(live, 'frontend', lambda shell=None: 'widget')
    return calls


def test_no_ipython_means_text_mode():
    assert frontend() == 'text'     # pytest runs without an IPython shell
    d = LiveDashboard(reader=fake_reader(), clock=FakeClock())
    d.before_fit(fake_trainer())
    assert d.shown == 'text'        # 'auto' asks chapter 00's rule
    d.bar.close()


def test_widget_mode_updates_one_image_in_place(shown):
    clock, tr = FakeClock(), fake_trainer()
    d = LiveDashboard(mode='widget', clock=clock, reader=fake_reader())
    d.before_fit(tr)
    assert len(shown) == 1, 'one output per run'
    bundle, kw = shown[0]
    assert kw == {'raw': True, 'display_id': True}
    assert bundle['application/vnd.jupyter.widget-view+json']['model_id'] == d.widget.model_id
    assert 'image/png' not in bundle and 'cuda:0 · fp16' in bundle['text/plain']
    heads, images = [d.head.value], [d.image.value]
    for _ in range(20):
        run_steps(d, tr, 20, clock, dt=0.05)   # 1 s per 20 steps: at least one update each time
        heads.append(d.head.value); images.append(d.image.value)
    assert len(set(heads)) == 21     # the header line moves every second
    assert 20 <= d.redraws <= 40     # at most one update per 0.5 s of fake time
    # no picture until it and the final one (guessed at 0.1 s each) are 2 % of the run: 10 s; then one per second (free on the fake clock)
    assert all(v == images[0] for v in images[:10]) and d.renders >= 9
    assert len(set(images[11:])) == 10 and all(v[:8] == PNG for v in images)
    assert 'class="netlite-mem"' in d.head.value and 'memory 1.50 GiB (peak 1.60 GiB) of 4.00 GiB' in d.head.value
    d.after_fit(tr)
    assert 'step 400/1000' in d.head.value
    assert len(shown) == 1, 'no new output at the end either'
    (final, kw), = d.handle.updates
    assert kw == {'raw': True}
    png = base64.b64decode(final['image/png'])     # what nbconvert/papermill/GitHub show
    assert png[:8] == PNG and png == bytes(d.image.value)   # the widget and the saved notebook show the same final picture
    assert final['application/vnd.jupyter.widget-view+json'] == bundle['application/vnd.jupyter.widget-view+json']


def test_widget_mode_oom_report_shows_in_the_widget(shown):
    class Report:
        def _repr_html_(self): return '<b>CUDA out of memory</b> at step 10'
        def __str__(self): return 'CUDA out of memory at step 10'
    clock, tr = FakeClock(), fake_trainer()
    d = LiveDashboard(mode='widget', clock=clock, reader=fake_reader())
    d.before_fit(tr)
    run_steps(d, tr, 10, clock, dt=0.01)
    before = d.image.value
    d.on_oom(tr, Report())
    assert '<b>CUDA out of memory</b>' in d.oom_box.value
    assert d.image.value != before           # redrawn at once with the marker
    tr.micro_batch = 32
    run_steps(d, tr, 5, clock, dt=0.01)
    assert [e[1] for e in d.events] == ['oom', 'micro_batch'] and d.events[1][0] == 11


def test_static_mode_shows_one_png_at_the_end(shown):
    clock, tr = FakeClock(), fake_trainer()
    d = LiveDashboard(mode='static', clock=clock, reader=fake_reader())
    d.before_fit(tr)
    run_steps(d, tr, 300, clock, dt=0.05)
    assert shown == [] and d.fig is None     # nothing drawn while nobody watches
    d.after_fit(tr)
    (img, kw), = shown
    assert img.data[:8] == PNG and kw == {}


def test_display_returning_none_never_raises(monkeypatch):
    "Where display() gives no handle (no IPython, or an old frontend), every mode still completes."
    monkeypatch.setattr(live, '_display', lambda obj, **kw: None)
    for mode in ('widget', 'static', 'text', 'auto'):
        clock, tr = FakeClock(), fake_trainer()
        d = LiveDashboard(mode=mode, clock=clock, reader=fake_reader())
        d.before_fit(tr); run_steps(d, tr, 50, clock, dt=0.1); d.on_oom(tr, 'oom'); d.after_fit(tr)


def test_failing_memory_reader_does_not_stop_training():
    def broken(device): raise RuntimeError('driver went away')
    clock, tr = FakeClock(), fake_trainer()
    d = LiveDashboard(mode='static', clock=clock, reader=broken)
    d.before_fit(tr); run_steps(d, tr, 50, clock, dt=0.1); d.after_fit(tr)
    assert d.step == 50 and 'memory ?' in d.header(tr, html_=False)


def test_real_trainer_in_a_terminal_uses_its_bar_not_a_second_one(capsys):
    d = LiveDashboard(mode='text')
    tr = Trainer(small_model(), synthetic_data(), callbacks=[d], verbose=False)   # no IPython: the Trainer adds its ProgressBar
    tr.fit(2)
    out = capsys.readouterr()
    bars = [seg for seg in re.split(r'[\r\n]+', out.err) if '/48' in seg]
    assert d.bar is None and bars and all(b.startswith('train:') for b in bars), out.err   # one bar, the Trainer's
    assert 'cpu · fp32' in out.out and 'step 48/48' in out.out and 'samples/s' in out.out
    assert d.train.count == 5 and d.valid.count == 2 and d.reading.used > 0   # log_every=10: records at 10,20,30,40,48


def test_real_trainer_text_mode_bar_when_the_trainer_has_none(capsys):
    d = LiveDashboard(mode='text', interval=0.01)
    Trainer(small_model(), synthetic_data(), callbacks=[d], progress=False, verbose=False, log_every=1).fit(1)
    err = capsys.readouterr().err
    assert '24/24' in err and 'loss' in err and 'mem' in err, err


def test_real_trainer_widget_mode_with_oom_recovery(shown):
    # no time throttle (interval 0, unlimited overhead): every step may redraw, so the count cannot depend on this machine's speed
    d = LiveDashboard(interval=0.0, mode='widget', max_overhead=float('inf'))
    tr = Trainer(small_model(), synthetic_data(), callbacks=[d, InjectOOM([10])], progress=False, verbose=False, log_every=1)
    tr.fit(1)
    assert d.redraws >= 3 and d.reading.source == 'process RSS' and d.reading.used > 50 * 2**20
    assert 'memory 0 B' not in d.head.value and 'step 24/24' in d.head.value
    assert 'Out-of-memory report' in d.oom_box.value and 'micro-batch 64 -&gt; 32' in d.oom_box.value
    assert [(s, k) for s, k, _ in d.events] == [(10, 'oom'), (10, 'micro_batch')]
    assert len(shown) == 1


def test_no_pyplot_figures_left_open():
    n = len(plt.get_fignums())
    hist = Trainer(small_model(), synthetic_data(), progress=False, verbose=False, log_every=1).fit(1).history
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        for _ in range(21):   # pyplot warns when a 21st figure is opened
            plot_history(hist); plot_memory(hist, total=4 * GB)
            d = LiveDashboard(mode='static', reader=fake_reader())
            tr = fake_trainer(); d.before_fit(tr); run_steps(d, tr, 3); d.after_fit(tr)
    assert len(plt.get_fignums()) == n


def test_memory_is_bounded_after_100k_steps():
    "The dashboard's own memory after 100,000 steps is within 1 MB of after 1,000 (the trainer's history is not its memory)."
    clock, tr = FakeClock(), fake_trainer()
    d = LiveDashboard(mode='static', clock=clock, reader=fake_reader())
    gc.collect(); tracemalloc.start()
    try:
        d.before_fit(tr)
        run_steps(d, tr, 1_000, clock, dt=0.001)
        del tr.history[:-10]; d.seen = len(tr.history)
        gc.collect(); after_1k = tracemalloc.get_traced_memory()[0]
        for _ in range(99):
            run_steps(d, tr, 1_000, clock, dt=0.001)
            del tr.history[:-10]; d.seen = len(tr.history)
        gc.collect(); after_100k = tracemalloc.get_traced_memory()[0]
    finally: tracemalloc.stop()
    assert d.train.count == 100_000 and d.step == 100_000
    assert len(d.train) <= d.capacity + 1 and d.train.stride >= 128
    assert abs(after_100k - after_1k) < 2**20, (after_1k, after_100k)


def test_plot_memory_of_a_history_without_memory_records_is_an_empty_plot():
    fig = plot_memory([{'step': 1, 'loss': 1.0}, {'step': 2, 'loss': 0.5}])   # e.g. a history logged without readings
    ax = fig.axes[0]
    assert ax.get_title() == 'memory (GB)' and not ax.lines
    assert fig._repr_png_()[:8] == PNG


def test_in_a_notebook_fit_shows_the_dashboard_by_default_and_progress_false_turns_it_off(monkeypatch):
    import netlite_nb.train as train
    monkeypatch.setattr(train, 'in_notebook', lambda: True)   # chapter 00's rule, as a Jupyter kernel answers it
    kinds = lambda t: [type(c).__name__ for c in t.callbacks]
    assert kinds(Trainer(small_model(), synthetic_data(), device='cpu', verbose=False)) == ['LiveDashboard']
    assert kinds(Trainer(small_model(), synthetic_data(), progress=False, verbose=False)) == []
    assert kinds(Trainer(small_model(), synthetic_data(), callbacks=[LiveDashboard()], verbose=False)) == ['LiveDashboard']   # not twice
    monkeypatch.setattr(train, 'in_notebook', lambda: False)
    assert kinds(Trainer(small_model(), synthetic_data(), verbose=False)) == ['ProgressBar']   # a terminal: the bar


NOTEBOOK_CELLS = ["import sys; sys.path.insert(0, {tests!r})\nfrom live_fakes import small_model, synthetic_data\n"
                  "import netlite_nb.live\nfrom netlite_nb.train import Trainer",
                  "t = Trainer(small_model(), synthetic_data(), device='cpu', verbose=False, log_every=4).fit(2)",
                  "[type(c).__name__ for c in t.callbacks], t.step"]


def test_a_notebook_run_by_nbclient_keeps_the_dashboard_s_final_picture(tmp_path, monkeypatch):
    "A real kernel (nbclient, as nbconvert and papermill run one): the default view's output carries the final PNG and header."
    nbformat, nbclient = pytest.importorskip('nbformat'), pytest.importorskip('nbclient')
    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv('PYTHONPATH', str(root)); monkeypatch.setenv('OMP_NUM_THREADS', '1')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.format(tests=str(root / 'tests'))) for c in NOTEBOOK_CELLS])
    nbclient.NotebookClient(nb, timeout=300, kernel_name='python3', resources={'metadata': {'path': str(tmp_path)}}).execute()
    fit_out = nb.cells[1].outputs
    assert "(['LiveDashboard'], 48)" in nb.cells[2].outputs[0]['data']['text/plain']
    views = [o for o in fit_out if 'application/vnd.jupyter.widget-view+json' in o.get('data', {})]
    assert len(views) == 1, fit_out                                    # one output for the run, updated in place
    data = views[0]['data']
    assert base64.b64decode(data['image/png'])[:8] == PNG              # the final picture, for viewers without widgets
    assert 'step 48/48' in data['text/plain'] and 'cpu · fp32' in data['text/plain']


# --- issue 38: the views people look at after a run (chapter 08b) --------------------------------------------------------------

def _blob_run(run_dir, lr=3e-3, **kw):
    import torch
    from torch.utils.data import DataLoader
    from netlite_nb.fixtures import blobs, mlp
    ds = blobs(1024)
    tr, va = torch.utils.data.random_split(ds, [768, 256], generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    return Trainer(mlp(), (DataLoader(tr, 64, shuffle=True), DataLoader(va, 64)), lr=lr, run_dir=run_dir, seed=0, device='cpu',
                   progress=False, verbose=False, plan=False, **kw).fit(epochs=2)


def test_epoch_table_from_a_trainer_and_from_its_run_directory(tmp_path):
    from netlite_nb.views import epoch_table
    t = _blob_run(tmp_path / 'a', metrics=['f1'])
    tab = epoch_table(t)
    assert tab.columns == ['epoch', 'step', 'valid_loss', 'accuracy', 'f1', 'time'] and len(tab.rows) == 2
    assert epoch_table(tmp_path / 'a').rows == tab.rows and '<td>' in tab._repr_html_()
    assert str(tab).splitlines()[2].split()[0] == '2'


def test_results_table_prints_each_epoch_once_in_a_terminal(tmp_path, capsys):
    from netlite_nb.views import ResultsTable
    _blob_run(None, callbacks=[ResultsTable()])
    lines = [l for l in capsys.readouterr().out.splitlines() if l.strip()]
    assert lines[0].split()[:3] == ['epoch', 'step', 'valid_loss'] and [l.split()[0] for l in lines[1:]] == ['1', '2']


def test_confusion_matrix_and_top_losses_agree_with_a_hand_count(tmp_path):
    import torch, torch.nn.functional as F
    from netlite_nb.views import confusion_matrix, top_losses
    t = _blob_run(None)
    x = torch.cat([xb for xb, _ in t.valid_data]); y = torch.cat([yb for _, yb in t.valid_data])
    out = t.predict(x)
    cm = confusion_matrix(t)
    hand = torch.zeros(10, 10, dtype=torch.long)
    for a, b in zip(y.tolist(), out.argmax(1).tolist()): hand[a, b] += 1
    assert torch.equal(cm.counts, hand) and cm._repr_png_().startswith(PNG)
    top = top_losses(t, k=4)
    per = F.cross_entropy(out, y, reduction='none')
    assert top.index == per.argsort(descending=True)[:4].tolist() and top._repr_png_().startswith(PNG)


def test_compare_runs_draws_one_line_per_run_from_metrics_jsonl(tmp_path):
    from netlite_nb.views import compare_runs
    for lr in (1e-3, 1e-2): _blob_run(tmp_path / f"lr{lr:g}", lr=lr)
    fig = compare_runs(tmp_path / 'lr0.001', tmp_path / 'lr0.01', metric='accuracy')
    assert [l.get_label() for l in fig.axes[0].get_lines()] == ['lr0.001', 'lr0.01']
    assert all(len(l.get_xdata()) == 2 for l in fig.axes[0].get_lines())
    with pytest.raises(ValueError, match="None of the runs recorded 'val_acc'"): compare_runs(tmp_path / 'lr0.001', metric='val_acc')
