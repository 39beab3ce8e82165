#!/usr/bin/python3
"""Peers of the end-to-end benchmark (bench/e2e.sh): the network a tlmd plan describes, run by
PyTorch eager and by ONNX Runtime's CPU provider with the same weights.

The network is read from DIR/manifest.json (`tlmc compile -o DIR` or `tlm compile --model ...
-o DIR`): the plan's launches in order, each kernel's workload (op, shape, attributes,
epilogue) and the tensors bound to its arguments. Each launch becomes the PyTorch calls a
framework user would write for it (F.linear-style matmuls, F.conv2d with groups, pools,
softmax, F.layer_norm, the epilogue op by op), so eager PyTorch runs exactly our network
(batch norm already folded, attention as our zoo expresses it). The same module is exported
with torch.onnx.export (opset 17, weights as initializers) and timed in ONNX Runtime with
graph optimisation level ALL, which fuses what it can.

Commands:
  torch DIR   (Debian /usr/bin/python3 with python3-torch) writes DIR/weights.npz (every input
              and param: numpy generator seeded 1, inputs in [-1, 1], weights with variance
              1/fan-in, 1-D params in [0.9, 1.1]), DIR/model.onnx, DIR/torch_out.npz, and prints
              {"peer": "torch", "median_ms", "min_ms", "runs", "threads"}
  ort DIR     (bench/.venv/bin/python: onnxruntime, numpy) times DIR/model.onnx and compares
              its outputs with DIR/torch_out.npz and with ours (DIR/ours/NAME.npy, written by
              `tlm run --save-outputs DIR/ours`); prints {"peer": "ort", "median_ms", ...,
              "rel_err_vs_torch", "rel_err_ours_vs_ort"}
Options: --runs N (default 20), --threads T (default: the CPU count).
"""
import json
import os
import sys
import time


def load_manifest(d):
    with open(os.path.join(d, "manifest.json")) as f:
        m = json.load(f)
    if "plan" not in m:
        sys.exit(f"{d}/manifest.json has no plan")
    return m


