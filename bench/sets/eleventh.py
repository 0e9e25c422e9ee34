"""The eleventh round: detection ops, a VQ-VAE, a diffusion step, SimCLR, masked seq2seq, packed lengths, capsules (`--set eleventh`)."""
import math
import torch
from torch import nn
import torch.nn.functional as F


# an eleventh round, of what users build that no earlier round had: torchvision's detection ops as layers (deformable convolution,
# RoIAlign), a VQ-VAE's codebook, a diffusion model's noised step (its loss made inside forward), SimCLR's contrastive loss, a
# seq2seq Transformer with padding masks read off the ids, packed sequences whose lengths are read off the batch, a partly frozen
# backbone, capsules' routing; measured before any change
class DeformNet(nn.Module):
    "A deformable convolution (torchvision.ops), its offsets predicted by a plain one."
    def __init__(s):
        import torchvision.ops as tvo
        super().__init__(); s.c = nn.Conv2d(3, 32, 3, 2, 1); s.off = nn.Conv2d(32, 18, 3, padding=1); s.d = tvo.DeformConv2d(32, 64, 3, padding=1); s.head = nn.Linear(64, 10)
    def forward(s, x): x = F.relu(s.c(x)); return s.head(F.relu(s.d(x, s.off(x))).mean((2, 3)))

class RoIHead(nn.Module):
    "Two-stage detection's second stage: RoIAlign of four fixed boxes per image from a feature map, an MLP on each 7x7 crop."
    def __init__(s): super().__init__(); s.f = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU()); s.mlp = nn.Sequential(nn.Linear(64 * 49, 256), nn.ReLU(), nn.Linear(256, 10))
    def forward(s, x):
        from torchvision.ops import roi_align
        f, n = s.f(x), x.shape[0]
        boxes = torch.tensor([[0., 0., 32., 32.], [16., 16., 48., 48.], [0., 8., 64., 40.], [24., 0., 64., 64.]])
        rois = torch.cat([torch.arange(n).repeat_interleave(4)[:, None].float(), boxes.repeat(n, 1)], 1)
        return s.mlp(roi_align(f, rois, 7, 0.25, 2).flatten(1)).view(n, 4, 10).mean(1)

