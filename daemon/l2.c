/* l2.c — the Redis tier (l2.h): URL and password, per-thread hiredis connections with short
 * timeouts, down/back-off state, checksummed kernel blobs, compile leases and their keeper
 * thread, and the tlmd_l2_* metrics. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>
#include <jansson.h>

#include "daemon/l2.h"
#include "daemon/tlmd.h"

#define MAGIC "TLMK1\n"
#define MAGIC_LEN 6

static const double lat_le[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1};
#define N_LAT (int)(sizeof lat_le / sizeof lat_le[0])

typedef struct lease {
    char key[65];
    struct lease *next;
} lease;

struct l2 {
    l2_config c;
    char host[256];
    int port, db;
    char password[512];
    char owner[128];
    pthread_key_t tls;
    /* down state (atomics) */
    int up;                /* 1 when the last attempt worked */
    int64_t down_until_us; /* no attempt before this (monotonic µs) */
    int backoff_ms;
    int warned_down;
    /* counters (atomics) */
    uint64_t hits, misses, errors, corrupt, puts, put_skipped, cnt[L2_C_COUNT];
    uint64_t lat_bucket[N_LAT + 1], lat_count, lat_sum_us;
    /* the keeper */
    pthread_t keeper;
    bool keeper_started, stopping;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    lease *held, *to_release; /* under mu */
};

typedef struct conn {
    l2 *owner;
    redisContext *ctx;
} conn;

#define ADD(x, v) __atomic_fetch_add(&(x), (v), __ATOMIC_RELAXED)
#define GET(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define SET(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static int64_t now_us(void)
{
    return (int64_t)(tlmd_now() * 1e6);
}

void l2_config_defaults(l2_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->ns, sizeof c->ns, "tlmd");
    c->ttl_s = 7 * 86400;
    c->max_blob_bytes = INT64_C(64) << 20;
    c->timeout_ms = 250;
    c->lease_ms = 30000;
    c->claim_idle_ms = 60000;
    c->workers = 1;
}

const l2_config *l2_cfg(const l2 *l)
{
    return &l->c;
}
const char *l2_owner_id(const l2 *l)
{
    return l->owner;
}
bool l2_up(const l2 *l)
{
    return l && GET(((l2 *)l)->up);
}
void l2_count(l2 *l, l2_counter c)
{
    if (l && (unsigned)c < L2_C_COUNT) ADD(l->cnt[c], 1);
}

/* ---- configuration ---- */

static int pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '%') {
            if (i + 2 >= n) return -1;
            char hx[3] = {s[i + 1], s[i + 2], 0};
            char *e;
            long v = strtol(hx, &e, 16);
            if (*e || v == 0) return -1;
            ch = (char)v;
            i += 2;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = ch;
    }
    out[o] = 0;
    return 0;
}

