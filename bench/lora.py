"""LoRA against full fine-tuning on chapter 09a's offline scenario: chapter 05's MLP (hidden layers 1024, 1024; 1.9 M parameters)
trained by the book on the digits 0-4 of the embedded MNIST sample, then adapted to 5-9.

    python bench/lora.py                         # every arm below, 3 seeds, 20 epochs of adaptation (about 30 minutes on 2 busy cores)
    python bench/lora.py --seeds 1 --epochs 4    # a short look
    python bench/lora.py --arm full,lr=auto --arm rank=16,bias=all,lr=auto   # arms of your own (each --arm replaces the list)
    python bench/lora.py --qlora --json bench/results/lora/qlora.x86_64.json   # QLoRA against LoRA, the MLP and a CNN (3 seeds, 20 epochs)

An arm is `key=value` pairs: `full` (every weight trains; `bias=none` freezes the biases, a probe), or LoRA's `rank` (8), `alpha` (16), `dropout` (0.1), `bias` ('none',
'all', 'lora_only': which biases train, as peft's LoraConfig), `rslora` (1: scale alpha/sqrt(rank) instead of alpha/rank, as
peft's use_rslora), `bits` (4: a 4-bit NF4 frozen base with double-quantized scales, 8: an 8-bit one; 0: fp32), `model` ('mlp', the
default, or 'cnn': four 3x3 conv+BatchNorm+SiLU blocks of chapter 05, 32-64-256-256 channels, 0.76 M parameters), and `lr`: a number, 'auto' (the Trainer's lr='auto': chapter 07's `lr_find` with its default rule, the
steepest descent of the smoothed loss but not below a tenth of the rate at its lowest) or 'steepest' (`lr_find(rule='steepest')`),
so no arm's rate is tuned by hand; `epochs` (the arm's own, instead of --epochs). LoRA arms put adapters on every layer and train the 10-way head in full.

Per seed: the base trains on 0-4 for 2 epochs (AdamW, lr 1e-3); a copy of it trains on 5-9 for `--epochs` epochs in each arm, with
chapter 07's Trainer (AdamW, weight decay 0.01, warmup + cosine); accuracy is on the held-out 5-9 images, the training loss (the
median over seeds) on the 5-9 images it trained on, in eval mode: how far the arm got in fitting them. Per arm, for a training
step at batch 64 with AdamW:
- planned: chapter 01's `plan_memory` on the 'cpu' target (tensors and the CPU kernel workspace);
- tensors: the plan without the CPU kernel workspace, minus the measured peak (what the kernels keep is the rest);
- measured: the peak resident memory of two training steps in a fresh process, with glibc and MKL set up as
  bench/budget_accuracy.py sets them (its `measure`, see its docstring), so the resident set tracks live tensors;
- step: the median over paired steps, every arm's model stepped in turn in one process (the machine is shared and noisy);
  ratios are against full fine-tuning's step measured in the same rounds.

--qlora: for each model (mlp, cnn), LoRA on the fp32 base against LoRA on an NF4 base with double-quantized scales (blocks of
64; the head, which trains in full, stays fp32), at the chapter's rate 3e-3, `--seeds` seeds, `--epochs` epochs; per arm the
weight bytes three ways: planned (`plan_memory`'s 'weights' term of the arm's model, and of `fit_to_budget(finetune=True)`'s
LoRA / QLoRA lever, which adapts every layer, the head too), held (the bytes of the parameters and buffers), and measured:
the resident memory a fresh process gives back when it deletes the adapted model (glibc set up as for `measured`, so
freed tensors leave the resident set).
"""
from collections import OrderedDict
import argparse, copy, json, math, os, statistics, subprocess, sys, time
from pathlib import Path
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's netlite_nb, not whichever one is installed
sys.path.insert(0, str(ROOT / 'bench'))
import budget_accuracy  # the fresh-process RSS measurement of chapter 01's accuracy bench
from netlite_nb.budget import fit_to_budget, plan_memory
from netlite_nb.lora import LowRank, digit_loaders, fine_tune, add_lora
from netlite_nb.models import conv_bn_act, create_model
from netlite_nb.train import Trainer

