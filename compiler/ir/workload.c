/* workload.c — op table, names, defaults, validation, canonical form and hash. */
#include "compiler/ir/ir.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>

#include "compiler/util/util.h"

static const ir_op_info op_table[IR_OP_COUNT] = {
    [IR_OP_DENSE] = {"dense", 3, {"M", "N", "K"}, IR_F_TRANSPOSE},
    [IR_OP_BATCH_MATMUL] = {"batch_matmul", 4, {"B", "M", "N", "K"}, IR_F_TRANSPOSE},
    [IR_OP_CONV2D] = {"conv2d",
                      7,
                      {"N", "C", "H", "W", "F", "KH", "KW"},
                      IR_F_STRIDE | IR_F_PAD | IR_F_DILATION | IR_F_GROUPS | IR_F_LAYOUT},
    [IR_OP_DEPTHWISE_CONV2D] = {"depthwise_conv2d",
                                6,
                                {"N", "C", "H", "W", "KH", "KW"},
                                IR_F_STRIDE | IR_F_PAD | IR_F_DILATION | IR_F_LAYOUT},
    [IR_OP_MAX_POOL2D] = {"max_pool2d", 6, {"N", "C", "H", "W", "KH", "KW"},
                          IR_F_STRIDE | IR_F_PAD | IR_F_LAYOUT},
    [IR_OP_AVG_POOL2D] = {"avg_pool2d", 6, {"N", "C", "H", "W", "KH", "KW"},
                          IR_F_STRIDE | IR_F_PAD | IR_F_LAYOUT},
    [IR_OP_GLOBAL_AVG_POOL2D] = {"global_avg_pool2d", 4, {"N", "C", "H", "W"}, IR_F_LAYOUT},
    [IR_OP_SOFTMAX] = {"softmax", 2, {"R", "C"}, 0},
    [IR_OP_LAYER_NORM] = {"layer_norm", 2, {"R", "C"}, IR_F_EPS},
    [IR_OP_RMS_NORM] = {"rms_norm", 2, {"R", "C"}, IR_F_EPS},
    [IR_OP_REDUCE_SUM] = {"reduce_sum", 2, {"R", "C"}, 0},
    [IR_OP_REDUCE_MEAN] = {"reduce_mean", 2, {"R", "C"}, 0},
    [IR_OP_REDUCE_MAX] = {"reduce_max", 2, {"R", "C"}, 0},
    [IR_OP_ELEMENTWISE] = {"elementwise", 1, {"N"}, 0},
    [IR_OP_TRANSPOSE] = {"transpose", 2, {"R", "C"}, 0},
};

static const char *dtype_names[IR_DTYPE_COUNT] = {"float32", "float16", "bfloat16"};
static const char *layout_names[IR_LAYOUT_COUNT] = {"NCHW", "NHWC"};
static const char *epi_names[IR_EPI_COUNT] = {"bias_add", "add",  "mul",     "relu", "relu6",
                                              "gelu",     "silu", "sigmoid", "tanh"};

const ir_op_info *ir_op_get(ir_op op)
{
    return (unsigned)op < IR_OP_COUNT ? &op_table[op] : NULL;
}

int ir_op_from_name(const char *name, ir_op *out)
{
    if (!name) return TLM_EINVAL;
    if (strcmp(name, "matmul") == 0) {
        *out = IR_OP_DENSE;
        return 0;
    }
    for (int i = 0; i < IR_OP_COUNT; i++)
        if (strcmp(name, op_table[i].name) == 0) {
            *out = (ir_op)i;
            return 0;
        }
    return TLM_EINVAL;
}

const char *ir_dtype_name(ir_dtype t)
{
    return (unsigned)t < IR_DTYPE_COUNT ? dtype_names[t] : "?";
}

int ir_dtype_from_name(const char *name, ir_dtype *out)
{
    for (int i = 0; name && i < IR_DTYPE_COUNT; i++)
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (ir_dtype)i;
            return 0;
        }
    return TLM_EINVAL;
}

size_t ir_dtype_size(ir_dtype t)
{
    return t == IR_FLOAT32 ? 4 : 2;
}

const char *ir_layout_name(ir_layout l)
{
    return (unsigned)l < IR_LAYOUT_COUNT ? layout_names[l] : "?";
}

int ir_layout_from_name(const char *name, ir_layout *out)
{
    for (int i = 0; name && i < IR_LAYOUT_COUNT; i++)
        if (strcmp(name, layout_names[i]) == 0) {
            *out = (ir_layout)i;
            return 0;
        }
    return TLM_EINVAL;
}

