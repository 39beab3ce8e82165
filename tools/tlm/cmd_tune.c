/* cmd_tune.c — `tlm tune`: the measured search (compiler/tune) on one workload, or on every
 * kernel of a network with one budget spread by the task scheduler.
 *
 *   tlm tune --workload W --target T [--trials N] [--seconds S] [--strategy evolutionary|random]
 *            [--seed S] [--batch B] [--confirm K] [--confirm-rounds R] [--store FILE]
 *            [--weights F] [--curve FILE]
 *   tlm tune --model NAME [--batch-size B] [--image-size S] [--seq-len L] --target T ...
 *
 * Prints one JSON object: best_ms, default_ms, first_ms (the starting point's time), trials,
 * ok, rounds, schedule, schedule_source ("tuned"), sketch, speedup_vs_default, elapsed_s,
 * model_s (cost-model time), records (stored), best_at (best-so-far in ms after 16, 64, 256,
 * 1000 trials, where reached), and the second look's figures: confirmed (candidates measured
 * again), first_confirmed_ms and confirmed_ms (the starting point and the chosen kernel in the
 * same rotating rounds) and speedup_confirmed (their ratio; the in-search ratio compares the
 * start's first sample with the luckiest of many). A network prints {"tasks": [...], "weighted_ms",
 * "weighted_default_ms", ...}. Progress goes to stderr, one line per round. --store FILE
 * (SQLite, created if needed) receives every measurement as it is made: a tune killed
 * half-way keeps what it measured. --curve FILE writes the best-so-far per trial (JSON
 * array of ms).
 *
 * --strategy htam prints its trajectory: per step the direction, the strategy, "gen" (who
 * wrote the rewritten slot: "tlm" — the model under the grammar mask — or "mutation" — the
 * strategy's operator), the slot and its values; --regen picks the generator (tlm by default
 * with --weights). With --model the budget goes over the kernels by the task scheduler, one
 * trajectory per task. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver/pipeline.h"
#include "compiler/frontend/frontend.h"
#include "compiler/lang/lang.h"
#include "compiler/target/target.h"
#include "compiler/tlm/tlm.h"
#include "compiler/tlm/select.h"
#include "compiler/tune/htam.h"
#include "compiler/tune/tune.h"
#include "compiler/util/util.h"
#include "store/store.h"
#include "tools/tlm/cli.h"

static const char tune_usage[] =
    "usage: tlm tune (--workload W | --model NAME [--batch-size B] [--image-size S]\n"
    "                [--seq-len L]) --target T [options]\n"
    "  the measured search: evolutionary, guided by a cost model (XGBoost) retrained on every\n"
    "  measurement; prints JSON (best_ms, default_ms, first_ms, trials, schedule, ...)\n"
    "options:\n"
    "  --trials N        candidates to build and measure (default 64; a network: in total)\n"
    "  --seconds S       wall-clock budget (default: none)\n"
    "  --strategy S      evolutionary (default) | random (uniform samples: the baseline)\n"
    "                    | htam (refinement guided by the HTAM memory in --store)\n"
    "  --memory M        htam: full (default) | flat | no-transitions | no-local (ablations)\n"
    "  --start S         where the search starts: default (default) | tlm (the model's one\n"
    "                    pass; needs --weights): first_ms and the second look's start\n"
    "  --regen G         htam: who writes a strategy's slot: tlm (the model under the grammar\n"
    "                    mask; the default with --weights) | mutation (the strategy's operator;\n"
    "                    the default without)\n"
    "  --seed S          the search's random seed (default 1)\n"
    "  --batch B         candidates per round (default 16)\n"
    "  --confirm K       the second look: the K fastest and the starting point measured again\n"
    "                    (full protocol) and the fastest there chosen (default 3; 0: off)\n"
    "  --confirm-rounds R  measurements of each in the second look, rotating order (default 3)\n"
    "  --store FILE      record every measurement in this SQLite store as it is made\n"
    "  --weights F       seed the first round with the model's beam\n"
    "  --curve FILE      write the best-so-far time per trial (JSON array, ms)\n"
    "  --quiet           no progress on stderr\n";

typedef struct {
    const char *wl, *model, *tg, *strategy, *store, *weights, *curve, *memory, *start, *regen;
    fe_zoo_opts zo;
    uint64_t trials, seed, batch, confirm, confirm_rounds;
    double seconds;
    bool quiet;
} tune_args;

typedef struct {
    store *st;
    int stored;
    bool quiet;
    const char *label;
} tune_ctx;

static void on_records(const pl_job *j, int from, int to, void *user)
{
    tune_ctx *c = user;
    if (!c->st) return;
    int n = 0;
    tlm_error e;
    if (store_pl_records(c->st, j, from, to, "none", &n, &e))
        fprintf(stderr, "tlm: tune: storing records: %s\n", e.msg);
    c->stored += n;
}

static void on_progress(const pl_job *j, const pl_progress *p, void *user)
{
    tune_ctx *c = user;
    if (c->quiet || strcmp(p->phase, "measure")) return;
    fprintf(stderr, "tune%s%s: round %d trials %d/%d best %.4f ms first %.4f ms %.1f s\n",
            c->label ? " " : "", c->label ? c->label : "", p->round, p->trials, p->trials_budget,
            isfinite(p->best_s) ? p->best_s * 1e3 : NAN,
            isfinite(p->first_s) ? p->first_s * 1e3 : NAN, p->elapsed_s);
}

static json_t *ms(double s)
{
    return isfinite(s) ? json_real(s * 1e3) : json_null();
}

static int parse(int argc, char **argv, tune_args *a, tlm_error *err)
{
    memset(a, 0, sizeof *a);
    a->trials = 64;
    a->seed = 1;
    a->batch = 16;
    a->confirm = a->confirm_rounds = 3;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(tune_usage, stdout);
            return -1;
        }
        if (!strcmp(o, "--quiet")) {
            a->quiet = true;
            continue;
        }
        if (i + 1 >= argc) return cli_usage_error("tune: %s needs a value", o);
        const char *v = argv[++i];
        uint64_t n;
        if (!strcmp(o, "--workload"))
            a->wl = v;
        else if (!strcmp(o, "--model"))
            a->model = v;
        else if (!strcmp(o, "--target"))
            a->tg = v;
        else if (!strcmp(o, "--strategy"))
            a->strategy = v;
        else if (!strcmp(o, "--store"))
            a->store = v;
        else if (!strcmp(o, "--weights"))
            a->weights = v;
        else if (!strcmp(o, "--curve"))
            a->curve = v;
        else if (!strcmp(o, "--memory"))
            a->memory = v;
        else if (!strcmp(o, "--start"))
            a->start = v;
        else if (!strcmp(o, "--regen"))
            a->regen = v;
        else if (!strcmp(o, "--seconds")) {
            char *end;
            a->seconds = strtod(v, &end);
            if (*end || !(a->seconds > 0) || a->seconds > 864000)
                return cli_usage_error("tune: --seconds must be a number in (0, 864000]");
        } else if (!strcmp(o, "--trials") || !strcmp(o, "--seed") || !strcmp(o, "--batch") ||
                   !strcmp(o, "--batch-size") || !strcmp(o, "--image-size") ||
                   !strcmp(o, "--seq-len") || !strcmp(o, "--confirm") ||
                   !strcmp(o, "--confirm-rounds")) {
            uint64_t max = !strcmp(o, "--seed")             ? UINT64_MAX
                           : !strcmp(o, "--confirm")        ? 8
                           : !strcmp(o, "--confirm-rounds") ? 15
                                                            : 1000000;
            if (cli_parse_u64(o, v, max, &n, err)) return cli_report(err);
            if (!strcmp(o, "--trials"))
                a->trials = n;
            else if (!strcmp(o, "--seed"))
                a->seed = n;
            else if (!strcmp(o, "--batch"))
                a->batch = n;
            else if (!strcmp(o, "--confirm"))
                a->confirm = n;
            else if (!strcmp(o, "--confirm-rounds"))
                a->confirm_rounds = n;
            else if (!strcmp(o, "--batch-size"))
                a->zo.batch = (int64_t)n;
            else if (!strcmp(o, "--image-size"))
                a->zo.image_size = (int64_t)n;
            else
                a->zo.seq_len = (int64_t)n;
        } else {
            return cli_usage_error("tune: unknown option %s (see tlm tune --help)", o);
        }
    }
    if (!!a->wl + !!a->model != 1)
        return cli_usage_error("tune: give exactly one of --workload or --model");
    if (!a->tg) return cli_usage_error("tune: --target is required (see tlm tune --help)");
    if (a->trials < 1) return cli_usage_error("tune: --trials must be at least 1");
    if (a->batch < 1 || a->batch > 256) return cli_usage_error("tune: --batch must be in 1..256");
    if (a->confirm_rounds < 1) return cli_usage_error("tune: --confirm-rounds must be in 1..15");
    return 0;
}

static int write_curve(const char *path, const double *curve, int n, tlm_error *err)
{
    json_t *arr = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(arr, ms(curve[i]));
    int rc = json_dump_file(arr, path, JSON_COMPACT);
    json_decref(arr);
    return rc ? tlm_err_set(err, TLM_EIO, "--curve", "cannot write \"%s\"", path) : 0;
}

static json_t *best_at(const tune_stats *s)
{
    static const int marks[] = {16, 64, 256, 1000};
    json_t *o = json_object();
    for (int i = 0; i < 4; i++) {
        if (marks[i] > s->trials) break;
        char k[16];
        snprintf(k, sizeof k, "%d", marks[i]);
        json_object_set_new(o, k, ms(s->best_curve[marks[i] - 1]));
    }
    return o;
}

/* The pipeline job's options every tune here shares: mode TUNE, records into the store as
 * they are made, and one input seed (one reference) per job; salt tells jobs apart. */
