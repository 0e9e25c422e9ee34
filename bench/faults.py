"""Every fault and bad input of issues 17 and 39, tried once each: the tally of faults survived and bad inputs rejected clearly.

A *fault* is something that happens to a run — kill -9, a full disk, a flipped byte, divergence, an out-of-memory error,
Ctrl-C, a writer killed mid-line — and it is *survived* when the run ends where the uninterrupted one would (or stops
with a sentence and its last good checkpoint intact). A *bad input* is something a person gives the toolkit — empty or
NaN data, fractional labels, bad options, hostile YAML, truncated weights, a resume with changed settings — and it is
*rejected clearly* when it raises the expected error type with a message that names the problem (the words checked) in
under 1,000 characters, before doing harm. A few inputs are valid changes that must be *applied exactly* instead (a new
lr on resume); they count with the inputs. Prints one line per case and the tally; lists every case that failed.

    python bench/faults.py [--kills 10]
"""
import argparse, contextlib, errno, io, os, random, shutil, signal, subprocess, sys, tempfile, time, warnings
from pathlib import Path
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import safetensors.torch as st
from netlite_nb.fixtures import blobs, mlp
from netlite_nb.train import Callback, InjectOOM, Trainer
from netlite_nb.checkpoint import find_checkpoint, load_checkpoint, read_state
from netlite_nb.strategies import ConfigError, load_config, load_yaml
from netlite_nb.data import DataCheckError, LabeledTensors, check_dataset, image_folder

KW = dict(device='cpu', progress=False, verbose=False, plan=False)
ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, '-c', 'import sys; from netlite_nb.cli import main; sys.exit(main(sys.argv[1:]))']
ENV = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'}
CASES = []  # (kind, name, fn): fn returns None when the case passed, else why not


def case(kind, name):
    def deco(f): CASES.append((kind, name, f)); return f
    return deco


def loaders(bs=64, n=1024, seed=0):
    ds = blobs(n, seed=seed)
    tr, va = torch.utils.data.random_split(ds, [n - 256, 256], generator=torch.Generator().manual_seed(0))
    return DataLoader(tr, bs, shuffle=True), DataLoader(va, 256)


def rejected(f, exc, *words):
    "None when `f()` raises `exc` with every word in a message under 1,000 characters; else what happened."
    try:
        with warnings.catch_warnings(): warnings.simplefilter('ignore'); f()
    except exc as e:
        msg = str(e)
        if len(msg) > 1000: return f"message of {len(msg)} characters"
        missing = [w for w in words if w not in msg]
        return f"message lacks {missing}: {msg[:200]}" if missing else None
    except Exception as e: return f"{type(e).__name__} instead of {exc.__name__}: {str(e)[:200]}"
    return 'accepted silently'


def tmpdir(): return Path(tempfile.mkdtemp(prefix='faults-'))


def weights(run): return st.load_file(find_checkpoint(run) / 'model.safetensors')


def same(a, b): return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# --- faults -------------------------------------------------------------------------------------------------------

def run_config(d, steps):
    (d / 'run.yaml').write_text(f"strategy: cpu\nmodel: {{name: mlp}}\ndata: {{name: mnist_sample, batch_size: 64}}\n"
                                f"train: {{steps: {steps}, checkpoint_every: 1}}\n")
    return d / 'run.yaml'


def latest(run):
    try: return (run / 'latest').read_text()
    except OSError: return None


def kill_loop(d, kills, steps, rng):
    "`netlite train`, SIGKILLed at a random moment after each new checkpoint and resumed, `kills` times; the run dir."
    cfg, run, done = run_config(d, steps), d / 'killed', 0
    while True:
        args = ['train', str(cfg), '--quiet'] + (['--resume', str(run)] if latest(run) else ['--out', str(run)])
        p, before = subprocess.Popen(CLI + args, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), latest(run)
        if done < kills:
            while p.poll() is None and latest(run) == before: time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.15))
            if p.poll() is None: p.send_signal(signal.SIGKILL); p.communicate(); done += 1; continue
        _, err = p.communicate()
        if p.returncode != 0: raise RuntimeError(err[-500:])
        if done < kills: raise RuntimeError(f"the run finished after {done} of {kills} kills")
        return run


