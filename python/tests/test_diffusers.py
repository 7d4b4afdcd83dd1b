"""convweave.diffusers.enable(vae) against the unwrapped diffusers decode: tiny and
SD-sized random-weight AutoencoderKL models, <= 1e-5 of max|ref| (docs/determinism.md);
plans cached per shape; disable() restores the module; describe/stats/trace."""
import json

import pytest
import torch

import convweave
import convweave.diffusers as cd
from conftest import rel_err

pytest.importorskip("diffusers")


def decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


def test_tiny_matches_diffusers_across_budgets_streams_and_shapes(make_vae):
    vae = make_vae("tiny", 3)
    zs = [torch.randn(1, 4, 8, 8), torch.randn(2, 4, 6, 10), torch.randn(1, 4, 5, 7)]
    refs = [decode(vae, z) for z in zs]
    # every shape under the default and the tightest setting; the odd batch-2 shape under the
    # other two (each shape is an export, ~5 s of this test's time)
    for budget, streams, patches, n in (("256MiB", 2, None, 3), ("1MiB", 3, None, 3), (None, 1, None, 1),
                                        ("64MiB", 2, 3, 1)):
        st = cd.enable(vae, budget=budget, streams=streams, patches=patches)
        some = list(zip(zs, refs))[1:1 + n] + list(zip(zs, refs))[:max(0, n - 2)]
        for z, ref in some:
            out = decode(vae, z)
            assert out.shape == ref.shape and out.dtype == torch.float32
            assert rel_err(out, ref) <= 1e-5, (budget, streams, patches, tuple(z.shape))
        assert len(st.plans) == n  # one plan per input shape
        decode(vae, some[0][0])
        assert len(st.plans) == n  # and reused
    # the same plan twice gives the same bits (contract clause 1)
    assert torch.equal(decode(vae, zs[1]), decode(vae, zs[1]))
    cd.disable(vae)
    assert not cd.is_enabled(vae) and "forward" not in vae.decoder.__dict__
    assert torch.equal(decode(vae, zs[0]), refs[0])


def test_tiny_slicing_tiling_and_return_dict(make_vae):
    vae = make_vae("tiny", 4)
    z = torch.randn(3, 4, 8, 8)
    vae.enable_slicing()
    ref = decode(vae, z)
    cd.enable(vae, budget="8MiB")
    with torch.no_grad():
        out, = vae.decode(z, return_dict=False)
    assert rel_err(out, ref) <= 1e-5
    assert len(vae.decoder._convweave.plans) == 1  # slices of one
    cd.disable(vae)
    vae.disable_slicing()
    vae.enable_tiling()
    vae.tile_latent_min_size = 4
    vae.tile_sample_min_size = 32
    z = torch.randn(1, 4, 8, 8)
    ref = decode(vae, z)
    cd.enable(vae, budget="8MiB")
    assert rel_err(decode(vae, z), ref) <= 1e-5


def test_sd_sized_matches_diffusers(make_vae):
    """The SD VAE's architecture (128-256-512-512, 32 groups) at a 16x16 latent."""
    vae = make_vae("sd", 0)
    z = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(5))
    ref = decode(vae, z)
    cd.enable(vae, budget="24MiB", streams=2)
    out = decode(vae, z)
    assert rel_err(out, ref) <= 1e-5
    plan = cd.last_plan(vae)
    s = plan.stats()
    assert 0 < s["allocated_bytes.all.peak"] <= 24 << 20
    assert s["temp_peak"] == s["allocated_bytes.all.peak"] <= s["budget"] == 24 << 20
    assert s["n_patches"] > 40  # convs were cut to fit
    assert s["weights_bytes"] == sum(p.numel() * 4 for n, p in vae.decoder.named_parameters())
    cd.disable(vae)


def test_memory_budget_recomputes_and_matches(make_vae):
    """Under memory= below what storing every activation needs, blocks recompute their
    inner activation: less activation memory, the same values within the contract."""
    vae = make_vae("sd", 0)
    z = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(6))
    ref = decode(vae, z)
    cd.enable(vae, budget="8MiB", streams=2)
    decode(vae, z)
    stored = cd.last_plan(vae).stats()
    cd.disable(vae)
    assert stored["n_recomputed"] == 0
    cd.enable(vae, budget="8MiB", streams=2, memory=stored["activations_peak"] + stored["temp_predicted"] - 1)
    out = decode(vae, z)
    s = cd.last_plan(vae).stats()
    assert s["n_recomputed"] > 0 and s["recompute_gflop"] > 0
    assert s["activations_peak"] < stored["activations_peak"]
    assert rel_err(out, ref) <= 1e-5
    cd.disable(vae)


