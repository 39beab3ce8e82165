/* cuda_dl.c — dlopen of the CUDA driver; see cuda_dl.h for the contract. */
#include "compiler/toolchain/cuda_dl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TLM_CUDA_HOME
#define TLM_CUDA_HOME "/usr/local/cuda"
#endif

const char *tc_dl_cuda_home(void)
{
    const char *h = getenv("CUDA_HOME");
    return (h && *h) ? h : TLM_CUDA_HOME;
}

void *tc_dl_open_first(const char *const *names, char *which, size_t which_size, char *why,
                       size_t why_size)
{
    if (why && why_size) why[0] = '\0';
    for (size_t i = 0; names && names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            if (which && which_size) snprintf(which, which_size, "%s", names[i]);
            return h;
        }
        const char *e = dlerror();
        if (why && why_size) snprintf(why, why_size, "%s", e ? e : names[i]);
    }
    return NULL;
}

/* With the toolkit headers, check each pointer type against cuda.h's prototype, so a wrong
 * signature is a build error rather than a crash on a GPU machine. The prototypes of names
 * that cuda.h #defines to versioned symbols (cuMemAlloc → cuMemAlloc_v2) are exactly the
 * versioned ones we resolve below. */
#ifdef TLM_HAVE_CUDA_HEADERS
#define TC_SIGCHECK(member, fn)                                                                    \
    _Static_assert(                                                                                \
        __builtin_types_compatible_p(__typeof__(((tc_cuda *)0)->member), __typeof__(&fn)),         \
        "tc_cuda." #member " does not match cuda.h's " #fn)
TC_SIGCHECK(init, cuInit);
TC_SIGCHECK(driver_get_version, cuDriverGetVersion);
TC_SIGCHECK(get_error_string, cuGetErrorString);
TC_SIGCHECK(get_error_name, cuGetErrorName);
TC_SIGCHECK(device_get_count, cuDeviceGetCount);
TC_SIGCHECK(device_get, cuDeviceGet);
TC_SIGCHECK(device_get_name, cuDeviceGetName);
TC_SIGCHECK(device_get_attribute, cuDeviceGetAttribute);
TC_SIGCHECK(device_total_mem, cuDeviceTotalMem_v2);
TC_SIGCHECK(primary_ctx_retain, cuDevicePrimaryCtxRetain);
TC_SIGCHECK(primary_ctx_release, cuDevicePrimaryCtxRelease_v2);
TC_SIGCHECK(ctx_set_current, cuCtxSetCurrent);
TC_SIGCHECK(ctx_get_current, cuCtxGetCurrent);
TC_SIGCHECK(ctx_destroy, cuCtxDestroy_v2);
TC_SIGCHECK(ctx_synchronize, cuCtxSynchronize);
TC_SIGCHECK(module_load_data, cuModuleLoadData);
TC_SIGCHECK(module_unload, cuModuleUnload);
TC_SIGCHECK(module_get_function, cuModuleGetFunction);
TC_SIGCHECK(func_get_attribute, cuFuncGetAttribute);
TC_SIGCHECK(func_set_attribute, cuFuncSetAttribute);
TC_SIGCHECK(launch_kernel, cuLaunchKernel);
TC_SIGCHECK(mem_alloc, cuMemAlloc_v2);
TC_SIGCHECK(mem_free, cuMemFree_v2);
TC_SIGCHECK(memcpy_htod, cuMemcpyHtoD_v2);
TC_SIGCHECK(memcpy_dtoh, cuMemcpyDtoH_v2);
TC_SIGCHECK(memset_d8, cuMemsetD8_v2);
TC_SIGCHECK(event_create, cuEventCreate);
TC_SIGCHECK(event_record, cuEventRecord);
TC_SIGCHECK(event_synchronize, cuEventSynchronize);
TC_SIGCHECK(event_elapsed_time, cuEventElapsedTime);
TC_SIGCHECK(event_destroy, cuEventDestroy_v2);
#endif

/* Symbols to resolve: the first candidate that exists wins. The unversioned names are the
 * CUDA 3.x ABI with 32-bit sizes for some entry points, so they are listed only where they
 * share the versioned one's signature (cuEventElapsedTime before 12.8 has no _v2). */
typedef struct {
    size_t off;
    int optional;
    const char *names[3];
} tc_sym;

/* clang-format off */
#define SYM(member, opt, ...) {offsetof(tc_cuda, member), opt, {__VA_ARGS__, NULL}}
static const tc_sym k_syms[] = {
    SYM(init, 0, "cuInit"),
    SYM(driver_get_version, 0, "cuDriverGetVersion"),
    SYM(get_error_string, 0, "cuGetErrorString"),
    SYM(get_error_name, 0, "cuGetErrorName"),
    SYM(device_get_count, 0, "cuDeviceGetCount"),
    SYM(device_get, 0, "cuDeviceGet"),
    SYM(device_get_name, 0, "cuDeviceGetName"),
    SYM(device_get_attribute, 0, "cuDeviceGetAttribute"),
    SYM(device_total_mem, 0, "cuDeviceTotalMem_v2"),
    SYM(primary_ctx_retain, 0, "cuDevicePrimaryCtxRetain"),
    SYM(primary_ctx_release, 0, "cuDevicePrimaryCtxRelease_v2"),
    SYM(ctx_set_current, 0, "cuCtxSetCurrent"),
    SYM(ctx_get_current, 0, "cuCtxGetCurrent"),
    SYM(ctx_create, 1, "cuCtxCreate_v2"),
    SYM(ctx_destroy, 0, "cuCtxDestroy_v2"),
    SYM(ctx_synchronize, 0, "cuCtxSynchronize"),
    SYM(module_load_data, 0, "cuModuleLoadData"),
    SYM(module_unload, 0, "cuModuleUnload"),
    SYM(module_get_function, 0, "cuModuleGetFunction"),
    SYM(func_get_attribute, 0, "cuFuncGetAttribute"),
    SYM(func_set_attribute, 0, "cuFuncSetAttribute"),
    SYM(launch_kernel, 0, "cuLaunchKernel"),
    SYM(mem_alloc, 0, "cuMemAlloc_v2"),
    SYM(mem_free, 0, "cuMemFree_v2"),
    SYM(memcpy_htod, 0, "cuMemcpyHtoD_v2"),
    SYM(memcpy_dtoh, 0, "cuMemcpyDtoH_v2"),
    SYM(memset_d8, 0, "cuMemsetD8_v2"),
    SYM(event_create, 0, "cuEventCreate"),
    SYM(event_record, 0, "cuEventRecord"),
    SYM(event_synchronize, 0, "cuEventSynchronize"),
    SYM(event_elapsed_time, 0, "cuEventElapsedTime_v2", "cuEventElapsedTime"),
    SYM(event_destroy, 0, "cuEventDestroy_v2"),
};
#undef SYM
/* clang-format on */

/* Names for the results that matter before a driver can describe them itself (the stub
 * library, a missing kernel module). */
static const char *cu_known_name(int r)
{
    switch (r) {
    case 2:
        return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3:
        return "CUDA_ERROR_NOT_INITIALIZED";
    case 34:
        return "CUDA_ERROR_STUB_LIBRARY";
    case 35:
        return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 100:
        return "CUDA_ERROR_NO_DEVICE";
    case 101:
        return "CUDA_ERROR_INVALID_DEVICE";
    case 999:
        return "CUDA_ERROR_UNKNOWN";
    }
    return NULL;
}

static const char *cu_err_text(const tc_cuda *c, tc_cu_result r, char *buf, size_t n)
{
    const char *name = NULL, *desc = NULL;
    if (c && c->get_error_name && c->get_error_name(r, &name) != TC_CUDA_SUCCESS) name = NULL;
    if (c && c->get_error_string && c->get_error_string(r, &desc) != TC_CUDA_SUCCESS) desc = NULL;
    if (!name) name = cu_known_name((int)r);
    if (name && desc)
        snprintf(buf, n, "%s (%s)", name, desc);
    else if (name)
        snprintf(buf, n, "%s (%d)", name, (int)r);
    else
        snprintf(buf, n, "CUDA error %d", (int)r);
    return buf;
}

int tc_cuda_check(const tc_cuda *c, tc_cu_result r, const char *what, tlm_error *err)
{
    if (r == TC_CUDA_SUCCESS) return 0;
    char buf[256];
    return tlm_err_set(err, TLM_ERUNTIME, "cuda", "%s: %s", what ? what : "CUDA call",
                       cu_err_text(c, r, buf, sizeof buf));
}

void tc_cuda_close(tc_cuda *c)
{
    if (!c) return;
    if (c->lib) dlclose(c->lib);
    memset(c, 0, sizeof *c);
}

int tc_cuda_open(const char *path, tc_cuda *out, tlm_error *err)
{
    if (!out) return tlm_err_set(err, TLM_EINVAL, "out", "no output table given");
    memset(out, 0, sizeof *out);
    if (!path || !*path) return tlm_err_set(err, TLM_EINVAL, "path", "empty library path");

    const char *names[] = {path, NULL};
    char why[256];
    out->lib = tc_dl_open_first(names, out->path, sizeof out->path, why, sizeof why);
    if (!out->lib)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "cuda", "no CUDA driver (%s not found: %s)", path,
                           why);

    for (size_t i = 0; i < sizeof k_syms / sizeof k_syms[0]; i++) {
        void *fn = NULL;
        for (int k = 0; !fn && k_syms[i].names[k]; k++)
            fn = dlsym(out->lib, k_syms[i].names[k]);
        if (!fn && !k_syms[i].optional) {
            int rc =
                tlm_err_set(err, TLM_EUNSUPPORTED, "cuda", "CUDA driver %s is too old: it lacks %s",
                            out->path, k_syms[i].names[0]);
            tc_cuda_close(out);
            return rc;
        }
        /* POSIX guarantees dlsym's object pointer converts to a function pointer. */
        memcpy((char *)out + k_syms[i].off, &fn, sizeof fn);
    }

    /* The toolkit's stub library resolves every symbol but fails here, as does a driver whose
     * kernel module is not loaded: both mean there is no usable GPU. */
    tc_cu_result r = out->init(0);
    if (r != TC_CUDA_SUCCESS) {
        char buf[256];
        int rc = tlm_err_set(err, TLM_EUNSUPPORTED, "cuda", "no GPU: cuInit failed: %s",
                             cu_err_text(out, r, buf, sizeof buf));
        tc_cuda_close(out);
        return rc;
    }
    if (out->driver_get_version(&out->driver_version) != TC_CUDA_SUCCESS) out->driver_version = 0;
    r = out->device_get_count(&out->device_count);
    if (r != TC_CUDA_SUCCESS || out->device_count <= 0) {
        tc_cuda_close(out);
        return tlm_err_set(err, TLM_EUNSUPPORTED, "cuda", "no GPU: the CUDA driver sees no device");
    }
    return 0;
}

static struct {
    pthread_once_t once;
    tc_cuda cuda;
    int rc;
    tlm_error err;
} g_cuda = {.once = PTHREAD_ONCE_INIT};

static void cuda_load_once(void)
{
    /* Only the driver's soname: an unversioned libcuda.so on the search path is usually the
     * toolkit's stub (lib64/stubs), which would only fail later, at cuInit. */
    g_cuda.rc = tc_cuda_open("libcuda.so.1", &g_cuda.cuda, &g_cuda.err);
    if (g_cuda.rc && strstr(g_cuda.err.msg, "not found"))
        tlm_err_set(&g_cuda.err, TLM_EUNSUPPORTED, "cuda",
                    "no CUDA driver (libcuda.so.1 not found)");
}

int tc_cuda_get(const tc_cuda **out, tlm_error *err)
{
    pthread_once(&g_cuda.once, cuda_load_once);
    if (g_cuda.rc) {
        if (out) *out = NULL;
        if (err) *err = g_cuda.err;
        return g_cuda.rc;
    }
    if (out) *out = &g_cuda.cuda;
    return 0;
}
