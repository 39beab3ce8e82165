/* interp.c — the reference interpreter: the oracle of every correctness check.
 *
 * Deliberately naive: every stage is evaluated point by point over its whole domain with
 * double arithmetic, every intermediate tensor is materialised in double, nothing is fused
 * or reordered. Speed does not matter here; obviousness does.
 */
#include "compiler/ir/ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const ir_subgraph *g;
    double *buf[IR_MAX_TENSORS]; /* every tensor, in double */
    int64_t strides[IR_MAX_TENSORS][IR_MAX_DIMS];
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
    /* Output index = row-major over the spatial axes (the output's dims, in order). */
    for (int64_t p = 0; p < nsp; p++) {
        int64_t rem = p;
        for (int a = ns - 1; a >= 0; a--) {
            iv[a] = rem % s->extent[a];
            rem /= s->extent[a];
        }
        double acc;
        if (s->reduce == IR_RED_NONE) {
            acc = eval(in, s, s->body, iv, &oob);
        } else {
            acc = s->reduce == IR_RED_SUM ? 0.0 : -INFINITY;
            for (int64_t q = 0; q < nred; q++) {
                int64_t r = q;
                for (int a = ns + nr - 1; a >= ns; a--) {
                    iv[a] = r % s->extent[a];
                    r /= s->extent[a];
                }
                double v = eval(in, s, s->body, iv, &oob);
                if (s->reduce == IR_RED_SUM) acc += v;
                else if (v > acc || isnan(v)) acc = v;
            }
            acc *= s->post_scale;
        }
        out[p] = acc;
    }
    if (oob)
        return tlm_err_set(err, TLM_EINVAL, "", "internal: stage %s loads out of bounds",
                           s->name);
    return 0;
}

int ir_interp_run_f64(const ir_subgraph *g, const float *const *inputs, double *out,
                      tlm_error *err)
{
    interp in;
    memset(&in, 0, sizeof in);
    in.g = g;
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
    for (int i = 0; i < g->n_stage && rc == 0; i++) rc = run_stage(&in, &g->stage[i], err);
done:
    for (int t = 0; t < g->n_tensor; t++)
        if (g->tensor[t].kind != IR_T_OUTPUT) free(in.buf[t]);
    return rc;
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
