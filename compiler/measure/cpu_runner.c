/* cpu_runner.c — the runner process machinery (both targets) and the CPU runner.
 *
 * Parent side: measure__prepare (memfd + inputs + reference), measure__run (spawn, follow the
 * messages, compare, reap). Runner side: a constructor that turns a fresh exec of
 * /proc/self/exe into a runner (see measure.h for why), the CPU child, the timing policy.
 */
#include "compiler/measure/measure.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "compiler/codegen/codegen.h"
#include "compiler/measure/runner.h"
#include "compiler/target/target.h"
#include "compiler/util/util.h"

extern char **environ;

#define MEASURE_MAX_TOTAL_BYTES (UINT64_C(8) << 30)
/* Cold rotation: 1 GiB, not the L3 a VM reports (32 MiB on the developers' Zen 4 VM, where
 * a 64 MiB -> 64 MiB streaming copy rotated over 256 MiB still ran at 75 GB/s, from a larger
 * real cache, and at 49 GB/s, DRAM's rate, over 1 GiB; another VM reported 480 MiB). */
#define MEASURE_COLD_TARGET_BYTES (UINT64_C(1) << 30)
#define MEASURE_COLD_MAX_BYTES (UINT64_C(2) << 30)
#define MEASURE_COLD_MAX_COPIES 64

#if defined(__SANITIZE_ADDRESS__)
#define MEASURE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MEASURE_ASAN 1
#endif
#endif

/* ---- small helpers ------------------------------------------------------------------------ */

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static uint64_t round_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

void measure_opts_init(measure_opts *o)
{
    memset(o, 0, sizeof *o);
    o->timeout_s = MEASURE_DEFAULT_TIMEOUT_S;
    o->rtol = MEASURE_DEFAULT_RTOL;
    o->warmup = MEASURE_DEFAULT_WARMUP;
    o->min_warmup_s = MEASURE_DEFAULT_MIN_WARMUP_S;
    o->repeats = MEASURE_DEFAULT_REPEATS;
    o->min_sample_s = MEASURE_DEFAULT_MIN_SAMPLE_S;
}

const char *measure_status_name(int status)
{
    switch (status) {
    case MEASURE_OK:
        return "ok";
    case MEASURE_WRONG:
        return "wrong";
    case MEASURE_CRASH:
        return "crash";
    case MEASURE_TIMEOUT:
        return "timeout";
    case MEASURE_LOAD_ERROR:
        return "load_error";
    }
    return "unknown";
}

static const char *signal_name(int sig)
{
    switch (sig) {
    case SIGSEGV:
        return "SIGSEGV";
    case SIGBUS:
        return "SIGBUS";
    case SIGFPE:
        return "SIGFPE";
    case SIGILL:
        return "SIGILL";
    case SIGABRT:
        return "SIGABRT";
    case SIGKILL:
        return "SIGKILL";
    case SIGTERM:
        return "SIGTERM";
    case SIGTRAP:
        return "SIGTRAP";
    case SIGSYS:
        return "SIGSYS";
    case SIGXCPU:
        return "SIGXCPU";
    case SIGPIPE:
        return "SIGPIPE";
    }
    return "a signal";
}

/* The reference for an explicit seed is a pure function of (workload, seed): tuning measures
 * many candidates of one workload on the same inputs, and even the fast reference (dgemm for
 * contractions, ir_interp_fast_f64) takes longer than the kernel, so the last one is kept.
 * It runs here in the caller, with OpenBLAS's threads: the runner child never computes it. */
static pthread_mutex_t ref_mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t ref_hash[32];
static uint64_t ref_seed;
static uint64_t ref_n;
static double *ref_vals;

static int ref_cached(const ir_subgraph *g, uint64_t seed, uint64_t n_out, double *out,
                      const float *const *inputs, bool *fresh, tlm_error *err)
{
    *fresh = false;
    uint8_t h[32];
    bool cacheable = seed != 0 && ir_workload_hash(&g->wl, h) == 0;
    if (cacheable) {
        pthread_mutex_lock(&ref_mu);
        bool hit = ref_vals && ref_seed == seed && ref_n == n_out && !memcmp(h, ref_hash, 32);
        if (hit) memcpy(out, ref_vals, sizeof(double) * n_out);
        pthread_mutex_unlock(&ref_mu);
        if (hit) return 0;
    }
    int rc = ir_interp_fast_f64(g, inputs, out, err);
    *fresh = true;
    if (rc == 0 && cacheable) {
        double *copy = malloc(sizeof(double) * n_out);
        if (copy) {
            memcpy(copy, out, sizeof(double) * n_out);
            pthread_mutex_lock(&ref_mu);
            free(ref_vals);
            ref_vals = copy;
            ref_seed = seed;
            ref_n = n_out;
            memcpy(ref_hash, h, 32);
            pthread_mutex_unlock(&ref_mu);
        }
    }
    return rc;
}

