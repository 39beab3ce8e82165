/* http.c — libmicrohttpd driven by the libuv loop (DESIGN §9): MHD runs with MHD_USE_EPOLL |
 * MHD_ALLOW_SUSPEND_RESUME and no thread of its own; a uv_poll_t watches MHD's epoll fd,
 * MHD_run follows every wake-up and a uv_timer is re-armed from MHD_get_timeout after every
 * run. Requests that wait for work are suspended and resumed by http_reply_* (then MHD runs
 * once more: 0.9.75 needs that explicit run after a resume). NDJSON streams use a content
 * reader that suspends its connection whenever it has nothing to send. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "daemon/tlmd.h"
#include "proto/error.h"

struct http_server {
    const tlmd_env *env;
    metrics *m;
    http_handlers hd;
    struct MHD_Daemon *mhd;
    int listen_fd_activated; /* from systemd, -1 if none */
    int port;
    uv_poll_t mhd_poll;
    uv_timer_t mhd_timer;
    bool in_mhd, need_kick;
    http_req *reqs; /* live requests (to resume them all at shutdown) */
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
    if (!h || !h->mhd) return;
    MHD_socket fd = MHD_quiesce_daemon(h->mhd); /* stop accepting */
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void http_free(http_server *h)
{
    free(h);
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
    } else if (inet_pton(AF_INET, cfg->listen_addr, &sa.sin_addr) != 1) {
        return tlm_err_set(err, TLM_EINVAL, "listen",
                           "\"%s\" is not an IPv4 address (e.g. 127.0.0.1 or 0.0.0.0)",
                           cfg->listen_addr);
    }
    unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (s->listen_fd_activated >= 0)
        s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
                                  mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET,
                                  (MHD_socket)s->listen_fd_activated, MHD_OPTION_NOTIFY_COMPLETED,
                                  on_completed, s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                                  MHD_OPTION_END);
    else
        s->mhd = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s,
                                  MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR,
                                  (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED, on_completed,
                                  s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                                  MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)256, MHD_OPTION_END);
    if (!s->mhd)
        return tlm_err_set(err, TLM_EIO, "listen", "cannot listen on %s:%d (in use?)",
                           cfg->listen_addr, cfg->port);
    const union MHD_DaemonInfo *pi = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = pi && pi->port ? pi->port : cfg->port;
    const union MHD_DaemonInfo *ei = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_EPOLL_FD);
    if (!ei) {
        MHD_stop_daemon(s->mhd);
        s->mhd = NULL;
        return tlm_err_set(err, TLM_EIO, "", "libmicrohttpd has no epoll fd");
    }
    uv_poll_init(s->env->loop, &s->mhd_poll, ei->epoll_fd);
    s->mhd_poll.data = s;
    uv_poll_start(&s->mhd_poll, UV_READABLE, on_mhd_poll);
    uv_timer_init(s->env->loop, &s->mhd_timer);
    s->mhd_timer.data = s;
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
    uv_poll_stop(&s->mhd_poll);
    uv_close((uv_handle_t *)&s->mhd_poll, noop_close);
    uv_close((uv_handle_t *)&s->mhd_timer, noop_close);
    MHD_stop_daemon(s->mhd);
    s->mhd = NULL;
}
