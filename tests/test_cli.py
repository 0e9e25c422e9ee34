"The `netlite` command (chapter 11) in a subprocess: demo, train from a configuration, resume, sizing by the planner."
from train_helpers import image_folder
import os, subprocess, sys
from pathlib import Path
import yaml
from netlite_nb.checkpoint import find_checkpoint
from netlite_nb.fixtures import split_budget_gb
from netlite_nb.models import create_model

ROOT = Path(__file__).resolve().parents[1]
# a memory the 128-sample batch does not fit on this CPU (the planner's CPU kernel workspace differs by CPU): the planner must split it
SMALL = (f"strategy: {{name: auto, device: cpu, precision: fp32, memory_gb: {split_budget_gb(create_model('mlp'), (1, 28, 28), 128, 0.5):.6f}, budget_fraction: 0.5}}\n"
         "model: {name: mlp}\ndata: {name: mnist_sample, batch_size: 128}\ntrain: {steps: 2}\n")


def netlite(*args, timeout=600):
    env = {**os.environ, 'PYTHONPATH': str(ROOT)}
    return subprocess.run([sys.executable, '-c', 'import sys; from netlite_nb.cli import main; sys.exit(main(sys.argv[1:]))', *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_cli_demo_quick(tmp_path):
    r = netlite('demo', '--steps', '5', '--no-export', '--out', str(tmp_path / 'demo'))
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'Held-out accuracy' in r.stdout and find_checkpoint(tmp_path / 'demo').name == 'step-0000005'
    cfg = yaml.safe_load((tmp_path / 'demo' / 'config.yaml').read_text())
    assert cfg['run']['model']['name'] == 'netlite_tiny'


def test_cli_train_config_and_resume(tmp_path):
    cfg = tmp_path / 'run.yaml'
    # a constant schedule may be extended on resume; a cosine one may not (chapter 07c, What may change on resume)
    cfg.write_text('strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 128}\ntrain: {steps: 6, ema: 0.9}\n'
                   'schedule: {cosine: false}\n')
    r = netlite('train', str(cfg), '--set', 'optim.lr=0.002', '--out', str(tmp_path / 'run'))
    assert r.returncode == 0, r.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())
    assert saved['run']['optim']['lr'] == 0.002 and saved['run']['train']['steps'] == 6 and saved['effective_batch'] == 128
    r = netlite('train', str(cfg), '--set', 'train.steps=8', '--resume', str(tmp_path / 'run'))
    assert r.returncode == 0, r.stderr[-3000:]
    assert find_checkpoint(tmp_path / 'run').name == 'step-0000008'
    assert 'resumed at step 6; 8 optimizer steps' in r.stdout and 'step-0000006 at step 6 (epoch' in r.stdout + r.stderr   # issue 37
    r = netlite('train', str(cfg), '--set', 'train.epoch=1')
    assert r.returncode != 0 and 'epochs' in r.stderr      # unknown keys name the closest valid one (chapter 06)


def test_cli_train_auto_sizes_the_batch_for_the_model(tmp_path):
    cfg = tmp_path / 'small.yaml'
    cfg.write_text(SMALL)
    r = netlite('train', str(cfg), '--quiet', '--out', str(tmp_path / 'run'), '--set', 'schedule.cosine=false')  # extended below
    assert r.returncode == 0, r.stderr[-3000:]
    saved = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())
    s = saved['run']['strategy']
    assert s['micro_batch'] < 128 and s['micro_batch'] * s['accum_steps'] == 128 == saved['effective_batch']
    assert (saved['micro_batch'], saved['accum_steps']) == (s['micro_batch'], s['accum_steps']) and 'planner fits' in s['reason']
    r = netlite('train', str(cfg), '--quiet', '--set', 'train.steps=3', '--set', 'schedule.cosine=false', '--resume', str(tmp_path / 'run'))   # keeps the run's split
    assert r.returncode == 0, r.stderr[-3000:]
    again = yaml.safe_load((tmp_path / 'run' / 'config.yaml').read_text())
    assert (again['micro_batch'], again['accum_steps']) == (saved['micro_batch'], saved['accum_steps'])
    assert find_checkpoint(tmp_path / 'run').name == 'step-0000003'


