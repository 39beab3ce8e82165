/* server_load — a small HTTP/1.1 load generator for tlmd on loopback (bench/server.sh drives it).
 *
 * Plain sockets, one keep-alive connection per client thread, so the client's own cost per
 * request stays small next to the server's (no libcurl: the bench binaries do not link it).
 * Every loop is bounded (duration and request caps, 120 s socket timeouts) and it only ever
 * connects to 127.0.0.1.
 *
 *   server_load hit   --port P [--get PATH | --post PATH --body JSON] --conns N
 *                     [--duration S] [--max-requests R] [--warmup S]
 *       closed-loop load on N connections; prints one line
 *       "conns requests errors rps p50_ms p99_ms mean_ms".
 *   server_load once  --port P --body JSON
 *       one POST /v1/compile; prints "status latency_ms cache lookup_s queue_s decode_s
 *       codegen_s compile_s total_s key" for its first kernel (the kernel's "timing").
 *   server_load batch --port P --clients N --per-client M --template T [--template T ...]
 *                     [--base B]
 *       N threads each POST M compiles of distinct workloads: request i uses template
 *       i % ntemplates with every "{i}" replaced by B + i. The /metrics decoder batch-size
 *       histogram is read before and after; prints "clients requests errors wall_s p50_ms
 *       p99_ms steps mean_batch max_le b1 b2 b4 b8 b16 b32 b64 b128 binf" with the per-bucket
 *       step counts of this run (non-cumulative deltas).
 *   server_load mix   --port P --conns N --duration S --hit-frac F --get PATH --body JSON
 *                     --template T [--template T ...] [--base B] [--warmup S] [--pace-ms P]
 *       N closed-loop clients: a fraction F of them send cache hits (GET PATH and POST
 *       /v1/compile of BODY, a cached workload, in turn), the others misses (POST of a
 *       template with "{i}" replaced by B + a counter: a compile; closed-loop clients mixing
 *       both would all end up waiting on misses); a hit client starts a request at most every
 *       P ms (0: back to back); one more client GETs /metrics every 100 ms. Prints one JSON object:
 * counts, errors and p50/p99/max ms for hits (all, get, post), misses and /metrics. server_load get
 * --port P --get PATH     the body on stdout; exit 0 on 200, else 1. server_load port a free
 * loopback port (bound, then released). Exit status: 0, 1 on a failed request in once, 2 on usage
 * errors. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "compiler/util/util.h"

#define MAX_LAT 400000 /* latencies kept per thread (hit mode caps requests at this) */
#define MAX_TEMPLATES 16

/* ---- a keep-alive HTTP/1.1 connection ---- */

typedef struct {
    int fd;
    int port;
    char *in; /* bytes read past the previous response */
    size_t in_len, in_cap;
} conn;

typedef struct {
    int status;
    char *body; /* NUL-terminated */
    size_t len;
} reply;

static int conn_open(conn *c)
{
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval tv = {120, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof a)) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    c->in_len = 0;
    if (c->in) c->in[0] = 0;
    return 0;
}

static void conn_close(conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->in_len = 0;
    if (c->in) c->in[0] = 0;
}

/* Reads more bytes into c->in; 0 on EOF or error. */
static size_t conn_fill(conn *c)
{
    if (c->in_cap - c->in_len < 65536) {
        size_t cap = c->in_cap ? c->in_cap * 2 : 131072;
        char *p = realloc(c->in, cap + 1);
        if (!p) return 0;
        c->in = p;
        c->in_cap = cap;
    }
    ssize_t n;
    do
        n = read(c->fd, c->in + c->in_len, c->in_cap - c->in_len);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return 0;
    c->in_len += (size_t)n;
    c->in[c->in_len] = 0;
    return (size_t)n;
}

static void conn_consume(conn *c, size_t n)
{
    memmove(c->in, c->in + n, c->in_len - n);
    c->in_len -= n;
    c->in[c->in_len] = 0; /* the header search below is strstr */
}

