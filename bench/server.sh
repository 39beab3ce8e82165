#!/bin/bash
# server.sh — tlmd on loopback: cache-hit latency and throughput, cold compile latency per
# subgraph split into its stages, and the decoder's batch sizes under concurrent clients.
#
#   bench/server.sh [OUT.md]          (default bench/results/server.md; `make bench` runs it)
# Needs build/tlm, build/tlmd and build/bench/server_load (`make all build/bench/server_load`;
# BUILD=dir picks another build folder). The load generator is bench/server_load.c: plain
# keep-alive HTTP/1.1 client threads, closed loop.
#
# Every tlmd runs on a free 127.0.0.1 port with a store under a temporary folder and a small
# random model (tlm model init --layers 2 --heads 4 --dim 128 --ctx 512), and is stopped
# with SIGTERM at the end (the trap also stops it on errors and ^C).
#  1. cache hits: a store warmed with a few kernels; POST /v1/compile of a cached workload
#     (one, and four in one request) and GET /v1/kernels/{key}, at 1, 8, 32 connections,
#     $SERVER_BENCH_SECONDS (default 5) s each after 0.5 s of warm-up.
#  2. cold compiles: dense, conv2d, softmax for cpu and cuda:sm_90, one request each on a
#     fresh store, $SERVER_BENCH_REPS (default 3) times (a fresh daemon and store each time,
#     a first unrelated compile per target so one-time start-up costs are not counted);
#     medians of the kernels' "timing" (lookup, decoder queue, decode, codegen, compile).
#  3. decoder batch sizes: 1, 8, 32 concurrent clients, $SERVER_BENCH_COLD (default 32)
#     distinct cold compiles in all per row, mixed cpu softmax / cuda dense / cpu dense; the
#     deltas of the /metrics histogram tlmd_decoder_batch_size (one sample per decoder step).
set -eu
cd "$(dirname "$0")/.."
B=${BUILD:-build}
TLM=$B/tlm
TLMD=$B/tlmd
LOAD=$B/bench/server_load
OUT=${1:-bench/results/server.md}
SECS=${SERVER_BENCH_SECONDS:-5}
REPS=${SERVER_BENCH_REPS:-3}
COLD=${SERVER_BENCH_COLD:-32}
for f in "$TLM" "$TLMD" "$LOAD"; do
    [ -x "$f" ] || { echo "server.sh: $f missing; run: make all $B/bench/server_load" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/tlmd-bench-XXXXXX)
