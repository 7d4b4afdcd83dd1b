#!/usr/bin/env python3
"""Fixed cost per convweave.torch.conv2d call on small convolutions, against
torch.nn.functional.conv2d on the same tensors (cpu, one torch thread; the library at its default threads).

For each shape: the median time per call of torch, of convweave's cached path (the plan
compiled at the first call of that signature, then only bound and run), and of the
uncached path (a plan compiled per call, as conv2d did before plans were cached), each the
median of --repeats blocks of --calls calls, interleaved so load changes hit all three.
"overhead" is convweave's median minus torch's: the fixed cost a call adds. "C run" is
cw_plan_run alone on the cached plan with the tensors bound once (the library's floor:
its stream hand-off and the kernel), so "Python" = cached - C run is the front's own cost.

  python bench/bench_conv_overhead.py                  # the table in bench/RESULTS.md
  python bench/bench_conv_overhead.py --calls 500 --repeats 15
"""
import argparse
import ctypes
import statistics
import time

import torch
import torch.nn.functional as F

import convweave
import convweave.torch as ct
from convweave import _conv
from convweave._lib import lib

SHAPES = [  # (N, C, H, W), K, kernel, padding
    ((1, 8, 16, 16), 8, 3, 1),
    ((1, 16, 8, 8), 16, 1, 0),
    ((1, 4, 32, 32), 4, 3, 1),
    ((2, 32, 8, 8), 32, 3, 1),
]


def per_call_us(fn, calls):
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.set_num_threads(1)
    convweave.default_context()  # created outside the timing
    print(f"convweave {convweave.version()}, torch {torch.__version__}, cpu, 1 torch thread; "
          f"median of {args.repeats} x {args.calls} calls (us per call)")
    print(f"{'input':>16} {'K':>3} {'k':>2} {'torch':>8} {'C run':>8} {'cached':>8} {'uncached':>9} "
          f"{'overhead':>9} {'Python':>7} {'overhead uncached':>18}")
    for shape, k, ks, pad in SHAPES:
        x = torch.randn(*shape)
        w = torch.randn(k, shape[1], ks, ks)
        b = torch.randn(k)
        with torch.no_grad():
            ref = F.conv2d(x, w, b, padding=pad)
            torch.testing.assert_close(ct.conv2d(x, w, b, padding=pad), ref, rtol=1e-4, atol=1e-4)
            key = next(reversed(_conv._plans))
            cp = _conv._plans[key]  # the plan the call above cached, run straight from C
            y = torch.empty(cp.yshape)
            xt, yt = ctypes.c_void_p(), ctypes.c_void_p()
            lib.cw_tensor_wrap(ctypes.byref(xt), cp.ctx.handle, ctypes.byref(cp.xdesc), x.data_ptr())
            lib.cw_tensor_wrap(ctypes.byref(yt), cp.ctx.handle, ctypes.byref(cp.ydesc), y.data_ptr())
            fns = {
                "torch": lambda: F.conv2d(x, w, b, padding=pad),
                "run": lambda: lib.cw_plan_run(cp.plan.handle, ctypes.byref(xt), 1, ctypes.byref(yt), 1),
                "cached": lambda: ct.conv2d(x, w, b, padding=pad),
                # the same checks and one-node plan, compiled per call: the previous behaviour
                "uncached": lambda: _conv._conv_slow(x, w, b, 1, pad, 1, 1, 2, None, 0, None, False, None),
            }
            for f in fns.values():
                per_call_us(f, max(10, args.calls // 10))  # warm up
            times = {n: [] for n in fns}
            for _ in range(args.repeats):
                for n, f in fns.items():
                    times[n].append(per_call_us(f, args.calls))
            lib.cw_tensor_destroy(xt)
            lib.cw_tensor_destroy(yt)
        med = {n: statistics.median(v) for n, v in times.items()}
        print(f"{str(list(shape)):>16} {k:>3} {ks:>2} {med['torch']:8.1f} {med['run']:8.1f} {med['cached']:8.1f} "
              f"{med['uncached']:9.1f} {med['cached'] - med['torch']:9.1f} {med['cached'] - med['run']:7.1f} "
              f"{med['uncached'] - med['torch']:18.1f}")


if __name__ == "__main__":
    main()