static bool send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Value of a header in [h, end) (case-insensitive name), or NULL. */
static const char *find_header(const char *h, const char *end, const char *name)
{
    size_t nl = strlen(name);
    for (const char *l = h; l && l < end;) {
        if ((size_t)(end - l) > nl && !strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            return v;
        }
        l = strstr(l, "\r\n");
        if (l) l += 2;
    }
    return NULL;
}

/* Reads one response (Content-Length or chunked). 0 or -1 (connection unusable). */
static int read_reply(conn *c, reply *r, bool *close_after)
{
    char *hend;
    while (!c->in || !(hend = strstr(c->in, "\r\n\r\n")))
        if (!conn_fill(c)) return -1;
    size_t hlen = (size_t)(hend - c->in) + 4;
    if (sscanf(c->in, "HTTP/1.%*d %d", &r->status) != 1) return -1;
    const char *cl = find_header(c->in, hend, "Content-Length");
    const char *te = find_header(c->in, hend, "Transfer-Encoding");
    const char *cn = find_header(c->in, hend, "Connection");
    *close_after = cn && !strncasecmp(cn, "close", 5);
    bool chunked = te && !strncasecmp(te, "chunked", 7);
    free(r->body);
    r->body = NULL;
    r->len = 0;
    if (!chunked) {
        size_t n = cl ? strtoull(cl, NULL, 10) : 0;
        if (!cl && *close_after) { /* body until EOF */
            while (conn_fill(c))
                ;
            n = c->in_len - hlen;
        }
        while (c->in_len < hlen + n)
            if (!conn_fill(c)) return -1;
        r->body = malloc(n + 1);
        if (!r->body) return -1;
        memcpy(r->body, c->in + hlen, n);
        r->body[n] = 0;
        r->len = n;
        conn_consume(c, hlen + n);
        return 0;
    }
    conn_consume(c, hlen);
    size_t cap = 4096;
    r->body = malloc(cap);
    if (!r->body) return -1;
    for (;;) {
        char *le;
        while (!(le = strstr(c->in, "\r\n")))
            if (!conn_fill(c)) return -1;
        size_t sz = strtoull(c->in, NULL, 16);
        size_t off = (size_t)(le - c->in) + 2;
        while (c->in_len < off + sz + 2)
            if (!conn_fill(c)) return -1;
        if (r->len + sz + 1 > cap) {
            cap = (r->len + sz + 1) * 2;
            char *p = realloc(r->body, cap);
            if (!p) return -1;
            r->body = p;
        }
        memcpy(r->body + r->len, c->in + off, sz);
        r->len += sz;
        conn_consume(c, off + sz + 2);
        if (sz == 0) break; /* trailers are not used by tlmd */
    }
    r->body[r->len] = 0;
    return 0;
}

/* One request; reconnects once when a kept-alive connection was closed by the server. */
static int request(conn *c, const char *method, const char *path, const char *body, reply *r)
{
    char head[1024];
    size_t blen = body ? strlen(body) : 0;
    int hn;
    if (body)
        hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      method, path, c->port, blen);
    else
        hn = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n", method,
                      path, c->port);
    if (hn >= (int)sizeof head) return -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (c->fd < 0 && conn_open(c)) return -1;
        bool close_after = false;
        if (send_all(c->fd, head, (size_t)hn) && (!body || send_all(c->fd, body, blen)) &&
            read_reply(c, r, &close_after) == 0) {
            if (close_after) conn_close(c);
            return 0;
        }
        conn_close(c);
    }
    return -1;
}

