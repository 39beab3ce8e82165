/* space.c — sketches, decision slots, legal domains, sampling, counting, printing. */
#include "compiler/space/space.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CPU_ACC_BUF_MAX 16384 /* floats in the s2 x s3 accumulator block: 64 KiB, fits L2 */
#define CPU_INNER_MAX 64      /* innermost tile cap per axis */
#define CPU_PACK_MAX 32768    /* floats in the packed operand buffers: 128 KiB, fits L2 */
#define CPU_WINDOW_FLOATS_MAX 98304 /* CPU_WINDOW's per-thread stack buffers: 384 KiB */
#define PAR_MIN_POINTS 8192   /* rows and window kernels: less work stays on one thread */
#define CPU_VEC_AXIS_MIN 4    /* a spatial axis shorter than this is never the vector axis */
#define GPU_ACC_MAX 128       /* accumulators per thread (register estimate) */
#define ROWS_MAX 256
#define MMA_ACC_MAX 128 /* fp32 accumulators a thread of a GPU_MMA warp tile keeps */
#define MMA_WARPS_MAX 8
#define MMA_SM_MIN 80 /* mma.sync m16n8k16 with bf16 operands: Ampere and later */

static const int64_t unroll_cpu[] = {0, 16, 64, 512};
static const int64_t unroll_gpu[] = {0, 16, 64, 512, 1024};
static const int64_t unroll_rows[] = {0, 16, 64};

static const struct {
    const char *name;
    target_kind kind;
} sketches[SKETCH_COUNT] = {
#define SPACE_SKETCH_ROW(id, nm, k) [SKETCH_##id] = {nm, k},
    SPACE_SKETCHES(SPACE_SKETCH_ROW)
#undef SPACE_SKETCH_ROW
};

const char *space_sketch_name(space_sketch s)
{
    return (unsigned)s < SKETCH_COUNT ? sketches[s].name : "?";
}

target_kind space_sketch_target(space_sketch s)
{
    return (unsigned)s < SKETCH_COUNT ? sketches[s].kind : TARGET_CPU;
}

static const ir_stage *anchor(const space *sp)
{
    return &sp->g->stage[sp->g->anchor];
}

static bool rows_family(const ir_workload *w)
{
    switch (w->op) {
    case IR_OP_SOFTMAX:
    case IR_OP_LAYER_NORM:
    case IR_OP_RMS_NORM:
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX: return true;
    case IR_OP_GLOBAL_AVG_POOL2D: return w->layout == IR_NCHW;
    default: return false;
    }
}

/* A CPU_WINDOW workload's strides and dilations (st[0], st[1], dl[0], dl[1]): a pool's stride
 * defaults to its window, a dilation to 1 */
static void window_steps(const ir_subgraph *g, int64_t st[2], int64_t dl[2])
{
    const ir_workload *w = &g->wl;
    for (int d = 0; d < 2; d++) {
        st[d] = w->stride[d] > 0 ? w->stride[d] : g->stage[0].extent[4 + d];
        dl[d] = w->dilation[d] > 0 ? w->dilation[d] : 1;
    }
}

/* Depthwise convs and windowed pools in NCHW on a CPU: the CPU_WINDOW sketch (space.h). */
static bool window_family(const ir_subgraph *g)
{
    const ir_workload *w = &g->wl;
    bool op =
        w->op == IR_OP_DEPTHWISE_CONV2D || w->op == IR_OP_MAX_POOL2D || w->op == IR_OP_AVG_POOL2D;
    if (!op || w->layout != IR_NCHW || g->anchor != 0 || g->stage[0].n_spatial != 4 ||
        g->stage[0].n_reduce != 2)
        return false;
    /* the packed plane and the row buffer of the largest tiles fit a thread's stack */
    const ir_stage *a = &g->stage[0];
    int64_t OH = a->extent[2], OW = a->extent[3], KH = a->extent[4], KW = a->extent[5];
    int64_t st[2], dl[2];
    window_steps(g, st, dl);
    const int64_t SH = st[0], SW = st[1], DH = dl[0], DW = dl[1];
    if (SW > 16) return false;
    int64_t OWc = OW + 63, hp = (OH + 7 - 1) * SH + (KH - 1) * DH + 1;
    /* the rows rounded up to whole vectors, and the offset that aligns them (codegen) */
    int64_t floats = hp * SW * (OWc + (KW - 1) * DW / SW + 1 + 15) + 15 + 8 * OWc;
    return floats <= CPU_WINDOW_FLOATS_MAX;
}

static void add_slot(space *sp, space_slot_kind k, int axis, int level, const char *name)
{
    space_slot *s = &sp->slot[sp->n_slot++];
    s->kind = k;
    s->axis = axis;
    s->level = level;
    snprintf(s->name, sizeof s->name, "%s", name);
}

static void add_tile(space *sp, int axis, int level)
{
    char nm[24];
    snprintf(nm, sizeof nm, "tile.%s.%d", anchor(sp)->axis[axis], level);
    add_slot(sp, SLOT_TILE, axis, level, nm);
}

int space_build(const ir_subgraph *g, const target *t, space *sp, tlm_error *err)
{
    memset(sp, 0, sizeof *sp);
    sp->g = g;
    sp->tgt = *t;
    const ir_stage *a = &g->stage[g->anchor];
    sp->n_spatial = a->n_spatial;
    sp->n_reduce = a->n_reduce;
    bool gpu = t->kind == TARGET_CUDA;
    if (g->wl.dtype != IR_FLOAT32) {
        if (!gpu)
            return tlm_err_set(err, TLM_EUNSUPPORTED, "dtype",
                               "%s is not implemented for CPU targets yet; only float32 (%s "
                               "runs on cuda targets of sm_80 and later)",
                               ir_dtype_name(g->wl.dtype), ir_dtype_name(g->wl.dtype));
        if (t->gpu.sm < MMA_SM_MIN)
            return tlm_err_set(err, TLM_EUNSUPPORTED, "dtype",
                               "%s kernels use the tensor cores of sm_80 and later; %s is sm_%d",
                               ir_dtype_name(g->wl.dtype), t->name, t->gpu.sm);
        if (space_mma_analyze(g, &sp->mma) != 0)
            return tlm_err_set(err, TLM_EUNSUPPORTED, "dtype",
                               "%s is implemented for dense, batch_matmul and conv2d (tensor "
                               "cores); %s runs in float32 only",
                               ir_dtype_name(g->wl.dtype), ir_op_get(g->wl.op)->name);
        sp->sketch = SKETCH_GPU_MMA;
        add_slot(sp, SLOT_WARP_M, -1, 0, "warp_m");
        add_slot(sp, SLOT_WARP_N, -1, 0, "warp_n");
        add_slot(sp, SLOT_WARPS_M, -1, 0, "warps_m");
        add_slot(sp, SLOT_WARPS_N, -1, 0, "warps_n");
        add_slot(sp, SLOT_BLOCK_K, -1, 0, "block_k");
        add_slot(sp, SLOT_PIPELINE, -1, 0, "pipeline");
        add_slot(sp, SLOT_SWIZZLE, -1, 0, "swizzle");
        return 0;
    }
    if (!gpu && window_family(g)) {
        sp->sketch = SKETCH_CPU_WINDOW;
        sp->s_levels = 4;
        sp->r_levels = 2;
        add_slot(sp, SLOT_VECTORIZE, -1, 0, "vectorize");
        add_tile(sp, 3, 3); /* ow: register tile columns */
        add_tile(sp, 2, 3); /* oh: register tile rows */
        add_slot(sp, SLOT_PARALLEL, -1, 0, "parallel");
        return 0;
    }
    if (rows_family(&g->wl)) {
        sp->sketch = gpu ? SKETCH_GPU_ROWS : SKETCH_CPU_ROWS;
        /* Rows = the spatial axes of the first stage (the prologue's, or a reducing anchor's). */
        const ir_stage *first = &g->stage[0];
        sp->n_rows_axes = first->n_spatial;
        sp->rows = 1;
        for (int i = 0; i < first->n_spatial; i++) sp->rows *= first->extent[i];
        add_slot(sp, SLOT_ROWS, -1, 0, "rows");
        if (gpu) {
            add_slot(sp, SLOT_THREADS, -1, 0, "threads");
        } else {
            add_slot(sp, SLOT_PARALLEL, -1, 0, "parallel");
            add_slot(sp, SLOT_VECTORIZE, -1, 0, "vectorize");
        }
        add_slot(sp, SLOT_UNROLL, -1, 0, "unroll");
        return 0;
    }
    sp->sketch = gpu ? SKETCH_GPU_TILE : SKETCH_CPU_TILE;
    sp->s_levels = gpu ? 5 : 4;
    sp->r_levels = gpu ? 3 : 2;
    int ns = a->n_spatial, nr = a->n_reduce;
    if ((ns * (sp->s_levels - 1) + nr * (sp->r_levels - 1) + 4) > SPACE_MAX_SLOTS)
        return tlm_err_set(err, TLM_ELIMIT, "", "too many axes for the schedule space");
    /* Vectorisation first on CPU: it decides how the register tile counts registers. */
    if (!gpu) add_slot(sp, SLOT_VECTORIZE, -1, 0, "vectorize");
    /* Innermost levels first: the tight resource limits (registers, threads) bind there,
     * and deciding them first keeps every later choice monotone. */
    for (int lv = sp->s_levels - 1; lv >= 1; lv--)
        for (int x = 0; x < ns; x++) add_tile(sp, x, lv);
    for (int lv = sp->r_levels - 1; lv >= 1; lv--)
        for (int x = 0; x < nr; x++) add_tile(sp, ns + x, lv);
    if (gpu) {
        add_slot(sp, SLOT_STAGE, -1, 0, "stage");
        add_slot(sp, SLOT_VEC_LOAD, -1, 0, "vec_load");
        add_slot(sp, SLOT_UNROLL, -1, 0, "unroll");
    } else {
        add_slot(sp, SLOT_PARALLEL, -1, 0, "parallel");
        add_slot(sp, SLOT_UNROLL, -1, 0, "unroll");
        if (nr > 0) add_slot(sp, SLOT_PACK, -1, 0, "pack");
    }
    return 0;
}

/* ---- helpers over partial schedules (slots >= upto count as unset) ---- */

