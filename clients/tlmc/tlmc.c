/* tlmc — the command-line client of tlmd (DESIGN §10b), C + libcurl + jansson.
 *
 *   tlmc [--server URL] [--token TOKEN] compile (--workload W | --onnx FILE | --model NAME [--batch
 * B]
 *        [--image-size S] [--seq-len L] | --graph FILE) --target T [-o DIR] [--stream]
 *   tlmc get KEY [-o FILE]      tlmc stats      tlmc health
 *
 * Contract:
 *  - The server is --server, else $TLMC_SERVER, else http://127.0.0.1:8470; the bearer token
 *    --token, else $TLMC_TOKEN (sent only when set).
 *  - compile always asks for the NDJSON stream: its events feed a progress bar on a terminal
 *    (stderr), one plain line per kernel otherwise. --stream also copies every event, one
 *    JSON object per line, to stdout (for pipelines); without it stdout gets one summary line.
 *  - With -o DIR every kernel is fetched after the job is done and written as
 *    NNN_<op>.so|.cubin (checked against its SHA-256), NNN_<op>.c|.cu (source) and
 *    NNN_<op>.json (the server's meta plus index, node, occurrences); NNN is the kernel's
 *    index in the answer. DIR/manifest.json (written last, atomically) lists the model or
 *    graph, the target, per subgraph its files, entry, launch config and occurrences, and
 *    for graphs and models the execution plan (proto/graph.md) that `tlm run --plan DIR` runs.
 *  - Exit status: 0 success; 1 the work failed (server unreachable, compile or server error,
 *    I/O); 2 bad usage or bad input (including the server's 4xx answers: invalid field,
 *    unsupported, unknown key, token refused). Messages go to stderr, one line each.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "compiler/util/util.h"

enum { EXIT_WORK = 1, EXIT_USAGE = 2 };

static const char usage_text[] =
    "usage: tlmc [--server URL] [--token TOKEN] COMMAND ...\n"
    "  compile (--workload W | --model NAME [--batch B] [--image-size S] [--seq-len L]\n"
    "          | --graph FILE | --onnx MODEL.onnx) --target T [-o DIR] [--stream]\n"
    "          [--mode generate|default|topk|tune] [--trials N] [--seconds S]\n"
    "          [--strategy evolutionary|random]\n"
    "      W: a workload as inline JSON (an object or an array of them) or @file.json\n"
    "      FILE: a graph document (proto/graph.md); - reads stdin\n"
    "      MODEL.onnx: sent base64-encoded (the server's max_body_bytes bounds its size)\n"
    "      -o DIR: write every kernel (binary, source, meta) and DIR/manifest.json\n"
    "      --stream: copy the server's NDJSON events to stdout\n"
    "      --mode tune: the measured search; --trials / --seconds are the budget of the whole\n"
    "      request (a model's kernels share it), progress is printed per round\n"
    "  get KEY [-o FILE]   the kernel binary (to FILE, or to stdout when it is not a terminal)\n"
    "  stats               the server's cache statistics (JSON)\n"
    "  health              exit 0 when the server is healthy and ready\n"
    "environment: TLMC_SERVER (default http://127.0.0.1:8470), TLMC_TOKEN\n"
    "exit status: 0 success, 1 the work failed, 2 bad usage or bad input\n";

static struct {
    char server[1024];
    const char *token;
    bool tty; /* stderr is a terminal: draw the progress bar */
} g;

static int fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("tlmc: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return code;
}

/* ---- HTTP ---- */

typedef struct {
    char *p;
    size_t n;
} buf;

