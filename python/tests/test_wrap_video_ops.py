"""convweave.torch.wrap on the ATen patterns of the video VAEs (CogVideoX, Wan, HunyuanVideo,
LTX-Video): frames folded into the batch, channels-last norms, causal-conv caches (slices,
selects, cats, repeats, replicate pads), each wrapped with fallback=False so a node that
falls back fails the test, and judged against the module's float64 forward."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import convweave  # noqa: E402
from convweave._core import Graph  # noqa: E402
from test_wrap import Fn, rand  # noqa: E402
from wrap_util import check_module  # noqa: E402


def needs(method):
    return pytest.mark.skipif(not hasattr(Graph, method), reason=f"this build has no Graph.{method}")


def fold(x):
    """[B, C, T, H, W] -> [B*T, C, H, W] (CogVideoX's and Wan's per-frame 2-D ops)."""
    b, c, t, h, w = x.shape
    return x.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w)


def unfold(x, b):
    bt, c, h, w = x.shape
    return x.reshape(b, bt // b, c, h, w).permute(0, 2, 1, 3, 4)


@pytest.mark.parametrize("b", [1, 2])
def test_conv2d_per_frame_is_a_conv3d(b):
    """conv2d over frames folded into the batch: a (1, kh, kw) conv3d on the 5-D node."""
    c3 = nn.Conv3d(3, 4, 3, padding=1)
    c2 = nn.Conv2d(4, 5, 3, stride=2, padding=1)
    mod = Fn(lambda s, x: unfold(s.c2(fold(s.c3(x))), b), c3=c3, c2=c2)
    check_module(mod, (rand(b, 3, 3, 6, 6),), fallback=False)


def test_upsample_per_frame_and_nearest_exact():
    """Wan's Resample: nearest-exact x2 of a frame-folded view (a (1, 2, 2) upsampling), and
    a factor 3 in W only."""
    c = nn.Conv3d(2, 4, 3, padding=1)
    mod = Fn(lambda s, x: unfold(F.interpolate(F.interpolate(fold(s.c(x)), scale_factor=2.0, mode="nearest-exact"),
                                               scale_factor=(1, 3), mode="nearest"), 1), c=c)
    check_module(mod, (rand(1, 2, 3, 4, 5),), fallback=False)


@needs("slice")
def test_upsample_of_one_frame():
    """HunyuanVideo's upsampler: the first frame upsampled in H, W, the others in T, H, W; a
    dim of extent 1 that grows is still the node's own."""
    c = nn.Conv3d(2, 3, 1)

    def f(s, x):
        h = s.c(x)
        first = F.interpolate(h[:, :, :1], scale_factor=(1, 2, 2), mode="nearest")
        rest = F.interpolate(h[:, :, 1:], scale_factor=2.0, mode="nearest")
        return torch.cat([first, rest], dim=2)
    check_module(Fn(f, c=c), (rand(1, 2, 2, 3, 3),), fallback=False)


@needs("slice")
def test_upsampler_cat_fuses_into_the_conv():
    """HunyuanVideo's whole upsampler: the cat of the upsampled first frame and rest, replicate
    padded, into a conv. cw_graph_concat builds the cat as one upsample with a frame offset,
    which the conv's prep does: the plan never stores the upsampled tensor."""
    c0, c = nn.Conv3d(2, 3, 1), nn.Conv3d(3, 4, 3)

    def f(s, x):
        h = s.c0(x)
        first = F.interpolate(h[:, :, :1].squeeze(2), scale_factor=2.0, mode="nearest").unsqueeze(2)
        rest = F.interpolate(h[:, :, 1:], scale_factor=2.0, mode="nearest")
        return s.c(F.pad(torch.cat([first, rest], dim=2), (1, 1, 1, 1, 2, 0), mode="replicate"))
    x = rand(1, 2, 3, 4, 4)
    w, _, _ = check_module(Fn(f, c0=c0, c=c), (x,), fallback=False)
    cat_bytes = 3 * 5 * 8 * 8 * 4  # [1, 3, 1 + 2 * 2, 8, 8] in float32
    acts = sum(seg["plan"]["activations_peak"] for seg in w.describe()["segments"])
    assert acts < cat_bytes, f"the plan stores {acts} B of activations: the {cat_bytes} B cat was not fused"


