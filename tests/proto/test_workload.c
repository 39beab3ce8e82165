/* test_workload.c — proto/workload: rejection table, round trips, hash stability. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "proto/workload.h"

#define DENSE_SHAPE "\"shape\":{\"M\":64,\"N\":32,\"K\":16}"
#define CONV_SHAPE "\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"F\":16,\"KH\":3,\"KW\":3}"
#define POOL_SHAPE "\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"KH\":3,\"KW\":3}"
#define DENSE(extra) "{\"op\":\"dense\"," DENSE_SHAPE extra "}"
#define CONV(extra) "{\"op\":\"conv2d\"," CONV_SHAPE extra "}"
#define POOL(extra) "{\"op\":\"max_pool2d\"," POOL_SHAPE extra "}"

/* Expected error class: J = not JSON, I = invalid field, U = unsupported name. */
typedef struct {
    const char *json;
    const char *field;
    char code;
    const char *msg_has; /* a substring the message must contain, or NULL */
} bad_case;

static const bad_case bad[] = {
    /* the value as a whole */
    {"[]", "", 'I', "must be a JSON object"},
    {"[{\"op\":\"dense\"}]", "", 'I', "got an array"},
    {"\"dense\"", "", 'I', "got the string \"dense\""},
    {"42", "", 'I', "got 42"},
    {"null", "", 'I', "got null"},
    {"", "", 'J', "line 1"},
    {"{\"op\":\"dense\",", "", 'J', "line 1"},
    {"{\"op\":\"dense\",\n \"shape\":{\"M\":1,,}}", "", 'J', "line 2"},
    {DENSE(",\"dtype\":\"float32\",\"dtype\":\"float16\""), "", 'J', "duplicate"},
    {DENSE("} trailing"), "", 'J', NULL},
    {"{\"op\":\"dense\",\"shape\":{\"M\":1e400,\"N\":1,\"K\":1}}", "", 'J', NULL},
    /* op */
    {"{}", "op", 'I', "required"},
    {"{" DENSE_SHAPE "}", "op", 'I', "batch_matmul"},
    {"{\"op\":\"densee\"," DENSE_SHAPE "}", "op", 'U', "allowed: dense, matmul"},
    {"{\"op\":\"Dense\"," DENSE_SHAPE "}", "op", 'U', "\"Dense\""},
    {"{\"op\":3," DENSE_SHAPE "}", "op", 'I', "must be a string"},
    {"{\"op\":null," DENSE_SHAPE "}", "op", 'I', "got null"},
    {"{\"op\":[\"dense\"]," DENSE_SHAPE "}", "op", 'I', "got an array"},
    /* shape: presence, unknown keys */
    {"{\"op\":\"dense\"}", "shape", 'I', "M, N, K"},
    {"{\"op\":\"dense\",\"shape\":[64,32,16]}", "shape", 'I', "must be an object"},
    {"{\"op\":\"dense\",\"shape\":null}", "shape", 'I', "got null"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32}}", "shape.K", 'I', "required"},
    {"{\"op\":\"dense\",\"shape\":{}}", "shape.M", 'I', "required"},
    {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"F\":16,\"KH\":3}}",
     "shape.KW", 'I', "required"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16,\"X\":1}}", "shape.X", 'I',
     "M, N, K"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16,\"F\":1}}", "shape.F", 'I', NULL},
    {"{\"op\":\"dense\",\"shape\":{\"m\":64,\"N\":32,\"K\":16}}", "shape.m", 'I', NULL},
    {"{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":7,\"W\":7,\"KH\":7}}",
     "shape.KH", 'I', NULL},
    /* shape: values */
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":0}}", "shape.K", 'I', "positive"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":-3}}", "shape.K", 'I', "(got -3)"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":3.5}}", "shape.K", 'I', "(got 3.5)"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16.0}}", "shape.K", 'I', "16.0"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":\"16\"}}", "shape.K", 'I', "string"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":true}}", "shape.K", 'I', "true"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":null}}", "shape.K", 'I', "null"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":[16]}}", "shape.K", 'I', "array"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":99999999999999999999}}", "shape.K", 'I',
     "64-bit"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":-99999999999999999999,\"K\":1}}", "shape.N", 'I',
     "64-bit"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":9223372036854775807}}", "shape.K", 'I',
     NULL},
    {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":34359738368}}", "shape.K", 'I', NULL},
    /* tensors over 2^34 elements; work that would overflow the FLOP counters */
    {"{\"op\":\"dense\",\"shape\":{\"M\":1048576,\"N\":32768,\"K\":1}}", "shape", 'I', "2^34"},
    {"{\"op\":\"dense\",\"shape\":{\"M\":4194304,\"N\":4194304,\"K\":4194304}}", "shape", 'I',
     NULL},
    {"{\"op\":\"elementwise\",\"shape\":{\"N\":17179869185},\"epilogue\":[\"relu\"]}", "shape.N",
     'I', NULL},
    {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":1,\"H\":131072,\"W\":131072,\"F\":1,"
     "\"KH\":65536,\"KW\":65536}}",
     "shape", 'I', NULL},
    {"{\"op\":\"batch_matmul\",\"shape\":{\"B\":65536,\"M\":1024,\"N\":1024,\"K\":1024}}", "shape",
     'I', "2^34"},
    /* conv geometry */
    {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":2,\"W\":14,\"F\":16,\"KH\":3,\"KW\":3}}",
     "shape.H", 'I', "empty"},
    {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":5,\"F\":16,\"KH\":3,\"KW\":3},"
     "\"dilation\":[1,3]}",
     "shape.W", 'I', "empty"},
    {CONV(",\"groups\":3"), "groups", 'I', "divide C"},
    {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"F\":6,\"KH\":3,\"KW\":3},"
     "\"groups\":4}",
     "groups", 'I', "divide F"},
    {CONV(",\"groups\":0"), "groups", 'I', NULL},
    {CONV(",\"groups\":-2"), "groups", 'I', NULL},
    {CONV(",\"groups\":2.0"), "groups", 'I', "2.0"},
    {CONV(",\"groups\":\"1\""), "groups", 'I', NULL},
    /* stride / pad / dilation */
    {CONV(",\"stride\":[1]"), "stride", 'I', "1 entries"},
    {CONV(",\"stride\":[1,1,1]"), "stride", 'I', "3 entries"},
    {CONV(",\"stride\":2"), "stride", 'I', "[h, w]"},
    {CONV(",\"stride\":{\"h\":1,\"w\":1}"), "stride", 'I', "object"},
    {CONV(",\"stride\":[1,0]"), "stride[1]", 'I', NULL},
    {CONV(",\"stride\":[1,\"2\"]"), "stride[1]", 'I', "string"},
    {CONV(",\"stride\":[1.5,1]"), "stride[0]", 'I', "1.5"},
    {CONV(",\"dilation\":[0,1]"), "dilation[0]", 'I', NULL},
    {CONV(",\"dilation\":[1,null]"), "dilation[1]", 'I', NULL},
    {CONV(",\"pad\":[-1,0]"), "pad[0]", 'I', NULL},
    {CONV(",\"pad\":[0,1.5]"), "pad[1]", 'I', NULL},
    {CONV(",\"pad\":[1,1,1,1]"), "pad", 'I', "4 entries"},
    {CONV(",\"pad\":[0,99999999999999999999]"), "pad[1]", 'I', "64-bit"},
    {POOL(",\"pad\":[2,0]"), "pad[0]", 'I', "half"},
    {POOL(",\"pad\":[0,3]"), "pad[1]", 'I', NULL},
    {POOL(",\"stride\":[0,1]"), "stride[0]", 'I', NULL},
    /* fields that the op does not take, and unknown fields */
    {DENSE(",\"groups\":1"), "groups", 'I', "not a field of op dense"},
    {DENSE(",\"stride\":[1,1]"), "stride", 'I', "transpose_a"},
    {DENSE(",\"layout\":\"NCHW\""), "layout", 'I', NULL},
    {CONV(",\"eps\":1e-5"), "eps", 'I', "not a field of op conv2d"},
    {CONV(",\"transpose_a\":false"), "transpose_a", 'I', NULL},
    {"{\"op\":\"softmax\",\"shape\":{\"R\":4,\"C\":8},\"eps\":1e-5}", "eps", 'I', NULL},
    {"{\"op\":\"softmax\",\"shape\":{\"R\":4,\"C\":8},\"layout\":\"NCHW\"}", "layout", 'I', NULL},
    {"{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":7,\"W\":7},\"pad\":[0,0]}",
     "pad", 'I', NULL},
    {POOL(",\"dilation\":[1,1]"), "dilation", 'I', NULL},
    {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"KH\":3,\"KW\":3},"
     "\"groups\":8}",
     "groups", 'I', NULL},
    {DENSE(",\"foo\":1"), "foo", 'I', "unknown field"},
    {DENSE(",\"Dtype\":\"float32\""), "Dtype", 'I', NULL},
    {DENSE(",\"shapes\":{}"), "shapes", 'I', NULL},
    /* dtype */
    {DENSE(",\"dtype\":\"int8\""), "dtype", 'U', "float32, float16, bfloat16"},
    {DENSE(",\"dtype\":\"fp32\""), "dtype", 'U', NULL},
    {DENSE(",\"dtype\":32"), "dtype", 'I', "must be a string"},
    {DENSE(",\"dtype\":null"), "dtype", 'I', NULL},
    /* epilogue */
    {DENSE(",\"epilogue\":[\"relu\",\"foo\"]"), "epilogue[1]", 'U', "gelu"},
    {DENSE(",\"epilogue\":[\"bias_add\",\"relu\",\"Relu\"]"), "epilogue[2]", 'U', NULL},
    {DENSE(",\"epilogue\":\"relu\""), "epilogue", 'I', "must be an array"},
    {DENSE(",\"epilogue\":[1]"), "epilogue[0]", 'I', "must be a string"},
    {DENSE(",\"epilogue\":[[\"relu\"]]"), "epilogue[0]", 'I', NULL},
    {DENSE(",\"epilogue\":null"), "epilogue", 'I', NULL},
    {DENSE(",\"epilogue\":[\"relu\",\"relu\",\"relu\",\"relu\",\"relu\",\"relu\",\"relu\","
           "\"relu\",\"relu\"]"),
     "epilogue", 'I', "at most 8"},
    {"{\"op\":\"elementwise\",\"shape\":{\"N\":1024}}", "epilogue", 'I', NULL},
    {"{\"op\":\"elementwise\",\"shape\":{\"N\":1024},\"epilogue\":[]}", "epilogue", 'I', NULL},
    /* layout */
    {CONV(",\"layout\":\"NWHC\""), "layout", 'U', "NCHW, NHWC"},
    {CONV(",\"layout\":\"nchw\""), "layout", 'U', NULL},
    {CONV(",\"layout\":1"), "layout", 'I', NULL},
    /* booleans */
    {DENSE(",\"transpose_a\":\"yes\""), "transpose_a", 'I', "true or false"},
    {DENSE(",\"transpose_b\":1"), "transpose_b", 'I', "(got 1)"},
    {DENSE(",\"transpose_b\":null"), "transpose_b", 'I', NULL},
    /* eps */
    {"{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":8},\"eps\":-1}", "eps", 'I', NULL},
    {"{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":8},\"eps\":0}", "eps", 'I', NULL},
    {"{\"op\":\"rms_norm\",\"shape\":{\"R\":4,\"C\":8},\"eps\":\"small\"}", "eps", 'I', NULL},
    {"{\"op\":\"rms_norm\",\"shape\":{\"R\":4,\"C\":8},\"eps\":2}", "eps", 'I', NULL},
};

