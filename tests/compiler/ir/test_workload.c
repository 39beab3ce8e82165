/* test_workload.c — the C-level workload API: op table and names, defaults, the validation
 * rules of ir_workload_check (each names its field), the canonical form and the workload hash.
 *
 * The JSON codecs have their own tests under tests/proto/; nothing here goes through JSON
 * except jansson used as an independent judge that the canonical form is compact JSON with
 * sorted keys. Golden canonical strings and hashes were computed outside this code (the
 * hashes with Python's hashlib over "tlm-workload-v1\n" + the canonical string): a change to
 * either invalidates every cached kernel, so it must be deliberate (bump the prefix).
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
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

static ir_workload conv(int64_t N, int64_t C, int64_t H, int64_t W, int64_t F, int64_t KH,
                        int64_t KW)
{
    return wl(IR_OP_CONV2D, 7, (int64_t[]){N, C, H, W, F, KH, KW});
}

static ir_workload pool(ir_op op, int64_t H, int64_t W, int64_t KH, int64_t KW)
{
    return wl(op, 6, (int64_t[]){1, 4, H, W, KH, KW});
}

static void set_epi(ir_workload *w, int n, const ir_epilogue *e)
{
    w->n_epilogue = n;
    for (int i = 0; i < n; i++)
        w->epilogue[i] = e[i];
}

#define EXPECT_OK(w)                                                                               \
    do {                                                                                           \
        tlm_error e_ = {0};                                                                        \
        int rc_ = ir_workload_check((w), &e_);                                                     \
        cr_assert_eq(rc_, 0, "line %d: rejected: %s: %s", __LINE__, e_.field, e_.msg);             \
    } while (0)

/* Rejected with TLM_EINVAL, the given field and a non-empty message; also without err. */
#define EXPECT_BAD(w, fld)                                                                         \
    do {                                                                                           \
        tlm_error e_ = {0};                                                                        \
        int rc_ = ir_workload_check((w), &e_);                                                     \
        cr_assert_eq(rc_, TLM_EINVAL, "line %d: expected rejection on %s, got rc %d", __LINE__,    \
                     (fld), rc_);                                                                  \
        cr_assert_eq(e_.code, TLM_EINVAL, "line %d", __LINE__);                                    \
        cr_assert_str_eq(e_.field, (fld), "line %d: field %s (%s), expected %s", __LINE__,         \
                         e_.field, e_.msg, (fld));                                                 \
        cr_assert_neq(e_.msg[0], '\0', "line %d: empty message", __LINE__);                        \
        cr_assert_eq(ir_workload_check((w), NULL), TLM_EINVAL, "line %d", __LINE__);               \
    } while (0)

/* ---- op table, names ---- */

Test(workload, op_names_round_trip)
{
    for (int i = 0; i < IR_OP_COUNT; i++) {
        const ir_op_info *in = ir_op_get((ir_op)i);
        cr_assert_not_null(in);
        ir_op op = IR_OP_COUNT;
        cr_assert_eq(ir_op_from_name(in->name, &op), 0, "%s", in->name);
        cr_assert_eq(op, (ir_op)i, "%s", in->name);
        cr_assert(in->n_keys >= 1 && in->n_keys <= IR_MAX_KEYS);
    }
    ir_op op;
    cr_assert_eq(ir_op_from_name("matmul", &op), 0);
    cr_assert_eq(op, IR_OP_DENSE);
    cr_assert_eq(ir_op_from_name("Dense", &op), TLM_EINVAL);
    cr_assert_eq(ir_op_from_name("", &op), TLM_EINVAL);
    cr_assert_eq(ir_op_from_name("conv2d ", &op), TLM_EINVAL);
    cr_assert_eq(ir_op_from_name(NULL, &op), TLM_EINVAL);
    cr_assert_null(ir_op_get(IR_OP_COUNT));
    cr_assert_null(ir_op_get((ir_op)-1));
    /* the DESIGN names */
    const char *names[] = {
        "dense",      "batch_matmul",      "conv2d",     "depthwise_conv2d", "max_pool2d",
        "avg_pool2d", "global_avg_pool2d", "softmax",    "layer_norm",       "rms_norm",
        "reduce_sum", "reduce_mean",       "reduce_max", "elementwise",      "transpose"};
    for (int i = 0; i < IR_OP_COUNT; i++)
        cr_assert_str_eq(ir_op_get((ir_op)i)->name, names[i]);
}

Test(workload, shape_key_enums_match_the_table)
{
    struct {
        ir_op op;
        int idx;
        const char *key;
    } k[] = {
        {IR_OP_DENSE, IR_DENSE_M, "M"},           {IR_OP_DENSE, IR_DENSE_N, "N"},
        {IR_OP_DENSE, IR_DENSE_K, "K"},           {IR_OP_BATCH_MATMUL, IR_BMM_B, "B"},
        {IR_OP_BATCH_MATMUL, IR_BMM_M, "M"},      {IR_OP_BATCH_MATMUL, IR_BMM_N, "N"},
        {IR_OP_BATCH_MATMUL, IR_BMM_K, "K"},      {IR_OP_CONV2D, IR_CONV_N, "N"},
        {IR_OP_CONV2D, IR_CONV_C, "C"},           {IR_OP_CONV2D, IR_CONV_H, "H"},
        {IR_OP_CONV2D, IR_CONV_W, "W"},           {IR_OP_CONV2D, IR_CONV_F, "F"},
        {IR_OP_CONV2D, IR_CONV_KH, "KH"},         {IR_OP_CONV2D, IR_CONV_KW, "KW"},
        {IR_OP_DEPTHWISE_CONV2D, IR_DW_C, "C"},   {IR_OP_DEPTHWISE_CONV2D, IR_DW_KH, "KH"},
        {IR_OP_DEPTHWISE_CONV2D, IR_DW_KW, "KW"}, {IR_OP_MAX_POOL2D, IR_DW_H, "H"},
        {IR_OP_AVG_POOL2D, IR_DW_W, "W"},         {IR_OP_AVG_POOL2D, IR_DW_N, "N"},
        {IR_OP_GLOBAL_AVG_POOL2D, IR_GP_N, "N"},  {IR_OP_GLOBAL_AVG_POOL2D, IR_GP_C, "C"},
        {IR_OP_GLOBAL_AVG_POOL2D, IR_GP_H, "H"},  {IR_OP_GLOBAL_AVG_POOL2D, IR_GP_W, "W"},
        {IR_OP_SOFTMAX, IR_ROW_R, "R"},           {IR_OP_LAYER_NORM, IR_ROW_C, "C"},
        {IR_OP_REDUCE_MAX, IR_ROW_R, "R"},        {IR_OP_TRANSPOSE, IR_ROW_C, "C"},
        {IR_OP_ELEMENTWISE, IR_EW_N, "N"},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        cr_assert_str_eq(ir_op_get(k[i].op)->keys[k[i].idx], k[i].key);
        cr_assert_eq(ir_op_key_index(k[i].op, k[i].key), k[i].idx);
    }
    cr_assert_eq(ir_op_get(IR_OP_CONV2D)->n_keys, 7);
    cr_assert_eq(ir_op_get(IR_OP_MAX_POOL2D)->n_keys, 6);
    cr_assert_eq(ir_op_key_index(IR_OP_DENSE, "F"), -1);
    cr_assert_eq(ir_op_key_index(IR_OP_DENSE, "m"), -1);
    cr_assert_eq(ir_op_key_index(IR_OP_DENSE, NULL), -1);
    cr_assert_eq(ir_op_key_index(IR_OP_COUNT, "M"), -1);
}

