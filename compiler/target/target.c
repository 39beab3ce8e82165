#include "compiler/target/target.h"

#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "compiler/target/hostcpu.h"
#include "compiler/util/util.h"

#define KIB 1024
#define MIB (1024 * 1024)

/* ---- GPU tables ----
 *
 * Per-architecture limits: CUDA C++ Programming Guide, "Technical Specifications per Compute
 * Capability". Shared memory per block above 48 KiB needs cudaFuncAttributeMax-
 * DynamicSharedMemorySize; from sm_80 on, 1 KiB per block is reserved by the system, hence
 * opt-in = per-SM - 1 KiB there. Common to all six: 64 K registers per SM, 255 per thread,
 * 1024 threads per block, warps of 32. */
typedef struct gpu_arch {
    int sm;
    const char *rep; /* representative part for cuda:sm_XX */
    int max_threads_per_sm, max_warps_per_sm, max_blocks_per_sm;
    int smem_per_sm, smem_optin;
} gpu_arch;

static const gpu_arch ARCHS[] = {
    {70, "v100", 2048, 64, 32, 96 * KIB, 96 * KIB},
    {75, "t4", 1024, 32, 16, 64 * KIB, 64 * KIB},
    {80, "a100", 2048, 64, 32, 164 * KIB, 163 * KIB},
    {86, "a10", 1536, 48, 16, 100 * KIB, 99 * KIB},
    {89, "l4", 1536, 48, 24, 100 * KIB, 99 * KIB},
    {90, "h100", 2048, 64, 32, 228 * KIB, 227 * KIB},
};

/* Per-part figures: NVIDIA datasheets and architecture whitepapers. Tensor throughputs are
 * dense (no 2:4 sparsity) with FP32 accumulation, the mode our kernels use; that is why the
 * RTX 4090 shows 165 and not the 330 TFLOP/s of FP16 accumulation. Pre-Ampere parts have no
 * BF16 tensor cores (0). */
typedef struct gpu_part {
    const char *name, *product;
    int sm, sm_count;
    int64_t l2;
    double bw_gbs, fp32, fp16_tc, bf16_tc;
} gpu_part;

static const gpu_part PARTS[] = {
    {"v100", "Tesla V100 SXM2", 70, 80, 6 * MIB, 900, 15.7, 125, 0},
    {"t4", "Tesla T4", 75, 40, 4 * MIB, 320, 8.1, 65, 0},
    {"a100", "A100 SXM4 80GB", 80, 108, 40 * MIB, 2039, 19.5, 312, 312},
    {"a10", "A10", 86, 72, 6 * MIB, 600, 31.2, 125, 125},
    {"l4", "L4", 89, 58, 48 * MIB, 300, 30.3, 121, 121},
    {"rtx4090", "GeForce RTX 4090", 89, 128, 72 * MIB, 1008, 82.6, 165.2, 165.2},
    {"h100", "H100 SXM5", 90, 132, 50 * MIB, 3350, 67.0, 989.4, 989.4},
    {"h200", "H200 SXM", 90, 132, 50 * MIB, 4800, 67.0, 989.4, 989.4},
};

#define NARCH ((int)(sizeof ARCHS / sizeof ARCHS[0]))
#define NPART ((int)(sizeof PARTS / sizeof PARTS[0]))

static const char *const NAMES[] = {
    "cpu",        "cpu:avx2",   "cpu:avx512",   "cuda:sm_70", "cuda:sm_75", "cuda:sm_80",
    "cuda:sm_86", "cuda:sm_89", "cuda:sm_90",   "cuda:v100",  "cuda:t4",    "cuda:a100",
    "cuda:a10",   "cuda:l4",    "cuda:rtx4090", "cuda:h100",  "cuda:h200",
};
#define NNAMES ((int)(sizeof NAMES / sizeof NAMES[0]))

/* ---- host ---- */

static target_cpu_info g_host;
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

static void host_init(void)
{
    hostcpu_detect(&g_host);
}

const target_cpu_info *target_host_cpu(void)
{
    pthread_once(&g_host_once, host_init);
    return &g_host;
}

