/* routes.c — the HTTP API of DESIGN §10: one route table {path pattern, methods, auth,
 * checks before the body, handler}, request decoding for /v1/compile, and the small GET routes
 * (kernels, jobs, targets, version, cache stats, health, metrics, models). Store reads run on
 * the pool; the loop never touches SQLite. */
#include <errno.h>
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
static int decode_network(const routes *rt, const json_t *j, job_params *p, tlm_error *e)
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
    int limit = rt->env->cfg.max_workloads * NET_WORKLOADS_FACTOR;
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
            int64_t d = i == 0   ? zi->defaults.batch
                        : i == 1 ? zi->defaults.image_size
                                 : zi->defaults.seq_len;
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

/* "mode", "candidates", "budget" and "strategy" → the pipeline's mode and options.
 *   generate (the default): the served model's one pass (PL_MODE_TLM), or space_default
 *            (PL_MODE_DEFAULT) when the server serves no model;
 *   default:  space_default whatever the server serves;
 *   topk:     the model's k best candidates, measured where this host runs them; refused
 *             with 422 when no model is served (there is nothing to rank; "generate" gives
 *             the default schedule and says so in schedule_source);
 *   tune:     the measured search, 422 until a search is registered (pl_set_search). */
static int decode_mode(const routes *rt, const json_t *j, job_params *p, tlm_error *e)
{
    json_t *mode = json_object_get(j, "mode");
    const char *ms = mode ? json_string_value(mode) : "generate";
    static const char allowed[] = "must be \"generate\", \"default\", \"topk\" or \"tune\"";
    if (!ms) return bad(e, TLM_EINVAL, "mode", allowed);
    p->k = 1;
    if (!strcmp(ms, "generate")) {
        p->mode_name = "generate";
        p->mode = rt->env->model ? PL_MODE_TLM : PL_MODE_DEFAULT;
    } else if (!strcmp(ms, "default")) {
        p->mode_name = "default";
        p->mode = PL_MODE_DEFAULT;
    } else if (!strcmp(ms, "topk")) {
        p->mode_name = "topk";
        p->mode = PL_MODE_TOPK;
        p->k = 4 < rt->env->cfg.max_candidates ? 4 : rt->env->cfg.max_candidates;
    } else if (!strcmp(ms, "tune")) {
        p->mode_name = "tune";
        p->mode = PL_MODE_TUNE;
    } else {
        return bad(e, TLM_EINVAL, "mode", allowed);
    }
    json_t *cand = json_object_get(j, "candidates");
    if (cand) {
        double d = json_number_value(cand);
        if (!json_is_number(cand) || d != (double)(long long)d || d < 1 ||
            d > rt->env->cfg.max_candidates)
            return tlm_err_set(e, TLM_EINVAL, "candidates", "must be an integer in [1, %d]",
                               rt->env->cfg.max_candidates);
        if (p->mode == PL_MODE_TOPK) p->k = (int)d;
    }
    json_t *b = json_object_get(j, "budget");
    if (b) {
        if (!json_is_object(b))
            return bad(e, TLM_EINVAL, "budget",
                       "must be an object {\"trials\": n, \"seconds\": s}");
        const char *key;
        json_t *v;
        json_object_foreach(b, key, v)
        {
            double d = json_number_value(v);
            if (!strcmp(key, "trials")) {
                if (!json_is_integer(v) || d < 1 || d > 1000000)
                    return bad(e, TLM_EINVAL, "budget.trials",
                               "must be an integer in [1, 1000000]");
                p->trials = (int)d;
            } else if (!strcmp(key, "seconds")) {
                if (!json_is_number(v) || !(d > 0) || d > 86400)
                    return bad(e, TLM_EINVAL, "budget.seconds", "must be a number in (0, 86400]");
                p->seconds = d;
            } else {
                return tlm_err_set(e, TLM_EINVAL, "budget",
                                   "unknown key \"%.64s\"; allowed: "
                                   "trials, seconds",
                                   key);
            }
        }
    }
    json_t *st = json_object_get(j, "strategy");
    if (st) {
        const char *sv = json_string_value(st);
        if (!sv || (strcmp(sv, "evolutionary") && strcmp(sv, "htam")))
            return bad(e, TLM_EINVAL, "strategy", "must be \"evolutionary\" or \"htam\"");
        snprintf(p->strategy, sizeof p->strategy, "%s", sv);
    }
    /* well-formed; now whether this server can do it */
    if (p->mode == PL_MODE_TOPK && !rt->env->model)
        return tlm_err_set(e, TLM_EUNSUPPORTED, "mode",
                           "mode \"topk\" ranks the schedule model's candidates, and this server "
                           "serves no model (%s); use \"generate\", which serves the default "
                           "schedule here",
                           rt->env->schedules_reason);
    if (p->mode == PL_MODE_TUNE && !pl_has_search(PL_MODE_TUNE))
        return bad(e, TLM_EUNSUPPORTED, "mode",
                   "mode \"tune\" is not yet supported by this server; use \"generate\" or "
                   "\"topk\"");
    return 0;
}