def test_rms_norm_channels_last():
    """LTX's RMSNorm: movedim(1, -1), mean of squares over the last dim (the node's channels),
    rsqrt, a per-channel weight, movedim back."""
    c = nn.Conv3d(3, 6, 3, padding=1)
    wt = nn.Parameter(rand(6, seed=2))

    def f(s, x):
        h = s.c(x).movedim(1, -1)
        var = h.to(torch.float32).pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + 1e-8)
        h = (h * s.w).type_as(h)
        return h.movedim(-1, 1)
    m = Fn(f, c=c)
    m.w = wt
    check_module(m, (rand(1, 3, 3, 5, 4),), fallback=False)


def test_layer_norm_channels_last():
    """LTX's norm3: nn.LayerNorm over a movedim(1, -1) view: the node's channels."""
    c = nn.Conv3d(3, 6, 3, padding=1)
    ln = nn.LayerNorm(6, eps=1e-6)
    with torch.no_grad():
        ln.weight.copy_(rand(6, seed=4))
        ln.bias.copy_(rand(6, seed=5))
    mod = Fn(lambda s, x: s.ln((s.c(x) + 3.0).movedim(1, -1)).movedim(-1, 1), c=c, ln=ln)
    check_module(mod, (rand(1, 3, 2, 4, 5),), fallback=False)


def test_zeros_like_cache_and_cat_of_single_frames():
    """Wan's first chunk: cat([zeros_like(cache), cache]) and a cat of two one-frame values."""
    c = nn.Conv3d(3, 4, 1)

    def f(s, x):
        h = s.c(x)
        last = h[:, :, -1:]
        z = torch.cat([torch.zeros_like(last), last], dim=2)
        return z, torch.cat([h[:, :, 0].unsqueeze(2), last], dim=2)
    check_module(Fn(f, c=c), (rand(1, 3, 3, 4, 4),), fallback=False)


def test_l2_norm_per_frame():
    """Wan's RMS_norm: F.normalize over the channels of a frame-folded view, times sqrt(C) and
    a per-channel gamma."""
    c = nn.Conv3d(3, 4, 3, padding=1)
    gamma = nn.Parameter(rand(4, 1, 1, seed=3))

    def f(s, x):
        h = fold(s.c(x))
        return unfold(F.normalize(h, dim=1) * 2.0 * s.g, 1)
    m = Fn(f, c=c)
    m.g = gamma
    check_module(m, (rand(1, 3, 2, 4, 4),), fallback=False)


def test_alias_and_type_as_of_an_input():
    c = nn.Conv3d(2, 2, 1)
    mod = Fn(lambda s, x: s.c(torch.ops.aten.alias(x)).type_as(x), c=c)
    check_module(mod, (rand(1, 2, 2, 3, 3),), fallback=False)


@needs("slice")
@pytest.mark.parametrize("k", [2, 3])
def test_causal_padding_by_repeat_and_cat(k):
    """LTX's causal conv: the first frame repeated k - 1 times before the frames (a slice, a
    repeat as nearest upsampling in T, a cat along T), conv3d with no T padding."""
    c = nn.Conv3d(3, 4, (k + 1, 3, 3), padding=(0, 1, 1))
    c0 = nn.Conv3d(3, 3, 1)

    def f(s, x):
        h = s.c0(x)
        h = torch.cat([h[:, :, :1].repeat(1, 1, k, 1, 1), h], dim=2)
        return s.c(h)
    check_module(Fn(f, c=c, c0=c0), (rand(1, 3, 4, 5, 5),), fallback=False)


@needs("slice")
def test_non_causal_padding_by_repeat_of_none():
    """LTX's non-causal conv with a kernel of 1 frame repeats the edge frames 0 times: empty
    tensors that the cat drops."""
    c = nn.Conv3d(3, 4, 1)

    def f(s, x):
        h = s.c(x)
        return torch.cat([h[:, :, :1].repeat(1, 1, 0, 1, 1), h, h[:, :, -1:].repeat(1, 1, 0, 1, 1)], dim=2)
    check_module(Fn(f, c=c), (rand(1, 3, 3, 4, 4),), fallback=False)


