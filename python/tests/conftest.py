"""Shared test setup: one torch thread (CI has 2 cores for everyone), the repository root,
and random-weight diffusers VAEs built from a config (no hub)."""
import importlib.util
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "bench", "bench_python_vae.py")

try:
    import torch
    torch.set_num_threads(1)
except ImportError:  # the NumPy tests run without torch
    torch = None


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_python_vae", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def make_vae():
    """make_vae('tiny' | 'sd', seed) -> a fresh eval-mode AutoencoderKL (float32, cpu)."""
    pytest.importorskip("diffusers")
    return _bench_module().build_vae


def has_cuda():
    return torch is not None and torch.cuda.is_available()


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()
