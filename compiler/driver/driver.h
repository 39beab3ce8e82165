/* driver.h — one scheduled kernel from (space, schedule) to a binary artifact in memory.
 *
 * Contract:
 *  - drv_build runs codegen (cg_generate) and the toolchain for the space's target: CPU →
 *    the system cc with the target's -march flags and -O3 into a private temporary directory
 *    (the .so is read back into memory and the directory removed); CUDA → NVRTC for the
 *    target's sm, then the cubin's registers and shared memory are checked against the
 *    target's limits (TLM_ELIMIT when they do not fit). Nothing is left on disk.
 *  - The artifact is self-contained (heap copies): source, binary bytes and their SHA-256,
 *    entry (the lowered name for cubins), format "elf-so" | "cubin", launch JSON, resources
 *    JSON (ptxas figures for cubins, "{}" for CPU), the printed schedule, and the compile
 *    flags that are not part of the toolchain identity.
 *  - drv_toolchain_key names everything about the toolchain that changes the binary for a
 *    target (identity + per-target flags): it is the toolchain part of a cache key.
 *  - Any thread may call these functions concurrently (the daemon's pool threads do). The
 *    first call of drv_toolchain_key per kind runs the compiler / loads NVRTC; callers that
 *    must not block (an event loop) call it once at start-up.
 */
#ifndef TLM_DRIVER_H
#define TLM_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "compiler/codegen/codegen.h"
#include "compiler/measure/gpu_model.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/util/err.h"

#define DRV_LAUNCH_MAX 256
#define DRV_SCHED_MAX 4096

typedef struct drv_artifact {
    char *source;
    uint8_t *binary;
    size_t binary_size;
    char sha256[65];
    char entry[CG_ENTRY_MAX + 192]; /* cubins: the lowered (mangled) name */
    const char *format;             /* "elf-so" | "cubin" (static string) */
    char launch_json[DRV_LAUNCH_MAX];
    char resources_json[256];
    char schedule[DRV_SCHED_MAX];
    char flags[256];
    measure_launch launch; /* CUDA launch (zero for CPU) */
    /* CUDA: ptxas figures of the entry (tc_cubin's; -1 where unknown, all 0 for CPU) */
    int regs, smem_static, spill_stores, spill_loads, stack_bytes;
    double codegen_s, compile_s;
} drv_artifact;

/* Builds the kernel of schedule s (which must pass space_check) into *out (zeroed first;
 * release with drv_artifact_free after success and failure). When code generation worked but
 * the compiler or the device limits failed, out->source still holds the source (the caller
 * may show it) and out->binary is NULL. */
int drv_build(const space *sp, const space_sched *s, drv_artifact *out, tlm_error *err);
void drv_artifact_free(drv_artifact *a);

/* Writes "<toolchain identity>; flags=<per-target flags>" into buf. Returns its length or a
 * negative code (cap too small). */
int drv_toolchain_key(const target *t, char *buf, size_t cap);
/* A measurement record's toolchain id: drv_toolchain_key, and "; const_args=0x.." when the
 * kernel was timed with those inputs packed once (measure_opts.const_args: a network's
 * weights), another protocol than packing per call. */
int drv_record_toolchain(const target *t, uint32_t const_args, char *buf, size_t cap);

/* Measures a CPU artifact of subgraph g on this machine (the .so goes through a private
 * temporary file). See measure_cpu for what the result means. */
int drv_measure_cpu(const ir_subgraph *g, const drv_artifact *a, const measure_opts *opts,
                    measure_result *res, tlm_error *err);

/* Predicts the time of a built CUDA artifact of schedule s with the analytic GPU model
 * (compiler/measure/gpu_model.h) from its launch and ptxas figures. TLM_EINVAL for a CPU
 * artifact; otherwise measure_gpu_model's codes. */
int drv_gpu_model(const space *sp, const space_sched *s, const drv_artifact *a,
                  measure_gpu_pred *out, tlm_error *err);

#endif
