#!/usr/bin/env python3
"""TVM MetaSchedule peer: tunes one workload of the real-shapes suite and times the result.

Run it with the bench-only virtualenv of bench/setup_tvm.sh (apache-tvm 0.26.0 with
apache-tvm-ffi 0.1.13.post2; see that script for the combinations that fail):

    bench/.venv-tvm/bin/python bench/peers_tvm.py --name vit_b16_fc1_gelu --trials 64
    bench/.venv-tvm/bin/python bench/peers_tvm.py --workload '{"op": "dense", ...}' --trials 64

The workload is a DESIGN.md section 10 workload (the suite's "workload" objects): dense and
batch_matmul (transpose_a / transpose_b), conv2d NCHW/OIHW (stride, pad, dilation, groups),
depthwise_conv2d (weight [C, 1, KH, KW]), softmax / layer_norm (gamma, beta) / rms_norm
(weight) over the last axis, with the epilogue (bias_add along N or the channel, add / mul of
a tensor of the output's shape, relu, relu6, gelu in the exact erf form, silu, sigmoid, tanh)
fused into the same TE compute, so MetaSchedule sees the whole kernel as one PrimFunc (it
inlines the elementwise stages itself). Weights are plain inputs in their stated layout (no
"layout_free_buffers": MetaSchedule may not pre-transform them, as our kernels may not).

Targets: "cpu" = llvm -mcpu=<this host's CPU as LLVM names it>, "cpu:avx2" = llvm
-mcpu=haswell with +avx2,+fma and -avx512f (no AVX-512). Both with num-cores = --threads.

Tuning: tune_tir with MetaSchedule's search as shipped (evolutionary search, 512 initial
population, 4 genetic iterations, XGBoost cost model retrained each round) and these
changes, all for this loaded 2-core machine:
  - the builder uses one worker and a build function that skips
    `import tvm.s_tir.tensor_intrin` (~60 s here, more than the builder's 30 s timeout: with
    the default LocalBuilder every build "times out" and tuning finds nothing);
  - rounds of --per-iter 32 candidates (MetaSchedule's default is 64) and the runner's
    EvaluatorConfig number=1 repeat=1 min_repeat_ms=50 (default 3/1/100): a 64-trial round
    of a ~1 GFLOP dense with the defaults took more than 6 minutes to measure under load;
  - --seconds (default 420): a measure callback ends the task after the first round that ends
    past it (the records of finished rounds stay in the database; "stopped_by_seconds").
The tuning database (JSONDatabase) lives in --work-dir (default
bench/.tvm-work/<name>-<target>-<trials>, wiped at start unless --resume: then
--trials more are tuned on top of the records there, with a fresh cost model).

Output: one JSON object on stdout (and appended to --out when given): name, target, trials
(asked), trials_measured, trials_failed, tuning_s (wall of tune_tir), kernel_ms (median of 10
repeats of time_evaluator, each repeat >= 0.1 s), best_so_far ([[trial, ms], ...]: each
record of the database in commit (= trial) order, running minimum of its mean run time),
rel_err (max |tvm - numpy float64| / max |numpy|), tvm_version, threads, host_cpu.
Everything TVM prints goes to stderr.
"""
import argparse
import json
import math
import os
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=os.path.join(HERE, "suites", "real_shapes.json"))
    ap.add_argument("--name", help="a workload of --suite")
    ap.add_argument("--workload", help="a workload as JSON (instead of --name)")
    ap.add_argument("--target", default="cpu", choices=["cpu", "cpu:avx2"])
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--per-iter", type=int, default=32, help="num_trials_per_iter")
    ap.add_argument("--seconds", type=float, default=420,
                    help="stop after the first round that ends past this many seconds")
    ap.add_argument("--number", type=int, default=1, help="runner: runs per repeat")
    ap.add_argument("--min-repeat-ms", type=int, default=50, help="runner: min ms per repeat")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work-dir")
    ap.add_argument("--resume", action="store_true", help="keep the work dir's database")
    ap.add_argument("--out", help="append the JSON line to this file")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-check", action="store_true", help="skip the numpy check")
    ap.add_argument("--recover", action="store_true",
                    help="with --measure-only: the full record of a run that died after tuning "
                    "(tuning_s from the log's first and last timestamps), appended to --out")
    ap.add_argument("--measure-only", action="store_true",
                    help="no tuning: build the best schedule of --work-dir's database, time it")
    return ap.parse_args()