static size_t buf_add(char *d, size_t sz, size_t nm, void *u)
{
    buf *b = u;
    size_t n = sz * nm;
    char *p = realloc(b->p, b->n + n + 1);
    if (!p) return 0;
    memcpy(p + b->n, d, n);
    b->p = p;
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

/* The server's statuses for bad input; everything else that is not 2xx is a failed job. */
static int exit_for_status(long status)
{
    switch (status) {
    case 400:
    case 401:
    case 404:
    case 405:
    case 413:
    case 415:
    case 422:
        return EXIT_USAGE;
    default:
        return EXIT_WORK;
    }
}

/* Prints the server's error body {"error": {code, message, field}} (or the raw text). */
static int server_error(long status, const char *body, size_t n)
{
    json_t *j = body && n ? json_loadb(body, n, 0, NULL) : NULL;
    json_t *e = json_object_get(j, "error"); /* an error body, or an "error" event */
    if (e) {
        const char *field = json_string_value(json_object_get(e, "field"));
        fail(0, "server answered %ld %s%s%s: %s", status,
             json_string_value(json_object_get(e, "code")), field && *field ? " at " : "",
             field && *field ? field : "", json_string_value(json_object_get(e, "message")));
    } else {
        fail(0, "server answered %ld: %.300s", status, body && n ? body : "(no body)");
    }
    json_decref(j);
    return exit_for_status(status);
}

static CURL *easy(const char *path, struct curl_slist **hl)
{
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    char url[2048];
    snprintf(url, sizeof url, "%s%s", g.server, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "tlmc/0.1");
    *hl = NULL;
    if (g.token) {
        char h[1100];
        snprintf(h, sizeof h, "Authorization: Bearer %s", g.token);
        *hl = curl_slist_append(*hl, h);
    }
    return c;
}

/* GET path → body (and headers when asked). Returns 0 with *status set, or EXIT_WORK when
 * the server cannot be reached (message printed). */
static int http_get(const char *path, buf *body, buf *headers, long *status)
{
    struct curl_slist *hl;
    CURL *c = easy(path, &hl);
    if (!c) return fail(EXIT_WORK, "out of memory");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, buf_add);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
    if (headers) {
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, buf_add);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, headers);
    }
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 300L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    CURLcode rc = curl_easy_perform(c);
    *status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK)
        return fail(EXIT_WORK, "cannot reach %s%s: %s", g.server, path, curl_easy_strerror(rc));
    return 0;
}

static const char *header_value(const buf *h, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (char *l = h->p; l && *l;) {
        char *e = strchr(l, '\n');
        if (!strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ')
                v++;
            size_t len = e ? (size_t)(e - v) : strlen(v);
            while (len && (v[len - 1] == '\r' || v[len - 1] == '\n'))
                len--;
            snprintf(out, cap, "%.*s", (int)len, v);
            return out;
        }
        l = e ? e + 1 : NULL;
    }
    return NULL;
}

/* ---- files ---- */

static int write_file(const char *path, const void *p, size_t n)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return fail(EXIT_WORK, "cannot write %s: %s", tmp, strerror(errno));
    bool ok = fwrite(p, 1, n, f) == n;
    ok &= fclose(f) == 0;
    /* rename: a reader never sees half a kernel or half a manifest */
    if (!ok || rename(tmp, path)) {
        unlink(tmp);
        return fail(EXIT_WORK, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

static int mkdir_p(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(p, 0755) && errno != EEXIST) return -1;
        *s = '/';
    }
    if (mkdir(p, 0755) && errno != EEXIST) return -1;
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

static int read_all(const char *path, buf *b)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) return -1;
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        if (buf_add(chunk, 1, n, b) != n) break;
    bool err = ferror(f);
    if (f != stdin) fclose(f);
    return err ? -1 : 0;
}

/* ---- compile: the stream ---- */

typedef struct {
    long status;
    bool ndjson;    /* a 200 stream; anything else is one error body */
    bool echo;      /* --stream: events to stdout */
    buf line, body; /* the partial line; a non-stream body */
    int total, done, hits, misses;
    json_t **kernels; /* by index: the kernel objects */
    json_t *model, *target, *stats, *error;
    json_t *plan; /* graph and model answers: the execution plan (done event) */
    char job[32];
    double t0;
    bool ok, failed;
    CURL *c;
} stream;

static void progress(stream *s, const json_t *k)
{
    const char *node = json_string_value(json_object_get(k, "node"));
    const char *op = json_string_value(json_object_get(json_object_get(k, "workload"), "op"));
    if (!node || !*node) node = op ? op : "";
    double t = tlm_now_s() - s->t0;
    if (g.tty) {
        int width = 30, fill = s->total ? s->done * width / s->total : 0;
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r\033[K[%s] %d/%d  %d hit  %d miss  %.1fs  %.40s", bar, s->done, s->total,
                s->hits, s->misses, t, node);
        if (s->done == s->total) fputc('\n', stderr);
    } else {
        json_int_t occ = json_integer_value(json_object_get(k, "occurrences"));
        fprintf(stderr, "kernel %d/%d %s %s %s", s->done, s->total,
                json_string_value(json_object_get(k, "cache")), op ? op : "?", node);
        if (occ > 0) fprintf(stderr, " x%lld", (long long)occ);
        fprintf(stderr, " %.1fs\n", t);
    }
}

