/* gemm.c — the CPU forward's matrix product, batch- and ISA-invariant by construction; see
 * the contract in internal.h.
 *
 * Why our own: OpenBLAS chooses kernels and blockings by CPU, shape and thread count, so a
 * row's bits can change with the batch (they did on AVX2-only EPYC hosts, even with every
 * call padded to one fixed shape) and logits differ between hosts. Here every output element
 * is one sequential fma chain over k, which leaves nothing to choose: any blocking over rows
 * or columns, any vector width and any thread gives the same bits.
 *
 * BLIS layout: column panels of NR columns of w and, inside a panel, register tiles of MR
 * rows x NR columns. The micro-kernel keeps MR x NR accumulators in registers; per k it
 * loads one vector row of the panel and broadcasts each of the MR inp elements against it.
 * A panel narrower than NR (N not a multiple of it) uses masked loads and stores, so no
 * element is read or written outside the matrices; fewer than MR rows use the same kernel
 * with fewer rows. Two drivers feed the kernel:
 *  - at most MR rows (decode): one tile per panel, and w is read once, from memory for any
 *    model larger than the caches. The tile walks KB rows of w at a time across a whole
 *    column block and parks its accumulators in out between k blocks (a float store and
 *    load is exact: the chains go on unchanged), so w streams row by row;
 *  - more rows: row chunks of MC and column blocks of PACK_NB, each block copied once to a
 *    contiguous per-thread buffer and read by every tile of the chunk (BLIS's packing of B,
 *    per call: no copy of the model is kept).
 * Threads share column blocks (and row chunks); the bits do not depend on the split.
 *
 * Measured on this host (Xeon, AVX-512, 1 thread, a busy 2-core machine, so single figures
 * move by +-30%): with w in cache, against OpenBLAS sgemm (its AVX-512 kernels) at the exact
 * shape, for K x N of the 2M/10M models and the lm heads (128 x 4273, 256 x 1500) at 1 to
 * 64 rows, between 0.4x and 1.9x its time, about 0.9x typically; the AVX2 path on the same
 * host about 1.5-2x the AVX-512 path's time (half the vector width). With w from memory,
 * walking each panel down all K rows instead of the KB-row blocks made the 10M model's
 * decode step at one row take 1.7x as long on AVX-512 and 3x on AVX2 (one to four cache
 * lines per row of w, rows N floats apart). Without packing, 16 rows of a 512 x 2048
 * product took 2.4x as long (the panel's rows, 8 KiB apart, fall into a few cache sets and
 * are evicted between tiles).
 *
 * The vector paths are compiled for their instruction sets with target attributes (the
 * library itself is built for generic x86-64) and are only called after
 * __builtin_cpu_supports said yes. They use intrinsics only: no a * b + c in C that the
 * compiler could contract differently from the scalar path.
 */
#include "compiler/tlm/internal.h"

#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TLM_GEMM_X86 1
#else
#define TLM_GEMM_X86 0
#endif

/* Rows per chunk: a multiple of every MR, small enough that a chunk of inp (MC x K, K up to
 * 4C) stays in L2 while the panels stream past. */
#define MC 96

/* Columns per packed block of w: one AVX-512 panel, four AVX2 panels (256 bytes a row). */
#define PACK_NB 64

/* The one-tile path (decode): column blocks of STREAM_NB (the unit of threading), within
 * them KB rows of w at a time. */
#define STREAM_NB 1024
#define KB 16

/* ---- ISA selection ------------------------------------------------------------------------ */

static pthread_once_t g_isa_once = PTHREAD_ONCE_INIT;
static int g_isa_best = TLM_GEMM_SCALAR; /* written once under g_isa_once */
static int g_isa = TLM_GEMM_SCALAR;      /* atomic: the path calls use now */

static void isa_init(void)
{
#if TLM_GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) g_isa_best = TLM_GEMM_AVX2;
    if (__builtin_cpu_supports("avx512f")) g_isa_best = TLM_GEMM_AVX512;
#endif
    int isa = g_isa_best;
    const char *env = getenv("TLM_GEMM_ISA");
    if (env) {
        int want = !strcmp(env, "scalar")   ? TLM_GEMM_SCALAR
                   : !strcmp(env, "avx2")   ? TLM_GEMM_AVX2
                   : !strcmp(env, "avx512") ? TLM_GEMM_AVX512
                                            : -1;
        if (want > 0 && want <= g_isa_best) isa = want;
    }
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELAXED);
}

