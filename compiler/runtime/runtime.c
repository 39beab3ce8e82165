/* runtime.c — load a manifest's plan and kernels, bind tensors, run, check against the
 * reference interpreter. The CUDA path goes through compiler/toolchain's dlopen'ed driver
 * table, so the runtime links no CUDA library and starts on machines without a GPU. */
#include "compiler/runtime/runtime.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/codegen/codegen.h"
#include "compiler/toolchain/cuda_dl.h"
#include "compiler/util/util.h"

#define RT_MAX_FILE (1u << 30) /* a kernel binary or manifest larger than this is refused */

typedef void (*rt_packed_fn)(void *const *args);

typedef struct {
    char binary[256], entry[256];
    bool cubin;
    json_t *workload;
    unsigned grid[3], block[3], smem;
    void *lib;
    rt_packed_fn fn;
    cg_prepack_abi pre; /* CPU: its prepack entries (pre.n = 0: none) */
    tc_cu_module mod;
    tc_cu_function cufn;
} rt_kernel;

struct rt_model {
    char dir[4096];
    int n_tensor, n_launch, n_kernel;
    rt_tensor *tensor;
    rt_launch *launch;
    rt_kernel *kernel;
    int64_t arena_bytes;
    float *arena; /* host, FE_PLAN_ALIGN-aligned (2 MiB where huge pages were asked for) */
    bool huge;    /* the arena was advised as transparent huge pages */
    bool cuda;
    const tc_cuda *cu;
    tc_cu_context ctx;
    tc_cu_deviceptr darena;
    bool uploaded; /* inputs and params on the device match the host arena */
    /* CPU: per launch, its kernel's operands packed from params (NULL: packed by each call;
     * see rt_set_prepack), valid while `prepacked` */
    const float *(*pre)[CG_MAX_PRE];
    float *pre_pool; /* where they live (NULL: each its own allocation) */
    bool use_prepack, prepacked;
    int64_t prepack_bytes;
};

/* ---- manifest decoding ---- */

static int ferr(tlm_error *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int ferr(tlm_error *err, const char *field, const char *fmt, ...)
{
    char msg[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tlm_err_set(err, TLM_EINVAL, field, "%s", msg);
}

static bool get_int(const json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    const json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = x;
    return true;
}

static const char *get_str(const json_t *o, const char *key, size_t max)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s && *s && strlen(s) <= max ? s : NULL;
}

static int kind_from_name(const char *s)
{
    for (int k = FE_T_INPUT; k <= FE_T_OUTPUT; k++)
        if (!strcmp(s, fe_tensor_kind_name(k))) return k;
    return -1;
}

static int decode_tensors(rt_model *m, const json_t *ts, tlm_error *err)
{
    if (!json_is_array(ts) || json_array_size(ts) < 1 || json_array_size(ts) > FE_MAX_VALUES)
        return ferr(err, "plan.tensors", "must be an array of 1..%d tensors", FE_MAX_VALUES);
    m->n_tensor = (int)json_array_size(ts);
    m->tensor = calloc(m->n_tensor, sizeof *m->tensor);
    if (!m->tensor) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    char f[96];
    for (int i = 0; i < m->n_tensor; i++) {
        const json_t *o = json_array_get(ts, i);
        rt_tensor *t = &m->tensor[i];
        const char *name = get_str(o, "name", FE_MAX_NAME), *kind = get_str(o, "kind", 32);
        const char *dtype = get_str(o, "dtype", 32);
        const json_t *shape = json_object_get(o, "shape");
        snprintf(f, sizeof f, "plan.tensors[%d]", i);
        if (!json_is_object(o) || !name || !kind || kind_from_name(kind) < 0)
            return ferr(err, f,
                        "needs \"name\" (1..%d bytes) and \"kind\" (input, param, "
                        "intermediate, output)",
                        FE_MAX_NAME);
        if (!dtype || strcmp(dtype, "float32"))
            return ferr(err, f, "dtype must be float32 (the runtime binds float32 tensors)");
        snprintf(t->name, sizeof t->name, "%s", name);
        t->kind = kind_from_name(kind);
        if (!json_is_array(shape) || json_array_size(shape) < 1 ||
            json_array_size(shape) > IR_MAX_DIMS)
            return ferr(err, f, "shape must be an array of 1..%d extents", IR_MAX_DIMS);
        t->ndim = (int)json_array_size(shape);
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            const json_t *e = json_array_get(shape, d);
            t->shape[d] = json_is_integer(e) ? json_integer_value(e) : 0;
            if (t->shape[d] < 1 || t->shape[d] > IR_MAX_ELEMS ||
                __builtin_mul_overflow(numel, t->shape[d], &numel) || numel > IR_MAX_ELEMS)
                return ferr(err, f,
                            "shape[%d] must be a positive extent (at most 2^34 elements "
                            "in all)",
                            d);
        }
        if (!get_int(o, "bytes", 1, INT64_MAX, &t->bytes) || t->bytes != numel * 4)
            return ferr(err, f, "bytes must be the element count x 4 (%lld)", (long long)numel * 4);
        if (!get_int(o, "offset", 0, m->arena_bytes, &t->offset) || t->offset % FE_PLAN_ALIGN ||
            t->bytes > m->arena_bytes - t->offset)
            return ferr(err, f,
                        "offset must be %d-aligned with the tensor inside the arena of "
                        "%lld bytes",
                        FE_PLAN_ALIGN, (long long)m->arena_bytes);
        t->alias = -1;
        const char *al = get_str(o, "alias_of", FE_MAX_NAME);
        if (json_object_get(o, "alias_of")) {
            for (int k = 0; al && k < i && t->alias < 0; k++)
                if (!strcmp(m->tensor[k].name, al)) t->alias = k;
            if (t->alias < 0 || m->tensor[t->alias].offset != t->offset)
                return ferr(err, f, "alias_of must name an earlier tensor at the same offset");
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(m->tensor[k].name, name))
                return ferr(err, f, "the name \"%s\" is used twice", name);
    }
    return 0;
}

