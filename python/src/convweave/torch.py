"""torch.nn.functional.conv2d / conv3d run by convweave, with a budget= on temporaries:

    y = convweave.torch.conv2d(x, w, b, stride=2, padding="same", budget="64MiB")

any conv-heavy nn.Module through torch.export, under a budget:

    dec = convweave.torch.wrap(vae.decoder, (z,), budget="128MiB", memory="auto")
    image = dec(z)

and PyTorch's CUDA caching allocator as the source of a context's memory:

    ctx = convweave.Context("cuda", budget="256MiB")
    convweave.torch.use_torch_allocator(ctx)   # now counted in torch.cuda.memory_allocated()
"""
import torch

from ._conv import conv2d, conv3d
from ._core import Error

__all__ = ["conv2d", "conv3d", "use_torch_allocator", "TorchAllocator", "wrap"]


def wrap(module, example_inputs, *, memory=None, budget=None, streams=2, dtype=None, fallback=True, patches=None,
         fuse=True, keep_memory=False, max_plans=4, threads=0, timing=False, process_group=None, gather=True,
         donate=()):
    """An nn.Module whose forward gives module(*inputs)'s result (same output structure),
    with its convolutions, norms, activations, upsampling and attention run by convweave.

    module is exported with torch.export (strict=False) for example_inputs' shapes and dtypes
    (a tensor or a tuple of forward's positional arguments), its ATen graph lowered into
    convweave graphs and compiled into plans now, so what cannot run raises here. A call with
    new shapes or dtypes exports and compiles once more; the last max_plans signatures stay
    cached (least recently used dropped). Parameters are read in place; float32 copies are
    made only where convweave needs them (GroupNorm's vectors of a half model), counted in
    describe()["copied_bytes"]. Every call checks the parameters are still those compiled
    against (storage, dtype, device; the version of those copied) and recompiles otherwise.

    budget: cap on temporaries (bytes, "256MiB"; None: none); memory: cap on activations +
    temporaries of each plan, or "auto"; streams: 1 in order, N = N-1 heavy + 1 light.
    dtype: floating inputs are cast to it before each call. fallback: nodes convweave does not
    run (describe()["fallbacks"]: op, shape, bytes, reason, source line) run in PyTorch
    between convweave segments; fallback=False raises convweave.Error naming the first one.
    keep_memory: keep plans' activation and temporary memory between calls (faster repeat
    calls); by default nothing is held. Under grad mode with parameters or inputs requiring
    grad, the module's own forward runs instead (warned once), so autograd stays whole:
    call it under torch.no_grad() or torch.inference_mode(). A module in training mode, an
    export failure or a mutating forward raise convweave.Error.

    process_group: a torch.distributed process group (gloo; dist.group.WORLD for every
    process) or a convweave.dist.Comm (its timeout): every plan is one rank's share of the
    plan one process would run, each rank computing a band of rows and exchanging halos
    (convweave.h, "Across processes"). Every rank of the group must make the same calls
    with the same inputs, parameters and options (compiling checks it: convweave.Error on
    every rank naming what differs). Results are bit-identical to one process compiled
    with the same fixed patches (patches=N). gather=True: every rank returns the whole
    result (rank 0 gathers each segment's outputs and broadcasts them). gather=False: each
    rank returns only its band of each output, a slice along one dim (H for an image;
    bands() says which rows); the ranks' results concatenated along it in rank order are
    the whole result, an empty slice where a rank computes none. Outputs that are not made
    by a plan directly (computed in PyTorch) raise convweave.Error under gather=False.
    Where PyTorch runs between segments, each segment a later step reads is gathered and
    broadcast, so every rank computes the PyTorch steps on whole tensors. CPU only: CUDA
    inputs with a process group raise convweave.Error.

    donate: positions of forward's positional arguments (ints, a range or a slice; positions a
    call does not have are ignored) whose tensors the caller gives up, as JAX's
    donate_argnums: a call may write one of the module's outputs into such a tensor and
    return it there, so the call holds one tensor where it would hold two (a streamed video
    VAE's step: the new caches in the old ones' storage). Each donated tensor is paired with
    the first of the module's outputs, in output order, that the convweave segment reading it
    computes with its shape and dtype; the plan writes that output only after every read of
    the tensor (cw_graph_donate). A donated tensor no output takes is given up to no output:
    on cpu its whole pages go back to the system after its last read. A tensor another step
    also reads, that is itself an output, or that shares storage with another input of its
    segment is not used; describe()["donated"] lists what the plans honour (output None: given
    back). Do not read a donated tensor after the call: it holds an output, zeros or its old
    values, as the pairing went. Not with a process group."""
    from .front import Wrapped
    return Wrapped(module, example_inputs, memory=memory, budget=budget, streams=streams, dtype=dtype,
                   fallback=fallback, patches=patches, fuse=fuse, keep_memory=keep_memory, max_plans=max_plans,
                   threads=threads, timing=timing, process_group=process_group, gather=gather, donate=donate)


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
