"Chapter 07 across chapters: OOM recovery (halving, checkpointing, BatchNorm), strategy conversions and allocator settings, precision, accumulation, history."
import pytest, torch, yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import netlite_nb.train as train_module
from netlite_nb.train import Trainer, Callback, InjectOOM, SimulatedMemoryLimit, choose_precision
from netlite_nb.budget import plan_memory
from netlite_nb.layers import convert_model
from netlite_nb.strategies import load_strategy
from netlite_nb.checkpoint import find_checkpoint
from netlite_nb.fixtures import blobs, mlp, max_param_diff, accum_run
from train_helpers import KW, loaders, losses, Sigint, StepCounter


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


def test_checkpointing_then_halving_with_8bit_state_kept():
    # checkpoint at 8, then halve to 4: the 8-bit optimizer state survives both (same parameter objects)
    t = bn_run([InjectOOM({3, 6})], micro_batch=8, optimizer='adamw8bit')
    assert [r.action.split(' ')[0] for r in t.oom_reports] == ['activation', 'micro-batch']
    assert (t.step, t.micro_batch, t.accum_steps, t.checkpointing) == (16, 4, 8, True)
    assert type(t.opt).__name__ == 'AdamW8bit' and all(p in t.opt.state for p in t.model.parameters())


def test_simulated_card_halves_then_checkpoints():
    def run(model): torch.manual_seed(0); return Trainer(model, loaders(bs=64), log_every=1, **KW).fit(epochs=1)
    torch.manual_seed(0); ok = run(mlp(dropout=0.2))
    torch.manual_seed(0); t = run(SimulatedMemoryLimit(mlp(dropout=0.2), 4, checkpointed_limit=16))
    assert [r.micro_batch for r in t.oom_reports] == [64, 32, 16, 8] and (t.micro_batch, t.accum_steps, t.checkpointing) == (8, 8, True)
    assert (t.step, t.samples) == (ok.step, ok.samples) and max_param_diff(ok.model, t.model.model) < 1e-5
    # a model with nothing to checkpoint keeps halving, as before
    lin = Trainer(SimulatedMemoryLimit(nn.Linear(20, 10), 4, checkpointed_limit=16), loaders(bs=64), **KW).fit(steps=2)
    assert (lin.micro_batch, lin.checkpointing) == (4, None)


def test_micro_batch_one_checkpoints_before_it_stops():
    t = Trainer(mlp(), loaders(bs=4), micro_batch=1, callbacks=[InjectOOM({2, 4})], **KW)
    with pytest.raises(torch.OutOfMemoryError, match='micro-batch is already 1 and the model'): t.fit(steps=5)
    assert t.step == 3 and t.checkpointing is True and t.oom_reports[0].action.startswith('activation checkpointing')
    t = Trainer(nn.Linear(20, 10), loaders(bs=4), micro_batch=1, callbacks=[InjectOOM({2})], **KW)
    with pytest.raises(torch.OutOfMemoryError, match='no plain nn.Sequential'): t.fit(steps=3)


def test_resume_after_the_switch_continues_checkpointed(tmp_path):
    full = bn_run([InjectOOM({3})], micro_batch=8, run_dir=tmp_path / 'full')
    assert yaml.safe_load((tmp_path / 'full' / 'config.yaml').read_text())['checkpointing'] is True   # rewritten after the switch
    bn_run([InjectOOM({3}), Sigint(9)], micro_batch=8, run_dir=tmp_path / 'cut')
    assert torch.load(find_checkpoint(tmp_path / 'cut') / 'state.pt', weights_only=True)['checkpointing'] is True
    res = bn_run(micro_batch=8, run_dir=tmp_path / 'cut', resume=tmp_path / 'cut')
    assert res.checkpointing is True and type(res.model).__name__ == 'CheckpointedSequential' and res.micro_batch == 8
    assert losses(res) == losses(full) and state_equal(res.model, full.model)


def plan_of(model, batch=64, **kw):
    return plan_memory(model, (torch.empty(batch, 20, device='meta'), torch.empty(batch, dtype=torch.long, device='meta')),
                       loss_fn=nn.CrossEntropyLoss(), device_or_gpu='cpu', budget=2**40, **kw)


def test_strategy_checkpointing_is_applied_and_planned_as_is():
    s = load_strategy('cpu', checkpointing=2, micro_batch=64)
    t = Trainer(mlp(), loaders(), strategy=s, device='cpu', progress=False, verbose=False)
    assert t.checkpointing == 2 and type(t.model).__name__ == 'CheckpointedSequential' and t.model.k == 2
    t.fit(steps=2)
    # the plan traces the model the trainer runs: what a plan of convert_model's result says, less than the plain model's
    ck = plan_of(convert_model(mlp(), relu=False, ffn=False, dropout=False, checkpoint=2))
    assert t.plan is not None and t.plan.breakdown['activations'] == ck.breakdown['activations'] < plan_of(mlp()).breakdown['activations']
    assert t.plan.peak == plan_of(convert_model(mlp(), relu=False, ffn=False, dropout=False, checkpoint=2)).peak
    assert t.resolved_config()['checkpointing'] == 2


def ffn_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, 64), nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Linear(512, 64)), nn.ReLU(), nn.Linear(64, 10))


def test_strategy_chunk_size_is_applied_and_planned_the_same_way():
    s = load_strategy('cpu', chunk_size=16, micro_batch=64)
    t = Trainer(ffn_net(), loaders(), strategy=s, log_every=1, **KW).fit(steps=3)
    assert type(t.model[1]).__name__ == 'ChunkedFFN' and t.model[1].chunk_size == 16 and t.checkpointing is None
    # chunking changes how the FFN computes, not what: the same run with the plain model lands in the same place
    plain = Trainer(ffn_net(), loaders(), strategy=load_strategy('cpu', micro_batch=64), log_every=1, **KW).fit(steps=3)
    assert max_param_diff(plain.model, t.model) < 1e-5 and [l for _, l in losses(plain)] == pytest.approx([l for _, l in losses(t)], rel=1e-5)
    # planned as it runs (bf16: chapter 02's ChunkedFFN cannot be traced on the meta tensors of an fp32 plan yet)
    t = Trainer(ffn_net(), loaders(), strategy=load_strategy('cpu', chunk_size=16, micro_batch=64, precision='bf16'), **{**KW, 'plan': True}).fit(steps=1)
    chunked = plan_of(convert_model(ffn_net(), relu=False, ffn=True, dropout=False, chunk_size=16), precision='bf16')
    assert t.plan.peak == chunked.peak and t.plan.saved_activations == chunked.saved_activations < plan_of(ffn_net(), precision='bf16').saved_activations


def test_strategy_asking_for_both_gets_both_and_the_plan_traces_both():
    s = load_strategy('cpu', chunk_size=16, checkpointing=2, micro_batch=64, precision='bf16')
    t = Trainer(ffn_net(), loaders(), strategy=s, device='cpu', progress=False, verbose=False).fit(steps=1)
    assert type(t.model).__name__ == 'CheckpointedSequential' and type(t.model[1]).__name__ == 'ChunkedFFN' and t.checkpointing == 2
    both = plan_of(convert_model(ffn_net(), relu=False, ffn=True, dropout=False, chunk_size=16, checkpoint=2), precision='bf16')
    assert t.plan.peak == both.peak


def test_oom_checkpointing_is_planned_as_the_trainer_applied_it():
    t = Trainer(mlp(dropout=0.0), loaders(), micro_batch=8, callbacks=[InjectOOM({2})], device='cpu', progress=False, verbose=False).fit(steps=3)
    assert t.checkpointing is True
    plan, _, _ = t._plan_and_suggest(t.micro_batch)
    assert plan.peak == plan_of(convert_model(mlp(dropout=0.0), relu=False, ffn=False, dropout=False, checkpoint=True), micro_batch=8).peak
    assert t.oom_reports[0].plan.peak == plan_of(mlp(dropout=0.0), micro_batch=8).peak      # the report planned the model as it failed


