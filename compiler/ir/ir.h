/* ir.h — the tensor IR: workloads, tensors, stages, subgraphs.
 *
 * Contract:
 *  - An ir_workload is what a user asks for (one op family, its shape keys, attributes,
 *    dtype and an epilogue chain). ir_workload_init fills the defaults; ir_workload_check
 *    validates it (every extent, the conv geometry, element-count and FLOP overflow) and
 *    names the offending field. Nothing else in the project accepts an unchecked workload.
 *  - ir_subgraph_build lowers a checked workload to stages: each stage computes one tensor
 *    over spatial axes (the output's dims, in order) and reduction axes, from an expression
 *    body of loads at affine indices, constants, unary/binary math and select (padding),
 *    with an optional sum/max reduction and a post-reduction scale. The anchor stage is
 *    the op proper; prologue stages compute per-row statistics (softmax, norms);
 *    epilogue stages are the fused chain, each reading the previous stage's output at the
 *    identity index, so codegen may inline them into the anchor's output loop.
 *  - Canonical form = compact JSON of the workload with sorted keys and every default
 *    spelled out, only the fields meaningful for the op. Workload hash = SHA-256 of
 *    "tlm-workload-v1\n" followed by the canonical form.
 *  - Kernel argument order (the ABI of every generated kernel): the INPUT tensors in
 *    the order they appear in g->tensor, then the OUTPUT tensor.
 *
 * Layouts (weights follow the activation layout):
 *   dense            A[M,K] (A[K,M] if transpose_a), B[K,N] (B[N,K] if transpose_b), out[M,N]
 *   batch_matmul     A[B,M,K] / A[B,K,M], B[B,K,N] / B[B,N,K], out[B,M,N]
 *   conv2d NCHW      X[N,C,H,W], Wt[F,C/g,KH,KW] (OIHW), out[N,F,OH,OW]
 *   conv2d NHWC      X[N,H,W,C], Wt[KH,KW,C/g,F] (HWIO), out[N,OH,OW,F]
 *                    a pointwise one (1x1, unit strides, no padding) with (H, W) as
 *                    (1, H*W): X[N,C,1,H*W], out[N,F,1,H*W] (NHWC: X[N,1,H*W,C] ...)
 *   depthwise NCHW   X[N,C,H,W], Wt[C,KH,KW], out[N,C,OH,OW]   (NHWC: Wt[KH,KW,C])
 *   pools            X[N,C,H,W] -> out[N,C,OH,OW] (NHWC analogous); stride defaults to the
 *                    window, avg_pool divides by KH*KW (padding counted, as PyTorch's default)
 *   global_avg_pool  X[N,C,H,W] or X[N,H,W,C] -> out[N,C]
 *   softmax, norms   X[R,C] -> out[R,C] over the last axis; layer_norm has gamma[C], beta[C],
 *                    rms_norm has weight[C]
 *   reduce_*         X[R,C] -> out[R]
 *   elementwise      X[N] -> out[N]; the epilogue is the computation
 *   transpose        X[R,C] -> out[C,R]
 * Epilogue inputs: bias_add reads bias[channels] along the output's channel axis (N for
 * dense/batch_matmul, F or C for convs and pools, the last axis otherwise); add and mul read
 * a tensor of the output's shape. gelu is the exact erf form.
 */
#ifndef TLM_IR_H
#define TLM_IR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/util/err.h"

#define IR_MAX_KEYS 8      /* shape keys of one op */
#define IR_MAX_EPILOGUE 8
#define IR_MAX_DIMS 6      /* tensor rank */
#define IR_MAX_AXES 8      /* spatial + reduction axes of one stage */
#define IR_MAX_TENSORS 24 /* layer_norm + 8 tensor-reading epilogues needs 22 */
#define IR_MAX_STAGES 12
#define IR_MAX_EXPR 40     /* expression nodes per stage */
#define IR_MAX_COND 4      /* bound checks in one select */
#define IR_MAX_ELEMS (INT64_C(1) << 34)
#define IR_HASH_HEX 65

