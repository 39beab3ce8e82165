/* cuda_mma.c — CUDA C for the GPU_MMA sketch: float16/bfloat16 contractions on tensor cores.
 *
 * The anchor seen as a GEMM (space_mma_analyze): out[batch][m][n] = sum_k A(m,k) * B(k,n),
 * where m, n and k are flat indices over the anchor's M, N and K axes (k ordered so that the
 * operand's contiguous axis is innermost) and A(m,k), B(k,n) are the IR's loads (a conv's
 * padding select included), so dense, batch_matmul with any transposes and conv2d in NCHW or
 * NHWC are the same kernel with different address arithmetic (an implicit GEMM).
 *
 * Block (blockIdx.x: BM rows of m, blockIdx.y: BN columns of n, blockIdx.z: the batch):
 *   WARPS_M x WARPS_N warps, each owning a WARP_M x WARP_N tile of FM x FN m16n8k16
 *   fragments with fp32 accumulators in registers (acc[FM][FN][4], the PTX C-fragment layout:
 *   acc[..][..][h*2+e] is row lane/4 + 8h, column 2*(lane%4) + e of the fragment).
 *   Operand tiles live in shared memory in PIPELINE stages of BLOCK_K; each tile is stored
 *   with its contiguous global dimension along the shared row ("K-major": rows of m or n,
 *   BLOCK_K long; "MN-major": rows of k), in 16-byte chunks, optionally XOR-swizzled
 *   (chunk ^ (row / P) % C) so that ldmatrix's 8 row reads of one 8x8 matrix hit 8 different
 *   bank groups. A K-major tile is read by ldmatrix, an MN-major one by ldmatrix.trans: both
 *   yield exactly the A (row) and B (col) fragments mma.sync.m16n8k16 expects.
 *   Global -> shared: cp.async.cg 16-byte copies (zero-filled outside the operand: bounds and
 *   padding) when 8 consecutive elements along the contiguous dimension are 8 consecutive,
 *   16-byte aligned addresses under one padding decision; scalar loads and stores otherwise.
 *   Pipeline (PIPELINE = S >= 2): S-1 stages are in flight; iteration kt waits for stage kt
 *   (cp.async.wait_group S-2), syncs, issues the copy of chunk kt+S-1 into the stage freed by
 *   iteration kt-1, and computes on stage kt. S = 1: copy, wait, sync, compute, sync.
 * Epilogue: each accumulator goes through the epilogue chain in fp32 and is rounded once,
 * at the store.
 *
 * Kernel ABI: every tensor (inputs and output) is the workload's 16-bit dtype, passed as raw
 * storage (`unsigned short`: IEEE binary16 or bfloat16 bits, the same bytes as __half and
 * __nv_bfloat16), row-major.
 *
 * The warp-level primitives (mma.sync, ldmatrix, cp.async) are small inline-PTX functions;
 * with TLM_EMULATE defined (the host emulator of tests/compiler/codegen/test_cuda.c) the
 * source expects the emulator's implementations of the same fragment semantics instead.
 */
#include "compiler/codegen/codegen.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_LEN 40

typedef struct {
    int load;       /* the load node */
    int op;         /* the operand node (the load, or its padding select) */
    bool k_major;   /* shared rows run along k */
    bool vec;       /* cp.async 16-byte chunks */
    int rows, rowlen; /* of one stage's tile in elements */
    const char *name, *smem;
    bool is_a;
} mma_operand;

typedef struct {
    const space *sp;
    const ir_subgraph *g;
    const ir_stage *a;
    const space_mma_info *mi;
    int64_t wm, wn, wpm, wpn, bk, stages;
    bool swizzle;
    int64_t bm, bn, nt, fm, fn;
    mma_operand A, B;
    char axv[IR_MAX_AXES][NAME_LEN]; /* axis variable names */
    const char *axp[IR_MAX_AXES];
    bool bf16;
} mma_gen;

static int64_t flat_coef(const mma_gen *mg, int load, int x)
{
    const ir_expr *ld = &mg->a->expr[load];
    const ir_tensor *t = &mg->g->tensor[ld->tensor];
    int64_t st = 1, c = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        c += ld->idx[d].coef[x] * st;
        st *= t->shape[d];
    }
    return c;
}

static int64_t flat_off(const mma_gen *mg, int load)
{
    const ir_expr *ld = &mg->a->expr[load];
    const ir_tensor *t = &mg->g->tensor[ld->tensor];
    int64_t st = 1, c = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        c += ld->idx[d].off * st;
        st *= t->shape[d];
    }
    return c;
}

