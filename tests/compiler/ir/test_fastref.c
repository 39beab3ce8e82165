/* test_fastref.c — the fast reference (ir_interp_fast_f64) against the naive interpreter.
 *
 * ir_interp_fast_f64 must be ir_interp_run_f64 up to summation order: every contraction family
 * and option (transposes, batch, stride, symmetric and per-axis padding, dilation, groups 1, 2
 * and C, NHWC, depthwise, epilogue chains) on small shapes with odd extents (1, primes, 3
 * channels, a 7x7 stride-2 stem), compared by the measure module's metric
 *     rel = max_i |fast_i - naive_i| / max_i |naive_i|   < 1e-10.
 * Each case also asserts that the BLAS path applies, so a silent fallback to the interpreter
 * (which would pass trivially) fails. Ops without a BLAS path go through the interpreter, its
 * stages without reduction a segment at a time: their results must be bit-identical.
 * Inputs are uniform in [-1, 1] from fixed seeds. (test_interp.c also checks
 * ir_interp_fast_f64 against textbook loops.)
 */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir/ir.h"

#define FAST_TOL 1e-10

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_unif(uint64_t *s)
{
    double u = (double)(rng_next(s) >> 11) * 0x1.0p-53;
    return (float)(2.0 * u - 1.0);
}

typedef struct {
    ir_subgraph *g;
    int nin;
    float *in[IR_MAX_TENSORS];
    int64_t n_out;
    double *naive, *fast;
    char d[1024];
} pair_t;

static void pair_free(pair_t *p)
{
    for (int i = 0; i < p->nin; i++)
        free(p->in[i]);
    free(p->naive), free(p->fast), free(p->g);
    memset(p, 0, sizeof *p);
}

/* Builds w, draws inputs, runs both paths. */
static void pair_run(const ir_workload *w, uint64_t seed, pair_t *p)
{
    memset(p, 0, sizeof *p);
    if (ir_workload_canonical(w, p->d, sizeof p->d) < 0)
        snprintf(p->d, sizeof p->d, "op %d", w->op);
    p->g = calloc(1, sizeof *p->g);
    cr_assert_not_null(p->g);
    tlm_error err = {0};
    cr_assert_eq(ir_subgraph_build(w, p->g, &err), 0, "%s: %s: %s", p->d, err.field, err.msg);
    int idx[IR_MAX_TENSORS];
    p->nin = ir_subgraph_inputs(p->g, idx);
    uint64_t st = seed;
    for (int i = 0; i < p->nin; i++) {
        int64_t n = ir_tensor_numel(&p->g->tensor[idx[i]]);
        p->in[i] = malloc((size_t)n * sizeof(float));
        cr_assert_not_null(p->in[i]);
        for (int64_t j = 0; j < n; j++)
            p->in[i][j] = rng_unif(&st);
    }
    p->n_out = ir_tensor_numel(&p->g->tensor[p->g->output]);
    p->naive = malloc((size_t)p->n_out * sizeof(double));
    p->fast = malloc((size_t)p->n_out * sizeof(double));
    for (int64_t i = 0; i < p->n_out; i++)
        p->naive[i] = p->fast[i] = NAN; /* poison: every output must be written */
    const float *const *ins = (const float *const *)p->in;
    cr_assert_eq(ir_interp_run_f64(p->g, ins, p->naive, &err), 0, "%s: naive: %s", p->d, err.msg);
    cr_assert_eq(ir_interp_fast_f64(p->g, ins, p->fast, &err), 0, "%s: fast: %s", p->d, err.msg);
}

static double rel_diff(const double *ref, const double *got, int64_t n, int64_t *worst)
{
    double num = 0, den = 0;
    *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - ref[i]);
        if (!(e <= num)) num = e, *worst = i; /* NaN is the worst */
        den = fmax(den, fabs(ref[i]));
    }
    return num / fmax(den, 1e-300);
}