static int64_t tile_partial(const space *sp, const space_sched *s, int upto, int axis, int level)
{
    for (int i = 0; i < upto && i < sp->n_slot; i++)
        if (sp->slot[i].kind == SLOT_TILE && sp->slot[i].axis == axis &&
            sp->slot[i].level == level)
            return s->v[i];
    return 1;
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* What is left of an axis above `level` given the tiles of the levels inside it: the
 * extent divided (rounding up: CPU spatial tiles may pad) by the inner tiles, innermost
 * first. For exact divisors this is the plain quotient. */
static int64_t rem_extent(const space *sp, const space_sched *s, int upto, int axis, int level)
{
    int levels = axis < sp->n_spatial ? sp->s_levels : sp->r_levels;
    int64_t e = anchor(sp)->extent[axis];
    for (int l = levels - 1; l > level; l--) e = ceil_div(e, tile_partial(sp, s, upto, axis, l));
    return e;
}

int64_t space_tile(const space *sp, const space_sched *s, int axis, int level)
{
    if (level > 0) return tile_partial(sp, s, sp->n_slot, axis, level);
    return rem_extent(sp, s, sp->n_slot, axis, 0);
}

int64_t space_padded_extent(const space *sp, const space_sched *s, int axis)
{
    int levels = axis < sp->n_spatial ? sp->s_levels : sp->r_levels;
    int64_t p = 1;
    for (int l = 0; l < levels; l++) p *= space_tile(sp, s, axis, l);
    return p;
}

int64_t space_get(const space *sp, const space_sched *s, space_slot_kind kind, int64_t def)
{
    for (int i = 0; i < sp->n_slot && i < s->n; i++)
        if (sp->slot[i].kind == kind) return s->v[i];
    return def;
}

static int vec_lanes(const space *sp)
{
    int l = sp->tgt.cpu.vector_lanes;
    return l > 0 ? l : 8;
}

int space_cpu_vec_axis(const space *sp, const space_sched *s, int upto)
{
    int ns = sp->n_spatial;
    for (int i = 0; i < sp->n_slot && i < upto && i < s->n; i++)
        if (sp->slot[i].kind == SLOT_VECTORIZE)
            return s->v[i] >= 1 && s->v[i] <= ns ? ns - (int)s->v[i] : ns - 1;
    return ns - 1;
}

/* Lanes codegen gives a register-tile row of t elements: the largest power of two dividing t,
 * up to the target's lanes, when it is at least 4 (smaller vectors are not worth it). Kernels
 * without a reduction take none (their points are plain loops GCC vectorises), except a
 * transpose (space_cpu_gathered_axis), whose register tile codegen moves as W x W blocks transposed
 * in registers. */
int space_cpu_tile_lanes(const space *sp, int64_t t, bool vectorize)
{
    int w = 1;
    if (!vectorize || (sp->n_reduce == 0 && space_cpu_gathered_axis(sp) < 0)) return 1;
    while (w * 2 <= vec_lanes(sp) && t % (w * 2) == 0) w *= 2;
    return w < 4 ? 1 : w;
}

/* Accumulator registers of the register tile given inner tiles (CPU): one vector per W
 * elements of the vectorised axis, one register per scalar otherwise. */
static int64_t cpu_regs(const space *sp, const space_sched *s, int upto, int axis, int64_t val)
{
    int ns = sp->n_spatial;
    bool vec = space_get(sp, s, SLOT_VECTORIZE, 0) != 0 && upto > 0;
    int vx = space_cpu_vec_axis(sp, s, upto);
    int64_t r = 1;
    for (int x = 0; x < ns; x++) {
        int64_t t = x == axis ? val : tile_partial(sp, s, upto, x, 3);
        if (x == vx) t /= space_cpu_tile_lanes(sp, t, vec);
        r *= t;
    }
    return r;
}

static int64_t cpu_accbuf(const space *sp, const space_sched *s, int upto, int axis, int64_t val)
{
    int64_t r = 1;
    for (int x = 0; x < sp->n_spatial; x++) {
        int64_t t2 = x == axis ? val : tile_partial(sp, s, upto, x, 2);
        r *= t2 * tile_partial(sp, s, upto, x, 3);
    }
    return r;
}

/* Per-thread accumulators (levels 1, 3, 4) and threads (level 2) of a GPU tile. */
static int64_t gpu_prod(const space *sp, const space_sched *s, int upto, int axis, int level,
                        int64_t val, bool threads)
{
    int64_t r = 1;
    for (int x = 0; x < sp->n_spatial; x++)
        for (int l = 1; l < sp->s_levels; l++) {
            if ((l == 2) != threads) continue;
            r *= (x == axis && l == level) ? val : tile_partial(sp, s, upto, x, l);
        }
    return r;
}

int64_t space_gpu_smem_bytes(const space *sp, const space_sched *s);

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Divisors of n that are <= cap, ascending (at most SPACE_MAX_VALUES). */
static int divisors(int64_t n, int64_t cap, int64_t *out)
{
    int k = 0;
    for (int64_t d = 1; d * d <= n && k < SPACE_MAX_VALUES - 1; d++) {
        if (n % d) continue;
        if (d <= cap) out[k++] = d;
        if (n / d != d && n / d <= cap) out[k++] = n / d;
    }
    qsort(out, (size_t)k, sizeof *out, cmp_i64);
    return k;
}

int64_t space_pad_limit(int64_t e)
{
    /* 15 % (56 may become 64: 4 vectors of 16), and a quarter below 64 (7 may become 8) */
    return e + (e < 64 ? (e + 3) / 4 : 3 * e / 20);
}

/* The register tile's cap along an axis: CPU_INNER_MAX, and along the vector axis of a
 * target with 32 vector registers 8 vectors (128 floats in 16 lanes), so that a row of 5-7
 * vectors (pick_vec_row) can be one tile. */
static int64_t cpu_inner_cap(const space *sp, int vx, int axis)
{
    int64_t row = 8 * (int64_t)vec_lanes(sp);
    return axis == vx && sp->tgt.cpu.vector_registers > 16 && row > CPU_INNER_MAX ? row
                                                                                 : CPU_INNER_MAX;
}

/* Tile factors of a CPU spatial axis at `level`, where `rem` is left of the axis: the
 * divisors of rem, plus a ladder of values that need not divide it (1..8 for register rows,
 * powers of two, multiples of the vector lanes, rem split in 2..16 near-equal parts above
 * the register tile) as long as the axis padded through this
 * level stays within PAD_WASTE of its extent. The padding is computed and never stored
 * (codegen bounds the tile loops and clamps the loads of edge register tiles), so primes
 * like 197 still get full register tiles. Padding only grows outward and the value 1 (a
 * divisor) adds none, so every value offered keeps a completion (no dead ends). */
static int cpu_ladder(const space *sp, const space_sched *partial, int upto, int axis, int level,
                      int64_t rem, int64_t cap, int64_t *out)
{
    int n = divisors(rem, cap, out);
    int64_t inner = 1; /* the tiles inside this level */
    for (int l = sp->s_levels - 1; l > level; l--) inner *= tile_partial(sp, partial, upto, axis, l);
    int64_t e = anchor(sp)->extent[axis];
    int64_t limit = space_pad_limit(e);
    int lanes = vec_lanes(sp);
    bool vaxis = axis == space_cpu_vec_axis(sp, partial, upto);
    int64_t cand[160];
    int nc = 0;
    for (int64_t v = 2; v <= 8; v++) cand[nc++] = v;
    for (int64_t v = 16; v <= cap && nc < 120; v *= 2) cand[nc++] = v;
    for (int64_t v = lanes; vaxis && v <= 8 * lanes && v <= cap && nc < 159; v += lanes)
        cand[nc++] = v;
    /* above the register tile, even splits: what is left in k near-equal parts (a prime
     * count of tiles, 811, still splits into 4 tasks of 203 for 4 threads or 2 x 2) */
    for (int64_t k = 2; level < sp->s_levels - 1 && k <= 16 && nc < 159; k++)
        if (ceil_div(rem, k) > 1) cand[nc++] = ceil_div(rem, k);
    int base = n;
    for (int i = 0; i < nc; i++) {
        int64_t v = cand[i];
        if (v > cap || rem % v == 0) continue; /* divisors are in already */
        /* beyond what is left only on the vector axis' register tile: a whole padded row */
        if (v > rem && !(vaxis && level == sp->s_levels - 1)) continue;
        if (ceil_div(rem, v) * v * inner > limit) continue;
        bool dup = false;
        for (int k = base; k < n && !dup; k++) dup = out[k] == v;
        if (!dup && n < SPACE_MAX_VALUES) out[n++] = v;
    }
    qsort(out, (size_t)n, sizeof *out, cmp_i64);
    return n;
}

/* Chunk sizes of a CPU reduction axis: the divisors of its extent, plus powers of two from
 * 16 to 512 below it that need not divide it. Nothing is padded: the last chunk is shorter
 * (codegen bounds its loops), so a prime K like 1009 still gets cache-sized chunks and
 * packed panels. The extra values leave every later slot's choices as they were. */
static int cpu_red_ladder(int64_t rem, int64_t cap, int64_t *out)
{
    int n = divisors(rem, cap, out);
    for (int64_t v = 16; v <= 512 && v < rem && v <= cap && n < SPACE_MAX_VALUES; v *= 2)
        if (rem % v) out[n++] = v; /* (a divisor is in already) */
    qsort(out, (size_t)n, sizeof *out, cmp_i64);
    return n;
}

/* ---- GPU_MMA ---- */

static int64_t round_up(int64_t v, int64_t m)
{
    return (v + m - 1) / m * m;
}

/* The decided value of the first slot of `kind` among slots [0, upto), or def. */
static int64_t get_upto(const space *sp, const space_sched *s, int upto, space_slot_kind kind,
                        int64_t def)
{
    for (int i = 0; i < upto && i < sp->n_slot; i++)
        if (sp->slot[i].kind == kind) return s->v[i];
    return def;
}

int64_t space_mma_smem_bytes(const space *sp, const space_sched *s)
{
    if (sp->sketch != SKETCH_GPU_MMA) return 0;
    int n = s->n < sp->n_slot ? s->n : sp->n_slot;
    int64_t bm = get_upto(sp, s, n, SLOT_WARP_M, 16) * get_upto(sp, s, n, SLOT_WARPS_M, 1);
    int64_t bn = get_upto(sp, s, n, SLOT_WARP_N, 8) * get_upto(sp, s, n, SLOT_WARPS_N, 1);
    int64_t bk = get_upto(sp, s, n, SLOT_BLOCK_K, 16), st = get_upto(sp, s, n, SLOT_PIPELINE, 1);
    return st * (bm + bn) * bk * 2;
}

/* Slots are decided in order warp_m, warp_n, warps_m, warps_n, block_k, pipeline, swizzle;
 * each offers only values that keep the minimal completion legal (every later slot's first
 * value uses the least of every resource), so there are no dead ends. */
static int mma_legal(const space *sp, int slot, const space_sched *partial, int64_t *vals)
{
    static const int64_t wm_v[] = {16, 32, 64}, wn_v[] = {8, 16, 32, 64}, w_v[] = {1, 2, 4},
                         bk_v[] = {16, 32, 64}, pipe_v[] = {1, 2, 3, 4}, swz_v[] = {0, 1};
    const space_mma_info *mi = &sp->mma;
    int64_t M16 = round_up(mi->M, 16), N8 = round_up(mi->N, 8), K16 = round_up(mi->K, 16);
    int64_t wm = get_upto(sp, partial, slot, SLOT_WARP_M, 16);
    int64_t wn = get_upto(sp, partial, slot, SLOT_WARP_N, 8);
    int64_t wpm = get_upto(sp, partial, slot, SLOT_WARPS_M, 1);
    int64_t smem_max = sp->tgt.gpu.smem_per_block_optin > 0 ? sp->tgt.gpu.smem_per_block_optin
                                                            : sp->tgt.gpu.smem_per_block;
    int64_t threads_max = sp->tgt.gpu.max_threads_per_block > 0 ? sp->tgt.gpu.max_threads_per_block
                                                                : 1024;
    int n = 0;
    space_sched tmp = *partial;
    tmp.n = slot + 1;
    switch (sp->slot[slot].kind) {
    case SLOT_WARP_M:
        for (int i = 0; i < 3; i++)
            if (wm_v[i] == 16 || wm_v[i] <= M16) vals[n++] = wm_v[i];
        return n;
    case SLOT_WARP_N:
        for (int i = 0; i < 4; i++)
            if ((wn_v[i] == 8 || wn_v[i] <= N8) && (wm / 16) * (wn_v[i] / 8) * 4 <= MMA_ACC_MAX)
                vals[n++] = wn_v[i];
        return n;
    case SLOT_WARPS_M:
        for (int i = 0; i < 3; i++)
            if (w_v[i] == 1 || wm * w_v[i] <= M16) vals[n++] = w_v[i];
        return n;
    case SLOT_WARPS_N:
        for (int i = 0; i < 3; i++) {
            int64_t warps = wpm * w_v[i];
            if (warps > MMA_WARPS_MAX || warps * 32 > threads_max) continue;
            if (w_v[i] == 1 || wn * w_v[i] <= N8) vals[n++] = w_v[i];
        }
        return n;
    case SLOT_BLOCK_K:
    case SLOT_PIPELINE: {
        bool bk = sp->slot[slot].kind == SLOT_BLOCK_K;
        const int64_t *lst = bk ? bk_v : pipe_v;
        for (int i = 0; i < (bk ? 3 : 4); i++) {
            if (bk && lst[i] != 16 && lst[i] > K16) continue;
            tmp.v[slot] = lst[i];
            if (space_mma_smem_bytes(sp, &tmp) <= smem_max) vals[n++] = lst[i];
        }
        return n;
    }
    case SLOT_SWIZZLE:
        memcpy(vals, swz_v, sizeof swz_v);
        return 2;
    default: return TLM_EINVAL;
    }
}

int space_window_lanes(const space *sp, const space_sched *s, int upto)
{
    for (int i = 0; i < upto && i < s->n && i < sp->n_slot; i++)
        if (sp->slot[i].kind == SLOT_VECTORIZE) return s->v[i] ? vec_lanes(sp) : 1;
    return 1;
}

bool space_window_channels(const space *sp, const space_sched *s, int upto)
{
    for (int i = 0; i < upto && i < s->n && i < sp->n_slot; i++)
        if (sp->slot[i].kind == SLOT_VECTORIZE) return s->v[i] == WINDOW_VEC_CHANNELS;
    return false;
}

/* CPU_WINDOW along channels: the accumulators of a register tile (rows x columns, a vector
 * of channels each), the registers less the tap's weight vector and one spare */
static int window_channel_budget(const space *sp)
{
    return sp->tgt.cpu.vector_registers - 2;
}

/* Whether CPU_WINDOW may put its vectors along blocks of channels (WINDOW_VEC_CHANNELS):
 * 8- or 16-lane vectors (AVX2, AVX-512), and the plane packed channel-interleaved (lanes
 * floats a point, padded) with the weights, the widest row buffers and their transpose
 * within the per-thread stack bound. Any C (the last block's missing channels read the last
 * channel's plane and are not stored). */
static bool window_channels_ok(const space *sp)
{
    const ir_stage *a = anchor(sp);
    int L = vec_lanes(sp);
    if ((L != 8 && L != 16) || sp->sketch != SKETCH_CPU_WINDOW) return false;
    int64_t OH = a->extent[2], OW = a->extent[3], KH = a->extent[4], KW = a->extent[5];
    int64_t st[2], dl[2];
    window_steps(sp->g, st, dl);
    int64_t HP = (OH - 1) * st[0] + (KH - 1) * dl[0] + 1;
    int64_t WP = (OW - 1) * st[1] + (KW - 1) * dl[1] + 1;
    int64_t OWp = (OW + L - 1) / L * L;
    int64_t floats = (HP * WP + KH * KW + 9 * OWp) * L;
    return floats <= CPU_WINDOW_FLOATS_MAX;
}

int space_window_budget(const space *sp, int lanes)
{
    if (lanes == 1) return 16;
    return sp->tgt.cpu.vector_registers > 16 ? 24 : 12;
}

/* CPU_WINDOW tiles: columns k x lanes (k <= 4 vectors, 8 scalars) of which the last vector
 * still holds a real column; rows 1..8 within the extent with rows x vectors accumulators
 * inside the register budget. Each list starts at its least resource-hungry value. */
static int window_tiles(const space *sp, int slot, const space_sched *partial, int64_t *vals)
{
    const space_slot *sl = &sp->slot[slot];
    int W = space_window_lanes(sp, partial, slot);
    int64_t e = anchor(sp)->extent[sl->axis];
    int n = 0;
    if (space_window_channels(sp, partial, slot)) {
        /* along channels: any columns up to the budget (the last tile starts at OW - cols,
         * overlapping the one before it), then rows with rows x columns within it */
        int64_t budget = window_channel_budget(sp);
        int64_t cols = sl->axis == 3 ? 1 : tile_partial(sp, partial, slot, 3, 3);
        for (int64_t v = 1; v <= e && v * cols <= budget && (sl->axis == 3 || v <= 8); v++)
            vals[n++] = v;
        return n;
    }
    if (sl->axis == 3) {
        for (int k = 1; k <= (W > 1 ? 4 : 8); k++)
            if ((int64_t)(k - 1) * W < e) vals[n++] = (int64_t)k * W;
        return n;
    }
    int64_t cols = tile_partial(sp, partial, slot, 3, 3);
    int64_t vecs = (cols + W - 1) / W;
    for (int64_t r = 1; r <= 8 && r <= e; r++)
        if (r * vecs <= space_window_budget(sp, W)) vals[n++] = r;
    return n;
}

int space_legal_values(const space *sp, int slot, const space_sched *partial, int64_t *vals)
{
    if (slot < 0 || slot >= sp->n_slot) return TLM_EINVAL;
    const space_slot *sl = &sp->slot[slot];
    int n = 0;
    const int64_t *lst = NULL;
    int nl = 0;
    switch (sl->kind) {
    case SLOT_TILE: {
        if (sp->sketch == SKETCH_CPU_WINDOW) return window_tiles(sp, slot, partial, vals);
        int64_t rem = rem_extent(sp, partial, slot, sl->axis, sl->level);
        int64_t cap = rem;
        bool cpu = sp->sketch == SKETCH_CPU_TILE;
        bool spatial = sl->axis < sp->n_spatial;
        /* the register tile: at most CPU_INNER_MAX, and on the vector axis possibly past what
         * is left (a padded last vector row, space_pad_limit bounds it) */
        if (cpu && spatial && sl->level == 3)
            cap = cpu_inner_cap(sp, space_cpu_vec_axis(sp, partial, slot), sl->axis);
        int64_t cand[SPACE_MAX_VALUES];
        int nc = cpu && spatial ? cpu_ladder(sp, partial, slot, sl->axis, sl->level, rem, cap, cand)
                 : cpu          ? cpu_red_ladder(rem, cap, cand)
                                : divisors(rem, cap, cand);
        for (int i = 0; i < nc; i++) {
            int64_t v = cand[i];
            bool ok = true;
            if (cpu && spatial && sl->level == 3) {
                int budget = sp->tgt.cpu.vector_registers > 16 ? 28 : 12;
                ok = cpu_regs(sp, partial, slot, sl->axis, v) <= budget;
            } else if (cpu && spatial && sl->level == 2) {
                ok = cpu_accbuf(sp, partial, slot, sl->axis, v) <= CPU_ACC_BUF_MAX;
            } else if (!cpu && spatial && sl->level == 2) {
                ok = gpu_prod(sp, partial, slot, sl->axis, 2, v, true) <=
                     sp->tgt.gpu.max_threads_per_block;
            } else if (!cpu && spatial) {
                ok = gpu_prod(sp, partial, slot, sl->axis, sl->level, v, false) <= GPU_ACC_MAX;
            }
            if (ok) vals[n++] = v;
        }
        return n;
    }
    case SLOT_PARALLEL:
        if (sp->sketch == SKETCH_CPU_ROWS || sp->sketch == SKETCH_CPU_WINDOW) {
            vals[0] = 0, vals[1] = 1;
            return 2;
        }
        vals[0] = 0, vals[1] = 1, vals[2] = 2;
        return 3;
    case SLOT_VECTORIZE:
        vals[n++] = 0, vals[n++] = 1;
        if (sp->sketch == SKETCH_CPU_WINDOW && window_channels_ok(sp))
            vals[n++] = WINDOW_VEC_CHANNELS;
        /* any longer spatial axis may carry the vectors when there is a reduction (the
         * register tile's broadcast-FMA outer product works along any of them) */
        if (sp->sketch == SKETCH_CPU_TILE && sp->n_reduce > 0)
            for (int x = sp->n_spatial - 2; x >= 0; x--)
                if (anchor(sp)->extent[x] >= CPU_VEC_AXIS_MIN) vals[n++] = sp->n_spatial - x;
        return n;
    case SLOT_STAGE: {
        vals[n++] = 0;
        space_sched tmp = *partial;
        tmp.v[slot] = 1;
        tmp.n = slot + 1;
        if (space_gpu_smem_bytes(sp, &tmp) <= sp->tgt.gpu.smem_per_block) vals[n++] = 1;
        return n;
    }
    case SLOT_PACK: {
        vals[n++] = 0;
        bool vec = false;
        for (int i = 0; i < slot; i++)
            if (sp->slot[i].kind == SLOT_VECTORIZE) vec = partial->v[i] != 0;
        int64_t f = space_cpu_pack_floats(sp, partial, slot);
        if (vec && f > 0 && f <= CPU_PACK_MAX) vals[n++] = 1;
        return n;
    }
    case SLOT_VEC_LOAD:
        vals[n++] = 1;
        if (space_get(sp, partial, SLOT_STAGE, 0)) vals[n++] = 2, vals[n++] = 4;
        return n;
    case SLOT_UNROLL:
        if (sp->sketch == SKETCH_CPU_TILE) lst = unroll_cpu, nl = 4;
        else if (sp->sketch == SKETCH_GPU_TILE) lst = unroll_gpu, nl = 5;
        else lst = unroll_rows, nl = 3;
        memcpy(vals, lst, sizeof(int64_t) * (size_t)nl);
        return nl;
    case SLOT_WARP_M:
    case SLOT_WARP_N:
    case SLOT_WARPS_M:
    case SLOT_WARPS_N:
    case SLOT_BLOCK_K:
    case SLOT_PIPELINE:
    case SLOT_SWIZZLE: return mma_legal(sp, slot, partial, vals);
    case SLOT_ROWS:
        return divisors(sp->rows, ROWS_MAX, vals);
    case SLOT_THREADS:
        for (int64_t t = 32; t <= sp->tgt.gpu.max_threads_per_block; t *= 2) vals[n++] = t;
        return n;
    default: return TLM_EINVAL;
    }
}

int space_check(const space *sp, const space_sched *s, tlm_error *err)
{
    if (s->n != sp->n_slot)
        return tlm_err_set(err, TLM_EINVAL, "schedule",
                           "expected %d decisions for sketch %s, got %d", sp->n_slot,
                           space_sketch_name(sp->sketch), s->n);
    int64_t *vals = malloc(sizeof(int64_t) * SPACE_MAX_VALUES);
    if (!vals) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = 0;
    for (int i = 0; i < sp->n_slot && rc == 0; i++) {
        int n = space_legal_values(sp, i, s, vals);
        bool ok = false;
        for (int k = 0; k < n && !ok; k++) ok = vals[k] == s->v[i];
        if (!ok) {
            char allowed[256] = "";
            size_t len = 0;
            for (int k = 0; k < n && len < sizeof allowed - 24; k++)
                len += (size_t)snprintf(allowed + len, sizeof allowed - len, "%s%lld",
                                        k ? "," : "", (long long)vals[k]);
            if (n > 0 && len >= sizeof allowed - 24) snprintf(allowed + len, 8, ",...");
            rc = tlm_err_set(err, TLM_EINVAL, sp->slot[i].name,
                             "value %lld is not legal here; allowed: {%s}",
                             (long long)s->v[i], allowed);
        }
    }
    free(vals);
    return rc;
}

static uint64_t rng_next(uint64_t *x)
{
    uint64_t v = *x ? *x : 0x9E3779B97F4A7C15ull;
    v ^= v >> 12;
    v ^= v << 25;
    v ^= v >> 27;
    *x = v;
    return v * 0x2545F4914F6CDD1Dull;
}

void space_sample(const space *sp, uint64_t *rng, space_sched *out)
{
    int64_t *vals = malloc(sizeof(int64_t) * SPACE_MAX_VALUES);
    memset(out, 0, sizeof *out);
    out->n = sp->n_slot;
    for (int i = 0; i < sp->n_slot; i++) {
        int n = vals ? space_legal_values(sp, i, out, vals) : 0;
        out->v[i] = n > 0 ? vals[rng_next(rng) % (uint64_t)n] : 1;
    }
    free(vals);
}

/* Tiles the first thread runs when `tiles` go in tasks of `per` to `cores` threads under
 * OpenMP's static split (the first threads take whole tasks: the busiest). */
static int64_t busiest_tiles(int64_t tiles, int64_t per, int64_t cores)
{
    return ceil_div(ceil_div(tiles, per), cores) * per;
}

/* Largest legal value <= want (legal values ascend; the first is always minimal). */
static int64_t pick_le(const int64_t *vals, int n, int64_t want)
{
    int64_t best = vals[0];
    for (int k = 0; k < n; k++)
        if (vals[k] <= want) best = vals[k];
    return best;
}

/* The largest reduction chunk of vals up to v whose weight panel (chunk x panel bytes) is at
 * most limit bytes, a divisor of the extent e where one fits; -1 where none fits */
static int64_t chunk_within(const int64_t *vals, int n, int64_t v, int64_t e, int64_t panel,
                            int64_t limit)
{
    int64_t best = -1;
    for (int k = 0; k < n && vals[k] <= v; k++)
        if (vals[k] * panel <= limit && (e % vals[k] == 0 || best < 0 || e % best != 0))
            best = vals[k];
    return best;
}

/* The vector axis' register tile: the most vector lanes (power-of-two factor, up to `lanes`),
 * then the largest tile up to max_vectors vectors. */
static int64_t pick_vec(const int64_t *vals, int n, int lanes, int max_vectors)
{
    int64_t best = vals[0], bw = 0;
    for (int k = 0; k < n; k++) {
        int64_t v = vals[k], w = 1;
        if (v > max_vectors * lanes) continue;
        while (w < lanes && v % (w * 2) == 0) w *= 2;
        if (w > bw || (w == bw && v > best)) best = v, bw = w;
    }
    return best;
}

/* The vector axis' register row in the default: pick_vec's, except where the padding leaves
 * it a single vector of an output row that needs more (77 columns in 16 lanes: 32, 48 and 64
 * pad it past space_pad_limit's 15 %) and each broadcast would feed one FMA: with 32
 * registers the whole padded row then, 5 to 7 vectors (cpu_inner_cap), under 3-4 register
 * rows. Only for a GEMM's output rows (dense, batch_matmul: along the last axis), where it
 * was measured (AVX-512, 2 threads, old / new alternated): SD 1.5's cross-attention scores
 * (8 x 4096 x 77, K = 40; 8 rows x 16 columns against 4 x 80) 1.25-1.34x, CLIP's text
 * attention scores (12 x 77 x 77 x 64) 1.14-1.15x, a 32 x 77 x 77 x 128 one 1.10-1.12x, a
 * 1024 x 100 x 512 dense (3 x 112) 1.08-1.15x, 4096 x 77 x 256 1.00x. Convs lost: a 1x1's 80
 * filters as 5 vectors under 4 output columns (EfficientNet-B0's 240 -> 80 and 480 -> 80 at
 * 14 x 14) 0.77x and 0.88-0.91x; 1x1s at 10 x 10 (their 100 positions one axis, read in
 * place: 3 x 112 against 8 x 16) 0.58-0.83x. */
static int64_t pick_vec_row(const space *sp, const int64_t *vals, int n, int max_vectors, int vx)
{
    int lanes = vec_lanes(sp);
    int64_t t = pick_vec(vals, n, lanes, max_vectors);
    int64_t vecs = ceil_div(anchor(sp)->extent[vx], lanes);
    ir_op op = sp->g->wl.op;
    if (vx != sp->n_spatial - 1 || (op != IR_OP_DENSE && op != IR_OP_BATCH_MATMUL) ||
        sp->tgt.cpu.vector_registers <= 16 || t != lanes || vecs <= max_vectors || vecs > 7)
        return t;
    for (int k = 0; k < n; k++)
        if (vals[k] == vecs * lanes) return vals[k];
    return t;
}

/* Flat stride of spatial axis x in load node e (0: the load does not move along x). */
static int64_t load_coef(const space *sp, const ir_expr *ld, int x)
{
    const ir_tensor *t = &sp->g->tensor[ld->tensor];
    int64_t st = 1, coef = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        coef += ld->idx[d].coef[x] * st;
        st *= t->shape[d];
    }
    return coef;
}