/* splitmix64: tiny, good enough for test data, and identical everywhere for a given seed. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1): 24 random bits, exactly representable in float. */
static float rng_uniform(uint64_t *s)
{
    return (float)((double)(rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* ---- runner side: messages and timing policy ---------------------------------------------- */

void measure__send_msg(int fd, measure__msg *m)
{
    m->magic = MEASURE__MAGIC;
    const char *p = (const char *)m;
    size_t left = sizeof *m;
    while (left > 0) {
        ssize_t n = write(fd, p, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(126); /* the parent is gone: nothing left to do */
        p += n;
        left -= (size_t)n;
    }
}

void measure__send_checked(int fd, double t_check)
{
    measure__msg m;
    memset(&m, 0, sizeof m);
    m.kind = MEASURE__MSG_CHECKED;
    m.t_check = t_check;
    measure__send_msg(fd, &m);
}

void measure__send(int fd, int kind, int code, const char *fmt, ...)
{
    measure__msg m;
    memset(&m, 0, sizeof m);
    m.kind = kind;
    m.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.text, sizeof m.text, fmt, ap);
    va_end(ap);
    measure__send_msg(fd, &m);
}

int measure__cold_copies(const measure__hdr *h, uint64_t set_bytes)
{
    if (!h->cold_cache || set_bytes == 0) return 1;
    uint64_t k = (MEASURE_COLD_TARGET_BYTES + set_bytes - 1) / set_bytes;
    /* at least 3 where they fit: with 2, calls alternating with the floor's settle on one copy
     * each, and copies differ (on a VM, 11-13 % between two 512 MB sets; bench/ab_kernels) */
    if (k < 3) k = 3;
    if (k > MEASURE_COLD_MAX_COPIES) k = MEASURE_COLD_MAX_COPIES;
    while (k > 1 && k * set_bytes > MEASURE_COLD_MAX_BYTES)
        k--;
    return k < 1 ? 1 : (int)k;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_of(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int measure__time(const measure__hdr *h, double t_check, measure__batch_fn batch, void *ctx,
                  measure__batch_fn floor, void *fctx, measure__msg *m)
{
    /* The reserve covers the message, the parent's reaction and a sample that runs long. */
    int64_t reserve = h->timeout_ns / 10;
    if (reserve < 50000000) reserve = 50000000;
    int64_t end = h->deadline_ns - reserve;
    double est = t_check > 0 ? t_check : 1e-6;

    /* Warm-up in doubling batches, so a 1 us kernel does not pay a clock read per call. */
    int64_t runs = 0, b = 1;
    double spent = 0;
    while (runs < h->warmup || spent < h->min_warmup_s) {
        if (tlm_now_ns() + (int64_t)(b * est * 1e9) > end) break;
        double t = 0;
        int rc = batch(ctx, b, &t);
        if (rc) return rc;
        runs += b;
        spent += t;
        est = t / (double)b > 0 ? t / (double)b : 1e-9;
        if (b < (INT64_C(1) << 20)) b *= 2;
    }

    double inner_d = ceil(h->min_sample_s / est);
    int64_t inner = inner_d < 1 ? 1 : inner_d > (double)(1 << 24) ? (1 << 24) : (int64_t)inner_d;
    size_t cap = (size_t)(h->repeats > 0 ? h->repeats : 1);
    double *samples = malloc(sizeof(double) * cap * 3);
    if (!samples) return -1;
    double *fs = samples + cap, *ratio = fs + cap; /* the floor's samples, kernel / floor */
    /* a sample's allowance: the kernel's, and twice as much again for the floor (a copy's
     * two forms, each no slower than a memory-bound kernel); the floor's first touch of its
     * path before the samples */
    const double per = floor ? 3.0 : 1.0;
    if (floor) {
        double t = 0;
        if (floor(fctx, 1, &t)) {
            free(samples);
            return -1;
        }
    }
    int n = 0;
    for (int s = 0; s < h->repeats; s++) {
        if (tlm_now_ns() + (int64_t)(per * (double)inner * est * 1e9) > end) break;
        double t = 0;
        int rc = batch(ctx, inner, &t);
        if (rc) {
            free(samples);
            return rc;
        }
        samples[n] = t / (double)inner;
        if (floor) {
            double tf = 0;
            if (floor(fctx, inner, &tf)) {
                free(samples);
                return -1;
            }
            fs[n] = tf / (double)inner;
            ratio[n] = fs[n] > 0 ? samples[n] / fs[n] : 0;
        }
        n++;
    }
    if (n > 0) {
        m->median = median_of(samples, n);
        m->min = samples[0];
        if (floor) {
            m->floor_median = median_of(fs, n);
            m->floor_ratio = median_of(ratio, n);
        }
    } else {
        m->median = m->min = est;
    }
    m->n_samples = n;
    m->inner = inner;
    free(samples);
    return 0;
}

/* ---- runner side: the CPU child ----------------------------------------------------------- */

typedef void (*packed_fn)(void *const *args);

/* Packs the operands of args that are in `mask` (input bits) into new buffers pre[q] (NULL
 * for the others); false when out of memory. */
static bool pack_consts(const cg_prepack_abi *p, const measure__hdr *h, uint32_t mask,
                        void *const *args, const float **pre)
{
    for (int q = 0; q < p->n; q++) {
        const int arg = p->arg[q];
        pre[q] = NULL;
        if (arg >= 32 || !((mask >> arg) & 1u)) continue;
        float *d = aligned_alloc(64, round_up((uint64_t)p->floats[q] * 4, 64));
        if (!d) return false;
        p->pack(q, args, d);
        pre[q] = d;
    }
    return true;
}

typedef struct {
    packed_fn fn;
    void (*pfn)(void *const *args, const float *const *pre); /* opts.const_args packed once */
    int k;             /* copies */
    int next;          /* rotation position */
    void **args;       /* k * MEASURE__MAX_ARGS pointers */
    const float **pre; /* k * CG_MAX_PRE, with pfn */
} cpu_ctx;

static int cpu_batch(void *vctx, int64_t inner, double *seconds)
{
    cpu_ctx *c = vctx;
    int64_t t0 = tlm_now_ns();
    for (int64_t i = 0; i < inner; i++) {
        void *const *a = (void *const *)(c->args + (size_t)c->next * MEASURE__MAX_ARGS);
        if (c->pfn)
            c->pfn(a, c->pre + (size_t)c->next * CG_MAX_PRE);
        else
            c->fn(a);
        if (++c->next == c->k) c->next = 0;
    }
    *seconds = (double)(tlm_now_ns() - t0) * 1e-9;
    return 0;
}

/* ---- opts.mem_floor: the bandwidth floor on the kernel's own argument copies ---- */

/* A copy with non-temporal stores (whole 64-byte lines once d is aligned): the floor for
 * outputs beyond the caches, where memcpy may keep plain stores (and read the lines it
 * writes). The widest vectors the host has. With pf, each line's source is also prefetched
 * into L2 STREAM_PF_AHEAD floats ahead: from DRAM that copy ran 1.13-1.27x faster than the
 * plain streamed one (Xeon, AVX-512 host, 256 MiB -> 256 MiB on 2 threads, rotated over four
 * copies: 14.3 -> 12.2 ms, 256-bit stores 14.2 -> 12.3 ms), in cache 0.96x, so the floor
 * times both forms (floor_batch) and keeps the faster. */
#define STREAM_PF_AHEAD 1024 /* 4 KiB */

__attribute__((target("avx512f"))) static void stream_copy512(float *d, const float *s, size_t n,
                                                             bool pf)
{
    size_t i = 0;
    for (; i < n && ((uintptr_t)(d + i) & 63); i++) d[i] = s[i];
    for (; i + 16 <= n; i += 16) {
        if (pf) _mm_prefetch((const char *)(s + i + STREAM_PF_AHEAD), _MM_HINT_T1);
        _mm512_stream_ps(d + i, _mm512_loadu_ps(s + i));
    }
    for (; i < n; i++) d[i] = s[i];
}

__attribute__((target("avx"))) static void stream_copy256(float *d, const float *s, size_t n,
                                                          bool pf)
{
    size_t i = 0;
    for (; i < n && ((uintptr_t)(d + i) & 31); i++) d[i] = s[i];
    for (; i + 8 <= n; i += 8) {
        if (pf && !(i & 15)) _mm_prefetch((const char *)(s + i + STREAM_PF_AHEAD), _MM_HINT_T1);
        _mm256_stream_ps(d + i, _mm256_loadu_ps(s + i));
    }
    for (; i < n; i++) d[i] = s[i];
}

/* The sum of n floats (64-byte aligned) through four vector accumulators: a read at full rate */
__attribute__((target("avx512f"))) static float read_sum512(const float *s, size_t n)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a0 = _mm512_add_ps(a0, _mm512_load_ps(s + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(s + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(s + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(s + i + 48));
    }
    float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    for (; i < n; i++) r += s[i];
    return r;
}

__attribute__((target("avx"))) static float read_sum256(const float *s, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(s + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(s + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(s + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(s + i + 24));
    }
    float v[8];
    _mm256_storeu_ps(v, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    float r = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    for (; i < n; i++) r += s[i];
    return r;
}

typedef struct {
    const measure__hdr *h;
    cpu_ctx *kern; /* the kernel's copies and rotation, shared: every call, the kernel's or a
                    * floor form's, takes the copy after the call before it (with a rotation
                    * of its own the floor's first form read the copy the kernel had just read
                    * and written, warm in a large L3) */
    bool read;   /* a read of the inputs, not a copy of the output's bytes */
    bool wide;   /* AVX-512 */
    bool avx;    /* AVX; without it (no such x86-64 host here) memcpy and a scalar sum */
    volatile float sink;
} floor_ctx;

/* The part of n floats thread id of nt takes: whole 64-byte lines from a 64-byte aligned base */
static void thread_part(size_t n, int id, int nt, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)id / (size_t)nt / 16 * 16;
    *hi = id + 1 == nt ? n : n * (size_t)(id + 1) / (size_t)nt / 16 * 16;
}

/* The forms of the copy floor_batch times */
enum { FLOOR_MEMCPY, FLOOR_STREAM, FLOOR_STREAM_PF, FLOOR_FORMS };

/* One call of the floor on argument copy c in form `form` (a read ignores it) */
static void floor_call(floor_ctx *f, int c, int form)
{
    void *const *a = (void *const *)(f->kern->args + (size_t)c * MEASURE__MAX_ARGS);
    const int n = f->h->n_args;
    if (f->read) {
        float sum = 0;
        for (int i = 0; i < n - 1; i++) {
            const float *s = a[i];
            const size_t m = f->h->arg[i].bytes / 4;
#pragma omp parallel reduction(+ : sum)
            {
                size_t lo, hi;
                thread_part(m, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
                float p = 0;
                if (f->wide) p = read_sum512(s + lo, hi - lo);
                else if (f->avx) p = read_sum256(s + lo, hi - lo);
                else
                    for (size_t e = lo; e < hi; e++) p += s[e];
                sum += p;
            }
        }
        f->sink = sum;
        return;
    }
    /* the output's bytes from input 0, which wraps around when it is the smaller */
    float *d = a[n - 1];
    const float *s = a[0];
    const size_t m = f->h->arg[n - 1].bytes / 4, ms = f->h->arg[0].bytes / 4;
    const bool stream = form != FLOOR_MEMCPY && f->avx, pf = form == FLOOR_STREAM_PF;
#pragma omp parallel
    {
        size_t lo, hi;
        thread_part(m, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        for (size_t i = lo; i < hi;) {
            size_t at = i % ms, len = hi - i < ms - at ? hi - i : ms - at;
            if (!stream) memcpy(d + i, s + at, len * 4);
            else if (f->wide) stream_copy512(d + i, s + at, len, pf);
            else stream_copy256(d + i, s + at, len, pf);
            i += len;
        }
        if (stream) _mm_sfence();
    }
}

/* inner calls of the floor: a copy's time is the fastest of inner calls in each form (memcpy
 * while the bytes fit the caches, a streamed copy past them, prefetching from DRAM) */
static int floor_batch(void *vctx, int64_t inner, double *seconds)
{
    floor_ctx *f = vctx;
    double best = 0;
    for (int pass = 0; pass < (f->read ? 1 : FLOOR_FORMS); pass++) {
        int64_t t0 = tlm_now_ns();
        for (int64_t i = 0; i < inner; i++) {
            cpu_ctx *kc = f->kern;
            floor_call(f, kc->next, pass);
            if (++kc->next == kc->k) kc->next = 0;
        }
        double t = (double)(tlm_now_ns() - t0) * 1e-9;
        if (pass == 0 || t < best) best = t;
    }
    *seconds = best;
    return 0;
}

/* opts.check_prepacked (measure.h): the prepacked path against the check run's output. Sends
 * a FAULT (or an ERROR when out of memory) and returns -1 when the two differ. */
static int check_prepacked(const measure__hdr *h, const cg_prepack_abi *p, void *const *args,
                           int pfd)
{
    if (!p->n) return 0;
    const int n = h->n_args;
    void *copy[MEASURE__MAX_ARGS] = {0};
    const float *pre[CG_MAX_PRE] = {0};
    int rc = 0;
    for (int i = 0; !rc && i < n; i++) {
        copy[i] = aligned_alloc(64, round_up(h->arg[i].bytes, 64));
        if (!copy[i]) rc = -1;
        else if (i < n - 1) memcpy(copy[i], args[i], h->arg[i].bytes);
    }
    if (!rc && !pack_consts(p, h, ~0u, copy, pre)) rc = -1;
    for (int q = 0; !rc && q < p->n; q++) { /* the packed operands may no longer be read */
        float *a = copy[p->arg[q]];
        for (uint64_t e = 0; e < h->arg[p->arg[q]].bytes / 4; e++) a[e] = NAN;
    }
    if (!rc) {
        float *o = copy[n - 1];
        for (uint64_t e = 0; e < h->arg[n - 1].bytes / 4; e++) o[e] = NAN;
        p->run(copy, pre);
        const float *want = args[n - 1];
        for (uint64_t e = 0; e < h->arg[n - 1].bytes / 4; e++)
            if (memcmp(&o[e], &want[e], 4) != 0) {
                measure__send(pfd, MEASURE__MSG_FAULT, 0,
                              "the prepacked entry wrote %g at element %llu, the kernel %g", o[e],
                              (unsigned long long)e, want[e]);
                rc = -3;
                break;
            }
    }
    if (rc == -1)
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s",
                      "runner: out of memory");
    for (int i = 0; i < n; i++) free(copy[i]);
    for (int q = 0; q < CG_MAX_PRE; q++) free((void *)pre[q]);
    return rc;
}

/* opts.check_prepacked, for a kernel a plan may run in place (h->in_place: the input its
 * output may share bytes with): the kernel over copies of the inputs, that one's copy also
 * its output, must write the check run's output. Sends a FAULT (or an ERROR when out of
 * memory) and returns -1 when the two differ. */
static int check_in_place(const measure__hdr *h, packed_fn fn, void *const *args, int pfd)
{
    const int n = h->n_args, a = h->in_place;
    if (a < 0) return 0;
    if (a >= n - 1 || h->arg[a].bytes != h->arg[n - 1].bytes) {
        measure__send(pfd, MEASURE__MSG_FAULT, 0, "in place over argument %d of %d inputs", a,
                      n - 1);
        return -1;
    }
    void *copy[MEASURE__MAX_ARGS] = {0};
    int rc = 0;
    for (int i = 0; !rc && i < n - 1; i++) {
        copy[i] = aligned_alloc(64, round_up(h->arg[i].bytes, 64));
        if (!copy[i])
            rc = -1;
        else
            memcpy(copy[i], args[i], h->arg[i].bytes);
    }
    if (!rc) {
        copy[n - 1] = copy[a];
        fn(copy);
        const float *o = copy[a], *want = args[n - 1];
        for (uint64_t e = 0; e < h->arg[n - 1].bytes / 4; e++)
            if (memcmp(&o[e], &want[e], 4) != 0) {
                measure__send(pfd, MEASURE__MSG_FAULT, 0,
                              "in place over input %d the kernel wrote %g at element %llu, "
                              "else %g",
                              a, o[e], (unsigned long long)e, want[e]);
                rc = -3;
                break;
            }
    }
    if (rc == -1) measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s", "runner: out of memory");
    for (int i = 0; i < n - 1; i++)
        free(copy[i]);
    return rc;
}

static int cpu_child(const measure__hdr *h, int pfd, int mfd)
{
    size_t pg = page_size();
    int n = h->n_args;

    /* One reservation holds every segment with a PROT_NONE page before and after it. */
    size_t span = pg;
    for (int i = 0; i < n; i++)
        span += h->arg[i].seg_size + pg;
    uint8_t *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "runner: cannot reserve %zu bytes",
                      span);
        return 0;
    }
    void *args[MEASURE__MAX_ARGS];
    uint8_t *out_seg = NULL;
    size_t cur = pg;
    for (int i = 0; i < n; i++) {
        const measure__arg *a = &h->arg[i];
        int prot = i == n - 1 ? PROT_READ | PROT_WRITE : PROT_READ;
        void *p =
            mmap(res + cur, a->seg_size, prot, MAP_SHARED | MAP_FIXED, mfd, (off_t)a->seg_off);
        if (p == MAP_FAILED) {
            measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "runner: cannot map argument %d: %s",
                          i, strerror(errno));
            return 0;
        }
        args[i] = (uint8_t *)p + (a->data_off - a->seg_off);
        if (i == n - 1) out_seg = p;
        cur += a->seg_size + pg;
    }

    void *lib = dlopen(h->so_path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "dlopen: %s", e ? e : "unknown error");
        return 0;
    }
    char sym[sizeof h->entry + 16];
    snprintf(sym, sizeof sym, "%s_packed", h->entry);
    dlerror();
    packed_fn fn = (packed_fn)dlsym(lib, sym);
    if (!fn) {
        const char *e = dlerror();
        measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "dlsym: %s", e ? e : "symbol is NULL");
        return 0;
    }
    measure__send(pfd, MEASURE__MSG_LOADED, 0, "%s", "");

    /* opts.const_args: those operands packed once, the kernel run as a plan runs it */
    cg_prepack_abi pre = {0};
    tlm_error perr;
    if ((h->const_args || h->check_prepacked) &&
        cg_prepack_find(lib, h->entry, &pre, &perr) != 0) {
        measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "%s: %s", perr.field, perr.msg);
        return 0;
    }
    for (int q = 0; q < pre.n; q++)
        if (pre.arg[q] >= n - 1) {
            measure__send(pfd, MEASURE__MSG_FAULT, 0,
                          "prepack %d names argument %d; the kernel takes %d inputs", q,
                          pre.arg[q], n - 1);
            return 0;
        }
    const bool consts = h->const_args && pre.n;
    const float *pre0[CG_MAX_PRE] = {0};
    if (consts && !pack_consts(&pre, h, h->const_args, args, pre0)) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s",
                      "runner: cannot pack the constant operands");
        return 0;
    }
    int64_t t0 = tlm_now_ns();
    if (consts)
        pre.run(args, pre0);
    else
        fn(args);
    double t_check = (double)(tlm_now_ns() - t0) * 1e-9;
    if (h->check_prepacked &&
        (check_prepacked(h, &pre, args, pfd) != 0 || check_in_place(h, fn, args, pfd) != 0))
        return 0;
    /* Freeze the checked output: nothing in the timing phase may change what the parent reads. */
    mprotect(out_seg, h->arg[n - 1].seg_size, PROT_READ);
    measure__send_checked(pfd, t_check);
    if (h->check_only) return 0;

    /* Timing buffers are private copies, 64-byte aligned like the check buffers. */
    uint64_t set_bytes = 0, off[MEASURE__MAX_ARGS];
    for (int i = 0; i < n; i++) {
        off[i] = set_bytes;
        set_bytes += round_up(h->arg[i].bytes, 64);
    }
    int k = measure__cold_copies(h, set_bytes);
    /* in huge pages as compiler/runtime keeps a plan's arena (tlm_alloc_big), so that a
     * kernel is measured on the pages it runs on in a network; every byte a kernel reads is
     * written below. The child exits after timing: the buffers go with it. */
    bool huge;
    uint8_t *copies = tlm_alloc_big((size_t)(set_bytes * (uint64_t)k), 64, &huge);
    if (!copies && k > 1) {
        k = 1;
        copies = tlm_alloc_big((size_t)set_bytes, 64, &huge);
    }
    void **cargs = calloc((size_t)k * MEASURE__MAX_ARGS, sizeof(void *));
    if (!copies || !cargs) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM,
                      "runner: cannot allocate %llu bytes of timing buffers",
                      (unsigned long long)set_bytes);
        return 0;
    }
    for (int c = 0; c < k; c++) {
        for (int i = 0; i < n; i++) {
            uint8_t *p = copies + (uint64_t)c * set_bytes + off[i];
            cargs[(size_t)c * MEASURE__MAX_ARGS + (size_t)i] = p;
            /* the output too is written here: an untouched copy would page-fault through
             * its first call, which a cold rotation puts inside the timed samples (a
             * 128 x 50257 softmax's five copies: median 7.5 ms against 1.3 warm) */
            if (i < n - 1)
                memcpy(p, args[i], h->arg[i].bytes);
            else
                memset(p, 0, h->arg[i].bytes);
        }
    }
    cpu_ctx ctx = {.fn = fn, .k = k, .next = 0, .args = cargs};
    if (consts) {
        ctx.pre = calloc((size_t)k * CG_MAX_PRE, sizeof *ctx.pre);
        for (int c = 0; ctx.pre && c < k; c++)
            if (!pack_consts(&pre, h, h->const_args,
                             (void *const *)(cargs + (size_t)c * MEASURE__MAX_ARGS),
                             ctx.pre + (size_t)c * CG_MAX_PRE)) {
                free(ctx.pre);
                ctx.pre = NULL;
            }
        if (!ctx.pre) {
            measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s",
                          "runner: cannot pack the constant operands");
            return 0;
        }
        ctx.pfn = pre.run;
    }
    measure__msg m;
    memset(&m, 0, sizeof m);
    m.kind = MEASURE__MSG_TIMED;
    m.t_check = t_check;
    m.threads = omp_get_max_threads();
    /* opts.mem_floor: a copy when the kernel writes at least half of what it reads */
    uint64_t in_bytes = 0;
    for (int i = 0; i < n - 1; i++) in_bytes += h->arg[i].bytes;
    floor_ctx fl = {.h = h, .kern = &ctx, .read = 2 * h->arg[n - 1].bytes < in_bytes,
                    .wide = __builtin_cpu_supports("avx512f"),
                    .avx = __builtin_cpu_supports("avx")};
    if (measure__time(h, t_check, cpu_batch, &ctx, h->mem_floor ? floor_batch : NULL, &fl, &m) !=
        0) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s", "runner: out of memory timing");
        return 0;
    }
    measure__send_msg(pfd, &m);
    return 0;
}

