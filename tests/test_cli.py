"The `netlite` command (chapter 11) in a subprocess: demo, train from a configuration, resume, sizing by the planner."
import os, subprocess, sys
from pathlib import Path
import yaml
from netlite_nb.checkpoint import find_checkpoint

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("strategy: {name: auto, device: cpu, precision: fp32, memory_gb: 0.0072, budget_fraction: 0.5}\n"
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