def test_allocator_settings_are_applied_before_the_model_reaches_the_gpu(monkeypatch):
    "On any machine: the strategy's alloc_conf goes to chapter 06's `apply_allocator_settings` before the model's first `.to('cuda')`."
    events = []
    class Recorded(nn.Sequential):
        def to(self, *a, **k): events.append(('to', str(a[0]) if a else k)); return self   # stays on the CPU: no GPU needed
    monkeypatch.setattr(train_module, 'apply_allocator_settings', lambda s: events.append(('alloc', s.alloc_conf)) or 'applied')
    s = load_strategy('gtx_1050_ti', device='cuda', precision='fp32')
    t = Trainer(Recorded(nn.Linear(20, 10)), loaders(), strategy=s, progress=False, verbose=False, plan=False)
    assert events == [('alloc', 'expandable_segments:True'), ('to', 'cuda')] and 'applied' in t.notes
    events.clear()
    Trainer(Recorded(nn.Linear(20, 10)), loaders(), strategy=s, device='cpu', progress=False, verbose=False, plan=False)
    assert events == [('to', 'cpu')]                                  # a CPU run leaves the CUDA allocator alone


def test_trainer_methods_are_patched_not_exported():
    assert {'fit', 'validate', 'predict', 'accum_steps', 'save_checkpoint', 'load_checkpoint'}.isdisjoint(train_module.__all__)
    assert {'Trainer', 'TrainOptions', 'TrainState', 'Callback', 'choose_precision'} <= set(train_module.__all__)
    assert all(callable(getattr(Trainer, m)) for m in ('fit', 'validate', 'predict', 'save_checkpoint', 'load_checkpoint'))


def test_state_reads_and_writes_through_the_trainer():
    t = Trainer(mlp(), loaders(), **KW).fit(steps=2)
    assert (t.step, t.samples, t.history) == (t.state.step, t.state.samples, t.state.history) and t.step == 2
    t.micro_batch = 16
    assert t.state.micro_batch == 16 and 'micro_batch' not in vars(t) and t.accum_steps == 4
    with pytest.raises(TypeError, match='no_such_option'): Trainer(mlp(), loaders(), no_such_option=1)


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
    big, small = accum_run(128, 1, steps=12, trainer=Trainer), accum_run(16, 8, steps=12, trainer=Trainer)
    assert max_param_diff(big.model, small.model) <= 1e-10
    assert max_param_diff(accum_run(64, 1, steps=12, trainer=Trainer).model, accum_run(16, 4, steps=12, trainer=Trainer).model) <= 1e-10
    assert big.samples == small.samples


def test_micro_batch_and_accum_resolution():
    t = Trainer(mlp(), loaders(bs=128), micro_batch=32, **KW); t._resolve_sizes()
    assert (t.micro_batch, t.accum_steps, t.effective_batch) == (32, 4, 128)
    t = Trainer(mlp(), loaders(bs=16), accum_steps=8, **KW); t._resolve_sizes()
    assert (t.micro_batch, t.window, t.accum_steps, t.effective_batch) == (16, 8, 8, 128)


def test_precision_policy():
    assert choose_precision('cpu').name == 'fp32' and choose_precision('cpu', 'bf16').name == 'bf16'
    assert [choose_precision('cuda', cc=c).name for c in ('6.1', '7.0', '7.5', '8.0', '8.9', '9.0')] == ['fp32', 'fp16', 'fp16', 'bf16', 'bf16', 'bf16']
    assert 'Pascal' in choose_precision('cuda', cc='6.1').reason


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


def test_plan_from_chapter01():
    t = Trainer(mlp(), loaders(), device='cpu', progress=False, verbose=False).fit(steps=1)
    assert t.plan is not None and t.plan.peak > 0 and 'activations' in t.plan.breakdown and t.notes == []


def test_run_description_names_the_schedule_it_uses():
    dl = DataLoader(blobs(64), 16)
    for schedule, said in (('cosine', 'warmup+cosine'), ('constant', 'warmup then constant')):
        t = Trainer(mlp(), dl, device='cpu', lr_schedule=schedule, progress=False, verbose=False, plan=False)
        t.fit(steps=2)
        d = t._describe()
        assert said in d and (schedule == 'cosine' or 'cosine' not in d), d
    with pytest.raises(ValueError, match="lr_schedule must be"):
        Trainer(mlp(), dl, device='cpu', lr_schedule='linear', progress=False, verbose=False, plan=False).fit(steps=1)


# --- issue 14: lr_find, lr='auto', schedules, metrics, best checkpoint, metrics.jsonl -------------------------------------

import copy, json, math, random
import numpy as np
from netlite_nb.train import EarlyStopping, one_cycle
from netlite_nb.lr_find import LRFinder, range_test
from netlite_nb.checkpoint import loader_generators, rng_state


def _cpu(o):
    "Copies for comparison, made here rather than with the trainer's own `_cpu`: a copy that aliased would make the check pass."
    if torch.is_tensor(o): return o.detach().to('cpu', copy=True)
    if isinstance(o, dict): return {k: _cpu(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)): return type(o)(_cpu(v) for v in o)
    return copy.deepcopy(o)


def _same(a, b)->bool:
    if torch.is_tensor(a): return torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict): return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray): return np.array_equal(a, b)
    if hasattr(a, '__dataclass_fields__'): return _same(vars(a), vars(b))
    return a == b


def _everything(t):
    "Every piece of a trainer a trial of the optimizer could change, copied for comparison."
    return dict(model=_cpu(t.model.state_dict()), grads=[_cpu(p.grad) for p in t.model.parameters()], opt=_cpu(t.opt.state_dict()),
                sched=_cpu(t.scheduler.state_dict()), state=copy.deepcopy(t.state), rng=rng_state(), np=np.random.get_state()[1].copy(),
                py=random.getstate(), gens=[g.get_state() for g in loader_generators(t.train_data)], training=t.model.training)


def _bn_trainer(**kw):
    dl = DataLoader(blobs(256, dtype=torch.float64), 16, shuffle=True, generator=torch.Generator().manual_seed(3))
    return Trainer(bn_net(), dl, log_every=1, **{**KW, 'seed': 0, **kw})  # both trainers of a comparison seeded alike


def test_lr_find_leaves_the_trainer_bit_for_bit():
    "Weights, BatchNorm statistics, gradients, optimizer, scheduler, state, every generator and the loader's position: as they were."
    t, ref = _bn_trainer(), _bn_trainer()
    t.fit(steps=5); ref.fit(steps=5)                    # mid-epoch, with moments, a schedule and a shuffled order under way
    np.random.seed(7); random.seed(7); before = _everything(t)
    found = t.lr_find(num_steps=60)
    assert _same(_everything(t), before)
    assert isinstance(found, LRFinder) and len(found.lrs) == len(found.losses) == len(found.smoothed) >= 2
    t.fit(steps=12); ref.fit(steps=12)                  # the run goes on as if the sweep never happened
    assert losses(t) == losses(ref) and state_equal(t.model, ref.model)


def test_lr_find_sweep_without_the_restore_would_be_seen():
    "The comparison above can fail: the sweep itself moves every piece it checks."
    t = _bn_trainer(); t.fit(steps=5); before = _everything(t)
    range_test(t._lr_step(), 1e-6, 1, 10)
    after = _everything(t)
    for k in ('model', 'opt', 'gens'): assert not _same(after[k], before[k]), k


