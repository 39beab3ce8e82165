#!/usr/bin/python3
"""bench/results/htam.jsonl (bench/htam.sh) -> bench/results/htam.md: per variant, budget and
memory state: tasks, correct (a correct kernel came back), fast@1 (share of tasks that end
faster than their first attempt, the default), geomean speedup over the first attempt.
All from `tlm tune` JSON: first_ms is the starting point's time, best_ms the final one."""
import argparse
import collections
import json
import math


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results/htam.jsonl")
    ap.add_argument("--md", default="bench/results/htam.md")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    groups = collections.OrderedDict()
    for r in rows:
        parts = r["key"].split("/")
        variant, budget = parts[1], int(parts[2])
        state = parts[3] if len(parts) > 3 else "-"
        groups.setdefault((variant, budget, state), []).append(r)
    out = ["# HTAM refinement vs its ablations and the evolutionary search", "",
           "From bench/htam.sh (`tlm tune` per workload from the default kernel). fast@1: share "
           "of tasks whose final kernel is faster than the first attempt; speedup: geomean of "
           "first_ms / best_ms. cold: an empty memory; warm: the memory after full HTAM on a "
           "disjoint training slice.", "",
           "| variant | budget | memory | tasks | correct | fast@1 | geomean speedup |",
           "|---|---|---|---|---|---|---|"]
    for (variant, budget, state), rs in sorted(groups.items(), key=lambda x: (x[0][1], x[0][0], x[0][2])):
        ok = [r for r in rs if r.get("best_ms") and r.get("first_ms")]
        fast = sum(1 for r in ok if r["best_ms"] < r["first_ms"])
        sp = [r["first_ms"] / r["best_ms"] for r in ok]
        g = math.exp(sum(math.log(x) for x in sp) / len(sp)) if sp else float("nan")
        out.append(f"| {variant} | {budget} | {state} | {len(rs)} | {len(ok)} | "
                   f"{100.0 * fast / len(rs):.0f} % | {g:.3f} |")
    open(a.md, "w").write("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
