"""Graph.unary, binary, shift, upsample_nearest, reduce_channels and concat (the ops
convweave.torch.wrap lowers ATen's relu/tanh/sigmoid/gelu/mul/sub/div/clamp/bias adds/nearest
upsampling/channel norms/cat to) on the cpu backend against NumPy, and their argument errors;
slice, pad, depth_to_space and space_to_depth against torch (narrow, F.pad, pixel_shuffle and
LTX-Video's reshape-permute), skipped where torch is not installed."""
import math

import numpy as np
import pytest

import convweave
from convweave import _core
from convweave import _lib as C

_erf = np.vectorize(math.erf)


def _run(build, xs, out_shape):
    """Builds a graph of the inputs xs (float32 arrays) with build(g, nodes) -> node, runs it
    unscheduled and patched on 3 streams, returns both results."""
    ctx = _core.Context(backend="cpu", streams=3)
    g = _core.Graph(ctx)
    nodes = [g.input(f"x{i}", x.shape) for i, x in enumerate(xs)]
    y = build(g, nodes)
    g.output(y, "y")
    assert g.shape(y) == out_shape
    outs = []
    for opts in ({"patches": "none", "streams": 1}, {"patches": 3, "streams": 3}):
        p = g.compile(**opts)
        out = np.full(out_shape, np.nan, np.float32)
        p.run(xs, [out])
        outs.append(out)
        p.close()
    g.close()
    ctx.close()
    return outs


UNARY = {
    C.CW_UNARY_RELU: lambda x, a, b: np.maximum(x, 0),
    C.CW_UNARY_TANH: lambda x, a, b: np.tanh(x),
    C.CW_UNARY_SIGMOID: lambda x, a, b: 1 / (1 + np.exp(-x)),
    C.CW_UNARY_GELU: lambda x, a, b: 0.5 * x * (1 + _erf(x / math.sqrt(2))),
    C.CW_UNARY_GELU_TANH: lambda x, a, b: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    C.CW_UNARY_AFFINE: lambda x, a, b: a * x + b,
    C.CW_UNARY_CLAMP: lambda x, a, b: np.clip(x, a, b),
    C.CW_UNARY_RSQRT: lambda x, a, b: 1 / np.sqrt(x),
    C.CW_UNARY_SQUARE: lambda x, a, b: x * x,
    C.CW_UNARY_POW: lambda x, a, b: x ** a,
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    x = np.random.default_rng(op).standard_normal((2, 3, 5, 4)).astype(np.float32)
    if op in (C.CW_UNARY_RSQRT, C.CW_UNARY_POW):  # their domain: x > 0
        x = np.abs(x) + np.float32(0.5)
    a, b = (-1.5, 0.25) if op == C.CW_UNARY_AFFINE else (2.5, 0.0) if op == C.CW_UNARY_POW else (-0.3, 0.4)
    ref = UNARY[op](x.astype(np.float64), a, b)
    for y in _run(lambda g, n: g.unary(n[0], op, a, b), [x], x.shape):
        assert np.abs(y - ref).max() <= 1e-6 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("op,fn", [(C.CW_BINARY_MUL, np.multiply), (C.CW_BINARY_SUB, np.subtract),
                                   (C.CW_BINARY_DIV, np.divide), (C.CW_BINARY_MAX, np.maximum),
                                   (C.CW_BINARY_MIN, np.minimum)])
def test_binary(op, fn):
    rng = np.random.default_rng(op)
    a = rng.standard_normal((1, 2, 3, 4, 5)).astype(np.float32)
    b = (rng.random((1, 2, 3, 4, 5)) + 0.5).astype(np.float32)
    for y in _run(lambda g, n: g.binary(n[0], n[1], op), [a, b], a.shape):
        np.testing.assert_array_equal(y, fn(a, b))  # one IEEE operation: exact


@pytest.mark.parametrize("op,fn", [(C.CW_BINARY_MUL, np.multiply), (C.CW_BINARY_DIV, np.divide),
                                   (C.CW_BINARY_SUB, np.subtract)])
@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (1, 2, 3, 4, 5)])
def test_binary_broadcast_channels(op, fn, shape):
    rng = np.random.default_rng(op)
    a = rng.standard_normal(shape).astype(np.float32)
    m = (rng.random((shape[0], 1) + shape[2:]) + 0.5).astype(np.float32)  # [N, 1, ...]
    for y in _run(lambda g, n: g.binary(n[0], n[1], op), [a, m], a.shape):
        np.testing.assert_array_equal(y, fn(a, m))  # NumPy broadcasts m over the channels