/* ---- statistics ---- */

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p) /* v sorted */
{
    if (!n) return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

/* ---- options ---- */

typedef struct {
    int port;
    const char *method, *path, *body;
    int conns;
    double duration, warmup;
    long max_requests;
    int clients, per_client, base;
    const char *templates[MAX_TEMPLATES];
    int n_templates;
    double hit_frac;
    double pace_ms; /* mix: a hit client starts a request at most this often */
} opts;

static int usage(const char *msg)
{
    fprintf(stderr,
            "server_load: %s\nusage: server_load hit|once|batch|get|port --port P ... (see "
            "bench/server_load.c)\n",
            msg);
    return 2;
}

static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    o->method = "GET";
    o->conns = 1;
    o->duration = 5;
    o->warmup = 0.5;
    o->max_requests = 200000;
    o->clients = 1;
    o->per_client = 1;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return usage("an option lacks its value");
        i++;
        if (!strcmp(a, "--port"))
            o->port = atoi(v);
        else if (!strcmp(a, "--get"))
            o->method = "GET", o->path = v;
        else if (!strcmp(a, "--post"))
            o->method = "POST", o->path = v;
        else if (!strcmp(a, "--body"))
            o->body = v;
        else if (!strcmp(a, "--conns"))
            o->conns = atoi(v);
        else if (!strcmp(a, "--duration"))
            o->duration = atof(v);
        else if (!strcmp(a, "--warmup"))
            o->warmup = atof(v);
        else if (!strcmp(a, "--max-requests"))
            o->max_requests = atol(v);
        else if (!strcmp(a, "--clients"))
            o->clients = atoi(v);
        else if (!strcmp(a, "--per-client"))
            o->per_client = atoi(v);
        else if (!strcmp(a, "--base"))
            o->base = atoi(v);
        else if (!strcmp(a, "--pace-ms"))
            o->pace_ms = atof(v);
        else if (!strcmp(a, "--hit-frac"))
            o->hit_frac = atof(v);
        else if (!strcmp(a, "--template") && o->n_templates < MAX_TEMPLATES)
            o->templates[o->n_templates++] = v;
        else
            return usage("unknown option");
    }
    if (o->port <= 0 || o->port > 65535) return usage("--port must be 1..65535");
    if (o->conns < 1 || o->conns > 1024) return usage("--conns must be 1..1024");
    if (o->clients < 1 || o->clients > 1024) return usage("--clients must be 1..1024");
    if (o->per_client < 1 || o->per_client > 1000) return usage("--per-client must be 1..1000");
    if (o->duration <= 0 || o->duration > 600) return usage("--duration must be in (0, 600]");
    if (o->warmup < 0 || o->warmup > 60) return usage("--warmup must be in [0, 60]");
    if (o->max_requests < 1) return usage("--max-requests must be positive");
    return 0;
}

/* ---- hit: closed-loop load ---- */

typedef struct {
    const opts *o;
    conn c;
    double t_measure, t_end;
    double *lat;
    size_t n_lat;
    long errors;
    long budget;
} hit_thread;

static void *hit_main(void *arg)
{
    hit_thread *t = arg;
    reply r = {0, NULL, 0};
    while (t->budget > 0) {
        double t0 = tlm_now_s();
        if (t0 >= t->t_end) break;
        int rc = request(&t->c, t->o->method, t->o->path, t->o->body, &r);
        double t1 = tlm_now_s();
        if (t0 < t->t_measure) continue; /* warm-up: connections open, caches hot */
        t->budget--;
        if (rc || r.status != 200) {
            t->errors++;
            if (rc) usleep(10000); /* the server is gone or refusing: do not spin */
            continue;
        }
        if (t->n_lat < MAX_LAT) t->lat[t->n_lat++] = t1 - t0;
    }
    free(r.body);
    conn_close(&t->c);
    return NULL;
}

