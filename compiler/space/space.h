/* space.h — the schedule space: a sketch per (subgraph, target) and its decision slots.
 *
 * Contract:
 *  - space_build picks the sketch for the subgraph's op family and target kind and lists the
 *    decision slots in the order they are decided (and spoken by the tensor language).
 *  - space_legal_values(sp, slot, partial) is the ONLY place that decides validity. Given the
 *    values of slots [0, slot) it returns the values of `slot` that keep the schedule valid
 *    AND completable: for every value offered some completion exists. Completability holds by
 *    construction: every constraint is monotone in each factor and the value 1 (or the first
 *    value of a flag slot) never uses more of any resource, so offering only values that fit
 *    given the current partial product leaves a legal completion (all later slots at their
 *    minimal value).
 *  - Tile factors: GPU tiles and GPU reduction tiles are exact divisors of what is left of
 *    the axis (the outermost level is the quotient; codegen emits no guards). CPU spatial tiles
 *    may also take a ladder of non-divisors (1..8, powers of two, multiples of the vector
 *    lanes) when the axis padded through that level stays within space_pad_limit (~15 %,
 *    25 % below 64): level 0 is then the rounded-up quotient, space_padded_extent the product of all
 *    levels, and codegen bounds the tile loops and clamps the loads of edge register tiles,
 *    never storing a padded point. CPU reduction chunks (level 1) are the divisors plus the
 *    powers of two 16..512 below the extent: level 0 is the rounded-up chunk count and the
 *    last chunk is shorter (codegen bounds its r1 loops and packing; nothing is padded), so
 *    a prime K still gets cache-sized, packable chunks. Zero padding of convolutions is
 *    handled by select().
 *  - Sampling is uniform per slot over legal values (not uniform over complete schedules).
 *  - The default schedule is a deterministic rule of thumb; it is always legal.
 *
 * Sketches and slots (level 0 is the outermost and is never a slot: it is the quotient):
 *   CPU_TILE  (anchor of matmul/conv/depthwise/pool/transpose/elementwise families)
 *             spatial axes split 4 ways (levels 0..3), reduction axes 2 ways (0..1):
 *             loop order  s0 (fused, parallel) | s1 | r0 | s2 | r1 | s3
 *             where s2 x s3 is the accumulator block kept in a local buffer (the vector
 *             axis innermost) and s3 the register tile (fully unrolled; its vector axis in
 *             vectors of the target's lanes, every other axis in register rows; at most 64
 *             along an axis, 8 vectors along the vector axis with 32 registers: 128 floats).
 *             slots: VECTORIZE first (it sets how the register tile counts registers:
 *             space_cpu_tile_lanes): 0 scalar, 1 the last spatial axis, v the v-th innermost
 *             (any spatial axis of extent >= CPU_VEC_AXIS_MIN when there is a reduction:
 *             conv filters, GEMM rows); then for each spatial axis TILE levels 3,2,1; for each
 *             reduction axis TILE level 1; PARALLEL {0: serial, 1: fuse+parallelise s0, 2: fuse s0 and s1};
 *             UNROLL {0,16,64,512} (auto_unroll_max_step on the r1 loop);
 *             PACK {0,1} (anchors with a reduction): copy, per r0 chunk, every operand that
 *             depends on the vector axis into a local buffer laid out in the order the
 *             register tile reads it, the vector axis innermost (a cache_read stage: it
 *             removes the large-stride, cache set-conflicting walk over B rows in a GEMM, and
 *             turns strided reads — Bᵀ, stride-2 convolution inputs, conv filters along F —
 *             into contiguous vectors); legal when vectorising and the buffers fit
 *             CPU_PACK_MAX floats. Codegen packs panels that 4 or more tasks read once per
 *             call, ahead of the task loop, when they fit half an L2 or would otherwise cost
 *             a task one float read across the vector axis (a transposing pack: a conv's
 *             weights along F) per 32 vector FMAs; others are packed by each task, hot in its
 *             cache when used. A padding select the register tile
 *             reads unpacked (a conv's input when the vectors run along F) reads instead a
 *             copy of its tensor with the padding written in, made once per call, when the
 *             work is 8 vector FMAs per copied float or more: no bound checks, no edge tiles.
 *             Codegen's write-back: with one reduction chunk and the vectors along the
 *             output's last axis, each register tile goes to the output through the epilogue
 *             as soon as it is done (its lines prefetched for writing while it computes);
 *             otherwise the block is written after the last
 *             chunk, and a block vectorised along another axis than the output's last runs
 *             its epilogue in place along the vectors, then is copied out by rows.
 *   CPU_ROWS  (softmax, layer_norm, rms_norm, reduce_*, global_avg_pool2d NCHW): the row axes
 *             (spatial axes shared by every stage) are fused and parallelised; each stage runs
 *             per row with vectorised inner loops.
 *             slots: ROWS (rows per task, a divisor of the row count), PARALLEL {0,1},
 *             VECTORIZE {0,1}, UNROLL {0,16,64}.
 *   CPU_WINDOW (depthwise_conv2d, max_pool2d, avg_pool2d in NCHW whose packed plane fits a
 *             thread's stack, 384 KiB; larger planes, strides past 16 and NHWC stay CPU_TILE):
 *             one task per (n, c) plane (parallel); the kernel first packs the plane's input
 *             rows, zero (or -inf) padded, split into `stride` column phases, so that every
 *             window tap reads contiguous vectors along OW (stride 2: even and odd columns);
 *             then an (oh rows x ow columns) register tile of accumulators walks the input
 *             rows of its window once, each loaded vector feeding every output row that uses
 *             it, the taps as broadcasts. Tiles need not divide OH or OW (the packed plane and
 *             a row buffer cover the rounded-up extents; only real points are stored, through
 *             the epilogue).
 *             slots: VECTORIZE {0,1} (vectors of the target's lanes along OW), TILE ow level 3
 *             (register tile columns: 1..4 vectors, or 1..8 scalars), TILE oh level 3
 *             (register rows: 1..8; rows x vectors within the register budget), PARALLEL {0,1}.
 *             With 8- or 16-lane vectors VECTORIZE may also be 2 (WINDOW_VEC_CHANNELS): one
 *             task per block of `lanes` channels, the plane packed channel-interleaved (a
 *             point's channels one vector, transposed in 8x8 / 16x16 blocks), each tap a
 *             weight vector times a loaded input vector, no broadcasts and no padded columns;
 *             the output rows transposed back. TILE ow then counts output columns (1..), TILE
 *             oh rows (1..8), rows x columns within the registers less two; the last tile of
 *             each axis starts at the extent less its size, overlapping the one before it.
 *             Levels 1 and 2 are not slots (1); level 0 is the rounded-up quotient.
 *   GPU_TILE  spatial axes split 5 ways (block | vthread | thread | inner1 | inner2, levels
 *             0..4), reductions 3 ways (levels 0..2): SSSRRSRS:
 *             grid(s0) | vthread s1 | thread s2 | r0 | [stage inputs] | r1 | s3 | r2 | s4
 *             slots: spatial TILE levels 4,3,2,1 per axis; reduction TILE levels 2,1 per
 *             axis; STAGE {0,1} (shared-memory staging of every input read by the anchor);
 *             VEC_LOAD {1,2,4} (vector width of the cooperative loads, used when staging);
 *             UNROLL {0,16,64,512,1024}.
 *             Limits: threads = prod(level 2) in [1, max_threads_per_block], registers estimate
 *             prod(levels 1,3,4) <= 128 accumulators, staged footprint <= smem_per_block.
 *   GPU_ROWS  one block per ROWS rows; THREADS per block {32,64,...,1024}; cross-thread
 *             reduction by warp shuffles then shared memory; UNROLL {0,16,64}.
 *   GPU_MMA   tensor cores (float16/bfloat16 on sm_80 and later) for contractions whose body
 *             is the product of two operands (dense, batch_matmul, conv2d as an implicit
 *             GEMM: space_mma_analyze). The GEMM view: M = the spatial axes only operand A
 *             reads, N = those only B reads, batch = those both read, K = the reduction
 *             axes. A block computes BM x BN = (WARP_M * WARPS_M) x (WARP_N * WARPS_N) of one
 *             batch; each warp a WARP_M x WARP_N tile of m16n8k16 mma.sync fragments (fp32
 *             accumulators); operands pass global -> shared by cp.async (16-byte chunks) or
 *             scalar copies, through PIPELINE stages of BLOCK_K, read by ldmatrix.
 *             slots: WARP_M {16,32,64}, WARP_N {8,16,32,64} (at most 128 accumulators a
 *             thread), WARPS_M, WARPS_N {1,2,4} (at most 8 warps), BLOCK_K {16,32,64},
 *             PIPELINE {1,2,3,4} (stages x (BM + BN) x BLOCK_K x 2 bytes within the
 *             target's opt-in shared memory), SWIZZLE {0,1}. Tiles need not divide M, N or K
 *             (edges are zero-filled on load and masked on store) but never exceed them by
 *             more than one fragment.
 */
