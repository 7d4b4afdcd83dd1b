#!/usr/bin/env python3
"""Working memory and time of a video VAE's vae.decode(z) at the released models' channel
widths (diffusers' default configs: CogVideoX-2b/5b, Wan2.1, HunyuanVideo, LTX-Video 0.9.0;
random weights, no hub), each mode in its own fresh process, as bench/bench_python_vae.py:

  diffusers   diffusers' default decode (tiling off; HunyuanVideo's framewise decoding on,
              as diffusers sets it: it windows more than 4 latent frames)
  tiled       diffusers after vae.enable_tiling(), tiles of half the frame (diffusers' own
              default tiles are larger than the sizes run here, so they would not tile)
  convweave   convweave.diffusers.enable(vae) with its defaults (budget 256MiB, memory None)
  least       enable(vae, budget="32MiB", memory="auto:1000"): the least memory the ladder has
              at that temporary budget (--least-budget)
  cw:B:M      enable(vae, budget=B, memory=M), M "none" for None: a point between the two
              (cw:64MiB:auto:30: a 64 MiB temporary budget, at most 30 % more conv FLOPs)

Working memory = peak RSS during the call minus RSS after the model was built and the code
loaded (before enable()), so what convweave holds between calls counts. The convweave modes
make one whole call first, which exports and compiles (compile_s: how long it took, its run
included), and time the second. Also a
per-conv report (--spy): the temporaries PyTorch allocates for the largest Conv3d calls of the
diffusers run, measured by running each alone (torch's cpu conv3d takes oneDNN for these
shapes, not slow_conv3d's column buffer), against convweave's largest conv workspaces
(plan.describe(): a patch's workspace plus its band).

  python bench/bench_video_vae.py --model cogvideox --frames 9 --size 256
  python bench/bench_video_vae.py --model wan --frames 9,17,33 --size 128 --modes diffusers,convweave,least
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

# name -> (diffusers class, spatial ratio, temporal ratio, latent channels)
MODELS = {
    "cogvideox": ("AutoencoderKLCogVideoX", 8, 4, 16),
    "wan": ("AutoencoderKLWan", 8, 4, 16),
    "hunyuanvideo": ("AutoencoderKLHunyuanVideo", 8, 4, 16),
    "ltx": ("AutoencoderKLLTXVideo", 32, 8, 128),
}
MODES = ("diffusers", "tiled", "convweave", "least")


def _kib(field):
    return int(re.search(rf"{field}:\s+(\d+) kB", open("/proc/self/status").read())[1])


def tiles(model, size):
    """enable_tiling() arguments giving tiles of half the frame (the stride 3/4 of a tile)."""
    t, s = size // 2, 3 * size // 8
    if model == "cogvideox":
        return dict(tile_sample_min_height=t, tile_sample_min_width=t)
    return dict(tile_sample_min_height=t, tile_sample_min_width=t, tile_sample_stride_height=s,
                tile_sample_stride_width=s)


def build(model):
    import diffusers
    import torch
    torch.manual_seed(0)
    return getattr(diffusers, MODELS[model][0])().eval()


def latent(model, frames, size, batch=1):
    import torch
    _, sr, tr, c = MODELS[model]
    return torch.randn(batch, c, (frames - 1) // tr + 1, size // sr, size // sr,
                       generator=torch.Generator().manual_seed(1))


def torch_conv3d_temps(calls, top=3):
    """[(bytes, description)]: for the `top` largest conv3d calls seen (by input size), the
    temporaries PyTorch allocates, measured: the conv run alone on a fresh input of that shape,
    peak RSS during it minus RSS before, less its output. Its backend on cpu for these shapes
    is oneDNN (Mkldnn: blocked copies and scratch); Slow3d's column buffer would be
    C_in*kT*kH*kW x T_out*H_out*W_out floats."""
    import torch
    seen = {}
    for x, w, stride, padding in calls:
        seen[(x, w, stride, padding)] = 1
    big = sorted(seen, key=lambda c: -(c[0][1] * c[0][2] * c[0][3] * c[0][4]))[:top]
    out = []
    for x, w, stride, padding in big:
        xi, wi = torch.randn(x), torch.randn(w)
        backend = str(torch._C._select_conv_backend(xi, wi, None, stride, padding, (1, 1, 1), False, (0, 0, 0), 1,
                                                    None)).split(".")[-1]
        before = _kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        y = torch.conv3d(xi, wi, None, stride, padding)
        temp = (_kib("VmHWM") - before) * 1024 - y.numel() * 4
        out.append((max(temp, 0), f"{backend} {w[1]}->{w[0]} k{'x'.join(map(str, w[2:]))} in "
                    f"{'x'.join(map(str, x[2:]))} (in {xi.numel() * 4 >> 20} MiB, out {y.numel() * 4 >> 20} MiB)"))
        del xi, wi, y
    return sorted(out, reverse=True)


def child(args):
    import torch
    torch.set_num_threads(args.threads)
    vae = build(args.model)
    z = latent(args.model, args.frames, args.size)
    import convweave.diffusers as cd
    import convweave
    convweave.version()
    torch.export.export(torch.nn.Identity(), (torch.zeros(1),), strict=False).run_decompositions({})
    base = _kib("VmRSS")
    res = {"mode": args.mode}
    calls = []
    spy = None
    if args.mode == "tiled":
        vae.enable_tiling(**tiles(args.model, args.size))
    elif is_cw(args.mode):
        opts = cw_opts(args.mode, args.least_budget)
        t0 = time.perf_counter()
        state = cd.enable(vae, threads=args.threads, streams=args.streams, **opts)
        with torch.no_grad():  # export and compile now, not in the timed call: one whole call (Wan's and
            vae.decode(z)       # CogVideoX's steps compile as their cache kinds first appear)
        res["compile_s"] = time.perf_counter() - t0
    else:
        class Spy(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, a=(), kw=None):
                if func is torch.conv3d:
                    x, w = a[0], a[1]
                    st = a[3] if len(a) > 3 else kw.get("stride", 1) if kw else 1
                    pd = a[4] if len(a) > 4 else kw.get("padding", 0) if kw else 0
                    t3 = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * 3  # noqa: E731
                    calls.append((tuple(x.shape), tuple(w.shape), t3(st), t3(pd)))
                return func(*a, **(kw or {}))
        spy = Spy() if args.spy else None
    with torch.no_grad():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        t0 = time.perf_counter()
        if spy is not None:
            with spy:
                out = vae.decode(z).sample
        else:
            out = vae.decode(z).sample
        res["seconds"] = time.perf_counter() - t0
        res["working_bytes"] = (_kib("VmHWM") - base) * 1024
    torch.save(out, args.out)
    res["shape"] = list(out.shape)
    if calls:
        res["torch_conv3d"] = torch_conv3d_temps(calls)
    if is_cw(args.mode):
        d = cd.describe(vae)
        plans = state.last_program.plans()
        ws = []
        for p in plans:
            for c in p.describe(json_format=True)["convs"]:
                for pt in c["patch"]:
                    ws.append((pt["workspace"] + pt["band_bytes"], pt["name"] + " " + pt["algo"]))
        ws.sort(reverse=True)
        res["cw_conv"] = ws[:3]
        res["fallbacks"] = d["nodes_fallback"]
        res["nodes_convweave"] = d["nodes_convweave"]
        res["segments"] = len(d["segments"])
        res["fallback_bytes"] = sum(f["bytes"] or 0 for f in d["fallbacks"])
        res["temp_peak"] = max((s["plan"]["temp_peak"] for s in d["segments"]), default=0)
        res["activations_peak"] = max((s["plan"]["activations_peak"] for s in d["segments"]), default=0)
    print(json.dumps(res))


def is_cw(mode):
    """A mode run by convweave: convweave, least, cw:BUDGET:MEMORY."""
    return mode in ("convweave", "least") or mode.startswith("cw:")


def cw_opts(mode, least_budget):
    """enable()'s options for a convweave mode; ValueError for a cw: mode without a memory."""
    if mode == "least":
        return dict(budget=least_budget, memory="auto:1000")
    if not mode.startswith("cw:"):
        return {}
    budget, memory = mode[3:].split(":", 1)  # ValueError without the second ':'
    return dict(budget=budget, memory=None if memory == "none" else memory)


