/* bench/peers.h — timings of the named peers our kernels are compared against, and the
 * machine's limits. Header-only: every function is static, so each bench/<name>.c includes
 * it and becomes its own binary (built -O3 -march=native with -fopenmp, linked against
 * OpenBLAS and oneDNN; see the Makefile rule $(BUILD)/bench/%). It depends on
 * compiler/ir/ir.h for the ir_workload type only, not on libtlm.
 *
 * Contract:
 *  - Every peer_*_s function returns SECONDS PER CALL: the median over repeated samples,
 *    after a warm-up (>= 50 ms and >= 1 call, so JIT kernels, thread pools, page tables and
 *    caches are hot). Each sample times a batch of calls lasting >= ~10 ms with
 *    clock_gettime(CLOCK_MONOTONIC); the samples together last >= ~0.25 s (at least 3
 *    samples, at most 31, and no new sample once 1 s has passed), so one figure costs about
 *    0.3 to 1 s plus set-up. peer_time_s is that harness; benches time our kernels with it
 *    too, so both sides are measured alike. Inputs are filled once with uniform values in
 *    [-1, 1) and reused, so small problems run from cache, as our kernels do. On failure the
 *    functions print a line to stderr and return a negative value; they never abort.
 *  - Multi-threaded figures need an idle machine: when other processes hold the cores, each
 *    OpenMP barrier waits for a descheduled thread and times collapse to multiples of the
 *    scheduler tick (4 ms). The median does not rescue that; rerun on a quiet machine.
 *  - Threads: all cores (OpenBLAS's own pool; OpenMP's default team, which oneDNN shares:
 *    the packaged libdnnl uses libgomp, as we do), unless a function says otherwise.
 *  - Which thread may call: any, one at a time (the oneDNN engine and stream are cached in
 *    process-wide statics on first use).
 *
 * How each figure is measured:
 *  - peer_sgemm_s: cblas_sgemm row-major, out[M,N] = A.B with the IR's dense layouts
 *    (A[M,K] or A[K,M] if ta; B[K,N] or B[N,K] if tb), beta = 0.
 *  - peer_sgemm_bias_gelu_s: that sgemm, then a separate OpenMP pass
 *    out = gelu(out + bias[N]) with the exact erf gelu: the realistic unfused peer of a BERT
 *    dense + bias + gelu.
 *  - peer_dnnl_matmul_s: the oneDNN matmul primitive on plain row-major A[M,K], B[K,N].
 *  - peer_dnnl_conv_s: oneDNN convolution (conv2d with groups, depthwise as groups = C) with
 *    stride, pad and dilation; a leading bias_add becomes the primitive's bias, the rest of the
 *    epilogue becomes post-ops (relu, relu6 = clip, gelu = gelu_erf, silu = swish, sigmoid =
 *    logistic, tanh as eltwise; the first add as a sum post-op, the residual idiom; a further
 *    add, mul and a later bias_add as binary post-ops).
 *    blocked = false: plain layouts exactly matching our kernel ABI (NCHW + OIHW/GOIHW, or
 *    NHWC + HWIO/HWIGO), the same-ABI comparison; oneDNN 2.6 runs these as im2col+GEMM
 *    ("x64:gemm:jit"), its direct kernels wanting blocked weights. blocked = true: oneDNN picks the
 * formats (format_tag_any); inputs are reordered into them once, outside the timing, so the figure
 *    is the primitive alone (an upper bound on what a framework keeping blocked activations
 *    between layers gets).
 *  - peer_dnnl_softmax_s / peer_dnnl_layer_norm_s: X[R,C] -> out[R,C] over the last axis,
 *    out of place, forward inference; layer norm with gamma[C] and beta[C], eps = 1e-5.
 *  - peer_dnnl_pool_s: max pool, or avg pool counting the padding (our semantics), plain
 *    layouts; the epilogue as post-ops as for convs.
 *  - peer_dnnl_last_impl: the oneDNN implementation the last peer_dnnl_* call timed.
 *  - peer_fma_peak_gflops: each thread runs 16 independent accumulator chains of vector FMAs
 *    (zmm with AVX-512, else ymm) on registers only; 2 flops per lane per FMA.
 *  - peer_mem_bandwidth_gbs: read-only sum over a 512 MiB float array on all cores; GB/s
 *    (1e9 bytes) of bytes read. peer_mem_copy_gbs: memcpy of 256 MiB split across all cores;
 *    counts bytes read + bytes written. When a thread's chunk is below glibc's non-temporal
 *    threshold (a fraction of the L3), the stores also read each line first (write-allocate),
 *    traffic this figure does not count.
 *
 * Environment note: this machine's environment sets OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE,
 * which hold OpenBLAS to AVX2 (Haswell) kernels even on an AVX-512 CPU. Benchmark commands
 * must unset both (`env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE build/bench/...`), and every
 * bench prints peer_openblas_corename() so the reader sees which kernel actually ran.
 */
#ifndef TLM_BENCH_PEERS_H
#define TLM_BENCH_PEERS_H

#include <cblas.h>
#include <dnnl.h>
#include <dnnl_debug.h>
#include <immintrin.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/ir/ir.h"
#include "compiler/util/util.h"

/* A bench uses a few of these; unused statics must not warn under -Wall. */
#define PEER_FN static __attribute__((unused))

/* OpenBLAS extensions (also in its cblas.h; declared here so the contract is visible). */
extern char *openblas_get_corename(void);
extern int openblas_get_num_threads(void);

#define PEER_WARMUP_S 0.05
#define PEER_BATCH_S 0.01
#define PEER_TOTAL_S 0.25
#define PEER_MAX_SAMPLES 31
#define PEER_LIMIT_S 1.0

PEER_FN const char *peer_openblas_corename(void)
{
    const char *s = openblas_get_corename();
    return s ? s : "unknown";
}

/* True when OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE is set, i.e. OpenBLAS may be held to older
 * kernels than the CPU supports (see the environment note above): benches print a warning. */
PEER_FN bool peer_openblas_pinned(void)
{
    return getenv("OPENBLAS_CORETYPE") != NULL || getenv("OPENBLAS_L2_SIZE") != NULL;
}

PEER_FN int peer_openblas_threads(void)
{
    return openblas_get_num_threads();
}

/* ---- timing ---- */

typedef void (*peer_body)(void *ctx);

