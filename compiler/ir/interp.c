/* interp.c — the reference interpreter: the oracle of every correctness check.
 *
 * Deliberately naive: every stage is evaluated point by point over its whole domain with
 * double arithmetic, every intermediate tensor is materialised in double, nothing is fused
 * or reordered. Speed does not matter here; obviousness does.
 * The one exception is ir_interp_fast_f64 (the measure module's reference), which hands a
 * contraction anchor to fastref.c (double BLAS) and evaluates every other stage here, the
 * stages without reduction or select a segment of their last axis at a time (run_segments):
 * the same scalar operations per element, so the two differ only in the anchor's summation
 * order.
 */
#include "compiler/ir/ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const ir_subgraph *g;
    double *buf[IR_MAX_TENSORS]; /* every tensor, in double */
    int64_t strides[IR_MAX_TENSORS][IR_MAX_DIMS];
    bool fast; /* ir_interp_fast_f64 */
} interp;

static int64_t affine_eval(const ir_affine *a, const int64_t *iv, int n)
{
    int64_t v = a->off;
    for (int i = 0; i < n; i++) v += (int64_t)a->coef[i] * iv[i];
    return v;
}

static double eval(const interp *in, const ir_stage *s, int id, const int64_t *iv, int *oob)
{
    const ir_expr *e = &s->expr[id];
    int n = s->n_spatial + s->n_reduce;
    switch (e->kind) {
    case IR_E_CONST: return e->value;
    case IR_E_LOAD: {
        const ir_tensor *t = &in->g->tensor[e->tensor];
        int64_t off = 0;
        for (int d = 0; d < t->ndim; d++) {
            int64_t x = affine_eval(&e->idx[d], iv, n);
            if (x < 0 || x >= t->shape[d]) {
                /* An unguarded out-of-range load is a bug in the IR, never input data. */
                *oob = 1;
                return NAN;
            }
            off += x * in->strides[e->tensor][d];
        }
        return in->buf[e->tensor][off];
    }
    case IR_E_UNARY: return ir_unop_eval((ir_unop)e->op, eval(in, s, e->a, iv, oob));
    case IR_E_BINARY:
        return ir_binop_eval((ir_binop)e->op, eval(in, s, e->a, iv, oob),
                             eval(in, s, e->b, iv, oob));
    case IR_E_SELECT:
        for (int c = 0; c < e->ncond; c++) {
            int64_t x = affine_eval(&e->cond[c], iv, n);
            if (x < 0 || x >= e->cond_hi[c]) return eval(in, s, e->b, iv, oob);
        }
        return eval(in, s, e->a, iv, oob);
    }
    return NAN;
}

static int run_stage(const interp *in, const ir_stage *s, tlm_error *err)
{
    int ns = s->n_spatial, nr = s->n_reduce;
    int64_t iv[IR_MAX_AXES] = {0};
    double *out = in->buf[s->out];
    int64_t nsp = 1, nred = 1;
    for (int a = 0; a < ns; a++) nsp *= s->extent[a];
    for (int a = ns; a < ns + nr; a++) nred *= s->extent[a];
    int oob = 0;
    /* Output index = row-major over the spatial axes (the output's dims, in order); iv steps
     * through that order like an odometer (the last axis fastest), reductions likewise. */
    for (int64_t p = 0; p < nsp; p++) {
        double acc;
        if (s->reduce == IR_RED_NONE) {
            acc = eval(in, s, s->body, iv, &oob);
        } else {
            acc = s->reduce == IR_RED_SUM ? 0.0 : -INFINITY;
            for (int a = ns; a < ns + nr; a++) iv[a] = 0;
            for (int64_t q = 0; q < nred; q++) {
                double v = eval(in, s, s->body, iv, &oob);
                if (s->reduce == IR_RED_SUM) acc += v;
                else if (v > acc || isnan(v)) acc = v;
                for (int a = ns + nr - 1; a >= ns && ++iv[a] == s->extent[a]; a--) iv[a] = 0;
            }
            acc *= s->post_scale;
        }
        out[p] = acc;
        for (int a = ns - 1; a >= 0 && ++iv[a] == s->extent[a]; a--) iv[a] = 0;
    }
    if (oob)
        return tlm_err_set(err, TLM_EINVAL, "", "internal: stage %s loads out of bounds",
                           s->name);
    return 0;
}

/* ---- ir_interp_fast_f64 only: stages without reduction or select (epilogues, elementwise,
 * the last stage of softmax and the norms), SEG elements of the last spatial axis at a time.
 * Every live expression node is evaluated over the segment with the same scalar functions as
 * eval(), element by element, so the values are bit-identical; only the index arithmetic is
 * amortised. An affine index is linear along the segment, so checking both ends of it checks
 * every element. Without select every node is evaluated at every point, as in eval(). ---- */

#define SEG 512

static bool segments_apply(const ir_stage *s)
{
    if (s->reduce != IR_RED_NONE || s->n_spatial < 1 || s->n_reduce != 0) return false;
    for (int e = 0; e < s->n_expr; e++)
        if (s->expr[e].kind == IR_E_SELECT) return false;
    return true;
}

