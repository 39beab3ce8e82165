/* gpu_model.c — the analytic GPU performance model (see gpu_model.h for every formula). */
#include "compiler/measure/gpu_model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* ---- tables ---- */

/* Per part, what the target descriptor lacks. clock: the boost clock the datasheet peaks are
 * quoted at (FP32 peak = SMs x FP32 lanes x 2 x clock holds for each row). l2_gbs: L2 read
 * bandwidth, rounded from public microbenchmarks (NVIDIA's Volta/Ampere/Hopper whitepapers
 * and "Dissecting the NVIDIA Volta/Turing/Ampere/Hopper GPU architecture via
 * microbenchmarking"): approximate to 20 %. dram_lat_ns: a load that misses L2 (same
 * sources). mma_eff: the share of the dense tensor peak that m16n8k16 mma.sync reaches; on
 * Hopper the datasheet peak needs wgmma, and public mma.sync kernels (FlashAttention-2,
 * Ampere-style CUTLASS) reach about 60-65 % of it. */
typedef struct {
    const char *part;
    double clock_mhz, l2_gbs, dram_lat_ns, mma_eff;
} part_row;

static const part_row PARTS[] = {
    {"v100", 1530, 2100, 450, 0.90}, {"t4", 1590, 1000, 500, 0.90},
    {"a100", 1410, 4800, 500, 0.90}, {"a10", 1695, 2000, 500, 0.90},
    {"l4", 2040, 1500, 550, 0.90},   {"rtx4090", 2520, 5000, 550, 0.90},
    {"h100", 1980, 7000, 550, 0.62}, {"h200", 1980, 7000, 550, 0.62},
};

/* Per sm_XX: the representative part (as in compiler/target) for parts without a row, the
 * shared-memory allocation unit and the per-block reservation (CUDA occupancy calculator),
 * and the unified L1 + shared-memory array of an SM (the tuning guides of each arch). */
typedef struct {
    int sm;
    const char *rep;
    int smem_unit, smem_reserved, l1_smem_kib;
} arch_row;

static const arch_row ARCHS[] = {
    {70, "v100", 256, 0, 128},   {75, "t4", 256, 0, 96},     {80, "a100", 128, 1024, 192},
    {86, "a10", 128, 1024, 128}, {89, "l4", 128, 1024, 128}, {90, "h100", 128, 1024, 256},
};

#define NPARTS ((int)(sizeof PARTS / sizeof PARTS[0]))
#define NARCHS ((int)(sizeof ARCHS / sizeof ARCHS[0]))

#define REG_ALLOC 256      /* registers per warp are allocated in units of 256 */
#define SCHEDULERS 4       /* warp schedulers per SM, one instruction a cycle each */
#define SMEM_BYTES_CLK 128 /* shared memory / L1: 32 banks x 4 bytes a cycle */
#define LAT_FMA 4.0        /* cycles, dependent FMA */
#define LAT_SMEM 30.0      /* cycles, shared-memory or L1 load to use */
#define SYNC_CYCLES 40.0   /* one __syncthreads of a resident block */
#define SHFL_CYCLES 30.0   /* one warp shuffle step */
#define LAUNCH_S 2e-6      /* back-to-back launch overhead */
#define MAX_ILP 32.0
#define L1_MIN 16384.0 /* L1 data an SM keeps whatever the shared-memory carveout */

static const part_row *part_of(const char *name)
{
    for (int i = 0; i < NPARTS; i++)
        if (!strcmp(PARTS[i].part, name)) return &PARTS[i];
    return NULL;
}