static void job_opts(const tune_args *a, tune_ctx *ctx, uint64_t salt, bool progress, pl_opts *po)
{
    pl_opts_init(po);
    po->mode = PL_MODE_TUNE;
    po->on_records = on_records;
    po->progress = progress ? on_progress : NULL;
    po->user = ctx;
    po->mo.seed = (a->seed + salt) * 0x9e3779b97f4a7c15ull | 1;
}

/* The search's options from the flags (the strategy is parsed by the caller). */
static void search_opts(const tune_args *a, const tlm_model *model, tune_opts *o)
{
    tune_opts_init(o);
    o->trials = (int)a->trials;
    o->seconds = a->seconds;
    o->seed = a->seed;
    o->batch = (int)a->batch;
    o->model = model;
    o->confirm = (int)a->confirm;
    o->confirm_rounds = (int)a->confirm_rounds;
}

/* --strategy htam's flags: the memory ablation, the starting point, who writes the slots. */
typedef struct {
    htam_memory mem;
    bool from_tlm;
    const tlm_model *regen; /* NULL: the strategies' operators */
} htam_flags;

static const char *const mem_names[] = {"full", "flat", "no-transitions", "no-local"};

/* --start: the model's one pass (tlm, needs --weights) or the default; a usage error's code
 * (reported) or 0 */
