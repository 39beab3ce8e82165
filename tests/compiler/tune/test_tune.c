/* test_tune.c — the measured search: legal mutation and crossover, features, the cost model,
 * a reproducible search loop (with a synthetic evaluator), the cost model beating random
 * sampling at equal trials, budgets and cancel, the task scheduler, and one real tune. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "compiler/tune/tune.h"

static target tgt(const char *name)
{
    target t;
    tlm_error e;
    cr_assert_eq(target_parse(name, &t, &e), 0, "%s", e.msg);
    return t;
}

static void dense(ir_workload *w, int64_t M, int64_t N, int64_t K)
{
    ir_workload_init(w, IR_OP_DENSE);
    w->shape[IR_DENSE_M] = M;
    w->shape[IR_DENSE_N] = N;
    w->shape[IR_DENSE_K] = K;
}

static void conv(ir_workload *w)
{
    ir_workload_init(w, IR_OP_CONV2D);
    w->shape[IR_CONV_N] = 1;
    w->shape[IR_CONV_C] = 16;
    w->shape[IR_CONV_H] = 14;
    w->shape[IR_CONV_W] = 14;
    w->shape[IR_CONV_F] = 32;
    w->shape[IR_CONV_KH] = 3;
    w->shape[IR_CONV_KW] = 3;
    w->pad[0] = w->pad[1] = 1;
}

static void softmax(ir_workload *w)
{
    ir_workload_init(w, IR_OP_SOFTMAX);
    w->shape[IR_ROW_R] = 64;
    w->shape[IR_ROW_C] = 1000;
}

static void prepare(pl_job *j, const ir_workload *w, const char *target_name)
{
    target t = tgt(target_name);
    pl_opts o;
    pl_opts_init(&o);
    o.measure = PL_MEASURE_OFF;
    tlm_error e;
    cr_assert_eq(pl_prepare(j, w, &t, &o, &e), 0, "%s: %s", e.field, e.msg);
}

Test(tune, mutation_and_crossover_stay_legal_on_every_sketch)
{
    ir_workload ws[5];
    dense(&ws[0], 197, 768, 64);
    conv(&ws[1]);
    softmax(&ws[2]);
    dense(&ws[3], 128, 128, 128);
    dense(&ws[4], 256, 200, 96);
    ws[4].dtype = IR_BFLOAT16; /* the tensor-core sketch */
    const char *targets[5] = {"cpu", "cpu:avx2", "cpu", "cuda:sm_80", "cuda:sm_90"};
    for (int k = 0; k < 5; k++) {
        pl_job j;
        prepare(&j, &ws[k], targets[k]);
        uint64_t rng = 7 + (uint64_t)k;
        space_sched a, b, c;
        space_sample(j.sp, &rng, &a);
        space_sample(j.sp, &rng, &b);
        int changed = 0;
        for (int i = 0; i < 300; i++) {
            tlm_error e;
            tune_mutate(j.sp, &a, &rng, &c);
            cr_assert_eq(space_check(j.sp, &c, &e), 0, "%s mutation %d: %s: %s", targets[k], i,
                         e.field, e.msg);
            changed += tune_sched_hash(&c) != tune_sched_hash(&a);
            tune_crossover(j.sp, &a, &b, &rng, &c);
            cr_assert_eq(space_check(j.sp, &c, &e), 0, "%s crossover %d: %s: %s", targets[k], i,
                         e.field, e.msg);
            /* every value of a crossover child comes from a parent unless legality forced it */
            a = (i & 1) ? c : a;
            space_sample(j.sp, &rng, &b);
        }
        cr_assert_gt(changed, 250, "%s: mutations rarely change anything (%d)", targets[k],
                     changed);
        pl_job_free(&j);
    }
}

Test(tune, features_have_a_fixed_length_per_space_and_are_finite)
{
    ir_workload w;
    conv(&w);
    pl_job j;
    prepare(&j, &w, "cpu");
    uint64_t rng = 3;
    float f[TUNE_MAX_FEATURES];
    space_sched s;
    space_default(j.sp, &s);
    int n0 = tune_features(j.sp, &s, f);
    cr_assert_gt(n0, j.sp->n_slot);
    cr_assert_leq(n0, TUNE_MAX_FEATURES);
    for (int i = 0; i < 50; i++) {
        space_sample(j.sp, &rng, &s);
        cr_assert_eq(tune_features(j.sp, &s, f), n0);
        for (int k = 0; k < n0; k++) cr_assert(isfinite(f[k]), "feature %d", k);
    }
    pl_job_free(&j);
}

