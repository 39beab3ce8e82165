#!/usr/bin/python3
"""The measured search beside the default and the peers: bench/results/tune.md and tune.png.

Input: the JSON lines build/bench/real_shapes writes with --tune N [--tune-random]
(bench/tune.sh: bench/results/tune.jsonl): "host", "ours" (default, structured variants, and
"tune": {"evolutionary": {...}, "random": {...}} with trials, wall_s, model_s, curve_s (best
so far after each trial, s), and the winner re-measured as fully as the default: median_s),
"peers" (OpenBLAS, oneDNN), "torch" (PyTorch eager), "ort" (ONNX Runtime) — all measured in
the same run, right after ours. The last line per key wins.

Ratios are speedups, peer time / our time (> 1: ours is faster), medians of the same run.
"vendor" is the fastest of OpenBLAS and oneDNN (plain or blocked layouts) for the workload.

With --tvm F (bench/peers_tvm.py's JSON lines, "kind": "tvm_ms"; repeatable) a second table
sets the tuned kernels beside TVM MetaSchedule's on the workloads both tuned: kernel time
(MetaSchedule's best record rebuilt and timed in a fresh process, and its tuner's own best),
tuning wall time and best so far at equal trials; the plot gets a second panel with both
searches' best so far against our default.

--results is repeatable, read in order (the last line per key wins), and FILE:NAME,NAME takes
only those workloads' lines from FILE (its other sittings left out), so one report can gather
the runs of several sittings.

Usage: report_tune.py [--results F[:NAMES] ...] [--md F] [--png F] [--tvm F ...]
"""
import argparse
import datetime
import json
import math
import os

import report_real_shapes  # bench/, beside this script