typedef enum { IR_FLOAT32, IR_FLOAT16, IR_BFLOAT16, IR_DTYPE_COUNT } ir_dtype;
typedef enum { IR_NCHW, IR_NHWC, IR_LAYOUT_COUNT } ir_layout;

typedef enum {
    IR_OP_DENSE,
    IR_OP_BATCH_MATMUL,
    IR_OP_CONV2D,
    IR_OP_DEPTHWISE_CONV2D,
    IR_OP_MAX_POOL2D,
    IR_OP_AVG_POOL2D,
    IR_OP_GLOBAL_AVG_POOL2D,
    IR_OP_SOFTMAX,
    IR_OP_LAYER_NORM,
    IR_OP_RMS_NORM,
    IR_OP_REDUCE_SUM,
    IR_OP_REDUCE_MEAN,
    IR_OP_REDUCE_MAX,
    IR_OP_ELEMENTWISE,
    IR_OP_TRANSPOSE,
    IR_OP_COUNT
} ir_op;

typedef enum {
    IR_EPI_BIAS_ADD,
    IR_EPI_ADD,
    IR_EPI_MUL,
    IR_EPI_RELU,
    IR_EPI_RELU6,
    IR_EPI_GELU,
    IR_EPI_SILU,
    IR_EPI_SIGMOID,
    IR_EPI_TANH,
    IR_EPI_COUNT
} ir_epilogue;

/* Shape-key indices, per op family (ir_workload.shape[] is in this order). */
enum { IR_DENSE_M, IR_DENSE_N, IR_DENSE_K };
enum { IR_BMM_B, IR_BMM_M, IR_BMM_N, IR_BMM_K };
enum { IR_CONV_N, IR_CONV_C, IR_CONV_H, IR_CONV_W, IR_CONV_F, IR_CONV_KH, IR_CONV_KW };
enum { IR_DW_N, IR_DW_C, IR_DW_H, IR_DW_W, IR_DW_KH, IR_DW_KW };  /* also max/avg pool */
enum { IR_GP_N, IR_GP_C, IR_GP_H, IR_GP_W };
enum { IR_ROW_R, IR_ROW_C };  /* softmax, norms, reduce_*, transpose */
enum { IR_EW_N };

/* Which optional fields an op takes (ir_op_info.fields). */
enum {
    IR_F_TRANSPOSE = 1 << 0,
    IR_F_STRIDE = 1 << 1,
    IR_F_PAD = 1 << 2,
    IR_F_DILATION = 1 << 3,
    IR_F_GROUPS = 1 << 4,
    IR_F_LAYOUT = 1 << 5,
    IR_F_EPS = 1 << 6,
};

typedef struct {
    const char *name;
    int n_keys;
    const char *keys[IR_MAX_KEYS];
    unsigned fields;
} ir_op_info;

typedef struct ir_workload {
    ir_op op;
    ir_dtype dtype;
    int64_t shape[IR_MAX_KEYS];
    bool transpose_a, transpose_b;
    int64_t stride[2], pad[2], dilation[2];
    int64_t groups;
    ir_layout layout;
    double eps;
    int n_epilogue;
    ir_epilogue epilogue[IR_MAX_EPILOGUE];
} ir_workload;

const ir_op_info *ir_op_get(ir_op op);
/* Accepts the canonical names and the alias "matmul" (= dense). 0 or TLM_EINVAL. */
int ir_op_from_name(const char *name, ir_op *out);
const char *ir_dtype_name(ir_dtype t);
int ir_dtype_from_name(const char *name, ir_dtype *out);
size_t ir_dtype_size(ir_dtype t);
const char *ir_layout_name(ir_layout l);
int ir_layout_from_name(const char *name, ir_layout *out);
const char *ir_epilogue_name(ir_epilogue e);
int ir_epilogue_from_name(const char *name, ir_epilogue *out);
/* Index of a shape key for op, or -1. */
int ir_op_key_index(ir_op op, const char *key);

/* Defaults: float32, no transposes, stride 1 (pools: 0 = the window, see normalize), pad 0, dilation 1,
 * groups 1, NCHW, eps 1e-5, no epilogue; shape keys 0 (unset). */