int tlm_gemm_isa_supported(tlm_gemm_isa_t isa)
{
    pthread_once(&g_isa_once, isa_init);
    return isa == TLM_GEMM_AUTO || (isa >= TLM_GEMM_SCALAR && (int)isa <= g_isa_best);
}

int tlm_gemm_set_isa(tlm_gemm_isa_t isa)
{
    pthread_once(&g_isa_once, isa_init);
    if (isa < TLM_GEMM_AUTO || isa > TLM_GEMM_AVX512) return TLM_EINVAL;
    if (!tlm_gemm_isa_supported(isa)) return TLM_EUNSUPPORTED;
    __atomic_store_n(&g_isa, isa == TLM_GEMM_AUTO ? g_isa_best : (int)isa, __ATOMIC_RELAXED);
    return 0;
}

tlm_gemm_isa_t tlm_gemm_get_isa(void)
{
    pthread_once(&g_isa_once, isa_init);
    return (tlm_gemm_isa_t)__atomic_load_n(&g_isa, __ATOMIC_RELAXED);
}

const char *tlm_gemm_isa_name(tlm_gemm_isa_t isa)
{
    switch (isa) {
    case TLM_GEMM_SCALAR:
        return "scalar";
    case TLM_GEMM_AVX2:
        return "avx2";
    case TLM_GEMM_AVX512:
        return "avx512";
    default:
        return "auto";
    }
}

/* ---- one panel: out (R, nc) = inp (R, K) @ w (K, nc) + bias, nc <= NR ---------------------
 *
 * Every path below has this signature. a: inp (R rows, lda apart); b: the panel's first
 * column of w (rows ldb apart); c: the panel's first column of out (rows ldc apart); bias:
 * the panel's first bias or NULL. load: the chains go on from the values in c (a previous
 * call did the earlier k) instead of from +0; bias is then only given with the last k. */
typedef void (*panel_fn)(int R, int K, const float *a, size_t lda, const float *b, size_t ldb,
                         float *c, size_t ldc, const float *bias, int nc, int load);

/* Portable path. The chain for each element lives in c between k steps (a float store and
 * load is exact), so the loop can run over k outside and stream rows of w. */
static void scalar_panel(int R, int K, const float *a, size_t lda, const float *b, size_t ldb,
                         float *c, size_t ldc, const float *bias, int nc, int load)
{
    for (int r = 0; r < R; r++) {
        const float *ar = a + (size_t)r * lda;
        float *cr = c + (size_t)r * ldc;
        if (!load)
            for (int j = 0; j < nc; j++)
                cr[j] = 0.0f;
        for (int k = 0; k < K; k++) {
            const float *bk = b + (size_t)k * ldb;
            float ak = ar[k];
            for (int j = 0; j < nc; j++)
                cr[j] = fmaf(ak, bk[j], cr[j]);
        }
        if (bias)
            for (int j = 0; j < nc; j++)
                cr[j] = cr[j] + bias[j];
    }
}

#if TLM_GEMM_X86

/* AVX2 + FMA: 16 ymm registers hold 6 x 2 accumulators, the two vectors of w's row and
 * the broadcast (Haswell BLIS's 6 x 16). */
#define Y_MR 6
#define Y_NV 2
#define Y_NR (8 * Y_NV)

#define Y_TARGET __attribute__((target("avx2,fma")))

