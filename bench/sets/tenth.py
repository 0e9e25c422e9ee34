"""The tenth round: torchvision's own models beyond classification (segmentation, video, Swin, EfficientNetV2) (`--set tenth`)."""
import torch
from .families import _tv


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

MODELS = {'fcn_resnet50': (_tv_seg('fcn_resnet50', aux_loss=True), (3, 128, 128), (4,)), 'deeplabv3_mbv3': (_tv_seg('deeplabv3_mobilenet_v3_large'), (3, 128, 128), (8,)),
         'lraspp_mbv3': (_tv_seg('lraspp_mobilenet_v3_large'), (3, 128, 128), (8,)), 'r3d_18': (r3d_18, (3, 8, 64, 64), (4,)),
         'swin_t': (_tv('swin_t'), (3, 64, 64), (16,)), 'efficientnet_v2_s': (_tv('efficientnet_v2_s'), (3, 64, 64), (16,))}
TARGETS = {k: (lambda bs: torch.randint(0, 5, (bs, 128, 128))) for k in ('fcn_resnet50', 'deeplabv3_mbv3', 'lraspp_mbv3')}  # a class per pixel