static int find_tensor(const rt_model *m, const char *name)
{
    for (int i = 0; name && i < m->n_tensor; i++)
        if (!strcmp(m->tensor[i].name, name)) return i;
    return -1;
}

static int decode_kernels(rt_model *m, const json_t *ks, tlm_error *err)
{
    if (!json_is_array(ks) || json_array_size(ks) < 1 || json_array_size(ks) > FE_MAX_NODES)
        return ferr(err, "kernels", "must be an array of 1..%d kernels", FE_MAX_NODES);
    m->n_kernel = (int)json_array_size(ks);
    m->kernel = calloc(m->n_kernel, sizeof *m->kernel);
    if (!m->kernel) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    char f[64];
    for (int i = 0; i < m->n_kernel; i++) {
        const json_t *o = json_array_get(ks, i);
        rt_kernel *k = &m->kernel[i];
        snprintf(f, sizeof f, "kernels[%d]", i);
        const char *bin = get_str(o, "binary", 200), *entry = get_str(o, "entry", 200);
        const char *fmt = get_str(o, "format", 16);
        if (!bin || strchr(bin, '/') || bin[0] == '.' || !entry || !fmt)
            return ferr(err, f,
                        "needs \"binary\" (a file name in the directory), \"entry\" and "
                        "\"format\"");
        if (strcmp(fmt, "elf-so") && strcmp(fmt, "cubin"))
            return ferr(err, f, "format must be elf-so or cubin, not %s", fmt);
        k->cubin = !strcmp(fmt, "cubin");
        if (i > 0 && k->cubin != m->kernel[0].cubin)
            return ferr(err, f, "mixes cubin and elf-so kernels in one plan");
        m->cuda = k->cubin;
        snprintf(k->binary, sizeof k->binary, "%s", bin);
        snprintf(k->entry, sizeof k->entry, "%s", entry);
        k->workload = json_incref(json_object_get(o, "workload"));
        if (k->cubin) {
            const json_t *l = json_object_get(o, "launch");
            const json_t *g = json_object_get(l, "grid"), *b = json_object_get(l, "block");
            int64_t smem;
            if (json_array_size(g) != 3 || json_array_size(b) != 3 ||
                !get_int(l, "smem", 0, 1 << 24, &smem))
                return ferr(err, f,
                            "a cubin needs \"launch\": {\"grid\": [3], \"block\": [3], "
                            "\"smem\"}");
            for (int d = 0; d < 3; d++) {
                json_int_t gv = json_integer_value(json_array_get(g, d));
                json_int_t bv = json_integer_value(json_array_get(b, d));
                if (gv < 1 || gv > INT32_MAX || bv < 1 || bv > 1024)
                    return ferr(err, f, "launch grid/block extents out of range");
                k->grid[d] = (unsigned)gv, k->block[d] = (unsigned)bv;
            }
            k->smem = (unsigned)smem;
        }
    }
    return 0;
}

