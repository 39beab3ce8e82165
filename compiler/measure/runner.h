/* runner.h — internal to compiler/measure: the protocol between measure_cpu / measure_cuda (the
 * parent, in the caller's process) and the runner process that executes the kernel.
 *
 * Not part of the public API; only cpu_runner.c and cuda_runner.c include it.
 *
 * Shared memory: one memfd, laid out as
 *     [header pages][cubin pages (CUDA only)][arg 0 segment]...[arg n-1 segment]
 * Every segment starts on a page boundary and is a whole number of pages. An argument's data
 * lies at the END of its segment (start rounded down to 64 bytes), so in the CPU runner, which
 * maps each segment with a PROT_NONE guard page after it, an overrun of more than 64 bytes
 * faults. Arguments are the subgraph's inputs in argument order, then the output (last).
 * The parent writes the header, the random inputs and the poisoned output before the runner
 * starts; the runner writes the output of the check run in place; the parent reads it after
 * the CHECKED message.
 *
 * Pipe: the runner writes fixed-size measure__msg records (smaller than PIPE_BUF, so each write
 * is atomic) and the parent reads them. The messages double as phase markers: when the runner
 * dies, the last message received says whether it died loading, checking or timing.
 */
#ifndef TLM_MEASURE_RUNNER_H
#define TLM_MEASURE_RUNNER_H

#include <stdint.h>

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "compiler/ir/ir.h"
#include "compiler/measure/measure.h"
#include "compiler/util/util.h"

#define MEASURE__MAGIC 0x544c4d4d /* "TLMM" */
#define MEASURE__VERSION 4        /* 2: arguments carry their dtype; 3: mem_floor; 4: in_place */
#define MEASURE__MAX_ARGS (IR_MAX_TENSORS + 1)
/* Environment variable that turns a fresh exec of /proc/self/exe into a runner:
 * "v1:<parent pid>:<pipe fd>:<memfd>". */
#define MEASURE__ENV "TLM_MEASURE_RUNNER"
#define MEASURE__PIPE_FD 3
#define MEASURE__SHM_FD 4
/* Poison written into the output before the check run: a quiet NaN with a recognisable
 * payload. Any element the kernel fails to write stays NaN and fails the check. */
#define MEASURE__POISON_BITS 0x7fc0deadu
/* Bytes of device memory after a CUDA output that are filled with a pattern and verified
 * after the check run (the GPU has no guard pages). */
#define MEASURE__CANARY_BYTES 65536
#define MEASURE__CANARY_BYTE 0xa5

enum { MEASURE__KIND_CPU = 1, MEASURE__KIND_CUDA = 2 };

typedef struct {
    uint64_t seg_off;  /* page-aligned offset of the segment in the memfd */
    uint64_t seg_size; /* whole pages */
    uint64_t data_off; /* offset of the data in the memfd (inside the segment, 64-byte aligned) */
    uint64_t bytes;    /* numel * 4: float32 in the memfd whatever the dtype */
    int32_t dtype;     /* ir_dtype of the kernel's argument: the CUDA runner converts 16-bit
                        * types on the way to and from the device (the memfd holds their
                        * values as float32, already rounded to the dtype) */
    int32_t pad_;
} measure__arg;

