#include "compiler/target/hostcpu.h"

#include <ctype.h>
#include <dirent.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HOSTCPU_X86 1
#else
#define HOSTCPU_X86 0
#endif

/* Feature bits, spelled out here rather than taken from <cpuid.h>: gcc's and clang's headers
 * disagree on several names, and the tests build synthetic words from these. */
/* leaf 1 ecx */
#define L1C_SSE3 (1u << 0)
#define L1C_SSSE3 (1u << 9)
#define L1C_FMA (1u << 12)
#define L1C_CX16 (1u << 13)
#define L1C_SSE41 (1u << 19)
#define L1C_SSE42 (1u << 20)
#define L1C_MOVBE (1u << 22)
#define L1C_POPCNT (1u << 23)
#define L1C_OSXSAVE (1u << 27)
#define L1C_AVX (1u << 28)
#define L1C_F16C (1u << 29)
/* leaf 1 edx */
#define L1D_SSE2 (1u << 26)
/* leaf 7 ebx */
#define L7B_BMI1 (1u << 3)
#define L7B_AVX2 (1u << 5)
#define L7B_BMI2 (1u << 8)
#define L7B_AVX512F (1u << 16)
#define L7B_AVX512DQ (1u << 17)
#define L7B_AVX512CD (1u << 28)
#define L7B_AVX512BW (1u << 30)
#define L7B_AVX512VL (1u << 31)
/* leaf 7 edx: speculation-control and mitigation bits (md_clear, tsx_force_abort, cet_ibt,
 * ibrs, stibp, l1d_flush, arch/core_capabilities, ssbd). They change with microcode and
 * hypervisor versions, never with what the compiler may emit. */
#define L7D_MITIGATIONS ((1u << 10) | (1u << 11) | (1u << 13) | (1u << 20) | 0xfc000000u)
/* leaf 7 ecx */
#define L7C_AVX512VNNI (1u << 11)
/* leaf 7 subleaf 1 eax */
#define L7S1A_AVX512BF16 (1u << 5)
/* 0x80000001 ecx */
#define E1C_LAHF (1u << 0)
#define E1C_LZCNT (1u << 5)
#define E1C_TOPOEXT (1u << 22)

/* XCR0 state components the OS must enable before the registers may be used. */
#define XCR0_SSE_YMM 0x6ull /* XMM (bit 1) + YMM upper halves (bit 2) */
#define XCR0_AVX512 0xe0ull /* opmask (5), ZMM_Hi256 (6), Hi16_ZMM (7) */

/* Conservative fallbacks: a tile sized for a smaller cache still runs well in a bigger one,
 * the reverse thrashes. */
#define FALLBACK_L1D (32 * 1024)
#define FALLBACK_L2 (512 * 1024)

int hostcpu_read_cpuid(hostcpu_cpuid *c, char vendor[16], char model[64])
{
    memset(c, 0, sizeof *c);
    vendor[0] = 0;
    model[0] = 0;
#if HOSTCPU_X86
    unsigned a, b, cx, d;
    unsigned max = __get_cpuid_max(0, NULL);
    if (max == 0) return TLM_EUNSUPPORTED;
    __cpuid(0, a, b, cx, d);
    memcpy(vendor, &b, 4);
    memcpy(vendor + 4, &d, 4);
    memcpy(vendor + 8, &cx, 4);
    vendor[12] = 0;
    if (max >= 1) {
        __cpuid(1, a, b, cx, d);
        c->leaf1_eax = a;
        c->leaf1_ecx = cx;
        c->leaf1_edx = d;
    }
    if (max >= 7) {
        __cpuid_count(7, 0, a, b, cx, d);
        unsigned max_sub = a;
        c->leaf7_ebx = b;
        c->leaf7_ecx = cx;
        c->leaf7_edx = d;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, a, b, cx, d);
            c->leaf7s1_eax = a;
        }
    }
    unsigned maxext = __get_cpuid_max(0x80000000u, NULL);
    if (maxext >= 0x80000001u) {
        __cpuid(0x80000001u, a, b, cx, d);
        c->ext1_ecx = cx;
        c->ext1_edx = d;
    }
    if (maxext >= 0x80000004u) {
        unsigned w[12];
        for (unsigned i = 0; i < 3; i++)
            __cpuid(0x80000002u + i, w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
        char raw[49];
        memcpy(raw, w, 48);
        raw[48] = 0;
        const char *p = raw;
        while (*p == ' ')
            p++; /* Intel right-aligns the brand string */
        snprintf(model, 64, "%s", p);
        for (size_t n = strlen(model); n > 0 && model[n - 1] == ' '; n--)
            model[n - 1] = 0;
    }
    /* XGETBV faults unless the OS set CR4.OSXSAVE, which cpuid mirrors. */
    if (c->leaf1_ecx & L1C_OSXSAVE) {
        unsigned lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        c->xcr0 = ((uint64_t)hi << 32) | lo;
    }
    return 0;
#else
    return TLM_EUNSUPPORTED;
#endif
}

