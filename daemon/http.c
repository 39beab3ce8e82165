/* http.c — libmicrohttpd driven by the libuv loop (DESIGN §9): MHD runs with MHD_USE_EPOLL |
 * MHD_ALLOW_SUSPEND_RESUME and no thread of its own; a uv_poll_t watches MHD's epoll fd,
 * MHD_run follows every wake-up and a uv_timer is re-armed from MHD_get_timeout after every
 * run. Requests that wait for work are suspended and resumed by http_reply_* (then MHD runs
 * once more: 0.9.75 needs that explicit run after a resume). NDJSON streams use a content
 * reader that suspends its connection whenever it has nothing to send.
 *
 * The front door: tlmd accepts connections itself (MHD runs with MHD_USE_NO_LISTEN_SOCKET).
 * A new connection waits in the door until its first request head is complete: the head is
 * read with MSG_PEEK (edge-triggered, so a trickle costs one wake-up per segment), checked
 * against RFC 9112 (request line, version, header syntax, Content-Length, Transfer-Encoding,
 * Host, sizes) and then handed to MHD with MHD_add_connection, which reads the same bytes
 * again. A bad head gets a JSON error (400, 414, 431, 505) and the connection is closed; a
 * head that does not arrive within header_timeout_s gets 408 (slowloris), a body still
 * arriving after body_timeout_s is cut off (the connection closed); more connections
 * than max_connections (sized from RLIMIT_NOFILE) or max_connections_per_ip are refused
 * with 503. MHD's own error pages (HTML) are therefore never the answer to a first request;
 * later requests on a kept-alive connection are parsed by MHD alone, and their framing
 * (duplicate Content-Length, Transfer-Encoding with Content-Length) is checked again when
 * their headers reach on_request. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "daemon/tlmd.h"
#include "proto/error.h"

#define DOOR_LINGER_S 2.0 /* an answered connection is read and dropped for this long */

/* A connection in the front door: not yet MHD's. */
typedef struct door_conn {
    int fd;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    double deadline;
    bool closing; /* answered: the rest is read and dropped until EOF or the deadline */
    struct door_conn *prev, *next;
} door_conn;

struct http_server {
    const tlmd_env *env;
    metrics *m;
    http_handlers hd;
    struct MHD_Daemon *mhd;
    int listen_fd_activated; /* from systemd, -1 if none */
    int listen_fd;
    int port;
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    bool in_mhd, need_kick;
    http_req *reqs; /* live requests (to resume them all at shutdown) */
    /* the front door */
    int door_epfd;
    uv_poll_t listen_poll, door_poll;
    uv_timer_t door_timer;
    bool door_open; /* accepting */
    door_conn *door;
    int n_door;
    int max_conns;
    uint64_t refused; /* connections refused over a limit */
};

static void mhd_rearm(http_server *h);

static void run_mhd(http_server *h)
{
    if (!h->mhd) return;
    h->in_mhd = true;
    do {
        h->need_kick = false;
        MHD_run(h->mhd);
    } while (h->need_kick && h->mhd);
    h->in_mhd = false;
    mhd_rearm(h);
}

void http_kick(http_server *h)
{
    if (h->in_mhd) {
        h->need_kick = true; /* inside an MHD callback: run again when it returns */
        return;
    }
    run_mhd(h);
}

static void on_mhd_timer(uv_timer_t *t)
{
    run_mhd(t->data);
}
static void on_mhd_poll(uv_poll_t *p, int status, int events)
{
    run_mhd(p->data);
}

static void mhd_rearm(http_server *h)
{
    if (!h->mhd) return;
    MHD_UNSIGNED_LONG_LONG to = 0;
    if (MHD_get_timeout(h->mhd, &to) == MHD_YES)
        uv_timer_start(&h->mhd_timer, on_mhd_timer, to, 0);
    else
        uv_timer_stop(&h->mhd_timer);
}

/* ---- responses ---- */

static void set_response(http_req *r, int status, struct MHD_Response *resp)
{
    if (r->resp) MHD_destroy_response(r->resp);
    r->resp = resp;
    r->status = status;
    if (r->suspended) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
        http_kick(r->srv);
    }
}