static int decode_launches(rt_model *m, const json_t *ls, tlm_error *err)
{
    if (!json_is_array(ls) || json_array_size(ls) < 1 || json_array_size(ls) > FE_MAX_NODES)
        return ferr(err, "plan.launches", "must be an array of 1..%d launches", FE_MAX_NODES);
    m->n_launch = (int)json_array_size(ls);
    m->launch = calloc(m->n_launch, sizeof *m->launch);
    if (!m->launch) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    char f[96];
    for (int i = 0; i < m->n_launch; i++) {
        const json_t *o = json_array_get(ls, i), *args = json_object_get(o, "args");
        rt_launch *L = &m->launch[i];
        int64_t sub;
        snprintf(f, sizeof f, "plan.launches[%d]", i);
        if (!get_int(o, "subgraph", 0, m->n_kernel - 1, &sub))
            return ferr(err, f, "subgraph must index kernels (0..%d)", m->n_kernel - 1);
        L->kernel = (int)sub;
        const char *node = get_str(o, "node", FE_MAX_NAME);
        snprintf(L->node, sizeof L->node, "%s", node ? node : "");
        if (!get_int(o, "repeat", 1, IR_MAX_ELEMS, &L->repeat)) L->repeat = 1;
        if (!json_is_array(args) || json_array_size(args) < 2 ||
            json_array_size(args) > RT_MAX_ARGS)
            return ferr(err, f, "args must name 2..%d tensors", RT_MAX_ARGS);
        L->n_args = (int)json_array_size(args);
        const json_t *steps = json_object_get(o, "steps");
        if (L->repeat > 1 && json_array_size(steps) != (size_t)L->n_args)
            return ferr(err, f, "a launch with repeat > 1 needs one step per argument");
        for (int a = 0; a < L->n_args; a++) {
            char fa[128];
            snprintf(fa, sizeof fa, "%s.args[%d]", f, a);
            int t = find_tensor(m, json_string_value(json_array_get(args, a)));
            if (t < 0) return ferr(err, fa, "names no tensor of the plan");
            L->args[a] = t;
            L->step[a] = L->repeat > 1 ? json_integer_value(json_array_get(steps, a)) : 0;
            int64_t numel = m->tensor[t].bytes / 4;
            /* every repeat's slice must stay inside the tensor */
            if (L->step[a] < 0 || (L->repeat > 1 && L->step[a] > numel / L->repeat))
                return ferr(err, fa, "step %lld x repeat %lld leaves the tensor",
                            (long long)L->step[a], (long long)L->repeat);
            if (a == L->n_args - 1 && m->tensor[t].kind <= FE_T_PARAM)
                return ferr(err, fa, "a launch may not write an input or param");
        }
    }
    return 0;
}

/* ---- loading kernels ---- */

