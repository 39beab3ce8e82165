/* measure.h — run, check and time compiled kernels, safely.
 *
 * Contract:
 *  - A kernel's failure is a RESULT, not an error: measure_cpu / measure_cuda return 0 and set
 *    res->status to MEASURE_OK, WRONG, CRASH, TIMEOUT or LOAD_ERROR. They return a negative
 *    TLM_E* code only when no measurement could be made (bad argument, no GPU, out of memory,
 *    the reference interpreter refused the subgraph, the runner process could not start).
 *  - The kernel never runs in the caller's process. A crashing, hanging or memory-scribbling
 *    kernel cannot take the caller down, and every runner process is reaped before return
 *    (no zombies; on timeout its whole process group is SIGKILLed).
 *  - Inputs are fresh uniform random values in [-1, 1] (seeded by opts->seed, or from the
 *    clock when 0; the seed used is returned), the output is poisoned with NaN first, and the
 *    check run's output is compared with the reference (ir_interp_fast_f64: the interpreter in
 *    double precision, with contraction anchors by double BLAS) computed from the same inputs:
 *        rel_err = max_i |out_i - ref_i| / max(max_i |ref_i|, FLT_MIN)
 *    Any NaN or infinity in the output is WRONG (rel_err = +inf); rel_err > rtol is WRONG.
 *  - Timing (unless check_only): warm-up of at least `warmup` calls and `min_warmup_s`, then up
 *    to `repeats` samples; each sample times `inner` back-to-back calls, with inner chosen so a
 *    sample lasts at least `min_sample_s`; the per-call median and minimum are reported. The
 *    runner keeps a reserve before the timeout (10 % of it, at least 50 ms) and takes fewer
 *    samples rather than run over; n_samples says how many it took (0: the time is the
 *    warm-up's mean, or the check run's when even the warm-up did not fit).
 *  - Cache policy: by default every call sees the same buffers, i.e. a warm cache, as in the
 *    peers we compare with (OpenBLAS and oneDNN benchmarks, TVM's time_evaluator). With
 *    opts->cold_cache the runner rotates through enough copies of all arguments that their
 *    total reaches 1 GiB (at most 64 copies, 2 GiB), so each call's data comes from DRAM.
 *  - Not async-signal-safe. Any thread may call these functions, concurrently; the calling
 *    thread blocks for the reference computation plus at most opts->timeout_s (plus reaping).
 *    The process must not set SIGCHLD to SIG_IGN or reap others' children with waitpid(-1):
 *    the exit status of the runner is needed (without it a dead runner reads as a crash).
 *
 * Kernel ABI (what codegen emits, decided with the lead):
 *  - CPU: a shared object exporting `void <entry>_packed(void *const *args)`. args[] holds the
 *    subgraph's INPUT tensors in argument order (ir_subgraph_inputs), then the OUTPUT tensor;
 *    each a row-major float32 buffer, 64-byte aligned. (It also exports the typed
 *    `void <entry>(const float *in0, ..., float *out)`; the runner does not use it.) The
 *    kernel may use OpenMP. It must not write its inputs (they are mapped read-only) nor
 *    outside its output: a PROT_NONE guard page lies at most 64 bytes after the end of every
 *    argument, so overruns of reads and writes by more than 64 bytes fault (CRASH); accesses
 *    before the start are caught only beyond the page slack in front of the buffer.
 *  - CUDA: a cubin exporting `extern "C" __global__ void <entry>(const float *in0, ...,
 *    float *out)` (float16/bfloat16 workloads: 16-bit storage for every tensor; inputs are
 *    drawn in float32, rounded to the dtype, and the reference computed from the rounded
 *    values; default rtol MEASURE_HALF_RTOL), launched with the caller's grid, block and
 *    dynamic shared memory. Device buffers are cuMemAlloc'ed (256-byte aligned); 64 KiB after
 *    the output are filled with a pattern and verified after the check run (a write there is
 *    reported as CRASH).
 *
 * Process design (why a fresh exec): the caller is typically multithreaded (the daemon), uses
 * OpenMP (the TLM forward) and may hold a CUDA context. In a plain fork() child of such a
 * process, dlopen and malloc may deadlock on locks held by threads that do not exist in the
 * child, libgomp's thread pool is unusable, and CUDA is unusable. So the runner is a fresh
 * exec of /proc/self/exe started with posix_spawn: a constructor in cpu_runner.c recognises
 * the environment variable TLM_MEASURE_RUNNER, runs the kernel and _exits before main(). Any
 * binary that links measure_cpu therefore contains the runner; no helper binary is installed.
 * Costs: one exec per measurement (a few ms; more under sanitizers). Data travels through a
 * memfd (inputs, output, parameters) and a pipe (results and phase markers). The runner gets
 * PR_SET_PDEATHSIG=SIGKILL (it dies with the calling thread), RLIMIT_CORE=0, its own process
 * group, stdin and stdout on /dev/null, OPENBLAS_NUM_THREADS=1 when unset (OpenBLAS's idle
 * threads would compete with the kernel's), and, under AddressSanitizer, ASAN_OPTIONS that let
 * signals kill it (so the signal can be reported) and protect_shadow_gap=0 (which CUDA needs).
 * If /proc/self/exe cannot be executed or is not this program (no /proc in a chroot; started
 * through ld.so or valgrind: the runner never says hello), the CPU runner falls back to fork()
 * (opts->use_fork forces that: faster, and fine in a single-threaded process that has not
 * used OpenMP or CUDA); the CUDA runner then fails with TLM_EIO.
 * The environment is copied from `environ` at spawn time: do not setenv() concurrently.
 * A sanitized caller that uses CUDA itself (measure_cuda calls cuInit in the caller, through
 * tc_cuda_get) needs ASAN_OPTIONS=protect_shadow_gap=0 too, and LeakSanitizer may report
 * libcuda's own allocations.
 */
