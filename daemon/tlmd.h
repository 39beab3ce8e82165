/* tlmd.h — the compile server's shared state and the interfaces between its files.
 *
 * Threads (DESIGN §9):
 *  - the LOOP thread runs one libuv loop that owns libmicrohttpd (no internal MHD thread),
 *    every connection, every job and flight, the metrics' non-atomic counters and the list
 *    of jobs. Unless a function says otherwise, it may only be called on the loop thread.
 *  - the DECODER thread owns the tlm_decoder and batches every pending decode; it talks to
 *    the loop only through dec_submit (in) and srv_post (out: a mutex-protected queue plus
 *    uv_async_send, drained whole by the loop).
 *  - libuv POOL threads run store lookups/inserts, codegen and compilation (uv_queue_work);
 *    their after-callbacks run on the loop thread. Each thread uses its own SQLite
 *    connection (store.h does that).
 * Files: main.c (config, logging, start-up, signals, shutdown, sd_notify), http.c (MHD
 * driven by the loop, requests, responses, streams), routes.c (the API), jobs.c (compile
 * jobs, single flight, pool work), decoder.c, metrics.c.
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

#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/tlm/select.h"
#include "compiler/tlm/tlm.h"
#include "compiler/util/err.h"
#include "store/store.h"

#define TLMD_VERSION "0.1.0"

/* ---- logging (any thread) ---- */
enum { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };
/* One line: ts=... level=... msg=EVENT then the formatted key=value pairs. */
void tlmd_log(int level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int tlmd_log_level_parse(const char *s);
int tlmd_log_reopen(void);

/* ---- configuration (process-wide, written before the loop starts) ---- */
typedef struct tlmd_config {
    char listen_addr[64];
    int port;
    char store_path[1024];
    char weights[1024];
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
} tlmd_config;

/* ---- the loop's message queue (srv_post: any thread) ---- */
typedef struct tlmd_msg {
    void (*fn)(void *arg);
    void *arg;
    struct tlmd_msg *next;
} tlmd_msg;

struct http_req;
struct job;

typedef struct tlmd_server {
    tlmd_config cfg;
    uv_loop_t *loop;
    struct MHD_Daemon *mhd;
    int listen_fd_activated; /* from systemd, -1 if none */
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    uv_async_t async;
    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t watchdog;
    uv_timer_t shutdown_timer;
    bool in_mhd, need_kick;
    pthread_mutex_t q_mu;
    tlmd_msg *q_head, *q_tail;
    store *st;
    tlm_model *model;
    char model_id[65];
    char vocab_hash[65];
    bool weights_trained;
    char cc_key[768], nvrtc_key[768];
    char *targets_json;
    char **tokens;
    int n_tokens;
    bool ready, shutting_down, stopped;
    double shutdown_started;
    uint64_t next_job_id;
    int jobs_in_flight;
    struct job *jobs; /* recent jobs, newest first */
    int n_jobs;
    struct http_req *reqs; /* live requests (to resume them all at shutdown) */
} tlmd_server;

extern tlmd_server g_srv;

void srv_post(void (*fn)(void *), void *arg); /* any thread */
void srv_kick(void);                          /* run MHD now (or after the current run) */
double tlmd_now(void);                        /* monotonic seconds */
double tlmd_wall(void);                       /* Unix time, seconds */
void srv_shutdown_begin(const char *why);

/* ---- http.c ---- */
typedef struct http_req {
    struct MHD_Connection *conn;
    char method[16];
    char *url;
    int route; /* metrics label index */
    char *body;
    size_t len, cap;
    bool too_large;
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

int http_start(tlmd_server *s, tlm_error *err);
void http_stop(tlmd_server *s);
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
void http_fail_all(void);
unsigned http_connections(void);

/* ---- routes.c ---- */
void routes_begin(http_req *r);    /* headers known: method/route/auth/type/length checks */
void routes_dispatch(http_req *r); /* body complete */
int routes_load_tokens(tlmd_server *s, tlm_error *err);
int routes_label_count(void);
const char *routes_label(int i);

/* ---- jobs.c ---- */
typedef enum { MODE_GENERATE, MODE_TOPK } tlmd_mode;
typedef struct job_params {
    target tgt;
    tlmd_mode mode;
    int k;
    bool stream, include_binary;
    int n;
    ir_workload *wl; /* n, owned by the job after job_start */
    /* graph and model requests (NULL for "workloads"): per workload, its kernel launches in
     * the network and the anchor node of its first occurrence; and the summary of the network
     * {"kind": "graph"|"model", "name", "subgraphs", "launches", "flops", "macs", "fuse_s"}
     * that the answer, the accepted and the done events carry. Owned like wl. */
    int64_t *occ;
    char (*node)[64];
    json_t *model;
} job_params;
/* Starts a compile job answering r; takes p->wl, p->occ, p->node, p->model. Replies itself
 * on errors. */
void job_start(http_req *r, job_params *p);
/* Frees what p owns (for a request that never reaches job_start). */
void job_params_free(job_params *p);
json_t *job_lookup_json(const char *id, bool *found);
int job_cancel(const char *id); /* 0, TLM_ENOTFOUND */
void jobs_fail_all(const char *why);
int jobs_flights_in_flight(void);

/* ---- decoder.c ---- */
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
int dec_start(tlmd_server *s, tlm_error *err);
int dec_submit(dec_item *it); /* any thread; TLM_EUNSUPPORTED once stopped */
void dec_stop(void);
int dec_queue_depth(void); /* any thread */

/* ---- metrics.c ---- */
void metrics_request(int route, int status);
void metrics_batch(int size); /* decoder thread */
void metrics_compile_seconds(double s);
void metrics_cache(bool hit);
void metrics_compile_done(void);
uint64_t metrics_compiles(void);
uint64_t metrics_cache_hits(void);
uint64_t metrics_cache_misses(void);
uint64_t metrics_single_flight(void);
void metrics_single_flight_join(void);
char *metrics_render(const store_stats *ss); /* malloc'ed Prometheus text */

#endif