static int parse_start(const tune_args *a, const tlm_model *model, bool *from_tlm)
{
    *from_tlm = a->start && !strcmp(a->start, "tlm");
    if (a->start && !*from_tlm && strcmp(a->start, "default"))
        return cli_usage_error("tune: --start must be default or tlm");
    if (*from_tlm && !model) return cli_usage_error("tune: --start tlm needs --weights");
    return 0;
}

static int htam_parse_flags(const tune_args *a, const tlm_model *model, htam_flags *f)
{
    tlm_error err;
    tlm_err_clear(&err);
    memset(f, 0, sizeof *f);
    f->mem = HTAM_FULL;
    if (a->memory && htam_memory_parse(a->memory, "--memory", &f->mem, &err))
        return cli_report(&err);
    int src = parse_start(a, model, &f->from_tlm);
    if (src) return src;
    bool tlm = model != NULL;
    if (a->regen && htam_regen_parse(a->regen, "--regen", &tlm, &err)) return cli_report(&err);
    if (tlm && !model) return cli_usage_error("tune: --regen tlm needs --weights");
    f->regen = tlm ? model : NULL;
    return 0;
}

static void htam_fill_opts(const tune_args *a, const htam_flags *f, int steps, htam_opts *o)
{
    htam_opts_init(o);
    o->steps = steps;
    o->seconds = a->seconds;
    o->seed = a->seed;
    o->memory = f->mem;
    o->model = f->regen;
    o->confirm = (int)a->confirm;
    o->confirm_rounds = (int)a->confirm_rounds;
}

