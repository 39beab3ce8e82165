/* Tests for store/: round trips, checksum failures, LRU eviction, migrations, many
 * writers, crash safety (kill -9 mid-write) and clean errors on bad paths. Every test uses
 * its own temporary directory; raw sqlite3 connections play "someone else" (a corrupting
 * disk, an older tlmd). */
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/store.h"

/* ---- helpers ----------------------------------------------------------------------- */

typedef struct tmp {
    char dir[64];
    char path[128];
} tmp;

static void tmp_make(tmp *t)
{
    snprintf(t->dir, sizeof t->dir, "/tmp/tlm-store-XXXXXX");
    cr_assert_not_null(mkdtemp(t->dir));
    snprintf(t->path, sizeof t->path, "%s/kernels.db", t->dir);
}

static void tmp_remove(tmp *t)
{
    char p[160];
    const char *suffix[] = {"", "-wal", "-shm", "-journal"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s%s", t->path, suffix[i]);
        unlink(p);
    }
    rmdir(t->dir);
}

static char *xstrdupf(const char *fmt, int i)
{
    char buf[256];
    snprintf(buf, sizeof buf, fmt, i);
    char *s = strdup(buf);
    cr_assert_not_null(s);
    return s;
}

static uint8_t pattern(int i, size_t j)
{
    return (uint8_t)((size_t)i * 131u + j * 7u + (j >> 8));
}

/* Kernel i with a binary of `bin` bytes and a source of `src` bytes; every field set. */
static void mk_kernel(store_kernel *k, int i, size_t bin, size_t src)
{
    memset(k, 0, sizeof *k);
    char w[96];
    snprintf(w, sizeof w, "{\"op\":\"dense\",\"shape\":{\"M\":%d,\"N\":64,\"K\":64}}", i);
    cr_assert_eq(store_cache_key(w, "cpu:avx2", "gcc 12.2 -O3", "tlm-test-1", "", k->key, NULL), 0);
    k->workload_hash = xstrdupf("workload-hash-%d", i);
    k->target_hash = xstrdupf("target-hash-%d", i % 3);
    k->compiler_id = xstrdupf("gcc-12.2.0-%d", i);
    k->model_id = xstrdupf("tlm-model-%d", i);
    k->workload_json = strdup(w);
    k->target_name = xstrdupf("cpu:avx2#%d", i);
    k->schedule = xstrdupf("tile(i,%d) vectorize(j)", i);
    k->sentence = xstrdupf("<s> T i %d V j </s>", i);
    k->source = malloc(src + 1);
    cr_assert_not_null(k->source);
    for (size_t j = 0; j < src; j++)
        k->source[j] = (char)('a' + (j + (size_t)i) % 26);
    k->source[src] = 0;
    k->binary = malloc(bin);
    cr_assert_not_null(k->binary);
    for (size_t j = 0; j < bin; j++)
        k->binary[j] = pattern(i, j);
    k->binary_size = bin;
    k->format = strdup(i % 2 ? "cubin" : "elf-so");
    k->entry = xstrdupf("kernel_%d", i);
    k->launch_json = xstrdupf("{\"grid\":[%d,1,1],\"block\":[128,1,1]}", i + 1);
    k->schedule_source = strdup(i % 2 ? "topk" : "tlm");
    k->est_time_s = 1e-3 * (i + 1);
    k->measured_time_s = 2e-3 * (i + 1);
}

static void assert_str(const char *got, const char *want, const char *what)
{
    cr_assert_not_null(got, "%s is NULL", what);
    cr_assert_str_eq(got, want, "%s", what);
}

static store *open_store(const char *path, int64_t max_bytes)
{
    store_opts o = {.max_bytes = max_bytes};
    tlm_error e = {0};
    store *st = store_open(path, &o, &e);
    cr_assert_not_null(st, "store_open: %s: %s", e.field, e.msg);
    return st;
}

static int64_t raw_int(const char *path, const char *sql)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK, "%s: %s", sql,
                 sqlite3_errmsg(db));
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW, "%s", sql);
    int64_t v = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    sqlite3_close(db);
    return v;
}

static void raw_exec(const char *path, const char *sql)
{
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL),
                 SQLITE_OK);
    char *msg = NULL;
    int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
    cr_assert_eq(rc, SQLITE_OK, "%s: %s", sql, msg ? msg : "");
    sqlite3_close(db);
}

static void sha_hex(const void *p, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int len;
    cr_assert(EVP_Digest(p, n, md, &len, EVP_sha256(), NULL));
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
}

static store_stats stats(store *st)
{
    store_stats s;
    tlm_error e = {0};
    cr_assert_eq(store_stats_get(st, &s, &e), 0, "%s", e.msg);
    return s;
}

/* ---- cache key --------------------------------------------------------------------- */