int measure_gpu_hw_get(const target *t, measure_gpu_hw *hw, tlm_error *err)
{
    memset(hw, 0, sizeof *hw);
    if (!t || t->kind != TARGET_CUDA)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "target",
                           "the GPU model labels cuda targets only, not %s",
                           t ? t->name : "(none)");
    const target_gpu_info *g = &t->gpu;
    const arch_row *ar = NULL;
    for (int i = 0; i < NARCHS; i++)
        if (ARCHS[i].sm == g->sm) ar = &ARCHS[i];
    if (!ar)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "target",
                           "the GPU model has no table for sm_%d (known: sm_70, sm_75, sm_80, "
                           "sm_86, sm_89, sm_90)",
                           g->sm);
    const part_row *pr = part_of(g->part);
    if (!pr) pr = part_of(ar->rep);
    if (!pr || g->sm_count <= 0 || g->regs_per_sm <= 0 || g->max_warps_per_sm <= 0 ||
        g->smem_per_sm <= 0 || !(g->mem_bandwidth_gbs > 0) || !(g->peak_fp32_tflops > 0))
        return tlm_err_set(err, TLM_EINVAL, "target", "%s: incomplete GPU descriptor", t->name);
    hw->gpu = g;
    hw->part = g->part[0] ? g->part : ar->rep;
    hw->clock_hz = pr->clock_mhz * 1e6;
    hw->dram_bps = g->mem_bandwidth_gbs * 1e9;
    hw->l2_bps = pr->l2_gbs * 1e9;
    hw->dram_latency_s = pr->dram_lat_ns * 1e-9;
    hw->fp32_flops_sm = g->peak_fp32_tflops * 1e12 / g->sm_count;
    hw->tensor_flops_sm = g->peak_fp16_tensor_tflops * 1e12 / g->sm_count;
    hw->mma_sync_eff = pr->mma_eff;
    hw->smem_unit = ar->smem_unit;
    hw->smem_reserved = ar->smem_reserved;
    hw->l1_smem_bytes = ar->l1_smem_kib * 1024;
    return 0;
}

/* ---- helpers ---- */