def test_lr_find_stops_on_divergence_and_suggests_by_its_rule():
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), optimizer='sgd', **KW)
    f = t.lr_find(end_lr=1e3)
    assert len(f.lrs) < 100 and ('passed 4×' in f.stopped or 'nan' in f.stopped)
    i = int(np.argmin(f.smoothed))
    steep = t.lr_find(end_lr=1e3, rule='steepest')
    assert steep.lrs == f.lrs and steep.suggestion <= f.lrs[i]       # the same sweep (state restored), read by another rule
    assert f.rule == 'steepest>=min/10' and f.suggestion == max(steep.suggestion, f.lrs[i] / 10)
    assert t.lr_find(end_lr=1e3, rule='min/10').suggestion == f.lrs[i] / 10
    png = f._repr_png_(); assert png[:8] == b'\x89PNG\r\n\x1a\n'
    with pytest.raises(ValueError, match='rule must be one of'): t.lr_find(rule='valley')



# --- lr_find after a steep fall (a new head on a pretrained network): the zero-lag smoothing --------------------------------

def _made_up_loss(lr, lowest, floor=0.5, start=25.0):
    "`start` falling to `floor` at lr `lowest`, then diverging: a parabola in log10(loss) against log10(lr), capped at `start` on the left."
    d = (np.log10(lr) - np.log10(lowest)) ** 2
    return floor * 10 ** np.where(np.asarray(lr) < lowest, np.minimum(d, np.log10(start / floor)), d)


def _curve_trainer(lowest, start, seed=0):
    "A trainer whose training loss is `_made_up_loss` at the rate the optimizer holds, times 10 % log-normal noise."
    noise, t = np.random.default_rng(seed), None
    def loss_fn(out, y):
        return out.sum() * 0 + float(_made_up_loss(t.opt.param_groups[0]['lr'], lowest, start=start) * np.exp(noise.normal(0, 0.1)))
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), loss_fn=loss_fn, **KW)
    return t


@pytest.mark.parametrize('lowest,start,num_steps,seed', [(1e-4, 25.0, 100, 0), (3e-3, 25.0, 100, 1), (3e-2, 200.0, 100, 2),
                                                         (0.3, 25.0, 100, 3), (1e-3, 25.0, 300, 4), (1e-2, 5.0, 40, 5)])
def test_lr_find_after_a_steep_fall_suggests_a_tenth_of_the_true_minimum(lowest, start, num_steps, seed):
    "A loss far above its floor that falls tenfold within a decade, then diverges: min/10 is a tenth of where it is lowest."
    from netlite_nb.lr_find import suggest_lr
    f = _curve_trainer(lowest, start, seed).lr_find(num_steps=num_steps, rule='min/10')
    step = 8 / (num_steps - 1)                            # decades between two rates of the sweep
    assert abs(np.log10(f.suggestion) - (np.log10(lowest) - 1)) <= max(step, 0.1) + 1e-9, f
    assert 'passed 4×' in f.stopped and f.losses[0] > 0.8 * start / 0.5 * min(f.losses)   # it fell first, and stopped on the rise
    default = suggest_lr(f.lrs, f.smoothed)               # the default rule on the same sweep: never below min/10, never above the minimum
    assert f.suggestion <= default <= 10 * f.suggestion


def test_smooth_losses_is_centred_and_scaled_in_decades():
    from netlite_nb.lr_find import smooth_losses
    for n in (50, 400):                                   # more steps per decade: the same curve, the same minimum
        lrs = np.geomspace(1e-7, 10, n)
        sm = smooth_losses(lrs, _made_up_loss(lrs, 1e-3))
        assert abs(np.log10(lrs[np.argmin(sm)]) + 3) <= 8 / (n - 1) + 1e-9
        fall = np.where(lrs < 1e-3, 10.0, 1.0)            # a tenfold step down at 1e-3: the smoothed curve is halfway (in log) there
        half = np.log10(lrs[np.argmin(abs(np.log(smooth_losses(lrs, fall)) - np.log(10) / 2))])
        assert abs(half + 3) <= 8 / (n - 1) + 1e-9
    with pytest.raises(ValueError, match='width > 0'): _curve_trainer(1e-2, 25.0).lr_find(width=0)


class _StopAt(Callback):
    def __init__(self, step): self.at = step
    def after_step(self, t):
        if t.step == self.at: raise KeyboardInterrupt


def test_lr_auto_trains_with_the_suggestion_records_it_and_resumes_with_it(tmp_path):
    def run(run_dir, lr='auto', cbs=(), resume=None):
        torch.manual_seed(0)
        return Trainer(mlp(), loaders(), lr=lr, run_dir=run_dir, callbacks=cbs, checkpoint_every=2, log_every=1, **KW).fit(epochs=1, resume=resume)
    auto = run(tmp_path / 'auto')
    sugg = auto.lr_found.suggestion
    assert losses(auto) == losses(run(None, lr=sugg))                    # exactly the run lr=<suggestion> gives
    cfg = yaml.safe_load((tmp_path / 'auto' / 'config.yaml').read_text())
    assert cfg['optimizer']['lr'] == cfg['lr_find']['suggestion'] == sugg and cfg['lr_find']['rule'].startswith('steepest>=min/10')
    run(tmp_path / 'cut', cbs=[_StopAt(5)])
    resumed = run(tmp_path / 'cut', resume=tmp_path / 'cut')
    assert resumed.lr_found is None and losses(resumed) == losses(auto)  # no second sweep: the checkpoint's rate goes on
    assert yaml.safe_load((tmp_path / 'cut' / 'config.yaml').read_text())['lr_find']['suggestion'] == sugg


def test_run_config_lr_auto(tmp_path):
    from netlite_nb.run import train_from_config
    from test_cli import SMALL
    t = train_from_config(yaml.safe_load(SMALL), ['optim.lr=auto'], run_dir=tmp_path / 'r', progress=False, verbose=False)
    cfg = yaml.safe_load((tmp_path / 'r' / 'config.yaml').read_text())
    assert cfg['run']['optim']['lr'] == 'auto' and cfg['lr_find']['suggestion'] == t.lr_found.suggestion == cfg['optimizer']['lr']


def _lrs(schedule, steps=30, lr=1e-2, built=None):
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), lr=lr, lr_schedule=schedule, log_every=1, **KW)
    if built is not None: t.opts.lr_schedule = built(t.opt)
    return [r['lr'] for r in t.fit(steps=steps).history if 'lr' in r]


def _torch_lrs(make, steps=30, lr=1e-2):
    opt = torch.optim.AdamW(mlp().parameters(), lr=lr); s = make(opt); out = []
    for _ in range(steps): opt.step(); s.step(); out.append(opt.param_groups[0]['lr'])
    return out


@pytest.mark.parametrize('kind', ['onecycle', 'callable', 'built'])
def test_schedules_one_cycle_callable_and_any_torch_scheduler(kind):
    if kind == 'onecycle': got, want = _lrs('onecycle'), _torch_lrs(lambda o: one_cycle(o, 30, 1))   # warmup 5 % of 30 steps: 1
    elif kind == 'callable': got, want = _lrs(lambda opt, n: torch.optim.lr_scheduler.StepLR(opt, n // 3, 0.5)), _torch_lrs(lambda o: torch.optim.lr_scheduler.StepLR(o, 10, 0.5))
    else: got, want = _lrs(None, built=lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.8)), _torch_lrs(lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.8))
    assert got == pytest.approx(want, rel=1e-12)
    assert got != pytest.approx(_lrs('cosine'), rel=1e-3)             # not the default schedule under another name


def test_metrics_option_is_recorded_in_the_history():
    def top3(out, y): return (out.topk(3, 1).indices == y[:, None]).any(1).float().mean()
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), metrics=[top3], **KW).fit(epochs=2)
    vals = [r for r in t.history if 'valid_loss' in r]
    assert len(vals) == 2 and all(1 >= r['top3'] >= r['accuracy'] for r in vals)
    t2 = Trainer(mlp(), loaders(), metrics={'always_one': lambda out, y: 1.0}, **KW)
    assert t2.validate()['always_one'] == 1.0
    with pytest.raises(ValueError, match='named functions'): Trainer(mlp(), loaders(), metrics=[lambda o, y: 0.0], **KW)