const char *ir_epilogue_name(ir_epilogue e)
{
    return (unsigned)e < IR_EPI_COUNT ? epi_names[e] : "?";
}

int ir_epilogue_from_name(const char *name, ir_epilogue *out)
{
    if (name && strcmp(name, "swish") == 0) { /* swish(x) = x*sigmoid(x) = silu */
        *out = IR_EPI_SILU;
        return 0;
    }
    for (int i = 0; name && i < IR_EPI_COUNT; i++)
        if (strcmp(name, epi_names[i]) == 0) {
            *out = (ir_epilogue)i;
            return 0;
        }
    return TLM_EINVAL;
}

int ir_op_key_index(ir_op op, const char *key)
{
    const ir_op_info *in = ir_op_get(op);
    for (int i = 0; in && key && i < in->n_keys; i++)
        if (strcmp(in->keys[i], key) == 0) return i;
    return -1;
}

static bool is_pool(ir_op op)
{
    return op == IR_OP_MAX_POOL2D || op == IR_OP_AVG_POOL2D;
}

void ir_workload_init(ir_workload *w, ir_op op)
{
    memset(w, 0, sizeof *w);
    w->op = op;
    w->dtype = IR_FLOAT32;
    if (!is_pool(op)) w->stride[0] = w->stride[1] = 1;
    w->dilation[0] = w->dilation[1] = 1;
    w->groups = 1;
    w->layout = IR_NCHW;
    w->eps = 1e-5;
}

void ir_workload_normalize(ir_workload *w)
{
    if (is_pool(w->op)) {
        if (w->stride[0] == 0) w->stride[0] = w->shape[IR_DW_KH];
        if (w->stride[1] == 0) w->stride[1] = w->shape[IR_DW_KW];
    }
}

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d)
{
    int64_t span = d * (k - 1) + 1;
    int64_t num = in + 2 * p - span;
    return num < 0 ? 0 : num / s + 1;
}

void ir_workload_out_hw(const ir_workload *w, int64_t *oh, int64_t *ow)
{
    ir_workload n = *w;
    ir_workload_normalize(&n);
    const int64_t *s = n.shape;
    int kh = n.op == IR_OP_CONV2D ? IR_CONV_KH : IR_DW_KH;
    int kw = n.op == IR_OP_CONV2D ? IR_CONV_KW : IR_DW_KW;
    int h = n.op == IR_OP_CONV2D ? IR_CONV_H : IR_DW_H;
    int wd = n.op == IR_OP_CONV2D ? IR_CONV_W : IR_DW_W;
    *oh = conv_out(s[h], s[kh], n.stride[0], n.pad[0], n.dilation[0]);
    *ow = conv_out(s[wd], s[kw], n.stride[1], n.pad[1], n.dilation[1]);
}

bool ir_conv_pointwise(const ir_workload *w)
{
    return w->op == IR_OP_CONV2D && w->shape[IR_CONV_KH] == 1 && w->shape[IR_CONV_KW] == 1 &&
           w->stride[0] == 1 && w->stride[1] == 1 && w->pad[0] == 0 && w->pad[1] == 0;
}

/* Product of n extents with overflow detection against limit. */
static bool prod_ok(const int64_t *v, int n, int64_t limit, int64_t *out)
{
    int64_t p = 1;
    for (int i = 0; i < n; i++)
        if (__builtin_mul_overflow(p, v[i], &p) || p > limit) return false;
    *out = p;
    return true;
}

