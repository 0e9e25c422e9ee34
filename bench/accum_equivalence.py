"""Gradient accumulation is a bigger batch: micro-batch 16 × 8 accumulation vs batch 128, float64, same data order.

Trains the same float64 MLP (no BatchNorm, no dropout) twice with `Trainer` — once on loader batches of 128, once on
loader batches of 16 accumulated 8 per optimizer step — and once more with a plain PyTorch loop at batch 128 as the
reference. Prints the largest parameter difference after N steps (target <= 1e-10). The data size is not a multiple
of 128, so every epoch ends with a partial window: that is where weighting each micro-batch by its share of samples
(not 1/accum_steps) matters. A naive loop that divides by accum_steps is shown for contrast.

    python bench/accum_equivalence.py [--steps 200] [--n 1000]
"""
import argparse, torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from netlite_nb.train import Trainer, blobs, mlp, max_param_diff

def model(seed=0):
    torch.manual_seed(seed); return mlp(dropout=0.0).double()

def trainer_run(ds, bs, accum, steps, lr):
    t = Trainer(model(), DataLoader(ds, bs, shuffle=False), optimizer='sgd', lr=lr, weight_decay=0.0, device='cpu',
                accum_steps=accum, lr_schedule=None, progress=False, verbose=False, plan=False, seed=None)
    t.fit(steps=steps)
    return t.model, t.samples

def plain_run(ds, bs, accum, steps, lr, naive=False):
    "Plain PyTorch: accumulate `accum` loader batches; naive divides each loss by accum, else weights by samples."
    m = model(); opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9)
    batches, step = list(DataLoader(ds, bs, shuffle=False)), 0
    while step < steps:
        for i in range(0, len(batches), accum):
            win = batches[i:i + accum]; n = sum(len(y) for _, y in win)
            for x, y in win: (F.cross_entropy(m(x), y) * (1 / accum if naive else len(y) / n)).backward()
            opt.step(); opt.zero_grad(); step += 1
            if step == steps: break
    return m

if __name__ == '__main__':
    ap = argparse.ArgumentParser(); ap.add_argument('--steps', type=int, default=200); ap.add_argument('--n', type=int, default=1000)
    ap.add_argument('--lr', type=float, default=0.05)
    a = ap.parse_args()
    ds = blobs(a.n, dtype=torch.float64)
    big, s_big = trainer_run(ds, 128, 1, a.steps, a.lr)
    acc, s_acc = trainer_run(ds, 16, 8, a.steps, a.lr)
    ref = plain_run(ds, 128, 1, a.steps, a.lr)
    naive = plain_run(ds, 16, 8, a.steps, a.lr, naive=True)
    print(f"float64 MLP, {a.n} samples (last window {a.n % 128}), SGD momentum 0.9 lr {a.lr}, {a.steps} optimizer steps")
    print(f"{'run':<44}{'max |param diff| vs batch 128':>32}")
    print(f"{'Trainer, micro-batch 16 × 8 accumulation':<44}{max_param_diff(acc, big):>32.3e}")
    print(f"{'plain PyTorch loop, batch 128':<44}{max_param_diff(ref, big):>32.3e}")
    print(f"{'plain loop, 16 × 8, loss / accum_steps':<44}{max_param_diff(naive, big):>32.3e}")
    print(f"samples seen: {s_big} (batch 128) vs {s_acc} (16 × 8)")
    ok = max_param_diff(acc, big) <= 1e-10
    print(f"target <= 1e-10: {'met' if ok else 'NOT met'}")
