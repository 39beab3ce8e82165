/* jobs.c — compile jobs: one kernel task per workload, single flight per cache key, the pool
 * work (store lookup, the pipeline, store inserts), the decoder hand-off, deadlines, answers
 * and NDJSON events.
 *
 * A flight is the compilation of one cache key: one pl_job of the pipeline
 * (compiler/driver/pipeline.h); every kernel task that wants that key while it is in flight
 * joins it instead of starting another (single flight). Life of a flight:
 *   loop: created ─► libuv pool: store_kernel_get ─► hit: done │ miss ─► compile pool:
 *   pl_prepare ─► with pl_decode_count > 0: decoder thread (batched, grammar-masked)
 *   ─► loop ─► compile pool: pl_add_candidate each, pl_finish (build, measure where the
 *   policy says, choose), store_kernel_put with its schedule source, every stored-worthy
 *   pl_record to store_measurement_add ─► loop: every waiter done.
 * Hits never wait for the compile pool (pool.c). A flight whose every waiter's job ended
 * (cancelled, its client gone, failed) is marked cancelled: the steps it has not begun are
 * skipped; a step already running finishes (the pipeline cannot be interrupted).
 * Jobs and flights are loop-thread objects; the pool and decoder only touch a flight's own
 * fields while it is handed to them (the pl_job belongs to one thread at a time). */
#include <math.h>
#include <stdio.h>
#include <sys/random.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver/driver.h"
#include "compiler/driver/pipeline.h"
#include "compiler/lang/lang.h"
#include "compiler/tune/htam.h"
#include "compiler/tune/tune.h"
#include "daemon/l2.h"
#include "daemon/tlmd.h"
#include "proto/error.h"
#include "proto/workload.h"

#define JOBS_KEPT 256

typedef enum { JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED } job_state;
static const char *const state_names[] = {"running", "done", "failed", "cancelled"};

struct flight;

typedef struct ktask {
    struct job *j;
    int index;
    ir_workload wl;
    char canon[1024];
    char whash[65];
    char key[65];
    char gen_key[65]; /* tune: the key a generate request for this kernel looks up */
    bool done;
    struct flight *f; /* the flight it waits on, while it waits */
    json_t *kernel;   /* the answer's kernel object, without the binary */
    struct ktask *next_waiter;
} ktask;

typedef struct job {
    struct jobs *js;
    char id[40];
    int refs;
    http_req *req;
    job_params p;
    char target_hash[65];
    char options[192];
    char model_id[65]; /* the cache key's model part: the served model's id, or "none" */
    int n_done, n_hit, n_miss;
    job_state state;
    double t_start, t_end, created_wall;
    double decode_s, codegen_s, compile_s, measure_s;
    uv_timer_t deadline;
    bool timer_open;
    ktask *kt;
    struct tgroup *group; /* tune over several kernels: their shared search (until started) */
    json_t *answer; /* the final answer (without binaries), or the error body */
    int err_status;
    /* started while max_jobs jobs were in flight: served only from the cache (or by joining
     * a compile already under way); a kernel that needs a compile of its own answers 429 */
    bool over_limit;
    struct job *next;
} job;

typedef struct flight {
    struct jobs *js;
    char key[65];
    ktask *waiters;
    target tgt;
    ir_workload wl;
    char canon[1024], whash[65], target_hash[65], toolchain[768], model_id[65];
    pl_opts opts;
    pl_job pj; /* the pipeline's job (a miss) */
    int rc;
    tlm_error err;
    int status; /* the HTTP status of a failure when not the error's own (429) */
    bool hit;
    bool probe_only; /* every waiter is over the limit: look up, never compile */
    store_kernel sk; /* the kernel (hit: from the store; miss: what was inserted) */
    dec_item dec;
    const char *selection; /* pj.selection of a miss (static) */
    int n_records;         /* measurement records stored */
    int recs_stored;       /* pj.recs before this index are in the store */
    char gen_key[65];      /* tune: also stored under the generate key ("" otherwise) */
    struct tgroup *group;  /* tune over several kernels: the one search they share */
    bool group_ready;      /* prepared, waiting for the group's search */
    bool in_batch;         /* the group's search ran it */
    double weight;         /* tune: the kernel's launches in the request */
    double t_start, t_looked_up, decode_s, codegen_s, compile_s, measure_s;
    uv_work_t w;    /* the store lookup (libuv's pool) */
    pool_work pw;   /* pl_prepare, then the compile (the compile pool) */
    bool cancelled; /* set by the loop, read by the compile pool: no waiter wants it */
    /* the cluster tier (l2.h): an L2 hit, the compile lease held, or waiting on another
     * daemon's lease (polled with back-off from l2_timer) */
    bool l2_hit, lease_held, l2_wait, waited;
    uv_timer_t l2_timer;
    bool timer_open;
    int wait_ms;
    struct flight *next;
} flight;

/* A tune over several kernels (a graph, a model, several workloads): their flights are
 * prepared one by one, then ONE search (tune_tasks, Ansor's gradient task scheduler) spends
 * the request's trial budget over all of them, where the expected gain in weighted latency is
 * largest. Loop thread, except the search itself (the compile pool). */
typedef struct tgroup {
    struct jobs *js;
    int members;   /* flights that may still join the search */
    int ready;     /* prepared and waiting */
    flight **list; /* the ready ones */
    bool started;
    int trials;
    double seconds;
    uint64_t seed;
    char strategy[32];
    const tlm_model *model;
    pool_work pw;
    int rc;
    tlm_error err;
} tgroup;

struct jobs {
    const tlmd_env *env;
    dec *d; /* NULL when no model is served */
    metrics *m;
    http_server *h;
    flight *flights; /* in flight, one per cache key */
    int n_flights;
    job *list; /* recent jobs, newest first */
    int n_jobs;
    uint64_t next_job_id;
    char epoch[9]; /* this run's: job ids are "j<n>-<epoch>", unique across restarts */
    int in_flight; /* jobs running */
    pool *cp;
};

jobs *jobs_new(const tlmd_env *env, dec *d, metrics *m, http_server *h, pool *cp)
{
    jobs *js = calloc(1, sizeof *js);
    if (!js) return NULL;
    js->env = env;
    js->d = d;
    js->m = m;
    js->h = h;
    js->cp = cp;
    uint32_t e;
    if (getrandom(&e, sizeof e, 0) != (ssize_t)sizeof e)
        e = (uint32_t)tlmd_wall() ^ (uint32_t)getpid() << 16;
    snprintf(js->epoch, sizeof js->epoch, "%08x", e);
    return js;
}