static int peer_cmp_double_(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Seconds per call of fn(ctx): median of batched samples after a warm-up (see the contract). */
PEER_FN double peer_time_s(peer_body fn, void *ctx)
{
    double start = tlm_now_s(), t_call = 1e30;
    int calls = 0;
    do {
        double a = tlm_now_s();
        fn(ctx);
        double d = tlm_now_s() - a;
        /* The first call pays for JIT and first touch; later calls estimate the steady state. */
        if (calls == 0 || d < t_call) t_call = d;
        calls++;
    } while (tlm_now_s() - start < PEER_WARMUP_S);
    if (t_call < 1e-9) t_call = 1e-9;

    int64_t batch = (int64_t)ceil(PEER_BATCH_S / t_call);
    if (batch < 1) batch = 1;
    int samples = (int)ceil(PEER_TOTAL_S / ((double)batch * t_call));
    if (samples < 3) samples = 3;
    if (samples > PEER_MAX_SAMPLES) samples = PEER_MAX_SAMPLES;
    samples |= 1; /* odd: the median is one sample */

    double t[PEER_MAX_SAMPLES], begin = tlm_now_s();
    int taken = 0;
    while (taken < samples) {
        double a = tlm_now_s();
        for (int64_t i = 0; i < batch; i++)
            fn(ctx);
        double b = tlm_now_s();
        t[taken++] = (b - a) / (double)batch;
        /* A loaded machine makes calls far slower than the warm-up promised: stop at an odd
         * count once past the budget, so one figure never holds a bench up for long. */
        if (taken >= 3 && (taken & 1) && b - begin > PEER_LIMIT_S) break;
    }
    samples = taken;
    qsort(t, (size_t)samples, sizeof t[0], peer_cmp_double_);
    return t[samples / 2];
}

/* ---- data ---- */

/* Deterministic uniform [-1, 1): normal floats only, so no denormal slow paths. */
static void peer_fill_(float *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

static float *peer_alloc_(size_t n, uint32_t seed)
{
    size_t bytes = (n * sizeof(float) + 63) & ~(size_t)63;
    float *p = aligned_alloc(64, bytes ? bytes : 64);
    if (!p) {
        fprintf(stderr, "peers: out of memory allocating %zu bytes\n", bytes);
        return NULL;
    }
    peer_fill_(p, n, seed);
    return p;
}

/* ---- OpenBLAS ---- */

typedef struct {
    int m, n, k;
    bool ta, tb;
    const float *a, *b, *bias;
    float *c;
} peer_sgemm_ctx_;

static void peer_sgemm_run_(void *p)
{
    peer_sgemm_ctx_ *g = p;
    cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
                g->m, g->n, g->k, 1.0f, g->a, g->ta ? g->m : g->k, g->b, g->tb ? g->k : g->n, 0.0f,
                g->c, g->n);
}

static void peer_sgemm_bias_gelu_run_(void *p)
{
    peer_sgemm_ctx_ *g = p;
    peer_sgemm_run_(p);
    const int m = g->m, n = g->n;
    float *c = g->c;
    const float *bias = g->bias;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < m; i++) {
        float *r = c + (size_t)i * (size_t)n;
        for (int j = 0; j < n; j++) {
            float x = r[j] + bias[j];
            r[j] = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
        }
    }
}

static double peer_sgemm_common_(int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool gelu)
{
    if (M < 1 || N < 1 || K < 1 || M > INT_MAX || N > INT_MAX || K > INT_MAX) {
        fprintf(stderr, "peers: sgemm M=%lld N=%lld K=%lld: each must be in [1, INT_MAX]\n",
                (long long)M, (long long)N, (long long)K);
        return -1.0;
    }
    peer_sgemm_ctx_ g = {(int)M, (int)N, (int)K, ta, tb, NULL, NULL, NULL, NULL};
    float *a = peer_alloc_((size_t)(M * K), 1), *b = peer_alloc_((size_t)(K * N), 2);
    float *bias = peer_alloc_((size_t)N, 3), *c = peer_alloc_((size_t)(M * N), 4);
    double t = -1.0;
    if (a && b && bias && c) {
        g.a = a, g.b = b, g.bias = bias, g.c = c;
        t = peer_time_s(gelu ? peer_sgemm_bias_gelu_run_ : peer_sgemm_run_, &g);
    }
    free(a), free(b), free(bias), free(c);
    return t;
}

PEER_FN double peer_sgemm_s(int64_t M, int64_t N, int64_t K, bool ta, bool tb)
{
    return peer_sgemm_common_(M, N, K, ta, tb, false);
}

/* A[M,K] . B[K,N], then out = gelu(out + bias[N]) in a second pass. */
PEER_FN double peer_sgemm_bias_gelu_s(int64_t M, int64_t N, int64_t K)
{
    return peer_sgemm_common_(M, N, K, false, false, true);
}

/* ---- oneDNN ---- */

#define PEER_DNNL_MAX_ARGS 16
#define PEER_DNNL_MAX_OBJ 24

/* Everything one measurement creates, destroyed together. */
typedef struct {
    dnnl_memory_t mem[PEER_DNNL_MAX_OBJ];
    int n_mem;
    dnnl_primitive_desc_t pd[PEER_DNNL_MAX_OBJ];
    int n_pd;
    dnnl_primitive_t prim[PEER_DNNL_MAX_OBJ];
    int n_prim;
    dnnl_primitive_attr_t attr;
    dnnl_post_ops_t po;
    /* the timed primitive and its arguments */
    dnnl_primitive_t run;
    int nargs;
    dnnl_exec_arg_t args[PEER_DNNL_MAX_ARGS];
    dnnl_status_t run_status;
} peer_dnnl_bag_;

static dnnl_engine_t peer_engine_;
static dnnl_stream_t peer_stream_;
static char peer_dnnl_impl_[96];

/* oneDNN's name for the implementation the last peer_dnnl_* call timed ("brgconv:avx512_core",
 * "x64:gemm:jit", "ref:any", ...): plain layouts can drop oneDNN to im2col+GEMM or reference
 * code, and a reader comparing against it should see that. */
PEER_FN const char *peer_dnnl_last_impl(void)
{
    return peer_dnnl_impl_;
}

