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
from .values import Bcast, Const, Cw, Pad, Shuffle, Split, Torch, is_tensor

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
    try:
        return _regroup(L, x, lambda lay: lay.reshape(_out_shape(node)))
    except Unsupported:
        split = _channel_split(L, node, x) or _shuffle(L, node, x)
        if split is None:
            raise
        return split


def _shuffle(L, node, x):
    """A Shuffle where the reshape splits the channels of a 5-D node into (C, fd, fh, fw)
    before T, H, W (the start of LTX's depth-to-space); else None."""
    shape, out = tuple(x.shape), _out_shape(node)
    if not hasattr(Graph, "depth_to_space") or not isinstance(x, Cw) or len(shape) != 5 or len(out) != 8 or \
            x.layout != Layout.identity(shape) or out[:1] != shape[:1] or out[5:] != shape[2:] or \
            math.prod(out[1:5]) != shape[1] or any(f > 8 for f in out[2:5]):
        return None
    return Shuffle(x, Layout.identity(out), out[2:5])


def _unshuffle(L, v):
    """A Shuffle whose regrouping merges (T, fd), (H, fh), (W, fw): the depth-to-space node
    seen through the same regrouping; else v."""
    u = v.vlay.udims
    groups = []
    for g in v.vlay.groups:
        g, real = list(g), []
        while g:
            d = g.pop(0)
            if d in (0, 1):
                real.append(d)
            elif d in (5, 6, 7) and (u[d - 3] == 1 or (g and g[0] == d - 3)):
                if u[d - 3] != 1:
                    g.pop(0)
                real.append(d - 3)
            elif d in (2, 3, 4) and u[d + 3] == 1:
                real.append(d)
            else:
                return v
        groups.append(tuple(real))
    nx, _ = L.act(v.base)
    y = L.g.depth_to_space(nx, list(v.factors))
    return L.new(y, Layout(L.g.shape(y), groups))


