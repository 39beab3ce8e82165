/* cmd_datagen.c — `tlm datagen`: measured programs for training the TLM.
 *
 *   tlm datagen --store FILE --target T [--suite zoo|FILE] [--per-task N] [--trials-cap N]
 *               [--budget-measurements M] [--max-gflop G] [--exclude FILE] [--seed S]
 *               [--weights F] [--labels measured|model] [--relabel FILE] [--list] [--quiet]
 *
 * Tasks are the kernels of the zoo's models under augmentations (batch sizes, image sizes,
 * sequence lengths: the table below), or the workloads of a suite file (bench/suites format
 * or a JSON array of workloads), deduplicated by workload hash, minus any workload of the
 * --exclude suite (the validation suite is never trained on) and above --max-gflop (the
 * measurement cost). Each task gets a measured search (compiler/tune, evolutionary, seeded
 * by the task) of --per-task trials whose every measurement goes to the store as it is made.
 *
 * Resumable and incremental: a task whose workload already has --per-task measurements on
 * this target in the store is skipped, so a killed run started again continues where it was,
 * and a larger --per-task or a new suite adds only what is missing. The order of the tasks
 * is a seeded shuffle, so a run cut short by --budget-measurements still covers every model.
 * With --weights (a round of the learning loop: generate, measure, fine-tune) the model's
 * beam joins every search's first round, so the schedules it writes are measured beside the
 * default and the samples, and the next `tlm train` learns from its hits and misses.
 *
 * Relabelling (--relabel FILE): records from another host, or from before the rule of thumb
 * changed, rank schedules by times that no longer compare with today's default. Each
 * workload of the target in FILE becomes a task whose candidates are its --per-task (2)
 * fastest correct schedules there; they and today's default are measured here, then three
 * more times each in rotating rounds (tune_second_look), so a label says whether the
 * default still loses to them on this host. Resumable like the rest: a workload whose
 * candidates and today's default all have a measurement in the store is skipped (so after a
 * change to the rule of thumb, a run measures the workloads whose default changed).
 *
 * Labels: CPU targets are measured on this host. cuda targets cannot be measured here (no GPU
 * is used), so a cuda datagen needs --labels model: every candidate is still compiled to a
 * cubin by NVRTC (no GPU needed) and labelled by the analytic GPU model
 * (compiler/measure/gpu_model.h) from its launch and ptxas figures; its records get status
 * "modelled", never "ok", so they are never mistaken for measurements (`tlm records export`
 * carries the status, `tlm train` counts modelled and measured labels apart). Records measured
 * on a GPU elsewhere come in through `tlm records import`.
 * Prints one JSON summary; progress (one line per task) on stderr. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver/pipeline.h"
#include "compiler/frontend/frontend.h"
#include "compiler/lang/lang.h"
#include "compiler/target/target.h"
#include "compiler/tlm/tlm.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/tune/tune.h"
#include "compiler/util/util.h"
#include "proto/workload.h"
#include "store/store.h"
#include "tools/tlm/cli.h"

static const char datagen_usage[] =
    "usage: tlm datagen --store FILE --target T [options]\n"
    "  measured programs for training: a measured search per task, every measurement\n"
    "  recorded in the store; resumable (tasks already measured are skipped)\n"
    "options:\n"
    "  --suite S               zoo (default: the zoo's models, augmented) | FILE (a suite)\n"
    "  --per-task N            measurements per task (default 24)\n"
    "  --budget-measurements M stop after M new measurements (default: none)\n"
    "  --max-gflop G           skip workloads above G GFLOP (default 4)\n"
    "  --exclude FILE          never take a workload of this suite (the validation suite)\n"
    "  --seed S                task order and search seeds (default 1)\n"
    "  --weights F             a round of the learning loop: the model's beam joins each\n"
    "                          search's first round, so its schedules get measured too\n"
    "  --labels L              measured (default; CPU targets) | model (cuda targets: NVRTC\n"
    "                          cubins labelled by the analytic GPU model, status \"modelled\")\n"
    "  --relabel FILE          records (JSONL, `tlm records export`) measured elsewhere or\n"
    "                          under an older rule of thumb: per workload of --target, its\n"
    "                          --per-task best correct schedules (default 2) measured again\n"
    "                          here beside today's default, three rounds each\n"
    "  --list                  print the tasks (JSON) and measure nothing\n"
    "  --quiet                 no progress on stderr\n";

/* The augmentations: every zoo model at each of these settings (0 = the model's default). */
typedef struct {
    const char *model;
    fe_zoo_opts opts;
} zoo_aug;

