/* nvrtc.c — CUDA C++ → cubin with NVRTC loaded at run time; see toolchain.h.
 *
 * Why NVRTC and not nvcc: in process (no fork, no temp files), no host compiler needed, and it
 * runs on machines without a GPU. ptxas -v is honoured through --ptxas-options=-v and its
 * report lands in the program log, which is how we learn registers, shared memory and spills
 * without parsing the cubin's .nv.info section.
 */
#include "compiler/toolchain/toolchain.h"
#include "compiler/toolchain/cuda_dl.h"

#include <ctype.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TLM_HAVE_CUDA_HEADERS
#include <nvrtc.h>
typedef nvrtcResult tc_nvrtc_result;
typedef nvrtcProgram tc_nvrtc_program;
#else
typedef int tc_nvrtc_result;
typedef struct _nvrtcProgram *tc_nvrtc_program;
#endif

#define TC_NVRTC_SUCCESS 0
#define TC_NVRTC_ERROR_OUT_OF_MEMORY 1
#define TC_NVRTC_ERROR_INVALID_OPTION 5
#ifdef TLM_HAVE_CUDA_HEADERS
_Static_assert(NVRTC_SUCCESS == TC_NVRTC_SUCCESS &&
                   NVRTC_ERROR_OUT_OF_MEMORY == TC_NVRTC_ERROR_OUT_OF_MEMORY &&
                   NVRTC_ERROR_INVALID_OPTION == TC_NVRTC_ERROR_INVALID_OPTION,
               "nvrtcResult values changed");
#endif

typedef struct {
    void *lib;
    char path[512];
    int major, minor;
    int *archs; /* supported sm numbers, ascending */
    int n_archs;
    tc_nvrtc_result (*version)(int *major, int *minor);
    const char *(*get_error_string)(tc_nvrtc_result r);
    tc_nvrtc_result (*create_program)(tc_nvrtc_program *p, const char *src, const char *name,
                                      int n_headers, const char *const *headers,
                                      const char *const *include_names);
    tc_nvrtc_result (*destroy_program)(tc_nvrtc_program *p);
    tc_nvrtc_result (*compile_program)(tc_nvrtc_program p, int n_opts, const char *const *opts);
    tc_nvrtc_result (*get_program_log_size)(tc_nvrtc_program p, size_t *n);
    tc_nvrtc_result (*get_program_log)(tc_nvrtc_program p, char *log);
    tc_nvrtc_result (*get_cubin_size)(tc_nvrtc_program p, size_t *n);
    tc_nvrtc_result (*get_cubin)(tc_nvrtc_program p, char *cubin);
    tc_nvrtc_result (*add_name_expression)(tc_nvrtc_program p, const char *expr);
    tc_nvrtc_result (*get_lowered_name)(tc_nvrtc_program p, const char *expr, const char **name);
    /* optional (CUDA >= 11.2) */
    tc_nvrtc_result (*get_num_supported_archs)(int *n);
    tc_nvrtc_result (*get_supported_archs)(int *archs);
} tc_nvrtc_api;

