#!/bin/bash
# gpu-check.sh — the one prepared check for a lent GPU machine (H100/H200/A100), in a single
# call of at most ~8 minutes. Steps (each under its own time limit; a failing step does not stop
# the others, the exit status says whether all passed):
#   1. build: the tools, the benchmarks and the sanitized CUDA test binaries (make -j$(nproc));
#   2. the CUDA tests for real (GPU tests required, a skipped GPU test is a failure):
#      tests/compiler/measure/test_measure (measure_cuda on the device),
#      tests/compiler/toolchain/test_toolchain (NVRTC, cubin loading), and
#      tests/compiler/tlm/test_cuda_forward (the TLM's CUDA forward and batched decoding);
#   3. bench/gpu_check --quick: every op family's default + sampled kernels, fp32 and the
#      float16/bfloat16 tensor-core kernels (odd shapes included), run on the GPU and checked
#      against the reference interpreter -> bench/results/gpu_check.md;
#   4. bench/gpu_peers: fp32 and bf16 dense 4096^3 and a ResNet 3x3 conv, our default and best
#      of N sampled schedules against cuBLAS (dlopen'ed) -> bench/results/gpu_peers.md;
#   5. TLM decoding on the GPU: bench/tlm_gpu --quick (GPU logits vs CPU, batched vs
#      one-at-a-time decoding identical, tokens/s GPU vs CPU) -> bench/results/tlm_gpu.md, and
#      tlmd --device cuda serving a float32 and a bfloat16 compile request;
#   6. bench/results/gpu.md: the device, each step's status and time, and the tables.
# Without a GPU it stops at once with "no GPU" and exit status 1.
# Environment: BUILD (default build), RANDOM_N (sampled schedules per peer case, default 6),
# GPU_CHECK_DRY=1 runs the steps without a GPU (to exercise this script: the GPU steps fail).
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD=${BUILD:-build}
RANDOM_N=${RANDOM_N:-6}
OUT=bench/results/gpu.md
LOG=$(mktemp -d /tmp/tlm-gpu-check-XXXXXX)

if [ "${GPU_CHECK_DRY:-0}" != 1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' &&
    [ ! -e /dev/nvidiactl ]; then
    echo "gpu-check: no GPU (no libcuda.so.1 on the loader path, no /dev/nvidiactl)" >&2
    exit 1
fi

status=()
failed=0
t_start=$(date +%s)
# step NAME LIMIT_S CMD...: runs CMD with a time limit, its output to $LOG/NAME.log (and the
# last lines to the terminal), records "NAME ok|FAILED (rc) Ns".
step() {
    local name=$1 limit=$2
    shift 2
    local t0 rc
    t0=$(date +%s)
    echo "== $name (limit ${limit}s)"
    timeout --kill-after=10 "$limit" "$@" >"$LOG/$name.log" 2>&1
    rc=$?
    tail -n 15 "$LOG/$name.log"
    local dt=$(($(date +%s) - t0))
    if [ $rc -eq 0 ]; then
        status+=("| $name | ok | ${dt} s |")
    else
        status+=("| $name | FAILED (exit $rc$([ $rc -eq 124 ] && echo ', time limit')) | ${dt} s |")
        failed=1
    fi
    return $rc
}

# A Criterion binary whose GPU tests must run: a skip (no usable GPU from the test) fails it.
gpu_tests() {
    local bin=$1
    ASAN_OPTIONS="protect_shadow_gap=0:detect_leaks=0" "$bin" --verbose --jobs=4 >"$LOG/t.out" 2>&1
    local rc=$?
    grep -E '^\[(PASS|FAIL|SKIP|====)\]|Assertion' "$LOG/t.out"
    [ $rc -ne 0 ] && return $rc
    if grep -E '^\[SKIP\]' "$LOG/t.out" | grep -qiE 'gpu|cuda|device|driver'; then
        echo "a GPU test was skipped: the GPU is not usable from the test" >&2
        return 1
    fi
    return 0
}
export -f gpu_tests
export LOG

step build 240 make -j"$(nproc)" BUILD="$BUILD" all "$BUILD/bench/gpu_check" "$BUILD/bench/gpu_peers" \
    "$BUILD/bench/tlm_gpu" "$BUILD/san/tests/compiler/measure/test_measure" \
    "$BUILD/san/tests/compiler/toolchain/test_toolchain" \
    "$BUILD/san/tests/compiler/tlm/test_cuda_forward"
built=$?

if [ $built -eq 0 ]; then
    for t in measure/test_measure toolchain/test_toolchain tlm/test_cuda_forward; do
        step "${t#*/}" 60 bash -c 'gpu_tests "$0"' "$BUILD/san/tests/compiler/$t"
    done
    step gpu_check 100 "$BUILD/bench/gpu_check" --quick --out bench/results/gpu_check.md
    step gpu_peers 110 "$BUILD/bench/gpu_peers" --random "$RANDOM_N" --out bench/results/gpu_peers.md
    step tlm_gpu 60 env -u OPENBLAS_CORETYPE "$BUILD/bench/tlm_gpu" --quick --out bench/results/tlm_gpu.md

    # tlmd --device cuda: an untrained model on the GPU, a float32 and a bfloat16 request served
    tlmd_cuda() {
        local dir port pid rc=1
        dir=$(mktemp -d /tmp/tlm-gpu-tlmd-XXXXXX)
        port=$((20000 + RANDOM % 20000))
        "$BUILD/tlm" model init --layers 2 --heads 2 --dim 64 --ctx 512 -o "$dir/w.bin" || return 1
        "$BUILD/tlmd" --listen "127.0.0.1:$port" --store "$dir/s.db" --weights "$dir/w.bin" \
            --device cuda >"$dir/tlmd.log" 2>&1 &
        pid=$!
        for _ in $(seq 50); do curl -sf "127.0.0.1:$port/readyz" >/dev/null && break; sleep 0.2; done
        if curl -sf -H 'Content-Type: application/json' "127.0.0.1:$port/v1/compile" -d \
            '{"target":"cuda:sm_90","mode":"generate","workloads":[
              {"op":"dense","shape":{"M":1024,"N":1024,"K":1024}},
              {"op":"dense","shape":{"M":1024,"N":1024,"K":1024},"dtype":"bfloat16"}]}' \
            >"$dir/resp.json"; then
            python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); ks=d["kernels"];
assert len(ks)==2 and all(k["format"]=="cubin" for k in ks), d
[print(k["schedule_source"], k["schedule"]) for k in ks]' "$dir/resp.json" && rc=0
        fi
        grep -iE 'device|cuda' "$dir/tlmd.log" | head -5
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        rm -rf "$dir"
        return $rc
    }
    export -f tlmd_cuda
    export BUILD
    step tlmd_device_cuda 40 bash -c tlmd_cuda
fi

{
    echo "# GPU check — $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null ||
        echo "(nvidia-smi unavailable)"
    echo "commit $(git rev-parse --short HEAD 2>/dev/null), total $(($(date +%s) - t_start)) s"
    echo '```'
    echo
    echo "| step | status | time |"
    echo "|---|---|---|"
    printf '%s\n' "${status[@]}"
    echo
    for f in gpu_peers gpu_check tlm_gpu; do
        if [ -s "bench/results/$f.md" ] && [ "bench/results/$f.md" -nt "$LOG" ]; then
            echo
            sed 's/^# /## /' "bench/results/$f.md"
        fi
    done
    echo
    echo "Logs of this run: $LOG"
} >"$OUT"
echo "== wrote $OUT"
cat "$OUT"
exit $failed
