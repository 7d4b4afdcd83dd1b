#!/usr/bin/env bash
# cw-vae's command line: the tiny fixture decodes to diffusers' output through the CLI,
# and bad input (flags, units, sizes, files, keys) is a one-line error with exit status 2
# that names what is wrong, leaving an existing output file untouched.
# usage: cli_cw_vae.sh CW_VAE_BINARY SOURCE_DIR
set -u
bin=$1 src=$2
fx=$src/tests/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0 n=0

# expect STATUS PATTERN -- args...: exit status and a stderr line matching PATTERN
expect() {
    local want=$1 pat=$2
    shift 3
    n=$((n + 1))
    "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [ "$got" != "$want" ] || ! grep -qE -- "$pat" "$tmp/err"; then
        echo "FAIL: cw-vae $* -> status $got (want $want), stderr:" >&2
        sed 's/^/    /' "$tmp/err" >&2
        fail=$((fail + 1))
    fi
}

tiny=(--preset tiny --weights "$fx/tiny_vae.safetensors" --latent "$fx/tiny_latent.npy" --backend cpu -q)

# 1. the fixture through the CLI: the raw output matches the diffusers reference
n=$((n + 1))
if "$bin" "${tiny[@]}" --budget 256KiB --streams 3 --raw "$tmp/y.npy" -o "$tmp/y.png" 2>"$tmp/err"; then
    python3 - "$tmp/y.npy" "$fx/tiny_out.npy" <<'PY' || fail=$((fail + 1))
import struct, sys
def load(p):
    b = open(p, 'rb').read()
    hl = struct.unpack('<H', b[8:10])[0]
    h = b[10:10 + hl].decode()
    assert "'<f4'" in h and "False" in h, h
    d = b[10 + hl:]
    return struct.unpack('<%df' % (len(d) // 4), d)
a, r = load(sys.argv[1]), load(sys.argv[2])
assert len(a) == len(r), (len(a), len(r))
m = max(abs(x) for x in r)
e = max(abs(x - y) for x, y in zip(a, r)) / m
print('cli fixture rel err %.3g' % e)
sys.exit(0 if e <= 1e-4 else 1)
PY
    [ -s "$tmp/y.png" ] || { echo "FAIL: no PNG written" >&2; fail=$((fail + 1)); }
else
    echo "FAIL: fixture decode: $(cat "$tmp/err")" >&2
    fail=$((fail + 1))
fi

# 2. bad input: status 2 and a message naming the culprit
expect 2 "size.*8"            -- --preset tiny --random-weights --size 100
expect 2 "budget|unit"        -- --preset tiny --random-weights --budget 12furlongs
expect 2 "streams"            -- --preset tiny --random-weights --streams 0
expect 2 "preset"             -- --preset nosuch --random-weights
expect 2 "nosuch.safetensors" -- --preset tiny --weights "$tmp/nosuch.safetensors"
expect 2 "decoder\.|post_quant_conv" -- --preset sd --weights "$fx/tiny_vae.safetensors" --size 64
head -c 300 "$fx/tiny_vae.safetensors" >"$tmp/trunc.safetensors"
expect 2 "trunc.safetensors|offset|header" -- --preset tiny --weights "$tmp/trunc.safetensors"
printf 'not a latent' >"$tmp/bad.npy"
expect 2 "bad.npy"            -- --preset tiny --random-weights --latent "$tmp/bad.npy"
expect 2 "unrecognized|unknown|invalid" -- --preset tiny --random-weights --no-such-flag

# 3. a failing run leaves an existing output as it was
echo "precious" >"$tmp/keep.png"
"$bin" --preset tiny --random-weights --size 100 -o "$tmp/keep.png" >/dev/null 2>&1
n=$((n + 1))
[ "$(cat "$tmp/keep.png")" = "precious" ] || { echo "FAIL: existing output overwritten" >&2; fail=$((fail + 1)); }

echo "$((n - fail)) passed, $fail failed"
[ "$fail" -eq 0 ]
