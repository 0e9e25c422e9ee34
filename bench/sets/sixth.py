"""The sixth round, brought after the fifth and measured before any change it led to (`--set sixth`)."""
import torch
from torch import nn
import torch.nn.functional as F
from .families import _tv

def resnext():
    "A small ResNeXt: torchvision's bottleneck blocks with 32 groups of 4 channels, one block per stage."
    from torchvision.models.resnet import ResNet, Bottleneck
    return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, groups=32, width_per_group=4)

def googlenet():
    "torchvision's GoogLeNet without its auxiliary heads: four-branch Inception blocks concatenated, max pools with ceil_mode."
    import torchvision.models as tvm
    return tvm.GoogLeNet(num_classes=10, aux_logits=False, init_weights=False)

class SegNet(nn.Module):
    "SegNet's shape: max pooling that returns its indices, and MaxUnpool2d that puts the values back where they came from."
    def __init__(self, c=32):
        super().__init__()
        blk = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.e1, self.e2, self.d2, self.d1 = blk(3, c), blk(c, 2 * c), blk(2 * c, c), blk(c, c)
        self.pool, self.unpool, self.out = nn.MaxPool2d(2, return_indices=True), nn.MaxUnpool2d(2), nn.Conv2d(c, 10, 1)
    def forward(self, x):
        a, i1 = self.pool(self.e1(x)); b, i2 = self.pool(self.e2(a))
        return self.out(self.d1(self.unpool(self.d2(self.unpool(b, i2)), i1))).mean((2, 3))

class SNDisc(nn.Module):
    "A GAN discriminator: strided convolutions under spectral norm (a parametrization with a power iteration), LeakyReLU, no BatchNorm."
    def __init__(self, c=64):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.body = nn.Sequential(sn(nn.Conv2d(3, c, 4, 2, 1)), nn.LeakyReLU(0.2), sn(nn.Conv2d(c, 2 * c, 4, 2, 1)), nn.LeakyReLU(0.2),
                                  sn(nn.Conv2d(2 * c, 4 * c, 4, 2, 1)), nn.LeakyReLU(0.2), nn.Flatten(), sn(nn.Linear(4 * c * 8 * 8, 10)))
    def forward(self, x): return self.body(x)

class Seq2Seq(nn.Module):
    "nn.Transformer, encoder and decoder (cross-attention, a causal mask made by the class's helper): the first half of the tokens in, the second out."
    def __init__(self, d=128):
        super().__init__()
        self.t = nn.Transformer(d, 4, 2, 2, 4 * d, dropout=0.1, batch_first=True)
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        src, tgt = x.chunk(2, 1)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.head(self.t(src, tgt, tgt_mask=mask, tgt_is_causal=True).mean(1))

class Mixer(nn.Module):
    "MLP-Mixer: patches by a strided convolution, token-mixing MLPs across the transposed patch axis, channel-mixing MLPs."
    def __init__(self, d=128, n=2, tokens=64):
        super().__init__()
        self.patch = nn.Conv2d(3, d, 4, 4)
        self.tok = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens)) for _ in range(n))
        self.ch = nn.ModuleList(nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(n))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for t, c in zip(self.tok, self.ch):
            x = x + t[1:](t[0](x).transpose(1, 2)).transpose(1, 2)
            x = x + c(x)
        return self.head(x.mean(1))

class Siamese(nn.Module):
    "Two views through one encoder (SimCLR's shape): the input's channels split into two images, the features concatenated."
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(128, 10)
    def forward(self, x):
        a, b = x.chunk(2, 1)
        return self.head(torch.cat([self.enc(a), self.enc(b)], 1))

class SameConv(nn.Module):
    "padding='same' with even kernels (PyTorch pads them unevenly), PReLU, Dropout2d, average pooling, and patches unfolded by hand (F.unfold)."
    def __init__(self, c=32):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, c, 4, padding='same'), nn.PReLU(c), nn.Dropout2d(0.1), nn.AvgPool2d(2),
                                  nn.Conv2d(c, 2 * c, 2, padding='same'), nn.PReLU(), nn.AvgPool2d(2))
        self.mix, self.head = nn.Linear(2 * c * 9, 64), nn.Linear(64, 10)
    def forward(self, x):
        p = F.unfold(self.body(x), 3, padding=1).transpose(1, 2)  # (batch, positions, 2c * 9)
        return self.head(F.gelu(self.mix(p)).mean(1))

def resnet18_cl():
    "ResNet-18 moved to channels-last memory, as mixed-precision guides tell users to (the input stays as the loader gives it)."
    return _tv('resnet18')().to(memory_format=torch.channels_last)