static int run_segments(const interp *in, const ir_stage *s, tlm_error *err)
{
    int ns = s->n_spatial, last = ns - 1;
    int64_t L = s->extent[last], nrow = 1;
    for (int a = 0; a < last; a++) nrow *= s->extent[a];
    bool live[IR_MAX_EXPR] = {false};
    live[s->body] = true;
    for (int e = s->n_expr - 1; e >= 0; e--) {
        const ir_expr *x = &s->expr[e];
        if (!live[e]) continue;
        if (x->kind == IR_E_UNARY || x->kind == IR_E_BINARY) live[x->a] = true;
        if (x->kind == IR_E_BINARY) live[x->b] = true;
    }
    double *v = malloc(sizeof(double) * (size_t)s->n_expr * SEG); // (n_expr, SEG)
    if (!v) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory for stage %s", s->name);
    double *out = in->buf[s->out];
    int64_t iv[IR_MAX_AXES] = {0};
    int oob = 0;
    for (int64_t r = 0; r < nrow && !oob; r++) {
        for (int64_t i0 = 0; i0 < L && !oob; i0 += SEG) {
            int64_t len = L - i0 < SEG ? L - i0 : SEG;
            iv[last] = i0;
            for (int e = 0; e < s->n_expr && !oob; e++) {
                if (!live[e]) continue;
                const ir_expr *x = &s->expr[e];
                double *d = v + (size_t)e * SEG;
                const double *a = x->a >= 0 ? v + (size_t)x->a * SEG : NULL;
                const double *b = x->b >= 0 ? v + (size_t)x->b * SEG : NULL;
                switch (x->kind) {
                case IR_E_CONST:
                    for (int64_t i = 0; i < len; i++) d[i] = x->value;
                    break;
                case IR_E_LOAD: {
                    const ir_tensor *t = &in->g->tensor[x->tensor];
                    int64_t off = 0, step = 0;
                    for (int k = 0; k < t->ndim; k++) {
                        int64_t x0 = affine_eval(&x->idx[k], iv, ns);
                        int64_t x1 = x0 + (int64_t)x->idx[k].coef[last] * (len - 1);
                        if (x0 < 0 || x0 >= t->shape[k] || x1 < 0 || x1 >= t->shape[k]) oob = 1;
                        off += x0 * in->strides[x->tensor][k];
                        step += (int64_t)x->idx[k].coef[last] * in->strides[x->tensor][k];
                    }
                    if (oob) break;
                    const double *src = in->buf[x->tensor] + off;
                    for (int64_t i = 0; i < len; i++) d[i] = src[i * step];
                    break;
                }
                case IR_E_UNARY:
                    for (int64_t i = 0; i < len; i++) d[i] = ir_unop_eval((ir_unop)x->op, a[i]);
                    break;
                case IR_E_BINARY:
                    for (int64_t i = 0; i < len; i++)
                        d[i] = ir_binop_eval((ir_binop)x->op, a[i], b[i]);
                    break;
                case IR_E_SELECT: oob = 1; break; /* excluded by segments_apply */
                }
            }
            if (!oob)
                memcpy(out + r * L + i0, v + (size_t)s->body * SEG, sizeof(double) * (size_t)len);
        }
        for (int a = last - 1; a >= 0 && ++iv[a] == s->extent[a]; a--) iv[a] = 0;
    }
    free(v);
    if (oob)
        return tlm_err_set(err, TLM_EINVAL, "", "internal: stage %s loads out of bounds",
                           s->name);
    return 0;
}

static int interp_run(const ir_subgraph *g, const float *const *inputs, double *out, bool fast,
                      tlm_error *err)
{
    interp in;
    memset(&in, 0, sizeof in);
    in.g = g;
    in.fast = fast;
    int rc = 0, k = 0;
    for (int t = 0; t < g->n_tensor; t++) {
        const ir_tensor *ts = &g->tensor[t];
        int64_t n = ir_tensor_numel(ts);
        int64_t st = 1;
        for (int d = ts->ndim - 1; d >= 0; d--) {
            in.strides[t][d] = st;
            st *= ts->shape[d];
        }
        if (ts->kind == IR_T_OUTPUT) {
            in.buf[t] = out;
            continue;
        }
        in.buf[t] = malloc((size_t)n * sizeof(double));
        if (!in.buf[t]) {
            rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory for tensor %s", ts->name);
            goto done;
        }
        if (ts->kind == IR_T_INPUT) {
            const float *src = inputs[k++];
            for (int64_t i = 0; i < n; i++) in.buf[t][i] = src[i];
        }
    }
    for (int i = 0; i < g->n_stage && rc == 0; i++) {
        const ir_stage *s = &g->stage[i];
        if (fast && i == g->anchor && ir_fastref_applies(g))
            rc = ir_fastref_anchor(g, (const double *const *)in.buf, in.buf[s->out], err);
        else if (fast && segments_apply(s))
            rc = run_segments(&in, s, err);
        else
            rc = run_stage(&in, s, err);
    }
done:
    for (int t = 0; t < g->n_tensor; t++)
        if (g->tensor[t].kind != IR_T_OUTPUT) free(in.buf[t]);
    return rc;
}

int ir_interp_run_f64(const ir_subgraph *g, const float *const *inputs, double *out,
                      tlm_error *err)
{
    return interp_run(g, inputs, out, false, err);
}

int ir_interp_fast_f64(const ir_subgraph *g, const float *const *inputs, double *out,
                       tlm_error *err)
{
    return interp_run(g, inputs, out, true, err);
}

int ir_interp_run(const ir_subgraph *g, const float *const *inputs, float *out, tlm_error *err)
{
    int64_t n = ir_tensor_numel(&g->tensor[g->output]);
    double *tmp = malloc((size_t)n * sizeof(double));
    if (!tmp) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory for the output");
    int rc = ir_interp_run_f64(g, inputs, tmp, err);
    if (rc == 0)
        for (int64_t i = 0; i < n; i++) out[i] = (float)tmp[i];
    free(tmp);
    return rc;
}
