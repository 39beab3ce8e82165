#!/bin/bash
# make bench: every benchmark, tables into bench/results/.
# REAL_SHAPES=full (default) | quick | skip chooses how the real-shapes suite runs
# (bench/real_shapes.sh: ~25 min full, ~10 min quick on 2 cores; it resumes when run by hand
# without --fresh).
# OpenBLAS is a peer here: this machine's environment pins it to AVX2 kernels through
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE; the benchmarks run with both unset so OpenBLAS uses
# its real kernels (the kernels table prints which one it chose).
set -eu
cd "$(dirname "$0")/.."
mkdir -p bench/results
B=${BUILD:-build}/bench
case "${REAL_SHAPES:-full}" in
full | quick | skip) ;;
*) echo "run.sh: REAL_SHAPES must be full, quick or skip" >&2; exit 2 ;;
esac
run() { echo "== $*"; env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@"; }
run "$B/kernels" --out bench/results/kernels.md
[ -x "$B/tlm_decode" ] && run "$B/tlm_decode"
# tlmd on loopback: cache hits, cold compiles, decoder batch sizes (bench/server.sh)
[ -x "$B/server_load" ] && run bench/server.sh bench/results/server.md
# the real-shapes suite, both CPU targets, beside PyTorch / ORT / OpenBLAS / oneDNN. Not
# through run(): it unsets the OpenBLAS pins itself, only where OpenBLAS is the peer.
case "${REAL_SHAPES:-full}" in
full) echo "== bench/real_shapes.sh --fresh"; bench/real_shapes.sh --fresh ;;
quick) echo "== bench/real_shapes.sh --fresh --quick"; bench/real_shapes.sh --fresh --quick ;;
skip) ;;
esac
echo "tables in bench/results/"