# a sixth round, brought after the fifth and measured before any change it led to: grouped bottlenecks (ResNeXt), Inception's
# branches (GoogLeNet), MobileNetV3 (hardswish, SE with hardsigmoid), max unpooling (SegNet), spectral norm (a GAN's discriminator),
# nn.Transformer's decoder (cross-attention, a causal mask), an MLP-Mixer, one encoder run twice (Siamese), 'same' padding with even
# kernels and F.unfold, a channels-last ResNet, LSTMs with projections and with dropout between layers, a GRU time-major; then
# complex FFTs (a Fourier neural operator), grid_sample (a spatial transformer), torch.stft (audio), a VAE's reparameterisation
MODELS = {'resnext': (resnext, (3, 64, 64), (16,)), 'googlenet': (googlenet, (3, 64, 64), (16,)), 'mobilenet_v3': (_tv('mobilenet_v3_small'), (3, 64, 64), (32,)),
         'segnet': (SegNet, (3, 64, 64), (16,)), 'sn_disc': (SNDisc, (3, 64, 64), (16,)), 'seq2seq': (Seq2Seq, (64, 128), (32,)),
         'mixer': (Mixer, (3, 32, 32), (32,)), 'siamese': (Siamese, (6, 64, 64), (16,)), 'same_conv': (SameConv, (3, 64, 64), (16,)),
         'resnet18_cl': (resnet18_cl, (3, 64, 64), (16,)), 'lstm_proj': (lambda: LSTMProj(), (64, 64), (32,)),
         'lstm_dropout': (lambda: RNNDrop('lstm'), (64, 64), (32,)), 'gru_time_major': (lambda: RNNDrop('gru', p=0.0, batch_first=False), (64, 64), (32,)),
         'fno': (lambda: FNO(), (3, 32, 32), (16,)), 'stn': (lambda: STN(), (3, 64, 64), (16,)), 'spectro': (lambda: Spectro(), (16000,), (16,)),
         'vae': (lambda: VAE(), (1, 28, 28), (128,))}

class FNO(nn.Module):
    "A Fourier neural operator's layer: rfft2, the lowest 8x8 modes mixed by complex weights (einsum), irfft2 back, a skip."
    def __init__(self, c=32, modes=8):
        super().__init__()
        self.inp, self.m, self.head = nn.Conv2d(3, c, 1), modes, nn.Linear(c, 10)
        self.w = nn.Parameter(torch.randn(c, c, modes, modes, dtype=torch.cfloat) / c)
    def forward(self, x):
        x = self.inp(x)
        X = torch.fft.rfft2(x)
        Y = torch.zeros_like(X)
        Y[:, :, :self.m, :self.m] = torch.einsum('bixy,ioxy->boxy', X[:, :, :self.m, :self.m], self.w)
        return self.head(F.gelu(x + torch.fft.irfft2(Y, s=x.shape[-2:])).mean((2, 3)))

class STN(nn.Module):
    "A spatial transformer: a small net predicts an affine map, affine_grid and grid_sample resample the image, a classifier follows."
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(3, 16, 5, 2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 6))
        self.net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    def forward(self, x):
        grid = F.affine_grid(self.loc(x).view(-1, 2, 3), x.shape, align_corners=False)
        return self.net(F.grid_sample(x, grid, align_corners=False))

class Spectro(nn.Module):
    "Audio: a waveform to a magnitude spectrogram (torch.stft, a Hann window made in forward), 1-D convolutions over time."
    def __init__(self, n_fft=256):
        super().__init__()
        self.n_fft = n_fft
        self.body = nn.Sequential(nn.Conv1d(n_fft // 2 + 1, 64, 3, padding=1), nn.BatchNorm1d(64), nn.ReLU(), nn.Conv1d(64, 64, 3, padding=1), nn.ReLU())
        self.head = nn.Linear(64, 10)
    def forward(self, x):
        s = torch.stft(x, self.n_fft, hop_length=self.n_fft // 4, window=torch.hann_window(self.n_fft, device=x.device), return_complex=True).abs()
        return self.head(self.body(torch.log1p(s)).mean(-1))

class VAE(nn.Module):
    "A VAE's step folded into the output: encoder, the reparameterisation (randn_like), decoder; reconstruction and KL added to the logits' loss."
    def __init__(self, z=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Flatten(), nn.Linear(784, 400), nn.ReLU(), nn.Linear(400, 2 * z))
        self.dec, self.head = nn.Sequential(nn.Linear(z, 400), nn.ReLU(), nn.Linear(400, 784)), nn.Linear(z, 10)
    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, 1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        extra = F.binary_cross_entropy_with_logits(self.dec(z), x.flatten(1).sigmoid()) - 0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(1).mean()
        return self.head(z) + extra / 10  # every sample's logits carry the extra loss terms' gradient

class LSTMProj(nn.Module):
    "An LSTM with projections (proj_size=64): oneDNN has no such LSTM, so PyTorch runs its own."
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.LSTM(64, 128, 2, batch_first=True, proj_size=64), nn.Linear(64, 10)
    def forward(self, x): return self.head(self.rnn(x)[0][:, -1])

class RNNDrop(nn.Module):
    "A 2-layer RNN with dropout between its layers (p), batch-first or time-major (the input transposed in forward)."
    def __init__(self, kind, p=0.3, batch_first=True):
        super().__init__()
        self.bf = batch_first
        self.rnn, self.head = getattr(nn, kind.upper())(64, 128, 2, dropout=p, batch_first=batch_first), nn.Linear(128, 10)
    def forward(self, x):
        out = self.rnn(x if self.bf else x.transpose(0, 1))[0]
        return self.head(out[:, -1] if self.bf else out[-1])