int ir_workload_check(const ir_workload *win, tlm_error *err)
{
    if ((unsigned)win->op >= IR_OP_COUNT)
        return tlm_err_set(err, TLM_EINVAL, "op", "unknown op");
    ir_workload wv = *win, *w = &wv;
    ir_workload_normalize(w);
    const ir_op_info *in = ir_op_get(w->op);
    char f[32];
    for (int i = 0; i < in->n_keys; i++) {
        snprintf(f, sizeof f, "shape.%s", in->keys[i]);
        if (w->shape[i] <= 0)
            return tlm_err_set(err, TLM_EINVAL, f, "must be a positive integer (got %lld)",
                               (long long)w->shape[i]);
        if (w->shape[i] > IR_MAX_ELEMS)
            return tlm_err_set(err, TLM_EINVAL, f, "must be at most 2^34 (got %lld)",
                               (long long)w->shape[i]);
    }
    if ((unsigned)w->dtype >= IR_DTYPE_COUNT)
        return tlm_err_set(err, TLM_EINVAL, "dtype", "must be float32, float16 or bfloat16");
    if ((unsigned)w->layout >= IR_LAYOUT_COUNT)
        return tlm_err_set(err, TLM_EINVAL, "layout", "must be NCHW or NHWC");
    if (w->n_epilogue < 0 || w->n_epilogue > IR_MAX_EPILOGUE)
        return tlm_err_set(err, TLM_EINVAL, "epilogue", "at most %d entries", IR_MAX_EPILOGUE);
    for (int i = 0; i < w->n_epilogue; i++)
        if ((unsigned)w->epilogue[i] >= IR_EPI_COUNT) {
            snprintf(f, sizeof f, "epilogue[%d]", i);
            return tlm_err_set(err, TLM_EINVAL, f, "unknown epilogue");
        }
    if (w->op == IR_OP_ELEMENTWISE && w->n_epilogue == 0)
        return tlm_err_set(err, TLM_EINVAL, "epilogue",
                           "elementwise needs a non-empty epilogue (it is the computation)");
    if (in->fields & IR_F_EPS)
        if (!(w->eps > 0) || !isfinite(w->eps) || w->eps > 1)
            return tlm_err_set(err, TLM_EINVAL, "eps", "must be a number in (0, 1] (got %g)",
                               w->eps);

    const int64_t *s = w->shape;
    /* Input and output element counts, each bounded by 2^34. */
    int64_t tens[4][IR_MAX_DIMS];
    int nd[4] = {0}, nt = 0;
    int64_t red = 1; /* reduction extent per output element */
    int64_t oh = 1, ow = 1;
    bool spatial = w->op == IR_OP_CONV2D || w->op == IR_OP_DEPTHWISE_CONV2D || is_pool(w->op);
    if (spatial) {
        int kh = w->op == IR_OP_CONV2D ? IR_CONV_KH : IR_DW_KH;
        int kw = kh + 1;
        for (int d = 0; d < 2; d++) {
            const char *nm[3] = {"stride", "pad", "dilation"};
            int64_t v[3] = {w->stride[d], w->pad[d], w->dilation[d]};
            for (int j = 0; j < 3; j++) {
                snprintf(f, sizeof f, "%s[%d]", nm[j], d);
                int64_t lo = j == 1 ? 0 : 1;
                if (v[j] < lo || v[j] > 65536)
                    return tlm_err_set(err, TLM_EINVAL, f, "must be an integer in [%lld, 65536]"
                                       " (got %lld)", (long long)lo, (long long)v[j]);
            }
            /* Pools take no dilation: it is not in their canonical form, so any other value
             * would compute something the workload hash does not name. */
            if (!(in->fields & IR_F_DILATION) && w->dilation[d] != 1) {
                snprintf(f, sizeof f, "dilation[%d]", d);
                return tlm_err_set(err, TLM_EINVAL, f, "%s takes no dilation (must be 1, got %lld)",
                                   in->name, (long long)w->dilation[d]);
            }
            if (is_pool(w->op) && 2 * w->pad[d] > s[kh + d]) {
                snprintf(f, sizeof f, "pad[%d]", d);
                return tlm_err_set(err, TLM_EINVAL, f,
                                   "must be at most half the pooling window (%lld)",
                                   (long long)(s[kh + d] / 2));
            }
        }
        (void)kw;
        ir_workload_out_hw(w, &oh, &ow);
        if (oh <= 0 || ow <= 0)
            return tlm_err_set(err, TLM_EINVAL, oh <= 0 ? "shape.H" : "shape.W",
                               "the output would be empty: input %lldx%lld is smaller than the "
                               "dilated window with padding",
                               (long long)s[IR_CONV_H], (long long)s[IR_CONV_W]);
    }
    switch (w->op) {
    case IR_OP_DENSE:
        tens[nt][0] = s[IR_DENSE_M], tens[nt][1] = s[IR_DENSE_K], nd[nt++] = 2;
        tens[nt][0] = s[IR_DENSE_K], tens[nt][1] = s[IR_DENSE_N], nd[nt++] = 2;
        tens[nt][0] = s[IR_DENSE_M], tens[nt][1] = s[IR_DENSE_N], nd[nt++] = 2;
        red = s[IR_DENSE_K];
        break;
    case IR_OP_BATCH_MATMUL:
        tens[nt][0] = s[IR_BMM_B], tens[nt][1] = s[IR_BMM_M], tens[nt][2] = s[IR_BMM_K], nd[nt++] = 3;
        tens[nt][0] = s[IR_BMM_B], tens[nt][1] = s[IR_BMM_K], tens[nt][2] = s[IR_BMM_N], nd[nt++] = 3;
        tens[nt][0] = s[IR_BMM_B], tens[nt][1] = s[IR_BMM_M], tens[nt][2] = s[IR_BMM_N], nd[nt++] = 3;
        red = s[IR_BMM_K];
        break;
    case IR_OP_CONV2D: {
        int64_t g = w->groups;
        if (g < 1 || g > s[IR_CONV_C])
            return tlm_err_set(err, TLM_EINVAL, "groups", "must be an integer in [1, C=%lld]",
                               (long long)s[IR_CONV_C]);
        if (s[IR_CONV_C] % g)
            return tlm_err_set(err, TLM_EINVAL, "groups", "must divide C=%lld (got %lld)",
                               (long long)s[IR_CONV_C], (long long)g);
        if (s[IR_CONV_F] % g)
            return tlm_err_set(err, TLM_EINVAL, "groups", "must divide F=%lld (got %lld)",
                               (long long)s[IR_CONV_F], (long long)g);
        /* A grouped conv indexes channels as g*(C/G) + c and g*(F/G) + f: the per-group
         * counts become int32 affine coefficients. */
        if (g > 1 && (s[IR_CONV_C] / g > INT32_MAX || s[IR_CONV_F] / g > INT32_MAX))
            return tlm_err_set(err, TLM_EINVAL, "groups",
                               "channels per group (C/groups, F/groups) must stay below 2^31");
        int64_t x[4] = {s[IR_CONV_N], s[IR_CONV_C], s[IR_CONV_H], s[IR_CONV_W]};
        int64_t k[4] = {s[IR_CONV_F], s[IR_CONV_C] / g, s[IR_CONV_KH], s[IR_CONV_KW]};
        int64_t o[4] = {s[IR_CONV_N], s[IR_CONV_F], oh, ow};
        memcpy(tens[nt], x, sizeof x), nd[nt++] = 4;
        memcpy(tens[nt], k, sizeof k), nd[nt++] = 4;
        memcpy(tens[nt], o, sizeof o), nd[nt++] = 4;
        int64_t rk[3] = {s[IR_CONV_C] / g, s[IR_CONV_KH], s[IR_CONV_KW]};
        if (!prod_ok(rk, 3, IR_MAX_ELEMS, &red))
            return tlm_err_set(err, TLM_EINVAL, "shape",
                               "the weight tensor would exceed 2^34 elements");
        break;
    }
    case IR_OP_DEPTHWISE_CONV2D:
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D: {
        int64_t x[4] = {s[IR_DW_N], s[IR_DW_C], s[IR_DW_H], s[IR_DW_W]};
        int64_t k[3] = {s[IR_DW_C], s[IR_DW_KH], s[IR_DW_KW]};
        int64_t o[4] = {s[IR_DW_N], s[IR_DW_C], oh, ow};
        memcpy(tens[nt], x, sizeof x), nd[nt++] = 4;
        memcpy(tens[nt], k, sizeof k), nd[nt++] = 3;
        memcpy(tens[nt], o, sizeof o), nd[nt++] = 4;
        if (s[IR_DW_KH] > IR_MAX_ELEMS / s[IR_DW_KW])
            return tlm_err_set(err, TLM_EINVAL, "shape.KW", "window too large");
        red = s[IR_DW_KH] * s[IR_DW_KW];
        break;
    }
    case IR_OP_GLOBAL_AVG_POOL2D: {
        int64_t x[4] = {s[IR_GP_N], s[IR_GP_C], s[IR_GP_H], s[IR_GP_W]};
        memcpy(tens[nt], x, sizeof x), nd[nt++] = 4;
        red = 1;
        break;
    }
    case IR_OP_ELEMENTWISE:
        tens[nt][0] = s[IR_EW_N], nd[nt++] = 1;
        break;
    default: /* row ops: outn below is the input's R*C, which already is the work */
        tens[nt][0] = s[IR_ROW_R], tens[nt][1] = s[IR_ROW_C], nd[nt++] = 2;
        red = 1;
        break;
    }
    static const char *tn[4] = {"input", "weight", "output", "tensor"};
    int64_t outn = 1, cnt;
    for (int t = 0; t < nt; t++) {
        if (!prod_ok(tens[t], nd[t], IR_MAX_ELEMS, &cnt))
            return tlm_err_set(err, TLM_EINVAL, "shape",
                               "the %s tensor would exceed 2^34 elements", tn[t < 3 ? t : 3]);
        outn = cnt; /* the last one is the output (or the only input) */
    }
    /* Total work must stay far from 64-bit overflow: FLOP counters multiply by small factors. */
    int64_t work;
    int64_t wv2[2] = {outn, red};
    if (!prod_ok(wv2, 2, INT64_C(1) << 56, &work))
        return tlm_err_set(err, TLM_EINVAL, "shape",
                           "the operation is too large: output elements x reduction extent "
                           "exceeds 2^56");
    return 0;
}

