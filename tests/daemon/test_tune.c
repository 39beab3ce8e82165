/* test_tune.c — mode "tune" in the real tlmd: streamed progress, the tuned kernel (and its
 * records) in the store, generate requests served the tuned kernel afterwards, cancel keeps
 * what was measured, and the refusals. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sqlite3.h>

#include "tests/common/tlmd_harness.h"

TestSuite(tune, .timeout = 900);

#define WL "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":40,\"K\":16},\"epilogue\":[\"relu\"]}"

static long long rows(const tlmd *d, const char *where)
{
    sqlite3 *h = NULL;
    if (sqlite3_open_v2(d->store, &h, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        sqlite3_close(h);
        return -1;
    }
    sqlite3_busy_timeout(h, 5000);
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM measurements %s", where ? where : "");
    sqlite3_stmt *s = NULL;
    long long n = -1;
    if (sqlite3_prepare_v2(h, sql, -1, &s, NULL) == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
        n = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(h);
    return n;
}

/* A statement over HTAM's memory in d's store (its tuner_nodes: workload "htam", target
 * "cpu"), selecting columns; finalize it, then close *h. */
static sqlite3_stmt *htam_memory_rows(const tlmd *d, const char *columns, sqlite3 **h)
{
    char sql[256];
    snprintf(sql, sizeof sql,
             "SELECT %s FROM tuner_nodes WHERE workload_hash = 'htam' AND target_hash = 'cpu'",
             columns);
    *h = NULL;
    cr_assert_eq(sqlite3_open_v2(d->store, h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(*h, sql, -1, &s, NULL), SQLITE_OK);
    return s;
}

static json_t *kernel_of(const resp *r)
{
    json_t *j = body_json(r);
    json_t *k = json_incref(json_array_get(json_object_get(j, "kernels"), 0));
    json_decref(j);
    return k;
}

/* Tunes WL and two other kernels under one budget of trials in one streamed request (strategy
 * NULL: the default one) and checks its events: each progress event names one of the three,
 * each kernel event has schedule_source source, none is an error. Counts the progress events
 * per kernel in progress_of; returns the number of kernel events. */
static int tune_three_kernels(const tlmd *d, const char *strategy, int trials, const char *source,
                              int progress_of[3])
{
    char strategy_field[64] = "", body[512];
    if (strategy) snprintf(strategy_field, sizeof strategy_field, "\"strategy\":\"%s\",", strategy);
    snprintf(body, sizeof body,
             "{\"target\":\"cpu\",\"mode\":\"tune\",%s\"budget\":{\"trials\":%d},"
             "\"stream\":true,\"workloads\":[" WL ","
             "{\"op\":\"dense\",\"shape\":{\"M\":32,\"N\":32,\"K\":32}},"
             "{\"op\":\"softmax\",\"shape\":{\"R\":16,\"C\":100}}]}",
             strategy_field, trials);
    resp r = post(d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    int kernels = 0;
    progress_of[0] = progress_of[1] = progress_of[2] = 0;
    for (char *line = strtok(r.body.p, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *ev = json_loads(line, 0, NULL);
        cr_assert_not_null(ev, "%s", line);
        const char *what = json_string_value(json_object_get(ev, "event"));
        int index = (int)json_integer_value(json_object_get(ev, "index"));
        if (!strcmp(what, "progress")) {
            cr_assert(index >= 0 && index < 3);
            progress_of[index]++;
        } else if (!strcmp(what, "kernel")) {
            kernels++;
            json_t *k = json_object_get(ev, "kernel");
            cr_assert_str_eq(json_string_value(json_object_get(k, "schedule_source")), source, "%s",
                             line);
        } else {
            cr_assert(strcmp(what, "error"), "%s", line);
        }
        json_decref(ev);
    }
    resp_free(&r);
    return kernels;
}

Test(tune, streams_progress_stores_records_and_serves_the_tuned_kernel_to_generate)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    resp v = get(&d, "/v1/version");
    cr_assert(strstr(v.body.p, "\"tune\""), "modes lack tune: %s", v.body.p);
    resp_free(&v);

    resp r = post(&d, "{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"trials\":6},"
                      "\"stream\":true,\"workloads\":[" WL "]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    int progress = 0, last_trial = 0;
    json_t *kernel = NULL;
    for (char *line = strtok(r.body.p, "\n"); line; line = strtok(NULL, "\n")) {
        json_error_t je;
        json_t *ev = json_loads(line, 0, &je);
        cr_assert_not_null(ev, "not JSON: %s", line);
        const char *what = json_string_value(json_object_get(ev, "event"));
        if (!strcmp(what, "progress")) {
            int trial = (int)json_integer_value(json_object_get(ev, "trial"));
            cr_assert_geq(trial, last_trial, "trials count up");
            last_trial = trial;
            cr_assert_eq(json_integer_value(json_object_get(ev, "trials")), 6);
            cr_assert(json_is_number(json_object_get(ev, "best_ms")), "%s", line);
            progress++;
        } else if (!strcmp(what, "kernel")) {
            kernel = json_incref(json_object_get(ev, "kernel"));
        }
        json_decref(ev);
    }
    cr_assert_geq(progress, 1, "no progress event");
    cr_assert_eq(last_trial, 6);
    cr_assert_not_null(kernel, "no kernel event");
    cr_assert_str_eq(json_string_value(json_object_get(kernel, "schedule_source")), "tuned");
    const char *tuned_schedule = json_string_value(json_object_get(kernel, "schedule"));
    cr_assert(tuned_schedule);
    resp_free(&r);
    /* one record per trial, and the second look at the top 3 and the start (unless among
     * them), three rounds each */
    long long recs = rows(&d, NULL);
    cr_assert(recs == 6 + 3 * 3 || recs == 6 + 3 * 4, "%lld records", recs);
    cr_assert_eq(rows(&d, "WHERE status = 'ok' AND median_s > 0"), recs);

    /* generate for the same workload: the tuned kernel, from the cache */
    r = post(&d, "{\"target\":\"cpu\",\"workloads\":[" WL "]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *g = kernel_of(&r);
    cr_assert_str_eq(json_string_value(json_object_get(g, "schedule_source")), "tuned",
                     "%s", r.body.p);
    cr_assert_str_eq(json_string_value(json_object_get(g, "schedule")), tuned_schedule);
    cr_assert_str_eq(json_string_value(json_object_get(g, "cache")), "hit", "%s", r.body.p);
    json_decref(g);
    resp_free(&r);
    /* the same tune again is a hit: nothing is measured twice */
    r = post(&d, "{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"trials\":6},"
                 "\"workloads\":[" WL "]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    resp_free(&r);
    cr_assert_eq(rows(&d, NULL), recs);
    json_decref(kernel);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(tune, several_kernels_share_one_budget_through_the_task_scheduler)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    int progress_of[3];
    int kernels = tune_three_kernels(&d, NULL, 24, "tuned", progress_of);
    cr_assert_eq(kernels, 3);
    for (int i = 0; i < 3; i++) cr_assert_geq(progress_of[i], 1, "kernel %d had no round", i);
    /* the budget is for the request, not per kernel: 24 trials (and a second look at each
     * kernel's top 3 and its starting point, three rounds each) */
    long long n = rows(&d, NULL);
    cr_assert(n >= 24 && n <= 24 + 3 * 3 * 4, "%lld records", n);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(tune, a_graphs_weights_are_measured_packed_once_and_its_records_say_so)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    /* d binds the param w (argument 1) in its one launch; the softmax reads an activation */
    resp r = post(&d, "{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"trials\":8},"
                      "\"graph\":{\"inputs\":[{\"name\":\"x\",\"shape\":[24,48]},"
                      "{\"name\":\"w\",\"shape\":[48,40],\"param\":true}],"
                      "\"nodes\":[{\"name\":\"d\",\"op\":\"dense\",\"inputs\":[\"x\",\"w\"]},"
                      "{\"name\":\"s\",\"op\":\"softmax\",\"inputs\":[\"d\"]}],"
                      "\"outputs\":[\"s\"]}}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    resp_free(&r);
    long long dense = rows(&d, "WHERE workload_json LIKE '%\"dense\"%'"),
              dense_once = rows(&d, "WHERE workload_json LIKE '%\"dense\"%' "
                                    "AND toolchain_id LIKE '%; const_args=0x2'"),
              soft = rows(&d, "WHERE workload_json LIKE '%\"softmax\"%'"),
              soft_once = rows(&d, "WHERE workload_json LIKE '%\"softmax\"%' "
                                   "AND toolchain_id LIKE '%const_args%'");
    cr_expect(dense >= 1 && soft >= 1, "dense %lld, softmax %lld records", dense, soft);
    cr_expect_eq(dense_once, dense, "every dense record names its weights packed once");
    cr_expect_eq(soft_once, 0);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(tune, strategy_htam_refines_and_keeps_its_memory_in_the_store)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    resp r = post(&d, "{\"target\":\"cpu\",\"mode\":\"tune\",\"strategy\":\"htam\","
                      "\"budget\":{\"trials\":5},\"stream\":true,\"workloads\":[" WL "]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    cr_assert(strstr(r.body.p, "\"event\":\"progress\""), "progress per step: %s", r.body.p);
    cr_assert(strstr(r.body.p, "\"schedule_source\":\"htam\""), "%s", r.body.p);
    resp_free(&r);
    /* the start and four steps, then the second look at the three fastest and the start
     * (unless among them), three rounds each */
    long long recs = rows(&d, NULL);
    cr_assert(recs == 5 + 3 * 2 || recs == 5 + 3 * 3 || recs == 5 + 3 * 4, "%lld records", recs);
    sqlite3 *h;
    sqlite3_stmt *s = htam_memory_rows(&d, "count(*)", &h);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_gt(sqlite3_column_int(s, 0), 10, "the memory's nodes are in the store");
    sqlite3_finalize(s);
    sqlite3_close(h);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(tune, strategy_htam_on_several_kernels_spends_one_budget)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    int progress_of[3];
    int kernels = tune_three_kernels(&d, "htam", 12, "htam", progress_of);
    cr_assert_eq(kernels, 3);
    /* progress per step (not per round): a kernel's steps after its start */
    int steps = progress_of[0] + progress_of[1] + progress_of[2];
    cr_assert_geq(steps, 12 - 3 - 3, "%d progress events", steps);
    /* one budget for the request: 12 measurements in all, the starts included */
    cr_assert_eq(rows(&d, NULL), 12);
    cr_assert(healthy(&d));
    teardown(&d);
}

/* Trained weights that their MANIFEST holds back from serving still write HTAM's slots. */
Test(tune, htam_regenerates_with_trained_weights_held_back_from_serving)
{
    tlmd d;
    setup_dir(&d);
    char sha[65], man[400], path[400];
    tlm_weights_trained(d.weights, sha);
    cr_assert(sha[0]);
    snprintf(man, sizeof man, "trained = true\nsha256 = %s\nserve = default\n", sha);
    snprintf(path, sizeof path, "%s/MANIFEST", d.dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(man, f);
    fclose(f);
    start(&d, NULL);
    resp r = post(&d, "{\"target\":\"cpu\",\"mode\":\"tune\",\"strategy\":\"htam\","
                      "\"budget\":{\"trials\":5},\"workloads\":[" WL "]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    cr_assert(strstr(r.body.p, "\"schedule_source\":\"htam\""), "%s", r.body.p);
    resp_free(&r);
    /* the evidence in the stored memory says who wrote each step */
    sqlite3 *h;
    sqlite3_stmt *s = htam_memory_rows(&d, "payload", &h);
    int tlm = 0, mutation = 0;
    while (sqlite3_step(s) == SQLITE_ROW) {
        const char *p = (const char *)sqlite3_column_text(s, 0);
        for (const char *q = p; q && (q = strstr(q, "\"gen\":\"tlm\"")); q++)
            tlm++;
        for (const char *q = p; q && (q = strstr(q, "\"gen\":\"mutation\"")); q++)
            mutation++;
    }
    sqlite3_finalize(s);
    sqlite3_close(h);
    cr_assert_eq(tlm + mutation, 4, "four steps of evidence (%d tlm, %d mutation)", tlm, mutation);
    cr_assert_geq(tlm, 1, "the model wrote a step");
    cr_assert(healthy(&d));
    teardown(&d);
}

typedef struct {
    tlmd *d;
    long status;
} writer;

static void *long_tune(void *arg)
{
    writer *w = arg;
    resp r = post(w->d, "{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"trials\":5000},"
                        "\"workloads\":[" WL "]}");
    w->status = r.status;
    resp_free(&r);
    return NULL;
}

Test(tune, cancel_stops_the_search_and_keeps_its_records)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    writer w = {&d, -1};
    pthread_t th;
    pthread_create(&th, NULL, long_tune, &w);
    /* two rounds measured (generous: a loaded machine) */
    double t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 300 && rows(&d, NULL) < 32) usleep(100000);
    long long before = rows(&d, NULL);
    cr_assert_geq(before, 32, "the tune measured nothing in 300 s; see %s", d.log);
    char id[64], path[96];
    logged_job_id(&d, NULL, id);
    cr_assert(id[0]);
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    resp c = http(&d, "DELETE", path, NULL, 0, NULL);
    cr_assert_eq(c.status, 200, "%s", c.body.p);
    resp_free(&c);
    pthread_join(th, NULL);
    cr_assert_eq(w.status, 503);
    /* the search stops within its round: the flight ends */
    t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 120 && metric(&d, "tlmd_flights_in_flight") > 0) usleep(50000);
    cr_assert_eq(metric(&d, "tlmd_flights_in_flight"), 0, "the cancelled search goes on");
    long long after = rows(&d, NULL);
    cr_assert_geq(after, before, "records were lost");
    cr_assert_lt(after, 5000);
    /* a cancelled search leaves no kernel behind: generate compiles the default */
    resp r = post(&d, "{\"target\":\"cpu\",\"workloads\":[" WL "]}");
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *g = kernel_of(&r);
    cr_assert_str_eq(json_string_value(json_object_get(g, "schedule_source")), "default");
    json_decref(g);
    resp_free(&r);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(tune, refusals_name_their_field)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    struct {
        const char *body, *field;
        long status;
    } cases[] = {
        {"{\"target\":\"cuda:sm_90\",\"mode\":\"tune\",\"workloads\":[" WL "]}", "mode", 422},
        {"{\"target\":\"cpu\",\"mode\":\"tune\",\"strategy\":\"annealing\",\"workloads\":[" WL
         "]}",
         "strategy", 400},
        {"{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"trials\":0},\"workloads\":[" WL
         "]}",
         "budget.trials", 400},
        {"{\"target\":\"cpu\",\"mode\":\"tune\",\"budget\":{\"seconds\":-1},\"workloads\":[" WL
         "]}",
         "budget.seconds", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        resp r = post(&d, cases[i].body);
        cr_assert_eq(r.status, cases[i].status, "case %zu: %ld %s", i, r.status, r.body.p);
        json_t *j = body_json(&r);
        cr_assert_str_eq(
            json_string_value(json_object_get(json_object_get(j, "error"), "field")),
            cases[i].field, "case %zu: %s", i, r.body.p);
        json_decref(j);
        resp_free(&r);
    }
    cr_assert_eq(rows(&d, NULL), 0, "a refused request measures nothing");
    cr_assert(healthy(&d));
    teardown(&d);
}
