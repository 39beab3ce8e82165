/* test_tlm_tune.c — drives the real `tlm` binary (TLM_BIN, default build/san/tlm): `tlm tune`
 * (its JSON, the records it stores as it goes, the curve), `tlm records export|import`
 * (JSONL, duplicates merged, bad lines named), a tune killed with SIGKILL half-way (the
 * records it had committed stay, the store stays readable), and the refusals. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"

#include "tests/common/run_tool.h"

static void setup(void)
{
    tool_dir_make("/tmp/tlm-tune-XXXXXX");
}

TestSuite(tlm_tune, .init = setup, .fini = tool_dir_fini, .timeout = 600);

static const char *WL = "{\"op\": \"dense\", \"shape\": {\"M\": 24, \"N\": 40, \"K\": 16}, "
                        "\"epilogue\": [\"relu\"]}";

static long long count_rows(const char *db, const char *where)
{
    sqlite3 *h = NULL;
    cr_assert_eq(sqlite3_open_v2(db, &h, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
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

Test(tlm_tune, tunes_records_and_writes_the_curve)
{
    char db[128], curve[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(curve, sizeof curve, "curve.json");
    run_result r = RUN("tune", "--workload", WL, "--target", "cpu", "--trials", "8", "--batch",
                       "4", "--seed", "3", "--store", db, "--curve", curve);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    json_error_t je;
    json_t *o = json_loads(r.out, 0, &je);
    cr_assert_not_null(o, "not JSON: %s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(o, "trials")), 8);
    cr_assert_str_eq(json_string_value(json_object_get(o, "schedule_source")), "tuned");
    cr_assert_str_eq(json_string_value(json_object_get(o, "strategy")), "evolutionary");
    double best = json_number_value(json_object_get(o, "best_ms"));
    double first = json_number_value(json_object_get(o, "first_ms"));
    double def = json_number_value(json_object_get(o, "default_ms"));
    cr_assert(best > 0 && best <= first && best <= def, "best %g first %g default %g", best, first,
              def);
    cr_assert_float_eq(first, def, 1e-12, "the default is the starting point");
    /* one per trial, and the second look at the top 3 and the starting point (unless it is
     * among them), three rounds each */
    json_int_t looked = json_integer_value(json_object_get(o, "confirmed"));
    cr_assert(looked == 3 || looked == 4, "%lld", (long long)looked);
    cr_assert_eq(json_integer_value(json_object_get(o, "records")), 8 + 3 * looked);
    double conf = json_number_value(json_object_get(o, "confirmed_ms"));
    double conf0 = json_number_value(json_object_get(o, "first_confirmed_ms"));
    cr_assert(conf > 0 && conf <= conf0, "the chosen %g, the start %g in the second look", conf,
              conf0);
    cr_assert_float_eq(json_number_value(json_object_get(o, "speedup_confirmed")), conf0 / conf,
                       1e-9);
    cr_assert(strstr(r.err, "round 2 trials 8/8"), "progress on stderr: %s", r.err);
    cr_assert_eq(count_rows(db, NULL), 8 + 3 * looked);
    cr_assert_geq(count_rows(db, "WHERE schedule_source = 'default'"), 1);
    json_t *c = json_load_file(curve, 0, &je);
    cr_assert(json_is_array(c) && json_array_size(c) == 8);
    cr_assert_float_eq(json_number_value(json_array_get(c, 7)), best, 1e-9);
    json_decref(c);
    json_decref(o);
    free_result(&r);
}

