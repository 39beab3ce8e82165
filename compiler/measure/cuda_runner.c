/* cuda_runner.c — the CUDA runner: measure_cuda (parent side) and the runner's CUDA work.
 *
 * The kernel runs in the same kind of runner process as CPU kernels (see measure.h), always a
 * fresh exec: CUDA cannot be used in a fork() child of a process that initialised it, a
 * hanging kernel can only be stopped by ending its process, and a faulting kernel leaves its
 * context unusable. The driver comes from compiler/toolchain/cuda_dl (dlopen'ed, never linked).
 *
 * Status mapping in the runner:
 *   cuModuleLoadData / cuModuleGetFunction / cuFuncSetAttribute / cuLaunchKernel fail
 *                                               → LOAD_ERROR (the binary or launch is unusable)
 *   an error at synchronisation (illegal address, trap, misaligned access, ...) → CRASH
 *   writes into the 64 KiB after the output                                   → CRASH
 *   cuMemAlloc fails                                                           → TLM_ELIMIT
 *   no driver / no device in the runner                                        → TLM_EUNSUPPORTED
 */
#include "compiler/measure/measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/measure/runner.h"
#include "compiler/toolchain/cuda_dl.h"

#ifdef TLM_HAVE_CUDA_HEADERS
#define MEASURE_CU_ATTR_MAX_DYN_SMEM CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
#else
#define MEASURE_CU_ATTR_MAX_DYN_SMEM ((tc_cu_function_attribute)8)
#endif
/* Above this, a kernel must opt in to dynamic shared memory (all architectures since sm_70). */
#define MEASURE_CU_DEFAULT_SMEM 49152

/* "what: CUDA_ERROR_X (description)" into buf. */
static const char *cu_text(const tc_cuda *cu, tc_cu_result r, const char *what, char *buf,
                           size_t cap)
{
    tlm_error e;
    tlm_err_clear(&e);
    tc_cuda_check(cu, r, what, &e);
    size_t n = strnlen(e.msg, cap - 1); /* truncation is fine: the message is a hint */
    memcpy(buf, e.msg, n);
    buf[n] = 0;
    return buf;
}

typedef struct {
    const tc_cuda *cu;
    tc_cu_function fn;
    const measure__hdr *h;
    int k, next;
    void **params; /* k * MEASURE__MAX_ARGS pointers into dptr */
    tc_cu_event ev0, ev1;
    char why[200]; /* the driver's message when a batch fails */
} cuda_ctx;

static tc_cu_result launch(cuda_ctx *c, void **params)
{
    const measure__hdr *h = c->h;
    return c->cu->launch_kernel(c->fn, h->grid[0], h->grid[1], h->grid[2], h->block[0], h->block[1],
                                h->block[2], h->smem, NULL, params, NULL);
}

static int cuda_batch(void *vctx, int64_t inner, double *seconds)
{
    cuda_ctx *c = vctx;
    const tc_cuda *cu = c->cu;
    tc_cu_result r = cu->event_record(c->ev0, NULL);
    for (int64_t i = 0; r == TC_CUDA_SUCCESS && i < inner; i++) {
        r = launch(c, c->params + (size_t)c->next * MEASURE__MAX_ARGS);
        if (++c->next == c->k) c->next = 0;
    }
    if (r == TC_CUDA_SUCCESS) r = cu->event_record(c->ev1, NULL);
    if (r == TC_CUDA_SUCCESS) r = cu->event_synchronize(c->ev1);
    float ms = 0;
    if (r == TC_CUDA_SUCCESS) r = cu->event_elapsed_time(&ms, c->ev0, c->ev1);
    if (r != TC_CUDA_SUCCESS) {
        cu_text(cu, r, "kernel failed", c->why, sizeof c->why);
        return 1;
    }
    *seconds = (double)ms * 1e-3;
    return 0;
}