# --- issue 15: the planner for cards you do not own, --json, --version, exit statuses, a run's config.yaml -----------

import contextlib, io, json, re
import pytest
from netlite_nb.cli import main
from netlite_nb.models import list_models
from netlite_nb.probe import gpu_catalogue


def run_main(*args):
    "`netlite ARGS` in this process: (exit status, stdout, stderr); argparse's own exits count as the status."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: rc = main(list(args))
        except SystemExit as e: rc = e.code
    return rc, out.getvalue(), err.getvalue()


def test_plan_suggest_for_a_card_this_machine_lacks():
    "The issue's command: plan and suggest for a GTX 1050 Ti on a CPU-only machine (it crashed in autocast)."
    rc, out, err = run_main('plan', '--model', 'vit_tiny', '--batch-size', '4096', '--gpu', 'gtx 1050 ti', '--suggest')
    assert rc == 1 and err == '' and 'does NOT fit' in out          # 1: it does not fit, and says what would
    assert 'largest batch that fits:' in out and out.count('  - ') >= 3
    offloads = [l for l in out.splitlines() if l.startswith('  - ') and 'chapter 03a' in l]   # host offload, priced like any lever
    moved = [l for l in offloads if 'inside backward' not in l]                                 # the step inside backward moves nothing
    assert moved and all(' slower' in l and 'in host memory (' in l and 'over the bus a step)' in l for l in moved), offloads
    assert any('holds 0 B' not in l and 'holds nothing' not in l for l in moved)


def test_plan_checks_offloads_against_the_host_ram_given():
    "`--host-ram` plans the offloads for that host: the same card plan, host rows checked against its share (chapter 03a), exit 1 when they do not fit."
    from netlite_nb.offload import host_budget
    args = ('plan', '--model', 'vit_tiny', '--batch-size', '64', '--gpu', 'gtx 1050 ti', '--optimizer', 'adamw8bit-offload-grads', '--json')
    rc, out, _ = run_main(*args)
    here = json.loads(out)['plan']
    assert rc == 0 and here['host_budget'] == host_budget() and here['host_held'] > 0 and here['host_fits'] is True
    rc, out, _ = run_main(*args, '--host-ram', '0.001')
    tiny = json.loads(out)['plan']
    assert rc == 1 and tiny['host_budget'] == host_budget(int(0.001 * 2**30)) and tiny['host_held'] == here['host_held'] and tiny['host_fits'] is False
    assert tiny['total'] == here['total'] and any('host memory' in n for n in tiny['notes'])


GRID_GPUS = ['GeForce GTX 1050 Ti', 'Radeon RX 6600', 'Apple M2', 'Intel Arc A770']

@pytest.mark.parametrize('gpu', [pytest.param(g, marks=[] if g == 'GeForce GTX 1050 Ti' else pytest.mark.slow) for g in GRID_GPUS])
@pytest.mark.parametrize('model', [pytest.param(m, marks=[] if m == 'mlp' else pytest.mark.slow) for m in list_models()])
def test_every_zoo_model_plans_and_suggests(model, gpu):
    "Every zoo model × --suggest × catalogue cards of each vendor (the fast run keeps mlp on the GTX 1050 Ti)."
    shape = '3x32x32' if model == 'resnet' else '1x28x28'
    rc, out, err = run_main('plan', '--model', model, '--input', shape, '--batch-size', '8', '--gpu', gpu, '--suggest', '--json')
    assert rc in (0, 1) and err == '', err
    d = json.loads(out)
    assert d['plan']['device'] == gpu and d['plan']['fits'] == (rc == 0) and (d['suggest']['largest_batch'] or 0) >= 8 * (rc == 0)