def _channel_split(L, node, x):
    """A Split where the reshape cuts the node's channels (logical dim p) into (k, C / k) and
    only selects along the k read it; else None."""
    shape, out = tuple(x.shape), _out_shape(node)
    if not _holdable(x) or len(out) != len(shape) + 1:
        return None
    lay = L.layout_of(x)
    for p in range(len(shape)):
        if out[:p] == shape[:p] and out[p + 2:] == shape[p + 1:] and out[p] * out[p + 1] == shape[p] and \
                lay.groups[p] == (1,):
            if all(u.target == aten.select.int and u.args[0] is node and u.args[1] % len(out) == p
                   for u in node.users):
                return Split(x, p, out)
    return None


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
    same elements in the same order. An expand of one channel to C is a Bcast. A slice or
    select that drops elements copies them (cw_graph_slice)."""
    out = _out_shape(node)
    if node.target == aten.expand.default and _channel_bcast(x, out, L):
        return Bcast(x, out)
    if isinstance(x, Split):  # a select along the k of a split: a slice of the channels
        c = x.shape[x.pos + 1]
        return _narrow(L, x.base, x.pos, (args[1] % x.shape[x.pos]) * c, c, out)
    if not _holdable(x):
        raise Unsupported("expand, slice or select of a value convweave does not hold")
    if math.prod(out) != math.prod(x.shape):
        if node.target == aten.expand.default:
            raise Unsupported("expand, slice or select that changes the elements")
        dim = args[0] % len(x.shape)
        n = x.shape[dim]
        if node.target == aten.select.int:
            start, length = args[1] % n, 1
        else:
            start, end = (list(args[1:]) + [None, None])[:2]
            step = args[3] if len(args) > 3 else 1
            if step != 1:
                raise Unsupported("a strided slice")
            start, end = _clip(start, n, 0), _clip(end, n, n)
            length = max(end - start, 0)
        return _narrow(L, x, dim, start, length, out)
    if node.target == aten.slice.Tensor:
        step = args[3] if len(args) > 3 else 1
        if step != 1:
            raise Unsupported("a strided slice")
    return _regroup(L, x, lambda lay: lay.reshape(out))


def _clip(i, n, default):
    if i is None:
        return default
    i = i + n if i < 0 else i
    return min(max(i, 0), n)


def _narrow(L, x, dim, start, length, out):
    """x.narrow(dim, start, length) viewed as out: logical dim `dim` must merge node dims
    whose outermost one alone is cut (a frame range of frames folded into the batch, a
    channel range), copied by cw_graph_slice. The batch dim is not cut."""
    g, inner = _narrow_check(L, x, dim, start, length)
    nx, lay = L.act(_held(L, x))
    y = L.g.slice(nx, g[0], start // inner, length // inner)
    return L.new(y, Layout(L.g.shape(y), lay.groups).reshape(out))


def _narrow_check(L, x, dim, start, length):
    """Raises Unsupported unless _narrow can cut x; returns the group cut and its inner size."""
    _has("slice")
    lay = L.layout_of(x)
    g = lay.groups[dim]
    if length <= 0 or not g:
        raise Unsupported("an empty slice")
    inner = math.prod(lay.udims[j] for j in g[1:])
    if g[0] == 0 or start % inner or length % inner:
        raise Unsupported(f"a slice of dim {dim} that cuts the batch or inside a merged dim")
    return g, inner


@op(aten.split.Tensor, aten.split_with_sizes.default, aten.split_copy.Tensor)
def split(L, node, x, sizes, dim=0):
    """split / chunk: the pieces some getitem reads, each a _narrow."""
    if not _holdable(x):
        raise Unsupported("a split of a value convweave does not hold")
    outs = [tuple(v.shape) for v in node.meta["val"]]
    dim = dim % len(x.shape)
    used = {u.args[1] for u in node.users if u.target == operator.getitem}
    if len(used) != len(node.users):
        raise Unsupported("a split whose pieces are read as a list")
    starts = [sum(o[dim] for o in outs[:i]) for i in range(len(outs))]
    for i in used:  # every piece checked before any node is added
        _narrow_check(L, x, dim, starts[i], outs[i][dim])
    return tuple(_narrow(L, x, dim, starts[i], o[dim], o) if i in used else None for i, o in enumerate(outs))


@op(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
    aten.contiguous.default)
def identity(L, node, x, *args, **kwargs):
    if isinstance(x, (Torch, Shuffle)):  # the exported graph is functional: the same tensor serves
        return x
    if not isinstance(x, Cw):
        raise Unsupported("a copy of a value convweave does not hold")
    return x


@op(aten._to_copy.default, aten.to.dtype, aten.to.dtype_layout)
def to_copy(L, node, x, *args, **kwargs):
    val = node.meta["val"]
    if not isinstance(x, Cw) or val.dtype != x.dtype or val.device != L.device:
        raise Unsupported("a cast to another dtype or device")
    return x


@op(aten.type_as.default)
def type_as(L, node, x, other):
    if not isinstance(x, (Cw, Torch)) or x.dtype != other.dtype:
        raise Unsupported("a cast to another dtype")
    return x


@op(aten.dropout.default)
def dropout(L, node, x, p, train):
    if train and p > 0:
        raise Unsupported("dropout in training mode")
    return _regroup(L, x, lambda lay: lay)


def _regroup(L, x, fn):
    """A new view of x's node; a PyTorch tensor becomes an input of the open segment first."""
    if isinstance(x, Shuffle):
        return _unshuffle(L, Shuffle(x.base, fn(x.vlay), x.factors))
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
    if not isinstance(tup, (tuple, list)) or tup[i] is None:
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


def _holdable(v):
    """A value L.act takes as an activation: a node, or a 4-D or 5-D PyTorch tensor."""
    return isinstance(v, Cw) or (isinstance(v, Torch) and len(v.shape) in (4, 5))


def _channel_bcast(b, shape, L):
    """Whether expand(b, shape) spreads one channel of b's node over C: b has one channel
    and shape differs from b's only in one dim where b has 1 (which dim is the node's
    channels of the other operand, _bcast_of checks where the Bcast is read)."""
    if not _holdable(b) or len(b.shape) != len(shape):
        return False
    lb = L.layout_of(b)
    diff = [k for k, (m, n) in enumerate(zip(b.shape, shape)) if m != n]
    return len(lb.udims) in (4, 5) and lb.udims[1] == 1 and len(diff) == 1 and b.shape[diff[0]] == 1


def _bcast_of(L, a, b):
    """Whether b is a with its node's channels reduced to one (b's node [N, 1, ...] under
    a's regrouping), so that torch's broadcast of b against a is cw_graph_binary's."""
    if not all(_holdable(t) for t in (a, b)) or len(a.shape) != len(b.shape):
        return False
    la, lb = L.layout_of(a), L.layout_of(b)
    diff = [k for k, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n]
    return len(la.udims) in (4, 5) and len(diff) == 1 and b.shape[diff[0]] == 1 and \
        la.groups[diff[0]] == (1,) and lb.udims == la.udims[:1] + (1,) + la.udims[2:] and \
        lb == Layout(lb.udims, la.groups)


