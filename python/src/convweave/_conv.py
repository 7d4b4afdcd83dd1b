"""One convolution with torch.nn.functional semantics on torch tensors or NumPy arrays:
the input, weight, bias and output go to the library by pointer and strides.

Each distinct call (input shape, strides, dtype and device; the weight and bias tensors
themselves; the conv parameters and options) compiles a one-node plan once and keeps it
in a small least-recently-used cache (MAX_CONV_PLANS): later calls only bind the input and
the output and run, which keeps the fixed cost per call near the run's own. A cached plan
keeps its weight and bias alive and reads them in place, so in-place changes to them are
seen. Between calls a plan holds no memory unless keep_memory=True."""
import collections
import ctypes
import threading
import warnings

from . import _lib as C
from ._core import ArgumentError, ArgumentTypeError, Context, Error, Graph, as_view, compile_options, conv_params
from ._lib import lib

_contexts = {}
_contexts_lock = threading.Lock()

MAX_CONV_PLANS = 16  # one-node plans kept (least recently used goes first)
_plans = collections.OrderedDict()  # key -> _ConvPlan
_plans_lock = threading.Lock()
_warned_grad = []


def default_context(device="cpu", index=0):
    """The shared context of a device (created on first use, unlimited budget: each call
    passes its own)."""
    key = (device, index)
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            if device not in ("cpu", "cuda"):
                raise Error("CW_ERR_UNSUPPORTED", f"convweave: tensors on {device} (convweave computes on cpu or "
                            "cuda)")
            ctx = _contexts[key] = Context(backend=device, device=index)
        return ctx


def clear_cache():
    """Frees every cached one-node plan (and lets go of the weights they keep alive)."""
    with _plans_lock:
        plans = list(_plans.values())
        _plans.clear()
    for cp in plans:
        cp.close()


def _tuple(v, n, name):
    if isinstance(v, int):
        return (v,) * n
    t = tuple(v)
    if len(t) == 1:
        t = t * n
    if len(t) != n or not all(isinstance(i, int) for i in t):
        raise ArgumentError(f"convweave: {name} must be an int or a tuple of {n} ints, got {v!r}")
    return t


def _new_like(x, shape, channels_last=False, spatial=2):
    """An uninitialised array of x's kind, dtype and device: contiguous, or channels-last."""
    if type(x).__module__.startswith("torch"):
        import torch
        fmt = (torch.channels_last if spatial == 2 else torch.channels_last_3d) if channels_last else \
            torch.contiguous_format
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    import numpy as np
    return np.empty(shape, dtype=x.dtype)


class _ConvPlan:
    """A cached one-node plan: its graph (holding the weight and bias), the output's shape
    and memory format, and what each run passes the library, made once: the input's and
    output's descriptors and the two handle slots (used under the context's lock)."""
    __slots__ = ("ctx", "graph", "plan", "yshape", "channels_last", "xdesc", "ydesc", "xt", "yt", "args")

    def __init__(self, ctx, graph, plan, yshape, channels_last, xdesc, ydesc):
        self.ctx, self.graph, self.plan = ctx, graph, plan
        self.yshape, self.channels_last = yshape, channels_last
        self.xdesc, self.ydesc = xdesc, ydesc
        self.xt, self.yt = ctypes.c_void_p(), ctypes.c_void_p()
        # (x out-param, desc), (y out-param, desc), run's (plan, &x, 1, &y, 1)
        self.args = (ctypes.byref(self.xt), ctypes.byref(xdesc), ctypes.byref(self.yt), ctypes.byref(ydesc))

    def close(self):
        try:
            with self.ctx.lock:  # not while another thread runs it
                self.plan.close()
                self.graph.close()
        except BaseException:
            pass


def _hashable(v):
    return tuple(v) if isinstance(v, list) else v


def _is_channels_last(t, spatial):
    """torch's suggest_memory_format: channels-last in memory but not plainly contiguous."""
    import torch
    fmt = torch.channels_last if spatial == 2 else torch.channels_last_3d
    return t.is_contiguous(memory_format=fmt) and not t.is_contiguous()


def _desc_of(shape, strides, dtype):
    d = C.cw_tensor_desc()
    d.dtype, d.rank = dtype, len(shape)
    for i, (n, st) in enumerate(zip(shape, strides)):
        d.dims[i] = n
        d.strides[i] = st if n > 1 else max(1, st)
    return d


_wrap, _destroy, _run = lib.cw_tensor_wrap, lib.cw_tensor_destroy, lib.cw_plan_run


def _run_cached(cp, xptr, yptr, keep_memory):
    """Binds the input and output pointers to the cached plan and runs it: two
    cw_tensor_wrap calls, cw_plan_run, two cw_tensor_destroy calls, then (unless
    keep_memory) cw_plan_release. False where the plan was closed meanwhile."""
    ctx = cp.ctx
    pxt, pxd, pyt, pyd = cp.args
    with ctx.lock:
        if not cp.plan.handle:  # evicted and closed by another thread since it was looked up
            return False
        st = _wrap(pxt, ctx.handle, pxd, xptr)
        if not st:
            st = _wrap(pyt, ctx.handle, pyd, yptr)
            if not st:
                st = _run(cp.plan.handle, pxt, 1, pyt, 1)
            _destroy(cp.yt)
        _destroy(cp.xt)
        cp.xt.value = cp.yt.value = None
        ctx.check(st)
        if not keep_memory:
            cp.plan.release()
    return True