BATCH = 64
LORA = dict(rank=8, alpha=16.0, dropout=0.1, bias='none', rslora=0, bits=0, lr=3e-3)
ARMS = ['full,lr=1e-3', 'full,lr=auto', 'full,lr=1e-3,bias=none',  # full fine-tuning: the book's default rate, lr_find's, biases frozen
        'lr=3e-3', 'lr=auto', 'lr=1e-3', 'lr=1e-2',                   # LoRA as the chapter had it; lr_find's rate; the rate either side
        'lr=3e-3,bias=all', 'lr=3e-3,dropout=0',                      # one mechanism at a time
        'lr=3e-3,rank=16', 'lr=3e-3,rank=16,rslora=1', 'lr=3e-3,rank=64']  # rank 64 is a probe: 13% of the parameters train

def parse_arm(spec:str)->dict:
    "'full,lr=auto' or 'rank=16,bias=all' -> the arm's settings (LoRA's defaults filled in)."
    kv = dict(p.split('=', 1) if '=' in p else (p, '1') for p in spec.split(',') if p)
    full = kv.pop('full', None) is not None
    arm = {'full': full, 'lr': 1e-3 if full else LORA['lr'], 'epochs': 0, 'model': 'mlp'} | ({'bias': 'all'} if full else {k: v for k, v in LORA.items() if k != 'lr'})
    for k, v in kv.items():
        if k not in arm: raise SystemExit(f"--arm {spec!r}: unknown key {k!r}; an arm takes full, lr, epochs, bias{'' if full else ', ' + ', '.join(LORA)}.")
        arm[k] = v if k in ('bias', 'model') or v in ('auto', 'steepest') else type(LORA.get(k, 1.0))(float(v))
    return arm

def digits_mlp(): return create_model('mlp', hidden=(1024, 1024), dropout=0.0)

def digits_cnn():
    "A plain CNN of chapter 05's conv blocks whose frozen 3x3 kernels dominate (0.76 M parameters); its head is named 'head' as the MLP's."
    blocks = [conv_bn_act(1, 32, 3, 2), conv_bn_act(32, 64, 3, 2), conv_bn_act(64, 256, 3), conv_bn_act(256, 256, 3, 2)]  # 28 -> 14 -> 7 -> 7 -> 4
    return torch.nn.Sequential(OrderedDict([*((f'c{i}', b) for i, b in enumerate(blocks)), ('pool', torch.nn.AdaptiveAvgPool2d(1)),
                                            ('flat', torch.nn.Flatten()), ('head', torch.nn.Linear(256, 10))]))

NETS = {'mlp': digits_mlp, 'cnn': digits_cnn}

def adapt(model, arm:dict):
    "`model` as the arm trains it: itself (bias=none: biases frozen), or with adapters (rsLoRA: each adapter's scale alpha/sqrt(rank))."
    if arm['full']:
        for n, p in model.named_parameters(): p.requires_grad_(arm['bias'] == 'all' or 'bias' not in n)
        return model
    m = add_lora(model, rank=int(arm['rank']), alpha=arm['alpha'], dropout=arm['dropout'], train=['head'], bias=arm['bias'],
                 base_bits=int(arm['bits']) or None, double_quant=True)
    if arm['rslora']:
        for a in m.modules():
            if isinstance(a, LowRank): a.scale = a.alpha / math.sqrt(a.rank)
    return m

def build(arm:dict): return adapt(NETS[arm['model']](), arm)  # weights random: the memory of a step does not depend on their values

def measured(spec:str)->int:
    "Peak bytes of two AdamW steps of the arm at batch 64, measured in a fresh process by budget_accuracy.measure."
    out = subprocess.run([sys.executable, __file__, '--measure', spec], env={**os.environ, **budget_accuracy.ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])

def planned(arm:dict, device_or_gpu='cpu')->int:
    "The planner's peak: on the 'cpu' target with the CPU kernel workspace, with None tensors only."
    torch.manual_seed(0)
    with budget_accuracy._as_measured():  # glibc's settings are those of the processes `measured` runs
        return plan_memory(build(arm), (torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))), device_or_gpu=device_or_gpu).peak

