"""User allocators from Python (cw_context_set_allocator): where a context's caching
allocators take their segments. An allocator is any object with two methods:

    alloc(nbytes, stream) -> address (int) of nbytes, aligned to ALIGN (256) bytes;
                             0 or None when it has none (the call then raises
                             convweave.Error CW_ERR_OUT_OF_MEMORY naming the allocator)
    free(ptr, nbytes, stream)   gets each segment back once, with alloc's nbytes and stream,
                                after the library finished every use of it

stream is the library stream the segment is first used on, as an int: a cudaStream_t on
cuda, an opaque id on cpu. Both run on the thread that made the convweave call (ctypes takes
the GIL for them; the call itself releases it), never on a worker thread, and must not call
convweave. An exception raised in alloc fails the call like a NULL and becomes the raised
Error's __cause__; one raised in free is reported as a warning (the segment counts as freed).
HostAllocator is one for cpu contexts; convweave.torch.use_torch_allocator takes PyTorch's
on cuda."""
import ctypes
import warnings

from . import _lib as C

ALIGN = C.CW_ALLOCATOR_ALIGN


class _Hook:
    """The ctypes trampolines of one allocator and the exception its alloc last raised.
    The context keeps it alive while any segment it gave may still come back."""

    def __init__(self, allocator):
        if not callable(getattr(allocator, "alloc", None)) or not callable(getattr(allocator, "free", None)):
            raise TypeError(f"convweave: an allocator needs alloc(nbytes, stream) and free(ptr, nbytes, stream) "
                            f"methods, got {type(allocator).__name__}")
        self.allocator = allocator
        self.error = None
        self._alloc = C.cw_alloc_fn(self._on_alloc)  # no reference back to the context: no cycle
        self._free = C.cw_free_fn(self._on_free)
        self.struct = C.cw_allocator(self._alloc, self._free)

    def _on_alloc(self, user, nbytes, stream):
        try:
            ptr = self.allocator.alloc(nbytes, stream or 0)
            return int(ptr) if ptr else None
        except BaseException as e:  # must not unwind through C: the library reports a NULL
            self.error = e
            return None

    def _on_free(self, user, ptr, nbytes, stream):
        try:
            self.allocator.free(ptr, nbytes, stream or 0)
        except BaseException as e:
            warnings.warn(f"convweave: the allocator's free({ptr:#x}, {nbytes}) raised {type(e).__name__}: {e}",
                          RuntimeWarning)

    def take_error(self):
        e, self.error = self.error, None
        return e


class HostAllocator:
    """Host memory for a cpu context's segments, from Python: each segment is a bytearray
    kept (with its address) until the library frees it. Counts what it does: allocs, frees,
    live (segments out), bytes (their size), peak_bytes, streams (the stream ids it was
    given). limit: the most bytes out at once; past it alloc returns 0, so the call that
    needed the memory raises CW_ERR_OUT_OF_MEMORY (try out-of-memory paths with it)."""

    def __init__(self, limit=None):
        self.limit = limit
        self.buffers = {}  # address -> (bytearray, its ctypes view, nbytes)
        self.allocs = self.frees = self.bytes = self.peak_bytes = 0
        self.streams = set()

    @property
    def live(self):
        return len(self.buffers)

    def alloc(self, nbytes, stream):
        if self.limit is not None and self.bytes + nbytes > self.limit:
            return 0
        buf = bytearray(nbytes + ALIGN)
        view = (ctypes.c_char * len(buf)).from_buffer(buf)  # pins buf: it can no longer move
        ptr = (ctypes.addressof(view) + ALIGN - 1) & ~(ALIGN - 1)
        self.buffers[ptr] = (buf, view, nbytes)
        self.allocs += 1
        self.bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        self.streams.add(stream)
        return ptr

    def free(self, ptr, nbytes, stream):
        buf, view, n = self.buffers.pop(ptr)  # KeyError: not ours, or freed twice
        if n != nbytes:
            raise ValueError(f"convweave.HostAllocator: free({ptr:#x}) of {nbytes} bytes, alloc gave {n}")
        self.frees += 1
        self.bytes -= n
