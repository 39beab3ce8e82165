/* store.c — SQLite kernel cache. See store.h for the contract.
 *
 * Thread-local connections: a single process-wide pthread key holds, per thread, a small
 * table of (store id, connection). Store ids come from a counter and are never reused, so a
 * slot left behind by a closed store can never be mistaken for a live one (a per-store
 * pthread key could be: keys are recycled after pthread_key_delete, with old values still
 * set in other threads). Every live store keeps a list of its connections; the thread-exit
 * destructor and store_close both take g_mu, so a connection is closed exactly once, by
 * whichever comes first.
 */
#include "store/store.h"
#include "compiler/util/util.h"

#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    ST_BEGIN,
    ST_COMMIT,
    ST_ROLLBACK,
    ST_PUT,
    ST_GET,
    ST_META,
    ST_TOUCH,
    ST_DELETE,
    ST_DELETE_ROW,
    ST_TOTAL,
    ST_LRU,
    ST_MEAS_ADD,
    ST_MEAS_BEST,
    ST_MEAS_LIST,
    ST_MEAS_PAGE,
    ST_MEAS_FIND,
    ST_META_GET,
    ST_META_SET,
    ST__COUNT
};

#define KERNEL_COLS                                                                                \
    "key, workload_hash, target_hash, compiler_id, model_id, workload_json, target_name, "         \
    "schedule, sentence, source, binary_sha256, binary_size, format, entry, launch_json, "         \
    "est_time_s, measured_time_s, created_at, last_used_at, hits, schedule_source, rowid"

#define MEAS_COLS                                                                                  \
    "id, workload_hash, target_hash, sketch, schedule, status, median_s, gflops, rel_err, "        \
    "created_at, workload_json, target_name, toolchain_id, model_id, sentence, schedule_source, "  \
    "min_s, n_samples, host_id, detail"

static const char *const SQL[ST__COUNT] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_PUT] = "INSERT OR REPLACE INTO kernels (key, workload_hash, target_hash, compiler_id, "
               "model_id, workload_json, target_name, schedule, sentence, source, binary, "
               "binary_sha256, binary_size, format, entry, launch_json, est_time_s, "
               "measured_time_s, bytes, created_at, last_used_at, hits, schedule_source) VALUES "
               "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, "
               "?18, ?19, ?20, ?20, 0, ?21)",
    /* The blob is the last column so the fixed-index reads below stay shared with ST_META. */
    [ST_GET] = "SELECT " KERNEL_COLS ", binary FROM kernels WHERE key = ?1",
    [ST_META] = "SELECT " KERNEL_COLS " FROM kernels WHERE key = ?1",
    [ST_TOUCH] = "UPDATE kernels SET hits = hits + ?3, last_used_at = max(last_used_at, ?2) "
                 "WHERE key = ?1",
    [ST_DELETE] = "DELETE FROM kernels WHERE key = ?1",
    [ST_DELETE_ROW] = "DELETE FROM kernels WHERE key = ?1 AND rowid = ?2 AND created_at = ?3",
    /* Both read only the covering index kernels_lru, never the rows with their blobs. */
    [ST_TOTAL] = "SELECT count(*), coalesce(sum(bytes), 0) FROM kernels",
    [ST_LRU] = "SELECT key, bytes FROM kernels WHERE key <> ?1 "
               "ORDER BY last_used_at, hits, key",
    [ST_MEAS_ADD] = "INSERT INTO measurements (workload_hash, target_hash, sketch, schedule, "
                    "status, median_s, gflops, rel_err, created_at, workload_json, target_name, "
                    "toolchain_id, model_id, sentence, schedule_source, min_s, n_samples, "
                    "host_id, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, "
                    "?13, ?14, ?15, ?16, ?17, ?18, ?19)",
    [ST_MEAS_BEST] = "SELECT " MEAS_COLS " FROM measurements "
                     "WHERE workload_hash = ?1 AND target_hash = ?2 AND status = 'ok' "
                     "AND gflops IS NOT NULL ORDER BY gflops DESC, id LIMIT ?3",
    [ST_MEAS_LIST] = "SELECT " MEAS_COLS " FROM measurements "
                     "WHERE workload_hash = ?1 AND target_hash = ?2 ORDER BY id LIMIT ?3",
    [ST_MEAS_PAGE] = "SELECT " MEAS_COLS " FROM measurements WHERE id > ?1 ORDER BY id LIMIT ?2",
    /* an imported record is the same record when it was made by the same host at the same
     * time for the same schedule of the same workload on the same target */
    [ST_MEAS_FIND] = "SELECT id FROM measurements WHERE workload_hash = ?1 AND target_hash = ?2 "
                     "AND schedule = ?3 AND created_at = ?4 AND host_id IS ?5 AND status = ?6 "
                     "LIMIT 1",
    [ST_META_GET] = "SELECT value FROM meta WHERE key = ?1",
    [ST_META_SET] = "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
};

/* Migrations, applied in order, each in the same transaction as its schema_version row.
 * Never edit a shipped step: append a new one. */
static const struct {
    int version;
    const char *sql;
} MIGRATIONS[] = {
    {1,
     /* bytes = binary_size + source bytes: what the size bound counts. It is a column (not
      * computed) so the LRU index can cover it and sums never touch the blobs. */
     "CREATE TABLE kernels ("
     " key TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),"
     " workload_hash TEXT NOT NULL,"
     " target_hash TEXT NOT NULL,"
     " compiler_id TEXT,"
     " model_id TEXT,"
     " workload_json TEXT,"
     " target_name TEXT,"
     " schedule TEXT,"
     " sentence TEXT,"
     " source TEXT,"
     " binary BLOB NOT NULL,"
     " binary_sha256 TEXT NOT NULL,"
     " binary_size INTEGER NOT NULL,"
     " format TEXT NOT NULL CHECK (format IN ('elf-so', 'cubin')),"
     " entry TEXT NOT NULL,"
     " launch_json TEXT,"
     " est_time_s REAL,"
     " measured_time_s REAL,"
     " bytes INTEGER NOT NULL,"
     " created_at INTEGER NOT NULL,"
     " last_used_at INTEGER NOT NULL,"
     " hits INTEGER NOT NULL DEFAULT 0);"
     "CREATE INDEX kernels_lru ON kernels (last_used_at, hits, key, bytes);"
     "CREATE INDEX kernels_workload ON kernels (workload_hash, target_hash);"
     "CREATE TABLE measurements ("
     " id INTEGER PRIMARY KEY AUTOINCREMENT,"
     " workload_hash TEXT NOT NULL,"
     " target_hash TEXT NOT NULL,"
     " sketch TEXT,"
     " schedule TEXT NOT NULL,"
     " status TEXT NOT NULL,"
     " median_s REAL,"
     " gflops REAL,"
     " rel_err REAL,"
     " created_at INTEGER NOT NULL);"
     "CREATE INDEX measurements_best ON measurements (workload_hash, target_hash, gflops);"
     /* HTAM memory: a node is a state of the search (a schedule, a sketch, a decision),
      * parent its tree parent; edges hold extra relations (merges, transfers) between
      * nodes of any tree. payload is JSON. */
     "CREATE TABLE tuner_nodes ("
     " id INTEGER PRIMARY KEY AUTOINCREMENT,"
     " workload_hash TEXT NOT NULL,"
     " target_hash TEXT NOT NULL,"
     " parent INTEGER REFERENCES tuner_nodes (id) ON DELETE CASCADE,"
     " kind TEXT NOT NULL,"
     " payload TEXT,"
     " score REAL,"
     " created_at INTEGER NOT NULL);"
     "CREATE INDEX tuner_nodes_workload ON tuner_nodes (workload_hash, target_hash);"
     "CREATE INDEX tuner_nodes_parent ON tuner_nodes (parent);"
     "CREATE TABLE tuner_edges ("
     " id INTEGER PRIMARY KEY AUTOINCREMENT,"
     " workload_hash TEXT NOT NULL,"
     " target_hash TEXT NOT NULL,"
     " parent INTEGER NOT NULL REFERENCES tuner_nodes (id) ON DELETE CASCADE,"
     " child INTEGER NOT NULL REFERENCES tuner_nodes (id) ON DELETE CASCADE,"
     " kind TEXT NOT NULL,"
     " payload TEXT,"
     " score REAL,"
     " created_at INTEGER NOT NULL);"
     "CREATE INDEX tuner_edges_parent ON tuner_edges (parent);"
     "CREATE INDEX tuner_edges_child ON tuner_edges (child);"
     "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT);"},
    {2,
     /* Where each kernel's schedule came from, and measurement records a trainer or a search
      * can use on their own (which workload, target, compiler, model, sentence, machine).
      * Older rows keep NULL in the new columns. */
     "ALTER TABLE kernels ADD COLUMN schedule_source TEXT;"
     "ALTER TABLE measurements ADD COLUMN workload_json TEXT;"
     "ALTER TABLE measurements ADD COLUMN target_name TEXT;"
     "ALTER TABLE measurements ADD COLUMN toolchain_id TEXT;"
     "ALTER TABLE measurements ADD COLUMN model_id TEXT;"
     "ALTER TABLE measurements ADD COLUMN sentence TEXT;"
     "ALTER TABLE measurements ADD COLUMN schedule_source TEXT;"
     "ALTER TABLE measurements ADD COLUMN min_s REAL;"
     "ALTER TABLE measurements ADD COLUMN n_samples INTEGER;"
     "ALTER TABLE measurements ADD COLUMN host_id TEXT;"
     "ALTER TABLE measurements ADD COLUMN detail TEXT;"
     "CREATE INDEX measurements_workload ON measurements (workload_hash, target_hash, id);"},
};