static int parse_url(l2 *l, const char *url, tlm_error *err)
{
    const char *p;
    if (!strncmp(url, "rediss://", 9))
        return tlm_err_set(err, TLM_EUNSUPPORTED, "redis",
                           "\"%.200s\": TLS (rediss://) needs hiredis with TLS support "
                           "(hiredis_ssl, hiredis >= 1.0); this build has hiredis %d.%d without "
                           "it. Reach a TLS Redis through a local tunnel (stunnel, spiped) and "
                           "give its loopback redis:// address",
                           url, HIREDIS_MAJOR, HIREDIS_MINOR);
    if (strncmp(url, "redis://", 8))
        return tlm_err_set(err, TLM_EINVAL, "redis",
                           "\"%.200s\": expected redis://[:PASSWORD@]HOST:PORT[/DB]", url);
    p = url + 8;
    const char *at = strrchr(p, '@');
    if (at) {
        /* user info: ":password" or "user:password" (Redis 6 ACL users are not supported:
         * the user part must be empty or "default") */
        const char *colon = memchr(p, ':', (size_t)(at - p));
        if (!colon)
            return tlm_err_set(err, TLM_EINVAL, "redis",
                               "the user info before '@' must be :PASSWORD");
        if (colon != p && strncmp(p, "default:", 8))
            return tlm_err_set(err, TLM_EINVAL, "redis",
                               "only the default user is supported (redis://:PASSWORD@HOST...)");
        if (pct_decode(colon + 1, (size_t)(at - colon - 1), l->password, sizeof l->password))
            return tlm_err_set(err, TLM_EINVAL, "redis", "the password is malformed or too long");
        p = at + 1;
    }
    size_t hn;
    const char *port_s;
    if (*p == '[') { /* [IPv6]:port */
        const char *rb = strchr(p, ']');
        if (!rb || rb[1] != ':')
            return tlm_err_set(err, TLM_EINVAL, "redis", "expected [ADDR]:PORT after redis://");
        hn = (size_t)(rb - p - 1);
        if (hn == 0 || hn >= sizeof l->host)
            return tlm_err_set(err, TLM_EINVAL, "redis", "bad host");
        memcpy(l->host, p + 1, hn);
        l->host[hn] = 0;
        port_s = rb + 2;
    } else {
        const char *colon = strchr(p, ':');
        const char *slash = strchr(p, '/');
        if (!colon || (slash && slash < colon))
            return tlm_err_set(err, TLM_EINVAL, "redis",
                               "\"%.200s\": expected redis://HOST:PORT[/DB] (the port is required)",
                               url);
        hn = (size_t)(colon - p);
        if (hn == 0 || hn >= sizeof l->host)
            return tlm_err_set(err, TLM_EINVAL, "redis", "the host is empty or too long");
        memcpy(l->host, p, hn);
        l->host[hn] = 0;
        port_s = colon + 1;
    }
    char *end;
    long port = strtol(port_s, &end, 10);
    if (end == port_s || port < 1 || port > 65535 || (*end && *end != '/'))
        return tlm_err_set(err, TLM_EINVAL, "redis", "the port must be 1..65535");
    l->port = (int)port;
    l->db = 0;
    if (*end == '/' && end[1]) {
        const char *d = end + 1;
        long db = strtol(d, &end, 10);
        if (end == d || *end || db < 0 || db > 100000)
            return tlm_err_set(err, TLM_EINVAL, "redis", "the database must be a number >= 0");
        l->db = (int)db;
    }
    return 0;
}

static int read_password(l2 *l, const char *path, tlm_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return tlm_err_set(err, TLM_EINVAL, "redis_password_file", "cannot open %s: %s", path,
                           strerror(errno));
    char line[sizeof l->password];
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    if (ok) line[strcspn(line, "\r\n")] = 0;
    if (!ok || !line[0])
        return tlm_err_set(err, TLM_EINVAL, "redis_password_file",
                           "%s: the first line must hold the password", path);
    snprintf(l->password, sizeof l->password, "%s", line);
    return 0;
}

/* ---- connections ---- */

static void conn_free(void *p)
{
    conn *c = p;
    if (c && c->ctx) redisFree(c->ctx);
    free(c);
}

static void mark_down(l2 *l, const char *why)
{
    int b = GET(l->backoff_ms);
    b = b ? b * 2 : 250;
    if (b > 8000) b = 8000;
    SET(l->backoff_ms, b);
    SET(l->down_until_us, now_us() + (int64_t)b * 1000);
    int was_up = __atomic_exchange_n(&l->up, 0, __ATOMIC_RELAXED);
    if (was_up || !__atomic_exchange_n(&l->warned_down, 1, __ATOMIC_RELAXED))
        tlmd_log(LOG_WARN, "l2_down",
                 "redis=%s:%d error=\"%s\" retry_in_ms=%d hint=\"serving from the local store "
                 "(L1) only until Redis answers again\"",
                 l->host, l->port, why, b);
}

static void mark_up(l2 *l)
{
    SET(l->backoff_ms, 0);
    if (!__atomic_exchange_n(&l->up, 1, __ATOMIC_RELAXED))
        tlmd_log(LOG_INFO, "l2_up", "redis=%s:%d db=%d", l->host, l->port, l->db);
    SET(l->warned_down, 0);
}

