#!/usr/bin/env bash
# One command that proves the cuda backend on a GPU (H100/H200, sm_90): builds for sm_90,
# prints the driver and device, runs every GPU test, decodes with the SD decoder
# (cw-vae --preset sd --random-weights) at 256^2 on cuda with 1/2/3 streams (one fixed-patch
# plan: bitwise equal to each other) and against the cpu backend (within a relative
# tolerance), then at 1024^2 under budgets 256 MiB / 1 GiB / unlimited with the device's
# memory sampled by nvidia-smi next to the library's own peaks, and runs the single-conv
# benchmark. Writes a markdown summary ready to paste into bench/RESULTS.md. Exit status:
# the number of failed checks (0 = all passed; 2 with a usage line for bad arguments).
#
#   scripts/gpu-check.sh                 everything (needs a GPU; about 5-8 minutes)
#   scripts/gpu-check.sh --no-device     the host-only part, for CI without a GPU: build,
#                                        cuDNN descriptor tests, GPU tests and the benchmark
#                                        skip with 77, cw-vae --backend cuda fails cleanly,
#                                        this script's own argument handling
# options: --build-dir DIR (default build-gpu; --no-device: build), --summary FILE (default
#          DIR/gpu-check-summary.md), --tol REL (cuda vs cpu, default 1e-3), --jobs N,
#          --arch LIST (CMAKE_CUDA_ARCHITECTURES, default 90), -h/--help
set -uo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/.."

usage() { sed -n '2,20p' "$self" | sed 's/^# \{0,1\}//'; }
no_device=0 build_dir="" summary="" tol=1e-3 jobs=$(nproc) arch=90
while [ $# -gt 0 ]; do
    case "$1" in
        --no-device) no_device=1 ;;
        --build-dir) [ $# -ge 2 ] || { echo "gpu-check: --build-dir needs a value" >&2; exit 2; }; build_dir=$2; shift ;;
        --summary) [ $# -ge 2 ] || { echo "gpu-check: --summary needs a value" >&2; exit 2; }; summary=$2; shift ;;
        --tol) [ $# -ge 2 ] || { echo "gpu-check: --tol needs a value" >&2; exit 2; }; tol=$2; shift ;;
        --jobs) [ $# -ge 2 ] || { echo "gpu-check: --jobs needs a value" >&2; exit 2; }; jobs=$2; shift ;;
        --arch) [ $# -ge 2 ] || { echo "gpu-check: --arch needs a value" >&2; exit 2; }; arch=$2; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu-check: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$tol" in ''|*[!0-9.eE+-]*) echo "gpu-check: --tol '$tol' is not a number" >&2; exit 2 ;; esac
case "$jobs" in ''|*[!0-9]*) echo "gpu-check: --jobs '$jobs' is not a count" >&2; exit 2 ;; esac
[ -n "$build_dir" ] || { [ $no_device = 1 ] && build_dir=build || build_dir=build-gpu; }
[ -n "$summary" ] || summary=$build_dir/gpu-check-summary.md

