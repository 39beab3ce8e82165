#!/usr/bin/env python3
"""Markdown table of bench/results/peers_tvm.jsonl (the TVM MetaSchedule peer's runs).

One row per tuning database (work_dir): runs chained with --resume on one database (or on a
copy of an earlier run's database) add up (trials measured, tuning seconds); the row shows the last run's kernel time and the whole
database's best-so-far curve at trials 16, 64, 256 and 1000.

Usage: report_peers_tvm.py [JSONL [REAL_SHAPES_JSONL]]   (prints the table on stdout)
With the second file (default bench/results/real_shapes.jsonl when it exists), a last column
gives PyTorch eager's median ms from that run (another moment, other machine load).
"""
import json
import os
import sys


def at(curve, n):
    if len(curve) < n:
        return ""
    v = curve[n - 1][1]
    return "" if v is None else "%.3f" % v


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "peers_tvm.jsonl")
    rs = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(path)), "real_shapes.jsonl")
    torch_ms = {}
    if os.path.exists(rs):
        with open(rs) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("kind") == "torch" and j.get("median_s"):
                    torch_ms[j["name"]] = j["median_s"] * 1e3
    rows = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            key = r.get("work_dir") or "%s-%s-%d" % (r["name"], r["target"], r["trials"])
            prev = rows.get(key) if r.get("resumed") else None
            if r.get("resumed") and prev is None:
                # a chain started on a copy of another run's database: the run whose curve is
                # a prefix of this one
                for q in list(rows.values())[::-1]:
                    n = len(q["best_so_far"])
                    if (q["name"], q["target"]) == (r["name"], r["target"]) and \
                            0 < n < len(r["best_so_far"]) and \
                            q["best_so_far"] == r["best_so_far"][:n]:
                        prev = q
                        break
            if prev is not None:
                r["tuning_total_s"] = prev["tuning_total_s"] + r["tuning_s"]
                r["runs"] = prev["runs"] + 1
            else:
                r["tuning_total_s"] = r["tuning_s"]
                r["runs"] = 1
            rows[key] = r
    print("| workload | target | trials | runs | tuning wall s | kernel ms (median) | kernel ms "
          "(min) | tuner's best ms | best@16 | best@64 | best@256 | best@1000 | rel err | "
          "load | PyTorch ms (real_shapes.jsonl) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in sorted(rows.values(), key=lambda r: (r["name"], r["trials_measured"])):
        c = r["best_so_far"]
        print("| %s | %s | %d | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["name"], r["target"], r["trials_measured"], r["runs"], r["tuning_total_s"],
            "%.3f" % r["kernel_ms"] if r.get("kernel_ms") else "—",
            "%.3f" % r["kernel_min_ms"] if r.get("kernel_min_ms") else "—",
            "%.3f" % r["tuned_ms"] if r.get("tuned_ms") else "—",
            at(c, 16), at(c, 64), at(c, 256), at(c, 1000),
            "%.1e" % r["rel_err"] if r.get("rel_err") is not None else "—",
            r.get("loadavg", ""),
            "%.3f" % torch_ms[r["name"]] if r["name"] in torch_ms else ""))


if __name__ == "__main__":
    main()