def run_mode(args, mode, out):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--out", out, "--model", args.model,
           "--frames", str(args.frames), "--size", str(args.size), "--threads", str(args.threads),
           "--streams", str(args.streams), "--least-budget", args.least_budget] + (["--spy"] if args.spy else [])
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        return {"mode": mode, "error": (r.stderr.strip().splitlines() or ["?"])[-1][:200]}
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["process_s"] = time.perf_counter() - t0
    return res


def one(args, mib=1 << 20):
    import torch
    modes = args.modes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        res = {m: run_mode(args, m, os.path.join(tmp, f"{i}.pt")) for i, m in enumerate(modes)}
        outs = {m: torch.load(os.path.join(tmp, f"{i}.pt")) for i, m in enumerate(modes) if "error" not in res[m]}
    exact = outs.get("convweave", outs.get("least", outs.get("diffusers")))  # the untiled decode
    ref = {m: res[m] for m in ("diffusers", "tiled") if m in outs}
    for m in outs:
        if exact is not None and outs[m].shape == exact.shape:
            res[m]["max_diff_exact"] = (outs[m] - exact).abs().max().item()
    z = latent(args.model, args.frames, args.size)
    print(f"\n{args.model} decode, latent {tuple(z.shape)} -> {res[modes[0]].get('shape')}, {args.threads} threads")
    print(f"{'mode':10s} {'time s':>8s} {'working MiB':>12s} {'vs diffusers t/mem':>19s} {'vs tiled t/mem':>15s} "
          f"{'max|d| exact':>12s}  notes")
    for m in modes:
        r = res[m]
        if "error" in r:
            print(f"{m:10s} failed: {r['error']}")
            continue
        rat = []
        for b in ("diffusers", "tiled"):
            if b in ref:
                t, w = r["seconds"] / ref[b]["seconds"], r["working_bytes"] / ref[b]["working_bytes"]
                rat.append(f"{t:.2f}x/{w:.2f}x")
            else:
                rat.append("-")
        notes = ""
        if "fallbacks" in r:
            notes = (f"compile {r['compile_s']:.1f}s, {r['segments']} segs, {r['nodes_convweave']} cw / "
                     f"{r['fallbacks']} torch nodes, temp {r['temp_peak'] / mib:.0f} MiB, "
                     f"acts {r['activations_peak'] / mib:.0f} MiB")
        print(f"{m:10s} {r['seconds']:8.2f} {r['working_bytes'] / mib:12.1f} {rat[0]:>19s} {rat[1]:>15s} "
              f"{r.get('max_diff_exact', float('nan')):12.2e}  {notes}")
    for m in modes:
        for key, who in (("torch_conv3d", "PyTorch conv3d temp"), ("cw_conv", "convweave conv workspace")):
            for b, what in res[m].get(key, []):
                print(f"  {m:10s} {who}: {b / mib:8.1f} MiB  {what}")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="cogvideox")
    ap.add_argument("--frames", default="9", help="video frames (comma list): 9, 17, 33")
    ap.add_argument("--size", type=int, default=256, help="frame height = width")
    ap.add_argument("--threads", type=int, default=2, help="torch and convweave threads")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}, cw:BUDGET:MEMORY")
    ap.add_argument("--least-budget", default="32MiB",
                    help="the least mode's temporary budget (the memory ladder's least total depends on it: at 33 "
                         "frames 64MiB reaches less than 32MiB, whose recompute bands do not fit)")
    ap.add_argument("--spy", action="store_true", help="record the diffusers run's conv3d calls (per-conv report)")
    ap.add_argument("--json", help="also write every result to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for m in args.modes.split(","):
        try:
            if m not in MODES:
                cw_opts(m if m.startswith("cw:") else "cw:", args.least_budget)
        except ValueError:
            ap.error(f"--modes: {m!r} is none of {', '.join(MODES)}, cw:BUDGET:MEMORY")
    if args.child:
        args.mode = args.child
        args.frames = int(args.frames)
        return child(args)
    allres = []
    for f in args.frames.split(","):
        a = argparse.Namespace(**vars(args))
        a.frames = int(f)
        allres.append({"model": a.model, "frames": a.frames, "size": a.size, **one(a)})
    if args.json:
        with open(args.json, "a") as fh:
            for r in allres:
                fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
