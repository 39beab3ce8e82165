/* onnx.c — an ONNX model (protobuf, decoded with protobuf-c against onnx.proto) → a graph
 * (proto/graph.md) and its weights.
 *
 * One pass over the nodes (ONNX requires them in topological order). A value name maps to a
 * graph value, or to a constant (an initializer or a Constant node) that stays data until a
 * node uses it as a tensor operand, which makes it a param. Operators become graph nodes (see
 * fe_onnx_import in frontend.h for the list); BatchNormalization is folded into the Conv that
 * produced its input (every Conv gets its own copy of its weight and a bias for that);
 * Reshape and Flatten become views, a Transpose of the last two axes the graph's transpose. */
#include "compiler/frontend/frontend.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/onnx.pb-c.h"

enum { T_FLOAT = 1, T_INT64 = 7 };

typedef struct {
    const char *name; /* the ONNX value name (points into the decoded model) */
    int ndim;
    int64_t dims[IR_MAX_DIMS];
    float *f;   /* float data, or NULL */
    int64_t *i; /* int64 data, or NULL */
    int64_t n;
    int param; /* weights index once used as a tensor, else -1 */
} konst;

typedef struct {
    const char *onnx; /* ONNX value name */
    char graph[FE_MAX_NAME + 1];
    int conv; /* the Conv this value is the output of (weights index of its weight), or -1 */
    int bias; /* and of its bias */
    int readers;
} binding;

typedef struct {
    fe_graph *g;
    const Onnx__GraphProto *og;
    fe_onnx_weights *w;
    tlm_error *err;
    konst *k;
    int nk;
    binding *b;
    int nb;
    int opset;
    /* operand() answers in these (bindings move when the table grows); a node uses at most
     * three operands at a time */
    char scratch[4][FE_MAX_NAME + 1];
    int ns;
} imp;

void fe_onnx_weights_free(fe_onnx_weights *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->p[i].name);
        free(w->p[i].data);
    }
    free(w->p);
    memset(w, 0, sizeof *w);
}

