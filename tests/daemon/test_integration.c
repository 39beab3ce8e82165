/* test_integration.c — tlmd on loopback: the real (sanitized) daemon, started on a free port
 * with a temporary store and a tiny random model, driven with libcurl. The random model is
 * untrained, so tlmd serves the default schedules unless a test passes --serve-untrained
 * (the decoder, topk); the tests of what tlmd serves (weights none / missing / untrained /
 * trained, devices) start it in each of those ways.
 * TLMD_BIN names the daemon (default build/san/tlmd). No Criterion .timeout: with --jobs it
 * leaks in Criterion 2.4 (LeakSanitizer fails the binary); every wait here is bounded instead
 * (curl 120 s, start-up 60 s, exits 30-60 s). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>
#include <sqlite3.h>

#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"
#include "compiler/tlm/tlm_cuda.h"

#include "tests/common/tlmd_harness.h"

static void file_sha256(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    static unsigned char wb[8 << 20];
    size_t wn = fread(wb, 1, sizeof wb, f);
    fclose(f);
    tlm_sha256_hex(wb, wn, hex);
}

static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static const char dense_conv[] =
    "[{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":64,\"K\":32},\"epilogue\":[\"bias_add\",\"relu\"]"
    "},"
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":10,\"W\":10,\"F\":16,\"KH\":3,\"KW\":3},"
    "\"pad\":[1,1]}]";

/* ---- tests ---- */

Test(daemon, compile_fetch_and_cache_hit)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    const char *targets[] = {"cpu", "cuda:sm_90"};
    for (int ti = 0; ti < 2; ti++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"target\":\"%s\",\"include_binary\":true,\"workloads\":%s}",
                 targets[ti], dense_conv);
        resp r = post(&d, body);
        cr_assert_eq(r.status, 200, "%s: %s", targets[ti], r.body.p);
        json_t *a = body_json(&r);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(a, "target"), "name")),
                         targets[ti]);
        cr_assert_eq(
            strlen(json_string_value(json_object_get(json_object_get(a, "target"), "hash"))), 64);
        json_t *ks = json_object_get(a, "kernels");
        cr_assert_eq(json_array_size(ks), 2);
        cr_assert_str_eq(json_string_value(json_object_get(a, "effective_mode")), "default");
        for (size_t i = 0; i < 2; i++) {
            json_t *k = json_array_get(ks, i);
            cr_assert_str_eq(json_string_value(json_object_get(k, "cache")), "miss");
            /* untrained weights are not served: the rule of thumb is */
            cr_assert_str_eq(json_string_value(json_object_get(k, "schedule_source")), "default");
            cr_assert_str_eq(json_string_value(json_object_get(k, "format")),
                             ti ? "cubin" : "elf-so");
            const char *sha = json_string_value(json_object_get(k, "binary_sha256"));
            const char *url = json_string_value(json_object_get(k, "url"));
            json_int_t size = json_integer_value(json_object_get(k, "binary_size"));
            /* the raw binary matches the answer's checksum */
            resp b = get(&d, url);
            cr_assert_eq(b.status, 200);
            cr_assert_eq((json_int_t)b.body.n, size);
            char hex[65], hv[512];
            tlm_sha256_hex(b.body.p, b.body.n, hex);
            cr_assert_str_eq(hex, sha);
            cr_assert(http_header(&b, "X-TLM-Entry", hv, sizeof hv));
            cr_assert_str_eq(hv, json_string_value(json_object_get(k, "entry")));
            cr_assert(http_header(&b, "X-TLM-Launch", hv, sizeof hv));
            if (ti) cr_assert(strstr(hv, "grid"), "launch header %s", hv);
            if (!ti)
                cr_assert(b.body.n > 4 && !memcmp(b.body.p,
                                                  "\x7f"
                                                  "ELF",
                                                  4));
            resp_free(&b);
            /* include_binary: base64 of the same bytes */
            const char *b64 = json_string_value(json_object_get(k, "binary"));
            cr_assert(b64);
            unsigned char *raw = malloc(strlen(b64));
            size_t rn = http_b64_decode(b64, raw);
            tlm_sha256_hex(raw, rn, hex);
            cr_assert_str_eq(hex, sha);
            free(raw);
            /* source and meta */
            char path[200];
            snprintf(path, sizeof path, "%s/source", url);
            resp s = get(&d, path);
            cr_assert_eq(s.status, 200);
            cr_assert(strstr(s.body.p, ti ? "__global__" : "tlm_kernel"));
            resp_free(&s);
            snprintf(path, sizeof path, "%s/meta", url);
            resp m = get(&d, path);
            cr_assert_eq(m.status, 200);
            json_t *mj = body_json(&m);
            cr_assert_str_eq(json_string_value(json_object_get(mj, "binary_sha256")), sha);
            cr_assert_str_eq(json_string_value(json_object_get(mj, "schedule_source")), "default");
            cr_assert_str_eq(json_string_value(json_object_get(mj, "model_id")), "none");
            json_decref(mj);
            resp_free(&m);
        }
        json_decref(a);
        resp_free(&r);
    }
    json_int_t compiles = cache_stat(&d, "compiles");
    cr_assert_eq(compiles, 4);
    double m_compiles = metric(&d, "tlmd_compiles_total");
    /* the same requests again: hits, and nothing is compiled */
    for (int ti = 0; ti < 2; ti++) {
        char body[2048];
        snprintf(body, sizeof body, "{\"target\":\"%s\",\"workloads\":%s}", targets[ti],
                 dense_conv);
        resp r = post(&d, body);
        cr_assert_eq(r.status, 200);
        json_t *a = body_json(&r);
        json_t *ks = json_object_get(a, "kernels");
        for (size_t i = 0; i < json_array_size(ks); i++) {
            cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ks, i), "cache")),
                             "hit");
            cr_assert_str_eq(
                json_string_value(json_object_get(json_array_get(ks, i), "schedule_source")),
                "default", "a hit keeps the source it was stored with");
        }
        cr_assert_eq(json_integer_value(json_object_get(json_object_get(a, "stats"), "hits")), 2);
        /* the job is remembered */
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(a, "job")));
        resp jr = get(&d, path);
        cr_assert_eq(jr.status, 200);
        cr_assert(strstr(jr.body.p, "\"done\""));
        cr_assert(strstr(jr.body.p, "\"schedule_source\":\"default\""), "%s", jr.body.p);
        resp_free(&jr);
        json_decref(a);
        resp_free(&r);
    }
    cr_assert_eq(cache_stat(&d, "compiles"), compiles);
    cr_assert_eq(cache_stat(&d, "hits"), 4);
    cr_assert_eq(metric(&d, "tlmd_compiles_total"), m_compiles);
    /* version: random weights are not trained, so they are read (model.id is the file's
     * SHA-256) but not served: schedules are default and the served model id is "none" */
    resp v = get(&d, "/v1/version");
    json_t *vj = body_json(&v);
    cr_assert(json_is_false(json_object_get(vj, "weights_trained")));
    char hex[65];
    file_sha256(d.weights, hex);
    cr_assert_str_eq(json_string_value(json_object_get(vj, "model_id")), "none");
    cr_assert_str_eq(json_string_value(json_object_get(vj, "schedules")), "default");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(vj, "model"), "id")), hex);
    cr_assert(json_is_false(json_object_get(json_object_get(vj, "model"), "served")));
    json_decref(vj);
    resp_free(&v);
    resp t = get(&d, "/v1/targets");
    cr_assert_eq(t.status, 200);
    cr_assert(strstr(t.body.p, "cuda:h200") && strstr(t.body.p, "\"hash\""));
    resp_free(&t);
    teardown(&d);
}