static struct timeval tv_ms(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* The calling thread's connection, (re)connected when the back-off allows; NULL when L2 is
 * down. */
static redisContext *ctx_get(l2 *l, bool *fresh)
{
    *fresh = false;
    conn *c = pthread_getspecific(l->tls);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return NULL;
        c->owner = l;
        pthread_setspecific(l->tls, c);
    }
    if (c->ctx) return c->ctx;
    if (now_us() < GET(l->down_until_us)) return NULL;
    redisContext *ctx = redisConnectWithTimeout(l->host, l->port, tv_ms(l->c.timeout_ms));
    if (!ctx || ctx->err) {
        mark_down(l, ctx ? ctx->errstr : "out of memory");
        if (ctx) redisFree(ctx);
        ADD(l->errors, 1);
        return NULL;
    }
    redisSetTimeout(ctx, tv_ms(l->c.timeout_ms));
    redisEnableKeepAlive(ctx);
    char why[300] = "";
    if (l->password[0]) {
        redisReply *r = redisCommand(ctx, "AUTH %s", l->password);
        if (!r || r->type == REDIS_REPLY_ERROR)
            snprintf(why, sizeof why, "AUTH: %s", r ? r->str : ctx->errstr);
        if (r) freeReplyObject(r);
    }
    if (!why[0] && l->db) {
        redisReply *r = redisCommand(ctx, "SELECT %d", l->db);
        if (!r || r->type == REDIS_REPLY_ERROR)
            snprintf(why, sizeof why, "SELECT %d: %s", l->db, r ? r->str : ctx->errstr);
        if (r) freeReplyObject(r);
    }
    if (why[0]) {
        mark_down(l, why);
        redisFree(ctx);
        ADD(l->errors, 1);
        return NULL;
    }
    c->ctx = ctx;
    *fresh = true;
    mark_up(l);
    return ctx;
}

static void ctx_drop(l2 *l)
{
    conn *c = pthread_getspecific(l->tls);
    if (c && c->ctx) {
        redisFree(c->ctx);
        c->ctx = NULL;
    }
}

static void observe(l2 *l, double s)
{
    int b = 0;
    while (b < N_LAT && s > lat_le[b])
        b++;
    ADD(l->lat_bucket[b], 1);
    ADD(l->lat_count, 1);
    ADD(l->lat_sum_us, (uint64_t)(s * 1e6));
}

static void *command_argv(l2 *l, int block_ms, int argc, const char **argv, const size_t *lens)
{
    redisReply *r = NULL;
    for (int attempt = 0; attempt < 2 && !r; attempt++) {
        bool fresh;
        redisContext *ctx = ctx_get(l, &fresh);
        if (!ctx) return NULL;
        if (block_ms > 0) redisSetTimeout(ctx, tv_ms(block_ms + l->c.timeout_ms + 1000));
        double t0 = tlmd_now();
        errno = 0;
        r = redisCommandArgv(ctx, argc, argv, lens);
        if (block_ms <= 0) observe(l, tlmd_now() - t0);
        if (r) {
            if (block_ms > 0) redisSetTimeout(ctx, tv_ms(l->c.timeout_ms));
            break;
        }
        bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT;
        char why[200];
        snprintf(why, sizeof why, "%s: %s", argv[0], ctx->errstr[0] ? ctx->errstr : "no reply");
        ctx_drop(l); /* the protocol state is unknown after a failure */
        /* A connection that worked before may simply be stale (Redis restarted): one retry
         * on a fresh one. A fresh connection that fails, or a timeout, means trouble. */
        if (fresh || timed_out || attempt == 1) {
            mark_down(l, why);
            ADD(l->errors, 1);
            return NULL;
        }
    }
    if (r->type == REDIS_REPLY_ERROR && strncmp(r->str, "BUSYGROUP", 9)) {
        ADD(l->errors, 1);
        tlmd_log(LOG_WARN, "l2_error", "command=%s error=\"%.200s\"", argv[0], r->str);
    }
    return r;
}

void *l2_command(l2 *l, int argc, const char **argv, const size_t *lens)
{
    return command_argv(l, 0, argc, argv, lens);
}

void *l2_command_blocking(l2 *l, int block_ms, int argc, const char **argv, const size_t *lens)
{
    return command_argv(l, block_ms, argc, argv, lens);
}

/* A command of NUL-terminated strings. */
static redisReply *cmd(l2 *l, int argc, ...)
{
    const char *argv[16];
    size_t lens[16];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc && i < 16; i++) {
        argv[i] = va_arg(ap, const char *);
        lens[i] = strlen(argv[i]);
    }
    va_end(ap);
    return command_argv(l, 0, argc, argv, lens);
}

/* ---- kernels ---- */

static void kernel_key(const l2 *l, const char *kind, const char *key, char *out, size_t cap)
{
    snprintf(out, cap, "%s:v1:%s:%s", l->c.ns, kind, key);
}

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *num_or_null(double d)
{
    return isfinite(d) ? json_real(d) : json_null();
}

