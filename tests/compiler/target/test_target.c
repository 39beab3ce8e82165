/* Tests for compiler/target: host detection (against /proc/cpuinfo and sysfs as independent
 * oracles, and on synthetic cpuid words / sysfs trees), target parsing and refusals, the
 * target hash (golden value, aliases, sensitivity), JSON, and the GPU table's consistency. */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/target/hostcpu.h"
#include "compiler/target/target.h"

/* ---- helpers ---- */

static target parse_ok(const char *s)
{
    target t;
    tlm_error err = {0};
    int rc = target_parse(s, &t, &err);
    cr_assert_eq(rc, 0, "target_parse(%s): %s", s, err.msg);
    return t;
}

static void hex_of(const char *s, char out[TARGET_HASH_HEX])
{
    target t = parse_ok(s);
    cr_assert_eq(target_hash_hex(&t, out), 0);
}

static void hex_t(const target *t, char out[TARGET_HASH_HEX])
{
    cr_assert_eq(target_hash_hex(t, out), 0);
}

static int popcount(uint32_t x)
{
    return __builtin_popcount(x);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "open %s", path);
    fputs(text, f);
    fclose(f);
}

static void mkdirs(const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p == '/') {
            *p = 0;
            mkdir(buf, 0700);
            *p = '/';
        }
    }
    mkdir(buf, 0700);
}

static void make_tmpdir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/tlm-target-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void rm_rf(const char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- host detection ---- */

Test(host, sane)
{
    const target_cpu_info *h = target_host_cpu();
    cr_assert_not_null(h);
    cr_assert_geq(h->cores, 1);
    cr_assert(h->physical_cores >= 1 && h->physical_cores <= h->cores);
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online > 0) cr_assert_leq(h->cores, online);

    /* Vector width follows the flags exactly. */
    if (h->isa & TARGET_ISA_AVX512F) {
        cr_assert_eq(h->vector_lanes, 16);
        cr_assert_eq(h->vector_registers, 32);
    } else if (h->isa & TARGET_ISA_AVX) {
        cr_assert_eq(h->vector_lanes, 8);
        cr_assert_eq(h->vector_registers, 16);
    } else {
        cr_assert_eq(h->vector_lanes, 4);
    }
    /* Implications that hold on every real chip and that our XCR0 gating must preserve. */
    if (h->isa & TARGET_ISA_AVX2) cr_assert(h->isa & TARGET_ISA_AVX);
    if (h->isa & TARGET_ISA_FMA) cr_assert(h->isa & TARGET_ISA_AVX);
    uint32_t sub512 =
        TARGET_ISA_AVX512BW | TARGET_ISA_AVX512VL | TARGET_ISA_AVX512_VNNI | TARGET_ISA_AVX512_BF16;
    if (h->isa & sub512) cr_assert(h->isa & TARGET_ISA_AVX512F);
    if (h->x86_level >= 3)
        cr_assert_eq(h->isa & (TARGET_ISA_AVX2 | TARGET_ISA_FMA), TARGET_ISA_AVX2 | TARGET_ISA_FMA);
    if (h->x86_level >= 4) cr_assert(h->isa & TARGET_ISA_AVX512VL);

    cr_assert_gt(h->l1d_bytes, 0);
    cr_assert_lt(h->l1d_bytes, h->l2_bytes);
    cr_assert_leq(h->l2_bytes, h->l3_bytes);
    cr_assert_eq(h->fma_units, 2);
#if defined(__x86_64__)
    cr_assert_geq(h->x86_level, 1);
    cr_assert_neq(h->vendor[0], 0);
    cr_assert_not_null(strstr(h->cc_flags, "-march=native"));
    cr_assert_eq(strstr(h->cc_flags, "-mprefer-vector-width=512") != NULL,
                 (h->isa & TARGET_ISA_AVX512F) != 0);
#endif
}

/* /proc/cpuinfo "flags" is the kernel's view (it clears AVX features whose state XSAVE does
 * not manage), an oracle independent of our cpuid decoding. */
Test(host, isa_matches_proc_cpuinfo)
{
#if !defined(__x86_64__)
    cr_skip_test("x86 only");
#endif
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) cr_skip_test("no /proc/cpuinfo");
    char *line = NULL;
    size_t cap = 0;
    char *flags = NULL;
    while (getline(&line, &cap, f) > 0) {
        if (!strncmp(line, "flags", 5)) {
            flags = strdup(strchr(line, ':') + 1);
            break;
        }
    }
    free(line);
    fclose(f);
    cr_assert_not_null(flags);
    flags[strcspn(flags, "\n")] = 0;

    static const struct {
        uint32_t bit;
        const char *proc;
    } map[] = {
        {TARGET_ISA_SSE42, "sse4_2"},
        {TARGET_ISA_AVX, "avx"},
        {TARGET_ISA_AVX2, "avx2"},
        {TARGET_ISA_FMA, "fma"},
        {TARGET_ISA_AVX512F, "avx512f"},
        {TARGET_ISA_AVX512BW, "avx512bw"},
        {TARGET_ISA_AVX512VL, "avx512vl"},
        {TARGET_ISA_AVX512_VNNI, "avx512_vnni"},
        {TARGET_ISA_AVX512_BF16, "avx512_bf16"},
    };
    const target_cpu_info *h = target_host_cpu();
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, " %s ", map[i].proc);
        char padded[4096];
        snprintf(padded, sizeof padded, " %s ", flags);
        bool in_proc = strstr(padded, needle) != NULL;
        cr_expect_eq(in_proc, (h->isa & map[i].bit) != 0, "%s: /proc says %d, we say %d",
                     map[i].proc, in_proc, (h->isa & map[i].bit) != 0);
    }
    free(flags);
}

