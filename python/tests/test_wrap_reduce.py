"""convweave.torch.wrap's channel broadcasts, channel reductions, powers and cat against the
module's forward in float64, with fallback=False (a node that falls back fails the test)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_wrap import Fn, rand  # noqa: E402
from wrap_util import check_module  # noqa: E402


def _convs(c_in, c, dims=2):
    conv = nn.Conv2d if dims == 2 else nn.Conv3d
    return dict(a=conv(c_in, c, 3, padding=1), b=conv(c, c, 3, padding=1))


def rms_norm(m, x):  # LTX / Wan style RMS norm over channels, between two convs
    h = m.a(x)
    h = h * torch.rsqrt(h.pow(2).mean(dim=1, keepdim=True) + 1e-6)
    return m.b(h)


def l2_normalize(m, x):  # Wan's RMS_norm: F.normalize over channels, times sqrt(C) and gamma
    h = m.a(x)
    h = F.normalize(h, dim=1) * (h.shape[1] ** 0.5) * m.gamma
    return m.b(h)


def channel_sum_mask(m, x):  # a one-channel map broadcast over C, either operand
    h = m.a(x)
    s = torch.sigmoid(h.sum(dim=1, keepdim=True))
    return m.b(s * h) - m.b(h * s)


def powers(m, x):
    h = torch.sigmoid(m.a(x)) + 0.5
    return m.b(h ** 3 + h ** 1 + torch.rsqrt(h))


def expand_one_channel(m, x):
    h = m.a(x)
    n = torch.linalg.vector_norm(h, dim=1, keepdim=True)
    return m.b(h / n.expand_as(h))


@pytest.mark.parametrize("fn", [rms_norm, l2_normalize, channel_sum_mask, powers, expand_one_channel])
@pytest.mark.parametrize("dims", [2, 3])
def test_channel_ops(fn, dims):
    torch.manual_seed(0)
    mods = _convs(3, 6, dims)
    mod = Fn(fn, **mods)
    mod.gamma = nn.Parameter(torch.randn(6, *([1] * dims)))
    shape = (1, 3, 9, 7) if dims == 2 else (1, 3, 4, 6, 5)
    check_module(mod, (rand(*shape),), fallback=False, budget="1MiB")


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("dims", [2, 3])
def test_cat(dim, dims):
    torch.manual_seed(0)
    conv = nn.Conv2d if dims == 2 else nn.Conv3d
    mod = Fn(lambda m, x: m.c(torch.cat([m.a(x), m.b(x), m.a(x) * 2], dim=dim)),
             a=conv(2, 4, 3, padding=1), b=conv(2, 4, 3, padding=1), c=conv(12 if dim == 1 else 4, 3, 3, padding=1))
    shape = (1, 2, 8, 6) if dims == 2 else (1, 2, 3, 6, 5)
    check_module(mod, (rand(*shape),), fallback=False, budget="1MiB")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rms_norm_half(dtype):
    torch.manual_seed(0)
    mod = Fn(rms_norm, **_convs(3, 6, 3))
    check_module(mod, (rand(1, 3, 4, 6, 5),), dtype=dtype, fallback=False, budget="1MiB")
