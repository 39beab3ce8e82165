/* Tests for compiler/tlm/gemm.c: every product path (scalar, AVX2, AVX-512, whichever this
 * CPU runs) against a double-precision reference (tolerance) and bitwise against the
 * contract's definition, one fmaf chain per element written out here; rows bitwise
 * independent of the batch and of their position in it; 1, 2 and 3 OpenMP threads bitwise
 * equal; ISA selection (API and TLM_GEMM_ISA, which relies on Criterion running each test in
 * its own process); the transpose used for the lm head. */
#include <criterion/criterion.h>

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tlm/internal.h"

static uint64_t rng = 0x9E3779B97F4A7C15ULL;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static float *rand_buf(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(2 * urand() - 1);
    return p;
}

/* The contract's definition: acc = fma(inp[r][k], w[k][n], acc) for k = 0 .. K-1 from +0,
 * then + bias[n] once. */
static void chain_ref(float *out, const float *inp, const float *w, size_t ldw, const float *b,
                      int R, int K, int N)
{
    for (int r = 0; r < R; r++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc = fmaf(inp[(size_t)r * K + k], w[(size_t)k * ldw + n], acc);
            out[(size_t)r * N + n] = b ? acc + b[n] : acc;
        }
}

static const tlm_gemm_isa_t ISAS[] = {TLM_GEMM_SCALAR, TLM_GEMM_AVX2, TLM_GEMM_AVX512};

static void use_isa(tlm_gemm_isa_t isa)
{
    if (!tlm_gemm_isa_supported(isa))
        cr_skip_test("this CPU cannot run the %s path", tlm_gemm_isa_name(isa));
    cr_assert_eq(tlm_gemm_set_isa(isa), 0);
    cr_assert_eq(tlm_gemm_get_isa(), isa);
}

typedef struct shape {
    int R, K, N;
} shape;

/* Odd sizes on purpose: remainders of every vector width (8, 16), panel and block width (16,
 * 64, 1024), row tile (6), row chunk (96) and k block (16), K from 1, the vocabulary of the
 * tensor language; up to 6 rows take the decode driver, more the packing one. */
static const shape FIXED[] = {
    {1, 1, 1},     {1, 7, 9},      {2, 16, 16},   {3, 33, 17},    {5, 64, 15},    {6, 128, 64},
    {7, 100, 65},  {13, 1, 33},    {12, 5, 8},    {19, 300, 1},   {70, 600, 7},   {70, 63, 129},
    {64, 256, 63}, {33, 512, 100}, {97, 40, 70},  {200, 16, 130}, {1, 128, 4273}, {17, 64, 4273},
    {4, 600, 16},  {11, 256, 768}, {5, 40, 2100}, {6, 33, 1025},
};
static const int NS[] = {1, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 127, 200};

/* One shape under the current path: against double (tolerance) and the chain (bitwise),
 * with and without bias, and with w's rows wider apart than N. */
static void check_shape(int R, int K, int N, size_t ldw)
{
    float *a = rand_buf((size_t)R * K), *w = rand_buf((size_t)K * ldw), *b = rand_buf((size_t)N);
    float *got = malloc(sizeof(float) * R * N), *want = malloc(sizeof(float) * R * N);
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        const float *bias = with_bias ? b : NULL;
        memset(got, 0xff, sizeof(float) * R * N); /* NaN: every element must be written */
        tlm_gemm(got, a, w, ldw, bias, R, K, N, (size_t)1 << 62);
        chain_ref(want, a, w, ldw, bias, R, K, N);
        cr_assert_eq(memcmp(got, want, sizeof(float) * R * N), 0,
                     "%s path, R=%d K=%d N=%d ldw=%zu bias=%d: not the fma chain's bits",
                     tlm_gemm_isa_name(tlm_gemm_get_isa()), R, K, N, ldw, with_bias);
        for (int r = 0; r < R; r++)
            for (int n = 0; n < N; n++) {
                double s = bias ? bias[n] : 0.0, mag = fabs(s);
                for (int k = 0; k < K; k++) {
                    double p = (double)a[(size_t)r * K + k] * w[(size_t)k * ldw + n];
                    s += p;
                    mag += fabs(p);
                }
                /* K + 1 roundings of at most 2^-24 relative to the running magnitude */
                double tol = (K + 2) * ldexp(1.0, -24) * mag + 1e-30;
                float g = got[(size_t)r * N + n];
                cr_assert(fabs(g - s) <= tol, "R=%d K=%d N=%d at (%d, %d): %.9g vs %.9g (tol %g)",
                          R, K, N, r, n, g, s, tol);
            }
    }
    free(a);
    free(w);
    free(b);
    free(got);
    free(want);
}