static void check_stream(const tlmd *d, bool by_accept)
{
    char body[2048];
    snprintf(body, sizeof body,
             "{\"target\":\"cuda:sm_80\",%s\"workloads\":[{\"op\":\"softmax\",\"shape\":{\"R\":64,"
             "\"C\":128}},{\"op\":\"dense\",\"shape\":{\"M\":32,\"N\":64,\"K\":%d}},"
             "{\"op\":\"elementwise\",\"shape\":{\"N\":4096},\"epilogue\":[\"gelu\"]}]}",
             by_accept ? "" : "\"stream\":true,", by_accept ? 48 : 16);
    const char *h[] = {"Content-Type: application/json",
                       by_accept ? "Accept: application/x-ndjson" : NULL, NULL};
    resp r = http(d, "POST", "/v1/compile", body, strlen(body), h);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    char ct[128];
    cr_assert(http_header(&r, "Content-Type", ct, sizeof ct));
    cr_assert_str_eq(ct, "application/x-ndjson");
    int n = 0, kernels = 0;
    bool seen[3] = {0}, done = false;
    for (char *l = r.body.p; l && *l;) {
        char *e = strchr(l, '\n');
        cr_assert(e, "every event ends with a newline");
        *e = 0;
        json_t *ev = json_loads(l, 0, NULL);
        cr_assert(ev, "event %d is not JSON: %s", n, l);
        const char *type = json_string_value(json_object_get(ev, "event"));
        cr_assert(type);
        cr_assert(!done, "nothing may follow done");
        if (n == 0)
            cr_assert_str_eq(type, "accepted");
        else if (!strcmp(type, "kernel")) {
            int idx = (int)json_integer_value(json_object_get(ev, "index"));
            cr_assert(idx >= 0 && idx < 3 && !seen[idx]);
            seen[idx] = true;
            kernels++;
            cr_assert(json_object_get(json_object_get(ev, "kernel"), "binary_sha256"));
            cr_assert_str_eq(jstr(json_object_get(ev, "kernel"), "schedule_source"), "default");
        } else {
            cr_assert_str_eq(type, "done");
            done = true;
        }
        json_decref(ev);
        n++;
        l = e + 1;
    }
    cr_assert_eq(kernels, 3);
    cr_assert(done);
    resp_free(&r);
}

Test(daemon, streaming_events_in_order)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    check_stream(&d, false);
    check_stream(&d, true);
    teardown(&d);
}

typedef struct {
    const tlmd *d;
    int i;
    long status;
    char key[65];
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    char body[1024];
    int i = c->i;
    if (i % 8 == 7) /* four clients share one workload: single flight or cache hits */
        snprintf(body, sizeof body,
                 "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":32,"
                 "\"N\":32,\"K\":32}}]}");
    else if (i % 2)
        snprintf(body, sizeof body,
                 "{\"target\":\"cuda:sm_90\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":%d,"
                 "\"N\":64,\"K\":64}}]}",
                 16 * (i + 1));
    else
        snprintf(body, sizeof body,
                 "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"%s\",\"shape\":{\"R\":%d,"
                 "\"C\":64}}]}",
                 i % 4 ? "softmax" : "reduce_sum", i + 1);
    resp r = post(c->d, body);
    c->status = r.status;
    if (r.status == 200) {
        json_t *j = json_loads(r.body.p, 0, NULL);
        const char *k = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "kernels"), 0), "key"));
        if (k) snprintf(c->key, sizeof c->key, "%s", k);
        json_decref(j);
    }
    resp_free(&r);
    return NULL;
}