int l2_kernel_put(l2 *l, const store_kernel *k)
{
    if ((int64_t)k->binary_size > l->c.max_blob_bytes) {
        ADD(l->put_skipped, 1);
        return TLM_ELIMIT;
    }
    json_t *h = json_object();
    json_object_set_new(h, "key", json_string(k->key));
    json_object_set_new(h, "workload_hash", str_or_null(k->workload_hash));
    json_object_set_new(h, "target_hash", str_or_null(k->target_hash));
    json_object_set_new(h, "compiler_id", str_or_null(k->compiler_id));
    json_object_set_new(h, "model_id", str_or_null(k->model_id));
    json_object_set_new(h, "workload_json", str_or_null(k->workload_json));
    json_object_set_new(h, "target_name", str_or_null(k->target_name));
    json_object_set_new(h, "schedule", str_or_null(k->schedule));
    json_object_set_new(h, "sentence", str_or_null(k->sentence));
    json_object_set_new(h, "source", str_or_null(k->source));
    json_object_set_new(h, "format", str_or_null(k->format));
    json_object_set_new(h, "entry", str_or_null(k->entry));
    json_object_set_new(h, "launch_json", str_or_null(k->launch_json));
    json_object_set_new(h, "schedule_source", str_or_null(k->schedule_source));
    json_object_set_new(h, "est_time_s", num_or_null(k->est_time_s));
    json_object_set_new(h, "measured_time_s", num_or_null(k->measured_time_s));
    json_object_set_new(h, "binary_sha256", json_string(k->binary_sha256));
    json_object_set_new(h, "binary_size", json_integer((json_int_t)k->binary_size));
    char *hs = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    if (!hs) return TLM_ENOMEM;
    size_t hl = strlen(hs), n = MAGIC_LEN + hl + 1 + k->binary_size;
    char *v = malloc(n);
    if (!v) {
        free(hs);
        return TLM_ENOMEM;
    }
    memcpy(v, MAGIC, MAGIC_LEN);
    memcpy(v + MAGIC_LEN, hs, hl);
    v[MAGIC_LEN + hl] = '\n';
    memcpy(v + MAGIC_LEN + hl + 1, k->binary, k->binary_size);
    free(hs);
    char rk[160], px[32];
    kernel_key(l, "kernel", k->key, rk, sizeof rk);
    const char *argv[5] = {"SET", rk, v, "PX", px};
    size_t lens[5] = {3, strlen(rk), n, 2, 0};
    int argc = 3;
    if (l->c.ttl_s > 0) {
        snprintf(px, sizeof px, "%lld", (long long)(l->c.ttl_s * 1000));
        lens[4] = strlen(px);
        argc = 5;
    }
    redisReply *r = l2_command(l, argc, argv, lens);
    free(v);
    int rc = r && r->type == REDIS_REPLY_STATUS ? 0 : TLM_EIO;
    if (r) freeReplyObject(r);
    if (!rc) ADD(l->puts, 1);
    return rc;
}

static char *jstr_dup(json_t *h, const char *name)
{
    const char *s = json_string_value(json_object_get(h, name));
    return s ? strdup(s) : NULL;
}

