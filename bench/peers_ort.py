#!/usr/bin/env python3
"""ONNX Runtime (CPU) timings of the real-shapes suite: one-op models built with onnx.helper.

Each workload becomes the small graph an exporter would write: MatMul (+ Add bias) for dense
with the weight as an initializer (a deployed model: ORT may pre-pack it), MatMul on a
Transpose for batch_matmul, Conv (group = C for depthwise) with weight and bias initializers,
Softmax / LayerNormalization, RMSNorm as Pow-ReduceMean-Add-Sqrt-Div-Mul, MaxPool /
AveragePool, reductions, Transpose; the epilogue as ONNX nodes (GELU in its exported erf form,
SiLU as x * Sigmoid(x)), which ORT's optimiser fuses where it can (graph optimisation level
ALL). intra_op_num_threads = cores. Timing as bench/peers.h (see peers_torch.time_call);
session.run with numpy inputs, outputs allocated by ORT per call.

Runs in the bench-only virtualenv: bench/.venv/bin/python bench/peers_ort.py (bench/setup.sh
installs onnxruntime, onnx and numpy there).
Usage: peers_ort.py [--suite FILE] [--out FILE] [--only NAMES] [--quick] [--fresh] [--serve]
(default --out bench/results/real_shapes.ort.jsonl; resumes unless --fresh; --serve as in
peers_torch.py: build/bench/real_shapes asks for each workload beside our kernels).
"""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_torch as common  # the shared helpers only; torch is not imported  # noqa: E402

OPSET = 17