static bool intel_host(const space *sp);
static bool zen4_host(const space *sp);

/* The default vector axis (CPU_TILE with a reduction), by a small model of each candidate:
 * lane use (its extent over the extent rounded up to whole vectors) times what feeding its
 * vectors costs — a load contiguous along it or a broadcast 1; a strided operand the packing
 * gathers r / (r + W/2), where r (capped at 256) is how many outputs reuse each gathered
 * element (the extents of the axes it does not depend on), and 0.6 more along the columns
 * where it copies runs of fewer than 8 floats (MobileNetV2's stem 2.2x along F on AVX-512,
 * 1.4x on AVX2; ConvNeXt's 4x4 s4 stem 1.24x / 1.04x; ResNet-50's 1x1 s2 downsamples
 * 1.0-1.24x on AVX-512); a per-lane gather 0.25 — times
 * 0.45 when the output is not contiguous along it (a transposing write-back and a broadcast
 * per register row). The constants are fitted to single-core timings of both paths on AVX2
 * and AVX-512 (stems, stride-2 and 1x1 convs, 7x7 maps): along F our conv runs at 0.55-0.85x
 * of the same conv along OW at equal lane use, so F wins only where OW rows fill few lanes
 * (1x1 on a 20x20 map: 2x; 5-wide maps: 5-7x). The last axis wins ties. Returns the
 * VECTORIZE value. */
static int64_t default_vectorize(const space *sp, int vslot, int64_t *vals)
{
    const ir_stage *a = anchor(sp);
    int ns = sp->n_spatial;
    space_sched none;
    memset(&none, 0, sizeof none);
    int n = space_legal_values(sp, vslot, &none, vals);
    int lanes = vec_lanes(sp);
    int64_t best = 1;
    double best_score = -1;
    /* a padded windowed conv deep enough for the direct micro-kernel (the vector axis it needs
     * is checked per candidate, below) */
    int deep = 0;
    int64_t K = 1;
    for (int r = ns; r < ns + sp->n_reduce; r++) {
        deep += a->extent[r] > 1;
        K *= a->extent[r];
    }
    bool padded = false;
    for (int id = 0; id < a->n_expr; id++) padded |= a->expr[id].kind == IR_E_SELECT;
    const bool windowed = deep >= 3 && K >= 64 && padded;
    const ir_tensor *o = &sp->g->tensor[sp->g->output];
    for (int k = 0; k < n; k++) {
        if (vals[k] < 1) continue;
        int x = ns - (int)vals[k];
        int64_t e = a->extent[x];
        /* lane use as codegen would get it: the register row pick_vec takes on this axis, its
         * vector width (a 20-wide row gets 8-lane vectors on AVX-512: half the FMA width) and
         * the padding of the last row */
        space_sched first;
        memset(&first, 0, sizeof first);
        first.n = sp->n_slot;
        first.v[vslot] = vals[k];
        int64_t *row = malloc(sizeof(int64_t) * SPACE_MAX_VALUES);
        int64_t t = 1;
        if (row) {
            int nr = cpu_ladder(sp, &first, vslot + 1, x, sp->s_levels - 1, e, CPU_INNER_MAX, row);
            int budget = sp->tgt.cpu.vector_registers > 16 ? 28 : 12;
            t = nr > 0 ? pick_vec(row, nr, lanes, budget >= 24 ? 4 : 2) : 1;
            free(row);
        }
        int w = space_cpu_tile_lanes(sp, t, true);
        double score = (double)e / (double)(((e + t - 1) / t) * t) * (double)w / lanes;
        /* On 16 registers a conv whose output columns take a register row of one vector (the
         * ladder of a 7 x 7 plane's 49 positions stops at 8) and no second output row (a 1x1's
         * positions are one axis) runs 8 filter rows x 1 vector: a broadcast per FMA, where
         * along F 2 vectors x 6 columns load 2 and broadcast 6 per 12. ResNet-50's, MobileNetV2's
         * and EfficientNet-B0's 1x1 convs at 7 x 7 on AVX2 (Xeon, 2 threads, one process,
         * alternated): 512 -> 2048 1.35x along F (batch 8 1.18x), 320 -> 1280 1.17x (1.25x),
         * 192 -> 1152 1.35x (1.19x), 160 -> 960 1.17x (1.14x); at 14 x 14 (two-vector rows)
         * F was 0.97-1.10x and at 28 and 56 the columns won 1.12-1.14x: they keep them. */
        if (x == o->ndim - 1 && x > 0 && a->extent[x - 1] == 1 && sp->g->wl.op == IR_OP_CONV2D &&
            sp->tgt.cpu.vector_registers <= 16 && t <= lanes && e > lanes)
            score *= 0.6;
        for (int id = 0; id < a->n_expr; id++) {
            const ir_expr *ld = &a->expr[id];
            if (ld->kind != IR_E_LOAD) continue;
            int64_t coef = load_coef(sp, ld, x);
            if (coef == 0 || coef == 1) continue;
            int pid = space_cpu_packable(sp, x, id) ? id : -1;
            for (int j = 0; j < a->n_expr && pid < 0; j++)
                if (a->expr[j].kind == IR_E_SELECT && a->expr[j].a == id &&
                    space_cpu_packable(sp, x, j))
                    pid = j;
            if (pid < 0) {
                score *= 0.25;
                continue;
            }
            unsigned m = space_expr_axes(sp, pid);
            double r = 1;
            for (int y = 0; y < ns; y++)
                if (!(m & (1u << y))) r *= (double)a->extent[y];
            if (r > 256) r = 256;
            score *= r / (r + 0.5 * lanes);
            /* ... and along the output's columns copies runs of as many floats as a window
             * axis reads contiguously within a stride (a 1x1 conv's stride 2: single floats,
             * a 3x3 stem's stride 2: pairs, a 16x16 patch embedding: 16): short runs are
             * element gathers (the weights' pack along F transposes through registers) */
            if (x != o->ndim - 1) continue;
            int64_t run = 1;
            for (int y = ns; y < ns + sp->n_reduce; y++)
                if (load_coef(sp, ld, y) == 1) {
                    int64_t q = a->extent[y] < coef ? a->extent[y] : coef;
                    if (q > run) run = q;
                }
            /* (on AVX2 a 1x1 conv's single floats stay: along F its 7- and 14-wide maps fill
             * two-vector register rows poorly, 0.78-0.91x) */
            if (run < 8 && (run > 1 || sp->tgt.cpu.vector_registers > 16)) score *= 0.6;
        }
        /* vectors along another axis than the output's last cost a transposing write-back
         * (and, for a conv along F, its weights are packed across F); but with 32 registers a
         * windowed conv's direct micro-kernel (filters x output columns: packed weights
         * loaded, inputs broadcast, the window whole in each chunk) beats an im2col panel
         * per task once the window is deep enough to amortise the write-back (K >= 64):
         * 1.1-1.35x on padded 3x3, dilated, strided and 6x6-stem convs on AVX-512 (the
         * padding is copied in once, see codegen's plan_padcopies), and on AVX2 (16 ymm,
         * 2 vectors x 6 columns) since the tile's statements keep the broadcasts short-lived
         * (codegen's regtile_order): 1.05-1.2x on padded 3x3, 1.4-1.7x on the 6x6 and 7x7
         * stems, 1.6x dilated (one thread, min of 4 rounds). It loses on 1x1 convs, at
         * K = 36, on 1-D convs (1x3: 4-10 %) and on the unpadded 16x16/16 patch embedding
         * (20 %+).
         * Since the weights' pack transposes through registers (codegen's
         * emit_pack_transposed), a conv's channels over an output plane (two axes or more
         * after it) cost less along F: what decides is where the overhead falls. Along F it
         * is the transposing write-back, per output over K = C x KH x KW FMAs; along the
         * columns the input's pack, per input over the F filters reading it. A conv that
         * reduces (K >= 2 F: ResNet's 1x1 256 -> 64, 1024 -> 256, MobileNet's projections)
         * runs 1.1-1.7x faster along F on AVX-512 and 1.05-1.35x on AVX2; one that expands
         * (K <= F / 2: 64 -> 256, 512 -> 2048) 0.7-0.9x, except where its columns waste the
         * lanes (7 columns in 16 lanes: ResNet's layer 4 and MobileNet's last 1x1 convs
         * 1.5-1.6x along F). Zen 5, 2 threads, 60 1x1 and unpadded convs of ResNet-50,
         * MobileNetV2 and the suite, each against the other axis' default. Onto filters
         * that fill one vector or less it stays along the columns (MobileNetV2's 32 -> 16
         * at 112 x 112 1.2x, 1.36x at batch 8; 64 -> 16 at 56 x 56 1.13-1.23x). */
        bool direct = windowed;
        /* ... along F: the window's input (a load over several reduction axes and other
         * spatial axes) is broadcast, it does not move with the vectors */
        for (int id = 0; id < a->n_expr && direct; id++) {
            if (a->expr[id].kind != IR_E_LOAD) continue;
            unsigned m = space_expr_axes(sp, id);
            int nred = 0;
            for (int r = ns; r < ns + sp->n_reduce; r++) nred += (m >> r) & 1u;
            unsigned others = m & ((1u << ns) - 1u) & ~(1u << x);
            if (nred >= 2 && others && load_coef(sp, &a->expr[id], x) != 0) direct = false;
        }
        /* a conv's channels: an output plane after them, and an operand (the input) that
         * the vectors broadcast (a batched GEMM's batch axis moves both operands) */
        bool plane = o->ndim - 1 - x >= 2, broadcast = false;
        for (int id = 0; id < a->n_expr; id++)
            if (a->expr[id].kind == IR_E_LOAD && load_coef(sp, &a->expr[id], x) == 0)
                broadcast = true;
        plane = plane && broadcast;
        /* a batched GEMM whose operand along the output's columns is strided too
         * (transpose_b: the zoo's attention context V^T P^T at 64 x seq x seq) packs one
         * operand transposed either way, so only the write-back is left to weigh: along the
         * rows (64: whole vectors) 1.1-1.7x on AVX-512 and 1.0-1.15x on AVX2 at 33-384
         * tokens (Zen 5, interleaved; seq x seq scores unchanged; Stable Diffusion's 4096 x
         * 77 x 40 cross-attention scores 0.97x on AVX2, so a reduction of a quarter of the
         * rows at least; 37 rows would pad 3 vectors). Not a dense's (no batch axis): its B is
         * a weight a plan packs once, free along the columns (0.93-1.06x); nor along a batch
         * axis, which moves both operands. */
        bool both = false, apart = true; /* apart: no operand moves along both axes (a conv's
                                           * input moves along its rows and columns) */
        for (int id = 0; id < a->n_expr && !plane && broadcast && ns >= 3 && x != o->ndim - 1;
             id++) {
            if (a->expr[id].kind != IR_E_LOAD) continue;
            int64_t c = load_coef(sp, &a->expr[id], ns - 1);
            both |= c != 0 && c != 1 && space_cpu_packable(sp, ns - 1, id);
            apart &= c == 0 || load_coef(sp, &a->expr[id], x) == 0;
        }
        /* the write-back amortised over a long reduction, the rows whole vectors */
        both &= apart && 4 * K >= e && e % lanes == 0;
        /* A reducing conv's F lead (AVX-512) holds while the input it broadcasts is near
         * (within a plan it comes from the layer before, in L2 and L3): one larger than twice
         * the cores' L2 arrives from further out, and its columns, vector loads each, wait
         * less on it than a broadcast per register row. ResNet-50 batch 8 (inputs 6.4-25.7
         * MB; 2 x 1 MB of L2) along the columns, in a plan: 1x1 256 -> 64 at 56 x 56 1.26x,
         * 256 -> 128 1.31x, 512 -> 128 at 28 x 28 1.26x, 1024 -> 256 at 14 x 14 1.08x, the
         * plan 1.02x; EfficientNet-B0's 240 -> 40 at 28 x 28 batch 8 (6 MB) 1.05x. Below the
         * bound F stays ahead (its 480 -> 80 at 14 x 14, 3 MB, 0.96x along the columns;
         * MobileNetV2's 384 -> 64, 2.4 MB, 0.95x). On AVX2 along the columns ResNet-50's
         * and MobileNetV2's batch-8 plans lost 1 %. (Zen 5, interleaved plans.) */
        bool reduces = plane && K >= 2 * e && e > lanes;
        int64_t plane_points = 1; /* the output positions after the vector axis */
        for (int y = x + 1; y < ns; y++)
            plane_points *= a->extent[y];
        if (reduces && sp->tgt.kind == TARGET_CPU && sp->tgt.cpu.l2_bytes > 0 &&
            sp->tgt.cpu.vector_registers > 16) {
            int64_t cores = sp->tgt.cpu.cores > 0 ? sp->tgt.cpu.cores : 1, in = 0;
            for (int id = 0; id < a->n_expr; id++)
                if (a->expr[id].kind == IR_E_LOAD && load_coef(sp, &a->expr[id], x) == 0) {
                    int64_t bytes = 4 * ir_tensor_numel(&sp->g->tensor[a->expr[id].tensor]);
                    if (bytes > in) in = bytes;
                }
            reduces = in <= 2 * cores * sp->tgt.cpu.l2_bytes;
            /* ... and on Intel only at planes under 28 x 28: along the columns a plane of
             * 784 positions or more streams its input rows in vector loads that the
             * prefetchers follow, where the broadcasts along F wait on them. Along the
             * columns / along F alternated on a Xeon (family 6 model 167, 2 threads, 2 MiB
             * of L2), inputs from DRAM as in a plan: ResNet-50's 256 -> 64 at 56 x 56
             * 1.76-1.83x, 256 -> 128 1.29x, 512 -> 128 at 28 x 28 1.52x, 512 -> 256
             * 1.20-1.25x, MobileNetV2's 144 -> 32 and 192 -> 32 at 28 x 28 1.27-1.70x (batch
             * 8 1.75-2.0x); in cache 0.98-1.20x. At 14 x 14 F keeps the lead in cache
             * (1.05-1.3x) and loses it from DRAM (0.83-1.0x), and at 7 x 7 it wins both ways
             * (about 2x): those stay along F. */
            if (intel_host(sp) && plane_points >= 784) reduces = false;
        }
        /* ... and on a Zen 4 host (64-byte loads split in two; not measured on Intel, Zen 5
         * keeps the bound above, and named targets keep the rule) a pointwise conv over a
         * plane of at most 14 x 14 positions with a reduction of 256 channels or more goes
         * along F whatever its input's size or its expansion: its 196-point rows fill the
         * column tiles poorly (6 tiles of 32 and one of 4) and the reduction amortises the
         * transposing write-back. ResNet-50 at batch 8 on AVX-512, in its plan against the
         * previous default (along the columns), alternated on a Zen 4 (2 threads): layer 3's
         * 1024 -> 256 1.12-1.16x, 256 -> 1024 with the residual 1.14-1.20x, layer 4's first
         * 1024 -> 512 1.16x (two runs); EfficientNet-B0's 672 -> 112 1.06-1.09x. Reductions of
         * 64-112 channels (MobileNetV2's and EfficientNet-B0's 14 x 14 expansions) lost
         * 0.58-0.96x along F, and on AVX2 the 256 -> 1024 gained only 1.04-1.06x (its stride-2
         * downsample 0.89x): they keep the rule. At batch 1 (the 256 -> 1024 only) a tie,
         * 0.92-1.06x over two runs of its plan. */
        if (plane && K >= 256 && K == a->extent[ns] && plane_points <= 196 &&
            sp->tgt.kind == TARGET_CPU && sp->tgt.cpu.vector_registers > 16 && zen4_host(sp))
            reduces = true;
        if (x != o->ndim - 1)
            score *= direct || reduces ? 1.1
                     : plane           ? 0.6
                     : both            ? 1.0
                                       : 0.45;
        if (score > best_score * 1.0001) best_score = score, best = vals[k];
    }
    return best;
}