#ifndef TLM_MEASURE_H
#define TLM_MEASURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/ir/ir.h"
#include "compiler/util/err.h"

typedef enum {
    MEASURE_OK = 0,
    MEASURE_WRONG,      /* ran, output differs from the reference (or has NaN/inf) */
    MEASURE_CRASH,      /* killed by a signal, exited by itself, CUDA fault, wrote out of bounds */
    MEASURE_TIMEOUT,    /* no result within opts->timeout_s; the runner was killed */
    MEASURE_LOAD_ERROR, /* dlopen/dlsym or cuModuleLoadData/GetFunction failed, or the driver
                         * rejected the launch configuration */
    MEASURE_STATUS_COUNT
} measure_status;

#define MEASURE_DEFAULT_TIMEOUT_S 10.0
#define MEASURE_DEFAULT_RTOL 1e-4
#define MEASURE_HALF_RTOL 1e-2 /* the default for float16/bfloat16 outputs */
#define MEASURE_DEFAULT_WARMUP 1
#define MEASURE_DEFAULT_MIN_WARMUP_S 5e-3
#define MEASURE_DEFAULT_REPEATS 10
#define MEASURE_DEFAULT_MIN_SAMPLE_S 1e-3

/* Zero (or negative) numeric fields mean the default, so a zeroed struct is valid. */
typedef struct measure_opts {
    double timeout_s;    /* wall clock for the runner: load + check + timing (10 s) */
    double rtol;         /* tolerance on rel_err (1e-4, for float32) */
    uint64_t seed;       /* input RNG seed; 0 = from the clock */
    int warmup;          /* minimum warm-up calls (1) */
    double min_warmup_s; /* minimum warm-up time (5 ms) */
    int repeats;         /* timing samples (10) */
    double min_sample_s; /* minimum duration of one sample (1 ms) */
    bool check_only;     /* skip timing */
    /* CPU: after the check run, the kernel's prepack entries (codegen.h), when it has any,
     * pack its operands from copies of the inputs, those copies are overwritten with NaN,
     * and <entry>_prepacked must write the check run's output bit for bit; a difference is
     * MEASURE_CRASH with the first differing element in detail (tests; not timed). And for a
     * kernel a plan may run in place (ir_subgraph_inplace_input), the kernel run once more
     * with that input's copy also as its output must write the check run's output too. */
    bool check_prepacked;
    /* CPU: input arguments (bit i: input i) that stay the same between calls, as a plan's
     * params do: when the kernel has prepack entries for them, they are packed once, outside
     * the timing (per argument copy under cold_cache), and the check run and every timed call
     * go through <entry>_prepacked, as the runtime runs a plan's launches; 0: every call
     * packs what it packs */
    uint32_t const_args;
    bool cold_cache;     /* rotate through copies of the arguments (see the contract) */
    /* CPU, for memory-bound kernels: the bandwidth floor timed beside the kernel. After each
     * timed sample, as many calls of the floor on the same argument copies, on every thread:
     * a copy of the output's bytes from input 0 (the faster of a streaming copy and memcpy),
     * or, for a kernel that reads more than twice what it writes (a reduction), a read of its
     * inputs. res->floor_s is the floor's median per call and res->floor_ratio the median over
     * the samples of kernel / floor: the two sides of a ratio are a sample apart, so a machine
     * whose memory bandwidth drifts (a shared VM's does, by 2x within a minute) moves both */
    bool mem_floor;
    bool use_fork;       /* CPU: run in a fork() of this process instead of a fresh exec */
    int device;          /* CUDA device ordinal (0) */
} measure_opts;

