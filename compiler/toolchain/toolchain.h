/* toolchain.h — source to binary: C → shared object (system cc), CUDA C → cubin (NVRTC).
 *
 * Contract:
 *  - tc_cc_compile writes the source into a private temporary directory, runs the system C
 *    compiler ($CC, else `cc`) without a shell (posix_spawn) as
 *        CC -std=gnu11 -shared -fPIC -fopenmp FLAGS -o kernel.so kernel.c -lm
 *    under a wall-clock timeout (the compiler's whole process group is killed when it runs
 *    over), then renames the result onto out_so_path atomically (readers never see a partial
 *    file) and removes its temporary files. FLAGS is split on blank space; no quoting, no
 *    shell expansion. Failures return TLM_ETOOLCHAIN with the first lines of the compiler's
 *    message in err->msg; the whole compiler output goes to *log_out when asked.
 *  - tc_nvrtc_compile compiles CUDA C++ in process with NVRTC, which is dlopen'ed on first use
 *    (never linked), so every binary starts on machines without the CUDA toolkit; there it
 *    returns TLM_EUNSUPPORTED. NVRTC needs no GPU. The result carries the cubin, the kernel's
 *    lowered (mangled) entry name for cuModuleGetFunction, and its resources as reported by
 *    ptxas: registers per thread, static shared memory, spills and stack frame. Search order:
 *    $TLM_NVRTC_LIB alone if set; else libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12 (the loader's
 *    path), then $CUDA_HOME/lib64/libnvrtc.so. The library is never unloaded.
 *  - Identities (tc_cc_identity, tc_nvrtc_identity) name the compiler versions and the fixed
 *    flags; they go into cache keys. The per-call FLAGS / sm / extra options are not part of
 *    them: callers hash those separately. Both strings are computed once and never change
 *    during the life of the process.
 *  - Every function here may be called from any thread, concurrently.
 *
 * Process notes: tc_cc_compile waits for its own child with waitpid(pid); a process that sets
 * SIGCHLD to SIG_IGN (auto-reaping) breaks that and gets TLM_ETOOLCHAIN. libuv's own SIGCHLD
 * handler only reaps the children it spawned, so the daemon is fine.
 */
#ifndef TLM_TOOLCHAIN_H
#define TLM_TOOLCHAIN_H

#include <stddef.h>
#include <stdint.h>

#include "compiler/util/err.h"

/* ---- C → shared object -------------------------------------------------------------- */

#define TC_CC_DEFAULT_TIMEOUT_MS 120000

typedef struct tc_cc_opts {
    int timeout_ms;       /* wall clock for the compiler; <= 0 means the default (120 s) */
    const char *compiler; /* overrides $CC for this call (blank-separated words); NULL = none */
} tc_cc_opts;

/* Compiles `source` into the shared object `out_so_path` (replaced atomically if present).
 * flags: extra compiler flags, e.g. "-O3 -march=native"; may be NULL. log_out: if non-NULL,
 * receives the compiler's combined stdout+stderr (malloc'ed, NUL-terminated, possibly empty;
 * also on failure; the caller frees it; NULL when nothing could be run).
 * Returns 0, TLM_EINVAL (bad argument), TLM_EIO (temporary files, output path) or
 * TLM_ETOOLCHAIN (compiler missing, failed, killed or timed out). */
int tc_cc_compile(const char *source, const char *flags, const char *out_so_path, char **log_out,
                  tlm_error *err);
/* The same with explicit options (opts may be NULL = defaults). */
int tc_cc_compile_ex(const char *source, const char *flags, const char *out_so_path,
                     const tc_cc_opts *opts, char **log_out, tlm_error *err);

/* ---- working directories ------------------------------------------------------------ */

/* Creates a private directory $TMPDIR/tlm-KIND-PID-RAND (or under /tmp; RAND: mkdtemp's six
 * random characters) into dir.
 * Returns 0, TLM_EINVAL (TMPDIR too long) or TLM_EIO. */
int tc_tmpdir_make(const char *kind, char *dir, size_t cap, tlm_error *err);
/* Removes a directory and everything in it (links are removed, not followed). */
void tc_remove_tree(const char *dir);
/* Removes the working directories ("tlm-cc-", "tlm-drv-") that a dead process left under
 * base (NULL: $TMPDIR or /tmp): named with a PID that no longer runs and unchanged for
 * min_age_s seconds, or, named before the PID was in them, for a day. Only real directories
 * of this user. Returns how many went. */
int tc_tmpdir_sweep(const char *base, int min_age_s);

