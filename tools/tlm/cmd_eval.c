/* cmd_eval.c — `tlm eval`: how good are the model's schedules, measured beside the others.
 *
 *   tlm eval --suite FILE --target T --weights F [--schedules default,tlm,topk:8,search:N]
 *            [--only NAMES] [--jsonl FILE] [--seed S] [--prior X] [--quiet]
 *
 * For every workload of the suite (bench/suites format; it must be a validation suite the
 * model was never trained on: `tlm datagen --exclude` keeps it out of the data):
 *  - default: the rule-of-thumb schedule (what an untrained server serves);
 *  - tlm: the model's one pass (greedy, zero measurements), decoded twice to check that the
 *    output is identical run to run;
 *  - tlm@X: the one pass under a prior of X logits on the default schedule's tokens
 *    (tlm_model.default_prior), to compare priors in one job;
 *  - topk:K: the model's beam of K, each measured, the fastest kept;
 *  - search:N: the measured search (compiler/tune) with N trials.
 * default, tlm and topk candidates are built and measured in ONE job, one after another with
 * the same inputs and protocol, identical schedules measured once; the search runs its own
 * job. Every kernel is checked against the reference: a candidate that fails to build or is
 * wrong counts as invalid (and is reported), never as fast.
 *
 * One JSON line per workload goes to --jsonl (appended; workloads already there are skipped,
 * so an interrupted evaluation resumes), and the summary over every line of the file is
 * printed: geomeans of default/tlm (> 1: the model's one pass is faster), search/tlm,
 * search/topk, and the share of valid one-pass schedules. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver/pipeline.h"
#include "compiler/lang/lang.h"
#include "compiler/target/target.h"
#include "compiler/tlm/select.h"
#include "compiler/tlm/tlm.h"
#include "compiler/tune/tune.h"
#include "compiler/util/util.h"
#include "proto/workload.h"
#include "tools/tlm/cli.h"

static const char eval_usage[] =
    "usage: tlm eval --suite FILE --target T --weights F [options]\n"
    "  measures the model's schedules beside the default and the measured search on a\n"
    "  validation suite; prints geomean ratios (JSON)\n"
    "options:\n"
    "  --schedules LIST  of default, tlm, tlm@X, topk:K, search:N (default\n"
    "                    default,tlm,topk:8,search:64); tlm@X: the one pass under a prior of X\n"
    "                    logits on the default schedule's tokens (up to 4, measured in the\n"
    "                    same job as the rest)\n"
    "  --only NAMES      comma-separated workload names\n"
    "  --jsonl FILE      one line per workload, appended (resumes: names there are skipped)\n"
    "  --seed S          inputs and the search's seed (default 1)\n"
    "  --prior X         the bonus in logits on the default schedule's tokens when the model\n"
    "                    writes (0 = none; default: the weights' MANIFEST \"prior\", else 0)\n"
    "  --quiet           no progress on stderr\n";

typedef struct {
    const char *suite, *tg, *weights, *schedules, *only, *jsonl;
    uint64_t seed;
    bool quiet;
    double prior; /* < 0: the MANIFEST's */
    int topk, search;
    int n_priors; /* tlm@X: the one pass again under each of these priors */
    double priors[4];
    bool want_default, want_tlm;
} ev_args;

static bool name_in(const char *list, const char *name)
{
    if (!list) return true;
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && !strncmp(p, name, n)) return true;
        if (!e) break;
        p = e + 1;
    }
    return false;
}

