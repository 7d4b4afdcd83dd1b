"""Every error path raises convweave.Error with the status name and the library's message
(or ValueError/TypeError for Python arguments that torch itself rejects the same way)."""
import ctypes

import numpy as np
import pytest
import torch

import convweave
import convweave.diffusers as cd
import convweave.torch as ct
from convweave import _core


@pytest.fixture(autouse=True)
def _inference():
    """As a pipeline decodes: grad mode off (with it on, a wrapped vae runs PyTorch's forward)."""
    with torch.no_grad():
        yield


def raises(status, match):
    return pytest.raises(convweave.Error, match=rf"^{status}: .*{match}")


def test_error_carries_status_and_message():
    with raises("CW_ERR_INVALID_ARG", r"input channels C=6") as e:
        ct.conv2d(torch.randn(1, 6, 5, 5), torch.randn(4, 5, 3, 3))
    assert e.value.status == "CW_ERR_INVALID_ARG" and "w: [4, 5, 3, 3]" in e.value.message
    assert isinstance(e.value, RuntimeError)


def test_conv_argument_errors():
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    with raises("CW_ERR_INVALID_ARG", "groups"):
        ct.conv2d(x, torch.randn(4, 2, 3, 3), groups=3)
    with raises("CW_ERR_INVALID_ARG", r"stride"):
        ct.conv2d(x, w, stride=0)
    with raises("CW_ERR_INVALID_ARG", r"bias|b\b"):
        ct.conv2d(x, w, torch.randn(5))
    with raises("CW_ERR_INVALID_ARG", r"output|kernel|size|< 1"):
        ct.conv2d(torch.randn(1, 4, 2, 2), w)
    with raises("CW_ERR_INVALID_ARG", "dtype"):  # one dtype for x, w and y
        ct.conv2d(x.half(), w)
    with raises("CW_ERR_UNSUPPORTED", "dtype float64"):
        ct.conv2d(x.double(), w.double())
    with pytest.raises(ValueError, match="strided convolutions"):
        ct.conv2d(x, w, padding="same", stride=2)
    with pytest.raises(ValueError, match="invalid padding string"):
        ct.conv2d(x, w, padding="full")
    with pytest.raises(ValueError, match="tuple of 2 ints"):
        ct.conv2d(x, w, stride=(1, 2, 3))
    with pytest.raises(ValueError, match="4-D weight"):
        ct.conv2d(x, torch.randn(4, 4, 3))
    with pytest.raises(ValueError, match="3-D or 4-D input"):
        ct.conv2d(torch.randn(6, 6), w)
    with pytest.raises(TypeError, match="expected a torch.Tensor or numpy.ndarray"):
        ct.conv2d([[1.0]], w)
    with raises("CW_ERR_INVALID_ARG", "input is on cpu:0, weight on meta"):
        ct.conv2d(x, w.to("meta"))


