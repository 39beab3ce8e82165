/* http.c — libmicrohttpd driven by the libuv loop (DESIGN §9): MHD runs with MHD_USE_EPOLL |
 * MHD_ALLOW_SUSPEND_RESUME and no thread of its own; a uv_poll_t watches MHD's epoll fd,
 * MHD_run follows every wake-up and a uv_timer is re-armed from MHD_get_timeout after every
 * run. Requests that wait for work are suspended and resumed by http_reply_* (then MHD runs
 * once more: 0.9.75 needs that explicit run after a resume). NDJSON streams use a content
 * reader that suspends its connection whenever it has nothing to send.
 *
 * The front door: tlmd accepts connections itself (MHD runs with MHD_USE_NO_LISTEN_SOCKET)
 * and stays between the client and MHD for the connection's whole life. It reads what the
 * client sends, checks every request head against RFC 9112 (request line, version, header
 * syntax, Content-Length, Transfer-Encoding, Host, sizes: http_head_parse), follows the body's
 * framing to the next head, and hands the requests to MHD through a socketpair (MHD gets the
 * client's address with MHD_add_connection, for its per-address limit); MHD's answers come
 * back through the socketpair and go out to the client. A chunked body reaches MHD re-framed
 * (plain sizes, no extensions, no trailer fields), so MHD only ever parses bytes the door has
 * judged and never answers with its own (HTML) error pages: a bad head or body gets the
 * door's JSON error (400, 408, 413, 414, 431, 505) after MHD's answers to the requests before
 * it, on the first request of a connection as on any later or pipelined one, and the
 * connection ends. A head that does not arrive within header_timeout_s (from the accept, or
 * from its first byte on a kept-alive connection) and a body still arriving after
 * body_timeout_s get 408 (slowloris); connections over max_connections (sized from
 * RLIMIT_NOFILE) or max_connections_per_ip are refused with 503. A client that shuts down its
 * side still gets the answers to its whole requests (MHD reads the end after them); one that
 * goes away closes MHD's side, which cancels its job. */
#include <arpa/inet.h>
#include <errno.h>
#include <ctype.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
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

#define DOOR_LINGER_S 2.0         /* an answered connection is read and dropped for this long */
#define DOOR_BUF_MAX (256 * 1024) /* bytes held for MHD or for the client before reading stops */
#define DOOR_IN_MAX (64 * 1024)   /* bytes read ahead from the client */

/* A growable byte queue: the bytes are p[off, len). */
typedef struct dbuf {
    char *p;
    size_t off, len, cap;
} dbuf;

/* Where the door is in the client's byte stream. */
enum door_state {
    DS_HEAD,       /* a request head (or the empty lines before it) */
    DS_BODY,       /* left bytes of a Content-Length body */
    DS_CHUNK_LINE, /* a chunk-size line */
    DS_CHUNK_DATA, /* left bytes of a chunk */
    DS_CHUNK_END,  /* the CRLF after a chunk */
    DS_TRAILER,    /* trailer fields, up to the empty line */
    DS_DROP,       /* the connection is ending: what the client sends is read and dropped */
};

/* A client connection. The door reads it, checks every request head, and hands the requests
 * to MHD through a socketpair (mfd is the door's end); MHD's answers come back through it. */
typedef struct door_conn {
    int fd;  /* the client's socket; -1 once closed */
    int mfd; /* the door's end of the socketpair to MHD; -1 before the first head, or closed */
    struct sockaddr_storage addr;
    socklen_t addr_len;
    enum door_state state;
    uint64_t left, body; /* bytes left of a body or chunk; a chunked body's bytes so far */
    size_t trailer;      /* bytes of the trailer section so far */
    int trailer_fields;
    int route;               /* the current request's route (the metrics' label) */
    dbuf in, to_mhd, to_cli; /* read from the client; for MHD; for the client */
    unsigned n_fwd, n_done;  /* whole requests given to MHD / answered by it */
    double deadline;         /* of the head or body being read, or of the linger; 0: none */
    bool cli_eof;            /* the client shut down its side */
    bool had_mhd, mhd_live;  /* MHD was given the connection / still holds it */
    bool mhd_wr_shut;        /* MHD was told the client's end */
    bool closing;            /* the door's last byte is sent: lingering until the client's EOF */
    bool answered;           /* the door's own error was sent */
    bool dead, woken;
    int err_status, err_route; /* the door's error, waiting for MHD's earlier answers */
    const char *err_code;
    char err_msg[256];
    struct door_conn *prev, *next, *wnext;
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
    door_conn *dead;    /* freed at the end of the callback */
    door_conn *woken;   /* to pump after MHD_run: an answer the door waits for is done */
    door_conn *adding;  /* inside MHD_add_connection */
    int n_door, n_head; /* client connections; of those, waiting for their first head */
    int max_conns;
    uint64_t refused; /* connections refused over a limit */
};