def read_jsonl(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return rows


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def fmt(x, d=2):
    return "–" if x is None or not math.isfinite(x) else f"{x:.{d}f}"


def vendor_s(p):
    if not p:
        return None
    ts = [v for k, v in p.items()
          if k.endswith("_s") and k not in ("wall_s", "floor_s")  # floor: a copy, no vendor
          and isinstance(v, (int, float)) and v > 0]
    return min(ts) if ts else None


def apply_rounds(rows, ours, peers, torch, ort):
    """Folds real_shapes' head-to-head "rounds" records into the first-pass figures as
    report_real_shapes.py does (the default and every peer: the best of its medians), and the
    tuned winner, which --tune adds to the rounds, likewise. Returns the largest number of
    rounds seen and how many tuned winners had rounds."""
    n = report_real_shapes.apply_rounds(rows, ours, peers, torch, ort)
    n_tuned = 0
    for r in rows:
        if r.get("kind") != "rounds":
            continue
        for t, k in (r.get("ours") or {}).items():
            o = ours.get((r["name"], t))
            if not o or o.get("build") != r.get("build"):
                continue
            evo = o.get("tune", {}).get("evolutionary", {})
            if evo.get("median_s") and "tuned" in k:
                evo["median_s"] = report_real_shapes.fastest(evo["median_s"], k["tuned"])
                n_tuned += 1
    return n, n_tuned


def at(curve, n):
    """best so far after n trials (None when fewer were run)"""
    if not curve or len(curve) < n:
        return None
    v = curve[n - 1]
    return v if v and v > 0 else None


def dense_curve(points, trials):
    """MetaSchedule's [[trial, ms], ...] records as best so far after each of its trials, in
    seconds (the shape of our curve_s, so at() reads both); None before its first record"""
    curve, best, pts = [], None, dict(points or [])
    for k in range(1, (trials or 0) + 1):
        v = pts.get(k)
        if v and (best is None or v < best):
            best = v
        curve.append(best * 1e-3 if best else None)
    return curve


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", action="append", default=[],
                    help="real_shapes --tune results (JSON lines), FILE or FILE:NAME,NAME "
                         "(those workloads only); repeatable, read in order")
    ap.add_argument("--md", default="bench/results/tune.md")
    ap.add_argument("--png", default="bench/results/tune.png")
    ap.add_argument("--tvm", action="append", default=[],
                    help="bench/peers_tvm.py results (JSON lines); repeatable")
    a = ap.parse_args()
    tvm = {}
    for path in a.tvm:
        for r in read_jsonl(path):
            if r.get("kind") == "tvm_ms" and r.get("kernel_ms"):
                tvm.setdefault((r["name"], r.get("target", "cpu")), []).append(r)
    if not a.results:
        a.results = ["bench/results/tune.jsonl"]
    rows = []
    for spec in a.results:
        path, _, names = spec.partition(":")
        keep = set(names.split(",")) if names else None
        # host lines belong to every workload of their sitting
        rows += [r for r in read_jsonl(path)
                 if keep is None or r.get("kind") == "host" or r.get("name") in keep]
    host, ours, peers, torch, ort = None, {}, {}, {}, {}
    for r in rows:
        k = r.get("kind")
        if k == "host":
            host = r
        elif k == "ours" and "tune" in r:
            ours[(r["name"], r["target"])] = r
        elif k == "peers":
            peers[r["name"]] = r
        elif k == "torch":
            torch[r["name"]] = r
        elif k == "ort":
            ort[r["name"]] = r
    n_rounds, n_tuned_rounds = apply_rounds(rows, ours, peers, torch, ort)

    marks = [16, 64, 256, 1000]
    lines = []
    out = lines.append

    def table(cols):  # a markdown table's header and separator lines
        out("| " + " | ".join(cols) + " |")
        out("|" + "---|" * len(cols))
    out("# Measured search (tune) beside the default and the peers\n")
    out(f"Generated {datetime.datetime.now().isoformat(timespec='seconds')} by "
        f"bench/report_tune.py from {', '.join(a.results)} (bench/real_shapes --tune). "
        "Every figure of a row was measured in the same run, the peers right after ours.\n")
    if host:
        out(f"Host: {host.get('cpu_model')}, {host.get('cores')} cores, ISA "
            f"{' '.join(host.get('isa', []))}; OpenBLAS core {host.get('openblas_core')}, "
            f"pinned {host.get('openblas_pinned')}.\n")
    out("In-search default/best: the search's first measurement (the default) over its best, "
        "both from the search's own short measurements in one sequence. " +
        (f"Default, tuned, vendor, PyTorch and ONNX Runtime figures: each the best of its "
         f"first-pass median and {n_rounds} head-to-head rounds (our default, the tuned winner "
         f"and every peer measured again alternately after the first pass; {n_tuned_rounds} of "
         f"{len(ours)} tuned winners had rounds), so one stall of this shared machine does not "
         f"decide a ratio.\n" if n_rounds else
         "The re-measured columns are single later measurements (no head-to-head rounds in "
         "these results).\n"))
    out("Columns: default = the rule of thumb (what the server serves untrained); tuned = the "
        "evolutionary search's winner after N trials, re-measured as fully as the default; "
        "search@n = best so far after n trials (evolutionary / random strategy, the search's "
        "own short measurements); second look = the search's start (the default) over its "
        "winner, both measured again in the same rotating rounds at the end of the search "
        "(runs before the second look included the start: –); tune s = wall time of the search (builds + measurements + "
        "cost model); speedups are peer time / tuned time.\n")
    table(["workload", "target", "N", "default ms", "tuned ms", "tuned/default",
           "second look default/tuned", "in-search default/best", "vs vendor", "vs PyTorch",
           "vs ORT", "tune s (model s)"] + [f"evo@{m} / rnd@{m} ms" for m in marks])
    g = {"def": [], "second": [], "insearch": [], "vendor": [], "torch": [], "ort": [],
         "evo_vs_rnd": {m: [] for m in marks}}
    curves = []
    for (name, tgt), r in sorted(ours.items()):
        t = r["tune"]
        evo, rnd = t.get("evolutionary", {}), t.get("random", {})
        d = r.get("default", {}).get("median_s")
        ts = evo.get("median_s")
        v = vendor_s(peers.get(name))
        pt = torch.get(name, {}).get("median_s")
        po = ort.get(name, {}).get("median_s")
        s_def = d / ts if d and ts else None
        cv = evo.get("curve_s") or []
        s_in = cv[0] / cv[-1] if cv and cv[0] and cv[-1] else None
        f2, c2 = evo.get("first_confirmed_s"), evo.get("confirmed_s")
        s_2 = f2 / c2 if f2 and c2 else None
        s_v = v / ts if v and ts else None
        s_t = pt / ts if pt and ts else None
        s_o = po / ts if po and ts else None
        for k, x in (("def", s_def), ("second", s_2), ("insearch", s_in), ("vendor", s_v), ("torch", s_t),
                     ("ort", s_o)):
            if x:
                g[k].append(x)
        cells = []
        for m in marks:
            e, q = at(evo.get("curve_s"), m), at(rnd.get("curve_s"), m)
            if e and q:
                g["evo_vs_rnd"][m].append(q / e)
            cells.append(f"{fmt(e * 1e3 if e else None, 3)} / {fmt(q * 1e3 if q else None, 3)}")
        out(f"| {name} | {tgt} | {evo.get('trials', 0)} | {fmt(d * 1e3 if d else None, 3)} | "
            f"{fmt(ts * 1e3 if ts else None, 3)} | {fmt(s_def)} | {fmt(s_2)} | {fmt(s_in)} | {fmt(s_v)} | "
            f"{fmt(s_t)} | "
            f"{fmt(s_o)} | {fmt(evo.get('wall_s'), 0)} ({fmt(evo.get('model_s'), 1)}) | " +
            " | ".join(cells) + " |")
        if d and evo.get("curve_s"):
            curves.append((name, d, evo.get("curve_s"), rnd.get("curve_s")))
    out("")
    out(f"Geomean over {len(ours)} workload-target pairs: tuned/default "
        f"{fmt(geomean(g['def']))}× (re-measured), {fmt(geomean(g['second']))}× in the search's "
        f"second look (its start and its winner in the same rotating rounds; n="
        f"{len(g['second'])}), {fmt(geomean(g['insearch']))}× within the "
        f"search (its first measurement is the default), vs vendor {fmt(geomean(g['vendor']))}×, vs PyTorch eager "
        f"{fmt(geomean(g['torch']))}×, vs ONNX Runtime {fmt(geomean(g['ort']))}×.\n")
    out("Cost model vs random sampling at equal trials (geomean of random best / evolutionary "
        "best; > 1: the cost model found faster kernels): " +
        ", ".join(f"@{m}: {fmt(geomean(g['evo_vs_rnd'][m]))} (n={len(g['evo_vs_rnd'][m])})"
                  for m in marks) + ".\n")
    # per workload the MetaSchedule run at our trial count (equal trials), else its longest
    # run; the last line of those wins
    for key, runs in list(tvm.items()):
        n = (ours.get(key) or {}).get("tune", {}).get("evolutionary", {}).get("trials")
        eq = [m for m in runs if m.get("trials") == n]
        tvm[key] = eq[-1] if eq else max(runs, key=lambda m: m.get("trials") or 0)
    both = sorted(k for k in ours if k in tvm)
    if both:
        out("## Beside TVM MetaSchedule\n")
        out("MetaSchedule (bench/peers_tvm.py, " + ", ".join(sorted(set(
            f"apache-tvm {tvm[k].get('tvm_version')} + ffi {tvm[k].get('ffi_version')}, "
            f"mcpu {tvm[k].get('mcpu')}, {tvm[k].get('threads')} threads" for k in both))) +
            ") tuned the same workloads on the same host: " + ", ".join(sorted(set(a.tvm))) +
            ". Its kernel ms = its best record rebuilt and timed in "
            "a fresh process (median of 10 time_evaluator repeats); its tuner's ms = the best "
            "its runner recorded during tuning. Ours: the tuned winner re-measured as above. "
            "speedup = MetaSchedule ms / our tuned ms (> 1: ours faster); best@n: best so far "
            "after n trials in each search's own measurements (ms).\n")
        table(["workload", "target", "our trials", "our tune s", "our tuned ms", "MS trials",
               "MS tune s", "MS kernel ms", "MS tuner's ms", "speedup vs MS kernel",
               "vs MS tuner's"] + [f"ours / MS @{m}" for m in marks] + ["load avg (MS)"])
        gk, gt, gw = [], [], []
        for key in both:
            r, m = ours[key], tvm[key]
            evo = r["tune"].get("evolutionary", {})
            ts = evo.get("median_s")
            mk, mt = m.get("kernel_ms"), m.get("tuned_ms")
            sk = mk / (ts * 1e3) if ts and mk else None
            st = mt / (ts * 1e3) if ts and mt else None
            gk.append(sk)  # geomean() skips the missing
            gt.append(st)
            if evo.get("wall_s") and m.get("tuning_s"):
                gw.append(m["tuning_s"] / evo["wall_s"])
            mc = dense_curve(m.get("best_so_far"), m.get("trials"))
            cells = []
            for n in marks:
                e, q = at(evo.get("curve_s"), n), at(mc, n)
                cells.append(f"{fmt(e * 1e3 if e else None, 3)} / {fmt(q * 1e3 if q else None, 3)}")
            out(f"| {key[0]} | {key[1]} | {evo.get('trials', 0)} | {fmt(evo.get('wall_s'), 0)} | "
                f"{fmt(ts * 1e3 if ts else None, 3)} | {m.get('trials')} | "
                f"{fmt(m.get('tuning_s'), 0)} | {fmt(mk, 3)} | {fmt(mt, 3)} | {fmt(sk)} | "
                f"{fmt(st)} | " + " | ".join(cells) + f" | {fmt(m.get('loadavg'), 1)} |")
        out("")
        out(f"Geomean over {len(both)}: our tuned kernel vs MetaSchedule's "
            f"{fmt(geomean(gk))}× (its fresh-process time), {fmt(geomean(gt))}× (its tuner's "
            f"best); MetaSchedule's tuning wall time / ours {fmt(geomean(gw))}×.\n")
    with open(a.md, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    if a.png and curves:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("report_tune.py: no matplotlib; no plot")
            return
        fig, axs = plt.subplots(1, 2 if both else 1, figsize=(15 if both else 8, 5),
                                squeeze=False)
        ax = axs[0][0]
        n = max(len(c[2]) for c in curves)
        for strat, col, idx in (("evolutionary (cost model)", "tab:blue", 2),
                                ("random", "tab:orange", 3)):
            ys = []
            for k in range(1, n + 1):
                vals = []
                for name, d, e, q in curves:
                    c = e if idx == 2 else q
                    b = at(c, k)
                    # each curve against its own first measurement (the default, in the same
                    # search): the two strategies' runs are compared each in its own context
                    if b and c and c[0]:
                        vals.append(c[0] / b)
                ys.append(geomean(vals) if vals else float("nan"))
            ax.plot(range(1, n + 1), ys, label=strat, color=col)
        ax.set_xscale("log")
        ax.set_xlabel("trials")
        ax.set_ylabel("best so far / the default, in-search (geomean)")
        ax.set_title("Measured search: best so far vs trials")
        ax.grid(True, alpha=0.3)
        ax.legend()
        if both:
            bx = axs[0][1]
            for i, key in enumerate(both):
                r, m = ours[key], tvm[key]
                d = r.get("default", {}).get("median_s")
                cv = r["tune"].get("evolutionary", {}).get("curve_s") or []
                col = f"C{i % 10}"
                if d and cv:
                    bx.plot(range(1, len(cv) + 1), [d / c if c else float("nan") for c in cv],
                            color=col, label=f"{key[0]}: ours")
                mc = dense_curve(m.get("best_so_far"), m.get("trials"))
                if d and any(mc):
                    bx.plot(range(1, len(mc) + 1), [d / c if c else float("nan") for c in mc],
                            color=col, linestyle="--", label=f"{key[0]}: MetaSchedule")
            bx.set_xscale("log")
            bx.set_xlabel("trials")
            bx.set_ylabel("our default / best so far (in-search)")
            bx.set_title("Ours vs TVM MetaSchedule at equal trials")
            bx.grid(True, alpha=0.3)
            bx.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
