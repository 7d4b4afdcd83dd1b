"""Python objects over the C handles: Error, Context, Graph, Plan, and zero-copy wrapping
of torch tensors and NumPy arrays (pointer + strides, never a copy)."""
import ctypes
import json
import logging
import threading

from . import _lib as C
from ._alloc import _Hook
from ._lib import lib


class Error(RuntimeError):
    """A failed convweave call. status: the status name ("CW_ERR_BUDGET"); message: the
    library's message (cw_context_get_last_error, or what it logged) naming the argument,
    shape or file at fault."""

    def __init__(self, status, message, min_budget=None):
        self.status = status
        self.message = message
        self.min_budget = min_budget  # CW_ERR_BUDGET from compile: the smallest budget that works
        super().__init__(f"{status}: {message}")

    def __reduce__(self):  # picklable (multiprocessing, pytest-xdist) despite the extra fields
        return (type(self), (self.status, self.message, self.min_budget))


class ArgumentError(Error, ValueError):
    """A bad argument (status CW_ERR_INVALID_ARG), named in the message: a convweave.Error
    that is also a ValueError, as Python's own argument errors are."""

    def __init__(self, message, status="CW_ERR_INVALID_ARG", min_budget=None):
        super().__init__(status, message, min_budget)

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.min_budget))


class ArgumentTypeError(Error, TypeError):
    """An argument of the wrong type (status CW_ERR_INVALID_ARG): a convweave.Error that is
    also a TypeError."""

    def __init__(self, message, status="CW_ERR_INVALID_ARG", min_budget=None):
        super().__init__(status, message, min_budget)

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.min_budget))


def status_name(code):
    return lib.cw_status_name(code).decode()


# ---- sizes -----------------------------------------------------------------------------------
UNITS = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (any case)"


def parse_size(size):
    """cw_parse_size, the library's one size grammar: "256MiB", "256mib", "1.5GiB", "64MB",
    "1e9", "1048576" -> bytes (>= 0); "unlimited" / "none" -> -1. Raises ArgumentError
    naming the string otherwise."""
    out = ctypes.c_int64()
    if not isinstance(size, str) or lib.cw_parse_size(size.encode(errors="replace"), ctypes.byref(out)):
        raise ArgumentError(f"convweave: size {size!r}: expected bytes or a size like '256MiB' (a decimal "
                            f"number, then one of {UNITS}) or 'unlimited'")
    return out.value


def parse_bytes(size, what="budget"):
    """256 * 2**20, "256MiB", "256mib", "1.5GiB", "64MB", "1e9" -> bytes; None, "unlimited" -> -1
    (no cap). The grammar is the library's (cw_parse_size), the same as cw-vae --budget.
    Raises ArgumentError (a convweave.Error and a ValueError) naming `what` and the value."""
    if size is None:
        return -1
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        raise ArgumentError(f"convweave: {what} {size!r} is not a size: expected bytes (int) or a string like "
                            "'256MiB' (None: unlimited)")
    if isinstance(size, int):
        if size <= 0:
            raise ArgumentError(f"convweave: {what} {size} bytes must be > 0 (None: unlimited)")
        if size >= 1 << 63:
            raise ArgumentError(f"convweave: {what} {size} bytes is beyond 2^63")
        return size
    try:
        b = parse_size(size.strip())
    except ArgumentError:
        raise ArgumentError(f"convweave: {what} {size!r}: expected bytes or a size like '256MiB' (a decimal "
                            f"number, then one of {UNITS}) or 'unlimited'") from None
    if b == 0:
        raise ArgumentError(f"convweave: {what} {size!r} must be > 0 (or 'unlimited')")
    return b


def format_bytes(b):
    for unit, n in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return f"{b / n:.1f} {unit}"
    return f"{b} B"


# ---- tensors ---------------------------------------------------------------------------------
_DTYPES = {"float32": C.CW_F32, "float16": C.CW_F16, "bfloat16": C.CW_BF16}