def test_shift_and_upsample_nearest():
    x = np.random.default_rng(5).standard_normal((1, 2, 2, 3, 2)).astype(np.float32)
    v = np.array([10.0, -20.0], np.float32)

    def build(g, n):
        u = g.upsample_nearest(n[0], (2, 1, 3))
        return g.shift(u, g.constant("v", v))

    ref = np.repeat(np.repeat(x, 2, axis=2), 3, axis=4) + v[None, :, None, None, None]
    for y in _run(build, [x], (1, 2, 4, 3, 6)):
        np.testing.assert_array_equal(y, ref)
    x4 = x[:, :, 0]
    for y in _run(lambda g, n: g.upsample_nearest(n[0], (2, 2)), [x4], (1, 2, 6, 4)):
        np.testing.assert_array_equal(y, np.repeat(np.repeat(x4, 2, axis=2), 2, axis=3))


REDUCE = {
    C.CW_REDUCE_SUM: lambda x: x.sum(1, keepdims=True),
    C.CW_REDUCE_MEAN: lambda x: x.mean(1, keepdims=True),
    C.CW_REDUCE_L2: lambda x: np.sqrt((x * x).sum(1, keepdims=True)),
    C.CW_REDUCE_MEAN_SQUARE: lambda x: (x * x).mean(1, keepdims=True),
}


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("shape", [(2, 5, 3, 4), (1, 3, 2, 3, 4)])
def test_reduce_channels(op, shape):
    x = np.random.default_rng(op).standard_normal(shape).astype(np.float32)
    ref = REDUCE[op](x.astype(np.float64)).astype(np.float32)  # the double result rounded once
    out_shape = (shape[0], 1) + shape[2:]
    for y in _run(lambda g, n: g.reduce_channels(n[0], op), [x], out_shape):
        np.testing.assert_array_max_ulp(y, ref, 1)


def test_rms_norm_chain():
    """Wan's F.normalize(x, dim=1): x / clamp_min(vector_norm(x, 2, [1], keepdim), eps)."""
    x = np.random.default_rng(9).standard_normal((1, 4, 3, 5)).astype(np.float32)

    def build(g, n):
        nrm = g.unary(g.reduce_channels(n[0], C.CW_REDUCE_L2), C.CW_UNARY_CLAMP, 1e-12, math.inf)
        return g.binary(n[0], nrm, C.CW_BINARY_DIV)

    x64 = x.astype(np.float64)
    ref = x64 / np.maximum(np.sqrt((x64 * x64).sum(1, keepdims=True)), 1e-12)
    for y in _run(build, [x], x.shape):
        assert np.abs(y - ref).max() <= 4e-7


def test_pixel_norm_chain():
    """LTX's pixel norm: x * rsqrt(mean(x^2, dim=1, keepdim) + eps)."""
    x = np.random.default_rng(11).standard_normal((1, 5, 2, 3, 4)).astype(np.float32)

    def build(g, n):
        ms = g.unary(g.reduce_channels(n[0], C.CW_REDUCE_MEAN_SQUARE), C.CW_UNARY_AFFINE, 1.0, 1e-6)
        return g.binary(n[0], g.unary(ms, C.CW_UNARY_RSQRT), C.CW_BINARY_MUL)

    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + 1e-6)
    for y in _run(build, [x], x.shape):
        assert np.abs(y - ref).max() <= 4e-7 * np.abs(ref).max()


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_concat(dim, shape):
    rng = np.random.default_rng(dim)
    a = rng.standard_normal(shape).astype(np.float32)
    bshape = list(shape)
    bshape[dim] += 1
    b = rng.standard_normal(bshape).astype(np.float32)
    b.flat[3] = np.nan
    out_shape = list(shape)
    out_shape[dim] += bshape[dim]
    for y in _run(lambda g, n: g.concat(n[0], n[1], dim), [a, b], tuple(out_shape)):
        np.testing.assert_array_equal(y.view(np.uint32), np.concatenate([a, b], dim).view(np.uint32))  # bits