Test(host, caches_agree_with_sysfs_and_cpuid)
{
    const target_cpu_info *h = target_host_cpu();
    int64_t l1 = 0, l2 = 0, l3 = 0;
    int n = hostcpu_caches_from_sysfs("/sys/devices/system/cpu/cpu0/cache", &l1, &l2, &l3);
    if (n >= 2) {
        hostcpu_caches_sanitize(&l1, &l2, &l3);
        cr_assert_eq(h->l1d_bytes, l1);
        cr_assert_eq(h->l2_bytes, l2);
        cr_assert_eq(h->l3_bytes, l3);
    }
    int64_t c1 = 0, c2 = 0, c3 = 0;
    int m = hostcpu_caches_from_cpuid(&c1, &c2, &c3);
    /* The kernel fills sysfs from the same cpuid leaves, so when both exist they agree. */
    if (n >= 2 && m >= 2) {
        cr_expect_eq(c1, l1);
        cr_expect_eq(c2, l2);
    }
    if (n < 2 && m < 2) cr_log_warn("no cache information on this host: fallbacks in use");
}

static void *host_thread(void *arg)
{
    (void)arg;
    return (void *)target_host_cpu();
}

Test(host, detected_once_and_thread_safe)
{
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, host_thread, NULL), 0);
    void *first = NULL;
    for (int i = 0; i < 8; i++) {
        void *p;
        pthread_join(th[i], &p);
        if (!first) first = p;
        cr_assert_eq(p, first);
    }
    cr_assert_eq((const void *)target_host_cpu(), first);
    /* Two parses of "cpu" are the same descriptor. */
    target a = parse_ok("cpu"), b = parse_ok("cpu");
    cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
}

/* ---- synthetic cpuid words ---- */

/* An AVX-512 server (Sapphire-Rapids-like) with an OS that saves all state. */
static hostcpu_cpuid full_avx512(void)
{
    hostcpu_cpuid c = {0};
    c.leaf1_eax = 0x000806f8;
    c.leaf1_edx = 1u << 26; /* sse2 */
    c.leaf1_ecx = (1u << 0) | (1u << 9) | (1u << 12) | (1u << 13) | (1u << 19) | (1u << 20) |
                  (1u << 22) | (1u << 23) | (1u << 27) | (1u << 28) | (1u << 29);
    c.leaf7_ebx = (1u << 3) | (1u << 5) | (1u << 8) | (1u << 16) | (1u << 17) | (1u << 28) |
                  (1u << 30) | (1u << 31);
    c.leaf7_ecx = 1u << 11;             /* avx512_vnni */
    c.leaf7s1_eax = 1u << 5;            /* avx512_bf16 */
    c.ext1_ecx = (1u << 0) | (1u << 5); /* lahf, lzcnt */
    c.xcr0 = 0xe7;
    return c;
}

Test(cpuid, isa_decoding_respects_os_state)
{
    hostcpu_cpuid c = full_avx512();
    uint32_t all = (1u << TARGET_ISA_COUNT) - 1;
    cr_assert_eq(hostcpu_isa_from_cpuid(&c), all);

    /* The CPU has AVX-512 but the OS does not save ZMM/opmask state: AVX2 class only. */
    c.xcr0 = 0x7;
    cr_assert_eq(hostcpu_isa_from_cpuid(&c),
                 TARGET_ISA_SSE42 | TARGET_ISA_AVX | TARGET_ISA_AVX2 | TARGET_ISA_FMA);
    /* No OSXSAVE: no AVX of any kind, even with a stale xcr0 value. */
    c = full_avx512();
    c.leaf1_ecx &= ~(1u << 27);
    cr_assert_eq(hostcpu_isa_from_cpuid(&c), TARGET_ISA_SSE42);
    /* YMM state missing. */
    c = full_avx512();
    c.xcr0 = 0x3;
    cr_assert_eq(hostcpu_isa_from_cpuid(&c), TARGET_ISA_SSE42);
    /* Knights-Landing-like: avx512f without bw/vl. */
    c = full_avx512();
    c.leaf7_ebx &= ~((1u << 30) | (1u << 31));
    c.leaf7_ecx = 0;
    c.leaf7s1_eax = 0;
    uint32_t isa = hostcpu_isa_from_cpuid(&c);
    cr_assert(isa & TARGET_ISA_AVX512F);
    cr_assert_eq(isa & (TARGET_ISA_AVX512BW | TARGET_ISA_AVX512VL), 0);
    cr_assert_eq(target_isa_vector_lanes(isa), 16);
}