Test(workload, op_fields)
{
    const unsigned win = IR_F_STRIDE | IR_F_PAD | IR_F_LAYOUT;
    cr_assert_eq(ir_op_get(IR_OP_DENSE)->fields, IR_F_TRANSPOSE);
    cr_assert_eq(ir_op_get(IR_OP_BATCH_MATMUL)->fields, IR_F_TRANSPOSE);
    cr_assert_eq(ir_op_get(IR_OP_CONV2D)->fields, win | IR_F_DILATION | IR_F_GROUPS);
    cr_assert_eq(ir_op_get(IR_OP_DEPTHWISE_CONV2D)->fields, win | IR_F_DILATION);
    cr_assert_eq(ir_op_get(IR_OP_MAX_POOL2D)->fields, win);
    cr_assert_eq(ir_op_get(IR_OP_AVG_POOL2D)->fields, win);
    cr_assert_eq(ir_op_get(IR_OP_GLOBAL_AVG_POOL2D)->fields, IR_F_LAYOUT);
    cr_assert_eq(ir_op_get(IR_OP_LAYER_NORM)->fields, IR_F_EPS);
    cr_assert_eq(ir_op_get(IR_OP_RMS_NORM)->fields, IR_F_EPS);
    cr_assert_eq(ir_op_get(IR_OP_SOFTMAX)->fields, 0);
    cr_assert_eq(ir_op_get(IR_OP_ELEMENTWISE)->fields, 0);
}

Test(workload, dtype_layout_epilogue_names_round_trip)
{
    const char *dt[IR_DTYPE_COUNT] = {"float32", "float16", "bfloat16"};
    const size_t sz[IR_DTYPE_COUNT] = {4, 2, 2};
    for (int i = 0; i < IR_DTYPE_COUNT; i++) {
        ir_dtype t = IR_DTYPE_COUNT;
        cr_assert_str_eq(ir_dtype_name((ir_dtype)i), dt[i]);
        cr_assert_eq(ir_dtype_from_name(dt[i], &t), 0);
        cr_assert_eq(t, (ir_dtype)i);
        cr_assert_eq(ir_dtype_size((ir_dtype)i), sz[i]);
    }
    ir_dtype t;
    cr_assert_eq(ir_dtype_from_name("fp32", &t), TLM_EINVAL);
    cr_assert_eq(ir_dtype_from_name("float64", &t), TLM_EINVAL);
    cr_assert_eq(ir_dtype_from_name(NULL, &t), TLM_EINVAL);

    const char *ly[IR_LAYOUT_COUNT] = {"NCHW", "NHWC"};
    for (int i = 0; i < IR_LAYOUT_COUNT; i++) {
        ir_layout l = IR_LAYOUT_COUNT;
        cr_assert_str_eq(ir_layout_name((ir_layout)i), ly[i]);
        cr_assert_eq(ir_layout_from_name(ly[i], &l), 0);
        cr_assert_eq(l, (ir_layout)i);
    }
    ir_layout l;
    cr_assert_eq(ir_layout_from_name("NWHC", &l), TLM_EINVAL);
    cr_assert_eq(ir_layout_from_name(NULL, &l), TLM_EINVAL);

    const char *ep[IR_EPI_COUNT] = {"bias_add", "add",  "mul",     "relu", "relu6",
                                    "gelu",     "silu", "sigmoid", "tanh"};
    for (int i = 0; i < IR_EPI_COUNT; i++) {
        ir_epilogue e = IR_EPI_COUNT;
        cr_assert_str_eq(ir_epilogue_name((ir_epilogue)i), ep[i]);
        cr_assert_eq(ir_epilogue_from_name(ep[i], &e), 0);
        cr_assert_eq(e, (ir_epilogue)i);
    }
    ir_epilogue e = IR_EPI_COUNT;
    cr_assert_eq(ir_epilogue_from_name("swish", &e), 0);
    cr_assert_eq(e, IR_EPI_SILU, "swish(x) = x * sigmoid(x) = silu");
    cr_assert_eq(ir_epilogue_from_name("leaky_relu", &e), TLM_EINVAL);
    cr_assert_eq(ir_epilogue_from_name("", &e), TLM_EINVAL);
    cr_assert_eq(ir_epilogue_from_name(NULL, &e), TLM_EINVAL);

    /* out-of-range enums print as something, never crash */
    cr_assert_not_null(ir_dtype_name(IR_DTYPE_COUNT));
    cr_assert_not_null(ir_layout_name(IR_LAYOUT_COUNT));
    cr_assert_not_null(ir_epilogue_name(IR_EPI_COUNT));
}