typedef struct measure_result {
    int status;      /* measure_status */
    double median_s; /* per call; 0 unless OK and timed */
    double min_s;
    double gflops;  /* ir_subgraph_flops / median_s / 1e9; 0 when not timed */
    double rel_err; /* see the contract; -1 when no output was checked */
    double check_s; /* wall time of the check run (cold: first touch, thread start-up) */
    int n_samples;
    int64_t inner;    /* calls per sample */
    double floor_s;     /* opts.mem_floor: the floor's median per call; 0 otherwise */
    double floor_ratio; /* opts.mem_floor: median over the samples of kernel / floor; 0 otherwise */
    int threads;        /* CPU, timed: the OpenMP threads the kernel ran on in the runner */
    uint64_t seed;    /* the seed the inputs were drawn with */
    char detail[256]; /* human-readable: the signal, the loader's message, the worst element */
} measure_result;

typedef struct measure_launch {
    unsigned grid[3];  /* blocks, each >= 1 */
    unsigned block[3]; /* threads, each >= 1, product <= 1024 */
    unsigned smem;     /* dynamic shared memory in bytes */
} measure_launch;

void measure_opts_init(measure_opts *o);
/* "ok", "wrong", "crash", "timeout", "load_error"; "unknown" otherwise. */
const char *measure_status_name(int status);

/* Runs the CPU kernel `<entry>_packed` from the shared object so_path (see the ABI above) on
 * subgraph g. opts may be NULL (defaults). Returns 0 with *res filled, or TLM_EINVAL (argument),
 * TLM_ENOMEM, TLM_EIO (memfd, pipe, spawn), TLM_ELIMIT (buffers over 8 GiB), or the
 * interpreter's error. */
int measure_cpu(const ir_subgraph *g, const char *so_path, const char *entry,
                const measure_opts *opts, measure_result *res, tlm_error *err);

/* Runs the CUDA kernel `entry` (the lowered name, as cuModuleGetFunction wants it) from the
 * cubin image on device opts->device with the given launch. Returns 0 with *res filled, or
 * TLM_EUNSUPPORTED (no driver, no GPU: the message says which), TLM_EINVAL (argument, device
 * ordinal), TLM_ELIMIT (device memory), TLM_ENOMEM, TLM_EIO, or the interpreter's error. */
int measure_cuda(const ir_subgraph *g, const void *cubin, size_t size, const char *entry,
                 const measure_launch *launch, const measure_opts *opts, measure_result *res,
                 tlm_error *err);

#endif
