#!/usr/bin/env python3
"""convweave's cw-vae against what users run instead: diffusers' AutoencoderKL.decode on
PyTorch (CPU, f32, same threads, same random weights and latent), in one run.

Each configuration runs in a fresh process. Its working memory is the peak resident bytes
during the decode minus the resident bytes just before it, with the model already loaded.
The peak is reset through /proc/self/clear_refs. cw-vae measures itself the same way and
prints the figure; diffusers runs in tools/diffusers_vae.py, the module cw-vae --compare
runs too. Time is the decode alone.

  python bench/peer_vae.py --size 512 --budgets 64MiB,256MiB [--tiling] [--threads 2]

Needs torch + diffusers (tools/requirements-fixtures.txt) and a built ./build/cw-vae.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from make_fixtures import CONFIGS  # noqa: E402  (no torch at import)


def run_diffusers(a, tmp, weights, latent, tiling):
    """One diffusers decode in a fresh process (tools/diffusers_vae.py, as cw-vae --compare)."""
    out = os.path.join(tmp, "diffusers_tiled.npy" if tiling else "diffusers.npy")
    cfg = os.path.join(tmp, "config.json")
    with open(cfg, "w") as f:
        json.dump(CONFIGS[a.config], f)
    cmd = [sys.executable, os.path.join(ROOT, "tools", "diffusers_vae.py"), "--config", cfg, "--weights", weights,
           "--input", latent, "--out", out, "--threads", str(a.threads), "--tile", str(a.tile)] + \
        (["--tiling"] if tiling else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["out"] = out
    return r


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_bytes(s):
    m = re.match(r"([0-9.]+) (B|KiB|MiB|GiB)", s)
    return float(m.group(1)) * UNITS[m.group(2)]


def run_cw(a, tmp, weights, latent, budget):
    """budget: a cw-vae --budget value, optionally '+MEMORY' for --memory MEMORY too."""
    budget, _, memory = budget.partition("+")
    out = os.path.join(tmp, f"cw_{budget}_{memory}.npy")
    cmd = [a.cw, "--preset", a.config, "--weights", weights, "--latent", latent, "--raw", out,
           "--budget", budget, "--threads", str(a.threads)] + (["--memory", memory] if memory else []) + a.cw_args
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip()}")
    m = re.search(r": ([0-9.]+) ms;.*working memory ([0-9.]+ [KMG]?i?B)", p.stdout)
    if not m:
        raise RuntimeError("cannot read cw-vae's time and working memory from: " + p.stdout)
    return {"ms": float(m.group(1)), "work": parse_bytes(m.group(2)), "out": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="sd", choices=["sd", "sdxl", "tiny"])
    ap.add_argument("--size", type=int, default=512, help="image side in pixels (latent = size / 8)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--budgets", default="64MiB,256MiB",
                    help="cw-vae --budget values, comma-separated; BUDGET+MEMORY adds --memory MEMORY")
    ap.add_argument("--tiling", action="store_true", help="also diffusers with vae.enable_tiling()")
    ap.add_argument("--tile", type=int, default=None,
                    help="tiling's tile side in pixels (default: 512 for sd, 1024 for sdxl, as their checkpoints)")
    ap.add_argument("--cw", default=os.path.join(ROOT, "build", "cw-vae"))
    ap.add_argument("--cw-args", default="", help="extra cw-vae arguments, one string")
    a = ap.parse_args()
    a.cw_args = a.cw_args.split()
    if a.tile is None:
        a.tile = 1024 if a.config == "sdxl" else 512
    import numpy as np
    import torch
    import make_fixtures as mf

    tmp = tempfile.mkdtemp(prefix="cw-peer-")
    cfg = mf.CONFIGS[a.config]
    weights = os.path.join(tmp, "vae.safetensors")
    mf.save_st(weights, mf.decoder_state(mf.build_vae(cfg, a.seed)), torch.float32)
    g = torch.Generator().manual_seed(a.seed + 1)
    z = torch.randn((1, cfg["latent_channels"], a.size // 8, a.size // 8), generator=g)
    latent = os.path.join(tmp, "latent.npy")
    np.save(latent, z.numpy())

    rows = [("diffusers decode", run_diffusers(a, tmp, weights, latent, False))]
    if a.tiling:
        rows.append(("diffusers enable_tiling()", run_diffusers(a, tmp, weights, latent, True)))
    for b in a.budgets.split(","):
        name = "convweave --budget " + b.replace("+", " --memory ")
        rows.append((name, run_cw(a, tmp, weights, latent, b)))

    ref = np.load(rows[0][1]["out"]).astype(np.float64)
    scale = float(np.abs(ref).max())
    base = rows[0][1]
    print(f"# {a.config} decoder, {a.size}x{a.size}, f32, {a.threads} threads, torch {torch.__version__}; "
          f"working memory = peak resident during the decode - resident before it")
    print(f"{'configuration':44s} {'time ms':>9s} {'x diffusers':>11s} {'work MiB':>9s} {'x diffusers':>11s}"
          f" {'max|diff| vs diffusers':>23s}")
    for name, r in rows:
        d = float(np.abs(np.load(r["out"]).astype(np.float64) - ref).max())
        print(f"{name:44s} {r['ms']:9.1f} {r['ms'] / base['ms']:11.2f} {r['work'] / 2**20:9.1f}"
              f" {r['work'] / base['work']:11.2f} {d:15.3g} ({d / scale:.2g} rel)")
    subprocess.run(["rm", "-rf", tmp], check=False)


if __name__ == "__main__":
    main()
