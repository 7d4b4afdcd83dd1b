#!/usr/bin/env python3
"""How long Graph.compile takes for wrap(vae.decoder, memory="auto") on the SD decoder's
architecture (random weights), and the plan it chose: run it against two library trees to
compare their compile paths (each run a fresh process; time the compile calls only).

  PYTHONPATH=python/src CONVWEAVE_LIBRARY=build/libconvweave.so \
    python bench/bench_compile_auto.py --latent 128 --budget 128MiB
"""
import argparse
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--latent", type=int, default=128, help="latent side (128: a 1024² image)")
    ap.add_argument("--budget", default="128MiB")
    ap.add_argument("--memory", default="auto")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import convweave._core as core
    import convweave.torch as cwt
    from diffusers import AutoencoderKL
    spent = [0.0, 0]
    compile_ = core.Graph.compile

    def timed(self, **opts):
        t = time.perf_counter()
        try:
            return compile_(self, **opts)
        finally:
            spent[0] += time.perf_counter() - t
            spent[1] += 1
    core.Graph.compile = timed
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    vae = AutoencoderKL(block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
                        up_block_types=("UpDecoderBlock2D",) * 4, layers_per_block=2, latent_channels=4).eval()
    z = torch.randn(1, 4, args.latent, args.latent)
    with torch.no_grad():
        w = cwt.wrap(vae.decoder, (z,), budget=args.budget, memory=args.memory, threads=args.threads)
    for prog in w._programs.values():
        for plan in prog.plans():
            st = plan.stats()
            print(f"plan: {st['n_recomputed']} recomputed, activations {st['activations_peak'] / 2**20:.0f} MiB, "
                  f"temporaries {st['temp_predicted'] / 2**20:.0f} MiB, {st['n_patches']} patches")
    print(f"Graph.compile: {spent[1]} call(s), {spent[0]:.2f} s")


if __name__ == "__main__":
    main()
