"""convweave for PyTorch and diffusers users: convolutions and VAE decoders and encoders
under a hard cap on temporary memory, with the same results.

    import convweave.diffusers
    convweave.diffusers.enable(vae, budget="256MiB")   # vae.decode(z), vae.encode(x) now run convweave

convweave.torch.conv2d / conv3d mirror torch.nn.functional with a budget= argument;
convweave.conv2d / conv3d take NumPy arrays too. Errors raise convweave.Error. A context's
memory can come from PyTorch's CUDA allocator (convweave.torch.use_torch_allocator, or
enable(..., torch_allocator=True)) or any Python allocator (Context.set_allocator)."""
import importlib

from ._alloc import HostAllocator
from ._core import (ArgumentError, ArgumentTypeError, Context, Error, Graph, Plan, format_bytes, parse_bytes,
                    parse_size, status_string, version)
from ._conv import clear_cache as clear_conv_cache, conv2d, conv3d, default_context

__all__ = ["ArgumentError", "ArgumentTypeError", "Context", "Error", "Graph", "HostAllocator", "Plan",
           "clear_conv_cache", "conv2d", "conv3d", "default_context", "format_bytes", "parse_bytes", "parse_size",
           "status_string", "version", "torch", "diffusers", "dist"]
__version__ = "0.1.0"


def __getattr__(name):  # convweave.torch / .diffusers / .dist import torch only when asked
    if name in ("torch", "diffusers", "dist"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'convweave' has no attribute {name!r}")
