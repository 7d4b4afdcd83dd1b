"""convweave.diffusers.enable(vae) on the encoder against the unwrapped diffusers encode:
tiny and SD-sized random-weight AutoencoderKL models, <= 1e-5 of max|ref|
(docs/determinism.md), for vae.encoder(x) and vae.encode(x).latent_dist; plans cached per
shape; one context and budget for both parts; encoder= / decoder= choose the parts."""
import pytest
import torch

import convweave
import convweave.diffusers as cd
from conftest import rel_err

pytest.importorskip("diffusers")


def encode(vae, x):
    with torch.no_grad():
        return vae.encode(x).latent_dist


def run_encoder(vae, x):
    with torch.no_grad():
        return vae.encoder(x)


def image(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1  # [-1, 1] as diffusers takes


def test_tiny_encoder_matches_diffusers_across_budgets_streams_and_shapes(make_vae):
    vae = make_vae("tiny", 3)
    # odd sides too: the zero row and column after the input fall where diffusers' pad puts them
    xs = [image(1, 3, 64, 64, seed=1), image(2, 3, 48, 40, seed=2), image(1, 3, 33, 37, seed=3)]
    refs = [run_encoder(vae, x) for x in xs]
    dists = [encode(vae, x) for x in xs]
    # every shape under the default and the tightest setting; the odd sides under the other
    # two (each shape is an export, most of this test's time)
    for budget, streams, patches, n in (("256MiB", 2, None, 3), ("512KiB", 3, None, 3), (None, 1, None, 1),
                                        ("64MiB", 2, 3, 1)):
        st = cd.enable(vae, budget=budget, streams=streams, patches=patches, decoder=False)
        assert isinstance(st, cd.ConvweaveEncoder) and st.module is vae.encoder
        some = list(zip(xs, refs, dists))[3 - n:]
        for x, ref, dist in some:
            out = run_encoder(vae, x)
            assert out.shape == ref.shape == (x.shape[0], 8, x.shape[2] // 8, x.shape[3] // 8)
            assert rel_err(out, ref) <= 1e-5, (budget, streams, patches, tuple(x.shape))
            d = encode(vae, x)  # quant_conv and DiagonalGaussianDistribution stay diffusers'
            assert rel_err(d.mean, dist.mean) <= 1e-5 and rel_err(d.std, dist.std) <= 1e-5
        assert len(st.plans) == n  # one plan per input shape
        run_encoder(vae, some[0][0])
        assert len(st.plans) == n  # and reused
        if budget == "512KiB":
            assert 0 < st.last_plan.stats()["temp_peak"] <= 512 << 10
    assert torch.equal(run_encoder(vae, xs[2]), run_encoder(vae, xs[2]))  # same plan, same bits
    cd.disable(vae)
    assert not cd.is_enabled(vae) and "forward" not in vae.encoder.__dict__
    assert torch.equal(run_encoder(vae, xs[0]), refs[0])


def test_sd_sized_encoder_matches_diffusers(make_vae):
    """The SD VAE's encoder (128-256-512-512, 32 groups) on a 128x128 image under a budget;
    then under memory= at the stored plan's total (activations + predicted temporaries), one
    byte below it and far below it. The encoder's largest activations are in ResNets whose
    shortcut is their own input: below the stored total those recompute their inner
    activation and write their result into their input's storage."""
    vae = make_vae("sd", 0)
    x = image(1, 3, 128, 128, seed=5)
    ref = encode(vae, x)
    cd.enable(vae, budget="16MiB", streams=2)
    out = encode(vae, x)
    assert rel_err(out.mean, ref.mean) <= 1e-5 and rel_err(out.logvar, ref.logvar) <= 1e-5
    s = cd.last_plan(vae, "encoder").stats()
    assert 0 < s["temp_peak"] == s["allocated_bytes.all.peak"] <= s["budget"] == 16 << 20
    assert s["n_patches"] > 20  # convs were cut to fit
    assert s["weights_bytes"] == sum(p.numel() * 4 for p in vae.encoder.parameters())
    assert cd.last_plan(vae) is None  # no decode yet: the decoder's plan
    floor = s["activations_peak"] + s["temp_predicted"]
    cd.enable(vae, budget="16MiB", decoder=False, memory=floor)
    out = encode(vae, x)
    assert rel_err(out.mean, ref.mean) <= 1e-5 and rel_err(out.logvar, ref.logvar) <= 1e-5
    s = cd.last_plan(vae, "encoder").stats()
    assert s["activations_peak"] + s["temp_predicted"] <= floor
    assert s["n_recomputed"] == 0
    cd.enable(vae, budget="16MiB", decoder=False, memory=floor - 1)
    out = encode(vae, x)
    assert rel_err(out.mean, ref.mean) <= 1e-5 and rel_err(out.logvar, ref.logvar) <= 1e-5
    r = cd.last_plan(vae, "encoder").stats()
    assert r["n_recomputed"] > 0 and r["recompute_gflop"] > 0
    assert r["activations_peak"] < s["activations_peak"] and r["activations_peak"] + r["temp_predicted"] < floor
    cd.enable(vae, budget="16MiB", decoder=False, memory=r["activations_peak"] // 2)
    with pytest.raises(convweave.Error, match=r"^CW_ERR_BUDGET: .*memory budget"):
        encode(vae, x)
    cd.disable(vae)


def test_encode_and_decode_share_one_context_under_one_budget(make_vae):
    vae = make_vae("tiny", 4)
    x = image(1, 3, 32, 32, seed=7)
    ref_enc = encode(vae, x).mean
    with torch.no_grad():
        ref_dec = vae.decode(ref_enc).sample
    st = cd.enable(vae, budget="1MiB", streams=3)
    assert isinstance(st, cd.ConvweaveDecoder) and cd.is_enabled(vae, "encoder") and cd.is_enabled(vae, "decoder")
    for _ in range(2):  # alternating: each plan takes the pool back for its own arena
        lat = encode(vae, x).mean
        with torch.no_grad():
            img = vae.decode(lat).sample
        assert rel_err(lat, ref_enc) <= 1e-5 and rel_err(img, ref_dec) <= 1e-5
    enc, dec = vae.encoder._convweave, vae.decoder._convweave
    assert enc.ctx is dec.ctx and enc.ctx.budget == 1 << 20
    for part in ("encoder", "decoder"):
        s = cd.last_plan(vae, part).stats()
        assert 0 < s["temp_peak"] <= 1 << 20 and s["num_ooms"] == 0
    assert cd.last_plan(vae) is dec.last_plan and cd.last_plan(vae, "encoder") is enc.last_plan
    assert enc.ctx.memory_stats()["reserved_bytes_peak"] <= 1 << 20  # the one budget, both parts
    assert repr(enc) == "<convweave encoder: budget 1.0 MiB, 3 streams, 1 plan(s)>"


def test_choose_the_parts(make_vae):
    vae = make_vae("tiny", 5)
    x, z = image(1, 3, 16, 16, seed=8), torch.randn(1, 4, 2, 2)
    cd.enable(vae, encoder=False)
    assert "forward" in vae.decoder.__dict__ and "forward" not in vae.encoder.__dict__
    assert cd.is_enabled(vae) and not cd.is_enabled(vae, "encoder") and cd.last_plan(vae, "encoder") is None
    cd.enable(vae, decoder=False)  # enabling again sets the wrapped parts anew
    assert "forward" not in vae.decoder.__dict__ and "forward" in vae.encoder.__dict__
    cd.disable(vae)
    ref = run_encoder(vae, x)
    # a bare Encoder or Decoder: its own part (the other flag does not apply)
    st = cd.enable(vae.encoder, budget="2MiB")
    assert isinstance(st, cd.ConvweaveEncoder) and "forward" not in vae.decoder.__dict__
    assert cd.is_enabled(vae.encoder) and cd.is_enabled(vae, "encoder")
    assert rel_err(run_encoder(vae, x), ref) <= 1e-5
    assert cd.last_plan(vae.encoder) is st.last_plan is not None
    cd.disable(vae.encoder)
    assert not cd.is_enabled(vae)
    with torch.no_grad():
        ref = vae.decoder(z)
    cd.enable(vae.decoder, encoder=False)
    with torch.no_grad():
        assert rel_err(vae.decoder(z), ref) <= 1e-5
    cd.disable(vae)


def test_mid_block_without_attention_and_single_z(make_vae):
    """mid_block_add_attention=False (both parts) and an Encoder with double_z=False map too."""
    from diffusers import AutoencoderKL
    from diffusers.models.autoencoders.vae import Encoder
    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4,
                        mid_block_add_attention=False).eval()
    assert vae.encoder.mid_block.attentions[0] is None
    x, z = image(1, 3, 16, 16, seed=9), torch.randn(1, 4, 8, 8)
    ref_e = encode(vae, x).mean
    with torch.no_grad():
        ref_d = vae.decode(z).sample
    cd.enable(vae, budget="1MiB")
    assert rel_err(encode(vae, x).mean, ref_e) <= 1e-5
    with torch.no_grad():
        assert rel_err(vae.decode(z).sample, ref_d) <= 1e-5
    enc = Encoder(in_channels=3, out_channels=4, down_block_types=("DownEncoderBlock2D",) * 2,
                  block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, double_z=False).eval()
    with torch.no_grad():
        ref = enc(x)
        cd.enable(enc)
        out = enc(x)
    assert out.shape == ref.shape == (1, 4, 8, 8) and rel_err(out, ref) <= 1e-5


def test_encoder_slicing_and_tiling(make_vae):
    vae = make_vae("tiny", 6)
    x = image(3, 3, 32, 32, seed=10)
    vae.enable_slicing()
    ref = encode(vae, x).mean
    cd.enable(vae, budget="4MiB")
    with torch.no_grad():
        dist, = vae.encode(x, return_dict=False)
    assert rel_err(dist.mean, ref) <= 1e-5
    assert len(vae.encoder._convweave.plans) == 1  # slices of one
    cd.disable(vae)
    vae.disable_slicing()
    vae.enable_tiling()
    vae.tile_sample_min_size = 32
    vae.tile_latent_min_size = 4
    x = image(1, 3, 64, 64, seed=11)
    ref = encode(vae, x).mean
    cd.enable(vae, budget="4MiB")
    assert rel_err(encode(vae, x).mean, ref) <= 1e-5
    assert len(vae.encoder._convweave.plans) >= 1
    cd.disable(vae)


def test_encoder_parameters_are_read_in_place(make_vae):
    vae = make_vae("tiny", 7)
    x = image(1, 3, 16, 16, seed=12)
    cd.enable(vae, budget="4MiB")
    before = run_encoder(vae, x)
    with torch.no_grad():
        vae.encoder.conv_out.bias.add_(1.0)
    assert rel_err(run_encoder(vae, x) - 1.0, before) <= 1e-5
    vae.encoder.conv_out.weight = torch.nn.Parameter(vae.encoder.conv_out.weight.detach() * 2)
    out = run_encoder(vae, x)  # new memory: a new plan
    cd.disable(vae)
    assert rel_err(out, run_encoder(vae, x)) <= 1e-5
