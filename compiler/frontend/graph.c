/* graph.c — graph building, per-node validation and shape inference, JSON in and out.
 *
 * Every node is checked as it is added, so a graph that exists is a valid one; the JSON
 * decoder only adds the document-level checks (types, unknown keys, names, cycles) and then
 * adds the nodes in topological order through the same path as the builder. */
#include "compiler/frontend/frontend.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- name table: open addressing over value indices ---- */

struct fe_names {
    int cap;   /* power of two */
    int *slot; /* value index + 1, 0 = empty */
};

static uint32_t name_hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static int names_find(const fe_graph *g, const char *name)
{
    const struct fe_names *t = g->names;
    for (uint32_t i = name_hash(name) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        int v = t->slot[i] - 1;
        if (v < 0) return -1;
        if (strcmp(g->values[v].name, name) == 0) return v;
    }
}

static int names_insert(fe_graph *g, int v)
{
    struct fe_names *t = g->names;
    if (2 * (g->n_values + 1) > t->cap) { /* keep the load under one half */
        int cap = t->cap * 2;
        int *slot = calloc(cap, sizeof *slot);
        if (!slot) return TLM_ENOMEM;
        for (int i = 0; i < t->cap; i++) {
            if (!t->slot[i]) continue;
            uint32_t j = name_hash(g->values[t->slot[i] - 1].name) & (cap - 1);
            while (slot[j])
                j = (j + 1) & (cap - 1);
            slot[j] = t->slot[i];
        }
        free(t->slot);
        t->slot = slot, t->cap = cap;
    }
    uint32_t j = name_hash(g->values[v].name) & (t->cap - 1);
    while (t->slot[j])
        j = (j + 1) & (t->cap - 1);
    t->slot[j] = v + 1;
    return 0;
}

/* ---- small helpers ---- */

