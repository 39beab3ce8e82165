/* main.c — tlmd: configuration (defaults < config file < TLMD_* environment < flags),
 * structured logging, start-up (store, weights, decoder thread, HTTP), signals, sd_notify
 * and the orderly shutdown. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <systemd/sd-daemon.h>

#include "compiler/driver/driver.h"
#include "compiler/lang/lang.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/util/util.h"
#include "compiler/tune/htam.h"
#include "compiler/tune/tune.h"
#include "daemon/tlmd.h"

/* The loop's inbox: other threads post closures; the loop drains them all per wake-up. */
typedef struct tlmd_msg {
    void (*fn)(void *arg);
    void *arg;
    struct tlmd_msg *next;
} tlmd_msg;

struct tlmd_inbox {
    uv_async_t async;
    pthread_mutex_t mu;
    tlmd_msg *head, *tail; /* under mu */
    http_server *h;        /* kicked after a drain */
};

/* main.c's own state: the environment it builds, the modules it starts and stops, the
 * lifecycle. Modules get what they need as arguments; none reads this. */
static struct {
    tlmd_env env;
    tlm_model *model; /* owned; env.model points at it when it is served */
    tlmd_status status;
    tlmd_inbox inbox;
    metrics *m;
    http_server *h;
    dec *d;
    pool *cp; /* the compile pool */
    jobs *js;
    routes *rt;
    uv_timer_t watchdog, shutdown_timer, touch_timer;
    uv_prepare_t turn; /* before each poll: the loop's busy time per turn, for /metrics */
    uint64_t turn_t, turn_idle;
    pool_work touch_w; /* writes the uses of cached kernels (store_touch_flush) */
    bool touch_busy;
    bool stopped;
    double shutdown_started;
} srv;

/* ---- logging ---- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_fp; /* NULL: stderr */
static int log_level = LOG_INFO;
static const char *level_names[] = {"debug", "info", "warn", "error"};

int tlmd_log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (!strcasecmp(s, level_names[i])) return i;
    if (!strcasecmp(s, "warning")) return LOG_WARN;
    return -1;
}

void tlmd_log(int level, const char *event, const char *fmt, ...)
{
    if (level < __atomic_load_n(&log_level, __ATOMIC_RELAXED)) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    char msg[2048] = "";
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_lock(&log_mu);
    FILE *f = log_fp ? log_fp : stderr;
    fprintf(f, "ts=%s.%03ldZ level=%s msg=%s%s%s\n", when, ts.tv_nsec / 1000000, level_names[level],
            event, msg[0] ? " " : "", msg);
    fflush(f);
    pthread_mutex_unlock(&log_mu);
}

int tlmd_log_open(int level, const char *file)
{
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
    if (!file || !file[0]) return 0;
    FILE *f = fopen(file, "a");
    if (!f) return TLM_EIO;
    pthread_mutex_lock(&log_mu);
    FILE *old = log_fp;
    log_fp = f;
    pthread_mutex_unlock(&log_mu);
    if (old) fclose(old);
    return 0;
}

double tlmd_now(void)
{
    return tlm_now_s();
}

double tlmd_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- configuration ---- */

static const char usage[] =
    "usage: tlmd [--listen ADDR:PORT] [--store FILE] [--weights FILE|none] [--serve-untrained]\n"
    "            [--device auto|cpu|cuda[:N]] [--config FILE] [--token-file FILE]\n"
    "            [--log-level debug|info|warn|error] [--log-file FILE]\n"
    "            [--redis redis://[:PASSWORD@]HOST:PORT[/DB]] [--redis-password-file FILE]\n"
    "Schedules: with trained weights (a MANIFEST next to the file says \"trained = true\")\n"
    "generate requests decode with the model (\"schedule_source\": \"tlm\"); otherwise tlmd\n"
    "serves the rule-of-thumb schedule (\"default\"): with --weights none, when the default\n"
    "file " TLM_WEIGHTS_DEFAULT_PATH " is missing (a warning), or when the weights are untrained\n"
    "(unless --serve-untrained), or when their MANIFEST holds them back (\"serve = default\":\n"
    "they lost to the rule of thumb on the held-out evaluation). An explicit --weights FILE\n"
    "that cannot be read is an error.\n"
    "--device: where the model decodes; auto takes the GPU when the driver and a device are\n"
    "present, else the CPU (GET /v1/version says which and why); cuda without a GPU is an error.\n"
    "Environment: TLMD_LISTEN, TLMD_STORE, TLMD_WEIGHTS, TLMD_SERVE_UNTRAINED, TLMD_DEVICE,\n"
    "TLMD_CONFIG, TLMD_TOKEN_FILE, TLMD_LOG_LEVEL, TLMD_LOG_FILE. Config file: key = value lines\n"
    "with the same keys (listen, store, weights, serve_untrained, device, token_file, log_level,\n"
    "log_file) and max_body_bytes, max_jobs, max_workloads, max_candidates, job_timeout_s,\n"
    "grace_s, store_max_bytes, hot_cache_bytes (64 MiB of kernels answered from memory on the\n"
    "event loop; 0: off), decoder_slots, max_connections (0: from RLIMIT_NOFILE),\n"
    "max_connections_per_ip, header_timeout_s, body_timeout_s, idle_timeout_s, compile_workers,\n"
    "compile_nice (10: the compile pool's nice value, below the loop's).\n"
    "Cluster tier (README \"Running a cluster\"): --redis / TLMD_REDIS / redis, and\n"
    "--redis-password-file / TLMD_REDIS_PASSWORD_FILE / redis_password_file; config keys\n"
    "redis_namespace (tlmd), redis_ttl_s (604800, 0: none), redis_max_blob_bytes (64 MiB),\n"
    "redis_timeout_ms (250), redis_lease_ms (30000), redis_claim_idle_ms (60000),\n"
    "redis_workers (1; measurement workers, 0: none). Redis trouble degrades to the local store.\n"
    "Exit status: 0 after a clean shutdown, 1 when the store or the listener fails, 2 for bad\n"
    "usage or configuration (flags, config file, weights, device).\n";

