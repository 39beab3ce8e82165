/* test_interp.c — the reference interpreter against independently written naive loops.
 *
 * The interpreter is the oracle of every correctness check in the project, so it is checked
 * here against references written straight from the textbook definitions: plain loops in
 * double that read only the workload's fields and ir.h's documented layouts, never the
 * lowered stages. A mistake in lowering (an index, a transpose, a group offset, the padding
 * rule) or in the interpreter shows up as a mismatch. Inputs are uniform random with fixed
 * seeds, so every run sees the same numbers.
 *
 * Tolerance: |got - ref| <= tol * max(|ref|, 1), tol = 1e-5 for ir_interp_run (float output)
 * and 1e-12 for ir_interp_run_f64 and ir_interp_fast_f64 (BLAS anchors for contractions; see
 * also test_fastref.c). Below 1 the bound is absolute on purpose: both sides sum
 * O(1) terms in different orders, which legitimately differs by ~1e-16 per term however small
 * the sum ends up; a wrong formula is off by far more.
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir/ir.h"

/* ---- random inputs (splitmix64, fixed seeds) ---- */

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-scale, scale]. */
static float rng_unif(uint64_t *s, double scale)
{
    double u = (double)(rng_next(s) >> 11) * 0x1.0p-53;
    return (float)(scale * (2.0 * u - 1.0));
}

/* ---- reference geometry, from the workload fields and ir.h only ---- */

static int64_t ref_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d)
{
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

typedef struct {
    int n_in; /* inputs of the op itself, before those of the epilogue */
    int64_t in_numel[3];
    int64_t out_numel;
    int64_t channels; /* length of a bias_add's bias */
    int64_t OH, OW;   /* convs and pools */
    int64_t sh, sw;   /* effective stride (pools default to the window) */
} geom;

static void ref_geom(const ir_workload *w, geom *g)
{
    const int64_t *s = w->shape;
    memset(g, 0, sizeof *g);
    switch (w->op) {
    case IR_OP_DENSE: {
        int64_t M = s[0], N = s[1], K = s[2];
        g->n_in = 2, g->in_numel[0] = M * K, g->in_numel[1] = K * N;
        g->out_numel = M * N, g->channels = N;
        break;
    }
    case IR_OP_BATCH_MATMUL: {
        int64_t B = s[0], M = s[1], N = s[2], K = s[3];
        g->n_in = 2, g->in_numel[0] = B * M * K, g->in_numel[1] = B * K * N;
        g->out_numel = B * M * N, g->channels = N;
        break;
    }
    case IR_OP_CONV2D: {
        int64_t N = s[0], C = s[1], H = s[2], W = s[3], F = s[4], KH = s[5], KW = s[6];
        g->sh = w->stride[0], g->sw = w->stride[1];
        g->OH = ref_out_size(H, KH, g->sh, w->pad[0], w->dilation[0]);
        g->OW = ref_out_size(W, KW, g->sw, w->pad[1], w->dilation[1]);
        g->n_in = 2, g->in_numel[0] = N * C * H * W, g->in_numel[1] = F * (C / w->groups) * KH * KW;
        g->out_numel = N * F * g->OH * g->OW, g->channels = F;
        break;
    }
    case IR_OP_DEPTHWISE_CONV2D:
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D: {
        int64_t N = s[0], C = s[1], H = s[2], W = s[3], KH = s[4], KW = s[5];
        bool pool = w->op != IR_OP_DEPTHWISE_CONV2D;
        g->sh = pool && w->stride[0] == 0 ? KH : w->stride[0];
        g->sw = pool && w->stride[1] == 0 ? KW : w->stride[1];
        int64_t dh = pool ? 1 : w->dilation[0], dw = pool ? 1 : w->dilation[1];
        g->OH = ref_out_size(H, KH, g->sh, w->pad[0], dh);
        g->OW = ref_out_size(W, KW, g->sw, w->pad[1], dw);
        g->n_in = pool ? 1 : 2, g->in_numel[0] = N * C * H * W, g->in_numel[1] = C * KH * KW;
        g->out_numel = N * C * g->OH * g->OW, g->channels = C;
        break;
    }
    case IR_OP_GLOBAL_AVG_POOL2D:
        g->n_in = 1, g->in_numel[0] = s[0] * s[1] * s[2] * s[3];
        g->out_numel = s[0] * s[1], g->channels = s[1];
        break;
    case IR_OP_SOFTMAX:
        g->n_in = 1, g->in_numel[0] = s[0] * s[1], g->out_numel = s[0] * s[1], g->channels = s[1];
        break;
    case IR_OP_LAYER_NORM:
        g->n_in = 3, g->in_numel[0] = s[0] * s[1], g->in_numel[1] = g->in_numel[2] = s[1];
        g->out_numel = s[0] * s[1], g->channels = s[1];
        break;
    case IR_OP_RMS_NORM:
        g->n_in = 2, g->in_numel[0] = s[0] * s[1], g->in_numel[1] = s[1];
        g->out_numel = s[0] * s[1], g->channels = s[1];
        break;
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX:
        g->n_in = 1, g->in_numel[0] = s[0] * s[1], g->out_numel = s[0], g->channels = s[0];
        break;
    case IR_OP_ELEMENTWISE:
        g->n_in = 1, g->in_numel[0] = s[0], g->out_numel = s[0], g->channels = s[0];
        break;
    case IR_OP_TRANSPOSE: /* out[C,R]: the last axis is R */
        g->n_in = 1, g->in_numel[0] = s[0] * s[1], g->out_numel = s[0] * s[1], g->channels = s[0];
        break;
    default:
        cr_assert_fail("no reference for op %d", w->op);
    }
}

/* Channel (bias index) of flat output element i. */
static int64_t ref_chan(const ir_workload *w, const geom *g, int64_t i)
{
    switch (w->op) {
    case IR_OP_CONV2D:
    case IR_OP_DEPTHWISE_CONV2D:
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D:
        if (w->layout == IR_NHWC) return i % g->channels;
        return (i / (g->OH * g->OW)) % g->channels;
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX:
    case IR_OP_ELEMENTWISE:
        return i;
    default:
        return i % g->channels; /* the last axis */
    }
}

/* ---- reference ops ---- */

static void ref_matmul(const ir_workload *w, const float *A, const float *B, double *out)
{
    bool bmm = w->op == IR_OP_BATCH_MATMUL;
    int64_t Bt = bmm ? w->shape[0] : 1, o = bmm ? 1 : 0;
    int64_t M = w->shape[o], N = w->shape[o + 1], K = w->shape[o + 2];
    for (int64_t b = 0; b < Bt; b++) {
        const float *a = A + b * M * K, *bb = B + b * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    double x = w->transpose_a ? a[k * M + m] : a[m * K + k];   /* [K,M] or [M,K] */
                    double y = w->transpose_b ? bb[n * K + k] : bb[k * N + n]; /* [N,K] or [K,N] */
                    acc += x * y;
                }
                out[(b * M + m) * N + n] = acc;
            }
    }
}