Test(workload, init_defaults)
{
    for (int op = 0; op < IR_OP_COUNT; op++) {
        ir_workload w;
        memset(&w, 0x5a, sizeof w);
        ir_workload_init(&w, (ir_op)op);
        bool pool = op == IR_OP_MAX_POOL2D || op == IR_OP_AVG_POOL2D;
        cr_assert_eq(w.op, (ir_op)op);
        cr_assert_eq(w.dtype, IR_FLOAT32);
        cr_assert_eq(w.layout, IR_NCHW);
        cr_assert_eq(w.transpose_a, false);
        cr_assert_eq(w.transpose_b, false);
        for (int d = 0; d < 2; d++) {
            cr_assert_eq(w.stride[d], pool ? 0 : 1, "op %d: stride (pools: 0 = the window)", op);
            cr_assert_eq(w.pad[d], 0);
            cr_assert_eq(w.dilation[d], 1);
        }
        cr_assert_eq(w.groups, 1);
        cr_assert_eq(w.eps, 1e-5);
        cr_assert_eq(w.n_epilogue, 0);
        for (int k = 0; k < IR_MAX_KEYS; k++)
            cr_assert_eq(w.shape[k], 0);
        /* shape keys unset: not valid yet */
        cr_assert_neq(ir_workload_check(&w, NULL), 0);
    }
}

Test(workload, normalize_fills_pool_stride)
{
    ir_workload w = pool(IR_OP_AVG_POOL2D, 8, 9, 3, 2);
    ir_workload_normalize(&w);
    cr_assert_eq(w.stride[0], 3);
    cr_assert_eq(w.stride[1], 2);
    ir_workload x = w;
    ir_workload_normalize(&x);
    cr_assert_eq(memcmp(&w, &x, sizeof w), 0, "normalize is idempotent");
    w.stride[0] = 1, w.stride[1] = 0;
    ir_workload_normalize(&w);
    cr_assert_eq(w.stride[0], 1, "an explicit stride stays");
    cr_assert_eq(w.stride[1], 2);
    /* non-pools are left alone */
    ir_workload c = conv(1, 2, 5, 5, 2, 3, 3);
    c.stride[0] = 2;
    x = c;
    ir_workload_normalize(&c);
    cr_assert_eq(memcmp(&c, &x, sizeof c), 0);
}

Test(workload, out_hw)
{
    int64_t oh, ow;
    ir_workload w = conv(1, 3, 224, 224, 64, 7, 7);
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 3;
    ir_workload_out_hw(&w, &oh, &ow);
    cr_assert_eq(oh, 112);
    cr_assert_eq(ow, 112);
    w = conv(1, 3, 10, 11, 4, 3, 3);
    w.dilation[0] = 2, w.pad[1] = 2, w.stride[1] = 3; /* 10-5+1 = 6; (11+4-3)/3+1 = 5 */
    ir_workload_out_hw(&w, &oh, &ow);
    cr_assert_eq(oh, 6);
    cr_assert_eq(ow, 5);
    w = pool(IR_OP_MAX_POOL2D, 112, 113, 3, 3); /* default stride 3: 37, 37 */
    ir_workload_out_hw(&w, &oh, &ow);
    cr_assert_eq(oh, 37);
    cr_assert_eq(ow, 37);
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 1; /* 56, (113+2-3)/2+1 = 57 */
    ir_workload_out_hw(&w, &oh, &ow);
    cr_assert_eq(oh, 56);
    cr_assert_eq(ow, 57);
}

/* ---- validation ---- */

Test(workload, valid_examples)
{
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){1024, 1024, 1024});
    set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
    EXPECT_OK(&w);
    w = conv(1, 64, 56, 56, 64, 3, 3);
    w.pad[0] = w.pad[1] = 1;
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU});
    EXPECT_OK(&w);
    w = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){12, 128, 128, 64});
    w.transpose_b = true;
    EXPECT_OK(&w);
    w = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 32, 112, 112, 3, 3});
    w.layout = IR_NHWC, w.pad[0] = w.pad[1] = 1;
    EXPECT_OK(&w);
    w = pool(IR_OP_MAX_POOL2D, 112, 112, 3, 3);
    w.stride[0] = w.stride[1] = 2, w.pad[0] = w.pad[1] = 1;
    EXPECT_OK(&w);
    w = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){1, 2048, 7, 7});
    EXPECT_OK(&w);
    for (ir_op op = IR_OP_SOFTMAX; op <= IR_OP_REDUCE_MAX; op++) {
        w = wl(op, 2, (int64_t[]){128, 768});
        EXPECT_OK(&w);
    }
    w = wl(IR_OP_TRANSPOSE, 2, (int64_t[]){128, 768});
    EXPECT_OK(&w);
    w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){1 << 20});
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_SILU});
    EXPECT_OK(&w);
    /* eight epilogues is the limit and is allowed */
    w = wl(IR_OP_DENSE, 3, (int64_t[]){4, 4, 4});
    w.n_epilogue = IR_MAX_EPILOGUE;
    for (int i = 0; i < IR_MAX_EPILOGUE; i++)
        w.epilogue[i] = IR_EPI_ADD;
    EXPECT_OK(&w);
    /* the input is never modified (check works on a copy) */
    ir_workload p = pool(IR_OP_AVG_POOL2D, 8, 8, 2, 2), q = p;
    EXPECT_OK(&p);
    cr_assert_eq(memcmp(&p, &q, sizeof p), 0);
}

Test(workload, extents_positive)
{
    for (int op = 0; op < IR_OP_COUNT; op++) {
        const ir_op_info *in = ir_op_get((ir_op)op);
        for (int k = 0; k < in->n_keys; k++) {
            ir_workload w;
            ir_workload_init(&w, (ir_op)op);
            for (int j = 0; j < in->n_keys; j++)
                w.shape[j] = 4;
            if (op == IR_OP_ELEMENTWISE) set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU});
            EXPECT_OK(&w);
            char f[32];
            snprintf(f, sizeof f, "shape.%s", in->keys[k]);
            w.shape[k] = 0;
            EXPECT_BAD(&w, f);
            w.shape[k] = -3;
            EXPECT_BAD(&w, f);
        }
    }
}