static double jnum(json_t *h, const char *name)
{
    json_t *v = json_object_get(h, name);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/* Parses a blob into *out; false when anything does not check out. */
static bool kernel_decode(const char *key, const char *v, size_t n, store_kernel *out, char *why,
                          size_t cap)
{
    memset(out, 0, sizeof *out);
    if (n < MAGIC_LEN + 2 || memcmp(v, MAGIC, MAGIC_LEN)) {
        snprintf(why, cap, "bad magic");
        return false;
    }
    const char *hs = v + MAGIC_LEN, *nl = memchr(hs, '\n', n - MAGIC_LEN);
    if (!nl) {
        snprintf(why, cap, "no header");
        return false;
    }
    json_error_t je;
    json_t *h = json_loadb(hs, (size_t)(nl - hs), 0, &je);
    if (!h) {
        snprintf(why, cap, "header: %s", je.text);
        return false;
    }
    const uint8_t *bin = (const uint8_t *)nl + 1;
    size_t bn = n - (size_t)(nl + 1 - v);
    const char *hk = json_string_value(json_object_get(h, "key"));
    const char *sha = json_string_value(json_object_get(h, "binary_sha256"));
    json_int_t size = json_integer_value(json_object_get(h, "binary_size"));
    char actual[65];
    bool ok = false;
    if (!hk || strcmp(hk, key))
        snprintf(why, cap, "the header names another key");
    else if (!sha || strlen(sha) != 64 || (size_t)size != bn || bn == 0)
        snprintf(why, cap, "binary size %zu, header says %lld", bn, (long long)size);
    else if (store_sha256_hex(bin, bn, actual) || strcmp(actual, sha))
        snprintf(why, cap, "SHA-256 mismatch (blob %.16s, header %.16s)", actual, sha);
    else if (!json_string_value(json_object_get(h, "format")) ||
             !json_string_value(json_object_get(h, "entry")) ||
             !json_string_value(json_object_get(h, "workload_hash")) ||
             !json_string_value(json_object_get(h, "target_hash")))
        snprintf(why, cap, "required fields missing");
    else
        ok = true;
    if (ok) {
        snprintf(out->key, sizeof out->key, "%s", key);
        out->workload_hash = jstr_dup(h, "workload_hash");
        out->target_hash = jstr_dup(h, "target_hash");
        out->compiler_id = jstr_dup(h, "compiler_id");
        out->model_id = jstr_dup(h, "model_id");
        out->workload_json = jstr_dup(h, "workload_json");
        out->target_name = jstr_dup(h, "target_name");
        out->schedule = jstr_dup(h, "schedule");
        out->sentence = jstr_dup(h, "sentence");
        out->source = jstr_dup(h, "source");
        out->format = jstr_dup(h, "format");
        out->entry = jstr_dup(h, "entry");
        out->launch_json = jstr_dup(h, "launch_json");
        out->schedule_source = jstr_dup(h, "schedule_source");
        out->est_time_s = jnum(h, "est_time_s");
        out->measured_time_s = jnum(h, "measured_time_s");
        snprintf(out->binary_sha256, sizeof out->binary_sha256, "%s", sha);
        out->binary = malloc(bn);
        if (!out->binary) {
            store_kernel_free(out);
            ok = false;
            snprintf(why, cap, "out of memory");
        } else {
            memcpy(out->binary, bin, bn);
            out->binary_size = bn;
        }
    }
    json_decref(h);
    return ok;
}

int l2_kernel_get(l2 *l, const char *key, store_kernel *out)
{
    char rk[160];
    kernel_key(l, "kernel", key, rk, sizeof rk);
    redisReply *r = cmd(l, 2, "GET", rk);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r) freeReplyObject(r);
        return TLM_EIO;
    }
    if (r->type != REDIS_REPLY_STRING) {
        freeReplyObject(r);
        ADD(l->misses, 1);
        return TLM_ENOTFOUND;
    }
    char why[200];
    bool ok = kernel_decode(key, r->str, r->len, out, why, sizeof why);
    freeReplyObject(r);
    if (ok) {
        ADD(l->hits, 1);
        return 0;
    }
    ADD(l->corrupt, 1);
    ADD(l->misses, 1);
    tlmd_log(LOG_WARN, "l2_corrupt", "key=%s error=\"%s\" action=deleted", key, why);
    redisReply *d = cmd(l, 2, "DEL", rk);
    if (d) freeReplyObject(d);
    return TLM_ENOTFOUND;
}

/* ---- leases ---- */

static const char renew_lua[] = "if redis.call('get', KEYS[1]) == ARGV[1] then "
                                "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
static const char release_lua[] = "if redis.call('get', KEYS[1]) == ARGV[1] then "
                                  "return redis.call('del', KEYS[1]) else return 0 end";

int l2_lease_take(l2 *l, const char *key)
{
    char rk[160], px[32];
    kernel_key(l, "lease", key, rk, sizeof rk);
    snprintf(px, sizeof px, "%d", l->c.lease_ms);
    redisReply *r = cmd(l, 6, "SET", rk, l->owner, "NX", "PX", px);
    if (!r || r->type == REDIS_REPLY_ERROR) {
        if (r) freeReplyObject(r);
        return TLM_EIO;
    }
    bool taken = r->type == REDIS_REPLY_STATUS;
    freeReplyObject(r);
    if (!taken) return 0;
    lease *e = calloc(1, sizeof *e);
    if (e) {
        snprintf(e->key, sizeof e->key, "%s", key);
        pthread_mutex_lock(&l->mu);
        e->next = l->held;
        l->held = e;
        pthread_mutex_unlock(&l->mu);
    }
    return 1;
}

