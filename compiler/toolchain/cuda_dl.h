/* cuda_dl.h — the CUDA driver API and other CUDA libraries, loaded at run time with dlopen.
 *
 * Contract:
 *  - Nothing in tlmd links against libcuda, libnvrtc or libcublas: binaries start on machines
 *    without a driver or toolkit, and CUDA features then answer TLM_EUNSUPPORTED.
 *  - tc_cuda_get() loads the real driver (soname libcuda.so.1) once per process, resolves the
 *    entry points below (the versioned _v2 symbols where cuda.h maps to them), calls cuInit(0)
 *    and checks there is a device. Any failure is TLM_EUNSUPPORTED with the reason:
 *    "no CUDA driver (libcuda.so.1 not found)", "no GPU: cuInit failed: ...", a missing symbol.
 *    The toolkit's stub libcuda (lib64/stubs) is never searched; if it is loaded anyway (it
 *    can be, through tc_cuda_open or a libcuda.so.1 symlink), its cuInit fails and that reads
 *    as "no GPU". The result, success or failure, is cached; the library is never unloaded.
 *  - Types: with the toolkit headers (TLM_HAVE_CUDA_HEADERS) the CU* types are cuda.h's own
 *    and the function-pointer types are checked against cuda.h's prototypes at compile time;
 *    without them, opaque equivalents with the same ABI.
 *  - Any thread may call these. The driver API is thread-safe; contexts are the callers'.
 */
#ifndef TLM_TOOLCHAIN_CUDA_DL_H
#define TLM_TOOLCHAIN_CUDA_DL_H

#include <stddef.h>

#include "compiler/util/err.h"

#ifdef TLM_HAVE_CUDA_HEADERS
#include <cuda.h>
typedef CUresult tc_cu_result;
typedef CUdevice tc_cu_device;
typedef CUcontext tc_cu_context;
typedef CUmodule tc_cu_module;
typedef CUfunction tc_cu_function;
typedef CUstream tc_cu_stream;
typedef CUevent tc_cu_event;
typedef CUdeviceptr tc_cu_deviceptr;
typedef CUdevice_attribute tc_cu_device_attribute;
typedef CUfunction_attribute tc_cu_function_attribute;
#else
typedef int tc_cu_result;
typedef int tc_cu_device;
typedef struct CUctx_st *tc_cu_context;
typedef struct CUmod_st *tc_cu_module;
typedef struct CUfunc_st *tc_cu_function;
typedef struct CUstream_st *tc_cu_stream;
typedef struct CUevent_st *tc_cu_event;
typedef unsigned long long tc_cu_deviceptr;
typedef int tc_cu_device_attribute;
typedef int tc_cu_function_attribute;
#endif

#define TC_CUDA_SUCCESS 0

/* Driver entry points. Members are NULL only where marked optional. */
typedef struct tc_cuda {
    void *lib;
    char path[256];     /* what was dlopen'ed */
    int driver_version; /* cuDriverGetVersion, e.g. 13000 */
    int device_count;

    tc_cu_result (*init)(unsigned int flags);
    tc_cu_result (*driver_get_version)(int *version);
    tc_cu_result (*get_error_string)(tc_cu_result e, const char **s);
    tc_cu_result (*get_error_name)(tc_cu_result e, const char **s);
    tc_cu_result (*device_get_count)(int *count);
    tc_cu_result (*device_get)(tc_cu_device *dev, int ordinal);
    tc_cu_result (*device_get_name)(char *name, int len, tc_cu_device dev);
    tc_cu_result (*device_get_attribute)(int *v, tc_cu_device_attribute a, tc_cu_device dev);
    tc_cu_result (*device_total_mem)(size_t *bytes, tc_cu_device dev);
    tc_cu_result (*primary_ctx_retain)(tc_cu_context *ctx, tc_cu_device dev);
    tc_cu_result (*primary_ctx_release)(tc_cu_device dev);
    tc_cu_result (*ctx_set_current)(tc_cu_context ctx);
    tc_cu_result (*ctx_get_current)(tc_cu_context *ctx);
    /* cuCtxCreate_v2 (flags, dev); optional: CUDA 13 headers moved to _v4 and a future driver
     * may drop it. Prefer the primary context, as the runtime API and cuBLAS use it. */
    tc_cu_result (*ctx_create)(tc_cu_context *ctx, unsigned int flags, tc_cu_device dev);
    tc_cu_result (*ctx_destroy)(tc_cu_context ctx);
    tc_cu_result (*ctx_synchronize)(void);
    tc_cu_result (*module_load_data)(tc_cu_module *m, const void *image);
    tc_cu_result (*module_unload)(tc_cu_module m);
    tc_cu_result (*module_get_function)(tc_cu_function *f, tc_cu_module m, const char *name);
    tc_cu_result (*func_get_attribute)(int *v, tc_cu_function_attribute a, tc_cu_function f);
    tc_cu_result (*func_set_attribute)(tc_cu_function f, tc_cu_function_attribute a, int v);
    tc_cu_result (*launch_kernel)(tc_cu_function f, unsigned gx, unsigned gy, unsigned gz,
                                  unsigned bx, unsigned by, unsigned bz, unsigned smem_bytes,
                                  tc_cu_stream stream, void **params, void **extra);
    tc_cu_result (*mem_alloc)(tc_cu_deviceptr *p, size_t bytes);
    tc_cu_result (*mem_free)(tc_cu_deviceptr p);
    tc_cu_result (*memcpy_htod)(tc_cu_deviceptr dst, const void *src, size_t bytes);
    tc_cu_result (*memcpy_dtoh)(void *dst, tc_cu_deviceptr src, size_t bytes);
    tc_cu_result (*memset_d8)(tc_cu_deviceptr dst, unsigned char v, size_t n);
    tc_cu_result (*event_create)(tc_cu_event *e, unsigned int flags);
    tc_cu_result (*event_record)(tc_cu_event e, tc_cu_stream s);
    tc_cu_result (*event_synchronize)(tc_cu_event e);
    tc_cu_result (*event_elapsed_time)(float *ms, tc_cu_event start, tc_cu_event end);
    tc_cu_result (*event_destroy)(tc_cu_event e);
} tc_cuda;

/* The process-wide driver (see the contract). *out stays valid for the life of the process. */
int tc_cuda_get(const tc_cuda **out, tlm_error *err);

/* Loads the driver library at `path` (a soname or a file path) into a caller-owned table and
 * initialises it exactly as tc_cuda_get does. For tests and diagnostics; close with
 * tc_cuda_close (also after a failure). */
int tc_cuda_open(const char *path, tc_cuda *out, tlm_error *err);
void tc_cuda_close(tc_cuda *c);

/* Turns a driver result into 0 or TLM_ERUNTIME with "what: CUDA_ERROR_X (description)". */
int tc_cuda_check(const tc_cuda *c, tc_cu_result r, const char *what, tlm_error *err);

/* ---- generic helpers, shared with the NVRTC and cuBLAS loaders ------------------------- */

/* $CUDA_HOME, else the toolkit found at build time (TLM_CUDA_HOME), else /usr/local/cuda. */
const char *tc_dl_cuda_home(void);

/* dlopen(RTLD_NOW | RTLD_LOCAL) the first of `names` (NULL-terminated) that loads. On success
 * copies the name that worked into `which`; on failure writes the last dlerror() into `why`
 * (either buffer may be NULL). */
void *tc_dl_open_first(const char *const *names, char *which, size_t which_size, char *why,
                       size_t why_size);

#endif
