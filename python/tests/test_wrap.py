"""convweave.torch.wrap: each ATen op the table lowers against the op itself (fallback=False,
so a node that falls back fails the test), the views, PyTorch fallbacks between segments,
the signature cache, parameter changes, and the error paths."""
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import convweave  # noqa: E402
import convweave.torch as cwt  # noqa: E402
from wrap_util import check_module, max_err  # noqa: E402


class Fn(nn.Module):
    """A module computing fn(self, *inputs), with the given submodules as parameters."""

    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, m in mods.items():
            setattr(self, k, m)

    def forward(self, *x):
        return self.fn(self, *x)


def rand(*s, seed=0):
    return torch.randn(*s, generator=torch.Generator().manual_seed(seed))


CONV_CASES = [  # (in shape, conv kwargs)
    ((1, 3, 9, 7), dict(in_channels=3, out_channels=5, kernel_size=3, padding=1)),
    ((2, 4, 12, 10), dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1)),
    ((1, 4, 11, 9), dict(in_channels=4, out_channels=4, kernel_size=3, dilation=2, padding=2, groups=2)),
    ((1, 3, 8, 8), dict(in_channels=3, out_channels=2, kernel_size=(1, 3), padding="same")),
    ((1, 2, 7, 9), dict(in_channels=2, out_channels=3, kernel_size=4, padding="same")),
    ((1, 2, 7, 9), dict(in_channels=2, out_channels=3, kernel_size=2, padding="valid", bias=False)),
    ((1, 8, 6, 6), dict(in_channels=8, out_channels=8, kernel_size=3, padding=1, groups=8)),
]


@pytest.mark.parametrize("shape,kw", CONV_CASES)
def test_conv2d(shape, kw):
    check_module(nn.Conv2d(**kw), (rand(*shape),), fallback=False, budget="1MiB")


def test_conv3d_and_pad_fold():
    conv = nn.Conv3d(3, 4, 3, stride=(1, 2, 2))
    mod = Fn(lambda s, x: s.c(F.pad(x, (0, 1, 0, 1, 2, 0))), c=conv)  # causal in T, diffusers' (0,1,0,1)
    w, _, _ = check_module(mod, (rand(1, 3, 5, 8, 8),), fallback=False)
    assert w.describe()["nodes_fallback"] == 0


def test_pad_read_by_another_op():
    """A zero pad read by a conv and by a crop: the conv folds it, the crop reads a
    cw_graph_pad (or PyTorch's pad where the library has none)."""
    conv = nn.Conv2d(2, 2, 3)
    mod = Fn(lambda s, x: s.c(F.pad(x, (1, 1, 1, 1))) + F.pad(x, (1, 1, 1, 1))[:, :, 1:-1, 1:-1], c=conv)
    w, _, _ = check_module(mod, (rand(1, 2, 6, 6),))
    pads = [f for f in w.describe()["fallbacks"] if "pad" in f["op"]]
    assert bool(pads) != (hasattr(convweave._core.Graph, "pad") and hasattr(convweave._core.Graph, "slice"))


def test_norms_activations_resampling():
    gn = nn.GroupNorm(4, 8, eps=1e-4)
    conv = nn.Conv2d(8, 8, 3, padding=1)

    def f(s, x):
        h = F.silu(s.gn(x))
        h = F.interpolate(h, scale_factor=2.0, mode="nearest")
        h = s.c(h) / 2.0
        h = F.avg_pool2d(h, 2) * 3.0
        return F.interpolate(h, scale_factor=2, mode="nearest-exact") + 0
    check_module(Fn(f, gn=gn, c=conv), (rand(2, 8, 6, 4),), fallback=False)


def test_per_channel_scale_from_a_parameter():
    """x * w[:, None, None] and x / w.view(1, C, 1, 1): cw_graph_scale with the vector."""
    conv = nn.Conv2d(3, 4, 3, padding=1)
    mod = Fn(lambda s, x: s.c(x) * s.c.bias[:, None, None] / (s.c.bias.view(1, 4, 1, 1) + 3.0), c=conv)
    w, _, _ = check_module(mod, (rand(2, 3, 5, 5),), fallback=False)
    assert w.describe()["nodes_folded"] >= 2  # the bias's views and the + 3.0, at compile time