void l2_lease_drop(l2 *l, const char *key)
{
    pthread_mutex_lock(&l->mu);
    for (lease **pp = &l->held; *pp; pp = &(*pp)->next)
        if (!strcmp((*pp)->key, key)) {
            lease *e = *pp;
            *pp = e->next;
            e->next = l->to_release;
            l->to_release = e;
            pthread_cond_signal(&l->cv);
            break;
        }
    pthread_mutex_unlock(&l->mu);
}

/* The keeper: releases what was dropped, renews what is held every lease_ms/3. */
static void *keeper_main(void *arg)
{
    l2 *l = arg;
    int64_t next_renew = now_us();
    pthread_mutex_lock(&l->mu);
    while (!l->stopping) {
        lease *rel = l->to_release;
        l->to_release = NULL;
        bool renew = now_us() >= next_renew;
        char(*keys)[65] = NULL;
        int nk = 0;
        if (renew) {
            for (lease *e = l->held; e; e = e->next)
                nk++;
            keys = nk ? calloc((size_t)nk, sizeof *keys) : NULL;
            int i = 0;
            for (lease *e = l->held; e && keys; e = e->next)
                snprintf(keys[i++], 65, "%s", e->key);
            next_renew = now_us() + (int64_t)l->c.lease_ms * 1000 / 3;
        }
        pthread_mutex_unlock(&l->mu);
        while (rel) {
            lease *e = rel;
            rel = e->next;
            char rk[160];
            kernel_key(l, "lease", e->key, rk, sizeof rk);
            redisReply *r = cmd(l, 5, "EVAL", release_lua, "1", rk, l->owner);
            if (r) freeReplyObject(r);
            free(e);
        }
        char px[32];
        snprintf(px, sizeof px, "%d", l->c.lease_ms);
        for (int i = 0; keys && i < nk; i++) {
            char rk[160];
            kernel_key(l, "lease", keys[i], rk, sizeof rk);
            redisReply *r = cmd(l, 6, "EVAL", renew_lua, "1", rk, l->owner, px);
            if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 0)
                tlmd_log(LOG_WARN, "l2_lease_lost",
                         "key=%.16s hint=\"the lease expired or was taken over; another daemon "
                         "may compile the same kernel\"",
                         keys[i]);
            if (r) freeReplyObject(r);
        }
        free(keys);
        pthread_mutex_lock(&l->mu);
        if (l->stopping) break;
        if (!l->to_release) {
            int64_t wait = next_renew - now_us();
            if (wait > 0) {
                struct timespec ts;
                clock_gettime(CLOCK_REALTIME, &ts);
                int64_t ns = ts.tv_nsec + (wait % 1000000) * 1000;
                ts.tv_sec += (time_t)(wait / 1000000 + ns / 1000000000);
                ts.tv_nsec = (long)(ns % 1000000000);
                pthread_cond_timedwait(&l->cv, &l->mu, &ts);
            }
        }
    }
    /* held leases are left to expire; dropped ones were released above */
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ---- life ---- */

int l2_new(const l2_config *c, l2 **out, tlm_error *err)
{
    *out = NULL;
    l2 *l = calloc(1, sizeof *l);
    if (!l) return tlm_err_set(err, TLM_ENOMEM, "redis", "out of memory");
    l->c = *c;
    int rc = parse_url(l, c->url, err);
    if (!rc && c->password_file[0]) rc = read_password(l, c->password_file, err);
    if (!rc && (c->lease_ms < 100 || c->timeout_ms < 1))
        rc = tlm_err_set(err, TLM_EINVAL, "redis_lease_ms", "must be >= 100");
    if (rc) {
        free(l);
        return rc;
    }
    char host[128] = "host";
    gethostname(host, sizeof host - 1);
    uint32_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd = (uint32_t)now_us();
    snprintf(l->owner, sizeof l->owner, "%.80s:%ld:%08x", host, (long)getpid(), rnd);
    pthread_key_create(&l->tls, conn_free);
    pthread_mutex_init(&l->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&l->keeper, NULL, keeper_main, l) == 0) l->keeper_started = true;
    /* A first contact (from this thread, start-up): reports whether Redis is there and warns
     * about an unbounded server. A Redis that is down is a degraded start, not an error. */
    redisReply *r = cmd(l, 3, "CONFIG", "GET", "maxmemory");
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING && !strcmp(r->element[1]->str, "0"))
        tlmd_log(LOG_WARN, "l2_unbounded",
                 "redis=%s:%d hint=\"Redis has no maxmemory: set maxmemory and maxmemory-policy "
                 "allkeys-lru (or volatile-lru) so the cluster cache stays bounded\"",
                 l->host, l->port);
    if (r) freeReplyObject(r);
    tlmd_log(LOG_INFO, "l2", "redis=%s:%d db=%d ns=%s ttl_s=%g max_blob_bytes=%lld up=%s", l->host,
             l->port, l->db, l->c.ns, l->c.ttl_s, (long long)l->c.max_blob_bytes,
             GET(l->up) ? "true" : "false");
    *out = l;
    return 0;
}

