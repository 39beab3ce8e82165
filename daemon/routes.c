/* routes.c — the HTTP API of DESIGN §10: one route table {path pattern, methods, auth,
 * checks before the body, handler}, request decoding for /v1/compile, and the small GET routes
 * (kernels, jobs, targets, version, cache stats, health, metrics, models). Store reads run on
 * the pool; the loop never touches SQLite. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/frontend.h"
#include "compiler/lang/lang.h"
#include "daemon/tlmd.h"
#include "proto/error.h"
#include "proto/workload.h"

struct routes {
    const tlmd_env *env;
    const tlmd_status *status;
    jobs *js;
    dec *d;
    metrics *m;
};

routes *routes_new(const tlmd_env *env, const tlmd_status *status, jobs *js, dec *d, metrics *m)
{
    routes *rt = calloc(1, sizeof *rt);
    if (!rt) return NULL;
    rt->env = env;
    rt->status = status;
    rt->js = js;
    rt->d = d;
    rt->m = m;
    return rt;
}

void routes_free(routes *rt)
{
    free(rt);
}

typedef void (*route_fn)(routes *rt, http_req *r);

static void check_compile(routes *rt, http_req *r);
static void do_compile(routes *rt, http_req *r);
static void do_kernel(routes *rt, http_req *r);
static void do_job(routes *rt, http_req *r);
static void do_targets(routes *rt, http_req *r);
static void do_version(routes *rt, http_req *r);
static void do_store_read(routes *rt, http_req *r);
static void do_healthz(routes *rt, http_req *r);
static void do_readyz(routes *rt, http_req *r);
static void do_models(routes *rt, http_req *r);
static void do_cluster_measure(routes *rt, http_req *r);

/* The API. A pattern's "{name}" matches one non-empty path segment (r->arg points at it);
 * methods lists what the route takes (GET includes HEAD); auth the methods that need a
 * bearer token when tokens are configured; check runs when the headers are known (before
 * the body is read) and may decide the answer (pend); handler runs with the whole body.
 * The index of a route is its metrics label; "unknown" follows the last. */
typedef struct route {
    const char *pattern;
    const char *methods;
    const char *auth;
    route_fn check;
    route_fn handler;
} route;

enum {
    R_COMPILE,
    R_KERNEL,
    R_KERNEL_SOURCE,
    R_KERNEL_META,
    R_JOB,
    R_TARGETS,
    R_VERSION,
    R_CACHE_STATS,
    R_HEALTHZ,
    R_READYZ,
    R_METRICS,
    R_MODELS,
    R_CLUSTER_MEASURE,
    R_UNKNOWN,
    R_COUNT
};

static const route ROUTES[R_UNKNOWN] = {
    [R_COMPILE] = {"/v1/compile", "POST", "POST", check_compile, do_compile},
    [R_KERNEL] = {"/v1/kernels/{key}", "GET", NULL, NULL, do_kernel},
    [R_KERNEL_SOURCE] = {"/v1/kernels/{key}/source", "GET", NULL, NULL, do_kernel},
    [R_KERNEL_META] = {"/v1/kernels/{key}/meta", "GET", NULL, NULL, do_kernel},
    [R_JOB] = {"/v1/jobs/{id}", "GET, DELETE", "DELETE", NULL, do_job},
    [R_TARGETS] = {"/v1/targets", "GET", NULL, NULL, do_targets},
    [R_VERSION] = {"/v1/version", "GET", NULL, NULL, do_version},
    [R_CACHE_STATS] = {"/v1/cache/stats", "GET", NULL, NULL, do_store_read},
    [R_HEALTHZ] = {"/healthz", "GET", NULL, NULL, do_healthz},
    [R_READYZ] = {"/readyz", "GET", NULL, NULL, do_readyz},
    [R_METRICS] = {"/metrics", "GET", NULL, NULL, do_store_read},
    [R_MODELS] = {"/v1/models", "GET", NULL, NULL, do_models},
    [R_CLUSTER_MEASURE] = {"/v1/cluster/measure", "POST", "POST", check_compile,
                           do_cluster_measure},
};

int routes_label_count(void)
{
    return R_COUNT;
}

/* The patterns, then "unknown": one source for routing and the metrics' labels. Called once
 * at start-up, before any other thread reads it. */
