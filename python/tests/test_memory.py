"""A decode and an encode under convweave need less working memory than diffusers' own
(peak RSS during the call minus RSS before convweave was enabled or wrapped, so what it
holds between calls counts), each measured in a fresh process by bench/bench_python_vae.py,
through enable() and through torch.wrap: the tiny VAE (SD's layout at narrow widths)
decoding a 64x64 latent (512x512 image) and encoding a 1024x1024 image, sizes where its
activations, not the process's fixed costs, dominate (its encoder at 512x512 holds ~50 MiB
in diffusers, about what convweave's context and oneDNN plans take); the SD-sized figures
are in bench/RESULTS.md."""
import json
import os
import subprocess
import sys

import pytest

from conftest import BENCH

pytest.importorskip("diffusers")


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("part", ["decoder", "encoder"])
def test_working_memory_below_diffusers(part):
    latent = "64" if part == "decoder" else "128"
    r = subprocess.run([sys.executable, BENCH, "--part", part, "--config", "tiny", "--latent", latent,
                        "--budget", "4MiB", "--streams", "2", "--threads", "1", "--modes",
                        "diffusers,convweave,wrap", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    d = res["diffusers"]["working_bytes"]
    for mode in ("convweave", "wrap"):  # the hand mapping and the generic torch.export front
        c = res[mode]["working_bytes"]
        print(f"{part} working memory: diffusers {d / 2**20:.1f} MiB, {mode} {c / 2**20:.1f} MiB")
        assert 0 < c < d
        assert res[mode]["stats"]["temp_peak"] <= 4 << 20
        assert res[mode]["max_rel_diff"] <= 1e-5