static int64_t gcd64(int64_t a, int64_t b)
{
    if (a < 0) a = -a;
    if (b < 0) b = -b;
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static double cdiv(double a, double b)
{
    return ceil(a / b);
}

/* 32-byte sectors one warp request touches when its lanes run `lanes` at a time along an
 * axis of global stride s (elements of eb bytes); the other 32/lanes groups are elsewhere. */
static double warp_sectors(int64_t s, int lanes, int eb)
{
    if (lanes < 1) lanes = 1;
    int64_t a = s < 0 ? -s : s;
    double per = a == 0 ? 1.0 : cdiv((double)lanes * (double)a * eb, 32.0);
    if (per > lanes) per = lanes;
    return per * (32.0 / lanes);
}

/* Sectors touched / sectors the useful bytes need: 1 when coalesced or broadcast. */
static double coalesce_factor(int64_t s, int lanes, int eb)
{
    if (lanes < 1) lanes = 1;
    double needed = (s == 0 ? 1.0 : cdiv((double)lanes * eb, 32.0)) * (32.0 / lanes);
    return warp_sectors(s, lanes, eb) / needed;
}

static bool same_load(const ir_expr *x, const ir_expr *y, int ndim)
{
    if (x->tensor != y->tensor) return false;
    for (int d = 0; d < ndim; d++)
        if (memcmp(&x->idx[d], &y->idx[d], sizeof x->idx[d])) return false;
    return true;
}

/* Elements of tensor t a load touches over a box of the anchor's axes (bounding box per
 * dim, clipped to the tensor); size[] gets the per-dim extents. */
static double footprint(const ir_tensor *t, const ir_expr *e, const int64_t *box, int naxes,
                        int64_t *size)
{
    double fp = 1;
    for (int d = 0; d < t->ndim; d++) {
        int64_t span = 1;
        for (int x = 0; x < naxes; x++) {
            int64_t c = e->idx[d].coef[x];
            span += (c < 0 ? -c : c) * (box[x] - 1);
        }
        if (span > t->shape[d]) span = t->shape[d];
        if (size) size[d] = span;
        fp *= (double)span;
    }
    return fp;
}

/* Row-major stride (elements) of a load's flat offset along anchor axis x. */
static int64_t global_stride(const ir_tensor *t, const ir_expr *e, int x)
{
    int64_t st = 1, s = 0;
    for (int d = t->ndim - 1; d >= 0; d--) {
        s += (int64_t)e->idx[d].coef[x] * st;
        st *= t->shape[d];
    }
    return s;
}

/* The anchor's lane ops on the FP32 pipe: FLOPs with a summing contraction's multiply-add
 * fused into one FMA. */
static double fp32_ops(const ir_subgraph *g)
{
    const ir_stage *a = &g->stage[g->anchor];
    double f = (double)ir_subgraph_flops(g);
    const ir_expr *top = &a->expr[a->body];
    if (a->reduce == IR_RED_SUM && top->kind == IR_E_BINARY && top->op == IR_B_MUL)
        f -= (double)ir_stage_points(a);
    return f > 0 ? f : 0;
}

/* Per-block work the sketch-specific parts fill in. */
typedef struct {
    double fp_ops;      /* FP32 lane ops */
    double tc_flops;    /* tensor-core FLOPs */
    double wavefronts;  /* shared-memory / L1 cycles */
    double warp_instr;  /* issued warp instructions */
    double l2_bytes;    /* pulled from L2 */
    double lat_floor_s; /* a block's latency floor */
    double ilp, lat_cycles;
    double bytes_in_flight; /* per thread */
    double local_iters;     /* non-unrolled loop iterations of a thread (spill traffic) */
    double dram_total;      /* whole kernel: DRAM bytes by wave reuse (0: compulsory) */
    bool serial;            /* single-buffered copies: a lone block waits out its floor */
    double coalesce, bank_ways;
} block_work;

/* ---- GPU_TILE ---- */

static void tile_work(const space *sp, const space_sched *s, const measure_gpu_hw *hw, double nb,
                      double nt, double l1_blk, block_work *w)
{
    const ir_subgraph *g = sp->g;
    const ir_stage *a = &g->stage[g->anchor];
    int ns = sp->n_spatial, nr = sp->n_reduce, naxes = ns + nr;
    int64_t T[IR_MAX_AXES][5], box[IR_MAX_AXES], ibox[IR_MAX_AXES], reg[IR_MAX_AXES];
    double nchunks = 1, inner_iters = 1, acc = 1;
    for (int x = 0; x < ns; x++) {
        for (int l = 0; l < 5; l++)
            T[x][l] = space_tile(sp, s, x, l);
        box[x] = ibox[x] = T[x][1] * T[x][2] * T[x][3] * T[x][4];
        reg[x] = T[x][1] * T[x][3] * T[x][4];
        acc *= (double)reg[x];
    }
    for (int r = 0; r < nr; r++) {
        int x = ns + r;
        int64_t r0 = space_tile(sp, s, x, 0), r1 = space_tile(sp, s, x, 1);
        ibox[x] = space_tile(sp, s, x, 2);
        box[x] = r1 * ibox[x];
        nchunks *= (double)r0;
        inner_iters *= (double)(r0 * r1);
    }
    int xf = -1; /* the axis threadIdx.x runs fastest on */
    for (int x = ns - 1; x >= 0 && xf < 0; x--)
        if (T[x][2] > 1) xf = x;
    int lanes = xf < 0 ? 1 : (int)(T[xf][2] < 32 ? T[xf][2] : 32);
    bool stage = space_get(sp, s, SLOT_STAGE, 0) != 0;
    int64_t vec = space_get(sp, s, SLOT_VEC_LOAD, 1);
    double W = cdiv(nt, 32);
    w->ilp = acc < MAX_ILP ? acc : MAX_ILP;
    w->lat_cycles = LAT_SMEM;
    w->local_iters = inner_iters;
    w->fp_ops = fp32_ops(g) / nb;
    w->warp_instr = w->fp_ops / 32;
    double coal_worst = 1, ways_worst = 1, mlp_bytes = 0;
    const int eb = 4;
    /* the distinct input loads (a load repeated in the body is read once) */
    const ir_expr *seen[IR_MAX_EXPR];
    int nseen = 0;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD || g->tensor[e->tensor].kind != IR_T_INPUT) continue;
        bool dup = false;
        for (int k = 0; k < nseen && !dup; k++)
            dup = same_load(seen[k], e, g->tensor[e->tensor].ndim);
        if (!dup) seen[nseen++] = e;
    }
    /* unstaged: the unrolled body reuses what one r1 iteration touches (the block tile over
     * the innermost reduction tile) from L1, when the block's share of L1 holds it */
    double inner_fp = 0;
    for (int k = 0; k < nseen && !stage; k++)
        inner_fp += footprint(&g->tensor[seen[k]->tensor], seen[k], ibox, naxes, NULL) * eb;
    double l1_hit = inner_fp <= l1_blk ? 1.0 : l1_blk / inner_fp;
    for (int k = 0; k < nseen; k++) {
        const ir_expr *e = seen[k];
        const ir_tensor *t = &g->tensor[e->tensor];
        int64_t size[IR_MAX_DIMS];
        double fp = footprint(t, e, box, naxes, size);
        /* per-thread loads of one chunk: the register tile over the axes it depends on (the
         * unrolled spatial loops load a reused value once) times the reduction chunk */
        double per_thread = 1;
        for (int x = 0; x < naxes; x++) {
            bool dep = false;
            for (int d = 0; d < t->ndim; d++)
                dep |= e->idx[d].coef[x] != 0;
            if (dep) per_thread *= (double)(x < ns ? reg[x] : box[x]);
        }
        double reqs = W * per_thread * nchunks; /* warp requests per block */
        w->warp_instr += 2 * reqs;              /* the load and its address */
        if (stage) {
            /* the buffer's layout: compact rows, one float of padding per row when rows are a
             * multiple of 8 floats and the copies are scalar (cuda.c tile_plan_staging) */
            int L = t->ndim - 1;
            bool pad = vec == 1 && L > 0 && size[L] % 8 == 0 && fp > (double)size[L];
            int64_t sst[IR_MAX_DIMS], st = 1;
            for (int d = L; d >= 0; d--) {
                sst[d] = st;
                st *= size[d] + (d == L && pad ? 1 : 0);
            }
            int64_t sstride = 0;
            if (xf >= 0)
                for (int d = 0; d < t->ndim; d++)
                    sstride += (int64_t)e->idx[d].coef[xf] * sst[d];
            double ways = sstride == 0 ? 1 : (double)gcd64(sstride, 32);
            if (ways > lanes) ways = lanes;
            if (ways > ways_worst) ways_worst = ways;
            w->wavefronts += reqs * ways;
            /* the copy: flat over the box, runs of contiguous bytes */
            double run = (double)size[L];
            for (int d = L - 1; d >= 0 && size[d + 1] == t->shape[d + 1]; d--)
                run *= (double)size[d];
            double run_b = run * eb;
            double copy_coal = 32.0 * cdiv(run_b, 32.0) / run_b;
            if (copy_coal > coal_worst) coal_worst = copy_coal;
            double bytes = fp * eb * nchunks;
            w->l2_bytes += bytes * copy_coal;
            w->wavefronts += bytes / SMEM_BYTES_CLK;                /* stores into shared memory */
            w->warp_instr += 3 * (fp / (double)vec) / 32 * nchunks; /* load, store, index */
            double copies = cdiv(fp / (double)vec, nt);
            mlp_bytes += (copies < 4 ? copies : 4) * (double)vec * eb;
        } else {
            int64_t gs = xf >= 0 ? global_stride(t, e, xf) : 0;
            double coal = coalesce_factor(gs, lanes, eb);
            if (coal > coal_worst) coal_worst = coal;
            /* L1: one 128-byte wavefront per 4 sectors a request touches */
            double sectors = warp_sectors(gs, lanes, eb);
            w->wavefronts += reqs * (sectors > 4 ? cdiv(sectors, 4.0) : 1.0);
            w->l2_bytes += fp * eb * nchunks * coal + reqs * sectors * 32 * (1 - l1_hit);
            mlp_bytes += (per_thread < 4 ? per_thread : 4) * eb;
        }
    }
    /* the output (and what the epilogue reads along with it), once */
    const ir_tensor *out = &g->tensor[g->output];
    int64_t ostride = 1;
    if (xf >= 0)
        for (int x = xf + 1; x < ns; x++)
            ostride *= a->extent[x];
    double ocoal = xf >= 0 ? coalesce_factor(ostride, lanes, eb) : 1.0;
    if (ocoal > coal_worst) coal_worst = ocoal;
    double out_bytes = (double)ir_tensor_numel(out) * eb / nb;
    double epi_bytes = 0;
    for (int ti = 0; ti < g->n_tensor; ti++) {
        if (g->tensor[ti].kind != IR_T_INPUT) continue;
        bool anchor_reads = false;
        for (int k = 0; k < nseen && !anchor_reads; k++)
            anchor_reads = seen[k]->tensor == ti;
        if (!anchor_reads) epi_bytes += (double)ir_tensor_numel(&g->tensor[ti]) * eb / nb;
    }
    w->l2_bytes += (out_bytes + epi_bytes) * ocoal;
    w->warp_instr += 2 * (out_bytes + epi_bytes) / eb / 32;
    w->coalesce = coal_worst;
    w->bank_ways = ways_worst;
    w->bytes_in_flight = mlp_bytes > 0 ? mlp_bytes : eb;
    /* latency floor: staged, per chunk an L2 round trip and two syncs */
    double lat_l2 = 0.5 * hw->dram_latency_s;
    w->lat_floor_s = stage ? nchunks * (lat_l2 + 2 * SYNC_CYCLES / hw->clock_hz)
                           : inner_iters * lat_l2 / (w->ilp > 1 ? w->ilp : 1);
    w->serial = stage;
}