#ifndef TLM_SPACE_H
#define TLM_SPACE_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/ir/ir.h"
#include "compiler/target/target.h"
#include "compiler/util/err.h"

#define SPACE_MAX_SLOTS 64
#define SPACE_MAX_VALUES 4096 /* legal values of one slot never exceed this */

/* The sketches: the one table a new sketch is added to. Each row gives its enum name, its
 * printed name (also its tensor-language token "sketch:<name>", in this order, so appending
 * a row appends a token and leaves the others' ids alone; the vocabulary version still
 * bumps) and the target kind whose code generator implements it. Code generators route by
 * tables indexed by space_sketch (compiler/codegen cpu.c, cuda.c) whose sizes are checked
 * against SKETCH_COUNT at compile time. */
#define SPACE_SKETCHES(X)                                                                          \
    X(CPU_TILE, "cpu_tile", TARGET_CPU)                                                            \
    X(CPU_ROWS, "cpu_rows", TARGET_CPU)                                                            \
    X(GPU_TILE, "gpu_tile", TARGET_CUDA)                                                           \
    X(GPU_ROWS, "gpu_rows", TARGET_CUDA)                                                           \
    X(GPU_MMA, "gpu_mma", TARGET_CUDA)                                                             \
    X(CPU_WINDOW, "cpu_window", TARGET_CPU)