def kill_9(kills):
    def f():
        d, steps = tmpdir(), 25 + 12 * kills
        ref = subprocess.Popen(CLI + ['train', str(run_config(d, steps)), '--quiet', '--out', str(d / 'whole')], env=ENV, cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        run = kill_loop(d, kills, steps, random.Random())
        ref.communicate()
        return None if same(weights(run), weights(d / 'whole')) and find_checkpoint(run).name == f"step-{steps:07d}" else 'weights differ'
    return f


class Stop(Callback):
    def __init__(self, at): self.at = at
    def after_step(self, t):
        if t.step == self.at: raise KeyboardInterrupt


def trainer(run_dir=None, cbs=(), **kw):
    torch.manual_seed(0)
    return Trainer(mlp(dropout=0.2), loaders(), **{**KW, **dict(run_dir=run_dir, callbacks=cbs, log_every=1, checkpoint_every=2), **kw})


@case('fault', 'Ctrl-C mid-run, then resume: the uninterrupted losses and weights')
def _():
    d = tmpdir(); full = trainer(d / 'a').fit(epochs=2)
    trainer(d / 'b', [Stop(7)]).fit(epochs=2); res = trainer(d / 'b').fit(epochs=2, resume=d / 'b')
    return None if same(weights(d / 'a'), weights(d / 'b')) and res.step == full.step else 'resume not exact'


@case('fault', 'disk full during a save (ENOSPC): a sentence, the previous checkpoint kept, resume works')
def _():
    d = tmpdir(); t = trainer(d).fit(steps=2); save = torch.save
    def full(*a, **k): raise OSError(errno.ENOSPC, 'No space left on device')
    torch.save = full
    try: why = rejected(lambda: t.fit(steps=2), OSError, 'No space left on device', 'step-0000002 is still valid')
    finally: torch.save = save
    return why or (None if trainer(d).fit(steps=2, resume=d).step == 2 else 'resume failed')


@case('fault', "disk full as PyTorch says it ('unexpected pos'): the same")
def _():
    d = tmpdir(); t = trainer(d).fit(steps=2); save = torch.save
    def full(*a, **k): raise RuntimeError('[enforce fail at inline_container.cc:672] . unexpected pos 128 vs 64')
    torch.save = full
    try: return rejected(lambda: t.fit(steps=2), OSError, 'No space left on device')
    finally: torch.save = save


def flipped(name):
    def f():
        d = tmpdir(); trainer(d, keep_checkpoints=3).fit(steps=4)
        p = d / 'step-0000004' / name; raw = bytearray(p.read_bytes()); raw[len(raw) - 9] ^= 1; p.write_bytes(bytes(raw))
        with warnings.catch_warnings(): warnings.simplefilter('ignore'); ck = find_checkpoint(d)
        return None if ck.name == 'step-0000002' else f"used {ck.name}"
    return f

case('fault', 'a flipped byte in state.pt: detected, the previous checkpoint used')(flipped('state.pt'))
case('fault', 'a flipped byte in model.safetensors: detected, the previous checkpoint used')(flipped('model.safetensors'))


@case('fault', 'leftovers of killed writers (.tmp, .old): cleaned')
def _():
    d = tmpdir(); trainer(d).fit(steps=2)
    (d / '.step-0000004.tmp-999999').mkdir(); (d / '.step-0000004.tmp-999999' / 'state.pt').write_bytes(b'x' * 1000)
    find_checkpoint(d)
    return None if not list(d.glob('.step-*')) else 'leftover stayed'


@case('fault', 'a writer killed mid-line in metrics.jsonl: the half line is dropped on resume')
def _():
    d = tmpdir(); trainer(d, [Stop(5)]).fit(steps=8)
    with open(d / 'metrics.jsonl', 'a') as f: f.write('{"step": 6, "lo')
    trainer(d).fit(steps=8, resume=d)
    import json
    try: [json.loads(l) for l in (d / 'metrics.jsonl').read_text().splitlines()]
    except ValueError as e: return f"metrics.jsonl unreadable: {e}"


def diverging(optimizer, clip):
    def f():
        d = tmpdir(); t = trainer(d, lr=1e6, lr_schedule=None, optimizer=optimizer, clip_grad=clip, checkpoint_every=1)
        why = rejected(lambda: t.fit(steps=40), FloatingPointError, 'at optimizer step', 'learning rate too high', 'The last good checkpoint is')
        good = all(torch.isfinite(v).all() for v in weights(d).values())
        return why or (None if good else 'the last checkpoint is not finite')
    return f

for o, c in (('sgd', None), ('adamw', None), ('sgd', 1.0)):
    case('fault', f"divergence (lr 1e6, {o}{', clip 1' if c else ''}): stopped, last good checkpoint named and kept")(diverging(o, c))


@case('fault', "divergence with on_nonfinite='skip': the bad updates skipped, the run finishes")
def _():
    t = trainer(lr=1e6, lr_schedule=None, optimizer='sgd', on_nonfinite='skip').fit(steps=30)
    return None if t.step == 30 and t.skipped > 0 else 'not skipped'


@case('fault', 'injected out-of-memory at random steps: the same optimizer steps')
def _():
    a = trainer(micro_batch=64).fit(steps=12)
    b = trainer(micro_batch=64, cbs=[InjectOOM(random.sample(range(1, 13), 3))]).fit(steps=12)
    return None if a.step == b.step == 12 and b.oom_reports else 'different steps'


@case('fault', 'a second fit mid-epoch: the same shuffle, continued')
def _():
    a = trainer(lr_schedule=None).fit(epochs=1)
    b = trainer(lr_schedule=None); b.fit(steps=4); b.fit(steps=8)
    return None if same(dict(a.model.state_dict()), dict(b.model.state_dict())) else 'different weights'


# --- bad inputs ---------------------------------------------------------------------------------------------------
EMPTY = DataLoader(TensorDataset(torch.zeros(0, 20), torch.zeros(0, dtype=torch.long)), batch_size=8)


def bad(name, exc, *words):
    def deco(f): CASES.append(('input', name, lambda: rejected(f, exc, *words))); return f
    return deco


bad('empty training set, fit(steps=)', ValueError, 'training data is empty')(lambda: Trainer(mlp(), EMPTY, **KW).fit(steps=5))
bad('empty training set, fit(epochs=)', ValueError, 'training data is empty')(lambda: Trainer(mlp(), EMPTY, **KW).fit(epochs=2))
bad('a one-shot generator for steps beyond it', ValueError, 'gave no batch in epoch 1')(
    lambda: Trainer(mlp(), iter(list(loaders()[0])[:3]), **KW).fit(steps=10))
bad('empty validation set', ValueError, 'validation data gave no samples')(lambda: Trainer(mlp(), (loaders()[0], EMPTY), **KW).validate())
for kw, words in [(dict(clip_grad=-1), 'clip_grad'), (dict(micro_batch=-4), 'micro_batch'), (dict(accum_steps=0), 'accum_steps'),
                  (dict(lr=-1e-3), 'lr must be'), (dict(lr=float('nan')), 'lr must be'), (dict(ema=1.5), 'ema is a decay'),
                  (dict(log_every=0), 'log_every'), (dict(keep_checkpoints=0), 'keep_checkpoints'), (dict(checkpoint_every=-1), 'checkpoint_every'),
                  (dict(weight_decay=-0.1), 'weight_decay'), (dict(warmup=-1), 'warmup'), (dict(min_lr_ratio=2), 'min_lr_ratio'),
                  (dict(on_nonfinite='ignore'), 'on_nonfinite')]:
    bad(f"Trainer({', '.join(f'{k}={v!r}' for k, v in kw.items())})", ValueError, words)(lambda kw=kw: Trainer(mlp(), loaders(), **KW, **kw))
for kw in (dict(steps=-3), dict(steps=0), dict(epochs=-1), dict(steps=2.5)):
    bad(f"fit({', '.join(f'{k}={v}' for k, v in kw.items())})", ValueError, 'must be a whole number')(lambda kw=kw: Trainer(mlp(), loaders(), **KW).fit(**kw))


def nan_loader():
    ds = blobs(256); ds.tensors[0][5, 3] = float('nan'); return DataLoader(ds, 64)

bad('NaN in the training data', DataCheckError, 'contains NaN')(lambda: Trainer(mlp(), nan_loader(), **KW).fit(steps=1))
bad('fractional labels (2.7)', DataCheckError, 'whole class numbers')(lambda: LabeledTensors(torch.zeros(3, 1, 2, 2), torch.tensor([0., 2.7, 1.])))
bad('a label outside the classes', DataCheckError, 'outside [0, 10)')(
    lambda: check_dataset((torch.zeros(20, 1, 2, 2), torch.arange(20) % 11), num_classes=10))


@bad('a single-class image folder', DataCheckError, 'single class folder')
def _():
    from PIL import Image
    d = tmpdir() / 'one' / 'cat'; d.mkdir(parents=True)
    for i in range(4): Image.new('RGB', (8, 8)).save(d / f"{i}.png")
    image_folder(d.parent)



class _CallsItself(nn.Module):
    def __init__(self): super().__init__(); self.fc = nn.Linear(20, 3)
    def forward(self, x): return self(x)  # a typo for self.fc(x)


def _plan(model, batch):
    from netlite_nb.budget import plan_memory
    return plan_memory(model, batch)


bad('a forward that calls itself forever, planned', ValueError, 'never returns', 'recursion limit')(
    lambda: _plan(_CallsItself(), (torch.randn(8, 20), torch.zeros(8, dtype=torch.long))))
bad('a planner batch of 0 samples', ValueError, '0 samples', '1 or more')(
    lambda: _plan(mlp(), (torch.randn(0, 20), torch.zeros(0, dtype=torch.long))))

def laughs(levels, where):
    names = 'abcdefghijk'[:levels]
    return ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
            + ''.join(f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip(names, names[1:])) + where + '\n')