def test_budget_errors():
    with pytest.raises(ValueError, match="expected bytes or a size"):
        ct.conv2d(torch.randn(1, 1, 3, 3), torch.randn(1, 1, 1, 1), budget="12 parsecs")
    with pytest.raises(ValueError, match="must be > 0"):
        convweave.parse_bytes(0)
    assert convweave.parse_bytes("1.5GiB") == 3 << 29 and convweave.parse_bytes("64MB") == 64 * 10**6
    assert convweave.parse_bytes("unlimited") == -1 and convweave.parse_bytes(None) == -1
    x, w = torch.randn(1, 64, 64, 64), torch.randn(64, 64, 3, 3)
    # a graph compile under a budget too small names (and returns) the smallest that works
    ctx = convweave.Context(backend="cpu", budget=64)
    g = convweave.Graph(ctx)
    xn = g.input("x", (1, 64, 64, 64))
    h = g.silu(g.group_norm(xn, g.constant("g", torch.ones(64)), g.constant("b", torch.zeros(64)), 8, 1e-6))
    y = g.conv(h, g.constant("w", w), None, _core.conv_params(2, (1, 1), (1, 1), (1, 1), (1, 1), 1))
    g.output(y, "y")
    with raises("CW_ERR_BUDGET", "") as e:
        g.compile()
    assert e.value.min_budget and e.value.min_budget > 64
    assert g.min_budget() == e.value.min_budget
    plan = g.compile(budget=e.value.min_budget)
    out = torch.empty(1, 64, 64, 64)
    plan.run([x], [out])
    ref = ct.conv2d(torch.nn.functional.silu(torch.nn.functional.group_norm(x, 8, eps=1e-6)), w, padding=1)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_graph_and_plan_errors(tmp_path):
    ctx = convweave.Context(backend="cpu", budget="8MiB")
    g = convweave.Graph(ctx)
    x = g.input("x", (1, 4, 8, 8))
    with raises("CW_ERR_INVALID_ARG", r"'h': is f16 but the graph is f32 \(since input 'x' \(node 0\)\)"):
        g.input("h", (1, 4, 8, 8), dtype="float16")
    with raises("CW_ERR_INVALID_ARG", "is not a node of this graph"):
        g.silu(99)
    with raises("CW_ERR_INVALID_ARG", "groups = 3 must divide"):
        g.group_norm(x, g.constant("g", torch.ones(4)), g.constant("b", torch.zeros(4)), 3, 1e-6)
    with raises("CW_ERR_INVALID_ARG", "gamma must be a contiguous f32 constant"):
        g.group_norm(x, g.constant("g5", torch.ones(5)), g.constant("b5", torch.zeros(4)), 2, 1e-6)
    with raises("CW_ERR_UNSUPPORTED", "w and b must be constants"):
        g.conv(x, x, None, _core.conv_params(2, (1, 1), (1, 1), (0, 0), (0, 0), 1))
    with raises("CW_ERR_INVALID_ARG", ""):
        g.add(x, g.upsample2x(x))
    y = g.attention(x, x, x, 0.5)
    y = g.add(g.silu(y), x)
    g.output(y, "y")
    assert g.shape(y) == (1, 4, 8, 8)
    plan = g.compile()
    with raises("CW_ERR_INVALID_ARG", r"inputs\[0\] \('x'\) is f32 \[1, 4, 8, 9\]"):
        plan.run([torch.randn(1, 4, 8, 9)], [torch.empty(1, 4, 8, 8)])
    with raises("CW_ERR_INVALID_ARG", "1 inputs and 2 outputs given"):
        plan.run([torch.randn(1, 4, 8, 8)], [torch.empty(1, 4, 8, 8)] * 2)
    z = torch.randn(1, 4, 8, 8)
    with raises("CW_ERR_INVALID_ARG", "overlaps"):
        plan.run([z], [z])
    g2 = convweave.Graph(ctx)
    x2 = g2.input("x", (1, 4, 8, 8))
    g2.output(g2.attention(x2, x2, x2, 0.5), "y")
    with raises("CW_ERR_UNSUPPORTED", "must be contiguous"):
        g2.compile().run([z], [torch.empty(1, 4, 8, 16)[..., ::2]])
    out = np.empty((1, 4, 8, 8), np.float32)
    plan.run([z.numpy()], [out])  # NumPy in and out
    with raises("CW_ERR_", "timing|TIMING|trace"):
        plan.write_trace(str(tmp_path / "t.json"))  # the context has no CW_FLAG_TIMING
    with raises("CW_ERR_UNSUPPORTED", ""):
        ctx.use_cuda_stream(1234)  # a cpu context has no CUDA stream


def test_context_errors():
    with raises("CW_ERR_INVALID_ARG", "backend='tpu'") as e:
        convweave.Context(backend="tpu")
    assert isinstance(e.value, ValueError)
    # the reason the library logs (not "the library logged why") is in the message
    with raises("CW_ERR_INVALID_ARG", r"cw_context_create.*failed: cw_context_config\.streams = 0, must be in 1\.\.8"):
        convweave.Context(backend="cpu", streams=0)
    with raises("CW_ERR_INVALID_ARG", r"threads=-1"):
        convweave.Context(backend="cpu", threads=-1)
    if not torch.cuda.is_available():
        with raises("CW_ERR_NO_DEVICE|CW_ERR_UNSUPPORTED|CW_ERR_BACKEND", "cw_context_create") as e:
            convweave.Context(backend="cuda")
        assert "logged why" not in e.value.message and "failed: " in e.value.message
        assert len(e.value.message.split("failed: ", 1)[1]) > 10, e.value.message