static int cmd_hit(const opts *o)
{
    if (!o->path) return usage("hit needs --get PATH or --post PATH");
    hit_thread *ts = calloc((size_t)o->conns, sizeof *ts);
    pthread_t *th = calloc((size_t)o->conns, sizeof *th);
    if (!ts || !th) return 2;
    double t0 = tlm_now_s();
    long per = o->max_requests / o->conns + 1;
    if (per > MAX_LAT) per = MAX_LAT;
    for (int i = 0; i < o->conns; i++) {
        ts[i].o = o;
        ts[i].c = (conn){-1, o->port, NULL, 0, 0};
        ts[i].t_measure = t0 + o->warmup;
        ts[i].t_end = t0 + o->warmup + o->duration;
        ts[i].budget = per;
        ts[i].lat = malloc((size_t)per * sizeof(double));
        if (!ts[i].lat) return 2;
        pthread_create(&th[i], NULL, hit_main, &ts[i]);
    }
    size_t n = 0;
    long errors = 0;
    for (int i = 0; i < o->conns; i++) {
        pthread_join(th[i], NULL);
        n += ts[i].n_lat;
        errors += ts[i].errors;
    }
    double t_meas_end = tlm_now_s();
    double span = t_meas_end - (t0 + o->warmup);
    double *all = malloc((n + 1) * sizeof *all), sum = 0;
    size_t k = 0;
    for (int i = 0; i < o->conns; i++) {
        for (size_t j = 0; j < ts[i].n_lat; j++) {
            all[k++] = ts[i].lat[j];
            sum += ts[i].lat[j];
        }
        free(ts[i].lat);
        free(ts[i].c.in);
    }
    qsort(all, n, sizeof *all, cmp_d);
    printf("%d %zu %ld %.1f %.3f %.3f %.3f\n", o->conns, n, errors, span > 0 ? (double)n / span : 0,
           1e3 * pct(all, n, 0.5), 1e3 * pct(all, n, 0.99), n ? 1e3 * sum / (double)n : 0);
    free(all);
    free(ts);
    free(th);
    return 0;
}

/* ---- once: one cold compile and its timing ---- */

static double jnum(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : -1;
}

static int cmd_once(const opts *o)
{
    if (!o->body) return usage("once needs --body");
    conn c = {-1, o->port, NULL, 0, 0};
    reply r = {0, NULL, 0};
    double t0 = tlm_now_s();
    int rc = request(&c, "POST", "/v1/compile", o->body, &r);
    double lat = tlm_now_s() - t0;
    conn_close(&c);
    free(c.in);
    if (rc || r.status != 200) {
        fprintf(stderr, "server_load once: status %d: %.300s\n", rc ? 0 : r.status,
                r.body ? r.body : "(no answer)");
        free(r.body);
        return 1;
    }
    json_t *j = json_loads(r.body, 0, NULL);
    json_t *k = json_array_get(json_object_get(j, "kernels"), 0);
    json_t *tm = json_object_get(k, "timing");
    const char *cache = json_string_value(json_object_get(k, "cache"));
    const char *key = json_string_value(json_object_get(k, "key"));
    printf("%d %.3f %s %.6f %.6f %.6f %.6f %.6f %.6f %s\n", r.status, 1e3 * lat,
           cache ? cache : "?", jnum(tm, "lookup_s"), jnum(tm, "queue_s"), jnum(tm, "decode_s"),
           jnum(tm, "codegen_s"), jnum(tm, "compile_s"), jnum(tm, "total_s"), key ? key : "-");
    json_decref(j);
    free(r.body);
    return 0;
}

/* ---- batch: concurrent distinct cold compiles, decoder batch histogram deltas ---- */

static const char *const batch_le[] = {"1", "2", "4", "8", "16", "32", "64", "128", "+Inf"};
#define N_LE 9

typedef struct {
    double bucket[N_LE]; /* cumulative, as exposed */
    double sum, count, max;
} batch_hist;

static double metric_value(const char *text, const char *name)
{
    size_t nl = strlen(name);
    for (const char *l = text; l && *l;) {
        if (!strncmp(l, name, nl) && l[nl] == ' ') return strtod(l + nl + 1, NULL);
        l = strchr(l, '\n');
        if (l) l++;
    }
    return -1;
}

static int read_hist(int port, batch_hist *h)
{
    conn c = {-1, port, NULL, 0, 0};
    reply r = {0, NULL, 0};
    int rc = request(&c, "GET", "/metrics", NULL, &r);
    conn_close(&c);
    free(c.in);
    if (rc || r.status != 200) {
        free(r.body);
        return -1;
    }
    for (int i = 0; i < N_LE; i++) {
        char name[96];
        snprintf(name, sizeof name, "tlmd_decoder_batch_size_bucket{le=\"%s\"}", batch_le[i]);
        h->bucket[i] = metric_value(r.body, name);
    }
    h->sum = metric_value(r.body, "tlmd_decoder_batch_size_sum");
    h->count = metric_value(r.body, "tlmd_decoder_batch_size_count");
    h->max = metric_value(r.body, "tlmd_decoder_batch_size_max");
    free(r.body);
    return h->count < 0 ? -1 : 0;
}

