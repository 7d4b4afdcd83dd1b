"""AutoencoderKLLTXVideo through convweave.diffusers.enable (wrap_coverage.py's small random
config): vae.decode and vae.encode against the vae's own untiled decode and encode in
float64 (no timestep conditioning, no noise injection: the released 0.9.0 layout)."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import convweave.diffusers as cd  # noqa: E402
from video_util import build, check, check_decode, decode, decode_tiling_turned_off, encode, latent  # noqa: E402
from video_util import video_for  # noqa: E402


def test_decode():
    check_decode("ltx", latent(), "LTX")


def test_encode():
    vae, _ = build("ltx")
    x = video_for(vae, latent())
    check(vae, encode, x)


def test_bf16_decode():
    vae, _ = build("ltx")
    check(vae, decode, latent(2), dtype=torch.bfloat16, factor=1.5)


def test_signature_cache_and_disable():
    vae, _ = build("ltx")
    state = cd.enable(vae, decoder=True, encoder=False)
    assert not cd.is_enabled(vae, "encoder") and cd.is_enabled(vae, "decoder")
    with torch.no_grad():
        a = vae.decode(latent(2)).sample
        first = state.last_program
        b = vae.decode(latent(2)).sample
        assert state.last_program is first and len(state.plans) == 1 and torch.equal(a, b)
        vae.decode(latent(3))
        assert len(state.plans) == 2
    cd.disable(vae)
    assert not cd.is_enabled(vae) and "_decode" not in vae.__dict__


def test_tiling_is_turned_off():
    vae, _ = build("ltx")

    def framewise(v):  # LTX's own switch; exact=True turns it off as well
        v.use_framewise_decoding = True

    decode_tiling_turned_off(vae, latent(2, 12), prepare=framewise)
    assert not vae.use_framewise_decoding
    cd.disable(vae)
    assert vae.use_tiling and vae.use_framewise_decoding