/* ---- runner side: entry ------------------------------------------------------------------- */

static bool hdr_valid(const measure__hdr *h, uint64_t file_size, size_t pg)
{
    if (h->magic != MEASURE__MAGIC || h->version != MEASURE__VERSION) return false;
    if (h->kind != MEASURE__KIND_CPU && h->kind != MEASURE__KIND_CUDA) return false;
    if (h->n_args < 1 || h->n_args > MEASURE__MAX_ARGS || h->total_size > file_size) return false;
    for (int i = 0; i < h->n_args; i++) {
        const measure__arg *a = &h->arg[i];
        if (a->seg_off % pg || a->seg_size % pg || a->seg_size == 0) return false;
        if (a->seg_off + a->seg_size > h->total_size) return false;
        if (a->data_off < a->seg_off || a->data_off + a->bytes > a->seg_off + a->seg_size)
            return false;
    }
    if (h->cubin_off + h->cubin_size > h->total_size) return false;
    return memchr(h->so_path, 0, sizeof h->so_path) && memchr(h->entry, 0, sizeof h->entry);
}

/* Runs in the runner process (fresh exec, or fork child); returns its exit status. */
static int runner_body(int pfd, int mfd, pid_t ppid)
{
    /* Die with the calling thread; then close the race with a parent that died already. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != ppid) return 125;
    measure__send(pfd, MEASURE__MSG_HELLO, 0, "%s", "");
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);

    size_t pg = page_size();
    struct stat st;
    size_t hsz = round_up(sizeof(measure__hdr), pg);
    if (fstat(mfd, &st) != 0 || (uint64_t)st.st_size < hsz) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_EIO, "%s", "runner: shared memory too small");
        return 0;
    }
    const measure__hdr *mh = mmap(NULL, hsz, PROT_READ, MAP_SHARED, mfd, 0);
    if (mh == MAP_FAILED) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_EIO, "runner: mmap: %s", strerror(errno));
        return 0;
    }
    static measure__hdr h; /* a copy: the kernel gets no way to change the parameters */
    memcpy(&h, mh, sizeof h);
    munmap((void *)mh, hsz);
    if (!hdr_valid(&h, (uint64_t)st.st_size, pg)) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_EIO, "%s", "runner: invalid shared header");
        return 0;
    }
    if (h.kind == MEASURE__KIND_CPU) return cpu_child(&h, pfd, mfd);
    uint8_t *base = mmap(NULL, h.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (base == MAP_FAILED) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "runner: mmap: %s", strerror(errno));
        return 0;
    }
    return measure__cuda_child(&h, base, pfd);
}