Test(cpuid, x86_levels)
{
    hostcpu_cpuid c = full_avx512();
    cr_assert_eq(hostcpu_x86_level(&c), 4);
    c.leaf7_ebx &= ~(1u << 28); /* no avx512cd: v4 needs it */
    cr_assert_eq(hostcpu_x86_level(&c), 3);
    c = full_avx512();
    c.xcr0 = 0x7;
    cr_assert_eq(hostcpu_x86_level(&c), 3);
    c.leaf7_ebx &= ~(1u << 8); /* no bmi2 */
    cr_assert_eq(hostcpu_x86_level(&c), 2);
    c.ext1_ecx = 0; /* no lahf in 64-bit mode */
    cr_assert_eq(hostcpu_x86_level(&c), 1);
    c.leaf1_edx = 0;
    cr_assert_eq(hostcpu_x86_level(&c), 0);
}

Test(cpuid, signature)
{
    hostcpu_cpuid c = {0};
    int fam, mod, step;
    c.leaf1_eax = 0x00a10f11; /* AMD Zen 4 (Genoa) */
    hostcpu_signature(&c, &fam, &mod, &step);
    cr_assert(fam == 25 && mod == 17 && step == 1, "%d %d %d", fam, mod, step);
    c.leaf1_eax = 0x00050654; /* Intel Skylake-SP */
    hostcpu_signature(&c, &fam, &mod, &step);
    cr_assert(fam == 6 && mod == 0x55 && step == 4, "%d %d %d", fam, mod, step);
}

Test(cpuid, isa_helpers)
{
    cr_assert_eq(target_isa_vector_lanes(0), 4);
    cr_assert_eq(target_isa_vector_lanes(TARGET_ISA_SSE42 | TARGET_ISA_AVX), 8);
    cr_assert_eq(target_isa_vector_lanes(TARGET_ISA_AVX | TARGET_ISA_AVX2), 8);
    cr_assert_eq(target_isa_vector_lanes(TARGET_ISA_AVX512F | TARGET_ISA_AVX), 16);
    cr_assert_eq(target_isa_vector_registers(TARGET_ISA_AVX2), 16);
    cr_assert_eq(target_isa_vector_registers(TARGET_ISA_AVX512F), 32);
    cr_assert_str_eq(target_isa_name(TARGET_ISA_AVX512_VNNI), "avx512_vnni");
    cr_assert_str_eq(target_isa_name(TARGET_ISA_SSE42), "sse4.2");
    cr_assert_null(target_isa_name(0));
    cr_assert_null(target_isa_name(TARGET_ISA_AVX | TARGET_ISA_AVX2));
    cr_assert_null(target_isa_name(1u << TARGET_ISA_COUNT));

    target_cpu_info c = {0};
    c.physical_cores = 4, c.fma_units = 2, c.vector_lanes = 16, c.freq_mhz = 2000;
    cr_assert_float_eq(target_cpu_peak_gflops(&c), 4 * 2 * 16 * 2 * 2.0, 1e-9);
    c.freq_mhz = 0;
    cr_assert_eq(target_cpu_peak_gflops(&c), 0.0);
}

/* ---- synthetic sysfs ---- */

Test(sysfs, parse_size)
{
    cr_assert_eq(hostcpu_parse_size("32K"), 32768);
    cr_assert_eq(hostcpu_parse_size("1024K"), 1048576);
    cr_assert_eq(hostcpu_parse_size("2M"), 2097152);
    cr_assert_eq(hostcpu_parse_size("65536"), 65536);
    cr_assert_eq(hostcpu_parse_size("32K\n"), 32768);
    cr_assert_eq(hostcpu_parse_size(""), -1);
    cr_assert_eq(hostcpu_parse_size("K"), -1);
    cr_assert_eq(hostcpu_parse_size("12Q"), -1);
    cr_assert_eq(hostcpu_parse_size("-4K"), -1);
    cr_assert_eq(hostcpu_parse_size(NULL), -1);
}

static void fake_cache(const char *dir, int idx, const char *level, const char *type,
                       const char *size)
{
    char p[512];
    snprintf(p, sizeof p, "%s/index%d", dir, idx);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/index%d/level", dir, idx);
    write_file(p, level);
    snprintf(p, sizeof p, "%s/index%d/type", dir, idx);
    write_file(p, type);
    snprintf(p, sizeof p, "%s/index%d/size", dir, idx);
    write_file(p, size);
}

Test(sysfs, caches_full_and_gappy)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    /* Instruction cache first and larger: must not be taken for L1d. */
    fake_cache(dir, 0, "1\n", "Instruction\n", "64K\n");
    fake_cache(dir, 1, "1\n", "Data\n", "48K\n");
    fake_cache(dir, 2, "2\n", "Unified\n", "2048K\n");
    fake_cache(dir, 5, "3\n", "Unified\n", "36M\n"); /* after a gap in the index numbers */
    int64_t l1 = -1, l2 = -1, l3 = -1;
    cr_assert_eq(hostcpu_caches_from_sysfs(dir, &l1, &l2, &l3), 3);
    cr_assert_eq(l1, 48 * 1024);
    cr_assert_eq(l2, 2048 * 1024);
    cr_assert_eq(l3, 36 * 1024 * 1024);
    rm_rf(dir);
}