def time_fn(fn, runs):
    fn()  # warm-up
    fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    n = len(ts)
    med = ts[n // 2] if n % 2 else (ts[n // 2 - 1] + ts[n // 2]) / 2
    return med * 1e3, ts[0] * 1e3


def rel_err(a, b):
    import numpy as np

    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    scale = max(float(np.max(np.abs(b))), 1e-30)
    return float(np.max(np.abs(a - b)) / scale)


def make_weights(plan, np):
    rng = np.random.default_rng(1)
    out = {}
    for t in plan["tensors"]:
        if t["kind"] not in ("input", "param") or "alias_of" in t:
            continue
        shape = t["shape"]
        n = int(np.prod(shape))
        if t["kind"] == "input":
            lo, hi = -1.0, 1.0
        elif len(shape) == 1:
            lo, hi = 0.9, 1.1
        else:
            fan = n // (shape[1] if len(shape) == 2 else shape[0])
            hi = (3.0 / max(fan, 1)) ** 0.5
            lo = -hi
        out[t["name"]] = (lo + (hi - lo) * rng.random(n)).astype(np.float32).reshape(shape)
    return out


def build_module(m, weights, torch):
    """A torch.nn.Module running the plan; params are buffers, inputs are forward args.

    Written as a framework user would write the network, so that the exported graph is the one
    ONNX Runtime is good at: a reshape that keeps the shape is not called (traced, it would
    become a Reshape node, which breaks ORT's Conv + Add + Relu fusion and its NCHWc layout into
    Reorder nodes around it), and a conv's bias goes into the conv."""
    F = torch.nn.functional

    def view(t, *shape):
        return t if tuple(t.shape) == tuple(shape) else t.reshape(*shape)
    plan = m["plan"]
    kernels = m["kernels"]
    root = {t["name"]: t.get("alias_of", t["name"]) for t in plan["tensors"]}
    shapes = {t["name"]: t["shape"] for t in plan["tensors"]}
    params = list(plan["params"])
    inputs = list(plan["inputs"])
    outputs = list(plan["outputs"])

    def epilogue(y, ep, other, w, chan_axis):
        if ep == "bias_add":
            shape = [1] * y.dim()
            shape[chan_axis] = -1
            return y + view(other, *shape)
        if ep == "add":
            return y + view(other, *y.shape)
        if ep == "mul":
            return y * view(other, *y.shape)
        if ep == "relu":
            return F.relu(y)
        if ep == "relu6":
            return torch.clamp(y, 0.0, 6.0)
        if ep == "gelu":
            return F.gelu(y)
        if ep == "silu":
            return F.silu(y)
        if ep == "sigmoid":
            return torch.sigmoid(y)
        if ep == "tanh":
            return torch.tanh(y)
        raise ValueError(f"epilogue {ep}")

    def anchor(w, a, bias):
        op, s = w["op"], w["shape"]
        if op == "dense":
            M, N, K = s["M"], s["N"], s["K"]
            x = view(a[0], K, M).t() if w.get("transpose_a") else view(a[0], M, K)
            b = view(a[1], N, K).t() if w.get("transpose_b") else view(a[1], K, N)
            return (x @ b if bias is None else torch.addmm(bias, x, b)), 1, 2
        if op == "batch_matmul":
            B, M, N, K = s["B"], s["M"], s["N"], s["K"]
            x = view(a[0], B, K, M).transpose(1, 2) if w.get("transpose_a") else view(a[0], B, M, K)
            b = view(a[1], B, N, K).transpose(1, 2) if w.get("transpose_b") else view(a[1], B, K, N)
            return torch.bmm(x, b), 2, 2
        if op in ("conv2d", "depthwise_conv2d", "max_pool2d", "avg_pool2d"):
            nhwc = w.get("layout") == "NHWC"
            N, C, H, W = s["N"], s["C"], s["H"], s["W"]
            x = view(a[0], N, H, W, C).permute(0, 3, 1, 2) if nhwc else view(a[0], N, C, H, W)
            st, pd, dl = tuple(w.get("stride", [1, 1])), tuple(w.get("pad", [0, 0])), tuple(w.get("dilation", [1, 1]))
            KH, KW = s["KH"], s["KW"]
            if op == "conv2d":
                g = w.get("groups", 1)
                wt = view(a[1], KH, KW, C // g, s["F"]).permute(3, 2, 0, 1) if nhwc else view(a[1], s["F"], C // g, KH, KW)
                y = F.conv2d(x, wt, bias, st, pd, dl, g)
            elif op == "depthwise_conv2d":
                wt = view(a[1], KH, KW, C).permute(2, 0, 1) if nhwc else view(a[1], C, KH, KW)
                y = F.conv2d(x, view(wt, C, 1, KH, KW), bias, st, pd, dl, C)
            elif op == "max_pool2d":
                y = F.max_pool2d(x, (KH, KW), st, pd)
            else:
                y = F.avg_pool2d(x, (KH, KW), st, pd, count_include_pad=True)
            if nhwc:
                return y.permute(0, 2, 3, 1), 3, 4
            return y, 1, 4
        if op == "global_avg_pool2d":
            N, C, H, W = s["N"], s["C"], s["H"], s["W"]
            if w.get("layout") == "NHWC":
                return view(a[0], N, H * W, C).mean(1), 1, 2
            return view(a[0], N, C, H * W).mean(2), 1, 2
        R, C = s.get("R"), s.get("C")
        if op == "softmax":
            return torch.softmax(view(a[0], R, C), -1), 1, 2
        if op == "layer_norm":
            return F.layer_norm(view(a[0], R, C), (C,), a[1], a[2], w.get("eps", 1e-5)), 1, 2
        if op == "rms_norm":
            x = view(a[0], R, C)
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + w.get("eps", 1e-5)) * a[1], 1, 2
        if op == "reduce_sum":
            return view(a[0], R, C).sum(-1), 0, 1
        if op == "reduce_mean":
            return view(a[0], R, C).mean(-1), 0, 1
        if op == "reduce_max":
            return view(a[0], R, C).amax(-1), 0, 1
        if op == "elementwise":
            return view(a[0], s["N"]), 0, 1
        if op == "transpose":
            return view(a[0], -1, R, C).transpose(1, 2), 2, 3
        raise ValueError(f"op {op}")

    steps = []
    for L in plan["launches"]:
        w = kernels[L["subgraph"]]["workload"]
        steps.append((w, L["args"], L.get("repeat", 1)))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for i, p in enumerate(params):
                self.register_buffer(f"p{i}", torch.from_numpy(weights[p]))

        def forward(self, *xs):
            env = {}
            for i, p in enumerate(params):
                env[p] = getattr(self, f"p{i}")
            for n, x in zip(inputs, xs):
                env[n] = x
            for w, args, rep in steps:
                a = [env[root[n]] for n in args[:-1]]
                n_anchor_in = {"layer_norm": 3, "rms_norm": 2, "dense": 2, "batch_matmul": 2,
                               "conv2d": 2, "depthwise_conv2d": 2}.get(w["op"], 1)
                eps, bias, k = list(w.get("epilogue", [])), None, n_anchor_in
                if eps[:1] == ["bias_add"] and w["op"] in ("dense", "conv2d", "depthwise_conv2d"):
                    bias, eps, k = a[k], eps[1:], k + 1  # nn.Linear's and nn.Conv2d's own bias
                y, chan, _ = anchor(w, a[:n_anchor_in], bias)
                for ep in eps:
                    other = None
                    if ep in ("bias_add", "add", "mul"):
                        other = a[k]
                        k += 1
                    y = epilogue(y, ep, other, w, chan if y.dim() > 1 else 0)
                out = args[-1]
                env[root[out]] = view(y, *shapes[root[out]])
            return tuple(view(env[root[o]], *shapes[o]) for o in outputs)

    return Net(), inputs, outputs


def cmd_torch(d, runs, threads):
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    m = load_manifest(d)
    weights = make_weights(m["plan"], np)
    np.savez(os.path.join(d, "weights.npz"), **weights)
    net, inputs, outputs = build_module(m, weights, torch)
    net.eval()
    xs = tuple(torch.from_numpy(weights[n]) for n in inputs)
    with torch.inference_mode():
        ys = net(*xs)
        med, mn = time_fn(lambda: net(*xs), runs)
    np.savez(os.path.join(d, "torch_out.npz"), **{o: y.numpy() for o, y in zip(outputs, ys)})
    with torch.no_grad():
        torch.onnx.export(net, xs, os.path.join(d, "model.onnx"), input_names=inputs,
                          output_names=outputs, opset_version=17, do_constant_folding=True)
    print(json.dumps({"peer": "torch", "version": torch.__version__, "median_ms": med,
                      "min_ms": mn, "runs": runs, "threads": threads}))


def cmd_ort(d, runs, threads):
    import numpy as np
    import onnxruntime as ort

    m = load_manifest(d)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), so,
                                providers=["CPUExecutionProvider"])
    weights = np.load(os.path.join(d, "weights.npz"))
    feeds = {i.name: weights[i.name] for i in sess.get_inputs()}
    outs = sess.run(None, feeds)
    med, mn = time_fn(lambda: sess.run(None, feeds), runs)
    names = [o.name for o in sess.get_outputs()]
    ref = np.load(os.path.join(d, "torch_out.npz"))
    vs_torch = max(rel_err(o, ref[n]) for n, o in zip(names, outs))
    ours = None
    od = os.path.join(d, "ours")
    if all(os.path.exists(os.path.join(od, n + ".npy")) for n in names):
        ours = max(rel_err(np.load(os.path.join(od, n + ".npy")).ravel(), o)
                   for n, o in zip(names, outs))
    nodes = ort_nodes(ort, so, d, feeds, runs)
    print(json.dumps({"peer": "ort", "version": ort.__version__, "median_ms": med, "min_ms": mn,
                      "runs": runs, "threads": threads, "rel_err_vs_torch": vs_torch,
                      "rel_err_ours_vs_ort": ours, "nodes": nodes}))