struct store_conn {
    sqlite3 *db;
    sqlite3_stmt *stmt[ST__COUNT];
    store *owner;
    store_conn *next; /* in owner->conns */
};

struct store {
    uint64_t id;
    char *path;
    store_opts opts;
    store_conn *conns; /* every open connection of this store, all threads; under g_mu */
    store *next;       /* in g_live */
    _Atomic int64_t last_stamp;
    _Atomic uint64_t hits, misses, evictions, corrupt;
    /* uses recorded by store_kernel_get with defer_touch, not yet written; under tmu */
    pthread_mutex_t tmu;
    struct touch {
        char key[65];
        uint32_t n;
        int64_t last;
    } * touches;
    size_t n_touch;
};

#define TOUCH_MAX 4096 /* keys recorded between flushes; past that a use is written at once */

typedef struct tl_slot {
    uint64_t store_id;
    store_conn *conn;
} tl_slot;

typedef struct tl_table {
    size_t n, cap;
    tl_slot *v;
} tl_table;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static store *g_live;          /* open stores; under g_mu */
static uint64_t g_next_id = 1; /* under g_mu */
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static int g_key_rc;

/* ---- small helpers ---------------------------------------------------------------- */

static int sql_err(tlm_error *err, sqlite3 *db, int rc, const char *what)
{
    int code = TLM_EIO;
    int prim = rc & 0xff;
    if (prim == SQLITE_NOMEM) code = TLM_ENOMEM;
    if (prim == SQLITE_FULL) code = TLM_ELIMIT;
    const char *msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    return tlm_err_set(err, code, "store", "%s: %s (sqlite code %d)", what, msg, rc);
}

/* Strictly increasing within the process: two uses in the same microsecond still order. */
static int64_t stamp_now(store *st)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
    int64_t last = atomic_load(&st->last_stamp);
    for (;;) {
        int64_t next = now > last ? now : last + 1;
        if (atomic_compare_exchange_weak(&st->last_stamp, &last, next)) return next;
    }
}

int store_sha256_hex(const void *data, size_t n, char out_hex[65])
{
    return tlm_sha256_hex(data, n, out_hex) ? TLM_EIO : 0;
}

static char g_host_id[17];
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

static void host_id_init(void)
{
    char buf[256] = "";
    FILE *f = fopen("/etc/machine-id", "r");
    if (f) {
        if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
        fclose(f);
        buf[strcspn(buf, " \r\n")] = 0;
    }
    if (!buf[0] && gethostname(buf, sizeof buf - 1) != 0) snprintf(buf, sizeof buf, "unknown");
    buf[sizeof buf - 1] = 0;
    char hex[65];
    if (store_sha256_hex(buf, strlen(buf), hex) != 0) snprintf(hex, sizeof hex, "unknown");
    snprintf(g_host_id, sizeof g_host_id, "%.16s", hex);
}

const char *store_host_id(void)
{
    pthread_once(&g_host_once, host_id_init);
    return g_host_id;
}

static bool is_key(const char *key)
{
    if (!key) return false;
    for (int i = 0; i < 64; i++) {
        char c = key[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
    }
    return key[64] == 0;
}

int store_cache_key(const char *workload_canonical, const char *target_canonical_or_hash,
                    const char *toolchain_identity, const char *model_id, const char *options,
                    char out_hex[65], tlm_error *err)
{
    const char *parts[5] = {workload_canonical, target_canonical_or_hash, toolchain_identity,
                            model_id, options ? options : ""};
    static const char *const names[4] = {"workload", "target", "toolchain", "model_id"};
    out_hex[0] = 0;
    for (int i = 0; i < 4; i++)
        if (!parts[i])
            return tlm_err_set(err, TLM_EINVAL, names[i],
                               "%s is required for the cache key (got NULL)", names[i]);
    static const char prefix[] = "tlm-key-v1";
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (!ctx) return tlm_err_set(err, TLM_ENOMEM, "key", "out of memory hashing the key");
    int ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
             EVP_DigestUpdate(ctx, prefix, sizeof prefix - 1);
    for (int i = 0; ok && i < 5; i++) {
        uint64_t n = strlen(parts[i]);
        unsigned char len[8];
        for (int b = 0; b < 8; b++)
            len[b] = (unsigned char)(n >> (8 * b));
        ok = EVP_DigestUpdate(ctx, len, 8) && EVP_DigestUpdate(ctx, parts[i], n);
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    ok = ok && EVP_DigestFinal_ex(ctx, md, &mdlen) && mdlen == 32;
    EVP_MD_CTX_free(ctx);
    if (!ok) return tlm_err_set(err, TLM_EIO, "key", "SHA-256 failed");
    tlm_hex(md, 32, out_hex);
    return 0;
}

/* ---- connections ------------------------------------------------------------------- */

static void conn_close(store_conn *c)
{
    for (int i = 0; i < ST__COUNT; i++)
        sqlite3_finalize(c->stmt[i]);
    sqlite3_close_v2(c->db);
    free(c);
}

/* Caller holds g_mu. */
static void conn_unlink(store_conn *c)
{
    for (store_conn **p = &c->owner->conns; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            return;
        }
}

/* Caller holds g_mu. */
static bool store_is_live(uint64_t id, store **out)
{
    for (store *s = g_live; s; s = s->next)
        if (s->id == id) {
            if (out) *out = s;
            return true;
        }
    return false;
}

static void tl_destroy(void *p)
{
    tl_table *t = p;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < t->n; i++) {
        store *s;
        if (store_is_live(t->v[i].store_id, &s) && t->v[i].conn->owner == s) {
            conn_unlink(t->v[i].conn);
            conn_close(t->v[i].conn);
        }
    }
    pthread_mutex_unlock(&g_mu);
    free(t->v);
    free(t);
}

static void key_init(void)
{
    g_key_rc = pthread_key_create(&g_key, tl_destroy);
}

static bool key_ready(void)
{
    return pthread_once(&g_key_once, key_init) == 0 && g_key_rc == 0;
}

static store_conn *tl_lookup(store *st)
{
    if (!key_ready()) return NULL;
    tl_table *t = pthread_getspecific(g_key);
    if (!t) return NULL;
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].store_id == st->id) return t->v[i].conn;
    return NULL;
}

