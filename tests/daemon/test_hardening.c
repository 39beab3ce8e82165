/* test_hardening.c — what a hostile or overloaded network does to tlmd (issue 15), against the
 * real daemon on loopback: slow and surplus connections, request framing (Content-Length,
 * Transfer-Encoding, RFC 9112), errors produced below the routes, an encoded NUL in a path,
 * half-closed clients, the budget, cancel on disconnect, job ids across restarts, and cache
 * hits while the compile pool is busy. Raw requests go through plain sockets (curl would fix
 * the framing for us); source addresses 127.0.x.y stand for distinct clients. Every wait is
 * bounded and no assertion depends on how fast the machine is. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "tests/common/tlmd_harness.h"

/* ---- raw connections ---- */

/* A connection to the daemon from source address src (NULL: 127.0.0.1); -1 on failure. */
static int dial(const tlmd *d, const char *src)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET};
    if (src) {
        inet_pton(AF_INET, src, &a.sin_addr);
        if (bind(s, (struct sockaddr *)&a, sizeof a)) {
            close(s);
            return -1;
        }
    }
    a.sin_port = htons((uint16_t)d->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof a)) {
        close(s);
        return -1;
    }
    return s;
}

static void send_all(int s, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = send(s, c, n, MSG_NOSIGNAL);
        if (w <= 0) return; /* the server may already have answered and closed */
        c += w;
        n -= (size_t)w;
    }
}

/* Everything the server sends until it closes or limit_s passes (malloc'ed, NUL-terminated). */
static char *read_all(int s, double limit_s)
{
    size_t n = 0, cap = 4096;
    char *b = malloc(cap);
    double t0 = tlm_now_s();
    for (;;) {
        double left = limit_s - (tlm_now_s() - t0);
        if (left <= 0) break;
        struct pollfd pf = {s, POLLIN, 0};
        if (poll(&pf, 1, (int)(left * 1000) + 1) <= 0) break;
        if (n + 4096 > cap) b = realloc(b, cap *= 2);
        ssize_t r = recv(s, b + n, 4096, 0);
        if (r <= 0) break;
        n += (size_t)r;
    }
    b[n] = 0;
    return b;
}

