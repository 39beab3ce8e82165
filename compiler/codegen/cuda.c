/* cuda.c — CUDA C generation for the GPU_TILE and GPU_ROWS sketches.
 *
 * GPU_TILE (matmul, conv, depthwise, pools, transpose, elementwise). Per spatial axis x the
 * tile factors T[x][0..4] are (grid, vthread, thread, inner1, inner2); per reduction axis
 * (outer, middle, inner). One block computes a block tile of prod(T[x][1..4]) points; its
 * threads are the thread level (threadIdx.x, last spatial axis fastest); each thread keeps
 * prod(levels 1,3,4) accumulators in a register array. Inside the block tile the thread
 * digit is the FASTEST one: point = v*(T2*T3*T4) + (i3*T4 + i4)*T2 + t, so consecutive
 * threads touch consecutive elements (coalesced stores and unstrided shared-memory reads);
 * the vthread digit is the slowest. Loop nest:
 *     for r0 { [stage inputs into shared memory; sync] for r1 { for v { for s3 {
 *         for r2 { for s4 { acc += body }}}}} [sync] }
 *     for v, s3, s4: out = epilogues(acc * post_scale)
 * Spatial loops are fully unrolled (the accumulator index must be a compile-time constant for
 * the array to live in registers); a reduction loop gets `#pragma unroll` when unrolling it
 * yields at most UNROLL copies of the body, counting the copies the enclosing (unrolled)
 * spatial loops make (TVM's auto_unroll_max_step, adapted: without that count a 112-output
 * thread with UNROLL 512 asked NVRTC for 3584 bodies and ptxas spent minutes); a loop whose
 * unrolling would exceed 1024 bodies gets `#pragma unroll 1` (NVVM would otherwise unroll
 * short constant loops on its own, whatever UNROLL says); otherwise nvcc decides.
 * Staging copies, per distinct load of the anchor, the bounding box of its index over the
 * block tile x reduction chunk (clipped to the tensor as space_gpu_smem_bytes counts it);
 * elements outside the tensor are filled with 0 and never read: loads that can leave the
 * tensor sit under the IR's select, which still decides padding. Staged reads use the
 * block-local indices, so their shared-memory offsets fold to constants plus loop terms.
 *
 * GPU_ROWS (softmax, norms, reduce_*, global_avg_pool2d NCHW): one block per ROWS rows,
 * THREADS threads; per row every reducing stage is a strided per-thread partial, a warp
 * shuffle tree, then one partial per warp through shared memory; the per-row result is a
 * scalar every thread holds. The anchor then runs strided over the row's inner points (or,
 * when it reduces, thread 0 writes the row's value), with the epilogue chain inlined.
 *
 * All shared memory is dynamic (extern __shared__), so out->smem_bytes is the whole
 * footprint and the cubin's static shared memory is 0.
 */
#include "compiler/codegen/codegen.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_LEN 24
#define GRID_X_SPLIT (INT64_C(1) << 20) /* grid.x when the block count exceeds 2^31-1 */

/* ---- shared helpers ---- */

typedef struct {
    int64_t nblk; /* logical blocks */
    int grid[3];
    bool split; /* blocks spread over y (and a guard for the ragged end) */
} grid_plan;

static void plan_grid(int64_t nblk, grid_plan *gp)
{
    gp->nblk = nblk;
    gp->grid[1] = gp->grid[2] = 1;
    if (nblk <= INT32_MAX) {
        gp->grid[0] = (int)nblk;
        gp->split = false;
    } else {
        /* IR_MAX_ELEMS (2^34) / 2^20 = 2^14 fits grid.y's 65535 */
        gp->grid[0] = (int)GRID_X_SPLIT;
        gp->grid[1] = (int)((nblk + GRID_X_SPLIT - 1) / GRID_X_SPLIT);
        gp->split = true;
    }
}

static void emit_block_index(cg_buf *b, const grid_plan *gp)
{
    if (!gp->split) {
        cg_line(b, 1, "const int blk = blockIdx.x;");
        return;
    }
    cg_line(b, 1, "const long long blk = blockIdx.x + (long long)gridDim.x * blockIdx.y;");
    cg_line(b, 1, "if (blk >= %lldLL) return; /* ragged end of the split grid */",
            (long long)gp->nblk);
}

static bool c_ident(const char *s)
{
    if (!s[0] || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
    for (const char *p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_')) return false;
    return true;
}

/* Names the generator itself declares; axis variables must not shadow them. */
static bool reserved(const char *s)
{
    static const char *const r[] = {
        "blk", "tid",  "acc",   "val",    "row",      "rr",      "idx",  "part",  "e",    "e0",
        "u",   "a",    "q",     "t4",     "tlm_smem", "tlm_red", "int",  "float", "for",  "if",
        "do",  "long", "const", "return", "auto",     "char",    "void", "case",  "else", "while"};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
        if (strcmp(s, r[i]) == 0) return true;
    return false;
}

/* Variable base name of axis x of stage st: its IR name when that is a safe identifier,
 * unique in the stage and not a tensor name, else "ax<x>". */
static void axis_var(const ir_subgraph *g, const ir_stage *st, int x, char *out)
{
    const char *n = st->axis[x];
    bool ok = c_ident(n) && !reserved(n) && strlen(n) < 12;
    for (int y = 0; y < st->n_spatial + st->n_reduce && ok; y++)
        if (y != x && strcmp(st->axis[y], n) == 0) ok = false;
    for (int t = 0; t < g->n_tensor && ok; t++)
        if (strcmp(g->tensor[t].name, n) == 0) ok = false;
    if (ok)
        snprintf(out, NAME_LEN, "%s", n);
    else
        snprintf(out, NAME_LEN, "ax%d", x);
}

typedef struct tile_gen tile_gen;
static bool staged_load(const tile_gen *tg, const ir_stage *s, int id);
static void emit_staged_load(const tile_gen *tg, cg_buf *b, int id);

static bool staged_hook(const void *ctx, cg_buf *b, const ir_stage *s, int id)
{
    const tile_gen *tg = ctx;
    if (!staged_load(tg, s, id)) return false;
    emit_staged_load(tg, b, id);
    return true;
}

/* cg_emit_scalar in CUDA spelling, with the loads the tile generator staged in shared memory
 * read from there (tg may be NULL). */
static void cu_expr(cg_buf *b, const ir_subgraph *g, const ir_stage *s, int id, const cg_names *nm,
                    const tile_gen *tg)
{
    cg_names n = *nm;
    n.cuda = true;
    if (tg) {
        n.load_hook = staged_hook;
        n.load_ctx = tg;
    }
    cg_emit_scalar(b, g, s, id, &n);
}

static void emit_prelude(cg_buf *b, const space *sp, const space_sched *s)
{
    char wl[1024], sched[1024];
    if (ir_workload_canonical(&sp->g->wl, wl, sizeof wl) < 0) snprintf(wl, sizeof wl, "?");
    space_print(sp, s, sched, sizeof sched);
    cg_line(b, 0, "/* Generated by tlmd (cuda, %s) for %s", space_sketch_name(sp->sketch),
            sp->tgt.name);
    cg_line(b, 0, " * workload: %s", wl);
    cg_line(b, 0, " * schedule: %s */", sched);
    /* NVRTC compiles without the C library headers. */
    cg_line(b, 0, "#pragma nv_diag_suppress 177 /* the shared helpers below may go unused */");
    cg_line(b, 0, "#ifndef UINT64_MAX");
    cg_line(b, 0, "typedef unsigned long long uint64_t;");
    cg_line(b, 0, "#endif");
    cg_line(b, 0, "#ifndef INFINITY");
    cg_line(b, 0, "#define INFINITY __int_as_float(0x7f800000)");
    cg_line(b, 0, "#endif");
    cg_emit_prelude_scalar(b, true);
}

/* Epilogue stages after the anchor, applied to `val` in place. nm->axis must name the
 * anchor's spatial axes (the epilogues share them). */
static void emit_epilogues(cg_buf *b, const ir_subgraph *g, int ind, cg_names *nm)
{
    int prev = g->stage[g->anchor].out;
    for (int si = g->anchor + 1; si < g->n_stage; si++) {
        const ir_stage *e = &g->stage[si];
        nm->subst_tensor = prev;
        nm->subst_var = "val";
        for (int t = 0; t < IR_MAX_TENSORS; t++)
            nm->scalar_tensor[t] = NULL;
        cg_line(b, ind, "/* %s */", e->name);
        for (int i = 0; i < ind; i++)
            cg_printf(b, "    ");
        cg_printf(b, "val = ");
        cu_expr(b, g, e, e->body, nm, NULL);
        cg_printf(b, ";\n");
        prev = e->out;
    }
    nm->subst_tensor = -1;
    nm->subst_var = NULL;
}

/* Row-major offset of the output for the anchor's spatial point (names in nm->axis). */
static void emit_out_offset(cg_buf *b, const ir_subgraph *g, const cg_names *nm)
{
    const ir_tensor *t = &g->tensor[g->output];
    int64_t st[IR_MAX_DIMS];
    cg_strides(t, st);
    bool any = false;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 1) continue;
        if (any) cg_printf(b, " + ");
        if (st[d] == 1)
            cg_printf(b, "%s", nm->axis[d]);
        else
            cg_printf(b, "%lld * %s", (long long)st[d], nm->axis[d]);
        any = true;
    }
    if (!any) cg_printf(b, "0");
}