static int conn_open(store *st, store_conn **out, tlm_error *err)
{
    store_conn *c = calloc(1, sizeof *c);
    if (!c) return tlm_err_set(err, TLM_ENOMEM, "store", "out of memory");
    c->owner = st;
    /* NOMUTEX: the connection is used by one thread only, so SQLite's own locking of the
     * connection would be pure cost. */
    int rc = sqlite3_open_v2(
        st->path, &c->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (rc != SQLITE_OK) {
        int sys = c->db ? sqlite3_system_errno(c->db) : 0;
        tlm_err_set(err, TLM_EIO, "store.path", "cannot open or create the database '%s': %s%s%s",
                    st->path, c->db ? sqlite3_errmsg(c->db) : sqlite3_errstr(rc), sys ? ": " : "",
                    sys ? strerror(sys) : "");
        conn_close(c);
        return TLM_EIO;
    }
    sqlite3_extended_result_codes(c->db, 1);
    sqlite3_busy_timeout(c->db, st->opts.busy_timeout_ms);
    char *msg = NULL;
    rc = sqlite3_exec(c->db, "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;", NULL, NULL,
                      &msg);
    if (rc != SQLITE_OK) {
        tlm_err_set(err, TLM_EIO, "store.path", "cannot configure the database '%s': %s", st->path,
                    msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        conn_close(c);
        return TLM_EIO;
    }
    *out = c;
    return 0;
}

store_conn *store_conn_get(store *st, tlm_error *err)
{
    store_conn *c = tl_lookup(st);
    if (c) return c;
    if (!key_ready()) {
        tlm_err_set(err, TLM_EIO, "store", "cannot create the thread-local key");
        return NULL;
    }
    tl_table *t = pthread_getspecific(g_key);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (!t || pthread_setspecific(g_key, t) != 0) {
            free(t);
            tlm_err_set(err, TLM_ENOMEM, "store", "out of memory");
            return NULL;
        }
    }
    if (conn_open(st, &c, err) != 0) return NULL;

    pthread_mutex_lock(&g_mu);
    /* Drop slots of stores closed since: their connections are already gone. */
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++)
        if (store_is_live(t->v[i].store_id, NULL)) t->v[w++] = t->v[i];
    t->n = w;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4;
        tl_slot *v = realloc(t->v, cap * sizeof *v);
        if (!v) {
            pthread_mutex_unlock(&g_mu);
            conn_close(c);
            tlm_err_set(err, TLM_ENOMEM, "store", "out of memory");
            return NULL;
        }
        t->v = v;
        t->cap = cap;
    }
    t->v[t->n++] = (tl_slot){st->id, c};
    c->next = st->conns;
    st->conns = c;
    pthread_mutex_unlock(&g_mu);
    return c;
}

/* Removes the calling thread's slot for st; returns its connection (NULL if none). */
static store_conn *tl_remove(store *st)
{
    tl_table *t = key_ready() ? pthread_getspecific(g_key) : NULL;
    if (!t) return NULL;
    store_conn *c = NULL;
    size_t w = 0;
    for (size_t i = 0; i < t->n; i++) {
        if (t->v[i].store_id == st->id)
            c = t->v[i].conn;
        else
            t->v[w++] = t->v[i];
    }
    t->n = w;
    if (t->n == 0) {
        /* The main thread never runs key destructors: free its table here. */
        pthread_setspecific(g_key, NULL);
        free(t->v);
        free(t);
    }
    return c;
}

void store_conn_release(store *st)
{
    if (!st) return;
    pthread_mutex_lock(&g_mu);
    store_conn *c = tl_remove(st);
    if (c) {
        conn_unlink(c);
        conn_close(c);
    }
    pthread_mutex_unlock(&g_mu);
}

static int stmt_get(store_conn *c, int id, sqlite3_stmt **out, tlm_error *err)
{
    if (!c->stmt[id]) {
        int rc =
            sqlite3_prepare_v3(c->db, SQL[id], -1, SQLITE_PREPARE_PERSISTENT, &c->stmt[id], NULL);
        if (rc != SQLITE_OK) return sql_err(err, c->db, rc, "preparing a statement");
    }
    *out = c->stmt[id];
    return 0;
}

static void stmt_done(sqlite3_stmt *s)
{
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
}

/* Runs a statement with no result rows (BEGIN, COMMIT, ...) already bound. */
static int stmt_exec(store_conn *c, sqlite3_stmt *s, const char *what, tlm_error *err)
{
    int rc = sqlite3_step(s);
    stmt_done(s);
    if (rc != SQLITE_DONE) return sql_err(err, c->db, rc, what);
    return 0;
}

static int tx_simple(store_conn *c, int id, const char *what, tlm_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, id, &s, err);
    return rc ? rc : stmt_exec(c, s, what, err);
}

static int tx_begin(store_conn *c, tlm_error *err)
{
    return tx_simple(c, ST_BEGIN, "taking the write lock (BEGIN IMMEDIATE)", err);
}

static int tx_commit(store_conn *c, tlm_error *err)
{
    int rc = tx_simple(c, ST_COMMIT, "committing", err);
    if (rc != 0 && !sqlite3_get_autocommit(c->db)) tx_simple(c, ST_ROLLBACK, "rolling back", NULL);
    return rc;
}

static void tx_rollback(store_conn *c)
{
    if (!sqlite3_get_autocommit(c->db)) tx_simple(c, ST_ROLLBACK, "rolling back", NULL);
}

/* ---- open / close / migrate -------------------------------------------------------- */

static int exec_sql(sqlite3 *db, const char *sql, const char *what, tlm_error *err)
{
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    if (rc == SQLITE_OK) return 0;
    int code = (rc & 0xff) == SQLITE_NOMEM ? TLM_ENOMEM : TLM_EIO;
    tlm_err_set(err, code, "store", "%s: %s (sqlite code %d)", what, msg ? msg : sqlite3_errstr(rc),
                rc);
    sqlite3_free(msg);
    return code;
}

static int schema_version(sqlite3 *db, int *out, tlm_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(db, "SELECT max(version) FROM schema_version", -1, &s, NULL);
    if (rc != SQLITE_OK) return sql_err(err, db, rc, "reading the schema version");
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        /* An empty table (never written) is a version-0 database. */
        *out = sqlite3_column_type(s, 0) == SQLITE_NULL ? 0 : sqlite3_column_int(s, 0);
        rc = SQLITE_OK;
    }
    sqlite3_finalize(s);
    return rc == SQLITE_OK ? 0 : sql_err(err, db, rc, "reading the schema version");
}

static int migrate(store *st, store_conn *c, tlm_error *err)
{
    int rc = tx_begin(c, err);
    if (rc) return rc;
    rc = exec_sql(c->db,
                  "CREATE TABLE IF NOT EXISTS schema_version ("
                  " version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
                  "creating schema_version", err);
    int version = 0;
    if (!rc) rc = schema_version(c->db, &version, err);
    if (!rc && version > STORE_SCHEMA_VERSION)
        rc = tlm_err_set(err, TLM_EUNSUPPORTED, "store.path",
                         "the database '%s' has schema version %d, newer than this build's %d; "
                         "use a newer tlmd or another store file",
                         st->path, version, STORE_SCHEMA_VERSION);
    for (size_t i = 0; !rc && i < sizeof MIGRATIONS / sizeof MIGRATIONS[0]; i++) {
        if (MIGRATIONS[i].version <= version) continue;
        char what[64];
        snprintf(what, sizeof what, "migrating the schema to version %d", MIGRATIONS[i].version);
        rc = exec_sql(c->db, MIGRATIONS[i].sql, what, err);
        if (rc) break;
        char sql[128];
        snprintf(sql, sizeof sql,
                 "INSERT INTO schema_version (version, applied_at) VALUES (%d, %lld)",
                 MIGRATIONS[i].version, (long long)stamp_now(st));
        rc = exec_sql(c->db, sql, what, err);
    }
    if (rc) {
        tx_rollback(c);
        return rc;
    }
    return tx_commit(c, err);
}