/* The trajectory: per step the direction, the strategy, who wrote the value ("gen"), the slot
 * and its values, the time. */
static json_t *htam_traj_json(const htam *m, const pl_job *j, const htam_result *res)
{
    json_t *traj = json_array();
    for (int k = 0; k <= res->steps; k++) {
        const htam_step *st = &res->traj[k];
        json_t *x = json_pack(
            "{s:i, s:s, s:s, s:s, s:o, s:b}", "step", k, "global", htam_global_name(m, st->global),
            "local", htam_local_name(m, st->local), "gen", htam_gen_name(st->gen), "ms",
            isfinite(st->ms) ? json_real(st->ms) : json_null(), "improved", st->improved);
        if (st->slot >= 0) {
            json_object_set_new(x, "slot", json_string(j->sp->slot[st->slot].name));
            json_object_set_new(x, "from", json_integer((json_int_t)st->from));
            json_object_set_new(x, "to", json_integer((json_int_t)st->to));
        }
        json_array_append_new(traj, x);
    }
    return traj;
}

/* The second look's figures: the starting point and the chosen kernel measured again in the
 * same rounds (null without one), and their ratio, the speedup least biased by noise. */
static void confirmed_json(json_t *r, int n, double first_s, double best_s)
{
    json_object_set_new(r, "confirmed", json_integer(n));
    json_object_set_new(r, "first_confirmed_ms", ms(first_s));
    json_object_set_new(r, "confirmed_ms", ms(best_s));
    json_object_set_new(r, "speedup_confirmed", isfinite(first_s) && isfinite(best_s) && best_s > 0
                                                    ? json_real(first_s / best_s)
                                                    : json_null());
}

/* The starting point: the model's one pass (--start tlm) or the default. */
static int add_start(pl_job *j, const tlm_model *model, bool from_tlm, tlm_error *err)
{
    if (from_tlm) {
        tlm_candidate c;
        int n = 0;
        int rc = tlm_select_generate(model, j->sp, 1, &c, &n, err);
        if (rc) return rc;
        return n == 1 ? pl_add_candidate(j, &c.sched, PL_SRC_TLM, c.score, err)
                      : tlm_err_set(err, TLM_ERUNTIME, "", "the model wrote no schedule");
    }
    space_sched s;
    space_default(j->sp, &s);
    return pl_add_candidate(j, &s, PL_SRC_DEFAULT, NAN, err);
}

/* --strategy htam: refinement from the starting point, guided by (and teaching) the memory
 * in --store. */
