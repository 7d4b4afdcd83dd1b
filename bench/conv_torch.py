"""The same convolution as bench_conv_api in PyTorch (f32, CPU, N = 1, H = W, stride 1,
"same" padding, bias), with the same thread count; prints best/median time, GFLOP/s and
the process's peak RSS.

    python bench/conv_torch.py C,K,k,H [--threads T] [--reps R]
"""
import argparse
import resource
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("shape")
ap.add_argument("--threads", type=int, default=0)
ap.add_argument("--reps", type=int, default=3)
a = ap.parse_args()
c, k, ks, h = (int(v) for v in a.shape.split(","))
if a.threads > 0:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
conv = torch.nn.Conv2d(c, k, ks, padding=ks // 2)
x = torch.rand(1, c, h, h) - 0.5
ts = []
with torch.inference_mode():
    for _ in range(a.reps):
        t0 = time.perf_counter()
        y = conv(x)
        ts.append(time.perf_counter() - t0)
        del y
ts.sort()
flops = 2.0 * k * c * ks * ks * h * h
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(f"torch {torch.__version__} {c}->{k} k{ks} {h}^2 threads {torch.get_num_threads()}: best {ts[0]:.3f} s, "
      f"median {ts[len(ts) // 2]:.3f} s, {flops / ts[0] * 1e-9:.1f} GFLOP/s, peak RSS {rss:.1f} MiB")
