"""One rank of test_dist.py's runs: python dist_worker.py SCENARIO RANK WORLD INIT_FILE OUT_DIR [VARIANT].
Joins a gloo group through INIT_FILE, runs SCENARIO and saves what it saw to
OUT_DIR/rank<RANK>.pt (a dict: outputs, bands, errors with their status, message and
seconds). Ends with os._exit, so a group left broken by a dead peer cannot hang the exit."""
import datetime
import os
import sys
import threading
import time
import traceback

import torch

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tools"))

import torch.distributed as dist  # noqa: E402

import convweave  # noqa: E402
import convweave.dist as cdist  # noqa: E402
import convweave.torch as cwt  # noqa: E402

SEED = 3          # the vae's weights; test_dist.py builds the same
PATCHES = 4       # every plan's fixed patch count, as the single-process reference
LATENT = (1, 4, 8, 8)
TIMEOUT = 3.0     # seconds a message of a run may take before the Comm gives up (dead-rank runs)
SLOW = 60.0       # the same while compiling: a message there waits for the slowest rank's export
THREADS = 1       # cpu threads a rank: 4 ranks share 2 cores (the bits do not depend on it)


def latent(shape=LATENT):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(11))


def image():
    return torch.rand(1, 3, 32, 48, generator=torch.Generator().manual_seed(12)) * 2 - 1


def build(seed=SEED):
    import make_fixtures as mf  # diffusers: 2-3 s of import, so only the scenarios that need it
    return mf.build_vae(mf.CONFIGS["tiny"], seed)


