/* test_build.c — lowering a workload to stages: tensor shapes per ir.h's layout table, the
 * structure every consumer relies on (roles, one output, epilogues reading the previous stage
 * at the identity index, children before parents), FLOP and byte counts for known cases,
 * printing, and the failure path (the same error as ir_workload_check).
 *
 * Numerical correctness of the lowering is test_interp.c's job; this file checks the shapes
 * and counts that codegen, the space builder and the roofline numbers read directly.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir/ir.h"

static ir_workload wl(ir_op op, int n, const int64_t *shape)
{
    ir_workload w;
    ir_workload_init(&w, op);
    for (int i = 0; i < n; i++)
        w.shape[i] = shape[i];
    return w;
}

static void set_epi(ir_workload *w, int n, const ir_epilogue *e)
{
    w->n_epilogue = n;
    for (int i = 0; i < n; i++)
        w->epilogue[i] = e[i];
}

static ir_subgraph *build_ok(const ir_workload *w)
{
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert_not_null(g);
    tlm_error err = {0};
    int rc = ir_subgraph_build(w, g, &err);
    cr_assert_eq(rc, 0, "build failed: %s: %s", err.field, err.msg);
    return g;
}

/* Expected shape of one tensor: ndim and dims. */
typedef struct {
    int ndim;
    int64_t d[IR_MAX_DIMS];
} shp;

static void expect_shape(const ir_tensor *t, shp s, const char *what)
{
    cr_assert_eq(t->ndim, s.ndim, "%s (%s): rank %d, expected %d", what, t->name, t->ndim, s.ndim);
    for (int i = 0; i < s.ndim; i++)
        cr_assert_eq(t->shape[i], s.d[i], "%s (%s): dim %d is %lld, expected %lld", what, t->name,
                     i, (long long)t->shape[i], (long long)s.d[i]);
}

/* Checks the inputs (argument order) and the output of g against the expected shapes. */
static void expect_io(const ir_subgraph *g, int n, const shp *in, shp out)
{
    int idx[IR_MAX_TENSORS];
    int k = ir_subgraph_inputs(g, idx);
    cr_assert_eq(k, n, "%d inputs, expected %d", k, n);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "input %d", i);
        expect_shape(&g->tensor[idx[i]], in[i], what);
    }
    expect_shape(&g->tensor[g->output], out, "output");
}

/* The structural contract of ir.h, for any built subgraph. */
static void expect_well_formed(const ir_subgraph *g)
{
    const ir_workload *w = &g->wl;
    cr_assert(g->n_stage >= 1 && g->n_stage <= IR_MAX_STAGES);
    cr_assert(g->anchor >= 0 && g->anchor < g->n_stage);
    /* one OUTPUT tensor, written by the last stage */
    int outputs = 0;
    for (int t = 0; t < g->n_tensor; t++)
        outputs += g->tensor[t].kind == IR_T_OUTPUT;
    cr_assert_eq(outputs, 1);
    cr_assert_eq(g->tensor[g->output].kind, IR_T_OUTPUT);
    cr_assert_eq(g->stage[g->n_stage - 1].out, g->output);
    /* roles: prologues, the anchor, then one epilogue stage per epilogue entry */
    cr_assert_eq(g->stage[g->anchor].role, IR_ROLE_ANCHOR);
    cr_assert_eq(g->n_stage - 1 - g->anchor, w->n_epilogue);
    for (int i = 0; i < g->n_stage; i++) {
        const ir_stage *s = &g->stage[i];
        ir_role want = i < g->anchor    ? IR_ROLE_PROLOGUE
                       : i == g->anchor ? IR_ROLE_ANCHOR
                                        : IR_ROLE_EPILOGUE;
        cr_assert_eq(s->role, want, "stage %d (%s)", i, s->name);
        /* the written tensor's dims are the spatial axes, in order */
        const ir_tensor *o = &g->tensor[s->out];
        cr_assert_eq(o->ndim, s->n_spatial, "stage %s", s->name);
        for (int a = 0; a < s->n_spatial; a++)
            cr_assert_eq(o->shape[a], s->extent[a], "stage %s axis %d", s->name, a);
        cr_assert_neq(o->kind, IR_T_INPUT, "stage %s writes an input", s->name);
        cr_assert_eq(s->reduce == IR_RED_NONE, s->n_reduce == 0, "stage %s", s->name);
        cr_assert(s->n_spatial + s->n_reduce <= IR_MAX_AXES);
        /* children precede parents; loads name a tensor with a valid index rank */
        cr_assert(s->body >= 0 && s->body < s->n_expr, "stage %s", s->name);
        for (int e = 0; e < s->n_expr; e++) {
            const ir_expr *x = &s->expr[e];
            if (x->kind == IR_E_UNARY) cr_assert(x->a >= 0 && x->a < e);
            if (x->kind == IR_E_BINARY || x->kind == IR_E_SELECT)
                cr_assert(x->a >= 0 && x->a < e && x->b >= 0 && x->b < e, "stage %s", s->name);
            if (x->kind == IR_E_LOAD) {
                cr_assert(x->tensor >= 0 && x->tensor < g->n_tensor);
                cr_assert_neq(x->tensor, s->out, "stage %s reads its own output", s->name);
            }
        }
        /* an epilogue reads the previous stage's output at the identity index */
        if (s->role == IR_ROLE_EPILOGUE) {
            int prev = g->stage[i - 1].out;
            bool found = false;
            for (int e = 0; e < s->n_expr && !found; e++) {
                const ir_expr *x = &s->expr[e];
                if (x->kind != IR_E_LOAD || x->tensor != prev) continue;
                bool id = true;
                for (int d = 0; d < g->tensor[prev].ndim; d++)
                    for (int a = 0; a < IR_MAX_AXES; a++)
                        id = id && x->idx[d].coef[a] == (a == d) && x->idx[d].off == 0;
                found = id;
            }
            cr_assert(found, "epilogue stage %s does not read %s at the identity index", s->name,
                      g->tensor[prev].name);
        }
    }
}

