/* gpu_model.h — an analytic GPU performance model: the labeller of cuda training data on
 * machines without a GPU, until measured GPU records are imported.
 *
 * It predicts the time of one launch of a generated kernel (GPU_TILE, GPU_ROWS, GPU_MMA) from
 * what is known without running it: the schedule's tiles (the space), the launch geometry and
 * the ptxas figures of the NVRTC compile (registers, shared memory, spills, stack). It is meant
 * to RANK schedules plausibly, not to simulate: every term is a first-order formula, and the
 * prediction is never called a measurement (records it labels get status "modelled").
 *
 * Contract:
 *  - measure_gpu_model fills *out and returns 0, or returns TLM_EINVAL (a figure out of range:
 *    the field is named), TLM_EUNSUPPORTED (not a cuda target, a sketch or an sm without a
 *    row in the tables) or TLM_ELIMIT (not one block fits an SM: the launch would fail).
 *  - Pure and deterministic: a function of (space, schedule, kernel figures); any thread.
 *
 * Hardware (measure_gpu_hw_get): the target descriptor (compiler/target: SM count, per-SM
 * limits of its sm_XX, bandwidth, peak FP32 and tensor FLOP/s) plus this module's tables:
 * per part the clock the peaks are quoted at, the L2 bandwidth, the DRAM latency and the share
 * of the tensor peak mma.sync reaches (on sm_90 the datasheet peak needs wgmma, which the
 * generator does not emit); per sm_XX the shared-memory allocation unit, the per-block
 * reservation and the unified L1 + shared-memory size. Unknown parts take their sm's representative
 * row.
 *
 * The model, for a launch of NB blocks of T threads (W = ceil(T/32) warps):
 *  1. Occupancy. Registers per warp = ceil(regs*32/256)*256; shared memory per block =
 *     round_up(static + dynamic, unit) + reserved. Blocks per SM
 *        B = min(max_blocks, max_warps/W, regs_per_sm/(W*regs_per_warp), smem_per_sm/smem)
 *     and the smallest term names the limiter. B = 0 → TLM_ELIMIT. Occupancy = B*W/max_warps.
 *  2. Per-block work, from the schedule:
 *     - lane ops of the FP32 pipe: the subgraph's FLOPs with each multiply-add of a summing
 *       contraction fused into one FMA; tensor-core FLOPs for GPU_MMA (padded tiles);
 *     - shared-memory wavefronts: GPU_TILE staged reads = per thread, for every distinct
 *       staged load, its register-tile points over the axes it depends on (spatial loops are
 *       unrolled, so a value reused across the register tile is loaded once) times the
 *       reduction chunk; one wavefront per warp request times the bank-conflict ways:
 *       ways = min(lanes, gcd(|stride|, 32)) where stride is the shared-memory word stride of
 *       the load along the axis threadIdx.x runs fastest on (the buffer's layout with the
 *       generator's one-float row padding), lanes = threads along that axis (<= 32), 1 for a
 *       broadcast (stride 0). Plus the staging stores. GPU_MMA: ldmatrix reads of both tiles
 *       per warp, with ways 1 when swizzled, else 8 / (distinct 16-byte bank groups among the
 *       8 row addresses of one 8x8 matrix) = the row length's power-of-two conflict, plus
 *       the cp.async stores. Unstaged GPU_TILE loads use the same L1 path: ceil(sectors/4)
 *       wavefronts per warp request. GPU_ROWS: every pass's bytes / 128, plus 2 per row and
 *       reducing stage (the partials through shared memory);
 *     - issue: warp instructions over 4 schedulers: FP32 lane ops / 32, 2 per load request
 *       (the load and its address), 3 per staging copy (load, store, index); GPU_MMA: the
 *       mma.sync, ldmatrix (512 bytes each) and cp.async (16 bytes each) instructions;
 *       GPU_ROWS: 12 per row and reducing stage (shuffles, syncs).
 *  3. Global memory. Bytes SMs pull from L2 per block: staged inputs = the bounding box of
 *     every distinct load over the block tile and one reduction chunk, per chunk; unstaged
 *     loads the same footprint (L1 holds a chunk) times the coalescing factor, plus, when the
 *     footprint of one r1 iteration (the block tile over the innermost reduction tile: what
 *     the unrolled body reuses) exceeds the block's share of L1, the missing share of every
 *     request's sectors again (L1 = the SM's unified L1 + shared memory less the resident
 *     blocks' shared memory, at least 16 KiB, over the blocks an SM holds, min(B,
 *     ceil(NB/SMs))); the output (and epilogue inputs) once, times its coalescing factor.
 *     Coalescing factor = 32-byte sectors a warp touches / sectors its useful bytes need:
 *     for a global stride s (elements) along the threadIdx.x axis, lanes l, element e bytes:
 *     s = 0 → 1 (broadcast), else min(l, ceil(l*|s|*e/32)) / ceil(l*e/32). Staging copies
 *     run flat over the box: factor 32*ceil(run/32)/run for the box's contiguous run of
 *     bytes. GPU_ROWS: every stage reads its inputs once per row; the first pass comes from
 *     L2, later passes hit L1 as far as the block's rows fit its share of L1 (the rows in
 *     flight stay in L2: DRAM sees them once).
 *     DRAM bytes: blocks of a wave (NB_wave = SMs*B consecutive block indices, the last
 *     spatial axis fastest; GPU_MMA: m fastest) share their operands in L2, so each wave reads
 *     from DRAM the footprint of every load over the union of its blocks' tiles and the whole
 *     reduction, clipped to the tensor; DRAM = max(compulsory bytes, min(L2 traffic,
 *     ceil(NB/NB_wave) * that)). Bandwidth by Little's law: bytes in flight = active SMs *
 *     resident warps * 32 lanes * bytes a thread has in flight (its independent loads, <= 4,
 *     times their width; GPU_MMA: PIPELINE-1 stages); achieved = min(peak, in flight /
 *     latency) for DRAM (its latency) and L2 (half of it).
 *        t_mem = max(DRAM bytes / achieved DRAM, L2 bytes / achieved L2)
 *  4. Local memory (spills, arrays the compiler could not keep in registers): spill bytes per
 *     thread (ptxas: stores + loads) once per non-unrolled loop iteration of every thread;
 *     a stack frame without spills (an array in local memory) adds 8 bytes per FMA. Half of
 *     it misses L1 and joins the L2 traffic; all of it takes L1 cycles and issue slots.
 *  5. An SM's time. Throughput cost of one block c = max(FP32 lane ops / per-SM FP32 rate
 *     (an FMA is one op), tensor FLOPs / (per-SM tensor peak * mma.sync share), wavefronts /
 *     clock, warp instructions / (4 schedulers * clock)); the largest names the bound.
 *     Latency hiding: h(w) = min(1, (w/4) * ilp / L), w warps resident, ilp = independent
 *     accumulators (GPU_MMA: fragments) per thread, at most 32 (2 for GPU_ROWS), L = 30
 *     cycles (a shared-memory / L1 load feeding the FMAs). Latency floor of one block:
 *     GPU_TILE staged: per reduction chunk one L2 round trip and two __syncthreads;
 *     unstaged: per non-unrolled reduction iteration an L2 round trip / ilp; GPU_MMA: per
 *     k-step an L2 round trip / max(1, PIPELINE-1) stages in flight, plus a sync; GPU_ROWS:
 *     per row and reducing stage a shuffle tree (5 x 30 cycles) and two syncs.
 *        round(k blocks) = max(k * c / h(k*W), floor), or max(k * c / h, floor + c / h) for
 *        single-buffered blocks (staged GPU_TILE, GPU_MMA with PIPELINE 1: a block waits out
 *        its own copies before it computes; the other resident blocks overlap it)
 *     The busiest SM runs ceil(NB/SMs) blocks in rounds of B: full rounds plus one partial
 *     round (the tail: a partial round of a latency-bound kernel costs a full one).
 *        t_sm = sum of its rounds
 *  6. Total: t = max(t_sm, t_mem) + 2 µs launch, plus min(t_sm, t_mem) / B for
 *     single-buffered kernels (a block's copy overlaps only the other resident blocks'
 *     compute), never below the roofline floor
 *     max(compulsory bytes / peak DRAM, FLOPs / peak FLOP/s (tensor peak for GPU_MMA)).
 */