/* The subgraph shapes codegen relies on: stages in order prologues, anchor, epilogues; each
 * epilogue over the anchor's spatial axes; the output indexed by them. */
static int check_structure(const ir_subgraph *g, bool allow_prologue, tlm_error *err)
{
    const ir_stage *a = &g->stage[g->anchor];
    for (int si = 0; si < g->n_stage; si++) {
        const ir_stage *st = &g->stage[si];
        ir_role want = si < g->anchor    ? IR_ROLE_PROLOGUE
                       : si == g->anchor ? IR_ROLE_ANCHOR
                                         : IR_ROLE_EPILOGUE;
        if (st->role != want || (want == IR_ROLE_PROLOGUE && !allow_prologue))
            return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                               "stage %d (%s) has a role the CUDA generator does not handle here",
                               si, st->name);
        if (want == IR_ROLE_EPILOGUE) {
            if (st->n_spatial != a->n_spatial || st->n_reduce != 0 || st->reduce != IR_RED_NONE)
                return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                                   "epilogue stage %s is not elementwise over the anchor",
                                   st->name);
            for (int x = 0; x < a->n_spatial; x++)
                if (st->extent[x] != a->extent[x])
                    return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                                       "epilogue stage %s has other extents than the anchor",
                                       st->name);
        }
    }
    const ir_tensor *o = &g->tensor[g->output];
    if (o->ndim != a->n_spatial)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                           "output rank %d differs from the anchor's %d spatial axes", o->ndim,
                           a->n_spatial);
    for (int d = 0; d < o->ndim; d++)
        if (o->shape[d] != a->extent[d])
            return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                               "output dim %d differs from the anchor's axis extent", d);
    return 0;
}

/* 64-bit indices only when some tensor is too large for int arithmetic (with margin for
 * padded, possibly negative intermediate indices). */
static bool need_wide(const ir_subgraph *g)
{
    for (int t = 0; t < g->n_tensor; t++)
        if (ir_tensor_numel(&g->tensor[t]) > INT32_MAX / 2) return true;
    return false;
}

#define UNROLL_BODIES_CAP 1024 /* the largest UNROLL value */

/* steps: copies of the loop body that unrolling this loop (and everything inside) makes. */
static void emit_pragma_unroll(cg_buf *b, int ind, int64_t steps, int64_t unroll)
{
    if (unroll > 0 && steps <= unroll) cg_line(b, ind, "#pragma unroll");
    /* Left alone, NVVM fully unrolls short constant loops whatever surrounds them: a 7x7
     * window inside a 128-output register tile became 6272 bodies and a minute of NVRTC. */
    else if (steps > UNROLL_BODIES_CAP)
        cg_line(b, ind, "#pragma unroll 1");
}

/* ======================================================================================
 * GPU_TILE
 * ====================================================================================== */

typedef struct {
    int tensor;
    int expr; /* the first load expression it serves */
    int ndim;
    int64_t size[IR_MAX_DIMS];     /* box extent per tensor dim, clipped to the tensor */
    int64_t cstride[IR_MAX_DIMS];  /* row-major strides of the compact box (copy order) */
    int64_t sstride[IR_MAX_DIMS];  /* strides in shared memory (rows padded by `pad`) */
    int pad;                       /* extra floats per row against bank conflicts */
    int64_t alloc;                 /* floats in shared memory */
    int64_t lo_const[IR_MAX_DIMS]; /* -(negative-coefficient part): local index -> box index */
    bool clip[IR_MAX_DIMS];        /* box wider than the tensor: base = max(lo, 0) */
    bool check[IR_MAX_DIMS];       /* box may reach outside [0, shape) */
    int64_t fp;                    /* elements of the box */
    int64_t off;                   /* first float in the shared-memory pool */
    int vec;                       /* 1: scalar copies; 2/4: float2/float4 copies */
    char name[NAME_LEN];
} staged;

struct tile_gen {
    const space *sp;
    const space_sched *s;
    const ir_subgraph *g;
    const ir_stage *a;
    cg_buf *b;
    int ns, nr;
    const char *ity; /* index type */
    int64_t T[IR_MAX_AXES][5];
    int64_t box[IR_MAX_AXES]; /* block tile (spatial) / reduction chunk */
    int64_t nt;               /* threads per block */
    int64_t nacc, p3, p4;     /* accumulators; products of levels 3 and 4 */
    int64_t unroll, vec_load;
    bool stage;
    char av[IR_MAX_AXES][NAME_LEN];
    int nbuf;
    staged buf[IR_MAX_EXPR];
    int buf_of[IR_MAX_EXPR];
    int64_t smem_floats;
    char full[IR_MAX_AXES][NAME_LEN];  /* variable holding the full index of an axis */
    char local[IR_MAX_AXES][NAME_LEN]; /* variable holding the block-local index */
    cg_names nm;                       /* full names, params */
};

/* Block-local index of axis x as an expression of the loop variables (no block origin). */
static void tile_local_expr(const tile_gen *tg, int x, char *out, size_t cap)
{
    const char *v = tg->av[x];
    size_t len = 0;
    out[0] = 0;
#define TERM(...)                                                                                  \
    do {                                                                                           \
        if (len) len += (size_t)snprintf(out + len, cap - len, " + ");                             \
        len += (size_t)snprintf(out + len, cap - len, __VA_ARGS__);                                \
    } while (0)
    if (x < tg->ns) {
        const int64_t *T = tg->T[x];
        if (T[1] > 1) {
            int64_t m = T[2] * T[3] * T[4];
            if (m == 1)
                TERM("%s_v", v);
            else
                TERM("%s_v * %lld", v, (long long)m);
        }
        if (T[3] > 1) {
            int64_t m = T[4] * T[2];
            if (m == 1)
                TERM("%s_o", v);
            else
                TERM("%s_o * %lld", v, (long long)m);
        }
        if (T[4] > 1) {
            if (T[2] == 1)
                TERM("%s_i", v);
            else
                TERM("%s_i * %lld", v, (long long)T[2]);
        }
        if (T[2] > 1) TERM("%s_t", v);
    } else {
        const int64_t *T = tg->T[x];
        if (T[1] > 1) {
            if (T[2] == 1)
                TERM("%s_m", v);
            else
                TERM("%s_m * %lld", v, (long long)T[2]);
        }
        if (T[2] > 1) TERM("%s_i", v);
    }
    if (!len) snprintf(out, cap, "0");
#undef TERM
}

/* Block origin of axis x (spatial: the block tile's first point; reduction: the chunk's),
 * or "" when it is always 0. */
static void tile_origin_expr(const tile_gen *tg, int x, char *out, size_t cap)
{
    out[0] = 0;
    if (tg->T[x][0] == 1) return;
    if (x < tg->ns)
        snprintf(out, cap, "%s_blk", tg->av[x]);
    else
        snprintf(out, cap, "%s_o * %lld", tg->av[x], (long long)tg->box[x]);
}