static void ref_conv2d(const ir_workload *w, const geom *ge, const float *X, const float *Wt,
                       double *out)
{
    const int64_t *s = w->shape;
    int64_t N = s[0], C = s[1], H = s[2], W = s[3], F = s[4], KH = s[5], KW = s[6];
    int64_t G = w->groups, Cg = C / G, Fg = F / G, OH = ge->OH, OW = ge->OW;
    bool nhwc = w->layout == IR_NHWC;
    for (int64_t n = 0; n < N; n++)
        for (int64_t f = 0; f < F; f++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    int64_t grp = f / Fg;
                    double acc = 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < KH; kh++)
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t ih = oh * w->stride[0] - w->pad[0] + kh * w->dilation[0];
                                int64_t iw = ow * w->stride[1] - w->pad[1] + kw * w->dilation[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue; /* zero pad */
                                int64_t ci = grp * Cg + c;
                                double x = nhwc ? X[((n * H + ih) * W + iw) * C + ci]
                                                : X[((n * C + ci) * H + ih) * W + iw];
                                double k = nhwc ? Wt[((kh * KW + kw) * Cg + c) * F + f]   /* HWIO */
                                                : Wt[((f * Cg + c) * KH + kh) * KW + kw]; /* OIHW */
                                acc += x * k;
                            }
                    int64_t o = nhwc ? ((n * OH + oh) * OW + ow) * F + f
                                     : ((n * F + f) * OH + oh) * OW + ow;
                    out[o] = acc;
                }
}

/* depthwise conv, max pool, avg pool */
static void ref_window(const ir_workload *w, const geom *ge, const float *X, const float *Wt,
                       double *out)
{
    const int64_t *s = w->shape;
    int64_t N = s[0], C = s[1], H = s[2], W = s[3], KH = s[4], KW = s[5], OH = ge->OH, OW = ge->OW;
    bool nhwc = w->layout == IR_NHWC;
    bool dw = w->op == IR_OP_DEPTHWISE_CONV2D;
    int64_t dh = dw ? w->dilation[0] : 1, dwl = dw ? w->dilation[1] : 1;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double sum = 0, mx = -INFINITY;
                    for (int64_t kh = 0; kh < KH; kh++)
                        for (int64_t kw = 0; kw < KW; kw++) {
                            int64_t ih = oh * ge->sh - w->pad[0] + kh * dh;
                            int64_t iw = ow * ge->sw - w->pad[1] + kw * dwl;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                            double x = nhwc ? X[((n * H + ih) * W + iw) * C + c]
                                            : X[((n * C + c) * H + ih) * W + iw];
                            if (dw) {
                                double k =
                                    nhwc ? Wt[(kh * KW + kw) * C + c] : Wt[(c * KH + kh) * KW + kw];
                                sum += x * k;
                            } else {
                                sum += x;
                                if (x > mx) mx = x;
                            }
                        }
                    double v = w->op == IR_OP_MAX_POOL2D   ? mx
                               : w->op == IR_OP_AVG_POOL2D ? sum / (double)(KH * KW)
                                                           : sum;
                    int64_t o = nhwc ? ((n * OH + oh) * OW + ow) * C + c
                                     : ((n * C + c) * OH + oh) * OW + ow;
                    out[o] = v;
                }
}

static void ref_global_pool(const ir_workload *w, const float *X, double *out)
{
    int64_t N = w->shape[0], C = w->shape[1], H = w->shape[2], W = w->shape[3];
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) {
            double acc = 0;
            for (int64_t h = 0; h < H; h++)
                for (int64_t x = 0; x < W; x++)
                    acc += w->layout == IR_NHWC ? X[((n * H + h) * W + x) * C + c]
                                                : X[((n * C + c) * H + h) * W + x];
            out[n * C + c] = acc / (double)(H * W);
        }
}

static void ref_rows(const ir_workload *w, const float *const *in, double *out)
{
    int64_t R = w->shape[0], C = w->shape[1];
    const float *X = in[0];
    for (int64_t r = 0; r < R; r++) {
        const float *x = X + r * C;
        switch (w->op) {
        case IR_OP_SOFTMAX: { /* exp(x_i) / sum_j exp(x_j), as written in textbooks */
            double z = 0;
            for (int64_t c = 0; c < C; c++)
                z += exp((double)x[c]);
            for (int64_t c = 0; c < C; c++)
                out[r * C + c] = exp((double)x[c]) / z;
            break;
        }
        case IR_OP_LAYER_NORM: {
            double mean = 0, var = 0;
            for (int64_t c = 0; c < C; c++)
                mean += x[c];
            mean /= (double)C;
            for (int64_t c = 0; c < C; c++)
                var += (x[c] - mean) * (x[c] - mean);
            var /= (double)C; /* biased, as every framework's layer_norm */
            for (int64_t c = 0; c < C; c++)
                out[r * C + c] = (x[c] - mean) / sqrt(var + w->eps) * in[1][c] + in[2][c];
            break;
        }
        case IR_OP_RMS_NORM: {
            double ms = 0;
            for (int64_t c = 0; c < C; c++)
                ms += (double)x[c] * x[c];
            ms /= (double)C;
            for (int64_t c = 0; c < C; c++)
                out[r * C + c] = x[c] / sqrt(ms + w->eps) * in[1][c];
            break;
        }
        case IR_OP_REDUCE_SUM:
        case IR_OP_REDUCE_MEAN: {
            double acc = 0;
            for (int64_t c = 0; c < C; c++)
                acc += x[c];
            out[r] = w->op == IR_OP_REDUCE_MEAN ? acc / (double)C : acc;
            break;
        }
        case IR_OP_REDUCE_MAX: {
            double m = x[0];
            for (int64_t c = 1; c < C; c++)
                if (x[c] > m) m = x[c];
            out[r] = m;
            break;
        }
        case IR_OP_TRANSPOSE:
            for (int64_t c = 0; c < C; c++)
                out[c * R + r] = x[c];
            break;
        default:
            cr_assert_fail("not a row op");
        }
    }
}