Test(store, cache_key_layout_and_separation)
{
    char a[65], b[65];
    cr_assert_eq(store_cache_key("W", "T", "C", "M", "O", a, NULL), 0);
    /* Independent computation of the documented layout. */
    unsigned char buf[256];
    size_t n = 0;
    memcpy(buf, "tlm-key-v1", 10);
    n = 10;
    const char *parts[] = {"W", "T", "C", "M", "O"};
    for (int i = 0; i < 5; i++) {
        uint64_t len = strlen(parts[i]);
        for (int j = 0; j < 8; j++)
            buf[n++] = (unsigned char)(len >> (8 * j));
        memcpy(buf + n, parts[i], len);
        n += len;
    }
    char want[65];
    sha_hex(buf, n, want);
    cr_assert_str_eq(a, want);

    /* Shifting bytes between neighbouring parts must change the key. */
    cr_assert_eq(store_cache_key("ab", "c", "x", "y", NULL, a, NULL), 0);
    cr_assert_eq(store_cache_key("a", "bc", "x", "y", NULL, b, NULL), 0);
    cr_assert_str_neq(a, b);
    /* Every part matters, including the model id and options. */
    const char *base[5] = {"w", "t", "c", "m", "o"};
    char k0[65];
    cr_assert_eq(store_cache_key(base[0], base[1], base[2], base[3], base[4], k0, NULL), 0);
    for (int i = 0; i < 5; i++) {
        const char *p[5];
        memcpy(p, base, sizeof p);
        p[i] = "changed";
        cr_assert_eq(store_cache_key(p[0], p[1], p[2], p[3], p[4], a, NULL), 0);
        cr_assert_str_neq(a, k0, "part %d ignored", i);
    }
    /* NULL options are the empty string; a NULL required part is an error. */
    cr_assert_eq(store_cache_key("w", "t", "c", "m", NULL, a, NULL), 0);
    cr_assert_eq(store_cache_key("w", "t", "c", "m", "", b, NULL), 0);
    cr_assert_str_eq(a, b);
    tlm_error e = {0};
    cr_assert_eq(store_cache_key("w", "t", NULL, "m", NULL, a, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "toolchain");
}

/* ---- kernels ----------------------------------------------------------------------- */

Test(store, put_get_round_trip_all_fields)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    store_kernel k;
    mk_kernel(&k, 7, 3000, 500);
    tlm_error e = {0};
    cr_assert_eq(store_kernel_put(st, &k, &e), 0, "%s: %s", e.field, e.msg);

    store_kernel g;
    cr_assert_eq(store_kernel_get(st, k.key, &g, &e), 0, "%s", e.msg);
    cr_assert_str_eq(g.key, k.key);
    assert_str(g.workload_hash, k.workload_hash, "workload_hash");
    assert_str(g.target_hash, k.target_hash, "target_hash");
    assert_str(g.compiler_id, k.compiler_id, "compiler_id");
    assert_str(g.model_id, k.model_id, "model_id");
    assert_str(g.workload_json, k.workload_json, "workload_json");
    assert_str(g.target_name, k.target_name, "target_name");
    assert_str(g.schedule, k.schedule, "schedule");
    assert_str(g.sentence, k.sentence, "sentence");
    assert_str(g.source, k.source, "source");
    assert_str(g.format, "cubin", "format");
    assert_str(g.entry, k.entry, "entry");
    assert_str(g.launch_json, k.launch_json, "launch_json");
    assert_str(g.schedule_source, "topk", "schedule_source");
    cr_assert_eq(g.binary_size, k.binary_size);
    cr_assert_eq(memcmp(g.binary, k.binary, k.binary_size), 0);
    char sha[65];
    sha_hex(k.binary, k.binary_size, sha);
    cr_assert_str_eq(g.binary_sha256, sha);
    cr_assert_float_eq(g.est_time_s, k.est_time_s, 1e-15);
    cr_assert_float_eq(g.measured_time_s, k.measured_time_s, 1e-15);
    cr_assert_eq(g.hits, 1);
    cr_assert_gt(g.created_at, 1600000000LL * 1000000);
    cr_assert_gt(g.last_used_at, g.created_at);
    int64_t used = g.last_used_at;
    store_kernel_free(&g);

    /* meta: no blob, no hit counted, LRU untouched. */
    cr_assert_eq(store_kernel_meta(st, k.key, &g, &e), 0);
    cr_assert_null(g.binary);
    cr_assert_eq(g.binary_size, k.binary_size);
    cr_assert_str_eq(g.binary_sha256, sha);
    assert_str(g.source, k.source, "source (meta)");
    cr_assert_eq(g.hits, 1);
    cr_assert_eq(g.last_used_at, used);
    store_kernel_free(&g);

    cr_assert_eq(store_kernel_get(st, k.key, &g, &e), 0);
    cr_assert_eq(g.hits, 2);
    cr_assert_gt(g.last_used_at, used);
    store_kernel_free(&g);

    store_stats s = stats(st);
    cr_assert_eq(s.kernels, 1);
    cr_assert_eq(s.bytes, 3500);
    cr_assert_eq(s.hits, 2);
    cr_assert_eq(s.misses, 0);
    cr_assert_eq(s.corrupt, 0);
    store_kernel_free(&k);
    store_close(st);
    tmp_remove(&t);
}

Test(store, optional_fields_read_back_as_null_and_nan)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    uint8_t bin[] = {1, 2, 3};
    store_kernel k = {.workload_hash = "w",
                      .target_hash = "t",
                      .binary = bin,
                      .binary_size = 3,
                      .format = "elf-so",
                      .entry = "f",
                      .est_time_s = NAN,
                      .measured_time_s = NAN};
    cr_assert_eq(store_cache_key("w", "t", "c", "m", NULL, k.key, NULL), 0);
    tlm_error e = {0};
    cr_assert_eq(store_kernel_put(st, &k, &e), 0, "%s", e.msg);
    store_kernel g;
    cr_assert_eq(store_kernel_get(st, k.key, &g, &e), 0);
    cr_assert_null(g.source);
    cr_assert_null(g.schedule);
    cr_assert_null(g.launch_json);
    assert_str(g.schedule_source, "unknown", "a kernel stored without a source");
    cr_assert(isnan(g.est_time_s));
    cr_assert(isnan(g.measured_time_s));
    cr_assert_eq(stats(st).bytes, 3);
    store_kernel_free(&g);
    store_close(st);
    tmp_remove(&t);
}