/* A host whose 64-byte vector loads run at full rate where Zen 4 splits them in two: AMD
 * from Zen 5 (family 0x1a) on; the narrow depthwise columns below were fitted on Zen 4, and
 * on Zen 5 the weighed ones beat them (see window_default_tile). Named targets (no host
 * identity) keep the narrow rule. */
static bool full_width_loads(const space *sp)
{
    return !strcmp(sp->tgt.cpu.vendor, "AuthenticAMD") && sp->tgt.cpu.family >= 0x1a;
}

/* An AMD host before Zen 5 (family below 0x1a), whose 64-byte vector loads run at half rate:
 * the pointwise rule fitted on a Zen 4 (default_vectorize). */
static bool zen4_host(const space *sp)
{
    return !strcmp(sp->tgt.cpu.vendor, "AuthenticAMD") && sp->tgt.cpu.family < 0x1a;
}

/* An Intel host (its own `cpu` target; named targets carry no vendor): the rules fitted on a
 * Xeon below (a 1-D conv's weight panel, blocks storing long rows). */
static bool intel_host(const space *sp)
{
    return !strcmp(sp->tgt.cpu.vendor, "GenuineIntel");
}

/* A max or average pool of stride 2 or more whose output rows are wider than 32 points: its
 * register tiles take one output row. Default tiles (rows as below) against the same columns
 * in one row, alternated (ab_kernels, Xeon family 6 model 167, 2 threads; AVX-512 code, then
 * AVX2 code): 3x3 stride 2 from 112 x 112 (ResNet's stem pool, batch 8) 0.68 -> 0.60 ms and
 * 1.17 -> 0.85, at batch 1 1.23x and 1.29x; an average pool from 127 x 127 1.34x and 1.30x,
 * from 112 x 112 1.40x and 1.20x; 3x3 from 147 x 147 (no padding) 1.00x and 1.21x, from 71 x
 * 71 1.09x and 1.15x; 2x2 from 224 x 224 1.18x and 1.21x, from 128 x 128 0.97-1.0x. Narrower
 * rows keep their rows (one row 0.83-0.99x from 55 and 56 wide, 0.94x from 28 wide; 1.06x
 * on AVX2 at batch 8 from 56), as does a stride-1 pool, whose rows share most of their
 * input rows (YOLOv5's 5x5 at 20 x 20: 5 rows 0.024 ms, one 0.048). */
static bool strided_wide_pool(const space *sp)
{
    const ir_workload *w = &sp->g->wl;
    if (w->op != IR_OP_MAX_POOL2D && w->op != IR_OP_AVG_POOL2D) return false;
    int64_t st[2], dl[2];
    window_steps(sp->g, st, dl);
    return st[0] >= 2 && anchor(sp)->extent[3] > 32;
}

/* A depthwise conv on a 32-register target whose 64-byte loads run at half rate (all but Zen
 * 5): its columns the narrowest (window_default_tile, below) */
static bool narrow_depthwise_columns(const space *sp)
{
    return sp->g->wl.op == IR_OP_DEPTHWISE_CONV2D && sp->tgt.cpu.vector_registers > 16 &&
           !full_width_loads(sp);
}

/* A depthwise conv of at most 3x3 taps, stride 2 or more, whose output rows are wider than 32
 * points takes one row a register tile as the strided pools above do, on a target whose
 * depthwise columns are otherwise the narrowest, with the columns that pad least, the widest
 * of those: 3x3 stride 2 from 112 x 112 (MobileNetV2's and
 * EfficientNet-B0's 96 channels, 32) 4 vectors x 1 row against 1 x 8, alternated on a Zen 4
 * (2 threads): 1.28x and 1.20x; from 56 x 56 1.03x; a 5x5 stride 2 keeps its rows (one row
 * no faster from 56 x 56), as does AVX2 (2 vectors x 2 rows ahead of one row). */
static bool strided_wide_depthwise(const space *sp)
{
    const ir_stage *a = anchor(sp);
    if (!narrow_depthwise_columns(sp) || a->extent[4] * a->extent[5] > 9) return false;
    int64_t st[2], dl[2];
    window_steps(sp->g, st, dl);
    return st[0] >= 2 && a->extent[3] > 32;
}

/* CPU_WINDOW's rule of thumb: the columns and rows that pad the output least, the widest
 * (columns up to 4 vectors, rows up to 4 — fewer where the budget says so) among those.
 * A depthwise conv on a 32-register (AVX-512) target takes the narrowest columns instead,
 * and so up to 8 rows: per FMA it loads span / (rows x KH) input vectors and 1 / vectors
 * weight broadcasts, and there the 64-byte input loads are the dear ones (Zen 4: one a
 * cycle, as many as the FMAs; a broadcast is a 4-byte load). 7x7 at 56x56 on 2 threads:
 * 4 vectors x 4 rows 0.303 ms, 1 x 8 0.213 ms (oneDNN nChw16c 0.23); on AVX2 (32-byte
 * loads) the widest stays ahead (3 x 4 0.259 ms, 1 x 8 0.285). Where 64-byte loads run at
 * full rate (full_width_loads: Zen 5) the weighed columns below win instead, old vs new
 * interleaved on Zen 5: 7x7 at 56 x 56 0.126 -> 0.096 ms (4 x 4), at 28 x 28 1.18x, 3x3 at
 * 56 x 56 1.21x, 5x5 at 28 x 28 1.09-1.12x, stride 2 1.05-1.10x; 14- and 7-wide planes
 * unchanged (one vector either way). */
static int64_t window_default_tile(const space *sp, const space_sched *s, int slot,
                                   const int64_t *vals, int n)
{
    const space_slot *sl = &sp->slot[slot];
    int64_t e = anchor(sp)->extent[sl->axis];
    if (space_window_channels(sp, s, slot)) {
        /* along channels: the columns that compute the fewest points (counting the last
         * tile's overlap), the widest among those; one row (a 7-wide 7x7 in 7 x 2: 0.985x on
         * AVX-512; a 5x5 0.81x on AVX2) */
        int64_t best = vals[0];
        for (int k = 0; k < n && sl->axis == 3; k++)
            if (ceil_div(e, vals[k]) * vals[k] <= ceil_div(e, best) * best) best = vals[k];
        return best;
    }
    int W = space_window_lanes(sp, s, slot);
    int64_t cap = sl->axis == 3 ? 4 * W : 4;
    bool narrow = sl->axis == 3 && narrow_depthwise_columns(sp) && !strided_wide_depthwise(sp);
    /* rows: at least enough for the accumulators (rows x vectors) to cover the FMA latency
     * (2 pipes x 4 cycles) where the plane allows; up to 8 under a single vector (a 14-wide
     * 7x7 depthwise plane takes 7 rows, 109 -> 190 GFLOP/s), 6 under two (the same plane on
     * AVX2, two 8-lane vectors: 5 rows, 0.079 -> 0.065 ms; 2 rows padded none but left 4
     * accumulators) */
    if (sl->axis != 3 && (strided_wide_pool(sp) || strided_wide_depthwise(sp)))
        return vals[0]; /* one row: the least legal (vals ascend from 1 where 1 is legal) */
    int64_t least = 1;
    if (sl->axis != 3) {
        int64_t cols = 1;
        for (int i = 0; i < slot; i++)
            if (sp->slot[i].kind == SLOT_TILE && sp->slot[i].axis == 3) cols = s->v[i];
        int64_t nv = ceil_div(cols, W);
        if (nv == 1) cap = 8;
        if (nv == 2) cap = 6;
        least = nv >= 2 ? ceil_div(8, nv) : 1;
        if (least > e) least = 1;
    }
    /* A depthwise conv on a 16-register (AVX2) target weighs padding against width: an FMA
     * there takes its weight from a broadcast shared by the row's vectors, so a tile of nv
     * vectors costs (1 + 1 / nv) loads per FMA and the columns are scored by padded
     * vectors x that. 7x7 at 56x56, 2 threads, Zen 4: 1 x 8 (no padding) 0.280 ms, 4 x 2
     * (8 padded columns) 0.239, 2 x 4 0.252. */
    bool weigh = sl->axis == 3 && sp->g->wl.op == IR_OP_DEPTHWISE_CONV2D && !narrow && W > 1;
    int64_t best = vals[0], best_pad = -1;
    double best_cost = -1;
    for (int k = 0; k < n; k++) {
        int64_t v = vals[k];
        if (v > cap) continue;
        if (v < least && vals[n - 1] >= least) continue;
        if (weigh) {
            int64_t nv = ceil_div(v, W);
            double cost = (double)(ceil_div(e, v) * nv) * (1.0 + 1.0 / (double)nv);
            if (best_cost < 0 || cost <= best_cost * 1.001) /* ties: the wider */
                best = v, best_cost = cost;
            continue;
        }
        int64_t pad = ceil_div(e, v) * v - e;
        if (sl->axis == 3) pad = ceil_div(pad, W); /* whole padded vectors */
        if (best_pad < 0 || pad < best_pad || (pad == best_pad && !narrow))
            best = v, best_pad = pad;
    }
    return best;
}

bool space_window_pointwise(const space *sp)
{
    const ir_stage *a = anchor(sp);
    const ir_workload *w = &sp->g->wl;
    return sp->sketch == SKETCH_CPU_WINDOW && a->extent[4] == 1 && a->extent[5] == 1 &&
           w->stride[0] <= 1 && w->stride[1] <= 1 && w->pad[0] == 0 && w->pad[1] == 0;
}

/* CPU_WINDOW's vector axis: along OW (1), or along channels (WINDOW_VEC_CHANNELS) for a
 * depthwise conv on a 16-register target (AVX2) of 25 taps or more, or whose output rows
 * take between one and two vectors (a 9- to 16-wide row in 8 lanes: along OW every tile pads
 * most of a vector). Per tap the channel form loads one input vector per FMA and no
 * broadcast, and pads no lanes; the plane's transposes in and out cost the same whatever the
 * window, so small windows stay along OW, as do pools (a pool along OW combines each input
 * row's taps once: separable). On 32 registers (AVX-512) the OW form takes up to 8 rows of
 * one 16-lane vector (a 7- or 14-wide plane in one register row) and is ahead everywhere.
 * Default-tile kernels alternated on a Xeon (family 6 model 167, 2 threads; OW / channels
 * time, under 1: OW faster), EfficientNet's and MobileNet's shapes at batch 1, SiLU fused:
 * AVX-512 code 5x5 at 7 (1152 channels) 0.57, 3x3 at 7 0.48, 5x5 at 14 0.40, 3x3 at 14
 * 0.33, 5x5 and 3x3 at 28 0.74-0.78, 3x3 at 56 0.69, 5x5 stride 2 to 28 and 7 0.70 and 0.51,
 * 7x7 at 7, 14, 28 0.70, 0.53, 0.90; AVX2 code 5x5 at 7 1.0-1.17, 3x3 at 7 0.94, 5x5 at 14
 * 1.33, 3x3 at 14 1.43-1.50, 3x3 stride 2 to 14 1.42, 7x7 at 14 and 28 1.34 and 1.08, 5x5
 * and 3x3 at 28 0.95-0.97, 3x3 at 56 0.87 (earlier, on AVX2: a 5x5 max pool 0.65x).
 * Output rows narrower than a vector go along channels on either ISA, and on AVX-512 the
 * ones up to half a vector (7 wide) whatever the window, 14 wide from 49 taps, since the
 * channel form packs and stores such planes by transposes in memory order rather than point
 * by point or row by row (gen_window_channels): alternated on a Zen 4 (family 25 model 17, 2
 * threads; channels / OW speedup), batch 1, AVX-512 code: 5x5 at 7 (1152 channels) 1.65, 3x3
 * at 7 (960) 1.35-1.46, 7x7 at 7 (768) 1.78, 3x3 and 5x5 stride 2 to 7 1.25-1.49, 7x7 at 14
 * (384) 1.16, but 5x5 at 14 0.97, 3x3 at 14 0.72-0.83; AVX2 code 3x3 at 7 1.46, 3x3
 * stride 2 to 7 1.71-1.82 (both along OW before). */
static int64_t window_default_vec(const space *sp, int64_t want, const int64_t *vals, int n)
{
    for (int k = 0; k < n && want >= 1; k++) /* the caller's vector axis, when it is legal */
        if (vals[k] == want) return want;
    const ir_stage *a = anchor(sp);
    bool dw = sp->g->wl.op == IR_OP_DEPTHWISE_CONV2D;
    int64_t taps = a->extent[4] * a->extent[5], OW = a->extent[3];
    int L = vec_lanes(sp);
    bool ch = vals[n - 1] == WINDOW_VEC_CHANNELS && dw &&
              (OW < L ? sp->tgt.cpu.vector_registers <= 16 || 2 * OW <= L || taps >= 49
                      : sp->tgt.cpu.vector_registers <= 16 && (taps >= 25 || OW <= 2 * L));
    /* ... but a window under 49 taps whose output rows are one register row of 3 or 4
     * vectors (4 x 2 tiles) stays along OW: 5x5 at 28 x 28 out, alternated on a Xeon (family
     * 6 model 207, 2 threads, AVX2 code, since the stride-2 pack's vector splits and the
     * channel form's row bands): stride 1 (120 channels) 1.11x, stride 2 from 56 (MobileNetV3's
     * 72, EfficientNet's 144) 1.13-1.17x; at 56 out 1.0x, at 14 and 7 out the channels
     * 1.4-2.4x, 7x7 at 28 and 56 the channels 1.08-1.14x */
    if (ch && taps < 49 && OW > 2 * L && OW <= 4 * L) ch = false;
    /* ... and a 1 x 1 window of stride 1 without padding (a squeeze-and-excitation scale)
     * stays along OW, where it is one vectorised loop over each plane (gen_window_pointwise):
     * along channels its transposes cost more than the multiply (on the Zen 4, 1152 x 7 x 7
     * along channels 0.0179 ms on AVX-512 and 0.0112 on AVX2, the loop 0.0029 and 0.0034;
     * 672 x 14 x 14 on AVX2 0.0233 and 0.0068) */
    if (space_window_pointwise(sp)) ch = false;
    return ch ? WINDOW_VEC_CHANNELS : 1;
}