static void tile_full_expr(const tile_gen *tg, int x, char *out, size_t cap)
{
    char loc[160], org[64];
    tile_local_expr(tg, x, loc, sizeof loc);
    tile_origin_expr(tg, x, org, sizeof org);
    if (!org[0])
        snprintf(out, cap, "%s", loc);
    else if (strcmp(loc, "0") == 0)
        snprintf(out, cap, "%s", org);
    else
        snprintf(out, cap, "%s + %s", org, loc);
}

/* Flattened index over the spatial axes of level l (mixed radix, last axis fastest). */
static void tile_flat_level(const tile_gen *tg, int l, char *out, size_t cap)
{
    static const char *suf[5] = {"", "v", "t", "o", "i"};
    size_t len = 0;
    out[0] = 0;
    for (int x = 0; x < tg->ns; x++) {
        if (tg->T[x][l] == 1) continue;
        if (!len)
            len += (size_t)snprintf(out, cap, "%s_%s", tg->av[x], suf[l]);
        else {
            char tmp[256];
            snprintf(tmp, sizeof tmp, "(%s) * %lld + %s_%s", out, (long long)tg->T[x][l], tg->av[x],
                     suf[l]);
            len = (size_t)snprintf(out, cap, "%s", tmp);
        }
    }
    if (!len) snprintf(out, cap, "0");
}

static void tile_acc_index(const tile_gen *tg, char *out, size_t cap)
{
    char f1[256], f3[256], f4[256], tmp[600];
    tile_flat_level(tg, 1, f1, sizeof f1);
    tile_flat_level(tg, 3, f3, sizeof f3);
    tile_flat_level(tg, 4, f4, sizeof f4);
    /* ((f1 * p3 + f3) * p4 + f4), dropping the terms that are identically 0 */
    if (strcmp(f1, "0") == 0)
        snprintf(tmp, sizeof tmp, "%s", f3);
    else if (tg->p3 == 1)
        snprintf(tmp, sizeof tmp, "%s", f1);
    else if (strcmp(f3, "0") == 0)
        snprintf(tmp, sizeof tmp, "(%s) * %lld", f1, (long long)tg->p3);
    else
        snprintf(tmp, sizeof tmp, "(%s) * %lld + %s", f1, (long long)tg->p3, f3);
    if (strcmp(tmp, "0") == 0)
        snprintf(out, cap, "%s", f4);
    else if (tg->p4 == 1)
        snprintf(out, cap, "%s", tmp);
    else if (strcmp(f4, "0") == 0)
        snprintf(out, cap, "(%s) * %lld", tmp, (long long)tg->p4);
    else
        snprintf(out, cap, "(%s) * %lld + %s", tmp, (long long)tg->p4, f4);
}

/* Does expression id sit (transitively) under a select? Such loads may be out of range. */
static void mark_guarded(const ir_stage *st, int id, bool under, bool *guarded)
{
    const ir_expr *e = &st->expr[id];
    switch (e->kind) {
    case IR_E_LOAD:
        guarded[id] = guarded[id] || under;
        break;
    case IR_E_UNARY:
        mark_guarded(st, e->a, under, guarded);
        break;
    case IR_E_BINARY:
        mark_guarded(st, e->a, under, guarded);
        mark_guarded(st, e->b, under, guarded);
        break;
    case IR_E_SELECT:
        mark_guarded(st, e->a, true, guarded);
        mark_guarded(st, e->b, true, guarded);
        break;
    default:
        break;
    }
}

static bool same_load(const ir_expr *x, const ir_expr *y, int ndim, int naxes)
{
    if (x->tensor != y->tensor) return false;
    for (int d = 0; d < ndim; d++) {
        if (x->idx[d].off != y->idx[d].off) return false;
        for (int a = 0; a < naxes; a++)
            if (x->idx[d].coef[a] != y->idx[d].coef[a]) return false;
    }
    return true;
}

static int64_t mod_pos(int64_t a, int64_t m)
{
    int64_t r = a % m;
    return r < 0 ? r + m : r;
}

/* Can copies of this buffer use float<w> loads? Needs every vector to lie in one row of the
 * box, inside the tensor, at a global and shared offset that is a multiple of w for every
 * block and chunk. */
static bool staged_vec_ok(const tile_gen *tg, const staged *sb, int64_t w)
{
    const ir_tensor *t = &tg->g->tensor[sb->tensor];
    int L = sb->ndim - 1;
    if ((w != 2 && w != 4) || sb->size[L] % w || sb->check[L] || sb->clip[L]) return false;
    if (sb->ndim > 1 && t->shape[L] % w) return false;
    const ir_affine *ix = &tg->a->expr[sb->expr].idx[L];
    if (mod_pos(ix->off, w)) return false;
    for (int x = 0; x < tg->ns + tg->nr; x++) {
        int64_t c = ix->coef[x];
        if (!c) continue;
        if (tg->T[x][0] > 1 && mod_pos(c * tg->box[x], w)) return false;
        if (c < 0 && mod_pos(c * (tg->box[x] - 1), w)) return false;
    }
    return true;
}

static int tile_plan_staging(tile_gen *tg, tlm_error *err)
{
    const ir_stage *a = tg->a;
    const ir_subgraph *g = tg->g;
    int naxes = tg->ns + tg->nr;
    bool guarded[IR_MAX_EXPR] = {false};
    mark_guarded(a, a->body, false, guarded);
    for (int i = 0; i < IR_MAX_EXPR; i++)
        tg->buf_of[i] = -1;
    tg->nbuf = 0;
    if (!tg->stage) return 0;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD || g->tensor[e->tensor].kind != IR_T_INPUT) continue;
        const ir_tensor *t = &g->tensor[e->tensor];
        int found = -1;
        for (int k = 0; k < tg->nbuf && found < 0; k++)
            if (same_load(&a->expr[tg->buf[k].expr], e, t->ndim, naxes)) found = k;
        if (found >= 0) {
            tg->buf_of[id] = found;
            continue;
        }
        staged *sb = &tg->buf[tg->nbuf];
        memset(sb, 0, sizeof *sb);
        sb->tensor = e->tensor;
        sb->expr = id;
        sb->ndim = t->ndim;
        sb->vec = 1;
        int same_name = 0;
        for (int k = 0; k < tg->nbuf; k++)
            if (tg->buf[k].tensor == e->tensor) same_name++;
        if (same_name)
            snprintf(sb->name, NAME_LEN, "%s_s%d", t->name, same_name);
        else
            snprintf(sb->name, NAME_LEN, "%s_s", t->name);
        for (int d = 0; d < t->ndim; d++) {
            const ir_affine *ix = &e->idx[d];
            int64_t span = 1, neg = 0, dmin = ix->off, dmax = ix->off;
            for (int x = 0; x < naxes; x++) {
                int64_t c = ix->coef[x];
                span += (c < 0 ? -c : c) * (tg->box[x] - 1);
                if (c < 0) {
                    neg += c * (tg->box[x] - 1);
                    dmin += c * (a->extent[x] - 1);
                } else {
                    dmax += c * (a->extent[x] - 1);
                }
            }
            sb->lo_const[d] = -neg;
            sb->clip[d] = span > t->shape[d];
            sb->size[d] = sb->clip[d] ? t->shape[d] : span;
            sb->check[d] = sb->clip[d] || dmin < 0 || dmax >= t->shape[d];
        }
        sb->fp = 1;
        for (int d = t->ndim - 1; d >= 0; d--) {
            sb->cstride[d] = sb->fp;
            sb->fp *= sb->size[d];
        }
        tg->buf_of[id] = tg->nbuf++;
    }
    /* The corners of the iteration domain are visited points, and the box's extremes are
     * attained at them: a buffer none of whose loads is guarded by a select lies inside the
     * tensor (unless clipped), so its copies need no bounds checks. */
    for (int k = 0; k < tg->nbuf; k++) {
        bool any_guarded = false;
        for (int id = 0; id < a->n_expr; id++)
            if (tg->buf_of[id] == k && guarded[id]) any_guarded = true;
        for (int d = 0; d < tg->buf[k].ndim && !any_guarded; d++)
            tg->buf[k].check[d] = tg->buf[k].clip[d];
    }
    /* Layout: vector-copied buffers start on a 16-byte boundary; scalar-copied ones whose rows
     * are a multiple of 8 floats get one float of padding per row, so that threads reading
     * down a column hit different banks. If either would break the target's shared-memory
     * limit (the space bounds the compact boxes), fall back to compact scalar copies. */
    for (int pass = 0; pass < 2; pass++) {
        int64_t off = 0;
        for (int k = 0; k < tg->nbuf; k++) {
            staged *sb = &tg->buf[k];
            int L = sb->ndim - 1;
            sb->vec = pass == 0 && staged_vec_ok(tg, sb, tg->vec_load) ? (int)tg->vec_load : 1;
            sb->pad =
                pass == 0 && sb->vec == 1 && L > 0 && sb->size[L] % 8 == 0 && sb->fp > sb->size[L];
            int64_t st = 1;
            for (int d = L; d >= 0; d--) {
                sb->sstride[d] = st;
                st *= sb->size[d] + (d == L ? sb->pad : 0);
            }
            sb->alloc = st;
            if (sb->vec > 1) off = (off + 3) / 4 * 4;
            sb->off = off;
            off += sb->alloc;
        }
        tg->smem_floats = off;
        if (off * 4 <= tg->sp->tgt.gpu.smem_per_block) return 0;
    }
    return tlm_err_set(err, TLM_ELIMIT, "stage",
                       "staged inputs need %lld bytes of shared memory, the target allows %d",
                       (long long)tg->smem_floats * 4, tg->sp->tgt.gpu.smem_per_block);
}

