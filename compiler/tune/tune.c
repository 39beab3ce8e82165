/* tune.c — the evolutionary search loop and the task scheduler (see tune.h). */
#include "compiler/tune/tune.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/tlm/select.h"
#include "compiler/tune/htam.h"
#include "compiler/util/util.h"

static tune_eval_fn default_eval;
static void *default_eval_user;

void tune_set_default_eval(tune_eval_fn fn, void *user)
{
    default_eval = fn;
    default_eval_user = user;
}

void tune_opts_init(tune_opts *o)
{
    memset(o, 0, sizeof *o);
    o->trials = 64;
    o->seed = 1;
    o->strategy = TUNE_EVOLUTIONARY;
    o->batch = 16;
    o->population = 128;
    o->generations = 4;
    o->eps = 0.1;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    o->build_threads = cpus < 1 ? 1 : cpus > 8 ? 8 : (int)cpus;
    o->beam = 8;
    o->confirm = 3;
    o->confirm_rounds = 3;
    o->eval = default_eval;
    o->eval_user = default_eval_user;
}

int tune_strategy_parse(const char *name, tune_strategy *out, tlm_error *err)
{
    if (!name || !*name || !strcmp(name, "evolutionary")) {
        *out = TUNE_EVOLUTIONARY;
        return 0;
    }
    if (!strcmp(name, "random")) {
        *out = TUNE_RANDOM;
        return 0;
    }
    if (!strcmp(name, "htam")) {
        *out = TUNE_HTAM;
        return 0;
    }
    return tlm_err_set(err, TLM_EINVAL, "strategy",
                       "unknown strategy \"%s\"; allowed: evolutionary, random, htam", name);
}

void tune_stats_free(tune_stats *s)
{
    if (!s) return;
    free(s->best_curve);
    s->best_curve = NULL;
}

/* ---- the search state of one job ---- */

typedef struct {
    pl_job *j;
    tune_opts o;
    uint64_t rng;
    tune_cost *cost;
    int nf;
    float *x;      /* measured rows, nf floats each */
    double *secs;  /* their times (INFINITY: failed) */
    int *cand;     /* their candidate indices */
    int n, cap;
    uint64_t *seen; /* open-addressing set of schedule hashes tried */
    int n_seen, cap_seen;
    tune_stats st;
    int curve_cap;
    double t0;
    double per_trial_s; /* running estimate, for the time budget */
    int64_t *vals;
} tstate;

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static double unit(uint64_t *s)
{
    return (double)(rnd(s) >> 11) * 0x1.0p-53;
}

static bool seen_has(const tstate *t, uint64_t h)
{
    if (!t->cap_seen) return false;
    for (int i = (int)(h % (uint64_t)t->cap_seen);; i = (i + 1) % t->cap_seen) {
        if (t->seen[i] == 0) return false;
        if (t->seen[i] == h) return true;
    }
}

static int seen_add(tstate *t, uint64_t h)
{
    if (h == 0) h = 1;
    if (2 * (t->n_seen + 1) > t->cap_seen) {
        int cap = t->cap_seen ? 2 * t->cap_seen : 1024;
        uint64_t *s = calloc((size_t)cap, sizeof *s);
        if (!s) return TLM_ENOMEM;
        for (int i = 0; i < t->cap_seen; i++)
            if (t->seen[i]) {
                int k = (int)(t->seen[i] % (uint64_t)cap);
                while (s[k]) k = (k + 1) % cap;
                s[k] = t->seen[i];
            }
        free(t->seen);
        t->seen = s;
        t->cap_seen = cap;
    }
    int k = (int)(h % (uint64_t)t->cap_seen);
    while (t->seen[k] && t->seen[k] != h) k = (k + 1) % t->cap_seen;
    if (!t->seen[k]) {
        t->seen[k] = h;
        t->n_seen++;
    }
    return 0;
}

static uint64_t shash(const space_sched *s)
{
    uint64_t h = tune_sched_hash(s);
    return h ? h : 1;
}

/* The default evaluator: build in parallel, measure one at a time. */
static int eval_build_measure(pl_job *j, const int *idx, int n, double *secs, void *user,
                              tlm_error *err)
{
    const tune_opts *o = user;
    int *rec = malloc((size_t)n * sizeof *rec);
    if (!rec) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = pl_evaluate_batch(j, idx, n, true, o->build_threads, rec, err);
    for (int k = 0; k < n; k++) {
        const pl_record *r = rc ? NULL : &j->recs[rec[k]];
        secs[k] = r && pl_record_timed(r) ? r->median_s : INFINITY;
    }
    free(rec);
    return rc;
}

static void state_free(tstate *t)
{
    tune_cost_free(t->cost);
    free(t->x);
    free(t->secs);
    free(t->cand);
    free(t->seen);
    free(t->vals);
    tune_stats_free(&t->st);
}