. bench/lib_daemon.sh # daemon_wait, stop_daemon, $pid
port=""
cleanup() {
    stop_daemon
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$TLM" model init --layers 2 --heads 4 --dim 128 --ctx 512 -o "$tmp/tlm.bin" >/dev/null

# start_daemon STORE: a tlmd on a free port, ready (/readyz) within 60 s.
start_daemon() {
    for _ in 1 2 3; do
        port=$("$LOAD" port)
        "$TLMD" --listen "127.0.0.1:$port" --store "$1" --weights "$tmp/tlm.bin" --serve-untrained \
            --log-level info --log-file "$tmp/tlmd.log" >>"$tmp/tlmd.out" 2>&1 &
        pid=$!
        daemon_wait 600 "$LOAD" get --port "$port" --get /readyz && return 0
        stop_daemon # port taken meanwhile, or a slow start: try another port
    done
    echo "server.sh: tlmd did not start; its output:" >&2
    tail -20 "$tmp/tlmd.out" "$tmp/tlmd.log" >&2 || true
    exit 1
}

# compile BODY: one POST; prints server_load once's line (fails the bench on an error).
compile() { "$LOAD" once --port "$port" --body "$1"; }

# warm_up: one-time costs (the first compiler process, loading NVRTC) go to an unrelated
# kernel per target
warm_up() {
    compile "$(body cpu '{"op":"dense","shape":{"M":24,"N":40,"K":56}}')" >/dev/null
    compile "$(body cuda:sm_90 '{"op":"dense","shape":{"M":24,"N":40,"K":56}}')" >/dev/null
}

wl_dense='{"op":"dense","shape":{"M":128,"N":128,"K":128},"epilogue":["bias_add","relu"]}'
wl_conv='{"op":"conv2d","shape":{"N":1,"C":16,"H":28,"W":28,"F":32,"KH":3,"KW":3},"pad":[1,1]}'
wl_softmax='{"op":"softmax","shape":{"R":256,"C":512}}'
body() { printf '{"target":"%s","workloads":[%s]}' "$1" "$2"; }

md="$tmp/server.md"
cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
{
    echo "# tlmd on loopback"
    echo
    echo "Machine: $cpu, $(nproc) cores. $(date -u +%Y-%m-%d). Model: random (untrained),"
    echo "2 layers, 4 heads, dim 128, ctx 512; decoding on the CPU. Load generator:"
    echo "bench/server_load.c (keep-alive HTTP/1.1, closed loop, one connection per thread) on"
    echo "the same machine, so client and server share the cores."
    echo
} >"$md"

# ---- 1. cache hits ----
echo "-- cache hits (${SECS} s per row)"
start_daemon "$tmp/hit.db"
"$LOAD" get --port "$port" --get /v1/version >"$tmp/version.json" || true
cc_v=$(sed -n 's/.*"cc":"[^"]*version=\([^;"]*\).*/\1/p' "$tmp/version.json")
nvrtc_v=$(sed -n 's/.*"nvrtc":"nvrtc=\([^;"]*\).*/\1/p' "$tmp/version.json")
echo "Toolchains: ${cc_v:-?} for cpu, NVRTC ${nvrtc_v:-?} for cuda (no GPU is used)." >>"$md"
echo >>"$md"
line=$(compile "$(body cpu "$wl_dense")")
key=$(echo "$line" | awk '{print $10}')
compile "$(body cpu "$wl_conv")" >/dev/null
compile "$(body cpu "$wl_softmax")" >/dev/null
compile "$(body cuda:sm_90 "$wl_dense")" >/dev/null
hit_one=$(body cpu "$wl_dense")
hit_four="{\"target\":\"cpu\",\"workloads\":[$wl_dense,$wl_conv,$wl_softmax,$wl_dense]}"
{
    echo "## Cache hits"
    echo
    echo "Closed loop, ${SECS} s per row after 0.5 s of warm-up; latency is per request as the"
    echo "client sees it (connect once, then keep-alive)."
    echo
    echo "| request | connections | requests | errors | req/s | p50 ms | p99 ms | mean ms |"
    echo "|---|---|---|---|---|---|---|---|"
} >>"$md"
printf '%-34s %5s %9s %6s %9s %8s %8s %8s\n' request conns requests errors req/s p50_ms p99_ms \
    mean_ms
for what in compile1 compile4 kernel; do
    for c in 1 8 32; do
        case $what in
        compile1) name="POST /v1/compile (1 workload)"
            line=$("$LOAD" hit --port "$port" --post /v1/compile --body "$hit_one" --conns "$c" \
                --duration "$SECS") ;;
        compile4) name="POST /v1/compile (4 workloads)"
            line=$("$LOAD" hit --port "$port" --post /v1/compile --body "$hit_four" --conns "$c" \
                --duration "$SECS") ;;
        kernel) name="GET /v1/kernels/{key} (cpu .so)"
            line=$("$LOAD" hit --port "$port" --get "/v1/kernels/$key" --conns "$c" \
                --duration "$SECS") ;;
        esac
        read -r conns n errs rps p50 p99 mean <<<"$line"
        printf '%-34s %5s %9s %6s %9s %8s %8s %8s\n' "$name" "$conns" "$n" "$errs" "$rps" "$p50" \
            "$p99" "$mean"
        echo "| $name | $conns | $n | $errs | $rps | $p50 | $p99 | $mean |" >>"$md"
    done
done
stop_daemon

# ---- 2. cold compiles ----
echo "-- cold compiles ($REPS fresh stores)"
: >"$tmp/cold.txt"
for rep in $(seq 1 "$REPS"); do
    start_daemon "$tmp/cold$rep.db"
    warm_up
    for tgt in cpu cuda:sm_90; do
        for w in dense conv2d softmax; do
            case $w in dense) wl=$wl_dense ;; conv2d) wl=$wl_conv ;; softmax) wl=$wl_softmax ;; esac
            line=$(compile "$(body "$tgt" "$wl")")
            echo "$tgt $w $line" >>"$tmp/cold.txt"
        done
    done
    stop_daemon
done
{
    echo
    echo "## Cold compile latency per subgraph"
    echo
    echo "One workload per request on a fresh store (a miss), medians over $REPS fresh daemons."
    echo "ms. \`latency\`: the request as the client sees it; \`lookup\`: pool wait, store miss,"
    echo "subgraph and schedule space; \`queue\`: waiting for a decoder slot; \`decode\`: the model"
    echo "writing the schedule; \`codegen\`/\`compile\`: source generation and the C compiler or"
    echo "NVRTC; \`total\`: the whole flight in the server (includes the store insert)."
    echo
    echo "| target | workload | latency | lookup | queue | decode | codegen | compile | total |"
    echo "|---|---|---|---|---|---|---|---|---|"
} >>"$md"
printf '%-11s %-8s %9s %8s %8s %8s %8s %8s %8s\n' target workload latency lookup queue decode \
    codegen compile total