/* "cc=/usr/bin/cc; version=cc (Debian 12.2.0-14) 12.2.0; base=-std=gnu11 -shared -fPIC
 * -fopenmp -lm", or with "version=unavailable" when the compiler cannot be run. */
const char *tc_cc_identity(void);

/* ---- CUDA C → cubin (NVRTC) --------------------------------------------------------- */

typedef struct tc_cubin {
    uint8_t *data; /* the cubin (an ELF image), `size` bytes */
    size_t size;
    char *entry; /* lowered name of the requested kernel, for cuModuleGetFunction */
    int sm;      /* the architecture it was built for, e.g. 90 */
    /* From ptxas -v for the entry; -1 where the log did not say (never seen with NVRTC 12/13). */
    int regs;         /* registers per thread */
    int smem_bytes;   /* static shared memory per block (dynamic shared memory comes on top) */
    int cmem_bytes;   /* constant bank 0 (kernel parameters); 0 if not reported */
    int spill_stores; /* bytes */
    int spill_loads;  /* bytes */
    int stack_bytes;  /* stack frame per thread (local memory for arrays, spills) */
    char *log;        /* NVRTC's program log (NUL-terminated); also set on compile errors */
} tc_cubin;

/* Compiles `cuda_src` for sm_<sm> (e.g. 80, 90) and extracts `kernel_name`. kernel_name is a
 * C++ name expression: a plain name for extern "C" or non-overloaded kernels, or e.g.
 * "gemm<64, 4>" for a template instance. Options: --gpu-architecture=sm_XX -default-device
 * --std=c++17 -lineinfo --ptxas-options=-v, then `extra_opts` (NULL-terminated, may be NULL;
 * e.g. "-maxrregcount=128"; callers add them to their cache key).
 * `out` is zeroed first; release it with tc_cubin_free after success AND failure (on a
 * compile error out->log holds the full NVRTC log). Returns 0, TLM_EINVAL (argument),
 * TLM_EUNSUPPORTED (no NVRTC, or an sm this NVRTC cannot target), TLM_ETOOLCHAIN (compile
 * error, kernel not defined; err->msg holds the first lines of the log), TLM_ENOMEM. */
int tc_nvrtc_compile(const char *cuda_src, const char *kernel_name, int sm, tc_cubin *out,
                     tlm_error *err);
int tc_nvrtc_compile_ex(const char *cuda_src, const char *kernel_name, int sm,
                        const char *const *extra_opts, tc_cubin *out, tlm_error *err);
void tc_cubin_free(tc_cubin *c);

/* 0 when NVRTC can be loaded, else TLM_EUNSUPPORTED with the reason. Cheap after the first
 * call. */
int tc_nvrtc_available(tlm_error *err);

/* "nvrtc=13.0; opts=-default-device --std=c++17 -lineinfo --ptxas-options=-v", or
 * "nvrtc:unavailable". */
const char *tc_nvrtc_identity(void);

/* Parses ptxas -v output (as found in an NVRTC log) for the entry `entry` (lowered name) into
 * c->regs, smem_bytes, cmem_bytes, spill_*, stack_bytes (-1 / 0 when absent). Returns 0 when
 * a "Used N registers" line for the entry was found, TLM_ENOTFOUND otherwise. Exposed for
 * tests and for logs produced elsewhere (nvcc -Xptxas -v prints the same lines). */
int tc_ptxas_parse(const char *log, const char *entry, tc_cubin *c);

/* Checks a compiled kernel against the launch it will get and the device's limits:
 *   regs > max_regs_per_thread                                   → TLM_ELIMIT
 *   register file needed by one block > regs_per_sm              → TLM_ELIMIT
 *     (per warp: regs*32 rounded up to the 256-register allocation unit)
 *   smem_bytes > smem_per_block_max                              → TLM_ELIMIT
 * (Per-block register limits equal the per-SM register file, 64 Ki, on sm_70..sm_90.)
 * Spills are NOT rejected: a kernel that spills is slow but correct; the measured time
 * penalises it and the tuner can see c->spill_* itself. Unknown figures (-1) are not checked.
 * threads_per_block must be 1..1024 and the limits positive, else TLM_EINVAL. */
int tc_cubin_check_limits(const tc_cubin *c, int max_regs_per_thread, int threads_per_block,
                          int regs_per_sm, int smem_per_block_max, tlm_error *err);

/* ---- shared by cc.c and nvrtc.c -------------------------------------------------------- */

/* Writes the informative head of a compiler log into buf (at most max_lines lines, joined by
 * single spaces so it fits one err->msg): from the first line that mentions "error", or from
 * the top when that line is only the linker's summary. Returns the length written. */
size_t tc_log_head(const char *log, char *buf, size_t size, int max_lines);

#endif