static void ref_anchor(const ir_workload *w, const geom *ge, const float *const *in, double *out)
{
    switch (w->op) {
    case IR_OP_DENSE:
    case IR_OP_BATCH_MATMUL:
        ref_matmul(w, in[0], in[1], out);
        break;
    case IR_OP_CONV2D:
        ref_conv2d(w, ge, in[0], in[1], out);
        break;
    case IR_OP_DEPTHWISE_CONV2D:
        ref_window(w, ge, in[0], in[1], out);
        break;
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D:
        ref_window(w, ge, in[0], NULL, out);
        break;
    case IR_OP_GLOBAL_AVG_POOL2D:
        ref_global_pool(w, in[0], out);
        break;
    case IR_OP_ELEMENTWISE:
        for (int64_t i = 0; i < ge->out_numel; i++)
            out[i] = in[0][i];
        break;
    default:
        ref_rows(w, in, out);
        break;
    }
}

/* The epilogue chain, in order, reading the extra inputs after the op's own. */
static void ref_epilogue(const ir_workload *w, const geom *ge, const float *const *in, double *out)
{
    int k = ge->n_in;
    for (int e = 0; e < w->n_epilogue; e++) {
        const float *x = NULL;
        if (w->epilogue[e] <= IR_EPI_MUL) x = in[k++];
        for (int64_t i = 0; i < ge->out_numel; i++) {
            double v = out[i];
            switch (w->epilogue[e]) {
            case IR_EPI_BIAS_ADD:
                v += x[ref_chan(w, ge, i)];
                break;
            case IR_EPI_ADD:
                v += x[i];
                break;
            case IR_EPI_MUL:
                v *= x[i];
                break;
            case IR_EPI_RELU:
                v = v > 0 ? v : 0;
                break;
            case IR_EPI_RELU6:
                v = fmin(fmax(v, 0.0), 6.0);
                break;
            case IR_EPI_GELU:
                v = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
                break;
            case IR_EPI_SILU:
                v = v * (1.0 / (1.0 + exp(-v)));
                break;
            case IR_EPI_SIGMOID:
                v = 1.0 / (1.0 + exp(-v));
                break;
            case IR_EPI_TANH:
                v = tanh(v);
                break;
            default:
                cr_assert_fail("unknown epilogue");
            }
            out[i] = v;
        }
    }
}

/* ---- the driver: build, feed random inputs, compare both interpreter entry points ---- */

typedef struct {
    ir_subgraph *g;
    geom ge;
    int nin;
    float *in[IR_MAX_TENSORS];
    double *ref, *f64;
    float *f32;
} run_t;

static void run_free(run_t *r)
{
    for (int i = 0; i < r->nin; i++)
        free(r->in[i]);
    free(r->ref), free(r->f64), free(r->f32), free(r->g);
    memset(r, 0, sizeof *r);
}

static void desc(const ir_workload *w, char *buf, size_t cap)
{
    int n = ir_workload_canonical(w, buf, cap);
    if (n < 0) snprintf(buf, cap, "(op %d)", w->op);
}

static void run_case(const ir_workload *w, uint64_t seed, double scale, run_t *r)
{
    char d[1024];
    desc(w, d, sizeof d);
    memset(r, 0, sizeof *r);
    r->g = calloc(1, sizeof *r->g);
    cr_assert_not_null(r->g);
    tlm_error err = {0};
    int rc = ir_subgraph_build(w, r->g, &err);
    cr_assert_eq(rc, 0, "%s: build failed: %s: %s", d, err.field, err.msg);
    ref_geom(w, &r->ge);

    /* Argument sizes as the reference expects them: the op's inputs, then one per bias_add
     * (channels), add and mul (output-shaped), in epilogue order. */
    int64_t want[IR_MAX_TENSORS];
    int nw = 0;
    for (int i = 0; i < r->ge.n_in; i++)
        want[nw++] = r->ge.in_numel[i];
    for (int e = 0; e < w->n_epilogue; e++) {
        if (w->epilogue[e] == IR_EPI_BIAS_ADD) want[nw++] = r->ge.channels;
        if (w->epilogue[e] == IR_EPI_ADD || w->epilogue[e] == IR_EPI_MUL)
            want[nw++] = r->ge.out_numel;
    }
    int idx[IR_MAX_TENSORS];
    r->nin = ir_subgraph_inputs(r->g, idx);
    cr_assert_eq(r->nin, nw, "%s: %d inputs, expected %d", d, r->nin, nw);
    for (int i = 0; i < nw; i++)
        cr_assert_eq(ir_tensor_numel(&r->g->tensor[idx[i]]), want[i],
                     "%s: input %d (%s) has %lld elements, expected %lld", d, i,
                     r->g->tensor[idx[i]].name, (long long)ir_tensor_numel(&r->g->tensor[idx[i]]),
                     (long long)want[i]);
    int64_t n = r->ge.out_numel;
    cr_assert_eq(ir_tensor_numel(&r->g->tensor[r->g->output]), n, "%s: output size", d);
    cr_assert_eq(r->g->tensor[r->g->output].kind, IR_T_OUTPUT, "%s", d);

    uint64_t st = seed;
    for (int i = 0; i < nw; i++) {
        r->in[i] = malloc((size_t)want[i] * sizeof(float));
        for (int64_t j = 0; j < want[i]; j++)
            r->in[i][j] = rng_unif(&st, scale);
    }
    r->ref = malloc((size_t)n * sizeof(double));
    r->f64 = malloc((size_t)n * sizeof(double));
    r->f32 = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        r->ref[i] = r->f64[i] = NAN, r->f32[i] = NAN; /* poison */

    const float *const *ins = (const float *const *)r->in;
    ref_anchor(w, &r->ge, ins, r->ref);
    ref_epilogue(w, &r->ge, ins, r->ref);
    rc = ir_interp_run_f64(r->g, ins, r->f64, &err);
    cr_assert_eq(rc, 0, "%s: interp_f64: %s", d, err.msg);
    rc = ir_interp_run(r->g, ins, r->f32, &err);
    cr_assert_eq(rc, 0, "%s: interp: %s", d, err.msg);
}

