#!/usr/bin/env bash
# cw-vae --ranks (issue 27): a decode (and an encode) split over 2 and 3 processes by mpirun
# gives bit for bit the output of one process with the same fixed --patches, in f32 and bf16,
# for the fixture's latent and a batch; --patches auto stays within the reference's
# tolerance; bad combinations are one-line errors (status 2); a rank's failure is reported
# with its rank, writes nothing and leaves no staged file; a stop signal leaves no rank
# behind. Skips (77) where mpirun cannot start ranks.
# usage: cli_cw_vae_ranks.sh CW_VAE_BINARY SOURCE_DIR
set -u
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") src=$2
fx=$src/tests/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 n=0

[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI under the sanitizers: its components leak at MPI_Finalize (dlclosed by then, so
# LeakSanitizer cannot name them to suppress), and its TCP transport takes two of its locks in
# both orders (tests/openmpi.tsan.supp); memory errors and races in our code still fail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/openmpi.tsan.supp"
read -r -a mpirun <<<"${CW_VAE_MPIRUN:-mpirun --oversubscribe --bind-to none}"
if ! timeout 60 "${mpirun[@]}" -n 3 true >/dev/null 2>&1; then
    echo "skipped: '${mpirun[*]} -n 3 true' fails here"
    exit 77
fi

bad() { echo "FAIL: $*" >&2; fail=$((fail + 1)); }

# run NAME ARGS...: cw-vae ARGS, status 0 expected, stderr kept in $tmp/NAME.err
run() {
    local name=$1
    shift
    n=$((n + 1))
    timeout 300 "$bin" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" ||
        { bad "cw-vae $* -> status $?:"; sed 's/^/    /' "$tmp/$name.err" >&2; return 1; }
}
# same A B: the two files are identical, byte for byte
same() {
    n=$((n + 1))
    cmp -s "$1" "$2" || bad "$(basename "$1") and $(basename "$2") differ: $(cmp "$1" "$2" 2>&1 | head -1)"
}
# expect STATUS PATTERN -- ARGS...: exit status and a stderr line matching PATTERN
expect() {
    local want=$1 pat=$2
    shift 3
    n=$((n + 1))
    timeout 120 "$bin" "$@" >"$tmp/x.out" 2>"$tmp/x.err"
    local got=$?
    if [ "$got" != "$want" ] || ! grep -qE -- "$pat" "$tmp/x.err"; then
        bad "cw-vae $* -> status $got (want $want), stderr:"
        sed 's/^/    /' "$tmp/x.err" >&2
    fi
}

# Bit for bit against one process's plan that stores every activation (--memory none, on
# both sides): a rank's plan never writes a block's result over its input (lower.c,
# cw__split_bytes), so under the default --memory auto the two may climb the memory ladder to
# different points, whose convs can take other algorithms (seen on AVX2 oneDNN in bf16).
stored=(--memory none)
tiny=(--preset tiny --weights "$fx/tiny_vae.safetensors" --latent "$fx/tiny_latent.npy" --backend cpu -q)

# 1. the fixture, f32: one process, then 2 and 3 ranks with the same patches; raw and PNG equal
for p in 4 7; do
    run one_$p "${tiny[@]}" --patches $p "${stored[@]}" --raw "$tmp/one_$p.npy" -o "$tmp/one_$p.png"
    for r in 2 3; do
        run r${r}_$p "${tiny[@]}" --patches $p --ranks $r "${stored[@]}" --raw "$tmp/r${r}_$p.npy" -o "$tmp/r${r}_$p.png" &&
            { same "$tmp/r${r}_$p.npy" "$tmp/one_$p.npy"; same "$tmp/r${r}_$p.png" "$tmp/one_$p.png"; }
    done
done
# 3 streams and a budget: the same patches, the same bits
run one_s3 "${tiny[@]}" --patches 4 --streams 3 --budget 1MiB "${stored[@]}" --raw "$tmp/one_s3.npy"
run r3_s3 "${tiny[@]}" --patches 4 --streams 3 --budget 1MiB --ranks 3 "${stored[@]}" --raw "$tmp/r3_s3.npy" &&
    same "$tmp/r3_s3.npy" "$tmp/one_s3.npy"

# fewer patches than ranks: the patches stay as given (a rank may run none of a conv), so the
# output is one process's with --patches 2, bit for bit
run one_2 "${tiny[@]}" --patches 2 "${stored[@]}" --raw "$tmp/one_2.npy"
run r3_2 "${tiny[@]}" --patches 2 --ranks 3 "${stored[@]}" --raw "$tmp/r3_2.npy" && same "$tmp/r3_2.npy" "$tmp/one_2.npy"

# 2. bf16 storage (half-precision messages)
bf=(--preset tiny --weights "$fx/tiny_vae_bf16.safetensors" --latent "$fx/tiny_latent.npy" --backend cpu -q --dtype bf16)
run one_bf "${bf[@]}" --patches 4 "${stored[@]}" --raw "$tmp/one_bf.npy"
run r2_bf "${bf[@]}" --patches 4 --ranks 2 "${stored[@]}" --raw "$tmp/r2_bf.npy" && same "$tmp/r2_bf.npy" "$tmp/one_bf.npy"

# 3. a batch of random latents, and the encoder (stride-2 convs: their halos)
rnd=(--preset tiny --random-weights --size 128 --batch 2 --backend cpu -q --patches 5)
run one_b "${rnd[@]}" "${stored[@]}" --raw "$tmp/one_b.npy"
run r3_b "${rnd[@]}" --ranks 3 "${stored[@]}" --raw "$tmp/r3_b.npy" && same "$tmp/r3_b.npy" "$tmp/one_b.npy"
enc=(--preset tiny --weights "$fx/tiny_enc.safetensors" --encode "$fx/tiny_image0.png" --backend cpu -q --patches 4)
run one_e "${enc[@]}" "${stored[@]}" --latent-out "$tmp/one_e.npy"
run r2_e "${enc[@]}" --ranks 2 "${stored[@]}" --latent-out "$tmp/r2_e.npy" && same "$tmp/r2_e.npy" "$tmp/one_e.npy"

# 4. --patches auto (at least a patch per rank): diffusers' output within the CLI's tolerance
run r3_auto "${tiny[@]}" --ranks 3 --raw "$tmp/r3_auto.npy" &&
    python3 - "$tmp/r3_auto.npy" "$fx/tiny_out.npy" <<'PY' || bad "--ranks 3 --patches auto vs tiny_out.npy"
import struct, sys
def load(p):
    b = open(p, 'rb').read()
    hl = struct.unpack('<H', b[8:10])[0]
    d = b[10 + hl:]
    return struct.unpack('<%df' % (len(d) // 4), d)
a, r = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(r), (len(a), len(r))
e = max(abs(x - y) for x, y in zip(a, r)) / max(abs(x) for x in r)
print('--ranks 3, patches auto: rel err %.3g' % e)
sys.exit(0 if e <= 1e-4 else 1)
PY

# 5. --compare-ranks: one table, the one-process row, and bit-identical with fixed patches
run cmp "${tiny[@]}" --patches 4 --ranks 2 --compare-ranks
n=$((n + 1))
grep -q "^1 process " "$tmp/cmp.out" && grep -q "^rank 1/2 " "$tmp/cmp.out" && grep -q "max|diff| 0 (bit-identical)" "$tmp/cmp.out" ||
    { bad "--compare-ranks table:"; sed 's/^/    /' "$tmp/cmp.out" >&2; }

# 6. bad combinations, and a failure on the ranks: one line, status 2, nothing written
expect 2 "ranks '0'"            -- "${tiny[@]}" --ranks 0
expect 2 "ranks '33'.*32"       -- "${tiny[@]}" --ranks 33
expect 2 "compare-ranks needs"  -- "${tiny[@]}" --compare-ranks
expect 2 "not with --compare"   -- "${tiny[@]}" --ranks 2 --compare
expect 2 "trace"                -- "${tiny[@]}" --ranks 2 --trace "$tmp/t.json"
OMPI_COMM_WORLD_SIZE=2 expect 2 "starts mpirun itself" -- "${tiny[@]}" --ranks 2
expect 2 "^cw-vae: rank [01]/2: compile: .*budget" -- "${tiny[@]}" --ranks 2 --budget 1KiB --raw "$tmp/nope.npy"
n=$((n + 1))
[ ! -e "$tmp/nope.npy" ] && ! ls "$tmp"/*.cw-* >/dev/null 2>&1 || bad "a failed --ranks run left $(ls "$tmp"/nope.npy "$tmp"/*.cw-* 2>/dev/null)"
CW_VAE_MPIRUN=/nonexistent/mpirun expect 1 "cannot run it" -- "${tiny[@]}" --ranks 2

# 7. SIGTERM to cw-vae while its ranks run: it dies of it, and no rank (or mpirun) is left
"$bin" --preset sd --random-weights --size 256 --backend cpu --ranks 2 -q -o "$tmp/k.png" >/dev/null 2>&1 &
pid=$!
desc() { # every descendant of $1
    local c
    for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; desc "$c"; done
}
kids=""
for _ in $(seq 200); do
    kids=$(desc $pid)
    [ "$(echo "$kids" | wc -w)" -ge 3 ] && break # mpirun and two ranks
    sleep 0.05
done
sleep 0.5
kill -TERM $pid
wait $pid
st=$?
sleep 1
n=$((n + 1))
[ $st = 143 ] || bad "SIGTERM: status $st, want 143"
n=$((n + 1))
left=""
for k in $kids; do [ -d /proc/"$k" ] && ! grep -q "^State:.*Z" /proc/"$k"/status 2>/dev/null && left="$left $k"; done
[ -z "$left" ] || { bad "SIGTERM left processes behind:$left"; ps -o pid,ppid,cmd -p ${left// /,} >&2; kill -KILL $left 2>/dev/null; }
n=$((n + 1))
[ ! -e "$tmp/k.png" ] && ! ls "$tmp"/*.cw-* >/dev/null 2>&1 || bad "SIGTERM left outputs or staged files"

echo "$((n - fail)) passed, $fail failed"
[ "$fail" -eq 0 ]
