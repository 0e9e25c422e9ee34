"Chapter 10's recipes: a configuration sized by the planner only where the file left it open, and the demo's accuracy target."
import pytest, yaml
from netlite_nb.run import run_demo, train_from_config
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
    with pytest.raises(ValueError, match='netlite demo --seed 3'):
        train_from_config(tmp_path / 'demo' / 'config.yaml')


@pytest.mark.slow
def test_demo_reaches_target_accuracy(tmp_path, request):
    r = run_demo(run_dir=tmp_path / 'demo', progress=False)
    print(r)
    assert r.accuracy >= 0.975, r