static int expected_code(char c)
{
    return c == 'J' ? PROTO_EJSON : c == 'U' ? TLM_EUNSUPPORTED : TLM_EINVAL;
}

Test(workload, bad_inputs_name_their_field)
{
    int n = (int)(sizeof bad / sizeof bad[0]);
    cr_assert_geq(n, 35);
    for (int i = 0; i < n; i++) {
        ir_workload w;
        tlm_error err;
        tlm_err_clear(&err);
        int rc = proto_workload_from_string(bad[i].json, strlen(bad[i].json), &w, &err);
        cr_expect_neq(rc, 0, "case %d accepted: %s", i, bad[i].json);
        if (!rc) continue;
        cr_expect_eq(rc, err.code, "case %d: return %d but err.code %d", i, rc, err.code);
        cr_expect_str_eq(err.field, bad[i].field, "case %d (%s): field \"%s\" (%s)", i, bad[i].json,
                         err.field, err.msg);
        cr_expect_eq(rc, expected_code(bad[i].code), "case %d (%s): code %d (%s)", i, bad[i].json,
                     rc, err.msg);
        cr_expect_neq(err.msg[0], 0, "case %d: empty message", i);
        if (bad[i].msg_has)
            cr_expect(strstr(err.msg, bad[i].msg_has) != NULL,
                      "case %d (%s): message \"%s\" lacks \"%s\"", i, bad[i].json, err.msg,
                      bad[i].msg_has);
    }
}