bool target_vendor_amd(const char *vendor)
{
    return !strcmp(vendor, "AuthenticAMD") || !strcmp(vendor, "HygonGenuine");
}

/* ---- ISA helpers ---- */

static const char *const ISA_NAMES[TARGET_ISA_COUNT] = {
    "sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
};

const char *target_isa_name(uint32_t bit)
{
    for (int i = 0; i < TARGET_ISA_COUNT; i++)
        if (bit == (1u << i)) return ISA_NAMES[i];
    return NULL;
}

int target_isa_vector_lanes(uint32_t isa)
{
    if (isa & TARGET_ISA_AVX512F) return 16;
    if (isa & TARGET_ISA_AVX) return 8; /* 256-bit float ops come with AVX, not AVX2 */
    return 4;                           /* SSE (every x86-64), or 128-bit SIMD elsewhere */
}

int target_isa_vector_registers(uint32_t isa)
{
    return (isa & TARGET_ISA_AVX512F) ? 32 : 16;
}

double target_cpu_peak_gflops(const target_cpu_info *c)
{
    if (!c || c->freq_mhz <= 0) return 0;
    return (double)c->physical_cores * c->fma_units * c->vector_lanes * 2.0 * c->freq_mhz / 1e3;
}

/* ---- names and parsing ---- */

int target_list(const char **names, int cap)
{
    for (int i = 0; names && i < cap && i < NNAMES; i++)
        names[i] = NAMES[i];
    return NNAMES;
}

static void accepted_list(char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < NNAMES && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", NAMES[i]);
}

/* Every refusal names the field and lists what is accepted. */
static int refuse(tlm_error *err, int code, const char *what)
{
    char names[400];
    accepted_list(names, sizeof names);
    return tlm_err_set(err, code, "target", "%s; accepted: %s", what, names);
}

static int refuse_name(tlm_error *err, const char *prefix, const char *s, const char *suffix)
{
    char what[160];
    snprintf(what, sizeof what, "%s \"%.40s\"%s", prefix, s, suffix);
    return refuse(err, TLM_EUNSUPPORTED, what);
}

static void named_cpu(target *t, const char *name, int level)
{
    const target_cpu_info *h = target_host_cpu();
    target_cpu_info *c = &t->cpu;
    t->kind = TARGET_CPU;
    snprintf(t->name, sizeof t->name, "%s", name);
    c->isa = TARGET_ISA_SSE42 | TARGET_ISA_AVX | TARGET_ISA_AVX2 | TARGET_ISA_FMA;
    if (level >= 4) c->isa |= TARGET_ISA_AVX512F | TARGET_ISA_AVX512BW | TARGET_ISA_AVX512VL;
    c->x86_level = level;
    c->vector_lanes = target_isa_vector_lanes(c->isa);
    c->vector_registers = target_isa_vector_registers(c->isa);
    c->cores = h->cores;
    c->physical_cores = h->physical_cores;
    c->l1d_bytes = h->l1d_bytes;
    c->l2_bytes = h->l2_bytes;
    c->l3_bytes = h->l3_bytes;
    c->fma_units = 2;
    c->freq_mhz = h->freq_mhz;
    snprintf(c->model, sizeof c->model, "generic x86-64-v%d", level);
    /* The psABI levels rather than haswell / skylake-avx512: they are vendor-neutral (a Zen 4
     * and a Sapphire Rapids both run v4 code) and name exactly the ISA we promise, with no
     * extras (skylake-avx512 adds clwb, pku...). -mtune=generic keeps one vendor's scheduling
     * model out; skylake-avx512 tuning would also cap vectors at 256 bits, hence the explicit
     * 512 for v4. Needs gcc >= 11 or clang >= 12. */
    snprintf(c->cc_flags, sizeof c->cc_flags, "-march=x86-64-v%d -mtune=generic%s", level,
             level >= 4 ? " -mprefer-vector-width=512" : "");
}