/* Shared-memory offset of a staged load, from the block-local indices. */
static void emit_staged_offset(const tile_gen *tg, cg_buf *b, const staged *sb, const ir_expr *e)
{
    int naxes = tg->ns + tg->nr;
    int64_t coef[IR_MAX_AXES] = {0}, c = 0;
    for (int d = 0; d < sb->ndim; d++) {
        c += sb->lo_const[d] * sb->sstride[d];
        for (int x = 0; x < naxes; x++)
            coef[x] += (int64_t)e->idx[d].coef[x] * sb->sstride[d];
    }
    bool any = false;
    for (int x = 0; x < naxes; x++) {
        if (!coef[x] || tg->box[x] == 1) continue; /* the local index is always 0 */
        if (any) cg_printf(b, " + ");
        if (coef[x] == 1)
            cg_printf(b, "%s", tg->local[x]);
        else
            cg_printf(b, "%lld * %s", (long long)coef[x], tg->local[x]);
        any = true;
    }
    for (int d = 0; d < sb->ndim; d++) {
        if (!sb->clip[d]) continue;
        if (any) cg_printf(b, " + ");
        if (sb->sstride[d] == 1)
            cg_printf(b, "%s_sh%d", sb->name, d);
        else
            cg_printf(b, "%s_sh%d * %lld", sb->name, d, (long long)sb->sstride[d]);
        any = true;
    }
    if (c || !any) cg_printf(b, any ? " + %lld" : "%lld", (long long)c);
}

static bool staged_load(const tile_gen *tg, const ir_stage *s, int id)
{
    return tg && s == tg->a && tg->buf_of[id] >= 0;
}

static void emit_staged_load(const tile_gen *tg, cg_buf *b, int id)
{
    const staged *sb = &tg->buf[tg->buf_of[id]];
    cg_printf(b, "%s[", sb->name);
    emit_staged_offset(tg, b, sb, &tg->a->expr[id]);
    cg_printf(b, "]");
}

/* Which axes the body needs as full (global) and as block-local indices. */
static void tile_index_use(const tile_gen *tg, bool *use_full, bool *use_local)
{
    const ir_stage *a = tg->a;
    int naxes = tg->ns + tg->nr;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind == IR_E_LOAD) {
            bool *u = tg->buf_of[id] >= 0 ? use_local : use_full;
            for (int d = 0; d < tg->g->tensor[e->tensor].ndim; d++)
                for (int x = 0; x < naxes; x++)
                    if (e->idx[d].coef[x] && (u == use_full || tg->box[x] > 1)) u[x] = true;
        } else if (e->kind == IR_E_SELECT) {
            for (int i = 0; i < e->ncond; i++)
                for (int x = 0; x < naxes; x++)
                    if (e->cond[i].coef[x]) use_full[x] = true;
        }
    }
}

static void emit_copy(tile_gen *tg, int ind, const staged *sb)
{
    cg_buf *b = tg->b;
    const ir_tensor *t = &tg->g->tensor[sb->tensor];
    int n = sb->ndim;
    int64_t st[IR_MAX_DIMS];
    cg_strides(t, st);
    int64_t w = tg->vec_load > 1 ? tg->vec_load : 1;
    bool vec = sb->vec > 1;
    bool ragged = sb->fp % w != 0;
    if (w == 1)
        cg_line(b, ind, "for (int e = tid; e < %lld; e += %lld) {", (long long)sb->fp,
                (long long)tg->nt);
    else
        cg_line(b, ind, "for (int e%s = tid * %lld; e%s < %lld; e%s += %lld) {", vec ? "" : "0",
                (long long)w, vec ? "" : "0", (long long)sb->fp, vec ? "" : "0",
                (long long)(tg->nt * w));
    int in = ind + 1;
    if (w > 1 && !vec) {
        cg_line(b, in, "#pragma unroll");
        cg_line(b, in, "for (int u = 0; u < %lld; u++) {", (long long)w);
        in++;
        cg_line(b, in, "const int e = e0 + u;");
        if (ragged) {
            cg_line(b, in, "if (e >= %lld) break;", (long long)sb->fp);
        }
    }
    /* box coordinates, then tensor coordinates */
    for (int d = 0; d < n; d++) {
        if (sb->size[d] == 1) continue;
        if (n == 1)
            cg_line(b, in, "const int d0 = e;");
        else if (d == 0)
            cg_line(b, in, "const int d0 = e / %lld;", (long long)sb->cstride[0]);
        else if (sb->cstride[d] == 1)
            cg_line(b, in, "const int d%d = e %% %lld;", d, (long long)sb->size[d]);
        else
            cg_line(b, in, "const int d%d = e / %lld %% %lld;", d, (long long)sb->cstride[d],
                    (long long)sb->size[d]);
    }
    for (int d = 0; d < n; d++) {
        if (sb->size[d] == 1)
            cg_line(b, in, "const %s g%d = %s_o%d;", tg->ity, d, sb->name, d);
        else
            cg_line(b, in, "const %s g%d = %s_o%d + d%d;", tg->ity, d, sb->name, d, d);
    }
    char cond[512] = "";
    size_t cl = 0;
    for (int d = 0; d < n; d++) {
        if (!sb->check[d]) continue;
        cl += (size_t)snprintf(cond + cl, sizeof cond - cl, "%s(uint64_t)g%d < %lluu",
                               cl ? " && " : "", d, (unsigned long long)t->shape[d]);
    }
    char off[512];
    size_t ol = 0;
    off[0] = 0;
    for (int d = 0; d < n; d++) {
        if (st[d] == 1)
            ol += (size_t)snprintf(off + ol, sizeof off - ol, "%sg%d", ol ? " + " : "", d);
        else
            ol += (size_t)snprintf(off + ol, sizeof off - ol, "%sg%d * %lld", ol ? " + " : "", d,
                                   (long long)st[d]);
    }
    /* where the element goes: e itself unless rows are padded */
    char dst[256] = "e";
    if (sb->pad) {
        size_t dl = 0;
        for (int d = 0; d < n; d++) {
            if (sb->size[d] == 1) continue;
            if (sb->sstride[d] == 1)
                dl += (size_t)snprintf(dst + dl, sizeof dst - dl, "%sd%d", dl ? " + " : "", d);
            else
                dl += (size_t)snprintf(dst + dl, sizeof dst - dl, "%sd%d * %lld", dl ? " + " : "",
                                       d, (long long)sb->sstride[d]);
        }
    }
    if (vec) {
        const char *vt = sb->vec == 4 ? "float4" : "float2";
        const char *zero =
            sb->vec == 4 ? "make_float4(0.0f, 0.0f, 0.0f, 0.0f)" : "make_float2(0.0f, 0.0f)";
        if (cl) {
            cg_line(b, in, "%s t4 = %s;", vt, zero);
            cg_line(b, in, "if (%s) t4 = *reinterpret_cast<const %s *>(%s + %s);", cond, vt,
                    tg->nm.tensor[sb->tensor], off);
            cg_line(b, in, "*reinterpret_cast<%s *>(%s + e) = t4;", vt, sb->name);
        } else {
            cg_line(b, in,
                    "*reinterpret_cast<%s *>(%s + e) = *reinterpret_cast<const %s *>(%s + %s);", vt,
                    sb->name, vt, tg->nm.tensor[sb->tensor], off);
        }
    } else if (cl) {
        cg_line(b, in, "%s[%s] = (%s) ? %s[%s] : 0.0f;", sb->name, dst, cond,
                tg->nm.tensor[sb->tensor], off);
    } else {
        cg_line(b, in, "%s[%s] = %s[%s];", sb->name, dst, tg->nm.tensor[sb->tensor], off);
    }
    if (w > 1 && !vec) cg_line(b, in - 1, "}");
    cg_line(b, ind, "}");
}