static void check_all_shapes(void)
{
    for (size_t i = 0; i < sizeof FIXED / sizeof FIXED[0]; i++)
        check_shape(FIXED[i].R, FIXED[i].K, FIXED[i].N, (size_t)FIXED[i].N);
    check_shape(9, 40, 33, 50); /* ldw > N */
    check_shape(7, 17, 64, 64 + 13);
    for (int i = 0; i < 12; i++) {
        int R = 1 + (int)(urand() * 70), K = 1 + (int)(urand() * 600);
        int N = NS[(int)(urand() * (sizeof NS / sizeof NS[0]))];
        check_shape(R, K, N, (size_t)N);
    }
}

Test(gemm, scalar_path_is_the_fma_chain)
{
    use_isa(TLM_GEMM_SCALAR);
    check_all_shapes();
}

Test(gemm, avx2_path_is_the_fma_chain)
{
    use_isa(TLM_GEMM_AVX2);
    check_all_shapes();
}

Test(gemm, avx512_path_is_the_fma_chain)
{
    use_isa(TLM_GEMM_AVX512);
    check_all_shapes();
}

/* The bitwise checks have teeth: on this data a product computed without fusing (or in
 * another order) differs from the chain in many elements. */
Test(gemm, data_tells_fused_from_unfused)
{
    enum { K = 256, N = 64 };
    float *a = rand_buf(K), *w = rand_buf((size_t)K * N), chain[N];
    chain_ref(chain, a, w, N, NULL, 1, K, N);
    int differ = 0;
    for (int n = 0; n < N; n++) {
        volatile float acc = 0.0f; /* volatile: one rounding per product and per add */
        for (int k = 0; k < K; k++) {
            volatile float p = a[k] * w[(size_t)k * N + n];
            acc = acc + p;
        }
        differ += acc != chain[n];
    }
    cr_assert_gt(differ, N / 4, "only %d of %d elements differ", differ, N);
    free(a);
    free(w);
}

/* A row gives the same bits alone and in a batch, at every position of the batch (every
 * place in a register tile, in either row chunk), whatever the other rows hold. */
static void check_row_independence(int R, int K, int N)
{
    float *x = rand_buf(K), *w = rand_buf((size_t)K * N), *b = rand_buf(N);
    float *batch = rand_buf((size_t)R * K);
    float *alone = malloc(sizeof(float) * N), *out = malloc(sizeof(float) * R * N);
    tlm_gemm(alone, x, w, (size_t)N, b, 1, K, N, (size_t)1 << 62);
    for (int p = 0; p < R; p++) {
        float *saved = rand_buf(K);
        memcpy(saved, batch + (size_t)p * K, sizeof(float) * K);
        memcpy(batch + (size_t)p * K, x, sizeof(float) * K);
        tlm_gemm(out, batch, w, (size_t)N, b, R, K, N, (size_t)1 << 62);
        cr_assert_eq(memcmp(out + (size_t)p * N, alone, sizeof(float) * N), 0,
                     "%s path: row at position %d of %d differs from the row alone",
                     tlm_gemm_isa_name(tlm_gemm_get_isa()), p, R);
        memcpy(batch + (size_t)p * K, saved, sizeof(float) * K);
        free(saved);
    }
    free(x);
    free(w);
    free(b);
    free(batch);
    free(alone);
    free(out);
}

static void check_rows_all(void)
{
    check_row_independence(14, 96, 200); /* tiles 6, 6, 2; masked last panel */
    check_row_independence(100, 33, 65); /* two row chunks (96 + 4) */
}

Test(gemm, scalar_rows_independent)
{
    use_isa(TLM_GEMM_SCALAR);
    check_rows_all();
}

Test(gemm, avx2_rows_independent)
{
    use_isa(TLM_GEMM_AVX2);
    check_rows_all();
}

Test(gemm, avx512_rows_independent)
{
    use_isa(TLM_GEMM_AVX512);
    check_rows_all();
}

/* Threads split column blocks and row chunks; the bits stay. Every path the CPU runs, both
 * drivers (3 rows: decode, 150: packing). */
