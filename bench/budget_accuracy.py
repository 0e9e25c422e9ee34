"""How close is `plan_memory` to a real step? Predicted peak (on the 'cpu' target) vs. the measured peak of a fresh process.

    python bench/budget_accuracy.py                 # accuracy table: 3 models x 3 batch sizes
    python bench/budget_accuracy.py --families      # the same on 14 model families the package does not ship, 2 batch sizes each
                                                    # (--models lstm mha to run a part; --calibrate adds the calibrated plan)
    python bench/budget_accuracy.py --unseen        # the same on 5 models none of the planner was built or checked on
    python bench/budget_accuracy.py --variants      # the same on 14 variants of the families (one thing changed each), one batch size each
    python bench/budget_accuracy.py --fifth         # the same on a fifth round of 9 models brought last, and packed sequences at full length (--brought, --fourth: the earlier rounds)
    python bench/budget_accuracy.py --eighth        # the same on ten of autograd's shapes (a Function saving on ctx, in-place ops on views, orthogonal weights, cumprod...)
    python bench/budget_accuracy.py --tenth         # the same on torchvision's segmentation (dict outputs, auxiliary heads), video, Swin and EfficientNetV2 models
    python bench/budget_accuracy.py --ninth         # the same on users' losses and tricks: an OCR net's CTC loss, a PINN's second derivatives, a WGAN-GP critic
    python bench/budget_accuracy.py --seventh       # the same on a seventh round of 13 models (images and per-pixel labels out, LMs, graphs, point clouds...; --sixth: the one before)
    python bench/budget_accuracy.py --optimizers    # 4 families trained by 15 optimizers users bring (fused, foreach, Adagrad, Adafactor, ASGD...)
    python bench/budget_accuracy.py --budgets       # max_batch_size at 0.5/1/2 GiB budgets, checked by measurement
                                                    # (--models cnn transformer --gib 0.5 1 to run a part)
    python bench/budget_accuracy.py --real-budgets  # the same at the unscaled 2/4/8 GiB, for the CNN and the transformer
    python bench/budget_accuracy.py --kernels       # each kernel family's scratch (convolutions, LSTM) measured, next to the planner's model
    python bench/budget_accuracy.py --budgets --families --gib 0.5 1   # max_batch_size on every family, checked by measurement
    python bench/budget_accuracy.py --gemm          # the CPU kernel workspace a tensor trace cannot see, next to the planner's model
    python bench/budget_accuracy.py --repeat mlp 4200 3   # how well one measurement repeats
    python bench/budget_accuracy.py --heap gru 32   # the trace's allocations through glibc and through the planner's GlibcHeap; what warm-up holes hide
    python bench/budget_accuracy.py --histories gru 32 12  # a few small blocks left in the heap before the steps: the measurement and the plan's replay, per history
    python bench/budget_accuracy.py --calibration-lines mobilenet_v2_32px 32   # each convolution at the full batch next to calibration's lines
    python bench/budget_accuracy.py --phases gru 32 # each phase's measured high-water mark next to the plan's live bytes and their GlibcHeap replay
    python bench/budget_accuracy.py --malloc-trace gru 32   # the same, with every C library call of the real steps replayed through GlibcHeap (needs cc)
    python bench/budget_accuracy.py --families --glibc-defaults   # measured and planned with glibc's own settings, as a user's process runs
    python bench/budget_accuracy.py --families --glibc heap       # ... with the threshold fixed at glibc's 32 MiB limit and no trimming
    python bench/budget_accuracy.py --families --glibc fixed-late # ... with glibc's own at start, a messy heap, then fix_glibc_thresholds() in the process
    python bench/budget_accuracy.py --families --glibc set-late   # ... the same without filling the heap's free chunks: why fix_glibc_thresholds fills them
    python bench/budget_accuracy.py --speed mobilenet_v2 16 3      # one step's time under each of those glibc settings, paired fresh processes
    (--threads 2 measures with two threads instead of one; --full-warmup warms up at the full batch, so what the kernels keep
     is already in the baseline and the measured steps hold tensors only; --warmup-holes leaves the warm-up's freed heap in place,
     the protocol before the autograd graph was planned)

CPU measurement: each case runs in a fresh `python` process with glibc told to serve every allocation above 64 KiB with its own
mmap (MALLOC_MMAP_THRESHOLD_ fixed, which also stops glibc raising the threshold as blocks are freed) and one arena
(MALLOC_ARENA_MAX=1), so a freed tensor's pages go back to the OS at once and the resident set tracks live tensors. The process
warms up the kernels on a small batch (loading their code), hands MKL's cached matmul buffers back (mkl_free_buffers, so the
measured steps allocate their workspace as a real run's first full-size step does) and glibc's freed heap (malloc_trim, so the
measured steps' autograd graph and small tensors grow the heap as a real first step's do, instead of filling the warm-up's holes),
then resets the kernel's RSS high-water mark
(/proc/self/clear_refs) and runs the same two training steps the planner traces. Measured peak = peak RSS - RSS before the
steps + bytes of the tensors already alive then (weights, buffers, batch), which the planner counts too.
"""
import argparse, functools, itertools, json, math, os, subprocess, sys, time
from unittest import mock
from pathlib import Path
import torch
from torch import nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's netlite_nb, not whichever one is installed
ENV = dict(MALLOC_MMAP_THRESHOLD_='65536', MALLOC_ARENA_MAX='1', MALLOC_TRIM_THRESHOLD_='0', OMP_NUM_THREADS='1')
GLIBC = {  # glibc settings a process can run with: the bench's; glibc's own (a user's process); the threshold fixed at glibc's 32 MiB limit, never trimmed
    'bench': {k: v for k, v in ENV.items() if k.startswith('MALLOC_')}, 'defaults': {},
    'heap': dict(MALLOC_MMAP_THRESHOLD_=str(32 * 2**20), MALLOC_TRIM_THRESHOLD_=str(2**40), MALLOC_ARENA_MAX='1'),
    'fixed-late': dict(BENCH_FIX_LATE='1'),  # glibc's own at start, a messy heap made under them (`_messy_heap`), then `fix_glibc_thresholds()`
    'set-late': dict(BENCH_FIX_LATE='thresholds')}  # ... then only the thresholds set (mallopt) and the free heap handed back: the heap's free chunks stay
HOLES = False  # --warmup-holes: measure as before the autograd graph was planned (the warm-up's freed heap left in place)

def mlp(): return nn.Sequential(nn.Flatten(), nn.Linear(784, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 10))

def cnn():
    def dw(c_in, c_out):  # depthwise 3x3 + pointwise 1x1, each with BatchNorm
        return nn.Sequential(nn.Conv2d(c_in, c_in, 3, padding=1, groups=c_in, bias=False), nn.BatchNorm2d(c_in), nn.ReLU(),
                             nn.Conv2d(c_in, c_out, 1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU())
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                         dw(32, 64), nn.MaxPool2d(2), dw(64, 128), nn.MaxPool2d(2), dw(128, 256),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10))

class Transformer(nn.Module):
    def __init__(self, d=256, heads=4, layers=4):
        super().__init__()
        self.blocks = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, heads, 4*d, dropout=0.1, batch_first=True), layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, 10)
    def forward(self, x): return self.head(self.blocks(x).mean(1))

MODELS = {'mlp': (mlp, (1, 28, 28), (256, 1024, 4096)), 'cnn': (cnn, (3, 64, 64), (16, 64, 128)),
          'transformer': (Transformer, (128, 256), (8, 32, 64))}

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

class TConvDec(nn.Module):
    "A small U-Net that learns its resampling: strided convolutions down, transposed convolutions (ConvTranspose2d) back up, skips added."
    def __init__(self, c=32):
        super().__init__()
        blk = lambda i, o, s=1: nn.Sequential(nn.Conv2d(i, o, 3, stride=s, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.d1, self.d2, self.d3 = blk(3, c), blk(c, 2 * c, 2), blk(2 * c, 4 * c, 2)
        self.u2, self.u1 = nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2), nn.ConvTranspose2d(2 * c, c, 4, stride=2, padding=1)
        self.out = nn.Conv2d(c, 10, 1)
    def forward(self, x):
        s1 = self.d1(x); s2 = self.d2(s1)
        return self.out(F.relu(self.u1(F.relu(self.u2(self.d3(s2)) + s2)) + s1)).mean((2, 3))

class TConvGen(nn.Module):
    "A generator's shape: a small map upsampled 8x by transposed convolutions (DCGAN-style, BatchNorm and ReLU), scored per pixel."
    def __init__(self, c=128):
        super().__init__()
        up = lambda i, o: nn.Sequential(nn.ConvTranspose2d(i, o, 4, stride=2, padding=1), nn.BatchNorm2d(o), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), up(c, c // 2), up(c // 2, c // 4), up(c // 4, c // 8), nn.ConvTranspose2d(c // 8, 10, 3, padding=1))
    def forward(self, x): return self.body(x).mean((2, 3))

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

FAMILIES = {'resnet18': (_tv('resnet18'), (3, 64, 64), (16, 64)), 'mobilenet_v2': (_tv('mobilenet_v2'), (3, 64, 64), (16, 64)),
            'squeezenet': (_tv('squeezenet1_1'), (3, 64, 64), (16, 64)), 'densenet121': (_tv('densenet121'), (3, 64, 64), (8, 32)),
            'encdec': (EncDec, (3, 64, 64), (8, 32)), 'lstm': (RNNClassifier, (64, 64), (32, 128)),
            'gru': (lambda: RNNClassifier('gru'), (64, 64), (32, 128)), 'bigru': (lambda: RNNClassifier('gru', bidirectional=True), (64, 64), (32, 128)),
            'mha': (MHABlock, (128, 256), (16, 64)), 'mha_fused': (FusedMHABlock, (128, 256), (16, 64)), 'hand_attn': (HandAttention, (128, 256), (16, 64)),
            'conv1d': (conv1d, (16, 1024), (32, 128)), 'tied_lm': (TiedLM, (64,), (16, 64)), 'ln_mlp': (ln_mlp, (1, 28, 28), (256, 1024))}
# the same families with one thing changed each, for checking the plan on cases no model of the planner was fitted or checked on:
# the recurrent nets, whose tensors share glibc's heap with the graph's objects (the hardest case), and two convolutional nets at other sizes
RNN = lambda kind, **kw: (lambda: RNNClassifier(kind, **kw))
VARIANTS = {'gru_1layer': (RNN('gru', layers=1), (64, 64), (32,)), 'gru_3layer': (RNN('gru', layers=3), (64, 64), (32,)),
            'gru_48steps': (RNN('gru'), (48, 64), (32,)), 'gru_d96': (RNN('gru', d=96), (64, 64), (32,)), 'gru_d160': (RNN('gru', d=160), (64, 64), (32,)),
            'rnn_tanh': (RNN('rnn'), (64, 64), (32,)), 'lstm_1layer': (RNN('lstm', layers=1), (64, 64), (32,)), 'lstm_32steps': (RNN('lstm'), (32, 64), (32,)),
            'lstm_d96': (RNN('lstm', d=96), (64, 64), (32,)), 'bigru_d64_in32': (RNN('gru', d=64, bidirectional=True, inputs=32), (64, 32), (32,)),
            'gru_b24': (RNN('gru'), (64, 64), (24,)), 'resnet18_96px': (_tv('resnet18'), (3, 96, 96), (8,)), 'mobilenet_v2_32px': (_tv('mobilenet_v2'), (3, 32, 32), (32,)),
            'resnet18_32px': (_tv('resnet18'), (3, 32, 32), (32,))}  # CIFAR-size images: its last stage runs at 1x1, where the weights outweigh the activations
class Encoder(nn.Module):
    "nn.TransformerEncoder (pre-norm, GELU) over 64 tokens of 128 features, mean-pooled: attention as PyTorch's own layer runs it."
    def __init__(self, d=128):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.1, activation='gelu', batch_first=True, norm_first=True)
        self.body, self.head = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), nn.Linear(d, 10)
    def forward(self, x): return self.head(self.body(x).mean(1))