def test_group_norm_without_affine_and_3d_upsample():
    gn = nn.GroupNorm(2, 4, affine=False)

    def f(s, x):
        return F.interpolate(s.gn(x), scale_factor=(1, 2, 2), mode="nearest")
    check_module(Fn(f, gn=gn), (rand(1, 4, 3, 4, 5),), fallback=False)


def test_attention_through_views():
    """diffusers' single-head attention: view + transpose to tokens, GroupNorm on a [B, C, HW]
    view, linear q/k/v/out over the channels, SDPA, back to [B, C, H, W], residual."""
    gn, q, k, v, o = nn.GroupNorm(4, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

    def f(s, x):
        b, c, h, w = x.shape
        t = x.view(b, c, h * w).transpose(1, 2)
        t = s.gn(t.transpose(1, 2)).transpose(1, 2)
        qq, kk, vv = (m(t).view(b, -1, 1, c).transpose(1, 2) for m in (s.q, s.k, s.v))
        a = F.scaled_dot_product_attention(qq, kk, vv)
        a = s.o(a.transpose(1, 2).reshape(b, -1, c))
        return a.transpose(-1, -2).reshape(b, c, h, w) + x
    w, _, _ = check_module(Fn(f, gn=gn, q=q, k=k, v=v, o=o), (rand(2, 16, 5, 6),), fallback=False)
    assert len(w.describe()["segments"]) == 1


def test_views_are_free_and_returned_as_views():
    conv = nn.Conv2d(3, 6, 1)
    mod = Fn(lambda s, x: s.c(x).permute(0, 2, 3, 1).reshape(1, -1, 6), c=conv)
    w, _, _ = check_module(mod, (rand(1, 3, 4, 5),), fallback=False)
    d = w.describe()
    assert d["nodes_fallback"] == 0 and len(d["segments"]) == 1


def test_fallback_segments_and_describe():
    """torch.sin has no convweave op: it runs in PyTorch between two segments, exactly."""
    c1, c2 = nn.Conv2d(2, 4, 3, padding=1), nn.Conv2d(4, 2, 3, padding=1)
    mod = Fn(lambda s, x: s.c2(torch.sin(s.c1(x))), c1=c1, c2=c2)
    w, _, _ = check_module(mod, (rand(1, 2, 8, 8),))
    d = w.describe()
    assert len(d["segments"]) == 2 and d["nodes_fallback"] == 1
    fb = d["fallbacks"][0]
    assert fb["op"] == "aten.sin.default" and fb["shape"] == (1, 4, 8, 8) and fb["bytes"] == 4 * 4 * 64
    assert "test_wrap.py" in fb["where"], fb["where"]
    with pytest.raises(convweave.Error, match=r"aten.sin.default.*fallback=False.*test_wrap.py"):
        cwt.wrap(mod, (rand(1, 2, 8, 8),), fallback=False)


def _remat_module():
    """An inpainting-style decoder in small: f = conv(image * (1 - mask)) is read by the next
    conv at once and by the last mix at the end, after a chain of wide convs on z."""
    torch.manual_seed(0)
    mods = dict(cf=nn.Conv2d(3, 16, 3, padding=1), cg=nn.Conv2d(16, 8, 3, padding=1),
                c1=nn.Conv2d(8, 32, 3, padding=1), c2=nn.Conv2d(32, 64, 3, padding=1),
                c3=nn.Conv2d(64, 16, 3, padding=1))

    def fn(s, z, image, mask):
        f = s.cf(image * (1 - mask))
        h = s.c1(z + s.cg(F.relu(f)))
        h = s.c3(F.silu(s.c2(F.silu(h))))
        return h * mask + f * (1 - mask)
    side = 128  # f: 16 x 128 x 128 floats, 1 MiB (remat.MIN_BYTES)
    mask = torch.zeros(1, 1, side, side)
    mask[..., side // 4:3 * side // 4, :] = 1
    return Fn(fn, **mods), (rand(1, 8, side, side), rand(1, 3, side, side, seed=1), mask)


def test_rematerialize_a_cheap_early_tensor(monkeypatch):
    """front/remat.py: f, made from the inputs alone by a 3 -> 16 conv, is computed again just
    before the mix instead of being held across the three wide convs: exact, named in
    describe(), and the plan's activations are smaller than with recomputing switched off."""
    from convweave.front import remat
    mod, ins = _remat_module()
    w, _, _ = check_module(mod, ins, fallback=False)
    d = w.describe()
    assert [(r["bytes"], round(r["gflop"], 4)) for r in d["rematerialized"]] == [(16 * 128 * 128 * 4, 0.0142)], d
    peak = d["segments"][0]["plan"]["activations_peak"]
    monkeypatch.setattr(remat, "SHARE", 0.0)  # no cone is cheap enough
    w0, _, _ = check_module(mod, ins, fallback=False)
    d0 = w0.describe()
    assert d0["rematerialized"] == []
    assert peak < d0["segments"][0]["plan"]["activations_peak"], (peak, d0["segments"][0]["plan"])


def _least_total(w, budget):
    """The memory ladder's least total of w's plans: the largest of its segments' least."""
    segs = [s[1] for s in w.last_program.steps if s[0] == "seg"]
    return max(seg.g.memory_ladder(budget=budget, streams=2)[0]["total_bytes"] for seg in segs)


def test_memory_cap_recomputes_dearer_cones(monkeypatch):
    """memory= as a size that the plans miss at remat.SHARE: wrap compiles once more at
    remat.SHARE_CAPPED (front/runner.py, Wrapped._compile), f is recomputed before the mix,
    and the plan fits, exactly. Shares of 0 and 1 stand in for a real decoder's 2 % and 5 %.
    The copy's product with (1 - mask) is its conv's epilogue (scheduler/fusion.c). With
    SHARE_CAPPED no larger than SHARE nothing is retried: CW_ERR_BUDGET."""
    from convweave.front import remat
    mod, ins = _remat_module()
    monkeypatch.setattr(remat, "SHARE", 0.0)
    monkeypatch.setattr(remat, "SHARE_CAPPED", 1.0)
    least0 = _least_total(cwt.wrap(mod.eval(), ins, budget="1MiB"), "1MiB")
    w, _, _ = check_module(mod, ins, fallback=False, budget="1MiB", memory=least0 - 1)
    d = w.describe()
    assert d["remat_share"] == 1.0 and [r["node"] for r in d["rematerialized"]] == ["conv2d"], d
    p = d["segments"][0]["plan"]
    assert p["activations_peak"] + p["temp_predicted"] <= least0 - 1, (p, least0)
    monkeypatch.setattr(remat, "SHARE_CAPPED", 0.0)
    with pytest.raises(convweave.Error, match=r"^CW_ERR_BUDGET: .*memory budget"):
        cwt.wrap(mod.eval(), ins, budget="1MiB", memory=least0 - 1)


def test_ladder_recomputes_a_conv_read_through_relu():
    """A conv whose only reader is the next conv through a ReLU (a fused unary link) is on the
    recompute ladder like one read through GroupNorm/SiLU: the least memory point recomputes
    it, exactly."""
    torch.manual_seed(0)
    mod = Fn(lambda s, x: s.c(F.relu(s.b(F.relu(s.a(x))))), a=nn.Conv2d(3, 16, 3, padding=1),
             b=nn.Conv2d(16, 16, 3, padding=1), c=nn.Conv2d(16, 3, 3, padding=1))
    ins = (rand(1, 3, 128, 128),)
    w0 = cwt.wrap(mod.eval(), ins, budget="1MiB")
    stored = w0.describe()["segments"][0]["plan"]
    least = _least_total(w0, "1MiB")
    w, _, _ = check_module(mod, ins, fallback=False, budget="1MiB", memory=least)
    p = w.describe()["segments"][0]["plan"]
    assert p["n_recomputed"] >= 1 and p["activations_peak"] < stored["activations_peak"], (p, stored)


def test_multiple_outputs_keep_structure():
    conv = nn.Conv2d(2, 4, 3, padding=1)
    mod = Fn(lambda s, x: {"y": s.c(x), "pair": (F.silu(s.c(x)), x * 2.0)}, c=conv)
    x = rand(1, 2, 5, 5)
    w = cwt.wrap(mod.eval(), (x,))
    with torch.no_grad():
        out, ref = w(x), mod(x)
    assert set(out) == {"y", "pair"} and isinstance(out["pair"], tuple)
    for a, b in ((out["y"], ref["y"]), (out["pair"][0], ref["pair"][0]), (out["pair"][1], ref["pair"][1])):
        assert max_err(a, b) < 1e-5


def test_new_shape_compiles_once_and_cache_is_bounded():
    mod = nn.Conv2d(2, 2, 3, padding=1).eval()
    w = cwt.wrap(mod, (rand(1, 2, 4, 4),), max_plans=2)
    with torch.no_grad():
        for s in (4, 6, 8, 6):
            x = rand(1, 2, s, s)
            assert max_err(w(x), mod(x)) < 1e-5
    assert len(w._programs) == 2
    keys = [k[1][0][0] for k in w._programs]
    assert keys == [(1, 2, 8, 8), (1, 2, 6, 6)]  # 4x4 dropped, 6x6 most recent


def test_heap_given_back_around_runs(monkeypatch):
    """Unless keep_memory is set, a compiled program's first run ends with its context's
    empty_cache, and a cpu program planning >= 32 MiB empties it again before each later
    run (what its callers freed goes back before the run's peak); a small one does not."""
    import convweave._core as core
    calls = []
    real = core.Context.empty_cache
    monkeypatch.setattr(core.Context, "empty_cache", lambda self: (calls.append(self), real(self))[1])
    mod = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1), nn.SiLU(), nn.Conv2d(32, 32, 3, padding=1)).eval()
    for shape, keep, want in (((1, 32, 256, 256), False, 3), ((1, 32, 16, 16), False, 1),
                              ((1, 32, 256, 256), True, 0)):
        w = cwt.wrap(mod, (rand(*shape),), keep_memory=keep)
        st = w.describe()["segments"][0]["plan"]
        assert (st["activations_peak"] + st["temp_predicted"] >= 32 << 20) == (shape[2] == 256)
        del calls[:]
        with torch.no_grad():
            ys = [w(rand(*shape, seed=k)) for k in range(3)]
        assert len(calls) == want, (shape, keep, len(calls))
        for k, y in enumerate(ys):
            with torch.no_grad():
                assert max_err(y, mod(rand(*shape, seed=k))) < 1e-4


