/* pipeline.h — the one entry from (workload, target, mode, options) to a chosen, compiled,
 * optionally verified kernel, the records to store, and where its schedule came from.
 *
 *   workload ─► subgraph ─► space ─► candidates (by mode) ─► build each (codegen + toolchain)
 *            ─► measure where this host can run them ─► choose ─► artifact + records + source
 *
 * The daemon, `tlm compile|generate|space`, and the benchmarks call this; none of them
 * re-orchestrates the stages. (The daemon decodes on its own batched decoder thread: it calls
 * pl_prepare, decodes pl_decode_count() candidates itself, hands them in with pl_add_candidate
 * and calls pl_finish on a pool thread. Everyone else calls pl_run.)
 *
 * Contract:
 *  - Modes and the schedule source they give the chosen kernel:
 *      PL_MODE_DEFAULT  space_default, the rule of thumb                       → "default"
 *      PL_MODE_TLM      the model's greedy schedule (one pass)                 → "tlm"
 *      PL_MODE_TOPK     k beam candidates; measured on this host when it can
 *                       run the target, else the best model score wins       → "topk"
 *      PL_MODE_GIVEN    schedules the caller names (a decision list, a seeded
 *                       random sample); every one is built, the first that
 *                       builds (or, measured, the fastest correct) wins      → "given"
 *      PL_MODE_TUNE     the measured search (a hook; see pl_set_search)        → "tuned"
 *      PL_MODE_REFINE   HTAM refinement (a hook)                               → "htam"
 *    A cache hit keeps the source its kernel was stored with.
 *  - Measurement (opts.measure): PL_MEASURE_AUTO measures when there is a choice to make (more
 *    than one candidate) or opts.verify is set, and the host can run the target; PL_MEASURE_ON
 *    measures every built candidate and is refused by pl_prepare (field "measure") when the
 *    host cannot run the target; PL_MEASURE_OFF never measures. A measured candidate whose
 *    status is not "ok" (wrong, crash, timeout, load_error) is never chosen; when none is ok
 *    the job fails with TLM_ERUNTIME naming the first candidate's status. Measurements run
 *    in child processes (compiler/measure), so a broken kernel never takes the caller down.
 *  - Modelled labels (opts.model_labels, cuda targets on a host that cannot run them): where a
 *    search hook asks for measurements (pl_evaluate / pl_evaluate_batch with `measure`), each
 *    built candidate is labelled by the analytic GPU model (compiler/measure/gpu_model.h)
 *    instead: its record gets status "modelled" (never "ok": a prediction is not a
 *    measurement), median_s = min_s = the predicted time, n_samples 0, and the model's
 *    figures in detail; a kernel the model rejects (no block fits an SM) gets status
 *    "model_error". This is what lets TUNE run for cuda targets without a GPU (datagen's
 *    labeller). pl_finish's own choice (the non-search modes) never uses modelled times.
 *  - Records: every candidate tried gives one pl_record (schedule, source, status, timings)
 *    in j->recs, in the order they were tried; the measured ones and the build failures are
 *    the ones to store (pl_record_storable). The caller stores them (compiler/ knows nothing
 *    of SQLite); pl_sentence gives a candidate's tensor-language text.
 *  - Determinism: the candidates of DEFAULT, TLM (greedy, grammar-masked) and GIVEN depend
 *    only on (workload, target, weights, options); without measurement the chosen kernel is
 *    a function of them. TOPK with measurement chooses by time, so it may differ run to run.
 *  - Threads: a pl_job belongs to one thread at a time; distinct jobs run concurrently (the
 *    daemon's pool). The search hooks are process-wide and set once at start-up.
 */
#ifndef TLM_PIPELINE_H
#define TLM_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/driver/driver.h"
#include "compiler/lang/lang.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/tlm/tlm.h"

typedef enum pl_mode {
    PL_MODE_DEFAULT,
    PL_MODE_TLM,
    PL_MODE_TOPK,
    PL_MODE_GIVEN,
    PL_MODE_TUNE,
    PL_MODE_REFINE,
    PL_MODE_COUNT
} pl_mode;

typedef enum pl_source {
    PL_SRC_DEFAULT,
    PL_SRC_TLM,
    PL_SRC_TOPK,
    PL_SRC_GIVEN,
    PL_SRC_TUNED,
    PL_SRC_HTAM,
    PL_SRC_COUNT
} pl_source;