Test(store, put_rejects_bad_kernels)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    store_kernel k;
    mk_kernel(&k, 1, 10, 10);
    tlm_error e = {0};
    char *fmt = k.format;
    k.format = "ptx";
    cr_assert_eq(store_kernel_put(st, &k, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "format");
    k.format = fmt;
    size_t n = k.binary_size;
    k.binary_size = 0;
    cr_assert_eq(store_kernel_put(st, &k, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "binary");
    k.binary_size = n;
    k.key[3] = 'G';
    cr_assert_eq(store_kernel_put(st, &k, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "key");
    cr_assert_eq(stats(st).kernels, 0);
    store_kernel_free(&k);
    store_close(st);
    tmp_remove(&t);
}

Test(store, miss_on_unknown_key_and_bad_key)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    char key[65];
    cr_assert_eq(store_cache_key("nothing", "t", "c", "m", NULL, key, NULL), 0);
    store_kernel g;
    tlm_error e = {0};
    cr_assert_eq(store_kernel_get(st, key, &g, &e), TLM_ENOTFOUND);
    cr_assert_eq(store_kernel_meta(st, key, &g, &e), TLM_ENOTFOUND);
    cr_assert_eq(store_kernel_get(st, "abc", &g, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "key");
    cr_assert_eq(store_kernel_get(st, "../../../../etc/passwd", &g, &e), TLM_EINVAL);
    store_stats s = stats(st);
    cr_assert_eq(s.misses, 1);
    cr_assert_eq(s.hits, 0);
    store_close(st);
    tmp_remove(&t);
}

Test(store, replace_and_delete)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    store_kernel a, b;
    mk_kernel(&a, 1, 100, 10);
    mk_kernel(&b, 2, 200, 20);
    memcpy(b.key, a.key, sizeof a.key); /* same key, new content */
    tlm_error e = {0};
    cr_assert_eq(store_kernel_put(st, &a, &e), 0);
    store_kernel g;
    cr_assert_eq(store_kernel_get(st, a.key, &g, &e), 0);
    store_kernel_free(&g);
    cr_assert_eq(store_kernel_put(st, &b, &e), 0);
    cr_assert_eq(store_kernel_get(st, a.key, &g, &e), 0);
    cr_assert_eq(g.binary_size, 200);
    cr_assert_eq(memcmp(g.binary, b.binary, 200), 0);
    assert_str(g.entry, b.entry, "entry");
    cr_assert_eq(g.hits, 1, "a replacement starts over");
    store_kernel_free(&g);
    store_stats s = stats(st);
    cr_assert_eq(s.kernels, 1);
    cr_assert_eq(s.bytes, 220);

    cr_assert_eq(store_kernel_delete(st, a.key, &e), 0);
    cr_assert_eq(store_kernel_get(st, a.key, &g, &e), TLM_ENOTFOUND);
    cr_assert_eq(store_kernel_delete(st, a.key, &e), TLM_ENOTFOUND);
    cr_assert_eq(stats(st).kernels, 0);
    store_kernel_free(&a);
    store_kernel_free(&b);
    store_close(st);
    tmp_remove(&t);
}

/* Flips one byte of the blob (a), truncates another blob (b) and edits a recorded
 * checksum (c), all behind the store's back. */
Test(store, checksum_mismatch_is_a_miss_and_deletes_the_row)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    store_kernel a, b, c;
    mk_kernel(&a, 1, 4096, 10);
    mk_kernel(&b, 2, 4096, 10);
    mk_kernel(&c, 3, 4096, 10);
    tlm_error e = {0};
    cr_assert_eq(store_kernel_put(st, &a, &e), 0);
    cr_assert_eq(store_kernel_put(st, &b, &e), 0);
    cr_assert_eq(store_kernel_put(st, &c, &e), 0);

    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(t.path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    sqlite3_stmt *s;
    cr_assert_eq(
        sqlite3_prepare_v2(db, "UPDATE kernels SET binary = ?1 WHERE key = ?2", -1, &s, NULL),
        SQLITE_OK);
    a.binary[1234] ^= 0x20;
    sqlite3_bind_blob(s, 1, a.binary, (int)a.binary_size, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, a.key, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(s), SQLITE_DONE);
    cr_assert_eq(sqlite3_changes(db), 1);
    sqlite3_reset(s);
    sqlite3_bind_blob(s, 1, b.binary, 4000, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, b.key, -1, SQLITE_STATIC);
    cr_assert_eq(sqlite3_step(s), SQLITE_DONE);
    sqlite3_finalize(s);
    char sql[256];
    snprintf(sql, sizeof sql, "UPDATE kernels SET binary_sha256 = '%064d' WHERE key = '%s'", 0,
             c.key);
    cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);

    store_kernel g;
    cr_assert_eq(store_kernel_get(st, a.key, &g, &e), TLM_ENOTFOUND);
    cr_assert_str_eq(e.field, "key");
    store_stats st1 = stats(st);
    cr_assert_eq(st1.corrupt, 1);
    cr_assert_eq(st1.misses, 1);
    cr_assert_eq(st1.hits, 0);
    snprintf(sql, sizeof sql, "SELECT count(*) FROM kernels WHERE key = '%s'", a.key);
    cr_assert_eq(raw_int(t.path, sql), 0, "corrupt row must be deleted");
    /* Gone for good: a second lookup is a plain miss, not a second corruption. */
    cr_assert_eq(store_kernel_get(st, a.key, &g, &e), TLM_ENOTFOUND);
    st1 = stats(st);
    cr_assert_eq(st1.corrupt, 1);
    cr_assert_eq(st1.misses, 2);

    cr_assert_eq(store_kernel_get(st, b.key, &g, &e), TLM_ENOTFOUND);
    cr_assert_eq(store_kernel_get(st, c.key, &g, &e), TLM_ENOTFOUND);
    st1 = stats(st);
    cr_assert_eq(st1.corrupt, 3);
    cr_assert_eq(st1.kernels, 0);
    store_kernel_free(&a);
    store_kernel_free(&b);
    store_kernel_free(&c);
    store_close(st);
    tmp_remove(&t);
}

static bool present(store *st, const char *key)
{
    store_kernel g;
    int rc = store_kernel_meta(st, key, &g, NULL);
    cr_assert(rc == 0 || rc == TLM_ENOTFOUND, "meta rc %d", rc);
    if (rc == 0) store_kernel_free(&g);
    return rc == 0;
}

Test(store, lru_eviction_order)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 3000);
    store_kernel k[7];
    for (int i = 0; i < 6; i++)
        mk_kernel(&k[i], i, 900, 100); /* 1000 bytes each */
    mk_kernel(&k[6], 6, 1900, 100);    /* 2000 bytes */
    tlm_error e = {0};
    store_kernel g;
    enum { A, B, C, D, E, F, BIG };
    cr_assert_eq(store_kernel_put(st, &k[A], &e), 0);
    cr_assert_eq(store_kernel_put(st, &k[B], &e), 0);
    cr_assert_eq(store_kernel_put(st, &k[C], &e), 0);
    cr_assert_eq(stats(st).evictions, 0);
    cr_assert_eq(store_kernel_get(st, k[A].key, &g, &e), 0); /* A is now newer than B, C */
    store_kernel_free(&g);

    cr_assert_eq(store_kernel_put(st, &k[D], &e), 0, "%s", e.msg);
    cr_assert(present(st, k[A].key));
    cr_assert_not(present(st, k[B].key), "B was least recently used");
    cr_assert(present(st, k[C].key));
    cr_assert(present(st, k[D].key));
    store_stats s = stats(st);
    cr_assert_eq(s.evictions, 1);
    cr_assert_eq(s.bytes, 3000);

    cr_assert_eq(store_kernel_get(st, k[C].key, &g, &e), 0); /* order now A, D, C */
    store_kernel_free(&g);
    cr_assert_eq(store_kernel_put(st, &k[E], &e), 0);
    cr_assert_not(present(st, k[A].key), "A was least recently used");
    cr_assert(present(st, k[C].key));
    cr_assert(present(st, k[D].key));
    cr_assert(present(st, k[E].key));

    /* 2000 bytes more needs two victims: D then C (E is newer). */
    cr_assert_eq(store_kernel_put(st, &k[BIG], &e), 0);
    cr_assert_not(present(st, k[D].key));
    cr_assert_not(present(st, k[C].key));
    cr_assert(present(st, k[E].key));
    cr_assert(present(st, k[BIG].key));
    s = stats(st);
    cr_assert_eq(s.evictions, 4);
    cr_assert_eq(s.bytes, 3000);
    cr_assert_eq(s.kernels, 2);

    /* Larger than the whole bound: refused, nothing evicted. */
    store_kernel huge;
    mk_kernel(&huge, 99, 3001, 0);
    cr_assert_eq(store_kernel_put(st, &huge, &e), TLM_ELIMIT);
    s = stats(st);
    cr_assert_eq(s.evictions, 4);
    cr_assert_eq(s.kernels, 2);
    store_kernel_free(&huge);
    for (int i = 0; i < 7; i++)
        store_kernel_free(&k[i]);
    (void)F;
    store_close(st);
    tmp_remove(&t);
}