uint32_t hostcpu_isa_from_cpuid(const hostcpu_cpuid *c)
{
    uint32_t isa = 0;
    if (c->leaf1_ecx & L1C_SSE42) isa |= TARGET_ISA_SSE42;
    bool ymm_os = (c->leaf1_ecx & L1C_OSXSAVE) && (c->xcr0 & XCR0_SSE_YMM) == XCR0_SSE_YMM;
    if (!ymm_os) return isa; /* no AVX of any kind is usable: the OS would not save YMM */
    if (c->leaf1_ecx & L1C_AVX) isa |= TARGET_ISA_AVX;
    if ((isa & TARGET_ISA_AVX) && (c->leaf7_ebx & L7B_AVX2)) isa |= TARGET_ISA_AVX2;
    if ((isa & TARGET_ISA_AVX) && (c->leaf1_ecx & L1C_FMA)) isa |= TARGET_ISA_FMA;
    bool zmm_os = (c->xcr0 & XCR0_AVX512) == XCR0_AVX512;
    if (!zmm_os || !(c->leaf7_ebx & L7B_AVX512F)) return isa;
    isa |= TARGET_ISA_AVX512F;
    if (c->leaf7_ebx & L7B_AVX512BW) isa |= TARGET_ISA_AVX512BW;
    if (c->leaf7_ebx & L7B_AVX512VL) isa |= TARGET_ISA_AVX512VL;
    if (c->leaf7_ecx & L7C_AVX512VNNI) isa |= TARGET_ISA_AVX512_VNNI;
    if (c->leaf7s1_eax & L7S1A_AVX512BF16) isa |= TARGET_ISA_AVX512_BF16;
    return isa;
}

static bool all(uint32_t word, uint32_t bits)
{
    return (word & bits) == bits;
}

int hostcpu_x86_level(const hostcpu_cpuid *c)
{
    if (!(c->leaf1_edx & L1D_SSE2)) return 0;
    int level = 1;
    if (!all(c->leaf1_ecx, L1C_SSE3 | L1C_SSSE3 | L1C_SSE41 | L1C_SSE42 | L1C_POPCNT | L1C_CX16) ||
        !(c->ext1_ecx & E1C_LAHF))
        return level;
    level = 2;
    uint32_t isa = hostcpu_isa_from_cpuid(c);
    if (!all(isa, TARGET_ISA_AVX | TARGET_ISA_AVX2 | TARGET_ISA_FMA) ||
        !all(c->leaf7_ebx, L7B_BMI1 | L7B_BMI2) || !all(c->leaf1_ecx, L1C_F16C | L1C_MOVBE) ||
        !(c->ext1_ecx & E1C_LZCNT))
        return level;
    level = 3;
    if (!all(isa, TARGET_ISA_AVX512F | TARGET_ISA_AVX512BW | TARGET_ISA_AVX512VL) ||
        !all(c->leaf7_ebx, L7B_AVX512CD | L7B_AVX512DQ))
        return level;
    return 4;
}

void hostcpu_signature(const hostcpu_cpuid *c, int *family, int *model, int *stepping)
{
    uint32_t a = c->leaf1_eax;
    int fam = (a >> 8) & 0xf, mod = (a >> 4) & 0xf;
    if (fam == 0xf) fam += (a >> 20) & 0xff;
    if (fam == 0x6 || fam >= 0xf) mod += ((a >> 16) & 0xf) << 4;
    *family = fam;
    *model = mod;
    *stepping = a & 0xf;
}

int64_t hostcpu_parse_size(const char *s)
{
    if (!s) return -1;
    while (isspace((unsigned char)*s))
        s++;
    if (!isdigit((unsigned char)*s)) return -1;
    char *end;
    long long v = strtoll(s, &end, 10);
    int64_t mul = 1;
    switch (*end) {
    case 'K':
    case 'k':
        mul = 1024;
        end++;
        break;
    case 'M':
    case 'm':
        mul = 1024 * 1024;
        end++;
        break;
    case 'G':
    case 'g':
        mul = 1024 * 1024 * 1024;
        end++;
        break;
    }
    while (isspace((unsigned char)*end))
        end++;
    if (*end || v < 0 || v > (INT64_MAX / mul)) return -1;
    return v * mul;
}