static void mhd_rearm(http_server *h);
static void door_pump(http_server *h, struct door_conn *c);
static void door_reap(http_server *h);

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
    while (h->woken) {
        door_conn *c = h->woken;
        h->woken = c->wnext;
        c->woken = false;
        door_pump(h, c);
    }
    door_reap(h);
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

static char *dbuf_room(dbuf *b, size_t want)
{
    if (b->off == b->len) b->off = b->len = 0;
    if (b->len + want + 1 > b->cap && b->off) {
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
    }
    if (b->len + want + 1 > b->cap) {
        size_t cap = (b->len + want + 1) * 2;
        char *q = realloc(b->p, cap < 4096 ? 4096 : cap);
        if (!q) return NULL;
        b->p = q;
        b->cap = cap < 4096 ? 4096 : cap;
    }
    return b->p + b->len;
}

static int dbuf_add(dbuf *b, const void *d, size_t n)
{
    char *q = dbuf_room(b, n);
    if (!q) return -1;
    memcpy(q, d, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static size_t dbuf_size(const dbuf *b)
{
    return b->len - b->off;
}

static void dbuf_eat(dbuf *b, size_t n)
{
    b->off += n;
    if (b->off == b->len) b->off = b->len = 0;
}

/* MHD's end of the socketpair is closed with the connection; ours goes here. */
static void door_close_mhd(http_server *h, door_conn *c)
{
    if (c->mfd < 0) return;
    epoll_ctl(h->door_epfd, EPOLL_CTL_DEL, c->mfd, NULL);
    close(c->mfd);
    c->mfd = -1;
}

/* Freed once both the client's socket and MHD's connection are gone; after the callback
 * that got here (two events of one epoll batch may name the same connection). */
static void door_maybe_free(http_server *h, door_conn *c)
{
    if (c->fd >= 0 || c->mfd >= 0 || c->mhd_live || c->dead) return;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->door = c->next;
    if (c->next) c->next->prev = c->prev;
    c->dead = true;
    c->next = h->dead;
    h->dead = c;
}

static void door_reap(http_server *h)
{
    while (h->dead) {
        door_conn *c = h->dead;
        h->dead = c->next;
        free(c->in.p);
        free(c->to_mhd.p);
        free(c->to_cli.p);
        free(c);
    }
}

static void door_close_client(http_server *h, door_conn *c)
{
    if (c->fd >= 0) {
        epoll_ctl(h->door_epfd, EPOLL_CTL_DEL, c->fd, NULL);
        close(c->fd);
        c->fd = -1;
        h->n_door--;
        if (!c->had_mhd) h->n_head--;
    }
    door_close_mhd(h, c); /* MHD sees the end: a job waiting for this client is cancelled */
    door_maybe_free(h, c);
}

/* An answer from the door itself (status, a PROTO_CODE_*, why), sent after MHD's answers to
 * the requests before it; then the connection ends (RFC 9112 9.6: after a request that
 * cannot be framed, nothing after it can be trusted). */
static void door_fail(door_conn *c, int status, const char *code, int route, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static void door_fail(door_conn *c, int status, const char *code, int route, const char *fmt, ...)
{
    if (c->err_status || c->answered || c->state == DS_DROP) return;
    c->err_status = status;
    c->err_code = code;
    c->err_route = route;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    c->state = DS_DROP;
    c->deadline = 0;
    dbuf_eat(&c->in, dbuf_size(&c->in));
}

static void door_append_error(http_server *h, door_conn *c)
{
    json_t *b = proto_error_body(c->err_code, c->err_msg, "");
    char *js = b ? json_dumps(b, JSON_COMPACT) : NULL;
    json_decref(b);
    char head[256];
    int n =
        snprintf(head, sizeof head,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nServer: tlmd/" TLMD_VERSION
                 "\r\nConnection: close\r\nContent-Length: %zu\r\n\r\n",
                 c->err_status, reason(c->err_status), js ? strlen(js) + 1 : 1);
    dbuf_add(&c->to_cli, head, (size_t)n);
    if (js) dbuf_add(&c->to_cli, js, strlen(js));
    dbuf_add(&c->to_cli, "\n", 1);
    free(js);
    metrics_request(h->m, c->err_route, c->err_status);
    tlmd_log(LOG_DEBUG, "http_door", "status=%d code=%s detail=\"%s\"", c->err_status, c->err_code,
             c->err_msg);
    c->err_status = 0;
    c->answered = true;
}

/* MHD gets a connection (one end of a socketpair, the client's address for its per-address
 * limit) when the first request head is good. -1: the request is not forwarded. */
static int door_hand_over(http_server *h, door_conn *c)
{
    if (c->mfd >= 0) return 0;
    if (c->had_mhd) { /* MHD ended the connection; what the client sent after is dropped */
        c->state = DS_DROP;
        dbuf_eat(&c->in, dbuf_size(&c->in));
        return -1;
    }
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sp)) {
        door_fail(c, 503, PROTO_CODE_UNAVAILABLE, c->route, "out of file descriptors");
        return -1;
    }
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.ptr = c};
    if (epoll_ctl(h->door_epfd, EPOLL_CTL_ADD, sp[0], &ev)) {
        close(sp[0]);
        close(sp[1]);
        door_fail(c, 503, PROTO_CODE_UNAVAILABLE, c->route, "out of memory");
        return -1;
    }
    c->mfd = sp[0];
    c->had_mhd = true;
    h->n_head--;
    h->adding = c;
    enum MHD_Result ok =
        MHD_add_connection(h->mhd, sp[1], (struct sockaddr *)&c->addr, c->addr_len);
    h->adding = NULL;
    if (ok != MHD_YES) { /* over MHD's per-address limit, or out of memory; it closed sp[1] */
        h->refused++;
        tlmd_log(LOG_DEBUG, "http_refused", "reason=\"libmicrohttpd refused the connection: %s\"",
                 strerror(errno));
        door_close_mhd(h, c);
        c->had_mhd = false;
        h->n_head++;
        door_fail(c, 503, PROTO_CODE_UNAVAILABLE, c->route, "too many connections");
        return -1;
    }
    http_kick(h);
    return 0;
}