typedef enum {
#define SPACE_SKETCH_ENUM(id, name, kind) SKETCH_##id,
    SPACE_SKETCHES(SPACE_SKETCH_ENUM)
#undef SPACE_SKETCH_ENUM
        SKETCH_COUNT
} space_sketch;

typedef enum {
    SLOT_TILE,
    SLOT_PARALLEL,
    SLOT_VECTORIZE,
    SLOT_UNROLL,
    SLOT_ROWS,
    SLOT_THREADS,
    SLOT_STAGE,
    SLOT_VEC_LOAD,
    SLOT_PACK,
    SLOT_WARP_M,   /* GPU_MMA: rows of a warp's tile (multiple of 16) */
    SLOT_WARP_N,   /* GPU_MMA: columns of a warp's tile (multiple of 8) */
    SLOT_WARPS_M,  /* GPU_MMA: warps of a block along M */
    SLOT_WARPS_N,  /* GPU_MMA: warps of a block along N */
    SLOT_BLOCK_K,  /* GPU_MMA: reduction chunk per pipeline stage (multiple of 16) */
    SLOT_PIPELINE, /* GPU_MMA: shared-memory stages of the cp.async pipeline */
    SLOT_SWIZZLE,  /* GPU_MMA: XOR-swizzled shared layout {0,1} */
    SLOT_KIND_COUNT
} space_slot_kind;

