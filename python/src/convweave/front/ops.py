"""The op table: one entry per ATen op the lowering knows, each turning the node into
convweave graph nodes (or into a regrouping of its input, for layout ops). An entry raises
Unsupported where its case is not one convweave runs (a replicate pad, a channel split into
heads, a mask); the partitioner then runs that node in PyTorch. Entries check everything
before they add a node, so a refused node leaves nothing behind."""
import math
import operator

import torch

from .. import _lib as C
from .._core import Graph, conv_params
from .layout import Layout, Unsupported
from .values import Bcast, Const, Cw, Pad, Torch, is_tensor

aten = torch.ops.aten
TABLE = {}


def op(*targets):
    def reg(fn):
        for t in targets:
            TABLE[t] = fn
        return fn
    return reg


def _out_shape(node):
    return tuple(node.meta["val"].shape)


def _ints(v, n):
    v = [v] if isinstance(v, int) else list(v)
    return v * n if len(v) == 1 else v


# ---- layout: regroup the node's dims, nothing runs ------------------------------------------
@op(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints, aten.unflatten.int)
def reshape(L, node, x, *args):
    return _regroup(L, x, lambda lay: lay.reshape(_out_shape(node)))


@op(aten.permute.default)
def permute(L, node, x, dims):
    return _regroup(L, x, lambda lay: lay.permute(dims))


@op(aten.transpose.int)
def transpose(L, node, x, a, b):
    def f(lay):
        perm = list(range(len(lay.groups)))
        a2, b2 = a % len(perm), b % len(perm)
        perm[a2], perm[b2] = perm[b2], perm[a2]
        return lay.permute(perm)
    return _regroup(L, x, f)


@op(aten.t.default)
def t(L, node, x):
    return _regroup(L, x, lambda lay: lay.permute(list(range(len(lay.groups)))[::-1]))


@op(aten.expand.default, aten.slice.Tensor, aten.select.int)
def same_elements(L, node, x, *args):
    """expand to the same shape, a slice over a whole dim, a select of a size-1 dim: the
    same elements in the same order. An expand of one channel to C is a Bcast."""
    out = _out_shape(node)
    if node.target == aten.expand.default and isinstance(x, Cw) and _channel_bcast(x, out):
        return Bcast(x, out)
    if not isinstance(x, Cw) or math.prod(_out_shape(node)) != math.prod(x.layout.shape):
        raise Unsupported("expand, slice or select that changes the elements")
    if node.target == aten.slice.Tensor:
        dim, start, end = (list(args) + [0, None, None, 1])[:3]
        step = args[3] if len(args) > 3 else 1
        if step != 1 or (start or 0) != 0:
            raise Unsupported("a strided or offset slice")
    return _regroup(L, x, lambda lay: lay.reshape(_out_shape(node)))


@op(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
    aten.contiguous.default)
def identity(L, node, x, *args, **kwargs):
    if not isinstance(x, Cw):
        raise Unsupported("a copy of a value convweave does not hold")
    return x


@op(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout)
def to_copy(L, node, x, *args, **kwargs):
    val = node.meta["val"]
    if not isinstance(x, Cw) or val.dtype != x.dtype or val.device != L.device:
        raise Unsupported("a cast to another dtype or device")
    return x


@op(aten.dropout.default)
def dropout(L, node, x, p, train):
    if train and p > 0:
        raise Unsupported("dropout in training mode")
    return _regroup(L, x, lambda lay: lay)


def _regroup(L, x, fn):
    """A new view of x's node; a PyTorch tensor becomes an input of the open segment first."""
    if isinstance(x, Torch):
        node, lay = L.act(x)
        x = Cw(L.current(), node, lay, x.dtype)
    if not isinstance(x, Cw):
        raise Unsupported("a layout op on a value convweave does not hold")
    return Cw(x.seg, x.node, fn(x.layout), x.dtype)


@op(aten._assert_tensor_metadata.default)
def assert_metadata(L, node, *args, **kwargs):
    return None


@op(operator.getitem)
def getitem(L, node, tup, i):
    if not isinstance(tup, tuple) or tup[i] is None:
        raise Unsupported("an output convweave does not compute")
    return tup[i]