static int decode_compile(const routes *rt, http_req *r, job_params *p, tlm_error *e)
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
        static const char *const known[] = {"target", "workloads",      "graph",  "model",
                                            "mode",   "candidates",     "budget", "strategy",
                                            "stream", "include_binary", NULL};
        bool ok = false;
        for (int i = 0; known[i]; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok) {
            rc = tlm_err_set(e, TLM_EINVAL, key,
                             "unknown field; allowed: target, workloads, graph, model, mode, "
                             "candidates, budget, strategy, stream, include_binary");
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
    if ((rc = decode_mode(rt, j, p, e))) goto out;
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
        rc = decode_network(rt, j, p, e);
        goto out;
    }
    if (!json_is_array(wls) || json_array_size(wls) == 0) {
        rc = bad(e, TLM_EINVAL, "workloads", "must be a non-empty array of workload objects");
        goto out;
    }
    if ((int)json_array_size(wls) > rt->env->cfg.max_workloads) {
        rc = tlm_err_set(e, TLM_ELIMIT, "workloads", "at most %d workloads per request",
                         rt->env->cfg.max_workloads);
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
    if (decode_compile(rt, r, &p, &e)) {
        http_reply_tlm_error(r, &e);
        return;
    }
    if (jobs_in_flight(rt->js) >= rt->env->cfg.max_jobs) {
        job_params_free(&p);
        char msg[128];
        snprintf(msg, sizeof msg, "%d jobs are in flight (the limit); retry later",
                 jobs_in_flight(rt->js));
        http_reply_error(r, 429, PROTO_CODE_QUEUE_FULL, msg, "");
        return;
    }
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
            const routes *rt = op->rt;
            metrics_gauges g = {jobs_in_flight(rt->js),        jobs_flights_in_flight(rt->js),
                                dec_queue_depth(rt->d),        http_connections(r->srv),
                                http_door_connections(r->srv), http_refused(r->srv)};
            char *text = metrics_render(rt->m, &g, &op->ss);
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
            http_reply_json(r, 200, o);
        }
    }
    store_kernel_free(&op->k);
    free(op);
    if (r) http_kick(r->srv);
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
            json_pack("{s:s, s:s, s:s, s:b, s:b, s:i, s:i, s:i, s:i, s:i, s:I}", "id",
                      env->weights_sha, "path", env->weights_loaded, "vocab_hash", env->vocab_hash,
                      "trained", env->weights_trained, "served", env->model != NULL, "n_layer",
                      c->n_layer, "n_head", c->n_head, "n_embd", c->n_embd, "n_ctx", c->n_ctx,
                      "vocab_size", c->vocab_size, "n_params", (json_int_t)env->weights_params);
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