def test_version():
    rc, out, _ = run_main('--version')
    assert rc == 0 and out.startswith('netlite_nb ') and 'torch' in out


def test_gpu_list_text_and_json():
    rc, out, _ = run_main('plan', '--gpu', 'list')
    assert rc == 0 and all(g.name in out for g in gpu_catalogue())
    rc, out, _ = run_main('plan', '--gpu', 'LIST', '--json')
    assert rc == 0 and [g['name'] for g in json.loads(out)] == [g.name for g in gpu_catalogue()]


def test_plan_json():
    rc, out, err = run_main('plan', '--model', 'mlp', '--batch-size', '32', '--gpu', 'rtx 2080', '--json')
    d = json.loads(out)
    assert rc == 0 and d['plan']['fits'] is True and d['plan']['budget'] == 8 * 2**30 and d['suggest'] is None
    assert d['plan']['batch_size'] == 32 and d['plan']['total'] == sum(d['plan']['breakdown'].values())


def test_plan_calibrate_measures_on_this_machine_and_says_so(tmp_path):
    env = {**os.environ, 'PYTHONPATH': str(ROOT), 'XDG_CACHE_HOME': str(tmp_path)}
    r = subprocess.run([sys.executable, '-c', 'import sys; from netlite_nb.cli import main; sys.exit(main(sys.argv[1:]))', 'plan', '--model', 'netlite_tiny',
                        '--batch-size', '16', '--gpu', 'cpu', '--calibrate', '--json'], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    notes = json.loads(r.stdout)['plan']['notes']
    assert any('measured on this machine' in n for n in notes) and list((tmp_path / 'netlite_nb').glob('kernels-*.json'))


@pytest.mark.parametrize('args,says', [
    (['plan', '--input', '28x28'], 'CxHxW, e.g. 1x28x28'), (['plan', '--input', '3x32x30'], 'square'),
    (['plan', '--batch-size', '0'], 'at least 1'),
    (['plan', '--precision', 'fp8'], 'invalid choice'), (['export'], 'required'), (['nonsense'], 'invalid choice'),
    (['plan', '--optimizer', 'adam-offload'], 'optionally followed by -offload'), (['plan', '--host-ram', '0'], 'positive number'), (['plan', '--host-ram', 'inf'], 'positive number')])
def test_argparse_usage_errors_exit_2(args, says):
    rc, out, err = run_main(*args)
    assert rc == 2 and says in err and 'Traceback' not in err


@pytest.mark.parametrize('args,says', [
    (['plan', '--gpu', 'rtx 2080 super'], 'is not in the catalogue'), (['plan', '--gpu', '1060'], 'is ambiguous'),
    (['plan', '--model', 'resnet5'], "Did you mean 'resnet'? Available: mlp"), (['train', 'no_such.yaml'], 'No run configuration'), (['train', 'BAD'], "Did you mean 'train.epochs'")])
def test_our_usage_errors_exit_2_with_one_line_naming_the_cli_fix(args, says, tmp_path):
    if 'BAD' in args:   # a configuration with an unknown key
        (tmp_path / 'bad.yaml').write_text('model: {name: mlp}\ntrain: {epoch: 1}\n')
        args = ['train', str(tmp_path / 'bad.yaml')]
    rc, out, err = run_main(*args)
    assert rc == 2 and says in err and err.count('\n') == 1 and err.startswith(f'netlite {args[0]}: '), err
    assert 'gpu_catalogue' not in err and 'Traceback' not in err
    if 'gpu' in args: assert '`netlite plan --gpu list`' in err


def test_runtime_errors_exit_1_with_one_sentence(tmp_path):
    rc, out, err = run_main('export', str(tmp_path / 'no_run'))
    assert rc == 1 and err.startswith('netlite export: No checkpoint') and err.count('\n') == 1
    run = tmp_path / 'run' / 'step-0000001'; run.mkdir(parents=True)
    (run / 'model.safetensors').write_bytes(b'not safetensors')
    rc, out, err = run_main('export', str(tmp_path / 'run'), '--model', 'mlp')
    assert rc == 1 and err.startswith('netlite export: ') and err.count('\n') == 1 and 'Traceback' not in err


def test_train_json_then_repeat_from_the_run_s_config_yaml(tmp_path):
    cfg = tmp_path / 'run.yaml'
    cfg.write_text('strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 64}\ntrain: {steps: 3}\n')
    rc, out, err = run_main('train', str(cfg), '--json', '--out', str(tmp_path / 'first'))
    first = json.loads(out)
    assert rc == 0 and first['steps'] == 3 and first['run_dir'] == str(tmp_path / 'first') and 'valid_loss' in first['metrics']
    written = tmp_path / 'first' / 'config.yaml'
    r = netlite('train', str(written), '--set', 'train.steps=4', '--out', str(tmp_path / 'again'))   # the file chapter 06 says repeats a run
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'the configuration a run saved' in r.stdout and find_checkpoint(tmp_path / 'again').name == 'step-0000004'
    again = yaml.safe_load((tmp_path / 'again' / 'config.yaml').read_text())
    before = yaml.safe_load(written.read_text())
    assert again['run'] == {**before['run'], 'train': {**before['run']['train'], 'steps': 4}}


def test_export_json(tmp_path):
    cfg = tmp_path / 'run.yaml'
    cfg.write_text('strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 64}\ntrain: {steps: 2}\n')
    assert run_main('train', str(cfg), '--quiet', '--out', str(tmp_path / 'run'))[0] == 0
    rc, out, err = run_main('export', str(tmp_path / 'run'), '--json', '--out', str(tmp_path / 'm.onnx'))
    d = json.loads(out)
    assert rc == 0 and d['path'] == str(tmp_path / 'm.onnx') and d['precision'] == 'fp32' and d['size'] > 0
    assert d['max_abs_diff']['fp32'] <= d['tolerance']['fp32']


def test_an_unknown_strategy_names_the_cli_lists_and_train_lists_them(tmp_path):
    from netlite_nb.strategies import list_strategies
    (tmp_path / 'v.yaml').write_text('strategy: voodoo_3\nmodel: {name: mlp}\ntrain: {steps: 1}\n')
    rc, out, err = run_main('train', str(tmp_path / 'v.yaml'))
    assert rc == 2 and err.count('\n') == 1 and err.startswith("netlite train: No strategy or GPU called 'voodoo_3'")
    assert '`netlite train --list-strategies`' in err and '`netlite plan --gpu list`' in err
    assert 'list_strategies()' not in err and 'gpu_catalogue' not in err
    rc, out, err = run_main('train', '--list-strategies')
    assert rc == 0 and all(f"`{n}`" in out for n in list_strategies())
    rc, out, err = run_main('train')
    assert rc == 2 and '--list-strategies' in err and err.count('\n') == 1


def test_export_a_run_on_a_colour_image_folder_with_its_own_data(tmp_path):
    "`netlite export RUN` rebuilds a 3-channel, 4-class run from its config.yaml and verifies it on the run's own images."
    from netlite_nb.run import train_from_config
    image_folder(tmp_path / 'pets')  # ≥ 128 training images: INT8 calibration needs them
    cfg = {'strategy': 'cpu', 'model': {'name': 'netlite_tiny'}, 'data': {'name': 'folder', 'root': str(tmp_path / 'pets'), 'batch_size': 8},
           'train': {'steps': 1, 'checkpoint_dir': None}}
    train_from_config(cfg, run_dir=tmp_path / 'run', progress=False, verbose=False)
    rc, out, err = run_main('export', str(tmp_path / 'run'), '--int8', '--int8-target', 'any', '--calibration-samples', '192', '--json')
    assert rc == 0, err
    d = json.loads(out)
    assert d['path'] == str(tmp_path / 'run' / 'onnx' / 'netlite_tiny.int8.onnx') and d['precision'] == 'int8'
    assert d['fp32_path'] == str(tmp_path / 'run' / 'onnx' / 'netlite_tiny.fp32.onnx') and Path(d['fp32_path']).is_file()
    assert d['input_shape'] == ['batch', 3, 32, 32] and d['max_abs_diff']['fp32'] <= d['tolerance']['fp32']
    assert set(d['accuracy']) >= {'pytorch', 'fp32', 'int8'}   # measured on the run's own validation images
    # data that is not what the weights were built for is a usage error saying what to fix
    c = tmp_path / 'run' / 'config.yaml'
    written = yaml.safe_load(c.read_text()); written['run']['data'] = {'name': 'mnist_sample'}
    c.write_text(yaml.safe_dump(written))
    rc, out, err = run_main('export', str(tmp_path / 'run'))
    assert rc == 2 and err.count('\n') == 1 and '(1, 28, 28)' in err and '(3, 32, 32)' in err and 'config.yaml' in err


def test_int8_of_a_small_image_folder_calibrates_on_every_sample_and_says_so(tmp_path):
    "Issue 37: 120 pictures (fewer than the 128 INT8 ranges want) export as INT8, calibrated on training and validation images, with a note."
    from netlite_nb.run import train_from_config
    image_folder(tmp_path / 'few', per_class=30)
    cfg = {'strategy': 'cpu', 'model': {'name': 'netlite_tiny'}, 'data': {'name': 'folder', 'root': str(tmp_path / 'few'), 'batch_size': 8},
           'train': {'steps': 1, 'checkpoint_dir': None}}
    train_from_config(cfg, run_dir=tmp_path / 'run', progress=False, verbose=False)
    rc, out, err = run_main('export', str(tmp_path / 'run'), '--int8', '--int8-target', 'any', '--json')
    assert rc == 0, err
    d = json.loads(out)
    assert d['precision'] == 'int8' and Path(d['path']).is_file()
    assert any('calibrated on 120 samples' in n for n in d['notes']), d['notes']   # all 120: training and validation images
    rc, out, err = run_main('export', str(tmp_path / 'run'), '--int8', '--int8-target', 'any', '--calibration-samples', '40', '--json')
    assert rc == 0 and any('calibrated on 40 samples' in n for n in json.loads(out)['notes']), err


def test_export_a_demo_like_mnist_run_into_its_run_directory(tmp_path):
    from netlite_nb.run import run_demo
    run_demo(run_dir=tmp_path / 'demo', steps=3, export=False, progress=False, verbose=False)
    rc, out, err = run_main('export', str(tmp_path / 'demo'), '--int8', '--calibration-samples', '256')
    assert rc == 0, err
    assert (tmp_path / 'demo' / 'onnx' / 'netlite_tiny.int8.onnx').is_file() and (tmp_path / 'demo' / 'onnx' / 'netlite_tiny.fp32.onnx').is_file()
    assert 'static QDQ' in out and 'limit 1.0e-04: ok' in out
    rc, out, err = run_main('export', str(tmp_path / 'demo'), '--int8-target', 'avx9000')
    assert rc == 2 and 'invalid choice' in err


def test_examples_list_write_and_the_image_folder_one_trains_and_exports(tmp_path, monkeypatch):
    "Issue 37: example configurations ship in the package; `--example NAME` writes one that trains (the image-folder one on 120 pictures)."
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_main('train', '--list-examples')
    assert rc == 0 and all(re.search(rf"^{n}\s", out, re.M) for n in ('mnist_quick', 'demo', 'image_folder', 'cifar10')), out
    rc, out, err = run_main('train', '--example', 'image_folder')
    assert rc == 0 and (tmp_path / 'image_folder.yaml').is_file() and '--set data.root=FOLDER' in out, out + err
    rc, out, err = run_main('train', '--example', 'image_folder')
    assert rc == 2 and 'exists already' in err
    rc, out, err = run_main('train', '--example', 'imagefolder')
    assert rc == 2 and "Did you mean 'image_folder'?" in err
    image_folder(tmp_path / 'pets', per_class=30)
    rc, out, err = run_main('train', 'image_folder.yaml', '--set', f'data.root={tmp_path / "pets"}', '--set', 'train.steps=2',
                            '--set', 'strategy=cpu', '--out', str(tmp_path / 'run'), '--json')
    assert rc == 0, err
    d = json.loads(out)
    assert d['steps'] == 2 and d['export']['precision'] == 'int8' and Path(d['export']['path']).is_file()
    assert any('calibrated on 120 samples' in n for n in d['export']['notes'])
    rc, out, err = run_main('train', '--example', 'demo', 'mine.yaml')
    assert rc == 0 and yaml.safe_load((tmp_path / 'mine.yaml').read_text())['model']['name'] == 'netlite_tiny'


def test_a_mistyped_flag_or_command_names_the_closest():
    "Issue 37: argparse's plain error, plus the flag or command that was meant."
    rc, out, err = run_main('demo', '--setps', '3')
    assert rc == 2 and 'unrecognized arguments: --setps 3. Did you mean --steps?' in err, err
    rc, out, err = run_main('trian', 'x.yaml')
    assert rc == 2 and 'Did you mean train?' in err, err
    rc, out, err = run_main('export', 'run', '--calibraton-samples', '9')
    assert rc == 2 and 'Did you mean --calibration-samples?' in err, err


def test_netlite_help_imports_neither_torch_nor_the_chapters():
    "Issue 37: `netlite --help` in well under 2 s, because it loads no torch (20-27 s on a busy machine when it did)."
    code = ('import sys, contextlib, io\nfrom netlite_nb.cli import main\n'
            'with contextlib.redirect_stdout(io.StringIO()):\n    try: main(["--help"])\n    except SystemExit: pass\n'
            'print(sorted(m for m in sys.modules if m == "torch" or m.startswith("netlite_nb.")))')
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env={**os.environ, 'PYTHONPATH': str(ROOT)}, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "['netlite_nb.cli']", r.stdout + r.stderr


def test_a_torchvision_built_for_another_torch_is_named_with_its_fix(tmp_path):
    "Issue 37: `netlite probe` names the mismatch and the pip line; `netlite demo` stops with it before training."
    fake = tmp_path / 'shadow' / 'torchvision'; fake.mkdir(parents=True)
    (fake / '__init__.py').write_text("raise RuntimeError('operator torchvision::nms does not exist')\n")
    env = {**os.environ, 'PYTHONPATH': f"{tmp_path / 'shadow'}{os.pathsep}{ROOT}"}
    run = lambda *a: subprocess.run([sys.executable, '-m', 'netlite_nb.cli', *a], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    r = run('probe')
    assert r.returncode == 0 and 'operator torchvision::nms does not exist' in r.stdout and 'pip install --force-reinstall --no-deps "torchvision==' in r.stdout, r.stdout + r.stderr
    assert re.search(r"Libraries\s+torchvision BROKEN", r.stdout), r.stdout
    r = run('demo', '--out', str(tmp_path / 'demo'))
    assert r.returncode == 1 and r.stderr.count('\n') == 1 and 'pip install --force-reinstall --no-deps "torchvision==' in r.stderr, r.stderr
    assert 'stopped before training' in r.stderr and not (tmp_path / 'demo').exists()


def test_the_cli_makes_openmp_threads_sleep_before_torch_loads():
    "Issue 14: spin-waiting OpenMP threads made a run on a busy machine 37× slower; the policy works only if set before torch loads."
    code = "import sys, os; import netlite_nb; t = 'torch' in sys.modules; import netlite_nb.cli; print(t, os.environ['OMP_WAIT_POLICY'], os.environ['KMP_BLOCKTIME'])"
    env = {k: v for k, v in os.environ.items() if k not in ('OMP_WAIT_POLICY', 'KMP_BLOCKTIME')}
    run = lambda env: subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env={**env, 'PYTHONPATH': str(ROOT)}, cwd=ROOT)
    r = run(env)
    assert r.returncode == 0 and r.stdout.split() == ['False', 'PASSIVE', '0'], r.stderr[-2000:]   # torch not loaded before the setting
    assert run({**env, 'OMP_WAIT_POLICY': 'ACTIVE'}).stdout.split()[1] == 'ACTIVE'                   # the user's own value wins


# --- issue 16: data-parallel training through torchrun ----------------------------------------------------------------------
@pytest.mark.slow
def test_train_nproc_per_node_2_then_resume_as_one_process_keeps_the_effective_batch(tmp_path):
    import json
    from netlite_nb.checkpoint import read_state
    cfg = tmp_path / 'run.yaml'
    cfg.write_text('strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 64}\ntrain: {steps: 4}\n'
                   'schedule: {cosine: false}\n')  # extended on resume below: a constant schedule may be
    r = netlite('train', str(cfg), '--nproc-per-node', '2', '--out', str(tmp_path / 'run'), '--json')
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout[r.stdout.index('{'):])   # process 0 alone prints
    assert out['steps'] == 4 and 'data-parallel: process 0 of 2 (gloo); effective batch 2 × 64 = 128' in out['notes']
    s = read_state(find_checkpoint(tmp_path / 'run'))
    assert (s['window'], s['callbacks']['0:DataParallel']) == (1, {'world_size': 2})
    r = netlite('train', str(cfg), '--set', 'train.steps=6', '--resume', str(tmp_path / 'run'), '--quiet')
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_state(find_checkpoint(tmp_path / 'run'))
    assert (s['step'], s['window'], s['callbacks']['0:DataParallel']) == (6, 2, {'world_size': 1})   # 1 process × 2 × 64 = 128


