#!/bin/bash
# crashloop.sh — tlmd killed with SIGKILL at random points of compile bursts, N times, on one
# store: every kernel key a client was given must still be fetchable afterwards with the
# SHA-256 it was given, and the store must pass PRAGMA integrity_check after every kill.
#
#   bench/crashloop.sh [N] [OUT.md]      (default N=100, OUT=bench/results/crashloop.md;
#                                          OUT "-" prints the table only)
# TLMD_BIN picks the daemon (default build/tlmd); CRASHLOOP_CLIENTS (default 8) clients per
# burst, each one request of CRASHLOOP_WORKLOADS (default 3) random workloads (dense, conv2d,
# softmax of random sizes: misses) for cpu, after one request of the same kind that is
# answered in full; the kill lands CRASHLOOP_MAX_MS (default 3000) ms or less after the burst
# starts, uniformly at random. CRASHLOOP_TUNE_PCT (default 30) percent of the burst's clients
# ask for mode tune (budget CRASHLOOP_TRIALS, default 8 trials: measured searches, their
# records and the tuned kernels are written while the kill lands). CRASHLOOP_REDIS=1 runs
# the whole loop Redis-backed (a redis-server on a free loopback port, started once and never
# killed: tlmd's L2 tier and leases; the final fetch may be served from either tier). Exit
# status 1 when a key is lost or mismatched or the store is damaged. A short run is part of
# `make test` (tests/bench/test_crashloop.c).
set -u
cd "$(dirname "$0")/.."
N=${1:-100}
OUT=${2:-bench/results/crashloop.md}
TLMD=${TLMD_BIN:-build/tlmd}
CLIENTS=${CRASHLOOP_CLIENTS:-8}
WLS=${CRASHLOOP_WORKLOADS:-3}
MAX_MS=${CRASHLOOP_MAX_MS:-3000}
TUNE_PCT=${CRASHLOOP_TUNE_PCT:-30}
TRIALS=${CRASHLOOP_TRIALS:-8}
REDIS=${CRASHLOOP_REDIS:-0}
[ -x "$TLMD" ] || { echo "crashloop.sh: $TLMD missing; run make (or set TLMD_BIN)" >&2; exit 2; }
for c in curl python3 sqlite3 sha256sum; do
    command -v $c >/dev/null || { echo "crashloop.sh: needs $c" >&2; exit 2; }
done

tmp=$(mktemp -d /tmp/tlmd-crashloop-XXXXXX)
pid=""
rpid=""
cleanup() {
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    [ -n "$rpid" ] && kill "$rpid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
store=$tmp/tlmd.db
returned=$tmp/returned.tsv # key, sha256 of every kernel an answer carried
: >"$returned"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

redis_args=()
if [ "$REDIS" = 1 ]; then
    command -v redis-server >/dev/null || { echo "crashloop.sh: CRASHLOOP_REDIS=1 needs redis-server" >&2; exit 2; }
    rport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    # daemonized: not a child of this shell, whose `wait`s are for tlmd and the clients
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
        --daemonize yes --pidfile "$tmp/redis.pid" --logfile "$tmp/redis.log"
    for _ in $(seq 100); do
        redis-cli -p "$rport" ping 2>/dev/null | grep -q PONG && break
        sleep 0.1
    done
    rpid=$(cat "$tmp/redis.pid")
    redis_args=(--redis "redis://127.0.0.1:$rport")
fi

start_daemon() {
    port=$(free_port)
    "$TLMD" --listen 127.0.0.1:"$port" --store "$store" --weights none --log-level warn \
        "${redis_args[@]}" >>"$tmp/tlmd.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        curl -sf -m 2 "http://127.0.0.1:$port/healthz" >/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "crashloop.sh: tlmd did not start; see its log:" >&2
    tail -20 "$tmp/tlmd.log" >&2
    exit 1
}

workload() { # a random cpu workload: misses on a store that grows
    case $((RANDOM % 3)) in
    0) printf '{"op":"dense","shape":{"M":%d,"N":%d,"K":%d}}' $((RANDOM % 200 + 1)) \
        $((RANDOM % 200 + 1)) $((RANDOM % 200 + 1)) ;;
    1) printf '{"op":"conv2d","shape":{"N":1,"C":%d,"H":%d,"W":%d,"F":%d,"KH":3,"KW":3},"pad":[1,1]}' \
        $((RANDOM % 32 + 1)) $((RANDOM % 24 + 4)) $((RANDOM % 24 + 4)) $((RANDOM % 32 + 1)) ;;
    2) printf '{"op":"softmax","shape":{"R":%d,"C":%d}}' $((RANDOM % 500 + 1)) $((RANDOM % 500 + 1)) ;;
    esac
}