const char *const *routes_labels(void)
{
    static const char *labels[R_COUNT];
    for (int i = 0; i < R_UNKNOWN; i++)
        labels[i] = ROUTES[i].pattern;
    labels[R_UNKNOWN] = "unknown";
    return labels;
}

/* Whether url matches pattern; *arg / *arg_len get the "{...}" segment. */
static bool route_match(const char *pattern, const char *url, const char **arg, size_t *arg_len)
{
    const char *p = pattern, *u = url;
    while (*p) {
        if (*p == '{') {
            size_t n = strcspn(u, "/");
            if (n == 0) return false;
            *arg = u;
            *arg_len = n;
            u += n;
            p = strchr(p, '}');
            if (!p) return false;
            p++;
        } else if (*p++ != *u++) {
            return false;
        }
    }
    return *u == 0;
}

static int route_of(const char *url, const char **arg, size_t *arg_len)
{
    for (int i = 0; i < R_UNKNOWN; i++)
        if (route_match(ROUTES[i].pattern, url, arg, arg_len)) return i;
    return R_UNKNOWN;
}

int routes_label_of(const char *tgt, size_t len)
{
    char path[512];
    const char *q = memchr(tgt, '?', len);
    size_t n = q ? (size_t)(q - tgt) : len;
    if (n >= sizeof path) return R_UNKNOWN;
    memcpy(path, tgt, n);
    path[n] = 0;
    const char *arg;
    size_t arg_len;
    return route_of(path, &arg, &arg_len);
}

/* Whether method is one of list ("GET, DELETE"); HEAD counts as GET. */
static bool method_in(const char *method, const char *list)
{
    if (!list) return false;
    const char *m = !strcmp(method, "HEAD") ? "GET" : method;
    size_t n = strlen(m);
    for (const char *s = list; (s = strstr(s, m)); s += n)
        if ((s == list || s[-1] == ' ') && (s[n] == 0 || s[n] == ',')) return true;
    return false;
}

static bool is_hex64(const char *s, size_t n)
{
    if (n != 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdef", s[i])) return false;
    return true;
}

/* ---- bearer tokens ---- */

/* Constant-time comparison: a token must not be guessable byte by byte from timings. */
static bool token_ok(const routes *rt, const char *given)
{
    bool ok = false;
    size_t gl = strlen(given);
    for (int i = 0; i < rt->env->n_tokens; i++) {
        const char *t = rt->env->tokens[i];
        size_t tl = strlen(t);
        unsigned char diff = (unsigned char)(gl != tl);
        for (size_t j = 0; j < tl; j++)
            diff |= (unsigned char)(t[j] ^ (j < gl ? given[j] : 0));
        ok |= diff == 0;
    }
    return ok;
}

static void pend(http_req *r, int status, const char *code, const char *msg, const char *field)
{
    r->pending_status = status;
    r->pending_body = proto_error_body(code, msg, field);
}

void routes_begin(void *arg, http_req *r)
{
    routes *rt = arg;
    r->route = route_of(r->url, &r->arg, &r->arg_len);
    if (r->route == R_UNKNOWN) {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %.200s (see GET /v1/version and proto/openapi.yaml)",
                 r->url);
        pend(r, 404, PROTO_CODE_NOT_FOUND, msg, "");
        return;
    }
    const route *ro = &ROUTES[r->route];
    if (!method_in(r->method, ro->methods)) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s does not take %s; allowed: %s", ro->pattern, r->method,
                 ro->methods);
        pend(r, 405, PROTO_CODE_METHOD_NOT_ALLOWED, msg, "");
        return;
    }
    if (method_in(r->method, ro->auth) && rt->env->n_tokens) {
        const char *auth = http_header(r, "Authorization");
        if (!auth || strncasecmp(auth, "Bearer ", 7) || !token_ok(rt, auth + 7)) {
            pend(r, 401, PROTO_CODE_UNAUTHORIZED,
                 auth ? "the bearer token is not accepted"
                      : "this route needs an Authorization: Bearer TOKEN header",
                 "");
            return;
        }
    }
    if (ro->check) ro->check(rt, r);
}

void routes_dispatch(void *arg, http_req *r)
{
    routes *rt = arg;
    if (r->route >= 0 && r->route < R_UNKNOWN)
        ROUTES[r->route].handler(rt, r);
    else
        http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "no such route", "");
}

