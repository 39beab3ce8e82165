/* request.c — the body of POST /v1/compile (DESIGN §10) decoded into job_params: the known
 * fields, the target, the mode with its candidates, budget and strategy, and the kernels to
 * build from "workloads", a "graph" or a zoo "model" (fused and deduplicated here). Every
 * error names its field. Apart from routes.c so that the fuzzer (tests/fuzz/) runs the very
 * decoder the server runs. Any thread; env is only read. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "compiler/frontend/frontend.h"
#include "daemon/tlmd.h"
#include "proto/error.h"
#include "proto/workload.h"

void job_params_free(job_params *p)
{
    free(p->wl);
    free(p->occ);
    free(p->consts);
    free(p->node);
    json_decref(p->model);
    json_decref(p->plan);
    p->wl = NULL;
    p->occ = NULL;
    p->consts = NULL;
    p->node = NULL;
    p->model = NULL;
    p->plan = NULL;
}

static int bad(tlm_error *e, int code, const char *field, const char *msg)
{
    return tlm_err_set(e, code, field, "%s", msg);
}

/* A network has many more kernels than a hand-written request: its unique subgraphs may
 * number 16 x max_workloads (1024 at the defaults; LLaMA-7B has 14, EfficientNet-B0 68). */
#define NET_WORKLOADS_FACTOR 16

/* Standard base64 (padding optional, no whitespace) into a malloc'ed buffer; NULL when the
 * text is not base64. The checks are ours, the decoding libcrypto's: EVP_DecodeBlock trims
 * whitespace and reads '=' anywhere as zero bits, so the text is checked against the alphabet
 * first, and its unpadded tail is padded here and decoded on its own (EVP_DecodeBlock counts
 * padding as zero bytes; the tail's real length is its characters less one). */
static uint8_t *b64_decode(const char *s, size_t len, size_t *out_len)
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    while (len && s[len - 1] == '=')
        len--;
    /* strspn stops at a NUL, which JSON strings may hold; bodies are at most 1 GiB
     * (max_body_bytes), so the length fits EVP_DecodeBlock's int */
    if (len % 4 == 1 || len > INT_MAX || strspn(s, alpha) < len) return NULL;
    size_t full = len / 4 * 4, tail = len % 4;
    uint8_t *out = malloc(len / 4 * 3 + 3);
    if (!out) return NULL;
    if (EVP_DecodeBlock(out, (const unsigned char *)s, (int)full) != (int)(full / 4 * 3)) {
        free(out);
        return NULL;
    }
    size_t n = full / 4 * 3;
    if (tail) {
        unsigned char last[4] = {'=', '=', '=', '='}, bytes[3];
        memcpy(last, s + full, tail);
        if (EVP_DecodeBlock(bytes, last, 4) != 3) {
            free(out);
            return NULL;
        }
        memcpy(out + n, bytes, tail - 1);
        n += tail - 1;
    }
    *out_len = n;
    return out;
}

/* "onnx": a base64 ONNX model → graph (fe_onnx_import; its weights are not needed to compile). */
static int decode_onnx(const json_t *oj, fe_graph **g, tlm_error *e)
{
    if (!json_is_string(oj))
        return bad(e, TLM_EINVAL, "onnx", "must be a string: the ONNX model file in base64");
    size_t n = 0;
    uint8_t *bytes = b64_decode(json_string_value(oj), json_string_length(oj), &n);
    if (!bytes) return bad(e, TLM_EINVAL, "onnx", "not base64 (standard alphabet, no line breaks)");
    int rc = fe_onnx_import(bytes, n, g, NULL, e);
    free(bytes);
    return rc;
}

/* "graph" or "model" → fused, deduplicated subgraphs as the job's workloads, with their
 * occurrence counts, anchor names and the network's summary. Building and fusing a zoo model
 * takes milliseconds (LLaMA-7B is ~1,000 nodes), so it runs here on the loop thread. */
