/* test_tlm_ir.c — drives the real `tlm` binary (TLM_BIN, default build/san/tlm): `tlm ir`,
 * dispatch, usage errors and exit statuses. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "compiler/ir/ir.h"
#include "proto/workload.h"

#include "tests/common/run_tool.h"

/* The contract for bad input: exit 2, nothing on stdout, exactly one line on stderr. */
static void expect_one_line_error(const run_result *r, const char *must_contain)
{
    cr_expect_eq(r->status, 2, "exit %d, stderr: %s", r->status, r->err);
    cr_expect_str_empty(r->out, "stdout not empty: %s", r->out);
    cr_expect_eq(count_lines(r->err), 1, "stderr is not one line: [%s]", r->err);
    size_t n = strlen(r->err);
    cr_expect(n > 0 && r->err[n - 1] == '\n', "stderr does not end the line: [%s]", r->err);
    cr_expect(strncmp(r->err, "tlm: ", 5) == 0, "stderr lacks the tlm: prefix: %s", r->err);
    if (must_contain)
        cr_expect(strstr(r->err, must_contain) != NULL, "stderr [%s] lacks [%s]", r->err,
                  must_contain);
    cr_expect_null(strstr(r->err, "runtime error"), "sanitizer report: %s", r->err);
    cr_expect_null(strstr(r->err, "AddressSanitizer"), "sanitizer report: %s", r->err);
}

static json_t *parse_stdout(const run_result *r)
{
    json_error_t je;
    json_t *j = json_loads(r->out, 0, &je);
    cr_assert_not_null(j, "stdout is not JSON (%s at %d:%d): %s", je.text, je.line, je.column,
                       r->out);
    return j;
}

static void in_process(const char *text, ir_workload *w, ir_subgraph **g)
{
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(proto_workload_from_string(text, strlen(text), w, &err), 0, "%s", err.msg);
    *g = calloc(1, sizeof **g);
    cr_assert_not_null(*g);
    cr_assert_eq(ir_subgraph_build(w, *g, &err), 0, "%s", err.msg);
}

#define DENSE_64_32_16 "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16}}"

Test(tlm_ir, dense_reports_hash_flops_bytes_tensors)
{
    run_result r = RUN("ir", "--workload", DENSE_64_32_16);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    cr_expect_str_empty(r.err);
    json_t *j = parse_stdout(&r);

    ir_workload w;
    ir_subgraph *g;
    in_process(DENSE_64_32_16, &w, &g);
    char hex[IR_HASH_HEX], canon[1024];
    cr_assert_eq(ir_workload_hash_hex(&w, hex), 0);
    cr_assert_gt(ir_workload_canonical(&w, canon, sizeof canon), 0);

    cr_expect_str_eq(json_string_value(json_object_get(j, "workload_hash")), hex);
    cr_expect_eq(strlen(json_string_value(json_object_get(j, "workload_hash"))), 64);
    cr_expect_str_eq(json_string_value(json_object_get(j, "canonical")), canon);
    json_t *cj = json_loads(canon, 0, NULL);
    cr_expect(json_equal(json_object_get(j, "workload"), cj), "workload is not the canonical form");
    json_decref(cj);
    cr_expect_eq(json_integer_value(json_object_get(j, "flops")), 2 * 64 * 32 * 16);
    cr_expect_eq(json_integer_value(json_object_get(j, "bytes")),
                 (64 * 16 + 16 * 32 + 64 * 32) * 4);
    cr_expect_eq(json_integer_value(json_object_get(j, "stages")), 1);

    json_t *ts = json_object_get(j, "tensors");
    cr_assert_eq(json_array_size(ts), 3);
    const char *kinds[] = {"input", "input", "output"};
    const int64_t shapes[3][2] = {{64, 16}, {16, 32}, {64, 32}};
    for (int i = 0; i < 3; i++) {
        json_t *t = json_array_get(ts, (size_t)i);
        cr_expect_str_eq(json_string_value(json_object_get(t, "name")), g->tensor[i].name);
        cr_expect_str_eq(json_string_value(json_object_get(t, "kind")), kinds[i]);
        cr_expect_str_eq(json_string_value(json_object_get(t, "dtype")), "float32");
        json_t *s = json_object_get(t, "shape");
        cr_assert_eq(json_array_size(s), 2);
        for (int d = 0; d < 2; d++)
            cr_expect_eq(json_integer_value(json_array_get(s, (size_t)d)), shapes[i][d],
                         "tensor %d dim %d", i, d);
    }
    json_decref(j);
    free(g);
    free_result(&r);
}

