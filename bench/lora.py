"""LoRA against full fine-tuning on chapter 09a's offline scenario: chapter 05's MLP (hidden layers 1024, 1024; 1.9 M parameters)
trained by the book on the digits 0-4 of the embedded MNIST sample, then adapted to 5-9.

    python bench/lora.py                         # 3 seeds, 20 epochs of adaptation (about 10 minutes on 2 busy cores)
    python bench/lora.py --seeds 1 --epochs 4    # the chapter's short version
    python bench/lora.py --dropout 0             # LoRA without dropout on the adapters' input

Per seed: the base trains on 0-4 for 2 epochs (AdamW, lr 1e-3); copies of it train on 5-9 for the same number of epochs, in full
(AdamW, lr 1e-3) and with LoRA (rank 8, alpha 16, dropout 0.1 on every layer, the 10-way head trained in full; AdamW, lr 3e-3), with chapter 07's
Trainer; accuracy is on the held-out 5-9 images. Memory, for a training step at batch 64 with AdamW:
- planned: chapter 01's `plan_memory` on the 'cpu' target (tensors and the CPU kernel workspace);
- tensors only: the same plan without the workspace, minus the measured peak (what the kernels keep is the rest);
- measured: the peak resident memory of two training steps in a fresh process, with glibc and MKL set up as
  bench/budget_accuracy.py sets them (its `measure`, see its docstring), so the resident set tracks live tensors;
- time: median over paired steps of full and LoRA in one process (the machine is shared and noisy).
"""
import argparse, os, statistics, subprocess, sys, time
from pathlib import Path
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's netlite_nb, not whichever one is installed
sys.path.insert(0, str(ROOT / 'bench'))
import budget_accuracy  # the fresh-process RSS measurement of chapter 01's accuracy bench
from netlite_nb.budget import plan_memory
from netlite_nb.lora import _digit_loaders, _fine_tune, add_lora, compare_adaptation
from netlite_nb.models import create_model

LORA = dict(rank=8, alpha=16.0, dropout=0.1, train=['head'])
BATCH = 64

def digits_mlp(): return create_model('mlp', hidden=(1024, 1024), dropout=0.0)

def build(kind:str):
    "The model a 'full' or 'lora' step trains (weights random: the memory of a step does not depend on their values)."
    return digits_mlp() if kind == 'full' else add_lora(digits_mlp(), **LORA)

def measured(kind:str)->int:
    "Peak bytes of two AdamW steps of `kind` at batch 64, measured in a fresh process by budget_accuracy.measure."
    out = subprocess.run([sys.executable, __file__, '--measure', kind, '--dropout', str(LORA['dropout'])], env={**os.environ, **budget_accuracy.ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])

def planned(kind:str, device_or_gpu='cpu')->int:
    "The planner's peak: on the 'cpu' target with the CPU kernel workspace, with None tensors only."
    torch.manual_seed(0)
    return plan_memory(build(kind), (torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))), device_or_gpu=device_or_gpu).peak

def step_times(pairs:int=30)->tuple[float, float]:
    "Median seconds of a full and a LoRA training step, timed in alternation."
    torch.manual_seed(0)
    x, y = torch.rand(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    models = {k: build(k) for k in ('full', 'lora')}
    opts = {k: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3) for k, m in models.items()}
    times = {k: [] for k in models}
    for i in range(pairs + 3):
        for k, m in models.items():
            t0 = time.perf_counter()
            F.cross_entropy(m(x), y).backward(); opts[k].step(); opts[k].zero_grad(set_to_none=True)
            if i >= 3: times[k].append(time.perf_counter() - t0)  # the first steps load kernels and create the optimizer state
    return statistics.median(times['full']), statistics.median(times['lora'])

def accuracy(seeds:int, epochs:int)->dict:
    "kind -> held-out accuracies on 5-9, one per seed; with the trainable and total parameter counts."
    acc, counts = {'full': [], 'lora': []}, {}
    for s in range(seeds):
        first, second = _digit_loaders([0, 1, 2, 3, 4], seed=s), _digit_loaders([5, 6, 7, 8, 9], seed=s)
        torch.manual_seed(s)
        base = digits_mlp()
        base_acc, _ = _fine_tune(base, first, 2, 1e-3)
        r = compare_adaptation(base, second, epochs=epochs, **LORA)
        for k in acc: acc[k].append(r.rows[k]['accuracy']); counts[k] = (r.rows[k]['trainable'], r.rows[k]['total'])
        print(f"seed {s}: base {base_acc:.2f}% on 0-4; on 5-9 full {r.rows['full']['accuracy']:.2f}%, LoRA {r.rows['lora']['accuracy']:.2f}% "
              f"(base before adapting {r.base_accuracy:.2f}%)", flush=True)
    return acc, counts

def report(seeds:int, epochs:int):
    acc, counts = accuracy(seeds, epochs)
    mem = {k: (planned(k), measured(k), planned(k, None)) for k in ('full', 'lora')}
    t_full, t_lora = step_times()
    print(f"\n{'':<6}{'accuracy (median)':>18}{'trainable':>22}{'planned':>11}{'measured':>11}{'plan error':>11}{'tensors only':>14}{'step':>9}")
    for k, t in (('full', t_full), ('lora', t_lora)):
        (tr, tot), (p, m, pt) = counts[k], mem[k]
        print(f"{k:<6}{statistics.median(acc[k]):>17.2f}%{tr:>12,} ({100*tr/tot:4.1f}%){p/2**20:>8.1f}Mi{m/2**20:>8.1f}Mi{100*(p-m)/m:>+10.1f}%"
              f"{(pt-m)/2**20:>+9.1f} MiB{1000*t:>7.1f}ms")
    gaps = [l - f for f, l in zip(acc['full'], acc['lora'])]
    print(f"LoRA/full: trainable {counts['lora'][0]/counts['full'][0]:.3f}, measured peak {mem['lora'][1]/mem['full'][1]:.2f}, "
          f"step time {t_lora/t_full:.2f}; accuracy LoRA - full per seed: {', '.join(f'{g:+.2f}' for g in gaps)} points "
          f"({epochs} epochs, {seeds} seeds)")

if __name__ == '__main__':
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--seeds', type=int, default=3)
    ap.add_argument('--epochs', type=int, default=20)
    ap.add_argument('--dropout', type=float, default=LORA['dropout'], help="dropout on the adapters' input")
    ap.add_argument('--measure', choices=['full', 'lora'], help=argparse.SUPPRESS)  # the fresh child process of `measured`
    a = ap.parse_args()
    LORA['dropout'] = a.dropout
    if a.measure:
        budget_accuracy.ALL[a.measure] = (lambda: build(a.measure), (1, 28, 28), ())  # the bench measures any model in ALL
        print(budget_accuracy.measure(a.measure, BATCH))
    else: report(a.seeds, a.epochs)