class _Scores:
    "A validation metric whose value per validation is set in advance: decides which step is best without depending on training."
    def __init__(self, values): self.values, self.calls, self.__name__ = list(values), 0, 'score'
    def __call__(self, out, y): return self.values[min(self.calls, len(self.values) - 1)]
class _NextScore(Callback):
    def __init__(self, scores): self.scores = scores
    def after_validate(self, t): self.scores.calls += 1


def test_best_checkpoint_beside_the_latest_and_restore_best(tmp_path):
    scores = _Scores([0.1, 0.5, 0.3, 0.2, 0.25, 0.05])   # higher is better (not a loss): the best is the 2nd validation
    es, snaps = EarlyStopping(monitor='score', patience=3, restore_best=True), {}
    class Keep(Callback):
        order = 60
        def after_validate(self, t): snaps[t.step] = {k: v.clone() for k, v in t.model.state_dict().items()}
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), metrics=[scores], monitor='score', run_dir=tmp_path, callbacks=[_NextScore(scores), es, Keep()], **KW)
    t.fit(epochs=10)
    steps = sorted(snaps)
    assert t.epoch == 5 and t.stop                                    # 3 validations without improvement after the 2nd
    assert t.best == {'step': steps[1], 'score': 0.5}
    best = find_checkpoint(tmp_path / 'best'); latest = find_checkpoint(tmp_path)
    assert best.name == f"step-{steps[1]:07d}" and latest.name == f"step-{t.step:07d}" and best != latest
    from safetensors.torch import load_file
    on_disk = load_file(best / 'model.safetensors')
    assert all(torch.equal(on_disk[k], v) for k, v in snaps[steps[1]].items())
    assert all(torch.equal(v, snaps[steps[1]][k]) for k, v in t.model.state_dict().items())        # restore_best
    assert not all(torch.equal(v, snaps[steps[-1]][k]) for k, v in snaps[steps[1]].items())       # and that is not the last


def test_metrics_jsonl_is_written_as_the_run_goes(tmp_path):
    seen = []
    class Read(Callback):
        def after_step(self, t):
            lines = (tmp_path / 'metrics.jsonl').read_text().splitlines()
            seen.append([json.loads(l) for l in lines])
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, log_every=1, callbacks=[Read()], **KW).fit(steps=6)   # no checkpoint before the end
    assert [len(s) for s in seen] == [1, 2, 3, 4, 5, 6]
    assert seen[-1] == t.history[:6] and [r['step'] for r in seen[-1]] == list(range(1, 7))
def test_a_short_run_of_a_batchnorm_convnet_does_not_collapse_to_chance():
    "Issue 14: after a few steps eval-mode BatchNorm statistics still held the initial variance 1, and accuracy was 10.00 %."
    from torch.utils.data import Subset
    from netlite_nb.models import create_model
    from netlite_nb.data import mnist_sample_loaders
    torch.manual_seed(0)
    dls = mnist_sample_loaders(batch_size=32)
    valid = DataLoader(Subset(dls.valid.dataset, range(320)), 160)
    t = Trainer(create_model('netlite_tiny', num_classes=10), (dls.train, valid), **KW).fit(steps=15)
    evaluated = t.history[-1]
    t.model.train()      # the same weights, normalised with each batch's own statistics
    with torch.no_grad(): batch_stats = sum((t.model(x).argmax(1) == y).sum().item() for x, y in valid) / 320
    assert batch_stats > 0.15                                   # the weights have learned something ...
    assert evaluated['accuracy'] > 0.8 * batch_stats, (evaluated, batch_stats)   # ... and evaluation sees it
    assert evaluated['valid_loss'] < 2.302                      # better than guessing among 10 classes (ln 10)


def test_batchnorm_warmup_averages_the_first_batches_evenly_and_resumes_bit_for_bit(tmp_path):
    t = bn_run(micro_batch=8)
    assert t.model[1].momentum == 0.1                           # its own momentum back after the warm-up
    # the first BatchNorm sees the raw inputs: its running mean after k < 10 micro-batches is their plain mean
    dl = DataLoader(blobs(256, dtype=torch.float64), 8, shuffle=False)
    one = Trainer(nn.Sequential(nn.BatchNorm1d(20), nn.Linear(20, 10)).double(), dl, **KW).fit(steps=6)
    means = torch.stack([x.mean(0) for _, (x, _) in zip(range(6), dl)])
    assert torch.allclose(one.model[0].running_mean, means.mean(0), atol=1e-12)
    full = bn_run(micro_batch=8, run_dir=tmp_path / 'full')
    bn_run([Sigint(1)], micro_batch=8, run_dir=tmp_path / 'cut')       # stopped inside the warm-up (micro-batch 4 of 10)
    res = bn_run(micro_batch=8, run_dir=tmp_path / 'cut', resume=tmp_path / 'cut')
    assert losses(res) == losses(full) and state_equal(res.model, full.model)


def bn_fit(**kw):
    "bn_net trained 3 epochs on the blobs, validating after each (the running-statistics check runs every time)."
    x, y = blobs(768, dtype=torch.float64).tensors
    dl = DataLoader(TensorDataset(x[:512], y[:512]), 32, shuffle=True, generator=torch.Generator().manual_seed(0))
    valid = [(x[i:i + 64], y[i:i + 64]) for i in range(512, 768, 64)]  # a list: iterating a DataLoader draws from torch's generator
    torch.manual_seed(0)
    return Trainer(bn_net(), (dl, valid), lr=3e-3, **{**KW, **kw}).fit(epochs=3)


def spoil_statistics(model):
    "Running statistics of some other data: each mean moved by 3 × a normal draw, each variance 10× too small."
    g = torch.Generator().manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d): m.running_mean += 3 * torch.randn(m.running_mean.shape, generator=g, dtype=m.running_mean.dtype); m.running_var /= 10


def test_running_stats_check_warns_once_on_stale_statistics_and_changes_nothing(recwarn):
    import math, random, numpy as np
    t = bn_fit()
    checks = [r['norm_check'] for r in t.history if 'valid_loss' in r]
    assert len(checks) == 3 and not [r for r in t.history if 'warning' in r] and not recwarn.list      # trained: silent
    assert checks[-1]['eval_loss'] < math.log(10) and checks[-1]['batch_stats_loss'] < math.log(10)
    spoil_statistics(t.model)
    sd = {k: v.clone() for k, v in t.model.state_dict().items()}
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())
    modes, momenta = [m.training for m in t.model.modules()], [m.momentum for m in t.model.modules() if isinstance(m, nn.BatchNorm1d)]
    with pytest.warns(UserWarning, match='worse than guessing among 10 classes') as w:
        t.validate(t.valid_data); t.validate(t.valid_data)
    assert len([x for x in w if 'Evaluation mode disagrees' in str(x.message)]) == 1                   # once per trainer
    assert 'update_bn' in t.history[-2]['warning'] and 'warning' not in t.history[-1]
    c = t.history[-2]['norm_check']
    assert c['eval_loss'] > math.log(10) > c['batch_stats_loss'] and t.history[-2]['accuracy'] < 0.5
    assert all(torch.equal(v, sd[k]) for k, v in t.model.state_dict().items())                     # buffers and counters as they were
    assert torch.equal(torch.get_rng_state(), rng[0]) and random.getstate() == rng[1] and np.array_equal(np.random.get_state()[1], rng[2])
    assert [m.training for m in t.model.modules()] == modes and [m.momentum for m in t.model.modules() if isinstance(m, nn.BatchNorm1d)] == momenta


def test_running_stats_check_leaves_the_run_bit_identical(monkeypatch):
    # dropout draws from torch's generator and BatchNorm keeps statistics: a check that moved either would change the weights
    checked = bn_fit()
    monkeypatch.setattr(Trainer, '_check_running_stats', lambda self, *a: {})
    unchecked = bn_fit()
    assert state_equal(checked.model, unchecked.model) and losses(checked) == losses(unchecked)
    assert 'norm_check' in checked.history[-1] and 'norm_check' not in unchecked.history[-1]