/* The table must be testing the intended field, not some earlier mistake in the text: every
 * case minus its defect is valid. Spot-check the pattern the table relies on. */
Test(workload, table_bases_are_valid)
{
    const char *ok[] = {DENSE(""),
                        CONV(""),
                        POOL(""),
                        CONV(",\"groups\":2"),
                        "{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":8},\"eps\":1}",
                        POOL(",\"pad\":[1,1]")};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ir_workload w;
        tlm_error err;
        tlm_err_clear(&err);
        cr_expect_eq(proto_workload_from_string(ok[i], strlen(ok[i]), &w, &err), 0, "%s: %s: %s",
                     ok[i], err.field, err.msg);
    }
}

Test(workload, unknown_op_lists_every_op)
{
    ir_workload w;
    tlm_error err;
    const char *t = "{\"op\":\"nope\"}";
    cr_assert_eq(proto_workload_from_string(t, strlen(t), &w, &err), TLM_EUNSUPPORTED);
    for (int op = 0; op < IR_OP_COUNT; op++)
        cr_expect(strstr(err.msg, ir_op_get((ir_op)op)->name), "%s missing from: %s",
                  ir_op_get((ir_op)op)->name, err.msg);
}

Test(workload, decode_rejects_non_objects_and_null)
{
    ir_workload w;
    tlm_error err;
    cr_expect_eq(proto_workload_decode(NULL, &w, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "");
    json_t *arr = json_array();
    cr_expect_eq(proto_workload_decode(arr, &w, &err), TLM_EINVAL);
    json_decref(arr);
    /* A string with an embedded NUL must not match "dense". */
    json_t *j = json_pack("{s:s%, s:{s:i, s:i, s:i}}", "op", "dense\0x", (size_t)7, "shape", "M", 1,
                          "N", 1, "K", 1);
    cr_assert_not_null(j);
    cr_expect_eq(proto_workload_decode(j, &w, &err), TLM_EUNSUPPORTED);
    cr_expect_str_eq(err.field, "op");
    json_decref(j);
}

Test(workload, null_text_is_a_syntax_error)
{
    ir_workload w;
    tlm_error err;
    cr_expect_eq(proto_workload_from_string(NULL, 0, &w, &err), PROTO_EJSON);
    /* len is honoured: the text after it is not read. */
    const char *t = DENSE("") "garbage";
    cr_expect_eq(proto_workload_from_string(t, strlen(DENSE("")), &w, &err), 0, "%s", err.msg);
}

/* ---- round trips ---- */

static void expect_same(const ir_workload *a, const ir_workload *b, const char *what)
{
    cr_expect_eq(a->op, b->op, "%s: op", what);
    cr_expect_eq(a->dtype, b->dtype, "%s: dtype", what);
    for (int i = 0; i < IR_MAX_KEYS; i++)
        cr_expect_eq(a->shape[i], b->shape[i], "%s: shape[%d]", what, i);
    cr_expect_eq(a->transpose_a, b->transpose_a, "%s: transpose_a", what);
    cr_expect_eq(a->transpose_b, b->transpose_b, "%s: transpose_b", what);
    for (int d = 0; d < 2; d++) {
        cr_expect_eq(a->stride[d], b->stride[d], "%s: stride[%d]", what, d);
        cr_expect_eq(a->pad[d], b->pad[d], "%s: pad[%d]", what, d);
        cr_expect_eq(a->dilation[d], b->dilation[d], "%s: dilation[%d]", what, d);
    }
    cr_expect_eq(a->groups, b->groups, "%s: groups", what);
    cr_expect_eq(a->layout, b->layout, "%s: layout", what);
    cr_expect(a->eps == b->eps, "%s: eps %.17g vs %.17g", what, a->eps, b->eps);
    cr_expect_eq(a->n_epilogue, b->n_epilogue, "%s: n_epilogue", what);
    for (int i = 0; i < a->n_epilogue && i < IR_MAX_EPILOGUE; i++)
        cr_expect_eq(a->epilogue[i], b->epilogue[i], "%s: epilogue[%d]", what, i);
}

static void decode_ok(const char *text, ir_workload *w)
{
    tlm_error err;
    tlm_err_clear(&err);
    int rc = proto_workload_from_string(text, strlen(text), w, &err);
    cr_assert_eq(rc, 0, "%s: %s: %s", text, err.field, err.msg);
}

static void hash_of(const ir_workload *w, char hex[IR_HASH_HEX])
{
    cr_assert_eq(ir_workload_hash_hex(w, hex), 0);
}

/* One workload per op family, each with non-default attributes. */
static const char *families[] = {
    "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16},\"transpose_a\":true,"
    "\"transpose_b\":true,\"dtype\":\"float16\",\"epilogue\":[\"bias_add\",\"gelu\"]}",
    "{\"op\":\"matmul\",\"shape\":{\"M\":8,\"N\":4,\"K\":2},\"transpose_b\":true,"
    "\"epilogue\":[\"swish\"]}",
    "{\"op\":\"batch_matmul\",\"shape\":{\"B\":3,\"M\":8,\"N\":4,\"K\":5},\"transpose_a\":true,"
    "\"dtype\":\"bfloat16\",\"epilogue\":[\"add\",\"tanh\"]}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":8,\"H\":12,\"W\":10,\"F\":16,\"KH\":3,\"KW\":5},"
    "\"stride\":[2,1],\"pad\":[1,2],\"dilation\":[2,1],\"groups\":4,\"layout\":\"NHWC\","
    "\"epilogue\":[\"bias_add\",\"relu6\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":32,\"H\":15,\"W\":15,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"dilation\":[1,2],\"layout\":\"NHWC\",\"dtype\":\"float16\","
    "\"epilogue\":[\"bias_add\",\"relu6\"]}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":13,\"W\":13,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,1],\"pad\":[1,1],\"layout\":\"NHWC\"}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":13,\"W\":13,\"KH\":3,\"KW\":2}}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":2,\"C\":4,\"H\":9,\"W\":7,\"KH\":2,\"KW\":3},"
    "\"stride\":[1,1],\"pad\":[1,0],\"epilogue\":[\"mul\"]}",
    "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":2,\"C\":16,\"H\":7,\"W\":7},\"layout\":"
    "\"NHWC\","
    "\"epilogue\":[\"sigmoid\"]}",
    "{\"op\":\"softmax\",\"shape\":{\"R\":6,\"C\":10},\"dtype\":\"bfloat16\"}",
    "{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":768},\"eps\":1e-6,"
    "\"epilogue\":[\"gelu\"]}",
    "{\"op\":\"rms_norm\",\"shape\":{\"R\":4,\"C\":4096},\"eps\":0.30000000000000004}",
    "{\"op\":\"reduce_sum\",\"shape\":{\"R\":4,\"C\":7},\"epilogue\":[\"relu\"]}",
    "{\"op\":\"reduce_mean\",\"shape\":{\"R\":5,\"C\":7},\"dtype\":\"float16\"}",
    "{\"op\":\"reduce_max\",\"shape\":{\"R\":3,\"C\":9},\"epilogue\":[\"silu\",\"mul\"]}",
    "{\"op\":\"elementwise\",\"shape\":{\"N\":1000},\"epilogue\":[\"relu\",\"mul\",\"sigmoid\","
    "\"add\",\"bias_add\",\"tanh\",\"gelu\",\"relu6\"]}",
    "{\"op\":\"transpose\",\"shape\":{\"R\":3,\"C\":5},\"dtype\":\"float16\","
    "\"epilogue\":[\"relu\"]}",
};

