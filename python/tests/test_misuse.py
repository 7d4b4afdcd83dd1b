"""convweave.diffusers under the misuse of issue 25: nothing silently wrong (parameters
changed in place or recast after enable(), as SDXL's force_upcast does), gradients never
cut, no memory held between calls, bounded plan caches, refusals at enable() naming the
module, copies and pickles of an enabled vae, torch.compile without stray tracebacks."""
import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import convweave
import convweave.diffusers as cd
from conftest import rel_err

pytest.importorskip("diffusers")


def decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


def _perturb(vae, scale):
    """Every parameter moved a little (as a LoRA merge or a new checkpoint would)."""
    g = torch.Generator().manual_seed(99)
    return {k: v + scale * torch.randn(v.shape, generator=g).to(v.dtype) * v.float().abs().mean().to(v.dtype)
            for k, v in vae.state_dict().items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_parameters_changed_in_place_are_seen(make_vae, dtype):
    """load_state_dict and an in-place merge change the next decode exactly as a fresh
    enable() on the changed model decodes (the half model's GroupNorm copies refreshed)."""
    vae = make_vae("tiny", 4).to(dtype)
    z = torch.randn(1, 4, 8, 8).to(dtype)
    cd.enable(vae, budget="8MiB")
    decode(vae, z)
    vae.load_state_dict(_perturb(vae, 0.5))
    with torch.no_grad():  # a merge into GroupNorm's vectors alone
        vae.decoder.up_blocks[0].resnets[0].norm1.weight.mul_(1.5)
        vae.decoder.conv_norm_out.bias.add_(0.25)
    after = decode(vae, z)
    assert len(vae.decoder._convweave.plans) == 1  # read in place, not recompiled
    fresh = make_vae("tiny", 4).to(dtype)
    fresh.load_state_dict(vae.state_dict())
    cd.enable(fresh, budget="8MiB")
    assert torch.equal(after, decode(fresh, z))
    cd.disable(vae)
    ref = decode(vae, z)
    assert rel_err(after.float(), ref.float()) <= (1e-5 if dtype == torch.float32 else 2e-2)


def test_force_upcast_path(make_vae):
    """SDXL fp16: vae.to(float32), decode a float32 latent, vae.to(float16) again; the latent
    follows post_quant_conv's dtype as the pipeline does. No false error, diffusers' values."""
    vae = make_vae("tiny", 2).to(torch.float16)
    z = torch.randn(1, 4, 8, 8)
    cd.enable(vae, budget="8MiB")
    decode(vae, z.half())
    for _ in range(2):
        vae.to(dtype=torch.float32)
        latents = z.to(next(iter(vae.post_quant_conv.parameters())).dtype)
        out = decode(vae, latents)
        assert out.dtype == torch.float32
        cd.disable(vae)
        ref = decode(vae, latents)
        cd.enable(vae, budget="8MiB")
        assert rel_err(out, ref) <= 1e-5
        vae.to(dtype=torch.float16)
        assert decode(vae, z.half()).dtype == torch.float16
    assert len(vae.decoder._convweave.plans) <= 4
    with pytest.raises(convweave.Error, match="latent is torch.float32, the decoder's parameters torch.float16"):
        with torch.no_grad():
            vae.decoder(z)  # a true error: torch refuses it too


def _outcome(f):
    try:
        return f()
    except RuntimeError as e:
        return e


def test_partial_upcast_runs_in_pytorch(make_vae):
    """Older diffusers' upcast_vae: vae.to(float32), then post_quant_conv, decoder.conv_in and
    decoder.mid_block back to float16 (older Decoder.forward cast before the up blocks). One
    graph has one dtype, so PyTorch runs it (warned once): diffusers' values, or diffusers'
    own error where this diffusers' Decoder refuses mixed dtypes."""
    vae = make_vae("tiny", 5).to(torch.float16)
    z = torch.randn(1, 4, 8, 8).half()
    cd.enable(vae, budget="8MiB")
    decode(vae, z)
    vae.to(torch.float32)
    for m in (vae.post_quant_conv, vae.decoder.conv_in, vae.decoder.mid_block):
        m.to(torch.float16)
    with pytest.warns(RuntimeWarning, match=r"several dtypes \(decoder\.up_blocks"):
        got = _outcome(lambda: decode(vae, z))
    cd.disable(vae)
    ref = _outcome(lambda: decode(vae, z))
    if isinstance(ref, Exception):
        assert type(got) is type(ref) and str(got) == str(ref)
    else:
        assert torch.equal(got, ref)


def test_gradients_flow_through_pytorch(make_vae):
    vae = make_vae("tiny", 1)
    ref_vae = make_vae("tiny", 1)
    z = torch.randn(1, 4, 8, 8)
    cd.enable(vae, budget="8MiB")
    with pytest.warns(RuntimeWarning, match="ran in PyTorch"):
        vae.decode(z).sample.square().mean().backward()
    ref_vae.decode(z).sample.square().mean().backward()
    params = dict(vae.decoder.named_parameters())
    got = [n for n, p in params.items() if p.grad is not None]
    assert len(got) == len(params) > 0
    for n, p in ref_vae.decoder.named_parameters():
        torch.testing.assert_close(params[n].grad, p.grad)
    zg = z.clone().requires_grad_()  # an input requiring grad, parameters frozen
    vae.requires_grad_(False)
    vae.decode(zg).sample.sum().backward()
    assert zg.grad is not None and zg.grad.abs().sum() > 0
    with torch.no_grad():  # and convweave again where no gradient is wanted
        vae.decode(z)
    assert cd.last_plan(vae) is not None


def test_no_memory_held_between_calls_and_bounded_plans(make_vae):
    vae = make_vae("tiny", 0)
    st = cd.enable(vae, budget="2MiB", max_plans=2)
    for side in (4, 6, 8, 10, 12):
        decode(vae, torch.randn(1, 4, side, side))
        m = st.ctx.memory_stats()
        assert m["activations_bytes_current"] == 0 and m["reserved_bytes_current"] == 0, m
    assert len(st.plans) == 2  # the two most recent sizes
    assert [k[0][2] for k in st.plans] == [10, 12]
    x = torch.rand(1, 3, 32, 32) * 2 - 1
    with torch.no_grad():
        vae.encode(x)  # an img2img encode: its plan holds nothing through the denoising loop
    m = st.ctx.memory_stats()
    assert m["activations_bytes_current"] == 0 and m["reserved_bytes_current"] == 0
    st = cd.enable(vae, budget="2MiB", keep_memory=True)
    decode(vae, torch.randn(1, 4, 8, 8))
    m = st.ctx.memory_stats()
    assert m["activations_bytes_current"] > 0 and m["reserved_bytes_current"] > 0
    cd.last_plan(vae).release()
    m = st.ctx.memory_stats()
    assert m["activations_bytes_current"] == 0 and m["reserved_bytes_current"] == 0
    for bad in (0, -1, 1.5, True):
        with pytest.raises(convweave.Error, match="max_plans"):
            cd.enable(vae, max_plans=bad)
    with pytest.raises(convweave.Error, match="threads=-1"):
        cd.enable(vae, threads=-1)
    with pytest.raises(convweave.Error, match=r"batch of 0"):
        decode(vae, torch.randn(0, 4, 8, 8))


def test_enable_refuses_what_it_cannot_run(make_vae):
    from diffusers import AsymmetricAutoencoderKL
    asym = AsymmetricAutoencoderKL(down_block_out_channels=(8, 8), up_block_out_channels=(8, 8),
                                   down_block_types=("DownEncoderBlock2D",) * 2,
                                   up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4).eval()
    with pytest.raises(convweave.Error, match=r"CW_ERR_UNSUPPORTED: .*AsymmetricAutoencoderKL\.decoder: "
                                              r"MaskConditionDecoder"):
        cd.enable(asym)
    assert not cd.is_enabled(asym)
    cd.enable(asym, decoder=False)  # its encoder is AutoencoderKL's
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    with torch.no_grad():
        got = asym.encode(x).latent_dist.mean
        cd.disable(asym)
        assert rel_err(got, asym.encode(x).latent_dist.mean) <= 1e-5
    vae = make_vae("tiny", 0)  # a layout the builder does not foresee: Error, not AttributeError
    del vae.decoder.mid_block.resnets[0].time_emb_proj
    with pytest.raises(convweave.Error, match=r"CW_ERR_UNSUPPORTED: .*AutoencoderKL\.decoder: cannot map Decoder "
                                              r"\(.*AttributeError: .*time_emb_proj"):
        cd.enable(vae)
    assert not cd.is_enabled(vae)
    from diffusers import AutoencoderKLHunyuanVideo
    hv = AutoencoderKLHunyuanVideo(block_out_channels=(8, 8, 8, 8), norm_num_groups=4, layers_per_block=1)
    # the whole video vae is enabled (test_video_hunyuanvideo.py); its bare 3-D decoder is not a Decoder
    with pytest.raises(convweave.Error, match=r"CW_ERR_UNSUPPORTED: .*HunyuanVideoDecoder3D"):
        cd.enable(hv.decoder)
    assert not cd.is_enabled(hv.decoder)


def test_deepcopy_pickle_and_torch_save_of_an_enabled_vae(make_vae):
    vae = make_vae("tiny", 3)
    z = torch.randn(1, 4, 8, 8)
    cd.enable(vae, budget="4MiB", streams=3)
    ref = decode(vae, z)
    buf = io.BytesIO()
    torch.save(vae, buf)
    buf.seek(0)
    copies = [copy.deepcopy(vae), pickle.loads(pickle.dumps(vae)), torch.load(buf, weights_only=False)]
    for c in copies:
        assert cd.is_enabled(c, "decoder") and cd.is_enabled(c, "encoder")
        st = c.decoder._convweave
        assert st.module is c.decoder and st.budget == 4 << 20 and st.streams == 3 and not st.plans
        assert torch.equal(decode(c, z), ref)
        with torch.no_grad():
            c.decoder.conv_out.bias.add_(1)  # the copy has its own parameters
        assert rel_err(decode(c, z) - 1, ref) <= 1e-5
    assert torch.equal(decode(vae, z), ref)
    for obj in (vae.decoder._convweave.ctx, cd.last_plan(vae)):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(obj)


def test_torch_compile_is_opaque_and_quiet(tmp_path):
    """torch.compile of an enabled vae's decode: the convweave forward is a graph break
    (torch.compiler.disable), the values are convweave's, and no "Exception ignored"
    traceback reaches stderr, at the call or at exit."""
    script = tmp_path / "compile.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        import torch
        from conftest import _bench_module
        import convweave.diffusers as cd
        vae = _bench_module().build_vae("tiny", 0)
        z = torch.randn(1, 4, 8, 8)
        cd.enable(vae, budget="4MiB")
        with torch.no_grad():
            ref = vae.decode(z).sample
            f = torch.compile(lambda x: vae.decode(x).sample * 2, backend="eager")
            t0 = time.perf_counter()
            out = f(z)
            dt = time.perf_counter() - t0
        assert torch.equal(out, ref * 2)
        print(f"first compiled call {{dt:.2f}} s")
    """))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Exception ignored" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    print(r.stdout.strip())
