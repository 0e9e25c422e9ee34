"Issues 17 and 39: faults a run must survive and bad inputs it must refuse with a sentence — empty data, divergence, damaged checkpoints, bad arguments, leftovers and a full disk, a second fit mid-epoch."
import errno, json, math, os, subprocess, sys, warnings
import pytest, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import safetensors.torch as st
import netlite_nb.checkpoint as ckmod
from netlite_nb.train import Trainer, Callback
from netlite_nb.checkpoint import find_checkpoint, read_state, clean_leftovers
from netlite_nb.fixtures import mlp
from train_helpers import KW, loaders, losses

EMPTY = DataLoader(TensorDataset(torch.zeros(0, 20), torch.zeros(0, dtype=torch.long)), batch_size=8)


def fails(f, *words, exc=Exception):
    with pytest.raises(exc) as e: f()
    for w in words: assert w in str(e.value), str(e.value)
    return e.value


# 1. empty data
def test_empty_training_set_is_refused_for_steps_and_epochs():
    fails(lambda: Trainer(mlp(), EMPTY, **KW).fit(steps=5), 'training data is empty', exc=ValueError)
    fails(lambda: Trainer(mlp(), EMPTY, **KW).fit(epochs=2), 'training data is empty', exc=ValueError)


def test_a_one_shot_iterable_does_not_spin_forever():
    tr, _ = loaders()
    batches = iter(list(tr)[:3])  # a generator: one epoch of 3 batches, then nothing
    fails(lambda: Trainer(mlp(), batches, **KW).fit(steps=10), 'gave no batch in epoch 1', exc=ValueError)


def test_empty_validation_set_is_refused():
    tr, _ = loaders()
    fails(lambda: Trainer(mlp(), (tr, EMPTY), **KW).validate(), 'validation data gave no samples', exc=ValueError)


# 2. divergence
def diverging(run_dir=None, optimizer='sgd', **kw):
    torch.manual_seed(0)
    return Trainer(mlp(), loaders(), lr=1e6, lr_schedule=None, optimizer=optimizer, run_dir=run_dir, checkpoint_every=1, **KW, **kw)


@pytest.mark.parametrize('optimizer,clip', [('sgd', None), ('adamw', None), ('sgd', 1.0)])
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, optimizer, clip):
    t = diverging(tmp_path, optimizer, clip_grad=clip)
    e = fails(lambda: t.fit(steps=40), 'at optimizer step', 'learning rate too high', 'fp16 overflow', 'bad data', exc=FloatingPointError)
    assert t.step < 40 and f'optimizer step {t.step + 1}' in str(e)
    good = find_checkpoint(tmp_path)
    assert str(good) in str(e)
    assert all(torch.isfinite(v).all() for v in st.load_file(good / 'model.safetensors').values())
    assert all(torch.isfinite(p).all() for p in t.model.parameters())     # the bad update was never applied


def test_nonfinite_checkpoint_never_rotates_out_a_good_one(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, keep_checkpoints=1, **KW).fit(steps=2)
    with torch.no_grad(): next(t.model.parameters()).fill_(float('nan'))
    with pytest.warns(UserWarning, match='non-finite'): t.save_checkpoint()
    t.state.step += 1
    with pytest.warns(UserWarning, match='non-finite'): t.save_checkpoint()
    assert find_checkpoint(tmp_path).name == 'step-0000002' and (tmp_path / 'step-0000002').is_dir()


def test_on_nonfinite_skip_drops_the_bad_updates():
    t = diverging(on_nonfinite='skip').fit(steps=30)
    assert t.step == 30 and t.skipped > 0
    assert all(math.isfinite(r['loss']) for r in t.history if 'loss' in r)
    fails(lambda: Trainer(mlp(), loaders(), on_nonfinite='ignore', **KW), "on_nonfinite must be 'stop' or 'skip'", exc=ValueError)


class NaNOnce(Callback):
    "Make the loss of optimizer step `at` nan (bad data in one batch)."
    def __init__(self, at): self.at = at
    def before_batch(self, t):
        if t.step + 1 == self.at: t.xb[0, 0] = float('nan')


@pytest.mark.skipif(not torch.cuda.is_available(), reason='fp16 with a GradScaler needs CUDA')
def test_fp16_keeps_gradscaler_behaviour():
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), precision='fp16', callbacks=[NaNOnce(3)], **{**KW, 'device': 'cuda'}).fit(steps=6)
    assert t.step == 6 and t.skipped == 0


def test_one_bad_batch_stops_fp32_and_is_skipped_with_skip():
    torch.manual_seed(0)
    fails(lambda: Trainer(mlp(), loaders(), callbacks=[NaNOnce(3)], **KW).fit(steps=6), 'optimizer step 3', exc=FloatingPointError)
    torch.manual_seed(0)
    t = Trainer(mlp(), loaders(), callbacks=[NaNOnce(3)], on_nonfinite='skip', log_every=1, **KW).fit(steps=6)
    assert t.skipped == 1 and [s for s, _ in losses(t)] == [1, 2, 4, 5, 6]


# 7. integrity
@pytest.mark.parametrize('name', ['state.pt', 'model.safetensors'])
def test_a_flipped_byte_is_caught_and_the_previous_checkpoint_used(tmp_path, name):
    Trainer(mlp(), loaders(), run_dir=tmp_path, checkpoint_every=2, keep_checkpoints=3, **KW).fit(steps=4)
    bad = tmp_path / 'step-0000004'
    raw = bytearray((bad / name).read_bytes()); raw[len(raw) - 9] ^= 0x01; (bad / name).write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match=f'{name} does not match its sha256'):
        assert find_checkpoint(tmp_path).name == 'step-0000002'
    fails(lambda: find_checkpoint(bad), 'is damaged', name, exc=ValueError)
    with pytest.warns(UserWarning, match='damaged'):
        t = Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=4, resume=tmp_path)
    assert t.step == 4


