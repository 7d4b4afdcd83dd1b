"""convweave for PyTorch and diffusers users: convolutions and VAE decoders and encoders
under a hard cap on temporary memory, with the same results.

    import convweave.diffusers
    convweave.diffusers.enable(vae, budget="256MiB")   # vae.decode(z), vae.encode(x) now run convweave

convweave.torch.conv2d / conv3d mirror torch.nn.functional with a budget= argument;
convweave.conv2d / conv3d take NumPy arrays too. Errors raise convweave.Error."""
import importlib

from ._core import Context, Error, Graph, Plan, format_bytes, parse_bytes, status_string, version
from ._conv import conv2d, conv3d, default_context

__all__ = ["Context", "Error", "Graph", "Plan", "conv2d", "conv3d", "default_context", "format_bytes",
           "parse_bytes", "status_string", "version", "torch", "diffusers"]
__version__ = "0.1.0"


def __getattr__(name):  # convweave.torch / convweave.diffusers import torch only when asked
    if name in ("torch", "diffusers"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'convweave' has no attribute {name!r}")