typedef struct {
    const opts *o;
    int index;
    double *lat;
    int n_lat;
    int errors;
} batch_thread;

/* The template with every "{i}" replaced by n. */
static char *expand(const char *t, int n)
{
    char num[16];
    int nn = snprintf(num, sizeof num, "%d", n);
    size_t cap = strlen(t) * 2 + 64, len = 0;
    char *o = malloc(cap);
    if (!o) return NULL;
    for (const char *p = t; *p;) {
        if (len + (size_t)nn + 2 >= cap) {
            cap *= 2;
            char *q = realloc(o, cap);
            if (!q) {
                free(o);
                return NULL;
            }
            o = q;
        }
        if (!strncmp(p, "{i}", 3)) {
            memcpy(o + len, num, (size_t)nn);
            len += (size_t)nn;
            p += 3;
        } else {
            o[len++] = *p++;
        }
    }
    o[len] = 0;
    return o;
}

static void *batch_main(void *arg)
{
    batch_thread *t = arg;
    const opts *o = t->o;
    conn c = {-1, o->port, NULL, 0, 0};
    reply r = {0, NULL, 0};
    for (int m = 0; m < o->per_client; m++) {
        int i = t->index * o->per_client + m;
        char *body = expand(o->templates[i % o->n_templates], o->base + i);
        double t0 = tlm_now_s();
        int rc = body ? request(&c, "POST", "/v1/compile", body, &r) : -1;
        double t1 = tlm_now_s();
        if (rc || r.status != 200) {
            if (t->errors++ == 0)
                fprintf(stderr, "server_load batch: status %d: %.300s\n", rc ? 0 : r.status,
                        !rc && r.body ? r.body : "(no answer)");
        } else {
            t->lat[t->n_lat++] = t1 - t0;
        }
        free(body);
    }
    free(r.body);
    conn_close(&c);
    free(c.in);
    return NULL;
}

static int cmd_batch(const opts *o)
{
    if (!o->n_templates) return usage("batch needs at least one --template");
    batch_hist h0, h1;
    if (read_hist(o->port, &h0)) {
        fprintf(stderr, "server_load batch: cannot read /metrics\n");
        return 1;
    }
    batch_thread *ts = calloc((size_t)o->clients, sizeof *ts);
    pthread_t *th = calloc((size_t)o->clients, sizeof *th);
    if (!ts || !th) return 2;
    double t0 = tlm_now_s();
    for (int i = 0; i < o->clients; i++) {
        ts[i] = (batch_thread){o, i, calloc((size_t)o->per_client, sizeof(double)), 0, 0};
        pthread_create(&th[i], NULL, batch_main, &ts[i]);
    }
    int errors = 0, n = 0;
    for (int i = 0; i < o->clients; i++) {
        pthread_join(th[i], NULL);
        errors += ts[i].errors;
    }
    double wall = tlm_now_s() - t0;
    double *all = malloc(((size_t)o->clients * (size_t)o->per_client + 1) * sizeof *all);
    for (int i = 0; i < o->clients; i++) {
        for (int j = 0; j < ts[i].n_lat; j++)
            all[n++] = ts[i].lat[j];
        free(ts[i].lat);
    }
    qsort(all, (size_t)n, sizeof *all, cmp_d);
    if (read_hist(o->port, &h1)) {
        fprintf(stderr, "server_load batch: cannot read /metrics\n");
        return 1;
    }
    double steps = h1.count - h0.count;
    /* the largest bucket this run added steps to (the exposed max is process-wide) */
    const char *max_le = "-";
    double per[N_LE];
    for (int i = 0; i < N_LE; i++) {
        double cum1 = h1.bucket[i] - h0.bucket[i];
        double cum0 = i ? h1.bucket[i - 1] - h0.bucket[i - 1] : 0;
        per[i] = cum1 - cum0;
        if (per[i] > 0) max_le = batch_le[i];
    }
    printf("%d %d %d %.3f %.3f %.3f %.0f %.2f %s", o->clients, n, errors, wall,
           1e3 * pct(all, (size_t)n, 0.5), 1e3 * pct(all, (size_t)n, 0.99), steps,
           steps > 0 ? (h1.sum - h0.sum) / steps : 0, max_le);
    for (int i = 0; i < N_LE; i++)
        printf(" %.0f", per[i]);
    printf("\n");
    free(all);
    free(ts);
    free(th);
    return 0;
}