def test_parameters_changed_in_place_and_replaced():
    """Half GroupNorm vectors are copied to float32: an in-place change must reach them; a
    replaced parameter (new storage) must be read from its new place."""
    gn, conv = nn.GroupNorm(2, 4), nn.Conv2d(4, 4, 3, padding=1)
    mod = Fn(lambda s, x: s.c(s.gn(x)), gn=gn, c=conv).eval().half()
    x = rand(1, 4, 6, 6).half()
    w = cwt.wrap(mod, (x,))
    with torch.no_grad():
        w(x)
        mod.gn.weight.mul_(3.0)        # in place (a LoRA merge, load_state_dict)
        mod.c.weight.add_(0.5)         # in place, read in place
        assert rel(w(x), mod(x)) < 1e-2
        mod.c.weight = nn.Parameter(torch.randn_like(mod.c.weight))  # replaced
        assert rel(w(x), mod(x)) < 1e-2
        mod.float()                     # the dtype changed (diffusers' force_upcast)
        assert rel(w(x.float()), mod(x.float())) < 1e-5


def rel(y, ref):
    return max_err(y, ref) / ref.abs().max().item()


def test_grad_mode_runs_pytorch_and_keeps_autograd():
    mod = nn.Conv2d(2, 2, 3).eval()
    x = rand(1, 2, 5, 5)
    w = cwt.wrap(mod, (x,))
    with pytest.warns(UserWarning, match="autograd stays whole"):
        y = w(x)
    y.sum().backward()
    assert mod.weight.grad is not None and mod.weight.grad.abs().sum() > 0