static int nerr(imp *m, int code, int node, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int nerr(imp *m, int code, int node, const char *fmt, ...)
{
    char msg[400], f[48];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(f, sizeof f, "onnx.graph.node[%d]", node);
    return tlm_err_set(m->err, code, f, "%s", msg);
}

static konst *find_const(imp *m, const char *name)
{
    for (int i = m->nk - 1; i >= 0; i--)
        if (!strcmp(m->k[i].name, name)) return &m->k[i];
    return NULL;
}

static binding *find_binding(imp *m, const char *name)
{
    for (int i = m->nb - 1; i >= 0; i--)
        if (!strcmp(m->b[i].onnx, name)) return &m->b[i];
    return NULL;
}

/* A tensor's data as float32 or int64 (float_data / int64_data / raw_data little-endian). */
static int read_tensor(imp *m, const Onnx__TensorProto *t, const char *field, konst *k)
{
    memset(k, 0, sizeof *k);
    k->name = t->name ? t->name : "";
    k->param = -1;
    if (t->n_dims > IR_MAX_DIMS)
        return tlm_err_set(m->err, TLM_EUNSUPPORTED, field,
                           "tensor \"%.64s\" has rank %zu (at most %d)", k->name, t->n_dims,
                           IR_MAX_DIMS);
    k->ndim = (int)t->n_dims;
    int64_t n = 1;
    for (int d = 0; d < k->ndim; d++) {
        k->dims[d] = t->dims[d];
        if (t->dims[d] < 0 || __builtin_mul_overflow(n, t->dims[d], &n) || n > IR_MAX_ELEMS)
            return tlm_err_set(m->err, TLM_EINVAL, field,
                               "tensor \"%.64s\": dims must be >= 0 with at most 2^34 elements",
                               k->name);
    }
    k->n = n;
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return tlm_err_set(m->err, TLM_EUNSUPPORTED, field,
                           "tensor \"%.64s\" keeps its data in an external file", k->name);
    int type = t->has_data_type ? t->data_type : 0;
    size_t esz = type == T_FLOAT ? 4 : type == T_INT64 ? 8 : 0;
    if (!esz)
        return tlm_err_set(m->err, TLM_EUNSUPPORTED, field,
                           "tensor \"%.64s\" has data type %d (float32 and int64 are read)",
                           k->name, type);
    size_t have = t->has_raw_data   ? t->raw_data.len / esz
                  : type == T_FLOAT ? t->n_float_data
                                    : t->n_int64_data;
    if ((int64_t)have != n || (t->has_raw_data && t->raw_data.len % esz))
        return tlm_err_set(m->err, TLM_EINVAL, field,
                           "tensor \"%.64s\" claims %lld elements but holds %zu", k->name,
                           (long long)n, have);
    void *dst = malloc(n * esz + 8);
    if (!dst) return tlm_err_set(m->err, TLM_ENOMEM, field, "out of memory");
    const void *src = t->has_raw_data   ? (const void *)t->raw_data.data
                      : type == T_FLOAT ? (const void *)t->float_data
                                        : (const void *)t->int64_data;
    if (n) memcpy(dst, src, n * esz);
    if (type == T_FLOAT)
        k->f = dst;
    else
        k->i = dst;
    return 0;
}

static int push_const(imp *m, const konst *k)
{
    konst *nk = realloc(m->k, (m->nk + 1) * sizeof *nk);
    if (!nk) return tlm_err_set(m->err, TLM_ENOMEM, "", "out of memory");
    m->k = nk;
    m->k[m->nk++] = *k;
    return 0;
}

static int push_binding(imp *m, const char *onnx, const char *graph, int conv, int bias)
{
    char gname[FE_MAX_NAME + 1]; /* graph may point into the table realloc moves */
    snprintf(gname, sizeof gname, "%s", graph);
    binding *nb = realloc(m->b, (m->nb + 1) * sizeof *nb);
    if (!nb) return tlm_err_set(m->err, TLM_ENOMEM, "", "out of memory");
    m->b = nb;
    binding *b = &m->b[m->nb++];
    memset(b, 0, sizeof *b);
    b->onnx = onnx;
    snprintf(b->graph, sizeof b->graph, "%s", gname);
    b->conv = conv, b->bias = bias;
    return 0;
}

/* Adds a param input named name holding a copy of n floats; returns its weights index. */
static int add_param(imp *m, const char *name, int ndim, const int64_t *dims, const float *data,
                     int64_t n, tlm_error *err)
{
    int rc = fe_graph_add_input(m->g, name, ndim, dims, IR_FLOAT32, true, err);
    if (rc < 0) return rc;
    fe_onnx_param *np = realloc(m->w->p, (m->w->n + 1) * sizeof *np);
    if (!np) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    m->w->p = np;
    fe_onnx_param *p = &m->w->p[m->w->n];
    p->name = strdup(name);
    p->n = n;
    p->data = malloc(n * sizeof *p->data + 4);
    if (!p->name || !p->data) {
        free(p->name);
        free(p->data);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    memcpy(p->data, data, n * sizeof *p->data);
    return m->w->n++;
}

/* The graph value name of ONNX value `name` read by node ni: a value, or a constant made a
 * param (once). */
static const char *operand(imp *m, int ni, const char *name)
{
    char *ret = m->scratch[m->ns++ % 4];
    binding *b = find_binding(m, name);
    if (b) {
        b->readers++;
        snprintf(ret, FE_MAX_NAME + 1, "%s", b->graph);
        return ret;
    }
    konst *k = find_const(m, name);
    if (!k) {
        nerr(m, TLM_EINVAL, ni,
             "input \"%.64s\" is neither a graph input, an initializer nor "
             "an earlier node's output",
             name);
        return NULL;
    }
    if (!k->f || k->ndim < 1) {
        nerr(m, TLM_EUNSUPPORTED, ni,
             "input \"%.64s\" is an int64 or scalar constant used as "
             "a tensor",
             name);
        return NULL;
    }
    if (add_param(m, name, k->ndim, k->dims, k->f, k->n, m->err) < 0) return NULL;
    if (push_binding(m, name, name, -1, -1)) return NULL;
    m->b[m->nb - 1].readers++;
    snprintf(ret, FE_MAX_NAME + 1, "%s", name);
    return ret;
}

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (n->attribute[i]->name && !strcmp(n->attribute[i]->name, name)) return n->attribute[i];
    return NULL;
}

static int64_t attr_i(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
    const Onnx__AttributeProto *a = attr(n, name);
    return a && a->has_i ? a->i : dflt;
}

static double attr_f(const Onnx__NodeProto *n, const char *name, double dflt)
{
    const Onnx__AttributeProto *a = attr(n, name);
    return a && a->has_f ? a->f : dflt;
}

/* ints attribute of exactly `want` entries into out (left alone when absent); -1 if wrong */
static int attr_ints(const Onnx__NodeProto *n, const char *name, int want, int64_t *out)
{
    const Onnx__AttributeProto *a = attr(n, name);
    if (!a) return 0;
    if ((int)a->n_ints != want) return -1;
    for (int i = 0; i < want; i++)
        out[i] = a->ints[i];
    return 1;
}

static int add_node(imp *m, int ni, const char *name, const char *op, int n_in,
                    const char *const *in, const fe_attrs *a)
{
    tlm_error e = {0};
    int rc = fe_graph_add_node(m->g, name, op, n_in, in, a, &e);
    if (rc < 0) return nerr(m, e.code, ni, "%s (%s): %s", op, e.field, e.msg);
    return 0;
}

static const fe_value *gvalue(imp *m, const char *graph_name)
{
    int v = fe_graph_find(m->g, graph_name);
    return v >= 0 ? &m->g->values[v] : NULL;
}

/* conv / pool geometry: symmetric pads, strides, dilations; auto_pad NOTSET */
static int geometry(imp *m, int ni, const Onnx__NodeProto *n, fe_attrs *a, bool pool)
{
    const Onnx__AttributeProto *ap = attr(n, "auto_pad");
    if (ap && ap->has_s && !(ap->s.len == 6 && !memcmp(ap->s.data, "NOTSET", 6)))
        return nerr(m, TLM_EUNSUPPORTED, ni, "%s \"%.64s\": auto_pad other than NOTSET", n->op_type,
                    n->name ? n->name : "");
    int64_t pads[4] = {0, 0, 0, 0};
    if (attr_ints(n, "pads", 4, pads) < 0 || pads[0] != pads[2] || pads[1] != pads[3])
        return nerr(m, TLM_EUNSUPPORTED, ni, "%s \"%.64s\": pads must be 4 symmetric values",
                    n->op_type, n->name ? n->name : "");
    a->pad[0] = pads[0], a->pad[1] = pads[1];
    a->set |= FE_A_PAD;
    a->stride[0] = a->stride[1] = 1;
    if (attr_ints(n, "strides", 2, a->stride) < 0)
        return nerr(m, TLM_EUNSUPPORTED, ni, "%s: strides must have 2 values", n->op_type);
    a->set |= FE_A_STRIDE;
    if (!pool) {
        a->dilation[0] = a->dilation[1] = 1;
        if (attr_ints(n, "dilations", 2, a->dilation) < 0)
            return nerr(m, TLM_EUNSUPPORTED, ni, "%s: dilations must have 2 values", n->op_type);
        a->set |= FE_A_DILATION;
    }
    return 0;
}

static int unsupported(imp *m, int ni, const Onnx__NodeProto *n, const char *why)
{
    return nerr(m, TLM_EUNSUPPORTED, ni, "node \"%.64s\" (%s): %s", n->name ? n->name : "",
                n->op_type, why);
}

/* How many nodes (and graph outputs) read ONNX value name. */
static int onnx_readers(const imp *m, const char *name)
{
    int r = 0;
    for (size_t i = 0; i < m->og->n_node; i++)
        for (size_t k = 0; k < m->og->node[i]->n_input; k++)
            r += !strcmp(m->og->node[i]->input[k], name);
    for (size_t i = 0; i < m->og->n_output; i++)
        r += m->og->output[i]->name && !strcmp(m->og->output[i]->name, name);
    return r;
}

static int do_node(imp *m, int ni, const Onnx__NodeProto *n)
{
    const char *op = n->op_type ? n->op_type : "";
    if (n->n_output < 1 || !n->output[0][0]) return unsupported(m, ni, n, "no output");
    if (n->domain && *n->domain && strcmp(n->domain, "ai.onnx"))
        return unsupported(m, ni, n, "operators outside the default ONNX domain are not mapped");
    const char *out = n->output[0];
    const char *in[FE_MAX_NODE_INPUTS];
    fe_attrs a = {0};
    char nm[FE_MAX_NAME + 16], nm2[FE_MAX_NAME + 16];
    if (strlen(out) > FE_MAX_NAME - 8) return unsupported(m, ni, n, "output name too long");
    int nin = (int)n->n_input;

    if (!strcmp(op, "Constant")) {
        const Onnx__AttributeProto *v = attr(n, "value");
        if (!v || !v->t) return unsupported(m, ni, n, "only the \"value\" tensor form");
        konst k;
        char f[48];
        snprintf(f, sizeof f, "onnx.graph.node[%d]", ni);
        int rc = read_tensor(m, v->t, f, &k);
        if (rc) return rc;
        k.name = out;
        return push_const(m, &k);
    }
    if (!strcmp(op, "Identity") || !strcmp(op, "Dropout")) {
        if (nin < 1) return unsupported(m, ni, n, "no input");
        binding *b = find_binding(m, n->input[0]);
        if (!b) {
            konst *k = find_const(m, n->input[0]);
            if (!k) return unsupported(m, ni, n, "unknown input");
            konst c = *k;
            c.name = out;
            c.param = -1;
            /* the data stays owned by the first constant */
            size_t bytes = (size_t)c.n * (c.f ? 4 : 8) + 8;
            void *copy = malloc(bytes);
            if (!copy) return tlm_err_set(m->err, TLM_ENOMEM, "", "out of memory");
            memcpy(copy, c.f ? (void *)c.f : (void *)c.i, bytes - 8);
            if (c.f)
                c.f = copy;
            else
                c.i = copy;
            return push_const(m, &c);
        }
        b->readers++;
        return push_binding(m, out, b->graph, b->conv, b->bias);
    }
    for (int i = 0; i < nin && i < FE_MAX_NODE_INPUTS; i++)
        in[i] = NULL;

    if (!strcmp(op, "Conv")) {
        if (nin < 2) return unsupported(m, ni, n, "needs X and W");
        konst *w = find_const(m, n->input[1]);
        konst *bk = nin > 2 && *n->input[2] ? find_const(m, n->input[2]) : NULL;
        if (!w || !w->f || w->ndim != 4)
            return unsupported(m, ni, n, "the weight must be a 4-D float initializer (2-D conv)");
        if (nin > 2 && *n->input[2] && (!bk || !bk->f || bk->n != w->dims[0]))
            return unsupported(m, ni, n, "the bias must be a float initializer of F values");
        if ((in[0] = operand(m, ni, n->input[0])) == NULL) return m->err->code;
        int rc = geometry(m, ni, n, &a, false);
        if (rc) return rc;
        a.groups = attr_i(n, "group", 1);
        a.set |= FE_A_GROUPS;
        /* the weight and bias are this Conv's own copies, so a following BatchNormalization
         * can be folded into them */
        snprintf(nm, sizeof nm, "%s.weight", out);
        int wi = add_param(m, nm, 4, w->dims, w->f, w->n, m->err);
        if (wi < 0) return wi;
        snprintf(nm2, sizeof nm2, "%s.bias", out);
        float *zero = calloc(w->dims[0] + 1, sizeof *zero);
        if (!zero) return tlm_err_set(m->err, TLM_ENOMEM, "", "out of memory");
        int bi = add_param(m, nm2, 1, w->dims, bk ? bk->f : zero, w->dims[0], m->err);
        free(zero);
        if (bi < 0) return bi;
        in[1] = nm;
        char conv[FE_MAX_NAME + 16];
        snprintf(conv, sizeof conv, "%s.conv", out);
        if ((rc = add_node(m, ni, conv, "conv2d", 2, in, &a))) return rc;
        const char *bin[2] = {conv, nm2};
        if ((rc = add_node(m, ni, out, "bias_add", 2, bin, NULL))) return rc;
        return push_binding(m, out, out, wi, bi);
    }
    if (!strcmp(op, "BatchNormalization")) {
        binding *b = nin == 5 ? find_binding(m, n->input[0]) : NULL;
        if (!b || b->conv < 0 || onnx_readers(m, n->input[0]) != 1)
            return unsupported(m, ni, n,
                               "only right after a Conv whose output nothing else "
                               "reads (it is folded into the Conv)");
        konst *k[4];
        for (int i = 0; i < 4; i++) {
            k[i] = find_const(m, n->input[i + 1]);
            if (!k[i] || !k[i]->f || k[i]->n != m->w->p[b->bias].n)
                return unsupported(m, ni, n,
                                   "scale, B, mean and var must be float initializers "
                                   "of the Conv's channel count");
        }
        double eps = attr_f(n, "epsilon", 1e-5);
        fe_onnx_param *W = &m->w->p[b->conv], *B = &m->w->p[b->bias];
        int64_t F = B->n, per = W->n / F;
        for (int64_t c = 0; c < F; c++) {
            double s = k[0]->f[c] / sqrt((double)k[3]->f[c] + eps);
            for (int64_t e = 0; e < per; e++)
                W->data[c * per + e] = (float)(W->data[c * per + e] * s);
            B->data[c] = (float)((B->data[c] - k[2]->f[c]) * s + k[1]->f[c]);
        }
        b->conv = -1; /* folded once */
        return push_binding(m, out, b->graph, -1, -1);
    }
    if (!strcmp(op, "Gemm")) {
        if (nin < 2) return unsupported(m, ni, n, "needs A and B");
        if (attr_i(n, "transA", 0) || attr_f(n, "alpha", 1) != 1 || attr_f(n, "beta", 1) != 1)
            return unsupported(m, ni, n, "transA, alpha != 1 or beta != 1");
        if (!(in[0] = operand(m, ni, n->input[0])) || !(in[1] = operand(m, ni, n->input[1])))
            return m->err->code;
        a.transpose_b = attr_i(n, "transB", 0) != 0;
        a.set |= FE_A_TRANSPOSE_B;
        bool bias = nin > 2 && *n->input[2];
        snprintf(nm, sizeof nm, "%s.gemm", out);
        int rc = add_node(m, ni, bias ? nm : out, "dense", 2, in, &a);
        if (rc || !bias) return rc ? rc : push_binding(m, out, out, -1, -1);
        const char *bin[2] = {nm, operand(m, ni, n->input[2])};
        if (!bin[1]) return m->err->code;
        if ((rc = add_node(m, ni, out, "bias_add", 2, bin, NULL))) return rc;
        return push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "MatMul")) {
        if (nin != 2) return unsupported(m, ni, n, "needs A and B");
        if (!(in[0] = operand(m, ni, n->input[0])) || !(in[1] = operand(m, ni, n->input[1])))
            return m->err->code;
        const fe_value *x = gvalue(m, in[0]), *y = gvalue(m, in[1]);
        const char *gop = y->ndim == 2 ? "dense" : x->ndim == y->ndim ? "batch_matmul" : NULL;
        if (!gop) return unsupported(m, ni, n, "broadcasting matmul");
        int rc = add_node(m, ni, out, gop, 2, in, NULL);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "Add") || !strcmp(op, "Mul")) {
        if (nin != 2) return unsupported(m, ni, n, "needs two inputs");
        bool add = !strcmp(op, "Add");
        /* x + a constant bias along x's channel axis: [C, 1, 1] or [1, C, 1, 1] for NCHW x,
         * [C] along the last axis otherwise (ONNX broadcasting, for the cases bias_add
         * covers; other broadcasts reach the graph's shape check and fail there) */
        for (int side = 0; side < 2 && add; side++) {
            konst *k = find_const(m, n->input[1 - side]);
            binding *xb = find_binding(m, n->input[side]);
            if (!k || !xb || !k->f) continue;
            const fe_value *x = gvalue(m, xb->graph);
            bool nchw = x->ndim == 4 && k->n == x->shape[1] && k->ndim >= 3 &&
                        k->dims[k->ndim - 1] == 1 && k->dims[k->ndim - 2] == 1;
            bool last = x->ndim != 4 && k->ndim == 1 && k->n == x->shape[x->ndim - 1];
            if (!nchw && !last) continue;
            in[0] = operand(m, ni, n->input[side]);
            snprintf(nm, sizeof nm, "%s.bias", out);
            int64_t c1[1] = {k->n};
            if (add_param(m, nm, 1, c1, k->f, k->n, m->err) < 0) return m->err->code;
            in[1] = nm;
            int rc = add_node(m, ni, out, "bias_add", 2, in, NULL);
            return rc ? rc : push_binding(m, out, out, -1, -1);
        }
        if (!(in[0] = operand(m, ni, n->input[0])) || !(in[1] = operand(m, ni, n->input[1])))
            return m->err->code;
        int rc = add_node(m, ni, out, add ? "add" : "mul", 2, in, NULL);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    static const struct {
        const char *onnx, *graph;
    } unary[] = {{"Relu", "relu"}, {"Sigmoid", "sigmoid"}, {"Tanh", "tanh"}, {"Gelu", "gelu"}};
    for (size_t u = 0; u < sizeof unary / sizeof *unary; u++) {
        if (strcmp(op, unary[u].onnx)) continue;
        if (!strcmp(op, "Gelu")) {
            const Onnx__AttributeProto *ap = attr(n, "approximate");
            if (ap && ap->has_s && !(ap->s.len == 4 && !memcmp(ap->s.data, "none", 4)))
                return unsupported(m, ni, n, "the tanh approximation (exact erf GELU only)");
        }
        if (nin < 1 || !(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        int rc = add_node(m, ni, out, unary[u].graph, 1, in, NULL);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "Clip")) {
        double lo = attr_f(n, "min", -INFINITY), hi = attr_f(n, "max", INFINITY);
        for (int i = 1; i < nin && i < 3; i++) {
            if (!*n->input[i]) continue;
            konst *k = find_const(m, n->input[i]);
            if (!k || !k->f || k->n != 1) return unsupported(m, ni, n, "min/max must be constants");
            *(i == 1 ? &lo : &hi) = k->f[0];
        }
        const char *g = lo == 0 && hi == 6 ? "relu6" : lo == 0 && isinf(hi) ? "relu" : NULL;
        if (!g) return unsupported(m, ni, n, "only Clip(0, 6) (relu6) and Clip(0) (relu)");
        if (!(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        int rc = add_node(m, ni, out, g, 1, in, NULL);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "Softmax") || !strcmp(op, "LayerNormalization")) {
        if (nin < 1 || !(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        const fe_value *x = gvalue(m, in[0]);
        bool soft = !strcmp(op, "Softmax");
        /* opset >= 13 (checked on import): both default to the last axis */
        int64_t axis = attr_i(n, "axis", -1);
        if (axis != -1 && axis != x->ndim - 1)
            return unsupported(m, ni, n, "only over the last axis");
        if (!soft) {
            if (nin < 3 || !*n->input[2]) return unsupported(m, ni, n, "needs scale and B (bias)");
            if (!(in[1] = operand(m, ni, n->input[1])) || !(in[2] = operand(m, ni, n->input[2])))
                return m->err->code;
            a.eps = attr_f(n, "epsilon", 1e-5);
            a.set |= FE_A_EPS;
        }
        int rc = add_node(m, ni, out, soft ? "softmax" : "layer_norm", soft ? 1 : 3, in,
                          soft ? NULL : &a);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "GlobalAveragePool")) {
        if (nin < 1 || !(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        snprintf(nm, sizeof nm, "%s.gap", out);
        int rc = add_node(m, ni, nm, "global_avg_pool2d", 1, in, NULL);
        if (rc) return rc;
        /* ONNX keeps [N, C, 1, 1]: a free view */
        const fe_value *y = gvalue(m, nm);
        a.set = FE_A_SHAPE;
        a.shape_ndim = 4;
        a.shape[0] = y->shape[0], a.shape[1] = y->shape[1], a.shape[2] = a.shape[3] = 1;
        const char *vin[1] = {nm};
        if ((rc = add_node(m, ni, out, "reshape", 1, vin, &a))) return rc;
        return push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "MaxPool") || !strcmp(op, "AveragePool")) {
        if (nin < 1 || !(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        if (n->n_output > 1) return unsupported(m, ni, n, "the Indices output");
        if (attr_i(n, "ceil_mode", 0)) return unsupported(m, ni, n, "ceil_mode");
        int rc = geometry(m, ni, n, &a, true);
        if (rc) return rc;
        if (attr_ints(n, "kernel_shape", 2, a.kernel) != 1)
            return unsupported(m, ni, n, "kernel_shape must have 2 values");
        a.set |= FE_A_KERNEL;
        bool avg = !strcmp(op, "AveragePool");
        if (avg && (a.pad[0] || a.pad[1]) && !attr_i(n, "count_include_pad", 0))
            return unsupported(m, ni, n,
                               "padding with count_include_pad = 0 (we divide by the "
                               "whole window)");
        if ((rc = add_node(m, ni, out, avg ? "avg_pool2d" : "max_pool2d", 1, in, &a))) return rc;
        return push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "Reshape") || !strcmp(op, "Flatten")) {
        if (nin < 1 || !(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        const fe_value *x = gvalue(m, in[0]);
        if (!strcmp(op, "Flatten")) {
            a.axis = attr_i(n, "axis", 1);
            if (a.axis < 0) a.axis += x->ndim;
            a.set = FE_A_AXIS;
            int rc = add_node(m, ni, out, "flatten", 1, in, &a);
            return rc ? rc : push_binding(m, out, out, -1, -1);
        }
        konst *k = nin > 1 ? find_const(m, n->input[1]) : NULL;
        if (!k || !k->i || k->n < 1 || k->n > IR_MAX_DIMS)
            return unsupported(m, ni, n,
                               "the shape must be a constant of 1..6 int64 values "
                               "(dynamic shapes are not compiled)");
        a.set = FE_A_SHAPE;
        a.shape_ndim = (int)k->n;
        for (int d = 0; d < a.shape_ndim; d++)
            a.shape[d] =
                k->i[d] == 0 && d < x->ndim && !attr_i(n, "allowzero", 0) ? x->shape[d] : k->i[d];
        int rc = add_node(m, ni, out, "reshape", 1, in, &a);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    if (!strcmp(op, "Transpose")) {
        if (nin < 1 || !(in[0] = operand(m, ni, n->input[0]))) return m->err->code;
        const fe_value *x = gvalue(m, in[0]);
        int64_t perm[IR_MAX_DIMS];
        int r = x->ndim;
        if (r < 2 || attr_ints(n, "perm", r, perm) != 1)
            return unsupported(m, ni, n, "perm must be given for an input of rank >= 2");
        bool last_two = perm[r - 2] == r - 1 && perm[r - 1] == r - 2;
        for (int d = 0; d < r - 2; d++)
            last_two = last_two && perm[d] == d;
        if (!last_two) return unsupported(m, ni, n, "only a swap of the last two axes");
        int rc = add_node(m, ni, out, "transpose", 1, in, NULL);
        return rc ? rc : push_binding(m, out, out, -1, -1);
    }
    return nerr(m, TLM_EUNSUPPORTED, ni,
                "node \"%.64s\": op type %s is not supported (Conv, "
                "Gemm, MatMul, BatchNormalization after Conv, Relu, Clip, Gelu, Sigmoid, Tanh, "
                "Add, Mul, Softmax, LayerNormalization, GlobalAveragePool, MaxPool, "
                "AveragePool, Reshape, Flatten, Transpose, Constant, Identity, Dropout)",
                n->name ? n->name : "", op);
}

static int add_graph_input(imp *m, int i, const Onnx__ValueInfoProto *v)
{
    char f[48];
    snprintf(f, sizeof f, "onnx.graph.input[%d]", i);
    const Onnx__TypeProto *t = v->type;
    if (!v->name || !*v->name || !t || t->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE ||
        !t->tensor_type || !t->tensor_type->shape)
        return tlm_err_set(m->err, TLM_EINVAL, f, "needs a name and a tensor type with a shape");
    if (t->tensor_type->elem_type != T_FLOAT)
        return tlm_err_set(m->err, TLM_EUNSUPPORTED, f, "\"%.64s\" is not float32", v->name);
    const Onnx__TensorShapeProto *s = t->tensor_type->shape;
    if (s->n_dim < 1 || s->n_dim > IR_MAX_DIMS)
        return tlm_err_set(m->err, TLM_EUNSUPPORTED, f, "\"%.64s\" has rank %zu (1..%d)", v->name,
                           s->n_dim, IR_MAX_DIMS);
    int64_t dims[IR_MAX_DIMS];
    for (size_t d = 0; d < s->n_dim; d++) {
        const Onnx__TensorShapeProto__Dimension *dm = s->dim[d];
        if (dm->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE ||
            dm->dim_value < 1)
            return tlm_err_set(m->err, TLM_EUNSUPPORTED, f,
                               "\"%.64s\" dimension %zu is dynamic (%s): kernels are compiled "
                               "for static shapes; export with fixed sizes",
                               v->name, d,
                               dm->value_case ==
                                       ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
                                   ? dm->dim_param
                                   : "no value");
        dims[d] = dm->dim_value;
    }
    tlm_error e = {0};
    if (fe_graph_add_input(m->g, v->name, (int)s->n_dim, dims, IR_FLOAT32, false, &e) < 0)
        return tlm_err_set(m->err, e.code, f, "%s", e.msg);
    return push_binding(m, v->name, v->name, -1, -1);
}

int fe_onnx_import(const void *data, size_t len, fe_graph **out, fe_onnx_weights *weights,
                   tlm_error *err)
{
    *out = NULL;
    fe_onnx_weights local = {0};
    if (weights) memset(weights, 0, sizeof *weights);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, len, data);
    if (!mp)
        return tlm_err_set(err, TLM_EINVAL, "onnx",
                           "not an ONNX model: the protobuf does not decode (truncated, or "
                           "another message)");
    const Onnx__GraphProto *g = mp->graph;
    imp m = {.og = g, .w = weights ? weights : &local, .err = err, .opset = 0};
    int rc = 0;
    for (size_t i = 0; i < mp->n_opset_import; i++)
        if (!mp->opset_import[i]->domain || !*mp->opset_import[i]->domain)
            m.opset = (int)mp->opset_import[i]->version;
    if (!g || g->n_node < 1) {
        rc = tlm_err_set(err, TLM_EINVAL, "onnx.graph", "the model has no graph nodes");
        goto done;
    }
    if (m.opset < 13 || m.opset > 21) {
        rc = tlm_err_set(err, TLM_EUNSUPPORTED, "onnx.opset_import",
                         "default-domain opset %d; opsets 13 to 21 are read", m.opset);
        goto done;
    }
    if (g->n_node > FE_MAX_NODES || g->n_initializer > FE_MAX_VALUES) {
        rc = tlm_err_set(err, TLM_ELIMIT, "onnx.graph", "at most %d nodes and %d initializers",
                         FE_MAX_NODES, FE_MAX_VALUES);
        goto done;
    }
    if ((rc = fe_graph_new(g->name && *g->name ? g->name : "onnx", &m.g))) {
        tlm_err_set(err, rc, "", "out of memory");
        goto done;
    }
    for (size_t i = 0; i < g->n_initializer && !rc; i++) {
        char f[48];
        snprintf(f, sizeof f, "onnx.graph.initializer[%zu]", i);
        konst k;
        if (!(rc = read_tensor(&m, g->initializer[i], f, &k))) rc = push_const(&m, &k);
    }
    for (size_t i = 0; i < g->n_input && !rc; i++)
        if (!find_const(&m, g->input[i]->name ? g->input[i]->name : ""))
            rc = add_graph_input(&m, (int)i, g->input[i]);
    for (size_t i = 0; i < g->n_node && !rc; i++)
        rc = do_node(&m, (int)i, g->node[i]);
    for (size_t i = 0; i < g->n_output && !rc; i++) {
        binding *b = find_binding(&m, g->output[i]->name ? g->output[i]->name : "");
        char f[48];
        snprintf(f, sizeof f, "onnx.graph.output[%zu]", i);
        tlm_error e = {0};
        if (!b)
            rc = tlm_err_set(err, TLM_EUNSUPPORTED, f, "\"%.64s\" is not computed by the graph",
                             g->output[i]->name ? g->output[i]->name : "");
        else if (fe_graph_add_output(m.g, b->graph, &e))
            rc = tlm_err_set(err, e.code, f, "%s", e.msg);
    }
done:
    for (int i = 0; i < m.nk; i++) {
        free(m.k[i].f);
        free(m.k[i].i);
    }
    free(m.k);
    free(m.b);
    onnx__model_proto__free_unpacked(mp, NULL);
    fe_onnx_weights_free(&local);
    if (rc) {
        fe_graph_free(m.g);
        if (weights) fe_onnx_weights_free(weights);
        return rc;
    }
    *out = m.g;
    return 0;
}