# models that none of the planner was built or checked on, added after it was done: other torchvision families (channel
# shuffle; squeeze-excitation with SiLU and stochastic depth; grouped convolutions of 16 channels; a NAS-found net) and PyTorch's
# own transformer encoder
UNSEEN = {'shufflenet_v2': (_tv('shufflenet_v2_x0_5'), (3, 64, 64), (16,)), 'efficientnet_b0': (_tv('efficientnet_b0'), (3, 64, 64), (16,)),
          'regnet_x_400mf': (_tv('regnet_x_400mf'), (3, 64, 64), (16,)), 'mnasnet': (_tv('mnasnet0_5'), (3, 64, 64), (16,)),
          'encoder': (Encoder, (64, 128), (32,))}
class CellLoop(nn.Module):
    "A GRUCell unrolled by hand over 32 steps, its state started the way many tutorials start it: torch.zeros with no device."
    def __init__(self, d=128):
        super().__init__()
        self.cell, self.head = nn.GRUCell(64, d), nn.Linear(d, 10)
    def forward(self, x):
        h = torch.zeros(x.shape[0], self.cell.hidden_size)
        for t in range(x.shape[1]): h = self.cell(x[:, t], h)
        return self.head(h)

class ASPP(nn.Module):
    "DeepLab's atrous pyramid: four 3x3 branches dilated 1, 2, 4 and 8 over one map, concatenated."
    def __init__(self, c=64):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.br = nn.ModuleList(nn.Sequential(nn.Conv2d(c, c, 3, padding=d, dilation=d), nn.BatchNorm2d(c), nn.ReLU()) for d in (1, 2, 4, 8))
        self.out = nn.Conv2d(4 * c, 10, 1)
    def forward(self, x):
        s = self.stem(x)
        return self.out(torch.cat([b(s) for b in self.br], 1)).mean((2, 3))

def vit():
    from torchvision.models import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=4, hidden_dim=128, mlp_dim=256, num_classes=10)

def convnext():
    from torchvision.models.convnext import ConvNeXt, CNBlockConfig
    return ConvNeXt([CNBlockConfig(32, 64, 2), CNBlockConfig(64, 128, 2), CNBlockConfig(128, None, 2)], num_classes=10)

# models brought after UNSEEN, as a user would, each of which found something the planner missed (in brackets, what it was
# before the fix): transposed convolutions (a generator -22 %), channels-last memory and LayerNorm's copies (ConvNeXt -7 %),
# a bidirectional LSTM (-16 %), a state made with no device (the plan failed), and two it got right (ViT, dilated convolutions)
BROUGHT = {'tconv_gen': (TConvGen, (3, 16, 16), (16, 64)), 'tconv_unet': (TConvDec, (3, 64, 64), (8, 32)), 'convnext': (convnext, (3, 64, 64), (16,)),
           'lstm_bi': (RNN('lstm', bidirectional=True), (64, 64), (32,)), 'gru_cell_loop': (CellLoop, (32, 64), (32, 128)),
           'vit': (vit, (3, 32, 32), (32,)), 'aspp': (ASPP, (3, 64, 64), (8,))}
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
TOKENS = {'tied_lm': (2000, 2000), 'gpt': (1000, 1000), 'bag': (20000, 10)}  # (ids drawn from, labels drawn from)
FOURTH = {'gpt': (GPT, (128,), (16,)), 'frozen_resnet': (frozen_resnet, (3, 64, 64), (32,)), 'conv3d': (conv3d, (1, 16, 32, 32), (8,)),
          'gn_up': (GNUp, (3, 64, 64), (8,)), 'style': (StyleNet, (3, 96, 96), (8,)), 'tcn': (TCN, (8, 512), (32,)),
          'bag': (Bag, (20,), (256,)), 'einsum_attn': (EinsumAttn, (128, 128), (16,)), 'ckpt_mlp': (CheckpointedMLP, (1, 28, 28), (256,))}

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
FIFTH = {'efficientnet_b0': (_tv('efficientnet_b0'), (3, 64, 64), (16,)), 'regnet_y_400mf': (_tv('regnet_y_400mf'), (3, 64, 64), (16,)),
         'encoder_mask': (EncoderStack, (64, 128), (32,)), 'tiny_vit': (TinyViT, (3, 32, 32), (32,)),  # names of their own: ALL holds every set
         'convnext_blocks': (ConvNeXtBlocks, (3, 64, 64), (16,)), 'unet1d': (UNet1d, (4, 1024), (16,)), 'conv_lstm': (ConvLSTM, (8, 32, 32), (8,)),
         'packed_gru': (PackedRNN, (64, 64), (32,)), 'packed_lstm': (lambda: PackedRNN('lstm', unpack=True), (64, 64), (32,)),
         'packed_gru_full': (lambda: PackedRNN(full=True), (64, 64), (32,)), 'packed_lstm_full': (lambda: PackedRNN('lstm', unpack=True, full=True), (64, 64), (32,))}  # the bound's own case
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
SIXTH = {'resnext': (resnext, (3, 64, 64), (16,)), 'googlenet': (googlenet, (3, 64, 64), (16,)), 'mobilenet_v3': (_tv('mobilenet_v3_small'), (3, 64, 64), (32,)),
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
SEVENTH = {'espcn': (ESPCN, (3, 32, 32), (16,)), 'seg_unet': (SegUNet, (3, 64, 64), (16,)), 'cyclegan_gen': (ResnetGen, (3, 64, 64), (8,)),
           'llama': (Llama, (128,), (16,)), 'llama_smooth': (lambda: Llama(vocab=8000), (128,), (8,)), 'swin': (SwinBlocks, (3, 32, 32), (32,)),
           'gnn': (GNN, (256, 32), (16,)), 'dgcnn': (DGCNN, (256, 3), (16,)), 'moe': (MoE, (64, 64), (32,)), 'wn_tcn': (WNTCN, (8, 1024), (16,)),
           'quant_net': (QuantNet, (3, 64, 64), (16,)), 'fpn_aa': (FPNAA, (3, 64, 64), (16,)), 'scan_ssm': (ScanSSM, (64, 64), (32,))}
TARGETS = {'espcn': lambda bs: torch.randn(bs, 3, 64, 64), 'seg_unet': lambda bs: torch.randint(0, 5, (bs, 64, 64)),
           'cyclegan_gen': lambda bs: torch.randn(bs, 3, 64, 64).tanh()}
LOSSES = {'llama_smooth': lm_smooth_loss}
TOKENS.update({'llama': (2000, 2000), 'llama_smooth': (8000, 8000)})  # next-token labels, one per position

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

EIGHTH = {'ctx_attr': (CtxNet, (3, 64, 64), (16,)), 'albert': (Albert, (64, 64), (32,)), 'inplace_views': (InplaceViews, (3, 64, 64), (16,)),
          'ckpt_nonreentrant': (CkptNonReentrant, (3, 64, 64), (16,)), 'ortho': (Ortho, (1, 28, 28), (256,)), 'grad_hook': (GradHook, (3, 64, 64), (16,)),
          'contrastive': (Contrastive, (3, 32, 32), (256,)), 'sort_pool': (SortPool, (128, 64), (64,)), 'fold_net': (FoldNet, (3, 64, 64), (16,)),
          'flow': (Flow, (3, 64, 64), (16,))}

# a ninth round, of users' losses and training tricks (before this round a CTC loss could not be planned at all: no shape-only kernel): a CRNN reading text lines with a CTC loss (OCR),
# a physics-informed net whose loss holds its second derivative (double backward), a WGAN critic with a gradient penalty; and, found by
# a probe of ops PyTorch has no shape-only kernel for, a VAE with a Beta posterior and a CNN with learned-step-size fake quantization
class CRNN(nn.Module):
    "Convolutions down a 32-pixel text line to one column per step, a bidirectional LSTM over the columns, log-probabilities per step."
    def __init__(self, classes=40):
        super().__init__()
        c = lambda i, o: [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU()]
        self.cnn = nn.Sequential(*c(1, 32), nn.MaxPool2d(2), *c(32, 64), nn.MaxPool2d(2), *c(64, 128), nn.MaxPool2d((2, 1)), *c(128, 128), nn.MaxPool2d((4, 1)))
        self.rnn, self.out = nn.LSTM(128, 128, bidirectional=True, batch_first=True), nn.Linear(256, classes)
    def forward(self, x): return self.out(self.rnn(self.cnn(x).squeeze(2).transpose(1, 2))[0]).log_softmax(-1)  # (B, T, classes)

def ctc_loss(out, y):
    "CTC over the padded label rows of `y` (0 is the blank), every line using all its time steps and its whole label row."
    B, T = out.shape[:2]
    return F.ctc_loss(out.transpose(0, 1), y, torch.full((B,), T, dtype=torch.long), torch.full((B,), y.shape[1], dtype=torch.long))

class PINN(nn.Module):
    "u(x, t) by a tanh MLP; its output carries the residual of the heat equation u_t - u_xx, by autograd.grad with create_graph."
    def __init__(self, d=256):
        super().__init__(); self.net = nn.Sequential(nn.Linear(2, d), nn.Tanh(), nn.Linear(d, d), nn.Tanh(), nn.Linear(d, d), nn.Tanh(), nn.Linear(d, 1))
    def forward(self, xt):
        xt = xt.detach().requires_grad_(True)
        u = self.net(xt)
        du = torch.autograd.grad(u.sum(), xt, create_graph=True)[0]
        u_xx = torch.autograd.grad(du[:, 0].sum(), xt, create_graph=True)[0][:, :1]
        return torch.cat([u, du[:, 1:] - u_xx], 1)

class GPCritic(nn.Module):
    "A WGAN-GP critic: its score, and the gradient penalty on its input gradient's norm (create_graph) added to it."
    def __init__(self):
        super().__init__()
        self.d = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.LeakyReLU(0.2), nn.Conv2d(64, 128, 4, 2, 1), nn.LeakyReLU(0.2),
                               nn.Conv2d(128, 256, 4, 2, 1), nn.LeakyReLU(0.2), nn.Flatten(), nn.Linear(256 * 4 * 4, 1))
    def forward(self, x):
        x = x.detach().requires_grad_(True)
        s = self.d(x)
        g = torch.autograd.grad(s.sum(), x, create_graph=True)[0]
        return s + 10 * (g.flatten(1).norm(2, dim=1, keepdim=True) - 1) ** 2

class BetaVAE(nn.Module):
    "A VAE with a Beta posterior (`rsample` draws through Dirichlet's sampler and its gradient), decoding to the image."
    def __init__(self, z=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 32, 4, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 4, 2, 1), nn.ReLU(), nn.Flatten(), nn.Linear(64 * 8 * 8, 2 * z))
        self.dec = nn.Sequential(nn.Linear(z, 64 * 8 * 8), nn.Unflatten(1, (64, 8, 8)), nn.ConvTranspose2d(64, 32, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(32, 3, 4, 2, 1))
    def forward(self, x):
        a, b = F.softplus(self.enc(x)).float().chunk(2, -1)  # float: PyTorch samples no Dirichlet (Beta) in bf16
        q = torch.distributions.Beta(a + 0.5, b + 0.5)
        return self.dec(q.rsample()) + 0 * q.entropy().mean()

class LSQ(nn.Module):
    "Learned step-size fake quantization (LSQ) of a tensor per channel: a learnable scale for each, 8 bits."
    def __init__(self, c, axis=1): super().__init__(); self.scale, self.zero, self.axis = nn.Parameter(torch.full((c,), 0.05)), nn.Parameter(torch.zeros(c)), axis
    def forward(self, x): return torch._fake_quantize_learnable_per_channel_affine(x, self.scale, self.zero, self.axis, -128, 127, 1.0)

class LSQNet(nn.Module):
    "A small CNN trained quantization-aware: weights and activations through LSQ before each convolution."
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(i, o, 3, padding=1) for i, o in ((3, 32), (32, 64), (64, 64)))
        self.qa = nn.ModuleList(LSQ(c) for c in (3, 32, 64)); self.qw = nn.ModuleList(LSQ(o, 0) for o in (32, 64, 64)); self.head = nn.Linear(64, 10)
    def forward(self, x):
        for conv, qa, qw in zip(self.convs, self.qa, self.qw): x = F.max_pool2d(F.relu(F.conv2d(qa(x), qw(conv.weight), conv.bias, padding=1)), 2)
        return self.head(x.mean((2, 3)))