static int parse_schedules(ev_args *a, tlm_error *err)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", a->schedules);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v = 0;
        if (!strcmp(t, "default"))
            a->want_default = true;
        else if (!strcmp(t, "tlm"))
            a->want_tlm = true;
        else if (!strncmp(t, "tlm@", 4)) {
            double x;
            if (a->n_priors == 4)
                return tlm_err_set(err, TLM_EINVAL, "--schedules", "at most 4 tlm@X entries");
            if (cli_parse_prior("--schedules tlm@X", t + 4, &x, err)) return err->code;
            a->priors[a->n_priors++] = x;
        } else if (!strncmp(t, "topk:", 5)) {
            if (cli_parse_u64("--schedules topk", t + 5, PL_MAX_CANDIDATES - 2, &v, err) || v < 2)
                return tlm_err_set(err, TLM_EINVAL, "--schedules", "topk:K needs 2 <= K <= %d",
                                   PL_MAX_CANDIDATES - 2);
            a->topk = (int)v;
        } else if (!strncmp(t, "search:", 7)) {
            if (cli_parse_u64("--schedules search", t + 7, 100000, &v, err) || v < 1)
                return tlm_err_set(err, TLM_EINVAL, "--schedules", "search:N needs N >= 1");
            a->search = (int)v;
        } else
            return tlm_err_set(err, TLM_EINVAL, "--schedules",
                               "'%s': expected default, tlm, tlm@X, topk:K or search:N", t);
    }
    return 0;
}

static int parse(int argc, char **argv, ev_args *a, tlm_error *err)
{
    memset(a, 0, sizeof *a);
    a->schedules = "default,tlm,topk:8,search:64";
    a->seed = 1;
    a->prior = -1.0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            fputs(eval_usage, stdout);
            return -1;
        }
        if (!strcmp(k, "--quiet")) {
            a->quiet = true;
            continue;
        }
        if (i + 1 >= argc) return cli_usage_error("eval: %s needs a value", k);
        const char *v = argv[++i];
        if (!strcmp(k, "--suite"))
            a->suite = v;
        else if (!strcmp(k, "--target"))
            a->tg = v;
        else if (!strcmp(k, "--weights"))
            a->weights = v;
        else if (!strcmp(k, "--schedules"))
            a->schedules = v;
        else if (!strcmp(k, "--only"))
            a->only = v;
        else if (!strcmp(k, "--jsonl"))
            a->jsonl = v;
        else if (!strcmp(k, "--seed")) {
            if (cli_parse_u64("--seed", v, UINT64_MAX, &a->seed, err)) return cli_report(err);
        } else if (!strcmp(k, "--prior")) {
            if (cli_parse_prior("--prior", v, &a->prior, err)) return cli_report(err);
        } else {
            fputs(eval_usage, stderr);
            return cli_usage_error("eval: unknown option '%s'", k);
        }
    }
    if (!a->suite || !a->tg) return cli_usage_error("eval: --suite and --target are required");
    if (parse_schedules(a, err)) return cli_report(err);
    if ((a->want_tlm || a->topk || a->n_priors) && !a->weights)
        return cli_usage_error("eval: tlm and topk schedules need --weights");
    return 0;
}

static json_t *ms_or_null(double s)
{
    return isfinite(s) && s > 0 ? json_real(s * 1e3) : json_null();
}

/* Adds s unless an identical candidate is there; returns its index or a negative code. */
static int add_unique(pl_job *j, const space_sched *s, pl_source src, double score, tlm_error *err)
{
    uint64_t h = tune_sched_hash(s);
    for (int i = 0; i < j->n_cands; i++)
        if (tune_sched_hash(&j->cands[i].sched) == h) return i;
    int rc = pl_add_candidate(j, s, src, score, err);
    return rc ? rc : j->n_cands - 1;
}

/* Times of the candidates from their records (INFINITY when not correct). */
static double cand_time(const pl_job *j, int c, const char **status)
{
    for (int r = j->n_recs - 1; r >= 0; r--)
        if (j->recs[r].cand == c) {
            if (status) *status = j->recs[r].status;
            return !strcmp(j->recs[r].status, "ok") ? j->recs[r].median_s : INFINITY;
        }
    if (status) *status = "missing";
    return INFINITY;
}