Test(sysfs, caches_missing_l3_and_garbage)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    fake_cache(dir, 0, "1\n", "Data\n", "32K\n");
    fake_cache(dir, 1, "2\n", "Unified\n", "256K\n");
    fake_cache(dir, 2, "3\n", "Unified\n", "lots\n"); /* unparsable: ignored */
    int64_t l1 = 0, l2 = 0, l3 = 0;
    cr_assert_eq(hostcpu_caches_from_sysfs(dir, &l1, &l2, &l3), 2);
    cr_assert_eq(l3, 0);
    hostcpu_caches_sanitize(&l1, &l2, &l3);
    cr_assert_eq(l1, 32 * 1024);
    cr_assert_eq(l2, 256 * 1024);
    cr_assert_eq(l3, l2);
    rm_rf(dir);

    cr_assert_eq(hostcpu_caches_from_sysfs("/nonexistent/tlm", &l1, &l2, &l3), 0);
}

Test(sysfs, sanitize)
{
    int64_t l1 = 0, l2 = 0, l3 = 0;
    hostcpu_caches_sanitize(&l1, &l2, &l3);
    cr_assert(l1 > 0 && l1 < l2 && l2 <= l3);
    l1 = 64 * 1024, l2 = 48 * 1024, l3 = 16 * 1024; /* nonsense order */
    hostcpu_caches_sanitize(&l1, &l2, &l3);
    cr_assert_eq(l1, 64 * 1024);
    cr_assert(l1 < l2 && l2 <= l3);
}

static void fake_siblings(const char *root, int cpu, const char *list)
{
    char p[512];
    snprintf(p, sizeof p, "%s/cpu%d/topology", root, cpu);
    mkdirs(p);
    snprintf(p, sizeof p, "%s/cpu%d/topology/thread_siblings_list", root, cpu);
    write_file(p, list);
}

Test(sysfs, physical_cores)
{
    char root[64];
    make_tmpdir(root, sizeof root);
    /* Two cores with two threads each, siblings interleaved as on Intel. */
    fake_siblings(root, 0, "0,2\n");
    fake_siblings(root, 1, "1,3\n");
    fake_siblings(root, 2, "0,2\n");
    fake_siblings(root, 3, "1,3\n");
    /* Range syntax, as on AMD. */
    fake_siblings(root, 4, "4-5\n");
    fake_siblings(root, 5, "4-5\n");
    int all[] = {0, 1, 2, 3, 4, 5};
    cr_assert_eq(hostcpu_physical_cores(root, all, 6), 3);
    int half[] = {0, 2}; /* an affinity mask holding both threads of one core */
    cr_assert_eq(hostcpu_physical_cores(root, half, 2), 1);
    int unknown[] = {0, 7, 8}; /* no topology for 7 and 8: each its own core */
    cr_assert_eq(hostcpu_physical_cores(root, unknown, 3), 3);
    rm_rf(root);
}

/* ---- parsing ---- */

Test(parse, every_listed_name)
{
    int n = target_list(NULL, 0);
    cr_assert_eq(n, 17);
    const char *names[32];
    cr_assert_eq(target_list(names, 32), n);
    const char *two[2] = {NULL, NULL};
    cr_assert_eq(target_list(two, 1), n);
    cr_assert_str_eq(two[0], "cpu");
    cr_assert_null(two[1]);

    for (int i = 0; i < n; i++) {
        target t = parse_ok(names[i]);
        cr_assert_str_eq(t.name, names[i]);
        bool cuda = !strncmp(names[i], "cuda:", 5);
        cr_assert_eq(t.kind, cuda ? TARGET_CUDA : TARGET_CPU, "%s", names[i]);
        if (cuda) {
            cr_assert_geq(target_sm(&t), 70);
            cr_assert_str_eq(target_cc_flags(&t), "");
            cr_assert_eq(t.cpu.cores, 0); /* the other half is zero */
        } else {
            cr_assert_eq(target_sm(&t), 0);
            cr_assert_neq(target_cc_flags(&t)[0], 0);
            cr_assert_eq(t.gpu.sm, 0);
        }
    }
}

Test(parse, case_insensitive_canonical_name)
{
    target t = parse_ok("CUDA:H200");
    cr_assert_str_eq(t.name, "cuda:h200");
    t = parse_ok("Cpu:AVX2");
    cr_assert_str_eq(t.name, "cpu:avx2");
}

