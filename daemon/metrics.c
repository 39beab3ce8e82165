/* metrics.c — counters for GET /metrics (Prometheus text format 0.0.4), one metrics object
 * per server. Request counts fed by the loop thread are plain integers; what other threads
 * feed (decoder batch sizes, compile seconds and records from the pool) uses atomics. The
 * gauges (jobs, flights, decoder queue) belong to their modules and are passed in to render. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/tlmd.h"

#define MAX_SERIES 256

static const double batch_le[] = {1, 2, 4, 8, 16, 32, 64, 128};
#define N_BATCH (int)(sizeof batch_le / sizeof batch_le[0])
static const double compile_le[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
#define N_COMPILE (int)(sizeof compile_le / sizeof compile_le[0])
static const double answer_le[] = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.025,
                                   0.05,   0.1,   0.25,  1,     10};
#define N_ANSWER (int)(sizeof answer_le / sizeof answer_le[0])

struct metrics {
    const char *const *labels;
    int n_labels;
    /* loop thread only */
    struct {
        int route, status;
        uint64_t n;
    } reqs[MAX_SERIES];
    int n_reqs;
    uint64_t (*answer)[N_ANSWER + 1]; /* per route: headers read to answer sent, by bucket */
    double *answer_sum;
    uint64_t busy[N_ANSWER + 1], busy_n; /* the loop's turns: callback time per turn */
    double busy_sum;
    /* any thread: atomics */
    uint64_t batch_bucket[N_BATCH + 1], batch_count, batch_sum, batch_max;
    uint64_t compile_bucket[N_COMPILE + 1], compile_count, compile_sum_us;
    uint64_t cache_hits, cache_misses, compiles, sf_joins, records;
};

#define ADD(x, v) __atomic_fetch_add(&(x), (v), __ATOMIC_RELAXED)
#define GET(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)

metrics *metrics_new(const char *const *labels, int n_labels)
{
    metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->labels = labels;
    m->n_labels = n_labels;
    m->answer = calloc((size_t)n_labels, sizeof *m->answer);
    m->answer_sum = calloc((size_t)n_labels, sizeof *m->answer_sum);
    if (!m->answer || !m->answer_sum) {
        metrics_free(m);
        return NULL;
    }
    return m;
}

void metrics_free(metrics *m)
{
    if (!m) return;
    free(m->answer);
    free(m->answer_sum);
    free(m);
}

void metrics_answer_seconds(metrics *m, int route, double s)
{
    if (route < 0 || route >= m->n_labels) return;
    int b = 0;
    while (b < N_ANSWER && s > answer_le[b])
        b++;
    m->answer[route][b]++;
    m->answer_sum[route] += s;
}

void metrics_loop_busy(metrics *m, double s)
{
    int b = 0;
    while (b < N_ANSWER && s > answer_le[b])
        b++;
    m->busy[b]++;
    m->busy_n++;
    m->busy_sum += s;
}

void metrics_request(metrics *m, int route, int status)
{
    for (int i = 0; i < m->n_reqs; i++)
        if (m->reqs[i].route == route && m->reqs[i].status == status) {
            m->reqs[i].n++;
            return;
        }
    if (m->n_reqs < MAX_SERIES) {
        m->reqs[m->n_reqs].route = route;
        m->reqs[m->n_reqs].status = status;
        m->reqs[m->n_reqs].n = 1;
        m->n_reqs++;
    }
}