typedef enum pl_measure { PL_MEASURE_AUTO, PL_MEASURE_OFF, PL_MEASURE_ON } pl_measure;

#define PL_MAX_CANDIDATES 64 /* = TLM_MAX_BEAM */

struct pl_job;
struct pl_progress;

typedef struct pl_opts {
    pl_mode mode;
    int k;                  /* TOPK: candidates, 1..PL_MAX_CANDIDATES (others: ignored) */
    pl_measure measure;     /* see the contract */
    bool verify;            /* check the chosen kernel against the reference when possible */
    measure_opts mo;        /* how candidates are measured (pl_opts_init: 5 repeats, 5 s) */
    const tlm_model *model; /* TLM / TOPK in pl_decode (pl_run) */
    /* GIVEN: n_given schedules, each must pass space_check; or none here and the caller adds
     * them with pl_add_candidate after pl_prepare (e.g. parsed against j->sp) */
    const space_sched *given;
    int n_given;
    /* TUNE / REFINE: the budget and the search's own choices */
    int trials;
    double seconds;
    uint64_t seed;
    const char *strategy;
    /* Long searches (TUNE / REFINE): a flag the caller sets (from any thread) to stop early
     * (the search keeps what it measured and chooses among it); a progress report after each
     * measured batch; records handed over as they are made (j->recs[from, to)), so a caller
     * can commit them before the search ends. Any may be NULL. */
    const bool *cancel;
    void (*progress)(const struct pl_job *j, const struct pl_progress *p, void *user);
    void (*on_records)(const struct pl_job *j, int from, int to, void *user);
    void *user;
    /* cuda targets: label candidates with the GPU model instead of measuring (see above) */
    bool model_labels;
} pl_opts;

/* A search's progress, after each measured batch. */
typedef struct pl_progress {
    int trials;         /* candidates measured (or failed to build) so far */
    int trials_budget;  /* the budget in trials */
    double elapsed_s;
    double best_s;      /* the fastest correct median so far; INFINITY when none */
    double first_s;     /* the starting point's time (the first candidate measured) */
    int best_cand;      /* index into j->cands; -1 when none */
    int round;
    const char *phase;  /* "measure", "done" */
} pl_progress;

typedef struct pl_candidate {
    space_sched sched;
    pl_source source;
    double score; /* model log-probability (TLM, TOPK); NAN otherwise */
} pl_candidate;

typedef struct pl_record {
    int cand; /* index into j->cands */
    pl_source source;
    char schedule[DRV_SCHED_MAX];
    /* "ok" | "wrong" | "crash" | "timeout" | "load_error" (measured), "build_error" (codegen,
     * compiler or device limits failed), "built" (compiled, not measured: not a measurement),
     * "modelled" | "model_error" (labelled by the GPU model, not measured: see above) */
    char status[16];
    double median_s, min_s, gflops, rel_err; /* NAN when not timed / not checked */
    int n_samples;
    int threads;   /* CPU, timed: the OpenMP threads the kernel ran on (0: not known) */
    uint64_t seed; /* the inputs' seed of the measurement */
    double codegen_s, compile_s, measure_s;
    char detail[256];
} pl_record;

typedef struct pl_job {
    /* inputs (copied by pl_prepare) */
    ir_workload wl;
    target tgt;
    pl_opts o;
    /* prepared */
    ir_subgraph *g;
    space *sp;
    char canon[1024];
    char whash[65];
    char target_hash[65];
    bool can_run; /* this host can run kernels of tgt */
    bool can_model; /* model_labels on a cuda target this host cannot run: searches label by
                     * the GPU model */
    /* candidates, in the order they are tried */
    pl_candidate *cands;
    int n_cands, cap_cands;
    /* outcome (after pl_finish) */
    int chosen; /* index into cands, -1 before */
    drv_artifact art;
    pl_source source;
    /* how the choice was made (static string): "measured" (fastest correct of several),
     * "verified" (one candidate, checked), "model_score" (topk unmeasured: best score that
     * builds), "first" (the first that builds), or what a search hook says */
    const char *selection;
    bool measured;         /* art was measured: chosen_mr holds the result */
    measure_result chosen_mr;
    pl_record *recs;
    int n_recs, cap_recs;
    double prepare_s, decode_s, codegen_s, compile_s, measure_s;
    char *failed_source; /* the source of the first candidate that did not build, or NULL */
} pl_job;