static void *read_all(const char *path, size_t *len, tlm_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        tlm_err_set(err, TLM_EIO, path, "cannot open: %s", strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 && (unsigned long)n <= RT_MAX_FILE ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        tlm_err_set(err, TLM_EIO, path, "cannot read (or larger than 1 GiB)");
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

static int load_cpu_kernel(rt_model *m, rt_kernel *k, tlm_error *err)
{
    char path[4400], sym[300];
    snprintf(path, sizeof path, "%s/%s", m->dir, k->binary);
    k->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!k->lib) return tlm_err_set(err, TLM_EIO, k->binary, "dlopen: %s", dlerror());
    snprintf(sym, sizeof sym, "%s_packed", k->entry);
    k->fn = (rt_packed_fn)dlsym(k->lib, sym);
    if (!k->fn) return tlm_err_set(err, TLM_EINVAL, k->binary, "no symbol %s", sym);
    /* optional: kernels built before prepacks existed, and those with nothing to pack */
    int rc = cg_prepack_find(k->lib, k->entry, &k->pre, err);
    if (rc) snprintf(err->field, sizeof err->field, "%.95s", k->binary);
    return rc;
}

static int load_cuda_kernel(rt_model *m, rt_kernel *k, tlm_error *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", m->dir, k->binary);
    size_t len;
    void *img = read_all(path, &len, err);
    if (!img) return err->code;
    int rc = tc_cuda_check(m->cu, m->cu->module_load_data(&k->mod, img), "cuModuleLoadData", err);
    free(img);
    if (!rc)
        rc = tc_cuda_check(m->cu, m->cu->module_get_function(&k->cufn, k->mod, k->entry),
                           "cuModuleGetFunction", err);
    if (!rc && k->smem > 48 * 1024) /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8 */
        rc = tc_cuda_check(m->cu, m->cu->func_set_attribute(k->cufn, 8, (int)k->smem),
                           "cuFuncSetAttribute", err);
    return rc;
}

static int cuda_open(rt_model *m, tlm_error *err)
{
    int rc = tc_cuda_get(&m->cu, err);
    if (rc) return rc;
    tc_cu_device dev;
    if ((rc = tc_cuda_check(m->cu, m->cu->device_get(&dev, 0), "cuDeviceGet", err)) ||
        (rc = tc_cuda_check(m->cu, m->cu->primary_ctx_retain(&m->ctx, dev),
                            "cuDevicePrimaryCtxRetain", err)) ||
        (rc = tc_cuda_check(m->cu, m->cu->ctx_set_current(m->ctx), "cuCtxSetCurrent", err)))
        return rc;
    return tc_cuda_check(m->cu, m->cu->mem_alloc(&m->darena, (size_t)m->arena_bytes),
                         "cuMemAlloc (arena)", err);
}

int rt_model_load(const char *dir, rt_model **out, tlm_error *err)
{
    *out = NULL;
    rt_model *m = calloc(1, sizeof *m);
    if (!m) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    snprintf(m->dir, sizeof m->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t len;
    char *text = read_all(path, &len, err);
    int rc = text ? 0 : err->code;
    json_t *man = NULL;
    if (!rc) {
        json_error_t je;
        man = json_loadb(text, len, 0, &je);
        if (!man) rc = ferr(err, "manifest.json", "not JSON: %s (line %d)", je.text, je.line);
    }
    free(text);
    const json_t *plan = json_object_get(man, "plan");
    if (!rc && !json_is_object(plan))
        rc = ferr(err, "plan",
                  "manifest.json has no execution plan (compile a graph or model "
                  "with tlmc or tlm compile --model/--graph)");
    if (!rc && !get_int(plan, "arena_bytes", 1, INT64_C(1) << 40, &m->arena_bytes))
        rc = ferr(err, "plan.arena_bytes", "must be a positive byte count (at most 1 TiB)");
    if (!rc) rc = decode_tensors(m, json_object_get(plan, "tensors"), err);
    if (!rc) rc = decode_kernels(m, json_object_get(man, "kernels"), err);
    if (!rc) rc = decode_launches(m, json_object_get(plan, "launches"), err);
    json_decref(man);
    if (!rc) {
        size_t bytes = ((size_t)m->arena_bytes + FE_PLAN_ALIGN - 1) / FE_PLAN_ALIGN * FE_PLAN_ALIGN;
        /* in transparent huge pages (2 MiB; tlm_alloc_big), unless TLM_HUGE_PAGES=off: a network's
         * activations and packed weights are tens to hundreds of MiB walked in strided patterns (an
         * NCHW conv's register tiles store a row a plane apart), whose 4 KiB pages miss the TLB.
         * Off vs on alternated, whole runs (`tlm run`, Xeon family 6 model 167, 2 threads, default
         * schedules): MobileNetV2 at batch 8 1.08-1.09x, at batch 1 0.99-1.16x (median 1.09),
         * ResNet-50 at batch 1 1.01-1.08x, at batch 8 1.00-1.03x, EfficientNet-B0, BERT-base and
         * GPT-2 (seq 128) 0.97-1.14x, about even. The kernel may give 4 KiB pages anyway (THP off,
         * no free huge page): the same memory, as before. */
        m->arena = tlm_alloc_big(bytes, FE_PLAN_ALIGN, &m->huge);
        if (!m->arena)
            rc = tlm_err_set(err, TLM_ENOMEM, "plan.arena_bytes",
                             "cannot allocate the arena of %lld bytes", (long long)m->arena_bytes);
        else
            memset(m->arena, 0, bytes);
    }
    if (!rc && m->cuda) rc = cuda_open(m, err);
    m->use_prepack = !m->cuda;
    for (int i = 0; !rc && i < m->n_kernel; i++)
        rc = m->cuda ? load_cuda_kernel(m, &m->kernel[i], err)
                     : load_cpu_kernel(m, &m->kernel[i], err);
    if (rc) {
        rt_model_free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void rt_model_free(rt_model *m)
{
    if (!m) return;
    for (int i = 0; m->kernel && i < m->n_kernel; i++) {
        rt_kernel *k = &m->kernel[i];
        json_decref(k->workload);
        if (k->lib) dlclose(k->lib);
        if (k->mod) m->cu->module_unload(k->mod);
    }
    if (m->darena) m->cu->mem_free(m->darena);
    for (int i = 0; m->pre && !m->pre_pool && i < m->n_launch; i++)
        for (int q = 0; q < CG_MAX_PRE; q++) free((void *)m->pre[i][q]);
    free(m->pre_pool);
    free(m->pre);
    free(m->tensor);
    free(m->launch);
    free(m->kernel);
    free(m->arena);
    free(m);
}

bool rt_model_cuda(const rt_model *m)
{
    return m->cuda;
}
int rt_model_n_tensors(const rt_model *m)
{
    return m->n_tensor;
}
const rt_tensor *rt_model_tensor(const rt_model *m, int i)
{
    return &m->tensor[i];
}
int rt_model_n_launches(const rt_model *m)
{
    return m->n_launch;
}
const rt_launch *rt_model_launch(const rt_model *m, int i)
{
    return &m->launch[i];
}
int64_t rt_model_arena_bytes(const rt_model *m)
{
    return m->arena_bytes;
}
int rt_model_find(const rt_model *m, const char *name)
{
    return find_tensor(m, name);
}

float *rt_model_data(rt_model *m, int tensor)
{
    return (float *)((char *)m->arena + m->tensor[tensor].offset);
}

/* ---- binding ---- */

int rt_bind(rt_model *m, const char *name, const float *data, int64_t n, tlm_error *err)
{
    int t = find_tensor(m, name);
    if (t < 0) return tlm_err_set(err, TLM_ENOTFOUND, name, "no tensor of that name in the plan");
    if (m->tensor[t].kind > FE_T_PARAM)
        return tlm_err_set(err, TLM_EINVAL, name, "is an %s; only inputs and params are bound",
                           fe_tensor_kind_name(m->tensor[t].kind));
    if (n != m->tensor[t].bytes / 4)
        return tlm_err_set(err, TLM_EINVAL, name, "has %lld elements, got %lld",
                           (long long)(m->tensor[t].bytes / 4), (long long)n);
    memcpy(rt_model_data(m, t), data, (size_t)n * sizeof *data);
    m->uploaded = false;
    if (m->tensor[t].kind == FE_T_PARAM) m->prepacked = false;
    return 0;
}

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rt_bind_random(rt_model *m, uint64_t seed)
{
    for (int i = 0; i < m->n_tensor; i++) {
        const rt_tensor *t = &m->tensor[i];
        if (t->kind > FE_T_PARAM || t->alias >= 0) continue;
        int64_t n = t->bytes / 4;
        double lo = -1, hi = 1;
        if (t->kind == FE_T_PARAM && t->ndim == 1) {
            lo = 0.9, hi = 1.1;
        } else if (t->kind == FE_T_PARAM) {
            int64_t fan = n / (t->ndim == 2 ? t->shape[1] : t->shape[0]);
            hi = sqrt(3.0 / (double)(fan > 0 ? fan : 1)), lo = -hi;
        }
        uint64_t s = seed ^ (0x632BE59BD9B4E019ull * (uint64_t)(i + 1));
        float *p = rt_model_data(m, i);
        for (int64_t e = 0; e < n; e++)
            p[e] = (float)(lo + (hi - lo) * (double)(splitmix64(&s) >> 11) * 0x1.0p-53);
    }
    m->uploaded = false;
    m->prepacked = false;
}

void rt_set_prepack(rt_model *m, bool on)
{
    m->use_prepack = on && !m->cuda;
}

int64_t rt_model_prepack_bytes(const rt_model *m)
{
    return m->prepack_bytes;
}

bool rt_model_huge_pages(const rt_model *m)
{
    return m->huge;
}

/* The bytes of launch i's prepacked operand q (64-byte multiples), 0 when it is not packed
 * once: not bound to a param, or a param that moves over the launch's repeats. */
static size_t prepack_size(const rt_model *m, int i, int q)
{
    const rt_launch *L = &m->launch[i];
    const rt_kernel *k = &m->kernel[L->kernel];
    const int a = k->pre.arg[q];
    if (a >= L->n_args || m->tensor[L->args[a]].kind != FE_T_PARAM ||
        (L->repeat > 1 && L->step[a] != 0))
        return 0;
    return ((size_t)k->pre.floats[q] * sizeof(float) + 63) / 64 * 64;
}

/* Packs, for every launch whose kernel has prepack entries, each operand bound to a param
 * (the same tensor on every repeat) into a buffer of its own, kept until the params are
 * bound again: the first time, all of them in one pool (in huge pages, as the arena) or,
 * where that cannot be had, each allocated alone. A buffer that cannot be allocated is left
 * out: that launch packs in each call, as without prepacks. */
static void prepack_params(rt_model *m)
{
    if (!m->pre) { /* the first time: the pool laid out */
        m->pre = calloc((size_t)m->n_launch, sizeof *m->pre);
        if (!m->pre) return;
        size_t total = 0;
        for (int i = 0; i < m->n_launch; i++)
            for (int q = 0; q < m->kernel[m->launch[i].kernel].pre.n; q++)
                total += prepack_size(m, i, q);
        bool advised;
        if (total > 0) m->pre_pool = tlm_alloc_big(total, 64, &advised);
        size_t off = 0;
        for (int i = 0; m->pre_pool && i < m->n_launch; i++)
            for (int q = 0; q < m->kernel[m->launch[i].kernel].pre.n; q++) {
                const size_t bytes = prepack_size(m, i, q);
                if (!bytes) continue;
                m->pre[i][q] = (const float *)((char *)m->pre_pool + off);
                off += bytes;
            }
    }
    void *args[RT_MAX_ARGS];
    m->prepack_bytes = 0;
    for (int i = 0; i < m->n_launch; i++) {
        const rt_launch *L = &m->launch[i];
        const rt_kernel *k = &m->kernel[L->kernel];
        for (int a = 0; a < L->n_args; a++) args[a] = rt_model_data(m, L->args[a]);
        for (int q = 0; q < k->pre.n; q++) {
            const size_t bytes = prepack_size(m, i, q);
            if (!bytes) continue;
            float *d = (float *)m->pre[i][q];
            if (!d && !m->pre_pool) m->pre[i][q] = d = aligned_alloc(64, bytes);
            if (!d) continue;
            k->pre.pack(q, args, d);
            m->prepack_bytes += (int64_t)bytes;
        }
    }
    m->prepacked = true;
}

/* ---- running ---- */

static int run_cpu(rt_model *m, double *launch_s)
{
    void *args[RT_MAX_ARGS];
    if (m->use_prepack && !m->prepacked) prepack_params(m);
    for (int i = 0; i < m->n_launch; i++) {
        const rt_launch *L = &m->launch[i];
        const rt_kernel *k = &m->kernel[L->kernel];
        const bool pre = m->use_prepack && m->pre && k->pre.n > 0;
        double t0 = launch_s ? tlm_now_s() : 0;
        for (int64_t r = 0; r < L->repeat; r++) {
            for (int a = 0; a < L->n_args; a++)
                args[a] = rt_model_data(m, L->args[a]) + r * L->step[a];
            if (pre)
                k->pre.run(args, m->pre[i]);
            else
                k->fn(args);
        }
        if (launch_s) launch_s[i] = tlm_now_s() - t0;
    }
    return 0;
}

static int run_cuda(rt_model *m, double *launch_s, tlm_error *err)
{
    const tc_cuda *cu = m->cu;
    int rc = tc_cuda_check(cu, cu->ctx_set_current(m->ctx), "cuCtxSetCurrent", err);
    for (int i = 0; !rc && !m->uploaded && i < m->n_tensor; i++) {
        const rt_tensor *t = &m->tensor[i];
        if (t->kind <= FE_T_PARAM && t->alias < 0)
            rc = tc_cuda_check(
                cu, cu->memcpy_htod(m->darena + t->offset, rt_model_data(m, i), (size_t)t->bytes),
                "cuMemcpyHtoD", err);
    }
    if (!rc) m->uploaded = true;
    tc_cu_deviceptr ptr[RT_MAX_ARGS];
    void *params[RT_MAX_ARGS];
    for (int i = 0; !rc && i < m->n_launch; i++) {
        const rt_launch *L = &m->launch[i];
        const rt_kernel *k = &m->kernel[L->kernel];
        double t0 = launch_s ? tlm_now_s() : 0;
        for (int64_t r = 0; !rc && r < L->repeat; r++) {
            for (int a = 0; a < L->n_args; a++) {
                ptr[a] = m->darena + m->tensor[L->args[a]].offset + 4 * r * L->step[a];
                params[a] = &ptr[a];
            }
            rc = tc_cuda_check(cu,
                               cu->launch_kernel(k->cufn, k->grid[0], k->grid[1], k->grid[2],
                                                 k->block[0], k->block[1], k->block[2], k->smem,
                                                 NULL, params, NULL),
                               "cuLaunchKernel", err);
        }
        /* per-launch times need a synchronisation after each launch */
        if (!rc && launch_s) {
            rc = tc_cuda_check(cu, cu->ctx_synchronize(), "cuCtxSynchronize", err);
            launch_s[i] = tlm_now_s() - t0;
        }
    }
    if (!rc) rc = tc_cuda_check(cu, cu->ctx_synchronize(), "cuCtxSynchronize", err);
    for (int i = 0; !rc && i < m->n_tensor; i++) {
        const rt_tensor *t = &m->tensor[i];
        if (t->kind == FE_T_OUTPUT && t->alias < 0)
            rc = tc_cuda_check(
                cu, cu->memcpy_dtoh(rt_model_data(m, i), m->darena + t->offset, (size_t)t->bytes),
                "cuMemcpyDtoH", err);
    }
    return rc;
}

int rt_run(rt_model *m, double *launch_s, tlm_error *err)
{
    return m->cuda ? run_cuda(m, launch_s, err) : run_cpu(m, launch_s);
}

/* ---- reference ---- */

int rt_reference(rt_model *m, rt_workload_decoder decode, rt_check *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    out->finite = true;
    double t0 = tlm_now_s();
    size_t bytes = ((size_t)m->arena_bytes + FE_PLAN_ALIGN - 1) / FE_PLAN_ALIGN * FE_PLAN_ALIGN;
    float *ref = aligned_alloc(FE_PLAN_ALIGN, bytes);
    ir_subgraph *gs = calloc(m->n_kernel, sizeof *gs);
    double *acc = NULL;
    int rc = 0;
    if (!ref || !gs) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto done;
    }
    memset(ref, 0, bytes);
    for (int i = 0; i < m->n_tensor; i++)
        if (m->tensor[i].kind <= FE_T_PARAM && m->tensor[i].alias < 0)
            memcpy((char *)ref + m->tensor[i].offset, rt_model_data(m, i),
                   (size_t)m->tensor[i].bytes);
    for (int k = 0; k < m->n_kernel; k++) {
        ir_workload w;
        char f[48];
        snprintf(f, sizeof f, "kernels[%d].workload", k);
        tlm_error we = {0};
        if (!m->kernel[k].workload || decode(m->kernel[k].workload, &w, &we) ||
            ir_subgraph_build(&w, &gs[k], &we)) {
            rc = tlm_err_set(err, TLM_EINVAL, f, "cannot rebuild the kernel's workload: %s",
                             we.msg[0] ? we.msg : "missing");
            goto done;
        }
    }
    int64_t max_out = 0;
    for (int i = 0; i < m->n_tensor; i++)
        if (m->tensor[i].bytes / 4 > max_out) max_out = m->tensor[i].bytes / 4;
    acc = malloc((size_t)max_out * sizeof *acc);
    if (!acc) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto done;
    }
    for (int i = 0; i < m->n_launch; i++) {
        const rt_launch *L = &m->launch[i];
        const ir_subgraph *sg = &gs[L->kernel];
        int idx[IR_MAX_TENSORS];
        int ni = ir_subgraph_inputs(sg, idx);
        if (ni != L->n_args - 1) {
            rc = tlm_err_set(err, TLM_EINVAL, "plan.launches",
                             "launch %d binds %d arguments to a "
                             "kernel of %d",
                             i, L->n_args, ni + 1);
            goto done;
        }
        for (int a = 0; a < L->n_args; a++) {
            int64_t want = a < ni ? ir_tensor_numel(&sg->tensor[idx[a]])
                                  : ir_tensor_numel(&sg->tensor[sg->output]);
            int64_t have = m->tensor[L->args[a]].bytes / 4 - L->step[a] * (L->repeat - 1);
            if (have < want) {
                rc = tlm_err_set(err, TLM_EINVAL, "plan.launches",
                                 "launch %d: argument %d has "
                                 "%lld elements, the kernel reads %lld",
                                 i, a, (long long)have, (long long)want);
                goto done;
            }
        }
        const float *ins[IR_MAX_TENSORS];
        int64_t n_out = ir_tensor_numel(&sg->tensor[sg->output]);
        for (int64_t r = 0; r < L->repeat; r++) {
            for (int a = 0; a < ni; a++)
                ins[a] =
                    (const float *)((char *)ref + m->tensor[L->args[a]].offset) + r * L->step[a];
            tlm_error ie = {0};
            if ((rc = ir_interp_fast_f64(sg, ins, acc, &ie))) {
                rc = tlm_err_set(err, rc, L->node, "reference: %s", ie.msg);
                goto done;
            }
            float *o = (float *)((char *)ref + m->tensor[L->args[ni]].offset) + r * L->step[ni];
            for (int64_t e = 0; e < n_out; e++)
                o[e] = (float)acc[e];
        }
    }
    out->max_rel_err = 0;
    for (int i = 0; i < m->n_tensor; i++) {
        const rt_tensor *t = &m->tensor[i];
        if (t->kind != FE_T_OUTPUT) continue;
        const float *a = rt_model_data(m, i), *b = (const float *)((char *)ref + t->offset);
        double diff = 0, scale = 0;
        for (int64_t e = 0; e < t->bytes / 4; e++) {
            if (!isfinite(a[e]) || !isfinite(b[e])) out->finite = false;
            double d = fabs((double)a[e] - b[e]);
            if (d > diff || isnan(d)) diff = d;
            if (fabs(b[e]) > scale) scale = fabs(b[e]);
        }
        double rel = diff / (scale > 0 ? scale : 1);
        if (!(rel <= out->max_rel_err)) {
            out->max_rel_err = rel;
            snprintf(out->worst, sizeof out->worst, "%s", t->name);
        }
    }
done:
    out->seconds = tlm_now_s() - t0;
    free(ref);
    free(gs);
    free(acc);
    return rc;
}
