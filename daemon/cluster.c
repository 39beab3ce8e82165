/* cluster.c — distributed measurement over a Redis Stream with a consumer group
 * (cluster.h): the requester side (cluster_measure), the workers, local measurement through
 * the pipeline, and the records written to the requester's store. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "compiler/driver/driver.h"
#include "compiler/driver/pipeline.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "daemon/cluster.h"
#include "daemon/tlmd.h"
#include "proto/workload.h"

#define GROUP "tlmd-workers"
#define MAX_STREAMS 32
#define RESULT_TTL_S "3600"

struct cluster {
    l2 *l;
    store *st;
    int n_workers;
    pthread_t *workers;
    int stopping; /* atomic */
    /* the streams this host can serve: <ns>:v1:measure:<target name> */
    char streams[MAX_STREAMS][160];
    int n_streams;
};

static void stream_key(const l2 *l, const char *target_name, char *out, size_t cap)
{
    snprintf(out, cap, "%s:v1:measure:%s", l2_cfg(l)->ns, target_name);
}

static void result_init(cluster_result *r)
{
    memset(r, 0, sizeof *r);
    r->median_s = r->min_s = r->gflops = r->rel_err = NAN;
}

/* ---- measuring one candidate (any thread) ---- */

void cluster_measure_local(const cluster_cand *cand, cluster_result *out)
{
    result_init(out);
    snprintf(out->host_id, sizeof out->host_id, "%s", store_host_id());
    tlm_error e;
    tlm_err_clear(&e);
    ir_workload wl;
    target t;
    if (proto_workload_from_string(cand->workload_json, strlen(cand->workload_json), &wl, &e) ||
        target_parse(cand->target, &t, &e)) {
        snprintf(out->status, sizeof out->status, "invalid");
        snprintf(out->detail, sizeof out->detail, "%.60s: %.190s", e.field, e.msg);
        return;
    }
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_GIVEN;
    o.measure = PL_MEASURE_ON;
    o.mo.const_args = cand->const_args;
    pl_job pj;
    space_sched s;
    int rc = pl_prepare(&pj, &wl, &t, &o, &e);
    if (!rc && (rc = space_parse(pj.sp, cand->schedule, &s, &e)) == 0)
        rc = pl_add_candidate(&pj, &s, PL_SRC_GIVEN, NAN, &e);
    if (rc) {
        snprintf(out->status, sizeof out->status, "invalid");
        snprintf(out->detail, sizeof out->detail, "%.60s%s%.190s", e.field, e.field[0] ? ": " : "",
                 e.msg);
        pl_job_free(&pj);
        return;
    }
    pl_finish(&pj, &e); /* a failed candidate still leaves its record */
    if (pj.n_recs > 0) {
        const pl_record *r = &pj.recs[0];
        snprintf(out->status, sizeof out->status, "%s", r->status);
        out->median_s = r->median_s;
        out->min_s = r->min_s;
        out->gflops = r->gflops;
        out->rel_err = r->rel_err;
        out->n_samples = r->n_samples;
        snprintf(out->detail, sizeof out->detail, "%s", r->detail);
    } else {
        snprintf(out->status, sizeof out->status, "build_error");
        snprintf(out->detail, sizeof out->detail, "%.250s", e.msg);
    }
    pl_job_free(&pj);
}

/* ---- results on the wire ---- */

static json_t *num(double d)
{
    return isfinite(d) ? json_real(d) : json_null();
}