Test(tlm_ir, epilogue_adds_its_flops)
{
    const char *wl = "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16},"
                     "\"epilogue\":[\"bias_add\",\"relu\"],\"dtype\":\"float16\"}";
    run_result r = RUN("ir", "--workload", wl);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    json_t *j = parse_stdout(&r);
    ir_workload w;
    ir_subgraph *g;
    in_process(wl, &w, &g);
    json_int_t flops = json_integer_value(json_object_get(j, "flops"));
    /* one add for the bias and one compare for relu per output element */
    cr_expect_eq(flops, 65536 + 64 * 32 + 64 * 32);
    cr_expect_eq(flops, ir_subgraph_flops(g));
    cr_expect_eq(json_integer_value(json_object_get(j, "bytes")), ir_subgraph_bytes(g));
    cr_expect_eq(json_integer_value(json_object_get(j, "stages")), g->n_stage);
    cr_expect_gt(g->n_stage, 1);
    cr_expect_eq(json_array_size(json_object_get(j, "tensors")), (size_t)g->n_tensor);
    json_t *t0 = json_array_get(json_object_get(j, "tensors"), 0);
    cr_expect_str_eq(json_string_value(json_object_get(t0, "dtype")), "float16");
    /* the hash differs from the plain dense */
    run_result r2 = RUN("ir", "--workload", DENSE_64_32_16);
    json_t *j2 = parse_stdout(&r2);
    cr_expect_str_neq(json_string_value(json_object_get(j, "workload_hash")),
                      json_string_value(json_object_get(j2, "workload_hash")));
    json_decref(j);
    json_decref(j2);
    free(g);
    free_result(&r);
    free_result(&r2);
}

Test(tlm_ir, file_and_stdin_inputs_match_inline)
{
    tool_dir_make("/tmp/tlm-wl-XXXXXX");
    char path[96], arg[112];
    tool_path(path, sizeof path, "w.json");
    /* the file spells the same workload differently: order, whitespace, defaults, alias */
    write_file(path, "{\n  \"shape\": {\"K\": 16, \"N\": 32, \"M\": 64},\n  \"op\": \"matmul\",\n"
                     "  \"dtype\": \"float32\", \"transpose_a\": false\n}\n");
    snprintf(arg, sizeof arg, "@%s", path);

    run_result a = RUN("ir", "--workload", DENSE_64_32_16);
    run_result b = RUN("ir", "--workload", arg);
    run_result c = run_tlm_in(DENSE_64_32_16, (const char *const[]){"ir", "--workload=@-", NULL});
    cr_assert_eq(a.status, 0, "%s", a.err);
    cr_assert_eq(b.status, 0, "%s", b.err);
    cr_assert_eq(c.status, 0, "%s", c.err);
    json_t *ja = parse_stdout(&a), *jb = parse_stdout(&b), *jc = parse_stdout(&c);
    cr_expect(json_equal(ja, jb), "file result differs:\n%s\nvs\n%s", a.out, b.out);
    cr_expect(json_equal(ja, jc), "stdin result differs");
    json_decref(ja);
    json_decref(jb);
    json_decref(jc);
    free_result(&a);
    free_result(&b);
    free_result(&c);

    /* a bad file names the JSON field, like inline input */
    write_file(path, "{\"op\": \"dense\", \"shape\": {\"M\": 64, \"N\": 32, \"K\": 0}}");
    run_result d = RUN("ir", "--workload", arg);
    expect_one_line_error(&d, "shape.K");
    free_result(&d);
    tool_dir_remove();
}

Test(tlm_ir, missing_file_is_a_usage_error)
{
    run_result r = RUN("ir", "--workload", "@/nonexistent/tlm/w.json");
    expect_one_line_error(&r, "/nonexistent/tlm/w.json");
    cr_expect(strstr(r.err, "--workload") != NULL, "%s", r.err);
    free_result(&r);
}