static json_t *eval_one(const ev_args *a, const char *name, const ir_workload *w, const target *t,
                        tlm_model *m, tlm_error *err)
{
    pl_opts po;
    pl_opts_init(&po);
    po.mode = PL_MODE_GIVEN;
    po.measure = PL_MEASURE_ON;
    po.mo.seed = a->seed * 0x9e3779b97f4a7c15ull | 1;
    pl_job j;
    if (pl_prepare(&j, w, t, &po, err)) {
        pl_job_free(&j);
        return NULL;
    }
    json_t *r = json_pack("{s:s, s:s, s:s, s:s, s:f}", "name", name, "op", ir_op_get(w->op)->name,
                          "target", t->name, "workload_hash", j.whash, "gflop",
                          (double)ir_subgraph_flops(j.g) * 1e-9);
    int ic_def = -1, ic_tlm = -1, ic_top[PL_MAX_CANDIDATES], n_top = 0;
    int rc = 0;
    double gen_s = NAN;
    if (a->want_default) {
        space_sched s;
        space_default(j.sp, &s);
        rc = ic_def = add_unique(&j, &s, PL_SRC_DEFAULT, NAN, err);
    }
    if (rc >= 0 && a->want_tlm) {
        tlm_candidate *c = malloc(2 * sizeof *c);
        int n1 = 0, n2 = 0;
        double g0 = tlm_now_s();
        rc = c ? tlm_select_generate(m, j.sp, 1, &c[0], &n1, err) : TLM_ENOMEM;
        gen_s = tlm_now_s() - g0;
        if (!rc) rc = tlm_select_generate(m, j.sp, 1, &c[1], &n2, err);
        if (!rc && n1 == 1) {
            bool same = n2 == 1 && tune_sched_hash(&c[0].sched) == tune_sched_hash(&c[1].sched);
            json_object_set_new(r, "tlm_deterministic", json_boolean(same));
            char txt[DRV_SCHED_MAX];
            if (space_print(j.sp, &c[0].sched, txt, sizeof txt) >= 0)
                json_object_set_new(r, "tlm_schedule", json_string(txt));
            rc = ic_tlm = add_unique(&j, &c[0].sched, PL_SRC_TLM, c[0].score, err);
        } else if (!rc) {
            json_object_set_new(r, "tlm_error", json_string("the model wrote no schedule"));
        }
        free(c);
    }
    int ic_pri[4];
    for (int p = 0; p < a->n_priors && rc >= 0; p++) {
        tlm_candidate *c = malloc(sizeof *c);
        int n1 = 0;
        float keep = m->default_prior;
        m->default_prior = (float)a->priors[p];
        rc = c ? tlm_select_generate(m, j.sp, 1, c, &n1, err) : TLM_ENOMEM;
        m->default_prior = keep;
        ic_pri[p] = -1;
        if (!rc && n1 == 1) {
            char key[64], txt[DRV_SCHED_MAX];
            snprintf(key, sizeof key, "tlm@%g_schedule", a->priors[p]);
            if (space_print(j.sp, &c->sched, txt, sizeof txt) >= 0)
                json_object_set_new(r, key, json_string(txt));
            rc = ic_pri[p] = add_unique(&j, &c->sched, PL_SRC_TLM, c->score, err);
        }
        free(c);
    }
    if (rc >= 0 && a->topk) {
        tlm_candidate *c = malloc((size_t)a->topk * sizeof *c);
        int n = 0;
        rc = c ? tlm_select_generate(m, j.sp, a->topk, c, &n, err) : TLM_ENOMEM;
        for (int k = 0; !rc && k < n; k++) {
            int ic = add_unique(&j, &c[k].sched, PL_SRC_TOPK, c[k].score, err);
            if (ic < 0)
                rc = ic;
            else
                ic_top[n_top++] = ic;
        }
        free(c);
    }
    if (rc < 0) {
        json_decref(r);
        pl_job_free(&j);
        return NULL;
    }
    int *idx = malloc((size_t)(j.n_cands + 1) * sizeof *idx);
    for (int i = 0; i < j.n_cands; i++)
        idx[i] = i;
    rc = idx ? pl_evaluate_batch(&j, idx, j.n_cands, true, 2, NULL, err) : TLM_ENOMEM;
    free(idx);
    if (rc) {
        json_decref(r);
        pl_job_free(&j);
        return NULL;
    }
    const char *st = NULL;
    if (ic_def >= 0) json_object_set_new(r, "default_ms", ms_or_null(cand_time(&j, ic_def, &st)));
    if (ic_tlm >= 0) {
        json_object_set_new(r, "tlm_ms", ms_or_null(cand_time(&j, ic_tlm, &st)));
        json_object_set_new(r, "tlm_status", json_string(st));
        json_object_set_new(r, "tlm_same_as_default", json_boolean(ic_tlm == ic_def));
        json_object_set_new(r, "tlm_decode_ms", json_real(gen_s * 1e3));
    } else if (a->want_tlm) {
        json_object_set_new(r, "tlm_status", json_string("no_schedule"));
    }
    for (int p = 0; p < a->n_priors; p++) {
        char key[64];
        snprintf(key, sizeof key, "tlm@%g_ms", a->priors[p]);
        json_object_set_new(r, key, ic_pri[p] >= 0 ? ms_or_null(cand_time(&j, ic_pri[p], NULL))
                                                   : json_null());
        snprintf(key, sizeof key, "tlm@%g_same_as_default", a->priors[p]);
        json_object_set_new(r, key, json_boolean(ic_pri[p] >= 0 && ic_pri[p] == ic_def));
    }
    if (n_top) {
        double best = INFINITY;
        int valid = 0;
        for (int k = 0; k < n_top; k++) {
            double s = cand_time(&j, ic_top[k], NULL);
            valid += isfinite(s);
            if (s < best) best = s;
        }
        json_object_set_new(r, "topk_ms", ms_or_null(best));
        json_object_set_new(r, "topk_valid", json_integer(valid));
        json_object_set_new(r, "topk_n", json_integer(n_top));
    }
    pl_job_free(&j);
    if (a->search) {
        pl_opts so;
        pl_opts_init(&so);
        so.mode = PL_MODE_TUNE;
        so.mo.seed = po.mo.seed;
        pl_job sj;
        tune_opts to;
        tune_opts_init(&to);
        to.trials = a->search;
        to.seed = a->seed;
        tune_stats ts = {0};
        double t0 = tlm_now_s();
        rc = pl_prepare(&sj, w, t, &so, err);
        if (!rc) rc = tune_run(&sj, &to, &ts, err);
        if (!rc) {
            json_object_set_new(r, "search_ms", ms_or_null(ts.best_s));
            json_object_set_new(r, "search_trials", json_integer(ts.trials));
            json_object_set_new(r, "search_s", json_real(tlm_now_s() - t0));
        } else {
            json_object_set_new(r, "search_error", json_string(err->msg));
        }
        tune_stats_free(&ts);
        pl_job_free(&sj);
    }
    return r;
}

