"""AutoencoderKLWan through convweave.diffusers.enable (wrap_coverage.py's small random
config): vae.decode and vae.encode against the vae's own frame-by-frame decode (its feature
caches carried in Python) and encode, in float64. The loop is exported whole for a fixed T,
so it unrolls into one graph."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import convweave.diffusers as cd  # noqa: E402
from video_util import build, check, check_decode, decode, decode_tiling_turned_off, encode, latent  # noqa: E402
from video_util import video_for  # noqa: E402


def test_decode():
    check_decode("wan", latent(), "Wan")


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
    decode_tiling_turned_off(vae, latent(2, 12))
    cd.disable(vae)
    assert vae.use_tiling