Test(tune, the_cost_model_learns_a_ranking)
{
    /* y = a smooth function of two of 6 features; held-out rank agreement must be high */
    enum { N = 400, T = 200, F = 6 };
    float *x = malloc(sizeof(float) * (N + T) * F), y[N + T];
    uint64_t r = 12345;
    for (int i = 0; i < N + T; i++) {
        for (int k = 0; k < F; k++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            x[i * F + k] = (float)(r % 1000) / 100.0f;
        }
        float a = x[i * F + 1] - 4, b = x[i * F + 4] - 6;
        y[i] = 1.0f / (1.0f + 0.1f * (a * a + b * b));
    }
    tlm_error e;
    tune_cost *c = tune_cost_new(F, 1, &e);
    cr_assert(c);
    float p[T];
    cr_assert_eq(tune_cost_predict(c, x + N * F, T, p, &e), 0);
    cr_assert_eq(p[0], 0.0f, "untrained: 0");
    cr_assert_eq(tune_cost_fit(c, x, y, N, &e), 0, "%s", e.msg);
    cr_assert_eq(tune_cost_predict(c, x + N * F, T, p, &e), 0, "%s", e.msg);
    int agree = 0, pairs = 0;
    for (int i = 0; i < T; i++)
        for (int k = i + 1; k < T; k++) {
            float dy = y[N + i] - y[N + k], dp = p[i] - p[k];
            if (fabsf(dy) < 0.05f) continue;
            pairs++;
            agree += (dy > 0) == (dp > 0);
        }
    cr_assert_gt((double)agree / pairs, 0.85, "pairwise agreement %d/%d", agree, pairs);
    tune_cost_free(c);
    free(x);
}

/* A synthetic landscape over the real space: time grows with the distance of each decision
 * (log scale) from a hidden optimum, so some structure is learnable and the search is
 * deterministic and fast. */
typedef struct {
    space_sched opt;
    int calls, evaluated;
    uint64_t order_hash; /* of every candidate evaluated, in order */
    int fail_every;      /* every k-th candidate fails (0: none) */
    bool *cancel;
    int cancel_after;
    int lucky_at;        /* the lucky_at-th candidate's first measurement reads 10x fast */
    uint64_t lucky_hash; /* (set when it is drawn) */
    double lucky_scale;  /* how fast it reads (0: 0.1 of its time) */
} synth;

static double synth_time(const space *sp, const synth *s, const space_sched *c)
{
    double d = 0;
    for (int i = 0; i < sp->n_slot; i++) {
        double a = log2(1.0 + (double)c->v[i]), b = log2(1.0 + (double)s->opt.v[i]);
        d += (a - b) * (a - b);
    }
    return 1e-3 * (1.0 + d);
}

static int synth_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    synth *s = user;
    s->calls++;
    for (int k = 0; k < n; k++) {
        const space_sched *c = &j->cands[idx[k]].sched;
        cr_assert_eq(space_check(j->sp, c, err), 0, "illegal candidate: %s", err->msg);
        s->evaluated++;
        s->order_hash = s->order_hash * 1000003u ^ tune_sched_hash(c);
        secs[k] = s->fail_every && s->evaluated % s->fail_every == 0
                      ? INFINITY
                      : synth_time(j->sp, s, c);
        if (s->lucky_at && s->evaluated == s->lucky_at) {
            s->lucky_hash = tune_sched_hash(c);
            /* a lucky sample on a busy machine */
            secs[k] *= s->lucky_scale > 0 ? s->lucky_scale : 0.1;
        }
    }
    if (s->cancel && s->calls >= s->cancel_after) *s->cancel = true;
    return 0;
}

static void synth_opts(tune_opts *o, synth *s, int trials, uint64_t seed, tune_strategy st)
{
    tune_opts_init(o);
    o->trials = trials;
    o->seed = seed;
    o->strategy = st;
    o->batch = 8;
    o->eval = synth_eval;
    o->eval_user = s;
    o->confirm = 0;
}

static void synth_init(synth *s, const pl_job *j, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    uint64_t r = seed;
    space_sample(j->sp, &r, &s->opt);
}