/* POST /v1/compile before its body: shutting down, content type, declared length. */
static void check_compile(routes *rt, http_req *r)
{
    if (rt->status->shutting_down) {
        pend(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
        return;
    }
    const char *ct = http_header(r, "Content-Type");
    if (ct &&
        (strncasecmp(ct, "application/json", 16) || (ct[16] && ct[16] != ';' && ct[16] != ' '))) {
        char msg[200];
        snprintf(msg, sizeof msg, "Content-Type %.100s is not accepted; send application/json", ct);
        pend(r, 415, PROTO_CODE_UNSUPPORTED_MEDIA_TYPE, msg, "");
        return;
    }
    const char *cl = http_header(r, "Content-Length");
    if (cl && strtoull(cl, NULL, 10) > rt->env->cfg.max_body) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                 rt->env->cfg.max_body);
        pend(r, 413, PROTO_CODE_BODY_TOO_LARGE, msg, "");
    }
}

/* ---- POST /v1/compile (the body is decoded by request.c) ---- */

static void do_compile(routes *rt, http_req *r)
{
    if (rt->status->shutting_down) {
        http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
        return;
    }
    job_params p;
    memset(&p, 0, sizeof p);
    tlm_error e;
    tlm_err_clear(&e);
    if (request_decode_compile(rt->env, r->body, r->len, http_header(r, "Accept"), &p, &e)) {
        http_reply_tlm_error(r, &e);
        return;
    }
    /* At max_jobs the job still starts, limited to the cache: hits are answered and only a
     * kernel that needs a compile of its own gets 429 (jobs.c, over_limit). */
    job_start(rt->js, r, &p);
}

/* ---- store reads on the pool ---- */

typedef struct kop {
    routes *rt;
    uv_work_t w;
    http_req *r;
    int route;
    char key[65];
    store_kernel k;
    store_stats ss;
    int rc;
    tlm_error err;
} kop;

static void kop_detach(http_req *r)
{
    kop *op = r->op;
    if (op) op->r = NULL;
    r->op = NULL;
    r->detach = NULL;
}

static void kop_work(uv_work_t *w)
{
    kop *op = w->data;
    tlm_err_clear(&op->err);
    switch (op->route) {
    case R_KERNEL:
        op->rc = store_kernel_get(op->rt->env->st, op->key, &op->k, &op->err);
        break;
    case R_KERNEL_SOURCE:
    case R_KERNEL_META:
        op->rc = store_kernel_meta(op->rt->env->st, op->key, &op->k, &op->err);
        break;
    default:
        op->rc = store_stats_get(op->rt->env->st, &op->ss, &op->err);
    }
}

static json_t *parse_or_null(const char *s)
{
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    return j ? j : json_null();
}

static json_t *kernel_meta_json(const store_kernel *k)
{
    return json_pack(
        "{s:s, s:s*, s:s*, s:s*, s:s*, s:o, s:s*, s:s*, s:s, s:s*, s:s*, s:s*, s:o, "
        "s:s, s:I, s:I, s:I, s:I, s:s}",
        "key", k->key, "workload_hash", k->workload_hash, "target_hash", k->target_hash, "target",
        k->target_name, "compiler_id", k->compiler_id, "workload", parse_or_null(k->workload_json),
        "model_id", k->model_id, "schedule", k->schedule, "schedule_source",
        k->schedule_source ? k->schedule_source : "unknown", "sentence", k->sentence, "entry",
        k->entry, "format", k->format, "launch", parse_or_null(k->launch_json), "binary_sha256",
        k->binary_sha256, "binary_size", (json_int_t)k->binary_size, "created_at",
        (json_int_t)k->created_at, "last_used_at", (json_int_t)k->last_used_at, "hits",
        (json_int_t)k->hits, "url", "");
}

static void reply_binary(http_req *r, const store_kernel *k)
{
    const char *h[] = {"X-TLM-Entry",  k->entry,  "X-TLM-Launch", k->launch_json ? k->launch_json : "{}",
                       "X-TLM-Format", k->format, "X-TLM-SHA256", k->binary_sha256,
                       NULL};
    http_reply(r, 200, "application/octet-stream", k->binary, k->binary_size, h);
}

