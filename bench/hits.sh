#!/bin/bash
# hits.sh — cache-hit latency while tlmd compiles (issue 15): a model compile keeps the compile
# pool busy while 64 closed-loop clients run, 70 % of them sending hits (GET /v1/kernels/{key}
# and POST /v1/compile of a cached workload, in turn) and 30 % misses (distinct small dense
# ops: more compiles), and one more client reads /metrics every 100 ms. Prints hit p50/p99/max and the
# others, with the host's load, and appends a row to the table.
#
#   bench/hits.sh [LABEL] [SECONDS] [OUT.md]   (default "run", 30 s, bench/results/hits.md;
#                                               the raw JSON lines go to OUT's .jsonl)
# TLMD_BIN picks the daemon (default build/tlmd); CLIENTS (64), HIT_FRAC (0.7), PACE_MS (100:
# each hit client starts a request at most every 100 ms, so the hits alone do not saturate
# the 2 cores; 0: back to back), MODEL (resnet50).
# The daemon runs with --weights none (the default schedules) on a temporary
# store, on a free 127.0.0.1 port, with max_jobs = 1024 (64 clients and the model fit: no
# 429s), and is stopped with SIGTERM at the end. MODEL=none and HIT_FRAC=1 give the hits alone
# (the same clients, no compile at all): the yardstick for what compiles still add.
# EXTRA_CONF adds config lines (e.g. 'compile_nice = 19\n').
set -eu
cd "$(dirname "$0")/.."
LABEL=${1:-run}
SECS=${2:-30}
OUT=${3:-bench/results/hits.md}
TLMD=${TLMD_BIN:-build/tlmd}
LOAD=${BUILD:-build}/bench/server_load
CLIENTS=${CLIENTS:-64}
HIT_FRAC=${HIT_FRAC:-0.7}
PACE_MS=${PACE_MS:-100}
MODEL=${MODEL:-resnet50}
for f in "$TLMD" "$LOAD"; do
    [ -x "$f" ] || { echo "hits.sh: $f missing; run: make all build/bench/server_load" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/tlmd-hits-XXXXXX)