class VQVAE(nn.Module):
    "A VQ-VAE: nearest codebook entry by cdist/argmin, the straight-through estimator, the commitment loss added to the output."
    def __init__(s):
        super().__init__(); s.enc = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.ReLU(), nn.Conv2d(64, 64, 4, 2, 1)); s.cb = nn.Embedding(256, 64)
        s.dec = nn.Sequential(nn.ConvTranspose2d(64, 64, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(64, 3, 4, 2, 1))
    def forward(s, x):
        z = s.enc(x).permute(0, 2, 3, 1)
        q = s.cb(torch.cdist(z.reshape(-1, 64), s.cb.weight).argmin(1)).view_as(z)
        commit = F.mse_loss(q, z.detach()) + 0.25 * F.mse_loss(z, q.detach())
        return s.dec((z + (q - z).detach()).permute(0, 3, 1, 2)) + 0 * commit

class DiffusionUNet(nn.Module):
    "A DDPM step: noise drawn in forward, a sinusoidal time embedding, GroupNorm/SiLU blocks, attention at the low resolution; returns the loss."
    def __init__(s):
        super().__init__(); s.t = nn.Sequential(nn.Linear(64, 128), nn.SiLU(), nn.Linear(128, 64))
        s.c1, s.g1 = nn.Conv2d(3, 64, 3, padding=1), nn.GroupNorm(8, 64); s.down, s.g2 = nn.Conv2d(64, 128, 3, 2, 1), nn.GroupNorm(8, 128)
        s.att = nn.MultiheadAttention(128, 4, batch_first=True); s.up = nn.ConvTranspose2d(128, 64, 4, 2, 1); s.out = nn.Conv2d(128, 3, 3, padding=1)
    def forward(s, x):
        n = x.shape[0]; t = torch.randint(0, 1000, (n,)); noise = torch.randn_like(x); a = torch.cos(t / 1000 * math.pi / 2)[:, None, None, None]
        xt = a * x + (1 - a ** 2).sqrt() * noise
        e = t[:, None].float() * torch.exp(-math.log(10000) * torch.arange(32) / 32)[None]; e = s.t(torch.cat([e.sin(), e.cos()], 1))
        h = F.silu(s.g1(s.c1(xt))) + e[:, :, None, None]; d = F.silu(s.g2(s.down(h))); b, c, hh, ww = d.shape
        q = d.flatten(2).transpose(1, 2); d = d + s.att(q, q, q, need_weights=False)[0].transpose(1, 2).reshape(b, c, hh, ww)
        return F.mse_loss(s.out(torch.cat([s.up(d), h], 1)), noise)

class SimCLR(nn.Module):
    "SimCLR: two views through a ResNet-18, NT-Xent over the 2B x 2B similarities (the diagonal masked); returns the loss."
    def __init__(s):
        import torchvision
        super().__init__(); s.f = torchvision.models.resnet18(num_classes=128)
    def forward(s, x):
        n = x.shape[0]; z = F.normalize(s.f(torch.cat([x, x.flip(3)], 0)), dim=1)
        sim = (z @ z.T / 0.5).masked_fill(torch.eye(2 * n, dtype=torch.bool), float('-inf'))
        return F.cross_entropy(sim, torch.cat([torch.arange(n, 2 * n), torch.arange(n)]))

class MaskedSeq2Seq(nn.Module):
    "nn.Transformer encoder-decoder over tokens: padding masks from the ids, a causal target mask; the targets are the tokens (teacher forcing)."
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(1000, 128, padding_idx=0); s.t = nn.Transformer(128, 4, 2, 2, 256, batch_first=True); s.o = nn.Linear(128, 1000)
    def forward(s, x):
        pad = x == 0; m = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return s.o(s.t(s.e(x), s.e(x), tgt_mask=m, src_key_padding_mask=pad, tgt_key_padding_mask=pad, memory_key_padding_mask=pad, tgt_is_causal=True))

def seq2seq_loss(out, y): return F.cross_entropy(out.flatten(0, 1), y.flatten(), ignore_index=0)

class PackedLengths(nn.Module):
    "A bidirectional LSTM over packed sequences whose lengths are read off the batch (the ids before the padding), the last states classified."
    def __init__(s):
        super().__init__(); s.e = nn.Embedding(2000, 64, padding_idx=0); s.l = nn.LSTM(64, 128, 2, batch_first=True, bidirectional=True); s.o = nn.Linear(256, 10)
    def forward(s, x):
        lengths = (x != 0).sum(1).clamp(min=1).cpu()
        _, (h, _) = s.l(nn.utils.rnn.pack_padded_sequence(s.e(x), lengths, batch_first=True, enforce_sorted=False))
        return s.o(torch.cat([h[-2], h[-1]], 1))

class PartFrozen(nn.Module):
    "Fine-tuning the top of a MobileNetV3: its first blocks run under no_grad, the rest trains."
    def __init__(s):
        import torchvision
        super().__init__(); s.b = torchvision.models.mobilenet_v3_small(num_classes=10)
    def forward(s, x):
        with torch.no_grad(): f = s.b.features[:6](x)
        return s.b.classifier(s.b.avgpool(s.b.features[6:](f)).flatten(1))

class CapsNet(nn.Module):
    "Capsules: primary capsules by a strided convolution, a prediction per (input, output) capsule pair, three routing iterations."
    def __init__(s):
        super().__init__(); s.c1 = nn.Conv2d(1, 64, 9); s.prim = nn.Conv2d(64, 64, 9, 2); s.W = nn.Parameter(torch.randn(1, 288, 10, 16, 8) * 0.01)
    def forward(s, x):
        u = s.prim(F.relu(s.c1(x))).view(x.shape[0], 8, -1).transpose(1, 2)  # (B, 288, 8)
        uh = (s.W @ u[:, :, None, :, None]).squeeze(-1); bl = torch.zeros(uh.shape[:3])
        for _ in range(3):
            v = (bl.softmax(2)[..., None] * uh).sum(1); n2 = (v ** 2).sum(-1, keepdim=True); v = n2 / (1 + n2) * v / (n2.sqrt() + 1e-8)
            bl = bl + (uh * v[:, None]).sum(-1)
        return v.norm(dim=-1)

class PackedLong(nn.Module):
    "An LSTM over long packed sequences of unequal lengths (1 000 steps down to 993): PyTorch's per-step kernels, not oneDNN's."
    def __init__(s): super().__init__(); s.l = nn.LSTM(16, 32, batch_first=True); s.o = nn.Linear(32, 10)
    def forward(s, x):
        lengths = x.shape[1] - torch.arange(x.shape[0]) % 8
        return s.o(s.l(nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))[1][0][-1])

def margin_loss(v, y):
    t = F.one_hot(y, 10).float()
    return (t * F.relu(0.9 - v) ** 2 + 0.5 * (1 - t) * F.relu(v - 0.1) ** 2).sum(1).mean()

def _loss_is_output(out, y): return out  # the model returns its own loss

MODELS = {'deform_conv': (DeformNet, (3, 64, 64), (16,)), 'roi_head': (RoIHead, (3, 64, 64), (16,)), 'vq_vae': (VQVAE, (3, 32, 32), (64,)),
            'diffusion_unet': (DiffusionUNet, (3, 32, 32), (32,)), 'simclr': (SimCLR, (3, 32, 32), (32,)),
            'masked_seq2seq': (MaskedSeq2Seq, (48,), (32,)), 'packed_lengths': (PackedLengths, (64,), (32,)),
            'part_frozen': (PartFrozen, (3, 64, 64), (32,)), 'capsnet': (CapsNet, (1, 28, 28), (64,)), 'packed_long': (PackedLong, (1000, 16), (8,))}
TARGETS = {'vq_vae': lambda bs: torch.randn(bs, 3, 32, 32)}
TOKENS = {'masked_seq2seq': (1000, 1000), 'packed_lengths': (2000, 10)}
LOSSES = {'diffusion_unet': _loss_is_output, 'simclr': _loss_is_output, 'masked_seq2seq': seq2seq_loss, 'capsnet': margin_loss}
