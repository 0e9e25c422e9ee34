"""The seventh round: images and per-pixel labels out, LMs, graphs, point clouds... measured before any change it led to (`--set seventh`)."""
import torch
from torch import nn
import torch.nn.functional as F

class ESPCN(nn.Module):
    "Super-resolution (EDSR's shape): residual blocks without BatchNorm, a convolution to 4x the channels, PixelShuffle(2); an image out (MSE)."
    def __init__(self, c=32, n=3):
        super().__init__()
        self.inp = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(c, c, 3, padding=1)) for _ in range(n))
        self.up = nn.Sequential(nn.Conv2d(c, 3 * 4, 3, padding=1), nn.PixelShuffle(2))
    def forward(self, x):
        h = self.inp(x)
        for b in self.blocks: h = h + 0.1 * b(h)
        return self.up(h)

class SegUNet(nn.Module):
    "Segmentation: a two-level UNet, bilinear upsampling (align_corners=True), 5 classes per pixel, per-pixel cross-entropy."
    def __init__(self, c=16, k=5):
        super().__init__()
        blk = lambda i, o: nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))
        self.e1, self.e2, self.mid = blk(3, c), blk(c, 2 * c), blk(2 * c, 4 * c)
        self.d2, self.d1, self.out = blk(6 * c, 2 * c), blk(3 * c, c), nn.Conv2d(c, k, 1)
    def forward(self, x):
        up = lambda t: F.interpolate(t, scale_factor=2, mode='bilinear', align_corners=True)
        a = self.e1(x); b = self.e2(F.max_pool2d(a, 2)); m = self.mid(F.max_pool2d(b, 2))
        return self.out(self.d1(torch.cat([up(self.d2(torch.cat([up(m), b], 1))), a], 1)))

class ResnetGen(nn.Module):
    "CycleGAN's generator: reflection padding, InstanceNorm, convolutions with padding_mode='reflect', ConvTranspose2d with output_padding, tanh."
    def __init__(self, c=16, n=2):
        super().__init__()
        IN = lambda o: nn.InstanceNorm2d(o, affine=True)
        self.down = nn.Sequential(nn.ReflectionPad2d(3), nn.Conv2d(3, c, 7), IN(c), nn.ReLU(True), nn.Conv2d(c, 2 * c, 3, 2, 1), IN(2 * c), nn.ReLU(True))
        self.res = nn.ModuleList(nn.Sequential(nn.Conv2d(2 * c, 2 * c, 3, padding=1, padding_mode='reflect'), IN(2 * c), nn.ReLU(True),
                                               nn.Conv2d(2 * c, 2 * c, 3, padding=1, padding_mode='reflect'), IN(2 * c)) for _ in range(n))
        self.up = nn.Sequential(nn.ConvTranspose2d(2 * c, c, 3, 2, 1, output_padding=1), IN(c), nn.ReLU(True), nn.ReflectionPad2d(3), nn.Conv2d(c, 3, 7), nn.Tanh())
    def forward(self, x):
        h = self.down(x)
        for r in self.res: h = h + r(h)
        return self.up(h)