/* One raw request on a new connection; the whole answer (the server closes, or 60 s). */
static char *raw(const tlmd *d, const char *req, size_t len)
{
    int s = dial(d, NULL);
    cr_assert(s >= 0);
    send_all(s, req, len);
    char *out = read_all(s, 60);
    close(s);
    return out;
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* The answer holds exactly one response with this status and a JSON error with this code. */
static void expect_one_json_error(const char *out, int status, const char *code)
{
    char line[32];
    snprintf(line, sizeof line, "HTTP/1.1 %d ", status);
    cr_assert(!strncmp(out, line, strlen(line)), "want %d, got: %.300s", status, out);
    cr_assert_eq(count(out, "\nHTTP/1."), 0, "more than one status line: %.600s", out);
    cr_assert(strstr(out, "Content-Type: application/json"), "%.400s", out);
    const char *body = strstr(out, "\r\n\r\n");
    cr_assert(body);
    json_error_t e;
    json_t *j = json_loads(body + 4, 0, &e);
    cr_assert(j, "not JSON: %.300s", body + 4);
    json_t *err = json_object_get(j, "error");
    cr_assert_str_eq(json_string_value(json_object_get(err, "code")), code, "%s", body + 4);
    cr_assert(json_is_string(json_object_get(err, "message")));
    cr_assert(json_is_string(json_object_get(err, "field")));
    json_decref(j);
}

static void start_conf(tlmd *d, const char *text, const char *const *env)
{
    char conf[400];
    snprintf(conf, sizeof conf, "%s/tlmd.conf", d->dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    const char *extra[] = {"--config", conf, NULL};
    start_with(d, NULL, true, extra, env);
}

static const char small[] =
    "{\"target\":\"cpu\",\"workloads\":[{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8}}]}";

/* ---- 1. slowloris, connection limits, CLOSE-WAIT ---- */

#define SLOW 2000

Test(hardening, slow_connections_do_not_block_requests)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < SLOW + 512)
        cr_skip_test("the open-file hard limit (%lu) is below %d", (unsigned long)rl.rlim_max,
                     SLOW + 512);
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? SLOW + 1024 : rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    tlmd d;
    setup_dir(&d);
    /* a long header timeout: the slow connections stay while normal requests are made */
    start_conf(&d, "header_timeout_s = 120\nmax_connections_per_ip = 100\n", NULL);
    static int slow[SLOW];
    for (int i = 0; i < SLOW; i++) {
        char src[32];
        snprintf(src, sizeof src, "127.0.1.%d", 2 + i / 100); /* 20 clients x 100 */
        slow[i] = dial(&d, src);
        cr_assert(slow[i] >= 0, "connection %d: %s", i, strerror(errno));
        send_all(slow[i], "GET /healthz HTTP/1.1\r\nHo", 25);
    }
    double t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 60 && metric(&d, "tlmd_http_connections{stage=\"head\"}") < SLOW)
        usleep(50000);
    cr_assert_eq(metric(&d, "tlmd_http_connections{stage=\"head\"}"), SLOW,
                 "the server holds every slow connection");
    /* normal requests are served meanwhile */
    cr_assert(healthy(&d));
    resp r = post(&d, small);
    cr_assert_eq(r.status, 200, "%ld %s %s", r.status, r.err, r.body.p);
    resp_free(&r);
    /* a 101st connection from one of the slow clients is refused with a JSON 503 */
    int extra = dial(&d, "127.0.1.2");
    cr_assert(extra >= 0);
    char *out = read_all(extra, 30);
    expect_one_json_error(out, 503, "unavailable");
    free(out);
    close(extra);
    cr_assert_geq(metric(&d, "tlmd_http_connections_refused_total"), 1);
    /* the slow clients leave: no connection lingers (CLOSE-WAIT) */
    for (int i = 0; i < SLOW; i++)
        close(slow[i]);
    t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 30 && metric(&d, "tlmd_http_connections{stage=\"head\"}") > 0)
        usleep(50000);
    cr_assert_eq(metric(&d, "tlmd_http_connections{stage=\"head\"}"), 0);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(hardening, slow_head_and_slow_body_get_408)
{
    tlmd d;
    setup_dir(&d);
    start_conf(&d, "header_timeout_s = 1\nbody_timeout_s = 1\n", NULL);
    /* a head that never completes */
    int s = dial(&d, NULL);
    send_all(s, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1", 40);
    char *out = read_all(s, 60);
    expect_one_json_error(out, 408, "request_timeout");
    free(out);
    close(s);
    /* a body that trickles: 408 at the deadline (without it the server would wait for the
     * other 90 bytes) */
    s = dial(&d, NULL);
    const char head[] = "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: 100\r\n\r\n{\"target\"";
    send_all(s, head, sizeof head - 1);
    usleep(1500000);
    send_all(s, ":\"cpu\"", 6);
    double t0 = tlm_now_s();
    out = read_all(s, 100);
    expect_one_json_error(out, 408, "request_timeout");
    cr_assert_lt(tlm_now_s() - t0, 90, "the connection was not closed");
    free(out);
    close(s);
    cr_assert_geq(metric(&d, "tlmd_http_requests_total{route=\"/v1/compile\",code=\"408\"}"), 1);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(hardening, connection_limit_from_rlimit_and_config)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    /* sized from the open-file limit, which tlmd raises to the hard limit */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    /* three descriptors a connection: the client's and the socketpair to libmicrohttpd */
    long want = ((rl.rlim_max == RLIM_INFINITY ? 1048576 : (long)rl.rlim_max) - 256) / 3;
    if (want > 1000000) want = 1000000;
    FILE *f = fopen(d.log, "r");
    cr_assert(f);
    char line[1024];
    long got = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "msg=http_limits max_connections=");
        if (p) got = strtol(p + strlen("msg=http_limits max_connections="), NULL, 10);
    }
    fclose(f);
    cr_assert_eq(got, want, "max_connections %ld, want (hard RLIMIT_NOFILE - 256) / 3 = %ld", got,
                 want);
    teardown(&d);
    /* an explicit limit: connections over it are refused with 503 */
    setup_dir(&d);
    start_conf(&d, "max_connections = 20\n", NULL);
    int s[30];
    for (int i = 0; i < 30; i++) {
        char src[32];
        snprintf(src, sizeof src, "127.0.3.%d", 2 + i); /* not the per-address limit */
        s[i] = dial(&d, src);
        cr_assert(s[i] >= 0);
    }
    int refused = 0;
    for (int i = 0; i < 30; i++) {
        char *out = read_all(s[i], 0.5);
        refused += !strncmp(out, "HTTP/1.1 503 ", 13) && strstr(out, "\"unavailable\"");
        free(out);
        close(s[i]);
    }
    cr_assert_geq(refused, 9, "%d of 30 refused over a limit of 20", refused);
    teardown(&d);
}