# 9. arguments
@pytest.mark.parametrize('kw,words', [
    (dict(clip_grad=-1), 'clip_grad is the largest gradient norm'), (dict(clip_grad=0), 'clip_grad'),
    (dict(micro_batch=-4), 'micro_batch must be a whole number'), (dict(micro_batch=2.5), 'micro_batch'),
    (dict(accum_steps=0), 'accum_steps must be a whole number'), (dict(lr=-1e-3), 'lr must be a positive'),
    (dict(lr=float('nan')), 'lr must be'), (dict(ema=1.5), 'ema is a decay'), (dict(log_every=0), 'log_every'),
    (dict(keep_checkpoints=0), 'keep_checkpoints'), (dict(checkpoint_every=-1), 'checkpoint_every'),
    (dict(weight_decay=-0.1), 'weight_decay must be 0 or more'), (dict(warmup=-1), 'warmup'), (dict(min_lr_ratio=2), 'min_lr_ratio')])
def test_bad_options_are_refused_with_a_sentence(kw, words):
    fails(lambda: Trainer(mlp(), loaders(), **KW, **kw), words, exc=ValueError)


@pytest.mark.parametrize('kw', [dict(steps=-3), dict(steps=0), dict(epochs=-1), dict(steps=2.5)])
def test_bad_fit_arguments_are_refused(kw):
    t = Trainer(mlp(), loaders(), **KW)
    fails(lambda: t.fit(**kw), f"fit's {next(iter(kw))}= must be a whole number", exc=ValueError)
    assert t.step == 0


# 10. leftovers, disk full, history size
def dead_pid():
    return int(subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True).stdout)


def test_leftovers_of_dead_writers_are_cleaned_when_the_run_dir_is_used(tmp_path):
    Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=2)
    pid = dead_pid()
    for n in (f'.step-0000004.tmp-{pid}', f'.step-0000006.old-{pid}'): (tmp_path / n).mkdir(); (tmp_path / n / 'state.pt').write_bytes(b'x' * 1000)
    (tmp_path / f'.latest.tmp-{pid}').write_text('step-0000004')
    mine = tmp_path / f'.step-0000008.tmp-{os.getpid()}'; mine.mkdir()
    assert find_checkpoint(tmp_path).name == 'step-0000002'
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith('.')) == [mine.name]   # a live writer's stays
    assert clean_leftovers(tmp_path) == []


@pytest.mark.parametrize('error', [RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 128 vs 64'),
                                   OSError(errno.ENOSPC, 'No space left on device')])
def test_disk_full_during_a_save_is_a_sentence_and_the_previous_checkpoint_stays(tmp_path, monkeypatch, error):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, log_every=1, **KW).fit(steps=2)
    def full(*a, **k): raise error
    monkeypatch.setattr(torch, 'save', full)
    e = fails(lambda: t.fit(steps=2), 'No space left on device while writing checkpoint', 'free space or set keep_checkpoints lower',
              'step-0000002 is still valid', exc=OSError)
    assert e.errno == errno.ENOSPC
    monkeypatch.undo()
    assert not [p for p in tmp_path.iterdir() if '.tmp-' in p.name]   # the half-written checkpoint is gone: its space is back
    r = Trainer(mlp(), loaders(), run_dir=tmp_path, log_every=1, **KW).fit(steps=2, resume=tmp_path)
    assert r.step == 2 and len(losses(r)) == 2


def test_state_pt_does_not_grow_with_the_history_and_resume_stays_exact(tmp_path):
    def make(d, cbs=()):
        torch.manual_seed(0)
        return Trainer(mlp(dropout=0.2), loaders(), run_dir=tmp_path / d, callbacks=cbs, log_every=1, checkpoint_every=1,
                       keep_checkpoints=100, **KW)
    full = make('a').fit(epochs=2)
    sizes = [(p / 'state.pt').stat().st_size for p in sorted((tmp_path / 'a').glob('step-*'))]
    assert max(sizes) - min(sizes) < 2000, sizes        # a few counters change, the history does not ride along
    lines = (tmp_path / 'a' / 'metrics.jsonl').read_text().splitlines()
    assert [json.loads(l) for l in lines] == full.history
    assert read_state(tmp_path / 'a')['history'] == full.history
    class Stop(Callback):
        def after_step(self, t):
            if t.step == 7: raise KeyboardInterrupt
    make('b', [Stop()]).fit(epochs=2)
    res = make('b').fit(epochs=2, resume=tmp_path / 'b' / 'step-0000005')   # an older checkpoint: metrics.jsonl is cut back to it
    assert losses(res) == losses(full) and [r['step'] for r in res.history] == [r['step'] for r in full.history]
    assert [json.loads(l) for l in (tmp_path / 'b' / 'metrics.jsonl').read_text().splitlines()] == res.history


# 11. a second fit
class SeenIds(Callback):
    def __init__(self): self.seen = []
    def before_batch(self, t): self.seen += t.xb[:, 0].tolist()


def test_second_fit_mid_epoch_continues_the_same_order():
    def run(*fits):
        torch.manual_seed(0); cb = SeenIds()
        t = Trainer(mlp(), loaders(), callbacks=[cb], log_every=1, lr_schedule=None, **KW)  # one schedule for both
        for kw in fits: t.fit(**kw)
        return cb.seen, t
    (split, t2), (whole, t1) = run(dict(steps=4), dict(steps=8)), run(dict(epochs=1))
    assert len(set(split)) == 768 and split == whole
    assert (t2.step, t2.epoch) == (t1.step, t1.epoch) == (12, 1)
    assert losses(t2) == losses(t1)