def test_argument_errors():
    ctx = _core.Context(backend="cpu")
    g = _core.Graph(ctx)
    x = g.input("x", (1, 2, 4, 4))
    z = g.input("z", (1, 2, 4, 3))
    with pytest.raises(convweave.Error, match=r"op = 10 is not a cw_unary_op \(0..9\)"):
        g.unary(x, 10)
    with pytest.raises(convweave.Error, match=r"a \[1, 2, 4, 4\] and b \[1, 2, 4, 3\] differ in shape"):
        g.binary(x, z, C.CW_BINARY_MUL)
    m = g.input("m", (1, 1, 4, 4))
    with pytest.raises(convweave.Error, match=r"a \[1, 1, 4, 4\] and b \[1, 2, 4, 4\] differ in shape"):
        g.binary(m, x, C.CW_BINARY_MUL)  # only b broadcasts
    assert g.shape(g.binary(x, m, C.CW_BINARY_MUL)) == (1, 2, 4, 4)
    with pytest.raises(convweave.Error, match="factors\\[0\\] \\(D\\) = 2 must be 1 for a 4-D x"):
        g.upsample_nearest(x, (2, 2, 2))
    with pytest.raises(convweave.Error, match=r"op = 4 is not a cw_reduce_op \(0..3\)"):
        g.reduce_channels(x, 4)
    assert g.shape(g.reduce_channels(x, C.CW_REDUCE_L2)) == (1, 1, 4, 4)
    with pytest.raises(convweave.Error, match=r"dim = 3 must be 1 \(channels\) or 2"):
        g.concat(x, x, 3)
    with pytest.raises(convweave.Error, match=r"a \[1, 2, 4, 4\] and b \[1, 2, 4, 3\] must have equal dims but dims\[1\]"):
        g.concat(x, z, 1)
    assert g.shape(g.concat(x, x, 2)) == (1, 2, 8, 4)
    with pytest.raises(ValueError, match="factors"):
        g.upsample_nearest(x, (2,))
    with pytest.raises(convweave.Error, match="cw_graph_shift: v must be"):
        g.shift(x, g.constant("v", np.zeros(3, np.float32)))
    g.close()
    ctx.close()


# ---- slice, pad, depth_to_space / space_to_depth: against torch where it is installed -------


def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("shape,dim,start,length", [((2, 3, 4, 5), 1, 1, 2), ((2, 3, 4, 5), 3, 4, 1),
                                                     ((1, 4, 5, 3, 6), 2, 1, 4), ((1, 4, 5, 3, 6), 4, 2, 3),
                                                     ((1, 4, 5, 3, 6), 3, 0, 3)])
def test_slice(shape, dim, start, length):
    torch = _torch()
    x = np.random.default_rng(dim).standard_normal(shape).astype(np.float32)
    x.flat[7] = np.nan
    ref = torch.from_numpy(x).narrow(dim, start, length).contiguous().numpy()
    for y in _run(lambda g, n: g.slice(n[0], dim, start, length), [x], ref.shape):
        np.testing.assert_array_equal(y.view(np.uint32), ref.view(np.uint32))  # bits


def test_slice_errors():
    ctx = _core.Context(backend="cpu")
    g = _core.Graph(ctx)
    x = g.input("x", (1, 2, 4, 5))
    with pytest.raises(convweave.Error, match=r"dim = 0 must be in 1..3 for x \[1, 2, 4, 5\]"):
        g.slice(x, 0, 0, 1)
    with pytest.raises(convweave.Error, match=r"start = 4 must be in 0..3 for x \[1, 2, 4, 5\] along dim 2"):
        g.slice(x, 2, 4, 1)
    with pytest.raises(convweave.Error, match=r"length = 3 must be in 1..2"):
        g.slice(x, 2, 2, 3)
    assert g.shape(g.slice(x, 3, 1, 4)) == (1, 2, 4, 4)
    g.close()
    ctx.close()


