#!/usr/bin/python3
"""PyTorch eager timings of the real-shapes suite (bench/suites/real_shapes.json).

Each workload runs as a framework user would write it in eager mode under
torch.inference_mode(): torch.nn.functional.linear (+ bias) then the activation,
torch.matmul on (transposed) views for batch_matmul, F.conv2d (depthwise as groups = C,
channels_last for NHWC), F.softmax / F.layer_norm, RMSNorm as the Hugging Face LLaMA module
writes it, F.max_pool2d / F.avg_pool2d, tensor reductions, .t().contiguous(). The epilogue
follows out of place, op by op (a leading bias_add folds into linear / conv2d).
torch.set_num_threads(cores). Timing mirrors bench/peers.h's peer_time_s: a warm-up of at
least 50 ms, samples of batched calls lasting >= 10 ms, >= 3 and <= 31 samples (odd), the
median per call.

Run it with the Debian python (/usr/bin/python3, python3-torch from bench/setup.sh). The
Debian build of PyTorch runs matmuls on OpenBLAS and convolutions on oneDNN; run it with
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (bench/real_shapes.sh does).

Usage: peers_torch.py [--suite FILE] [--out FILE] [--only NAMES] [--quick] [--fresh] [--serve]
Appends one JSON line per workload to --out (default bench/results/real_shapes.torch.jsonl)
and skips workloads already there unless --fresh. With --serve it answers build/bench/
real_shapes instead, which asks for each workload right after measuring our kernels (how
bench/real_shapes.sh runs it: peers and ours then see the same machine state).

The helpers above main() (suite, options, timing, defaults) are shared with peers_ort.py,
which imports this file without importing torch.
"""
import argparse
import fnmatch
import json
import math
import os
import statistics
import sys
import time

WARMUP_S, BATCH_S, TOTAL_S, MAX_SAMPLES, LIMIT_S = 0.05, 0.01, 0.25, 31, 1.0


def time_call(fn):
    """Seconds per call of fn(): median of batched samples after a warm-up (peer_time_s)."""
    start, t_call, calls = time.perf_counter(), 1e30, 0
    while True:
        a = time.perf_counter()
        fn()
        d = time.perf_counter() - a
        t_call = d if calls == 0 else min(t_call, d)
        calls += 1
        if time.perf_counter() - start >= WARMUP_S:
            break
    t_call = max(t_call, 1e-9)
    batch = max(1, math.ceil(BATCH_S / t_call))
    samples = min(MAX_SAMPLES, max(3, math.ceil(TOTAL_S / (batch * t_call)))) | 1
    ts, begin = [], time.perf_counter()
    while len(ts) < samples:
        a = time.perf_counter()
        for _ in range(batch):
            fn()
        b = time.perf_counter()
        ts.append((b - a) / batch)
        if len(ts) >= 3 and len(ts) % 2 == 1 and b - begin > LIMIT_S:
            break
    return statistics.median(ts)


def normalize(w):
    """The workload with every default of DESIGN.md section 10 spelled out."""
    w = dict(w)
    s = w["shape"]
    w.setdefault("epilogue", [])
    w.setdefault("dtype", "float32")
    w.setdefault("transpose_a", False)
    w.setdefault("transpose_b", False)
    w.setdefault("pad", [0, 0])
    w.setdefault("dilation", [1, 1])
    w.setdefault("groups", 1)
    w.setdefault("layout", "NCHW")
    w.setdefault("eps", 1e-5)
    if w["op"] in ("max_pool2d", "avg_pool2d"):
        w.setdefault("stride", [s["KH"], s["KW"]])
    w.setdefault("stride", [1, 1])
    return w


def conv_out(n, k, s, p, d):
    return (n + 2 * p - (d * (k - 1) + 1)) // s + 1