int measure__cuda_child(const measure__hdr *h, uint8_t *base, int pfd)
{
    const tc_cuda *cu;
    tlm_error e;
    tlm_err_clear(&e);
    char buf[200];
    if (tc_cuda_get(&cu, &e) != 0) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_EUNSUPPORTED, "%s", e.msg);
        return 0;
    }
    tc_cu_device dev;
    tc_cu_context ctx;
    tc_cu_result r = cu->device_get(&dev, h->device);
    if (r == TC_CUDA_SUCCESS) r = cu->primary_ctx_retain(&ctx, dev);
    if (r == TC_CUDA_SUCCESS) r = cu->ctx_set_current(ctx);
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_EUNSUPPORTED, "%s",
                      cu_text(cu, r, "cannot open the device", buf, sizeof buf));
        return 0;
    }

    tc_cu_module mod;
    tc_cu_function fn;
    r = cu->module_load_data(&mod, base + h->cubin_off);
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "%s",
                      cu_text(cu, r, "cuModuleLoadData", buf, sizeof buf));
        return 0;
    }
    r = cu->module_get_function(&fn, mod, h->entry);
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "%s",
                      cu_text(cu, r, "cuModuleGetFunction", buf, sizeof buf));
        return 0;
    }
    if (h->smem > MEASURE_CU_DEFAULT_SMEM) {
        r = cu->func_set_attribute(fn, MEASURE_CU_ATTR_MAX_DYN_SMEM, (int)h->smem);
        if (r != TC_CUDA_SUCCESS) {
            measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "%s",
                          cu_text(cu, r, "dynamic shared memory", buf, sizeof buf));
            return 0;
        }
    }

    int n = h->n_args;
    uint64_t set_bytes = 0, dev_bytes[MEASURE__MAX_ARGS];
    void *host16[MEASURE__MAX_ARGS] = {0}; /* 16-bit copies of the arguments */
    for (int i = 0; i < n; i++) {
        bool half = h->arg[i].dtype != IR_FLOAT32;
        uint64_t numel = h->arg[i].bytes / 4;
        dev_bytes[i] = numel * (half ? 2 : 4);
        set_bytes += (dev_bytes[i] + 255) / 256 * 256;
        if (!half) continue;
        uint16_t *q = malloc(dev_bytes[i]);
        if (!q) {
            measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s", "runner: out of memory");
            return 0;
        }
        const float *f = (const float *)(base + h->arg[i].data_off);
        for (uint64_t x = 0; x < numel; x++) q[x] = measure__f32_to_half(h->arg[i].dtype, f[x]);
        host16[i] = q;
    }
    int k = measure__cold_copies(h, set_bytes);
    /* Copy 0 is the check run's; the others exist only for cold-cache timing. */
    tc_cu_deviceptr *dptr = calloc((size_t)k * MEASURE__MAX_ARGS, sizeof *dptr);
    void **params = calloc((size_t)k * MEASURE__MAX_ARGS, sizeof *params);
    uint8_t *canary = malloc(MEASURE__CANARY_BYTES);
    if (!dptr || !params || !canary) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s", "runner: out of memory");
        return 0;
    }
    for (int c = 0; c < k; c++) {
        for (int i = 0; i < n; i++) {
            size_t bytes = dev_bytes[i] + (i == n - 1 ? MEASURE__CANARY_BYTES : 0);
            const void *src = host16[i] ? host16[i] : (const void *)(base + h->arg[i].data_off);
            tc_cu_deviceptr *p = &dptr[(size_t)c * MEASURE__MAX_ARGS + (size_t)i];
            r = cu->mem_alloc(p, bytes);
            if (r != TC_CUDA_SUCCESS) {
                measure__send(pfd, MEASURE__MSG_ERROR, TLM_ELIMIT, "%s",
                              cu_text(cu, r, "cuMemAlloc", buf, sizeof buf));
                return 0;
            }
            params[(size_t)c * MEASURE__MAX_ARGS + (size_t)i] = p;
            /* Inputs for every copy; the output (poisoned in shared memory) for copy 0. */
            if (i < n - 1 || c == 0)
                r = cu->memcpy_htod(*p, src, dev_bytes[i]);
            if (r == TC_CUDA_SUCCESS && i == n - 1)
                r = cu->memset_d8(*p + dev_bytes[i], MEASURE__CANARY_BYTE,
                                  MEASURE__CANARY_BYTES);
            if (r != TC_CUDA_SUCCESS) {
                measure__send(pfd, MEASURE__MSG_ERROR, TLM_ERUNTIME, "%s",
                              cu_text(cu, r, "copying the inputs", buf, sizeof buf));
                return 0;
            }
        }
    }
    measure__send(pfd, MEASURE__MSG_LOADED, 0, "%s", "");

    cuda_ctx cx = {.cu = cu, .fn = fn, .h = h, .k = k, .next = 0, .params = params};
    int64_t t0 = tlm_now_ns();
    r = launch(&cx, params);
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_LOAD_ERROR, 0, "%s",
                      cu_text(cu, r, "cuLaunchKernel", buf, sizeof buf));
        return 0;
    }
    r = cu->ctx_synchronize();
    double t_check = (double)(tlm_now_ns() - t0) * 1e-9;
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_FAULT, 0, "%s",
                      cu_text(cu, r, "kernel failed", buf, sizeof buf));
        return 0;
    }
    const measure__arg *out = &h->arg[n - 1];
    r = cu->memcpy_dtoh(host16[n - 1] ? host16[n - 1] : (void *)(base + out->data_off),
                        dptr[n - 1], dev_bytes[n - 1]);
    if (r == TC_CUDA_SUCCESS && host16[n - 1]) {
        float *f = (float *)(base + out->data_off);
        const uint16_t *q = host16[n - 1];
        for (uint64_t x = 0; x < out->bytes / 4; x++) f[x] = measure__half_to_f32(out->dtype, q[x]);
    }
    if (r == TC_CUDA_SUCCESS)
        r = cu->memcpy_dtoh(canary, dptr[n - 1] + dev_bytes[n - 1], MEASURE__CANARY_BYTES);
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_FAULT, 0, "%s",
                      cu_text(cu, r, "copying the output back", buf, sizeof buf));
        return 0;
    }
    for (size_t b = 0; b < MEASURE__CANARY_BYTES; b++) {
        if (canary[b] != MEASURE__CANARY_BYTE) {
            measure__send(pfd, MEASURE__MSG_FAULT, 0,
                          "the kernel wrote past the end of its output (byte +%zu after it)", b);
            return 0;
        }
    }
    measure__send_checked(pfd, t_check);
    if (h->check_only) return 0;

    r = cu->event_create(&cx.ev0, 0);
    if (r == TC_CUDA_SUCCESS) r = cu->event_create(&cx.ev1, 0);
    if (r != TC_CUDA_SUCCESS) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ERUNTIME, "%s",
                      cu_text(cu, r, "cuEventCreate", buf, sizeof buf));
        return 0;
    }
    measure__msg m;
    memset(&m, 0, sizeof m);
    m.kind = MEASURE__MSG_TIMED;
    m.t_check = t_check;
    int rc = measure__time(h, t_check, cuda_batch, &cx, NULL, NULL, &m);
    if (rc == 1) {
        measure__send(pfd, MEASURE__MSG_FAULT, 0, "%s", cx.why);
        return 0;
    }
    if (rc != 0) {
        measure__send(pfd, MEASURE__MSG_ERROR, TLM_ENOMEM, "%s", "runner: out of memory timing");
        return 0;
    }
    measure__send_msg(pfd, &m);
    /* The parent kills the runner now; the driver releases the context with the process. */
    return 0;
}