/* Evaluates a dnnl call; on failure reports it and jumps to `fail` in the caller. */
#define PEER_DNNL_TRY(what, call)                                                                  \
    do {                                                                                           \
        dnnl_status_t st_ = (call);                                                                \
        if (st_ != dnnl_success) {                                                                 \
            fprintf(stderr, "peers: %s: %s failed: %s\n", what, #call, dnnl_status2str(st_));      \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

static int peer_dnnl_init_(void)
{
    snprintf(peer_dnnl_impl_, sizeof peer_dnnl_impl_, "(none)");
    if (peer_stream_) return 0;
    PEER_DNNL_TRY("engine", dnnl_engine_create(&peer_engine_, dnnl_cpu, 0));
    PEER_DNNL_TRY("stream",
                  dnnl_stream_create(&peer_stream_, peer_engine_, dnnl_stream_default_flags));
    return 0;
fail:
    if (peer_engine_) dnnl_engine_destroy(peer_engine_);
    peer_engine_ = NULL;
    return -1;
}

static void peer_dnnl_bag_free_(peer_dnnl_bag_ *b)
{
    for (int i = 0; i < b->n_prim; i++)
        dnnl_primitive_destroy(b->prim[i]);
    for (int i = 0; i < b->n_pd; i++)
        dnnl_primitive_desc_destroy(b->pd[i]);
    for (int i = 0; i < b->n_mem; i++)
        dnnl_memory_destroy(b->mem[i]);
    if (b->attr) dnnl_primitive_attr_destroy(b->attr);
    if (b->po) dnnl_post_ops_destroy(b->po);
}

static void peer_dnnl_arg_(peer_dnnl_bag_ *b, int arg, dnnl_memory_t m)
{
    if (b->nargs < PEER_DNNL_MAX_ARGS) b->args[b->nargs++] = (dnnl_exec_arg_t){arg, m};
}

/* A memory object of md owned by the bag; filled with uniform data when seed != 0. */
static dnnl_memory_t peer_dnnl_mem_(peer_dnnl_bag_ *b, const dnnl_memory_desc_t *md, uint32_t seed)
{
    dnnl_memory_t m = NULL;
    if (b->n_mem >= PEER_DNNL_MAX_OBJ) {
        fprintf(stderr, "peers: too many oneDNN memories\n");
        return NULL;
    }
    PEER_DNNL_TRY("memory", dnnl_memory_create(&m, md, peer_engine_, DNNL_MEMORY_ALLOCATE));
    b->mem[b->n_mem++] = m;
    if (seed) {
        void *h = NULL;
        PEER_DNNL_TRY("memory", dnnl_memory_get_data_handle(m, &h));
        peer_fill_(h, dnnl_memory_desc_get_size(md) / sizeof(float), seed);
    }
    return m;
fail:
    return NULL;
}

/* A primitive from an op descriptor; its pd is kept in the bag for md queries. */
static int peer_dnnl_prim_(peer_dnnl_bag_ *b, const_dnnl_op_desc_t desc, const char *what,
                           dnnl_primitive_desc_t *pd_out, dnnl_primitive_t *prim_out)
{
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    if (b->n_pd >= PEER_DNNL_MAX_OBJ || b->n_prim >= PEER_DNNL_MAX_OBJ) return -1;
    PEER_DNNL_TRY(what, dnnl_primitive_desc_create(&pd, desc, b->attr, peer_engine_, NULL));
    b->pd[b->n_pd++] = pd;
    const char *impl = NULL;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl)
        impl = "?";
    snprintf(peer_dnnl_impl_, sizeof peer_dnnl_impl_, "%s", impl);
    PEER_DNNL_TRY(what, dnnl_primitive_create(&prim, pd));
    b->prim[b->n_prim++] = prim;
    if (pd_out) *pd_out = pd;
    *prim_out = prim;
    return 0;
fail:
    return -1;
}

/* Data in the plain layout `plain`, delivered in layout `want` (reordered once, untimed). */
static dnnl_memory_t peer_dnnl_input_(peer_dnnl_bag_ *b, const dnnl_memory_desc_t *plain,
                                      const dnnl_memory_desc_t *want, uint32_t seed)
{
    dnnl_memory_t src = peer_dnnl_mem_(b, plain, seed), dst = NULL;
    if (!src || dnnl_memory_desc_equal(plain, want)) return src;
    dst = peer_dnnl_mem_(b, want, 0);
    if (!dst || b->n_pd >= PEER_DNNL_MAX_OBJ || b->n_prim >= PEER_DNNL_MAX_OBJ) return NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    PEER_DNNL_TRY("reorder", dnnl_reorder_primitive_desc_create(&pd, plain, peer_engine_, want,
                                                                peer_engine_, NULL));
    b->pd[b->n_pd++] = pd;
    PEER_DNNL_TRY("reorder", dnnl_primitive_create(&prim, pd));
    b->prim[b->n_prim++] = prim;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    PEER_DNNL_TRY("reorder", dnnl_primitive_execute(prim, peer_stream_, 2, args));
    PEER_DNNL_TRY("reorder", dnnl_stream_wait(peer_stream_));
    return dst;
fail:
    return NULL;
}

static void peer_dnnl_run_(void *p)
{
    peer_dnnl_bag_ *b = p;
    dnnl_status_t st = dnnl_primitive_execute(b->run, peer_stream_, b->nargs, b->args);
    if (st == dnnl_success) st = dnnl_stream_wait(peer_stream_);
    if (st != dnnl_success) b->run_status = st;
}

/* Runs b->run once (reporting a failure), then times it. */
static double peer_dnnl_time_(peer_dnnl_bag_ *b, const char *what)
{
    peer_dnnl_run_(b);
    double t = b->run_status == dnnl_success ? peer_time_s(peer_dnnl_run_, b) : -1.0;
    if (b->run_status != dnnl_success) {
        fprintf(stderr, "peers: %s: execute failed: %s\n", what, dnnl_status2str(b->run_status));
        return -1.0;
    }
    return t;
}

/* Output padding that makes oneDNN's size formula give our floor-mode output size. */
static int64_t peer_pad_r_(int64_t in, int64_t out, int64_t k, int64_t s, int64_t pl, int64_t d)
{
    return (out - 1) * s + (k - 1) * d + 1 - in - pl;
}

static int64_t peer_out_(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d)
{
    int64_t num = in + 2 * p - (d * (k - 1) + 1);
    return num < 0 ? 0 : num / s + 1;
}

/* Post-ops for the workload's epilogue. A leading bias_add is left to the caller (*bias set)
 * when the primitive takes a bias. The first add becomes a sum post-op (dst += what dst held
 * before: how oneDNN users fuse a residual), so *dst_read tells the caller to fill dst with
 * data. Later adds, mul and a later bias_add become binary post-ops with operands in the
 * plain layout `dst`. (oneDNN 2.6's blocked conv kernels take a sum post-op but not a
 * full-tensor binary one, so mul drops it to im2col+GEMM; pinning the operand to the conv's
 * blocked output format was worse, reference code. peer_dnnl_last_impl() shows which ran.)
 * Binary operand memories are appended to the bag's args. */
static int peer_dnnl_epilogue_(peer_dnnl_bag_ *b, const ir_workload *w, bool takes_bias,
                               const dnnl_memory_desc_t *dst, bool *bias, bool *dst_read)
{
    *bias = *dst_read = false;
    int first = 0;
    if (w->n_epilogue > 0 && w->epilogue[0] == IR_EPI_BIAS_ADD && takes_bias)
        *bias = true, first = 1;
    if (w->n_epilogue <= first) return 0;
    PEER_DNNL_TRY("post-ops", dnnl_post_ops_create(&b->po));
    int idx = 0; /* post-op index, which binary arguments are keyed by */
    for (int i = first; i < w->n_epilogue; i++, idx++) {
        dnnl_alg_kind_t alg = dnnl_alg_kind_undef, bin = dnnl_alg_kind_undef;
        float alpha = 0.0f, beta = 0.0f;
        dnnl_memory_desc_t md;
        switch (w->epilogue[i]) {
        case IR_EPI_RELU:
            alg = dnnl_eltwise_relu;
            break;
        case IR_EPI_RELU6:
            alg = dnnl_eltwise_clip_v2, beta = 6.0f;
            break;
        case IR_EPI_GELU:
            alg = dnnl_eltwise_gelu_erf;
            break;
        case IR_EPI_SILU:
            alg = dnnl_eltwise_swish, alpha = 1.0f;
            break;
        case IR_EPI_SIGMOID:
            alg = dnnl_eltwise_logistic;
            break;
        case IR_EPI_TANH:
            alg = dnnl_eltwise_tanh;
            break;
        case IR_EPI_ADD:
            if (!*dst_read) {
                PEER_DNNL_TRY("post-ops", dnnl_post_ops_append_sum(b->po, 1.0f));
                *dst_read = true;
                continue;
            }
            bin = dnnl_binary_add;
            md = *dst;
            break;
        case IR_EPI_MUL:
            bin = dnnl_binary_mul;
            md = *dst;
            break;
        case IR_EPI_BIAS_ADD: {
            /* per-channel operand broadcast over the other dims; dim 1 is the channel */
            dnnl_dims_t d;
            for (int k = 0; k < dst->ndims; k++)
                d[k] = k == 1 ? dst->dims[1] : 1;
            PEER_DNNL_TRY("post-ops",
                          dnnl_memory_desc_init_by_strides(&md, dst->ndims, d, dnnl_f32, NULL));
            bin = dnnl_binary_add;
            break;
        }
        default:
            fprintf(stderr, "peers: epilogue[%d] has no oneDNN post-op\n", i);
            return -1;
        }
        if (alg != dnnl_alg_kind_undef) {
            PEER_DNNL_TRY("post-ops", dnnl_post_ops_append_eltwise(b->po, 1.0f, alg, alpha, beta));
        } else {
            PEER_DNNL_TRY("post-ops", dnnl_post_ops_append_binary(b->po, bin, &md));
            dnnl_memory_t m = peer_dnnl_mem_(b, &md, 100u + (uint32_t)i);
            if (!m) return -1;
            peer_dnnl_arg_(b, DNNL_ARG_ATTR_MULTIPLE_POST_OP(idx) | DNNL_ARG_SRC_1, m);
        }
    }
    PEER_DNNL_TRY("post-ops", dnnl_primitive_attr_create(&b->attr));
    PEER_DNNL_TRY("post-ops", dnnl_primitive_attr_set_post_ops(b->attr, b->po));
    return 0;
fail:
    return -1;
}

/* conv2d (groups) and depthwise_conv2d, NCHW or NHWC, with the epilogue fused as oneDNN
 * would run it. blocked: oneDNN's preferred formats, reorders excluded (see the contract). */
PEER_FN double peer_dnnl_conv_s(const ir_workload *w, bool blocked)
{
    if (w->op != IR_OP_CONV2D && w->op != IR_OP_DEPTHWISE_CONV2D) {
        fprintf(stderr, "peers: dnnl conv: op must be conv2d or depthwise_conv2d\n");
        return -1.0;
    }
    if (w->dtype != IR_FLOAT32) {
        fprintf(stderr, "peers: dnnl conv: only float32 is measured\n");
        return -1.0;
    }
    if (peer_dnnl_init_()) return -1.0;
    const bool dw = w->op == IR_OP_DEPTHWISE_CONV2D, nhwc = w->layout == IR_NHWC;
    const int64_t *s = w->shape;
    int64_t N = s[IR_CONV_N], C = s[IR_CONV_C], H = s[IR_CONV_H], W = s[IR_CONV_W];
    int64_t F = dw ? C : s[IR_CONV_F], KH = dw ? s[IR_DW_KH] : s[IR_CONV_KH];
    int64_t KW = dw ? s[IR_DW_KW] : s[IR_CONV_KW], G = dw ? C : w->groups;
    if (G < 1 || C % G || F % G) {
        fprintf(stderr, "peers: dnnl conv: groups=%lld must divide C and F\n", (long long)G);
        return -1.0;
    }
    int64_t OH = peer_out_(H, KH, w->stride[0], w->pad[0], w->dilation[0]);
    int64_t OW = peer_out_(W, KW, w->stride[1], w->pad[1], w->dilation[1]);
    if (OH < 1 || OW < 1) {
        fprintf(stderr, "peers: dnnl conv: empty output\n");
        return -1.0;
    }

    peer_dnnl_bag_ b = {0};
    double t = -1.0;
    dnnl_memory_desc_t src_p, wei_p, dst_p, bias_md, src_a, wei_a, dst_a;
    dnnl_dims_t sd = {N, C, H, W}, dd = {N, F, OH, OW}, bd = {F};
    dnnl_dims_t wd1 = {F, C, KH, KW}, wdg = {G, F / G, C / G, KH, KW};
    /* oneDNN writes the logical dims in NCHW / (G)OIHW order whatever the memory order; our
     * grouped HWIO weights Wt[KH,KW,C/g,F] with F = g*(F/g)+o are (h, w, i, g, o): hwigo. */
    dnnl_format_tag_t act = nhwc ? dnnl_nhwc : dnnl_nchw;
    dnnl_format_tag_t wtag =
        G == 1 ? (nhwc ? dnnl_hwio : dnnl_oihw) : (nhwc ? dnnl_hwigo : dnnl_goihw);
    PEER_DNNL_TRY("conv", dnnl_memory_desc_init_by_tag(&src_p, 4, sd, dnnl_f32, act));
    PEER_DNNL_TRY("conv", dnnl_memory_desc_init_by_tag(&dst_p, 4, dd, dnnl_f32, act));
    PEER_DNNL_TRY("conv", dnnl_memory_desc_init_by_tag(&wei_p, G == 1 ? 4 : 5, G == 1 ? wd1 : wdg,
                                                       dnnl_f32, wtag));
    PEER_DNNL_TRY("conv", dnnl_memory_desc_init_by_tag(&bias_md, 1, bd, dnnl_f32, dnnl_x));
    if (blocked) {
        PEER_DNNL_TRY("conv",
                      dnnl_memory_desc_init_by_tag(&src_a, 4, sd, dnnl_f32, dnnl_format_tag_any));
        PEER_DNNL_TRY("conv",
                      dnnl_memory_desc_init_by_tag(&dst_a, 4, dd, dnnl_f32, dnnl_format_tag_any));
        PEER_DNNL_TRY("conv",
                      dnnl_memory_desc_init_by_tag(&wei_a, G == 1 ? 4 : 5, G == 1 ? wd1 : wdg,
                                                   dnnl_f32, dnnl_format_tag_any));
    } else {
        src_a = src_p, dst_a = dst_p, wei_a = wei_p;
    }
    dnnl_dims_t strides = {w->stride[0], w->stride[1]};
    dnnl_dims_t dil = {w->dilation[0] - 1, w->dilation[1] - 1}; /* oneDNN: 0 = dense */
    dnnl_dims_t pl = {w->pad[0], w->pad[1]};
    dnnl_dims_t pr = {peer_pad_r_(H, OH, KH, w->stride[0], w->pad[0], w->dilation[0]),
                      peer_pad_r_(W, OW, KW, w->stride[1], w->pad[1], w->dilation[1])};
    bool bias = false, dst_read = false;
    dnnl_convolution_desc_t cd;
    if (peer_dnnl_epilogue_(&b, w, true, &dst_p, &bias, &dst_read)) goto fail;
    PEER_DNNL_TRY("conv", dnnl_dilated_convolution_forward_desc_init(
                              &cd, dnnl_forward_inference, dnnl_convolution_direct, &src_a, &wei_a,
                              bias ? &bias_md : NULL, &dst_a, strides, dil, pl, pr));
    dnnl_primitive_desc_t pd = NULL;
    if (peer_dnnl_prim_(&b, &cd, "conv", &pd, &b.run)) goto fail;
    const dnnl_memory_desc_t *src_q = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *wei_q = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *dst_q = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    if (!src_q || !wei_q || !dst_q) {
        fprintf(stderr, "peers: conv: memory descriptor query failed\n");
        goto fail;
    }
    dnnl_memory_t ms = peer_dnnl_input_(&b, &src_p, src_q, 1);
    dnnl_memory_t mw = peer_dnnl_input_(&b, &wei_p, wei_q, 2);
    dnnl_memory_t md = peer_dnnl_mem_(&b, dst_q, dst_read ? 4 : 0);
    dnnl_memory_t mb = bias ? peer_dnnl_mem_(&b, &bias_md, 3) : NULL;
    if (!ms || !mw || !md || (bias && !mb)) goto fail;
    peer_dnnl_arg_(&b, DNNL_ARG_SRC, ms);
    peer_dnnl_arg_(&b, DNNL_ARG_WEIGHTS, mw);
    peer_dnnl_arg_(&b, DNNL_ARG_DST, md);
    if (bias) peer_dnnl_arg_(&b, DNNL_ARG_BIAS, mb);
    t = peer_dnnl_time_(&b, "conv");
fail:
    peer_dnnl_bag_free_(&b);
    return t;
}

/* max_pool2d / avg_pool2d (padding counted), plain NCHW or NHWC; stride 0 = the window. */
PEER_FN double peer_dnnl_pool_s(const ir_workload *w)
{
    if ((w->op != IR_OP_MAX_POOL2D && w->op != IR_OP_AVG_POOL2D) || w->dtype != IR_FLOAT32) {
        fprintf(stderr, "peers: dnnl pool: op must be a float32 max_pool2d or avg_pool2d\n");
        return -1.0;
    }
    if (peer_dnnl_init_()) return -1.0;
    const int64_t *s = w->shape;
    int64_t N = s[IR_DW_N], C = s[IR_DW_C], H = s[IR_DW_H], W = s[IR_DW_W];
    int64_t KH = s[IR_DW_KH], KW = s[IR_DW_KW];
    int64_t sh = w->stride[0] ? w->stride[0] : KH, sw = w->stride[1] ? w->stride[1] : KW;
    int64_t OH = peer_out_(H, KH, sh, w->pad[0], w->dilation[0]);
    int64_t OW = peer_out_(W, KW, sw, w->pad[1], w->dilation[1]);
    if (OH < 1 || OW < 1) {
        fprintf(stderr, "peers: dnnl pool: empty output\n");
        return -1.0;
    }
    peer_dnnl_bag_ b = {0};
    double t = -1.0;
    dnnl_memory_desc_t src, dst;
    dnnl_dims_t sd = {N, C, H, W}, dd = {N, C, OH, OW};
    dnnl_format_tag_t act = w->layout == IR_NHWC ? dnnl_nhwc : dnnl_nchw;
    PEER_DNNL_TRY("pool", dnnl_memory_desc_init_by_tag(&src, 4, sd, dnnl_f32, act));
    PEER_DNNL_TRY("pool", dnnl_memory_desc_init_by_tag(&dst, 4, dd, dnnl_f32, act));
    bool bias = false, dst_read = false;
    if (peer_dnnl_epilogue_(&b, w, false, &dst, &bias, &dst_read)) goto fail;
    dnnl_dims_t strides = {sh, sw}, kernel = {KH, KW};
    dnnl_dims_t dil = {w->dilation[0] - 1, w->dilation[1] - 1}, pl = {w->pad[0], w->pad[1]};
    dnnl_dims_t pr = {peer_pad_r_(H, OH, KH, sh, w->pad[0], w->dilation[0]),
                      peer_pad_r_(W, OW, KW, sw, w->pad[1], w->dilation[1])};
    dnnl_pooling_v2_desc_t pdsc;
    PEER_DNNL_TRY(
        "pool", dnnl_pooling_v2_forward_desc_init(
                    &pdsc, dnnl_forward_inference,
                    w->op == IR_OP_MAX_POOL2D ? dnnl_pooling_max : dnnl_pooling_avg_include_padding,
                    &src, &dst, strides, kernel, dil, pl, pr));
    if (peer_dnnl_prim_(&b, &pdsc, "pool", NULL, &b.run)) goto fail;
    dnnl_memory_t ms = peer_dnnl_mem_(&b, &src, 1), md = peer_dnnl_mem_(&b, &dst, dst_read ? 4 : 0);
    if (!ms || !md) goto fail;
    peer_dnnl_arg_(&b, DNNL_ARG_SRC, ms);
    peer_dnnl_arg_(&b, DNNL_ARG_DST, md);
    t = peer_dnnl_time_(&b, "pool");
fail:
    peer_dnnl_bag_free_(&b);
    return t;
}

/* Softmax over the last axis of X[R,C], out of place. */
PEER_FN double peer_dnnl_softmax_s(int64_t R, int64_t C)
{
    if (peer_dnnl_init_()) return -1.0;
    peer_dnnl_bag_ b = {0};
    double t = -1.0;
    dnnl_memory_desc_t md;
    dnnl_dims_t d = {R, C};
    PEER_DNNL_TRY("softmax", dnnl_memory_desc_init_by_tag(&md, 2, d, dnnl_f32, dnnl_ab));
    dnnl_softmax_desc_t sd;
    PEER_DNNL_TRY("softmax", dnnl_softmax_forward_desc_init(&sd, dnnl_forward_inference, &md, 1));
    if (peer_dnnl_prim_(&b, &sd, "softmax", NULL, &b.run)) goto fail;
    dnnl_memory_t ms = peer_dnnl_mem_(&b, &md, 1), mo = peer_dnnl_mem_(&b, &md, 0);
    if (!ms || !mo) goto fail;
    peer_dnnl_arg_(&b, DNNL_ARG_SRC, ms);
    peer_dnnl_arg_(&b, DNNL_ARG_DST, mo);
    t = peer_dnnl_time_(&b, "softmax");
fail:
    peer_dnnl_bag_free_(&b);
    return t;
}

/* Layer norm over the last axis of X[R,C] with gamma[C], beta[C], eps 1e-5, out of place.
 * oneDNN 2.6 takes separate scale and shift (dnnl_use_scale | dnnl_use_shift), matching our
 * ABI; the older packed scaleshift is the fallback should a build lack them. */
PEER_FN double peer_dnnl_layer_norm_s(int64_t R, int64_t C)
{
    if (peer_dnnl_init_()) return -1.0;
    double t = -1.0;
    for (int packed = 0; packed < 2 && t < 0; packed++) {
        peer_dnnl_bag_ b = {0};
        dnnl_memory_desc_t md, ss;
        dnnl_dims_t d = {R, C}, dss = {2, C}, dc = {C};
        unsigned flags = packed ? dnnl_use_scaleshift : (dnnl_use_scale | dnnl_use_shift);
        PEER_DNNL_TRY("layer_norm", dnnl_memory_desc_init_by_tag(&md, 2, d, dnnl_f32, dnnl_ab));
        PEER_DNNL_TRY("layer_norm",
                      packed ? dnnl_memory_desc_init_by_tag(&ss, 2, dss, dnnl_f32, dnnl_ab)
                             : dnnl_memory_desc_init_by_tag(&ss, 1, dc, dnnl_f32, dnnl_x));
        dnnl_layer_normalization_desc_t ld;
        PEER_DNNL_TRY("layer_norm", dnnl_layer_normalization_forward_desc_init(
                                        &ld, dnnl_forward_inference, &md, NULL, 1e-5f, flags));
        if (peer_dnnl_prim_(&b, &ld, "layer_norm", NULL, &b.run)) goto fail;
        dnnl_memory_t ms = peer_dnnl_mem_(&b, &md, 1), mo = peer_dnnl_mem_(&b, &md, 0);
        dnnl_memory_t m1 = peer_dnnl_mem_(&b, &ss, 2),
                      m2 = packed ? m1 : peer_dnnl_mem_(&b, &ss, 3);
        if (!ms || !mo || !m1 || !m2) goto fail;
        peer_dnnl_arg_(&b, DNNL_ARG_SRC, ms);
        peer_dnnl_arg_(&b, DNNL_ARG_DST, mo);
        if (packed) {
            peer_dnnl_arg_(&b, DNNL_ARG_SCALE_SHIFT, m1);
        } else {
            peer_dnnl_arg_(&b, DNNL_ARG_SCALE, m1);
            peer_dnnl_arg_(&b, DNNL_ARG_SHIFT, m2);
        }
        t = peer_dnnl_time_(&b, "layer_norm");
    fail:
        peer_dnnl_bag_free_(&b);
    }
    return t;
}

/* oneDNN matmul, plain row-major A[M,K] . B[K,N] -> out[M,N]: a second GEMM peer. */
PEER_FN double peer_dnnl_matmul_s(int64_t M, int64_t N, int64_t K)
{
    if (peer_dnnl_init_()) return -1.0;
    peer_dnnl_bag_ b = {0};
    double t = -1.0;
    dnnl_memory_desc_t a, w, o;
    dnnl_dims_t da = {M, K}, dw = {K, N}, dout = {M, N};
    PEER_DNNL_TRY("matmul", dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_f32, dnnl_ab));
    PEER_DNNL_TRY("matmul", dnnl_memory_desc_init_by_tag(&w, 2, dw, dnnl_f32, dnnl_ab));
    PEER_DNNL_TRY("matmul", dnnl_memory_desc_init_by_tag(&o, 2, dout, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t mdsc;
    PEER_DNNL_TRY("matmul", dnnl_matmul_desc_init(&mdsc, &a, &w, NULL, &o));
    if (peer_dnnl_prim_(&b, &mdsc, "matmul", NULL, &b.run)) goto fail;
    dnnl_memory_t ma = peer_dnnl_mem_(&b, &a, 1), mw = peer_dnnl_mem_(&b, &w, 2);
    dnnl_memory_t mo = peer_dnnl_mem_(&b, &o, 0);
    if (!ma || !mw || !mo) goto fail;
    peer_dnnl_arg_(&b, DNNL_ARG_SRC, ma);
    peer_dnnl_arg_(&b, DNNL_ARG_WEIGHTS, mw);
    peer_dnnl_arg_(&b, DNNL_ARG_DST, mo);
    t = peer_dnnl_time_(&b, "matmul");
fail:
    peer_dnnl_bag_free_(&b);
    return t;
}

/* ---- machine limits ---- */

/* FMA peak. 16 independent accumulators cover latency x throughput on current x86 cores
 * (Zen 4: 4-cycle latency, one zmm FMA per cycle; Intel server cores: 4 cycles x 2 per
 * cycle = 8 in flight), and all fit in registers alongside the two constants.
 * Checked: objdump -d build/bench/peers_selftest (gcc -O3 -march=native, Zen 4 with
 * AVX-512) shows the hot loop of peer_fma_kernel_ as exactly 16 `vfmadd132ps %zmmX,%zmmY,%zmmZ`
 * register-only instructions (zmm1 = m, zmm0 = c), a `dec` and a `jne`: no loads or stores. */
#if defined(__AVX512F__)
#define PEER_FMA_LANES 16
#define PEER_FMA_ISA "avx512 zmm"
typedef __m512 peer_vec_;
#define PEER_SET1(x) _mm512_set1_ps(x)
#define PEER_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define PEER_ADD(a, b) _mm512_add_ps(a, b)
static float peer_hsum_(peer_vec_ v)
{
    return _mm512_reduce_add_ps(v);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define PEER_FMA_LANES 8
#define PEER_FMA_ISA "avx2 ymm"
typedef __m256 peer_vec_;
#define PEER_SET1(x) _mm256_set1_ps(x)
#define PEER_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define PEER_ADD(a, b) _mm256_add_ps(a, b)
static float peer_hsum_(peer_vec_ v)
{
    float t[8];
    _mm256_storeu_ps(t, v);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#else
#define PEER_FMA_LANES 1
#define PEER_FMA_ISA "scalar"
typedef float peer_vec_;
#define PEER_SET1(x) (x)
#define PEER_FMA(a, b, c) fmaf(a, b, c)
#define PEER_ADD(a, b) ((a) + (b))
static float peer_hsum_(peer_vec_ v)
{
    return v;
}
#endif
#define PEER_FMA_ACC 16
#define PEER_FMA_ITERS 1000000

PEER_FN const char *peer_fma_isa(void)
{
    return PEER_FMA_ISA;
}

/* x <- x*m + c converges to c/(1-m) = 1: values stay normal however long it runs. */
__attribute__((noinline)) static float peer_fma_kernel_(int64_t iters, float seed)
{
    const peer_vec_ m = PEER_SET1(0.999f), c = PEER_SET1(0.001f);
    peer_vec_ a0 = PEER_SET1(seed), a1 = PEER_SET1(seed + 1), a2 = PEER_SET1(seed + 2),
              a3 = PEER_SET1(seed + 3), a4 = PEER_SET1(seed + 4), a5 = PEER_SET1(seed + 5),
              a6 = PEER_SET1(seed + 6), a7 = PEER_SET1(seed + 7), a8 = PEER_SET1(seed + 8),
              a9 = PEER_SET1(seed + 9), a10 = PEER_SET1(seed + 10), a11 = PEER_SET1(seed + 11),
              a12 = PEER_SET1(seed + 12), a13 = PEER_SET1(seed + 13), a14 = PEER_SET1(seed + 14),
              a15 = PEER_SET1(seed + 15);
    for (int64_t i = 0; i < iters; i++) {
        a0 = PEER_FMA(a0, m, c), a1 = PEER_FMA(a1, m, c), a2 = PEER_FMA(a2, m, c);
        a3 = PEER_FMA(a3, m, c), a4 = PEER_FMA(a4, m, c), a5 = PEER_FMA(a5, m, c);
        a6 = PEER_FMA(a6, m, c), a7 = PEER_FMA(a7, m, c), a8 = PEER_FMA(a8, m, c);
        a9 = PEER_FMA(a9, m, c), a10 = PEER_FMA(a10, m, c), a11 = PEER_FMA(a11, m, c);
        a12 = PEER_FMA(a12, m, c), a13 = PEER_FMA(a13, m, c), a14 = PEER_FMA(a14, m, c);
        a15 = PEER_FMA(a15, m, c);
    }
    peer_vec_ s = PEER_ADD(PEER_ADD(PEER_ADD(a0, a1), PEER_ADD(a2, a3)),
                           PEER_ADD(PEER_ADD(a4, a5), PEER_ADD(a6, a7)));
    s = PEER_ADD(s, PEER_ADD(PEER_ADD(PEER_ADD(a8, a9), PEER_ADD(a10, a11)),
                             PEER_ADD(PEER_ADD(a12, a13), PEER_ADD(a14, a15))));
    return peer_hsum_(s);
}

typedef struct {
    int threads;
    volatile float sink;
} peer_fma_ctx_;

static void peer_fma_run_(void *p)
{
    peer_fma_ctx_ *f = p;
    float total = 0.0f;
#pragma omp parallel num_threads(f->threads) reduction(+ : total)
    total += peer_fma_kernel_(PEER_FMA_ITERS, (float)omp_get_thread_num());
    f->sink = total;
}

/* GFLOP/s of `threads` threads (<= 0: all cores) each running the FMA kernel. */
PEER_FN double peer_fma_peak_gflops(int threads)
{
    peer_fma_ctx_ f = {threads > 0 ? threads : omp_get_num_procs(), 0.0f};
    double t = peer_time_s(peer_fma_run_, &f);
    double flops = 2.0 * PEER_FMA_LANES * PEER_FMA_ACC * (double)PEER_FMA_ITERS * f.threads;
    return flops / t * 1e-9;
}

#define PEER_MEM_BYTES ((size_t)512 << 20)

typedef struct {
    float *a, *b;
    size_t n;
    volatile float sink;
} peer_mem_ctx_;

static void peer_mem_read_run_(void *p)
{
    peer_mem_ctx_ *m = p;
    const float *a = m->a;
    const size_t blocks = m->n / 64;
    float total = 0.0f;
#pragma omp parallel reduction(+ : total)
    {
        /* 64 separate lanes: the compiler vectorizes them as several independent vector
         * accumulators, so the add latency never limits the read rate. Checked with objdump
         * (gcc -O3 -march=native, Zen 4): the loop is 4 independent zmm accumulators fed by
         * `vaddps mem,%zmmN,%zmmN`, unrolled twice. */
        float acc[64] = {0};
#pragma omp for schedule(static)
        for (size_t i = 0; i < blocks; i++)
            for (int j = 0; j < 64; j++)
                acc[j] += a[i * 64 + (size_t)j];
        for (int j = 0; j < 64; j++)
            total += acc[j];
    }
    m->sink = total;
}

static void peer_mem_copy_run_(void *p)
{
    peer_mem_ctx_ *m = p;
    const size_t n = m->n;
#pragma omp parallel
    {
        size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        size_t lo = n * id / nt, hi = n * (id + 1) / nt;
        memcpy(m->b + lo, m->a + lo, (hi - lo) * sizeof(float));
    }
}

/* Pages first touched by the threads that will stream them (matters on NUMA machines). */
static float *peer_mem_alloc_(size_t n)
{
    float *p = aligned_alloc(64, n * sizeof(float));
    if (!p) {
        fprintf(stderr, "peers: out of memory allocating %zu bytes\n", n * sizeof(float));
        return NULL;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(i & 1023) * 0.001f;
    return p;
}

/* Read bandwidth, GB/s: sum over a 512 MiB float array on all cores. */
PEER_FN double peer_mem_bandwidth_gbs(void)
{
    peer_mem_ctx_ m = {peer_mem_alloc_(PEER_MEM_BYTES / sizeof(float)), NULL,
                       PEER_MEM_BYTES / sizeof(float), 0.0f};
    if (!m.a) return -1.0;
    double t = peer_time_s(peer_mem_read_run_, &m);
    free(m.a);
    return (double)PEER_MEM_BYTES / t * 1e-9;
}

/* The bandwidth floor of a memory-bound kernel that reads in_bytes and writes out_bytes,
 * measured on buffers of exactly those sizes with the peers' protocol: a copy of out_bytes
 * when the kernel writes as much as it reads (softmax, norms, elementwise, transpose: the
 * fastest of memcpy and two streaming-store copies, one prefetching), else a read of in_bytes
 * (reductions).
 * Warm (cold = false): every call sees the same buffers, as our kernels do in the measure
 * runner's default, so an operand that fits the caches is timed from the caches; what part
 * of a DRAM-sized one a large (or shared) L3 keeps varies from minute to minute, which is
 * why benches time it beside our kernels, alternating. Cold: calls rotate through copies of
 * the buffers totalling at least PEER_COLD_BYTES, as the measure runner's cold_cache does
 * for our kernels (compiler/measure/cpu_runner.c), so each call streams from DRAM.
 * Seconds, or -1. */
#define PEER_COLD_BYTES ((size_t)1 << 30) /* the measure runner's MEASURE_COLD_TARGET_BYTES */
#define PEER_COLD_MAX_COPIES 64

typedef struct {
    float *a[PEER_COLD_MAX_COPIES], *b[PEER_COLD_MAX_COPIES];
    int k, next; /* copies, the next one to use */
    size_t n_in, n_out;
    bool pf; /* the streamed copy prefetches its source */
    float sink;
} peer_floor_ctx_;

/* A copy with streaming stores (no read for ownership of the destination's lines): the
 * floor for outputs larger than the caches, where memcpy may keep plain stores. With pf,
 * each line's source is also prefetched into L2 4 KiB ahead, as the measure runner's floor
 * does (compiler/measure/cpu_runner.c: from DRAM 1.13-1.27x faster, in cache 0.96x). */
static void peer_floor_stream_run_(void *p)
{
    peer_floor_ctx_ *m = p;
    const float *a = m->a[m->next];
    float *b = m->b[m->next];
    if (++m->next == m->k) m->next = 0;
    const size_t n = m->n_out;
#pragma omp parallel
    {
        size_t nt = (size_t)omp_get_num_threads(), id = (size_t)omp_get_thread_num();
        size_t lo = n * id / nt / 16 * 16, hi = id + 1 == nt ? n : n * (id + 1) / nt / 16 * 16;
        size_t i = lo; /* lo is 64-byte aligned: whole lines, the widest stores built for */
        for (; i + 16 <= hi; i += 16) { /* a line a step; with pf, its source 4 KiB ahead */
            if (m->pf) _mm_prefetch((const char *)(a + i + 1024), _MM_HINT_T1);
#if defined(__AVX512F__)
            _mm512_stream_ps(b + i, _mm512_load_ps(a + i));
#elif defined(__AVX__)
            _mm256_stream_ps(b + i, _mm256_load_ps(a + i));
            _mm256_stream_ps(b + i + 8, _mm256_load_ps(a + i + 8));
#else
            for (int l = 0; l < 16; l += 4)
                _mm_stream_ps(b + i + l, _mm_load_ps(a + i + l));
#endif
        }
        for (; i + 4 <= hi; i += 4)
            _mm_stream_ps(b + i, _mm_load_ps(a + i));
        for (; i < hi; i++)
            b[i] = a[i];
        _mm_sfence();
    }
}

static void peer_floor_run_(void *p)
{
    peer_floor_ctx_ *m = p;
    float *a = m->a[m->next], *b = m->b[m->next];
    if (++m->next == m->k) m->next = 0;
    if (b) {
        peer_mem_ctx_ c = {a, b, m->n_out, 0.0f};
        peer_mem_copy_run_(&c);
    } else {
        peer_mem_ctx_ c = {a, NULL, m->n_in / 64 * 64, 0.0f};
        peer_mem_read_run_(&c);
        m->sink = c.sink;
    }
}

PEER_FN double peer_mem_floor_s(double in_bytes, double out_bytes, bool cold)
{
    size_t n_in = (size_t)(in_bytes / sizeof(float)), n_out = (size_t)(out_bytes / sizeof(float));
    if (n_in < 64) n_in = 64;
    bool copy = 2 * out_bytes >= in_bytes;
    size_t na = copy ? (n_out > n_in ? n_out : n_in) : n_in, nb = copy ? n_out : 0;
    size_t set = (na + nb) * sizeof(float);
    int k = cold ? (int)((PEER_COLD_BYTES + set - 1) / set) : 1;
    if (k > PEER_COLD_MAX_COPIES) k = PEER_COLD_MAX_COPIES;
    peer_floor_ctx_ *m = calloc(1, sizeof *m);
    if (!m) return -1.0;
    m->k = k, m->n_in = n_in, m->n_out = n_out;
    bool ok = true;
    for (int c = 0; c < k && ok; c++) {
        m->a[c] = peer_mem_alloc_(na);
        m->b[c] = copy ? peer_mem_alloc_(nb) : NULL;
        ok = m->a[c] && (!copy || m->b[c]);
    }
    double t = ok ? peer_time_s(peer_floor_run_, m) : -1.0;
    for (int pf = 0; t > 0 && copy && pf < 2; pf++) { /* the fastest of memcpy and the */
        m->pf = pf;                                    /* streaming copies */
        double ts = peer_time_s(peer_floor_stream_run_, m);
        if (ts > 0 && ts < t) t = ts;
    }
    for (int c = 0; c < k; c++)
        free(m->a[c]), free(m->b[c]);
    free(m);
    return t;
}

/* Copy bandwidth, GB/s of bytes read + written: 256 MiB -> 256 MiB on all cores. */
PEER_FN double peer_mem_copy_gbs(void)
{
    size_t n = PEER_MEM_BYTES / 2 / sizeof(float);
    peer_mem_ctx_ m = {peer_mem_alloc_(n), peer_mem_alloc_(n), n, 0.0f};
    double t = -1.0;
    if (m.a && m.b) t = peer_time_s(peer_mem_copy_run_, &m);
    free(m.a), free(m.b);
    return t < 0 ? -1.0 : (double)PEER_MEM_BYTES / t * 1e-9;
}

#endif