/* ---- 3. framing: one JSON 400, on a first request and on a kept-alive one ---- */

Test(hardening, bad_framing_gets_one_json_400)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    static const char *const bad_cl[] = {"-1", "abc", "99999999999999999999", "1 2", "+5"};
    for (int i = 0; i < 5; i++) {
        char req[512];
        int n =
            snprintf(req, sizeof req,
                     "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     "Content-Length: %s\r\n\r\n%s",
                     bad_cl[i], small);
        char *out = raw(&d, req, (size_t)n);
        expect_one_json_error(out, 400, "bad_request");
        free(out);
    }
    char req[1024];
    /* Transfer-Encoding and Content-Length together */
    int n =
        snprintf(req, sizeof req,
                 "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\nContent-Length: %zu\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                 strlen(small), strlen(small), small);
    char *out = raw(&d, req, (size_t)n);
    expect_one_json_error(out, 400, "bad_request");
    free(out);
    /* two different Content-Lengths */
    n = snprintf(req, sizeof req,
                 "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\nContent-Length: 5\r\n\r\n%s",
                 strlen(small), small);
    out = raw(&d, req, (size_t)n);
    expect_one_json_error(out, 400, "bad_request");
    free(out);
    /* the same after a good request on a kept-alive connection */
    int s = dial(&d, NULL);
    const char ok[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    send_all(s, ok, sizeof ok - 1);
    char first[2048];
    ssize_t got = recv(s, first, sizeof first - 1, 0);
    cr_assert(got > 0 && !strncmp(first, "HTTP/1.1 200 ", 13));
    n = snprintf(req, sizeof req,
                 "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n%zx\r\n%s\r\n0\r\n\r\n",
                 strlen(small), small);
    send_all(s, req, (size_t)n);
    out = read_all(s, 60);
    expect_one_json_error(out, 400, "bad_request");
    free(out);
    close(s);
    cr_assert(healthy(&d));
    teardown(&d);
}

/* ---- 6. errors below the routes are JSON ---- */

Test(hardening, errors_below_the_routes_are_json)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    static char big[70000];
    struct {
        const char *what, *req;
        int status;
        const char *code;
    } cases[] = {
        {"HTTP/3.1", "GET /healthz HTTP/3.1\r\nHost: x\r\n\r\n", 505, "http_version"},
        {"HTTP/1.1 without Host", "GET /healthz HTTP/1.1\r\n\r\n", 400, "bad_request"},
        {"no version", "GET /healthz\r\nHost: x\r\n\r\n", 400, "bad_request"},
        {"space in a header name", "GET /healthz HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n", 400,
         "bad_request"},
        {"obsolete line folding", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n  2\r\n\r\n", 400,
         "bad_request"},
        {"gzip transfer coding",
         "POST /v1/compile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400,
         "bad_request"},
        {"long target", NULL, 414, "uri_too_long"},
        {"long head", NULL, 431, "headers_too_large"},
        {"many fields", NULL, 431, "headers_too_large"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *req = cases[i].req;
        if (!req) {
            int n = 0;
            if (cases[i].status == 414) {
                n = snprintf(big, sizeof big, "GET /healthz?");
                memset(big + n, 'a', 10000);
                n += 10000;
                n += snprintf(big + n, sizeof big - (size_t)n, " HTTP/1.1\r\nHost: x\r\n\r\n");
            } else if (!strcmp(cases[i].what, "long head")) {
                n = snprintf(big, sizeof big, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ");
                memset(big + n, 'b', 40000);
                n += 40000;
                n += snprintf(big + n, sizeof big - (size_t)n, "\r\n\r\n");
            } else {
                n = snprintf(big, sizeof big, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
                for (int k = 0; k < 200; k++)
                    n += snprintf(big + n, sizeof big - (size_t)n, "X-%d: v\r\n", k);
                n += snprintf(big + n, sizeof big - (size_t)n, "\r\n");
            }
            req = big;
        }
        char *out = raw(&d, req, strlen(req));
        cr_assert(out[0], "%s: no answer", cases[i].what);
        expect_one_json_error(out, cases[i].status, cases[i].code);
        free(out);
    }
    cr_assert(healthy(&d));
    teardown(&d);
}

/* ---- 6b. every request of a kept-alive connection gets JSON errors ---- */

/* The responses in out, one after another: whether the first n_ok are 200 and the one after
 * them is exactly one JSON error (status, code), the last thing before the server closed. */
static void expect_ok_then_error(const char *what, const char *out, int n_ok, int status,
                                 const char *code)
{
    const char *p = out;
    for (int i = 0; i < n_ok; i++) {
        cr_assert(!strncmp(p, "HTTP/1.1 200 ", 13), "%s: answer %d is not 200: %.300s", what, i, p);
        const char *next = strstr(p + 1, "HTTP/1.1 ");
        cr_assert(next, "%s: %d answers, want %d and an error: %.600s", what, i + 1, n_ok + 1, out);
        p = next;
    }
    expect_one_json_error(p, status, code);
    cr_assert(strstr(p, "Connection: close"), "%s: %.300s", what, p);
}

Test(hardening, kept_alive_errors_are_json)
{
    tlmd d;
    setup_dir(&d);
    start_conf(&d, "max_body_bytes = 4096\nheader_timeout_s = 1\n", NULL);
    static char big[70000];
    int n = snprintf(big, sizeof big, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: ");
    memset(big + n, 'b', 40000);
    snprintf(big + n + 40000, sizeof big - (size_t)n - 40000, "\r\n\r\n");
    char chunky[8192];
    n = snprintf(chunky, sizeof chunky,
                 "POST /v1/compile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 5; i++) { /* 5 x 1000 bytes > max_body_bytes */
        n += snprintf(chunky + n, sizeof chunky - (size_t)n, "3e8\r\n");
        memset(chunky + n, ' ', 1000);
        n += 1000;
        n += snprintf(chunky + n, sizeof chunky - (size_t)n, "\r\n");
    }
    snprintf(chunky + n, sizeof chunky - (size_t)n, "0\r\n\r\n");
    struct {
        const char *what, *req;
        int status;
        const char *code;
    } cases[] = {
        {"bad Content-Length",
         "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}", 400,
         "bad_request"},
        {"two Content-Lengths",
         "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
         400, "bad_request"},
        {"oversized header", big, 431, "headers_too_large"},
        {"bad version", "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505, "http_version"},
        {"no version", "GET /healthz\r\nHost: x\r\n\r\n", 400, "bad_request"},
        {"oversized body", "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n{}",
         413, "body_too_large"},
        {"oversized chunked body", chunky, 413, "body_too_large"},
        {"bad chunk size",
         "POST /v1/compile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n"
         "0\r\n\r\n",
         400, "bad_request"},
        {"head that never ends", "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1", 408,
         "request_timeout"},
    };
    const char ok[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the bad request second, after an answered one on the same connection */
        int s = dial(&d, NULL);
        cr_assert(s >= 0);
        send_all(s, ok, sizeof ok - 1);
        char first[1024];
        ssize_t got = recv(s, first, sizeof first - 1, 0);
        cr_assert(got > 0 && !strncmp(first, "HTTP/1.1 200 ", 13), "%s", cases[i].what);
        send_all(s, cases[i].req, strlen(cases[i].req));
        char *out = read_all(s, 60);
        expect_ok_then_error(cases[i].what, out, 0, cases[i].status, cases[i].code);
        free(out);
        close(s);
        /* third, pipelined behind two good ones in one write */
        size_t len = 2 * (sizeof ok - 1) + strlen(cases[i].req);
        char *req = malloc(len + 1);
        snprintf(req, len + 1, "%s%s%s", ok, ok, cases[i].req);
        out = raw(&d, req, len);
        expect_ok_then_error(cases[i].what, out, 2, cases[i].status, cases[i].code);
        free(out);
        free(req);
    }
    /* good requests go on: a chunked body (extensions, a trailer field) between two others */
    char req[2048];
    n = snprintf(req, sizeof req,
                 "%sPOST /v1/compile HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "%zx;ext=1\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n%s",
                 ok, strlen(small), small, ok);
    int s = dial(&d, NULL);
    send_all(s, req, (size_t)n);
    shutdown(s, SHUT_WR); /* the answers still come, then the server closes */
    char *out = read_all(s, 60);
    close(s);
    cr_assert_eq(count(out, "HTTP/1.1 200 "), 3, "%.2000s", out);
    cr_assert(strstr(out, "\"kernels\""), "%.2000s", out);
    cr_assert_eq(count(out, "<html"), 0);
    free(out);
    cr_assert(healthy(&d));
    teardown(&d);
}

/* ---- 4. an encoded NUL in a path ---- */

static char *compile_key(const tlmd *d, const char *body, char key[65])
{
    resp r = post(d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *j = body_json(&r);
    json_t *k0 = json_array_get(json_object_get(j, "kernels"), 0);
    snprintf(key, 65, "%s", json_string_value(json_object_get(k0, "key")));
    char *job = strdup(json_string_value(json_object_get(j, "job")));
    json_decref(j);
    resp_free(&r);
    return job;
}

Test(hardening, nul_in_path_is_not_the_kernel)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char key[65];
    free(compile_key(&d, small, key));
    char path[200];
    snprintf(path, sizeof path, "/v1/kernels/%s/meta", key);
    resp r = get(&d, path);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    static const char *const tails[] = {"%%00x/meta", "%%00", "/meta%%00", "%%00/source"};
    for (int i = 0; i < 4; i++) {
        char fmt[64];
        snprintf(fmt, sizeof fmt, "/v1/kernels/%%s%s", tails[i]);
        snprintf(path, sizeof path, fmt, key);
        r = get(&d, path);
        cr_assert_eq(r.status, 404, "%s: %ld", path, r.status);
        json_t *j = body_json(&r);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                         "not_found");
        json_decref(j);
        resp_free(&r);
    }
    teardown(&d);
}

/* ---- 5. a chunked client that half-closes gets its answer ---- */

static void half_closed(const tlmd *d, bool stream, int c0)
{
    char body[2048];
    int n = snprintf(body, sizeof body, "{\"target\":\"cpu\",%s\"workloads\":[",
                     stream ? "\"stream\":true," : "");
    for (int i = 0; i < 3; i++)
        n += snprintf(body + n, sizeof body - (size_t)n,
                      "%s{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":%d,\"H\":10,\"W\":10,\"F\":8,"
                      "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
                      i ? "," : "", c0 + i);
    n += snprintf(body + n, sizeof body - (size_t)n, "]}");
    int s = dial(d, NULL);
    const char head[] = "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n";
    send_all(s, head, sizeof head - 1);
    for (int off = 0; off < n; off += 64) {
        int len = n - off < 64 ? n - off : 64;
        char chunk[128];
        int cl = snprintf(chunk, sizeof chunk, "%x\r\n%.*s\r\n", len, len, body + off);
        send_all(s, chunk, (size_t)cl);
        usleep(20000);
    }
    send_all(s, "0\r\n\r\n", 5);
    shutdown(s, SHUT_WR);
    char *out = read_all(s, 120);
    close(s);
    cr_assert(!strncmp(out, "HTTP/1.1 200 ", 13), "stream=%d: %.300s", stream, out);
    cr_assert_eq(count(out, "\"key\":\""), 3, "stream=%d: three kernels: %.500s", stream, out);
    if (stream) cr_assert(strstr(out, "\"event\":\"done\""));
    free(out);
}

Test(hardening, half_closed_chunked_client_gets_answer)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    half_closed(&d, false, 5);
    half_closed(&d, true, 9);
    teardown(&d);
}

/* A client that shuts its side down in the middle of a request can never finish it: it gets
 * one JSON 400 (after the answers to its whole requests) at once, not a 408 after
 * body_timeout_s, and MHD lets go of the connection (0.9.75 held it until idle_timeout_s when
 * it saw only the end of the stream mid-body; fuzz_door found it). */
Test(hardening, half_closed_mid_request_gets_400_and_is_let_go)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    double mhd0 = metric(&d, "tlmd_http_connections{stage=\"mhd\"}");
    static const char *const cases[] = {
        /* a body shorter than its Content-Length */
        "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 12\r\n\r\n{\"a",
        /* no body at all */
        "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 12\r\n\r\n",
        /* a chunk cut short */
        "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n10\r\n{\"ta",
        /* a whole request, then half of the next head */
        "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/vers",
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int s = dial(&d, NULL);
        cr_assert(s >= 0);
        send_all(s, cases[i], strlen(cases[i]));
        shutdown(s, SHUT_WR);
        char *out = read_all(s, 20); /* a 408 would come only after body_timeout_s (60 s) */
        close(s);
        const char *last = out;
        if (i == 3) { /* the whole request's answer first */
            cr_assert(!strncmp(out, "HTTP/1.1 200 ", 13), "%.300s", out);
            last = strstr(out + 1, "HTTP/1.1 ");
            cr_assert(last, "no answer after the whole request's: %.600s", out);
        }
        expect_one_json_error(last, 400, "bad_request");
        cr_assert(strstr(last, "before the request was complete"), "%.400s", last);
        free(out);
    }
    /* MHD let go of every one of them (idle_timeout_s is 30 s; 10 s is plenty) */
    double t0 = tlm_now_s(), mhd = 0;
    while ((mhd = metric(&d, "tlmd_http_connections{stage=\"mhd\"}")) > mhd0 &&
           tlm_now_s() - t0 < 10)
        usleep(50000);
    cr_assert_leq(mhd, mhd0, "MHD still holds %g connections (was %g)", mhd, mhd0);
    cr_assert(healthy(&d));
    teardown(&d);
}

/* ---- 7. the budget ---- */

Test(hardening, budget_is_validated)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    static const struct {
        const char *budget, *field;
    } cases[] = {
        {"{\"seconds\":-5,\"trials\":\"x\",\"evil\":[1]}", NULL}, /* any of the three */
        {"{\"seconds\":-5}", "budget.seconds"},
        {"{\"seconds\":\"10\"}", "budget.seconds"},
        {"{\"trials\":\"x\"}", "budget.trials"},
        {"{\"trials\":2.5}", "budget.trials"},
        {"{\"trials\":0}", "budget.trials"},
        {"{\"evil\":[1]}", "budget"},
        {"[1]", "budget"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"target\":\"cpu\",\"budget\":%s,\"workloads\":[{\"op\":\"dense\",\"shape\":"
                 "{\"M\":8,\"N\":8,\"K\":8}}]}",
                 cases[i].budget);
        resp r = post(&d, body);
        cr_assert_eq(r.status, 400, "%s: %ld %s", cases[i].budget, r.status, r.body.p);
        json_t *j = body_json(&r);
        json_t *e = json_object_get(j, "error");
        const char *field = json_string_value(json_object_get(e, "field"));
        cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "invalid_field");
        if (cases[i].field)
            cr_assert_str_eq(field, cases[i].field, "%s", cases[i].budget);
        else
            cr_assert(!strncmp(field, "budget", 6), "%s", field);
        json_decref(j);
        resp_free(&r);
    }
    teardown(&d);
}

