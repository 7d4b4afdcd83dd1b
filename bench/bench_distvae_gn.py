#!/usr/bin/env python3
"""Issue 27: DistVAE's row-band GroupNorm statistics vs convweave's exact GroupNorm, computed on
one SD-config decoder (random seeded weights, tools/make_fixtures.py's; no network, so no
pretrained weights), every decode compared with the same decoder run in float64.

DistVAE (github xdit-project/DistVAE, the parallel VAE of xDiT) splits the rows after the mid
block into R equal bands, one per rank, and replaces each GroupNorm from there on (the up
blocks' and conv_norm_out) with a PatchGroupNorm whose statistics come from per-rank partials
combined by all_reduce. Its convolutions exchange halo rows, so GroupNorm is the only place
its output departs from one process's. Here the R ranks are emulated in one process: each
swapped GroupNorm cuts its input into the R bands and adds the per-band partials in rank order
(what the all_reduce computes, up to the collective's own summation order). Two formulas, both
written from their description below, not copied:

  approx  DistVAE 5742c02 (2024-06-19) through a7e7ee7 (2024-09-24, the mirror's HEAD); a
          later 4-D/5-D version (patch_dim) in the code index keeps the same statistics. Each
          rank: its band mean (float32) times its element count n_r, and torch.var of its
          band (unbiased, about the band's OWN mean) times n_r; both all-reduced and divided
          by the global count n. So
          var = sum_r n_r/(n_r-1) * SS_r / n, with SS_r the band's squared deviations about its
          own mean: the between-band term sum_r n_r (mean_r - mean)^2 / n is dropped.
  exact   DistVAE 4a341a9 .. 2f11db3 (2024-06-17..19, before 5742c02): per-band sums
          all-reduced to the global mean, then per-band squared deviations about that global
          mean all-reduced, biased (/ n). Exact math; float32 sums in band order.

convweave runs single-process here: its distributed plan gives bit-identical output to its
single-process plan with the same patches (tests/test_dist.c checks that), so its error over
any rank count is this one. Each swapped GroupNorm also measures its variance against the
float64 variance of its own input (the probe: the formula's error at that layer alone).

The default latent is 64 (SD's 512x512 image). On a shared 2-core machine (load 5-8) with 2
threads one run took 9.6 min at 64 (another, more loaded, over 10), 6.7 min at 48 and 3.4 min
at 32; the float64 reference is the largest part. The numbers depend on the random weights: a trained decoder on a real image
(sky above, ground below) may give bands whose means differ more than this random one's, and
so a larger dropped between-band term; that is not measured here.

  PYTHONPATH=python/src CONVWEAVE_LIBRARY=build/libconvweave.so \\
      ~/.cache/convweave/venv/bin/python bench/bench_distvae_gn.py [--latent 64] [--ranks 2,4,8]
"""
import argparse
import copy
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import torch  # noqa: E402
from torch import nn  # noqa: E402


