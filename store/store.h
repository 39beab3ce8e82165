/* store.h — the kernel cache, measurement records and tuner memory, in SQLite.
 *
 * Contract:
 * - One file on disk (never ":memory:"), in WAL mode with synchronous=NORMAL, foreign keys
 *   on and a busy timeout. A process crash (kill -9) never loses a committed write and never
 *   corrupts the file; a power loss may lose the last transactions but not consistency.
 * - Threads: every SQLite connection belongs to one thread. Each function below that takes a
 *   `store *` runs on the calling thread's own connection, opened on first use
 *   (store_conn_get), closed when the thread exits or at store_close, whichever comes first.
 *   So any thread may call any function here concurrently with others, EXCEPT:
 *   store_open and store_close, which must not overlap with any other call on the same store
 *   (open before the workers start, close after they stopped using it; they may still be
 *   alive). Several processes may open the same file; SQLite serialises their writers.
 *   A forked child must not touch a store its parent opened (SQLite connections do not
 *   survive fork); it may store_open its own.
 * - Writers take the write lock up front (BEGIN IMMEDIATE) and wait up to busy_timeout_ms for
 *   it, so concurrent writers queue instead of failing with SQLITE_BUSY.
 * - A kernel is served only if its blob still matches the SHA-256 recorded at insert time; a
 *   mismatch counts as a miss (and as `corrupt`), and the row is deleted.
 * - Size bound: the sum of binary + source bytes over all kernels stays <= max_bytes; each
 *   insert evicts the least recently used kernels (oldest last_used_at, then fewest hits).
 * - Single flight for concurrent identical compiles is the daemon's job, not the store's.
 * - Timestamps (created_at, last_used_at) are Unix time in MICROseconds, strictly increasing
 *   within one process, so the LRU order of two quick successive uses is never a tie.
 * - Strings read back are heap copies owned by the caller (NULL where the column is NULL);
 *   times that were never set read back as NAN.
 */
#ifndef TLM_STORE_STORE_H
#define TLM_STORE_STORE_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#include "compiler/util/err.h"

/* The schema version this build creates and migrates to. Table `schema_version` holds one
 * row (version INTEGER PRIMARY KEY, applied_at INTEGER) per applied migration; the current
 * version is the largest. A file with a newer version is refused and its tables left alone. */
#define STORE_SCHEMA_VERSION 2

typedef struct store store;
typedef struct store_conn store_conn;

typedef struct store_opts {
    int64_t max_bytes;   /* bound on binary+source bytes of all kernels; 0 = unbounded */
    int busy_timeout_ms; /* how long a writer waits for the lock; 0 = 10000 */
    /* store_kernel_get records a use (hits, last_used_at) in memory instead of writing it:
     * a hit then never takes the write lock (never waits behind a writer or a checkpoint).
     * The uses reach the file with store_touch_flush, before every store_kernel_put (so
     * eviction sees them) and at store_close; store_kernel_meta counts them already. */
    bool defer_touch;
} store_opts;

/* A cached kernel. As input of store_kernel_put the caller owns every pointer, and
 * binary_sha256, created_at, last_used_at and hits are ignored (the store sets them). As
 * output of store_kernel_get / store_kernel_meta every pointer is the caller's to release
 * with store_kernel_free. */
typedef struct store_kernel {
    char key[65];        /* store_cache_key, 64 lowercase hex digits */
    char *workload_hash; /* required */
    char *target_hash;   /* required */
    char *compiler_id;   /* toolchain identity */
    char *model_id;
    char *workload_json; /* the canonical workload, as sent back to clients */
    char *target_name;   /* e.g. "cuda:sm_90" */
    char *schedule;      /* the schedule, printed */
    char *sentence;      /* the tensor-language sentence the model wrote */
    char *source;        /* C or CUDA C */
    uint8_t *binary;     /* required, binary_size > 0; NULL from store_kernel_meta */
    size_t binary_size;
    char binary_sha256[65]; /* hex; computed by the store */
    char *format;           /* required: "elf-so" | "cubin" */
    char *entry;            /* required: the entry symbol */
    char *launch_json;      /* launch configuration (grid/block/smem), JSON */
    char *schedule_source;  /* where the schedule came from: "default", "tlm", "topk", "given",
                             * "tuned", "htam"; rows from before schema 2 (NULL) read back as
                             * "unknown" */
    double est_time_s;      /* NAN when unknown */
    double measured_time_s; /* NAN when unknown */
    int64_t created_at;     /* µs since the epoch */
    int64_t last_used_at;   /* µs since the epoch */
    int64_t hits;
} store_kernel;

/* One measured (or failed) schedule: the training data and the tuners' history. Every
 * candidate the pipeline built and measured (not only the winner) gives one, and so does a
 * candidate that failed to build. Optional text fields may be NULL, optional numbers NAN
 * (n_samples 0). Schema 1 rows read back with the fields added in schema 2 NULL / NAN / 0. */
