"""Graph.attention with block > 0 (cw_graph_attention_blocks: HunyuanVideo's block-causal
mid-block attention, Wan's per-frame attention) on the cpu backend against NumPy's masked
softmax, and its argument errors. NumPy only."""
import numpy as np
import pytest

import convweave
from convweave import _lib as C
from test_graph_ops import _run


def _ref(q, k, v, scale, block, mask):
    n, c = q.shape[:2]
    q, k, v = (a.reshape(n, c, -1).astype(np.float64) for a in (q, k, v))
    t = q.shape[2]
    s = scale * np.einsum("nct,ncs->nts", q, k)
    if block:
        idx = np.arange(t) // block
        seen = idx[None, :] <= idx[:, None] if mask == C.CW_ATTENTION_BLOCK_CAUSAL else idx[None, :] == idx[:, None]
        s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("nts,ncs->nct", p, v)


@pytest.mark.parametrize("mask", [C.CW_ATTENTION_BLOCK_CAUSAL, C.CW_ATTENTION_BLOCK_DIAGONAL])
@pytest.mark.parametrize("shape,block", [((1, 4, 3, 2, 3), 6), ((2, 3, 4, 5), 1), ((1, 3, 4, 5), 7), ((1, 3, 4, 5), 0)])
def test_block_attention(shape, block, mask):
    rng = np.random.default_rng(block)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    ref = _ref(q, k, v, 0.5, block, mask).reshape(shape)
    for y in _run(lambda g, n: g.attention(n[0], n[1], n[2], 0.5, block=block, mask=mask), [q, k, v], shape):
        assert np.abs(y - ref).max() <= 1e-5


def test_block_attention_bad_args():
    from convweave import _core
    ctx = _core.Context(backend="cpu")
    g = _core.Graph(ctx)
    x = g.input("x", (1, 2, 3, 4))
    with pytest.raises(convweave.Error, match="block = 13 must be in 1..12"):
        g.attention(x, x, x, 1.0, block=13)
    with pytest.raises(convweave.Error, match="mask = 5 is not a cw_attention_mask"):
        g.attention(x, x, x, 1.0, block=3, mask=5)
    g.close()
    ctx.close()