# ---- element-wise ----------------------------------------------------------------------------
@op(aten.silu.default)
def silu(L, node, x):
    nx, lay = L.act(x)
    return L.new(L.g.silu(nx), lay)


def _num(v):
    """A Python number, or a one-element constant's value; else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, Const) and v.tensor.numel() == 1:
        return float(v.tensor.reshape(()).item())
    return None


def _per_channel(lay, c):
    """The [C] vector a constant broadcast against a value of layout lay varies along, where
    it varies only along the node's channel dim (a [C, 1, 1] bias or scale); else None."""
    if not isinstance(c, Const):
        return None
    t = c.tensor
    shape = (1,) * (len(lay.groups) - t.dim()) + tuple(t.shape)
    if len(shape) != len(lay.groups):
        return None
    dims = [i for i, n in enumerate(shape) if n != 1]
    if len(dims) != 1 or lay.groups[dims[0]] != (1,) or shape[dims[0]] != lay.udims[1]:
        return None
    return t.reshape(-1)


def _has(method):
    if not hasattr(Graph, method):
        raise Unsupported(f"this build of the library has no Graph.{method}")


def _affine(L, x, a, b):
    """a * x + b (nothing for 1, 0)."""
    if a == 1.0 and b == 0.0:
        return x
    _has("unary")
    nx, lay = L.act(x)
    return L.new(L.g.unary(nx, C.CW_UNARY_AFFINE, a, b), lay)


def _held(L, v):
    """v as a Cw: a 4-D or 5-D PyTorch tensor becomes an input of the open segment."""
    if isinstance(v, Torch) and len(v.shape) in (4, 5):
        node, lay = L.act(v)
        return Cw(L.current(), node, lay, v.dtype)
    return v


def _channel_bcast(b, shape):
    """Whether b (identity layout, 4-D or 5-D) is shape with one channel, broadcast over C."""
    bs = tuple(b.shape)
    return len(bs) == len(shape) and len(bs) in (4, 5) and bs[1] == 1 and shape[1] > 1 and \
        bs[:1] + bs[2:] == tuple(shape[:1]) + tuple(shape[2:]) and \
        (not isinstance(b, Cw) or b.layout == Layout.identity(bs))


def _two(L, a, b, what, commutes=False):
    """Two activations of one shape and layout, as nodes of the open segment; b may have one
    channel where a has C (broadcast by binary ops; commutes: either operand)."""
    if commutes and (isinstance(a, Bcast) or _channel_bcast(a, tuple(b.shape))):
        a, b = b, a
    if isinstance(b, Bcast):
        b = b.base
    if tuple(a.shape) != tuple(b.shape):
        if not _channel_bcast(b, tuple(a.shape)) or L.layout_of(a) != Layout.identity(tuple(a.shape)):
            raise Unsupported(f"{what} with broadcasting other than one channel over C")
        _has("binary")
        na, lay = L.act(a)
        nb, _ = L.act(b)
        return na, nb, lay
    lay = L.layout_of(a)
    if lay != L.layout_of(b):
        raise Unsupported(f"{what} of two values laid out differently")
    na, _ = L.act(a)
    nb, _ = L.act(b)
    return na, nb, lay


