/* routes.c — the HTTP API of DESIGN §10: routing, method/auth/content checks, request
 * decoding for /v1/compile, and the small GET routes (kernels, jobs, targets, version, cache
 * stats, health, metrics). Store reads run on the pool; the loop never touches SQLite. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/frontend.h"
#include "compiler/lang/lang.h"
#include "daemon/tlmd.h"
#include "proto/error.h"
#include "proto/workload.h"

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
    R_UNKNOWN,
    R_COUNT
};
static const char *const labels[R_COUNT] = {"/v1/compile",
                                            "/v1/kernels/{key}",
                                            "/v1/kernels/{key}/source",
                                            "/v1/kernels/{key}/meta",
                                            "/v1/jobs/{id}",
                                            "/v1/targets",
                                            "/v1/version",
                                            "/v1/cache/stats",
                                            "/healthz",
                                            "/readyz",
                                            "/metrics",
                                            "/v1/models",
                                            "unknown"};

int routes_label_count(void)
{
    return R_COUNT;
}
const char *routes_label(int i)
{
    return i >= 0 && i < R_COUNT ? labels[i] : "unknown";
}

static bool is_hex64(const char *s, size_t n)
{
    if (n != 64) return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789abcdef", s[i])) return false;
    return true;
}

/* Route of a URL; *arg points at the key or job id inside it. */
static int route_of(const char *url, const char **arg, size_t *arg_len)
{
    static const struct {
        const char *path;
        int route;
    } fixed[] = {{"/v1/compile", R_COMPILE}, {"/v1/targets", R_TARGETS},
                 {"/v1/version", R_VERSION}, {"/v1/cache/stats", R_CACHE_STATS},
                 {"/healthz", R_HEALTHZ},    {"/readyz", R_READYZ},
                 {"/metrics", R_METRICS},    {"/v1/models", R_MODELS}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (!strcmp(url, fixed[i].path)) return fixed[i].route;
    if (!strncmp(url, "/v1/kernels/", 12)) {
        const char *k = url + 12;
        const char *slash = strchr(k, '/');
        *arg = k;
        *arg_len = slash ? (size_t)(slash - k) : strlen(k);
        if (!slash) return R_KERNEL;
        if (!strcmp(slash, "/source")) return R_KERNEL_SOURCE;
        if (!strcmp(slash, "/meta")) return R_KERNEL_META;
        return R_UNKNOWN;
    }
    if (!strncmp(url, "/v1/jobs/", 9) && url[9] && !strchr(url + 9, '/')) {
        *arg = url + 9;
        *arg_len = strlen(url + 9);
        return R_JOB;
    }
    return R_UNKNOWN;
}

/* ---- bearer tokens ---- */

int routes_load_tokens(tlmd_server *s, tlm_error *err)
{
    if (!s->cfg.token_file[0]) return 0;
    FILE *f = fopen(s->cfg.token_file, "r");
    if (!f)
        return tlm_err_set(err, TLM_EINVAL, "token_file", "cannot open %s: %s", s->cfg.token_file,
                           strerror(errno));
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, " \t\r\n");
        if (!n || line[0] == '#') continue;
        line[n] = 0;
        char **p = realloc(s->tokens, (size_t)(s->n_tokens + 1) * sizeof *p);
        if (!p || !(p[s->n_tokens] = strdup(line))) {
            fclose(f);
            return tlm_err_set(err, TLM_ENOMEM, "token_file", "out of memory");
        }
        s->tokens = p;
        s->n_tokens++;
    }
    fclose(f);
    if (!s->n_tokens)
        return tlm_err_set(err, TLM_EINVAL, "token_file", "%s holds no token", s->cfg.token_file);
    return 0;
}