/* ---- shapes per family (ir.h's layout table) ---- */

Test(build, dense_shapes_all_transposes)
{
    int64_t M = 3, N = 5, K = 7;
    for (int t = 0; t < 4; t++) {
        ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){M, N, K});
        w.transpose_a = t & 1, w.transpose_b = t >> 1;
        ir_subgraph *g = build_ok(&w);
        shp a = w.transpose_a ? (shp){2, {K, M}} : (shp){2, {M, K}};
        shp b = w.transpose_b ? (shp){2, {N, K}} : (shp){2, {K, N}};
        expect_io(g, 2, (shp[]){a, b}, (shp){2, {M, N}});
        expect_well_formed(g);
        cr_assert_eq(ir_stage_points(&g->stage[g->anchor]), M * N * K);
        free(g);
    }
}

Test(build, batch_matmul_shapes_all_transposes)
{
    int64_t B = 2, M = 3, N = 5, K = 7;
    for (int t = 0; t < 4; t++) {
        ir_workload w = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){B, M, N, K});
        w.transpose_a = t & 1, w.transpose_b = t >> 1;
        ir_subgraph *g = build_ok(&w);
        shp a = w.transpose_a ? (shp){3, {B, K, M}} : (shp){3, {B, M, K}};
        shp b = w.transpose_b ? (shp){3, {B, N, K}} : (shp){3, {B, K, N}};
        expect_io(g, 2, (shp[]){a, b}, (shp){3, {B, M, N}});
        expect_well_formed(g);
        free(g);
    }
}

static ir_workload conv(int64_t N, int64_t C, int64_t H, int64_t W, int64_t F, int64_t KH,
                        int64_t KW)
{
    return wl(IR_OP_CONV2D, 7, (int64_t[]){N, C, H, W, F, KH, KW});
}

