/* cuda.c — the GPT-2 forward on a CUDA GPU, and device selection; see tlm_cuda.h.
 *
 * The GPU path mirrors forward.c step for step over device buffers: rows of all sequences
 * stacked into (Rp, C) matrices (Rp = rows rounded up to TLM_CUDA_ROW_TILE; padding rows go
 * through the products like any other row and are never read back), cuBLAS for the five
 * matrix products of a layer and the lm head, small NVRTC-compiled kernels for the rest.
 * Everything runs in order on the legacy default stream; the one device-to-host copy of the
 * logits at the end waits for all of it and reports any kernel failure.
 *
 * cuBLAS is column-major. A row-major (R, N) = (R, K) @ (K, N) is, read column-major,
 * (N, R) = (N, K) * (K, R): sgemm(N, N, m=N, n=R, k=K, A=w lda=N, B=inp ldb=K, C=out ldc=N).
 * The tied lm head reads wte (V, C) row-major as (C, V) column-major, hence op T on A.
 */
#include "compiler/tlm/internal.h"
#include "compiler/tlm/tlm_cuda.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/toolchain/cuda_dl.h"
#include "compiler/toolchain/toolchain.h"

#ifdef TLM_HAVE_CUDA_HEADERS
#include <cublas_api.h>
#endif

/* ---- kernels ---------------------------------------------------------------------------- */

/* Block reductions in a fixed order (xor butterfly inside a warp, then the warp sums in warp
 * order), so a row's result does not depend on anything but the row. blockDim.x must be a
 * multiple of 32; sh is 32 floats of shared memory. Every thread gets the result. */
#define KPRELUDE                                                                                   \
    "#define NEG_INF __int_as_float(0xff800000)\n"                                                 \
    "__device__ __forceinline__ float warp_sum(float v) {\n"                                       \
    "    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"              \
    "    return v;\n"                                                                              \
    "}\n"                                                                                          \
    "__device__ __forceinline__ float warp_max(float v) {\n"                                       \
    "    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));\n"     \
    "    return v;\n"                                                                              \
    "}\n"                                                                                          \
    "__device__ float block_sum(float v, float *sh) {\n"                                           \
    "    v = warp_sum(v);\n"                                                                       \
    "    __syncthreads();\n"                                                                       \
    "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"                                 \
    "    __syncthreads();\n"                                                                       \
    "    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? sh[threadIdx.x & 31] : 0.0f;\n"              \
    "    return warp_sum(v);\n"                                                                    \
    "}\n"                                                                                          \
    "__device__ float block_max(float v, float *sh) {\n"                                           \
    "    v = warp_max(v);\n"                                                                       \
    "    __syncthreads();\n"                                                                       \
    "    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;\n"                                 \
    "    __syncthreads();\n"                                                                       \
    "    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? sh[threadIdx.x & 31] : NEG_INF;\n"           \
    "    return warp_max(v);\n"                                                                    \
    "}\n"                                                                                          \
    "#define GRID_STRIDE(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + "           \
    "threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)\n"