Test(daemon, thirty_two_concurrent_clients_batch)
{
    tlmd d;
    setup_dir(&d);
    const char *extra[] = {"--serve-untrained", NULL};
    start(&d, extra); /* the model decodes: batching is what this test is about */
    enum { N = 32 };
    client cs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        cs[i] = (client){&d, i, 0, ""};
        pthread_create(&th[i], NULL, client_main, &cs[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++)
        cr_assert_eq(cs[i].status, 200, "client %d: %ld", i, cs[i].status);
    for (int i = 15; i < N; i += 8)
        cr_assert_str_eq(cs[i].key, cs[7].key);
    cr_assert(metric(&d, "tlmd_decoder_batch_size_max") > 1, "the decoder never batched");
    double le1 = metric(&d, "tlmd_decoder_batch_size_bucket{le=\"1\"}");
    double all = metric(&d, "tlmd_decoder_batch_size_count");
    cr_assert(all > le1);
    /* the shared workload compiled once: 1 + 3*2 + ... distinct keys */
    cr_assert(cache_stat(&d, "compiles") <= N - 3);
    cr_assert(healthy(&d));
    teardown(&d);
}

typedef struct {
    const char *name;
    const char *method, *path;
    const char *body; /* NULL: none; "@big": an oversize body */
    const char *ctype;
    const char *auth; /* NULL: the good token */
    long status;
    const char *code;
    const char *field; /* NULL: not checked */
} bad_case;

Test(daemon, bad_inputs_table)
{
    tlmd d;
    setup_dir(&d);
    char tok[400];
    snprintf(tok, sizeof tok, "%s/tokens", d.dir);
    FILE *f = fopen(tok, "w");
    fputs("# accepted tokens\ns3cret-token\nother-token\n", f);
    fclose(f);
    const char *extra[] = {"--token-file", tok, NULL};
    start(&d, extra);
    static const char W[] = "[{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8}}]";
    char ok_body[256], big[64];
    snprintf(ok_body, sizeof ok_body, "{\"target\":\"cpu\",\"workloads\":%s}", W);
    snprintf(big, sizeof big, "@big");
    char b[48][512];
    int nb = 0;
#define B(...) (snprintf(b[nb], sizeof b[nb], __VA_ARGS__), b[nb++])
    const bad_case cases[] = {
        {"truncated json", "POST", "/v1/compile", "{\"target\":\"cpu\",\"workloads\":[", NULL, NULL,
         400, "invalid_json", ""},
        {"empty body", "POST", "/v1/compile", "", NULL, NULL, 400, "invalid_json", ""},
        {"not an object", "POST", "/v1/compile", "[1,2]", NULL, NULL, 400, "invalid_field", ""},
        {"duplicate key", "POST", "/v1/compile", "{\"target\":\"cpu\",\"target\":\"cpu\"}", NULL,
         NULL, 400, "invalid_json", ""},
        {"target wrong type", "POST", "/v1/compile", B("{\"target\":7,\"workloads\":%s}", W), NULL,
         NULL, 400, "invalid_field", "target"},
        {"target missing", "POST", "/v1/compile", B("{\"workloads\":%s}", W), NULL, NULL, 400,
         "invalid_field", "target"},
        {"unknown target", "POST", "/v1/compile", B("{\"target\":\"tpu:v4\",\"workloads\":%s}", W),
         NULL, NULL, 422, "unsupported", "target"},
        {"unknown op", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"fft\",\"shape\":{\"N\":8}}]}", NULL, NULL,
         422, "unsupported", "workloads[0].op"},
        {"huge number", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":1e400,\"N\":8,"
         "\"K\":8}}]}",
         NULL, NULL, 400, NULL, NULL},
        {"huge integer", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":"
         "123456789012345678901234567890,\"N\":8,\"K\":8}}]}",
         NULL, NULL, 400, "invalid_field", "workloads[0].shape.M"},
        {"negative extent", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":-4,\"N\":8,"
         "\"K\":8}}]}",
         NULL, NULL, 400, "invalid_field", "workloads[0].shape.M"},
        {"shape wrong type", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":[8,8,8]}]}", NULL, NULL,
         400, "invalid_field", NULL},
        {"missing shape key", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8}}]}",
         NULL, NULL, 400, "invalid_field", NULL},
        {"workloads not array", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":{\"op\":\"dense\"}}", NULL, NULL, 400, "invalid_field",
         "workloads"},
        {"empty workloads", "POST", "/v1/compile", "{\"target\":\"cpu\",\"workloads\":[]}", NULL,
         NULL, 400, "invalid_field", "workloads"},
        {"unknown field", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"workloads\":%s,\"colour\":1}", W), NULL, NULL, 400,
         "invalid_field", "colour"},
        {"mode wrong", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"fast\",\"workloads\":%s}", W), NULL, NULL, 400,
         "invalid_field", "mode"},
        {"mode tune on a GPU target without a GPU", "POST", "/v1/compile",
         B("{\"target\":\"cuda:sm_90\",\"mode\":\"tune\",\"workloads\":%s}", W), NULL, NULL,
         422, "unsupported", "mode"},
        {"empty graph", "POST", "/v1/compile", "{\"target\":\"cpu\",\"graph\":{}}", NULL, NULL, 400,
         "invalid_field", "graph.inputs"},
        {"unknown model", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"model\":{\"name\":\"vgg\"}}", NULL, NULL, 422, "unsupported",
         "model.name"},
        {"topk without a model", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"topk\",\"workloads\":%s}", W), NULL, NULL, 422,
         "unsupported", "mode"},
        {"budget unknown key", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"hours\":1},\"workloads\":%s}", W),
         NULL, NULL, 400, "invalid_field", "budget"},
        {"budget trials not integer", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"budget\":{\"trials\":2.5},\"workloads\":%s}", W), NULL, NULL, 400,
         "invalid_field", "budget.trials"},
        {"strategy unknown", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"tune\",\"strategy\":\"guess\",\"workloads\":%s}", W),
         NULL, NULL, 400, "invalid_field", "strategy"},
        {"candidates too many", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"topk\",\"candidates\":1000,\"workloads\":%s}", W), NULL,
         NULL, 400, "invalid_field", "candidates"},
        {"candidates beyond long long", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"topk\",\"candidates\":4.1e111,\"workloads\":%s}", W),
         NULL, NULL, 400, "invalid_field", "candidates"},
        {"candidates not a number", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"topk\",\"candidates\":-1e300,\"workloads\":%s}", W),
         NULL, NULL, 400, "invalid_field", "candidates"},
        {"stream wrong type", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"stream\":\"yes\",\"workloads\":%s}", W), NULL, NULL, 400,
         "invalid_field", "stream"},
        {"bad epilogue", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":"
         "8},\"epilogue\":[\"sparkle\"]}]}",
         NULL, NULL, 422, "unsupported", "workloads[0].epilogue[0]"},
        {"oversize body", "POST", "/v1/compile", big, NULL, NULL, 413, "body_too_large", ""},
        {"wrong method", "GET", "/v1/compile", NULL, NULL, NULL, 405, "method_not_allowed", ""},
        {"wrong method on get route", "POST", "/v1/version", "{}", NULL, NULL, 405,
         "method_not_allowed", ""},
        {"wrong content type", "POST", "/v1/compile", ok_body, "text/plain", NULL, 415,
         "unsupported_media_type", ""},
        {"unknown route", "GET", "/v2/everything", NULL, NULL, NULL, 404, "not_found", ""},
        {"unknown kernel", "GET",
         "/v1/kernels/0000000000000000000000000000000000000000000000000000000000000000", NULL, NULL,
         NULL, 404, "not_found", NULL},
        {"malformed kernel key", "GET", "/v1/kernels/xyz", NULL, NULL, NULL, 404, "not_found",
         NULL},
        {"unknown job", "GET", "/v1/jobs/j999999", NULL, NULL, NULL, 404, "not_found", NULL},
        {"no token", "POST", "/v1/compile", ok_body, NULL, "", 401, "unauthorized", ""},
        {"bad token", "POST", "/v1/compile", ok_body, NULL, "Bearer s3cret-tokeX", 401,
         "unauthorized", ""},
        {"token prefix", "POST", "/v1/compile", ok_body, NULL, "Bearer s3cret", 401, "unauthorized",
         ""},
        {"delete job without token", "DELETE", "/v1/jobs/j1", NULL, NULL, "", 401, "unauthorized",
         ""},
    };