class Small(torch.nn.Module):
    """conv -> GroupNorm -> SiLU -> upsample -> conv -> SiLU -> conv: halos and GroupNorm
    partials between ranks, without diffusers' import (the dead-rank runs start 3 processes)."""

    def __init__(self, seed=SEED):
        super().__init__()
        torch.manual_seed(seed)
        self.c1 = torch.nn.Conv2d(4, 16, 3, padding=1)
        self.gn = torch.nn.GroupNorm(4, 16)
        self.c2 = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.c3 = torch.nn.Conv2d(16, 3, 3, padding=1)
        self.eval()

    def forward(self, z):
        h = torch.nn.functional.silu(self.gn(self.c1(z)))
        h = self.c2(torch.nn.functional.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.c3(torch.nn.functional.silu(h))


SMALL_INPUT = (1, 4, 16, 16)


class SinThenConv(torch.nn.Module):
    """decoder, then torch.sin (no convweave op: PyTorch between two segments), then a conv."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder
        torch.manual_seed(7)
        self.conv = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, z):
        return self.conv(torch.sin(self.decoder(z)))


def decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


def caught(fn):
    """fn() -> ("ok", result) or ("error", {status, message, type, seconds})."""
    t0 = time.monotonic()
    try:
        return "ok", fn()
    except convweave.Error as e:
        return "error", {"status": e.status, "message": e.message, "type": "convweave.Error",
                         "seconds": time.monotonic() - t0}
    except Exception as e:
        return "error", {"status": None, "message": f"{type(e).__name__}: {e}", "type": type(e).__name__,
                         "seconds": time.monotonic() - t0, "trace": traceback.format_exc()}


def scenario_decode(rank, world, out):
    """Groups of 1, 2, 3 and 4 ranks (1: rank 3; 2: ranks 1 and 3, so group and global ranks
    differ; 4: the world) each decode the same latent through enable(), every rank getting
    the whole image, except 3 ranks, which return bands (gather=False, uneven: 64 rows in 3);
    then wrap() on 4 ranks of a module with PyTorch between two segments, in bands: the
    first segment gathered and broadcast, the second banded. (Each Program exports its
    module anew, a second or more on a loaded machine: the scenario keeps to four a rank.)"""
    import convweave.diffusers as cd
    vae, z = build(), latent()
    members = {1: [3], 2: [1, 3], 3: [0, 1, 2]}
    groups = {n: dist.new_group(r) for n, r in members.items()}  # every rank makes every group
    groups[4], members[4] = dist.group.WORLD, [0, 1, 2, 3]
    for n in (1, 2, 3, 4):
        if rank in members[n]:
            # the encoder too on 2 ranks only: enable() exports each part it wraps
            st = cd.enable(vae, patches=PATCHES, process_group=groups[n], gather=n != 3, encoder=n == 2,
                           threads=THREADS)
            out[f"enable{n}"] = (decode(vae, z), st.bands())
            out[f"repr{n}"] = repr(st)
            out[f"describe{n}"] = cd.describe(vae)
            if n == 2:
                with torch.no_grad():
                    out["encode2"] = vae.encode(image()).latent_dist.mean
            cd.disable(vae)
    mod = SinThenConv(vae.decoder).eval()
    w = cwt.wrap(mod, (z,), patches=PATCHES, process_group=cdist.Comm(None, timeout=SLOW), gather=False,
                 threads=THREADS)
    with torch.no_grad():
        out["wrap_band"] = (w(z), w.bands())
    d = w.describe()
    out["wrap_describe"] = {k: d[k] for k in ("rank", "n_ranks", "gather", "nodes_fallback")}
    out["wrap_segments"] = [s["gather_rank"] for s in d["segments"]]


def scenario_kill(rank, world, out, variant):
    """The last rank dies (os._exit, outside any callback): right after compiling wrap(Small)
    (after_compile) or once its run has moved a message (mid_run). The others' call must
    raise convweave.Error within the Comm's timeout."""
    z = latent(SMALL_INPUT)
    comm = cdist.Comm(timeout=SLOW)
    w = cwt.wrap(Small(), (z,), patches=PATCHES, process_group=comm, threads=THREADS)
    dist.barrier()  # the runs start together: a short timeout then means a dead peer, not a slow export
    comm.timeout = TIMEOUT
    victim = rank == world - 1
    if victim and variant == "after_compile":
        os._exit(0)
    if victim and variant == "mid_run":
        start = comm.messages

        def watch():
            while comm.messages <= start:
                time.sleep(0.0005)
            os._exit(0)
        threading.Thread(target=watch, daemon=True).start()
    with torch.no_grad():
        out["call"] = caught(lambda: w(z))
        if not victim:  # and the next call fails as cleanly
            out["again"] = caught(lambda: w(z))


MISMATCHES = ("shape", "weights", "budget")


def scenario_mismatch(rank, world, out):
    """Rank 1 differs from rank 0 in one thing: the latent's shape, the weights or the
    budget, each on a group of its own (a check that stops half way leaves nothing
    behind for the next). Compiling (in wrap) must raise convweave.Error on every rank
    naming it; then the same on both compiles and runs, with fixed and with automatic patches."""
    odd = rank == 1
    vaes = {SEED: build(SEED), SEED + 1: build(SEED + 1)}
    for variant in MISMATCHES + ("same", "auto"):
        group = dist.new_group([0, 1])
        vae = vaes[SEED + 1 if odd and variant == "weights" else SEED]
        z = latent((1, 4, 8, 10) if odd and variant == "shape" else LATENT)
        budget = "1MiB" if odd and variant == "budget" else "256MiB"  # enable()'s, as the reference

        def compile_and_run():  # "auto": patches=None, the planner's choice (at least 2 per conv)
            w = cwt.wrap(vae.decoder, (z,), patches=None if variant == "auto" else PATCHES, budget=budget,
                         process_group=cdist.Comm(group, timeout=SLOW), threads=THREADS)
            with torch.no_grad():
                return w(z)
        out[variant] = caught(compile_and_run)


def main():
    scenario, rank, world, init, outdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    variant = sys.argv[6] if len(sys.argv) > 6 else None
    out = {"rank": rank}
    code = 0
    try:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=30))
        if scenario == "decode":
            scenario_decode(rank, world, out)
        elif scenario == "kill":
            scenario_kill(rank, world, out, variant)
        elif scenario == "mismatch":
            scenario_mismatch(rank, world, out)
        else:
            raise SystemExit(f"no scenario {scenario!r}")
    except BaseException:
        out["fatal"] = traceback.format_exc()
        code = 1
    torch.save(out, os.path.join(outdir, f"rank{rank}.pt"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