/* A fresh exec of /proc/self/exe with TLM_MEASURE_RUNNER set is a runner: it does its job and
 * exits before main() runs. A value that is not ours ("v1:..." with our parent's pid) is
 * dropped and the program starts normally. */
__attribute__((constructor)) static void measure_runner_ctor(void)
{
    const char *v = getenv(MEASURE__ENV);
    if (!v) return;
    long ppid;
    int pfd, mfd;
    int ok = sscanf(v, "v1:%ld:%d:%d", &ppid, &pfd, &mfd) == 3;
    unsetenv(MEASURE__ENV); /* nothing the kernel starts may become a runner */
    if (!ok) return;
    if ((pid_t)ppid != getppid()) _exit(125); /* parent already gone, or a stray variable */
    _exit(runner_body(pfd, mfd, (pid_t)ppid));
}

/* ---- parent side: preparation ------------------------------------------------------------- */

static int resolve_opts(const measure_opts *in, measure_opts *o, tlm_error *err)
{
    measure_opts_init(o);
    if (!in) return 0;
    if (isnan(in->timeout_s) || in->timeout_s > 86400)
        return tlm_err_set(err, TLM_EINVAL, "opts.timeout_s", "timeout_s must be in (0, 86400]");
    if (isnan(in->rtol) || isnan(in->min_warmup_s) || isnan(in->min_sample_s) ||
        in->min_warmup_s > 60 || in->min_sample_s > 60)
        return tlm_err_set(err, TLM_EINVAL, "opts",
                           "rtol, min_warmup_s and min_sample_s must be "
                           "numbers; the times at most 60 s");
    if (in->repeats > 100000 || in->warmup > 1000000)
        return tlm_err_set(err, TLM_EINVAL, "opts.repeats",
                           "repeats must be <= 100000 and warmup <= 1000000");
    if (in->timeout_s > 0) o->timeout_s = in->timeout_s;
    if (in->rtol > 0) o->rtol = in->rtol;
    if (in->warmup > 0) o->warmup = in->warmup;
    if (in->min_warmup_s > 0) o->min_warmup_s = in->min_warmup_s;
    if (in->repeats > 0) o->repeats = in->repeats;
    if (in->min_sample_s > 0) o->min_sample_s = in->min_sample_s;
    o->seed = in->seed;
    o->check_only = in->check_only;
    o->check_prepacked = in->check_prepacked;
    o->const_args = in->const_args;
    o->cold_cache = in->cold_cache;
    o->mem_floor = in->mem_floor;
    o->use_fork = in->use_fork;
    o->device = in->device;
    return 0;
}

