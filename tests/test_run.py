"Chapter 10's recipes: a configuration sized by the planner only where the file left it open, and the demo's accuracy target."
import pytest, yaml
from netlite_nb.run import run_demo, train_from_config
from netlite_nb.train import Callback
from test_cli import SMALL


def test_train_from_config_sizes_only_what_the_file_left_open(tmp_path):
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


def test_a_run_s_config_yaml_repeats_it(tmp_path):
    "Chapter 06 says a run's config.yaml repeats the run: train, then train again from the file it wrote."
    first = train_from_config(yaml.safe_load(SMALL), run_dir=tmp_path / 'first', progress=False, verbose=False)
    written = yaml.safe_load((tmp_path / 'first' / 'config.yaml').read_text())
    again = train_from_config(tmp_path / 'first' / 'config.yaml', run_dir=tmp_path / 'again', progress=False, verbose=False)
    assert (again.micro_batch, again.accum_steps, again.step) == (first.micro_batch, first.accum_steps, first.step)
    assert yaml.safe_load((tmp_path / 'again' / 'config.yaml').read_text())['run'] == written['run']
    assert any('the configuration a run saved' in n for n in again.notes)
    from_mapping = train_from_config(written, ['train.steps=1'], run_dir=tmp_path / 'm', progress=False, verbose=False)   # its mapping too
    assert from_mapping.step == 1 and from_mapping.micro_batch == first.micro_batch


def test_the_demo_s_config_yaml_says_how_to_repeat_it(tmp_path):
    run_demo(run_dir=tmp_path / 'demo', steps=1, seed=3, export=False, progress=False, verbose=False)
    with pytest.raises(ValueError, match='netlite demo --seed 3') as e:
        train_from_config(tmp_path / 'demo' / 'config.yaml')
    assert 'netlite train --example demo' in str(e.value)   # issue 37: and how to make it a configuration


@pytest.mark.slow
def test_demo_reaches_target_accuracy(tmp_path, request):
    r = run_demo(run_dir=tmp_path / 'demo', progress=False)
    print(r)
    assert r.accuracy >= 0.975, r


def test_every_output_of_a_run_lands_in_its_run_directory(tmp_path, monkeypatch):
    "A relative export.onnx is a switch, not a path from the working directory: two runs never overwrite one file."
    monkeypatch.chdir(tmp_path)
    cfg = yaml.safe_load(SMALL)
    cfg = {**cfg, 'strategy': 'cpu', 'export': {'onnx': 'model.onnx', 'quantize': 'int8'}}
    a = train_from_config(cfg, run_dir=tmp_path / 'a', progress=False, verbose=False)
    b = train_from_config(cfg, ['export.onnx=true', 'export.quantize=null'], run_dir=tmp_path / 'b', progress=False, verbose=False)
    assert a.export_report.path == tmp_path / 'a' / 'onnx' / 'mlp.int8.onnx' and a.export_report.fp32_path == tmp_path / 'a' / 'onnx' / 'mlp.fp32.onnx'
    assert b.export_report.path == tmp_path / 'b' / 'onnx' / 'mlp.fp32.onnx'
    assert not (tmp_path / 'model.onnx').exists() and not list(tmp_path.glob('*.onnx'))
    elsewhere = tmp_path / 'shipped' / 'm.onnx'; elsewhere.parent.mkdir()
    c = train_from_config(cfg, [f'export.onnx={elsewhere}'], run_dir=tmp_path / 'c', progress=False, verbose=False)
    assert c.export_report.path == elsewhere                             # an absolute path is taken as written


def test_the_demo_exports_into_runs_demo_onnx(tmp_path):
    r = run_demo(run_dir=tmp_path / 'demo', steps=3, progress=False, verbose=False)
    assert r.export.path == tmp_path / 'demo' / 'onnx' / 'netlite_tiny.int8.onnx'
    assert r.export.fp32_path == tmp_path / 'demo' / 'onnx' / 'netlite_tiny.fp32.onnx' and r.export.fp32_path.is_file()
    rows = r.rows()   # both files in the summary, by absolute path, and how to run one
    assert ('ONNX', str(r.export.path.resolve())) in rows and ('ONNX fp32', str(r.export.fp32_path.resolve())) in rows
    assert any(k == 'Next' and 'onnxruntime' in v and str(r.export.path.resolve()) in v for k, v in rows)
    # issue 37: `--resume` of the finished run trains nothing, shows what it recorded and leaves its ONNX files alone
    stamps = {f: f.stat().st_mtime_ns for f in (r.export.path, r.export.fp32_path)}
    again = run_demo(run_dir=tmp_path / 'demo', steps=3, progress=False, verbose=False, resume=True)
    assert again.finished and (again.steps, again.accuracy, again.valid_loss) == (r.steps, r.accuracy, r.valid_loss)
    assert again.train_seconds == r.train_seconds and again.export.path == str(r.export.path)
    text = str(again)
    assert 'finished at step 3' in text and 'nothing was trained or exported again' in text and 'nan' not in text, text
    assert {f: f.stat().st_mtime_ns for f in stamps} == stamps