static inline __attribute__((always_inline)) Y_TARGET void
y_tile(const int mr, const int masked, int K, const float *a, size_t lda, const float *b,
       size_t ldb, float *c, size_t ldc, const float *bias, int nc, int load)
{
    __m256i mk[Y_NV];
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
#pragma GCC unroll 8
    for (int v = 0; v < Y_NV; v++)
        mk[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc - 8 * v), lane);
    __m256 acc[Y_MR][Y_NV];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int v = 0; v < Y_NV; v++) {
            const float *ci = c + (size_t)i * ldc + 8 * v;
            acc[i][v] = !load    ? _mm256_setzero_ps()
                        : masked ? _mm256_maskload_ps(ci, mk[v])
                                 : _mm256_loadu_ps(ci);
        }
    for (int k = 0; k < K; k++) {
        const float *bk = b + (size_t)k * ldb;
        __m256 bv[Y_NV];
#pragma GCC unroll 8
        for (int v = 0; v < Y_NV; v++)
            bv[v] = masked ? _mm256_maskload_ps(bk + 8 * v, mk[v]) : _mm256_loadu_ps(bk + 8 * v);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m256 av = _mm256_broadcast_ss(a + (size_t)i * lda + k);
#pragma GCC unroll 8
            for (int v = 0; v < Y_NV; v++)
                acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    if (bias)
#pragma GCC unroll 8
        for (int v = 0; v < Y_NV; v++) {
            __m256 bb =
                masked ? _mm256_maskload_ps(bias + 8 * v, mk[v]) : _mm256_loadu_ps(bias + 8 * v);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++)
                acc[i][v] = _mm256_add_ps(acc[i][v], bb);
        }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int v = 0; v < Y_NV; v++) {
            float *ci = c + (size_t)i * ldc + 8 * v;
            if (masked)
                _mm256_maskstore_ps(ci, mk[v], acc[i][v]);
            else
                _mm256_storeu_ps(ci, acc[i][v]);
        }
}

#define Y_TILE(MR_, M_)                                                                            \
    y_tile(MR_, M_, K, a + (size_t)r * lda, lda, b, ldb, c + (size_t)r * ldc, ldc, bias, nc, load)

static Y_TARGET void avx2_panel(int R, int K, const float *a, size_t lda, const float *b,
                                size_t ldb, float *c, size_t ldc, const float *bias, int nc,
                                int load)
{
    int r = 0;
    if (nc == Y_NR) {
        for (; r + Y_MR <= R; r += Y_MR)
            Y_TILE(Y_MR, 0);
        switch (R - r) {
        case 5:
            Y_TILE(5, 0);
            break;
        case 4:
            Y_TILE(4, 0);
            break;
        case 3:
            Y_TILE(3, 0);
            break;
        case 2:
            Y_TILE(2, 0);
            break;
        case 1:
            Y_TILE(1, 0);
            break;
        }
    } else {
        for (; r + Y_MR <= R; r += Y_MR)
            Y_TILE(Y_MR, 1);
        switch (R - r) {
        case 5:
            Y_TILE(5, 1);
            break;
        case 4:
            Y_TILE(4, 1);
            break;
        case 3:
            Y_TILE(3, 1);
            break;
        case 2:
            Y_TILE(2, 1);
            break;
        case 1:
            Y_TILE(1, 1);
            break;
        }
    }
    /* Clean upper register halves before returning to SSE code: GCC adds this itself when
     * optimising (-O2), not at -O1 (the sanitizer build), where every later SSE
     * instruction would then run tens of times slower. */
    _mm256_zeroupper();
}

/* AVX-512F: 32 zmm registers hold 6 x 4 accumulators, four vectors of w's row and the
 * broadcast. */
#define Z_MR 6
#define Z_NV 4
#define Z_NR (16 * Z_NV)

#define Z_TARGET __attribute__((target("avx512f")))