Test(parse, cpu_named_targets)
{
    const target_cpu_info *h = target_host_cpu();
    target a = parse_ok("cpu:avx2");
    cr_assert_eq(a.cpu.vector_lanes, 8);
    cr_assert_eq(a.cpu.vector_registers, 16);
    cr_assert_eq(a.cpu.isa & (TARGET_ISA_AVX2 | TARGET_ISA_FMA), TARGET_ISA_AVX2 | TARGET_ISA_FMA);
    cr_assert_eq(a.cpu.isa & TARGET_ISA_AVX512F, 0);
    cr_assert_eq(a.cpu.x86_level, 3);
    cr_assert_not_null(strstr(a.cpu.cc_flags, "-march=x86-64-v3"));

    target b = parse_ok("cpu:avx512");
    uint32_t want = TARGET_ISA_AVX512F | TARGET_ISA_AVX512BW | TARGET_ISA_AVX512VL;
    cr_assert_eq(b.cpu.isa & want, want);
    cr_assert_eq(b.cpu.isa & (TARGET_ISA_AVX512_VNNI | TARGET_ISA_AVX512_BF16), 0);
    cr_assert_eq(b.cpu.vector_lanes, 16);
    cr_assert_eq(b.cpu.vector_registers, 32);
    cr_assert_eq(b.cpu.x86_level, 4);
    cr_assert_not_null(strstr(b.cpu.cc_flags, "-march=x86-64-v4"));

    for (int i = 0; i < 2; i++) {
        const target_cpu_info *c = i ? &b.cpu : &a.cpu;
        cr_assert_eq(c->cores, h->cores);
        cr_assert_eq(c->physical_cores, h->physical_cores);
        cr_assert_eq(c->l1d_bytes, h->l1d_bytes);
        cr_assert_eq(c->l2_bytes, h->l2_bytes);
        cr_assert_eq(c->l3_bytes, h->l3_bytes);
        cr_assert_eq(c->vendor[0], 0); /* no host identity in a portable target */
    }
}

Test(parse, host_can_run)
{
    const target_cpu_info *h = target_host_cpu();
    target t = parse_ok("cpu");
    cr_assert(target_host_can_run(&t));
    t = parse_ok("cuda:h200");
    cr_assert_not(target_host_can_run(&t));
    t = parse_ok("cpu:avx512");
    uint32_t need = TARGET_ISA_AVX512F | TARGET_ISA_AVX512BW | TARGET_ISA_AVX512VL;
    cr_assert_eq(target_host_can_run(&t), (h->isa & need) == need && h->x86_level >= 4);
    t = parse_ok("cpu:avx2");
    cr_assert_eq(target_host_can_run(&t), h->x86_level >= 3);
}

/* The flags must be ones the system compiler accepts (x86-64-vN needs gcc >= 11). */
Test(parse, cc_accepts_cpu_flags)
{
#if !defined(__x86_64__)
    cr_skip_test("x86 only");
#endif
    const char *cpus[] = {"cpu", "cpu:avx2", "cpu:avx512"};
    for (int i = 0; i < 3; i++) {
        target t = parse_ok(cpus[i]);
        char cmd[512];
        snprintf(cmd, sizeof cmd, "cc %s -x c -c /dev/null -o /dev/null 2>/dev/null",
                 target_cc_flags(&t));
        int rc = system(cmd);
        if (i == 0 && WIFEXITED(rc) && WEXITSTATUS(rc) == 127) cr_skip_test("no cc");
        cr_assert_eq(rc, 0, "cc rejected: %s", target_cc_flags(&t));
    }
}

Test(parse, refusals)
{
    const char *bad[] = {"cuda",
                         "cuda:",
                         "cuda:sm_87",
                         "cuda:sm_9",
                         "cuda:h200x",
                         "gpu",
                         "cpu:",
                         "cpu:avx",
                         "cpu:avx2 ",
                         " cpu",
                         "cuda:sm90",
                         "cuda:a100:extra",
                         "cpu:avx512cuda:h100h100h100h100h100h100h100h100"};
    const char *names[32];
    int n = target_list(names, 32);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        target t;
        memset(&t, 0x5a, sizeof t);
        target before = t;
        tlm_error err = {0};
        int rc = target_parse(bad[i], &t, &err);
        cr_assert_eq(rc, TLM_EUNSUPPORTED, "%s accepted", bad[i]);
        cr_assert_eq(err.code, rc);
        cr_assert_str_eq(err.field, "target");
        for (int k = 0; k < n; k++)
            cr_assert_not_null(strstr(err.msg, names[k]), "message for %s lacks %s: %s", bad[i],
                               names[k], err.msg);
        cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "out modified on failure");
    }
    tlm_error err = {0};
    target t;
    cr_assert_eq(target_parse(NULL, &t, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "target");
    cr_assert_eq(target_parse("", &t, &err), TLM_EINVAL);
    cr_assert_not_null(strstr(err.msg, "cuda:h200"));
    cr_assert_eq(target_parse("nope", &t, NULL), TLM_EUNSUPPORTED); /* err is optional */
    cr_assert_eq(target_parse("cuda", &t, &err), TLM_EUNSUPPORTED);
    cr_assert_not_null(strstr(err.msg, "architecture or a part"), "%s", err.msg);
}

/* ---- hash ---- */

/* Pins the canonical format: if this changes, every cached kernel's key changes. Bump
 * "tlm-target-v1" deliberately and update the value, never silently. */