@pytest.mark.parametrize("mode", ["constant", "replicate"])
@pytest.mark.parametrize("shape,pre,post", [((2, 3, 4, 5), (0, 1, 2), (0, 3, 0)),
                                            ((1, 2, 3, 4, 5), (2, 1, 1), (0, 1, 1)),  # HunyuanVideo's causal pad
                                            ((1, 2, 2, 3, 2), (3, 0, 5), (1, 4, 0))])
def test_pad(mode, shape, pre, post):
    torch = _torch()
    F = torch.nn.functional
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    x.flat[5] = np.nan
    torch_pad = []
    for k in (2, 1, 0)[: len(shape) - 2]:  # F.pad lists the last dim first
        torch_pad += [pre[k], post[k]]
    kw = {"value": -0.75} if mode == "constant" else {}
    ref = F.pad(torch.from_numpy(x), torch_pad, mode=mode, **kw).numpy()
    code = C.CW_PAD_CONSTANT if mode == "constant" else C.CW_PAD_REPLICATE
    for y in _run(lambda g, n: g.pad(n[0], pre, post, code, -0.75), [x], ref.shape):
        np.testing.assert_array_equal(y.view(np.uint32), ref.view(np.uint32))  # bits


def test_pad_errors():
    ctx = _core.Context(backend="cpu")
    g = _core.Graph(ctx)
    x = g.input("x", (1, 2, 4, 5))
    with pytest.raises(convweave.Error, match=r"pre\[1\] \(H\) = -1 must be in 0..64"):
        g.pad(x, (-1, 0), (0, 0))
    with pytest.raises(convweave.Error, match=r"post\[2\] \(W\) = 65 must be in 0..64"):
        g.pad(x, (0, 0), (0, 65))
    with pytest.raises(convweave.Error, match=r"pre\[0\] = 1 and post\[0\] = 0 \(D\) must be 0 for a 4-D x"):
        g.pad(x, (1, 0, 0), (0, 0, 0))
    with pytest.raises(convweave.Error, match=r"mode = 2 is not a cw_pad_mode \(0..1\)"):
        g.pad(x, (0, 0), (0, 0), 2)
    with pytest.raises(ValueError, match="pad pre"):
        g.pad(x, (1,), (0, 0))
    assert g.shape(g.pad(x, (1, 2), (3, 4), C.CW_PAD_REPLICATE)) == (1, 2, 8, 11)
    g.close()
    ctx.close()


def _ltx_depth_to_space(x, f):
    """LTXVideoUpsampler3d's shuffle (diffusers), without its frame drop."""
    b, c, t, h, w = x.shape
    x = x.reshape(b, -1, f[0], f[1], f[2], t, h, w)
    return x.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5).flatten(2, 3)


def _ltx_space_to_depth(x, f):
    """LTXVideoDownsampler3d's shuffle (diffusers), without its frame repeat and group mean."""
    x = x.unflatten(4, (-1, f[2])).unflatten(3, (-1, f[1])).unflatten(2, (-1, f[0]))
    return x.permute(0, 1, 3, 5, 7, 2, 4, 6).flatten(1, 4)


@pytest.mark.parametrize("f", [(2, 2, 2), (1, 2, 2), (2, 1, 1), (2, 3, 1)])
def test_depth_to_space_ltx(f):
    torch = _torch()
    F = f[0] * f[1] * f[2]
    x = np.random.default_rng(F).standard_normal((1, 2 * F, 3, 2, 3)).astype(np.float32)
    x.flat[4] = np.nan
    up = _ltx_depth_to_space(torch.from_numpy(x), f).contiguous().numpy()
    for y in _run(lambda g, n: g.depth_to_space(n[0], f), [x], up.shape):
        np.testing.assert_array_equal(y.view(np.uint32), up.view(np.uint32))  # bits
    # LTX's upsampler then drops the first fd - 1 frames: a slice
    drop = up[:, :, f[0] - 1:]
    for y in _run(lambda g, n: g.slice(g.depth_to_space(n[0], f), 2, f[0] - 1, up.shape[2] - f[0] + 1), [x],
                  drop.shape):
        np.testing.assert_array_equal(y.view(np.uint32), np.ascontiguousarray(drop).view(np.uint32))
    down = _ltx_space_to_depth(torch.from_numpy(up), f).contiguous().numpy()
    np.testing.assert_array_equal(down.view(np.uint32), x.view(np.uint32))  # LTX's pair: inverses
    for y in _run(lambda g, n: g.space_to_depth(n[0], f), [up], x.shape):
        np.testing.assert_array_equal(y.view(np.uint32), down.view(np.uint32))


