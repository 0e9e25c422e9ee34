"Chapter 07 across chapters: exact resume (real SIGINT, augmented chapter 04 loaders, 8-bit optimizer), OOM recovery, checkpoints, CLI."
import os, signal, subprocess, sys, importlib.util
from pathlib import Path
import pytest, torch, yaml
from torch import nn
from torch.utils.data import DataLoader
import safetensors.torch as st
from netlite_nb.train import (Trainer, Callback, InjectOOM, SimulatedMemoryLimit, EarlyStopping, blobs, mlp, max_param_diff,
                              find_checkpoint, choose_precision, loader_generators, _accum_run)

ROOT = Path(__file__).resolve().parents[1]
has = lambda m: importlib.util.find_spec(f'netlite_nb.{m}') is not None
KW = dict(device='cpu', progress=False, verbose=False, plan=False)


def loaders(bs=64, n=1024):
    ds = blobs(n)
    tr, va = torch.utils.data.random_split(ds, [n - 256, 256], generator=torch.Generator().manual_seed(0))
    return DataLoader(tr, bs, shuffle=True), DataLoader(va, 256)


def losses(t): return [(r['step'], r['loss']) for r in t.history if 'loss' in r]


class Sigint(Callback):
    "Send this process a real SIGINT (what Ctrl-C and Jupyter's stop button do) after step `at`."
    def __init__(self, at): self.at = at
    def after_step(self, t):
        if t.step == self.at: os.kill(os.getpid(), signal.SIGINT)


def test_real_sigint_finishes_the_step_checkpoints_and_resumes_exactly(tmp_path):
    def make(cbs=()):
        torch.manual_seed(3)
        return Trainer(mlp(dropout=0.3), loaders(), lr=3e-3, ema=0.95, run_dir=tmp_path / 'cut', callbacks=cbs, log_every=1, **KW)
    torch.manual_seed(3)
    full = Trainer(mlp(dropout=0.3), loaders(), lr=3e-3, ema=0.95, run_dir=tmp_path / 'full', log_every=1, **KW).fit(epochs=3)
    cut = make([Sigint(17)]).fit(epochs=3)
    assert cut.interrupted and cut.step == 17          # the step in flight finished; no later step started
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is put back
    res = make().fit(epochs=3, resume=tmp_path / 'cut')
    assert losses(res) == losses(full) and res.step == full.step == 36
    assert all(torch.equal(p, q) for p, q in zip(res.model.parameters(), full.model.parameters()))
    assert all(torch.equal(p, q) for p, q in zip(res.ema.parameters(), full.ema.parameters()))


def test_checkpoint_files_are_safetensors_and_weights_only(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, ema=0.9, **KW).fit(steps=3)
    ck = find_checkpoint(tmp_path)
    assert ck.name == 'step-0000003' and (tmp_path / 'latest').read_text() == 'step-0000003'
    w = st.load_file(ck / 'model.safetensors')
    assert set(w) == set(t.model.state_dict()) and all(torch.equal(w[k], v) for k, v in t.model.state_dict().items())
    assert 'n_averaged' in st.load_file(ck / 'ema.safetensors')
    s = torch.load(ck / 'state.pt', weights_only=True)  # must not need pickled code
    assert s['step'] == 3 and s['samples'] == 192 and set(s['optimizer']) == {'state', 'param_groups'}
    assert {'python', 'numpy', 'torch'} <= set(s['rng']) and s['scheduler'] is not None
    cfg = yaml.safe_load((tmp_path / 'config.yaml').read_text())
    assert cfg['precision'] == 'fp32' and cfg['micro_batch'] == 64 and cfg['optimizer']['class'] == 'AdamW'


def test_previous_checkpoint_survives_a_write_that_dies(tmp_path, monkeypatch):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=2)
    def die(*a, **k): raise OSError('killed mid-write')
    monkeypatch.setattr(torch, 'save', die)
    with pytest.raises(OSError): t.fit(steps=2)
    monkeypatch.undo()
    assert find_checkpoint(tmp_path).name == 'step-0000002'
    assert any(p.name.startswith('.step-0000004.tmp') for p in tmp_path.iterdir())  # the half-written one is ignored
    t2 = Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=2, resume=tmp_path)
    assert t2.step == 2