/* ---- schema and files -------------------------------------------------------------- */

Test(store, schema_version_wal_and_reopen)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    store_kernel k;
    mk_kernel(&k, 5, 1000, 100);
    tlm_error e = {0};
    cr_assert_eq(store_kernel_put(st, &k, &e), 0);
    cr_assert_eq(store_meta_set(st, "weights", "tlm.bin", &e), 0);
    store_close(st);

    /* Clean close: everything checkpointed, no WAL content left behind. */
    char wal[160];
    snprintf(wal, sizeof wal, "%s-wal", t.path);
    struct stat sb;
    cr_assert(stat(wal, &sb) != 0 || sb.st_size == 0, "WAL left with %lld bytes",
              (long long)sb.st_size);
    cr_assert_eq(raw_int(t.path, "SELECT max(version) FROM schema_version"), STORE_SCHEMA_VERSION);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM schema_version"), STORE_SCHEMA_VERSION);

    for (int round = 0; round < 2; round++) {
        st = open_store(t.path, 0);
        store_kernel g;
        cr_assert_eq(store_kernel_get(st, k.key, &g, &e), 0, "%s", e.msg);
        cr_assert_eq(g.hits, round + 1);
        store_kernel_free(&g);
        char *v = NULL;
        cr_assert_eq(store_meta_get(st, "weights", &v, &e), 0);
        cr_assert_str_eq(v, "tlm.bin");
        free(v);
        cr_assert_eq(store_meta_get(st, "absent", &v, &e), TLM_ENOTFOUND);
        store_close(st);
    }
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM schema_version"), STORE_SCHEMA_VERSION,
                 "reopening must not re-run migrations");
    /* journal_mode is persistent in the file: a fresh raw connection sees WAL. */
    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(t.path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "wal");
    sqlite3_finalize(s);
    sqlite3_close(db);
    store_kernel_free(&k);
    tmp_remove(&t);
}

Test(store, version_zero_database_is_migrated)
{
    tmp t;
    tmp_make(&t);
    raw_exec(t.path, "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
                     "applied_at INTEGER NOT NULL);"
                     "INSERT INTO schema_version VALUES (0, 0);"
                     "CREATE TABLE legacy (x INTEGER); INSERT INTO legacy VALUES (42);");
    store *st = open_store(t.path, 0);
    store_kernel k;
    mk_kernel(&k, 1, 64, 8);
    tlm_error e = {0};
    cr_assert_eq(store_kernel_put(st, &k, &e), 0, "%s", e.msg);
    store_measurement m = {.workload_hash = "w",
                           .target_hash = "t",
                           .schedule = "s",
                           .status = "ok",
                           .gflops = 1,
                           .median_s = 1,
                           .rel_err = 0};
    cr_assert_eq(store_measurement_add(st, &m, NULL, &e), 0, "%s", e.msg);
    store_close(st);
    cr_assert_eq(raw_int(t.path, "SELECT max(version) FROM schema_version"), STORE_SCHEMA_VERSION);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM schema_version"), 1 + STORE_SCHEMA_VERSION);
    cr_assert_eq(raw_int(t.path, "SELECT x FROM legacy"), 42, "migration must keep other data");
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM sqlite_master WHERE name IN "
                                 "('kernels','measurements','tuner_nodes','tuner_edges','meta')"),
                 5);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM kernels"), 1);
    store_kernel_free(&k);
    tmp_remove(&t);
}

Test(store, empty_file_and_newer_version)
{
    tmp t;
    tmp_make(&t);
    /* A zero-byte file (touch) is an empty database: initialised like a new one. */
    FILE *f = fopen(t.path, "w");
    cr_assert_not_null(f);
    fclose(f);
    store *st = open_store(t.path, 0);
    store_close(st);
    cr_assert_eq(raw_int(t.path, "SELECT max(version) FROM schema_version"), STORE_SCHEMA_VERSION);

    /* A file from a newer tlmd is refused and left alone. */
    raw_exec(t.path, "INSERT INTO schema_version VALUES (99, 0)");
    tlm_error e = {0};
    cr_assert_null(store_open(t.path, NULL, &e));
    cr_assert_eq(e.code, TLM_EUNSUPPORTED);
    cr_assert_str_eq(e.field, "store.path");
    cr_assert(strstr(e.msg, "99") != NULL, "%s", e.msg);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM schema_version"), STORE_SCHEMA_VERSION + 1);
    tmp_remove(&t);
}

/* The schema exactly as version 1 shipped it (kernels and measurements; the tuner tables and
 * meta are left out: migration 2 does not touch them). */
static const char schema_v1[] =
    "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL);"
    "INSERT INTO schema_version VALUES (1, 1);"
    "CREATE TABLE kernels ( key TEXT PRIMARY KEY NOT NULL CHECK (length(key) = 64),"
    " workload_hash TEXT NOT NULL, target_hash TEXT NOT NULL, compiler_id TEXT, model_id TEXT,"
    " workload_json TEXT, target_name TEXT, schedule TEXT, sentence TEXT, source TEXT,"
    " binary BLOB NOT NULL, binary_sha256 TEXT NOT NULL, binary_size INTEGER NOT NULL,"
    " format TEXT NOT NULL CHECK (format IN ('elf-so', 'cubin')), entry TEXT NOT NULL,"
    " launch_json TEXT, est_time_s REAL, measured_time_s REAL, bytes INTEGER NOT NULL,"
    " created_at INTEGER NOT NULL, last_used_at INTEGER NOT NULL,"
    " hits INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX kernels_lru ON kernels (last_used_at, hits, key, bytes);"
    "CREATE TABLE measurements ( id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " workload_hash TEXT NOT NULL, target_hash TEXT NOT NULL, sketch TEXT,"
    " schedule TEXT NOT NULL, status TEXT NOT NULL, median_s REAL, gflops REAL, rel_err REAL,"
    " created_at INTEGER NOT NULL);"
    "CREATE INDEX measurements_best ON measurements (workload_hash, target_hash, gflops);"
    "CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT);";