#undef B
    size_t n = sizeof cases / sizeof cases[0];
    cr_assert(n >= 25);
    char *bigbody = malloc(2 << 20);
    memset(bigbody, ' ', 2 << 20);
    bigbody[0] = '{';
    for (size_t i = 0; i < n; i++) {
        const bad_case *c = &cases[i];
        char ct[128], au[128];
        snprintf(ct, sizeof ct, "Content-Type: %s", c->ctype ? c->ctype : "application/json");
        if (!c->auth)
            snprintf(au, sizeof au, "Authorization: Bearer s3cret-token");
        else if (c->auth[0])
            snprintf(au, sizeof au, "Authorization: %s", c->auth);
        else
            snprintf(au, sizeof au, "X-No-Auth: 1");
        const char *h[] = {ct, au, NULL};
        bool is_big = c->body && !strcmp(c->body, "@big");
        resp r = http(&d, c->method, c->path, is_big ? bigbody : c->body,
                      is_big    ? (size_t)(2 << 20)
                      : c->body ? strlen(c->body)
                                : 0,
                      h);
        cr_expect_eq(r.status, c->status, "%s: status %ld, want %ld: %s", c->name, r.status,
                     c->status, r.body.p ? r.body.p : "");
        json_t *j = r.body.p ? json_loads(r.body.p, 0, NULL) : NULL;
        json_t *e = json_object_get(j, "error");
        cr_expect(json_is_object(e), "%s: no error body: %s", c->name, r.body.p);
        if (c->code)
            cr_expect_str_eq(json_string_value(json_object_get(e, "code")), c->code, "%s", c->name);
        cr_expect(json_is_string(json_object_get(e, "message")) &&
                      json_string_length(json_object_get(e, "message")) > 0,
                  "%s: no message", c->name);
        cr_expect(json_is_string(json_object_get(e, "field")), "%s: no field", c->name);
        if (c->field && json_is_string(json_object_get(e, "field")))
            cr_expect_str_eq(json_string_value(json_object_get(e, "field")), c->field, "%s",
                             c->name);
        json_decref(j);
        resp_free(&r);
        cr_assert(healthy(&d), "unhealthy after %s", c->name);
    }
    free(bigbody);
    /* the good token works, and the server is still fine */
    const char *h[] = {"Content-Type: application/json", "Authorization: Bearer other-token", NULL};
    resp r = http(&d, "POST", "/v1/compile", ok_body, strlen(ok_body), h);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    resp_free(&r);
    resp rz = get(&d, "/readyz");
    cr_assert_eq(rz.status, 200);
    resp_free(&rz);
    teardown(&d);
}

typedef struct {
    const tlmd *d;
    int i;
    long status;
    volatile int *stop;
    int done;
} writer;

static void *sigterm_client(void *arg)
{
    writer *w = arg;
    char body[512];
    snprintf(body, sizeof body,
             "{\"target\":\"%s\",\"workloads\":[{\"op\":\"softmax\",\"shape\":{\"R\":%d,"
             "\"C\":64}},{\"op\":\"dense\",\"shape\":{\"M\":%d,\"N\":32,\"K\":32}}]}",
             w->i % 2 ? "cuda:sm_86" : "cpu", 8 + w->i, 16 + w->i);
    resp r = post(w->d, body);
    w->status = r.status;
    resp_free(&r);
    return NULL;
}

/* SIGTERM while CPU and CUDA compiles are in flight (NVRTC installs its own signal handlers
 * while it compiles: this once crashed tlmd): a job must have been in flight, every client
 * gets a complete answer or never connected, at least one got one, exit 0, store intact. */
Test(daemon, sigterm_during_jobs_exits_cleanly)
{
    tlmd d;
    setup_dir(&d);
    /* a short grace period, through a config file (which also tests its parsing) */
    char conf[400];
    snprintf(conf, sizeof conf, "%s/tlmd.conf", d.dir);
    FILE *f = fopen(conf, "w");
    fputs("# test configuration\ngrace_s = 2\njob_timeout_s = 120\n", f);
    fclose(f);
    const char *extra[] = {"--config", conf, NULL};
    start(&d, extra);
    enum { N = 6 };
    writer ws[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        ws[i] = (writer){&d, i, -1, NULL, 0};
        pthread_create(&th[i], NULL, sigterm_client, &ws[i]);
    }
    /* wait until work is in flight */
    double t0 = tlm_now_s();
    double in_flight = 0;
    while (tlm_now_s() - t0 < 60 && (in_flight = metric(&d, "tlmd_jobs_in_flight")) < 1)
        usleep(10000);
    cr_assert_geq(in_flight, 1, "no job was ever in flight: the test would prove nothing");
    int st = stop_with(&d, SIGTERM, 30);
    cr_assert(st >= 0, "tlmd did not exit after SIGTERM; see %s", d.log);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    int answered = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        /* finished in the grace period, refused/failed as shutting down, or never connected */
        cr_assert(ws[i].status == 200 || ws[i].status == 503 || ws[i].status == 0,
                  "client %d got %ld", i, ws[i].status);
        answered += ws[i].status == 200 || ws[i].status == 503;
    }
    cr_assert_geq(answered, 1, "no client got a complete answer (200 or 503)");
    /* the store is consistent and the daemon starts again on it */
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(d.store, &db), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(db);
    teardown(&d);
}

static void *kill9_writer(void *arg)
{
    writer *w = arg;
    for (int n = 0; !*w->stop && n < 200; n++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"target\":\"%s\",\"workloads\":[{\"op\":\"elementwise\",\"shape\":{\"N\":%d},"
                 "\"epilogue\":[\"relu\"]},{\"op\":\"transpose\",\"shape\":{\"R\":%d,\"C\":16}}]}",
                 w->i % 2 ? "cuda:sm_75" : "cpu", 64 * (w->i * 1000 + n + 1), w->i * 1000 + n + 1);
        resp r = post(w->d, body);
        if (r.status == 200) w->done++;
        resp_free(&r);
        if (r.status == 0) break;
    }
    return NULL;
}

Test(daemon, kill9_mid_writes_keeps_store_intact)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    enum { N = 3 };
    volatile int stop = 0;
    writer ws[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        ws[i] = (writer){&d, i, 0, &stop, 0};
        pthread_create(&th[i], NULL, kill9_writer, &ws[i]);
    }
    double t0 = tlm_now_s();
    /* some kernels are committed, and more writes are under way */
    while (tlm_now_s() - t0 < 60 && metric(&d, "tlmd_compiles_total") < 4)
        usleep(20000);
    usleep(150000);
    kill(d.pid, SIGKILL);
    waitpid(d.pid, NULL, 0);
    d.pid = 0;
    stop = 1;
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(d.store, &db), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(db);
    /* it restarts on the same store, which still holds the committed kernels */
    start(&d, NULL);
    cr_assert(cache_stat(&d, "kernels") >= 1);
    resp r = post(&d, "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"elementwise\",\"shape\":"
                      "{\"N\":64},\"epilogue\":[\"relu\"]}]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    resp_free(&r);
    teardown(&d);
}

static void start_with_conf(tlmd *d, const char *conf_text)
{
    char conf[400];
    snprintf(conf, sizeof conf, "%s/tlmd.conf", d->dir);
    FILE *f = fopen(conf, "w");
    fputs(conf_text, f);
    fclose(f);
    const char *extra[] = {"--config", conf, NULL};
    start(d, extra);
}

static void *long_job(void *arg)
{
    writer *w = arg;
    char body[4096] = "{\"target\":\"cuda:sm_90\",\"workloads\":[";
    for (int i = 0; i < 16; i++)
        snprintf(body + strlen(body), sizeof body - strlen(body),
                 "%s{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":%d,\"H\":12,\"W\":12,\"F\":16,"
                 "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
                 i ? "," : "", 4 + i);
    strcat(body, "]}");
    resp r = post(w->d, body);
    w->status = r.status;
    if (r.body.p) w->done = strstr(r.body.p, "\"unavailable\"") != NULL;
    resp_free(&r);
    return NULL;
}