def ort_nodes(ort, so, d, feeds, runs):
    """ONNX Runtime's nodes as it ran them, after the timed runs (a profiled session of its own,
    so that profiling does not touch the latency above): per node in execution order its op,
    its output's shape and the median of its kernel times over the runs, in ms."""
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(d, "ort_profile")
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), so,
                                providers=["CPUExecutionProvider"])
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    times, first = {}, []
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        if name not in times:
            times[name] = []
            shape = (e.get("args", {}).get("output_type_shape") or [{}])[0]
            first.append((name, e["args"].get("op_name", "?"), next(iter(shape.values()), None)))
        times[name].append(e["dur"] / 1000.0)
    nodes = []
    for name, op, shape in first:
        ts = sorted(times[name])
        nodes.append({"node": name[:-len("_kernel_time")], "op": op, "shape": shape,
                      "ms": ts[len(ts) // 2]})
    return nodes


def main():
    args = sys.argv[1:]
    runs, threads = 20, os.cpu_count() or 1
    rest = []
    i = 0
    while i < len(args):
        if args[i] == "--runs":
            runs = int(args[i + 1])
            i += 2
        elif args[i] == "--threads":
            threads = int(args[i + 1])
            i += 2
        else:
            rest.append(args[i])
            i += 1
    if len(rest) != 2 or rest[0] not in ("torch", "ort"):
        sys.exit(__doc__)
    (cmd_torch if rest[0] == "torch" else cmd_ort)(rest[1], runs, threads)


if __name__ == "__main__":
    main()