static void expect_close(const char *what, const char *d, const double *ref, const double *got,
                         int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++) {
        double lim = tol * fmax(fabs(ref[i]), 1.0);
        cr_assert(fabs(got[i] - ref[i]) <= lim, "%s: %s: element %lld: got %.17g, reference %.17g",
                  d, what, (long long)i, got[i], ref[i]);
    }
}

/* Runs w and checks both entry points against the reference. */
static void check_wl(const ir_workload *w, uint64_t seed, double scale)
{
    run_t r;
    run_case(w, seed, scale, &r);
    char d[1024];
    desc(w, d, sizeof d);
    int64_t n = r.ge.out_numel;
    expect_close("f64", d, r.ref, r.f64, n, 1e-12);
    double *f = malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        f[i] = NAN;
    tlm_error err = {0};
    cr_assert_eq(ir_interp_fast_f64(r.g, (const float *const *)r.in, f, &err), 0, "%s: fast: %s",
                 d, err.msg);
    expect_close("fast f64", d, r.ref, f, n, 1e-12);
    for (int64_t i = 0; i < n; i++)
        f[i] = r.f32[i];
    expect_close("f32", d, r.ref, f, n, 1e-5);
    free(f);
    run_free(&r);
}

static ir_workload wl(ir_op op, int n, const int64_t *shape)
{
    ir_workload w;
    ir_workload_init(&w, op);
    for (int i = 0; i < n; i++)
        w.shape[i] = shape[i];
    return w;
}

static void set_epi(ir_workload *w, int n, const ir_epilogue *e)
{
    w->n_epilogue = n;
    for (int i = 0; i < n; i++)
        w->epilogue[i] = e[i];
}

/* ---- matmuls ---- */

Test(interp, dense_all_transposes)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){5, 7, 9}); /* M, N, K all distinct */
            w.transpose_a = ta, w.transpose_b = tb;
            check_wl(&w, 100 + 2 * ta + tb, 1.0);
        }
}

Test(interp, dense_degenerate_extents)
{
    /* K = 1 (an outer product), M = 1 (a GEMV row), N = 1 (a GEMV column) */
    const int64_t shapes[3][3] = {{4, 3, 1}, {1, 6, 5}, {6, 1, 5}};
    for (int i = 0; i < 3; i++)
        for (int t = 0; t < 4; t++) {
            ir_workload w = wl(IR_OP_DENSE, 3, shapes[i]);
            w.transpose_a = t & 1, w.transpose_b = t >> 1;
            check_wl(&w, 110 + 4 * i + t, 1.0);
        }
}

Test(interp, batch_matmul_all_transposes)
{
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            ir_workload w = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){3, 4, 5, 6});
            w.transpose_a = ta, w.transpose_b = tb;
            check_wl(&w, 200 + 2 * ta + tb, 1.0);
        }
}

/* ---- convolutions ---- */

typedef struct {
    int64_t shape[7]; /* N C H W F KH KW */
    int64_t stride[2], pad[2], dilation[2], groups;
} conv_case;