store *store_open(const char *path, const store_opts *opts, tlm_error *err)
{
    if (!path || !*path) {
        tlm_err_set(err, TLM_EINVAL, "store.path", "a database file path is required");
        return NULL;
    }
    if (strcmp(path, ":memory:") == 0 || strncmp(path, "file:", 5) == 0) {
        tlm_err_set(err, TLM_EINVAL, "store.path",
                    "'%s' is not allowed: the store needs a plain file path (every thread opens "
                    "its own connection to it)",
                    path);
        return NULL;
    }
    if (opts && (opts->max_bytes < 0 || opts->busy_timeout_ms < 0)) {
        tlm_err_set(err, TLM_EINVAL,
                    opts->max_bytes < 0 ? "store.max_bytes" : "store.busy_timeout_ms",
                    "must be >= 0 (0 = %s)", opts->max_bytes < 0 ? "unbounded" : "default");
        return NULL;
    }
    if (!sqlite3_threadsafe()) {
        tlm_err_set(err, TLM_EUNSUPPORTED, "store",
                    "libsqlite3 was built single-threaded (SQLITE_THREADSAFE=0)");
        return NULL;
    }
    store *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st);
        tlm_err_set(err, TLM_ENOMEM, "store", "out of memory");
        return NULL;
    }
    if (opts) st->opts = *opts;
    if (st->opts.busy_timeout_ms == 0) st->opts.busy_timeout_ms = 10000;
    pthread_mutex_init(&st->tmu, NULL);

    pthread_mutex_lock(&g_mu);
    st->id = g_next_id++;
    st->next = g_live;
    g_live = st;
    pthread_mutex_unlock(&g_mu);

    store_conn *c = store_conn_get(st, err);
    if (!c) goto fail;
    /* WAL is a property of the file (persistent), so setting it once here covers every
     * later connection. It answers the resulting mode: anything else means refused. */
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_step(s);
    if (rc != SQLITE_ROW) {
        tlm_err_set(err, TLM_EIO, "store.path", "'%s' is not a usable database: %s", path,
                    sqlite3_errmsg(c->db));
        sqlite3_finalize(s);
        goto fail;
    }
    const char *mode = (const char *)sqlite3_column_text(s, 0);
    if (!mode || strcmp(mode, "wal") != 0) {
        tlm_err_set(err, TLM_EIO, "store.path",
                    "cannot put '%s' in WAL mode (journal mode stays '%s'); the file system may "
                    "not support shared memory",
                    path, mode ? mode : "?");
        sqlite3_finalize(s);
        goto fail;
    }
    sqlite3_finalize(s);
    if (migrate(st, c, err) != 0) goto fail;
    return st;

fail:
    store_close(st);
    return NULL;
}

void store_close(store *st)
{
    if (!st) return;
    if (st->n_touch) store_touch_flush(st, NULL);
    store_conn *mine = tl_lookup(st);
    if (mine) {
        /* TRUNCATE leaves an empty WAL behind: the file alone is the whole database. Busy (a
         * reader in another process) just means the next open checkpoints instead. */
        sqlite3_exec(mine->db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL);
    }
    pthread_mutex_lock(&g_mu);
    tl_remove(st);
    for (store **p = &g_live; *p; p = &(*p)->next)
        if (*p == st) {
            *p = st->next;
            break;
        }
    store_conn *c = st->conns;
    st->conns = NULL;
    pthread_mutex_unlock(&g_mu);
    while (c) {
        store_conn *next = c->next;
        conn_close(c);
        c = next;
    }
    free(st->touches);
    pthread_mutex_destroy(&st->tmu);
    free(st->path);
    free(st);
}

/* ---- kernels ----------------------------------------------------------------------- */

static int bind_text(sqlite3_stmt *s, int i, const char *v)
{
    return v ? sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC) : sqlite3_bind_null(s, i);
}

static int bind_real(sqlite3_stmt *s, int i, double v)
{
    return isnan(v) ? sqlite3_bind_null(s, i) : sqlite3_bind_double(s, i, v);
}

static double col_real(sqlite3_stmt *s, int i)
{
    return sqlite3_column_type(s, i) == SQLITE_NULL ? NAN : sqlite3_column_double(s, i);
}

/* strdup of a text column; *oom set when the copy fails (NULL column is not an error). */
static char *col_text(sqlite3_stmt *s, int i, bool *oom)
{
    const unsigned char *t = sqlite3_column_text(s, i);
    if (!t) return NULL;
    char *d = strdup((const char *)t);
    if (!d) *oom = true;
    return d;
}

void store_kernel_free(store_kernel *k)
{
    if (!k) return;
    char **strs[] = {&k->workload_hash,  &k->target_hash, &k->compiler_id, &k->model_id,
                     &k->workload_json,  &k->target_name, &k->schedule,    &k->sentence,
                     &k->source,         &k->format,      &k->entry,       &k->launch_json,
                     &k->schedule_source};
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        free(*strs[i]);
    free(k->binary);
    memset(k, 0, sizeof *k);
}

int store_kernel_copy(store_kernel *dst, const store_kernel *src)
{
    *dst = *src;
    char **strs[] = {&dst->workload_hash,  &dst->target_hash, &dst->compiler_id, &dst->model_id,
                     &dst->workload_json,  &dst->target_name, &dst->schedule,    &dst->sentence,
                     &dst->source,         &dst->format,      &dst->entry,       &dst->launch_json,
                     &dst->schedule_source};
    bool oom = false;
    for (size_t i = 0; i < sizeof strs / sizeof strs[0]; i++)
        if (*strs[i] && !(*strs[i] = strdup(*strs[i]))) oom = true;
    dst->binary = NULL;
    if (src->binary && src->binary_size) {
        dst->binary = malloc(src->binary_size);
        if (dst->binary)
            memcpy(dst->binary, src->binary, src->binary_size);
        else
            oom = true;
    }
    if (oom) {
        store_kernel_free(dst);
        return TLM_ENOMEM;
    }
    return 0;
}

/* Fills the fields of KERNEL_COLS (indices 0..20); the rowid (21) and blob (22) are the
 * caller's. */
static int read_kernel(sqlite3_stmt *s, store_kernel *k, tlm_error *err)
{
    memset(k, 0, sizeof *k);
    bool oom = false;
    const unsigned char *key = sqlite3_column_text(s, 0);
    snprintf(k->key, sizeof k->key, "%s", key ? (const char *)key : "");
    k->workload_hash = col_text(s, 1, &oom);
    k->target_hash = col_text(s, 2, &oom);
    k->compiler_id = col_text(s, 3, &oom);
    k->model_id = col_text(s, 4, &oom);
    k->workload_json = col_text(s, 5, &oom);
    k->target_name = col_text(s, 6, &oom);
    k->schedule = col_text(s, 7, &oom);
    k->sentence = col_text(s, 8, &oom);
    k->source = col_text(s, 9, &oom);
    const unsigned char *sha = sqlite3_column_text(s, 10);
    snprintf(k->binary_sha256, sizeof k->binary_sha256, "%s", sha ? (const char *)sha : "");
    k->binary_size = (size_t)sqlite3_column_int64(s, 11);
    k->format = col_text(s, 12, &oom);
    k->entry = col_text(s, 13, &oom);
    k->launch_json = col_text(s, 14, &oom);
    k->est_time_s = col_real(s, 15);
    k->measured_time_s = col_real(s, 16);
    k->created_at = sqlite3_column_int64(s, 17);
    k->last_used_at = sqlite3_column_int64(s, 18);
    k->hits = sqlite3_column_int64(s, 19);
    /* rows from before schema 2 do not know their source */
    k->schedule_source =
        sqlite3_column_type(s, 20) == SQLITE_NULL ? strdup("unknown") : col_text(s, 20, &oom);
    if (!k->schedule_source) oom = true;
    if (oom) {
        store_kernel_free(k);
        return tlm_err_set(err, TLM_ENOMEM, "store", "out of memory reading a kernel");
    }
    return 0;
}