int jobs_flights_in_flight(const jobs *js)
{
    return js ? js->n_flights : 0;
}

int jobs_in_flight(const jobs *js)
{
    return js ? js->in_flight : 0;
}

/* ---- jobs: references and lifetime ---- */

static void job_free_cb(uv_handle_t *h)
{
    job *j = h->data;
    for (int i = 0; i < j->p.n; i++)
        json_decref(j->kt[i].kernel);
    free(j->kt);
    job_params_free(&j->p);
    json_decref(j->answer);
    free(j);
}

static void job_unref(job *j)
{
    if (--j->refs > 0) return;
    if (j->timer_open) {
        j->timer_open = false;
        uv_close((uv_handle_t *)&j->deadline, job_free_cb);
    } else {
        uv_handle_t h;
        h.data = j;
        job_free_cb(&h);
    }
}

static void job_finish(job *j, job_state st, const tlm_error *err, int status);

/* The request is over while its job runs: the client went away (the answer is only sent when
 * the job ends). The job is cancelled; flights that other jobs wait on go on. */
static void job_detach(http_req *r)
{
    job *j = r->job;
    r->job = NULL;
    r->detach = NULL;
    if (j) {
        j->req = NULL;
        if (j->state == JOB_RUNNING) {
            tlm_error e;
            tlm_err_set(&e, TLM_EUNSUPPORTED, "", "the client disconnected");
            job_finish(j, JOB_CANCELLED, &e, 503);
            http_kick(j->js->h);
        }
        job_unref(j);
    }
}

/* Keeps the newest JOBS_KEPT jobs for GET /v1/jobs/{id}. */
static void jobs_remember(job *j)
{
    j->refs++;
    jobs *js = j->js;
    j->next = js->list;
    js->list = j;
    js->n_jobs++;
    if (js->n_jobs <= JOBS_KEPT) return;
    job **pp = &js->list;
    int n = 0;
    while (*pp && n < JOBS_KEPT) {
        /* never forget a running job */
        pp = &(*pp)->next;
        n++;
    }
    while (*pp) {
        job *old = *pp;
        if (old->state == JOB_RUNNING) {
            pp = &old->next;
            continue;
        }
        *pp = old->next;
        js->n_jobs--;
        job_unref(old);
    }
}

static job *job_find(jobs *js, const char *id)
{
    for (job *j = js->list; j; j = j->next)
        if (!strcmp(j->id, id)) return j;
    return NULL;
}

/* ---- answers ---- */

static json_t *job_stats(job *j)
{
    double end = j->state == JOB_RUNNING ? tlmd_now() : j->t_end;
    /* "subgraphs" and "seconds" repeat "kernels" and "wall_s" under the names of a network's
     * summary (subgraphs, hits, misses, seconds), so clients read one shape for every kind */
    json_t *o =
        json_pack("{s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}", "kernels", j->p.n,
                  "subgraphs", j->p.n, "hits", j->n_hit, "misses", j->n_miss, "wall_s",
                  end - j->t_start, "seconds", end - j->t_start, "decode_s", j->decode_s,
                  "codegen_s", j->codegen_s, "compile_s", j->compile_s, "measure_s", j->measure_s);
    json_t *launches = json_object_get(j->p.model, "launches");
    if (o && launches) json_object_set(o, "launches", launches);
    return o;
}

static json_t *target_obj(job *j)
{
    json_t *t = target_to_json(&j->p.tgt);
    return t ? t : json_object();
}

static void job_answer(job *j, http_req *r, job_state st);

/* The plan's launches name their subgraph; once every kernel is known each launch also gets
 * the kernel's cache key and (CUDA) launch configuration, so a client needs nothing else. */
static void plan_fill_kernels(job *j)
{
    size_t i;
    json_t *l;
    json_array_foreach(json_object_get(j->p.plan, "launches"), i, l)
    {
        json_int_t s = json_integer_value(json_object_get(l, "subgraph"));
        if (s < 0 || s >= j->p.n || !j->kt[s].kernel) continue;
        json_t *key = json_object_get(j->kt[s].kernel, "key");
        json_t *launch = json_object_get(j->kt[s].kernel, "launch");
        if (key) json_object_set(l, "kernel", key);
        if (launch) json_object_set(l, "launch", launch);
    }
}

/* Whether a job still running waits on f. */
static bool flight_wanted(const flight *f)
{
    for (const ktask *t = f->waiters; t; t = t->next_waiter)
        if (t->j->state == JOB_RUNNING) return true;
    return false;
}

static void job_finish(job *j, job_state st, const tlm_error *err, int status)
{
    if (j->state != JOB_RUNNING) return;
    j->state = st;
    if (st != JOB_DONE)
        for (int i = 0; i < j->p.n; i++)
            if (j->kt[i].f && !flight_wanted(j->kt[i].f))
                __atomic_store_n(&j->kt[i].f->cancelled, true, __ATOMIC_RELEASE);
    j->t_end = tlmd_now();
    j->js->in_flight--;
    if (j->timer_open) uv_timer_stop(&j->deadline);
    http_req *r = j->req;
    if (st == JOB_DONE) {
        json_t *ks = json_array();
        for (int i = 0; i < j->p.n; i++)
            json_array_append(ks, j->kt[i].kernel);
        j->answer = json_pack("{s:s, s:o, s:o, s:o, s:s, s:s}", "job", j->id, "target",
                              target_obj(j), "kernels", ks, "stats", job_stats(j), "mode",
                              j->p.mode_name, "effective_mode", pl_mode_name(j->p.mode));
        if (j->answer && j->p.model) json_object_set(j->answer, "model", j->p.model);
        if (j->p.plan) plan_fill_kernels(j);
        if (j->answer && j->p.plan) json_object_set(j->answer, "plan", j->p.plan);
        j->err_status = 200;
    } else {
        int hs = 500;
        /* deadline, cancel and shutdown say 503 "unavailable"; work failures keep their code */
        if (status == 503 || !err)
            j->answer = proto_error_body(PROTO_CODE_UNAVAILABLE, err ? err->msg : "cancelled",
                                         err ? err->field : "");
        else if (status == 429)
            j->answer = proto_error_body(PROTO_CODE_QUEUE_FULL, err->msg, "");
        else
            j->answer = proto_error_from_tlm(err, &hs);
        j->err_status = status ? status : hs;
    }
    tlmd_log(st == JOB_DONE ? LOG_INFO : LOG_WARN, "job_end",
             "job=%s state=%s kernels=%d hits=%d misses=%d wall_s=%.3f%s%s%s", j->id,
             state_names[st], j->p.n, j->n_hit, j->n_miss, j->t_end - j->t_start,
             err ? " error=\"" : "", err ? err->msg : "", err ? "\"" : "");
    if (r) job_answer(j, r, st);
    /* The record kept for GET /v1/jobs stays small: binaries are served by /v1/kernels. */
    size_t i;
    json_t *k;
    json_array_foreach(json_object_get(j->answer, "kernels"), i, k) json_object_del(k, "binary");
    for (int t = 0; t < j->p.n; t++)
        if (j->kt[t].kernel) json_object_del(j->kt[t].kernel, "binary");
}