Test(workload, round_trip_every_family)
{
    bool seen[IR_OP_COUNT] = {false};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        ir_workload a, b, c;
        decode_ok(families[i], &a);
        seen[a.op] = true;

        json_t *j = proto_workload_encode(&a);
        cr_assert_not_null(j, "%s", families[i]);
        /* encode spells every field the op takes */
        unsigned f = ir_op_get(a.op)->fields;
        cr_expect_eq(json_object_get(j, "groups") != NULL, (f & IR_F_GROUPS) != 0, "%s",
                     families[i]);
        cr_expect_eq(json_object_get(j, "stride") != NULL, (f & IR_F_STRIDE) != 0);
        cr_expect_eq(json_object_get(j, "eps") != NULL, (f & IR_F_EPS) != 0);
        cr_expect_eq(json_object_get(j, "transpose_a") != NULL, (f & IR_F_TRANSPOSE) != 0);
        cr_expect_not_null(json_object_get(j, "dtype"));
        cr_expect_not_null(json_object_get(j, "epilogue"));
        tlm_error err;
        tlm_err_clear(&err);
        cr_assert_eq(proto_workload_decode(j, &b, &err), 0, "%s: %s: %s", families[i], err.field,
                     err.msg);
        json_decref(j);
        expect_same(&a, &b, families[i]);

        char *s = proto_workload_to_string(&a);
        cr_assert_not_null(s);
        decode_ok(s, &c);
        expect_same(&a, &c, s);
        free(s);

        char ca[1024], cb[1024], ha[IR_HASH_HEX], hb[IR_HASH_HEX];
        cr_assert_gt(ir_workload_canonical(&a, ca, sizeof ca), 0);
        cr_assert_gt(ir_workload_canonical(&b, cb, sizeof cb), 0);
        cr_expect_str_eq(ca, cb);
        hash_of(&a, ha);
        hash_of(&b, hb);
        cr_expect_str_eq(ha, hb);
        /* the canonical form is itself a valid workload with the same hash */
        ir_workload d;
        decode_ok(ca, &d);
        expect_same(&a, &d, ca);
    }
    for (int op = 0; op < IR_OP_COUNT; op++)
        cr_expect(seen[op], "no round trip for %s", ir_op_get((ir_op)op)->name);
}