def test_errors():
    mod = nn.Conv2d(2, 2, 3)
    with pytest.raises(convweave.Error, match="training mode"):
        cwt.wrap(mod, (rand(1, 2, 5, 5),))
    mod.eval()
    with pytest.raises(convweave.Error, match="max_plans"):
        cwt.wrap(mod, (rand(1, 2, 5, 5),), max_plans=0)
    with pytest.raises(convweave.Error, match="budget"):
        cwt.wrap(mod, (rand(1, 2, 5, 5),), budget="lots")
    with pytest.raises(convweave.Error, match="dtype"):
        cwt.wrap(mod, (rand(1, 2, 5, 5),), dtype=torch.int8)
    with pytest.raises(convweave.Error, match="not an nn.Module"):
        cwt.wrap(lambda x: x, (rand(1),))
    w = cwt.wrap(mod, (rand(1, 2, 5, 5),))
    with pytest.raises(convweave.Error, match="meta tensor"):
        with torch.no_grad():
            w(torch.empty(1, 2, 5, 5, device="meta"))

    class DataDependent(nn.Module):
        def forward(self, x):
            return x[x > 0]
    with pytest.raises(convweave.Error, match="DataDependent: node .* data-dependent shape"):
        cwt.wrap(DataDependent().eval(), (rand(4),))

    class Mutating(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(1))

        def forward(self, x):
            self.count.add_(1)
            return x * 2
    class ExportFails(nn.Module):
        def forward(self, x):
            return torch.from_numpy(x.numpy() * 2)
    with pytest.raises(convweave.Error, match="torch.export failed on ExportFails"):
        cwt.wrap(ExportFails().eval(), (rand(4),))
    with pytest.raises(convweave.Error, match="mutates count"):
        cwt.wrap(Mutating().eval(), (rand(4),))


