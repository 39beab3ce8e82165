#!/usr/bin/python3
"""Joins the real-shapes measurements into bench/results/real_shapes.md and a plot.

Inputs (JSON lines; the last line per key wins, so resumed and partial reruns just append):
  bench/results/real_shapes.jsonl        build/bench/real_shapes: "host" (machine, limits),
                                          "ours" (per workload and target), "peers" (OpenBLAS,
                                          oneDNN plain / blocked), "torch" and "ort" (PyTorch
                                          eager, ONNX Runtime, asked right after ours)
  --torch F / --ort F                     optional: standalone runs of bench/peers_torch.py /
                                          peers_ort.py (bench/results/real_shapes.torch.jsonl,
                                          .ort.jsonl), for workloads the sweep has no line for
Outputs: the markdown table (--md) and a PNG of speedup vs PyTorch per workload, default and
best of N, per target (--png; needs matplotlib, Debian python3-matplotlib).

Ratios are speedups, peer time / our time (> 1: ours is faster), from medians of the same run.
Memory-bound workloads (row ops, elementwise, pools, transposes, and anything under 4 flops
per byte) also show time / floor, floor = the time, measured in the same run on buffers of the
same sizes, of copying the output's bytes (the fastest of memcpy and two streaming-store
copies, one prefetching its source into L2) when the op writes as much as it reads, else of
reading the input's bytes (peer_mem_floor_s); records
without it fall back to minimal bytes (ir_subgraph_bytes) / the measured read bandwidth. The
floor is timed warm (same buffers every call, as our kernels' default timing) in the first pass
and again in every round, beside our kernels, and the best of those medians is taken, as for
ours. 'DRAM' marks those whose bytes exceed the last-level cache; for its softmax and norms the
rounds also time ours cold (the measure runner's cold_cache: copies of every argument rotated,
1 GiB in all) and the floor cold (its buffers rotated the same way), shown as "cold".
"paired": the same ratios taken round by round (ours, the faster of default and best in that
round, over the floor timed beside it), the median over the rounds: the best medians above may
pair a fast moment of one with a slow one of the other on a shared machine. The dense, 3x3 and
depthwise criteria are paired the same way (the peer's time over ours in each round). "in the runner": the
DRAM rows' kernels timed in the rounds with the floor alternated sample by sample in the same
measure runner, on the same buffers (measure_opts.mem_floor), the median of the samples' ratios
(per round the faster kernel's), the median over the rounds: a shared VM's memory bandwidth
drifts by 2x within a minute, and only this pairing keeps both sides of a ratio in one moment.

Usage: report_real_shapes.py [--suite F] [--results F] [--torch F] [--ort F] [--md F] [--png F]
                             [--wall SECONDS]
"""
import argparse
import datetime
import json
import math
import os
import sys

ROW_OPS = {"softmax", "layer_norm", "rms_norm", "reduce_sum", "reduce_mean", "reduce_max",
           "elementwise", "transpose", "max_pool2d", "avg_pool2d", "global_avg_pool2d"}
NORM_OPS = {"softmax", "layer_norm", "rms_norm"}


def read_jsonl(path):
    rows = []
    if not path or not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass  # a line cut by an interrupted run
    return rows


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    if not xs:
        return None
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def fmt(x, nd=2, suffix=""):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}{suffix}"
    if abs(x) >= 10:
        return f"{x:.1f}{suffix}"
    return f"{x:.{nd}f}{suffix}"


def ratio(peer_s, ours_s):
    if peer_s and ours_s and peer_s > 0 and ours_s > 0:
        return peer_s / ours_s
    return None


def shape_text(w):
    s = w["shape"]
    op = w["op"]
    keys = "x".join(str(v) for v in s.values())
    extra = []
    for key, tag, dflt in (("stride", "s", [1, 1]), ("pad", "p", [0, 0])):
        v = w.get(key)
        if v and v != dflt:
            extra.append(f"{tag}{v[0]}" if v[0] == v[1] else f"{tag}{v[0]}x{v[1]}")
    if w.get("groups", 1) != 1:
        extra.append(f"g{w['groups']}")
    if w.get("dilation") and w["dilation"] != [1, 1]:
        extra.append(f"d{w['dilation'][0]}")
    if w.get("transpose_b"):
        extra.append("Bᵀ")
    if w.get("epilogue"):
        extra.append("+" + "+".join(e.replace("bias_add", "bias") for e in w["epilogue"]))
    return f"{op} {keys}" + (" " + " ".join(extra) if extra else "")


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def fastest(first, more):
    """The best median of the first pass and the rounds (None when there is none)."""
    xs = [x for x in [first] + list(more or []) if isinstance(x, (int, float)) and x > 0]
    return min(xs) if xs else first


def builds_line(ours, host):
    """The builds our rows were measured with: one, or, where some workloads were measured again
    after a change (bench/real_shapes.sh --only), each build with the workloads it measured
    (the larger share first) and the latest run's time."""
    by = {}
    for (name, _t), o in ours.items():
        by.setdefault(o.get("build", "?"), set()).add(name)
    when = datetime.datetime.fromtimestamp(host.get("time", 0)).strftime("%Y-%m-%d %H:%M")
    if len(by) <= 1:
        return f"Build {host.get('build', '?')}; {when}"
    parts = sorted(by.items(), key=lambda kv: -len(kv[1]))
    head = f"Build {parts[0][0]} ({len(parts[0][1])} workloads)"
    rest = "; ".join(f"build {b} ({', '.join(sorted(ns))}, measured again after a change)"
                     for b, ns in parts[1:])
    return f"{head}; {rest}; latest run {when}"


