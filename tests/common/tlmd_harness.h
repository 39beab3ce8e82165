/* tlmd_harness.h — the real tlmd on loopback for daemon and client tests: a free port, a
 * temporary store and a tiny random model; requests go through tests/common/http_client.h, and
 * a job's id comes from the daemon's log.
 * TLMD_BIN names the daemon (default build/san/tlmd). Every wait is bounded (curl 120 s,
 * start-up 60 s, exit 60 s); no Criterion .timeout (it leaks under --jobs in Criterion 2.4).
 * tlmd gets SIGKILL when the thread that started it ends, so a failed test leaves none behind.
 * Header-only: every function is static inline so a test includes what it uses without
 * warnings. */
#ifndef TLMD_HARNESS_H
#define TLMD_HARNESS_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"
#include "compiler/util/util.h"
#include "tests/common/http_client.h"

typedef struct {
    pid_t pid;
    int port;
    char dir[256];
    char store[320];
    char weights[320];
    char log[320];
} tlmd;

/* ---- HTTP to this daemon (tests/common/http_client.h) ---- */

/* hdrs: NULL-terminated "Name: value" lines; body NULL for no body. */
static inline resp http(const tlmd *d, const char *method, const char *path, const char *body,
                        size_t body_len, const char *const *hdrs)
{
    return http_request(d->port, method, path, body, body_len, hdrs);
}

static inline resp post(const tlmd *d, const char *body)
{
    return http(d, "POST", "/v1/compile", body, strlen(body), json_hdr);
}

static inline resp get(const tlmd *d, const char *path)
{
    return http(d, "GET", path, NULL, 0, NULL);
}

/* A Prometheus sample value (the first line starting with `name`). */
static inline double metric(const tlmd *d, const char *name)
{
    resp r = get(d, "/metrics");
    cr_assert_eq(r.status, 200);
    double v = -1;
    size_t nl = strlen(name);
    for (char *l = r.body.p; l && *l;) {
        char *e = strchr(l, '\n');
        if (!strncmp(l, name, nl) && l[nl] == ' ') {
            v = strtod(l + nl + 1, NULL);
            break;
        }
        l = e ? e + 1 : NULL;
    }
    resp_free(&r);
    cr_assert(v >= 0, "metric %s missing", name);
    return v;
}

static inline json_int_t cache_stat(const tlmd *d, const char *key)
{
    resp r = get(d, "/v1/cache/stats");
    cr_assert_eq(r.status, 200);
    json_t *j = body_json(&r);
    json_int_t v = json_integer_value(json_object_get(j, key));
    json_decref(j);
    resp_free(&r);
    return v;
}

/* ---- the daemon's life ---- */

static inline int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(bind(s, (struct sockaddr *)&a, sizeof a) == 0);
    getsockname(s, (struct sockaddr *)&a, &len);
    close(s);
    return ntohs(a.sin_port);
}

static inline void make_weights(const char *path)
{
    tlm_config cfg = {2, 2, 64, 512, lang_vocab_size()};
    uint8_t vh[32];
    lang_vocab_hash(vh);
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_init_random(&cfg, vh, 7, &m, &e), 0, "%s", e.msg);
    cr_assert_eq(tlm_model_save(m, path, &e), 0, "%s", e.msg);
    tlm_model_free(m);
}

static inline void setup_dir(tlmd *d)
{
    memset(d, 0, sizeof *d);
    snprintf(d->dir, sizeof d->dir, "/tmp/tlmd-test-XXXXXX");
    cr_assert(mkdtemp(d->dir));
    snprintf(d->store, sizeof d->store, "%s/tlmd.db", d->dir);
    snprintf(d->weights, sizeof d->weights, "%s/tlm.bin", d->dir);
    snprintf(d->log, sizeof d->log, "%s/tlmd.log", d->dir);
    make_weights(d->weights);
}

static inline bool healthy(const tlmd *d)
{
    resp r = get(d, "/healthz");
    bool ok = r.status == 200;
    resp_free(&r);
    return ok;
}

/* The daemon to test: TLMD_BIN, default build/san/tlmd, as an absolute path (tests may run
 * it in another working directory). */
