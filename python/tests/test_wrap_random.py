"""Random conv-heavy modules built from the op set of diffusers' autoencoders (convs of any
kernel, stride, dilation, padding and groups, zero pads, GroupNorm, SiLU, residuals, nearest
upsampling, average pools, scalar scales, linear over channels, single-head attention
through views, and ops convweave does not have, which fall back to PyTorch): each exported,
wrapped and compared with its own forward in float64. CW_TEST_SEED=... reruns one seed."""
import os
import random

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from wrap_util import check_module  # noqa: E402

N_MODULES = 200
SEED = int(os.environ.get("CW_TEST_SEED", "1234"))


class RandNet(nn.Module):
    """A random chain of layers; `plan` lists them as (kind, argument) and forward follows it."""

    def __init__(self, rng, c, h, w):
        super().__init__()
        self.mods, self.plan = nn.ModuleList(), []
        for _ in range(rng.randint(2, 7)):
            step = self._pick(rng, c, h, w)
            if step is None:
                continue
            kind, arg, mods, (c, h, w) = step
            self.plan.append((kind, arg, len(self.mods)))
            self.mods.extend(mods)
        self.out_shape = (c, h, w)

    @staticmethod
    def _pick(rng, c, h, w):
        kind = rng.choice(["conv", "conv", "conv", "gn", "silu", "res", "up", "pool", "scale", "attn", "padconv",
                           "linear", "fallback"])
        if kind == "conv":
            k, s, d = rng.choice([1, 3, 3, 5]), rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
            p = rng.randint(0, d * (k - 1))
            c2 = rng.randint(1, 8)
            g = rng.choice([g for g in (1, 2, 4) if c % g == 0 and c2 % g == 0])
            ho, wo = (h + 2 * p - d * (k - 1) - 1) // s + 1, (w + 2 * p - d * (k - 1) - 1) // s + 1
            if ho < 1 or wo < 1:
                return None
            return kind, None, [nn.Conv2d(c, c2, k, s, p, d, g, bias=rng.random() < 0.8)], (c2, ho, wo)
        if kind == "gn":
            g = rng.choice([g for g in (1, 2, 4) if c % g == 0])
            return kind, None, [nn.GroupNorm(g, c, affine=rng.random() < 0.8)], (c, h, w)
        if kind == "res":
            return kind, None, [nn.Conv2d(c, c, 3, padding=1)], (c, h, w)
        if kind == "up":
            return (kind, None, [], (c, 2 * h, 2 * w)) if h * w <= 64 else None
        if kind == "pool":
            return (kind, None, [], (c, h // 2, w // 2)) if h % 2 == 0 and w % 2 == 0 else None
        if kind == "scale":
            return kind, rng.choice([0.5, 2.0, 1.0, 3.0]), [], (c, h, w)
        if kind == "attn":
            return kind, None, [nn.GroupNorm(1, c)] + [nn.Linear(c, c) for _ in range(4)], (c, h, w)
        if kind == "padconv":
            pad = tuple(rng.randint(0, 2) for _ in range(4))
            ho, wo = h + pad[2] + pad[3] - 2, w + pad[0] + pad[1] - 2
            return (kind, pad, [nn.Conv2d(c, c, 3)], (c, ho, wo)) if ho >= 1 and wo >= 1 else None
        if kind == "linear":
            c2 = rng.randint(1, 8)
            return kind, None, [nn.Linear(c, c2)], (c2, h, w)
        return kind, rng.choice(["sin", "tanh", "relu"]), [], (c, h, w)  # silu and fallback

    def forward(self, x):
        m = self.mods
        for kind, arg, i in self.plan:
            if kind in ("conv", "gn"):
                x = m[i](x)
            elif kind == "silu":
                x = F.silu(x)
            elif kind == "res":
                x = x + m[i](F.silu(x))
            elif kind == "up":
                x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            elif kind == "pool":
                x = F.avg_pool2d(x, 2)
            elif kind == "scale":
                x = x / arg
            elif kind == "attn":
                b, c, h, w = x.shape
                t = m[i](x).view(b, c, h * w).transpose(1, 2)
                q, k, v = (m[i + j](t).view(b, -1, 1, c).transpose(1, 2) for j in (1, 2, 3))
                a = F.scaled_dot_product_attention(q, k, v)
                x = m[i + 4](a.transpose(1, 2).reshape(b, -1, c)).transpose(-1, -2).reshape(b, c, h, w) + x
            elif kind == "padconv":
                x = m[i](F.pad(x, arg))
            elif kind == "linear":
                x = m[i](x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            else:
                x = getattr(torch, arg)(x)
        return x


def test_random_modules():
    rng = random.Random(SEED)
    stats = {"cw": 0, "fallback": 0, "segments": 0}
    for i in range(N_MODULES):
        c, h, w = rng.randint(1, 8), rng.randint(3, 12), rng.randint(3, 12)
        torch.manual_seed(rng.randint(0, 1 << 30))
        net = RandNet(rng, c, h, w)
        x = torch.randn(rng.choice([1, 2]), c, h, w)
        try:
            wrapped, _, _ = check_module(net, (x,), factor=8.0, budget=rng.choice([None, "64KiB", "1MiB"]),
                                         streams=rng.choice([1, 2, 3]))
        except AssertionError as e:
            raise AssertionError(f"module {i} (CW_TEST_SEED={SEED}): {net.plan} on {tuple(x.shape)}: {e}") from None
        d = wrapped.describe()
        stats["cw"] += d["nodes_convweave"]
        stats["fallback"] += d["nodes_fallback"]
        stats["segments"] += len(d["segments"])
    print(f"{N_MODULES} modules: {stats}")
    assert stats["cw"] > 4 * stats["fallback"]  # most nodes run in convweave
