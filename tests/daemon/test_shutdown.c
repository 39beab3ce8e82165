/* test_shutdown.c — SIGTERM while compile jobs are in flight (the real sanitized tlmd on
 * loopback, a temporary store, grace_s = 1 from a config file).
 *
 * What must hold, each checked so that it can fail:
 *  - work really was in flight when the signal went: every job was accepted and its record
 *    said "running" with kernels left to do just before the kill, and the daemon's own
 *    shutdown log line counts those jobs;
 *  - every client got a complete answer: 200 with all its kernels, or 503 with an
 *    "unavailable" error body (a buffered answer), or a stream that ends with a "done" or an
 *    "error" event; never a reset or a cut-off body (curl reports those as status 0);
 *  - tlmd exits with status 0 within the grace period plus its hard-stop margin;
 *  - the store passes SQLite's integrity check and the daemon starts again on it. */
#include <pthread.h>
#include <sqlite3.h>

#include "tests/common/tlmd_harness.h"

enum { N_CLIENTS = 4, N_WORKLOADS = 16, GRACE_S = 1 };

typedef struct {
    const tlmd *d;
    int i;
    bool stream;
    resp r;
} client;

/* N_WORKLOADS distinct CPU kernels per client: a job takes seconds, far beyond the grace. */
static void *client_main(void *arg)
{
    client *c = arg;
    char body[8192];
    int n = snprintf(body, sizeof body, "{\"target\":\"cpu\",%s\"workloads\":[",
                     c->stream ? "\"stream\":true," : "");
    for (int k = 0; k < N_WORKLOADS; k++)
        n += snprintf(body + n, sizeof body - (size_t)n,
                      "%s{\"op\":\"dense\",\"shape\":{\"M\":%d,\"N\":%d,\"K\":64},"
                      "\"epilogue\":[\"bias_add\",\"relu\"]}",
                      k ? "," : "", 24 + 8 * k, 40 + 8 * c->i);
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    c->r = post(c->d, body);
    return NULL;
}

/* The record of job jID, or NULL while there is none (not accepted yet). */
/* The record of the id-th job (ids are "j<n>-<run>", unique across restarts: the full id is
 * in the log's job_start line); NULL while it is not accepted. */
static json_t *job_record(const tlmd *d, int id)
{
    char want[32], full[64];
    snprintf(want, sizeof want, "msg=job_start job=j%d-", id);
    if (!logged_job_id(d, want, full)) return NULL;
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%s", full);
    resp r = get(d, path);
    json_t *j = r.status == 200 ? body_json(&r) : NULL;
    cr_assert(j || r.status == 404, "GET %s: %ld %s", path, r.status, r.body.p);
    resp_free(&r);
    return j;
}

static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

/* A buffered answer: all kernels, or the shutdown's 503. Returns 1 when it was the 503. */
static int check_buffered(const client *c)
{
    json_t *j = body_json(&c->r);
    int failed = 0;
    if (c->r.status == 200) {
        json_t *ks = json_object_get(j, "kernels");
        cr_assert_eq(json_array_size(ks), N_WORKLOADS, "client %d: %s", c->i, c->r.body.p);
        for (size_t k = 0; k < json_array_size(ks); k++)
            cr_assert_eq(strlen(jstr(json_array_get(ks, k), "key")), 64, "client %d", c->i);
    } else {
        cr_assert_eq(c->r.status, 503, "client %d: status %ld: %s", c->i, c->r.status, c->r.body.p);
        json_t *e = json_object_get(j, "error");
        cr_assert_str_eq(jstr(e, "code"), "unavailable", "client %d: %s", c->i, c->r.body.p);
        cr_assert(strstr(jstr(e, "message"), "shutting down"), "client %d: %s", c->i, c->r.body.p);
        failed = 1;
    }
    json_decref(j);
    return failed;
}

/* A stream: every line is JSON, "accepted" first, "done" or "error" (503) last. */
static int check_stream(const client *c)
{
    cr_assert_eq(c->r.status, 200, "stream: status %ld", c->r.status);
    cr_assert(c->r.body.p && c->r.body.n && c->r.body.p[c->r.body.n - 1] == '\n',
              "the stream does not end with a whole line: %s", c->r.body.p);
    char *text = strdup(c->r.body.p);
    json_t *first = NULL, *last = NULL;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_t *ev = json_loads(l, 0, NULL);
        cr_assert(ev, "stream line is not JSON: %s", l);
        if (!first)
            first = ev;
        else {
            if (last) json_decref(last);
            last = ev;
        }
    }
    free(text);
    cr_assert(first && last, "%s", c->r.body.p);
    cr_assert_str_eq(jstr(first, "event"), "accepted");
    const char *end = jstr(last, "event");
    int failed = !strcmp(end, "error");
    cr_assert(failed || !strcmp(end, "done"), "the stream ends with %s", end);
    if (failed) {
        cr_assert_eq(json_integer_value(json_object_get(last, "status")), 503);
        cr_assert_str_eq(jstr(json_object_get(last, "error"), "code"), "unavailable");
    }
    json_decref(first);
    json_decref(last);
    return failed;
}