Test(store, version_one_database_is_migrated_with_its_data)
{
    tmp t;
    tmp_make(&t);
    /* a v1 file written by an older tlmd: one kernel (binary "abc") and one measurement */
    char sha[65], key[65];
    sha_hex("abc", 3, sha);
    cr_assert_eq(store_cache_key("w", "t", "c", "m", "", key, NULL), 0);
    char sql[4096];
    snprintf(sql, sizeof sql,
             "%s INSERT INTO kernels (key, workload_hash, target_hash, model_id, schedule, binary,"
             " binary_sha256, binary_size, format, entry, bytes, created_at, last_used_at, hits)"
             " VALUES ('%s', 'wh', 'th', 'old-model', 'tile(i,4)', CAST('abc' AS BLOB), '%s', 3,"
             " 'elf-so', 'f', 3, 10, 10, 5);"
             "INSERT INTO measurements (workload_hash, target_hash, schedule, status, median_s,"
             " gflops, rel_err, created_at) VALUES ('wh', 'th', 'tile(i,4)', 'ok', 0.5, 2.0, 0,"
             " 10);",
             schema_v1, key, sha);
    raw_exec(t.path, sql);

    store *st = open_store(t.path, 0);
    cr_assert_eq(raw_int(t.path, "SELECT max(version) FROM schema_version"), STORE_SCHEMA_VERSION);
    /* the old kernel is served as before; its source is not known */
    store_kernel g;
    tlm_error e = {0};
    cr_assert_eq(store_kernel_get(st, key, &g, &e), 0, "%s", e.msg);
    cr_assert_eq(g.binary_size, 3);
    cr_assert_eq(memcmp(g.binary, "abc", 3), 0);
    assert_str(g.model_id, "old-model", "model_id");
    assert_str(g.schedule, "tile(i,4)", "schedule");
    assert_str(g.schedule_source, "unknown", "schedule_source of a v1 row");
    cr_assert_eq(g.hits, 6);
    store_kernel_free(&g);
    /* the old measurement reads back, the new fields empty */
    store_measurement *ms;
    size_t n;
    cr_assert_eq(store_measurements_best(st, "wh", "th", 5, &ms, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 1);
    assert_str(ms[0].schedule, "tile(i,4)", "schedule");
    cr_assert_float_eq(ms[0].gflops, 2.0, 0);
    cr_assert_null(ms[0].workload_json);
    cr_assert_null(ms[0].schedule_source);
    cr_assert_null(ms[0].host_id);
    cr_assert(isnan(ms[0].min_s));
    cr_assert_eq(ms[0].n_samples, 0);
    store_measurements_free(ms, n);
    /* and the new columns work on the migrated file */
    store_kernel k;
    mk_kernel(&k, 3, 32, 8);
    cr_assert_eq(store_kernel_put(st, &k, &e), 0, "%s", e.msg);
    cr_assert_eq(store_kernel_meta(st, k.key, &g, &e), 0);
    assert_str(g.schedule_source, "topk", "schedule_source after migration");
    store_kernel_free(&g);
    store_kernel_free(&k);
    store_close(st);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM schema_version"), 2);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM kernels"), 2);
    tmp_remove(&t);
}

Test(store, bad_paths_give_clean_errors)
{
    tlm_error e = {0};
    cr_assert_null(store_open(NULL, NULL, &e));
    cr_assert_eq(e.code, TLM_EINVAL);
    cr_assert_null(store_open(":memory:", NULL, &e));
    cr_assert_eq(e.code, TLM_EINVAL);
    store_opts bad = {.max_bytes = -1};
    cr_assert_null(store_open("/tmp/x.db", &bad, &e));
    cr_assert_str_eq(e.field, "store.max_bytes");

    cr_assert_null(store_open("/nonexistent-dir-tlm/sub/kernels.db", NULL, &e));
    cr_assert_eq(e.code, TLM_EIO);
    cr_assert_str_eq(e.field, "store.path");
    cr_assert(strstr(e.msg, "/nonexistent-dir-tlm/sub/kernels.db") != NULL, "%s", e.msg);

    /* An unwritable directory. Root ignores mode bits, so as root use /proc, where nobody
     * can create files. */
    tmp t;
    tmp_make(&t);
    char path[160];
    if (geteuid() != 0) {
        cr_assert_eq(chmod(t.dir, 0555), 0);
        snprintf(path, sizeof path, "%s/kernels.db", t.dir);
    } else {
        snprintf(path, sizeof path, "/proc/tlm-store-test.db");
    }
    memset(&e, 0, sizeof e);
    cr_assert_null(store_open(path, NULL, &e));
    cr_assert_eq(e.code, TLM_EIO);
    cr_assert_str_eq(e.field, "store.path");
    cr_assert(strstr(e.msg, path) != NULL, "%s", e.msg);
    chmod(t.dir, 0755);

    /* The path is a directory. */
    memset(&e, 0, sizeof e);
    cr_assert_null(store_open(t.dir, NULL, &e));
    cr_assert_eq(e.code, TLM_EIO);

    /* Not a database at all. */
    FILE *f = fopen(t.path, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < 200; i++)
        fputs("this is not an sqlite database\n", f);
    fclose(f);
    memset(&e, 0, sizeof e);
    cr_assert_null(store_open(t.path, NULL, &e));
    cr_assert_eq(e.code, TLM_EIO);
    cr_assert_str_eq(e.field, "store.path");
    tmp_remove(&t);
}

/* ---- measurements ------------------------------------------------------------------ */