/* Box origins of every staged buffer for the current block and reduction chunk, then the
 * cooperative copies. */
static void emit_staging(tile_gen *tg, int ind)
{
    cg_buf *b = tg->b;
    int naxes = tg->ns + tg->nr;
    for (int k = 0; k < tg->nbuf; k++) {
        const staged *sb = &tg->buf[k];
        const ir_expr *e = &tg->a->expr[sb->expr];
        for (int i = 0; i < ind; i++)
            cg_printf(b, "    ");
        cg_printf(b, "/* %s: box", sb->name);
        for (int d = 0; d < sb->ndim; d++)
            cg_printf(b, "[%lld]", (long long)sb->size[d]);
        cg_printf(b, " of %s%s%s */\n", tg->g->tensor[sb->tensor].name,
                  sb->vec > 1 ? (sb->vec == 4 ? ", float4 copies" : ", float2 copies") : "",
                  sb->pad ? ", rows padded by 1" : "");
        for (int d = 0; d < sb->ndim; d++) {
            /* lo = off + sum c * origin + sum_{c<0} c * (box-1) */
            char lo[512];
            size_t ll = 0;
            lo[0] = 0;
            for (int x = 0; x < naxes; x++) {
                int64_t c = e->idx[d].coef[x];
                char org[64];
                tile_origin_expr(tg, x, org, sizeof org);
                if (!c || !org[0]) continue;
                if (c == 1)
                    ll += (size_t)snprintf(lo + ll, sizeof lo - ll, "%s%s", ll ? " + " : "", org);
                else
                    ll += (size_t)snprintf(lo + ll, sizeof lo - ll, "%s%lld * (%s)",
                                           ll ? " + " : "", (long long)c, org);
            }
            int64_t lc = e->idx[d].off - sb->lo_const[d];
            if (lc || !ll)
                snprintf(lo + ll, sizeof lo - ll, ll ? " + (%lld)" : "%lld", (long long)lc);
            if (sb->clip[d]) {
                cg_line(b, ind, "const %s %s_lo%d = %s;", tg->ity, sb->name, d, lo);
                cg_line(b, ind, "const %s %s_o%d = %s_lo%d > 0 ? %s_lo%d : 0;", tg->ity, sb->name,
                        d, sb->name, d, sb->name, d);
                cg_line(b, ind, "const int %s_sh%d = (int)(%s_lo%d - %s_o%d);", sb->name, d,
                        sb->name, d, sb->name, d);
            } else {
                cg_line(b, ind, "const %s %s_o%d = %s;", tg->ity, sb->name, d, lo);
            }
        }
        emit_copy(tg, ind, sb);
    }
    cg_line(b, ind, "__syncthreads();");
}

static void emit_loop(cg_buf *b, int ind, const char *var, int64_t n)
{
    cg_line(b, ind, "for (int %s = 0; %s < %lld; %s++) {", var, var, (long long)n, var);
}

/* The point body of the compute nest: index variables, then the accumulate. */
static void emit_compute_point(tile_gen *tg, int ind)
{
    cg_buf *b = tg->b;
    const ir_stage *a = tg->a;
    int naxes = tg->ns + tg->nr;
    bool use_full[IR_MAX_AXES] = {false}, use_local[IR_MAX_AXES] = {false};
    tile_index_use(tg, use_full, use_local);
    for (int x = 0; x < naxes; x++) {
        char ex[256];
        if (use_local[x]) {
            tile_local_expr(tg, x, ex, sizeof ex);
            cg_line(b, ind, "const int %s = %s;", tg->local[x], ex);
        }
        if (use_full[x]) {
            tile_full_expr(tg, x, ex, sizeof ex);
            cg_line(b, ind, "const %s %s = %s;", tg->ity, tg->full[x], ex);
        }
    }
    char ai[900];
    tile_acc_index(tg, ai, sizeof ai);
    for (int i = 0; i < ind; i++)
        cg_printf(b, "    ");
    if (a->reduce == IR_RED_SUM)
        cg_printf(b, "acc[%s] += ", ai);
    else if (a->reduce == IR_RED_MAX)
        cg_printf(b, "acc[%s] = fmaxf(acc[%s], ", ai, ai);
    else
        cg_printf(b, "acc[%s] = ", ai);
    cu_expr(b, tg->g, a, a->body, &tg->nm, tg);
    cg_printf(b, a->reduce == IR_RED_MAX ? ");\n" : ";\n");
}

