/* common.c — printing helpers shared by the C and CUDA generators. */
#include "compiler/codegen/codegen.h"

#include <dlfcn.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void grow(cg_buf *b, size_t need)
{
    if (b->oom || b->len + need + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + need + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return;
    }
    b->p = p;
    b->cap = cap;
}

static void vappend(cg_buf *b, const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0) return;
    grow(b, (size_t)n);
    if (b->oom) return;
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    b->len += (size_t)n;
}

void cg_printf(cg_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vappend(b, fmt, ap);
    va_end(ap);
}

void cg_line(cg_buf *b, int indent, const char *fmt, ...)
{
    for (int i = 0; i < indent; i++) cg_printf(b, "    ");
    va_list ap;
    va_start(ap, fmt);
    vappend(b, fmt, ap);
    va_end(ap);
    cg_printf(b, "\n");
}

char *cg_buf_take(cg_buf *b)
{
    char *p = b->oom ? NULL : b->p;
    if (b->oom) free(b->p);
    if (p == NULL && !b->oom) p = strdup("");
    memset(b, 0, sizeof *b);
    return p;
}

void cg_kernel_free(cg_kernel *k)
{
    if (!k) return;
    free(k->source);
    k->source = NULL;
}

int cg_launch_json(const cg_kernel *k, char *buf, size_t cap)
{
    if (!k->cuda) return snprintf(buf, cap, "{}");
    return snprintf(buf, cap, "{\"grid\":[%d,%d,%d],\"block\":[%d,%d,%d],\"smem\":%d}", k->grid[0],
                    k->grid[1], k->grid[2], k->block[0], k->block[1], k->block[2], k->smem_bytes);
}

void cg_strides(const ir_tensor *t, int64_t *strides)
{
    int64_t st = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        strides[d] = st;
        st *= t->shape[d];
    }
}

/* sum_a coef*axis + const, skipping zero terms; the constant is folded in. */
static void emit_linear(cg_buf *b, const ir_stage *s, const int64_t *coef, int64_t c,
                        const cg_names *nm)
{
    bool any = false;
    cg_printf(b, "(");
    for (int a = 0; a < s->n_spatial + s->n_reduce; a++) {
        if (!coef[a]) continue;
        if (any) cg_printf(b, " + ");
        if (coef[a] == 1) cg_printf(b, "%s", nm->axis[a]);
        else cg_printf(b, "%lld * %s", (long long)coef[a], nm->axis[a]);
        any = true;
    }
    if (c || !any) cg_printf(b, any ? " + (%lld)" : "%lld", (long long)c);
    cg_printf(b, ")");
}

void cg_emit_offset(cg_buf *b, const ir_subgraph *g, const ir_stage *s, const ir_expr *e,
                    const cg_names *nm)
{
    const ir_tensor *t = &g->tensor[e->tensor];
    int64_t st[IR_MAX_DIMS];
    cg_strides(t, st);
    int64_t coef[IR_MAX_AXES] = {0}, c = 0;
    for (int d = 0; d < t->ndim; d++) {
        c += e->idx[d].off * st[d];
        for (int a = 0; a < s->n_spatial + s->n_reduce; a++) coef[a] += e->idx[d].coef[a] * st[d];
    }
    emit_linear(b, s, coef, c, nm);
}

void cg_emit_affine(cg_buf *b, const ir_stage *s, const ir_affine *af, const cg_names *nm)
{
    int64_t coef[IR_MAX_AXES];
    for (int a = 0; a < IR_MAX_AXES; a++) coef[a] = af->coef[a];
    emit_linear(b, s, coef, af->off, nm);
}