@op(aten.add.Tensor, aten.sub.Tensor, aten.add.Scalar, aten.sub.Scalar, aten.rsub.Scalar, aten.rsub.Tensor)
def add_sub(L, node, a, b, alpha=1):
    """a + alpha b, a - alpha b, b - alpha a (rsub): activations of one layout, or an
    activation and a scalar (an affine op) or a per-channel constant (a shift)."""
    name = str(node.target)
    alpha = float(alpha)
    if ".rsub." in name:  # b - alpha a
        a, b, sa, sb = b, a, 1.0, -alpha
    else:
        sa, sb = 1.0, alpha if ".add." in name else -alpha
    if (not isinstance(a, Cw) and isinstance(b, Cw)) or (_num(a) is not None and is_tensor(b)):
        a, b, sa, sb = b, a, sb, sa
    if _num(b) is not None or isinstance(b, Const):
        a = _held(L, a)
    if is_tensor(a) and is_tensor(b) and _num(a) is None and _num(b) is None and \
            not isinstance(a, Const) and not isinstance(b, Const):
        if sa == 1.0 and sb == 1.0:
            na, nb, lay = _two(L, a, b, "add")
            return L.new(L.g.add(na, nb), lay)
        if sa == 1.0 and sb == -1.0:
            _has("binary")
            na, nb, lay = _two(L, a, b, "sub")
            return L.new(L.g.binary(na, nb, C.CW_BINARY_SUB), lay)
        raise Unsupported("add or sub with alpha of two activations")
    if not isinstance(a, Cw):
        raise Unsupported("add or sub of values convweave does not hold")
    f = _num(b)
    if f is not None:
        return _affine(L, a, sa, sb * f)
    vec = _per_channel(a.layout, b)
    if vec is None:
        raise Unsupported("add or sub of a constant that is not per channel")
    _has("shift")
    if sa != 1.0:
        a = _affine(L, a, sa, 0.0)
    nx, lay = L.act(a)
    return L.new(L.g.shift(nx, L.const_f32(sb * vec.double() if sb != 1.0 else vec, "shift", b.roots)), lay)


@op(aten.mul.Tensor, aten.div.Tensor, aten.mul.Scalar, aten.div.Scalar)
def mul_div(L, node, x, s):
    div = ".div." in str(node.target)
    if not div and not isinstance(x, Cw) and isinstance(s, Cw):
        x, s = s, x
    if _num(s) is not None or isinstance(s, Const):
        x = _held(L, x)
    if not isinstance(x, Cw):
        raise Unsupported("mul or div of values convweave does not hold")
    f = _num(s)
    if f is not None:
        if (1.0 / f if div else f) == 1.0:
            return x
        vec, roots = torch.full((x.layout.udims[1],), 1.0 / f if div else f, dtype=torch.float32), ()
    elif (vec := _per_channel(x.layout, s)) is not None:
        vec, roots = (1.0 / vec.double() if div else vec), s.roots
    elif is_tensor(s) and not isinstance(s, Const):
        _has("binary")
        na, nb, lay = _two(L, x, s, "mul or div", commutes=not div)
        return L.new(L.g.binary(na, nb, C.CW_BINARY_DIV if div else C.CW_BINARY_MUL), lay)
    else:
        raise Unsupported("mul or div by a constant that is not per channel")
    nx, lay = L.act(x)
    return L.new(L.g.scale(nx, L.const_f32(vec, "scale", roots)), lay)


@op(aten.maximum.default, aten.minimum.default)
def max_min(L, node, a, b):
    _has("binary")
    na, nb, lay = _two(L, a, b, "maximum or minimum")
    return L.new(L.g.binary(na, nb, C.CW_BINARY_MAX if "maximum" in str(node.target) else C.CW_BINARY_MIN), lay)


_UNARY = {aten.relu.default: "RELU", aten.tanh.default: "TANH", aten.sigmoid.default: "SIGMOID"}


@op(*_UNARY)
def unary(L, node, x):
    _has("unary")
    nx, lay = L.act(x)
    return L.new(L.g.unary(nx, getattr(C, "CW_UNARY_" + _UNARY[node.target])), lay)


@op(aten.gelu.default)
def gelu(L, node, x, approximate="none"):
    _has("unary")
    nx, lay = L.act(x)
    return L.new(L.g.unary(nx, C.CW_UNARY_GELU if approximate == "none" else C.CW_UNARY_GELU_TANH), lay)


@op(aten.neg.default)
def neg(L, node, x):
    return _affine(L, x, -1.0, 0.0)


@op(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.hardtanh.default)
def clamp(L, node, x, lo=None, hi=None):
    name = str(node.target)
    if "clamp_max" in name:
        lo, hi = None, lo
    elif "hardtanh" in name:
        lo, hi = (-1.0 if lo is None else lo), (1.0 if hi is None else hi)
    if any(v is not None and _num(v) is None for v in (lo, hi)):
        raise Unsupported("clamp to tensors")
    _has("unary")
    nx, lay = L.act(x)
    return L.new(L.g.unary(nx, C.CW_UNARY_CLAMP, -math.inf if lo is None else _num(lo),
                           math.inf if hi is None else _num(hi)), lay)