void http_reply(http_req *r, int status, const char *ctype, const void *data, size_t len,
                const char *const *headers)
{
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return; /* out of memory: MHD closes the connection */
    MHD_add_response_header(resp, "Content-Type", ctype);
    MHD_add_response_header(resp, "Server", "tlmd/" TLMD_VERSION);
    for (int i = 0; headers && headers[i] && headers[i + 1]; i += 2)
        MHD_add_response_header(resp, headers[i], headers[i + 1]);
    set_response(r, status, resp);
}

void http_reply_json(http_req *r, int status, json_t *body)
{
    char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!s) {
        static const char oom[] =
            "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\",\"field\":\"\"}}";
        http_reply(r, 500, "application/json", oom, sizeof oom - 1, NULL);
        return;
    }
    size_t n = strlen(s);
    s[n] = '\n'; /* replace the NUL: the body ends with a newline, curl-friendly */
    http_reply(r, status, "application/json", s, n + 1, NULL);
    free(s);
}

void http_reply_error(http_req *r, int status, const char *code, const char *msg, const char *field)
{
    http_reply_json(r, status, proto_error_body(code, msg, field));
}

void http_reply_tlm_error(http_req *r, const tlm_error *err)
{
    int status = 500;
    json_t *b = proto_error_from_tlm(err, &status);
    http_reply_json(r, status, b);
}

void http_suspend(http_req *r)
{
    if (r->suspended) return;
    r->suspended = true;
    MHD_suspend_connection(r->conn);
}

const char *http_header(http_req *r, const char *name)
{
    return MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, name);
}

/* ---- NDJSON streams ---- */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    http_req *r = cls;
    if (r->spos < r->slen) {
        size_t n = r->slen - r->spos;
        if (n > max) n = max;
        memcpy(buf, r->sbuf + r->spos, n);
        r->spos += n;
        if (r->spos == r->slen) r->spos = r->slen = 0;
        return (ssize_t)n;
    }
    if (r->stream_end) return MHD_CONTENT_READER_END_OF_STREAM;
    /* Nothing to send yet: park the connection (returning 0 alone would spin the loop). */
    r->suspended = true;
    MHD_suspend_connection(r->conn);
    return 0;
}

void http_stream_start(http_req *r)
{
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, r, NULL);
    if (!resp) return;
    MHD_add_response_header(resp, "Content-Type", "application/x-ndjson");
    MHD_add_response_header(resp, "Server", "tlmd/" TLMD_VERSION);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    r->streaming = true;
    set_response(r, 200, resp);
}

void http_stream_line(http_req *r, json_t *event)
{
    char *s = json_dumps(event, JSON_COMPACT);
    json_decref(event);
    if (!s) return;
    size_t n = strlen(s);
    if (r->slen + n + 1 > r->scap) {
        size_t cap = (r->slen + n + 1) * 2;
        char *p = realloc(r->sbuf, cap);
        if (!p) {
            free(s);
            return;
        }
        r->sbuf = p;
        r->scap = cap;
    }
    memcpy(r->sbuf + r->slen, s, n);
    r->sbuf[r->slen + n] = '\n';
    r->slen += n + 1;
    free(s);
    if (r->suspended && r->resp == NULL) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
        http_kick(r->srv);
    }
}

void http_stream_end(http_req *r)
{
    r->stream_end = true;
    if (r->suspended && r->resp == NULL) {
        r->suspended = false;
        MHD_resume_connection(r->conn);
        http_kick(r->srv);
    }
}

/* ---- the front door ---- */

static const char *reason(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 408:
        return "Request Timeout";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 431:
        return "Request Header Fields Too Large";
    case 503:
        return "Service Unavailable";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return "Error";
    }
}

static void door_unlink(http_server *h, door_conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        h->door = c->next;
    if (c->next) c->next->prev = c->prev;
    h->n_door--;
}

