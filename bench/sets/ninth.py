"""The ninth round: users' losses and training tricks (CTC, a PINN's double backward, a gradient penalty...) (`--set ninth`)."""
import torch
from torch import nn
import torch.nn.functional as F


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

MODELS = {'crnn_ctc': (CRNN, (1, 32, 128), (16, 48)), 'pinn': (PINN, (2,), (2048,)), 'wgan_gp': (GPCritic, (3, 32, 32), (64,)),
         'beta_vae': (BetaVAE, (3, 32, 32), (64,)), 'lsq_net': (LSQNet, (3, 64, 64), (16,))}
TARGETS = {'crnn_ctc': lambda bs: torch.randint(1, 40, (bs, 12)), 'pinn': lambda bs: torch.randn(bs, 2), 'wgan_gp': lambda bs: torch.randn(bs, 1),
                'beta_vae': lambda bs: torch.randn(bs, 3, 32, 32)}
LOSSES = {'crnn_ctc': ctc_loss}