void measure__job_free(measure__job *j)
{
    if (j->base && j->base != MAP_FAILED) munmap(j->base, j->size);
    if (j->mfd >= 0) close(j->mfd);
    free(j->ref);
    memset(j, 0, sizeof *j);
    j->mfd = -1;
}

int measure__prepare(const ir_subgraph *g, const measure_opts *opts, int kind, size_t cubin_size,
                     measure__job *j, tlm_error *err)
{
    memset(j, 0, sizeof *j);
    j->mfd = -1;
    measure_opts o;
    int rc = resolve_opts(opts, &o, err);
    if (rc) return rc;
    if (g->n_tensor < 1 || g->n_tensor > IR_MAX_TENSORS || g->output < 0 ||
        g->output >= g->n_tensor)
        return tlm_err_set(err, TLM_EINVAL, "subgraph", "subgraph has no valid output tensor");

    int in[IR_MAX_TENSORS];
    int n_in = ir_subgraph_inputs(g, in);
    if (n_in < 0 || n_in > IR_MAX_TENSORS)
        return tlm_err_set(err, TLM_EINVAL, "subgraph", "subgraph has %d inputs", n_in);
    int n = n_in + 1;
    const ir_tensor *t[MEASURE__MAX_ARGS];
    for (int i = 0; i < n_in; i++)
        t[i] = &g->tensor[in[i]];
    t[n_in] = &g->tensor[g->output];

    size_t pg = page_size();
    measure__hdr proto;
    memset(&proto, 0, sizeof proto);
    uint64_t off = round_up(sizeof(measure__hdr), pg);
    proto.cubin_off = off;
    proto.cubin_size = cubin_size;
    off += round_up(cubin_size, pg);
    for (int i = 0; i < n; i++) {
        if (t[i]->dtype != IR_FLOAT32 && kind != MEASURE__KIND_CUDA)
            return tlm_err_set(err, TLM_EUNSUPPORTED, "dtype",
                               "tensor %s is %s; CPU measurement supports float32 tensors only",
                               t[i]->name, ir_dtype_name(t[i]->dtype));
        if ((unsigned)t[i]->dtype >= IR_DTYPE_COUNT)
            return tlm_err_set(err, TLM_EINVAL, "dtype", "tensor %s has no valid dtype",
                               t[i]->name);
        int64_t numel = ir_tensor_numel(t[i]);
        if (numel <= 0 || (uint64_t)numel > MEASURE_MAX_TOTAL_BYTES / 4)
            return tlm_err_set(err, TLM_ELIMIT, "subgraph", "tensor %s has %lld elements",
                               t[i]->name, (long long)numel);
        measure__arg *a = &proto.arg[i];
        a->bytes = (uint64_t)numel * 4;
        a->dtype = (int32_t)t[i]->dtype;
        a->seg_off = off;
        a->seg_size = round_up(a->bytes, pg);
        a->data_off = a->seg_off + ((a->seg_size - a->bytes) & ~(uint64_t)63);
        off += a->seg_size;
        if (off > MEASURE_MAX_TOTAL_BYTES)
            return tlm_err_set(err, TLM_ELIMIT, "subgraph", "the kernel's buffers exceed %llu GiB",
                               (unsigned long long)(MEASURE_MAX_TOTAL_BYTES >> 30));
    }
    proto.magic = MEASURE__MAGIC;
    proto.version = MEASURE__VERSION;
    proto.kind = kind;
    proto.n_args = n;
    proto.ppid = getpid();
    proto.total_size = off;
    proto.timeout_ns = (int64_t)(o.timeout_s * 1e9);
    proto.check_only = o.check_only;
    proto.check_prepacked = o.check_prepacked;
    proto.in_place = kind == MEASURE__KIND_CPU ? ir_subgraph_inplace_input(g) : -1;
    proto.const_args = o.const_args;
    proto.cold_cache = o.cold_cache;
    proto.mem_floor = o.mem_floor;
    proto.warmup = o.warmup;
    proto.repeats = o.repeats;
    proto.min_warmup_s = o.min_warmup_s;
    proto.min_sample_s = o.min_sample_s;
    proto.device = o.device;

    j->mfd = memfd_create("tlm-measure", MFD_CLOEXEC);
    if (j->mfd < 0) return tlm_err_set(err, TLM_EIO, "", "memfd_create: %s", strerror(errno));
    if (ftruncate(j->mfd, (off_t)off) != 0) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "cannot size shared memory to %llu bytes: %s",
                         (unsigned long long)off, strerror(errno));
        measure__job_free(j);
        return rc;
    }
    j->size = (size_t)off;
    j->base = mmap(NULL, j->size, PROT_READ | PROT_WRITE, MAP_SHARED, j->mfd, 0);
    if (j->base == MAP_FAILED) {
        j->base = NULL;
        rc = tlm_err_set(err, TLM_ENOMEM, "", "mmap of %zu bytes: %s", j->size, strerror(errno));
        measure__job_free(j);
        return rc;
    }
    j->h = (measure__hdr *)j->base;
    memcpy(j->h, &proto, sizeof proto);

    uint64_t seed = o.seed;
    if (seed == 0) {
        uint64_t s = (uint64_t)tlm_now_ns() ^ ((uint64_t)getpid() << 32);
        seed = rng_next(&s);
        if (seed == 0) seed = 1;
    }
    j->seed = seed;
    uint64_t state = seed;
    const float *inputs[IR_MAX_TENSORS];
    for (int i = 0; i < n_in; i++) {
        float *p = (float *)(j->base + proto.arg[i].data_off);
        uint64_t cnt = proto.arg[i].bytes / 4;
        for (uint64_t e = 0; e < cnt; e++)
            p[e] = rng_uniform(&state);
        /* 16-bit inputs: the reference sees exactly the values the kernel gets */
        if (proto.arg[i].dtype != IR_FLOAT32)
            for (uint64_t e = 0; e < cnt; e++)
                p[e] = measure__half_to_f32(proto.arg[i].dtype,
                                            measure__f32_to_half(proto.arg[i].dtype, p[e]));
        inputs[i] = p;
    }
    uint32_t *outp = (uint32_t *)(j->base + proto.arg[n - 1].data_off);
    uint64_t n_out = proto.arg[n - 1].bytes / 4;
    for (uint64_t e = 0; e < n_out; e++)
        outp[e] = MEASURE__POISON_BITS;

    j->ref = malloc(sizeof(double) * n_out);
    if (!j->ref) {
        measure__job_free(j);
        return tlm_err_set(err, TLM_ENOMEM, "", "no memory for the reference output");
    }
    bool fresh = false;
    rc = ref_cached(g, o.seed, n_out, j->ref, inputs, &fresh, err);
    if (rc) {
        measure__job_free(j);
        return rc;
    }
    /* OpenBLAS's worker threads (the reference's dgemm) spin for ~0.1 s after a call before
     * they sleep: a kernel timed at once shares the cores with them (on 2 cores the first
     * candidate after a fresh reference measured up to 10x slow). Let them park first. */
    if (fresh && !o.check_only) usleep(200000);
    for (uint64_t e = 0; e < n_out; e++) {
        if (!isfinite(j->ref[e])) {
            double v = j->ref[e];
            measure__job_free(j);
            return tlm_err_set(err, TLM_EUNSUPPORTED, "subgraph",
                               "the reference output is not finite (out[%llu] = %g) on random "
                               "inputs in [-1, 1]; cannot check this kernel",
                               (unsigned long long)e, v);
        }
    }
    j->flops = (double)ir_subgraph_flops(g);
    j->rtol = o.rtol;
    /* half types: fp32 accumulation and one rounding of the output (bfloat16: 2^-9 relative)
     * cannot meet float32's default; 1e-2 relative, as KernelBench uses for them */
    if (g->tensor[g->output].dtype != IR_FLOAT32 && !(opts && opts->rtol > 0))
        j->rtol = MEASURE_HALF_RTOL;
    return 0;
}