Test(build, conv2d_shapes)
{
    /* ResNet stem: 224x224, 7x7, stride 2, pad 3 -> 112x112 */
    ir_workload w = conv(2, 3, 224, 224, 64, 7, 7);
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 3;
    ir_subgraph *g = build_ok(&w);
    expect_io(g, 2, (shp[]){{4, {2, 3, 224, 224}}, {4, {64, 3, 7, 7}}},
              (shp){4, {2, 64, 112, 112}});
    expect_well_formed(g);
    free(g);

    w.layout = IR_NHWC;
    g = build_ok(&w);
    expect_io(g, 2, (shp[]){{4, {2, 224, 224, 3}}, {4, {7, 7, 3, 64}}},
              (shp){4, {2, 112, 112, 64}});
    expect_well_formed(g);
    free(g);

    /* non-square everything: H 10, KH 3, stride 1, pad 2, dilation 2 -> 10+4-5+1 = 10;
     * W 9, KW 2, stride 3, pad 0, dilation 1 -> (9-2)/3+1 = 3 */
    w = conv(1, 4, 10, 9, 6, 3, 2);
    w.stride[1] = 3, w.pad[0] = 2, w.dilation[0] = 2;
    g = build_ok(&w);
    expect_io(g, 2, (shp[]){{4, {1, 4, 10, 9}}, {4, {6, 4, 3, 2}}}, (shp){4, {1, 6, 10, 3}});
    int64_t oh, ow;
    ir_workload_out_hw(&w, &oh, &ow);
    cr_assert_eq(oh, 10);
    cr_assert_eq(ow, 3);
    free(g);
}

/* A pointwise conv (1x1, unit strides, no padding) is lowered with its positions on one axis:
 * (H, W) as (1, H*W) in both layouts, the same memory; one that is strided or padded, or a
 * 1x3, keeps its rows. The fast reference (dgemm) still applies and the FLOPs are the
 * workload's. */
Test(build, pointwise_conv_positions_are_one_axis)
{
    ir_workload w = conv(2, 6, 5, 7, 4, 1, 1);
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_ADD});
    cr_assert(ir_conv_pointwise(&w));
    ir_subgraph *g = build_ok(&w);
    shp out = {4, {2, 4, 1, 35}};
    expect_io(g, 4, (shp[]){{4, {2, 6, 1, 35}}, {4, {4, 6, 1, 1}}, {1, {4}}, out}, out);
    expect_well_formed(g);
    const ir_stage *a = &g->stage[g->anchor];
    cr_expect_eq(a->extent[2], 1, "oh");
    cr_expect_eq(a->extent[3], 35, "ow: the 5 x 7 positions");
    cr_expect(ir_fastref_applies(g));
    cr_expect_eq(ir_subgraph_flops(g), 2 * 2 * 4 * 35 * 6 + 2 * 2 * 4 * 35);
    free(g);

    w.layout = IR_NHWC;
    g = build_ok(&w);
    out = (shp){4, {2, 1, 35, 4}};
    expect_io(g, 4, (shp[]){{4, {2, 1, 35, 6}}, {4, {1, 1, 6, 4}}, {1, {4}}, out}, out);
    cr_expect(ir_fastref_applies(g));
    free(g);

    static const struct {
        int64_t kw, stride, pad;
    } kept[] = {{1, 2, 0}, {1, 1, 1}, {3, 1, 1}};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        w = conv(1, 6, 5, 7, 4, 1, kept[i].kw);
        w.stride[0] = w.stride[1] = kept[i].stride, w.pad[1] = kept[i].pad;
        cr_expect(!ir_conv_pointwise(&w), "case %zu", i);
        g = build_ok(&w);
        int64_t oh, ow;
        ir_workload_out_hw(&w, &oh, &ow);
        expect_io(g, 2, (shp[]){{4, {1, 6, 5, 7}}, {4, {4, 6, 1, kept[i].kw}}},
                  (shp){4, {1, 4, oh, ow}});
        free(g);
    }
}

