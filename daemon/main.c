/* main.c — tlmd: configuration (defaults < config file < TLMD_* environment < flags),
 * structured logging, start-up (store, weights, decoder thread, HTTP), signals, sd_notify
 * and the orderly shutdown. */
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
#include "daemon/tlmd.h"

tlmd_server g_srv;

/* ---- logging ---- */

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *log_fp; /* NULL: stderr */
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
    if (level < g_srv.cfg.log_level) return;
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

int tlmd_log_reopen(void)
{
    if (!g_srv.cfg.log_file[0]) return 0;
    FILE *f = fopen(g_srv.cfg.log_file, "a");
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
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double tlmd_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- configuration ---- */

static const char usage[] =
    "usage: tlmd [--listen ADDR:PORT] [--store FILE] [--weights FILE] [--device "
    "auto|cpu|cuda[:N]]\n"
    "            [--config FILE] [--token-file FILE] [--log-level debug|info|warn|error]\n"
    "            [--log-file FILE]\n"
    "Environment: TLMD_LISTEN, TLMD_STORE, TLMD_WEIGHTS, TLMD_DEVICE, TLMD_CONFIG,\n"
    "TLMD_TOKEN_FILE, TLMD_LOG_LEVEL, TLMD_LOG_FILE. Config file: key = value lines with the\n"
    "same keys (listen, store, weights, device, token_file, log_level, log_file) and\n"
    "max_body_bytes, max_jobs, max_workloads, max_candidates, job_timeout_s, grace_s,\n"
    "store_max_bytes, decoder_slots.\n";

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

static int config_set(tlmd_config *c, const char *key, const char *v, tlm_error *err)
{
    double d;
    int rc;
    if (!strcmp(key, "listen")) return parse_listen(c, v, err);
    if (!strcmp(key, "store")) return copy_str(c->store_path, sizeof c->store_path, key, v, err);
    if (!strcmp(key, "weights")) return copy_str(c->weights, sizeof c->weights, key, v, err);
    if (!strcmp(key, "token_file"))
        return copy_str(c->token_file, sizeof c->token_file, key, v, err);
    if (!strcmp(key, "log_file")) return copy_str(c->log_file, sizeof c->log_file, key, v, err);
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
    NUM("decoder_slots", 1, 4096, c->decoder_slots = (int)d)
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
        if ((rc = config_set(c, k, v, err)))
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
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    static const char *const keys[] = {"listen", "store",      "weights",   "device",
                                       "config", "token_file", "log_level", "log_file"};
    static const char shorts[] = "lswdctLF";
    const char *flag[8] = {0};
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        const char *p = strchr(shorts, ch);
        if (p && ch) {
            flag[p - shorts] = optarg;
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
    static const char *const envs[] = {"TLMD_LISTEN",    "TLMD_STORE",   "TLMD_WEIGHTS",
                                       "TLMD_DEVICE",    NULL,           "TLMD_TOKEN_FILE",
                                       "TLMD_LOG_LEVEL", "TLMD_LOG_FILE"};
    for (int i = 0; i < 8; i++) {
        const char *v = envs[i] ? getenv(envs[i]) : NULL;
        if (v && v[0] && (rc = config_set(c, keys[i], v, err))) return rc;
    }
    for (int i = 0; i < 8; i++)
        if (i != 4 && flag[i] && (rc = config_set(c, keys[i], flag[i], err))) {
            snprintf(err->field, sizeof err->field, "--%s", opts[i].name);
            return rc;
        }
    return 0;
}

/* ---- the message queue ---- */

void srv_post(void (*fn)(void *), void *arg)
{
    tlmd_msg *m = malloc(sizeof *m);
    if (!m) abort(); /* a lost completion would hang a job forever */
    m->fn = fn;
    m->arg = arg;
    m->next = NULL;
    pthread_mutex_lock(&g_srv.q_mu);
    if (g_srv.q_tail)
        g_srv.q_tail->next = m;
    else
        g_srv.q_head = m;
    g_srv.q_tail = m;
    pthread_mutex_unlock(&g_srv.q_mu);
    uv_async_send(&g_srv.async);
}

static void drain_queue(void)
{
    for (;;) {
        pthread_mutex_lock(&g_srv.q_mu);
        tlmd_msg *m = g_srv.q_head;
        g_srv.q_head = g_srv.q_tail = NULL;
        pthread_mutex_unlock(&g_srv.q_mu);
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
static void on_async(uv_async_t *h)
{
    drain_queue();
    srv_kick();
}

/* ---- start-up helpers ---- */

static int sha256_file(const char *path, char hex[65])
{
    FILE *f = fopen(path, "rb");
    if (!f) return TLM_EIO;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        EVP_DigestUpdate(ctx, buf, n);
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx, md, &len);
    EVP_MD_CTX_free(ctx);
    fclose(f);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    return 0;
}

/* The weights are "trained" only when model_weights/MANIFEST (next to the weight file) has a
 * line "trained = true" (or "trained: true"); a freshly initialised model never is. */
static bool weights_trained(const char *weights)
{
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s", weights);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *f = fopen(path, "r");
    if (!f) return false;
    char line[512];
    bool trained = false;
    while (fgets(line, sizeof line, f)) {
        char *s = trim(line);
        if (!strncmp(s, "trained", 7)) {
            s = trim(s + 7);
            if (*s == '=' || *s == ':') trained = !strncmp(trim(s + 1), "true", 4);
        }
    }
    fclose(f);
    return trained;
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
             g_srv.jobs_in_flight, dec_queue_depth());
    sd_notify(0, "WATCHDOG=1");
    sd_notify(0, status);
}

static void close_cb(uv_handle_t *h) {}

static uv_timer_t hard_stop;

/* Compiles already running on the pool cannot be interrupted. When they outlast a second
 * grace period the process leaves without waiting: every committed store write is durable
 * (WAL), an unfinished one rolls back, and the answers for those jobs were already sent. */
static void on_hard_stop(uv_timer_t *t)
{
    tlmd_log(LOG_WARN, "exit",
             "status=0 flights_abandoned=%d reason=\"pool work outlasted the "
             "grace period\"",
             jobs_flights_in_flight());
    _exit(0);
}

static void finish_stop(void)
{
    if (g_srv.stopped) return;
    g_srv.stopped = true;
    http_stop(&g_srv);
    dec_stop(); /* joins the decoder thread; its last messages are drained below */
    drain_queue();
    uv_close((uv_handle_t *)&g_srv.shutdown_timer, close_cb);
    uv_close((uv_handle_t *)&g_srv.watchdog, close_cb);
    uv_close((uv_handle_t *)&g_srv.sig_term, close_cb);
    uv_close((uv_handle_t *)&g_srv.sig_int, close_cb);
    uv_close((uv_handle_t *)&g_srv.sig_hup, close_cb);
    uv_close((uv_handle_t *)&g_srv.async, close_cb);
    tlmd_log(LOG_INFO, "stopped", "flights_left=%d", jobs_flights_in_flight());
    if (jobs_flights_in_flight()) {
        uv_timer_init(g_srv.loop, &hard_stop);
        uv_timer_start(&hard_stop, on_hard_stop, (uint64_t)(g_srv.cfg.grace_s * 1000) + 1000, 0);
        uv_unref((uv_handle_t *)&hard_stop); /* it must not keep the loop alive by itself */
    }
}

static void on_shutdown_tick(uv_timer_t *t)
{
    double waited = tlmd_now() - g_srv.shutdown_started;
    static bool failed;
    if (!failed && (g_srv.jobs_in_flight == 0 || waited >= g_srv.cfg.grace_s)) {
        failed = true;
        if (g_srv.jobs_in_flight)
            tlmd_log(LOG_WARN, "shutdown_grace_over", "failing=%d", g_srv.jobs_in_flight);
        jobs_fail_all("the server is shutting down");
        http_fail_all();
        srv_kick();
        return;
    }
    /* Give the answers a moment to leave before MHD goes. */
    if (failed && (http_connections() == 0 || waited >= g_srv.cfg.grace_s + 3)) finish_stop();
}

void srv_shutdown_begin(const char *why)
{
    if (g_srv.shutting_down) return;
    g_srv.shutting_down = true;
    g_srv.shutdown_started = tlmd_now();
    sd_notify(0, "STOPPING=1");
    tlmd_log(LOG_INFO, "shutdown", "reason=%s jobs_in_flight=%d grace_s=%g", why,
             g_srv.jobs_in_flight, g_srv.cfg.grace_s);
    if (g_srv.mhd) {
        MHD_socket fd = MHD_quiesce_daemon(g_srv.mhd); /* stop accepting */
        if (fd != MHD_INVALID_SOCKET) close(fd);
    }
    uv_timer_start(&g_srv.shutdown_timer, on_shutdown_tick, 0, 50);
}

static void on_signal(uv_signal_t *h, int signum)
{
    if (signum == SIGHUP) {
        int rc = tlmd_log_reopen();
        tlmd_log(rc ? LOG_ERROR : LOG_INFO, "log_reopened", "file=\"%s\" ok=%s", g_srv.cfg.log_file,
                 rc ? "false" : "true");
        return;
    }
    srv_shutdown_begin(signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

int main(int argc, char **argv)
{
    tlm_error err;
    tlm_err_clear(&err);
    g_srv.cfg.log_level = LOG_INFO;
    if (config_load(&g_srv.cfg, argc, argv, &err)) {
        fprintf(stderr, "tlmd: %s%s%s\n%s", err.field, err.field[0] ? ": " : "", err.msg, usage);
        return 2;
    }
    tlmd_config *c = &g_srv.cfg;
    if (c->log_file[0] && tlmd_log_reopen()) {
        fprintf(stderr, "tlmd: cannot open log file %s: %s\n", c->log_file, strerror(errno));
        return 2;
    }
    /* A client that goes away mid-answer must not kill the server. */
    signal(SIGPIPE, SIG_IGN);
    pthread_mutex_init(&g_srv.q_mu, NULL);
    g_srv.listen_fd_activated = -1;
    tlmd_log(LOG_INFO, "starting", "version=%s pid=%ld store=\"%s\" weights=\"%s\" device=%s",
             TLMD_VERSION, (long)getpid(), c->store_path, c->weights, c->device);
    if (routes_load_tokens(&g_srv, &err)) {
        tlmd_log(LOG_ERROR, "config", "field=%s error=\"%s\"", err.field, err.msg);
        return 2;
    }

    /* The weights: the model id is the file's SHA-256, so a new checkpoint is a new key. */
    uint8_t vh[32];
    lang_vocab_hash(vh);
    lang_vocab_hash_hex(g_srv.vocab_hash);
    if (tlm_model_load(c->weights, lang_vocab_size(), vh, &g_srv.model, &err) ||
        sha256_file(c->weights, g_srv.model_id)) {
        tlmd_log(LOG_ERROR, "weights",
                 "path=\"%s\" field=%s error=\"%s\" hint=\"make run creates "
                 "a small random model with: tlm model init --layers 2 --heads 4 --dim 128 "
                 "--ctx 512 -o %s\"",
                 c->weights, err.field, err.msg, c->weights);
        return 2;
    }
    g_srv.weights_trained = weights_trained(c->weights);
    if (strncmp(c->device, "cuda", 4) == 0)
        tlmd_log(LOG_WARN, "device",
                 "requested=%s using=cpu reason=\"the TLM decoder runs on the "
                 "CPU in this build\"",
                 c->device);

    /* Toolchain identities run the compiler / load NVRTC once: never on the loop. */
    target host;
    if (target_parse("cpu", &host, &err) == 0)
        drv_toolchain_key(&host, g_srv.cc_key, sizeof g_srv.cc_key);
    snprintf(g_srv.nvrtc_key, sizeof g_srv.nvrtc_key, "%s", tc_nvrtc_identity());
    g_srv.targets_json = targets_json();

    if (mkdir_parent(c->store_path)) {
        tlmd_log(LOG_ERROR, "store", "path=\"%s\" error=\"cannot create its directory: %s\"",
                 c->store_path, strerror(errno));
        return 1;
    }
    store_opts so = {.max_bytes = c->store_max_bytes, .busy_timeout_ms = 10000};
    g_srv.st = store_open(c->store_path, &so, &err);
    if (!g_srv.st) {
        tlmd_log(LOG_ERROR, "store", "path=\"%s\" error=\"%s\"", c->store_path, err.msg);
        return 1;
    }

    g_srv.loop = uv_default_loop();
    uv_async_init(g_srv.loop, &g_srv.async, on_async);
    uv_signal_init(g_srv.loop, &g_srv.sig_term);
    uv_signal_init(g_srv.loop, &g_srv.sig_int);
    uv_signal_init(g_srv.loop, &g_srv.sig_hup);
    uv_signal_start(&g_srv.sig_term, on_signal, SIGTERM);
    uv_signal_start(&g_srv.sig_int, on_signal, SIGINT);
    uv_signal_start(&g_srv.sig_hup, on_signal, SIGHUP);
    uv_timer_init(g_srv.loop, &g_srv.watchdog);
    uv_timer_init(g_srv.loop, &g_srv.shutdown_timer);

    int rc = dec_start(&g_srv, &err);
    if (rc == 0) rc = http_start(&g_srv, &err);
    if (rc) {
        tlmd_log(LOG_ERROR, "start", "field=%s error=\"%s\"", err.field, err.msg);
        dec_stop();
        store_close(g_srv.st);
        tlm_model_free(g_srv.model);
        return 1;
    }
    uint64_t wd_usec = 0;
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0)
        uv_timer_start(&g_srv.watchdog, on_watchdog, 0, wd_usec / 2000);
    g_srv.ready = true;
    sd_notify(0, "READY=1\nSTATUS=accepting compile requests");
    tlmd_log(LOG_INFO, "ready",
             "listen=%s:%d socket_activated=%s model_id=%.16s weights_trained=%s", c->listen_addr,
             c->port, g_srv.listen_fd_activated >= 0 ? "true" : "false", g_srv.model_id,
             g_srv.weights_trained ? "true" : "false");

    uv_run(g_srv.loop, UV_RUN_DEFAULT);
    /* Every pool task has returned (the loop only ends when none is pending). */
    store_close(g_srv.st);
    tlm_model_free(g_srv.model);
    uv_loop_close(g_srv.loop);
    /* Join the thread pool's idle workers: threads left running at exit race with the
     * process' own teardown (LeakSanitizer's stop-the-world dies on them now and then). */
    uv_library_shutdown();
    free(g_srv.targets_json);
    for (int i = 0; i < g_srv.n_tokens; i++)
        free(g_srv.tokens[i]);
    free(g_srv.tokens);
    tlmd_log(LOG_INFO, "exit", "status=0");
    if (log_fp) fclose(log_fp);
    return 0;
}
