"Shared by the chapter 07 and 06a tests: small loaders, a loss trace, a real SIGINT, an optimizer that counts its steps."
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