/* Whether 8 consecutive values of axis x (from a multiple of 8) are 8 consecutive, 16-byte
 * aligned elements of the operand under one padding decision. */
static bool chunk_ok(const mma_gen *mg, const mma_operand *o, int x)
{
    const ir_stage *a = mg->a;
    if (flat_coef(mg, o->load, x) != 1 || a->extent[x] % 8 != 0) return false;
    if (flat_off(mg, o->load) % 8 != 0) return false;
    for (int y = 0; y < a->n_spatial + a->n_reduce; y++)
        if (y != x && flat_coef(mg, o->load, y) % 8 != 0) return false;
    const ir_expr *e = &a->expr[o->op];
    if (e->kind == IR_E_SELECT)
        for (int c = 0; c < e->ncond; c++)
            if (e->cond[c].coef[x] != 0) return false;
    return true;
}

static void plan_operand(mma_gen *mg, mma_operand *o, bool is_a)
{
    const space_mma_info *mi = mg->mi;
    o->is_a = is_a;
    o->load = is_a ? mi->a_load : mi->b_load;
    o->op = is_a ? mi->a_op : mi->b_op;
    o->name = mg->g->tensor[mg->a->expr[o->load].tensor].name;
    o->smem = is_a ? "sa" : "sb";
    int xk = mi->k_axis[mi->n_k - 1];
    int xmn = is_a ? mi->m_axis[mi->n_m - 1] : mi->n_axis[mi->n_n - 1];
    int64_t mn_tile = is_a ? mg->bm : mg->bn;
    if (chunk_ok(mg, o, xk)) {
        o->k_major = true, o->vec = true;
    } else if (mn_tile % 8 == 0 && chunk_ok(mg, o, xmn)) {
        o->k_major = false, o->vec = true;
    } else {
        o->vec = false;
        o->k_major = !(flat_coef(mg, o->load, xmn) == 1 && flat_coef(mg, o->load, xk) != 1);
    }
    o->rows = (int)(o->k_major ? mn_tile : mg->bk);
    o->rowlen = (int)(o->k_major ? mg->bk : mn_tile);
}

/* The physical chunk of (row, chunk) of an operand tile as a C expression. */
static void swz_expr(const mma_gen *mg, const mma_operand *o, const char *row, const char *ch,
                     char *out, size_t cap)
{
    int cpr = o->rowlen / 8;
    if (!mg->swizzle || cpr < 2) {
        snprintf(out, cap, "(%s)", ch);
        return;
    }
    int p = cpr >= 8 ? 1 : 8 / cpr, cm = cpr < 8 ? cpr : 8;
    if (p == 1) snprintf(out, cap, "((%s) ^ ((%s) & %d))", ch, row, cm - 1);
    else snprintf(out, cap, "((%s) ^ (((%s) / %d) & %d))", ch, row, p, cm - 1);
}

/* const int ax_x = ...; for the axes of `list` from the flat index `flat`. */
static void emit_unflatten(const mma_gen *mg, cg_buf *b, int ind, const int *list, int n,
                           const char *flat)
{
    int64_t inner = 1;
    for (int i = n - 1; i >= 0; i--) {
        int x = list[i];
        int64_t e = mg->a->extent[x];
        char div[64];
        if (inner == 1) snprintf(div, sizeof div, "%s", flat);
        else snprintf(div, sizeof div, "%s / %lld", flat, (long long)inner);
        if (i == 0) cg_line(b, ind, "const int %s = %s;", mg->axv[x], div);
        else if (e == 1) cg_line(b, ind, "const int %s = 0;", mg->axv[x]);
        else if (inner == 1) cg_line(b, ind, "const int %s = %s %% %lld;", mg->axv[x], flat, (long long)e);
        else cg_line(b, ind, "const int %s = (%s) %% %lld;", mg->axv[x], div, (long long)e);
        inner *= e;
    }
}

static void emit_names(const mma_gen *mg, cg_names *nm)
{
    memset(nm, 0, sizeof *nm);
    for (int x = 0; x < mg->a->n_spatial + mg->a->n_reduce; x++) nm->axis[x] = mg->axp[x];
    for (int t = 0; t < mg->g->n_tensor; t++) nm->tensor[t] = mg->g->tensor[t].name;
    nm->subst_tensor = -1;
    nm->cuda = true;
}

