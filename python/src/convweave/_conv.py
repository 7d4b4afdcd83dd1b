"""One convolution with torch.nn.functional semantics on torch tensors or NumPy arrays:
the input, weight, bias and output go to the library by pointer and strides."""
import ctypes
import threading

from . import _lib as C
from ._core import Context, Error, as_view, compile_options, conv_params
from ._lib import lib

_contexts = {}
_contexts_lock = threading.Lock()


def default_context(device="cpu", index=0):
    """The shared context of a device (created on first use, unlimited budget: each call
    passes its own)."""
    key = (device, index)
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = _contexts[key] = Context(backend={"cpu": "cpu", "cuda": "cuda"}.get(device, device), device=index)
        return ctx


def _tuple(v, n, name):
    if isinstance(v, int):
        return (v,) * n
    t = tuple(v)
    if len(t) == 1:
        t = t * n
    if len(t) != n or not all(isinstance(i, int) for i in t):
        raise ValueError(f"convweave: {name} must be an int or a tuple of {n} ints, got {v!r}")
    return t


def _new_like(x, shape):
    """An uninitialised contiguous array of x's kind, dtype and device."""
    if type(x).__module__.startswith("torch"):
        import torch
        return torch.empty(shape, dtype=x.dtype, device=x.device)
    import numpy as np
    return np.empty(shape, dtype=x.dtype)


def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, spatial, budget=None,
         streams=0, patches=None):
    """y = conv(input, weight) + bias as torch.nn.functional.conv{spatial}d computes it.
    budget: cap on temporary memory for this call (bytes or '64MiB'; None: unlimited);
    streams: 0 default, 1 in order, N = N-1 heavy + 1 light; patches: None auto, int fixed."""
    for a in (input, weight) + (() if bias is None else (bias,)):
        if not hasattr(a, "shape") or not hasattr(a, "__getitem__"):
            raise TypeError(f"convweave: expected a torch.Tensor or numpy.ndarray, got {type(a).__name__}")
    unbatched = len(input.shape) == spatial + 1
    if unbatched:
        input = input[None]
    if len(input.shape) != spatial + 2:
        raise ValueError(f"convweave: conv{spatial}d expects a {spatial + 1}-D or {spatial + 2}-D input, "
                         f"got shape {tuple(input.shape)}")
    if len(weight.shape) != spatial + 2:
        raise ValueError(f"convweave: conv{spatial}d expects a {spatial + 2}-D weight, got shape "
                         f"{tuple(weight.shape)}")
    stride = _tuple(stride, spatial, "stride")
    dilation = _tuple(dilation, spatial, "dilation")
    if not isinstance(groups, int):
        raise ValueError(f"convweave: groups must be an int, got {groups!r}")
    k = tuple(weight.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pre = post = (0,) * spatial
        elif padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError("convweave: padding='same' is not supported for strided convolutions")
            total = [d * (kk - 1) for d, kk in zip(dilation, k)]
            pre = tuple(t // 2 for t in total)  # the odd row goes after, as torch does
            post = tuple(t - p for t, p in zip(total, pre))
        else:
            raise ValueError(f"convweave: invalid padding string {padding!r}, should be one of 'valid', 'same'")
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

    # output shape from the library, which validates every parameter with a message
    shape = list(xv.shape)
    shape[0] = max(1, shape[0])  # an empty batch: the shape of one, then none
    xd = type(xv)(None, 0, xv.dtype, shape, [0] * len(shape), "").desc()
    wd, yd = wv.desc(), C.cw_tensor_desc()
    ctx.call(lib.cw_conv_output_desc, ctx.handle, ctypes.byref(yd), ctypes.byref(xd), ctypes.byref(wd),
             ctypes.byref(params))
    yshape = [yd.dims[i] for i in range(yd.rank)]
    yshape[0] = xv.shape[0]
    y = _new_like(xv.obj, tuple(yshape))
    if xv.shape[0] > 0:
        opt = compile_options(budget=budget, streams=streams, patches=patches)
        if xv.device == "cuda":
            import torch
            ctx.use_cuda_stream(torch.cuda.current_stream(xv.device_index).cuda_stream)
        ts = [ctx.wrap(v) for v in (xv, wv, bv, as_view(y)) if v is not None]
        try:
            x_t, w_t, y_t = ts[0], ts[1], ts[-1]
            b_h = ts[2].handle if bv is not None else None
            ctx.call(lib.cw_conv_forward, ctx.handle, x_t.handle, w_t.handle, b_h, y_t.handle,
                     ctypes.byref(params), ctypes.byref(opt))
        finally:
            for t in ts:
                t.close()
    return y[0] if unbatched else y


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, budget=None, streams=0,
           patches=None):
    """torch.nn.functional.conv2d, run by convweave under `budget` bytes of temporaries.
    input: [N, C, H, W] or [C, H, W]; weight: [K, C/groups, kh, kw]; bias: [K] or None.
    Takes torch tensors (CPU; CUDA with a CUDA build) or NumPy arrays; returns the same kind.
    Inference only: the result carries no autograd history."""
    return conv(input, weight, bias, stride, padding, dilation, groups, spatial=2, budget=budget,
                streams=streams, patches=patches)


def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, budget=None, streams=0,
           patches=None):
    """torch.nn.functional.conv3d, run by convweave (see conv2d). input: [N, C, D, H, W]."""
    return conv(input, weight, bias, stride, padding, dilation, groups, spatial=3, budget=budget,
                streams=streams, patches=patches)