/* Prometheus text of the hot-kernel cache (hot.c). */
static char *hot_metrics_render(const hot *h)
{
    hot_stats s;
    hot_stats_get(h, &s);
    char *t = NULL;
    if (asprintf(&t,
                 "# HELP tlmd_hot_cache_hits_total Kernels answered from memory on the loop.\n"
                 "# TYPE tlmd_hot_cache_hits_total counter\ntlmd_hot_cache_hits_total %llu\n"
                 "# HELP tlmd_hot_cache_misses_total Lookups that went on to the store.\n"
                 "# TYPE tlmd_hot_cache_misses_total counter\ntlmd_hot_cache_misses_total %llu\n"
                 "# HELP tlmd_hot_cache_evictions_total Kernels dropped for the byte budget.\n"
                 "# TYPE tlmd_hot_cache_evictions_total counter\n"
                 "tlmd_hot_cache_evictions_total %llu\n"
                 "# HELP tlmd_hot_cache_bytes Bytes held (budget: hot_cache_bytes).\n"
                 "# TYPE tlmd_hot_cache_bytes gauge\ntlmd_hot_cache_bytes %zu\n"
                 "# HELP tlmd_hot_cache_entries Kernels held.\n"
                 "# TYPE tlmd_hot_cache_entries gauge\ntlmd_hot_cache_entries %zu\n",
                 (unsigned long long)s.hits, (unsigned long long)s.misses,
                 (unsigned long long)s.evicted, s.bytes, s.entries) < 0)
        return NULL;
    return t;
}

static void kop_after(uv_work_t *w, int status)
{
    kop *op = w->data;
    http_req *r = op->r;
    /* the reply resumes r and runs MHD, which may complete and free r: keep its server */
    http_server *srv = r ? r->srv : NULL;
    if (r) {
        r->op = NULL;
        r->detach = NULL;
        if (op->rc == TLM_ENOTFOUND && op->route != R_CACHE_STATS && op->route != R_METRICS) {
            http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "no kernel with this key", "");
        } else if (op->rc) {
            http_reply_tlm_error(r, &op->err);
        } else if (op->route == R_KERNEL) {
            reply_binary(r, &op->k);
            hot_put(op->rt->env->hot, &op->k);
        } else if (op->route == R_KERNEL_SOURCE) {
            const char *src = op->k.source ? op->k.source : "";
            bool cuda = op->k.format && !strcmp(op->k.format, "cubin");
            const char *h[] = {"X-TLM-Entry", op->k.entry, NULL};
            http_reply(r, 200, cuda ? "text/x-cuda; charset=utf-8" : "text/x-c; charset=utf-8", src,
                       strlen(src), h);
        } else if (op->route == R_KERNEL_META) {
            json_t *m = kernel_meta_json(&op->k);
            char url[128];
            snprintf(url, sizeof url, "/v1/kernels/%s", op->k.key);
            json_object_set_new(m, "url", json_string(url));
            json_object_set_new(m, "source_size",
                                json_integer(op->k.source ? (json_int_t)strlen(op->k.source) : 0));
            http_reply_json(r, 200, m);
        } else if (op->route == R_METRICS) {
            const routes *rt = op->rt;
            metrics_gauges g = {jobs_in_flight(rt->js),        jobs_flights_in_flight(rt->js),
                                dec_queue_depth(rt->d),        http_connections(r->srv),
                                http_door_connections(r->srv), http_refused(r->srv)};
            char *text = metrics_render(rt->m, &g, &op->ss);
            char *more[] = {l2_metrics_render(rt->env->l2), hot_metrics_render(rt->env->hot)};
            for (int i = 0; i < 2; i++) {
                if (text && more[i]) {
                    char *both = malloc(strlen(text) + strlen(more[i]) + 1);
                    if (both) {
                        strcpy(both, text);
                        strcat(both, more[i]);
                    }
                    free(text);
                    text = both;
                }
                free(more[i]);
            }
            if (text) {
                http_reply(r, 200, "text/plain; version=0.0.4", text, strlen(text), NULL);
                free(text);
            } else {
                http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
            }
        } else {
            json_t *o = json_pack(
                "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s}", "kernels",
                (json_int_t)op->ss.kernels, "bytes", (json_int_t)op->ss.bytes, "max_bytes",
                (json_int_t)op->ss.max_bytes, "store_hits", (json_int_t)op->ss.hits, "store_misses",
                (json_int_t)op->ss.misses, "evictions", (json_int_t)op->ss.evictions, "corrupt",
                (json_int_t)op->ss.corrupt, "hits", (json_int_t)metrics_cache_hits(op->rt->m),
                "misses", (json_int_t)metrics_cache_misses(op->rt->m), "compiles",
                (json_int_t)metrics_compiles(op->rt->m), "path", op->rt->env->cfg.store_path);
            json_object_set_new(o, "single_flight_joins",
                                json_integer((json_int_t)metrics_single_flight(op->rt->m)));
            l2 *l = op->rt->env->l2;
            json_object_set_new(o, "l2",
                                l ? json_pack("{s:b, s:b, s:s}", "enabled", 1, "up", l2_up(l),
                                              "namespace", l2_cfg(l)->ns)
                                  : json_pack("{s:b}", "enabled", 0));
            hot_stats hs;
            hot_stats_get(op->rt->env->hot, &hs);
            json_object_set_new(o, "hot",
                                json_pack("{s:b, s:I, s:I, s:I, s:I, s:I}", "enabled",
                                          op->rt->env->hot != NULL, "entries", (json_int_t)hs.entries,
                                          "bytes", (json_int_t)hs.bytes, "max_bytes",
                                          (json_int_t)hs.max_bytes, "hits", (json_int_t)hs.hits,
                                          "evictions", (json_int_t)hs.evicted));
            http_reply_json(r, 200, o);
        }
    }
    store_kernel_free(&op->k);
    free(op);
    if (srv) http_kick(srv);
}

