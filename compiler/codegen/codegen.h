/* codegen.h — subgraph + schedule → readable C (OpenMP, vectors) or CUDA C source.
 *
 * Contract:
 *  - cg_generate lowers (space, schedule) to source text. The schedule must have passed
 *    space_check; codegen trusts the space for legality and never guesses.
 *  - Kernel ABI (CPU): the .so exports
 *        void <entry>(const float *restrict in0, ..., float *restrict out);
 *        void <entry>_packed(void *const *args);   args = inputs..., output
 *    with the INPUT tensors in argument order (ir_subgraph_inputs) and the OUTPUT last, each
 *    row-major float32. Callable from any thread (its call buffers are kept between calls
 *    in slots a concurrent call does not share).
 *    A kernel that packs an input operand as it is (a conv's or a GEMM's weights) also
 *    exports, so that a caller who knows the operand is constant packs it once:
 *        int  <entry>_prepacks(int k, int *arg, long long *floats);
 *             the number of such operands; for k below it, the argument index it packs and
 *             the floats of its packed copy
 *        void <entry>_prepack(int k, void *const *args, float *dst);
 *             packs operand k from args (as _packed takes them) into dst (64-byte aligned)
 *        void <entry>_prepacked(void *const *args, const float *const *pre);
 *             the kernel, reading operand k from pre[k] instead of packing args[arg] (pre[k]
 *             NULL: packed by the call, as in _packed); the output is _packed's, bit for bit
 *  - Kernel ABI (CUDA): extern "C" __global__ void <entry>(const float *in0, ..., float *out)
 *    launched with out->grid, out->block and out->smem_bytes of dynamic shared memory;
 *    float16/bfloat16 workloads (GPU_MMA) take and write 16-bit storage (unsigned short)
 *    for every tensor instead of float.
 *  - Every generator is checked against the reference interpreter (tests/compiler/codegen).
 *  - Shared printing helpers (cg_buf, cg_emit_*) are for the generators in this folder.
 */
#ifndef TLM_CODEGEN_H
#define TLM_CODEGEN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"
#include "compiler/space/space.h"
#include "compiler/util/err.h"

#define CG_ENTRY_MAX 64