static int htam_one(const tune_args *a, const target *t, const tlm_model *model, tune_ctx *ctx)
{
    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    if (cli_load_workload("--workload", a->wl, &w, &err)) return cli_report(&err);
    htam_flags f;
    int frc = htam_parse_flags(a, model, &f);
    if (frc) return frc;
    pl_opts po;
    job_opts(a, ctx, 0, true, &po);
    pl_job j;
    int rc = pl_prepare(&j, &w, t, &po, &err);
    if (!rc) rc = add_start(&j, model, f.from_tlm, &err);
    htam *m = rc ? NULL : htam_new(t->kind);
    htam_store_io io = {.load = store_htam_load, .save = store_htam_save, .st = ctx->st};
    if (!rc && !m) rc = tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
    if (!rc && ctx->st) rc = htam_load(m, &io, &err);
    if (rc) {
        htam_free(m);
        pl_job_free(&j);
        return cli_report(&err);
    }
    htam_opts o;
    htam_fill_opts(a, &f, (int)a->trials, &o);
    htam_result res;
    rc = htam_run(m, &j, 0, &o, &res, &err);
    int out = CLI_OK;
    if (!rc && ctx->st && htam_save(m, &io, &err)) fprintf(stderr, "tlm: htam: %s\n", err.msg);
    if (rc) {
        out = err.code == TLM_ERUNTIME ? (fprintf(stderr, "tlm: %s\n", err.msg), CLI_FAIL)
                                       : cli_report(&err);
    } else {
        json_t *r = json_pack(
            "{s:s, s:s, s:s, s:o, s:o, s:o, s:i, s:s, s:s, s:s, s:i, s:s, s:s, s:o, s:i, s:o}",
            "workload_hash", j.whash, "target", t->name, "strategy", "htam", "first_ms",
            ms(res.first_s), "best_ms", ms(res.best_s), "default_ms",
            f.from_tlm ? json_null() : ms(res.first_s), "trials", res.steps + 1, "memory",
            mem_names[f.mem], "start", f.from_tlm ? "tlm" : "default", "regen",
            f.regen ? "tlm" : "mutation", "regen_fallbacks", res.fallbacks, "schedule",
            j.art.schedule, "schedule_source", pl_source_name(j.source), "speedup_vs_first",
            isfinite(res.first_s) && isfinite(res.best_s) ? json_real(res.first_s / res.best_s)
                                                          : json_null(),
            "records", ctx->stored, "trajectory", htam_traj_json(m, &j, &res));
        confirmed_json(r, res.confirmed, res.first_confirmed_s, res.confirmed_s);
        out = cli_print_json(r);
        json_decref(r);
    }
    htam_result_free(&res);
    htam_free(m);
    pl_job_free(&j);
    return out;
}

static int tune_one(const tune_args *a, const target *t, const tlm_model *model, tune_ctx *ctx)
{
    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    if (cli_load_workload("--workload", a->wl, &w, &err)) return cli_report(&err);
    pl_opts po;
    job_opts(a, ctx, 0, true, &po);
    bool from_tlm;
    int src = parse_start(a, model, &from_tlm);
    if (src) return src;
    pl_job j;
    int rc = pl_prepare(&j, &w, t, &po, &err);
    /* the model's one pass as the first candidate: the search's starting point (the default
     * joins the first round after it) */
    if (!rc && from_tlm) rc = add_start(&j, model, true, &err);
    if (rc) {
        pl_job_free(&j);
        return cli_report(&err);
    }
    tune_opts o;
    search_opts(a, model, &o);
    if (tune_strategy_parse(a->strategy, &o.strategy, &err)) {
        pl_job_free(&j);
        return cli_report(&err);
    }
    tune_stats s;
    rc = tune_run(&j, &o, &s, &err);
    int out = CLI_OK;
    if (rc) {
        out = err.code == TLM_ERUNTIME ? (fprintf(stderr, "tlm: %s\n", err.msg), CLI_FAIL)
                                       : cli_report(&err);
    } else {
        json_t *r = json_pack(
            "{s:s, s:s, s:s, s:o, s:o, s:o, s:i, s:i, s:i, s:s, s:s, s:s, s:o, s:f, s:f, s:i, s:o}",
            "workload_hash", j.whash, "target", t->name, "sketch", space_sketch_name(j.sp->sketch),
            "best_ms", ms(s.best_s), "default_ms", ms(s.default_s), "first_ms", ms(s.first_s),
            "trials", s.trials, "ok", s.ok, "rounds", s.rounds, "schedule", j.art.schedule,
            "schedule_source", pl_source_name(j.source), "strategy",
            o.strategy == TUNE_RANDOM ? "random" : "evolutionary", "speedup_vs_default",
            isfinite(s.default_s) && isfinite(s.best_s) ? json_real(s.default_s / s.best_s)
                                                        : json_null(),
            "elapsed_s", s.elapsed_s, "model_s", s.model_s, "records", ctx->stored, "best_at",
            best_at(&s));
        confirmed_json(r, s.confirmed, s.first_confirmed_s, s.confirmed_s);
        /* the starting point (first_ms is its time): the model's one pass or the default */
        char start[DRV_SCHED_MAX];
        if (j.n_cands > 0 && space_print(j.sp, &j.cands[0].sched, start, sizeof start) >= 0) {
            json_object_set_new(r, "start", json_string(from_tlm ? "tlm" : "default"));
            json_object_set_new(r, "start_schedule", json_string(start));
        }
        if (a->curve && write_curve(a->curve, s.best_curve, s.trials, &err)) out = cli_report(&err);
        if (out == CLI_OK) out = cli_print_json(r);
        json_decref(r);
    }
    tune_stats_free(&s);
    pl_job_free(&j);
    return out;
}