static int check_put(const store_kernel *k, tlm_error *err)
{
    if (!k) return tlm_err_set(err, TLM_EINVAL, "kernel", "kernel is NULL");
    if (!is_key(k->key))
        return tlm_err_set(err, TLM_EINVAL, "key",
                           "must be 64 lowercase hex digits (a store_cache_key)");
    if (!k->workload_hash || !*k->workload_hash)
        return tlm_err_set(err, TLM_EINVAL, "workload_hash", "is required");
    if (!k->target_hash || !*k->target_hash)
        return tlm_err_set(err, TLM_EINVAL, "target_hash", "is required");
    if (!k->format || (strcmp(k->format, "elf-so") != 0 && strcmp(k->format, "cubin") != 0))
        return tlm_err_set(err, TLM_EINVAL, "format", "must be \"elf-so\" or \"cubin\"");
    if (!k->entry || !*k->entry) return tlm_err_set(err, TLM_EINVAL, "entry", "is required");
    if (!k->binary || k->binary_size == 0)
        return tlm_err_set(err, TLM_EINVAL, "binary", "a non-empty binary is required");
    if (k->binary_size > INT32_MAX)
        return tlm_err_set(err, TLM_ELIMIT, "binary", "%zu bytes; at most %d allowed",
                           k->binary_size, INT32_MAX);
    return 0;
}

/* Evicts LRU kernels other than `keep` until the total is within max_bytes. Inside the
 * caller's write transaction. */
static int evict(store *st, store_conn *c, const char *keep, uint64_t *evicted, tlm_error *err)
{
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, ST_TOTAL, &s, err);
    if (rc) return rc;
    rc = sqlite3_step(s);
    int64_t total = rc == SQLITE_ROW ? sqlite3_column_int64(s, 1) : 0;
    stmt_done(s);
    if (rc != SQLITE_ROW) return sql_err(err, c->db, rc, "summing kernel sizes");
    if (total <= st->opts.max_bytes) return 0;

    /* Collect first, delete after: deleting rows under a running scan of the same index
     * is allowed by SQLite but needlessly subtle. */
    size_t n = 0, cap = 0;
    char(*victims)[65] = NULL;
    if ((rc = stmt_get(c, ST_LRU, &s, err))) return rc;
    sqlite3_bind_text(s, 1, keep, -1, SQLITE_STATIC);
    while (total > st->opts.max_bytes && (rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 8;
            void *v = realloc(victims, cap * sizeof *victims);
            if (!v) {
                stmt_done(s);
                free(victims);
                return tlm_err_set(err, TLM_ENOMEM, "store", "out of memory evicting");
            }
            victims = v;
        }
        const unsigned char *key = sqlite3_column_text(s, 0);
        snprintf(victims[n++], 65, "%s", key ? (const char *)key : "");
        total -= sqlite3_column_int64(s, 1);
    }
    stmt_done(s);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        free(victims);
        return sql_err(err, c->db, rc, "listing kernels to evict");
    }
    rc = stmt_get(c, ST_DELETE, &s, err);
    for (size_t i = 0; !rc && i < n; i++) {
        sqlite3_bind_text(s, 1, victims[i], -1, SQLITE_STATIC);
        rc = stmt_exec(c, s, "evicting a kernel", err);
    }
    free(victims);
    if (!rc) *evicted = n;
    return rc;
}

int store_kernel_put(store *st, const store_kernel *k, tlm_error *err)
{
    int rc = check_put(k, err);
    if (rc) return rc;
    int64_t bytes = (int64_t)k->binary_size + (k->source ? (int64_t)strlen(k->source) : 0);
    if (st->opts.max_bytes > 0 && bytes > st->opts.max_bytes)
        return tlm_err_set(err, TLM_ELIMIT, "binary",
                           "kernel of %lld bytes (binary + source) exceeds the store bound of "
                           "%lld bytes",
                           (long long)bytes, (long long)st->opts.max_bytes);
    char sha[65];
    if (store_sha256_hex(k->binary, k->binary_size, sha) != 0)
        return tlm_err_set(err, TLM_EIO, "binary", "SHA-256 failed");
    if (st->opts.defer_touch && store_touch_pending(st))
        store_touch_flush(st, NULL); /* eviction below orders by the latest uses */
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    if ((rc = stmt_get(c, ST_PUT, &s, err))) return rc;
    if ((rc = tx_begin(c, err))) return rc;

    bind_text(s, 1, k->key);
    bind_text(s, 2, k->workload_hash);
    bind_text(s, 3, k->target_hash);
    bind_text(s, 4, k->compiler_id);
    bind_text(s, 5, k->model_id);
    bind_text(s, 6, k->workload_json);
    bind_text(s, 7, k->target_name);
    bind_text(s, 8, k->schedule);
    bind_text(s, 9, k->sentence);
    bind_text(s, 10, k->source);
    sqlite3_bind_blob(s, 11, k->binary, (int)k->binary_size, SQLITE_STATIC);
    bind_text(s, 12, sha);
    sqlite3_bind_int64(s, 13, (int64_t)k->binary_size);
    bind_text(s, 14, k->format);
    bind_text(s, 15, k->entry);
    bind_text(s, 16, k->launch_json);
    bind_real(s, 17, k->est_time_s);
    bind_real(s, 18, k->measured_time_s);
    sqlite3_bind_int64(s, 19, bytes);
    sqlite3_bind_int64(s, 20, stamp_now(st));
    bind_text(s, 21, k->schedule_source);
    rc = stmt_exec(c, s, "inserting a kernel", err);
    uint64_t evicted = 0;
    if (!rc && st->opts.max_bytes > 0) rc = evict(st, c, k->key, &evicted, err);
    if (rc) {
        tx_rollback(c);
        return rc;
    }
    if ((rc = tx_commit(c, err))) return rc;
    atomic_fetch_add(&st->evictions, evicted);
    return 0;
}

static int kernel_read(store *st, const char *key, bool with_blob, store_kernel *out,
                       int64_t *rowid, tlm_error *err)
{
    if (!is_key(key)) return tlm_err_set(err, TLM_EINVAL, "key", "must be 64 lowercase hex digits");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, with_blob ? ST_GET : ST_META, &s, err);
    if (rc) return rc;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) {
        stmt_done(s);
        return tlm_err_set(err, TLM_ENOTFOUND, "key", "no kernel with key %s", key);
    }
    if (rc != SQLITE_ROW) {
        stmt_done(s);
        return sql_err(err, c->db, rc, "reading a kernel");
    }
    rc = read_kernel(s, out, err);
    if (!rc) {
        *rowid = sqlite3_column_int64(s, 21);
        if (with_blob) {
            /* The blob's real length, not the recorded one: verification compares both. */
            int n = sqlite3_column_bytes(s, 22);
            const void *b = sqlite3_column_blob(s, 22);
            if (n > 0 && b) {
                out->binary = malloc((size_t)n);
                if (!out->binary) {
                    store_kernel_free(out);
                    rc = tlm_err_set(err, TLM_ENOMEM, "store", "out of memory reading a blob");
                } else {
                    memcpy(out->binary, b, (size_t)n);
                }
            }
            if (!rc && (size_t)n != out->binary_size) {
                /* Recorded size disagrees: keep the real length so the check fails. */
                out->binary_size = (size_t)n;
                out->binary_sha256[0] = 0;
            }
        }
    }
    stmt_done(s);
    return rc;
}

