/* htam.h — HTAM refinement: a hierarchical transition-attended memory of optimisation
 * experience guiding measured refinement of one kernel's schedule (PAPERS.md: HTAM, 2026).
 *
 * The memory M = (global nodes, local nodes, transition edges), per target kind:
 *  - global nodes: coarse directions (memory access, data reuse, parallelism, vectorisation,
 *    instruction-level parallelism, packing; on GPUs staging and occupancy), each with its
 *    intent, triggers and risks (the taxonomy table in htam.c, data not code) and running
 *    statistics (tries, wins, failures, reward);
 *  - local nodes under a global node: concrete strategies, each naming the decision slots it
 *    changes (kind, tile level, which axes) and how (one step up or down the legal values,
 *    toggle, resample), with statistics and recent evidence (workload, ms before/after, the
 *    slot rewritten and who wrote it: gen);
 *  - transition edges between global nodes: the reward of following direction a by b.
 * One step: the state (the current best, the last outcome, the trajectory) → a global node by
 * a transition-aware score, Q(g) + exploration + Σ_k w_k U(g_{t-k} → g) (w = 1, 1/2, 1/4 over
 * the last three directions), under a softmax policy → a local node under it by its own Q,
 * exploration and its failure rate when the last step failed → the strategy rewrites its slots
 * of the current best, the others kept (re-legalised through space_legal_values: every step is
 * a legal program) → measure → reward r = clamp(log(best/t), -1, 1) (-1 for a failure) updates
 * the node statistics, the evidence and the edge utilities.
 *
 * Who writes the rewritten value (htam_opts.model, recorded per step as htam_gen):
 *  - TLM: the strategy picks one of its slots (at random, seeded, among those its operator can
 *    change); the model decodes the schedule sentence with every decision before that slot
 *    forced to the current best's and chooses the slot's value under the grammar mask,
 *    narrowed by the operator (up: a larger legal value, down: a smaller one, toggle and
 *    resample: any legal value but the current); decoding stops there and the later slots
 *    are re-legalised (kept where still legal, else the nearest legal value). Beam search
 *    gives the model's best HTAM_REGEN_BEAM values; the first whose schedule was not measured
 *    in this run is taken. When the model offers nothing new, the operator's own value is
 *    used and the step says "mutation".
 *  - mutation (no model, or --regen mutation): the operator's value (the next legal value up
 *    or down, the other side of a toggle, a uniform resample), as the search's mutations.
 *
 * Ablations (htam_memory): FULL; FLAT — the strategies as one flat list scored by their own
 * record, no hierarchy, no transitions; NO_TRANSITIONS — no edge term; NO_LOCAL — the local
 * strategy under the chosen direction uniformly, no local memory.
 *
 * Persistence: the memory lives in the store (tuner_nodes / tuner_edges, scope "htam", the
 * target kind), shared by every job and daemon using the store, so experience transfers
 * across workloads. A run loads it at the start and merges its own increments into the
 * stored memory at the end (load-add-replace in one short write: two runs ending at the same
 * moment may lose one's increments — said here, not hidden).
 *
 * Reproducible: with the same seed, memory, model and measurements a run takes the same steps
 * (the model's decoding is deterministic).
 *
 * Several kernels (a graph, a model): htam_tasks spends one budget through the search's
 * gradient task scheduler (tune_schedule): rounds of HTAM steps go to the kernel with the
 * largest expected gain in weighted latency, one memory shared by all of them.
 */
#ifndef TLM_HTAM_H
#define TLM_HTAM_H

#include <jansson.h>

#include "compiler/tune/tune.h"

typedef enum { HTAM_FULL, HTAM_FLAT, HTAM_NO_TRANSITIONS, HTAM_NO_LOCAL } htam_memory;

typedef struct htam htam; /* a memory for one target kind */

/* "full" | "flat" | "no-transitions" | "no-local"; TLM_EINVAL naming field. */
int htam_memory_parse(const char *name, const char *field, htam_memory *out, tlm_error *err);

/* An empty memory (the taxonomy with zero statistics) for target kind k. */
htam *htam_new(target_kind k);
void htam_free(htam *m);
/* The memory as JSON {"format": "tlm-htam/1", "target", "globals": [...], "locals": [...],
 * "edges": [...]} and back; from_json adds the document's statistics to m (merge), naming
 * the field of a malformed document. */
json_t *htam_to_json(const htam *m);
int htam_merge_json(htam *m, const json_t *doc, tlm_error *err);
/* The store's memory for the kind (empty when none) / merge m's increments since load into
 * the stored memory. store is a `store *` (compiler/ knows no SQLite: the caller's module
 * passes these two functions in htam_store_io). */
typedef struct htam_store_io {
    int (*load)(void *st, const char *target, json_t **doc, tlm_error *err);
    int (*save)(void *st, const char *target, const json_t *doc, tlm_error *err);
    void *st;
} htam_store_io;
int htam_load(htam *m, const htam_store_io *io, tlm_error *err);
int htam_save(htam *m, const htam_store_io *io, tlm_error *err);