Test(workload, extents_at_most_2_pow_34)
{
    ir_workload w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){IR_MAX_ELEMS});
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU});
    EXPECT_OK(&w);
    w.shape[0] = IR_MAX_ELEMS + 1;
    EXPECT_BAD(&w, "shape.N");
    w = wl(IR_OP_DENSE, 3, (int64_t[]){1, 1, INT64_MAX});
    EXPECT_BAD(&w, "shape.K");
}

Test(workload, tensor_element_count)
{
    /* each extent fine, a tensor over 2^34 elements: field "shape" */
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){INT64_C(1) << 18, 4, INT64_C(1) << 18});
    EXPECT_BAD(&w, "shape"); /* A = M x K = 2^36 */
    w = wl(IR_OP_DENSE, 3, (int64_t[]){INT64_C(1) << 18, INT64_C(1) << 18, 1});
    EXPECT_BAD(&w, "shape"); /* the output M x N */
    w = wl(IR_OP_DENSE, 3, (int64_t[]){INT64_C(1) << 17, INT64_C(1) << 17, INT64_C(1) << 17});
    EXPECT_OK(&w); /* every operand exactly 2^34 */
    w = wl(IR_OP_BATCH_MATMUL, 4,
           (int64_t[]){INT64_C(1) << 10, INT64_C(1) << 12, 4, INT64_C(1) << 13});
    EXPECT_BAD(&w, "shape");
    /* the conv output can be the big one: heavy padding of a tiny input */
    w = conv(1, 1, 1, 1, INT64_C(1) << 14, 1, 1);
    w.pad[0] = w.pad[1] = 65536; /* OH = OW = 131073 */
    EXPECT_BAD(&w, "shape");
    /* extents multiplying past int64 must not wrap into a small positive count */
    w = wl(IR_OP_GLOBAL_AVG_POOL2D, 4,
           (int64_t[]){IR_MAX_ELEMS, IR_MAX_ELEMS, IR_MAX_ELEMS, IR_MAX_ELEMS});
    EXPECT_BAD(&w, "shape");
    w = wl(IR_OP_SOFTMAX, 2, (int64_t[]){INT64_C(1) << 17, INT64_C(1) << 18});
    EXPECT_BAD(&w, "shape");
}

Test(workload, work_overflow)
{
    ir_workload w =
        wl(IR_OP_DENSE, 3, (int64_t[]){INT64_C(1) << 30, INT64_C(1) << 30, INT64_C(1) << 30});
    EXPECT_BAD(&w, "shape");
    /* every tensor within 2^34 (input and weight exactly 2^34, output ~2^32), but output x
     * reduction = 2^32 x 2^34: only the work bound can reject it */
    w = conv(1, 4, INT64_C(1) << 16, INT64_C(1) << 16, 1, INT64_C(1) << 16, INT64_C(1) << 16);
    w.pad[0] = w.pad[1] = INT64_C(1) << 15;
    tlm_error e = {0};
    cr_assert_eq(ir_workload_check(&w, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "shape");
    cr_assert_not_null(strstr(e.msg, "2^56"), "expected the work bound, got: %s", e.msg);
    /* 2^24 outputs x 2^34 = 2^58: over the bound yet far from int64 overflow */
    w = conv(1, 4, 4095, 4095, 1, INT64_C(1) << 16, INT64_C(1) << 16);
    w.pad[0] = w.pad[1] = INT64_C(1) << 15; /* OH = OW = 4096 */
    EXPECT_BAD(&w, "shape");
    w.shape[IR_CONV_KW] = INT64_C(1) << 10, w.pad[1] = 0; /* 4096 x 3072 x 2^28 = 3 * 2^50 */
    EXPECT_OK(&w);
}

Test(workload, row_ops_work_is_their_size)
{
    /* A row op does a few operations per element, however long the row: a 2^34-element
     * reduction or softmax is within bounds. */
    ir_op ops[] = {IR_OP_REDUCE_SUM, IR_OP_REDUCE_MAX, IR_OP_SOFTMAX, IR_OP_LAYER_NORM,
                   IR_OP_TRANSPOSE};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        ir_workload w = wl(ops[i], 2, (int64_t[]){1, IR_MAX_ELEMS});
        EXPECT_OK(&w);
        w = wl(ops[i], 2, (int64_t[]){INT64_C(1) << 4, INT64_C(1) << 30});
        EXPECT_OK(&w);
    }
}

Test(workload, conv_output_empty)
{
    ir_workload w = conv(1, 3, 2, 8, 4, 3, 3);
    EXPECT_BAD(&w, "shape.H");
    w = conv(1, 3, 8, 2, 4, 3, 3);
    EXPECT_BAD(&w, "shape.W");
    w = conv(1, 3, 5, 8, 4, 3, 3);
    w.dilation[0] = 3; /* dilated window 7 > 5 */
    EXPECT_BAD(&w, "shape.H");
    w.pad[0] = 1; /* 5 + 2 = 7: one output row */
    EXPECT_OK(&w);
    w = conv(1, 3, 2, 2, 4, 3, 3);
    w.pad[0] = w.pad[1] = 1; /* padding rescues a small input */
    EXPECT_OK(&w);
    w = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 4, 8, 2, 3, 3});
    EXPECT_BAD(&w, "shape.W");
    w = pool(IR_OP_MAX_POOL2D, 1, 8, 2, 2);
    EXPECT_BAD(&w, "shape.H");
    w = pool(IR_OP_AVG_POOL2D, 8, 1, 2, 2);
    EXPECT_BAD(&w, "shape.W");
}