def test_plan_prints_headlines_and_verbose_prints_every_note_in_full(capsys):
    "Issue 37: a plan says what matters by default (one line per assumption); --verbose gives each note in full."
    from netlite_nb.cli import main
    args = ['plan', '--model', 'mlp', '--batch-size', '64', '--gpu', 'gtx 1650']
    main(args); short = capsys.readouterr().out
    main(args + ['--verbose']); full = capsys.readouterr().out
    assert 'assumes: CUDA context' in short and 'note:' not in short and max(map(len, short.splitlines())) < 200
    assert 'note: CUDA context' in full and len(full) > len(short)


def test_plan_builds_the_users_model_on_the_meta_device_and_says_when_it_cannot(tmp_path):
    "Issue 39: planning a 200 M-parameter model must not allocate its weights; a model that reads its values is built for real, with a note."
    import contextlib, io
    from netlite_nb.cli import main
    (tmp_path / 'big.py').write_text('''import torch.nn as nn
class Big(nn.Module):
    def __init__(self):
        super().__init__(); self.a = nn.Linear(28 * 28, 256); self.b = nn.Linear(256, 10)
        open(__file__ + '.device', 'w').write(str(self.a.weight.device))
    def forward(self, x): return self.b(self.a(x.flatten(1)).relu())
class Stubborn(Big):
    def __init__(self):
        super().__init__(); self.scale = float(self.a.weight.abs().max())
''')
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(['plan', '--model', f"{tmp_path / 'big.py'}:Big"])
    assert rc == 0 and (tmp_path / 'big.py.device').read_text() == 'meta' and 'meta device' not in err.getvalue()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(['plan', '--model', f"{tmp_path / 'big.py'}:Stubborn"])
    assert rc == 0 and 'could not be built on the meta device' in err.getvalue() and 'Tensor.item()' in err.getvalue()
