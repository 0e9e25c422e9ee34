"""The fourth round of models brought as users bring them, measured before any change it led to (`--set fourth`)."""
import torch
from torch import nn
import torch.nn.functional as F
from .families import _tv

class GPT(nn.Module):
    "A small decoder: token and learned position embeddings, pre-norm blocks of causal `F.scaled_dot_product_attention` and a GELU MLP."
    def __init__(self, vocab=1000, d=128, T=128, layers=2, heads=4):
        super().__init__()
        self.emb, self.pos, self.h = nn.Embedding(vocab, d), nn.Parameter(torch.zeros(T, d)), heads
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(n1=nn.LayerNorm(d), qkv=nn.Linear(d, 3 * d), proj=nn.Linear(d, d), n2=nn.LayerNorm(d),
                                                       mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)))) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
    def forward(self, ids):
        x = self.emb(ids) + self.pos[:ids.shape[1]]
        B, T, D = x.shape
        for b in self.blocks:
            q, k, v = b['qkv'](b['n1'](x)).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
            x = x + b['proj'](F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D))
            x = x + b['mlp'](b['n2'](x))
        return self.head(self.norm(x)).transpose(1, 2)  # (batch, vocab, tokens), as cross_entropy takes it

def frozen_resnet():
    "Fine-tuning: a ResNet-18 whose backbone is frozen, only its last layer trained."
    m = _tv('resnet18')()
    for n, p in m.named_parameters(): p.requires_grad_(n.startswith('fc.'))
    return m

def conv3d(): return nn.Sequential(nn.Conv3d(1, 16, 3, padding=1), nn.BatchNorm3d(16), nn.ReLU(), nn.MaxPool3d(2),
                                   nn.Conv3d(16, 32, 3, padding=1), nn.BatchNorm3d(32), nn.ReLU(), nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(32, 10))

class GNUp(nn.Module):
    "GroupNorm and SiLU, a strided convolution down, bilinear `F.interpolate` and a `PixelShuffle` up: a diffusion-style decoder's pieces."
    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.GroupNorm(8, 64), nn.SiLU())
        self.up = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.PixelShuffle(2), nn.GroupNorm(8, 32), nn.SiLU(), nn.Conv2d(32, 10, 1))
    def forward(self, x): return self.up(F.interpolate(self.down(x), scale_factor=2, mode='bilinear', align_corners=False)).mean((2, 3))

class StyleNet(nn.Module):
    "Style transfer's pieces: reflection padding, a 9x9 convolution, InstanceNorm, residual blocks."
    def __init__(self, c=32):
        super().__init__()
        conv = lambda i, o, k, s=1: nn.Sequential(nn.ReflectionPad2d(k // 2), nn.Conv2d(i, o, k, s), nn.InstanceNorm2d(o, affine=True))
        self.stem = nn.Sequential(conv(3, c, 9), nn.ReLU(), conv(c, 2 * c, 3, 2), nn.ReLU())
        self.res = nn.ModuleList(nn.Sequential(conv(2 * c, 2 * c, 3), nn.ReLU(), conv(2 * c, 2 * c, 3)) for _ in range(2))
        self.head = nn.Conv2d(2 * c, 10, 1)
    def forward(self, x):
        x = self.stem(x)
        for r in self.res: x = x + r(x)
        return self.head(x).mean((2, 3))

class TCN(nn.Module):
    "A temporal convolutional net: causal dilated 1-D convolutions (1, 2, 4, 8) with weight-normed weights (a parametrization recomputed each forward)."
    def __init__(self, c=64):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.inp = nn.Conv1d(8, c, 1)
        self.layers = nn.ModuleList(wn(nn.Conv1d(c, c, 3, dilation=d)) for d in (1, 2, 4, 8))
        self.head = nn.Linear(c, 10)
    def forward(self, x):
        x = self.inp(x)
        for l in self.layers: x = x + F.relu(l(F.pad(x, (2 * l.dilation[0], 0))))
        return self.head(x.mean(-1))

class Bag(nn.Module):
    "A recommender's shape: an `nn.EmbeddingBag` (mean of 20 ids from 20,000) and an MLP."
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(20000, 64, mode='mean')
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    def forward(self, ids): return self.mlp(self.bag(ids))

class EinsumAttn(nn.Module):
    "Attention written with `torch.einsum`, with a causal mask made in forward (`torch.triu`, no device)."
    def __init__(self, d=128, h=4):
        super().__init__()
        self.qkv, self.proj, self.h, self.head = nn.Linear(d, 3 * d), nn.Linear(d, d), h, nn.Linear(d, 10)
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, D // self.h).unbind(2)
        s = torch.einsum('bqhd,bkhd->bhqk', q, k) / (D // self.h) ** 0.5
        s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf'))
        x = x + self.proj(torch.einsum('bhqk,bkhd->bqhd', s.softmax(-1), v).reshape(B, T, D))
        return self.head(x.mean(1))

class CheckpointedMLP(nn.Module):
    "A deep MLP that checkpoints its own blocks (`torch.utils.checkpoint`, non-reentrant), as a user's memory-saving model does."
    def __init__(self, d=512, n=4):
        super().__init__()
        self.inp = nn.Linear(784, d)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(n))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        from torch.utils.checkpoint import checkpoint
        x = self.inp(x.flatten(1))
        for b in self.blocks: x = x + checkpoint(b, x, use_reentrant=False)
        return self.head(x)

# a fourth round, brought after BROUGHT and measured before any change it led to: causal SDPA over tokens, a frozen backbone,
# 3-D convolutions, GroupNorm/interpolate/PixelShuffle, InstanceNorm with reflection padding, weight-normed dilated 1-D convolutions,
# an EmbeddingBag, einsum attention, a model checkpointing its own blocks
TOKENS = {'gpt': (1000, 1000), 'bag': (20000, 10)}  # (ids drawn from, labels drawn from)
MODELS = {'gpt': (GPT, (128,), (16,)), 'frozen_resnet': (frozen_resnet, (3, 64, 64), (32,)), 'conv3d': (conv3d, (1, 16, 32, 32), (8,)),
          'gn_up': (GNUp, (3, 64, 64), (8,)), 'style': (StyleNet, (3, 96, 96), (8,)), 'tcn': (TCN, (8, 512), (32,)),
          'bag': (Bag, (20,), (256,)), 'einsum_attn': (EinsumAttn, (128, 128), (16,)), 'ckpt_mlp': (CheckpointedMLP, (1, 28, 28), (256,))}
