#!/usr/bin/env bash
# Builds and runs every test: a Release build (with CUDA where the toolkit is found) whose
# tests run on this machine's OpenBLAS and oneDNN kernels and, on an AVX-512 host, again on
# the AVX2 (Haswell) ones, then
# ASan+UBSan and TSan builds of the cpu backend, then the safetensors, config.json and npy
# fuzz targets (clang, libFuzzer) over their regression corpora plus fixed-seed runs of new
# inputs, then the Python package's tests in a venv outside the clone.
# Usage: scripts/test.sh [release|asan|tsan|fuzz|python]...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc)
modes=("$@")
[ ${#modes[@]} -eq 0 ] && modes=(release asan tsan fuzz python)
for m in "${modes[@]}"; do
  case "$m" in
    release) dir=build;      flags=(-DCMAKE_BUILD_TYPE=Release); env=() ;;
    asan)    dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVWEAVE_ASAN=ON -DCONVWEAVE_CUDA=OFF -DCONVWEAVE_BUILD_BENCH=OFF); env=(CW_TEST_QUICK=1) ;;
    tsan)    dir=build-tsan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVWEAVE_TSAN=ON -DCONVWEAVE_CUDA=OFF -DCONVWEAVE_BUILD_BENCH=OFF); env=(CW_TEST_QUICK=1 CW_TEST_TSAN=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1) ;;
    fuzz)
      echo "=== [${SECONDS}s] fuzz build (build-fuzz)"
      CC=clang cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCONVWEAVE_FUZZ=ON \
        -DCONVWEAVE_CUDA=OFF -DCONVWEAVE_BUILD_TESTS=OFF -DCONVWEAVE_BUILD_BENCH=OFF -DCONVWEAVE_BUILD_DEMOS=OFF >/dev/null
      cmake --build build-fuzz -j"$jobs" --target fuzz_safetensors fuzz_vae_config fuzz_npy
      for t in safetensors:safetensors vae_config:config_json npy:npy; do
        echo "=== [${SECONDS}s] fuzz_${t%%:*}: regression corpus + 200000 fixed-seed runs"
        work=$(mktemp -d)
        ./build-fuzz/fuzz_${t%%:*} -seed=1 -runs=200000 -max_len=4096 -print_final_stats=1 "$work" tests/corpus/${t#*:}
        rm -rf "$work"
      done
      continue ;;
    python)
      # The Python package (python/): a virtual environment outside the clone, reused across
      # runs, with the pinned test requirements; the package built from this tree (its CMake
      # build cached in build-python/); then pytest. Mode "python" alone: scripts/test.sh python
      venv=${CONVWEAVE_VENV:-$HOME/.cache/convweave/venv}
      echo "=== [${SECONDS}s] python (venv $venv)"
      if [ ! -x "$venv/bin/python" ]; then
        python3 -c 'import ensurepip' 2>/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
        python3 -m venv "$venv"
      fi
      "$venv/bin/pip" install -q -r python/requirements-test.txt
      "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps \
        -Cbuild-dir="$PWD/build-python" ./python
      # one pytest process per core, at most 4 (each imports torch; most tests run on one core)
      (cd python && "$venv/bin/python" -m pytest -q -p no:cacheprovider -n $((jobs < 4 ? jobs : 4)) tests)
      continue ;;
    *) echo "unknown mode $m" >&2; exit 2 ;;
  esac
  echo "=== [${SECONDS}s] $m build ($dir)"
  cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
  cmake --build "$dir" -j"$jobs"
  if [ "$m" = release ]; then
    # The determinism contract holds on every CPU: run the Release tests as a user's plain
    # ctest does (this machine's OpenBLAS and oneDNN kernels, default threading), then on the
    # AVX2 kernels of both, which every x86-64 development machine has (docs/determinism.md).
    # On a host without AVX-512 the native run already took the AVX2 kernels of both (oneDNN's
    # avx2; OpenBLAS's Haswell or Zen, whose sgemm is Haswell's, and only where oneDNN refuses a
    # GEMM): the second run would repeat the first, so it runs only where AVX-512 is there.
    cores=(native)
    grep -qw avx512f /proc/cpuinfo && cores+=(Haswell)
    for core in "${cores[@]}"; do
      echo "=== [${SECONDS}s] $m tests, OpenBLAS core: $core"
      if [ "$core" = native ]; then
        ctest --test-dir "$dir" --output-on-failure -j"$jobs"
      else
        OPENBLAS_CORETYPE=$core ONEDNN_MAX_CPU_ISA=AVX2 ctest --test-dir "$dir" --output-on-failure -j"$jobs"
      fi
      grep -m1 "^OpenBLAS core:" "$dir/Testing/Temporary/LastTest.log" || true
    done
    echo "=== [${SECONDS}s] gpu-check --no-device"; bash scripts/gpu-check.sh --no-device --build-dir "$dir"
    continue
  fi
  echo "=== [${SECONDS}s] $m tests"
  env "${env[@]}" ctest --test-dir "$dir" --output-on-failure -j"$jobs"
done
