#!/usr/bin/env bash
# Runs PROGRAM on N ranks with mpirun as cw-vae --ranks starts it (more ranks than cores, no
# binding, root allowed), or exits 77 when mpirun cannot start N ranks here.
# usage: mpi_run.sh N PROGRAM [ARGS...]
set -u
n=$1
shift
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Open MPI under the sanitizers: its components leak at MPI_Finalize (dlclosed by then, so
# LeakSanitizer cannot name them to suppress), and its TCP transport takes two of its locks in
# both orders (tests/openmpi.tsan.supp); memory errors and races in our code still fail
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
export TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/openmpi.tsan.supp"
read -r -a mpirun <<<"${CW_VAE_MPIRUN:-mpirun --oversubscribe --bind-to none}"
if ! timeout 60 "${mpirun[@]}" -n "$n" true >/dev/null 2>&1; then
    echo "skipped: '${mpirun[*]} -n $n true' fails here"
    exit 77
fi
exec timeout 300 "${mpirun[@]}" -n "$n" "$@"
