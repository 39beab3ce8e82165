/* tlmd.h — the compile server's modules and the interfaces between them.
 *
 * State: no global server object. main.c builds, before the loop starts,
 *  - a tlmd_env: the configuration and everything decided at start-up (the served model,
 *    identities, targets, tokens, the store handle, the loop). It is read-only afterwards,
 *    so any thread may read it; every module gets a const pointer to it;
 *  - one state object per module, handed to the modules that talk to it: http_server
 *    (http.c), routes (routes.c), jobs (jobs.c), dec (decoder.c), metrics (metrics.c), and
 *    main's own lifecycle (tlmd_status) and inbox (tlmd_inbox).
 * The logger is the one process-wide facility (tlmd_log; main.c sets it up).
 *
 * Threads (DESIGN §9):
 *  - the LOOP thread runs one libuv loop that owns libmicrohttpd (no internal MHD thread),
 *    every connection, every job and flight, the metrics' non-atomic counters and the list
 *    of jobs. Unless a function says otherwise, it may only be called on the loop thread.
 *  - the DECODER thread owns the tlm_decoder and batches every pending decode; it talks to
 *    the loop only through dec_submit (in) and tlmd_post (out: a mutex-protected queue plus
 *    uv_async_send, drained whole by the loop).
 *  - libuv POOL threads run store reads (kernel lookups, GET /v1/kernels, stats) with
 *    uv_queue_work; the COMPILE POOL threads (pool.c, compile_workers of them) run the
 *    pipeline and the store inserts, so a read never waits behind a compile. Completions of
 *    both run on the loop thread. Each thread uses its own SQLite connection (store.h).
 *  - the SIGNAL thread takes SIGTERM/SIGINT/SIGHUP with sigwait and posts them to the loop.
 * Files: main.c (config, logging, start-up, signals, shutdown, sd_notify), http.c (MHD
 * driven by the loop, requests, responses, streams), routes.c (the API, a route table),
 * request.c (the compile request's decoder), jobs.c (compile jobs, single flight, the
 * pipeline on the compile pool), pool.c, decoder.c, metrics.c, l2.c (the Redis tier: L2
 * kernels, compile leases), cluster.c (measurements spread over the daemons).
 */
#ifndef TLMD_H
#define TLMD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>
#include <uv.h>

#include "compiler/driver/pipeline.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/tlm/select.h"
#include "compiler/tlm/tlm.h"
#include "compiler/tlm/tlm_cuda.h"
#include "compiler/util/err.h"
#include "daemon/cluster.h"
#include "daemon/l2.h"
#include "store/store.h"

#define TLMD_VERSION "0.1.0"