def weight_bytes(arm:dict)->tuple[int, int]:
    "(planned, held) bytes of the weights: the plan's 'weights' term, and the parameters and buffers the adapted model holds."
    torch.manual_seed(0)
    m = build(arm)
    p = plan_memory(m, (torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,)))).breakdown['weights']
    return p, sum(t.numel() * t.element_size() for t in (*m.parameters(), *m.buffers()))

def step_times(arms:dict, pairs:int=20)->dict:
    "spec -> median seconds of one training step, every arm's model stepped in turn in each round."
    torch.manual_seed(0)
    x, y = torch.rand(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    models = {s: build(a) for s, a in arms.items()}
    opts = {s: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3) for s, m in models.items()}
    times = {s: [] for s in models}
    for i in range(pairs + 3):
        for s, m in models.items():
            t0 = time.perf_counter()
            F.cross_entropy(m(x), y).backward(); opts[s].step(); opts[s].zero_grad(set_to_none=True)
            if i >= 3: times[s].append(time.perf_counter() - t0)  # the first steps load kernels and create the optimizer state
    return {s: statistics.median(t) for s, t in times.items()}

def accuracy(arms:dict, seeds:int, epochs:int)->dict:
    "spec -> one (accuracy %, lr used, trainable, total, loss on the training set) per seed."
    res = {s: [] for s in arms}
    for seed in range(seeds):
        first, second = digit_loaders([0, 1, 2, 3, 4], seed=seed), digit_loaders([5, 6, 7, 8, 9], seed=seed)
        bases = {}
        for net in dict.fromkeys(a['model'] for a in arms.values()):
            torch.manual_seed(seed)
            bases[net] = NETS[net]()
            print(f"seed {seed}: {net} base {fine_tune(bases[net], first, 2, 1e-3)['accuracy']:.2f}% on 0-4", flush=True)
        for s, a in arms.items():
            torch.manual_seed(1000 + seed)  # every arm's adapters start from the same random A: arms differ by their settings alone
            m, t0 = adapt(copy.deepcopy(bases[a['model']]), a), time.time()
            n = (sum(p.numel() for p in m.parameters() if p.requires_grad), m.lora_summary.total if getattr(m, 'lora_summary', None) else sum(p.numel() for p in m.parameters()))  # a quantized base's weights are buffers
            lr = a['lr'] if a['lr'] != 'steepest' else Trainer(m, second, device='cpu', progress=False, verbose=False, plan=False).lr_find(rule='steepest').suggestion
            r = fine_tune(m, second, int(a['epochs']) or epochs, lr)  # lr_find leaves model and data as they were: the run starts as any other
            res[s].append((r['accuracy'], r['lr'], *n, r['train_loss']))
            print(f"  {s:<28} {r['accuracy']:6.2f}% on 5-9, training loss {r['train_loss']:.4f} (lr {r['lr']:.3g}; {time.time() - t0:.0f} s)", flush=True)
    return res