static void start_kop(routes *rt, http_req *r, int route_id, const char *key)
{
    kop *op = calloc(1, sizeof *op);
    if (!op) {
        http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
        return;
    }
    op->rt = rt;
    op->r = r;
    op->route = route_id;
    if (key) snprintf(op->key, sizeof op->key, "%s", key);
    op->w.data = op;
    r->op = op;
    r->detach = kop_detach;
    http_suspend(r);
    uv_queue_work(rt->env->loop, &op->w, kop_work, kop_after);
}

static void do_version(routes *rt, http_req *r)
{
    const tlmd_env *env = rt->env;
    /* "model" describes the weight file that was read (null when none was), and "served"
     * says whether generate decodes with it; "schedules" is what generate serves. */
    json_t *model = json_null();
    if (env->weights_loaded[0]) {
        const tlm_config *c = &env->weights_cfg;
        model =
            json_pack("{s:s, s:s, s:s, s:b, s:b, s:i, s:i, s:i, s:i, s:i, s:I, s:f}", "id",
                      env->weights_sha, "path", env->weights_loaded, "vocab_hash", env->vocab_hash,
                      "trained", env->weights_trained, "served", env->model != NULL, "n_layer",
                      c->n_layer, "n_head", c->n_head, "n_embd", c->n_embd, "n_ctx", c->n_ctx,
                      "vocab_size", c->vocab_size, "n_params", (json_int_t)env->weights_params,
                      "prior", env->weights_prior);
    }
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:s, s:s, s:o, s:b, s:s, s:i, s:o, s:{s:s, s:s}, s:s, s:s, s:s, s:s}",
        "version", TLMD_VERSION, "api", "v1", "schedules", env->model ? "tlm" : "default",
        "schedules_reason", rt->env->schedules_reason, "model_id", env->model_id, "weights",
        env->weights_loaded[0] ? json_string(env->weights_loaded) : json_null(), "weights_trained",
        env->weights_trained, "vocab_hash", env->vocab_hash, "lang_version", LANG_VERSION, "model",
        model, "toolchain", "cc", env->cc_key, "nvrtc", env->nvrtc_key, "device", env->device_id,
        "device_name", env->device_name, "device_reason", env->device_reason, "store",
        rt->env->cfg.store_path);
    json_t *modes = json_pack("[s, s]", "generate", "default");
    if (env->model) json_array_append_new(modes, json_string("topk"));
    if (pl_has_search(PL_MODE_TUNE)) json_array_append_new(modes, json_string("tune"));
    json_object_set_new(o, "modes", modes);
    http_reply_json(r, 200, o);
}

static void do_kernel(routes *rt, http_req *r)
{
    if (!is_hex64(r->arg, r->arg_len)) {
        http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "a kernel key is 64 lowercase hex digits",
                         "key");
        return;
    }
    char key[65];
    memcpy(key, r->arg, 64);
    key[64] = 0;
    /* the binary of a hot kernel is answered in this turn of the loop (its use still counts
     * in the store); everything else, and a use the store cannot take in memory, reads */
    const store_kernel *k = r->route == R_KERNEL ? hot_get(rt->env->hot, key) : NULL;
    if (k && store_kernel_note_use(rt->env->st, key)) {
        reply_binary(r, k);
        return;
    }
    start_kop(rt, r, r->route, key);
}