# ---- convolution -----------------------------------------------------------------------------
@op(aten.constant_pad_nd.default, aten.pad.default)
def constant_pad(L, node, x, pad, *args):
    """A zero pad read only by convs folds into their padding (the conv entry takes it)."""
    mode, value = (args[0] if args else "constant", args[1] if len(args) > 1 else 0.0) \
        if node.target == aten.pad.default else ("constant", args[0] if args else 0.0)
    if mode != "constant" or (value or 0) != 0 or not L.pad_folds(node) or not is_tensor(x) or isinstance(x, (Const, Pad)):
        raise Unsupported("a pad that is not a conv's zero padding")
    rank = len(x.shape)
    if len(pad) % 2 or len(pad) // 2 > rank - 2 or any(p < 0 for p in pad):
        raise Unsupported("a pad of the batch or channel dims, or a crop")
    pre, post = [0] * (rank - 2), [0] * (rank - 2)
    for i in range(len(pad) // 2):  # pad lists the last dim first
        pre[rank - 3 - i], post[rank - 3 - i] = pad[2 * i], pad[2 * i + 1]
    return Pad(x, tuple(pre), tuple(post), _out_shape(node))


@op(aten.conv2d.default, aten.conv3d.default, aten.conv2d.padding, aten.conv3d.padding, aten.convolution.default)
def conv(L, node, x, w, b=None, stride=1, padding=0, dilation=1, *rest):
    if node.target == aten.convolution.default:
        transposed, _, groups = rest
        if transposed:
            raise Unsupported("a transposed conv")
    else:
        groups = rest[0] if rest else 1
    if not isinstance(w, Const) or (b is not None and not isinstance(b, Const)):
        raise Unsupported("a conv whose weights are computed at run time")
    spatial = w.tensor.dim() - 2
    if spatial not in (2, 3):
        raise Unsupported(f"conv{spatial}d")
    stride, dilation = _ints(stride, spatial), _ints(dilation, spatial)
    k = list(w.tensor.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pre = post = [0] * spatial
        else:  # 'same' (stride 1): the odd row after, as torch does
            tot = [d * (kk - 1) for d, kk in zip(dilation, k)]
            pre, post = [t // 2 for t in tot], [t - t // 2 for t in tot]
    else:
        pre = post = _ints(padding, spatial)
    if isinstance(x, Pad):
        pre = [a + p for a, p in zip(pre, x.pre)]
        post = [a + p for a, p in zip(post, x.post)]
        x = x.base
    if L.layout_of(x) != Layout.identity(tuple(x.shape)):
        raise Unsupported("a conv over a permuted view")
    nx, lay = L.act(x)
    p = conv_params(spatial, stride, dilation, pre, post, groups)
    nw = L.const(w, "weight")
    nb = L.const(b, "bias") if b is not None else None
    y = L.g.conv(nx, nw, nb, p)
    return L.new(y, Layout.identity(L.g.shape(y)))


@op(aten.linear.default)
def linear(L, node, x, w, b=None):
    """nn.Linear over the channels of a [B, tokens, C] view of a [B, C, H, W] node: a 1x1
    conv (the weight viewed [out, in, 1, 1], not copied)."""
    if not isinstance(w, Const) or (b is not None and not isinstance(b, Const)) or not isinstance(x, Cw):
        raise Unsupported("a linear whose input or weights convweave does not hold")
    lay = x.layout
    if lay.groups[-1] != (1,) or len(lay.udims) not in (4, 5):
        raise Unsupported("a linear over other dims than a node's channels")
    out_f = w.tensor.shape[0]
    spatial = len(lay.udims) - 2
    nx, lay = L.act(x)
    wv = Const(w.tensor.view(out_f, -1, *([1] * spatial)), w.roots, w.copied)
    y = L.g.conv(nx, L.const(wv, "weight"), L.const(b, "bias") if b is not None else None,
                 conv_params(spatial, [1] * spatial, [1] * spatial, [0] * spatial, [0] * spatial, 1))
    return L.new(y, lay.with_channels(out_f))


# ---- norms, resampling, attention ------------------------------------------------------------
def _gn_layout_ok(lay):
    g = lay.groups
    return len(g) >= 2 and g[1] == (1,) and g[0] in ((0,), ()) and (g[0] == (0,) or lay.udims[0] == 1)


@op(aten.group_norm.default)
def group_norm(L, node, x, groups, w=None, b=None, eps=1e-5, cudnn_enabled=True):
    return _group_norm(L, x, groups, w, b, eps)


@op(aten.native_group_norm.default)
def native_group_norm(L, node, x, w, b, n, c, hw, groups, eps):
    if any(u.target != operator.getitem or u.args[1] != 0 for u in node.users):
        raise Unsupported("GroupNorm whose mean or rstd is read")
    return (_group_norm(L, x, groups, w, b, eps), None, None)


def _group_norm(L, x, groups, w, b, eps):
    if (w is not None and not isinstance(w, Const)) or (b is not None and not isinstance(b, Const)):
        raise Unsupported("GroupNorm with computed affine vectors")
    lay = L.layout_of(x)
    if not _gn_layout_ok(lay):
        raise Unsupported("GroupNorm over a view whose dim 1 is not the node's channels")
    c = lay.udims[1]
    gamma = w.tensor if w is not None else torch.ones(c)
    beta = b.tensor if b is not None else torch.zeros(c)
    nx, lay = L.act(x)
    ng = L.const_f32(gamma, "gamma", w.roots if w is not None else ())
    nb = L.const_f32(beta, "beta", b.roots if b is not None else ())
    return L.new(L.g.group_norm(nx, ng, nb, int(groups), float(eps)), lay)


@op(aten.upsample_nearest2d.vec, aten.upsample_nearest2d.default, aten._upsample_nearest_exact2d.vec,
    aten._upsample_nearest_exact2d.default, aten.upsample_nearest3d.vec, aten.upsample_nearest3d.default,
    aten._upsample_nearest_exact3d.vec, aten._upsample_nearest_exact3d.default)
def upsample(L, node, x, *args):
    """Nearest (or nearest-exact: the same at an integer factor) by integer factors: x2 in H
    and W is cw_graph_upsample2x, which fuses into the next conv's prep; others
    cw_graph_upsample_nearest."""
    shape, out = tuple(x.shape), _out_shape(node)
    if out == shape and isinstance(x, Cw):  # a factor of 1 everywhere
        return x
    if L.layout_of(x) != Layout.identity(shape) or len(out) != len(shape) or out[:2] != shape[:2] or \
            any(o % i for o, i in zip(out[2:], shape[2:])):
        raise Unsupported(f"nearest upsampling {list(shape)} -> {list(out)} (integer factors only)")
    factors = [o // i for o, i in zip(out[2:], shape[2:])]
    nx, lay = L.act(x)
    if factors[-2:] == [2, 2] and all(f == 1 for f in factors[:-2]):
        return L.new(L.g.upsample2x(nx), Layout.identity(out))
    _has("upsample_nearest")
    return L.new(L.g.upsample_nearest(nx, ([1] * (3 - len(factors)) + factors)), Layout.identity(out))


@op(aten.avg_pool2d.default)
def avg_pool2d(L, node, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor=None):
    if _ints(kernel, 2) != [2, 2] or _ints(stride or kernel, 2) != [2, 2] or _ints(padding, 2) != [0, 0] \
            or divisor is not None or L.layout_of(x) != Layout.identity(tuple(x.shape)) \
            or any(s % 2 for s in x.shape[-2:]):
        raise Unsupported("an average pool other than 2x2, stride 2, over even H and W")
    nx, lay = L.act(x)
    return L.new(L.g.avg_pool2(nx), Layout.identity(_out_shape(node)))


def _tokens_layout(lay):
    """q, k, v of attention: [..., tokens, C] over a node [N, C, spatial...]: the last group is
    the channels, the one before holds every spatial dim, the others are the batch or size 1."""
    g, r = lay.groups, len(lay.udims)
    spatial = [d for d in range(2, r) if lay.udims[d] != 1]  # size-1 dims are in no group
    if len(g) < 3 or g[-1] != (1,) or sorted(g[-2]) != spatial or lay.udims[1] == 1:
        return False
    rest = [d for grp in g[:-2] for d in grp]
    return rest in ([0], []) and (rest == [0] or lay.udims[0] == 1)


@op(aten.scaled_dot_product_attention.default)
def sdpa(L, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if attn_mask is not None or dropout_p or is_causal:
        raise Unsupported("attention with a mask, dropout or causal")
    if not all(isinstance(t, Cw) for t in (q, k, v)):
        raise Unsupported("attention over values convweave does not hold")
    if not all(_tokens_layout(t.layout) for t in (q, k, v)) or k.layout != v.layout or \
            q.layout.udims != k.layout.udims:
        raise Unsupported("attention other than single-head over a node's spatial positions")
    s = float(scale) if scale is not None else 1.0 / math.sqrt(q.layout.udims[1])
    nq, lay = L.act(q)
    nk, _ = L.act(k)
    nv, _ = L.act(v)
    return L.new(L.g.attention(nq, nk, nv, s), lay)


# ---- channel reductions, powers, concatenation (Graph.reduce_channels, .concat) -------------
def _reduce(L, node, x, code):
    """A reduction over the node's channels (dim 1 of an identity-layout 4-D/5-D value)."""
    _has("reduce_channels")
    shape = tuple(x.shape)
    if L.layout_of(x) != Layout.identity(shape) or len(shape) not in (4, 5):
        raise Unsupported("a reduction over a view")
    nx, _ = L.act(x)
    y = L.g.reduce_channels(nx, getattr(C, "CW_REDUCE_" + code))
    return L.new(y, Layout.identity(L.g.shape(y)).reshape(_out_shape(node)))


def _over_channels(x, dims):
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    return [d % len(x.shape) for d in dims] == [1]


@op(aten.linalg_vector_norm.default)
def vector_norm(L, node, x, ord=2, dim=None, keepdim=False, dtype=None):
    if ord != 2 or dtype is not None or not _over_channels(x, dim):
        raise Unsupported("a norm other than L2 over the channels")
    return _reduce(L, node, x, "L2")


@op(aten.mean.dim, aten.sum.dim_IntList)
def mean_sum(L, node, x, dim, keepdim=False, dtype=None):
    if dtype is not None or not _over_channels(x, dim):
        raise Unsupported("a mean or sum other than over the channels")
    return _reduce(L, node, x, "MEAN" if node.target == aten.mean.dim else "SUM")


@op(aten.pow.Tensor_Scalar)
def pow_scalar(L, node, x, e):
    _has("unary")
    if e == 1:
        return x
    code = "SQUARE" if e == 2 else "POW"
    if not hasattr(C, "CW_UNARY_" + code):
        raise Unsupported(f"x ** {e}")
    nx, lay = L.act(x)
    return L.new(L.g.unary(nx, getattr(C, "CW_UNARY_" + code), float(e), 0.0), lay)


@op(aten.rsqrt.default)
def rsqrt(L, node, x):
    _has("unary")
    if not hasattr(C, "CW_UNARY_RSQRT"):
        raise Unsupported("rsqrt")
    nx, lay = L.act(x)
    return L.new(L.g.unary(nx, C.CW_UNARY_RSQRT), lay)


@op(aten.cat.default, aten.concatenate.default)
def cat(L, node, tensors, dim=0):
    """cat along the channels or the outermost spatial dim, pair by pair (a copy)."""
    _has("concat")
    tensors = list(tensors)
    shape = tuple(tensors[0].shape)
    d = dim % len(shape)
    if len(shape) not in (4, 5) or d not in (1, 2) or \
            any(L.layout_of(t) != Layout.identity(tuple(t.shape)) for t in tensors):
        raise Unsupported(f"cat along dim {dim} of views or of rank {len(shape)}")
    nodes = [L.act(t)[0] for t in tensors]
    y = nodes[0]
    for n in nodes[1:]:
        y = L.g.concat(y, n, d)
    return L.new(y, Layout.identity(_out_shape(node)))