def report(arms:dict, seeds:int, epochs:int, out:str|None):
    acc = accuracy(arms, seeds, epochs)
    mem = {s: (planned(a), measured(s), planned(a, None)) for s, a in arms.items()}
    times = step_times(arms)
    ref = next(s for s, a in arms.items() if a['full'])
    print(f"\n{epochs} epochs, {seeds} seeds; ratios and 'vs full' against {ref!r} (per seed)")
    print(f"{'arm':<28}{'accuracy per seed':>24}{'median':>8}{'vs full':>22}{'lr (median)':>12}{'trainable':>10}"
          f"{'planned':>9}{'measured':>10}{'plan err':>9}{'tensors':>9}{'peak':>6}{'step':>6}{'train loss':>11}")
    rows = {}
    for s in arms:
        a, (p, m, pt) = acc[s], mem[s]
        gaps = [x[0] - f[0] for x, f in zip(a, acc[ref])]
        rows[s] = dict(accuracy=[x[0] for x in a], lr=[x[1] for x in a], train_loss=[x[4] for x in a], trainable=a[0][2] / a[0][3], planned=p, measured=m, tensors=pt,
                       peak_ratio=m / mem[ref][1], step_ratio=times[s] / times[ref], step_s=times[s], gaps=gaps,
                       weights_planned=weight_bytes(arms[s])[0], weights_held=weight_bytes(arms[s])[1])
        r = rows[s]
        print(f"{s:<28}{' '.join(f'{x:6.2f}' for x in r['accuracy']):>24}{statistics.median(r['accuracy']):>8.2f}"
              f"{' '.join(f'{g:+5.1f}' for g in gaps):>22}{statistics.median(r['lr']):>12.3g}{100 * r['trainable']:>9.1f}%"
              f"{p / 2**20:>7.1f}Mi{m / 2**20:>8.1f}Mi{100 * (p - m) / m:>+8.1f}%{(pt - m) / 2**20:>+6.1f}MiB{r['peak_ratio']:>6.2f}{r['step_ratio']:>6.2f}{statistics.median(r['train_loss']):>11.4f}")
    for s, r in rows.items(): print(f"{s:<28} weights: planned {r['weights_planned'] / 2**20:.2f} MiB, held {r['weights_held'] / 2**20:.2f} MiB")
    if out:
        tags = dict(bench='lora', torch=torch.__version__, date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), cpu=budget_accuracy.machine(),
                    commit=subprocess.run(['git', 'rev-parse', '--short=10', 'HEAD'], capture_output=True, text=True, cwd=ROOT).stdout.strip() or None)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out + '.tmp').write_text(json.dumps(dict(**tags, epochs=epochs, seeds=seeds, reference=ref, arms=rows), indent=1))
        os.replace(out + '.tmp', out)

QLORA_ARMS = [f"lr=3e-3{bits},model={net}" for net in NETS for bits in ('', ',bits=4')]  # per model: fp32 LoRA, then QLoRA

def lever_weights(net:str)->dict:
    "'LoRA' / 'QLoRA' -> the 'weights' term of the plan `fit_to_budget(finetune=True)` gives with that lever, for the untrained `net`."
    torch.manual_seed(0)
    batch = (torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,)))
    changes = fit_to_budget(NETS[net](), batch, budget=2**40, finetune=True)  # a budget it fits: the levers alone, no combinations
    return {k: next(c.new_plan.breakdown['weights'] for c in changes if c.description.startswith(k + ' fine-tuning')) for k in ('LoRA', 'QLoRA')}

def weights_rss(spec:str)->int:
    "In a fresh process: the resident bytes given back when the arm's adapted model is deleted (after one built and deleted to warm up)."
    import ctypes, gc
    torch.set_num_threads(1)
    def settled():
        gc.collect(); ctypes.CDLL(None).malloc_trim(0)  # freed heap pages leave the resident set, as mmap'd tensors do on free
        return budget_accuracy.process_rss()
    del_me = build(parse_arm(spec)); del del_me  # first use of the kernels and lazy imports: not the model's
    settled()
    m = build(parse_arm(spec))
    held = settled()
    del m
    return held - settled()

def weights_measured(spec:str)->int:
    out = subprocess.run([sys.executable, __file__, '--measure-weights', spec], env={**os.environ, **budget_accuracy.ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])

def _tags()->dict:
    return dict(bench='lora', torch=torch.__version__, date=time.strftime('%Y-%m-%dT%H:%M:%S%z'), cpu=budget_accuracy.machine(),
                commit=subprocess.run(['git', 'rev-parse', '--short=10', 'HEAD'], capture_output=True, text=True, cwd=ROOT).stdout.strip() or None,
                dirty=bool(subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], capture_output=True, text=True, cwd=ROOT).stdout.strip()))

def _save(out:str, result:dict):
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out + '.tmp').write_text(json.dumps(result, indent=1))
    json.loads(Path(out + '.tmp').read_text())  # verified, then renamed into place
    os.replace(out + '.tmp', out)

