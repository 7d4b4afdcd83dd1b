#!/usr/bin/env python3
"""How much of each diffusers autoencoder's decode convweave.torch.wrap runs: ATen nodes
lowered into convweave, folded at compile time, and run by PyTorch between convweave
segments (with the ops that fell back most), on small random configs (the op counts do not
depend on the widths), plus each decode's largest difference from PyTorch's own.

  python bench/wrap_coverage.py            # every model
  python bench/wrap_coverage.py kl wan     # some
"""
import collections
import sys
import time

import torch
import diffusers

import convweave.torch as cwt


class Decode(torch.nn.Module):
    def __init__(self, vae):
        super().__init__()
        self.vae = vae

    def forward(self, z, *extra):
        if extra:
            return self.vae.decode(z, image=extra[0], mask=extra[1]).sample
        return self.vae.decode(z).sample


KL = dict(block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
          down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2)


def models():
    """name -> (constructor, inputs)."""
    r = lambda *s: torch.randn(*s, generator=torch.Generator().manual_seed(1))  # noqa: E731
    d = diffusers
    return {
        "kl": (lambda: d.AutoencoderKL(**KL, latent_channels=4), (r(1, 4, 8, 8),)),
        "kl-sd3": (lambda: d.AutoencoderKL(**KL, latent_channels=16, use_quant_conv=False,
                                           use_post_quant_conv=False), (r(1, 16, 8, 8),)),
        "flux2": (lambda: d.AutoencoderKLFlux2(**KL, latent_channels=8), (r(1, 8, 8, 8),)),
        "asymmetric": (lambda: d.AsymmetricAutoencoderKL(
            down_block_out_channels=(32, 64), up_block_out_channels=(32, 64), layers_per_down_block=1,
            layers_per_up_block=1, norm_num_groups=8, latent_channels=4,
            down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2),
            (r(1, 4, 8, 8), r(1, 3, 16, 16), torch.ones(1, 1, 16, 16))),
        "tiny": (lambda: d.AutoencoderTiny(encoder_block_out_channels=(8,) * 4, decoder_block_out_channels=(8,) * 4,
                                           num_encoder_blocks=(1,) * 4, num_decoder_blocks=(1,) * 4),
                 (r(1, 4, 8, 8),)),
        "cogvideox": (lambda: d.AutoencoderKLCogVideoX(
            block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8, latent_channels=4,
            down_block_types=("CogVideoXDownBlock3D",) * 2, up_block_types=("CogVideoXUpBlock3D",) * 2,
            temporal_compression_ratio=2), (r(1, 4, 3, 8, 8),)),
        "wan": (lambda: d.AutoencoderKLWan(base_dim=16, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                                           temperal_downsample=[True]), (r(1, 4, 3, 8, 8),)),
        "hunyuanvideo": (lambda: d.AutoencoderKLHunyuanVideo(
            block_out_channels=(16,) * 4, layers_per_block=1, norm_num_groups=4, latent_channels=4),
            (r(1, 4, 2, 4, 4),)),
        "ltx": (lambda: d.AutoencoderKLLTXVideo(
            block_out_channels=(32, 64), decoder_block_out_channels=(32, 64), layers_per_block=(1, 1, 1),
            decoder_layers_per_block=(1, 1, 1), spatio_temporal_scaling=(True, False),
            decoder_spatio_temporal_scaling=(True, False), decoder_inject_noise=(False, False, False), latent_channels=4,
            patch_size=1, patch_size_t=1, timestep_conditioning=False), (r(1, 4, 3, 8, 8),)),
        "qwen-image": (lambda: d.AutoencoderKLQwenImage(base_dim=16, z_dim=4, dim_mult=[1, 2], num_res_blocks=1,
                                                        temperal_downsample=[False]), (r(1, 4, 1, 8, 8),)),
    }


def main():
    torch.set_num_threads(1)
    table = models()
    names = sys.argv[1:] or list(table)
    print(f"{'model':14s} {'convweave':>9s} {'folded':>6s} {'pytorch':>7s} {'segments':>8s} {'max|diff|':>9s} "
          f"{'s':>5s}  ops run by PyTorch (most first)")
    for name in names:
        make, inputs = table[name]
        torch.manual_seed(0)
        mod = Decode(make()).eval()
        t0 = time.perf_counter()
        w = cwt.wrap(mod, inputs)
        with torch.no_grad():
            diff = (w(*inputs) - mod(*inputs)).abs().max().item()
        d = w.describe()
        ops = collections.Counter(f["op"].replace("aten.", "").replace(".default", "") for f in d["fallbacks"])
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(6))
        print(f"{name:14s} {d['nodes_convweave']:9d} {d['nodes_folded']:6d} {d['nodes_fallback']:7d} "
              f"{len(d['segments']):8d} {diff:9.1e} {time.perf_counter() - t0:5.1f}  {top}")


if __name__ == "__main__":
    main()
