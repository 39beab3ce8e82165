/* frontend.h — graphs and the model zoo → fused, deduplicated subgraphs (DESIGN §1, §3).
 *
 * Contract:
 *  - A graph is a list of named values (graph inputs, weights among them, and node outputs)
 *    and nodes in topological order. Every node is checked when it is added: its op, arity,
 *    attributes, input dtypes and shapes; its output shape is inferred, and an anchor node
 *    (an IR op family) carries its own checked ir_workload. So a graph that exists is valid:
 *    fusing it can only fail for a pattern the IR cannot express (a bias_add that has nothing
 *    to fuse into) or for lack of memory.
 *  - Errors name the field as a JSON path into the graph document (proto/graph.md):
 *    "nodes[3].inputs[1]", "nodes[3].attrs.stride[0]", "inputs[0].shape", "outputs[2]".
 *    Builder calls use the node's position in the order of fe_graph_add_node calls.
 *    TLM_EINVAL for a wrong field (types, unknown names, cycles, shape mismatches),
 *    TLM_EUNSUPPORTED for a well-typed name outside our lists (op, dtype, layout),
 *    TLM_ELIMIT for a graph over the size limits below, TLM_ENOMEM.
 *  - Node kinds. Anchors: dense (alias matmul), batch_matmul, conv2d, depthwise_conv2d,
 *    max_pool2d, avg_pool2d, global_avg_pool2d, softmax, layer_norm, rms_norm, reduce_sum,
 *    reduce_mean, reduce_max, transpose. Epilogue ops: bias_add, add, mul, relu, relu6, gelu,
 *    silu, sigmoid, tanh. Views (free, no kernel): reshape, flatten.
 *  - Fusion (fe_fuse): in topological order each anchor starts a subgraph; an epilogue op
 *    joins the subgraph whose last node produced its input when that value has exactly one
 *    consumer (and is not a declared output), the chain is shorter than IR_MAX_EPILOGUE and,
 *    for bias_add, the bias runs along the IR output's channel axis. add/mul try inputs[0]
 *    first, then inputs[1] (the other operand is the residual tensor). An epilogue op that
 *    joins nothing starts an `elementwise` subgraph (a standalone bias_add only on a 1-D
 *    tensor; otherwise TLM_EUNSUPPORTED). Views end chains. Subgraphs are deduplicated by
 *    workload hash, in first-seen order, with occurrence counts; every group is also kept
 *    as a launch (fe_launch: its subgraph and the graph values bound to the kernel's
 *    arguments), in an order that runs the network (see fuse.c).
 *  - Counts are kernel launches: a `transpose` of a tensor with leading dims [B..., R, C] is
 *    one IR transpose [R,C] launched prod(B...) times.
 *  - Nothing here allocates global state; graphs and fusion results are owned by the caller.
 *    Any thread; a graph is not modified by fusion, so several threads may fuse one graph.
 */
#ifndef TLM_FRONTEND_H
#define TLM_FRONTEND_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "compiler/ir/ir.h"
#include "compiler/util/err.h"

#define FE_MAX_NODES 65536
#define FE_MAX_VALUES 131072
#define FE_MAX_NAME 128 /* bytes of a value or node name, NUL excluded */
#define FE_MAX_NODE_INPUTS 3

typedef enum {
    FE_NODE_ANCHOR,   /* an IR op family: the anchor of a subgraph */
    FE_NODE_EPILOGUE, /* bias_add, add, mul, activations: fused into a producer or elementwise */
    FE_NODE_VIEW,     /* reshape, flatten: a new shape over the same bytes, no kernel */
} fe_node_kind;

typedef enum { FE_VIEW_RESHAPE, FE_VIEW_FLATTEN } fe_view;

/* Attribute bits (fe_attrs.set). Names in JSON are those of the workload fields, plus
 * "kernel" (pool window), "shape" (reshape) and "axis" (flatten). */
enum {
    FE_A_STRIDE = 1 << 0,
    FE_A_PAD = 1 << 1,
    FE_A_DILATION = 1 << 2,
    FE_A_GROUPS = 1 << 3,
    FE_A_LAYOUT = 1 << 4,
    FE_A_TRANSPOSE_A = 1 << 5,
    FE_A_TRANSPOSE_B = 1 << 6,
    FE_A_EPS = 1 << 7,
    FE_A_KERNEL = 1 << 8,
    FE_A_SHAPE = 1 << 9,
    FE_A_AXIS = 1 << 10,
};

