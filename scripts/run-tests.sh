#!/bin/bash
# Run every Criterion test binary; print one summary line at the end.
# Usage: run-tests.sh BIN...
set -u
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export TLM_BIN="${TLM_BIN:-$PWD/build/san/tlm}"
export TLM_ROOT="$PWD"
pass=0; fail=0; failed=()
for t in "$@"; do
    echo "== $t"
    out=$("$t" --jobs=2 2>&1); rc=$?
    echo "$out" | tail -n 40 | grep -v '^$' | grep -E 'FAIL|Synthesis|ERROR|error|Assertion|CRASH|Timeout|passed' || true
    line=$(echo "$out" | grep -E '^\[====\] Synthesis' | tail -1)
    p=$(echo "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p'); p=${p:-0}
    f=$(echo "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p'); f=${f:-0}
    c=$(echo "$line" | sed -n 's/.*Crashing: \([0-9]*\).*/\1/p'); c=${c:-0}
    pass=$((pass + p)); fail=$((fail + f + c))
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        failed+=("$t"); [ -z "$line" ] && { echo "$out" | tail -n 30; fail=$((fail + 1)); }
    fi
done
# The Python client's tests (unittest) against the same sanitized tlmd; counted like the rest.
py=clients/python/test_client.py
if [ -f "$py" ] && [ -x /usr/bin/python3 ]; then
    echo "== $py"
    out=$(/usr/bin/python3 "$py" 2>&1); rc=$?
    n=$(echo "$out" | sed -n 's/^Ran \([0-9]*\) tests\{0,1\} in .*/\1/p' | tail -1); n=${n:-0}
    bad=$(echo "$out" | grep -E '^FAILED \(' | grep -oE '(failures|errors)=[0-9]+' | cut -d= -f2 |
          awk '{s += $1} END {print s + 0}')
    echo "$out" | grep -E '^(Ran|OK|FAILED)|\.\.\. (FAIL|ERROR)' || true
    pass=$((pass + n - bad)); fail=$((fail + bad))
    if [ $rc -ne 0 ]; then
        failed+=("$py"); [ "$n" -eq 0 ] && { echo "$out" | tail -n 30; fail=$((fail + 1)); }
    fi
fi
echo
if [ ${#failed[@]} -gt 0 ]; then echo "failed binaries: ${failed[*]}"; fi
echo "$pass passed, $fail failed"
[ ${#failed[@]} -eq 0 ]