class StepCounter(torch.optim.AdamW):
    "AdamW that records the gradient norm it is given (to check clipping) and how often it stepped."
    def __init__(self, params, lr=1e-3): super().__init__(params, lr=lr); self.norms = []
    def step(self, closure=None):
        gs = [p.grad for g in self.param_groups for p in g['params'] if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs])).item())
        return super().step(closure)


@pytest.mark.parametrize('inject', [dict(limit=10), dict(steps={1, 4, 9, 20}), dict(steps={2, 7}, cpu=True)])
def test_oom_recovery_keeps_every_update_and_sample(inject):
    def run(model, cbs=()):
        torch.manual_seed(0)
        return Trainer(model, loaders(bs=64), optimizer=StepCounter, callbacks=cbs, log_every=1, **KW).fit(epochs=2)
    torch.manual_seed(0); ok = run(mlp(dropout=0.2))
    torch.manual_seed(0); m = mlp(dropout=0.2)
    if 'limit' in inject: t = run(SimulatedMemoryLimit(m, inject['limit']))
    else: t = run(m, [InjectOOM(inject['steps'], cpu=inject.get('cpu', False))])
    assert (t.step, t.samples, t.total_steps) == (ok.step, ok.samples, ok.total_steps) == (24, 1536, 24)
    assert len(t.opt.norms) == len(ok.opt.norms) == 24                   # no optimizer step lost or repeated
    assert [s for s, _ in losses(t)] == list(range(1, 25))
    assert t.effective_batch == 64 and t.micro_batch * (t.accum_steps) == 64 and t.oom_reports
    # halved down to 8; a failure at 8 (halving would go below min_micro_batch) switches on checkpointing instead
    assert all(r.action.startswith('activation checkpointing' if r.micro_batch // 2 < 8 else 'micro-batch') for r in t.oom_reports)
    m2 = t.model.model if isinstance(t.model, SimulatedMemoryLimit) else t.model
    assert max_param_diff(ok.model, m2) < 1e-5                           # same data, same dropout masks


def bn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.3),
                         nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 10)).double()


def bn_run(cbs=(), run_dir=None, resume=None, optimizer=StepCounter, **kw):
    dl = DataLoader(blobs(256, dtype=torch.float64), 32, shuffle=True, generator=torch.Generator().manual_seed(0))
    return Trainer(bn_net(), dl, optimizer=optimizer, callbacks=cbs, run_dir=run_dir, log_every=1, **{**KW, **kw}).fit(epochs=2, resume=resume)


def state_equal(a, b): return list(a.state_dict()) == list(b.state_dict()) and all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.skipif(not has('layers'), reason='chapter 02 not merged')
def test_oom_below_min_micro_batch_checkpoints_and_changes_no_number():
    ok = bn_run(micro_batch=8)
    t = bn_run([InjectOOM({3})], micro_batch=8)
    assert (t.step, t.samples, len(t.opt.norms)) == (ok.step, ok.samples, len(ok.opt.norms)) == (16, 512, 16)
    assert (t.micro_batch, t.accum_steps, t.checkpointing) == (8, 4, True) and type(t.model).__name__ == 'CheckpointedSequential'
    assert t.oom_reports[0].action.startswith('activation checkpointing switched on') and 'micro-batch 8 × 4 kept' in t.oom_reports[0].action
    assert state_equal(ok.model, t.model)      # weights and BatchNorm running statistics: the same computation, bit for bit
    assert t.model[1].num_batches_tracked.item() == 16 * 4       # one update per micro-batch, none for the recomputation
    assert len(t.opt.state) == len(list(t.model.parameters())) and all(p in t.opt.state for p in t.model.parameters())


class OOMAfterTwoMicroBatches(Callback):
    "A real out-of-memory error's timing: raised after the second micro-batch's backward, when BatchNorm has already updated twice."
    def __init__(self, step): self.target, self.seen, self.fired = step, 0, False
    def after_backward(self, t):
        if t.step + 1 == self.target and not self.fired:
            self.seen += 1
            if self.seen == 2:
                self.fired = True
                raise torch.OutOfMemoryError("CUDA out of memory (injected after two micro-batches of the step)")