static void fmt_shape(char *buf, size_t cap, int ndim, const int64_t *s)
{
    size_t n = 0;
    n += snprintf(buf + n, cap - n, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)s[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int64_t numel(int ndim, const int64_t *s)
{
    int64_t p = 1;
    for (int i = 0; i < ndim; i++)
        p *= s[i];
    return p;
}

/* Error on "nodes[idx]<sub>". */
static int nerr(tlm_error *err, int code, int idx, const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int nerr(tlm_error *err, int code, int idx, const char *sub, const char *fmt, ...)
{
    char field[96], msg[512];
    snprintf(field, sizeof field, "nodes[%d]%s", idx, sub ? sub : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tlm_err_set(err, code, field, "%s", msg);
}

int fe_graph_new(const char *name, fe_graph **out)
{
    *out = NULL;
    fe_graph *g = calloc(1, sizeof *g);
    if (!g) return TLM_ENOMEM;
    g->names = calloc(1, sizeof *g->names);
    if (g->names) {
        g->names->cap = 64;
        g->names->slot = calloc(64, sizeof(int));
    }
    g->name = strdup(name ? name : "");
    if (!g->names || !g->names->slot || !g->name) {
        fe_graph_free(g);
        return TLM_ENOMEM;
    }
    *out = g;
    return 0;
}

void fe_graph_free(fe_graph *g)
{
    if (!g) return;
    for (int i = 0; i < g->n_values; i++)
        free(g->values[i].name);
    free(g->values);
    free(g->nodes);
    free(g->outputs);
    if (g->names) free(g->names->slot);
    free(g->names);
    free(g->name);
    free(g);
}

int fe_graph_find(const fe_graph *g, const char *name)
{
    return names_find(g, name);
}

/* Checks a name for a new value; field is where the name came from. */
static int check_name(const fe_graph *g, const char *name, const char *field, tlm_error *err)
{
    size_t n = strlen(name);
    if (n == 0 || n > FE_MAX_NAME)
        return tlm_err_set(err, TLM_EINVAL, field, "must be a string of 1 to %d bytes",
                           FE_MAX_NAME);
    if (names_find(g, name) >= 0)
        return tlm_err_set(err, TLM_EINVAL, field,
                           "duplicate name \"%.64s\": input and node names must be unique", name);
    return 0;
}

/* Appends a value (name already checked); returns its index. */
static int push_value(fe_graph *g, const char *name, int ndim, const int64_t *shape, ir_dtype dtype,
                      bool param, int producer)
{
    if (g->n_values >= FE_MAX_VALUES) return TLM_ELIMIT;
    if (g->n_values == g->cap_values) {
        int cap = g->cap_values ? 2 * g->cap_values : 64;
        fe_value *v = realloc(g->values, cap * sizeof *v);
        if (!v) return TLM_ENOMEM;
        g->values = v, g->cap_values = cap;
    }
    fe_value *v = &g->values[g->n_values];
    memset(v, 0, sizeof *v);
    v->name = strdup(name);
    if (!v->name) return TLM_ENOMEM;
    v->ndim = ndim;
    memcpy(v->shape, shape, ndim * sizeof *shape);
    v->dtype = dtype, v->param = param, v->producer = producer;
    int rc = names_insert(g, g->n_values);
    if (rc) {
        free(v->name);
        return rc;
    }
    return g->n_values++;
}

/* Rank 1..IR_MAX_DIMS, extents in [1, 2^34], element count in [1, 2^34]. */
static int check_shape(int ndim, const int64_t *shape, const char *field, tlm_error *err)
{
    if (ndim < 1 || ndim > IR_MAX_DIMS)
        return tlm_err_set(err, TLM_EINVAL, field, "must have 1 to %d dimensions (got %d)",
                           IR_MAX_DIMS, ndim);
    int64_t p = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1 || shape[i] > IR_MAX_ELEMS)
            return tlm_err_set(err, TLM_EINVAL, field,
                               "dimension %d must be an integer in [1, 2^34] (got %lld)", i,
                               (long long)shape[i]);
        if (__builtin_mul_overflow(p, shape[i], &p) || p > IR_MAX_ELEMS)
            return tlm_err_set(err, TLM_ELIMIT, field, "more than 2^34 elements");
    }
    return 0;
}

int fe_graph_add_input(fe_graph *g, const char *name, int ndim, const int64_t *shape,
                       ir_dtype dtype, bool param, tlm_error *err)
{
    char field[64];
    int idx = 0;
    for (int i = 0; i < g->n_values; i++)
        idx += g->values[i].producer < 0;
    snprintf(field, sizeof field, "inputs[%d].name", idx);
    int rc = check_name(g, name, field, err);
    if (rc) return rc;
    snprintf(field, sizeof field, "inputs[%d].shape", idx);
    if ((rc = check_shape(ndim, shape, field, err))) return rc;
    if ((unsigned)dtype >= IR_DTYPE_COUNT) {
        snprintf(field, sizeof field, "inputs[%d].dtype", idx);
        return tlm_err_set(err, TLM_EINVAL, field, "must be float32, float16 or bfloat16");
    }
    rc = push_value(g, name, ndim, shape, dtype, param, -1);
    if (rc == TLM_ELIMIT)
        return tlm_err_set(err, rc, "inputs", "more than %d values", FE_MAX_VALUES);
    if (rc < 0) return tlm_err_set(err, rc, "", "out of memory");
    return rc;
}

int fe_graph_add_output(fe_graph *g, const char *name, tlm_error *err)
{
    char field[32];
    snprintf(field, sizeof field, "outputs[%d]", g->n_outputs);
    int v = names_find(g, name);
    if (v < 0) return tlm_err_set(err, TLM_EINVAL, field, "unknown value name \"%.64s\"", name);
    for (int i = 0; i < g->n_outputs; i++)
        if (g->outputs[i] == v)
            return tlm_err_set(err, TLM_EINVAL, field, "\"%.64s\" is listed twice", name);
    int *o = realloc(g->outputs, (g->n_outputs + 1) * sizeof *o);
    if (!o) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    g->outputs = o;
    g->outputs[g->n_outputs++] = v;
    return 0;
}

/* ---- ops ---- */

static const char *const view_names[] = {"reshape", "flatten"};

/* Resolves an op name into n's kind and op/epi/view. */
static int parse_op(const char *op, fe_node *n, int idx, tlm_error *err)
{
    for (int i = 0; i < 2; i++)
        if (strcmp(op, view_names[i]) == 0) {
            n->kind = FE_NODE_VIEW, n->view = (fe_view)i;
            return 0;
        }
    if (ir_epilogue_from_name(op, &n->epi) == 0) {
        n->kind = FE_NODE_EPILOGUE;
        return 0;
    }
    if (ir_op_from_name(op, &n->op) == 0 && n->op != IR_OP_ELEMENTWISE) {
        n->kind = FE_NODE_ANCHOR;
        return 0;
    }
    return nerr(err, TLM_EUNSUPPORTED, idx, ".op",
                "unknown op \"%.40s\"; allowed: dense (matmul), batch_matmul, conv2d, "
                "depthwise_conv2d, max_pool2d, avg_pool2d, global_avg_pool2d, softmax, "
                "layer_norm, rms_norm, reduce_sum, reduce_mean, reduce_max, transpose, "
                "bias_add, add, mul, relu, relu6, gelu, silu, sigmoid, tanh, reshape, flatten",
                op);
}

static const char *op_name(const fe_node *n)
{
    switch (n->kind) {
    case FE_NODE_ANCHOR:
        return ir_op_get(n->op)->name;
    case FE_NODE_EPILOGUE:
        return ir_epilogue_name(n->epi);
    default:
        return view_names[n->view];
    }
}

static int arity(const fe_node *n)
{
    switch (n->kind) {
    case FE_NODE_VIEW:
        return 1;
    case FE_NODE_EPILOGUE:
        return n->epi == IR_EPI_BIAS_ADD || n->epi == IR_EPI_ADD || n->epi == IR_EPI_MUL ? 2 : 1;
    default:
        switch (n->op) {
        case IR_OP_DENSE:
        case IR_OP_BATCH_MATMUL:
        case IR_OP_CONV2D:
        case IR_OP_DEPTHWISE_CONV2D:
        case IR_OP_RMS_NORM:
            return 2;
        case IR_OP_LAYER_NORM:
            return 3;
        default:
            return 1;
        }
    }
}

static const struct {
    const char *name;
    unsigned bit;
} attr_names[] = {
    {"transpose_a", FE_A_TRANSPOSE_A},
    {"transpose_b", FE_A_TRANSPOSE_B},
    {"kernel", FE_A_KERNEL},
    {"stride", FE_A_STRIDE},
    {"pad", FE_A_PAD},
    {"dilation", FE_A_DILATION},
    {"groups", FE_A_GROUPS},
    {"layout", FE_A_LAYOUT},
    {"eps", FE_A_EPS},
    {"shape", FE_A_SHAPE},
    {"axis", FE_A_AXIS},
};
#define N_ATTR_NAMES ((int)(sizeof attr_names / sizeof attr_names[0]))

static unsigned allowed_attrs(const fe_node *n)
{
    if (n->kind == FE_NODE_VIEW) return n->view == FE_VIEW_RESHAPE ? FE_A_SHAPE : FE_A_AXIS;
    if (n->kind == FE_NODE_EPILOGUE) return n->epi == IR_EPI_BIAS_ADD ? FE_A_LAYOUT : 0;
    unsigned f = ir_op_get(n->op)->fields, a = 0;
    if (f & IR_F_TRANSPOSE) a |= FE_A_TRANSPOSE_A | FE_A_TRANSPOSE_B;
    if (f & IR_F_STRIDE) a |= FE_A_STRIDE;
    if (f & IR_F_PAD) a |= FE_A_PAD;
    if (f & IR_F_DILATION) a |= FE_A_DILATION;
    if (f & IR_F_GROUPS) a |= FE_A_GROUPS;
    if (f & IR_F_LAYOUT) a |= FE_A_LAYOUT;
    if (f & IR_F_EPS) a |= FE_A_EPS;
    if (n->op == IR_OP_MAX_POOL2D || n->op == IR_OP_AVG_POOL2D) a |= FE_A_KERNEL;
    return a;
}

static void list_attrs(unsigned a, char *buf, size_t cap)
{
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < N_ATTR_NAMES; i++)
        if (a & attr_names[i].bit && k < cap)
            k += snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", attr_names[i].name);
    if (!k) snprintf(buf, cap, "no attributes");
}

/* Maps an ir_workload_check error onto the node: attribute fields to "attrs.X", the pool
 * window to "attrs.kernel", everything else to the node with the IR's field in the text. */
static int wl_err(tlm_error *err, int idx, const fe_node *n, const tlm_error *ie)
{
    static const char *const attr_fields[] = {"stride", "pad", "dilation",
                                              "groups", "eps", "layout"};
    for (size_t i = 0; i < sizeof attr_fields / sizeof *attr_fields; i++) {
        size_t l = strlen(attr_fields[i]);
        if (strncmp(ie->field, attr_fields[i], l) == 0 &&
            (ie->field[l] == 0 || ie->field[l] == '[')) {
            char sub[64];
            snprintf(sub, sizeof sub, ".attrs.%.40s", ie->field);
            return nerr(err, ie->code, idx, sub, "%s: %s", op_name(n), ie->msg);
        }
    }
    bool pool = n->op == IR_OP_MAX_POOL2D || n->op == IR_OP_AVG_POOL2D;
    if (pool && (!strcmp(ie->field, "shape.KH") || !strcmp(ie->field, "shape.KW")))
        return nerr(err, ie->code, idx, ".attrs.kernel", "%s: %s", op_name(n), ie->msg);
    return nerr(err, ie->code == TLM_EINVAL && strstr(ie->msg, "2^") ? TLM_ELIMIT : ie->code, idx,
                "", "%s: %s (%s)", op_name(n), ie->msg, ie->field[0] ? ie->field : "workload");
}

/* ---- shape inference ---- */

typedef struct {
    fe_graph *g;
    fe_node *n;
    int idx;
    tlm_error *err;
    const fe_value *v[FE_MAX_NODE_INPUTS];
    int ndim;
    int64_t shape[IR_MAX_DIMS];
} infer_ctx;

static int in_err(infer_ctx *c, int i, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int in_err(infer_ctx *c, int i, const char *fmt, ...)
{
    char sub[32], msg[400], sh[128];
    snprintf(sub, sizeof sub, ".inputs[%d]", i);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fmt_shape(sh, sizeof sh, c->v[i]->ndim, c->v[i]->shape);
    return nerr(c->err, TLM_EINVAL, c->idx, sub, "%s: \"%.48s\" has shape %s: %s", op_name(c->n),
                c->v[i]->name, sh, msg);
}

static int need_rank(infer_ctx *c, int i, int lo, int hi)
{
    int r = c->v[i]->ndim;
    if (r >= lo && r <= hi) return 0;
    if (lo == hi) return in_err(c, i, "must have rank %d", lo);
    return in_err(c, i, "must have rank %d to %d", lo, hi);
}

static int finish_wl(infer_ctx *c)
{
    ir_workload_normalize(&c->n->wl);
    tlm_error ie = {0};
    if (ir_workload_check(&c->n->wl, &ie)) return wl_err(c->err, c->idx, c->n, &ie);
    return 0;
}

static void set_out(infer_ctx *c, int ndim, const int64_t *s)
{
    c->ndim = ndim;
    memcpy(c->shape, s, ndim * sizeof *s);
}

static int infer_anchor(infer_ctx *c)
{
    fe_node *n = c->n;
    const fe_attrs *a = &n->attrs;
    ir_workload *w = &n->wl;
    ir_workload_init(w, n->op);
    w->dtype = c->v[0]->dtype;
    n->count = 1;
    int64_t *s = w->shape, o[IR_MAX_DIMS];
    const fe_value *x = c->v[0], *y = c->v[1];
    int rc;
    if (a->set & FE_A_STRIDE) memcpy(w->stride, a->stride, sizeof w->stride);
    if (a->set & FE_A_PAD) memcpy(w->pad, a->pad, sizeof w->pad);
    if (a->set & FE_A_DILATION) memcpy(w->dilation, a->dilation, sizeof w->dilation);
    if (a->set & FE_A_GROUPS) w->groups = a->groups;
    if (a->set & FE_A_LAYOUT) w->layout = a->layout;
    if (a->set & FE_A_EPS) w->eps = a->eps;
    w->transpose_a = a->transpose_a && (a->set & FE_A_TRANSPOSE_A);
    w->transpose_b = a->transpose_b && (a->set & FE_A_TRANSPOSE_B);
    bool nhwc = w->layout == IR_NHWC;

    switch (n->op) {
    case IR_OP_DENSE: {
        int64_t k;
        if (w->transpose_a) {
            if ((rc = need_rank(c, 0, 2, 2))) return rc;
            s[IR_DENSE_M] = x->shape[1], k = x->shape[0];
        } else {
            if ((rc = need_rank(c, 0, 2, IR_MAX_DIMS))) return rc;
            s[IR_DENSE_M] = numel(x->ndim - 1, x->shape), k = x->shape[x->ndim - 1];
        }
        if ((rc = need_rank(c, 1, 2, 2))) return rc;
        int64_t kb = w->transpose_b ? y->shape[1] : y->shape[0];
        s[IR_DENSE_N] = w->transpose_b ? y->shape[0] : y->shape[1];
        s[IR_DENSE_K] = k;
        if (kb != k)
            return in_err(c, 1, "has K=%lld but inputs[0] has K=%lld%s", (long long)kb,
                          (long long)k, w->transpose_b ? " (transpose_b: B is [N, K])" : "");
        if (w->transpose_a) {
            o[0] = s[IR_DENSE_M], o[1] = s[IR_DENSE_N];
            set_out(c, 2, o);
        } else {
            memcpy(o, x->shape, x->ndim * sizeof *o);
            o[x->ndim - 1] = s[IR_DENSE_N];
            set_out(c, x->ndim, o);
        }
        return finish_wl(c);
    }
    case IR_OP_BATCH_MATMUL: {
        if ((rc = need_rank(c, 0, 3, IR_MAX_DIMS))) return rc;
        int r = x->ndim;
        if (y->ndim != r) return in_err(c, 1, "must have the rank of inputs[0] (%d)", r);
        for (int i = 0; i < r - 2; i++)
            if (y->shape[i] != x->shape[i])
                return in_err(c, 1, "batch dimension %d (%lld) differs from inputs[0]'s (%lld)", i,
                              (long long)y->shape[i], (long long)x->shape[i]);
        const int64_t *xa = x->shape + r - 2, *yb = y->shape + r - 2;
        s[IR_BMM_B] = numel(r - 2, x->shape);
        s[IR_BMM_M] = w->transpose_a ? xa[1] : xa[0];
        s[IR_BMM_K] = w->transpose_a ? xa[0] : xa[1];
        int64_t kb = w->transpose_b ? yb[1] : yb[0];
        s[IR_BMM_N] = w->transpose_b ? yb[0] : yb[1];
        if (kb != s[IR_BMM_K])
            return in_err(c, 1, "has K=%lld but inputs[0] has K=%lld", (long long)kb,
                          (long long)s[IR_BMM_K]);
        memcpy(o, x->shape, r * sizeof *o);
        o[r - 2] = s[IR_BMM_M], o[r - 1] = s[IR_BMM_N];
        set_out(c, r, o);
        return finish_wl(c);
    }
    case IR_OP_CONV2D:
    case IR_OP_DEPTHWISE_CONV2D:
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D:
    case IR_OP_GLOBAL_AVG_POOL2D: {
        if ((rc = need_rank(c, 0, 4, 4))) return rc;
        int64_t N = x->shape[0], C = nhwc ? x->shape[3] : x->shape[1];
        int64_t H = nhwc ? x->shape[1] : x->shape[2], W = nhwc ? x->shape[2] : x->shape[3];
        if (n->op == IR_OP_GLOBAL_AVG_POOL2D) {
            s[IR_GP_N] = N, s[IR_GP_C] = C, s[IR_GP_H] = H, s[IR_GP_W] = W;
            o[0] = N, o[1] = C;
            set_out(c, 2, o);
            return finish_wl(c);
        }
        int64_t F = C;
        if (n->op == IR_OP_CONV2D) {
            if ((rc = need_rank(c, 1, 4, 4))) return rc;
            F = nhwc ? y->shape[3] : y->shape[0];
            int64_t cg = nhwc ? y->shape[2] : y->shape[1];
            int64_t g = w->groups;
            if (g < 1 || C % g || F % g)
                return nerr(c->err, TLM_EINVAL, c->idx, ".attrs.groups",
                            "conv2d: groups must divide the input channels C=%lld and the "
                            "filters F=%lld (got %lld)",
                            (long long)C, (long long)F, (long long)g);
            if (cg != C / g)
                return in_err(c, 1,
                              "the weight (%s) must have C/groups = %lld input channels, "
                              "not %lld",
                              nhwc ? "HWIO" : "OIHW", (long long)(C / g), (long long)cg);
            s[IR_CONV_N] = N, s[IR_CONV_C] = C, s[IR_CONV_H] = H, s[IR_CONV_W] = W;
            s[IR_CONV_F] = F;
            s[IR_CONV_KH] = nhwc ? y->shape[0] : y->shape[2];
            s[IR_CONV_KW] = nhwc ? y->shape[1] : y->shape[3];
        } else {
            s[IR_DW_N] = N, s[IR_DW_C] = C, s[IR_DW_H] = H, s[IR_DW_W] = W;
            if (n->op == IR_OP_DEPTHWISE_CONV2D) {
                if ((rc = need_rank(c, 1, 3, 3))) return rc;
                int64_t wc = nhwc ? y->shape[2] : y->shape[0];
                if (wc != C)
                    return in_err(c, 1, "the weight (%s) must have C = %lld channels, not %lld",
                                  nhwc ? "[KH, KW, C]" : "[C, KH, KW]", (long long)C,
                                  (long long)wc);
                s[IR_DW_KH] = nhwc ? y->shape[0] : y->shape[1];
                s[IR_DW_KW] = nhwc ? y->shape[1] : y->shape[2];
            } else {
                if (!(n->attrs.set & FE_A_KERNEL))
                    return nerr(c->err, TLM_EINVAL, c->idx, ".attrs.kernel",
                                "%s needs a window: \"kernel\": [KH, KW]", op_name(n));
                s[IR_DW_KH] = n->attrs.kernel[0], s[IR_DW_KW] = n->attrs.kernel[1];
            }
        }
        if ((rc = finish_wl(c))) return rc;
        int64_t oh, ow;
        ir_workload_out_hw(w, &oh, &ow);
        if (nhwc)
            o[0] = N, o[1] = oh, o[2] = ow, o[3] = F;
        else
            o[0] = N, o[1] = F, o[2] = oh, o[3] = ow;
        set_out(c, 4, o);
        return 0;
    }
    case IR_OP_SOFTMAX:
    case IR_OP_LAYER_NORM:
    case IR_OP_RMS_NORM:
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX: {
        int64_t C = x->shape[x->ndim - 1];
        s[IR_ROW_R] = numel(x->ndim - 1, x->shape), s[IR_ROW_C] = C;
        for (int i = 1; i < n->n_in; i++)
            if (c->v[i]->ndim != 1 || c->v[i]->shape[0] != C)
                return in_err(c, i, "must have shape [%lld] (the last axis of inputs[0])",
                              (long long)C);
        bool reduce =
            n->op == IR_OP_REDUCE_SUM || n->op == IR_OP_REDUCE_MEAN || n->op == IR_OP_REDUCE_MAX;
        if (!reduce)
            set_out(c, x->ndim, x->shape);
        else if (x->ndim == 1) {
            o[0] = 1;
            set_out(c, 1, o);
        } else
            set_out(c, x->ndim - 1, x->shape);
        return finish_wl(c);
    }
    case IR_OP_TRANSPOSE: {
        if ((rc = need_rank(c, 0, 2, IR_MAX_DIMS))) return rc;
        int r = x->ndim;
        s[IR_ROW_R] = x->shape[r - 2], s[IR_ROW_C] = x->shape[r - 1];
        n->count = numel(r - 2, x->shape);
        memcpy(o, x->shape, r * sizeof *o);
        o[r - 2] = s[IR_ROW_C], o[r - 1] = s[IR_ROW_R];
        set_out(c, r, o);
        return finish_wl(c);
    }
    default:
        return nerr(c->err, TLM_EUNSUPPORTED, c->idx, ".op", "op not available in graphs");
    }
}

/* The axis bias_add adds along: the channel axis of a rank-4 tensor in the node's layout,
 * the last axis otherwise. */
static int bias_axis(const fe_node *n, int ndim)
{
    if (ndim == 4) return (n->attrs.set & FE_A_LAYOUT) && n->attrs.layout == IR_NHWC ? 3 : 1;
    return ndim - 1;
}

static int infer_epilogue(infer_ctx *c)
{
    const fe_value *x = c->v[0];
    if (c->n->epi == IR_EPI_BIAS_ADD) {
        int ax = bias_axis(c->n, x->ndim);
        if (c->v[1]->ndim != 1 || c->v[1]->shape[0] != x->shape[ax])
            return in_err(c, 1, "a bias must be 1-D with the %lld entries of inputs[0]'s axis %d",
                          (long long)x->shape[ax], ax);
    } else if (c->n->n_in == 2) {
        const fe_value *y = c->v[1];
        bool same = y->ndim == x->ndim;
        for (int i = 0; same && i < x->ndim; i++)
            same = y->shape[i] == x->shape[i];
        if (!same) {
            char sh[128];
            fmt_shape(sh, sizeof sh, x->ndim, x->shape);
            return in_err(c, 1, "must have the shape of inputs[0] %s (no broadcasting)", sh);
        }
    }
    set_out(c, x->ndim, x->shape);
    return 0;
}

static int infer_view(infer_ctx *c)
{
    const fe_value *x = c->v[0];
    const fe_attrs *a = &c->n->attrs;
    int64_t total = numel(x->ndim, x->shape), o[IR_MAX_DIMS];
    if (c->n->view == FE_VIEW_FLATTEN) {
        int64_t axis = a->set & FE_A_AXIS ? a->axis : 1;
        if (axis < 0 || axis > x->ndim)
            return nerr(c->err, TLM_EINVAL, c->idx, ".attrs.axis",
                        "must be an integer in [0, %d] (the input's rank), got %lld", x->ndim,
                        (long long)axis);
        o[0] = numel((int)axis, x->shape), o[1] = total / o[0];
        set_out(c, 2, o);
        return 0;
    }
    if (!(a->set & FE_A_SHAPE))
        return nerr(c->err, TLM_EINVAL, c->idx, ".attrs.shape",
                    "reshape needs a target \"shape\" (one entry may be -1)");
    if (a->shape_ndim < 1 || a->shape_ndim > IR_MAX_DIMS)
        return nerr(c->err, TLM_EINVAL, c->idx, ".attrs.shape", "must have 1 to %d entries",
                    IR_MAX_DIMS);
    int infer = -1;
    int64_t p = 1;
    for (int i = 0; i < a->shape_ndim; i++) {
        char sub[40];
        snprintf(sub, sizeof sub, ".attrs.shape[%d]", i);
        if (a->shape[i] == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (a->shape[i] < 1 || a->shape[i] > IR_MAX_ELEMS)
            return nerr(c->err, TLM_EINVAL, c->idx, sub,
                        "must be a positive integer (or -1 once), got %lld",
                        (long long)a->shape[i]);
        if (__builtin_mul_overflow(p, a->shape[i], &p) || p > IR_MAX_ELEMS) p = IR_MAX_ELEMS + 1;
        o[i] = a->shape[i];
    }
    if (infer >= 0 && p <= total && total % p == 0) o[infer] = total / p, p = total;
    if (p != total) {
        char sh[128];
        fmt_shape(sh, sizeof sh, x->ndim, x->shape);
        return nerr(c->err, TLM_EINVAL, c->idx, ".attrs.shape",
                    "reshape of %s (%lld elements) to a shape of a different element count", sh,
                    (long long)total);
    }
    set_out(c, a->shape_ndim, o);
    return 0;
}

/* Adds a node whose inputs are resolved value indices; idx names it in errors. */
static int add_node(fe_graph *g, int idx, const char *name, const char *op, int n_in, const int *in,
                    const fe_attrs *attrs, tlm_error *err)
{
    fe_node n;
    memset(&n, 0, sizeof n);
    n.index = idx;
    if (attrs) n.attrs = *attrs;
    int rc = parse_op(op, &n, idx, err);
    if (rc) return rc;
    if (n_in != arity(&n))
        return nerr(err, TLM_EINVAL, idx, ".inputs", "%s takes %d input%s (got %d)", op_name(&n),
                    arity(&n), arity(&n) > 1 ? "s" : "", n_in);
    unsigned extra = n.attrs.set & ~allowed_attrs(&n);
    for (int i = 0; extra && i < N_ATTR_NAMES; i++)
        if (extra & attr_names[i].bit) {
            char sub[48], list[160];
            snprintf(sub, sizeof sub, ".attrs.%s", attr_names[i].name);
            list_attrs(allowed_attrs(&n), list, sizeof list);
            return nerr(err, TLM_EINVAL, idx, sub, "%s takes %s", op_name(&n), list);
        }
    if (n.attrs.set & FE_A_LAYOUT && (unsigned)n.attrs.layout >= IR_LAYOUT_COUNT)
        return nerr(err, TLM_EINVAL, idx, ".attrs.layout", "must be NCHW or NHWC");
    infer_ctx c = {.g = g, .n = &n, .idx = idx, .err = err};
    n.n_in = n_in;
    for (int i = 0; i < n_in; i++) {
        if (in[i] < 0 || in[i] >= g->n_values) {
            char sub[32];
            snprintf(sub, sizeof sub, ".inputs[%d]", i);
            return nerr(err, TLM_EINVAL, idx, sub, "unknown input");
        }
        n.in[i] = in[i];
        c.v[i] = &g->values[in[i]];
    }
    for (int i = 1; i < n_in; i++)
        if (c.v[i]->dtype != c.v[0]->dtype)
            return in_err(&c, i, "dtype %s differs from inputs[0]'s %s",
                          ir_dtype_name(c.v[i]->dtype), ir_dtype_name(c.v[0]->dtype));
    char field[48];
    snprintf(field, sizeof field, "nodes[%d].name", idx);
    if ((rc = check_name(g, name, field, err))) return rc;
    if (g->n_nodes >= FE_MAX_NODES)
        return tlm_err_set(err, TLM_ELIMIT, "nodes", "more than %d nodes", FE_MAX_NODES);
    switch (n.kind) {
    case FE_NODE_ANCHOR:
        rc = infer_anchor(&c);
        break;
    case FE_NODE_EPILOGUE:
        rc = infer_epilogue(&c);
        break;
    default:
        rc = infer_view(&c);
        break;
    }
    if (rc) return rc;
    snprintf(field, sizeof field, "nodes[%d]", idx);
    if ((rc = check_shape(c.ndim, c.shape, field, err))) return rc;
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? 2 * g->cap_nodes : 64;
        fe_node *nn = realloc(g->nodes, cap * sizeof *nn);
        if (!nn) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        g->nodes = nn, g->cap_nodes = cap;
    }
    rc = push_value(g, name, c.ndim, c.shape, c.v[0]->dtype, false, g->n_nodes);
    if (rc == TLM_ELIMIT)
        return tlm_err_set(err, rc, "nodes", "more than %d values", FE_MAX_VALUES);
    if (rc < 0) return tlm_err_set(err, rc, "", "out of memory");
    n.out = rc;
    g->nodes[g->n_nodes++] = n;
    return n.out;
}

int fe_graph_add_node(fe_graph *g, const char *name, const char *op, int n_in,
                      const char *const *inputs, const fe_attrs *attrs, tlm_error *err)
{
    int idx = g->n_nodes, in[FE_MAX_NODE_INPUTS];
    if (n_in < 0 || n_in > FE_MAX_NODE_INPUTS)
        return nerr(err, TLM_EINVAL, idx, ".inputs", "at most %d inputs", FE_MAX_NODE_INPUTS);
    for (int i = 0; i < n_in; i++) {
        in[i] = inputs[i] ? names_find(g, inputs[i]) : -1;
        if (in[i] < 0) {
            char sub[32];
            snprintf(sub, sizeof sub, ".inputs[%d]", i);
            return nerr(err, TLM_EINVAL, idx, sub, "unknown input name \"%.64s\"",
                        inputs[i] ? inputs[i] : "(null)");
        }
    }
    return add_node(g, idx, name ? name : "", op, n_in, in, attrs, err);
}

/* ---- JSON ---- */

static const char *jtype(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return "an object";
    case JSON_ARRAY:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_INTEGER:
        return "an integer";
    case JSON_REAL:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    default:
        return "null";
    }
}

/* Only the keys in allowed (NULL-terminated) may appear. */
static int check_keys(const json_t *o, const char *const *allowed, const char *prefix,
                      tlm_error *err)
{
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        bool ok = false;
        for (int i = 0; allowed[i] && !ok; i++)
            ok = strcmp(k, allowed[i]) == 0;
        if (!ok) {
            char field[96], list[160] = "";
            size_t n = 0;
            for (int i = 0; allowed[i]; i++)
                n += snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", allowed[i]);
            snprintf(field, sizeof field, "%s%s%.40s", prefix, prefix[0] ? "." : "", k);
            return tlm_err_set(err, TLM_EINVAL, field, "unknown field; allowed: %s", list);
        }
    }
    return 0;
}

