"""Models brought after `unseen`, as a user would, each of which found something the planner missed (`--set brought`)."""
import torch
from torch import nn
import torch.nn.functional as F
from .variants import RNN

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
MODELS = {'tconv_gen': (TConvGen, (3, 16, 16), (16, 64)), 'tconv_unet': (TConvDec, (3, 64, 64), (8, 32)), 'convnext': (convnext, (3, 64, 64), (16,)),
           'lstm_bi': (RNN('lstm', bidirectional=True), (64, 64), (32,)), 'gru_cell_loop': (CellLoop, (32, 64), (32, 128)),
           'vit': (vit, (3, 32, 32), (32,)), 'aspp': (ASPP, (3, 64, 64), (8,))}
