"""The fifth round, brought after the fourth and measured before any change it led to (`--set fifth`)."""
import torch
from torch import nn
from .families import _tv


class PackedRNN(nn.Module):
    "Padded sequences of different lengths packed (`pack_padded_sequence`), as text models run them: the RNN kernels for packed input."
    def __init__(self, kind='gru', d=128, unpack=False, full=False):
        super().__init__()
        self.rnn, self.head, self.unpack, self.full = getattr(nn, kind.upper())(64, d, batch_first=True), nn.Linear(d, 10), unpack, full
    def forward(self, x):
        lengths = x.shape[1] - torch.arange(x.shape[0]) % (1 if self.full else x.shape[1] // 2)  # from the full length down to half of it, or all full
        out, h = self.rnn(nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        if self.unpack: return self.head(nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0].mean(1))  # every step's output back
        return self.head((h[0] if isinstance(h, tuple) else h)[-1])

class EncoderStack(nn.Module):
    "nn.TransformerEncoder, pre-norm, with a padding mask, trained: the layers PyTorch's own transformer is built of."
    def __init__(self, d=128):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, batch_first=True, norm_first=True)
        self.enc, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(d, 10)
    def forward(self, x):
        pad = torch.arange(x.shape[1]) >= x.shape[1] - 8  # the last 8 positions padding, for every sample
        return self.head(self.enc(x, src_key_padding_mask=pad.expand(x.shape[0], -1)).mean(1))

class TinyViT(nn.Module):
    "A small vision transformer: 4x4 patches by a strided convolution, a class token, learned positions, nn.TransformerEncoder."
    def __init__(self, d=128, size=32):
        super().__init__()
        self.patch, self.cls = nn.Conv2d(3, d, 4, 4), nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (size // 4) ** 2 + 1, d))
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, 4, 2 * d, dropout=0.0, batch_first=True, activation='gelu'), 3, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.enc(x)[:, 0])

class ConvNeXtBlocks(nn.Module):
    "ConvNeXt's block: a depthwise 7x7 convolution, LayerNorm over channels (channels last by permute), an inverted MLP, a layer scale."
    def __init__(self, c=64, n=3):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.dw = nn.ModuleList(nn.Conv2d(c, c, 7, padding=3, groups=c) for _ in range(n))
        self.mlp = nn.ModuleList(nn.Sequential(nn.LayerNorm(c), nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c)) for _ in range(n))
        self.scale = nn.Parameter(torch.full((n, c), 1e-6))
        self.head = nn.Linear(c, 10)
    def forward(self, x):
        x = self.stem(x)
        for i, (dw, mlp) in enumerate(zip(self.dw, self.mlp)): x = x + (self.scale[i] * mlp(dw(x).permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return self.head(x.mean((2, 3)))

class UNet1d(nn.Module):
    "A 1-D U-Net: strided 1-D convolutions down, ConvTranspose1d up, skip connections by concatenation."
    def __init__(self, c=32):
        super().__init__()
        block = lambda i, o: nn.Sequential(nn.Conv1d(i, o, 5, padding=2), nn.BatchNorm1d(o), nn.ReLU())
        self.d1, self.d2, self.d3 = block(4, c), block(c, 2 * c), block(2 * c, 4 * c)
        self.pool = nn.MaxPool1d(2)
        self.u2, self.u1 = nn.ConvTranspose1d(4 * c, 2 * c, 2, 2), nn.ConvTranspose1d(2 * c, c, 2, 2)
        self.c2, self.c1, self.head = block(4 * c, 2 * c), block(2 * c, c), nn.Conv1d(c, 10, 1)
    def forward(self, x):
        a = self.d1(x); b = self.d2(self.pool(a)); c = self.d3(self.pool(b))
        b = self.c2(torch.cat([self.u2(c), b], 1)); a = self.c1(torch.cat([self.u1(b), a], 1))
        return self.head(a).mean(-1)

class ConvLSTM(nn.Module):
    "A convolutional LSTM cell written by hand, unrolled over 8 frames: four gates from one convolution of input and state."
    def __init__(self, c=32):
        super().__init__()
        self.c, self.gates, self.head = c, nn.Conv2d(1 + c, 4 * c, 3, padding=1), nn.Linear(c, 10)
    def forward(self, x):  # (batch, frames, height, width)
        h = c = x.new_zeros(x.shape[0], self.c, *x.shape[2:])
        for t in range(x.shape[1]):
            i, f, g, o = self.gates(torch.cat([x[:, t:t + 1], h], 1)).chunk(4, 1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * c.tanh()
        return self.head(h.mean((2, 3)))

# a fifth round, brought after the fourth and measured before any change it led to: torchvision's EfficientNet and RegNet (SiLU,
# squeeze-and-excitation, stochastic depth), PyTorch's own transformer layers (a padding mask; a ViT), ConvNeXt's block, a 1-D U-Net,
# a hand-written ConvLSTM, packed sequences (the planner stopped on them, then learnt to plan them at full length)
MODELS = {'efficientnet_b0': (_tv('efficientnet_b0'), (3, 64, 64), (16,)), 'regnet_y_400mf': (_tv('regnet_y_400mf'), (3, 64, 64), (16,)),
         'encoder_mask': (EncoderStack, (64, 128), (32,)), 'tiny_vit': (TinyViT, (3, 32, 32), (32,)),  # names of their own: ALL holds every set
         'convnext_blocks': (ConvNeXtBlocks, (3, 64, 64), (16,)), 'unet1d': (UNet1d, (4, 1024), (16,)), 'conv_lstm': (ConvLSTM, (8, 32, 32), (8,)),
         'packed_gru': (PackedRNN, (64, 64), (32,)), 'packed_lstm': (lambda: PackedRNN('lstm', unpack=True), (64, 64), (32,)),
         'packed_gru_full': (lambda: PackedRNN(full=True), (64, 64), (32,)), 'packed_lstm_full': (lambda: PackedRNN('lstm', unpack=True, full=True), (64, 64), (32,))}  # the bound's own case