def test_steps_count_from_the_start_of_the_call_and_resume_finishes_the_cut_call(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, **KW)
    t.fit(steps=3); t.fit(steps=3)
    assert t.step == 6                                   # live: 3 more
    class Stop(Callback):
        def after_step(self, t):
            if t.step == 8: raise KeyboardInterrupt
    t.add_callback(Stop())
    t.fit(steps=5)
    assert t.interrupted and t.step == 8
    r = Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=5, resume=tmp_path)
    assert r.step == 11                                  # the cut call (6 -> 11) finished, not 5 more


# 3. periodic checkpoints from a configuration; kill -9 at random moments, then --resume
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLI = [sys.executable, '-c', 'import sys; from netlite_nb.cli import main; sys.exit(main(sys.argv[1:]))']
ENV = {**os.environ, 'PYTHONPATH': ROOT, 'OMP_NUM_THREADS': '1'}


def run_config(tmp_path, steps):
    cfg = tmp_path / 'run.yaml'
    cfg.write_text(f"strategy: cpu\nmodel: {{name: mlp}}\ndata: {{name: mnist_sample, batch_size: 64}}\n"
                   f"train: {{steps: {steps}, checkpoint_every: 1}}\n")
    return cfg


def latest(run):
    try: return (run / 'latest').read_text()
    except OSError: return None


def kill_loop(tmp_path, kills:int, steps:int):
    "Run `netlite train`, SIGKILL it at a random moment after each new checkpoint, `--resume` it, until it finishes; returns the run dir."
    import random, signal, time
    seed = int.from_bytes(os.urandom(4), 'little'); rng = random.Random(seed)
    cfg, run, done, lives = run_config(tmp_path, steps), tmp_path / 'killed', 0, 0
    while True:
        args = ['train', str(cfg), '--quiet'] + (['--resume', str(run)] if latest(run) else ['--out', str(run)])
        p, before = subprocess.Popen(CLI + args, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), latest(run)
        lives += 1
        if done < kills:
            while p.poll() is None and latest(run) == before: time.sleep(0.01)   # it made progress since it started
            time.sleep(rng.uniform(0, 0.15))
            if p.poll() is None:
                p.send_signal(signal.SIGKILL); p.communicate(); done += 1
                continue
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, f"seed {seed}, life {lives}: {err[-3000:]}"
        assert done >= kills, f"seed {seed}: the run finished after {done} of {kills} kills; make it longer"
        return run


def same_weights(a, b):
    wa, wb = st.load_file(find_checkpoint(a) / 'model.safetensors'), st.load_file(find_checkpoint(b) / 'model.safetensors')
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_config_checkpoint_every_writes_periodic_checkpoints(tmp_path):
    from netlite_nb.strategies import load_config
    test_cfg = load_config(str(run_config(tmp_path, 3)))
    assert test_cfg.train.checkpoint_every == 1 and load_config({}).train.checkpoint_every == 100
    fails(lambda: load_config({'train': {'checkpoint_every': 0}}), 'train.checkpoint_every', exc=ValueError)
    from netlite_nb.run import train_from_config
    t = train_from_config(str(run_config(tmp_path, 3)), ['train.checkpoint_every=2'], run_dir=tmp_path / 'r', progress=False, verbose=False)
    assert t.opts.checkpoint_every == 2
    assert sorted(p.name for p in (tmp_path / 'r').glob('step-*')) == ['step-0000002', 'step-0000003']


