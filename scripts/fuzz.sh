#!/bin/bash
# Runs each libFuzzer harness for N seconds on its corpus and prints execs and coverage; exits 1
# when any harness found a crash, a leak or a timeout (its reproducer is left in build/fuzz/).
# Usage: fuzz.sh N BIN...   (`make fuzz FUZZ_S=N` builds the harnesses and runs this)
# FUZZ_RUNS=M (environment): each harness stops after M executions (N seconds still bound it).
# The seeds are tests/fuzz/corpus/NAME (NAME: the harness without "fuzz_"); what the fuzzer
# adds goes to build/fuzz/corpus/NAME, which later runs start from.
set -u
secs=${1:?usage: fuzz.sh SECONDS BIN...}
shift
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=0
printf '%-14s %12s %10s %8s %8s %8s %s\n' harness execs execs/s cov ft seconds result
for bin in "$@"; do
    name=$(basename "$bin")
    name=${name#fuzz_}
    seeds=tests/fuzz/corpus/$name
    work=build/fuzz/corpus/$name
    art=build/fuzz/artifacts/$name/
    log=build/fuzz/$name.log
    mkdir -p "$work" "$art"
    runs=()
    [ "${FUZZ_RUNS:-0}" -gt 0 ] && runs=(-runs="$FUZZ_RUNS")
    t0=$(date +%s)
    "$bin" "${runs[@]}" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$art" "$work" "$seeds" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    if [ "$rc" = 0 ]; then
        result=ok
    else
        result="FAILED (rc $rc; see $log and $art)"
        failed=1
    fi
    printf '%-14s %12s %10s %8s %8s %8s %s\n' "$name" "${execs:-?}" "${rate:-?}" "${cov:-?}" \
        "${ft:-?}" "$(($(date +%s) - t0))" "$result"
done
exit $failed