/* One statement in its own write transaction. */
static int write_one(store_conn *c, sqlite3_stmt *s, const char *what, tlm_error *err)
{
    int rc = tx_begin(c, err);
    if (rc) {
        stmt_done(s);
        return rc;
    }
    rc = stmt_exec(c, s, what, err);
    if (rc) {
        tx_rollback(c);
        return rc;
    }
    return tx_commit(c, err);
}

/* A use of key at now, in memory; false when the table is full (write it at once), or, with
 * try, when another thread holds the table (it may be a low-priority thread that is not
 * running: the caller must not wait for it). */
static bool touch_record_(store *st, const char *key, int64_t now, bool try)
{
    bool ok = true;
    if (try) {
        if (pthread_mutex_trylock(&st->tmu)) return false;
    } else {
        pthread_mutex_lock(&st->tmu);
    }
    size_t i = 0;
    while (i < st->n_touch && strcmp(st->touches[i].key, key))
        i++;
    if (i == st->n_touch) {
        if (!st->touches) st->touches = malloc(TOUCH_MAX * sizeof *st->touches);
        if (!st->touches || st->n_touch == TOUCH_MAX) {
            ok = false;
        } else {
            snprintf(st->touches[i].key, sizeof st->touches[i].key, "%s", key);
            st->touches[i].n = 0;
            st->touches[i].last = 0;
            st->n_touch++;
        }
    }
    if (ok) {
        st->touches[i].n++;
        if (now > st->touches[i].last) st->touches[i].last = now;
    }
    pthread_mutex_unlock(&st->tmu);
    return ok;
}

static bool touch_record(store *st, const char *key, int64_t now)
{
    return touch_record_(st, key, now, false);
}

bool store_kernel_note_use(store *st, const char *key)
{
    return st->opts.defer_touch && touch_record_(st, key, stamp_now(st), true);
}

size_t store_touch_pending(store *st)
{
    pthread_mutex_lock(&st->tmu);
    size_t n = st->n_touch;
    pthread_mutex_unlock(&st->tmu);
    return n;
}

int store_touch_flush(store *st, tlm_error *err)
{
    pthread_mutex_lock(&st->tmu);
    size_t n = st->n_touch;
    struct touch *t = NULL;
    if (n && (t = malloc(n * sizeof *t))) {
        memcpy(t, st->touches, n * sizeof *t);
        st->n_touch = 0;
    }
    pthread_mutex_unlock(&st->tmu);
    if (!t) return n ? tlm_err_set(err, TLM_ENOMEM, "store", "out of memory") : 0;
    store_conn *c = store_conn_get(st, err);
    int rc = c ? tx_begin(c, err) : (err ? err->code : TLM_EIO);
    for (size_t i = 0; rc == 0 && i < n; i++) {
        sqlite3_stmt *s = NULL;
        if ((rc = stmt_get(c, ST_TOUCH, &s, err))) break;
        sqlite3_bind_text(s, 1, t[i].key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, t[i].last);
        sqlite3_bind_int64(s, 3, t[i].n);
        rc = stmt_exec(c, s, "recording kernel uses", err);
    }
    if (c && rc == 0)
        rc = tx_commit(c, err);
    else if (c)
        tx_rollback(c);
    free(t); /* on an error the uses are lost: they only order eviction and count hits */
    return rc;
}

int store_kernel_get(store *st, const char *key, store_kernel *out, tlm_error *err)
{
    int64_t rowid = 0;
    int rc = kernel_read(st, key, true, out, &rowid, err);
    if (rc == TLM_ENOTFOUND) atomic_fetch_add(&st->misses, 1);
    if (rc) return rc;

    store_conn *c = store_conn_get(st, err);
    sqlite3_stmt *s = NULL;
    char sha[65] = "";
    bool ok = out->binary && out->binary_sha256[0] &&
              store_sha256_hex(out->binary, out->binary_size, sha) == 0 &&
              strcmp(sha, out->binary_sha256) == 0;
    if (!ok) {
        /* Delete exactly the row we read: a concurrent put may have replaced it with a good
         * one meanwhile, which has another rowid or created_at. */
        if ((rc = stmt_get(c, ST_DELETE_ROW, &s, err)) == 0) {
            sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
            sqlite3_bind_int64(s, 2, rowid);
            sqlite3_bind_int64(s, 3, out->created_at);
            rc = write_one(c, s, "deleting a corrupt kernel", err);
        }
        store_kernel_free(out);
        atomic_fetch_add(&st->corrupt, 1);
        atomic_fetch_add(&st->misses, 1);
        if (rc) return rc;
        return tlm_err_set(err, TLM_ENOTFOUND, "key",
                           "kernel %s failed its checksum; deleted, treated as a miss", key);
    }

    int64_t now = stamp_now(st);
    if (!(st->opts.defer_touch && touch_record(st, key, now)) &&
        (rc = stmt_get(c, ST_TOUCH, &s, err)) == 0) {
        sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, now);
        sqlite3_bind_int64(s, 3, 1);
        rc = write_one(c, s, "recording a kernel use", err);
    }
    if (rc) {
        store_kernel_free(out);
        return rc;
    }
    out->hits++;
    out->last_used_at = now;
    atomic_fetch_add(&st->hits, 1);
    return 0;
}

int store_kernel_meta(store *st, const char *key, store_kernel *out, tlm_error *err)
{
    int64_t rowid;
    int rc = kernel_read(st, key, false, out, &rowid, err);
    if (rc || !st->opts.defer_touch) return rc;
    pthread_mutex_lock(&st->tmu);
    for (size_t i = 0; i < st->n_touch; i++)
        if (!strcmp(st->touches[i].key, key)) {
            out->hits += st->touches[i].n;
            if (st->touches[i].last > out->last_used_at) out->last_used_at = st->touches[i].last;
        }
    pthread_mutex_unlock(&st->tmu);
    return 0;
}

int store_kernel_delete(store *st, const char *key, tlm_error *err)
{
    if (!is_key(key)) return tlm_err_set(err, TLM_EINVAL, "key", "must be 64 lowercase hex digits");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, ST_DELETE, &s, err);
    if (rc) return rc;
    sqlite3_bind_text(s, 1, key, -1, SQLITE_STATIC);
    if ((rc = write_one(c, s, "deleting a kernel", err))) return rc;
    if (sqlite3_changes(c->db) == 0)
        return tlm_err_set(err, TLM_ENOTFOUND, "key", "no kernel with key %s", key);
    return 0;
}

int store_stats_get(store *st, store_stats *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, ST_TOTAL, &s, err);
    if (rc) return rc;
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
        out->kernels = sqlite3_column_int64(s, 0);
        out->bytes = sqlite3_column_int64(s, 1);
    }
    stmt_done(s);
    if (rc != SQLITE_ROW) return sql_err(err, c->db, rc, "counting kernels");
    out->max_bytes = st->opts.max_bytes;
    out->hits = atomic_load(&st->hits);
    out->misses = atomic_load(&st->misses);
    out->evictions = atomic_load(&st->evictions);
    out->corrupt = atomic_load(&st->corrupt);
    return 0;
}

/* ---- measurements ------------------------------------------------------------------ */

/* Adds m (created_at: m's when `keep` and set, else now); with `dedup`, not when the same
 * record is there already (*added says which). */
