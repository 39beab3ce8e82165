/* test_served_kernel.c — a kernel served over HTTP is runnable and right: the real sanitized
 * tlmd (loopback, temporary store, --weights none: the rule-of-thumb schedules) compiles CPU
 * workloads with odd extents; each .so is fetched by key from GET /v1/kernels/KEY exactly as a
 * client would (entry point from the X-TLM-Entry header), written to a file and run by
 * measure_cpu, which loads it in a child process (never in this one) on random inputs and
 * compares the output with the reference interpreter (compiler/ir, double precision).
 * A negative control runs a fetched kernel against a different subgraph and must be told
 * wrong, so the comparison is known to bite. */
#include "compiler/ir/ir.h"
#include "compiler/measure/measure.h"
#include "proto/workload.h"
#include "tests/common/tlmd_harness.h"

static const char *const workloads[] = {
    "{\"op\":\"dense\",\"shape\":{\"M\":33,\"N\":47,\"K\":29},\"epilogue\":[\"bias_add\",\"relu\"]"
    "}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":9,\"W\":11,\"F\":5,\"KH\":3,\"KW\":3},"
    "\"pad\":[1,1],\"epilogue\":[\"relu\"]}",
    "{\"op\":\"softmax\",\"shape\":{\"R\":7,\"C\":129}}",
};
enum { N_WL = sizeof workloads / sizeof workloads[0] };

/* A string member, "" when absent (so an assertion on it fails instead of crashing). */
static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

typedef struct {
    char key[65], entry[128], sha[65];
    char path[400]; /* the fetched binary */
} served;

static ir_subgraph *subgraph_of(const char *wl, char whash[IR_HASH_HEX])
{
    ir_workload w;
    tlm_error e;
    tlm_err_clear(&e);
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &w, &e), 0, "%s: %s", wl, e.msg);
    if (whash) cr_assert_eq(ir_workload_hash_hex(&w, whash), 0);
    ir_subgraph *g = calloc(1, sizeof *g);
    cr_assert(g);
    cr_assert_eq(ir_subgraph_build(&w, g, &e), 0, "%s: %s", wl, e.msg);
    return g;
}

/* Runs the served kernel on g in a child process; the check run only. */
static measure_result run_served(const served *s, const ir_subgraph *g, uint64_t seed)
{
    measure_opts o;
    measure_opts_init(&o);
    o.check_only = true;
    o.seed = seed;
    o.timeout_s = 60;
    measure_result res;
    tlm_error e;
    tlm_err_clear(&e);
    cr_assert_eq(measure_cpu(g, s->path, s->entry, &o, &res, &e), 0, "measure_cpu: %s", e.msg);
    return res;
}

/* GET /v1/kernels/KEY: the bytes the answer vouched for, with the answer's entry point. */
static void fetch(const tlmd *d, const json_t *k, int i, served *s)
{
    snprintf(s->key, sizeof s->key, "%s", jstr(k, "key"));
    snprintf(s->sha, sizeof s->sha, "%s", jstr(k, "binary_sha256"));
    cr_assert_eq(strlen(s->key), 64, "kernel %d has no key", i);
    cr_assert_str_eq(jstr(k, "format"), "elf-so");
    char url[128];
    snprintf(url, sizeof url, "/v1/kernels/%s", s->key);
    resp r = get(d, url);
    cr_assert_eq(r.status, 200, "GET %s: %ld %s", url, r.status, r.body.p);
    cr_assert(r.body.n > 4 && !memcmp(r.body.p,
                                      "\x7f"
                                      "ELF",
                                      4),
              "kernel %d is not an ELF file", i);
    cr_assert_eq((json_int_t)r.body.n, json_integer_value(json_object_get(k, "binary_size")));
    char hex[65], hdr[128];
    cr_assert_eq(tlm_sha256_hex(r.body.p, r.body.n, hex), 0);
    cr_assert_str_eq(hex, s->sha, "kernel %d: the bytes served are not the ones the answer named",
                     i);
    cr_assert(http_header(&r, "X-TLM-SHA256", hdr, sizeof hdr));
    cr_assert_str_eq(hdr, s->sha);
    cr_assert(http_header(&r, "X-TLM-Entry", s->entry, sizeof s->entry),
              "kernel %d: no X-TLM-Entry", i);
    cr_assert_str_eq(s->entry, jstr(k, "entry"));
    snprintf(s->path, sizeof s->path, "%s/served-%d.so", d->dir, i);
    FILE *f = fopen(s->path, "wb");
    cr_assert(f, "%s", s->path);
    cr_assert_eq(fwrite(r.body.p, 1, r.body.n, f), r.body.n);
    cr_assert_eq(fclose(f), 0);
    resp_free(&r);
}

Test(served_kernel, fetched_so_runs_and_matches_the_reference)
{
    tlmd d;
    setup_dir(&d);
    const char *extra[] = {"--weights", "none", NULL};
    start(&d, extra);

    char body[2048];
    int n = snprintf(body, sizeof body, "{\"target\":\"cpu\",\"workloads\":[");
    for (int i = 0; i < N_WL; i++)
        n += snprintf(body + n, sizeof body - (size_t)n, "%s%s", i ? "," : "", workloads[i]);
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    resp r = post(&d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *answer = body_json(&r);
    resp_free(&r);
    json_t *ks = json_object_get(answer, "kernels");
    cr_assert_eq(json_array_size(ks), N_WL);

    served s[N_WL];
    for (int i = 0; i < N_WL; i++) {
        const json_t *k = json_array_get(ks, i);
        char whash[IR_HASH_HEX];
        ir_subgraph *g = subgraph_of(workloads[i], whash);
        /* the server compiled the workload we asked for, in this order */
        cr_assert_str_eq(jstr(k, "workload_hash"), whash, "%s", workloads[i]);
        /* --weights none: the rule-of-thumb schedule (issue 9's schedule_source) */
        cr_assert_str_eq(jstr(k, "schedule_source"), "default");
        fetch(&d, k, i, &s[i]);
        measure_result res = run_served(&s[i], g, 9100 + (uint64_t)i);
        cr_assert_eq(res.status, MEASURE_OK, "%s: %s (%s)", workloads[i],
                     measure_status_name(res.status), res.detail);
        cr_assert(res.rel_err >= 0 && res.rel_err < 1e-4, "%s: rel_err %g", workloads[i],
                  res.rel_err);
        cr_log_info("%s: entry %s, %zu-byte .so, rel_err %.2g", workloads[i], s[i].entry,
                    (size_t)json_integer_value(json_object_get(k, "binary_size")), res.rel_err);
        free(g);
    }

    /* negative control: dense+bias+relu's kernel is not dense+bias (same arguments) */
    ir_subgraph *g = subgraph_of(
        "{\"op\":\"dense\",\"shape\":{\"M\":33,\"N\":47,\"K\":29},\"epilogue\":[\"bias_add\"]}",
        NULL);
    measure_result res = run_served(&s[0], g, 9200);
    cr_assert_eq(res.status, MEASURE_WRONG, "a relu kernel passed for one without: %s, rel_err %g",
                 measure_status_name(res.status), res.rel_err);
    free(g);

    json_decref(answer);
    teardown(&d);
}