static void door_close(http_server *h, door_conn *c)
{
    epoll_ctl(h->door_epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    door_unlink(h, c);
    free(c);
}

/* Writes a JSON error with Connection: close (best effort: the socket is non-blocking and the
 * answer small), then lingers reading until EOF so the answer is not lost to a reset. */
static void door_answer(http_server *h, door_conn *c, int status, const char *code, const char *msg)
{
    json_t *b = proto_error_body(code, msg, "");
    char *js = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    char out[2048];
    int n =
        snprintf(out, sizeof out,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nServer: tlmd/" TLMD_VERSION
                 "\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n%s\n",
                 status, reason(status), js ? strlen(js) + 1 : 1, js ? js : "");
    free(js);
    if (n > 0) {
        ssize_t w = send(c->fd, out, (size_t)n < sizeof out ? (size_t)n : sizeof out - 1,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        (void)w;
    }
    shutdown(c->fd, SHUT_WR);
    metrics_request(h->m, routes_label_count() - 1, status);
    tlmd_log(LOG_DEBUG, "http_door", "status=%d code=%s detail=\"%s\"", status, code, msg);
    c->closing = true;
    c->deadline = tlmd_now() + DOOR_LINGER_S;
}

/* Reads and drops what an answered connection still sends; closes it at EOF. */
static void door_drain(http_server *h, door_conn *c)
{
    char buf[4096];
    for (;;) {
        ssize_t r = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r > 0) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        door_close(h, c);
        return;
    }
}

/* The head so far: complete (hand over), bad (answer), or wait for more. hup: the client
 * has shut down its side (a head that is complete still gets its answer). */
static void door_readable(http_server *h, door_conn *c, bool hup)
{
    if (c->closing) {
        door_drain(h, c);
        return;
    }
    char buf[HEAD_MAX + 1];
    ssize_t r = recv(c->fd, buf, HEAD_MAX, MSG_PEEK | MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (r <= 0) {
        door_close(h, c); /* gone before a whole head: nothing to answer */
        return;
    }
    size_t n = (size_t)r;
    buf[n] = 0;
    /* empty lines before the request line are allowed (RFC 9112 2.2) */
    size_t lead = 0;
    while (lead < n && (buf[lead] == '\r' || buf[lead] == '\n'))
        lead++;
    const char *p = buf + lead;
    size_t m = n - lead;
    const char *blank = NULL;
    for (size_t i = 0; i + 1 < m && !blank; i++)
        if (p[i] == '\n' &&
            (p[i + 1] == '\n' || (p[i + 1] == '\r' && i + 2 < m && p[i + 2] == '\n')))
            blank = p + i + 1;
    if (lead >= HEAD_MAX) {
        door_answer(h, c, 400, PROTO_CODE_BAD_REQUEST, "only empty lines, no request line");
        return;
    }
    const char *code;
    char msg[256];
    int st;
    if (blank) {
        st = http_head_check(p, (size_t)(blank - p) + 1, true, &code, msg, sizeof msg);
    } else if (n >= HEAD_MAX) {
        st = http_head_check(p, m, false, &code, msg, sizeof msg);
    } else {
        /* incomplete: a request line or field already bad need not wait for the rest */
        const char *eol = memchr(p, '\n', m);
        if (hup) {
            door_close(h, c); /* it will send no more: the head stays incomplete */
            return;
        }
        if (!eol) return;
        st = http_head_check(p, (size_t)(eol - p) + 1, true, &code, msg, sizeof msg);
        if (st == 400 && strstr(msg, "needs Host")) st = 0; /* Host may still come */
        if (!st) return;
    }
    if (st) {
        door_answer(h, c, st, code, msg);
        return;
    }
    /* a good head: MHD takes the connection and reads it again */
    epoll_ctl(h->door_epfd, EPOLL_CTL_DEL, c->fd, NULL);
    door_unlink(h, c);
    int fd = c->fd;
    struct sockaddr_storage addr = c->addr;
    socklen_t alen = c->addr_len;
    free(c);
    if (MHD_add_connection(h->mhd, fd, (struct sockaddr *)&addr, alen) != MHD_YES) {
        /* MHD closed it: over its per-address limit, or out of memory */
        h->refused++;
        tlmd_log(LOG_DEBUG, "http_refused", "reason=\"libmicrohttpd refused the connection: %s\"",
                 strerror(errno));
    }
    http_kick(h);
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)b)->sin6_addr, 16);
    return true; /* unix sockets: one client */
}