def _two(L, a, b, what, commutes=False):
    """Two activations of one shape and layout, as nodes of the open segment; b may have one
    channel where a has C (broadcast by binary ops; commutes: either operand)."""
    if commutes and (isinstance(a, Bcast) or math.prod(a.shape) < math.prod(b.shape)):
        a, b = b, a
    if isinstance(b, Bcast):
        b = b.base
    if tuple(a.shape) != tuple(b.shape):
        if not _bcast_of(L, a, b):
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
            na, nb, lay = _two(L, a, b, "add", commutes=True)
            if L.g.shape(na) == L.g.shape(nb):
                return L.new(L.g.add(na, nb), lay)
            # one channel broadcast: a - (-b), the same sum (but -0 for -0 + 0)
            return L.new(L.g.binary(na, L.g.unary(nb, C.CW_UNARY_AFFINE, -1.0, 0.0), C.CW_BINARY_SUB), lay)
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
    folds = mode == "constant" and (value or 0) == 0 and L.pad_folds(node) and is_tensor(x) and \
        not isinstance(x, (Const, Pad))
    if not folds and (mode not in ("constant", "replicate") or not _holdable(x) or
                      L.layout_of(x) != Layout.identity(tuple(x.shape))):
        raise Unsupported("a pad that is not a conv's zero padding")
    rank = len(x.shape)
    if len(pad) % 2 or len(pad) // 2 > rank - 2 or any(p < 0 for p in pad):
        raise Unsupported("a pad of the batch or channel dims, or a crop")
    pre, post = [0] * (rank - 2), [0] * (rank - 2)
    for i in range(len(pad) // 2):  # pad lists the last dim first
        pre[rank - 3 - i], post[rank - 3 - i] = pad[2 * i], pad[2 * i + 1]
    if not any(pre) and not any(post) and isinstance(x, Cw):  # pads nothing (a kernel-1 causal conv's): x itself
        return x
    if folds:
        return Pad(x, tuple(pre), tuple(post), _out_shape(node))
    # a replicate pad (HunyuanVideo's causal conv), or a constant one read by other ops
    _has("pad")
    nx, _ = L.act(x)
    pre, post = [0] * (5 - rank) + pre, [0] * (5 - rank) + post
    code = C.CW_PAD_REPLICATE if mode == "replicate" else C.CW_PAD_CONSTANT
    return L.new(L.g.pad(nx, pre, post, code, float(value or 0.0)), Layout.identity(_out_shape(node)))


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
    lay = L.layout_of(x)
    if lay == Layout.identity(tuple(x.shape)):
        out_groups = None
    elif spatial == 2 and _frames_folded(lay):
        # a conv2d per frame of frames folded into the batch ([B*T, C, H, W] over the node
        # [B, C, T, H, W]) is a conv3d with kernel (1, kh, kw); the weight is viewed, not copied
        w = Const(w.tensor.unsqueeze(2), w.roots, w.copied)
        spatial, stride, dilation, pre, post = 3, [1] + stride, [1] + dilation, [0] + pre, [0] + post
        out_groups = lay.groups
    else:
        raise Unsupported("a conv over a permuted view")
    nx, _ = L.act(x)
    p = conv_params(spatial, stride, dilation, pre, post, groups)
    nw = L.const(w, "weight")
    nb = L.const(b, "bias") if b is not None else None
    y = L.g.conv(nx, nw, nb, p)
    shape = L.g.shape(y)
    return L.new(y, Layout.identity(shape) if out_groups is None else Layout(shape, out_groups))


def _frames_folded(lay):
    """Whether a 4-D value is the 5-D node [B, C, T, H, W] with B and T merged (in either
    order) into its batch dim, C, H and W in place: a 2-D op per frame."""
    if len(lay.udims) != 5 or len(lay.groups) != 4:
        return False
    for k, j in ((1, 1), (2, 3), (3, 4)):
        if lay.groups[k] != ((j,) if lay.udims[j] != 1 else ()):
            return False
    return sorted(lay.groups[0]) == [d for d in (0, 2) if lay.udims[d] != 1]


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
    if not _holdable(x) or len(out) != len(shape) or out[:2] != shape[:2] or \
            any(o % i for o, i in zip(out[2:], shape[2:])):
        raise Unsupported(f"nearest upsampling {list(shape)} -> {list(out)} (integer factors only)")
    # each upsampled logical dim is one node dim (D, H or W): frames folded into the batch
    # upsample as the 5-D node with a factor of 1 in T
    lay = L.layout_of(x)
    groups = lay.groups
    full = tuple((i,) for i in range(len(shape)))
    if len(lay.udims) == len(shape) and lay == Layout(lay.udims, full):
        groups = full  # the node itself: a dim of extent 1 is still its own
    factors = [1] * (len(lay.udims) - 2)
    for k in range(2, len(shape)):
        f = out[k] // shape[k]
        if f != 1:
            if len(groups[k]) != 1 or groups[k][0] < 2:
                raise Unsupported(f"nearest upsampling of a dim that is not one of the node's D, H, W")
            factors[groups[k][0] - 2] = f
    if groups[1] != (1,):
        raise Unsupported("nearest upsampling of a view whose dim 1 is not the node's channels")
    nx, _ = L.act(x)
    udims = lay.udims[:2] + tuple(u * f for u, f in zip(lay.udims[2:], factors))
    if factors[-2:] == [2, 2] and all(f == 1 for f in factors[:-2]):
        return L.new(L.g.upsample2x(nx), Layout(udims, groups))
    _has("upsample_nearest")
    return L.new(L.g.upsample_nearest(nx, ([1] * (3 - len(factors)) + factors)), Layout(udims, groups))


@op(aten.repeat.default)
def repeat(L, node, x, reps):
    """repeat along D, H or W where x has extent 1 there: nearest upsampling by the count
    (LTX's causal padding repeats the first frame)."""
    shape = tuple(x.shape)
    if 0 in reps and is_tensor(x):  # nothing (LTX's non-causal pad by a kernel of 1 frame)
        val = node.meta["val"]
        return Const(torch.empty(val.shape, dtype=val.dtype, device=L.device))
    if not _holdable(x) or len(reps) != len(shape) or \
            any(r != 1 and (k < 2 or shape[k] != 1) for k, r in enumerate(reps)) or \
            L.layout_of(x) != Layout.identity(shape):
        raise Unsupported("a repeat other than of a D, H or W of extent 1")
    if all(r == 1 for r in reps):
        return _regroup(L, x, lambda lay: lay)
    factors = [1] * (3 - (len(shape) - 2)) + list(reps[2:])
    if any(f > 8 for f in factors):
        raise Unsupported("a repeat more than 8 times")
    _has("upsample_nearest")
    nx, _ = L.act(x)
    return L.new(L.g.upsample_nearest(nx, factors), Layout.identity(_out_shape(node)))


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


def _frame_tokens_layout(lay):
    """q, k, v of attention per frame: [B*T, 1, H*W, C] over a node [B, C, T, H, W] with T > 1
    folded into the batch (any order with B), H and W the tokens in order, C last."""
    g, u = lay.groups, lay.udims
    if len(u) != 5 or u[2] == 1 or u[1] == 1 or len(g) < 3 or g[-1] != (1,) or \
            g[-2] != tuple(d for d in (3, 4) if u[d] != 1):
        return False
    rest = [d for grp in g[:-2] for d in grp]
    return sorted(rest) == [d for d in (0, 2) if u[d] != 1]


@op(aten.scaled_dot_product_attention.default)
def sdpa(L, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p or (attn_mask is not None and is_causal):
        raise Unsupported("attention with dropout, or with a mask and causal")
    if not all(isinstance(t, Cw) for t in (q, k, v)):
        raise Unsupported("attention over values convweave does not hold")
    if k.layout != v.layout or q.layout.udims != k.layout.udims:
        raise Unsupported("attention other than single-head over a node's spatial positions")
    block, mask = 0, 0
    if all(_frame_tokens_layout(t.layout) for t in (q, k, v)) and q.layout.groups[:-1] == k.layout.groups[:-1]:
        # frames folded into the batch (Wan's [B*T, 1, HW, C]): attention within each frame
        if attn_mask is not None or is_causal or not hasattr(C, "CW_ATTENTION_BLOCK_DIAGONAL"):
            raise Unsupported("per-frame attention with a mask, or without the library's masks")
        block, mask = q.layout.udims[3] * q.layout.udims[4], C.CW_ATTENTION_BLOCK_DIAGONAL
    elif not all(_tokens_layout(t.layout) for t in (q, k, v)):
        raise Unsupported("attention other than single-head over a node's spatial positions")
    elif attn_mask is not None or is_causal:
        # a mask the library computes: the tokens must be the node's positions in order
        spatial = tuple(d for d in range(2, len(q.layout.udims)) if q.layout.udims[d] != 1)
        if q.layout.groups[-2] != spatial or k.layout.groups[-2] != spatial:
            raise Unsupported("masked attention over tokens in another order than the node's")
        if not hasattr(C, "CW_ATTENTION_BLOCK_CAUSAL"):
            raise Unsupported("this build of the library has no masked attention")
        n = q.shape[-2]
        block, mask = (1, C.CW_ATTENTION_BLOCK_CAUSAL) if is_causal else _block_mask(attn_mask, n)
    s = float(scale) if scale is not None else 1.0 / math.sqrt(q.layout.udims[1])
    nq, lay = L.act(q)
    nk, _ = L.act(k)
    nv, _ = L.act(v)
    if block:
        return L.new(L.g.attention(nq, nk, nv, s, block=block, mask=mask), lay)
    return L.new(L.g.attention(nq, nk, nv, s), lay)


def _block_mask(m, n):
    """(block, cw_attention_mask) of a constant mask over n tokens that equals a block-causal
    or block-diagonal one (HunyuanVideo's frames seeing the frames before them, built from
    meshgrid/le/where and folded at compile time): a bool mask (True: seen) or a float one
    of 0 (seen) and -inf."""
    if not isinstance(m, Const) or tuple(m.shape[-2:]) != (n, n):
        raise Unsupported("attention with a mask computed at run time")
    t = m.tensor.reshape(-1, n, n)
    if t.dtype == torch.bool:
        seen = t
    else:
        seen = t == 0
        if not bool((seen | (t == -math.inf)).all()):
            raise Unsupported("attention with a mask of other values than 0 and -inf")
    if not bool((seen == seen[:1]).all()):
        raise Unsupported("attention with a mask that differs between heads or samples")
    seen = seen[0].cpu()
    b = int(seen[0].sum())
    i = torch.arange(n) // max(b, 1)
    for code, want in ((C.CW_ATTENTION_BLOCK_CAUSAL, i[None, :] <= i[:, None]),
                       (C.CW_ATTENTION_BLOCK_DIAGONAL, i[None, :] == i[:, None])):
        if b >= 1 and bool((seen == want).all()):
            return b, code
    raise Unsupported("attention with a mask other than block-causal or block-diagonal")


# ---- channel reductions, powers, concatenation (Graph.reduce_channels, .concat) -------------
def _reduce(L, node, x, dims, code):
    """A reduction over the node's channels: the logical dim reduced is the node's dim 1
    alone (dim 1 of a [N, C, ...] value, the last of a channels-last permute)."""
    _has("reduce_channels")
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if not _holdable(x) or len(dims) != 1 or L.layout_of(x).groups[dims[0] % len(x.shape)] != (1,):
        raise Unsupported("a reduction other than over the node's channels")
    nx, lay = L.act(x)
    y = L.g.reduce_channels(nx, getattr(C, "CW_REDUCE_" + code))
    return L.new(y, Layout(L.g.shape(y), lay.groups).reshape(_out_shape(node)))


@op(aten.linalg_vector_norm.default)
def vector_norm(L, node, x, ord=2, dim=None, keepdim=False, dtype=None):
    if ord != 2 or dtype is not None:
        raise Unsupported("a norm other than L2 over the channels")
    return _reduce(L, node, x, dim, "L2")


@op(aten.mean.dim, aten.sum.dim_IntList)
def mean_sum(L, node, x, dim, keepdim=False, dtype=None):
    if dtype is not None:
        raise Unsupported("a mean or sum with a dtype")
    return _reduce(L, node, x, dim, "MEAN" if node.target == aten.mean.dim else "SUM")


@op(aten.layer_norm.default)
def layer_norm(L, node, x, shape, w=None, b=None, eps=1e-5, cudnn_enable=True):
    """LayerNorm over the node's channels (the last dim of a channels-last view, LTX):
    mean, centred values, their mean square (each a channel reduction in double), rsqrt, a
    one-channel broadcast product, then the per-channel weight and bias."""
    for name in ("reduce_channels", "binary", "unary"):
        _has(name)
    if len(shape) != 1 or not _holdable(x) or L.layout_of(x).groups[-1] != (1,) or \
            any(v is not None and _per_channel(L.layout_of(x), v) is None for v in (w, b)):
        raise Unsupported("a LayerNorm other than over the node's channels")
    nx, lay = L.act(x)
    g = L.g
    d = g.binary(nx, g.reduce_channels(nx, C.CW_REDUCE_MEAN), C.CW_BINARY_SUB)
    r = g.unary(g.unary(g.reduce_channels(d, C.CW_REDUCE_MEAN_SQUARE), C.CW_UNARY_AFFINE, 1.0, float(eps)),
                C.CW_UNARY_RSQRT)
    y = g.binary(d, r, C.CW_BINARY_MUL)
    if w is not None:
        y = g.scale(y, L.const_f32(_per_channel(lay, w), "scale", w.roots))
    if b is not None:
        y = g.shift(y, L.const_f32(_per_channel(lay, b), "shift", b.roots))
    return L.new(y, lay)


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
    """cat along the node's channels or its dim 2 (T of a 5-D node, H of a 4-D one), the
    values of one regrouping, pair by pair (a copy)."""
    _has("concat")
    tensors = [t for t in tensors if math.prod(t.shape)]  # torch drops empty ones
    if not tensors:
        raise Unsupported("a cat of empty tensors")
    d = dim % len(tensors[0].shape)
    if len(tensors) == 1:
        return _regroup(L, tensors[0], lambda lay: lay)
    if not all(_holdable(t) or (isinstance(t, Const) and len(t.shape) in (4, 5)) for t in tensors):
        raise Unsupported("cat of values convweave does not hold")
    lays = [L.layout_of(t) for t in tensors]
    cands = [lay.groups for lay in lays]
    if all(len(lay.udims) == len(tensors[0].shape) for lay in lays):  # extent 1 along d everywhere
        cands.append(tuple((i,) for i in range(len(tensors[0].shape))))
    ref = next((g for g in cands if len(g[d]) == 1 and g[d][0] in (1, 2)), None)
    if ref is None or len({len(lay.udims) for lay in lays}) != 1 or any(lay != Layout(lay.udims, ref) for lay in lays):
        raise Unsupported(f"cat along dim {dim} other than the node's dim 1 or 2 of one regrouping")
    j = ref[d][0]
    nodes = [L.act(t)[0] for t in tensors]
    y = nodes[0]
    for n in nodes[1:]:
        y = L.g.concat(y, n, j)
    return L.new(y, Layout(L.g.shape(y), ref))


@op(aten.zeros_like.default, aten.ones_like.default)
def filled_like(L, node, x, *args, **kwargs):
    """zeros_like / ones_like: a constant of the shape (Wan's first-chunk cache)."""
    val = node.meta["val"]
    if val.device != L.device:
        raise Unsupported("a constant on another device")
    t = (torch.zeros if node.target == aten.zeros_like.default else torch.ones)(val.shape, dtype=val.dtype, device=L.device)
    L._copied(t, ())
    return Const(t, (), t.numel() * t.element_size())


@op(aten.stack.default)
def stack(L, node, tensors, dim=0):
    """stack = cat of the tensors with a dim of extent 1 added at dim: the same layouts."""
    _has("concat")
    tensors = list(tensors)
    d = dim % (len(tensors[0].shape) + 1)
    if not all(_holdable(t) for t in tensors):
        raise Unsupported("stack of values convweave does not hold")
    shape1 = tuple(tensors[0].shape[:d]) + (1,) + tuple(tensors[0].shape[d:])
    views = [_regroup(L, t, lambda lay: lay.reshape(shape1)) for t in tensors]
    if len(views) == 1:
        return views[0]
    lays = [v.layout for v in views]
    # the new dim has extent 1 in every node: which node dim it is, the layout cannot tell;
    # only a cat of whole nodes along their dim 1 or 2 of extent 1 is one
    j = next((j for j in (1, 2) if all(lay.udims[j] == 1 and lay.group_of(j) is None for lay in lays)), None)
    groups = [list(g) for g in lays[0].groups]
    if j is None or any(g for g in groups[d]):
        raise Unsupported("stack other than along a node's dim 1 or 2 of extent 1")
    groups[d] = [j]
    udims = list(lays[0].udims)
    udims[j] = len(views)
    out = Layout(udims, groups)
    for v in views:
        if v.layout != Layout(v.layout.udims, groups):
            raise Unsupported("stack of values laid out differently")
    nodes = [L.act(v)[0] for v in views]
    y = nodes[0]
    for n in nodes[1:]:
        y = L.g.concat(y, n, j)
    if L.g.shape(y) != tuple(udims):
        raise Unsupported("stack of values laid out differently")
    return L.new(y, out)