/* "ok" condition and source offset of the operand at the current axis variables. */
static void emit_operand_point(const mma_gen *mg, cg_buf *b, int ind, const mma_operand *o,
                               const char *bound)
{
    cg_names nm;
    emit_names(mg, &nm);
    const ir_expr *e = &mg->a->expr[o->op];
    for (int i = 0; i < ind; i++) cg_printf(b, "    ");
    cg_printf(b, "const bool ok = %s", bound);
    if (e->kind == IR_E_SELECT)
        for (int c = 0; c < e->ncond; c++) {
            cg_printf(b, " && (unsigned)");
            cg_emit_affine(b, mg->a, &e->cond[c], &nm);
            cg_printf(b, " < %lluu", (unsigned long long)e->cond_hi[c]);
        }
    cg_printf(b, ";\n");
    for (int i = 0; i < ind; i++) cg_printf(b, "    ");
    cg_printf(b, "const int off = ok ? ");
    cg_emit_offset(b, mg->g, mg->a, &mg->a->expr[o->load], &nm);
    cg_printf(b, " : 0;\n");
}

/* The copy of one operand's tile for K chunk `kt` into stage `stage` (inside the lambda). */
static void emit_tile_copy(const mma_gen *mg, cg_buf *b, const mma_operand *o)
{
    const space_mma_info *mi = mg->mi;
    int cpr = o->rowlen / 8;
    int64_t chunks = (int64_t)o->rows * cpr;
    int64_t iters = (chunks + mg->nt - 1) / mg->nt;
    int64_t mn_ext = o->is_a ? mi->M : mi->N;
    const char *mn0 = o->is_a ? "m0" : "n0";
    char sw[160];
    cg_line(b, 2, "/* %s: %d x %d (%s-major), %s */", o->name, o->rows, o->rowlen,
            o->k_major ? "K" : (o->is_a ? "M" : "N"),
            o->vec ? "cp.async 16-byte chunks" : "scalar copies");
    cg_line(b, 2, "#pragma unroll");
    cg_line(b, 2, "for (int it = 0; it < %lld; it++) {", (long long)iters);
    cg_line(b, 3, "const int c = tid + it * %lld;", (long long)mg->nt);
    if (iters * mg->nt != chunks) cg_line(b, 3, "if (c >= %lld) break;", (long long)chunks);
    cg_line(b, 3, "const int row = c / %d, ch = c %% %d;", cpr, cpr);
    swz_expr(mg, o, "row", "ch", sw, sizeof sw);
    cg_line(b, 3, "tlm_h16 *dst = %s + stage * %d + row * %d + %s * 8;", o->smem,
            o->rows * o->rowlen, o->rowlen, sw);
    const int *mn_list = o->is_a ? mi->m_axis : mi->n_axis;
    int n_mn = o->is_a ? mi->n_m : mi->n_n;
    if (o->vec) {
        if (o->k_major) {
            cg_line(b, 3, "const int gmn = %s + row, gk = kt * %lld + ch * 8;", mn0, (long long)mg->bk);
        } else {
            cg_line(b, 3, "const int gk = kt * %lld + row, gmn = %s + ch * 8;", (long long)mg->bk, mn0);
        }
        emit_unflatten(mg, b, 3, mn_list, n_mn, "gmn");
        emit_unflatten(mg, b, 3, mi->k_axis, mi->n_k, "gk");
        char bound[128];
        snprintf(bound, sizeof bound, "gmn < %lld && gk < %lld", (long long)mn_ext, (long long)mi->K);
        emit_operand_point(mg, b, 3, o, bound);
        cg_line(b, 3, "tlm_cp_async16(dst, %s + off, ok);", o->name);
    } else {
        cg_line(b, 3, "#pragma unroll");
        cg_line(b, 3, "for (int e = 0; e < 8; e++) {");
        if (o->k_major)
            cg_line(b, 4, "const int gmn = %s + row, gk = kt * %lld + ch * 8 + e;", mn0, (long long)mg->bk);
        else
            cg_line(b, 4, "const int gk = kt * %lld + row, gmn = %s + ch * 8 + e;", (long long)mg->bk, mn0);
        emit_unflatten(mg, b, 4, mn_list, n_mn, "gmn");
        emit_unflatten(mg, b, 4, mi->k_axis, mi->n_k, "gk");
        char bound[128];
        snprintf(bound, sizeof bound, "gmn < %lld && gk < %lld", (long long)mn_ext, (long long)mi->K);
        emit_operand_point(mg, b, 4, o, bound);
        cg_line(b, 4, "dst[e] = ok ? %s[off] : (tlm_h16)0;", o->name);
        cg_line(b, 3, "}");
    }
    cg_line(b, 2, "}");
}