Test(tune, the_search_is_reproducible_and_never_measures_twice)
{
    ir_workload w;
    dense(&w, 197, 256, 96);
    uint64_t h[3];
    for (int run = 0; run < 3; run++) {
        pl_job j;
        prepare(&j, &w, "cpu");
        synth s;
        synth_init(&s, &j, 5);
        tune_opts o;
        synth_opts(&o, &s, 40, run < 2 ? 11 : 12, TUNE_EVOLUTIONARY);
        tune_stats st;
        tlm_error e;
        cr_assert_eq(tune_run(&j, &o, &st, &e), 0, "%s", e.msg);
        cr_assert_eq(st.trials, 40);
        cr_assert_eq(s.evaluated, 40);
        cr_assert_eq(st.rounds, 5);
        /* the default was tried first: the starting point */
        cr_assert_eq(j.cands[0].source, PL_SRC_DEFAULT);
        cr_assert_eq(st.first_s, st.default_s);
        space_sched d;
        space_default(j.sp, &d);
        cr_assert_eq(tune_sched_hash(&j.cands[0].sched), tune_sched_hash(&d));
        /* no schedule twice */
        for (int a = 0; a < j.n_cands; a++)
            for (int b = a + 1; b < j.n_cands; b++)
                cr_assert_neq(tune_sched_hash(&j.cands[a].sched), tune_sched_hash(&j.cands[b].sched),
                              "candidates %d and %d are the same", a, b);
        /* the best is the minimum, and the curve is monotone */
        double mn = INFINITY;
        for (int a = 0; a < j.n_cands; a++) mn = fmin(mn, synth_time(j.sp, &s, &j.cands[a].sched));
        cr_assert_float_eq(st.best_s, mn, 1e-12);
        for (int t = 1; t < st.trials; t++) cr_assert_leq(st.best_curve[t], st.best_curve[t - 1]);
        h[run] = s.order_hash;
        tune_stats_free(&st);
        pl_job_free(&j);
    }
    cr_assert_eq(h[0], h[1], "same seed, same measurements: same candidates");
    cr_assert_neq(h[0], h[2], "another seed: another search");
}

Test(tune, the_cost_model_beats_random_sampling_at_equal_trials)
{
    /* over several landscapes: mean log best-time of the evolutionary search is lower */
    ir_workload w;
    dense(&w, 512, 384, 256);
    double lg_evo = 0, lg_rnd = 0;
    int wins = 0;
    const int R = 5;
    for (int r = 0; r < R; r++) {
        double best[2];
        for (int strat = 0; strat < 2; strat++) {
            pl_job j;
            prepare(&j, &w, "cpu");
            synth s;
            synth_init(&s, &j, 100 + (uint64_t)r);
            tune_opts o;
            synth_opts(&o, &s, 96, 1 + (uint64_t)r, strat ? TUNE_RANDOM : TUNE_EVOLUTIONARY);
            tune_stats st;
            tlm_error e;
            cr_assert_eq(tune_run(&j, &o, &st, &e), 0, "%s", e.msg);
            best[strat] = st.best_s;
            tune_stats_free(&st);
            pl_job_free(&j);
        }
        lg_evo += log(best[0]);
        lg_rnd += log(best[1]);
        wins += best[0] < best[1];
    }
    cr_log_info("geomean best: evolutionary %g, random %g, wins %d", exp(lg_evo / R), exp(lg_rnd / R), wins);
    cr_assert_lt(lg_evo, lg_rnd, "geomean best: evolutionary %g, random %g", exp(lg_evo / R),
                 exp(lg_rnd / R));
    cr_assert_geq(wins, 3, "evolutionary won %d of %d landscapes", wins, R);
}