Test(store, measurements_best_ranks_ok_records_by_gflops)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    struct {
        const char *wh, *status;
        double gflops;
    } rows[] = {{"w1", "ok", 1.0},  {"w1", "ok", 5.0}, {"w1", "ok", 3.0},     {"w1", "wrong", 100},
                {"w2", "ok", 50.0}, {"w1", "ok", 2.0}, {"w1", "timeout", NAN}};
    tlm_error e = {0};
    int64_t last = 0;
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char sched[32];
        snprintf(sched, sizeof sched, "sched-%zu", i);
        store_measurement m = {.workload_hash = (char *)rows[i].wh,
                               .target_hash = "t",
                               .sketch = "sk",
                               .schedule = sched,
                               .status = (char *)rows[i].status,
                               .median_s = 0.5,
                               .gflops = rows[i].gflops,
                               .rel_err = 1e-6};
        int64_t id = 0;
        cr_assert_eq(store_measurement_add(st, &m, &id, &e), 0, "%s", e.msg);
        cr_assert_gt(id, last);
        last = id;
    }
    store_measurement *ms;
    size_t n;
    cr_assert_eq(store_measurements_best(st, "w1", "t", 3, &ms, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 3);
    cr_assert_float_eq(ms[0].gflops, 5.0, 0);
    cr_assert_float_eq(ms[1].gflops, 3.0, 0);
    cr_assert_float_eq(ms[2].gflops, 2.0, 0);
    cr_assert_str_eq(ms[0].schedule, "sched-1");
    cr_assert_str_eq(ms[0].sketch, "sk");
    cr_assert_str_eq(ms[0].status, "ok");
    cr_assert_float_eq(ms[0].median_s, 0.5, 0);
    cr_assert_float_eq(ms[0].rel_err, 1e-6, 0);
    cr_assert_gt(ms[0].created_at, 0);
    store_measurements_free(ms, n);

    cr_assert_eq(store_measurements_best(st, "w1", "other", 3, &ms, &n, &e), 0);
    cr_assert_eq(n, 0);
    cr_assert_null(ms);
    cr_assert_eq(store_measurements_best(st, "w1", "t", 0, &ms, &n, &e), TLM_EINVAL);
    store_measurement bad = {.workload_hash = "w", .target_hash = "t", .schedule = "s"};
    cr_assert_eq(store_measurement_add(st, &bad, NULL, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "status");
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM measurements"), 7);
    store_close(st);
    tmp_remove(&t);
}

Test(store, measurement_records_keep_everything_a_trainer_needs)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    tlm_error e = {0};
    store_measurement m = {.workload_hash = "w",
                           .target_hash = "t",
                           .schedule = "tile(i,8)",
                           .status = "ok",
                           .median_s = 2e-3,
                           .gflops = 7.5,
                           .rel_err = 1e-7,
                           .workload_json = "{\"op\":\"dense\"}",
                           .target_name = "cpu:avx2",
                           .toolchain_id = "gcc 12; flags=-mavx2",
                           .model_id = "none",
                           .sentence = "T 8 V 16",
                           .schedule_source = "topk",
                           .min_s = 1.5e-3,
                           .n_samples = 5,
                           .detail = NULL};
    cr_assert_eq(store_measurement_add(st, &m, NULL, &e), 0, "%s", e.msg);
    store_measurement f = {.workload_hash = "w",
                           .target_hash = "t",
                           .schedule = "tile(i,3)",
                           .status = "build_error",
                           .median_s = NAN,
                           .gflops = NAN,
                           .rel_err = NAN,
                           .min_s = NAN,
                           .schedule_source = "topk",
                           .host_id = "elsewhere",
                           .detail = "cc: error"};
    cr_assert_eq(store_measurement_add(st, &f, NULL, &e), 0, "%s", e.msg);
    store_measurement *ms;
    size_t n;
    cr_assert_eq(store_measurements_list(st, "w", "t", 10, &ms, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 2, "every record, whatever its status, oldest first");
    assert_str(ms[0].workload_json, "{\"op\":\"dense\"}", "workload_json");
    assert_str(ms[0].target_name, "cpu:avx2", "target_name");
    assert_str(ms[0].toolchain_id, "gcc 12; flags=-mavx2", "toolchain_id");
    assert_str(ms[0].model_id, "none", "model_id");
    assert_str(ms[0].sentence, "T 8 V 16", "sentence");
    assert_str(ms[0].schedule_source, "topk", "schedule_source");
    cr_assert_float_eq(ms[0].min_s, 1.5e-3, 0);
    cr_assert_eq(ms[0].n_samples, 5);
    /* no host given: this machine's id, the same for every record of this process */
    assert_str(ms[0].host_id, store_host_id(), "host_id");
    cr_assert_eq(strlen(store_host_id()), 16);
    cr_assert_null(ms[0].detail);
    assert_str(ms[1].status, "build_error", "status");
    assert_str(ms[1].host_id, "elsewhere", "an explicit host id");
    assert_str(ms[1].detail, "cc: error", "detail");
    cr_assert(isnan(ms[1].median_s) && isnan(ms[1].min_s));
    cr_assert_eq(ms[1].n_samples, 0);
    store_measurements_free(ms, n);
    cr_assert_eq(store_measurements_list(st, "w", "t", 1, &ms, &n, &e), 0);
    cr_assert_eq(n, 1);
    assert_str(ms[0].schedule, "tile(i,8)", "the limit keeps the oldest");
    store_measurements_free(ms, n);
    store_close(st);
    tmp_remove(&t);
}

/* ---- threads ----------------------------------------------------------------------- */

enum { N_THREADS = 4, PER_THREAD = 40 };

typedef struct writer_arg {
    store *st;
    int id;
    int failures;
    store_conn *conn;
    char msg[640];
} writer_arg;

static void *writer(void *p)
{
    writer_arg *a = p;
    tlm_error e = {0};
    a->conn = store_conn_get(a->st, &e);
    for (int i = 0; i < PER_THREAD; i++) {
        int n = a->id * 1000 + i;
        store_kernel k;
        mk_kernel(&k, n, 512 + (size_t)i, 64);
        int rc = store_kernel_put(a->st, &k, &e);
        store_measurement m = {.workload_hash = k.workload_hash,
                               .target_hash = "t",
                               .schedule = k.schedule,
                               .status = "ok",
                               .gflops = n,
                               .median_s = 1e-3,
                               .rel_err = 0};
        if (rc == 0) rc = store_measurement_add(a->st, &m, NULL, &e);
        store_kernel g;
        if (rc == 0) rc = store_kernel_get(a->st, k.key, &g, &e);
        if (rc == 0) {
            if (g.binary_size != k.binary_size || memcmp(g.binary, k.binary, k.binary_size))
                rc = -100;
            store_kernel_free(&g);
        }
        if (rc != 0 && a->failures++ == 0)
            snprintf(a->msg, sizeof a->msg, "thread %d item %d: rc %d %s", a->id, i, rc, e.msg);
        store_kernel_free(&k);
    }
    return NULL;
}

Test(store, concurrent_writers_each_with_own_connection)
{
    tmp t;
    tmp_make(&t);
    /* A short lock wait would turn contention into failures; the default is what the
     * daemon uses. */
    store *st = open_store(t.path, 0);
    pthread_t th[N_THREADS];
    writer_arg args[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (writer_arg){.st = st, .id = i};
        cr_assert_eq(pthread_create(&th[i], NULL, writer, &args[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_THREADS; i++) {
        cr_assert_eq(args[i].failures, 0, "%s", args[i].msg);
        cr_assert_not_null(args[i].conn);
        for (int j = 0; j < i; j++)
            cr_assert_neq(args[i].conn, args[j].conn);
    }
    store_stats s = stats(st);
    cr_assert_eq(s.kernels, N_THREADS * PER_THREAD);
    cr_assert_eq(s.hits, N_THREADS * PER_THREAD);
    store_close(st);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM measurements"), N_THREADS * PER_THREAD);
    tmp_remove(&t);
}

/* A worker thread outlives one store and uses the next: its stale slot must never be
 * mistaken for a connection of the new store, and its exit must not touch the closed one
 * (ASan would catch either). */
typedef struct relay {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    store *st;
    int step, done, rc;
    char key[65];
} relay;

static void *relay_worker(void *p)
{
    relay *r = p;
    for (int step = 1; step <= 2; step++) {
        pthread_mutex_lock(&r->mu);
        while (r->step < step)
            pthread_cond_wait(&r->cv, &r->mu);
        store *st = r->st;
        pthread_mutex_unlock(&r->mu);
        store_kernel g;
        int rc = store_kernel_meta(st, r->key, &g, NULL);
        if (rc == 0) store_kernel_free(&g);
        pthread_mutex_lock(&r->mu);
        /* Step 1: the key is in store 1; step 2: store 2 is empty. */
        if ((step == 1 && rc != 0) || (step == 2 && rc != TLM_ENOTFOUND)) r->rc = rc ? rc : -1;
        r->done = step;
        pthread_cond_signal(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

Test(store, thread_outlives_a_store)
{
    tmp t1, t2;
    tmp_make(&t1);
    tmp_make(&t2);
    relay r = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    store *s1 = open_store(t1.path, 0);
    store_kernel k;
    mk_kernel(&k, 3, 100, 10);
    cr_assert_eq(store_kernel_put(s1, &k, NULL), 0);
    memcpy(r.key, k.key, sizeof r.key);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, relay_worker, &r), 0);

    pthread_mutex_lock(&r.mu);
    r.st = s1;
    r.step = 1;
    pthread_cond_broadcast(&r.cv);
    while (r.done < 1)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);

    store_close(s1); /* closes the worker's connection too */
    store *s2 = open_store(t2.path, 0);
    pthread_mutex_lock(&r.mu);
    r.st = s2;
    r.step = 2;
    pthread_cond_broadcast(&r.cv);
    while (r.done < 2)
        pthread_cond_wait(&r.cv, &r.mu);
    pthread_mutex_unlock(&r.mu);
    pthread_join(th, NULL);
    cr_assert_eq(r.rc, 0);

    /* This thread's own connection can be dropped and reopened. */
    store_conn_release(s2);
    cr_assert_eq(store_kernel_put(s2, &k, NULL), 0);
    cr_assert(present(s2, k.key));
    store_close(s2);
    store_kernel_free(&k);
    tmp_remove(&t1);
    tmp_remove(&t2);
}

/* ---- crash safety ------------------------------------------------------------------ */

Test(store, kill_9_mid_write_leaves_a_sound_database, .timeout = 120)
{
    tmp t;
    tmp_make(&t);
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        close(fd[0]);
        store *st = store_open(t.path, NULL, NULL);
        if (!st) _exit(3);
        for (int i = 0; i < 100000; i++) {
            store_kernel k;
            mk_kernel(&k, i, 64 * 1024, 1024);
            store_measurement m = {.workload_hash = k.workload_hash,
                                   .target_hash = "t",
                                   .schedule = k.schedule,
                                   .status = "ok",
                                   .gflops = i};
            if (store_kernel_put(st, &k, NULL) != 0 ||
                store_measurement_add(st, &m, NULL, NULL) != 0)
                _exit(4);
            store_kernel_free(&k);
            /* Announce only what is committed. */
            if (write(fd[1], &i, sizeof i) != sizeof i) _exit(5);
        }
        _exit(0);
    }
    close(fd[1]);
    int acked = -1, v;
    while (acked < 40 && read(fd[0], &v, sizeof v) == sizeof v)
        acked = v;
    cr_assert_geq(acked, 40, "writer died early");
    kill(pid, SIGKILL);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "writer must be killed mid-way, not finish");
    /* Drain acknowledgements sent between our last read and the kill. */
    while (read(fd[0], &v, sizeof v) == sizeof v)
        acked = v;
    close(fd[0]);

    sqlite3 *db;
    cr_assert_eq(sqlite3_open_v2(t.path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    sqlite3_stmt *s;
    cr_assert_eq(sqlite3_prepare_v2(db, "PRAGMA integrity_check", -1, &s, NULL), SQLITE_OK);
    cr_assert_eq(sqlite3_step(s), SQLITE_ROW);
    cr_assert_str_eq((const char *)sqlite3_column_text(s, 0), "ok");
    sqlite3_finalize(s);
    sqlite3_close(db);

    store *st = open_store(t.path, 0);
    for (int i = 0; i <= acked; i++) {
        store_kernel k, g;
        mk_kernel(&k, i, 64 * 1024, 1024);
        tlm_error e = {0};
        cr_assert_eq(store_kernel_get(st, k.key, &g, &e), 0, "kernel %d of %d: %s", i, acked,
                     e.msg);
        cr_assert_eq(g.binary_size, k.binary_size);
        cr_assert_eq(memcmp(g.binary, k.binary, k.binary_size), 0);
        store_kernel_free(&g);
        store_kernel_free(&k);
    }
    store_stats ss = stats(st);
    cr_assert_eq(ss.corrupt, 0);
    cr_assert_geq(ss.kernels, acked + 1);
    store_close(st);
    cr_assert_geq(raw_int(t.path, "SELECT count(*) FROM measurements"), acked + 1);
    tmp_remove(&t);
}

Test(store, measurements_page_through_and_import_merges_duplicates)
{
    tmp t;
    tmp_make(&t);
    store *st = open_store(t.path, 0);
    tlm_error e = {0};
    for (int i = 0; i < 25; i++) {
        char sched[32];
        snprintf(sched, sizeof sched, "s-%d", i);
        store_measurement m = {.workload_hash = i % 2 ? "wa" : "wb",
                               .target_hash = "t",
                               .schedule = sched,
                               .status = "ok",
                               .median_s = 1e-3 * (i + 1),
                               .gflops = NAN,
                               .rel_err = NAN,
                               .min_s = NAN};
        cr_assert_eq(store_measurement_add(st, &m, NULL, &e), 0, "%s", e.msg);
    }
    /* pages of 10 cover every record once, oldest first */
    int64_t after = 0;
    int seen = 0, pages = 0;
    for (;;) {
        store_measurement *ms;
        size_t n;
        cr_assert_eq(store_measurements_page(st, after, 10, &ms, &n, &e), 0, "%s", e.msg);
        for (size_t i = 0; i < n; i++) {
            cr_assert_gt(ms[i].id, after);
            after = ms[i].id;
            char want[32];
            snprintf(want, sizeof want, "s-%d", seen++);
            cr_assert_str_eq(ms[i].schedule, want);
        }
        store_measurements_free(ms, n);
        pages++;
        if (n < 10) break;
    }
    cr_assert_eq(seen, 25);
    cr_assert_eq(pages, 3);

    /* an imported record keeps its time and host; the same record again changes nothing */
    store_measurement imp = {.workload_hash = "wc",
                             .target_hash = "t",
                             .schedule = "x",
                             .status = "ok",
                             .median_s = 2e-3,
                             .gflops = NAN,
                             .rel_err = NAN,
                             .min_s = NAN,
                             .host_id = "feedfacecafebeef",
                             .created_at = 1700000000000000};
    bool added = false;
    cr_assert_eq(store_measurement_import(st, &imp, &added, &e), 0, "%s", e.msg);
    cr_assert(added);
    cr_assert_eq(store_measurement_import(st, &imp, &added, &e), 0, "%s", e.msg);
    cr_assert(!added, "a duplicate was added");
    imp.status = "wrong"; /* another outcome is another record */
    cr_assert_eq(store_measurement_import(st, &imp, &added, &e), 0);
    cr_assert(added);
    cr_assert_eq(raw_int(t.path, "SELECT count(*) FROM measurements WHERE workload_hash = 'wc'"),
                 2);
    cr_assert_eq(raw_int(t.path, "SELECT created_at FROM measurements WHERE workload_hash = 'wc' "
                                 "AND status = 'ok'"),
                 1700000000000000);
    store_measurement *ms;
    size_t n;
    cr_assert_eq(store_measurements_list(st, "wc", "t", 10, &ms, &n, &e), 0);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(ms[0].host_id, "feedfacecafebeef");
    store_measurements_free(ms, n);
    cr_assert_eq(store_measurements_page(st, 0, 0, &ms, &n, &e), TLM_EINVAL);
    store_close(st);
    tmp_remove(&t);
}

/* With defer_touch a hit never takes the write lock: it is served while another writer holds
 * it (issue 15: a hit waited behind compile inserts and checkpoints), its use shows in meta at
 * once and reaches the file with store_touch_flush. Without it the same hit waits out the
 * busy timeout and fails. No timing is asserted. */
Test(store, deferred_touch_hits_do_not_wait_for_writers)
{
    tmp t;
    tmp_make(&t);
    for (int defer = 0; defer < 2; defer++) {
        store_opts o = {.busy_timeout_ms = 50, .defer_touch = defer};
        tlm_error e = {0};
        store *st = store_open(t.path, &o, &e);
        cr_assert_not_null(st, "%s", e.msg);
        store_kernel k;
        mk_kernel(&k, 40 + defer, 1000, 100);
        cr_assert_eq(store_kernel_put(st, &k, &e), 0, "%s", e.msg);
        int64_t hits0 = 0;
        char sql[200];
        snprintf(sql, sizeof sql, "SELECT hits FROM kernels WHERE key = '%s'", k.key);
        hits0 = raw_int(t.path, sql);
        /* another connection holds the write lock */
        sqlite3 *db;
        cr_assert_eq(sqlite3_open_v2(t.path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
        cr_assert_eq(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL), SQLITE_OK);
        store_kernel g;
        int rc = store_kernel_get(st, k.key, &g, &e);
        if (!defer) {
            cr_assert_neq(rc, 0, "a hit that writes its use should have waited for the lock");
        } else {
            cr_assert_eq(rc, 0, "%s", e.msg);
            cr_assert_eq(g.binary_size, k.binary_size);
            store_kernel_free(&g);
            cr_assert_eq(store_touch_pending(st), 1);
            store_kernel m;
            cr_assert_eq(store_kernel_meta(st, k.key, &m, &e), 0, "%s", e.msg);
            cr_assert_eq(m.hits, hits0 + 1, "meta counts the use not yet written");
            store_kernel_free(&m);
        }
        cr_assert_eq(sqlite3_exec(db, "COMMIT", NULL, NULL, NULL), SQLITE_OK);
        sqlite3_close(db);
        if (defer) {
            cr_assert_eq(store_touch_flush(st, &e), 0, "%s", e.msg);
            cr_assert_eq(store_touch_pending(st), 0);
            cr_assert_eq(raw_int(t.path, sql), hits0 + 1);
            /* and store_close writes what is left */
            cr_assert_eq(store_kernel_get(st, k.key, &g, &e), 0, "%s", e.msg);
            store_kernel_free(&g);
        }
        store_close(st);
        if (defer) cr_assert_eq(raw_int(t.path, sql), hits0 + 2);
        store_kernel_free(&k);
    }
    tmp_remove(&t);
}

/* store_kernel_copy is deep (the copy outlives the original, every field equal, no shared
 * pointer); store_kernel_note_use counts a use served from such a copy exactly as a hit
 * through store_kernel_get counts, in memory, only when uses are deferred. */
Test(store, kernel_copy_is_deep_and_noted_uses_count_as_hits)
{
    tmp t;
    tmp_make(&t);
    store_kernel k, c;
    mk_kernel(&k, 7, 3000, 200);
    cr_assert_eq(store_kernel_copy(&c, &k), 0);
    char *fields[][2] = {{k.workload_hash, c.workload_hash}, {k.source, c.source},
                         {k.launch_json, c.launch_json},     {k.schedule_source, c.schedule_source},
                         {k.entry, c.entry},                 {k.sentence, c.sentence}};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        cr_assert_neq(fields[i][0], fields[i][1], "field %zu shared", i);
        cr_assert_str_eq(fields[i][0], fields[i][1]);
    }
    cr_assert_neq(k.binary, c.binary);
    cr_assert_eq(c.binary_size, k.binary_size);
    cr_assert_eq(memcmp(c.binary, k.binary, k.binary_size), 0);
    cr_assert_str_eq(c.key, k.key);
    store_kernel_free(&k);
    for (size_t j = 0; j < c.binary_size; j++)
        cr_assert_eq(c.binary[j], pattern(7, j));
    /* NULL fields stay NULL */
    store_kernel sparse = {0}, sc;
    cr_assert_eq(store_kernel_copy(&sc, &sparse), 0);
    cr_assert_null(sc.source);
    cr_assert_null(sc.binary);
    store_kernel_free(&sc);

    for (int defer = 0; defer < 2; defer++) {
        store_opts o = {.defer_touch = defer};
        tlm_error e = {0};
        store *st = store_open(t.path, &o, &e);
        cr_assert_not_null(st, "%s", e.msg);
        cr_assert_eq(store_kernel_put(st, &c, &e), 0, "%s", e.msg);
        store_kernel m0, m1;
        cr_assert_eq(store_kernel_meta(st, c.key, &m0, &e), 0, "%s", e.msg);
        bool noted = store_kernel_note_use(st, c.key);
        cr_assert_eq(noted, defer, "a use is noted in memory only when uses are deferred");
        cr_assert_eq(store_kernel_meta(st, c.key, &m1, &e), 0, "%s", e.msg);
        cr_assert_eq(m1.hits, m0.hits + (defer ? 1 : 0));
        if (defer) cr_assert_gt(m1.last_used_at, m0.last_used_at);
        store_kernel_free(&m0);
        store_kernel_free(&m1);
        store_close(st); /* writes the noted use */
        if (defer) {
            char sql[200];
            snprintf(sql, sizeof sql, "SELECT hits FROM kernels WHERE key = '%s'", c.key);
            cr_assert_eq(raw_int(t.path, sql), 1);
        }
    }
    store_kernel_free(&c);
    tmp_remove(&t);
}
