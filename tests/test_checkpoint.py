"Chapter 06a through chapter 07's Trainer: exact resume (real SIGINT, augmented chapter 04 loaders, 8-bit optimizer), the files, crash safety."
import os, signal
import pytest, torch, yaml
from torch import nn
import safetensors.torch as st
from netlite_nb.train import Trainer, EarlyStopping
from netlite_nb.checkpoint import find_checkpoint, loader_generators, read_run_config, read_state, save_checkpoint
from netlite_nb.data import make_loaders, LabeledTensors
from netlite_nb.fixtures import mlp
from train_helpers import KW, loaders, losses, Sigint


def test_real_sigint_finishes_the_step_checkpoints_and_resumes_exactly(tmp_path):
    def make(cbs=()):
        torch.manual_seed(3)
        return Trainer(mlp(dropout=0.3), loaders(), lr=3e-3, ema=0.95, run_dir=tmp_path / 'cut', callbacks=cbs, log_every=1, **KW)
    torch.manual_seed(3)
    full = Trainer(mlp(dropout=0.3), loaders(), lr=3e-3, ema=0.95, run_dir=tmp_path / 'full', log_every=1, **KW).fit(epochs=3)
    before = signal.getsignal(signal.SIGINT)  # Python's default_int_handler, or SIG_IGN in a job a shell started in the background
    cut = make([Sigint(17)]).fit(epochs=3)
    assert cut.interrupted and cut.step == 17          # the step in flight finished; no later step started
    assert signal.getsignal(signal.SIGINT) is before   # the handler is put back
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
    assert not any(p.name.startswith('.step-0000004.tmp') for p in tmp_path.iterdir())  # a failed write removes what it half wrote
    t2 = Trainer(mlp(), loaders(), run_dir=tmp_path, **KW).fit(steps=2, resume=tmp_path)
    assert t2.step == 2


def test_early_stopping_state_is_checkpointed(tmp_path):
    es = EarlyStopping(patience=2, min_delta=100.0)
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, callbacks=[es], **KW).fit(epochs=10)
    assert t.stop and t.epoch == 3
    es2 = EarlyStopping(patience=2); Trainer(mlp(), loaders(), run_dir=tmp_path, callbacks=[es2], **KW).load_checkpoint(tmp_path)
    assert (es2.best, es2.wait) == (es.best, es.wait)


def test_resume_exact_with_chapter04_augmented_tensor_loader(tmp_path):
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(640, 1, 12, 12, generator=g), torch.randint(0, 10, (640,), generator=g)
    mk = lambda: make_loaders(LabeledTensors(x[:512], y[:512]), LabeledTensors(x[512:], y[512:]), batch_size=64, augment=True, seed=1)
    net = lambda: (torch.manual_seed(0), nn.Sequential(nn.Flatten(), nn.Linear(144, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 10)))[1]
    assert len(loader_generators(mk().train)) == 2     # the shuffle's and the augmentation's
    full = Trainer(net(), mk(), log_every=1, run_dir=tmp_path / 'a', **KW).fit(epochs=2)
    Trainer(net(), mk(), log_every=1, run_dir=tmp_path / 'b', callbacks=[Sigint(11)], **KW).fit(epochs=2)
    res = Trainer(net(), mk(), log_every=1, run_dir=tmp_path / 'b', **KW).fit(epochs=2, resume=tmp_path / 'b')
    assert losses(res) == losses(full)


def test_resume_exact_with_8bit_optimizer_state(tmp_path):
    def make(d, cbs=()):
        torch.manual_seed(0)
        return Trainer(nn.Sequential(nn.Linear(20, 512), nn.ReLU(), nn.Linear(512, 10)), loaders(), optimizer='adamw8bit',
                       run_dir=tmp_path / d, callbacks=cbs, log_every=1, **KW)
    full = make('a').fit(epochs=2)
    make('b', [Sigint(5)]).fit(epochs=2)
    res = make('b').fit(epochs=2, resume=tmp_path / 'b')
    assert type(res.opt).__name__ == 'AdamW8bit' and losses(res) == losses(full)


def test_state_pt_holds_the_whole_train_state(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, log_every=1, **KW).fit(steps=3)
    s = read_state(tmp_path)
    assert {k: s[k] for k in vars(t.state) if k not in ('elapsed', 'rng_epoch')} == {k: v for k, v in vars(t.state).items() if k not in ('elapsed', 'rng_epoch')}
    assert s['format'] == 1 and s['history'] == t.history and len([r for r in s['history'] if 'loss' in r]) == 3


def test_read_run_config_from_every_place_export_is_given(tmp_path):
    t = Trainer(mlp(), loaders(), run_dir=tmp_path, config={'model': {'name': 'mlp'}}, **KW).fit(steps=1)
    ck = find_checkpoint(tmp_path)
    for p in (tmp_path, ck, ck / 'model.safetensors'): assert read_run_config(p)['run']['model']['name'] == 'mlp'
    assert read_run_config(tmp_path)['micro_batch'] == 64
    assert find_checkpoint(tmp_path, weights_only=True) == ck


def test_checkpoint_files_get_the_umask_mode(tmp_path):
    "safetensors' own writer makes its files 0600; a checkpoint's files all get the mode the umask gives (0644 under 022)."
    old = os.umask(0o022)
    try: ck = save_checkpoint(tmp_path / 'run', 1, nn.Linear(3, 2), ema=nn.Linear(3, 2))
    finally: os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in ck.iterdir() if p.is_file()}
    assert modes['model.safetensors'] == modes['ema.safetensors'] == modes['state.pt'] == 0o644, modes