static const conv_case conv_cases[] = {
    /* plain 3x3 */
    {{2, 3, 7, 6, 4, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
    /* stride 2 on H only, asymmetric pad [1,2], non-square 3x2 kernel */
    {{1, 3, 8, 9, 4, 3, 2}, {2, 1}, {1, 2}, {1, 1}, 1},
    /* dilation 2, stride [1,2], pad [2,1], groups 2 */
    {{2, 4, 9, 7, 6, 3, 3}, {1, 2}, {2, 1}, {2, 2}, 2},
    /* groups = C = F: depthwise-like, stride 2 */
    {{1, 6, 7, 7, 6, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 6},
    /* groups 3 with a channel multiplier (F/G = 4), 1x3 kernel, dilation only on W */
    {{1, 6, 7, 8, 12, 1, 3}, {1, 1}, {0, 1}, {1, 2}, 3},
    /* stride 2 and dilation 2 together, no padding, 2x3 kernel */
    {{1, 2, 11, 10, 3, 2, 3}, {2, 2}, {0, 0}, {2, 2}, 1},
    /* padding wider than the kernel: border outputs read only padding (must be 0) */
    {{1, 2, 4, 5, 2, 2, 2}, {1, 1}, {3, 0}, {1, 1}, 1},
    /* 1x1 conv, stride 2 */
    {{2, 5, 6, 5, 3, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
};

static ir_workload conv_wl(const conv_case *c, ir_layout layout)
{
    ir_workload w = wl(IR_OP_CONV2D, 7, c->shape);
    for (int d = 0; d < 2; d++)
        w.stride[d] = c->stride[d], w.pad[d] = c->pad[d], w.dilation[d] = c->dilation[d];
    w.groups = c->groups;
    w.layout = layout;
    return w;
}

Test(interp, conv2d_nchw)
{
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        ir_workload w = conv_wl(&conv_cases[i], IR_NCHW);
        check_wl(&w, 300 + i, 1.0);
    }
}

Test(interp, conv2d_nhwc)
{
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        ir_workload w = conv_wl(&conv_cases[i], IR_NHWC);
        check_wl(&w, 350 + i, 1.0);
    }
}

Test(interp, conv2d_padding_only_outputs_are_zero)
{
    /* Independent of the reference: with pad 3 on H and a 2-tall kernel, the first two output
     * rows see only padding, so they are exactly 0 whatever the data. */
    ir_workload w = conv_wl(&conv_cases[6], IR_NCHW);
    run_t r;
    run_case(&w, 7, 1.0, &r);
    int64_t OH = r.ge.OH, OW = r.ge.OW, F = w.shape[4];
    cr_assert_eq(OH, 4 + 6 - 2 + 1);
    for (int64_t f = 0; f < F; f++)
        for (int64_t oh = 0; oh < 2; oh++)
            for (int64_t ow = 0; ow < OW; ow++) {
                cr_assert_eq(r.f64[(f * OH + oh) * OW + ow], 0.0);
                cr_assert_eq(r.f64[(f * OH + OH - 1 - oh) * OW + ow], 0.0);
            }
    run_free(&r);
}

typedef struct {
    int64_t shape[6]; /* N C H W KH KW */
    int64_t stride[2], pad[2], dilation[2];
} win_case;

static const win_case dw_cases[] = {
    {{2, 3, 7, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {{1, 4, 9, 8, 3, 2}, {2, 1}, {1, 2}, {2, 1}},
    {{1, 5, 10, 9, 3, 3}, {2, 2}, {2, 0}, {2, 2}},
    {{1, 2, 6, 6, 5, 1}, {1, 2}, {2, 0}, {1, 1}},
};

Test(interp, depthwise_conv2d_both_layouts)
{
    for (int lay = 0; lay < 2; lay++)
        for (size_t i = 0; i < sizeof dw_cases / sizeof dw_cases[0]; i++) {
            const win_case *c = &dw_cases[i];
            ir_workload w = wl(IR_OP_DEPTHWISE_CONV2D, 6, c->shape);
            for (int d = 0; d < 2; d++)
                w.stride[d] = c->stride[d], w.pad[d] = c->pad[d], w.dilation[d] = c->dilation[d];
            w.layout = (ir_layout)lay;
            check_wl(&w, 400 + 10 * lay + i, 1.0);
        }
}

/* ---- pools ---- */

static const win_case pool_cases[] = {
    /* default stride (= the window), no padding, window divides the input */
    {{2, 3, 8, 8, 2, 2}, {0, 0}, {0, 0}, {1, 1}},
    /* default stride, window does not divide the input (the tail is dropped) */
    {{1, 2, 7, 8, 3, 3}, {0, 0}, {0, 0}, {1, 1}},
    /* default stride with padding on both axes, non-square window */
    {{1, 3, 6, 7, 3, 2}, {0, 0}, {1, 1}, {1, 1}},
    /* explicit stride 2 with pad 1: the ResNet stem pool */
    {{1, 2, 9, 9, 3, 3}, {2, 2}, {1, 1}, {1, 1}},
    /* asymmetric: stride [1,2], pad [2,1], window 4x3 */
    {{2, 2, 7, 9, 4, 3}, {1, 2}, {2, 1}, {1, 1}},
};

Test(interp, max_and_avg_pool2d_both_layouts)
{
    ir_op ops[2] = {IR_OP_MAX_POOL2D, IR_OP_AVG_POOL2D};
    for (int o = 0; o < 2; o++)
        for (int lay = 0; lay < 2; lay++)
            for (size_t i = 0; i < sizeof pool_cases / sizeof pool_cases[0]; i++) {
                const win_case *c = &pool_cases[i];
                ir_workload w = wl(ops[o], 6, c->shape);
                for (int d = 0; d < 2; d++)
                    w.stride[d] = c->stride[d], w.pad[d] = c->pad[d];
                w.layout = (ir_layout)lay;
                check_wl(&w, 500 + 100 * o + 10 * lay + i, 1.0);
            }
}

Test(interp, avg_pool2d_counts_padding)
{
    /* All-ones 4x4 input, 3x3 window, stride 1, pad 1: a corner window holds 4 real ones
     * out of 9 positions, an edge window 6, an interior one 9 (ir.h: divide by KH*KW). */
    ir_workload w = wl(IR_OP_AVG_POOL2D, 6, (int64_t[]){1, 1, 4, 4, 3, 3});
    w.stride[0] = w.stride[1] = 1, w.pad[0] = w.pad[1] = 1;
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    float x[16];
    for (int i = 0; i < 16; i++)
        x[i] = 1.0f;
    const float *in[1] = {x};
    double out[16];
    cr_assert_eq(ir_interp_run_f64(g, in, out, NULL), 0);
    cr_assert_float_eq(out[0], 4.0 / 9.0, 1e-15);
    cr_assert_float_eq(out[1], 6.0 / 9.0, 1e-15);
    cr_assert_float_eq(out[5], 1.0, 1e-15);
    cr_assert_float_eq(out[15], 4.0 / 9.0, 1e-15);
    free(g);
}

Test(interp, max_pool2d_padding_never_wins)
{
    /* All inputs negative: a padded position must not contribute 0 to the max. */
    ir_workload w = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 1, 3, 3, 3, 3});
    w.stride[0] = w.stride[1] = 1, w.pad[0] = w.pad[1] = 1;
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    float x[9];
    for (int i = 0; i < 9; i++)
        x[i] = -1.0f - (float)i;
    const float *in[1] = {x};
    double out[9];
    cr_assert_eq(ir_interp_run_f64(g, in, out, NULL), 0);
    cr_assert_eq(out[0], -1.0); /* window rows 0-1, cols 0-1 */
    cr_assert_eq(out[8], -5.0); /* window rows 1-2, cols 1-2: max(-5,-6,-8,-9) */
    cr_assert_eq(out[2], -2.0);
    free(g);
}

Test(interp, pool_default_stride_is_the_window)
{
    /* stride 0 (the default) must behave exactly like an explicit stride = window. */
    ir_workload a = wl(IR_OP_AVG_POOL2D, 6, (int64_t[]){1, 2, 9, 8, 3, 2});
    ir_workload b = a;
    b.stride[0] = 3, b.stride[1] = 2;
    run_t ra, rb;
    run_case(&a, 42, 1.0, &ra);
    run_case(&b, 42, 1.0, &rb);
    cr_assert_eq(ra.ge.out_numel, 2 * 3 * 4);
    for (int64_t i = 0; i < ra.ge.out_numel; i++)
        cr_assert_eq(ra.f64[i], rb.f64[i]);
    run_free(&ra), run_free(&rb);
}

Test(interp, global_avg_pool2d_both_layouts)
{
    for (int lay = 0; lay < 2; lay++) {
        ir_workload w = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){2, 3, 5, 4});
        w.layout = (ir_layout)lay;
        check_wl(&w, 700 + lay, 1.0);
    }
}

/* ---- row ops ---- */

Test(interp, softmax_formula_and_row_sums)
{
    ir_workload w = wl(IR_OP_SOFTMAX, 2, (int64_t[]){4, 13});
    check_wl(&w, 800, 4.0);
    run_t r;
    run_case(&w, 801, 4.0, &r);
    for (int64_t row = 0; row < 4; row++) {
        double s64 = 0, s32 = 0;
        for (int64_t c = 0; c < 13; c++) {
            cr_assert(r.f64[row * 13 + c] > 0 && r.f64[row * 13 + c] < 1);
            s64 += r.f64[row * 13 + c], s32 += r.f32[row * 13 + c];
        }
        cr_assert(fabs(s64 - 1.0) < 1e-12, "row %lld sums to %.17g", (long long)row, s64);
        cr_assert(fabs(s32 - 1.0) < 1e-5, "row %lld sums to %.9g in float", (long long)row, s32);
    }
    run_free(&r);
}

Test(interp, softmax_large_inputs_stay_finite)
{
    /* exp(100) overflows no double, but the interpreter subtracts the row max anyway; inputs
     * around +-80 check that the result stays a probability distribution. */
    ir_workload w = wl(IR_OP_SOFTMAX, 2, (int64_t[]){3, 7});
    check_wl(&w, 802, 80.0);
}

Test(interp, layer_norm_with_gamma_beta)
{
    ir_workload w = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){5, 11});
    check_wl(&w, 900, 2.0);
    w.eps = 0.05; /* large enough that dropping or misplacing eps would show */
    check_wl(&w, 901, 1.0);
    w.shape[1] = 1; /* one column: x - mean = 0, out = beta */
    check_wl(&w, 902, 1.0);
}