/* The fast path must apply to w and agree with the interpreter. */
static void check_fast(const ir_workload *w, uint64_t seed)
{
    pair_t p;
    pair_run(w, seed, &p);
    cr_assert(ir_fastref_applies(p.g), "%s: the fast path does not apply", p.d);
    int64_t i;
    double rel = rel_diff(p.naive, p.fast, p.n_out, &i);
    cr_assert(rel < FAST_TOL, "%s: rel diff %.3g at out[%lld]: fast %.17g, naive %.17g", p.d, rel,
              (long long)i, p.fast[i], p.naive[i]);
    pair_free(&p);
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

/* ---- dense and batch_matmul ---- */

static const int64_t dense_shapes[][3] = {
    {5, 7, 9}, {1, 1, 1}, {1, 13, 17}, {31, 1, 29}, {4, 3, 1}, {37, 41, 43}, {64, 48, 96},
};

Test(fastref, dense_every_transpose_and_odd_extent)
{
    for (size_t s = 0; s < sizeof dense_shapes / sizeof dense_shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            ir_workload w = wl(IR_OP_DENSE, 3, dense_shapes[s]);
            w.transpose_a = t & 1, w.transpose_b = t >> 1;
            check_fast(&w, 1000 + 4 * s + t);
        }
}

Test(fastref, batch_matmul_every_transpose)
{
    const int64_t shapes[][4] = {{3, 5, 7, 11}, {1, 4, 6, 5}, {2, 1, 13, 1}, {5, 17, 3, 19}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            ir_workload w = wl(IR_OP_BATCH_MATMUL, 4, shapes[s]);
            w.transpose_a = t & 1, w.transpose_b = t >> 1;
            check_fast(&w, 1100 + 4 * s + t);
        }
}

/* ---- conv2d ---- */

typedef struct {
    int64_t shape[7]; /* N C H W F KH KW */
    int64_t stride[2], pad[2], dilation[2], groups;
} conv_case;

static const conv_case conv_cases[] = {
    /* plain 3x3, 3 input channels */
    {{2, 3, 7, 6, 4, 3, 3}, {1, 1}, {0, 0}, {1, 1}, 1},
    /* stride 2, pad 1 */
    {{1, 4, 9, 8, 5, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 1},
    /* per-axis pad [2, 0] with stride [1, 2], non-square 3x2 kernel */
    {{1, 3, 8, 9, 4, 3, 2}, {1, 2}, {2, 0}, {1, 1}, 1},
    /* dilation [2, 1], pad 2 */
    {{2, 3, 11, 9, 4, 3, 3}, {1, 1}, {2, 2}, {2, 1}, 1},
    /* groups 2 with dilation 2 and stride [1, 2] */
    {{2, 4, 9, 7, 6, 3, 3}, {1, 2}, {2, 1}, {2, 2}, 2},
    /* groups = C = F (depthwise as a grouped conv), stride 2 */
    {{1, 6, 7, 7, 6, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 6},
    /* groups = C with a channel multiplier 2 */
    {{1, 4, 6, 5, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 4},
    /* 7x7 stride-2 pad-3 stem on 3 channels, odd image */
    {{2, 3, 23, 19, 8, 7, 7}, {2, 2}, {3, 3}, {1, 1}, 1},
    /* primes everywhere: 5 channels, 13x11 image, 7 filters, 3x5 kernel, stride [2, 3] */
    {{1, 5, 13, 11, 7, 3, 5}, {2, 3}, {1, 2}, {1, 1}, 1},
    /* all ones */
    {{1, 1, 1, 1, 1, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
    /* padding wider than the kernel: border outputs read only padding */
    {{1, 2, 2, 5, 3, 3, 2}, {1, 1}, {3, 1}, {1, 1}, 1},
    /* pointwise (GEMM without im2col), groups 1 and 2 */
    {{2, 6, 5, 7, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 1},
    {{2, 6, 5, 7, 4, 1, 1}, {1, 1}, {0, 0}, {1, 1}, 2},
    /* 1x1 with stride 2 and 1x1 with padding: im2col, not the pointwise shortcut */
    {{2, 5, 6, 5, 3, 1, 1}, {2, 2}, {0, 0}, {1, 1}, 1},
    {{1, 3, 4, 3, 2, 1, 1}, {1, 1}, {1, 0}, {1, 1}, 1},
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

Test(fastref, conv2d_nchw)
{
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        ir_workload w = conv_wl(&conv_cases[i], IR_NCHW);
        check_fast(&w, 1200 + i);
    }
}

Test(fastref, conv2d_nhwc)
{
    for (size_t i = 0; i < sizeof conv_cases / sizeof conv_cases[0]; i++) {
        ir_workload w = conv_wl(&conv_cases[i], IR_NHWC);
        check_fast(&w, 1250 + i);
    }
}

/* Textbook conv2d from ir.h's layouts, for the one case too big for the interpreter. */
static void direct_conv(const ir_workload *w, const float *X, const float *Wt, double *out)
{
    const int64_t *s = w->shape;
    int64_t N = s[0], C = s[1], H = s[2], W = s[3], F = s[4], KH = s[5], KW = s[6];
    int64_t G = w->groups, Cg = C / G, Fg = F / G, OH, OW;
    ir_workload_out_hw(w, &OH, &OW);
    bool nhwc = w->layout == IR_NHWC;
    for (int64_t n = 0; n < N; n++)
        for (int64_t f = 0; f < F; f++)
            for (int64_t oh = 0; oh < OH; oh++)
                for (int64_t ow = 0; ow < OW; ow++) {
                    double acc = 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t kh = 0; kh < KH; kh++)
                            for (int64_t kw = 0; kw < KW; kw++) {
                                int64_t ih = oh * w->stride[0] + kh * w->dilation[0] - w->pad[0];
                                int64_t iw = ow * w->stride[1] + kw * w->dilation[1] - w->pad[1];
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                int64_t ci = f / Fg * Cg + c;
                                double x = nhwc ? X[((n * H + ih) * W + iw) * C + ci]
                                                : X[((n * C + ci) * H + ih) * W + iw];
                                double k = nhwc ? Wt[((kh * KW + kw) * Cg + c) * F + f]
                                                : Wt[((f * Cg + c) * KH + kh) * KW + kw];
                                acc += x * k;
                            }
                    out[nhwc ? ((n * OH + oh) * OW + ow) * F + f
                             : ((n * F + f) * OH + oh) * OW + ow] = acc;
                }
}

/* The column buffer holds 4 Mi doubles = 4194304. Here Cg*KH*KW = 256*9 = 2304 and OW = 16, so
 * a chunk is 4194304 / (2304*16) = 113 output rows: NCHW splits OH = 120 into 113 + 7 per
 * (image, group); NHWC splits the flattened (n, oh) rows 240 into 113 + 113 + 14, the second
 * chunk straddling both images. Groups 2 put a group offset on every chunk.
 * Too big for the interpreter under sanitizers: checked against direct loops. */
Test(fastref, conv2d_im2col_in_chunks)
{
    conv_case c = {{2, 512, 120, 16, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2};
    for (int l = 0; l < 2; l++) {
        ir_workload w = conv_wl(&c, l ? IR_NHWC : IR_NCHW);
        ir_subgraph *g = calloc(1, sizeof *g);
        cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
        cr_assert(ir_fastref_applies(g));
        float *in[2];
        uint64_t st = 1300 + l;
        for (int k = 0; k < 2; k++) {
            int64_t n = ir_tensor_numel(&g->tensor[k]);
            in[k] = malloc((size_t)n * sizeof(float));
            for (int64_t j = 0; j < n; j++)
                in[k][j] = rng_unif(&st);
        }
        int64_t n = ir_tensor_numel(&g->tensor[g->output]);
        double *ref = malloc((size_t)n * sizeof(double)), *got = malloc((size_t)n * sizeof(double));
        direct_conv(&w, in[0], in[1], ref);
        cr_assert_eq(ir_interp_fast_f64(g, (const float *const *)in, got, NULL), 0);
        int64_t i;
        double rel = rel_diff(ref, got, n, &i);
        cr_assert(rel < FAST_TOL, "layout %d: rel diff %.3g at out[%lld]: fast %.17g, direct %.17g",
                  l, rel, (long long)i, got[i], ref[i]);
        free(in[0]), free(in[1]), free(ref), free(got), free(g);
    }
}

/* ---- depthwise_conv2d ---- */

typedef struct {
    int64_t shape[6]; /* N C H W KH KW */
    int64_t stride[2], pad[2], dilation[2];
} dw_case;

static const dw_case dw_cases[] = {
    {{1, 3, 7, 7, 3, 3}, {1, 1}, {1, 1}, {1, 1}},
    {{2, 5, 11, 13, 7, 7}, {2, 2}, {3, 3}, {1, 1}}, /* 7x7 depthwise, stride 2 */
    {{1, 4, 9, 8, 3, 3}, {1, 1}, {2, 2}, {2, 2}},   /* dilation 2 */
    {{1, 3, 8, 7, 3, 2}, {2, 1}, {0, 2}, {1, 1}},   /* per-axis pad, non-square kernel */
    {{2, 6, 5, 5, 1, 1}, {1, 1}, {0, 0}, {1, 1}},   /* 1x1 */
    {{1, 1, 1, 1, 1, 1}, {1, 1}, {0, 0}, {1, 1}},   /* all ones */
    {{1, 2, 2, 3, 3, 3}, {1, 1}, {3, 2}, {1, 1}},   /* padding wider than the kernel */
};

static ir_workload dw_wl(const dw_case *c, ir_layout layout)
{
    ir_workload w = wl(IR_OP_DEPTHWISE_CONV2D, 6, c->shape);
    for (int d = 0; d < 2; d++)
        w.stride[d] = c->stride[d], w.pad[d] = c->pad[d], w.dilation[d] = c->dilation[d];
    w.layout = layout;
    return w;
}

Test(fastref, depthwise_conv2d_both_layouts)
{
    for (size_t i = 0; i < sizeof dw_cases / sizeof dw_cases[0]; i++)
        for (int l = 0; l < 2; l++) {
            ir_workload w = dw_wl(&dw_cases[i], l ? IR_NHWC : IR_NCHW);
            check_fast(&w, 1400 + 2 * i + l);
        }
}

/* ---- epilogues: evaluated by the interpreter on the fast anchor ---- */

Test(fastref, epilogue_chains_on_every_family)
{
    const ir_epilogue chains[][IR_MAX_EPILOGUE] = {
        {IR_EPI_BIAS_ADD, IR_EPI_GELU},
        {IR_EPI_BIAS_ADD, IR_EPI_RELU},
        {IR_EPI_ADD},
        {IR_EPI_BIAS_ADD, IR_EPI_ADD, IR_EPI_RELU},
        {IR_EPI_MUL, IR_EPI_RELU6, IR_EPI_SILU},
        {IR_EPI_SIGMOID, IR_EPI_BIAS_ADD, IR_EPI_TANH, IR_EPI_ADD, IR_EPI_BIAS_ADD},
    };
    const int lens[] = {2, 2, 1, 3, 3, 5};
    const conv_case grouped = {{1, 4, 7, 6, 6, 3, 3}, {2, 1}, {1, 1}, {1, 1}, 2};
    for (size_t c = 0; c < sizeof lens / sizeof lens[0]; c++) {
        ir_workload ws[6];
        ws[0] = wl(IR_OP_DENSE, 3, (int64_t[]){13, 11, 7});
        ws[0].transpose_b = true;
        ws[1] = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){2, 5, 7, 3});
        ws[2] = conv_wl(&conv_cases[1], IR_NCHW);
        ws[3] = conv_wl(&grouped, IR_NCHW); /* bias index spans the (g, f) split */
        ws[4] = conv_wl(&grouped, IR_NHWC);
        ws[5] = dw_wl(&dw_cases[1], IR_NHWC);
        for (int i = 0; i < 6; i++) {
            set_epi(&ws[i], lens[c], chains[c]);
            check_fast(&ws[i], 1500 + 10 * c + i);
        }
    }
}

/* dense 197x3072x768-style bias + gelu and a ResNet residual block's tail, scaled down */
Test(fastref, model_shaped_chains)
{
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){17, 96, 64});
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
    check_fast(&w, 1600);
    const conv_case res = {{1, 8, 14, 14, 8, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1};
    w = conv_wl(&res, IR_NCHW);
    set_epi(&w, 3, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_ADD, IR_EPI_RELU});
    check_fast(&w, 1601);
}

/* ---- what is not a contraction stays on the interpreter, bit for bit ---- */

/* Their stages without reduction go through the interpreter's segment path (run_segments),
 * whose values must be bit-identical to the point-by-point evaluation: last axes shorter and
 * longer than a segment (512), a strided last axis (transpose), tensor-reading epilogues. */
Test(fastref, other_ops_are_the_interpreter)
{
    ir_workload ws[10];
    ws[0] = wl(IR_OP_SOFTMAX, 2, (int64_t[]){3, 7});
    ws[1] = wl(IR_OP_SOFTMAX, 2, (int64_t[]){2, 1300});
    ws[2] = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){4, 5});
    ws[3] = wl(IR_OP_RMS_NORM, 2, (int64_t[]){3, 517});
    ws[4] = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 2, 6, 5, 3, 3});
    ws[5] = wl(IR_OP_AVG_POOL2D, 6, (int64_t[]){1, 2, 6, 5, 2, 2});
    ws[6] = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){1300});
    set_epi(&ws[6], 4, (ir_epilogue[]){IR_EPI_GELU, IR_EPI_ADD, IR_EPI_MUL, IR_EPI_TANH});
    ws[7] = wl(IR_OP_REDUCE_SUM, 2, (int64_t[]){3, 8});
    set_epi(&ws[7], 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_SIGMOID});
    ws[8] = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){5, 700});
    set_epi(&ws[8], 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
    ws[9] = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){2, 3, 4, 5});
    set_epi(&ws[9], 2, (ir_epilogue[]){IR_EPI_RELU6, IR_EPI_SILU});
    for (int i = 0; i < 10; i++) {
        pair_t p;
        pair_run(&ws[i], 1700 + i, &p);
        cr_assert_not(ir_fastref_applies(p.g), "%s", p.d);
        for (int64_t j = 0; j < p.n_out; j++)
            cr_assert(!memcmp(&p.naive[j], &p.fast[j], sizeof(double)),
                      "%s: out[%lld]: fast %.17g, naive %.17g", p.d, (long long)j, p.fast[j],
                      p.naive[j]);
        double *buf[IR_MAX_TENSORS] = {0};
        tlm_error err = {0};
        cr_assert_eq(ir_fastref_anchor(p.g, (const double *const *)buf, p.fast, &err),
                     TLM_EUNSUPPORTED, "%s", p.d);
        cr_assert(strstr(err.msg, "no fast reference"), "%s", err.msg);
        pair_free(&p);
    }
}

