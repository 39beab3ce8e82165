/* test_tlm_train.c — the learning loop through the real `tlm` binary (TLM_BIN, default
 * build/san/tlm): `tlm datagen` (measured records per task, the excluded suite kept out,
 * resumable), `tlm records export` into `tlm train` (the model learns its labels: greedy
 * decoding writes the best measured schedule of each workload it was trained on; a run cut
 * with --until and resumed gives the same weight file bytes as one never stopped), `tlm
 * eval` on the result, `tlm model info`'s trained flag, and the refusals. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "tests/common/run_tool.h"

static void setup(void)
{
    tool_dir_make("/tmp/tlm-train-XXXXXX");
}

TestSuite(tlm_train, .init = setup, .fini = tool_dir_fini, .timeout = 900);

/* Three small workloads of different families; the last one is the "validation suite". */
static const char *SUITE =
    "{\"workloads\": ["
    "{\"name\": \"d\", \"workload\": {\"op\": \"dense\", \"shape\": {\"M\": 24, \"N\": 40, \"K\": "
    "16}}},"
    "{\"name\": \"s\", \"workload\": {\"op\": \"softmax\", \"shape\": {\"R\": 8, \"C\": 33}}},"
    "{\"name\": \"c\", \"workload\": {\"op\": \"conv2d\", \"shape\": {\"N\": 1, \"C\": 3, \"H\": "
    "9, \"W\": 9, \"F\": 8, \"KH\": 3, \"KW\": 3}}}]}";
static const char *HELD_OUT =
    "{\"workloads\": [{\"name\": \"c\", \"workload\": {\"op\": \"conv2d\", \"shape\": {\"N\": 1, "
    "\"C\": 3, \"H\": 9, \"W\": 9, \"F\": 8, \"KH\": 3, \"KW\": 3}}}]}";

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

/* datagen on SUITE minus HELD_OUT into db, exported to jsonl. */
static void make_records(const char *db, const char *jsonl)
{
    char suite[128], held[128];
    tool_path(suite, sizeof suite, "suite.json");
    tool_path(held, sizeof held, "held.json");
    write_file(suite, SUITE);
    write_file(held, HELD_OUT);
    run_result r = RUN("datagen", "--suite", suite, "--exclude", held, "--target", "cpu",
                       "--store", db, "--per-task", "6", "--seed", "2");
    json_t *o = run_json(&r);
    cr_assert_eq(jint(o, "tasks"), 2);
    cr_assert_eq(jint(o, "excluded"), 1, "the validation workload is never measured");
    cr_assert_eq(jint(o, "tuned"), 2);
    cr_assert_geq(jint(o, "measurements"), 12);
    cr_assert(strstr(r.err, "datagen: 2/2"), "progress per task: %s", r.err);
    json_decref(o);
    free_result(&r);
    r = RUN("records", "export", "--store", db, "-o", jsonl);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
}