NINTH = {'crnn_ctc': (CRNN, (1, 32, 128), (16, 48)), 'pinn': (PINN, (2,), (2048,)), 'wgan_gp': (GPCritic, (3, 32, 32), (64,)),
         'beta_vae': (BetaVAE, (3, 32, 32), (64,)), 'lsq_net': (LSQNet, (3, 64, 64), (16,))}
TARGETS.update({'crnn_ctc': lambda bs: torch.randint(1, 40, (bs, 12)), 'pinn': lambda bs: torch.randn(bs, 2), 'wgan_gp': lambda bs: torch.randn(bs, 1),
                'beta_vae': lambda bs: torch.randn(bs, 3, 32, 32)})
LOSSES.update({'crnn_ctc': ctc_loss})

# a tenth round: torchvision's own models beyond classification, as a user downloads them (random weights here): segmentation
# with a dict output and an auxiliary head, a video ResNet, Swin and EfficientNetV2 from the library; measured before any change
def _tv_seg(name, **kw):
    def f():
        import torchvision.models.segmentation as seg
        return getattr(seg, name)(weights=None, weights_backbone=None, num_classes=5, **kw)
    f.__qualname__ = f'torchvision.models.segmentation.{name}'
    return f

def r3d_18():
    import torchvision.models.video as video
    return video.r3d_18(weights=None, num_classes=10)

TENTH = {'fcn_resnet50': (_tv_seg('fcn_resnet50', aux_loss=True), (3, 128, 128), (4,)), 'deeplabv3_mbv3': (_tv_seg('deeplabv3_mobilenet_v3_large'), (3, 128, 128), (8,)),
         'lraspp_mbv3': (_tv_seg('lraspp_mobilenet_v3_large'), (3, 128, 128), (8,)), 'r3d_18': (r3d_18, (3, 8, 64, 64), (4,)),
         'swin_t': (_tv('swin_t'), (3, 64, 64), (16,)), 'efficientnet_v2_s': (_tv('efficientnet_v2_s'), (3, 64, 64), (16,))}
TARGETS.update({k: (lambda bs: torch.randint(0, 5, (bs, 128, 128))) for k in ('fcn_resnet50', 'deeplabv3_mbv3', 'lraspp_mbv3')})  # a class per pixel

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

ELEVENTH = {'deform_conv': (DeformNet, (3, 64, 64), (16,)), 'roi_head': (RoIHead, (3, 64, 64), (16,)), 'vq_vae': (VQVAE, (3, 32, 32), (64,)),
            'diffusion_unet': (DiffusionUNet, (3, 32, 32), (32,)), 'simclr': (SimCLR, (3, 32, 32), (32,)),
            'masked_seq2seq': (MaskedSeq2Seq, (48,), (32,)), 'packed_lengths': (PackedLengths, (64,), (32,)),
            'part_frozen': (PartFrozen, (3, 64, 64), (32,)), 'capsnet': (CapsNet, (1, 28, 28), (64,)), 'packed_long': (PackedLong, (1000, 16), (8,))}
TARGETS.update({'vq_vae': lambda bs: torch.randn(bs, 3, 32, 32)})
TOKENS.update({'masked_seq2seq': (1000, 1000), 'packed_lengths': (2000, 10)})
LOSSES.update({'diffusion_unet': _loss_is_output, 'simclr': _loss_is_output, 'masked_seq2seq': seq2seq_loss, 'capsnet': margin_loss})

ALL = {**MODELS, **FAMILIES, **VARIANTS, **UNSEEN, **BROUGHT, **FOURTH, **FIFTH, **SIXTH, **SEVENTH, **EIGHTH, **NINTH, **TENTH, **ELEVENTH}
_SETS = (MODELS, FAMILIES, VARIANTS, UNSEEN, BROUGHT, FOURTH, FIFTH, SIXTH, SEVENTH, EIGHTH, NINTH, TENTH, ELEVENTH)
assert all(ALL[k] is d[k] or ALL[k][1:] == d[k][1:] and ALL[k][0].__qualname__ == d[k][0].__qualname__ != '<lambda>' for d in _SETS for k in d), \
    'two sets name different models alike: `make` would run one in place of the other'

def make(name, bs, seed=0):
    f, shape, _ = ALL[name]
    torch.manual_seed(seed)
    if name in TOKENS:
        ids, labels = TOKENS[name]
        return f(), (torch.randint(0, ids, (bs, *shape)), torch.randint(0, labels, (bs, *shape) if labels == ids else (bs,)))
    x = torch.randn(bs, *shape)
    return f(), (x, TARGETS[name](bs) if name in TARGETS else torch.randint(0, 10, (bs,)))

def _loss(name):
    "The loss the measured steps and the plans use: the model's own (LOSSES) or the planner's default (cross-entropy, MSE for images)."
    from netlite_nb.budget import default_loss
    return LOSSES.get(name, default_loss)

def _rss()->int:
    with open('/proc/self/statm') as f: return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')

def _hwm()->int:
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM'): return int(line.split()[1]) * 1024

def _precision()->str: return os.environ.get('BENCH_PRECISION', 'fp32')  # --precision: the measured steps' and the plans'

OPTIMIZERS = {  # --optimizers: what users pass, each a callable params -> optimizer that the measured steps and the plans both get
    'adamw': lambda p: torch.optim.AdamW(p, lr=1e-3),
    'sgd_nesterov': lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4),
    'sgd_foreach': lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True),
    'adam_amsgrad': lambda p: torch.optim.Adam(p, lr=1e-3, amsgrad=True),
    'adam_foreach': lambda p: torch.optim.Adam(p, lr=1e-3, foreach=True),
    'adamw_fused': lambda p: torch.optim.AdamW(p, lr=1e-3, fused=True),
    'rmsprop_centered': lambda p: torch.optim.RMSprop(p, lr=1e-3, centered=True, momentum=0.9),
    'adagrad': lambda p: torch.optim.Adagrad(p, lr=1e-2),  # its state exists from the constructor on
    'adamax': lambda p: torch.optim.Adamax(p, lr=1e-3),
    'nadam': lambda p: torch.optim.NAdam(p, lr=1e-3),
    'radam': lambda p: torch.optim.RAdam(p, lr=1e-3, decoupled_weight_decay=True, weight_decay=0.01),
    'adadelta': lambda p: torch.optim.Adadelta(p),
    'adafactor': lambda p: torch.optim.Adafactor(p, lr=1e-2),  # reads step counts and norms with .item()
    'asgd': lambda p: torch.optim.ASGD(p, lr=1e-2),  # reads eta and mu with .item()
    'rprop': lambda p: torch.optim.Rprop(p)}

def _optimizer():
    "The measured steps' optimizer (--optimizers sets BENCH_OPTIMIZER in the measuring children): AdamW otherwise."
    return OPTIMIZERS[os.environ.get('BENCH_OPTIMIZER', 'adamw')]

def _autocast():
    "The measured steps' autocast: CPU bf16 mixed precision with --precision bf16, nothing otherwise."
    return torch.autocast('cpu', dtype=torch.bfloat16, enabled=_precision() == 'bf16')

def _steps(model, opt, x, y, n=2, loss_fn=F.cross_entropy):
    for _ in range(n):
        with _autocast():
            out = model(x)  # held through backward, as a loop that also computes accuracy does (and as the planner traces)
            loss = loss_fn(out, y)
        loss.backward()
        del out, loss
        opt.step()
        opt.zero_grad(set_to_none=True)

from netlite_nb.budget import _free_blas_buffers  # hands MKL's cached matmul buffers back (mkl_free_buffers)

_KEPT = []  # the small tensors `_messy_heap` keeps: they pin its holes in place, as a notebook's losses and results do

def _fix_late():
    "In a `--glibc fixed-late` child: a notebook's process, its heap made under glibc's own settings, then the thresholds fixed in it."
    how = os.environ.get('BENCH_FIX_LATE')
    if not how: return
    from netlite_nb import budget
    _KEPT.extend(budget._messy_heap())
    if how == 'thresholds': budget._plug_heap = lambda threshold: 0  # what fix_glibc_thresholds does, less filling the free chunks
    budget.fix_glibc_thresholds()

def measure(name, bs, full_warmup=False, holes=False, history=0)->int:
    """Run in a fresh process: the measured peak bytes of two AdamW training steps (full_warmup: what kernels keep is already there;
    holes: the warm-up's freed heap is left in place, where the measured steps' small objects reuse it instead of growing the heap;
    history: the planner's `_heap_history(seed)`, up to 40 small blocks left alive in the heap just before the steps)."""
    import ctypes, gc
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    _fix_late()
    model, (x, y) = make(name, bs)
    warm = _optimizer()(model.parameters())
    w = slice(None) if full_warmup else slice(2)
    _steps(model, warm, x[w], y[w], 1, _loss(name))  # load kernels, fault in code pages
    del warm
    for p in model.parameters(): p.grad = None
    torch.manual_seed(1)
    opt = _optimizer()(model.parameters())
    gc.collect()
    if not full_warmup: _free_blas_buffers()  # the warm-up's small GEMMs left buffers; a real run's first step is full-size
    if not holes: ctypes.CDLL(None).malloc_trim(0)  # a real first step finds no freed heap of an earlier step to put its graph in
    if history:
        from netlite_nb.budget import _heap_history, _libc
        _heap_history(_libc().malloc, history)  # never freed: they stay in the heap through the steps
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]  # Adagrad's, made by its constructor
    alive = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x, y, *state])
    base, code = _rss(), _file_backed()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')  # reset the RSS high-water mark
    _steps(model, opt, x, y, 2, _loss(name))
    _CODE_PAGES.append(_file_backed() - code)  # what of the growth is code the steps faulted in (`--code-pages`)
    return _hwm() - base + alive

_CODE_PAGES = []

def _file_backed()->int:
    "Resident bytes of this process that are file-backed (code and other mapped files): what the kernel can drop and read again."
    d = {}
    with open('/proc/self/smaps_rollup') as f:
        for line in f:
            k, *v = line.split()
            if k in ('Rss:', 'Anonymous:'): d[k] = int(v[0]) * 1024
    return d['Rss:'] - d['Anonymous:']

def code_pages_child(name, bs)->list:
    "Run in a fresh process: `measure`'s peak, and how much of the measured steps' resident growth is file-backed pages they faulted in."
    return [measure(name, bs), _CODE_PAGES[-1]]

def code_pages_report(cases):
    "For each case: the measured peak and the file-backed pages (the math libraries' code) the measured steps faulted in."
    for name, bs in cases:
        m, f = run_child('--code-pages-child', [name, bs])
        print(f"{name} at batch {bs}: measured {m/2**20:.2f} MiB, of which {f/2**20:.2f} MiB file-backed pages faulted in during the steps", flush=True)

def measured(name, bs, full_warmup=False, holes=None, history=0)->int:
    holes = HOLES if holes is None else holes
    out = subprocess.run([sys.executable, __file__, '--measure', name, str(bs), *(['full'] if full_warmup else []), *(['holes'] if holes else []),
                          *([f'history={history}'] if history else [])],
                         env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)}, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])

