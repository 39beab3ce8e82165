/* tune.h — the measured search: evolutionary tuning guided by a learned cost model.
 *
 *   first round: the job's own candidates, the default, the model's beam, the default along
 *     every other vector axis and with packing toggled, then uniform samples
 *   population (the best measured so far, uniform samples)
 *     ─► evolve G generations: mutation and crossover of decisions, scored by the cost model
 *     ─► pick a batch: the best predicted not yet measured, plus ε of uniform samples
 *     ─► build the batch in parallel, measure one at a time (child processes)
 *     ─► retrain the cost model on every measurement so far ─► repeat until the budget
 *
 * Contract:
 *  - Every candidate is legal: samples, mutations and crossovers draw each value from
 *    space_legal_values given the values before it; a parent's value is kept where it is
 *    still legal, else the nearest legal value (in log scale) replaces it.
 *  - No schedule is measured twice in one run (a hash of its values).
 *  - The cost model (tune_cost, XGBoost through its C API) is trained on (features of the
 *    schedule, normalised throughput best_time / time, 0 for a failure) and retrained from
 *    scratch after each batch; with fewer than TUNE_MIN_TRAIN measurements the evolution
 *    scores are uniform (the batch is then mostly diverse samples).
 *  - Budget: stops when `trials` candidates have been tried (built, and measured when the
 *    host can run them), when `seconds` of wall time have passed (checked between batches
 *    and builds), or when *cancel is set. What was measured is kept, and the fastest correct
 *    candidate is chosen; with none correct the search fails (TLM_ERUNTIME naming the first
 *    failure). Before choosing, the `confirm` best and the starting point (the first
 *    candidate measured) are measured again, `confirm_rounds` times each in rotating order,
 *    with the full protocol (tune_second_look; records too, not trials), and the fastest
 *    median of that second look wins: neither one lucky short sample nor a slow first sample
 *    of the starting point decides the kernel, and a search never serves a kernel that the
 *    second look found slower than where it started.
 *  - Reproducible: the random choices come from `seed` alone, so with the same
 *    measurements a run makes the same candidates in the same order (tests inject an
 *    evaluator to check this); the measured times themselves vary run to run.
 *  - Strategy "evolutionary" (the default) uses the cost model; "random" measures uniform
 *    samples (the baseline the cost model must beat at equal trials).
 */
#ifndef TLM_TUNE_H
#define TLM_TUNE_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/driver/pipeline.h"

#define TUNE_MIN_TRAIN 8
#define TUNE_MAX_FEATURES 192

/* TUNE_HTAM: the TUNE hook hands the job to HTAM refinement (compiler/tune/htam.h). */
typedef enum { TUNE_EVOLUTIONARY, TUNE_RANDOM, TUNE_HTAM } tune_strategy;

/* Evaluates candidates idx[0..n) of j (already added with pl_add_candidate): sets secs[k] to
 * the median seconds of candidate idx[k], or INFINITY when it failed (build error, wrong,
 * crash). The default evaluator builds and measures them with pl_evaluate_batch. */
typedef int (*tune_eval_fn)(pl_job *j, const int *idx, int n, double *secs, void *user,
                            tlm_error *err);

typedef struct tune_opts {
    int trials;           /* candidates to try (>= 1) */
    double seconds;       /* wall-clock budget; 0 = none */
    uint64_t seed;        /* 0 = 1 */
    tune_strategy strategy;
    int batch;            /* candidates per round (16) */
    int population;       /* evolution population (128) */
    int generations;      /* evolution steps per round (4) */
    double eps;           /* share of uniform samples in a batch (0.1) */
    int build_threads;    /* parallel builds (online CPUs, at most 8) */
    int confirm;          /* the top candidates measured again at the end (3; 0: off; at most 8) */
    int confirm_rounds;   /* measurements of each in that second look (3) */
    const tlm_model *model; /* seeds the population with its beam when set */
    int beam;             /* beam width (8) */
    tune_eval_fn eval;    /* NULL: build + measure */
    void *eval_user;
} tune_opts;

typedef struct tune_stats {
    int trials;         /* candidates tried */
    int rounds;
    int ok;             /* tried and correct */
    double best_s;      /* INFINITY when none correct */
    double first_s;     /* the first candidate's (the starting point's) time */
    double default_s;   /* the default schedule's time when it was tried, else NAN */
    int best_cand;      /* index into j->cands (after confirmation); -1 when none */
    int confirmed;      /* candidates measured again at the end */
    double confirmed_s; /* the chosen one's time in that second look; NAN without one */
    double first_confirmed_s; /* the starting point's time in it; NAN when not measured */
    double elapsed_s;
    double model_s;     /* time in cost-model training and prediction */
    /* best-so-far after each trial: best_curve[t] for t < trials (INFINITY before the first
     * correct one); malloc'ed, the caller frees it */
    double *best_curve;
} tune_stats;

/* The second look: candidates idx[0..n) measured again `rounds` times each (at least 1),
 * each round in an order rotated by one (no candidate always runs first), with the full
 * protocol (the runner's default sample length and warm-up, at least 7 samples);
 * secs[k] = the median of idx[k]'s rounds, INFINITY when any of its rounds failed. Calls
 * j->o.on_records for the records each round adds. */
int tune_second_look(pl_job *j, const int *idx, int n, int rounds, tune_eval_fn eval, void *user,
                     double *secs, tlm_error *err);

/* The confirmation the search and HTAM end with: the candidates fast[0..n) (distinct, fastest
 * first, at most 8) and the starting point `start` (-1: none; appended when not among them)
 * take the second look (tune_second_look), and the fastest median there wins, unless it beats
 * the starting point's by less than TUNE_CONFIRM_MARGIN: then the start wins (a tie within the
 * second look's noise keeps the kernel the search began from, the one served). Returns 0 with
 * *won = false when fewer than two candidates are left to compare or none of them was timed;
 * otherwise *won = true and best_cand (the winner), confirmed (how many were measured),
 * confirmed_s (its median) and first_confirmed_s (the starting point's, NAN without one). */