static const zoo_aug augs[] = {
    {"resnet50", {1, 224, 0}},
    {"resnet50", {1, 160, 0}},
    {"resnet50", {2, 112, 0}},
    {"mobilenet_v2", {1, 224, 0}},
    {"mobilenet_v2", {1, 160, 0}},
    {"mobilenet_v2", {4, 96, 0}},
    {"efficientnet_b0", {1, 224, 0}},
    {"efficientnet_b0", {1, 128, 0}},
    {"bert_base", {1, 0, 128}},
    {"bert_base", {1, 0, 50}},
    {"bert_base", {2, 0, 200}},
    {"bert_base", {1, 0, 384}},
    {"gpt2", {1, 0, 64}},
    {"gpt2", {1, 0, 300}},
    {"gpt2", {8, 0, 1}},
    {"llama_7b", {1, 0, 16}},
    {"llama_7b", {1, 0, 1}},
    {"llama_7b", {1, 0, 33}},
};
#define N_AUGS ((int)(sizeof augs / sizeof augs[0]))

#define DG_MAX_GIVEN 8

typedef struct {
    ir_workload wl;
    char hash[IR_HASH_HEX];
    char name[96];
    double gflop;
    /* --relabel: the schedules to measure again beside the default (malloc'ed text), by
     * their recorded medians, fastest first */
    char *given[DG_MAX_GIVEN];
    double given_s[DG_MAX_GIVEN];
    int n_given;
} dg_task;

typedef struct {
    dg_task *v;
    int n, cap;
} dg_tasks;

typedef struct {
    const char *store, *tg, *suite, *exclude, *weights, *labels, *relabel;
    uint64_t per_task, budget, seed;
    double max_gflop;
    bool list, quiet, per_task_set;
} dg_args;

/* The index of the task of workload hash h, or -1. */
static int find_task(const dg_tasks *ts, const char *h)
{
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->v[i].hash, h)) return i;
    return -1;
}

/* Adds w (once: a workload already there is not added again); *at (may be NULL) is its
 * task's index either way. */
static int add_task(dg_tasks *ts, const ir_workload *w, const char *name, int *at,
                    tlm_error *err)
{
    char h[IR_HASH_HEX];
    if (ir_workload_hash_hex(w, h) < 0)
        return tlm_err_set(err, TLM_EINVAL, "workload", "%s: cannot hash the workload", name);
    int have = find_task(ts, h);
    if (at) *at = have >= 0 ? have : ts->n;
    if (have >= 0) return 0;
    if (ts->n == ts->cap) {
        int cap = ts->cap ? ts->cap * 2 : 64;
        dg_task *v = realloc(ts->v, (size_t)cap * sizeof *v);
        if (!v) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        ts->v = v;
        ts->cap = cap;
    }
    dg_task *t = &ts->v[ts->n++];
    t->wl = *w;
    t->n_given = 0;
    snprintf(t->hash, sizeof t->hash, "%s", h);
    snprintf(t->name, sizeof t->name, "%s", name);
    ir_subgraph g;
    t->gflop = ir_subgraph_build(w, &g, err) ? NAN : (double)ir_subgraph_flops(&g) * 1e-9;
    return 0;
}

static int zoo_tasks(dg_tasks *ts, tlm_error *err)
{
    for (int a = 0; a < N_AUGS; a++) {
        fe_graph *g = NULL;
        fe_fused fu = {0};
        if (fe_zoo_build(augs[a].model, &augs[a].opts, &g, err) || fe_fuse(g, &fu, err)) {
            fe_graph_free(g);
            return err->code ? err->code : TLM_EINVAL;
        }
        int rc = 0;
        for (int i = 0; i < fu.n && !rc; i++) {
            char name[96];
            snprintf(name, sizeof name, "%s/b%lld-s%lld/%s", augs[a].model,
                     (long long)augs[a].opts.batch,
                     (long long)(augs[a].opts.image_size ? augs[a].opts.image_size
                                                         : augs[a].opts.seq_len),
                     fu.sub[i].name);
            rc = add_task(ts, &fu.sub[i].wl, name, NULL, err);
        }
        fe_fused_free(&fu);
        fe_graph_free(g);
        if (rc) return rc;
    }
    return 0;
}

