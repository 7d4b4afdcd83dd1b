#!/usr/bin/env python3
"""memory="auto"'s time model against the clock: for each point of a decoder's memory ladder
(convweave.torch.wrap's lowering, segment 0), the backend's estimate of its convs' time
(conv_cost_ms, the cpu cost model summed over every conv task) and the measured decode
time, both as ratios to the plan that stores everything; and the recomputed FLOPs, which
memory="auto" bounded before.

One process; each plan is compiled with memory= its point's total, run once to warm up,
then --repeat times (the best time counts). Random weights (bench_python_vae.py's models).

  python bench/bench_ladder_time.py --model sd --latent 32 --budget 32MiB --threads 2
  python bench/bench_ladder_time.py --model asymmetric --latent 32 --budget 32MiB --threads 2
  python bench/bench_ladder_time.py --model asymmetric --latent 64 --budget 128MiB --model-only
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_python_vae as bpv  # noqa: E402  the models and their decode inputs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("sd", "flux2", "asymmetric"), default="sd")
    ap.add_argument("--latent", type=int, default=32, help="latent height = width (image is 8x)")
    ap.add_argument("--budget", default="32MiB", help="the temporaries' budget (the ladder depends on it)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--points", type=int, default=4, help="at most this many points below the stored plan")
    ap.add_argument("--model-only", action="store_true",
                    help="no runs: each ladder point's memory saved and the model's extra time (vs the stored plan)")
    args = ap.parse_args()

    import torch
    import convweave.torch
    torch.set_num_threads(args.threads)
    vae = bpv.build_vae("sd", model=args.model)
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(1, bpv.latent_channels(vae), args.latent, args.latent, generator=gen)
    extra = bpv.decode_extra(args.model, 1, 8 * args.latent, gen)
    inputs = (z, extra["image"], extra["mask"]) if extra else (z,)

    def run(memory):
        w = convweave.torch.wrap(vae.decoder, inputs, budget=args.budget, threads=args.threads, memory=memory)
        with torch.no_grad():
            w(*inputs)
            best = float("inf")
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                w(*inputs)
                best = min(best, time.perf_counter() - t0)
        plans = w.last_program.plans()
        return best, sum(p.stats()["conv_cost_ms"] for p in plans), w

    if args.model_only:  # wrap compiles for its example inputs
        w = convweave.torch.wrap(vae.decoder, inputs, budget=args.budget, threads=args.threads)
        (seg, *_) = [s[1] for s in w.last_program.steps if s[0] == "seg"]
        ladder = seg.g.memory_ladder(budget=args.budget, streams=2)
        st = ladder[-1]
        print(f"{args.model} decoder, latent {args.latent}x{args.latent}, budget {args.budget}: stored plan "
              f"{st['total_bytes'] / 2**20:.0f} MiB, model {st['conv_cost_ms']:.0f} ms")
        print(f"{'MiB':>6} {'saved':>6} {'recomputed':>10} {'model time':>10} {'saved % / extra time %':>23}")
        for pt in ladder[:-1]:
            saved = 100 * (1 - pt["total_bytes"] / st["total_bytes"])
            extra = 100 * (pt["conv_cost_ms"] / st["conv_cost_ms"] - 1)
            print(f"{pt['total_bytes'] / 2**20:>6.0f} {saved:>5.1f}% {pt['n_recomputed']:>10} {extra:>+9.1f}% "
                  f"{saved / extra if extra > 0 else float('inf'):>23.2f}")
        return
    t0, c0, w = run(None)
    (seg, *_) = [s[1] for s in w.last_program.steps if s[0] == "seg"]
    ladder = seg.g.memory_ladder(budget=args.budget, streams=2)
    gflop = w.last_program.plans()[0].stats()["conv_gflop"]
    below = ladder[:-1]
    if len(below) > args.points:
        below = [below[round(i * (len(below) - 1) / (args.points - 1))] for i in range(args.points)]
    print(f"{args.model} decoder, latent {args.latent}x{args.latent}, budget {args.budget}, {args.threads} threads, "
          f"best of {args.repeat}; stored plan {t0:.2f} s, {gflop:.0f} conv GFLOP, model {c0:.0f} ms")
    print(f"{'--memory':>12} {'MiB':>6} {'recomputed':>10} {'+FLOPs':>7} {'model':>6} {'measured':>8}")
    for pt in below:
        t, c, _ = run(pt["total_bytes"])
        print(f"{pt['total_bytes']:>12} {pt['total_bytes'] / 2**20:>6.0f} {pt['n_recomputed']:>10} "
              f"{100 * pt['recompute_gflop'] / gflop:>6.0f}% {c / c0:>5.2f}x {t / t0:>7.2f}x", flush=True)


if __name__ == "__main__":
    main()