/* Which generator wrote a step's rewritten value. */
typedef enum { HTAM_GEN_START, HTAM_GEN_MUTATION, HTAM_GEN_TLM } htam_gen;
#define HTAM_REGEN_BEAM 8

typedef struct htam_step {
    int global, local; /* taxonomy indices (-1: the starting point) */
    double ms;         /* INFINITY when it failed */
    bool improved;
    htam_gen gen;
    int cand, from_cand; /* the step's candidate in the job, the best it rewrote (-1: start) */
    int slot;            /* the slot the strategy rewrote (-1: the start) */
    int64_t from, to;    /* its value before and after */
} htam_step;

typedef struct htam_opts {
    int steps;          /* measurements, the starting point's included (>= 1) */
    double seconds;     /* wall budget, 0 = none */
    uint64_t seed;
    htam_memory memory;
    double temperature; /* softmax temperature (0.25) */
    tune_eval_fn eval;  /* NULL: build + measure (as tune) */
    void *eval_user;
    int build_threads;
    /* writes the strategy's slot (above); NULL: the strategy's operator. Read-only, shared. */
    const tlm_model *model;
    /* the second look (htam_run): the `confirm` fastest steps and the starting point measured
     * again, confirm_rounds times each (tune_confirm), and the fastest there is the best;
     * 0: off (3 and 3) */
    int confirm, confirm_rounds;
} htam_opts;

typedef struct htam_result {
    double first_s, best_s; /* the start's first time, the fastest step's (in the search) */
    int best_cand;
    int steps;       /* steps taken after the starting point */
    htam_step *traj; /* steps + 1 entries (traj[0]: the starting point), malloc'ed */
    int fallbacks;   /* steps with a model whose value came from the operator instead */
    int confirmed;   /* candidates in the second look (0: none) */
    double confirmed_s, first_confirmed_s; /* the best's and the start's times there (NAN) */
} htam_result;

void htam_opts_init(htam_opts *o);
/* Refines from j's candidate `start` (added by the caller: the default or the model's
 * schedule): each step adds one candidate (source PL_SRC_HTAM) and measures it. When j->o.mode
 * is TUNE the best is rebuilt and chosen (selection "htam", source htam). */
int htam_run(htam *m, pl_job *j, int start, const htam_opts *o, htam_result *res,
             tlm_error *err);
void htam_result_free(htam_result *r);

/* "tlm" | "mutation": whether a model (when one is given) writes the rewritten values;
 * TLM_EINVAL naming field. */
int htam_regen_parse(const char *name, const char *field, bool *tlm, tlm_error *err);
/* "start" | "mutation" | "tlm" */
const char *htam_gen_name(htam_gen g);

/* Several kernels, one budget (o->steps measurements in all, o->seconds): rounds of up to
 * `round` steps (0: 4) go where tune_schedule sends them; each task starts from its job's
 * candidate 0 (added by the caller) and its first round measures it; each task has its own
 * seed (from o->seed and its index), the memory is shared. Every task's best is chosen when
 * its job's mode is TUNE. tasks[i].trials / best_s / first_s are filled; res (may be NULL)
 * receives each task's trajectory (htam_result_free each); progress after each round as
 * tune_tasks, and per step through each job's j->o.progress. Returns 0, or TLM_ERUNTIME when
 * a task measured nothing correct (the others are still chosen). */
int htam_tasks(htam *m, tune_task *tasks, int n, const htam_opts *o, int round, htam_result *res,
               tune_task_progress_fn progress, void *user, tlm_error *err);

/* Names for printing (taxonomy of m's kind). */
const char *htam_global_name(const htam *m, int g);
const char *htam_local_name(const htam *m, int l);
int htam_n_globals(const htam *m);
int htam_n_locals(const htam *m);
/* Local strategy l's operator: +1 one step up, -1 one step down, 0 toggle or resample. */
int htam_local_direction(const htam *m, int l);

/* The TUNE hook's HTAM branch (strategy "htam"): the process-wide store io for the memory
 * (set once at start-up; NULL: a memory per run), and the model that regenerates the
 * strategies' slots (set once at start-up, trained weights only; NULL: the operators). */
void htam_set_store_io(const htam_store_io *io);
void htam_set_regen_model(const tlm_model *model);
int htam_search_hook(pl_job *j, tlm_error *err);
/* The same for several kernels of one target kind (a graph): each job gets its starting point
 * as htam_search_hook's, then htam_tasks spends `trials` (0: 32 per kernel) and `seconds`
 * over them with one memory, loaded and saved through the store io. */
int htam_search_tasks(tune_task *tasks, int n, int trials, double seconds, uint64_t seed,
                      tlm_error *err);

#endif