@pytest.mark.skipif(not has('layers'), reason='chapter 02 not merged')
def test_oom_mid_step_does_not_update_batchnorm_twice():
    ok = bn_run(micro_batch=8)
    t = bn_run([OOMAfterTwoMicroBatches(3)], micro_batch=8)
    assert t.oom_reports and t.oom_reports[0].action.startswith('activation checkpointing switched on')
    assert t.model[1].num_batches_tracked.item() == ok.model[1].num_batches_tracked.item() == 16 * 4   # not 16 * 4 + 2
    assert state_equal(ok.model, t.model)      # running means and variances too, bit for bit


def test_oom_report_does_not_move_the_loader_s_shuffle():
    "The report peeks at a training batch for its shapes; the loader's own generator must not advance, or epoch 2 reshuffles differently."
    def run(cbs=()):
        torch.manual_seed(0); m = mlp(dropout=0.0).double()
        dl = DataLoader(blobs(256, dtype=torch.float64), 32, shuffle=True, generator=torch.Generator().manual_seed(0))
        return Trainer(m, dl, callbacks=cbs, min_micro_batch=1, **KW).fit(epochs=2)
    ok, t = run(), run([InjectOOM({3})])
    assert t.micro_batch == 16 and max_param_diff(ok.model, t.model) < 1e-12


@pytest.mark.skipif(not has('layers'), reason='chapter 02 not merged')
def test_checkpointing_then_halving_with_8bit_state_kept():
    if not has('optim'): pytest.skip('chapter 03 not merged')
    # checkpoint at 8, then halve to 4: the 8-bit optimizer state survives both (same parameter objects)
    t = bn_run([InjectOOM({3, 6})], micro_batch=8, optimizer='adamw8bit')
    assert [r.action.split(' ')[0] for r in t.oom_reports] == ['activation', 'micro-batch']
    assert (t.step, t.micro_batch, t.accum_steps, t.checkpointing) == (16, 4, 8, True)
    assert type(t.opt).__name__ == 'AdamW8bit' and all(p in t.opt.state for p in t.model.parameters())


@pytest.mark.skipif(not has('layers'), reason='chapter 02 not merged')
def test_simulated_card_halves_then_checkpoints():
    def run(model): torch.manual_seed(0); return Trainer(model, loaders(bs=64), log_every=1, **KW).fit(epochs=1)
    torch.manual_seed(0); ok = run(mlp(dropout=0.2))
    torch.manual_seed(0); t = run(SimulatedMemoryLimit(mlp(dropout=0.2), 4, checkpointed_limit=16))
    assert [r.micro_batch for r in t.oom_reports] == [64, 32, 16, 8] and (t.micro_batch, t.accum_steps, t.checkpointing) == (8, 8, True)
    assert (t.step, t.samples) == (ok.step, ok.samples) and max_param_diff(ok.model, t.model.model) < 1e-5
    # a model with nothing to checkpoint keeps halving, as before
    lin = Trainer(SimulatedMemoryLimit(nn.Linear(20, 10), 4, checkpointed_limit=16), loaders(bs=64), **KW).fit(steps=2)
    assert (lin.micro_batch, lin.checkpointing) == (4, None)


@pytest.mark.skipif(not has('layers'), reason='chapter 02 not merged')
def test_micro_batch_one_checkpoints_before_it_stops():
    t = Trainer(mlp(), loaders(bs=4), micro_batch=1, callbacks=[InjectOOM({2, 4})], **KW)
    with pytest.raises(torch.OutOfMemoryError, match='micro-batch is already 1 and the model'): t.fit(steps=5)
    assert t.step == 3 and t.checkpointing is True and t.oom_reports[0].action.startswith('activation checkpointing')
    t = Trainer(nn.Linear(20, 10), loaders(bs=4), micro_batch=1, callbacks=[InjectOOM({2})], **KW)
    with pytest.raises(torch.OutOfMemoryError, match='no plain nn.Sequential'): t.fit(steps=3)