/* A suite file: {"workloads": [{"name", "workload"}, ...]} (bench/suites) or [workload, ...]. */
static int suite_tasks(const char *path, dg_tasks *ts, tlm_error *err)
{
    size_t len = 0;
    char *text = cli_read_file("--suite", path, &len, err);
    if (!text) return err->code;
    json_error_t je;
    json_t *doc = json_loadb(text, len, 0, &je);
    free(text);
    if (!doc)
        return tlm_err_set(err, TLM_EINVAL, "--suite", "%s: line %d: %s", path, je.line, je.text);
    json_t *arr = json_is_array(doc) ? doc : json_object_get(doc, "workloads");
    int rc = json_is_array(arr)
                 ? 0
                 : tlm_err_set(err, TLM_EINVAL, "--suite",
                               "%s: expected an array or {\"workloads\": [...]}", path);
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it)
    {
        if (rc) break;
        json_t *wj = json_object_get(it, "workload");
        const char *nm = json_string_value(json_object_get(it, "name"));
        char name[96];
        snprintf(name, sizeof name, "%s", nm ? nm : "");
        if (!nm) snprintf(name, sizeof name, "%s[%zu]", path, i);
        ir_workload w;
        if (proto_workload_decode(wj ? wj : it, &w, err)) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            rc = tlm_err_set(err, TLM_EINVAL, "--suite", "%s: %s", name, msg);
            break;
        }
        rc = add_task(ts, &w, name, NULL, err);
    }
    json_decref(doc);
    return rc;
}

/* Keeps the k fastest distinct schedules of a task (median seconds ascending). */
static void keep_given(dg_task *t, const char *sched, double sec, int k)
{
    double *given_s = t->given_s;
    for (int i = 0; i < t->n_given; i++)
        if (!strcmp(t->given[i], sched)) {
            if (sec < given_s[i]) given_s[i] = sec; /* re-sorted below */
            sec = -1;
        }
    if (sec >= 0) {
        if (t->n_given == k && sec >= given_s[k - 1]) return;
        char *c = strdup(sched);
        if (!c) return;
        if (t->n_given == k) free(t->given[--t->n_given]);
        t->given[t->n_given] = c;
        given_s[t->n_given++] = sec;
    }
    for (int i = 1; i < t->n_given; i++) /* insertion sort: a handful */
        for (int j = i; j > 0 && given_s[j] < given_s[j - 1]; j--) {
            double ts = given_s[j];
            given_s[j] = given_s[j - 1];
            given_s[j - 1] = ts;
            char *tx = t->given[j];
            t->given[j] = t->given[j - 1];
            t->given[j - 1] = tx;
        }
}

/* --relabel: one task per workload of target `tg` in a records file, with its k fastest
 * correct schedules. Their times came from another host or another day: only their text is
 * kept; they are measured again here beside today's default. */
static int relabel_tasks(const char *path, const char *tg, int k, dg_tasks *ts, tlm_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return tlm_err_set(err, TLM_EINVAL, "--relabel", "%s: cannot open", path);
    int rc = 0, lineno = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (!rc && getline(&line, &lcap, f) > 0) {
        lineno++;
        json_error_t je;
        json_t *r = json_loads(line, 0, &je);
        if (!r) {
            rc = tlm_err_set(err, TLM_EINVAL, "--relabel", "%s: line %d: %s", path, lineno,
                             je.text);
            break;
        }
        const char *rt = json_string_value(json_object_get(r, "target"));
        const char *st = json_string_value(json_object_get(r, "status"));
        const char *sc = json_string_value(json_object_get(r, "schedule"));
        double med = json_number_value(json_object_get(r, "median_s"));
        ir_workload w;
        tlm_error e;
        if (rt && st && sc && !strcmp(rt, tg) && !strcmp(st, "ok") && med > 0 &&
            !proto_workload_decode(json_object_get(r, "workload"), &w, &e)) {
            char name[96];
            snprintf(name, sizeof name, "%s:%d", path, lineno);
            int ti;
            rc = add_task(ts, &w, name, &ti, err);
            if (!rc) keep_given(&ts->v[ti], sc, med, k);
        }
        json_decref(r);
    }
    free(line);
    fclose(f);
    return rc;
}

