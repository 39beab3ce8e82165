#!/usr/bin/env python3
"""bench/results/eval.{jsonl,torch.jsonl} -> bench/results/eval.md and eval.png.

The TLM's evaluation table (issue 12): per workload of the validation slice, the default,
the model's one pass (tlm), its top-8 measured (topk) and the measured search (search@N),
with PyTorch eager from the same run; geomean ratios per target. Ratios are speedups
(time of the other / time of ours-as-named; > 1 = the named one is faster)."""
import json
import math
import os
import platform
import subprocess

R = "bench/results"


def lines(path):
    out = []
    if os.path.exists(path):
        for l in open(path):
            l = l.strip()
            if l:
                try:
                    out.append(json.loads(l))
                except ValueError:
                    pass
    return out


def geo(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def f(x, d=2):
    return "–" if x is None else f"{x:.{d}f}"


def main():
    ours = lines(f"{R}/eval.jsonl")
    torch = {r["name"]: r["median_s"] for r in lines(f"{R}/eval.torch.jsonl") if r.get("median_s")}
    model = {}
    if os.path.exists(f"{R}/eval.model.json"):
        try:
            model = json.load(open(f"{R}/eval.model.json"))
        except ValueError:
            pass
    cpu = platform.processor() or platform.machine()
    try:
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
    except (OSError, IndexError):
        pass
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        rev = "?"
    md = ["# TLM evaluation: one pass vs default vs search vs PyTorch eager", ""]
    md.append(f"Host: **{cpu}**, {os.cpu_count()} cores. Build {rev}. Weights: `{model.get('path', '?')}` "
              f"(sha256 {model.get('sha256', '?')[:16]}…, trained: {model.get('trained')}, "
              f"{model.get('params', '?')} parameters, {model.get('layers')}x{model.get('dim')}).")
    md.append("")
    md.append("Workloads: a validation slice of `bench/suites/real_shapes.json` (models outside the training zoo, "
              "excluded from the data by `tlm datagen --exclude`). `default` = the rule of thumb; `tlm` = the "
              "model's greedy one pass, zero measurements; `topk` = its beam of 8, each measured, fastest kept; "
              "`search` = the evolutionary search with a cost model (N trials, includes the default); PyTorch "
              "eager measured right after, same machine. default/tlm/topk are measured in one job with the same "
              "inputs; every kernel checked against the reference. Ratios are speedups of the named schedule.")
    md.append("")
    targets = sorted({r["target"] for r in ours})
    md.append("## Summary (geomeans)")
    md.append("")
    md.append("| target | workloads | tlm valid | tlm deterministic | tlm = default | tlm vs default | topk vs default | "
              "tlm vs search | topk vs search | search vs default | tlm vs PyTorch | default vs PyTorch |")
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for t in targets:
        rs = [r for r in ours if r["target"] == t]
        n = len(rs)
        valid = sum(1 for r in rs if r.get("tlm_ms")) / n if n else None
        det = sum(1 for r in rs if r.get("tlm_deterministic")) / n if n else None
        same = sum(1 for r in rs if r.get("tlm_same_as_default")) / n if n else None
        def ratio(a, b):
            return geo([r[a] / r[b] for r in rs if r.get(a) and r.get(b)])
        tvp = geo([torch[r["name"]] * 1e3 / r["tlm_ms"] for r in rs if r.get("tlm_ms") and r["name"] in torch])
        dvp = geo([torch[r["name"]] * 1e3 / r["default_ms"] for r in rs if r.get("default_ms") and r["name"] in torch])
        md.append(f"| `{t}` | {n} | {f(valid)} | {f(det)} | {f(same)} | {f(ratio('default_ms', 'tlm_ms'))} | "
                  f"{f(ratio('default_ms', 'topk_ms'))} | {f(ratio('search_ms', 'tlm_ms'))} | "
                  f"{f(ratio('search_ms', 'topk_ms'))} | {f(ratio('default_ms', 'search_ms'))} | {f(tvp)} | {f(dvp)} |")
    # tlm@X (tlm eval --schedules ...,tlm@X): the one pass under a prior of X logits on the
    # default schedule's tokens, measured in the same job as the default
    priors = sorted({k[4:-3] for r in ours for k in r if k.startswith("tlm@") and k.endswith("_ms")},
                    key=float)
    if priors:
        md += ["", "The one pass under a prior on the default schedule (`tlm@X`: X logits on the "
               "default's tokens; speedup over the default, geomean, and the share of workloads where "
               "it wrote the default):", "",
               "| target | " + " | ".join(f"tlm@{x}" for x in priors) + " |",
               "|---|" + "---|" * len(priors)]
        for t in targets:
            rs = [r for r in ours if r["target"] == t]
            cells = []
            for x in priors:
                v = geo([r["default_ms"] / r[f"tlm@{x}_ms"] for r in rs
                         if r.get("default_ms") and r.get(f"tlm@{x}_ms")])
                same = [r.get(f"tlm@{x}_same_as_default") for r in rs if f"tlm@{x}_ms" in r]
                share = sum(1 for q in same if q) / len(same) if same else None
                cells.append(f"{f(v)} ({f(share * 100 if share is not None else None, 0)} %)")
            md.append(f"| `{t}` | " + " | ".join(cells) + " |")
    for t in targets:
        md += ["", f"## `{t}`", "",
               "| workload | op | GFLOP | default ms | tlm ms | topk ms | search ms (trials) | PyTorch ms | "
               "tlm vs default | topk vs search | tlm schedule |",
               "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in [r for r in ours if r["target"] == t]:
            pt = torch.get(r["name"])
            d, tl = r.get("default_ms"), r.get("tlm_ms")
            tk, se = r.get("topk_ms"), r.get("search_ms")
            md.append(f"| {r['name']} | {r['op']} | {r['gflop']:.3f} | {f(d, 3)} | {f(tl, 3)}"
                      f"{' =d' if r.get('tlm_same_as_default') else ''} | {f(tk, 3)} | {f(se, 3)} "
                      f"({r.get('search_trials', '–')}) | {f(pt * 1e3 if pt else None, 3)} | "
                      f"{f(d / tl if d and tl else None)} | {f(se / tk if se and tk else None)} | "
                      f"`{r.get('tlm_schedule', r.get('tlm_status', ''))}` |")
    open(f"{R}/eval.md", "w").write("\n".join(md) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        rs = [r for r in ours if r["target"] == (targets[0] if targets else "cpu")]
        names = [r["name"] for r in rs]
        fig, ax = plt.subplots(figsize=(12, 5))
        xs = range(len(rs))
        w = 0.27
        for k, (key, lab) in enumerate([("tlm_ms", "tlm one pass"), ("topk_ms", "tlm top-8"), ("search_ms", "search")]):
            ax.bar([x + (k - 1) * w for x in xs],
                   [(r["default_ms"] / r[key]) if r.get(key) and r.get("default_ms") else 0 for r in rs], w, label=lab)
        ax.axhline(1, color="k", lw=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("speedup over the default schedule")
        ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{R}/eval.png", dpi=110)
    except ImportError:
        pass
    print(f"wrote {R}/eval.md")


if __name__ == "__main__":
    main()
