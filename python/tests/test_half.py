"""A float16 / bfloat16 VAE: enable() builds a half-precision plan (f32 arithmetic, one
rounding per stored activation). The accuracy contract of issue 13: convweave's error
against a float64 decode of the same weights is at most 1.5x torch's own half-precision
error against it."""
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

import convweave.diffusers as cd  # noqa: E402


def _err(out, ref):
    return ((out.double() - ref).abs().max() / ref.abs().max()).item()


def _half_case(make_vae, dtype, part, seed):
    """(convweave's error, torch's error) vs float64, and the plan, for one part."""
    ref_vae = make_vae("tiny", seed).double()
    half = make_vae("tiny", seed).to(dtype)
    gen = torch.Generator().manual_seed(seed + 7)
    if part == "decoder":
        inp = torch.randn(1, 4, 8, 8, generator=gen)
        run = lambda v, x: v.decoder(x)  # noqa: E731
    else:
        inp = torch.rand(1, 3, 32, 32, generator=gen) * 2 - 1
        run = lambda v, x: v.encoder(x)  # noqa: E731
    with torch.no_grad():
        ref = run(ref_vae, inp.double())
        theirs = run(half, inp.to(dtype))
        cd.enable(half, budget="1MiB", streams=2, encoder=part == "encoder", decoder=part == "decoder")
        ours = run(half, inp.to(dtype))
        plan = cd.last_plan(half, part)
        cd.disable(half)
    assert ours.dtype == dtype and ours.shape == ref.shape
    return _err(ours, ref), _err(theirs, ref), plan


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("part", ["decoder", "encoder"])
def test_half_vs_float64(make_vae, dtype, part):
    worst = 0.0
    for seed in range(3):
        ours, theirs, plan = _half_case(make_vae, dtype, part, seed)
        # unit roundoff: 2^-11 (f16), 2^-8 (bf16); a decode's error is a few of them
        u = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
        assert ours < 64 * u, (seed, ours)
        assert ours <= 1.5 * theirs, (seed, ours, theirs)
        worst = max(worst, ours / theirs)
        st = plan.stats()
        assert st["temp_peak"] <= 1 << 20
    print(f"{part} {dtype}: worst convweave/torch error ratio vs float64 {worst:.3f}")


def test_half_plan_halves_activations(make_vae):
    """The same decoder in bfloat16 holds half the activation bytes of float32."""
    peaks = {}
    for dtype in (torch.float32, torch.bfloat16):
        vae = make_vae("tiny", 0).to(dtype)
        cd.enable(vae, budget="1MiB", streams=2, encoder=False)
        with torch.no_grad():
            vae.decoder(torch.randn(1, 4, 16, 16).to(dtype))
        peaks[dtype] = cd.last_plan(vae).stats()["activations_live_peak"]
        cd.disable(vae)
    assert peaks[torch.bfloat16] * 2 == peaks[torch.float32], peaks


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conv2d_half(dtype):
    """convweave.torch.conv2d on half tensors: f32 arithmetic, one rounding; against a
    float64 reference on the stored (rounded) inputs, within a bound derived from the
    dtype: half an ulp of the output plus the f32 accumulation."""
    import convweave.torch as ct
    gen = torch.Generator().manual_seed(3)
    for groups, stride, pad in ((1, 1, 1), (2, 2, 0), (4, 1, 2)):
        x = torch.randn(2, 8, 19, 17, generator=gen).to(dtype)
        w = torch.randn(8, 8 // groups, 3, 3, generator=gen).to(dtype)
        b = torch.randn(8, generator=gen).to(dtype)
        y = ct.conv2d(x, w, b, stride=stride, padding=pad, groups=groups, budget="64KiB")
        ref = torch.nn.functional.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=pad,
                                         groups=groups)
        assert y.dtype == dtype and y.shape == ref.shape
        u = 2.0 ** -11 if dtype == torch.float16 else 2.0 ** -8
        k = 9 * 8 // groups + 1
        absdot = torch.nn.functional.conv2d(x.double().abs(), w.double().abs(), b.double().abs(), stride=stride,
                                            padding=pad, groups=groups)
        bound = u * ref.abs() + 1.01 * k * 2.0 ** -24 * absdot + 1e-30
        assert ((y.double() - ref).abs() <= bound).all(), ((y.double() - ref).abs() / bound).max().item()