/* Whole-kernel DRAM bytes of GPU_TILE when the blocks of a wave share operands in L2. */
static double tile_dram(const space *sp, const space_sched *s, double nb, double wave_blocks)
{
    const ir_subgraph *g = sp->g;
    const ir_stage *a = &g->stage[g->anchor];
    int ns = sp->n_spatial, nr = sp->n_reduce, naxes = ns + nr;
    int64_t ubox[IR_MAX_AXES];
    double rem = wave_blocks < nb ? wave_blocks : nb;
    for (int x = ns - 1; x >= 0; x--) {
        double t0 = (double)space_tile(sp, s, x, 0);
        double wb = rem < t0 ? rem : t0;
        int64_t inner = 1;
        for (int l = 1; l < 5; l++)
            inner *= space_tile(sp, s, x, l);
        ubox[x] = (int64_t)wb * inner;
        rem = cdiv(rem, wb);
    }
    for (int x = ns; x < naxes; x++)
        ubox[x] = a->extent[x];
    double per_wave = 0;
    const ir_expr *seen[IR_MAX_EXPR];
    int nseen = 0;
    for (int id = 0; id < a->n_expr; id++) {
        const ir_expr *e = &a->expr[id];
        if (e->kind != IR_E_LOAD || g->tensor[e->tensor].kind != IR_T_INPUT) continue;
        const ir_tensor *t = &g->tensor[e->tensor];
        bool dup = false;
        for (int k = 0; k < nseen && !dup; k++)
            dup = same_load(seen[k], e, t->ndim);
        if (dup) continue;
        seen[nseen++] = e;
        per_wave += footprint(t, e, ubox, naxes, NULL) * 4;
    }
    return cdiv(nb, wave_blocks) * per_wave;
}