static void free_tasks(dg_tasks *ts)
{
    for (int i = 0; i < ts->n; i++)
        for (int g = 0; g < ts->v[i].n_given; g++) free(ts->v[i].given[g]);
    free(ts->v);
    ts->v = NULL;
    ts->n = ts->cap = 0;
}

static int parse(int argc, char **argv, dg_args *a, tlm_error *err)
{
    memset(a, 0, sizeof *a);
    a->suite = "zoo";
    a->per_task = 24;
    a->seed = 1;
    a->max_gflop = 4;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            fputs(datagen_usage, stdout);
            return -1;
        }
        if (!strcmp(k, "--list")) {
            a->list = true;
            continue;
        }
        if (!strcmp(k, "--quiet")) {
            a->quiet = true;
            continue;
        }
        if (i + 1 >= argc) return cli_usage_error("datagen: %s needs a value", k);
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(k, "--store"))
            a->store = v;
        else if (!strcmp(k, "--target"))
            a->tg = v;
        else if (!strcmp(k, "--suite"))
            a->suite = v;
        else if (!strcmp(k, "--exclude"))
            a->exclude = v;
        else if (!strcmp(k, "--weights"))
            a->weights = v;
        else if (!strcmp(k, "--relabel"))
            a->relabel = v;
        else if (!strcmp(k, "--labels")) {
            a->labels = v;
            if (strcmp(v, "measured") && strcmp(v, "model"))
                rc = tlm_err_set(err, TLM_EINVAL, "--labels",
                                 "unknown labels \"%s\"; allowed: measured, model", v);
        } else if (!strcmp(k, "--per-task"))
            rc = cli_parse_u64("--per-task", v, 100000, &a->per_task, err), a->per_task_set = 1;
        else if (!strcmp(k, "--budget-measurements"))
            rc = cli_parse_u64("--budget-measurements", v, UINT32_MAX, &a->budget, err);
        else if (!strcmp(k, "--seed"))
            rc = cli_parse_u64("--seed", v, UINT64_MAX, &a->seed, err);
        else if (!strcmp(k, "--max-gflop")) {
            char *end = NULL;
            a->max_gflop = strtod(v, &end);
            if (!end || *end || !(a->max_gflop > 0))
                rc = tlm_err_set(err, TLM_EINVAL, "--max-gflop", "expected a number > 0, got '%s'",
                                 v);
        } else {
            fputs(datagen_usage, stderr);
            return cli_usage_error("datagen: unknown option '%s'", k);
        }
        if (rc) return cli_report(err);
    }
    if (!a->tg) return cli_usage_error("datagen: --target is required");
    if (!a->store && !a->list) return cli_usage_error("datagen: --store is required");
    if (!a->per_task) return cli_usage_error("datagen: --per-task must be >= 1");
    if (a->relabel && !a->per_task_set) a->per_task = 2;
    if (a->relabel && a->per_task > DG_MAX_GIVEN)
        return cli_usage_error("datagen: --relabel takes at most %d schedules a workload "
                               "(--per-task)", DG_MAX_GIVEN);
    if (a->relabel && strcmp(a->suite, "zoo"))
        return cli_usage_error("datagen: --relabel takes its workloads from the records; "
                               "--suite is for a search");
    if (a->relabel && a->weights)
        return cli_usage_error("datagen: --relabel measures the records' schedules and the "
                               "default; --weights is for a search");
    return 0;
}

typedef struct {
    store *st;
    int stored;
} dg_ctx;

static void on_records(const pl_job *j, int from, int to, void *user)
{
    dg_ctx *c = user;
    int n = 0;
    tlm_error e;
    if (store_pl_records(c->st, j, from, to, "none", &n, &e))
        fprintf(stderr, "tlm: datagen: storing records: %s\n", e.msg);
    c->stored += n;
}

/* Measurements the store already holds for this workload on this target under today's
 * sketch (any status: a schedule that failed is a label too). Records of a sketch the space no
 * longer picks for the workload are stale: the trainer cannot use them, so they do not count. */
static int measured(store *st, const char *wh, const char *th, const char *sketch, tlm_error *err)
{
    store_measurement *ms = NULL;
    size_t n = 0;
    if (store_measurements_list(st, wh, th, 100000, &ms, &n, err)) return -1;
    int have = 0;
    for (size_t i = 0; i < n; i++)
        have += ms[i].sketch && !strcmp(ms[i].sketch, sketch);
    store_measurements_free(ms, n);
    return have;
}