def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, spatial, budget=None,
         streams=0, patches=None, keep_memory=False):
    """y = conv(input, weight) + bias as torch.nn.functional.conv{spatial}d computes it.
    budget: cap on temporary memory for this call (bytes or '64MiB'; None: unlimited);
    streams: 0 default (1 for a lone conv), 1 in order, N = N-1 heavy + 1 light; patches: None
    auto, int fixed; keep_memory: the cached plan keeps its temporaries' memory between calls
    (faster for large convs; by default it gives them back after each call)."""
    is_torch = type(input).__module__.startswith("torch")
    if is_torch:
        if input.device.type == "meta":  # a meta weight beside a real input: named by the device check
            raise Error("CW_ERR_UNSUPPORTED", f"conv{spatial}d: the input is a meta tensor, which has no data to "
                        "compute on (convweave runs on cpu or cuda tensors)")
        import torch
        if torch.is_grad_enabled() and (input.requires_grad or getattr(weight, "requires_grad", False) or
                                        getattr(bias, "requires_grad", False)):
            if not _warned_grad:
                _warned_grad.append(1)
                warnings.warn("convweave.torch.conv: an input or parameter requires grad with grad mode on: running "
                              "torch.nn.functional's conv instead, so gradients flow (convweave is inference only; "
                              "use torch.no_grad() for convweave). Warned once.", RuntimeWarning, stacklevel=3)
            f = torch.nn.functional.conv2d if spatial == 2 else torch.nn.functional.conv3d
            return f(input, weight, bias, stride, padding, dilation, groups)
        # the fast path: a plan cached for exactly this call
        try:
            key = (spatial, input.shape, input.stride(), input.dtype, input.device, weight.data_ptr(), weight.shape,
                   weight.stride(), weight.dtype, weight.device,
                   None if bias is None else (bias.data_ptr(), bias.shape, bias.stride(), bias.dtype, bias.device),
                   _hashable(stride), _hashable(padding), _hashable(dilation), groups, budget, streams, patches)
            hash(key)
        except (TypeError, AttributeError, RuntimeError):
            key = None
        cp = _plans.get(key) if key is not None else None
        if cp is not None:
            try:
                _plans.move_to_end(key)
            except KeyError:  # evicted meanwhile by another thread: this call still holds it
                pass
            fmt = torch.channels_last if spatial == 2 else torch.channels_last_3d
            y = torch.empty(cp.yshape, dtype=input.dtype, device=input.device,
                            memory_format=fmt if cp.channels_last else torch.contiguous_format)
            if cp.yshape[0] > 0:
                if input.device.type == "cuda":
                    cp.ctx.use_cuda_stream(torch.cuda.current_stream(input.device).cuda_stream)
                if not _run_cached(cp, input.data_ptr(), y.data_ptr(), keep_memory):
                    cp = None  # closed under us: compile again below
            if cp is not None:
                return y
    else:
        key = None
    return _conv_slow(input, weight, bias, stride, padding, dilation, groups, spatial, budget, streams, patches,
                      keep_memory, key)