static int gen_tile(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                    tlm_error *err)
{
    const ir_subgraph *g = sp->g;
    int rc = check_structure(g, false, err);
    if (rc) return rc;
    tile_gen *tg = calloc(1, sizeof *tg);
    if (!tg) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    cg_buf buf = {0};
    tg->sp = sp;
    tg->s = s;
    tg->g = g;
    tg->a = &g->stage[g->anchor];
    tg->b = &buf;
    tg->ns = sp->n_spatial;
    tg->nr = sp->n_reduce;
    tg->ity = need_wide(g) ? "long long" : "int";
    tg->nm.subst_tensor = -1;
    tg->nm.cuda = true;
    const ir_stage *a = tg->a;
    int ns = tg->ns, nr = tg->nr, naxes = ns + nr;
    tg->nt = 1;
    tg->nacc = 1;
    tg->p3 = 1;
    tg->p4 = 1;
    int64_t nblk = 1;
    for (int x = 0; x < naxes; x++) {
        int levels = x < ns ? 5 : 3;
        int64_t prod = 1;
        for (int l = 0; l < 5; l++)
            tg->T[x][l] = l < levels ? space_tile(sp, s, x, l) : 1;
        for (int l = 1; l < levels; l++)
            prod *= tg->T[x][l];
        if (tg->T[x][0] < 1 || prod * tg->T[x][0] != a->extent[x]) {
            rc = tlm_err_set(err, TLM_EINVAL, "schedule",
                             "tile factors of axis %s do not divide its extent %lld", a->axis[x],
                             (long long)a->extent[x]);
            goto done;
        }
        tg->box[x] = prod;
        if (x < ns) {
            nblk *= tg->T[x][0];
            tg->nt *= tg->T[x][2];
            tg->nacc *= tg->T[x][1] * tg->T[x][3] * tg->T[x][4];
            tg->p3 *= tg->T[x][3];
            tg->p4 *= tg->T[x][4];
        }
        axis_var(g, a, x, tg->av[x]);
        char nmx[NAME_LEN];
        memcpy(nmx, tg->av[x], NAME_LEN);
        snprintf(tg->full[x], NAME_LEN, "%s", nmx);
        snprintf(tg->local[x], NAME_LEN, "%.20s_l", nmx);
        tg->nm.axis[x] = tg->full[x];
    }
    if (tg->nt < 1 || tg->nt > sp->tgt.gpu.max_threads_per_block) {
        rc =
            tlm_err_set(err, TLM_EINVAL, "schedule", "%lld threads per block, the target allows %d",
                        (long long)tg->nt, sp->tgt.gpu.max_threads_per_block);
        goto done;
    }
    tg->unroll = space_get(sp, s, SLOT_UNROLL, 0);
    tg->vec_load = space_get(sp, s, SLOT_VEC_LOAD, 1);
    tg->stage = space_get(sp, s, SLOT_STAGE, 0) != 0;
    if ((rc = tile_plan_staging(tg, err))) goto done;

    grid_plan gp;
    plan_grid(nblk, &gp);

    emit_prelude(&buf, sp, s);
    cg_line(&buf, 0, "/* Index names: <axis>_blk block origin, _v vthread, _t thread, _o/_i inner");
    cg_line(&buf, 0,
            " * tiles (spatial); _o/_m/_i outer/middle/inner (reduction); _l block-local. */");
    cg_printf(&buf, "extern \"C\" __global__ void __launch_bounds__(%lld) %s(", (long long)tg->nt,
              entry);
    cg_emit_params(&buf, g, &tg->nm, true);
    cg_printf(&buf, ")\n{\n");
    if (tg->nbuf) {
        cg_line(&buf, 1, "extern __shared__ float4 tlm_smem[]; /* float4: 16-byte alignment */");
        for (int k = 0; k < tg->nbuf; k++)
            cg_line(&buf, 1, "float *%s = reinterpret_cast<float *>(tlm_smem) + %lld;",
                    tg->buf[k].name, (long long)tg->buf[k].off);
    }
    emit_block_index(&buf, &gp);
    if (tg->nt > 1 || tg->nbuf) cg_line(&buf, 1, "const int tid = threadIdx.x;");
    /* block origins (last spatial axis fastest over blocks) and thread coordinates */
    {
        int64_t div = 1;
        for (int x = ns - 1; x >= 0; x--) {
            int64_t G = tg->T[x][0];
            if (G > 1) {
                const char *bt = gp.split ? "long long" : "int";
                if (strcmp(tg->ity, "long long") == 0) bt = "long long";
                if (div * G == nblk) {
                    if (div == 1)
                        cg_line(&buf, 1, "const %s %s_blk = blk * %lld;", bt, tg->av[x],
                                (long long)tg->box[x]);
                    else
                        cg_line(&buf, 1, "const %s %s_blk = (blk / %lld) * %lld;", bt, tg->av[x],
                                (long long)div, (long long)tg->box[x]);
                } else if (div == 1) {
                    cg_line(&buf, 1, "const %s %s_blk = (blk %% %lld) * %lld;", bt, tg->av[x],
                            (long long)G, (long long)tg->box[x]);
                } else {
                    cg_line(&buf, 1, "const %s %s_blk = (blk / %lld %% %lld) * %lld;", bt,
                            tg->av[x], (long long)div, (long long)G, (long long)tg->box[x]);
                }
            }
            div *= G;
        }
        div = 1;
        for (int x = ns - 1; x >= 0; x--) {
            int64_t Tt = tg->T[x][2];
            if (Tt > 1) {
                if (div * Tt == tg->nt) {
                    if (div == 1)
                        cg_line(&buf, 1, "const int %s_t = tid;", tg->av[x]);
                    else
                        cg_line(&buf, 1, "const int %s_t = tid / %lld;", tg->av[x], (long long)div);
                } else if (div == 1) {
                    cg_line(&buf, 1, "const int %s_t = tid %% %lld;", tg->av[x], (long long)Tt);
                } else {
                    cg_line(&buf, 1, "const int %s_t = tid / %lld %% %lld;", tg->av[x],
                            (long long)div, (long long)Tt);
                }
            }
            div *= Tt;
        }
    }

    cg_line(&buf, 1, "float acc[%lld]; /* %lld outputs per thread, in registers */",
            (long long)tg->nacc, (long long)tg->nacc);
    if (a->reduce != IR_RED_NONE) {
        cg_line(&buf, 1, "#pragma unroll");
        cg_line(&buf, 1, "for (int a = 0; a < %lld; a++) acc[a] = %s;", (long long)tg->nacc,
                a->reduce == IR_RED_MAX ? "-INFINITY" : "0.0f");
    }
    /* r0 */
    int ind = 1;
    int r0_loops = 0;
    for (int x = ns; x < naxes; x++) {
        if (tg->T[x][0] == 1) continue;
        char v[NAME_LEN + 4];
        snprintf(v, sizeof v, "%s_o", tg->av[x]);
        cg_line(&buf, ind, "#pragma unroll 1");
        emit_loop(&buf, ind++, v, tg->T[x][0]);
        r0_loops++;
    }
    if (tg->nbuf) emit_staging(tg, ind);
    /* r1 */
    int64_t inner_steps = tg->nacc; /* v * s3 * s4 */
    for (int x = ns; x < naxes; x++)
        inner_steps *= tg->T[x][2];
    int64_t r1_total = 1;
    for (int x = ns; x < naxes; x++)
        r1_total *= tg->T[x][1];
    int64_t rem = r1_total;
    int opened = 0;
    for (int x = ns; x < naxes; x++) {
        if (tg->T[x][1] == 1) continue;
        char v[NAME_LEN + 4];
        snprintf(v, sizeof v, "%s_m", tg->av[x]);
        emit_pragma_unroll(&buf, ind, rem * inner_steps, tg->unroll);
        rem /= tg->T[x][1];
        emit_loop(&buf, ind++, v, tg->T[x][1]);
        opened++;
    }
    /* v, s3 */
    for (int l = 1; l <= 3; l += 2)
        for (int x = 0; x < ns; x++) {
            if (tg->T[x][l] == 1) continue;
            char v[NAME_LEN + 4];
            snprintf(v, sizeof v, "%s_%s", tg->av[x], l == 1 ? "v" : "o");
            cg_line(&buf, ind, "#pragma unroll");
            emit_loop(&buf, ind++, v, tg->T[x][l]);
            opened++;
        }
    /* r2 */
    int64_t r2_total = 1;
    for (int x = ns; x < naxes; x++)
        r2_total *= tg->T[x][2];
    rem = r2_total;
    for (int x = ns; x < naxes; x++) {
        if (tg->T[x][2] == 1) continue;
        char v[NAME_LEN + 4];
        snprintf(v, sizeof v, "%s_i", tg->av[x]);
        /* the enclosing v and s3 loops are unrolled too: count every copy */
        emit_pragma_unroll(&buf, ind, rem * tg->nacc, tg->unroll);
        rem /= tg->T[x][2];
        emit_loop(&buf, ind++, v, tg->T[x][2]);
        opened++;
    }
    /* s4 */
    for (int x = 0; x < ns; x++) {
        if (tg->T[x][4] == 1) continue;
        char v[NAME_LEN + 4];
        snprintf(v, sizeof v, "%s_i", tg->av[x]);
        cg_line(&buf, ind, "#pragma unroll");
        emit_loop(&buf, ind++, v, tg->T[x][4]);
        opened++;
    }
    if (opened + r0_loops == 0) { /* a scope of its own: the write-back declares the same names */
        cg_line(&buf, ind++, "{");
        opened++;
    }
    emit_compute_point(tg, ind);
    for (int k = 0; k < opened; k++)
        cg_line(&buf, --ind, "}");
    if (tg->nbuf && r0_loops) cg_line(&buf, ind, "__syncthreads(); /* before the next copy */");
    for (int k = 0; k < r0_loops; k++)
        cg_line(&buf, --ind, "}");

    /* write-back */
    cg_line(&buf, 1, "/* write-back%s */",
            g->n_stage > g->anchor + 1 ? " with the epilogue inlined" : "");
    opened = 0;
    for (int l = 1; l <= 4; l++) {
        if (l == 2) continue;
        for (int x = 0; x < ns; x++) {
            if (tg->T[x][l] == 1) continue;
            char v[NAME_LEN + 4];
            snprintf(v, sizeof v, "%s_%s", tg->av[x], l == 1 ? "v" : l == 3 ? "o" : "i");
            cg_line(&buf, ind, "#pragma unroll");
            emit_loop(&buf, ind++, v, tg->T[x][l]);
            opened++;
        }
    }
    if (!opened) {
        cg_line(&buf, ind++, "{");
        opened++;
    }
    for (int x = 0; x < ns; x++) {
        char ex[256];
        tile_full_expr(tg, x, ex, sizeof ex);
        cg_line(&buf, ind, "const %s %s = %s;", tg->ity, tg->full[x], ex);
    }
    {
        char ai[900];
        tile_acc_index(tg, ai, sizeof ai);
        if (a->post_scale != 1.0) {
            char lit[64];
            cg_line(&buf, ind, "float val = acc[%s] * %s;", ai,
                    cg_float_literal(a->post_scale, lit, sizeof lit));
        } else {
            cg_line(&buf, ind, "float val = acc[%s];", ai);
        }
    }
    emit_epilogues(&buf, g, ind, &tg->nm);
    for (int i = 0; i < ind; i++)
        cg_printf(&buf, "    ");
    cg_printf(&buf, "%s[", tg->nm.tensor[g->output]);
    emit_out_offset(&buf, g, &tg->nm);
    cg_printf(&buf, "] = val;\n");
    for (int k = 0; k < opened; k++)
        cg_line(&buf, --ind, "}");
    cg_printf(&buf, "}\n");

    if (buf.oom) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto done;
    }
    out->source = cg_buf_take(&buf);
    if (!out->source) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto done;
    }
    memcpy(out->grid, gp.grid, sizeof out->grid);
    out->block[0] = (int)tg->nt;
    out->block[1] = out->block[2] = 1;
    out->smem_bytes = (int)(tg->smem_floats * 4);