Test(workload, decoded_attributes_are_the_non_defaults)
{
    /* Guards the round-trip test against a decoder that drops fields on both sides. */
    ir_workload w;
    decode_ok(families[3], &w);
    cr_expect_eq(w.op, IR_OP_CONV2D);
    cr_expect_eq(w.shape[IR_CONV_KW], 5);
    cr_expect_eq(w.stride[0], 2);
    cr_expect_eq(w.stride[1], 1);
    cr_expect_eq(w.pad[1], 2);
    cr_expect_eq(w.dilation[0], 2);
    cr_expect_eq(w.groups, 4);
    cr_expect_eq(w.layout, IR_NHWC);
    cr_expect_eq(w.n_epilogue, 2);
    cr_expect_eq(w.epilogue[0], IR_EPI_BIAS_ADD);
    cr_expect_eq(w.epilogue[1], IR_EPI_RELU6);
    decode_ok(families[0], &w);
    cr_expect(w.transpose_a && w.transpose_b);
    cr_expect_eq(w.dtype, IR_FLOAT16);
    decode_ok(families[1], &w);
    cr_expect_eq(w.op, IR_OP_DENSE);
    cr_expect_eq(w.epilogue[0], IR_EPI_SILU);
    decode_ok(families[6], &w); /* pool stride omitted = the window */
    cr_expect_eq(w.stride[0], 3);
    cr_expect_eq(w.stride[1], 2);
    decode_ok(families[11], &w);
    cr_expect(w.eps == 0.30000000000000004);
}