static void fill_gpu(target *t, const char *name, const gpu_arch *a, const gpu_part *p)
{
    target_gpu_info *g = &t->gpu;
    t->kind = TARGET_CUDA;
    snprintf(t->name, sizeof t->name, "%s", name);
    g->sm = a->sm;
    snprintf(g->part, sizeof g->part, "%s", p->name);
    snprintf(g->product, sizeof g->product, "%s", p->product);
    g->sm_count = p->sm_count;
    g->smem_per_block = 48 * KIB;
    g->smem_per_block_optin = a->smem_optin;
    g->smem_per_sm = a->smem_per_sm;
    g->regs_per_sm = 65536;
    g->max_regs_per_thread = 255;
    g->max_threads_per_block = 1024;
    g->warp_size = 32;
    g->max_warps_per_sm = a->max_warps_per_sm;
    g->max_threads_per_sm = a->max_threads_per_sm;
    g->max_blocks_per_sm = a->max_blocks_per_sm;
    g->l2_bytes = p->l2;
    g->mem_bandwidth_gbs = p->bw_gbs;
    g->peak_fp32_tflops = p->fp32;
    g->peak_fp16_tensor_tflops = p->fp16_tc;
    g->peak_bf16_tensor_tflops = p->bf16_tc;
}

static const gpu_arch *arch_of(int sm)
{
    for (int i = 0; i < NARCH; i++)
        if (ARCHS[i].sm == sm) return &ARCHS[i];
    return NULL;
}

static const gpu_part *part_named(const char *name)
{
    for (int i = 0; i < NPART; i++)
        if (!strcmp(PARTS[i].name, name)) return &PARTS[i];
    return NULL;
}

int target_parse(const char *s, target *out, tlm_error *err)
{
    if (!s || !*s) return refuse(err, TLM_EINVAL, "target is empty");
    char low[TARGET_NAME_MAX];
    size_t n = strlen(s);
    if (n >= sizeof low) return refuse_name(err, "unknown target", s, "");
    for (size_t i = 0; i <= n; i++)
        low[i] = (char)tolower((unsigned char)s[i]);

    target t;
    memset(&t, 0, sizeof t);
    if (!strcmp(low, "cpu")) {
        t.kind = TARGET_CPU;
        snprintf(t.name, sizeof t.name, "cpu");
        t.cpu = *target_host_cpu();
    } else if (!strcmp(low, "cpu:avx2") || !strcmp(low, "cpu:avx512")) {
#if defined(__x86_64__)
        named_cpu(&t, low, strcmp(low, "cpu:avx2") ? 4 : 3);
#else
        (void)named_cpu;
        return refuse_name(err, "target", s, " needs an x86-64 host (cc cannot emit x86 here)");
#endif
    } else if (!strcmp(low, "cuda")) {
        return refuse_name(err, "target", s, " needs an architecture or a part, as in cuda:sm_90");
    } else if (!strncmp(low, "cuda:", 5)) {
        const char *rest = low + 5;
        const gpu_arch *a = NULL;
        const gpu_part *p = NULL;
        for (int i = 0; i < NARCH && !a; i++) {
            char sm[16];
            snprintf(sm, sizeof sm, "sm_%d", ARCHS[i].sm);
            if (!strcmp(rest, sm)) a = &ARCHS[i], p = part_named(a->rep);
        }
        if (!a && (p = part_named(rest))) a = arch_of(p->sm);
        if (!a || !p) return refuse_name(err, "unknown target", s, "");
        fill_gpu(&t, low, a, p);
    } else {
        return refuse_name(err, "unknown target", s, "");
    }
    *out = t;
    return 0;
}

const char *target_cc_flags(const target *t)
{
    return (t && t->kind == TARGET_CPU) ? t->cpu.cc_flags : "";
}

int target_sm(const target *t)
{
    return (t && t->kind == TARGET_CUDA) ? t->gpu.sm : 0;
}

bool target_host_can_run(const target *t)
{
    if (!t || t->kind != TARGET_CPU) return false;
    const target_cpu_info *h = target_host_cpu();
    if (!strcmp(t->name, "cpu")) return true;
    return (t->cpu.isa & ~h->isa) == 0 && h->x86_level >= t->cpu.x86_level;
}

/* ---- canonical form and hash ---- */

typedef struct {
    char *buf;
    size_t cap, len;
    bool overflow;
} sbuf;

