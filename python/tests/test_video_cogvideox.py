"""AutoencoderKLCogVideoX through convweave.diffusers.enable (wrap_coverage.py's small random
config): vae.decode and vae.encode against the vae's own chunked decode / encode in float64.
Its frame-chunk loop with conv caches is exported whole for a fixed T, so it unrolls."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import convweave.diffusers as cd  # noqa: E402
from video_util import build, check, check_decode, decode, decode_tiling_turned_off, encode, video_for  # noqa: E402
from video_util import latent as latent_ts  # noqa: E402


def latent(t=5, s=8):
    # 5 latent frames: two chunks of diffusers' loop (frames 0-2, then 3-4 with the first's caches)
    return latent_ts(t, s)


def test_decode():
    (_, _, _, _, cw), d = check_decode("cogvideox", latent(), "CogVideoX")
    assert cd.describe(cw) is d or cd.describe(cw) == d


def test_encode():
    vae, _ = build("cogvideox")
    x = video_for(vae, latent(3))
    check(vae, encode, x)


def test_bf16_decode():
    vae, _ = build("cogvideox")
    check(vae, decode, latent(3), dtype=torch.bfloat16, factor=1.5)


def test_streamed_programs_and_disable():
    """CogVideoX's decode runs one batch of latent frames per step (convweave.video): one
    program per cache kind and chunk shape, however many frames."""
    vae, _ = build("cogvideox")
    state = cd.enable(vae)
    with torch.no_grad():
        vae.decode(latent(3))  # one chunk of 3 frames (2 + the remainder)
        first = state.last_program
        vae.decode(latent(3))
        assert state.last_program is first and state.stream.stream.describe()["programs"] == 1
        vae.decode(latent(5))  # the same first chunk, then 2 frames with a cache
        assert state.stream.stream.describe()["programs"] == 2
        vae.decode(latent(7))  # the third chunk's caches come from a 2-frame chunk, not a 3-frame one
        assert state.stream.stream.describe()["programs"] == 3
        vae.decode(latent(9))
        assert state.stream.stream.describe()["programs"] == 3
    assert cd.is_enabled(vae)
    cd.disable(vae)
    assert not cd.is_enabled(vae) and "_decode" not in vae.__dict__ and "_encode" not in vae.__dict__


def test_tiling_is_turned_off():
    """enable() turns use_tiling off (a warning) and computes the untiled decode; disable()
    turns it back on. diffusers' tiled result's difference is printed, not judged."""
    vae, _ = build("cogvideox")
    tiles = dict(tile_sample_min_height=16, tile_sample_min_width=16, tile_overlap_factor_height=0.25,
                 tile_overlap_factor_width=0.25)  # 2 x 2 tiles whose crops add up to the image
    assert decode_tiling_turned_off(vae, latent(3, 12), tiles) is not None
    cd.disable(vae)
    assert vae.use_tiling


def test_return_dict_false_and_deepcopy():
    import copy
    vae, _ = build("cogvideox")
    cd.enable(vae)
    z = latent(3)
    with torch.no_grad():
        (y,) = vae.decode(z, return_dict=False)
        (post,) = vae.encode(video_for(vae, z), return_dict=False)
        twin = copy.deepcopy(vae)  # enabled with the same options; compiles its own plans
        assert cd.is_enabled(twin) and torch.equal(twin.decode(z).sample, y)
    assert post.mean.shape[2] == 3