/* A JSON integer (or an integral real, as the workload decoder accepts) into *out. */
static bool json_int(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9e18) {
            *out = (int64_t)d;
            return true;
        }
    }
    return false;
}

static int decode_ints(const json_t *v, int lo_n, int hi_n, int64_t *out, int *n_out,
                       const char *field, tlm_error *err)
{
    if (!json_is_array(v) || (int)json_array_size(v) < lo_n || (int)json_array_size(v) > hi_n) {
        if (lo_n == hi_n)
            return tlm_err_set(err, TLM_EINVAL, field, "must be an array of %d integers (got %s)",
                               lo_n, jtype(v));
        return tlm_err_set(err, TLM_EINVAL, field,
                           "must be an array of %d to %d integers (got %s%s)", lo_n, hi_n, jtype(v),
                           json_is_array(v) ? " of another length" : "");
    }
    for (size_t i = 0; i < json_array_size(v); i++)
        if (!json_int(json_array_get(v, i), &out[i])) {
            char f[128];
            snprintf(f, sizeof f, "%s[%zu]", field, i);
            return tlm_err_set(err, TLM_EINVAL, f, "must be an integer (got %s)",
                               jtype(json_array_get(v, i)));
        }
    if (n_out) *n_out = (int)json_array_size(v);
    return 0;
}