__attribute__((format(printf, 2, 3))) static void put(sbuf *b, const char *fmt, ...)
{
    if (b->overflow) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= b->cap - b->len)
        b->overflow = true;
    else
        b->len += (size_t)n;
}

static void put_isa(sbuf *b, uint32_t isa)
{
    put(b, "isa=");
    int k = 0;
    for (int i = 0; i < TARGET_ISA_COUNT; i++)
        if (isa & (1u << i)) put(b, "%s%s", k++ ? "," : "", ISA_NAMES[i]);
    put(b, "\n");
}

int target_canonical(const target *t, char *buf, size_t cap)
{
    if (!t || !buf || cap == 0) return TLM_EINVAL;
    sbuf b = {buf, cap, 0, false};
    buf[0] = 0;
    put(&b, "tlm-target-v1\n");
    if (t->kind == TARGET_CPU) {
        const target_cpu_info *c = &t->cpu;
        put(&b, "kind=cpu\n");
        put_isa(&b, c->isa);
        put(&b, "x86_level=%d\nvector_lanes=%d\nvector_registers=%d\n", c->x86_level,
            c->vector_lanes, c->vector_registers);
        put(&b, "cores=%d\nphysical_cores=%d\n", c->cores, c->physical_cores);
        put(&b, "l1d=%lld\nl2=%lld\nl3=%lld\n", (long long)c->l1d_bytes, (long long)c->l2_bytes,
            (long long)c->l3_bytes);
        put(&b, "fma_units=%d\ncc_flags=%s\n", c->fma_units, c->cc_flags);
        if (c->vendor[0]) {
            put(&b, "native=%s/%d/%d/%d/", c->vendor, c->family, c->model_id, c->stepping);
            for (int i = 0; i < 10; i++)
                put(&b, "%s%08x", i ? "," : "", c->cpuid_words[i]);
            put(&b, "\n");
        }
    } else if (t->kind == TARGET_CUDA) {
        const target_gpu_info *g = &t->gpu;
        put(&b, "kind=cuda\nsm=%d\nsm_count=%d\n", g->sm, g->sm_count);
        put(&b, "smem_per_block=%d\nsmem_per_block_optin=%d\nsmem_per_sm=%d\n", g->smem_per_block,
            g->smem_per_block_optin, g->smem_per_sm);
        put(&b, "regs_per_sm=%d\nmax_regs_per_thread=%d\nmax_threads_per_block=%d\n",
            g->regs_per_sm, g->max_regs_per_thread, g->max_threads_per_block);
        put(&b, "warp_size=%d\nmax_warps_per_sm=%d\nmax_threads_per_sm=%d\nmax_blocks_per_sm=%d\n",
            g->warp_size, g->max_warps_per_sm, g->max_threads_per_sm, g->max_blocks_per_sm);
        put(&b, "l2=%lld\nmem_bandwidth_gbs=%.3f\n", (long long)g->l2_bytes, g->mem_bandwidth_gbs);
        put(&b,
            "peak_fp32_tflops=%.3f\npeak_fp16_tensor_tflops=%.3f\npeak_bf16_tensor_tflops=%.3f\n",
            g->peak_fp32_tflops, g->peak_fp16_tensor_tflops, g->peak_bf16_tensor_tflops);
    } else {
        return TLM_EINVAL;
    }
    return b.overflow ? TLM_ELIMIT : (int)b.len;
}

int target_hash(const target *t, uint8_t out[32])
{
    char buf[TARGET_CANONICAL_MAX];
    int n = target_canonical(t, buf, sizeof buf);
    if (n < 0) return n;
    return tlm_sha256(buf, (size_t)n, out);
}

int target_hash_hex(const target *t, char out[TARGET_HASH_HEX])
{
    uint8_t h[32];
    int rc = target_hash(t, h);
    if (rc < 0) return rc;
    tlm_hex(h, 32, out);
    return 0;
}

/* ---- JSON ---- */

static bool set(json_t *o, const char *k, json_t *v)
{
    return json_object_set_new(o, k, v) == 0; /* takes v, even NULL, and reports failure */
}

