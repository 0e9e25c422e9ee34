"Chapter 08a on the CPU with gloo: processes forked by `launch` (seconds), and torchrun itself (slow: it starts fresh Pythons)."
import os, signal, subprocess, sys, tempfile, time
from pathlib import Path
import pytest, torch
import torch.distributed as dist
from torch.utils.data import DataLoader
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from netlite_nb.train import Callback, Trainer
from netlite_nb.fixtures import blobs, mlp, max_param_diff
from netlite_nb.checkpoint import find_checkpoint, load_checkpoint, read_state
from netlite_nb.budget import plan_memory
from netlite_nb.distributed import DistributedError, ShardedLoader, bucket_bytes, distribute, launch, plan_per_process

pytestmark = pytest.mark.skipif(not dist.is_available() or sys.platform == 'win32', reason='needs torch.distributed and fork')


def trainer(batch=8, seed=0, **kw):
    "A float64 MLP on the blobs, AdamW with warmup and cosine: round-off far below the 1e-6 the comparisons allow."
    torch.manual_seed(seed)
    dl = DataLoader(blobs(256, dtype=torch.float64, seed=seed), batch_size=batch, shuffle=True)
    return Trainer(mlp(dropout=0.0).double(), (dl, None), device='cpu', lr=0.01, progress=False, verbose=False, plan=False, **kw)


class StopAt(Callback):
    "Flag a stop in process 1 after step `at`, as its Ctrl-C handler would."
    order = -20
    def __init__(self, at=None): self.at = at
    def after_step(self, t):
        if t.step == self.at and dist.is_initialized() and dist.get_rank() == 1: t._stop_requested = True


def run(steps=50, batch=8, effective=16, stop_at=None, resume=None, **kw):
    t = distribute(trainer(batch, callbacks=[StopAt(stop_at)], **kw), effective_batch=effective)
    return t.fit(steps=steps, resume=resume)


def test_two_processes_reach_the_weights_of_one_with_the_same_effective_batch():
    two, one = launch(run, nproc=2), run()
    assert (two.step, two.effective_batch, one.effective_batch) == (50, 8, 16)   # per process: 2 × 8 against 1 × (2 × 8)
    assert max_param_diff(two.model, one.model) < 1e-6
    assert max_param_diff(two.model, trainer().model) > 1e-2


def test_a_different_seed_is_a_different_data_order():
    a, b = ShardedLoader(DataLoader(blobs(64), 8, shuffle=True), 0, 2, seed=0), ShardedLoader(DataLoader(blobs(64), 8, shuffle=True), 0, 2, seed=1)
    assert not torch.equal(next(iter(a))[0], next(iter(b))[0])
    first = next(iter(a))[0]; a.set_epoch(1)
    assert not torch.equal(next(iter(a))[0], first)
    a.set_epoch(0); assert torch.equal(next(iter(a))[0], first)


def _exchanges(steps=5):
    t = distribute(trainer(batch=4), effective_batch=24)   # 2 processes × 3 micro-batches of 4
    calls = []
    t.wrapper.register_comm_hook(None, lambda state, bucket: (calls.append(1), allreduce_hook(state, bucket))[1])
    t.fit(steps=steps)
    return t.accum_steps, len(calls)


def test_accumulation_exchanges_gradients_once_per_optimizer_step():
    assert launch(_exchanges, nproc=2) == (3, 5)   # without no_sync: 15


def test_resume_after_a_stop_is_exact_and_keeps_the_effective_batch_on_one_process(tmp_path, monkeypatch):
    full = launch(run, nproc=2)
    monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / 'tmp')); (tmp_path / 'tmp').mkdir()
    first = launch(run, nproc=2, stop_at=20, run_dir=tmp_path / 'run')
    assert (first.step, first.interrupted) == (20, True)   # process 1's stop reached process 0 at the same step
    assert list((tmp_path / 'tmp').iterdir()) == []          # only process 0 saved (a process without run_dir would use a temp dir)
    tmp_path = tmp_path / 'run'
    assert read_state(find_checkpoint(tmp_path))['callbacks']['1:DataParallel'] == {'world_size': 2}
    again = launch(run, nproc=2, resume=tmp_path, run_dir=tmp_path)
    assert again.step == 50 and max_param_diff(again.model, full.model) == 0.0
    alone = run(resume=tmp_path, run_dir=tmp_path / 'alone')
    assert (alone.window, alone.effective_batch) == (2, 16) and max_param_diff(alone.model, full.model) < 1e-6


def test_resume_on_a_number_of_processes_that_cannot_keep_the_effective_batch_is_refused(tmp_path):
    # a constant schedule: the longer resume is allowed by chapter 07, so the number of processes is what refuses it
    run(steps=3, effective=8, run_dir=tmp_path, lr_schedule='constant')   # 8 per step in loader batches of 8: cannot be shared by 2
    with pytest.raises((DistributedError, ValueError), match='cannot be split into 2 process'):
        launch(run, nproc=2, steps=5, effective=None, resume=tmp_path, lr_schedule='constant')


class _Dies(Callback):
    def __init__(self, at, mark): self.at, self.mark = at, mark
    def after_step(self, t):
        if t.step == self.at and dist.get_rank() == 1:
            self.mark.write_text(str(time.time())); os.kill(os.getpid(), signal.SIGKILL)