static int decode_attrs(const json_t *o, int idx, fe_attrs *a, tlm_error *err)
{
    memset(a, 0, sizeof *a);
    char f[96];
    if (!json_is_object(o)) {
        snprintf(f, sizeof f, "nodes[%d].attrs", idx);
        return tlm_err_set(err, TLM_EINVAL, f, "must be an object (got %s)", jtype(o));
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)o, k, v)
    {
        int i = 0;
        while (i < N_ATTR_NAMES && strcmp(attr_names[i].name, k))
            i++;
        snprintf(f, sizeof f, "nodes[%d].attrs.%.40s", idx, k);
        if (i == N_ATTR_NAMES)
            return tlm_err_set(err, TLM_EINVAL, f,
                               "unknown attribute; allowed: transpose_a, transpose_b, kernel, "
                               "stride, pad, dilation, groups, layout, eps, shape, axis");
        unsigned bit = attr_names[i].bit;
        a->set |= bit;
        int rc = 0;
        switch (bit) {
        case FE_A_STRIDE:
            rc = decode_ints(v, 2, 2, a->stride, NULL, f, err);
            break;
        case FE_A_PAD:
            rc = decode_ints(v, 2, 2, a->pad, NULL, f, err);
            break;
        case FE_A_DILATION:
            rc = decode_ints(v, 2, 2, a->dilation, NULL, f, err);
            break;
        case FE_A_KERNEL:
            rc = decode_ints(v, 2, 2, a->kernel, NULL, f, err);
            break;
        case FE_A_SHAPE:
            rc = decode_ints(v, 1, IR_MAX_DIMS, a->shape, &a->shape_ndim, f, err);
            break;
        case FE_A_GROUPS:
        case FE_A_AXIS:
            if (!json_int(v, bit == FE_A_GROUPS ? &a->groups : &a->axis))
                return tlm_err_set(err, TLM_EINVAL, f, "must be an integer (got %s)", jtype(v));
            break;
        case FE_A_TRANSPOSE_A:
        case FE_A_TRANSPOSE_B:
            if (!json_is_boolean(v))
                return tlm_err_set(err, TLM_EINVAL, f, "must be true or false (got %s)", jtype(v));
            *(bit == FE_A_TRANSPOSE_A ? &a->transpose_a : &a->transpose_b) = json_is_true(v);
            break;
        case FE_A_EPS:
            if (!json_is_number(v))
                return tlm_err_set(err, TLM_EINVAL, f, "must be a number (got %s)", jtype(v));
            a->eps = json_number_value(v);
            break;
        case FE_A_LAYOUT:
            if (!json_is_string(v))
                return tlm_err_set(err, TLM_EINVAL, f, "must be \"NCHW\" or \"NHWC\" (got %s)",
                                   jtype(v));
            if (ir_layout_from_name(json_string_value(v), &a->layout))
                return tlm_err_set(err, TLM_EUNSUPPORTED, f,
                                   "unknown layout \"%.32s\"; allowed: NCHW, NHWC",
                                   json_string_value(v));
            break;
        }
        if (rc) return rc;
    }
    return 0;
}

