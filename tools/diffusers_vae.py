#!/usr/bin/env python3
"""The peer convweave is compared with: one diffusers AutoencoderKL decode (or encode) in this
process, measured as cw-vae measures itself. cw-vae --compare runs this file (built into
cw-vae, so an installed cw-vae needs no source tree) and bench/peer_vae.py imports it.

  diffusers_vae.py --config CFG.json --weights W.safetensors --input X.npy --out Y.npy
                   [--part decode|encode] [--threads N] [--repeat N] [--dtype f32|f16|bf16]
                   [--tiling --tile PIXELS]

CFG.json holds AutoencoderKL's architecture arguments (block_out_channels, layers_per_block,
norm_num_groups, latent_channels, in/out_channels, use_quant_conv, use_post_quant_conv,
mid_block_add_attention); the block types follow from block_out_channels. W holds the half
it runs under diffusers' key names (other keys are an error). Prints one JSON line once torch
and diffusers are imported ({"torch": ..., "diffusers": ...}), then one with the result:
"ms" (the fastest of --repeat runs of the call alone), "work" (working memory: the peak
resident bytes during the runs minus the resident bytes just before them, the model loaded;
the peak is reset through /proc/self/clear_refs) and "rss0". Exits 3 when torch, diffusers,
numpy or safetensors cannot be imported.
"""
import argparse
import json
import sys
import time

IMPORT_FAILED = 3

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
PREFIXES = {"decode": ("decoder.", "post_quant_conv."), "encode": ("encoder.", "quant_conv.")}


def kib(key):
    """A /proc/self/status field in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(key + " not in /proc/self/status")


def make_vae(cfg):
    """AutoencoderKL from architecture arguments; the block types follow from their count."""
    from diffusers import AutoencoderKL
    from diffusers.utils import logging

    logging.set_verbosity_error()
    kw = dict(cfg)
    n = len(kw["block_out_channels"])
    kw.setdefault("down_block_types", ("DownEncoderBlock2D",) * n)
    kw.setdefault("up_block_types", ("UpDecoderBlock2D",) * n)
    kw["block_out_channels"] = tuple(kw["block_out_channels"])
    return AutoencoderKL(**kw).eval()


def load_weights(vae, path, part):
    """Loads the half `part` runs from a .safetensors file; a missing or foreign key is an error."""
    from safetensors.torch import load_file

    state = load_file(path)
    missing, unexpected = vae.load_state_dict(state, strict=False)
    missing = [k for k in missing if k.startswith(PREFIXES[part])]
    if missing or unexpected:
        raise SystemExit(f"{path}: missing keys {missing[:3]}, foreign keys {unexpected[:3]} for the {part} half")


def measured(fn, repeat):
    """Runs fn() `repeat` times: (last result, fastest time in ms, working memory in bytes, rss0)."""
    rss0 = kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    best = float("inf")
    out = None
    for _ in range(repeat):
        out = None  # the previous result is not held while the next one is computed
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best * 1e3, (kib("VmHWM") - rss0) * 1024, rss0 * 1024


def run(vae, x, part, repeat):
    """vae.decode(x).sample, or encode's Gaussian parameters (mean, logvar: cw-vae's moments)."""
    import torch

    with torch.no_grad():
        if part == "decode":
            return measured(lambda: vae.decode(x).sample, repeat)
        return measured(lambda: vae.encode(x).latent_dist.parameters, repeat)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--part", choices=sorted(PREFIXES), default="decode")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--tiling", action="store_true", help="vae.enable_tiling() (not exact)")
    ap.add_argument("--tile", type=int, default=512, help="tiling's tile side in pixels")
    a = ap.parse_args()
    try:
        import numpy as np
        import safetensors  # noqa: F401  (load_weights)
        import torch
        import diffusers
    except ImportError as e:
        print(f"cannot import torch, diffusers, numpy, safetensors: {e}", file=sys.stderr)
        return IMPORT_FAILED
    print(json.dumps({"torch": torch.__version__, "diffusers": diffusers.__version__}), flush=True)

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    with open(a.config) as f:
        vae = make_vae(json.load(f))
    load_weights(vae, a.weights, a.part)
    dt = getattr(torch, DTYPES[a.dtype])
    vae = vae.to(dt)
    if a.tiling:
        # the checkpoints' own tile size (SD 1.x: 512; SDXL: 1024), not the config's sample_size
        vae.enable_tiling()
        vae.tile_sample_min_size = a.tile
        vae.tile_latent_min_size = a.tile // 8
    x = torch.from_numpy(np.load(a.input)).to(dt)
    out, ms, work, rss0 = run(vae, x, a.part, max(1, a.repeat))
    np.save(a.out, out.float().numpy())
    print(json.dumps({"ms": ms, "work": work, "rss0": rss0}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
