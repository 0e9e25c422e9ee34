"""Five models none of the planner was built or checked on, added after it was done (`--set unseen`)."""
from torch import nn
from .families import _tv

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
MODELS = {'shufflenet_v2': (_tv('shufflenet_v2_x0_5'), (3, 64, 64), (16,)), 'efficientnet_b0': (_tv('efficientnet_b0'), (3, 64, 64), (16,)),
          'regnet_x_400mf': (_tv('regnet_x_400mf'), (3, 64, 64), (16,)), 'mnasnet': (_tv('mnasnet0_5'), (3, 64, 64), (16,)),
          'encoder': (Encoder, (64, 128), (32,))}