def band_edges(h, h_latent, ranks):
    """Row boundaries of the R bands at a layer of height h. DistVAE's Patchify gives rank r
    latent rows [r*c, min((r+1)*c, H)) with c = ceil(H/R); each upsampler doubles them."""
    scale = h // h_latent
    c = -(-h_latent // ranks)
    return [min(r * c, h_latent) * scale for r in range(ranks + 1)]


class BandGroupNorm(nn.Module):
    """A GroupNorm whose mean and variance come from R row bands combined as DistVAE does
    (kind "approx" or "exact", see the file's head). Affine parameters are the wrapped
    module's own. probe: a list to which forward appends the largest relative error of its
    variance against the float64 variance of the same input, over groups."""

    def __init__(self, gn, ranks, kind, h_latent, name, probe=None):
        super().__init__()
        self.gn, self.ranks, self.kind, self.h_latent, self.name, self.probe = gn, ranks, kind, h_latent, name, probe

    def forward(self, x):
        if x.dim() == 3:
            # the mid block's attention norm (--every-gn): [N, C, H*W] at the latent's size,
            # rows contiguous, so its bands are those of [N, C, H, W]
            return self.forward(x.view(x.shape[0], x.shape[1], self.h_latent, -1)).view(x.shape)
        n_, c, h, w = x.shape
        g = self.gn.num_groups
        xg = x.view(n_, g, c // g, h, w)
        e = band_edges(h, self.h_latent, self.ranks)
        bands = [xg[:, :, :, e[r]:e[r + 1]] for r in range(self.ranks)]
        count = (c // g) * h * w
        if self.kind == "approx":
            # the rank's float32 band mean times its element count, then its unbiased variance
            # about its own mean times that count; adding in rank order is the all_reduce
            total = sum(b.mean(dim=(2, 3, 4), dtype=torch.float32) * b[0, 0].numel() for b in bands)
            mean = total / count
            ss = sum(torch.var(b, dim=(2, 3, 4)) * b[0, 0].numel() for b in bands)
        else:
            total = sum(b.sum(dim=(2, 3, 4)) for b in bands)
            mean = total / count
            m5 = mean[:, :, None, None, None]
            ss = sum((b - m5).pow(2).sum(dim=(2, 3, 4)) for b in bands)
        var = ss / count
        if self.probe is not None:
            x64 = xg.double()
            true = x64.var(dim=(2, 3, 4), unbiased=False)
            self.probe.append((((var.double() - true).abs() / true).max().item(), self.name))
        y = (xg - mean[:, :, None, None, None]) / torch.sqrt(var[:, :, None, None, None] + self.gn.eps)
        y = y.view(n_, c, h, w)
        return y * self.gn.weight[None, :, None, None] + self.gn.bias[None, :, None, None]


def swap_groupnorms(vae, ranks, kind, h_latent, every, probe=None):
    """Replaces the decoder's GroupNorms that DistVAE replaces (every=True: all of them, the
    mid block's too) by BandGroupNorm; returns how many."""
    dec = vae.decoder
    swapped = 0
    for name, mod in list(dec.named_modules()):
        for child_name, child in list(mod.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if not isinstance(child, nn.GroupNorm):
                continue
            if not every and not (full.startswith("up_blocks.") or full == "conv_norm_out"):
                continue  # DistVAE runs conv_in and the mid block whole on every rank
            setattr(mod, child_name, BandGroupNorm(child, ranks, kind, h_latent, full, probe))
            swapped += 1
    return swapped


def decode(vae, z, what):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = vae.decode(z).sample
    print(f"  {what}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)  # progress
    return out


def errors(out, ref):
    d = out.double() - ref
    return d.abs().max().item(), d.pow(2).mean().sqrt().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--latent", type=int, default=64, help="latent side (image side = 8x)")
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--seed", type=int, default=0, help="weights' seed (the latent's is seed+1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--every-gn", action="store_true",
                    help="band every GroupNorm, the mid block's too (DistVAE bands only those after it)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ranks = [int(r) for r in args.ranks.split(",")]

    import make_fixtures as mf
    t_start = time.perf_counter()
    vae = mf.build_vae(mf.CONFIGS["sd"], args.seed)
    z = torch.randn(1, vae.config.latent_channels, args.latent, args.latent,
                    generator=torch.Generator().manual_seed(args.seed + 1))
    n_gn = sum(isinstance(m, nn.GroupNorm) for m in vae.decoder.modules())

    ref = decode(copy.deepcopy(vae).double(), z.double(), "float64 reference")
    rows = []  # (what, R, max abs, rms, note)
    rows.append(("diffusers f32, plain GroupNorm", "-", *errors(decode(vae, z, "diffusers f32"), ref), ""))

    for kind in ("approx", "exact"):
        for r in ranks:
            v = copy.deepcopy(vae)
            probe = []
            n_swapped = swap_groupnorms(v, r, kind, args.latent, args.every_gn, probe)
            out = decode(v, z, f"{kind} R={r}")
            worst = max(probe)
            note = f"largest rel. err of a GN's variance at its input: {worst[0]:.2e} ({worst[1]})"
            label = ("DistVAE approx GN (5742c02..HEAD)" if kind == "approx"
                     else "DistVAE exact GN (2f11db3)")
            rows.append((label, str(r), *errors(out, ref), note))
            del v

    import convweave
    import convweave.diffusers
    v = copy.deepcopy(vae)
    convweave.diffusers.enable(v, threads=args.threads)
    rows.append((f"convweave {convweave.version()} (1 process = any rank count)", "any",
                 *errors(decode(v, z, "convweave"), ref), "dist plan = 1-process plan, bit for bit (tests/test_dist.c)"))

    side = 8 * args.latent
    print(f"SD-config AutoencoderKL decoder, RANDOM weights (tools/make_fixtures.py build_vae seed {args.seed}; "
          f"no network, no pretrained weights), latent 1x4x{args.latent}x{args.latent} (seed {args.seed + 1}) "
          f"-> {side}x{side} image, torch threads {args.threads}, torch {torch.__version__}.")
    print(f"Decoder GroupNorms: {n_gn}; banded as DistVAE does: {n_swapped} "
          f"({'every one' if args.every_gn else 'up blocks + conv_norm_out; conv_in and the mid block run whole'}).")
    print("Error of vae.decode(z).sample (float32) against the same decoder in float64.\n")
    print("| decode | R | max abs err | RMS err | note |")
    print("|---|---|---|---|---|")
    for what, r, mx, rms, note in rows:
        print(f"| {what} | {r} | {mx:.3e} | {rms:.3e} | {note} |")
    print(f"\nRan in {time.perf_counter() - t_start:.0f} s. Command:")
    print(f"  PYTHONPATH=python/src CONVWEAVE_LIBRARY=build/libconvweave.so ~/.cache/convweave/venv/bin/python "
          f"bench/bench_distvae_gn.py --latent {args.latent} --ranks {args.ranks} --seed {args.seed} "
          f"--threads {args.threads}{' --every-gn' if args.every_gn else ''}")


if __name__ == "__main__":
    main()