done:
    free(buf.p);
    free(tg);
    return rc;
}

/* ======================================================================================
 * GPU_ROWS
 * ====================================================================================== */

static void emit_block_reduce_helpers(cg_buf *b)
{
    static const char *kinds[2][3] = {{"sum", "v += o", "r += red[w]"},
                                      {"max", "v = fmaxf(v, o)", "r = fmaxf(r, red[w])"}};
    for (int k = 0; k < 2; k++) {
        cg_line(b, 0,
                "/* Block-wide %s: every thread gets the same value (one summation order). */",
                kinds[k][0]);
        cg_line(
            b, 0,
            "static __device__ __forceinline__ float tlm_block_%s(float v, float *red, int nwarps)",
            kinds[k][0]);
        cg_line(b, 0, "{");
        cg_line(b, 1, "for (int m = 16; m > 0; m >>= 1) {");
        cg_line(b, 2, "const float o = __shfl_xor_sync(0xffffffffu, v, m);");
        cg_line(b, 2, "%s;", kinds[k][1]);
        cg_line(b, 1, "}");
        cg_line(b, 1, "if (nwarps == 1) return v;");
        cg_line(b, 1, "__syncthreads(); /* earlier readers of red are done */");
        cg_line(b, 1, "if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;");
        cg_line(b, 1, "__syncthreads();");
        cg_line(b, 1, "float r = red[0];");
        cg_line(b, 1, "for (int w = 1; w < nwarps; w++) %s;", kinds[k][2]);
        cg_line(b, 1, "return r;");
        cg_line(b, 0, "}");
    }
}

/* Declares the stage's inner axes (reduction axes if it reduces, else the spatial axes past
 * the rows) as digits of `idx`, last axis fastest. */
static void rows_inner_decl(cg_buf *b, int ind, const ir_stage *st, int first, int last,
                            char names[][NAME_LEN], const char *ity)
{
    int64_t div = 1;
    int64_t total = 1;
    for (int x = first; x < last; x++)
        total *= st->extent[x];
    for (int x = last - 1; x >= first; x--) {
        int64_t e = st->extent[x];
        if (e == 1)
            cg_line(b, ind, "const %s %s = 0;", ity, names[x]);
        else if (div == 1 && e == total)
            cg_line(b, ind, "const %s %s = idx;", ity, names[x]);
        else if (div == 1)
            cg_line(b, ind, "const %s %s = idx %% %lld;", ity, names[x], (long long)e);
        else if (div * e == total)
            cg_line(b, ind, "const %s %s = idx / %lld;", ity, names[x], (long long)div);
        else
            cg_line(b, ind, "const %s %s = idx / %lld %% %lld;", ity, names[x], (long long)div,
                    (long long)e);
        div *= e;
    }
}