#ifndef TLM_GPU_MODEL_H
#define TLM_GPU_MODEL_H

#include <stddef.h>

#include "compiler/space/space.h"
#include "compiler/util/err.h"

#define MEASURE_GPU_MODEL_ID "gpu_model/1" /* bump when a formula or a table changes */

/* The hardware the model sees: the target's figures, read where they are (gpu: SM count, the
 * per-SM limits, bandwidth, peaks), plus what the model derives from them and what the tables
 * above add. Valid while the target it was taken from lives. */
typedef struct measure_gpu_hw {
    const target_gpu_info *gpu; /* the target's descriptor */
    const char *part;           /* gpu->part, or the sm's representative part if it has none */
    double clock_hz;
    double dram_bps, l2_bps; /* bytes per second */
    double dram_latency_s;   /* a load that misses L2 */
    double fp32_flops_sm;    /* FLOP/s per SM (FMA = 2) */
    double tensor_flops_sm;  /* dense FP16/BF16 with FP32 accumulation, per SM, datasheet */
    double mma_sync_eff;     /* share of tensor_flops_sm mma.sync reaches */
    int smem_unit, smem_reserved; /* bytes */
    int l1_smem_bytes;            /* the unified L1 + shared memory of an SM */
} measure_gpu_hw;

/* What the compile of one kernel says (ptxas figures: -1 when unknown, counted as 0 except
 * regs, which defaults to 32). */