/* bfloat16 / IEEE binary16 <-> float32 (round to nearest even; NaN stays NaN). */
static inline uint16_t measure__f32_to_half(int dtype, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (dtype == IR_BFLOAT16) {
        if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
    uint16_t s = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7e00;
    if (a >= 0x477ff000u) return s | 0x7c00; /* >= 65520: rounds to infinity */
    if (a < 0x38800000u) {                   /* below 2^-14: a subnormal half */
        float af;
        memcpy(&af, &a, 4);
        return s | (uint16_t)nearbyintf(af * 16777216.0f); /* exact scaling, then RNE */
    }
    uint32_t m = a + 0xfffu + ((a >> 13) & 1u); /* round the 13 dropped bits to even */
    return s | (uint16_t)((m - 0x38000000u) >> 13);
}

static inline float measure__half_to_f32(int dtype, uint16_t h)
{
    uint32_t u;
    float f;
    if (dtype == IR_BFLOAT16) {
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    }
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 1023u;
    if (e == 31) u = s | 0x7f800000u | (m << 13);
    else if (e != 0) u = s | ((e + 112u) << 23) | (m << 13);
    else {
        f = (float)m * (1.0f / 16777216.0f);
        return s ? -f : f;
    }
    memcpy(&f, &u, 4);
    return f;
}

typedef struct {
    uint32_t magic, version;
    int32_t kind;
    int32_t n_args;      /* inputs + 1; the output is the last */
    int64_t ppid;        /* the parent's pid, checked by the runner */
    uint64_t total_size; /* of the memfd */
    int64_t deadline_ns; /* CLOCK_MONOTONIC (system-wide): the parent kills at this time */
    int64_t timeout_ns;  /* the whole allowance, to size the timing reserve */
    int32_t check_only, cold_cache, check_prepacked, mem_floor;
    int32_t in_place; /* opts.check_prepacked: the input the output is also checked over, or -1 */
    uint32_t const_args;
    int32_t warmup, repeats;
    double min_warmup_s, min_sample_s;
    measure__arg arg[MEASURE__MAX_ARGS];
    /* CUDA */
    uint64_t cubin_off, cubin_size;
    uint32_t grid[3], block[3], smem;
    int32_t device;
    char so_path[4096]; /* CPU: the shared object */
    char entry[256];    /* CPU: <entry>_packed is called; CUDA: the kernel's name */
} measure__hdr;

enum {
    MEASURE__MSG_HELLO = 1,  /* the runner started (it is really this program) */
    MEASURE__MSG_LOADED,     /* the binary is loaded, the check run starts */
    MEASURE__MSG_LOAD_ERROR, /* text: why (dlopen/dlsym/cuModuleLoad/launch config) */
    MEASURE__MSG_CHECKED,    /* check run done, output in shared memory; t_check */
    MEASURE__MSG_TIMED,      /* median/min/n_samples/inner: the final message */
    MEASURE__MSG_FAULT,      /* the kernel failed in a way the runner saw (CUDA errors) */
    MEASURE__MSG_ERROR,      /* the runner could not do its job: code + text */
};

typedef struct {
    uint32_t magic;
    int32_t kind;
    int32_t code; /* MSG_ERROR: a TLM_E* code */
    int32_t n_samples;
    int32_t threads; /* MSG_TIMED (CPU): the kernel's OpenMP team, omp_get_max_threads() */
    int64_t inner;
    double t_check, median, min;
    double floor_median, floor_ratio; /* MSG_TIMED under mem_floor */
    char text[224];
} measure__msg;

_Static_assert(sizeof(measure__msg) <= 512, "a message must be written atomically");

/* ---- shared by cpu_runner.c and cuda_runner.c ---- */

/* Writes one message; a runner whose parent has gone away is terminated by SIGPIPE / _exit. */
void measure__send(int fd, int kind, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void measure__send_msg(int fd, measure__msg *m);
/* The check run finished in t_check seconds: the parent may compare the output now. */
void measure__send_checked(int fd, double t_check);

/* Timing policy (see measure.h): runs `batch(ctx, inner, &seconds)` for warm-up, then for up
 * to h->repeats samples, keeping a reserve before the deadline. Fills m's timing fields.
 * batch returns 0, or a nonzero value that is passed back (the kernel failed). floor (NULL:
 * none) is timed after each sample with as many calls (opts.mem_floor): m's floor fields. */
typedef int (*measure__batch_fn)(void *ctx, int64_t inner, double *seconds);
int measure__time(const measure__hdr *h, double t_check, measure__batch_fn batch, void *ctx,
                  measure__batch_fn floor, void *fctx, measure__msg *m);
/* Number of rotating copies for the cold-cache policy, given the bytes of one set of args. */
int measure__cold_copies(const measure__hdr *h, uint64_t set_bytes);

/* The CUDA side of the runner (cuda_runner.c). base maps the whole memfd read-write. */
int measure__cuda_child(const measure__hdr *h, uint8_t *base, int pfd);

/* ---- the parent side (cpu_runner.c) ---- */

/* One measurement in preparation: the memfd and its mapping in the parent, the reference. */
typedef struct {
    int mfd;
    uint8_t *base; /* the whole memfd, read-write, MAP_SHARED */
    size_t size;
    measure__hdr *h; /* == (measure__hdr *)base */
    double *ref;     /* reference output, h->arg[n_args-1].bytes / 4 values */
    double flops;
    double rtol;
    uint64_t seed;
} measure__job;

/* Validates g and opts, lays out and fills the memfd (header, random inputs, poisoned
 * output; cubin_size bytes reserved at h->cubin_off for the caller to fill) and computes the
 * reference. On failure everything is released. */
int measure__prepare(const ir_subgraph *g, const measure_opts *opts, int kind, size_t cubin_size,
                     measure__job *j, tlm_error *err);
void measure__job_free(measure__job *j);
/* Starts the runner, follows its messages, checks the output, reaps it, fills res.
 * use_fork: run in fork() without exec (CPU only). Returns 0 (res filled) or a negative code
 * (the runner could not start, or reported that it could not do its job). */
int measure__run(measure__job *j, bool use_fork, measure_result *res, tlm_error *err);

#endif
