/* test_tlm_datagen.c — cuda training data without a GPU, through the real `tlm` binary
 * (TLM_BIN, default build/san/tlm): `tlm datagen --labels model` compiles every candidate with
 * NVRTC and labels it with the analytic GPU model; its records carry status "modelled" through
 * `tlm records export` (and never pass as measurements: `--status ok` exports none of them);
 * a record measured on a GPU comes in through `tlm records import` beside them, distinct; and
 * `tlm train` counts modelled and measured labels apart, the measurement superseding the
 * model in its group. Also the refusals: a cuda datagen without --labels model, --labels
 * model on a CPU target, an unknown --labels. (CPU datagen: tests/tools/test_tlm_train.c.) */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "compiler/toolchain/toolchain.h"

#include "tests/common/run_tool.h"

static void setup(void)
{
    tool_dir_make("/tmp/tlm-datagen-XXXXXX");
}

TestSuite(tlm_datagen, .init = setup, .fini = tool_dir_fini, .timeout = 300);

static const char *SUITE =
    "{\"workloads\": ["
    "{\"name\": \"d\", \"workload\": {\"op\": \"dense\", \"shape\": {\"M\": 64, \"N\": 64, \"K\": "
    "32}}},"
    "{\"name\": \"s\", \"workload\": {\"op\": \"softmax\", \"shape\": {\"R\": 8, \"C\": 64}}},"
    "{\"name\": \"c\", \"workload\": {\"op\": \"conv2d\", \"shape\": {\"N\": 1, \"C\": 4, \"H\": "
    "9, \"W\": 9, \"F\": 8, \"KH\": 3, \"KW\": 3}}}]}";

static json_t *run_json(run_result *r)
{
    cr_assert_eq(r->status, 0, "exit %d: %s", r->status, r->err);
    json_error_t je;
    json_t *o = json_loads(r->out, 0, &je);
    cr_assert_not_null(o, "not JSON: %s", r->out);
    return o;
}

static long long jint(json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

Test(tlm_datagen, cuda_needs_labels_model)
{
    char db[128], suite[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(suite, sizeof suite, "suite.json");
    write_file(suite, SUITE);
    run_result r = RUN("datagen", "--suite", suite, "--target", "cuda:sm_90", "--store", db);
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "cannot be measured") && strstr(r.err, "--labels model"),
              "the refusal names the flag: %s", r.err);
    free_result(&r);
    r = RUN("datagen", "--suite", suite, "--target", "cuda:sm_90", "--store", db, "--labels",
            "measured");
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "--labels model"), "%s", r.err);
    free_result(&r);
    r = RUN("datagen", "--suite", suite, "--target", "cpu:avx2", "--store", db, "--labels",
            "model");
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "for cuda targets"), "%s", r.err);
    free_result(&r);
    r = RUN("datagen", "--suite", suite, "--target", "cuda:sm_90", "--store", db, "--labels",
            "guess");
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "--labels") && strstr(r.err, "measured, model"), "%s", r.err);
    free_result(&r);
}

/* The lines of a JSONL file as JSON objects. */
static json_t *read_jsonl(const char *p)
{
    char *text = slurp(p);
    json_t *arr = json_array();
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        json_t *o = json_loads(line, 0, NULL);
        cr_assert_not_null(o, "not JSON: %s", line);
        json_array_append_new(arr, o);
    }
    free(text);
    return arr;
}

/* `tlm records export` of a store into path, read back. */
static json_t *export_records(const char *db, const char *path)
{
    run_result r = RUN("records", "export", "--store", db, "-o", path);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    return read_jsonl(path);
}

