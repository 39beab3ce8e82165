/* fastref.c — the fast reference for contraction anchors: double-precision BLAS.
 *
 * The naive interpreter spends ~20 ns per multiply-add walking expression trees, so checking a
 * kernel of several GMAC took minutes. Here the anchor of a dense, batch_matmul or conv2d
 * subgraph is one or a few cblas_dgemm calls (convolutions through im2col, per group and in
 * chunks of output rows so the column buffer stays small; a pointwise conv needs no im2col),
 * and a depthwise conv is plain loops. Everything stays in double, so the only difference from
 * the interpreter is the summation order (~1e-16 relative per term). interp.c calls
 * ir_fastref_anchor in place of the anchor stage and evaluates every other stage itself, so
 * epilogue semantics are shared.
 *
 * The family is read from g->wl; the two tensors are found as the anchor's two loads (the
 * activation first, as build.c emits them) and their shapes are checked against the layouts
 * of ir.h. Anything unexpected means "not applicable" and the caller stays naive. The anchor's
 * index expressions themselves are not read: a corrupted anchor index goes unnoticed here
 * (ir_interp_run_f64 reports it).
 */
#include "compiler/ir/ir.h"

#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* Column buffer budget per im2col chunk (doubles): 32 MiB. */
#define FASTREF_COL_ELEMS (INT64_C(1) << 22)

typedef struct {
    int x, w;             /* tensor indices: activation (A / X) and weights (B / Wt) */
    int64_t H, W, OH, OW; /* convs, as lowered (a pointwise one's positions one axis) */
} fr_plan;

static bool fits_int(int64_t v)
{
    return v >= 0 && v <= INT_MAX;
}