Test(gemm, thread_count_does_not_change_bits)
{
    const shape shapes[] = {{150, 200, 700}, {3, 100, 2500}};
    int tested = 0;
    for (size_t s = 0; s < 2; s++) {
        const int R = shapes[s].R, K = shapes[s].K, N = shapes[s].N;
        float *a = rand_buf((size_t)R * K), *w = rand_buf((size_t)K * N), *b = rand_buf(N);
        float *one = malloc(sizeof(float) * R * N), *many = malloc(sizeof(float) * R * N);
        for (size_t i = 0; i < sizeof ISAS / sizeof ISAS[0]; i++) {
            if (!tlm_gemm_isa_supported(ISAS[i])) continue;
            cr_assert_eq(tlm_gemm_set_isa(ISAS[i]), 0);
            omp_set_num_threads(1);
            tlm_gemm(one, a, w, N, b, R, K, N, 0);
            for (int t = 2; t <= 3; t++) {
                omp_set_num_threads(t);
                cr_assert_eq(omp_get_max_threads(), t);
                memset(many, 0, sizeof(float) * R * N);
                tlm_gemm(many, a, w, N, b, R, K, N, 0);
                cr_assert_eq(memcmp(one, many, sizeof(float) * R * N), 0,
                             "%s path, R=%d: %d threads differ", tlm_gemm_isa_name(ISAS[i]), R, t);
            }
            tested++;
        }
        free(a);
        free(w);
        free(b);
        free(one);
        free(many);
    }
    cr_assert_geq(tested, 2);
}

Test(gemm, isa_selection)
{
    unsetenv("TLM_GEMM_ISA"); /* before first use: auto must pick the best */
    cr_assert(tlm_gemm_isa_supported(TLM_GEMM_SCALAR));
    cr_assert(tlm_gemm_isa_supported(TLM_GEMM_AUTO));
    tlm_gemm_isa_t best = tlm_gemm_get_isa();
    cr_assert_neq(best, TLM_GEMM_AUTO);
    cr_assert(tlm_gemm_isa_supported(best));
    for (size_t i = 0; i < sizeof ISAS / sizeof ISAS[0]; i++)
        if (tlm_gemm_isa_supported(ISAS[i])) cr_assert_geq(best, ISAS[i], "auto is not the best");
    cr_assert_eq(tlm_gemm_set_isa(TLM_GEMM_SCALAR), 0);
    cr_assert_eq(tlm_gemm_get_isa(), TLM_GEMM_SCALAR);
    cr_assert_eq(tlm_gemm_set_isa(TLM_GEMM_AUTO), 0);
    cr_assert_eq(tlm_gemm_get_isa(), best);
    cr_assert_eq(tlm_gemm_set_isa((tlm_gemm_isa_t)42), TLM_EINVAL);
    cr_assert_eq(tlm_gemm_get_isa(), best);
    if (!tlm_gemm_isa_supported(TLM_GEMM_AVX512)) {
        cr_assert_eq(tlm_gemm_set_isa(TLM_GEMM_AVX512), TLM_EUNSUPPORTED);
        cr_assert_eq(tlm_gemm_get_isa(), best);
    }
    cr_assert_str_eq(tlm_gemm_isa_name(TLM_GEMM_AVX2), "avx2");
}

/* TLM_GEMM_ISA is read once, at first use (this test's process has not used gemm yet). */
Test(gemm, environment_forces_a_path)
{
    setenv("TLM_GEMM_ISA", "scalar", 1);
    cr_assert_eq(tlm_gemm_get_isa(), TLM_GEMM_SCALAR);
    cr_assert_eq(tlm_gemm_set_isa(TLM_GEMM_AUTO), 0); /* the API still chooses freely */
    cr_assert(tlm_gemm_isa_supported(tlm_gemm_get_isa()));
}

Test(gemm, environment_unknown_name_is_ignored)
{
    setenv("TLM_GEMM_ISA", "sse9", 1);
    tlm_gemm_isa_t got = tlm_gemm_get_isa();
    cr_assert_eq(tlm_gemm_set_isa(TLM_GEMM_AUTO), 0);
    cr_assert_eq(got, tlm_gemm_get_isa(), "an unknown name must leave the best path");
}

Test(gemm, transpose)
{
    int shapes[][2] = {{1, 1}, {1, 40}, {40, 1}, {33, 65}, {97, 64}, {300, 17}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int rows = shapes[s][0], cols = shapes[s][1];
        float *src = rand_buf((size_t)rows * cols), *dst = rand_buf((size_t)rows * cols);
        tlm_transpose(dst, src, rows, cols);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++)
                cr_assert_eq(dst[(size_t)j * rows + i], src[(size_t)i * cols + j], "%dx%d at %d,%d",
                             rows, cols, i, j);
        free(src);
        free(dst);
    }
}