Test(workload, groups)
{
    ir_workload w = conv(1, 6, 8, 8, 4, 3, 3);
    w.groups = 4; /* divides F, not C */
    EXPECT_BAD(&w, "groups");
    w = conv(1, 4, 8, 8, 6, 3, 3);
    w.groups = 4; /* divides C, not F */
    EXPECT_BAD(&w, "groups");
    w.groups = 2;
    EXPECT_OK(&w);
    w.groups = 0;
    EXPECT_BAD(&w, "groups");
    w.groups = -2;
    EXPECT_BAD(&w, "groups");
    w = conv(1, 4, 8, 8, 8, 3, 3);
    w.groups = 8; /* more groups than channels */
    EXPECT_BAD(&w, "groups");
    w.groups = 4; /* = C, F = 2C */
    EXPECT_OK(&w);
    w = conv(1, 32, 8, 8, 32, 3, 3);
    w.groups = 32; /* depthwise-like */
    EXPECT_OK(&w);
    /* per-group channel counts become int32 index coefficients */
    w = conv(1, INT64_C(1) << 32, 1, 1, 2, 1, 1);
    w.groups = 2;
    EXPECT_BAD(&w, "groups");
    w.groups = 1; /* ungrouped: no coefficient, within every size bound */
    EXPECT_OK(&w);
}

Test(workload, stride_dilation_pad)
{
    ir_workload base = conv(1, 4, 16, 16, 4, 3, 3), w;
    const char *names[2][3] = {{"stride[0]", "dilation[0]", "pad[0]"},
                               {"stride[1]", "dilation[1]", "pad[1]"}};
    for (int d = 0; d < 2; d++) {
        w = base, w.stride[d] = 0;
        EXPECT_BAD(&w, names[d][0]);
        w = base, w.stride[d] = -1;
        EXPECT_BAD(&w, names[d][0]);
        w = base, w.stride[d] = 65537;
        EXPECT_BAD(&w, names[d][0]);
        w = base, w.stride[d] = 16;
        EXPECT_OK(&w);
        w = base, w.dilation[d] = 0;
        EXPECT_BAD(&w, names[d][1]);
        w = base, w.dilation[d] = -2;
        EXPECT_BAD(&w, names[d][1]);
        w = base, w.pad[d] = -1;
        EXPECT_BAD(&w, names[d][2]);
        w = base, w.pad[d] = 5; /* a conv may pad more than its window */
        EXPECT_OK(&w);
    }
    /* the same rules for depthwise */
    w = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 4, 8, 8, 3, 3});
    w.dilation[1] = 0;
    EXPECT_BAD(&w, "dilation[1]");
}

Test(workload, pool_rules)
{
    ir_op ops[2] = {IR_OP_MAX_POOL2D, IR_OP_AVG_POOL2D};
    for (int o = 0; o < 2; o++) {
        ir_workload w = pool(ops[o], 16, 16, 3, 4);
        w.pad[0] = 1, w.pad[1] = 2; /* exactly half (rounded down) of 3 and of 4 */
        EXPECT_OK(&w);
        w.pad[0] = 2; /* more than half of 3 */
        EXPECT_BAD(&w, "pad[0]");
        w.pad[0] = 1, w.pad[1] = 3;
        EXPECT_BAD(&w, "pad[1]");
        w.pad[1] = -1;
        EXPECT_BAD(&w, "pad[1]");
        w = pool(ops[o], 16, 16, 3, 3);
        w.stride[1] = -1; /* 0 means the window; negative is an error */
        EXPECT_BAD(&w, "stride[1]");
        /* pools take no dilation (it is not part of their canonical form) */
        w = pool(ops[o], 16, 16, 3, 3);
        w.dilation[0] = 2;
        EXPECT_BAD(&w, "dilation[0]");
        w.dilation[0] = 1, w.dilation[1] = 3;
        EXPECT_BAD(&w, "dilation[1]");
    }
}

Test(workload, eps)
{
    ir_op ops[2] = {IR_OP_LAYER_NORM, IR_OP_RMS_NORM};
    double bad[] = {0.0, -1e-5, NAN, INFINITY, -INFINITY};
    for (int o = 0; o < 2; o++) {
        ir_workload w = wl(ops[o], 2, (int64_t[]){4, 8});
        EXPECT_OK(&w);
        w.eps = 1e-12;
        EXPECT_OK(&w);
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            w.eps = bad[i];
            EXPECT_BAD(&w, "eps");
        }
    }
    /* ops without eps ignore it */
    ir_workload s = wl(IR_OP_SOFTMAX, 2, (int64_t[]){4, 8});
    s.eps = 0;
    EXPECT_OK(&s);
}

Test(workload, epilogue_rules)
{
    ir_workload w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){16});
    EXPECT_BAD(&w, "epilogue"); /* empty: nothing to compute */
    set_epi(&w, 1, (ir_epilogue[]){IR_EPI_ADD});
    EXPECT_OK(&w);
    w = wl(IR_OP_DENSE, 3, (int64_t[]){4, 4, 4});
    set_epi(&w, 3, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_RELU, IR_EPI_ADD});
    w.epilogue[2] = (ir_epilogue)99;
    EXPECT_BAD(&w, "epilogue[2]");
    w.epilogue[2] = (ir_epilogue)-1;
    EXPECT_BAD(&w, "epilogue[2]");
    w.epilogue[2] = IR_EPI_ADD;
    w.n_epilogue = IR_MAX_EPILOGUE + 1;
    EXPECT_BAD(&w, "epilogue");
    w.n_epilogue = -1;
    EXPECT_BAD(&w, "epilogue");
}

Test(workload, enum_fields)
{
    ir_workload w = wl(IR_OP_DENSE, 3, (int64_t[]){4, 4, 4});
    w.op = IR_OP_COUNT;
    EXPECT_BAD(&w, "op");
    w.op = (ir_op)-1;
    EXPECT_BAD(&w, "op");
    w = wl(IR_OP_DENSE, 3, (int64_t[]){4, 4, 4});
    w.dtype = IR_DTYPE_COUNT;
    EXPECT_BAD(&w, "dtype");
    w = conv(1, 4, 8, 8, 4, 3, 3);
    w.layout = (ir_layout)7;
    EXPECT_BAD(&w, "layout");
}

/* ---- canonical form and hash ---- */