static int gen_rows(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                    tlm_error *err)
{
    const ir_subgraph *g = sp->g;
    int rc = check_structure(g, true, err);
    if (rc) return rc;
    const ir_stage *first = &g->stage[0];
    int nra = sp->n_rows_axes;
    int64_t rows_per_blk = space_get(sp, s, SLOT_ROWS, 1);
    int64_t nt = space_get(sp, s, SLOT_THREADS, 32);
    int64_t unroll = space_get(sp, s, SLOT_UNROLL, 0);
    if (rows_per_blk < 1 || sp->rows % rows_per_blk)
        return tlm_err_set(err, TLM_EINVAL, "rows", "%lld does not divide the %lld rows",
                           (long long)rows_per_blk, (long long)sp->rows);
    if (nt < 32 || nt % 32 || nt > sp->tgt.gpu.max_threads_per_block)
        return tlm_err_set(err, TLM_EINVAL, "threads",
                           "%lld threads: need a multiple of 32 up to %d", (long long)nt,
                           sp->tgt.gpu.max_threads_per_block);
    /* Every stage: the rows first, then either reduction axes (a row statistic) or inner
     * spatial axes (the anchor); prologue results are read at the row only. */
    for (int si = 0; si <= g->anchor; si++) {
        const ir_stage *st = &g->stage[si];
        bool reduces = st->reduce != IR_RED_NONE;
        if (st->n_spatial < nra || (reduces && st->n_spatial != nra) ||
            (!reduces && st->n_reduce != 0) || (si < g->anchor && !reduces))
            return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                               "stage %s does not fit the rows sketch", st->name);
        for (int x = 0; x < nra; x++)
            if (st->extent[x] != first->extent[x])
                return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                                   "stage %s has other row extents", st->name);
        for (int id = 0; id < st->n_expr; id++) {
            const ir_expr *e = &st->expr[id];
            if (e->kind != IR_E_LOAD || g->tensor[e->tensor].kind != IR_T_TEMP) continue;
            const ir_tensor *t = &g->tensor[e->tensor];
            bool ok = t->ndim == nra;
            for (int d = 0; d < t->ndim && ok; d++) {
                ok = e->idx[d].off == 0;
                for (int x = 0; x < st->n_spatial + st->n_reduce && ok; x++)
                    ok = e->idx[d].coef[x] == (x == d);
            }
            if (!ok)
                return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                                   "stage %s reads %s other than at its own row", st->name,
                                   t->name);
        }
    }
    const char *ity = need_wide(g) ? "long long" : "int";
    int64_t nw = nt / 32;
    grid_plan gp;
    plan_grid(sp->rows / rows_per_blk, &gp);

    cg_buf buf = {0};
    cg_names nm;
    memset(&nm, 0, sizeof nm);
    nm.subst_tensor = -1;
    nm.cuda = true;
    char rowv[IR_MAX_AXES][NAME_LEN];
    for (int x = 0; x < nra; x++)
        axis_var(g, first, x, rowv[x]);

    emit_prelude(&buf, sp, s);
    emit_block_reduce_helpers(&buf);
    cg_printf(&buf, "extern \"C\" __global__ void __launch_bounds__(%lld) %s(", (long long)nt,
              entry);
    cg_emit_params(&buf, g, &nm, true);
    cg_printf(&buf, ")\n{\n");
    cg_line(&buf, 1, "extern __shared__ float tlm_red[]; /* one partial per warp */");
    emit_block_index(&buf, &gp);
    cg_line(&buf, 1, "const int tid = threadIdx.x;");
    int ind = 1;
    const char *rt = gp.split || strcmp(ity, "long long") == 0 ? "long long" : "int";
    if (rows_per_blk > 1) {
        cg_line(&buf, ind, "for (int rr = 0; rr < %lld; rr++) {", (long long)rows_per_blk);
        ind++;
        cg_line(&buf, ind, "const %s row = blk * %lld + rr;", rt, (long long)rows_per_blk);
    } else {
        cg_line(&buf, ind, "const %s row = blk;", rt);
    }
    {
        int64_t div = 1;
        for (int x = nra - 1; x >= 0; x--) {
            int64_t e = first->extent[x];
            if (div * e == sp->rows) {
                if (div == 1)
                    cg_line(&buf, ind, "const %s %s = row;", ity, rowv[x]);
                else
                    cg_line(&buf, ind, "const %s %s = row / %lld;", ity, rowv[x], (long long)div);
            } else if (div == 1) {
                cg_line(&buf, ind, "const %s %s = row %% %lld;", ity, rowv[x], (long long)e);
            } else {
                cg_line(&buf, ind, "const %s %s = row / %lld %% %lld;", ity, rowv[x],
                        (long long)div, (long long)e);
            }
            div *= e;
        }
    }
    for (int si = 0; si <= g->anchor; si++) {
        const ir_stage *st = &g->stage[si];
        bool reduces = st->reduce != IR_RED_NONE;
        int lo = nra, hi = reduces ? nra + st->n_reduce : st->n_spatial;
        int64_t inner = 1;
        for (int x = lo; x < hi; x++)
            inner *= st->extent[x];
        char names[IR_MAX_AXES][NAME_LEN];
        for (int x = 0; x < st->n_spatial + st->n_reduce; x++) {
            if (x < nra)
                snprintf(names[x], NAME_LEN, "%s", rowv[x]);
            else
                axis_var(g, st, x, names[x]);
            nm.axis[x] = names[x];
        }
        for (int x = st->n_spatial + st->n_reduce; x < IR_MAX_AXES; x++)
            nm.axis[x] = NULL;
        const char *var = si == g->anchor ? "acc" : g->tensor[st->out].name;
        cg_line(&buf, ind, "/* %s: %s over %lld points per row */", st->name,
                reduces ? (st->reduce == IR_RED_MAX ? "max" : "sum") : "elementwise",
                (long long)inner);
        if (reduces) {
            cg_line(&buf, ind, "float %s = %s;", var,
                    st->reduce == IR_RED_MAX ? "-INFINITY" : "0.0f");
        }
        if (unroll > 0) cg_line(&buf, ind, "#pragma unroll %lld", (long long)unroll);
        cg_line(&buf, ind, "for (%s idx = tid; idx < %lld; idx += %lld) {", ity, (long long)inner,
                (long long)nt);
        rows_inner_decl(&buf, ind + 1, st, lo, hi, names, ity);
        for (int i = 0; i < ind + 1; i++)
            cg_printf(&buf, "    ");
        if (reduces) {
            if (st->reduce == IR_RED_MAX)
                cg_printf(&buf, "%s = fmaxf(%s, ", var, var);
            else
                cg_printf(&buf, "%s += ", var);
            cu_expr(&buf, g, st, st->body, &nm, NULL);
            cg_printf(&buf, st->reduce == IR_RED_MAX ? ");\n" : ";\n");
        } else {
            cg_printf(&buf, "float val = ");
            cu_expr(&buf, g, st, st->body, &nm, NULL);
            cg_printf(&buf, ";\n");
            char lit[64];
            if (st->post_scale != 1.0)
                cg_line(&buf, ind + 1, "val *= %s;", cg_float_literal(st->post_scale, lit, sizeof lit));
            emit_epilogues(&buf, g, ind + 1, &nm);
            for (int i = 0; i < ind + 1; i++)
                cg_printf(&buf, "    ");
            cg_printf(&buf, "%s[", nm.tensor[g->output]);
            emit_out_offset(&buf, g, &nm);
            cg_printf(&buf, "] = val;\n");
        }
        cg_line(&buf, ind, "}");
        if (reduces) {
            char lit[64];
            if (st->post_scale != 1.0)
                cg_line(&buf, ind, "%s = tlm_block_%s(%s, tlm_red, %lld) * %s;", var,
                        st->reduce == IR_RED_MAX ? "max" : "sum", var, (long long)nw,
                        cg_float_literal(st->post_scale, lit, sizeof lit));
            else
                cg_line(&buf, ind, "%s = tlm_block_%s(%s, tlm_red, %lld);", var,
                        st->reduce == IR_RED_MAX ? "max" : "sum", var, (long long)nw);
            if (si < g->anchor) {
                nm.scalar_tensor[st->out] = g->tensor[st->out].name;
            } else {
                cg_line(&buf, ind, "if (tid == 0) {");
                cg_line(&buf, ind + 1, "float val = acc;");
                for (int x = 0; x < nra; x++)
                    nm.axis[x] = rowv[x];
                for (int x = nra; x < IR_MAX_AXES; x++)
                    nm.axis[x] = NULL;
                emit_epilogues(&buf, g, ind + 1, &nm);
                for (int i = 0; i < ind + 1; i++)
                    cg_printf(&buf, "    ");
                cg_printf(&buf, "%s[", nm.tensor[g->output]);
                emit_out_offset(&buf, g, &nm);
                cg_printf(&buf, "] = val;\n");
                cg_line(&buf, ind, "}");
            }
        }
    }
    if (rows_per_blk > 1) cg_line(&buf, --ind, "}");
    cg_printf(&buf, "}\n");
    if (buf.oom) {
        free(buf.p);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    out->source = cg_buf_take(&buf);
    if (!out->source) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    memcpy(out->grid, gp.grid, sizeof out->grid);
    out->block[0] = (int)nt;
    out->block[1] = out->block[2] = 1;
    out->smem_bytes = nw > 1 ? (int)(nw * 4) : 0;
    return 0;
}

/* ======================================================================================
 * entry point
 * ====================================================================================== */

/* The code generator of each GPU sketch (NULL: not a GPU sketch). */
static int (*const cuda_routes[SKETCH_COUNT])(const space *, const space_sched *, const char *,
                                              cg_kernel *, tlm_error *) = {
    [SKETCH_GPU_TILE] = gen_tile,
    [SKETCH_GPU_ROWS] = gen_rows,
    [SKETCH_GPU_MMA] = cg_cuda_gen_mma,
};

bool cg_cuda_has_route(space_sketch s)
{
    return (unsigned)s < SKETCH_COUNT && cuda_routes[s] != NULL;
}

int cg_generate_cuda(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                     tlm_error *err)
{
    if (!sp || !s || !out) return tlm_err_set(err, TLM_EINVAL, "", "NULL argument");
    memset(out, 0, sizeof *out);
    if (!entry) entry = "tlm_kernel";
    if (!c_ident(entry) || strlen(entry) >= CG_ENTRY_MAX)
        return tlm_err_set(err, TLM_EINVAL, "entry",
                           "'%.80s' is not a C identifier of at most %d characters", entry,
                           CG_ENTRY_MAX - 1);
    if (sp->tgt.kind != TARGET_CUDA)
        return tlm_err_set(err, TLM_EINVAL, "target", "%s is not a CUDA target", sp->tgt.name);
    if (s->n != sp->n_slot)
        return tlm_err_set(err, TLM_EINVAL, "schedule", "expected %d decisions, got %d", sp->n_slot,
                           s->n);
    int rc = cg_cuda_has_route(sp->sketch)
                 ? cuda_routes[sp->sketch](sp, s, entry, out, err)
                 : tlm_err_set(err, TLM_EINVAL, "sketch", "sketch %s is not a GPU sketch",
                               space_sketch_name(sp->sketch));
    if (rc) {
        free(out->source);
        memset(out, 0, sizeof *out);
        return rc;
    }
    snprintf(out->entry, sizeof out->entry, "%s", entry);
    out->cuda = true;
    return 0;
}
