#!/bin/bash
# make bench: every benchmark, tables into bench/results/.
# OpenBLAS is a peer here: this machine's environment pins it to AVX2 kernels through
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE; the benchmarks run with both unset so OpenBLAS uses
# its real kernels (the kernels table prints which one it chose).
set -eu
cd "$(dirname "$0")/.."
mkdir -p bench/results
B=${BUILD:-build}/bench
run() { echo "== $*"; env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$@"; }
run "$B/kernels" --out bench/results/kernels.md
[ -x "$B/tlm_decode" ] && run "$B/tlm_decode"
# tlmd on loopback: cache hits, cold compiles, decoder batch sizes (bench/server.sh)
[ -x "$B/server_load" ] && run bench/server.sh bench/results/server.md
echo "tables in bench/results/"
