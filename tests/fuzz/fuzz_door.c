/* fuzz_door.c — libFuzzer: bytes as a client sends them, through tlmd's whole HTTP layer as
 * tlmd runs it: the front door (daemon/http.c: accept, the RFC 9112 head checks, body framing
 * and chunk re-framing, the socketpair hand-over, timeouts, the JSON errors) in front of
 * libmicrohttpd, both driven by a libuv loop, on a real loopback listener. The handlers behind
 * them answer as the routes do: JSON at once, an error, an NDJSON stream, or later after a
 * suspend (the path every compile takes). Each input is one connection: the bytes are sent,
 * the client shuts its write side, and the loop runs until the server closes the connection
 * (or a bounded number of turns, then the client closes it and the server must let go).
 * Crashes, leaks (ASan), undefined behaviour and hangs are findings; so is a connection the
 * server never lets go (checked with the door's and MHD's connection counts).
 *
 * Complements fuzz_http_head (the head parser alone, fastest) and fuzz_mhd (MHD alone). */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "daemon/tlmd.h"

/* What http.c and metrics.c take from the rest of tlmd: a quiet log, the clocks, the routes'
 * labels (three: the harness's routes and "unknown"). */
void tlmd_log(int level, const char *event, const char *fmt, ...) {}
double tlmd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
double tlmd_wall(void)
{
    return tlmd_now();
}
static const char *const labels[] = {"/a", "/b", "unknown"};
int routes_label_count(void)
{
    return 3;
}
int routes_label_of(const char *target, size_t len)
{
    return len >= 2 && target[1] == 'a' ? 0 : len >= 2 && target[1] == 'b' ? 1 : 2;
}
const char *const *routes_labels(void)
{
    return labels;
}

static tlmd_env env;
static http_server *srv;
static metrics *mx;
static int port;

/* requests suspended until the next turn of the harness (the compile path: answered later) */
#define MAX_WAITING 64
static http_req *waiting[MAX_WAITING];
static int n_waiting;

static void unwait(http_req *r)
{
    for (int i = 0; i < n_waiting; i++)
        if (waiting[i] == r) waiting[i] = waiting[--n_waiting];
    r->op = NULL;
    r->detach = NULL;
}

static void on_begin(void *arg, http_req *r)
{
    if (r->url && !strncmp(r->url, "/a/pend", 7))
        r->pending_status = 415; /* decided from the head, answered after the body */
}

static void on_dispatch(void *arg, http_req *r)
{
    const char *u = r->url ? r->url : "";
    if (r->pending_status) {
        http_reply_error(r, r->pending_status, "unsupported_media_type", "pending", "");
    } else if (!strncmp(u, "/a/stream", 9)) {
        http_stream_start(r);
        for (size_t i = 0; i < 3; i++)
            http_stream_line(r, json_pack("{s:i, s:I}", "event", (int)i, "len", (json_int_t)r->len));
        http_stream_end(r);
    } else if (!strncmp(u, "/a/later", 8) && n_waiting < MAX_WAITING) {
        http_suspend(r);
        r->op = r;
        r->detach = unwait;
        waiting[n_waiting++] = r;
    } else if (!strncmp(u, "/b", 2)) {
        http_reply_error(r, 404, "not_found", "no such thing", "key");
    } else {
        http_reply_json(r, 200, json_pack("{s:I, s:s}", "len", (json_int_t)r->len, "method",
                                          r->method));
    }
}

static void answer_waiting(void)
{
    while (n_waiting) {
        http_req *r = waiting[--n_waiting];
        r->op = NULL;
        r->detach = NULL;
        http_reply_json(r, 200, json_pack("{s:b}", "later", 1));
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    env.loop = uv_default_loop();
    tlmd_config *c = &env.cfg;
    snprintf(c->listen_addr, sizeof c->listen_addr, "127.0.0.1");
    c->port = 0;
    c->max_body = 65536;
    c->max_connections = 256;
    c->max_connections_per_ip = 256;
    c->header_timeout_s = 2;
    c->body_timeout_s = 2;
    c->idle_timeout_s = 2;
    mx = metrics_new(labels, 3);
    srv = http_new(&env, mx);
    http_handlers hd = {on_begin, on_dispatch, NULL};
    tlm_error e;
    if (!mx || !srv || http_start(srv, &hd, &e)) {
        fprintf(stderr, "fuzz_door: cannot start the HTTP layer: %s\n", srv ? e.msg : "oom");
        abort();
    }
    port = http_port(srv);
    return 0;
}

/* Runs the loop until the server holds no connection, at most `turns` times. */
static bool settle(int turns)
{
    for (int i = 0; i < turns; i++) {
        answer_waiting();
        uv_run(env.loop, UV_RUN_NOWAIT);
        if (!http_client_connections(srv) && !http_connections(srv) && !n_waiting) return true;
        if (i > 50) usleep(100);
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536) return 0;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    int big = 1 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) && errno != EINPROGRESS) {
        close(fd);
        return 0;
    }
    size_t off = 0;
    bool shut = false, closed_by_server = false;
    char sink[65536];
    int quiet = 0; /* turns since the last byte came back, after the input was all sent */
    for (int i = 0; i < 4000 && !closed_by_server && quiet < 40; i++) {
        if (off < size) {
            ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
            if (w > 0) off += (size_t)w;
            if (w < 0 && errno != EAGAIN && errno != ENOTCONN) break;
        } else if (!shut) {
            shutdown(fd, SHUT_WR);
            shut = true;
        }
        answer_waiting();
        uv_run(env.loop, UV_RUN_NOWAIT);
        bool got = false;
        for (;;) {
            ssize_t r = recv(fd, sink, sizeof sink, 0);
            if (r > 0) {
                got = true;
                continue;
            }
            if (r == 0 || (errno != EAGAIN && errno != EINTR)) closed_by_server = true;
            break;
        }
        quiet = shut && !got && !n_waiting ? quiet + 1 : 0;
        if (i > 200) usleep(200); /* a slow answer: let the loop's timers come due */
    }
    close(fd);
    /* whatever state the connection was in, the server lets go of it */
    if (!settle(20000)) {
        fprintf(stderr, "fuzz_door: the server still holds %u client / %u MHD connections\n",
                http_client_connections(srv), http_connections(srv));
        abort();
    }
    return 0;
}