/* ---- 8. cancel on disconnect; job ids across restarts ---- */

static const char *conv_fmt =
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":%d,\"H\":12,\"W\":12,\"F\":16,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1]}";

typedef struct {
    const tlmd *d;
    const char *body;
    long status;
    char key[65];
} poster;

static void *post_thread(void *arg)
{
    poster *p = arg;
    resp r = post(p->d, p->body);
    p->status = r.status;
    json_t *j = r.status == 200 ? json_loads(r.body.p, 0, NULL) : NULL;
    json_t *k0 = json_array_get(json_object_get(j, "kernels"), 0);
    if (k0) snprintf(p->key, sizeof p->key, "%s", json_string_value(json_object_get(k0, "key")));
    json_decref(j);
    resp_free(&r);
    return NULL;
}

Test(hardening, stream_disconnect_cancels_job_unless_shared)
{
    tlmd d;
    setup_dir(&d);
    start_conf(&d, "compile_workers = 1\n", NULL);
    enum { N = 8 };
    char body[4096];
    int n = snprintf(body, sizeof body, "{\"target\":\"cpu\",\"stream\":true,\"workloads\":[");
    for (int i = 0; i < N; i++) {
        n += snprintf(body + n, sizeof body - (size_t)n, "%s", i ? "," : "");
        n += snprintf(body + n, sizeof body - (size_t)n, conv_fmt, 20 + i);
    }
    n += snprintf(body + n, sizeof body - (size_t)n, "]}");
    int s = dial(&d, NULL);
    char req[5000];
    int rn = snprintf(req, sizeof req,
                      "POST /v1/compile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\n\r\n%s",
                      n, body);
    send_all(s, req, (size_t)rn);
    /* the accepted event names the job */
    char got[8192] = "";
    size_t gl = 0;
    double t0 = tlm_now_s();
    while (!strstr(got, "\"accepted\"") && tlm_now_s() - t0 < 60 && gl < sizeof got - 1) {
        struct pollfd pf = {s, POLLIN, 0};
        if (poll(&pf, 1, 1000) <= 0) continue;
        ssize_t r = recv(s, got + gl, sizeof got - 1 - gl, 0);
        if (r <= 0) break;
        gl += (size_t)r;
        got[gl] = 0;
    }
    const char *jp = strstr(got, "\"job\":\"");
    cr_assert(jp, "no accepted event: %s", got);
    char id[64];
    snprintf(id, sizeof id, "%.*s", (int)strcspn(jp + 7, "\""), jp + 7);
    /* another client wants the last kernel too: it joins that flight */
    char other[512] = "{\"target\":\"cpu\",\"workloads\":[";
    snprintf(other + strlen(other), sizeof other - strlen(other), conv_fmt, 20 + N - 1);
    strcat(other, "]}");
    poster p = {&d, other, 0, ""};
    pthread_t th;
    pthread_create(&th, NULL, post_thread, &p);
    t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 60 && metric(&d, "tlmd_single_flight_joins_total") < 1)
        usleep(20000);
    cr_assert_geq(metric(&d, "tlmd_single_flight_joins_total"), 1);
    close(s); /* the streaming client goes away */
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", id);
    const char *state = NULL;
    json_t *j = NULL;
    t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 60) {
        resp r = get(&d, path);
        cr_assert_eq(r.status, 200, "%s", r.body.p);
        json_decref(j);
        j = body_json(&r);
        resp_free(&r);
        state = json_string_value(json_object_get(j, "state"));
        if (strcmp(state, "running")) break;
        usleep(50000);
    }
    cr_assert_str_eq(state, "cancelled");
    json_decref(j);
    /* the shared flight went on: the other client has its kernel */
    pthread_join(th, NULL);
    cr_assert_eq(p.status, 200);
    cr_assert_eq(strlen(p.key), 64);
    /* the flights nobody waits for were skipped: fewer than N compiles in all */
    t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 120 && metric(&d, "tlmd_flights_in_flight") > 0)
        usleep(50000);
    cr_assert_eq(metric(&d, "tlmd_flights_in_flight"), 0);
    cr_assert_lt(metric(&d, "tlmd_compiles_total"), N);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(hardening, job_ids_unique_across_restarts)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char key[65];
    char *a = compile_key(&d, small, key);
    char *b = compile_key(&d, small, key);
    cr_assert_str_neq(a, b);
    cr_assert_eq(stop_with(&d, SIGTERM, 60) >= 0, 1);
    start(&d, NULL);
    char *c = compile_key(&d, small, key);
    cr_assert_str_neq(a, c, "a restarted server reuses job id %s", a);
    cr_assert_str_neq(b, c);
    char path[128];
    snprintf(path, sizeof path, "/v1/jobs/%s", c);
    resp r = get(&d, path);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    snprintf(path, sizeof path, "/v1/jobs/%s", a);
    r = get(&d, path);
    cr_assert_eq(r.status, 404, "the old run's job is not this run's");
    resp_free(&r);
    free(a);
    free(b);
    free(c);
    teardown(&d);
}