Test(daemon, queue_full_then_cancel)
{
    tlmd d;
    setup_dir(&d);
    start_with_conf(&d, "max_jobs = 1\n");
    const char *cached = "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"elementwise\",\"shape\":"
                         "{\"N\":64},\"epilogue\":[\"relu\"]}]}";
    resp r0 = post(&d, cached);
    cr_assert_eq(r0.status, 200, "%s", r0.body.p);
    resp_free(&r0);
    writer w = {&d, 0, -1, NULL, 0};
    pthread_t th;
    pthread_create(&th, NULL, long_job, &w);
    double t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 30 && metric(&d, "tlmd_jobs_in_flight") < 1)
        usleep(5000);
    /* one job in flight is the limit: a cached kernel is still served (hits never wait for
     * compile slots), one that needs a compile of its own is refused with 429, and so is a
     * request with both (nothing of it compiles) */
    for (int i = 0; i < 3; i++) {
        resp h = post(&d, cached);
        cr_assert_eq(h.status, 200, "%ld %s", h.status, h.body.p);
        json_t *hj = body_json(&h);
        json_t *k0 = json_array_get(json_object_get(hj, "kernels"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(k0, "cache")), "hit", "%s", h.body.p);
        json_decref(hj);
        resp_free(&h);
    }
    const char *bodies[] = {
        "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":8,"
        "\"N\":8,\"K\":8}}]}",
        "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"elementwise\",\"shape\":{\"N\":64},"
        "\"epilogue\":[\"relu\"]},{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":9}}]}",
    };
    for (int i = 0; i < 2; i++) {
        resp r = post(&d, bodies[i]);
        cr_assert_eq(r.status, 429, "%ld %s", r.status, r.body.p);
        json_t *j = body_json(&r);
        json_t *e = json_object_get(j, "error");
        cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "queue_full");
        cr_assert(strstr(json_string_value(json_object_get(e, "message")), "not cached"), "%s",
                  r.body.p);
        json_decref(j);
        resp_free(&r);
    }
    cr_assert_eq(metric(&d, "tlmd_jobs_in_flight"), 1, "the refused jobs are over");
    /* the compile put the kernel in the hot cache: the hits were answered from memory */
    cr_assert_geq(metric(&d, "tlmd_hot_cache_hits_total"), 3);
    /* cancel it: its client gets 503, the job record says cancelled (the id, unique across
     * restarts, is in the log's job_start line) */
    char id[64], path[96];
    logged_job_id(&d, "target=cuda:sm_90", id);
    cr_assert(id[0], "no job_start in %s", d.log);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    resp c = http(&d, "DELETE", path, NULL, 0, NULL);
    cr_assert_eq(c.status, 200, "%s", c.body.p);
    resp_free(&c);
    pthread_join(th, NULL);
    cr_assert_eq(w.status, 503);
    cr_assert(w.done, "the cancelled job's answer is an \"unavailable\" error");
    resp g = get(&d, path);
    cr_assert_eq(g.status, 200);
    cr_assert(strstr(g.body.p, "\"cancelled\""), "%s", g.body.p);
    resp_free(&g);
    cr_assert_eq(metric(&d, "tlmd_jobs_in_flight"), 0);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(daemon, job_deadline_fails_cleanly)
{
    tlmd d;
    setup_dir(&d);
    start_with_conf(&d, "job_timeout_s = 0.05\n");
    writer w = {&d, 0, -1, NULL, 0};
    long_job(&w); /* 16 NVRTC compiles never fit in 50 ms */
    cr_assert_eq(w.status, 503);
    cr_assert(w.done);
    cr_assert_eq(metric(&d, "tlmd_jobs_in_flight"), 0);
    cr_assert(healthy(&d));
    teardown(&d);
}

/* A row of the store's measurements for one workload on one target. */
typedef struct {
    char schedule[4096], status[32], source[16];
    double median_s, min_s;
    int n_samples;
    bool has_context; /* workload_json, target_name, toolchain_id, sentence, host_id, model_id */
} meas_row;

static int read_measurements(const char *store, const char *whash, const char *target_name,
                             meas_row *rows, int cap)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(store, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(
        sqlite3_prepare_v2(db,
                           "SELECT schedule, status, schedule_source, median_s, min_s, "
                           "n_samples, workload_json IS NOT NULL AND target_name IS NOT "
                           "NULL AND toolchain_id IS NOT NULL AND sentence IS NOT NULL AND "
                           "host_id IS NOT NULL AND model_id IS NOT NULL FROM measurements "
                           "WHERE workload_hash = ?1 AND target_name = ?2 ORDER BY id",
                           -1, &s, NULL),
        SQLITE_OK, "%s", sqlite3_errmsg(db));
    sqlite3_bind_text(s, 1, whash, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, target_name, -1, SQLITE_STATIC);
    int n = 0;
    while (sqlite3_step(s) == SQLITE_ROW && n < cap) {
        meas_row *r = &rows[n++];
        snprintf(r->schedule, sizeof r->schedule, "%s", (const char *)sqlite3_column_text(s, 0));
        snprintf(r->status, sizeof r->status, "%s", (const char *)sqlite3_column_text(s, 1));
        const unsigned char *src = sqlite3_column_text(s, 2);
        snprintf(r->source, sizeof r->source, "%s", src ? (const char *)src : "");
        r->median_s = sqlite3_column_type(s, 3) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 3);
        r->min_s = sqlite3_column_type(s, 4) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 4);
        r->n_samples = sqlite3_column_int(s, 5);
        r->has_context = sqlite3_column_int(s, 6) != 0;
    }
    sqlite3_finalize(s);
    sqlite3_close(db);
    return n;
}