Test(build, grouped_conv2d_splits_f)
{
    /* ir.h: a grouped conv's output is [N,G,F/G,OH,OW] (NCHW) / [N,OH,OW,G,F/G] (NHWC) and the
     * weight [G,F/G,C/G,KH,KW] / [KH,KW,C/G,G,F/G]: the same row-major memory as the unsplit
     * tensors. Biases stay [F]; residuals take the output's (split) shape. */
    ir_workload w = conv(2, 8, 6, 6, 12, 3, 3);
    w.groups = 4, w.pad[0] = w.pad[1] = 1;
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_ADD});
    ir_subgraph *g = build_ok(&w);
    shp out = {5, {2, 4, 3, 6, 6}};
    expect_io(g, 4, (shp[]){{4, {2, 8, 6, 6}}, {5, {4, 3, 2, 3, 3}}, {1, {12}}, out}, out);
    expect_well_formed(g);
    free(g);

    w.layout = IR_NHWC;
    g = build_ok(&w);
    out = (shp){5, {2, 6, 6, 4, 3}};
    expect_io(g, 4, (shp[]){{4, {2, 6, 6, 8}}, {5, {3, 3, 2, 4, 3}}, {1, {12}}, out}, out);
    expect_well_formed(g);
    free(g);

    /* groups = C = F (depthwise-like): F/G = 1 */
    w = conv(1, 5, 4, 4, 5, 3, 3);
    w.groups = 5;
    g = build_ok(&w);
    expect_io(g, 2, (shp[]){{4, {1, 5, 4, 4}}, {5, {5, 1, 1, 3, 3}}}, (shp){5, {1, 5, 1, 2, 2}});
    free(g);
}

Test(build, depthwise_shapes)
{
    ir_workload w = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 32, 112, 112, 3, 3});
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 1;
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
    ir_subgraph *g = build_ok(&w);
    expect_io(g, 3, (shp[]){{4, {1, 32, 112, 112}}, {3, {32, 3, 3}}, {1, {32}}},
              (shp){4, {1, 32, 56, 56}});
    expect_well_formed(g);
    free(g);
    w.layout = IR_NHWC;
    g = build_ok(&w);
    expect_io(g, 3, (shp[]){{4, {1, 112, 112, 32}}, {3, {3, 3, 32}}, {1, {32}}},
              (shp){4, {1, 56, 56, 32}});
    free(g);
}

Test(build, pool_shapes_and_default_stride)
{
    ir_op ops[2] = {IR_OP_MAX_POOL2D, IR_OP_AVG_POOL2D};
    for (int o = 0; o < 2; o++) {
        /* default stride = window: 7/2 -> 3, 9/3 -> 3 */
        ir_workload w = wl(ops[o], 6, (int64_t[]){2, 3, 7, 9, 2, 3});
        ir_subgraph *g = build_ok(&w);
        expect_io(g, 1, (shp[]){{4, {2, 3, 7, 9}}}, (shp){4, {2, 3, 3, 3}});
        expect_well_formed(g);
        free(g);
        w.layout = IR_NHWC;
        w.pad[0] = w.pad[1] = 1; /* (7+2-2)/2+1 = 4, (9+2-3)/3+1 = 3 */
        g = build_ok(&w);
        expect_io(g, 1, (shp[]){{4, {2, 7, 9, 3}}}, (shp){4, {2, 4, 3, 3}});
        free(g);
    }
}

Test(build, global_pool_row_ops_elementwise_transpose_shapes)
{
    ir_workload w = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){2, 16, 7, 5});
    ir_subgraph *g = build_ok(&w);
    expect_io(g, 1, (shp[]){{4, {2, 16, 7, 5}}}, (shp){2, {2, 16}});
    free(g);
    w.layout = IR_NHWC;
    g = build_ok(&w);
    expect_io(g, 1, (shp[]){{4, {2, 7, 5, 16}}}, (shp){2, {2, 16}});
    free(g);

    int64_t R = 4, C = 10;
    w = wl(IR_OP_SOFTMAX, 2, (int64_t[]){R, C});
    g = build_ok(&w);
    expect_io(g, 1, (shp[]){{2, {R, C}}}, (shp){2, {R, C}});
    expect_well_formed(g);
    cr_assert_gt(g->anchor, 0, "softmax computes row statistics in prologue stages");
    free(g);

    w = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){R, C});
    g = build_ok(&w);
    expect_io(g, 3, (shp[]){{2, {R, C}}, {1, {C}}, {1, {C}}}, (shp){2, {R, C}});
    expect_well_formed(g);
    cr_assert_gt(g->anchor, 0);
    free(g);

    w = wl(IR_OP_RMS_NORM, 2, (int64_t[]){R, C});
    g = build_ok(&w);
    expect_io(g, 2, (shp[]){{2, {R, C}}, {1, {C}}}, (shp){2, {R, C}});
    expect_well_formed(g);
    free(g);

    ir_op red[3] = {IR_OP_REDUCE_SUM, IR_OP_REDUCE_MEAN, IR_OP_REDUCE_MAX};
    for (int i = 0; i < 3; i++) {
        w = wl(red[i], 2, (int64_t[]){R, C});
        set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD}); /* bias over R */
        g = build_ok(&w);
        expect_io(g, 2, (shp[]){{2, {R, C}}, {1, {R}}}, (shp){1, {R}});
        expect_well_formed(g);
        free(g);
    }

    w = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){R, C});
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD}); /* the last axis of out[C,R] is R */
    g = build_ok(&w);
    expect_io(g, 2, (shp[]){{2, {R, C}}, {1, {R}}}, (shp){2, {C, R}});
    free(g);

    w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){1000});
    set_epi(&w, 3, (ir_epilogue[]){IR_EPI_ADD, IR_EPI_RELU, IR_EPI_MUL});
    g = build_ok(&w);
    expect_io(g, 3, (shp[]){{1, {1000}}, {1, {1000}}, {1, {1000}}}, (shp){1, {1000}});
    expect_well_formed(g);
    free(g);
}

