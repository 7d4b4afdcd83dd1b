#!/usr/bin/env bash
# Installs what convweave needs to build and test on a fresh Debian machine (idempotent).
# CUDA (nvcc, cuDNN, cuBLAS, NVTX3) is optional and expected at /usr/local/cuda.
set -euo pipefail
pkgs=(cmake ninja-build gcc g++ clang libclang-rt-dev pkg-config python3 libopenblas-dev libcjson-dev libpng-dev libdnnl-dev
      libopenmpi-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