/* ---- hash stability and sensitivity ---- */

static void expect_all_hash_equal(const char *const *texts, int n)
{
    char h0[IR_HASH_HEX], h[IR_HASH_HEX];
    ir_workload w;
    decode_ok(texts[0], &w);
    hash_of(&w, h0);
    for (int i = 1; i < n; i++) {
        decode_ok(texts[i], &w);
        hash_of(&w, h);
        cr_expect_str_eq(h, h0, "%s hashes differently from %s", texts[i], texts[0]);
    }
}

Test(workload, same_workload_spelled_differently_hashes_equal)
{
    const char *dense[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16},\"epilogue\":[\"silu\"]}",
        "{\"epilogue\":[\"silu\"],\"transpose_b\":false,\"shape\":{\"K\":16,\"N\":32,\"M\":64},"
        "\"dtype\":\"float32\",\"transpose_a\":false,\"op\":\"dense\"}",
        "{\"op\":\"matmul\",\"shape\":{\"N\":32,\"K\":16,\"M\":64},\"epilogue\":[\"swish\"]}",
        " {\n \"op\" : \"dense\" ,\n \"shape\" : { \"M\" : 64, \"N\" : 32, \"K\" : 16 },"
        " \"epilogue\" : [ \"silu\" ] } ",
    };
    expect_all_hash_equal(dense, 4);
    const char *conv[] = {
        "{\"op\":\"conv2d\"," CONV_SHAPE "}",
        "{\"layout\":\"NCHW\",\"groups\":1,\"dilation\":[1,1],\"pad\":[0,0],\"stride\":[1,1],"
        "\"dtype\":\"float32\",\"epilogue\":[]," CONV_SHAPE ",\"op\":\"conv2d\"}",
        "{\"shape\":{\"KW\":3,\"KH\":3,\"F\":16,\"W\":14,\"H\":14,\"C\":8,\"N\":1},"
        "\"op\":\"conv2d\",\"stride\":[1,1]}",
    };
    expect_all_hash_equal(conv, 3);
    const char *pool[] = {
        "{\"op\":\"max_pool2d\"," POOL_SHAPE "}",
        "{\"op\":\"max_pool2d\"," POOL_SHAPE ",\"stride\":[3,3],\"pad\":[0,0]}",
        "{\"layout\":\"NCHW\",\"op\":\"max_pool2d\"," POOL_SHAPE ",\"stride\":[3,3]}",
    };
    expect_all_hash_equal(pool, 3);
    const char *norm[] = {
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":8}}",
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":8},\"eps\":1e-5}",
        "{\"op\":\"layer_norm\",\"shape\":{\"C\":8,\"R\":4},\"eps\":0.00001,\"epilogue\":[]}",
    };
    expect_all_hash_equal(norm, 3);
}