Test(tlm_tune, records_export_and_import_merge_duplicates)
{
    char db[128], db2[128], out[128], out2[128], bad[128];
    tool_path(db, sizeof db, "a.db");
    tool_path(db2, sizeof db2, "b.db");
    tool_path(out, sizeof out, "a.jsonl");
    tool_path(out2, sizeof out2, "b.jsonl");
    tool_path(bad, sizeof bad, "bad.jsonl");
    run_result r = RUN("tune", "--workload", WL, "--target", "cpu", "--trials", "5", "--batch",
                       "5", "--confirm", "0", "--store", db, "--quiet");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_str_empty(r.err, "--quiet: %s", r.err);
    free_result(&r);
    r = RUN("records", "export", "--store", db, "-o", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    char *text = slurp(out);
    cr_assert_eq(count_lines(text), 5, "one per trial (no second look)");
    json_error_t je;
    json_t *first = json_loadb(text, strcspn(text, "\n"), 0, &je);
    cr_assert_not_null(first, "%s", je.text);
    cr_assert_str_eq(json_string_value(json_object_get(first, "format")), "tlm-records/1");
    cr_assert(json_is_object(json_object_get(first, "workload")));
    cr_assert_str_eq(json_string_value(json_object_get(first, "target")), "cpu");
    cr_assert(json_string_value(json_object_get(first, "sentence")));
    cr_assert(json_string_value(json_object_get(first, "host_id")));
    json_decref(first);

    r = RUN("records", "import", "--store", db2, out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *sum = json_loads(r.out, 0, &je);
    cr_assert_eq(json_integer_value(json_object_get(sum, "added")), 5, "%s", r.out);
    json_decref(sum);
    free_result(&r);
    /* the same file again, and the other store's own records: nothing new */
    r = RUN("records", "import", "--store", db2, out);
    sum = json_loads(r.out, 0, &je);
    cr_assert_eq(json_integer_value(json_object_get(sum, "added")), 0, "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(sum, "duplicates")), 5, "%s", r.out);
    json_decref(sum);
    free_result(&r);
    r = RUN("records", "export", "--store", db2, "-o", out2);
    cr_assert_eq(r.status, 0);
    free_result(&r);
    char *text2 = slurp(out2);
    cr_assert_str_eq(text, text2, "a round trip keeps every field");
    free(text2);

    /* a bad line is named and skipped; the good ones still count */
    size_t n = strcspn(text, "\n");
    char *mixed = malloc(strlen(text) + 64);
    snprintf(mixed, strlen(text) + 64, "{\"format\": \"tlm-records/1\"}\nnot json\n%.*s\n", (int)n,
             text);
    write_file(bad, mixed);
    r = RUN("records", "import", "--store", db2, bad);
    cr_assert_eq(r.status, 1, "%s", r.err);
    cr_assert(strstr(r.err, ":1: workload_hash"), "%s", r.err);
    cr_assert(strstr(r.err, ":2: (not JSON)"), "%s", r.err);
    sum = json_loads(r.out, 0, &je);
    cr_assert_eq(json_integer_value(json_object_get(sum, "rejected")), 2, "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(sum, "duplicates")), 1, "%s", r.out);
    json_decref(sum);
    free_result(&r);
    cr_assert_eq(count_rows(db2, NULL), 5);
    free(mixed);
    free(text);
}

Test(tlm_tune, a_killed_tune_keeps_the_records_it_committed)
{
    char db[128];
    tool_path(db, sizeof db, "k.db");
    const char *argv[] = {tlm_bin(), "tune",   "--workload", WL,      "--target",
                          "cpu",     "--trials", "400",      "--batch", "4",
                          "--store", db,       "--quiet",    NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    cr_assert_eq(posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    /* wait until at least two rounds are committed (generous: a loaded machine) */
    long long n = 0;
    for (int i = 0; i < 3000 && n < 8; i++) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (access(db, F_OK) == 0) n = count_rows(db, NULL);
        int st;
        cr_assert_eq(waitpid(pid, &st, WNOHANG), 0, "the tune ended early");
    }
    cr_assert_geq(n, 8, "no records after 300 s");
    kill(pid, SIGKILL);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    long long after = count_rows(db, NULL);
    cr_assert_geq(after, n, "records were lost: %lld then %lld", n, after);
    cr_assert_lt(after, 400, "the tune did not finish");
    /* the store is intact and every record is readable */
    sqlite3 *h = NULL;
    cr_assert_eq(sqlite3_open(db, &h), SQLITE_OK);
    sqlite3_stmt *s = NULL;
    cr_assert_eq(sqlite3_prepare_v2(h, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(h);
    run_result r = RUN("records", "export", "--store", db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(count_lines(r.out), after);
    free_result(&r);
}

Test(tlm_tune, refusals_name_the_flag)
{
    run_result r = RUN("tune", "--workload", WL, "--target", "cpu", "--strategy", "annealing");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--strategy"), "%s", r.err);
    free_result(&r);
    r = RUN("tune", "--workload", WL, "--target", "cuda:sm_80", "--trials", "4");
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "mode") && strstr(r.err, "cannot run"), "%s", r.err);
    free_result(&r);
    r = RUN("tune", "--target", "cpu");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--workload or --model"), "%s", r.err);
    free_result(&r);
    r = RUN("records", "import", "--store", "/nonexistent-dir/x.db", "/dev/null");
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "--store"), "%s", r.err);
    free_result(&r);
    r = RUN("records", "shuffle", "--store", "x.db");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "export, import"), "%s", r.err);
    free_result(&r);
}

Test(tlm_tune, htam_refines_and_its_memory_moves_between_stores)
{
    char db[128], db2[128], mem[128];
    tool_path(db, sizeof db, "h.db");
    tool_path(db2, sizeof db2, "h2.db");
    tool_path(mem, sizeof mem, "mem.json");
    run_result r = RUN("tune", "--workload", WL, "--target", "cpu", "--strategy", "htam",
                       "--trials", "5", "--store", db, "--quiet");
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_error_t je;
    json_t *o = json_loads(r.out, 0, &je);
    cr_assert_not_null(o, "%s", r.out);
    cr_assert_str_eq(json_string_value(json_object_get(o, "schedule_source")), "htam");
    cr_assert_str_eq(json_string_value(json_object_get(o, "memory")), "full");
    json_t *traj = json_object_get(o, "trajectory");
    cr_assert_eq(json_array_size(traj), 5, "the start and four steps");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(traj, 0), "global")),
                     "start");
    cr_assert(json_number_value(json_object_get(o, "best_ms")) <=
              json_number_value(json_object_get(o, "first_ms")));
    json_decref(o);
    free_result(&r);
    r = RUN("htam", "show", "--store", db);
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert(strstr(r.out, "directions (global nodes):") && strstr(r.out, "packing"), "%s", r.out);
    free_result(&r);
    r = RUN("htam", "export", "--store", db, "-o", mem);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    r = RUN("htam", "import", "--store", db2, mem);
    cr_assert_eq(r.status, 0, "%s", r.err);
    o = json_loads(r.out, 0, &je);
    double n = 0;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(o, "globals"), i, x) n += json_number_value(json_object_get(x, "n"));
    cr_assert_float_eq(n, 4, 1e-9, "four steps of experience moved");
    json_decref(o);
    free_result(&r);
    r = RUN("tune", "--workload", WL, "--target", "cpu", "--strategy", "htam", "--memory", "deep");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--memory"), "%s", r.err);
    free_result(&r);
    r = RUN("htam", "import", "--store", db2, "/dev/null");
    cr_assert_eq(r.status, 2, "%s", r.err);
    free_result(&r);
}