def test_running_stats_check_only_where_it_means_something():
    dl = DataLoader(blobs(256, dtype=torch.float64), 32)
    plain = Trainer(nn.Sequential(nn.Linear(20, 10)).double(), (dl, dl), **KW).fit(epochs=1)      # no running statistics
    assert 'norm_check' not in plain.history[-1]
    reg = [(x, x[:, :1]) for x, _ in dl]                                                              # regression: no chance level
    t = Trainer(nn.Sequential(nn.Linear(20, 8), nn.BatchNorm1d(8), nn.Linear(8, 1)).double(), (reg, reg), loss_fn=nn.MSELoss(), **KW).fit(epochs=1)
    assert 'valid_loss' in t.history[-1] and 'norm_check' not in t.history[-1]
    ddp = bn_fit(); ddp.world_size = 2                                                                # SyncBatchNorm would wait for the others
    assert 'norm_check' not in (ddp.validate(ddp.valid_data), ddp.history[-1])[1]


@pytest.mark.slow
def test_running_stats_check_on_the_demos_short_run(monkeypatch):
    "The demo's netlite_tiny after 20 steps: without the BatchNorm warm-up its accuracy was 10 % and the check warns; with it, silent."
    import warnings
    from netlite_nb.data import mnist_sample_loaders
    from netlite_nb.models import create_model
    def run():
        torch.manual_seed(0)
        t = Trainer(create_model('netlite_tiny', num_classes=10), mnist_sample_loaders(batch_size=128), **KW)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always'); t.fit(steps=20)
        return t, [x for x in w if 'Evaluation mode disagrees' in str(x.message)]
    warm, warned = run()
    assert not warned and warm.history[-1]['accuracy'] > 0.3
    monkeypatch.setattr(train_module, '_batchnorms', lambda model: [])                              # the trainer before the warm-up
    cold, warned = run()
    assert len(warned) == 1 and cold.history[-1]['accuracy'] < 0.15 and 'warning' in cold.history[-1]


def test_a_step_asks_the_model_for_no_sync_without_raising(monkeypatch):
    # nn.Module.__getattr__ builds an AttributeError for every missing attribute: asked of the instance, each step paid one
    missing, getattr_ = [], nn.Module.__getattr__
    def counting(self, name):
        try: return getattr_(self, name)
        except AttributeError: missing.append(name); raise
    monkeypatch.setattr(nn.Module, '__getattr__', counting)
    t = Trainer(mlp(), loaders(bs=64), **KW).fit(steps=3)
    assert t.step == 3 and 'no_sync' not in missing, missing


def _bytes(ts): return sum(t.numel() * t.element_size() for t in ts)

@pytest.mark.parametrize('ema,micro,opt,lora', [(None, None, 'adamw', False), (0.99, None, 'adamw', False), (0.99, 16, 'adamw8bit', False),
                                                (None, 16, 'adamw', True), (0.99, None, 'adamw8bit', True), (0.999, 16, 'sgd', True)])
def test_the_trainers_plan_counts_what_its_run_holds(ema, micro, opt, lora):
    "Issue 36: the Trainer's plan is the plan of its `TrainingStep`: weights, the EMA copy, optimizer state and gradients are the run's, over a grid of options."
    from netlite_nb.lora import add_lora
    from netlite_nb.fixtures import mlp
    model = mlp(hidden=256)
    if lora: add_lora(model, targets=('0',), rank=4, train=('3',))   # adapters on the first layer, the head trains in full
    t = Trainer(model, loaders(bs=64), ema=ema, micro_batch=micro, optimizer=opt, **{**KW, 'plan': True})
    t.fit(steps=2)
    plan, m = t.plan, t.model
    assert t.training_step().planned_by(plan) and plan.micro_batch == (micro or 64)
    assert plan.breakdown['weights'] == _bytes([*m.parameters(), *m.buffers()])
    assert plan.breakdown.get('EMA weights', 0) == (_bytes([*t.ema.module.parameters(), *t.ema.module.buffers()]) if ema else 0)
    state = [v for s in t.opt.state.values() for v in s.values() if torch.is_tensor(v)]
    held = _bytes([*m.parameters(), *m.buffers()]) + plan.breakdown.get('EMA weights', 0) + _bytes(state)
    assert plan.peak >= held and (opt == 'sgd' or _bytes(state) > 0)   # what the run keeps all along, the optimizer's state included, is within the peak
    trained = [p for p in m.parameters() if p.requires_grad]
    assert plan.breakdown['gradients'] <= _bytes(trained)   # gradients of what trains only (LoRA: not the frozen base)


# --- the thread policy (chapter 07b, "Threads on a busy machine") ---

@pytest.fixture
def torch_threads(monkeypatch):
    "Torch's thread count and the policy's memory of it put back after the test; the environment's thread variables set aside."
    for k in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS'): monkeypatch.delenv(k, raising=False)
    saved = torch.get_num_threads(), train_module._SET_BY_NETLITE, train_module._BEFORE_NETLITE
    yield
    torch.set_num_threads(saved[0]); train_module._SET_BY_NETLITE, train_module._BEFORE_NETLITE = saved[1:]


class FakeMachine(Callback):
    "A fake clock, and passes and steps that advance it by what they cost: two threads cost `two`× one thread's while `busy(step)`."
    def __init__(self, busy, two=2.0): self.now, self.busy, self.two, self.step = 0.0, busy, two, 0
    def __call__(self): return self.now
    def cost(self): return (0.2 if self.busy(self.step) else 0.08) * (self.two if torch.get_num_threads() >= 2 else 1.0) ** (1 if self.busy(self.step) else -1)
    def after_step(self, t): self.step = t.step; self.now += self.cost()


def test_thread_policy_decides_on_faked_inputs(tmp_path):
    tm = train_module
    assert tm.usable_cores({0, 1, 2, 3, 4, 5, 6, 7}, 2.5) == 3 and tm.usable_cores({3}, None) == 1 and tm.usable_cores({0, 1}, None) == 2
    (tmp_path / 'cpu.max').write_text('150000 100000\n'); assert tm._cgroup_quota(tmp_path) == 1.5
    (tmp_path / 'cpu.max').write_text('max 100000\n'); assert tm._cgroup_quota(tmp_path) is None
    assert tm._cgroup_quota(tmp_path / 'nothing') is None
    busy = tm.choose_threads(2, 2, timings={2: 0.9, 1: 0.3}, load=3.4)
    assert (busy.threads, busy.source, busy.load) == (1, 'auto', 3.4) and 'load 3.4 on 2 cores' in busy.reason
    assert tm.choose_threads(2, 2, timings={2: 0.1, 1: 0.18}, load=0.1).threads == 2
    assert tm.choose_threads(8, 8, timings={8: 0.100, 4: 0.105, 1: 0.5}).threads == 4       # a tie goes to fewer threads
    assert tm.choose_threads(32, 4).threads == 4 and 'capped at the 4 cores' in tm.choose_threads(32, 4).reason
    assert tm.choose_threads(4, 4, device_type='cuda').source == 'device'
    assert tm.thread_candidates(32, 4) == [4, 2, 1] and tm.thread_candidates(2, 2) == [2, 1]