void pl_opts_init(pl_opts *o);

const char *pl_mode_name(pl_mode m);     /* "default", "tlm", "topk", "given", "tune", "refine" */
const char *pl_source_name(pl_source s); /* "default", "tlm", "topk", "given", "tuned", "htam" */
/* Parses a mode name (also "generate": TLM when a model is given, else DEFAULT, decided by
 * the caller; this returns PL_MODE_TLM for it). TLM_EINVAL naming field when unknown. */
int pl_mode_parse(const char *name, const char *field, pl_mode *out, tlm_error *err);
/* "default"... → source; -1 when unknown. */
int pl_source_parse(const char *name);

/* Zeroes *j, copies the inputs, builds the subgraph and the space, and seeds the candidates
 * DEFAULT and GIVEN need. Refuses: k out of range ("candidates"), TLM/TOPK in pl_run without a
 * model ("weights"), PL_MEASURE_ON where the host cannot run the target ("measure"), TUNE/REFINE
 * without a search hook ("mode"), an illegal given schedule (its slot). pl_job_free after
 * success and failure. */
int pl_prepare(pl_job *j, const ir_workload *wl, const target *t, const pl_opts *o,
               tlm_error *err);
/* How many candidates the model must decode for this job (0, 1 or k). */
int pl_decode_count(const pl_job *j);
/* Appends a candidate (checked with space_check). */
int pl_add_candidate(pl_job *j, const space_sched *s, pl_source src, double score,
                     tlm_error *err);
/* Decodes pl_decode_count() candidates with j->o.model on this thread. */
int pl_decode(pl_job *j, tlm_error *err);
/* Builds, measures (per the policy) and chooses among the candidates; for TUNE / REFINE runs
 * the search hook, which calls pl_evaluate and pl_choose itself. */
int pl_finish(pl_job *j, tlm_error *err);
/* pl_prepare + pl_decode + pl_finish. */
int pl_run(pl_job *j, const ir_workload *wl, const target *t, const pl_opts *o, tlm_error *err);
void pl_job_free(pl_job *j);

/* For search hooks: builds candidate i (and measures it when `measure` and the host can run
 * it), appends its record and returns the record's index (or a negative error code when
 * even the record could not be kept). The artifact is kept in *art_out when not NULL (the
 * caller frees it), else released. */
int pl_evaluate(pl_job *j, int i, bool measure, drv_artifact *art_out, tlm_error *err);
/* For search hooks: builds candidates idx[0..n) on `threads` threads at once, then measures
 * the built ones one at a time (when `measure` and the host can run them; timings are never
 * taken while another build runs), appending one record per candidate in idx's order;
 * rec_out[k] (may be NULL) receives candidate idx[k]'s record index. Artifacts are released.
 * When j->o.cancel is set, what is not built yet is not built (record status "cancelled",
 * not storable). Returns 0, or a negative code when a record could not be kept. */
int pl_evaluate_batch(pl_job *j, const int *idx, int n, bool measure, int threads, int *rec_out,
                      tlm_error *err);
/* Makes candidate i (already built into *art, which the job takes over) the job's choice. */
void pl_choose(pl_job *j, int i, drv_artifact *art, const measure_result *mr, const char *selection);

/* Search hooks for TUNE and REFINE (the search and HTAM modules register theirs at start-up).
 * fn gets a prepared job whose candidates may be empty; it evaluates candidates, appends
 * more with pl_add_candidate, and must pl_choose one before returning 0. */
typedef int (*pl_search_fn)(pl_job *j, void *user, tlm_error *err);
void pl_set_search(pl_mode mode, pl_search_fn fn, void *user);
bool pl_has_search(pl_mode mode);

/* Whether record r is a measurement or a build failure worth storing ("built" is not). */
bool pl_record_storable(const pl_record *r);
/* Whether record r carries a time a search may rank by: "ok" (measured) or "modelled". */
bool pl_record_timed(const pl_record *r);

/* The decision tokens of candidate i as tensor-language text (for records and the store). */
int pl_sentence(const pl_job *j, int i, char *buf, size_t cap);

#endif