static char *result_encode(int idx, const cluster_result *r, const char *toolchain)
{
    json_t *o = json_pack("{s:i, s:s, s:o, s:o, s:o, s:o, s:i, s:s, s:s, s:s, s:s}", "i", idx,
                          "status", r->status, "median_s", num(r->median_s), "min_s", num(r->min_s),
                          "gflops", num(r->gflops), "rel_err", num(r->rel_err), "n_samples",
                          r->n_samples, "worker", r->worker, "host_id", r->host_id, "detail",
                          r->detail, "toolchain", toolchain ? toolchain : "");
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

static double jnum(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *jstr(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* ---- workers ---- */

static const char *field(redisReply *fields, const char *name, size_t *len)
{
    for (size_t i = 0; fields && i + 1 < fields->elements; i += 2)
        if (fields->element[i]->type == REDIS_REPLY_STRING &&
            !strcmp(fields->element[i]->str, name)) {
            if (len) *len = fields->element[i + 1]->len;
            return fields->element[i + 1]->str;
        }
    return NULL;
}

/* Measures one stream entry [id, [field, value, ...]] and answers it. */
static void worker_handle(cluster *c, const char *stream, redisReply *entry)
{
    l2 *l = c->l;
    if (entry->type != REDIS_REPLY_ARRAY || entry->elements != 2 ||
        entry->element[0]->type != REDIS_REPLY_STRING)
        return;
    const char *id = entry->element[0]->str;
    redisReply *f = entry->element[1];
    const char *wl = field(f, "workload", NULL), *tg = field(f, "target", NULL);
    const char *sc = field(f, "schedule", NULL), *reply = field(f, "reply", NULL);
    const char *idx = field(f, "i", NULL), *dl = field(f, "deadline", NULL);
    const char *ca = field(f, "const_args", NULL); /* absent from older requesters: 0 */
    bool late = dl && tlmd_wall() > strtod(dl, NULL);
    if (wl && tg && sc && reply && idx && !late) {
        cluster_cand cand = {wl, tg, sc, ca ? (uint32_t)strtoul(ca, NULL, 0) : 0};
        cluster_result r;
        cluster_measure_local(&cand, &r);
        snprintf(r.worker, sizeof r.worker, "%s", l2_owner_id(l));
        char tc[768] = "";
        target t;
        if (!target_parse(tg, &t, NULL)) drv_record_toolchain(&t, cand.const_args, tc, sizeof tc);
        char *js = result_encode(atoi(idx), &r, tc);
        if (js) {
            const char *a1[] = {"RPUSH", reply, js};
            size_t n1[] = {5, strlen(reply), strlen(js)};
            redisReply *x = l2_command(l, 3, a1, n1);
            if (x) freeReplyObject(x);
            const char *a2[] = {"EXPIRE", reply, RESULT_TTL_S};
            size_t n2[] = {6, strlen(reply), strlen(RESULT_TTL_S)};
            x = l2_command(l, 3, a2, n2);
            if (x) freeReplyObject(x);
            free(js);
        }
        l2_count(l, L2_C_MEASURED);
        tlmd_log(LOG_DEBUG, "cluster_measured", "entry=%s status=%s median_s=%g", id, r.status,
                 r.median_s);
    }
    const char *a3[] = {"XACK", stream, GROUP, id};
    size_t n3[] = {4, strlen(stream), strlen(GROUP), strlen(id)};
    redisReply *x = l2_command(l, 4, a3, n3);
    if (x) freeReplyObject(x);
    const char *a4[] = {"XDEL", stream, id};
    size_t n4[] = {4, strlen(stream), strlen(id)};
    x = l2_command(l, 3, a4, n4);
    if (x) freeReplyObject(x);
}

static void ensure_group(l2 *l, const char *stream)
{
    const char *a[] = {"XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM"};
    size_t n[6];
    for (int i = 0; i < 6; i++)
        n[i] = strlen(a[i]);
    redisReply *r = l2_command(l, 6, a, n); /* BUSYGROUP (exists) is fine */
    if (r) freeReplyObject(r);
}

/* XAUTOCLAIM: entries idle longer than claim_idle_ms in stream move to this worker. */
static bool worker_claim(cluster *c, const char *stream, const char *me)
{
    l2 *l = c->l;
    char idle[32];
    snprintf(idle, sizeof idle, "%d", l2_cfg(l)->claim_idle_ms);
    const char *a[] = {"XAUTOCLAIM", stream, GROUP, me, idle, "0-0", "COUNT", "1"};
    size_t n[8];
    for (int i = 0; i < 8; i++)
        n[i] = strlen(a[i]);
    redisReply *r = l2_command(l, 8, a, n);
    bool did = false;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
        r->element[1]->type == REDIS_REPLY_ARRAY) {
        for (size_t i = 0; i < r->element[1]->elements; i++) {
            redisReply *e = r->element[1]->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 ||
                e->element[1]->type != REDIS_REPLY_ARRAY)
                continue; /* an entry deleted meanwhile */
            l2_count(l, L2_C_CLAIMED);
            tlmd_log(LOG_INFO, "cluster_claimed", "stream=%s entry=%s", stream, e->element[0]->str);
            worker_handle(c, stream, e);
            did = true;
        }
    }
    if (r) freeReplyObject(r);
    return did;
}

static void *worker_main(void *arg)
{
    cluster *c = arg;
    l2 *l = c->l;
    char me[160];
    static int seq;
    snprintf(me, sizeof me, "%s#%d", l2_owner_id(l), __atomic_fetch_add(&seq, 1, __ATOMIC_RELAXED));
    bool groups = false;
    double next_claim = 0;
    while (!__atomic_load_n(&c->stopping, __ATOMIC_RELAXED)) {
        if (!l2_up(l) && groups) groups = false; /* Redis may have restarted empty */
        if (!groups) {
            for (int i = 0; i < c->n_streams; i++)
                ensure_group(l, c->streams[i]);
            groups = l2_up(l);
            if (!groups) {
                usleep(250000);
                continue;
            }
        }
        double now = tlmd_now();
        if (now >= next_claim) {
            next_claim = now + 1.0;
            bool any = false;
            for (int i = 0; i < c->n_streams; i++)
                any |= worker_claim(c, c->streams[i], me);
            if (any) continue;
        }
        const char *a[8 + 2 * MAX_STREAMS];
        size_t n[8 + 2 * MAX_STREAMS];
        int k = 0;
        a[k++] = "XREADGROUP";
        a[k++] = "GROUP";
        a[k++] = GROUP;
        a[k++] = me;
        a[k++] = "COUNT";
        a[k++] = "1";
        a[k++] = "BLOCK";
        a[k++] = "1000";
        const char *streams_word = "STREAMS";
        a[k++] = streams_word;
        for (int i = 0; i < c->n_streams; i++)
            a[k++] = c->streams[i];
        for (int i = 0; i < c->n_streams; i++)
            a[k++] = ">";
        for (int i = 0; i < k; i++)
            n[i] = strlen(a[i]);
        redisReply *r = l2_command_blocking(l, 1000, k, a, n);
        if (!r) {
            usleep(100000);
            continue;
        }
        if (r->type == REDIS_REPLY_ERROR && strstr(r->str, "NOGROUP")) groups = false;
        if (r->type == REDIS_REPLY_ARRAY)
            for (size_t s = 0; s < r->elements; s++) {
                redisReply *sr = r->element[s]; /* [stream, [entries]] */
                if (sr->type != REDIS_REPLY_ARRAY || sr->elements != 2) continue;
                for (size_t e = 0; e < sr->element[1]->elements; e++)
                    worker_handle(c, sr->element[0]->str, sr->element[1]->element[e]);
            }
        freeReplyObject(r);
    }
    return NULL;
}

int cluster_new(l2 *l, store *st, cluster **out, tlm_error *err)
{
    *out = NULL;
    cluster *c = calloc(1, sizeof *c);
    if (!c) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    c->l = l;
    c->st = st;
    if (l && l2_cfg(l)->workers > 0) {
        const char *names[64];
        int n = target_list(names, 64);
        for (int i = 0; i < n && i < 64 && c->n_streams < MAX_STREAMS; i++) {
            target t;
            if (target_parse(names[i], &t, NULL) || !target_host_can_run(&t)) continue;
            char sk[160];
            stream_key(l, t.name, sk, sizeof sk);
            bool dup = false;
            for (int j = 0; j < c->n_streams; j++)
                dup |= !strcmp(c->streams[j], sk);
            if (!dup) snprintf(c->streams[c->n_streams++], sizeof c->streams[0], "%s", sk);
        }
        c->workers = calloc((size_t)l2_cfg(l)->workers, sizeof *c->workers);
        for (int i = 0; c->workers && c->n_streams && i < l2_cfg(l)->workers; i++)
            if (pthread_create(&c->workers[i], NULL, worker_main, c) == 0) c->n_workers++;
        char list[1024] = "";
        for (int j = 0; j < c->n_streams; j++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? "," : "",
                     strrchr(c->streams[j], ':') + 1);
        tlmd_log(LOG_INFO, "cluster_workers", "workers=%d targets=%s", c->n_workers, list);
    }
    *out = c;
    return 0;
}

void cluster_abort(cluster *c)
{
    if (c) __atomic_store_n(&c->stopping, 1, __ATOMIC_RELAXED);
}

void cluster_free(cluster *c)
{
    if (!c) return;
    __atomic_store_n(&c->stopping, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < c->n_workers; i++)
        pthread_join(c->workers[i], NULL);
    free(c->workers);
    free(c);
}

/* ---- the requester ---- */

static void record(store *st, const cluster_cand *cand, const cluster_result *r,
                   const char *toolchain)
{
    if (!st || !strcmp(r->status, "invalid") || !strcmp(r->status, "unmeasured")) return;
    ir_workload wl;
    target t;
    tlm_error e;
    if (proto_workload_from_string(cand->workload_json, strlen(cand->workload_json), &wl, &e) ||
        target_parse(cand->target, &t, &e))
        return;
    char canon[1024], whash[65], thash[65], tc[768];
    if (ir_workload_canonical(&wl, canon, sizeof canon) < 0 || ir_workload_hash_hex(&wl, whash) ||
        target_hash_hex(&t, thash))
        return;
    if (!toolchain || !toolchain[0]) {
        drv_record_toolchain(&t, cand->const_args, tc, sizeof tc);
        toolchain = tc;
    }
    store_measurement m = {.workload_hash = whash,
                           .target_hash = thash,
                           .schedule = (char *)cand->schedule,
                           .status = (char *)r->status,
                           .median_s = r->median_s,
                           .gflops = r->gflops,
                           .rel_err = r->rel_err,
                           .workload_json = canon,
                           .target_name = t.name,
                           .toolchain_id = (char *)toolchain,
                           .model_id = "none",
                           .schedule_source = "tuned",
                           .min_s = r->min_s,
                           .n_samples = r->n_samples,
                           .host_id = r->host_id[0] ? (char *)r->host_id : NULL,
                           .detail = r->detail[0] ? (char *)r->detail : NULL};
    if (store_measurement_add(st, &m, NULL, &e))
        tlmd_log(LOG_ERROR, "store_measurement", "error=\"%s\"", e.msg);
}

static void measure_here(const cluster_cand *cand, cluster_result *r, store *st)
{
    cluster_measure_local(cand, r);
    snprintf(r->worker, sizeof r->worker, "local");
    record(st, cand, r, NULL);
}

int cluster_measure(cluster *c, const cluster_cand *cands, int n, cluster_result *out,
                    double deadline_s, store *st, tlm_error *err)
{
    double t_end = tlmd_now() + deadline_s;
    /* every candidate is checked before anything is sent */
    for (int i = 0; i < n; i++) {
        ir_workload wl;
        target t;
        tlm_error e;
        result_init(&out[i]);
        if (!cands[i].workload_json || !cands[i].target || !cands[i].schedule)
            return tlm_err_set(err, TLM_EINVAL, "candidates", "candidate %d lacks a field", i);
        if (proto_workload_from_string(cands[i].workload_json, strlen(cands[i].workload_json), &wl,
                                       &e))
            return tlm_err_set(err, TLM_EINVAL, "candidates.workload", "candidate %d: %s: %s", i,
                               e.field, e.msg);
        if (target_parse(cands[i].target, &t, &e))
            return tlm_err_set(err, TLM_EINVAL, "candidates.target", "candidate %d: %s", i, e.msg);
    }
    l2 *l = c ? c->l : NULL;
    bool *sent = calloc((size_t)n + 1, sizeof *sent), *got = calloc((size_t)n + 1, sizeof *got);
    if (!sent || !got) {
        free(sent);
        free(got);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    char reply[160] = "";
    if (l && l2_up(l)) {
        uint64_t rnd;
        if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
            rnd = (uint64_t)(tlmd_now() * 1e9);
        snprintf(reply, sizeof reply, "%s:v1:mres:%016llx", l2_cfg(l)->ns, (unsigned long long)rnd);
        char dl[32];
        snprintf(dl, sizeof dl, "%.3f", tlmd_wall() + deadline_s);
        for (int i = 0; i < n; i++) {
            target t;
            target_parse(cands[i].target, &t, NULL);
            char sk[160], is[16], ca[16];
            stream_key(l, t.name, sk, sizeof sk);
            if (i == 0 || strcmp(cands[i].target, cands[i - 1].target)) ensure_group(l, sk);
            snprintf(is, sizeof is, "%d", i);
            snprintf(ca, sizeof ca, "0x%x", (unsigned)cands[i].const_args);
            const char *a[] = {"XADD",
                               sk,
                               "*",
                               "i",
                               is,
                               "workload",
                               cands[i].workload_json,
                               "target",
                               t.name,
                               "schedule",
                               cands[i].schedule,
                               "reply",
                               reply,
                               "deadline",
                               dl,
                               "const_args",
                               ca};
            enum { NA = sizeof a / sizeof a[0] };
            size_t ln[NA];
            for (int k = 0; k < NA; k++)
                ln[k] = strlen(a[k]);
            redisReply *r = l2_command(l, NA, a, ln);
            sent[i] = r && r->type == REDIS_REPLY_STRING;
            if (r) freeReplyObject(r);
            if (!sent[i]) break; /* Redis went away: the rest is measured here */
        }
    }
    int n_got = 0;
    double stalled_since = 0;
    while (n_got < n && tlmd_now() < t_end &&
           !(c && __atomic_load_n(&c->stopping, __ATOMIC_RELAXED))) {
        bool any_sent_missing = false;
        for (int i = 0; i < n; i++)
            if (sent[i] && !got[i]) any_sent_missing = true;
        if (!any_sent_missing) {
            /* what was never sent is measured here, one at a time, checking back in between */
            for (int i = 0; i < n; i++)
                if (!got[i]) {
                    measure_here(&cands[i], &out[i], st);
                    got[i] = true;
                    n_got++;
                    break;
                }
            continue;
        }
        const char *a[] = {"LPOP", reply, "64"};
        size_t ln[] = {4, strlen(reply), 2};
        redisReply *r = l2_command(l, 3, a, ln);
        if (!r || r->type == REDIS_REPLY_ERROR) {
            /* Redis is gone: give it a few seconds, then measure what is missing here */
            if (!stalled_since) stalled_since = tlmd_now();
            if (tlmd_now() - stalled_since > 3.0) {
                tlmd_log(LOG_WARN, "cluster_fallback",
                         "reason=\"Redis unavailable\" measuring_locally=%d", n - n_got);
                for (int i = 0; i < n; i++)
                    sent[i] = false;
            } else {
                usleep(200000);
            }
            if (r) freeReplyObject(r);
            continue;
        }
        stalled_since = 0;
        int taken = 0;
        for (size_t k = 0; r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
            json_t *o = json_loadb(r->element[k]->str, r->element[k]->len, 0, NULL);
            json_t *iv = json_object_get(o, "i");
            int i = json_is_integer(iv) ? (int)json_integer_value(iv) : -1;
            if (i >= 0 && i < n && !got[i]) {
                cluster_result *res = &out[i];
                snprintf(res->status, sizeof res->status, "%s", jstr(o, "status"));
                res->median_s = jnum(o, "median_s");
                res->min_s = jnum(o, "min_s");
                res->gflops = jnum(o, "gflops");
                res->rel_err = jnum(o, "rel_err");
                res->n_samples = (int)json_integer_value(json_object_get(o, "n_samples"));
                snprintf(res->worker, sizeof res->worker, "%s", jstr(o, "worker"));
                snprintf(res->host_id, sizeof res->host_id, "%s", jstr(o, "host_id"));
                snprintf(res->detail, sizeof res->detail, "%s", jstr(o, "detail"));
                record(st, &cands[i], res, jstr(o, "toolchain"));
                got[i] = true;
                n_got++;
                taken++;
            }
            json_decref(o);
        }
        freeReplyObject(r);
        if (!taken) usleep(50000);
    }
    int missing = 0;
    for (int i = 0; i < n; i++)
        if (!got[i]) {
            missing++;
            snprintf(out[i].status, sizeof out[i].status, "unmeasured");
            snprintf(out[i].detail, sizeof out[i].detail,
                     "no worker answered within the deadline of %g s", deadline_s);
        }
    if (reply[0] && l) {
        const char *a[] = {"DEL", reply};
        size_t ln[] = {3, strlen(reply)};
        redisReply *r = l2_command(l, 2, a, ln);
        if (r) freeReplyObject(r);
    }
    free(sent);
    free(got);
    if (missing)
        return tlm_err_set(err, TLM_ELIMIT, "deadline_s",
                           "%d of %d candidates were not measured within %g s", missing, n,
                           deadline_s);
    return 0;
}

/* ---- the tuner's evaluator (tune_set_default_eval) ---- */

int cluster_tune_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    cluster *c = user;
    cluster_cand *cands = calloc((size_t)n, sizeof *cands);
    cluster_result *out = calloc((size_t)n, sizeof *out);
    char(*sched)[DRV_SCHED_MAX] = calloc((size_t)n, sizeof *sched);
    if (!cands || !out || !sched) {
        free(cands);
        free(out);
        free(sched);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    for (int k = 0; k < n; k++) {
        space_print(j->sp, &j->cands[idx[k]].sched, sched[k], sizeof sched[k]);
        cands[k] = (cluster_cand){.workload_json = j->canon, .target = j->tgt.name,
                                  .schedule = sched[k], .const_args = j->o.mo.const_args};
    }
    /* every candidate is a build and a measurement somewhere: generous, and bounded */
    double deadline = 60.0 + 20.0 * n;
    int rc = cluster_measure(c, cands, n, out, deadline, c ? c->st : NULL, err);
    if (rc == TLM_ELIMIT) rc = 0; /* what no worker measured in time counts as failed */
    for (int k = 0; k < n; k++)
        secs[k] = !rc && !strcmp(out[k].status, "ok") && out[k].median_s > 0 ? out[k].median_s
                                                                            : INFINITY;
    free(cands);
    free(out);
    free(sched);
    return rc;
}