Test(build, epilogue_extra_input_shapes)
{
    /* bias along N for matmuls; add/mul of the output's shape, in chain order */
    ir_workload w = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){2, 3, 5, 7});
    set_epi(&w, 5,
            (ir_epilogue[]){IR_EPI_MUL, IR_EPI_BIAS_ADD, IR_EPI_GELU, IR_EPI_ADD, IR_EPI_BIAS_ADD});
    ir_subgraph *g = build_ok(&w);
    shp o = {3, {2, 3, 5}};
    expect_io(g, 6, (shp[]){{3, {2, 3, 7}}, {3, {2, 7, 5}}, o, {1, {5}}, o, {1, {5}}}, o);
    expect_well_formed(g);
    free(g);

    /* pools and global pools: bias along C */
    w = wl(IR_OP_AVG_POOL2D, 6, (int64_t[]){1, 6, 8, 8, 2, 2});
    w.layout = IR_NHWC;
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
    g = build_ok(&w);
    expect_io(g, 2, (shp[]){{4, {1, 8, 8, 6}}, {1, {6}}}, (shp){4, {1, 4, 4, 6}});
    free(g);
}

Test(build, every_op_takes_the_longest_epilogue)
{
    /* Whatever ir_workload_check accepts must build: eight tensor-reading epilogues on every
     * family (the most tensors and stages a workload can ask for). */
    const ir_epilogue heavy[8] = {IR_EPI_BIAS_ADD, IR_EPI_ADD, IR_EPI_MUL, IR_EPI_BIAS_ADD,
                                  IR_EPI_ADD,      IR_EPI_MUL, IR_EPI_ADD, IR_EPI_MUL};
    ir_workload ws[IR_OP_COUNT + 2];
    int n = 0;
    ws[n++] = wl(IR_OP_DENSE, 3, (int64_t[]){4, 4, 4});
    ws[n++] = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){2, 4, 4, 4});
    ws[n++] = conv(1, 4, 6, 6, 4, 3, 3);
    ws[n] = conv(1, 4, 6, 6, 4, 3, 3);
    ws[n].groups = 2, ws[n].layout = IR_NHWC, ws[n].pad[0] = 1, n++;
    ws[n++] = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 4, 6, 6, 3, 3});
    ws[n++] = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 4, 6, 6, 2, 2});
    ws[n++] = wl(IR_OP_AVG_POOL2D, 6, (int64_t[]){1, 4, 6, 6, 2, 2});
    ws[n++] = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){1, 4, 6, 6});
    for (ir_op op = IR_OP_SOFTMAX; op <= IR_OP_REDUCE_MAX; op++)
        ws[n++] = wl(op, 2, (int64_t[]){4, 8});
    ws[n++] = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){16});
    ws[n++] = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){4, 8});
    for (int i = 0; i < n; i++) {
        set_epi(&ws[i], 8, heavy);
        cr_assert_eq(ir_workload_check(&ws[i], NULL), 0, "op %s", ir_op_get(ws[i].op)->name);
        ir_subgraph *g = build_ok(&ws[i]);
        expect_well_formed(g);
        int idx[IR_MAX_TENSORS];
        int anchor_inputs = ws[i].op == IR_OP_LAYER_NORM                                       ? 3
                            : ws[i].op == IR_OP_RMS_NORM || ws[i].op <= IR_OP_DEPTHWISE_CONV2D ? 2
                                                                                               : 1;
        cr_assert_eq(ir_subgraph_inputs(g, idx), anchor_inputs + 8, "op %s",
                     ir_op_get(ws[i].op)->name);
        free(g);
    }
}

