"""torch.nn.functional.conv2d / conv3d run by convweave, with a budget= on temporaries:

    y = convweave.torch.conv2d(x, w, b, stride=2, padding="same", budget="64MiB")
"""
from ._conv import conv2d, conv3d

__all__ = ["conv2d", "conv3d"]
