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


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    load = os.getloadavg()
    print("# End-to-end model latency (bench/e2e.sh)\n")
    print(f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {cpu_name()}, {os.cpu_count()} "
          f"cores, load average at report time {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}.")
    print("The machine is shared with other engineers building and benchmarking: expect noise "
          "of tens of percent; ratios come from one run, peers measured right after ours.\n")
    print("Ours = tlmd's kernels (target `cpu`, schedule source as listed) run from the "
          "execution plan by `tlm run` (median of the runs after one warm-up). PyTorch = eager "
          "execution of the same network (same fused ops, batch norm folded, same weights); "
          "ORT = that network exported to ONNX (opset 17) on ONNX Runtime's CPU provider, "
          "optimisation level ALL. All use every core. Ratio > 1 = we are slower. Our runs "
          "pack the params each kernel packs (its weights) once, after binding, as ONNX Runtime "
          "does at session creation; 'packing per call' is the same plan with `tlm run "
          "--prepack off`, each launch packing its weights in every call (as the kernels are "
          "measured alone), run right after.\n")
    print("| model | GFLOP | ours ms | PyTorch ms | ORT ms | ours / PyTorch | ours / ORT | "
          "ours packing per call ms | schedules | check vs reference | ours vs PyTorch | "
          "ORT vs PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        opt = "batch" if "batch" in r else "seq_len"
        name = f"{r['model']} ({opt} {r[opt]})"
        o, t, x = r["ours"]["median"], r["torch"]["median_ms"], r["ort"]["median_ms"]
        ck = r["check"]
        cks = f"{ck['status']} ({ck.get('max_rel_err', float('nan')):.1e})"
        pc = r.get("ours_packing_per_call", {}).get("median")
        pcs = f"{pc:.1f}" if pc else "–"
        print(f"| {name} | {r['gflops']:.2f} | {o:.1f} | {t:.1f} | {x:.1f} | {o / t:.2f} | "
              f"{o / x:.2f} | {pcs} | {','.join(r['schedule_source'])} | {cks} | "
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
    if rows:
        r = rows[0]
        print(f"\nPeers: PyTorch {r['torch'].get('version')}, ONNX Runtime "
              f"{r['ort'].get('version')}, {r['torch'].get('threads')} threads.")


if __name__ == "__main__":
    main()