static void do_job(routes *rt, http_req *r)
{
    char id[64];
    snprintf(id, sizeof id, "%.*s", (int)(r->arg_len < 63 ? r->arg_len : 63), r->arg);
    if (!strcmp(r->method, "DELETE")) {
        if (job_cancel(rt->js, id))
            http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "no such job", "id");
        else
            http_reply_json(r, 200, json_pack("{s:s, s:s}", "job", id, "state", "cancelled"));
        return;
    }
    bool found = false;
    json_t *j = job_lookup_json(rt->js, id, &found);
    if (!found)
        http_reply_error(r, 404, PROTO_CODE_NOT_FOUND,
                         "no such job (finished jobs are kept for a while, then forgotten)", "id");
    else
        http_reply_json(r, 200, j);
}

static void do_targets(routes *rt, http_req *r)
{
    const char *t = rt->env->targets_json;
    http_reply(r, 200, "application/json", t, strlen(t), NULL);
}

static void do_store_read(routes *rt, http_req *r)
{
    start_kop(rt, r, r->route, NULL);
}

static void do_models(routes *rt, http_req *r)
{
    json_t *models = fe_zoo_list_json();
    if (models)
        http_reply_json(r, 200, json_pack("{s:o}", "models", models));
    else
        http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
}

static void do_healthz(routes *rt, http_req *r)
{
    http_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

static void do_readyz(routes *rt, http_req *r)
{
    if (rt->status->ready && !rt->status->shutting_down)
        http_reply_json(r, 200, json_pack("{s:s}", "status", "ready"));
    else
        http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE,
                         rt->status->shutting_down ? "shutting down" : "starting", "");
}

/* ---- POST /v1/cluster/measure: cluster_measure for tools and benchmarks ----
 * {"target": T, "workload": W, "schedules": [S, ...], "deadline_s": D} measures every
 * schedule across the daemons sharing the Redis (cluster.h) and answers each result with the
 * daemon that measured it. It holds one thread of libuv's pool while it runs (mostly waiting
 * for results); shutdown aborts it (cluster_abort). */

#define MEASURE_MAX 4096

typedef struct cmop {
    routes *rt;
    http_req *r;
    char *workload, *target;
    char **schedules;
    int n;
    double deadline_s;
    cluster_cand *cands;
    cluster_result *res;
    int rc;
    tlm_error err;
    double wall_s;
    uv_work_t w;
} cmop;

static void cmop_free(cmop *op)
{
    for (int i = 0; i < op->n; i++)
        free(op->schedules[i]);
    free(op->schedules);
    free(op->cands);
    free(op->res);
    free(op->workload);
    free(op->target);
    free(op);
}

static void cm_detach(http_req *r)
{
    cmop *op = r->op;
    if (op) op->r = NULL;
    r->op = NULL;
    r->detach = NULL;
}

static json_t *num_or_null(double d)
{
    return isfinite(d) ? json_real(d) : json_null();
}

static void cm_done(uv_work_t *w, int status)
{
    cmop *op = w->data;
    http_req *r = op->r;
    if (r) {
        r->op = NULL;
        r->detach = NULL;
        if (op->rc && op->rc != TLM_ELIMIT) {
            http_reply_tlm_error(r, &op->err);
        } else {
            json_t *res = json_array(), *workers = json_object();
            for (int i = 0; i < op->n; i++) {
                const cluster_result *x = &op->res[i];
                json_array_append_new(
                    res, json_pack("{s:s, s:s, s:o, s:o, s:o, s:i, s:s, s:s}", "schedule",
                                   op->schedules[i], "status", x->status, "median_s",
                                   num_or_null(x->median_s), "gflops", num_or_null(x->gflops),
                                   "rel_err", num_or_null(x->rel_err), "n_samples", x->n_samples,
                                   "worker", x->worker, "detail", x->detail));
                if (x->worker[0]) {
                    json_int_t c = json_integer_value(json_object_get(workers, x->worker));
                    json_object_set_new(workers, x->worker, json_integer(c + 1));
                }
            }
            json_t *o =
                json_pack("{s:o, s:o, s:i, s:f, s:b}", "results", res, "workers", workers,
                          "candidates", op->n, "wall_s", op->wall_s, "complete", op->rc == 0);
            if (op->rc) json_object_set_new(o, "message", json_string(op->err.msg));
            http_reply_json(r, 200, o);
        }
        http_kick(r->srv);
    }
    cmop_free(op);
}

