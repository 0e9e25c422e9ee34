"""Train each zoo model on the embedded MNIST sample and print held-out accuracy and wall time, netlite vs plain PyTorch.

Both sides train the same architecture with the same recipe (AdamW + OneCycle, label smoothing 0.05, the per-model
epochs/lr/augmentation/batch size in RECIPES, batch 64 unless it says) from the same initial weights:
  netlite : `mnist_sample_loaders` (device-resident `TensorLoader`, seeded, optional augmentation) + `create_model`;
  plain   : `torch.utils.data.DataLoader` over a `TensorDataset` of the same 4,000 images, a hand-written loop.
Both sides run the hand-written loop below rather than chapter 07's `Trainer`, so the difference measured is the data
path alone. Held-out accuracy is on the fixed 1,000-image split.

    PYTHONPATH=$PWD python bench/zoo_accuracy.py                  # mlp and netlite_tiny (the targets)
    PYTHONPATH=$PWD python bench/zoo_accuracy.py --models all     # every model of the zoo
"""
from __future__ import annotations
import argparse, copy, os, time
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from netlite_nb.data import mnist_sample, mnist_sample_loaders, BatchAugment
from netlite_nb.models import create_model, list_models

RECIPES = {  # tuned on this sample: short runs learn faster without augmentation for the CNNs; the MLP needs it
    'mlp': dict(epochs=30, lr=3e-3, augment=True, wd=0.05),
    'netlite_tiny': dict(epochs=6, lr=4e-3, augment=False, wd=0.05, bs=32),
    'netlite_small': dict(epochs=5, lr=3e-3, augment=False, wd=0.05),
    'resnet': dict(epochs=5, lr=5e-3, augment=False, wd=0.05),
    'vit_tiny': dict(epochs=10, lr=2e-3, augment=True, wd=0.05),
}
TARGETS = {'mlp': 0.95, 'netlite_tiny': 0.975}

def train(model, train_batches, valid_batches, epochs, lr, wd, steps_per_epoch):
    "AdamW + OneCycle, label smoothing; returns (held-out accuracy, wall seconds, CPU seconds of this process)."
    t0, c0 = time.perf_counter(), time.process_time()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, lr, total_steps=epochs * steps_per_epoch, pct_start=0.25)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.05)
    for _ in range(epochs):
        model.train()
        for xb, yb in train_batches():
            loss = loss_fn(model(xb), yb)
            opt.zero_grad(set_to_none=True); loss.backward(); opt.step(); sched.step()
    model.eval(); correct = n = 0
    with torch.no_grad():
        for xb, yb in valid_batches():
            correct += int((model(xb).argmax(1) == yb).sum()); n += len(yb)
    return correct / n, time.perf_counter() - t0, time.process_time() - c0

def run(name, seed=0):
    r = RECIPES[name]
    bs = r.get('bs', 64)
    torch.manual_seed(seed)
    init = create_model(name)
    out = {}
    # netlite: the library's data path
    dls = mnist_sample_loaders(batch_size=bs, augment=r['augment'], seed=seed)
    torch.manual_seed(seed)
    out['netlite'] = train(copy.deepcopy(init), lambda: dls.train, lambda: dls.valid, r['epochs'], r['lr'], r['wd'], len(dls.train))
    # plain PyTorch: DataLoader over the same tensors (the same batch augmentation when the recipe has it)
    tr, va = mnist_sample()
    g = torch.Generator().manual_seed(seed)
    dl = DataLoader(TensorDataset(tr.x, tr.y), batch_size=bs, shuffle=True, generator=g)
    vdl = DataLoader(TensorDataset(va.x, va.y), batch_size=2 * bs)
    aug = BatchAugment.digits(seed) if r['augment'] else None   # the same augmentation, its own seeded draws
    batches = (lambda: ((aug(x), y) for x, y in dl)) if aug else (lambda: dl)
    torch.manual_seed(seed)
    out['plain'] = train(copy.deepcopy(init), batches, lambda: vdl, r['epochs'], r['lr'], r['wd'], len(dl))
    return out, sum(p.numel() for p in init.parameters()), r

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--models', default='mlp,netlite_tiny', help="comma-separated names, or 'all'")
    p.add_argument('--threads', type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    names = list_models() if a.models == 'all' else a.models.split(',')
    print(f"load average {os.getloadavg()[0]:.1f} at start; 'cpu' is this process's CPU seconds (what an idle machine would need at most, with {a.threads} thread(s))")
    print(f"embedded MNIST sample, 4000 train / 1000 held out, {a.threads} threads, {os.cpu_count()} CPUs visible, torch {torch.__version__}")
    print(f"{'model':14} {'params':>9} {'epochs':>6} {'aug':>4} {'batch':>5} | {'netlite acc':>11} {'wall':>7} {'cpu':>7} | {'plain acc':>9} {'wall':>7} {'cpu':>7} | target")
    for n in names:
        out, params, r = run(n)
        (na, nt, nc), (pa, pt, pc) = out['netlite'], out['plain']
        tgt = TARGETS.get(n)
        verdict = '' if tgt is None else (f"acc ≥{tgt:.1%}: {'met' if na >= tgt else 'MISSED'}; wall ≤90 s: {'met' if nt <= 90 else 'MISSED'}"
                                          f"; cpu ≤90 s: {'met' if nc <= 90 else 'MISSED'}")
        print(f"{n:14} {params:>9,} {r['epochs']:>6} {'yes' if r['augment'] else 'no':>4} {r.get('bs', 64):>5} | {na:>11.1%} {nt:>6.1f}s {nc:>6.1f}s | {pa:>9.1%} {pt:>6.1f}s {pc:>6.1f}s | {verdict}", flush=True)

if __name__ == '__main__': main()
