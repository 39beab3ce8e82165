/* test_integration.c — tlmd on loopback: the real (sanitized) daemon, started on a free port
 * with a temporary store and a tiny random model, driven with libcurl.
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
#include <openssl/evp.h>
#include <sqlite3.h>

#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"

#include "tests/common/tlmd_harness.h"

static void sha256_hex(const void *p, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int len;
    EVP_Digest(p, n, md, &len, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

static size_t b64_decode(const char *s, unsigned char *out)
{
    static const char tb[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *p = strchr(tb, *s);
        if (!p) continue;
        acc = acc << 6 | (uint32_t)(p - tb);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

static const char *header_value(const resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (char *l = r->headers.p; l && *l;) {
        char *e = strchr(l, '\n');
        if (!strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            size_t len = e ? (size_t)(e - v) : strlen(v);
            while (len && (v[len - 1] == '\r' || v[len - 1] == '\n'))
                len--;
            snprintf(out, cap, "%.*s", (int)len, v);
            return out;
        }
        l = e ? e + 1 : NULL;
    }
    return NULL;
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
        for (size_t i = 0; i < 2; i++) {
            json_t *k = json_array_get(ks, i);
            cr_assert_str_eq(json_string_value(json_object_get(k, "cache")), "miss");
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
            sha256_hex(b.body.p, b.body.n, hex);
            cr_assert_str_eq(hex, sha);
            cr_assert(header_value(&b, "X-TLM-Entry", hv, sizeof hv));
            cr_assert_str_eq(hv, json_string_value(json_object_get(k, "entry")));
            cr_assert(header_value(&b, "X-TLM-Launch", hv, sizeof hv));
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
            size_t rn = b64_decode(b64, raw);
            sha256_hex(raw, rn, hex);
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
        for (size_t i = 0; i < json_array_size(ks); i++)
            cr_assert_str_eq(json_string_value(json_object_get(json_array_get(ks, i), "cache")),
                             "hit");
        cr_assert_eq(json_integer_value(json_object_get(json_object_get(a, "stats"), "hits")), 2);
        /* the job is remembered */
        char path[128];
        snprintf(path, sizeof path, "/v1/jobs/%s", json_string_value(json_object_get(a, "job")));
        resp jr = get(&d, path);
        cr_assert_eq(jr.status, 200);
        cr_assert(strstr(jr.body.p, "\"done\""));
        resp_free(&jr);
        json_decref(a);
        resp_free(&r);
    }
    cr_assert_eq(cache_stat(&d, "compiles"), compiles);
    cr_assert_eq(cache_stat(&d, "hits"), 4);
    cr_assert_eq(metric(&d, "tlmd_compiles_total"), m_compiles);
    /* version: the model id is the weight file's SHA-256; random weights are not trained */
    resp v = get(&d, "/v1/version");
    json_t *vj = body_json(&v);
    cr_assert(json_is_false(json_object_get(vj, "weights_trained")));
    FILE *f = fopen(d.weights, "rb");
    static unsigned char wb[8 << 20];
    size_t wn = fread(wb, 1, sizeof wb, f);
    fclose(f);
    char hex[65];
    sha256_hex(wb, wn, hex);
    cr_assert_str_eq(json_string_value(json_object_get(vj, "model_id")), hex);
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
    cr_assert(header_value(&r, "Content-Type", ct, sizeof ct));
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
    start(&d, NULL);
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
    char b[40][512];
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
        {"mode tune", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"tune\",\"workloads\":%s}", W), NULL, NULL, 422,
         "unsupported", "mode"},
        {"empty graph", "POST", "/v1/compile", "{\"target\":\"cpu\",\"graph\":{}}", NULL, NULL,
         400, "invalid_field", "graph.inputs"},
        {"unknown model", "POST", "/v1/compile",
         "{\"target\":\"cpu\",\"model\":{\"name\":\"vgg\"}}", NULL, NULL, 422, "unsupported",
         "model.name"},
        {"candidates too many", "POST", "/v1/compile",
         B("{\"target\":\"cpu\",\"mode\":\"topk\",\"candidates\":1000,\"workloads\":%s}", W), NULL,
         NULL, 400, "invalid_field", "candidates"},
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
    double t0 = now_s();
    while (now_s() - t0 < 20 && metric(&d, "tlmd_jobs_in_flight") < 1)
        usleep(10000);
    int st = stop_with(&d, SIGTERM, 30);
    cr_assert(st >= 0, "tlmd did not exit after SIGTERM; see %s", d.log);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d", st);
    for (int i = 0; i < N; i++) {
        pthread_join(th[i], NULL);
        /* finished in the grace period, refused/failed as shutting down, or never connected */
        cr_assert(ws[i].status == 200 || ws[i].status == 503 || ws[i].status == 0,
                  "client %d got %ld", i, ws[i].status);
    }
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
    double t0 = now_s();
    /* some kernels are committed, and more writes are under way */
    while (now_s() - t0 < 60 && metric(&d, "tlmd_compiles_total") < 4)
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
    writer w = {&d, 0, -1, NULL, 0};
    pthread_t th;
    pthread_create(&th, NULL, long_job, &w);
    double t0 = now_s();
    while (now_s() - t0 < 30 && metric(&d, "tlmd_jobs_in_flight") < 1)
        usleep(5000);
    /* one job in flight is the limit: the next is refused with 429 */
    resp r = post(&d, "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":8,"
                      "\"N\":8,\"K\":8}}]}");
    cr_assert_eq(r.status, 429, "%ld %s", r.status, r.body.p);
    json_t *j = body_json(&r);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                     "queue_full");
    json_decref(j);
    resp_free(&r);
    /* cancel it: its client gets 503, the job record says cancelled */
    resp c = http(&d, "DELETE", "/v1/jobs/j1", NULL, 0, NULL);
    cr_assert_eq(c.status, 200, "%s", c.body.p);
    resp_free(&c);
    pthread_join(th, NULL);
    cr_assert_eq(w.status, 503);
    cr_assert(w.done, "the cancelled job's answer is an \"unavailable\" error");
    resp g = get(&d, "/v1/jobs/j1");
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

Test(daemon, topk_measured_on_this_cpu_model_score_elsewhere)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    const char *targets[] = {"cpu", "cuda:sm_80"};
    const char *want[] = {"measured", "model_score"};
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
        if (i == 0) cr_assert(json_real_value(json_object_get(k, "measured_time_s")) > 0);
        char key[65];
        snprintf(key, sizeof key, "%s", json_string_value(json_object_get(k, "key")));
        json_decref(j);
        resp_free(&r);
        /* topk and generate are different cache entries; topk repeats are hits */
        r = post(&d, body);
        j = body_json(&r);
        k = json_array_get(json_object_get(j, "kernels"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(k, "cache")), "hit");
        cr_assert_str_eq(json_string_value(json_object_get(k, "key")), key);
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
        json_decref(j);
        resp_free(&r);
    }
    teardown(&d);
}