static void config_defaults(tlmd_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->listen_addr, sizeof c->listen_addr, "127.0.0.1");
    c->port = 8470;
    const char *cache = getenv("CACHE_DIRECTORY"); /* systemd's CacheDirectory= */
    if (cache && cache[0]) {
        char first[900];
        snprintf(first, sizeof first, "%s", cache);
        char *colon = strchr(first, ':'); /* several directories are ':'-separated */
        if (colon) *colon = 0;
        snprintf(c->store_path, sizeof c->store_path, "%s/tlmd.db", first);
    } else {
        snprintf(c->store_path, sizeof c->store_path, "var/tlmd.db");
    }
    snprintf(c->weights, sizeof c->weights, "%s", TLM_WEIGHTS_DEFAULT_PATH);
    snprintf(c->weights_from, sizeof c->weights_from, "default");
    snprintf(c->device, sizeof c->device, "auto");
    c->log_level = LOG_INFO;
    c->max_body = 1 << 20;
    c->max_jobs = 64;
    c->max_workloads = 64;
    c->max_candidates = 8;
    c->job_timeout_s = 300;
    c->grace_s = 10;
    c->store_max_bytes = INT64_C(1) << 30;
    c->decoder_slots = 64;
    c->max_connections = 0;
    c->max_connections_per_ip = 128;
    c->header_timeout_s = 10;
    c->body_timeout_s = 60;
    c->idle_timeout_s = 30;
    c->compile_workers = 4;
    c->compile_nice = 10;
    c->hot_cache_bytes = (size_t)64 << 20;
    l2_config_defaults(&c->l2);
}

static int parse_listen(tlmd_config *c, const char *v, tlm_error *err)
{
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v || (size_t)(colon - v) >= sizeof c->listen_addr)
        return tlm_err_set(err, TLM_EINVAL, "listen", "\"%s\": expected ADDR:PORT", v);
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || end == colon + 1)
        return tlm_err_set(err, TLM_EINVAL, "listen", "\"%s\": the port must be 0..65535", v);
    memcpy(c->listen_addr, v, (size_t)(colon - v));
    c->listen_addr[colon - v] = 0;
    c->port = (int)p;
    return 0;
}