void ir_workload_init(ir_workload *w, ir_op op);
/* Fills defaults that depend on other fields (a pool's stride of 0 means "the window").
 * Decoders call it once shape keys are known; canonical form and build work on a copy. */
void ir_workload_normalize(ir_workload *w);
/* Full semantic validation; field names are JSON paths ("shape.K", "pad", "epilogue[2]"). */
int ir_workload_check(const ir_workload *w, tlm_error *err);
/* Output spatial size of convs/pools (OH, OW); valid after ir_workload_check. */
void ir_workload_out_hw(const ir_workload *w, int64_t *oh, int64_t *ow);
/* A pointwise conv2d (1x1, unit strides, no padding) is lowered with its positions on one
 * axis, (H, W) as (1, H * W): the same row-major memory in NCHW and NHWC. */
bool ir_conv_pointwise(const ir_workload *w);

/* Canonical JSON into buf (NUL-terminated); returns its length, or a negative code if cap is
 * too small. 1024 bytes always suffice. */
int ir_workload_canonical(const ir_workload *w, char *buf, size_t cap);
/* SHA-256 of the canonical form, raw (32 bytes) and as lowercase hex. */
int ir_workload_hash(const ir_workload *w, uint8_t out[32]);
int ir_workload_hash_hex(const ir_workload *w, char out[IR_HASH_HEX]);

/* ---- stages and subgraphs ---- */

typedef enum { IR_T_INPUT, IR_T_TEMP, IR_T_OUTPUT } ir_tensor_kind;

typedef struct {
    char name[16];
    int ndim;
    int64_t shape[IR_MAX_DIMS];
    ir_dtype dtype;
    ir_tensor_kind kind;
} ir_tensor;

/* index = off + sum_a coef[a] * axis[a], axes numbered spatial first, then reduction. */
typedef struct {
    int32_t coef[IR_MAX_AXES];
    int64_t off;
} ir_affine;

typedef enum { IR_E_CONST, IR_E_LOAD, IR_E_UNARY, IR_E_BINARY, IR_E_SELECT } ir_expr_kind;

typedef enum {
    IR_U_NEG,
    IR_U_EXP,
    IR_U_SQRT,
    IR_U_RSQRT,
    IR_U_RECIP,
    IR_U_RELU,
    IR_U_RELU6,
    IR_U_GELU,
    IR_U_SILU,
    IR_U_SIGMOID,
    IR_U_TANH,
    IR_U_COUNT
} ir_unop;

typedef enum { IR_B_ADD, IR_B_SUB, IR_B_MUL, IR_B_DIV, IR_B_MAX, IR_B_MIN, IR_B_COUNT } ir_binop;

typedef struct {
    ir_expr_kind kind;
    int op;        /* ir_unop or ir_binop */
    int a, b;      /* operands (expression indices); select: a if all conds hold, else b */
    double value;  /* IR_E_CONST */
    int tensor;    /* IR_E_LOAD */
    ir_affine idx[IR_MAX_DIMS]; /* IR_E_LOAD: one affine index per tensor dim */
    int ncond;                  /* IR_E_SELECT: 0 <= cond[i] < cond_hi[i] for all i */
    ir_affine cond[IR_MAX_COND];
    int64_t cond_hi[IR_MAX_COND];
} ir_expr;

typedef enum { IR_RED_NONE, IR_RED_SUM, IR_RED_MAX } ir_reduce;
typedef enum { IR_ROLE_PROLOGUE, IR_ROLE_ANCHOR, IR_ROLE_EPILOGUE } ir_role;

typedef struct {
    char name[16];
    ir_role role;
    int out;                    /* tensor written; its dims are the spatial axes in order */
    int n_spatial, n_reduce;
    int64_t extent[IR_MAX_AXES];
    char axis[IR_MAX_AXES][8];  /* axis names, for printing and codegen */
    ir_reduce reduce;
    double post_scale;          /* applied to the reduced value (means, avg pools) */
    int body;                   /* root expression; children always precede parents */
    int n_expr;
    ir_expr expr[IR_MAX_EXPR];
} ir_stage;