Test(interp, rms_norm_with_weight)
{
    ir_workload w = wl(IR_OP_RMS_NORM, 2, (int64_t[]){6, 9});
    check_wl(&w, 950, 2.0);
    w.eps = 0.05;
    check_wl(&w, 951, 1.0);
}

Test(interp, reductions)
{
    ir_op ops[3] = {IR_OP_REDUCE_SUM, IR_OP_REDUCE_MEAN, IR_OP_REDUCE_MAX};
    for (int o = 0; o < 3; o++) {
        ir_workload w = wl(ops[o], 2, (int64_t[]){7, 10});
        check_wl(&w, 1000 + o, 1.0);
        w.shape[0] = 1, w.shape[1] = 1;
        check_wl(&w, 1010 + o, 1.0);
    }
}

Test(interp, reduce_max_of_negative_rows)
{
    /* A max that starts from 0 instead of -inf (or the first element) would return 0. */
    ir_workload w = wl(IR_OP_REDUCE_MAX, 2, (int64_t[]){2, 3});
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    float x[6] = {-3, -1, -2, -7, -9, -8};
    const float *in[1] = {x};
    double out[2];
    cr_assert_eq(ir_interp_run_f64(g, in, out, NULL), 0);
    cr_assert_eq(out[0], -1.0);
    cr_assert_eq(out[1], -7.0);
    free(g);
}

Test(interp, transpose)
{
    ir_workload w = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){5, 7});
    check_wl(&w, 1100, 1.0);
}

/* ---- elementwise: the epilogue is the computation ---- */

Test(interp, elementwise_each_unary)
{
    /* Inputs in [-8, 8]: relu6 clamps on both sides, sigmoid/tanh saturate a little. */
    for (ir_epilogue e = IR_EPI_RELU; e <= IR_EPI_TANH; e++) {
        ir_workload w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){257});
        set_epi(&w, 1, &e);
        check_wl(&w, 1200 + e, 8.0);
    }
}

Test(interp, elementwise_relu6_clamps_both_sides)
{
    ir_workload w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){6});
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU6});
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    float x[6] = {-3, 0, 2.5f, 6, 6.5f, 100};
    const float *in[1] = {x};
    double out[6];
    cr_assert_eq(ir_interp_run_f64(g, in, out, NULL), 0);
    double want[6] = {0, 0, 2.5, 6, 6, 6};
    for (int i = 0; i < 6; i++)
        cr_assert_eq(out[i], want[i], "x=%g", x[i]);
    free(g);
}

Test(interp, elementwise_gelu_is_the_erf_form)
{
    /* Known values of 0.5 x (1 + erf(x / sqrt 2)); the tanh approximation differs from them
     * by 1e-5 to 2e-4 (at x = -1: erf form -0.158655254, tanh form -0.158808009). */
    ir_workload w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){3});
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_GELU});
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    float x[3] = {0.5f, -1.0f, 2.0f};
    const float *in[1] = {x};
    double out[3];
    cr_assert_eq(ir_interp_run_f64(g, in, out, NULL), 0);
    cr_assert(fabs(out[0] - 0.34573123063700656) < 1e-12, "gelu(0.5) = %.17g", out[0]);
    cr_assert(fabs(out[1] - -0.15865525393145707) < 1e-12, "gelu(-1) = %.17g", out[1]);
    cr_assert(fabs(out[2] - 1.9544997361036416) < 1e-12, "gelu(2) = %.17g", out[2]);
    free(g);
}

Test(interp, elementwise_add_mul_with_extra_inputs)
{
    const ir_epilogue chains[][4] = {
        {IR_EPI_ADD},
        {IR_EPI_MUL},
        {IR_EPI_ADD, IR_EPI_MUL, IR_EPI_ADD},
        {IR_EPI_MUL, IR_EPI_RELU, IR_EPI_ADD, IR_EPI_SIGMOID},
    };
    const int lens[] = {1, 1, 3, 4};
    for (int c = 0; c < 4; c++) {
        ir_workload w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){100});
        set_epi(&w, lens[c], chains[c]);
        check_wl(&w, 1300 + c, 2.0);
    }
}

/* ---- epilogues fused on anchors ---- */

Test(interp, conv2d_bias_relu)
{
    const ir_epilogue e[2] = {IR_EPI_BIAS_ADD, IR_EPI_RELU};
    /* groups 1, groups 2 (bias over the split F axis), groups = C */
    const size_t cases[3] = {0, 2, 3};
    for (int lay = 0; lay < 2; lay++)
        for (int i = 0; i < 3; i++) {
            ir_workload w = conv_wl(&conv_cases[cases[i]], (ir_layout)lay);
            set_epi(&w, 2, e);
            check_wl(&w, 1400 + 10 * lay + i, 1.0);
        }
}

