"""What the video VAE tests share (test_video_*.py): bench/wrap_coverage.py's small random
configs, and decode / encode through convweave.diffusers.enable judged against the same
vae's own method in float64, with wrap_util's tolerance (factor x PyTorch's own error in the
dtype, or a few ulps of the output's scale where PyTorch happens to be exact)."""
import copy
import importlib.util
import os
import warnings

import torch

from conftest import ROOT
from wrap_util import EPS, max_err


def _coverage():
    spec = importlib.util.spec_from_file_location("wrap_coverage", os.path.join(ROOT, "bench", "wrap_coverage.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(name, **override):
    """(a fresh eval-mode random vae of wrap_coverage's config `name`, its example latent)."""
    make, inputs = _coverage().models()[name]
    torch.manual_seed(0)
    vae = make().eval()
    for k, v in override.items():
        setattr(vae, k, v)
    return vae, inputs[0]


def decode(vae, z):
    from diffusers.models.autoencoders.vae import DecoderOutput
    out = vae.decode(z)
    assert isinstance(out, DecoderOutput), type(out)
    return out.sample


def encode(vae, x):
    from diffusers.models.autoencoders.autoencoder_kl import AutoencoderKLOutput
    out = vae.encode(x)
    assert isinstance(out, AutoencoderKLOutput), type(out)
    return out.latent_dist.parameters


def check(vae, call, inp, dtype=torch.float32, factor=4.0, ref=None, **enable_opts):
    """Runs call(vae, inp) with vae enabled in dtype, PyTorch's own in dtype and in float64
    (ref(vae) prepares the reference copies: tiling switches), asserts convweave's error vs
    float64 is within tolerance; returns (convweave result, its error, PyTorch's, the
    enabled vae's state)."""
    import convweave.diffusers as cd
    t = copy.deepcopy(vae).to(dtype)
    t64 = copy.deepcopy(vae).double()
    for r in (t, t64):
        (ref or (lambda v: None))(r)
    cw = copy.deepcopy(vae).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # enable() turning a switch off
        state = cd.enable(cw, **enable_opts)
    x = inp.to(dtype)
    with torch.no_grad():
        y, yt, y64 = call(cw, x), call(t, x), call(t64, inp.double())
    e_cw, e_t = max_err(y, y64), max_err(yt, y64)
    scale = max(1.0, y64.abs().max().item())
    # wrap_util's floor for float32; for a half dtype only 2 ulps, so 1.5x PyTorch's error binds
    tol = max(factor * e_t, (64 if dtype == torch.float32 else 2) * EPS[dtype] * scale)
    print(f"{type(vae).__name__} {getattr(call, '__name__', '')} {dtype}: convweave {e_cw:.3g}, PyTorch {e_t:.3g} "
          f"(tol {tol:.3g})")
    assert y.dtype == yt.dtype and y.shape == yt.shape
    assert e_cw <= tol, f"convweave's error {e_cw:.3g} > {tol:.3g} (PyTorch's {e_t:.3g}, scale {scale:.3g})"
    return y, e_cw, e_t, state, cw


def video_for(vae, z):
    """A video of the shape vae.decode(z) gives (the encoder's input), values in [-1, 1]."""
    with torch.no_grad():
        shape = vae.decode(z).sample.shape
    return torch.rand(shape, generator=torch.Generator().manual_seed(2)) * 2 - 1


def tiled_diff(vae, z, exact, **tiling):
    """Prints (does not assert) how far diffusers' tiled decode of z is from `exact`."""
    v = copy.deepcopy(vae)
    v.enable_tiling(**tiling)
    with torch.no_grad():
        y = v.decode(z).sample
    if y.shape != exact.shape:  # diffusers' tile arithmetic does not fit every size
        print(f"{type(vae).__name__} diffusers' tiled decode {tuple(z.shape)} ({tiling}) gives {tuple(y.shape)}, "
              f"the untiled one {tuple(exact.shape)}")
        return None
    d = max_err(y, exact)
    print(f"{type(vae).__name__} diffusers' tiled decode {tuple(z.shape)} ({tiling}) differs from the exact one by "
          f"max|diff| {d:.3g}")
    return d


def latent(t=3, s=8):
    """A latent [1, 4, t, s, s] from seed 1 (3 frames of 8 x 8 unless told)."""
    return torch.randn(1, 4, t, s, s, generator=torch.Generator().manual_seed(1))


def check_decode(name, z, label):
    """check() of the decode of z by wrap_coverage's vae `name`; prints what ran where and asserts
    convweave ran nodes and each fallback names its op and reason. Returns (check's result,
    the state's describe())."""
    vae, _ = build(name)
    res = check(vae, decode, z)
    d = res[3].describe()
    print(f"{label} decode: {d['nodes_convweave']} nodes in convweave, {d['nodes_fallback']} in PyTorch, "
          f"{len(d['segments'])} segments")
    assert d["nodes_convweave"] > 0 and len(d["segments"]) >= 1
    assert all(f["op"] and f["reason"] for f in d["fallbacks"])
    return res, d


STRIDE_TILES = dict(tile_sample_min_height=16, tile_sample_min_width=16, tile_sample_stride_height=8,
                    tile_sample_stride_width=8)


def decode_tiling_turned_off(vae, z, tiles=STRIDE_TILES, prepare=lambda v: None):
    """Decodes z with diffusers' tiling (tiles) switched on (prepare(vae) may switch more) through
    convweave.diffusers.enable, which turns use_tiling off (a warning) and computes the untiled
    decode (asserted within 1e-4). Leaves vae enabled; returns tiled_diff of diffusers' own tiled
    decode (printed, not judged)."""
    import pytest

    import convweave.diffusers as cd
    with torch.no_grad():
        exact = vae.decode(z).sample
    d = tiled_diff(vae, z, exact, **tiles)
    prepare(vae)
    vae.enable_tiling(**tiles)
    with pytest.warns(RuntimeWarning, match="use_tiling off"):
        cd.enable(vae)
    assert not vae.use_tiling
    with torch.no_grad():
        y = vae.decode(z).sample
    assert (y - exact).abs().max().item() <= 1e-4
    return d
