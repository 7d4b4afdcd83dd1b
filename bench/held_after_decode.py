#!/usr/bin/env python3
"""Resident memory a VAE decode leaves held once it returned (issue 25, bench/RESULTS.md):
the SD decoder (random weights), one decode in this fresh process, its output freed; RSS
after minus RSS before.

  python bench/held_after_decode.py diffusers 64   # plain diffusers, 512x512
  python bench/held_after_decode.py default 64     # convweave.diffusers.enable(vae)
  python bench/held_after_decode.py keep 64        # ... with keep_memory=True
"""
import gc
import os
import re
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import torch  # noqa: E402
import make_fixtures as mf  # noqa: E402


def rss_mib():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read())[1]) / 1024


def main():
    mode, lat = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(2)
    vae = mf.build_vae(mf.CONFIGS["sd"], 0)
    z = torch.randn(1, 4, lat, lat)
    if mode != "diffusers":
        import convweave.diffusers as cd
        cd.enable(vae, budget="128MiB", streams=2, threads=2, keep_memory=(mode == "keep"))
    with torch.no_grad():
        before = rss_mib()
        t0 = time.perf_counter()
        out = vae.decode(z).sample
        dt = time.perf_counter() - t0
        del out
        gc.collect()
        after = rss_mib()
    print(f"{mode:10s} {8 * lat}x{8 * lat}: decode {dt:.1f} s, RSS held after the decode (output freed): "
          f"{after - before:+.0f} MiB")


if __name__ == "__main__":
    main()