def _as_measured():
    "Plan for the processes that `measured` runs: glibc's settings are theirs (the planner's model of glibc reads them from the environment)."
    return mock.patch.dict(os.environ, {k: v for k, v in ENV.items() if k.startswith('MALLOC_')})

def predicted(name, bs, device_or_gpu='cpu', **kw)->int:
    "The planner's peak; on the 'cpu' target it includes the CPU kernel workspace, with device_or_gpu=None it is tensors only."
    from netlite_nb.budget import plan_memory
    model, batch = make(name, bs)
    opt = OPTIMIZERS[os.environ['BENCH_OPTIMIZER']] if 'BENCH_OPTIMIZER' in os.environ else 'adamw'  # the same AdamW by name
    with _as_measured(): return plan_memory(model, batch, LOSSES.get(name), optimizer=opt, precision=_precision(), device_or_gpu=device_or_gpu, **kw).peak

def accuracy_table(full_warmup=False, models=MODELS, calibrate=False):
    """Predicted vs measured peak for each model at its batch sizes; then the plan without the CPU kernel workspace (tensors only),
    and with calibrate: the plan calibrated on this machine, from an empty cache filled first by `calibrate_all`."""
    import tempfile
    from netlite_nb import budget
    if calibrate:  # an empty cache of our own: what a first calibrated plan costs on this machine
        torch.set_num_threads(int(ENV['OMP_NUM_THREADS']))  # calibration measures at the asking process's thread count: the measured ones'
        os.environ['XDG_CACHE_HOME'] = tempfile.mkdtemp()
        budget._calibrated.cache_clear()
        calibrate_all(models)
    w = max([13, *(len(k) + 1 for k in models)])  # the name column
    print(f"{'model':<{w}}{'batch':>6}{'predicted':>12}{'measured':>12}{'error':>8}  {'tensors only: error':>20}" + ('  calibrated: error' if calibrate else ''))
    errs, cerrs, secs = [], [], 0.0
    for name, (_, _, sizes) in models.items():
        for bs in sizes:
            p, t, m = predicted(name, bs), predicted(name, bs, None), measured(name, bs, full_warmup)
            errs.append((p - m) / m)
            line = f"{name:<{w}}{bs:>6}{p/2**20:>10.1f}Mi{m/2**20:>10.1f}Mi{100*errs[-1]:>+7.1f}%  {(t - m)/2**20:>+10.1f} MiB{100*(t - m)/m:>+7.1f}%"
            if calibrate:
                c = predicted(name, bs, calibrate=True)  # every shape is in the cache already (`calibrate_all`)
                cerrs.append((c - m) / m)
                line += f"  {c/2**20:>9.1f}Mi{100*cerrs[-1]:>+7.1f}%"
            print(line, flush=True)
    print(f"max |error| {100*max(abs(e) for e in errs):.1f}%" + (f"; calibrated {100*max(abs(e) for e in cerrs):.1f}%" if calibrate else ''))

def optimizers_table(names, cases):
    "Predicted vs measured peak of each case, trained by each optimizer of `names` (measured and planned alike, `OPTIMIZERS`)."
    print(f"{'optimizer':<18}{'model':<10}{'batch':>6}{'predicted':>12}{'measured':>12}{'error':>8}")
    errs = []
    for o in names:
        os.environ['BENCH_OPTIMIZER'] = o  # the plans read it, and the measuring children inherit it
        for name, bs in cases:
            p, m = predicted(name, bs), measured(name, bs)
            errs.append((p - m) / m)
            print(f"{o:<18}{name:<10}{bs:>6}{p/2**20:>10.1f}Mi{m/2**20:>10.1f}Mi{100*errs[-1]:>+7.1f}%", flush=True)
    del os.environ['BENCH_OPTIMIZER']
    print(f"error {100*min(errs):+.1f} ... {100*max(errs):+.1f}%")