class View:
    """What the library needs of an array: pointer, dtype, dims and strides in elements,
    the device. `obj` keeps the memory alive while the view is used."""
    __slots__ = ("obj", "ptr", "dtype", "shape", "strides", "device", "device_index")

    def __init__(self, obj, ptr, dtype, shape, strides, device, device_index=0):
        self.obj, self.ptr, self.dtype = obj, ptr, dtype
        self.shape, self.strides = tuple(shape), tuple(strides)
        self.device, self.device_index = device, device_index

    def desc(self):
        d = C.cw_tensor_desc()
        if self.dtype not in _DTYPES:
            raise Error("CW_ERR_UNSUPPORTED", f"dtype {self.dtype}: convweave takes float32, float16 "
                        "or bfloat16 (one per graph; half precision where the backend has it)")
        if not 1 <= len(self.shape) <= C.CW_MAX_RANK:
            raise Error("CW_ERR_INVALID_ARG", f"rank {len(self.shape)} outside 1..{C.CW_MAX_RANK}")
        d.dtype, d.rank = _DTYPES[self.dtype], len(self.shape)
        for i, (n, s) in enumerate(zip(self.shape, self.strides)):
            d.dims[i] = n
            # A size-1 dim's stride is arbitrary (torch gives 0 or anything); give it a
            # positive one so a view is never all-zero, which the library reads as contiguous.
            d.strides[i] = s if n > 1 else max(1, s)
        return d