Test(tlm_datagen, modelled_records_stay_marked_and_train_counts_them_apart)
{
    tlm_error e;
    tlm_err_clear(&e);
    if (tc_nvrtc_available(&e)) cr_skip_test("NVRTC is not available: %s", e.msg);
    char db[128], suite[128], out[128], ok_out[128], gpu[128], weights[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(suite, sizeof suite, "suite.json");
    tool_path(out, sizeof out, "all.jsonl");
    tool_path(ok_out, sizeof ok_out, "ok.jsonl");
    tool_path(gpu, sizeof gpu, "gpu.jsonl");
    tool_path(weights, sizeof weights, "w.bin");
    write_file(suite, SUITE);
    run_result r = RUN("datagen", "--suite", suite, "--target", "cuda:sm_90", "--store", db,
                       "--labels", "model", "--per-task", "3", "--quiet");
    json_t *o = run_json(&r);
    cr_assert_str_eq(json_string_value(json_object_get(o, "labels")), "model");
    cr_assert_eq(jint(o, "tuned"), 3);
    cr_assert_eq(jint(o, "failed"), 0, "%s", r.out);
    cr_assert_eq(jint(o, "measurements"), 9);
    json_decref(o);
    free_result(&r);

    /* export: every record modelled, with the model's figures; none passes as "ok" */
    json_t *recs = export_records(db, out);
    cr_assert_eq(json_array_size(recs), 9);
    size_t i;
    json_t *rec;
    json_array_foreach(recs, i, rec)
    {
        cr_assert_str_eq(json_string_value(json_object_get(rec, "status")), "modelled");
        cr_assert_str_eq(json_string_value(json_object_get(rec, "target")), "cuda:sm_90");
        double t = json_number_value(json_object_get(rec, "median_s"));
        cr_assert(t > 0 && isfinite(t), "median_s %g", t);
        cr_assert_eq(jint(rec, "n_samples"), 0, "a prediction has no samples");
        const char *detail = json_string_value(json_object_get(rec, "detail"));
        cr_assert(detail && !strncmp(detail, "gpu_model/", 10), "detail %s", detail);
    }
    r = RUN("records", "export", "--store", db, "--status", "ok", "-o", ok_out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    char *ok_text = slurp(ok_out);
    cr_assert_eq(count_lines(ok_text), 0, "modelled records never export as measurements: %s",
                 ok_text);
    free(ok_text);

    /* a record measured on a lent GPU: the first record's schedule, status ok, another host */
    json_t *m = json_deep_copy(json_array_get(recs, 0));
    json_object_set_new(m, "status", json_string("ok"));
    json_object_set_new(m, "median_s", json_real(1e-6));
    json_object_set_new(m, "min_s", json_real(1e-6));
    json_object_set_new(m, "n_samples", json_integer(7));
    json_object_set_new(m, "host_id", json_string("lent-gpu-host"));
    json_object_set_new(m, "detail", json_null());
    const char *m_wh = json_string_value(json_object_get(m, "workload_hash"));
    int in_group = 0; /* modelled records of the same workload (one sketch per workload here) */
    json_array_foreach(recs, i, rec) in_group +=
        !strcmp(json_string_value(json_object_get(rec, "workload_hash")), m_wh);
    char *line = json_dumps(m, JSON_COMPACT);
    char text[8192];
    snprintf(text, sizeof text, "%s\n", line);
    write_file(gpu, text);
    free(line);
    json_decref(m);
    json_decref(recs);
    r = RUN("records", "import", "--store", db, gpu);
    o = run_json(&r);
    cr_assert_eq(jint(o, "added"), 1, "%s", r.out);
    json_decref(o);
    free_result(&r);
    recs = export_records(db, out);
    cr_assert_eq(json_array_size(recs), 10, "the measurement is kept beside the prediction");
    int ok = 0, modelled = 0;
    json_array_foreach(recs, i, rec)
    {
        const char *st = json_string_value(json_object_get(rec, "status"));
        ok += !strcmp(st, "ok");
        modelled += !strcmp(st, "modelled");
    }
    cr_assert_eq(ok, 1);
    cr_assert_eq(modelled, 9);
    json_decref(recs);

    /* train: labels counted apart; the measured group drops its modelled records */
    r = RUN("train", "--records", out, "--out", weights, "--layers", "1", "--heads", "1", "--dim",
            "16", "--steps", "2", "--batch", "2", "--val-pct", "0", "--quiet");
    o = run_json(&r);
    cr_assert_eq(jint(o, "labels_measured"), 1, "%s", r.out);
    cr_assert_eq(jint(o, "labels_modelled"), 9 - in_group, "%s", r.out);
    cr_assert_eq(jint(o, "records_modelled_superseded"), in_group, "%s", r.out);
    json_t *t = json_object_get(json_object_get(o, "labels"), "cuda:sm_90");
    cr_assert_not_null(t, "%s", r.out);
    cr_assert_eq(jint(t, "measured_groups"), 1, "%s", r.out);
    cr_assert_eq(jint(t, "modelled_groups"), 2, "%s", r.out);
    cr_assert_eq(jint(t, "measured_records"), 1);
    cr_assert_eq(jint(t, "modelled_records"), 9 - in_group);
    const char *labels_line = json_string_value(json_object_get(o, "labels_line"));
    cr_assert(labels_line && strstr(labels_line, "cuda:sm_90: measured") &&
                  strstr(labels_line, "modelled by the GPU model"),
              "%s", labels_line);
    json_decref(o);
    free_result(&r);
}

/* The (schedule -> count) and (schedule -> source) of a records file's lines for one
 * workload hash. */
static int count_sched(json_t *recs, const char *wh, const char *sched, const char *source)
{
    int n = 0;
    size_t i;
    json_t *r;
    json_array_foreach(recs, i, r)
    {
        if (strcmp(json_string_value(json_object_get(r, "workload_hash")), wh)) continue;
        if (sched && strcmp(json_string_value(json_object_get(r, "schedule")), sched)) continue;
        if (source && strcmp(json_string_value(json_object_get(r, "schedule_source")), source))
            continue;
        n++;
    }
    return n;
}

/* The fastest median among a workload's correct records of one schedule. */
static double min_median(json_t *recs, const char *wh, const char *sched)
{
    double best = INFINITY;
    size_t i;
    json_t *r;
    json_array_foreach(recs, i, r)
    {
        double s = json_number_value(json_object_get(r, "median_s"));
        if (!strcmp(json_string_value(json_object_get(r, "workload_hash")), wh) &&
            !strcmp(json_string_value(json_object_get(r, "schedule")), sched) &&
            !strcmp(json_string_value(json_object_get(r, "status")), "ok") && s < best)
            best = s;
    }
    return best;
}

/* Runs `tlm datagen --relabel file --target cpu --store db` and checks two of its counts. */
static void relabel_expect(const char *file, const char *db, const char *k1, int v1,
                           const char *k2, int v2)
{
    run_result r = RUN("datagen", "--relabel", file, "--target", "cpu", "--store", db, "--quiet");
    json_t *o = run_json(&r);
    cr_assert_eq(jint(o, k1), v1, "%s: %s", k1, r.out);
    cr_assert_eq(jint(o, k2), v2, "%s: %s", k2, r.out);
    json_decref(o);
    free_result(&r);
}

/* --relabel: records made elsewhere (here: a first datagen, exported) name, per workload of
 * the target, the schedules to measure again beside today's default: the --per-task fastest
 * by their old medians, each measured once and then three times more in rotating rounds, the
 * default as often; records of other targets are ignored; a second run measures nothing. */
Test(tlm_datagen, relabel_measures_the_records_best_again_beside_the_default)
{
    char a_db[128], b_db[128], suite[128], old[128], fresh[128];
    tool_path(a_db, sizeof a_db, "a.db");
    tool_path(b_db, sizeof b_db, "b.db");
    tool_path(suite, sizeof suite, "suite.json");
    tool_path(old, sizeof old, "old.jsonl");
    tool_path(fresh, sizeof fresh, "fresh.jsonl");
    write_file(suite,
               "[{\"op\": \"dense\", \"shape\": {\"M\": 24, \"N\": 40, \"K\": 16}},"
               " {\"op\": \"softmax\", \"shape\": {\"R\": 8, \"C\": 72}}]");
    run_result r = RUN("datagen", "--suite", suite, "--target", "cpu", "--store", a_db,
                       "--per-task", "5", "--quiet");
    json_decref(run_json(&r));
    free_result(&r);
    json_t *olds = export_records(a_db, old);
    /* a record of another target joins the file: relabelling cpu ignores it */
    json_t *other = json_deep_copy(json_array_get(olds, 0));
    json_object_set_new(other, "target", json_string("cpu:avx2"));
    json_object_set_new(other, "schedule", json_string("not a schedule"));
    char *line = json_dumps(other, JSON_COMPACT);
    FILE *f = fopen(old, "a");
    fprintf(f, "%s\n", line);
    fclose(f);
    free(line);
    json_decref(other);

    r = RUN("datagen", "--relabel", old, "--target", "cpu", "--store", b_db, "--quiet");
    json_t *o = run_json(&r);
    cr_assert_eq(jint(o, "tasks"), 2, "%s", r.out);
    cr_assert_eq(jint(o, "tuned"), 2, "%s", r.out);
    cr_assert_eq(jint(o, "failed"), 0, "%s", r.out);
    json_decref(o);
    free_result(&r);
    json_t *news = export_records(b_db, fresh);
    size_t i;
    json_t *rec;
    json_array_foreach(olds, i, rec)
    {
        if (strcmp(json_string_value(json_object_get(rec, "status")), "ok")) continue;
        const char *wh = json_string_value(json_object_get(rec, "workload_hash"));
        const char *sc = json_string_value(json_object_get(rec, "schedule"));
        double s = json_number_value(json_object_get(rec, "median_s"));
        if (s > min_median(olds, wh, sc)) continue; /* judge each schedule by its best */
        /* how many distinct correct schedules of this workload were faster */
        int faster = 0;
        size_t k;
        json_t *q;
        json_array_foreach(olds, k, q)
        {
            const char *qs = json_string_value(json_object_get(q, "schedule"));
            if (strcmp(json_string_value(json_object_get(q, "workload_hash")), wh) ||
                strcmp(json_string_value(json_object_get(q, "status")), "ok") ||
                json_number_value(json_object_get(q, "median_s")) !=
                    min_median(olds, wh, qs))
                continue; /* one line per schedule: the one with its best median */
            faster += strcmp(qs, sc) && min_median(olds, wh, qs) < s;
        }
        int again = count_sched(news, wh, sc, NULL);
        if (faster >= 2) continue; /* not among the two best: may still be the default */
        cr_assert_eq(again, 4, "%s of %s: one of the two best, measured %d times", sc, wh,
                     again);
    }
    /* today's default of each workload (as `tlm space` prints it): measured four times too */
    const char *wls[] = {"{\"op\": \"dense\", \"shape\": {\"M\": 24, \"N\": 40, \"K\": 16}}",
                         "{\"op\": \"softmax\", \"shape\": {\"R\": 8, \"C\": 72}}"};
    char *whs[2], *defs[2];
    for (int w = 0; w < 2; w++) {
        r = RUN("space", "--workload", wls[w], "--target", "cpu");
        json_t *sp = run_json(&r);
        whs[w] = strdup(json_string_value(json_object_get(sp, "workload_hash")));
        defs[w] = strdup(json_string_value(json_object_get(sp, "default")));
        cr_assert_eq(count_sched(news, whs[w], defs[w], NULL), 4, "%s: the default %s", whs[w],
                     defs[w]);
        json_decref(sp);
        free_result(&r);
    }
    json_array_foreach(news, i, rec)
    {
        cr_assert_str_eq(json_string_value(json_object_get(rec, "target")), "cpu");
        cr_assert_str_eq(json_string_value(json_object_get(rec, "status")), "ok");
    }
    size_t n_new = json_array_size(news);
    cr_assert_geq(n_new, 2 * 8, "two workloads, at least two schedules each, four times");
    json_decref(news);

    /* resumable: every workload has its measurements, so nothing more is measured */
    relabel_expect(old, b_db, "skipped", 2, "measurements", 0);

    /* a store holding the given schedules' records, several each, but none of today's
     * default (what a change to the rule of thumb leaves) relabels again, the default too */
    char nodef[128], c_db[128];
    tool_path(nodef, sizeof nodef, "nodef.jsonl");
    tool_path(c_db, sizeof c_db, "c.db");
    f = fopen(nodef, "w");
    cr_assert(f);
    json_array_foreach(olds, i, rec)
    {
        const char *sc = json_string_value(json_object_get(rec, "schedule"));
        if (!strcmp(sc, defs[0]) || !strcmp(sc, defs[1])) continue;
        char *l = json_dumps(rec, JSON_COMPACT);
        fprintf(f, "%s\n", l);
        free(l);
    }
    fclose(f);
    r = RUN("records", "import", "--store", c_db, nodef);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    relabel_expect(nodef, c_db, "tuned", 2, "skipped", 0);
    char again[128];
    tool_path(again, sizeof again, "again.jsonl");
    json_t *agains = export_records(c_db, again);
    for (int w = 0; w < 2; w++) {
        cr_expect_eq(count_sched(agains, whs[w], defs[w], NULL), 4, "%s: the default again",
                     whs[w]);
        free(whs[w]);
        free(defs[w]);
    }
    json_decref(agains);
    json_decref(olds);

    /* refusals */
    r = RUN("datagen", "--relabel", old, "--target", "cpu", "--store", b_db, "--per-task", "9");
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "--per-task"), "%s", r.err);
    free_result(&r);
    r = RUN("datagen", "--relabel", old, "--suite", suite, "--target", "cpu", "--store", b_db);
    cr_assert_eq(r.status, 2, "exit %d: %s", r.status, r.err);
    cr_assert(strstr(r.err, "--relabel") && strstr(r.err, "--suite"), "%s", r.err);
    free_result(&r);
    write_file(suite, "{\"broken\n");
    r = RUN("datagen", "--relabel", suite, "--target", "cpu", "--store", b_db);
    cr_assert_neq(r.status, 0);
    cr_assert(strstr(r.err, "--relabel") && strstr(r.err, "line 1"), "%s", r.err);
    free_result(&r);
}