/* A chunk-size line (RFC 9112 7.1, without CRLF): the size; -1 if malformed. */
static int64_t chunk_size(const char *p, size_t n)
{
    size_t i = 0;
    uint64_t v = 0;
    for (; i < n && isxdigit((unsigned char)p[i]); i++) {
        if (v >> 59) return -1;
        v = v * 16 + (uint64_t)(isdigit((unsigned char)p[i])
                                    ? p[i] - '0'
                                    : (tolower((unsigned char)p[i]) - 'a' + 10));
    }
    if (i == 0) return -1;
    while (i < n && (p[i] == ' ' || p[i] == '\t'))
        i++;
    if (i < n && p[i] != ';') return -1;
    for (; i < n; i++)
        if (((unsigned char)p[i] < 0x20 && p[i] != '\t') || p[i] == 0x7f) return -1;
    return (int64_t)v;
}

/* What the client sent (in) becomes what MHD reads (to_mhd), one request at a time: every
 * head is checked as the first one is; a Content-Length body passes as it is; a chunked body
 * passes re-framed (sizes in plain hex, no extensions, no trailer fields), so MHD reads only
 * framing the door has judged. Returns whether anything moved. */
static bool door_parse(http_server *h, door_conn *c)
{
    const tlmd_config *cfg = &h->env->cfg;
    bool moved = false;
    while (c->state != DS_DROP && dbuf_size(&c->to_mhd) < DOOR_BUF_MAX) {
        char *p = c->in.p + c->in.off;
        size_t n = dbuf_size(&c->in);
        if (c->state == DS_HEAD) {
            if (!n) return moved;
            if (!c->deadline) c->deadline = tlmd_now() + cfg->header_timeout_s;
            size_t lead = 0; /* empty lines before a request line are allowed (RFC 9112 2.2) */
            while (lead < n && (p[lead] == '\r' || p[lead] == '\n'))
                lead++;
            if (lead) {
                dbuf_eat(&c->in, lead);
                moved = true;
                continue;
            }
            size_t m = n < HEAD_MAX ? n : HEAD_MAX;
            const char *blank = NULL;
            for (size_t i = 0; i + 1 < m && !blank; i++)
                if (p[i] == '\n' &&
                    (p[i + 1] == '\n' || (p[i + 1] == '\r' && i + 2 < m && p[i + 2] == '\n')))
                    blank = p + i + 1;
            const char *code;
            char msg[256];
            http_frame f;
            int st;
            if (blank) {
                st = http_head_parse(p, (size_t)(blank - p) + 1, true, &f, &code, msg, sizeof msg);
            } else if (m >= HEAD_MAX) {
                st = http_head_parse(p, m, false, NULL, &code, msg, sizeof msg);
            } else {
                /* incomplete: a request line already bad need not wait for the rest */
                const char *eol = memchr(p, '\n', m);
                if (!eol) return moved;
                st = http_head_parse(p, (size_t)(eol - p) + 1, true, NULL, &code, msg, sizeof msg);
                if (st == 400 && strstr(msg, "needs Host")) st = 0; /* Host may still come */
                if (!st) return moved;
            }
            if (st) {
                door_fail(c, st, code, routes_label_count() - 1, "%s", msg);
                return true;
            }
            size_t head_len = (size_t)(blank - p) + (blank[0] == '\r' ? 2 : 1);
            c->route = routes_label_of(f.target, f.target_len);
            if (f.length > cfg->max_body) {
                door_fail(c, 413, PROTO_CODE_BODY_TOO_LARGE, c->route,
                          "the request body is larger than %zu bytes", cfg->max_body);
                return true;
            }
            if (door_hand_over(h, c)) return true;
            dbuf_add(&c->to_mhd, p, head_len);
            dbuf_eat(&c->in, head_len);
            moved = true;
            c->body = 0;
            if (f.chunked) {
                c->state = DS_CHUNK_LINE;
                c->deadline = tlmd_now() + cfg->body_timeout_s;
            } else if (f.length) {
                c->state = DS_BODY;
                c->left = f.length;
                c->deadline = tlmd_now() + cfg->body_timeout_s;
            } else {
                c->n_fwd++;
                c->deadline = 0;
            }
        } else if (c->state == DS_BODY || c->state == DS_CHUNK_DATA) {
            if (!n) return moved;
            size_t k = n < c->left ? n : (size_t)c->left;
            dbuf_add(&c->to_mhd, p, k);
            dbuf_eat(&c->in, k);
            c->left -= k;
            moved = true;
            if (c->left) continue;
            if (c->state == DS_BODY) {
                c->state = DS_HEAD;
                c->n_fwd++;
                c->deadline = 0;
            } else {
                c->state = DS_CHUNK_END;
            }
        } else if (c->state == DS_CHUNK_END) {
            if (!n || (p[0] == '\r' && n < 2)) return moved;
            size_t k = p[0] == '\n' ? 1 : p[0] == '\r' && p[1] == '\n' ? 2 : 0;
            if (!k) {
                door_fail(c, 400, PROTO_CODE_BAD_REQUEST, c->route,
                          "a chunk is longer than its size says");
                return true;
            }
            dbuf_eat(&c->in, k);
            dbuf_add(&c->to_mhd, "\r\n", 2);
            c->state = DS_CHUNK_LINE;
            moved = true;
        } else { /* DS_CHUNK_LINE, DS_TRAILER: a line at a time */
            const char *eol = memchr(p, '\n', n < HEAD_MAX ? n : HEAD_MAX);
            if (!eol) {
                if (n < (c->state == DS_TRAILER ? HEAD_MAX - c->trailer : 1024)) return moved;
                door_fail(c, c->state == DS_TRAILER ? 431 : 400,
                          c->state == DS_TRAILER ? PROTO_CODE_HEADERS_TOO_LARGE
                                                 : PROTO_CODE_BAD_REQUEST,
                          c->route, "a chunk-size or trailer line is too long");
                return true;
            }
            size_t ll = (size_t)(eol - p);
            size_t used = ll + 1;
            if (ll && p[ll - 1] == '\r') ll--;
            if (c->state == DS_CHUNK_LINE) {
                int64_t sz = chunk_size(p, ll);
                if (sz < 0) {
                    door_fail(c, 400, PROTO_CODE_BAD_REQUEST, c->route,
                              "a chunk does not start with its size in hex (RFC 9112 7.1)");
                    return true;
                }
                if (c->body + (uint64_t)sz > cfg->max_body) {
                    door_fail(c, 413, PROTO_CODE_BODY_TOO_LARGE, c->route,
                              "the request body is larger than %zu bytes", cfg->max_body);
                    return true;
                }
                dbuf_eat(&c->in, used);
                moved = true;
                if (sz == 0) {
                    c->state = DS_TRAILER;
                    c->trailer = 0;
                    c->trailer_fields = 0;
                } else {
                    char line[32];
                    int k = snprintf(line, sizeof line, "%llx\r\n", (unsigned long long)sz);
                    dbuf_add(&c->to_mhd, line, (size_t)k);
                    c->body += (uint64_t)sz;
                    c->left = (uint64_t)sz;
                    c->state = DS_CHUNK_DATA;
                }
            } else if (ll == 0) { /* the end of the trailer section: the request is whole */
                dbuf_eat(&c->in, used);
                dbuf_add(&c->to_mhd, "0\r\n\r\n", 5);
                c->state = DS_HEAD;
                c->n_fwd++;
                c->deadline = 0;
                moved = true;
            } else { /* a trailer field: judged as a header line, not passed on */
                const char *colon = memchr(p, ':', ll);
                bool ok = colon && colon != p;
                for (const char *q = p; ok && q < colon; q++)
                    ok = (unsigned char)*q > 0x20 && (unsigned char)*q < 0x7f &&
                         !strchr("\"(),/:;<=>?@[\\]{}", *q);
                for (const char *q = colon ? colon + 1 : p; ok && q < p + ll; q++)
                    ok = ((unsigned char)*q >= 0x20 || *q == '\t') && *q != 0x7f;
                c->trailer += used;
                if (!ok || ++c->trailer_fields > FIELDS_MAX || c->trailer > HEAD_MAX) {
                    door_fail(c, ok ? 431 : 400,
                              ok ? PROTO_CODE_HEADERS_TOO_LARGE : PROTO_CODE_BAD_REQUEST, c->route,
                              ok ? "the trailer section is too large"
                                 : "a malformed trailer field");
                    return true;
                }
                dbuf_eat(&c->in, used);
                moved = true;
            }
        }
    }
    return moved;
}