@needs("slice")
def test_cogvideox_cache_slices_select_and_cat():
    """CogVideoX: cat([x[:, :, :1]] * 2 + [x]) before a causal conv; the cache x[:, :, -2:];
    the first frame selected, upsampled in 2-D, put back with the rest upsampled in 3-D."""
    c = nn.Conv3d(3, 4, 3, padding=(0, 1, 1))
    c0 = nn.Conv3d(3, 3, 1)

    def f(s, x):
        h = s.c0(x)
        h = s.c(torch.cat([h[:, :, :1]] * 2 + [h], dim=2))
        cache = h[:, :, -2:].clone()
        first, rest = h[:, :, 0], h[:, :, 1:]
        first = F.interpolate(first, scale_factor=2.0)[:, :, None]
        rest = F.interpolate(rest, scale_factor=2.0)
        return torch.cat([first, rest], dim=2), cache
    check_module(Fn(f, c=c, c0=c0), (rand(1, 3, 4, 4, 4),), fallback=False)


@needs("slice")
def test_split_chunk_and_stack():
    """split along the channels (a chunk) and along T, a stack of selected frames."""
    c = nn.Conv3d(3, 6, 1)

    def f(s, x):
        h = s.c(x)
        a, b = h.chunk(2, dim=1)
        p, q = torch.split(a, [1, 3], dim=2)
        st = torch.stack([b[:, :, 0], b[:, :, 3]], dim=2)
        return q * 2.0, p + 1.0, st
    check_module(Fn(f, c=c), (rand(1, 3, 4, 3, 3),), fallback=False)