static double geo(double lsum, int n)
{
    return n ? exp(lsum / n) : NAN;
}

/* Geomean ratios over every line of the JSONL (or of this run without one). */
static json_t *summary(json_t *lines)
{
    double l_dt = 0, l_st = 0, l_sk = 0, l_dk = 0;
    int n_dt = 0, n_st = 0, n_sk = 0, n_dk = 0, n_tlm = 0, n_valid = 0, n_det = 0, n_same = 0;
    size_t i;
    json_t *r;
    json_array_foreach(lines, i, r)
    {
        double d = json_number_value(json_object_get(r, "default_ms"));
        double tl = json_number_value(json_object_get(r, "tlm_ms"));
        double tk = json_number_value(json_object_get(r, "topk_ms"));
        double se = json_number_value(json_object_get(r, "search_ms"));
        if (json_object_get(r, "tlm_status")) {
            n_tlm++;
            n_valid += tl > 0;
            n_det += json_is_true(json_object_get(r, "tlm_deterministic"));
            n_same += json_is_true(json_object_get(r, "tlm_same_as_default"));
        }
        if (d > 0 && tl > 0) l_dt += log(d / tl), n_dt++;
        if (se > 0 && tl > 0) l_st += log(se / tl), n_st++;
        if (se > 0 && tk > 0) l_sk += log(se / tk), n_sk++;
        if (d > 0 && tk > 0) l_dk += log(d / tk), n_dk++;
    }
    json_t *s = json_object();
    json_object_set_new(s, "workloads", json_integer((json_int_t)json_array_size(lines)));
    json_object_set_new(s, "tlm_vs_default", n_dt ? json_real(geo(l_dt, n_dt)) : json_null());
    json_object_set_new(s, "tlm_vs_search", n_st ? json_real(geo(l_st, n_st)) : json_null());
    json_object_set_new(s, "topk_vs_search", n_sk ? json_real(geo(l_sk, n_sk)) : json_null());
    json_object_set_new(s, "topk_vs_default", n_dk ? json_real(geo(l_dk, n_dk)) : json_null());
    json_object_set_new(s, "tlm_valid", n_tlm ? json_real((double)n_valid / n_tlm) : json_null());
    json_object_set_new(s, "tlm_deterministic",
                        n_tlm ? json_real((double)n_det / n_tlm) : json_null());
    json_object_set_new(s, "tlm_same_as_default",
                        n_tlm ? json_real((double)n_same / n_tlm) : json_null());
    /* tlm@X: every "tlm@<X>_ms" key of the lines, vs the default on the same line */
    json_t *pri = json_object();
    json_array_foreach(lines, i, r)
    {
        const char *key;
        json_t *val;
        json_object_foreach(r, key, val)
        {
            size_t kl = strlen(key);
            if (strncmp(key, "tlm@", 4) || kl < 8 || strcmp(key + kl - 3, "_ms")) continue;
            char px[32];
            snprintf(px, sizeof px, "%.*s", (int)(kl - 7), key + 4);
            json_t *agg = json_object_get(pri, px);
            if (!agg) {
                agg = json_pack("{s:f, s:i, s:i, s:i}", "lsum", 0.0, "n", 0, "same", 0, "lines", 0);
                json_object_set_new(pri, px, agg);
            }
            double d = json_number_value(json_object_get(r, "default_ms"));
            double x = json_number_value(val);
            char sk[80];
            snprintf(sk, sizeof sk, "tlm@%s_same_as_default", px);
            json_object_set_new(agg, "lines", json_integer(json_integer_value(json_object_get(agg, "lines")) + 1));
            if (json_is_true(json_object_get(r, sk)))
                json_object_set_new(agg, "same", json_integer(json_integer_value(json_object_get(agg, "same")) + 1));
            if (d > 0 && x > 0) {
                json_object_set_new(agg, "lsum", json_real(json_real_value(json_object_get(agg, "lsum")) + log(d / x)));
                json_object_set_new(agg, "n", json_integer(json_integer_value(json_object_get(agg, "n")) + 1));
            }
        }
    }
    json_t *out = json_array();
    const char *px;
    json_t *agg;
    json_object_foreach(pri, px, agg)
    {
        int n = (int)json_integer_value(json_object_get(agg, "n"));
        int lines_n = (int)json_integer_value(json_object_get(agg, "lines"));
        json_array_append_new(
            out, json_pack("{s:f, s:o, s:f, s:i}", "prior", atof(px), "vs_default",
                           n ? json_real(geo(json_real_value(json_object_get(agg, "lsum")), n))
                             : json_null(),
                           "same_as_default",
                           lines_n ? (double)json_integer_value(json_object_get(agg, "same")) / lines_n
                                   : 0.0,
                           "workloads", lines_n));
    }
    json_decref(pri);
    if (json_array_size(out)) json_object_set_new(s, "tlm_prior", out);
    else json_decref(out);
    return s;
}