Test(daemon, topk_measured_on_this_cpu_model_score_elsewhere)
{
    tlmd d;
    setup_dir(&d);
    const char *extra[] = {"--serve-untrained", NULL};
    start(&d, extra); /* topk ranks the model's candidates */
    const char *targets[] = {"cpu", "cuda:sm_80"};
    const char *want[] = {"measured", "model_score"};
    char whash[2][65], sched[2][4096];
    json_int_t cands[2], recs[2];
    for (int i = 0; i < 2; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"target\":\"%s\",\"mode\":\"topk\",\"candidates\":3,\"workloads\":[{\"op\":"
                 "\"dense\",\"shape\":{\"M\":32,\"N\":32,\"K\":16}}]}",
                 targets[i]);
        resp r = post(&d, body);
        cr_assert_eq(r.status, 200, "%s", r.body.p);
        json_t *j = body_json(&r);
        cr_assert_str_eq(json_string_value(json_object_get(j, "mode")), "topk");
        json_t *k = json_array_get(json_object_get(j, "kernels"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(k, "selection")), want[i]);
        cr_assert_str_eq(jstr(k, "schedule_source"), "topk");
        cands[i] = json_integer_value(json_object_get(k, "candidates"));
        recs[i] = json_integer_value(json_object_get(k, "records"));
        cr_assert(cands[i] >= 2 && cands[i] <= 3, "candidates %d", (int)cands[i]);
        snprintf(whash[i], sizeof whash[i], "%s", jstr(k, "workload_hash"));
        snprintf(sched[i], sizeof sched[i], "%s", jstr(k, "schedule"));
        if (i == 0) cr_assert(json_real_value(json_object_get(k, "measured_time_s")) > 0);
        char key[65];
        snprintf(key, sizeof key, "%s", json_string_value(json_object_get(k, "key")));
        json_decref(j);
        resp_free(&r);
        /* topk and generate are different cache entries; topk repeats are hits that keep
         * their source */
        r = post(&d, body);
        j = body_json(&r);
        k = json_array_get(json_object_get(j, "kernels"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(k, "cache")), "hit");
        cr_assert_str_eq(json_string_value(json_object_get(k, "key")), key);
        cr_assert_str_eq(jstr(k, "schedule_source"), "topk");
        json_decref(j);
        resp_free(&r);
        snprintf(body, sizeof body,
                 "{\"target\":\"%s\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":32,"
                 "\"N\":32,\"K\":16}}]}",
                 targets[i]);
        r = post(&d, body);
        j = body_json(&r);
        k = json_array_get(json_object_get(j, "kernels"), 0);
        cr_assert_str_neq(json_string_value(json_object_get(k, "key")), key);
        cr_assert_str_eq(jstr(k, "schedule_source"), "tlm", "--serve-untrained: generate decodes");
        cr_assert_str_eq(jstr(j, "effective_mode"), "tlm");
        json_decref(j);
        resp_free(&r);
    }
    cr_assert_eq(metric(&d, "tlmd_measurement_records_total"), (double)(recs[0] + recs[1]));
    int st = stop_with(&d, SIGTERM, 60);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit %d; see %s", st, d.log);
    /* On this CPU every candidate was built and measured, and every one (not only the winner)
     * is a record with what a trainer needs; the chosen kernel is the fastest correct one. */
    meas_row rows[16];
    int n = read_measurements(d.store, whash[0], "cpu", rows, 16);
    cr_assert_eq(n, cands[0], "%d records for %d candidates", n, (int)cands[0]);
    cr_assert_eq(n, recs[0]);
    double best = 1e30;
    const char *best_sched = NULL;
    for (int i = 0; i < n; i++) {
        cr_assert_str_eq(rows[i].source, "topk");
        cr_assert(rows[i].has_context, "record %d lacks its context", i);
        if (strcmp(rows[i].status, "ok")) continue;
        cr_assert(rows[i].n_samples > 0 && rows[i].min_s > 0 && rows[i].min_s <= rows[i].median_s,
                  "record %d: %d samples, min %g, median %g", i, rows[i].n_samples, rows[i].min_s,
                  rows[i].median_s);
        if (rows[i].median_s < best) {
            best = rows[i].median_s;
            best_sched = rows[i].schedule;
        }
    }
    cr_assert(best_sched, "no candidate measured ok");
    cr_assert_str_eq(best_sched, sched[0], "the chosen kernel is the fastest measured candidate");
    /* Elsewhere (cuda:sm_80, no GPU here) nothing is measured: no "ok" record is invented. */
    n = read_measurements(d.store, whash[1], "cuda:sm_80", rows, 16);
    cr_assert_eq(n, recs[1]);
    for (int i = 0; i < n; i++)
        cr_assert_str_eq(rows[i].status, "build_error");
    /* the kernels table keeps the sources */
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(d.store, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db,
                                    "SELECT group_concat(schedule_source, ',') FROM (SELECT "
                                    "schedule_source FROM kernels ORDER BY schedule_source)",
                                    -1, &s, NULL),
                 SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "tlm,tlm,topk,topk");
    sqlite3_finalize(s);
    sqlite3_close(db);
    teardown(&d);
}

/* ---- what tlmd serves: weights none, untrained, trained, missing; devices ---- */

/* Runs tlmd (args after the binary, NULL-terminated; env "NAME=value" entries or NULL) in
 * cwd until it exits, at most 60 s. Returns its wait status (-1: it did not exit); out gets
 * its stdout and stderr. */
static int run_tlmd(const char *cwd, const char *const *args, const char *const *env, char *out,
                    size_t cap)
{
    char abs[4096];
    tlmd_bin(abs);
    char logp[512];
    snprintf(logp, sizeof logp, "%s/run.log", cwd);
    const char *argv[32] = {abs};
    int n = 1;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = tlmd_spawn(argv, cwd, env, logp, true);
    int st = -1;
    double t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 60) {
        if (waitpid(pid, &st, WNOHANG) == pid) break;
        st = -1;
        usleep(20000);
    }
    if (st == -1) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
    }
    out[0] = 0;
    FILE *f = fopen(logp, "r");
    if (f) {
        size_t k = fread(out, 1, cap - 1, f);
        out[k] = 0;
        fclose(f);
    }
    return st;
}

static json_t *version_json(const tlmd *d)
{
    resp v = get(d, "/v1/version");
    cr_assert_eq(v.status, 200);
    json_t *j = body_json(&v);
    resp_free(&v);
    return j;
}

/* Compiles one small dense kernel (mode NULL: the default, generate); returns its kernel
 * object (the caller decrefs). */