/* ---- parent side: spawning --------------------------------------------------------------- */

/* Moves fd out of 0..9 so that dup2 onto 3 and 4 in the runner cannot clobber it. */
static int fd_high(int *fd)
{
    if (*fd >= 10) return 0;
    int nfd = fcntl(*fd, F_DUPFD_CLOEXEC, 10);
    if (nfd < 0) return -1;
    close(*fd);
    *fd = nfd;
    return 0;
}

/* The runner's environment: ours, minus any runner variable, plus the runner variable, with
 * OPENBLAS_NUM_THREADS=1 when unset, the kernel's OpenMP threads bound one per logical CPU when
 * the caller says nothing of placement (OMP_PLACES, OMP_PROC_BIND, GOMP_CPU_AFFINITY) and,
 * under ASan, signals left to the kernel.
 *
 * Unbound, libgomp's team could share one CPU for whole calls on a 2-vCPU KVM guest: the
 * thread at the barrier spins (GOMP_SPINCOUNT) while the other waits for its time slice, and
 * the same 0.06-GFLOP attention kernel measured 8.0 ms in 10 runs of 12 and 0.47-0.50 ms in
 * 12 of 12 bound (OMP_PLACES=threads) or one thread 0.85 ms: the search's winners "slowed
 * down" 10x when re-measured, and every figure carried the lottery. Bound threads are what a
 * deployment pins anyway (OMP_PLACES / taskset). */
static char **runner_env(pid_t ppid, char *runner_var, size_t runner_cap, char **asan_out)
{
    size_t n = 0;
    for (char **e = environ; e && *e; e++)
        n++;
    char **env = calloc(n + 6, sizeof(char *));
    if (!env) return NULL;
    size_t k = 0;
    bool have_blas = false, have_places = false;
    const char *asan = NULL;
    for (char **e = environ; e && *e; e++) {
        if (!strncmp(*e, MEASURE__ENV "=", sizeof MEASURE__ENV)) continue;
        if (!strncmp(*e, "OPENBLAS_NUM_THREADS=", 21)) have_blas = true;
        if (!strncmp(*e, "OMP_PLACES=", 11) || !strncmp(*e, "OMP_PROC_BIND=", 14) ||
            !strncmp(*e, "GOMP_CPU_AFFINITY=", 18))
            have_places = true;
        if (!strncmp(*e, "ASAN_OPTIONS=", 13)) {
            asan = *e + 13;
            continue;
        }
        env[k++] = *e;
    }
    snprintf(runner_var, runner_cap, "%s=v1:%ld:%d:%d", MEASURE__ENV, (long)ppid, MEASURE__PIPE_FD,
             MEASURE__SHM_FD);
    env[k++] = runner_var;
    if (!have_blas) env[k++] = "OPENBLAS_NUM_THREADS=1";
    if (!have_places) {
        env[k++] = "OMP_PLACES=threads";
        env[k++] = "OMP_PROC_BIND=close";
    }
    *asan_out = NULL;
#ifdef MEASURE_ASAN
    /* Let a fault in the (uninstrumented) kernel kill the runner with its signal, skip the
     * leak check of a process that _exits on purpose, and leave the shadow gap to the CUDA
     * driver, which maps memory there (cuInit/cuMemAlloc fail otherwise). */
    static const char extra[] = "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:"
                                "handle_abort=0:detect_leaks=0:protect_shadow_gap=0";
    size_t len = (asan ? strlen(asan) : 0) + sizeof extra + 32;
    *asan_out = malloc(len);
    if (*asan_out) {
        snprintf(*asan_out, len, "ASAN_OPTIONS=%s%s%s", asan ? asan : "", asan && *asan ? ":" : "",
                 extra);
        env[k++] = *asan_out;
    }
#else
    if (asan) env[k++] = (char *)asan - 13;
#endif
    env[k] = NULL;
    return env;
}

