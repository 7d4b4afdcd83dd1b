"""torch.nn.functional.conv2d / conv3d run by convweave, with a budget= on temporaries:

    y = convweave.torch.conv2d(x, w, b, stride=2, padding="same", budget="64MiB")

and PyTorch's CUDA caching allocator as the source of a context's memory:

    ctx = convweave.Context("cuda", budget="256MiB")
    convweave.torch.use_torch_allocator(ctx)   # now counted in torch.cuda.memory_allocated()
"""
import torch

from ._conv import conv2d, conv3d
from ._core import Error

__all__ = ["conv2d", "conv3d", "use_torch_allocator", "TorchAllocator"]


class TorchAllocator:
    """A cuda context's segments from PyTorch's caching allocator:
    torch.cuda.caching_allocator_alloc(nbytes, device, stream) and caching_allocator_delete.
    The memory is PyTorch's: torch.cuda.memory_allocated() counts it while the context holds
    it, torch.cuda.empty_cache() can give it back to the device once convweave returned it
    (Context.empty_cache), and PyTorch's out-of-memory error fails the convweave call that
    asked (its __cause__). The budget stays convweave's. live: segments out (pointer ->
    bytes)."""

    def __init__(self, device):
        self.device = device
        self.live = {}

    def alloc(self, nbytes, stream):
        # stream: the cudaStream_t the segment is first used on (the context's stream 0,
        # torch's current stream once the context uses it, or one of convweave's own)
        ptr = torch.cuda.caching_allocator_alloc(nbytes, self.device, stream)
        self.live[ptr] = nbytes
        return ptr

    def free(self, ptr, nbytes, stream):
        self.live.pop(ptr, None)
        torch.cuda.caching_allocator_delete(ptr)  # PyTorch remembers the block's stream


def use_torch_allocator(ctx):
    """Makes a cuda context (convweave.Context) take its memory — temporaries under its
    budget and the plans' activation arenas — from PyTorch's caching allocator, so it shows
    in torch.cuda.memory_allocated() and shares PyTorch's cached memory. Call it before
    compiling plans on ctx (Context.set_allocator says why). Returns the TorchAllocator.
    Raises Error CW_ERR_UNSUPPORTED for a cpu context (PyTorch's CPU allocator has no such
    interface; convweave.HostAllocator is the Python one for cpu contexts)."""
    if ctx.backend != "cuda":
        raise Error("CW_ERR_UNSUPPORTED", f"convweave.torch.use_torch_allocator: the context runs on "
                    f"{ctx.backend}; PyTorch's caching allocator is CUDA's (for a cpu context see "
                    "convweave.HostAllocator)")
    return ctx.set_allocator(TorchAllocator(ctx.device))