json_t *target_to_json(const target *t)
{
    char hex[TARGET_HASH_HEX];
    if (!t || target_hash_hex(t, hex) < 0) return NULL;
    json_t *o = json_object();
    if (!o) return NULL;
    bool ok = set(o, "name", json_string(t->name)) && set(o, "hash", json_string(hex));
    if (t->kind == TARGET_CPU) {
        const target_cpu_info *c = &t->cpu;
        ok = ok && set(o, "kind", json_string("cpu"));
        /* Nested values are built first and then always handed to set(), which takes
         * ownership even on failure, so nothing leaks whichever step fails. */
        json_t *isa = json_array();
        for (int i = 0; isa && i < TARGET_ISA_COUNT; i++)
            if (c->isa & (1u << i))
                ok = json_array_append_new(isa, json_string(ISA_NAMES[i])) == 0 && ok;
        ok = set(o, "isa", isa) && ok;
        json_t *cache = json_object();
        bool cache_ok = cache && set(cache, "l1d", json_integer(c->l1d_bytes)) &&
                        set(cache, "l2", json_integer(c->l2_bytes)) &&
                        set(cache, "l3", json_integer(c->l3_bytes));
        ok = set(o, "cache", cache) && cache_ok && ok;
        ok = ok && set(o, "x86_level", json_integer(c->x86_level)) &&
             set(o, "vector_lanes", json_integer(c->vector_lanes)) &&
             set(o, "vector_registers", json_integer(c->vector_registers)) &&
             set(o, "cores", json_integer(c->cores)) &&
             set(o, "physical_cores", json_integer(c->physical_cores));
        ok = ok && set(o, "fma_units", json_integer(c->fma_units)) &&
             set(o, "freq_mhz", json_integer(c->freq_mhz)) &&
             set(o, "peak_gflops_f32", json_real(target_cpu_peak_gflops(c))) &&
             set(o, "cc_flags", json_string(c->cc_flags)) &&
             set(o, "vendor", json_string(c->vendor)) && set(o, "model", json_string(c->model));
    } else {
        const target_gpu_info *g = &t->gpu;
        char arch[16];
        snprintf(arch, sizeof arch, "sm_%d", g->sm);
        ok = ok && set(o, "kind", json_string("cuda")) && set(o, "sm", json_integer(g->sm)) &&
             set(o, "arch", json_string(arch)) && set(o, "part", json_string(g->part)) &&
             set(o, "product", json_string(g->product)) &&
             set(o, "sm_count", json_integer(g->sm_count));
        json_t *smem = json_object();
        bool smem_ok = smem && set(smem, "per_block", json_integer(g->smem_per_block)) &&
                       set(smem, "per_block_optin", json_integer(g->smem_per_block_optin)) &&
                       set(smem, "per_sm", json_integer(g->smem_per_sm));
        ok = set(o, "shared_memory", smem) && smem_ok && ok;
        ok = ok && set(o, "registers_per_sm", json_integer(g->regs_per_sm)) &&
             set(o, "max_registers_per_thread", json_integer(g->max_regs_per_thread)) &&
             set(o, "max_threads_per_block", json_integer(g->max_threads_per_block)) &&
             set(o, "warp_size", json_integer(g->warp_size)) &&
             set(o, "max_warps_per_sm", json_integer(g->max_warps_per_sm)) &&
             set(o, "max_threads_per_sm", json_integer(g->max_threads_per_sm)) &&
             set(o, "max_blocks_per_sm", json_integer(g->max_blocks_per_sm)) &&
             set(o, "l2_bytes", json_integer(g->l2_bytes)) &&
             set(o, "memory_bandwidth_gbs", json_real(g->mem_bandwidth_gbs)) &&
             set(o, "peak_fp32_tflops", json_real(g->peak_fp32_tflops)) &&
             set(o, "peak_fp16_tensor_tflops", json_real(g->peak_fp16_tensor_tflops)) &&
             set(o, "peak_bf16_tensor_tflops", json_real(g->peak_bf16_tensor_tflops));
    }
    if (!ok) {
        json_decref(o);
        return NULL;
    }
    return o;
}