static void on_event(stream *s, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "event"));
    if (!type) return;
    if (!strcmp(type, "accepted")) {
        s->total = (int)json_integer_value(json_object_get(ev, "kernels"));
        snprintf(s->job, sizeof s->job, "%s", json_string_value(json_object_get(ev, "job")));
        if (s->total > 0 && s->total < (1 << 20) && !s->kernels)
            s->kernels = calloc((size_t)s->total, sizeof *s->kernels);
        json_decref(s->model);
        s->model = json_incref(json_object_get(ev, "model"));
        s->target = json_incref(json_object_get(ev, "target"));
        if (!g.tty)
            fprintf(stderr, "job %s: %d kernels for %s\n", s->job, s->total,
                    json_string_value(json_object_get(s->target, "name")));
    } else if (!strcmp(type, "progress")) {
        /* tune: one line per measured round of a kernel */
        json_t *b = json_object_get(ev, "best_ms"), *f0 = json_object_get(ev, "first_ms");
        if (g.tty) fputs("\r\033[K", stderr);
        fprintf(stderr, "tune kernel %lld: %lld trials of %lld, best %.4g ms (start %.4g ms) %.0fs\n",
                (long long)json_integer_value(json_object_get(ev, "index")),
                (long long)json_integer_value(json_object_get(ev, "trial")),
                (long long)json_integer_value(json_object_get(ev, "trials")),
                json_is_number(b) ? json_number_value(b) : NAN,
                json_is_number(f0) ? json_number_value(f0) : NAN,
                json_number_value(json_object_get(ev, "elapsed_s")));
    } else if (!strcmp(type, "kernel")) {
        int idx = (int)json_integer_value(json_object_get(ev, "index"));
        json_t *k = json_object_get(ev, "kernel");
        if (!s->kernels || idx < 0 || idx >= s->total || s->kernels[idx] || !k) return;
        s->kernels[idx] = json_incref(k);
        s->done++;
        const char *cache = json_string_value(json_object_get(k, "cache"));
        if (cache && !strcmp(cache, "hit"))
            s->hits++;
        else
            s->misses++;
        progress(s, k);
    } else if (!strcmp(type, "done")) {
        s->stats = json_incref(json_object_get(ev, "stats"));
        if (json_object_get(ev, "model")) {
            json_decref(s->model);
            s->model = json_incref(json_object_get(ev, "model"));
        }
        json_decref(s->plan);
        s->plan = json_incref(json_object_get(ev, "plan"));
        s->ok = true;
    } else if (!strcmp(type, "error")) {
        s->error = json_incref(ev);
        s->failed = true;
    }
}

static size_t on_stream(char *d, size_t sz, size_t nm, void *u)
{
    stream *s = u;
    size_t n = sz * nm;
    if (!s->status) {
        curl_easy_getinfo(s->c, CURLINFO_RESPONSE_CODE, &s->status);
        char *ct = NULL;
        curl_easy_getinfo(s->c, CURLINFO_CONTENT_TYPE, &ct);
        s->ndjson = s->status == 200 && ct && strstr(ct, "ndjson");
    }
    if (!s->ndjson) return buf_add(d, sz, nm, &s->body);
    if (buf_add(d, sz, nm, &s->line) != n) return 0;
    char *start = s->line.p, *nl;
    while ((nl = memchr(start, '\n', s->line.n - (size_t)(start - s->line.p)))) {
        size_t len = (size_t)(nl - start);
        if (s->echo) {
            fwrite(start, 1, len + 1, stdout);
            fflush(stdout);
        }
        json_t *ev = json_loadb(start, len, 0, NULL);
        if (ev) on_event(s, ev);
        json_decref(ev);
        start = nl + 1;
    }
    size_t rest = s->line.n - (size_t)(start - s->line.p);
    memmove(s->line.p, start, rest);
    s->line.n = rest;
    return n;
}

static void stream_free(stream *s)
{
    for (int i = 0; s->kernels && i < s->total; i++)
        json_decref(s->kernels[i]);
    free(s->kernels);
    free(s->line.p);
    free(s->body.p);
    json_decref(s->model);
    json_decref(s->target);
    json_decref(s->stats);
    json_decref(s->error);
    json_decref(s->plan);
}