def apply_rounds(rows, ours, peers, torch, ort):
    """Folds the "rounds" records (real_shapes.c rs_rounds: our kept kernels and the peers
    re-measured alternately, R times, after the first pass) into the first-pass records: each
    figure becomes the best of its medians, ours and the peers alike. Returns the largest R
    seen (0: no rounds)."""
    n = 0
    for r in rows:
        if r.get("kind") != "rounds":
            continue
        name = r["name"]
        n = max(n, r.get("rounds") or 0)
        for t, k in (r.get("ours") or {}).items():
            o = ours.get((name, t))
            if not o or o.get("build") != r.get("build"):
                continue
            for key in ("default", "best"):
                if key in k and o.get(key, {}).get("median_s"):
                    o[key]["median_s"] = fastest(o[key]["median_s"], k[key])
                    o[key]["gflops"] = o["flops"] / o[key]["median_s"] / 1e9
            # DRAM-sized rows: the same kernels timed cold (the measure runner's cold_cache),
            # rounds only; the best of default and best, as "best" is
            cold = [fastest(None, k.get(key + "_cold")) for key in ("default", "best")]
            if cold[0]:
                o["default_cold_s"] = fastest(o.get("default_cold_s"), [cold[0]])
            if any(cold):
                o["best_cold_s"] = fastest(o.get("best_cold_s"), [c for c in cold if c])
            # convs and dense layers: the same kernels with their weights packed once (the
            # runtime's prepacks), rounds only
            pre = [fastest(None, k.get(key + "_pre")) for key in ("default", "best")]
            if pre[0]:
                o["default_pre_s"] = fastest(o.get("default_pre_s"), [pre[0]])
            if any(pre):
                o["best_pre_s"] = fastest(o.get("best_pre_s"), [c for c in pre if c])
            # DRAM-sized rows, paired by round: ours (the faster of default and best in that
            # round) over the floor timed beside it, the median over the rounds; the best of
            # each figure's medians, above, may pair a fast moment of one with a slow one of
            # the other on a shared machine
            fl = r.get("peers") or {}
            for suffix, fkey in (("", "floor_s"), ("_cold", "floor_cold_s")):
                mine = [min(x for x in xs if x) for xs in
                        zip(*[k[key + suffix] for key in ("default", "best")
                              if k.get(key + suffix)]) if any(xs)]
                floors = fl.get(fkey) or []
                if mine and len(mine) == len(floors):
                    o["paired_floor" + suffix] = median([m / f for m, f in zip(mine, floors)])
                # the same, the two alternated sample by sample in the measure runner
                # (opts.mem_floor): per round the faster kernel's ratio, the median over rounds
                runner = [min(x for x in xs if x) for xs in
                          zip(*[k[key + suffix + "_floor_ratio"] for key in ("default", "best")
                                if k.get(key + suffix + "_floor_ratio")]) if any(xs)]
                if runner:
                    o["runner_floor" + suffix] = median(runner)
            # the peers paired by round the same way: the peer's time over ours in that
            # round, the median over the rounds (the criteria's "paired" rows)
            mine = [min(x for x in xs if x) for xs in
                    zip(*[k[key] for key in ("default", "best") if k.get(key)]) if any(xs)]
            for pk in ("openblas_s", "dnnl_blocked_s"):
                ps = fl.get(pk) or []
                if mine and len(ps) == len(mine) and all(ps):
                    o.setdefault("paired_peer", {})[pk] = median(
                        [q / m for m, q in zip(mine, ps)])
            d, b = o.get("default", {}), o.get("best", {})
            if d.get("median_s") and (not b.get("median_s") or d["median_s"] <= b["median_s"]):
                o["best"] = dict(d)
                o["best_from"] = "default"
                o["best_schedule"] = o.get("default_schedule")
        p = peers.get(name)
        for key, more in (r.get("peers") or {}).items():
            if p is not None and (p.get(key) or key.startswith("floor")):
                p[key] = fastest(p.get(key), more)
        for table, key in ((torch, "torch"), (ort, "ort")):
            q = table.get(name)
            if q and q.get("median_s") and r.get(key):
                q["median_s"] = fastest(q["median_s"], r[key])
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="bench/suites/real_shapes.json")
    ap.add_argument("--results", default="bench/results/real_shapes.jsonl")
    ap.add_argument("--torch", default=None, help="standalone peers_torch.py output")
    ap.add_argument("--ort", default=None, help="standalone peers_ort.py output")
    ap.add_argument("--avx2-peers", default=None,
                    help="peers measured held to AVX2 (real_shapes --part peers under "
                         "OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2 "
                         "ATEN_CPU_CAPABILITY=avx2): the cpu:avx2 rows' peers")
    ap.add_argument("--md", default="bench/results/real_shapes.md")
    ap.add_argument("--png", default="bench/results/real_shapes.png")
    ap.add_argument("--wall", type=float, default=None, help="wall seconds of the whole run")
    args = ap.parse_args()

    with open(args.suite) as f:
        suite = json.load(f)["workloads"]
    rows = read_jsonl(args.results)
    host, host_limits, ours, peers = {}, {}, {}, {}
    n_limits = 0
    for r in rows:
        k = r.get("kind")
        if k == "host":
            host = r
            if "fma_peak_gflops" in r:
                # the best of the measurements (start and end of each run): a busy moment
                # only ever lowers them, and the floors are physical limits
                n_limits += 1
                for key, v in r.items():
                    if key.endswith(("_gflops", "_gbs")) and isinstance(v, (int, float)):
                        host_limits[key] = max(v, host_limits.get(key) or 0)
                    else:  # the latest run's (its peers' settings: rows re-measured later)
                        host_limits[key] = v
        elif k == "ours":
            ours[(r["name"], r["target"])] = r
        elif k == "peers":
            peers[r["name"]] = r
    # standalone peer files first; the sweep's own lines (asked beside our kernels) win
    torch = {r["name"]: r for r in read_jsonl(args.torch) + rows if r.get("kind") == "torch"}
    ort = {r["name"]: r for r in read_jsonl(args.ort) + rows if r.get("kind") == "ort"}
    # the cpu:avx2 rows' peers held to AVX2, where measured (ONNX Runtime stays native)
    avx2_rows = read_jsonl(args.avx2_peers)
    avx2_peers = {r["name"]: r for r in avx2_rows if r.get("kind") == "peers"}
    avx2_torch = {r["name"]: r for r in avx2_rows if r.get("kind") == "torch"}
    avx2_ort = {r["name"]: r for r in avx2_rows if r.get("kind") == "ort"}
    # our cpu:avx2 kernels re-measured in that pass (real_shapes --ours-from: the sweep's
    # default and chosen schedules), so the held ratios compare one machine state
    avx2_ours = {(r["name"], r["target"]): r for r in avx2_rows if r.get("kind") == "ours"}
    n_rounds = apply_rounds(rows, ours, peers, torch, ort)
    apply_rounds(avx2_rows, avx2_ours, avx2_peers, avx2_torch, avx2_ort)
    avx2_core = next((r.get("openblas_core") for r in avx2_rows
                      if r.get("kind") == "host" and r.get("openblas_core")), None)
    targets = []
    for (_, t) in ours:
        if t not in targets:
            targets.append(t)
    targets.sort(key=lambda t: (t != "cpu", t))
    if not ours:
        print("report_real_shapes: no measurements of ours in " + args.results, file=sys.stderr)
        return 1

    bw = host_limits.get("read_bw_gbs")
    l3 = host.get("l3_bytes") or 0
    nrand = sorted({r.get("random_n") for r in ours.values()})
    torch_meta = next(iter(torch.values()), {})
    ort_meta = next(iter(ort.values()), {})

    # ---- per-workload figures ----
    recs = []
    for e in suite:
        name, w = e["name"], e["workload"]
        flops = bytes_ = None
        for t in targets:
            o = ours.get((name, t))
            if o:
                flops, bytes_ = o["flops"], o["bytes"]
        if flops is None:
            continue
        p = peers.get(name, {})
        th = torch.get(name, {}).get("median_s")
        oh = ort.get(name, {}).get("median_s")
        mem = w["op"] in ROW_OPS or (bytes_ and flops / bytes_ < 4.0)
        if w["op"] in ("dense", "batch_matmul"):
            plain, plain_name = p.get("openblas_s"), "OpenBLAS"
        else:
            plain, plain_name = p.get("dnnl_plain_s"), "oneDNN"
        rec = {"name": name, "group": e.get("group", ""), "w": w, "flops": flops,
               "bytes": bytes_, "mem": mem, "dram": bool(l3 and bytes_ > l3),
               "torch_s": th, "ort_s": oh, "plain_s": plain, "plain_name": plain_name,
               "blocked_s": p.get("dnnl_blocked_s"), "dnnl_matmul_s": p.get("dnnl_matmul_s"),
               "peer_impl": p.get("dnnl_blocked_impl") or p.get("dnnl_plain_impl"),
               "openblas_epi": p.get("openblas_epilogue"), "floor_s": p.get("floor_s"),
               "floor_cold_s": p.get("floor_cold_s"),
               "t": {}}
        for t in targets:
            o = ours.get((name, t))
            if not o:
                continue
            d, b = o["default"], o["best"]
            src = o
            held = {}
            if t == "cpu:avx2" and name in avx2_peers:
                q = avx2_peers[name]
                held = {"plain_s": q.get("openblas_s") if w["op"] in ("dense", "batch_matmul")
                        else q.get("dnnl_plain_s"),
                        "blocked_s": q.get("dnnl_blocked_s"),
                        "dnnl_matmul_s": q.get("dnnl_matmul_s"),
                        "peer_impl": q.get("dnnl_blocked_impl") or q.get("dnnl_plain_impl"),
                        "openblas_epi": q.get("openblas_epilogue")}
                # the floors timed in that pass, beside the kernels it re-measured
                held.update({k: q[k] for k in ("floor_s", "floor_cold_s") if q.get(k)})
                if name in avx2_torch:
                    held["torch_s"] = avx2_torch[name].get("median_s")
                if name in avx2_ort:
                    held["ort_s"] = avx2_ort[name].get("median_s")
                again = avx2_ours.get((name, t))
                if again and again["default"].get("median_s"):
                    d, b = again["default"], again["best"]
                    src = again
            rec["t"][t] = {
                "def_s": d.get("median_s"), "def_gf": d.get("gflops"), "def_status": d["status"],
                "def_cold_s": src.get("default_cold_s"), "best_cold_s": src.get("best_cold_s"),
                "def_pre_s": src.get("default_pre_s"), "best_pre_s": src.get("best_pre_s"),
                "paired": src.get("paired_floor"), "paired_cold": src.get("paired_floor_cold"),
                "runner": src.get("runner_floor"), "runner_cold": src.get("runner_floor_cold"),
                "paired_peer": src.get("paired_peer") or {},
                "best_s": b.get("median_s"), "best_gf": b.get("gflops"),
                "best_from": src.get("best_from"), "ok": o.get("random_ok"),
                "failed": o.get("random_failed"), "wall": o.get("wall_s"),
                "compile": o.get("compile_s"), "sched": o.get("best_schedule"),
                "random_n": (o.get("random_n") or 0) + (o.get("variants") or 0),
                "tried": o.get("random_tried", o.get("random_n")),
                "peers": held,
                "again": src is not o,  # times from the held pass (--ours-from)
            }
        recs.append(rec)

    def view(r, t):
        """r with target t's own peers (the AVX2-held ones for cpu:avx2) in place."""
        return {**r, **r["t"].get(t, {}).get("peers", {})}

    def gf(sec, flops):
        return flops / sec / 1e9 if sec and sec > 0 and flops else None

    def floor_ratio(sec, rec):
        if not (rec["mem"] and sec):
            return None
        if rec.get("floor_s"):  # the copy (or read) of the same bytes, timed in this run
            return sec / rec["floor_s"]
        if not (bw and rec["bytes"]):
            return None
        return sec / (rec["bytes"] / (bw * 1e9))

    def cold_ratio(sec, rec):
        """time / floor with both timed cold (DRAM-sized rows, rounds only)."""
        return sec / rec["floor_cold_s"] if sec and rec.get("floor_cold_s") else None

    # ---- summary ----
    L = []
    L.append("# Real-shapes benchmark: tlmd CPU kernels vs PyTorch, ONNX Runtime, OpenBLAS, oneDNN\n")
    isa = ", ".join(host.get("isa", []))
    auto_core = host_limits.get("openblas_autodetected")
    blas_pin = (f" (pinned up by OPENBLAS_CORETYPE: on this CPU, which its version does not know, "
                f"OpenBLAS's autodetection picked its {auto_core} kernels)" if auto_core
                else " (pinned by OPENBLAS_CORETYPE/L2_SIZE!)" if host_limits.get("openblas_pinned")
                else "")
    L.append(f"Host: **{host.get('cpu_model', '?')}**, {host.get('cores', '?')} cores "
             f"({host.get('physical_cores', '?')} physical), ISA {isa}, L3 "
             f"{(l3 or 0) / 2**20:.0f} MiB. OpenBLAS core: **{host_limits.get('openblas_core', '?')}**"
             f"{blas_pin}"
             f", {host_limits.get('openblas_threads', '?')} threads. Measured in this run: FMA peak "
             f"{fmt(host_limits.get('fma_peak_gflops'))} GFLOP/s ({host_limits.get('fma_isa', '?')}, "
             f"all cores; {fmt(host_limits.get('fma_peak1_gflops'))} on one), read bandwidth "
             f"{fmt(bw)} GB/s, copy bandwidth {fmt(host_limits.get('copy_bw_gbs'))} GB/s (best of "
             f"{n_limits} measurements). Memory-bound rows' floor (time/floor columns): the "
             f"copy of the output's bytes (fastest of memcpy, a streaming copy and one "
             f"prefetching its source; a read of the "
             f"input's bytes for reductions) on buffers of the workload's own sizes, timed warm "
             f"beside our kernels (first pass and every round; best median, as for ours), so a "
             f"cached operand is compared with a cached copy. DRAM-sized softmax and norms are "
             f"also timed cold, ours and the floor alike (each call on another copy of its "
             f"buffers, 1 GiB rotated): the 'cold' figures.\n")
    p_all, p_one = host_limits.get("fma_peak_gflops"), host_limits.get("fma_peak1_gflops")
    cores = host.get("physical_cores") or host.get("cores") or 1
    if p_all and p_one and cores > 1 and p_all < 0.75 * cores * p_one:
        L.append(f"**Warning: the machine was busy.** Even the best FMA peak on all {cores} "
                 f"cores was {p_all / p_one:.2f}x the one-core figure (an idle machine gives "
                 f"about {cores}x): other processes held cores, so multi-threaded times are "
                 f"inflated unevenly (each workload's peers run right after our kernels, which "
                 f"limits but does not remove the skew). Rerun on an idle machine.\n")
    L.append(f"Peers: PyTorch eager {torch_meta.get('torch', '–')} ({torch_meta.get('threads', '?')} "
             f"threads; Debian build: matmuls on OpenBLAS, convolutions on oneDNN), ONNX Runtime "
             f"{ort_meta.get('onnxruntime', '–')} (CPU provider, one-op models, weights as "
             f"initializers), OpenBLAS sgemm (dense, batch_matmul as B calls), oneDNN plain "
             f"(our ABI's layouts) and blocked (its own layouts, reorders not timed) for convs, "
             f"oneDNN softmax / layer_norm / pooling.\n")
    held = sum(1 for r in recs if r["t"].get("cpu:avx2", {}).get("peers"))
    again = sum(1 for r in recs if r["t"].get("cpu:avx2", {}).get("again"))
    held_txt = (f"the peers of its {held} rows held to AVX2 in a second pass after the sweep "
                f"(OpenBLAS pinned to its {avx2_core or 'Haswell'} kernels by OPENBLAS_CORETYPE, "
                f"oneDNN by ONEDNN_MAX_CPU_ISA=AVX2, PyTorch also by ATEN_CPU_CAPABILITY=avx2; "
                f"ONNX Runtime has no such cap and stays native)"
                + (f", and {again} of them with our kernels (the sweep's default and chosen "
                   f"schedules) measured again in that pass beside those peers, with its own "
                   f"rounds: their ratios compare one machine state, and their default / best "
                   f"columns are that pass's times" if again else "")
                if held else "the peers run their native kernels")
    L.append(f"Ours: targets {', '.join('`' + t + '`' for t in targets)} (`cpu:avx2` is x86-64-v3 "
             f"code run on this host; {held_txt}). `default` = "
             f"space_default through the pipeline (what the server serves untrained; 7 timing "
             f"samples, 5 with --quick); `best` = the fastest of the default, the variants (the "
             f"rule of thumb along each other vector axis the space offers, and the default with "
             f"packing toggled) and {'/'.join(str(n) for n in nrand)} random schedules "
             f"(space_sample), all through the pipeline in mode given (3 "
             f"samples each; fewer schedules where the sweep's pace cut a pair short: see the "
             f"(n) marks and the cost table). Every figure is a median of a kernel checked "
             f"against the reference"
             + (f"; after each workload's first pass, {n_rounds} head-to-head rounds measured "
                f"our default and best kernels and every peer again, alternately, and each "
                f"figure (ours and the peers' alike) is the best of its {n_rounds + 1} medians, "
                f"so a stall of this shared machine during one measurement does not decide a "
                f"ratio, and the best of N random candidates is not just the luckiest "
                f"measurement (the held-AVX2 peers get their own rounds in their pass)"
                if n_rounds else "") +
             f". Ratios are speedups: peer time / our time (> 1 = ours faster). "
             f"Suite: `bench/suites/real_shapes.json`, {len(recs)} of {len(suite)} workloads "
             f"measured. {builds_line(ours, host)}.\n")

    L.append("## Summary (geomeans over the workloads with both figures)\n")
    L.append("| target | default / PyTorch | best / PyTorch | default / ORT | best / ORT | "
             "best / OpenBLAS (dense, bmm) | best / oneDNN plain (conv, dw) | "
             "best / oneDNN blocked (conv, dw) | mem-bound time/floor, default | best | "
             "DRAM softmax+norms best time/floor | measured | failed defaults |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for t in targets:
        rs = [r for r in recs if t in r["t"]]

        def g(key_ours, key_peer, pred=lambda r: True):
            return geomean([ratio(view(r, t)[key_peer], r["t"][t][key_ours]) for r in rs
                            if pred(r)])

        is_mm = lambda r: r["w"]["op"] in ("dense", "batch_matmul")
        is_conv = lambda r: r["w"]["op"] in ("conv2d", "depthwise_conv2d")
        s = {
            "def_pt": g("def_s", "torch_s"), "best_pt": g("best_s", "torch_s"),
            "def_ort": g("def_s", "ort_s"), "best_ort": g("best_s", "ort_s"),
            "best_blas": g("best_s", "plain_s", is_mm), "best_dnnl": g("best_s", "plain_s", is_conv),
            "best_blk": g("best_s", "blocked_s", is_conv),
            "floor_def": geomean([floor_ratio(r["t"][t]["def_s"], view(r, t)) for r in rs]),
            "floor_best": geomean([floor_ratio(r["t"][t]["best_s"], view(r, t)) for r in rs]),
            "floor_dram": geomean([floor_ratio(r["t"][t]["best_s"], view(r, t)) for r in rs
                                   if r["dram"] and r["w"]["op"] in NORM_OPS]),
            "n": len(rs), "fail": sum(1 for r in rs if r["t"][t]["def_status"] != "ok"),
        }
        summary[t] = s
        L.append(f"| `{t}` | {fmt(s['def_pt'])} | {fmt(s['best_pt'])} | {fmt(s['def_ort'])} | "
                 f"{fmt(s['best_ort'])} | {fmt(s['best_blas'])} | {fmt(s['best_dnnl'])} | "
                 f"{fmt(s['best_blk'])} | {fmt(s['floor_def'])} | {fmt(s['floor_best'])} | "
                 f"{fmt(s['floor_dram'])} | {s['n']} | {s['fail']} |")
    L.append("")

    # kernels with their weights packed once, as a plan runs them
    pre_rows = [r for r in recs if any(o.get("best_pre_s") for o in r["t"].values())]
    if pre_rows:
        L.append("## Convs and dense layers with their weights packed once\n")
        L.append("A model's weights are constant: the runtime packs the ones a kernel packs once, "
                 "after binding (`tlm run`, compiler/runtime), and ONNX Runtime packs its "
                 "initializers at session creation, oneDNN blocked reorders its weights outside "
                 "the timing. The rounds also time our default and best kernels of these rows "
                 "that way (the measure runner's `const_args`: the weights packed once per "
                 "argument copy, outside the timing; the kernel called through its prepacked "
                 "entry, its output checked against the reference). Speedups (peer time / ours; "
                 "'once / per call' = our time per call over our time with the weights packed "
                 "once):\n")
        L.append("| target | rows | best per call / ORT | best, weights once / ORT | "
                 "best, weights once / oneDNN blocked (conv) | once / per call |")
        L.append("|---|---|---|---|---|---|")
        for t in targets:
            rs = [r for r in pre_rows if r["t"].get(t, {}).get("best_pre_s")]
            if not rs:
                continue
            def gm(peer, ours):
                return fmt(geomean([ratio(peer(r), r["t"][t][ours]) for r in rs]))

            L.append(f"| `{t}` | {len(rs)} | {gm(lambda r: view(r, t)['ort_s'], 'best_s')} | "
                     f"{gm(lambda r: view(r, t)['ort_s'], 'best_pre_s')} | "
                     f"{gm(lambda r: view(r, t)['blocked_s'], 'best_pre_s')} | "
                     f"{gm(lambda r: r['t'][t]['best_s'], 'best_pre_s')} |")
        L.append("")
        L.append("| workload | target | best per call ms | best, weights once ms | ORT ms | "
                 "oneDNN blocked ms | once / ORT |")
        L.append("|---|---|---|---|---|---|---|")
        for r in pre_rows:
            for t in targets:
                o = r["t"].get(t, {})
                if not o.get("best_pre_s"):
                    continue
                v = view(r, t)
                ms = lambda s: fmt(s * 1e3 if s else None, 3)
                L.append(f"| {r['name']} | `{t}` | {ms(o['best_s'])} | {ms(o['best_pre_s'])} | "
                         f"{ms(v['ort_s'])} | {ms(v['blocked_s'])} | "
                         f"{fmt(ratio(v['ort_s'], o['best_pre_s']))} |")
        L.append("")

    # by group
    groups = []
    for r in recs:
        if r["group"] not in groups:
            groups.append(r["group"])
    L.append("Speedup vs PyTorch by model family (geomean, default / best):\n")
    L.append("| family | workloads | " + " | ".join(f"`{t}`" for t in targets) + " |")
    L.append("|---|---|" + "---|" * len(targets))
    for gname in groups:
        rs = [r for r in recs if r["group"] == gname]
        cells = []
        for t in targets:
            d = geomean([ratio(view(r, t)["torch_s"], r["t"].get(t, {}).get("def_s")) for r in rs])
            b = geomean([ratio(view(r, t)["torch_s"], r["t"].get(t, {}).get("best_s")) for r in rs])
            cells.append(f"{fmt(d)} / {fmt(b)}")
        L.append(f"| {gname} | {len(rs)} | " + " | ".join(cells) + " |")
    L.append("")

    # issue 10 closing criteria
    L.append("### Issue 10 targets, as measured here\n")
    L.append("| criterion | goal | " + " | ".join(f"`{t}`" for t in targets) + " |")
    L.append("|---|---|" + "---|" * len(targets))

    def crit(label, goal, vals, ok):
        cells = []
        for t in targets:
            v = vals(t)
            cells.append("–" if v is None else f"{fmt(v)} {'✅' if ok(v) else '❌'}")
        L.append(f"| {label} | {goal} | " + " | ".join(cells) + " |")

    crit("default / PyTorch, geomean", "≥ 0.9", lambda t: summary[t]["def_pt"], lambda v: v >= 0.9)
    crit("best / PyTorch, geomean", "≥ 1.2", lambda t: summary[t]["best_pt"], lambda v: v >= 1.2)

    def worst(t, pred, peer_key):
        xs = [ratio(view(r, t)[peer_key], r["t"][t]["best_s"]) for r in recs
              if t in r["t"] and pred(r)]
        xs = [x for x in xs if x]
        return min(xs) if xs else None

    # the rows each peer criterion takes, best medians and paired alike
    def is_dense(r):
        return r["w"]["op"] == "dense"

    def is_nchw_3x3(r):
        return (r["w"]["op"] == "conv2d" and r["w"]["shape"]["KH"] == 3
                and r["w"].get("layout", "NCHW") == "NCHW")

    def is_depthwise(r):
        return r["w"]["op"] == "depthwise_conv2d"

    crit("dense best / OpenBLAS, worst workload", "≥ 0.9",
         lambda t: worst(t, is_dense, "plain_s"), lambda v: v >= 0.9)
    crit("NCHW 3x3 conv best / oneDNN blocked, worst", "≥ 0.8",
         lambda t: worst(t, is_nchw_3x3, "blocked_s"), lambda v: v >= 0.8)
    crit("depthwise best / oneDNN blocked, worst", "≥ 0.8",
         lambda t: worst(t, is_depthwise, "blocked_s"), lambda v: v >= 0.8)

    def worst_paired(t, pred, peer_key):
        xs = [r["t"][t]["paired_peer"].get(peer_key) for r in recs if t in r["t"] and pred(r)]
        xs = [x for x in xs if x]
        return min(xs) if xs else None

    crit("... the three paired by round (median over the rounds of the peer's time / ours in "
         "that round): dense / OpenBLAS, worst", "≥ 0.9",
         lambda t: worst_paired(t, is_dense, "openblas_s"), lambda v: v >= 0.9)
    crit("... paired by round: NCHW 3x3 conv / oneDNN blocked, worst", "≥ 0.8",
         lambda t: worst_paired(t, is_nchw_3x3, "dnnl_blocked_s"), lambda v: v >= 0.8)
    crit("... paired by round: depthwise / oneDNN blocked, worst", "≥ 0.8",
         lambda t: worst_paired(t, is_depthwise, "dnnl_blocked_s"), lambda v: v >= 0.8)

    def worst_floor(t, cold=False):
        xs = [cold_ratio(r["t"][t]["best_cold_s"], view(r, t)) if cold
              else floor_ratio(r["t"][t]["best_s"], view(r, t))
              for r in recs if t in r["t"] and r["dram"] and r["w"]["op"] in NORM_OPS]
        xs = [x for x in xs if x]
        return max(xs) if xs else None

    crit("DRAM-sized softmax/norms best time / floor, worst (warm: floor timed beside ours)",
         "≤ 1.3", worst_floor, lambda v: v <= 1.3)
    crit("DRAM-sized softmax/norms best time / floor, worst (cold: both from DRAM)", "≤ 1.3",
         lambda t: worst_floor(t, True), lambda v: v <= 1.3)

    def worst_dram(t, key):
        """The worst DRAM-sized softmax/norm row's figure `key` (paired ratios)."""
        xs = [r["t"][t][key] for r in recs
              if t in r["t"] and r["dram"] and r["w"]["op"] in NORM_OPS]
        xs = [x for x in xs if x]
        return max(xs) if xs else None

    crit("... the same paired by round (median over the rounds of ours / the floor timed beside "
         "it), warm", "≤ 1.3", lambda t: worst_dram(t, "paired"), lambda v: v <= 1.3)
    crit("... paired by round, cold", "≤ 1.3", lambda t: worst_dram(t, "paired_cold"),
         lambda v: v <= 1.3)
    crit("... paired sample by sample in the measure runner (kernel and floor alternated on "
         "the same buffers), warm", "≤ 1.3", lambda t: worst_dram(t, "runner"),
         lambda v: v <= 1.3)
    crit("... paired sample by sample in the runner, cold", "≤ 1.3",
         lambda t: worst_dram(t, "runner_cold"), lambda v: v <= 1.3)
    L.append("")

    # ---- per-target tables ----
    for t in targets:
        L.append(f"## `{t}`\n")
        L.append("GFLOP/s (medians); `best` marks `d` when the default was the best and (n) when "
                 "the sweep's pace let only n of the N random schedules run. Peers: PT = "
                 "PyTorch eager, ORT = ONNX Runtime, plain = OpenBLAS sgemm for dense/bmm "
                 "(¹ GEMM alone: the epilogue not timed on that side) or oneDNN with our layouts, "
                 "blk = oneDNN blocked. Ratios = speedup of ours (best unless marked).\n")
        L.append("| workload | shape | GFLOP | default | best | PT | ORT | plain | blk | "
                 "def/PT | best/PT | best/ORT | best/plain | best/blk | best ms | "
                 "time/floor def, best |")
        L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in recs:
            if t not in r["t"]:
                continue
            r = view(r, t)
            o = r["t"][t]
            fl = r["flops"]
            d_gf = o["def_gf"] if o["def_s"] and fl else None
            def_txt = fmt(d_gf) if o["def_status"] == "ok" else o["def_status"]
            best_txt = fmt(o["best_gf"] if fl else None) + (" d" if o["best_from"] == "default" else "")
            if o["tried"] is not None and o["random_n"] and o["tried"] < o["random_n"]:
                best_txt += f" ({o['tried']})"
            plain_txt = fmt(gf(r["plain_s"], fl))
            if r["plain_s"] and r["plain_name"] == "OpenBLAS" and r["openblas_epi"] is False:
                plain_txt += "¹"
            floor_txt = "–"
            if r["mem"]:
                floor_txt = (f"{fmt(floor_ratio(o['def_s'], r))}, {fmt(floor_ratio(o['best_s'], r))}"
                             + (" DRAM" if r["dram"] else ""))
                if cold_ratio(o["best_cold_s"], r):
                    floor_txt += (f"; cold {fmt(cold_ratio(o['def_cold_s'], r))}, "
                                  f"{fmt(cold_ratio(o['best_cold_s'], r))}")
                if o.get("paired") or o.get("paired_cold"):
                    floor_txt += (f"; paired {fmt(o.get('paired'))}, "
                                  f"cold {fmt(o.get('paired_cold'))}")
                if o.get("runner") or o.get("runner_cold"):
                    floor_txt += (f"; in the runner {fmt(o.get('runner'))}, "
                                  f"cold {fmt(o.get('runner_cold'))}")
            L.append(
                f"| {r['name']} | {shape_text(r['w'])} | {fmt(fl / 1e9, 3)} | {def_txt} | "
                f"{best_txt} | {fmt(gf(r['torch_s'], fl))} | {fmt(gf(r['ort_s'], fl))} | "
                f"{plain_txt} | {fmt(gf(r['blocked_s'], fl))} | "
                f"{fmt(ratio(r['torch_s'], o['def_s']))} | {fmt(ratio(r['torch_s'], o['best_s']))} | "
                f"{fmt(ratio(r['ort_s'], o['best_s']))} | {fmt(ratio(r['plain_s'], o['best_s']))} | "
                f"{fmt(ratio(r['blocked_s'], o['best_s']))} | "
                f"{fmt(o['best_s'] * 1e3 if o['best_s'] else None, 3)} | {floor_txt} |")
        s = summary[t]
        L.append(f"| **geomean** | | | | | | | | | **{fmt(s['def_pt'])}** | **{fmt(s['best_pt'])}** | "
                 f"**{fmt(s['best_ort'])}** | | | | |")
        L.append("")

    # ---- cost of the run ----
    L.append("## Cost of the sweep\n")
    L.append("| target | workloads | wall s (ours) | compile s | random schedules measured | "
             "candidates failed (wrong, crash, timeout, build) | slowest workload |")
    L.append("|---|---|---|---|---|---|---|")
    for t in targets:
        rs = [r for r in recs if t in r["t"]]
        wall = sum(r["t"][t]["wall"] or 0 for r in rs)
        comp = sum(r["t"][t]["compile"] or 0 for r in rs)
        failed = sum(r["t"][t]["failed"] or 0 for r in rs)
        tried = sum(r["t"][t]["tried"] or 0 for r in rs)
        asked = sum(r["t"][t]["random_n"] or 0 for r in rs)
        slow = max(rs, key=lambda r: r["t"][t]["wall"] or 0) if rs else None
        L.append(f"| `{t}` | {len(rs)} | {wall:.0f} | {comp:.0f} | {tried} of {asked} | {failed} | "
                 f"{slow['name'] if slow else '–'} ({(slow['t'][t]['wall'] or 0) if slow else 0:.0f} s) |")
    if args.wall:
        n_builds = len({o.get("build") for o in ours.values()})
        L.append(f"\nWhole run (bench/real_shapes.sh, ours + peers + report): {args.wall:.0f} s."
                 if n_builds <= 1 else
                 f"\nThe latest run (bench/real_shapes.sh on the workloads measured again): "
                 f"{args.wall:.0f} s; the cost table counts every row's own first pass.")
    L.append("\nBest schedules per workload and target are in `bench/results/real_shapes.jsonl` "
             "(`best_schedule`); plot: `bench/results/real_shapes.png`.\n")

    os.makedirs(os.path.dirname(args.md) or ".", exist_ok=True)
    with open(args.md, "w") as f:
        f.write("\n".join(L))
    print(f"report_real_shapes: {args.md}", file=sys.stderr)

    # ---- plot ----
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker  # noqa: F401
    except ImportError:
        print("report_real_shapes: no matplotlib (bench/setup.sh installs it); no plot",
              file=sys.stderr)
        return 0
    names = [r["name"] for r in recs if r["torch_s"]]
    if not names:
        return 0
    fig, axes = plt.subplots(1, len(targets), figsize=(6.5 * len(targets), 2 + 0.22 * len(names)),
                             sharey=True, sharex=True, squeeze=False)
    allv = []
    for ax, t in zip(axes[0], targets):
        ys = list(range(len(names)))
        by = {r["name"]: r for r in recs}
        d = [ratio(view(by[n], t)["torch_s"], by[n]["t"].get(t, {}).get("def_s")) or 0
             for n in names]
        b = [ratio(view(by[n], t)["torch_s"], by[n]["t"].get(t, {}).get("best_s")) or 0
             for n in names]
        # bars grow from 1x: right = ours faster, left = slower
        bb = [x if x > 0 else 1.0 for x in b]
        dd = [x if x > 0 else 1.0 for x in d]
        ax.barh([y + 0.2 for y in ys], [x - 1 for x in bb], left=1, height=0.4,
                label="best of N", color="#2b7bba")
        ax.barh([y - 0.2 for y in ys], [x - 1 for x in dd], left=1, height=0.4,
                label="default", color="#f0a030")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        allv += [x for x in b + d if x > 0]
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("PyTorch time / our time (log)", fontsize=8)
        ax.set_title(f"{t}: speedup vs PyTorch eager (geomean default "
                     f"{fmt(summary[t]['def_pt'])}, best {fmt(summary[t]['best_pt'])})",
                     fontsize=9)
        ax.set_yticks(ys)
        ax.set_yticklabels(names, fontsize=7)
        ax.grid(axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    axes[0][0].invert_yaxis()  # shared: once, suite order top to bottom
    if allv:
        axes[0][0].set_xlim(min(min(allv) * 0.8, 0.5), max(max(allv) * 1.25, 2.0))
    fig.suptitle(f"tlmd on {host.get('cpu_model', '?')} ({host.get('cores', '?')} cores), "
                 f"real-model shapes", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"report_real_shapes: {args.png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
