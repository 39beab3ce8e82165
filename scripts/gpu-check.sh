#!/bin/bash
# gpu-check.sh — build and run the CUDA code generator's check on this machine's GPU:
# every generated kernel (default + sampled schedules, all op families, the headline shapes)
# is compiled with NVRTC for the device's sm, checked against the reference interpreter and
# timed; the table goes to bench/results/gpu_check.md, sources of failing kernels to
# bench/results/gpu_check_failures/. Without a GPU it stops at once with "no GPU".
# Arguments go to build/bench/gpu_check: [--random N] [--quick] [--out FILE] [--compile-only].
set -euo pipefail
cd "$(dirname "$0")/.."
make -j"$(nproc)" all build/bench/gpu_check >/dev/null
exec ./build/bench/gpu_check "$@"