/* The runner starts with the spawning thread's affinity mask, and its libgomp sizes and places
 * the kernel's team by the mask it starts with. Where this process's OpenMP has places
 * (OMP_PLACES or OMP_PROC_BIND set, as the README advises for timing), libgomp bound the
 * initial thread, and every thread started from it since, to the first place: a runner spawned
 * from such a thread saw one CPU and timed every kernel on one thread (`OMP_PROC_BIND=close
 * tlm tune` on 2 CPUs: ResNet-50's 3x3 conv at batch 8 11.2 ms, 5.3 ms on both cores, and the
 * search chose for one core). So the spawning thread takes all the places' CPUs for the spawn;
 * *own keeps its mask to restore. False where there are no places (the mask is the caller's
 * choice, e.g. taskset) or the mask is already theirs. */
static bool widen_to_places(cpu_set_t *own)
{
    int cpus[CPU_SETSIZE];
    const int n = target_omp_place_cpus(cpus, CPU_SETSIZE);
    if (n == 0 || sched_getaffinity(0, sizeof *own, own) != 0) return false;
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int i = 0; i < n; i++)
        CPU_SET(cpus[i], &all);
    return !CPU_EQUAL(&all, own) && sched_setaffinity(0, sizeof all, &all) == 0;
}

static int spawn_exec(int pfd, int mfd, pid_t *pid, tlm_error *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    char runner_var[96];
    char *asan = NULL;
    char **env = runner_env(getpid(), runner_var, sizeof runner_var, &asan);
    if (!env) return tlm_err_set(err, TLM_ENOMEM, "", "no memory for the runner environment");
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd, MEASURE__PIPE_FD);
    posix_spawn_file_actions_adddup2(&fa, mfd, MEASURE__SHM_FD);
    posix_spawnattr_init(&at);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    posix_spawnattr_setpgroup(&at, 0);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                      POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {"tlm-measure-runner", NULL};
    cpu_set_t own;
    const bool widened = widen_to_places(&own);
    int rc = posix_spawn(pid, "/proc/self/exe", &fa, &at, argv, env);
    if (widened) sched_setaffinity(0, sizeof own, &own);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    free(env);
    free(asan);
    if (rc != 0)
        return tlm_err_set(err, TLM_EIO, "", "cannot start the runner (/proc/self/exe): %s",
                           strerror(rc));
    return 0;
}

static int spawn_fork(int pfd, int mfd, int rfd, pid_t *pid, tlm_error *err)
{
    pid_t ppid = getpid();
    pid_t p = fork();
    if (p < 0) return tlm_err_set(err, TLM_EIO, "", "fork: %s", strerror(errno));
    if (p == 0) {
        close(rfd);
        setpgid(0, 0);
        static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPIPE, SIGTERM};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            signal(sigs[i], SIG_DFL);
        sigset_t none;
        sigemptyset(&none);
        pthread_sigmask(SIG_SETMASK, &none, NULL);
        _exit(runner_body(pfd, mfd, ppid));
    }
    setpgid(p, p); /* both sides, so the group exists before the parent may kill it */
    *pid = p;
    return 0;
}

/* ---- parent side: following the runner ---------------------------------------------------- */

static void kill_runner(pid_t pid)
{
    kill(-pid, SIGKILL); /* its process group: the kernel's own children too */
    kill(pid, SIGKILL);
}

/* Waits for pid; kills it at the deadline. Returns 1 with *status, 0 when the status is
 * unavailable (SIGCHLD ignored). *killed says whether the deadline forced a kill. */
static int reap(pid_t pid, int64_t deadline, int *status, bool *killed)
{
    *killed = false;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return 1;
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return 0;
        if (tlm_now_ns() >= deadline) break;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    *killed = true;
    kill_runner(pid);
    for (;;) {
        pid_t r = waitpid(pid, status, 0);
        if (r == pid) return 1;
        if (r < 0 && errno != EINTR) return 0;
    }
}

/* Phases: -1 starting, 0 loading, 1 check run, 2 timing. */
static const char *phase_name(int phase)
{
    static const char *names[] = {"while starting", "while loading", "during the check run",
                                  "during timing"};
    return names[phase < -1 ? 0 : phase > 2 ? 3 : phase + 1];
}

/* Compares the check run's output with the reference (see measure.h for the formula). */
static void compare(const float *out, const double *ref, uint64_t n, double rtol,
                    measure_result *res)
{
    uint64_t bad = 0, first_bad = 0;
    double maxref = 0, maxerr = 0;
    uint64_t worst = 0;
    for (uint64_t i = 0; i < n; i++) {
        double o = out[i];
        if (fabs(ref[i]) > maxref) maxref = fabs(ref[i]);
        if (!isfinite(o)) {
            if (bad++ == 0) first_bad = i;
            continue;
        }
        double e = fabs(o - ref[i]);
        if (e > maxerr) {
            maxerr = e;
            worst = i;
        }
    }
    if (bad) {
        uint32_t bits;
        memcpy(&bits, &out[first_bad], 4);
        res->status = MEASURE_WRONG;
        res->rel_err = INFINITY;
        snprintf(res->detail, sizeof res->detail,
                 "%llu of %llu output elements are not finite; first out[%llu] = %s "
                 "(expected %.9g)",
                 (unsigned long long)bad, (unsigned long long)n, (unsigned long long)first_bad,
                 bits == MEASURE__POISON_BITS ? "never written (still the NaN poison)"
                 : isnan(out[first_bad])      ? "NaN"
                                              : "inf",
                 ref[first_bad]);
        return;
    }
    res->rel_err = maxerr / fmax(maxref, FLT_MIN);
    if (res->rel_err > rtol) {
        res->status = MEASURE_WRONG;
        snprintf(res->detail, sizeof res->detail,
                 "rel_err %.3g > rtol %.3g; worst out[%llu] = %.9g, expected %.9g", res->rel_err,
                 rtol, (unsigned long long)worst, (double)out[worst], ref[worst]);
    } else {
        res->status = MEASURE_OK;
    }
}

/* One attempt. *started is false when the runner never said hello: /proc/self/exe could not
 * be executed or is not this program (started through ld.so, or under valgrind). */