t_start=$(date +%s)
fails=0
failed=()
work=$(mktemp -d)
sampler_pid=""
cleanup() { [ -n "$sampler_pid" ] && kill "$sampler_pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

log() { echo "=== [$(( $(date +%s) - t_start ))s] $*"; }
fail() { fails=$((fails + 1)); failed+=("$1"); echo "FAIL: $1" >&2; }
sum() { echo "$*" >>"$summary.tmp"; }

# ---- build ---------------------------------------------------------------------------------
targets=(convweave test_cudnn_desc bench_conv_gpu cw-vae)
for f in tests/test_*_gpu.c; do [ -e "$f" ] && targets+=("$(basename "$f" .c)"); done
if [ $no_device = 1 ]; then log "build ($build_dir, its configured CUDA architectures)"; else log "build ($build_dir, CUDA architectures $arch)"; fi
cfg=(-G Ninja -DCMAKE_BUILD_TYPE=Release)
[ $no_device = 1 ] || cfg+=(-DCONVWEAVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch")
if ! cmake -S . -B "$build_dir" "${cfg[@]}" >"$work/cmake.log" 2>&1; then
    cat "$work/cmake.log" >&2
    fail "configure"
    exit "$fails"
fi
if ! grep -q "convweave: CUDA backend ON" "$work/cmake.log"; then
    echo "gpu-check: this build has no CUDA backend (toolkit or cuDNN not found): nothing to check" >&2
    exit 0
fi
if ! cmake --build "$build_dir" -j"$jobs" --target "${targets[@]}" >"$work/build.log" 2>&1; then
    tail -40 "$work/build.log" >&2
    fail "build"
    exit "$fails"
fi
bin=$build_dir
gpu_tests=$(for f in tests/test_*_gpu.c; do [ -e "$f" ] && basename "$f" .c; done)

# runs NAME EXPECTED_STATUS CMD...: one check; stdout+stderr in $work/NAME.log
check() {
    local name=$1 want=$2
    shift 2
    "$@" >"$work/$name.log" 2>&1
    local got=$?
    if [ "$got" != "$want" ]; then
        echo "--- $name: status $got, expected $want; last lines:" >&2
        tail -20 "$work/$name.log" >&2
        fail "$name"
        return 1
    fi
    return 0
}

# ---- host-only part ------------------------------------------------------------------------
if [ $no_device = 1 ]; then
    log "host-only checks"
    check test_cudnn_desc 0 "$bin/test_cudnn_desc" && echo "test_cudnn_desc: passed"
    for t in $gpu_tests; do
        check "$t" 77 "$bin/$t" && echo "$t: skipped (77) without a device, as it must"
    done
    check bench_conv_gpu 77 "$bin/bench_conv_gpu" --quick && echo "bench_conv_gpu: skipped (77)"
    check bench_args 2 "$bin/bench_conv_gpu" --dtype f8 && echo "bench_conv_gpu --dtype f8: usage error (2)"
    if check cw_vae_cuda 2 "$bin/cw-vae" --preset sd --random-weights --size 64 --backend cuda -q; then
        grep -q "no device" "$work/cw_vae_cuda.log" || fail "cw_vae_cuda: no 'no device' message"
        echo "cw-vae --backend cuda: clean no-device error (2)"
    fi
    # this script's own argument handling (the checks above need no device either)
    check self_bad_arg 2 bash "$self" --bogus && echo "gpu-check --bogus: usage error (2)"
    check self_bad_tol 2 bash "$self" --tol abc && echo "gpu-check --tol abc: usage error (2)"
    check self_help 0 bash "$self" --help && grep -q -- "--no-device" "$work/self_help.log" && echo "gpu-check --help: ok"
    log "host-only: $fails failure(s)${failed[*]:+: ${failed[*]}}"
    exit "$fails"
fi

# ---- device part ---------------------------------------------------------------------------
: >"$summary.tmp"
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu-check: nvidia-smi not found: no NVIDIA driver on this machine (use --no-device)" >&2
    fail "nvidia-smi"
    exit "$fails"
fi
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
device=$(nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader | head -1)
log "driver $driver; device $device"
cuda_ver=$(/usr/local/cuda/bin/nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
sum "### GPU check: $device"
sum ""
sum "\`scripts/gpu-check.sh\` on $(date -u +%Y-%m-%d): driver $driver, CUDA $cuda_ver, commit $(git rev-parse --short HEAD 2>/dev/null), built for sm_$arch."
sum ""

# every GPU test (a skip on a GPU machine is a failure: the device was not usable)
log "GPU tests: $gpu_tests test_cudnn_desc"
sum "| check | result |"
sum "|---|---|"
for t in $gpu_tests test_cudnn_desc; do
    if check "$t" 0 timeout 240 "$bin/$t"; then
        last=$(tail -1 "$work/$t.log" | cut -c1-120)
        sum "| $t | passed (${last//|/\\|}) |"
    else
        sum "| $t | **FAILED** |"
    fi
done

# npy f32 comparison: max|a-b| / max|a|; "bitwise" when every byte is equal
cat >"$work/npycmp.c" <<'EOF'
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static float *load(const char *p, long *n) {
    FILE *f = fopen(p, "rb");
    unsigned char h[12];
    if (!f || fread(h, 1, 10, f) != 10 || memcmp(h, "\x93NUMPY", 6)) { fprintf(stderr, "%s: not .npy\n", p); exit(3); }
    long hl = h[8] | h[9] << 8;
    if (h[6] >= 2) { if (fread(h + 10, 1, 2, f) != 2) exit(3); hl |= (long)h[10] << 16 | (long)h[11] << 24; }
    fseek(f, 0, SEEK_END);
    long end = ftell(f), off = (h[6] >= 2 ? 12 : 10) + hl;
    *n = (end - off) / 4;
    float *a = malloc((size_t)*n * 4);
    fseek(f, off, SEEK_SET);
    if (!a || fread(a, 4, (size_t)*n, f) != (size_t)*n) exit(3);
    fclose(f);
    return a;
}
int main(int c, char **v) {
    long n, m;
    float *a = load(v[1], &n), *b = load(v[2], &m);
    double tol = atof(v[3]), mx = 0, d = 0;
    if (n != m) { printf("sizes differ: %ld vs %ld\n", n, m); return 1; }
    for (long i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (fabs(a[i]) > mx) mx = fabs(a[i]);
        if (!(e <= d)) d = isnan(e) ? INFINITY : e;
    }
    double rel = d / (mx > 0 ? mx : 1);
    printf("max|diff| %.3g, relative %.3g (tolerance %.3g)%s\n", d, rel, tol, memcmp(a, b, (size_t)n * 4) ? "" : ", bitwise equal");
    return rel <= tol ? 0 : 1;
}
EOF
cc -O2 -o "$work/npycmp" "$work/npycmp.c" -lm || fail "npycmp build"

vae=("$bin/cw-vae" --preset sd --random-weights -q)
# 256^2: cuda with 1/2/3 streams on one fixed-patch plan (unlimited workspace: the same
# engines whatever the stream count), bitwise equal; and the cpu backend within --tol
log "SD decoder 256^2: cuda 1/2/3 streams, cpu"
for s in 1 2 3; do
    check "vae256_cuda_s$s" 0 timeout 120 "${vae[@]}" --size 256 --backend cuda --streams $s --patches 4 \
        --budget unlimited --raw "$work/cuda_s$s.npy"
done
check vae256_cpu 0 timeout 240 "${vae[@]}" --size 256 --backend cpu --streams 2 --patches 4 --budget unlimited \
    --raw "$work/cpu.npy"
for s in 2 3; do
    if [ -f "$work/cuda_s1.npy" ] && [ -f "$work/cuda_s$s.npy" ] && cmp -s "$work/cuda_s1.npy" "$work/cuda_s$s.npy"; then
        sum "| SD 256², cuda, $s streams vs 1 (4 patches) | bitwise equal |"
    else
        fail "vae256 streams $s vs 1 not bitwise equal"
        sum "| SD 256², cuda, $s streams vs 1 (4 patches) | **differs**: $("$work/npycmp" "$work/cuda_s1.npy" "$work/cuda_s$s.npy" 0 2>&1) |"
    fi
done
if [ -f "$work/cpu.npy" ] && [ -f "$work/cuda_s1.npy" ]; then
    r=$("$work/npycmp" "$work/cpu.npy" "$work/cuda_s1.npy" "$tol" 2>&1) || fail "vae256 cuda vs cpu: $r"
    sum "| SD 256², cuda vs cpu | $r |"
else
    fail "vae256 cuda vs cpu: missing output"
fi

# 1024^2 under budgets, device memory sampled every 50 ms next to the library's peaks
sum ""
sum "SD decoder 1024² (f32, 2 streams), \`cw-vae --preset sd --random-weights --size 1024 --backend cuda --budget B\`; device used = nvidia-smi memory.used peak minus the idle baseline."
sum ""
sum "| budget | result (cw-vae's line) | device used peak over idle (MiB) |"
sum "|---|---|---|"
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
for b in 256MiB 1GiB unlimited; do
    log "SD decoder 1024^2, budget $b"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$work/mem_$b.txt" 2>/dev/null &
    sampler_pid=$!
    check "vae1024_$b" 0 timeout 150 "$bin/cw-vae" --preset sd --random-weights --size 1024 --backend cuda --budget "$b"
    kill "$sampler_pid" 2>/dev/null
    wait "$sampler_pid" 2>/dev/null
    sampler_pid=""
    peak=$(sort -n "$work/mem_$b.txt" | tail -1)
    line=$(grep -m1 "cuda backend" "$work/vae1024_$b.log" || tail -1 "$work/vae1024_$b.log")
    sum "| $b | ${line//|/\\|} | $(( ${peak:-0} - ${base:-0} )) |"
done

# the single-conv benchmark (quick sizes)
log "bench_conv_gpu --quick"
sum ""
if check bench_conv_gpu 0 timeout 180 "$bin/bench_conv_gpu" --quick --reps 2; then
    sum "\`bench_conv_gpu --quick --reps 2\`:"
    sum ""
    grep '^|' "$work/bench_conv_gpu.log" >>"$summary.tmp"
else
    sum "bench_conv_gpu: **FAILED** (status, see the run's log)"
fi

elapsed=$(( $(date +%s) - t_start ))
sum ""
sum "$fails failure(s)${failed[*]:+: ${failed[*]}}; ${elapsed} s in all."
mv "$summary.tmp" "$summary"
log "done in ${elapsed}s: $fails failure(s); summary in $summary"
cat "$summary"
exit "$fails"