def out_shape(w):
    """Logical output shape (NCHW order for convs and pools; NHWC handled by the caller)."""
    op, s = w["op"], w["shape"]
    if op == "dense":
        return [s["M"], s["N"]]
    if op == "batch_matmul":
        return [s["B"], s["M"], s["N"]]
    if op in ("conv2d", "depthwise_conv2d", "max_pool2d", "avg_pool2d"):
        oh = conv_out(s["H"], s["KH"], w["stride"][0], w["pad"][0], w["dilation"][0])
        ow = conv_out(s["W"], s["KW"], w["stride"][1], w["pad"][1], w["dilation"][1])
        f = s["F"] if op == "conv2d" else s["C"]
        return [s["N"], f, oh, ow]
    if op == "global_avg_pool2d":
        return [s["N"], s["C"]]
    if op in ("softmax", "layer_norm", "rms_norm"):
        return [s["R"], s["C"]]
    if op.startswith("reduce_"):
        return [s["R"]]
    if op == "elementwise":
        return [s["N"]]
    if op == "transpose":
        return [s["C"], s["R"]]
    raise ValueError("unknown op " + op)


def channel_axis(w):
    """The axis bias_add broadcasts along (ir.h): N of dense/bmm, F/C of convs, else last."""
    op = w["op"]
    if op in ("conv2d", "depthwise_conv2d", "max_pool2d", "avg_pool2d", "global_avg_pool2d"):
        return 1
    return -1


def load_suite(path):
    with open(path) as f:
        return json.load(f)["workloads"]


def parse_args(default_out, doc):
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--suite", default="bench/suites/real_shapes.json")
    ap.add_argument("--out", default=default_out)
    ap.add_argument("--only", default="", help="comma-separated names or shell patterns")
    ap.add_argument("--quick", action="store_true", help="the suite's quick workloads only")
    ap.add_argument("--fresh", action="store_true", help="truncate --out instead of resuming")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--serve", action="store_true",
                    help="answer build/bench/real_shapes on stdin/stdout (see serve())")
    return ap.parse_args()


def selected(args, entries):
    pats = [p for p in args.only.split(",") if p]
    for e in entries:
        if pats:
            if any(fnmatch.fnmatchcase(e["name"], p) for p in pats):
                yield e
        elif not args.quick or e.get("quick"):
            yield e


def done_names(path, kind):
    names = set()
    try:
        with open(path) as f:
            for line in f:
                try:
                    j = json.loads(line)
                except ValueError:
                    continue
                if j.get("kind") == kind and j.get("median_s"):
                    names.add(j["name"])
    except FileNotFoundError:
        pass
    return names


def measure_record(kind, meta, name, workload, measure_one):
    """One JSON record: the peer's median seconds per call of the workload, or its error."""
    w = normalize(workload)
    t0 = time.perf_counter()
    rec = {"kind": kind, "name": name, **meta}
    try:
        sec, detail = measure_one(w)
        rec["median_s"] = sec
        if detail:
            rec["detail"] = detail
    except Exception as ex:  # a peer that cannot run an op is a gap in the table
        rec["median_s"] = None
        rec["error"] = f"{type(ex).__name__}: {ex}"[:300]
    rec["wall_s"] = round(time.perf_counter() - t0, 3)
    rec["time"] = int(time.time())
    ms = f'{rec["median_s"] * 1e3:.3f} ms' if rec["median_s"] else rec.get("error")
    print(f"[{name} {kind}] {ms} ({rec['wall_s']:.1f} s)", file=sys.stderr)
    return rec


