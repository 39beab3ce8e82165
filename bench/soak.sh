#!/bin/bash
# soak.sh — tlmd under a long mixed load on loopback: hits, reads, misses, graphs, bad
# requests and cancels from many clients (bench/soak.py); answers by status, p50/p99 per kind
# of request, and the daemon's RSS every 10 s (flat after warm-up, or a leak), with a plot.
#
#   bench/soak.sh [CLIENTS] [SECONDS] [OUT.md]   (default 64 clients, 600 s,
#                                                 bench/results/soak.md and soak.png)
# TLMD_BIN picks the daemon (default build/tlmd). The daemon runs with --weights none (the
# default schedules: the compile path without the model) on a temporary store.
set -eu
cd "$(dirname "$0")/.."
CLIENTS=${1:-64}
SECS=${2:-600}
OUT=${3:-bench/results/soak.md}
TLMD=${TLMD_BIN:-build/tlmd}
PY=/usr/bin/python3
[ -x "$TLMD" ] || { echo "soak.sh: $TLMD missing; run make (or set TLMD_BIN)" >&2; exit 2; }
tmp=$(mktemp -d /tmp/tlmd-soak-XXXXXX)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$TLMD" --listen 127.0.0.1:"$port" --store "$tmp/tlmd.db" --weights none --log-level warn \
    >"$tmp/tlmd.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
    curl -sf -m 2 "http://127.0.0.1:$port/healthz" >/dev/null && break
    sleep 0.1
done
$PY bench/soak.py "$port" "$pid" "$CLIENTS" "$SECS" >"$tmp/soak.json"
kill "$pid"
wait "$pid" || { echo "soak.sh: tlmd did not exit cleanly; its log:" >&2; tail "$tmp/tlmd.log" >&2; exit 1; }
pid=""
$PY - "$tmp/soak.json" "$OUT" "$TLMD" <<'PY'
import json, os, subprocess, sys
s = json.load(open(sys.argv[1]))
out, tlmd = sys.argv[2], sys.argv[3]
lines = [f"# tlmd soak: {s['clients']} clients x {s['seconds']} s ({os.cpu_count()} cores, {tlmd})", "",
         "| kind | answers | p50 ms | p99 ms | statuses | unexpected |", "|---|---|---|---|---|---|"]
for k, v in s["kinds"].items():
    st = ", ".join(f"{c}: {n}" for c, n in sorted(v["status"].items()))
    lines.append(f"| {k} | {v['n']} | {v['p50_ms']} | {v['p99_ms']} | {st} | {v['unexpected']} |")
r = s["rss_mib"]
lines += ["", "RSS (MiB) every 10 s: " + ", ".join(f"{m:.0f}" for _, m in r)]
if len(r) > 2:
    warm = r[len(r) // 4:]
    lines.append(f"after the first quarter: min {min(m for _, m in warm):.0f}, max {max(m for _, m in warm):.0f} MiB")
text = "\n".join(lines) + "\n"
print(text)
if out != "-":
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    open(out, "w").write(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.plot([t for t, _ in r], [m for _, m in r], marker="o")
        ax.set_xlabel("s"); ax.set_ylabel("RSS MiB"); ax.set_title("tlmd RSS under the soak load")
        fig.tight_layout(); fig.savefig(os.path.splitext(out)[0] + ".png")
    except ImportError:
        pass
bad = sum(v["unexpected"] for v in s["kinds"].values())
sys.exit(1 if bad else 0)
PY