/* The segment path checks indices as the point path does: a corrupted epilogue index (one past
 * the end, one before the start) is an error, never a read outside a buffer (ASan watches). */
Test(fastref, out_of_bounds_epilogue_load_is_an_error)
{
    for (int v = 0; v < 4; v++) {
        ir_workload w = v < 2 ? wl(IR_OP_DENSE, 3, (int64_t[]){3, 600, 4})
                              : wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){700});
        set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU});
        ir_subgraph *g = calloc(1, sizeof *g);
        cr_assert_eq(ir_subgraph_build(&w, g, NULL), 0);
        ir_stage *s = &g->stage[g->n_stage - 1];
        cr_assert_eq(s->role, IR_ROLE_EPILOGUE);
        int last = -1;
        for (int e = 0; e < s->n_expr; e++)
            if (s->expr[e].kind == IR_E_LOAD) last = e;
        cr_assert_geq(last, 0);
        ir_expr *x = &s->expr[last];
        x->idx[g->tensor[x->tensor].ndim - 1].off = v % 2 ? -1 : 1;
        int idx[IR_MAX_TENSORS];
        int nin = ir_subgraph_inputs(g, idx);
        float *in[IR_MAX_TENSORS];
        for (int k = 0; k < nin; k++)
            in[k] = calloc((size_t)ir_tensor_numel(&g->tensor[idx[k]]), sizeof(float));
        double *out = calloc((size_t)ir_tensor_numel(&g->tensor[g->output]), sizeof(double));
        tlm_error err = {0};
        cr_assert_eq(ir_interp_fast_f64(g, (const float *const *)in, out, &err), TLM_EINVAL,
                     "variant %d", v);
        cr_assert(strstr(err.msg, "out of bounds"), "%s", err.msg);
        cr_assert_eq(ir_interp_run_f64(g, (const float *const *)in, out, NULL), TLM_EINVAL);
        for (int k = 0; k < nin; k++)
            free(in[k]);
        free(out), free(g);
    }
}