def ort_measure_factory(ort, onnx, np, threads):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1234)

    def rand(*shape):
        return (rng.random(shape, dtype=np.float32) * 2 - 1).astype(np.float32)

    def build(w):
        """(model, feeds) for workload w."""
        op, s, ep = w["op"], w["shape"], w["epilogue"]
        nodes, inits, inputs, feeds = [], [], [], {}
        counter = [0]

        def name(p):
            counter[0] += 1
            return f"{p}{counter[0]}"

        def graph_input(arr):
            n = name("in")
            inputs.append(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(arr.shape)))
            feeds[n] = arr
            return n

        def const(arr):
            n = name("c")
            inits.append(numpy_helper.from_array(np.asarray(arr, dtype=np.float32), n))
            return n

        def node(optype, ins, **attrs):
            o = name("t")
            nodes.append(helper.make_node(optype, ins, [o], **attrs))
            return o

        def apply_epilogue(y, oshape, skip_first_bias):
            nhwc = w["layout"] == "NHWC" and len(oshape) == 4
            mem = [oshape[0], oshape[2], oshape[3], oshape[1]] if nhwc else oshape
            for i, e in enumerate(ep):
                if e == "bias_add":
                    if i == 0 and skip_first_bias:
                        continue
                    ax = 3 if nhwc else (common.channel_axis(w) % len(oshape))
                    shp = [1] * len(mem)
                    shp[ax] = mem[ax]
                    y = node("Add", [y, const(rand(*shp))])
                elif e in ("add", "mul"):
                    y = node("Add" if e == "add" else "Mul", [y, graph_input(rand(*mem))])
                elif e == "relu":
                    y = node("Relu", [y])
                elif e == "relu6":
                    y = node("Clip", [y, const(np.float32(0)), const(np.float32(6))])
                elif e == "gelu":  # the erf form PyTorch exports; ORT fuses it into Gelu
                    d = node("Div", [y, const(np.float32(math.sqrt(2.0)))])
                    t = node("Add", [node("Erf", [d]), const(np.float32(1))])
                    y = node("Mul", [node("Mul", [y, t]), const(np.float32(0.5))])
                elif e == "silu":
                    y = node("Mul", [y, node("Sigmoid", [y])])
                elif e == "sigmoid":
                    y = node("Sigmoid", [y])
                elif e == "tanh":
                    y = node("Tanh", [y])
                else:
                    raise ValueError("epilogue " + e)
            return y

        lead_bias = bool(ep) and ep[0] == "bias_add"
        oshape = common.out_shape(w)
        if op == "dense":
            M, N, K = s["M"], s["N"], s["K"]
            if w["transpose_a"]:
                a = node("Transpose", [graph_input(rand(K, M))], perm=[1, 0])
            else:
                a = graph_input(rand(M, K))
            b = const(rand(K, N))  # an initializer: its stored layout is ORT's business
            y = node("MatMul", [a, b])
            if lead_bias:
                y = node("Add", [y, const(rand(N))])
            y = apply_epilogue(y, oshape, True)
        elif op == "batch_matmul":
            B, M, N, K = s["B"], s["M"], s["N"], s["K"]
            a = graph_input(rand(B, K, M) if w["transpose_a"] else rand(B, M, K))
            if w["transpose_a"]:
                a = node("Transpose", [a], perm=[0, 2, 1])
            b = graph_input(rand(B, N, K) if w["transpose_b"] else rand(B, K, N))
            if w["transpose_b"]:
                b = node("Transpose", [b], perm=[0, 2, 1])
            y = apply_epilogue(node("MatMul", [a, b]), oshape, False)
        elif op in ("conv2d", "depthwise_conv2d"):
            if w["layout"] != "NCHW":
                raise ValueError("ONNX Conv is NCHW only")
            N, C, H, W = s["N"], s["C"], s["H"], s["W"]
            F, g = (s["F"], w["groups"]) if op == "conv2d" else (C, C)
            ins = [graph_input(rand(N, C, H, W)), const(rand(F, C // g, s["KH"], s["KW"]))]
            if lead_bias:
                ins.append(const(rand(F)))
            p = w["pad"]
            y = node("Conv", ins, strides=w["stride"], pads=[p[0], p[1], p[0], p[1]],
                     dilations=w["dilation"], group=g, kernel_shape=[s["KH"], s["KW"]])
            y = apply_epilogue(y, oshape, True)
        elif op in ("max_pool2d", "avg_pool2d"):
            if w["layout"] != "NCHW":
                raise ValueError("ONNX pools are NCHW only")
            x = graph_input(rand(s["N"], s["C"], s["H"], s["W"]))
            p = w["pad"]
            attrs = dict(kernel_shape=[s["KH"], s["KW"]], strides=w["stride"],
                         pads=[p[0], p[1], p[0], p[1]])
            if op == "max_pool2d":
                y = node("MaxPool", [x], dilations=w["dilation"], **attrs)
            else:
                y = node("AveragePool", [x], count_include_pad=1, **attrs)
            y = apply_epilogue(y, oshape, False)
        elif op == "global_avg_pool2d":
            x = graph_input(rand(s["N"], s["C"], s["H"], s["W"]))
            y = node("Flatten", [node("GlobalAveragePool", [x])], axis=1)
            y = apply_epilogue(y, oshape, False)
        elif op in ("softmax", "layer_norm", "rms_norm") or op.startswith("reduce_"):
            R, C = s["R"], s["C"]
            x = graph_input(rand(R, C))
            if op == "softmax":
                y = node("Softmax", [x], axis=-1)
            elif op == "layer_norm":
                y = node("LayerNormalization", [x, const(rand(C)), const(rand(C))], axis=-1,
                         epsilon=w["eps"])
            elif op == "rms_norm":
                ms = node("ReduceMean", [node("Pow", [x, const(np.float32(2))])], axes=[-1],
                          keepdims=1)
                r = node("Sqrt", [node("Add", [ms, const(np.float32(w["eps"]))])])
                y = node("Mul", [node("Div", [x, r]), const(rand(C))])
            elif op == "reduce_sum":  # opset 13+: axes is an input
                inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
                y = node("ReduceSum", [x, "axes"], keepdims=0)
            elif op == "reduce_mean":
                y = node("ReduceMean", [x], axes=[-1], keepdims=0)
            else:
                y = node("ReduceMax", [x], axes=[-1], keepdims=0)
            y = apply_epilogue(y, oshape, False)
        elif op == "elementwise":
            y = apply_epilogue(graph_input(rand(s["N"])), oshape, False)
        elif op == "transpose":
            y = node("Transpose", [graph_input(rand(s["R"], s["C"]))], perm=[1, 0])
        else:
            raise ValueError("unknown op " + op)
        out = helper.make_tensor_value_info(y, TensorProto.FLOAT, None)
        g = helper.make_graph(nodes, "one_op", inputs, [out], initializer=inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
        m.ir_version = 8
        return m, feeds

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

    def measure_one(w):
        model, feeds = build(w)
        sess = ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        ops = ",".join(sorted({n.op_type for n in model.graph.node}))  # before ORT fuses
        return common.time_call(lambda: sess.run(None, feeds)), ops

    return measure_one


def main():
    args = common.parse_args("bench/results/real_shapes.ort.jsonl", __doc__)
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
    except ImportError as e:
        print(f"peers_ort: {e}; run bench/setup.sh (ONNX Runtime goes into bench/.venv)",
              file=sys.stderr)
        return 1
    meta = {"onnxruntime": ort.__version__, "onnx": onnx.__version__, "threads": args.threads}
    print(f"peers_ort: onnxruntime {ort.__version__}, {args.threads} threads", file=sys.stderr)
    measure_one = ort_measure_factory(ort, onnx, np, args.threads)
    return 1 if common.run_suite(args, "ort", meta, measure_one) else 0


if __name__ == "__main__":
    sys.exit(main())