#define GOLDEN_A100 "85d760217b2e07833aa4b5d808f35f3bf0aefb56855a8b995620b628c8998ccc"

Test(hash, golden_gpu)
{
    char hex[TARGET_HASH_HEX];
    hex_of("cuda:a100", hex);
    cr_assert_str_eq(hex, GOLDEN_A100);
    char buf[TARGET_CANONICAL_MAX];
    target t = parse_ok("cuda:a100");
    int len = target_canonical(&t, buf, sizeof buf);
    cr_assert_gt(len, 0);
    cr_assert_eq((size_t)len, strlen(buf));
    cr_assert_eq(strncmp(buf, "tlm-target-v1\nkind=cuda\nsm=80\nsm_count=108\n", 43), 0, "%s", buf);
}

Test(hash, format_and_agreement)
{
    target t = parse_ok("cpu");
    char hex[TARGET_HASH_HEX];
    uint8_t raw[32];
    memset(hex, 'X', sizeof hex);
    cr_assert_eq(target_hash_hex(&t, hex), 0);
    cr_assert_eq(target_hash(&t, raw), 0);
    cr_assert_eq(strlen(hex), 64);
    for (int i = 0; i < 32; i++) {
        char two[3];
        snprintf(two, sizeof two, "%02x", raw[i]);
        cr_assert_eq(strncmp(hex + 2 * i, two, 2), 0);
    }
    char again[TARGET_HASH_HEX];
    hex_of("cpu", again);
    cr_assert_str_eq(hex, again);
}

Test(hash, aliases_equal)
{
    static const char *pairs[][2] = {
        {"cuda:sm_70", "cuda:v100"}, {"cuda:sm_75", "cuda:t4"}, {"cuda:sm_80", "cuda:a100"},
        {"cuda:sm_86", "cuda:a10"},  {"cuda:sm_89", "cuda:l4"}, {"cuda:sm_90", "cuda:h100"},
        {"CUDA:H100", "cuda:h100"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char a[TARGET_HASH_HEX], b[TARGET_HASH_HEX];
        hex_of(pairs[i][0], a);
        hex_of(pairs[i][1], b);
        cr_assert_str_eq(a, b, "%s vs %s", pairs[i][0], pairs[i][1]);
    }
}

Test(hash, distinct_targets_differ)
{
    const char *names[32];
    int n = target_list(names, 32);
    char hex[32][TARGET_HASH_HEX];
    for (int i = 0; i < n; i++)
        hex_of(names[i], hex[i]);
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        bool dup = false;
        for (int j = 0; j < i; j++)
            dup = dup || !strcmp(hex[i], hex[j]);
        distinct += !dup;
    }
    /* 17 names, 6 of them generic sm_XX aliases of a part: 11 distinct descriptors. In
     * particular h100 != h200 (bandwidth) and the host differs from cpu:avx512 (identity). */
    cr_assert_eq(distinct, 11);
}

