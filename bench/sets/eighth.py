"""The eighth round, smaller, of autograd's shapes, measured before any change it led to (`--set eighth`)."""
import torch
from torch import nn
import torch.nn.functional as F


# an eighth round, smaller, of autograd's shapes: a user's Function saving on ctx, one layer shared across depths with auxiliary heads,
# in-place ops on views, non-reentrant checkpointing, an orthogonal parametrization, a gradient hook, a contrastive loss's similarity
# matrix, sorting and cumulative ops with gumbel_softmax, unfold/fold, a flow's slogdet; measured before any change
from torch.utils.checkpoint import checkpoint
class CtxAttr(torch.autograd.Function):
    "Saves its mask as a ctx attribute, not through save_for_backward (old-style user code)."
    @staticmethod
    def forward(ctx, x):
        ctx.mask = x > 0
        return x.clamp(min=0) * 2
    @staticmethod
    def backward(ctx, g): return g * ctx.mask * 2
class CtxNet(nn.Module):
    def __init__(s): super().__init__(); s.c1, s.c2, s.head = nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(32, 32, 3, padding=1), nn.Linear(32, 10)
    def forward(s, x): return s.head(CtxAttr.apply(s.c2(CtxAttr.apply(s.c1(x)))).mean((2, 3)))
class Albert(nn.Module):
    "One transformer layer shared across 4 depths (ALBERT), with an auxiliary head after each depth summed into the output."
    def __init__(s, d=128):
        super().__init__(); s.inp = nn.Linear(64, d); s.layer = nn.TransformerEncoderLayer(d, 4, 4 * d, 0.1, batch_first=True); s.head = nn.Linear(d, 10)
    def forward(s, x):
        h = s.inp(x); out = 0
        for _ in range(4): h = s.layer(h); out = out + s.head(h.mean(1))
        return out / 4
class InplaceViews(nn.Module):
    "In-place ops on views in many forms: masked_fill_ on a slice, a slice +=, index_add_ into a clone, scatter_add_, sigmoid_ on a chunk."
    def __init__(s, c=64):
        super().__init__(); s.a, s.b = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1); s.head = nn.Linear(c, 10)
    def forward(s, x):
        h = s.a(x).clone()
        h[:, :16].masked_fill_(h[:, :16] < -1, 0.0)
        h[:, 16:32] += 1.0
        g1, g2 = h.chunk(2, 1)
        g1 = g1.sigmoid() * g2
        h = s.b(torch.cat([g1, g2], 1))
        return s.head(h.mean((2, 3)))
class CkptNonReentrant(nn.Module):
    "Non-reentrant checkpointing of conv blocks (use_reentrant=False), as PyTorch now recommends."
    def __init__(s, c=64):
        super().__init__(); s.inp = nn.Conv2d(3, c, 3, padding=1)
        s.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()) for _ in range(3)); s.head = nn.Linear(c, 10)
    def forward(s, x):
        h = s.inp(x)
        for b in s.blocks: h = checkpoint(b, h, use_reentrant=False)
        return s.head(h.mean((2, 3)))
class Ortho(nn.Module):
    "An orthogonal weight (`parametrizations.orthogonal`: a matrix exponential for a square one), used again transposed."
    def __init__(s, d=256):
        super().__init__(); s.inp = nn.Linear(784, d); s.q = nn.utils.parametrizations.orthogonal(nn.Linear(d, d)); s.out = nn.Linear(d, 10)
    def forward(s, x):
        h = torch.tanh(s.q(torch.tanh(s.inp(x.flatten(1)))))
        return s.out(h + F.linear(torch.relu(F.linear(h, s.q.weight)), s.q.weight.T))  # the orthogonal weight used again, transposed
class GradHook(nn.Module):
    "A tensor hook in forward that scales the gradient (gradient reversal, as domain adaptation uses) and a retained intermediate grad."
    def __init__(s): super().__init__(); s.f = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU()); s.d = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.ReLU()); s.head = nn.Linear(32, 10)
    def forward(s, x):
        h = s.f(x)
        if h.requires_grad: h.register_hook(lambda g: -0.1 * g)
        return s.head(s.d(h).mean((2, 3)))