/* A daemon killed mid-compile leaves its working directory in $TMPDIR; the next one to start
 * there removes it once its process is gone, and leaves a live process's and a recent one. */
Test(hardening, start_sweeps_compile_directories_of_dead_processes)
{
    tlmd d;
    setup_dir(&d);
    pid_t gone = fork();
    cr_assert_geq(gone, 0);
    if (gone == 0) _exit(0);
    cr_assert_eq(waitpid(gone, NULL, 0), gone);
    char tmp[600], orphan[700], live[700], young[700], file[800], env[640];
    snprintf(tmp, sizeof tmp, "%s/tmp", d.dir);
    cr_assert_eq(mkdir(tmp, 0700), 0);
    snprintf(orphan, sizeof orphan, "%s/tlm-cc-%ld-Orph4n", tmp, (long)gone);
    snprintf(live, sizeof live, "%s/tlm-drv-%ld-L1veXx", tmp, (long)getpid());
    snprintf(young, sizeof young, "%s/tlm-cc-%ld-Y0ungX", tmp, (long)gone);
    const char *dirs[] = {orphan, live, young};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(mkdir(dirs[i], 0700), 0);
        snprintf(file, sizeof file, "%s/kernel.c", dirs[i]);
        FILE *f = fopen(file, "w");
        cr_assert_not_null(f);
        fputs("int x;\n", f);
        fclose(f);
        time_t at = time(NULL) - (i == 2 ? 5 : 3600);
        struct timespec ts[2] = {{.tv_sec = at}, {.tv_sec = at}};
        cr_assert_eq(utimensat(AT_FDCWD, dirs[i], ts, 0), 0);
    }
    snprintf(env, sizeof env, "TMPDIR=%s", tmp);
    const char *envs[] = {env, NULL};
    start_with(&d, NULL, true, NULL, envs);
    struct stat st;
    cr_expect(stat(orphan, &st) != 0, "%s is still there", orphan);
    cr_expect_eq(stat(live, &st), 0, "a live process's directory went");
    cr_expect_eq(stat(young, &st), 0, "a recent directory went");
    FILE *lf = fopen(d.log, "r");
    cr_assert_not_null(lf);
    char line[4096];
    bool swept = false;
    while (fgets(line, sizeof line, lf))
        swept |= strstr(line, "swept=1") != NULL;
    fclose(lf);
    cr_expect(swept, "no sweep in %s", d.log);
    teardown(&d);
}

