"""The twelfth round: steps the trace itself changed (a loop-over-time scan, an attention block, a bidirectional GRU, a 3-D U-Net, a neural ODE), top-2 routing, an adaptive softmax (`--set twelfth`)."""
import torch
from torch import nn
import torch.nn.functional as F


# a twelfth round, of what issue 42 found: models whose backward adds a second gradient into a tensor's buffer (shared weights
# over time, one input read by three projections), which a trace under a dispatch mode added out of place; a mixture of experts
# whose routing the data decides; an adaptive softmax, whose clusters the targets decide; measured before any change
class SelectiveScan(nn.Module):
    "A Mamba-like selective scan written as a loop over time: the discretised decay and input (B, T, D, N) made at once, then read a step at a time."
    def __init__(s, d=64, n=16):
        super().__init__(); s.dt = nn.Linear(d, d); s.bc = nn.Linear(d, 2 * n); s.A_log = nn.Parameter(torch.zeros(d, n)); s.head = nn.Linear(d, 10)
    def forward(s, x):
        dt = F.softplus(s.dt(x)); Bm, Cm = s.bc(x).chunk(2, -1)
        dA = torch.exp(dt[..., None] * -torch.exp(s.A_log)); dBx = dt[..., None] * Bm[:, :, None] * x[..., None]
        h, ys = torch.zeros_like(dA[:, 0]), []
        for t in range(x.shape[1]):
            h = dA[:, t] * h + dBx[:, t]; ys.append((h * Cm[:, t, None]).sum(-1))
        return s.head(torch.stack(ys, 1).mean(1))

class AttentionBlock(nn.Module):
    "A pre-norm transformer block by hand: q, k and v projections of one input, softmax attention, a residual, an MLP."
    def __init__(s, d=128, h=4):
        super().__init__(); s.h = h; s.n1, s.n2 = nn.LayerNorm(d), nn.LayerNorm(d); s.q, s.k, s.v, s.o = (nn.Linear(d, d) for _ in range(4))
        s.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)); s.head = nn.Linear(d, 10)
    def forward(s, x):
        b, t, d = x.shape; y = s.n1(x)
        q, k, v = (f(y).view(b, t, s.h, d // s.h).transpose(1, 2) for f in (s.q, s.k, s.v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // s.h) ** 0.5, -1) @ v
        x = x + s.o(a.transpose(1, 2).reshape(b, t, d)); x = x + s.mlp(s.n2(x))
        return s.head(x.mean(1))

class BiGRU(nn.Module):
    "A 2-layer bidirectional GRU over the sequence, the last step's features classified."
    def __init__(s): super().__init__(); s.rnn = nn.GRU(32, 64, num_layers=2, bidirectional=True, batch_first=True); s.head = nn.Linear(128, 10)
    def forward(s, x): return s.head(s.rnn(x)[0][:, -1])

class UNet3D(nn.Module):
    "A small 3-D U-Net: two levels, a skip joined by concatenation, a voxel-wise 2-class head."
    def __init__(s):
        super().__init__(); c = lambda i, o: nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU())
        s.e1, s.e2, s.up, s.d1, s.out = c(1, 16), c(16, 32), nn.ConvTranspose3d(32, 16, 2, 2), c(32, 16), nn.Conv3d(16, 2, 1)
    def forward(s, x): a = s.e1(x); return s.out(s.d1(torch.cat([s.up(s.e2(F.max_pool3d(a, 2))), a], 1)))

class NeuralODE(nn.Module):
    "A neural ODE solved by 20 fixed Euler steps of one MLP field, backpropagated through the solver."
    def __init__(s, d=256):
        super().__init__(); s.f = nn.Sequential(nn.Linear(d + 1, d), nn.Tanh(), nn.Linear(d, d)); s.head = nn.Linear(d, 10)
    def forward(s, x):
        for i in range(20): x = x + 0.05 * s.f(torch.cat([x, x.new_full((x.shape[0], 1), i / 20)], 1))
        return s.head(x)

class MoETop2(nn.Module):
    "A top-2 mixture of 8 expert MLPs with real dispatch: each expert runs only on the tokens routed to it (torch.where, index_add_)."
    def __init__(s, d=128, e=8):
        super().__init__(); s.router = nn.Linear(d, e); s.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(e)); s.head = nn.Linear(d, 10)
    def forward(s, x):
        b, t, d = x.shape; z = x.reshape(-1, d); w, idx = torch.softmax(s.router(z), -1).topk(2, -1); out = torch.zeros_like(z)
        for i, f in enumerate(s.experts):
            tok, slot = torch.where(idx == i)
            out = out.index_add(0, tok, f(z[tok]) * w[tok, slot, None])
        return s.head((z + out).view(b, t, d).mean(1))

class AdaptiveLM(nn.Module):
    "An adaptive softmax over 20,000 classes (cutoffs 200, 2,000), its targets made from the input so the batch stays (x, y); returns the loss."
    def __init__(s):
        super().__init__(); s.f = nn.Linear(64, 128); s.asm = nn.AdaptiveLogSoftmaxWithLoss(128, 20000, [200, 2000], div_value=4.0)
    def forward(s, x):
        t = ((x[:, 0] * 3).exp() * 40).long().clamp(0, 19999)  # Zipf-like: most targets in the head, a few in the tails
        return s.asm(torch.tanh(s.f(x)), t).loss

MODELS = {'selective_scan': (SelectiveScan, (64, 64), (16,)), 'attention_block': (AttentionBlock, (16, 128), (64,)), 'bigru_100': (BiGRU, (100, 32), (32,)),
          'unet3d': (UNet3D, (1, 32, 32, 32), (4,)), 'neural_ode': (NeuralODE, (256,), (256,)), 'moe_top2': (MoETop2, (32, 128), (16,)),
          'adaptive_softmax': (AdaptiveLM, (64,), (256,))}
LOSSES = {'adaptive_softmax': lambda out, y: out}
TARGETS = {'unet3d': lambda bs: torch.randint(0, 2, (bs, 32, 32, 32))}  # a class per voxel