/* jobs_in_flight=N from the daemon's "shutdown" log line; -1 when absent. */
static int logged_jobs_in_flight(const tlmd *d)
{
    FILE *f = fopen(d->log, "r");
    cr_assert(f, "%s", d->log);
    char line[4096];
    int n = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "reason=SIGTERM");
        const char *q = p ? strstr(line, "jobs_in_flight=") : NULL;
        if (q) n = atoi(q + strlen("jobs_in_flight="));
    }
    fclose(f);
    return n;
}

Test(shutdown, sigterm_with_jobs_in_flight_answers_every_client_and_exits_0)
{
    tlmd d;
    setup_dir(&d);
    char conf[400];
    snprintf(conf, sizeof conf, "%s/tlmd.conf", d.dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fprintf(f, "# test configuration\ngrace_s = %d\njob_timeout_s = 300\n", GRACE_S);
    fclose(f);
    const char *extra[] = {"--config", conf, NULL};
    start(&d, extra);

    client cs[N_CLIENTS];
    pthread_t th[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        cs[i] = (client){.d = &d, .i = i, .stream = i == 0};
        cr_assert_eq(pthread_create(&th[i], NULL, client_main, &cs[i]), 0);
    }
    /* Every job accepted, and work left in at least one, job by job. GET /v1/jobs is answered
     * on the loop thread; /metrics is not used here because it waits for a pool thread, behind
     * the compiles. */
    int accepted = 0, running = 0;
    for (double t0 = tlm_now_s(); accepted < N_CLIENTS && tlm_now_s() - t0 < 60;) {
        accepted = running = 0;
        for (int id = 1; id <= N_CLIENTS; id++) {
            json_t *j = job_record(&d, id);
            if (!j) continue;
            accepted++;
            json_int_t done = json_integer_value(json_object_get(j, "kernels_done"));
            json_int_t total = json_integer_value(json_object_get(j, "kernels_total"));
            cr_assert_eq(total, N_WORKLOADS, "job j%d", id);
            running += !strcmp(jstr(j, "state"), "running") && done < total;
            json_decref(j);
        }
        if (accepted < N_CLIENTS) usleep(10000);
    }
    cr_assert_eq(accepted, N_CLIENTS, "the jobs were never all accepted; see %s", d.log);
    cr_assert(running >= 1, "no job was running with work left when SIGTERM was sent");

    double t_kill = tlm_now_s();
    int st = stop_with(&d, SIGTERM, 60);
    double took = tlm_now_s() - t_kill;
    cr_assert(st >= 0, "tlmd did not exit within 60 s of SIGTERM; see %s", d.log);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status %d; see %s", st, d.log);
    /* grace, then up to 3 s for the answers to leave, then the hard stop (grace + 1 s) */
    cr_assert(took < 2 * GRACE_S + 10, "exit took %.1f s", took);
    cr_assert(logged_jobs_in_flight(&d) >= 1,
              "the shutdown log line counts no job in flight; see %s", d.log);

    int failed = 0;
    for (int i = 0; i < N_CLIENTS; i++) {
        pthread_join(th[i], NULL);
        cr_assert(cs[i].r.status != 0, "client %d got no complete answer: %s", i, cs[i].r.err);
        failed += cs[i].stream ? check_stream(&cs[i]) : check_buffered(&cs[i]);
        resp_free(&cs[i].r);
    }
    cr_log_info("SIGTERM with %d jobs in flight; exit 0 after %.1f s; %d of %d answers were the "
                "shutdown's 503",
                logged_jobs_in_flight(&d), took, failed, N_CLIENTS);
    /* jobs of seconds each against a 1 s grace: the shutdown must have cut some short */
    cr_assert(failed >= 1, "every job finished within the grace period: the test proved nothing");

    /* the store is consistent and the daemon starts again on it */
    sqlite3 *db;
    cr_assert_eq(sqlite3_open(d.store, &db), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(db);
    start(&d, NULL);
    resp r = post(&d, "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":24,"
                      "\"N\":40,\"K\":64},\"epilogue\":[\"bias_add\",\"relu\"]}]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    resp_free(&r);
    teardown(&d);
}