typedef struct store_measurement {
    int64_t id;          /* set by the store */
    char *workload_hash; /* required */
    char *target_hash;   /* required */
    char *sketch;
    char *schedule;  /* required */
    char *status;    /* required: "ok", or why it failed ("wrong", "crash", "timeout",
                      * "load_error", "build_error", ...) */
    double median_s; /* NAN when not timed */
    double gflops;   /* NAN when not timed */
    double rel_err;  /* NAN when not checked */
    /* schema 2: what a trainer or a search needs to use the record without the kernel */
    char *workload_json;   /* the canonical workload (ir_workload_canonical) */
    char *target_name;     /* e.g. "cpu:avx512", "cuda:sm_90" */
    char *toolchain_id;    /* drv_toolchain_key: the compiler that built it */
    char *model_id;        /* the model that proposed it ("none" without one) */
    char *sentence;        /* the decisions as tensor-language text */
    char *schedule_source; /* "default" | "tlm" | "topk" | "given" | "tuned" | "htam" */
    double min_s;          /* fastest sample; NAN when not timed */
    int n_samples;         /* timed samples behind median_s / min_s; 0 when not timed */
    char *host_id;         /* the machine it ran on; NULL on input: store_host_id() */
    char *detail;          /* why it failed, when it did */
    int64_t created_at;    /* set by the store, µs since the epoch */
} store_measurement;

/* This machine's id for measurement records: the first 16 hex digits of SHA-256 over
 * /etc/machine-id (or, without one, the host name). Computed once per process; any thread. */
const char *store_host_id(void);

typedef struct store_stats {
    int64_t kernels;   /* rows in kernels (from SQL) */
    int64_t bytes;     /* binary + source bytes of those rows (from SQL) */
    int64_t max_bytes; /* the bound, 0 = unbounded */
    /* Since store_open, in this process: */
    uint64_t hits, misses, evictions, corrupt;
} store_stats;

/* Opens (creating if needed) the database at `path`, sets WAL mode and brings the schema to
 * STORE_SCHEMA_VERSION inside one transaction. opts may be NULL (defaults). Returns NULL and
 * fills err (field "store.path" for open/permission problems) on failure. */
store *store_open(const char *path, const store_opts *opts, tlm_error *err);

/* Checkpoints the WAL into the main file, closes every connection of every thread and frees
 * the store. See the thread rule above. NULL is a no-op. */
void store_close(store *st);

/* The calling thread's connection, opened on first use (this is where per-connection setup
 * errors surface). Every store_* call does this itself; calling it early only moves the cost
 * and the error to a convenient place (e.g. worker start-up). */
store_conn *store_conn_get(store *st, tlm_error *err);

/* Closes the calling thread's connection now instead of at thread exit. */
void store_conn_release(store *st);

/* key = SHA-256("tlm-key-v1" ‖ len₁ ‖ part₁ ‖ … ‖ len₅ ‖ part₅) as 64 lowercase hex digits,
 * over the parts workload canonical bytes, target (canonical descriptor or its hash),
 * toolchain identity, model id, options that change code; each len is the part's byte length
 * as 8 bytes little-endian, so no two different part lists give the same byte stream (no
 * "ab"+"c" == "a"+"bc"). The first four parts are required; options NULL means "". Changing
 * this layout requires a new "tlm-key-vN" prefix. */
int store_cache_key(const char *workload_canonical, const char *target_canonical_or_hash,
                    const char *toolchain_identity, const char *model_id, const char *options,
                    char out_hex[65], tlm_error *err);

/* SHA-256 of a buffer as 64 lowercase hex digits (what binary_sha256 holds). */
int store_sha256_hex(const void *data, size_t n, char out_hex[65]);

/* Inserts the kernel, replacing any row with the same key (the replacement starts over:
 * new created_at, hits 0). Evicts LRU kernels until the bound holds; a kernel that alone is
 * larger than max_bytes is refused with TLM_ELIMIT. */
int store_kernel_put(store *st, const store_kernel *k, tlm_error *err);

/* A cache lookup: on a hit fills *out (all fields, the blob verified against its SHA-256),
 * increments the row's hits, sets its last_used_at to now, and returns 0. Returns
 * TLM_ENOTFOUND on a miss, including a corrupt row (which is deleted). TLM_EINVAL when key
 * is not 64 hex digits. */
int store_kernel_get(store *st, const char *key, store_kernel *out, tlm_error *err);
/* Writes the uses store_kernel_get recorded in memory (defer_touch), in one transaction.
 * store_touch_pending: how many keys wait (any thread). */
int store_touch_flush(store *st, tlm_error *err);
size_t store_touch_pending(store *st);

/* Everything but the blob (binary NULL, binary_size set); no verification, and it neither
 * counts as a hit or miss nor changes the LRU order. TLM_ENOTFOUND when absent. */
int store_kernel_meta(store *st, const char *key, store_kernel *out, tlm_error *err);

/* Deletes the kernel; TLM_ENOTFOUND when absent. */
int store_kernel_delete(store *st, const char *key, tlm_error *err);