def test_thread_policy_respects_an_explicit_setting(monkeypatch, torch_threads):
    tm = train_module
    assert tm.explicit_threads('auto', 2, {}, {2}) is None
    assert tm.explicit_threads('auto', 2, {'OMP_NUM_THREADS': '2'}, {2}) == (2, 'OMP_NUM_THREADS=2 in the environment')
    assert tm.explicit_threads('auto', 3, {}, {2}) == (3, 'torch.set_num_threads')
    assert tm.explicit_threads(5, 2, {}, {2}) == (5, 'Trainer(threads=5)')
    c = tm.choose_threads(2, 2, explicit=(3, 'torch.set_num_threads'), timings={3: 9.0, 1: 0.1})
    assert (c.threads, c.source) == (3, 'user')
    probed = []
    monkeypatch.setattr(Trainer, '_timed_pass', lambda self: probed.append(1))
    monkeypatch.setenv('OMP_NUM_THREADS', '1'); torch.set_num_threads(1)
    t = Trainer(mlp(), loaders(), **KW).fit(steps=2)
    assert torch.get_num_threads() == 1 and t.thread_choices[-1].source == 'user' and not probed
    monkeypatch.delenv('OMP_NUM_THREADS')
    torch.set_num_threads(3)                                              # the user's call, before fit
    t = Trainer(mlp(), loaders(), **KW).fit(steps=2)
    assert torch.get_num_threads() == 3 and t.thread_choices[-1].reason == 'set by torch.set_num_threads; kept' and not probed
    with pytest.raises(ValueError, match="threads must be 'auto'"): Trainer(mlp(), loaders(), threads='many', **KW)


def test_trainer_applies_and_records_the_thread_count(tmp_path, torch_threads):
    seen = []
    class Threads(Callback):
        def after_step(self, t): seen.append(torch.get_num_threads())
    t = Trainer(mlp(), loaders(), threads=1, run_dir=tmp_path, callbacks=[Threads()], **KW).fit(steps=3)
    assert seen == [1, 1, 1]
    rec = yaml.safe_load((tmp_path / 'config.yaml').read_text())['threads']
    assert rec[-1]['threads'] == 1 and rec[-1]['source'] == 'user' and rec[-1]['reason'] == 'set by Trainer(threads=1); kept'


def test_busy_machine_with_a_fake_clock(monkeypatch, torch_threads, tmp_path):
    "Busy until step 40: two threads cost twice one's, so fit takes one; then idle, where two are 2x faster: the watch probes again and takes two."
    if train_module.usable_cores() < 2: pytest.skip('one core: there is no thread count to choose')
    tm = train_module
    machine = FakeMachine(busy=lambda step: step < 40)
    monkeypatch.setattr(tm, '_clock', machine)
    monkeypatch.setattr(Trainer, '_timed_pass', lambda self: setattr(machine, 'now', machine.now + machine.cost() / 4))
    monkeypatch.setattr(tm, 'torch_default_threads', lambda: {2})
    torch.set_num_threads(2)
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), callbacks=[machine], run_dir=tmp_path, **KW).fit(steps=100)
    first, last = t.thread_choices[0], t.thread_choices[-1]
    assert (first.threads, first.source, first.step) == (1, 'auto', 0) and first.timings == {2: pytest.approx(0.1), 1: pytest.approx(0.05)}
    assert last.threads == 2 and last.step > 40 and len(t.thread_choices) == 2
    assert torch.get_num_threads() == 2 and tm._SET_BY_NETLITE == 2
    rec = yaml.safe_load((tmp_path / 'config.yaml').read_text())['threads']   # saved at the start of fit: the first choice
    assert rec[0]['threads'] == 1 and rec[0]['timings'] == {'2': pytest.approx(0.1), '1': pytest.approx(0.05)}
    # the real probe, on the real model: it leaves weights, gradients and the random stream as they were
    monkeypatch.undo()
    before, rng = [p.detach().clone() for p in t.model.parameters()], torch.get_rng_state()
    t._timed_pass()
    assert all(torch.equal(a, b) for a, b in zip(before, t.model.parameters())) and all(p.grad is None for p in t.model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


# --- issue 38: a rate finder that knows when it failed -------------------------------------------------------------------------

def _memory_task(n, seed, T=12):
    "Ten classes held in the first of T noisy steps: a GRU must carry it to the end, and sits at chance for its first hundreds of steps."
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = torch.randn(n, T, 1, generator=g) * 0.5
    x[:, 0, 0] = (y.float() - 4.5) / 2
    return torch.utils.data.TensorDataset(x, y)


class _GRU(torch.nn.Module):
    def __init__(self): super().__init__(); self.gru, self.head = torch.nn.GRU(1, 32, batch_first=True), torch.nn.Linear(32, 10)
    def forward(self, x): return self.head(self.gru(x)[0][:, -1])


def _gru_trainer(**kw):
    from torch.utils.data import DataLoader
    torch.manual_seed(0)
    return Trainer(_GRU(), (DataLoader(_memory_task(4096, 0), 64, shuffle=True), DataLoader(_memory_task(1024, 1), 256)), **KW, **kw)


def test_lr_find_on_a_long_plateau_says_the_short_sweep_failed_and_finds_a_rate_that_trains(tmp_path):
    one = _gru_trainer().lr_find(retry=False)                   # the old behaviour: a reading of noise, without a word
    assert one.suggestion < 1e-5 and one.decision == ''
    t = _gru_trainer(lr='auto', run_dir=tmp_path / 'gru').fit(steps=600)
    f = t.lr_found
    assert f.sweeps == 2 and not f.fallback and 'failed' in f.decision and 'showed a fall' in f.decision, f
    assert f.suggestion > 1e-4 and t.last_metrics['accuracy'] > 0.9, (f, t.last_metrics)
    cfg = yaml.safe_load((tmp_path / 'gru' / 'config.yaml').read_text())
    assert cfg['lr_find']['decision'] == f.decision and cfg['lr_find']['sweeps'] == 2
    assert any('lr_find: a 100-step sweep' in n for n in cfg['notes'])


def test_lr_find_falls_back_to_the_default_rate_and_says_so(tmp_path):
    noise = np.random.default_rng(0)
    flat = lambda out, y: out.sum() * 0 + float(2.3 * np.exp(noise.normal(0, 0.01)))  # nothing any rate does moves this loss
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), loss_fn=flat, lr='auto', strategy=load_strategy('cpu', lr=3e-3), run_dir=tmp_path / 'r', check_data=False, **KW)
    t.fit(steps=2)
    assert t.lr_found.fallback and t.lr_found.suggestion == 3e-3
    assert 'Training at the default lr 0.003' in t.lr_found.decision and 'no rate found' in repr(t.lr_found)
    cfg = yaml.safe_load((tmp_path / 'r' / 'config.yaml').read_text())
    assert cfg['lr_find']['fallback'] is True and cfg['optimizer']['lr'] == 3e-3


def test_lr_find_on_a_fresh_head_over_a_trained_body_picks_a_rate_that_trains_it():
    import copy
    from torch.utils.data import DataLoader, TensorDataset
    x, y = blobs(4096, spread=2.0, seed=3).tensors
    split = lambda y: (DataLoader(TensorDataset(x[:3072], y[:3072]), 64, shuffle=True), DataLoader(TensorDataset(x[3072:], y[3072:]), 256))
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(20, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU())
    Trainer(torch.nn.Sequential(body, torch.nn.Linear(128, 10)), split(y), lr=1e-3, **KW).fit(epochs=3)
    new_task = torch.randperm(10, generator=torch.Generator().manual_seed(1))[y]   # the body's features serve; the head is new
    def head_run(lr):
        torch.manual_seed(1)
        return Trainer(torch.nn.Sequential(copy.deepcopy(body), torch.nn.Linear(128, 10)), split(new_task), lr=lr, **KW).fit(steps=150)
    auto, plain = head_run('auto'), head_run(1e-3)
    f = auto.lr_found
    assert f.sweeps == 1 and f.decision.startswith("the sweep's suggestion") and f.smoothed[0] > 10 * min(f.smoothed), f
    assert auto.last_metrics['accuracy'] >= plain.last_metrics['accuracy'] - 0.01, (f, auto.last_metrics, plain.last_metrics)


# --- issue 38: names checked, last_metrics after restore_best, seeds --------------------------------------------------------------