typedef struct {
    const char *name, *op;
    int n_in;
    const char *in_name[FE_MAX_NODE_INPUTS];
    int in_node[FE_MAX_NODE_INPUTS]; /* the node producing each input, -1 for a graph input */
    fe_attrs attrs;
} jnode;

/* Min-heap of node positions: Kahn's algorithm that keeps the document's order when it is
 * already topological. */
static void heap_push(int *h, int *n, int v)
{
    int i = (*n)++;
    h[i] = v;
    while (i > 0 && h[(i - 1) / 2] > h[i]) {
        int p = (i - 1) / 2, t = h[p];
        h[p] = h[i], h[i] = t, i = p;
    }
}

static int heap_pop(int *h, int *n)
{
    int top = h[0], i = 0;
    h[0] = h[--(*n)];
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && h[l] < h[m]) m = l;
        if (r < *n && h[r] < h[m]) m = r;
        if (m == i) break;
        int t = h[m];
        h[m] = h[i], h[i] = t, i = m;
    }
    return top;
}

/* Names a cycle among the nodes Kahn's algorithm could not place. */
static int cycle_err(const jnode *jn, int nn, const bool *placed, tlm_error *err)
{
    int start = 0;
    while (start < nn && placed[start])
        start++;
    /* Walk unplaced inputs until a node repeats: every unplaced node has one. */
    int *seen = calloc(nn, sizeof *seen);
    if (!seen) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int cur = start, step = 1;
    while (!seen[cur]) {
        seen[cur] = step++;
        int next = -1;
        for (int i = 0; i < jn[cur].n_in && next < 0; i++)
            if (jn[cur].in_node[i] >= 0 && !placed[jn[cur].in_node[i]]) next = jn[cur].in_node[i];
        if (next < 0) break; /* cannot happen: an unplaced node has an unplaced input */
        cur = next;
    }
    /* cur starts the cycle; print it in data-flow order from cur. */
    char path[400] = "";
    size_t k = 0;
    int at = cur, hops = 0;
    do {
        k += snprintf(path + k, k < sizeof path ? sizeof path - k : 0, "%s%.32s",
                      hops ? " <- " : "", jn[at].name);
        int next = -1;
        for (int i = 0; i < jn[at].n_in && next < 0; i++)
            if (jn[at].in_node[i] >= 0 && !placed[jn[at].in_node[i]]) next = jn[at].in_node[i];
        at = next;
    } while (at >= 0 && at != cur && ++hops < 16 && k < sizeof path);
    free(seen);
    char field[64];
    int first_in = 0;
    for (int i = 0; i < jn[cur].n_in; i++)
        if (jn[cur].in_node[i] >= 0 && !placed[jn[cur].in_node[i]]) {
            first_in = i;
            break;
        }
    snprintf(field, sizeof field, "nodes[%d].inputs[%d]", cur, first_in);
    return tlm_err_set(err, TLM_EINVAL, field, "the graph has a cycle: %s <- %.32s%s", path,
                       jn[cur].name, hops >= 16 ? " (shortened)" : "");
}

