#!/usr/bin/python3
"""Independent GPT-2 reference for tests/compiler/tlm/test_forward.c (numpy only).

Reads a tlm weight file as model_weights/README.md documents it (not through the C code),
runs a full causal forward in float64 without any cache, and writes the logits of every
position as little-endian float64 (T, V) to OUT.

usage: gpt2_ref.py WEIGHTS OUT TOKEN...
Run with /usr/bin/python3 (Debian's python3-numpy).
"""
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        blob = f.read()
    h = blob[:128]
    if h[:4] != b"TLMW":
        raise SystemExit("bad magic")
    (version, header_size, dtype, L, NH, C, T, V, _r0, n_params,
     file_size) = struct.unpack_from("<9IQQ", h, 4)
    if version != 1 or header_size != 128 or dtype != 1 or file_size != len(blob):
        raise SystemExit("unexpected header")
    p = np.frombuffer(blob, dtype="<f4", offset=128).astype(np.float64)
    if p.size != n_params:
        raise SystemExit("size mismatch")
    off = 0

    def take(*shape):
        nonlocal off
        n = int(np.prod(shape))
        a = p[off:off + n].reshape(shape)
        off += n
        return a

    m = {"L": L, "NH": NH, "C": C, "T": T, "V": V}
    m["wte"] = take(V, C)
    m["wpe"] = take(T, C)
    layers = []
    for _ in range(L):
        ly = {}
        ly["ln1_w"], ly["ln1_b"] = take(C), take(C)
        ly["qkv_w"], ly["qkv_b"] = take(C, 3 * C), take(3 * C)
        ly["proj_w"], ly["proj_b"] = take(C, C), take(C)
        ly["ln2_w"], ly["ln2_b"] = take(C), take(C)
        ly["fc_w"], ly["fc_b"] = take(C, 4 * C), take(4 * C)
        ly["fcp_w"], ly["fcp_b"] = take(4 * C, C), take(C)
        layers.append(ly)
    m["layers"] = layers
    m["lnf_w"], m["lnf_b"] = take(C), take(C)
    if off != n_params:
        raise SystemExit("layout mismatch")
    return m


def layernorm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(m, tokens):
    T = len(tokens)
    C, NH = m["C"], m["NH"]
    hs = C // NH
    x = m["wte"][tokens] + m["wpe"][:T]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for ly in m["layers"]:
        h = layernorm(x, ly["ln1_w"], ly["ln1_b"])
        qkv = h @ ly["qkv_w"] + ly["qkv_b"]
        q, k, v = qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:]
        q = q.reshape(T, NH, hs).transpose(1, 0, 2)
        k = k.reshape(T, NH, hs).transpose(1, 0, 2)
        v = v.reshape(T, NH, hs).transpose(1, 0, 2)
        att = q @ k.transpose(0, 2, 1) / np.sqrt(hs)
        att = np.where(causal, att, -np.inf)
        att = np.exp(att - att.max(-1, keepdims=True))
        att = att / att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ ly["proj_w"] + ly["proj_b"]
        h = layernorm(x, ly["ln2_w"], ly["ln2_b"])
        x = x + gelu(h @ ly["fc_w"] + ly["fc_b"]) @ ly["fcp_w"] + ly["fcp_b"]
    x = layernorm(x, m["lnf_w"], m["lnf_b"])
    return x @ m["wte"].T


def main():
    if len(sys.argv) < 4:
        raise SystemExit(__doc__)
    m = load(sys.argv[1])
    tokens = np.array([int(t) for t in sys.argv[3:]], dtype=np.int64)
    logits = forward(m, tokens)
    with open(sys.argv[2], "wb") as f:
        f.write(logits.astype("<f8").tobytes())


if __name__ == "__main__":
    main()