Test(build, dtype_propagates)
{
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){4, 4, 4});
    w.dtype = IR_BFLOAT16;
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
    ir_subgraph *g = build_ok(&w);
    int idx[IR_MAX_TENSORS];
    int n = ir_subgraph_inputs(g, idx);
    for (int i = 0; i < n; i++)
        cr_assert_eq(g->tensor[idx[i]].dtype, IR_BFLOAT16);
    cr_assert_eq(g->tensor[g->output].dtype, IR_BFLOAT16);
    free(g);
}

Test(build, build_leaves_the_workload_alone)
{
    ir_workload w = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 2, 8, 8, 2, 2});
    ir_workload before = w;
    ir_subgraph *g = build_ok(&w);
    cr_assert_eq(memcmp(&w, &before, sizeof w), 0);
    free(g);
}

/* ---- FLOPs and bytes ---- */

Test(build, dense_flops)
{
    int64_t M = 64, N = 32, K = 16;
    for (int t = 0; t < 4; t++) {
        ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){M, N, K});
        w.transpose_a = t & 1, w.transpose_b = t >> 1;
        ir_subgraph *g = build_ok(&w);
        cr_assert_eq(ir_subgraph_flops(g), 2 * M * N * K);
        free(g);
        set_epi(&w, 1, (ir_epilogue[]){IR_EPI_BIAS_ADD});
        g = build_ok(&w);
        cr_assert_eq(ir_subgraph_flops(g), 2 * M * N * K + M * N);
        free(g);
        set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
        g = build_ok(&w);
        cr_assert_eq(ir_subgraph_flops(g), 2 * M * N * K + 2 * M * N);
        free(g);
    }
    ir_workload b = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){3, M, N, K});
    set_epi(&b, 1, (ir_epilogue[]){IR_EPI_ADD});
    ir_subgraph *g = build_ok(&b);
    cr_assert_eq(ir_subgraph_flops(g), 3 * (2 * M * N * K + M * N));
    free(g);
}

Test(build, conv_flops)
{
    /* 2 * N * F * OH * OW * C/g * KH * KW; padding selects cost nothing */
    struct {
        int64_t s[7], stride, pad, groups;
        ir_layout layout;
    } cs[] = {
        {{2, 3, 224, 224, 64, 7, 7}, 2, 3, 1, IR_NCHW},
        {{1, 64, 56, 56, 64, 3, 3}, 1, 1, 1, IR_NHWC},
        {{1, 64, 56, 56, 128, 3, 3}, 1, 1, 32, IR_NCHW}, /* ResNeXt-like */
        {{1, 64, 56, 56, 128, 1, 1}, 2, 0, 4, IR_NHWC},
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        ir_workload w = wl(IR_OP_CONV2D, 7, cs[i].s);
        w.stride[0] = w.stride[1] = cs[i].stride, w.pad[0] = w.pad[1] = cs[i].pad;
        w.groups = cs[i].groups, w.layout = cs[i].layout;
        int64_t oh, ow;
        ir_workload_out_hw(&w, &oh, &ow);
        const int64_t *s = cs[i].s;
        int64_t want = 2 * s[0] * s[4] * oh * ow * (s[1] / w.groups) * s[5] * s[6];
        ir_subgraph *g = build_ok(&w);
        cr_assert_eq(ir_subgraph_flops(g), want, "case %zu: %lld vs %lld", i,
                     (long long)ir_subgraph_flops(g), (long long)want);
        free(g);
        set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_RELU});
        g = build_ok(&w);
        cr_assert_eq(ir_subgraph_flops(g), want + 2 * s[0] * s[4] * oh * ow);
        free(g);
    }
}