static int decode_input(fe_graph *g, const json_t *o, int i, tlm_error *err)
{
    char f[64];
    snprintf(f, sizeof f, "inputs[%d]", i);
    if (!json_is_object(o))
        return tlm_err_set(err, TLM_EINVAL, f, "must be an object (got %s)", jtype(o));
    static const char *const keys[] = {"name", "shape", "dtype", "param", NULL};
    int rc = check_keys(o, keys, f, err);
    if (rc) return rc;
    const json_t *name = json_object_get(o, "name"), *shape = json_object_get(o, "shape");
    const json_t *dt = json_object_get(o, "dtype"), *param = json_object_get(o, "param");
    snprintf(f, sizeof f, "inputs[%d].name", i);
    if (!json_is_string(name))
        return tlm_err_set(err, TLM_EINVAL, f, "required, a string (got %s)",
                           name ? jtype(name) : "nothing");
    snprintf(f, sizeof f, "inputs[%d].shape", i);
    int64_t s[IR_MAX_DIMS];
    int nd = 0;
    if (!shape) return tlm_err_set(err, TLM_EINVAL, f, "required: an array of 1 to 6 integers");
    if ((rc = decode_ints(shape, 1, IR_MAX_DIMS, s, &nd, f, err))) return rc;
    ir_dtype t = IR_FLOAT32;
    snprintf(f, sizeof f, "inputs[%d].dtype", i);
    if (dt && !json_is_string(dt))
        return tlm_err_set(err, TLM_EINVAL, f, "must be a string (got %s)", jtype(dt));
    if (dt && ir_dtype_from_name(json_string_value(dt), &t))
        return tlm_err_set(err, TLM_EUNSUPPORTED, f,
                           "unknown dtype \"%.32s\"; allowed: float32, float16, bfloat16",
                           json_string_value(dt));
    snprintf(f, sizeof f, "inputs[%d].param", i);
    if (param && !json_is_boolean(param))
        return tlm_err_set(err, TLM_EINVAL, f, "must be true or false (got %s)", jtype(param));
    rc =
        fe_graph_add_input(g, json_string_value(name), nd, s, t, param && json_is_true(param), err);
    return rc < 0 ? rc : 0;
}