/* ---- mix: hits among misses, and /metrics, at once ---- */

enum { MX_GET, MX_POST, MX_MISS, MX_METRICS, MX_N };
static const char *const mx_names[MX_N] = {"get", "post", "miss", "metrics"};

typedef struct {
    const opts *o;
    int index;
    double t_measure, t_end;
    double *lat[MX_N];
    size_t n[MX_N], cap[MX_N];
    long errors[MX_N];
} mix_thread;

static int mix_counter;

static void mix_add(mix_thread *t, int kind, double s)
{
    if (t->n[kind] == t->cap[kind]) {
        size_t cap = t->cap[kind] ? t->cap[kind] * 2 : 1024;
        double *p = realloc(t->lat[kind], cap * sizeof *p);
        if (!p) return;
        t->lat[kind] = p;
        t->cap[kind] = cap;
    }
    t->lat[kind][t->n[kind]++] = s;
}

static void *mix_main(void *arg)
{
    mix_thread *t = arg;
    const opts *o = t->o;
    conn c = {-1, o->port, NULL, 0, 0};
    reply r = {0, NULL, 0};
    bool sampler = t->index < 0;
    bool hitter = t->index < (int)(o->hit_frac * o->conns + 0.5);
    unsigned seed = 0x9e3779b9u * (unsigned)(t->index + 2);
    if (hitter && o->pace_ms > 0) usleep((useconds_t)(o->pace_ms * 1e3 * rand_r(&seed) / RAND_MAX));
    int turn = t->index;
    while (tlm_now_s() < t->t_end) {
        int kind;
        char *body = NULL;
        if (sampler) {
            kind = MX_METRICS;
        } else if (hitter) {
            kind = turn++ % 2 ? MX_POST : MX_GET;
        } else {
            kind = MX_MISS;
            int i = __atomic_fetch_add(&mix_counter, 1, __ATOMIC_RELAXED);
            body = expand(o->templates[i % o->n_templates], o->base + i);
        }
        double t0 = tlm_now_s();
        int rc = kind == MX_METRICS ? request(&c, "GET", "/metrics", NULL, &r)
                 : kind == MX_GET   ? request(&c, "GET", o->path, NULL, &r)
                 : kind == MX_POST  ? request(&c, "POST", "/v1/compile", o->body, &r)
                                    : request(&c, "POST", "/v1/compile", body, &r);
        double t1 = tlm_now_s();
        free(body);
        if (rc || r.status != 200 ||
            (kind == MX_POST && (!r.body || !strstr(r.body, "\"cache\":\"hit\"")))) {
            if (t0 >= t->t_measure && t->errors[kind]++ == 0 && t->index == 0)
                fprintf(stderr, "server_load mix: %s: status %d: %.300s\n", mx_names[kind],
                        rc ? 0 : r.status, !rc && r.body ? r.body : "(no answer)");
            if (rc) usleep(10000);
        } else if (t0 >= t->t_measure && t1 <= t->t_end) {
            mix_add(t, kind, t1 - t0);
        }
        /* paced hit clients start out of phase and jitter (uniform in [0.5, 1.5] x pace), or
         * they would arrive in bursts of all of them at once */
        double next = t0 + (sampler  ? 0.1
                            : hitter ? o->pace_ms / 1e3 * (0.5 + (double)rand_r(&seed) / RAND_MAX)
                                     : 0);
        double now = tlm_now_s();
        if (next > now) usleep((useconds_t)((next - now) * 1e6));
    }
    free(r.body);
    conn_close(&c);
    free(c.in);
    return NULL;
}