static json_t *compile_one(const tlmd *d, const char *mode)
{
    char body[512];
    snprintf(body, sizeof body,
             "{\"target\":\"cpu\",%s%s%s\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":16,"
             "\"N\":32,\"K\":8},\"epilogue\":[\"relu\"]}]}",
             mode ? "\"mode\":\"" : "", mode ? mode : "", mode ? "\"," : "");
    resp r = post(d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *a = body_json(&r);
    resp_free(&r);
    json_t *k = json_incref(json_array_get(json_object_get(a, "kernels"), 0));
    json_decref(a);
    cr_assert(k);
    return k;
}

Test(daemon, weights_none_serves_default_schedules)
{
    tlmd d;
    setup_dir(&d);
    const char *extra[] = {"--weights", "none", NULL}; /* the last --weights wins */
    start(&d, extra);
    json_t *v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "default");
    cr_assert(strstr(jstr(v, "schedules_reason"), "none"), "%s", jstr(v, "schedules_reason"));
    cr_assert_str_eq(jstr(v, "model_id"), "none");
    cr_assert(json_is_null(json_object_get(v, "weights")));
    cr_assert(json_is_null(json_object_get(v, "model")));
    cr_assert(json_is_false(json_object_get(v, "weights_trained")));
    cr_assert_str_eq(jstr(v, "device"), "cpu");
    cr_assert(strstr(jstr(v, "device_reason"), "no schedule model"), "%s",
              jstr(v, "device_reason"));
    json_t *modes = json_object_get(v, "modes");
    cr_assert_eq(json_array_size(modes), 3,
                 "generate, default and tune; no topk without a model");
    cr_assert_str_eq(json_string_value(json_array_get(modes, 2)), "tune");
    json_decref(v);

    json_t *k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "default");
    cr_assert_str_eq(jstr(k, "cache"), "miss");
    cr_assert_str_eq(jstr(k, "selection"), "first");
    char key[65];
    snprintf(key, sizeof key, "%s", jstr(k, "key"));
    json_decref(k);
    /* "default" names the same kernel as generate does on a server without a model */
    k = compile_one(&d, "default");
    cr_assert_str_eq(jstr(k, "key"), key);
    cr_assert_str_eq(jstr(k, "cache"), "hit");
    cr_assert_str_eq(jstr(k, "schedule_source"), "default");
    json_decref(k);
    char path[200];
    snprintf(path, sizeof path, "/v1/kernels/%s/meta", key);
    resp m = get(&d, path);
    json_t *mj = body_json(&m);
    cr_assert_str_eq(jstr(mj, "schedule_source"), "default");
    cr_assert_str_eq(jstr(mj, "model_id"), "none");
    json_decref(mj);
    resp_free(&m);
    /* topk cannot be honoured without a model: a clear 422 at "mode", not another kernel */
    resp r = post(&d, "{\"target\":\"cpu\",\"mode\":\"topk\",\"workloads\":[{\"op\":\"dense\","
                      "\"shape\":{\"M\":16,\"N\":32,\"K\":8}}]}");
    cr_assert_eq(r.status, 422, "%s", r.body.p);
    json_t *ej = body_json(&r);
    json_t *e = json_object_get(ej, "error");
    cr_assert_str_eq(jstr(e, "field"), "mode");
    cr_assert(strstr(jstr(e, "message"), "no model"), "%s", jstr(e, "message"));
    json_decref(ej);
    resp_free(&r);
    cr_assert_eq(metric(&d, "tlmd_decoder_batch_size_count"), 0, "nothing was decoded");
    teardown(&d);
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    return text;
}

Test(daemon, missing_default_weights_warn_and_serve_default)
{
    tlmd d;
    setup_dir(&d);
    /* d.dir has no model_weights/tlm.bin: the default path is missing, which is not an error */
    start_with(&d, d.dir, false, NULL, NULL);
    json_t *v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "default");
    cr_assert(strstr(jstr(v, "schedules_reason"), "model_weights/tlm.bin"), "%s",
              jstr(v, "schedules_reason"));
    cr_assert(json_is_null(json_object_get(v, "weights")));
    json_decref(v);
    json_t *k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "default");
    json_decref(k);
    const char *log = read_file(d.log);
    cr_assert(strstr(log, "level=warn msg=weights_missing"), "no warning in the log: %s", log);
    stop_with(&d, SIGTERM, 60);
    /* TLMD_WEIGHTS=none: the same through the environment, without a warning */
    unlink(d.log);
    const char *env[] = {"TLMD_WEIGHTS=none", NULL};
    start_with(&d, d.dir, false, NULL, env);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "default");
    cr_assert(strstr(jstr(v, "schedules_reason"), "TLMD_WEIGHTS none"), "%s",
              jstr(v, "schedules_reason"));
    json_decref(v);
    cr_assert(!strstr(read_file(d.log), "level=warn"), "%s", read_file(d.log));
    teardown(&d);
}

Test(daemon, unreadable_explicit_weights_are_a_startup_error)
{
    tlmd d;
    setup_dir(&d);
    char out[16384];
    /* an explicit file that does not exist: exit 2, naming the flag and the path */
    const char *a1[] = {"--store", d.store, "--weights", "/nonexistent/tlm.bin", NULL};
    int st = run_tlmd(d.dir, a1, NULL, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
    cr_assert(strstr(out, "--weights") && strstr(out, "/nonexistent/tlm.bin"), "%s", out);
    /* the environment and the config file are named too */
    const char *env[] = {"TLMD_WEIGHTS=/nonexistent/env.bin", NULL};
    const char *a2[] = {"--store", d.store, NULL};
    st = run_tlmd(d.dir, a2, env, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
    cr_assert(strstr(out, "TLMD_WEIGHTS") && strstr(out, "/nonexistent/env.bin"), "%s", out);
    char conf[400];
    snprintf(conf, sizeof conf, "%s/tlmd.conf", d.dir);
    FILE *f = fopen(conf, "w");
    fputs("weights = /nonexistent/conf.bin\n", f);
    fclose(f);
    const char *a3[] = {"--store", d.store, "--config", conf, NULL};
    st = run_tlmd(d.dir, a3, NULL, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
    cr_assert(strstr(out, "config") && strstr(out, "/nonexistent/conf.bin"), "%s", out);
    /* a file that is not a weight file */
    char junk[400];
    snprintf(junk, sizeof junk, "%s/junk.bin", d.dir);
    f = fopen(junk, "w");
    fputs("not a model at all, but long enough to have a header of 128 bytes ......"
          "...........................................................................",
          f);
    fclose(f);
    const char *a4[] = {"--store", d.store, "--weights", junk, NULL};
    st = run_tlmd(d.dir, a4, NULL, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
    cr_assert(strstr(out, "--weights") && strstr(out, "junk.bin") && strstr(out, "magic"), "%s",
              out);
    /* a bad config value is named as well */
    f = fopen(conf, "w");
    fputs("serve_untrained = maybe\n", f);
    fclose(f);
    const char *a5[] = {"--store", d.store, "--config", conf, "--weights", "none", NULL};
    st = run_tlmd(d.dir, a5, NULL, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
    cr_assert(strstr(out, "serve_untrained"), "%s", out);
    /* --help documents the choices */
    const char *a6[] = {"--help", NULL};
    st = run_tlmd(d.dir, a6, NULL, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    cr_assert(strstr(out, "--weights FILE|none") && strstr(out, "--serve-untrained") &&
                  strstr(out, "TLMD_SERVE_UNTRAINED") && strstr(out, "auto|cpu|cuda"),
              "%s", out);
    teardown(&d);
}

static void write_manifest(const tlmd *d, const char *text)
{
    char path[400];
    snprintf(path, sizeof path, "%s/MANIFEST", d->dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
}

Test(daemon, untrained_weights_serve_default_unless_serve_untrained)
{
    tlmd d;
    setup_dir(&d);
    char sha[65];
    file_sha256(d.weights, sha);
    /* 1. untrained (no MANIFEST): read, not served */
    start(&d, NULL);
    json_t *v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "default");
    cr_assert(strstr(jstr(v, "schedules_reason"), "not trained"), "%s",
              jstr(v, "schedules_reason"));
    cr_assert_str_eq(jstr(v, "weights"), d.weights);
    cr_assert(json_is_false(json_object_get(v, "weights_trained")));
    cr_assert_str_eq(jstr(json_object_get(v, "model"), "id"), sha);
    json_decref(v);
    json_t *k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "default");
    char default_key[65];
    snprintf(default_key, sizeof default_key, "%s", jstr(k, "key"));
    json_decref(k);
    cr_assert(strstr(read_file(d.log), "msg=weights_untrained"));
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);

    /* 2. --serve-untrained: the model decodes; its kernel has another key, and the default
     * kernel stays cached under its own */
    const char *extra[] = {"--serve-untrained", NULL};
    start(&d, extra);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "tlm");
    cr_assert_str_eq(jstr(v, "model_id"), sha);
    cr_assert(json_is_true(json_object_get(json_object_get(v, "model"), "served")));
    cr_assert_eq(json_array_size(json_object_get(v, "modes")), 4); /* + topk */
    json_decref(v);
    k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "tlm");
    cr_assert_str_eq(jstr(k, "cache"), "miss");
    cr_assert_str_neq(jstr(k, "key"), default_key);
    json_decref(k);
    k = compile_one(&d, "default");
    cr_assert_str_eq(jstr(k, "key"), default_key);
    cr_assert_str_eq(jstr(k, "cache"), "hit", "default kernels do not depend on the weights");
    cr_assert_str_eq(jstr(k, "schedule_source"), "default");
    json_decref(k);
    cr_assert(metric(&d, "tlmd_decoder_batch_size_count") >= 1);
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);

    /* 3. a MANIFEST for other weights does not make these trained */
    write_manifest(&d, "trained = true\nsha256 = "
                       "0000000000000000000000000000000000000000000000000000000000000000\n");
    start(&d, NULL);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "default");
    json_decref(v);
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);

    /* 4. a MANIFEST saying these weights are trained: served without the flag */
    char man[200];
    snprintf(man, sizeof man, "# how they were made\ntrained = true\nsha256 = %s\n", sha);
    write_manifest(&d, man);
    start(&d, NULL);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "tlm");
    cr_assert(json_is_true(json_object_get(v, "weights_trained")));
    cr_assert_str_eq(jstr(v, "model_id"), sha);
    json_decref(v);
    k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "tlm");
    cr_assert_str_eq(jstr(k, "cache"), "hit", "the same weights and mode as step 2: same key");
    char tlm_key[65];
    snprintf(tlm_key, sizeof tlm_key, "%s", jstr(k, "key"));
    json_decref(k);
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);

    /* 4b. the MANIFEST gives a prior on the default schedule: the model writes differently,
     * so its id (the cache key's model part) names the prior, and its kernels are not served
     * from step 4's entries */
    snprintf(man, sizeof man, "trained = true\nsha256 = %s\nprior = 3\n", sha);
    write_manifest(&d, man);
    start(&d, NULL);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "tlm");
    cr_assert_str_neq(jstr(v, "model_id"), sha);
    cr_assert_eq(strlen(jstr(v, "model_id")), 64);
    cr_assert_float_eq(json_real_value(json_object_get(json_object_get(v, "model"), "prior")), 3.0,
                       1e-9);
    json_decref(v);
    k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "tlm");
    cr_assert_str_neq(jstr(k, "key"), tlm_key);
    json_decref(k);
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);

    /* 5. trained, but the MANIFEST holds them back (serve = default: they lost to the rule of
     * thumb on the held-out evaluation): the default schedules, saying why */
    snprintf(man, sizeof man, "trained = true\nsha256 = %s\nserve = default\n", sha);
    write_manifest(&d, man);
    start(&d, NULL);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "schedules"), "default");
    cr_assert(json_is_true(json_object_get(v, "weights_trained")));
    cr_assert(strstr(jstr(v, "schedules_reason"), "serve = default"), "%s",
              jstr(v, "schedules_reason"));
    json_decref(v);
    k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "default");
    json_decref(k);
    teardown(&d);
}