static void canon(const ir_workload *w, char *buf)
{
    int n = ir_workload_canonical(w, buf, 1024);
    cr_assert_gt(n, 0);
    cr_assert_eq((size_t)n, strlen(buf));
}

static void hash_of(const ir_workload *w, char out[IR_HASH_HEX])
{
    cr_assert_eq(ir_workload_hash_hex(w, out), 0);
}

Test(workload, canonical_golden)
{
    struct {
        ir_workload w;
        const char *canon, *hash;
    } g[5];
    g[0].w = wl(IR_OP_DENSE, 3, (int64_t[]){1024, 1024, 1024});
    set_epi(&g[0].w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_GELU});
    g[0].canon = "{\"dtype\":\"float32\",\"epilogue\":[\"bias_add\",\"gelu\"],\"op\":\"dense\","
                 "\"shape\":{\"K\":1024,\"M\":1024,\"N\":1024},\"transpose_a\":false,"
                 "\"transpose_b\":false}";
    g[0].hash = "6e6d0f999e9f57dc68873af3b8262258d87da304301d81c14e85efab5bad40c2";
    g[1].w = conv(1, 64, 56, 56, 64, 3, 3);
    g[1].w.pad[0] = g[1].w.pad[1] = 1;
    set_epi(&g[1].w, 1, (ir_epilogue[]){IR_EPI_RELU});
    g[1].canon = "{\"dilation\":[1,1],\"dtype\":\"float32\",\"epilogue\":[\"relu\"],\"groups\":1,"
                 "\"layout\":\"NCHW\",\"op\":\"conv2d\",\"pad\":[1,1],\"shape\":{\"C\":64,"
                 "\"F\":64,\"H\":56,\"KH\":3,\"KW\":3,\"N\":1,\"W\":56},\"stride\":[1,1]}";
    g[1].hash = "d5499f2d7aa316ee7084e7c26cc697b26a8dca2904cf52954c40d670cff6f268";
    g[2].w = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){128, 768});
    g[2].canon = "{\"dtype\":\"float32\",\"epilogue\":[],\"eps\":1.0000000000000001e-05,"
                 "\"op\":\"layer_norm\",\"shape\":{\"C\":768,\"R\":128}}";
    g[2].hash = "64469d5250c5e4e13ebea9273116888de036fe89bb49042b4c135364729747fa";
    g[3].w = wl(IR_OP_MAX_POOL2D, 6, (int64_t[]){1, 64, 112, 112, 3, 3});
    g[3].w.dtype = IR_FLOAT16, g[3].w.layout = IR_NHWC, g[3].w.pad[0] = g[3].w.pad[1] = 1;
    g[3].canon = "{\"dtype\":\"float16\",\"epilogue\":[],\"layout\":\"NHWC\",\"op\":\"max_pool2d\","
                 "\"pad\":[1,1],\"shape\":{\"C\":64,\"H\":112,\"KH\":3,\"KW\":3,\"N\":1,"
                 "\"W\":112},\"stride\":[3,3]}";
    g[3].hash = "1329ce7b92591c5c567c42c97577b2861df5f7178f220f6f006adcf0707f87fc";
    g[4].w = wl(IR_OP_ELEMENTWISE, 1, (int64_t[]){4096});
    ir_epilogue swish;
    cr_assert_eq(ir_epilogue_from_name("swish", &swish), 0);
    set_epi(&g[4].w, 1, &swish); /* spelled "silu" in the canonical form */
    g[4].canon = "{\"dtype\":\"float32\",\"epilogue\":[\"silu\"],\"op\":\"elementwise\","
                 "\"shape\":{\"N\":4096}}";
    g[4].hash = "225280deac5df5311bf38532e79a6cf45f090afa827332b70ceb408e0421117b";
    for (int i = 0; i < 5; i++) {
        char buf[1024], hex[IR_HASH_HEX];
        canon(&g[i].w, buf);
        cr_assert_str_eq(buf, g[i].canon);
        hash_of(&g[i].w, hex);
        cr_assert_str_eq(hex, g[i].hash, "case %d", i);
        uint8_t raw[32];
        cr_assert_eq(ir_workload_hash(&g[i].w, raw), 0);
        for (int b = 0; b < 32; b++) {
            char two[3];
            snprintf(two, sizeof two, "%02x", raw[b]);
            cr_assert_eq(strncmp(two, hex + 2 * b, 2), 0, "hex and raw hash disagree");
        }
    }
}

Test(workload, canonical_is_compact_sorted_json)
{
    /* Judged by jansson: parse, re-serialise compact with sorted keys, compare bytes. */
    ir_workload ws[IR_OP_COUNT];
    for (int op = 0; op < IR_OP_COUNT; op++) {
        ir_workload_init(&ws[op], (ir_op)op);
        for (int k = 0; k < ir_op_get((ir_op)op)->n_keys; k++)
            ws[op].shape[k] = 7 + k;
        set_epi(&ws[op], 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_TANH});
    }
    /* eps values that jansson and printf("%.17g") spell alike (jansson writes 1e-5 for
     * 1e-05); canonical_golden pins the default's spelling */
    ws[IR_OP_LAYER_NORM].eps = 0.001;
    ws[IR_OP_RMS_NORM].eps = 0.25;
    for (int op = 0; op < IR_OP_COUNT; op++) {
        char buf[1024];
        canon(&ws[op], buf);
        json_error_t je;
        json_t *j = json_loads(buf, 0, &je);
        cr_assert_not_null(j, "%s: not JSON: %s", buf, je.text);
        cr_assert(json_is_object(j));
        cr_assert_str_eq(json_string_value(json_object_get(j, "op")), ir_op_get((ir_op)op)->name);
        char *re = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
        cr_assert_str_eq(re, buf);
        /* only the fields the op takes */
        unsigned f = ir_op_get((ir_op)op)->fields;
        cr_assert_eq(json_object_get(j, "transpose_a") != NULL, (f & IR_F_TRANSPOSE) != 0, "%s",
                     buf);
        cr_assert_eq(json_object_get(j, "stride") != NULL, (f & IR_F_STRIDE) != 0, "%s", buf);
        cr_assert_eq(json_object_get(j, "pad") != NULL, (f & IR_F_PAD) != 0, "%s", buf);
        cr_assert_eq(json_object_get(j, "dilation") != NULL, (f & IR_F_DILATION) != 0, "%s", buf);
        cr_assert_eq(json_object_get(j, "groups") != NULL, (f & IR_F_GROUPS) != 0, "%s", buf);
        cr_assert_eq(json_object_get(j, "layout") != NULL, (f & IR_F_LAYOUT) != 0, "%s", buf);
        cr_assert_eq(json_object_get(j, "eps") != NULL, (f & IR_F_EPS) != 0, "%s", buf);
        cr_assert_eq(json_object_size(json_object_get(j, "shape")),
                     (size_t)ir_op_get((ir_op)op)->n_keys);
        free(re);
        json_decref(j);
    }
}