static void mix_print(const char *name, double *v, size_t n, long errors, bool comma)
{
    qsort(v, n, sizeof *v, cmp_d);
    printf("\"%s\": {\"n\": %zu, \"errors\": %ld, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
           "\"max_ms\": %.3f}%s",
           name, n, errors, 1e3 * pct(v, n, 0.5), 1e3 * pct(v, n, 0.99), n ? 1e3 * v[n - 1] : 0.0,
           comma ? ", " : "");
}

static int cmd_mix(const opts *o)
{
    if (!o->path || !o->body || !o->n_templates)
        return usage("mix needs --get PATH, --body JSON (a cached workload) and --template");
    int n = o->conns + 1;
    mix_thread *ts = calloc((size_t)n, sizeof *ts);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    if (!ts || !th) return 2;
    double t0 = tlm_now_s();
    for (int i = 0; i < n; i++) {
        ts[i].o = o;
        ts[i].index = i < o->conns ? i : -1; /* the last one samples /metrics */
        ts[i].t_measure = t0 + o->warmup;
        ts[i].t_end = t0 + o->warmup + o->duration;
        pthread_create(&th[i], NULL, mix_main, &ts[i]);
    }
    size_t tot[MX_N] = {0};
    long err[MX_N] = {0};
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        for (int k = 0; k < MX_N; k++) {
            tot[k] += ts[i].n[k];
            err[k] += ts[i].errors[k];
        }
    }
    double *all[MX_N], *hits = malloc((tot[MX_GET] + tot[MX_POST] + 1) * sizeof(double));
    size_t nh = 0;
    for (int k = 0; k < MX_N; k++) {
        all[k] = malloc((tot[k] + 1) * sizeof(double));
        size_t m = 0;
        for (int i = 0; i < n; i++)
            for (size_t j = 0; j < ts[i].n[k]; j++) {
                all[k][m++] = ts[i].lat[k][j];
                if (k == MX_GET || k == MX_POST) hits[nh++] = ts[i].lat[k][j];
            }
    }
    printf("{\"clients\": %d, \"seconds\": %.1f, \"hit_frac\": %.2f, \"pace_ms\": %g, ", o->conns,
           o->duration, o->hit_frac, o->pace_ms);
    mix_print("hit", hits, nh, err[MX_GET] + err[MX_POST], true);
    for (int k = 0; k < MX_N; k++)
        mix_print(mx_names[k], all[k], tot[k], err[k], k + 1 < MX_N);
    printf("}\n");
    for (int k = 0; k < MX_N; k++) {
        free(all[k]);
        for (int i = 0; i < n; i++)
            free(ts[i].lat[k]);
    }
    free(hits);
    free(ts);
    free(th);
    return 0;
}

/* ---- get: one GET, the body on stdout; port: a free loopback port ---- */

static int cmd_get(const opts *o)
{
    if (!o->path) return usage("get needs --get PATH");
    conn c = {-1, o->port, NULL, 0, 0};
    reply r = {0, NULL, 0};
    int rc = request(&c, "GET", o->path, NULL, &r);
    conn_close(&c);
    free(c.in);
    if (!rc) fwrite(r.body, 1, r.len, stdout);
    free(r.body);
    return !rc && r.status == 200 ? 0 : 1;
}

static int cmd_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) ||
        getsockname(s, (struct sockaddr *)&a, &len))
        return 1;
    close(s);
    printf("%d\n", ntohs(a.sin_port));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage("no command");
    if (!strcmp(argv[1], "port")) return cmd_port();
    opts o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    if (!strcmp(argv[1], "get")) return cmd_get(&o);
    if (!strcmp(argv[1], "hit")) return cmd_hit(&o);
    if (!strcmp(argv[1], "once")) return cmd_once(&o);
    if (!strcmp(argv[1], "batch")) return cmd_batch(&o);
    if (!strcmp(argv[1], "mix")) return cmd_mix(&o);
    return usage("unknown command (hit, once, batch, mix, get, port)");
}