static int parse_num(const char *key, const char *v, double lo, double hi, double *out,
                     tlm_error *err)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (errno || end == v || *end || !(d >= lo && d <= hi))
        return tlm_err_set(err, TLM_EINVAL, key, "\"%s\": expected a number in [%g, %g]", v, lo,
                           hi);
    *out = d;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *key, const char *v, tlm_error *err)
{
    if (strlen(v) >= cap) return tlm_err_set(err, TLM_EINVAL, key, "the value is too long");
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

static int parse_bool(const char *key, const char *v, bool *out, tlm_error *err)
{
    if (!strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcmp(v, "1")) {
        *out = true;
        return 0;
    }
    if (!strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcmp(v, "0")) {
        *out = false;
        return 0;
    }
    return tlm_err_set(err, TLM_EINVAL, key, "\"%s\": expected true or false", v);
}

/* from: who sets it ("config", "TLMD_...", "--flag"), kept for the weights so a start-up
 * error names where the path came from. */
static int config_set(tlmd_config *c, const char *key, const char *v, const char *from,
                      tlm_error *err)
{
    double d;
    int rc;
    if (!strcmp(key, "listen")) return parse_listen(c, v, err);
    if (!strcmp(key, "store")) return copy_str(c->store_path, sizeof c->store_path, key, v, err);
    if (!strcmp(key, "weights")) {
        if ((rc = copy_str(c->weights, sizeof c->weights, key, v, err))) return rc;
        snprintf(c->weights_from, sizeof c->weights_from, "%s", from);
        return 0;
    }
    if (!strcmp(key, "serve_untrained")) return parse_bool(key, v, &c->serve_untrained, err);
    if (!strcmp(key, "token_file"))
        return copy_str(c->token_file, sizeof c->token_file, key, v, err);
    if (!strcmp(key, "log_file")) return copy_str(c->log_file, sizeof c->log_file, key, v, err);
    if (!strcmp(key, "redis")) return copy_str(c->l2.url, sizeof c->l2.url, key, v, err);
    if (!strcmp(key, "redis_password_file"))
        return copy_str(c->l2.password_file, sizeof c->l2.password_file, key, v, err);
    if (!strcmp(key, "redis_namespace")) {
        if (!v[0] || strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") !=
                         strlen(v))
            return tlm_err_set(err, TLM_EINVAL, key,
                               "\"%s\": expected letters, digits, '_', '-' or '.'", v);
        return copy_str(c->l2.ns, sizeof c->l2.ns, key, v, err);
    }
    if (!strcmp(key, "device")) {
        if (strcmp(v, "auto") && strcmp(v, "cpu") && strncmp(v, "cuda", 4))
            return tlm_err_set(err, TLM_EINVAL, key, "\"%s\": expected auto, cpu or cuda[:N]", v);
        return copy_str(c->device, sizeof c->device, key, v, err);
    }
    if (!strcmp(key, "log_level")) {
        int l = tlmd_log_level_parse(v);
        if (l < 0)
            return tlm_err_set(err, TLM_EINVAL, key, "\"%s\": expected debug, info, warn or error",
                               v);
        c->log_level = l;
        return 0;
    }
#define NUM(name, lo, hi, assign)                                                                  \
    if (!strcmp(key, name)) {                                                                      \
        if ((rc = parse_num(key, v, lo, hi, &d, err))) return rc;                                  \
        assign;                                                                                    \
        return 0;                                                                                  \
    }
    NUM("max_body_bytes", 1024, 1 << 30, c->max_body = (size_t)d)
    NUM("max_jobs", 1, 100000, c->max_jobs = (int)d)
    NUM("max_workloads", 1, 4096, c->max_workloads = (int)d)
    NUM("max_candidates", 1, TLM_MAX_BEAM, c->max_candidates = (int)d)
    NUM("job_timeout_s", 0.01, 86400, c->job_timeout_s = d)
    NUM("grace_s", 0, 3600, c->grace_s = d)
    NUM("store_max_bytes", 0, 1e15, c->store_max_bytes = (int64_t)d)
    NUM("hot_cache_bytes", 0, 1e12, c->hot_cache_bytes = (size_t)d)
    NUM("decoder_slots", 1, 4096, c->decoder_slots = (int)d)
    NUM("max_connections", 0, 1000000, c->max_connections = (int)d)
    NUM("max_connections_per_ip", 1, 1000000, c->max_connections_per_ip = (int)d)
    NUM("header_timeout_s", 0.1, 3600, c->header_timeout_s = d)
    NUM("body_timeout_s", 0.1, 86400, c->body_timeout_s = d)
    NUM("idle_timeout_s", 1, 86400, c->idle_timeout_s = d)
    NUM("compile_workers", 1, 256, c->compile_workers = (int)d)
    NUM("compile_nice", 0, 19, c->compile_nice = (int)d)
    NUM("redis_ttl_s", 0, 1e9, c->l2.ttl_s = d)
    NUM("redis_max_blob_bytes", 1024, 1e12, c->l2.max_blob_bytes = (int64_t)d)
    NUM("redis_timeout_ms", 1, 60000, c->l2.timeout_ms = (int)d)
    NUM("redis_lease_ms", 100, 86400000, c->l2.lease_ms = (int)d)
    NUM("redis_claim_idle_ms", 100, 86400000, c->l2.claim_idle_ms = (int)d)
    NUM("redis_workers", 0, 64, c->l2.workers = (int)d)
#undef NUM
    return tlm_err_set(err, TLM_EINVAL, key, "unknown configuration key");
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = 0;
    return s;
}

static int config_file(tlmd_config *c, const char *path, tlm_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return tlm_err_set(err, TLM_EINVAL, "--config", "cannot open %s: %s", path,
                           strerror(errno));
    char line[2048];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char *s = trim(line);
        if (!*s || *s == '#') continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = tlm_err_set(err, TLM_EINVAL, "--config", "%s:%d: expected key = value", path,
                             lineno);
            break;
        }
        *eq = 0;
        char *k = trim(s), *v = trim(eq + 1);
        if ((rc = config_set(c, k, v, "config", err)))
            snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg), " (%s:%d)",
                     path, lineno);
    }
    fclose(f);
    return rc;
}