def test_diffusers_unsupported_configs(make_vae):
    from diffusers import AutoencoderKL
    vae = make_vae("tiny", 0)
    z = torch.randn(1, 4, 4, 4)
    mixed = make_vae("tiny", 0)
    mixed.decoder.conv_out.half()  # one module in another dtype: a graph has one element type
    with raises("CW_ERR_UNSUPPORTED", r"decoder\.conv_out\.weight: parameters are torch.float16, others torch.float32"):
        cd.enable(mixed)
    assert not cd.is_enabled(mixed)
    cd.enable(vae)
    with raises("CW_ERR_INVALID_ARG", "latent is torch.float64, the decoder's parameters torch.float32"):
        vae.decoder(z.double())
    with raises("CW_ERR_UNSUPPORTED", "latent_embeds"):
        vae.decoder(z, latent_embeds=z)
    with pytest.raises(ValueError, match=r"\[N, C, h, w\]"):
        vae.decoder(z[0])
    with raises("CW_ERR_INVALID_ARG", "the latent is on meta"):
        vae.decoder(z.to("meta"))
    cd.disable(vae)
    # what the hand mapping refused and the op table runs: a GELU model, an output scale
    gelu = AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4, act_fn="gelu").eval()
    _matches_diffusers(gelu, lambda v: v.decode(z).sample)
    vae.decoder.mid_block.resnets[0].output_scale_factor = 2.0
    _matches_diffusers(vae, lambda v: v.decode(z).sample)
    vae.decoder.mid_block.resnets[0].output_scale_factor = 1.0
    with raises("CW_ERR_UNSUPPORTED", "no decoder with 'conv_in'"):
        cd.enable(torch.nn.Linear(2, 2))
    # what it cannot run: the module, the node and why
    vae.decoder.conv_out.padding_mode = "reflect"
    with raises("CW_ERR_UNSUPPORTED", r"AutoencoderKL\.decoder: cannot map Decoder .*decoder\.conv_out \(Conv2d\): "
                                      r"node pad .*not a conv's zero padding"):
        cd.enable(vae)
    vae.decoder.conv_out.padding_mode = "zeros"
    vae.decoder.mid_block.attentions[0].heads = 2
    with raises("CW_ERR_UNSUPPORTED", r"decoder\.mid_block\.attentions\.0 \(Attention\): node view.*splits a dim"):
        cd.enable(vae)
    vae.decoder.mid_block.attentions[0].heads = 1
    assert not cd.is_enabled(vae)


def _matches_diffusers(vae, call):
    """enable() takes the vae and its result is diffusers' own."""
    cd.enable(vae, budget="8MiB")
    try:
        with torch.no_grad():
            got = call(vae)
    finally:
        cd.disable(vae)
    with torch.no_grad():
        ref = call(vae)
    assert ((got - ref).abs().max() / ref.abs().max()).item() <= 1e-5


def test_decode_under_too_small_a_budget_names_the_minimum(make_vae):
    vae = make_vae("tiny", 0)
    cd.enable(vae, budget=4096)
    with raises("CW_ERR_BUDGET", "budget") as e:
        vae.decode(torch.randn(1, 4, 8, 8))
    assert e.value.min_budget > 4096
    cd.enable(vae, budget=e.value.min_budget)
    with torch.no_grad():
        vae.decode(torch.randn(1, 4, 8, 8))


