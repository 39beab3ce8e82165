#!/bin/bash
# bench/real_shapes.sh — the real-shapes suite end to end: our kernels for each target
# (default and best of N random schedules), OpenBLAS/oneDNN and the machine's limits,
# PyTorch eager, ONNX Runtime, then bench/results/real_shapes.md and real_shapes.png.
#
#   bench/real_shapes.sh [--quick] [--fresh] [--random N] [--budget-min M] [--only NAMES]
#                        [--targets T1,T2] [--no-ort] [--no-setup]
#
# Default: every workload of bench/suites/real_shapes.json, targets cpu and cpu:avx2, N = 16
# random schedules per pair, paced to ~22 minutes (--budget-min; 0 = always all N; a pair
# that runs out of its share measures fewer, at least 2, and the table says how many); setup
# and the report add a little. --quick: the suite's "quick" subset (13 workloads) with N = 4
# and an 8-minute pace. Without --fresh an interrupted sweep resumes: one JSON line per
# workload and target (and per peer) is appended to bench/results/real_shapes.jsonl, and
# what is there is skipped (our kernels: same bench build and N). --fresh starts over.
# After each workload's first pass, 3 head-to-head rounds (2 with --quick) re-measure our
# default and best kernels and every peer alternately; the report takes each figure's best
# median, ours and the peers' alike (real_shapes.c rs_rounds).
# `make bench` (bench/run.sh) runs it with --fresh.
#
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, which some hosts set to hold OpenBLAS to older
# kernels, are unset only in the one command that measures OpenBLAS as a peer (directly and
# inside PyTorch, whose Debian build runs its matmuls on OpenBLAS): the sweep itself.
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}/bench
R=bench/results
start=$(date +%s)

sel=() fresh=() ours_extra=() ort=1 setup=1 budget=22 targets=cpu,cpu:avx2
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) sel+=(--quick); budget=8 ;;
    --fresh) fresh=(--fresh) ;;
    --only) sel+=(--only "$2"); shift ;;
    --random) ours_extra+=("$1" "$2"); shift ;;
    --targets) ours_extra+=("$1" "$2"); targets=$2; shift ;;
    --budget-min) budget_arg=$2; shift ;;
    --no-ort) ort=0; ours_extra+=(--no-ort) ;;
    --no-setup) setup=0 ;;
    -h | --help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "real_shapes.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$R"
budget=${budget_arg:-$budget}

if [ $setup = 1 ]; then
    if [ $ort = 1 ]; then bench/setup.sh || echo "real_shapes.sh: setup incomplete; going on" >&2
    else bench/setup.sh --no-ort || echo "real_shapes.sh: setup incomplete; going on" >&2; fi
fi
# up to date with the sources (a no-op under `make bench`); an older binary will do when the
# tree does not build right now
make -s "$B/real_shapes" || [ -x "$B/real_shapes" ]

step() { echo "== $*" >&2; }

# Our kernels and, for each workload right after them (same machine state), OpenBLAS /
# oneDNN, PyTorch eager and ONNX Runtime (helper processes in --serve mode), appended to
# bench/results/real_shapes.jsonl. The only command that measures OpenBLAS as a peer, so the
# only one run with the OpenBLAS pins unset.
# (pinned up where OpenBLAS's autodetection falls back to an old core: bench/lib_blas.sh)
. bench/lib_blas.sh
blas_peer_env "$B/real_shapes"
step "${BLAS_ENV[*]} $B/real_shapes --budget-min $budget ${fresh[*]} ${sel[*]} ${ours_extra[*]}"
"${BLAS_ENV[@]}" "$B/real_shapes" --budget-min "$budget" \
    "${fresh[@]}" "${sel[@]}" "${ours_extra[@]}" ||
    echo "real_shapes.sh: some workloads failed (see above); the report shows the rest" >&2

# On an AVX-512 host the peers above run their AVX-512 kernels, which says nothing about how
# our AVX2 code compares with theirs: for the cpu:avx2 rows the peers are measured once more in
# a second pass held to AVX2 (OpenBLAS's Haswell kernels, oneDNN and PyTorch capped at AVX2;
# ONNX Runtime has no such cap and runs native), appended to real_shapes_avx2peers.jsonl. This
# pass pins OpenBLAS on purpose, to a named older core, and says so in the report. It runs
# minutes after the sweep, when the machine may be faster or slower (this VM's FMA peak
# moved from 189 to 276 GFLOP/s within one run), so it measures our cpu:avx2 kernels again
# too (--ours-from: the sweep's default and chosen schedules), beside the held peers and in
# the same rounds; the report takes the cpu:avx2 ratios from this pass alone.
report_extra=()
if grep -q avx512f /proc/cpuinfo && [[ ",$targets," == *,cpu:avx2,* ]]; then
    step "AVX2-held peers for the cpu:avx2 rows"
    env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \
        "$B/real_shapes" --targets cpu:avx2 --random 0 --ours-from "$R/real_shapes.jsonl" \
        --budget-min 0 --out "$R/real_shapes_avx2peers.jsonl" "${fresh[@]}" "${sel[@]}" ||
        echo "real_shapes.sh: the AVX2-held peers failed; cpu:avx2 keeps the native peers" >&2
    report_extra=(--avx2-peers "$R/real_shapes_avx2peers.jsonl")
fi

# the table and the plot
step "report"
/usr/bin/python3 bench/report_real_shapes.py --wall $(($(date +%s) - start)) "${report_extra[@]}"
echo "real_shapes.sh: $R/real_shapes.md, $R/real_shapes.png ($(($(date +%s) - start)) s)" >&2
