#!/usr/bin/python3
"""Markdown report of bench/e2e.sh's JSON lines (one per model): latency of our kernels run by
`tlm run`, PyTorch eager and ONNX Runtime, their ratios, compile times and the checks.
Usage: report_e2e.py results.jsonl > e2e.md"""
import datetime
import json
import os
import platform
import sys


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def default_cols(r, o):
    d = (r.get("ours_default") or {}).get("median")
    return f"{d:.1f} | {d / o:.2f} | " if d else "– | – | "


def per_launch(rows):
    """The launches whose time the tuned kernels changed most against the default plan."""
    for r in rows:
        a, b = r.get("ours_launches"), r.get("ours_default_launches")
        if not a or not b or len(a) != len(b):
            continue
        ch = [(la["node"], lb["median_ms"], la["median_ms"]) for la, lb in zip(a, b)]
        tot_t, tot_d = sum(c[2] for c in ch), sum(c[1] for c in ch)
        print(f"\n## {r['model']}: launches, tuned vs default\n")
        print(f"Sum of launch medians: tuned {tot_t:.2f} ms, default {tot_d:.2f} ms. The ten "
              "largest changes (ms saved, negative: the tuned kernel is slower in the plan):\n")
        print("| launch | default ms | tuned ms | speedup |")
        print("|---|---|---|---|")
        for n, d, t in sorted(ch, key=lambda c: -abs(c[1] - c[2]))[:10]:
            print(f"| {n} | {d:.3f} | {t:.3f} | {d / t:.2f} |")


# ONNX Runtime nodes that move or re-view data rather than compute a launch of ours
ORT_LAYOUT_OPS = {"Reshape", "Reorder", "ReorderInput", "ReorderOutput", "Flatten", "Identity",
                  "Squeeze", "Unsqueeze", "Transpose"}
# elementwise nodes ORT runs apart from the MatMul or Conv before them, where our launch runs
# them as its epilogue: counted with that node when they follow it at its output's shape
ORT_ELEMENTWISE_OPS = {"Add", "Sub", "Mul", "Div", "Relu", "Gelu", "FastGelu", "BiasGelu",
                       "QuickGelu", "Sigmoid", "Tanh", "Clip", "Erf", "Sum", "HardSigmoid"}


def ort_units(nodes):
    """ORT's compute nodes in run order, each with the elementwise nodes that follow it at its
    output's shape folded in (op names joined by +)."""
    units = []
    for n in nodes:
        if n["op"] in ORT_LAYOUT_OPS:
            continue
        if units and n["op"] in ORT_ELEMENTWISE_OPS and units[-1]["shape"] == n["shape"]:
            units[-1]["ms"] += n["ms"]
            units[-1]["op"] += "+" + n["op"]
        else:
            units.append(dict(n))
    return units