/* The generators' version, part of every cached kernel's toolchain key (drv_toolchain_key):
 * bumped when what they emit for a schedule changes in a way a cached kernel should not
 * stand for (2: the CPU kernels' prepack entries; 3: layer_norm's moments in one pass, a DRAM-
 * sized layer_norm 5-8 % faster on AVX2: a cached kernel would keep the slower two passes;
 * 4: CPU_WINDOW along channels in bands of rows where its blocks leave a core idle, AVX2's
 * streamed norms prefetching 2 KiB ahead, and the rule of thumb's AVX2 1x1 convs at 7 x 7
 * along F, 5x5 depthwise along OW and prefill dense blocks 128 columns wide, 1.04-1.35x: a
 * cached kernel would keep the old code or schedule; 5: CPU_WINDOW along OW packs each row
 * block's input rows one block ahead of its FMAs, 1.07-1.19x on planes of 56 x 56 and
 * more, and outputs past the cores' L2 from short windows stream out: AVX-512 stems along F
 * 1.14-1.45x, 1x1 convs at batch 8 1.1-2.5x, depthwise rows of whole lines 1.1-1.5x; 6: the
 * rule of thumb's blocks even the threads' work, 1x1 convs at 14 x 14 and 28 x 28 1.03-1.28x;
 * register tiles prefetch a residual's lines, from DRAM 1.04-1.14x; on Intel hosts the rule
 * of thumb packs expanding 1x1 convs' inputs and runs reducing ones at 28 x 28 and more along
 * their columns, from DRAM 1.03-2.0x; 7: outputs stream only past half the L3, not from
 * twice the cores' L2 (plans 1.02-1.18x at batch 8), a rows reduction over one strided run
 * of axes in one loop (a global pool 5x), and the rule of thumb's AVX-512 depthwise along
 * OW (1.1-3x): a cached kernel would keep the streamed stores, the loop per row or the
 * channel form); 8: register tiles along OW request the next tile's filter rows and tiles
 * over a prepacked or shared panel the next panel (weights from DRAM: ResNet-50's plan
 * 1.10x at batch 1); 9: a conv's or GEMM's output and the residual a plan may write it
 * over (ir_subgraph_inplace_input) are no longer restrict: a cached kernel would promise
 * that they never overlap; 10: the rule of thumb's strided pools over rows wider than 32
 * points take one row a register tile (1.1-1.4x): a cached kernel would keep its rows; 11: a
 * transpose's register tiles move as blocks transposed in registers (1.3-4.8x): a cached
 * kernel would keep gathering; 12: kernels without a reduction whose inputs outgrow the
 * cores' L2s request those inputs' lines 8 KiB ahead (a 64 MiB GELU from the L3 1.7-1.8x), and
 * direct tiles over reductions of 128 points or fewer spread their output's and residual's
 * requests over their first iterations (a 1x1 conv of 64 channels from DRAM 1.2x), and a
 * broadcast's rows ahead are requested once a line, not once a point (stride-2 1x1 convs
 * 1.05x): a cached kernel would leave them to the hardware prefetcher or request them all
 * at once, or one a point); 13: depthwise convs along channels transpose their weights a
 * block of taps at a time (1.04x on a 7x7): a cached kernel would copy them one by one); 14:
 * a task of a register-tile kernel requests the next task's block of an unpacked vector-loaded
 * operand (a 1x1 conv's input) over its tiles after the first (ResNet-50's plan at batch 8
 * 1.02x): a cached kernel would leave each task's first tile waiting on memory; 15: DRAM-
 * sized norms on Intel and generic targets take a row's sums in a pass of their own, the
 * squares into four accumulators (1.10-1.21x); 16: a transposed copy-out of short rows into
 * an output past a core's L2 requests its lines before the block (ResNet-50's stem at batch
 * 8 1.34x); 17: tiles of one reduction chunk start from zero and their block is not cleared
 * (stems 1.02-1.06x): a cached kernel would keep the slower form); 18: window kernels
 * (depthwise, pools) over inputs past the cores' L2s request the next plane into L2 a share
 * per row block (MobileNetV2's batch-8 stride-2 depthwise 1.3-1.5x, ResNet-50's max pool
 * 1.7x in their plans): a cached kernel would wait on memory at each page of a plane); 19:
 * on 16-register targets a strided window's base pointer is opaque to GCC, so that a tap two
 * columns on does not keep the values of the tap before it (YOLOv5s' 3x3 stride-2 128 -> 256
 * on AVX2 1.08-1.35x): a cached kernel would spill accumulators; the same version covers
 * the default's move along F of Zen 4's deep pointwise convs over 14 x 14 planes, space.c,
 * ResNet-50's layer 3 at batch 8 1.12-1.20x: a cached default would keep the columns); 20:
 * a GEMM packing a B larger than the last-level cache per call requests the next chunk's
 * source rows into L2 over this chunk's tiles (LLaMA-2's q_proj at 77 tokens on AVX2 1.3x): a
 * cached kernel would wait on DRAM at each chunk's pack; 21: depthwise along channels packs
 * and stores planes narrower than a vector by transposes in memory order, and such planes
 * default along channels (7 x 7 planes 1.35-2.3x): a cached kernel would pack point by point;
 * 22: depthwise along channels exports prepack entries for its weights: a cached kernel would
 * transpose them in every call of a plan; 23: a 1 x 1 window of stride 1 without padding is
 * one loop a plane (squeeze-and-excitation scales 1.9-5.2x): a cached kernel would pack it). */
#define CG_VERSION 23

typedef struct cg_kernel {
    char *source;             /* malloc'ed, NUL-terminated */
    char entry[CG_ENTRY_MAX]; /* "tlm_kernel" by default */
    bool cuda;
    /* CUDA launch configuration */
    int grid[3], block[3];
    int smem_bytes; /* dynamic shared memory per block */
} cg_kernel;

/* A loaded CPU kernel's prepack entries (the ABI above): `pack` and `run` are
 * <entry>_prepack and <entry>_prepacked, operand k packs input argument arg[k] into
 * floats[k] floats. A generated kernel has at most CG_MAX_PRE of them. */
#define CG_MAX_PRE 8
typedef struct {
    void (*pack)(int k, void *const *args, float *dst);
    void (*run)(void *const *args, const float *const *pre);
    int n; /* 0: the kernel has none (or predates them) */
    int arg[CG_MAX_PRE];
    int64_t floats[CG_MAX_PRE];
} cg_prepack_abi;

/* Looks the entries up in lib (a dlopen handle); 0 with p->n = 0 when the kernel has none,
 * TLM_EINVAL when they describe more than CG_MAX_PRE operands or a bad one (a negative
 * argument, an empty or > 2^36-float pack). */
int cg_prepack_find(void *lib, const char *entry, cg_prepack_abi *p, tlm_error *err);