for tgt in cpu cuda:sm_90; do
    for w in dense conv2d softmax; do
        # fields: tgt w status latency_ms cache lookup queue decode codegen compile total key
        row=$(awk -v t="$tgt" -v w="$w" '$1 == t && $2 == w' "$tmp/cold.txt" | awk '
            { n++; lat[n] = $4; for (i = 6; i <= 11; i++) v[i, n] = $i * 1000 }
            function med(a, k,    m, j, x, s) {
                m = 0; for (j = 1; j <= n; j++) s[j] = (k ? v[k, j] : lat[j])
                # insertion sort: n is tiny
                for (j = 2; j <= n; j++) { x = s[j]; m = j - 1
                    while (m > 0 && s[m] > x) { s[m + 1] = s[m]; m-- } s[m + 1] = x }
                return n % 2 ? s[(n + 1) / 2] : (s[n / 2] + s[n / 2 + 1]) / 2 }
            END { if (!n) exit; printf "%.1f", med(lat, 0)
                  for (i = 6; i <= 11; i++) printf " %.1f", med(v, i); printf "\n" }')
        [ -n "$row" ] || continue
        read -r lat lk qu de cg co to <<<"$row"
        printf '%-11s %-8s %9s %8s %8s %8s %8s %8s %8s\n' "$tgt" "$w" "$lat" "$lk" "$qu" "$de" \
            "$cg" "$co" "$to"
        echo "| $tgt | $w | $lat | $lk | $qu | $de | $cg | $co | $to |" >>"$md"
    done
done

# ---- 3. decoder batch sizes ----
echo "-- decoder batch sizes ($COLD cold compiles per row)"
start_daemon "$tmp/batch.db"
warm_up
t_soft='{"target":"cpu","workloads":[{"op":"softmax","shape":{"R":{i},"C":64}}]}'
t_cuda='{"target":"cuda:sm_90","workloads":[{"op":"dense","shape":{"M":{i},"N":64,"K":64}}]}'
t_dense='{"target":"cpu","workloads":[{"op":"dense","shape":{"M":{i},"N":32,"K":32}}]}'
{
    echo
    echo "## Decoder batch size under concurrent clients"
    echo
    echo "$COLD distinct cold compiles per row (rounded up to a whole share per client; cpu"
    echo "softmax, cuda:sm_90 dense, cpu dense in turn), each client sending its share one after"
    echo "another; latencies are per compile request. Batch size = sequences"
    echo "advanced by one decoder step; \`steps\` = decoder steps in the row, then the share of"
    echo "steps per histogram bucket (batch ≤ 1, 2, 4, 8, 16, 32, more)."
    echo
    echo "| clients | compiles | errors | wall s | p50 ms | p99 ms | steps | mean batch |" \
        "max bucket | ≤1 | 2 | 3-4 | 5-8 | 9-16 | 17-32 | >32 |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >>"$md"
printf '%7s %8s %6s %7s %8s %8s %6s %6s %4s  %s\n' clients compiles errors wall_s p50_ms \
    p99_ms steps mean max "steps per bucket <=1 2 4 8 16 32 64 128 inf"
base=16
for c in 1 8 32; do
    per=$(((COLD + c - 1) / c))
    line=$("$LOAD" batch --port "$port" --clients "$c" --per-client "$per" --base "$base" \
        --template "$t_soft" --template "$t_cuda" --template "$t_dense")
    base=$((base + c * per))
    read -r cl n errs wall p50 p99 steps mean maxle b1 b2 b4 b8 b16 b32 b64 b128 binf <<<"$line"
    printf '%7s %8s %6s %7s %8s %8s %6s %6s %4s  %s\n' "$cl" "$n" "$errs" "$wall" "$p50" "$p99" \
        "$steps" "$mean" "$maxle" "$b1 $b2 $b4 $b8 $b16 $b32 $b64 $b128 $binf"
    share() { awk -v a="$1" -v s="$steps" 'BEGIN { printf "%.0f%%", (s > 0 ? 100 * a / s : 0) }'; }
    echo "| $cl | $n | $errs | $wall | $p50 | $p99 | $steps | $mean | $maxle | $(share "$b1") |" \
        "$(share "$b2") | $(share "$b4") | $(share "$b8") | $(share "$b16") | $(share "$b32") |" \
        "$(share "$((b64 + b128 + binf))") |" >>"$md"
done
stop_daemon

mkdir -p "$(dirname "$OUT")"
cp "$md" "$OUT"
echo "table in $OUT"