class Contrastive(nn.Module):
    "SimCLR's NT-Xent written out: two views' embeddings, a (2B x 2B) cosine-similarity matrix, the diagonal masked with -inf, logits over the other samples."
    def __init__(s): super().__init__(); s.enc = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 512), nn.ReLU(), nn.Linear(512, 128)); s.cls = nn.Linear(128, 10)
    def forward(s, x):
        z = F.normalize(torch.cat([s.enc(x), s.enc(x.flip(-1))]), dim=1)
        sim = (z @ z.T) / 0.1
        sim = sim.masked_fill(torch.eye(sim.shape[0], dtype=torch.bool, device=x.device), float('-inf'))
        return torch.cat([s.cls(z[: x.shape[0]]), sim[: x.shape[0]]], 1)  # class logits, then each sample's over the 2B-1 others
class SortPool(nn.Module):
    "Sorting and cumulative ops: features sorted per channel (sort + gather), cumprod and cumsum over time, gumbel_softmax(hard) routing."
    def __init__(s): super().__init__(); s.inp = nn.Linear(64, 64); s.route = nn.Linear(64, 8); s.head = nn.Linear(64 + 8, 10)
    def forward(s, x):
        h = torch.tanh(s.inp(x))                      # (B, T, 64)
        v, i = h.sort(1, descending=True)
        top = v[:, :8].mean(1) + torch.cumprod(torch.sigmoid(h), 1)[:, -1] + h.cumsum(1)[:, -1] / h.shape[1]
        r = F.gumbel_softmax(s.route(h), tau=1.0, hard=True).mean(1)
        return s.head(torch.cat([top, r], -1))
class FoldNet(nn.Module):
    "Patches out and back: F.unfold, a per-patch MLP, F.fold (overlapping, summed), pixel_unshuffle, area interpolation."
    def __init__(s): super().__init__(); s.mix = nn.Linear(3 * 16, 3 * 16); s.c = nn.Conv2d(12, 32, 3, padding=1); s.head = nn.Linear(32, 10)
    def forward(s, x):
        p = F.unfold(x, 4, stride=2, padding=1)                    # (B, 48, L)
        x = F.fold(torch.relu(s.mix(p.transpose(1, 2))).transpose(1, 2), x.shape[-2:], 4, stride=2, padding=1)
        x = F.pixel_unshuffle(F.interpolate(x, scale_factor=0.5, mode='area'), 2)
        return s.head(torch.relu(s.c(x)).mean((2, 3)))
class Flow(nn.Module):
    "A normalizing flow's layers: an invertible 1x1 convolution whose log-determinant (slogdet) joins the output, affine coupling."
    def __init__(s, c=16):
        super().__init__(); s.w = nn.Parameter(torch.linalg.qr(torch.randn(c, c))[0]); s.inp = nn.Conv2d(3, c, 3, padding=1)
        s.net = nn.Sequential(nn.Conv2d(c // 2, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, c, 3, padding=1)); s.head = nn.Linear(c, 10)
    def forward(s, x):
        h = s.inp(x); h = F.conv2d(h, s.w[:, :, None, None]); a, b = h.chunk(2, 1)
        sc, sh = s.net(a).chunk(2, 1); b = b * torch.sigmoid(sc + 2) + sh
        ld = torch.linalg.slogdet(s.w)[1] * h.shape[2] * h.shape[3]
        return s.head(torch.cat([a, b], 1).mean((2, 3))) + ld / 1e4

MODELS = {'ctx_attr': (CtxNet, (3, 64, 64), (16,)), 'albert': (Albert, (64, 64), (32,)), 'inplace_views': (InplaceViews, (3, 64, 64), (16,)),
          'ckpt_nonreentrant': (CkptNonReentrant, (3, 64, 64), (16,)), 'ortho': (Ortho, (1, 28, 28), (256,)), 'grad_hook': (GradHook, (3, 64, 64), (16,)),
          'contrastive': (Contrastive, (3, 32, 32), (256,)), 'sort_pool': (SortPool, (128, 64), (64,)), 'fold_net': (FoldNet, (3, 64, 64), (16,)),
          'flow': (Flow, (3, 64, 64), (16,))}