typedef struct {
    const fe_fused *fu;
    bool quiet;
} net_ctx;

static void on_task(int task, const tune_task *t, int total, void *user)
{
    net_ctx *c = user;
    if (c->quiet) return;
    fprintf(stderr, "tune: %d trials: task %d (%s, x%lld) trials %d best %.4f ms first %.4f ms\n",
            total, task, c->fu->sub[task].name, (long long)c->fu->sub[task].count, t->trials,
            isfinite(t->best_s) ? t->best_s * 1e3 : NAN,
            isfinite(t->first_s) ? t->first_s * 1e3 : NAN);
}

static int tune_network(const tune_args *a, const target *t, const tlm_model *model, tune_ctx *ctx)
{
    tlm_error err;
    tlm_err_clear(&err);
    fe_graph *g = NULL;
    fe_fused fu = {0};
    if (fe_zoo_build(a->model, &a->zo, &g, &err) || fe_fuse(g, &fu, &err)) {
        fe_graph_free(g);
        return cli_report(&err);
    }
    pl_job *jobs = calloc((size_t)fu.n, sizeof *jobs);
    tune_task *tasks = calloc((size_t)fu.n, sizeof *tasks);
    int rc = jobs && tasks ? 0 : tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
    int prepared = 0;
    for (int i = 0; i < fu.n && !rc; i++) {
        pl_opts po;
        job_opts(a, ctx, (uint64_t)i, false, &po);
        /* its weights measured as the plan runs them: packed once, outside the timing */
        po.mo.const_args = fu.sub[i].const_args;
        rc = pl_prepare(&jobs[i], &fu.sub[i].wl, t, &po, &err);
        prepared++;
        tasks[i].job = &jobs[i];
        /* the kernel's share of the model: launches (its time is what the search measures) */
        tasks[i].weight = (double)fu.sub[i].count;
    }
    tune_opts o;
    search_opts(a, model, &o);
    if (!rc) rc = tune_strategy_parse(a->strategy, &o.strategy, &err);
    net_ctx nc = {.fu = &fu, .quiet = a->quiet};
    double t0 = tlm_now_s();
    /* htam: one memory, the budget spread by the same task scheduler */
    htam_flags hf = {0};
    htam *hm = NULL;
    htam_result *hres = NULL;
    htam_store_io io = {.load = store_htam_load, .save = store_htam_save, .st = ctx->st};
    int out = CLI_OK;
    if (!rc && o.strategy == TUNE_HTAM) {
        out = htam_parse_flags(a, model, &hf);
        if (out) rc = TLM_EINVAL;
        for (int i = 0; i < fu.n && !rc; i++)
            rc = add_start(&jobs[i], model, hf.from_tlm, &err);
        hm = rc ? NULL : htam_new(t->kind);
        hres = rc ? NULL : calloc((size_t)fu.n, sizeof *hres);
        if (!rc && (!hm || !hres)) rc = tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
        if (!rc && ctx->st) rc = htam_load(hm, &io, &err);
        htam_opts ho;
        htam_fill_opts(a, &hf, (int)a->trials, &ho);
        if (!rc) rc = htam_tasks(hm, tasks, fu.n, &ho, 0, hres, on_task, &nc, &err);
        tlm_error se;
        if (hm && ctx->st && htam_save(hm, &io, &se)) fprintf(stderr, "tlm: htam: %s\n", se.msg);
    } else if (!rc) {
        bool from_tlm;
        out = parse_start(a, model, &from_tlm);
        if (out) rc = TLM_EINVAL;
        for (int i = 0; i < fu.n && !rc && from_tlm; i++)
            rc = add_start(&jobs[i], model, true, &err);
        if (!rc) rc = tune_tasks(tasks, fu.n, &o, on_task, &nc, &err);
    }
    if (out) {
        /* a usage error, reported already */
    } else if (rc) {
        out = err.code == TLM_ERUNTIME ? (fprintf(stderr, "tlm: %s\n", err.msg), CLI_FAIL)
                                       : cli_report(&err);
    } else {
        json_t *arr = json_array();
        double wb = 0, wf = 0;
        int total = 0;
        for (int i = 0; i < fu.n; i++) {
            const tune_task *tk = &tasks[i];
            total += tk->trials;
            wb += tk->weight * (isfinite(tk->best_s) ? tk->best_s : NAN);
            wf += tk->weight * (isfinite(tk->first_s) ? tk->first_s : NAN);
            json_array_append_new(arr, json_pack("{s:i, s:s, s:I, s:s, s:i, s:o, s:o, s:s}",
                                                 "index", i, "name", fu.sub[i].name, "occurrences",
                                                 (json_int_t)fu.sub[i].count, "workload_hash",
                                                 jobs[i].whash, "trials", tk->trials, "best_ms",
                                                 ms(tk->best_s), "first_ms", ms(tk->first_s),
                                                 "schedule", jobs[i].art.schedule));
            if (hres)
                json_object_set_new(json_array_get(arr, (size_t)i), "trajectory",
                                    htam_traj_json(hm, &jobs[i], &hres[i]));
        }
        json_t *r = json_pack("{s:s, s:s, s:i, s:i, s:o, s:o, s:f, s:i, s:o}", "model", a->model,
                              "target", t->name, "subgraphs", fu.n, "trials", total, "weighted_ms",
                              ms(wb), "weighted_first_ms", ms(wf), "elapsed_s", tlm_now_s() - t0,
                              "records", ctx->stored, "tasks", arr);
        if (hres) {
            json_object_set_new(r, "strategy", json_string("htam"));
            json_object_set_new(r, "memory", json_string(mem_names[hf.mem]));
            json_object_set_new(r, "regen", json_string(hf.regen ? "tlm" : "mutation"));
        }
        out = cli_print_json(r);
        json_decref(r);
    }
    for (int i = 0; hres && i < fu.n; i++)
        htam_result_free(&hres[i]);
    free(hres);
    htam_free(hm);
    for (int i = 0; i < prepared; i++)
        pl_job_free(&jobs[i]);
    free(jobs);
    free(tasks);
    fe_fused_free(&fu);
    fe_graph_free(g);
    return out;
}