static bool shape_is(const ir_tensor *t, int ndim, const int64_t *shape)
{
    if (t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

static bool plan(const ir_subgraph *g, fr_plan *p)
{
    const ir_workload *w = &g->wl;
    if (w->op != IR_OP_DENSE && w->op != IR_OP_BATCH_MATMUL && w->op != IR_OP_CONV2D &&
        w->op != IR_OP_DEPTHWISE_CONV2D)
        return false;
    if (g->anchor < 0 || g->anchor >= g->n_stage) return false;
    const ir_stage *s = &g->stage[g->anchor];
    if (s->reduce != IR_RED_SUM || s->post_scale != 1.0) return false;
    int loads[2], nl = 0;
    for (int e = 0; e < s->n_expr; e++) {
        if (s->expr[e].kind != IR_E_LOAD) continue;
        if (nl == 2) return false;
        loads[nl++] = s->expr[e].tensor;
    }
    if (nl != 2 || loads[0] == loads[1]) return false;
    for (int i = 0; i < 2; i++)
        if (loads[i] < 0 || loads[i] >= g->n_tensor || g->tensor[loads[i]].kind != IR_T_INPUT)
            return false;
    p->x = loads[0], p->w = loads[1];
    const ir_tensor *X = &g->tensor[p->x], *Wt = &g->tensor[p->w], *O = &g->tensor[s->out];
    const int64_t *sh = w->shape;
    bool nhwc = w->layout == IR_NHWC;

    if (w->op == IR_OP_DENSE || w->op == IR_OP_BATCH_MATMUL) {
        bool bmm = w->op == IR_OP_BATCH_MATMUL;
        int64_t B = bmm ? sh[IR_BMM_B] : 1, M = sh[bmm ? IR_BMM_M : IR_DENSE_M],
                N = sh[bmm ? IR_BMM_N : IR_DENSE_N], K = sh[bmm ? IR_BMM_K : IR_DENSE_K];
        if (!fits_int(M) || !fits_int(N) || !fits_int(K)) return false;
        int nb = bmm ? 1 : 0;
        int64_t sa[3] = {B, 0, 0}, sb[3] = {B, 0, 0}, so[3] = {B, 0, 0};
        sa[nb] = w->transpose_a ? K : M, sa[nb + 1] = w->transpose_a ? M : K;
        sb[nb] = w->transpose_b ? N : K, sb[nb + 1] = w->transpose_b ? K : N;
        so[nb] = M, so[nb + 1] = N;
        return shape_is(X, 2 + nb, sa) && shape_is(Wt, 2 + nb, sb) && shape_is(O, 2 + nb, so);
    }

    ir_workload_out_hw(w, &p->OH, &p->OW);
    if (w->op == IR_OP_DEPTHWISE_CONV2D) {
        int64_t N = sh[IR_DW_N], C = sh[IR_DW_C], H = sh[IR_DW_H], W = sh[IR_DW_W],
                KH = sh[IR_DW_KH], KW = sh[IR_DW_KW];
        int64_t xs[4] = {N, C, H, W}, ws[3] = {C, KH, KW}, os[4] = {N, C, p->OH, p->OW};
        if (nhwc) {
            int64_t xn[4] = {N, H, W, C}, wn[3] = {KH, KW, C}, on[4] = {N, p->OH, p->OW, C};
            memcpy(xs, xn, sizeof xs), memcpy(ws, wn, sizeof ws), memcpy(os, on, sizeof os);
        }
        return shape_is(X, 4, xs) && shape_is(Wt, 3, ws) && shape_is(O, 4, os);
    }

    int64_t N = sh[IR_CONV_N], C = sh[IR_CONV_C], H = sh[IR_CONV_H], W = sh[IR_CONV_W],
            F = sh[IR_CONV_F], KH = sh[IR_CONV_KH], KW = sh[IR_CONV_KW], G = w->groups;
    if (ir_conv_pointwise(w)) W = p->OW = H * W, H = p->OH = 1; /* as lowered (ir/build.c) */
    p->H = H, p->W = W;
    if (G < 1 || C % G || F % G) return false;
    int64_t Cg = C / G, Kc = Cg * KH * KW, OH = p->OH, OW = p->OW;
    /* dgemm extents and leading dimensions: NCHW ldc = OH*OW, NHWC lda = C and ldb = F;
     * an im2col chunk has at most max(FASTREF_COL_ELEMS / Kc, OW) columns. */
    if (!fits_int(Kc) || !fits_int(F) || !fits_int(C) || !fits_int(H * W) || !fits_int(OH * OW) ||
        !fits_int(OW))
        return false;
    int64_t xs[4] = {N, C, H, W};
    if (nhwc) xs[1] = H, xs[2] = W, xs[3] = C;
    /* Weights and output are declared with F split into (G, F/G) when grouped: same memory. */
    int wn = Wt->ndim, on = O->ndim;
    if (!shape_is(X, 4, xs) || ir_tensor_numel(Wt) != F * Kc || wn < 4 ||
        ir_tensor_numel(O) != N * F * OH * OW || on < 4 || O->shape[0] != N)
        return false;
    if (!nhwc)
        return Wt->shape[wn - 3] == Cg && Wt->shape[wn - 2] == KH && Wt->shape[wn - 1] == KW &&
               O->shape[on - 2] == OH && O->shape[on - 1] == OW;
    return Wt->shape[0] == KH && Wt->shape[1] == KW && Wt->shape[2] == Cg && O->shape[1] == OH &&
           O->shape[2] == OW;
}

bool ir_fastref_applies(const ir_subgraph *g)
{
    fr_plan p;
    return plan(g, &p);
}

/* ---- dense and batch_matmul ---- */

static void fr_matmul(const ir_workload *w, const double *A, const double *B, double *out)
{
    bool bmm = w->op == IR_OP_BATCH_MATMUL;
    const int64_t *sh = w->shape;
    int64_t Bt = bmm ? sh[IR_BMM_B] : 1, M = sh[bmm ? IR_BMM_M : IR_DENSE_M],
            N = sh[bmm ? IR_BMM_N : IR_DENSE_N], K = sh[bmm ? IR_BMM_K : IR_DENSE_K];
    // A (Bt, M, K) or (Bt, K, M); B (Bt, K, N) or (Bt, N, K); out (Bt, M, N)
    for (int64_t b = 0; b < Bt; b++)
        cblas_dgemm(CblasRowMajor, w->transpose_a ? CblasTrans : CblasNoTrans,
                    w->transpose_b ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, 1.0,
                    A + b * M * K, (int)(w->transpose_a ? M : K), B + b * K * N,
                    (int)(w->transpose_b ? K : N), 0.0, out + b * M * N, (int)N);
}

/* ---- conv2d: im2col + dgemm, per group, in chunks of output rows ---- */

typedef struct {
    int64_t N, C, H, W, F, KH, KW, G, Cg, Fg, Kc, OH, OW;
    int64_t sh, sw, ph, pw, dh, dw;
} conv_geom;

static void conv_geom_of(const ir_workload *w, const fr_plan *p, conv_geom *c)
{
    const int64_t *s = w->shape;
    c->N = s[IR_CONV_N], c->C = s[IR_CONV_C], c->H = p->H, c->W = p->W;
    c->F = s[IR_CONV_F], c->KH = s[IR_CONV_KH], c->KW = s[IR_CONV_KW], c->G = w->groups;
    c->Cg = c->C / c->G, c->Fg = c->F / c->G, c->Kc = c->Cg * c->KH * c->KW;
    c->OH = p->OH, c->OW = p->OW;
    c->sh = w->stride[0], c->sw = w->stride[1], c->ph = w->pad[0], c->pw = w->pad[1];
    c->dh = w->dilation[0], c->dw = w->dilation[1];
}

/* Output rows per chunk so that the column buffer stays within FASTREF_COL_ELEMS. */
static int64_t chunk_rows(const conv_geom *c, int64_t total)
{
    int64_t r = FASTREF_COL_ELEMS / (c->Kc * c->OW);
    if (r < 1) r = 1;
    return r < total ? r : total;
}

static bool pointwise(const conv_geom *c)
{
    return c->KH == 1 && c->KW == 1 && c->sh == 1 && c->sw == 1 && c->ph == 0 && c->pw == 0;
}

/* NCHW: out[n, g*Fg + f, oh, ow] = sum_k Wt_g[f, k] * col[k, (oh, ow)], k = (c, kh, kw). */
static int fr_conv_nchw(const conv_geom *c, const double *X, const double *Wt, double *out)
{
    int64_t HW = c->H * c->W, OHW = c->OH * c->OW;
    if (pointwise(c)) {
        for (int64_t n = 0; n < c->N; n++)
            for (int64_t g = 0; g < c->G; g++)
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c->Fg, (int)HW,
                            (int)c->Cg, 1.0, Wt + g * c->Fg * c->Cg, (int)c->Cg,
                            X + (n * c->C + g * c->Cg) * HW, (int)HW, 0.0,
                            out + (n * c->F + g * c->Fg) * OHW, (int)OHW);
        return 0;
    }
    int64_t rows = chunk_rows(c, c->OH);
    double *col = malloc(sizeof(double) * (size_t)(c->Kc * rows * c->OW));
    if (!col) return TLM_ENOMEM;
    for (int64_t n = 0; n < c->N; n++)
        for (int64_t g = 0; g < c->G; g++)
            for (int64_t oh0 = 0; oh0 < c->OH; oh0 += rows) {
                int64_t nr = c->OH - oh0 < rows ? c->OH - oh0 : rows, P = nr * c->OW;
                // col (Kc, P)
                for (int64_t ci = 0; ci < c->Cg; ci++) {
                    const double *xc = X + (n * c->C + g * c->Cg + ci) * HW;
                    for (int64_t kh = 0; kh < c->KH; kh++)
                        for (int64_t kw = 0; kw < c->KW; kw++) {
                            double *dst = col + ((ci * c->KH + kh) * c->KW + kw) * P;
                            for (int64_t r = 0; r < nr; r++) {
                                int64_t ih = (oh0 + r) * c->sh + kh * c->dh - c->ph;
                                double *d = dst + r * c->OW;
                                if (ih < 0 || ih >= c->H) {
                                    memset(d, 0, sizeof(double) * (size_t)c->OW);
                                    continue;
                                }
                                const double *xr = xc + ih * c->W;
                                for (int64_t ow = 0; ow < c->OW; ow++) {
                                    int64_t iw = ow * c->sw + kw * c->dw - c->pw;
                                    d[ow] = iw >= 0 && iw < c->W ? xr[iw] : 0.0;
                                }
                            }
                        }
                }
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c->Fg, (int)P,
                            (int)c->Kc, 1.0, Wt + g * c->Fg * c->Kc, (int)c->Kc, col, (int)P, 0.0,
                            out + (n * c->F + g * c->Fg) * OHW + oh0 * c->OW, (int)OHW);
            }
    free(col);
    return 0;
}