static void on_door_events(uv_poll_t *p, int status, int events)
{
    http_server *h = p->data;
    struct epoll_event ev[64];
    int n;
    while ((n = epoll_wait(h->door_epfd, ev, 64, 0)) > 0)
        for (int i = 0; i < n; i++)
            door_readable(h, ev[i].data.ptr, ev[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR));
}

static void on_listen(uv_poll_t *p, int status, int events)
{
    http_server *h = p->data;
    for (int accepted = 0; accepted < 256 && h->door_open; accepted++) {
        door_conn probe = {.fd = -1};
        probe.addr_len = sizeof probe.addr;
        int fd = accept4(h->listen_fd, (struct sockaddr *)&probe.addr, &probe.addr_len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                tlmd_log(LOG_WARN, "http_accept", "error=\"%s\"", strerror(errno));
            return;
        }
        door_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        *c = probe;
        c->fd = fd;
        c->deadline = tlmd_now() + h->env->cfg.header_timeout_s;
        c->next = h->door;
        if (h->door) h->door->prev = c;
        h->door = c;
        h->n_door++;
        int same = 0;
        for (door_conn *o = c->next; o && same < h->env->cfg.max_connections_per_ip; o = o->next)
            same += same_ip(&o->addr, &c->addr);
        unsigned total = (unsigned)h->n_door + http_connections(h);
        if (same >= h->env->cfg.max_connections_per_ip || total > (unsigned)h->max_conns) {
            h->refused++;
            door_answer(h, c, 503, PROTO_CODE_UNAVAILABLE,
                        same >= h->env->cfg.max_connections_per_ip
                            ? "too many connections from this address are waiting"
                            : "too many connections");
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.ptr = c};
        if (epoll_ctl(h->door_epfd, EPOLL_CTL_ADD, fd, &ev)) {
            door_close(h, c);
            continue;
        }
        if (!c->closing) door_readable(h, c, false); /* the head may already be there */
    }
}

/* Once a second: heads that did not arrive in time get 408; answered connections that
 * linger past their deadline are closed. */
static void on_door_timer(uv_timer_t *t)
{
    http_server *h = t->data;
    double now = tlmd_now();
    for (door_conn *c = h->door, *next; c; c = next) {
        next = c->next;
        if (now < c->deadline) continue;
        if (c->closing) {
            door_close(h, c);
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "the request head did not arrive within %g s",
                     h->env->cfg.header_timeout_s);
            door_answer(h, c, 408, PROTO_CODE_REQUEST_TIMEOUT, msg);
        }
    }
}

unsigned http_door_connections(const http_server *h)
{
    return h ? (unsigned)h->n_door : 0;
}

uint64_t http_refused(const http_server *h)
{
    return h ? h->refused : 0;
}

/* The connection limit: the open-file limit raised to its hard limit, less room for the
 * store, the compilers' pipes and the libraries. */
static int conn_limit(const tlmd_config *cfg)
{
    struct rlimit rl;
    rlim_t nofile = 1024;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        if (rl.rlim_cur < rl.rlim_max) {
            rlim_t want = rl.rlim_max == RLIM_INFINITY ? 1048576 : rl.rlim_max;
            struct rlimit nr = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &nr) == 0) rl.rlim_cur = want;
        }
        nofile = rl.rlim_cur == RLIM_INFINITY ? 1048576 : rl.rlim_cur;
    }
    long room = (long)nofile - 256;
    if (room < 16) room = 16;
    if (cfg->max_connections > 0 && cfg->max_connections < room) return cfg->max_connections;
    return room > 1000000 ? 1000000 : (int)room;
}

/* ---- the access handler ---- */