static void job_answer(job *j, http_req *r, job_state st)
{
    if (j->p.stream) {
        if (st == JOB_DONE) {
            json_t *ev =
                json_pack("{s:s, s:s, s:o}", "event", "done", "job", j->id, "stats", job_stats(j));
            if (ev && j->p.model) json_object_set(ev, "model", j->p.model);
            if (ev && j->p.plan) json_object_set(ev, "plan", j->p.plan);
            http_stream_line(r, ev);
        } else {
            json_t *ev = json_deep_copy(j->answer);
            json_object_set_new(ev, "event", json_string("error"));
            json_object_set_new(ev, "job", json_string(j->id));
            json_object_set_new(ev, "status", json_integer(j->err_status));
            http_stream_line(r, ev);
        }
        http_stream_end(r);
    } else if (st == JOB_DONE) {
        http_reply_json(r, 200, json_deep_copy(j->answer));
    } else {
        http_reply_json(r, j->err_status, json_deep_copy(j->answer));
    }
}

static void on_deadline(uv_timer_t *t)
{
    job *j = t->data;
    tlm_error e;
    tlm_err_set(&e, TLM_ELIMIT, "", "the job did not finish within its deadline of %g s",
                j->js->env->cfg.job_timeout_s);
    job_finish(j, JOB_FAILED, &e, 503);
    http_kick(j->js->h);
}

/* ---- base64 for include_binary ---- */

static char *base64(const uint8_t *d, size_t n)
{
    static const char tb[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) |
                     (i + 2 < n ? d[i + 2] : 0);
        *p++ = tb[v >> 18 & 63];
        *p++ = tb[v >> 12 & 63];
        *p++ = i + 1 < n ? tb[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? tb[v & 63] : '=';
    }
    *p = 0;
    return o;
}

/* ---- flights ---- */

static void flight_unlink(flight *f)
{
    for (flight **pp = &f->js->flights; *pp; pp = &(*pp)->next)
        if (*pp == f) {
            *pp = f->next;
            f->js->n_flights--;
            return;
        }
}

static void flight_free_cb(uv_handle_t *h)
{
    free(h->data);
}

static void flight_free(flight *f)
{
    pl_job_free(&f->pj);
    free(f->dec.cands);
    store_kernel_free(&f->sk);
    if (f->timer_open) {
        f->timer_open = false;
        uv_close((uv_handle_t *)&f->l2_timer, flight_free_cb);
    } else {
        free(f);
    }
}

static json_t *kernel_json(const flight *f, const ktask *t, bool hit, bool shared)
{
    const store_kernel *k = &f->sk;
    char url[96];
    snprintf(url, sizeof url, "/v1/kernels/%s", k->key);
    json_t *launch = k->launch_json ? json_loads(k->launch_json, 0, NULL) : NULL;
    json_t *wl = json_loads(t->canon, 0, NULL);
    json_t *o =
        json_pack("{s:o, s:s, s:s, s:s, s:s*, s:s, s:s*, s:s, s:o, s:s, s:I, s:s}", "workload",
                  wl ? wl : json_null(), "workload_hash", t->whash, "key", k->key, "cache",
                  hit ? "hit" : "miss", "schedule", k->schedule, "schedule_source",
                  k->schedule_source ? k->schedule_source : "unknown", "entry", k->entry, "format",
                  k->format, "launch", launch ? launch : json_object(), "binary_sha256",
                  k->binary_sha256, "binary_size", (json_int_t)k->binary_size, "url", url);
    if (o && shared) json_object_set_new(o, "single_flight", json_true());
    if (o && hit) json_object_set_new(o, "cache_tier", json_string(f->l2_hit ? "l2" : "l1"));
    if (o && t->j->p.occ) {
        json_object_set_new(o, "occurrences", json_integer((json_int_t)t->j->p.occ[t->index]));
        json_t *nm = json_string(t->j->p.node[t->index]); /* NULL: UTF-8 cut at 63 bytes */
        json_object_set_new(o, "node", nm ? nm : json_string(""));
    }
    if (o && f->selection && !hit) json_object_set_new(o, "selection", json_string(f->selection));
    if (o && !hit) {
        json_object_set_new(o, "candidates", json_integer(f->pj.n_cands));
        json_object_set_new(o, "records", json_integer(f->n_records));
    }
    if (o && !hit) {
        /* where this kernel's cold latency went (bench/server.sh reads it): lookup_s is the
         * pool wait + store miss + pl_prepare (subgraph and space), queue_s the wait for a
         * decoder slot, decode_s the decoding itself (both 0 when nothing is decoded),
         * codegen_s + compile_s + measure_s summed over the candidates built, total_s the
         * flight from its start to now (its end) */
        const dec_item *d = &f->dec;
        bool decoded = d->t_done > 0;
        json_object_set_new(o, "timing",
                            json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "lookup_s",
                                      f->t_looked_up - f->t_start, "queue_s",
                                      decoded ? d->t_start - d->t_submit : 0.0, "decode_s",
                                      decoded ? d->t_done - d->t_start : 0.0, "codegen_s",
                                      f->codegen_s, "compile_s", f->compile_s, "measure_s",
                                      f->measure_s, "total_s", tlmd_now() - f->t_start));
    }
    if (o && isfinite(k->measured_time_s) && k->measured_time_s > 0)
        json_object_set_new(o, "measured_time_s", json_real(k->measured_time_s));
    return o;
}

