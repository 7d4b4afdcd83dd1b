"""convweave.video: Wan's and CogVideoX's chunked decodes as one wrapped step run chunk by
chunk (convweave.video.Stream), against the VAE's own decode in float64; the programs it
compiles do not grow with the frames; out= and callback; a wrong out."""
import copy

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import convweave  # noqa: E402
import convweave.video as cv  # noqa: E402
from wrap_util import EPS, max_err  # noqa: E402


def _wan():
    torch.manual_seed(0)
    return diffusers.AutoencoderKLWan(base_dim=16, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                                      temperal_downsample=[True]).eval()


def _cogvideox():
    torch.manual_seed(0)
    return diffusers.AutoencoderKLCogVideoX(
        block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, latent_channels=4,
        down_block_types=("CogVideoXDownBlock3D",) * 2, up_block_types=("CogVideoXUpBlock3D",) * 2,
        temporal_compression_ratio=2).eval()


def _check(vae, decoder, z):
    """decoder(z) against vae.decode in float64: within 4x PyTorch's own f32 error (or a few
    ulps where PyTorch is exact)."""
    m64 = copy.deepcopy(vae).double()
    with torch.no_grad():
        y, yt, y64 = decoder(z), vae.decode(z).sample, m64.decode(z.double()).sample
    e_cw, e_t = max_err(y, y64), max_err(yt, y64)
    assert e_cw <= max(4 * e_t, 64 * EPS[torch.float32]), (e_cw, e_t)
    return y


@pytest.mark.parametrize("frames", [1, 3])
def test_wan_decode(frames):
    vae = _wan()
    dec = cv.wan_decoder(vae)
    y = _check(vae, dec, torch.randn(1, 4, frames, 8, 8, generator=torch.Generator().manual_seed(frames)))
    assert y.shape[2] == 1 + 2 * (frames - 1)  # one temporal upsampling by 2


def test_wan_programs_do_not_grow_with_frames():
    vae = _wan()
    dec = cv.wan_decoder(vae)
    with torch.no_grad():
        dec(torch.randn(1, 4, 3, 8, 8))
        n = dec.stream.describe()["programs"]
        dec(torch.randn(1, 4, 6, 8, 8))
    d = dec.stream.describe()
    assert n == 3 and d["programs"] == 3  # first chunk, second (1-frame caches), the rest
    assert d["kinds"] == {"kind0": "kind1", "kind1": "kind2", "kind2": "kind2"}


@pytest.mark.parametrize("frames", [2, 5])
def test_cogvideox_decode(frames):
    vae = _cogvideox()
    _check(vae, cv.cogvideox_decoder(vae), torch.randn(1, 4, frames, 8, 8,
                                                        generator=torch.Generator().manual_seed(frames)))


def _check_encode(vae, encoder, x):
    m64 = copy.deepcopy(vae).double()
    with torch.no_grad():
        h = encoder(x)
        ht = vae.encode(x).latent_dist.parameters
        h64 = m64.encode(x.double()).latent_dist.parameters
    e_cw, e_t = max_err(h, h64), max_err(ht, h64)
    assert e_cw <= max(4 * e_t, 64 * EPS[torch.float32]), (e_cw, e_t)


@pytest.mark.parametrize("frames", [1, 9])
def test_wan_encode(frames):
    vae = _wan()
    _check_encode(vae, cv.wan_encoder(vae), torch.randn(1, 3, frames, 16, 16))


@pytest.mark.parametrize("frames", [5, 9])
def test_cogvideox_encode(frames):
    vae = _cogvideox()
    _check_encode(vae, cv.cogvideox_encoder(vae), torch.randn(1, 3, frames, 16, 16))


def test_out_and_callback():
    vae = _wan()
    dec = cv.wan_decoder(vae)
    z = torch.randn(1, 4, 3, 8, 8)
    with torch.no_grad():
        ref = dec(z)
        out = torch.full_like(ref, float("nan"))
        assert dec(z, out=out) is out
        got = []
        assert dec(z, callback=lambda y, t0: got.append((t0, y.clone()))) is None
    assert torch.equal(out, ref)
    assert [t0 for t0, _ in got] == [0, 1, 3]
    assert torch.equal(torch.cat([y for _, y in got], 2), ref)
    with torch.no_grad():
        with pytest.raises(convweave.Error, match="cannot take frames 0..1 of a chunk"):
            dec(z, out=torch.empty(1, 3, 5, 8, 8))
        with pytest.raises(convweave.Error, match="the chunks made 5 frames, out has 8"):
            dec(z, out=torch.empty(1, 3, 8, 16, 16))