/* Frees the fields of a kernel filled by get/meta and zeroes it. */
void store_kernel_free(store_kernel *k);
/* A deep copy of src into *dst (every string and the blob); TLM_ENOMEM leaves *dst zeroed. */
int store_kernel_copy(store_kernel *dst, const store_kernel *src);
/* A use of key served from a copy the caller holds (tlmd's in-memory hot cache), counted as
 * store_kernel_get counts its hits (hits, last_used_at). Only with defer_touch, in memory,
 * and it never waits (any thread, no SQLite, a try-lock): false when the store does not defer
 * uses, the table of uses waiting for the next flush is full, or another thread holds that
 * table right now; then nothing is recorded (read through store_kernel_get instead). */
bool store_kernel_note_use(store *st, const char *key);

int store_stats_get(store *st, store_stats *out, tlm_error *err);

/* Appends a measurement record; *id_out (may be NULL) receives its id. A NULL host_id is
 * recorded as store_host_id(). */
int store_measurement_add(store *st, const store_measurement *m, int64_t *id_out, tlm_error *err);

/* The up-to-n records with status "ok" and the highest gflops for a workload on a target,
 * best first. *out is an array of *count records (NULL when none), released with
 * store_measurements_free. */
int store_measurements_best(store *st, const char *workload_hash, const char *target_hash, int n,
                            store_measurement **out, size_t *count, tlm_error *err);
/* Every record for a workload on a target (any status), oldest first, at most n. */
int store_measurements_list(store *st, const char *workload_hash, const char *target_hash, int n,
                            store_measurement **out, size_t *count, tlm_error *err);
/* Every record with id > after_id, oldest first, at most n (1..100000): export in pages. */
int store_measurements_page(store *st, int64_t after_id, int n, store_measurement **out,
                            size_t *count, tlm_error *err);
/* Adds a record made elsewhere (an import), keeping its created_at (now when 0) and host_id
 * (this host when NULL), unless the same record — same workload hash, target hash,
 * schedule, status, host and created_at — is there already: then nothing changes and
 * *added (may be NULL) is false. Importing a file twice adds nothing the second time. */
int store_measurement_import(store *st, const store_measurement *m, bool *added, tlm_error *err);
void store_measurements_free(store_measurement *ms, size_t count);
/* One "tlm-records/1" line (a JSON object, json_t from jansson) into *m, whose strings point
 * into o (which must outlive m); the canonical workload, when present, into *wl_text (the
 * caller frees it). Returns NULL, or the name of the field that is missing or invalid. */
#define STORE_RECORDS_FORMAT "tlm-records/1"
struct json_t;
const char *store_measurement_from_json(const struct json_t *o, store_measurement *m,
                                        char **wl_text);

/* The storable records j->recs[from, to) of a pipeline job (measured candidates and build
 * failures; pl_record_storable) as measurements, with the job's workload, target, toolchain
 * and the given model id ("none" when NULL). Each is committed on its own, so what was
 * stored survives a crash of the caller. *stored (may be NULL) counts them. Returns 0, or the
 * first error (the others are still tried). */
struct pl_job;
int store_pl_records(store *st, const struct pl_job *j, int from, int to, const char *model_id,
                     int *stored, tlm_error *err);

/* ---- tuner memory (HTAM, compiler/tune/htam.c) ----
 * Rows of tuner_nodes / tuner_edges under a scope (the workload_hash column: "htam" for the
 * shared memory) and a target (the target_hash column: a target kind, "cpu" or "cuda"). The
 * payload is the tuner's JSON. On load, ids are row ids (parent: a node's parent row, 0 for
 * none; edges: parent = from, child = to). On replace, parent and child are 1-based indices
 * into the given nodes (0: none): the whole scope is rewritten in one transaction. */
typedef struct store_tuner_row {
    int64_t id;
    int64_t parent, child;
    char *kind;
    char *payload;
    double score;
} store_tuner_row;
int store_tuner_load(store *st, const char *scope, const char *target, store_tuner_row **nodes,
                     size_t *n_nodes, store_tuner_row **edges, size_t *n_edges, tlm_error *err);
int store_tuner_replace(store *st, const char *scope, const char *target,
                        const store_tuner_row *nodes, size_t n_nodes, const store_tuner_row *edges,
                        size_t n_edges, tlm_error *err);
void store_tuner_rows_free(store_tuner_row *rows, size_t n);
/* The HTAM memory document ("tlm-htam/1", compiler/tune/htam.h) for a target kind ("cpu",
 * "cuda") from / into these tables (scope "htam"); *doc is NULL when none is stored. The
 * store_io pair htam_set_store_io takes (st is a store *). */
typedef struct json_t json_t;
int store_htam_load(void *st, const char *target, json_t **doc, tlm_error *err);
int store_htam_save(void *st, const char *target, const json_t *doc, tlm_error *err);

/* Small key/value settings in table meta. get returns TLM_ENOTFOUND when absent; *value is
 * the caller's to free. */
int store_meta_set(store *st, const char *key, const char *value, tlm_error *err);
int store_meta_get(store *st, const char *key, char **value, tlm_error *err);

#endif