@pytest.mark.skipif(not has('layers'), reason='chapter 02 not merged')
def test_resume_after_the_switch_continues_checkpointed(tmp_path):
    full = bn_run([InjectOOM({3})], micro_batch=8, run_dir=tmp_path / 'full')
    assert yaml.safe_load((tmp_path / 'full' / 'config.yaml').read_text())['checkpointing'] is True   # rewritten after the switch
    bn_run([InjectOOM({3}), Sigint(9)], micro_batch=8, run_dir=tmp_path / 'cut')
    assert torch.load(find_checkpoint(tmp_path / 'cut') / 'state.pt', weights_only=True)['checkpointing'] is True
    res = bn_run(micro_batch=8, run_dir=tmp_path / 'cut', resume=tmp_path / 'cut')
    assert res.checkpointing is True and type(res.model).__name__ == 'CheckpointedSequential' and res.micro_batch == 8
    assert losses(res) == losses(full) and state_equal(res.model, full.model)


@pytest.mark.skipif(not (has('layers') and has('strategies')), reason='chapters 02 and 06 not merged')
def test_strategy_checkpointing_is_applied_and_planned_as_is():
    from netlite_nb.strategies import load_strategy
    s = load_strategy('cpu', checkpointing=2, micro_batch=64)
    t = Trainer(mlp(), loaders(), strategy=s, device='cpu', progress=False, verbose=False)
    assert t.checkpointing == 2 and type(t.model).__name__ == 'CheckpointedSequential' and t.model.k == 2
    t.fit(steps=2)
    if has('budget'): assert t.plan is not None and t.plan.checkpointing == 'on (in the model)'
    assert t.resolved_config()['checkpointing'] == 2


def test_oom_in_the_optimizer_step_is_not_retried():
    class OOMStep(torch.optim.AdamW):
        def step(self, closure=None): raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB (optimizer state)')
    t = Trainer(mlp(), loaders(), optimizer=OOMStep, **KW)
    with pytest.raises(torch.OutOfMemoryError, match='optimizer step itself'): t.fit(steps=2)
    assert t.step == 0


def test_fp16_clips_after_unscaling_and_checkpoints_the_scaler(tmp_path):
    t = Trainer(mlp(), loaders(), optimizer=StepCounter, precision='fp16', clip_grad=0.25, run_dir=tmp_path, **KW).fit(steps=6)
    assert t.precision.use_scaler and t.scaler.get_scale() > 1
    assert max(t.opt.norms) <= 0.25 + 1e-4, t.opt.norms   # the optimizer sees unscaled, clipped gradients
    s = torch.load(find_checkpoint(tmp_path) / 'state.pt', weights_only=True)
    assert s['scaler']['scale'] == t.scaler.get_scale()


def test_accumulation_matches_big_batch_with_partial_window():
    big, small = _accum_run(128, 1, steps=12), _accum_run(16, 8, steps=12)
    assert max_param_diff(big, small) <= 1e-10
    assert max_param_diff(_accum_run(64, 1, steps=12), _accum_run(16, 4, steps=12)) <= 1e-10


def test_micro_batch_and_accum_resolution():
    t = Trainer(mlp(), loaders(bs=128), micro_batch=32, **KW); t._resolve_sizes()
    assert (t.micro_batch, t.accum_steps, t.effective_batch) == (32, 4, 128)
    t = Trainer(mlp(), loaders(bs=16), accum_steps=8, **KW); t._resolve_sizes()
    assert (t.micro_batch, t.window, t.accum_steps, t.effective_batch) == (16, 8, 8, 128)


def test_precision_policy():
    assert choose_precision('cpu').name == 'fp32' and choose_precision('cpu', 'bf16').name == 'bf16'
    assert [choose_precision('cuda', cc=c).name for c in ('6.1', '7.0', '7.5', '8.0', '8.9', '9.0')] == ['fp32', 'fp16', 'fp16', 'bf16', 'bf16', 'bf16']
    assert 'Pascal' in choose_precision('cuda', cc='6.1').reason


def test_early_stopping_state_is_checkpointed(tmp_path):
    es = EarlyStopping(patience=2, min_delta=100.0)
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, callbacks=[es], **KW).fit(epochs=10)
    assert t.stop and t.epoch == 3
    es2 = EarlyStopping(patience=2); Trainer(mlp(), loaders(), run_dir=tmp_path, callbacks=[es2], **KW).load_checkpoint(tmp_path)
    assert (es2.best, es2.wait) == (es.best, es.wait)