static const char *unop_fn(ir_unop op)
{
    switch (op) {
    case IR_U_EXP: return "expf";
    case IR_U_SQRT: return "sqrtf";
    case IR_U_RSQRT: return "tlm_rsqrt";
    case IR_U_RECIP: return "tlm_recip";
    case IR_U_RELU: return "tlm_relu";
    case IR_U_RELU6: return "tlm_relu6";
    case IR_U_GELU: return "tlm_gelu";
    case IR_U_SILU: return "tlm_silu";
    case IR_U_SIGMOID: return "tlm_sigmoid";
    case IR_U_TANH: return "tanhf";
    default: return "-";
    }
}

const char *cg_float_literal(double v, char *buf, size_t cap)
{
    if (v == __builtin_inf()) {
        snprintf(buf, cap, "INFINITY");
    } else if (v == -__builtin_inf()) {
        snprintf(buf, cap, "(-INFINITY)");
    } else {
        /* "%.9g" alone prints 0 as "0", and "0f" does not parse */
        char t[48];
        snprintf(t, sizeof t, "%.9g", v);
        snprintf(buf, cap, "%s%s%sf%s", v < 0 ? "(" : "", t, strpbrk(t, ".eEn") ? "" : ".0",
                 v < 0 ? ")" : "");
    }
    return buf;
}

void cg_emit_scalar(cg_buf *b, const ir_subgraph *g, const ir_stage *s, int id,
                    const cg_names *nm)
{
    const ir_expr *e = &s->expr[id];
    if (nm->expr_var && nm->expr_var[id]) {
        cg_printf(b, "%s", nm->expr_var[id]);
        return;
    }
    if (nm->recip_var && nm->recip_var[id] && e->kind == IR_E_BINARY && e->op == IR_B_DIV) {
        cg_printf(b, "(");
        cg_emit_scalar(b, g, s, e->a, nm);
        cg_printf(b, " * %s)", nm->recip_var[id]);
        return;
    }
    switch (e->kind) {
    case IR_E_CONST: {
        char lit[64];
        cg_printf(b, "%s", cg_float_literal(e->value, lit, sizeof lit));
        break;
    }
    case IR_E_LOAD:
        if (e->tensor == nm->subst_tensor) cg_printf(b, "%s", nm->subst_var);
        else if (nm->scalar_tensor[e->tensor]) cg_printf(b, "%s", nm->scalar_tensor[e->tensor]);
        else if (nm->load_hook && nm->load_hook(nm->load_ctx, b, s, id)) {
        } else {
            cg_printf(b, "%s[", nm->tensor[e->tensor]);
            cg_emit_offset(b, g, s, e, nm);
            cg_printf(b, "]");
        }
        break;
    case IR_E_UNARY:
        if (e->op == IR_U_NEG) cg_printf(b, "(-");
        else cg_printf(b, "%s(", unop_fn((ir_unop)e->op));
        cg_emit_scalar(b, g, s, e->a, nm);
        cg_printf(b, ")");
        break;
    case IR_E_BINARY: {
        static const char *sym[] = {"+", "-", "*", "/"};
        if (e->op <= IR_B_DIV) {
            cg_printf(b, "(");
            cg_emit_scalar(b, g, s, e->a, nm);
            cg_printf(b, " %s ", sym[e->op]);
            cg_emit_scalar(b, g, s, e->b, nm);
            cg_printf(b, ")");
        } else {
            if (nm->cuda) cg_printf(b, "%s(", e->op == IR_B_MAX ? "fmaxf" : "fminf");
            else cg_printf(b, "%s(", e->op == IR_B_MAX ? "tlm_max" : "tlm_min");
            cg_emit_scalar(b, g, s, e->a, nm);
            cg_printf(b, ", ");
            cg_emit_scalar(b, g, s, e->b, nm);
            cg_printf(b, ")");
        }
        break;
    }
    case IR_E_SELECT:
        cg_printf(b, "((");
        for (int i = 0; i < e->ncond; i++) {
            if (i) cg_printf(b, " && ");
            cg_printf(b, "(uint64_t)");
            cg_emit_affine(b, s, &e->cond[i], nm);
            cg_printf(b, " < %lluu", (unsigned long long)e->cond_hi[i]);
        }
        cg_printf(b, ") ? ");
        cg_emit_scalar(b, g, s, e->a, nm);
        cg_printf(b, " : ");
        cg_emit_scalar(b, g, s, e->b, nm);
        cg_printf(b, ")");
        break;
    }
}