Test(interp, conv2d_nhwc_bias_is_the_last_axis)
{
    /* A bias with distinct large values per F makes a wrong channel axis obvious. */
    ir_workload w = conv_wl(&conv_cases[4], IR_NHWC); /* F = 12, groups 3 */
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
    run_t r;
    run_case(&w, 1450, 1.0, &r);
    int64_t F = w.shape[4];
    for (int64_t f = 0; f < F; f++)
        r.in[2][f] = 1000.0f * (float)f;
    double *f64 = malloc((size_t)r.ge.out_numel * sizeof(double));
    cr_assert_eq(ir_interp_run_f64(r.g, (const float *const *)r.in, f64, NULL), 0);
    for (int64_t i = 0; i < r.ge.out_numel; i++) {
        int64_t f = i % F; /* NHWC: F is the innermost axis */
        cr_assert(fabs(f64[i] - 1000.0 * (double)f) < 100.0, "element %lld", (long long)i);
    }
    free(f64);
    run_free(&r);
}

Test(interp, dense_bias_gelu)
{
    for (int t = 0; t < 4; t++) {
        ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){6, 5, 8});
        w.transpose_a = t & 1, w.transpose_b = t >> 1;
        set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
        check_wl(&w, 1500 + t, 1.0);
    }
}

Test(interp, dense_residual_add)
{
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){6, 5, 8});
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_ADD});
    check_wl(&w, 1600, 1.0);
}

Test(interp, dense_each_unary_epilogue)
{
    for (ir_epilogue e = IR_EPI_RELU; e <= IR_EPI_TANH; e++) {
        ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){4, 6, 16});
        set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, e});
        check_wl(&w, 1700 + e, 2.0); /* |out| up to ~20: relu6 clamps */
    }
}

Test(interp, chained_epilogues_in_order)
{
    const ir_epilogue chains[][8] = {
        {IR_EPI_BIAS_ADD, IR_EPI_ADD, IR_EPI_MUL, IR_EPI_RELU6},
        {IR_EPI_RELU6, IR_EPI_MUL, IR_EPI_ADD, IR_EPI_BIAS_ADD},
        /* two of each input-reading epilogue: bias, bias1, res, res1, mul, mul1 */
        {IR_EPI_BIAS_ADD, IR_EPI_RELU, IR_EPI_BIAS_ADD, IR_EPI_ADD, IR_EPI_MUL, IR_EPI_ADD,
         IR_EPI_MUL},
        /* the longest chain, unaries only */
        {IR_EPI_TANH, IR_EPI_SILU, IR_EPI_GELU, IR_EPI_SIGMOID, IR_EPI_RELU, IR_EPI_RELU6,
         IR_EPI_GELU, IR_EPI_TANH},
    };
    const int lens[] = {4, 4, 7, 8};
    for (int c = 0; c < 4; c++) {
        ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){5, 4, 12});
        set_epi(&w, lens[c], chains[c]);
        check_wl(&w, 1800 + c, 2.0);
    }
}

Test(interp, chain_order_matters)
{
    /* The same epilogues in two orders give different results: the check above is able to
     * tell a reordered chain from the right one. */
    ir_workload a = wl(IR_OP_DENSE, 3, (int64_t[]){5, 4, 12});
    set_epi(&a, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_RELU});
    ir_workload b = a;
    set_epi(&b, 2, (ir_epilogue[]){IR_EPI_RELU, IR_EPI_BIAS_ADD});
    run_t ra, rb;
    run_case(&a, 1900, 2.0, &ra);
    run_case(&b, 1900, 2.0, &rb);
    int diff = 0;
    for (int64_t i = 0; i < ra.ge.out_numel; i++)
        diff += ra.f64[i] != rb.f64[i];
    cr_assert(diff > 0);
    run_free(&ra), run_free(&rb);
}

Test(interp, bias_add_on_every_family)
{
    /* bias_add follows the channel axis of each family (ir.h): N for matmuls, F/C for convs
     * and pools, R for reduce_*, the last axis otherwise. */
    const ir_epilogue e[2] = {IR_EPI_BIAS_ADD, IR_EPI_SIGMOID};
    ir_workload ws[20];
    int n = 0;
    ws[n++] = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){2, 3, 5, 4});
    ws[n] = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){2, 3, 5, 4});
    ws[n].transpose_a = ws[n].transpose_b = true, n++;
    for (int lay = 0; lay < 2; lay++) {
        ws[n] = wl(IR_OP_DEPTHWISE_CONV2D, 6, dw_cases[1].shape);
        ws[n].stride[0] = 2, ws[n].pad[0] = 1, ws[n].layout = (ir_layout)lay, n++;
        ws[n] = wl(IR_OP_MAX_POOL2D, 6, pool_cases[3].shape);
        ws[n].stride[0] = ws[n].stride[1] = 2, ws[n].pad[0] = ws[n].pad[1] = 1;
        ws[n].layout = (ir_layout)lay, n++;
        ws[n] = wl(IR_OP_AVG_POOL2D, 6, pool_cases[2].shape);
        ws[n].pad[0] = ws[n].pad[1] = 1, ws[n].layout = (ir_layout)lay, n++;
        ws[n] = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){2, 3, 4, 5});
        ws[n].layout = (ir_layout)lay, n++;
    }
    ws[n++] = wl(IR_OP_REDUCE_SUM, 2, (int64_t[]){6, 5});
    ws[n++] = wl(IR_OP_REDUCE_MEAN, 2, (int64_t[]){6, 5});
    ws[n++] = wl(IR_OP_REDUCE_MAX, 2, (int64_t[]){6, 5});
    ws[n++] = wl(IR_OP_SOFTMAX, 2, (int64_t[]){3, 5});
    ws[n++] = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){3, 5});
    ws[n++] = wl(IR_OP_RMS_NORM, 2, (int64_t[]){3, 5});
    ws[n++] = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){3, 5});
    cr_assert(n <= 20);
    for (int i = 0; i < n; i++) {
        set_epi(&ws[i], 2, e);
        check_wl(&ws[i], 2000 + i, 2.0);
    }
}