def test_compile_is_opaque_to_torch_compile():
    mod = nn.Conv2d(2, 2, 3).eval()
    x = rand(1, 2, 6, 6)
    w = cwt.wrap(mod, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            y = torch.compile(lambda t: w(t) * 1.0, backend="eager")(x)
    assert max_err(y, mod(x).detach()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half(dtype):
    """Half modules run in their dtype with float32 compute: at most 1.5x PyTorch's own half
    error against float64."""
    gn, c1, c2 = nn.GroupNorm(4, 8), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)
    mod = Fn(lambda s, x: s.c2(F.silu(s.gn(s.c1(x)))), gn=gn, c1=c1, c2=c2)
    w, e_cw, e_t = check_module(mod, (rand(1, 8, 12, 12),), dtype=dtype, factor=1.5, fallback=False)
    assert w.describe()["copied_bytes"] == 2 * 8 * 4  # gamma and beta as float32


def test_elementwise_family():
    """The element-wise ops of the library's generic form: unary (relu, tanh, sigmoid, gelu,
    affine, clamp), binary (mul, sub, div, max, min of two activations), per-channel shift."""
    c1, c2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)

    def f(s, x):
        a, b = s.c1(x), s.c2(x)
        h = torch.relu(a) * torch.sigmoid(b) - torch.tanh(a) / (torch.sigmoid(b) + 1.0)
        h = torch.maximum(h, F.gelu(b)) + torch.minimum(a, F.gelu(b, approximate="tanh"))
        h = 1.0 - h.clamp(-0.5, 2.0) + s.c1.bias[:, None, None] - (-h).clamp_min(0.1)
        return F.hardtanh(h, -3.0, 3.0) - s.c2.bias.view(1, 4, 1, 1)
    w, _, _ = check_module(Fn(f, c1=c1, c2=c2), (rand(2, 3, 6, 5),), fallback=False)
    assert len(w.describe()["segments"]) == 1


@pytest.mark.parametrize("scale", [(1, 2, 2), (2, 2, 2), (2, 1, 1), (1, 3, 1)])
def test_upsample_nearest_factors(scale):
    mod = Fn(lambda s, x: s.c(F.interpolate(x, scale_factor=scale, mode="nearest")), c=nn.Conv3d(2, 3, 3, padding=1))
    check_module(mod, (rand(1, 2, 3, 4, 5),), fallback=False)


def test_scalar_ops_on_an_input():
    """1 - x, x * 2, x / 4 on the module's own input (a PyTorch tensor, imported into the
    segment), as AsymmetricAutoencoderKL's masks and AutoencoderTiny's input scaling do."""
    mod = Fn(lambda s, x: s.c((1 - x) * 2.0 + x / 4.0), c=nn.Conv2d(2, 3, 3, padding=1))
    check_module(mod, (rand(1, 2, 6, 6),), fallback=False)