/* A small random model with the tensor language's vocabulary, saved in the test's directory. */
static void tiny_weights(char *out, size_t cap)
{
    tool_path(out, cap, "tiny.bin");
    tlm_config cfg = {2, 4, 64, 512, lang_vocab_size()};
    uint8_t vh[32];
    lang_vocab_hash(vh);
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_init_random(&cfg, vh, 5, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(tlm_model_save(m, out, &e), 0, "%s", e.msg);
    tlm_model_free(m);
}

/* Runs an htam tune; returns its JSON and counts the trajectory's generators. */
static json_t *htam_json(const char *weights, const char *regen, int *n_tlm, int *n_mut)
{
    const char *argv[20];
    int n = 0;
    /* run_tlm_in takes a NULL-terminated list */
    const char *base[] = {"tune", "--workload", WL,  "--target", "cpu", "--strategy",
                          "htam", "--trials",   "4", "--seed",   "2",   "--quiet"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i++)
        argv[n++] = base[i];
    if (weights) argv[n++] = "--weights", argv[n++] = weights;
    if (regen) argv[n++] = "--regen", argv[n++] = regen;
    argv[n] = NULL;
    run_result r = run_tlm_in(NULL, argv);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_error_t je;
    json_t *o = json_loads(r.out, 0, &je);
    cr_assert_not_null(o, "%s", r.out);
    free_result(&r);
    json_t *traj = json_object_get(o, "trajectory");
    cr_assert_eq(json_array_size(traj), 4, "the start and three steps");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(traj, 0), "gen")), "start");
    *n_tlm = *n_mut = 0;
    for (size_t k = 1; k < json_array_size(traj); k++) {
        json_t *st = json_array_get(traj, k);
        const char *g = json_string_value(json_object_get(st, "gen"));
        cr_assert(g && (!strcmp(g, "tlm") || !strcmp(g, "mutation")), "gen %s", g ? g : "none");
        *n_tlm += !strcmp(g, "tlm");
        *n_mut += !strcmp(g, "mutation");
        cr_assert(json_is_string(json_object_get(st, "slot")));
        cr_assert_neq(json_integer_value(json_object_get(st, "from")),
                      json_integer_value(json_object_get(st, "to")));
    }
    return o;
}