static int decode_node(const json_t *o, int i, jnode *jn, tlm_error *err)
{
    char f[64];
    snprintf(f, sizeof f, "nodes[%d]", i);
    if (!json_is_object(o))
        return tlm_err_set(err, TLM_EINVAL, f, "must be an object (got %s)", jtype(o));
    static const char *const keys[] = {"name", "op", "inputs", "attrs", NULL};
    int rc = check_keys(o, keys, f, err);
    if (rc) return rc;
    const json_t *name = json_object_get(o, "name"), *op = json_object_get(o, "op");
    const json_t *in = json_object_get(o, "inputs"), *attrs = json_object_get(o, "attrs");
    snprintf(f, sizeof f, "nodes[%d].name", i);
    if (!json_is_string(name))
        return tlm_err_set(err, TLM_EINVAL, f, "required, a string (got %s)",
                           name ? jtype(name) : "nothing");
    snprintf(f, sizeof f, "nodes[%d].op", i);
    if (!json_is_string(op))
        return tlm_err_set(err, TLM_EINVAL, f, "required, a string (got %s)",
                           op ? jtype(op) : "nothing");
    snprintf(f, sizeof f, "nodes[%d].inputs", i);
    if (!json_is_array(in) || json_array_size(in) < 1 || json_array_size(in) > FE_MAX_NODE_INPUTS)
        return tlm_err_set(err, TLM_EINVAL, f, "required, an array of 1 to %d names (got %s)",
                           FE_MAX_NODE_INPUTS, in ? jtype(in) : "nothing");
    jn->name = json_string_value(name);
    jn->op = json_string_value(op);
    jn->n_in = (int)json_array_size(in);
    for (int k = 0; k < jn->n_in; k++) {
        const json_t *s = json_array_get(in, k);
        if (!json_is_string(s)) {
            snprintf(f, sizeof f, "nodes[%d].inputs[%d]", i, k);
            return tlm_err_set(err, TLM_EINVAL, f, "must be a name (got %s)", jtype(s));
        }
        jn->in_name[k] = json_string_value(s);
    }
    if (attrs) return decode_attrs(attrs, i, &jn->attrs, err);
    memset(&jn->attrs, 0, sizeof jn->attrs);
    return 0;
}

/* Node names → positions, for the document's forward references. */
typedef struct {
    int cap;
    int *slot;
    const jnode *jn;
} jindex;

static int jindex_find(const jindex *t, const char *name)
{
    for (uint32_t i = name_hash(name) & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
        int v = t->slot[i] - 1;
        if (v < 0) return -1;
        if (strcmp(t->jn[v].name, name) == 0) return v;
    }
}