void space_default(const space *sp, space_sched *out)
{
    space_default_vectorized(sp, -1, out);
}

static int64_t flat_coef(const ir_subgraph *g, const ir_stage *a, int id, int x);

/* A kernel without reduction that reads an input across the output's last axis (a transpose):
 * the axis that input runs along (stride 1), or -1. Vectors along the output's last axis
 * would be gathers there. */
int space_cpu_gathered_axis(const space *sp)
{
    const ir_stage *a = anchor(sp);
    int ns = sp->n_spatial, gx = -1;
    if (sp->sketch != SKETCH_CPU_TILE || sp->n_reduce > 0 || ns < 2) return -1;
    for (int id = 0; id < a->n_expr; id++) {
        if (a->expr[id].kind != IR_E_LOAD) continue;
        int64_t cv = flat_coef(sp->g, a, id, ns - 1);
        if (cv == 0 || cv == 1) continue;
        for (int x = 0; x < ns - 1; x++)
            if (flat_coef(sp->g, a, id, x) == 1) gx = x;
    }
    return gx;
}

/* Past half the last-level cache and past 24 MiB a core however large the L3 claims to be
 * (a VM's slice of a shared L3), where the output cannot stay cached for its reader; only
 * there. Alone, a short window's output (ResNet-50's 1x1 convs at batch 8, 64 or 128
 * channels into 256 or 512; a stem) streamed from twice the cores' L2 ran 1.1-1.45x faster,
 * but in a plan the next launch reads that output at once, and the arena hands a launch
 * bytes that earlier launches just wrote or read, so a non-temporal store often meets its
 * line still cached and waits for it to leave. Whole plans, plain vs streamed stores below
 * the bound, alternated on a Xeon (family 6 model 167, 2 threads, 4 rounds): MobileNetV2
 * batch 8 28.0 -> 23.6 ms (its 3x3 stem 2.33 -> 0.87 ms in the plan, 1.2 alone; its readers
 * 1.2-1.9x), ResNet-50 batch 8 231 -> 226 ms. */
bool space_cpu_output_streams(const target *t, int64_t out_bytes)
{
    const int64_t llc = t->cpu.l3_bytes > 0 ? t->cpu.l3_bytes : 8 << 20;
    const int64_t per_core = (int64_t)(t->cpu.cores > 0 ? t->cpu.cores : 1) * (24 << 20);
    return out_bytes > (per_core < llc / 2 ? per_core : llc / 2);
}

/* The window's taps: the product of the reduction axes after the first (a conv's KH x KW;
 * 1 for a pointwise conv, a GEMM or a reduction over one axis). */
static int64_t window_taps(const space *sp)
{
    const ir_stage *a = anchor(sp);
    int64_t taps = 1;
    for (int r = sp->n_spatial + 1; r < sp->n_spatial + sp->n_reduce; r++) taps *= a->extent[r];
    return taps;
}

/* The tasks the tiles decided so far in out cut the output into (a task: the level-3 and
 * level-2 tiles, undecided ones 1), with span times axis ax's to a task. */
static int64_t decided_tasks(const space *sp, const space_sched *out, int ax, int64_t span)
{
    const ir_stage *a = anchor(sp);
    int64_t tasks = 1;
    for (int x = 0; x < sp->n_spatial; x++) {
        int64_t t3 = space_tile(sp, out, x, 3), t2 = space_tile(sp, out, x, 2);
        int64_t t = (t3 > 0 ? t3 : 1) * (t2 > 0 ? t2 : 1) * (x == ax ? span : 1);
        tasks *= ceil_div(a->extent[x], t);
    }
    return tasks;
}

/* The busiest thread's work when the tiles decided in out, with `per` at level 2 along axis
 * ax (undecided tiles 1), cut the output into tasks that OpenMP's static split hands out in
 * order, the last axis fastest (as codegen numbers them): the output points of its tasks,
 * those of the vector axis vx counted in whole vectors of `lanes` (a masked last vector costs
 * a whole one). -1 past 4096 tasks, whose split is even enough. */
static int64_t busiest_work(const space *sp, const space_sched *out, int ax, int64_t per, int vx,
                            int lanes, int cores)
{
    const ir_stage *a = anchor(sp);
    const int ns = sp->n_spatial;
    int64_t blk[IR_MAX_AXES], cnt[IR_MAX_AXES], tasks = 1;
    for (int x = 0; x < ns; x++) {
        int64_t t3 = space_tile(sp, out, x, 3), t2 = x == ax ? per : space_tile(sp, out, x, 2);
        blk[x] = (t3 > 0 ? t3 : 1) * (t2 > 0 ? t2 : 1);
        cnt[x] = ceil_div(a->extent[x], blk[x]);
        tasks *= cnt[x];
        if (tasks > 4096) return -1;
    }
    int64_t worst = 0, at = 0;
    for (int c = 0; c < cores; c++) {
        const int64_t mine = tasks / cores + (c < tasks % cores);
        int64_t work = 0;
        for (int64_t t = at; t < at + mine; t++) {
            int64_t rem = t, points = 1;
            for (int x = ns - 1; x >= 0; x--) {
                const int64_t j = rem % cnt[x], left = a->extent[x] - j * blk[x];
                int64_t cov = left < blk[x] ? left : blk[x];
                if (x == vx) cov = ceil_div(cov, lanes) * lanes;
                points *= cov;
                rem /= cnt[x];
            }
            work += points;
        }
        at += mine;
        if (work > worst) worst = work;
    }
    return worst;
}

/* A dense layer's rows in one block (the tiles decided in out) with an A over half of L2 and a
 * B over 8 times the cores' L2: see the prefill rule in default_impl. */
static bool prefill_dense(const space *sp, const space_sched *out, int64_t cores)
{
    const ir_stage *a = anchor(sp);
    const int64_t l2 = sp->tgt.cpu.l2_bytes > 0 ? sp->tgt.cpu.l2_bytes : 1 << 20;
    const int64_t M = a->extent[0], N = a->extent[1], K = a->extent[2];
    return space_tile(sp, out, 0, 3) * space_tile(sp, out, 0, 2) >= M && 2 * 4 * M * K > l2 &&
           4 * K * N > 8 * cores * l2;
}

/* A block of up to `want` units along axis ax (level 2), each unit unit_floats accumulators:
 * as many as the accumulator block holds (CPU_ACC_BUF_MAX), halved until every core has two
 * tasks */
static int64_t block_within(const space *sp, const space_sched *out, int ax, int64_t want,
                            int64_t unit_floats, int cores)
{
    int64_t cap = want;
    if (cap > CPU_ACC_BUF_MAX / unit_floats) cap = CPU_ACC_BUF_MAX / unit_floats;
    while (cap > 1 && decided_tasks(sp, out, ax, cap) < 2 * cores) cap = ceil_div(cap, 2);
    return cap;
}

static void default_impl(const space *sp, int64_t want, const space_sched *given, int n_given,
                         space_sched *out);

void space_default_vectorized(const space *sp, int64_t want, space_sched *out)
{
    default_impl(sp, want, NULL, 0, out);
}

void space_default_given(const space *sp, const space_sched *given, int n, space_sched *out)
{
    if (n <= 0 || !given) {
        default_impl(sp, -1, NULL, 0, out);
        return;
    }
    if (n > sp->n_slot) n = sp->n_slot;
    /* a given vector axis: the rule of thumb for that axis, whose tiles belong to it (the
     * default's own axis gives the default) */
    default_impl(sp, sp->slot[0].kind == SLOT_VECTORIZE ? given->v[0] : -1, given, n, out);
}