# ---- workload → TE ----

def normalize(w):
    """DESIGN.md section 10 defaults spelled out (as peers_torch.normalize)."""
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


def build_te(w):
    """Returns (list of te tensors: inputs then output, list of numpy-input specs, reference fn).

    specs: (name, shape) of each input in order; ref(inputs as float64 arrays) -> output."""
    import numpy as np
    from tvm import te

    op, s, dt = w["op"], w["shape"], w["dtype"]
    if dt != "float32":
        raise ValueError("only float32")
    if w["layout"] != "NCHW":
        raise ValueError("only layout NCHW")
    ins, specs = [], []

    def inp(name, shape):
        t = te.placeholder(tuple(shape), dtype=dt, name=name)
        ins.append(t)
        specs.append((name, tuple(shape)))
        return t

    if op == "dense" or op == "batch_matmul":
        bm = op == "batch_matmul"
        M, N, K = s["M"], s["N"], s["K"]
        lead = [s["B"]] if bm else []
        ta, tb = w["transpose_a"], w["transpose_b"]
        A = inp("A", lead + ([K, M] if ta else [M, K]))
        B = inp("B", lead + ([N, K] if tb else [K, N]))
        k = te.reduce_axis((0, K), name="k")

        def a_at(b, i, kk):
            idx = (kk, i) if ta else (i, kk)
            return A[(b,) + idx] if bm else A[idx]

        def b_at(b, kk, j):
            idx = (j, kk) if tb else (kk, j)
            return B[(b,) + idx] if bm else B[idx]

        if bm:
            Y = te.compute((s["B"], M, N), lambda b, i, j: te.sum(a_at(b, i, k) * b_at(b, k, j),
                                                                  axis=k), name="Y")
        else:
            Y = te.compute((M, N), lambda i, j: te.sum(a_at(None, i, k) * b_at(None, k, j),
                                                       axis=k), name="Y")

        def ref(x):
            a = np.swapaxes(x[0], -1, -2) if ta else x[0]
            b = np.swapaxes(x[1], -1, -2) if tb else x[1]
            return np.matmul(a, b)
        chan_axis = -1
    elif op in ("conv2d", "depthwise_conv2d"):
        N, C, H, W, KH, KW = s["N"], s["C"], s["H"], s["W"], s["KH"], s["KW"]
        if op == "conv2d":
            F, g = s["F"], w["groups"]
        else:
            F, g = C, C
        (sh, sw), (ph, pw), (dh, dw) = w["stride"], w["pad"], w["dilation"]
        OH, OW = conv_out(H, KH, sh, ph, dh), conv_out(W, KW, sw, pw, dw)
        cg, fg = C // g, F // g
        X = inp("X", [N, C, H, W])
        Wt = inp("W", [F, cg, KH, KW])
        if ph or pw:
            Xp = te.compute(
                (N, C, H + 2 * ph, W + 2 * pw),
                lambda n, c, y, x: te.if_then_else(
                    te.all(y >= ph, y < H + ph, x >= pw, x < W + pw),
                    X[n, c, y - ph, x - pw], te.const(0.0, dt)), name="Xpad")
        else:
            Xp = X
        rc = te.reduce_axis((0, cg), name="rc")
        ry = te.reduce_axis((0, KH), name="ry")
        rx = te.reduce_axis((0, KW), name="rx")
        if g == 1:
            cin = lambda f: rc  # noqa: E731
        else:
            cin = lambda f: f // fg * cg + rc  # noqa: E731
        Y = te.compute(
            (N, F, OH, OW),
            lambda n, f, y, x: te.sum(
                Xp[n, cin(f), y * sh + ry * dh, x * sw + rx * dw] * Wt[f, rc, ry, rx],
                axis=[rc, ry, rx]), name="Y")

        def ref(xs):
            x, wt = xs[0], xs[1]
            xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
            win = np.lib.stride_tricks.sliding_window_view(
                xp, ((KH - 1) * dh + 1, (KW - 1) * dw + 1), axis=(2, 3))
            win = win[:, :, ::sh, ::sw, ::dh, ::dw][:, :, :OH, :OW]  # N C OH OW KH KW
            out = np.empty((N, F, OH, OW))
            for gi in range(g):
                wg = win[:, gi * cg:(gi + 1) * cg]
                out[:, gi * fg:(gi + 1) * fg] = np.einsum(
                    "ncyxij,fcij->nfyx", wg, wt[gi * fg:(gi + 1) * fg], optimize=True)
            return out
        chan_axis = 1
    elif op in ("softmax", "layer_norm", "rms_norm"):
        R, C = s["R"], s["C"]
        X = inp("X", [R, C])
        eps = w["eps"]
        k = te.reduce_axis((0, C), name="k")
        if op == "softmax":
            mx = te.compute((R,), lambda i: te.max(X[i, k], axis=k), name="rowmax")
            k2 = te.reduce_axis((0, C), name="k2")
            ex = te.compute((R, C), lambda i, j: te.exp(X[i, j] - mx[i]), name="exp")
            sm = te.compute((R,), lambda i: te.sum(ex[i, k2], axis=k2), name="rowsum")
            Y = te.compute((R, C), lambda i, j: ex[i, j] / sm[i], name="Y")

            def ref(xs):
                e = np.exp(xs[0] - xs[0].max(-1, keepdims=True))
                return e / e.sum(-1, keepdims=True)
        elif op == "layer_norm":
            G, Bt = inp("gamma", [C]), inp("beta", [C])
            inv_c = te.const(1.0 / C, dt)
            tot = te.compute((R,), lambda i: te.sum(X[i, k], axis=k), name="rowsum")
            k2 = te.reduce_axis((0, C), name="k2")
            sq = te.compute((R,), lambda i: te.sum((X[i, k2] - tot[i] * inv_c)
                                                   * (X[i, k2] - tot[i] * inv_c), axis=k2),
                            name="rowsq")
            Y = te.compute((R, C), lambda i, j: (X[i, j] - tot[i] * inv_c)
                           * te.rsqrt(sq[i] * inv_c + te.const(eps, dt)) * G[j] + Bt[j],
                           name="Y")

            def ref(xs):
                x, ga, be = xs[:3]
                m = x.mean(-1, keepdims=True)
                v = ((x - m) ** 2).mean(-1, keepdims=True)
                return (x - m) / np.sqrt(v + eps) * ga + be
        else:
            G = inp("weight", [C])
            inv_c = te.const(1.0 / C, dt)
            sq = te.compute((R,), lambda i: te.sum(X[i, k] * X[i, k], axis=k), name="rowsq")
            Y = te.compute((R, C), lambda i, j: X[i, j] * te.rsqrt(sq[i] * inv_c
                                                                   + te.const(eps, dt)) * G[j],
                           name="Y")

            def ref(xs):
                x, ga = xs[:2]
                return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * ga
        chan_axis = -1
    else:
        raise ValueError("op %s not supported by the TVM peer" % op)

    # Epilogue, op by op, as separate elementwise stages (MetaSchedule inlines them).
    oshape = [int(d) for d in Y.shape]
    steps = []
    erf_v = None
    for i, e in enumerate(w["epilogue"]):
        prev = Y
        if e == "bias_add":
            ax = chan_axis % len(oshape)
            bias = inp("bias%d" % i, [oshape[ax]])
            Y = te.compute(oshape, _bias_fn(prev, bias, ax), name="bias_add%d" % i)
            steps.append(("bias", len(specs) - 1, ax))
        elif e in ("add", "mul"):
            t = inp("%s%d" % (e, i), oshape)
            Y = te.compute(oshape, _binary_fn(prev, t, e == "add"), name="%s%d" % (e, i))
            steps.append((e, len(specs) - 1, None))
        elif e in ("relu", "relu6", "gelu", "silu", "sigmoid", "tanh"):
            z, one = te.const(0.0, dt), te.const(1.0, dt)
            fn = {
                "relu": lambda v: te.max(v, z),
                "relu6": lambda v: te.min(te.max(v, z), te.const(6.0, dt)),
                "gelu": lambda v: te.const(0.5, dt) * v * (one + te.erf(v * te.const(
                    1 / math.sqrt(2), dt))),
                "silu": lambda v: v * te.sigmoid(v),
                "sigmoid": lambda v: te.sigmoid(v),
                "tanh": lambda v: te.tanh(v),
            }[e]
            Y = te.compute(oshape, _unary_fn(prev, fn), name="%s%d" % (e, i))
            steps.append((e, None, None))
        else:
            raise ValueError("epilogue " + e)
    if erf_v is None:
        erf_v = np.vectorize(math.erf)

    def full_ref(xs):
        y = ref(xs)
        for kind, idx, ax in steps:
            if kind == "bias":
                shp = [1] * y.ndim
                shp[ax] = -1
                y = y + xs[idx].reshape(shp)
            elif kind == "add":
                y = y + xs[idx]
            elif kind == "mul":
                y = y * xs[idx]
            elif kind == "relu":
                y = np.maximum(y, 0)
            elif kind == "relu6":
                y = np.minimum(np.maximum(y, 0), 6)
            elif kind == "gelu":
                y = 0.5 * y * (1 + erf_v(y / math.sqrt(2)))
            elif kind == "silu":
                y = y / (1 + np.exp(-y))
            elif kind == "sigmoid":
                y = 1 / (1 + np.exp(-y))
            elif kind == "tanh":
                y = np.tanh(y)
        return y

    return ins + [Y], specs, full_ref