Test(tune, failures_score_zero_and_cancel_stops_between_rounds)
{
    ir_workload w;
    dense(&w, 64, 64, 64);
    pl_job j;
    prepare(&j, &w, "cpu");
    bool cancel = false;
    j.o.cancel = &cancel;
    synth s;
    synth_init(&s, &j, 9);
    s.fail_every = 3;
    s.cancel = &cancel;
    s.cancel_after = 2;
    tune_opts o;
    synth_opts(&o, &s, 1000, 1, TUNE_EVOLUTIONARY);
    tune_stats st;
    tlm_error e;
    cr_assert_eq(tune_run(&j, &o, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(st.rounds, 2, "cancelled after the second round");
    cr_assert_eq(st.trials, 16);
    cr_assert_eq(st.ok, 16 - 16 / 3);
    cr_assert(isfinite(st.best_s));
    tune_stats_free(&st);
    pl_job_free(&j);

    /* nothing correct: a clear failure */
    prepare(&j, &w, "cpu");
    synth_init(&s, &j, 9);
    s.fail_every = 1;
    j.o.mode = PL_MODE_TUNE;
    synth_opts(&o, &s, 8, 1, TUNE_EVOLUTIONARY);
    cr_assert_eq(tune_run(&j, &o, &st, &e), TLM_ERUNTIME);
    tune_stats_free(&st);
    pl_job_free(&j);

    cr_assert_eq(tune_strategy_parse("annealing", &o.strategy, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "strategy");
}

/* A dense job on a landscape (seed 5) whose lucky_at-th measurement reads fast. */
static void lucky_job(pl_job *j, synth *s, int lucky_at)
{
    ir_workload w;
    dense(&w, 197, 256, 96);
    prepare(j, &w, "cpu");
    synth_init(s, j, 5);
    s->lucky_at = lucky_at;
}

/* Fixed second-look times per candidate index (user: the double[4] table). */
static int fixed_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    (void)j, (void)err;
    const double *t = user;
    for (int k = 0; k < n; k++) secs[k] = t[idx[k]];
    return 0;
}

/* The second look's winner must beat the starting point by more than TUNE_CONFIRM_MARGIN: a
 * candidate 1 % faster than the start leaves the start chosen, one 10 % faster wins; without a
 * start the fastest wins however close. */
Test(tune, a_second_look_tie_keeps_the_start)
{
    pl_job j;
    ir_workload w;
    dense(&w, 64, 64, 64);
    prepare(&j, &w, "cpu");
    double times[4] = {1.00, 0.99, 1.20, 0.90};
    tune_confirmed c;
    tlm_error e;
    bool won;
    int near[2] = {1, 2};
    cr_assert_eq(tune_confirm(&j, near, 2, 0, 3, fixed_eval, times, &won, &c, &e), 0, "%s", e.msg);
    cr_assert(won);
    cr_expect_eq(c.best_cand, 0, "a 1 %% gain is within the margin: the start stays (got %d)",
                 c.best_cand);
    cr_expect_float_eq(c.confirmed_s, 1.00, 1e-12);
    cr_expect_float_eq(c.first_confirmed_s, 1.00, 1e-12);
    int far[2] = {3, 1};
    cr_assert_eq(tune_confirm(&j, far, 2, 0, 3, fixed_eval, times, &won, &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.best_cand, 3, "a 10 %% gain wins (got %d)", c.best_cand);
    cr_assert_eq(tune_confirm(&j, near, 2, -1, 3, fixed_eval, times, &won, &c, &e), 0, "%s", e.msg);
    cr_expect_eq(c.best_cand, 1, "no start: the fastest (got %d)", c.best_cand);
    pl_job_free(&j);
}

Test(tune, a_second_look_at_the_best_overrules_a_lucky_measurement)
{
    pl_job j;
    synth s;
    lucky_job(&j, &s, 20);
    tune_opts o;
    synth_opts(&o, &s, 32, 2, TUNE_EVOLUTIONARY);
    o.confirm = 3;
    tune_stats st;
    tlm_error e;
    cr_assert_eq(tune_run(&j, &o, &st, &e), 0, "%s", e.msg);
    cr_assert_eq(st.trials, 32);
    /* the top 3 and the starting point (unless it is among them), three rounds each */
    cr_assert(st.confirmed == 3 || st.confirmed == 4, "%d", st.confirmed);
    cr_assert_eq(s.evaluated, 32 + 3 * st.confirmed);
    cr_assert(isfinite(st.first_confirmed_s));
    cr_assert_float_eq(st.first_confirmed_s, synth_time(j.sp, &s, &j.cands[0].sched), 1e-12,
                       "the starting point's time in the second look");
    /* the lucky one led the search, the second look found it out */
    double truth = INFINITY;
    for (int a = 0; a < j.n_cands; a++) truth = fmin(truth, synth_time(j.sp, &s, &j.cands[a].sched));
    cr_assert_float_eq(st.confirmed_s, synth_time(j.sp, &s, &j.cands[st.best_cand].sched), 1e-12);
    cr_assert_float_eq(st.confirmed_s, truth, 1e-12, "the true best of what was measured");
    cr_assert_neq(tune_sched_hash(&j.cands[st.best_cand].sched), s.lucky_hash);
    tune_stats_free(&st);
    pl_job_free(&j);
}

/* An evaluator whose times drift by round, in the order it was called: a candidate measured
 * first in a round is slow (cold), so a fixed order would always favour the others. */
typedef struct {
    int calls, repeats_seen;
    int order[8][4];
    double base[4];
} drift;

static int drift_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    (void)err;
    drift *d = user;
    d->repeats_seen = j->o.mo.repeats;
    for (int k = 0; k < n; k++) {
        d->order[d->calls][k] = idx[k];
        secs[k] = d->base[idx[k]] * (k == 0 ? 3.0 : 1.0);
    }
    d->calls++;
    return 0;
}

Test(tune, the_second_look_rotates_its_order_and_takes_medians)
{
    ir_workload w;
    dense(&w, 64, 64, 64);
    pl_job j;
    prepare(&j, &w, "cpu");
    drift d = {.base = {1.0, 1.1, 0.9, INFINITY}};
    int idx[3] = {0, 1, 2};
    j.o.mo.repeats = 2; /* the search's short protocol */
    j.o.mo.min_sample_s = 1e-5;
    const measure_opts mo = j.o.mo;
    double secs[3];
    tlm_error e;
    cr_assert_eq(tune_second_look(&j, idx, 3, 3, drift_eval, &d, secs, &e), 0, "%s", e.msg);
    cr_assert_eq(d.calls, 3);
    cr_assert_geq(d.repeats_seen, 7, "measured with the full protocol");
    for (int r = 0; r < 3; r++) cr_assert_eq(d.order[r][0], r, "round %d starts with %d", r, r);
    /* each ran first (3x slow) once: the median is its true time */
    cr_assert_float_eq(secs[0], 1.0, 1e-12);
    cr_assert_float_eq(secs[1], 1.1, 1e-12);
    cr_assert_float_eq(secs[2], 0.9, 1e-12);
    /* a candidate failing in any round is out */
    int idx2[2] = {2, 3};
    d.calls = 0;
    cr_assert_eq(tune_second_look(&j, idx2, 2, 2, drift_eval, &d, secs, &e), 0, "%s", e.msg);
    cr_assert_eq(d.calls, 2);
    cr_assert_float_eq(secs[0], 0.5 * (0.9 * 3 + 0.9), 1e-12, "two rounds: the mean of both");
    cr_assert(isinf(secs[1]));
    /* the job's own protocol is restored afterwards */
    cr_assert_eq(j.o.mo.repeats, mo.repeats);
    cr_assert_eq(j.o.mo.min_sample_s, mo.min_sample_s);
    pl_job_free(&j);
}

Test(tune, the_second_look_keeps_the_start_when_the_rest_only_got_lucky)
{
    pl_job j;
    synth s;
    lucky_job(&j, &s, 5);
    /* the hidden optimum is the default, the first candidate the search measures */
    space_default(j.sp, &s.opt);
    s.lucky_scale = 1e-3; /* reads faster than the optimum */
    tune_opts o;
    synth_opts(&o, &s, 16, 2, TUNE_EVOLUTIONARY);
    o.confirm = 1;
    o.confirm_rounds = 1;
    tune_stats st;
    tlm_error e;
    cr_assert_eq(tune_run(&j, &o, &st, &e), 0, "%s", e.msg);
    space_sched d;
    space_default(j.sp, &d);
    cr_assert_eq(tune_sched_hash(&j.cands[0].sched), tune_sched_hash(&d), "starts at the default");
    /* the lucky one led the search; it and the start were measured again */
    cr_assert_eq(st.confirmed, 2);
    cr_assert_eq(s.evaluated, 16 + 2);
    cr_assert_eq(st.best_cand, 0, "the start wins the second look");
    cr_assert_float_eq(st.confirmed_s, st.first_confirmed_s, 1e-12);
    tune_stats_free(&st);
    pl_job_free(&j);
}

static void task_progress(int task, const tune_task *t, int total, void *user)
{
    int *calls = user;
    calls[task]++;
}

/* tune_tasks gives every task the same evaluator: this one routes each job to its own
 * landscape */
static pl_job *route_job[3];
static synth *route_synth;

static int route_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    for (int i = 0; i < 3; i++)
        if (route_job[i] == j) return synth_eval(j, idx, n, secs, &route_synth[i], err);
    cr_assert_fail("a job the scheduler was not given");
    return TLM_EINVAL;
}

Test(tune, the_task_scheduler_spends_where_the_weight_is)
{
    ir_workload w[3];
    dense(&w[0], 256, 256, 256);
    dense(&w[1], 64, 64, 64);
    conv(&w[2]);
    pl_job j[3];
    synth s[3];
    tune_task tasks[3];
    double weight[3] = {20, 1, 1};
    for (int i = 0; i < 3; i++) {
        prepare(&j[i], &w[i], "cpu");
        j[i].o.mode = PL_MODE_TUNE;
        synth_init(&s[i], &j[i], 40 + (uint64_t)i);
        tasks[i] = (tune_task){.job = &j[i], .weight = weight[i]};
        route_job[i] = &j[i];
    }
    route_synth = s;
    tune_opts o;
    synth_opts(&o, &s[0], 160, 3, TUNE_EVOLUTIONARY);
    o.eval = route_eval;
    o.eval_user = NULL;
    int calls[3] = {0};
    tlm_error e;
    cr_assert_eq(tune_tasks(tasks, 3, &o, task_progress, calls, &e), 0, "%s", e.msg);
    int total = tasks[0].trials + tasks[1].trials + tasks[2].trials;
    cr_assert_eq(total, 160);
    for (int i = 0; i < 3; i++) {
        cr_assert_geq(calls[i], 1, "task %d got a first round", i);
        cr_assert_geq(j[i].chosen, 0, "task %d chose a kernel", i);
        cr_assert_eq(j[i].source, PL_SRC_TUNED);
        cr_assert(j[i].art.binary);
    }
    cr_assert_gt(tasks[0].trials, tasks[1].trials + tasks[2].trials,
                 "the heavy task got %d trials, the others %d and %d", tasks[0].trials,
                 tasks[1].trials, tasks[2].trials);
    for (int i = 0; i < 3; i++) pl_job_free(&j[i]);
}

Test(tune, a_real_tune_builds_measures_records_and_chooses, .timeout = 600)
{
    ir_workload w;
    dense(&w, 33, 40, 24);
    target t = tgt("cpu");
    pl_opts po;
    pl_opts_init(&po);
    po.mode = PL_MODE_TUNE;
    po.trials = 6;
    po.seed = 4;
    tune_register();
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_run(&j, &w, &t, &po, &e), 0, "%s", e.msg);
    cr_assert_eq(j.source, PL_SRC_TUNED);
    cr_assert_str_eq(j.selection, "tuned");
    cr_assert(j.measured);
    cr_assert(j.art.binary && j.art.binary_size > 0);
    int stored = 0, ok = 0;
    for (int i = 0; i < j.n_recs; i++) {
        if (!pl_record_storable(&j.recs[i])) continue;
        stored++;
        ok += !strcmp(j.recs[i].status, "ok");
    }
    /* one record per trial, and the second look at the top 3 and the start (unless among
     * them), three rounds each */
    int looked = (stored - 6) / 3;
    cr_assert(looked == 3 || looked == 4, "%d records", stored);
    cr_assert_eq(stored, 6 + 3 * looked);
    cr_assert_eq(ok, stored, "every candidate of this small dense is correct");
    /* the chosen one has the fastest median of the second look (its last 3 x looked
     * measurements; the record after them is the rebuild of the winner, not a measurement) */
    int cands[4], nc = 0, seen = 0;
    double t3[4][3] = {{0}};
    for (int i = j.n_recs - 1; i >= 0 && seen < 3 * looked; i--) {
        if (!pl_record_storable(&j.recs[i])) continue;
        seen++;
        int c = 0;
        while (c < nc && cands[c] != j.recs[i].cand) c++;
        if (c == nc) cands[nc++] = j.recs[i].cand;
        cr_assert_leq(c, 3);
        cr_assert_eq(t3[c][(seen - 1) / looked], 0.0, "one measurement per round");
        t3[c][(seen - 1) / looked] = j.recs[i].median_s; /* rounds counted from the last */
    }
    cr_assert_eq(nc, looked, "each candidate of the second look measured in every round");
    int chosen = -1;
    double med[4];
    for (int c = 0; c < nc; c++) {
        double a = t3[c][0], b2 = t3[c][1], d = t3[c][2];
        med[c] = fmax(fmin(a, b2), fmin(fmax(a, b2), d));
        if (cands[c] == j.chosen) chosen = c;
    }
    cr_assert_geq(chosen, 0, "the chosen one was in the second look");
    cr_assert_float_eq(j.chosen_mr.median_s, med[chosen], 1e-15, "served with its median");
    for (int c = 0; c < nc; c++) cr_assert_leq(med[chosen], med[c]);
    pl_job_free(&j);

    /* a CUDA target cannot be tuned on a machine that runs no GPU kernels */
    target gpu = tgt("cuda:sm_80");
    cr_assert_eq(pl_prepare(&j, &w, &gpu, &po, &e), TLM_EUNSUPPORTED);
    cr_assert_str_eq(e.field, "mode");
    pl_job_free(&j);
}