static enum MHD_Result queue(http_req *r)
{
    struct MHD_Response *resp = r->resp;
    r->resp = NULL;
    metrics_request(r->srv->m, r->route, r->status);
    tlmd_log(LOG_DEBUG, "http", "method=%s url=\"%.200s\" status=%d", r->method, r->url, r->status);
    enum MHD_Result ret = MHD_queue_response(r->conn, (unsigned)r->status, resp);
    MHD_destroy_response(resp);
    return ret;
}

/* Content-Length and Transfer-Encoding as the request sent them, every occurrence. */
typedef struct framing {
    int n_cl, n_te;
    bool bad;
    char cl[24];
} framing;

static enum MHD_Result count_framing(void *cls, enum MHD_ValueKind kind, const char *key,
                                     const char *value)
{
    framing *f = cls;
    if (!strcasecmp(key, "Content-Length")) {
        size_t n = strlen(value);
        bool digits = n > 0 && n <= 19;
        for (size_t i = 0; i < n; i++)
            digits &= value[i] >= '0' && value[i] <= '9';
        if (!digits || (f->n_cl && strcmp(f->cl, value))) f->bad = true;
        if (digits) snprintf(f->cl, sizeof f->cl, "%s", value);
        f->n_cl++;
    } else if (!strcasecmp(key, "Transfer-Encoding")) {
        if (strcasecmp(value, "chunked")) f->bad = true;
        f->n_te++;
    }
    return MHD_YES;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    http_server *h = cls;
    http_req *r = *con_cls;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r) return MHD_NO;
        r->srv = h;
        r->conn = conn;
        r->url = strdup(url);
        snprintf(r->method, sizeof r->method, "%s", method);
        r->next = h->reqs;
        if (h->reqs) h->reqs->prev = r;
        h->reqs = r;
        *con_cls = r;
        if (!r->url) return MHD_NO;
        r->t_begin = tlmd_now();
        /* a later request on a kept-alive connection did not pass the door: its framing is
         * checked here (MHD takes the first Content-Length, or chunked over a length) */
        framing fr = {0};
        MHD_get_connection_values(conn, MHD_HEADER_KIND, count_framing, &fr);
        if (fr.bad || (fr.n_cl && fr.n_te) || fr.n_te > 1) {
            r->dispatched = true;
            http_reply_error(r, 400, PROTO_CODE_BAD_REQUEST,
                             fr.n_te && fr.n_cl
                                 ? "Transfer-Encoding and Content-Length together (RFC 9112 6.1)"
                                 : "duplicate or malformed Content-Length / Transfer-Encoding",
                             "");
            MHD_add_response_header(r->resp, "Connection", "close");
            return queue(r);
        }
        h->hd.begin(h->hd.arg, r);
        /* Only a 100-continue client has not sent its body yet; anyone else is answered
         * after the body was read, so the answer is not lost to a reset connection. */
        if (r->pending_status) {
            const char *expect = http_header(r, "Expect");
            if (expect && !strcasecmp(expect, "100-continue")) {
                http_reply_json(r, r->pending_status, r->pending_body);
                r->pending_body = NULL;
                return queue(r);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (tlmd_now() - r->t_begin > h->env->cfg.body_timeout_s) {
            /* a body that trickles in is cut off: MHD 0.9.75 takes no response in the middle
             * of a body, so the connection is closed without one (a body that stops
             * altogether is closed by MHD after idle_timeout_s) */
            tlmd_log(LOG_INFO, "http_body_timeout", "url=\"%.200s\" received=%zu limit_s=%g",
                     r->url, r->len, h->env->cfg.body_timeout_s);
            metrics_request(h->m, r->route, 408);
            return MHD_NO;
        }
        if (!r->pending_status && !r->too_large) {
            if (r->len + *upload_size > h->env->cfg.max_body) {
                r->too_large = true;
                free(r->body);
                r->body = NULL;
                r->len = r->cap = 0;
            } else {
                if (r->len + *upload_size + 1 > r->cap) {
                    size_t cap = (r->len + *upload_size + 1) * 2;
                    if (cap > h->env->cfg.max_body + 1) cap = h->env->cfg.max_body + 1;
                    char *p = realloc(r->body, cap);
                    if (!p) return MHD_NO;
                    r->body = p;
                    r->cap = cap;
                }
                memcpy(r->body + r->len, upload_data, *upload_size);
                r->len += *upload_size;
                r->body[r->len] = 0;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (r->resp) return queue(r);
    if (r->dispatched) return MHD_YES; /* a resumed stream: MHD calls the reader */
    r->dispatched = true;
    if (r->pending_status) {
        http_reply_json(r, r->pending_status, r->pending_body);
        r->pending_body = NULL;
    } else if (r->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body is larger than %zu bytes",
                 h->env->cfg.max_body);
        http_reply_error(r, 413, PROTO_CODE_BODY_TOO_LARGE, msg, "");
    } else {
        h->hd.dispatch(h->hd.arg, r);
    }
    if (r->resp) return queue(r);
    return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    http_server *h = cls;
    http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (r->detach) r->detach(r);
    if (r->prev)
        r->prev->next = r->next;
    else
        h->reqs = r->next;
    if (r->next) r->next->prev = r->prev;
    if (r->resp) MHD_destroy_response(r->resp);
    json_decref(r->pending_body);
    free(r->url);
    free(r->body);
    free(r->sbuf);
    free(r);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n')
        msg[--n] = 0;
    tlmd_log(LOG_DEBUG, "mhd", "detail=\"%s\"", msg);
}

void http_fail_all(http_server *h)
{
    for (http_req *r = h->reqs; r; r = r->next) {
        if (r->detach) r->detach(r);
        if (r->streaming) {
            if (!r->stream_end) {
                http_stream_line(
                    r, proto_error_body(PROTO_CODE_UNAVAILABLE, "the server is shutting down", ""));
                http_stream_end(r);
            }
        } else if (r->suspended) {
            http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
        }
    }
}

unsigned http_connections(const http_server *h)
{
    if (!h || !h->mhd) return 0;
    const union MHD_DaemonInfo *i =
        MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return i ? i->num_connections : 0;
}

http_server *http_new(const tlmd_env *env, metrics *m)
{
    http_server *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->env = env;
    h->m = m;
    h->listen_fd_activated = -1;
    h->listen_fd = -1;
    h->door_epfd = -1;
    h->port = env->cfg.port;
    return h;
}

int http_port(const http_server *h)
{
    return h->port;
}

bool http_socket_activated(const http_server *h)
{
    return h->listen_fd_activated >= 0;
}

void http_quiesce(http_server *h)
{
    if (!h || !h->mhd || !h->door_open) return;
    h->door_open = false; /* stop accepting; heads still in the door are dropped */
    uv_poll_stop(&h->listen_poll);
    close(h->listen_fd);
    h->listen_fd = -1;
    while (h->door)
        door_close(h, h->door);
}

void http_free(http_server *h)
{
    free(h);
}

/* MHD's unescaper, except that a path with an encoded NUL stays as it was sent: decoded, the
 * NUL would cut the path short ("KEY%00x/meta" would read as "KEY"); escaped, it matches no
 * route and is answered 404. */
static size_t unescape(void *cls, struct MHD_Connection *c, char *s)
{
    for (const char *p = s; (p = strchr(p, '%')); p++)
        if (p[1] == '0' && p[2] == '0') return strlen(s);
    return MHD_http_unescape(s);
}

static int listen_socket(const tlmd_config *cfg, struct sockaddr_in *sa, tlm_error *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return tlm_err_set(err, TLM_EIO, "listen", "socket: %s", strerror(errno));
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)sa, sizeof *sa) || listen(fd, 1024)) {
        int e = errno;
        close(fd);
        return tlm_err_set(err, TLM_EIO, "listen", "cannot listen on %s:%d: %s", cfg->listen_addr,
                           cfg->port, strerror(e));
    }
    return fd;
}