Test(interp, residual_and_scale_on_row_ops)
{
    ir_workload ws[3] = {
        wl(IR_OP_SOFTMAX, 2, (int64_t[]){3, 6}),
        wl(IR_OP_LAYER_NORM, 2, (int64_t[]){3, 6}),
        wl(IR_OP_RMS_NORM, 2, (int64_t[]){3, 6}),
    };
    for (int i = 0; i < 3; i++) {
        set_epi(&ws[i], 3, (ir_epilogue[]){IR_EPI_MUL, IR_EPI_ADD, IR_EPI_SILU});
        check_wl(&ws[i], 2100 + i, 1.5);
    }
}

/* ---- argument order and interpreter plumbing ---- */

static void expect_inputs(const ir_workload *w, int n, const char *const *names,
                          const int64_t (*shapes)[IR_MAX_DIMS], const int *ndims)
{
    ir_subgraph *g = calloc(1, sizeof *g);
    tlm_error err;
    cr_assert_eq(ir_subgraph_build(w, g, &err), 0, "%s", err.msg);
    int idx[IR_MAX_TENSORS];
    int k = ir_subgraph_inputs(g, idx);
    cr_assert_eq(k, n);
    for (int i = 0; i < n; i++) {
        const ir_tensor *t = &g->tensor[idx[i]];
        cr_assert_eq(t->kind, IR_T_INPUT);
        cr_assert_str_eq(t->name, names[i], "input %d", i);
        cr_assert_eq(t->ndim, ndims[i], "input %s", names[i]);
        for (int d = 0; d < ndims[i]; d++)
            cr_assert_eq(t->shape[d], shapes[i][d], "input %s dim %d", names[i], d);
        if (i) cr_assert_gt(idx[i], idx[i - 1], "argument order = order in g->tensor");
    }
    /* every other tensor is a temp or the one output */
    int outputs = 0;
    for (int t = 0; t < g->n_tensor; t++)
        outputs += g->tensor[t].kind == IR_T_OUTPUT;
    cr_assert_eq(outputs, 1);
    free(g);
}

Test(interp, argument_order)
{
    /* ir.h: the op's inputs in its layout table order, then the epilogue's in chain order. */
    ir_workload d = wl(IR_OP_DENSE, 3, (int64_t[]){2, 3, 4});
    d.transpose_b = true;
    set_epi(&d, 4, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_MUL, IR_EPI_RELU, IR_EPI_ADD});
    expect_inputs(&d, 5, (const char *[]){"A", "B", "bias", "mul", "res"},
                  (const int64_t[][IR_MAX_DIMS]){{2, 4}, {3, 4}, {3}, {2, 3}, {2, 3}},
                  (int[]){2, 2, 1, 2, 2});

    ir_workload c = wl(IR_OP_CONV2D, 7, (int64_t[]){1, 4, 5, 5, 6, 3, 3});
    c.layout = IR_NHWC;
    set_epi(&c, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
    expect_inputs(&c, 3, (const char *[]){"X", "Wt", "bias"},
                  (const int64_t[][IR_MAX_DIMS]){{1, 5, 5, 4}, {3, 3, 4, 6}, {6}},
                  (int[]){4, 4, 1});

    ir_workload ln = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){3, 8});
    set_epi(&ln, 1, (ir_epilogue[]){IR_EPI_ADD});
    expect_inputs(&ln, 4, (const char *[]){"X", "gamma", "beta", "res"},
                  (const int64_t[][IR_MAX_DIMS]){{3, 8}, {8}, {8}, {3, 8}}, (int[]){2, 1, 1, 2});

    ir_workload rms = wl(IR_OP_RMS_NORM, 2, (int64_t[]){3, 8});
    expect_inputs(&rms, 2, (const char *[]){"X", "weight"},
                  (const int64_t[][IR_MAX_DIMS]){{3, 8}, {8}}, (int[]){2, 1});

    ir_workload dw = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 4, 5, 5, 3, 3});
    expect_inputs(&dw, 2, (const char *[]){"X", "Wt"},
                  (const int64_t[][IR_MAX_DIMS]){{1, 4, 5, 5}, {4, 3, 3}}, (int[]){4, 3});
}

Test(interp, gamma_beta_are_not_swapped)
{
    /* gamma = 0, beta = 7: every output is exactly 7 (a swap would give x_hat * 7). */
    ir_workload w = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){2, 4});
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    float x[8] = {1, 2, 3, 4, -1, 5, 0, 2}, gm[4] = {0, 0, 0, 0}, bt[4] = {7, 7, 7, 7};
    const float *in[3] = {x, gm, bt};
    double out[8];
    cr_assert_eq(ir_interp_run_f64(g, in, out, NULL), 0);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(out[i], 7.0);
    free(g);
}

Test(interp, float_output_is_the_rounded_double_output)
{
    ir_workload w = wl(IR_OP_CONV2D, 7, (int64_t[]){1, 3, 6, 6, 2, 3, 3});
    w.pad[0] = w.pad[1] = 1;
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
    run_t r;
    run_case(&w, 2200, 1.0, &r);
    for (int64_t i = 0; i < r.ge.out_numel; i++)
        cr_assert_eq(r.f32[i], (float)r.f64[i]);
    run_free(&r);
}

Test(interp, unguarded_out_of_bounds_load_is_an_error)
{
    /* A corrupted index must be reported, never read past a buffer (ASan watches). */
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){2, 3, 4});
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
    ir_stage *s = &g->stage[g->anchor];
    int loads = 0;
    for (int e = 0; e < s->n_expr; e++)
        if (s->expr[e].kind == IR_E_LOAD) {
            s->expr[e].idx[0].off = 1; /* row m + 1: past the end for the last row */
            loads++;
            break;
        }
    cr_assert_eq(loads, 1);
    float a[8] = {0}, b[12] = {0};
    const float *in[2] = {a, b};
    double out[6];
    float outf[6];
    tlm_error err = {0};
    cr_assert_neq(ir_interp_run_f64(g, in, out, &err), 0);
    cr_assert_neq(err.msg[0], 0);
    cr_assert_neq(ir_interp_run(g, in, outf, NULL), 0);
    free(g);
}