static void emit_primitives(cg_buf *b, bool bf16)
{
    const char *t = bf16 ? "bfloat16" : "float16";
    cg_line(b, 0, "typedef unsigned short tlm_h16; /* %s bits */", t);
    cg_line(b, 0, "#ifdef TLM_EMULATE /* host emulation (tests): the emulator implements these */");
    cg_line(b, 0, "static inline float tlm_h2f(tlm_h16 h) { return emu_%s_to_f32(h); }",
            bf16 ? "bf16" : "f16");
    cg_line(b, 0, "static inline tlm_h16 tlm_f2h(float f) { return emu_f32_to_%s(f); }",
            bf16 ? "bf16" : "f16");
    cg_line(b, 0, "static inline void tlm_mma_16816(float *d, const unsigned *a, const unsigned *b)");
    cg_line(b, 0, "{ emu_mma_16816(d, a, b, %d); }", bf16 ? 1 : 0);
    cg_line(b, 0, "#else");
    if (bf16) {
        cg_line(b, 0, "__device__ __forceinline__ float tlm_h2f(tlm_h16 h)");
        cg_line(b, 0, "{ return __uint_as_float((unsigned)h << 16); }");
        cg_line(b, 0, "/* round to nearest even; NaN stays NaN */");
        cg_line(b, 0, "__device__ __forceinline__ tlm_h16 tlm_f2h(float f)");
        cg_line(b, 0, "{");
        cg_line(b, 1, "unsigned short h;");
        cg_line(b, 1, "asm(\"cvt.rn.bf16.f32 %%0, %%1;\" : \"=h\"(h) : \"f\"(f));");
        cg_line(b, 1, "return h;");
        cg_line(b, 0, "}");
    } else {
        cg_line(b, 0, "__device__ __forceinline__ float tlm_h2f(tlm_h16 h)");
        cg_line(b, 0, "{");
        cg_line(b, 1, "float f;");
        cg_line(b, 1, "asm(\"cvt.f32.f16 %%0, %%1;\" : \"=f\"(f) : \"h\"(h));");
        cg_line(b, 1, "return f;");
        cg_line(b, 0, "}");
        cg_line(b, 0, "__device__ __forceinline__ tlm_h16 tlm_f2h(float f)");
        cg_line(b, 0, "{");
        cg_line(b, 1, "unsigned short h;");
        cg_line(b, 1, "asm(\"cvt.rn.f16.f32 %%0, %%1;\" : \"=h\"(h) : \"f\"(f));");
        cg_line(b, 1, "return h;");
        cg_line(b, 0, "}");
    }
    cg_line(b, 0, "/* D += A * B: A 16x16 (row), B 16x8 (col), D 16x8 fp32, one warp */");
    cg_line(b, 0, "__device__ __forceinline__ void tlm_mma_16816(float *d, const unsigned *a, const unsigned *b)");
    cg_line(b, 0, "{");
    cg_line(b, 1, "asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.%s.%s.f32 \"", bf16 ? "bf16" : "f16",
            bf16 ? "bf16" : "f16");
    cg_line(b, 1, "             \"{%%0,%%1,%%2,%%3}, {%%4,%%5,%%6,%%7}, {%%8,%%9}, {%%0,%%1,%%2,%%3};\"");
    cg_line(b, 1, "             : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3])");
    cg_line(b, 1, "             : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));");
    cg_line(b, 0, "}");
    static const struct {
        const char *name, *ptx;
        int n;
    } ldm[] = {{"tlm_ldmatrix_x4", "x4", 4},
               {"tlm_ldmatrix_x4_trans", "x4.trans", 4},
               {"tlm_ldmatrix_x2", "x2", 2},
               {"tlm_ldmatrix_x2_trans", "x2.trans", 2}};
    for (size_t i = 0; i < sizeof ldm / sizeof ldm[0]; i++) {
        cg_line(b, 0, "__device__ __forceinline__ void %s(unsigned *r, const void *p)", ldm[i].name);
        cg_line(b, 0, "{");
        cg_line(b, 1, "const unsigned s = (unsigned)__cvta_generic_to_shared(p);");
        if (ldm[i].n == 4)
            cg_line(b, 1,
                    "asm volatile(\"ldmatrix.sync.aligned.m8n8.%s.shared.b16 {%%0,%%1,%%2,%%3}, "
                    "[%%4];\" : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(s));",
                    ldm[i].ptx);
        else
            cg_line(b, 1,
                    "asm volatile(\"ldmatrix.sync.aligned.m8n8.%s.shared.b16 {%%0,%%1}, [%%2];\" "
                    ": \"=r\"(r[0]), \"=r\"(r[1]) : \"r\"(s));",
                    ldm[i].ptx);
        cg_line(b, 0, "}");
    }
    cg_line(b, 0, "/* 16 bytes global -> shared, asynchronously; zero-filled when !ok */");
    cg_line(b, 0, "__device__ __forceinline__ void tlm_cp_async16(void *dst, const void *src, bool ok)");
    cg_line(b, 0, "{");
    cg_line(b, 1, "const unsigned s = (unsigned)__cvta_generic_to_shared(dst);");
    cg_line(b, 1, "asm volatile(\"cp.async.cg.shared.global [%%0], [%%1], 16, %%2;\" :: \"r\"(s), "
                  "\"l\"(src), \"r\"(ok ? 16 : 0));");
    cg_line(b, 0, "}");
    cg_line(b, 0, "__device__ __forceinline__ void tlm_cp_async_commit(void)");
    cg_line(b, 0, "{ asm volatile(\"cp.async.commit_group;\"); }");
    cg_line(b, 0, "template <int N> __device__ __forceinline__ void tlm_cp_async_wait(void)");
    cg_line(b, 0, "{ asm volatile(\"cp.async.wait_group %%0;\" :: \"n\"(N)); }");
    cg_line(b, 0, "#endif");
}