static int measurement_put(store *st, const store_measurement *m, bool keep, bool dedup,
                           int64_t *id_out, bool *added, tlm_error *err)
{
    if (added) *added = false;
    if (!m) return tlm_err_set(err, TLM_EINVAL, "measurement", "measurement is NULL");
    if (!m->workload_hash || !*m->workload_hash)
        return tlm_err_set(err, TLM_EINVAL, "workload_hash", "is required");
    if (!m->target_hash || !*m->target_hash)
        return tlm_err_set(err, TLM_EINVAL, "target_hash", "is required");
    if (!m->schedule) return tlm_err_set(err, TLM_EINVAL, "schedule", "is required");
    if (!m->status || !*m->status)
        return tlm_err_set(err, TLM_EINVAL, "status", "is required (\"ok\" or a failure kind)");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, ST_MEAS_ADD, &s, err);
    if (rc) return rc;
    bind_text(s, 1, m->workload_hash);
    bind_text(s, 2, m->target_hash);
    bind_text(s, 3, m->sketch);
    bind_text(s, 4, m->schedule);
    bind_text(s, 5, m->status);
    bind_real(s, 6, m->median_s);
    bind_real(s, 7, m->gflops);
    bind_real(s, 8, m->rel_err);
    int64_t at = keep && m->created_at > 0 ? m->created_at : stamp_now(st);
    const char *host = m->host_id ? m->host_id : store_host_id();
    sqlite3_bind_int64(s, 9, at);
    bind_text(s, 10, m->workload_json);
    bind_text(s, 11, m->target_name);
    bind_text(s, 12, m->toolchain_id);
    bind_text(s, 13, m->model_id);
    bind_text(s, 14, m->sentence);
    bind_text(s, 15, m->schedule_source);
    bind_real(s, 16, m->min_s);
    if (m->n_samples > 0)
        sqlite3_bind_int(s, 17, m->n_samples);
    else
        sqlite3_bind_null(s, 17);
    bind_text(s, 18, host);
    bind_text(s, 19, m->detail);
    if ((rc = tx_begin(c, err))) {
        stmt_done(s);
        return rc;
    }
    if (dedup) {
        sqlite3_stmt *f = NULL;
        /* ST_MEAS_ADD stays bound while its sibling runs: they are distinct statements */
        if ((rc = stmt_get(c, ST_MEAS_FIND, &f, err))) {
            stmt_done(s);
            tx_rollback(c);
            return rc;
        }
        bind_text(f, 1, m->workload_hash);
        bind_text(f, 2, m->target_hash);
        bind_text(f, 3, m->schedule);
        sqlite3_bind_int64(f, 4, at);
        bind_text(f, 5, host);
        bind_text(f, 6, m->status);
        int frc = sqlite3_step(f);
        int64_t found = frc == SQLITE_ROW ? sqlite3_column_int64(f, 0) : 0;
        stmt_done(f);
        if (frc != SQLITE_ROW && frc != SQLITE_DONE) {
            stmt_done(s);
            tx_rollback(c);
            return sql_err(err, c->db, frc, "looking for a measurement");
        }
        if (found) {
            stmt_done(s);
            tx_rollback(c);
            if (id_out) *id_out = found;
            return 0;
        }
    }
    if ((rc = stmt_exec(c, s, "adding a measurement", err))) {
        tx_rollback(c);
        return rc;
    }
    int64_t id = sqlite3_last_insert_rowid(c->db);
    if ((rc = tx_commit(c, err))) return rc;
    if (id_out) *id_out = id;
    if (added) *added = true;
    return 0;
}

int store_measurement_add(store *st, const store_measurement *m, int64_t *id_out, tlm_error *err)
{
    return measurement_put(st, m, false, false, id_out, NULL, err);
}

int store_measurement_import(store *st, const store_measurement *m, bool *added, tlm_error *err)
{
    return measurement_put(st, m, true, true, NULL, added, err);
}

void store_measurements_free(store_measurement *ms, size_t count)
{
    if (!ms) return;
    for (size_t i = 0; i < count; i++) {
        free(ms[i].workload_hash);
        free(ms[i].target_hash);
        free(ms[i].sketch);
        free(ms[i].schedule);
        free(ms[i].status);
        free(ms[i].workload_json);
        free(ms[i].target_name);
        free(ms[i].toolchain_id);
        free(ms[i].model_id);
        free(ms[i].sentence);
        free(ms[i].schedule_source);
        free(ms[i].host_id);
        free(ms[i].detail);
    }
    free(ms);
}

/* Reads the MEAS_COLS rows of a prepared ST_MEAS_BEST / ST_MEAS_LIST query. */
static int measurements_query(store *st, int which, const char *workload_hash,
                              const char *target_hash, int64_t after_id, int n,
                              store_measurement **out, size_t *count, tlm_error *err)
{
    *out = NULL;
    *count = 0;
    if (which != ST_MEAS_PAGE && !workload_hash)
        return tlm_err_set(err, TLM_EINVAL, "workload_hash", "is required");
    if (which != ST_MEAS_PAGE && !target_hash)
        return tlm_err_set(err, TLM_EINVAL, "target_hash", "is required");
    if (n <= 0 || n > 100000)
        return tlm_err_set(err, TLM_EINVAL, "n", "%d; must be in 1..100000", n);
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, which, &s, err);
    if (rc) return rc;
    if (which == ST_MEAS_PAGE) {
        sqlite3_bind_int64(s, 1, after_id);
        sqlite3_bind_int(s, 2, n);
    } else {
        bind_text(s, 1, workload_hash);
        bind_text(s, 2, target_hash);
        sqlite3_bind_int(s, 3, n);
    }
    store_measurement *ms = NULL;
    size_t k = 0, cap = 0;
    bool oom = false;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (k == cap) {
            cap = cap ? 2 * cap : 8;
            store_measurement *v = realloc(ms, cap * sizeof *v);
            if (!v) {
                oom = true;
                break;
            }
            ms = v;
        }
        store_measurement *m = &ms[k++];
        memset(m, 0, sizeof *m);
        m->id = sqlite3_column_int64(s, 0);
        m->workload_hash = col_text(s, 1, &oom);
        m->target_hash = col_text(s, 2, &oom);
        m->sketch = col_text(s, 3, &oom);
        m->schedule = col_text(s, 4, &oom);
        m->status = col_text(s, 5, &oom);
        m->median_s = col_real(s, 6);
        m->gflops = col_real(s, 7);
        m->rel_err = col_real(s, 8);
        m->created_at = sqlite3_column_int64(s, 9);
        m->workload_json = col_text(s, 10, &oom);
        m->target_name = col_text(s, 11, &oom);
        m->toolchain_id = col_text(s, 12, &oom);
        m->model_id = col_text(s, 13, &oom);
        m->sentence = col_text(s, 14, &oom);
        m->schedule_source = col_text(s, 15, &oom);
        m->min_s = col_real(s, 16);
        m->n_samples = sqlite3_column_int(s, 17);
        m->host_id = col_text(s, 18, &oom);
        m->detail = col_text(s, 19, &oom);
        if (oom) break;
    }
    stmt_done(s);
    if (oom) {
        store_measurements_free(ms, k);
        return tlm_err_set(err, TLM_ENOMEM, "store", "out of memory reading measurements");
    }
    if (rc != SQLITE_DONE) {
        store_measurements_free(ms, k);
        return sql_err(err, c->db, rc, "reading measurements");
    }
    *out = ms;
    *count = k;
    return 0;
}

int store_measurements_best(store *st, const char *workload_hash, const char *target_hash, int n,
                            store_measurement **out, size_t *count, tlm_error *err)
{
    return measurements_query(st, ST_MEAS_BEST, workload_hash, target_hash, 0, n, out, count, err);
}

int store_measurements_list(store *st, const char *workload_hash, const char *target_hash, int n,
                            store_measurement **out, size_t *count, tlm_error *err)
{
    return measurements_query(st, ST_MEAS_LIST, workload_hash, target_hash, 0, n, out, count, err);
}

int store_measurements_page(store *st, int64_t after_id, int n, store_measurement **out,
                            size_t *count, tlm_error *err)
{
    return measurements_query(st, ST_MEAS_PAGE, NULL, NULL, after_id, n, out, count, err);
}

/* ---- meta -------------------------------------------------------------------------- */

int store_meta_set(store *st, const char *key, const char *value, tlm_error *err)
{
    if (!key || !*key) return tlm_err_set(err, TLM_EINVAL, "key", "is required");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, ST_META_SET, &s, err);
    if (rc) return rc;
    bind_text(s, 1, key);
    bind_text(s, 2, value);
    return write_one(c, s, "setting a meta value", err);
}