Test(tlm_tune, start_tlm_starts_the_search_from_the_models_one_pass)
{
    char w[128];
    tiny_weights(w, sizeof w);
    run_result g = RUN("generate", "--workload", WL, "--target", "cpu", "--weights", w);
    cr_assert_eq(g.status, 0, "%s", g.err);
    json_t *gj = json_loads(g.out, 0, NULL);
    cr_assert_not_null(gj, "%s", g.out);
    json_t *c0 = json_array_get(json_object_get(gj, "candidates"), 0);
    const char *one_pass = json_string_value(json_object_get(c0, "schedule"));
    cr_assert_not_null(one_pass, "%s", g.out);
    for (int from_tlm = 0; from_tlm < 2; from_tlm++) {
        run_result r = from_tlm ? RUN("tune", "--workload", WL, "--target", "cpu", "--trials", "3",
                                      "--confirm", "0", "--quiet", "--weights", w, "--start", "tlm")
                                : RUN("tune", "--workload", WL, "--target", "cpu", "--trials", "3",
                                      "--confirm", "0", "--quiet");
        cr_assert_eq(r.status, 0, "%s", r.err);
        json_t *o = json_loads(r.out, 0, NULL);
        cr_assert_not_null(o, "%s", r.out);
        cr_expect_str_eq(json_string_value(json_object_get(o, "start")),
                         from_tlm ? "tlm" : "default");
        const char *st = json_string_value(json_object_get(o, "start_schedule"));
        cr_assert_not_null(st, "%s", r.out);
        if (from_tlm) cr_expect_str_eq(st, one_pass, "the first candidate is the model's pass");
        cr_expect(json_real_value(json_object_get(o, "first_ms")) > 0, "%s", r.out);
        json_decref(o);
        free_result(&r);
    }
    json_decref(gj);
    free_result(&g);
    run_result r = RUN("tune", "--workload", WL, "--target", "cpu", "--start", "tlm");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--start tlm needs --weights"), "%s", r.err);
    free_result(&r);
    r = RUN("tune", "--workload", WL, "--target", "cpu", "--start", "best");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--start must be default or tlm"), "%s", r.err);
    free_result(&r);
}

Test(tlm_tune, htam_regenerates_with_the_model_and_says_so)
{
    char w[128];
    tiny_weights(w, sizeof w);
    int nt, nm;
    json_t *o = htam_json(w, NULL, &nt, &nm);
    cr_assert_str_eq(json_string_value(json_object_get(o, "regen")), "tlm", "weights: tlm");
    cr_assert_geq(nt, 1, "the model wrote a step");
    cr_assert_eq(json_integer_value(json_object_get(o, "regen_fallbacks")), nm);
    json_decref(o);
    o = htam_json(w, "mutation", &nt, &nm);
    cr_assert_str_eq(json_string_value(json_object_get(o, "regen")), "mutation");
    cr_assert_eq(nt, 0);
    cr_assert_eq(nm, 3);
    json_decref(o);
    o = htam_json(NULL, NULL, &nt, &nm);
    cr_assert_str_eq(json_string_value(json_object_get(o, "regen")), "mutation",
                     "no weights: the operators");
    cr_assert_eq(nt, 0);
    json_decref(o);
    run_result r =
        RUN("tune", "--workload", WL, "--target", "cpu", "--strategy", "htam", "--regen", "tlm");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--regen tlm needs --weights"), "%s", r.err);
    free_result(&r);
    r = RUN("tune", "--workload", WL, "--target", "cpu", "--strategy", "htam", "--regen", "llm");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--regen"), "%s", r.err);
    free_result(&r);
}