def _conv_slow(input, weight, bias, stride, padding, dilation, groups, spatial, budget, streams, patches,
               keep_memory, key):
    """The first call of its kind: every check, the output's shape from the library, a
    one-node plan compiled (and cached under key, for torch tensors)."""
    for a in (input, weight) + (() if bias is None else (bias,)):
        if not hasattr(a, "shape") or not hasattr(a, "__getitem__"):
            raise ArgumentTypeError(f"convweave: expected a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    unbatched = len(input.shape) == spatial + 1
    if unbatched:
        input = input[None]
    if len(input.shape) != spatial + 2:
        raise ArgumentError(f"convweave: conv{spatial}d expects a {spatial + 1}-D or {spatial + 2}-D input, "
                            f"got shape {tuple(input.shape)}")
    if len(weight.shape) != spatial + 2:
        raise ArgumentError(f"convweave: conv{spatial}d expects a {spatial + 2}-D weight, got shape "
                            f"{tuple(weight.shape)}")
    stride = _tuple(stride, spatial, "stride")
    dilation = _tuple(dilation, spatial, "dilation")
    if isinstance(groups, bool) or not isinstance(groups, int):
        raise ArgumentError(f"convweave: groups must be an int, got {groups!r}")
    k = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pre = post = (0,) * spatial
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ArgumentError("convweave: padding='same' is not supported for strided convolutions")
            total = [d * (kk - 1) for d, kk in zip(dilation, k)]
            pre = tuple(t // 2 for t in total)  # the odd row goes after, as torch does
            post = tuple(t - p for t, p in zip(total, pre))
        else:
            raise ArgumentError(f"convweave: invalid padding string {padding!r}, should be one of 'valid', 'same'")
    else:
        pre = post = _tuple(padding, spatial, "padding")
    params = conv_params(spatial, stride, dilation, pre, post, groups)

    xv, wv = as_view(input), as_view(weight)
    bv = as_view(bias) if bias is not None else None
    for name, v in (("weight", wv), ("bias", bv)):
        if v is not None and (v.device, v.device_index) != (xv.device, xv.device_index):
            raise Error("CW_ERR_INVALID_ARG", f"conv{spatial}d: input is on {xv.device}:{xv.device_index}, "
                        f"{name} on {v.device}:{v.device_index}")
    ctx = default_context(xv.device, xv.device_index)
    opt = compile_options(budget=budget, streams=streams or 1, patches=patches)  # a bad budget raises here

    # output shape from the library, which validates every parameter with a message
    shape = list(xv.shape)
    shape[0] = max(1, shape[0])  # an empty batch: the shape of one, then none
    xd = type(xv)(None, 0, xv.dtype, shape, [0] * len(shape), "").desc()
    wd, yd = wv.desc(), C.cw_tensor_desc()
    ctx.call(lib.cw_conv_output_desc, ctx.handle, ctypes.byref(yd), ctypes.byref(xd), ctypes.byref(wd),
             ctypes.byref(params))
    yshape = [yd.dims[i] for i in range(yd.rank)]
    yshape[0] = xv.shape[0]
    torch_in = type(xv.obj).__module__.startswith("torch")
    # channels-last in, channels-last out, as torch's conv2d (its cpu conv3d returns contiguous)
    cl = torch_in and spatial == 2 and (_is_channels_last(xv.obj, spatial) or _is_channels_last(wv.obj, spatial))
    y = _new_like(xv.obj, tuple(yshape), cl, spatial)
    if bv is not None and bv.dtype != xv.dtype:  # as cw_conv_forward: one dtype for x, w, b and y
        raise Error("CW_ERR_INVALID_ARG", f"conv{spatial}d: bias is {bv.dtype}, input {xv.dtype} (x, w, b and y "
                    "share one dtype)")
    if wv.dtype != xv.dtype:
        raise Error("CW_ERR_INVALID_ARG", f"conv{spatial}d: weight is {wv.dtype}, input {xv.dtype} (x, w, b and y "
                    "share one dtype)")
    if xv.shape[0] == 0:
        return y[0] if unbatched else y
    g = Graph(ctx)
    try:
        xn = g.input("x", tuple(xv.shape), xv.dtype)
        wn = g.constant("w", wv.obj)
        bn = g.constant("b", bv.obj) if bv is not None else None
        g.output(g.conv(xn, wn, bn, params), "y")
        plan = g.compile(budget=budget, streams=streams or 1, patches=patches)
    except BaseException:
        g.close()
        raise
    yv = as_view(y)
    cp = _ConvPlan(ctx, g, plan, tuple(yshape), cl, xv.desc(), yv.desc())
    if xv.device == "cuda":
        import torch
        ctx.use_cuda_stream(torch.cuda.current_stream(xv.device_index).cuda_stream)
    try:
        _run_cached(cp, xv.ptr, yv.ptr, keep_memory)
    except BaseException:
        cp.close()
        raise
    # cache it where the next call finds it: torch tensors given as such (a copied input,
    # as for a broadcast view, would not be the caller's pointer next time)
    if key is not None and not unbatched and xv.obj is input and wv.obj is weight and \
            (bias is None or bv.obj is bias):
        with _plans_lock:
            old = _plans.pop(key, None)
            _plans[key] = cp
            evicted = [_plans.popitem(last=False)[1] for _ in range(max(0, len(_plans) - MAX_CONV_PLANS))]
        for e in evicted + ([old] if old is not None else []):
            e.close()
    else:
        cp.close()
    return y[0] if unbatched else y


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, budget=None, streams=0,
           patches=None, keep_memory=False):
    """torch.nn.functional.conv2d, run by convweave under `budget` bytes of temporaries.
    input: [N, C, H, W] or [C, H, W]; weight: [K, C/groups, kh, kw]; bias: [K] or None.
    Takes torch tensors (CPU; CUDA with a CUDA build) or NumPy arrays; returns the same kind,
    channels-last where the input (or weight) is. Inference only: where an input or
    parameter requires grad with grad mode on, torch.nn.functional.conv2d runs instead (a
    warning says so once), so gradients are right. Plans are cached per call signature
    (see the module's doc); keep_memory=True keeps a plan's temporaries between calls."""
    return conv(input, weight, bias, stride, padding, dilation, groups, spatial=2, budget=budget,
                streams=streams, patches=patches, keep_memory=keep_memory)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, budget=None, streams=0,
           patches=None, keep_memory=False):
    """torch.nn.functional.conv3d, run by convweave (see conv2d). input: [N, C, D, H, W]."""
    return conv(input, weight, bias, stride, padding, dilation, groups, spatial=3, budget=budget,
                streams=streams, patches=patches, keep_memory=keep_memory)
