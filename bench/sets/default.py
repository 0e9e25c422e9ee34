"""The bench's first set (`python bench/budget_accuracy.py` with no set): an MLP, a depthwise-separable CNN and a transformer encoder, three batch sizes each."""
from torch import nn

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