static void default_impl(const space *sp, int64_t want, const space_sched *given, int n_given,
                         space_sched *out)
{
    int64_t *vals = malloc(sizeof(int64_t) * SPACE_MAX_VALUES);
    memset(out, 0, sizeof *out);
    out->n = sp->n_slot;
    const ir_stage *a = anchor(sp);
    int ns = sp->n_spatial;
    int cores = sp->tgt.kind == TARGET_CPU && sp->tgt.cpu.cores > 0 ? sp->tgt.cpu.cores : 1;
    int lanes = vec_lanes(sp);
    /* CPU register tile: choose the vector axis' row first (most lanes, up to 4 vectors), then
     * give the other axes what the register budget leaves for it. */
    /* BLIS-like micro-tiles: AVX2 (16 ymm, budget 12) 6 rows x 2 vectors, AVX-512 (32 zmm,
     * budget 28) 6 rows x 4 vectors */
    int64_t vec_vectors = 1, nonlast = 1, vectorize = 1;
    bool rows8 = false; /* a conv's register rows: 8 columns (see the vector axis' rule) */
    bool rows_block = false; /* a conv's block took several output rows (level 2) */
    bool gemv = false; /* a single register row: the matrix is streamed */
    int budget = sp->tgt.cpu.vector_registers > 16 ? 28 : 12;
    int max_vectors = budget >= 24 ? 4 : 2;
    int vx = ns - 1; /* the vector axis */
    /* a transpose's own axis (1, the default's) keeps its rule; vectors asked along another
     * axis get the plain one */
    int gx = want > 1 ? -1 : space_cpu_gathered_axis(sp);
    /* a transpose's register tile side (below), 0 where its rows are shorter */
    int64_t tw = vec_lanes(sp) >= 16 ? 16 : 8;
    if (gx >= 0 && tw == 16 && (a->extent[vx] % 16 || a->extent[gx] % 16)) tw = 8;
    if (gx < 0 || a->extent[vx] < tw || a->extent[gx] < tw) tw = 0;
    if (sp->sketch == SKETCH_CPU_TILE && vals) {
        space_sched first;
        memset(&first, 0, sizeof first);
        first.n = sp->n_slot;
        if (sp->n_reduce > 0 && sp->slot[0].kind == SLOT_VECTORIZE) {
            vectorize = default_vectorize(sp, 0, vals);
            if (want >= 1) { /* the caller's vector axis, when it is legal */
                space_sched none;
                memset(&none, 0, sizeof none);
                int n = space_legal_values(sp, 0, &none, vals);
                for (int k = 0; k < n; k++)
                    if (vals[k] == want) vectorize = want;
            }
            first.v[0] = vectorize;
            vx = ns - (int)vectorize;
        }
        int64_t e = a->extent[vx];
        int n = cpu_ladder(sp, &first, 1, vx, sp->s_levels - 1, e, cpu_inner_cap(sp, vx, vx),
                           vals);
        int64_t t = n > 0 ? pick_vec_row(sp, vals, n, max_vectors, vx) : 1;
        /* A windowed conv along F whose output columns take 7 rows (7, 14, 28 wide: see the
         * rows' rule below) keeps two filter vectors where it would take four on AVX-512:
         * 7 x 4 accumulators, 4 weight vectors and the broadcast input are 33 registers, and
         * GCC spills accumulators in the hot loop (about 60 stack moves in ResNet-50's 3x3
         * kernels); 7 x 2 does not (7 x 3 fits and stays). Old vs new alternated, Zen 5, 2
         * threads: ResNet-50's 3x3 convs 128 at 28 x 28 1.11x, 256 at 14 x 14 1.02x, 512 at
         * 7 x 7 1.07x, stride 2 from 56, 28, 14: 1.11x, 1.09x, 1.12x; batch 8 1.00-1.04x.
         * Pointwise convs (no window) keep 4 vectors: 7 x 2 was 0.97-1.02x there.
         * So do rows of 8, 16 or 32 columns, which 6 x 4 pads by an eighth or more (4 x 4 on
         * 8 columns) and 8 x 2 covers exactly (rows8, below: 8 columns then one tile a row,
         * whose block takes the plane's rows). Old vs new defaults alternated on a Xeon
         * (family 6 model 207, 2 threads, AVX-512): Stable Diffusion's 3x3 convs 640 at
         * 32 x 32 1.05-1.14x, 1280 at 16 x 16 1.09-1.11x, 1280 at 8 x 8 2.7-2.85x (4 x 2
         * there, without the plane's rows, 1.12x), the stride-2 320 from 64 x 64 0.96-1.04x;
         * 64 and 40 columns (6 x 4 or 5 x 4 pad less) were no faster as 8 x 2. */
        int64_t cols = a->extent[ns - 1];
        if (budget >= 24 && vx != ns - 1 && t / space_cpu_tile_lanes(sp, t, true) == 4 &&
            window_taps(sp) > 1 && cols % 6 != 0 &&
            ((cols % 7 == 0 && cols <= 28) || (cols % 8 == 0 && cols <= 32))) {
            max_vectors = 2;
            rows8 = cols % 8 == 0;
            t = pick_vec(vals, n, lanes, max_vectors);
        }
        vec_vectors = t / space_cpu_tile_lanes(sp, t, true);
        if (vec_vectors < 1) vec_vectors = 1;
    }
    /* spatial axes no packable operand depends on: where the accumulator block should grow */
    unsigned reuse_axes = 0;
    bool any = false; /* a packable operand: a contraction's, not a pool's */
    if (sp->sketch == SKETCH_CPU_TILE) {
        unsigned dep = 0;
        for (int id = 0; id < a->n_expr; id++)
            if (space_cpu_packable(sp, vx, id)) {
                dep |= space_expr_axes(sp, id);
                any = true;
            }
        reuse_axes = any ? ~dep & ((1u << ns) - 1u) : 1u; /* no operand: the first axis */
    }
    /* the register rows go along one of them: the innermost that is longer than 1 (a conv
     * vectorised along F: its output columns, whose broadcasts read consecutive inputs and
     * whose block is stored as rows; a GEMM: its only one, the rows of A) */
    unsigned rows_axis = reuse_axes;
    int rows_x = -1; /* that axis, when it is one of several */
    /* a GEMV: no axis for register rows (decode's M = 1), the matrix streamed */
    bool one_row = sp->sketch == SKETCH_CPU_TILE && sp->n_reduce > 0;
    for (int x = 0; x < ns; x++)
        if (x != vx && ((reuse_axes >> x) & 1u) && a->extent[x] > 1) one_row = false;
    for (int x = ns - 1; x >= 0 && sp->sketch == SKETCH_CPU_TILE; x--)
        if (((reuse_axes >> x) & 1u) && a->extent[x] > 1) {
            rows_axis = 1u << x;
            if (rows_axis != reuse_axes) rows_x = x;
            break;
        }
    /* A pointwise conv's positions are one axis (ir/build.c); along F its register rows,
     * blocks and tasks are cut as over the output rows they came from (row_len columns, out_h
     * rows): EfficientNet's 1152 -> 192 at 7 x 7, 9 tiles of 6 in one task a filter block
     * 0.060 ms, 7 tiles of 7 a task each 0.054, as the 7 rows were */
    int64_t row_len = 0, out_h = 0;
    if (rows_x >= 0 && vx != ns - 1 && ir_conv_pointwise(&sp->g->wl))
        ir_workload_out_hw(&sp->g->wl, &out_h, &row_len);
    /* A contraction whose vector row is one vector (a conv's 14 output columns in 16 lanes; 7
     * or 20 in 8, where two vectors would pad more) has one load a step and only its rows'
     * accumulators as FMA chains: the next axis out, which the vector operand also depends on
     * (the output rows), takes a second vector, and the rows are counted against two. Zen 5,
     * 2 threads, interleaved: ViT-B/16's 16x16/16 patch embedding (768 filters over 14 x 14)
     * 8 filters x 1 vector 0.65 ms, x 2 rows 0.54; ResNet-50's 1x1 2048 -> 512 at 7 x 7
     * 0.66 -> 0.55 (AVX2, 6 x 2 against 8 x 1: 0.69 -> 0.57); YOLOv5s' 1x1 512 -> 256 at
     * 20 x 20 on AVX2 0.68 -> 0.58. Four rows were no better: the packed panel then forces
     * the window into chunks. */
    int second_x = -1;
    if (sp->sketch == SKETCH_CPU_TILE && any && sp->n_reduce > 0 && gx < 0 && vec_vectors == 1 &&
        vx >= 1 && a->extent[vx - 1] >= 2 && !((reuse_axes >> (vx - 1)) & 1u))
        second_x = vx - 1;
    const int64_t tile_vectors = vec_vectors * (second_x >= 0 ? 2 : 1);
    for (int i = 0; i < sp->n_slot; i++) {
        const space_slot *sl = &sp->slot[i];
        if (i < n_given) { /* decided already (space_default_given) */
            out->v[i] = given->v[i];
            continue;
        }
        int n = vals ? space_legal_values(sp, i, out, vals) : 0;
        if (n <= 0) {
            out->v[i] = 1;
            continue;
        }
        int64_t v = vals[0];
        switch (sl->kind) {
        case SLOT_TILE:
            if (sp->sketch == SKETCH_CPU_WINDOW) {
                v = window_default_tile(sp, out, i, vals, n);
            } else if (sp->sketch == SKETCH_CPU_TILE && gx >= 0 && tw > 0 &&
                       (sl->level == 3 || sl->level == 2) && (sl->axis == gx || sl->axis == vx)) {
                /* a transpose of rows of at least tw points: register tiles of tw x tw, which
                 * codegen moves as blocks transposed in registers (emit_transpose_tiles), 2 x 2
                 * of them a task (4 x 2 of 16 x 16 on AVX-512, the longer side across the
                 * output's rows); 16 lanes where both rows are whole 64-byte lines, else 8
                 * (a 16-float load across two lines of every odd row: 4093 x 1027 at 1.25 ms
                 * against 0.99 with 8). On an Intel Xeon (family 6 model 167, 2 threads, each
                 * kernel alone, 3 runs) against the rule below's 4 x 4 points GCC vectorises:
                 * 1024 x 1024 0.37 -> 0.19 ms, AVX2 0.55 -> 0.23; BERT's 768 x 128 0.029 ->
                 * 0.006; 16 x 4096 0.015 -> 0.004; 512 x 2048 0.30 -> 0.20, AVX2 0.46 ->
                 * 0.21; 197 x 768 0.053 -> 0.011; 4093 x 1027 1.30 -> 0.98, AVX2 1.56 ->
                 * 1.01; 4096 x 77 0.031 -> 0.035 on AVX-512 (its last 13 output rows a task
                 * of points), AVX2 0.057 -> 0.035 */
                if (sl->level == 3) {
                    v = pick_le(vals, n, tw);
                    if (v != tw && sl->axis == gx) tw = 0; /* the rule below, from here on */
                } else {
                    v = pick_le(vals, n, sl->axis == gx && tw == 16 ? 4 : 2);
                }
            } else if (sp->sketch == SKETCH_CPU_TILE && gx >= 0) {
                /* a transpose: register tiles of 4 x 4 over the output's last axis and the
                 * axis the input runs along, a task the whole of the latter (4093 x 1027, 2
                 * threads: 3.6 -> 1.9 ms on Zen 4, AVX2 4 x 3: 3.3 -> 2.1; gathers along the
                 * output's rows before; 128 columns a task: 3.8 ms). Along the output's rows
                 * a divisor of a 64-byte line (4; 2 under AVX2's budget), and a task writes
                 * a whole line of each output row it touches (half a line on AVX2), the rows
                 * short vectors: with 4 rows a task, a row stride that is a multiple of 1 KiB
                 * put the task's 128 output lines in 4 L1 sets (BERT's 768 x 128 context
                 * transpose 0.100 -> 0.022 ms on Zen 5; 1024 x 1024 3.4 -> 0.28, 4093 x 1027
                 * 1.23 -> 0.87; AVX2 0.75-0.92x at 50 and 64 rows, 1.4-15x elsewhere) */
                if (sl->level == 3 && sl->axis == vx) { /* a divisor of a 64-byte line */
                    v = 1;
                    for (int k = 0; k < n; k++)
                        if (vals[k] <= 4 && 16 % vals[k] == 0) v = vals[k];
                } else if (sl->level == 3) {
                    v = sl->axis == gx ? pick_le(vals, n, 4) : 1;
                } else if (sl->level == 2 && sl->axis == vx) { /* whole lines of each row */
                    int64_t t3 = space_tile(sp, out, vx, 3);
                    int64_t line = sp->tgt.cpu.vector_registers > 16 ? 16 : 8;
                    if (t3 < 1) t3 = 1;
                    v = pick_le(vals, n, ceil_div(line, t3));
                } else if (sl->level == 2 && sl->axis == gx) { /* the whole axis, fewest tiles */
                    /* ... as far as the accumulator block leaves the output rows their whole
                     * line (above): LLaMA's 16 x 4096 key transpose at 16 tokens took all
                     * 4096 rows at 4 columns, 4 tasks writing quarter lines of the same
                     * output lines (false sharing between the threads) */
                    int64_t t3 = space_tile(sp, out, gx, 3), t3v = space_tile(sp, out, vx, 3);
                    int64_t line = sp->tgt.cpu.vector_registers > 16 ? 16 : 8;
                    if (t3 < 1) t3 = 1;
                    if (t3v < 1) t3v = 1;
                    int64_t row = ceil_div(line, t3v) * t3v;
                    if (row > a->extent[vx]) row = ceil_div(a->extent[vx], t3v) * t3v;
                    int64_t cap = CPU_ACC_BUF_MAX / row;
                    v = vals[0]; /* the fewest tiles that cover it, or the most that fit */
                    for (int k = 0; k < n && vals[k] * t3 <= cap; k++) {
                        v = vals[k];
                        if (v * t3 >= a->extent[gx]) break;
                    }
                } else v = pick_le(vals, n, 1);
            } else if (sp->sketch == SKETCH_CPU_TILE) {
                bool last = sl->axis == vx; /* the vector axis */
                if (sl->axis >= ns && gemv) { /* short chunks under a wide streamed row */
                    v = pick_le(vals, n, 8);
                } else if (sl->axis >= ns) { /* reduction chunk: up to 256, never a sliver of a prime */
                    /* the largest divisor up to 256; when the divisors are poor (a prime K),
                     * the largest non-dividing chunk up to 256 whose last piece is at least a
                     * quarter of it (1009 = 3 x 256 + 241; 257 keeps one chunk). Up to 512
                     * for a dense layer with 32 registers: its 6 x 4-vector tiles reload and
                     * store their accumulators and the panel is packed once a chunk, which a
                     * longer one amortises (AVX-512, Intel Xeon, 2 threads, alternated: ViT's
                     * fc2 197 x 768 x 3072 1.05-1.08x, CLIP's fc1 1.03x, TinyLLaMA's
                     * projections at K = 2048 1.03-1.04x, 128 x 128 x 32768 1.04-1.05x,
                     * Whisper's fc1 at K = 512 1.06x, DeiT's qkv at K = 384 1.06-1.07x, GPT-2's
                     * lm head 1.04-1.06x, K = 768 elsewhere 1.00-1.05x). Not on AVX2 (the same
                     * chunks 0.98-1.07x, mostly 1.00-1.03x), nor for attention's batched
                     * GEMMs (12 x 64 x 300 x 300: 0.89x). */
                    int64_t e = a->extent[sl->axis];
                    const int64_t most = budget >= 24 && sp->g->wl.op == IR_OP_DENSE ? 512 : 256;
                    v = vals[0];
                    for (int k = 0; k < n; k++)
                        if (vals[k] <= most && e % vals[k] == 0) v = vals[k];
                    if (v < 64) {
                        int64_t lv = v;
                        for (int k = 0; k < n; k++)
                            if (vals[k] <= most && e % vals[k] >= (vals[k] + 3) / 4) lv = vals[k];
                        if (lv > v) v = lv;
                    }
                    for (int k = 0; k < n && v < 16; k++)
                        if (vals[k] >= 16 && e % vals[k] == 0) v = vals[k];
                    /* ... and small enough that the packed operands fit their buffers (the
                     * reduction axes after this one at 1; vectors along F: a conv's window
                     * axes after it whole, so that the channels give way, not the window:
                     * a window split in chunks reloads the accumulators and repacks per tap) */
                    space_sched t = *out;
                    int upto = i + 1;
                    for (int j = i + 1; j < sp->n_slot && vx != ns - 1; j++)
                        if (sp->slot[j].kind == SLOT_TILE && sp->slot[j].axis >= ns &&
                            a->extent[sp->slot[j].axis] <= 16) {
                            t.v[j] = a->extent[sp->slot[j].axis];
                            upto = j + 1;
                        }
                    int64_t fit = v;
                    for (int k = n - 1; k > 0; k--) {
                        if (vals[k] > fit) continue;
                        t.v[i] = vals[k];
                        if (space_cpu_pack_floats(sp, &t, upto) <= CPU_PACK_MAX) break;
                        fit = vals[k - 1];
                    }
                    /* a sliver of a long prime axis (1009 = 1 x 1009) costs more than not
                     * packing; a short axis (a 3x3 kernel's rows) may go down to 1 */
                    if (fit >= 16 || a->extent[sl->axis] < 64) v = fit;
                    /* A 1-D conv along F (one kernel row, several taps) on Intel: every
                     * register tile reads the chunk's whole weight panel (channels x taps x
                     * the tile's filters), which pays in L1 there. Old vs new alternated on a
                     * Xeon (family 6 model 207, 2 threads): Whisper's 384 -> 384 x 3 stride 2
                     * at 3000 columns, chunks of 128 channels (96 KB) -> 64 (48 KB) 1.33x
                     * (96: 72 KB, 0.97x); 512 -> 512 x 3 at 2000 1.14x; 256 -> 256 x 5 stride
                     * 2 1.04x. The 3x3 convs' 74-92 KB panels halved were 0.97-1.00x; AMD
                     * (Zen 5 ran Whisper's at 0.98x ONNX Runtime) was not measured: kept. */
                    const int64_t f3 = space_tile(sp, out, vx, 3);
                    if (sl->axis == ns && vx != ns - 1 && sp->n_reduce == 3 &&
                        sp->g->wl.op == IR_OP_CONV2D && a->extent[ns + 1] == 1 &&
                        a->extent[ns + 2] > 1 && f3 > 0 && sp->tgt.cpu.l1d_bytes > 0 &&
                        intel_host(sp)) {
                        const int64_t panel = a->extent[ns + 2] * f3 * (int64_t)sizeof(float);
                        const int64_t best =
                            chunk_within(vals, n, v, e, panel, sp->tgt.cpu.l1d_bytes);
                        if (best >= 16 && best < v) v = best;
                    }
                    /* A 2-D window along F on a 16-register target, which runs the window in
                     * straight code (codegen's window_unroll): the chunk's weight panel in
                     * half of L1 (AVX2 on a Xeon, 3x3 convs, 2 x 5-6 register tiles, panels
                     * of 36-92 KB cut to 18-23: old vs new defaults alternated, SD 1.5's 320
                     * -> 320 1.13x and at stride 2 1.08x, YOLOv5s 128 -> 256 stride 2 1.05x,
                     * its 64 -> 64 and a dilated 64 -> 64 1.01x; chunks of 32 against 64
                     * and more, 1.00-1.10x over the five. The same cut on AVX-512 tied,
                     * 0.99-1.02x; AMD not measured) */
                    if (sl->axis == ns && vx != ns - 1 && sp->n_reduce == 3 &&
                        sp->g->wl.op == IR_OP_CONV2D && sp->tgt.cpu.vector_registers <= 16 &&
                        a->extent[ns + 1] > 1 && a->extent[ns + 2] > 1 &&
                        a->extent[ns + 1] <= 16 && a->extent[ns + 2] <= 16 && f3 > 0 &&
                        sp->tgt.cpu.l1d_bytes > 0) {
                        const int64_t panel =
                            a->extent[ns + 1] * a->extent[ns + 2] * f3 * (int64_t)sizeof(float);
                        const int64_t best =
                            chunk_within(vals, n, v, e, panel, sp->tgt.cpu.l1d_bytes / 2);
                        if (best >= 16 && best < v) v = best;
                    }
                }
                else if (sl->level == 3 && last && one_row) {
                    /* one register row (a GEMV, below): a 64-byte line of each matrix row a
                     * step (AVX-512 one vector, AVX2 two; Zen 4, 2 threads, 1x32000x4096:
                     * 4 vectors 20.1 ms, 1 vector 17.9; 1x11008x4096 6.2 -> 5.9); where
                     * 64-byte loads run at full rate (Zen 5) four AVX-512 vectors, as the
                     * other tiles: interleaved, 1x4096x4096 1.07-1.15x, BERT's 768 -> 3072
                     * 1.15-1.17x, 4096 -> 32000 1.02-1.08x, 4096 -> 11008 and back 1.00-1.04x,
                     * EfficientNet's squeeze-excite 1152 -> 48 1.5x, 672 -> 28 2.1x; where the
                     * row is whole blocks of 4 vectors or fits in one: ragged rows lost
                     * (classifiers' 1000: 0.94-0.96x, GPT-2's 50257: 0.98x), and so did an
                     * outer product (K = 1: 96 x 64 x 1 0.2x). AVX2 four vectors
                     * measured 0.98-1.08x: kept at two. */
                    int64_t e = a->extent[vx], red = 1;
                    for (int r = ns; r < ns + sp->n_reduce; r++) red *= a->extent[r];
                    bool whole = red >= 8 && (e % (4 * lanes) == 0 || e <= 4 * lanes);
                    int gemv_vectors = lanes < 16                    ? 16 / lanes
                                       : full_width_loads(sp) && whole ? 4
                                                                       : 1;
                    v = pick_vec(vals, n, lanes, gemv_vectors);
                }
                else if (sl->level == 3 && last)
                    v = pick_vec_row(sp, vals, n, max_vectors, vx);
                else if (sl->level == 3) {
                    /* register rows along an axis the vector operand does not depend on: one
                     * vector load feeds every row (B of a GEMM: rows of A; conv: filters) */
                    int64_t cap = budget / (tile_vectors * nonlast);
                    /* with 32 registers the broadcasts GCC hoists ahead of a step's FMAs need
                     * registers too: rows x (vectors + 1) + vectors <= 34 (6 x 4 GEMM tiles
                     * stay; 6 x 2 rows of a conv along F would spill accumulators) */
                    if (budget >= 24) {
                        int64_t rows_max = (34 - tile_vectors) / (tile_vectors + 1);
                        if (rows_max / nonlast < cap) cap = rows_max / nonlast;
                    }
                    if (!((rows_axis >> sl->axis) & 1u)) cap = sl->axis == second_x ? 2 : 1;
                    /* 6 rows under a row of several vectors (GEMM: 6 x 4 on AVX-512, 6 x 2
                     * on AVX2); 8 under a single vector, whose accumulators must cover the
                     * FMA latency on their own (2 pipes x 4 cycles) */
                    int64_t rows = vec_vectors == 1 ? 8 : 6;
                    v = pick_le(vals, n, cap < rows ? (cap < 1 ? 1 : cap) : rows);
                    /* where there are few tiles, a divisor a row or so short beats padded
                     * edge tiles (80 columns: 16 tiles of 5, not 14 of 6 with the last one
                     * clamped; 320 filters keep 54 tiles of 6) */
                    for (int k = n - 1; k >= 0 && a->extent[sl->axis] <= 16 * v; k--)
                        if (vals[k] < v && 5 * vals[k] >= 4 * v &&
                            a->extent[sl->axis] % vals[k] == 0 && a->extent[sl->axis] % v != 0) {
                            v = vals[k];
                            break;
                        }
                    /* ... or a few rows longer, for a conv's columns under a row of filter
                     * vectors, when that cuts them in at most 4 tiles (7 of 7, 14, 28 instead
                     * of 4 or 6 with the last tile clamped). ResNet-50 along F, 7 x 4 against
                     * 6 x 4: 1x1 512 -> 128 at 28 x 28 0.29 -> 0.25 ms, 512 -> 256 0.52 ->
                     * 0.46; 3x3 at 28 x 28 1.10x, at 14 x 14 1.04-1.18x, at 7 x 7 1.03x (a 3x3
                     * now takes 7 x 2: the vector axis' rule above). Over wider rows it lost
                     * (3x3 at 56 x 56 0.93x, the 7x7 stem at 112 0.88x). */
                    int64_t ext = sl->axis == rows_x && row_len ? row_len : a->extent[sl->axis];
                    int64_t longer = v;
                    for (int k = 0; k < n && sl->axis == rows_x && vx != ns - 1 && budget >= 24 &&
                                    ext % v != 0; k++)
                        if (vals[k] > v && vals[k] <= v + 3 && ext % vals[k] == 0 &&
                            vals[k] * tile_vectors <= budget && ext <= 4 * vals[k])
                            longer = vals[k];
                    v = longer;
                    for (int k = 0; k < n && rows8 && sl->axis == rows_x; k++)
                        if (vals[k] == 8) v = 8;
                    nonlast *= v;
                }
                else if (sl->level == 2 && !last) {
                    /* the accumulator block grows along the axes the packable operand (B of a
                     * GEMM, the input of a conv) does not depend on, so that operand's panel
                     * is reused over the whole block instead of re-packed per task; the rows'
                     * axis first: another gets what its whole extent leaves (a conv along F:
                     * a block of output rows, each one whole) */
                    int64_t cap = (reuse_axes >> sl->axis) & 1u ? 64 : 1;
                    /* vectors along F: the block is one output row (the weights' panel
                     * stays in L1 over it); more rows go to level 1, below */
                    if (vx != ns - 1 && rows_x >= 0 && rows_x != sl->axis) cap = 1;
                    /* a conv along F whose weights outgrow L2 (see the plane's rows below) */
                    const int64_t l2 = sp->tgt.cpu.l2_bytes > 0 ? sp->tgt.cpu.l2_bytes : 1 << 20;
                    const bool big_w = sp->n_reduce == 3 && sp->g->wl.op == IR_OP_CONV2D &&
                                       vx != ns - 1 &&
                                       a->extent[vx] * a->extent[ns] * window_taps(sp) *
                                               (int64_t)sizeof(float) > l2;
                    const int64_t f3 = space_tile(sp, out, vx, 3), f2 = space_tile(sp, out, vx, 2);
                    const int64_t ftile = (f3 > 0 ? f3 : 1) * (f2 > 0 ? f2 : 1);
                    if (sl->axis == rows_x && row_len) { /* a pointwise conv's row */
                        int64_t t3 = space_tile(sp, out, rows_x, 3);
                        if (t3 < 1) t3 = 1;
                        cap = ceil_div(row_len, t3);
                        /* ... or, where its weights outgrow L2, all its positions as the
                         * accumulators allow, every core keeping two tasks: a task of one
                         * row read its filter block's weights from L3 for that row alone.
                         * Old vs new alternated on a Xeon (family 6 model 207, 2 threads):
                         * ResNet-50's 512 -> 2048 at 7 x 7 on AVX-512 1.24-1.29x, 2048 ->
                         * 512 1.25-1.29x (AVX2 1.19-1.22x), batch 8 0.98-1.04x; the 1x1
                         * stride-2 downsamples and SD's 1x1s keep their schedules */
                        if (big_w) {
                            cap = block_within(sp, out, sl->axis, ceil_div(a->extent[rows_x], t3),
                                               t3 * ftile, cores);
                            rows_block = cap > 1;
                        }
                    }
                    if (cap > 1 && rows_x >= 0 && rows_x != sl->axis) {
                        int64_t t3 = space_tile(sp, out, rows_x, 3);
                        int64_t across = ceil_div(a->extent[rows_x], t3 > 0 ? t3 : 1);
                        cap = 64 / (across < 64 ? across : 64);
                    }
                    /* ... unless that row is one register tile (a 7 x 7 map, 7 columns of
                     * filter vectors on AVX-512): then the block takes the plane's rows, each
                     * chunk of the weights' panel serving all of them, while every core keeps
                     * two tasks. ResNet-50's 3x3 512 -> 512 at 7 x 7 1.12-1.18x (Zen 5,
                     * interleaved, input from L3 as in a plan, and warm), from 14 x 14 with
                     * stride 2 1.06x, batch 8 1.04-1.06x; at 14 x 14 (two tiles a row) more
                     * rows gained nothing, and AVX2's 7-wide rows are two tiles of 4. Not
                     * without a window: the 1x1 stride-2 1024 -> 2048 at 5 x 5 lost 7 % */
                    /* ... or whose weights outgrow L2, where a task of one output row reads
                     * its filter block's weights from L3 or DRAM for that row alone: a block
                     * of the plane's rows reads each chunk of them once. Old vs new defaults
                     * alternated on a Xeon (family 6 model 207, 2 MiB L2, 2 threads), AVX-512
                     * / AVX2: Stable Diffusion's 3x3 1280 -> 1280 at 16 x 16 1.46-1.52x /
                     * 1.11-1.12x, at 8 x 8 (AVX-512 one tile a row already) - / 1.38-1.51x,
                     * 640 at 32 x 32 1.07-1.25x / 1.02-1.05x, 320 at 64 x 64 0.99-1.01x /
                     * 1.01x, stride 2 from 64, 32 and 16: 1.06-1.08x / 1.03-1.05x, 1.19-1.36x
                     * both, - / 1.56-1.64x; 512 at 14 x 14 1.23x / 1.13-1.15x (on Zen 5, with
                     * the rule above only, more rows gained nothing there: not measured
                     * again), 256 at 14 x 14 1.06x / 1.08-1.09x, ResNet-50's 512 at 7 x 7 on
                     * AVX2 1.16-1.22x; batch 8 0.99-1.01x; a 5x5 192 -> 256 at 28 x 28
                     * 1.01-1.08x */
                    int64_t t3r = rows_x >= 0 ? space_tile(sp, out, rows_x, 3) : 0;
                    if (cap == 1 && vx != ns - 1 && !row_len && sl->axis == rows_x - 1 &&
                        window_taps(sp) > 1 && t3r > 0 && (a->extent[rows_x] <= t3r || big_w)) {
                        /* whole output rows in the block */
                        const int64_t per_row = ceil_div(a->extent[rows_x], t3r);
                        cap = block_within(sp, out, sl->axis, a->extent[sl->axis],
                                           per_row * t3r * ftile, cores);
                        rows_block = cap > 1 && big_w;
                    }
                    v = pick_le(vals, n, cap);
                    /* ... and even blocks: a smaller block (down to half) that cuts the tiles
                     * into equal pieces beats a ragged last block, whose short tasks leave a
                     * thread idle under the static split (1021 rows = 171 tiles of 6: 3 x 57,
                     * not 64 + 64 + 43; 1.17x on a prime GEMM on AVX2) */
                    int64_t t3 = space_tile(sp, out, sl->axis, 3);
                    int64_t tiles = ceil_div(a->extent[sl->axis], t3 > 0 ? t3 : 1);
                    /* (a pointwise conv's row block stays a row: its tasks are 4 of them,
                     * and halving it re-reads the filters' panel twice as often: 256 -> 128
                     * at 56 x 56, batch 8, blocks of 8 tiles 4.7 ms, of 4 6.1) */
                    bool row = sl->axis == rows_x && row_len;
                    if (v > 1 && tiles > v && tiles % v != 0 && !row) {
                        int64_t best = v, waste = ceil_div(tiles, v) * v - tiles;
                        for (int k = 0; k < n; k++) {
                            int64_t w = ceil_div(tiles, vals[k]) * vals[k] - tiles;
                            if (vals[k] < v && 2 * vals[k] >= v && w < waste) best = vals[k], waste = w;
                        }
                        if (waste * 8 <= tiles) v = best; /* within an eighth of a block */
                    }
                    /* On Intel, a block whose register tiles store straight to the output (a
                     * single reduction chunk, here a reduction of at most 64) along rows 4 KiB
                     * apart or more keeps to 32 rows: each tile's stores touch a page per row,
                     * and a taller block walks more pages than the store side of the TLB holds
                     * across its tasks. Alternated on a Xeon (family 6 model 207, 2 threads):
                     * Whisper's 6 x 1500 x 1500 x 64 scores, the block's rows alone varied:
                     * 48 and more all slow, 30 and fewer all fast (1.27-1.40x); the rule of
                     * thumb's 150 rows -> 30 1.13-1.15x; 2 x 1500 x 2048 x 64 1.1-1.2x; K = 128
                     * (1024 x 1500 x 128) 1.01x; an output streamed with non-temporal stores
                     * (space_cpu_output_streams; SD's 4096 x 4096 x 40) 0.98x, so that one keeps
                     * its block. AMD was not measured here. */
                    const int64_t cols = a->extent[ns - 1],
                                  outb = 4 * ir_tensor_numel(&sp->g->tensor[sp->g->output]);
                    if (intel_host(sp) && sl->axis == ns - 2 && vx == ns - 1 && sp->n_reduce == 1 &&
                        a->extent[ns] <= 64 && cols * (int64_t)sizeof(float) >= 4096 && t3 > 0 &&
                        v * t3 > 32 &&
                        !(cols % 16 == 0 && space_cpu_output_streams(&sp->tgt, outb)))
                        v = pick_le(vals, n, 32 / t3 > 0 ? 32 / t3 : 1);
                    /* ... and balanced threads: the static split hands each thread a run of
                     * tasks, and where the other axes' last tasks are short (a 1x1 conv at
                     * 14 x 14: 196 positions in 6 tiles of 32 and one of 4) a block that
                     * leaves a thread more full tasks than the other (1024 filters in 3
                     * blocks x 7: 11 and 10 tasks, 10 and 8 of them full) costs what a
                     * smaller block (down to half) that evens the threads' work does not
                     * (4 blocks x 7: 14 each). Where one is at least 1/32 lighter, the
                     * lightest (the largest of equals) */
                    const int64_t heavy =
                        v > 1 && !row ? busiest_work(sp, out, sl->axis, v, vx, lanes, cores) : -1;
                    int64_t light = v, least = heavy;
                    for (int k = 0; heavy > 0 && k < n && vals[k] < v; k++) {
                        int64_t w = 2 * vals[k] >= v
                                        ? busiest_work(sp, out, sl->axis, vals[k], vx, lanes, cores)
                                        : -1;
                        if (w > 0 && 32 * w <= 31 * heavy && w <= least) least = w, light = vals[k];
                    }
                    v = light;
                }
                else if (sl->level == 2 && nonlast == 1 && sp->n_reduce > 0) {
                    /* one register row (a GEMV: decode's M = 1): nothing reuses a loaded
                     * vector, the kernel streams the matrix. A wide accumulator row (L1/L2)
                     * over short reduction chunks reads long contiguous runs of each matrix
                     * row instead of 256-byte pieces 40 KB apart (~2x on 1x11008x4096), and
                     * the longer the runs the closer to the read bandwidth: one task per
                     * thread, as wide as the accumulator buffer allows, with the busiest
                     * thread's share of columns the least (Zen 4, 2 threads, 8-row chunks:
                     * 1x32000x4096 19.1 ms in tasks of 4096 columns, 15.3 in two of 16000,
                     * a plain read of the matrix 15.2; 1x4096x4096 1.97 -> 1.82 ms) */
                    int64_t t3 = space_tile(sp, out, sl->axis, 3);
                    /* (the first thread's tasks are whole: its tiles bound the time; within
                     * 1/64 of the least, the widest tasks) */
                    int64_t tiles = ceil_div(a->extent[sl->axis], t3 > 0 ? t3 : 1), least = -1;
                    for (int k = 0; k < n; k++) {
                        int64_t load = busiest_tiles(tiles, vals[k], cores);
                        if (least < 0 || load < least) least = load;
                    }
                    for (int k = 0; k < n; k++)
                        if (64 * busiest_tiles(tiles, vals[k], cores) <= 65 * least) v = vals[k];
                    gemv = true;
                }
                else if (sl->level == 2 && last && sp->n_reduce == 0) {
                    /* no reduction (elementwise, broadcasts): nothing to keep in registers,
                     * so a task is a run of vectors long enough to drown its loop overhead
                     * (a GELU over 16777213 floats, AVX2: 2 vectors a task 6.6 ms, 32 5.8) */
                    v = pick_le(vals, n, 32);
                }
                else if (sl->level == 2 && vx != ns - 1 && rows_x >= 0) {
                    /* a conv along F: one register tile of filters a block, so its
                     * accumulators stay in registers across the channel chunks (a block of
                     * two tiles reloads them per chunk): ResNet-50's 3x3 at 28 x 28, 14 x 14
                     * and 7 x 7 1.1-1.2x, its 1x1 convs 1.0-1.14x; 21 convs 1.08x geomean on
                     * AVX-512, 33 1.03x on AVX2 (Zen 5, 2 threads) */
                    v = 1;
                }
                else if (sl->level == 2 && last && vx == ns - 1 && sp->g->wl.op == IR_OP_DENSE &&
                         ns == 2 && prefill_dense(sp, out, cores)) {
                    /* a dense layer whose rows are one block (prefill's 77 tokens), whose A
                     * outgrows half of L2 and whose B is far larger than the cores' L2: each
                     * task reads all of A, and a panel of B in rows of 32 columns (2 cache
                     * lines a row, a row a page), from L3 or DRAM, so the block widens up to
                     * 128 columns (AVX2 8 tiles; AVX-512's 2 tiles are that already) as far as
                     * its accumulators stay within L1, while every core keeps 4 tasks. Old vs
                     * new alternated on a Xeon (family 6 model 207, 48 KiB L1d, 2 MiB L2, 2
                     * threads), AVX2, by B: LLaMA-2's 77 x 4096 x 11008 (180 MB) 1.29x, 77 x
                     * 11008 x 4096 1.21x, 77 x 768 x 16384 (50 MB, 6 tiles for 4 tasks a core)
                     * 1.16x, 77 x 4096 x 4096 (64 MB) 1.14x; at 32 MB and less
                     * (left as they were) 77 x 4096 x 2048 1.04x, 77 x 768 x 4096 1.01x, 197 x
                     * 768 x 3072 1.01x, BERT's 128 x 768 x 3072 (9.4 MB) 0.89-0.90x; 64-column
                     * blocks gained only 1.0-1.05x, and past L1 it lost (257 x 4096 x 1024 in
                     * 258 x 48: 0.93x) */
                    int64_t t3 = space_tile(sp, out, sl->axis, 3);
                    t3 = t3 < 1 ? 1 : t3;
                    const int64_t rows = space_tile(sp, out, 0, 3) * space_tile(sp, out, 0, 2);
                    const int64_t l1 = sp->tgt.cpu.l1d_bytes > 0 ? sp->tgt.cpu.l1d_bytes : 32768;
                    int64_t cols = l1 / (4 * rows);
                    if (cols > 128) cols = 128;
                    v = pick_le(vals, n, cols / t3 > 2 ? cols / t3 : 2);
                    for (; v > 2; v = pick_le(vals, n, v - 1))
                        if (ceil_div(a->extent[sl->axis], v * t3) >= 4 * cores) break;
                }
                else if (sl->level == 2) v = pick_le(vals, n, 2);
                else if (sl->level == 1 && vx != ns - 1 && rows_x >= 0 && !rows_block &&
                         (sl->axis == rows_x ? row_len && out_h >= 16
                                             : sl->axis < rows_x && a->extent[sl->axis] >= 16) &&
                         ((reuse_axes >> sl->axis) & 1u)) {
                    /* vectors along F: a task takes 4 output rows of one filter block, whose
                     * weights (packed once) are read from L2 for each; a task per row read
                     * all the filters' weights from L3 per row (sd15 downsampler: 13 -> 7.7
                     * ms) */
                    v = pick_le(vals, n, 4);
                    /* ... a pointwise conv's 4 rows' worth of positions while that leaves 32
                     * tasks a core (ResNet-50's 256 -> 64 at 56 x 56, batch 1: 17 tasks of 4
                     * blocks 0.242 ms, 66 of one 0.223; batch 8 keeps 4) */
                    for (; sl->axis == rows_x && v > 1; v = pick_le(vals, n, v / 2))
                        if (decided_tasks(sp, out, rows_x, v) >= 32 * cores) break;
                }
                else v = 1;
            } else { /* GPU: thread level spreads the last two axes, inner 2x2-4 */
                bool last = sl->axis == ns - 1, prev = sl->axis == ns - 2;
                if (sl->axis >= ns) v = pick_le(vals, n, sl->level == 2 ? 4 : 2);
                else if (sl->level == 2) v = pick_le(vals, n, last ? 16 : prev ? 8 : 1);
                else if (sl->level == 4) v = pick_le(vals, n, last ? 4 : prev ? 2 : 1);
                else if (sl->level == 3) v = pick_le(vals, n, prev ? 2 : 1);
                else v = 1;
            }
            break;
        case SLOT_PARALLEL: {
            /* parallelise the outer tiles; add s1 when s0 alone gives too few tasks */
            int64_t tasks = 1;
            for (int x = 0; x < ns && sp->sketch == SKETCH_CPU_TILE; x++)
                tasks *= space_tile(sp, out, x, 0);
            v = sp->sketch == SKETCH_CPU_ROWS ? 1 : (tasks >= 2 * cores ? 1 : 2);
            /* a plane per task, when the work (points x taps) outweighs a fork-join */
            if (sp->sketch == SKETCH_CPU_WINDOW)
                v = a->extent[0] * a->extent[1] >= 2 && ir_stage_points(a) >= PAR_MIN_POINTS;
            if (sp->sketch == SKETCH_CPU_TILE && ir_stage_points(a) < 32768) v = 0;
            if (sp->sketch == SKETCH_CPU_ROWS) {
                /* a few microseconds of work: a fork-join costs as much, and a busy machine
                 * that deschedules one thread makes the other wait at the barrier */
                int64_t work = 0;
                for (int si = 0; si < sp->g->n_stage; si++) work += ir_stage_points(&sp->g->stage[si]);
                /* ... except many short rows (a pool's planes, 240 x 7 x 7 and up: 1.2-1.8x
                 * from 8 K points on Zen 5); a few long ones (a layer norm of 8 rows, one
                 * RMS-norm row) keep one thread below 64 K (0.2-0.5x across two) */
                if (work < PAR_MIN_POINTS || (work < 65536 && sp->rows < 64 * cores)) v = 0;
            }
            break;
        }
        case SLOT_VECTORIZE:
            v = sp->sketch == SKETCH_CPU_WINDOW ? window_default_vec(sp, want, vals, n)
                : sp->sketch != SKETCH_CPU_TILE ? 1
                : gx >= 0                       ? pick_le(vals, n, 1)
                                                : vectorize;
            break;
        case SLOT_UNROLL: v = pick_le(vals, n, 64); break;
        case SLOT_ROWS: v = pick_le(vals, n, sp->sketch == SKETCH_GPU_ROWS ? 1 : 4); break;
        case SLOT_THREADS: v = pick_le(vals, n, 256); break;
        case SLOT_STAGE: v = vals[n - 1]; break;
        case SLOT_VEC_LOAD: v = 1; break;
        /* GPU_MMA: 128 x 128 blocks of 8 warps, each 64 x 32 (64 accumulators a thread),
         * 32-deep chunks in 3 stages (48 KiB), swizzled: CUTLASS's sm_80 GEMM shapes */
        case SLOT_WARP_M: v = pick_le(vals, n, 64); break;
        case SLOT_WARP_N: v = pick_le(vals, n, 32); break;
        case SLOT_WARPS_M: v = pick_le(vals, n, 2); break;
        case SLOT_WARPS_N: v = pick_le(vals, n, 4); break;
        case SLOT_BLOCK_K: v = pick_le(vals, n, 32); break;
        case SLOT_PIPELINE: v = pick_le(vals, n, 3); break;
        case SLOT_SWIZZLE: v = vals[n - 1]; break;
        case SLOT_PACK: {
            /* pack when a packed panel is reused over the accumulator block (a spatial axis
             * it does not depend on: B of a GEMM over the rows of A) enough to pay for the
             * copy, or when packing turns strided vector loads into contiguous ones (a conv's
             * weights along F); a depthwise input is read once per point, and copying it
             * first only doubles the traffic. A grouped conv's input (4 channels a group,
             * 4 filters reuse it) packed per task ran 4.9x slower than read in place
             * (resnext50 g32 3x3, one thread: 1.89 -> 0.38 ms). */
            /* A conv's input read along its output columns (NCHW, stride 1, no padding) is
             * contiguous where the vectors load it, and its channels are H x W floats apart:
             * packed per task it cost as much as it saved, read in place it ran 1.04-1.44x
             * faster over ResNet-50's 1x1 convs at 56, 28 and 14 columns and 1.1-2.5x over
             * MobileNetV2's (few filters reuse each panel), unless the channels fall on one
             * cache set (H x W a multiple of 1024 floats, 4 KiB: SD 1.5's 1x1 at 32 x 32 read
             * in place 0.73x). On AVX2, whose masked loads are slow (no mask registers), only
             * when the columns are whole vectors: at 56 columns 1.02-1.12x, at 28, 14 and 7
             * (a ragged last vector, which the packed panel pads) 0.89-0.98x. Zen 5, 2
             * threads. */
            /* (But on Intel a pointwise conv that keeps or grows its channels over a large
             * plane or many channels packs: its input comes from DRAM or L3 in a plan, and
             * packed per task its rows are read once, ahead of the FMAs, where read in place
             * the first filter tile waited on them. Packed / in place alternated on a Xeon
             * (family 6 model 167, 2 threads), inputs from DRAM: ResNet-50's 64 -> 64 and
             * 64 -> 256 at 56 x 56 1.03-1.21x (batch 8 1.03-1.19x), 128 -> 512 at 28 x 28
             * 1.04-1.08x, 256 -> 1024 at 14 x 14 1.12-1.18x, MobileNetV2's 16 -> 96 at
             * 112 x 112 and 24 -> 144 at 56 x 56 1.05-1.07x; in cache 0.92-1.18x, mostly
             * gains. Reductions (256 -> 64, 512 -> 128: 0.86-0.96x) and MobileNetV2's small
             * expansions at 28 x 28 and 14 x 14 (32 -> 192 0.88-0.92x) keep reading in place.) */
            const int64_t *cs = sp->g->wl.shape;
            const bool packs = intel_host(sp) && ir_conv_pointwise(&sp->g->wl) &&
                               cs[IR_CONV_F] >= cs[IR_CONV_C] &&
                               (cs[IR_CONV_H] * cs[IR_CONV_W] >= 3136 || cs[IR_CONV_C] >= 128);
            int64_t reuse = 0;
            bool gathers = false, in_place = false;
            const bool conv = sp->g->tensor[sp->g->output].ndim == 4 && vx == ns - 1;
            for (int id = 0; id < a->n_expr; id++) {
                if (!space_cpu_packable(sp, vx, id)) continue;
                unsigned m = space_expr_axes(sp, id);
                int64_t r = 1;
                for (int x = 0; x < ns; x++)
                    if (!(m & (1u << x))) r *= space_tile(sp, out, x, 2) * space_tile(sp, out, x, 3);
                if (r > reuse) reuse = r;
                const ir_expr *ld = &a->expr[id];
                const bool padded = ld->kind == IR_E_SELECT;
                if (padded) ld = &a->expr[ld->a];
                int64_t cf = ld->kind == IR_E_LOAD ? load_coef(sp, ld, vx) : 0;
                if (conv && !padded && cf == 1) {
                    int64_t chan = 0, widest = 0; /* the stride of its widest reduction axis */
                    for (int rx = ns; rx < ns + sp->n_reduce; rx++)
                        if (a->extent[rx] > widest)
                            widest = a->extent[rx], chan = load_coef(sp, ld, rx);
                    in_place = !packs && chan % 1024 != 0 &&
                               (vec_lanes(sp) >= 16 || a->extent[vx] % vec_lanes(sp) == 0);
                }
                if (cf != 0 && cf != 1 && r >= 4) gathers = true;
            }
            v = (reuse >= 16 && !in_place) || gathers ? vals[n - 1] : 0;
            break;
        }
        default: break;
        }
        out->v[i] = v;
    }
    free(vals);
}