static int run_eval(int argc, char **argv)
{
    ev_args a;
    tlm_error err;
    tlm_err_clear(&err);
    int prc = parse(argc, argv, &a, &err);
    if (prc) return prc < 0 ? CLI_OK : prc;
    target t;
    if (target_parse(a.tg, &t, &err)) return cli_report(&err);
    tlm_model *m = NULL;
    if (a.weights && cli_load_weights("--weights", a.weights, &m, &err)) return cli_report(&err);
    if (m && a.prior >= 0.0) m->default_prior = (float)a.prior;
    size_t len = 0;
    char *text = cli_read_file("--suite", a.suite, &len, &err);
    json_error_t je;
    json_t *doc = text ? json_loadb(text, len, 0, &je) : NULL;
    free(text);
    json_t *wls = json_object_get(doc, "workloads");
    if (!json_is_array(wls)) {
        json_decref(doc);
        tlm_model_free(m);
        if (!err.msg[0])
            tlm_err_set(&err, TLM_EINVAL, "--suite", "%s: expected {\"workloads\": [...]}",
                        a.suite);
        return cli_report(&err);
    }
    /* lines already measured (resume) */
    json_t *lines = json_array();
    if (a.jsonl) {
        FILE *f = fopen(a.jsonl, "r");
        char *line = NULL;
        size_t cap = 0;
        while (f && getline(&line, &cap, f) > 0) {
            json_t *r = json_loads(line, 0, NULL);
            if (r && !strcmp(json_string_value(json_object_get(r, "target")) ?: "", t.name))
                json_array_append(lines, r);
            json_decref(r);
        }
        free(line);
        if (f) fclose(f);
    }
    tune_register();
    FILE *out = a.jsonl ? fopen(a.jsonl, "a") : NULL;
    int rc =
        a.jsonl && !out ? tlm_err_set(&err, TLM_EINVAL, "--jsonl", "cannot open %s", a.jsonl) : 0;
    size_t i;
    json_t *it;
    json_array_foreach(wls, i, it)
    {
        if (rc) break;
        const char *name = json_string_value(json_object_get(it, "name"));
        if (!name || !name_in(a.only, name)) continue;
        bool done = false;
        size_t q;
        json_t *l;
        json_array_foreach(lines, q, l) done =
            done || !strcmp(json_string_value(json_object_get(l, "name")) ?: "", name);
        if (done) continue;
        ir_workload w;
        if (proto_workload_decode(json_object_get(it, "workload"), &w, &err)) {
            fprintf(stderr, "tlm: eval: %s: %s\n", name, err.msg);
            continue;
        }
        double t0 = tlm_now_s();
        json_t *r = eval_one(&a, name, &w, &t, m, &err);
        if (!r) {
            fprintf(stderr, "tlm: eval: %s: %s\n", name, err.msg);
            continue;
        }
        if (!a.quiet) {
            char *s = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(5));
            fprintf(stderr, "eval: %s (%.0f s)\n", s ? s : name, tlm_now_s() - t0);
            free(s);
        }
        if (out) {
            char *s = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(8));
            if (s) fprintf(out, "%s\n", s), fflush(out);
            free(s);
        }
        json_array_append_new(lines, r);
    }
    if (out) fclose(out);
    int res = rc ? cli_report(&err) : CLI_OK;
    if (!rc) {
        json_t *s = summary(lines);
        json_object_set_new(s, "target", json_string(t.name));
        json_object_set_new(s, "weights", a.weights ? json_string(a.weights) : json_null());
        json_object_set_new(s, "prior", m ? json_real(m->default_prior) : json_null());
        res = cli_print_json(s);
        json_decref(s);
    }
    json_decref(lines);
    json_decref(doc);
    tlm_model_free(m);
    return res;
}

const cli_cmd cli_cmd_eval = {"eval", "the model's schedules vs default and search on a suite",
                              run_eval};