/* ---- canonical form ---- */

typedef struct {
    char *p;
    size_t cap, len;
} sbuf;

static void sb_add(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p + (b->len < b->cap ? b->len : b->cap),
                      b->len < b->cap ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) b->len += (size_t)n;
}

int ir_workload_canonical(const ir_workload *win, char *buf, size_t cap)
{
    ir_workload w = *win;
    ir_workload_normalize(&w);
    const ir_op_info *in = ir_op_get(w.op);
    if (!in || cap == 0) return TLM_EINVAL;
    sbuf b = {buf, cap, 0};
    buf[0] = 0;
    unsigned fl = in->fields;
    /* Keys in sorted order: dilation dtype epilogue eps groups layout op pad shape stride
     * transpose_a transpose_b. */
    sb_add(&b, "{");
    if (fl & IR_F_DILATION)
        sb_add(&b, "\"dilation\":[%lld,%lld],", (long long)w.dilation[0],
               (long long)w.dilation[1]);
    sb_add(&b, "\"dtype\":\"%s\",\"epilogue\":[", ir_dtype_name(w.dtype));
    for (int i = 0; i < w.n_epilogue; i++)
        sb_add(&b, "%s\"%s\"", i ? "," : "", ir_epilogue_name(w.epilogue[i]));
    sb_add(&b, "],");
    if (fl & IR_F_EPS) sb_add(&b, "\"eps\":%.17g,", w.eps);
    if (fl & IR_F_GROUPS) sb_add(&b, "\"groups\":%lld,", (long long)w.groups);
    if (fl & IR_F_LAYOUT) sb_add(&b, "\"layout\":\"%s\",", ir_layout_name(w.layout));
    sb_add(&b, "\"op\":\"%s\",", in->name);
    if (fl & IR_F_PAD) sb_add(&b, "\"pad\":[%lld,%lld],", (long long)w.pad[0], (long long)w.pad[1]);
    /* shape keys sorted by name */
    int order[IR_MAX_KEYS];
    for (int i = 0; i < in->n_keys; i++) order[i] = i;
    for (int i = 1; i < in->n_keys; i++)
        for (int j = i; j > 0 && strcmp(in->keys[order[j - 1]], in->keys[order[j]]) > 0; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    sb_add(&b, "\"shape\":{");
    for (int i = 0; i < in->n_keys; i++)
        sb_add(&b, "%s\"%s\":%lld", i ? "," : "", in->keys[order[i]],
               (long long)w.shape[order[i]]);
    sb_add(&b, "}");
    if (fl & IR_F_STRIDE)
        sb_add(&b, ",\"stride\":[%lld,%lld]", (long long)w.stride[0], (long long)w.stride[1]);
    if (fl & IR_F_TRANSPOSE)
        sb_add(&b, ",\"transpose_a\":%s,\"transpose_b\":%s", w.transpose_a ? "true" : "false",
               w.transpose_b ? "true" : "false");
    sb_add(&b, "}");
    if (b.len >= cap) return TLM_ELIMIT;
    return (int)b.len;
}

int ir_workload_hash(const ir_workload *w, uint8_t out[32])
{
    char buf[1024];
    int n = ir_workload_canonical(w, buf, sizeof buf);
    if (n < 0) return n;
    static const char prefix[] = "tlm-workload-v1\n";
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) return TLM_ENOMEM;
    unsigned int len = 0;
    int ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(ctx, prefix, sizeof prefix - 1) &&
             EVP_DigestUpdate(ctx, buf, (size_t)n) && EVP_DigestFinal_ex(ctx, out, &len);
    EVP_MD_CTX_free(ctx);
    return ok && len == 32 ? 0 : TLM_EIO;
}

int ir_workload_hash_hex(const ir_workload *w, char out[IR_HASH_HEX])
{
    uint8_t h[32];
    int rc = ir_workload_hash(w, h);
    if (rc) return rc;
    tlm_hex(h, 32, out);
    return 0;
}