typedef struct {
    space_slot_kind kind;
    int axis;       /* SLOT_TILE: anchor axis index (spatial first, then reduction) */
    int level;      /* SLOT_TILE: split level */
    char name[24];  /* "tile.i.3", "parallel", ... (printing and parsing) */
} space_slot;

/* GPU_MMA: the GEMM view of an anchor (space.h GPU_MMA). Axis lists are anchor axis indices,
 * outermost first; k_axis is ordered so that the reduction axis operand A (else B) is
 * contiguous along comes last, which lets 8 consecutive k be one 16-byte copy. */
typedef struct {
    int a_op, b_op;     /* the multiply's operand nodes (a load, or a padding select of one) */
    int a_load, b_load; /* the loads under them */
    int n_m, n_n, n_b, n_k;
    int m_axis[IR_MAX_AXES], n_axis[IR_MAX_AXES], b_axis[IR_MAX_AXES], k_axis[IR_MAX_AXES];
    int64_t M, N, K, batch; /* products of the extents */
} space_mma_info;
typedef struct space {
    const ir_subgraph *g;
    target tgt;
    space_sketch sketch;
    int n_slot;
    space_slot slot[SPACE_MAX_SLOTS];
    int n_spatial, n_reduce; /* of the anchor stage */
    int s_levels, r_levels;  /* tile levels per spatial / reduction axis (TILE sketches) */
    int n_rows_axes;         /* ROWS sketches: leading spatial axes that form the rows */
    int64_t rows;            /* ROWS sketches: the number of rows */
    space_mma_info mma;      /* GPU_MMA: the GEMM view */
} space;

typedef struct space_sched {
    int n;
    int64_t v[SPACE_MAX_SLOTS];
} space_sched;

const char *space_sketch_name(space_sketch s); /* "?" outside the table */
target_kind space_sketch_target(space_sketch s);
/* Builds the space of g for target t; g must outlive sp. */
int space_build(const ir_subgraph *g, const target *t, space *sp, tlm_error *err);
/* Writes the legal values of `slot` given partial->v[0..slot) into vals (ascending, at most
 * SPACE_MAX_VALUES); returns their count (>= 1) or a negative code. */
int space_legal_values(const space *sp, int slot, const space_sched *partial, int64_t *vals);
/* Checks a complete schedule value by value; the error names the first illegal slot. */
int space_check(const space *sp, const space_sched *s, tlm_error *err);
/* Uniform choice among legal values at each slot; rng is a xorshift64* state (non-zero). */
void space_sample(const space *sp, uint64_t *rng, space_sched *out);
void space_default(const space *sp, space_sched *out);
/* The default with VECTORIZE = vectorize where that is legal (CPU_TILE with a reduction,
 * CPU_WINDOW along OW or channels; the model's choice otherwise, and for vectorize < 1): the
 * rule of thumb along another axis. */
void space_default_vectorized(const space *sp, int64_t vectorize, space_sched *out);
/* The rule of thumb completing given->v[0..n) (legal decisions of the first n slots): each
 * later slot as the default would choose it after those (under another vector axis than the
 * default's, the default of that axis); the default itself when they are its own. */
void space_default_given(const space *sp, const space_sched *given, int n, space_sched *out);
/* log10 of the number of complete legal schedules (exact count by dynamic programming over
 * the slot tree when small, else an estimate by sampling; *exact says which). */
double space_log10_size(const space *sp, int *exact);

/* Tile factor of (axis, level), with level 0 derived as the quotient. */
int64_t space_tile(const space *sp, const space_sched *s, int axis, int level);
/* The most a CPU spatial axis of extent e may be padded to by its tiles (~15 %, 25 % below 64). */
int64_t space_pad_limit(int64_t e);
/* The product of an axis' tiles over all levels: >= its extent (CPU spatial tiles may pad). */
int64_t space_padded_extent(const space *sp, const space_sched *s, int axis);
/* The value of the first slot of a kind (non-TILE kinds are unique); def if absent. */
int64_t space_get(const space *sp, const space_sched *s, space_slot_kind kind, int64_t def);