Test(workload, canonical_capacity)
{
    /* the longest canonical form (every field, huge numbers, eight epilogues) fits 1024 */
    ir_workload w = conv(IR_MAX_ELEMS, IR_MAX_ELEMS, IR_MAX_ELEMS, IR_MAX_ELEMS, IR_MAX_ELEMS,
                         IR_MAX_ELEMS, IR_MAX_ELEMS);
    w.stride[0] = w.stride[1] = w.pad[0] = w.pad[1] = w.dilation[0] = w.dilation[1] = 65536;
    w.groups = IR_MAX_ELEMS, w.dtype = IR_BFLOAT16, w.layout = IR_NHWC;
    w.n_epilogue = IR_MAX_EPILOGUE;
    for (int i = 0; i < IR_MAX_EPILOGUE; i++)
        w.epilogue[i] = IR_EPI_BIAS_ADD;
    char buf[1024];
    int n = ir_workload_canonical(&w, buf, sizeof buf);
    cr_assert_gt(n, 0);
    cr_assert_lt(n, 1024);
    /* too small a buffer: an error, and nothing written past it */
    char small[41];
    memset(small, 'x', sizeof small);
    cr_assert_lt(ir_workload_canonical(&w, small, 40), 0);
    cr_assert_eq(small[40], 'x');
    cr_assert_lt(ir_workload_canonical(&w, small, 0), 0);
    /* an unknown op has no canonical form */
    w.op = IR_OP_COUNT;
    cr_assert_lt(ir_workload_canonical(&w, buf, sizeof buf), 0);
}

Test(workload, pool_default_stride_canonicalises_to_the_window)
{
    ir_workload a = pool(IR_OP_AVG_POOL2D, 16, 16, 3, 2), b = a;
    b.stride[0] = 3, b.stride[1] = 2;
    char ca[1024], cb[1024], ha[IR_HASH_HEX], hb[IR_HASH_HEX];
    canon(&a, ca), canon(&b, cb);
    cr_assert_str_eq(ca, cb);
    cr_assert_not_null(strstr(ca, "\"stride\":[3,2]"));
    hash_of(&a, ha), hash_of(&b, hb);
    cr_assert_str_eq(ha, hb);
    b.stride[1] = 1;
    hash_of(&b, hb);
    cr_assert_str_neq(ha, hb);
}

Test(workload, matmul_alias_hashes_as_dense)
{
    ir_op op;
    cr_assert_eq(ir_op_from_name("matmul", &op), 0);
    ir_workload a = wl(op, 3, (int64_t[]){64, 32, 16});
    ir_workload b = wl(IR_OP_DENSE, 3, (int64_t[]){64, 32, 16});
    char ha[IR_HASH_HEX], hb[IR_HASH_HEX], ca[1024];
    hash_of(&a, ha), hash_of(&b, hb);
    cr_assert_str_eq(ha, hb);
    canon(&a, ca);
    cr_assert_not_null(strstr(ca, "\"op\":\"dense\""));
}

Test(workload, defaults_explicit_or_implied_hash_alike)
{
    /* init's defaults and the same values written out by hand; irrelevant fields (not taken
     * by the op) set to anything: one hash */
    ir_workload a = conv(1, 8, 8, 8, 8, 3, 3), b;
    memset(&b, 0, sizeof b);
    b.op = IR_OP_CONV2D;
    memcpy(b.shape, a.shape, sizeof a.shape);
    b.stride[0] = b.stride[1] = 1, b.dilation[0] = b.dilation[1] = 1, b.groups = 1;
    b.layout = IR_NCHW, b.dtype = IR_FLOAT32;
    b.eps = 0.25, b.transpose_a = true; /* a conv takes neither */
    char ha[IR_HASH_HEX], hb[IR_HASH_HEX];
    hash_of(&a, ha), hash_of(&b, hb);
    cr_assert_str_eq(ha, hb);

    ir_workload d = wl(IR_OP_DENSE, 3, (int64_t[]){4, 5, 6}), e = d;
    e.layout = IR_NHWC, e.stride[0] = 3, e.pad[1] = 2, e.groups = 7, e.eps = 0.5;
    e.dilation[0] = 4;
    hash_of(&d, ha), hash_of(&e, hb);
    cr_assert_str_eq(ha, hb);

    ir_workload s = wl(IR_OP_SOFTMAX, 2, (int64_t[]){4, 5}), t = s;
    t.eps = 0.5, t.layout = IR_NHWC, t.transpose_b = true;
    hash_of(&s, ha), hash_of(&t, hb);
    cr_assert_str_eq(ha, hb);
    /* unset trailing shape slots do not matter */
    t.shape[5] = 99;
    hash_of(&t, hb);
    cr_assert_str_eq(ha, hb);
}

#define MAXH 64
typedef struct {
    int n;
    char h[MAXH][IR_HASH_HEX];
    char what[MAXH][48];
} hashset;

