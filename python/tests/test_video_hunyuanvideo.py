"""AutoencoderKLHunyuanVideo through convweave.diffusers.enable (wrap_coverage.py's small
random config). diffusers turns framewise decoding on by default: a decode of more than
tile_sample_min_num_frames // 4 = 4 latent frames blends overlapping temporal windows.
enable(exact=True), the default, computes the true un-windowed decode (checked against the
vae's own decode with framewise off, in float64); exact=False diffusers' windowed one."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import convweave.diffusers as cd  # noqa: E402
from video_util import build, check, decode, encode, video_for  # noqa: E402
from wrap_util import max_err  # noqa: E402


def latent(t=2, s=4):
    return torch.randn(1, 4, t, s, s, generator=torch.Generator().manual_seed(1))


def untiled(v):
    v.use_framewise_decoding = v.use_framewise_encoding = False


def test_decode():
    vae, _ = build("hunyuanvideo")
    _, _, _, state, _ = check(vae, decode, latent(), ref=untiled)
    d = state.describe()
    print(f"HunyuanVideo decode: {d['nodes_convweave']} nodes in convweave, {d['nodes_fallback']} in PyTorch, "
          f"{len(d['segments'])} segments")
    assert d["nodes_convweave"] > 0


def test_decode_past_the_framewise_window():
    """6 latent frames: exact=True gives the un-windowed decode (diffusers' own default,
    framewise, differs: printed); exact=False gives diffusers' framewise result."""
    vae, _ = build("hunyuanvideo")
    z = latent(6, 2)
    y, _, _, _, cw = check(vae, decode, z, ref=untiled)
    assert cw.use_framewise_decoding is False
    cd.disable(cw)
    assert cw.use_framewise_decoding is True  # restored
    with torch.no_grad():
        framewise = vae.decode(z).sample
    print(f"HunyuanVideo: diffusers' default (framewise) decode of {tuple(z.shape)} differs from the un-windowed one "
          f"by max|diff| {max_err(framewise, y):.3g}")
    check(vae, decode, z, exact=False)  # reference: the vae's own default, framewise


def test_encode():
    vae, _ = build("hunyuanvideo")
    check(vae, encode, video_for(vae, latent()), ref=untiled)


def test_bf16_decode():
    vae, _ = build("hunyuanvideo")
    check(vae, decode, latent(), dtype=torch.bfloat16, factor=1.5, ref=untiled)


def test_signature_cache_and_disable():
    vae, _ = build("hunyuanvideo")
    state = cd.enable(vae)
    with torch.no_grad():
        vae.decode(latent())
        first = state.last_program
        vae.decode(latent())
        assert state.last_program is first and len(state.plans) == 1
        vae.decode(latent(3))
        assert len(state.plans) == 2
        post = vae.encode(video_for(vae, latent())).latent_dist
    assert post.mean.shape == (1, 4, 2, 4, 4)
    assert cd.describe(vae, "encoder")["nodes_convweave"] > 0
    cd.disable(vae)
    assert not cd.is_enabled(vae) and vae.use_framewise_decoding and vae.use_framewise_encoding