static int run_once(measure__job *j, bool use_fork, bool *started, measure_result *res,
                    tlm_error *err)
{
    *started = true;
    measure__hdr *h = j->h;
    memset(res, 0, sizeof *res);
    res->rel_err = -1;
    res->seed = j->seed;

    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return tlm_err_set(err, TLM_EIO, "", "pipe: %s", strerror(errno));
    int rfd = p[0], wfd = p[1];
    int mfd = j->mfd;
    int rc = 0;
    if (fd_high(&wfd) != 0 || fd_high(&mfd) != 0) {
        rc = tlm_err_set(err, TLM_EIO, "", "fcntl: %s", strerror(errno));
        goto close_fds;
    }
    j->mfd = mfd;

    int64_t start = tlm_now_ns();
    int64_t deadline = start + h->timeout_ns;
    h->deadline_ns = deadline;
    pid_t pid = -1;
    rc = use_fork ? spawn_fork(wfd, mfd, rfd, &pid, err) : spawn_exec(wfd, mfd, &pid, err);
    close(wfd);
    wfd = -1;
    if (rc != 0) {
        *started = false;
        goto close_fds;
    }

    const float *out = (const float *)(j->base + h->arg[h->n_args - 1].data_off);
    uint64_t n_out = h->arg[h->n_args - 1].bytes / 4;
    int phase = -1;
    bool final = false, eof = false, timed_out = false;
    measure__msg m;
    size_t have = 0;
    while (!final) {
        int64_t now = tlm_now_ns();
        if (now >= deadline) {
            timed_out = true;
            break;
        }
        struct pollfd pfd = {.fd = rfd, .events = POLLIN};
        int wait_ms = (int)((deadline - now + 999999) / 1000000);
        int pr = poll(&pfd, 1, wait_ms);
        if (pr < 0 && errno != EINTR) {
            rc = tlm_err_set(err, TLM_EIO, "", "poll: %s", strerror(errno));
            final = true;
            break;
        }
        if (pr <= 0) continue;
        ssize_t r = read(rfd, (char *)&m + have, sizeof m - have);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            eof = true;
            break;
        }
        if (r == 0) {
            eof = true;
            break;
        }
        have += (size_t)r;
        if (have < sizeof m) continue;
        have = 0;
        if (m.magic != MEASURE__MAGIC) {
            /* Only a kernel writing to our pipe's fd gets here. */
            res->status = MEASURE_CRASH;
            snprintf(res->detail, sizeof res->detail, "the runner's result pipe was corrupted %s",
                     phase_name(phase));
            final = true;
            break;
        }
        m.text[sizeof m.text - 1] = 0;
        switch (m.kind) {
        case MEASURE__MSG_HELLO:
            phase = 0;
            break;
        case MEASURE__MSG_LOADED:
            phase = 1;
            break;
        case MEASURE__MSG_LOAD_ERROR:
            res->status = MEASURE_LOAD_ERROR;
            snprintf(res->detail, sizeof res->detail, "%s", m.text);
            final = true;
            break;
        case MEASURE__MSG_CHECKED:
            res->check_s = m.t_check;
            compare(out, j->ref, n_out, j->rtol, res);
            if (res->status != MEASURE_OK || h->check_only) final = true;
            phase = 2;
            break;
        case MEASURE__MSG_TIMED:
            res->status = MEASURE_OK;
            res->median_s = m.median;
            res->min_s = m.min;
            res->n_samples = m.n_samples;
            res->inner = m.inner;
            res->floor_s = m.floor_median;
            res->floor_ratio = m.floor_ratio;
            res->threads = m.threads;
            res->gflops = m.median > 0 ? j->flops / m.median * 1e-9 : 0;
            if (m.n_samples == 0)
                snprintf(res->detail, sizeof res->detail, "%s",
                         "the timeout left no time for samples; the time is the warm-up's "
                         "mean, or the check run's");
            final = true;
            break;
        case MEASURE__MSG_FAULT:
            res->status = MEASURE_CRASH;
            snprintf(res->detail, sizeof res->detail, "%s %s", m.text, phase_name(phase));
            final = true;
            break;
        case MEASURE__MSG_ERROR:
            rc = tlm_err_set(err, m.code < 0 ? m.code : TLM_ERUNTIME, "", "%s", m.text);
            final = true;
            break;
        default:
            res->status = MEASURE_CRASH;
            snprintf(res->detail, sizeof res->detail, "the runner sent message kind %d %s", m.kind,
                     phase_name(phase));
            final = true;
            break;
        }
    }

    int status = 0;
    bool killed = false;
    if (final || timed_out) {
        /* Nothing more is needed from the runner: do not wait for its teardown. */
        kill_runner(pid);
        reap(pid, deadline, &status, &killed);
        if (timed_out) {
            res->status = MEASURE_TIMEOUT;
            res->median_s = res->min_s = res->gflops = 0;
            snprintf(res->detail, sizeof res->detail, "no result within %.3g s (killed %s)",
                     (double)h->timeout_ns * 1e-9, phase_name(phase));
        }
    } else if (eof) {
        int got = reap(pid, deadline, &status, &killed);
        kill(-pid, SIGKILL); /* anything the kernel started; the group id is not reused yet */
        if (phase < 0 && !killed) {
            *started = false;
            rc = tlm_err_set(err, TLM_EIO, "",
                             "the runner process did not start (%s %d); is /proc/self/exe this "
                             "program?",
                             got && WIFSIGNALED(status) ? "signal" : "exit status",
                             !got                  ? -1
                             : WIFSIGNALED(status) ? WTERMSIG(status)
                                                   : WEXITSTATUS(status));
        } else if (killed) {
            res->status = MEASURE_TIMEOUT;
            snprintf(res->detail, sizeof res->detail,
                     "the runner closed its pipe but did not exit within %.3g s (killed %s)",
                     (double)h->timeout_ns * 1e-9, phase_name(phase));
        } else {
            res->status = MEASURE_CRASH;
            if (!got)
                snprintf(res->detail, sizeof res->detail,
                         "the runner died %s; exit status unavailable (SIGCHLD ignored?)",
                         phase_name(phase));
            else if (WIFSIGNALED(status))
                snprintf(res->detail, sizeof res->detail, "killed by %s (%d) %s",
                         signal_name(WTERMSIG(status)), WTERMSIG(status), phase_name(phase));
            else
                snprintf(res->detail, sizeof res->detail, "exited with status %d %s",
                         WIFEXITED(status) ? WEXITSTATUS(status) : -1, phase_name(phase));
        }
        res->median_s = res->min_s = res->gflops = 0;
    }

close_fds:
    if (wfd >= 0) close(wfd);
    close(rfd);
    return rc;
}

int measure__run(measure__job *j, bool use_fork, measure_result *res, tlm_error *err)
{
    bool started = true;
    if (!use_fork) {
        int rc = run_once(j, false, &started, res, err);
        if (rc == 0 || started || j->h->kind != MEASURE__KIND_CPU) return rc;
        /* No usable exec (no /proc in a chroot; ld.so or valgrind as /proc/self/exe): a fork is
         * the best we can do for a CPU kernel. The shared memory is still untouched. */
    }
    return run_once(j, true, &started, res, err);
}

/* ---- public: CPU ------------------------------------------------------------------------- */

int measure_cpu(const ir_subgraph *g, const char *so_path, const char *entry,
                const measure_opts *opts, measure_result *res, tlm_error *err)
{
    if (!g || !so_path || !entry || !res)
        return tlm_err_set(err, TLM_EINVAL, "", "measure_cpu: NULL argument");
    memset(res, 0, sizeof *res);
    res->rel_err = -1;
    size_t elen = strlen(entry);
    if (elen == 0 || elen > 200)
        return tlm_err_set(err, TLM_EINVAL, "entry", "entry must be 1..200 characters");
    for (size_t i = 0; i < elen; i++) {
        char c = entry[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                  (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return tlm_err_set(err, TLM_EINVAL, "entry",
                               "entry '%s' is not a C identifier ([A-Za-z_][A-Za-z0-9_]*)", entry);
    }
    /* dlopen searches the library path for a name without '/': make it relative to cwd. */
    bool rel = strchr(so_path, '/') == NULL;
    if (so_path[0] == 0 || strlen(so_path) + 3 > sizeof(((measure__hdr *)0)->so_path))
        return tlm_err_set(err, TLM_EINVAL, "so_path", "so_path must be 1..4000 characters");

    measure__job j;
    int rc = measure__prepare(g, opts, MEASURE__KIND_CPU, 0, &j, err);
    if (rc) return rc;
    snprintf(j.h->so_path, sizeof j.h->so_path, "%s%s", rel ? "./" : "", so_path);
    snprintf(j.h->entry, sizeof j.h->entry, "%s", entry);
    rc = measure__run(&j, opts && opts->use_fork, res, err);
    measure__job_free(&j);
    return rc;
}