typedef struct {
    const mma_gen *mg;
    const cg_names *nm;
} epi_ctx;

/* Epilogue loads (bias, residual) are 16-bit: widened to fp32. */
static bool epi_load_hook(const void *ctx, cg_buf *b, const ir_stage *s, int id)
{
    const epi_ctx *ec = ctx;
    const ir_expr *e = &s->expr[id];
    cg_printf(b, "tlm_h2f(%s[", ec->nm->tensor[e->tensor]);
    cg_emit_offset(b, ec->mg->g, s, e, ec->nm);
    cg_printf(b, "])");
    return true;
}

static void emit_compute(const mma_gen *mg, cg_buf *b)
{
    char sw[160];
    const mma_operand *A = &mg->A, *B = &mg->B;
    cg_line(b, 2, "const tlm_h16 *ta = sa + stage * %d, *tb = sb + stage * %d;",
            A->rows * A->rowlen, B->rows * B->rowlen);
    cg_line(b, 2, "#pragma unroll");
    cg_line(b, 2, "for (int kk = 0; kk < %lld; kk++) {", (long long)(mg->bk / 16));
    cg_line(b, 3, "unsigned af[%lld][4], bf[%lld][2];", (long long)mg->fm, (long long)mg->fn);
    /* A: matrix j = lane / 8 covers rows (j & 1) * 8, k (j >> 1) * 8 of the 16 x 16 fragment */
    cg_line(b, 3, "#pragma unroll");
    cg_line(b, 3, "for (int mi = 0; mi < %lld; mi++) {", (long long)mg->fm);
    cg_line(b, 4, "const int fr = wm * %lld + mi * 16; /* fragment row in the block tile */",
            (long long)mg->wm);
    if (A->k_major) {
        cg_line(b, 4, "const int row = fr + ((lane >> 3) & 1) * 8 + (lane & 7);");
        cg_line(b, 4, "const int ch = kk * 2 + (lane >> 4);");
    } else {
        cg_line(b, 4, "const int row = kk * 16 + (lane >> 4) * 8 + (lane & 7);");
        cg_line(b, 4, "const int ch = fr / 8 + ((lane >> 3) & 1);");
    }
    swz_expr(mg, A, "row", "ch", sw, sizeof sw);
    cg_line(b, 4, "tlm_ldmatrix_x4%s(af[mi], ta + row * %d + %s * 8);", A->k_major ? "" : "_trans",
            A->rowlen, sw);
    cg_line(b, 3, "}");
    /* B: per pair of n fragments one x4 (matrix j: k (j & 1) * 8, n (j >> 1) * 8), or x2 */
    bool pairs = mg->fn % 2 == 0;
    cg_line(b, 3, "#pragma unroll");
    cg_line(b, 3, "for (int ni = 0; ni < %lld; ni += %d) {", (long long)mg->fn, pairs ? 2 : 1);
    cg_line(b, 4, "const int fc = wn * %lld + ni * 8; /* fragment column in the block tile */",
            (long long)mg->wn);
    const char *nsel = pairs ? "(lane >> 4) * 8" : "0";
    if (B->k_major) {
        cg_line(b, 4, "const int row = fc + %s + (lane & 7);", nsel);
        cg_line(b, 4, "const int ch = kk * 2 + ((lane >> 3) & 1);");
    } else {
        cg_line(b, 4, "const int row = kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);");
        cg_line(b, 4, "const int ch = (fc + %s) / 8;", nsel);
    }
    swz_expr(mg, B, "row", "ch", sw, sizeof sw);
    if (pairs) {
        cg_line(b, 4, "unsigned r[4];");
        cg_line(b, 4, "tlm_ldmatrix_x4%s(r, tb + row * %d + %s * 8);", B->k_major ? "" : "_trans",
                B->rowlen, sw);
        cg_line(b, 4, "bf[ni][0] = r[0], bf[ni][1] = r[1], bf[ni + 1][0] = r[2], bf[ni + 1][1] = r[3];");
    } else {
        cg_line(b, 4, "tlm_ldmatrix_x2%s(bf[ni], tb + row * %d + %s * 8);", B->k_major ? "" : "_trans",
                B->rowlen, sw);
    }
    cg_line(b, 3, "}");
    cg_line(b, 3, "#pragma unroll");
    cg_line(b, 3, "for (int mi = 0; mi < %lld; mi++)", (long long)mg->fm);
    cg_line(b, 4, "#pragma unroll");
    cg_line(b, 4, "for (int ni = 0; ni < %lld; ni++) tlm_mma_16816(acc[mi][ni], af[mi], bf[ni]);",
            (long long)mg->fn);
    cg_line(b, 2, "}");
}

