/* cluster.h — measurements spread over the daemons that share a Redis (DESIGN §14).
 *
 * cluster_measure("measure these N candidates") is the transport a measured search (the
 * tuner, compiler/tune) uses to spend a budget on N machines instead of one:
 *
 *   requester: XADD one entry per candidate to <ns>:v1:measure:<target name> (a Redis Stream
 *              with the consumer group "tlmd-workers"), then collects results from the list
 *              <ns>:v1:mres:<job> until all are in or the deadline passes; every result is
 *              written to the requester's store (store_measurement_add, with the worker's
 *              host id and toolchain), whoever measured it.
 *   workers:   every tlmd with --redis runs cluster workers (redis_workers, default 1) that
 *              XREADGROUP only the streams of targets this host can run
 *              (target_host_can_run), measure the candidate through the pipeline (pl_prepare
 *              PL_MODE_GIVEN with the schedule, PL_MEASURE_ON, pl_finish; the pl_record is
 *              the result), RPUSH it to the job's list, XACK and XDEL the entry.
 *   dead worker: its entries stay pending in the group; any worker XAUTOCLAIMs entries idle
 *              longer than redis_claim_idle_ms and measures them. Results are keyed by the
 *              candidate's index, so a duplicate (a slow worker, not a dead one) is ignored.
 *   no Redis:  (c NULL, L2 down, or down for more than a few seconds mid-run) the requester
 *              measures what is left itself, on the calling thread: a tune never fails
 *              because the cluster tier did.
 *
 * Threads: cluster_measure blocks the calling thread (a compile-pool thread or a tuner's own;
 * never the loop) until done or deadline_s (seconds from now). Any number of calls may run
 * at once.
 */
#ifndef TLMD_CLUSTER_H
#define TLMD_CLUSTER_H

#include <stdbool.h>

#include "compiler/util/err.h"
#include "daemon/l2.h"
#include "store/store.h"

typedef struct cluster cluster;

typedef struct cluster_cand {
    const char *workload_json; /* proto_workload JSON (DESIGN §10 workload), required */
    const char *target;        /* target string ("cpu:avx2", "cuda:sm_90", ...), required */
    const char *schedule;      /* space_print form ("tile.i.3=16 ... unroll=64"), required */
    uint32_t const_args;       /* inputs timed packed once (measure_opts.const_args), or 0 */
} cluster_cand;

typedef struct cluster_result {
    /* "ok" | "wrong" | "crash" | "timeout" | "load_error" | "build_error" (the pipeline's),
     * "invalid" (the candidate did not parse: detail says why), "unmeasured" (no worker
     * answered before the deadline) */
    char status[16];
    double median_s, min_s, gflops, rel_err; /* NAN when not timed / not checked */
    int n_samples;
    char worker[128]; /* l2_owner_id of the daemon that measured it ("local" without Redis) */
    char host_id[32];
    char detail[256];
} cluster_result;

/* Starts cfg->workers worker threads on l (NULL l: a cluster that measures locally only).
 * st: the store this daemon writes records to. */
int cluster_new(l2 *l, store *st, cluster **out, tlm_error *err);
void cluster_free(cluster *c); /* stops and joins the workers; NULL is a no-op */
/* Shutdown: cluster_measure calls in progress stop waiting (what is missing is "unmeasured")
 * and workers stop taking entries. Any thread; NULL is a no-op. */
void cluster_abort(cluster *c);

/* Measures cands[0..n) across the cluster; out[i] is cands[i]'s result. Returns 0 when every
 * candidate has a result (whatever its status), TLM_ELIMIT when the deadline left some
 * "unmeasured", TLM_EINVAL (field "candidates[i].target" / ".workload") for a candidate that
 * names no valid target or workload (nothing is sent then). c may be NULL: all local. When
 * st is not NULL every measured result becomes a record in it. */
int cluster_measure(cluster *c, const cluster_cand *cands, int n, cluster_result *out,
                    double deadline_s, store *st, tlm_error *err);

/* The tuner's evaluator over the cluster (tune_set_default_eval; user = the cluster):
 * candidates idx[0..n) of j measured by whichever daemons serve j's target, each result a
 * record in the cluster's store (so not in j->recs). */
struct pl_job;
int cluster_tune_eval(struct pl_job *j, const int *idx, int n, double *secs, void *user,
                      tlm_error *err);
/* Measures one candidate on this thread (what a worker does). */
void cluster_measure_local(const cluster_cand *cand, cluster_result *out);

#endif