def calibration_lines(name, bs):
    """Each convolution of one case, measured and read off the lines calibration draws: at the batch, the line through a quarter and a
    half of it (what calibration did before) next to the measurement; at twice the batch, the furthest a measurement now serves,
    the line through half and all of it (what it does) next to the measurement. Rows where either line is 256 KiB off."""
    from netlite_nb.budget import measure_conv_scratch, trace_step
    model, batch = make(name, bs)
    specs = []
    trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu', measured={}, missing=specs, steps=1)
    convs = list({json.dumps(s): s for s in specs if s[0] != 'matmul'}.values())
    q, h = max(1, bs // 4), max(2, bs // 2)
    got = measure_conv_scratch(convs, (q, h, bs, 2 * bs))
    at = lambda x, b1, m1, b2, m2: m2 + (m2 - m1) / (b2 - b1) * (x - b2)
    mi = lambda n: f"{n/2**20:7.2f}"
    print(f"{name}: convolution scratch in MiB. At batch {bs}: measured | line through {q} and {h}.   At {2 * bs}: measured | line through {h} and {bs}")
    ratios = {'old': [], 'new': []}
    for s, (m1, m2, m3, m4) in zip(convs, got):
        old, new = at(bs, q, m1, h, m2), at(2 * bs, h, m2, bs, m3)
        if m3 > 2**18: ratios['old'].append(old / m3)
        if m4 > 2**18: ratios['new'].append(new / m4)
        if max(abs(m3 - old), abs(m4 - new)) > 2**18:
            print(f"  {json.dumps(s[:7])[:76]:<78}{mi(m3)} |{mi(old)}      {mi(m4)} |{mi(new)}")
    print(f"  {len(convs)} convolutions; line / measurement where the measurement is above 256 KiB: "
          f"before {min(ratios['old']):.2f}-{max(ratios['old']):.2f}, now {min(ratios['new']):.2f}-{max(ratios['new']):.2f}")

def calibrate_all(models):
    """Measure every kernel shape the calibrated plans of `models` need, in one child process (one torch import, not one a plan):
    trace one step of each case to collect the shapes the cache lacks, then `calibrate_kernels` on all of them. Prints what it cost."""
    from netlite_nb.budget import trace_step, calibrate_kernels, _calibrated
    t0, specs = time.time(), []
    for name, (_, _, sizes) in models.items():
        for bs in sizes:
            model, batch = make(name, bs)
            trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu', measured=_calibrated(), missing=specs, steps=1)  # step 2 runs the same shapes
    t1 = time.time()
    table = calibrate_kernels(specs)
    print(f"calibration from an empty cache: {len(table)} kernel shapes measured in one child process in {time.time() - t1:.0f} s, "
          f"after {t1 - t0:.0f} s of tracing to find them ({len(specs)} kernel calls)", flush=True)

def kernels_child(specs:list, threads:int=1)->list:
    "Run in a fresh process: the resident bytes each kernel adds beyond its outputs, in order (kept buffers show up once)."
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    # load the code first: a small matmul and a small convolution forward and backward, then hand MKL's buffers back
    torch.randn(8, 8) @ torch.randn(8, 8)
    for k, g in ((3, 1), (1, 1), (3, 4)):  # plain, pointwise and depthwise convolutions have kernels of their own
        F.conv2d(torch.randn(2, 4, 8, 8, requires_grad=True), torch.randn(4, 4 // g, k, k, requires_grad=True), padding=k // 2, groups=g).sum().backward()
    _free_blas_buffers()
    out = []
    for kind, *shape in specs:
        if kind == 'mm':
            M, K, N = shape
            a, b = torch.randn(M, K), torch.randn(K, N)
            r0 = _rss(); c = a @ b
            out.append(_rss() - r0 - c.nbytes)
            del a, b, c
        else:  # 'conv': batch, channels, size, out channels, kernel size, groups; forward, then backward
            B, C, H, O, k, g = shape
            x, w = torch.randn(B, C, H, H, requires_grad=True), torch.randn(O, C // g, k, k, requires_grad=True)
            r0 = _rss(); y = F.conv2d(x, w, padding=k // 2, groups=g)
            out.append(_rss() - r0 - y.nbytes)
            # a scalar's backward, as in training (backward(gradient=...) imports modules the first time: megabytes of Python objects)
            r0 = _rss(); y.sum().backward()
            out.append(_rss() - r0 - x.grad.nbytes - w.grad.nbytes)
            del x, w, y
    return out

def run_kernels(specs, threads=1)->list:
    out = subprocess.run([sys.executable, __file__, '--kernels-child', json.dumps([specs, threads])],
                         env={**os.environ, **ENV, 'OMP_NUM_THREADS': str(threads), 'PYTHONPATH': str(ROOT)}, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.split('\n')[-2])

def gemm_report():
    "Measure what the CPU workspace model of `plan_memory` rests on, each number next to the model's."
    from netlite_nb.budget import cpu_workspace_bytes, _MKL_BLOCKING
    mi = lambda n: f"{n/2**20:6.2f}"
    mm = lambda M, K, N: ('matmul', 1, M, K, N, 'torch.float32')
    from netlite_nb.budget import _in_child, _mkl_isa
    isa = torch.backends.cpu.get_cpu_capability()
    print(f"1. One fp32 matmul (M x K) @ (K x N), MKL's buffers handed back before each: resident MiB beyond its output "
          f"(this CPU: {isa}; model: the {_mkl_isa()} row)")
    print(f"{'M':>6}{'K':>6}{'N':>7}  measured  model")
    shapes = [(256, 4096, 4096), (384, 4096, 4096), (392, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096),
              (1, 4096, 4096), (2, 4096, 4096), (4, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096), (300, 4096, 4096),
              (1024, 64, 4096), (1024, 128, 4096), (1024, 192, 4096), (1024, 200, 4096), (1024, 256, 4096), (1024, 384, 4096),
              (1024, 400, 4096), (1024, 512, 4096), (1024, 640, 4096), (1024, 784, 4096),
              (1024, 4096, 10), (1024, 4096, 32), (1024, 4096, 64), (1024, 4096, 128), (1024, 4096, 176), (1024, 4096, 192), (1024, 4096, 1024),
              (1024, 4096, 6144), (1024, 4096, 6400), (1024, 4096, 6656), (1024, 4096, 8192), (1024, 4096, 16384),
              (32, 128, 384), (384, 2048, 64), (2048, 64, 384), (2048, 256, 2000), (128, 128, 128)]
    got = _in_child('_measure_matmuls', [['matmul', 1, M, K, N, 'float32'] for M, K, N in shapes])
    for (M, K, N), g in zip(shapes, got):
        print(f"{M:>6}{K:>6}{N:>7}  {mi(g)}    {mi(cpu_workspace_bytes([mm(M, K, N)]))}", flush=True)
    big, small = [1024, 4096, 4096], [1024, 4096, 1024]
    again = run_kernels([['mm', *big], ['mm', *big]])
    print(f"2. Kept, not transient: the same 1024x4096 @ 4096x4096 matmul twice in one process adds {mi(again[0])} then {mi(again[1])} MiB")
    for seq in ([big, small], [small, big]):
        got = run_kernels([['mm', *s] for s in seq])
        model = [cpu_workspace_bytes([mm(*s) for s in seq[:i+1]]) - cpu_workspace_bytes([mm(*s) for s in seq[:i]]) for i in range(2)]
        print(f"3. {' then '.join('x'.join(map(str, s)) for s in seq)}: adds {mi(got[0])} + {mi(got[1])} MiB (model {mi(model[0])} + {mi(model[1])}):"
              " a smaller matmul reuses the buffer, a larger one gets a new one and the old one stays", flush=True)
    convs = [[16, 32, 64, 32, 3, 32], [16, 32, 64, 64, 1, 1], [16, 64, 32, 64, 3, 64], [16, 64, 32, 128, 1, 1],
             [16, 128, 16, 128, 3, 128], [16, 128, 16, 256, 1, 1], [8, 3, 64, 32, 3, 1], [32, 64, 32, 128, 1, 1]]
    skinny = [[256, 4096, 10], [512, 4096, 10], [10, 1024, 4096], [10, 512, 1024], [128, 256, 256], [256, 784, 1024], [64, 1024, 1024], [96, 512, 2048]]
    got = run_kernels([['conv', *c] for c in convs] + [['mm', *s] for s in skinny])
    nc, ns = 2 * len(convs), len(skinny)
    g = _MKL_BLOCKING[_mkl_isa()]
    print(f"4. Kernel state per shape: {len(convs)} convolutions (forward and backward: {nc} kernels) add {mi(sum(got[:nc]))} MiB: "
          f"{sum(got[:nc])/nc/2**10:.0f} KiB per kernel (model {g['state']/2**10:.0f} KiB); {ns} smaller matmuls add {mi(sum(got[nc:]))} MiB "
          f"(model {mi(cpu_workspace_bytes([mm(*s) for s in skinny]))}); all together {sum(got)/(nc+ns)/2**10:.0f} KiB per kernel")
    one, two = run_kernels([['mm', *big]], 1)[0], run_kernels([['mm', *big]], 2)[0]
    print(f"5. Threads (not modelled): the 1024x4096 @ 4096x4096 matmul adds {mi(one)} MiB with one thread, {mi(two)} with two")
    from netlite_nb.budget import _ONEDNN_MATMUL_STATE, _onednn_lowp
    how = _onednn_lowp('torch.bfloat16')
    if how is None: print("6. bf16 matmuls do not run on oneDNN here (MKL's rule above)"); return
    specs = [['onednn_matmul', 1, M, K, N, 'bfloat16', lay] for M, K, N in [(2048, 256, 768), (2048, 1024, 256), (256, 2048, 1024), (16, 256, 10), (8192, 512, 512), (128, 4096, 1000)]
             for lay in ('NT+', 'NN', 'TN')] + [['onednn_matmul', 64, 128, 64, 128, 'bfloat16', 'NN'], ['onednn_matmul', 64, 128, 128, 64, 'bfloat16', 'NT']]
    if _onednn_lowp('torch.float16'):  # fp16 on oneDNN too (AMX-FP16, AVX512_FP16): the same rule
        specs += [['onednn_matmul', 1, 2048, 256, 768, 'float16', 'NT+'], ['onednn_matmul', 1, 768, 2048, 256, 'float16', 'TN']]
    got = _in_child('_measure_onednn', specs)
    print(f"6. bf16 matmuls run on oneDNN ({how}): heap KiB each new primitive keeps (shape, layout; + a bias), model {_ONEDNN_MATMUL_STATE[how] // 1024}:")
    print('  ' + '; '.join(f"{'x'.join(map(str, s[2:5]))}{'' if s[1] == 1 else f' (batch {s[1]})'}{' fp16' if s[5] == 'float16' else ''} {s[6]}: {g // 1024}" for s, g in zip(specs, got)))
    print(f"  median {sorted(got)[len(got) // 2] // 1024} KiB, {min(got) // 1024}-{max(got) // 1024}")

def _conv_rows(rows):
    "Each (label, forward args, output, backward args) measured in fresh processes, one per batch size, printed next to the model."
    from netlite_nb.budget import _conv_key, cpu_conv_scratch, measure_conv_scratch
    mi = lambda n: f"{n/2**20:7.2f}"
    specs, model = [], []
    for _, fa, y, ba in rows:
        for f, a, o in ((torch.ops.aten.convolution.default, fa, y), (torch.ops.aten.convolution_backward.default, ba, None)):
            specs.append(_conv_key(f, a)[1]); model.append(cpu_conv_scratch(f, a, o))
    got = {}
    for B in {sp[-1] for sp in specs}:
        mine = [i for i, sp in enumerate(specs) if sp[-1] == B]
        got.update(zip(mine, (r[0] for r in measure_conv_scratch([specs[i] for i in mine], (B,)))))
    for i, (label, *_) in enumerate(rows):
        print(f"{label:<52}{mi(got[2*i])} |{mi(got[2*i+1])}  {mi(model[2*i])} |{mi(model[2*i+1])}", flush=True)

def kernels_report():
    "Each kernel family's scratch measured in fresh processes, next to the planner's model; shapes the model was not read off included."
    from netlite_nb.budget import _in_child, _lstm_brgemm, _lstm_workspace, _onednn_lowp
    mi = lambda n: f"{n/2**20:7.2f}"
    print("1. Convolutions (oneDNN blocked copies; im2col for PyTorch's fallback): scratch MiB beyond the outputs, forward | backward")
    print(f"{'batch x in x size -> out, kernel, stride, groups':<52}{'measured':>18}{'model':>18}")
    convs = [(32, 64, 64, 32, 3, 1, 1), (32, 32, 64, 64, 3, 1, 1), (32, 96, 64, 32, 3, 1, 1), (32, 12, 64, 24, 3, 1, 1), (16, 3, 64, 32, 4, 4, 1),
             (32, 64, 64, 128, 3, 2, 1), (32, 64, 64, 64, 3, 2, 64), (32, 3, 64, 64, 7, 2, 1), (16, 64, 32, 128, 1, 1, 1),
             (8, 64, 32, 64, 3, 1, 1), (8, 128, 16, 32, 1, 1, 1), (16, 512, 2, 512, 3, 1, 1),  # ResNet-18's deepest, at 64x64
             (32, 64, 64, 128, 1, 2, 1), (32, 128, 32, 128, 3, 2, 4), (32, 128, 32, 128, 3, 2, 32),  # strided: a downsampling 1x1; groups of 32 and of 4 channels
             (8, 256, 64, 10, 1, 1, 1), (2, 256, 64, 10, 1, 1, 1),  # a segmentation head, 1x1 to 10 channels: PyTorch's own kernel (Slow2d)
             (16, 3, 64, 32, 1, 1, 1), (16, 3, 32, 64, 1, 1, 1)]  # a 1x1 from an image's channels (a lifting layer): its weights' gradient copies them blocked
    A, rows = torch.ops.aten, []
    for B, C, S, O, k, st, g in convs:
        x, w = torch.empty(B, C, S, S, device='meta'), torch.empty(O, C // g, k, k, device='meta')
        fa = (x, w, None, [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g)
        y = A.convolution(*fa)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, /{st}, g{g}', fa, y, (y, x, w, [O], [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g, [C != 3, True, False])))
    _conv_rows(rows)
    print("1b. Transposed convolutions (oneDNN, a plain convolution's passes from output to input): scratch MiB, forward | backward")
    ups = [(32, 128, 16, 64, 2, 2, 0, 0, 1), (32, 64, 32, 32, 4, 2, 1, 0, 1), (32, 64, 32, 32, 3, 2, 1, 1, 1), (32, 64, 32, 64, 3, 1, 1, 0, 1),
           (32, 64, 32, 64, 4, 2, 1, 0, 4), (32, 64, 32, 64, 4, 2, 1, 0, 64), (32, 32, 64, 3, 4, 2, 1, 0, 1),  # groups of 16; depthwise; to RGB
           (32, 24, 31, 4, 3, 2, 0, 0, 1), (32, 24, 31, 12, 3, 2, 0, 0, 1), (64, 100, 1, 256, 4, 1, 0, 0, 1),  # few channels; a generator's first layer
           (16, 16, 128, 10, 3, 1, 1, 0, 1), (16, 16, 128, 12, 3, 1, 1, 0, 1), (16, 16, 128, 3, 3, 1, 1, 0, 1), (32, 48, 33, 24, 3, 1, 1, 0, 1)]  # unstrided, to few channels
    rows = []
    for B, C, S, O, k, st, p, op, g in ups:
        x, w = torch.empty(B, C, S, S, device='meta'), torch.empty(C, O // g, k, k, device='meta')
        fa = (x, w, None, [st, st], [p, p], [1, 1], True, [op, op], g)
        y = A.convolution(*fa)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, x{st}, g{g}', fa, y, (y, x, w, [O], [st, st], [p, p], [1, 1], True, [op, op], g, [S > 1, True, False])))
    _conv_rows(rows)
    print("1c. Channels-last convolutions (NHWC: oneDNN copies no activations; a depthwise kernel wider than 3 pads its weights' gradient): scratch MiB, forward | backward")
    cls = [(16, 64, 16, 64, 7, 1, 64), (32, 64, 32, 64, 7, 1, 64), (16, 128, 16, 128, 5, 1, 128), (16, 64, 16, 64, 3, 1, 64),
           (16, 64, 32, 64, 3, 1, 1), (16, 64, 32, 128, 3, 2, 1), (16, 64, 32, 128, 1, 1, 1), (16, 32, 32, 64, 2, 2, 1),
           (16, 512, 2, 512, 3, 1, 1), (16, 512, 2, 512, 3, 1, 1, 'w_cl'), (16, 64, 32, 128, 3, 2, 1, 'w_cl')]  # weights channels-last too (a converted model), or not (ATen copies them)
    rows = []
    for B, C, S, O, k, st, g, *wl in cls:
        x, w = torch.empty(B, C, S, S, device='meta').contiguous(memory_format=torch.channels_last), torch.empty(O, C // g, k, k, device='meta')
        if wl: w = w.contiguous(memory_format=torch.channels_last)
        pad = k // 2 if st == 1 else 0
        fa = (x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], g)
        y = A.convolution(*fa).contiguous(memory_format=torch.channels_last)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, /{st}, g{g}{", weights NHWC" if wl else ""}', fa, y, (y, x, w, [O], [st, st], [pad, pad], [1, 1], False, [0, 0], g, [True, True, False])))
    _conv_rows(rows)
    print("1d. bf16 convolutions (oneDNN accumulates the destination in fp32: the output in forward, the input's gradient in backward): scratch MiB, forward | backward")
    rows = []
    for B, C, S, O, k, st, g in [(8, 96, 64, 32, 3, 1, 1), (8, 64, 32, 64, 3, 1, 1), (8, 32, 64, 64, 3, 1, 1), (8, 64, 32, 128, 3, 2, 1), (8, 128, 16, 128, 3, 1, 1),
                                 (8, 64, 16, 256, 1, 1, 1), (8, 3, 64, 32, 3, 1, 1), (32, 64, 64, 32, 3, 1, 1), (16, 64, 32, 64, 3, 1, 64), (16, 256, 8, 512, 3, 2, 1)]:
        x, w = torch.empty(B, C, S, S, device='meta', dtype=torch.bfloat16), torch.empty(O, C // g, k, k, device='meta', dtype=torch.bfloat16)
        fa = (x, w, None, [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g)
        y = A.convolution(*fa)
        rows.append((f'{B} x {C} x {S}x{S} -> {O}, {k}x{k}, /{st}, g{g}', fa, y, (y, x, w, [O], [st, st], [k // 2] * 2, [1, 1], False, [0, 0], g, [C != 3, True, False])))
    _conv_rows(rows)
    print("2. LSTM layers (oneDNN's op): MiB of workspace resident after forward (mincore), forward scratch, backward scratch")
    shapes = [[64, 32, 64, 128], [128, 32, 64, 128], [64, 32, 64, 256], [64, 32, 256, 128], [100, 64, 32, 100], [64, 128, 64, 128],
              [64, 32, 512, 128], [64, 32, 64, 128, 'reverse'], [64, 32, 256, 128, 'reverse']]  # wider inputs; a bidirectional layer's second direction
    if _onednn_lowp('torch.bfloat16'):  # where oneDNN runs no bf16, PyTorch takes its own kernels
        shapes += [[64, 32, 64, 128, 'bf16'], [64, 128, 64, 128, 'bf16'], [64, 32, 256, 128, 'bf16'], [64, 32, 64, 128, 'reverse', 'bf16'], [32, 16, 64, 384, 'bf16']]
    res = _in_child('_measure_lstms', [['lstm', T, B, I, H, 'reverse' in rest, 'bfloat16' if 'bf16' in rest else 'float32'] for T, B, I, H, *rest in shapes])
    for sh, r in zip(shapes, res):
        rev, bf = 'reverse' in sh[4:], 'bf16' in sh[4:]
        m = _lstm_workspace(*sh[:2], sh[3], sh[2], reverse=rev, itemsize=2 if bf else 4, brgemm=bf and _lstm_brgemm(torch.bfloat16))
        print(f"  steps {sh[0]}, batch {sh[1]}, {sh[2]} -> {sh[3]}{', reversed' if rev else ''}{', bf16' if bf else ''}: measured " + ' '.join(mi(v) for v in r) + "   model " + ' '.join(mi(v) for v in m), flush=True)
    print("3. Temporaries of dtypes (inputs brought to the common dtype, a half-precision mean, a bool or integer sum's int64 copy, dropout's mask), matrix_exp's buffers, F.fold/F.unfold's contiguous copies, convolutions of tensors in other layouts (with the convolution's own scratch), fused attention's accumulators, upsampling's channels-last copies, MKL's FFT copies, complex abs/angle: scratch MiB")
    from netlite_nb.budget import _CONVS, _op_arg, attention_scratch, contiguous_copies, conv_layout_copies, cpu_conv_scratch, fft_scratch, matrix_exp_scratch, promotion_copies, upsample_copies
    t = lambda *shape, dt='float32': ['tensor', list(shape), dt]
    ops = [['add.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]], ['add_.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]],
           ['mul.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bool')]], ['mul.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='int64')]],
           ['add.Tensor', [t(32, 128, 512), t(512, dt='bfloat16')]], ['where.self', [t(32, 128, 512, dt='bool'), t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]],
           ['lt.Tensor', [t(32, 128, 512), t(32, 128, 512, dt='bfloat16')]], ['mean.dim', [t(32, 128, 512, dt='bfloat16'), [-1]]],
           ['mean.dim', [t(32, 128, 512), [-1]]], ['native_dropout.default', [t(32, 128, 512), 0.1, True]], ['native_dropout.default', [t(32, 128, 512, dt='bfloat16'), 0.1, True]],
           ['sum.dim_IntList', [t(32, 64, 256, 16, dt='bool'), [-1], True]], ['sum.dim_IntList', [t(32, 128, 512, dt='uint8'), [1]]],  # counted in int64
           ['sum.dim_IntList', [t(32, 128, 512, dt='int32'), [-1]]], ['prod.dim_int', [t(32, 128, 512, dt='int32'), -1]],
           ['sum.dim_IntList', [t(32, 128, 512, dt='int64'), [-1]]], ['sum.dim_IntList', [t(32, 128, 512, dt='bfloat16'), [-1]]],  # no copy
           ['linalg_matrix_exp.default', [t(256, 256)]], ['linalg_matrix_exp.default', [t(512, 512)]], ['linalg_matrix_exp.default', [t(1024, 1024)]],  # compute_T18's buffers
           ['col2im.default', [t(64, 48, 1024) + ['T'], [64, 64], [4, 4], [1, 1], [1, 1], [2, 2]]], ['col2im.default', [t(64, 48, 1024), [64, 64], [4, 4], [1, 1], [1, 1], [2, 2]]],
           ['im2col.default', [t(64, 3, 64, 64) + ['T'], [4, 4], [1, 1], [1, 1], [2, 2]]], ['im2col.default', [t(64, 3, 64, 64), [4, 4], [1, 1], [1, 1], [2, 2]]]]  # F.fold/F.unfold: copies of inputs that are not contiguous
    conv = lambda x, w, d: ['convolution.default', [x, w, None, [1, 1], [1, 1], [d, d], False, [0, 0], 1]]  # a convolution's tensors in other layouts:
    ops += [conv(t(64, 64, 16, 16) + ['T01'], t(128, 64, 8, 8) + ['T01'], 2), conv(t(64, 64, 16, 16) + ['T01'], t(128, 64, 8, 8), 2),  # a double backward's
            conv(t(64, 64, 16, 16), t(128, 64, 8, 8) + ['T01'], 2), conv(t(64, 64, 16, 16), t(128, 64, 8, 8), 2),  # weight gradient swaps batch and channels
            conv(t(3, 64, 32, 32) + ['T01'], t(64, 64, 16, 16) + ['T01'], 2), conv(t(32, 64, 32, 32) + ['T'], t(64, 64, 3, 3), 1), conv(t(32, 64, 32, 32), t(64, 64, 3, 3), 1)]
    for B, C, H in [(8, 64, 32), (8, 32, 64), (8, 128, 16), (8, 3, 32), (16, 96, 32), (8, 64, 48)]:  # upsampling: output H + W at most 128, or more
        for dt in ('float32', 'bfloat16'):
            ops += [['upsample_nearest2d.default', [t(B, C, H, H, dt=dt), [2 * H, 2 * H], 2.0, 2.0]], ['upsample_bilinear2d.default', [t(B, C, H, H, dt=dt), [2 * H, 2 * H], False, 2.0, 2.0]]]
    for B, H, T, D in [(16, 4, 128, 64), (64, 4, 128, 64), (16, 4, 512, 64), (16, 8, 128, 32), (8, 4, 1024, 64), (16, 4, 128, 128)]:
        for dt in ('float32', 'bfloat16'):
            ops += [['_scaled_dot_product_flash_attention_for_cpu.default', [t(B, H, T, D, dt=dt)] * 3 + [0.0, False]],
                    ['_scaled_dot_product_flash_attention_for_cpu_backward.default', [t(B, H, T, D, dt=dt)] * 5 + [t(B, H, T), 0.0, False]]]
    ops += [['abs.default', [t(16, 129, 251, dt='complex64')]], ['angle.default', [t(16, 129, 251, dt='complex64')]], ['abs.default', [t(16, 64, 256, dt='complex128')]]]
    for B, C, H in [(16, 32, 32), (4, 64, 128)]:  # MKL's FFTs: over the innermost dimensions or not; the inverse real transform over one, two or three
        ops += [['_fft_r2c.default', [t(B, C, H, H), [2, 3], 0, True]], ['_fft_r2c.default', [t(B, C, H, H), [2], 0, True]], ['_fft_r2c.default', [t(B, C, H, H), [0], 0, True]],
                ['_fft_c2c.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [1, 2], 0, False]],
                ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [3], 0, H]], ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [2], 0, H]],
                ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [2, 3], 0, H]], ['_fft_c2r.default', [t(B, C, H, H // 2 + 1, dt='complex64'), [1, 2, 3], 0, H]],
                ['_fft_c2r.default', [t(B, C, H // 2 + 1, H, dt='complex64'), [3, 2], 0, H]], ['_fft_c2r.default', [t(B, C, H // 2 + 1, H, dt='complex64'), [1, 2], 0, H]]]
    for (op, args), g in zip(ops, _in_child('_measure_ops', ops)):
        f, xs = functools.reduce(getattr, op.split('.'), torch.ops.aten), [_op_arg(a, 'meta') for a in args]
        label = op.split('.')[0].replace('_scaled_dot_product_flash_attention_for_cpu', 'flash attention') + ' ' + ', '.join(f"{'x'.join(map(str, a[1]))} {a[2]}" for a in args if isinstance(a, list) and a[:1] == ['tensor'])[:60]
        dims = f' dims {args[1]}' if op.startswith('_fft') else ''
        print(f"  {label + dims:<78} measured {mi(g)}   model {mi(promotion_copies(f, xs) + attention_scratch(f, xs) + upsample_copies(f, xs, f(*xs)) + fft_scratch(f, xs) + contiguous_copies(f, xs) + matrix_exp_scratch(f, xs) + (cpu_conv_scratch(f, xs, f(*xs)) + conv_layout_copies(f, xs) if f in _CONVS else 0))}", flush=True)

def run_child(flag, arg)->list:
    out = subprocess.run([sys.executable, __file__, flag, json.dumps(arg)], env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.split('\n')[-2])

def budgets_table(models=tuple(MODELS), budgets=(0.5, 1, 2), next_up=True):
    """Solve max_batch_size on the CPU for each budget and measure the solved batch (and, with next_up, the next one up) in fresh
    processes. ok: the solved batch measures within the budget and uses at least 90 % of it."""
    from netlite_nb.budget import max_batch_size
    print(f"{'model':<13}{'budget':>8}{'solved':>8}{'predicted@b':>13}{'measured@b':>12}{'used':>7}" + (f"{'measured@b+1':>14}{'per sample':>12}" if next_up else '') + "  ok")
    for name in models:
        for gb in budgets:
            t0, budget = time.time(), int(gb * 2**30)
            model, batch = make(name, 2)
            with _as_measured(): b = max_batch_size(model, batch, loss_fn=LOSSES.get(name), budget=budget, device_or_gpu='cpu', optimizer='adamw', precision=_precision())
            p0, m0 = predicted(name, b), measured(name, b)
            ok = 'NO: over budget' if m0 > budget else 'yes: the search stops at max_batch' if b == 2**16 else f"NO: uses {100*m0/budget:.0f}% < 90%" if m0 < 0.9 * budget else 'yes'
            line = f"{name:<13}{gb:>6.1f}Gi{b:>8}{p0/2**20:>11.1f}Mi{m0/2**20:>10.1f}Mi{100*m0/budget:>6.0f}%"
            if next_up:
                p1, m1 = predicted(name, b + 1), measured(name, b + 1)
                if ok == 'yes' and m1 <= budget:  # the solved batch fits but so does the next: how many samples of room were left
                    ok = f"yes; b+1 fits too: {(budget - m0)/2**20:.1f} MiB left = {int((budget - m0) / max(1, p1 - p0))} samples"
                line += f"{m1/2**20:>12.1f}Mi{(p1 - p0)/2**20:>10.3f}Mi"
            print(f"{line}  {ok}  ({time.time() - t0:.0f} s)", flush=True)

def _libc():
    import ctypes
    libc = ctypes.CDLL(None)
    libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return libc

def replay_child(calls:list)->list:
    """Run in a fresh process: replay [bytes, align] (an allocation: posix_memalign when align > 16, else malloc; written) or [-1 - index]
    (a free) through glibc; the resident high-water mark's growth."""
    import ctypes
    libc, ptrs = _libc(), {}
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.malloc_trim(0)  # the free heap the import left would take allocations without growing the resident set
    base = _rss()
    with open('/proc/self/clear_refs', 'w') as f: f.write('5')
    for i, (n, *align) in enumerate(calls):
        if n < 0: libc.free(ptrs.pop(-n - 1)); continue
        if align[0] > 16: p = ctypes.c_void_p(); libc.posix_memalign(ctypes.byref(p), align[0], max(n, 1)); p = p.value
        else: p = libc.malloc(max(n, 1))
        libc.memset(p, 1, max(n, 1)); ptrs[i] = p
    return [_hwm() - base]

def _calls(tr, with_graph=True)->list:
    "The trace's allocations as the planner replays them (`_heap_blocks`), for replay_child and `_model_peak`: [bytes, align] or [-1 - index]."
    from netlite_nb.budget import _heap_blocks
    index, calls = {}, []
    for sign, rec in tr.events:
        if rec.category == 'autograd graph' and not with_graph: continue
        if sign < 0: calls.extend([-j - 1] for j in index.pop(id(rec), ()))
        else:
            blocks = _heap_blocks(rec, tr.graph)
            index[id(rec)] = range(len(calls), len(calls) + len(blocks))
            calls.extend([n, align] for n, align in blocks)
    return calls

def _residency(calls)->list[int]:
    "Calls ([bytes, align] or [-1 - index], as `_calls` writes them) through the planner's model of glibc, with the bench's settings: the bytes resident after each."
    from netlite_nb.budget import GlibcHeap, _glibc_settings
    with _as_measured(): h, keys, out = GlibcHeap(**_glibc_settings()), {}, []
    for i, (n, *align) in enumerate(calls):
        if n < 0: h.free(keys.pop(-n - 1))
        else: keys[i] = h.malloc(n, align[0])
        out.append(h.rss())
    return out

def _model_peak(calls)->int:
    "The same calls through the planner's model of glibc, with the bench's settings: the most they keep resident."
    return max(_residency(calls), default=0)

def _replayed(calls)->int:
    out = subprocess.run([sys.executable, __file__, '--replay-child', '-'], input=json.dumps(calls), env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT)},
                         capture_output=True, text=True, check=True)  # on stdin: too long for a command line
    return json.loads(out.stdout.split('\n')[-2])[0]

def heap_report(name, bs):
    """Where a step's memory beyond its tensors sits: the trace's allocations replayed through glibc and through the planner's model of it
    (tensors alone, then with the autograd graph's objects among them), the graph itself, and what the warm-up's freed heap hides."""
    from netlite_nb.budget import GRAPH_KEY, trace_step
    model, batch = make(name, bs)
    tr = trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu').tracker
    mi = lambda n: f"{n/2**20:.2f} MiB"
    tensors = max(itertools.accumulate(s * r.nbytes for s, r in tr.events if r.category not in ('autograd graph', 'kernel scratch')))
    live = max(itertools.accumulate(s * r.nbytes for s, r in tr.events if r.category != 'kernel scratch'))
    alone, both = _calls(tr, with_graph=False), _calls(tr)
    print(f"{name} at batch {bs}: the trace's tensors peak at {mi(tensors)}; replayed through glibc (the bench's settings) they raise the "
          f"resident set by {mi(_replayed(alone))}, the planner's model of glibc says {mi(_model_peak(alone))}")
    print(f"  with the autograd graph's objects among them: {mi(live)} alive at the peak; glibc {mi(_replayed(both))}, the model {mi(_model_peak(both))}")
    graph = sum(r.nbytes for r in tr.allocs if r.category == 'autograd graph' and r.step == tr.step and r.born <= tr.peak_at and (r.died or 0) > tr.peak_at)
    nodes = sum(r.nbytes for r in trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu', measured={GRAPH_KEY: (1, 0, 0)}, steps=1).tracker.allocs
                if r.category == 'autograd graph')
    holes, trimmed = measured(name, bs, holes=True), measured(name, bs, holes=False)
    print(f"  {nodes} autograd nodes; the plan holds {mi(graph)} of graph at the tensors' peak. Measured with the warm-up's freed heap left in place "
          f"{mi(holes)}, handed back first (malloc_trim, the bench's protocol) {mi(trimmed)}: the holes hid {mi(trimmed - holes)}")

def phases_child(name, bs, out=None)->list:
    """Run in a fresh process (the bench's protocol): the high-water mark of each phase of each of the two measured steps, cleared before each.
    With `out`, under bench/malloc_trace.c (LD_PRELOAD): every C library call of the steps goes to `out`, each phase's first and last to `out`.json."""
    import ctypes, gc
    lib = ctypes.CDLL(None)
    torch.set_num_threads(1)
    model, (x, y) = make(name, bs)
    warm = _optimizer()(model.parameters())
    _steps(model, warm, x[:2], y[:2], 1, _loss(name))
    del warm
    for p in model.parameters(): p.grad = None
    torch.manual_seed(1)
    opt = _optimizer()(model.parameters())
    gc.collect(); _free_blas_buffers(); lib.malloc_trim(0)
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]  # Adagrad's, made by its constructor
    alive = sum(t.untyped_storage().nbytes() for t in [*model.parameters(), *model.buffers(), x, y, *state])
    if out:  # the tracer's buffer is touched before the baseline
        lib.mt_n.restype, lib.mt_open.argtypes = ctypes.c_uint64, [ctypes.c_char_p]
        if lib.mt_open(str(out).encode()) < 0: sys.exit(f"the tracer could not open {out}")
        lib.mt_on()
    calls = (lambda: int(lib.mt_n())) if out else (lambda: 0)
    base, hwm, marks = _rss(), [], []
    def phase(f):
        with open('/proc/self/clear_refs', 'w') as fh: fh.write('5')
        first = calls(); r = f(); marks.append((first, calls()))
        hwm.append(_hwm() - base + alive); return r
    for _ in range(2):
        with _autocast():
            o = phase(lambda: model(x))
            loss = _loss(name)(o, y)
        phase(loss.backward)
        del o, loss
        phase(lambda: (opt.step(), opt.zero_grad(set_to_none=True)))
    if out and lib.mt_close(): sys.exit(f"the tracer could not write all its calls to {out}")
    if out: Path(f"{out}.json").write_text(json.dumps(dict(marks=marks, hwm=hwm, alive=alive)))
    return hwm

def _plan_phases(name, bs):
    "The plan of one case, and per (step, phase) its live bytes and their replay through `GlibcHeap` from the heap the plan replays from."
    from netlite_nb.budget import _glibc_peak, _glibc_resident, _replays, plan_memory, trace_step
    model, batch = make(name, bs)
    tr = trace_step(model, batch, LOSSES.get(name), optimizer='adamw', precision=_precision(), kernels='cpu').tracker
    best, heap = {}, {}
    with _as_measured():
        p = plan_memory(model, batch, LOSSES.get(name), optimizer='adamw', precision=_precision(), device_or_gpu='cpu')
        worst = max(_replays(), key=lambda r: _glibc_peak(tr, *r)[0])  # the replay the plan keeps
        for i, live, resident in _glibc_resident(tr, *worst):
            sign, rec = tr.events[i]
            if sign > 0: ph = (rec.step, 'forward' if rec.phase == 'loss' else rec.phase)
            best[ph], heap[ph] = max(best.get(ph, 0), live), max(heap.get(ph, 0), resident)
    kept = p.breakdown['CPU kernel workspace']
    return p, {k: v + kept for k, v in best.items()}, {k: v + kept for k, v in heap.items()}

_PHASES = [(s, f) for s in range(2) for f in ('forward', 'backward', 'optimizer')]

def phases_report(name, bs):
    """Where in the step a case's measurement and its plan part: each phase's measured high-water mark next to the plan's live bytes
    in that phase and to what they keep resident replayed through the planner's model of glibc (`GlibcHeap`)."""
    p, best, heap = _plan_phases(name, bs)
    got = run_child('--phases-child', [name, bs])
    print(f"{name} at batch {bs}: plan {p.peak/2**20:.2f} MiB. Per phase, measured high-water mark | the plan's live bytes (tensors, graph, kernel workspace) "
          "| the same replayed through the model of glibc:")
    for i, (step, phase) in enumerate(_PHASES):
        print(f"  step {step + 1} {phase:<9} {got[i]/2**20:8.2f} | {best.get((step, phase), 0)/2**20:8.2f} | {heap.get((step, phase), 0)/2**20:8.2f} MiB")

def _tracer()->Path:
    "bench/malloc_trace.c built into a shared library (once per source), for LD_PRELOAD."
    import hashlib, shutil, tempfile
    src = Path(__file__).with_name('malloc_trace.c')
    cc = shutil.which('cc') or shutil.which('gcc')
    if cc is None: sys.exit("--malloc-trace builds bench/malloc_trace.c and needs a C compiler (cc or gcc) on the PATH: none was found.")
    so = Path(tempfile.gettempdir()) / f"netlite_malloc_trace_{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}.so"
    if not so.exists(): subprocess.run([cc, '-O2', '-shared', '-fPIC', '-o', str(so), str(src)], check=True)
    return so

def _replay_calls(calls, marks)->list:
    "The traced C library calls replayed through `GlibcHeap` from an empty heap: each phase's high-water mark of what they keep resident."
    if marks[-1][1] > len(calls): sys.exit(f"the tracer's file holds {len(calls)} calls, but the phases end at call {marks[-1][1]}")
    index, plan, at = {}, [], []  # pointer -> its allocation in `plan`; the traced calls as `_calls` writes them; where each traced call starts there
    for op, n, ptr, old in calls[:marks[-1][1]]:
        at.append(len(plan))
        kind = op & 0xff
        if kind in (2, 4) and (j := index.pop(ptr if kind == 2 else old, None)) is not None: plan.append([-j - 1])  # blocks from before the trace are unknown
        if kind != 2 and ptr: index[ptr] = len(plan); plan.append([n, op >> 8 if kind == 5 else 16])  # a null pointer: nothing was allocated
    after = _residency(plan)
    at.append(len(plan))
    # a phase's mark starts where the heap is before its first call, as clear_refs does, and rises with each of its calls
    return [max([after[at[first] - 1] if at[first] else 0, *after[at[first]:at[last]]]) for first, last in marks]

def malloc_trace_report(name, bs):
    """Every C library call of the two measured steps, traced (bench/malloc_trace.c, LD_PRELOAD) and replayed through `GlibcHeap`:
    next to each phase's measurement and the plan's replay of its own trace, it separates what the model of glibc gets wrong (the real
    calls replayed) from what the tensor trace lacks (the plan's calls)."""
    import shutil, tempfile
    from array import array
    so, out = _tracer(), Path(tempfile.mkdtemp()) / 'calls.bin'
    subprocess.run([sys.executable, __file__, '--phases-child', json.dumps([name, bs, str(out)])], stdout=subprocess.DEVNULL, env={**os.environ, **ENV, 'PYTHONPATH': str(ROOT),
                   'LD_PRELOAD': str(so)}, check=True)
    meta = json.loads(Path(f"{out}.json").read_text())
    words = array('Q', out.read_bytes())
    shutil.rmtree(out.parent)
    calls = [words[i:i + 4] for i in range(0, len(words), 4)]
    real = [r + meta['alive'] for r in _replay_calls(calls, meta['marks'])]
    p, best, heap = _plan_phases(name, bs)
    small = sum(1 for op, n, _, _ in calls if op & 0xff != 2 and n <= 1024)
    print(f"{name} at batch {bs}: plan {p.peak/2**20:.2f} MiB, measured {measured(name, bs)/2**20:.2f} MiB without the tracer; "
          f"from the first step's start to the second's end the process made {len(calls)} C library calls ({small} allocations of 1 KiB or less).")
    print("Per phase (MiB): measured high-water mark | the real calls replayed through GlibcHeap from an empty heap | the plan's own replay:")
    for i, (step, phase) in enumerate(_PHASES):
        print(f"  step {step + 1} {phase:<9} {meta['hwm'][i]/2**20:8.2f} | {real[i]/2**20:8.2f} | {heap.get((step, phase), 0)/2**20:8.2f}")

def histories_report(name, bs, n):
    """How much a few small blocks in the heap before a step move its peak: measured with each of the planner's `_heap_history(seed)`
    left alive before the steps, next to the plan's replay from the same history; the plan keeps the highest of its first ones."""
    from netlite_nb.budget import _HEAP_HISTORIES, _glibc_peak, plan_memory, trace_step
    model, batch = make(name, bs)
    with _as_measured():
        p = plan_memory(model, batch, LOSSES.get(name), optimizer='adamw', device_or_gpu='cpu')
        tr = trace_step(model, batch, LOSSES.get(name), optimizer='adamw', kernels='cpu').tracker
        kept = p.breakdown['CPU kernel workspace']
        rows = [(measured(name, bs, history=s), max(_glibc_peak(tr, s, cut)[0] for cut in (False, True)) + kept) for s in range(n)]
    mi = lambda v: f"{v/2**20:.2f}"
    print(f"{name} at batch {bs}: plan {mi(p.peak)} MiB, the highest of the replays from histories 0-{_HEAP_HISTORIES - 1}")
    print("  history   measured   replayed (MiB)")
    for s, (m, r) in enumerate(rows): print(f"  {s:>7} {mi(m):>10} {mi(r):>10}")
    ms = [m for m, _ in rows]
    print(f"  measured {mi(min(ms))}-{mi(max(ms))}; the plan is {100 * (p.peak - max(ms)) / max(ms):+.1f}% from the highest, {100 * (p.peak - min(ms)) / min(ms):+.1f}% from the lowest")

def step_time(name, bs, n=5)->float:
    "Run in a fresh process: the median seconds of `n` training steps at the full batch, after two that warm up."
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', '1')))
    _fix_late()
    model, (x, y) = make(name, bs)
    opt = _optimizer()(model.parameters())
    _steps(model, opt, x, y, 2, _loss(name))
    ts = []
    for _ in range(n):
        t = time.perf_counter(); _steps(model, opt, x, y, 1, _loss(name)); ts.append(time.perf_counter() - t)
    return sorted(ts)[n // 2]

def _glibc_env(setting:str)->dict:
    "This process's environment with glibc's malloc settings replaced by `GLIBC[setting]`."
    env = {k: v for k, v in os.environ.items() if not k.startswith('MALLOC_') and k != 'GLIBC_TUNABLES'}
    return {**env, **GLIBC[setting], 'OMP_NUM_THREADS': ENV['OMP_NUM_THREADS'], 'PYTHONPATH': str(ROOT)}

def speed_report(name, bs, n):
    """One step's time under each glibc setting of `GLIBC`: `n` rounds, each running every setting once in a fresh process, one after
    another (so load on the machine hits them alike); medians, and the median of each round's ratio to glibc's own settings."""
    secs = {k: [] for k in GLIBC}
    for _ in range(n):
        for k in GLIBC:
            out = subprocess.run([sys.executable, __file__, '--step-time', name, str(bs)], env=_glibc_env(k), capture_output=True, text=True, check=True)
            secs[k].append(float(out.stdout.split()[-1]))
    med = lambda v: sorted(v)[len(v) // 2]
    print(f"{name} at batch {bs}, one training step (median of {n} paired rounds, each the median of 5 steps in a fresh process):")
    for k, v in secs.items():
        ratio = med([a / b for a, b in zip(v, secs['defaults'])])
        print(f"  {k:<{max(map(len, GLIBC))}} {med(v):7.3f} s   x{ratio:.2f} glibc's own   {' '.join(f'{t:.3f}' for t in v)}   {GLIBC[k] or '(no MALLOC_* setting)'}")

def repeat(name, bs, n):
    "Measure one case n times, to see how well a measurement repeats."
    ms = [measured(name, bs) / 2**20 for _ in range(n)]
    print(f"{name} batch {bs}: " + ', '.join(f"{m:.2f}" for m in ms) + f" MiB; spread {max(ms) - min(ms):.2f} MiB")

if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('--measure', nargs='+', help=argparse.SUPPRESS)
    ap.add_argument('--kernels-child', help=argparse.SUPPRESS)
    ap.add_argument('--families', action='store_true', help='accuracy table on the model families the package does not ship')
    ap.add_argument('--unseen', action='store_true', help='accuracy table on UNSEEN: models none of the planner was built or checked on')
    ap.add_argument('--variants', action='store_true', help='accuracy table on VARIANTS: the families with one thing changed each')
    ap.add_argument('--brought', action='store_true', help='accuracy table on BROUGHT: models brought after UNSEEN, each of which found a gap')
    ap.add_argument('--fourth', action='store_true', help='accuracy table on FOURTH: a fourth round of models brought as users bring them')
    ap.add_argument('--fifth', action='store_true', help='accuracy table on FIFTH: a fifth round, brought after the fourth')
    ap.add_argument('--sixth', action='store_true', help='accuracy table on SIXTH: a sixth round, brought after the fifth')
    ap.add_argument('--seventh', action='store_true', help='accuracy table on SEVENTH: a seventh round, brought after the sixth')
    ap.add_argument('--eighth', action='store_true', help="accuracy table on EIGHTH: a smaller round of autograd's shapes")
    ap.add_argument('--tenth', action='store_true', help="accuracy table on TENTH: torchvision's segmentation, video, Swin and EfficientNetV2 models")
    ap.add_argument('--eleventh', action='store_true', help="accuracy table on ELEVENTH: detection ops, VQ-VAE, diffusion, SimCLR, masked seq2seq, packed lengths, capsules")
    ap.add_argument('--ninth', action='store_true', help="accuracy table on NINTH: users' losses and tricks (CTC, a PINN's double backward, a gradient penalty)")
    ap.add_argument('--optimizers', nargs='*', metavar='MODEL:BATCH', help='accuracy table with each optimizer of OPTIMIZERS (default cases: resnet18:16 gru:32 ln_mlp:64 tied_lm:16)')
    ap.add_argument('--calibrate', action='store_true', help='add a column: the plan calibrated on this machine (from an empty cache)')
    ap.add_argument('--budgets', action='store_true')
    ap.add_argument('--real-budgets', action='store_true', help="--budgets with the issue's unscaled 2, 4 and 8 GiB, for the CNN and the transformer")
    ap.add_argument('--models', nargs='+', help='models for --budgets (default: all three; cnn and transformer for --real-budgets)')
    ap.add_argument('--gib', nargs='+', type=float, default=[0.5, 1, 2], help='budgets in GiB for --budgets')
    ap.add_argument('--kernels', action='store_true', help='measure each kernel family\'s scratch (convolutions, LSTM) next to the model')
    ap.add_argument('--gemm', action='store_true', help='measure the CPU kernel workspace the planner models, next to the model')
    ap.add_argument('--heap', nargs=2, metavar=('MODEL', 'BATCH'), help="what glibc's heap and the autograd graph add to one case")
    ap.add_argument('--replay-child', help=argparse.SUPPRESS)
    ap.add_argument('--code-pages', nargs='+', metavar='MODEL:BATCH', help="how much of each case's measured peak is file-backed pages (code) its steps faulted in")
    ap.add_argument('--code-pages-child', help=argparse.SUPPRESS)
    ap.add_argument('--calibration-lines', nargs=2, metavar=('MODEL', 'BATCH'), help='each convolution at the full batch next to the lines calibration draws (now and before)')
    ap.add_argument('--phases', nargs=2, metavar=('MODEL', 'BATCH'), help="each phase's measured high-water mark next to the plan's")
    ap.add_argument('--phases-child', help=argparse.SUPPRESS)
    ap.add_argument('--malloc-trace', nargs=2, metavar=('MODEL', 'BATCH'), help="--phases, with every C library call of the real steps traced and replayed through GlibcHeap (needs cc)")
    ap.add_argument('--histories', nargs=3, metavar=('MODEL', 'BATCH', 'N'), help="measure one case from N heap histories (a few small blocks before the steps), next to the plan's replays")
    ap.add_argument('--repeat', nargs=3, metavar=('MODEL', 'BATCH', 'N'), help='measure one case N times')
    ap.add_argument('--warmup-holes', action='store_true', help="leave the warm-up's freed heap in place (the protocol before the autograd graph was planned)")
    ap.add_argument('--precision', choices=['fp32', 'bf16'], help="the measured steps run under CPU autocast to bf16, and the plans are made for it")
    ap.add_argument('--threads', type=int, default=1, help='threads of the measuring processes (the planner models one)')
    ap.add_argument('--glibc-defaults', action='store_true', help="measure and plan with no MALLOC_* settings: glibc raises its mmap threshold as mapped blocks are freed, "
                    "so tensors below 32 MiB come from the heap and its holes stay resident (the measurement then depends on the process's history)")
    ap.add_argument('--glibc', choices=list(GLIBC), default='bench', help="the glibc settings the measured processes and the plans get (see GLIBC)")
    ap.add_argument('--speed', nargs=3, metavar=('MODEL', 'BATCH', 'N'), help="one step's time under each glibc setting of GLIBC, N paired rounds of fresh processes")
    ap.add_argument('--step-time', nargs=2, help=argparse.SUPPRESS)
    ap.add_argument('--full-warmup', action='store_true', help='accuracy table with the warm-up step at the full batch, so kernels have allocated what they keep before the measured steps')
    a = ap.parse_args()
    import warnings
    from netlite_nb.budget import MovingThresholdWarning
    warnings.simplefilter('ignore', MovingThresholdWarning)  # the bench plans for the processes it starts (`_as_measured`), not for itself
    ENV['OMP_NUM_THREADS'] = str(a.threads)
    if a.precision: ENV['BENCH_PRECISION'] = os.environ['BENCH_PRECISION'] = a.precision  # the measuring children inherit it
    torch.set_num_threads(a.threads)  # plan for the thread count the measured processes run with: it changes PyTorch's kernel choice
    HOLES = a.warmup_holes
    if a.glibc_defaults: a.glibc = 'defaults'  # neither the measured processes nor the plans get a MALLOC_* setting
    if a.glibc != 'bench':  # the measured processes and the plans (`_as_measured`) get these settings and no others
        for k in [k for k in ENV if k.startswith('MALLOC_')]: del ENV[k]
        for k in [k for k in os.environ if k.startswith('MALLOC_') or k == 'GLIBC_TUNABLES']: del os.environ[k]
        ENV.update(GLIBC[a.glibc])
    if a.glibc in ('fixed-late', 'set-late') and not a.measure:  # the plans are made in a process that fixed its thresholds too
        from netlite_nb.budget import fix_glibc_thresholds
        fix_glibc_thresholds()
    if a.measure: print(measure(a.measure[0], int(a.measure[1]), 'full' in a.measure[2:], 'holes' in a.measure[2:],
                                int(next((m[8:] for m in a.measure[2:] if m.startswith('history=')), 0))))
    elif a.kernels_child: print(json.dumps(kernels_child(*json.loads(a.kernels_child))))
    elif a.replay_child: print(json.dumps(replay_child(json.load(sys.stdin))))
    elif a.code_pages_child: print(json.dumps(code_pages_child(*json.loads(a.code_pages_child))))
    elif a.code_pages: code_pages_report([(c.split(':')[0], int(c.split(':')[1])) for c in a.code_pages])
    elif a.heap: heap_report(a.heap[0], int(a.heap[1]))
    elif a.calibration_lines: calibration_lines(a.calibration_lines[0], int(a.calibration_lines[1]))
    elif a.phases: phases_report(a.phases[0], int(a.phases[1]))
    elif a.malloc_trace: malloc_trace_report(a.malloc_trace[0], int(a.malloc_trace[1]))
    elif a.phases_child: print(json.dumps(phases_child(*json.loads(a.phases_child))))
    elif a.kernels: kernels_report()
    elif a.optimizers is not None:
        optimizers_table(list(OPTIMIZERS), [(c.split(':')[0], int(c.split(':')[1])) for c in a.optimizers or ['resnet18:16', 'gru:32', 'ln_mlp:64', 'tied_lm:16']])
    elif (chosen := [m for flag, m in (('eleventh', ELEVENTH), ('tenth', TENTH), ('ninth', NINTH), ('eighth', EIGHTH), ('seventh', SEVENTH), ('sixth', SIXTH), ('fifth', FIFTH), ('fourth', FOURTH), ('brought', BROUGHT), ('unseen', UNSEEN), ('variants', VARIANTS), ('families', FAMILIES)) if getattr(a, flag)]):
        models = {k: v for k, v in chosen[0].items() if not a.models or k in a.models}
        if a.budgets: budgets_table(list(models), a.gib, next_up=False)  # the margin leaves room for b+1
        else: accuracy_table(a.full_warmup, models, a.calibrate)
    elif a.budgets: budgets_table(a.models or list(MODELS), a.gib)
    elif a.real_budgets: budgets_table(a.models or ['cnn', 'transformer'], [2, 4, 8])
    elif a.gemm: gemm_report()
    elif a.histories: histories_report(a.histories[0], int(a.histories[1]), int(a.histories[2]))
    elif a.speed: speed_report(a.speed[0], int(a.speed[1]), int(a.speed[2]))
    elif a.step_time: print(step_time(a.step_time[0], int(a.step_time[1])))
    elif a.repeat: repeat(a.repeat[0], int(a.repeat[1]), int(a.repeat[2]))
    else: accuracy_table(a.full_warmup)
