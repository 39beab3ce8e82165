/* hostcpu.h — host CPU detection behind target_host_cpu(); internal to compiler/target.
 *
 * Contract: hostcpu_detect fills a target_cpu_info for this machine and never fails: every
 * probe has a fallback (sysfs → cpuid → fixed conservative sizes; affinity → sysconf → 1).
 * The pieces are split out as pure functions over raw cpuid words and a sysfs root so tests
 * can feed synthetic machines (a CPU that has AVX-512 but an OS that does not save ZMM state,
 * an SMT topology, a missing L3) without owning one.
 */
#ifndef TLM_TARGET_HOSTCPU_H
#define TLM_TARGET_HOSTCPU_H

#include <stdint.h>

#include "compiler/target/target.h"

/* The cpuid words detection reads. Zero when the leaf does not exist. */
typedef struct hostcpu_cpuid {
    uint32_t leaf1_eax, leaf1_ecx, leaf1_edx; /* signature, features */
    uint32_t leaf7_ebx, leaf7_ecx, leaf7_edx; /* leaf 7 subleaf 0 */
    uint32_t leaf7s1_eax;                     /* leaf 7 subleaf 1 (avx512_bf16) */
    uint32_t ext1_ecx, ext1_edx;              /* 0x80000001 */
    uint64_t xcr0;                            /* XGETBV(0); 0 when OSXSAVE is clear */
} hostcpu_cpuid;

/* Reads the words, vendor (12 chars) and brand string. TLM_EUNSUPPORTED on non-x86. */
int hostcpu_read_cpuid(hostcpu_cpuid *c, char vendor[16], char model[64]);

/* TARGET_ISA_* bits usable by user code: the feature bit and, for AVX and AVX-512, the OS
 * state bits in XCR0 (SSE+YMM; plus opmask, ZMM_Hi256, Hi16_ZMM). */
uint32_t hostcpu_isa_from_cpuid(const hostcpu_cpuid *c);
/* x86-64 psABI micro-architecture level 1..4 the words satisfy (0 if not even v1 data). */
int hostcpu_x86_level(const hostcpu_cpuid *c);
/* Family, model and stepping decoded from leaf1_eax (extended fields folded in). */
void hostcpu_signature(const hostcpu_cpuid *c, int *family, int *model, int *stepping);

/* "32K" / "1024K" / "2M" / "65536" → bytes; -1 if malformed. */
int64_t hostcpu_parse_size(const char *s);
/* Reads dir/indexN/{level,type,size} (dir like /sys/devices/system/cpu/cpu0/cache). Sets each
 * level it finds (L1 data or unified only) and leaves the others untouched; returns how many
 * of the three it found. */
int hostcpu_caches_from_sysfs(const char *dir, int64_t *l1d, int64_t *l2, int64_t *l3);
/* Deterministic cache parameters: cpuid leaf 4 (Intel) or 0x8000001D (AMD). Same return. */
int hostcpu_caches_from_cpuid(int64_t *l1d, int64_t *l2, int64_t *l3);
/* Makes the sizes usable: l1d > 0, l2 > l1d, l3 >= l2 (l3 = l2 when there is no L3). */
void hostcpu_caches_sanitize(int64_t *l1d, int64_t *l2, int64_t *l3);

/* Distinct physical cores among the CPUs listed in cpus[0..n), from
 * root/cpuN/topology/thread_siblings_list (root like /sys/devices/system/cpu). A CPU whose
 * topology is unreadable counts as its own core. */
int hostcpu_physical_cores(const char *root, const int *cpus, int n);

void hostcpu_detect(target_cpu_info *out);

#endif