/* ---- GPU_MMA ---- */

static int mma_work(const space *sp, const space_sched *s, const measure_gpu_hw *hw, double nb,
                    double nt, block_work *w, tlm_error *err)
{
    const space_mma_info *mi = &sp->mma;
    double wm = (double)space_get(sp, s, SLOT_WARP_M, 16),
           wn = (double)space_get(sp, s, SLOT_WARP_N, 8);
    double wpm = (double)space_get(sp, s, SLOT_WARPS_M, 1),
           wpn = (double)space_get(sp, s, SLOT_WARPS_N, 1);
    double bk = (double)space_get(sp, s, SLOT_BLOCK_K, 16),
           p = (double)space_get(sp, s, SLOT_PIPELINE, 1);
    bool swz = space_get(sp, s, SLOT_SWIZZLE, 0) != 0;
    if (!(hw->tensor_flops_sm > 0))
        return tlm_err_set(err, TLM_EUNSUPPORTED, "target", "%s has no FP16/BF16 tensor cores",
                           hw->part);
    const int eb = 2;
    double BM = wm * wpm, BN = wn * wpn, warps = wpm * wpn;
    double ksteps = cdiv((double)mi->K, bk);
    w->tc_flops = 2 * BM * BN * ksteps * bk;
    double contraction = 2.0 * (double)mi->M * (double)mi->N * (double)mi->K * (double)mi->batch;
    double epi = (double)ir_subgraph_flops(sp->g) - contraction;
    w->fp_ops = (epi > 0 ? epi : 0) / nb;
    /* ldmatrix: 8 rows of 16 bytes per 8x8 matrix; rows bk*2 bytes apart (K-major tiles) */
    double ways = 1;
    if (!swz) {
        double rl = bk * eb;
        int groups[8], ng = 0;
        for (int i = 0; i < 8; i++) {
            int gidx = (int)fmod(i * rl, 128.0) / 16;
            bool have = false;
            for (int k = 0; k < ng; k++)
                have |= groups[k] == gidx;
            if (!have) groups[ng++] = gidx;
        }
        ways = 8.0 / ng;
    }
    double ldm_bytes = ksteps * warps * (wm + wn) * bk * eb;
    w->wavefronts =
        ldm_bytes / SMEM_BYTES_CLK * ways + ksteps * (BM + BN) * bk * eb / SMEM_BYTES_CLK;
    double mma_instr = ksteps * warps * (wm / 16) * (wn / 8) * (bk / 16);
    w->warp_instr = mma_instr + ldm_bytes / 512 + ksteps * (BM + BN) * bk * eb / 16 / 32 * 2 +
                    w->fp_ops / 32 + BM * BN / 32 * 2;
    w->l2_bytes = ksteps * bk * (BM + BN) * eb + BM * BN * eb;
    w->ilp = (wm / 16) * (wn / 8);
    if (w->ilp > MAX_ILP) w->ilp = MAX_ILP;
    w->lat_cycles = LAT_SMEM;
    w->local_iters = ksteps;
    w->bank_ways = ways;
    w->coalesce = 1;
    double per_thread_stage = (BM + BN) * bk * eb / nt;
    w->bytes_in_flight = per_thread_stage * (p > 1 ? p - 1 : 1);
    double lat_l2 = 0.5 * hw->dram_latency_s;
    w->lat_floor_s = ksteps * (lat_l2 / (p > 1 ? p - 1 : 1) + SYNC_CYCLES / hw->clock_hz);
    w->serial = p <= 1;
    return 0;
}

