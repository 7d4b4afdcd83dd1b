"""The CUDA path: torch CUDA tensors go to a cuda context whose stream 0 is torch's current
stream. Skipped without a device (or a library built without the cuda backend)."""
import pytest
import torch
import torch.nn.functional as F

import convweave
import convweave.torch as ct
from conftest import has_cuda, rel_err

pytestmark = pytest.mark.skipif(not has_cuda(), reason="no CUDA device")


def cuda_context_or_skip():
    try:
        return convweave.default_context("cuda", torch.cuda.current_device())
    except convweave.Error as e:
        pytest.skip(f"libconvweave without a usable cuda backend: {e}")


def test_conv2d_cuda_matches_torch():
    ctx = cuda_context_or_skip()
    assert ctx.backend == "cuda"
    x = torch.randn(2, 8, 33, 20, device="cuda")
    w = torch.randn(16, 4, 3, 3, device="cuda")
    b = torch.randn(16, device="cuda")
    for kw in (dict(padding=1, groups=2), dict(stride=2, padding="valid", groups=2, dilation=2)):
        y = ct.conv2d(x, w, b, budget="1MiB", **kw)
        assert y.is_cuda
        torch.backends.cudnn.allow_tf32 = False
        assert rel_err(y, F.conv2d(x, w, b, **kw)) <= 1e-5
    x3 = torch.randn(1, 4, 5, 9, 9, device="cuda")[..., ::2]  # strided view
    w3 = torch.randn(4, 4, 3, 3, 3, device="cuda")
    assert rel_err(ct.conv3d(x3, w3, padding="same"), F.conv3d(x3, w3, padding="same")) <= 1e-5


def test_conv_on_a_side_stream():
    cuda_context_or_skip()
    s = torch.cuda.Stream()
    x = torch.randn(1, 4, 64, 64, device="cuda")
    w = torch.randn(4, 4, 3, 3, device="cuda")
    with torch.cuda.stream(s):
        x2 = x * 2  # queued on s: the library must run after it
        y = ct.conv2d(x2, w, padding=1)
    torch.cuda.synchronize()
    assert rel_err(y, F.conv2d(x * 2, w, padding=1)) <= 1e-5


def test_vae_decode_cuda(make_vae):
    cuda_context_or_skip()
    import convweave.diffusers as cd
    vae = make_vae("tiny", 0).cuda()
    z = torch.randn(1, 4, 8, 8, device="cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        ref = vae.decode(z).sample
        cd.enable(vae, budget="16MiB")
        out = vae.decode(z).sample
    assert out.is_cuda and rel_err(out, ref) <= 1e-5
    cd.disable(vae)


def test_vae_encode_cuda(make_vae):
    cuda_context_or_skip()
    import convweave.diffusers as cd
    vae = make_vae("tiny", 0).cuda()
    x = torch.rand(1, 3, 64, 64, device="cuda") * 2 - 1
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        ref = vae.encode(x).latent_dist.mean
        cd.enable(vae, budget="16MiB", decoder=False)
        out = vae.encode(x).latent_dist.mean
    assert out.is_cuda and rel_err(out, ref) <= 1e-5
    cd.disable(vae)