@pytest.mark.parametrize('kw,near', [(dict(monitor='val_accuracy'), "'accuracy'"), (dict(callbacks=[EarlyStopping(monitor='val_loss')]), "'valid_loss'")])
def test_a_monitor_naming_no_metric_is_refused_at_the_first_validation_with_the_closest_name(kw, near):
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), **KW, **kw)
    with pytest.raises(ValueError, match=f"did you mean {near}"): t.fit(epochs=2)
    assert t.epoch == 1                                       # at the first validation, not after the run


def _noisy_run(restore_best):
    "96 training samples, 8 labels in 10 flipped: the network memorises them and validation gets worse as it goes."
    ds = blobs(1024)
    g = torch.Generator().manual_seed(0)
    y = torch.where(torch.rand(96, generator=g) < 0.8, torch.randint(0, 10, (96,), generator=g), ds.tensors[1][:96])
    tr = DataLoader(TensorDataset(ds.tensors[0][:96], y), 32, shuffle=True)
    torch.manual_seed(0)
    return Trainer(mlp(hidden=256, dropout=0.0), (tr, DataLoader(TensorDataset(*[t[512:] for t in ds.tensors]), 256)), lr=3e-3,
                   lr_schedule='constant', seed=0, callbacks=[EarlyStopping(patience=4, restore_best=restore_best)], **KW).fit(epochs=60)


def test_last_metrics_follow_restore_best():
    t = _noisy_run(True)
    vals = [r for r in t.history if 'valid_loss' in r]
    best = min(vals, key=lambda r: r['valid_loss'])
    assert vals[-1]['valid_loss'] > best['valid_loss']           # it got worse before it stopped
    assert t.last_metrics['valid_loss'] == best['valid_loss'] and t.last_metrics['accuracy'] == best['accuracy']
    assert abs(t.validate()['valid_loss'] - best['valid_loss']) < 1e-6   # and the weights score it
    assert _noisy_run(False).last_metrics['valid_loss'] == vals[-1]['valid_loss']   # without restore_best: the last one


def _seeded_run(global_seed, run_dir=None, **kw):
    torch.manual_seed(global_seed)
    return Trainer(mlp(), loaders(), run_dir=run_dir, log_every=1, **KW, **kw).fit(steps=6)


def test_without_seed_the_run_follows_torch_manual_seed_and_records_its_seed(tmp_path):
    a, a2, b = _seeded_run(1, tmp_path / 'a'), _seeded_run(1), _seeded_run(2)
    assert losses(a) == losses(a2) and losses(a) != losses(b) and a.state.seed == a2.state.seed != b.state.seed
    cfg = yaml.safe_load((tmp_path / 'a' / 'config.yaml').read_text())
    assert cfg['seed'] == a.state.seed and cfg['seed_given'] is False
    # the model's initial weights are the same here; only the run's own random numbers (shuffle, dropout) differ
    torch.manual_seed(0); m = mlp()
    runs = []
    for s in (1, 2):
        torch.manual_seed(s)
        runs.append(losses(Trainer(copy.deepcopy(m), loaders(), log_every=1, **KW).fit(steps=6)))
    assert runs[0] != runs[1]


def test_with_seed_the_run_is_exact_whatever_the_global_generator(tmp_path):
    a, b = _seeded_run(1, tmp_path / 'a', seed=7), _seeded_run(1, seed=7)
    assert losses(a) == losses(b) and a.state.seed == 7
    assert yaml.safe_load((tmp_path / 'a' / 'config.yaml').read_text())['seed_given'] is True
    torch.manual_seed(0); m = mlp()
    c = Trainer(copy.deepcopy(m), loaders(), log_every=1, seed=7, **KW); torch.manual_seed(123); c.fit(steps=6)
    d = Trainer(copy.deepcopy(m), loaders(), log_every=1, seed=7, **KW); torch.manual_seed(456); d.fit(steps=6)
    assert losses(c) == losses(d)


def test_resume_without_seed_is_bit_exact(tmp_path):
    full = _seeded_run(3)
    class Stop(Callback):
        def after_step(self, t):
            if t.step == 4: raise KeyboardInterrupt
    _seeded_run(3, tmp_path / 'cut', callbacks=[Stop()])
    torch.manual_seed(99)                                     # the resume takes the run's random states, not the global generator's
    resumed = Trainer(mlp(), loaders(), run_dir=tmp_path / 'cut', log_every=1, **KW).fit(steps=6, resume=tmp_path / 'cut')
    assert losses(resumed) == losses(full) and resumed.state.seed == full.state.seed


# --- issue 38: metrics over the epoch, regression, the data check's conventions -------------------------------------------------

def test_epoch_metrics_equal_scikit_learn_over_uneven_batches():
    sk = pytest.importorskip('sklearn.metrics')
    from netlite_nb.train import METRICS
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(700, 20, generator=g), torch.randint(0, 4, (700,), generator=g)
    y[:400] = 0                                            # imbalanced: batch means of ratios drift from the epoch's
    x[y == 1, :4] += 1.5
    model = nn.Linear(20, 4)
    val = DataLoader(TensorDataset(x, y), 64)              # 11 batches, the last of 60
    t = Trainer(model, (DataLoader(TensorDataset(x, y), 64), val), metrics=['f1', 'balanced_accuracy', 'auroc'], **KW)
    r = t.validate()
    with torch.no_grad(): out = model(x)
    pred = out.argmax(1)
    assert r['f1'] == pytest.approx(sk.f1_score(y, pred, average='macro'), abs=1e-12)
    assert r['balanced_accuracy'] == pytest.approx(sk.balanced_accuracy_score(y, pred), abs=1e-12)
    assert r['auroc'] == pytest.approx(sk.roc_auc_score(y, out.softmax(1).double(), multi_class='ovr'), abs=1e-6)
    per_batch = Trainer(model, (val, val), metrics={'f1': lambda o, t: sk.f1_score(t, o.argmax(1), average='macro')}, **KW).validate()['f1']
    assert abs(per_batch - r['f1']) > 1e-3                 # the batch-mean the old code gave is a different number
    b = torch.randint(0, 2, (300,), generator=g); s = torch.randn(300, 1, generator=g) + b[:, None]
    m = METRICS['auroc'](); m.update(s[:100], b[:100]); m.update(s[100:], b[100:])
    assert m.compute() == pytest.approx(sk.roc_auc_score(b, s[:, 0]), abs=1e-12)   # one logit: binary


def test_torchmetrics_protocol_objects_are_reset_updated_and_computed_each_validation():
    class Count:
        name = 'count'
        def __init__(self): self.calls = []
        def reset(self): self.n = 0; self.calls.append('reset')
        def update(self, out, y): self.n += len(y); self.calls.append('update')
        def compute(self): return self.n
    c = Count()
    t = Trainer(mlp(), loaders(), metrics=[c], **KW)
    assert t.validate()['count'] == 256 and t.validate()['count'] == 256 and c.calls.count('reset') == 2
    with pytest.raises(ValueError, match="did you mean 'auroc'"): Trainer(mlp(), loaders(), metrics=['aucroc'], **KW)


def _regression_loaders(integer=False):
    from netlite_nb.data import LabeledTensors, make_loaders
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1200, 5, generator=g)                   # Friedman #1, the standard regression benchmark
    y = (10 * torch.sin(math.pi * x[:, 0] * x[:, 1]) + 20 * (x[:, 2] - 0.5) ** 2 + 10 * x[:, 3] + 5 * x[:, 4])[:, None]
    y = y + torch.randn(1200, 1, generator=g)
    if integer: y = y.round()
    return make_loaders(LabeledTensors(x[:1000], y[:1000], task='regression'), LabeledTensors(x[1000:], y[1000:], task='regression'), batch_size=32)