typedef struct {
    unsigned set; /* FE_A_* bits of the fields given; the others take their defaults */
    int64_t stride[2], pad[2], dilation[2], kernel[2];
    int64_t groups;
    ir_layout layout;
    bool transpose_a, transpose_b;
    double eps;
    int shape_ndim;
    int64_t shape[IR_MAX_DIMS]; /* reshape target; one entry may be -1 (inferred) */
    int64_t axis;               /* flatten: [prod(dims[:axis]), prod(dims[axis:])], default 1 */
} fe_attrs;

typedef struct {
    char *name;
    int ndim;
    int64_t shape[IR_MAX_DIMS];
    ir_dtype dtype;
    bool param;   /* a weight: informational (clients bind weights, not activations) */
    int producer; /* index into fe_graph.nodes, or -1 for a graph input */
} fe_value;

typedef struct {
    int out; /* the value this node produces (its name is the node's name) */
    fe_node_kind kind;
    ir_op op;        /* FE_NODE_ANCHOR */
    ir_epilogue epi; /* FE_NODE_EPILOGUE */
    fe_view view;    /* FE_NODE_VIEW */
    int n_in;
    int in[FE_MAX_NODE_INPUTS]; /* value indices */
    fe_attrs attrs;             /* as given (for re-encoding) */
    ir_workload wl;             /* FE_NODE_ANCHOR: checked, normalized, no epilogue */
    int64_t count;              /* FE_NODE_ANCHOR: launches of wl per node (batched transpose) */
    int index;                  /* position in the source "nodes" array, for error fields */
} fe_node;

struct fe_names;

/* Read-only for callers; change it only through the functions below. */
typedef struct fe_graph {
    char *name;
    int n_values, cap_values;
    fe_value *values;
    int n_nodes, cap_nodes;
    fe_node *nodes; /* topological order */
    int n_outputs;
    int *outputs; /* declared outputs (value indices); none = every value nothing consumes */
    struct fe_names *names;
} fe_graph;

/* ---- graphs (graph.c) ---- */

int fe_graph_new(const char *name, fe_graph **out);
void fe_graph_free(fe_graph *g);
/* Index of the value called name, or -1. */
int fe_graph_find(const fe_graph *g, const char *name);

/* Both return the new value's index (>= 0) or a negative code. */
int fe_graph_add_input(fe_graph *g, const char *name, int ndim, const int64_t *shape,
                       ir_dtype dtype, bool param, tlm_error *err);
/* op: a node op name (see the contract); inputs: names of existing values; attrs may be NULL.
 * Checks everything and infers the output shape; on failure the graph is unchanged. */
int fe_graph_add_node(fe_graph *g, const char *name, const char *op, int n_in,
                      const char *const *inputs, const fe_attrs *attrs, tlm_error *err);
int fe_graph_add_output(fe_graph *g, const char *name, tlm_error *err);

/* Decodes the document of proto/graph.md. Nodes may come in any order (they are sorted
 * topologically, ties by position); *out is NULL on failure. */
int fe_graph_from_json(const json_t *j, fe_graph **out, tlm_error *err);
/* The same document (nodes in topological order, attributes as given); NULL when out of
 * memory. fe_graph_from_json(fe_graph_to_json(g)) rebuilds g. */
json_t *fe_graph_to_json(const fe_graph *g);

/* ---- fusion (fuse.c) ---- */

typedef struct {
    ir_workload wl; /* checked, with its fused epilogue */
    char hash[IR_HASH_HEX];
    int64_t count; /* kernel launches of this workload in the model */
    int64_t flops; /* per launch: ir_subgraph_flops */
    int64_t bytes; /* per launch: ir_subgraph_bytes */
    int64_t macs;  /* per launch: fe_workload_macs */
    char name[64]; /* the anchor node of the first occurrence (truncated) */
    /* inputs (bit a: kernel argument a) bound to a param, the same tensor on every repeat, in
     * every launch of this kernel: the weights a plan packs once after binding (the runtime's
     * prepacks), so a search measures the kernel that way (measure_opts.const_args) */
    uint32_t const_args;
    int in_place_arg; /* ir_subgraph_inplace_input: the input its output may be written over */
} fe_subgraph;