/* First line of a small sysfs file, newline stripped; false if unreadable. */
static bool read_line(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return false;
    bool ok = fgets(buf, (int)cap, f) != NULL;
    fclose(f);
    if (ok) buf[strcspn(buf, "\n")] = 0;
    return ok;
}

int hostcpu_caches_from_sysfs(const char *dir, int64_t *l1d, int64_t *l2, int64_t *l3)
{
    bool have[4] = {false};
    int64_t size[4] = {0};
    /* index* are not guaranteed dense, so try a fixed range rather than stop at a gap. */
    for (int i = 0; i < 16; i++) {
        char path[512], level[16], type[32], sz[32];
        snprintf(path, sizeof path, "%s/index%d/level", dir, i);
        if (!read_line(path, level, sizeof level)) continue;
        snprintf(path, sizeof path, "%s/index%d/type", dir, i);
        if (!read_line(path, type, sizeof type)) continue;
        snprintf(path, sizeof path, "%s/index%d/size", dir, i);
        if (!read_line(path, sz, sizeof sz)) continue;
        int lv = atoi(level);
        int64_t bytes = hostcpu_parse_size(sz);
        if (lv < 1 || lv > 3 || bytes <= 0) continue;
        if (strcmp(type, "Data") != 0 && strcmp(type, "Unified") != 0) continue;
        if (!have[lv] || bytes > size[lv]) size[lv] = bytes;
        have[lv] = true;
    }
    int n = 0;
    if (have[1]) *l1d = size[1], n++;
    if (have[2]) *l2 = size[2], n++;
    if (have[3]) *l3 = size[3], n++;
    return n;
}

int hostcpu_caches_from_cpuid(int64_t *l1d, int64_t *l2, int64_t *l3)
{
#if HOSTCPU_X86
    hostcpu_cpuid c;
    char vendor[16], model[64];
    if (hostcpu_read_cpuid(&c, vendor, model) < 0) return 0;
    unsigned leaf;
    if (target_vendor_amd(vendor)) {
        if (!(c.ext1_ecx & E1C_TOPOEXT) ||
            (unsigned)__get_cpuid_max(0x80000000u, NULL) < 0x8000001du)
            return 0;
        leaf = 0x8000001du;
    } else {
        if ((unsigned)__get_cpuid_max(0, NULL) < 4) return 0;
        leaf = 4;
    }
    int n = 0;
    bool have[4] = {false};
    for (unsigned sub = 0; sub < 16; sub++) {
        unsigned a, b, cx, d;
        __cpuid_count(leaf, sub, a, b, cx, d);
        unsigned type = a & 0x1f, level = (a >> 5) & 7;
        if (type == 0) break;                                             /* no more caches */
        if (type == 2 || level < 1 || level > 3 || have[level]) continue; /* instruction */
        int64_t ways = ((b >> 22) & 0x3ff) + 1, parts = ((b >> 12) & 0x3ff) + 1;
        int64_t line = (b & 0xfff) + 1, sets = (int64_t)cx + 1;
        int64_t bytes = ways * parts * line * sets;
        have[level] = true;
        n++;
        if (level == 1)
            *l1d = bytes;
        else if (level == 2)
            *l2 = bytes;
        else
            *l3 = bytes;
    }
    return n;
#else
    (void)l1d, (void)l2, (void)l3;
    return 0;
#endif
}

void hostcpu_caches_sanitize(int64_t *l1d, int64_t *l2, int64_t *l3)
{
    if (*l1d <= 0) *l1d = FALLBACK_L1D;
    if (*l2 <= *l1d) *l2 = *l1d * 2 > FALLBACK_L2 ? *l1d * 2 : FALLBACK_L2;
    if (*l3 < *l2) *l3 = *l2; /* no L3 (or a per-core slice smaller than L2): L2 is the LLC */
}

int hostcpu_physical_cores(const char *root, const int *cpus, int n)
{
    /* A core is represented by the first CPU of its sibling list; count distinct ones. */
    int reps[CPU_SETSIZE];
    int nrep = 0;
    for (int i = 0; i < n; i++) {
        char path[512], line[256];
        int rep = cpus[i];
        snprintf(path, sizeof path, "%s/cpu%d/topology/thread_siblings_list", root, cpus[i]);
        if (read_line(path, line, sizeof line) && isdigit((unsigned char)line[0])) rep = atoi(line);
        bool seen = false;
        for (int j = 0; j < nrep && !seen; j++)
            seen = reps[j] == rep;
        if (!seen && nrep < CPU_SETSIZE) reps[nrep++] = rep;
    }
    return nrep;
}