typedef struct ir_subgraph {
    ir_workload wl;
    int n_tensor;
    ir_tensor tensor[IR_MAX_TENSORS];
    int n_stage;
    ir_stage stage[IR_MAX_STAGES];
    int anchor; /* stage index */
    int output; /* tensor index of the final output */
} ir_subgraph;

/* Lowers a workload (checked here again) into g. */
int ir_subgraph_build(const ir_workload *w, ir_subgraph *g, tlm_error *err);

int64_t ir_tensor_numel(const ir_tensor *t);
/* Indices of the INPUT tensors in argument order; returns their count. */
int ir_subgraph_inputs(const ir_subgraph *g, int idx[IR_MAX_TENSORS]);
/* Roofline inputs: FLOPs (each add, mul, compare, division, transcendental counts one;
 * loads, selects and index math count zero) and minimal bytes (each input read once, the
 * output written once). */
int64_t ir_subgraph_flops(const ir_subgraph *g);
int64_t ir_subgraph_bytes(const ir_subgraph *g);
int64_t ir_stage_points(const ir_stage *s); /* spatial x reduction domain size */
/* The argument position (among ir_subgraph_inputs) of an input the output may share
 * storage with, or -1: an input of the output's shape that only the epilogue reads, each
 * point where the output is written (a residual added to a conv or a GEMM). The CPU kernels
 * of these contractions read it at a point before they write that point, once, so a plan
 * may hand both arguments the same bytes when the input dies there (fe_plan_build). */
int ir_subgraph_inplace_input(const ir_subgraph *g);

/* Scalar semantics shared by the interpreter and the code generators' tests. */
double ir_unop_eval(ir_unop op, double x);
double ir_binop_eval(ir_binop op, double x, double y);
const char *ir_unop_name(ir_unop op);
const char *ir_binop_name(ir_binop op);

/* Human-readable dump of the stages (for `tlm ir --stages` and debugging). Returns the length
 * written (truncated to cap). */
int ir_subgraph_print(const ir_subgraph *g, char *buf, size_t cap);

/* ---- reference interpreter (interp.c) ----
 * Evaluates every stage naively with double accumulation and double intermediates.
 * inputs[i] is the i-th INPUT tensor (argument order), row-major float32 values. */
int ir_interp_run(const ir_subgraph *g, const float *const *inputs, float *out, tlm_error *err);
int ir_interp_run_f64(const ir_subgraph *g, const float *const *inputs, double *out,
                      tlm_error *err);

/* ---- fast reference (fastref.c; the measure module's reference) ----
 * ir_interp_fast_f64: ir_interp_run_f64's values up to the anchor's summation order (they agree
 * to ~1e-13 relative; bit for bit when no BLAS path applies), in seconds instead of minutes for
 * contractions. When ir_fastref_applies(g) (dense, batch_matmul with any transposes; conv2d
 * NCHW/NHWC with any stride, pad, dilation, groups; depthwise_conv2d) the anchor is computed in
 * double by ir_fastref_anchor (OpenBLAS cblas_dgemm, through im2col for conv2d; direct loops
 * for depthwise), read from g->wl and not from the anchor's index expressions. Every other
 * stage is the interpreter's, those without reduction or select evaluated a segment of their
 * last axis at a time (same scalar operations, bit-identical). Uses OpenBLAS's threads
 * (OPENBLAS_NUM_THREADS) in the calling process. Any thread may call these. */
int ir_interp_fast_f64(const ir_subgraph *g, const float *const *inputs, double *out,
                       tlm_error *err);
bool ir_fastref_applies(const ir_subgraph *g);
/* The anchor stage alone: buf[t] holds tensor t of g in double (row-major); writes the
 * anchor's output tensor into out. TLM_EUNSUPPORTED unless ir_fastref_applies(g), TLM_ENOMEM. */
int ir_fastref_anchor(const ir_subgraph *g, const double *const *buf, double *out,
                      tlm_error *err);

#endif