/* One launch of a kernel, in execution order. */
typedef struct {
    int sub;    /* index into fe_fused.sub: the kernel */
    int node;   /* the group's first node (its anchor, or the epilogue op of an elementwise) */
    int n_args; /* = the kernel's inputs + 1 */
    int args[IR_MAX_TENSORS + 1]; /* value indices in the kernel ABI's order: inputs, output */
    int64_t repeat; /* the kernel runs this many times over consecutive slices (batched
                       transpose), else 1 */
    int64_t step[IR_MAX_TENSORS + 1]; /* elements arg a advances per repeat (0: it stays) */
} fe_launch;

typedef struct {
    int n;
    fe_subgraph *sub; /* first-seen order */
    int n_launch;
    fe_launch *launch; /* topological order: run them in this order */
    int64_t launches; /* sum of counts */
    int64_t flops;    /* sum of count x flops */
    int64_t macs;     /* sum of count x macs */
    int64_t bytes;    /* sum of count x bytes */
} fe_fused;

/* Fills *out (caller-owned; free with fe_fused_free). On failure *out is empty. The launches
 * bind graph values to kernel arguments; each binding is checked against the lowered
 * subgraph's tensor sizes. */
int fe_fuse(const fe_graph *g, fe_fused *out, tlm_error *err);
void fe_fused_free(fe_fused *f);
/* Multiply-accumulates of the anchor (dense, batch_matmul, conv2d, depthwise_conv2d); 0 for
 * the other families. The usual "GMACs" of a model is the sum of these. */
int64_t fe_workload_macs(const ir_workload *w);

/* ---- execution plan (plan.c) ----
 * What a runtime needs to run the fused network from its kernels (proto/graph.md, "The
 * execution plan"): the materialised tensors (graph inputs, params, every launch's output;
 * values fused away inside a chain have no storage), each with kind, bytes and an offset in
 * one arena, and the launches of fe_fused in order.
 *  - Views (reshape, flatten) are aliases: their tensor shares the bytes (and offset) of the
 *    tensor they view; chains of views resolve to the first non-view.
 *  - Inputs, params and outputs (and what an output view aliases) live for the whole run;
 *    an intermediate lives from the launch that writes it to the last launch that reads it
 *    (or one of its views), inclusive. Tensors whose lives do not overlap may share bytes:
 *    greedy placement, largest first, at the lowest offset that fits (64-byte aligned). A
 *    kernel's output never overlaps its inputs, because both are live at that launch, with
 *    one exception, for outputs of more than in_place_above bytes (CPU targets: a core's
 *    L2; negative: never):
 *  - In place: a launch whose kernel reads an input only where and before it writes the
 *    output (ir_subgraph_inplace_input: a residual added to a conv or a GEMM) writes its
 *    output over that input's bytes when it is the input's last reader, the input an
 *    intermediate of the output's size. The two then live as one, from the input's writer
 *    to the output's last read: the output's lines are the ones the kernel just read (no
 *    fetch of other lines to write), and the activations a network keeps take less cache.
 *    ResNet-50's bottleneck conv3 launches (2-core Xeon, alternated plans): 1.24-1.42x at
 *    batch 8 (3.2-25.7 MB outputs), 1.13-1.27x at batch 1 on the 3.2 MB ones; in place on
 *    400 KB ones that both cores had read (a 7 x 7 conv's input, split by filters) they ran
 *    0.73-0.79x: lines a core's L2 holds come back anyway, and each line written in place
 *    first had to be taken from the other core's copy. */

#define FE_PLAN_ALIGN 64

typedef enum { FE_T_INPUT, FE_T_PARAM, FE_T_INTERMEDIATE, FE_T_OUTPUT } fe_tensor_kind;

typedef struct {
    int value; /* index into g->values */
    fe_tensor_kind kind;
    int alias;      /* a view: the plan tensor (never a view) whose bytes it shares; else -1 */
    int reuses;     /* written in place: the plan tensor (neither a view nor in place) whose
                     * bytes it takes over at the launch that writes it; else -1 */
    int64_t bytes;  /* elements x dtype size */
    int64_t offset; /* in the arena, FE_PLAN_ALIGN-aligned (a view: its target's) */
    int first, last; /* launches that write / last read it; -1 and n_launch when pinned */
} fe_plan_tensor;

typedef struct {
    int n_tensor;
    fe_plan_tensor *tensor; /* in the graph's value order */
    int64_t arena_bytes;
    int64_t unshared_bytes; /* the arena without reuse (sum of aligned non-view sizes) */
} fe_plan;