def _bias_fn(prev, bias, ax):
    return lambda *ix: prev(*ix) + bias[ix[ax]]


def _binary_fn(prev, t, add):
    return (lambda *ix: prev(*ix) + t(*ix)) if add else (lambda *ix: prev(*ix) * t(*ix))


def _unary_fn(prev, fn):
    return lambda *ix: fn(prev(*ix))


def make_target(tvm, name, threads):
    if name == "cpu":
        cpu = str(tvm.target.codegen.llvm_get_system_cpu())
        return tvm.target.Target({"kind": "llvm", "mcpu": cpu, "num-cores": threads}), cpu
    cfg = {"kind": "llvm", "mcpu": "haswell", "mattr": ["+avx2", "+fma", "-avx512f"],
           "num-cores": threads}
    return tvm.target.Target(cfg), "haswell"


def fast_build(mod, target, _params):
    """MetaSchedule's default_build without `import tvm.s_tir.tensor_intrin` (~60 s here,
    longer than the builder's 30 s timeout). Float32 on llvm uses no tensor intrinsics."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.build(mod, target=target)


def best_so_far(work_dir):
    """[[trial, ms], ...] from the JSONDatabase: records in commit (= trial) order, running min
    of each record's mean run time; failed ones (no run_secs or >= 1e9 s) keep the min."""
    path = os.path.join(work_dir, "database_tuning_record.json")
    out, best, failed = [], None, 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            secs = rec[1][1] if len(rec[1]) > 1 else None
            if secs:
                m = sum(secs) / len(secs)
                if m < 1e9:
                    best = m if best is None else min(best, m)
                else:
                    failed += 1
            else:
                failed += 1
            out.append([len(out) + 1, None if best is None else round(best * 1e3, 6)])
    return out, failed