/* Whole-kernel DRAM bytes of GPU_MMA: the blocks of a wave (blockIdx.x over m fastest) share
 * their A and B panels in L2. */
static double mma_dram(const space *sp, const space_sched *s, double nb, double wave_blocks)
{
    const space_mma_info *mi = &sp->mma;
    double BM = (double)(space_get(sp, s, SLOT_WARP_M, 16) * space_get(sp, s, SLOT_WARPS_M, 1));
    double BN = (double)(space_get(sp, s, SLOT_WARP_N, 8) * space_get(sp, s, SLOT_WARPS_N, 1));
    double mb = cdiv((double)mi->M, BM), nbn = cdiv((double)mi->N, BN);
    double wv = wave_blocks < nb ? wave_blocks : nb;
    double wmb = wv < mb ? wv : mb, wnb = cdiv(wv, mb);
    if (wnb > nbn) wnb = nbn;
    double rows = fmin((double)mi->M, wmb * BM), cols = fmin((double)mi->N, wnb * BN);
    return cdiv(nb, wave_blocks) * (rows + cols) * (double)mi->K * 2;
}

/* ---- GPU_ROWS ---- */

static void rows_work(const space *sp, const space_sched *s, const measure_gpu_hw *hw, double nb,
                      double nt, double l1_blk, block_work *w)
{
    const ir_subgraph *g = sp->g;
    const int eb = 4;
    double rows_blk = (double)space_get(sp, s, SLOT_ROWS, 1);
    double first = 0, again = 0; /* first reads of each input, and the passes after */
    int red = 0;
    bool read_once[IR_MAX_TENSORS] = {false};
    for (int si = 0; si < g->n_stage; si++) {
        const ir_stage *st = &g->stage[si];
        red += st->reduce != IR_RED_NONE;
        bool seen[IR_MAX_TENSORS] = {false};
        for (int id = 0; id < st->n_expr; id++) {
            const ir_expr *e = &st->expr[id];
            if (e->kind != IR_E_LOAD || g->tensor[e->tensor].kind != IR_T_INPUT || seen[e->tensor])
                continue;
            seen[e->tensor] = true;
            double bytes = (double)ir_tensor_numel(&g->tensor[e->tensor]) * eb;
            if (read_once[e->tensor])
                again += bytes;
            else
                first += bytes;
            read_once[e->tensor] = true;
        }
    }
    /* later passes over a block's rows hit L1 while its share of L1 holds them */
    double rows_in = first / nb;
    double hit = rows_in <= l1_blk ? 1.0 : l1_blk / rows_in;
    double out_b = (double)ir_tensor_numel(&g->tensor[g->output]) * eb;
    w->l2_bytes = (first + again * (1 - hit) + out_b) / nb;
    double l1_reads = (first + again) / nb;
    w->fp_ops = (double)ir_subgraph_flops(g) / nb;
    w->warp_instr = w->fp_ops / 32 + 2 * (l1_reads + out_b / nb) / eb / 32 + rows_blk * red * 12;
    w->wavefronts = (l1_reads + out_b / nb) / SMEM_BYTES_CLK + rows_blk * red * 2;
    w->ilp = 2;
    w->lat_cycles = LAT_SMEM;
    w->local_iters = rows_blk;
    w->coalesce = 1;
    w->bank_ways = 1;
    double per_row =
        (double)ir_stage_points(&g->stage[g->anchor]) / (double)(sp->rows > 0 ? sp->rows : 1);
    double per_thread = cdiv(per_row, nt);
    w->bytes_in_flight = (per_thread < 4 ? per_thread : 4) * eb;
    w->lat_floor_s = rows_blk * red * (5 * SHFL_CYCLES + 2 * SYNC_CYCLES) / hw->clock_hz;
}

/* ---- the model ---- */