Test(build, window_and_row_flops)
{
    /* depthwise: 2 per window point; max pool: 1 compare per point; avg pool: 1 add per
     * point + 1 scale per output; global avg pool likewise */
    ir_workload w = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 32, 112, 112, 3, 3});
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 1;
    ir_subgraph *g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 2 * 32 * 56 * 56 * 9);
    free(g);

    w = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){2, 64, 112, 112, 3, 3});
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 1; /* -> 56x56 */
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 2 * 64 * 56 * 56 * 9);
    free(g);

    w.op = IR_OP_AVG_POOL2D;
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 2 * 64 * 56 * 56 * 9 + 2 * 64 * 56 * 56);
    free(g);

    w = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){2, 2048, 7, 7});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 2 * 2048 * 49 + 2 * 2048);
    free(g);

    int64_t R = 12, C = 384;
    /* softmax, lowered as row max (1 compare), row sum of exp(x - max) (sub, exp, add) and
     * exp(x - max) / sum (sub, exp, div): 7 per element */
    w = wl(IR_OP_SOFTMAX, 2, (int64_t[]){R, C});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 7 * R * C);
    free(g);

    w = wl(IR_OP_REDUCE_SUM, 2, (int64_t[]){R, C});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), R * C);
    free(g);
    w.op = IR_OP_REDUCE_MAX;
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), R * C);
    free(g);
    w.op = IR_OP_REDUCE_MEAN;
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), R * C + R);
    free(g);

    w = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){R, C});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 0, "a transpose moves data only");
    free(g);

    w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){1000});
    set_epi(&w, 3, (ir_epilogue[]){IR_EPI_ADD, IR_EPI_MUL, IR_EPI_SIGMOID});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), 3000);
    free(g);
}

Test(build, flops_of_huge_workloads_do_not_overflow)
{
    /* The largest dense ir_workload_check allows: each operand at 2^34 elements. */
    ir_workload w =
        wl(IR_OP_DENSE, 3, (int64_t[]){INT64_C(1) << 17, INT64_C(1) << 17, INT64_C(1) << 17});
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
    ir_subgraph *g = build_ok(&w);
    int64_t mn = INT64_C(1) << 34;
    cr_assert_eq(ir_subgraph_flops(g), 2 * mn * (INT64_C(1) << 17) + 2 * mn);
    cr_assert_eq(ir_subgraph_bytes(g), 4 * (3 * mn + (INT64_C(1) << 17)));
    free(g);

    /* A conv near the 2^56 work bound: 2^30 outputs x 2^22 reduction points. */
    w = conv(1, 4, (INT64_C(1) << 15) + 1023, (INT64_C(1) << 15) + 1023, 1, 1024, 1024);
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_flops(g), INT64_C(1) << 53);
    free(g);
}

Test(build, bytes_are_inputs_plus_output)
{
    int64_t M = 64, N = 32, K = 16;
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){M, N, K});
    ir_subgraph *g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (M * K + K * N + M * N) * 4);
    free(g);
    /* bias [N] and a residual [M,N] are read; the intermediate temps are not counted */
    set_epi(&w, 4, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU, IR_EPI_ADD, IR_EPI_RELU});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (M * K + K * N + M * N + N + M * N) * 4);
    free(g);
    w.dtype = IR_FLOAT16;
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (M * K + K * N + M * N + N + M * N) * 2);
    free(g);

    w = conv(1, 8, 10, 10, 6, 3, 3);
    w.groups = 2, w.pad[0] = w.pad[1] = 1;
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (8 * 100 + 6 * 4 * 9 + 6 * 100) * 4);
    free(g);

    /* softmax's row statistics are temps: only X and out */
    w = wl(IR_OP_SOFTMAX, 2, (int64_t[]){12, 384});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), 2 * 12 * 384 * 4);
    free(g);
    w = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){12, 384});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (2 * 12 * 384 + 2 * 384) * 4);
    free(g);
    w = wl(IR_OP_REDUCE_MEAN, 2, (int64_t[]){12, 384});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (12 * 384 + 12) * 4);
    free(g);
    w = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 4, 8, 8, 2, 2});
    g = build_ok(&w);
    cr_assert_eq(ir_subgraph_bytes(g), (4 * 64 + 4 * 16) * 4);
    free(g);
}

/* ---- printing ---- */

