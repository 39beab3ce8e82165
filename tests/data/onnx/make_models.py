#!/usr/bin/env python3
"""Builds the small ONNX test models of tests/compiler/frontend/test_onnx.c with onnx.helper,
and their expected outputs with ONNX Runtime (CPU): NAME.onnx, NAME.in.npy (the input),
NAME.out.npy (ORT's output). Run with the bench virtualenv (bench/setup.sh):
    bench/.venv/bin/python tests/data/onnx/make_models.py
Weights come from a seeded generator, so the files are reproducible."""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
rng = np.random.default_rng(17)


def w(*shape, scale=None):
    fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    s = scale if scale is not None else (1.0 / max(fan, 1)) ** 0.5
    return (rng.standard_normal(shape) * s).astype(np.float32)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def save(name, graph, opset, x):
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = os.path.join(HERE, name + ".onnx")
    onnx.save(model, path)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {graph.input[0].name: x})
    np.save(os.path.join(HERE, name + ".in.npy"), x)
    np.save(os.path.join(HERE, name + ".out.npy"), y.astype(np.float32))
    print(name, os.path.getsize(path), "bytes", y.shape)


def bn(prefix, c):
    return [init(prefix + "_s", 1 + 0.1 * rng.standard_normal(c).astype(np.float32)),
            init(prefix + "_b", 0.1 * rng.standard_normal(c).astype(np.float32)),
            init(prefix + "_m", 0.1 * rng.standard_normal(c).astype(np.float32)),
            init(prefix + "_v", (1 + 0.2 * rng.random(c)).astype(np.float32))]


def resnet_block():
    n = helper.make_node
    inits = [init("c1w", w(8, 3, 3, 3)), init("c2w", w(8, 8, 3, 3)), init("c3w", w(16, 8, 1, 1)),
             init("c3b", w(16, scale=0.1)), init("fcw", w(10, 16)), init("fcb", w(10, scale=0.1)),
             init("six", np.array(6, np.float32)), init("zero", np.array(0, np.float32))]
    inits += bn("bn1", 8) + bn("bn2", 8)
    nodes = [
        n("Conv", ["x", "c1w"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        n("BatchNormalization", ["c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["b1"], name="bn1"),
        n("Relu", ["b1"], ["r1"], name="relu1"),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        n("Conv", ["p1", "c2w"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        n("BatchNormalization", ["c2", "bn2_s", "bn2_b", "bn2_m", "bn2_v"], ["b2"], name="bn2"),
        n("Add", ["b2", "p1"], ["s"], name="residual"),
        n("Relu", ["s"], ["r2"], name="relu2"),
        n("Conv", ["r2", "c3w", "c3b"], ["c3"], name="conv3"),
        n("Clip", ["c3", "zero", "six"], ["r3"], name="relu6"),
        n("GlobalAveragePool", ["r3"], ["g"], name="gap"),
        n("Flatten", ["g"], ["f"], name="flatten"),
        n("Gemm", ["f", "fcw", "fcb"], ["logits"], transB=1, name="fc"),
        n("Softmax", ["logits"], ["prob"], axis=-1, name="softmax"),
    ]
    g = helper.make_graph(nodes, "resnet_block",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
                          [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [2, 10])],
                          inits)
    save("resnet_block", g, 17, rng.standard_normal((2, 3, 16, 16)).astype(np.float32))


def transformer_block():
    n = helper.make_node
    S, H, F = 8, 32, 64
    scale = 1.0 / np.sqrt(H)
    inits = [init("ln1_g", (1 + 0.1 * w(H, scale=1)).astype(np.float32)), init("ln1_b", w(H, scale=0.1)),
             init("wq", (w(H, H) * scale).astype(np.float32)), init("wk", w(H, H)), init("wv", w(H, H)),
             init("wo", w(H, H)), init("bo", w(H, scale=0.1)),
             init("ln2_g", (1 + 0.1 * w(H, scale=1)).astype(np.float32)), init("ln2_b", w(H, scale=0.1)),
             init("w1", w(H, F)), init("b1", w(F, scale=0.1)), init("w2", w(F, H)),
             init("b2", w(H, scale=0.1))]
    nodes = [
        n("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["h"], axis=-1, epsilon=1e-5, name="ln1"),
        n("MatMul", ["h", "wq"], ["q"], name="q"),
        n("MatMul", ["h", "wk"], ["k"], name="k"),
        n("MatMul", ["h", "wv"], ["v"], name="v"),
        n("Transpose", ["k"], ["kt"], perm=[1, 0], name="kt"),
        n("MatMul", ["q", "kt"], ["scores"], name="scores"),
        n("Softmax", ["scores"], ["p"], axis=-1, name="softmax"),
        n("MatMul", ["p", "v"], ["ctx"], name="ctx"),
        n("MatMul", ["ctx", "wo"], ["o"], name="o"),
        n("Add", ["o", "bo"], ["ob"], name="o_bias"),
        n("Add", ["ob", "x"], ["x1"], name="residual1"),
        n("LayerNormalization", ["x1", "ln2_g", "ln2_b"], ["h2"], axis=-1, name="ln2"),
        n("MatMul", ["h2", "w1"], ["f1"], name="fc1"),
        n("Add", ["f1", "b1"], ["f1b"], name="fc1_bias"),
        n("Gelu", ["f1b"], ["a"], name="gelu"),
        n("MatMul", ["a", "w2"], ["f2"], name="fc2"),
        n("Add", ["f2", "b2"], ["f2b"], name="fc2_bias"),
        n("Add", ["f2b", "x1"], ["y"], name="residual2"),
    ]
    g = helper.make_graph(nodes, "transformer_block",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [S, H])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [S, H])], inits)
    save("transformer_block", g, 20, rng.standard_normal((S, H)).astype(np.float32))


def bad_models():
    n = helper.make_node
    g = helper.make_graph([n("Relu", ["x"], ["r"], name="act"), n("Sin", ["r"], ["y"], name="wave")],
                          "unknown_op", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              os.path.join(HERE, "unknown_op.onnx"))
    g = helper.make_graph([n("Relu", ["x"], ["y"], name="act")], "dynamic",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              os.path.join(HERE, "dynamic.onnx"))
    # an initializer that claims 2^30 floats and holds 4
    big = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1 << 30],
                      raw_data=np.zeros(4, np.float32).tobytes())
    g = helper.make_graph([n("MatMul", ["x", "w"], ["y"], name="mm")], "huge_claim",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], [big])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              os.path.join(HERE, "huge_claim.onnx"))


if __name__ == "__main__":
    resnet_block()
    transformer_block()
    bad_models()