const char *fe_tensor_kind_name(fe_tensor_kind k); /* "input", "param", "intermediate", "output" */
/* Plans the fused graph f of g into *out (free with fe_plan_free; empty on failure). */
int fe_plan_build(const fe_graph *g, const fe_fused *f, int64_t in_place_above, fe_plan *out,
                  tlm_error *err);
void fe_plan_free(fe_plan *p);
/* {"version", "alignment", "arena_bytes", "unshared_bytes", "tensors": [{"name", "kind",
 * "shape", "dtype", "bytes", "offset", "alias_of", "in_place_of"}], "inputs", "params",
 * "outputs",
 * "launches": [{"subgraph", "node", "op", "args", "repeat", "steps"}]}; NULL when out of
 * memory. The server adds each launch's "kernel" (key) and "launch" (CUDA config). */
json_t *fe_plan_to_json(const fe_graph *g, const fe_fused *f, const fe_plan *p);

/* ---- ONNX import (onnx.c; protobuf-c against the vendored onnx.proto) ----
 * An ONNX model (default-domain opset 13..21, float32, static shapes) → a graph and its
 * weights. Operators: Conv (+ bias; groups), BatchNormalization right after a Conv (folded
 * into its weight and bias), Gemm (transB, bias; alpha = beta = 1), MatMul (2-D B → dense,
 * same-rank → batch_matmul), Add / Mul (same shapes, or Add of a constant channel bias),
 * Relu, Clip(0, 6) / Clip(0), Gelu (erf), Sigmoid, Tanh, Softmax and LayerNormalization over
 * the last axis, GlobalAveragePool (as global_avg_pool2d + a view to [N, C, 1, 1]), MaxPool /
 * AveragePool (symmetric pads, no ceil_mode), Reshape (constant shape) and Flatten as views,
 * Transpose of the last two axes, Constant, Identity, Dropout. Initializers used as tensors
 * become params (a Conv's weight and bias are its own copies, "<out>.weight" / "<out>.bias").
 * Errors: TLM_EINVAL "onnx" (the protobuf does not decode), fields "onnx.graph.input[i]"
 * (dynamic or non-float inputs: TLM_EUNSUPPORTED), "onnx.graph.node[i]" naming the node and
 * op type (TLM_EUNSUPPORTED for an operator or attribute outside the list, the graph's own
 * error otherwise), "onnx.graph.initializer[i]" (data that does not match its dims),
 * "onnx.opset_import". weights may be NULL; else it receives every param's float32 data
 * (free with fe_onnx_weights_free). */
typedef struct {
    char *name;
    int64_t n;
    float *data;
} fe_onnx_param;

typedef struct {
    int n;
    fe_onnx_param *p;
} fe_onnx_weights;

int fe_onnx_import(const void *data, size_t len, fe_graph **out, fe_onnx_weights *weights,
                   tlm_error *err);
void fe_onnx_weights_free(fe_onnx_weights *w);

/* ---- model zoo (zoo.c) ---- */

enum { FE_ZOO_BATCH = 1 << 0, FE_ZOO_IMAGE_SIZE = 1 << 1, FE_ZOO_SEQ_LEN = 1 << 2 };

/* 0 in a field means "the model's default". */
typedef struct {
    int64_t batch, image_size, seq_len;
} fe_zoo_opts;

typedef struct {
    const char *name;
    const char *description;
    unsigned options; /* FE_ZOO_* the model takes */
    fe_zoo_opts defaults, min, max;
} fe_zoo_info;

const fe_zoo_info *fe_zoo_list(int *n);
const fe_zoo_info *fe_zoo_find(const char *name);
/* Builds the named model. Errors: TLM_ENOTFOUND for an unknown name (field "name"),
 * TLM_EINVAL for an option the model does not take or outside [min, max] (field "batch",
 * "image_size", "seq_len"), TLM_ELIMIT when the options make a tensor too large. */
int fe_zoo_build(const char *name, const fe_zoo_opts *opts, fe_graph **out, tlm_error *err);
/* {"name": N, "batch": B, "image_size": S, "seq_len": L} (options optional) → graph. Fields
 * are named "model.name", "model.batch", ... as in a POST /v1/compile body. */
int fe_zoo_from_json(const json_t *model, fe_graph **out, tlm_error *err);
/* [{"name", "description", "options": {"batch": {"default", "min", "max"}, ...}}, ...] */
json_t *fe_zoo_list_json(void);

#endif