static inline void tlmd_bin(char abs[4096])
{
    const char *bin = getenv("TLMD_BIN");
    if (!realpath(bin && bin[0] ? bin : "build/san/tlmd", abs))
        cr_assert_fail("no tlmd binary at %s", bin && bin[0] ? bin : "build/san/tlmd");
}

/* Forks and execs argv (argv[0] the binary) in cwd (NULL: here) with env entries ("NAME=value",
 * NULL-terminated, or NULL) added; stdout and stderr go to log (appended, or truncated first).
 * The child gets SIGKILL when this test process dies. Returns its pid. */
static inline pid_t tlmd_spawn(const char *const *argv, const char *cwd, const char *const *env,
                               const char *log, bool truncate)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        /* a failed assertion ends the test without teardown: tlmd must not outlive it */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127);
        if (cwd && chdir(cwd)) _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | (truncate ? O_TRUNC : O_APPEND), 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        setenv("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0", 0);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* Starts tlmd on a free port with d's store, then args (NULL-terminated, or NULL), in cwd
 * (NULL: here) with env entries added; with_weights passes --weights d->weights first. Retries
 * on another port if the chosen one was taken meanwhile. */
static inline void start_with(tlmd *d, const char *cwd, bool with_weights,
                              const char *const *args, const char *const *env)
{
    char bin[4096];
    tlmd_bin(bin);
    for (int attempt = 0; attempt < 5; attempt++) {
        d->port = free_port();
        char listen[64];
        snprintf(listen, sizeof listen, "127.0.0.1:%d", d->port);
        const char *argv[32] = {bin, "--listen", listen, "--store", d->store, "--log-level", "debug"};
        int n = 7;
        if (with_weights) {
            argv[n++] = "--weights";
            argv[n++] = d->weights;
        }
        for (int i = 0; args && args[i] && n < 31; i++)
            argv[n++] = args[i];
        argv[n] = NULL;
        pid_t pid = tlmd_spawn(argv, cwd, env, d->log, false);
        d->pid = pid;
        double t0 = tlm_now_s();
        while (tlm_now_s() - t0 < 60) {
            int st;
            if (waitpid(pid, &st, WNOHANG) == pid) {
                d->pid = 0;
                break;
            }
            if (healthy(d)) return;
            usleep(50000);
        }
        if (d->pid) {
            kill(d->pid, SIGKILL);
            waitpid(d->pid, NULL, 0);
            d->pid = 0;
        }
    }
    cr_assert_fail("tlmd (%s) did not start; see %s", bin, d->log);
}

/* Starts tlmd with d's weights (extra: NULL-terminated extra arguments, or NULL). */
static inline void start(tlmd *d, const char *const *extra)
{
    start_with(d, NULL, true, extra, NULL);
}

/* Sends sig and waits (up to limit_s) for the exit; returns the wait status, -1 on timeout. */
static inline int stop_with(tlmd *d, int sig, double limit_s)
{
    if (!d->pid) return -1;
    kill(d->pid, sig);
    double t0 = tlm_now_s();
    int st = -1;
    while (tlm_now_s() - t0 < limit_s) {
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            return st;
        }
        usleep(20000);
    }
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
    return -1;
}

static inline void teardown(tlmd *d)
{
    if (d->pid) {
        int st = stop_with(d, SIGTERM, 60);
        cr_expect(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                  "tlmd did not exit cleanly (status %d); see %s", st, d->log);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
    if (system(cmd)) {
    }
}

/* ---- its log ---- */

/* The id of the last job whose job_start line in d's log contains match (NULL: any job), in
 * id; "" and false while none has started. Ids are "j<n>-<run>", unique across restarts: the
 * log is where a test learns the one to cancel or look up. */
static inline bool logged_job_id(const tlmd *d, const char *match, char id[64])
{
    static const char tag[] = "msg=job_start job=";
    id[0] = 0;
    FILE *f = fopen(d->log, "r");
    cr_assert(f, "%s", d->log);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, tag);
        if (p && (!match || strstr(line, match))) sscanf(p + strlen(tag), "%63s", id);
    }
    fclose(f);
    return id[0] != 0;
}

#endif