/* ---- 2. hits and reads while the compile pool is busy ---- */

Test(hardening, hits_do_not_wait_for_compiles)
{
    tlmd d;
    setup_dir(&d);
    /* one thread in each pool: a read that queued behind a compile would wait for it */
    const char *env[] = {"UV_THREADPOOL_SIZE=1", NULL};
    start_conf(&d, "compile_workers = 1\nserve_untrained = true\ngrace_s = 1\n", env);
    char key[65];
    free(compile_key(&d, small, key));
    double compiles0 = metric(&d, "tlmd_compiles_total");
    /* a long job: 8 measured candidates for each of 2 convolutions, one at a time */
    char body[2048];
    int n = snprintf(body, sizeof body,
                     "{\"target\":\"cpu\",\"mode\":\"topk\",\"candidates\":8,\"workloads\":[");
    for (int i = 0; i < 2; i++) {
        n += snprintf(body + n, sizeof body - (size_t)n, "%s", i ? "," : "");
        n += snprintf(body + n, sizeof body - (size_t)n, conv_fmt, 40 + i);
    }
    snprintf(body + n, sizeof body - (size_t)n, "]}");
    poster p = {&d, body, 0, ""};
    pthread_t th;
    pthread_create(&th, NULL, post_thread, &p);
    double t0 = tlm_now_s();
    while (tlm_now_s() - t0 < 60 && metric(&d, "tlmd_flights_in_flight") < 2)
        usleep(10000);
    cr_assert_eq(metric(&d, "tlmd_flights_in_flight"), 2);
    /* reads, stats and a cache hit are answered before the first compile is done */
    char path[128];
    snprintf(path, sizeof path, "/v1/kernels/%s", key);
    resp r = get(&d, path);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    r = get(&d, "/v1/cache/stats");
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    r = post(&d, small);
    cr_assert_eq(r.status, 200);
    cr_assert(strstr(r.body.p, "\"cache\":\"hit\""), "%s", r.body.p);
    resp_free(&r);
    cr_assert_eq(metric(&d, "tlmd_compiles_total"), compiles0,
                 "a read waited for a compile to finish");
    cr_assert_eq(metric(&d, "tlmd_jobs_in_flight"), 1);
    /* the long job need not finish: shutdown answers it (503) after a 1 s grace */
    teardown(&d);
    pthread_join(th, NULL);
    cr_assert(p.status == 200 || p.status == 503, "%ld", p.status);
}
