"""convweave.torch.conv2d / conv3d against torch.nn.functional on random small shapes:
strides, dilations, groups, paddings (ints, tuples, 'same', 'valid'), bias or none,
non-contiguous inputs and weights, unbatched inputs, budgets, fixed patchings and stream
counts; torch tensors and NumPy arrays. Each element must lie within the determinism
contract's bound 2*gamma(R+1)*S of torch's (docs/determinism.md), with S = |b| + sum|w*x|.
The seed is printed; rerun one with CW_TEST_SEED=..."""
import os
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import convweave
import convweave.torch as ct

SEED = int(os.environ.get("CW_TEST_SEED", "20261122"))
N_CASES = int(os.environ.get("CW_TEST_CASES", "560"))
U = 2.0 ** -24


def gamma(n):
    return n * U / (1 - n * U)


def bound(x, w, b, kw, spatial):
    """2*gamma(R+1)*S per output element, in float64."""
    f = F.conv2d if spatial == 2 else F.conv3d
    s = f(x.double().abs(), w.double().abs(), None if b is None else b.double().abs(), **kw)
    r = w.shape[1] * int(np.prod(w.shape[2:]))
    return 2 * gamma(r + 1) * s


def noncontiguous(t, rng):
    """The same values as t in memory of another layout: a channels-last copy, a slice of
    a wider tensor, or a strided slice of a taller one."""
    how = rng.choice(["channels_last", "wide", "step"])
    if how == "channels_last":
        fmt = torch.channels_last if t.dim() == 4 else torch.channels_last_3d
        return t.contiguous(memory_format=fmt)
    if how == "wide":
        big = torch.randn(*t.shape[:-1], t.shape[-1] + 3)
        big[..., 1:1 + t.shape[-1]] = t
        return big[..., 1:1 + t.shape[-1]]
    big = torch.randn(*t.shape[:-2], 2 * t.shape[-2], t.shape[-1])
    big[..., ::2, :] = t
    return big[..., ::2, :]