def test_a_lora_run_adapts_a_trained_run_resumes_and_exports_merged(tmp_path, capsys):
    "A `lora:` section: the base run's weights frozen, the adapters trained and saved alone, resumed, and `netlite export` merges them."
    from netlite_nb.checkpoint import find_checkpoint
    from netlite_nb.cli import main
    from netlite_nb.lora import is_lora, merged, model_for_export
    import torch
    small = {**yaml.safe_load(SMALL), 'strategy': 'cpu'}
    train_from_config(small, run_dir=tmp_path / 'base', progress=False, verbose=False)
    # a constant schedule, so the resume below may extend the run (a cosine may not: chapter 07c, What may change on resume)
    cfg = {**small, 'lora': {'base': str(tmp_path / 'base'), 'rank': 4, 'train': ['head']}, 'schedule': {'cosine': False}}
    t = train_from_config(cfg, run_dir=tmp_path / 'lora', progress=False, verbose=False)
    assert is_lora(t.model) and t.model.lora_summary.rank == 4 and t.step == 2
    base_ck, ck = find_checkpoint(tmp_path / 'base'), find_checkpoint(tmp_path / 'lora')
    assert yaml.safe_load((tmp_path / 'lora' / 'config.yaml').read_text())['run']['lora']['base'] == str(base_ck.resolve())  # pinned
    assert (ck / 'model.safetensors').stat().st_size < 0.2 * (base_ck / 'model.safetensors').stat().st_size
    again = train_from_config(cfg, ['train.steps=3'], resume=tmp_path / 'lora', progress=False, verbose=False)
    assert again.step == 3 and is_lora(again.model)
    model, info = model_for_export(tmp_path / 'lora')
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad(): assert not is_lora(model) and torch.allclose(model(x), merged(again.model).eval()(x), atol=1e-5)
    assert main(['export', str(tmp_path / 'lora')]) == 0 and (tmp_path / 'lora' / 'onnx' / 'mlp.fp32.onnx').is_file()
    assert 'max |fp32' in capsys.readouterr().out


def test_a_qlora_run_from_a_config_trains_resumes_and_exports(tmp_path):
    "`lora: {base_bits: 4}`: the base held in NF4 while the adapters train; the export rebuilds the same 4-bit base and merges."
    from netlite_nb.lora import is_lora, merged, model_for_export
    import torch
    small = {**yaml.safe_load(SMALL), 'strategy': 'cpu'}
    train_from_config(small, run_dir=tmp_path / 'base', progress=False, verbose=False)
    cfg = {**small, 'lora': {'base': str(tmp_path / 'base'), 'rank': 4, 'train': ['head'], 'base_bits': 4, 'double_quant': True},
           'schedule': {'cosine': False}}
    t = train_from_config(cfg, run_dir=tmp_path / 'q', progress=False, verbose=False)
    assert is_lora(t.model) and t.model.lora_summary.rank == 4
    assert yaml.safe_load((tmp_path / 'q' / 'config.yaml').read_text())['run']['lora']['base_bits'] == 4
    again = train_from_config(cfg, ['train.steps=3'], resume=tmp_path / 'q', progress=False, verbose=False)
    model, _ = model_for_export(tmp_path / 'q')
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad(): assert not is_lora(model) and torch.allclose(model(x), merged(again.model).eval()(x), atol=1e-5)


class _StopAt(Callback):
    "Stop the run after optimizer step `at` (the demo's cosine schedule still ends at its planned step)."
    def __init__(self, at): self.at = at
    def after_step(self, t): t.stop = t.stop or t.step == self.at