/* Moves bytes as far as they go: client -> door -> MHD and MHD -> client; answers with the
 * door's error when its turn comes; ends the connection when nothing more will be said. */
/* Nothing but the empty lines a client may send between requests (RFC 9112 2.2). */
static bool only_blank_lines(const dbuf *b)
{
    for (size_t i = b->off; i < b->len; i++)
        if (b->p[i] != '\r' && b->p[i] != '\n') return false;
    return true;
}

static void door_pump(http_server *h, door_conn *c)
{
    char scratch[16384];
    size_t dropped = 0; /* bytes read and dropped by this call: a bound, so a client that
                         * keeps sending after its answer cannot hold the loop */
    /* each pass moves what the socket buffers hold; it ends when nothing moves (a socket
     * would block, a buffer is full), since no new bytes can come from MHD meanwhile */
    for (int round = 0; round < 4096 && !c->dead; round++) {
        bool more = false;
        /* the client's bytes (dropped once the door has decided to end the connection) */
        while (c->fd >= 0 && !c->cli_eof) {
            bool drop = c->state == DS_DROP || c->closing;
            if (!drop && dbuf_size(&c->in) >= DOOR_IN_MAX) break;
            if (drop && dropped >= (1u << 20)) break;
            char *dst = drop ? scratch : dbuf_room(&c->in, 16384);
            if (!dst) break;
            ssize_t r = recv(c->fd, dst, drop ? sizeof scratch : 16384, MSG_DONTWAIT);
            if (r > 0) {
                if (!drop) {
                    c->in.len += (size_t)r;
                    c->in.p[c->in.len] = 0;
                } else {
                    dropped += (size_t)r;
                }
                more = true;
            } else if (r == 0) {
                c->cli_eof = true;
                more = true;
            } else if (errno == EINTR) {
                continue;
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                break;
            } else {
                door_close_client(h, c);
                return;
            }
        }
        if (!c->closing && door_parse(h, c)) more = true;
        /* the requests, to MHD */
        while (c->mfd >= 0 && dbuf_size(&c->to_mhd)) {
            ssize_t w = send(c->mfd, c->to_mhd.p + c->to_mhd.off, dbuf_size(&c->to_mhd),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                dbuf_eat(&c->to_mhd, (size_t)w);
                more = true;
            } else if (w < 0 && errno == EINTR) {
                continue;
            } else {
                if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) /* MHD closed it */
                    dbuf_eat(&c->to_mhd, dbuf_size(&c->to_mhd));
                break;
            }
        }
        /* MHD's answers, to the client */
        bool drained = false;
        while (c->mfd >= 0 && dbuf_size(&c->to_cli) < DOOR_BUF_MAX) {
            char *dst = dbuf_room(&c->to_cli, 65536);
            if (!dst) break;
            ssize_t r = recv(c->mfd, dst, 65536, MSG_DONTWAIT);
            if (r > 0) {
                c->to_cli.len += (size_t)r;
                more = true;
            } else if (r < 0 && errno == EINTR) {
                continue;
            } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                drained = true;
                break;
            } else { /* MHD ended the connection; its last answer said so */
                door_close_mhd(h, c);
                c->err_status = 0;
                if (c->state != DS_DROP) c->state = DS_DROP;
                more = true;
            }
        }
        /* the door's own answer, once MHD has answered every request before it */
        if (c->err_status && (c->mfd < 0 || (drained && c->n_done >= c->n_fwd))) {
            door_append_error(h, c);
            door_close_mhd(h, c);
            more = true;
        }
        /* a client that shut its side down in the middle of a request (a head, a body, a chunk
         * it can no longer finish): that request will never be whole, so it gets the door's
         * 400 after the answers before it, and MHD's side is closed outright (MHD 0.9.75,
         * given only a read end mid-body, held the connection until idle_timeout_s) */
        if (c->cli_eof && c->mfd >= 0 && !c->err_status && c->state != DS_DROP &&
            !dbuf_size(&c->to_mhd) && (c->state != DS_HEAD || !only_blank_lines(&c->in))) {
            door_fail(c, 400, PROTO_CODE_BAD_REQUEST, c->route,
                      "the client shut down its side before the request was complete");
            more = true;
        }
        /* a client that shut its side down: MHD reads the end after the last whole request */
        if (c->cli_eof && c->mfd >= 0 && !c->mhd_wr_shut && !dbuf_size(&c->to_mhd) &&
            !c->err_status) {
            shutdown(c->mfd, SHUT_WR);
            c->mhd_wr_shut = true;
        }
        while (c->fd >= 0 && dbuf_size(&c->to_cli)) {
            ssize_t w = send(c->fd, c->to_cli.p + c->to_cli.off, dbuf_size(&c->to_cli),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) {
                dbuf_eat(&c->to_cli, (size_t)w);
                more = true;
            } else if (w < 0 && errno == EINTR) {
                continue;
            } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                break;
            } else {
                door_close_client(h, c);
                return;
            }
        }
        /* nothing more will be said to the client: end it, reading until its EOF so the last
         * answer is not lost to a reset */
        if (c->fd >= 0 && c->mfd < 0 && !c->err_status && !dbuf_size(&c->to_cli) &&
            (c->had_mhd || c->answered || c->cli_eof)) {
            if (c->cli_eof) {
                door_close_client(h, c);
                return;
            }
            if (!c->closing) {
                shutdown(c->fd, SHUT_WR);
                c->closing = true;
                c->deadline = tlmd_now() + DOOR_LINGER_S;
                more = true;
            }
        }
        if (!more) break;
    }
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
            door_pump(h, ev[i].data.ptr);
    door_reap(h);
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
            break;
        }
        door_conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        *c = probe;
        c->fd = fd;
        c->mfd = -1;
        c->state = DS_HEAD;
        c->route = routes_label_count() - 1;
        /* the first head's deadline counts from the accept (a client that sends nothing) */
        c->deadline = tlmd_now() + h->env->cfg.header_timeout_s;
        int one = 1; /* the door writes answers in pieces: no Nagle delay between them */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->next = h->door;
        if (h->door) h->door->prev = c;
        h->door = c;
        h->n_door++;
        h->n_head++;
        int same = 0;
        for (door_conn *o = c->next; o && same < h->env->cfg.max_connections_per_ip; o = o->next)
            same += o->fd >= 0 && same_ip(&o->addr, &c->addr);
        if (same >= h->env->cfg.max_connections_per_ip || h->n_door > h->max_conns) {
            h->refused++;
            door_fail(c, 503, PROTO_CODE_UNAVAILABLE, c->route,
                      same >= h->env->cfg.max_connections_per_ip
                          ? "too many connections from this address"
                          : "too many connections");
        }
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                                 .data.ptr = c};
        if (epoll_ctl(h->door_epfd, EPOLL_CTL_ADD, fd, &ev)) {
            door_close_client(h, c);
            continue;
        }
        door_pump(h, c); /* the head may already be there */
    }
    door_reap(h);
}