static int state_init(tstate *t, pl_job *j, const tune_opts *o, tlm_error *err)
{
    memset(t, 0, sizeof *t);
    t->j = j;
    t->o = *o;
    if (o->strategy == TUNE_HTAM)
        return tlm_err_set(err, TLM_EINVAL, "strategy",
                           "htam refines one kernel (htam_run); it is not a tune_run strategy");
    if (t->o.trials < 1)
        return tlm_err_set(err, TLM_EINVAL, "budget.trials", "trials must be at least 1");
    if (t->o.batch < 1) t->o.batch = 16;
    if (t->o.population < 8) t->o.population = 8;
    if (t->o.generations < 1) t->o.generations = 1;
    if (t->o.build_threads < 1) t->o.build_threads = 1;
    if (t->o.eps < 0 || t->o.eps > 1) t->o.eps = 0.1;
    if (!t->o.eval) {
        t->o.eval = eval_build_measure;
        t->o.eval_user = &t->o;
    }
    t->rng = o->seed ? o->seed : 1;
    for (int i = 0; i < 4; i++) rnd(&t->rng);
    float f[TUNE_MAX_FEATURES];
    space_sched s0;
    space_default(j->sp, &s0);
    t->nf = tune_features(j->sp, &s0, f);
    t->vals = malloc(SPACE_MAX_VALUES * sizeof *t->vals);
    if (!t->vals) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    if (t->o.strategy == TUNE_EVOLUTIONARY) {
        t->cost = tune_cost_new(t->nf, t->rng, err);
        if (!t->cost) return TLM_ENOMEM;
    }
    t->st.best_s = INFINITY;
    t->st.confirmed_s = NAN;
    t->st.first_confirmed_s = NAN;
    t->st.first_s = NAN;
    t->st.default_s = NAN;
    t->st.best_cand = -1;
    t->t0 = tlm_now_s();
    return 0;
}

static bool out_of_time(const tstate *t)
{
    if (t->j->o.cancel && __atomic_load_n(t->j->o.cancel, __ATOMIC_ACQUIRE)) return true;
    return t->o.seconds > 0 && tlm_now_s() - t->t0 >= t->o.seconds;
}

/* Appends a measured row. */
static int add_row(tstate *t, int cand, double secs)
{
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 64;
        float *x = realloc(t->x, (size_t)cap * (size_t)t->nf * sizeof *x);
        if (x) t->x = x;
        double *s = realloc(t->secs, (size_t)cap * sizeof *s);
        if (s) t->secs = s;
        int *c = realloc(t->cand, (size_t)cap * sizeof *c);
        if (c) t->cand = c;
        if (!x || !s || !c) return TLM_ENOMEM;
        t->cap = cap;
    }
    tune_features(t->j->sp, &t->j->cands[cand].sched, t->x + (size_t)t->n * (size_t)t->nf);
    t->secs[t->n] = secs;
    t->cand[t->n] = cand;
    t->n++;
    if (t->st.trials >= t->curve_cap) {
        int cap = t->curve_cap ? 2 * t->curve_cap : 64;
        double *c = realloc(t->st.best_curve, (size_t)cap * sizeof *c);
        if (!c) return TLM_ENOMEM;
        t->st.best_curve = c;
        t->curve_cap = cap;
    }
    if (t->st.trials == 0) t->st.first_s = secs;
    if (t->j->cands[cand].source == PL_SRC_DEFAULT && isnan(t->st.default_s))
        t->st.default_s = secs;
    if (isfinite(secs)) {
        t->st.ok++;
        if (secs < t->st.best_s) {
            t->st.best_s = secs;
            t->st.best_cand = cand;
        }
    }
    t->st.best_curve[t->st.trials++] = t->st.best_s;
    return 0;
}

static int retrain(tstate *t, tlm_error *err)
{
    if (!t->cost || t->n < TUNE_MIN_TRAIN || !isfinite(t->st.best_s)) return 0;
    double t0 = tlm_now_s();
    float *y = malloc((size_t)t->n * sizeof *y);
    if (!y) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    for (int i = 0; i < t->n; i++)
        y[i] = isfinite(t->secs[i]) ? (float)(t->st.best_s / t->secs[i]) : 0.0f;
    int rc = tune_cost_fit(t->cost, t->x, y, t->n, err);
    free(y);
    t->st.model_s += tlm_now_s() - t0;
    return rc;
}

/* The search's progress, through j->o.progress. */
static void report(tstate *t, const char *phase)
{
    pl_job *j = t->j;
    if (!j->o.progress) return;
    pl_progress p = {.trials = t->st.trials,
                     .trials_budget = t->o.trials,
                     .elapsed_s = tlm_now_s() - t->t0,
                     .best_s = t->st.best_s,
                     .first_s = t->st.first_s,
                     .best_cand = t->st.best_cand,
                     .round = t->st.rounds,
                     .phase = phase};
    j->o.progress(j, &p, j->o.user);
}

