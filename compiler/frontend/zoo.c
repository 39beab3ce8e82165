/* zoo.c — the model zoo: graph builders for whole networks, at inference.
 *
 * Conventions shared by every model (proto/graph.md says the same for users):
 *  - Batch norm is folded into the preceding convolution (a conv2d + bias_add), as inference
 *    compilers do; dropout is gone.
 *  - Token models start from the embedding output [B*S, H]: the embedding lookup is a gather,
 *    which the IR does not have. The LM heads are dense layers.
 *  - Attention: the 1/sqrt(head_dim) scale is folded into the Q projection's weights. Heads
 *    are split and merged with 2-D transposes (batched over the leading dims) and views:
 *    with Q, K, V of shape [B*S, H], Qt = transpose([B, S, H]) viewed as [B*h, d, S], and
 *      scores = batch_matmul(Qt, Kt, transpose_a)          [B*h, S, S]   (+ mask add)
 *      ctxT   = batch_matmul(Vt, softmax(scores), transpose_b) [B*h, d, S]
 *      ctx    = transpose(ctxT viewed as [B, H, S])         [B, S, H]
 *    which is the exact computation (ctxT = V^T P^T). Masks (BERT's padding mask, the causal
 *    masks) are additive tensors of the scores' shape.
 *  - GELU is the exact erf form (GPT-2 uses the tanh approximation: same cost, tiny
 *    numerical difference). Q, K and V are three dense layers (GPT-2's fused c_attn would
 *    need a slice op; same FLOPs).
 *  - EfficientNet's squeeze-excitation multiplies x[N,C,H,W] by a gate s[N,C] broadcast over
 *    H and W. The IR has no broadcasting mul, but NCHW x is byte-identical to a view
 *    [1, N*C, H, W] and s to [N*C, 1, 1], and a 1x1 depthwise conv with that "weight" computes
 *    exactly x[n,c,h,w] * s[n,c]. So SE is global_avg_pool2d → dense+bias+silu →
 *    dense+bias+sigmoid → depthwise_conv2d(1x1) between views: exact, at any batch.
 *  - LLaMA's rotary embedding: rot(q) = q*cos + rotate_half(q)*sin per head, and
 *    rotate_half is a fixed signed permutation R of the head dimension, so with q viewed as
 *    [B*S*h, d]: rot(q) = dense(q, R) * sin + q * cos — a dense [d, d] with a mul and an add
 *    epilogue plus an elementwise mul. cos and sin are tables of q's shape. The extra dense
 *    costs 2*T*H*d FLOPs per projection (about 0.5% of the model). */
#include "compiler/frontend/frontend.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    fe_graph *g;
    tlm_error *err;
    int rc;
    int bi;
    char buf[8][FE_MAX_NAME + 1];
} zb;

/* A name in one of eight rotating buffers: enough for the arguments of one builder call. */
static const char *nm(zb *z, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *nm(zb *z, const char *fmt, ...)
{
    char *b = z->buf[z->bi++ & 7];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, FE_MAX_NAME + 1, fmt, ap);
    va_end(ap);
    return b;
}

static const char *input(zb *z, const char *name, bool param, int nd, int64_t d0, int64_t d1,
                         int64_t d2, int64_t d3)
{
    if (z->rc) return NULL;
    int64_t s[4] = {d0, d1, d2, d3};
    int v = fe_graph_add_input(z->g, name, nd, s, IR_FLOAT32, param, z->err);
    if (v < 0) {
        z->rc = v;
        return NULL;
    }
    return z->g->values[v].name;
}

static const char *node(zb *z, const char *name, const char *op, const fe_attrs *a, const char *i0,
                        const char *i1, const char *i2)
{
    if (z->rc) return NULL;
    const char *in[3] = {i0, i1, i2};
    int n = i2 ? 3 : i1 ? 2 : 1;
    int v = fe_graph_add_node(z->g, name, op, n, in, a, z->err);
    if (v < 0) {
        z->rc = v;
        return NULL;
    }
    return z->g->values[v].name;
}

/* Block helpers take their name prefix from nm()'s rotating buffers and call nm() more than
 * eight times, so they copy it first. */
