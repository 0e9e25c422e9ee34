"Shared by the tests: small loaders, a loss trace, a real SIGINT, an optimizer that counts its steps, a folder of colour images."
import os, signal
import torch
from torch.utils.data import DataLoader
from netlite_nb.train import Callback
from netlite_nb.fixtures import blobs

KW = dict(device='cpu', progress=False, verbose=False, plan=False)


def loaders(bs=64, n=1024):
    ds = blobs(n)
    tr, va = torch.utils.data.random_split(ds, [n - 256, 256], generator=torch.Generator().manual_seed(0))
    return DataLoader(tr, bs, shuffle=True), DataLoader(va, 256)


def losses(t): return [(r['step'], r['loss']) for r in t.history if 'loss' in r]


class Sigint(Callback):
    "Send this process a real SIGINT (what Ctrl-C and Jupyter's stop button do) after step `at`."
    def __init__(self, at): self.at = at
    def after_step(self, t):
        if t.step == self.at: os.kill(os.getpid(), signal.SIGINT)


class StepCounter(torch.optim.AdamW):
    "AdamW that records the gradient norm it is given (to check clipping) and how often it stepped."
    def __init__(self, params, lr=1e-3): super().__init__(params, lr=lr); self.norms = []
    def step(self, closure=None):
        gs = [p.grad for g in self.param_groups for p in g['params'] if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in gs])).item())
        return super().step(closure)


def image_folder(root, classes=4, per_class=48, size=12):
    "`classes` folders of `per_class` random colour PNGs (size×size) under `root`, as chapter 04's image_folder reads them."
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{i}.png")
