#!/bin/bash
# gpu-check-tlm.sh — the GPT-2 runtime's CUDA path on a GPU machine, in one go:
#   1. builds the GPU test and the GPU benchmark (into $BUILD, default build/);
#   2. runs tests/compiler/tlm/test_cuda_forward with the GPU tests required (a skipped GPU
#      test is a failure here): kernels compile for sm_80/sm_90, GPU logits within 1e-3
#      relative of the CPU's for several prompt lengths and odd sizes, device KV copies,
#      batched GPU decoding (greedy and beam) equal to one-at-a-time GPU decoding;
#   3. runs bench/tlm_gpu: the same agreement on the shipping model shapes, then decoding
#      tokens/s at batch 1, 4, 16, 64 for the ~2M and ~10M models, GPU against CPU; prints the
#      table and writes bench/results/tlm_gpu.md (arguments are passed on, e.g. --quick).
# Without a GPU it stops at once with "no GPU" and exit status 1.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}

if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' && [ ! -e /dev/nvidiactl ]; then
    echo "gpu-check-tlm: no GPU (no libcuda.so.1 on the loader path, no /dev/nvidiactl)" >&2
    exit 1
fi

make -j"$(nproc)" BUILD="$BUILD" "$BUILD/bench/tlm_gpu" "$BUILD/san/tests/compiler/tlm/test_cuda_forward"

echo "== test_cuda_forward (GPU tests required)"
out=$(ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=0" \
    "$BUILD/san/tests/compiler/tlm/test_cuda_forward" --verbose --jobs=1 2>&1) && rc=0 || rc=$?
echo "$out" | grep -E '^\[(PASS|FAIL|SKIP|====)\]|Assertion|error' || true
if [ "$rc" -ne 0 ]; then echo "gpu-check-tlm: test_cuda_forward failed" >&2; exit 1; fi
if echo "$out" | grep -q '^\[SKIP\] cuda_gpu::'; then
    echo "gpu-check-tlm: GPU tests were skipped: the GPU is not usable from the test" >&2
    exit 1
fi

echo "== tlm_gpu"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE "$BUILD/bench/tlm_gpu" "$@"