/* Adds w's hash; fails if an earlier, different workload had the same hash. */
static void add_distinct(hashset *s, const ir_workload *w, const char *what)
{
    cr_assert_lt(s->n, MAXH);
    tlm_error e = {0};
    cr_assert_eq(ir_workload_check(w, &e), 0, "%s is not valid: %s: %s", what, e.field, e.msg);
    hash_of(w, s->h[s->n]);
    snprintf(s->what[s->n], sizeof s->what[0], "%s", what);
    for (int i = 0; i < s->n; i++)
        cr_assert_str_neq(s->h[i], s->h[s->n], "%s and %s hash alike", s->what[i], what);
    s->n++;
}

Test(workload, every_field_changes_the_hash)
{
    hashset hs = {0};
    char what[48];
    /* conv: every shape key, every attribute, dtype, epilogue */
    ir_workload base = conv(2, 8, 16, 16, 8, 3, 3), w;
    add_distinct(&hs, &base, "conv base");
    for (int k = 0; k < 7; k++) {
        w = base, w.shape[k] += 1;
        snprintf(what, sizeof what, "conv shape.%s+1", ir_op_get(IR_OP_CONV2D)->keys[k]);
        add_distinct(&hs, &w, what);
    }
    for (int d = 0; d < 2; d++) {
        w = base, w.stride[d] = 2;
        add_distinct(&hs, &w, d ? "stride[1]" : "stride[0]");
        w = base, w.pad[d] = 1;
        add_distinct(&hs, &w, d ? "pad[1]" : "pad[0]");
        w = base, w.dilation[d] = 2;
        add_distinct(&hs, &w, d ? "dilation[1]" : "dilation[0]");
    }
    w = base, w.groups = 2;
    add_distinct(&hs, &w, "groups 2");
    w = base, w.groups = 8;
    add_distinct(&hs, &w, "groups 8");
    w = base, w.layout = IR_NHWC;
    add_distinct(&hs, &w, "NHWC");
    w = base, w.dtype = IR_FLOAT16;
    add_distinct(&hs, &w, "float16");
    w = base, w.dtype = IR_BFLOAT16;
    add_distinct(&hs, &w, "bfloat16");
    w = base, set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU});
    add_distinct(&hs, &w, "[relu]");
    w = base, set_epi(&w, 1, (ir_epilogue[]){IR_EPI_RELU6});
    add_distinct(&hs, &w, "[relu6]");
    w = base, set_epi(&w, 2, (ir_epilogue[]){IR_EPI_BIAS_ADD, IR_EPI_RELU});
    add_distinct(&hs, &w, "[bias_add, relu]");
    w = base, set_epi(&w, 2, (ir_epilogue[]){IR_EPI_RELU, IR_EPI_BIAS_ADD});
    add_distinct(&hs, &w, "[relu, bias_add]");
    w = base, set_epi(&w, 2, (ir_epilogue[]){IR_EPI_RELU, IR_EPI_RELU});
    add_distinct(&hs, &w, "[relu, relu]");
    /* dense: transposes */
    ir_workload d = wl(IR_OP_DENSE, 3, (int64_t[]){16, 16, 16});
    add_distinct(&hs, &d, "dense");
    w = d, w.transpose_a = true;
    add_distinct(&hs, &w, "dense ta");
    w = d, w.transpose_b = true;
    add_distinct(&hs, &w, "dense tb");
    w = d, w.transpose_a = w.transpose_b = true;
    add_distinct(&hs, &w, "dense ta tb");
    w = wl(IR_OP_BATCH_MATMUL, 4, (int64_t[]){1, 16, 16, 16});
    add_distinct(&hs, &w, "batch_matmul B=1");
    /* same shape keys, different ops */
    for (ir_op op = IR_OP_SOFTMAX; op <= IR_OP_TRANSPOSE; op++) {
        if (op == IR_OP_ELEMENTWISE) continue;
        w = wl(op, 2, (int64_t[]){16, 16});
        add_distinct(&hs, &w, ir_op_get(op)->name);
    }
    w = wl(IR_OP_LAYER_NORM, 2, (int64_t[]){16, 16}), w.eps = 1e-6;
    add_distinct(&hs, &w, "layer_norm eps 1e-6");
    w.eps = 1e-5 * (1 + 1e-15); /* the canonical form keeps every bit of eps */
    add_distinct(&hs, &w, "layer_norm eps 1e-5(1+1e-15)");
    w = wl(IR_OP_RMS_NORM, 2, (int64_t[]){16, 16}), w.eps = 1e-6;
    add_distinct(&hs, &w, "rms_norm eps 1e-6");
    /* windows */
    ir_workload p = pool(IR_OP_MAX_POOL2D, 16, 16, 2, 2);
    add_distinct(&hs, &p, "max_pool");
    w = p, w.op = IR_OP_AVG_POOL2D;
    add_distinct(&hs, &w, "avg_pool");
    w = p, w.stride[0] = 1;
    add_distinct(&hs, &w, "max_pool stride[0] 1");
    w = p, w.pad[1] = 1;
    add_distinct(&hs, &w, "max_pool pad[1] 1");
    w = p, w.layout = IR_NHWC;
    add_distinct(&hs, &w, "max_pool NHWC");
    w = wl(IR_OP_DEPTHWISE_CONV2D, 6, (int64_t[]){1, 4, 16, 16, 2, 2});
    add_distinct(&hs, &w, "depthwise same keys as the pool");
    w.stride[0] = w.stride[1] = 2;
    add_distinct(&hs, &w, "depthwise stride 2");
    w = wl(IR_OP_GLOBAL_AVG_POOL2D, 4, (int64_t[]){1, 4, 16, 16});
    add_distinct(&hs, &w, "global_avg_pool");
    w.layout = IR_NHWC;
    add_distinct(&hs, &w, "global_avg_pool NHWC");
}

Test(workload, hash_is_deterministic_and_hex)
{
    ir_workload w = conv(1, 3, 32, 32, 16, 3, 3);
    char a[IR_HASH_HEX], b[IR_HASH_HEX];
    hash_of(&w, a);
    hash_of(&w, b);
    cr_assert_str_eq(a, b);
    cr_assert_eq(strlen(a), 64);
    for (int i = 0; i < 64; i++)
        cr_assert(strchr("0123456789abcdef", a[i]), "%s", a);
}
