#!/bin/bash
# Run every Criterion test binary, then the Python client's tests; print which tests failed
# and which were skipped (with the reason each gave), and one summary line at the end:
#   "N passed, M failed, S skipped"
# Usage: run-tests.sh BIN...
#
# Counts: passed and failed come from Criterion's Synthesis line ("Failing" already includes
# "Crashing"); skipped tests (cr_skip_test, .disabled; GPU-only tests skip on a machine without
# one) are not in that line, so each binary also writes a TAP report, whose "# SKIP" lines give
# their names and reasons and whose "not ok" lines name the failures. A binary that exits
# non-zero without a Synthesis line (it crashed outside a test) counts as one failure.
set -u
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export TLM_BIN="${TLM_BIN:-$PWD/build/san/tlm}"
export TLM_ROOT="$PWD"
tap=$(mktemp /tmp/tlm-tap-XXXXXX)
trap 'rm -f "$tap"' EXIT
pass=0; fail=0; skip=0; failed=(); failed_tests=(); skipped_tests=(); times=()
for t in "$@"; do
    echo "== $t"
    : >"$tap"
    t0=$SECONDS
    out=$("$t" --jobs=2 --tap="$tap" 2>&1); rc=$?
    echo "   ($((SECONDS - t0)) s)"
    times+=("$((SECONDS - t0)) ${t##*/tests/}")
    echo "$out" | tail -n 40 | grep -v '^$' | grep -E 'FAIL|Synthesis|ERROR|error|Assertion|CRASH|Timeout|passed' || true
    line=$(echo "$out" | grep -E '^\[====\] Synthesis' | tail -1)
    p=$(echo "$line" | sed -n 's/.*Passing: \([0-9]*\).*/\1/p'); p=${p:-0}
    f=$(echo "$line" | sed -n 's/.*Failing: \([0-9]*\).*/\1/p'); f=${f:-0}
    pass=$((pass + p)); fail=$((fail + f))
    name=${t##*/tests/}
    # "ok - suite::test  # SKIP reason" and "not ok - suite::test ..."
    while IFS= read -r l; do
        echo "[SKIP] $l"
        skipped_tests+=("$name: $l"); skip=$((skip + 1))
    done < <(sed -n 's/^ok - \([^ ]*\) *# SKIP */\1: /p' "$tap")
    while IFS= read -r l; do
        failed_tests+=("$name: $l")
    done < <(sed -n 's/^not ok - //; T; s/ *([0-9.]*s)$//; p' "$tap")
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        failed+=("$t"); [ -z "$line" ] && { echo "$out" | tail -n 30; fail=$((fail + 1)); }
    fi
done
# The Python client's tests (unittest, verbose: one line per test) against the same sanitized
# tlmd; counted like the rest.
py=clients/python/test_client.py
if [ -f "$py" ] && [ -x /usr/bin/python3 ]; then
    echo "== $py"
    out=$(/usr/bin/python3 "$py" 2>&1); rc=$?
    n=$(echo "$out" | sed -n 's/^Ran \([0-9]*\) tests\{0,1\} in .*/\1/p' | tail -1); n=${n:-0}
    bad=$(echo "$out" | grep -E '^(OK|FAILED) \(' | grep -oE '(failures|errors)=[0-9]+' | cut -d= -f2 |
          awk '{s += $1} END {print s + 0}')
    sk=$(echo "$out" | grep -E '^(OK|FAILED) \(' | grep -oE 'skipped=[0-9]+' | cut -d= -f2 |
         awk '{s += $1} END {print s + 0}')
    echo "$out" | grep -E "^(Ran|OK|FAILED)|\.\.\. (FAIL|ERROR|skipped)" || true
    while IFS= read -r l; do
        skipped_tests+=("$py: $l")
    done < <(echo "$out" | sed -n "s/^\([^ ]*\) .*\.\.\. skipped '\(.*\)'$/\1: \2/p")
    while IFS= read -r l; do
        failed_tests+=("$py: $l")
    done < <(echo "$out" | grep -E '\.\.\. (FAIL|ERROR)$')
    pass=$((pass + n - bad - sk)); fail=$((fail + bad)); skip=$((skip + sk))
    if [ $rc -ne 0 ]; then
        failed+=("$py"); [ "$n" -eq 0 ] && { echo "$out" | tail -n 30; fail=$((fail + 1)); }
    fi
fi
echo
if [ ${#skipped_tests[@]} -gt 0 ]; then
    echo "skipped tests:"
    printf '  %s\n' "${skipped_tests[@]}"
fi
if [ ${#failed_tests[@]} -gt 0 ]; then
    echo "failed tests:"
    printf '  %s\n' "${failed_tests[@]}"
fi
if [ ${#failed[@]} -gt 0 ]; then echo "failed binaries: ${failed[*]}"; fi
echo "slowest binaries (s):"
printf '%s\n' "${times[@]}" | sort -rn | head -5 | sed 's/^/  /'
echo "$pass passed, $fail failed, $skip skipped"
[ ${#failed[@]} -eq 0 ]