def test_diffusers_encoder_unsupported_configs(make_vae):
    from diffusers import AutoencoderKL
    vae = make_vae("tiny", 0)
    x = torch.rand(1, 3, 16, 16) * 2 - 1
    mixed = make_vae("tiny", 0)
    mixed.encoder.conv_out.to(torch.bfloat16)
    with raises("CW_ERR_UNSUPPORTED", r"encoder\.conv_out\.weight: parameters are torch.bfloat16, others torch.float32"):
        cd.enable(mixed, decoder=False)
    assert not cd.is_enabled(mixed)
    cd.enable(vae)
    with raises("CW_ERR_INVALID_ARG", "image is torch.float64, the encoder's parameters torch.float32"):
        vae.encoder(x.double())
    with pytest.raises(ValueError, match=r"the encoder takes a \[N, C, h, w\]"):
        vae.encoder(x[0])
    with raises("CW_ERR_INVALID_ARG", "the image is on meta, the encoder's parameters on cpu"):
        vae.encoder(x.to("meta"))
    # an image too small for three stride-2 convs: torch.export's message (PyTorch's own)
    with raises("CW_ERR_UNSUPPORTED", r"torch.export failed .*Kernel size can't be greater than actual input size"):
        vae.encode(x[..., :4, :4])
    cd.disable(vae)
    gelu = AutoencoderKL(block_out_channels=(8, 8), down_block_types=("DownEncoderBlock2D",) * 2,
                         up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4, act_fn="gelu").eval()
    _matches_diffusers(gelu, lambda v: v.encode(x).latent_dist.mean)
    down = vae.encoder.down_blocks[0].downsamplers[0]
    saved, down.use_conv = down.conv, False  # Downsample2D(use_conv=False) average-pools: the op table has it
    down.conv = torch.nn.AvgPool2d(2, 2)
    _matches_diffusers(vae, lambda v: v.encode(x).latent_dist.mean)
    down.use_conv, down.conv = True, saved
    cd.enable(vae, budget="8MiB")
    st = vae.decoder._convweave
    vae.encoder.mid_block.attentions[0].heads = 2
    with raises("CW_ERR_UNSUPPORTED", r"encoder\.mid_block\.attentions\.0 \(Attention\): node view.*splits a dim"):
        cd.enable(vae, budget="4MiB")
    assert vae.decoder._convweave is st and cd.is_enabled(vae, "encoder")  # a failed enable changes nothing
    vae.encoder.mid_block.attentions[0].heads = 1
    with raises("CW_ERR_UNSUPPORTED", r"no encoder to wrap \(encoder=True; pass encoder=False\)"):
        cd.enable(_with_decoder_only(vae))
    with pytest.raises(ValueError, match="nothing to wrap"):
        cd.enable(vae, encoder=False, decoder=False)
    with pytest.raises(ValueError, match="nothing to wrap"):
        cd.enable(vae.encoder, encoder=False)
    with pytest.raises(ValueError, match="part 'unet'"):
        cd.last_plan(vae, "unet")
    cd.disable(vae)


def _with_decoder_only(vae):
    m = torch.nn.Module()
    m.decoder = vae.decoder
    return m


def test_encode_under_too_small_a_budget_names_the_minimum(make_vae):
    vae = make_vae("tiny", 0)
    cd.enable(vae, budget=4096, decoder=False)
    with raises("CW_ERR_BUDGET", "budget") as e:
        vae.encode(torch.randn(1, 3, 64, 64))
    assert e.value.min_budget > 4096
    cd.enable(vae, budget=e.value.min_budget, decoder=False)
    with torch.no_grad():
        vae.encode(torch.randn(1, 3, 64, 64))
    assert cd.last_plan(vae, "encoder").stats()["temp_peak"] <= e.value.min_budget


def test_budgets_one_grammar_and_errors():
    """Budgets parse with the library's cw_parse_size (cw-vae's grammar): units in any case,
    exponents; a bad one is a convweave.Error (and a ValueError) naming it."""
    assert convweave.parse_bytes("256mib") == convweave.parse_bytes("256MiB") == 256 << 20
    assert convweave.parse_bytes("1e9") == convweave.parse_size("1e9") == 10**9
    assert convweave.parse_bytes("1.5 gib") == 3 << 29 and convweave.parse_bytes("64mb") == 64 * 10**6
    assert convweave.parse_bytes("UNLIMITED") == -1 and convweave.parse_size("0") == 0
    for bad in ("12 parsecs", "-1MiB", "0x10", "inf", "", "0", "256M", 1.5, [1]):
        with pytest.raises(convweave.Error, match="CW_ERR_INVALID_ARG") as e:
            convweave.parse_bytes(bad)
        assert isinstance(e.value, ValueError) and repr(bad) in str(e.value)
    with raises("CW_ERR_INVALID_ARG", "budget '12 parsecs'"):
        ct.conv2d(torch.randn(1, 1, 3, 3), torch.randn(1, 1, 1, 1), budget="12 parsecs")
    with raises("CW_ERR_INVALID_ARG", "budget '1 furlong'"):
        convweave.Context(backend="cpu", budget="1 furlong")
    import pickle
    e = pickle.loads(pickle.dumps(_core.Error("CW_ERR_BUDGET", "too small", min_budget=5)))
    assert (e.status, e.message, e.min_budget) == ("CW_ERR_BUDGET", "too small", 5)