@pytest.mark.parametrize("r", [1, 2, 3])
def test_pixel_shuffle(r):
    torch = _torch()
    x = np.random.default_rng(r).standard_normal((2, 2 * r * r, 3, 4)).astype(np.float32)
    ref = torch.nn.functional.pixel_shuffle(torch.from_numpy(x), r).numpy()
    for y in _run(lambda g, n: g.depth_to_space(n[0], (r, r)), [x], ref.shape):
        np.testing.assert_array_equal(y.view(np.uint32), ref.view(np.uint32))
    back = torch.nn.functional.pixel_unshuffle(torch.from_numpy(ref), r).numpy()
    for y in _run(lambda g, n: g.space_to_depth(n[0], (1, r, r)), [ref], back.shape):
        np.testing.assert_array_equal(y.view(np.uint32), back.view(np.uint32))


def test_depth_to_space_errors():
    ctx = _core.Context(backend="cpu")
    g = _core.Graph(ctx)
    x = g.input("x", (1, 12, 4, 6))
    with pytest.raises(convweave.Error, match=r"channels C = 12 must be a multiple of fd \* fh \* fw = 9"):
        g.depth_to_space(x, (3, 3))
    with pytest.raises(convweave.Error, match=r"x \[1, 12, 4, 6\]'s W = 6 must be a multiple of factors\[2\] = 4"):
        g.space_to_depth(x, (1, 4))
    with pytest.raises(convweave.Error, match=r"factors\[0\] \(D\) = 2 must be 1 for a 4-D x"):
        g.depth_to_space(x, (2, 1, 1))
    with pytest.raises(ValueError, match="space_to_depth factors"):
        g.space_to_depth(x, (2,))
    assert g.shape(g.depth_to_space(x, (2, 2))) == (1, 3, 8, 12)
    assert g.shape(g.space_to_depth(x, (2, 3))) == (1, 72, 2, 2)
    g.close()
    ctx.close()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_copy_ops_half(dtype):
    """slice, pad (the constant rounded to the dtype as torch rounds it), depth_to_space and
    space_to_depth in a half-precision graph: torch's bits."""
    torch = _torch()
    F = torch.nn.functional
    tdt = getattr(torch, dtype)
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((1, 8, 2, 4, 6)).astype(np.float32)).to(tdt)
    cases = [
        (lambda g, n: g.slice(n, 2, 1, 1), x.narrow(2, 1, 1)),
        (lambda g, n: g.pad(n, (2, 1, 1), (0, 1, 1), C.CW_PAD_REPLICATE),
         F.pad(x, (1, 1, 1, 1, 2, 0), mode="replicate")),
        (lambda g, n: g.pad(n, (0, 1, 0), (1, 0, 2), C.CW_PAD_CONSTANT, 0.1), F.pad(x, (0, 2, 1, 0, 0, 1), value=0.1)),
        (lambda g, n: g.depth_to_space(n, (2, 2, 2)), _ltx_depth_to_space(x, (2, 2, 2))),
        (lambda g, n: g.space_to_depth(n, (2, 2, 3)), _ltx_space_to_depth(x, (2, 2, 3))),
    ]
    for build, ref in cases:
        ref = ref.contiguous()
        ctx = _core.Context(backend="cpu", streams=3)
        g = _core.Graph(ctx)
        y = build(g, g.input("x", tuple(x.shape), dtype=dtype))
        g.output(y, "y")
        assert g.shape(y) == tuple(ref.shape)
        p = g.compile(patches="none", streams=1)
        out = torch.full(ref.shape, float("nan"), dtype=tdt)
        p.run([x], [out])
        p.close()
        g.close()
        ctx.close()
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))  # bits