static void task_done(ktask *t, flight *f, bool shared)
{
    job *j = t->j;
    if (j->state == JOB_RUNNING) {
        if (f->rc) {
            job_finish(j, JOB_FAILED, &f->err, f->status);
        } else {
            bool hit = f->hit;
            t->kernel = kernel_json(f, t, hit, shared);
            t->done = true;
            j->n_done++;
            if (hit)
                j->n_hit++;
            else
                j->n_miss++;
            if (!shared) {
                j->decode_s += f->decode_s;
                j->codegen_s += f->codegen_s;
                j->compile_s += f->compile_s;
                j->measure_s += f->measure_s;
            }
            json_t *obj = json_deep_copy(t->kernel);
            if (j->p.include_binary && f->sk.binary) {
                char *b64 = base64(f->sk.binary, f->sk.binary_size);
                json_object_set_new(obj, "binary", b64 ? json_string(b64) : json_null());
                free(b64);
                /* keep it in the task's object too: the non-streamed answer is built from them */
                json_object_set(t->kernel, "binary", json_object_get(obj, "binary"));
            }
            if (j->req && j->p.stream)
                http_stream_line(j->req, json_pack("{s:s, s:s, s:i, s:o}", "event", "kernel", "job",
                                                   j->id, "index", t->index, "kernel", obj));
            else
                json_decref(obj);
            if (j->n_done == j->p.n) job_finish(j, JOB_DONE, NULL, 200);
        }
    }
    job_unref(j);
}

static void group_maybe_start(tgroup *g);

static void flight_finish(flight *f)
{
    jobs *js = f->js;
    if (f->group && !f->in_batch) {
        /* it will not be in the group's search (a hit, a failure, a cancel) */
        tgroup *g = f->group;
        f->group = NULL;
        g->members--;
        if (f->group_ready) {
            for (int i = 0; i < g->ready; i++)
                if (g->list[i] == f) g->list[i] = g->list[--g->ready];
        }
        group_maybe_start(g);
    }
    flight_unlink(f);
    if (f->rc == 0) metrics_cache(js->m, f->hit);
    /* the kernel (if any) is in L2 by now (compile_work): the keeper releases the lease */
    if (f->lease_held) l2_lease_drop(js->env->l2, f->key);
    /* waiters were pushed at the front: the leader (who started the flight) is last */
    for (ktask *t = f->waiters, *next; t; t = next) {
        next = t->next_waiter;
        t->next_waiter = NULL;
        t->f = NULL;
        task_done(t, f, next != NULL);
    }
    flight_free(f);
    http_kick(js->h);
}

static void l2_step(flight *f);

/* libuv's pool: the cache lookup (a read: it never waits behind a compile), then L2. */
static void lookup_work(uv_work_t *w)
{
    flight *f = w->data;
    tlm_err_clear(&f->err);
    int rc = store_kernel_get(f->js->env->st, f->key, &f->sk, &f->err);
    if (rc == 0) {
        f->hit = true;
        return;
    }
    if (rc != TLM_ENOTFOUND) {
        /* a broken store is logged and treated as a miss: the compile still answers */
        tlmd_log(LOG_ERROR, "store_get", "key=%s error=\"%s\"", f->key, f->err.msg);
        tlm_err_clear(&f->err);
    }
    memset(&f->sk, 0, sizeof f->sk);
    if (f->js->env->l2) l2_step(f);
}

/* A pool thread: an L2 hit fills L1. */
static bool l2_fetch(flight *f)
{
    l2 *l = f->js->env->l2;
    if (l2_kernel_get(l, f->key, &f->sk) != 0) {
        memset(&f->sk, 0, sizeof f->sk);
        return false;
    }
    tlm_error e;
    if (store_kernel_put(f->js->env->st, &f->sk, &e))
        tlmd_log(LOG_ERROR, "store_put", "key=%s tier=l2 error=\"%s\"", f->key, e.msg);
    f->hit = true;
    f->l2_hit = true;
    return true;
}

/* A pool thread, after an L1 miss (and again at each poll while another daemon holds the
 * lease): L2 → the lease → compile here, or wait. Redis trouble means compiling here. */
static void l2_step(flight *f)
{
    l2 *l = f->js->env->l2;
    if (l2_fetch(f)) {
        if (f->waited) l2_count(l, L2_C_WAIT_HITS);
        return;
    }
    if (!l2_up(l)) return;
    int t = l2_lease_take(l, f->key);
    if (t == 1) {
        /* the holder may have stored it between our GET and our SET NX */
        if (l2_fetch(f)) {
            l2_lease_drop(l, f->key);
            return;
        }
        f->lease_held = true;
        if (f->waited) {
            l2_count(l, L2_C_TAKEOVERS);
            tlmd_log(LOG_WARN, "l2_lease_takeover",
                     "key=%.16s hint=\"the daemon that held the compile lease died or failed; "
                     "compiling here\"",
                     f->key);
        }
    } else if (t == 0) {
        f->l2_wait = true;
    }
}

static void l2_poll_work(uv_work_t *w)
{
    flight *f = w->data;
    tlm_err_clear(&f->err);
    l2_step(f);
}

/* Loop: a flight nobody waits for any more ends here (its steps not yet begun are skipped). */
static bool flight_dropped(flight *f)
{
    if (flight_wanted(f) && !__atomic_load_n(&f->cancelled, __ATOMIC_ACQUIRE)) return false;
    f->rc = tlm_err_set(&f->err, TLM_EUNSUPPORTED, "",
                        "every job that wanted this kernel was cancelled");
    flight_finish(f);
    return true;
}

static bool cancelled_here(flight *f)
{
    if (!__atomic_load_n(&f->cancelled, __ATOMIC_ACQUIRE)) return false;
    f->rc = tlm_err_set(&f->err, TLM_EUNSUPPORTED, "",
                        "every job that wanted this kernel was cancelled");
    return true;
}

/* Compile pool: the pipeline's preparation (subgraph, space, and the candidates of modes
 * that need no model). */
static void prepare_work(pool_work *w)
{
    flight *f = w->data;
    if (cancelled_here(f)) return;
    f->rc = pl_prepare(&f->pj, &f->wl, &f->tgt, &f->opts, &f->err);
}

static void compile_work(pool_work *w);
static void compile_after(pool_work *w);

