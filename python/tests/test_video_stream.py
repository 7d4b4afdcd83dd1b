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


class _CausalStep(torch.nn.Module):
    """A causal conv step as diffusers' Wan writes it: the new cache (the last 2 frames of h)
    taken before the conv that reads the old one, a conv of the old cache too."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a = torch.nn.Conv3d(3, 4, 3, padding=1)
        self.b = torch.nn.Conv3d(4, 4, 3, padding=(0, 1, 1))
        self.c = torch.nn.Conv3d(4, 4, 3, padding=1)

    def forward(self, x, cache):
        h = self.a(x)
        new = h[:, :, -2:].clone()
        return self.b(torch.cat([cache, h], 2)) + self.c(cache).sum(2, keepdim=True), new


def test_donated_cache():
    """wrap(donate=): the new cache is written into the old cache's tensor, which the call
    returns; the same bits as without donating, exact against float64; a tensor passed twice
    is not used; the bad argument named."""
    import convweave.torch as cwt
    step = _CausalStep().eval()
    x, cache = torch.randn(1, 3, 4, 6, 5), torch.randn(1, 4, 2, 6, 5)
    plain = cwt.wrap(step, (x, cache), streams=3)
    given = cwt.wrap(step, (x, cache), streams=3, donate=(1,))
    d = given.describe()["donated"]
    assert len(d) == 1 and d[0]["output"] == 1 and d[0]["bytes"] == cache.numel() * 4, d
    assert plain.describe()["donated"] == []
    with torch.no_grad():
        y0, n0 = plain(x, cache)
        mine = cache.clone()
        y1, n1 = given(x, mine)
        y64, n64 = copy.deepcopy(step).double()(x.double(), cache.double())
    assert n1.data_ptr() == mine.data_ptr()  # the new cache lives in the donated tensor
    assert torch.equal(y0, y1) and torch.equal(n0, n1)
    assert max_err(y1, y64) <= 64 * EPS[torch.float32] * max(1.0, y64.abs().max().item())
    assert max_err(n1, n64) <= 64 * EPS[torch.float32] * max(1.0, n64.abs().max().item())
    with torch.no_grad():  # passed as x's storage too: not donated, nothing overwritten
        both = torch.randn(1, 4, 2, 6, 5)
        w = cwt.wrap(lambda_module(), (both, both), donate=(1,))
        keep = both.clone()
        r = w(both, both)
    assert torch.equal(both, keep) and r[1].data_ptr() != both.data_ptr()
    with pytest.raises(convweave.Error, match=r"donate='x': expected positions of forward's positional arguments"):
        cwt.wrap(step, (x, cache), donate="x")
    # a donated tensor that only PyTorch reads (torch.sin falls back) is left alone
    fb = torch.nn.Conv3d(4, 4, 3, padding=1).eval()
    w = cwt.wrap(Sin(fb).eval(), (x, cache), donate=(0, 1))
    keep = cache.clone()
    with torch.no_grad():
        y, z = w(x, cache)
        y_ref, z_ref = Sin(fb)(x, keep)
    assert torch.equal(cache, keep) and torch.equal(z, z_ref)
    assert max_err(y, y_ref.double()) <= 64 * EPS[torch.float32] * max(1.0, y_ref.abs().max().item())


class Sin(torch.nn.Module):
    def __init__(self, conv):
        super().__init__()
        self.conv = conv

    def forward(self, x, cache):
        s = torch.sin(cache)
        return self.conv(s), s


def lambda_module():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c = torch.nn.Conv3d(4, 4, 3, padding=1)

        def forward(self, a, b):
            return self.c(a), self.c(b) * 2

    return Two().eval()


def test_stream_donates_and_keeps_first():
    """The Wan step donates its old caches: the second chunk's (one-frame caches, which no
    new cache can take) go back after their last read, every later chunk's hold the new
    caches of their shapes. A first cache the caller gives is not overwritten."""
    vae = _wan()
    dec = cv.wan_decoder(vae)
    with torch.no_grad():
        dec(torch.randn(1, 4, 4, 8, 8))
    w = dec.stream.wrapped
    donated = [p.describe()["donated"] for p in w._programs.values()]
    assert len(donated) == 3 and donated[0] == [], donated
    assert donated[1] and all(d["output"] is None for d in donated[1]), donated[1]
    assert sum(d["output"] is not None for d in donated[2]) > sum(d["output"] is None for d in donated[2])
    s = cv.Stream(_CausalStep().eval(), lambda m, x, c: m(x, c), torch.randn(1, 4, 2, 6, 5))
    first = s.first.clone()
    with torch.no_grad():
        s([torch.randn(1, 3, 4, 6, 5), torch.randn(1, 3, 4, 6, 5)])
    assert torch.equal(s.first, first)


def test_stream_empties_cache_after_decode(monkeypatch):
    """A decode ends by giving back the heap its chunks' caches and outputs freed
    (Wrapped.empty_cache) unless keep_memory is set; the next decode runs the same plans
    to the same bits."""
    import convweave.front.runner as runner
    calls = []
    real = runner.Wrapped.empty_cache
    monkeypatch.setattr(runner.Wrapped, "empty_cache", lambda self: (calls.append(self), real(self))[1])
    vae = _wan()
    z = torch.randn(1, 4, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    dec = cv.wan_decoder(vae)
    with torch.no_grad():
        y0 = dec(z)
        assert len(calls) == 1 and calls[0] is dec.stream.wrapped
        y1 = dec(z)
    assert len(calls) == 2 and torch.equal(y0, y1)
    kept = cv.wan_decoder(vae, keep_memory=True)
    with torch.no_grad():
        y2 = kept(z)
    assert len(calls) == 2 and torch.equal(y0, y2)