/* Relabelling: whether each of the job's candidates (the given schedules today's space
 * takes) and today's default has a measurement of its own (that schedule, that sketch) in the
 * store: 1, 0, or -1 on a store error. Counting the workload's records instead skipped a
 * workload whose default a changed rule of thumb had left unmeasured. */
static int candidates_measured(store *st, const pl_job *j, tlm_error *err)
{
    store_measurement *ms = NULL;
    size_t n = 0;
    if (store_measurements_list(st, j->whash, j->target_hash, 100000, &ms, &n, err)) return -1;
    const char *sketch = space_sketch_name(j->sp->sketch);
    int all = 1;
    for (int c = 0; c <= j->n_cands && all; c++) {
        space_sched s;
        if (c < j->n_cands) s = j->cands[c].sched;
        else space_default(j->sp, &s);
        char text[4096];
        space_print(j->sp, &s, text, sizeof text);
        int found = 0;
        for (size_t i = 0; i < n && !found; i++)
            found = ms[i].sketch && !strcmp(ms[i].sketch, sketch) && ms[i].schedule &&
                    !strcmp(ms[i].schedule, text);
        all = found;
    }
    store_measurements_free(ms, n);
    return all;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int run_datagen(int argc, char **argv)
{
    dg_args a;
    tlm_error err;
    tlm_err_clear(&err);
    int prc = parse(argc, argv, &a, &err);
    if (prc) return prc < 0 ? CLI_OK : prc;
    target t;
    if (target_parse(a.tg, &t, &err)) return cli_report(&err);
    bool model_labels = a.labels && !strcmp(a.labels, "model");
    if (t.kind == TARGET_CUDA && !model_labels && !a.list)
        return cli_usage_error("datagen: %s kernels cannot be measured on this machine (no GPU is "
                               "used here); label them with the analytic GPU model: --labels "
                               "model (records get status \"modelled\"), or import records "
                               "measured on a GPU with `tlm records import`",
                               t.name);
    if (t.kind != TARGET_CUDA && model_labels)
        return cli_usage_error("datagen: --labels model is for cuda targets; %s kernels are "
                               "measured on this host (--labels measured)",
                               t.name);
    if (model_labels && !a.list && tc_nvrtc_available(&err)) {
        snprintf(err.field, sizeof err.field, "--labels");
        return cli_report(&err);
    }
    dg_tasks ts = {0}, ex = {0};
    int rc = a.relabel ? relabel_tasks(a.relabel, t.name, (int)a.per_task, &ts, &err)
             : !strcmp(a.suite, "zoo") ? zoo_tasks(&ts, &err)
                                       : suite_tasks(a.suite, &ts, &err);
    if (!rc && a.exclude) rc = suite_tasks(a.exclude, &ex, &err);
    if (rc) {
        free_tasks(&ts);
        free(ex.v);
        return cli_report(&err);
    }
    /* drop excluded and too-large workloads, then a seeded shuffle */
    int kept = 0, excluded = 0, large = 0;
    for (int i = 0; i < ts.n; i++) {
        bool is_ex = find_task(&ex, ts.v[i].hash) >= 0, big = !(ts.v[i].gflop <= a.max_gflop);
        excluded += is_ex;
        large += !is_ex && big;
        if (!is_ex && !big)
            ts.v[kept++] = ts.v[i];
        else
            for (int g = 0; g < ts.v[i].n_given; g++) free(ts.v[i].given[g]);
    }
    ts.n = kept;
    free(ex.v);
    uint64_t rs = a.seed;
    for (int i = ts.n - 1; i > 0; i--) {
        int k = (int)(splitmix(&rs) % (uint64_t)(i + 1));
        dg_task tmp = ts.v[i];
        ts.v[i] = ts.v[k];
        ts.v[k] = tmp;
    }
    if (a.list) {
        json_t *arr = json_array();
        for (int i = 0; i < ts.n; i++)
            json_array_append_new(arr, json_pack("{s:s, s:s, s:s, s:f}", "name", ts.v[i].name, "op",
                                                 ir_op_get(ts.v[i].wl.op)->name, "workload_hash",
                                                 ts.v[i].hash, "gflop", ts.v[i].gflop));
        json_t *r = json_pack("{s:i, s:i, s:i, s:o}", "tasks", ts.n, "excluded", excluded,
                              "too_large", large, "list", arr);
        int out = cli_print_json(r);
        json_decref(r);
        free_tasks(&ts);
        return out;
    }
    tlm_model *model = NULL;
    if (a.weights && cli_load_weights("--weights", a.weights, &model, &err)) {
        free_tasks(&ts);
        return cli_report(&err);
    }
    dg_ctx ctx = {0};
    ctx.st = store_open(a.store, NULL, &err);
    if (!ctx.st) {
        free_tasks(&ts);
        tlm_model_free(model);
        err.code = TLM_EINVAL;
        snprintf(err.field, sizeof err.field, "--store");
        return cli_report(&err);
    }
    tune_register();
    double t0 = tlm_now_s();
    int done = 0, skipped = 0, failed = 0;
    for (int i = 0; i < ts.n; i++) {
        if (a.budget && (uint64_t)ctx.stored >= a.budget) break;
        pl_opts po;
        pl_opts_init(&po);
        po.mode = PL_MODE_TUNE;
        po.on_records = on_records;
        po.user = &ctx;
        po.model_labels = model_labels;
        po.mo.seed = (a.seed + (uint64_t)i) * 0x9e3779b97f4a7c15ull | 1;
        pl_job j;
        tlm_error e;
        tlm_err_clear(&e);
        if (pl_prepare(&j, &ts.v[i].wl, &t, &po, &e)) {
            fprintf(stderr, "tlm: datagen: %s: %s\n", ts.v[i].name, e.msg);
            pl_job_free(&j);
            failed++;
            continue;
        }
        int given = 0;
        for (int g = 0; g < ts.v[i].n_given; g++) {
            space_sched gs;
            tlm_error ge;
            /* a schedule today's space no longer takes (another sketch, a retired value) is
             * dropped: the default stands for it */
            if (!space_parse(j.sp, ts.v[i].given[g], &gs, &ge) &&
                !pl_add_candidate(&j, &gs, PL_SRC_GIVEN, 0, &ge))
                given++;
        }
        int have = a.relabel ? 0
                             : measured(ctx.st, j.whash, j.target_hash,
                                        space_sketch_name(j.sp->sketch), &e);
        if (a.relabel ? candidates_measured(ctx.st, &j, &e) == 1 : have >= (int)a.per_task) {
            skipped++;
            pl_job_free(&j);
            continue;
        }
        tune_opts o;
        tune_opts_init(&o);
        o.trials = (int)a.per_task - (have > 0 ? have : 0); /* only what is missing */
        o.seed = a.seed * 1000003u + (uint64_t)i;
        o.confirm = model_labels ? 0 : 1; /* a second look at a deterministic model adds nothing */
        o.confirm_rounds = 1;
        o.model = model; /* one second look: the label is the best, not the luckiest */
        if (a.relabel) { /* the given schedules and the default, then three rounds of each */
            o.trials = given + 1;
            o.confirm = given + 1;
            o.confirm_rounds = 3;
        }
        int before = ctx.stored;
        tune_stats s = {0};
        int trc = tune_run(&j, &o, &s, &e);
        done++;
        if (trc) failed++;
        if (!a.quiet)
            fprintf(stderr,
                    "datagen: %d/%d %s (%.3f GFLOP): %d records, best %.4f ms, default %.4f ms, "
                    "%.0f s elapsed%s%s\n",
                    i + 1, ts.n, ts.v[i].name, ts.v[i].gflop, ctx.stored - before,
                    trc ? NAN : s.best_s * 1e3, trc ? NAN : s.default_s * 1e3, tlm_now_s() - t0,
                    trc ? ": " : "", trc ? e.msg : "");
        tune_stats_free(&s);
        pl_job_free(&j);
    }
    json_t *r =
        json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f}", "target", t.name, "labels",
                  model_labels ? "model" : "measured", "tasks", ts.n, "tuned", done, "skipped",
                  skipped, "failed", failed, "excluded", excluded, "too_large", large,
                  "measurements", ctx.stored, "elapsed_s", tlm_now_s() - t0);
    int out = cli_print_json(r);
    json_decref(r);
    store_close(ctx.st);
    tlm_model_free(model);
    free_tasks(&ts);
    return out;
}

const cli_cmd cli_cmd_datagen = {"datagen", "measured programs for training the TLM", run_datagen};