/* Scheduled code for the space's target kind. entry may be NULL ("tlm_kernel"). */
int cg_generate(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                tlm_error *err);
/* The naive baseline: every stage as plain nested loops, temporaries materialised; no
 * tiling, no parallelism. For benchmarks and as an independent second generator. */
int cg_generate_naive_c(const ir_subgraph *g, const char *entry, cg_kernel *out, tlm_error *err);
void cg_kernel_free(cg_kernel *k);
/* Launch description as JSON text: {"grid":[..],"block":[..],"smem":n} or {} for CPU. */
int cg_launch_json(const cg_kernel *k, char *buf, size_t cap);

/* The per-target generators behind cg_generate (cpu.c, cuda.c). */
int cg_generate_cpu(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                    tlm_error *err);
int cg_generate_cuda(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                     tlm_error *err);
/* Whether the CPU / CUDA generator has a route for sketch s (the route tables in cpu.c and
 * cuda.c are indexed by space_sketch; every sketch has exactly one, for its target kind:
 * tests/compiler/codegen/test_cpu.c checks that against SPACE_SKETCHES). */
bool cg_cpu_has_route(space_sketch s);
/* GPU_MMA (cuda_mma.c): float16/bfloat16 tensor-core kernels; every tensor is 16-bit storage:
 *     extern "C" __global__ void <entry>(const unsigned short *in0, ..., unsigned short *out) */
int cg_cuda_gen_mma(const space *sp, const space_sched *s, const char *entry, cg_kernel *out,
                    tlm_error *err);
bool cg_cuda_has_route(space_sketch s);

/* ---- shared printing helpers ---- */

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} cg_buf;

void cg_printf(cg_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends `indent` levels of 4 spaces, then the formatted text. */
void cg_line(cg_buf *b, int indent, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
char *cg_buf_take(cg_buf *b); /* returns the text (caller frees) and resets b */

/* How an expression printer names things.
 *   axis[a]      C expression of the full index of stage axis a ("i", "(i_b + 3)", ...)
 *   tensor[t]    C name of tensor t's pointer (NULL: the tensor is a per-row scalar or the
 *                substituted value, see below)
 *   subst_tensor a tensor whose loads are replaced by subst_var (the value flowing through an
 *                inlined epilogue), -1 for none
 *   scalar_tensor[t] non-NULL: loads of t are this scalar variable (per-row statistics) */
typedef struct {
    const char *axis[IR_MAX_AXES];
    const char *tensor[IR_MAX_TENSORS];
    const char *scalar_tensor[IR_MAX_TENSORS];
    int subst_tensor;
    const char *subst_var;
    bool cuda; /* float literals and math function spelling */
    /* Optional: emits load `id` itself (e.g. from shared memory) and returns true, or returns
     * false to let the printer emit the load from the tensor. */
    bool (*load_hook)(const void *ctx, cg_buf *b, const ir_stage *s, int id);
    const void *load_ctx;
    /* Optional, indexed by expression id of the stage being printed: expr_var[id] non-NULL
     * prints that variable instead of the subtree (a hoisted or buffered value); recip_var[id]
     * non-NULL on a division prints (a * recip_var[id]), the divisor's reciprocal hoisted. */
    const char *const *expr_var;
    const char *const *recip_var;
} cg_names;

/* A float literal valid in C and C++ for every value ("0.0f", "(-1.5f)", "INFINITY"). */
const char *cg_float_literal(double v, char *buf, size_t cap);

/* Row-major strides of tensor t. */
void cg_strides(const ir_tensor *t, int64_t *strides);
/* Flat element offset of a load as a C expression into b. */
void cg_emit_offset(cg_buf *b, const ir_subgraph *g, const ir_stage *s, const ir_expr *load,
                    const cg_names *nm);
/* Scalar float expression of s->expr[id]. */
void cg_emit_scalar(cg_buf *b, const ir_subgraph *g, const ir_stage *s, int id,
                    const cg_names *nm);
/* An affine index (a select condition) as a C expression. */
void cg_emit_affine(cg_buf *b, const ir_stage *s, const ir_affine *a, const cg_names *nm);
/* Scalar helper functions (gelu, silu, ...) every kernel source starts with. */
void cg_emit_prelude_scalar(cg_buf *b, bool cuda);
/* Kernel parameter list "const float *restrict A, ..., float *restrict out" into b, and fills
 * nm->tensor with the parameter names. */
void cg_emit_params(cg_buf *b, const ir_subgraph *g, cg_names *nm, bool cuda);

#endif