pid=""
mpid=""
cleanup() { # no set -e here: a process already gone must not stop the rest
    if [ -n "$mpid" ]; then kill "$mpid" 2>/dev/null || true; fi
    if [ -n "$pid" ]; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    wait 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
port=$("$LOAD" port)
printf 'max_jobs = 1024\n%b' "${EXTRA_CONF:-}" >"$tmp/tlmd.conf"
"$TLMD" --listen "127.0.0.1:$port" --store "$tmp/tlmd.db" --weights none --log-level warn --config "$tmp/tlmd.conf" \
    >"$tmp/tlmd.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
    "$LOAD" get --port "$port" --get /readyz >/dev/null 2>&1 && break
    sleep 0.1
done
# the cached kernel: one compile, its key
hit='{"target":"cpu","workloads":[{"op":"dense","shape":{"M":64,"N":64,"K":64},"epilogue":["relu"]}]}'
key=$("$LOAD" once --port "$port" --body "$hit" | awk '{print $NF}')
[ ${#key} -eq 64 ] || { echo "hits.sh: no key from the warm-up compile" >&2; exit 1; }
load0=$(cut -d' ' -f1-3 /proc/loadavg)
# the model compile: the compile pool busy for the whole run
if [ "$MODEL" != none ]; then
    "$LOAD" once --port "$port" --body "{\"target\":\"cpu\",\"model\":{\"name\":\"$MODEL\",\"batch\":1}}" \
        >"$tmp/model.out" 2>&1 &
    mpid=$!
    sleep 2
fi
miss='{"target":"cpu","workloads":[{"op":"dense","shape":{"M":{i},"N":40,"K":24}}]}'
"$LOAD" get --port "$port" --get /metrics >"$tmp/metrics0.txt"
"$LOAD" mix --port "$port" --conns "$CLIENTS" --duration "$SECS" --warmup 1 --hit-frac "$HIT_FRAC" \
    --pace-ms "$PACE_MS" \
    --get "/v1/kernels/$key" --body "$hit" --template "$miss" --base 1000 >"$tmp/mix.json"
load1=$(cut -d' ' -f1-3 /proc/loadavg)
"$LOAD" get --port "$port" --get /metrics >"$tmp/metrics1.txt"
model_done=$([ -n "$mpid" ] && kill -0 "$mpid" 2>/dev/null && echo no || echo yes)
/usr/bin/python3 - "$tmp/mix.json" "$OUT" "$LABEL" "$load0" "$load1" "$model_done" "$TLMD" "$MODEL" \
    "$tmp/metrics0.txt" "$tmp/metrics1.txt" <<'PY'
import json, os, re, sys
src, out, label, load0, load1, model_done, tlmd, model, m0, m1 = sys.argv[1:11]
m = json.load(open(src))


def buckets(path, route=None, name="tlmd_http_answer_seconds"):
    """A histogram's buckets (of one route, when given): {le: cumulative count}."""
    labels = 'route="%s",' % re.escape(route) if route else ""
    pat = re.compile(r'^%s_bucket\{%sle="([^"]+)"\} (\d+)$' % (name, labels))
    b = {}
    for line in open(path):
        g = pat.match(line.strip())
        if g:
            b[g.group(1)] = int(g.group(2))
    return b


def server_pct(route, p):
    """The bucket bound (ms) under which fraction p of the run's answers on route fell."""
    b0, b1 = buckets(m0, route), buckets(m1, route)
    les = sorted((k for k in b1 if k != "+Inf"), key=float)
    total = b1.get("+Inf", 0) - b0.get("+Inf", 0)
    if total <= 0:
        return None
    for le in les:
        if b1[le] - b0.get(le, 0) >= p * total:
            return float(le) * 1e3
    return float("inf")


if "tlmd_http_answer_seconds" in open(m1).read():
    m["server_get"] = {"p50_le_ms": server_pct("/v1/kernels/{key}", 0.5),
                       "p99_le_ms": server_pct("/v1/kernels/{key}", 0.99)}
b0, b1 = (buckets(m, name="tlmd_loop_busy_seconds") for m in (m0, m1))
if b1:
    total = b1["+Inf"] - b0.get("+Inf", 0)
    over = {le: total - (b1[le] - b0.get(le, 0)) for le in b1 if le != "+Inf"}
    m["loop_turns"] = {"n": total, "over_2ms": over.get("0.002"), "over_5ms": over.get("0.005"),
                       "over_10ms": over.get("0.01"), "over_25ms": over.get("0.025")}
m.update(label=label, loadavg_before=load0, loadavg_after=load1, cores=os.cpu_count(),
         model=model, model_done_during_run=model_done == "yes", tlmd=tlmd)
print(json.dumps(m))
base = os.path.splitext(out)[0]
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(base + ".jsonl", "a") as f:
    f.write(json.dumps(m) + "\n")
rows = [json.loads(l) for l in open(base + ".jsonl")]
k = lambda r, n: r[n]
lines = ["# Cache hits under mixed load (bench/hits.sh)", "",
         f"{rows[-1]['clients']} closed-loop clients, `hitters` of them sending hits (GET /v1/kernels/KEY and"
         " POST /v1/compile of a cached workload in turn; each starts one at most every `pace` ms), the rest misses (distinct dense ops: compiles),"
         " during a model compile (resnet50: ~18 s alone, longer under this load; rows with model none: no compile at all); one more client GETs /metrics every 100 ms. Loopback;"
         " the host is shared with other engineers' builds and tests (its load average is in each row),"
         f" {os.cpu_count()} cores. Milliseconds. \"get p99 in tlmd\": the bucket bound of the daemon's own"
         " tlmd_http_answer_seconds for GET /v1/kernels/{key} (head read to answer written), where it has"
         " that histogram: what the clients see beyond it is the loaded host scheduling them and the daemon's loop.", "",
         "| run | model | hitters | pace ms | s | hits | hit p50 | hit p99 | hit max | get p99 | get p99 in tlmd ≤ | post p99 | misses | miss p50 | /metrics p50 | /metrics p99 | /metrics max | errors | load before → after |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in rows:
    errs = sum(r[x]["errors"] for x in ("get", "post", "miss", "metrics"))
    lines.append(f"| {r['label']} | {r['model']} | {int(r['hit_frac'] * r['clients'] + 0.5)} | {r.get('pace_ms', 0):g} | {r['seconds']:.0f} | {r['hit']['n']} | {r['hit']['p50_ms']:.2f} | {r['hit']['p99_ms']:.2f} |"
                 f" {r['hit']['max_ms']:.1f} | {r['get']['p99_ms']:.2f} | {r['server_get']['p99_le_ms'] if r.get('server_get') else '–'} | {r['post']['p99_ms']:.2f} | {r['miss']['n']} |"
                 f" {r['miss']['p50_ms']:.0f} | {r['metrics']['p50_ms']:.2f} | {r['metrics']['p99_ms']:.2f} |"
                 f" {r['metrics']['max_ms']:.1f} | {errs} | {r['loadavg_before']} → {r['loadavg_after']} |")
open(out, "w").write("\n".join(lines) + "\n")
PY