/* ---- counting ---- */

typedef struct {
    const space *sp;
    int64_t *vals[SPACE_MAX_SLOTS];
    double count;
    int64_t budget;
} counter;

static void count_dfs(counter *c, space_sched *s, int slot)
{
    if (c->budget-- <= 0) return;
    if (slot == c->sp->n_slot) {
        c->count += 1;
        return;
    }
    int n = space_legal_values(c->sp, slot, s, c->vals[slot]);
    for (int k = 0; k < n && c->budget > 0; k++) {
        s->v[slot] = c->vals[slot][k];
        count_dfs(c, s, slot + 1);
    }
}

double space_log10_size(const space *sp, int *exact)
{
    counter c;
    memset(&c, 0, sizeof c);
    c.sp = sp;
    int64_t *pool = malloc(sizeof(int64_t) * SPACE_MAX_VALUES * (size_t)(sp->n_slot + 1));
    if (!pool) return 0;
    for (int i = 0; i < sp->n_slot; i++) c.vals[i] = pool + (size_t)i * SPACE_MAX_VALUES;
    c.budget = 2000000;
    space_sched s;
    memset(&s, 0, sizeof s);
    s.n = sp->n_slot;
    count_dfs(&c, &s, 0);
    double result;
    if (c.budget > 0) {
        if (exact) *exact = 1;
        result = log10(c.count);
    } else {
        /* Knuth's estimator: the mean over random root-to-leaf paths of the product of
         * branching factors is an unbiased estimate of the number of leaves. */
        if (exact) *exact = 0;
        uint64_t rng = 0x1234567;
        double sum = 0;
        int paths = 400;
        for (int p = 0; p < paths; p++) {
            double prod = 1;
            memset(&s, 0, sizeof s);
            s.n = sp->n_slot;
            for (int i = 0; i < sp->n_slot; i++) {
                int n = space_legal_values(sp, i, &s, pool);
                prod *= n;
                s.v[i] = pool[rng_next(&rng) % (uint64_t)n];
            }
            sum += prod;
        }
        result = log10(sum / paths);
    }
    free(pool);
    return result;
}

