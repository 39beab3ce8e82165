/* driver.c — codegen + toolchain for one kernel, results kept in memory (see driver.h). */
#include "compiler/driver/driver.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "compiler/target/target.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/util/util.h"


/* -fno-trapping-math: the kernels never look at floating-point exception flags, and without
 * it GCC will not if-convert a compare-and-select (the clamp in tlm_expf, relu, max) on targets
 * without mask registers, so every exp-bearing loop (softmax, gelu, silu, sigmoid) stayed
 * scalar on AVX2 (5-8x slower than vectorised; AVX-512 if-converts through masks). Results are
 * unchanged: no operation is reordered or contracted by it.
 * -fno-predictive-commoning: in a register tile whose rows read overlapping inputs (a conv's
 * rows along OW, taps along KW) GCC carries loads across iterations in extra registers and
 * spills accumulators to make room. */
static void cpu_flags(const target *t, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s -O3 -fno-trapping-math -fno-predictive-commoning", target_cc_flags(t));
}

int drv_toolchain_key(const target *t, char *buf, size_t cap)
{
    char flags[256];
    int n;
    if (t->kind == TARGET_CUDA) {
        n = snprintf(buf, cap, "%s; flags=--gpu-architecture=sm_%d; codegen=%d",
                     tc_nvrtc_identity(), target_sm(t), CG_VERSION);
    } else {
        cpu_flags(t, flags, sizeof flags);
        n = snprintf(buf, cap, "%s; flags=%s; codegen=%d", tc_cc_identity(), flags, CG_VERSION);
    }
    return n < 0 || (size_t)n >= cap ? TLM_ELIMIT : n;
}

int drv_record_toolchain(const target *t, uint32_t const_args, char *buf, size_t cap)
{
    int n = drv_toolchain_key(t, buf, cap);
    if (n < 0 || !const_args) return n;
    int m = snprintf(buf + n, cap - (size_t)n, "; const_args=0x%x", (unsigned)const_args);
    return m < 0 || (size_t)(n + m) >= cap ? TLM_ELIMIT : n + m;
}

