"""What the wrap tests share: run a module through convweave.torch.wrap and PyTorch, and
judge both against the module's own forward in float64."""
import copy

import torch

EPS = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def max_err(y, ref):
    """max|y - ref| in float64; NaN anywhere in y (or a shape mismatch) is an infinite error."""
    y, ref = y.double(), ref.double()
    if y.shape != ref.shape:
        raise AssertionError(f"shape {tuple(y.shape)} != {tuple(ref.shape)}")
    d = (y - ref).abs()
    return float("inf") if torch.isnan(d).any() else d.max().item()


def first(out):
    out = out.sample if hasattr(out, "sample") else out
    return out[0] if isinstance(out, (tuple, list)) else out


def check_module(mod, inputs, dtype=torch.float32, factor=4.0, **wrap_opts):
    """Wraps mod (eval, in dtype) and checks its output against the float64 forward: the error
    at most factor x PyTorch's own error in dtype, or a few ulps of the output's scale where
    PyTorch happens to be exact. Returns (wrapped, cw error, torch error)."""
    import convweave.torch as cwt
    mod = mod.eval()
    m64 = copy.deepcopy(mod).double()
    mod = mod.to(dtype)
    ins = tuple(i.to(dtype) if i.is_floating_point() else i for i in inputs)
    w = cwt.wrap(mod, ins, **wrap_opts)
    with torch.no_grad():
        y, yt = first(w(*ins)), first(mod(*ins))
        y64 = first(m64(*(i.double() if i.is_floating_point() else i for i in ins)))
    e_cw, e_t = max_err(y, y64), max_err(yt, y64)
    scale = max(1.0, y64.abs().max().item())
    tol = max(factor * e_t, 64 * EPS[dtype] * scale)
    assert y.dtype == yt.dtype and y.shape == yt.shape
    assert e_cw <= tol, f"convweave's error {e_cw:.3g} > {tol:.3g} (PyTorch's {e_t:.3g}, scale {scale:.3g})"
    return w, e_cw, e_t