static void cm_work(uv_work_t *w)
{
    cmop *op = w->data;
    double t0 = tlmd_now();
    tlm_err_clear(&op->err);
    op->rc = cluster_measure(op->rt->env->cl, op->cands, op->n, op->res, op->deadline_s,
                             op->rt->env->st, &op->err);
    op->wall_s = tlmd_now() - t0;
}

static void do_cluster_measure(routes *rt, http_req *r)
{
    if (rt->status->shutting_down) {
        http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
        return;
    }
    json_error_t je;
    json_t *b = json_loadb(r->body ? r->body : "", r->len, 0, &je);
    if (!json_is_object(b)) {
        json_decref(b);
        http_reply_error(r, 400, PROTO_CODE_INVALID_JSON, "the body must be a JSON object", "");
        return;
    }
    json_t *tg = json_object_get(b, "target"), *wl = json_object_get(b, "workload");
    json_t *sc = json_object_get(b, "schedules"), *dl = json_object_get(b, "deadline_s");
    const char *bad = NULL, *why = NULL;
    if (!json_is_string(tg))
        bad = "target", why = "required: a target string (GET /v1/targets)";
    else if (!json_is_object(wl))
        bad = "workload", why = "required: a workload object";
    else if (!json_is_array(sc) || json_array_size(sc) == 0 || json_array_size(sc) > MEASURE_MAX)
        bad = "schedules", why = "required: an array of 1..4096 schedule strings";
    else if (dl &&
             !(json_is_number(dl) && json_number_value(dl) > 0 && json_number_value(dl) <= 86400))
        bad = "deadline_s", why = "a number of seconds in (0, 86400]";
    for (size_t i = 0; !bad && i < json_array_size(sc); i++)
        if (!json_is_string(json_array_get(sc, i)))
            bad = "schedules", why = "every schedule must be a string";
    if (bad) {
        json_decref(b);
        http_reply_error(r, 400, PROTO_CODE_INVALID_FIELD, why, bad);
        return;
    }
    cmop *op = calloc(1, sizeof *op);
    int n = (int)json_array_size(sc);
    if (op) {
        op->rt = rt;
        op->n = n;
        op->deadline_s = dl ? json_number_value(dl) : rt->env->cfg.job_timeout_s;
        op->workload = json_dumps(wl, JSON_COMPACT);
        op->target = strdup(json_string_value(tg));
        op->schedules = calloc((size_t)n, sizeof *op->schedules);
        op->cands = calloc((size_t)n, sizeof *op->cands);
        op->res = calloc((size_t)n, sizeof *op->res);
    }
    bool ok = op && op->workload && op->target && op->schedules && op->cands && op->res;
    for (int i = 0; ok && i < n; i++) {
        op->schedules[i] = strdup(json_string_value(json_array_get(sc, i)));
        ok = op->schedules[i] != NULL;
        op->cands[i] = (cluster_cand){op->workload, op->target, op->schedules[i], 0};
    }
    json_decref(b);
    if (!ok) {
        if (op) cmop_free(op);
        http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
        return;
    }
    /* bad workloads and targets are answered now, before anything is measured */
    ir_workload w;
    target t;
    tlm_error e;
    tlm_err_clear(&e);
    const char *field = NULL;
    if (proto_workload_from_string(op->workload, strlen(op->workload), &w, &e))
        field = "workload";
    else if (target_parse(op->target, &t, &e))
        field = "target";
    if (field) {
        char f[128];
        snprintf(f, sizeof f, "%s%s%.80s", field, e.field[0] ? "." : "", e.field);
        cmop_free(op);
        http_reply_error(r, e.code == TLM_EUNSUPPORTED ? 422 : 400, PROTO_CODE_INVALID_FIELD, e.msg,
                         !strcmp(field, "target") ? "target" : f);
        return;
    }
    r->op = op;
    r->detach = cm_detach;
    op->r = r;
    op->w.data = op;
    http_suspend(r);
    uv_queue_work(rt->env->loop, &op->w, cm_work, cm_done);
}