/* ---- logging (any thread) ---- */
enum { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };
/* One line: ts=... level=... msg=EVENT then the formatted key=value pairs. */
void tlmd_log(int level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tlmd_log_level_parse(const char *s);
/* Opens (or reopens, for SIGHUP) file as the log; NULL or "" logs to stderr. */
int tlmd_log_open(int level, const char *file);
double tlmd_now(void);  /* monotonic seconds (any thread) */
double tlmd_wall(void); /* Unix time, seconds (any thread) */

/* ---- configuration: defaults < config file < TLMD_* environment < flags ---- */
typedef struct tlmd_config {
    char listen_addr[64];
    int port; /* the bound port once listening (0 asks for any) */
    char store_path[1024];
    char weights[1024];    /* a weight file, or "none" */
    char weights_from[64]; /* who set it: "default", "--weights", "TLMD_WEIGHTS", "config" */
    bool serve_untrained;  /* serve weights whose MANIFEST does not say trained */
    char device[32];
    char token_file[1024];
    char log_file[1024];
    int log_level;
    size_t max_body;      /* bytes of a request body (413 above) */
    int max_jobs;         /* jobs in flight (429 above) */
    int max_workloads;    /* per request */
    int max_candidates;   /* topk k */
    double job_timeout_s; /* every job's deadline */
    double grace_s;       /* shutdown grace period */
    int64_t store_max_bytes;
    int decoder_slots;
    /* connections (http.c): how many at once (0: sized from RLIMIT_NOFILE), per client
     * address, and how long a request head, a body, an idle keep-alive connection may take */
    int max_connections;
    int max_connections_per_ip;
    double header_timeout_s, body_timeout_s, idle_timeout_s;
    int compile_workers; /* threads of the compile pool (jobs.c) */
    int compile_nice;    /* their nice value (and their compilers' and runners'): hits first */
    l2_config l2;        /* the cluster tier (l2.h): redis, redis_* keys */
    size_t hot_cache_bytes; /* hot.c: kernels served from memory on the loop (0: off) */
} tlmd_config;

/* ---- hot.c: the hot-kernel cache (loop thread only) ---- */
typedef struct hot hot;
typedef struct hot_stats {
    size_t entries, bytes, max_bytes;
    uint64_t hits, misses, evicted;
} hot_stats;
hot *hot_new(size_t max_bytes); /* NULL when max_bytes is 0 (every call takes a NULL cache) */
/* The kernel under key (valid until the next hot_put or hot_free), or NULL. */
const store_kernel *hot_get(hot *h, const char *key);
/* Keeps a copy of k (a verified kernel with its blob); the least recently used go. */
void hot_put(hot *h, const store_kernel *k);
void hot_stats_get(const hot *h, hot_stats *s);
void hot_free(hot *h);

/* ---- the environment: read-only once the loop runs (any thread) ---- */
typedef struct tlmd_env {
    tlmd_config cfg;
    uv_loop_t *loop;
    store *st;   /* thread-safe: every thread gets its own connection */
    l2 *l2;      /* the Redis tier, NULL without --redis (l2.h: any thread but the loop) */
    cluster *cl; /* distributed measurement (cluster.h); local-only without --redis */
    hot *hot;    /* the hot-kernel cache (hot.c; loop thread only; NULL when off) */
    /* The schedules served: with a model, generate decodes with it ("tlm"); without one
     * (--weights none, a missing default file, untrained weights without --serve-untrained)
     * generate serves space_default. */
    const tlm_model *model; /* the served model, NULL when serving default schedules */
    char model_id[65];      /* the served model's id (its file's SHA-256; with a decoding
                             * prior, SHA-256 of "<sha>:prior=<x>"), or "none" */
    double weights_prior;   /* the served model's prior on the default schedule (MANIFEST) */
    char schedules_reason[1400];
    char weights_loaded[1024]; /* the weight file that was read ("" when none) */
    char weights_sha[65];      /* its SHA-256 ("" when none) */
    tlm_config weights_cfg;    /* its configuration (zero when none) */
    uint64_t weights_params;
    bool weights_trained;
    char vocab_hash[65];
    /* Where the decoder runs: device_id "cpu" | "cuda:N", with the full name and why. The
     * device itself belongs to the decoder thread once it runs. */
    tlm_device *dev;
    char device_id[32];
    char device_name[192];
    char device_reason[700];
    char cc_key[768], nvrtc_key[768]; /* toolchain identities, computed once at start-up */
    char *targets_json;               /* GET /v1/targets */
    char **tokens;                    /* bearer tokens; none: no authentication */
    int n_tokens;
} tlmd_env;

/* ---- main.c: the loop's inbox and the server's lifecycle ---- */
typedef struct tlmd_inbox tlmd_inbox;
/* Runs fn(arg) on the loop thread soon (any thread). */
void tlmd_post(tlmd_inbox *q, void (*fn)(void *), void *arg);

typedef struct tlmd_status {
    bool ready;         /* started, not yet shutting down: /readyz */
    bool shutting_down; /* new compiles are refused with 503 */
} tlmd_status;

/* ---- metrics.c (counters fed by any thread unless said otherwise) ---- */
typedef struct metrics metrics;
typedef struct metrics_gauges {
    int jobs_in_flight, flights_in_flight, decoder_queue_depth;
    unsigned connections, connections_waiting_head;
    uint64_t connections_refused;
} metrics_gauges;
/* labels: the route label of each route index (kept, not copied). */
metrics *metrics_new(const char *const *labels, int n_labels);
void metrics_free(metrics *m);
void metrics_request(metrics *m, int route, int status);      /* loop thread */
void metrics_answer_seconds(metrics *m, int route, double s); /* loop thread */
void metrics_loop_busy(metrics *m, double s);                 /* loop thread */
void metrics_batch(metrics *m, int size);
void metrics_compile_seconds(metrics *m, double s);
void metrics_cache(metrics *m, bool hit);
void metrics_compile_done(metrics *m);
void metrics_records(metrics *m, int n); /* measurement records written */
void metrics_single_flight_join(metrics *m);
uint64_t metrics_compiles(const metrics *m);
uint64_t metrics_cache_hits(const metrics *m);
uint64_t metrics_cache_misses(const metrics *m);
uint64_t metrics_single_flight(const metrics *m);
uint64_t metrics_records_total(const metrics *m);
/* malloc'ed Prometheus text (loop thread) */
char *metrics_render(const metrics *m, const metrics_gauges *g, const store_stats *ss);

/* Prometheus text grown in a malloc'ed buffer, shared by the /metrics renderers (metrics.c,
 * l2.c). p is NULL once an allocation failed: the text is lost and later appends do nothing. */
typedef struct metrics_text {
    char *p;
    size_t len, cap;
} metrics_text;
void metrics_text_printf(metrics_text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* One histogram series, without its HELP/TYPE lines: name_bucket{labels,le="…"} (cumulative)
 * for the n bounds le and +Inf, then name_sum{labels} and name_count{labels}. labels: "" for
 * none, else e.g. route="compile". bucket: n + 1 per-bucket counts (the last is above le[n-1]),
 * read with relaxed atomic loads, so counters fed by other threads are passed as they are; NULL:
 * all zero. sum is printed with sum_decimals digits after the point (0 for integer sums). */
void metrics_text_histogram(metrics_text *t, const char *name, const char *labels, const double *le,
                            int n, const uint64_t *bucket, double sum, int sum_decimals,
                            uint64_t count);

/* ---- http.c ---- */
typedef struct http_server http_server;
typedef struct http_req {
    http_server *srv;
    struct MHD_Connection *conn;
    char method[16];
    char *url;
    int route;       /* the route table's index (metrics label) */
    const char *arg; /* the key or job id inside url (routes_begin) */
    size_t arg_len;
    char *body;
    size_t len, cap;
    bool too_large;
    double t_begin;     /* when the headers were complete (the body's deadline counts from it) */
    int pending_status; /* an error decided before the body was read */
    json_t *pending_body;
    bool dispatched, suspended;
    struct MHD_Response *resp;
    int status;
    /* NDJSON stream */
    bool streaming, stream_end;
    char *sbuf;
    size_t slen, spos, scap;
    /* work in flight that will answer this request (detached at close) */
    struct job *job;
    void *op;
    void (*detach)(struct http_req *r);
    struct http_req *prev, *next;
} http_req;

/* What http.c calls for every request: begin when the headers are known (may set
 * r->pending_status to answer before the body), dispatch when the body is complete. */
typedef struct http_handlers {
    void (*begin)(void *arg, http_req *r);
    void (*dispatch)(void *arg, http_req *r);
    void *arg;
} http_handlers;

http_server *http_new(const tlmd_env *env, metrics *m);
/* Listens (or takes the socket systemd passed) and runs MHD from env->loop. */
int http_start(http_server *h, const http_handlers *hd, tlm_error *err);
int http_port(const http_server *h); /* the bound port */
bool http_socket_activated(const http_server *h);
/* Stops accepting new connections (shutdown); answers in progress continue. */
void http_quiesce(http_server *h);
void http_stop(http_server *h);
void http_free(http_server *h);
/* Runs MHD now (or after the current run, when called from inside one). */
void http_kick(http_server *h);
/* Responses (loop thread). A suspended request is resumed. Takes the json reference. */
void http_reply_json(http_req *r, int status, json_t *body);
void http_reply_error(http_req *r, int status, const char *code, const char *msg,
                      const char *field);
void http_reply_tlm_error(http_req *r, const tlm_error *err);
void http_reply(http_req *r, int status, const char *ctype, const void *data, size_t len,
                const char *const *headers /* name, value, ..., NULL */);
void http_suspend(http_req *r);
/* NDJSON: starts a chunked 200 response; lines are appended as they come. */
void http_stream_start(http_req *r);
void http_stream_line(http_req *r, json_t *event); /* takes the reference */
void http_stream_end(http_req *r);
const char *http_header(http_req *r, const char *name);
/* Resumes every suspended request with 503 (shutdown). */
void http_fail_all(http_server *h);
unsigned http_connections(const http_server *h);      /* MHD's */
unsigned http_door_connections(const http_server *h); /* waiting for their request head */
unsigned http_client_connections(const http_server *h); /* client sockets the door holds */
uint64_t http_refused(const http_server *h);          /* refused over a connection limit */

/* ---- pool.c: the compile pool (reads and hits stay on libuv's pool) ---- */
typedef struct pool pool;
typedef struct pool_work {
    void (*work)(struct pool_work *w); /* on a pool thread */
    void (*done)(struct pool_work *w); /* then on the loop thread */
    void *data;
    struct pool_work *next; /* pool-private */
    bool posted;            /* pool-private */
} pool_work;
/* n_threads at nice value nice (0: as the process; the children they start inherit it). */
pool *pool_new(uv_loop_t *loop, int n_threads, int nice);
void pool_submit(pool *p, pool_work *w);
int pool_queued(pool *p); /* waiting for a thread (any thread) */
/* From inside a running work(): w->done runs on the loop thread, before the running work's
 * own done (completions are delivered in order). w->work is not called. */
void pool_post(pool *p, pool_work *w);
/* After the loop ended (nothing pending): joins the threads, closes the async handle (the
 * loop runs once more to close it); pool_free after that. */
void pool_stop(pool *p);
void pool_free(pool *p);

/* ---- head.c: a request head against RFC 9112 (any thread) ---- */
/* Limits of a first request head (the front door's; MHD gets room for more). */
#define HEAD_MAX 16384
#define TARGET_MAX 8192
#define FIELDS_MAX 100
/* p, n: the head; complete: it runs through the blank line (else only the lines that are
 * complete are judged: a head over HEAD_MAX). Returns 0, or the HTTP status to answer with,
 * *code (a PROTO_CODE_*) and msg saying why. */
int http_head_check(const char *p, size_t n, bool complete, const char **code, char *msg,
                    size_t cap);
/* The same, and how the body of a good complete head is framed (RFC 9112 6.3). */
typedef struct http_frame {
    bool chunked;       /* Transfer-Encoding: chunked */
    uint64_t length;    /* Content-Length (0 without one) */
    const char *target; /* the request target, inside the head */
    size_t target_len;
} http_frame;
int http_head_parse(const char *p, size_t n, bool complete, http_frame *f, const char **code,
                    char *msg, size_t cap);

/* ---- decoder.c ---- */
typedef struct dec dec;
typedef struct dec_item {
    const space *sp;
    int k;                /* beam width, 1 = greedy */
    tlm_candidate *cands; /* k, filled by the decoder */
    int n_cands;
    int rc;
    tlm_error err;
    double t_submit, t_start, t_done;
    void (*done)(void *user); /* posted to the loop when finished */
    void *user;
    /* decoder-private */
    tlm_select_ctx *ctx;
    tlm_request req;
    int slot;
    struct dec_item *next;
} dec_item;
/* Starts the decoder thread on env->model (required) and env->dev; completions go to q. */
int dec_start(const tlmd_env *env, metrics *m, tlmd_inbox *q, dec **out, tlm_error *err);
int dec_submit(dec *d, dec_item *it); /* any thread; TLM_EUNSUPPORTED once stopped */
/* Active decodes run to completion (they are short); queued ones fail. Joins the thread. */
void dec_stop(dec *d);
void dec_free(dec *d);       /* after dec_stop; NULL is a no-op */
int dec_queue_depth(dec *d); /* any thread; 0 for NULL */

/* ---- jobs.c ---- */
typedef struct jobs jobs;
typedef struct job_params {
    target tgt;
    const char *mode_name; /* as requested: "generate" | "default" | "topk" | "tune" (static) */
    pl_mode mode;          /* what the pipeline runs (generate: TLM with a model, else DEFAULT) */
    int k;                 /* TOPK candidates */
    int trials;            /* TUNE budget (0: the search's default) */
    double seconds;
    char strategy[32];
    bool stream, include_binary;
    int n;
    ir_workload *wl; /* n, owned by the job after job_start */
    /* graph and model requests (NULL for "workloads"): per workload, its kernel launches in
     * the network and the anchor node of its first occurrence; and the summary of the network
     * {"kind": "graph"|"model", "name", "subgraphs", "launches", "flops", "macs", "fuse_s"}
     * that the answer, the accepted and the done events carry. Owned like wl. */
    int64_t *occ;
    char (*node)[64];
    /* graph and model requests: per workload, the inputs bound to params in every launch
     * (fe_subgraph.const_args), measured packed once as the plan runs them; NULL otherwise */
    uint32_t *consts;
    json_t *model;
    /* graph and model requests: the execution plan (fe_plan_to_json; proto/graph.md); the
     * answer and the done event carry it with each launch's "kernel" key and "launch" filled
     * in from the kernels. Owned like wl. */
    json_t *plan;
} job_params;
/* d may be NULL (no model served: nothing is decoded); cp runs the compiles. */
jobs *jobs_new(const tlmd_env *env, dec *d, metrics *m, http_server *h, pool *cp);
void jobs_free(jobs *js); /* after the loop ended */
/* Starts a compile job answering r; takes p->wl, p->occ, p->node, p->model, p->plan. Replies itself
 * on errors. */
void job_start(jobs *js, http_req *r, job_params *p);
/* Frees what p owns (for a request that never reaches job_start). */
void job_params_free(job_params *p);
json_t *job_lookup_json(jobs *js, const char *id, bool *found);
int job_cancel(jobs *js, const char *id); /* 0, TLM_ENOTFOUND */
void jobs_fail_all(jobs *js, const char *why);
int jobs_in_flight(const jobs *js);
int jobs_flights_in_flight(const jobs *js);

/* ---- request.c: POST /v1/compile's body (any thread) ---- */
/* Decodes body (len bytes; accept: the Accept header or NULL) into *p (zeroed by the caller);
 * on failure e names the field and p owns nothing. */
int request_decode_compile(const tlmd_env *env, const char *body, size_t len, const char *accept,
                           job_params *p, tlm_error *e);

/* ---- routes.c ---- */
typedef struct routes routes;
routes *routes_new(const tlmd_env *env, const tlmd_status *status, jobs *js, dec *d, metrics *m);
void routes_free(routes *rt);
void routes_begin(void *rt, http_req *r);    /* http_handlers.begin */
void routes_dispatch(void *rt, http_req *r); /* http_handlers.dispatch */
/* The route labels (metrics), one per route index, "unknown" last. */
int routes_label_count(void);
int routes_label_of(const char *target, size_t len); /* the route of a request target */
const char *const *routes_labels(void);

#endif