int http_start(http_server *s, const http_handlers *hd, tlm_error *err)
{
    s->hd = *hd;
    const tlmd_config *cfg = &s->env->cfg;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)cfg->port);
    int n = sd_listen_fds(1);
    if (n >= 1) {
        s->listen_fd_activated = SD_LISTEN_FDS_START;
        s->listen_fd = SD_LISTEN_FDS_START;
        fcntl(s->listen_fd, F_SETFL, fcntl(s->listen_fd, F_GETFL) | O_NONBLOCK);
    } else if (inet_pton(AF_INET, cfg->listen_addr, &sa.sin_addr) != 1) {
        return tlm_err_set(err, TLM_EINVAL, "listen",
                           "\"%s\" is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)",
                           cfg->listen_addr);
    } else if ((s->listen_fd = listen_socket(cfg, &sa, err)) < 0) {
        s->listen_fd = -1;
        return err->code;
    }
    s->max_conns = conn_limit(cfg);
    unsigned flags =
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | MHD_USE_NO_LISTEN_SOCKET;
    s->mhd = MHD_start_daemon(
        flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)cfg->idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->max_conns,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_ip,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(4 * HEAD_MAX + 65536),
        MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL, MHD_OPTION_END);
    if (!s->mhd) {
        if (s->listen_fd_activated < 0) close(s->listen_fd);
        s->listen_fd = -1;
        return tlm_err_set(err, TLM_EIO, "listen", "libmicrohttpd did not start");
    }
    struct sockaddr_in bound;
    socklen_t blen = sizeof bound;
    if (getsockname(s->listen_fd, (struct sockaddr *)&bound, &blen) == 0 &&
        bound.sin_family == AF_INET)
        s->port = ntohs(bound.sin_port);
    const union MHD_DaemonInfo *ei = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    s->door_epfd = epoll_create1(EPOLL_CLOEXEC);
    if (!ei || s->door_epfd < 0) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        return tlm_err_set(err, TLM_EIO, "", "no epoll fd");
    }
    uv_poll_init(s->env->loop, &s->mhd_poll, ei->epoll_fd);
    s->mhd_poll.data = s;
    uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
    uv_timer_init(s->env->loop, &s->mhd_timer);
    s->mhd_timer.data = s;
    uv_poll_init(s->env->loop, &s->door_poll, s->door_epfd);
    s->door_poll.data = s;
    uv_poll_start(&s->door_poll, UV_READABLE, on_door_events);
    uv_timer_init(s->env->loop, &s->door_timer);
    s->door_timer.data = s;
    uv_timer_start(&s->door_timer, on_door_timer, 250, 250);
    uv_poll_init(s->env->loop, &s->listen_poll, s->listen_fd);
    s->listen_poll.data = s;
    uv_poll_start(&s->listen_poll, UV_READABLE, on_listen);
    s->door_open = true;
    tlmd_log(LOG_INFO, "http_limits",
             "max_connections=%d per_ip=%d header_timeout_s=%g body_timeout_s=%g "
             "idle_timeout_s=%g",
             s->max_conns, cfg->max_connections_per_ip, cfg->header_timeout_s, cfg->body_timeout_s,
             cfg->idle_timeout_s);
    run_mhd(s);
    return 0;
}

static void noop_close(uv_handle_t *h) {}

void http_stop(http_server *s)
{
    if (!s->mhd) return;
    /* MHD must not be stopped with suspended connections: resume them all first. */
    for (http_req *r = s->reqs; r; r = r->next)
        if (r->suspended) {
            r->suspended = false;
            if (!r->resp && !r->streaming)
                http_reply_error(r, 503, PROTO_CODE_UNAVAILABLE, "the server is shutting down", "");
            else {
                r->stream_end = true;
                MHD_resume_connection(r->conn);
            }
        }
    MHD_run(s->mhd);
    http_quiesce(s);
    uv_poll_stop(&s->mhd_poll);
    uv_close((uv_handle_t *)&s->mhd_poll, noop_close);
    uv_close((uv_handle_t *)&s->mhd_timer, noop_close);
    uv_close((uv_handle_t *)&s->listen_poll, noop_close);
    uv_close((uv_handle_t *)&s->door_poll, noop_close);
    uv_close((uv_handle_t *)&s->door_timer, noop_close);
    close(s->door_epfd);
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