def _dies(run_dir, mark):
    t = distribute(trainer(run_dir=run_dir, checkpoint_every=5, callbacks=[_Dies(12, mark)]))
    return t.fit(steps=200)


def test_a_killed_process_stops_the_job_with_a_message_and_the_last_checkpoint_loads(tmp_path):
    with pytest.raises(DistributedError, match='Process 1 of 2 killed by signal SIGKILL') as e:
        launch(_dies, tmp_path / 'run', tmp_path / 'killed')
    assert time.time() - float((tmp_path / 'killed').read_text()) < 60
    assert 'resume' in str(e.value)
    ck = find_checkpoint(tmp_path / 'run')
    assert read_state(ck)['step'] == 10
    load_checkpoint(ck, mlp(dropout=0.0).double())   # checksums verified, weights load


def test_the_per_process_plan_adds_ddp_s_buckets():
    m = mlp(d=64, hidden=256).double()
    p = plan_memory(m, (torch.randn(16, 64, dtype=torch.float64), torch.randint(0, 10, (16,))), device_or_gpu='cpu')
    q = plan_per_process(p, m, world=4)
    assert bucket_bytes(m) == 8 * sum(x.numel() for x in m.parameters())
    assert q.total - p.total == bucket_bytes(m) == q.breakdown['DDP gradient buckets'] and sum(q.breakdown.values()) == q.total
    assert 'one process' in ' '.join(q.notes) and q.breakdown['communication buffers'] == 0


SCRIPT = '''
import os, signal, sys, time, torch
import torch.distributed as dist
sys.path.insert(0, {tests!r})
from test_distributed import trainer, _Dies
from netlite_nb.distributed import distribute
from pathlib import Path
t = distribute(trainer(run_dir={run!r}, checkpoint_every=5, callbacks=[_Dies(12, Path({mark!r}))]))
t.fit(steps=100000)
'''


@pytest.mark.slow
def test_torchrun_stops_the_job_within_60_s_of_a_killed_process(tmp_path):
    script = tmp_path / 'dies.py'
    script.write_text(SCRIPT.format(tests=os.path.dirname(__file__), run=str(tmp_path / 'run'), mark=str(tmp_path / 'killed')))
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONPATH': os.pathsep.join([os.getcwd(), os.environ.get('PYTHONPATH', '')])}
    r = subprocess.run([sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node=2', str(script)],
                       capture_output=True, text=True, timeout=300, env=env)
    took = time.time() - float((tmp_path / 'killed').read_text())
    assert r.returncode != 0 and took < 60, (took, r.stderr[-2000:])
    assert 'SIGKILL' in r.stderr and 'rank: 1' in r.stderr
    assert read_state(find_checkpoint(tmp_path / 'run'))['step'] == 10


def _planned():
    t = distribute(Trainer(mlp(dropout=0.0), (DataLoader(blobs(128), 16, shuffle=True), None), device='cpu', progress=False, verbose=False))
    t.fit(steps=2)
    return t.plan.batch_size, t.plan.breakdown['DDP gradient buckets'], bucket_bytes(t.model)


def test_the_trainer_s_plan_in_a_data_parallel_run_is_the_per_process_plan():
    batch, buckets, expected = launch(_planned, nproc=2)
    assert batch == 16 and buckets == expected > 0


def test_a_process_autograd_cannot_fork_gets_a_sentence_with_the_fix():
    "After a backward that started autograd's device threads (a GPU machine; here a FakeTensorMode one before chapter 00 could prevent it), say so."
    code = """
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode(): torch.ones(1, requires_grad=True).sum().backward()   # this process's first backward: a fake one, before netlite_nb
from netlite_nb.distributed import DistributedError, launch
def step():
    x = torch.ones(2, requires_grad=True); (x * 2).sum().backward(); return 1
try: launch(step, nproc=2, timeout=60)
except DistributedError as e: print(e)
"""
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, 'PYTHONPATH': str(Path(__file__).resolve().parents[1])})
    assert 'Restart the kernel and call `launch` before any training' in r.stdout, (r.stdout[-2000:], r.stderr[-2000:])


def _parallel_op_threads():
    "A parallel op on 4M values (it hangs in a forked process with >1 thread of a pool fork did not copy); this process's threads."
    (torch.randn(1 << 22) * 2 + 1).sum()
    return torch.get_num_threads()


def test_launch_after_parallel_ops_gives_forked_processes_threads_they_can_use():
    from netlite_nb.distributed import openmp_survives_fork
    saved = torch.get_num_threads()
    torch.set_num_threads(4)  # as on a 4-core machine: the old default gave each of 2 forked processes 2 threads
    try:
        _parallel_op_threads()  # the notebook has run a parallel op: GNU OpenMP's pool exists, and fork does not copy it
        t0 = time.time()
        threads = launch(_parallel_op_threads, nproc=2, timeout=30)
        assert time.time() - t0 < 30
        if not openmp_survives_fork():
            assert threads == 1
            with pytest.raises(ValueError, match='one thread only'): launch(_parallel_op_threads, nproc=2, threads=2)
        assert torch.get_num_threads() == 4  # launch restores this process's threads
    finally: torch.set_num_threads(saved)