client() { # $1: answer file; $2: "tune" for a measured search
    local body='{"target":"cpu",'
    [ "${2:-}" = tune ] && body+="\"mode\":\"tune\",\"budget\":{\"trials\":$TRIALS},"
    body+='"workloads":['
    for w in $(seq "$WLS"); do
        [ "$w" -gt 1 ] && body+=','
        body+=$(workload)
    done
    body+=']}'
    curl -s -m 300 -o "$1" -w '%{http_code}' -H 'Content-Type: application/json' \
        -d "$body" "http://127.0.0.1:$port/v1/compile" >"$1.code" 2>/dev/null
}

collect() { # keys and hashes of the complete 200 answers
    for f in "$tmp"/ans.*; do
        [ -f "$f.code" ] && [ "$(cat "$f.code")" = 200 ] || continue
        python3 - "$f" "$tmp/sources" >>"$returned" <<'PY' || true
import json, sys
a = json.load(open(sys.argv[1]))
for k in a["kernels"]:
    print(k["key"], k["binary_sha256"])
    with open(sys.argv[2], "a") as s:
        s.write(k.get("schedule_source", "?") + "\n")
PY
    done
    rm -f "$tmp"/ans.*
}

integrity_bad=0
answered=0
t_start=$(date +%s)
for i in $(seq "$N"); do
    start_daemon
    # one answer per round is certain: the kills then land on a store that holds kernels
    client "$tmp/ans.0"
    for c in $(seq "$CLIENTS"); do
        if [ $((RANDOM % 100)) -lt "$TUNE_PCT" ]; then
            client "$tmp/ans.$c" tune &
        else
            client "$tmp/ans.$c" &
        fi
    done
    sleep "$(python3 -c "import random; print(random.uniform(0.05, $MAX_MS / 1000))")"
    kill -9 "$pid"
    wait 2>/dev/null
    pid=""
    before=$(wc -l <"$returned")
    collect
    answered=$((answered + $(wc -l <"$returned") - before))
    ic=$(sqlite3 "$store" 'PRAGMA integrity_check' 2>&1)
    if [ "$ic" != ok ]; then
        integrity_bad=$((integrity_bad + 1))
        echo "crashloop.sh: iteration $i: integrity_check: $ic" >&2
    fi
done

# every key ever returned, fetched from a restarted server
start_daemon
sort -u "$returned" -o "$returned"
keys=$(wc -l <"$returned")
ok=0
lost=0
mismatch=0
while read -r key sha; do
    code=$(curl -s -m 60 -o "$tmp/bin" -w '%{http_code}' "http://127.0.0.1:$port/v1/kernels/$key")
    if [ "$code" != 200 ]; then
        lost=$((lost + 1))
        echo "crashloop.sh: lost $key (HTTP $code)" >&2
    elif [ "$(sha256sum "$tmp/bin" | cut -d' ' -f1)" != "$sha" ]; then
        mismatch=$((mismatch + 1))
        echo "crashloop.sh: $key: SHA-256 differs" >&2
    else
        ok=$((ok + 1))
    fi
done <"$returned"
kill "$pid"
wait 2>/dev/null
pid=""
elapsed=$(($(date +%s) - t_start))

tunes=$(grep -cx tuned "$tmp/sources" 2>/dev/null)
tunes=${tunes:-0}
table="| kills | kernels answered before a kill | of them tuned | distinct keys | fetched, SHA-256 equal | lost | SHA-256 differs | integrity_check failures | redis | seconds |
|---|---|---|---|---|---|---|---|---|---|
| $N | $answered | $tunes | $keys | $ok | $lost | $mismatch | $integrity_bad | $([ "$REDIS" = 1 ] && echo yes || echo no) | $elapsed |"
echo "$table"
if [ "$OUT" != - ]; then
    mkdir -p "$(dirname "$OUT")"
    {
        [ -s "$OUT" ] && echo
        echo "# tlmd crash loop ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $TLMD)"
        echo
        echo "SIGKILL at a uniformly random point 0.05 .. $MAX_MS ms into a burst of $CLIENTS clients x"
        echo "$WLS random cpu workloads ($TUNE_PCT % of the clients tune, $TRIALS trials); restart on the"
        echo "same store; at the end every key an answer carried is fetched from a restarted server and"
        echo "its SHA-256 compared. Rows are appended (newest last)."
        echo
        echo "$table"
    } >>"$OUT"
fi
[ "$lost" = 0 ] && [ "$mismatch" = 0 ] && [ "$integrity_bad" = 0 ]