/* A NaN in the activation reaches exactly the outputs whose window covers it, as in the
 * interpreter (dgemm and the padding zeros must not swallow or spread it). */
Test(fastref, nan_input_propagates_like_the_interpreter)
{
    ir_workload ws[4];
    ws[0] = wl(IR_OP_DENSE, 3, (int64_t[]){6, 5, 4});
    ws[1] = conv_wl(&conv_cases[1], IR_NCHW);
    ws[2] = conv_wl(&conv_cases[0], IR_NHWC); /* stride 1, no padding: every pixel is read */
    ws[3] = dw_wl(&dw_cases[0], IR_NCHW);
    for (int i = 0; i < 4; i++) {
        ir_subgraph *g = calloc(1, sizeof *g);
        cr_assert_eq(ir_subgraph_build(&ws[i], g, NULL), 0);
        int idx[IR_MAX_TENSORS];
        int nin = ir_subgraph_inputs(g, idx);
        float *in[IR_MAX_TENSORS];
        uint64_t st = 1800 + i;
        for (int k = 0; k < nin; k++) {
            int64_t n = ir_tensor_numel(&g->tensor[idx[k]]);
            in[k] = malloc((size_t)n * sizeof(float));
            for (int64_t j = 0; j < n; j++)
                in[k][j] = rng_unif(&st);
        }
        in[0][ir_tensor_numel(&g->tensor[idx[0]]) / 2 + 1] = NAN;
        int64_t n = ir_tensor_numel(&g->tensor[g->output]);
        double *a = malloc((size_t)n * sizeof(double)), *b = malloc((size_t)n * sizeof(double));
        cr_assert_eq(ir_interp_run_f64(g, (const float *const *)in, a, NULL), 0);
        cr_assert_eq(ir_interp_fast_f64(g, (const float *const *)in, b, NULL), 0);
        int nan_count = 0;
        for (int64_t j = 0; j < n; j++) {
            cr_assert_eq(isnan(a[j]), isnan(b[j]), "case %d out[%lld]: naive %g fast %g", i,
                         (long long)j, a[j], b[j]);
            nan_count += isnan(a[j]) != 0;
        }
        cr_assert_gt(nan_count, 0, "case %d: the NaN reached no output", i);
        for (int k = 0; k < nin; k++)
            free(in[k]);
        free(a), free(b), free(g);
    }
}
