#!/usr/bin/env python3
"""Working memory and time of vae.decode(z) (or, with --part encoder, of vae.encode(x)) in
diffusers, unwrapped ("diffusers"), with convweave.diffusers.enable(vae, budget=...)
("convweave", the hand mapping) and with the part replaced by convweave.torch.wrap(part,
...) ("wrap", the generic torch.export front), each in its own fresh process.

Working memory = peak RSS during the call minus RSS after the model was built and the code
loaded, before convweave was enabled or wrapped, so what convweave holds between calls
(compiled plans, contexts, arenas) counts (the peak is reset through /proc/self/clear_refs
before each call).
Random weights (tools/make_fixtures.py's; no hub). --model sd: AutoencoderKL from a --config;
flux2: AutoencoderKLFlux2 at FLUX.2's released widths (the class's defaults: 128/256/512/512,
32 latent channels); asymmetric: AsymmetricAutoencoderKL at the released x1.5 inpainting
config (decoder 192/384/768/768, 3 layers per up block; encoder as SD's), decoding with an
image and a mask as StableDiffusionInpaintPipeline passes them (enable() refuses its
MaskConditionDecoder: use --modes diffusers,wrap). --memory least: the memory ladder's least
total at --budget, at either recompute share of front/remat.py (computed in a process of its
own, then passed as memory=). Prints one line per configuration, the ratios, and the largest
difference between the two outputs relative to max|ref|.

  python bench/bench_python_vae.py --config sd --latent 64 --budget 128MiB --repeat 2
  python bench/bench_python_vae.py --latent 64 --memory auto --procs 3   # medians of 3 processes
  python bench/bench_python_vae.py --config sd --latent 16 --json      # what the test runs
  python bench/bench_python_vae.py --part encoder --config sd --latent 64 --budget 128MiB  # encode 512x512
  python bench/bench_python_vae.py --latent 64 --modes diffusers,convweave,wrap --memory auto
  python bench/bench_python_vae.py --model flux2 --budget 64MiB --memory least --threads 2
  python bench/bench_python_vae.py --latent 64 --budget 32MiB --memory least --threads 2 --procs 3  # the smallest
  python bench/bench_python_vae.py --model asymmetric --modes diffusers,wrap --memory auto --threads 2
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import make_fixtures as mf  # noqa: E402  the repository's one random-weight VAE builder


def build_vae(config, seed=0, model="sd"):
    """A random-weight autoencoder (tools/make_fixtures.py's weights, eval mode, float32):
    model sd: AutoencoderKL of mf.CONFIGS[config]; flux2, asymmetric: see the docstring."""
    if model == "sd":
        return mf.build_vae(mf.CONFIGS[config], seed)
    import torch
    import diffusers
    from diffusers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    if model == "flux2":  # black-forest-labs/FLUX.2-dev's vae/config.json = the class's defaults
        vae = diffusers.AutoencoderKLFlux2(block_out_channels=(128, 256, 512, 512), latent_channels=32,
                                           layers_per_block=2, norm_num_groups=32)
    else:  # cross-attention/asymmetric-autoencoder-kl-x-1-5's config (the class's defaults are toy sizes)
        vae = diffusers.AsymmetricAutoencoderKL(
            down_block_types=("DownEncoderBlock2D",) * 4, down_block_out_channels=(128, 256, 512, 512),
            layers_per_down_block=2, up_block_types=("UpDecoderBlock2D",) * 4,
            up_block_out_channels=(192, 384, 768, 768), layers_per_up_block=3, latent_channels=4,
            norm_num_groups=32, sample_size=256, scaling_factor=0.18215)
    return mf.randomize(vae, seed).eval()


def decode_extra(model, batch, side, gen):
    """decode()'s extra keyword arguments: for asymmetric, the inpainting pipeline's image in
    [-1, 1] and its binary mask [B, 1, H, W] (1: repaint; here a centred square of half the
    side); none otherwise."""
    import torch
    if model != "asymmetric":
        return {}
    image = torch.rand(batch, 3, side, side, generator=gen) * 2 - 1
    mask = torch.zeros(batch, 1, side, side)
    mask[:, :, side // 4:3 * side // 4, side // 4:3 * side // 4] = 1
    return {"image": image, "mask": mask}


def latent_channels(vae):
    return vae.config.latent_channels


def _kib(field):
    return int(re.search(rf"{field}:\s+(\d+) kB", open("/proc/self/status").read())[1])


def child(args):
    import torch
    torch.set_num_threads(args.threads)
    vae = build_vae(args.config, model=args.model)
    gen = torch.Generator().manual_seed(1)
    extra = {}
    if args.part == "decoder":
        inp = torch.randn(args.batch, latent_channels(vae), args.latent, args.latent, generator=gen)
        extra = decode_extra(args.model, args.batch, 8 * args.latent, gen)
        call = lambda: vae.decode(inp, **extra).sample  # noqa: E731
    else:  # an image in [-1, 1]; the result compared is the posterior's moments (after quant_conv)
        side = 8 * args.latent
        inp = torch.rand(args.batch, 3, side, side, generator=gen) * 2 - 1
        call = lambda: vae.encode(inp).latent_dist.parameters  # noqa: E731
    memory = None if args.memory == "none" else args.memory
    if args.mode == "ladder":
        return ladder(args, vae, inp, extra)
    # Code is loaded before the baseline in every mode (convweave's library, torch.export's
    # modules, through one trivial export): what enable() and wrap() build and keep (plans,
    # contexts, arenas) counts, the Python and C code they run does not.
    import convweave.diffusers
    import convweave.torch
    convweave.version()
    torch.export.export(torch.nn.Identity(), (torch.zeros(1),), strict=False).run_decompositions({})
    base = _kib("VmRSS")
    wrapped = None
    if args.mode == "convweave":
        convweave.diffusers.enable(vae, budget=args.budget, streams=args.streams, threads=args.threads, memory=memory)
    elif args.mode == "wrap":
        part = getattr(vae, args.part)
        example = inp if args.part == "encoder" else torch.empty_like(inp)  # post_quant_conv keeps the shape
        example = (example, extra["image"], extra["mask"]) if extra else (example,)  # decoder(z, image, mask)
        wrapped = convweave.torch.wrap(part, example, budget=args.budget, streams=args.streams,
                                       threads=args.threads, memory=memory)
        setattr(vae, args.part, wrapped)
    runs = []
    with torch.no_grad():
        for _ in range(args.repeat):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # VmHWM := VmRSS
            before = base
            t0 = time.perf_counter()
            out = call()
            dt = time.perf_counter() - t0
            runs.append({"working_bytes": (_kib("VmHWM") - before) * 1024, "seconds": dt})
    torch.save(out, args.out)
    res = {"mode": args.mode, "runs": runs}
    if args.mode == "convweave":
        res["stats"] = {k: v for k, v in convweave.diffusers.last_plan(vae, args.part).stats().items()
                        if k in ("temp_peak", "activations_peak", "weights_bytes", "wall_ms", "n_patches")}
    if wrapped is not None:
        d = wrapped.describe()
        res["wrap"] = {"segments": len(d["segments"]), "nodes_convweave": d["nodes_convweave"],
                       "nodes_fallback": d["nodes_fallback"], "copied_bytes": d["copied_bytes"]}
        res["fallbacks"] = [{k: f[k] for k in ("op", "shape", "bytes", "reason")} for f in d["fallbacks"]]
        res["stats"] = {k: sum(s["plan"][k] for s in d["segments"]) for k in
                        ("temp_peak", "activations_peak", "weights_bytes", "wall_ms", "n_patches")}
    print(json.dumps(res))


def ladder(args, vae, inp, extra):
    """Prints the memory ladders of the part's plan(s) at --budget (wrap's lowering, the same
    graph enable() builds), per segment, least total first: [ladders at remat.SHARE, at
    remat.SHARE_CAPPED] -- the graphs wrap compiles under a memory cap (Wrapped._compile)."""
    import torch
    import convweave.torch
    from convweave.front import remat
    from convweave.front.runner import Program
    part = getattr(vae, args.part)
    example = (torch.empty_like(inp) if args.part == "decoder" else inp,)
    if extra:
        example += (extra["image"], extra["mask"])
    w = convweave.torch.wrap(part, example, budget=args.budget, streams=args.streams, threads=args.threads)
    out = []
    for share in (remat.SHARE, remat.SHARE_CAPPED):
        prog = Program(part, *w._flatten(example, {}), w._context, compile=False, share=share)
        segs = [s[1] for s in prog.steps if s[0] == "seg"]
        out.append([seg.g.memory_ladder(budget=args.budget, streams=args.streams) for seg in segs])
    print(json.dumps(out))


def run_mode(args, mode, out):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--out", out]
    for k in ("model", "part", "config", "latent", "batch", "budget", "streams", "threads", "repeat", "memory"):
        cmd += [f"--{k}", str(getattr(args, k))]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"{mode} run failed:\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("decoder", "encoder"), default="decoder",
                    help="decoder: vae.decode(z); encoder: vae.encode(x) of the 8x-sized image")
    ap.add_argument("--model", choices=("sd", "flux2", "asymmetric"), default="sd",
                    help="sd: AutoencoderKL of --config; flux2: AutoencoderKLFlux2; asymmetric: AsymmetricAutoencoderKL")
    ap.add_argument("--config", choices=sorted(mf.CONFIGS), default="sd", help="--model sd's widths")
    ap.add_argument("--latent", type=int, default=64, help="latent height = width (image is 8x)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--budget", default="128MiB")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=1,
                    help="calls per process; time: best, memory: max; 'first s' is the first call alone (with "
                         "convweave, its export and compile: the plan is made on the first call of a shape)")
    ap.add_argument("--procs", type=int, default=1,
                    help="fresh processes per mode, the modes interleaved; the medians are reported, and the "
                         "range where > 1 (a process's resident memory varies by tens of MiB run to run)")
    ap.add_argument("--memory", default="none",
                    help="convweave's memory= (a size, 'auto'; 'none': no cap; 'least': the ladder's least total)")
    ap.add_argument("--modes", default="diffusers,convweave",
                    help="comma list of diffusers, convweave (convweave.diffusers.enable), wrap (convweave.torch.wrap)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--child", choices=("diffusers", "convweave", "wrap", "ladder"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)
    import torch
    modes = args.modes.split(",")
    if not modes or modes[0] != "diffusers" or not set(modes) <= {"diffusers", "convweave", "wrap"}:
        sys.exit(f"--modes {args.modes}: diffusers first, then convweave and/or wrap")
    if args.model == "asymmetric" and "convweave" in modes and args.part == "decoder":
        sys.exit("--model asymmetric: convweave.diffusers.enable refuses its MaskConditionDecoder; "
                 "use --modes diffusers,wrap")
    least = None
    if args.memory == "least":
        with tempfile.TemporaryDirectory() as tmp:
            segs = run_mode(args, "ladder", os.path.join(tmp, "ladder.pt"))
        # memory= caps each plan: the least that every segment's plan reaches, at either share
        least = min(max(pts[0]["total_bytes"] for pts in lad) for lad in segs)
        args.memory = str(least)
    with tempfile.TemporaryDirectory() as tmp:
        res, procs = {}, {m: [] for m in modes}
        for _ in range(args.procs):  # the modes interleaved, each in a fresh process
            for m in modes:
                res[m] = run_mode(args, m, os.path.join(tmp, f"{m}.pt"))
                procs[m].append((max(x["working_bytes"] for x in res[m]["runs"]),
                                 min(x["seconds"] for x in res[m]["runs"]), res[m]["runs"][0]["seconds"]))
        outs = {m: torch.load(os.path.join(tmp, f"{m}.pt")) for m in modes}
    ref = outs["diffusers"]
    for m in modes:
        r = res[m]
        r["procs"] = [{"working_bytes": w, "seconds": t, "first_seconds": f} for w, t, f in procs[m]]
        r["working_bytes"] = statistics.median(w for w, _, _ in procs[m])
        r["seconds"] = statistics.median(t for _, t, _ in procs[m])
        r["first_seconds"] = statistics.median(f for _, _, f in procs[m])
        r["max_rel_diff"] = ((outs[m] - ref).abs().max() / ref.abs().max()).item()
    summary = {"model": args.model, "part": args.part, "config": args.config, "latent": args.latent, "batch": args.batch,
               "budget": args.budget, "memory": args.memory, "streams": args.streams, "threads": args.threads,
               "repeat": args.repeat, "procs": args.procs, "image": args.latent * 8,
               "max_rel_diff": max(res[m]["max_rel_diff"] for m in modes), **res}
    if least is not None:
        summary["ladder"] = segs
    if args.json:
        print(json.dumps(summary))
        return
    mib = 1 << 20
    lc = {"sd": mf.CONFIGS[args.config]["latent_channels"], "flux2": 32, "asymmetric": 4}[args.model]
    shapes = (f"{args.batch}x{lc}x{args.latent}x{args.latent}", f"{args.latent * 8}x{args.latent * 8}")
    name = args.config if args.model == "sd" else args.model
    if args.part == "decoder":
        print(f"{name} VAE decode, latent {shapes[0]} -> {shapes[1]}, {args.threads} threads, "
              f"repeat {args.repeat}, {args.procs} process(es) per mode (medians)")
    else:
        print(f"{name} VAE encode, image {args.batch}x3x{shapes[1]} -> moments of {shapes[0]}, "
              f"{args.threads} threads, repeat {args.repeat}")
    print(f"{'configuration':52s} {'time s':>8s} {'first s':>8s} {'working MiB':>12s} {'time':>6s} {'first':>6s} "
          f"{'memory':>7s} {'max|diff|/max':>14s}")
    d = res["diffusers"]
    labels = {"diffusers": f"diffusers (torch {torch.__version__})",
              "convweave": f"diffusers.enable, budget {args.budget}, memory {args.memory}",
              "wrap": f"torch.wrap (export), budget {args.budget}, memory {args.memory}"}
    for m in modes:
        r = res[m]
        spread = ""
        if args.procs > 1:
            ws, ts = [x["working_bytes"] / mib for x in r["procs"]], [x["seconds"] for x in r["procs"]]
            spread = f"   range {min(ts):.2f}-{max(ts):.2f} s, {min(ws):.1f}-{max(ws):.1f} MiB"
        print(f"{labels[m]:52s} {r['seconds']:8.2f} {r['first_seconds']:8.2f} {r['working_bytes'] / mib:12.1f} "
              f"{r['seconds'] / d['seconds']:5.2f}x {r['first_seconds'] / d['first_seconds']:5.2f}x "
              f"{r['working_bytes'] / d['working_bytes']:6.2f}x "
              f"{r['max_rel_diff']:14.2e}{spread}")
    for m in modes[1:]:
        s = res[m]["stats"]
        extra = f", {res[m]['wrap']}" if "wrap" in res[m] else ""
        print(f"{m} plan(s): temp peak {s['temp_peak'] / mib:.1f} MiB, activations peak "
              f"{s['activations_peak'] / mib:.1f} MiB, {s['n_patches']} conv patches{extra}")
        for f in res[m].get("fallbacks", []):
            print(f"  run by PyTorch: {f['op']} {f['shape']} ({f['bytes'] / mib:.1f} MiB): {f['reason']}")
    if least is not None:
        for name, lad in zip(("remat.SHARE", "remat.SHARE_CAPPED"), segs):
            for i, pts in enumerate(lad):
                print(f"ladder at {name} (segment {i}, --budget {args.budget}): " + ", ".join(
                    f"{p['total_bytes']} ({p['total_bytes'] / mib:.0f} MiB, {p['n_recomputed']} recomputed)"
                    for p in pts))


if __name__ == "__main__":
    main()