static int config_load(tlmd_config *c, int argc, char **argv, tlm_error *err)
{
    static const struct option opts[] = {{"listen", required_argument, 0, 'l'},
                                         {"store", required_argument, 0, 's'},
                                         {"weights", required_argument, 0, 'w'},
                                         {"device", required_argument, 0, 'd'},
                                         {"config", required_argument, 0, 'c'},
                                         {"token-file", required_argument, 0, 't'},
                                         {"log-level", required_argument, 0, 'L'},
                                         {"log-file", required_argument, 0, 'F'},
                                         {"redis", required_argument, 0, 'r'},
                                         {"redis-password-file", required_argument, 0, 'P'},
                                         {"serve-untrained", no_argument, 0, 'U'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
#define N_KEYS 10
    static const char *const keys[N_KEYS] = {
        "listen",     "store",     "weights",  "device", "config", "token_file",
        "log_level",  "log_file",  "redis",    "redis_password_file"};
    static const char shorts[] = "lswdctLFrP";
    const char *flag[N_KEYS] = {0};
    bool serve_untrained_flag = false;
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *p = strchr(shorts, ch);
        if (p && ch) {
            flag[p - shorts] = optarg;
            continue;
        }
        if (ch == 'U') {
            serve_untrained_flag = true;
            continue;
        }
        if (ch == 'h') {
            fputs(usage, stdout);
            exit(0);
        }
        return tlm_err_set(err, TLM_EINVAL, argv[optind - 1], "unknown option or missing value");
    }
    if (optind < argc) return tlm_err_set(err, TLM_EINVAL, argv[optind], "unexpected argument");
    config_defaults(c);
    const char *cfg = flag[4] ? flag[4] : getenv("TLMD_CONFIG");
    int rc;
    if (cfg && cfg[0] && (rc = config_file(c, cfg, err))) return rc;
    static const char *const envs[N_KEYS] = {
        "TLMD_LISTEN",    "TLMD_STORE",    "TLMD_WEIGHTS", "TLMD_DEVICE",
        NULL,             "TLMD_TOKEN_FILE", "TLMD_LOG_LEVEL", "TLMD_LOG_FILE",
        "TLMD_REDIS",     "TLMD_REDIS_PASSWORD_FILE"};
    for (int i = 0; i < N_KEYS; i++) {
        const char *v = envs[i] ? getenv(envs[i]) : NULL;
        if (v && v[0] && (rc = config_set(c, keys[i], v, envs[i], err))) {
            snprintf(err->field, sizeof err->field, "%s", envs[i]);
            return rc;
        }
    }
    const char *su = getenv("TLMD_SERVE_UNTRAINED");
    if (su && su[0] && (rc = config_set(c, "serve_untrained", su, "TLMD_SERVE_UNTRAINED", err))) {
        snprintf(err->field, sizeof err->field, "TLMD_SERVE_UNTRAINED");
        return rc;
    }
    for (int i = 0; i < N_KEYS; i++) {
        char name[32];
        snprintf(name, sizeof name, "--%s", opts[i].name);
        if (i != 4 && flag[i] && (rc = config_set(c, keys[i], flag[i], name, err))) {
            snprintf(err->field, sizeof err->field, "%s", name);
            return rc;
        }
    }
    if (serve_untrained_flag) c->serve_untrained = true;
    return 0;
}

/* ---- the loop's inbox ---- */

void tlmd_post(tlmd_inbox *q, void (*fn)(void *), void *arg)
{
    tlmd_msg *m = malloc(sizeof *m);
    if (!m) abort(); /* a lost completion would hang a job forever */
    m->fn = fn;
    m->arg = arg;
    m->next = NULL;
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = m;
    else
        q->head = m;
    q->tail = m;
    pthread_mutex_unlock(&q->mu);
    uv_async_send(&q->async);
}

static void drain_queue(tlmd_inbox *q)
{
    for (;;) {
        pthread_mutex_lock(&q->mu);
        tlmd_msg *m = q->head;
        q->head = q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        if (!m) break;
        while (m) {
            tlmd_msg *next = m->next;
            m->fn(m->arg);
            free(m);
            m = next;
        }
    }
}

/* Sends coalesce, so one wake-up may carry many messages: drain everything. */
static void on_async(uv_async_t *a)
{
    tlmd_inbox *q = a->data;
    drain_queue(q);
    if (q->h) http_kick(q->h);
}

/* ---- start-up helpers ---- */

/* Decides what generate serves (see the usage text). Returns 0, or 2 (exit status) after
 * printing why to stderr and the log. */
static int setup_weights(tlmd_config *c)
{
    tlm_error err;
    tlm_err_clear(&err);
    uint8_t vh[32];
    lang_vocab_hash(vh);
    lang_vocab_hash_hex(srv.env.vocab_hash);
    snprintf(srv.env.model_id, sizeof srv.env.model_id, "none");
    if (!strcmp(c->weights, "none")) {
        snprintf(srv.env.schedules_reason, sizeof srv.env.schedules_reason,
                 "%s none: no schedule model",
                 !strcmp(c->weights_from, "config") ? "weights = none in the config file,"
                                                    : c->weights_from);
        tlmd_log(LOG_INFO, "weights", "path=none schedules=default reason=\"%s\"",
                 srv.env.schedules_reason);
        return 0;
    }
    bool is_default = !strcmp(c->weights_from, "default");
    struct stat sb;
    if (is_default && stat(c->weights, &sb) != 0 && errno == ENOENT) {
        snprintf(srv.env.schedules_reason, sizeof srv.env.schedules_reason,
                 "the default weight file %s does not exist", c->weights);
        tlmd_log(LOG_WARN, "weights_missing",
                 "path=\"%s\" schedules=default hint=\"serving the rule-of-thumb schedules; pass "
                 "--weights FILE for a trained model, or --weights none to silence this\"",
                 c->weights);
        return 0;
    }
    tlm_model *m = NULL;
    tlm_weights_info wi = {0};
    if (tlm_model_load(c->weights, lang_vocab_size(), vh, &m, &err) ||
        (tlm_weights_manifest(c->weights, &wi), !wi.sha[0])) {
        if (!err.msg[0]) tlm_err_set(&err, TLM_EIO, "file", "cannot read it");
        const char *who = is_default                           ? "weights"
                          : !strcmp(c->weights_from, "config") ? "weights (config file)"
                                                               : c->weights_from;
        fprintf(stderr,
                "tlmd: %s: cannot use the weight file %s: %s%s%s\n"
                "tlmd: pass --weights none to serve the default schedules without a model\n",
                who, c->weights, err.field[0] ? err.field : "", err.field[0] ? ": " : "", err.msg);
        tlmd_log(LOG_ERROR, "weights", "from=%s path=\"%s\" field=%s error=\"%s\"", c->weights_from,
                 c->weights, err.field, err.msg);
        tlm_model_free(m);
        return 2;
    }
    snprintf(srv.env.weights_loaded, sizeof srv.env.weights_loaded, "%s", c->weights);
    srv.env.weights_cfg = m->cfg;
    srv.env.weights_params = m->n_params;
    snprintf(srv.env.weights_sha, sizeof srv.env.weights_sha, "%s", wi.sha);
    srv.env.weights_trained = wi.trained;
    m->default_prior = (float)wi.prior;
    srv.env.weights_prior = m->default_prior;
    bool held_back = wi.trained && wi.held_back;
    if ((srv.env.weights_trained && !held_back) || c->serve_untrained) {
        srv.model = m;
        srv.env.model = m;
        /* the MANIFEST's prior on the default schedule changes what the model writes: the
         * cache key's model part names it (the weights' hash alone without one) */
        if (m->default_prior > 0.0f) {
            char id[128];
            int n = snprintf(id, sizeof id, "%s:prior=%.9g", srv.env.weights_sha,
                             (double)m->default_prior);
            tlm_sha256_hex(id, (size_t)n, srv.env.model_id);
        } else {
            snprintf(srv.env.model_id, sizeof srv.env.model_id, "%s", srv.env.weights_sha);
        }
        snprintf(srv.env.schedules_reason, sizeof srv.env.schedules_reason, "%s",
                 srv.env.weights_trained && !held_back ? "trained weights"
                 : held_back ? "trained weights held back by their MANIFEST (serve = default), "
                               "served because of --serve-untrained"
                             : "untrained weights, served because of --serve-untrained");
        tlmd_log(srv.env.weights_trained ? LOG_INFO : LOG_WARN, "weights",
                 "path=\"%s\" model_id=%.16s trained=%s schedules=tlm", c->weights,
                 srv.env.model_id, srv.env.weights_trained ? "true" : "false");
        return 0;
    }
    if (held_back) {
        /* not served, but kept: HTAM refinement regenerates its strategies' slots with them */
        srv.model = m;
        snprintf(srv.env.schedules_reason, sizeof srv.env.schedules_reason,
                 "the weights %s are trained but their MANIFEST holds them back (serve = default: "
                 "they lose to the rule-of-thumb schedules on the held-out evaluation); "
                 "--serve-untrained serves them anyway",
                 c->weights);
        tlmd_log(LOG_WARN, "weights_held_back", "path=\"%s\" schedules=default htam_regen=tlm",
                 c->weights);
        return 0;
    }
    tlm_model_free(m);
    snprintf(srv.env.schedules_reason, sizeof srv.env.schedules_reason,
             "the weights %s are not trained (no MANIFEST next to them says trained = true for "
             "this file); --serve-untrained serves them anyway",
             c->weights);
    tlmd_log(LOG_WARN, "weights_untrained",
             "path=\"%s\" schedules=default hint=\"a randomly initialised model writes legal but "
             "slow schedules; serving the rule-of-thumb schedules instead (--serve-untrained "
             "overrides)\"",
             c->weights);
    return 0;
}

/* Where the decoder runs (see the usage text). Returns 0, or 2 after printing why. */
static int setup_device(tlmd_config *c)
{
    tlm_error err;
    tlm_err_clear(&err);
    bool want_cuda = !strncmp(c->device, "cuda", 4);
    if (!srv.env.model && !want_cuda) {
        /* nothing decodes: no GPU is touched (auto would compile its kernels for nothing) */
        snprintf(srv.env.device_id, sizeof srv.env.device_id, "cpu");
        snprintf(srv.env.device_name, sizeof srv.env.device_name, "cpu");
        snprintf(srv.env.device_reason, sizeof srv.env.device_reason,
                 "no schedule model is served, so nothing is decoded (device %s)", c->device);
        tlmd_log(LOG_INFO, "device", "requested=%s using=cpu reason=\"%s\"", c->device,
                 srv.env.device_reason);
        return 0;
    }
    if (tlm_device_open(c->device, &srv.env.dev, &err)) {
        fprintf(stderr, "tlmd: --device %s: %s\n", c->device, err.msg);
        tlmd_log(LOG_ERROR, "device", "requested=%s error=\"%s\"", c->device, err.msg);
        return 2;
    }
    bool cuda = tlm_device_kind(srv.env.dev) == TLM_DEVICE_CUDA;
    if (cuda && srv.env.model && tlm_device_upload_model(srv.env.dev, srv.env.model, &err)) {
        if (strcmp(c->device, "auto")) {
            fprintf(stderr, "tlmd: --device %s: cannot upload the model: %s\n", c->device, err.msg);
            tlmd_log(LOG_ERROR, "device", "requested=%s error=\"%s\"", c->device, err.msg);
            return 2;
        }
        /* auto: the CPU still works */
        char why[600];
        snprintf(why, sizeof why, "%s", err.msg);
        tlm_device_close(srv.env.dev);
        srv.env.dev = NULL;
        if (tlm_device_open("cpu", &srv.env.dev, &err)) {
            fprintf(stderr, "tlmd: device cpu: %s\n", err.msg);
            return 2;
        }
        cuda = false;
        snprintf(srv.env.device_reason, sizeof srv.env.device_reason,
                 "auto: the GPU could not hold the model (%s); decoding on the CPU", why);
    }
    const char *name = tlm_device_name(srv.env.dev);
    snprintf(srv.env.device_name, sizeof srv.env.device_name, "%s", name);
    snprintf(srv.env.device_id, sizeof srv.env.device_id, "%.*s", (int)strcspn(name, " "), name);
    if (!srv.env.device_reason[0]) {
        const char *fb = tlm_device_fallback_reason(srv.env.dev);
        if (!strcmp(c->device, "auto"))
            snprintf(srv.env.device_reason, sizeof srv.env.device_reason,
                     cuda ? "auto: a CUDA driver and GPU are present; the model is resident on it"
                          : "auto: no usable GPU (%s); decoding on the CPU",
                     fb[0] ? fb : "none found");
        else
            snprintf(srv.env.device_reason, sizeof srv.env.device_reason,
                     "requested (--device %s)%s", c->device,
                     srv.env.model ? "" : "; unused: no schedule model is served");
    }
    tlmd_log(LOG_INFO, "device", "requested=%s using=%s name=\"%s\" reason=\"%s\"", c->device,
             srv.env.device_id, srv.env.device_name, srv.env.device_reason);
    return 0;
}

static int mkdir_parent(const char *path)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = 0;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0755);
        *p = '/';
    }
    return mkdir(dir, 0755) && errno != EEXIST ? -1 : 0;
}