def test_history_records_follow_the_contract():
    t = Trainer(mlp(), loaders(), log_every=2, **KW).fit(epochs=1)
    train = [r for r in t.history if 'loss' in r]; valid = [r for r in t.history if 'valid_loss' in r]
    assert [r['step'] for r in train] == [2, 4, 6, 8, 10, 12]
    for r in train: assert {'step', 'epoch', 'loss', 'lr', 'time', 'samples', 'mem', 'mem_peak'} <= set(r) and r['mem'] > 0
    assert valid and {'valid_loss', 'accuracy', 'step', 'epoch', 'time', 'mem', 'mem_peak'} <= set(valid[-1])


def test_tensorboard_logging(tmp_path):
    pytest.importorskip('tensorboard')
    Trainer(mlp(), loaders(), run_dir=tmp_path, tensorboard=True, **KW).fit(steps=20)
    assert list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))


@pytest.mark.skipif(not has('data'), reason='chapter 04 not merged')
def test_resume_exact_with_chapter04_augmented_tensor_loader(tmp_path):
    from netlite_nb.data import make_loaders, LabeledTensors
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(640, 1, 12, 12, generator=g), torch.randint(0, 10, (640,), generator=g)
    mk = lambda: make_loaders(LabeledTensors(x[:512], y[:512]), LabeledTensors(x[512:], y[512:]), batch_size=64, augment=True, seed=1)
    net = lambda: (torch.manual_seed(0), nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10)))[1]
    assert len(loader_generators(mk().train)) == 2     # the shuffle's and the augmentation's
    full = Trainer(net(), mk(), log_every=1, run_dir=tmp_path / 'a', **KW).fit(epochs=2)
    Trainer(net(), mk(), log_every=1, run_dir=tmp_path / 'b', callbacks=[Sigint(11)], **KW).fit(epochs=2)
    res = Trainer(net(), mk(), log_every=1, run_dir=tmp_path / 'b', **KW).fit(epochs=2, resume=tmp_path / 'b')
    assert losses(res) == losses(full)


@pytest.mark.skipif(not has('optim'), reason='chapter 03 not merged')
def test_resume_exact_with_8bit_optimizer_state(tmp_path):
    def make(d, cbs=()):
        torch.manual_seed(0)
        return Trainer(nn.Sequential(nn.Linear(20, 512), nn.ReLU(), nn.Linear(512, 10)), loaders(), optimizer='adamw8bit',
                       run_dir=tmp_path / d, callbacks=cbs, log_every=1, **KW)
    full = make('a').fit(epochs=2)
    make('b', [Sigint(5)]).fit(epochs=2)
    res = make('b').fit(epochs=2, resume=tmp_path / 'b')
    assert type(res.opt).__name__ == 'AdamW8bit' and losses(res) == losses(full)


def test_plan_from_chapter01_when_available():
    t = Trainer(mlp(), loaders(), device='cpu', progress=False, verbose=False).fit(steps=1)
    if has('budget'): assert t.plan is not None and t.plan.peak > 0 and 'activations' in t.plan.breakdown
    else: assert t.plan is None and any('chapter 01' in n for n in t.notes)


needs_demo = pytest.mark.skipif(not (has('data') and has('models') and has('strategies')), reason='chapters 04-06 not merged')