#define TUNE_CONFIRM_MARGIN 0.03
typedef struct {
    int best_cand, confirmed;
    double confirmed_s, first_confirmed_s;
} tune_confirmed;
int tune_confirm(pl_job *j, const int *fast, int n, int start, int rounds, tune_eval_fn eval,
                 void *user, bool *won, tune_confirmed *out, tlm_error *err);

/* tune_opts_init's evaluator (NULL: build + measure here). A server that spreads
 * measurements over a cluster sets its own once at start-up, before any search runs; it
 * then also stores the records it measures (they do not appear in j->recs). */
void tune_set_default_eval(tune_eval_fn fn, void *user);
void tune_opts_init(tune_opts *o);
/* "evolutionary" | "random" | "htam" (NULL or "" = evolutionary); TLM_EINVAL naming
 * "strategy". */
int tune_strategy_parse(const char *name, tune_strategy *out, tlm_error *err);

/* Runs the search on a prepared job (pl_prepare; its candidates, if any, join the first
 * round: the default of PL_MODE_DEFAULT, a given list). Candidates it makes are appended to
 * j with source PL_SRC_TUNED (except the default, PL_SRC_DEFAULT, and the beam, PL_SRC_TLM);
 * records arrive in j->recs and, as they are made, through j->o.on_records; progress through
 * j->o.progress. When j->o.mode is TUNE the best is rebuilt and chosen (pl_choose, selection
 * "tuned"). stats may be NULL. */
int tune_run(pl_job *j, const tune_opts *o, tune_stats *stats, tlm_error *err);
void tune_stats_free(tune_stats *s);

/* The PL_MODE_TUNE hook: tune_run with options from j->o (trials, seconds, seed, strategy,
 * model). tune_register() installs it (pl_set_search) once; any thread. */
int tune_search_hook(pl_job *j, void *user, tlm_error *err);
void tune_register(void);

/* ---- pieces (tests use them) ---- */

/* The features of schedule s in space sp (at most TUNE_MAX_FEATURES; returns the count,
 * which depends only on sp): per slot log2(1 + value), and per anchor axis and level the
 * tile factors (log2), and the derived quantities the costs follow (register tile and
 * accumulator block sizes, parallel tasks, padding waste, packed floats, threads and shared
 * memory on GPUs). */
int tune_features(const space *sp, const space_sched *s, float *f);

/* Mutation: resample one slot (a random one), re-legalise the slots after it. */
void tune_mutate(const space *sp, const space_sched *in, uint64_t *rng, space_sched *out);
/* Crossover: each slot from a or b (a coin per slot), legalised. */
void tune_crossover(const space *sp, const space_sched *a, const space_sched *b, uint64_t *rng,
                    space_sched *out);
/* Keeps slots [0, from) of s and makes the rest legal: each keeps its value where it is still
 * legal, else takes the legal value nearest it (log scale). */
void tune_legalise(const space *sp, space_sched *s, int from);
/* 64-bit hash of a schedule's values (dedup). */
uint64_t tune_sched_hash(const space_sched *s);

/* The cost model: gradient-boosted trees over tune_features. */
typedef struct tune_cost tune_cost;
tune_cost *tune_cost_new(int n_features, uint64_t seed, tlm_error *err);
void tune_cost_free(tune_cost *c);
/* Trains from scratch on rows x[n][n_features] with targets y[n]. */
int tune_cost_fit(tune_cost *c, const float *x, const float *y, int n, tlm_error *err);
/* Predicts n rows into out (higher = faster). Untrained: all 0. */
int tune_cost_predict(tune_cost *c, const float *x, int n, float *out, tlm_error *err);

/* ---- tasks: one budget over many subgraphs (a graph, a model) ---- */

typedef struct tune_task {
    pl_job *job;    /* prepared (pl_prepare), owned by the caller */
    double weight;  /* how many times the kernel runs in the model */
    /* filled by tune_tasks */
    int trials;
    double best_s;  /* INFINITY when none correct yet */
    double first_s;
} tune_task;

/* Progress per task after each of its rounds: task index, its stats so far. */
typedef void (*tune_task_progress_fn)(int task, const tune_task *t, int trials_total,
                                      void *user);

/* Ansor's gradient task scheduler: one round of `batch` trials at a time goes to the task
 * with the largest expected gain in weighted latency (weight × (the recent improvement rate,
 * optimistically bounded below by best/trials)); every task first gets one round. Then each
 * task's best is chosen (pl_choose) when it measured anything correct, else its first
 * buildable candidate. Stops at o->trials in total or o->seconds. Returns 0 when every task
 * chose a kernel. */
int tune_tasks(tune_task *tasks, int n, const tune_opts *o, tune_task_progress_fn progress,
               void *user, tlm_error *err);

/* The scheduler alone (tune_tasks' rule, any search): round(task, budget, ...) runs one round
 * of at most `budget` trials on tasks[task], updates its trials / best_s / first_s and returns
 * the trials made (0: the task has nothing left to try; negative: an error, which stops the
 * schedule). Resets every task's trials, best_s and first_s first; stops at `trials` in total,
 * `seconds` (0: none) or *cancel (may be NULL). Chooses nothing. */
typedef int (*tune_round_fn)(int task, int budget, void *user, tlm_error *err);
int tune_schedule(tune_task *tasks, int n, int trials, double seconds, uint64_t seed,
                  const bool *cancel, tune_round_fn round, void *round_user,
                  tune_task_progress_fn progress, void *user, tlm_error *err);

#endif