void cg_emit_prelude_scalar(cg_buf *b, bool cuda)
{
    const char *q = cuda ? "static __device__ __forceinline__" : "static inline";
    cg_line(b, 0, "%s float tlm_relu(float x) { return x > 0.0f ? x : 0.0f; }", q);
    cg_line(b, 0, "%s float tlm_relu6(float x) { return x < 0.0f ? 0.0f : (x > 6.0f ? 6.0f : x); }",
            q);
    cg_line(b, 0, "%s float tlm_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }",
            q);
    cg_line(b, 0, "%s float tlm_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }", q);
    cg_line(b, 0, "%s float tlm_silu(float x) { return x / (1.0f + expf(-x)); }", q);
    if (cuda) cg_line(b, 0, "%s float tlm_rsqrt(float x) { return rsqrtf(x); }", q);
    else cg_line(b, 0, "%s float tlm_rsqrt(float x) { return 1.0f / sqrtf(x); }", q);
    cg_line(b, 0, "%s float tlm_recip(float x) { return 1.0f / x; }", q);
}

void cg_emit_params(cg_buf *b, const ir_subgraph *g, cg_names *nm, bool cuda)
{
    int in[IR_MAX_TENSORS];
    int n = ir_subgraph_inputs(g, in);
    const char *rq = cuda ? "__restrict__" : "restrict";
    /* a CPU kernel a plan may run with its output over an input (ir_subgraph_inplace_input)
     * promises nothing about those two */
    const int ip = cuda ? -1 : ir_subgraph_inplace_input(g);
    for (int i = 0; i < n; i++) {
        nm->tensor[in[i]] = g->tensor[in[i]].name;
        cg_printf(b, "%sconst float *%s%s%s", i ? ", " : "", i == ip ? "" : rq, i == ip ? "" : " ",
                  g->tensor[in[i]].name);
    }
    nm->tensor[g->output] = g->tensor[g->output].name;
    cg_printf(b, "%sfloat *%s%s%s", n ? ", " : "", ip >= 0 ? "" : rq, ip >= 0 ? "" : " ",
              g->tensor[g->output].name);
}

/* ---- the CPU prepack ABI, for the callers that load kernels ---- */

int cg_prepack_find(void *lib, const char *entry, cg_prepack_abi *p, tlm_error *err)
{
    memset(p, 0, sizeof *p);
    char sym[300];
    snprintf(sym, sizeof sym, "%s_prepacks", entry);
    int (*info)(int, int *, long long *) = (int (*)(int, int *, long long *))dlsym(lib, sym);
    snprintf(sym, sizeof sym, "%s_prepack", entry);
    p->pack = (void (*)(int, void *const *, float *))dlsym(lib, sym);
    snprintf(sym, sizeof sym, "%s_prepacked", entry);
    p->run = (void (*)(void *const *, const float *const *))dlsym(lib, sym);
    if (!info || !p->pack || !p->run) {
        memset(p, 0, sizeof *p);
        return 0;
    }
    int arg;
    long long floats;
    const int n = info(0, &arg, &floats);
    if (n < 0 || n > CG_MAX_PRE)
        return tlm_err_set(err, TLM_EINVAL, entry, "%d prepacked operands (at most %d)", n,
                           CG_MAX_PRE);
    for (int k = 0; k < n; k++) {
        info(k, &arg, &floats);
        if (arg < 0 || floats < 1 || floats > (1ll << 36))
            return tlm_err_set(err, TLM_EINVAL, entry, "prepack %d: argument %d, %lld floats", k,
                               arg, floats);
        p->arg[k] = arg;
        p->floats[k] = floats;
    }
    p->n = n;
    return 0;
}