def serve(kind, meta, measure_one):
    """--serve: the protocol of build/bench/real_shapes, which measures each workload's peers
    right after our kernels (same moment, same machine state). First line out: {"ready":
    true, meta...}; then per line in, {"name", "workload"}, one record line out. Everything
    else the process prints goes to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints (ours or a library's) must not corrupt the protocol
    sys.stdout = sys.stderr
    out.write(json.dumps({"ready": True, "kind": kind, **meta}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            rec = measure_record(kind, meta, req["name"], req["workload"], measure_one)
        except (ValueError, KeyError) as ex:
            rec = {"kind": kind, "median_s": None, "error": f"bad request: {ex}"}
        out.write(json.dumps(rec) + "\n")
        out.flush()
    return 0


def run_suite(args, kind, meta, measure_one):
    """Measures the selected workloads with measure_one(normalized workload) -> (seconds,
    detail), appending one line each; meta: fields for every line (versions, threads)."""
    if args.serve:
        return serve(kind, meta, measure_one)
    entries = load_suite(args.suite)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    done = set() if args.fresh else done_names(args.out, kind)
    fails = 0
    with open(args.out, "w" if args.fresh else "a") as out:
        for e in selected(args, entries):
            name = e["name"]
            if name in done:
                print(f"[{name} {kind}] done (resume)", file=sys.stderr)
                continue
            rec = measure_record(kind, meta, name, e["workload"], measure_one)
            fails += rec["median_s"] is None
            out.write(json.dumps(rec) + "\n")
            out.flush()
    return fails


# ---- PyTorch ----


def torch_measure_factory(torch):
    F = torch.nn.functional
    gen = torch.Generator().manual_seed(1234)

    def rand(*shape):
        return torch.rand(*shape, generator=gen) * 2 - 1

    def epilogue_fn(w, ep, skip_first_bias):
        """Returns f(y) applying the epilogue out of place, op by op, with its tensors."""
        oshape = out_shape(w)
        if w.get("layout") == "NHWC" and len(oshape) == 4:
            oshape_mem = [oshape[0], oshape[1], oshape[2], oshape[3]]
        else:
            oshape_mem = oshape
        steps = []
        for i, e in enumerate(ep):
            if e == "bias_add":
                if i == 0 and skip_first_bias:
                    continue
                ax = channel_axis(w)
                c = oshape[ax]
                view = [1] * len(oshape)
                view[ax] = c
                b = rand(c).view(*view)
                steps.append(lambda y, b=b: y + b)
            elif e in ("add", "mul"):
                t = rand(*oshape_mem)
                if w.get("layout") == "NHWC" and len(oshape) == 4:
                    t = t.contiguous(memory_format=torch.channels_last)
                steps.append((lambda y, t=t: y + t) if e == "add" else (lambda y, t=t: y * t))
            elif e == "relu":
                steps.append(F.relu)
            elif e == "relu6":
                steps.append(F.relu6)
            elif e == "gelu":
                steps.append(F.gelu)  # exact erf form, as ours
            elif e == "silu":
                steps.append(F.silu)
            elif e == "sigmoid":
                steps.append(torch.sigmoid)
            elif e == "tanh":
                steps.append(torch.tanh)
            else:
                raise ValueError("epilogue " + e)

        def f(y):
            for st in steps:
                y = st(y)
            return y

        return f

    def measure_one(w):
        op, s, ep = w["op"], w["shape"], w["epilogue"]
        lead_bias = bool(ep) and ep[0] == "bias_add"
        cl = w["layout"] == "NHWC"
        detail = None
        if op == "dense":
            M, N, K = s["M"], s["N"], s["K"]
            a = rand(K, M).t() if w["transpose_a"] else rand(M, K)
            if w["transpose_b"]:
                wt = rand(N, K)  # nn.Linear's weight layout: linear(x, W) = x . W^T
            else:
                wt = rand(K, N).t()
            bias = rand(N) if lead_bias else None
            post = epilogue_fn(w, ep, True)
            fn = lambda: post(F.linear(a, wt, bias))
            detail = "F.linear"
        elif op == "batch_matmul":
            B, M, N, K = s["B"], s["M"], s["N"], s["K"]
            a = rand(B, K, M).transpose(1, 2) if w["transpose_a"] else rand(B, M, K)
            b = rand(B, N, K).transpose(1, 2) if w["transpose_b"] else rand(B, K, N)
            post = epilogue_fn(w, ep, False)
            fn = lambda: post(torch.matmul(a, b))
            detail = "torch.matmul"
        elif op in ("conv2d", "depthwise_conv2d"):
            N, C, H, W = s["N"], s["C"], s["H"], s["W"]
            if op == "conv2d":
                Fo, g = s["F"], w["groups"]
            else:
                Fo, g = C, C
            x = rand(N, C, H, W)
            wt = rand(Fo, C // g, s["KH"], s["KW"])
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
                wt = wt.contiguous(memory_format=torch.channels_last)
            bias = rand(Fo) if lead_bias else None
            post = epilogue_fn(w, ep, True)
            st, pd, dl = tuple(w["stride"]), tuple(w["pad"]), tuple(w["dilation"])
            fn = lambda: post(F.conv2d(x, wt, bias, st, pd, dl, g))
            detail = "F.conv2d"
        elif op in ("max_pool2d", "avg_pool2d"):
            x = rand(s["N"], s["C"], s["H"], s["W"])
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            k, st, pd = (s["KH"], s["KW"]), tuple(w["stride"]), tuple(w["pad"])
            post = epilogue_fn(w, ep, False)
            if op == "max_pool2d":
                dl = tuple(w["dilation"])
                fn = lambda: post(F.max_pool2d(x, k, st, pd, dl))
            else:
                fn = lambda: post(F.avg_pool2d(x, k, st, pd, count_include_pad=True))
        elif op == "global_avg_pool2d":
            x = rand(s["N"], s["C"], s["H"], s["W"])
            if cl:
                x = x.contiguous(memory_format=torch.channels_last)
            post = epilogue_fn(w, ep, False)
            fn = lambda: post(F.adaptive_avg_pool2d(x, 1).flatten(1))
        elif op in ("softmax", "layer_norm", "rms_norm") or op.startswith("reduce_"):
            R, C = s["R"], s["C"]
            x = rand(R, C)
            post = epilogue_fn(w, ep, False)
            eps = w["eps"]
            if op == "softmax":
                fn = lambda: post(F.softmax(x, dim=-1))
            elif op == "layer_norm":
                gamma, beta = rand(C), rand(C)
                fn = lambda: post(F.layer_norm(x, (C,), gamma, beta, eps))
            elif op == "rms_norm":
                wgt = rand(C)
                # transformers' LlamaRMSNorm, the eager form in use
                fn = lambda: post(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * wgt)
            elif op == "reduce_sum":
                fn = lambda: post(x.sum(-1))
            elif op == "reduce_mean":
                fn = lambda: post(x.mean(-1))
            else:
                fn = lambda: post(x.amax(-1))
        elif op == "elementwise":
            x = rand(s["N"])
            post = epilogue_fn(w, ep, False)
            fn = lambda: post(x)
        elif op == "transpose":
            x = rand(s["R"], s["C"])
            fn = lambda: x.t().contiguous()
        else:
            raise ValueError("unknown op " + op)
        return time_call(fn), detail

    return measure_one


def main():
    args = parse_args("bench/results/real_shapes.torch.jsonl", __doc__)
    # OpenMP threads bound one per logical CPU, as tlm's runner binds our kernels' (libgomp
    # reads these when torch loads it; a placement the caller set is kept)
    os.environ.setdefault("OMP_PLACES", "threads")
    os.environ.setdefault("OMP_PROC_BIND", "close")
    import torch

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
        "python": sys.executable,
    }
    print(f"peers_torch: torch {meta['torch']}, {meta['threads']} threads, mkldnn "
          f"{meta['mkldnn']}", file=sys.stderr)
    measure = torch_measure_factory(torch)

    def measure_one(w):
        with torch.inference_mode():
            return measure(w)

    return 1 if run_suite(args, "torch", meta, measure_one) else 0


if __name__ == "__main__":
    sys.exit(main())