#define KEEP(p)                                                                                    \
    char p##_copy[FE_MAX_NAME + 1];                                                                \
    snprintf(p##_copy, sizeof p##_copy, "%s", p);                                                  \
    p = p##_copy

static const fe_value *val(zb *z, const char *name)
{
    static const fe_value none = {.ndim = 4, .shape = {1, 1, 1, 1}};
    int v = name ? fe_graph_find(z->g, name) : -1;
    return v >= 0 ? &z->g->values[v] : &none;
}

/* ---- CNN blocks (NCHW) ---- */

/* conv2d + folded batch norm (bias) + optional activation. */
static const char *conv(zb *z, const char *p, const char *x, int64_t F, int64_t k, int64_t s,
                        int64_t groups, const char *act)
{
    KEEP(p);
    int64_t C = val(z, x)->shape[1];
    fe_attrs a = {.set = FE_A_STRIDE | FE_A_PAD, .stride = {s, s}, .pad = {k / 2, k / 2}};
    if (groups != 1) a.set |= FE_A_GROUPS, a.groups = groups;
    const char *w = input(z, nm(z, "%s.weight", p), true, 4, F, C / groups, k, k);
    const char *b = input(z, nm(z, "%s.bias", p), true, 1, F, 0, 0, 0);
    const char *y = node(z, nm(z, "%s", p), "conv2d", &a, x, w, NULL);
    y = node(z, nm(z, "%s.bn", p), "bias_add", NULL, y, b, NULL);
    if (act) y = node(z, nm(z, "%s.%s", p, act), act, NULL, y, NULL, NULL);
    return y;
}

static const char *dwconv(zb *z, const char *p, const char *x, int64_t k, int64_t s,
                          const char *act)
{
    KEEP(p);
    int64_t C = val(z, x)->shape[1];
    fe_attrs a = {.set = FE_A_STRIDE | FE_A_PAD, .stride = {s, s}, .pad = {k / 2, k / 2}};
    const char *w = input(z, nm(z, "%s.weight", p), true, 3, C, k, k, 0);
    const char *b = input(z, nm(z, "%s.bias", p), true, 1, C, 0, 0, 0);
    const char *y = node(z, nm(z, "%s", p), "depthwise_conv2d", &a, x, w, NULL);
    y = node(z, nm(z, "%s.bn", p), "bias_add", NULL, y, b, NULL);
    return node(z, nm(z, "%s.%s", p, act), act, NULL, y, NULL, NULL);
}

static const char *linear(zb *z, const char *p, const char *x, int64_t N, bool bias)
{
    KEEP(p);
    const fe_value *xv = val(z, x);
    int64_t K = xv->shape[xv->ndim - 1];
    const char *w = input(z, nm(z, "%s.weight", p), true, 2, K, N, 0, 0);
    const char *y = node(z, nm(z, "%s", p), "dense", NULL, x, w, NULL);
    if (!bias) return y;
    const char *b = input(z, nm(z, "%s.bias", p), true, 1, N, 0, 0, 0);
    return node(z, nm(z, "%s.bias_add", p), "bias_add", NULL, y, b, NULL);
}

/* Global average pool + dense classifier. */
static void classifier(zb *z, const char *x, int64_t classes)
{
    const char *y = node(z, "avgpool", "global_avg_pool2d", NULL, x, NULL, NULL);
    linear(z, "fc", y, classes, true);
}

static void resnet50(zb *z, const fe_zoo_opts *o)
{
    const char *x = input(z, "image", false, 4, o->batch, 3, o->image_size, o->image_size);
    x = conv(z, "conv1", x, 64, 7, 2, 1, "relu");
    fe_attrs mp = {.set = FE_A_KERNEL | FE_A_STRIDE | FE_A_PAD,
                   .kernel = {3, 3},
                   .stride = {2, 2},
                   .pad = {1, 1}};
    x = node(z, "maxpool", "max_pool2d", &mp, x, NULL, NULL);
    static const int blocks[4] = {3, 4, 6, 3};
    for (int l = 0; l < 4; l++) {
        int64_t width = 64 << l, out = width * 4;
        for (int b = 0; b < blocks[l]; b++) {
            int64_t s = b == 0 && l > 0 ? 2 : 1;
            const char *p = nm(z, "layer%d.%d", l + 1, b);
            char pre[32];
            snprintf(pre, sizeof pre, "%s", p);
            const char *y = conv(z, nm(z, "%s.conv1", pre), x, width, 1, 1, 1, "relu");
            y = conv(z, nm(z, "%s.conv2", pre), y, width, 3, s, 1, "relu"); /* v1.5 */
            y = conv(z, nm(z, "%s.conv3", pre), y, out, 1, 1, 1, NULL);
            const char *sc =
                b == 0 ? conv(z, nm(z, "%s.downsample", pre), x, out, 1, s, 1, NULL) : x;
            y = node(z, nm(z, "%s.add", pre), "add", NULL, y, sc, NULL);
            x = node(z, nm(z, "%s.relu", pre), "relu", NULL, y, NULL, NULL);
        }
    }
    classifier(z, x, 1000);
}

static void mobilenet_v2(zb *z, const fe_zoo_opts *o)
{
    const char *x = input(z, "image", false, 4, o->batch, 3, o->image_size, o->image_size);
    x = conv(z, "features.0", x, 32, 3, 2, 1, "relu6");
    static const int cfg[7][4] = {{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                  {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
    int idx = 1;
    for (int i = 0; i < 7; i++)
        for (int r = 0; r < cfg[i][2]; r++, idx++) {
            int64_t in = val(z, x)->shape[1], hidden = in * cfg[i][0], c = cfg[i][1];
            int64_t s = r == 0 ? cfg[i][3] : 1;
            char p[32];
            snprintf(p, sizeof p, "features.%d", idx);
            const char *y = x;
            if (cfg[i][0] != 1) y = conv(z, nm(z, "%s.expand", p), y, hidden, 1, 1, 1, "relu6");
            y = dwconv(z, nm(z, "%s.dw", p), y, 3, s, "relu6");
            y = conv(z, nm(z, "%s.project", p), y, c, 1, 1, 1, NULL);
            if (s == 1 && in == c) y = node(z, nm(z, "%s.add", p), "add", NULL, y, x, NULL);
            x = y;
        }
    x = conv(z, "features.18", x, 1280, 1, 1, 1, "relu6");
    classifier(z, x, 1000);
}

/* Squeeze-excitation on x [N, C, H, W] (see the top of the file for the broadcast). */
static const char *squeeze_excite(zb *z, const char *p, const char *x, int64_t squeeze)
{
    KEEP(p);
    const fe_value *xv = val(z, x);
    int64_t N = xv->shape[0], C = xv->shape[1], H = xv->shape[2], W = xv->shape[3];
    const char *s = node(z, nm(z, "%s.pool", p), "global_avg_pool2d", NULL, x, NULL, NULL);
    s = linear(z, nm(z, "%s.fc1", p), s, squeeze, true);
    s = node(z, nm(z, "%s.silu", p), "silu", NULL, s, NULL, NULL);
    s = linear(z, nm(z, "%s.fc2", p), s, C, true);
    s = node(z, nm(z, "%s.sigmoid", p), "sigmoid", NULL, s, NULL, NULL);
    fe_attrs gv = {.set = FE_A_SHAPE, .shape_ndim = 3, .shape = {N * C, 1, 1}};
    fe_attrs xv1 = {.set = FE_A_SHAPE, .shape_ndim = 4, .shape = {1, N * C, H, W}};
    fe_attrs back = {.set = FE_A_SHAPE, .shape_ndim = 4, .shape = {N, C, H, W}};
    const char *gate = node(z, nm(z, "%s.gate", p), "reshape", &gv, s, NULL, NULL);
    const char *flat = node(z, nm(z, "%s.view", p), "reshape", &xv1, x, NULL, NULL);
    const char *y = node(z, nm(z, "%s.scale", p), "depthwise_conv2d", NULL, flat, gate, NULL);
    return node(z, nm(z, "%s.out", p), "reshape", &back, y, NULL, NULL);
}

static void efficientnet_b0(zb *z, const fe_zoo_opts *o)
{
    const char *x = input(z, "image", false, 4, o->batch, 3, o->image_size, o->image_size);
    x = conv(z, "stem", x, 32, 3, 2, 1, "silu");
    /* expand ratio, kernel, stride, out channels, repeats */
    static const int cfg[7][5] = {{1, 3, 1, 16, 1}, {6, 3, 2, 24, 2},  {6, 5, 2, 40, 2},
                                  {6, 3, 2, 80, 3}, {6, 5, 1, 112, 3}, {6, 5, 2, 192, 4},
                                  {6, 3, 1, 320, 1}};
    for (int i = 0; i < 7; i++)
        for (int r = 0; r < cfg[i][4]; r++) {
            int64_t in = val(z, x)->shape[1], hidden = in * cfg[i][0], c = cfg[i][3];
            int64_t s = r == 0 ? cfg[i][2] : 1, se = in / 4 > 1 ? in / 4 : 1;
            char p[32];
            snprintf(p, sizeof p, "blocks.%d.%d", i, r);
            const char *y = x;
            if (cfg[i][0] != 1) y = conv(z, nm(z, "%s.expand", p), y, hidden, 1, 1, 1, "silu");
            y = dwconv(z, nm(z, "%s.dw", p), y, cfg[i][1], s, "silu");
            y = squeeze_excite(z, nm(z, "%s.se", p), y, se);
            y = conv(z, nm(z, "%s.project", p), y, c, 1, 1, 1, NULL);
            if (s == 1 && in == c) y = node(z, nm(z, "%s.add", p), "add", NULL, y, x, NULL);
            x = y;
        }
    x = conv(z, "head", x, 1280, 1, 1, 1, "silu");
    classifier(z, x, 1000);
}

/* ---- transformers ---- */

typedef struct {
    int64_t B, S, H, heads, ffn;
} tdims;

static fe_attrs shape3(int64_t a, int64_t b, int64_t c)
{
    return (fe_attrs){.set = FE_A_SHAPE, .shape_ndim = 3, .shape = {a, b, c}};
}

/* [B*S, H] (or any view of it) → Qt = [B*h, d, S]. */
static const char *split_heads(zb *z, const char *p, const char *x, const tdims *t)
{
    KEEP(p);
    fe_attrs v1 = shape3(t->B, t->S, t->H), v2 = shape3(t->B * t->heads, t->H / t->heads, t->S);
    x = node(z, nm(z, "%s.bsh", p), "reshape", &v1, x, NULL, NULL);
    x = node(z, nm(z, "%s.t", p), "transpose", NULL, x, NULL, NULL);
    return node(z, nm(z, "%s.heads", p), "reshape", &v2, x, NULL, NULL);
}

/* Multi-head attention over projected q, k, v; returns [B*S, H]. */
static const char *attention(zb *z, const char *p, const char *q, const char *k, const char *v,
                             const char *mask, const tdims *t)
{
    KEEP(p);
    const char *qt = split_heads(z, nm(z, "%s.q", p), q, t);
    const char *kt = split_heads(z, nm(z, "%s.k", p), k, t);
    const char *vt = split_heads(z, nm(z, "%s.v", p), v, t);
    fe_attrs ta = {.set = FE_A_TRANSPOSE_A, .transpose_a = true};
    fe_attrs tb = {.set = FE_A_TRANSPOSE_B, .transpose_b = true};
    const char *s = node(z, nm(z, "%s.scores", p), "batch_matmul", &ta, qt, kt, NULL);
    if (mask) s = node(z, nm(z, "%s.mask", p), "add", NULL, s, mask, NULL);
    s = node(z, nm(z, "%s.softmax", p), "softmax", NULL, s, NULL, NULL);
    const char *c = node(z, nm(z, "%s.ctxT", p), "batch_matmul", &tb, vt, s, NULL);
    fe_attrs v1 = shape3(t->B, t->H, t->S);
    fe_attrs v2 = {.set = FE_A_SHAPE, .shape_ndim = 2, .shape = {t->B * t->S, t->H}};
    c = node(z, nm(z, "%s.ctxT.bhs", p), "reshape", &v1, c, NULL, NULL);
    c = node(z, nm(z, "%s.ctx", p), "transpose", NULL, c, NULL, NULL);
    return node(z, nm(z, "%s.ctx.flat", p), "reshape", &v2, c, NULL, NULL);
}

static const char *layer_norm(zb *z, const char *p, const char *x, int64_t H, double eps)
{
    KEEP(p);
    fe_attrs a = {.set = FE_A_EPS, .eps = eps};
    const char *g = input(z, nm(z, "%s.weight", p), true, 1, H, 0, 0, 0);
    const char *b = input(z, nm(z, "%s.bias", p), true, 1, H, 0, 0, 0);
    return node(z, nm(z, "%s", p), "layer_norm", &a, x, g, b);
}

static const char *rms_norm(zb *z, const char *p, const char *x, int64_t H)
{
    KEEP(p);
    fe_attrs a = {.set = FE_A_EPS, .eps = 1e-6};
    const char *w = input(z, nm(z, "%s.weight", p), true, 1, H, 0, 0, 0);
    return node(z, nm(z, "%s", p), "rms_norm", &a, x, w, NULL);
}

static const char *residual(zb *z, const char *p, const char *y, const char *x)
{
    KEEP(p);
    return node(z, nm(z, "%s.residual", p), "add", NULL, y, x, NULL);
}

static void bert_base(zb *z, const fe_zoo_opts *o)
{
    tdims t = {o->batch, o->seq_len, 768, 12, 3072};
    int64_t T = t.B * t.S;
    const char *x = input(z, "embeddings", false, 2, T, t.H, 0, 0);
    const char *mask = input(z, "attention_mask", false, 3, t.B * t.heads, t.S, t.S, 0);
    x = layer_norm(z, "embeddings.ln", x, t.H, 1e-12);
    for (int l = 0; l < 12; l++) {
        char p[32];
        snprintf(p, sizeof p, "layer%d", l);
        const char *q = linear(z, nm(z, "%s.q", p), x, t.H, true);
        const char *k = linear(z, nm(z, "%s.k", p), x, t.H, true);
        const char *v = linear(z, nm(z, "%s.v", p), x, t.H, true);
        const char *a = attention(z, nm(z, "%s.attn", p), q, k, v, mask, &t);
        a = linear(z, nm(z, "%s.attn.out", p), a, t.H, true);
        a = residual(z, nm(z, "%s.attn", p), a, x);
        x = layer_norm(z, nm(z, "%s.ln1", p), a, t.H, 1e-12);
        const char *f = linear(z, nm(z, "%s.ffn.up", p), x, t.ffn, true);
        f = node(z, nm(z, "%s.ffn.gelu", p), "gelu", NULL, f, NULL, NULL);
        f = linear(z, nm(z, "%s.ffn.down", p), f, t.H, true);
        f = residual(z, nm(z, "%s.ffn", p), f, x);
        x = layer_norm(z, nm(z, "%s.ln2", p), f, t.H, 1e-12);
    }
}

static void gpt2(zb *z, const fe_zoo_opts *o)
{
    tdims t = {o->batch, o->seq_len, 768, 12, 3072};
    int64_t T = t.B * t.S;
    const char *x = input(z, "embeddings", false, 2, T, t.H, 0, 0);
    const char *mask = input(z, "causal_mask", true, 3, t.B * t.heads, t.S, t.S, 0);
    for (int l = 0; l < 12; l++) {
        char p[32];
        snprintf(p, sizeof p, "h%d", l);
        const char *h = layer_norm(z, nm(z, "%s.ln_1", p), x, t.H, 1e-5);
        const char *q = linear(z, nm(z, "%s.attn.q", p), h, t.H, true);
        const char *k = linear(z, nm(z, "%s.attn.k", p), h, t.H, true);
        const char *v = linear(z, nm(z, "%s.attn.v", p), h, t.H, true);
        const char *a = attention(z, nm(z, "%s.attn", p), q, k, v, mask, &t);
        a = linear(z, nm(z, "%s.attn.c_proj", p), a, t.H, true);
        x = residual(z, nm(z, "%s.attn", p), a, x);
        h = layer_norm(z, nm(z, "%s.ln_2", p), x, t.H, 1e-5);
        const char *f = linear(z, nm(z, "%s.mlp.c_fc", p), h, t.ffn, true);
        f = node(z, nm(z, "%s.mlp.gelu", p), "gelu", NULL, f, NULL, NULL);
        f = linear(z, nm(z, "%s.mlp.c_proj", p), f, t.H, true);
        x = residual(z, nm(z, "%s.mlp", p), f, x);
    }
    x = layer_norm(z, "ln_f", x, t.H, 1e-5);
    linear(z, "lm_head", x, 50257, false); /* tied to the token embedding */
}

/* Rotary embedding of a projection [T, H] → [T*h, d] (see the top of the file). */
static const char *rotary(zb *z, const char *p, const char *x, const tdims *t, const char *cos,
                          const char *sin, const char *rot)
{
    KEEP(p);
    int64_t d = t->H / t->heads;
    fe_attrs v = {.set = FE_A_SHAPE, .shape_ndim = 2, .shape = {t->B * t->S * t->heads, d}};
    x = node(z, nm(z, "%s.rows", p), "reshape", &v, x, NULL, NULL);
    const char *c = node(z, nm(z, "%s.cos", p), "mul", NULL, x, cos, NULL);
    const char *r = node(z, nm(z, "%s.rotate_half", p), "dense", NULL, x, rot, NULL);
    r = node(z, nm(z, "%s.sin", p), "mul", NULL, r, sin, NULL);
    return node(z, nm(z, "%s.rope", p), "add", NULL, r, c, NULL);
}

static void llama_7b(zb *z, const fe_zoo_opts *o)
{
    tdims t = {o->batch, o->seq_len, 4096, 32, 11008};
    int64_t T = t.B * t.S, d = t.H / t.heads;
    const char *x = input(z, "embeddings", false, 2, T, t.H, 0, 0);
    const char *mask = input(z, "causal_mask", true, 3, t.B * t.heads, t.S, t.S, 0);
    const char *cos = input(z, "rope.cos", true, 2, T * t.heads, d, 0, 0);
    const char *sin = input(z, "rope.sin", true, 2, T * t.heads, d, 0, 0);
    const char *rot = input(z, "rope.rotate_half", true, 2, d, d, 0, 0);
    for (int l = 0; l < 32; l++) {
        char p[32];
        snprintf(p, sizeof p, "layers.%d", l);
        const char *h = rms_norm(z, nm(z, "%s.attention_norm", p), x, t.H);
        const char *q = linear(z, nm(z, "%s.attention.wq", p), h, t.H, false);
        const char *k = linear(z, nm(z, "%s.attention.wk", p), h, t.H, false);
        const char *v = linear(z, nm(z, "%s.attention.wv", p), h, t.H, false);
        q = rotary(z, nm(z, "%s.attention.q", p), q, &t, cos, sin, rot);
        k = rotary(z, nm(z, "%s.attention.k", p), k, &t, cos, sin, rot);
        const char *a = attention(z, nm(z, "%s.attention", p), q, k, v, mask, &t);
        a = linear(z, nm(z, "%s.attention.wo", p), a, t.H, false);
        x = residual(z, nm(z, "%s.attention", p), a, x);
        h = rms_norm(z, nm(z, "%s.ffn_norm", p), x, t.H);
        const char *g = linear(z, nm(z, "%s.feed_forward.w1", p), h, t.ffn, false);
        g = node(z, nm(z, "%s.feed_forward.silu", p), "silu", NULL, g, NULL, NULL);
        const char *u = linear(z, nm(z, "%s.feed_forward.w3", p), h, t.ffn, false);
        g = node(z, nm(z, "%s.feed_forward.gate", p), "mul", NULL, g, u, NULL);
        g = linear(z, nm(z, "%s.feed_forward.w2", p), g, t.H, false);
        x = residual(z, nm(z, "%s.feed_forward", p), g, x);
    }
    x = rms_norm(z, "norm", x, t.H);
    linear(z, "output", x, 32000, false);
}

/* ---- registry ---- */

#define CNN FE_ZOO_BATCH | FE_ZOO_IMAGE_SIZE
#define LM FE_ZOO_BATCH | FE_ZOO_SEQ_LEN

static const fe_zoo_info zoo[] = {
    {"resnet50",
     "ResNet-50 v1.5 (torchvision), batch norm folded, ImageNet classifier",
     CNN,
     {1, 224, 0},
     {1, 32, 0},
     {256, 1024, 0}},
    {"mobilenet_v2",
     "MobileNetV2 1.0, batch norm folded, ImageNet classifier",
     CNN,
     {1, 224, 0},
     {1, 32, 0},
     {256, 1024, 0}},
    {"efficientnet_b0",
     "EfficientNet-B0 with squeeze-excitation, batch norm folded",
     CNN,
     {1, 224, 0},
     {1, 32, 0},
     {256, 1024, 0}},
    {"bert_base",
     "BERT-base encoder (12 layers, 768 hidden, 12 heads), from embeddings",
     LM,
     {1, 0, 128},
     {1, 0, 1},
     {256, 0, 512}},
    {"gpt2",
     "GPT-2 124M (12 layers, 768 hidden), from embeddings to logits",
     LM,
     {1, 0, 128},
     {1, 0, 1},
     {64, 0, 1024}},
    {"llama_7b",
     "LLaMA-7B (32 layers, 4096 hidden, 32 heads, 11008 FFN, RMSNorm, SwiGLU, "
     "rotary), from embeddings to logits",
     LM,
     {1, 0, 128},
     {1, 0, 1},
     {16, 0, 2048}},
};
#define N_ZOO ((int)(sizeof zoo / sizeof zoo[0]))

static void (*const builders[N_ZOO])(zb *, const fe_zoo_opts *) = {
    resnet50, mobilenet_v2, efficientnet_b0, bert_base, gpt2, llama_7b};

const fe_zoo_info *fe_zoo_list(int *n)
{
    if (n) *n = N_ZOO;
    return zoo;
}

const fe_zoo_info *fe_zoo_find(const char *name)
{
    for (int i = 0; name && i < N_ZOO; i++)
        if (strcmp(zoo[i].name, name) == 0) return &zoo[i];
    return NULL;
}

static const struct {
    const char *name;
    unsigned bit;
    size_t off;
} opt_fields[] = {
    {"batch", FE_ZOO_BATCH, offsetof(fe_zoo_opts, batch)},
    {"image_size", FE_ZOO_IMAGE_SIZE, offsetof(fe_zoo_opts, image_size)},
    {"seq_len", FE_ZOO_SEQ_LEN, offsetof(fe_zoo_opts, seq_len)},
};

static int64_t *opt_at(fe_zoo_opts *o, int i)
{
    return (int64_t *)((char *)o + opt_fields[i].off);
}

static const int64_t *opt_get(const fe_zoo_opts *o, int i)
{
    return (const int64_t *)((const char *)o + opt_fields[i].off);
}

static void opt_names(unsigned bits, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < 3; i++)
        if (bits & opt_fields[i].bit)
            k += snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", opt_fields[i].name);
}

/* prefix: "" for fe_zoo_build, "model." for fe_zoo_from_json. */
static int build(const char *name, const fe_zoo_opts *opts, const char *prefix, fe_graph **out,
                 tlm_error *err)
{
    *out = NULL;
    char f[48];
    const fe_zoo_info *info = fe_zoo_find(name);
    if (!info) {
        char list[160];
        size_t k = 0;
        for (int i = 0; i < N_ZOO; i++)
            k += snprintf(list + k, sizeof list - k, "%s%s", i ? ", " : "", zoo[i].name);
        snprintf(f, sizeof f, "%sname", prefix);
        return tlm_err_set(err, TLM_ENOTFOUND, f, "unknown model \"%.40s\"; available: %s",
                           name ? name : "", list);
    }
    fe_zoo_opts o = info->defaults;
    for (int i = 0; opts && i < 3; i++) {
        int64_t v = *opt_get(opts, i);
        if (!v) continue;
        snprintf(f, sizeof f, "%s%s", prefix, opt_fields[i].name);
        if (!(info->options & opt_fields[i].bit)) {
            char list[64];
            opt_names(info->options, list, sizeof list);
            return tlm_err_set(err, TLM_EINVAL, f, "%s takes only %s", info->name, list);
        }
        int64_t lo = *opt_get(&info->min, i), hi = *opt_get(&info->max, i);
        if (v < lo || v > hi)
            return tlm_err_set(err, TLM_EINVAL, f,
                               "must be an integer in [%lld, %lld] for %s "
                               "(got %lld)",
                               (long long)lo, (long long)hi, info->name, (long long)v);
        *opt_at(&o, i) = v;
    }
    zb *z = calloc(1, sizeof *z);
    if (!z) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    tlm_error ie = {0};
    z->err = &ie;
    if (fe_graph_new(info->name, &z->g)) {
        free(z);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    builders[info - zoo](z, &o);
    int rc = z->rc;
    if (rc) {
        /* Options within range can still make one tensor too large (batch x image or
         * batch x seq_len^2 x heads): blame the batch, the option that scales everything. */
        snprintf(f, sizeof f, "%sbatch", prefix);
        rc = tlm_err_set(err, rc == TLM_ENOMEM ? rc : TLM_ELIMIT, rc == TLM_ENOMEM ? "" : f,
                         "%s at these options exceeds a limit: %s: %s", info->name, ie.field,
                         ie.msg);
        fe_graph_free(z->g);
    } else
        *out = z->g;
    free(z);
    return rc;
}

int fe_zoo_build(const char *name, const fe_zoo_opts *opts, fe_graph **out, tlm_error *err)
{
    return build(name, opts, "", out, err);
}

int fe_zoo_from_json(const json_t *model, fe_graph **out, tlm_error *err)
{
    *out = NULL;
    if (!json_is_object(model))
        return tlm_err_set(err, TLM_EINVAL, "model",
                           "must be an object {\"name\": N, \"batch\": B, ...}");
    fe_zoo_opts o = {0};
    const char *k;
    json_t *v;
    const char *name = NULL;
    json_object_foreach((json_t *)model, k, v)
    {
        char f[48];
        snprintf(f, sizeof f, "model.%.32s", k);
        if (strcmp(k, "name") == 0) {
            if (!json_is_string(v)) return tlm_err_set(err, TLM_EINVAL, f, "must be a string");
            name = json_string_value(v);
            continue;
        }
        int i = 0;
        while (i < 3 && strcmp(k, opt_fields[i].name))
            i++;
        if (i == 3)
            return tlm_err_set(err, TLM_EINVAL, f,
                               "unknown field; allowed: name, batch, image_size, seq_len");
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return tlm_err_set(err, TLM_EINVAL, f, "must be a positive integer");
        *opt_at(&o, i) = json_integer_value(v);
    }
    if (!name) return tlm_err_set(err, TLM_EINVAL, "model.name", "required, a model name");
    return build(name, &o, "model.", out, err);
}

json_t *fe_zoo_list_json(void)
{
    json_t *a = json_array();
    for (int i = 0; a && i < N_ZOO; i++) {
        json_t *opts = json_object();
        for (int j = 0; opts && j < 3; j++) {
            if (!(zoo[i].options & opt_fields[j].bit)) continue;
            if (json_object_set_new(opts, opt_fields[j].name,
                                    json_pack("{s:I, s:I, s:I}", "default",
                                              (json_int_t)*opt_get(&zoo[i].defaults, j), "min",
                                              (json_int_t)*opt_get(&zoo[i].min, j), "max",
                                              (json_int_t)*opt_get(&zoo[i].max, j)))) {
                json_decref(opts);
                opts = NULL;
            }
        }
        json_t *m = opts ? json_pack("{s:s, s:s, s:o}", "name", zoo[i].name, "description",
                                     zoo[i].description, "options", opts)
                         : NULL;
        if (!m || json_array_append_new(a, m)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}