def main():
    args = parse_args()
    if args.workload:
        name, wl = "custom", json.loads(args.workload)
    elif args.name:
        with open(args.suite) as f:
            entries = {e["name"]: e for e in json.load(f)["workloads"]}
        name, wl = args.name, entries[args.name]["workload"]
    else:
        sys.exit("peers_tvm: --name or --workload")
    w = normalize(wl)

    # Everything TVM prints (its task tables go to stdout) goes to stderr; our JSON to stdout.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import tvm
    from tvm import te
    try:
        from tvm.s_tir import meta_schedule as ms  # 0.26+
    except ImportError:
        from tvm import meta_schedule as ms

    target, cpu = make_target(tvm, args.target, args.threads)
    tensors, specs, ref = build_te(w)
    mod = tvm.IRModule({"main": te.create_prim_func(tensors)})

    wd = args.work_dir or os.path.join(
        HERE, ".tvm-work", "%s-%s-%d" % (name, args.target.replace(":", "_"), args.trials))
    if not args.resume and not args.measure_only:
        shutil.rmtree(wd, ignore_errors=True)
    os.makedirs(wd, exist_ok=True)

    print("peers_tvm: %s on %s (mcpu %s), %d trials, work dir %s"
          % (name, args.target, cpu, args.trials, wd), file=sys.stderr)
    if args.measure_only and args.recover:
        meas = measure(args, tvm, ms, mod, target, tensors, specs, ref, wd)
        curve, failed = best_so_far(wd)
        rec = {
            "kind": "tvm_ms", "name": name, "target": args.target, "mcpu": cpu,
            "trials": args.trials, "trials_measured": len(curve), "trials_failed": failed,
            "tuning_s": log_span_s(wd), "kernel_ms": meas.get("kernel_ms"),
            "kernel_min_ms": meas.get("kernel_min_ms"),
            "tuned_ms": curve[-1][1] if curve else None, "rel_err": meas.get("rel_err"),
            "loadavg": meas.get("loadavg"), "best_so_far": curve,
            "tvm_version": tvm.__version__, "ffi_version": _ffi_version(),
            "threads": args.threads, "per_iter": min(args.per_iter, args.trials),
            "resumed": args.resume, "recovered": True,
            "work_dir": os.path.relpath(wd, HERE), "seed": args.seed,
            "runner": {"number": args.number, "repeat": 1, "min_repeat_ms": args.min_repeat_ms},
            "workload": wl, "time": int(time.time()),
        }
    elif args.measure_only:
        rec = {"kind": "tvm_ms_measure", "name": name}
        rec.update(measure(args, tvm, ms, mod, target, tensors, specs, ref, wd))
    else:
        builder = ms.builder.LocalBuilder(f_build=fast_build, max_workers=1)
        runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(
            number=args.number, repeat=1, min_repeat_ms=args.min_repeat_ms,
            enable_cpu_cache_flush=False))
        try:
            from tvm.ir.utils import derived_object  # 0.26
        except ImportError:
            from tvm.meta_schedule.utils import derived_object
        t0 = time.perf_counter()
        stopped, done = [], []

        @derived_object
        class Deadline(ms.measure_callback.PyMeasureCallback):
            """--seconds: ends the task after the round that crosses the deadline (the
            records of every finished round are in the database)."""

            def apply(self, task_scheduler, task_id, measure_candidates, builder_results,
                      runner_results):
                done.append(len(measure_candidates))
                if time.perf_counter() - t0 > args.seconds and not stopped \
                        and sum(done) < args.trials:
                    stopped.append(sum(done))
                    print("peers_tvm: past --seconds %g, stopping" % args.seconds,
                          file=sys.stderr)
                    try:
                        task_scheduler.terminate_task(task_id)
                    except Exception:  # already terminated (space exhausted)
                        pass

        ms.tir_integration.tune_tir(
            mod=mod, target=target, work_dir=wd, max_trials_global=args.trials,
            num_trials_per_iter=min(args.per_iter, args.trials), builder=builder,
            runner=runner, num_tuning_cores=args.threads, seed=args.seed,
            measure_callbacks=ms.measure_callback.MeasureCallback.create("default")
            + [Deadline()])
        tuning_s = time.perf_counter() - t0
        # The tuned kernel is timed and checked in a fresh process, as MetaSchedule's runner
        # does: this one holds XGBoost's and the search's thread pools.
        cmd = [sys.executable, os.path.abspath(__file__), "--measure-only", "--work-dir", wd,
               "--target", args.target, "--threads", str(args.threads), "--suite", args.suite]
        cmd += ["--workload", args.workload] if args.workload else ["--name", args.name]
        if args.no_check:
            cmd.append("--no-check")
        import subprocess
        m = subprocess.run(cmd, stdout=subprocess.PIPE, check=False, text=True)
        meas = json.loads(m.stdout.strip().splitlines()[-1]) if m.stdout.strip() else {}
        curve, failed = best_so_far(wd)
        rec = {
            "kind": "tvm_ms", "name": name, "target": args.target, "mcpu": cpu,
            "trials": args.trials, "trials_measured": len(curve), "trials_failed": failed,
            "tuning_s": round(tuning_s, 2), "kernel_ms": meas.get("kernel_ms"),
            "kernel_min_ms": meas.get("kernel_min_ms"),
            "tuned_ms": curve[-1][1] if curve else None, "rel_err": meas.get("rel_err"),
            "loadavg": meas.get("loadavg"), "best_so_far": curve,
            "tvm_version": tvm.__version__, "ffi_version": _ffi_version(),
            "threads": args.threads, "per_iter": min(args.per_iter, args.trials),
            "resumed": args.resume, "stopped_by_seconds": bool(stopped),
            "work_dir": os.path.relpath(wd, HERE), "seed": args.seed,
            "runner": {"number": args.number, "repeat": 1, "min_repeat_ms": args.min_repeat_ms},
            "workload": wl, "time": int(time.time()),
        }
        if "error" in meas or m.returncode not in (0, 2):
            rec["error"] = meas.get("error", "measure exited %d" % m.returncode)
    line = json.dumps(rec)
    out.write(line + "\n")
    out.flush()
    if args.out and (args.recover or not args.measure_only):
        with open(args.out, "a") as f:
            f.write(line + "\n")
    print("peers_tvm: %s kernel %s ms (median; min %s), tuning %s s, rel_err %s"
          % (name, rec.get("kernel_ms"), rec.get("kernel_min_ms"), rec.get("tuning_s"),
             rec.get("rel_err")), file=sys.stderr)
    rel_err = rec.get("rel_err")
    if rec.get("kernel_ms") is None:
        return 1
    return 0 if rel_err is None or rel_err < 1e-3 else 2


