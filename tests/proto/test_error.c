/* test_error.c — proto/error: the wire form of errors and its status mapping. */
#include <criterion/criterion.h>
#include <string.h>

#include "proto/error.h"
#include "proto/workload.h"

static const char *member(json_t *body, const char *key)
{
    json_t *e = json_object_get(body, "error");
    cr_assert(json_is_object(e));
    cr_assert_eq(json_object_size(e), 3, "error object must have exactly code/message/field");
    json_t *v = json_object_get(e, key);
    cr_assert(json_is_string(v), "%s is not a string", key);
    return json_string_value(v);
}

Test(error, body_from_a_decoder_error)
{
    ir_workload w;
    tlm_error err;
    const char *t = "{\"op\":\"dense\",\"shape\":{\"M\":1,\"N\":1,\"K\":-3}}";
    cr_assert_neq(proto_workload_from_string(t, strlen(t), &w, &err), 0);
    int status = 0;
    json_t *b = proto_error_from_tlm(&err, &status);
    cr_assert_not_null(b);
    cr_expect_eq(status, 400);
    cr_expect_eq(json_object_size(b), 1);
    cr_expect_str_eq(member(b, "code"), "invalid_field");
    cr_expect_str_eq(member(b, "field"), "shape.K");
    cr_expect_str_eq(member(b, "message"), err.msg);
    json_decref(b);
}

Test(error, syntax_and_unsupported_codes)
{
    ir_workload w;
    tlm_error err;
    int status;
    cr_assert_eq(proto_workload_from_string("{", 1, &w, &err), PROTO_EJSON);
    json_t *b = proto_error_from_tlm(&err, &status);
    cr_expect_eq(status, 400);
    cr_expect_str_eq(member(b, "code"), "invalid_json");
    cr_expect_str_eq(member(b, "field"), "");
    json_decref(b);

    const char *t = "{\"op\":\"dense\",\"shape\":{\"M\":1,\"N\":1,\"K\":1},\"dtype\":\"int4\"}";
    cr_assert_eq(proto_workload_from_string(t, strlen(t), &w, &err), TLM_EUNSUPPORTED);
    b = proto_error_from_tlm(&err, &status);
    cr_expect_eq(status, 422);
    cr_expect_str_eq(member(b, "code"), "unsupported");
    cr_expect_str_eq(member(b, "field"), "dtype");
    json_decref(b);
}

Test(error, status_and_code_table)
{
    const struct {
        int code, status;
        const char *name;
    } rows[] = {
        {PROTO_EJSON, 400, "invalid_json"},
        {TLM_EINVAL, 400, "invalid_field"},
        {TLM_EUNSUPPORTED, 422, "unsupported"},
        {TLM_ELIMIT, 422, "limit_exceeded"},
        {TLM_ENOTFOUND, 404, "not_found"},
        {TLM_ETOOLCHAIN, 500, "toolchain_failed"},
        {TLM_ERUNTIME, 500, "runtime_failed"},
        {TLM_ENOMEM, 500, "internal"},
        {TLM_EIO, 500, "internal"},
        {-999, 500, "internal"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        cr_expect_eq(proto_error_http_status(rows[i].code), rows[i].status, "code %d",
                     rows[i].code);
        cr_expect_str_eq(proto_error_code(rows[i].code), rows[i].name);
    }
}

Test(error, body_survives_null_and_invalid_utf8)
{
    json_t *b = proto_error_body(PROTO_CODE_QUEUE_FULL, NULL, NULL);
    cr_assert_not_null(b);
    cr_expect_str_eq(member(b, "code"), "queue_full");
    cr_expect_str_eq(member(b, "message"), "");
    cr_expect_str_eq(member(b, "field"), "");
    json_decref(b);
    /* messages quote user input; a stray byte must not lose the error */
    b = proto_error_body(PROTO_CODE_INVALID_FIELD, "bad \xff\xfe name", "op\xff");
    cr_assert_not_null(b);
    cr_expect_str_eq(member(b, "message"), "bad ?? name");
    json_decref(b);
}

Test(error, prefix_reroots_fields)
{
    const struct {
        const char *prefix, *field, *want;
    } rows[] = {
        {"workloads[2]", "shape.K", "workloads[2].shape.K"},
        {"workloads[2]", "", "workloads[2]"},
        {"pad", "[1]", "pad[1]"},
        {"", "shape.K", "shape.K"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        tlm_error e;
        tlm_err_set(&e, TLM_EINVAL, rows[i].field, "x");
        proto_error_prefix(&e, rows[i].prefix);
        cr_expect_str_eq(e.field, rows[i].want);
    }
    tlm_error e;
    char longp[300];
    memset(longp, 'p', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    tlm_err_set(&e, TLM_EINVAL, "shape.K", "x");
    proto_error_prefix(&e, longp);
    cr_expect_eq(strlen(e.field), sizeof e.field - 1, "truncated to capacity");
}
