/* internal.h — helpers shared by forward.c (CPU) and cuda.c (GPU); not part of the API.
 *
 * The CPU matrix product (gemm.c). Contract:
 *  - tlm_gemm computes out (R, N) = inp (R, K) @ w (K, N) (+ bias (N)). Every output element
 *    is ONE sequential chain of fused multiply-adds over k = 0 .. K-1, starting from +0:
 *        acc = fma(inp[r][k], w[k][n], acc);   out[r][n] = acc (+ bias[n], one rounding)
 *    with nothing reassociated. Its bits therefore depend only on row r of inp, column n of w
 *    and bias[n]: not on R, not on where the row sits in a register tile, not on N or the
 *    column panel, not on which thread ran it, and not on the instruction set. The AVX-512
 *    path (16 lanes), the AVX2 path (8 lanes) and the portable scalar path (fmaf, which is
 *    the exactly rounded fma) give the same bits; tests/compiler/tlm/test_gemm.c checks it.
 *  - Which path runs is process-wide configuration: the best one the CPU supports
 *    (__builtin_cpu_supports), unless the environment variable TLM_GEMM_ISA (scalar | avx2 |
 *    avx512, read once at first use; a name the CPU cannot run is ignored) or
 *    tlm_gemm_set_isa chose another. Switching changes speed, never results.
 *  - Work (R * K * N multiply-adds) below par_min stays on the calling thread; above, OpenMP
 *    threads share column blocks and row chunks (forward.c scales its par_min, see PAR_MIN).
 *  - Any thread may call these functions; tlm_gemm_set_isa affects calls that start after it.
 */
#ifndef TLM_TLM_INTERNAL_H
#define TLM_TLM_INTERNAL_H

#include <stddef.h>

#include "compiler/tlm/tlm.h"

size_t tlm__round_up(size_t n, size_t k);
/* Validates a batch before anything changes: model, caches of this model with room for the
 * new tokens, tokens in range, no cache twice. R: rows (new tokens), Rl: logit rows, T (may be
 * NULL): the longest sequence after the call. */
int tlm__check_batch(const tlm_model *m, const tlm_seq *seqs, int n_seqs, size_t *R, size_t *Rl,
                     int *T, tlm_error *err);

/* ---- gemm.c ---- */

typedef enum {
    TLM_GEMM_AUTO = 0, /* the best the CPU supports */
    TLM_GEMM_SCALAR,   /* portable C, fmaf */
    TLM_GEMM_AVX2,     /* AVX2 + FMA, 8 lanes */
    TLM_GEMM_AVX512,   /* AVX-512F, 16 lanes */
} tlm_gemm_isa_t;

/* 1 if this CPU (and OS) can run the path; AUTO and SCALAR always can. */
int tlm_gemm_isa_supported(tlm_gemm_isa_t isa);
/* Selects the path for later calls; AUTO returns to the best. TLM_EUNSUPPORTED (nothing
 * changed) when the CPU cannot run it, TLM_EINVAL for an unknown value. */
int tlm_gemm_set_isa(tlm_gemm_isa_t isa);
/* The path calls use now (never AUTO). */
tlm_gemm_isa_t tlm_gemm_get_isa(void);
/* "scalar", "avx2", "avx512" or "auto". */
const char *tlm_gemm_isa_name(tlm_gemm_isa_t isa);

/* out (R, N) = inp (R, K) @ w (K, N) + bias (N); bias may be NULL. w's rows are ldw >= N
 * floats apart; inp and out are dense. R, K, N >= 1 (R == 0 does nothing). out must not
 * overlap inp, w or bias. */
void tlm_gemm(float *out, const float *inp, const float *w, size_t ldw, const float *bias, int R,
              int K, int N, size_t par_min);

/* dst (cols, rows) = src (rows, cols) transposed; used once per model for the tied lm head,
 * whose weights wte are stored (V, C) while tlm_gemm wants (C, V). */
void tlm_transpose(float *dst, const float *src, int rows, int cols);

#endif