/* x (Rp, C): rows < R get wte[tok] + wpe[pos], padding rows zero. Grid Rp. */
static const char k_embed_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_embed(float *x, const float *wte, const float *wpe,\n"
    "                                       const int *tok, const int *pos, int R, int C) {\n"
    "    int r = blockIdx.x;\n"
    "    float *o = x + (long long)r * C;\n"
    "    if (r >= R) {\n"
    "        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = 0.0f;\n"
    "        return;\n"
    "    }\n"
    "    const float *te = wte + (long long)tok[r] * C, *pe = wpe + (long long)pos[r] * C;\n"
    "    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = te[c] + pe[c];\n"
    "}\n";

/* out row r = LayerNorm(inp row rows[r]) * w + b (rows NULL: row r; rows[r] < 0: a zero
 * padding row). Two passes (mean, then squared deviations) as forward.c. Grid: out rows. */
static const char k_layernorm_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_layernorm(float *out, const float *inp, const int *rows,\n"
    "                                           const float *w, const float *b, int C) {\n"
    "    __shared__ float sh[32];\n"
    "    int r = blockIdx.x;\n"
    "    float *o = out + (long long)r * C;\n"
    "    int src = rows ? rows[r] : r;\n"
    "    if (src < 0) {\n"
    "        for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = 0.0f;\n"
    "        return;\n"
    "    }\n"
    "    const float *x = inp + (long long)src * C;\n"
    "    float s = 0.0f;\n"
    "    for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[c];\n"
    "    float mean = block_sum(s, sh) / (float)C;\n"
    "    float v = 0.0f;\n"
    "    for (int c = threadIdx.x; c < C; c += blockDim.x) { float d = x[c] - mean; v += d * d; }\n"
    "    float var = block_sum(v, sh) / (float)C;\n"
    "    float rstd = 1.0f / sqrtf(var + 1e-5f);\n"
    "    for (int c = threadIdx.x; c < C; c += blockDim.x) o[c] = (x[c] - mean) * rstd * w[c] + "
    "b[c];\n"
    "}\n";

/* y (n = rows * N) += b (N), then GELU (tanh approximation, forward.c's form) if gelu. */
static const char k_bias_act_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_bias_act(float *y, const float *b, int N, long long n,\n"
    "                                          int gelu) {\n"
    "    GRID_STRIDE(i, n) {\n"
    "        float v = y[i] + b[i % N];\n"
    "        if (gelu) {\n"
    "            float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);\n"
    "            float t = 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);\n"
    "            v = 0.5f * v * (1.0f + t);\n"
    "        }\n"
    "        y[i] = v;\n"
    "    }\n"
    "}\n";

/* x (n = rows * N) += y + b (N): a projection's bias and the residual in one pass. */
static const char k_bias_residual_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_bias_residual(float *x, const float *y, const float *b,\n"
    "                                               int N, long long n) {\n"
    "    GRID_STRIDE(i, n) x[i] += y[i] + b[i % N];\n"
    "}\n";

/* Appends layer l's k and v of every new row (qkv (R, 3C): q | k | v) to its sequence's
 * cache (L, cap, C) at the row's position. Grid R. */
static const char k_kv_store_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_kv_store(const float *qkv, const unsigned long long *kb,\n"
    "                                          const unsigned long long *vb, const int *cap,\n"
    "                                          const int *pos, int C, int l) {\n"
    "    int r = blockIdx.x;\n"
    "    long long off = ((long long)l * cap[r] + pos[r]) * C;\n"
    "    float *k = (float *)kb[r] + off, *v = (float *)vb[r] + off;\n"
    "    const float *src = qkv + (long long)r * 3 * C;\n"
    "    for (int c = threadIdx.x; c < C; c += blockDim.x) {\n"
    "        k[c] = src[C + c];\n"
    "        v[c] = src[2 * C + c];\n"
    "    }\n"
    "}\n";

/* Causal attention of row r, head h against its cache (already holding this call's k and v):
 * scores over positions 0..pos into scores (R, NH, T) scratch, softmax, weighted sum of v.
 * Grid (Rp, NH); padding rows write zeros. */
static const char k_attention_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_attention(float *out, const float *qkv,\n"
    "                                           const unsigned long long *kb,\n"
    "                                           const unsigned long long *vb, const int *cap,\n"
    "                                           const int *pos, float *scores, int R, int C,\n"
    "                                           int NH, int T, int l, float scale) {\n"
    "    __shared__ float sh[32];\n"
    "    int r = blockIdx.x, h = blockIdx.y, hs = C / NH;\n"
    "    float *o = out + (long long)r * C + (long long)h * hs;\n"
    "    if (r >= R) {\n"
    "        for (int d = threadIdx.x; d < hs; d += blockDim.x) o[d] = 0.0f;\n"
    "        return;\n"
    "    }\n"
    "    int p = pos[r];\n"
    "    long long base = (long long)l * cap[r] * C + (long long)h * hs;\n"
    "    const float *K = (const float *)kb[r] + base, *V = (const float *)vb[r] + base;\n"
    "    const float *q = qkv + (long long)r * 3 * C + (long long)h * hs;\n"
    "    float *s = scores + ((long long)r * NH + h) * T;\n"
    "    float mx = NEG_INF;\n"
    "    for (int t = threadIdx.x; t <= p; t += blockDim.x) {\n"
    "        const float *k = K + (long long)t * C;\n"
    "        float a = 0.0f;\n"
    "        for (int d = 0; d < hs; d++) a += q[d] * k[d];\n"
    "        a *= scale;\n"
    "        s[t] = a;\n"
    "        mx = fmaxf(mx, a);\n"
    "    }\n"
    "    mx = block_max(mx, sh);\n"
    "    float sum = 0.0f;\n"
    "    for (int t = threadIdx.x; t <= p; t += blockDim.x) {\n"
    "        float e = expf(s[t] - mx);\n"
    "        s[t] = e;\n"
    "        sum += e;\n"
    "    }\n"
    "    sum = block_sum(sum, sh); /* its __syncthreads also publishes s[] to the block */\n"
    "    float inv = 1.0f / sum;\n"
    "    for (int d = threadIdx.x; d < hs; d += blockDim.x) {\n"
    "        float a = 0.0f;\n"
    "        for (int t = 0; t <= p; t++) a += s[t] * V[(long long)t * C + d];\n"
    "        o[d] = a * inv;\n"
    "    }\n"
    "}\n";

/* dst layer l [0, n) = src layer l [0, n); layers are dst_stride / src_stride floats apart
 * (caches of different capacities). Grid (any, L). */
static const char k_kv_copy_src[] = KPRELUDE
    "extern \"C\" __global__ void tlm_kv_copy(float *dst, const float *src, long long dst_stride,\n"
    "                                         long long src_stride, long long n) {\n"
    "    long long l = blockIdx.y;\n"
    "    GRID_STRIDE(i, n) dst[l * dst_stride + i] = src[l * src_stride + i];\n"
    "}\n";

enum { K_EMBED, K_LAYERNORM, K_BIAS_ACT, K_BIAS_RESIDUAL, K_KV_STORE, K_ATTENTION, K_KV_COPY, K_N };

static const tlm_cuda_kernel k_kernels[K_N] = {
    [K_EMBED] = {"tlm_embed", k_embed_src, 128},
    [K_LAYERNORM] = {"tlm_layernorm", k_layernorm_src, 256},
    [K_BIAS_ACT] = {"tlm_bias_act", k_bias_act_src, 256},
    [K_BIAS_RESIDUAL] = {"tlm_bias_residual", k_bias_residual_src, 256},
    [K_KV_STORE] = {"tlm_kv_store", k_kv_store_src, 128},
    [K_ATTENTION] = {"tlm_attention", k_attention_src, 128},
    [K_KV_COPY] = {"tlm_kv_copy", k_kv_copy_src, 256},
};

/* Elementwise kernels: enough blocks to fill any current GPU, the grid-stride loop does the
 * rest. */
#define ELEMWISE_MAX_BLOCKS 65536u

int tlm_cuda_kernel_count(void)
{
    return K_N;
}

const tlm_cuda_kernel *tlm_cuda_kernel_get(int i)
{
    return i >= 0 && i < K_N ? &k_kernels[i] : NULL;
}

/* ---- cuBLAS, dlopen'ed --------------------------------------------------------------------- */

#ifdef TLM_HAVE_CUDA_HEADERS
typedef cublasStatus_t cb_status;
typedef cublasHandle_t cb_handle;
typedef cublasOperation_t cb_op;
typedef cublasMath_t cb_math;
#else
typedef int cb_status;
typedef struct cublasContext *cb_handle;
typedef int cb_op;
typedef int cb_math;
#endif
#define CB_OP_N 0
#define CB_OP_T 1
#define CB_DEFAULT_MATH 0

typedef struct cublas_fns {
    cb_status (*create)(cb_handle *h);
    cb_status (*destroy)(cb_handle h);
    cb_status (*set_stream)(cb_handle h, tc_cu_stream s);
    cb_status (*set_math_mode)(cb_handle h, cb_math mode); /* optional */
    cb_status (*sgemm)(cb_handle h, cb_op ta, cb_op tb, int m, int n, int k, const float *alpha,
                       const float *A, int lda, const float *B, int ldb, const float *beta,
                       float *C, int ldc);
} cublas_fns;

#ifdef TLM_HAVE_CUDA_HEADERS
#define CB_SIGCHECK(member, fn)                                                                    \
    _Static_assert(                                                                                \
        __builtin_types_compatible_p(__typeof__(((cublas_fns *)0)->member), __typeof__(&fn)),      \
        "cublas_fns." #member " does not match cublas_api.h's " #fn)
CB_SIGCHECK(create, cublasCreate_v2);
CB_SIGCHECK(destroy, cublasDestroy_v2);
CB_SIGCHECK(set_stream, cublasSetStream_v2);
CB_SIGCHECK(set_math_mode, cublasSetMathMode);
CB_SIGCHECK(sgemm, cublasSgemm_v2);
_Static_assert(CUBLAS_OP_N == CB_OP_N && CUBLAS_OP_T == CB_OP_T, "cublasOperation_t");
_Static_assert(CUBLAS_DEFAULT_MATH == CB_DEFAULT_MATH, "cublasMath_t");
_Static_assert(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR == 75 &&
                   CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR == 76,
               "CUdevice_attribute");
#endif
#define ATTR_CC_MAJOR 75
#define ATTR_CC_MINOR 76

static struct {
    pthread_once_t once;
    void *lib;
    char path[512];
    cublas_fns f;
    int rc;
    tlm_error err;
} g_cb = {.once = PTHREAD_ONCE_INIT};

static void cublas_load_once(void)
{
    const char *home = tc_dl_cuda_home();
    char p[6][400];
    static const char *const sonames[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    for (int i = 0; i < 3; i++) {
        snprintf(p[i], sizeof p[i], "%s/lib64/%s", home, sonames[i]);
        snprintf(p[3 + i], sizeof p[3 + i], "%s/lib/%s", home, sonames[i]);
    }
    const char *names[] = {sonames[0], sonames[1], sonames[2], p[0], p[1],
                           p[2],       p[3],       p[4],       p[5], NULL};
    char why[256];
    g_cb.lib = tc_dl_open_first(names, g_cb.path, sizeof g_cb.path, why, sizeof why);
    if (!g_cb.lib) {
        g_cb.rc = tlm_err_set(&g_cb.err, TLM_EUNSUPPORTED, "cublas",
                              "no cuBLAS (libcublas.so.13/.12 not found on the loader path or "
                              "under %s: %s)",
                              home, why);
        return;
    }
    static const struct {
        size_t off;
        const char *name;
        int optional;
    } syms[] = {
        {offsetof(cublas_fns, create), "cublasCreate_v2", 0},
        {offsetof(cublas_fns, destroy), "cublasDestroy_v2", 0},
        {offsetof(cublas_fns, set_stream), "cublasSetStream_v2", 0},
        {offsetof(cublas_fns, set_math_mode), "cublasSetMathMode", 1},
        {offsetof(cublas_fns, sgemm), "cublasSgemm_v2", 0},
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *fn = dlsym(g_cb.lib, syms[i].name);
        if (!fn && !syms[i].optional) {
            g_cb.rc = tlm_err_set(&g_cb.err, TLM_EUNSUPPORTED, "cublas", "%s lacks %s", g_cb.path,
                                  syms[i].name);
            return;
        }
        memcpy((char *)&g_cb.f + syms[i].off, &fn, sizeof fn);
    }
}

static int cublas_get(tlm_error *err)
{
    pthread_once(&g_cb.once, cublas_load_once);
    if (g_cb.rc && err) *err = g_cb.err;
    return g_cb.rc;
}

int tlm_cuda_cublas_available(char *which, size_t which_size, tlm_error *err)
{
    int rc = cublas_get(err);
    if (!rc && which && which_size) snprintf(which, which_size, "%s", g_cb.path);
    return rc;
}

/* ---- the device ---------------------------------------------------------------------------- */

typedef struct dev_model {
    struct dev_model *next;
    const tlm_model *m;
    const float *params; /* identity check: a model freed and another at its address */
    size_t n_params;
    tc_cu_deviceptr w;
} dev_model;

#define KV_POOL_MAX 256
#define KV_POOL_MAX_BYTES ((size_t)512 << 20) /* k and v together */

struct tlm_device {
    tlm_device_kind_t kind;
    char name[192];
    char fallback[600];
    tlm_workspace *ws; /* CPU */

    const tc_cuda *cu;
    int ordinal;
    tc_cu_device cudev;
    tc_cu_context ctx;
    int ctx_retained;
    int sm;
    tc_cu_module mod[K_N];
    tc_cu_function fn[K_N];
    cb_handle blas;
    dev_model *models;
    tc_cu_deviceptr buf; /* activations, scratch, row metadata */
    size_t buf_bytes;
    unsigned char *host; /* staging: row metadata, then logits */
    size_t host_bytes;
    /* Freed KV buffers kept for reuse: the decoder makes and frees caches for every request,
     * and cuMemFree synchronises the whole device. */
    struct kv_buf {
        size_t bytes;
        tc_cu_deviceptr k, v;
    } pool[KV_POOL_MAX];
    int n_pool;
    size_t pool_bytes;
};

#define DEV_KV_MAGIC 0x544b5644u /* "DVKT" */

/* A device KV cache. kv first, so the tlm_kv * handed out is also the dev_kv *; its host k
 * and v stay NULL, which is how a device cache is told from a host one. */
typedef struct dev_kv {
    tlm_kv kv;
    uint32_t magic;
    tlm_device *dev;
    tc_cu_deviceptr k, v; /* (L, capacity, C) each */
    size_t bytes;         /* of each */
} dev_kv;

static dev_kv *as_dev_kv(const tlm_kv *kv)
{
    if (!kv || kv->k || kv->v) return NULL;
    dev_kv *d = (dev_kv *)kv;
    return d->magic == DEV_KV_MAGIC ? d : NULL;
}

static int make_current(tlm_device *d, tlm_error *err)
{
    return tc_cuda_check(d->cu, d->cu->ctx_set_current(d->ctx), "cuCtxSetCurrent", err);
}

static void free_models(tlm_device *d)
{
    while (d->models) {
        dev_model *dm = d->models;
        d->models = dm->next;
        if (dm->w) d->cu->mem_free(dm->w);
        free(dm);
    }
}

void tlm_device_close(tlm_device *d)
{
    if (!d) return;
    tlm_workspace_free(d->ws);
    if (d->kind == TLM_DEVICE_CUDA && d->cu && d->ctx_retained) {
        d->cu->ctx_set_current(d->ctx);
        free_models(d);
        for (int i = 0; i < d->n_pool; i++) {
            d->cu->mem_free(d->pool[i].k);
            d->cu->mem_free(d->pool[i].v);
        }
        if (d->buf) d->cu->mem_free(d->buf);
        if (d->blas) g_cb.f.destroy(d->blas);
        for (int k = 0; k < K_N; k++)
            if (d->mod[k]) d->cu->module_unload(d->mod[k]);
        d->cu->primary_ctx_release(d->cudev);
    }
    free(d->host);
    free(d);
}

static int compile_kernels(tlm_device *d, tlm_error *err)
{
    for (int k = 0; k < K_N; k++) {
        tc_cubin cb;
        int rc = tc_nvrtc_compile(k_kernels[k].source, k_kernels[k].name, d->sm, &cb, err);
        if (rc) {
            tc_cubin_free(&cb);
            return rc;
        }
        tc_cu_result r = d->cu->module_load_data(&d->mod[k], cb.data);
        if (r == TC_CUDA_SUCCESS) r = d->cu->module_get_function(&d->fn[k], d->mod[k], cb.entry);
        tc_cubin_free(&cb);
        if (r != TC_CUDA_SUCCESS) {
            char what[96];
            snprintf(what, sizeof what, "loading kernel %s", k_kernels[k].name);
            return tc_cuda_check(d->cu, r, what, err);
        }
    }
    return 0;
}

static int cuda_init(tlm_device *d, int ordinal, tlm_error *err)
{
    const tc_cuda *cu;
    int rc = tc_cuda_get(&cu, err);
    if (rc) return rc;
    d->cu = cu;
    d->kind = TLM_DEVICE_CUDA;
    d->ordinal = ordinal;
    if (ordinal >= cu->device_count)
        return tlm_err_set(err, TLM_EINVAL, "device", "cuda:%d: the driver sees %d device(s)",
                           ordinal, cu->device_count);
    tc_cu_result r = cu->device_get(&d->cudev, ordinal);
    if (r == TC_CUDA_SUCCESS) r = cu->primary_ctx_retain(&d->ctx, d->cudev);
    if ((rc = tc_cuda_check(cu, r, "opening the device", err))) return rc;
    d->ctx_retained = 1;
    if ((rc = make_current(d, err))) return rc;
    int major = 0, minor = 0;
    r = cu->device_get_attribute(&major, (tc_cu_device_attribute)ATTR_CC_MAJOR, d->cudev);
    if (r == TC_CUDA_SUCCESS)
        r = cu->device_get_attribute(&minor, (tc_cu_device_attribute)ATTR_CC_MINOR, d->cudev);
    if ((rc = tc_cuda_check(cu, r, "compute capability", err))) return rc;
    d->sm = major * 10 + minor;
    char gpu[100] = "?";
    size_t mem = 0;
    cu->device_get_name(gpu, sizeof gpu, d->cudev);
    cu->device_total_mem(&mem, d->cudev);
    snprintf(d->name, sizeof d->name, "cuda:%d (%s, sm_%d, %.0f GiB)", ordinal, gpu, d->sm,
             (double)mem / (1024.0 * 1024.0 * 1024.0));

    if ((rc = cublas_get(err))) return rc;
    cb_status s = g_cb.f.create(&d->blas);
    if (s != 0) {
        d->blas = NULL;
        return tlm_err_set(err, TLM_ERUNTIME, "cublas", "cublasCreate failed (status %d)", (int)s);
    }
    s = g_cb.f.set_stream(d->blas, NULL);
    /* FP32 products as the CPU computes them: the default mode, never TF32. */
    if (s == 0 && g_cb.f.set_math_mode) s = g_cb.f.set_math_mode(d->blas, (cb_math)CB_DEFAULT_MATH);
    if (s != 0)
        return tlm_err_set(err, TLM_ERUNTIME, "cublas", "configuring cuBLAS failed (status %d)",
                           (int)s);
    return compile_kernels(d, err);
}

int tlm_device_open(const char *spec, tlm_device **out, tlm_error *err)
{
    if (!out) return tlm_err_set(err, TLM_EINVAL, "out", "no output pointer given");
    *out = NULL;
    if (!spec) spec = "auto";
    int want_cuda, ordinal = 0, is_auto = 0;
    if (!strcmp(spec, "auto")) {
        is_auto = 1;
        want_cuda = 1;
    } else if (!strcmp(spec, "cpu")) {
        want_cuda = 0;
    } else if (!strcmp(spec, "cuda")) {
        want_cuda = 1;
    } else if (!strncmp(spec, "cuda:", 5)) {
        char *end;
        long v = strtol(spec + 5, &end, 10);
        if (end == spec + 5 || *end || v < 0 || v > 1024)
            return tlm_err_set(err, TLM_EINVAL, "device",
                               "'%s': a device ordinal after cuda: must be 0..1024", spec);
        want_cuda = 1;
        ordinal = (int)v;
    } else {
        return tlm_err_set(err, TLM_EINVAL, "device",
                           "unknown device '%s'; allowed: auto, cpu, cuda, cuda:N", spec);
    }

    tlm_device *d = calloc(1, sizeof *d);
    if (!d) return tlm_err_set(err, TLM_ENOMEM, "device", "out of memory");
    if (want_cuda) {
        tlm_error e = {0};
        int rc = cuda_init(d, ordinal, &e);
        if (rc == 0) {
            *out = d;
            return 0;
        }
        tlm_device_close(d);
        if (!is_auto) {
            if (err) *err = e;
            return rc;
        }
        d = calloc(1, sizeof *d);
        if (!d) return tlm_err_set(err, TLM_ENOMEM, "device", "out of memory");
        snprintf(d->fallback, sizeof d->fallback, "%s", e.msg);
    }
    d->kind = TLM_DEVICE_CPU;
    snprintf(d->name, sizeof d->name, "cpu");
    d->ws = tlm_workspace_new();
    if (!d->ws) {
        free(d);
        return tlm_err_set(err, TLM_ENOMEM, "device", "out of memory");
    }
    *out = d;
    return 0;
}

tlm_device_kind_t tlm_device_kind(const tlm_device *d)
{
    return d ? d->kind : TLM_DEVICE_CPU;
}

const char *tlm_device_name(const tlm_device *d)
{
    return d ? d->name : "cpu";
}

const char *tlm_device_fallback_reason(const tlm_device *d)
{
    return d ? d->fallback : "";
}

static int is_cuda(const tlm_device *d)
{
    return d && d->kind == TLM_DEVICE_CUDA;
}

/* ---- resident weights ------------------------------------------------------------------------ */

static void forget(tlm_device *d, const tlm_model *m)
{
    for (dev_model **p = &d->models; *p;) {
        dev_model *dm = *p;
        if (dm->m == m) {
            *p = dm->next;
            if (dm->w) d->cu->mem_free(dm->w);
            free(dm);
        } else {
            p = &dm->next;
        }
    }
}

/* The resident copy of m, uploading it on first use. Context current. */
static int model_get(tlm_device *d, const tlm_model *m, dev_model **out, tlm_error *err)
{
    for (dev_model *dm = d->models; dm; dm = dm->next)
        if (dm->m == m && dm->params == m->params && dm->n_params == m->n_params) {
            *out = dm;
            return 0;
        }
    forget(d, m); /* same address, other parameters: a stale entry */
    dev_model *dm = calloc(1, sizeof *dm);
    if (!dm) return tlm_err_set(err, TLM_ENOMEM, "device", "out of memory");
    size_t bytes = m->n_params * sizeof(float);
    tc_cu_result r = d->cu->mem_alloc(&dm->w, bytes);
    if (r != TC_CUDA_SUCCESS) {
        free(dm);
        char what[96];
        snprintf(what, sizeof what, "allocating %zu MiB for the weights", bytes >> 20);
        return tc_cuda_check(d->cu, r, what, err);
    }
    r = d->cu->memcpy_htod(dm->w, m->params, bytes);
    if (r != TC_CUDA_SUCCESS) {
        d->cu->mem_free(dm->w);
        free(dm);
        return tc_cuda_check(d->cu, r, "uploading the weights", err);
    }
    dm->m = m;
    dm->params = m->params;
    dm->n_params = m->n_params;
    dm->next = d->models;
    d->models = dm;
    *out = dm;
    return 0;
}

int tlm_device_upload_model(tlm_device *d, const tlm_model *m, tlm_error *err)
{
    if (!m) return tlm_err_set(err, TLM_EINVAL, "model", "no model given");
    if (!is_cuda(d)) return 0;
    int rc = make_current(d, err);
    dev_model *dm;
    return rc ? rc : model_get(d, m, &dm, err);
}

void tlm_device_forget_model(tlm_device *d, const tlm_model *m)
{
    if (!is_cuda(d) || !m) return;
    if (make_current(d, NULL)) return;
    forget(d, m);
}

/* ---- KV caches ---------------------------------------------------------------------------- */

int tlm_kv_new_dev(tlm_device *d, const tlm_model *m, int capacity, tlm_kv **out, tlm_error *err)
{
    if (!is_cuda(d)) return tlm_kv_new(m, capacity, out, err);
    *out = NULL;
    if (!m) return tlm_err_set(err, TLM_EINVAL, "model", "no model given");
    if (capacity == 0) capacity = m->cfg.n_ctx;
    if (capacity < 1 || capacity > m->cfg.n_ctx)
        return tlm_err_set(err, TLM_EINVAL, "capacity", "KV capacity %d; allowed 1..n_ctx (%d)",
                           capacity, m->cfg.n_ctx);
    int rc = make_current(d, err);
    if (rc) return rc;
    dev_kv *k = calloc(1, sizeof *k);
    if (!k) return tlm_err_set(err, TLM_ENOMEM, "kv", "out of memory");
    k->kv.n_layer = m->cfg.n_layer;
    k->kv.n_embd = m->cfg.n_embd;
    k->kv.capacity = capacity;
    k->magic = DEV_KV_MAGIC;
    k->dev = d;
    size_t bytes =
        (size_t)m->cfg.n_layer * (size_t)capacity * (size_t)m->cfg.n_embd * sizeof(float);
    k->bytes = bytes;
    for (int i = d->n_pool - 1; i >= 0; i--)
        if (d->pool[i].bytes == bytes) {
            k->k = d->pool[i].k;
            k->v = d->pool[i].v;
            d->pool_bytes -= 2 * bytes;
            d->pool[i] = d->pool[--d->n_pool];
            *out = &k->kv;
            return 0;
        }
    tc_cu_result r = d->cu->mem_alloc(&k->k, bytes);
    if (r == TC_CUDA_SUCCESS) r = d->cu->mem_alloc(&k->v, bytes);
    if (r != TC_CUDA_SUCCESS) {
        rc = tc_cuda_check(d->cu, r, "allocating a KV cache on the device", err);
        tlm_kv_free_dev(&k->kv);
        return rc;
    }
    *out = &k->kv;
    return 0;
}

void tlm_kv_free_dev(tlm_kv *kv)
{
    dev_kv *k = as_dev_kv(kv);
    if (!k) {
        tlm_kv_free(kv);
        return;
    }
    tlm_device *d = k->dev;
    if (k->k && k->v && d->n_pool < KV_POOL_MAX &&
        d->pool_bytes + 2 * k->bytes <= KV_POOL_MAX_BYTES) {
        d->pool[d->n_pool++] = (struct kv_buf){k->bytes, k->k, k->v};
        d->pool_bytes += 2 * k->bytes;
    } else if (make_current(d, NULL) == 0) {
        if (k->k) d->cu->mem_free(k->k);
        if (k->v) d->cu->mem_free(k->v);
    }
    k->magic = 0;
    free(k);
}

static int launch(tlm_device *d, int k, unsigned gx, unsigned gy, void **args, tlm_error *err)
{
    tc_cu_result r = d->cu->launch_kernel(d->fn[k], gx, gy, 1, (unsigned)k_kernels[k].block_threads,
                                          1, 1, 0, NULL, args, NULL);
    if (r == TC_CUDA_SUCCESS) return 0;
    char what[96];
    snprintf(what, sizeof what, "launching %s", k_kernels[k].name);
    return tc_cuda_check(d->cu, r, what, err);
}

static unsigned elem_blocks(long long n, int threads)
{
    long long b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > (long long)ELEMWISE_MAX_BLOCKS ? ELEMWISE_MAX_BLOCKS : (unsigned)b;
}

int tlm_kv_copy_dev(tlm_kv *dst, const tlm_kv *src, tlm_error *err)
{
    dev_kv *kd = as_dev_kv(dst), *ks = as_dev_kv(src);
    if (!kd && !ks) return tlm_kv_copy(dst, src, err);
    if (!kd || !ks || kd->dev != ks->dev)
        return tlm_err_set(err, TLM_EINVAL, "kv", "KV caches on different devices");
    if (dst->n_layer != src->n_layer || dst->n_embd != src->n_embd)
        return tlm_err_set(err, TLM_EINVAL, "kv", "KV caches of different models");
    if (src->len > dst->capacity)
        return tlm_err_set(err, TLM_ELIMIT, "kv.capacity",
                           "destination holds %d positions, source has %d", dst->capacity,
                           src->len);
    tlm_device *d = kd->dev;
    int rc = make_current(d, err);
    if (rc) return rc;
    if (src->len > 0) {
        long long C = src->n_embd, n = (long long)src->len * C;
        long long ds = (long long)dst->capacity * C, ss = (long long)src->capacity * C;
        tc_cu_deviceptr pairs[2][2] = {{kd->k, ks->k}, {kd->v, ks->v}};
        for (int i = 0; i < 2; i++) {
            void *args[] = {&pairs[i][0], &pairs[i][1], &ds, &ss, &n};
            rc = launch(d, K_KV_COPY, elem_blocks(n, k_kernels[K_KV_COPY].block_threads),
                        (unsigned)src->n_layer, args, err);
            if (rc) return rc;
        }
    }
    dst->len = src->len;
    return 0;
}

/* ---- forward ------------------------------------------------------------------------------- */

/* Where each cache lives must match the forward pass: on the device d (d NULL: the host).
 * The shape checks common to both are tlm__check_batch's. */
static int check_owner(const tlm_device *d, const tlm_seq *seqs, int n_seqs, tlm_error *err)
{
    for (int s = 0; s < n_seqs && seqs; s++) {
        const tlm_seq *q = &seqs[s];
        if (!q->kv) continue;
        const dev_kv *k = as_dev_kv(q->kv);
        if (d ? (!k || k->dev != d) : (k || !q->kv->k)) {
            char field[48];
            snprintf(field, sizeof field, "seqs[%d]", s);
            return tlm_err_set(err, TLM_EINVAL, field,
                               "KV cache made for another device (use tlm_kv_new_dev with the "
                               "device of the forward pass)");
        }
    }
    return 0;
}

/* out (Rp, N) = inp (Rp, K) @ w (K, N) [trans_w: w stored (N, K)], in fixed-shape tiles. */
static int gemm(tlm_device *d, tc_cu_deviceptr out, tc_cu_deviceptr inp, tc_cu_deviceptr w,
                size_t Rp, int K, int N, int trans_w, tlm_error *err)
{
    const float one = 1.0f, zero = 0.0f;
    for (size_t t = 0; t < Rp; t += TLM_CUDA_ROW_TILE) {
        cb_status s =
            g_cb.f.sgemm(d->blas, (cb_op)(trans_w ? CB_OP_T : CB_OP_N), (cb_op)CB_OP_N, N,
                         TLM_CUDA_ROW_TILE, K, &one, (const float *)(uintptr_t)w, trans_w ? K : N,
                         (const float *)(uintptr_t)(inp + t * (size_t)K * sizeof(float)), K, &zero,
                         (float *)(uintptr_t)(out + t * (size_t)N * sizeof(float)), N);
        if (s != 0)
            return tlm_err_set(err, TLM_ERUNTIME, "cublas",
                               "cublasSgemm (%d x %d x %d) failed (status %d)", N,
                               TLM_CUDA_ROW_TILE, K, (int)s);
    }
    return 0;
}

static int grow_buffers(tlm_device *d, size_t dev_bytes, size_t host_bytes, tlm_error *err)
{
    if (dev_bytes > d->buf_bytes) {
        if (d->buf) d->cu->mem_free(d->buf);
        d->buf = 0;
        d->buf_bytes = 0;
        size_t want = dev_bytes + dev_bytes / 4; /* room for slightly larger batches */
        tc_cu_result r = d->cu->mem_alloc(&d->buf, want);
        if (r != TC_CUDA_SUCCESS) {
            d->buf = 0;
            return tc_cuda_check(d->cu, r, "allocating activations on the device", err);
        }
        d->buf_bytes = want;
    }
    if (host_bytes > d->host_bytes) {
        free(d->host);
        d->host = malloc(host_bytes);
        d->host_bytes = d->host ? host_bytes : 0;
        if (!d->host) return tlm_err_set(err, TLM_ENOMEM, "device", "out of memory");
    }
    return 0;
}

/* Byte offsets of the device buffer's parts, each 256-aligned. */
typedef struct layout {
    size_t x, h, att, tmp, qkv, fc, lm_in, lm_out, scores, meta, total;
    size_t meta_bytes;
} layout;

static size_t take(size_t *at, size_t bytes)
{
    size_t off = *at;
    *at = tlm__round_up(off + bytes, 256);
    return off;
}

static int cuda_forward(tlm_device *d, const tlm_model *m, const tlm_seq *seqs, int n_seqs,
                        tlm_error *err)
{
    size_t R, Rl;
    int Tmax;
    int rc = tlm__check_batch(m, seqs, n_seqs, &R, &Rl, &Tmax, err);
    if (rc || (rc = check_owner(d, seqs, n_seqs, err))) return rc;
    if ((rc = make_current(d, err))) return rc;
    dev_model *dm;
    if ((rc = model_get(d, m, &dm, err))) return rc;

    const int C = m->cfg.n_embd, V = m->cfg.vocab_size, NH = m->cfg.n_head;
    const size_t Rp = tlm__round_up(R, TLM_CUDA_ROW_TILE);
    const size_t Rlp = tlm__round_up(Rl ? Rl : 1, TLM_CUDA_ROW_TILE);
    const size_t F = sizeof(float);
    layout L = {0};
    size_t at = 0;
    L.x = take(&at, Rp * C * F);
    L.h = take(&at, Rp * C * F);
    L.att = take(&at, Rp * C * F);
    L.tmp = take(&at, Rp * C * F);
    L.qkv = take(&at, Rp * 3 * C * F);
    L.fc = take(&at, Rp * 4 * C * F);
    L.lm_in = take(&at, Rlp * C * F);
    L.lm_out = take(&at, Rlp * (size_t)V * F);
    L.scores = take(&at, R * (size_t)NH * (size_t)Tmax * F);
    /* Row metadata: kb, vb (Rp u64 each), then tok, pos, cap (Rp int each), lmrow (Rlp). */
    L.meta_bytes = Rp * 16 + (Rp * 3 + Rlp) * 4;
    L.meta = take(&at, L.meta_bytes);
    L.total = at;
    size_t host_bytes = tlm__round_up(L.meta_bytes, 64) + Rl * (size_t)V * F;
    if ((rc = grow_buffers(d, L.total, host_bytes, err))) return rc;

    /* Row metadata on the host, then one copy. */
    unsigned char *hm = d->host;
    uint64_t *kb = (uint64_t *)hm, *vb = kb + Rp;
    int32_t *tok = (int32_t *)(vb + Rp), *pos = tok + Rp, *cap = pos + Rp, *lmrow = cap + Rp;
    memset(hm, 0, L.meta_bytes);
    size_t r = 0, lr = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tlm_seq *q = &seqs[s];
        const dev_kv *k = as_dev_kv(q->kv);
        for (int i = 0; i < q->n_tokens; i++, r++) {
            kb[r] = k->k;
            vb[r] = k->v;
            tok[r] = q->tokens[i];
            pos[r] = q->kv->len + i;
            cap[r] = q->kv->capacity;
            if (q->logits && (q->all_logits || i == q->n_tokens - 1)) lmrow[lr++] = (int32_t)r;
        }
    }
    for (; lr < Rlp; lr++)
        lmrow[lr] = -1;
    tc_cu_result cr = d->cu->memcpy_htod(d->buf + L.meta, hm, L.meta_bytes);
    if ((rc = tc_cuda_check(d->cu, cr, "copying row metadata", err))) return rc;

    tc_cu_deviceptr B = d->buf;
    tc_cu_deviceptr x = B + L.x, h = B + L.h, att = B + L.att, tmp = B + L.tmp, qkv = B + L.qkv,
                    fc = B + L.fc, lm_in = B + L.lm_in, lm_out = B + L.lm_out,
                    scores = B + L.scores;
    tc_cu_deviceptr d_kb = B + L.meta, d_vb = d_kb + Rp * 8, d_tok = d_vb + Rp * 8,
                    d_pos = d_tok + Rp * 4, d_cap = d_pos + Rp * 4, d_lmrow = d_cap + Rp * 4;
    tc_cu_deviceptr nullp = 0;
#define W(p) (dm->w + (tc_cu_deviceptr)((p)-m->params) * sizeof(float))
    tc_cu_deviceptr wte = W(m->wte), wpe = W(m->wpe);
    int iR = (int)R;

    {
        void *a[] = {&x, &wte, &wpe, &d_tok, &d_pos, &iR, (void *)&C};
        if ((rc = launch(d, K_EMBED, (unsigned)Rp, 1, a, err))) return rc;
    }
    const int C3 = 3 * C, C4 = 4 * C;
    const long long nC = (long long)Rp * C, n3C = (long long)Rp * C3, n4C = (long long)Rp * C4;
    const int zero = 0, one = 1;
    const int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const tlm_layer *ly = &m->layers[l];
        tc_cu_deviceptr ln1_w = W(ly->ln1_w), ln1_b = W(ly->ln1_b), qkv_w = W(ly->qkv_w),
                        qkv_b = W(ly->qkv_b), ap_w = W(ly->attn_proj_w), ap_b = W(ly->attn_proj_b),
                        ln2_w = W(ly->ln2_w), ln2_b = W(ly->ln2_b), fc_w = W(ly->fc_w),
                        fc_b = W(ly->fc_b), fp_w = W(ly->fc_proj_w), fp_b = W(ly->fc_proj_b);
        void *a_ln1[] = {&h, &x, &nullp, &ln1_w, &ln1_b, (void *)&C};
        if ((rc = launch(d, K_LAYERNORM, (unsigned)Rp, 1, a_ln1, err))) return rc;
        if ((rc = gemm(d, qkv, h, qkv_w, Rp, C, C3, 0, err))) return rc;
        void *a_b1[] = {&qkv, &qkv_b, (void *)&C3, (void *)&n3C, (void *)&zero};
        if ((rc = launch(d, K_BIAS_ACT, elem_blocks(n3C, 256), 1, a_b1, err))) return rc;
        void *a_kv[] = {&qkv, &d_kb, &d_vb, &d_cap, &d_pos, (void *)&C, &l};
        if ((rc = launch(d, K_KV_STORE, (unsigned)R, 1, a_kv, err))) return rc;
        void *a_at[] = {&att, &qkv,       &d_kb,       &d_vb, &d_cap, &d_pos, &scores,
                        &iR,  (void *)&C, (void *)&NH, &Tmax, &l,     &scale};
        if ((rc = launch(d, K_ATTENTION, (unsigned)Rp, (unsigned)NH, a_at, err))) return rc;
        if ((rc = gemm(d, tmp, att, ap_w, Rp, C, C, 0, err))) return rc;
        void *a_r1[] = {&x, &tmp, &ap_b, (void *)&C, (void *)&nC};
        if ((rc = launch(d, K_BIAS_RESIDUAL, elem_blocks(nC, 256), 1, a_r1, err))) return rc;
        void *a_ln2[] = {&h, &x, &nullp, &ln2_w, &ln2_b, (void *)&C};
        if ((rc = launch(d, K_LAYERNORM, (unsigned)Rp, 1, a_ln2, err))) return rc;
        if ((rc = gemm(d, fc, h, fc_w, Rp, C, C4, 0, err))) return rc;
        void *a_b2[] = {&fc, &fc_b, (void *)&C4, (void *)&n4C, (void *)&one};
        if ((rc = launch(d, K_BIAS_ACT, elem_blocks(n4C, 256), 1, a_b2, err))) return rc;
        if ((rc = gemm(d, tmp, fc, fp_w, Rp, C4, C, 0, err))) return rc;
        void *a_r2[] = {&x, &tmp, &fp_b, (void *)&C, (void *)&nC};
        if ((rc = launch(d, K_BIAS_RESIDUAL, elem_blocks(nC, 256), 1, a_r2, err))) return rc;
    }

    if (Rl > 0) {
        tc_cu_deviceptr lnf_w = W(m->lnf_w), lnf_b = W(m->lnf_b);
        void *a_lnf[] = {&lm_in, &x, &d_lmrow, &lnf_w, &lnf_b, (void *)&C};
        if ((rc = launch(d, K_LAYERNORM, (unsigned)Rlp, 1, a_lnf, err))) return rc;
        if ((rc = gemm(d, lm_out, lm_in, wte, Rlp, C, V, 1, err))) return rc;
        float *hl = (float *)(d->host + tlm__round_up(L.meta_bytes, 64));
        cr = d->cu->memcpy_dtoh(hl, lm_out, Rl * (size_t)V * F);
        if ((rc = tc_cuda_check(d->cu, cr, "the forward pass on the GPU", err))) return rc;
        lr = 0;
        for (int s = 0; s < n_seqs; s++) {
            const tlm_seq *q = &seqs[s];
            if (!q->logits) continue;
            size_t n = q->all_logits ? (size_t)q->n_tokens : 1;
            memcpy(q->logits, hl + lr * V, n * V * F);
            lr += n;
        }
    } else {
        cr = d->cu->ctx_synchronize();
        if ((rc = tc_cuda_check(d->cu, cr, "the forward pass on the GPU", err))) return rc;
    }
#undef W
    for (int s = 0; s < n_seqs; s++)
        seqs[s].kv->len += seqs[s].n_tokens;
    return 0;
}

int tlm_forward_batch_dev(tlm_device *d, const tlm_model *m, const tlm_seq *seqs, int n_seqs,
                          tlm_error *err)
{
    if (is_cuda(d)) return cuda_forward(d, m, seqs, n_seqs, err);
    /* The CPU: tlm_forward_batch itself, once device caches are ruled out (their host k and v
     * are NULL). */
    int rc = check_owner(NULL, seqs, n_seqs, err);
    if (rc) return rc;
    if (d) return tlm_forward_batch(m, d->ws, seqs, n_seqs, err);
    tlm_workspace *ws = tlm_workspace_new();
    if (!ws) return tlm_err_set(err, TLM_ENOMEM, "workspace", "out of memory");
    rc = tlm_forward_batch(m, ws, seqs, n_seqs, err);
    tlm_workspace_free(ws);
    return rc;
}