/* Constant-time comparison: a token must not be guessable byte by byte from timings. */
static bool token_ok(const char *given)
{
    bool ok = false;
    size_t gl = strlen(given);
    for (int i = 0; i < g_srv.n_tokens; i++) {
        const char *t = g_srv.tokens[i];
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

void routes_begin(http_req *r)
{
    const char *arg = NULL;
    size_t alen = 0;
    r->route = route_of(r->url, &arg, &alen);
    const char *m = r->method;
    bool get = !strcmp(m, "GET") || !strcmp(m, "HEAD");
    const char *allow = NULL;
    switch (r->route) {
    case R_UNKNOWN: {
        char msg[300];
        snprintf(msg, sizeof msg, "no route %.200s (see GET /v1/version and proto/openapi.yaml)",
                 r->url);
        pend(r, 404, PROTO_CODE_NOT_FOUND, msg, "");
        return;
    }
    case R_COMPILE:
        if (strcmp(m, "POST")) allow = "POST";
        break;
    case R_JOB:
        if (!get && strcmp(m, "DELETE")) allow = "GET, DELETE";
        break;
    default:
        if (!get) allow = "GET";
    }
    if (allow) {
        char msg[128];
        snprintf(msg, sizeof msg, "%s does not take %s; allowed: %s", labels[r->route], m, allow);
        pend(r, 405, PROTO_CODE_METHOD_NOT_ALLOWED, msg, "");
        return;
    }
    bool guarded = r->route == R_COMPILE || (r->route == R_JOB && !strcmp(m, "DELETE"));
    if (guarded && g_srv.n_tokens) {
        const char *auth = http_header(r, "Authorization");
        if (!auth || strncasecmp(auth, "Bearer ", 7) || !token_ok(auth + 7)) {
            pend(r, 401, PROTO_CODE_UNAUTHORIZED,
                 auth ? "the bearer token is not accepted"
                      : "this route needs an Authorization: Bearer TOKEN header",
                 "");
            return;
        }
    }
    if (r->route == R_COMPILE) {
        if (g_srv.shutting_down) {
            pend(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
            return;
        }
        const char *ct = http_header(r, "Content-Type");
        if (ct && (strncasecmp(ct, "application/json", 16) ||
                   (ct[16] && ct[16] != ';' && ct[16] != ' '))) {
            char msg[200];
            snprintf(msg, sizeof msg, "Content-Type %.100s is not accepted; send application/json",
                     ct);
            pend(r, 415, PROTO_CODE_UNSUPPORTED_MEDIA_TYPE, msg, "");
            return;
        }
        const char *cl = http_header(r, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > g_srv.cfg.max_body) {
            char msg[128];
            snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                     g_srv.cfg.max_body);
            pend(r, 413, PROTO_CODE_BODY_TOO_LARGE, msg, "");
        }
    }
}

/* ---- POST /v1/compile ---- */

static int bad(tlm_error *e, int code, const char *field, const char *msg)
{
    return tlm_err_set(e, code, field, "%s", msg);
}

/* A network has many more kernels than a hand-written request: its unique subgraphs may
 * number 16 x max_workloads (1024 at the defaults; LLaMA-7B has 14, EfficientNet-B0 68). */
#define NET_WORKLOADS_FACTOR 16

/* "graph" or "model" → fused, deduplicated subgraphs as the job's workloads, with their
 * occurrence counts, anchor names and the network's summary. Building and fusing a zoo model
 * takes milliseconds (LLaMA-7B is ~1,000 nodes), so it runs here on the loop thread. */
static int decode_network(const json_t *j, job_params *p, tlm_error *e)
{
    const json_t *gj = json_object_get(j, "graph");
    const char *kind = gj ? "graph" : "model";
    double t0 = tlmd_now();
    fe_graph *g = NULL;
    int rc;
    if (gj) {
        if (!json_is_object(gj))
            return bad(e, TLM_EINVAL, "graph",
                       "must be a graph object {\"inputs\", \"nodes\", \"outputs\"} "
                       "(proto/graph.md)");
        rc = fe_graph_from_json(gj, &g, e);
    } else {
        /* fields come back as "model.name", "model.batch", ... */
        rc = fe_zoo_from_json(json_object_get(j, "model"), &g, e);
        /* an unknown name is a name outside our list, like an unknown op: not a missing
         * resource (404 would read as "no such route") */
        if (rc == TLM_ENOTFOUND) e->code = rc = TLM_EUNSUPPORTED;
    }
    if (rc) {
        if (gj) proto_error_prefix(e, "graph");
        return rc;
    }
    fe_fused fu;
    rc = fe_fuse(g, &fu, e);
    if (rc) {
        proto_error_prefix(e, kind);
        fe_graph_free(g);
        return rc;
    }
    int limit = g_srv.cfg.max_workloads * NET_WORKLOADS_FACTOR;
    if (fu.n > limit) {
        rc = tlm_err_set(e, TLM_ELIMIT, kind, "the %s fuses into %d unique subgraphs; at most %d",
                         kind, fu.n, limit);
        goto out;
    }
    if (fu.n == 0) {
        rc = tlm_err_set(e, TLM_EINVAL, gj ? "graph.nodes" : "model",
                         "the %s has no kernel to compile (only views)", kind);
        goto out;
    }
    p->n = fu.n;
    p->wl = calloc((size_t)fu.n, sizeof *p->wl);
    p->occ = calloc((size_t)fu.n, sizeof *p->occ);
    p->node = calloc((size_t)fu.n, sizeof *p->node);
    if (!p->wl || !p->occ || !p->node) {
        rc = bad(e, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    for (int i = 0; i < fu.n; i++) {
        p->wl[i] = fu.sub[i].wl;
        p->occ[i] = fu.sub[i].count;
        snprintf(p->node[i], sizeof p->node[i], "%s", fu.sub[i].name);
    }
    json_t *name = g->name ? json_string(g->name) : NULL;
    p->model = json_pack("{s:s, s:o, s:i, s:I, s:I, s:I, s:f}", "kind", kind, "name",
                         name ? name : json_null(), "subgraphs", fu.n, "launches",
                         (json_int_t)fu.launches, "flops", (json_int_t)fu.flops, "macs",
                         (json_int_t)fu.macs, "fuse_s", tlmd_now() - t0);
    if (!p->model) rc = bad(e, TLM_ENOMEM, "", "out of memory");
    if (!gj && p->model) {
        /* the options as built, defaults filled in */
        const fe_zoo_info *zi = fe_zoo_find(g->name);
        json_t *mj = json_object_get(j, "model");
        static const struct {
            const char *key;
            unsigned bit;
        } opts[] = {{"batch", FE_ZOO_BATCH},
                    {"image_size", FE_ZOO_IMAGE_SIZE},
                    {"seq_len", FE_ZOO_SEQ_LEN}};
        for (int i = 0; zi && i < 3; i++) {
            if (!(zi->options & opts[i].bit)) continue;
            json_t *v = json_object_get(mj, opts[i].key);
            int64_t d = i == 0 ? zi->defaults.batch
                               : i == 1 ? zi->defaults.image_size : zi->defaults.seq_len;
            json_object_set_new(p->model, opts[i].key,
                                v ? json_incref(v) : json_integer((json_int_t)d));
        }
    }
out:
    fe_fused_free(&fu);
    fe_graph_free(g);
    if (rc) job_params_free(p);
    return rc;
}

static int decode_compile(http_req *r, job_params *p, tlm_error *e)
{
    if (!r->body || !r->len) return bad(e, PROTO_EJSON, "", "the request body is empty");
    json_error_t je;
    unsigned flags = 0;
    json_t *j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES, &je);
    if (!j && strstr(je.text, "too big")) {
        /* Integers beyond int64: re-read as reals so the field is named (proto/workload.h). */
        j = json_loadb(r->body, r->len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
        flags = PROTO_DECODE_INTS_AS_REAL;
    }
    if (!j)
        return tlm_err_set(e, PROTO_EJSON, "", "the body is not JSON: %s (line %d, column %d)",
                           je.text, je.line, je.column);
    int rc = 0;
    const char *key;
    json_t *v;
    if (!json_is_object(j)) {
        rc = bad(e, TLM_EINVAL, "", "the body must be a JSON object");
        goto out;
    }
    json_object_foreach(j, key, v)
    {
        static const char *const known[] = {"target",         "workloads",  "graph",  "model",
                                            "mode",           "candidates", "budget", "stream",
                                            "include_binary", NULL};
        bool ok = false;
        for (int i = 0; known[i]; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok) {
            rc = tlm_err_set(e, TLM_EINVAL, key,
                             "unknown field; allowed: target, workloads, graph, model, mode, "
                             "candidates, budget, stream, include_binary");
            goto out;
        }
    }
    json_t *t = json_object_get(j, "target");
    if (!t) {
        rc = bad(e, TLM_EINVAL, "target",
                 "missing: a target string such as \"cpu\" or "
                 "\"cuda:sm_90\"");
        goto out;
    }
    if (!json_is_string(t)) {
        rc = bad(e, TLM_EINVAL, "target", "must be a string such as \"cpu\" or \"cuda:sm_90\"");
        goto out;
    }
    if ((rc = target_parse(json_string_value(t), &p->tgt, e))) {
        snprintf(e->field, sizeof e->field, "target");
        goto out;
    }
    json_t *mode = json_object_get(j, "mode");
    p->mode = MODE_GENERATE;
    p->k = 1;
    if (mode) {
        const char *ms = json_string_value(mode);
        if (!ms) {
            rc = bad(e, TLM_EINVAL, "mode", "must be \"generate\", \"topk\" or \"tune\"");
            goto out;
        }
        if (!strcmp(ms, "topk")) {
            p->mode = MODE_TOPK;
            p->k = 4 < g_srv.cfg.max_candidates ? 4 : g_srv.cfg.max_candidates;
        } else if (!strcmp(ms, "tune")) {
            rc = bad(e, TLM_EUNSUPPORTED, "mode",
                     "mode \"tune\" is not yet supported; use \"generate\" or \"topk\"");
            goto out;
        } else if (strcmp(ms, "generate")) {
            rc = bad(e, TLM_EINVAL, "mode", "must be \"generate\", \"topk\" or \"tune\"");
            goto out;
        }
    }
    json_t *cand = json_object_get(j, "candidates");
    if (cand) {
        double d = json_number_value(cand);
        if (!json_is_number(cand) || d != (double)(long long)d || d < 1 ||
            d > g_srv.cfg.max_candidates) {
            rc = tlm_err_set(e, TLM_EINVAL, "candidates", "must be an integer in [1, %d]",
                             g_srv.cfg.max_candidates);
            goto out;
        }
        if (p->mode == MODE_TOPK) p->k = (int)d;
    }
    json_t *b = json_object_get(j, "budget");
    if (b && !json_is_object(b)) {
        rc = bad(e, TLM_EINVAL, "budget", "must be an object {\"trials\": n, \"seconds\": s}");
        goto out;
    }
    static const char *const bools[] = {"stream", "include_binary"};
    for (int i = 0; i < 2; i++) {
        json_t *x = json_object_get(j, bools[i]);
        if (x && !json_is_boolean(x)) {
            rc = bad(e, TLM_EINVAL, bools[i], "must be true or false");
            goto out;
        }
    }
    p->stream = json_is_true(json_object_get(j, "stream"));
    p->include_binary = json_is_true(json_object_get(j, "include_binary"));
    const char *accept = http_header(r, "Accept");
    if (accept && strstr(accept, "application/x-ndjson")) p->stream = true;
    json_t *wls = json_object_get(j, "workloads");
    int given = !!wls + !!json_object_get(j, "graph") + !!json_object_get(j, "model");
    if (given != 1) {
        rc = bad(e, TLM_EINVAL, given ? "" : "workloads",
                 "give exactly one of \"workloads\", \"graph\" or \"model\"");
        goto out;
    }
    if (!wls) {
        rc = decode_network(j, p, e);
        goto out;
    }
    if (!json_is_array(wls) || json_array_size(wls) == 0) {
        rc = bad(e, TLM_EINVAL, "workloads", "must be a non-empty array of workload objects");
        goto out;
    }
    if ((int)json_array_size(wls) > g_srv.cfg.max_workloads) {
        rc = tlm_err_set(e, TLM_ELIMIT, "workloads", "at most %d workloads per request",
                         g_srv.cfg.max_workloads);
        goto out;
    }
    p->n = (int)json_array_size(wls);
    p->wl = calloc((size_t)p->n, sizeof *p->wl);
    if (!p->wl) {
        rc = bad(e, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    for (int i = 0; i < p->n; i++) {
        if ((rc =
                 proto_workload_decode_opts(json_array_get(wls, (size_t)i), flags, &p->wl[i], e))) {
            char pre[32];
            snprintf(pre, sizeof pre, "workloads[%d]", i);
            proto_error_prefix(e, pre);
            goto out;
        }
    }
out:
    json_decref(j);
    if (rc) job_params_free(p);
    return rc;
}

static void do_compile(http_req *r)
{
    if (g_srv.shutting_down) {
        http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
        return;
    }
    job_params p;
    memset(&p, 0, sizeof p);
    tlm_error e;
    tlm_err_clear(&e);
    if (decode_compile(r, &p, &e)) {
        http_reply_tlm_error(r, &e);
        return;
    }
    if (g_srv.jobs_in_flight >= g_srv.cfg.max_jobs) {
        job_params_free(&p);
        char msg[128];
        snprintf(msg, sizeof msg, "%d jobs are in flight (the limit); retry later",
                 g_srv.jobs_in_flight);
        http_reply_error(r, 429, PROTO_CODE_QUEUE_FULL, msg, "");
        return;
    }
    job_start(r, &p);
}

/* ---- store reads on the pool ---- */

typedef struct kop {
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
        op->rc = store_kernel_get(g_srv.st, op->key, &op->k, &op->err);
        break;
    case R_KERNEL_SOURCE:
    case R_KERNEL_META:
        op->rc = store_kernel_meta(g_srv.st, op->key, &op->k, &op->err);
        break;
    default:
        op->rc = store_stats_get(g_srv.st, &op->ss, &op->err);
    }
}

static json_t *parse_or_null(const char *s)
{
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    return j ? j : json_null();
}

static json_t *kernel_meta_json(const store_kernel *k)
{
    return json_pack("{s:s, s:s*, s:s*, s:s*, s:s*, s:o, s:s*, s:s*, s:s*, s:s*, s:s*, s:o, "
                     "s:s, s:I, s:I, s:I, s:I, s:s}",
                     "key", k->key, "workload_hash", k->workload_hash, "target_hash",
                     k->target_hash, "target", k->target_name, "compiler_id", k->compiler_id,
                     "workload", parse_or_null(k->workload_json), "model_id", k->model_id,
                     "schedule", k->schedule, "sentence", k->sentence, "entry", k->entry, "format",
                     k->format, "launch", parse_or_null(k->launch_json), "binary_sha256",
                     k->binary_sha256, "binary_size", (json_int_t)k->binary_size, "created_at",
                     (json_int_t)k->created_at, "last_used_at", (json_int_t)k->last_used_at, "hits",
                     (json_int_t)k->hits, "url", "");
}

static void kop_after(uv_work_t *w, int status)
{
    kop *op = w->data;
    http_req *r = op->r;
    if (r) {
        r->op = NULL;
        r->detach = NULL;
        if (op->rc == TLM_ENOTFOUND && op->route != R_CACHE_STATS && op->route != R_METRICS) {
            http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "no kernel with this key", "");
        } else if (op->rc) {
            http_reply_tlm_error(r, &op->err);
        } else if (op->route == R_KERNEL) {
            const char *h[] = {"X-TLM-Entry",
                               op->k.entry,
                               "X-TLM-Launch",
                               op->k.launch_json ? op->k.launch_json : "{}",
                               "X-TLM-Format",
                               op->k.format,
                               "X-TLM-SHA256",
                               op->k.binary_sha256,
                               NULL};
            http_reply(r, 200, "application/octet-stream", op->k.binary, op->k.binary_size, h);
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
            char *text = metrics_render(&op->ss);
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
                (json_int_t)op->ss.corrupt, "hits", (json_int_t)metrics_cache_hits(), "misses",
                (json_int_t)metrics_cache_misses(), "compiles", (json_int_t)metrics_compiles(),
                "path", g_srv.cfg.store_path);
            json_object_set_new(o, "single_flight_joins",
                                json_integer((json_int_t)metrics_single_flight()));
            http_reply_json(r, 200, o);
        }
    }
    store_kernel_free(&op->k);
    free(op);
    srv_kick();
}

static void start_kop(http_req *r, int route, const char *key)
{
    kop *op = calloc(1, sizeof *op);
    if (!op) {
        http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
        return;
    }
    op->r = r;
    op->route = route;
    if (key) snprintf(op->key, sizeof op->key, "%s", key);
    op->w.data = op;
    r->op = op;
    r->detach = kop_detach;
    http_suspend(r);
    uv_queue_work(g_srv.loop, &op->w, kop_work, kop_after);
}

static void do_version(http_req *r)
{
    const tlm_config *c = &g_srv.model->cfg;
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:s, s:b, s:i, s:{s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:i, s:i, s:I},"
        " s:{s:s, s:s}, s:s, s:s}",
        "version", TLMD_VERSION, "api", "v1", "model_id", g_srv.model_id, "vocab_hash",
        g_srv.vocab_hash, "weights_trained", g_srv.weights_trained, "lang_version", LANG_VERSION,
        "model", "id", g_srv.model_id, "path", g_srv.cfg.weights, "vocab_hash", g_srv.vocab_hash,
        "trained", g_srv.weights_trained, "n_layer", c->n_layer, "n_head", c->n_head, "n_embd",
        c->n_embd, "n_ctx", c->n_ctx, "vocab_size", c->vocab_size, "n_params",
        (json_int_t)g_srv.model->n_params, "toolchain", "cc", g_srv.cc_key, "nvrtc",
        g_srv.nvrtc_key, "device", "cpu", "store", g_srv.cfg.store_path);
    http_reply_json(r, 200, o);
}

void routes_dispatch(http_req *r)
{
    const char *arg = NULL;
    size_t alen = 0;
    route_of(r->url, &arg, &alen);
    char key[65] = "";
    switch (r->route) {
    case R_COMPILE:
        do_compile(r);
        return;
    case R_KERNEL:
    case R_KERNEL_SOURCE:
    case R_KERNEL_META:
        if (!is_hex64(arg, alen)) {
            http_reply_error(r, 404, PROTO_CODE_NOT_FOUND,
                             "a kernel key is 64 lowercase hex digits", "key");
            return;
        }
        memcpy(key, arg, 64);
        key[64] = 0;
        start_kop(r, r->route, key);
        return;
    case R_JOB: {
        char id[64];
        snprintf(id, sizeof id, "%.*s", (int)(alen < 63 ? alen : 63), arg);
        if (!strcmp(r->method, "DELETE")) {
            if (job_cancel(id))
                http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "no such job", "id");
            else
                http_reply_json(r, 200, json_pack("{s:s, s:s}", "job", id, "state", "cancelled"));
            return;
        }
        bool found = false;
        json_t *j = job_lookup_json(id, &found);
        if (!found)
            http_reply_error(r, 404, PROTO_CODE_NOT_FOUND,
                             "no such job (finished jobs are kept "
                             "for a while, then forgotten)",
                             "id");
        else
            http_reply_json(r, 200, j);
        return;
    }
    case R_TARGETS:
        http_reply(r, 200, "application/json", g_srv.targets_json, strlen(g_srv.targets_json),
                   NULL);
        return;
    case R_VERSION:
        do_version(r);
        return;
    case R_CACHE_STATS:
    case R_METRICS:
        start_kop(r, r->route, NULL);
        return;
    case R_MODELS: {
        json_t *models = fe_zoo_list_json();
        if (models)
            http_reply_json(r, 200, json_pack("{s:o}", "models", models));
        else
            http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
        return;
    }
    case R_HEALTHZ:
        http_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
        return;
    case R_READYZ:
        if (g_srv.ready && !g_srv.shutting_down)
            http_reply_json(r, 200, json_pack("{s:s}", "status", "ready"));
        else
            http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE,
                             g_srv.shutting_down ? "shutting down" : "starting", "");
        return;
    default:
        http_reply_error(r, 404, PROTO_CODE_NOT_FOUND, "no such route", "");
    }
}