int measure_cuda(const ir_subgraph *g, const void *cubin, size_t size, const char *entry,
                 const measure_launch *launch_cfg, const measure_opts *opts, measure_result *res,
                 tlm_error *err)
{
    if (!g || !cubin || !entry || !launch_cfg || !res)
        return tlm_err_set(err, TLM_EINVAL, "", "measure_cuda: NULL argument");
    memset(res, 0, sizeof *res);
    res->rel_err = -1;
    if (size == 0 || size > (UINT64_C(1) << 30))
        return tlm_err_set(err, TLM_EINVAL, "cubin", "cubin size %zu is not in 1..1 GiB", size);
    size_t elen = strlen(entry);
    if (elen == 0 || elen >= sizeof(((measure__hdr *)0)->entry))
        return tlm_err_set(err, TLM_EINVAL, "entry", "entry must be 1..255 characters");
    uint64_t threads = 1;
    for (int d = 0; d < 3; d++) {
        if (launch_cfg->grid[d] < 1 || launch_cfg->block[d] < 1)
            return tlm_err_set(err, TLM_EINVAL,
                               launch_cfg->grid[d] < 1 ? "launch.grid" : "launch.block",
                               "launch grid and block dimensions must be >= 1 (got grid "
                               "%ux%ux%u, block %ux%ux%u)",
                               launch_cfg->grid[0], launch_cfg->grid[1], launch_cfg->grid[2],
                               launch_cfg->block[0], launch_cfg->block[1], launch_cfg->block[2]);
        threads *= launch_cfg->block[d];
    }
    if (threads > 1024)
        return tlm_err_set(err, TLM_EINVAL, "launch.block",
                           "a block has at most 1024 threads (got %llu)",
                           (unsigned long long)threads);
    if (opts && opts->device < 0)
        return tlm_err_set(err, TLM_EINVAL, "opts.device", "device ordinal must be >= 0");

    /* Checked here (not only in the runner) so that a machine without a GPU answers at once. */
    const tc_cuda *cu;
    int rc = tc_cuda_get(&cu, err);
    if (rc) return rc;
    int device = opts ? opts->device : 0;
    if (device >= cu->device_count)
        return tlm_err_set(err, TLM_EINVAL, "opts.device",
                           "device %d does not exist; this machine has %d", device,
                           cu->device_count);

    measure__job j;
    rc = measure__prepare(g, opts, MEASURE__KIND_CUDA, size, &j, err);
    if (rc) return rc;
    memcpy(j.base + j.h->cubin_off, cubin, size);
    snprintf(j.h->entry, sizeof j.h->entry, "%s", entry);
    for (int d = 0; d < 3; d++) {
        j.h->grid[d] = launch_cfg->grid[d];
        j.h->block[d] = launch_cfg->block[d];
    }
    j.h->smem = launch_cfg->smem;
    j.h->device = device;
    rc = measure__run(&j, false, res, err);
    measure__job_free(&j);
    return rc;
}
