"""Fourteen model families the package does not ship, written as a user would bring them, two batch sizes each (`--set families`)."""
import torch
from torch import nn


# Families the package does not ship, written as a user would bring them. Inputs are float images/sequences, or token ids
# (an int shape) for the language model; targets are 10 classes (the LM: the next token at every position).
def _tv(name):
    def f():
        import torchvision.models as tvm
        return getattr(tvm, name)(weights=None, num_classes=10)  # no download: random weights
    f.__qualname__ = f'torchvision.models.{name}'  # two sets bringing the same torchvision model name the same thing
    return f

class EncDec(nn.Module):
    "A small U-Net: two conv stages down, Upsample back, the skip concatenated."
    def __init__(self, c=32):
        super().__init__()
        blk = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.d1, self.d2, self.pool = blk(3, c), blk(c, 2 * c), nn.MaxPool2d(2)
        self.up, self.u1, self.out = nn.Upsample(scale_factor=2, mode='nearest'), blk(3 * c, c), nn.Conv2d(c, 10, 1)
    def forward(self, x):
        s = self.d1(x)
        return self.out(self.u1(torch.cat([self.up(self.d2(self.pool(s))), s], 1))).mean((2, 3))


class RNNClassifier(nn.Module):
    def __init__(self, kind='lstm', d=128, layers=2, bidirectional=False, inputs=64):
        super().__init__()
        self.rnn = getattr(nn, kind.upper())(inputs, d, layers, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(d * (2 if bidirectional else 1), 10)
    def forward(self, x): return self.head(self.rnn(x)[0][:, -1])

class MHABlock(nn.Module):
    "A pre-norm block on nn.MultiheadAttention, called as most code calls it (need_weights left at its default)."
    def __init__(self, d=256, heads=4):
        super().__init__()
        self.n1, self.attn, self.n2 = nn.LayerNorm(d), nn.MultiheadAttention(d, heads, batch_first=True), nn.LayerNorm(d)
        self.ff, self.head = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)), nn.Linear(d, 10)
    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h)[0]
        return self.head((x + self.ff(self.n2(x))).mean(1))

class FusedMHABlock(MHABlock):
    "The same block asking for no attention weights, as nn.TransformerEncoderLayer does: PyTorch runs its fused attention kernel."
    def forward(self, x):
        h = self.n1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return self.head((x + self.ff(self.n2(x))).mean(1))

class HandAttention(nn.Module):
    "Attention written out by hand: q @ k.T, softmax, @ v (two layers)."
    def __init__(self, d=256, heads=4, layers=2):
        super().__init__()
        self.h, self.qkv = heads, nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj, self.head = nn.ModuleList(nn.Linear(d, d) for _ in range(layers)), nn.Linear(d, 10)
    def forward(self, x):
        B, T, D = x.shape
        for qkv, proj in zip(self.qkv, self.proj):
            q, k, v = qkv(x).view(B, T, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-2, -1) / (D // self.h) ** 0.5).softmax(-1)
            x = x + proj((a @ v).transpose(1, 2).reshape(B, T, D))
        return self.head(x.mean(1))

def conv1d(): return nn.Sequential(nn.Conv1d(16, 64, 7, padding=3), nn.BatchNorm1d(64), nn.ReLU(), nn.MaxPool1d(2),
                                   nn.Conv1d(64, 128, 5, padding=2), nn.BatchNorm1d(128), nn.ReLU(), nn.MaxPool1d(2),
                                   nn.Conv1d(128, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(128, 10))

class TiedLM(nn.Module):
    "Embedding, a GRU, and an output layer sharing the embedding's weight."
    def __init__(self, vocab=2000, d=256):
        super().__init__()
        self.emb, self.rnn = nn.Embedding(vocab, d), nn.GRU(d, d, batch_first=True)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight
    def forward(self, x): return self.out(self.rnn(self.emb(x))[0]).transpose(1, 2)  # (batch, vocab, tokens), as cross_entropy takes it

def ln_mlp(d=512): return nn.Sequential(nn.Flatten(), nn.Linear(784, d), *[m for _ in range(3) for m in (nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Dropout(0.1), nn.Linear(4 * d, d))], nn.Linear(d, 10))

MODELS = {'resnet18': (_tv('resnet18'), (3, 64, 64), (16, 64)), 'mobilenet_v2': (_tv('mobilenet_v2'), (3, 64, 64), (16, 64)),
            'squeezenet': (_tv('squeezenet1_1'), (3, 64, 64), (16, 64)), 'densenet121': (_tv('densenet121'), (3, 64, 64), (8, 32)),
            'encdec': (EncDec, (3, 64, 64), (8, 32)), 'lstm': (RNNClassifier, (64, 64), (32, 128)),
            'gru': (lambda: RNNClassifier('gru'), (64, 64), (32, 128)), 'bigru': (lambda: RNNClassifier('gru', bidirectional=True), (64, 64), (32, 128)),
            'mha': (MHABlock, (128, 256), (16, 64)), 'mha_fused': (FusedMHABlock, (128, 256), (16, 64)), 'hand_attn': (HandAttention, (128, 256), (16, 64)),
            'conv1d': (conv1d, (16, 1024), (32, 128)), 'tied_lm': (TiedLM, (64,), (16, 64)), 'ln_mlp': (ln_mlp, (1, 28, 28), (256, 1024))}
TOKENS = {'tied_lm': (2000, 2000)}  # (ids drawn from, labels drawn from)