def vs_ort_layers(rows):
    """Per model, our launches beside ONNX Runtime's nodes (its profiled run, after the timed
    ones): a launch is paired with the node of ORT's that is the same occurrence of the same
    output shape in run order (ORT fuses a conv with its bias, add and activation as our
    epilogues do, and the elementwise nodes it runs apart are folded into the node before
    them: ort_units; it may run a block's downsample before the block's first conv, which the
    shape keeps apart). The launches with the largest gap in ms."""
    for r in rows:
        ours, nodes = r.get("ours_launches"), (r.get("ort") or {}).get("nodes")
        if not ours or not nodes or "shape" not in ours[0]:
            continue
        queue = {}
        for n in ort_units(nodes):
            queue.setdefault(json.dumps(n["shape"]), []).append(n)
        pairs, lost = [], 0.0
        for L in ours:
            q = queue.get(json.dumps(L["shape"]))
            n = q.pop(0) if q else None
            if n:
                pairs.append((L["node"], L["median_ms"], n["op"], n["ms"], L["shape"]))
            else:
                lost += L["median_ms"]
        left = sum(n["ms"] for q in queue.values() for n in q)
        layout = sum(n["ms"] for n in nodes if n["op"] in ORT_LAYOUT_OPS)
        opt = "batch" if "batch" in r else "seq_len"
        tot_o, tot_x = sum(p[1] for p in pairs), sum(p[3] for p in pairs)
        print(f"\n## {r['model']} ({opt} {r.get(opt)}): launches beside ONNX Runtime's nodes\n")
        print(f"{len(pairs)} of {len(ours)} launches paired: ours {tot_o:.2f} ms, ORT's nodes "
              f"{tot_x:.2f} ms (profiled: a node's time is its kernel's, without the session's "
              f"overhead); unpaired: ours {lost:.2f} ms, ORT's compute {left:.2f} ms, its "
              f"reshapes and reorders {layout:.2f} ms. The ten largest gaps (ms we lose; "
              "negative: ours is faster):\n")
        print("| launch | output | ours ms | ORT node(s) | ORT ms | ours / ORT |")
        print("|---|---|---|---|---|---|")
        for name, o, op, x, shape in sorted(pairs, key=lambda p: -(p[1] - p[3]))[:10]:
            dims = " x ".join(str(v) for v in shape)
            print(f"| {name} | {dims} | {o:.3f} | {op} | {x:.3f} | {o / x:.2f} |")


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    tuned = any(r.get("ours_default") for r in rows)
    load = os.getloadavg()
    print("# End-to-end model latency (bench/e2e.sh%s)\n" % (", E2E_MODE=tune" if tuned else ""))
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {cpu_name()}, {os.cpu_count()} "
          f"cores, load average at report time {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.")
    print("The machine is shared with other engineers building and benchmarking: expect noise "
          "of tens of percent; ratios come from one run, peers measured right after ours.\n")
    print("Ours = tlmd's kernels (target `cpu`, schedule source as listed) run from the "
          "execution plan by `tlm run` (median of the runs after one warm-up; its OpenMP threads "
          "bound, OMP_PLACES=threads OMP_PROC_BIND=close, as the README advises). PyTorch = eager "
          "execution of the same network (same fused ops, batch norm folded, same weights); "
          "ORT = that network exported to ONNX (opset 17) on ONNX Runtime's CPU provider, "
          "optimisation level ALL. All use every core. Ratio > 1 = we are slower. Our runs "
          "pack the params each kernel packs (its weights) once, after binding, as ONNX Runtime "
          "does at session creation; 'packing per call' is the same plan with `tlm run "
          "--prepack off`, each launch packing its weights in every call (as the kernels are "
          "measured alone), run right after.\n")
    if tuned:
        print("Tuned: our kernels are what `tlmc compile --mode tune` chose (the measured search "
              "over the model's kernels, its trial budget spread by the task scheduler, each "
              "kernel timed with its weights packed once as the plan runs it); 'default "
              "schedules' is the same network compiled with the rule-of-thumb schedules "
              "(`tlm compile --model`); the two plans ran alternately, three rounds, and each "
              "figure (ours and default) is its fastest round's median; 'compile cold' is "
              "the tuning wall time.\n")
    print("| model | GFLOP | ours ms | PyTorch ms | ORT ms | ours / PyTorch | ours / ORT | "
          "ours packing per call ms | " + ("default schedules ms | tuned speedup | " if tuned
                                            else "") +
          "schedules | check vs reference | ours vs PyTorch | ORT vs PyTorch |")
    print("|---|---|---|---|---|---|---|---|" + ("---|---|" if tuned else "") + "---|---|---|---|")
    for r in rows:
        opt = "batch" if "batch" in r else "seq_len"
        name = f"{r['model']} ({opt} {r[opt]})"
        o, t, x = r["ours"]["median"], r["torch"]["median_ms"], r["ort"]["median_ms"]
        ck = r["check"]
        cks = f"{ck['status']} ({ck.get('max_rel_err', float('nan')):.1e})"
        pc = r.get("ours_packing_per_call", {}).get("median")
        pcs = f"{pc:.1f}" if pc else "–"
        print(f"| {name} | {r['gflops']:.2f} | {o:.1f} | {t:.1f} | {x:.1f} | {o / t:.2f} | "
              f"{o / x:.2f} | {pcs} | {default_cols(r, o) if tuned else ''}"
              f"{','.join(r['schedule_source'])} | {cks} | "
              f"{r['rel_err_ours_vs_torch']:.1e} | {r['ort']['rel_err_vs_torch']:.1e} |")
    print("\nErrors are max |a - b| / max |b| over the outputs; the reference is the double "
          "precision interpreter run over the same plan (`tlm run --check on`).\n")
    print("## Compile time and memory\n")
    print("| model | unique kernels | launches | compile cold s | compile warm s | arena MiB "
          "(with reuse) | without reuse MiB | prepacked weights MiB | slowest launches (ms) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        opt = "batch" if "batch" in r else "seq_len"
        top = ", ".join(f"{l['node']} {l['median_ms']:.0f}" for l in r["top_launches"])
        print(f"| {r['model']} ({opt} {r[opt]}) | {r['subgraphs']} | {r['launches']} | "
              f"{r['compile_cold_s']:.1f} | {r['compile_warm_s']:.2f} | {r['arena_mb']:.1f} | "
              f"{r['unshared_mb']:.1f} | {r.get('prepacked_mb', 0):.0f} | {top} |")
    print("\nCold: a fresh tlmd store (every kernel compiled, two compilers at a time); warm: the "
          "same request again (every kernel a cache hit, binaries fetched). The arena holds "
          "params, inputs and outputs for the whole run and shares the bytes of intermediates "
          "whose lives do not overlap; the prepacked weights are kept beside it (the params "
          "stay in the arena, for rebinding and the reference check).")
    if tuned:
        per_launch(rows)
    vs_ort_layers(rows)
    if rows:
        r = rows[0]
        print(f"\nPeers: PyTorch {r['torch'].get('version')}, ONNX Runtime "
              f"{r['ort'].get('version')}, {r['torch'].get('threads')} threads.")


if __name__ == "__main__":
    main()