/* A variant of a base workload: one member (key, or key.sub, or key[idx]) replaced. */
typedef struct {
    const char *key;
    const char *sub; /* shape key, or NULL */
    int idx;         /* array index, or -1 */
    const char *value;
} variant;

static void apply_variant(json_t *base, const variant *v)
{
    json_error_t je;
    json_t *val = json_loads(v->value, JSON_DECODE_ANY, &je);
    cr_assert_not_null(val, "%s", v->value);
    json_t *target = base;
    if (v->sub) {
        cr_assert_eq(json_object_set_new(json_object_get(base, v->key), v->sub, val), 0);
    } else if (v->idx >= 0) {
        target = json_object_get(base, v->key);
        cr_assert_eq(json_array_set_new(target, (size_t)v->idx, val), 0);
    } else {
        cr_assert_eq(json_object_set_new(base, v->key, val), 0);
    }
}

static void expect_variants_distinct(const char *base_text, const variant *vs, int n)
{
    char(*hashes)[IR_HASH_HEX] = calloc((size_t)n + 1, IR_HASH_HEX);
    cr_assert_not_null(hashes);
    ir_workload w;
    decode_ok(base_text, &w);
    hash_of(&w, hashes[0]);
    for (int i = 0; i < n; i++) {
        json_error_t je;
        json_t *j = json_loads(base_text, 0, &je);
        cr_assert_not_null(j);
        apply_variant(j, &vs[i]);
        tlm_error err;
        tlm_err_clear(&err);
        int rc = proto_workload_decode(j, &w, &err);
        cr_assert_eq(rc, 0, "variant %s%s%s=%s invalid: %s: %s", vs[i].key, vs[i].sub ? "." : "",
                     vs[i].sub ? vs[i].sub : "", vs[i].value, err.field, err.msg);
        json_decref(j);
        hash_of(&w, hashes[i + 1]);
        for (int k = 0; k <= i; k++)
            cr_expect_str_neq(hashes[i + 1], hashes[k], "variant %d (%s %s %s) collides with %d", i,
                              vs[i].key, vs[i].sub ? vs[i].sub : "", vs[i].value, k - 1);
    }
    free(hashes);
}

Test(workload, every_single_field_change_changes_the_hash)
{
    const char *conv =
        "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":8,\"H\":12,\"W\":10,\"F\":16,\"KH\":3,"
        "\"KW\":3},\"stride\":[2,1],\"pad\":[1,1],\"dilation\":[1,2],\"groups\":2,"
        "\"layout\":\"NCHW\",\"dtype\":\"float32\",\"epilogue\":[\"bias_add\",\"relu\"]}";
    const variant cv[] = {
        {"shape", "N", -1, "3"},
        {"shape", "C", -1, "10"},
        {"shape", "H", -1, "13"},
        {"shape", "W", -1, "11"},
        {"shape", "F", -1, "18"},
        {"shape", "KH", -1, "2"},
        {"shape", "KW", -1, "4"},
        {"stride", NULL, 0, "1"},
        {"stride", NULL, 1, "2"},
        {"pad", NULL, 0, "0"},
        {"pad", NULL, 1, "2"},
        {"dilation", NULL, 0, "2"},
        {"dilation", NULL, 1, "1"},
        {"groups", NULL, -1, "1"},
        {"groups", NULL, -1, "4"},
        {"layout", NULL, -1, "\"NHWC\""},
        {"dtype", NULL, -1, "\"float16\""},
        {"dtype", NULL, -1, "\"bfloat16\""},
        {"epilogue", NULL, -1, "[\"relu\",\"bias_add\"]"},
        {"epilogue", NULL, 1, "\"gelu\""},
        {"epilogue", NULL, 0, "\"add\""},
        {"epilogue", NULL, -1, "[\"bias_add\"]"},
        {"epilogue", NULL, -1, "[\"bias_add\",\"relu\",\"relu\"]"},
        {"epilogue", NULL, -1, "[]"},
    };
    expect_variants_distinct(conv, cv, (int)(sizeof cv / sizeof cv[0]));

    const char *dense = "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16}}";
    const variant dv[] = {
        {"transpose_a", NULL, -1, "true"}, {"transpose_b", NULL, -1, "true"},
        {"shape", "M", -1, "32"},          {"shape", "N", -1, "64"},
        {"shape", "K", -1, "17"},
    };
    expect_variants_distinct(dense, dv, (int)(sizeof dv / sizeof dv[0]));

    const char *norm = "{\"op\":\"layer_norm\",\"shape\":{\"R\":4,\"C\":8}}";
    const variant nv[] = {
        {"eps", NULL, -1, "1e-6"},
        {"eps", NULL, -1, "1.0000000000000003e-05"}, /* the next double after 1e-5 */
        {"op", NULL, -1, "\"rms_norm\""},
    };
    expect_variants_distinct(norm, nv, (int)(sizeof nv / sizeof nv[0]));
    const char *rows = "{\"op\":\"softmax\",\"shape\":{\"R\":4,\"C\":8}}";
    const variant rv[] = {
        {"op", NULL, -1, "\"reduce_sum\""},
        {"op", NULL, -1, "\"reduce_mean\""},
        {"op", NULL, -1, "\"reduce_max\""},
        {"op", NULL, -1, "\"transpose\""},
        {"shape", "R", -1, "8"},
        {"shape", "C", -1, "4"},
    };
    expect_variants_distinct(rows, rv, (int)(sizeof rv / sizeof rv[0]));
}