def yaml_file(text):
    p = tmpdir() / 'c.yaml'; p.write_text(text); return str(p)

bad('YAML billion laughs, 435 bytes', ConfigError, 'billion laughs')(lambda: load_config(yaml_file(laughs(9, 'train: {epochs: *i}'))))
bad('YAML billion laughs in model.kwargs, 480 bytes', ConfigError, 'billion laughs')(
    lambda: load_config(yaml_file(laughs(10, 'model: {name: mlp, kwargs: {hidden: *j}}'))))
bad('YAML alias inside its own anchor', ConfigError, 'refers to itself')(lambda: load_yaml('a: &a [*a]'))
bad('YAML nested 5,000 deep', ConfigError, 'levels deep')(lambda: load_yaml('[' * 5000 + ']' * 5000))
bad('a huge wrong value (message stays short)', ConfigError, 'train.epochs must be')(lambda: load_config({'train': {'epochs': [list(range(1000))] * 1000}}))


def netlite(*args):
    from netlite_nb.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def cli_case(name, text, rc_want, *words):
    def f():
        rc, out, err = netlite('train', yaml_file(text), '--out', str(tmpdir() / 'r'))
        if rc != rc_want or 'Traceback' in err or 'PWNED' in out: return f"exit {rc}: {err[-200:]}"
        return None if all(w in err for w in words) else f"message lacks {words}: {err[-200:]}"
    CASES.append(('input', name, f))