/* NHWC: out[(n, oh, ow), g*Fg + f] = sum_k col[(n, oh, ow), k] * Wt[k, g*Fg + f],
 * k = (kh, kw, c); the rows (n, oh) are flattened so small images still make long GEMMs. */
static int fr_conv_nhwc(const conv_geom *c, const double *X, const double *Wt, double *out)
{
    if (pointwise(c)) {
        for (int64_t g = 0; g < c->G; g++)
            for (int64_t n = 0; n < c->N; n++)
                cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(c->H * c->W),
                            (int)c->Fg, (int)c->Cg, 1.0, X + n * c->H * c->W * c->C + g * c->Cg,
                            (int)c->C, Wt + g * c->Fg, (int)c->F, 0.0,
                            out + n * c->H * c->W * c->F + g * c->Fg, (int)c->F);
        return 0;
    }
    int64_t total = c->N * c->OH, rows = chunk_rows(c, total);
    double *col = malloc(sizeof(double) * (size_t)(c->Kc * rows * c->OW));
    if (!col) return TLM_ENOMEM;
    for (int64_t g = 0; g < c->G; g++)
        for (int64_t r0 = 0; r0 < total; r0 += rows) {
            int64_t nr = total - r0 < rows ? total - r0 : rows, P = nr * c->OW;
            // col (P, Kc)
            for (int64_t r = 0; r < nr; r++) {
                int64_t n = (r0 + r) / c->OH, oh = (r0 + r) % c->OH;
                for (int64_t ow = 0; ow < c->OW; ow++) {
                    double *d = col + (r * c->OW + ow) * c->Kc;
                    for (int64_t kh = 0; kh < c->KH; kh++) {
                        int64_t ih = oh * c->sh + kh * c->dh - c->ph;
                        for (int64_t kw = 0; kw < c->KW; kw++, d += c->Cg) {
                            int64_t iw = ow * c->sw + kw * c->dw - c->pw;
                            if (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) {
                                memset(d, 0, sizeof(double) * (size_t)c->Cg);
                                continue;
                            }
                            memcpy(d, X + ((n * c->H + ih) * c->W + iw) * c->C + g * c->Cg,
                                   sizeof(double) * (size_t)c->Cg);
                        }
                    }
                }
            }
            cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)P, (int)c->Fg, (int)c->Kc,
                        1.0, col, (int)c->Kc, Wt + g * c->Fg, (int)c->F, 0.0,
                        out + r0 * c->OW * c->F + g * c->Fg, (int)c->F);
        }
    free(col);
    return 0;
}