static void queue_compile(flight *f)
{
    f->pw.data = f;
    f->pw.work = compile_work;
    f->pw.done = compile_after;
    pool_submit(f->js->cp, &f->pw);
}

static void decoded(void *arg)
{
    flight *f = arg;
    f->decode_s = f->dec.t_done - f->dec.t_submit;
    if (f->dec.rc) {
        f->rc = f->dec.rc;
        f->err = f->dec.err;
        flight_finish(f);
        return;
    }
    if (flight_dropped(f)) return;
    queue_compile(f);
}

static void prepare_after(pool_work *w);
static void lookup_after(uv_work_t *w, int status);

/* Loop: another daemon compiles this key; poll L2 and the lease with back-off (25 ms growing
 * to 500 ms). The job's deadline bounds the wait; a dead holder's lease expires. */
static void on_l2_timer(uv_timer_t *t)
{
    flight *f = t->data;
    if (flight_dropped(f)) return;
    f->l2_wait = false;
    f->w.data = f;
    uv_queue_work(f->js->env->loop, &f->w, l2_poll_work, lookup_after);
}

static void l2_wait_arm(flight *f)
{
    if (!f->timer_open) {
        uv_timer_init(f->js->env->loop, &f->l2_timer);
        f->l2_timer.data = f;
        f->timer_open = true;
        f->wait_ms = 25;
        f->waited = true;
        l2_count(f->js->env->l2, L2_C_LEASE_WAITS);
        tlmd_log(LOG_DEBUG, "l2_wait", "key=%.16s", f->key);
    } else {
        f->wait_ms = f->wait_ms * 3 / 2 > 500 ? 500 : f->wait_ms * 3 / 2;
    }
    uv_timer_start(&f->l2_timer, on_l2_timer, (uint64_t)f->wait_ms, 0);
}

static void lookup_after(uv_work_t *w, int status)
{
    flight *f = w->data;
    if (f->hit && !f->rc) hot_put(f->js->env->hot, &f->sk);
    if (f->hit || f->rc) {
        f->t_looked_up = tlmd_now();
        flight_finish(f);
        return;
    }
    if (flight_dropped(f)) return;
    if (f->probe_only) {
        /* a miss for jobs over the limit: no compile starts for them */
        f->rc = tlm_err_set(&f->err, TLM_EUNSUPPORTED, "",
                            "%d jobs are in flight (the limit) and this kernel is not cached; "
                            "retry later",
                            f->js->env->cfg.max_jobs);
        f->status = 429;
        f->t_looked_up = tlmd_now();
        flight_finish(f);
        return;
    }
    if (f->l2_wait) {
        l2_wait_arm(f);
        return;
    }
    f->pw.data = f;
    f->pw.work = prepare_work;
    f->pw.done = prepare_after;
    pool_submit(f->js->cp, &f->pw);
}

static void prepare_after(pool_work *w)
{
    flight *f = w->data;
    f->t_looked_up = tlmd_now();
    if (f->rc) {
        flight_finish(f);
        return;
    }
    if (flight_dropped(f)) return;
    if (f->group) {
        f->group_ready = true;
        f->group->list[f->group->ready++] = f;
        group_maybe_start(f->group);
        return;
    }
    int n = pl_decode_count(&f->pj);
    if (n == 0) {
        queue_compile(f);
        return;
    }
    if (!f->js->d) {
        /* routes only asks for TLM / TOPK when a model is served */
        f->rc = tlm_err_set(&f->err, TLM_EUNSUPPORTED, "mode",
                            "mode %s needs the schedule model, and this server serves none",
                            pl_mode_name(f->pj.o.mode));
        flight_finish(f);
        return;
    }
    f->dec.sp = f->pj.sp;
    f->dec.k = n;
    f->dec.done = decoded;
    f->dec.user = f;
    f->dec.cands = calloc((size_t)n, sizeof *f->dec.cands);
    if (!f->dec.cands) {
        f->rc = tlm_err_set(&f->err, TLM_ENOMEM, "", "out of memory");
        flight_finish(f);
        return;
    }
    int rc = dec_submit(f->js->d, &f->dec);
    if (rc) {
        f->rc = tlm_err_set(&f->err, rc, "", "the decoder is stopped (shutting down)");
        flight_finish(f);
    }
}