@needs("slice")
def test_channel_halves_stacked_in_time():
    """Wan's time upsampler on one frame: a conv's 2C channels reshaped to (2, C), each half
    selected and the halves stacked after T (of extent 1): two channel slices and a cat in T."""
    c = nn.Conv3d(3, 8, 1)

    def f(s, x):
        h = s.c(x)
        b, c2, t, hh, ww = h.shape
        h = h.reshape(b, 2, c2 // 2, t, hh, ww)
        h = torch.stack((h[:, 0, :, :, :, :], h[:, 1, :, :, :, :]), 3)
        return h.reshape(b, c2 // 2, t * 2, hh, ww)
    check_module(Fn(f, c=c), (rand(1, 3, 1, 4, 4),), fallback=False)


@needs("slice")
def test_slice_of_frames_folded_into_the_batch():
    """A slice of a [T, C, H, W] frame-folded view along its batch is a slice of T."""
    c = nn.Conv3d(2, 3, 1)
    mod = Fn(lambda s, x: fold(s.c(x))[1:3] * 3.0, c=c)
    check_module(mod, (rand(1, 2, 4, 3, 3),), fallback=False)


@needs("pad")
def test_replicate_pad_then_conv():
    """HunyuanVideo's causal conv: a replicate pad (2 frames before, 1 row and column each
    side), then a conv with no padding; and a constant pad read by another op."""
    c = nn.Conv3d(3, 4, 3)
    c0 = nn.Conv3d(3, 3, 1)

    def f(s, x):
        h = s.c0(x)
        return s.c(F.pad(h, (1, 1, 1, 1, 2, 0), mode="replicate")), F.pad(h, (1, 0, 0, 2), value=0.5) + 1.0
    check_module(Fn(f, c=c, c0=c0), (rand(1, 3, 3, 4, 5),), fallback=False)


@needs("depth_to_space")
@pytest.mark.parametrize("stride", [(2, 2, 2), (1, 2, 2), (2, 1, 1)])
def test_depth_to_space_of_ltx_upsampler(stride):
    """LTXVideoUpsampler3d: conv, reshape [B, C, fd, fh, fw, T, H, W], permute, flatten (a
    depth-to-space), then the first fd - 1 frames dropped."""
    f = stride[0] * stride[1] * stride[2]
    c = nn.Conv3d(3, 2 * f, 3, padding=1)

    def fn(s, x):
        h = s.c(x)
        b, _, t, hh, ww = h.shape
        h = h.reshape(b, -1, stride[0], stride[1], stride[2], t, hh, ww)
        h = h.permute(0, 1, 5, 2, 6, 3, 7, 4).flatten(6, 7).flatten(4, 5).flatten(2, 3)
        return h[:, :, stride[0] - 1:]
    check_module(Fn(fn, c=c), (rand(1, 3, 3, 4, 5),), fallback=False)


@needs("depth_to_space")
def test_split_and_shuffle_read_by_pytorch():
    """A channel split or a depth-to-space on its way that PyTorch reads (a sum over the
    split dim, an 8-D sin) is materialized from the node: the result is still right."""
    c = nn.Conv3d(3, 8, 1)

    def fn(s, x):
        h = s.c(x)
        b, c8, t, hh, ww = h.shape
        v = h.reshape(b, 2, 2, 2, 1, t, hh, ww).permute(0, 1, 5, 2, 6, 3, 7, 4)
        return torch.sin(v), h.reshape(b, 2, 4, t, hh, ww).sum(1)
    w, _, _ = check_module(Fn(fn, c=c), (rand(1, 3, 2, 3, 3),))
    assert w.describe()["nodes_fallback"] >= 2


def test_pytorch_view_of_a_permuted_node():
    """A view PyTorch runs (a channel split into heads) of a channels-last node whose
    .contiguous() was no task: the fallback reads a contiguous tensor."""
    c = nn.Conv2d(3, 8, 1)
    mod = Fn(lambda s, x: s.c(x).permute(0, 2, 3, 1).contiguous().view(1, 4, 10, 4).sum(-1), c=c)
    w, _, _ = check_module(mod, (rand(1, 3, 4, 5),))
    assert w.describe()["nodes_fallback"] >= 1


def _hunyuan_mask(frames, hw):
    """diffusers' prepare_causal_attention_mask: each frame's tokens see their frame and the
    ones before it (0), the rest -inf."""
    idx = torch.arange(1, frames + 1, dtype=torch.int32).repeat_interleave(hw)
    x, y = torch.meshgrid(idx, idx, indexing="xy")
    return torch.where(x <= y, 0.0, -float("inf"))


@pytest.mark.skipif(not hasattr(convweave._lib, "CW_ATTENTION_BLOCK_CAUSAL"), reason="no masked attention")
@pytest.mark.parametrize("kind", ["block_causal", "block_diagonal", "causal", "bool"])
def test_masked_attention(kind):
    """HunyuanVideo's mid-block attention: a block-causal mask built in the forward from
    arange/meshgrid/where (folded at compile time) is cw_graph_attention_blocks; so are a
    block-diagonal mask (per-frame attention), is_causal, and a bool mask."""
    c = nn.Conv3d(4, 4, 1)

    def fn(s, x):
        h = s.c(x)
        b, ch, t, hh, ww = h.shape
        tok = h.flatten(2).transpose(1, 2)[:, None]  # [B, 1, THW, C]
        m = _hunyuan_mask(t, hh * ww).to(x.device, x.dtype)
        if kind == "block_diagonal":
            idx = torch.arange(t).repeat_interleave(hh * ww)
            m = torch.where(idx[:, None] == idx[None, :], 0.0, -float("inf")).to(x.dtype)
        if kind == "bool":
            m = m == 0
        if kind == "causal":
            y = F.scaled_dot_product_attention(tok, tok * 0.5, tok, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(tok, tok * 0.5, tok, attn_mask=m[None, None].expand(b, 1, -1, -1))
        return y[:, 0].transpose(1, 2).reshape(b, ch, t, hh, ww)
    check_module(Fn(fn, c=c), (rand(1, 4, 3, 2, 3),), fallback=False)


@pytest.mark.skipif(not hasattr(convweave._lib, "CW_ATTENTION_BLOCK_DIAGONAL"), reason="no masked attention")
@pytest.mark.parametrize("b", [1, 2])
def test_per_frame_attention_of_frames_folded_into_the_batch(b):
    """Wan's AttentionBlock on several frames: [B*T, C, H, W] views, q, k, v chunked from one
    1x1 conv over the channels, SDPA per frame: block-diagonal attention over the node."""
    c = nn.Conv3d(3, 4, 1)
    qkv = nn.Conv2d(4, 12, 1)

    def fn(s, x):
        h = fold(s.c(x))
        bt, ch, hh, ww = h.shape
        q, k, v = s.qkv(h).reshape(bt, 1, ch * 3, -1).permute(0, 1, 3, 2).contiguous().chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v)
        y = y.squeeze(1).permute(0, 2, 1).reshape(bt, ch, hh, ww)
        return unfold(y, b) + x.sum(1, keepdim=True)
    check_module(Fn(fn, c=c, qkv=qkv), (rand(b, 3, 3, 2, 3),), fallback=False)
