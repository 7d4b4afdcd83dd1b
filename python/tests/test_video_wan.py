"""AutoencoderKLWan through convweave.diffusers.enable (wrap_coverage.py's small random
config): vae.decode and vae.encode against the vae's own frame-by-frame decode (its feature
caches carried in Python) and encode, in float64. The loop is exported whole for a fixed T,
so it unrolls into one graph."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import convweave.diffusers as cd  # noqa: E402
from video_util import build, check, decode, encode, tiled_diff, video_for  # noqa: E402


def latent(t=3, s=8):
    return torch.randn(1, 4, t, s, s, generator=torch.Generator().manual_seed(1))


def test_decode():
    vae, _ = build("wan")
    _, _, _, state, _ = check(vae, decode, latent())
    d = state.describe()
    print(f"Wan decode: {d['nodes_convweave']} nodes in convweave, {d['nodes_fallback']} in PyTorch, "
          f"{len(d['segments'])} segments")
    assert d["nodes_convweave"] > 0
    assert all(f["op"] and f["reason"] for f in d["fallbacks"])


def test_encode():
    vae, _ = build("wan")
    x = video_for(vae, latent())  # 5 frames: diffusers' loop encodes frame 0, then frames 1-4
    check(vae, encode, x)


def test_bf16_decode():
    vae, _ = build("wan")
    check(vae, decode, latent(2), dtype=torch.bfloat16, factor=1.5)


def test_streamed_programs_and_disable():
    """Wan's decode runs one latent frame per step (convweave.video): one program per cache
    kind (first chunk, second, the rest), however many frames."""
    vae, _ = build("wan")
    state = cd.enable(vae, decoder=True, encoder=False)
    assert not cd.is_enabled(vae, "encoder") and cd.is_enabled(vae, "decoder")
    with torch.no_grad():
        a = vae.decode(latent(2)).sample
        first = state.last_program
        b = vae.decode(latent(2)).sample
        assert state.last_program is first and torch.equal(a, b)
        assert state.stream.stream.describe()["programs"] == 2
        vae.decode(latent(3))
        vae.decode(latent(5))
        assert state.stream.stream.describe()["programs"] == 3
    cd.disable(vae)
    assert not cd.is_enabled(vae) and "_decode" not in vae.__dict__


def test_tiling_is_turned_off():
    vae, _ = build("wan")
    z = latent(2, 12)
    tiles = dict(tile_sample_min_height=16, tile_sample_min_width=16, tile_sample_stride_height=8,
                 tile_sample_stride_width=8)
    with torch.no_grad():
        exact = vae.decode(z).sample
    tiled_diff(vae, z, exact, **tiles)
    vae.enable_tiling(**tiles)
    with pytest.warns(RuntimeWarning, match="use_tiling off"):
        cd.enable(vae)
    with torch.no_grad():
        y = vae.decode(z).sample
    assert (y - exact).abs().max().item() <= 1e-4
    cd.disable(vae)
    assert vae.use_tiling