def test_plan_describe_stats_trace(make_vae, tmp_path):
    vae = make_vae("tiny", 1)
    assert cd.last_plan(vae) is None
    st = cd.enable(vae, budget="2MiB", streams=3)
    decode(vae, torch.randn(1, 4, 8, 8))
    plan = cd.last_plan(vae)
    assert plan is st.last_plan
    text = plan.describe()
    assert text.startswith("plan: 3 stream(s)") and "predicted peak temp" in text
    js = plan.describe(json_format=True)
    assert isinstance(js, dict) and js
    s = plan.stats()
    for key in ("allocated_bytes.all.peak", "allocated_bytes.all.current", "reserved_bytes.all.peak",
                "reserved_bytes.all.current", "num_device_alloc", "num_device_free", "num_sync_all_streams",
                "allocation.all.allocated", "allocation.all.freed", "num_ooms"):
        assert isinstance(s[key], int), key
    assert s["num_sync_all_streams"] == 0 and s["num_ooms"] == 0
    assert s["n_streams"] == 3 and len(s["stream_busy_ms"]) == 3 and s["wall_ms"] > 0
    assert set(s["stage_ms"]) == {"conv", "prep", "epilogue", "stats", "attention", "other"}
    assert s["stage_ms"]["conv"] > 0 and s["stage_ms"]["attention"] > 0
    path = tmp_path / "decode.json"
    plan.write_trace(str(path))
    trace = json.loads(path.read_text())
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    assert len(events) > 10
    ctx = st.ctx
    ctx.synchronize()
    ctx.reset_peak_stats()
    m = ctx.memory_stats()
    # by default the plan gave its temporaries' arena and its activations back after the run
    assert m["reserved_bytes_current"] == 0 and m["activations_bytes_current"] == 0
    assert "<convweave decoder: budget 2.0 MiB, 3 streams, 1 plan(s)>" == repr(st)
    # keep_memory=True: the plan keeps its temporaries' arena between runs (no device
    # allocation inside a run), within the budget, and a decode adds nothing to it
    st = cd.enable(vae, budget="2MiB", streams=3, keep_memory=True)
    decode(vae, torch.randn(1, 4, 8, 8))
    ctx = st.ctx
    ctx.synchronize()
    ctx.reset_peak_stats()
    m = ctx.memory_stats()
    assert 0 < m["reserved_bytes_current"] == m["reserved_bytes_peak"] <= 2 << 20
    assert m["activations_bytes_current"] > 0
    decode(vae, torch.randn(1, 4, 8, 8))
    ctx.synchronize()
    assert ctx.memory_stats()["reserved_bytes_peak"] == m["reserved_bytes_current"]


def test_parameters_are_read_in_place(make_vae):
    """No copy of the model: a parameter changed in place changes the next decode; a
    replaced parameter (new memory) gives a new plan."""
    vae = make_vae("tiny", 2)
    z = torch.randn(1, 4, 8, 8)
    cd.enable(vae, budget="8MiB")
    before = decode(vae, z)
    with torch.no_grad():
        vae.decoder.conv_out.bias.add_(1.0)
    after = decode(vae, z)
    assert rel_err(after - 1.0, before) <= 1e-5
    cd.disable(vae)
    ref = decode(vae, z)
    cd.enable(vae, budget="8MiB")
    st = vae.decoder._convweave
    decode(vae, z)
    vae.decoder.conv_out.weight = torch.nn.Parameter(vae.decoder.conv_out.weight.detach() * 2)
    cd.disable(vae)
    ref2 = decode(vae, z)
    st = cd.enable(vae, budget="8MiB")
    assert rel_err(decode(vae, z), ref2) <= 1e-5 and not torch.equal(ref, ref2)


def test_enable_on_the_decoder_itself_and_twice(make_vae):
    vae = make_vae("tiny", 5)
    z = torch.randn(1, 4, 4, 4)
    with torch.no_grad():
        ref = vae.decoder(z)
    cd.enable(vae.decoder, budget="4MiB")
    cd.enable(vae.decoder, budget="8MiB")  # re-enabling replaces the options
    assert vae.decoder._convweave.budget == 8 << 20
    with torch.no_grad():
        assert rel_err(vae.decoder(z), ref) <= 1e-5
    cd.disable(vae)
    cd.disable(vae)  # a no-op once disabled



def test_memory_auto_bounds_the_estimated_conv_time(make_vae):
    """wrap(memory="auto:PCT"): the plan it runs is the ladder's least total whose estimated
    conv time is within PCT % of storing everything's (checked on the plan's own stats)."""
    import convweave.torch as cwt

    vae = make_vae("tiny", 0)
    z = torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = vae.decoder(z)
        seen = set()
        for pct in (0, 5, 20, 1000):
            w = cwt.wrap(vae.decoder, (z,), budget="256KiB", memory=f"auto:{pct}")
            out = w(z)
            (seg,) = [s[1] for s in w.last_program.steps if s[0] == "seg"]
            ladder = seg.g.memory_ladder(budget="256KiB", streams=2)
            st = w.last_program.plans()[0].stats()
            stored = ladder[-1]["conv_cost_ms"]
            assert stored > 0 and rel_err(out, ref) < 1e-5
            assert st["conv_cost_ms"] <= stored * (1 + pct / 100) * (1 + 1e-9), pct
            within = [p for p in ladder if p["conv_cost_ms"] <= stored * (1 + pct / 100)]
            assert st["activations_peak"] + st["temp_predicted"] <= within[0]["total_bytes"], pct
            seen.add(st["n_recomputed"])
    assert len(ladder) >= 2 and len(seen) >= 2  # the bound chose between plans


def test_memory_auto(make_vae):
    """memory="auto[:PCT]": the memory ladder's least total whose estimated conv time is at
    most PCT % above storing everything's (Graph.compile); the values do not change (recompute
    is exact)."""
    vae = make_vae("tiny", 0)
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(5))
    got = {}
    with torch.no_grad():
        ref = vae.decoder(z)
        for memory in (None, "auto:0", "auto:1000"):
            cd.enable(vae, budget="256KiB", encoder=False, memory=memory)
            got[memory] = (vae.decoder(z), cd.last_plan(vae).stats())
            cd.disable(vae)
    for memory, (out, _) in got.items():
        assert rel_err(out, ref) < 1e-5, memory
    assert got[None][1]["n_recomputed"] == 0
    assert got["auto:0"][1]["n_recomputed"] == 0  # no recompute step is free
    # every step allowed: the ladder's least, fewer activations than storing everything
    assert got["auto:1000"][1]["n_recomputed"] >= 1
    assert got["auto:1000"][1]["activations_peak"] < got[None][1]["activations_peak"]
    with pytest.raises(ValueError, match="auto:PCT"):
        cd.enable(vae, memory="auto:x")
    assert not cd.is_enabled(vae)