int store_meta_get(store *st, const char *key, char **value, tlm_error *err)
{
    *value = NULL;
    if (!key || !*key) return tlm_err_set(err, TLM_EINVAL, "key", "is required");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    sqlite3_stmt *s = NULL;
    int rc = stmt_get(c, ST_META_GET, &s, err);
    if (rc) return rc;
    bind_text(s, 1, key);
    rc = sqlite3_step(s);
    bool oom = false;
    if (rc == SQLITE_ROW) *value = col_text(s, 0, &oom);
    stmt_done(s);
    if (rc == SQLITE_DONE) return tlm_err_set(err, TLM_ENOTFOUND, "key", "no meta value '%s'", key);
    if (rc != SQLITE_ROW) return sql_err(err, c->db, rc, "reading a meta value");
    if (oom) return tlm_err_set(err, TLM_ENOMEM, "store", "out of memory");
    return 0;
}

/* ---- tuner memory ------------------------------------------------------------------- */

void store_tuner_rows_free(store_tuner_row *rows, size_t n)
{
    if (!rows) return;
    for (size_t i = 0; i < n; i++) {
        free(rows[i].kind);
        free(rows[i].payload);
    }
    free(rows);
}

static int tuner_read(store_conn *c, const char *sql, const char *scope, const char *target,
                      bool edge, store_tuner_row **out, size_t *n, tlm_error *err)
{
    *out = NULL;
    *n = 0;
    sqlite3_stmt *s = NULL;
    int rc = sqlite3_prepare_v2(c->db, sql, -1, &s, NULL);
    if (rc != SQLITE_OK) return sql_err(err, c->db, rc, "preparing a tuner read");
    sqlite3_bind_text(s, 1, scope, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
    size_t cap = 0;
    bool oom = false;
    store_tuner_row *rows = NULL;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            store_tuner_row *r = realloc(rows, cap * sizeof *r);
            if (!r) {
                oom = true;
                break;
            }
            rows = r;
        }
        store_tuner_row *r = &rows[(*n)++];
        memset(r, 0, sizeof *r);
        r->id = sqlite3_column_int64(s, 0);
        r->parent = sqlite3_column_int64(s, 1);
        r->child = edge ? sqlite3_column_int64(s, 2) : 0;
        r->kind = col_text(s, 3, &oom);
        r->payload = col_text(s, 4, &oom);
        r->score = col_real(s, 5);
        if (oom) break;
    }
    sqlite3_finalize(s);
    if (oom || (rc != SQLITE_DONE && rc != SQLITE_ROW)) {
        store_tuner_rows_free(rows, *n);
        *n = 0;
        return oom ? tlm_err_set(err, TLM_ENOMEM, "store", "out of memory")
                   : sql_err(err, c->db, rc, "reading the tuner memory");
    }
    *out = rows;
    return 0;
}

int store_tuner_load(store *st, const char *scope, const char *target, store_tuner_row **nodes,
                     size_t *n_nodes, store_tuner_row **edges, size_t *n_edges, tlm_error *err)
{
    *nodes = *edges = NULL;
    *n_nodes = *n_edges = 0;
    if (!scope || !target) return tlm_err_set(err, TLM_EINVAL, "scope", "is required");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    int rc = tuner_read(c,
                        "SELECT id, coalesce(parent, 0), 0, kind, payload, score FROM tuner_nodes "
                        "WHERE workload_hash = ?1 AND target_hash = ?2 ORDER BY id",
                        scope, target, false, nodes, n_nodes, err);
    if (!rc)
        rc = tuner_read(c,
                        "SELECT id, parent, child, kind, payload, score FROM tuner_edges "
                        "WHERE workload_hash = ?1 AND target_hash = ?2 ORDER BY id",
                        scope, target, true, edges, n_edges, err);
    if (rc) {
        store_tuner_rows_free(*nodes, *n_nodes);
        *nodes = NULL;
        *n_nodes = 0;
    }
    return rc;
}

int store_tuner_replace(store *st, const char *scope, const char *target,
                        const store_tuner_row *nodes, size_t n_nodes, const store_tuner_row *edges,
                        size_t n_edges, tlm_error *err)
{
    if (!scope || !target) return tlm_err_set(err, TLM_EINVAL, "scope", "is required");
    store_conn *c = store_conn_get(st, err);
    if (!c) return err ? err->code : TLM_EIO;
    int64_t *ids = calloc(n_nodes + 1, sizeof *ids);
    if (!ids) return tlm_err_set(err, TLM_ENOMEM, "store", "out of memory");
    int rc = tx_begin(c, err);
    if (rc) {
        free(ids);
        return rc;
    }
    int64_t now = stamp_now(st);
    sqlite3_stmt *s = NULL;
    int q = sqlite3_prepare_v2(c->db,
                               "DELETE FROM tuner_nodes WHERE workload_hash = ?1 AND "
                               "target_hash = ?2",
                               -1, &s, NULL);
    if (q == SQLITE_OK) {
        sqlite3_bind_text(s, 1, scope, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
        q = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(c->db);
    }
    sqlite3_finalize(s);
    /* edges go with their nodes (ON DELETE CASCADE needs foreign_keys; say it explicitly) */
    if (q == SQLITE_OK &&
        (q = sqlite3_prepare_v2(c->db,
                                "DELETE FROM tuner_edges WHERE workload_hash = ?1 AND "
                                "target_hash = ?2",
                                -1, &s, NULL)) == SQLITE_OK) {
        sqlite3_bind_text(s, 1, scope, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
        q = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(c->db);
        sqlite3_finalize(s);
    }
    for (size_t i = 0; q == SQLITE_OK && i < n_nodes; i++) {
        q = sqlite3_prepare_v2(c->db,
                               "INSERT INTO tuner_nodes (workload_hash, target_hash, parent, kind, "
                               "payload, score, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                               -1, &s, NULL);
        if (q != SQLITE_OK) break;
        sqlite3_bind_text(s, 1, scope, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
        int64_t p = nodes[i].parent;
        if (p > 0 && (size_t)p <= i)
            sqlite3_bind_int64(s, 3, ids[p]);
        else
            sqlite3_bind_null(s, 3);
        sqlite3_bind_text(s, 4, nodes[i].kind ? nodes[i].kind : "node", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 5, nodes[i].payload, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 6, isfinite(nodes[i].score) ? nodes[i].score : 0);
        sqlite3_bind_int64(s, 7, now);
        q = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(c->db);
        sqlite3_finalize(s);
        ids[i + 1] = sqlite3_last_insert_rowid(c->db);
    }
    for (size_t i = 0; q == SQLITE_OK && i < n_edges; i++) {
        int64_t a = edges[i].parent, b = edges[i].child;
        if (a < 1 || b < 1 || (size_t)a > n_nodes || (size_t)b > n_nodes) continue;
        q = sqlite3_prepare_v2(
            c->db,
            "INSERT INTO tuner_edges (workload_hash, target_hash, parent, child, "
            "kind, payload, score, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, "
            "?7, ?8)",
            -1, &s, NULL);
        if (q != SQLITE_OK) break;
        sqlite3_bind_text(s, 1, scope, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, target, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, ids[a]);
        sqlite3_bind_int64(s, 4, ids[b]);
        sqlite3_bind_text(s, 5, edges[i].kind ? edges[i].kind : "edge", -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 6, edges[i].payload, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 7, isfinite(edges[i].score) ? edges[i].score : 0);
        sqlite3_bind_int64(s, 8, now);
        q = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : sqlite3_errcode(c->db);
        sqlite3_finalize(s);
    }
    free(ids);
    if (q != SQLITE_OK) {
        rc = sql_err(err, c->db, q, "writing the tuner memory");
        tx_rollback(c);
        return rc;
    }
    return tx_commit(c, err);
}