void l2_free(l2 *l)
{
    if (!l) return;
    if (l->keeper_started) {
        pthread_mutex_lock(&l->mu);
        l->stopping = true;
        pthread_cond_signal(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->keeper, NULL);
    }
    /* leases still queued for release: one last try from this thread */
    for (lease *e = l->to_release, *n; e; e = n) {
        n = e->next;
        char rk[160];
        kernel_key(l, "lease", e->key, rk, sizeof rk);
        redisReply *r = cmd(l, 5, "EVAL", release_lua, "1", rk, l->owner);
        if (r) freeReplyObject(r);
        free(e);
    }
    for (lease *e = l->held, *n; e; e = n) {
        n = e->next;
        free(e);
    }
    conn *c = pthread_getspecific(l->tls);
    pthread_setspecific(l->tls, NULL);
    conn_free(c);
    pthread_key_delete(l->tls);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

/* ---- metrics ---- */

static void counter(metrics_text *b, const char *name, const char *help, uint64_t v)
{
    metrics_text_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name,
                        (unsigned long long)v);
}

char *l2_metrics_render(const l2 *lc)
{
    l2 *l = (l2 *)lc;
    metrics_text b = {malloc(4096), 0, 4096};
    metrics_text_printf(
        &b,
        "# HELP tlmd_l2_enabled Whether a Redis cluster tier is configured (--redis).\n"
        "# TYPE tlmd_l2_enabled gauge\ntlmd_l2_enabled %d\n"
        "# HELP tlmd_l2_up Whether the last Redis call worked.\n"
        "# TYPE tlmd_l2_up gauge\ntlmd_l2_up %d\n",
        l ? 1 : 0, l && GET(l->up) ? 1 : 0);
    static const char *const cnames[L2_C_COUNT][2] = {
        {"tlmd_l2_measured_total", "Candidates this daemon measured for the cluster."},
        {"tlmd_l2_lease_waits_total", "Flights that waited for another daemon's compile."},
        {"tlmd_l2_lease_takeovers_total",
         "Flights that took the compile lease after waiting (its holder died or failed)."},
        {"tlmd_l2_wait_hits_total", "Flights that waited and got another daemon's kernel."},
        {"tlmd_l2_claimed_total", "Measurement entries claimed from a worker idle too long."}};
    counter(&b, "tlmd_l2_hits_total", "Kernels found in Redis after an L1 miss.",
            l ? GET(l->hits) : 0);
    counter(&b, "tlmd_l2_misses_total", "Lookups Redis could not answer with a kernel.",
            l ? GET(l->misses) : 0);
    counter(&b, "tlmd_l2_errors_total", "Redis calls that failed (connect, timeout, error reply).",
            l ? GET(l->errors) : 0);
    counter(&b, "tlmd_l2_corrupt_total", "Redis entries whose checksum failed (deleted).",
            l ? GET(l->corrupt) : 0);
    counter(&b, "tlmd_l2_puts_total", "Kernels written to Redis.", l ? GET(l->puts) : 0);
    counter(&b, "tlmd_l2_put_skipped_total", "Kernels over redis_max_blob_bytes (L1 only).",
            l ? GET(l->put_skipped) : 0);
    for (int i = 0; i < L2_C_COUNT; i++)
        counter(&b, cnames[i][0], cnames[i][1], l ? GET(l->cnt[i]) : 0);
    metrics_text_printf(&b, "# HELP tlmd_l2_command_seconds Latency of Redis commands.\n"
                            "# TYPE tlmd_l2_command_seconds histogram\n");
    metrics_text_histogram(&b, "tlmd_l2_command_seconds", "", lat_le, N_LAT,
                           l ? l->lat_bucket : NULL, l ? (double)GET(l->lat_sum_us) / 1e6 : 0.0, 6,
                           l ? GET(l->lat_count) : 0);
    return b.p;
}