static int decode_network(const tlmd_env *env, const json_t *j, job_params *p, tlm_error *e)
{
    const json_t *gj = json_object_get(j, "graph"), *oj = json_object_get(j, "onnx");
    const char *kind = gj ? "graph" : oj ? "onnx" : "model";
    double t0 = tlmd_now();
    fe_graph *g = NULL;
    int rc;
    if (oj) {
        /* fields come back as "onnx", "onnx.graph.node[3]", ... */
        if ((rc = decode_onnx(oj, &g, e))) return rc;
    } else if (gj) {
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
    fe_plan plan = {0};
    rc = fe_fuse(g, &fu, e);
    if (!rc && (rc = fe_plan_build(g, &fu, p->tgt.kind == TARGET_CPU ? p->tgt.cpu.l2_bytes : -1,
                                   &plan, e)))
        fe_fused_free(&fu);
    if (rc) {
        if (!oj) proto_error_prefix(e, kind);
        fe_graph_free(g);
        return rc;
    }
    int limit = env->cfg.max_workloads * NET_WORKLOADS_FACTOR;
    if (fu.n > limit) {
        rc = tlm_err_set(e, TLM_ELIMIT, kind, "the %s fuses into %d unique subgraphs; at most %d",
                         kind, fu.n, limit);
        goto out;
    }
    if (fu.n == 0) {
        rc = tlm_err_set(e, TLM_EINVAL,
                         gj   ? "graph.nodes"
                         : oj ? "onnx"
                              : "model",
                         "the %s has no kernel to compile (only views)", kind);
        goto out;
    }
    p->n = fu.n;
    p->wl = calloc((size_t)fu.n, sizeof *p->wl);
    p->occ = calloc((size_t)fu.n, sizeof *p->occ);
    p->node = calloc((size_t)fu.n, sizeof *p->node);
    p->consts = calloc((size_t)fu.n, sizeof *p->consts);
    if (!p->wl || !p->occ || !p->node || !p->consts) {
        rc = bad(e, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    for (int i = 0; i < fu.n; i++) {
        p->wl[i] = fu.sub[i].wl;
        p->occ[i] = fu.sub[i].count;
        p->consts[i] = fu.sub[i].const_args;
        snprintf(p->node[i], sizeof p->node[i], "%s", fu.sub[i].name);
    }
    json_t *name = g->name ? json_string(g->name) : NULL;
    p->model = json_pack("{s:s, s:o, s:i, s:I, s:I, s:I, s:f}", "kind", kind, "name",
                         name ? name : json_null(), "subgraphs", fu.n, "launches",
                         (json_int_t)fu.launches, "flops", (json_int_t)fu.flops, "macs",
                         (json_int_t)fu.macs, "fuse_s", tlmd_now() - t0);
    p->plan = fe_plan_to_json(g, &fu, &plan);
    if (!p->model || !p->plan) rc = bad(e, TLM_ENOMEM, "", "out of memory");
    if (!gj && !oj && p->model) {
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
    fe_plan_free(&plan);
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
 *   tune:     the measured search (compiler/tune) within "budget" (trials, default 64;
 *             seconds, capped below the job timeout), "strategy" evolutionary (the cost
 *             model, the default) or random; 422 when no search is registered or when this
 *             host cannot run the target's kernels (a CUDA target without a GPU). */
static int decode_mode(const tlmd_env *env, const json_t *j, job_params *p, tlm_error *e)
{
    json_t *mode = json_object_get(j, "mode");
    const char *ms = mode ? json_string_value(mode) : "generate";
    static const char allowed[] = "must be \"generate\", \"default\", \"topk\" or \"tune\"";
    if (!ms) return bad(e, TLM_EINVAL, "mode", allowed);
    p->k = 1;
    if (!strcmp(ms, "generate")) {
        p->mode_name = "generate";
        p->mode = env->model ? PL_MODE_TLM : PL_MODE_DEFAULT;
    } else if (!strcmp(ms, "default")) {
        p->mode_name = "default";
        p->mode = PL_MODE_DEFAULT;
    } else if (!strcmp(ms, "topk")) {
        p->mode_name = "topk";
        p->mode = PL_MODE_TOPK;
        p->k = 4 < env->cfg.max_candidates ? 4 : env->cfg.max_candidates;
    } else if (!strcmp(ms, "tune")) {
        p->mode_name = "tune";
        p->mode = PL_MODE_TUNE;
    } else {
        return bad(e, TLM_EINVAL, "mode", allowed);
    }
    json_t *cand = json_object_get(j, "candidates");
    if (cand) {
        double d = json_number_value(cand);
        /* the range first: casting a double beyond long long is undefined (fuzz_request
         * found candidates = 4.1e111) */
        if (!json_is_number(cand) || !(d >= 1 && d <= env->cfg.max_candidates) ||
            d != (double)(long long)d)
            return tlm_err_set(e, TLM_EINVAL, "candidates", "must be an integer in [1, %d]",
                               env->cfg.max_candidates);
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
        if (!sv || (strcmp(sv, "evolutionary") && strcmp(sv, "random") && strcmp(sv, "htam")))
            return bad(e, TLM_EINVAL, "strategy",
                       "must be \"evolutionary\", \"random\" or \"htam\"");

        snprintf(p->strategy, sizeof p->strategy, "%s", sv);
    }
    /* well-formed; now whether this server can do it */
    if (p->mode == PL_MODE_TOPK && !env->model)
        return tlm_err_set(e, TLM_EUNSUPPORTED, "mode",
                           "mode \"topk\" ranks the schedule model's candidates, and this server "
                           "serves no model (%s); use \"generate\", which serves the default "
                           "schedule here",
                           env->schedules_reason);
    if (p->mode == PL_MODE_TUNE && !pl_has_search(PL_MODE_TUNE))
        return bad(e, TLM_EUNSUPPORTED, "mode",
                   "mode \"tune\" is not available in this server (no search registered); use "
                   "\"generate\" or \"topk\"");
    if (p->mode == PL_MODE_TUNE && !(p->tgt.kind == TARGET_CPU && target_host_can_run(&p->tgt)))
        return tlm_err_set(e, TLM_EUNSUPPORTED, "mode",
                           "mode \"tune\" measures every candidate, and this server cannot run "
                           "%s kernels (%s); use \"generate\" or \"topk\", or tune on a "
                           "machine that can",
                           p->tgt.name,
                           p->tgt.kind == TARGET_CUDA ? "it runs no GPU"
                                                      : "its CPU lacks the instructions");
    if (p->mode == PL_MODE_TUNE) {
        /* the search must end, with what it measured, before the job's deadline */
        double cap = 0.8 * env->cfg.job_timeout_s;
        if (p->seconds <= 0 || p->seconds > cap) p->seconds = cap;
    }
    return 0;
}

int request_decode_compile(const tlmd_env *env, const char *body, size_t len, const char *accept,
                           job_params *p, tlm_error *e)
{
    if (!body || !len) return bad(e, PROTO_EJSON, "", "the request body is empty");
    json_error_t je;
    unsigned flags = 0;
    json_t *j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!j && strstr(je.text, "too big")) {
        /* Integers beyond int64: re-read as reals so the field is named (proto/workload.h). */
        j = json_loadb(body, len, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL, &je);
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
        static const char *const known[] = {"target",   "workloads", "graph",          "model",
                                            "onnx",     "mode",      "candidates",     "budget",
                                            "strategy", "stream",    "include_binary", NULL};
        bool ok = false;
        for (int i = 0; known[i]; i++)
            ok |= !strcmp(key, known[i]);
        if (!ok) {
            rc = tlm_err_set(e, TLM_EINVAL, key,
                             "unknown field; allowed: target, workloads, graph, model, onnx, "
                             "mode, candidates, budget, strategy, stream, include_binary");
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
    if ((rc = decode_mode(env, j, p, e))) goto out;
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
    if (accept && strstr(accept, "application/x-ndjson")) p->stream = true;
    json_t *wls = json_object_get(j, "workloads");
    int given = !!wls + !!json_object_get(j, "graph") + !!json_object_get(j, "model") +
                !!json_object_get(j, "onnx");
    if (given != 1) {
        rc = bad(e, TLM_EINVAL, given ? "" : "workloads",
                 "give exactly one of \"workloads\", \"graph\", \"model\" or \"onnx\"");
        goto out;
    }
    if (!wls) {
        rc = decode_network(env, j, p, e);
        goto out;
    }
    if (!json_is_array(wls) || json_array_size(wls) == 0) {
        rc = bad(e, TLM_EINVAL, "workloads", "must be a non-empty array of workload objects");
        goto out;
    }
    if ((int)json_array_size(wls) > env->cfg.max_workloads) {
        rc = tlm_err_set(e, TLM_ELIMIT, "workloads", "at most %d workloads per request",
                         env->cfg.max_workloads);
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