static int read_all(const char *path, uint8_t **data, size_t *len, tlm_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return tlm_err_set(err, TLM_EIO, "", "cannot read %s: %s", path, strerror(errno));
    struct stat st;
    uint8_t *buf = NULL;
    if (fstat(fileno(f), &st) == 0 && st.st_size > 0) {
        buf = malloc((size_t)st.st_size);
        if (buf && fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    if (!buf) return tlm_err_set(err, TLM_EIO, "", "cannot read %s", path);
    *data = buf;
    *len = (size_t)st.st_size;
    return 0;
}

static int build_cpu(const space *sp, cg_kernel *k, drv_artifact *a, tlm_error *err)
{
    char dir[512], so[600];
    int rc = tc_tmpdir_make("drv", dir, sizeof dir, err);
    if (rc) return rc;
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    cpu_flags(&sp->tgt, a->flags, sizeof a->flags);
    rc = tc_cc_compile(k->source, a->flags, so, NULL, err);
    if (rc == 0) rc = read_all(so, &a->binary, &a->binary_size, err);
    tc_remove_tree(dir);
    if (rc) return rc;
    snprintf(a->entry, sizeof a->entry, "%s", k->entry);
    a->format = "elf-so";
    snprintf(a->resources_json, sizeof a->resources_json, "{}");
    return 0;
}

static int build_cuda(const space *sp, cg_kernel *k, drv_artifact *a, tlm_error *err)
{
    const target *t = &sp->tgt;
    tc_cubin c;
    int rc = tc_nvrtc_compile(k->source, k->entry, target_sm(t), &c, err);
    if (rc) {
        tc_cubin_free(&c);
        return rc;
    }
    const target_gpu_info *gi = &t->gpu;
    int threads = k->block[0] * k->block[1] * k->block[2];
    /* Static shared memory comes on top of the dynamic part; the runner opts in above
     * 48 KiB, so the per-block ceiling is the opt-in limit (as in `tlm compile`). */
    int smem_left = gi->smem_per_block_optin - k->smem_bytes;
    if (smem_left <= 0 && (smem_left < 0 || c.smem_bytes > 0))
        rc = tlm_err_set(err, TLM_ELIMIT, "smem",
                         "the kernel needs %d bytes of dynamic shared memory (+%d static); %s "
                         "allows %d per block",
                         k->smem_bytes, c.smem_bytes, t->name, gi->smem_per_block_optin);
    else if (smem_left > 0)
        rc = tc_cubin_check_limits(&c, gi->max_regs_per_thread, threads, gi->regs_per_sm, smem_left,
                                   err);
    if (rc == 0) {
        a->binary = c.data; /* take ownership */
        a->binary_size = c.size;
        c.data = NULL;
        snprintf(a->entry, sizeof a->entry, "%s", c.entry ? c.entry : k->entry);
        a->format = "cubin";
        snprintf(a->flags, sizeof a->flags, "--gpu-architecture=sm_%d", c.sm);
        snprintf(a->resources_json, sizeof a->resources_json,
                 "{\"registers\":%d,\"smem_static\":%d,\"smem_dynamic\":%d,\"spill_stores\":%d,"
                 "\"spill_loads\":%d,\"stack\":%d}",
                 c.regs, c.smem_bytes, k->smem_bytes, c.spill_stores, c.spill_loads, c.stack_bytes);
        for (int i = 0; i < 3; i++) {
            a->launch.grid[i] = (unsigned)k->grid[i];
            a->launch.block[i] = (unsigned)k->block[i];
        }
        a->launch.smem = (unsigned)k->smem_bytes;
        a->regs = c.regs;
        a->smem_static = c.smem_bytes;
        a->spill_stores = c.spill_stores;
        a->spill_loads = c.spill_loads;
        a->stack_bytes = c.stack_bytes;
    }
    tc_cubin_free(&c);
    return rc;
}

int drv_build(const space *sp, const space_sched *s, drv_artifact *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    if (!sp || !s) return tlm_err_set(err, TLM_EINVAL, "", "drv_build: no space or schedule");
    int rc = space_check(sp, s, err);
    if (rc) return rc;
    space_print(sp, s, out->schedule, sizeof out->schedule);
    cg_kernel k;
    memset(&k, 0, sizeof k);
    double t0 = tlm_now_s();
    rc = cg_generate(sp, s, NULL, &k, err);
    double t1 = tlm_now_s();
    out->codegen_s = t1 - t0;
    if (rc) {
        cg_kernel_free(&k);
        return rc;
    }
    cg_launch_json(&k, out->launch_json, sizeof out->launch_json);
    rc = sp->tgt.kind == TARGET_CUDA ? build_cuda(sp, &k, out, err) : build_cpu(sp, &k, out, err);
    out->compile_s = tlm_now_s() - t1;
    out->source = k.source; /* kept after a compile failure too, for inspection */
    k.source = NULL;
    if (rc == 0) tlm_sha256_hex(out->binary, out->binary_size, out->sha256);
    cg_kernel_free(&k);
    return rc;
}

int drv_gpu_model(const space *sp, const space_sched *s, const drv_artifact *a,
                  measure_gpu_pred *out, tlm_error *err)
{
    if (!a || !a->format || strcmp(a->format, "cubin"))
        return tlm_err_set(err, TLM_EINVAL, "format", "the GPU model needs a built cubin");
    measure_gpu_kernel k;
    memset(&k, 0, sizeof k);
    for (int i = 0; i < 3; i++) {
        k.grid[i] = a->launch.grid[i];
        k.block[i] = a->launch.block[i];
    }
    k.smem_dynamic = a->launch.smem;
    k.regs = a->regs;
    k.smem_static = a->smem_static;
    k.spill_stores = a->spill_stores;
    k.spill_loads = a->spill_loads;
    k.stack_bytes = a->stack_bytes;
    return measure_gpu_model(sp, s, &k, out, err);
}

void drv_artifact_free(drv_artifact *a)
{
    if (!a) return;
    free(a->source);
    free(a->binary);
    memset(a, 0, sizeof *a);
}

int drv_measure_cpu(const ir_subgraph *g, const drv_artifact *a, const measure_opts *opts,
                    measure_result *res, tlm_error *err)
{
    if (!a->binary || strcmp(a->format, "elf-so"))
        return tlm_err_set(err, TLM_EINVAL, "", "drv_measure_cpu: not a CPU artifact");
    char dir[512], so[600];
    int rc = tc_tmpdir_make("drv", dir, sizeof dir, err);
    if (rc) return rc;
    snprintf(so, sizeof so, "%s/kernel.so", dir);
    FILE *f = fopen(so, "wb");
    bool ok = f && fwrite(a->binary, 1, a->binary_size, f) == a->binary_size;
    if (f) ok = (fclose(f) == 0) && ok;
    if (!ok)
        rc = tlm_err_set(err, TLM_EIO, "", "cannot write %s", so);
    else
        rc = measure_cpu(g, so, a->entry, opts, res, err);
    tc_remove_tree(dir);
    return rc;
}