/* ---- GPU shared-memory footprint ---- */

int64_t space_gpu_smem_bytes(const space *sp, const space_sched *s)
{
    if (sp->sketch != SKETCH_GPU_TILE) return 0;
    const ir_stage *a = anchor(sp);
    int ns = sp->n_spatial, nr = sp->n_reduce;
    int64_t box[IR_MAX_AXES];
    for (int x = 0; x < ns; x++) {
        box[x] = 1;
        for (int l = 1; l < sp->s_levels; l++) box[x] *= tile_partial(sp, s, s->n, x, l);
    }
    for (int x = ns; x < ns + nr; x++) {
        box[x] = 1;
        for (int l = 1; l < sp->r_levels; l++) box[x] *= tile_partial(sp, s, s->n, x, l);
    }
    int64_t total = 0;
    for (int e = 0; e < a->n_expr; e++) {
        const ir_expr *x = &a->expr[e];
        if (x->kind != IR_E_LOAD) continue;
        const ir_tensor *t = &sp->g->tensor[x->tensor];
        int64_t fp = 1;
        for (int d = 0; d < t->ndim; d++) {
            int64_t span = 1;
            for (int ax = 0; ax < ns + nr; ax++)
                span += (int64_t)abs(x->idx[d].coef[ax]) * (box[ax] - 1);
            if (span > t->shape[d]) span = t->shape[d] + 0;
            fp *= span;
        }
        total += fp * 4;
    }
    return total;
}

/* ---- printing and parsing ---- */

int space_print(const space *sp, const space_sched *s, char *buf, size_t cap)
{
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (int i = 0; i < sp->n_slot && i < s->n; i++) {
        int k = snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0, "%s%s=%lld",
                         i ? " " : "", sp->slot[i].name, (long long)s->v[i]);
        if (k > 0) len += (size_t)k;
    }
    return (int)len;
}

int space_parse(const space *sp, const char *text, space_sched *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    bool seen[SPACE_MAX_SLOTS] = {false};
    int positional = 0;
    const char *p = text ? text : "";
    while (*p) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',' || *p == ';') p++;
        if (!*p) break;
        const char *tok = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != ',' && *p != ';') p++;
        char word[64];
        size_t wl = (size_t)(p - tok);
        if (wl >= sizeof word)
            return tlm_err_set(err, TLM_EINVAL, "schedule", "token too long: %.20s...", tok);
        memcpy(word, tok, wl);
        word[wl] = 0;
        char *eq = strchr(word, '=');
        int slot;
        const char *num;
        if (eq) {
            *eq = 0;
            slot = -1;
            for (int i = 0; i < sp->n_slot; i++)
                if (strcmp(sp->slot[i].name, word) == 0) slot = i;
            if (slot < 0)
                return tlm_err_set(err, TLM_EINVAL, word, "unknown decision for sketch %s",
                                   space_sketch_name(sp->sketch));
            num = eq + 1;
        } else {
            slot = positional++;
            if (slot >= sp->n_slot)
                return tlm_err_set(err, TLM_EINVAL, "schedule", "more than %d decisions",
                                   sp->n_slot);
            num = word;
        }
        char *end;
        long long v = strtoll(num, &end, 10);
        if (end == num || *end)
            return tlm_err_set(err, TLM_EINVAL, sp->slot[slot].name, "not an integer: '%s'", num);
        if (seen[slot])
            return tlm_err_set(err, TLM_EINVAL, sp->slot[slot].name, "given twice");
        seen[slot] = true;
        out->v[slot] = v;
    }
    for (int i = 0; i < sp->n_slot; i++)
        if (!seen[i])
            return tlm_err_set(err, TLM_EINVAL, sp->slot[i].name, "missing decision");
    out->n = sp->n_slot;
    return space_check(sp, out, err);
}

/* ---- CPU packing analysis ---- */

static const ir_expr *packed_load(const ir_stage *a, int id)
{
    const ir_expr *e = &a->expr[id];
    if (e->kind == IR_E_LOAD) return e;
    if (e->kind == IR_E_SELECT && a->expr[e->a].kind == IR_E_LOAD &&
        a->expr[e->b].kind == IR_E_CONST)
        return &a->expr[e->a];
    return NULL;
}

/* Axes (bitmask) an expression node depends on. */
static unsigned node_axes(const ir_stage *a, int id)
{
    const ir_expr *e = &a->expr[id];
    unsigned m = 0;
    int n = a->n_spatial + a->n_reduce;
    if (e->kind == IR_E_LOAD)
        for (int d = 0; d < IR_MAX_DIMS; d++)
            for (int x = 0; x < n; x++)
                if (e->idx[d].coef[x]) m |= 1u << x;
    if (e->kind == IR_E_SELECT) {
        for (int c = 0; c < e->ncond; c++)
            for (int x = 0; x < n; x++)
                if (e->cond[c].coef[x]) m |= 1u << x;
        m |= node_axes(a, e->a) | node_axes(a, e->b);
    }
    if (e->kind == IR_E_UNARY) m |= node_axes(a, e->a);
    if (e->kind == IR_E_BINARY) m |= node_axes(a, e->a) | node_axes(a, e->b);
    return m;
}

bool space_cpu_packable(const space *sp, int vaxis, int id)
{
    if (sp->sketch != SKETCH_CPU_TILE || sp->n_reduce == 0) return false;
    const ir_stage *a = anchor(sp);
    const ir_expr *ld = packed_load(a, id);
    if (!ld) return false;
    int x = vaxis;
    int64_t st[IR_MAX_DIMS], coef = 0;
    const ir_tensor *t = &sp->g->tensor[ld->tensor];
    int64_t s1 = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        st[d] = s1;
        s1 *= t->shape[d];
    }
    for (int d = 0; d < t->ndim; d++) coef += ld->idx[d].coef[x] * st[d];
    unsigned m = node_axes(a, id);
    unsigned red = ((1u << sp->n_reduce) - 1) << sp->n_spatial;
    /* Only the operand nodes directly under the body's top multiply are candidates, so a
     * packed node is never nested inside another packed node. */
    const ir_expr *top = &a->expr[a->body];
    bool operand = top->kind == IR_E_BINARY && (top->a == id || top->b == id);
    return operand && coef != 0 && (m & red) != 0;
}

int64_t space_cpu_pack_floats(const space *sp, const space_sched *s, int upto)
{
    if (sp->sketch != SKETCH_CPU_TILE || sp->n_reduce == 0) return 0;
    const ir_stage *a = anchor(sp);
    int64_t total = 0;
    int vx = space_cpu_vec_axis(sp, s, upto);
    for (int id = 0; id < a->n_expr; id++) {
        if (!space_cpu_packable(sp, vx, id)) continue;
        unsigned m = node_axes(a, id);
        int64_t f = 1;
        for (int x = 0; x < sp->n_spatial; x++)
            if (m & (1u << x)) f *= tile_partial(sp, s, upto, x, 2) * tile_partial(sp, s, upto, x, 3);
        for (int x = sp->n_spatial; x < sp->n_spatial + sp->n_reduce; x++)
            if (m & (1u << x)) f *= tile_partial(sp, s, upto, x, 1);
        total += f;
    }
    return total;
}

unsigned space_expr_axes(const space *sp, int id)
{
    return node_axes(anchor(sp), id);
}

static unsigned space_expr_axes_of(const ir_stage *a, int id)
{
    return node_axes(a, id);
}

/* ---- GPU_MMA analysis ---- */

/* The load under an operand node: the node itself, or the load a padding select guards. */
static int operand_load(const ir_stage *a, int id)
{
    const ir_expr *e = &a->expr[id];
    if (e->kind == IR_E_LOAD) return id;
    if (e->kind == IR_E_SELECT && a->expr[e->a].kind == IR_E_LOAD &&
        a->expr[e->b].kind == IR_E_CONST && a->expr[e->b].value == 0.0)
        return e->a;
    return -1;
}

/* Flat coefficient of axis x in load `id` (its stride along x in elements). */
static int64_t flat_coef(const ir_subgraph *g, const ir_stage *a, int id, int x)
{
    const ir_expr *ld = &a->expr[id];
    const ir_tensor *t = &g->tensor[ld->tensor];
    int64_t st = 1, c = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        c += ld->idx[d].coef[x] * st;
        st *= t->shape[d];
    }
    return c;
}

int space_mma_analyze(const ir_subgraph *g, space_mma_info *mi)
{
    memset(mi, 0, sizeof *mi);
    const ir_stage *a = &g->stage[g->anchor];
    if (g->anchor != 0 || a->reduce != IR_RED_SUM || a->n_reduce < 1 || a->post_scale != 1.0)
        return -1;
    switch (g->wl.op) {
    case IR_OP_DENSE:
    case IR_OP_BATCH_MATMUL:
    case IR_OP_CONV2D: break;
    default: return -1;
    }
    const ir_expr *top = &a->expr[a->body];
    if (top->kind != IR_E_BINARY || top->op != IR_B_MUL) return -1;
    int la = operand_load(a, top->a), lb = operand_load(a, top->b);
    if (la < 0 || lb < 0) return -1;
    unsigned ma = space_expr_axes_of(a, top->a), mb = space_expr_axes_of(a, top->b);
    int ns = a->n_spatial, nr = a->n_reduce;
    /* operand A reads the first spatial axis that only one operand reads */
    for (int x = 0; x < ns; x++) {
        bool ia = (ma >> x) & 1u, ib = (mb >> x) & 1u;
        if (ia == ib) continue;
        if (ib) {
            int t = la;
            la = lb, lb = t;
            unsigned u = ma;
            ma = mb, mb = u;
            mi->a_op = top->b, mi->b_op = top->a;
        } else {
            mi->a_op = top->a, mi->b_op = top->b;
        }
        break;
    }
    if (mi->a_op == mi->b_op) return -1; /* no axis tells the operands apart */
    mi->a_load = la, mi->b_load = lb;
    mi->M = mi->N = mi->K = mi->batch = 1;
    for (int x = 0; x < ns; x++) {
        bool ia = (ma >> x) & 1u, ib = (mb >> x) & 1u;
        if (ia && ib) mi->b_axis[mi->n_b++] = x, mi->batch *= a->extent[x];
        else if (ia) mi->m_axis[mi->n_m++] = x, mi->M *= a->extent[x];
        else if (ib) mi->n_axis[mi->n_n++] = x, mi->N *= a->extent[x];
        else return -1; /* an axis neither reads: a broadcast output */
    }
    if (mi->n_m == 0 || mi->n_n == 0) return -1;
    int last = -1; /* the reduction axis A (else B) is contiguous along goes innermost */
    for (int x = ns; x < ns + nr && last < 0; x++)
        if (flat_coef(g, a, la, x) == 1) last = x;
    for (int x = ns; x < ns + nr && last < 0; x++)
        if (flat_coef(g, a, lb, x) == 1) last = x;
    for (int x = ns; x < ns + nr; x++) {
        if (!((ma >> x) & 1u) || !((mb >> x) & 1u)) return -1;
        mi->K *= a->extent[x];
        if (x != last) mi->k_axis[mi->n_k++] = x;
    }
    if (last >= 0) mi->k_axis[mi->n_k++] = last;
    /* the batch axes index grid.z */
    if (mi->batch > 65535) return -1;
    return 0;
}