def uninterrupted(tmp_path, steps):
    "`netlite train` of the same configuration without a kill, started in the background (it runs while the kill loop does)."
    return subprocess.Popen(CLI + ['train', str(run_config(tmp_path, steps)), '--quiet', '--out', str(tmp_path / 'whole')],
                            env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_kill_9_then_resume_ends_with_the_uninterrupted_weights(tmp_path):
    ref = uninterrupted(tmp_path, 20)
    run = kill_loop(tmp_path, kills=1, steps=20)
    assert ref.wait(timeout=600) == 0, ref.stderr.read()[-3000:]
    assert same_weights(run, tmp_path / 'whole') and find_checkpoint(run).name == 'step-0000020'


@pytest.mark.slow
def test_kill_9_twelve_times_at_random_moments_then_resume_is_exact(tmp_path):
    ref = uninterrupted(tmp_path, 150)
    run = kill_loop(tmp_path, kills=12, steps=150)
    assert ref.wait(timeout=600) == 0, ref.stderr.read()[-3000:]
    assert same_weights(run, tmp_path / 'whole') and find_checkpoint(run).name == 'step-0000150'


def netlite(*args):
    "`netlite ARGS` in this process (a subprocess pays seconds of imports): exit status, stdout, stderr."
    import contextlib, io
    from netlite_nb.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


# 4. YAML billion laughs: refused quickly, in a short message, without growing memory
def laughs(levels=9, where='train: {epochs: *i}'):
    "The 435-byte bomb (9 levels of 9 aliases: 9^9 values), aimed at `where` in a run configuration."
    names = 'abcdefghijk'[:levels]
    return (f"a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
            + ''.join(f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip(names, names[1:])) + where + '\n')


@pytest.mark.parametrize('text', [laughs(), laughs(10, 'model: {name: mlp, kwargs: {hidden: *j}}')], ids=['9-levels', '10-levels-in-kwargs'])
def test_billion_laughs_is_refused_quickly_with_a_bounded_message(tmp_path, text):
    import resource, time
    from netlite_nb.strategies import load_config, ConfigError
    (tmp_path / 'bomb.yaml').write_text(text)
    assert len(text.encode()) < 600
    rss0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    e = fails(lambda: load_config(str(tmp_path / 'bomb.yaml')), 'billion laughs', exc=ConfigError)
    assert time.perf_counter() - t0 < 5 and len(str(e)) < 400
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0 < 100_000   # KiB: under 100 MB more
    rc, out, err = netlite('train', str(tmp_path / 'bomb.yaml'))
    assert rc == 2 and 'billion laughs' in err and len(err) < 600, err[-2000:]


def test_error_messages_print_a_bounded_value():
    from netlite_nb.strategies import load_config, ConfigError
    e = fails(lambda: load_config({'train': {'epochs': [list(range(1000))] * 1000}}), 'train.epochs must be', exc=ConfigError)
    assert len(str(e)) < 300


# 12. the command line: a sentence and exit status 2 (usage) or 1 (runtime), never a traceback
@pytest.mark.parametrize('text,words', [
    ("strategy: cpu\nmodel: {name: mlp, kwargs: {widht: 3}}\ntrain: {steps: 1}\n", "'widht', which mlp does not take"),
    ("strategy: cpu\nmodel: {name: mlp\n", "is not valid YAML"),
    ("strategy: !!python/object/apply:os.system ['echo PWNED']\n", "would build a Python object"),
    ("strategy: rtx_3060_12gb\nmodel: {name: mlp}\ntrain: {steps: 1}\n", "which this machine's PyTorch cannot use")])
def test_bad_configurations_are_a_sentence_and_exit_2(tmp_path, text, words):
    if 'rtx' in text and torch.cuda.is_available(): pytest.skip('this machine has a GPU')
    (tmp_path / 'c.yaml').write_text(text)
    rc, out, err = netlite('train', str(tmp_path / 'c.yaml'), '--out', str(tmp_path / 'r'))
    assert rc == 2 and words in err and 'Traceback' not in err and 'PWNED' not in out, err[-2000:]


def test_export_of_truncated_weights_and_a_latest_outside_the_run_are_refused(tmp_path):
    Trainer(mlp(), loaders(), run_dir=tmp_path / 'run', **KW).fit(steps=1)
    w = tmp_path / 'run' / 'step-0000001' / 'model.safetensors'
    (tmp_path / 'cut.safetensors').write_bytes(w.read_bytes()[:len(w.read_bytes()) // 2])
    rc, out, err = netlite('export', str(tmp_path / 'cut.safetensors'), '--model', 'mlp')
    assert rc == 1 and 'truncated or damaged' in err and 'Traceback' not in err, err[-2000:]
    (tmp_path / 'elsewhere' / 'step-0000009').mkdir(parents=True)
    (tmp_path / 'run' / 'latest').write_text('../elsewhere/step-0000009')
    fails(lambda: find_checkpoint(tmp_path / 'run'), 'not a checkpoint of this run directory', exc=ValueError)


# 6. INT8 calibration on NaN batches
def test_int8_calibration_names_the_nan_batch():
    from netlite_nb.export import calibration_batches
    bad = torch.rand(64, 1, 28, 28); bad[3, 0, 0, 0] = float('inf')
    fails(lambda: calibration_batches([(torch.rand(64, 1, 28, 28), 0), (bad, 0), (bad, 0)], (1, 28, 28)),
          'Calibration batch 1 has NaN or inf', 'first is sample 3', 'calibration=dls.valid', exc=ValueError)


# 5. changed settings on resume: applied exactly, or refused before anything is loaded
def cut_run(run_dir, at=5):
    class Stop(Callback):
        def after_step(self, t):
            if t.step == at: raise KeyboardInterrupt
    torch.manual_seed(0)
    Trainer(mlp(dropout=0.2), loaders(), run_dir=run_dir, callbacks=[Stop()], log_every=1, checkpoint_every=2, **KW).fit(epochs=2)
    return run_dir


@pytest.mark.parametrize('words,fit,lkw,kw', [
    ('cosine schedule ends at step 24, and this call would end at step 36', dict(epochs=3), {}, {}),
    ("effective batch of 128, the run's was 64", dict(epochs=2), {}, dict(accum_steps=2)),
    ("the loader's batch is 32, the run's was 64", dict(epochs=2), dict(bs=32), {}),
    ('holds the state of the AdamW optimizer, and this run\'s is SGD', dict(epochs=2), {}, dict(optimizer='sgd')),
    ('holds the state of the AdamW optimizer, and this run\'s is AdamW8bit', dict(epochs=2), {}, dict(optimizer='adamw8bit')),
    ("the training data has 8 batches per epoch, the run's had 12", dict(epochs=2), dict(n=768), {}),
    ("lr_schedule is 'constant', the run's was 'cosine'", dict(epochs=2), {}, dict(lr_schedule='constant'))])
def test_a_resume_that_changes_what_must_stay_is_refused_before_anything_is_loaded(tmp_path, words, fit, lkw, kw):
    run = cut_run(tmp_path)
    metrics = (run / 'metrics.jsonl').read_text()
    torch.manual_seed(0)
    t = Trainer(mlp(dropout=0.2), loaders(**lkw), **KW, **kw)
    before = [p.clone() for p in t.model.parameters()]
    fails(lambda: t.fit(resume=run, **fit), 'Cannot resume' if 'optimizer' not in words else 'Nothing was loaded', words, exc=ValueError)
    assert all(torch.equal(p, q) for p, q in zip(before, t.model.parameters())) and t.step == 0
    assert (run / 'metrics.jsonl').read_text() == metrics      # the run's files are untouched too


def test_a_new_lr_on_resume_scales_the_schedule_exactly(tmp_path):
    lrs = lambda t: [r['lr'] for r in t.history if 'lr' in r]
    torch.manual_seed(0)
    full = Trainer(mlp(dropout=0.2), loaders(), log_every=1, **KW).fit(epochs=2)
    run = cut_run(tmp_path)
    torch.manual_seed(0)
    res = Trainer(mlp(dropout=0.2), loaders(), log_every=1, lr=3e-3, weight_decay=0.1, micro_batch=16, **KW).fit(epochs=2, resume=run)
    assert lrs(res)[:5] == lrs(full)[:5] and lrs(res)[5:] == pytest.approx([3 * v for v in lrs(full)[5:]], rel=1e-12, abs=1e-15)
    assert res.opt.param_groups[0]['weight_decay'] == 0.1 and res.micro_batch == 16 and res.effective_batch == 64
    assert any('lr 0.001 -> 0.003 on resume' in n for n in res.notes)
    torch.manual_seed(0)
    sched = Trainer(mlp(dropout=0.2), loaders(), log_every=1, lr_schedule=None, **KW).fit(steps=3, resume=None)
    sched.save_checkpoint(tmp_path / 'flat')
    flat = Trainer(mlp(dropout=0.2), loaders(), log_every=1, lr_schedule=None, lr=5e-3, **KW).fit(steps=5, resume=tmp_path / 'flat')
    assert lrs(flat)[-1] == 5e-3                                   # no schedule: the new lr itself


def test_a_failed_strict_load_leaves_the_model_as_it_was(tmp_path):
    from netlite_nb.checkpoint import load_checkpoint
    Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=1)
    other = mlp(classes=7)                                          # the first layer fits, the last does not
    before = [p.clone() for p in other.parameters()]
    fails(lambda: load_checkpoint(tmp_path, other), 'does not fit this model', 'file (10, 64), model (7, 64)', 'Nothing was loaded', exc=ValueError)
    assert all(torch.equal(p, q) for p, q in zip(before, other.parameters()))


def test_cli_resume_with_another_effective_batch_is_a_sentence(tmp_path):
    cfg = run_config(tmp_path, 2)
    assert netlite('train', str(cfg), '--quiet', '--out', str(tmp_path / 'r'))[0] == 0
    rc, _, err = netlite('train', str(cfg), '--quiet', '--resume', str(tmp_path / 'r'), '--set', 'data.batch_size=128')
    assert rc == 2 and 'a resumed run keeps its effective batch' in err and 'data.batch_size=64' in err, err


# 8. data checks at the start of fit and netlite train, with a switch
def test_fit_checks_its_data_first_and_can_be_told_not_to():
    from netlite_nb.data import DataCheckError
    from netlite_nb.fixtures import blobs
    ds = blobs(256)
    ds.tensors[0][70, 3] = float('inf')
    t = Trainer(mlp(), DataLoader(ds, 64, shuffle=True), **KW)
    fails(lambda: t.fit(steps=3), 'Image 70 contains inf', 'check_data=False', exc=DataCheckError)
    assert t.step == 0
    t = Trainer(mlp(), DataLoader(ds, 64), check_data=False, on_nonfinite='skip', **KW).fit(steps=4)
    assert t.skipped == 1                                           # let through, as asked
    y = torch.arange(64) % 10; y[9] = 12
    fails(lambda: Trainer(mlp(), DataLoader(TensorDataset(torch.randn(64, 20), y), 16), **KW).fit(steps=1), 'Label of item 9 is 12, outside [0, 10)', exc=DataCheckError)


def test_netlite_train_checks_the_data_and_no_data_check_skips_it(tmp_path, monkeypatch):
    import netlite_nb.run as runmod
    from netlite_nb.data import mnist_sample
    def nan_sample(*a, **k):
        tr, va = mnist_sample(); tr.x = tr.x.float() / 255; tr.x[17, 0, 5, 5] = float('nan'); return tr, va
    monkeypatch.setattr(runmod, 'mnist_sample', nan_sample)
    cfg = run_config(tmp_path, 2)
    rc, _, err = netlite('train', str(cfg), '--quiet', '--out', str(tmp_path / 'a'))
    assert rc == 1 and 'Image 17 contains NaN' in err and '--no-data-check' in err, err
    rc, _, err = netlite('train', str(cfg), '--quiet', '--out', str(tmp_path / 'b'), '--no-data-check', '--set', 'train.steps=1')
    assert 'contains NaN' not in err, err


# --- issue 39, reliability round two: each test below fails on the code before its fix -------------------------------
import shutil, signal, socket, time, zipfile
from pathlib import Path
from netlite_nb.checkpoint import load_checkpoint


def live_holder(d):
    "A live process that claims run directory `d` and sleeps (another run using it)."
    p = subprocess.Popen([sys.executable, '-c', f"import time; from netlite_nb.checkpoint import claim_run_dir; claim_run_dir({str(d)!r}); "
                          "print('claimed', flush=True); time.sleep(60)"], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'claimed'
    return p


def test_r2_a_run_directory_another_live_run_holds_is_refused_before_anything_is_written(tmp_path):
    p = live_holder(tmp_path / 'r')
    try: fails(lambda: Trainer(mlp(), loaders(), run_dir=tmp_path / 'r', **KW).fit(steps=1), 'is in use by process', str(p.pid),
               'Give this run another directory', exc=RuntimeError)
    finally: p.kill(); p.wait()
    assert sorted(q.name for q in (tmp_path / 'r').iterdir()) == ['.netlite.lock']   # no config.yaml, no metrics, no checkpoint
    t = Trainer(mlp(), loaders(), run_dir=tmp_path / 'r', **KW).fit(steps=1)   # its holder was killed: the stale lock is taken over
    assert t.step == 1 and not (tmp_path / 'r' / '.netlite.lock').exists()     # and released when fit ends


def test_r2_a_new_run_never_writes_into_another_runs_files(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, lr_schedule=None, **KW).fit(steps=2)
    before = (tmp_path / 'step-0000002' / 'model.safetensors').read_bytes()
    fails(lambda: Trainer(mlp(), loaders(), run_dir=tmp_path, lr_schedule=None, **KW).fit(steps=3), 'holds another run', 'Resume it', exc=RuntimeError)
    assert (tmp_path / 'step-0000002' / 'model.safetensors').read_bytes() == before and not (tmp_path / 'step-0000003').exists()
    assert t.fit(steps=1).step == 3     # the same trainer continues its own run
    assert Trainer(mlp(), loaders(), run_dir=tmp_path, lr_schedule=None, **KW).fit(steps=1, resume=tmp_path).step >= 3   # a resume is no new run


def test_r2_two_cli_runs_given_the_same_out_one_refused_and_default_names_unique_in_one_second(tmp_path):
    cfg = run_config(tmp_path, 3)
    ps = [subprocess.Popen(CLI + ['train', str(cfg), '--quiet', '--out', str(tmp_path / 'r')], env=ENV, cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    res = sorted((p.wait(timeout=600), p.stderr.read()) for p in ps)
    assert [rc for rc, _ in res] == [0, 1], res
    assert ('is in use by process' in res[1][1] or 'holds another run' in res[1][1]) and 'Traceback' not in res[1][1]
    from netlite_nb.checkpoint import new_run_dir
    assert len({new_run_dir(tmp_path / 'runs', 'mlp') for _ in range(4)}) == 4


class Sigterm(Callback):
    "Send this process a real SIGTERM (docker stop, Kubernetes, SLURM, systemd, torchrun) after step `at`."
    def __init__(self, at): self.at = at
    def after_step(self, t):
        if t.step == self.at: os.kill(os.getpid(), signal.SIGTERM)


def test_r2_sigterm_stops_the_trainer_with_a_checkpoint_and_resume_is_exact(tmp_path):
    torch.manual_seed(0); full = Trainer(mlp(), loaders(), run_dir=tmp_path / 'a', checkpoint_every=100, log_every=1, **KW).fit(steps=8)
    torch.manual_seed(0); cut = Trainer(mlp(), loaders(), run_dir=tmp_path / 'b', checkpoint_every=100, log_every=1, callbacks=[Sigterm(3)], **KW).fit(steps=8)
    assert cut.interrupted and cut.stop_signal == 'SIGTERM' and find_checkpoint(tmp_path / 'b').name == 'step-0000003'
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL     # the handler is put back after fit
    torch.manual_seed(0); res = Trainer(mlp(), loaders(), run_dir=tmp_path / 'b', checkpoint_every=100, log_every=1, **KW).fit(steps=8, resume=tmp_path / 'b')
    assert losses(res)[-5:] == losses(full)[-5:]


def loading_torch(p)->bool:
    "True once process `p` has begun loading torch's libraries: inside `netlite`'s main, whose commands import it (seconds)."
    try: return 'libtorch' in Path(f'/proc/{p.pid}/maps').read_text()
    except OSError: return False


def cli_signal(tmp_path, args, sig, when):
    "`netlite ARGS` sent `sig` when `when()` is true: exit status and stderr."
    # a job a shell started in the background inherits SIGINT ignored, and Python keeps it so: give the CLI a terminal's default
    p = subprocess.Popen(CLI + args, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    while not when(p) and p.poll() is None and time.time() - t0 < 300: time.sleep(0.02)
    p.send_signal(sig)
    _, err = p.communicate(timeout=300)
    return p.returncode, err


def test_r2_sigterm_stops_netlite_train_with_a_checkpoint_a_sentence_and_143(tmp_path):
    cfg, run = run_config(tmp_path, 400), tmp_path / 'r'
    rc, err = cli_signal(tmp_path, ['train', str(cfg), '--quiet', '--out', str(run)], signal.SIGTERM, lambda p: (run / 'latest').exists())
    assert rc == 143 and 'SIGTERM' in err and 'Traceback' not in err, err[-2000:]
    assert '--resume' in err and find_checkpoint(run).name >= 'step-0000001'


@pytest.mark.parametrize('sig,rc', [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_r2_a_signal_while_the_cli_imports_is_a_sentence(tmp_path, sig, rc):
    got, err = cli_signal(tmp_path, ['plan', '--model', 'mlp'], sig, loading_torch)
    assert got == rc and 'Traceback' not in err and 'netlite' in err, err[-2000:]


def small_disk(tmp_path, size):
    "A tmpfs of `size` at tmp_path/disk: a real full disk (root only)."
    if os.geteuid() != 0: pytest.skip('a real full disk needs a tmpfs mount, which needs root')
    d = tmp_path / 'disk'; d.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(d)], capture_output=True, text=True)
    if r.returncode != 0: pytest.skip(f"mount -t tmpfs failed: {r.stderr.strip()[:200]}")
    return d


def test_r2_a_real_full_disk_is_a_sentence_and_the_last_checkpoint_stays(tmp_path):
    d = small_disk(tmp_path, '2m')
    try:
        run = d / 'r'; t = Trainer(mlp(hidden=256), loaders(), run_dir=run, log_every=1, lr_schedule=None, keep_checkpoints=5, **KW).fit(steps=1)
        weights = (run / 'step-0000001' / 'model.safetensors').stat().st_size
        assert weights > 24 * 1024
        (d / 'filler').write_bytes(b'\0' * (shutil.disk_usage(d).free - 12 * 1024))   # room for config.yaml and the log, not the weights
        e = fails(lambda: t.fit(steps=1), 'No space left on device while writing', 'step-0000001 is still valid', exc=OSError)
        assert e.errno == errno.ENOSPC and not [p for p in run.iterdir() if '.tmp-' in p.name]   # the half-written one removed
        (d / 'filler').unlink()
        assert Trainer(mlp(hidden=256), loaders(), run_dir=run, log_every=1, lr_schedule=None, **KW).fit(steps=2, resume=run).step == 2
    finally: subprocess.run(['umount', '-l', str(d)])


def test_r2_rotation_deletes_only_the_names_the_library_wrote(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, keep_checkpoints=1, **KW).fit(steps=2)
    shutil.copytree(tmp_path / 'step-0000002', tmp_path / 'step-0000002-good')
    (tmp_path / 'step-keep').mkdir()
    t.fit(steps=2)
    assert sorted(p.name for p in tmp_path.glob('step-*')) == ['step-0000002-good', 'step-0000004', 'step-keep']


def rewrite_state(ck, f):
    "Apply `f` to checkpoint `ck`'s state.pt and drop its manifest (as a tool that rewrote it would)."
    s = torch.load(ck / 'state.pt', weights_only=True); f(s); torch.save(s, ck / 'state.pt'); (ck / 'manifest.json').unlink()


def test_r2_a_newer_state_format_is_refused(tmp_path):
    Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=2)
    rewrite_state(tmp_path / 'step-0000002', lambda s: s.update(format=99))
    fails(lambda: read_state(tmp_path), 'format 99', 'newer netlite_nb', 'Upgrade', exc=ValueError)


def test_r2_a_resume_in_another_dtype_is_refused_with_the_dtypes_named(tmp_path):
    Trainer(mlp().double(), [(x.double(), y) for x, y in loaders()[0]], run_dir=tmp_path, lr_schedule=None, **KW).fit(steps=2)
    t = Trainer(mlp(), loaders(), lr_schedule=None, **KW)
    before = [p.clone() for p in t.model.parameters()]
    fails(lambda: t.fit(steps=3, resume=tmp_path), 'float64', 'float32', 'Nothing was loaded', exc=ValueError)
    assert all(torch.equal(p, q) for p, q in zip(before, t.model.parameters()))


def test_r2_a_damaged_metrics_line_never_blocks_a_resume(tmp_path):
    class Stop(Callback):
        def after_step(self, t):
            if t.step == 5: raise KeyboardInterrupt
    Trainer(mlp(), loaders(), run_dir=tmp_path, log_every=1, callbacks=[Stop()], **KW).fit(steps=8)
    lines = (tmp_path / 'metrics.jsonl').read_text().splitlines(); lines[1] = '{"step": 2, "lo\x00ss": garbage'
    (tmp_path / 'metrics.jsonl').write_text('\n'.join(lines) + '\n')
    with pytest.warns(UserWarning, match='line 2 is damaged'):
        t = Trainer(mlp(), loaders(), run_dir=tmp_path, log_every=1, **KW).fit(steps=8, resume=tmp_path)
    assert t.step == 8 and all(isinstance(json.loads(l), dict) for l in (tmp_path / 'metrics.jsonl').read_text().splitlines())


def test_r2_writes_never_follow_planted_symlinks(tmp_path):
    victim, elsewhere, run = tmp_path / 'victim.txt', tmp_path / 'elsewhere.jsonl', tmp_path / 'shared'
    victim.write_text('precious')
    t = Trainer(mlp(), loaders(), run_dir=run, log_every=1, **KW).fit(steps=1)
    for name in ('.config.yaml.tmp', f'.config.yaml.tmp-{os.getpid()}', f'.latest.tmp-{os.getpid()}'): (run / name).symlink_to(victim)
    (run / 'metrics.jsonl').unlink(); (run / 'metrics.jsonl').symlink_to(elsewhere)   # dangling: following it creates a file elsewhere
    t.fit(steps=2)
    assert victim.read_text() == 'precious' and not elsewhere.exists()
    assert not (run / 'metrics.jsonl').is_symlink() and len((run / 'metrics.jsonl').read_text().splitlines()) >= 3


def test_r2_a_compressed_state_pt_is_refused_before_it_inflates(tmp_path):
    Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=1)
    ck = tmp_path / 'step-0000001'; raw = ck / 'state.pt'
    with zipfile.ZipFile(raw) as z: entries = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(raw, 'w', zipfile.ZIP_DEFLATED) as z:
        for n, b in entries: z.writestr(n, b)
    (ck / 'manifest.json').unlink()
    fails(lambda: load_checkpoint(tmp_path, mlp()), 'compressed entries', 'torch.save never writes', exc=ValueError)


@pytest.mark.parametrize('mode', ['I;16', 'F'])
def test_r2_16_bit_and_float_images_keep_their_values(tmp_path, mode):
    import numpy as np
    from PIL import Image
    from netlite_nb.data import image_folder
    for c in ('a', 'b'):
        (tmp_path / c).mkdir()
        for i in range(3):
            a = np.full((8, 8), 0.531)
            (Image.fromarray((a * 65535).astype(np.uint16)) if mode == 'I;16' else Image.fromarray(a.astype(np.float32), 'F')).save(tmp_path / c / f"{i}.{'png' if mode == 'I;16' else 'tif'}")
    assert Image.open(next((tmp_path / 'a').iterdir())).mode == mode
    tr, va = image_folder(tmp_path, size=8, channels=1)
    assert abs(float(tr[0][0].mean()) - 0.531) < 0.01


def test_r2_a_failed_onnx_export_never_replaces_the_good_file(tmp_path):
    from netlite_nb.export import ExportError, export_onnx
    class Noisy(nn.Module):
        def __init__(self): super().__init__(); self.l = nn.Linear(20, 10)
        def forward(self, x): return self.l(x) + torch.randn(x.shape[0], 10)   # never the same twice: parity fails
    x = torch.randn(16, 20)
    good = export_onnx(nn.Linear(20, 10).eval(), x, tmp_path / 'm.onnx', measure_speed=False)
    before = (tmp_path / 'm.onnx').read_bytes()
    with pytest.raises(ExportError, match='does not compute what PyTorch computes'):
        export_onnx(Noisy().eval(), x, tmp_path / 'm.onnx', measure_speed=False)
    assert (tmp_path / 'm.onnx').read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ['m.onnx']
    assert good.path == tmp_path / 'm.onnx'


def test_r2_a_full_disk_during_an_onnx_export_is_a_sentence_and_leaves_nothing(tmp_path):
    from netlite_nb.export import export_onnx
    d = small_disk(tmp_path, '256k')
    try:
        e = fails(lambda: export_onnx(nn.Sequential(nn.Linear(20, 4096), nn.ReLU(), nn.Linear(4096, 10)).eval(), torch.randn(16, 20), d / 'm.onnx',
                                      measure_speed=False), 'No space left on device while writing', 'm.onnx', exc=OSError)
        assert e.errno == errno.ENOSPC and list(d.iterdir()) == []   # no truncated .onnx, no staging directory
    finally: subprocess.run(['umount', '-l', str(d)])


def test_r2_a_configuration_file_is_bounded_before_it_is_read(tmp_path):
    from netlite_nb.strategies import ConfigError, load_config
    p = tmp_path / 'big.yaml'; p.write_text('strategy: cpu\n' + '# padding\n' * 40_000)   # 400 KB of comments
    fails(lambda: load_config(p), 'bytes', 'CONFIG_BYTES', exc=ConfigError)


def test_r2_a_long_plain_list_is_not_called_an_alias_bomb(monkeypatch):
    import netlite_nb.strategies as strategies
    monkeypatch.setattr(strategies, 'YAML_LIMIT', 1000)
    assert len(strategies.load_yaml('[' + ', '.join(['1'] * 3000) + ']')) == 3000
    fails(lambda: strategies.load_yaml(laughs(4, 'x: *d')), 'billion laughs', exc=strategies.ConfigError)   # 9^4 from 40 nodes: still refused


@pytest.mark.parametrize('encoding,rc,words', [('utf-16', 0, None), ('latin-1', 2, 'is not UTF-8 text')])
def test_r2_utf16_and_latin1_configurations(tmp_path, encoding, rc, words):
    (tmp_path / 'c.yaml').write_bytes("# réglages\nstrategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample}\ntrain: {steps: 1}\n".encode(encoding))
    got, out, err = netlite('train', str(tmp_path / 'c.yaml'), '--out', str(tmp_path / 'r'), '--quiet')
    assert got == rc and 'Traceback' not in err and (words is None or words in err), err[-2000:]


@pytest.mark.parametrize('line,words', [
    ('data: {name: mnist_sample, batch_size: 0}', 'data.batch_size must be a whole number of samples, at least 1'),
    ('data: {name: mnist_sample, batch_size: -8}', 'data.batch_size must be a whole number of samples, at least 1'),
    ('data: {name: mnist_sample, batch_size: 100000}', 'more than the 4000 training samples'),
    ('data: {name: mnist_sample}\ntrain: {steps: 1, seed: 1180591620717411303424}', 'train.seed must be a whole number')])
def test_r2_bad_cli_values_are_a_sentence_naming_the_key(tmp_path, line, words):
    text = "strategy: cpu\nmodel: {name: mlp}\n" + line + ("\ntrain: {steps: 1}\n" if 'train:' not in line else '\n')
    (tmp_path / 'c.yaml').write_text(text)
    rc, out, err = netlite('train', str(tmp_path / 'c.yaml'), '--out', str(tmp_path / 'r'), '--quiet')
    assert rc == 2 and words in err and 'Traceback' not in err, err[-2000:]


def test_r2_world_size_two_and_netlite_traceback_0(tmp_path, monkeypatch):
    (tmp_path / 'c.yaml').write_text("strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample}\ntrain: {steps: 1}\n")
    monkeypatch.setenv('NETLITE_TRACEBACK', '0'); monkeypatch.setenv('RANK', '0'); monkeypatch.setenv('WORLD_SIZE', 'two')
    rc, out, err = netlite('train', str(tmp_path / 'c.yaml'), '--out', str(tmp_path / 'r'), '--quiet')
    assert rc == 1 and "WORLD_SIZE is 'two'" in err and 'Traceback' not in err, err[-2000:]


@pytest.mark.parametrize('batch,words', [
    ({'x': torch.zeros(4, 20), 'y': torch.zeros(4, dtype=torch.long)}, 'is a dict'),
    ((torch.zeros(4, 20), torch.zeros(4, dtype=torch.long), torch.ones(4)), 'has 3 parts'),
    (torch.zeros(4, 20), 'inputs without targets'),
    ((torch.tensor(1.), torch.tensor(0)), '0-dim')])
def test_r2_loader_batches_of_another_shape_are_a_sentence(batch, words):
    from netlite_nb.data import DataCheckError
    fails(lambda: Trainer(mlp(), [batch] * 3, **KW).fit(steps=1), words, '(inputs, targets) pairs' if words != '0-dim' else 'one row per sample',
          exc=DataCheckError)


@pytest.mark.slow
def test_r2_sigterm_to_netlite_train_under_torchrun_stops_every_process_with_a_checkpoint(tmp_path):
    "torchrun, stopped by SIGTERM, sends it to its processes: they agree on one step, process 0 saves, and netlite says so (143)."
    (tmp_path / 'c.yaml').write_text("strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 64}\ntrain: {steps: 5000, checkpoint_every: 50}\n")
    run = tmp_path / 'r'
    rc, err = cli_signal(tmp_path, ['train', str(tmp_path / 'c.yaml'), '--nproc-per-node', '2', '--out', str(run), '--quiet'], signal.SIGTERM,
                         lambda p: (run / 'latest').exists())
    assert rc == 143 and 'stopped by SIGTERM; every process saved the last finished step' in err and 'Traceback' not in err, err[-3000:]
    assert 'Unable to shutdown' not in err   # no process was still training when torchrun's 30 s grace ran out
    assert 50 <= read_state(run)['step'] < 5000