static char *targets_json(void)
{
    const char *names[64];
    int n = target_list(names, 64);
    json_t *arr = json_array();
    for (int i = 0; i < n && i < 64; i++) {
        target t;
        if (target_parse(names[i], &t, NULL)) continue; /* e.g. x86 names on another host */
        json_array_append_new(arr, target_to_json(&t));
    }
    json_t *o = json_pack("{s:o}", "targets", arr);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

/* ---- signals, watchdog, shutdown ---- */

static void on_watchdog(uv_timer_t *t)
{
    char status[128];
    snprintf(status, sizeof status, "STATUS=%d jobs in flight, %d decodes queued",
             jobs_in_flight(srv.js), dec_queue_depth(srv.d));
    sd_notify(0, "WATCHDOG=1");
    sd_notify(0, status);
}

static void close_cb(uv_handle_t *h) {}
static void sig_stop(void);

/* Cache hits record their use in memory (defer_touch: a hit never takes the store's write
 * lock); once a second the uses go to the file on the compile pool, where the writers are. */
static void touch_work(pool_work *w)
{
    tlm_error e;
    tlm_err_clear(&e);
    if (store_touch_flush(srv.env.st, &e)) tlmd_log(LOG_WARN, "store_touch", "error=\"%s\"", e.msg);
}

static void touch_done(pool_work *w)
{
    srv.touch_busy = false;
}

static void on_touch_timer(uv_timer_t *t)
{
    if (srv.touch_busy || !store_touch_pending(srv.env.st)) return;
    srv.touch_busy = true;
    srv.touch_w = (pool_work){.work = touch_work, .done = touch_done};
    pool_submit(srv.cp, &srv.touch_w);
}

static uv_timer_t hard_stop;

/* Compiles already running on the pool cannot be interrupted. When they outlast a second
 * grace period the process leaves without waiting: every committed store write is durable
 * (WAL), an unfinished one rolls back, and the answers for those jobs were already sent. */
static void on_hard_stop(uv_timer_t *t)
{
    tlmd_log(LOG_WARN, "exit",
             "status=0 flights_abandoned=%d reason=\"pool work outlasted the "
             "grace period\"",
             jobs_flights_in_flight(srv.js));
    _exit(0);
}

/* Before each poll: what the turn since the last one spent outside epoll_wait is the time a
 * request arriving then waited for the loop. */
static void on_turn(uv_prepare_t *p)
{
    uint64_t now = uv_hrtime(), idle = uv_metrics_idle_time(p->loop);
    if (srv.turn_t) {
        uint64_t wall = now - srv.turn_t, slept = idle - srv.turn_idle;
        metrics_loop_busy(srv.m, (double)(wall > slept ? wall - slept : 0) / 1e9);
    }
    srv.turn_t = now;
    srv.turn_idle = idle;
}

static void finish_stop(void)
{
    if (srv.stopped) return;
    srv.stopped = true;
    http_stop(srv.h);
    dec_stop(srv.d); /* joins the decoder thread; its last messages are drained below */
    drain_queue(&srv.inbox);
    uv_close((uv_handle_t *)&srv.shutdown_timer, close_cb);
    uv_close((uv_handle_t *)&srv.watchdog, close_cb);
    uv_close((uv_handle_t *)&srv.touch_timer, close_cb);
    uv_close((uv_handle_t *)&srv.turn, close_cb);
    sig_stop(); /* before the async handle goes: it posts through it */
    uv_close((uv_handle_t *)&srv.inbox.async, close_cb);
    tlmd_log(LOG_INFO, "stopped", "flights_left=%d", jobs_flights_in_flight(srv.js));
    if (jobs_flights_in_flight(srv.js)) {
        uv_timer_init(srv.env.loop, &hard_stop);
        uv_timer_start(&hard_stop, on_hard_stop, (uint64_t)(srv.env.cfg.grace_s * 1000) + 1000, 0);
        uv_unref((uv_handle_t *)&hard_stop); /* it must not keep the loop alive by itself */
    }
}

static void on_shutdown_tick(uv_timer_t *t)
{
    double waited = tlmd_now() - srv.shutdown_started;
    static bool failed;
    if (!failed && (jobs_in_flight(srv.js) == 0 || waited >= srv.env.cfg.grace_s)) {
        failed = true;
        if (jobs_in_flight(srv.js))
            tlmd_log(LOG_WARN, "shutdown_grace_over", "failing=%d", jobs_in_flight(srv.js));
        jobs_fail_all(srv.js, "the server is shutting down");
        http_fail_all(srv.h);
        http_kick(srv.h);
        return;
    }
    /* Give the answers a moment to leave before MHD goes. */
    if (failed && (http_connections(srv.h) == 0 || waited >= srv.env.cfg.grace_s + 3))
        finish_stop();
}

static void srv_shutdown_begin(const char *why)
{
    if (srv.status.shutting_down) return;
    srv.status.shutting_down = true;
    srv.shutdown_started = tlmd_now();
    sd_notify(0, "STOPPING=1");
    tlmd_log(LOG_INFO, "shutdown", "reason=%s jobs_in_flight=%d grace_s=%g", why,
             jobs_in_flight(srv.js), srv.env.cfg.grace_s);
    http_quiesce(srv.h);
    cluster_abort(srv.env.cl); /* a measurement request in progress answers with what it has */
    uv_timer_start(&srv.shutdown_timer, on_shutdown_tick, 0, 50);
}

/* ---- signals ----
 * SIGTERM, SIGINT and SIGHUP are blocked in every thread and taken by one thread with
 * sigwait, which posts them to the loop. No signal handler of ours is involved, so libraries
 * that install their own while they work cannot take them over: NVRTC puts handlers on
 * SIGTERM and SIGINT for the length of each compile (process-wide), and with concurrent
 * compiles a SIGTERM then crashed the daemon inside NVRTC instead of shutting it down.
 * Threads that libraries start before main (OpenBLAS) would still take the signals, so when
 * one runs with them unblocked tlmd re-executes itself once with the mask already in place
 * (a mask survives execve; the pid, fds and environment stay). Children start with a clean
 * mask (compiler/toolchain/cc.c, compiler/measure). */

static pthread_t sig_thread;
static bool sig_thread_started;

static void sigs_of_loop(sigset_t *s)
{
    sigemptyset(s);
    sigaddset(s, SIGTERM);
    sigaddset(s, SIGINT);
    sigaddset(s, SIGHUP);
}

static void on_signal(void *arg)
{
    int signum = (int)(intptr_t)arg;
    if (signum == SIGHUP) {
        int rc = tlmd_log_open(srv.env.cfg.log_level, srv.env.cfg.log_file);
        tlmd_log(rc ? LOG_ERROR : LOG_INFO, "log_reopened", "file=\"%s\" ok=%s",
                 srv.env.cfg.log_file, rc ? "false" : "true");
        return;
    }
    srv_shutdown_begin(signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

static void *sig_main(void *arg)
{
    sigset_t s;
    sigs_of_loop(&s);
    for (;;) {
        int sig = 0;
        if (sigwait(&s, &sig) != 0) continue; /* sigwait is a cancellation point: sig_stop */
        tlmd_post(&srv.inbox, on_signal, (void *)(intptr_t)sig);
    }
    return NULL;
}

static void sig_stop(void)
{
    if (!sig_thread_started) return;
    pthread_cancel(sig_thread);
    pthread_join(sig_thread, NULL);
    sig_thread_started = false;
}

/* Whether the process has a thread besides this one (libraries start some before main:
 * OpenBLAS does). Their signal masks cannot be read reliably (a thread that is still starting
 * shows everything blocked for a moment), so any such thread counts. */
static bool other_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    if (!d) return false;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strtol(e->d_name, NULL, 10) > 0;
    closedir(d);
    return n > 1;
}

static void block_loop_signals(char **argv)
{
    sigset_t s;
    sigs_of_loop(&s);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    const char *again = getenv("TLMD_SIGNALS_MASKED");
    if (!again && other_threads()) {
        setenv("TLMD_SIGNALS_MASKED", "1", 1);
        execv("/proc/self/exe", argv);
        /* no re-exec possible: carry on; a signal may then reach a library's handler */
    }
    unsetenv("TLMD_SIGNALS_MASKED");
}

/* ---- bearer tokens ---- */

static int load_tokens(tlmd_env *env, tlm_error *err)
{
    const char *path = env->cfg.token_file;
    if (!path[0]) return 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return tlm_err_set(err, TLM_EINVAL, "token_file", "cannot open %s: %s", path,
                           strerror(errno));
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, " \t\r\n");
        if (!n || line[0] == '#') continue;
        line[n] = 0;
        char **p = realloc(env->tokens, (size_t)(env->n_tokens + 1) * sizeof *p);
        if (!p || !(p[env->n_tokens] = strdup(line))) {
            if (p) env->tokens = p;
            fclose(f);
            return tlm_err_set(err, TLM_ENOMEM, "token_file", "out of memory");
        }
        env->tokens = p;
        env->n_tokens++;
    }
    fclose(f);
    if (!env->n_tokens)
        return tlm_err_set(err, TLM_EINVAL, "token_file", "%s holds no token", path);
    return 0;
}