Test(build, print_mentions_every_stage_and_tensor)
{
    ir_workload ws[3];
    ws[0] = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){4, 8});
    set_epi(&ws[0], 3, (ir_epilogue[]){IR_EPI_ADD, IR_EPI_GELU, IR_EPI_MUL});
    ws[1] = conv(1, 4, 6, 6, 8, 3, 3);
    ws[1].groups = 2, ws[1].pad[0] = 1;
    set_epi(&ws[1], 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_RELU6});
    ws[2] = wl(IR_OP_SOFTMAX, 2, (int64_t[]){4, 8});
    for (int i = 0; i < 3; i++) {
        ir_subgraph *g = build_ok(&ws[i]);
        char buf[8192];
        int n = ir_subgraph_print(g, buf, sizeof buf);
        cr_assert_eq(n, (int)strlen(buf));
        cr_assert_lt(n, (int)sizeof buf - 1, "output should not be truncated here");
        for (int s = 0; s < g->n_stage; s++) {
            char pat[32];
            snprintf(pat, sizeof pat, "stage %s ", g->stage[s].name);
            cr_assert_not_null(strstr(buf, pat), "no \"%s\" in:\n%s", pat, buf);
        }
        for (int t = 0; t < g->n_tensor; t++)
            cr_assert_not_null(strstr(buf, g->tensor[t].name), "no tensor %s in:\n%s",
                               g->tensor[t].name, buf);
        free(g);
    }
}

Test(build, print_truncates_safely)
{
    ir_workload w = conv(1, 4, 6, 6, 8, 3, 3);
    w.pad[0] = 1;
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_RELU});
    ir_subgraph *g = build_ok(&w);
    char full[8192];
    int n = ir_subgraph_print(g, full, sizeof full);
    cr_assert_gt(n, 40);
    char small[33];
    memset(small, 'x', sizeof small);
    int m = ir_subgraph_print(g, small, 32);
    cr_assert_leq(m, 31);
    cr_assert_eq(small[31], '\0');
    cr_assert_eq(small[32], 'x', "wrote past cap");
    cr_assert_eq(strncmp(small, full, 31), 0);
    cr_assert_eq(ir_subgraph_print(g, NULL, 0), 0);
    free(g);
}

/* ---- failures ---- */

Test(build, invalid_workload_fails_like_check)
{
    ir_workload bad[12];
    int n = 0;
    bad[n++] = wl(IR_OP_DENSE, 3, (int64_t[]){4, 0, 4});
    bad[n++] = wl(IR_OP_DENSE, 3, (int64_t[]){INT64_C(1) << 20, 4, INT64_C(1) << 20});
    bad[n] = conv(1, 4, 6, 6, 6, 3, 3), bad[n++].groups = 4;
    bad[n] = conv(1, 4, 6, 6, 6, 3, 3), bad[n++].stride[1] = 0;
    bad[n] = conv(1, 4, 2, 6, 6, 3, 3), n++;
    bad[n] = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 4, 6, 6, 2, 2}), bad[n++].pad[1] = 2;
    bad[n] = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){4, 4}), bad[n++].eps = 0;
    bad[n++] = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){4});
    bad[n] = wl(IR_OP_SOFTMAX, 2, (int64_t[]){4, 4}), bad[n].n_epilogue = 1,
    bad[n++].epilogue[0] = (ir_epilogue)99;
    bad[n] = wl(IR_OP_SOFTMAX, 2, (int64_t[]){4, 4}), bad[n++].op = IR_OP_COUNT;
    for (int i = 0; i < n; i++) {
        tlm_error ce = {0}, be = {0};
        int crc = ir_workload_check(&bad[i], &ce);
        ir_subgraph *g = calloc(1, sizeof *g);
        int brc = ir_subgraph_build(&bad[i], g, &be);
        cr_assert_neq(crc, 0, "case %d should be invalid", i);
        cr_assert_eq(brc, crc, "case %d", i);
        cr_assert_eq(be.code, ce.code, "case %d", i);
        cr_assert_str_eq(be.field, ce.field, "case %d", i);
        cr_assert_str_eq(be.msg, ce.msg, "case %d", i);
        cr_assert_neq(be.msg[0], '\0', "case %d: empty message", i);
        /* and without an error struct */
        cr_assert_eq(ir_subgraph_build(&bad[i], g, NULL), crc);
        free(g);
    }
}