def qlora_report(seeds:int, epochs:int, out:str|None):
    "Per model: fp32 LoRA against QLoRA (NF4, double-quantized scales): weight bytes planned, held and measured; held-out accuracy per seed."
    arms, tags = {s: parse_arm(s) for s in QLORA_ARMS}, _tags()  # the code as it was when the run started
    acc, rows, cmp = accuracy(arms, seeds, epochs), {}, {}
    for s, a in arms.items():
        planned_w, held = weight_bytes(a)
        rows[s] = dict(model=a['model'], bits=int(a['bits']), accuracy=[x[0] for x in acc[s]], train_loss=[x[4] for x in acc[s]], trainable=acc[s][0][2],
                       total=acc[s][0][3], weights_planned=planned_w, weights_held=held, weights_measured=weights_measured(s))
    print(f"\n{epochs} epochs, {seeds} seeds, lr 3e-3; QLoRA: NF4, blocks of 64, double-quantized scales; ratios QLoRA / fp32 LoRA")
    print(f"{'model':<6}{'arm':<8}{'planned':>10}{'lever':>10}{'held':>10}{'measured':>10}{'accuracy per seed':>24}{'median':>8}")
    for net in NETS:
        lv = lever_weights(net)
        (sl, l), (sq, q) = [(s, rows[s]) for s in QLORA_ARMS if rows[s]['model'] == net]
        med = lambda r: statistics.median(r['accuracy'])
        cmp[net] = dict(lora=sl, qlora=sq, lever_weights=lv, lever_ratio=lv['QLoRA'] / lv['LoRA'],
                        **{f'{k}_ratio': q[f'weights_{k}'] / l[f'weights_{k}'] for k in ('planned', 'held', 'measured')},
                        accuracy_lora=med(l), accuracy_qlora=med(q), difference=med(q) - med(l),
                        paired=[b - a for a, b in zip(l['accuracy'], q['accuracy'])])
        for name, r, k in (('LoRA', l, 'LoRA'), ('QLoRA', q, 'QLoRA')):
            print(f"{net:<6}{name:<8}{r['weights_planned'] / 2**20:>8.2f}Mi{lv[k] / 2**20:>8.2f}Mi{r['weights_held'] / 2**20:>8.2f}Mi{r['weights_measured'] / 2**20:>8.2f}Mi"
                  f"{' '.join(f'{x:6.2f}' for x in r['accuracy']):>24}{med(r):>8.2f}")
        c = cmp[net]
        print(f"{net:<6}{'ratio':<8}{c['planned_ratio']:>10.3f}{c['lever_ratio']:>10.3f}{c['held_ratio']:>10.3f}{c['measured_ratio']:>10.3f}"
              f"{' '.join(f'{d:+6.2f}' for d in c['paired']):>24}{c['difference']:>+8.2f}")
    if out: _save(out, dict(**tags, epochs=epochs, seeds=seeds, lr=3e-3, quant=dict(quant_type='nf4', blocksize=64, double_quant=True),
                            arms=rows, comparison=cmp))

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--seeds', type=int, default=3)
    ap.add_argument('--epochs', type=int, default=20)
    ap.add_argument('--arm', action='append', help="an arm, e.g. 'full,lr=auto' or 'rank=16,bias=all,lr=auto' (repeatable)")
    ap.add_argument('--json', help="also write the results to this file")
    ap.add_argument('--qlora', action='store_true', help="QLoRA against fp32 LoRA on the MLP and the CNN (replaces --arm)")
    ap.add_argument('--measure', help=argparse.SUPPRESS)  # the fresh child process of `measured`
    ap.add_argument('--measure-weights', help=argparse.SUPPRESS)  # the fresh child process of `weights_measured`
    a = ap.parse_args()
    if a.measure_weights: print(weights_rss(a.measure_weights))
    elif a.qlora: qlora_report(a.seeds, a.epochs, a.json)
    elif a.measure:
        budget_accuracy.ALL[a.measure] = (lambda: build(parse_arm(a.measure)), (1, 28, 28), ())  # the bench measures any model in ALL
        print(budget_accuracy.measure(a.measure, BATCH))
    else: report({s: parse_arm(s) for s in (a.arm or ARMS)}, a.seeds, a.epochs, a.json)