def as_view(x):
    """torch.Tensor, numpy.ndarray or any __dlpack__ object -> View, without copying.
    A broadcast (stride-0) dim is materialised, as the library wants one element per
    index; that is the only case that copies."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if any(s == 0 and n > 1 for n, s in zip(x.shape, x.stride())) or any(s < 0 for s in x.stride()):
            x = x.contiguous()
        if x.requires_grad:
            x = x.detach()
        return View(x, x.data_ptr(), str(x.dtype).replace("torch.", ""), x.shape, x.stride(), x.device.type,
                    x.device.index or 0)
    if mod.startswith("numpy"):
        import numpy as np
        if not isinstance(x, np.ndarray):
            x = np.asarray(x)
        if not x.dtype.isnative or any(s % x.itemsize for s in x.strides) or \
                any(s <= 0 and n > 1 for n, s in zip(x.shape, x.strides)):
            x = np.ascontiguousarray(x)
        return View(x, x.__array_interface__["data"][0], x.dtype.name, x.shape,
                    [s // x.itemsize for s in x.strides], "cpu")
    if hasattr(x, "__dlpack__"):
        try:
            import torch
            return as_view(torch.from_dlpack(x))
        except ImportError:
            import numpy as np
            return as_view(np.from_dlpack(x))
    raise ArgumentTypeError(f"convweave: expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


# ---- context ---------------------------------------------------------------------------------
_log = logging.getLogger("convweave")
_LOG_LEVELS = {C.CW_LOG_ERROR: logging.ERROR, C.CW_LOG_WARN: logging.WARNING, C.CW_LOG_INFO: logging.INFO,
               C.CW_LOG_DEBUG: logging.DEBUG}


class _LogSink:
    """The context's cw_log_fn: every message the library logs goes to the Python logger
    "convweave" (warnings and errors reach stderr as before, through logging's default
    handler) and the latest error is kept, so an Error can carry a reason that the library
    logged rather than set as the context's last error (cw_context_create's). Called on the
    calling thread or a backend worker; it must never raise into C."""

    def __init__(self):
        self.last = None
        self.fn = C.cw_log_fn(self._on_log)  # kept alive as long as the context

    def _on_log(self, user, level, msg):
        try:
            text = msg.decode(errors="replace") if msg else ""
            if level <= C.CW_LOG_ERROR:
                self.last = text
            _log.log(_LOG_LEVELS.get(level, logging.DEBUG), "%s", text)
        except BaseException:  # interpreter shutdown, a broken handler: never unwind through C
            pass

    def take(self):
        m, self.last = self.last, None
        return m


_BACKENDS = {"auto": C.CW_BACKEND_AUTO, "cpu": C.CW_BACKEND_CPU, "cuda": C.CW_BACKEND_CUDA}


def _check_int(name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ArgumentError(f"convweave: {name}={v!r}: expected an int {rng}")
    return v


class Context:
    """One cw_context: a backend, its streams and the budgeted temporary allocator.
    Calls on it are serialised (the library's last-error message is per context).
    backend: "auto", "cpu" or "cuda"; threads: cpu threads in all (0: every core);
    allocator: where its memory comes from (see set_allocator); None: the backend's own.
    The library's log goes to the Python logger "convweave"."""

    def __init__(self, backend="auto", device=0, budget=None, streams=2, threads=0, flags=0, allocator=None):
        self.handle = None
        self._owned = {}
        self._hook = None  # the user allocator's trampolines: alive until the context is destroyed
        if backend not in _BACKENDS:
            raise ArgumentError(f"convweave: backend={backend!r}: expected 'auto', 'cpu' or 'cuda'")
        _check_int("threads", threads, 0)  # the library reads <= 0 as every core: -1 is a mistake here
        cfg = C.cw_context_config()
        cfg.backend = _BACKENDS[backend]
        cfg.device = device
        cfg.temp_budget = parse_bytes(budget)
        cfg.streams = streams
        cfg.threads = threads
        cfg.flags = flags
        self._log = _LogSink()
        cfg.log_fn = self._log.fn
        self.lock = threading.RLock()
        self.budget = cfg.temp_budget
        self.device = device
        self.streams = streams
        self.flags = flags
        self._cuda_stream = None
        self._destroy = lib.cw_context_destroy
        self._release_fn = lib.cw_plan_release
        h = ctypes.c_void_p()
        st = lib.cw_context_create(ctypes.byref(h), ctypes.byref(cfg))
        if st:
            why = self._log.take() or "no reason logged"
            raise Error(status_name(st), f"cw_context_create(backend={backend!r}, device={device}, "
                        f"streams={streams}) failed: {why}")
        self.handle = h
        self.backend = lib.cw_context_get_backend_name(h).decode()
        if allocator is not None:
            try:
                self.set_allocator(allocator)
            except BaseException:
                self.close()
                raise

    def __reduce__(self):
        raise TypeError("convweave.Context cannot be pickled or copied: it owns library handles and device "
                        "memory (make a new one)")

    # The context owns the handles made on it (tensors, graphs, plans) and frees those still
    # alive before itself: Python may finalise a context before the objects that use it
    # (cycles, interpreter exit), and a plan freed after its context would crash.
    _ORDER = {"plan": 0, "graph": 1, "tensor": 2}

    def own(self, kind, handle, destroy):
        self._owned[handle.value] = (self._ORDER[kind], destroy)

    def release(self, handle):
        """Frees one owned handle (once; a no-op after the context closed), under the
        context's lock: a plan or tensor freed by the garbage collector on one thread must
        not race a run on another."""
        owned = getattr(self, "_owned", None)
        if not handle or owned is None:
            return
        with self.lock:
            entry = owned.pop(handle.value, None)
            if entry:
                entry[1](handle)

    def close(self):
        """Frees every handle made on the context, then the context. Idempotent."""
        h, self.handle = getattr(self, "handle", None), None
        if h:
            owned = getattr(self, "_owned", {})
            for ptr, (_, destroy) in sorted(owned.items(), key=lambda kv: kv[1][0]):
                destroy(ctypes.c_void_p(ptr))
            owned.clear()
            self._destroy(h)  # gives every segment back: the allocator's free runs now
            self._hook = None

    def __del__(self):
        _quiet_close(self)

    def last_error(self):
        return lib.cw_context_get_last_error(self.handle).decode(errors="replace")

    def error(self, st, what="", comm=None):
        """Error for a failed status, with the library's message (else the error it logged);
        where the user allocator's alloc raised during the call, that exception is its
        __cause__ and named in it; where comm's (a convweave.dist.Comm) send or receive
        failed, what failed is named too."""
        logged = self._log.take()
        err = Error(status_name(st), self.last_error() or logged or what or "(no message)")
        why = comm.take_error() if comm is not None else None
        if why is not None and why not in err.message:
            err = Error(err.status, f"{err.message} ({why})")
        cause = self._hook.take_error() if self._hook else None
        if cause is not None:
            err = Error(err.status, f"{err.message} (the allocator raised {type(cause).__name__}: {cause})")
            err.__cause__ = cause
        return err

    def check(self, st, what="", comm=None):
        """Raises Error with the library's message for a failed status (and forgets what the
        allocator raised in a call that succeeded all the same)."""
        if st:
            raise self.error(st, what, comm)
        if self._hook:
            self._hook.take_error()
        if self._log.last is not None:
            self._log.last = None

    def call(self, fn, *args):
        with self.lock:
            self.check(fn(*args), fn.__name__)

    def set_allocator(self, allocator):
        """Makes allocator supply the context's memory from now on (cw_context_set_allocator):
        an object with alloc(nbytes, stream) -> address and free(ptr, nbytes, stream) (see
        convweave.HostAllocator; convweave.torch.use_torch_allocator for PyTorch's on cuda);
        None restores the backend's own. Cached segments go back to the previous allocator
        first. Raises Error CW_ERR_INVALID_ARG, changing nothing, while a live plan still
        holds memory (its activation arena): set it before compiling. Returns allocator."""
        hook = None if allocator is None else _Hook(allocator)
        with self.lock:
            self.check(lib.cw_context_set_allocator(self.handle, ctypes.byref(hook.struct) if hook else None))
            self._hook = hook
        return allocator

    def empty_cache(self):
        """Gives every cached segment (memory not in use) back to where it came from, as
        torch.cuda.empty_cache() does; plans take their arena again at their next run."""
        self.call(lib.cw_context_empty_cache, self.handle)

    def synchronize(self):
        self.call(lib.cw_context_synchronize, self.handle)

    def memory_stats(self):
        s = C.cw_memory_stats()
        self.call(lib.cw_context_get_memory_stats, self.handle, ctypes.byref(s))
        return {n: getattr(s, n) for n, _ in s._fields_}

    def reset_peak_stats(self):
        with self.lock:
            lib.cw_context_reset_peak_stats(self.handle)

    def use_cuda_stream(self, stream_ptr):
        """Makes the context's stream 0 the caller's CUDA stream (torch's current one), so
        the library's work is ordered after PyTorch's without a host synchronisation."""
        if stream_ptr != self._cuda_stream:
            self.call(lib.cw_context_set_cuda_stream, self.handle, 0, ctypes.c_void_p(stream_ptr))
            self._cuda_stream = stream_ptr

    def wrap(self, view):
        """A cw_tensor over the view's memory (caller-owned); destroy with Tensor.close."""
        return Tensor(self, view)


class Tensor:
    """A borrowed cw_tensor over a View's memory; the view (and its array) is kept alive."""

    def __init__(self, ctx, view):
        self.ctx, self.view, self.handle = ctx, view, None
        d = view.desc()
        h = ctypes.c_void_p()
        ctx.call(lib.cw_tensor_wrap, ctypes.byref(h), ctx.handle, ctypes.byref(d), ctypes.c_void_p(view.ptr))
        ctx.own("tensor", h, lib.cw_tensor_destroy)
        self.handle = h

    def close(self):
        h, self.handle = getattr(self, "handle", None), None
        if h:
            self.ctx.release(h)

    def __del__(self):
        _quiet_close(self)


# ---- graph and plan --------------------------------------------------------------------------
def conv_params(spatial, stride, dilation, pad_pre, pad_post, groups):
    p = C.cw_conv_params()
    p.spatial = spatial
    for i in range(spatial):
        p.stride[i], p.dilation[i] = stride[i], dilation[i]
        p.pad_pre[i], p.pad_post[i] = pad_pre[i], pad_post[i]
    p.groups = groups
    return p


def memory_auto_pct(memory):
    """memory="auto" or "auto:PCT" -> PCT (default: CW_COMPILE_OPTIONS_INIT's memory_auto_pct,
    10); anything else -> None. The rule is cw_compile_options.memory_auto_pct's."""
    if not isinstance(memory, str) or not memory.startswith("auto"):
        return None
    rest, default = memory[4:], C.cw_compile_options().memory_auto_pct
    try:
        pct = float(rest[1:]) if rest.startswith(":") else (default if rest == "" else None)
    except ValueError:
        pct = None
    if pct is None or not 0 <= pct <= 1000:
        raise ArgumentError(f"convweave: memory {memory!r}: 'auto' or 'auto:PCT' takes a percentage of extra conv "
                         "time in 0..1000")
    return pct


def compile_options(budget=0, streams=0, patches=None, fuse=True, max_patch_rows=0, memory=None, axis=None,
                    comm=None, gather_rank=0):
    """budget: 0 = the context's, None = unlimited, else parse_bytes; patches: None auto, an int fixed,
    'none' the unscheduled reference; memory: None, or a cap on activations + temporaries
    (parse_bytes) under which blocks' inner activations are recomputed where needed ("auto[:PCT]":
    CW_MEMORY_AUTO, the memory ladder's least total whose plan the backend estimates at most
    PCT % slower in its convs than storing everything; needs a temporary budget: without one,
    nothing recomputes); axis: the axis 5-D convs' patches cut,
    None or "auto" (per conv, from the budget), "H" (rows) or "D" (frames); comm: None (one
    process) or a convweave.dist.Comm, whose struct the caller keeps alive as long as the plan;
    gather_rank: with comm, the rank whose outputs hold every row (-1: each rank its band)."""
    pct = memory_auto_pct(memory)
    o = C.cw_compile_options()
    o.temp_budget = 0 if budget == 0 else parse_bytes(budget)
    o.streams = streams
    if patches == "none":
        o.policy = C.CW_PATCHES_NONE
    elif patches is not None:
        o.policy, o.patches = C.CW_PATCHES_FIXED, int(patches)
    o.fuse = int(bool(fuse))
    o.max_patch_rows = max_patch_rows
    if pct is not None:
        o.memory_budget, o.memory_auto_pct = C.CW_MEMORY_AUTO, pct
    else:
        o.memory_budget = 0 if memory is None else parse_bytes(memory)
    axes = {None: C.CW_PATCH_AXIS_AUTO, "auto": C.CW_PATCH_AXIS_AUTO, "H": C.CW_PATCH_AXIS_H, "D": C.CW_PATCH_AXIS_D}
    if axis not in axes:
        raise ArgumentError(f"convweave: axis {axis!r}: None, 'auto', 'H' or 'D'")
    o.patch_axis = axes[axis]
    if comm is not None:
        _check_int("gather_rank", gather_rank, -1, comm.n_ranks - 1)
        o.comm = comm.pointer
        o.gather_rank = gather_rank
    return o


class Graph:
    """A forward pass under construction (cw_graph). Constants borrow their arrays, which
    the graph and every plan compiled from it keep alive."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.keep = []  # Tensors of constants: plans borrow them
        h = ctypes.c_void_p()
        ctx.call(lib.cw_graph_create, ctypes.byref(h), ctx.handle)
        ctx.own("graph", h, lib.cw_graph_destroy)
        self.handle = h

    def close(self):
        h, self.handle = getattr(self, "handle", None), None
        if h:
            self.ctx.release(h)

    def __del__(self):
        _quiet_close(self)

    def __reduce__(self):
        raise TypeError("convweave.Graph cannot be pickled or copied: it owns a library handle (build a new one)")

    def _node(self, fn, *args):
        n = C.c_int32(C.CW_NODE_NONE)
        self.ctx.call(fn, self.handle, ctypes.byref(n), *args)
        return n.value

    def input(self, name, shape, dtype="float32"):
        d = View(None, 0, dtype, shape, [0] * len(shape), "").desc()
        return self._node(lib.cw_graph_input, name.encode(), ctypes.byref(d))

    def constant(self, name, array):
        t = self.ctx.wrap(as_view(array))
        self.keep.append(t)
        return self._node(lib.cw_graph_constant, name.encode(), t.handle)

    def conv(self, x, w, b, params):
        return self._node(lib.cw_graph_conv, x, w, C.CW_NODE_NONE if b is None else b, ctypes.byref(params))

    def group_norm(self, x, gamma, beta, groups, eps):
        return self._node(lib.cw_graph_group_norm, x, gamma, beta, groups, eps)

    def silu(self, x):
        return self._node(lib.cw_graph_silu, x)

    def add(self, a, b):
        return self._node(lib.cw_graph_add, a, b)

    def upsample2x(self, x):
        return self._node(lib.cw_graph_upsample2x, x)

    def scale(self, x, s):
        """x * s[c]: s a float32 constant node of dims [C]."""
        return self._node(lib.cw_graph_scale, x, s)

    def avg_pool2(self, x):
        return self._node(lib.cw_graph_avg_pool2, x)

    def attention(self, q, k, v, scale, block=0, mask=0):
        """Single-head attention over the spatial positions; block > 0: under the block mask
        `mask` (CW_ATTENTION_BLOCK_CAUSAL: token t sees keys s with s // block <= t // block;
        _BLOCK_DIAGONAL: s // block == t // block), cw_graph_attention_blocks."""
        if block:
            return self._node(lib.cw_graph_attention_blocks, q, k, v, scale, block, mask)
        return self._node(lib.cw_graph_attention, q, k, v, scale)

    def output(self, node, name):
        self.ctx.call(lib.cw_graph_output, self.handle, node, name.encode())

    def donate(self, input, output):
        """cw_graph_donate: input `input`'s tensor may be passed as output `output` too (graph
        order); the compiled plan says whether it honours that (Plan.donor). output=-1: the
        input is given up with no output (its memory may go back after its last read)."""
        self.ctx.call(lib.cw_graph_donate, self.handle, int(input), int(output))

    def shape(self, node):
        d = C.cw_tensor_desc()
        self.ctx.call(lib.cw_graph_get_node_desc, self.handle, ctypes.byref(d), node)
        return tuple(d.dims[i] for i in range(d.rank))

    def min_budget(self, **opts):
        o = compile_options(**opts)
        b = C.c_int64()
        self.ctx.call(lib.cw_graph_min_budget, self.handle, ctypes.byref(b), ctypes.byref(o))
        return b.value

    def memory_ladder(self, **opts):
        """cw_graph_memory_ladder: the plans a memory= cap chooses between, least total first,
        as dicts (total_bytes, activations_bytes, temp_bytes, n_recomputed, recompute_gflop,
        conv_cost_ms)."""
        o = compile_options(**opts)
        pts = (C.cw_memory_point * 129)()
        n = ctypes.c_int()
        self.ctx.call(lib.cw_graph_memory_ladder, self.handle, pts, ctypes.byref(n), 129, ctypes.byref(o))
        return [{f: getattr(p, f) for f, _ in C.cw_memory_point._fields_} for p in pts[:min(n.value, 129)]]

    def compile(self, **opts):
        """cw_graph_compile (opts: compile_options')."""
        o = compile_options(**opts)
        h = ctypes.c_void_p()
        comm = opts.get("comm")
        with self.ctx.lock:
            st = lib.cw_graph_compile(self.handle, ctypes.byref(h), ctypes.byref(o))
            if st:
                err = self.ctx.error(st, comm=comm)
                if err.status == "CW_ERR_BUDGET":
                    try:  # a query on this rank alone: no communicator, so no peer waits on it
                        err.min_budget = self.min_budget(**dict(opts, comm=None))
                    except Error:
                        pass
                raise err
            self.ctx.check(st)
        return Plan(self, h, comm)

    def unary(self, x, op, a=0.0, b=0.0):
        """cw_graph_unary: op(x) elementwise, op a CW_UNARY_* code (convweave._lib); a and b
        are AFFINE's a * x + b and CLAMP's bounds, a POW's exponent (ignored by the other ops)."""
        return self._node(lib.cw_graph_unary, x, int(op), float(a), float(b))

    def binary(self, a, b, op):
        """cw_graph_binary: op(a, b) elementwise on two nodes of equal shape (or b of one channel,
        broadcast over a's), op a CW_BINARY_* code (convweave._lib)."""
        return self._node(lib.cw_graph_binary, a, b, int(op))

    def shift(self, x, v):
        """x + v[c]: v a float32 constant node of dims [C]."""
        return self._node(lib.cw_graph_shift, x, v)

    def upsample_nearest(self, x, factors):
        """cw_graph_upsample_nearest: integer factors (fd, fh, fw), each 1..8 (fd 1 for a 4-D x;
        a pair (fh, fw) means (1, fh, fw))."""
        f = tuple(int(v) for v in factors)
        f = (1,) + f if len(f) == 2 else f
        if len(f) != 3:
            raise ValueError(f"convweave: upsample_nearest factors {factors!r}: give (fd, fh, fw) or (fh, fw)")
        return self._node(lib.cw_graph_upsample_nearest, x, (ctypes.c_int64 * 3)(*f))

    def reduce_channels(self, x, op):
        """cw_graph_reduce_channels: op over x's channels keeping the dim ([N, 1, ...]), op a
        CW_REDUCE_* code (convweave._lib): SUM, MEAN, L2, MEAN_SQUARE; summed in double."""
        return self._node(lib.cw_graph_reduce_channels, x, int(op))

    def concat(self, a, b, dim):
        """cw_graph_concat: torch.cat([a, b], dim) for dim 1 (channels) or 2 (T of a 5-D node, H
        of a 4-D one); shapes equal but in dim, values copied exactly."""
        return self._node(lib.cw_graph_concat, a, b, int(dim))

    def slice(self, x, dim, start, length):
        """cw_graph_slice: x.narrow(dim, start, length) for dim 1 (C) to rank - 1 (D, H, W), values
        copied exactly (torch's slice with step 1; select as a dim of extent 1)."""
        return self._node(lib.cw_graph_slice, x, int(dim), int(start), int(length))

    def pad(self, x, pre, post, mode=C.CW_PAD_CONSTANT, value=0.0):
        """cw_graph_pad: x padded by pre[k] before and post[k] after along (D, H, W), each 0..64
        (a pair (H, W) means D 0; a 4-D x takes D 0); mode a CW_PAD_* code (convweave._lib):
        CONSTANT fills value (rounded to the graph's dtype), REPLICATE repeats the edge.
        F.pad(x, (pw, qw, ph, qh, pd, qd)) is pad(x, (pd, ph, pw), (qd, qh, qw))."""
        pads = []
        for name, p in (("pre", pre), ("post", post)):
            p = tuple(int(v) for v in p)
            p = (0,) + p if len(p) == 2 else p
            if len(p) != 3:
                raise ValueError(f"convweave: pad {name} {p!r}: give (D, H, W) or (H, W)")
            pads.append((ctypes.c_int64 * 3)(*p))
        return self._node(lib.cw_graph_pad, x, pads[0], pads[1], int(mode), float(value))

    @staticmethod
    def _factors(name, factors):
        f = tuple(int(v) for v in factors)
        f = (1,) + f if len(f) == 2 else f
        if len(f) != 3:
            raise ValueError(f"convweave: {name} factors {factors!r}: give (fd, fh, fw) or (fh, fw)")
        return (ctypes.c_int64 * 3)(*f)

    def depth_to_space(self, x, factors):
        """cw_graph_depth_to_space: [N, C*fd*fh*fw, D, H, W] -> [N, C, D*fd, H*fh, W*fw], channel
        c*F + (i*fh + j)*fw + k to (d*fd + i, h*fh + j, w*fw + k): LTX-Video's upsampler order, and
        torch.pixel_shuffle for a 4-D x and factors (1, r, r) (a pair (fh, fw) means fd 1)."""
        return self._node(lib.cw_graph_depth_to_space, x, self._factors("depth_to_space", factors))

    def space_to_depth(self, x, factors):
        """cw_graph_space_to_depth: the inverse of depth_to_space (LTX-Video's downsampler's
        reshape-permute; torch.pixel_unshuffle for a 4-D x and factors (1, r, r))."""
        return self._node(lib.cw_graph_space_to_depth, x, self._factors("space_to_depth", factors))


class Plan:
    """A compiled graph (cw_plan): run it many times; describe(), stats(), write_trace()."""

    def __init__(self, graph, handle, comm=None):
        self.ctx, self.graph, self.handle = graph.ctx, graph, handle  # the graph owns the constants
        self.comm = comm  # the plan borrows its cw_comm (convweave.dist.Comm): alive as long as the plan
        self.ctx.own("plan", handle, lib.cw_plan_destroy)

    def close(self):
        h, self.handle = getattr(self, "handle", None), None
        if h:
            self.ctx.release(h)

    def __del__(self):
        _quiet_close(self)

    def __reduce__(self):
        raise TypeError("convweave.Plan cannot be pickled or copied: it owns a library handle and device memory "
                        "(compile a new one)")

    def release(self):
        """cw_plan_release: gives back the memory the plan holds between runs — its
        activation arena and the cached segments of its temporaries' pool — to the
        allocator that gave them (the backend's, or the context's allocator: PyTorch's
        caching allocator with use_torch_allocator). The plan stays valid; its next run
        takes the memory again (one allocation at the run's start). A no-op on a closed
        plan or one that holds nothing."""
        if self.handle:
            self.ctx.call(lib.cw_plan_release, self.handle)

    def run(self, inputs, outputs):
        """inputs, outputs: arrays (torch or NumPy) in graph order, outputs preallocated."""
        ctx = self.ctx
        ins = [ctx.wrap(as_view(x)) for x in inputs]
        outs = [ctx.wrap(as_view(y)) for y in outputs]
        try:
            ia = (ctypes.c_void_p * max(1, len(ins)))(*[t.handle.value for t in ins])
            oa = (ctypes.c_void_p * max(1, len(outs)))(*[t.handle.value for t in outs])
            with ctx.lock:
                ctx.check(lib.cw_plan_run(self._h(), ia, len(ins), oa, len(outs)), "cw_plan_run", self.comm)
        finally:
            for t in ins + outs:
                t.close()

    def band(self, output=0):
        """cw_plan_get_band: (axis, r0, r1), the rows [r0, r1) along dim `axis` of output
        `output` (graph order) that this rank's runs write: the whole extent in one process
        and on the gather rank, else the rank's band (r0 == r1: none)."""
        axis, r0, r1 = ctypes.c_int(), ctypes.c_int64(), ctypes.c_int64()
        self.ctx.call(lib.cw_plan_get_band, self._h(), int(output), ctypes.byref(axis), ctypes.byref(r0),
                      ctypes.byref(r1))
        return axis.value, r0.value, r1.value

    def donor(self, output):
        """cw_plan_get_donor: the input whose tensor output `output` may share in run()
        (a donation the plan honours, Graph.donate), or None."""
        i = ctypes.c_int()
        self.ctx.call(lib.cw_plan_get_donor, self._h(), int(output), ctypes.byref(i))
        return i.value if i.value >= 0 else None

    def describe(self, json_format=False):
        """The plan as text (per conv: patches, rows, halos, algorithm, workspace; the
        predicted peak temp), or as a dict with json_format=True."""
        out = ctypes.c_void_p()
        self.ctx.call(lib.cw_plan_describe, self._h(), ctypes.byref(out), int(bool(json_format)))
        try:
            text = ctypes.string_at(out.value).decode()
        finally:
            lib.cw_free(out)
        return json.loads(text) if json_format else text

    def _h(self):
        if not getattr(self, "handle", None):
            raise Error("CW_ERR_INVALID_ARG", "convweave.Plan: the plan is closed (its part was disabled, or its "
                        "context closed)")
        return self.handle

    def stats(self):
        """Statistics of the last run. Memory entries use torch.cuda.memory_stats() names
        (bytes; 'all' pools), the others cw_plan_stats's."""
        s = C.cw_plan_stats()
        self.ctx.call(lib.cw_plan_get_stats, self._h(), ctypes.byref(s))
        m = self.ctx.memory_stats()
        return {
            # temporaries (workspaces, patch buffers, attention chunks), under the budget
            "allocated_bytes.all.current": m["allocated_bytes_current"],
            "allocated_bytes.all.peak": s.temp_peak,
            "reserved_bytes.all.current": m["reserved_bytes_current"],
            "reserved_bytes.all.peak": m["reserved_bytes_peak"],
            "allocation.all.allocated": m["num_allocs"],
            "allocation.all.freed": m["num_frees"],
            "num_device_alloc": m["num_device_allocs"],
            "num_device_free": m["num_device_frees"],
            "num_sync_all_streams": s.host_syncs,
            "num_ooms": m["budget_failures"],
            # convweave's own
            "budget": m["budget"],
            "temp_peak": s.temp_peak,
            "temp_predicted": s.temp_predicted,
            "activations_peak": s.activations_peak,
            "weights_bytes": s.weights_bytes,
            "total_peak": s.total_peak,
            "cache_hits": m["cache_hits"],
            "cross_stream_waits": m["cross_stream_waits"],
            "wall_ms": s.wall_ms,
            "stage_ms": dict(zip(C.STAGES, s.stage_ms)),
            "stream_busy_ms": list(s.stream_busy_ms[:min(s.n_streams, C.PLAN_STREAM_COUNT)]),
            "n_streams": s.n_streams,
            "n_tasks": s.n_tasks,
            "n_events": s.n_events,
            "n_patches": s.n_patches,
            "conv_gflop": s.conv_gflop,
            "halo_overhead_pct": s.halo_overhead_pct,
            "activations_live_peak": s.activations_live_peak,
            "n_recomputed": s.n_recomputed,
            "recompute_gflop": s.recompute_gflop,
            "conv_cost_ms": s.conv_cost_ms,
        }

    def write_trace(self, path):
        """Writes a Chrome/Perfetto trace of the last run (needs timing=True on enable or
        the context)."""
        import os
        self.ctx.call(lib.cw_plan_write_trace, self._h(), os.fsencode(path))


def _quiet_close(obj):
    """__del__'s close: never raises and never prints "Exception ignored" — at interpreter
    exit modules may already be torn down, and objects made without __init__ (copies,
    torch.compile's tracing) lack their fields."""
    try:
        obj.close()
    except BaseException:
        pass


def version():
    return lib.cw_version_string().decode()


def status_string(code):
    return lib.cw_status_string(code).decode()