def netlite(*args, timeout=600):
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    return subprocess.run([sys.executable, '-c', 'import sys; from netlite_nb.cli import main; sys.exit(main(sys.argv[1:]))', *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


@needs_demo
def test_cli_demo_quick(tmp_path):
    r = netlite('demo', '--steps', '5', '--no-export', '--out', str(tmp_path / 'demo'))
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'Held-out accuracy' in r.stdout and find_checkpoint(tmp_path / 'demo').name == 'step-0000005'
    cfg = yaml.safe_load((tmp_path / 'demo' / 'config.yaml').read_text())
    assert cfg['run']['model']['name'] == 'netlite_tiny'


@needs_demo
def test_cli_train_config_and_resume(tmp_path):
    cfg = tmp_path / 'run.yaml'
    cfg.write_text('strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 128}\ntrain: {steps: 6, ema: 0.9}\n')
    r = netlite('train', str(cfg), '--set', 'optim.lr=0.002', '--out', str(tmp_path / 'run'))
    assert r.returncode == 0, r.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())
    assert saved['run']['optim']['lr'] == 0.002 and saved['run']['train']['steps'] == 6 and saved['effective_batch'] == 128
    r = netlite('train', str(cfg), '--set', 'train.steps=8', '--resume', str(tmp_path / 'run'))
    assert r.returncode == 0, r.stderr[-3000:]
    assert find_checkpoint(tmp_path / 'run').name == 'step-0000008'
    r = netlite('train', str(cfg), '--set', 'train.epoch=1')
    assert r.returncode != 0 and 'epochs' in r.stderr      # unknown keys name the closest valid one (chapter 06)


SMALL = ("strategy: {name: auto, device: cpu, precision: fp32, memory_gb: 0.0072, budget_fraction: 0.5}\n"
         "model: {name: mlp}\ndata: {name: mnist_sample, batch_size: 128}\ntrain: {steps: 2}\n")


@needs_demo
def test_cli_train_auto_sizes_the_batch_for_the_model(tmp_path):
    cfg = tmp_path / 'small.yaml'
    cfg.write_text(SMALL)
    r = netlite('train', str(cfg), '--quiet', '--out', str(tmp_path / 'run'))
    assert r.returncode == 0, r.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())
    s = saved['run']['strategy']
    assert s['micro_batch'] < 128 and s['micro_batch'] * s['accum_steps'] == 128 == saved['effective_batch']
    assert (saved['micro_batch'], saved['accum_steps']) == (s['micro_batch'], s['accum_steps']) and 'planner fits' in s['reason']
    r = netlite('train', str(cfg), '--quiet', '--set', 'train.steps=3', '--resume', str(tmp_path / 'run'))   # keeps the run's split
    assert r.returncode == 0, r.stderr[-3000:]
    again = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())
    assert (again['micro_batch'], again['accum_steps']) == (saved['micro_batch'], saved['accum_steps'])
    assert find_checkpoint(tmp_path / 'run').name == 'step-0000003'


@needs_demo
def test_train_from_config_sizes_only_what_the_file_left_open(tmp_path):
    from netlite_nb.train import train_from_config
    small = yaml.safe_load(SMALL)
    t = train_from_config(small, run_dir=tmp_path / 'a', progress=False, verbose=False)
    assert t.micro_batch < 128 and t.effective_batch == 128 and t.data.train.batch_size == t.micro_batch
    assert t.plan is t.strategy.plan and t.plan.fits and t.plan.total <= t.plan.budget
    roomy = train_from_config(small, ['strategy.memory_gb=1'], run_dir=tmp_path / 'b', progress=False, verbose=False)
    assert (roomy.micro_batch, roomy.accum_steps) == (128, 1)
    fixed = train_from_config(small, ['strategy.micro_batch=32'], run_dir=tmp_path / 'c', progress=False, verbose=False)
    assert (fixed.micro_batch, fixed.accum_steps) == (32, 4)
    named = train_from_config({**small, 'strategy': 'cpu'}, run_dir=tmp_path / 'd', progress=False, verbose=False)
    assert (named.micro_batch, named.accum_steps) == (128, 1)          # a named profile is taken as written


@needs_demo
@pytest.mark.slow
def test_demo_reaches_target_accuracy(tmp_path, request):
    from netlite_nb.train import run_demo
    r = run_demo(run_dir=tmp_path / 'demo', progress=False)
    print(r)
    assert r.accuracy >= 0.975, r


def test_run_description_names_the_schedule_it_uses():
    dl = DataLoader(blobs(64), 16)
    for schedule, said in (('cosine', 'warmup+cosine'), ('constant', 'warmup then constant')):
        t = Trainer(mlp(), dl, device='cpu', lr_schedule=schedule, progress=False, verbose=False, plan=False)
        t.fit(steps=2)
        d = t._describe()
        assert said in d and (schedule == 'cosine' or 'cosine' not in d), d
    with pytest.raises(ValueError, match="lr_schedule must be"):
        Trainer(mlp(), dl, device='cpu', lr_schedule='linear', progress=False, verbose=False, plan=False).fit(steps=1)