/* A list of schedules with scores. */
typedef struct {
    space_sched *s;
    float *score;
    int n, cap;
} slist;

static int slist_add(slist *l, const space_sched *s)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 128;
        space_sched *ns = realloc(l->s, (size_t)cap * sizeof *ns);
        if (ns) l->s = ns;
        float *sc = realloc(l->score, (size_t)cap * sizeof *sc);
        if (sc) l->score = sc;
        if (!ns || !sc) return TLM_ENOMEM;
        l->cap = cap;
    }
    l->s[l->n] = *s;
    l->score[l->n] = 0;
    l->n++;
    return 0;
}

static void slist_free(slist *l)
{
    free(l->s);
    free(l->score);
    memset(l, 0, sizeof *l);
}

static int score_all(tstate *t, slist *l, tlm_error *err)
{
    if (!t->cost || l->n == 0) return 0;
    double t0 = tlm_now_s();
    float *x = malloc((size_t)l->n * (size_t)t->nf * sizeof *x);
    if (!x) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    for (int i = 0; i < l->n; i++) tune_features(t->j->sp, &l->s[i], x + (size_t)i * (size_t)t->nf);
    int rc = tune_cost_predict(t->cost, x, l->n, l->score, err);
    free(x);
    t->st.model_s += tlm_now_s() - t0;
    return rc;
}

/* Roulette choice by score (scores clamped at a small floor so every member can be drawn). */
static int roulette(const slist *l, uint64_t *rng)
{
    double tot = 0;
    for (int i = 0; i < l->n; i++) tot += l->score[i] > 1e-3f ? l->score[i] : 1e-3;
    double r = unit(rng) * tot;
    for (int i = 0; i < l->n; i++) {
        r -= l->score[i] > 1e-3f ? l->score[i] : 1e-3;
        if (r <= 0) return i;
    }
    return l->n - 1;
}

static int cmp_desc(const void *a, const void *b, void *ctx)
{
    const float *sc = ctx;
    float x = sc[*(const int *)a], y = sc[*(const int *)b];
    if (x != y) return x > y ? -1 : 1;
    return *(const int *)a - *(const int *)b; /* stable: reproducible */
}

static int cmp_secs(const void *a, const void *b, void *ctx)
{
    const double *s = ctx;
    double x = s[*(const int *)a], y = s[*(const int *)b];
    if (x != y) return x < y ? -1 : 1;
    return *(const int *)a - *(const int *)b;
}

/* Evolves a population with the cost model and appends up to `want` schedules not tried
 * yet to out, best predicted first. */
static int evolve(tstate *t, int want, slist *out, tlm_error *err)
{
    const space *sp = t->j->sp;
    slist pop = {0}, next = {0}, pool = {0};
    int rc = 0;
    /* the best measured so far seed the population, uniform samples fill it */
    int *ord = malloc((size_t)(t->n > 0 ? t->n : 1) * sizeof *ord);
    if (!ord) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    for (int i = 0; i < t->n; i++) ord[i] = i;
    qsort_r(ord, (size_t)t->n, sizeof *ord, cmp_secs, t->secs);
    int elite = t->o.population / 4;
    for (int i = 0; i < t->n && i < elite && !rc; i++)
        if (isfinite(t->secs[ord[i]])) rc = slist_add(&pop, &t->j->cands[t->cand[ord[i]]].sched);
    free(ord);
    while (!rc && pop.n < t->o.population) {
        space_sched s;
        space_sample(sp, &t->rng, &s);
        rc = slist_add(&pop, &s);
    }
    for (int g = 0; g < t->o.generations && !rc; g++) {
        rc = score_all(t, &pop, err);
        if (rc) break;
        next.n = 0;
        while (!rc && next.n < t->o.population) {
            space_sched child;
            int a = roulette(&pop, &t->rng);
            if (unit(&t->rng) < 0.85) {
                tune_mutate(sp, &pop.s[a], &t->rng, &child);
            } else {
                int b = roulette(&pop, &t->rng);
                tune_crossover(sp, &pop.s[a], &pop.s[b], &t->rng, &child);
            }
            rc = slist_add(&next, &child);
        }
        slist tmp = pop;
        pop = next;
        next = tmp;
        /* every new schedule of this generation is a candidate for the batch */
        for (int i = 0; i < pop.n && !rc; i++)
            if (!seen_has(t, shash(&pop.s[i]))) rc = slist_add(&pool, &pop.s[i]);
    }
    if (!rc) rc = score_all(t, &pool, err);
    if (!rc && pool.n) {
        int *idx = malloc((size_t)pool.n * sizeof *idx);
        if (!idx) rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        for (int i = 0; idx && i < pool.n; i++) idx[i] = i;
        if (idx) qsort_r(idx, (size_t)pool.n, sizeof *idx, cmp_desc, pool.score);
        int taken = 0;
        for (int i = 0; idx && i < pool.n && taken < want && !rc; i++) {
            const space_sched *s = &pool.s[idx[i]];
            uint64_t h = shash(s);
            bool dup = false;
            for (int k = 0; k < out->n && !dup; k++) dup = shash(&out->s[k]) == h;
            if (dup || seen_has(t, h)) continue;
            rc = slist_add(out, s);
            taken++;
        }
        free(idx);
    }
    slist_free(&pop);
    slist_free(&next);
    slist_free(&pool);
    return rc;
}