def random_case(rng, spatial):
    while True:
        g = rng.choice([1, 1, 2, 3])
        n, c, k = rng.randint(1, 3), g * rng.randint(1, 3), g * rng.randint(1, 3)
        ks = [rng.randint(1, 4 if spatial == 2 else 3) for _ in range(spatial)]
        dil = [rng.randint(1, 3) for _ in range(spatial)]
        stride = [rng.randint(1, 3) for _ in range(spatial)]
        sizes = [rng.randint(1, 14 if spatial == 2 else 7) for _ in range(spatial)]
        mode = rng.choice(["int", "tuple", "same", "valid"])
        if mode == "same":
            stride = [1] * spatial
            padding, pads = "same", [d * (kk - 1) for d, kk in zip(dil, ks)]
        elif mode == "valid":
            padding, pads = "valid", [0] * spatial
        elif mode == "int":
            p = rng.randint(0, 3)
            padding, pads = p, [2 * p] * spatial
        else:
            padding = tuple(rng.randint(0, 3) for _ in range(spatial))
            pads = [2 * p for p in padding]
        out = [(h + p - d * (kk - 1) - 1) // s + 1 for h, p, d, kk, s in zip(sizes, pads, dil, ks, stride)]
        if min(out) < 1:
            continue
        one = lambda v: v[0] if len(set(v)) == 1 and rng.random() < 0.5 else tuple(v)  # int or tuple
        kw = dict(stride=one(stride), padding=padding, dilation=one(dil), groups=g)
        return n, c, k, ks, sizes, kw


def test_random_convolutions_match_torch():
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    print(f"CW_TEST_SEED={SEED}")
    seen = {"2d": 0, "3d": 0, "noncontig": 0, "numpy": 0, "budget": 0, "fixed": 0, "same": 0, "unbatched": 0,
            "budget_errors": 0}
    for case in range(N_CASES):
        spatial = 2 if rng.random() < 0.7 else 3
        n, c, k, ks, sizes, kw = random_case(rng, spatial)
        x = torch.randn(n, c, *sizes)
        w = torch.randn(k, c // kw["groups"], *ks)
        b = torch.randn(k) if rng.random() < 0.6 else None
        ref = (F.conv2d if spatial == 2 else F.conv3d)(x, w, b, **kw)
        tol = bound(x, w, b, kw, spatial)
        xi, wi = x, w
        if rng.random() < 0.4:
            xi = noncontiguous(x, rng)
            seen["noncontig"] += 1
        if rng.random() < 0.15:
            wi = noncontiguous(w, rng)
        opts = {}
        r = rng.random()
        if r < 0.35:
            opts["budget"] = rng.choice([64 << 10, "256KiB", "1MiB", "4MiB", 1 << 20])
            seen["budget"] += 1
        elif r < 0.55:
            opts["patches"] = rng.randint(1, 4)
            seen["fixed"] += 1
        opts["streams"] = rng.choice([0, 1, 2, 3])
        unbatched = n == 1 and rng.random() < 0.2
        fn = ct.conv2d if spatial == 2 else ct.conv3d
        use_numpy = rng.random() < 0.1
        args = (xi[0] if unbatched else xi, wi, b)
        if use_numpy:
            args = tuple(None if a is None else a.numpy() for a in args)
            fn = convweave.conv2d if spatial == 2 else convweave.conv3d
        try:
            y = fn(*args, **kw, **opts)
        except convweave.Error as e:
            # a budget below what this shape needs: the library says so and names the minimum
            assert e.status == "CW_ERR_BUDGET" and "budget" in e.message, (case, e)
            seen["budget_errors"] += 1
            y = fn(*args, **kw)
        if use_numpy:
            assert isinstance(y, np.ndarray)
            y = torch.from_numpy(y)
            seen["numpy"] += 1
        if unbatched:
            assert y.shape == ref.shape[1:]
            y = y[None]
            seen["unbatched"] += 1
        seen["2d" if spatial == 2 else "3d"] += 1
        seen["same"] += kw["padding"] == "same"
        assert y.shape == ref.shape, (case, kw)
        err = (y.double() - ref.double()).abs()
        bad = err > tol
        assert not bad.any(), (f"case {case} (CW_TEST_SEED={SEED}): {spatial}-D x{tuple(x.shape)} "
                               f"w{tuple(w.shape)} {kw} {opts}: max err {err.max().item():.3g}, "
                               f"{int(bad.sum())} elements beyond the bound")
    print(seen)
    assert seen["2d"] + seen["3d"] >= 500
    for key in ("3d", "noncontig", "numpy", "budget", "fixed", "same", "unbatched"):
        assert seen[key] > 0, key


def test_empty_batch_and_keyword_forms():
    x, w = torch.randn(0, 4, 5, 5), torch.randn(6, 2, 3, 3)
    y = ct.conv2d(x, w, stride=(2, 1), padding=(1, 0), groups=2)
    assert y.shape == F.conv2d(x, w, stride=(2, 1), padding=(1, 0), groups=2).shape
    x = torch.randn(1, 3, 4, 5, 6)
    w = torch.randn(2, 3, 3, 3, 3)
    torch.testing.assert_close(ct.conv3d(input=x, weight=w, padding="same", dilation=(1, 2, 1)),
                               F.conv3d(x, w, padding="same", dilation=(1, 2, 1)), rtol=1e-5, atol=1e-5)


def test_weights_with_grad_run_in_torch_so_gradients_flow():
    """Grad mode on and something requiring grad: torch's conv runs (warned once), so the
    graph is not cut; under no_grad convweave runs and the result has no history."""
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(1, 3, 8, 8, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="requires grad"):
        y = ct.conv2d(x, conv.weight, conv.bias, padding=1)
    assert y.requires_grad
    y.square().sum().backward()
    ref_x = x.detach().clone().requires_grad_()
    conv.weight.grad = None
    ref = torch.nn.Conv2d(3, 4, 3, padding=1)
    ref.load_state_dict(conv.state_dict())
    ref(ref_x).square().sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    with torch.no_grad():
        y = ct.conv2d(x, conv.weight, conv.bias, padding=1)
    assert not y.requires_grad
    torch.testing.assert_close(y, conv(x).detach(), rtol=1e-5, atol=1e-5)


def test_budget_is_respected_and_results_do_not_change():
    x, w, b = torch.randn(1, 8, 40, 24), torch.randn(8, 8, 3, 3), torch.randn(8)
    ys = [ct.conv2d(x, w, b, padding=1, budget=bud) for bud in (None, "1MiB", "128KiB", 40 << 10)]
    for y in ys[1:]:
        assert (y - ys[0]).abs().max() < 1e-4


def test_channels_last_in_channels_last_out_and_meta_refused():
    x = torch.randn(2, 8, 9, 7).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(6, 8, 3, 3), torch.randn(6)
    for _ in range(2):  # the first call compiles, the second runs the cached plan
        y = ct.conv2d(x, w, b, padding=1)
        ref = F.conv2d(x, w, b, padding=1)
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
        assert y.stride() == ref.stride()
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    y = ct.conv2d(x.contiguous(), w, b, padding=1)
    assert y.is_contiguous()
    x3 = torch.randn(1, 4, 5, 6, 7).contiguous(memory_format=torch.channels_last_3d)
    w3 = torch.randn(3, 4, 3, 3, 3)
    y, ref = ct.conv3d(x3, w3, padding=1), F.conv3d(x3, w3, padding=1)
    assert y.stride() == ref.stride()  # torch's cpu conv3d gives a contiguous result
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(convweave.Error, match="CW_ERR_UNSUPPORTED: .*meta tensor"):
        ct.conv2d(x.to("meta"), w.to("meta"))


def test_cached_plans_see_in_place_changes_and_hold_no_memory():
    from convweave import _conv
    _conv.clear_cache()
    x, w, b = torch.randn(1, 4, 12, 12), torch.randn(5, 4, 3, 3), torch.randn(5)
    torch.testing.assert_close(ct.conv2d(x, w, b, padding=1), F.conv2d(x, w, b, padding=1), rtol=1e-5, atol=1e-5)
    assert len(_conv._plans) == 1
    with torch.no_grad():
        w.mul_(-2)
        b.add_(1)
    torch.testing.assert_close(ct.conv2d(x, w, b, padding=1), F.conv2d(x, w, b, padding=1), rtol=1e-5, atol=1e-5)
    assert len(_conv._plans) == 1  # the same plan: it reads w and b in place
    ctx = convweave.default_context()
    x8, w8 = torch.randn(1, 8, 16, 16), torch.randn(8, 8, 3, 3)  # a conv with a workspace
    ct.conv2d(x8, w8, padding=1)
    assert ctx.memory_stats()["reserved_bytes_current"] == 0  # given back after the call
    ct.conv2d(x8, w8, padding=1, keep_memory=True)
    assert ctx.memory_stats()["reserved_bytes_current"] > 0
    for k in range(_conv.MAX_CONV_PLANS + 3):  # bounded: least recently used go
        ct.conv2d(torch.randn(1, 4, 5 + k, 5), w, b)
    assert len(_conv._plans) == _conv.MAX_CONV_PLANS
    convweave.clear_conv_cache()
    assert not _conv._plans