static void emit_epilogue(const mma_gen *mg, cg_buf *b)
{
    const ir_subgraph *g = mg->g;
    const space_mma_info *mi = mg->mi;
    cg_line(b, 1, "/* epilogue: fp32, one rounding at the store */");
    cg_line(b, 1, "#pragma unroll");
    cg_line(b, 1, "for (int mi = 0; mi < %lld; mi++)", (long long)mg->fm);
    cg_line(b, 1, "#pragma unroll");
    cg_line(b, 1, "for (int ni = 0; ni < %lld; ni++)", (long long)mg->fn);
    cg_line(b, 1, "#pragma unroll");
    cg_line(b, 1, "for (int q = 0; q < 4; q++) {");
    cg_line(b, 2, "const int gm = m0 + wm * %lld + mi * 16 + (lane >> 2) + (q >> 1) * 8;",
            (long long)mg->wm);
    cg_line(b, 2, "const int gn = n0 + wn * %lld + ni * 8 + (lane & 3) * 2 + (q & 1);",
            (long long)mg->wn);
    cg_line(b, 2, "if (gm >= %lld || gn >= %lld) continue;", (long long)mi->M, (long long)mi->N);
    emit_unflatten(mg, b, 2, mi->m_axis, mi->n_m, "gm");
    emit_unflatten(mg, b, 2, mi->n_axis, mi->n_n, "gn");
    cg_line(b, 2, "float val = acc[mi][ni][q];");
    cg_names nm;
    emit_names(mg, &nm);
    epi_ctx ec = {mg, &nm};
    nm.load_hook = epi_load_hook;
    nm.load_ctx = &ec;
    int prev = mg->a->out;
    for (int si = g->anchor + 1; si < g->n_stage; si++) {
        const ir_stage *e = &g->stage[si];
        nm.subst_tensor = prev;
        nm.subst_var = "val";
        cg_line(b, 2, "/* %s */", e->name);
        cg_printf(b, "        val = ");
        cg_emit_scalar(b, g, e, e->body, &nm);
        cg_printf(b, ";\n");
        prev = e->out;
    }
    const ir_tensor *o = &g->tensor[g->output];
    int64_t st[IR_MAX_DIMS];
    cg_strides(o, st);
    cg_printf(b, "        %s[", o->name);
    bool any = false;
    for (int d = 0; d < o->ndim; d++) {
        if (o->shape[d] == 1) continue;
        cg_printf(b, "%s%lld * %s", any ? " + " : "", (long long)st[d], mg->axp[d]);
        any = true;
    }
    cg_printf(b, "%s] = tlm_f2h(val);\n", any ? "" : "0");
    cg_line(b, 1, "}");
}