/* Whether this machine has a usable GPU, as tlmd's auto would find it. */
static bool have_gpu(void)
{
    tlm_device *dev = NULL;
    tlm_error e;
    bool gpu = tlm_device_open("auto", &dev, &e) == 0 && tlm_device_kind(dev) == TLM_DEVICE_CUDA;
    tlm_device_close(dev);
    return gpu;
}

Test(daemon, device_cpu_auto_and_cuda)
{
    tlmd d;
    setup_dir(&d);
    bool gpu = have_gpu();
    /* auto with a model to decode: the GPU when there is one, else the CPU, saying why */
    const char *a1[] = {"--serve-untrained", "--device", "auto", NULL};
    start(&d, a1);
    json_t *v = version_json(&d);
    if (gpu) {
        cr_assert_str_eq(jstr(v, "device"), "cuda:0");
        cr_assert(strstr(jstr(v, "device_reason"), "auto: a CUDA driver"), "%s",
                  jstr(v, "device_reason"));
    } else {
        cr_assert_str_eq(jstr(v, "device"), "cpu");
        cr_assert(strstr(jstr(v, "device_reason"), "auto: no usable GPU ("), "%s",
                  jstr(v, "device_reason"));
    }
    json_decref(v);
    json_t *k = compile_one(&d, NULL);
    cr_assert_str_eq(jstr(k, "schedule_source"), "tlm");
    json_decref(k);
    cr_assert(strstr(read_file(d.log), "msg=device requested=auto"));
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);
    /* cpu: as asked */
    const char *a2[] = {"--serve-untrained", "--device", "cpu", NULL};
    start(&d, a2);
    v = version_json(&d);
    cr_assert_str_eq(jstr(v, "device"), "cpu");
    cr_assert_str_eq(jstr(v, "device_reason"), "requested (--device cpu)");
    json_decref(v);
    cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);
    /* cuda without a GPU: a clear start-up error, exit 2 (with one: it starts on it) */
    char out[16384];
    const char *a3[] = {"--store",           d.store,    "--weights", d.weights,
                        "--serve-untrained", "--device", "cuda",      NULL};
    if (!gpu) {
        int st = run_tlmd(d.dir, a3, NULL, out, sizeof out);
        cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
        cr_assert(strstr(out, "--device cuda"), "%s", out);
        /* even when no model is served: an explicit request that cannot be met is an error */
        const char *a4[] = {"--store", d.store, "--weights", "none", "--device", "cuda:0", NULL};
        st = run_tlmd(d.dir, a4, NULL, out, sizeof out);
        cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
        cr_assert(strstr(out, "--device cuda:0"), "%s", out);
    } else {
        const char *a5[] = {"--serve-untrained", "--device", "cuda", NULL};
        start(&d, a5);
        v = version_json(&d);
        cr_assert_str_eq(jstr(v, "device"), "cuda:0");
        json_decref(v);
        k = compile_one(&d, "topk");
        cr_assert_str_eq(jstr(k, "schedule_source"), "topk");
        json_decref(k);
        cr_assert_eq(stop_with(&d, SIGTERM, 60), 0);
    }
    /* a device name that is none of them */
    const char *a6[] = {"--store", d.store, "--device", "tpu", NULL};
    int st = run_tlmd(d.dir, a6, NULL, out, sizeof out);
    cr_assert(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d: %s", st, out);
    cr_assert(strstr(out, "--device"), "%s", out);
    teardown(&d);
}