int measure_gpu_model(const space *sp, const space_sched *s, const measure_gpu_kernel *k,
                      measure_gpu_pred *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!sp || !s || !k) return tlm_err_set(err, TLM_EINVAL, "", "gpu model: missing argument");
    measure_gpu_hw hw;
    int rc = measure_gpu_hw_get(&sp->tgt, &hw, err);
    if (rc) return rc;
    const target_gpu_info *gpu = hw.gpu;
    if (sp->sketch != SKETCH_GPU_TILE && sp->sketch != SKETCH_GPU_ROWS &&
        sp->sketch != SKETCH_GPU_MMA)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "sketch",
                           "the GPU model has no rule for sketch %s",
                           space_sketch_name(sp->sketch));
    double nb = 1, nt = 1;
    for (int i = 0; i < 3; i++) {
        if (k->grid[i] < 1) return tlm_err_set(err, TLM_EINVAL, "grid", "grid[%d] is 0", i);
        if (k->block[i] < 1) return tlm_err_set(err, TLM_EINVAL, "block", "block[%d] is 0", i);
        nb *= k->grid[i];
        nt *= k->block[i];
    }
    if (nt > gpu->max_threads_per_block)
        return tlm_err_set(err, TLM_EINVAL, "block", "%.0f threads per block; %s allows %d", nt,
                           hw.part, gpu->max_threads_per_block);
    int regs = k->regs < 0 ? 32 : k->regs;
    if (regs > 255) return tlm_err_set(err, TLM_EINVAL, "regs", "%d registers per thread", regs);
    int spills =
        (k->spill_stores > 0 ? k->spill_stores : 0) + (k->spill_loads > 0 ? k->spill_loads : 0);
    int stack = k->stack_bytes > 0 ? k->stack_bytes : 0;

    /* 1. occupancy */
    int W = (int)cdiv(nt, 32);
    int regs_warp = (int)(cdiv(regs > 0 ? regs * 32.0 : 1, REG_ALLOC) * REG_ALLOC);
    int smem = (int)(k->smem_dynamic + (k->smem_static > 0 ? k->smem_static : 0));
    int smem_blk = (int)(cdiv(smem, hw.smem_unit) * hw.smem_unit) + hw.smem_reserved;
    int by_blocks = gpu->max_blocks_per_sm, by_warps = gpu->max_warps_per_sm / W;
    int by_regs = gpu->regs_per_sm / (W * regs_warp);
    int by_smem = smem > 0 ? gpu->smem_per_sm / smem_blk : by_blocks;
    int B = by_blocks;
    out->limiter = "blocks";
    if (by_warps < B) B = by_warps, out->limiter = "warps";
    if (by_regs < B) B = by_regs, out->limiter = "registers";
    if (by_smem < B) B = by_smem, out->limiter = "smem";
    if (B < 1)
        return tlm_err_set(err, TLM_ELIMIT, out->limiter,
                           "not one block fits an SM of %s (%d registers x %d threads, %d bytes of "
                           "shared memory)",
                           hw.part, regs, (int)nt, smem);
    out->blocks_per_sm = B;
    out->warps_per_block = W;
    out->occupancy = (double)(B * W) / gpu->max_warps_per_sm;
    double wave_blocks = (double)gpu->sm_count * B;
    out->waves = nb / wave_blocks;
    /* L1 is shared by the blocks an SM actually holds (a small grid leaves it to fewer) */
    double resident_blocks = fmin((double)B, cdiv(nb, gpu->sm_count));
    double l1_sm = hw.l1_smem_bytes - resident_blocks * (smem > 0 ? smem_blk : 0);
    double l1_blk = (l1_sm > L1_MIN ? l1_sm : L1_MIN) / resident_blocks;

    /* 2.-4. per-block work */
    block_work w;
    memset(&w, 0, sizeof w);
    if (sp->sketch == SKETCH_GPU_TILE) {
        tile_work(sp, s, &hw, nb, nt, l1_blk, &w);
        w.dram_total = tile_dram(sp, s, nb, wave_blocks);
    } else if (sp->sketch == SKETCH_GPU_MMA) {
        if ((rc = mma_work(sp, s, &hw, nb, nt, &w, err))) return rc;
        w.dram_total = mma_dram(sp, s, nb, wave_blocks);
    } else {
        rows_work(sp, s, &hw, nb, nt, l1_blk, &w);
    }
    double local = 0;
    if (spills > 0)
        local = nt * spills * w.local_iters;
    else if (stack > 0)
        local = w.fp_ops * 8; /* an array in local memory: a load and a store per FMA */
    w.l2_bytes += 0.5 * local;
    w.warp_instr += local / 4 / 32;
    w.wavefronts += local / SMEM_BYTES_CLK;

    /* 5. one SM: rounds of B blocks over its share */
    double fp_rate = hw.fp32_flops_sm / 2; /* lane ops (an FMA is one) per second */
    double c = w.fp_ops / fp_rate;
    const char *bound = "compute";
    if (w.tc_flops > 0) {
        double tc = w.tc_flops / (hw.tensor_flops_sm * hw.mma_sync_eff);
        if (tc > c) c = tc, bound = "tensor";
    }
    double smem_t = w.wavefronts / hw.clock_hz;
    if (smem_t > c) c = smem_t, bound = "smem";
    double issue_t = w.warp_instr / (SCHEDULERS * hw.clock_hz);
    if (issue_t > c) c = issue_t, bound = "issue";
    double per_sm = cdiv(nb, gpu->sm_count);
    double full = floor(per_sm / B), part = per_sm - full * B;
    double t_sm = 0, hide_full = 0;
    for (int r = 0; r < 2; r++) {
        double kb = r == 0 ? B : part, n = r == 0 ? full : (part > 0 ? 1 : 0);
        if (n == 0) continue;
        double h = (kb * W / SCHEDULERS) * w.ilp / w.lat_cycles;
        if (h > 1) h = 1;
        if (r == 0 || full == 0) hide_full = h;
        /* a single-buffered block waits out its copies itself: its own chain is the floor
         * plus its compute; the other resident blocks overlap it */
        double rt = kb * c / h, own = w.serial ? w.lat_floor_s + c / h : w.lat_floor_s;
        if (own > rt) rt = own;
        t_sm += n * rt;
    }
    out->hide = hide_full;
    if (t_sm > per_sm * c * 1.0001) bound = "latency"; /* the rounds wait, not the pipes */

    /* 3. memory */
    double compulsory = (double)ir_subgraph_bytes(sp->g);
    double l2 = w.l2_bytes * nb;
    double dram = w.dram_total > 0 ? fmin(l2, w.dram_total) : compulsory;
    if (dram < compulsory) dram = compulsory;
    double active_sms = nb < gpu->sm_count ? nb : gpu->sm_count;
    double resident = (per_sm < B ? per_sm : B) * W;
    double in_flight = active_sms * resident * 32 * w.bytes_in_flight;
    double dram_bw = fmin(hw.dram_bps, in_flight / hw.dram_latency_s);
    double l2_bw = fmin(hw.l2_bps, in_flight / (0.5 * hw.dram_latency_s));
    double t_dram = dram / dram_bw, t_l2 = l2 / l2_bw;
    double t_mem = t_dram > t_l2 ? t_dram : t_l2;

    /* 6. total */
    if (t_mem > t_sm) bound = t_dram >= t_l2 ? "dram" : "l2";
    double t = (t_sm > t_mem ? t_sm : t_mem) + LAUNCH_S;
    /* single-buffered copies overlap compute only across the other resident blocks */
    if (w.serial) t += (t_sm < t_mem ? t_sm : t_mem) / B;
    double flops = (double)ir_subgraph_flops(sp->g);
    double peak = sp->sketch == SKETCH_GPU_MMA ? hw.tensor_flops_sm * gpu->sm_count
                                               : hw.fp32_flops_sm * gpu->sm_count;
    double floor_t = fmax(compulsory / hw.dram_bps, flops / peak);
    if (t < floor_t) t = floor_t;
    if (!isfinite(t) || !(t > 0))
        return tlm_err_set(err, TLM_ERUNTIME, "", "gpu model: no finite time (internal)");
    out->time_s = t;
    out->t_sm = t_sm;
    out->t_mem = t_mem;
    out->t_floor = floor_t;
    out->flops = flops;
    out->dram_bytes = dram;
    out->l2_bytes = l2;
    out->local_bytes = local * nb;
    out->smem_wavefronts = w.wavefronts * nb;
    out->coalesce = w.coalesce;
    out->bank_ways = w.bank_ways;
    out->bound = bound;
    return 0;
}

int measure_gpu_pred_text(const measure_gpu_pred *p, const char *part, char *buf, size_t cap)
{
    int n =
        snprintf(buf, cap,
                 "%s %s: %.4g ms bound=%s occ=%.2f(%s, %d blk/SM) waves=%.2f hide=%.2f "
                 "dram=%.3g MB l2=%.3g MB coalesce=%.2f bank_ways=%.0f local=%.3g MB",
                 MEASURE_GPU_MODEL_ID, part ? part : "?", p->time_s * 1e3, p->bound, p->occupancy,
                 p->limiter, p->blocks_per_sm, p->waves, p->hide, p->dram_bytes / 1e6,
                 p->l2_bytes / 1e6, p->coalesce, p->bank_ways, p->local_bytes / 1e6);
    return n < 0 ? 0 : (size_t)n >= cap ? (int)cap - 1 : n;
}