def test_the_demo_tells_a_newcomer_what_happened(tmp_path, capsys):
    "Issue 14: the expected duration up front, every file by absolute path, why planned and measured memory differ, what to run next."
    r = run_demo(run_dir=tmp_path / 'demo', steps=8, export=False, progress=False)
    out, d = capsys.readouterr().out, (tmp_path / 'demo').resolve()
    assert out.index('netlite demo: train netlite_tiny') < out.index('forecast:') and 'ms per step here' in out
    rows = r.rows()
    assert ('Config', str(d / 'config.yaml')) in rows and ('Checkpoint', str(d / 'step-0000008')) in rows
    memory = dict(rows)['Memory']
    assert 'planned peak' in memory and 'measured peak' in memory and 'the whole process' in memory, memory
    nxt = [v for k, v in rows if k == 'Next']
    assert nxt[0].startswith(f"netlite export {d} --int8")
    book = [c for c in nxt if 'jupyter lab nbs/' in c]                            # issue 37: `pip install -e .` has no Jupyter
    assert len(book) == 1 and book[0].index('pip install -e ".[dev]"') < book[0].index('jupyter lab'), nxt
    cut = run_demo(run_dir=tmp_path / 'cut', steps=10, export=False, progress=False, verbose=False, callbacks=[_StopAt(6)])
    assert cut.steps == 6                                                         # stopped early, as an interrupt does
    capsys.readouterr()
    again = run_demo(run_dir=tmp_path / 'cut', steps=10, export=False, progress=False, verbose=True, resume=True)
    assert again.steps == 10 and again.checkpoint.endswith('step-0000010')     # --resume continues the saved run
    assert f"resumed from {tmp_path / 'cut' / 'step-0000006'} at step 6 (epoch" in capsys.readouterr().out   # not 'at step 0'
    assert again.resumed_from == 6 and ('Resumed', 'from step 6, where the saved run stopped') in again.rows()   # issue 37


def test_the_trainer_says_what_each_epoch_s_validation_found(capsys):
    from netlite_nb.train import Trainer
    from train_helpers import loaders
    from netlite_nb.fixtures import mlp
    Trainer(mlp(), loaders(), device='cpu', progress=False, plan=False).fit(epochs=2)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith('epoch ')]
    assert [l.split(':')[0] for l in lines] == ['epoch 1', 'epoch 2'] and all('accuracy' in l and 'step ' in l for l in lines), lines


def test_a_run_config_switches_an_offload_on(tmp_path):
    "train.offload reaches the Trainer: half-precision weights, their fp32 masters in the host optimizer (micro-batch fixed: a CPU plan refuses offloads)."
    t = train_from_config(yaml.safe_load(SMALL), ['train.offload=[bf16-weights]', 'optim.name=adamw-offload-grads', 'train.grad_clip=null',
                           'strategy.micro_batch=128'],
                          run_dir=tmp_path / 'a', progress=False, verbose=False)
    import torch
    assert t.opts.offload == ['bf16-weights'] and {p.dtype for p in t.model.parameters()} == {torch.bfloat16}
    assert {h.dtype for h in t.opt.host.values()} == {torch.float32} and t.step == 2
    assert yaml.safe_load((tmp_path / 'a' / 'config.yaml').read_text())['run']['train']['offload'] == ['bf16-weights']


def test_a_run_whose_sizing_took_host_offload_trains_with_it_and_says_so(tmp_path):
    "As `size_config` leaves a run on a card too small for it (chapter 06); here on the CPU, where the mechanisms run as on a card."
    import dataclasses
    from netlite_nb.offload import HostOptimizer
    from netlite_nb.strategies import load_config
    cfg = load_config({'strategy': 'cpu', 'model': {'name': 'mlp'}, 'data': {'batch_size': 32}, 'optim': {'name': 'adamw-offload-grads'},
                       'train': {'steps': 2, 'offload': ['activations']}})
    cfg = dataclasses.replace(cfg, strategy=dataclasses.replace(cfg.strategy, offload=['activations'], reason='sized with host offload'))
    t = train_from_config(cfg, run_dir=tmp_path / 'run', progress=False, verbose=False)
    assert t.step == 2 and isinstance(t.opt, HostOptimizer) and t.opts.clip_grad == 1.0   # the default clip, taken on the host
    assert any("Host offload chosen by the planner" in n and "optimizer 'adamw-offload-grads', train.offload ['activations']" in n for n in t.notes)
    run = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())['run']
    assert (run['optim']['name'], run['train']['offload'], run['strategy']['reason']) == ('adamw-offload-grads', ['activations'], 'sized with host offload')