class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__(); self.w, self.eps = nn.Parameter(torch.ones(d)), eps
    def forward(self, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w

def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin

class Llama(nn.Module):
    "A LLaMA-style LM: RMSNorm written out, rotary embeddings (rotate-half, cos/sin buffers), causal SDPA, SwiGLU, tied embeddings; next-token labels."
    def __init__(self, vocab=2000, d=128, h=4, n=2, t=128):
        super().__init__()
        self.h, self.emb = h, nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.ModuleDict(dict(n1=RMSNorm(d), qkv=nn.Linear(d, 3 * d, bias=False), o=nn.Linear(d, d, bias=False), n2=RMSNorm(d),
                                                       gate=nn.Linear(d, 2 * d, bias=False), up=nn.Linear(d, 2 * d, bias=False), down=nn.Linear(2 * d, d, bias=False))) for _ in range(n))
        self.norm, self.head = RMSNorm(d), nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        hd = d // h
        f = 1.0 / 10000 ** (torch.arange(0, hd, 2).float() / hd)
        a = torch.outer(torch.arange(t).float(), f).repeat(1, 2)
        self.register_buffer('cos', a.cos(), persistent=False); self.register_buffer('sin', a.sin(), persistent=False)
    def forward(self, ids):
        x = self.emb(ids); b, t, d = x.shape
        for L in self.layers:
            q, k, v = L['qkv'](L['n1'](x)).view(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
            q, k = _rope(q, self.cos[:t], self.sin[:t]), _rope(k, self.cos[:t], self.sin[:t])
            x = x + L['o'](F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
            y = L['n2'](x)
            x = x + L['down'](F.silu(L['gate'](y)) * L['up'](y))
        return self.head(self.norm(x)).transpose(1, 2)  # (batch, vocab, tokens) for cross-entropy per token

class SwinBlocks(nn.Module):
    "Swin's windowed attention written by hand: 4x4 windows by view/permute, a shifted pair (torch.roll, an attention mask), a relative-position bias table indexed by a buffer."
    def __init__(self, d=64, heads=4, w=4, side=16):
        super().__init__()
        self.d, self.h, self.w, self.side = d, heads, w, side
        self.patch = nn.Conv2d(3, d, 2, 2)
        self.n1, self.n2 = nn.ModuleList([nn.LayerNorm(d), nn.LayerNorm(d)]), nn.ModuleList([nn.LayerNorm(d), nn.LayerNorm(d)])
        self.qkv, self.proj = nn.ModuleList([nn.Linear(d, 3 * d), nn.Linear(d, 3 * d)]), nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(2))
        self.table = nn.Parameter(torch.zeros((2 * w - 1) ** 2, heads))
        c = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing='ij')).flatten(1)
        r = (c[:, :, None] - c[:, None, :]).permute(1, 2, 0) + (w - 1)
        self.register_buffer('index', r[..., 0] * (2 * w - 1) + r[..., 1], persistent=False)
        img = torch.zeros(side, side); s = w // 2; cnt = 0
        for hs in (slice(0, -w), slice(-w, -s), slice(-s, None)):
            for ws in (slice(0, -w), slice(-w, -s), slice(-s, None)): img[hs, ws] = cnt; cnt += 1
        m = self._windows(img[None, :, :, None]).squeeze(-1)
        self.register_buffer('mask', (m[:, None, :] - m[:, :, None]).ne(0).float() * -100.0, persistent=False)
        self.head = nn.Linear(d, 10)
    def _windows(self, x):
        b, H, W, c = x.shape; w = self.w
        return x.view(b, H // w, w, W // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)
    def _merge(self, x, b):
        w, n = self.w, self.side // self.w
        return x.view(b, n, n, w, w, -1).permute(0, 1, 3, 2, 4, 5).reshape(b, self.side, self.side, -1)
    def forward(self, x):
        x = self.patch(x).permute(0, 2, 3, 1); b = x.shape[0]
        for i, shift in enumerate((0, self.w // 2)):
            y = self.n1[i](x)
            if shift: y = torch.roll(y, (-shift, -shift), (1, 2))
            win = self._windows(y); nw = win.shape[0]
            q, k, v = self.qkv[i](win).view(nw, -1, 3, self.h, self.d // self.h).permute(2, 0, 3, 1, 4)
            a = (q * (self.d // self.h) ** -0.5) @ k.transpose(-2, -1) + self.table[self.index].permute(2, 0, 1)
            if shift: a = (a.view(b, -1, self.h, self.w ** 2, self.w ** 2) + self.mask[None, :, None]).view(nw, self.h, self.w ** 2, self.w ** 2)
            y = self._merge(self.proj[i]((a.softmax(-1) @ v).transpose(1, 2).reshape(nw, -1, self.d)), b)
            if shift: y = torch.roll(y, (shift, shift), (1, 2))
            x = x + y
            x = x + self.mlp[i](self.n2[i](x))
        return self.head(x.mean((1, 2)))

class GNN(nn.Module):
    "Message passing over a fixed random graph (a buffer of edges): messages gathered at sources, summed at targets with index_add, degree-normalised; 3 layers, mean-pooled."
    def __init__(self, nodes=256, edges=2048, f=32, d=64):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer('src', torch.randint(0, nodes, (edges,), generator=g), persistent=False)
        self.register_buffer('dst', torch.randint(0, nodes, (edges,), generator=g), persistent=False)
        deg = torch.zeros(nodes).index_add_(0, self.dst, torch.ones(edges)).clamp(min=1)
        self.register_buffer('inv_deg', (1 / deg)[:, None], persistent=False)
        self.inp = nn.Linear(f, d)
        self.msg = nn.ModuleList(nn.Linear(d, d) for _ in range(3)); self.upd = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(3))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        h = F.relu(self.inp(x))
        for m, u in zip(self.msg, self.upd):
            agg = torch.zeros_like(h).index_add(1, self.dst, m(h)[:, self.src]) * self.inv_deg
            h = F.relu(u(torch.cat([h, agg], -1)))
        return self.head(h.mean(1))

class DGCNN(nn.Module):
    "Point clouds (DGCNN's EdgeConv): k nearest neighbours by cdist and topk, neighbours gathered by advanced indexing, a 1x1-conv MLP on edges, max over neighbours and points."
    def __init__(self, k=16, d=64):
        super().__init__()
        self.k = k
        self.e1 = nn.Sequential(nn.Conv2d(6, d, 1, bias=False), nn.BatchNorm2d(d), nn.LeakyReLU(0.2))
        self.e2 = nn.Sequential(nn.Conv2d(2 * d, d, 1, bias=False), nn.BatchNorm2d(d), nn.LeakyReLU(0.2))
        self.head = nn.Linear(2 * d, 10)
    def edge(self, x, conv):  # x: (batch, points, features)
        idx = torch.cdist(x, x).topk(self.k, -1, largest=False).indices  # (batch, points, k)
        nb = x[torch.arange(x.shape[0], device=x.device)[:, None, None], idx]  # (batch, points, k, features)
        ctr = x[:, :, None].expand_as(nb)
        return conv(torch.cat([nb - ctr, ctr], -1).permute(0, 3, 1, 2)).amax(-1).transpose(1, 2)
    def forward(self, x):
        a = self.edge(x, self.e1); b = self.edge(a, self.e2)
        return self.head(torch.cat([a, b], -1).amax(1))

class MoE(nn.Module):
    "A mixture of experts, top-2 routing: a softmax gate, topk, the two weights scattered back into a dense (tokens, experts) table, every expert run and weighted (einsum)."
    def __init__(self, d=128, e=4, t=64):
        super().__init__()
        self.inp = nn.Linear(64, d); self.gate = nn.Linear(d, e)
        self.w1, self.w2 = nn.Parameter(torch.randn(e, d, 2 * d) / d ** 0.5), nn.Parameter(torch.randn(e, 2 * d, d) / (2 * d) ** 0.5)
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, 10)
    def forward(self, x):
        h = self.inp(x)
        p = self.gate(h).softmax(-1); top = p.topk(2, -1)
        w = torch.zeros_like(p).scatter(-1, top.indices, top.values / top.values.sum(-1, keepdim=True))
        y = torch.einsum('bte,bted->btd', w, torch.einsum('btef,efd->bted', torch.einsum('btd,edf->btef', h, self.w1).relu(), self.w2))  # every expert
        return self.head(self.norm(h + y).mean(1))

class WNTCN(nn.Module):
    "HiFi-GAN's/TCN's convolutions: weight_norm parametrizations, causal dilated Conv1d by F.pad on the left, gated tanh*sigmoid activations, skips summed."
    def __init__(self, c=64, n=4):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.inp = wn(nn.Conv1d(8, c, 1))
        self.dil = nn.ModuleList(wn(nn.Conv1d(c, 2 * c, 3, dilation=2 ** i)) for i in range(n))
        self.res = nn.ModuleList(wn(nn.Conv1d(c, c, 1)) for _ in range(n))
        self.head = nn.Linear(c, 10)
    def forward(self, x):
        h, skip = self.inp(x), 0
        for i, (d, r) in enumerate(zip(self.dil, self.res)):
            a, b = d(F.pad(h, (2 * 2 ** i, 0))).chunk(2, 1)
            g = r(torch.tanh(a) * torch.sigmoid(b))
            h, skip = h + g, skip + g
        return self.head(skip.mean(-1))

class STEQuant(torch.autograd.Function):
    "A straight-through 4-bit quantiser the user wrote: saves the input's in-range mask for backward."
    @staticmethod
    def forward(ctx, x):
        m = (x.abs() <= 1)
        ctx.save_for_backward(m)
        return torch.round(x.clamp(-1, 1) * 7) / 7
    @staticmethod
    def backward(ctx, g):
        m, = ctx.saved_tensors
        return g * m

class QuantNet(nn.Module):
    "A custom autograd.Function (a straight-through quantiser) after each convolution, with in-place activations (SiLU inplace, relu_, mul_ on views)."
    def __init__(self, c=32):
        super().__init__()
        self.c1, self.c2, self.c3 = nn.Conv2d(3, c, 3, padding=1), nn.Conv2d(c, 2 * c, 3, 2, 1), nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        self.bn = nn.BatchNorm2d(2 * c); self.act = nn.SiLU(inplace=True); self.head = nn.Linear(2 * c, 10)
    def forward(self, x):
        h = STEQuant.apply(self.act(self.c1(x)))
        h = self.bn(self.c2(h))
        h[:, : h.shape[1] // 2].mul_(0.5)
        h = h.relu_()
        h = STEQuant.apply(self.c3(h)) + h
        return self.head(h.mean((2, 3)))

class FPNAA(nn.Module):
    "A feature pyramid: antialiased bilinear downsampling of the image (F.interpolate antialias=True), nearest and bicubic upsampling, lateral 1x1 convolutions summed."
    def __init__(self, c=32):
        super().__init__()
        self.s = nn.ModuleList(nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU()) for _ in range(3))
        self.lat = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(3)); self.head = nn.Linear(c, 10)
    def forward(self, x):
        f = [s(F.interpolate(x, scale_factor=1 / 2 ** i, mode='bilinear', antialias=True) if i else x) for i, s in enumerate(self.s)]
        p = self.lat[2](f[2])
        p = self.lat[1](f[1]) + F.interpolate(p, scale_factor=2, mode='nearest')
        p = self.lat[0](f[0]) + F.interpolate(p, scale_factor=2, mode='bicubic', align_corners=False)
        return self.head(p.mean((2, 3)))

class ScanSSM(nn.Module):
    "A linear state-space layer in parallel form: per-channel decays, the recurrence as cumsum in log space (logcumsumexp), gated, stacked twice."
    def __init__(self, d=128, n=2):
        super().__init__()
        self.inp = nn.Linear(64, d)
        self.a = nn.ParameterList(nn.Parameter(torch.rand(d)) for _ in range(n))
        self.g = nn.ModuleList(nn.Linear(d, 2 * d) for _ in range(n)); self.norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))
        self.head = nn.Linear(d, 10)
    def forward(self, x):
        h = self.inp(x); t = torch.arange(h.shape[1], device=h.device, dtype=h.dtype)[:, None]
        for a, g, n in zip(self.a, self.g, self.norm):
            u, z = g(n(h)).chunk(2, -1)
            la = -F.softplus(a) * t  # log decay to each step
            s = torch.exp(torch.logcumsumexp(la * -1 + torch.log(F.softplus(u) + 1e-4), 1) + la)  # sum_j decay^(t-j) u_j, u > 0
            h = h + s * torch.sigmoid(z)
        return self.head(h.mean(1))

def lm_smooth_loss(out, y): return F.cross_entropy(out, y, label_smoothing=0.1)

# a seventh round, brought after the sixth and measured before any change it led to: images out (super-resolution by PixelShuffle,
# MSE; a CycleGAN generator with reflection padding and InstanceNorm), per-pixel cross-entropy (segmentation), a LLaMA-style LM
# (RMSNorm, rotary embeddings, causal SDPA, SwiGLU; once with label smoothing over an 8000-token vocabulary), Swin's shifted windows,
# message passing (index_add), point clouds (cdist, topk, gathers), a top-2 mixture of experts, weight_norm with gated causal
# convolutions, a user's autograd.Function with in-place activations, antialiased and bicubic resampling, a parallel scan (logcumsumexp)
MODELS = {'espcn': (ESPCN, (3, 32, 32), (16,)), 'seg_unet': (SegUNet, (3, 64, 64), (16,)), 'cyclegan_gen': (ResnetGen, (3, 64, 64), (8,)),
           'llama': (Llama, (128,), (16,)), 'llama_smooth': (lambda: Llama(vocab=8000), (128,), (8,)), 'swin': (SwinBlocks, (3, 32, 32), (32,)),
           'gnn': (GNN, (256, 32), (16,)), 'dgcnn': (DGCNN, (256, 3), (16,)), 'moe': (MoE, (64, 64), (32,)), 'wn_tcn': (WNTCN, (8, 1024), (16,)),
           'quant_net': (QuantNet, (3, 64, 64), (16,)), 'fpn_aa': (FPNAA, (3, 64, 64), (16,)), 'scan_ssm': (ScanSSM, (64, 64), (32,))}
TARGETS = {'espcn': lambda bs: torch.randn(bs, 3, 64, 64), 'seg_unet': lambda bs: torch.randint(0, 5, (bs, 64, 64)),
           'cyclegan_gen': lambda bs: torch.randn(bs, 3, 64, 64).tanh()}
LOSSES = {'llama_smooth': lm_smooth_loss}
TOKENS = {'llama': (2000, 2000), 'llama_smooth': (8000, 8000)}  # next-token labels, one per position