typedef struct measure_gpu_kernel {
    unsigned grid[3], block[3];
    unsigned smem_dynamic;
    int regs, smem_static, spill_stores, spill_loads, stack_bytes;
} measure_gpu_kernel;

typedef struct measure_gpu_pred {
    double time_s;               /* the prediction */
    double t_sm, t_mem, t_floor; /* SM time, memory time, roofline floor */
    double flops;                /* the subgraph's FLOPs */
    double dram_bytes, l2_bytes, local_bytes;
    double smem_wavefronts; /* shared-memory cycles of all blocks */
    int blocks_per_sm, warps_per_block;
    const char *limiter; /* "registers" | "smem" | "warps" | "blocks" */
    double occupancy;    /* resident warps / max warps per SM */
    double waves;        /* NB / (SMs * B) */
    double hide;         /* latency hiding of a full round, 0..1 */
    double coalesce;     /* global sectors moved / needed (>= 1) */
    double bank_ways;    /* worst shared-memory conflict degree (>= 1) */
    const char *bound;   /* "compute" | "tensor" | "smem" | "issue" | "latency" |
                          * "dram" | "l2" */
} measure_gpu_pred;

/* The model's view of target t (kind TARGET_CUDA). */
int measure_gpu_hw_get(const target *t, measure_gpu_hw *hw, tlm_error *err);

/* Predicts one launch of the kernel of schedule s (which passed space_check) in space sp. */
int measure_gpu_model(const space *sp, const space_sched *s, const measure_gpu_kernel *k,
                      measure_gpu_pred *out, tlm_error *err);

/* "gpu_model/1 h100: 1.234 ms bound=compute occ=0.50(registers) waves=3.9 ..." for a
 * record's detail. Returns the length written (truncated to cap). */
int measure_gpu_pred_text(const measure_gpu_pred *p, const char *part, char *buf, size_t cap);

#endif