cli_case('netlite train: unknown model kwarg', "strategy: cpu\nmodel: {name: mlp, kwargs: {widht: 3}}\ntrain: {steps: 1}\n", 2, "'widht', which mlp does not take")
cli_case('netlite train: YAML syntax error', "strategy: cpu\nmodel: {name: mlp\n", 2, 'is not valid YAML', 'line')
cli_case('netlite train: a !!python tag', "strategy: !!python/object/apply:os.system ['echo PWNED']\n", 2, 'would build a Python object')
cli_case('netlite train: unknown key', "strategy: cpu\ntrain: {epoch: 1}\n", 2, "Did you mean 'train.epochs'")
cli_case('netlite train: checkpoint_every 0', "strategy: cpu\ntrain: {steps: 1, checkpoint_every: 0}\n", 2, 'train.checkpoint_every')
if not torch.cuda.is_available():
    cli_case('netlite train: a GPU strategy on a CPU-only machine', "strategy: rtx_3060_12gb\nmodel: {name: mlp}\ntrain: {steps: 1}\n", 2,
             "which this machine's PyTorch cannot use")


@case('input', 'netlite export of truncated weights: a sentence, exit 1')
def _():
    d = tmpdir(); trainer(d).fit(steps=1)
    w = (d / 'step-0000001' / 'model.safetensors').read_bytes(); (d / 'cut.safetensors').write_bytes(w[:len(w) // 2])
    rc, _, err = netlite('export', str(d / 'cut.safetensors'), '--model', 'mlp')
    return None if rc == 1 and 'truncated or damaged' in err and 'Traceback' not in err else f"exit {rc}: {err[-200:]}"


@bad('`latest` pointing outside the run directory', ValueError, 'not a checkpoint of this run directory')
def _():
    d = tmpdir(); trainer(d / 'run').fit(steps=1); (d / 'run' / 'latest').write_text('../elsewhere/step-0000009'); find_checkpoint(d / 'run')


@bad('INT8 calibration on a batch with NaN', ValueError, 'Calibration batch 1 has NaN or inf')
def _():
    from netlite_nb.export import calibration_batches
    x = torch.rand(64, 1, 28, 28); x[3, 0, 0, 0] = float('nan')
    calibration_batches([(torch.rand(64, 1, 28, 28), 0), (x, 0), (x, 0)], (1, 28, 28))


@bad('ONNX parity check of a model with NaN weights', Exception, 'NaN or inf')
def _():
    from netlite_nb.export import export_onnx
    m = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    with torch.no_grad(): m[1].weight[0, 0] = float('nan')
    export_onnx(m, torch.randn(8, 1, 28, 28), tmpdir() / 'nan.onnx')


# resume with changed settings
def cut_run():
    d = tmpdir(); trainer(d, [Stop(5)]).fit(epochs=2); return d


def resume_refused(name, words, loaders_kw=None, **kw):
    def f():
        d = cut_run(); torch.manual_seed(0)
        t = Trainer(mlp(dropout=0.2), loaders(**(loaders_kw or {})), log_every=1, **{**KW, **kw})
        before = [p.clone() for p in t.model.parameters()]
        why = rejected(lambda: t.fit(epochs=3 if 'cosine' in words else 2, resume=d), ValueError, words)
        return why or (None if all(torch.equal(p, q) for p, q in zip(before, t.model.parameters())) else 'the model was changed')
    CASES.append(('input', name, f))

resume_refused('resume: extending a cosine run', 'cosine schedule ends at step')
resume_refused('resume: another effective batch (accum_steps)', 'effective batch of 128', accum_steps=2)
resume_refused('resume: another loader batch', "the loader's batch is 32", loaders_kw=dict(bs=32))
resume_refused('resume: AdamW state into SGD', 'holds the state of the AdamW optimizer', optimizer='sgd')
resume_refused('resume: AdamW state into adamw8bit', 'holds the state of the AdamW optimizer', optimizer='adamw8bit')
resume_refused('resume: a smaller dataset', 'batches per epoch', loaders_kw=dict(n=768))


@bad('resume into a model of another shape: refused, the model untouched', ValueError, 'Nothing was loaded')
def _():
    d = cut_run(); other = mlp(classes=7); before = [p.clone() for p in other.parameters()]   # the first layer fits, the last does not
    try: load_checkpoint(d, other)
    finally:
        if not all(torch.equal(p, q) for p, q in zip(before, other.parameters())): raise AssertionError('the model was changed')


@case('input', 'resume with a new lr: applied exactly (the schedule × new/old)')
def _():
    full = trainer(lr=1e-3).fit(epochs=2); d = cut_run()
    torch.manual_seed(0)
    res = Trainer(mlp(dropout=0.2), loaders(), log_every=1, checkpoint_every=2, lr=2e-3, **KW).fit(epochs=2, resume=d)
    lrs = lambda t: [r['lr'] for r in t.history if 'lr' in r]
    return None if all(abs(a - 2 * b) <= 1e-12 for a, b in zip(lrs(res)[5:], lrs(full)[5:])) else 'lr not scaled'


@case('input', 'netlite train --resume with another data.batch_size: a sentence, exit 2')
def _():
    d = tmpdir(); cfg = run_config(d, 3)
    rc, _, err = netlite('train', str(cfg), '--quiet', '--out', str(d / 'r'))
    rc, _, err = netlite('train', str(cfg), '--quiet', '--resume', str(d / 'r'), '--set', 'data.batch_size=128')
    return None if rc == 2 and 'keeps its effective batch' in err else f"exit {rc}: {err[-200:]}"



# --- issue 39: reliability, round two ------------------------------------------------------------------------------
class Skip(Exception): "A case this machine cannot run (its reason is printed; it is not counted)."

from netlite_nb.checkpoint import new_run_dir  # noqa: E402


def holder(d):
    "A live process holding run directory `d` (another run using it)."
    p = subprocess.Popen([sys.executable, '-c', f"import time; from netlite_nb.checkpoint import claim_run_dir; claim_run_dir({str(d)!r}); "
                          "print('claimed', flush=True); time.sleep(60)"], env=ENV, stdout=subprocess.PIPE, text=True)
    if p.stdout.readline().strip() != 'claimed': p.kill(); raise RuntimeError('the holder could not claim the directory')
    return p


@bad('two runs given one run directory: the second refused before it writes', RuntimeError, 'is in use by process')
def _():
    d = tmpdir() / 'r'; p = holder(d)
    try: trainer(d).fit(steps=2)
    finally:
        p.kill(); p.wait()
        if [q.name for q in d.iterdir()] != ['.netlite.lock']: raise AssertionError('the second run wrote into the directory')


@case('fault', 'kill -9 of a run holding its directory: the next run takes the stale lock over')
def _():
    d = tmpdir() / 'r'; p = holder(d); p.kill(); p.wait()
    t = trainer(d).fit(steps=2)
    return None if t.step == 2 and not (d / '.netlite.lock').exists() else 'the stale lock blocked the run'


@bad("a new run in a finished run's directory: refused, its checkpoints kept", RuntimeError, 'holds another run')
def _():
    d = tmpdir(); trainer(d).fit(steps=2); before = (d / 'step-0000002' / 'state.pt').read_bytes()
    try: trainer(d).fit(steps=3)
    finally:
        if (d / 'step-0000002' / 'state.pt').read_bytes() != before: raise AssertionError("the other run's checkpoint changed")


@case('fault', 'four runs started in the same second: four run directories')
def _():
    d = tmpdir(); return None if len({new_run_dir(d, 'mlp') for _ in range(4)}) == 4 else 'names collide'


class Term(Callback):
    def __init__(self, at): self.at = at
    def after_step(self, t):
        if t.step == self.at: os.kill(os.getpid(), signal.SIGTERM)


@case('fault', 'SIGTERM mid-run (docker stop, Kubernetes, SLURM): a checkpoint, then resume gives the uninterrupted weights')
def _():
    d = tmpdir(); trainer(d / 'a').fit(epochs=2)
    cut = trainer(d / 'b', [Term(7)]).fit(epochs=2)
    if not (cut.interrupted and cut.stop_signal == 'SIGTERM'): return 'not stopped by SIGTERM'
    trainer(d / 'b').fit(epochs=2, resume=d / 'b')
    return None if same(weights(d / 'a'), weights(d / 'b')) else 'resume not exact'


def loading_torch(p)->bool:
    "True once process `p` has begun loading torch's libraries: inside netlite's main, whose commands import it."
    try: return 'libtorch' in Path(f'/proc/{p.pid}/maps').read_text()
    except OSError: return False


def signalled(args, sig, when):
    p = subprocess.Popen(CLI + args, env=ENV, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not when(p) and p.poll() is None and time.time() - t0 < 300: time.sleep(0.02)
    p.send_signal(sig); _, err = p.communicate(timeout=300)
    return p.returncode, err


@case('fault', 'SIGTERM to netlite train: a checkpoint, a sentence naming --resume, exit 143')
def _():
    d = tmpdir(); run = d / 'r'
    rc, err = signalled(['train', str(run_config(d, 400)), '--quiet', '--out', str(run)], signal.SIGTERM, lambda p: (run / 'latest').exists())
    return None if rc == 143 and '--resume' in err and 'Traceback' not in err and latest(run) else f"exit {rc}: {err[-200:]}"


for _sig, _rc in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
    def _f(sig=_sig, rc=_rc):
        got, err = signalled(['plan', '--model', 'mlp'], sig, loading_torch)
        return None if got == rc and 'Traceback' not in err and 'stopped by' in err else f"exit {got}: {err[-200:]}"
    case('fault', f"{signal.Signals(_sig).name} while netlite imports torch: a sentence, exit {_rc}")(_f)


def small_disk(size):
    if os.geteuid() != 0: raise Skip('a real full disk needs a tmpfs mount, which needs root')
    d = tmpdir() / 'disk'; d.mkdir()
    r = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(d)], capture_output=True, text=True)
    if r.returncode: raise Skip(f"mount -t tmpfs failed: {r.stderr.strip()[:200]}")
    return d


@case('fault', 'a real full disk (tmpfs) while safetensors writes: a sentence, the last checkpoint kept, nothing half-written, resume works')
def _():
    d = small_disk('2m')
    try:
        run = d / 'r'; t = trainer(run, lr_schedule=None).fit(steps=2)
        (d / 'filler').write_bytes(b'\0' * (shutil.disk_usage(d).free - 12 * 1024))
        why = rejected(lambda: t.fit(steps=2), OSError, 'No space left on device while writing', 'step-0000002 is still valid')
        if why: return why
        if [p for p in run.iterdir() if '.tmp-' in p.name]: return 'a half-written checkpoint stayed on the full disk'
        (d / 'filler').unlink()
        return None if trainer(run, lr_schedule=None).fit(steps=2, resume=run).step >= 2 else 'resume failed'
    finally: subprocess.run(['umount', '-l', str(d)])


@case('fault', 'a real full disk (tmpfs) during an ONNX export: a sentence, no truncated .onnx')
def _():
    from netlite_nb.export import export_onnx
    d = small_disk('256k')
    try:
        m = nn.Sequential(nn.Linear(20, 4096), nn.ReLU(), nn.Linear(4096, 10)).eval()
        why = rejected(lambda: export_onnx(m, torch.randn(16, 20), d / 'm.onnx', measure_speed=False), OSError, 'No space left on device')
        return why or (None if not list(d.iterdir()) else f"left {[p.name for p in d.iterdir()]}")
    finally: subprocess.run(['umount', '-l', str(d)])


@case('fault', 'a re-export that fails its parity check: the good .onnx at that path is kept')
def _():
    from netlite_nb.export import ExportError, export_onnx
    class Noisy(nn.Module):
        def __init__(self): super().__init__(); self.l = nn.Linear(20, 10)
        def forward(self, x): return self.l(x) + torch.randn(x.shape[0], 10)
    d, x = tmpdir(), torch.randn(16, 20)
    export_onnx(nn.Linear(20, 10).eval(), x, d / 'm.onnx', measure_speed=False); good = (d / 'm.onnx').read_bytes()
    why = rejected(lambda: export_onnx(Noisy().eval(), x, d / 'm.onnx', measure_speed=False), ExportError, 'does not compute')
    return why or (None if (d / 'm.onnx').read_bytes() == good and len(list(d.iterdir())) == 1 else 'the good file was replaced')


@case('fault', "rotation: the user's own step-0000002-good copy in the run directory is kept")
def _():
    d = tmpdir(); t = trainer(d, keep_checkpoints=1).fit(steps=2); shutil.copytree(d / 'step-0000002', d / 'step-0000002-good')
    t.fit(steps=4)
    return None if (d / 'step-0000002-good').is_dir() else 'deleted'


@case('fault', 'one damaged line of metrics.jsonl: the run resumes')
def _():
    d = tmpdir(); trainer(d, [Stop(5)]).fit(steps=8)
    lines = (d / 'metrics.jsonl').read_text().splitlines(); lines[1] = 'garbage{'; (d / 'metrics.jsonl').write_text('\n'.join(lines) + '\n')
    with warnings.catch_warnings(): warnings.simplefilter('ignore'); t = trainer(d).fit(steps=8, resume=d)
    return None if t.step == 8 else f"stopped at {t.step}"


@case('fault', 'symlinks planted in a shared run directory (.config.yaml.tmp, a dangling metrics.jsonl): never followed')
def _():
    d = tmpdir(); victim, elsewhere, run = d / 'victim', d / 'elsewhere', d / 'shared'
    victim.write_text('precious'); t = trainer(run).fit(steps=2)
    for n in ('.config.yaml.tmp', f'.config.yaml.tmp-{os.getpid()}', f'.latest.tmp-{os.getpid()}'): (run / n).symlink_to(victim)
    (run / 'metrics.jsonl').unlink(); (run / 'metrics.jsonl').symlink_to(elsewhere)
    t.fit(steps=2)
    return None if victim.read_text() == 'precious' and not elsewhere.exists() else 'a link was followed'


def rewritten(d, f):
    ck = find_checkpoint(d); s = torch.load(ck / 'state.pt', weights_only=True); f(s); torch.save(s, ck / 'state.pt'); (ck / 'manifest.json').unlink()


@bad('a state.pt of a newer format: refused', ValueError, 'newer netlite_nb')
def _():
    d = tmpdir(); trainer(d).fit(steps=2); rewritten(d, lambda s: s.update(format=99)); read_state(d)


@bad('a DEFLATE-compressed state.pt (a zip bomb): refused before it inflates', ValueError, 'compressed entries')
def _():
    import zipfile
    d = tmpdir(); trainer(d).fit(steps=1); ck = find_checkpoint(d); p = ck / 'state.pt'
    with zipfile.ZipFile(p) as z: entries = [(i.filename, z.read(i)) for i in z.infolist()]
    with zipfile.ZipFile(p, 'w', zipfile.ZIP_DEFLATED) as z:
        for n, b in entries: z.writestr(n, b)
    (ck / 'manifest.json').unlink(); load_checkpoint(d, mlp(dropout=0.2))


@bad('resume of a float64 run into a float32 model: refused, the dtypes named', ValueError, 'float64', 'float32')
def _():
    d = tmpdir(); Trainer(mlp().double(), [(x.double(), y) for x, y in loaders()[0]], run_dir=d, lr_schedule=None, **KW).fit(steps=2)
    Trainer(mlp(), loaders(), lr_schedule=None, **KW).fit(steps=3, resume=d)


def images(mode):
    import numpy as np
    from PIL import Image
    def f():
        d = tmpdir()
        for c in 'ab':
            (d / c).mkdir()
            for i in range(3):
                a = np.full((8, 8), 0.531)
                im = Image.fromarray((a * 65535).astype(np.uint16)) if mode == 'I;16' else Image.fromarray(a.astype(np.float32), 'F')
                im.save(d / c / f"{i}.{'png' if mode == 'I;16' else 'tif'}")
        m = float(image_folder(d, size=8, channels=1)[0][0][0].mean())
        return None if abs(m - 0.531) < 0.01 else f"mean {m:.3f} for a true 0.531"
    return f

case('input', 'an image folder of 16-bit grey PNGs (I;16): their values, not white')(images('I;16'))
case('input', 'an image folder of float TIFFs in [0, 1] (F): their values, not black')(images('F'))
bad('a 400 KB configuration: refused before it is read', ConfigError, 'CONFIG_BYTES')(
    lambda: load_config(yaml_file('strategy: cpu\n' + '# padding\n' * 40_000)))


@case('input', 'a long plain list (3,000 values over a limit of 1,000): read, not called an alias bomb')
def _():
    import netlite_nb.strategies as strategies
    old, strategies.YAML_LIMIT = strategies.YAML_LIMIT, 1000
    try: return None if len(load_yaml('[' + ', '.join(['1'] * 3000) + ']')) == 3000 else 'wrong length'
    except ConfigError as e: return f"refused: {str(e)[:100]}"
    finally: strategies.YAML_LIMIT = old


def cli_bytes(name, data, rc_want, *words, env=None):
    def f():
        p = tmpdir() / 'c.yaml'; p.write_bytes(data)
        old = {k: os.environ.get(k) for k in (env or {})}; os.environ.update(env or {})
        try: rc, out, err = netlite('train', str(p), '--quiet', '--out', str(tmpdir() / 'r'))
        except Exception as e: return f"raised {type(e).__name__}: {str(e)[:150]}"
        finally:
            for k, v in old.items():
                if v is None: os.environ.pop(k, None)
                else: os.environ[k] = v
        if rc != rc_want or 'Traceback' in err: return f"exit {rc}: {err[-200:]}"
        return None if all(w in err for w in words) else f"message lacks {words}: {err[-200:]}"
    CASES.append(('input', name, f))

_OK = "# réglages\nstrategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample}\ntrain: {steps: 1}\n"
cli_bytes('netlite train: a UTF-16 configuration (with its BOM): read', _OK.encode('utf-16'), 0)
cli_bytes('netlite train: a Latin-1 configuration: a sentence, exit 2', _OK.encode('latin-1'), 2, 'is not UTF-8 text')
cli_bytes('netlite train: WORLD_SIZE=two, NETLITE_TRACEBACK=0: a sentence, no traceback', _OK.encode(), 1, "WORLD_SIZE is 'two'",
          env={'RANK': '0', 'WORLD_SIZE': 'two', 'NETLITE_TRACEBACK': '0'})
for _line, _words in (('batch_size: 0', 'data.batch_size must be a whole number'), ('batch_size: -8', 'data.batch_size must be a whole number'),
                      ('batch_size: 100000', 'more than the 4000 training samples')):
    cli_case(f"netlite train: data.{_line}", f"strategy: cpu\nmodel: {{name: mlp}}\ndata: {{name: mnist_sample, {_line}}}\ntrain: {{steps: 1}}\n", 2, _words)
cli_case('netlite train: train.seed 2**70', "strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample}\ntrain: {steps: 1, seed: 1180591620717411303424}\n",
         2, 'train.seed must be a whole number')
for _what, _b, _w in (('dicts', {'x': torch.zeros(4, 20), 'y': torch.zeros(4, dtype=torch.long)}, 'is a dict'),
                      ('(x, y, w)', (torch.zeros(4, 20), torch.zeros(4, dtype=torch.long), torch.ones(4)), 'has 3 parts'),
                      ('x alone', torch.zeros(4, 20), 'inputs without targets'), ('0-dim tensors', (torch.tensor(1.), torch.tensor(0)), '0-dim')):
    bad(f"loader batches that are {_what}: a sentence", DataCheckError, _w)(lambda b=_b: Trainer(mlp(), [b] * 3, **KW).fit(steps=1))


@case('input', 'netlite plan --model FILE.py:Name: built on the meta device (no memory), or a note saying it could not be')
def _():
    d = tmpdir(); (d / 'big.py').write_text(
        "import torch.nn as nn\nclass Big(nn.Module):\n    def __init__(self):\n        super().__init__(); self.a = nn.Linear(784, 256); self.b = nn.Linear(256, 10)\n"
        "        open(__file__ + '.device', 'w').write(str(self.a.weight.device))\n    def forward(self, x): return self.b(self.a(x.flatten(1)).relu())\n"
        "class Stubborn(Big):\n    def __init__(self): super().__init__(); self.scale = float(self.a.weight.abs().max())\n")
    rc, _, err = netlite('plan', '--model', f"{d / 'big.py'}:Big")
    if rc != 0 or (d / 'big.py.device').read_text() != 'meta': return f"built on {(d / 'big.py.device').read_text()}, exit {rc}"
    rc, _, err = netlite('plan', '--model', f"{d / 'big.py'}:Stubborn")
    return None if rc == 0 and 'could not be built on the meta device' in err else f"exit {rc}: {err[-200:]}"


@case('fault', 'SIGTERM to netlite train --nproc-per-node 2 (torchrun): every process stops at one step, a checkpoint, exit 143')
def _():
    d = tmpdir(); run = d / 'r'
    (d / 'c.yaml').write_text("strategy: cpu\nmodel: {name: mlp}\ndata: {name: mnist_sample, batch_size: 64}\ntrain: {steps: 5000, checkpoint_every: 50}\n")
    rc, err = signalled(['train', str(d / 'c.yaml'), '--nproc-per-node', '2', '--out', str(run), '--quiet'], signal.SIGTERM, lambda p: (run / 'latest').exists())
    ok = rc == 143 and 'every process saved the last finished step' in err and 'Unable to shutdown' not in err and 'Traceback' not in err
    return None if ok and read_state(run)['step'] < 5000 else f"exit {rc}: {err[-300:]}"

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--kills', type=int, default=10); a = ap.parse_args()
    CASES.insert(0, ('fault', f"kill -9 of netlite train at {a.kills} random moments, each resumed: the uninterrupted weights", kill_9(a.kills)))
    failed, tally = [], {'fault': [0, 0], 'input': [0, 0]}
    for kind, name, f in CASES:
        t0 = time.perf_counter()
        try: why = f()
        except Skip as e: print(f"skip {kind:<5} {name} -- {e}", flush=True); continue
        except Exception as e: why = f"{type(e).__name__}: {str(e)[:200]}"
        tally[kind][1] += 1; tally[kind][0] += why is None
        print(f"{'ok ' if why is None else 'NOT'} {kind:<5} {name} ({time.perf_counter() - t0:.1f} s){'' if why is None else ' -- ' + why}", flush=True)
        if why is not None: failed.append(f"{kind}: {name}: {why}")
    print(f"\nfaults survived: {tally['fault'][0]} / {tally['fault'][1]}")
    print(f"bad inputs rejected clearly (or applied exactly): {tally['input'][0]} / {tally['input'][1]}")
    print('not: ' + ('\n     '.join(failed) if failed else 'none'))