static inline __attribute__((always_inline)) Z_TARGET void
z_tile(const int mr, const int masked, int K, const float *a, size_t lda, const float *b,
       size_t ldb, float *c, size_t ldc, const float *bias, int nc, int load)
{
    __mmask16 mk[Z_NV];
#pragma GCC unroll 8
    for (int v = 0; v < Z_NV; v++) {
        int rem = nc - 16 * v;
        mk[v] = rem >= 16 ? (__mmask16)0xFFFF : rem <= 0 ? 0 : (__mmask16)((1u << rem) - 1);
    }
    __m512 acc[Z_MR][Z_NV];
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int v = 0; v < Z_NV; v++) {
            const float *ci = c + (size_t)i * ldc + 16 * v;
            acc[i][v] = !load    ? _mm512_setzero_ps()
                        : masked ? _mm512_maskz_loadu_ps(mk[v], ci)
                                 : _mm512_loadu_ps(ci);
        }
    for (int k = 0; k < K; k++) {
        const float *bk = b + (size_t)k * ldb;
        __m512 bv[Z_NV];
#pragma GCC unroll 8
        for (int v = 0; v < Z_NV; v++)
            bv[v] =
                masked ? _mm512_maskz_loadu_ps(mk[v], bk + 16 * v) : _mm512_loadu_ps(bk + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < mr; i++) {
            __m512 av = _mm512_set1_ps(a[(size_t)i * lda + k]);
#pragma GCC unroll 8
            for (int v = 0; v < Z_NV; v++)
                acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
    if (bias)
#pragma GCC unroll 8
        for (int v = 0; v < Z_NV; v++) {
            __m512 bb = masked ? _mm512_maskz_loadu_ps(mk[v], bias + 16 * v)
                               : _mm512_loadu_ps(bias + 16 * v);
#pragma GCC unroll 8
            for (int i = 0; i < mr; i++)
                acc[i][v] = _mm512_add_ps(acc[i][v], bb);
        }
#pragma GCC unroll 8
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 8
        for (int v = 0; v < Z_NV; v++) {
            float *ci = c + (size_t)i * ldc + 16 * v;
            if (masked)
                _mm512_mask_storeu_ps(ci, mk[v], acc[i][v]);
            else
                _mm512_storeu_ps(ci, acc[i][v]);
        }
}

#define Z_TILE(MR_, M_)                                                                            \
    z_tile(MR_, M_, K, a + (size_t)r * lda, lda, b, ldb, c + (size_t)r * ldc, ldc, bias, nc, load)

static Z_TARGET void avx512_panel(int R, int K, const float *a, size_t lda, const float *b,
                                  size_t ldb, float *c, size_t ldc, const float *bias, int nc,
                                  int load)
{
    int r = 0;
    if (nc == Z_NR) {
        for (; r + Z_MR <= R; r += Z_MR)
            Z_TILE(Z_MR, 0);
        switch (R - r) {
        case 5:
            Z_TILE(5, 0);
            break;
        case 4:
            Z_TILE(4, 0);
            break;
        case 3:
            Z_TILE(3, 0);
            break;
        case 2:
            Z_TILE(2, 0);
            break;
        case 1:
            Z_TILE(1, 0);
            break;
        }
    } else {
        for (; r + Z_MR <= R; r += Z_MR)
            Z_TILE(Z_MR, 1);
        switch (R - r) {
        case 5:
            Z_TILE(5, 1);
            break;
        case 4:
            Z_TILE(4, 1);
            break;
        case 3:
            Z_TILE(3, 1);
            break;
        case 2:
            Z_TILE(2, 1);
            break;
        case 1:
            Z_TILE(1, 1);
            break;
        }
    }
    _mm256_zeroupper(); /* see avx2_panel */
}

#endif /* TLM_GEMM_X86 */

/* ---- driver ------------------------------------------------------------------------------- */

/* Copies a block of w (K rows of nc <= PACK_NB columns, ldw apart) to buf (K, PACK_NB),
 * zero-filled past nc. */
static void pack_block(float *buf, const float *w, size_t ldw, int K, int nc)
{
    for (int k = 0; k < K; k++) {
        memcpy(buf + (size_t)k * PACK_NB, w + (size_t)k * ldw, (size_t)nc * sizeof(float));
        if (nc < PACK_NB)
            memset(buf + (size_t)k * PACK_NB + nc, 0, (size_t)(PACK_NB - nc) * sizeof(float));
    }
}

void tlm_gemm(float *out, const float *inp, const float *w, size_t ldw, const float *bias, int R,
              int K, int N, size_t par_min)
{
    if (R <= 0 || N <= 0) return;
    panel_fn panel = NULL; /* NULL: the scalar code */
    int nr = PACK_NB, mr = 0;
#if TLM_GEMM_X86
    switch (tlm_gemm_get_isa()) {
    case TLM_GEMM_AVX512:
        panel = avx512_panel;
        nr = Z_NR;
        mr = Z_MR;
        break;
    case TLM_GEMM_AVX2:
        panel = avx2_panel;
        nr = Y_NR;
        mr = Y_MR;
        break;
    default:
        break;
    }
#endif
    const double work = (double)R * K * N;
    const int par = work >= (double)par_min;
    if (panel && R <= mr) {
        /* One register tile of rows (decode): w read in place, KB rows of it at a time
         * across a whole column block, the accumulators parked in out between k blocks (a
         * float store and load is exact, so the chains go on unchanged). A panel walk
         * down all K rows would read one to four cache lines per row of w, rows N floats
         * apart, and wait on memory: 2x slower at one row of the 10M model on AVX2. */
        const int n_blocks = (N + STREAM_NB - 1) / STREAM_NB;
#pragma omp parallel for schedule(static) if (par && n_blocks > 1)
        for (int blk = 0; blk < n_blocks; blk++) {
            int j0 = blk * STREAM_NB, ncb = N - j0 < STREAM_NB ? N - j0 : STREAM_NB;
            for (int k0 = 0; k0 < K; k0 += KB) {
                int kb = K - k0 < KB ? K - k0 : KB, last = k0 + kb == K;
                for (int p = 0; p < ncb; p += nr)
                    panel(R, kb, inp + k0, (size_t)K, w + (size_t)k0 * ldw + j0 + p, ldw,
                          out + j0 + p, (size_t)N, last && bias ? bias + j0 + p : NULL,
                          ncb - p < nr ? ncb - p : nr, k0 > 0);
            }
        }
        return;
    }
    if (!panel) {
        /* The scalar code: blocks of PACK_NB columns and MC rows, w in place. */
        const int n_blocks = (N + PACK_NB - 1) / PACK_NB, n_chunks = (R + MC - 1) / MC;
        const long items = (long)n_blocks * n_chunks;
#pragma omp parallel for schedule(static) if (par && items > 1)
        for (long it = 0; it < items; it++) {
            int r0 = (int)(it / n_blocks) * MC, j0 = (int)(it % n_blocks) * PACK_NB;
            int nrow = R - r0 < MC ? R - r0 : MC, nc = N - j0 < PACK_NB ? N - j0 : PACK_NB;
            scalar_panel(nrow, K, inp + (size_t)r0 * K, (size_t)K, w + j0, ldw,
                         out + (size_t)r0 * N + j0, (size_t)N, bias ? bias + j0 : NULL, nc, 0);
        }
        return;
    }
    /* Register tiles: blocks of PACK_NB columns, copied to a contiguous per-thread buffer
     * once per row chunk and read by every tile of the chunk (BLIS's packing of B). In place,
     * a panel's rows lie N floats apart, which for large power-of-two N maps them onto a few
     * cache sets and evicts them between tiles. */
    const int n_blocks = (N + PACK_NB - 1) / PACK_NB, n_chunks = (R + MC - 1) / MC;
    const long items = (long)n_blocks * n_chunks;
#pragma omp parallel if (par && items > 1)
    {
        float *buf = aligned_alloc(64, tlm__round_up((size_t)K * PACK_NB * sizeof(float), 64));
        /* Chunk-major order: a thread's consecutive items share a chunk of inp. */
#pragma omp for schedule(static)
        for (long it = 0; it < items; it++) {
            int r0 = (int)(it / n_blocks) * MC, j0 = (int)(it % n_blocks) * PACK_NB;
            int nrow = R - r0 < MC ? R - r0 : MC, ncb = N - j0 < PACK_NB ? N - j0 : PACK_NB;
            const float *b = w + j0;
            size_t ldb = ldw;
            if (buf) { /* without a buffer (out of memory), the same bits from w in place */
                pack_block(buf, w + j0, ldw, K, ncb);
                b = buf;
                ldb = PACK_NB;
            }
            for (int p = 0; p < ncb; p += nr)
                panel(nrow, K, inp + (size_t)r0 * K, (size_t)K, b + p, ldb,
                      out + (size_t)r0 * N + j0 + p, (size_t)N, bias ? bias + j0 + p : NULL,
                      ncb - p < nr ? ncb - p : nr, 0);
        }
        free(buf);
    }
}

void tlm_transpose(float *dst, const float *src, int rows, int cols)
{
    enum { B = 32 };
    for (int i0 = 0; i0 < rows; i0 += B)
        for (int j0 = 0; j0 < cols; j0 += B) {
            int i1 = i0 + B < rows ? i0 + B : rows, j1 = j0 + B < cols ? j0 + B : cols;
            for (int j = j0; j < j1; j++)
                for (int i = i0; i < i1; i++)
                    dst[(size_t)j * rows + i] = src[(size_t)i * cols + j];
        }
}
