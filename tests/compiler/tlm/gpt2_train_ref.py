#!/usr/bin/python3
"""Independent loss and gradient for tests/compiler/tlm/test_train.c (numpy only, float64).

Reads a tlm weight file (gpt2_ref.load, i.e. model_weights/README.md, not the C code), runs
the forward of gpt2_ref.forward with its intermediate values kept, and a backward written by
hand (no autograd), per sentence. The loss is the trainer's (compiler/tlm/train.h): the
cross-entropy of every token t whose mask is set, predicted from the logits of position
t - 1, weighted by its sentence's weight, divided by the weighted count of those tokens.

usage: gpt2_train_ref.py WEIGHTS BATCH OUT
  BATCH: one sentence a line: "weight n tok_0 .. tok_{n-1} mask_0 .. mask_{n-1}"
  OUT:   little-endian float64: the loss, then the gradient of every parameter in file order
Run with /usr/bin/python3 (Debian's python3-numpy).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_ref import load  # noqa: E402

GELU_S = np.sqrt(2.0 / np.pi)


def ln_fwd(x, w, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    rstd = 1.0 / np.sqrt((xc ** 2).mean(-1, keepdims=True) + 1e-5)
    n = xc * rstd
    return n * w + b, (n, rstd)


def ln_bwd(dout, cache, w):
    n, rstd = cache
    dn = dout * w
    dx = rstd * (dn - dn.mean(-1, keepdims=True) - n * (dn * n).mean(-1, keepdims=True))
    return dx, (dout * n).sum(0), dout.sum(0)


def gelu_fwd(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_S * (x + 0.044715 * x ** 3)))


def gelu_bwd(dout, x):
    t = np.tanh(GELU_S * (x + 0.044715 * x ** 3))
    return dout * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_S * (1.0 + 3 * 0.044715 * x * x))


def attn_fwd(qkv, C, NH):
    T = qkv.shape[0]
    hs = C // NH
    q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, NH, hs).transpose(1, 0, 2) for i in range(3))
    s = q @ k.transpose(0, 2, 1) / np.sqrt(hs)
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    y = (a @ v).transpose(1, 0, 2).reshape(T, C)
    return y, (q, k, v, a)


def attn_bwd(dy, cache, C, NH):
    q, k, v, a = cache
    T = dy.shape[0]
    hs = C // NH
    dyh = dy.reshape(T, NH, hs).transpose(1, 0, 2)
    da = dyh @ v.transpose(0, 2, 1)
    dv = a.transpose(0, 2, 1) @ dyh
    ds = a * (da - (a * da).sum(-1, keepdims=True)) / np.sqrt(hs)
    dq = ds @ k
    dk = ds.transpose(0, 2, 1) @ q
    return np.concatenate([g.transpose(1, 0, 2).reshape(T, C) for g in (dq, dk, dv)], axis=1)


def zeros_like_model(m):
    g = {"wte": np.zeros_like(m["wte"]), "wpe": np.zeros_like(m["wpe"]),
         "lnf_w": np.zeros_like(m["lnf_w"]), "lnf_b": np.zeros_like(m["lnf_b"])}
    g["layers"] = [{k: np.zeros_like(v) for k, v in ly.items()} for ly in m["layers"]]
    return g


def sentence(m, g, tokens, mask, scale):
    """Adds scale * (sum of the masked cross-entropies) to the gradient g; returns that sum."""
    C, NH = m["C"], m["NH"]
    T = len(tokens)
    x = m["wte"][tokens] + m["wpe"][:T]
    caches = []
    for ly in m["layers"]:
        c = {"x": x}
        h, c["ln1"] = ln_fwd(x, ly["ln1_w"], ly["ln1_b"])
        c["h1"] = h
        y, c["attn"] = attn_fwd(h @ ly["qkv_w"] + ly["qkv_b"], C, NH)
        c["y"] = y
        x = x + y @ ly["proj_w"] + ly["proj_b"]
        h, c["ln2"] = ln_fwd(x, ly["ln2_w"], ly["ln2_b"])
        c["h2"] = h
        f = h @ ly["fc_w"] + ly["fc_b"]
        c["f"] = f
        c["fg"] = gelu_fwd(f)
        x = x + c["fg"] @ ly["fcp_w"] + ly["fcp_b"]
        caches.append(c)
    xf, cf = ln_fwd(x, m["lnf_w"], m["lnf_b"])
    logits = xf @ m["wte"].T  # (T, V)

    rows = np.array([t - 1 for t in range(1, T) if mask[t]], dtype=np.int64)
    tgt = np.array([tokens[t] for t in range(1, T) if mask[t]], dtype=np.int64)
    lg = logits[rows]
    lg = lg - lg.max(-1, keepdims=True)
    p = np.exp(lg)
    p /= p.sum(-1, keepdims=True)
    ce = -np.log(p[np.arange(len(rows)), tgt])
    dl = p
    dl[np.arange(len(rows)), tgt] -= 1.0
    dlogits = np.zeros_like(logits)
    dlogits[rows] = dl * scale

    g["wte"] += dlogits.T @ xf
    dx, dw, db = ln_bwd(dlogits @ m["wte"], cf, m["lnf_w"])
    g["lnf_w"] += dw
    g["lnf_b"] += db
    for ly, gl, c in reversed(list(zip(m["layers"], g["layers"], caches))):
        gl["fcp_w"] += c["fg"].T @ dx
        gl["fcp_b"] += dx.sum(0)
        df = gelu_bwd(dx @ ly["fcp_w"].T, c["f"])
        gl["fc_w"] += c["h2"].T @ df
        gl["fc_b"] += df.sum(0)
        dh, dw, db = ln_bwd(df @ ly["fc_w"].T, c["ln2"], ly["ln2_w"])
        gl["ln2_w"] += dw
        gl["ln2_b"] += db
        dx = dx + dh
        gl["proj_w"] += c["y"].T @ dx
        gl["proj_b"] += dx.sum(0)
        dqkv = attn_bwd(dx @ ly["proj_w"].T, c["attn"], C, NH)
        gl["qkv_w"] += c["h1"].T @ dqkv
        gl["qkv_b"] += dqkv.sum(0)
        dh, dw, db = ln_bwd(dqkv @ ly["qkv_w"].T, c["ln1"], ly["ln1_w"])
        gl["ln1_w"] += dw
        gl["ln1_b"] += db
        dx = dx + dh
    np.add.at(g["wte"], tokens, dx)
    g["wpe"][:T] += dx
    return ce.sum()


def flatten(g):
    parts = [g["wte"], g["wpe"]]
    for gl in g["layers"]:
        parts += [gl[k] for k in ("ln1_w", "ln1_b", "qkv_w", "qkv_b", "proj_w", "proj_b",
                                  "ln2_w", "ln2_b", "fc_w", "fc_b", "fcp_w", "fcp_b")]
    parts += [g["lnf_w"], g["lnf_b"]]
    return np.concatenate([p.ravel() for p in parts])


def main():
    if len(sys.argv) != 4:
        raise SystemExit(__doc__)
    m = load(sys.argv[1])
    batch = []
    with open(sys.argv[2]) as f:
        for line in f:
            if not line.strip():
                continue
            w = line.split()
            weight, n = float(w[0]), int(w[1])
            toks = np.array([int(t) for t in w[2:2 + n]], dtype=np.int64)
            mask = [int(t) != 0 for t in w[2 + n:2 + 2 * n]]
            batch.append((weight, toks, mask))
    total = sum(wt * sum(mk[1:]) for wt, _, mk in batch)
    g = zeros_like_model(m)
    loss = 0.0
    for wt, toks, mk in batch:
        loss += wt / total * sentence(m, g, toks, mk, wt / total)
    with open(sys.argv[3], "wb") as f:
        f.write(np.array([loss], dtype="<f8").tobytes())
        f.write(flatten(g).astype("<f8").tobytes())


if __name__ == "__main__":
    main()
