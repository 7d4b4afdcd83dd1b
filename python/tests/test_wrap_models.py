"""Named diffusers autoencoders through convweave.torch.wrap (small random configs): their
decode and encode as users call them, against the module's own forward in float64."""
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

from wrap_util import check_module  # noqa: E402

KL = dict(block_out_channels=(32, 64), layers_per_block=2, norm_num_groups=8,
          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)


class Decode(torch.nn.Module):
    def __init__(self, vae, **kw):
        super().__init__()
        self.vae, self.kw = vae, kw

    def forward(self, z, *extra):
        if extra:  # AsymmetricAutoencoderKL: the masked image and its mask
            return self.vae.decode(z, image=extra[0], mask=extra[1]).sample
        return self.vae.decode(z).sample


class Encode(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, x):
        return self.vae.encode(x).latent_dist.parameters


def _seeded(cls, **cfg):
    torch.manual_seed(0)
    return cls(**cfg)


def z(c, s=8, seed=1):
    return torch.randn(1, c, s, s, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("config", ["sd", "sd3"])
def test_autoencoder_kl_decode(config, dtype):
    """SD/SDXL's layout (4 latent channels, quant convs) and SD3/FLUX's (16, none): the whole
    decode in one convweave segment, half precision within 1.5x PyTorch's own half error."""
    cfg = dict(KL, latent_channels=4) if config == "sd" else \
        dict(KL, latent_channels=16, use_quant_conv=False, use_post_quant_conv=False)
    vae = _seeded(diffusers.AutoencoderKL, **cfg)
    w, _, _ = check_module(Decode(vae), (z(cfg["latent_channels"]),), dtype=dtype,
                           factor=4.0 if dtype == torch.float32 else 1.5, budget="256KiB", fallback=False)
    assert len(w.describe()["segments"]) == 1


def test_autoencoder_kl_encode():
    vae = _seeded(diffusers.AutoencoderKL, **dict(KL, latent_channels=4))
    w, _, _ = check_module(Encode(vae), (torch.randn(1, 3, 32, 32),), budget="256KiB")
    fb = {f["op"] for f in w.describe()["fallbacks"]}
    assert fb <= {"aten.split.Tensor"}, fb  # mean, logvar: diffusers' split at the very end


def test_autoencoder_kl_flux2():
    vae = _seeded(diffusers.AutoencoderKLFlux2, **dict(KL, latent_channels=8))
    check_module(Decode(vae), (z(8),), budget="256KiB", fallback=False)


def test_asymmetric_autoencoder_kl():
    vae = _seeded(diffusers.AsymmetricAutoencoderKL, down_block_out_channels=(32, 64), up_block_out_channels=(32, 64),
                  layers_per_down_block=1, layers_per_up_block=1, norm_num_groups=8, latent_channels=4,
                  down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)
    image, mask = torch.randn(1, 3, 16, 16), (torch.rand(1, 1, 16, 16) > 0.5).float()
    w, _, _ = check_module(Decode(vae), (z(4), image, mask), budget="256KiB")
    assert w.describe()["nodes_convweave"] > w.describe()["nodes_fallback"]


def test_autoencoder_tiny():
    vae = _seeded(diffusers.AutoencoderTiny, encoder_block_out_channels=(8, 8, 8, 8),
                  decoder_block_out_channels=(8, 8, 8, 8), num_encoder_blocks=(1, 1, 1, 1),
                  num_decoder_blocks=(1, 1, 1, 1))
    check_module(Decode(vae), (z(4),), budget="256KiB")



VIDEO = {  # small configs of the video VAEs (bench/wrap_coverage.py's): latents [1, 4, T, H, W]
    "cogvideox": (lambda: diffusers.AutoencoderKLCogVideoX(
        block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, latent_channels=4,
        down_block_types=("CogVideoXDownBlock3D",) * 2, up_block_types=("CogVideoXUpBlock3D",) * 2,
        temporal_compression_ratio=2), (3, 8)),
    "wan": (lambda: diffusers.AutoencoderKLWan(base_dim=16, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                                               temperal_downsample=[True]), (3, 8)),
    "hunyuanvideo": (lambda: diffusers.AutoencoderKLHunyuanVideo(
        block_out_channels=(16,) * 4, layers_per_block=1, norm_num_groups=4, latent_channels=4), (2, 4)),
    "ltx": (lambda: diffusers.AutoencoderKLLTXVideo(
        block_out_channels=(32, 64), decoder_block_out_channels=(32, 64), layers_per_block=(1, 1, 1),
        decoder_layers_per_block=(1, 1, 1), spatio_temporal_scaling=(True, False),
        decoder_spatio_temporal_scaling=(True, False), decoder_inject_noise=(False, False, False), latent_channels=4,
        patch_size=1, patch_size_t=1, timestep_conditioning=False), (3, 8)),
}


@pytest.mark.parametrize("name", list(VIDEO))
def test_video_vae_decode_runs_entirely_in_convweave(name):
    """The video VAEs' decodes (causal-conv caches, frame-folded 2-D ops, channels-last norms,
    depth-to-space, masked attention) lower with no PyTorch fallback, in one segment."""
    make, (t, s) = VIDEO[name]
    torch.manual_seed(0)
    vae = make()
    zz = torch.randn(1, 4, t, s, s, generator=torch.Generator().manual_seed(1))
    w, _, _ = check_module(Decode(vae), (zz,), fallback=False)
    assert len(w.describe()["segments"]) == 1