static int decode_graph(const json_t *j, fe_graph *g, tlm_error *err)
{
    if (!json_is_object(j))
        return tlm_err_set(err, TLM_EINVAL, "", "a graph must be a JSON object (got %s)", jtype(j));
    static const char *const keys[] = {"name", "inputs", "nodes", "outputs", NULL};
    int rc = check_keys(j, keys, "", err);
    if (rc) return rc;
    const json_t *name = json_object_get(j, "name"), *inputs = json_object_get(j, "inputs");
    const json_t *nodes = json_object_get(j, "nodes"), *outputs = json_object_get(j, "outputs");
    if (name && !json_is_string(name))
        return tlm_err_set(err, TLM_EINVAL, "name", "must be a string (got %s)", jtype(name));
    if (name) {
        char *s = strdup(json_string_value(name));
        if (!s) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        free(g->name);
        g->name = s;
    }
    if (!json_is_array(inputs) || json_array_size(inputs) == 0)
        return tlm_err_set(err, TLM_EINVAL, "inputs",
                           "required, a non-empty array of {name, shape, dtype, param} (got %s)",
                           !inputs                 ? "nothing"
                           : json_is_array(inputs) ? "an empty array"
                                                   : jtype(inputs));
    if (json_array_size(inputs) > FE_MAX_VALUES / 2)
        return tlm_err_set(err, TLM_ELIMIT, "inputs", "at most %d inputs", FE_MAX_VALUES / 2);
    if (json_array_size(nodes) > FE_MAX_NODES)
        return tlm_err_set(err, TLM_ELIMIT, "nodes", "at most %d nodes", FE_MAX_NODES);
    if (outputs && !json_is_array(outputs))
        return tlm_err_set(err, TLM_EINVAL, "outputs", "must be an array of names (got %s)",
                           jtype(outputs));
    for (size_t i = 0; i < json_array_size(inputs); i++)
        if ((rc = decode_input(g, json_array_get(inputs, i), (int)i, err))) return rc;
    if (!json_is_array(nodes) || json_array_size(nodes) == 0)
        return tlm_err_set(err, TLM_EINVAL, "nodes",
                           "required, a non-empty array of {name, op, inputs, attrs} (got %s)",
                           !nodes                 ? "nothing"
                           : json_is_array(nodes) ? "an empty array"
                                                  : jtype(nodes));

    int nn = (int)json_array_size(nodes);
    jnode *jn = calloc(nn, sizeof *jn);
    int cap = 16;
    while (cap < 2 * nn)
        cap *= 2;
    jindex ix = {.cap = cap, .slot = calloc(cap, sizeof(int)), .jn = jn};
    int *heap = calloc(nn, sizeof *heap), *indeg = calloc(nn, sizeof *indeg);
    int *users = NULL, *user_off = calloc(nn + 1, sizeof *user_off);
    bool *placed = calloc(nn, sizeof *placed);
    if (!jn || !ix.slot || !heap || !indeg || !user_off || !placed) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    for (int i = 0; i < nn; i++) {
        if ((rc = decode_node(json_array_get(nodes, i), i, &jn[i], err))) goto out;
        char f[48];
        snprintf(f, sizeof f, "nodes[%d].name", i);
        if ((rc = check_name(g, jn[i].name, f, err))) goto out;
        if (jindex_find(&ix, jn[i].name) >= 0) {
            rc = tlm_err_set(err, TLM_EINVAL, f,
                             "duplicate name \"%.64s\": input and node names must be unique",
                             jn[i].name);
            goto out;
        }
        uint32_t s = name_hash(jn[i].name) & (cap - 1);
        while (ix.slot[s])
            s = (s + 1) & (cap - 1);
        ix.slot[s] = i + 1;
    }
    /* Resolve names; count each node's producers among the nodes. */
    for (int i = 0; i < nn; i++)
        for (int k = 0; k < jn[i].n_in; k++) {
            jn[i].in_node[k] = jindex_find(&ix, jn[i].in_name[k]);
            if (jn[i].in_node[k] < 0 && names_find(g, jn[i].in_name[k]) < 0) {
                char f[48];
                snprintf(f, sizeof f, "nodes[%d].inputs[%d]", i, k);
                rc = tlm_err_set(err, TLM_EINVAL, f,
                                 "unknown input name \"%.64s\": not a graph input or a node",
                                 jn[i].in_name[k]);
                goto out;
            }
            if (jn[i].in_node[k] >= 0) indeg[i]++, user_off[jn[i].in_node[k] + 1]++;
        }
    for (int i = 0; i < nn; i++)
        user_off[i + 1] += user_off[i];
    users = calloc(user_off[nn] + 1, sizeof *users);
    if (!users) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    {
        int *fill = calloc(nn, sizeof *fill);
        if (!fill) {
            rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
            goto out;
        }
        for (int i = 0; i < nn; i++)
            for (int k = 0; k < jn[i].n_in; k++) {
                int p = jn[i].in_node[k];
                if (p >= 0) users[user_off[p] + fill[p]++] = i;
            }
        free(fill);
    }
    int hn = 0, done = 0;
    for (int i = 0; i < nn; i++)
        if (!indeg[i]) heap_push(heap, &hn, i);
    while (hn) {
        int i = heap_pop(heap, &hn);
        placed[i] = true, done++;
        int in[FE_MAX_NODE_INPUTS];
        for (int k = 0; k < jn[i].n_in; k++)
            in[k] = names_find(g, jn[i].in_name[k]);
        rc = add_node(g, i, jn[i].name, jn[i].op, jn[i].n_in, in, &jn[i].attrs, err);
        if (rc < 0) goto out;
        rc = 0;
        for (int u = user_off[i]; u < user_off[i + 1]; u++)
            if (--indeg[users[u]] == 0) heap_push(heap, &hn, users[u]);
    }
    if (done < nn) {
        rc = cycle_err(jn, nn, placed, err);
        goto out;
    }
    for (size_t i = 0; outputs && i < json_array_size(outputs); i++) {
        const json_t *s = json_array_get(outputs, i);
        if (!json_is_string(s)) {
            char f[32];
            snprintf(f, sizeof f, "outputs[%zu]", i);
            rc = tlm_err_set(err, TLM_EINVAL, f, "must be a name (got %s)", jtype(s));
            goto out;
        }
        if ((rc = fe_graph_add_output(g, json_string_value(s), err))) goto out;
    }
out:
    free(jn);
    free(ix.slot);
    free(heap);
    free(indeg);
    free(users);
    free(user_off);
    free(placed);
    return rc;
}

int fe_graph_from_json(const json_t *j, fe_graph **out, tlm_error *err)
{
    *out = NULL;
    fe_graph *g;
    if (fe_graph_new("", &g)) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = decode_graph(j, g, err);
    if (rc) {
        fe_graph_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

static json_t *ints_json(int n, const int64_t *v)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer(v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *attrs_json(const fe_attrs *a)
{
    json_t *o = json_object();
    if (!o) return NULL;
    int bad = 0;
    for (int i = 0; i < N_ATTR_NAMES; i++) {
        unsigned b = attr_names[i].bit;
        if (!(a->set & b)) continue;
        json_t *v = NULL;
        switch (b) {
        case FE_A_STRIDE:
            v = ints_json(2, a->stride);
            break;
        case FE_A_PAD:
            v = ints_json(2, a->pad);
            break;
        case FE_A_DILATION:
            v = ints_json(2, a->dilation);
            break;
        case FE_A_KERNEL:
            v = ints_json(2, a->kernel);
            break;
        case FE_A_SHAPE:
            v = ints_json(a->shape_ndim, a->shape);
            break;
        case FE_A_GROUPS:
            v = json_integer(a->groups);
            break;
        case FE_A_AXIS:
            v = json_integer(a->axis);
            break;
        case FE_A_TRANSPOSE_A:
            v = json_boolean(a->transpose_a);
            break;
        case FE_A_TRANSPOSE_B:
            v = json_boolean(a->transpose_b);
            break;
        case FE_A_EPS:
            v = json_real(a->eps);
            break;
        case FE_A_LAYOUT:
            v = json_string(ir_layout_name(a->layout));
            break;
        }
        bad |= json_object_set_new(o, attr_names[i].name, v);
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *fe_graph_to_json(const fe_graph *g)
{
    json_t *root = json_object(), *inputs = json_array(), *nodes = json_array();
    json_t *outs = g->n_outputs ? json_array() : NULL;
    int bad = !root || !inputs || !nodes || (g->n_outputs && !outs);
    for (int i = 0; !bad && i < g->n_values; i++) {
        const fe_value *v = &g->values[i];
        if (v->producer >= 0) continue;
        json_t *o = json_pack("{s:s, s:o, s:s}", "name", v->name, "shape",
                              ints_json(v->ndim, v->shape), "dtype", ir_dtype_name(v->dtype));
        if (o && v->param) bad |= json_object_set_new(o, "param", json_true());
        bad |= !o || json_array_append_new(inputs, o);
    }
    for (int i = 0; !bad && i < g->n_nodes; i++) {
        const fe_node *n = &g->nodes[i];
        json_t *in = json_array();
        for (int k = 0; in && k < n->n_in; k++)
            bad |= json_array_append_new(in, json_string(g->values[n->in[k]].name));
        json_t *o = json_pack("{s:s, s:s, s:o}", "name", g->values[n->out].name, "op", op_name(n),
                              "inputs", in);
        if (o && n->attrs.set) bad |= json_object_set_new(o, "attrs", attrs_json(&n->attrs));
        bad |= !o || json_array_append_new(nodes, o);
    }
    for (int i = 0; !bad && i < g->n_outputs; i++)
        bad |= json_array_append_new(outs, json_string(g->values[g->outputs[i]].name));
    if (!bad) {
        bad |= json_object_set_new(root, "name", json_string(g->name));
        bad |= json_object_set(root, "inputs", inputs);
        bad |= json_object_set(root, "nodes", nodes);
        if (outs) bad |= json_object_set(root, "outputs", outs);
    }
    json_decref(inputs);
    json_decref(nodes);
    json_decref(outs);
    if (bad) {
        json_decref(root);
        return NULL;
    }
    return root;
}