/* CPU_TILE: the spatial axis the register tile vectorises given slots [0, upto) of s.
 * VECTORIZE = v > 0 names the v-th innermost spatial axis (1 = the last, 2 = the one before,
 * ...); 0 (scalar code) and an undecided VECTORIZE count as the last. */
int space_cpu_vec_axis(const space *sp, const space_sched *s, int upto);
/* CPU_TILE packing: whether anchor expression `id` is a packable operand when spatial axis
 * `vaxis` is vectorised (an operand of the body's top multiply — a load, or a padding select
 * around one — that depends on a reduction axis and on the vector axis: contiguous along it,
 * or strided, which the packing gathers into contiguous vectors), and the floats all packed
 * buffers of a schedule need. */
bool space_cpu_packable(const space *sp, int vaxis, int id);
int64_t space_cpu_pack_floats(const space *sp, const space_sched *s, int upto);
/* Vector lanes of a CPU register-tile row of t elements (1 = scalar code). */
int space_cpu_tile_lanes(const space *sp, int64_t t, bool vectorize);
/* A transpose (CPU_TILE, no reduction, an input read across the output's last axis): the
 * spatial axis that input runs along with stride 1, or -1. */
int space_cpu_gathered_axis(const space *sp);
/* CPU_WINDOW: the lanes of a vector given slots [0, upto) of s (1: scalar code), and the
 * accumulator registers a register tile may use with those lanes. */
int space_window_lanes(const space *sp, const space_sched *s, int upto);
int space_window_budget(const space *sp, int lanes);
/* CPU_WINDOW's VECTORIZE value for vectors along blocks of channels (space.h's sketch notes) */
#define WINDOW_VEC_CHANNELS 2
/* Whether slots [0, upto) of s put CPU_WINDOW's vectors along channels. */
bool space_window_channels(const space *sp, const space_sched *s, int upto);
/* Whether a CPU_WINDOW workload is a 1 x 1 window of stride 1 without padding (each output
 * point reads its own input point: a squeeze-and-excitation scale), which codegen runs as one
 * loop a plane along OW and whose default stays along OW. */
bool space_window_pointwise(const space *sp);
/* Whether a CPU kernel storing its output's rows as it finishes them (a tile kernel along the
 * output's last axis, a window kernel along OW, a transposed copy-out, a row kernel; codegen
 * asks also for rows of whole lines) streams them with non-temporal stores (codegen's
 * streaming rule): only past half the last-level cache, at most 24 MiB a core (below it the
 * reader, the plan's next launch, finds the output cached; space.c says what was measured). */
bool space_cpu_output_streams(const target *t, int64_t out_bytes);
/* Bitmask of the anchor axes an anchor expression node depends on. */
unsigned space_expr_axes(const space *sp, int id);

/* Shared-memory bytes the staged inputs of a GPU_TILE schedule need per block. */
int64_t space_gpu_smem_bytes(const space *sp, const space_sched *s);

/* 0 when the subgraph's anchor is an MMA-able contraction (fills mi), else -1. */
int space_mma_analyze(const ir_subgraph *g, space_mma_info *mi);
/* Shared-memory bytes of a GPU_MMA schedule (all stages of both operand tiles). */
int64_t space_mma_smem_bytes(const space *sp, const space_sched *s);

/* "tile.i.3=16 tile.i.2=2 ... parallel=1 unroll=64 vectorize=1" */
int space_print(const space *sp, const space_sched *s, char *buf, size_t cap);
/* Parses the printed form (or the bare values in slot order, blank separated) and checks it. */
int space_parse(const space *sp, const char *text, space_sched *out, tlm_error *err);

#endif
