#!/usr/bin/python3
"""bench/results/htam.jsonl (bench/htam.sh) -> bench/results/htam.md and htam.png: per variant,
budget and memory state: tasks, correct (a correct kernel came back), fast@1 (share of tasks
that end faster than their first attempt, the default) and the geomean speedup over the first
attempt.

Two readings of every run, both from `tlm tune` JSON:
  - second look (the figures that count): first_confirmed_ms / confirmed_ms, the starting point
    and the chosen kernel measured again in the same rotating rounds after the search; a run
    that kept its start has speedup 1 and is not fast;
  - in-search: first_ms / best_ms, the start's first sample against the fastest of many short
    samples: on a noisy host it favours the search (a slow first sample, a lucky best one)."""
import argparse
import collections
import json
import math


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def readings(r):
    """(second-look speedup or None, in-search speedup or None)"""
    f, b = r.get("first_confirmed_ms"), r.get("confirmed_ms")
    conf = f / b if f and b else None
    if conf is None and r.get("best_ms") and r.get("confirmed") == 0:
        conf = 1.0  # no second look: the start was the search's fastest (or its only correct one)
    f0, b0 = r.get("first_ms"), r.get("best_ms")
    ins = f0 / b0 if f0 and b0 else None
    return conf, ins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results/htam.jsonl")
    ap.add_argument("--md", default="bench/results/htam.md")
    ap.add_argument("--png", default="bench/results/htam.png")
    ap.add_argument("--note", default="", help="a paragraph on the run (host, load, command)")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    groups = collections.OrderedDict()
    names = set()
    for r in rows:
        parts = r["key"].split("/")
        names.add(parts[0])
        variant, budget = parts[1], int(parts[2])
        state = parts[3] if len(parts) > 3 else "-"
        groups.setdefault((variant, budget, state), []).append(r)
    out = ["# HTAM refinement vs its ablations and the evolutionary search", "",
           "From bench/htam.sh (`tlm tune` per workload, starting from the default kernel: the "
           "one-pass kernel the server serves while the trained weights are held back). cold: an "
           "empty memory; warm: the memory after full HTAM on a disjoint training slice.", "",
           "**Second look** (the figures that count): after each run the chosen kernel and the "
           "starting point are measured again, alternately, three rounds each with the full "
           "protocol; speedup = start / chosen there; fast@1 = share of tasks whose chosen kernel "
           "is faster than the start there (a run that kept its start is not fast); by ≥ 3 %: "
           "the same with a margin above this host's run-to-run noise. "
           "**In-search**: the start's first sample / the fastest sample of the search, which a "
           "noisy host inflates.", ""]
    if a.note:
        out += [a.note, ""]
    out += ["| variant | budget | memory | tasks | correct | fast@1 | fast@1 by ≥ 3 % | "
            "geomean speedup | in-search fast@1 | in-search speedup |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for (variant, budget, state), rs in sorted(groups.items(),
                                               key=lambda x: (x[0][1], x[0][0], x[0][2])):
        ok = [r for r in rs if r.get("best_ms")]
        conf = [c for c, _ in map(readings, ok) if c]
        ins = [i for _, i in map(readings, ok) if i]
        fast = sum(1 for c in conf if c > 1.0)
        fast3 = sum(1 for c in conf if c >= 1.03)
        fast_in = sum(1 for i in ins if i > 1.0)
        g, gi = geomean(conf), geomean(ins)
        summary[(variant, budget, state)] = g
        out.append(f"| {variant} | {budget} | {state} | {len(rs)} | {len(ok)} | "
                   f"{100.0 * fast / len(rs):.0f} % | {100.0 * fast3 / len(rs):.0f} % | {g:.3f} | "
                   f"{100.0 * fast_in / len(rs):.0f} % | {gi:.3f} |")
    out += ["", f"Workloads ({len(names)}): " + ", ".join(sorted(names)) + ".", ""]
    # per workload at the largest HTAM budget: the second-look speedups side by side
    budgets = sorted({b for (_, b, _) in groups})
    hb = max((b for (v, b, _) in groups if v.startswith("htam")), default=None)
    if hb is not None:
        cols = [(v, b, s) for (v, b, s) in groups if b == hb] + \
               [(v, b, s) for (v, b, s) in groups if v == "evolutionary" and b > hb]
        cols = sorted(set(cols), key=lambda x: (x[0] != "evolutionary", x[0], x[1], x[2]))
        out += [f"Per workload, second-look speedup over the start at budget {hb} (and the "
                f"evolutionary search at its larger budget):", "",
                "| workload | " + " | ".join(f"{v} {b} {s}" for v, b, s in cols) + " |",
                "|---|" + "---|" * len(cols)]
        for n in sorted(names):
            cells = []
            for c in cols:
                r = next((r for r in groups[c] if r["key"].split("/")[0] == n), None)
                sp = readings(r)[0] if r else None
                cells.append(f"{sp:.2f}" if sp else "–")
            out.append(f"| {n} | " + " | ".join(cells) + " |")
        out.append("")
    if a.png:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for (variant, state) in sorted({(v, s) for (v, _, s) in groups}):
                xs = [b for b in budgets if (variant, b, state) in summary]
                ys = [summary[(variant, b, state)] for b in xs]
                if xs:
                    ax.plot(xs, ys, marker="o",
                            label=variant + ("" if state == "-" else f" ({state})"),
                            linestyle="-" if variant == "evolutionary" or state == "cold" else "--")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("measurements (budget)")
            ax.set_ylabel("geomean speedup over the start (second look)")
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.legend(fontsize=8)
            ax.set_title(f"HTAM vs ablations vs evolutionary search ({len(names)} workloads)")
            fig.tight_layout()
            fig.savefig(a.png, dpi=110)
            out.append(f"![speedup vs budget]({a.png.split('/')[-1]})")
            out.append("")
        except ImportError:
            out.append("(no plot: matplotlib is not installed)")
    open(a.md, "w").write("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
