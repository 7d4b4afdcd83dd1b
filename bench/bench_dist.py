#!/usr/bin/env python3
"""One SD VAE decode split across processes (convweave.diffusers.enable(vae,
process_group=pg), torch.distributed gloo on this machine), against the same decode in one
process and against diffusers' plain decode: per-rank working memory, time, messages and
bytes each rank sent and received, and the output's difference from the one-process plan.

Each configuration runs in fresh processes. Working memory = peak RSS during the decode
minus RSS after the model was built, torch.distributed initialised and the code loaded,
before convweave was enabled (what convweave keeps between calls counts); the peak is
reset through /proc/self/clear_refs before the decode. Random SD-config weights
(tools/make_fixtures.py's; no hub). The latent is on every rank; the image is gathered on
rank 0 and broadcast to the others (enable's default, gather=True). Every rank gets --threads threads: on a machine with fewer cores
than ranks x threads the ranks share cores, and the times say so.

  python bench/bench_dist.py --latent 128 --ranks 1,2,4 --budget 256MiB --threads 1
  python bench/bench_dist.py --latent 32 --ranks 1,2 --threads 1      # a quick look
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))


def _kib(field):
    return int(re.search(rf"{field}:\s+(\d+) kB", open("/proc/self/status").read())[1])


def child(args):
    import torch
    import torch.distributed as dist
    import make_fixtures as mf

    torch.set_num_threads(args.threads)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    vae = mf.build_vae(mf.CONFIGS["sd"], 0)
    z = torch.randn(1, vae.config.latent_channels, args.latent, args.latent, generator=torch.Generator().manual_seed(1))
    pg = None
    if args.mode == "convweave" and world > 1:
        import datetime
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=1800))
        pg = dist.group.WORLD
    import convweave.diffusers
    convweave.version()
    base = _kib("VmRSS")
    if args.mode == "convweave":
        kw = {"process_group": pg} if pg is not None else {}
        convweave.diffusers.enable(vae, budget=args.budget, streams=args.streams, threads=args.threads, **kw)
    with torch.no_grad():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM := VmRSS
        t0 = time.perf_counter()
        out = vae.decode(z).sample
        dt = time.perf_counter() - t0
    res = {"rank": rank, "working_bytes": (_kib("VmHWM") - base) * 1024, "seconds": dt}
    if args.mode == "convweave":
        text = convweave.diffusers.last_plan(vae, "decoder").describe()
        m = re.search(r"sends (\d+) messages \(([\d.]+) MiB\), receives (\d+) \(([\d.]+) MiB\)", text)
        if m:
            res.update(sent_msgs=int(m[1]), sent_mib=float(m[2]), recv_msgs=int(m[3]), recv_mib=float(m[4]))
        st = convweave.diffusers.last_plan(vae, "decoder").stats()
        res.update(activations=st["activations_peak"], temp=st["temp_peak"])
    if rank == 0:
        torch.save(out, args.out)
    print(json.dumps(res), flush=True)
    if pg is not None:
        dist.destroy_process_group()


def run(args, mode, world, out):
    with socket.socket() as s:  # a free port for this group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--out", out]
        for k in ("latent", "budget", "streams", "threads"):
            cmd += [f"--{k}", str(getattr(args, k))]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    t0 = time.perf_counter()
    res = []
    for r, p in enumerate(procs):
        o, e = p.communicate()
        if p.returncode:
            sys.exit(f"{mode} x{world} rank {r} failed:\n{e}")
        res.append(json.loads(o.strip().splitlines()[-1]))
    return res, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child")
    ap.add_argument("--out")
    ap.add_argument("--latent", type=int, default=128)
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-diffusers", action="store_true")
    args = ap.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)
    import torch
    tmp = tempfile.mkdtemp()
    rows = []
    ref = None
    print(f"SD decode {8 * args.latent}x{8 * args.latent}, budget {args.budget} per rank, {args.streams} streams, "
          f"{args.threads} thread(s) per rank, {os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    configs = [("diffusers", 1)] if not args.no_diffusers else []
    configs += [("convweave", int(n)) for n in args.ranks.split(",")]
    for mode, world in configs:
        out = os.path.join(tmp, f"{mode}{world}.pt")
        res, wall = run(args, mode, world, out)
        y = torch.load(out)
        if mode == "convweave" and world == 1:
            ref = y
        rows.append((mode, world, res, wall, y))
    print("| run | ranks | per-rank working MiB (max) | vs one process | decode s (max rank) | sent / received per rank "
          "MiB (max) | max abs diff vs one process |")
    print("|---|---|---|---|---|---|---|")
    one = next((max(r["working_bytes"] for r in res) for m, w, res, _, _ in rows if m == "convweave" and w == 1), None)
    for mode, world, res, wall, y in rows:
        wb = max(r["working_bytes"] for r in res) / 2**20
        sec = max(r["seconds"] for r in res)
        ratio = f"{wb * 2**20 / one:.2f}x" if one else "-"
        comm = "-"
        if "sent_mib" in res[0]:
            comm = f"{max(r['sent_mib'] for r in res):.1f} / {max(r['recv_mib'] for r in res):.1f}"
        diff = f"{(y - ref).abs().max().item():.3g}" if ref is not None else "-"
        each = ", ".join(f"{r['working_bytes'] / 2**20:.0f}" for r in res)
        print(f"| {mode} | {world} | {wb:.0f} ({each}) | "
              f"{ratio} | {sec:.1f} | {comm} | {diff} |")
    print(json.dumps([{"mode": m, "ranks": w, "ranks_res": res} for m, w, res, _, _ in rows]))


if __name__ == "__main__":
    main()