static char *dup_or_null(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Pool: every record worth keeping (measured candidates and build failures, chosen or not)
 * goes to the store's measurements: the training data and the searches' history. */
static void store_records(flight *f)
{
    int n = 0;
    tlm_error e;
    if (store_pl_records(f->js->env->st, &f->pj, f->recs_stored, f->pj.n_recs, f->model_id, &n,
                         &e))
        tlmd_log(LOG_ERROR, "store_measurement", "key=%.16s error=\"%s\"", f->key, e.msg);
    f->recs_stored = f->pj.n_recs;
    f->n_records += n;
    metrics_records(f->js->m, n);
}

/* Pool: after the pipeline chose (or failed): the records, then the kernel, go to the
 * store. */
static void compile_store(flight *f)
{
    pl_job *pj = &f->pj;
    f->selection = pj->selection;
    f->codegen_s = pj->codegen_s;
    f->compile_s = pj->compile_s;
    f->measure_s = pj->measure_s;
    store_records(f);
    if (f->rc) return;
    if (__atomic_load_n(&f->cancelled, __ATOMIC_ACQUIRE)) {
        /* a cancelled search keeps its records, not a kernel its budget did not earn */
        f->rc = tlm_err_set(&f->err, TLM_EUNSUPPORTED, "",
                            "every job that wanted this kernel was cancelled");
        return;
    }
    metrics_compile_seconds(f->js->m, f->compile_s);
    char sentence[8192];
    if (pl_sentence(pj, pj->chosen, sentence, sizeof sentence) < 0) sentence[0] = 0;
    drv_artifact *a = &pj->art;
    store_kernel *k = &f->sk;
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%s", f->key);
    k->workload_hash = strdup(f->whash);
    k->target_hash = strdup(f->target_hash);
    k->compiler_id = strdup(f->toolchain);
    k->model_id = strdup(f->model_id);
    k->workload_json = strdup(f->canon);
    k->target_name = strdup(f->tgt.name);
    k->schedule = strdup(a->schedule);
    k->sentence = strdup(sentence);
    k->schedule_source = strdup(pl_source_name(pj->source));
    k->source = a->source;
    k->binary = a->binary;
    k->binary_size = a->binary_size;
    a->source = NULL;
    a->binary = NULL;
    snprintf(k->binary_sha256, sizeof k->binary_sha256, "%s", a->sha256);
    k->format = dup_or_null(a->format);
    k->entry = strdup(a->entry);
    k->launch_json = strdup(a->launch_json);
    k->est_time_s = NAN;
    k->measured_time_s =
        pj->measured && pj->chosen_mr.status == MEASURE_OK ? pj->chosen_mr.median_s : NAN;
    tlm_error pe;
    if (store_kernel_put(f->js->env->st, k, &pe))
        tlmd_log(LOG_ERROR, "store_put", "key=%s error=\"%s\"", f->key, pe.msg);
    /* L2 before the lease goes (flight_finish): a waiting daemon finds the kernel */
    if (f->js->env->l2) {
        int l2rc = l2_kernel_put(f->js->env->l2, k);
        if (l2rc == TLM_ELIMIT)
            tlmd_log(LOG_INFO, "l2_skip", "key=%.16s binary_size=%zu reason=redis_max_blob_bytes",
                     f->key, k->binary_size);
    }
    if (f->gen_key[0]) {
        /* a tuned kernel is this server's (and, through L2, the cluster's) best known for the
         * workload: generate requests for it are served this kernel from now on (its
         * schedule_source says "tuned") */
        char key[65];
        memcpy(key, k->key, sizeof key);
        snprintf(k->key, sizeof k->key, "%s", f->gen_key);
        if (store_kernel_put(f->js->env->st, k, &pe))
            tlmd_log(LOG_ERROR, "store_put", "key=%s error=\"%s\"", f->gen_key, pe.msg);
        if (f->js->env->l2) l2_kernel_put(f->js->env->l2, k);
        memcpy(k->key, key, sizeof key);
    }
    metrics_compile_done(f->js->m);
}

/* Pool: the decoded candidates in, then the pipeline builds, measures (per its policy) and
 * chooses; the kernel and the records go to the store. */
static void compile_work(pool_work *w)
{
    flight *f = w->data;
    if (cancelled_here(f)) return;
    pl_job *pj = &f->pj;
    tlm_error e;
    tlm_err_clear(&e);
    pl_source src = pj->o.mode == PL_MODE_TOPK ? PL_SRC_TOPK : PL_SRC_TLM;
    for (int i = 0; i < f->dec.n_cands; i++)
        if (pl_add_candidate(pj, &f->dec.cands[i].sched, src, f->dec.cands[i].score, &e))
            tlmd_log(LOG_WARN, "candidate", "key=%.16s index=%d error=\"%s\"", f->key, i, e.msg);
    f->rc = pl_finish(pj, &f->err);
    compile_store(f);
}

/* Loop: a kernel just stored goes to the hot cache, and a tuned one also under the key
 * generate requests look up (it replaces what was served there). */
static void hot_note_compiled(flight *f)
{
    if (f->rc || !f->sk.binary) return;
    hot_put(f->js->env->hot, &f->sk);
    if (f->gen_key[0]) {
        char key[65];
        memcpy(key, f->sk.key, sizeof key);
        memcpy(f->sk.key, f->gen_key, sizeof key);
        hot_put(f->js->env->hot, &f->sk);
        memcpy(f->sk.key, key, sizeof key);
    }
}

static void compile_after(pool_work *w)
{
    flight *f = w->data;
    tlmd_log(LOG_DEBUG, "compiled",
             "key=%.16s rc=%d source=%s candidates=%d records=%d decode_s=%.3f codegen_s=%.3f "
             "compile_s=%.3f measure_s=%.3f",
             f->key, f->rc, f->rc ? "-" : pl_source_name(f->pj.source), f->pj.n_cands, f->n_records,
             f->decode_s, f->codegen_s, f->compile_s, f->measure_s);
    hot_note_compiled(f);
    flight_finish(f);
}

/* Compile pool: the group's one search over its kernels, then each kernel to the store. */
static void group_work(pool_work *w)
{
    tgroup *g = w->data;
    tune_task *tasks = calloc((size_t)g->ready, sizeof *tasks);
    if (!tasks) {
        g->rc = tlm_err_set(&g->err, TLM_ENOMEM, "", "out of memory");
    } else {
        for (int i = 0; i < g->ready; i++) {
            tasks[i].job = &g->list[i]->pj;
            tasks[i].weight = g->list[i]->weight;
        }
        tune_opts o;
        tune_opts_init(&o);
        o.trials = g->trials > 0 ? g->trials : 64 * g->ready;
        o.seconds = g->seconds;
        if (g->seed) o.seed = g->seed;
        o.model = g->model;
        g->rc = tune_strategy_parse(g->strategy, &o.strategy, &g->err);
        if (!g->rc && o.strategy == TUNE_HTAM) {
            /* one budget over the kernels, through the search's task scheduler */
            g->rc = htam_search_tasks(tasks, g->ready, o.trials, o.seconds, o.seed, &g->err);
        } else if (!g->rc) {
            g->rc = tune_tasks(tasks, g->ready, &o, NULL, NULL, &g->err);
        }
    }
    for (int i = 0; i < g->ready; i++) {
        flight *f = g->list[i];
        f->rc = f->pj.chosen >= 0 ? 0 : g->rc ? g->rc : TLM_ERUNTIME;
        if (f->rc) f->err = g->rc ? g->err : (tlm_error){.code = TLM_ERUNTIME};
        compile_store(f);
    }
    free(tasks);
}

static void group_done(pool_work *w)
{
    tgroup *g = w->data;
    for (int i = 0; i < g->ready; i++) {
        flight *f = g->list[i];
        f->in_batch = true;
        compile_after(&f->pw);
    }
    free(g->list);
    free(g);
}

/* Loop: starts the group's search once every member is prepared (or gone); frees a group
 * nobody joined. */
static void group_maybe_start(tgroup *g)
{
    if (g->started || g->ready < g->members) return;
    if (g->members == 0) {
        free(g->list);
        free(g);
        return;
    }
    g->started = true;
    tlmd_log(LOG_INFO, "tune_group", "kernels=%d trials=%d seconds=%g", g->ready, g->trials,
             g->seconds);
    g->pw.data = g;
    g->pw.work = group_work;
    g->pw.done = group_done;
    pool_submit(g->js->cp, &g->pw);
}

/* A search's progress report, carried from the compile pool to the loop. */
typedef struct {
    pool_work w;
    flight *f;
    pl_progress p;
} progress_note;

static json_t *ms_json(double s)
{
    return isfinite(s) ? json_real(s * 1e3) : json_null();
}

/* Loop: a progress event to every streaming job that waits on the flight (the flight lives
 * until its compile's completion, which is delivered after this). */
static void progress_done(pool_work *w)
{
    progress_note *n = w->data;
    flight *f = n->f;
    for (ktask *t = f->waiters; t; t = t->next_waiter) {
        job *j = t->j;
        if (!j->req || !j->p.stream || j->state != JOB_RUNNING) continue;
        http_stream_line(j->req,
                         json_pack("{s:s, s:s, s:i, s:s, s:i, s:i, s:i, s:o, s:o, s:f}", "event",
                                   "progress", "job", j->id, "index", t->index, "phase",
                                   n->p.phase, "trial", n->p.trials, "trials", n->p.trials_budget,
                                   "round", n->p.round, "best_ms", ms_json(n->p.best_s),
                                   "first_ms", ms_json(n->p.first_s), "elapsed_s",
                                   n->p.elapsed_s));
    }
    http_kick(f->js->h);
    free(n);
}

/* Compile pool (inside pl_finish): hands a progress report to the loop. */
static void flight_progress(const pl_job *pj, const pl_progress *p, void *user)
{
    flight *f = user;
    progress_note *n = calloc(1, sizeof *n);
    if (!n) return;
    n->f = f;
    n->p = *p;
    n->w.data = n;
    n->w.done = progress_done;
    pool_post(f->js->cp, &n->w);
}

/* Compile pool (inside pl_finish): the search's records go to the store as they are made,
 * so a tune that is killed keeps what it measured. */
static void flight_records(const pl_job *pj, int from, int to, void *user)
{
    store_records(user);
}

static void start_task(job *j, ktask *t)
{
    jobs *js = j->js;
    /* a cancelled flight may already have skipped its compile: a new task starts afresh */
    for (flight *f = js->flights; f; f = f->next)
        if (!strcmp(f->key, t->key) && !__atomic_load_n(&f->cancelled, __ATOMIC_ACQUIRE)) {
            /* a job within the limit may compile what a probe looked up */
            if (!j->over_limit) f->probe_only = false;
            t->next_waiter = f->waiters;
            f->waiters = t;
            t->f = f;
            j->refs++;
            metrics_single_flight_join(js->m);
            return;
        }
    flight *f = calloc(1, sizeof *f);
    if (!f) {
        tlm_error e;
        tlm_err_set(&e, TLM_ENOMEM, "", "out of memory");
        job_finish(j, JOB_FAILED, &e, 500);
        return;
    }
    f->js = js;
    snprintf(f->key, sizeof f->key, "%s", t->key);
    f->tgt = j->p.tgt;
    f->wl = t->wl;
    snprintf(f->canon, sizeof f->canon, "%s", t->canon);
    snprintf(f->whash, sizeof f->whash, "%s", t->whash);
    snprintf(f->target_hash, sizeof f->target_hash, "%s", j->target_hash);
    snprintf(f->model_id, sizeof f->model_id, "%s", j->model_id);
    drv_toolchain_key(&j->p.tgt, f->toolchain, sizeof f->toolchain);
    pl_opts_init(&f->opts);
    f->opts.mode = j->p.mode;
    f->opts.k = j->p.mode == PL_MODE_TOPK ? j->p.k : 1;
    f->opts.model = js->env->model;
    f->opts.trials = j->p.trials;
    f->opts.seconds = j->p.seconds;
    f->opts.strategy = j->p.strategy[0] ? j->p.strategy : NULL;
    /* a network's weights measured packed once, as its plan runs them */
    f->opts.mo.const_args = j->p.consts ? j->p.consts[t->index] : 0;
    if (j->p.mode == PL_MODE_TUNE) {
        f->opts.cancel = &f->cancelled;
        f->opts.progress = flight_progress;
        f->opts.on_records = flight_records;
        f->opts.user = f;
        snprintf(f->gen_key, sizeof f->gen_key, "%s", t->gen_key);
        f->weight = j->p.occ ? (double)j->p.occ[t->index] : 1.0;
        if (j->group) {
            f->group = j->group;
            j->group->members++;
        }
    }
    f->pj.chosen = -1;
    f->probe_only = j->over_limit;
    f->t_start = tlmd_now();
    f->waiters = t;
    t->f = f;
    j->refs++;
    f->next = js->flights;
    js->flights = f;
    js->n_flights++;
    /* a hot kernel (hot.c) is a hit in this turn of the loop: no store read, no thread */
    const store_kernel *hk = f->group ? NULL : hot_get(js->env->hot, f->key);
    if (hk && store_kernel_note_use(js->env->st, f->key) && store_kernel_copy(&f->sk, hk) == 0) {
        f->hit = true;
        f->t_looked_up = tlmd_now();
        flight_finish(f);
        return;
    }
    f->w.data = f;
    uv_queue_work(js->env->loop, &f->w, lookup_work, lookup_after);
}

void job_start(jobs *js, http_req *r, job_params *p)
{
    job *j = calloc(1, sizeof *j);
    ktask *kt = j ? calloc((size_t)p->n, sizeof *kt) : NULL;
    if (!kt) {
        free(j);
        job_params_free(p);
        http_reply_error(r, 500, PROTO_CODE_INTERNAL, "out of memory", "");
        return;
    }
    j->js = js;
    j->p = *p;
    p->wl = NULL;
    p->occ = NULL;
    p->consts = NULL;
    p->node = NULL;
    p->model = NULL;
    p->plan = NULL;
    j->kt = kt;
    j->over_limit = js->in_flight >= js->env->cfg.max_jobs;
    snprintf(j->id, sizeof j->id, "j%llu-%s", (unsigned long long)++js->next_job_id, js->epoch);
    j->t_start = tlmd_now();
    j->created_wall = tlmd_wall();
    j->state = JOB_RUNNING;
    target_hash_hex(&j->p.tgt, j->target_hash);
    /* The key's model and options name what decides the schedule: the effective mode and
     * the model that decodes it ("none" for default schedules, which no model touches), so
     * default and model kernels never share a key, and default kernels are shared by every
     * server whatever its weights. */
    bool uses_model = j->p.mode == PL_MODE_TLM || j->p.mode == PL_MODE_TOPK;
    snprintf(j->model_id, sizeof j->model_id, "%s", uses_model ? js->env->model_id : "none");
    int on = snprintf(j->options, sizeof j->options, "mode=%s;model=%s", pl_mode_name(j->p.mode),
                      j->model_id);
    if (j->p.mode == PL_MODE_TOPK)
        snprintf(j->options + on, sizeof j->options - (size_t)on, ";k=%d", j->p.k);
    else if (j->p.mode == PL_MODE_TUNE || j->p.mode == PL_MODE_REFINE)
        snprintf(j->options + on, sizeof j->options - (size_t)on,
                 ";trials=%d;seconds=%g;strategy=%s", j->p.trials, j->p.seconds, j->p.strategy);
    char toolchain[768];
    drv_toolchain_key(&j->p.tgt, toolchain, sizeof toolchain);
    /* what a generate request decides with, for the keys tuned kernels are also stored under */
    char gen_options[192], gen_model[65];
    pl_mode gen_mode = js->env->model ? PL_MODE_TLM : PL_MODE_DEFAULT;
    snprintf(gen_model, sizeof gen_model, "%s",
             gen_mode == PL_MODE_TLM ? js->env->model_id : "none");
    snprintf(gen_options, sizeof gen_options, "mode=%s;model=%s", pl_mode_name(gen_mode),
             gen_model);
    for (int i = 0; i < j->p.n; i++) {
        ktask *t = &kt[i];
        t->j = j;
        t->index = i;
        t->wl = j->p.wl[i];
        tlm_error e;
        if (ir_workload_canonical(&t->wl, t->canon, sizeof t->canon) < 0 ||
            ir_workload_hash_hex(&t->wl, t->whash) ||
            store_cache_key(t->canon, j->target_hash, toolchain, j->model_id, j->options, t->key,
                            &e) ||
            (j->p.mode == PL_MODE_TUNE &&
             store_cache_key(t->canon, j->target_hash, toolchain, gen_model, gen_options,
                             t->gen_key, &e))) {
            job_params_free(&j->p);
            free(kt);
            free(j);
            http_reply_error(r, 500, PROTO_CODE_INTERNAL, "cannot form a cache key", "");
            return;
        }
    }
    j->refs = 1; /* the request */
    j->req = r;
    r->job = j;
    r->detach = job_detach;
    uv_timer_init(js->env->loop, &j->deadline);
    j->deadline.data = j;
    j->timer_open = true;
    uv_timer_start(&j->deadline, on_deadline, (uint64_t)(js->env->cfg.job_timeout_s * 1000), 0);
    js->in_flight++;
    jobs_remember(j);
    tlmd_log(LOG_INFO, "job_start",
             "job=%s target=%s kernels=%d mode=%s effective_mode=%s stream=%s%s", j->id,
             j->p.tgt.name, j->p.n, j->p.mode_name, pl_mode_name(j->p.mode),
             j->p.stream ? "true" : "false", j->over_limit ? " over_limit=cache_only" : "");
    if (j->p.stream) {
        http_stream_start(r);
        json_t *ev = json_pack("{s:s, s:s, s:i, s:o}", "event", "accepted", "job", j->id, "kernels",
                               j->p.n, "target", target_obj(j));
        if (ev && j->p.model) json_object_set(ev, "model", j->p.model);
        http_stream_line(r, ev);
    } else {
        http_suspend(r);
    }
    if (j->p.mode == PL_MODE_TUNE && j->p.n > 1 && !j->over_limit) {
        tgroup *g = calloc(1, sizeof *g);
        flight **list = g ? calloc((size_t)j->p.n, sizeof *list) : NULL;
        if (list) {
            g->js = js;
            g->list = list;
            g->trials = j->p.trials;
            g->seconds = j->p.seconds;
            snprintf(g->strategy, sizeof g->strategy, "%s", j->p.strategy);
            g->model = js->env->model;
            j->group = g;
        } else {
            free(g); /* out of memory: each kernel gets its own search */
        }
    }
    j->refs++; /* held across the loop below: a task may finish the job synchronously */
    for (int i = 0; i < j->p.n && j->state == JOB_RUNNING; i++)
        start_task(j, &kt[i]);
    if (j->group) {
        tgroup *g = j->group;
        j->group = NULL; /* the flights hold it now */
        group_maybe_start(g);
    }
    job_unref(j);
}

json_t *job_lookup_json(jobs *js, const char *id, bool *found)
{
    job *j = job_find(js, id);
    *found = j != NULL;
    if (!j) return NULL;
    json_t *o = json_pack("{s:s, s:s, s:i, s:i, s:f, s:o}", "job", j->id, "state",
                          state_names[j->state], "kernels_total", j->p.n, "kernels_done", j->n_done,
                          "created_at", j->created_wall, "stats", job_stats(j));
    if (j->state != JOB_RUNNING && j->answer) {
        json_t *a = json_deep_copy(j->answer);
        /* binaries are served by /v1/kernels/{key}; the job record stays small */
        json_t *ks = json_object_get(a, "kernels");
        size_t i;
        json_t *k;
        json_array_foreach(ks, i, k) json_object_del(k, "binary");
        json_object_set_new(o, j->state == JOB_DONE ? "answer" : "error",
                            j->state == JOB_DONE ? a : json_incref(json_object_get(a, "error")));
        if (j->state != JOB_DONE) json_decref(a);
    }
    return o;
}

int job_cancel(jobs *js, const char *id)
{
    job *j = job_find(js, id);
    if (!j) return TLM_ENOTFOUND;
    tlm_error e;
    tlm_err_set(&e, TLM_EUNSUPPORTED, "", "the job was cancelled");
    if (j->state == JOB_RUNNING) job_finish(j, JOB_CANCELLED, &e, 503);
    return 0;
}

void jobs_fail_all(jobs *js, const char *why)
{
    tlm_error e;
    tlm_err_set(&e, TLM_EUNSUPPORTED, "", "%s", why);
    for (job *j = js->list; j; j = j->next)
        if (j->state == JOB_RUNNING) job_finish(j, JOB_FAILED, &e, 503);
}

/* After the loop ended: every flight has returned (the loop only ends when no pool work is
 * pending), so what is left are the remembered jobs. */
void jobs_free(jobs *js)
{
    if (!js) return;
    while (js->list) {
        job *j = js->list;
        js->list = j->next;
        job_unref(j);
    }
    free(js);
}