static int run_tune(int argc, char **argv)
{
    tune_args a;
    tlm_error err;
    tlm_err_clear(&err);
    int prc = parse(argc, argv, &a, &err);
    if (prc) return prc < 0 ? CLI_OK : prc;
    target t;
    if (target_parse(a.tg, &t, &err)) return cli_report(&err);
    tune_strategy strat;
    if (tune_strategy_parse(a.strategy, &strat, &err)) {
        snprintf(err.field, sizeof err.field, "--strategy");
        return cli_report(&err);
    }
    tune_register();
    tlm_model *model = NULL;
    if (a.weights && cli_load_weights("--weights", a.weights, &model, &err))
        return cli_report(&err);
    tune_ctx ctx = {.quiet = a.quiet};
    if (a.store) {
        ctx.st = store_open(a.store, NULL, &err);
        if (!ctx.st) {
            err.code = TLM_EINVAL;
            snprintf(err.field, sizeof err.field, "--store");
            tlm_model_free(model);
            return cli_report(&err);
        }
    }
    int rc = !a.wl                ? tune_network(&a, &t, model, &ctx)
             : strat == TUNE_HTAM ? htam_one(&a, &t, model, &ctx)
                                  : tune_one(&a, &t, model, &ctx);
    store_close(ctx.st);
    tlm_model_free(model);
    return rc;
}

const cli_cmd cli_cmd_tune = {"tune", "measured search: tune one workload or a network", run_tune};