/* ---- depthwise: direct loops (KH*KW multiply-adds per output; cheap) ---- */

static void fr_depthwise(const ir_workload *w, const fr_plan *p, const double *X, const double *Wt,
                         double *out)
{
    const int64_t *s = w->shape;
    int64_t N = s[IR_DW_N], C = s[IR_DW_C], H = s[IR_DW_H], W = s[IR_DW_W], KH = s[IR_DW_KH],
            KW = s[IR_DW_KW], OH = p->OH, OW = p->OW;
    int64_t sh = w->stride[0], sw = w->stride[1], ph = w->pad[0], pw = w->pad[1],
            dh = w->dilation[0], dw = w->dilation[1];
    /* A padded tap contributes 0 * w, as the interpreter's select does: 0 for a finite weight,
     * NaN for a non-finite one, which must not vanish. */
    if (w->layout == IR_NCHW) {
        for (int64_t nc = 0; nc < N * C; nc++) {
            const double *xc = X + nc * H * W, *wc = Wt + (nc % C) * KH * KW;
            double *oc = out + nc * OH * OW; // (OH, OW)
            for (int64_t i = 0; i < OH * OW; i++)
                oc[i] = 0.0;
            for (int64_t kh = 0; kh < KH; kh++)
                for (int64_t kw = 0; kw < KW; kw++) {
                    double wt = wc[kh * KW + kw], pad = 0.0 * wt;
                    int64_t off = kw * dw - pw; /* iw = ow * sw + off */
                    int64_t lo = off >= 0 ? 0 : (-off + sw - 1) / sw;
                    int64_t hi = W - 1 - off < 0 ? 0 : (W - 1 - off) / sw + 1;
                    if (hi > OW) hi = OW;
                    if (lo > hi) lo = hi;
                    for (int64_t oh = 0; oh < OH; oh++) {
                        int64_t ih = oh * sh + kh * dh - ph;
                        double *o = oc + oh * OW;
                        if (ih < 0 || ih >= H) {
                            if (pad != 0.0)
                                for (int64_t ow = 0; ow < OW; ow++)
                                    o[ow] += pad;
                            continue;
                        }
                        const double *xr = xc + ih * W;
                        if (pad != 0.0) {
                            for (int64_t ow = 0; ow < lo; ow++)
                                o[ow] += pad;
                            for (int64_t ow = hi; ow < OW; ow++)
                                o[ow] += pad;
                        }
                        for (int64_t ow = lo; ow < hi; ow++)
                            o[ow] += xr[ow * sw + off] * wt;
                    }
                }
        }
        return;
    }
    for (int64_t n = 0; n < N; n++)
        for (int64_t oh = 0; oh < OH; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                double *o = out + ((n * OH + oh) * OW + ow) * C;
                for (int64_t c = 0; c < C; c++)
                    o[c] = 0.0;
                for (int64_t kh = 0; kh < KH; kh++) {
                    int64_t ih = oh * sh + kh * dh - ph;
                    for (int64_t kw = 0; kw < KW; kw++) {
                        int64_t iw = ow * sw + kw * dw - pw;
                        const double *wk = Wt + (kh * KW + kw) * C;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) {
                            for (int64_t c = 0; c < C; c++)
                                o[c] += 0.0 * wk[c];
                            continue;
                        }
                        const double *x = X + ((n * H + ih) * W + iw) * C;
                        for (int64_t c = 0; c < C; c++)
                            o[c] += x[c] * wk[c];
                    }
                }
            }
}

int ir_fastref_anchor(const ir_subgraph *g, const double *const *buf, double *out, tlm_error *err)
{
    fr_plan p;
    if (!plan(g, &p))
        return tlm_err_set(err, TLM_EUNSUPPORTED, "", "no fast reference for stage %s",
                           g->anchor >= 0 && g->anchor < g->n_stage ? g->stage[g->anchor].name
                                                                    : "?");
    const ir_workload *w = &g->wl;
    const double *X = buf[p.x], *Wt = buf[p.w];
    int rc = 0;
    switch (w->op) {
    case IR_OP_DENSE:
    case IR_OP_BATCH_MATMUL:
        fr_matmul(w, X, Wt, out);
        break;
    case IR_OP_DEPTHWISE_CONV2D:
        fr_depthwise(w, &p, X, Wt, out);
        break;
    default: {
        conv_geom c;
        conv_geom_of(w, &p, &c);
        rc = w->layout == IR_NHWC ? fr_conv_nhwc(&c, X, Wt, out) : fr_conv_nchw(&c, X, Wt, out);
        break;
    }
    }
    if (rc) return tlm_err_set(err, rc, "", "out of memory for the im2col buffer");
    return 0;
}