Test(hash, sensitive_to_code_fields_only)
{
    char base[TARGET_HASH_HEX], h[TARGET_HASH_HEX];
    target g = parse_ok("cuda:h100");
    hex_t(&g, base);
#define GPU_CHANGES(field, delta, should_differ)                                                   \
    do {                                                                                           \
        target m = g;                                                                              \
        m.gpu.field += delta;                                                                      \
        hex_t(&m, h);                                                                              \
        cr_assert_eq(strcmp(h, base) != 0, should_differ, "gpu." #field);                          \
    } while (0)
    GPU_CHANGES(sm, 1, true);
    GPU_CHANGES(sm_count, 1, true);
    GPU_CHANGES(smem_per_block, 1024, true);
    GPU_CHANGES(smem_per_block_optin, -1024, true);
    GPU_CHANGES(smem_per_sm, 1024, true);
    GPU_CHANGES(regs_per_sm, 1024, true);
    GPU_CHANGES(max_regs_per_thread, -1, true);
    GPU_CHANGES(max_threads_per_block, -512, true);
    GPU_CHANGES(max_threads_per_sm, -512, true);
    GPU_CHANGES(max_blocks_per_sm, -1, true);
    GPU_CHANGES(l2_bytes, 1 << 20, true);
    GPU_CHANGES(mem_bandwidth_gbs, 1.0, true);
    target m = g;
    snprintf(m.name, sizeof m.name, "cuda:renamed");
    snprintf(m.gpu.part, sizeof m.gpu.part, "other");
    snprintf(m.gpu.product, sizeof m.gpu.product, "Other");
    hex_t(&m, h);
    cr_assert_str_eq(h, base, "name and labels must not change the hash");

    target c = parse_ok("cpu:avx2");
    hex_t(&c, base);
#define CPU_CHANGES(field, delta, should_differ)                                                   \
    do {                                                                                           \
        target m2 = c;                                                                             \
        m2.cpu.field += delta;                                                                     \
        hex_t(&m2, h);                                                                             \
        cr_assert_eq(strcmp(h, base) != 0, should_differ, "cpu." #field);                          \
    } while (0)
    CPU_CHANGES(isa, TARGET_ISA_AVX512_VNNI, true);
    CPU_CHANGES(vector_lanes, 8, true);
    CPU_CHANGES(cores, 1, true);
    CPU_CHANGES(physical_cores, 1, true);
    CPU_CHANGES(l1d_bytes, 1024, true);
    CPU_CHANGES(l2_bytes, 1024, true);
    CPU_CHANGES(l3_bytes, 1024, true);
    CPU_CHANGES(freq_mhz, 100, false);
    target m3 = c;
    snprintf(m3.cpu.cc_flags, sizeof m3.cpu.cc_flags, "-march=haswell");
    hex_t(&m3, h);
    cr_assert_str_neq(h, base);
    m3 = c;
    snprintf(m3.cpu.model, sizeof m3.cpu.model, "Some Brand String");
    snprintf(m3.name, sizeof m3.name, "cpu:x");
    hex_t(&m3, h);
    cr_assert_str_eq(h, base);

    /* The host's identity words matter (another CPU model under -march=native). */
    target host = parse_ok("cpu");
    if (host.cpu.vendor[0]) {
        hex_t(&host, base);
        target m4 = host;
        m4.cpu.cpuid_words[3] ^= 1u << 2;
        hex_t(&m4, h);
        cr_assert_str_neq(h, base);
        m4 = host;
        m4.cpu.model_id += 1;
        hex_t(&m4, h);
        cr_assert_str_neq(h, base);
    }
}

Test(hash, canonical_limits)
{
    target t = parse_ok("cpu");
    char buf[TARGET_CANONICAL_MAX + 8];
    int len = target_canonical(&t, buf, TARGET_CANONICAL_MAX);
    cr_assert_gt(len, 0);
    cr_assert_lt(len, TARGET_CANONICAL_MAX);
    memset(buf, '#', sizeof buf);
    cr_assert_eq(target_canonical(&t, buf, 16), TLM_ELIMIT);
    for (size_t i = 16; i < sizeof buf; i++)
        cr_assert_eq(buf[i], '#', "wrote past cap");

    target z;
    memset(&z, 0, sizeof z); /* no kind */
    char hex[TARGET_HASH_HEX];
    cr_assert_lt(target_hash_hex(&z, hex), 0);
    cr_assert_null(target_to_json(&z));
    cr_assert_lt(target_canonical(NULL, buf, sizeof buf), 0);
}

/* ---- JSON ---- */

Test(json, cpu_keys)
{
    target t = parse_ok("cpu:avx512");
    json_t *o = target_to_json(&t);
    cr_assert_not_null(o);
    char hex[TARGET_HASH_HEX];
    hex_t(&t, hex);
    cr_assert_str_eq(json_string_value(json_object_get(o, "name")), "cpu:avx512");
    cr_assert_str_eq(json_string_value(json_object_get(o, "kind")), "cpu");
    cr_assert_str_eq(json_string_value(json_object_get(o, "hash")), hex);
    json_t *isa = json_object_get(o, "isa");
    cr_assert(json_is_array(isa));
    cr_assert_eq((int)json_array_size(isa), popcount(t.cpu.isa));
    cr_assert_str_eq(json_string_value(json_array_get(isa, 0)), "sse4.2");
    cr_assert_eq(json_integer_value(json_object_get(o, "vector_lanes")), 16);
    cr_assert_eq(json_integer_value(json_object_get(o, "vector_registers")), 32);
    cr_assert_eq(json_integer_value(json_object_get(o, "cores")), t.cpu.cores);
    cr_assert(json_is_integer(json_object_get(o, "physical_cores")));
    json_t *cache = json_object_get(o, "cache");
    cr_assert_eq(json_integer_value(json_object_get(cache, "l1d")), t.cpu.l1d_bytes);
    cr_assert_eq(json_integer_value(json_object_get(cache, "l2")), t.cpu.l2_bytes);
    cr_assert_eq(json_integer_value(json_object_get(cache, "l3")), t.cpu.l3_bytes);
    cr_assert_str_eq(json_string_value(json_object_get(o, "cc_flags")), t.cpu.cc_flags);
    cr_assert(json_is_number(json_object_get(o, "peak_gflops_f32")));
    cr_assert_eq(json_integer_value(json_object_get(o, "fma_units")), 2);
    cr_assert_null(json_object_get(o, "sm"));
    json_decref(o);
}

Test(json, cuda_keys)
{
    target t = parse_ok("cuda:sm_90");
    json_t *o = target_to_json(&t);
    cr_assert_not_null(o);
    cr_assert_str_eq(json_string_value(json_object_get(o, "name")), "cuda:sm_90");
    cr_assert_str_eq(json_string_value(json_object_get(o, "kind")), "cuda");
    cr_assert_str_eq(json_string_value(json_object_get(o, "arch")), "sm_90");
    cr_assert_str_eq(json_string_value(json_object_get(o, "part")), "h100");
    cr_assert_eq(json_integer_value(json_object_get(o, "sm")), 90);
    cr_assert_eq(json_integer_value(json_object_get(o, "sm_count")), 132);
    json_t *smem = json_object_get(o, "shared_memory");
    cr_assert_eq(json_integer_value(json_object_get(smem, "per_block")), 48 * 1024);
    cr_assert_eq(json_integer_value(json_object_get(smem, "per_block_optin")), 227 * 1024);
    cr_assert_eq(json_integer_value(json_object_get(smem, "per_sm")), 228 * 1024);
    const char *ints[] = {
        "registers_per_sm", "max_registers_per_thread", "max_threads_per_block", "warp_size",
        "max_warps_per_sm", "max_threads_per_sm",       "max_blocks_per_sm",     "l2_bytes"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        cr_assert_gt(json_integer_value(json_object_get(o, ints[i])), 0, "%s", ints[i]);
    const char *reals[] = {"memory_bandwidth_gbs", "peak_fp32_tflops", "peak_fp16_tensor_tflops",
                           "peak_bf16_tensor_tflops"};
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++)
        cr_assert_gt(json_number_value(json_object_get(o, reals[i])), 0, "%s", reals[i]);
    cr_assert_null(json_object_get(o, "cc_flags"));
    json_decref(o);
}

/* ---- GPU table ---- */

Test(gpu, table_consistency)
{
    const char *names[32];
    int n = target_list(names, 32), ngpu = 0;
    for (int i = 0; i < n; i++) {
        if (strncmp(names[i], "cuda:", 5)) continue;
        ngpu++;
        target t = parse_ok(names[i]);
        const target_gpu_info *g = &t.gpu;
        const char *nm = names[i];
        cr_assert(g->sm >= 70 && g->sm <= 90, "%s", nm);
        cr_assert_gt(g->sm_count, 0, "%s", nm);
        cr_assert_eq(g->smem_per_block, 48 * 1024, "%s", nm);
        cr_assert_leq(g->smem_per_block, g->smem_per_block_optin, "%s", nm);
        cr_assert_leq(g->smem_per_block_optin, g->smem_per_sm, "%s", nm);
        cr_assert_eq(g->max_threads_per_block, 1024, "%s", nm);
        cr_assert_leq(g->max_threads_per_block, g->max_threads_per_sm, "%s", nm);
        cr_assert_eq(g->warp_size, 32, "%s", nm);
        cr_assert_eq(g->max_warps_per_sm * g->warp_size, g->max_threads_per_sm, "%s", nm);
        cr_assert_eq(g->max_regs_per_thread, 255, "%s", nm);
        /* Full occupancy must be reachable at 32 registers per thread. */
        cr_assert_geq(g->regs_per_sm, g->max_threads_per_sm * 32, "%s", nm);
        cr_assert(g->max_blocks_per_sm >= 16 && g->max_blocks_per_sm <= 32, "%s", nm);
        cr_assert_gt(g->l2_bytes, 1 << 20, "%s", nm);
        cr_assert_gt(g->mem_bandwidth_gbs, 100, "%s", nm);
        cr_assert_gt(g->peak_fp32_tflops, 1, "%s", nm);
        cr_assert_gt(g->peak_fp16_tensor_tflops, g->peak_fp32_tflops, "%s", nm);
        cr_assert_eq(g->peak_bf16_tensor_tflops > 0, g->sm >= 80, "%s: bf16 from sm_80 on", nm);
        cr_assert_neq(g->part[0], 0, "%s", nm);
        cr_assert_neq(g->product[0], 0, "%s", nm);
        /* A generic name keeps its spelling and its own sm. */
        if (!strncmp(nm, "cuda:sm_", 8)) cr_assert_eq(g->sm, atoi(nm + 8), "%s", nm);
    }
    cr_assert_eq(ngpu, 14);
}

Test(gpu, datasheet_spot_checks)
{
    target t = parse_ok("cuda:h200");
    cr_assert_eq(t.gpu.sm, 90);
    cr_assert_eq(t.gpu.sm_count, 132);
    cr_assert_float_eq(t.gpu.mem_bandwidth_gbs, 4800, 1);
    t = parse_ok("cuda:h100");
    cr_assert_eq(t.gpu.sm_count, 132);
    cr_assert_float_eq(t.gpu.mem_bandwidth_gbs, 3350, 1);
    t = parse_ok("cuda:a100");
    cr_assert_eq(t.gpu.sm, 80);
    cr_assert_eq(t.gpu.sm_count, 108);
    cr_assert_eq(t.gpu.smem_per_block_optin, 163 * 1024);
    cr_assert_eq(t.gpu.smem_per_sm, 164 * 1024);
    t = parse_ok("cuda:rtx4090");
    cr_assert_eq(t.gpu.sm, 89);
    cr_assert_eq(t.gpu.sm_count, 128);
    cr_assert_eq(t.gpu.max_threads_per_sm, 1536);
    t = parse_ok("cuda:t4");
    cr_assert_eq(t.gpu.sm, 75);
    cr_assert_eq(t.gpu.max_threads_per_sm, 1024);
    cr_assert_eq(t.gpu.smem_per_sm, 64 * 1024);
    t = parse_ok("cuda:sm_86");
    cr_assert_str_eq(t.gpu.part, "a10");
    cr_assert_eq(target_sm(&t), 86);
}