int cg_cuda_gen_mma(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                    tlm_error *err)
{
    mma_gen mg;
    memset(&mg, 0, sizeof mg);
    mg.sp = sp;
    mg.g = sp->g;
    mg.a = &sp->g->stage[sp->g->anchor];
    mg.mi = &sp->mma;
    mg.wm = space_get(sp, s, SLOT_WARP_M, 16);
    mg.wn = space_get(sp, s, SLOT_WARP_N, 8);
    mg.wpm = space_get(sp, s, SLOT_WARPS_M, 1);
    mg.wpn = space_get(sp, s, SLOT_WARPS_N, 1);
    mg.bk = space_get(sp, s, SLOT_BLOCK_K, 16);
    mg.stages = space_get(sp, s, SLOT_PIPELINE, 1);
    mg.swizzle = space_get(sp, s, SLOT_SWIZZLE, 0) != 0;
    mg.bm = mg.wm * mg.wpm, mg.bn = mg.wn * mg.wpn;
    mg.nt = 32 * mg.wpm * mg.wpn;
    mg.fm = mg.wm / 16, mg.fn = mg.wn / 8;
    mg.bf16 = sp->g->wl.dtype == IR_BFLOAT16;
    const ir_subgraph *g = sp->g;
    for (int si = 0; si < g->n_stage; si++) {
        const ir_stage *st = &g->stage[si];
        if (si > g->anchor && (st->n_spatial != mg.a->n_spatial || st->n_reduce != 0))
            return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                               "epilogue stage %s is not elementwise over the anchor", st->name);
    }
    for (int t = 0; t < g->n_tensor; t++)
        if (ir_tensor_numel(&g->tensor[t]) > INT32_MAX / 2)
            return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                               "tensor %s is too large for 32-bit indices in the tensor-core "
                               "kernel", g->tensor[t].name);
    for (int x = 0; x < mg.a->n_spatial + mg.a->n_reduce; x++) {
        snprintf(mg.axv[x], NAME_LEN, "ax_%.20s", mg.a->axis[x]);
        for (char *p = mg.axv[x]; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')))
                *p = '_';
        for (int y = 0; y < x; y++)
            if (strcmp(mg.axv[x], mg.axv[y]) == 0) snprintf(mg.axv[x], NAME_LEN, "ax%d", x);
        mg.axp[x] = mg.axv[x];
    }
    plan_operand(&mg, &mg.A, true);
    plan_operand(&mg, &mg.B, false);
    const space_mma_info *mi = mg.mi;

    cg_buf buf = {0};
    cg_buf *b = &buf;
    char wl[1024], sched[1024];
    if (ir_workload_canonical(&g->wl, wl, sizeof wl) < 0) snprintf(wl, sizeof wl, "?");
    space_print(sp, s, sched, sizeof sched);
    cg_line(b, 0, "/* Generated by tlmd (cuda, gpu_mma: tensor cores) for %s", sp->tgt.name);
    cg_line(b, 0, " * workload: %s", wl);
    cg_line(b, 0, " * schedule: %s", sched);
    cg_line(b, 0, " * GEMM view: M %lld x N %lld x K %lld, batch %lld; block %lld x %lld, %lld warps of "
                  "%lld x %lld;", (long long)mi->M, (long long)mi->N, (long long)mi->K,
            (long long)mi->batch, (long long)mg.bm, (long long)mg.bn, (long long)(mg.wpm * mg.wpn),
            (long long)mg.wm, (long long)mg.wn);
    cg_line(b, 0, " * %lld-deep K chunks in %lld shared-memory stage%s%s */", (long long)mg.bk,
            (long long)mg.stages, mg.stages > 1 ? "s" : "", mg.swizzle ? ", XOR-swizzled" : "");
    cg_line(b, 0, "#pragma nv_diag_suppress 177 /* the shared helpers below may go unused */");
    cg_line(b, 0, "#ifndef INFINITY");
    cg_line(b, 0, "#define INFINITY __int_as_float(0x7f800000)");
    cg_line(b, 0, "#endif");
    cg_emit_prelude_scalar(b, true);
    emit_primitives(b, mg.bf16);
    cg_printf(b, "\nextern \"C\" __global__ void __launch_bounds__(%lld) %s(", (long long)mg.nt, entry);
    int in[IR_MAX_TENSORS];
    int n_in = ir_subgraph_inputs(g, in);
    for (int i = 0; i < n_in; i++)
        cg_printf(b, "%sconst tlm_h16 *__restrict__ %s", i ? ", " : "", g->tensor[in[i]].name);
    cg_printf(b, "%stlm_h16 *__restrict__ %s)\n{\n", n_in ? ", " : "", g->tensor[g->output].name);
    int a_tile = mg.A.rows * mg.A.rowlen, b_tile = mg.B.rows * mg.B.rowlen;
    cg_line(b, 1, "extern __shared__ float4 tlm_smem[]; /* float4: 16-byte alignment */");
    cg_line(b, 1, "tlm_h16 *const sa = reinterpret_cast<tlm_h16 *>(tlm_smem); /* %lld x %d */",
            (long long)mg.stages, a_tile);
    cg_line(b, 1, "tlm_h16 *const sb = sa + %lld; /* %lld x %d */", (long long)(mg.stages * a_tile),
            (long long)mg.stages, b_tile);
    cg_line(b, 1, "const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;");
    cg_line(b, 1, "const int wm = warp / %lld, wn = warp %% %lld;", (long long)mg.wpn, (long long)mg.wpn);
    cg_line(b, 1, "const int m0 = blockIdx.x * %lld, n0 = blockIdx.y * %lld;", (long long)mg.bm,
            (long long)mg.bn);
    if (mi->n_b > 0) {
        cg_line(b, 1, "const int gb = blockIdx.z;");
        emit_unflatten(&mg, b, 1, mi->b_axis, mi->n_b, "gb");
    }
    cg_line(b, 1, "float acc[%lld][%lld][4];", (long long)mg.fm, (long long)mg.fn);
    cg_line(b, 1, "#pragma unroll");
    cg_line(b, 1, "for (int mi = 0; mi < %lld; mi++)", (long long)mg.fm);
    cg_line(b, 2, "#pragma unroll");
    cg_line(b, 2, "for (int ni = 0; ni < %lld; ni++)", (long long)mg.fn);
    cg_line(b, 3, "acc[mi][ni][0] = acc[mi][ni][1] = acc[mi][ni][2] = acc[mi][ni][3] = 0.0f;");
    cg_line(b, 1, "/* global -> shared: K chunk kt into stage `stage` */");
    cg_line(b, 1, "auto load_tiles = [&](int stage, int kt) {");
    emit_tile_copy(&mg, b, &mg.A);
    emit_tile_copy(&mg, b, &mg.B);
    cg_line(b, 1, "};");
    cg_line(b, 1, "/* shared -> fragments -> mma.sync on stage `stage` */");
    cg_line(b, 1, "auto compute = [&](int stage) {");
    emit_compute(&mg, b);
    cg_line(b, 1, "};");
    int64_t kt_n = (mi->K + mg.bk - 1) / mg.bk;
    cg_line(b, 1, "const int KT = %lld;", (long long)kt_n);
    if (mg.stages == 1) {
        cg_line(b, 1, "for (int kt = 0; kt < KT; kt++) {");
        cg_line(b, 2, "load_tiles(0, kt);");
        cg_line(b, 2, "tlm_cp_async_commit();");
        cg_line(b, 2, "tlm_cp_async_wait<0>();");
        cg_line(b, 2, "__syncthreads();");
        cg_line(b, 2, "compute(0);");
        cg_line(b, 2, "__syncthreads();");
        cg_line(b, 1, "}");
    } else {
        int64_t S = mg.stages;
        cg_line(b, 1, "#pragma unroll");
        cg_line(b, 1, "for (int s = 0; s < %lld; s++) {", (long long)(S - 1));
        cg_line(b, 2, "if (s < KT) load_tiles(s, s);");
        cg_line(b, 2, "tlm_cp_async_commit();");
        cg_line(b, 1, "}");
        cg_line(b, 1, "for (int kt = 0; kt < KT; kt++) {");
        cg_line(b, 2, "tlm_cp_async_wait<%lld>(); /* chunk kt has landed */", (long long)(S - 2));
        cg_line(b, 2, "__syncthreads(); /* ... for every thread; stage (kt - 1) %% %lld is free */",
                (long long)S);
        cg_line(b, 2, "const int next = kt + %lld;", (long long)(S - 1));
        cg_line(b, 2, "if (next < KT) load_tiles(next %% %lld, next);", (long long)S);
        cg_line(b, 2, "tlm_cp_async_commit();");
        cg_line(b, 2, "compute(kt %% %lld);", (long long)S);
        cg_line(b, 1, "}");
        cg_line(b, 1, "tlm_cp_async_wait<0>();");
    }
    emit_epilogue(&mg, b);
    cg_printf(b, "}\n");
    if (buf.oom) {
        free(buf.p);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    out->source = cg_buf_take(&buf);
    if (!out->source) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int64_t gx = (mi->M + mg.bm - 1) / mg.bm, gy = (mi->N + mg.bn - 1) / mg.bn;
    if (gx > INT32_MAX || gy > 65535) {
        free(out->source);
        out->source = NULL;
        return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                           "%lld x %lld blocks exceed the grid's limits", (long long)gx,
                           (long long)gy);
    }
    out->grid[0] = (int)gx, out->grid[1] = (int)gy, out->grid[2] = (int)mi->batch;
    out->block[0] = (int)mg.nt, out->block[1] = out->block[2] = 1;
    out->smem_bytes = (int)space_mma_smem_bytes(sp, s);
    return 0;
}