#ifdef TLM_HAVE_CUDA_HEADERS
#define TC_SIGCHECK(member, fn)                                                                    \
    _Static_assert(                                                                                \
        __builtin_types_compatible_p(__typeof__(((tc_nvrtc_api *)0)->member), __typeof__(&fn)),    \
        "tc_nvrtc_api." #member " does not match nvrtc.h's " #fn)
TC_SIGCHECK(version, nvrtcVersion);
TC_SIGCHECK(get_error_string, nvrtcGetErrorString);
TC_SIGCHECK(create_program, nvrtcCreateProgram);
TC_SIGCHECK(destroy_program, nvrtcDestroyProgram);
TC_SIGCHECK(compile_program, nvrtcCompileProgram);
TC_SIGCHECK(get_program_log_size, nvrtcGetProgramLogSize);
TC_SIGCHECK(get_program_log, nvrtcGetProgramLog);
TC_SIGCHECK(get_cubin_size, nvrtcGetCUBINSize);
TC_SIGCHECK(get_cubin, nvrtcGetCUBIN);
TC_SIGCHECK(add_name_expression, nvrtcAddNameExpression);
TC_SIGCHECK(get_lowered_name, nvrtcGetLoweredName);
TC_SIGCHECK(get_num_supported_archs, nvrtcGetNumSupportedArchs);
TC_SIGCHECK(get_supported_archs, nvrtcGetSupportedArchs);
#endif

/* The fixed options: part of the identity. The architecture comes first, per call. */
static const char *const k_base_opts[] = {"-default-device", "--std=c++17", "-lineinfo",
                                          "--ptxas-options=-v"};
#define N_BASE_OPTS (sizeof k_base_opts / sizeof k_base_opts[0])
#define MAX_EXTRA_OPTS 32

static struct {
    pthread_once_t once;
    tc_nvrtc_api api;
    int rc;
    tlm_error err;
    char identity[256];
} g_nvrtc = {.once = PTHREAD_ONCE_INIT};

typedef struct {
    size_t off;
    int optional;
    const char *name;
} nv_sym;

/* clang-format off */
#define SYM(member, opt, name) {offsetof(tc_nvrtc_api, member), opt, name}
static const nv_sym k_syms[] = {
    SYM(version, 0, "nvrtcVersion"),
    SYM(get_error_string, 0, "nvrtcGetErrorString"),
    SYM(create_program, 0, "nvrtcCreateProgram"),
    SYM(destroy_program, 0, "nvrtcDestroyProgram"),
    SYM(compile_program, 0, "nvrtcCompileProgram"),
    SYM(get_program_log_size, 0, "nvrtcGetProgramLogSize"),
    SYM(get_program_log, 0, "nvrtcGetProgramLog"),
    SYM(get_cubin_size, 0, "nvrtcGetCUBINSize"),
    SYM(get_cubin, 0, "nvrtcGetCUBIN"),
    SYM(add_name_expression, 0, "nvrtcAddNameExpression"),
    SYM(get_lowered_name, 0, "nvrtcGetLoweredName"),
    SYM(get_num_supported_archs, 1, "nvrtcGetNumSupportedArchs"),
    SYM(get_supported_archs, 1, "nvrtcGetSupportedArchs"),
};
#undef SYM
/* clang-format on */

static void nvrtc_load_once(void)
{
    tc_nvrtc_api *a = &g_nvrtc.api;
    char home_lib[512];
    snprintf(home_lib, sizeof home_lib, "%s/lib64/libnvrtc.so", tc_dl_cuda_home());
    const char *names[] = {"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", home_lib, NULL};
    /* TLM_NVRTC_LIB pins one library (a deployment choosing among toolkits; tests). */
    const char *pinned = getenv("TLM_NVRTC_LIB");
    if (pinned && *pinned) {
        names[0] = pinned;
        names[1] = NULL;
    }
    char why[256];
    a->lib = tc_dl_open_first(names, a->path, sizeof a->path, why, sizeof why);
    if (!a->lib) {
        g_nvrtc.rc =
            tlm_err_set(&g_nvrtc.err, TLM_EUNSUPPORTED, "target",
                        "CUDA compilation unavailable: libnvrtc not found (set CUDA_HOME)");
        snprintf(g_nvrtc.identity, sizeof g_nvrtc.identity, "nvrtc:unavailable");
        return;
    }
    for (size_t i = 0; i < sizeof k_syms / sizeof k_syms[0]; i++) {
        void *fn = dlsym(a->lib, k_syms[i].name);
        if (!fn && !k_syms[i].optional) {
            g_nvrtc.rc =
                tlm_err_set(&g_nvrtc.err, TLM_EUNSUPPORTED, "target",
                            "CUDA compilation unavailable: %s lacks %s", a->path, k_syms[i].name);
            snprintf(g_nvrtc.identity, sizeof g_nvrtc.identity, "nvrtc:unavailable");
            return; /* the library stays loaded: unloading buys nothing */
        }
        memcpy((char *)a + k_syms[i].off, &fn, sizeof fn);
    }
    if (a->version(&a->major, &a->minor) != TC_NVRTC_SUCCESS) a->major = a->minor = 0;
    int n = 0;
    if (a->get_num_supported_archs && a->get_supported_archs &&
        a->get_num_supported_archs(&n) == TC_NVRTC_SUCCESS && n > 0 && n < 1024) {
        a->archs = calloc((size_t)n, sizeof *a->archs);
        if (a->archs && a->get_supported_archs(a->archs) == TC_NVRTC_SUCCESS)
            a->n_archs = n;
        else {
            free(a->archs);
            a->archs = NULL;
        }
    }
    int len = snprintf(g_nvrtc.identity, sizeof g_nvrtc.identity, "nvrtc=%d.%d; opts=", a->major,
                       a->minor);
    for (size_t i = 0; i < N_BASE_OPTS && len > 0 && (size_t)len < sizeof g_nvrtc.identity; i++)
        len += snprintf(g_nvrtc.identity + len, sizeof g_nvrtc.identity - (size_t)len, "%s%s",
                        i ? " " : "", k_base_opts[i]);
}

int tc_nvrtc_available(tlm_error *err)
{
    pthread_once(&g_nvrtc.once, nvrtc_load_once);
    if (g_nvrtc.rc && err) *err = g_nvrtc.err;
    return g_nvrtc.rc;
}

const char *tc_nvrtc_identity(void)
{
    pthread_once(&g_nvrtc.once, nvrtc_load_once);
    return g_nvrtc.identity;
}

void tc_cubin_free(tc_cubin *c)
{
    if (!c) return;
    free(c->data);
    free(c->entry);
    free(c->log);
    memset(c, 0, sizeof *c);
}

/* ---- ptxas -v parsing ------------------------------------------------------------------
 * NVRTC 12/13 log, one block per entry (device functions that were not inlined get their own
 * "Function properties" lines, which is why the name is checked on every line):
 *   ptxas info    : Compiling entry function 'sh' for 'sm_90'
 *   ptxas info    : Function properties for sh
 *   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 14 registers, used 1 barriers, 1024 bytes smem, 360 bytes cmem[0]
 * Older ptxas write "Used 10 registers, 380 bytes cmem[0]" without barriers; the figures are
 * read by their unit words, not by position. */

/* The quoted name in `line` after `key` ('...' or "..."), compared with `name`. */
static int line_names(const char *line, const char *key, const char *name)
{
    const char *p = strstr(line, key);
    if (!p) return 0;
    p += strlen(key);
    char q = *p;
    if (q == '\'' || q == '"') p++;
    size_t n = strlen(name);
    if (strncmp(p, name, n) != 0) return 0;
    char end = p[n];
    return (q == '\'' || q == '"') ? end == q : (end == '\0' || end == '\n' || end == ' ');
}

/* The integer right before `unit` (e.g. " registers", " bytes smem") within [line, eol). */
static int figure_before(const char *line, const char *eol, const char *unit)
{
    size_t ul = strlen(unit);
    for (const char *p = line; p + ul <= eol; p++) {
        if (memcmp(p, unit, ul) != 0) continue;
        const char *d = p;
        while (d > line && isdigit((unsigned char)d[-1]))
            d--;
        if (d == p) continue;
        long v = strtol(d, NULL, 10);
        return v > INT_MAX ? INT_MAX : (int)v;
    }
    return -1;
}

int tc_ptxas_parse(const char *log, const char *entry, tc_cubin *c)
{
    c->regs = c->smem_bytes = c->spill_stores = c->spill_loads = c->stack_bytes = -1;
    c->cmem_bytes = 0;
    if (!log || !entry || !*entry) return TLM_ENOTFOUND;
    int in_entry = 0, in_props = 0, found = 0;
    for (const char *line = log; *line;) {
        const char *eol = strchr(line, '\n');
        if (!eol) eol = line + strlen(line);
        /* Bound the line for strstr-based matching. */
        char buf[1024];
        size_t n = (size_t)(eol - line) < sizeof buf - 1 ? (size_t)(eol - line) : sizeof buf - 1;
        memcpy(buf, line, n);
        buf[n] = '\0';
        const char *be = buf + n;

        if (strstr(buf, "Compiling entry function")) {
            in_entry = line_names(buf, "Compiling entry function ", entry);
            in_props = 0;
        } else if (strstr(buf, "Function properties for")) {
            in_props = line_names(buf, "Function properties for ", entry);
        } else if (in_props && strstr(buf, "stack frame")) {
            c->stack_bytes = figure_before(buf, be, " bytes stack frame");
            c->spill_stores = figure_before(buf, be, " bytes spill stores");
            c->spill_loads = figure_before(buf, be, " bytes spill loads");
            in_props = 0;
        } else if (in_entry && strstr(buf, "Used ") && strstr(buf, " registers")) {
            c->regs = figure_before(buf, be, " registers");
            int smem = figure_before(buf, be, " bytes smem");
            c->smem_bytes = smem < 0 ? 0 : smem; /* ptxas omits "smem" when there is none */
            int cmem = figure_before(buf, be, " bytes cmem[0]");
            c->cmem_bytes = cmem < 0 ? 0 : cmem;
            in_entry = 0;
            found = 1;
        }
        line = *eol ? eol + 1 : eol;
    }
    return found ? 0 : TLM_ENOTFOUND;
}

/* ---- compile ------------------------------------------------------------------------- */

static int log_error(tlm_error *err, int code, const char *what, const char *log)
{
    char head[400];
    size_t n = tc_log_head(log, head, sizeof head, 6);
    return tlm_err_set(err, code, "source", "%s: %s", what, n ? head : "(empty log)");
}

static int sm_supported(const tc_nvrtc_api *a, int sm)
{
    if (!a->n_archs) return 1; /* old NVRTC: let the compile say no */
    for (int i = 0; i < a->n_archs; i++)
        if (a->archs[i] == sm) return 1;
    return 0;
}

int tc_nvrtc_compile(const char *cuda_src, const char *kernel_name, int sm, tc_cubin *out,
                     tlm_error *err)
{
    return tc_nvrtc_compile_ex(cuda_src, kernel_name, sm, NULL, out, err);
}

int tc_nvrtc_compile_ex(const char *cuda_src, const char *kernel_name, int sm,
                        const char *const *extra_opts, tc_cubin *out, tlm_error *err)
{
    if (!out) return tlm_err_set(err, TLM_EINVAL, "out", "no output cubin given");
    memset(out, 0, sizeof *out);
    if (!cuda_src || !*cuda_src) return tlm_err_set(err, TLM_EINVAL, "source", "empty CUDA source");
    if (!kernel_name || !*kernel_name)
        return tlm_err_set(err, TLM_EINVAL, "kernel_name", "empty kernel name");
    if (sm < 10 || sm > 999)
        return tlm_err_set(err, TLM_EINVAL, "sm",
                           "sm %d is not an architecture number like 80 or 90", sm);
    size_t n_extra = 0;
    while (extra_opts && extra_opts[n_extra])
        n_extra++;
    if (n_extra > MAX_EXTRA_OPTS)
        return tlm_err_set(err, TLM_EINVAL, "extra_opts", "%zu extra options, at most %d allowed",
                           n_extra, MAX_EXTRA_OPTS);

    int rc = tc_nvrtc_available(err);
    if (rc) return rc;
    const tc_nvrtc_api *a = &g_nvrtc.api;
    if (!sm_supported(a, sm)) {
        char list[256];
        size_t len = 0;
        list[0] = '\0';
        for (int i = 0; i < a->n_archs && len < sizeof list - 8; i++)
            len +=
                (size_t)snprintf(list + len, sizeof list - len, "%s%d", i ? ", " : "", a->archs[i]);
        return tlm_err_set(err, TLM_EUNSUPPORTED, "sm",
                           "NVRTC %d.%d cannot build for sm_%d; it supports sm %s", a->major,
                           a->minor, sm, list);
    }

    char arch[48];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d", sm);
    const char *opts[1 + N_BASE_OPTS + MAX_EXTRA_OPTS];
    int n_opts = 0;
    opts[n_opts++] = arch;
    for (size_t i = 0; i < N_BASE_OPTS; i++)
        opts[n_opts++] = k_base_opts[i];
    for (size_t i = 0; i < n_extra; i++)
        opts[n_opts++] = extra_opts[i];

    tc_nvrtc_program prog = NULL;
    tc_nvrtc_result r = a->create_program(&prog, cuda_src, "kernel.cu", 0, NULL, NULL);
    if (r != TC_NVRTC_SUCCESS)
        return tlm_err_set(err, r == TC_NVRTC_ERROR_OUT_OF_MEMORY ? TLM_ENOMEM : TLM_ETOOLCHAIN,
                           "source", "nvrtcCreateProgram: %s", a->get_error_string(r));
    /* A name expression gives the lowered (mangled) name of any kernel, templates included,
     * and makes an undefined kernel a compile error instead of a missing symbol at load. */
    r = a->add_name_expression(prog, kernel_name);
    if (r != TC_NVRTC_SUCCESS) {
        rc = tlm_err_set(err, TLM_EINVAL, "kernel_name", "kernel name \"%s\" rejected by NVRTC: %s",
                         kernel_name, a->get_error_string(r));
        goto done;
    }

    tc_nvrtc_result cr = a->compile_program(prog, n_opts, opts);
    size_t log_n = 0;
    if (a->get_program_log_size(prog, &log_n) == TC_NVRTC_SUCCESS && log_n > 0) {
        out->log = malloc(log_n + 1);
        if (!out->log) {
            rc =
                tlm_err_set(err, TLM_ENOMEM, "source", "no memory for a %zu-byte NVRTC log", log_n);
            goto done;
        }
        if (a->get_program_log(prog, out->log) != TC_NVRTC_SUCCESS) out->log[0] = '\0';
        out->log[log_n] = '\0';
    }
    if (cr != TC_NVRTC_SUCCESS) {
        const char *log = out->log ? out->log : "";
        if (strstr(log, "__nv_name_map"))
            rc = tlm_err_set(err, TLM_ETOOLCHAIN, "kernel_name",
                             "kernel \"%s\" is not defined in the CUDA source", kernel_name);
        else if (cr == TC_NVRTC_ERROR_INVALID_OPTION)
            rc = log_error(err, TLM_EINVAL, "NVRTC rejected an option", log);
        else
            rc = log_error(err, TLM_ETOOLCHAIN, "CUDA compilation failed", log);
        goto done;
    }

    const char *lowered = NULL;
    r = a->get_lowered_name(prog, kernel_name, &lowered);
    if (r != TC_NVRTC_SUCCESS || !lowered) {
        rc = tlm_err_set(err, TLM_ETOOLCHAIN, "kernel_name", "no lowered name for \"%s\": %s",
                         kernel_name, a->get_error_string(r));
        goto done;
    }
    out->entry = strdup(lowered); /* owned by prog, which dies below */
    size_t size = 0;
    r = a->get_cubin_size(prog, &size);
    if (!out->entry || r != TC_NVRTC_SUCCESS || size == 0) {
        rc = out->entry ? tlm_err_set(err, TLM_ETOOLCHAIN, "source", "nvrtcGetCUBINSize: %s",
                                      r ? a->get_error_string(r) : "empty cubin")
                        : tlm_err_set(err, TLM_ENOMEM, "source", "no memory");
        goto done;
    }
    out->data = malloc(size);
    if (!out->data) {
        rc = tlm_err_set(err, TLM_ENOMEM, "source", "no memory for a %zu-byte cubin", size);
        goto done;
    }
    r = a->get_cubin(prog, (char *)out->data);
    if (r != TC_NVRTC_SUCCESS) {
        rc =
            tlm_err_set(err, TLM_ETOOLCHAIN, "source", "nvrtcGetCUBIN: %s", a->get_error_string(r));
        goto done;
    }
    out->size = size;
    out->sm = sm;
    /* Absent figures stay -1: the caller's limit check skips them rather than guessing. */
    tc_ptxas_parse(out->log, out->entry, out);
    rc = 0;

done:
    a->destroy_program(&prog);
    if (rc) {
        /* Keep only the log on failure, as documented. */
        free(out->data);
        free(out->entry);
        out->data = NULL;
        out->entry = NULL;
        out->size = 0;
    }
    return rc;
}

int tc_cubin_check_limits(const tc_cubin *c, int max_regs_per_thread, int threads_per_block,
                          int regs_per_sm, int smem_per_block_max, tlm_error *err)
{
    if (!c) return tlm_err_set(err, TLM_EINVAL, "cubin", "no cubin given");
    if (threads_per_block < 1 || threads_per_block > 1024)
        return tlm_err_set(err, TLM_EINVAL, "threads_per_block",
                           "%d threads per block; allowed 1..1024", threads_per_block);
    if (max_regs_per_thread < 1 || regs_per_sm < 1 || smem_per_block_max < 0)
        return tlm_err_set(err, TLM_EINVAL, "limits",
                           "limits must be positive (regs/thread %d, regs/SM %d, smem %d)",
                           max_regs_per_thread, regs_per_sm, smem_per_block_max);
    if (c->regs > max_regs_per_thread)
        return tlm_err_set(err, TLM_ELIMIT, "regs", "%d registers per thread, the limit is %d",
                           c->regs, max_regs_per_thread);
    if (c->regs > 0) {
        /* Registers are allocated per warp in units of 256. */
        long per_warp = ((long)c->regs * 32 + 255) / 256 * 256;
        long warps = (threads_per_block + 31) / 32;
        long need = per_warp * warps;
        if (need > regs_per_sm)
            return tlm_err_set(err, TLM_ELIMIT, "regs",
                               "%d registers x %d threads needs %ld registers per block, the "
                               "register file holds %d",
                               c->regs, threads_per_block, need, regs_per_sm);
    }
    if (c->smem_bytes > smem_per_block_max)
        return tlm_err_set(err, TLM_ELIMIT, "smem_bytes",
                           "%d bytes of static shared memory per block, the limit is %d",
                           c->smem_bytes, smem_per_block_max);
    return 0;
}