Test(tlm_train, datagen_excludes_the_validation_suite_and_resumes)
{
    char db[128], jsonl[128], suite[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(jsonl, sizeof jsonl, "a.jsonl");
    make_records(db, jsonl);
    char *text = slurp(jsonl);
    cr_assert_geq(count_lines(text), 12);
    cr_assert(!strstr(text, "conv2d"), "no record of the held-out workload");
    free(text);
    /* again without the exclusion: the two measured tasks are skipped, only the new one runs */
    tool_path(suite, sizeof suite, "suite.json");
    run_result r = RUN("datagen", "--suite", suite, "--target", "cpu", "--store", db,
                       "--per-task", "6", "--quiet");
    json_t *o = run_json(&r);
    cr_assert_eq(jint(o, "tasks"), 3);
    cr_assert_eq(jint(o, "skipped"), 2);
    cr_assert_eq(jint(o, "tuned"), 1);
    cr_assert_str_empty(r.err, "--quiet: %s", r.err);
    json_decref(o);
    free_result(&r);
    /* the listing: the zoo under augmentations, deduplicated */
    r = RUN("datagen", "--target", "cpu", "--list");
    o = run_json(&r);
    cr_assert_gt(jint(o, "tasks"), 100);
    json_t *first = json_array_get(json_object_get(o, "list"), 0);
    cr_assert(json_string_value(json_object_get(first, "workload_hash")));
    json_decref(o);
    free_result(&r);
}

Test(tlm_train, learns_its_labels_and_resumes_bitwise)
{
    char db[128], jsonl[128], w1[128], w2[128], ck[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(jsonl, sizeof jsonl, "a.jsonl");
    tool_path(w1, sizeof w1, "one.bin");
    tool_path(w2, sizeof w2, "two.bin");
    tool_path(ck, sizeof ck, "two.ckpt");
    make_records(db, jsonl);
    /* uninterrupted */
    run_result r = RUN("train", "--records", jsonl, "--out", w1, "--layers", "1", "--heads", "2",
                       "--dim", "32", "--steps", "150", "--batch", "4", "--top", "1",
                       "--val-pct", "0", "--lr", "3e-3", "--warmup", "10", "--quiet");
    json_t *o = run_json(&r);
    cr_assert_eq(jint(o, "groups_train"), 2);
    cr_assert_eq(jint(o, "examples_train"), 2);
    cr_assert_eq(jint(o, "records_stale"), 0);
    cr_assert_float_eq(json_number_value(json_object_get(o, "train_exact")), 1.0, 1e-9,
                       "greedy decoding writes each workload's best measured schedule: %s", r.out);
    cr_assert_lt(json_number_value(json_object_get(o, "loss_ema")), 0.5, "%s", r.out);
    json_decref(o);
    free_result(&r);
    /* the same run cut at step 70 and resumed from its checkpoint */
    r = RUN("train", "--records", jsonl, "--out", w2, "--layers", "1", "--heads", "2", "--dim",
            "32", "--steps", "150", "--batch", "4", "--top", "1", "--val-pct", "0", "--lr",
            "3e-3", "--warmup", "10", "--checkpoint", ck, "--checkpoint-every", "50", "--until",
            "70", "--quiet");
    o = run_json(&r);
    cr_assert_eq(jint(o, "step"), 70);
    json_decref(o);
    free_result(&r);
    r = RUN("train", "--records", jsonl, "--out", w2, "--layers", "1", "--heads", "2", "--dim",
            "32", "--steps", "150", "--batch", "4", "--top", "1", "--val-pct", "0", "--lr",
            "3e-3", "--warmup", "10", "--checkpoint", ck, "--resume", "--quiet");
    o = run_json(&r);
    cr_assert_eq(jint(o, "step"), 150);
    json_decref(o);
    free_result(&r);
    size_t n1 = 0, n2 = 0;
    char *b1 = slurp_len(w1, &n1), *b2 = slurp_len(w2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert(!memcmp(b1, b2, n1), "a resumed run writes the same weights as one never stopped");
    free(b1);
    free(b2);
    /* untrained until a MANIFEST vouches for these bytes */
    r = RUN("model", "info", w1);
    o = run_json(&r);
    cr_assert(json_is_false(json_object_get(o, "trained")));
    json_decref(o);
    free_result(&r);
    /* eval on the held-out workload: valid and deterministic one pass */
    char held[128], ev[128];
    tool_path(held, sizeof held, "held.json");
    tool_path(ev, sizeof ev, "eval.jsonl");
    r = RUN("eval", "--suite", held, "--target", "cpu", "--weights", w1, "--schedules",
            "default,tlm,tlm@3,tlm@100,topk:2,search:4", "--jsonl", ev, "--quiet");
    o = run_json(&r);
    cr_assert_eq(jint(o, "workloads"), 1);
    /* the one pass under priors: a prior of 100 logits writes the default, which is then the
     * same kernel (measured once): exactly 1x */
    json_t *pri = json_object_get(o, "tlm_prior");
    cr_assert_eq(json_array_size(pri), 2, "%s", r.out);
    json_t *p100 = json_array_get(pri, 0);
    if (json_number_value(json_object_get(p100, "prior")) != 100.0) p100 = json_array_get(pri, 1);
    cr_assert_float_eq(json_number_value(json_object_get(p100, "prior")), 100.0, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(p100, "same_as_default")), 1.0, 1e-9);
    cr_assert_float_eq(json_number_value(json_object_get(p100, "vs_default")), 1.0, 1e-12);
    cr_assert_float_eq(json_number_value(json_object_get(o, "tlm_valid")), 1.0, 1e-9, "%s", r.out);
    cr_assert_float_eq(json_number_value(json_object_get(o, "tlm_deterministic")), 1.0, 1e-9);
    cr_assert(json_number_value(json_object_get(o, "tlm_vs_default")) > 0);
    json_decref(o);
    free_result(&r);
    char *line = slurp(ev);
    cr_assert_eq(count_lines(line), 1);
    cr_assert(strstr(line, "\"search_ms\"") && strstr(line, "\"topk_ms\""), "%s", line);
    free(line);
}

/* --teacher: perturbed copies of each training workload, labelled with their default
 * schedules, join the measured examples; seeded (the same run twice writes the same bytes),
 * held-out groups lend none, and the summary counts them. */
Test(tlm_train, teacher_copies_are_seeded_training_only_defaults)
{
    char db[128], jsonl[128], w1[128], w2[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(jsonl, sizeof jsonl, "a.jsonl");
    tool_path(w1, sizeof w1, "one.bin");
    tool_path(w2, sizeof w2, "two.bin");
    make_records(db, jsonl);
    const char *w[2] = {w1, w2};
    long long groups[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        run_result r = RUN("train", "--records", jsonl, "--out", w[i], "--layers", "1", "--heads",
                           "2", "--dim", "32", "--steps", "60", "--batch", "8", "--top", "1",
                           "--val-pct", "0", "--teacher", "10", "--teacher-weight", "0.5",
                           "--quiet");
        json_t *o = run_json(&r);
        cr_assert_eq(jint(o, "groups_train"), 2, "measured groups only: %s", r.out);
        cr_assert_eq(jint(o, "teacher_tries"), 20, "10 copies of each of 2 workloads: %s", r.out);
        groups[i] = jint(o, "teacher_groups");
        cr_assert(groups[i] >= 10 && groups[i] <= 20, "most copies build: %s", r.out);
        cr_assert_eq(jint(o, "examples_train"), 2 + groups[i], "%s", r.out);
        double te = json_number_value(json_object_get(o, "teacher_exact"));
        cr_assert(te >= 0 && te <= 1, "%s", r.out);
        json_decref(o);
        free_result(&r);
    }
    cr_assert_eq(groups[0], groups[1]);
    size_t n1 = 0, n2 = 0;
    char *b1 = slurp_len(w1, &n1), *b2 = slurp_len(w2, &n2);
    cr_assert(n1 == n2 && !memcmp(b1, b2, n1), "the copies are a function of the seed");
    free(b1);
    free(b2);
    /* every group held out: none lends copies, and nothing is left to train on */
    run_result r = RUN("train", "--records", jsonl, "--out", w1, "--val-pct", "99", "--teacher",
                       "4", "--steps", "5", "--quiet");
    if (r.status == 0) {
        json_t *o = run_json(&r);
        cr_assert_eq(jint(o, "teacher_tries"), 4 * (2 - jint(o, "groups_val")), "%s", r.out);
        json_decref(o);
    } else {
        cr_assert(strstr(r.err, "no trainable records"), "%s", r.err);
    }
    free_result(&r);
    /* copies under another target: counted as copies, never as that target's labels */
    r = RUN("train", "--records", jsonl, "--out", w1, "--layers", "1", "--heads", "2", "--dim",
            "32", "--steps", "5", "--val-pct", "0", "--teacher", "4", "--teacher-targets",
            "cpu:avx2", "--quiet");
    json_t *o = run_json(&r);
    cr_assert_eq(jint(o, "teacher_tries"), 8, "%s", r.out);
    cr_assert_geq(jint(o, "teacher_groups"), 4, "%s", r.out);
    cr_assert_null(json_object_get(json_object_get(o, "labels"), "cpu:avx2"), "%s", r.out);
    json_decref(o);
    free_result(&r);
    r = RUN("train", "--records", jsonl, "--out", w1, "--teacher", "4", "--teacher-targets",
            "cpu,cpu:bogus");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--teacher-targets") && strstr(r.err, "cpu:bogus"), "%s", r.err);
    free_result(&r);
    /* without --teacher the summary has no teacher counts, but the default's fit on held-out
     * groups is always reported */
    r = RUN("train", "--records", jsonl, "--out", w1, "--layers", "1", "--heads", "2", "--dim",
            "32", "--steps", "5", "--val-pct", "0", "--quiet");
    o = run_json(&r);
    cr_assert_null(json_object_get(o, "teacher_groups"));
    cr_assert_not_null(json_object_get(o, "val_default_exact"));
    json_decref(o);
    free_result(&r);
}

Test(tlm_train, refusals_name_the_flag)
{
    char bad[128], out[128];
    tool_path(bad, sizeof bad, "bad.jsonl");
    tool_path(out, sizeof out, "o.bin");
    run_result r = RUN("train", "--out", out);
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--records"), "%s", r.err);
    free_result(&r);
    write_file(bad, "{\"status\": \"ok\"}\n");
    r = RUN("train", "--records", bad, "--out", out);
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--records") && strstr(r.err, ":1:"), "%s", r.err);
    free_result(&r);
    write_file(bad, "not json\n");
    r = RUN("train", "--records", bad, "--out", out);
    cr_assert_eq(r.status, 2);
    free_result(&r);
    r = RUN("datagen", "--target", "cpu");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--store"), "%s", r.err);
    free_result(&r);
    r = RUN("eval", "--suite", bad, "--target", "cpu", "--schedules", "tlm");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--weights"), "%s", r.err);
    free_result(&r);
    r = RUN("eval", "--suite", bad, "--target", "cpu", "--schedules", "fast");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--schedules"), "%s", r.err);
    free_result(&r);
    r = RUN("eval", "--suite", bad, "--target", "cpu", "--schedules", "default,tlm@-1");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "tlm@X"), "%s", r.err);
    free_result(&r);
    r = RUN("eval", "--suite", bad, "--target", "cpu", "--schedules", "default", "--prior", "lots");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--prior"), "%s", r.err);
    free_result(&r);
}