/* Four times a second: heads and bodies that did not arrive in time get 408; answered
 * connections that linger past their deadline are closed. */
static void on_door_timer(uv_timer_t *t)
{
    http_server *h = t->data;
    double now = tlmd_now();
    const tlmd_config *cfg = &h->env->cfg;
    for (door_conn *c = h->door, *next; c; c = next) {
        next = c->next;
        if (c->fd < 0 || !c->deadline || now < c->deadline) continue;
        if (c->closing) {
            door_close_client(h, c);
            continue;
        }
        if (c->state == DS_HEAD)
            door_fail(c, 408, PROTO_CODE_REQUEST_TIMEOUT, routes_label_count() - 1,
                      "the request head did not arrive within %g s", cfg->header_timeout_s);
        else
            door_fail(c, 408, PROTO_CODE_REQUEST_TIMEOUT, c->route,
                      "the request body did not arrive within %g s", cfg->body_timeout_s);
        door_pump(h, c);
    }
    door_reap(h);
}

/* MHD's connections start inside MHD_add_connection (door_hand_over) and end in MHD_run or
 * MHD_stop_daemon: the door connection is freed only after that. */
static void on_mhd_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe)
{
    http_server *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = h->adding;
        if (h->adding) h->adding->mhd_live = true;
        return;
    }
    door_conn *c = *socket_context;
    *socket_context = NULL;
    if (!c) return;
    c->mhd_live = false;
    door_maybe_free(h, c);
}