/* ---- compile: the files ---- */

/* "000_conv2d": the index, zero-padded to the width of the largest, and the op name. */
static void kernel_stem(int i, int total, const json_t *k, char *out, size_t cap)
{
    int width = 3; /* totals are below 2^20 (on_event): at most 7 digits */
    for (int t = total - 1; t >= 1000 && width < 7; t /= 10)
        width++;
    const char *op = json_string_value(json_object_get(json_object_get(k, "workload"), "op"));
    char safe[40];
    size_t n = 0;
    for (const char *p = op ? op : "kernel"; *p && n + 1 < sizeof safe; p++)
        safe[n++] = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_' ? *p : '_';
    safe[n] = 0;
    char num[16];
    static const char *const pad[] = {"%03d", "%04d", "%05d", "%06d", "%07d"};
    snprintf(num, sizeof num, pad[width - 3], i & 0xfffff);
    snprintf(out, cap, "%s_%s", num, safe);
}

static int fetch_kernel(const char *dir, int i, int total, json_t *k, json_t *entry)
{
    const char *url = json_string_value(json_object_get(k, "url"));
    const char *fmt = json_string_value(json_object_get(k, "format"));
    const char *sha = json_string_value(json_object_get(k, "binary_sha256"));
    if (!url || !fmt || !sha) return fail(EXIT_WORK, "kernel %d: the answer lacks url/format", i);
    bool cubin = !strcmp(fmt, "cubin");
    char stem[64], path[4200], p2[300];
    kernel_stem(i, total, k, stem, sizeof stem);
    long st;
    int rc;
    /* binary */
    buf b = {0};
    if ((rc = http_get(url, &b, NULL, &st))) return rc;
    if (st != 200) {
        rc = server_error(st, b.p, b.n);
        free(b.p);
        return rc == EXIT_USAGE ? EXIT_WORK : rc;
    }
    char hex[65];
    tlm_sha256_hex(b.p ? b.p : "", b.n, hex);
    if (strcmp(hex, sha)) {
        free(b.p);
        return fail(EXIT_WORK, "kernel %d: the binary's SHA-256 %s is not %s", i, hex, sha);
    }
    char bin_name[80], src_name[80], meta_name[80];
    snprintf(bin_name, sizeof bin_name, "%s.%s", stem, cubin ? "cubin" : "so");
    snprintf(src_name, sizeof src_name, "%s.%s", stem, cubin ? "cu" : "c");
    snprintf(meta_name, sizeof meta_name, "%s.json", stem);
    snprintf(path, sizeof path, "%s/%s", dir, bin_name);
    rc = write_file(path, b.p ? b.p : "", b.n);
    free(b.p);
    if (rc) return rc;
    /* source */
    buf s = {0};
    snprintf(p2, sizeof p2, "%s/source", url);
    if ((rc = http_get(p2, &s, NULL, &st))) return rc;
    if (st == 200) {
        snprintf(path, sizeof path, "%s/%s", dir, src_name);
        rc = write_file(path, s.p ? s.p : "", s.n);
    } else {
        server_error(st, s.p, s.n);
        rc = EXIT_WORK; /* the kernel was just compiled: a missing source is the server's fault */
    }
    free(s.p);
    if (rc) return rc;
    /* meta, with what only this answer knows */
    buf m = {0};
    snprintf(p2, sizeof p2, "%s/meta", url);
    if ((rc = http_get(p2, &m, NULL, &st))) return rc;
    json_t *mj = st == 200 ? json_loadb(m.p, m.n, 0, NULL) : NULL;
    free(m.p);
    if (!mj) return fail(EXIT_WORK, "kernel %d: GET %s answered %ld", i, p2, st);
    json_object_set_new(mj, "index", json_integer(i));
    if (json_object_get(k, "occurrences"))
        json_object_set(mj, "occurrences", json_object_get(k, "occurrences"));
    if (json_object_get(k, "node")) json_object_set(mj, "node", json_object_get(k, "node"));
    char *text = json_dumps(mj, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(mj);
    if (!text) return fail(EXIT_WORK, "out of memory");
    snprintf(path, sizeof path, "%s/%s", dir, meta_name);
    rc = write_file(path, text, strlen(text));
    free(text);
    if (rc) return rc;
    json_object_set_new(entry, "binary", json_string(bin_name));
    json_object_set_new(entry, "source", json_string(src_name));
    json_object_set_new(entry, "meta", json_string(meta_name));
    return 0;
}

static json_t *manifest_entry(int i, const json_t *k)
{
    json_t *e = json_pack("{s:i}", "index", i);
    static const char *const keys[] = {"node",
                                       "occurrences",
                                       "workload",
                                       "workload_hash",
                                       "key",
                                       "cache",
                                       "entry",
                                       "format",
                                       "launch",
                                       "binary_sha256",
                                       "binary_size",
                                       "url",
                                       "schedule_source",
                                       NULL};
    for (int j = 0; keys[j]; j++) {
        json_t *v = json_object_get(k, keys[j]);
        if (v) json_object_set(e, keys[j], v);
    }
    if (!json_object_get(e, "occurrences")) json_object_set_new(e, "occurrences", json_integer(1));
    return e;
}

static int write_outputs(stream *s, const char *dir, const json_t *request)
{
    if (mkdir_p(dir)) return fail(EXIT_WORK, "cannot create %s: %s", dir, strerror(errno));
    json_t *list = json_array();
    int rc = 0;
    for (int i = 0; i < s->total && !rc; i++) {
        json_t *e = manifest_entry(i, s->kernels[i]);
        rc = fetch_kernel(dir, i, s->total, s->kernels[i], e);
        json_array_append_new(list, e);
        if (g.tty) {
            fprintf(stderr, "\r\033[Kwriting %d/%d kernels to %s", i + 1, s->total, dir);
            if (i + 1 == s->total) fputc('\n', stderr);
        }
    }
    if (rc) {
        if (g.tty) fputc('\n', stderr);
        json_decref(list);
        return rc;
    }
    json_t *man =
        json_pack("{s:i, s:s, s:O, s:O, s:O, s:s, s:o, s:O}", "version", 1, "server", g.server,
                  "request", request, "model", s->model ? s->model : json_null(), "target",
                  s->target ? s->target : json_null(), "job", s->job, "kernels", list, "stats",
                  s->stats ? s->stats : json_null());
    /* the plan's launches name "subgraph" = the index of "kernels" (and of the files) */
    if (man && s->plan) json_object_set(man, "plan", s->plan);
    char *text = man ? json_dumps(man, JSON_INDENT(2)) : NULL;
    json_decref(man);
    if (!text) return fail(EXIT_WORK, "out of memory");
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    rc = write_file(path, text, strlen(text));
    free(text);
    return rc;
}

/* ---- commands ---- */

static int parse_pos(const char *opt, const char *v, json_int_t *out)
{
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < 1)
        return fail(EXIT_USAGE, "compile: %s must be a positive integer (got \"%s\")", opt, v);
    *out = x;
    return 0;
}

