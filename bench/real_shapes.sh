#!/bin/bash
# bench/real_shapes.sh — the real-shapes suite end to end: our kernels for each target
# (default and best of N random schedules), OpenBLAS/oneDNN and the machine's limits,
# PyTorch eager, ONNX Runtime, then bench/results/real_shapes.md and real_shapes.png.
#
#   bench/real_shapes.sh [--quick] [--fresh] [--random N] [--budget-min M] [--only NAMES]
#                        [--targets T1,T2] [--no-ort] [--no-setup]
#
# Default: every workload of bench/suites/real_shapes.json, targets cpu and cpu:avx2, N = 16
# random schedules per pair, our part paced to ~20 minutes (--budget-min; 0 = always all N;
# a pair that runs out of its share measures fewer, at least 2, and the table says how many);
# peers and the report add a few minutes. --quick: the suite's "quick" subset (13 workloads)
# with N = 4 and an 8-minute pace. Without --fresh an interrupted sweep
# resumes: every part appends a JSON line per workload to bench/results/real_shapes*.jsonl
# and skips what is there (our kernels: same bench build and N). --fresh starts over.
# `make bench` (bench/run.sh) runs it with --fresh.
#
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, which some hosts set to hold OpenBLAS to older
# kernels, are unset only in the commands that measure OpenBLAS as a peer: the OpenBLAS /
# oneDNN part and PyTorch (whose Debian build runs its matmuls on OpenBLAS).
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}/bench
R=bench/results
start=$(date +%s)

sel=() fresh=() ours_extra=() ort=1 setup=1 budget=20
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) sel+=(--quick); budget=8 ;;
    --fresh) fresh=(--fresh) ;;
    --only) sel+=(--only "$2"); shift ;;
    --random | --targets) ours_extra+=("$1" "$2"); shift ;;
    --budget-min) budget_arg=$2; shift ;;
    --no-ort) ort=0 ;;
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

# 1. our kernels (the long part), in the environment this host gives every program
step "ours: $B/real_shapes --part ours --budget-min $budget ${fresh[*]} ${sel[*]} ${ours_extra[*]}"
"$B/real_shapes" --part ours --budget-min "$budget" "${fresh[@]}" "${sel[@]}" "${ours_extra[@]}" ||
    echo "real_shapes.sh: some workloads failed (see above); the report shows the rest" >&2

# 2. OpenBLAS / oneDNN peers and the machine limits (appends to the same file)
step "peers: OpenBLAS, oneDNN, FMA peak, bandwidth"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$B/real_shapes" --part peers "${sel[@]}" || true

# 3. PyTorch eager (Debian python3-torch on /usr/bin/python3)
if /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    step "PyTorch eager"
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE /usr/bin/python3 bench/peers_torch.py \
        "${fresh[@]}" "${sel[@]}" || true
else
    echo "real_shapes.sh: no PyTorch for /usr/bin/python3 (bench/setup.sh); column empty" >&2
fi

# 4. ONNX Runtime (bench-only virtualenv)
if [ $ort = 1 ] && [ -x bench/.venv/bin/python ]; then
    step "ONNX Runtime"
    bench/.venv/bin/python bench/peers_ort.py "${fresh[@]}" "${sel[@]}" || true
fi

# 5. the table and the plot
step "report"
/usr/bin/python3 bench/report_real_shapes.py --wall $(($(date +%s) - start))
echo "real_shapes.sh: $R/real_shapes.md, $R/real_shapes.png ($(($(date +%s) - start)) s)" >&2