int target_omp_place_cpus(int *list, int cap)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    int places = omp_get_num_places(), ids[CPU_SETSIZE], n = 0;
    for (int p = 0; p < places; p++) {
        int k = omp_get_place_num_procs(p);
        if (k < 1 || k > CPU_SETSIZE) continue;
        omp_get_place_proc_ids(p, ids);
        for (int i = 0; i < k; i++)
            if (ids[i] >= 0 && ids[i] < CPU_SETSIZE) CPU_SET(ids[i], &set);
    }
    for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
        if (CPU_ISSET(c, &set)) list[n++] = c;
    return n;
}

/* Logical CPUs we may run on: where OpenMP has places (OMP_PLACES or OMP_PROC_BIND set, as
 * the README advises for timing), every place's CPUs, the set libgomp spreads its team over;
 * otherwise the affinity mask (what libgomp sizes its team by). Not the mask alone: with
 * places libgomp binds the initial thread to the first place at start-up, and a 2-CPU host
 * then read as 1 core and compiled single-threaded defaults. Bounded by the online count;
 * falls back to sysconf, then 1. */
static int usable_cpus(int *list, int cap)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int n = target_omp_place_cpus(list, cap);
    cpu_set_t set;
    if (n == 0 && sched_getaffinity(0, sizeof set, &set) == 0) {
        for (int c = 0; c < CPU_SETSIZE && n < cap; c++)
            if (CPU_ISSET(c, &set)) list[n++] = c;
    }
    if (n == 0) {
        long m = online > 0 ? online : 1;
        for (int c = 0; c < m && n < cap; c++)
            list[n++] = c;
    }
    if (online > 0 && n > online) n = (int)online;
    return n;
}

static int detect_freq_mhz(void)
{
    char line[256];
    if (read_line("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", line, sizeof line)) {
        long khz = atol(line);
        if (khz > 0) return (int)(khz / 1000);
    }
    /* VMs often lack cpufreq; /proc/cpuinfo then reports the nominal clock. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return 0;
    int mhz = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strncmp(line, "cpu MHz", 7)) {
            const char *colon = strchr(line, ':');
            if (colon) mhz = (int)atof(colon + 1);
            break;
        }
    }
    fclose(f);
    return mhz > 0 ? mhz : 0;
}

void hostcpu_detect(target_cpu_info *out)
{
    memset(out, 0, sizeof *out);
    hostcpu_cpuid c;
    bool x86 = hostcpu_read_cpuid(&c, out->vendor, out->model) == 0;
    if (x86) {
        out->isa = hostcpu_isa_from_cpuid(&c);
        out->x86_level = hostcpu_x86_level(&c);
        hostcpu_signature(&c, &out->family, &out->model_id, &out->stepping);
        uint32_t *w = out->cpuid_words;
        w[0] = c.leaf1_eax, w[1] = c.leaf1_ecx, w[2] = c.leaf1_edx;
        w[3] = c.leaf7_ebx, w[4] = c.leaf7_ecx, w[5] = c.leaf7_edx & ~L7D_MITIGATIONS;
        w[6] = c.leaf7s1_eax;
        w[7] = c.ext1_ecx, w[8] = c.ext1_edx, w[9] = (uint32_t)c.xcr0;
    }
    out->vector_lanes = target_isa_vector_lanes(out->isa);
    out->vector_registers = target_isa_vector_registers(out->isa);
    out->fma_units = 2;

    int cpus[CPU_SETSIZE];
    int n = usable_cpus(cpus, CPU_SETSIZE);
    out->cores = n;
    out->physical_cores = hostcpu_physical_cores("/sys/devices/system/cpu", cpus, n);
    if (out->physical_cores < 1 || out->physical_cores > n) out->physical_cores = n;

    int64_t l1 = 0, l2 = 0, l3 = 0;
    if (hostcpu_caches_from_sysfs("/sys/devices/system/cpu/cpu0/cache", &l1, &l2, &l3) < 2)
        hostcpu_caches_from_cpuid(&l1, &l2, &l3);
    hostcpu_caches_sanitize(&l1, &l2, &l3);
    out->l1d_bytes = l1, out->l2_bytes = l2, out->l3_bytes = l3;
    out->freq_mhz = detect_freq_mhz();

    /* With -march=native alone gcc may cap auto-vectorisation at 256 bits (its Intel server
     * tunings prefer that); the space builder plans for the full width, so ask for it. */
#if HOSTCPU_X86
    snprintf(out->cc_flags, sizeof out->cc_flags, "-march=native%s",
             (out->isa & TARGET_ISA_AVX512F) ? " -mprefer-vector-width=512" : "");
#elif defined(__aarch64__)
    out->vector_registers = 32; /* NEON v0-v31 */
    snprintf(out->cc_flags, sizeof out->cc_flags, "-mcpu=native");
#endif
}