Test(tlm_ir, bad_workloads_exit_2_with_one_line_naming_the_field)
{
    static const struct {
        const char *wl, *expect;
    } cases[] = {
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":-3}}",
         "tlm: shape.K: must be a positive integer (got -3)\n"},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32}}", "tlm: shape.K: "},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":99999999999999999999}}",
         "tlm: shape.K: "},
        {"{\"op\":\"conv3d\",\"shape\":{}}", "tlm: op: "},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"F\":16,\"KH\":3,"
         "\"KW\":3},\"stride\":[1,0]}",
         "tlm: stride[1]: "},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16},"
         "\"epilogue\":[\"relu\",\"gelu\",\"softplus\"]}",
         "tlm: epilogue[2]: "},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":32,\"K\":16},\"groups\":1}", "tlm: groups: "},
        {"{\"op\":\"dense\",\n\"shape\":}", "tlm: invalid JSON at line 2"},
        {"[1,2]", "tlm: a workload must be a JSON object"},
        /* a message that quotes a newline from the input still fits on one line */
        {"{\"op\":\"a\\nb\",\"shape\":{}}", "tlm: op: "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run_result r = RUN("ir", "--workload", cases[i].wl);
        expect_one_line_error(&r, cases[i].expect);
        free_result(&r);
    }
}

Test(tlm_ir, stages_prints_the_lowered_text)
{
    const char *wl = "{\"op\":\"softmax\",\"shape\":{\"R\":4,\"C\":8}}";
    run_result r = RUN("ir", "--stages", "--workload", wl);
    cr_assert_eq(r.status, 0, "%s", r.err);
    ir_workload w;
    ir_subgraph *g;
    in_process(wl, &w, &g);
    char buf[1 << 16];
    int n = ir_subgraph_print(g, buf, sizeof buf);
    cr_assert_gt(n, 0);
    cr_expect_eq(strncmp(r.out, buf, (size_t)n), 0, "got:\n%s\nwant:\n%s", r.out, buf);
    cr_expect(strstr(r.out, "anchor") != NULL, "%s", r.out);
    cr_expect_null(json_loads(r.out, 0, NULL), "--stages printed JSON");
    free(g);
    free_result(&r);
}

Test(tlm_ir, usage_errors)
{
    const char *const *argsets[] = {
        (const char *const[]){"ir", NULL},
        (const char *const[]){"ir", "--bogus", "--workload", DENSE_64_32_16, NULL},
        (const char *const[]){"ir", "--workload", NULL},
        (const char *const[]){"ir", "--workload", DENSE_64_32_16, "extra", NULL},
    };
    const char *expect[] = {"--workload", "--bogus", "--workload", "extra"};
    for (size_t i = 0; i < sizeof argsets / sizeof argsets[0]; i++) {
        run_result r = run_tlm_in(NULL, argsets[i]);
        expect_one_line_error(&r, expect[i]);
        free_result(&r);
    }
}

Test(tlm, dispatch_help_version_unknown)
{
    run_result r = RUN("--help");
    cr_expect_eq(r.status, 0);
    cr_expect(strstr(r.out, "ir ") != NULL, "%s", r.out);
    free_result(&r);

    r = RUN("--version");
    cr_expect_eq(r.status, 0);
    cr_expect(strncmp(r.out, "tlm ", 4) == 0, "%s", r.out);
    free_result(&r);

    r = RUN("ir", "--help");
    cr_expect_eq(r.status, 0);
    cr_expect(strstr(r.out, "--workload") != NULL, "%s", r.out);
    free_result(&r);

    r = RUN("frobnicate");
    cr_expect_eq(r.status, 2);
    cr_expect_str_empty(r.out);
    cr_expect(strstr(r.err, "frobnicate") != NULL, "%s", r.err);
    cr_expect(strstr(r.err, "usage") != NULL, "%s", r.err);
    free_result(&r);

    run_result none = run_tlm_in(NULL, (const char *const[]){NULL});
    cr_expect_eq(none.status, 2);
    cr_expect(strstr(none.err, "usage") != NULL, "%s", none.err);
    free_result(&none);
}