/* Frees what main built, in the order the threads that use it are gone. */
static void teardown(void)
{
    cluster_free(srv.env.cl); /* joins the measurement workers */
    srv.env.cl = NULL;
    routes_free(srv.rt);
    jobs_free(srv.js);
    pool_free(srv.cp); /* stopped by main after the loop (or never started) */
    dec_free(srv.d);   /* joins the decoder thread if it still runs */
    http_free(srv.h);
    metrics_free(srv.m);
    l2_free(srv.env.l2);
    hot_free(srv.env.hot);
    store_close(srv.env.st);
    tlm_device_close(srv.env.dev); /* after the decoder: its caches lived there */
    tlm_model_free(srv.model);
    free(srv.env.targets_json);
    for (int i = 0; i < srv.env.n_tokens; i++)
        free(srv.env.tokens[i]);
    free(srv.env.tokens);
}

int main(int argc, char **argv)
{
    block_loop_signals(argv);
    tlm_error err;
    tlm_err_clear(&err);
    tlmd_env *env = &srv.env;
    if (config_load(&env->cfg, argc, argv, &err)) {
        fprintf(stderr, "tlmd: %s%s%s\n%s", err.field, err.field[0] ? ": " : "", err.msg, usage);
        return 2;
    }
    tlmd_config *c = &env->cfg;
    if (tlmd_log_open(c->log_level, c->log_file)) {
        fprintf(stderr, "tlmd: cannot open log file %s: %s\n", c->log_file, strerror(errno));
        return 2;
    }
    /* A client that goes away mid-answer must not kill the server. */
    signal(SIGPIPE, SIG_IGN);
    tune_register(); /* mode "tune": the measured search */
    pthread_mutex_init(&srv.inbox.mu, NULL);
    tlmd_log(LOG_INFO, "starting", "version=%s pid=%ld store=\"%s\" weights=\"%s\" device=%s",
             TLMD_VERSION, (long)getpid(), c->store_path, c->weights, c->device);
    if (load_tokens(env, &err)) {
        tlmd_log(LOG_ERROR, "config", "field=%s error=\"%s\"", err.field, err.msg);
        teardown();
        return 2;
    }

    /* The weights: the model id is the file's SHA-256, so a new checkpoint is a new key. */
    if (setup_weights(c) || setup_device(c)) {
        teardown();
        return 2;
    }

    /* Toolchain identities run the compiler / load NVRTC once: never on the loop. */
    target host;
    if (target_parse("cpu", &host, &err) == 0)
        drv_toolchain_key(&host, env->cc_key, sizeof env->cc_key);
    snprintf(env->nvrtc_key, sizeof env->nvrtc_key, "%s", tc_nvrtc_identity());
    env->targets_json = targets_json();

    if (mkdir_parent(c->store_path)) {
        tlmd_log(LOG_ERROR, "store", "path=\"%s\" error=\"cannot create its directory: %s\"",
                 c->store_path, strerror(errno));
        teardown();
        return 1;
    }
    int rc;
    store_opts so = {
        .max_bytes = c->store_max_bytes, .busy_timeout_ms = 10000, .defer_touch = true};
    env->st = store_open(c->store_path, &so, &err);
    if (!env->st) {
        tlmd_log(LOG_ERROR, "store", "path=\"%s\" error=\"%s\"", c->store_path, err.msg);
        teardown();
        return 1;
    }
    env->hot = hot_new(c->hot_cache_bytes);
    /* the compile directories a killed process left (its PID gone, ten minutes unchanged) */
    int swept = tc_tmpdir_sweep(NULL, 600);
    if (swept) tlmd_log(LOG_INFO, "start", "swept=%d what=\"stale compile directories\"", swept);

    if (c->l2.url[0]) {
        rc = l2_new(&c->l2, &env->l2, &err);
        if (rc) {
            fprintf(stderr, "tlmd: %s: %s\n", err.field, err.msg);
            tlmd_log(LOG_ERROR, "config", "field=%s error=\"%s\"", err.field, err.msg);
            teardown();
            return 2;
        }
    }
    if (cluster_new(env->l2, env->st, &env->cl, &err)) {
        tlmd_log(LOG_ERROR, "start", "error=\"%s\"", err.msg);
        teardown();
        return 1;
    }
    /* with a cluster tier, a tune's measurements go to every daemon that serves its target */
    if (env->l2) tune_set_default_eval(cluster_tune_eval, env->cl);
    /* strategy "htam": its memory lives in this store, shared with every job */
    htam_store_io hio = {.load = store_htam_load, .save = store_htam_save, .st = env->st};
    htam_set_store_io(&hio);
    /* trained weights (served or held back) write the slots an HTAM strategy rewrites */
    htam_set_regen_model(srv.env.weights_trained ? srv.model : NULL);

    env->loop = uv_default_loop();
    uv_loop_configure(env->loop, UV_METRICS_IDLE_TIME);
    uv_async_init(env->loop, &srv.inbox.async, on_async);
    srv.inbox.async.data = &srv.inbox;
    uv_timer_init(env->loop, &srv.watchdog);
    uv_timer_init(env->loop, &srv.shutdown_timer);
    uv_timer_init(env->loop, &srv.touch_timer);

    /* The modules, each handed what it talks to. */
    rc = 0;
    srv.m = metrics_new(routes_labels(), routes_label_count());
    srv.h = srv.m ? http_new(env, srv.m) : NULL;
    if (!srv.h) rc = tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
    srv.inbox.h = srv.h;
    if (!rc && env->model) rc = dec_start(env, srv.m, &srv.inbox, &srv.d, &err);
    if (!rc) {
        srv.cp = pool_new(env->loop, c->compile_workers, c->compile_nice);
        srv.js = srv.cp ? jobs_new(env, srv.d, srv.m, srv.h, srv.cp) : NULL;
        srv.rt = srv.js ? routes_new(env, &srv.status, srv.js, srv.d, srv.m) : NULL;
        if (!srv.rt) rc = tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
    }
    if (!rc && pthread_create(&sig_thread, NULL, sig_main, NULL) == 0)
        sig_thread_started = true;
    else if (!rc)
        rc = tlm_err_set(&err, TLM_ENOMEM, "", "cannot start the signal thread");
    http_handlers hd = {routes_begin, routes_dispatch, srv.rt};
    if (!rc) rc = http_start(srv.h, &hd, &err);
    if (rc) {
        tlmd_log(LOG_ERROR, "start", "field=%s error=\"%s\"", err.field, err.msg);
        sig_stop();
        teardown();
        return 1;
    }
    uint64_t wd_usec = 0;
    uv_timer_start(&srv.touch_timer, on_touch_timer, 1000, 1000);
    uv_prepare_init(env->loop, &srv.turn);
    uv_prepare_start(&srv.turn, on_turn);
    uv_unref((uv_handle_t *)&srv.turn);
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0)
        uv_timer_start(&srv.watchdog, on_watchdog, 0, wd_usec / 2000);
    srv.status.ready = true;
    sd_notify(0, "READY=1\nSTATUS=accepting compile requests");
    tlmd_log(LOG_INFO, "ready",
             "listen=%s:%d socket_activated=%s schedules=%s model_id=%.16s weights_trained=%s "
             "device=%s",
             c->listen_addr, http_port(srv.h), http_socket_activated(srv.h) ? "true" : "false",
             env->model ? "tlm" : "default", env->model_id, env->weights_trained ? "true" : "false",
             env->device_id);

    uv_run(env->loop, UV_RUN_DEFAULT);
    /* Every pool task has returned (the loop only ends when none is pending). The remembered
     * jobs go now; their timers close on one more turn of the loop. */
    jobs_free(srv.js);
    srv.js = NULL;
    pool_stop(srv.cp); /* idle: nothing is pending once the loop has ended */
    uv_run(env->loop, UV_RUN_DEFAULT);
    uv_loop_close(env->loop);
    /* Join the thread pool's idle workers: threads left running at exit race with the
     * process' own teardown (LeakSanitizer's stop-the-world dies on them now and then). */
    uv_library_shutdown();
    teardown();
    tlmd_log(LOG_INFO, "exit", "status=0");
    if (log_fp) fclose(log_fp);
    return 0;
}