void metrics_batch(metrics *m, int size)
{
    int b = 0;
    while (b < N_BATCH && size > batch_le[b])
        b++;
    ADD(m->batch_bucket[b], 1);
    ADD(m->batch_count, 1);
    ADD(m->batch_sum, (uint64_t)size);
    uint64_t cur = GET(m->batch_max);
    while ((uint64_t)size > cur &&
           !__atomic_compare_exchange_n(&m->batch_max, &cur, (uint64_t)size, false,
                                        __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
}

void metrics_compile_seconds(metrics *m, double s)
{
    int b = 0;
    while (b < N_COMPILE && s > compile_le[b])
        b++;
    ADD(m->compile_bucket[b], 1);
    ADD(m->compile_count, 1);
    ADD(m->compile_sum_us, (uint64_t)(s * 1e6));
}

void metrics_cache(metrics *m, bool hit)
{
    ADD(*(hit ? &m->cache_hits : &m->cache_misses), 1);
}
void metrics_compile_done(metrics *m)
{
    ADD(m->compiles, 1);
}
void metrics_records(metrics *m, int n)
{
    if (n > 0) ADD(m->records, (uint64_t)n);
}
void metrics_single_flight_join(metrics *m)
{
    ADD(m->sf_joins, 1);
}
uint64_t metrics_compiles(const metrics *m)
{
    return GET(m->compiles);
}
uint64_t metrics_cache_hits(const metrics *m)
{
    return GET(m->cache_hits);
}
uint64_t metrics_cache_misses(const metrics *m)
{
    return GET(m->cache_misses);
}
uint64_t metrics_single_flight(const metrics *m)
{
    return GET(m->sf_joins);
}
uint64_t metrics_records_total(const metrics *m)
{
    return GET(m->records);
}

void metrics_text_printf(metrics_text *t, const char *fmt, ...)
{
    if (!t->p) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        char *q = realloc(t->p, t->cap * 2 + (size_t)n);
        if (!q) {
            free(t->p);
            t->p = NULL;
            return;
        }
        t->p = q;
        t->cap = t->cap * 2 + (size_t)n;
    }
}

void metrics_text_histogram(metrics_text *t, const char *name, const char *labels, const double *le,
                            int n, const uint64_t *bucket, double sum, int sum_decimals,
                            uint64_t count)
{
    const char *sep = labels[0] ? "," : "";
    uint64_t cum = 0;
    for (int i = 0; i <= n; i++) {
        cum += bucket ? GET(bucket[i]) : 0;
        if (i < n)
            metrics_text_printf(t, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, le[i],
                                (unsigned long long)cum);
        else
            metrics_text_printf(t, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep,
                                (unsigned long long)cum);
    }
    const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
    metrics_text_printf(t, "%s_sum%s%s%s %.*f\n%s_count%s%s%s %llu\n", name, open, labels, close,
                        sum_decimals, sum, name, open, labels, close, (unsigned long long)count);
}

char *metrics_render(const metrics *m, const metrics_gauges *g, const store_stats *ss)
{
    metrics_text b = {malloc(8192), 0, 8192};
    metrics_text_printf(
        &b, "# HELP tlmd_http_requests_total HTTP requests answered, by route and status.\n"
            "# TYPE tlmd_http_requests_total counter\n");
    for (int i = 0; i < m->n_reqs; i++) {
        int r = m->reqs[i].route;
        metrics_text_printf(&b, "tlmd_http_requests_total{route=\"%s\",code=\"%d\"} %llu\n",
                            r >= 0 && r < m->n_labels ? m->labels[r] : "unknown", m->reqs[i].status,
                            (unsigned long long)m->reqs[i].n);
    }
    metrics_text_printf(
        &b,
        "# HELP tlmd_jobs_in_flight Compile jobs running.\n# TYPE tlmd_jobs_in_flight gauge\n"
        "tlmd_jobs_in_flight %d\n",
        g->jobs_in_flight);
    metrics_text_printf(
        &b,
        "# HELP tlmd_flights_in_flight Distinct kernels being looked up or compiled.\n"
        "# TYPE tlmd_flights_in_flight gauge\ntlmd_flights_in_flight %d\n",
        g->flights_in_flight);
    metrics_text_printf(&b,
                        "# HELP tlmd_decoder_queue_depth Decodes queued or active in the decoder.\n"
                        "# TYPE tlmd_decoder_queue_depth gauge\ntlmd_decoder_queue_depth %d\n",
                        g->decoder_queue_depth);
    metrics_text_printf(
        &b,
        "# HELP tlmd_http_connections Open connections, by stage (head: waiting for the first "
        "request head in the front door; mhd: past it).\n"
        "# TYPE tlmd_http_connections gauge\ntlmd_http_connections{stage=\"head\"} %u\n"
        "tlmd_http_connections{stage=\"mhd\"} %u\n",
        g->connections_waiting_head, g->connections);
    metrics_text_printf(
        &b,
        "# HELP tlmd_http_connections_refused_total Connections refused over max_connections "
        "or max_connections_per_ip.\n"
        "# TYPE tlmd_http_connections_refused_total counter\n"
        "tlmd_http_connections_refused_total %llu\n",
        (unsigned long long)g->connections_refused);
    metrics_text_printf(&b, "# HELP tlmd_decoder_batch_size Active sequences per decoder step.\n"
                            "# TYPE tlmd_decoder_batch_size histogram\n");
    metrics_text_histogram(&b, "tlmd_decoder_batch_size", "", batch_le, N_BATCH, m->batch_bucket,
                           (double)GET(m->batch_sum), 0, GET(m->batch_count));
    metrics_text_printf(
        &b,
        "# HELP tlmd_decoder_batch_size_max Largest decoder batch so far.\n"
        "# TYPE tlmd_decoder_batch_size_max gauge\ntlmd_decoder_batch_size_max %llu\n",
        (unsigned long long)GET(m->batch_max));
    metrics_text_printf(&b,
                        "# HELP tlmd_cache_hits_total Compile lookups answered from the store.\n"
                        "# TYPE tlmd_cache_hits_total counter\ntlmd_cache_hits_total %llu\n",
                        (unsigned long long)GET(m->cache_hits));
    metrics_text_printf(&b,
                        "# HELP tlmd_cache_misses_total Compile lookups that had to compile.\n"
                        "# TYPE tlmd_cache_misses_total counter\ntlmd_cache_misses_total %llu\n",
                        (unsigned long long)GET(m->cache_misses));
    metrics_text_printf(
        &b,
        "# HELP tlmd_cache_evictions_total Kernels evicted by the store's size bound.\n"
        "# TYPE tlmd_cache_evictions_total counter\ntlmd_cache_evictions_total %llu\n",
        (unsigned long long)(ss ? ss->evictions : 0));
    metrics_text_printf(
        &b,
        "# HELP tlmd_cache_kernels Kernels in the store.\n# TYPE tlmd_cache_kernels gauge\n"
        "tlmd_cache_kernels %lld\n",
        (long long)(ss ? ss->kernels : 0));
    metrics_text_printf(&b,
                        "# HELP tlmd_cache_bytes Binary and source bytes in the store.\n"
                        "# TYPE tlmd_cache_bytes gauge\ntlmd_cache_bytes %lld\n",
                        (long long)(ss ? ss->bytes : 0));
    metrics_text_printf(&b,
                        "# HELP tlmd_compiles_total Kernels compiled (cache misses that built).\n"
                        "# TYPE tlmd_compiles_total counter\ntlmd_compiles_total %llu\n",
                        (unsigned long long)GET(m->compiles));
    metrics_text_printf(
        &b,
        "# HELP tlmd_single_flight_joins_total Tasks that joined an identical compile.\n"
        "# TYPE tlmd_single_flight_joins_total counter\ntlmd_single_flight_joins_total %llu\n",
        (unsigned long long)GET(m->sf_joins));
    metrics_text_printf(
        &b,
        "# HELP tlmd_measurement_records_total Candidate records (measured or failed to build) "
        "written to the store.\n"
        "# TYPE tlmd_measurement_records_total counter\ntlmd_measurement_records_total %llu\n",
        (unsigned long long)GET(m->records));
    metrics_text_printf(&b,
                        "# HELP tlmd_compile_seconds Compiler time per kernel (all candidates).\n"
                        "# TYPE tlmd_compile_seconds histogram\n");
    metrics_text_histogram(&b, "tlmd_compile_seconds", "", compile_le, N_COMPILE, m->compile_bucket,
                           (double)GET(m->compile_sum_us) / 1e6, 6, GET(m->compile_count));
    metrics_text_printf(
        &b, "# HELP tlmd_http_answer_seconds From a request's head read to its answer written "
            "(streams: to their end), by route.\n"
            "# TYPE tlmd_http_answer_seconds histogram\n");
    for (int r = 0; r < m->n_labels; r++) {
        uint64_t c = 0;
        for (int i = 0; i <= N_ANSWER; i++)
            c += m->answer[r][i];
        if (!c) continue;
        char labels[256];
        snprintf(labels, sizeof labels, "route=\"%s\"", m->labels[r]);
        metrics_text_histogram(&b, "tlmd_http_answer_seconds", labels, answer_le, N_ANSWER,
                               m->answer[r], m->answer_sum[r], 6, c);
    }
    metrics_text_printf(
        &b, "# HELP tlmd_loop_busy_seconds The event loop's turns: time spent in callbacks per "
            "turn (what every request on the loop may wait behind).\n"
            "# TYPE tlmd_loop_busy_seconds histogram\n");
    metrics_text_histogram(&b, "tlmd_loop_busy_seconds", "", answer_le, N_ANSWER, m->busy,
                           m->busy_sum, 6, m->busy_n);
    return b.p;
}