def _reg_net(): return nn.Sequential(nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


@pytest.mark.parametrize('integer', [False, True])
def test_regression_end_to_end_with_chapter_04_loaders(integer, tmp_path):
    sk = pytest.importorskip('sklearn.metrics')
    dls = _regression_loaders(integer)
    assert dls.train.y.dtype == torch.float32 and dls.classes == []
    torch.manual_seed(0)
    t = Trainer(_reg_net(), dls, task='regression', lr=3e-3, run_dir=tmp_path / 'r', **KW).fit(epochs=15)
    r = t.last_metrics
    assert 'accuracy' not in r and set(r) >= {'valid_loss', 'mse', 'mae', 'r2'}
    assert r['r2'] > 0.6, r                                  # it learned (a constant scores 0)
    pred, yv = t.predict(dls.valid), dls.valid.y.cpu()
    assert r['r2'] == pytest.approx(sk.r2_score(yv, pred), abs=1e-5) and r['mae'] == pytest.approx(sk.mean_absolute_error(yv, pred), abs=1e-5)
    assert r['mse'] == pytest.approx(sk.mean_squared_error(yv, pred), rel=1e-5) and r['valid_loss'] == pytest.approx(r['mse'], rel=1e-5)
    assert yaml.safe_load((tmp_path / 'r' / 'config.yaml').read_text())['task'] == 'regression'
    torch.manual_seed(0)                                    # the task read off the loss, not given
    assert 'r2' in Trainer(_reg_net(), dls, loss_fn=nn.L1Loss(), **KW).fit(steps=3).last_metrics


def test_a_missing_loss_fn_with_float_targets_says_what_to_do():
    dls = _regression_loaders()
    with pytest.raises(ValueError, match=r"No loss_fn was given.*task='regression'"): Trainer(_reg_net(), dls, **KW).fit(steps=1)
    flat = DataLoader(TensorDataset(torch.randn(64, 5), torch.randn(64)), 16)   # targets [N] against an output [N, 1]
    with pytest.raises(ValueError, match='broadcast'): Trainer(_reg_net(), flat, loss_fn=nn.MSELoss(), **KW).fit(steps=1)


def test_the_data_check_takes_soft_targets_ignore_index_and_sequence_labels():
    x = torch.randn(256, 20)
    soft = torch.softmax(torch.randn(256, 10), 1)
    Trainer(mlp(), DataLoader(TensorDataset(x, soft), 32), **KW).fit(steps=2)          # class probabilities, as CE takes them
    y = torch.randint(0, 10, (256,)); y[::7] = -100
    Trainer(mlp(), DataLoader(TensorDataset(x, y), 32), **KW).fit(steps=2)             # the default loss's own ignore_index

    class Tagger(nn.Module):
        "One class per position: output [N, C, T], as cross-entropy takes sequences."
        def __init__(self): super().__init__(); self.emb, self.out = nn.Embedding(50, 16), nn.Linear(16, 5)
        def forward(self, t): return self.out(self.emb(t)).transpose(1, 2)
    toks = torch.randint(0, 50, (256, 12)); tags = toks % 5; tags[:, 10:] = -100
    Trainer(Tagger(), (DataLoader(TensorDataset(toks, tags), 32), DataLoader(TensorDataset(toks, tags), 64)), **KW).fit(steps=2)
    bad = tags.clone(); bad[3, 2] = 7
    with pytest.raises(Exception, match=r'Label of item 3 is 7.*check_data=False'):
        Trainer(Tagger(), DataLoader(TensorDataset(toks, bad), 32), **KW).fit(steps=1)


def test_a_partial_label_set_is_a_note_and_a_broken_split_a_warning_naming_the_switch(recwarn):
    import warnings
    x, y = blobs(1024).tensors
    upper = y >= 5
    part = (DataLoader(TensorDataset(x[upper][:300], y[upper][:300]), 32), DataLoader(TensorDataset(x[upper][300:], y[upper][300:]), 64))
    with warnings.catch_warnings():
        warnings.simplefilter('error')                      # fine-tuning on classes 5-9 only: no warning...
        t = Trainer(mlp(), part, **KW).fit(steps=2)
    assert any('classes 0, 1, 2, 3, 4 have no items' in n for n in t.notes)   # ...a note
    broken = (DataLoader(TensorDataset(x[upper], y[upper]), 32), DataLoader(TensorDataset(x, y), 64))
    with pytest.warns(UserWarning, match=r'in the validation data but not in the training data.*check_data=False'):
        Trainer(mlp(), broken, **KW).fit(steps=2)


def test_overfit_says_whether_a_small_subset_fits_and_leaves_the_trainer_as_it_was():
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), lr=3e-3, **KW)
    before = copy.deepcopy(t.model.state_dict()); opt = copy.deepcopy(t.opt.state_dict())
    r = t.overfit(n=128)
    assert r.fitted and r.accuracy == 1.0 and r.n == 128 and 'fits' in r.verdict
    assert all(torch.equal(v, t.model.state_dict()[k]) for k, v in before.items()) and t.opt.state_dict()['state'] == opt['state'] and t.step == 0
    noise = DataLoader(TensorDataset(torch.randn(128, 20), torch.randint(0, 10, (128,))), 32)
    bad = Trainer(nn.Sequential(nn.Linear(20, 2), nn.ReLU(), nn.Linear(2, 10)), noise, lr=3e-3, **KW).overfit(steps=100)
    assert not bad.fitted and 'does NOT fit' in bad.verdict and bad.steps == 100


# --- chapter 03a's offloads in the Trainer: a global clip on the host, the offloads a strategy's sizing chose ---

def _clip_run(optimizer, clip, **kw):
    torch.manual_seed(0)
    return Trainer(mlp(dropout=0.0), loaders(bs=32, n=512), optimizer=optimizer, clip_grad=clip, lr=0.05, lr_schedule=None, warmup=0, seed=0,
                   threads=None, check_data=False, **KW, **kw).fit(steps=4)


@pytest.mark.parametrize('kw', [{}, dict(micro_batch=8)])   # one backward per step, and 4 micro-batches accumulated (on the host)
def test_offloaded_gradients_are_clipped_on_the_host_as_on_the_device(kw):
    "A HostOptimizer updates after backward, so the Trainer takes clip_grad_norm_ over its host gradients: the same weights, bit for bit."
    from netlite_nb.offload import HostOptimizer
    same = lambda a, b: all(torch.equal(u, v) for u, v in zip(a.model.parameters(), b.model.parameters()))
    ref = _clip_run('adamw', 0.05, **kw)
    for name in ('adamw-offload-grads', 'adamw-offload'):
        t = _clip_run(name, 0.05, **kw)
        assert isinstance(t.opt, HostOptimizer) and same(ref, t), name
    assert not same(ref, _clip_run('adamw', None, **kw))            # the clip acted: without it the weights differ
    with pytest.raises(ValueError, match='global-norm clip'): _clip_run('adamw-in-backward', 0.05)  # no global norm inside backward


def _saves_on_the_device(model):
    "Does `model`'s forward keep its saved tensors where an outer saved-tensor hook sees them (not moved to the host by `offload_activations`)?"
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(1) or t, lambda t: t): model(torch.randn(4, 20))
    return bool(seen)


def test_the_trainer_takes_the_offloads_its_strategy_chose_and_offload_none_drops_them():
    import dataclasses
    from netlite_nb.offload import HostOptimizer
    s = dataclasses.replace(load_strategy('cpu'), optimizer='adamw-offload', offload=['activations'])  # as `pick_strategy` sizes a card
    t = Trainer(mlp(), loaders(), strategy=s, **KW)
    assert isinstance(t.opt, HostOptimizer) and not _saves_on_the_device(t.model)
    assert _saves_on_the_device(Trainer(mlp(), loaders(), strategy=s, offload=None, **KW).model)
    assert _saves_on_the_device(Trainer(mlp(), loaders(), strategy=dataclasses.replace(s, offload='auto'), **KW).model)  # not sized: none