/* Adds n uniform samples not tried yet (fewer when the space runs out). */
static int add_samples(tstate *t, int n, slist *out)
{
    int rc = 0;
    for (int tries = 0; out->n < n && tries < 50 * n + 100 && !rc; tries++) {
        space_sched s;
        space_sample(t->j->sp, &t->rng, &s);
        uint64_t h = shash(&s);
        bool dup = seen_has(t, h);
        for (int k = 0; k < out->n && !dup; k++) dup = shash(&out->s[k]) == h;
        if (!dup) rc = slist_add(out, &s);
    }
    return rc;
}

/* One round: choose up to `budget` candidates, evaluate them, learn. Returns the number
 * tried (0: the space has nothing new), or a negative code. */
static int round_run(tstate *t, int budget, tlm_error *err)
{
    pl_job *j = t->j;
    int B = budget < t->o.batch ? budget : t->o.batch;
    if (t->o.seconds > 0 && t->per_trial_s > 0) {
        double left = t->o.seconds - (tlm_now_s() - t->t0);
        int fit = (int)(left / t->per_trial_s);
        if (fit < B) B = fit > 1 ? fit : 1;
    }
    if (B < 1) return 0;
    int first_cand = j->n_cands;
    int rc = 0;
    slist pick = {0};
    if (t->st.rounds == 0) {
        /* the starting points: candidates already in the job (the default, a given list), the
         * rule of thumb, the model's beam */
        for (int i = 0; i < j->n_cands && pick.n < B && !rc; i++)
            rc = slist_add(&pick, &j->cands[i].sched);
        first_cand = 0;
        space_sched d;
        space_default(j->sp, &d);
        bool have = false;
        for (int i = 0; i < pick.n; i++) have = have || shash(&pick.s[i]) == shash(&d);
        if (!have && pick.n < B && !rc) {
            rc = pl_add_candidate(j, &d, PL_SRC_DEFAULT, NAN, err);
            if (!rc) rc = slist_add(&pick, &d);
        }
        if (t->o.model && pick.n < B && !rc) {
            int k = t->o.beam < B - pick.n ? t->o.beam : B - pick.n;
            tlm_candidate *c = calloc((size_t)(k > 0 ? k : 1), sizeof *c);
            int nc = 0;
            tlm_error me;
            if (c && k > 0 && tlm_select_generate(t->o.model, j->sp, k, c, &nc, &me) == 0)
                for (int i = 0; i < nc && !rc; i++) {
                    uint64_t h = shash(&c[i].sched);
                    bool dup = false;
                    for (int q = 0; q < pick.n && !dup; q++) dup = shash(&pick.s[q]) == h;
                    if (dup) continue;
                    rc = pl_add_candidate(j, &c[i].sched, PL_SRC_TLM, c[i].score, err);
                    if (!rc) rc = slist_add(&pick, &c[i].sched);
                }
            free(c);
        }
        /* structured variants of the rule of thumb: along every other vector axis, and
         * with packing toggled (what the default's model is least sure about) */
        int base = pick.n;
        if (!rc && (j->sp->sketch == SKETCH_CPU_TILE || j->sp->sketch == SKETCH_CPU_WINDOW) &&
            j->sp->n_slot &&
            j->sp->slot[0].kind == SLOT_VECTORIZE) {
            space_sched none;
            memset(&none, 0, sizeof none);
            int nv = space_legal_values(j->sp, 0, &none, t->vals);
            int64_t cur = space_get(j->sp, &d, SLOT_VECTORIZE, 1);
            int64_t axes[16];
            int na = 0;
            for (int k = 0; k < nv && na < 16; k++)
                if (t->vals[k] >= 1 && t->vals[k] != cur) axes[na++] = t->vals[k];
            space_sched var[34];
            int nvar = 0;
            for (int k = 0; k < na; k++) space_default_vectorized(j->sp, axes[k], &var[nvar++]);
            for (int k = 0, n0 = nvar; k <= n0; k++) {
                const space_sched *src = k == 0 ? &d : &var[k - 1];
                for (int i = 0; i < j->sp->n_slot; i++)
                    if (j->sp->slot[i].kind == SLOT_PACK) {
                        var[nvar] = *src;
                        var[nvar].v[i] = !src->v[i];
                        tlm_error ce;
                        if (space_check(j->sp, &var[nvar], &ce) == 0) nvar++;
                    }
            }
            for (int k = 0; k < nvar && pick.n < B && !rc; k++) {
                uint64_t h = shash(&var[k]);
                bool dup = false;
                for (int q = 0; q < pick.n && !dup; q++) dup = shash(&pick.s[q]) == h;
                if (!dup) rc = slist_add(&pick, &var[k]);
            }
        }
        if (!rc) rc = add_samples(t, B, &pick);
        for (int i = base; i < pick.n && !rc; i++)
            rc = pl_add_candidate(j, &pick.s[i], PL_SRC_TUNED, NAN, err);
    } else {
        bool learned = t->cost && t->n >= TUNE_MIN_TRAIN;
        int n_model = learned ? B - (int)floor(t->o.eps * B + 0.5) : 0;
        if (n_model > 0) rc = evolve(t, n_model, &pick, err);
        if (!rc) rc = add_samples(t, B, &pick);
        for (int i = 0; i < pick.n && !rc; i++)
            rc = pl_add_candidate(j, &pick.s[i], PL_SRC_TUNED, NAN, err);
    }
    if (rc || pick.n == 0) {
        slist_free(&pick);
        return rc;
    }
    int n = pick.n;
    slist_free(&pick);
    int *idx = malloc((size_t)n * sizeof *idx);
    double *secs = malloc((size_t)n * sizeof *secs);
    if (!idx || !secs) {
        free(idx);
        free(secs);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    /* in round 0 the job's own candidates come first, then the ones added above */
    for (int k = 0; k < n; k++) idx[k] = first_cand + k;
    for (int k = 0; k < n && !rc; k++) rc = seen_add(t, shash(&j->cands[idx[k]].sched));
    int rec0 = j->n_recs;
    double t0 = tlm_now_s();
    if (!rc) rc = t->o.eval(j, idx, n, secs, t->o.eval_user, err);
    double dt = tlm_now_s() - t0;
    t->per_trial_s = t->per_trial_s > 0 ? 0.5 * t->per_trial_s + 0.5 * dt / n : dt / n;
    int tried = 0;
    for (int k = 0; k < n && !rc; k++) {
        /* a candidate the evaluator skipped (cancelled) is not a trial */
        bool skipped = false;
        for (int r = rec0; r < j->n_recs; r++)
            if (j->recs[r].cand == idx[k] && !strcmp(j->recs[r].status, "cancelled"))
                skipped = true;
        if (skipped) continue;
        rc = add_row(t, idx[k], secs[k]);
        tried++;
    }
    free(idx);
    free(secs);
    if (rc) return rc < 0 ? rc : tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    if (j->o.on_records && j->n_recs > rec0) j->o.on_records(j, rec0, j->n_recs, j->o.user);
    t->st.rounds++;
    rc = retrain(t, err);
    if (rc) return rc;
    report(t, "measure");
    return tried;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int tune_second_look(pl_job *j, const int *idx, int n, int rounds, tune_eval_fn eval, void *user,
                     double *secs, tlm_error *err)
{
    if (n <= 0) return 0;
    if (rounds < 1) rounds = 1;
    int *ord = malloc((size_t)n * sizeof *ord);
    double *got = malloc((size_t)n * sizeof *got);
    double *all = malloc((size_t)n * (size_t)rounds * sizeof *all);
    if (!ord || !got || !all) {
        free(ord);
        free(got);
        free(all);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    /* the full protocol (the runner's defaults: samples of at least 1 ms, a 5 ms warm-up),
     * not the search's short samples: some kernels time differently under the two, and the
     * served kernel must hold up under the full one */
    measure_opts saved = j->o.mo;
    if (j->o.mo.repeats < 7) j->o.mo.repeats = 7;
    if (j->o.mo.min_sample_s < MEASURE_DEFAULT_MIN_SAMPLE_S)
        j->o.mo.min_sample_s = MEASURE_DEFAULT_MIN_SAMPLE_S;
    if (j->o.mo.min_warmup_s < MEASURE_DEFAULT_MIN_WARMUP_S)
        j->o.mo.min_warmup_s = MEASURE_DEFAULT_MIN_WARMUP_S;
    int rc = 0, done = 0; /* rounds measured (a cancel stops between rounds) */
    for (int r = 0; r < rounds && !rc; r++) {
        if (r && j->o.cancel && __atomic_load_n(j->o.cancel, __ATOMIC_ACQUIRE)) break;
        for (int k = 0; k < n; k++) ord[k] = idx[(k + r) % n];
        int rec0 = j->n_recs;
        rc = eval(j, ord, n, got, user, err);
        if (rc) break;
        if (j->o.on_records && j->n_recs > rec0) j->o.on_records(j, rec0, j->n_recs, j->o.user);
        for (int k = 0; k < n; k++) /* got[k] is idx[(k + r) % n]'s */
            all[(size_t)((k + r) % n) * (size_t)rounds + (size_t)r] = got[k];
        done++;
    }
    j->o.mo = saved;
    if (!rc) {
        for (int k = 0; k < n; k++) {
            double *v = all + (size_t)k * (size_t)rounds;
            bool ok = done > 0;
            for (int r = 0; r < done; r++) ok = ok && isfinite(v[r]);
            if (!ok) {
                secs[k] = INFINITY;
                continue;
            }
            qsort(v, (size_t)done, sizeof *v, cmp_double);
            secs[k] = done % 2 ? v[done / 2] : 0.5 * (v[done / 2 - 1] + v[done / 2]);
        }
    }
    free(ord);
    free(got);
    free(all);
    return rc;
}

int tune_confirm(pl_job *j, const int *fast, int n, int start, int rounds, tune_eval_fn eval,
                 void *user, bool *won, tune_confirmed *out, tlm_error *err)
{
    *won = false;
    int idx[9], k = 0, first = -1;
    for (int i = 0; i < n && k < 8; i++) idx[k++] = fast[i];
    if (start >= 0) {
        for (int i = 0; i < k && first < 0; i++)
            if (idx[i] == start) first = i;
        if (first < 0) {
            first = k;
            idx[k++] = start;
        }
    }
    if (k < 2) return 0; /* nothing to compare */
    double secs[9];
    int rc = tune_second_look(j, idx, k, rounds, eval, user, secs, err);
    if (rc) return rc;
    int b = -1;
    for (int i = 0; i < k; i++)
        if (isfinite(secs[i]) && (b < 0 || secs[i] < secs[b])) b = i;
    if (b < 0) return 0;
    /* within the margin of the starting point, the start stays: a vit attention-score GEMM on
     * AVX2 kept a winner 1.00x its default here that the bench's rounds then timed 14 % slower */
    if (first >= 0 && b != first && isfinite(secs[first]) &&
        secs[b] > secs[first] * (1.0 - TUNE_CONFIRM_MARGIN))
        b = first;
    *won = true;
    out->best_cand = idx[b];
    out->confirmed = k;
    out->confirmed_s = secs[b];
    out->first_confirmed_s = first >= 0 ? secs[first] : NAN;
    return 0;
}

/* Measures the search's top candidates and its starting point again (tune_confirm) and makes
 * the fastest of that second look the best: one lucky short measurement on a busy machine
 * does not decide the kernel, and the starting point's first, often slow, sample does not
 * make a slower kernel look like a gain. */
static int confirm(tstate *t, tlm_error *err)
{
    pl_job *j = t->j;
    int k = t->o.confirm;
    if (k <= 0 || t->st.ok < 2) return 0;
    if (j->o.cancel && __atomic_load_n(j->o.cancel, __ATOMIC_ACQUIRE)) return 0;
    if (k > t->st.ok) k = t->st.ok;
    if (k > 8) k = 8;
    int *ord = malloc((size_t)t->n * sizeof *ord);
    if (!ord) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    for (int i = 0; i < t->n; i++) ord[i] = i;
    qsort_r(ord, (size_t)t->n, sizeof *ord, cmp_secs, t->secs);
    int fast[8], n = 0;
    for (int i = 0; i < t->n && n < k; i++)
        if (isfinite(t->secs[ord[i]])) fast[n++] = t->cand[ord[i]];
    free(ord);
    /* the starting point (the first candidate measured), when it was correct */
    int start = t->n > 0 && isfinite(t->secs[0]) ? t->cand[0] : -1;
    bool won;
    tune_confirmed c;
    int rc = tune_confirm(j, fast, n, start, t->o.confirm_rounds, t->o.eval, t->o.eval_user, &won,
                          &c, err);
    if (!rc && won) {
        t->st.best_cand = c.best_cand;
        t->st.confirmed_s = c.confirmed_s;
        t->st.confirmed = c.confirmed;
        t->st.first_confirmed_s = c.first_confirmed_s;
    }
    return rc;
}

/* Chooses the best (rebuilt) as the job's kernel. */
static int state_choose(tstate *t, tlm_error *err)
{
    pl_job *j = t->j;
    int best = t->st.best_cand;
    if (best < 0) {
        for (int r = 0; r < j->n_recs; r++)
            if (strcmp(j->recs[r].status, "cancelled"))
                return tlm_err_set(err, TLM_ERUNTIME, "",
                                   "no candidate of %d tried was correct; the first: %s: %s",
                                   t->st.trials, j->recs[r].status, j->recs[r].detail);
        return tlm_err_set(err, TLM_ERUNTIME, "", "the search tried no candidate");
    }
    drv_artifact a;
    tlm_error be;
    tlm_err_clear(&be);
    int ri = pl_evaluate(j, best, false, &a, &be);
    if (ri < 0) {
        *err = be;
        return ri;
    }
    if (!a.binary) {
        *err = be;
        return be.code ? be.code : TLM_ERUNTIME;
    }
    const pl_record *r = NULL; /* its latest measurement (the confirmation's, if any) */
    for (int k = j->n_recs - 1; k >= 0 && !r; k--)
        if (j->recs[k].cand == best && pl_record_timed(&j->recs[k])) r = &j->recs[k];
    measure_result mr;
    memset(&mr, 0, sizeof mr);
    mr.status = MEASURE_OK;
    if (r) {
        mr.median_s = r->median_s;
        mr.min_s = r->min_s;
        mr.gflops = r->gflops;
        mr.rel_err = isfinite(r->rel_err) ? r->rel_err : -1;
        mr.n_samples = r->n_samples;
        mr.seed = r->seed;
        /* the second look's median over its rounds, not its last round alone */
        if (isfinite(t->st.confirmed_s) && t->st.confirmed_s > 0 && r->median_s > 0) {
            mr.gflops = r->gflops * r->median_s / t->st.confirmed_s;
            mr.median_s = t->st.confirmed_s;
        }
    } else {
        mr.median_s = t->st.best_s;
        mr.rel_err = -1;
    }
    /* a modelled time (pl_opts.model_labels) is not a measurement of the chosen kernel */
    bool modelled = r && strcmp(r->status, "ok");
    pl_choose(j, best, &a, r && !modelled ? &mr : NULL, modelled ? "tuned_by_model" : "tuned");
    j->source = PL_SRC_TUNED;
    return 0;
}

static void stats_out(tstate *t, tune_stats *stats)
{
    t->st.elapsed_s = tlm_now_s() - t->t0;
    if (stats) {
        *stats = t->st;
        t->st.best_curve = NULL;
    }
}

int tune_run(pl_job *j, const tune_opts *o, tune_stats *stats, tlm_error *err)
{
    if (stats) memset(stats, 0, sizeof *stats);
    tstate t;
    int rc = state_init(&t, j, o, err);
    while (!rc && t.st.trials < t.o.trials && !out_of_time(&t)) {
        int n = round_run(&t, t.o.trials - t.st.trials, err);
        if (n < 0) rc = n;
        if (n == 0) break; /* nothing new to try */
    }
    if (!rc) rc = confirm(&t, err);
    if (!rc && j->o.mode == PL_MODE_TUNE) rc = state_choose(&t, err);
    if (!rc) report(&t, "done");
    stats_out(&t, stats);
    state_free(&t);
    return rc;
}

int tune_search_hook(pl_job *j, void *user, tlm_error *err)
{
    (void)user;
    tune_opts o;
    tune_opts_init(&o);
    if (j->o.trials > 0) o.trials = j->o.trials;
    o.seconds = j->o.seconds;
    if (j->o.seed) o.seed = j->o.seed;
    o.model = j->o.model;
    int rc = tune_strategy_parse(j->o.strategy, &o.strategy, err);
    if (rc) return rc;
    if (o.strategy == TUNE_HTAM) return htam_search_hook(j, err);
    /* a fixed input seed: the reference is computed once per job and cached */
    if (!j->o.mo.seed) j->o.mo.seed = o.seed * 0x9e3779b97f4a7c15ull | 1;
    return tune_run(j, &o, NULL, err);
}

void tune_register(void)
{
    pl_set_search(PL_MODE_TUNE, tune_search_hook, NULL);
}

/* ---- the task scheduler ---- */

int tune_schedule(tune_task *tasks, int n, int trials, double seconds, uint64_t seed,
                  const bool *cancel, tune_round_fn round, void *round_user,
                  tune_task_progress_fn progress, void *user, tlm_error *err)
{
    if (n <= 0) return 0;
    double *prev = calloc((size_t)n, sizeof *prev); /* best before the task's last round */
    int *prev_trials = calloc((size_t)n, sizeof *prev_trials);
    bool *done = calloc((size_t)n, sizeof *done);
    int rc = prev && prev_trials && done ? 0 : tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    for (int i = 0; i < n && !rc; i++) {
        prev[i] = INFINITY;
        tasks[i].trials = 0;
        tasks[i].best_s = tasks[i].first_s = INFINITY;
    }
    double t0 = tlm_now_s();
    int total = 0;
    uint64_t rng = seed ? seed : 1;
    for (int step = 0; !rc; step++) {
        if (total >= trials) break;
        if (seconds > 0 && tlm_now_s() - t0 >= seconds) break;
        if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) break;
        int pickt = -1;
        if (step < n) {
            pickt = step; /* every task gets a first round */
        } else if (unit(&rng) < 0.05) {
            for (int tries = 0; tries < 4 * n && pickt < 0; tries++) {
                int c = (int)(rnd(&rng) % (uint64_t)n);
                if (!done[c]) pickt = c;
            }
        }
        if (pickt < 0) {
            double bestg = -INFINITY;
            for (int i = 0; i < n; i++) {
                if (done[i]) continue;
                tune_task *tk = &tasks[i];
                double b = tk->best_s;
                double g;
                if (!isfinite(b)) {
                    g = INFINITY; /* nothing works yet: most urgent */
                } else {
                    int dt = tk->trials - prev_trials[i];
                    double backward =
                        isfinite(prev[i]) && dt > 0 ? (prev[i] - b) / dt : b / (tk->trials + 1);
                    double forward = b / (tk->trials + 1);
                    g = tk->weight * (0.2 * backward + 0.8 * forward);
                }
                if (g > bestg) {
                    bestg = g;
                    pickt = i;
                }
            }
        }
        if (pickt < 0) break; /* every task exhausted its space */
        prev[pickt] = tasks[pickt].best_s;
        prev_trials[pickt] = tasks[pickt].trials;
        int left = trials - total;
        /* the first rounds share the budget so every task gets one */
        if (step < n) {
            int share = trials / n;
            if (share < 1) share = 1;
            if (left > share) left = share;
        }
        int got = round(pickt, left, round_user, err);
        if (got < 0) {
            rc = got;
            break;
        }
        if (got == 0) done[pickt] = true;
        total += got;
        if (progress) progress(pickt, &tasks[pickt], total, user);
    }
    free(prev);
    free(prev_trials);
    free(done);
    return rc;
}

typedef struct {
    tune_task *tasks;
    tstate *st;
} evo_tasks;

/* tune_schedule's round for the evolutionary search: one round_run. */
static int evo_round(int task, int budget, void *user, tlm_error *err)
{
    evo_tasks *e = user;
    tstate *st = &e->st[task];
    int got = round_run(st, budget, err);
    if (got < 0) return got;
    tune_task *tk = &e->tasks[task];
    tk->trials = st->st.trials;
    tk->best_s = st->st.best_s;
    tk->first_s = st->st.first_s;
    return got;
}

int tune_tasks(tune_task *tasks, int n, const tune_opts *o, tune_task_progress_fn progress,
               void *user, tlm_error *err)
{
    if (n <= 0) return 0;
    tstate *st = calloc((size_t)n, sizeof *st);
    if (!st) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = 0, inited = 0;
    for (int i = 0; i < n && !rc; i++) {
        tune_opts oi = *o;
        oi.seed = (o->seed ? o->seed : 1) + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        oi.seconds = 0; /* the scheduler keeps the time */
        if (!tasks[i].job->o.mo.seed) tasks[i].job->o.mo.seed = oi.seed | 1;
        rc = state_init(&st[i], tasks[i].job, &oi, err);
        if (!rc) inited++;
    }
    evo_tasks et = {.tasks = tasks, .st = st};
    if (!rc)
        rc = tune_schedule(tasks, n, o->trials, o->seconds, o->seed, tasks[0].job->o.cancel,
                           evo_round, &et, progress, user, err);
    /* each task's choice: its best measured, else the first candidate that builds */
    for (int i = 0; i < inited && !rc; i++) {
        tasks[i].trials = st[i].st.trials;
        tasks[i].best_s = st[i].st.best_s;
        tasks[i].first_s = st[i].st.first_s;
        if (st[i].st.best_cand >= 0) {
            rc = confirm(&st[i], err);
            if (!rc) rc = state_choose(&st[i], err);
        } else {
            pl_job *j = tasks[i].job;
            if (j->n_cands == 0) {
                space_sched d;
                space_default(j->sp, &d);
                rc = pl_add_candidate(j, &d, PL_SRC_DEFAULT, NAN, err);
            }
            for (int c = 0; c < j->n_cands && !rc && j->chosen < 0; c++) {
                drv_artifact a;
                tlm_error be;
                int ri = pl_evaluate(j, c, false, &a, &be);
                if (ri < 0) rc = ri;
                else if (a.binary) pl_choose(j, c, &a, NULL, "first");
            }
            if (!rc && j->chosen < 0)
                rc = tlm_err_set(err, TLM_ERUNTIME, "", "task %d: no candidate built", i);
        }
    }
    for (int i = 0; i < inited; i++) state_free(&st[i]);
    free(st);
    return rc;
}