def measure(args, tvm, ms, mod, target, tensors, specs, ref, wd):
    """Builds the best schedule of wd's database; its median / min ms over 10 repeats of
    time_evaluator (each >= 0.1 s) and its relative error against numpy (float64)."""
    import numpy as np

    db = ms.database.JSONDatabase(work_dir=wd)
    sch = ms.tir_integration.compile_tir(db, mod, target)
    if sch is None:
        return {"error": "no valid schedule in the database"}
    rt = tvm.build(sch.mod, target=target)
    dev = tvm.cpu(0)
    rng = np.random.default_rng(1234)
    xs = [rng.uniform(-1, 1, size=shp).astype("float32") for _, shp in specs]
    oshape = tuple(int(d) for d in tensors[-1].shape)
    args_tvm = [tvm.runtime.tensor(x, dev) for x in xs] + [
        tvm.runtime.empty(oshape, "float32", dev)]
    rt(*args_tvm)
    rel_err = None
    if not args.no_check:
        got = args_tvm[-1].numpy().astype(np.float64)
        want = ref([x.astype(np.float64) for x in xs])
        rel_err = float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))
    fte = rt.time_evaluator(rt.entry_name, dev, number=1, repeat=10, min_repeat_ms=100)
    res = [float(r) for r in fte(*args_tvm).results]
    return {"kernel_ms": round(float(np.median(res)) * 1e3, 6),
            "kernel_min_ms": round(min(res) * 1e3, 6), "rel_err": rel_err,
            "loadavg": round(os.getloadavg()[0], 2)}


def log_span_s(wd):
    """Seconds between the first and the last timestamp of the task scheduler's log."""
    import datetime
    import glob

    stamps = []
    for path in glob.glob(os.path.join(wd, "logs", "*task_scheduler*.log")):
        with open(path) as f:
            for line in f:
                if line[:2] == "20" and line[19:20] == " ":
                    stamps.append(datetime.datetime.strptime(line[:19], "%Y-%m-%d %H:%M:%S"))
    return (max(stamps) - min(stamps)).total_seconds() if stamps else None


def _ffi_version():
    try:
        from importlib.metadata import version
        return version("apache-tvm-ffi")
    except Exception:  # pragma: no cover
        return None


if __name__ == "__main__":
    sys.exit(main())