unsigned http_door_connections(const http_server *h)
{
    return h ? (unsigned)h->n_head : 0;
}

unsigned http_client_connections(const http_server *h)
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
    /* a connection MHD serves takes three descriptors: the client's and a socketpair */
    long room = ((long)nofile - 256) / 3;
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
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        door_conn *c = ci ? ci->socket_context : NULL;
        if (c) {
            c->n_done++;
            if (c->err_status && !c->woken) { /* the door's error may go now */
                c->woken = true;
                c->wnext = h->woken;
                h->woken = c;
            }
        }
    }
    http_req *r = *con_cls;
    if (!r) return;
    *con_cls = NULL;
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && r->status)
        metrics_answer_seconds(h->m, r->route, tlmd_now() - r->t_begin);
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
    h->door_open = false; /* stop accepting; first heads still in the door are dropped */
    uv_poll_stop(&h->listen_poll);
    close(h->listen_fd);
    h->listen_fd = -1;
    for (door_conn *c = h->door, *next; c; c = next) {
        next = c->next;
        if (!c->had_mhd) door_close_client(h, c);
    }
    door_reap(h);
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
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION,
        on_mhd_connection, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->idle_timeout_s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->max_conns, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)cfg->max_connections_per_ip, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(4 * HEAD_MAX + 65536), MHD_OPTION_UNESCAPE_CALLBACK, unescape, NULL,
        MHD_OPTION_END);
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
    /* the answers go out through the door: MHD writes them, the door passes them on */
    for (int i = 0; i < 3; i++) {
        MHD_run(s->mhd);
        for (door_conn *c = s->door, *next; c; c = next) {
            next = c->next;
            door_pump(s, c);
        }
    }
    http_quiesce(s);
    for (door_conn *c = s->door, *next; c; c = next) {
        next = c->next;
        door_close_client(s, c);
    }
    uv_poll_stop(&s->mhd_poll);
    uv_close((uv_handle_t *)&s->mhd_poll, noop_close);
    uv_close((uv_handle_t *)&s->mhd_timer, noop_close);
    uv_close((uv_handle_t *)&s->listen_poll, noop_close);
    uv_close((uv_handle_t *)&s->door_poll, noop_close);
    uv_close((uv_handle_t *)&s->door_timer, noop_close);
    close(s->door_epfd);
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
    door_reap(s);
}
