#!/usr/bin/env bash
# bench_vae.sh: the SD VAE decoder (random weights, f32, cpu backend) scheduled under a
# budget against the unscheduled reference, at several sizes: time and peak RSS (each run
# in its own process, see cw-vae --help). Targets at 512^2: RSS <= 0.6x, time <= 1.10x.
#
# usage: bench/bench_vae.sh [cw-vae binary]     (default: build/cw-vae)
# env:   SIZES="256 512 1024"  BUDGETS="64MiB 256MiB"  STREAMS="1 2 3"  REPEAT=1  THREADS=
#        PRESET=sd (tiny for a smoke test)
# For each size and budget the stream count with the fastest scheduled decode is found with
# plain runs, then `cw-vae --compare` runs it against the reference and prints its table.
set -euo pipefail

BIN=${1:-build/cw-vae}
SIZES=${SIZES:-"256 512 1024"}
BUDGETS=${BUDGETS:-"64MiB 256MiB"}
STREAMS=${STREAMS:-"1 2 3"}
REPEAT=${REPEAT:-1}
THREADS=${THREADS:-}

if [ ! -x "$BIN" ]; then
    echo "bench_vae.sh: $BIN is not an executable cw-vae (build it, or pass its path)" >&2
    exit 2
fi
common=(--preset ${PRESET:-sd} --random-weights --seed 1 --backend cpu --dtype f32 --repeat "$REPEAT")
[ -n "$THREADS" ] && common+=(--threads "$THREADS")

# "... : 123.4 ms; ..." from a plain run's summary line
run_ms() { sed -n 's/.*: \([0-9.]*\) ms; peak temp.*/\1/p'; }

summary=()
for size in $SIZES; do
    for budget in $BUDGETS; do
        best_s="" best_ms=""
        for s in $STREAMS; do
            if ! out=$("$BIN" "${common[@]}" --size "$size" --budget "$budget" --streams "$s" 2>&1); then
                echo "size $size, budget $budget, $s streams: $out" >&2
                continue
            fi
            ms=$(printf '%s\n' "$out" | run_ms)
            echo "size $size, budget $budget, $s stream(s): $ms ms" >&2
            if [ -n "$ms" ] && { [ -z "$best_ms" ] || awk -v a="$ms" -v b="$best_ms" 'BEGIN{exit !(a < b)}'; }; then
                best_s=$s best_ms=$ms
            fi
        done
        if [ -z "$best_s" ]; then
            summary+=("$(printf '%5s  %-8s  no stream count fits' "$size" "$budget")")
            continue
        fi
        echo
        echo "== ${size}x${size}, budget $budget, $best_s stream(s) (fastest of: $STREAMS)"
        table=$("$BIN" "${common[@]}" --size "$size" --budget "$budget" --streams "$best_s" --compare)
        printf '%s\n' "$table"
        # ratios from the table's last line: "scheduled / unscheduled: time 0.95x, peak RSS 0.42x, ..."
        ratio=$(printf '%s\n' "$table" | sed -n 's/^scheduled \/ unscheduled: //p')
        summary+=("$(printf '%5s  %-8s  %7s  %s' "$size" "$budget" "$best_s" "$ratio")")
    done
done

echo
echo "summary (scheduled / unscheduled; targets at 512: time <= 1.10x, peak RSS <= 0.6x)"
printf '%5s  %-8s  %7s  %s\n' "size" "budget" "streams" "ratios"
for line in "${summary[@]}"; do printf '%s\n' "$line"; done