static char *base64_encode(const unsigned char *d, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    if (!o) return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) |
                     (i + 2 < n ? d[i + 2] : 0);
        *p++ = a[v >> 18 & 63];
        *p++ = a[v >> 12 & 63];
        *p++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? a[v & 63] : '=';
    }
    *p = 0;
    return o;
}

static int cmd_compile(int argc, char **argv)
{
    const char *workload = NULL, *model = NULL, *graph = NULL, *target = NULL, *dir = NULL;
    const char *onnx = NULL, *mode = NULL, *strategy = NULL;
    json_int_t batch = 0, image = 0, seq = 0, trials = 0;
    double seconds = 0;
    bool echo = false;
    int rc;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--stream")) {
            echo = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        static const char *const valued[] = {"--workload", "--model",  "--graph",      "--target",
                                             "-o",         "--batch",  "--image-size", "--seq-len",
                                             "--onnx",     "--mode",   "--trials",     "--seconds",
                                             "--strategy", NULL};
        int k = 0;
        while (valued[k] && strcmp(a, valued[k]))
            k++;
        if (!valued[k]) return fail(EXIT_USAGE, "compile: unknown argument \"%s\" (see --help)", a);
        if (i + 1 >= argc) return fail(EXIT_USAGE, "compile: %s needs a value", a);
        const char *v = argv[++i];
        switch (k) {
        case 0:
            workload = v;
            break;
        case 1:
            model = v;
            break;
        case 2:
            graph = v;
            break;
        case 3:
            target = v;
            break;
        case 4:
            dir = v;
            break;
        case 5:
            if ((rc = parse_pos(a, v, &batch))) return rc;
            break;
        case 6:
            if ((rc = parse_pos(a, v, &image))) return rc;
            break;
        case 8:
            onnx = v;
            break;
        case 9:
            mode = v;
            break;
        case 10:
            if ((rc = parse_pos(a, v, &trials))) return rc;
            break;
        case 11: {
            char *end;
            seconds = strtod(v, &end);
            if (*end || !(seconds > 0))
                return fail(EXIT_USAGE, "compile: --seconds must be a positive number");
            break;
        }
        case 12:
            strategy = v;
            break;
        default:
            if ((rc = parse_pos(a, v, &seq))) return rc;
        }
    }
    if (!!workload + !!model + !!graph + !!onnx != 1)
        return fail(EXIT_USAGE,
                    "compile: give exactly one of --workload, --model, --graph, --onnx");
    if (!target) return fail(EXIT_USAGE, "compile: --target T is required (cpu, cuda:sm_90, ...)");
    if (!model && (batch || image || seq))
        return fail(EXIT_USAGE, "compile: --batch, --image-size and --seq-len go with --model");

    if ((trials || seconds || strategy) && (!mode || strcmp(mode, "tune")))
        return fail(EXIT_USAGE, "compile: --trials, --seconds and --strategy go with --mode tune");
    json_t *req = json_pack("{s:s, s:b}", "target", target, "stream", 1);
    if (mode) json_object_set_new(req, "mode", json_string(mode));
    if (trials || seconds) {
        json_t *b = json_object();
        if (trials) json_object_set_new(b, "trials", json_integer(trials));
        if (seconds) json_object_set_new(b, "seconds", json_real(seconds));
        json_object_set_new(req, "budget", b);
    }
    if (strategy) json_object_set_new(req, "strategy", json_string(strategy));
    json_t *summary = json_object(); /* what the manifest says was asked */
    if (workload) {
        json_error_t je;
        json_t *w;
        if (workload[0] == '@') {
            buf b = {0};
            if (read_all(workload + 1, &b)) {
                free(b.p);
                json_decref(req);
                json_decref(summary);
                return fail(EXIT_USAGE, "compile: cannot read %s: %s", workload + 1,
                            strerror(errno));
            }
            w = json_loadb(b.p ? b.p : "", b.n, 0, &je);
            free(b.p);
        } else {
            w = json_loads(workload, 0, &je);
        }
        if (!w || !(json_is_object(w) || json_is_array(w))) {
            json_decref(w);
            json_decref(req);
            json_decref(summary);
            return fail(EXIT_USAGE, "compile: --workload is not a JSON object or array: %s",
                        je.text);
        }
        if (json_is_object(w)) {
            json_t *arr = json_array();
            json_array_append_new(arr, w);
            w = arr;
        }
        json_object_set_new(summary, "kind", json_string("workloads"));
        json_object_set_new(req, "workloads", w);
    } else if (graph) {
        buf b = {0};
        json_error_t je;
        if (read_all(graph, &b)) {
            free(b.p);
            json_decref(req);
            json_decref(summary);
            return fail(EXIT_USAGE, "compile: cannot read %s: %s", graph, strerror(errno));
        }
        json_t *gj = json_loadb(b.p ? b.p : "", b.n, 0, &je);
        free(b.p);
        if (!json_is_object(gj)) {
            json_decref(gj);
            json_decref(req);
            json_decref(summary);
            return fail(EXIT_USAGE, "compile: %s is not a JSON graph object: %s (line %d)", graph,
                        je.text, je.line);
        }
        json_object_set_new(summary, "kind", json_string("graph"));
        json_object_set_new(summary, "file", json_string(graph));
        json_object_set_new(req, "graph", gj);
    } else if (onnx) {
        /* the model file as base64 in "onnx"; the server imports it (proto/openapi.yaml) */
        buf b = {0};
        if (read_all(onnx, &b)) {
            free(b.p);
            json_decref(req);
            json_decref(summary);
            return fail(EXIT_USAGE, "compile: cannot read %s: %s", onnx, strerror(errno));
        }
        char *b64 = base64_encode((const unsigned char *)(b.p ? b.p : ""), b.n);
        free(b.p);
        if (!b64) {
            json_decref(req);
            json_decref(summary);
            return fail(EXIT_WORK, "out of memory");
        }
        json_object_set_new(summary, "kind", json_string("onnx"));
        json_object_set_new(summary, "file", json_string(onnx));
        json_object_set_new(req, "onnx", json_string(b64));
        free(b64);
    } else {
        json_t *m = json_pack("{s:s}", "name", model);
        if (batch) json_object_set_new(m, "batch", json_integer(batch));
        if (image) json_object_set_new(m, "image_size", json_integer(image));
        if (seq) json_object_set_new(m, "seq_len", json_integer(seq));
        json_object_set_new(summary, "kind", json_string("model"));
        json_object_set(summary, "model", m);
        json_object_set_new(req, "model", m);
    }
    json_object_set_new(summary, "target", json_string(target));
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!body) {
        json_decref(summary);
        return fail(EXIT_WORK, "out of memory");
    }

    stream s;
    memset(&s, 0, sizeof s);
    s.echo = echo;
    s.t0 = tlm_now_s();
    struct curl_slist *hl;
    s.c = easy("/v1/compile", &hl);
    hl = curl_slist_append(hl, "Content-Type: application/json");
    hl = curl_slist_append(hl, "Accept: application/x-ndjson");
    curl_easy_setopt(s.c, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(s.c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(s.c, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(s.c, CURLOPT_WRITEDATA, &s);
    CURLcode cc = curl_easy_perform(s.c);
    if (!s.status) curl_easy_getinfo(s.c, CURLINFO_RESPONSE_CODE, &s.status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(s.c);
    free(body);
    if (cc != CURLE_OK && !s.failed) {
        rc = fail(EXIT_WORK, "POST %s/v1/compile: %s", g.server, curl_easy_strerror(cc));
    } else if (!s.ndjson) {
        rc = server_error(s.status, s.body.p, s.body.n);
    } else if (s.failed) {
        if (g.tty) fputc('\n', stderr);
        char *t = json_dumps(s.error, 0);
        long st = (long)json_integer_value(json_object_get(s.error, "status"));
        rc = server_error(st, t, t ? strlen(t) : 0);
        free(t);
    } else if (!s.ok || s.done != s.total || !s.kernels) {
        rc = fail(EXIT_WORK, "the stream ended after %d of %d kernels without \"done\"", s.done,
                  s.total);
    } else {
        rc = dir ? write_outputs(&s, dir, summary) : 0;
        if (!rc && !echo) {
            const char *name = json_string_value(json_object_get(s.model, "name"));
            printf("%s -> %s: %d kernels", name ? name : "workloads",
                   json_string_value(json_object_get(s.target, "name")), s.total);
            json_int_t launches = json_integer_value(json_object_get(s.model, "launches"));
            if (launches) printf(" (%lld launches)", (long long)launches);
            printf(", %d hits, %d misses, %.2f s", s.hits, s.misses,
                   json_number_value(json_object_get(s.stats, "seconds")));
            if (dir) printf(", written to %s (manifest.json)", dir);
            printf("\n");
            if (!dir)
                for (int i = 0; i < s.total; i++)
                    printf("%d %s %s\n", i, json_string_value(json_object_get(s.kernels[i], "key")),
                           json_string_value(json_object_get(s.kernels[i], "entry")));
        }
    }
    stream_free(&s);
    json_decref(summary);
    return rc;
}

static int cmd_get(int argc, char **argv)
{
    const char *key = NULL, *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o")) {
            if (i + 1 >= argc) return fail(EXIT_USAGE, "get: -o needs a file name");
            out = argv[++i];
        } else if (!key && argv[i][0] != '-') {
            key = argv[i];
        } else {
            return fail(EXIT_USAGE, "get: unexpected argument \"%s\"", argv[i]);
        }
    }
    if (!key) return fail(EXIT_USAGE, "get: KEY (64 hex digits) is required");
    if (strlen(key) != 64 || strspn(key, "0123456789abcdef") != 64)
        return fail(EXIT_USAGE, "get: a key is 64 lowercase hex digits (got \"%.80s\")", key);
    if (!out && isatty(1))
        return fail(EXIT_USAGE, "get: the kernel is binary; give -o FILE or redirect stdout");
    char path[128];
    snprintf(path, sizeof path, "/v1/kernels/%s", key);
    buf b = {0}, h = {0};
    long st;
    int rc = http_get(path, &b, &h, &st);
    if (!rc && st != 200) rc = server_error(st, b.p, b.n);
    if (!rc) {
        char sha[80] = "", hex[65];
        header_value(&h, "X-TLM-SHA256", sha, sizeof sha);
        tlm_sha256_hex(b.p ? b.p : "", b.n, hex);
        if (sha[0] && strcmp(sha, hex))
            rc = fail(EXIT_WORK, "get: the binary's SHA-256 %s is not %s", hex, sha);
    }
    if (!rc) {
        if (out) {
            rc = write_file(out, b.p ? b.p : "", b.n);
            char entry[256] = "", launch[512] = "", fmt[32] = "";
            header_value(&h, "X-TLM-Entry", entry, sizeof entry);
            header_value(&h, "X-TLM-Launch", launch, sizeof launch);
            header_value(&h, "X-TLM-Format", fmt, sizeof fmt);
            if (!rc)
                fprintf(stderr, "%s: %zu bytes, format %s, entry %s, launch %s\n", out, b.n, fmt,
                        entry, launch[0] ? launch : "{}");
        } else if (fwrite(b.p ? b.p : "", 1, b.n, stdout) != b.n || fflush(stdout)) {
            rc = fail(EXIT_WORK, "get: cannot write to stdout");
        }
    }
    free(b.p);
    free(h.p);
    return rc;
}

static int cmd_stats(void)
{
    buf b = {0};
    long st;
    int rc = http_get("/v1/cache/stats", &b, NULL, &st);
    if (!rc && st != 200) rc = server_error(st, b.p, b.n);
    if (!rc) {
        json_t *j = json_loadb(b.p, b.n, 0, NULL);
        char *t = j ? json_dumps(j, JSON_INDENT(2)) : NULL;
        if (t)
            puts(t);
        else
            rc = fail(EXIT_WORK, "stats: the answer is not JSON");
        free(t);
        json_decref(j);
    }
    free(b.p);
    return rc;
}

static int cmd_health(void)
{
    buf b = {0}, r = {0};
    long hs, rs;
    int rc = http_get("/healthz", &b, NULL, &hs);
    if (!rc) rc = http_get("/readyz", &r, NULL, &rs);
    if (!rc) {
        printf("%s: %s, %s\n", g.server, hs == 200 ? "healthy" : "unhealthy",
               rs == 200 ? "ready" : "not ready");
        rc = hs == 200 && rs == 200 ? 0 : EXIT_WORK;
    }
    free(b.p);
    free(r.p);
    return rc;
}

int main(int argc, char **argv)
{
    const char *server = getenv("TLMC_SERVER");
    g.token = getenv("TLMC_TOKEN");
    if (g.token && !*g.token) g.token = NULL;
    /* global options come before the command */
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (strcmp(a, "--server") && strcmp(a, "--token"))
            return fail(EXIT_USAGE, "unknown option \"%s\" (see tlmc --help)", a);
        if (i + 1 >= argc) return fail(EXIT_USAGE, "%s needs a value", a);
        if (!strcmp(a, "--server"))
            server = argv[++i];
        else
            g.token = argv[++i];
    }
    if (i >= argc) {
        fputs(usage_text, stderr);
        return EXIT_USAGE;
    }
    if (!server || !*server) server = "http://127.0.0.1:8470";
    snprintf(g.server, sizeof g.server, "%s%s", strstr(server, "://") ? "" : "http://", server);
    size_t n = strlen(g.server);
    while (n && g.server[n - 1] == '/')
        g.server[--n] = 0;
    g.tty = isatty(2);
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) return fail(EXIT_WORK, "cannot start libcurl");
    const char *cmd = argv[i];
    int rc;
    if (!strcmp(cmd, "compile"))
        rc = cmd_compile(argc - i - 1, argv + i + 1);
    else if (!strcmp(cmd, "get"))
        rc = cmd_get(argc - i - 1, argv + i + 1);
    else if (!strcmp(cmd, "stats") && i + 1 == argc)
        rc = cmd_stats();
    else if (!strcmp(cmd, "health") && i + 1 == argc)
        rc = cmd_health();
    else
        rc = fail(EXIT_USAGE, "unknown command \"%s\" (compile, get, stats, health; see --help)",
                  cmd);
    curl_global_cleanup();
    return rc;
}
