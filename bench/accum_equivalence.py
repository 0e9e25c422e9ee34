"""Gradient accumulation is a bigger batch: micro-batch 16 × 8 accumulation vs batch 128, float64, same data order.

Trains the same float64 MLP (no BatchNorm, no dropout) twice with `Trainer` — once on loader batches of 128, once on
loader batches of 16 accumulated 8 per optimizer step — and once more with a plain PyTorch loop at batch 128 as the
reference (chapter 06b's `accum_run` is all four runs). Prints the largest parameter difference after N steps
(target <= 1e-10). The data size is not a multiple of 128, so every epoch ends with a partial window: that is where
weighting each micro-batch by its share of samples (not 1/accum_steps) matters. A naive loop that divides by
accum_steps is shown for contrast.

    python bench/accum_equivalence.py [--steps 200] [--n 1000]
"""
import argparse
from netlite_nb.train import Trainer
from netlite_nb.fixtures import accum_run, max_param_diff

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--steps', type=int, default=200); ap.add_argument('--n', type=int, default=1000)
    ap.add_argument('--lr', type=float, default=0.05)
    a = ap.parse_args()
    kw = dict(n=a.n, lr=a.lr)
    big, acc = accum_run(128, 1, a.steps, trainer=Trainer, **kw), accum_run(16, 8, a.steps, trainer=Trainer, **kw)
    ref, naive = accum_run(128, 1, a.steps, **kw), accum_run(16, 8, a.steps, naive=True, **kw)
    print(f"float64 MLP, {a.n} samples (last window {a.n % 128}), SGD momentum 0.9 lr {a.lr}, {a.steps} optimizer steps")
    print(f"{'run':<44}{'max |param diff| vs batch 128':>32}")
    print(f"{'Trainer, micro-batch 16 × 8 accumulation':<44}{max_param_diff(acc.model, big.model):>32.3e}")
    print(f"{'plain PyTorch loop, batch 128':<44}{max_param_diff(ref.model, big.model):>32.3e}")
    print(f"{'plain loop, 16 × 8, loss / accum_steps':<44}{max_param_diff(naive.model, big.model):>32.3e}")
    print(f"samples seen: {big.samples} (batch 128) vs {acc.samples} (16 × 8)")
    ok = max_param_diff(acc.model, big.model) <= 1e-10
    print(f"target <= 1e-10: {'met' if ok else 'NOT met'}")