Test(workload, encode_is_stable_json)
{
    ir_workload w;
    decode_ok(families[3], &w);
    char *s = proto_workload_to_string(&w);
    cr_assert_not_null(s);
    cr_expect_str_eq(s, "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":8,\"H\":12,\"W\":10,\"F\":16,"
                        "\"KH\":3,\"KW\":5},\"stride\":[2,1],\"pad\":[1,2],\"dilation\":[2,1],"
                        "\"groups\":4,\"layout\":\"NHWC\",\"dtype\":\"float32\","
                        "\"epilogue\":[\"bias_add\",\"relu6\"]}");
    free(s);
}

/* Byte-level mutations of valid workloads: the decoder must never crash (ASan/UBSan watch),
 * every failure must name a field or be a syntax error, and every success must be a checked
 * workload that survives a round trip. Deterministic (fixed LCG seed). */
Test(workload, mutated_inputs_never_crash)
{
    static const char alphabet[] = "{}[]\":,0123456789-+.eE \\ntfalsenulKMNCHWF_9";
    uint64_t s = 0x9e3779b97f4a7c15ull;
    int accepted = 0;
    for (int iter = 0; iter < 3000; iter++) {
        const char *src = families[iter % (sizeof families / sizeof families[0])];
        char buf[1024];
        size_t n = strlen(src);
        cr_assert_lt(n, sizeof buf - 8);
        memcpy(buf, src, n + 1);
        int edits = 1 + iter % 3;
        for (int e = 0; e < edits; e++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(s >> 33) % n;
            char ch = alphabet[(s >> 17) % (sizeof alphabet - 1)];
            switch ((s >> 9) % 3) {
            case 0:
                buf[pos] = ch;
                break; /* replace */
            case 1:
                memmove(buf + pos, buf + pos + 1, n - pos), n--;
                break; /* delete */
            default:
                memmove(buf + pos + 1, buf + pos, n - pos + 1), buf[pos] = ch, n++; /* insert */
            }
            if (n == 0) break;
        }
        ir_workload w;
        tlm_error err;
        tlm_err_clear(&err);
        int rc = proto_workload_from_string(buf, n, &w, &err);
        cr_assert_leq(rc, 0);
        if (rc) {
            cr_expect_eq(rc, err.code);
            cr_expect(err.msg[0], "empty message for %s", buf);
            cr_expect(rc == PROTO_EJSON || rc == TLM_EINVAL || rc == TLM_EUNSUPPORTED,
                      "unexpected code %d for %s", rc, buf);
            continue;
        }
        accepted++;
        cr_expect_eq(ir_workload_check(&w, &err), 0, "accepted but unchecked: %s", buf);
        char *t = proto_workload_to_string(&w);
        cr_assert_not_null(t);
        ir_workload w2;
        cr_expect_eq(proto_workload_from_string(t, strlen(t), &w2, &err), 0, "%s -> %s: %s", buf, t,
                     err.msg);
        free(t);
    }
    cr_expect_gt(accepted, 0, "no mutation survived; the test is not exercising success paths");
}
