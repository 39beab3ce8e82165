/* target.h — hardware descriptors: what the space builder, the prompt, codegen and the
 * toolchain need to know about the machine a kernel is for, and the target hash.
 *
 * Contract:
 *  - Target strings (canonical spelling, lowercase; parsing ignores case):
 *      cpu            this host, detected once (cpuid + sysfs), compiled with -march=native
 *      cpu:avx2       generic x86-64-v3 (avx2+fma, 8 float lanes, 16 vector registers)
 *      cpu:avx512     generic x86-64-v4 (avx512f+bw+vl, 16 float lanes, 32 vector registers)
 *      cuda:sm_70 … cuda:sm_90   a compute capability, with a representative part's figures
 *                     (sm_70→v100, sm_75→t4, sm_80→a100, sm_86→a10, sm_89→l4, sm_90→h100)
 *      cuda:v100 cuda:t4 cuda:a100 cuda:a10 cuda:l4 cuda:rtx4090 cuda:h100 cuda:h200
 *    Named CPU targets take the host's core count, caches and clock: they say "this machine's
 *    sizes, restricted to a portable ISA level". Anything else (including bare "cuda") is
 *    refused with TLM_EUNSUPPORTED, field "target", and a message listing every accepted name;
 *    NULL or "" is TLM_EINVAL. The named CPU targets are refused on a non-x86 host (the
 *    system cc cannot emit x86 code there). A target that compiles here need not run here:
 *    see target_host_can_run.
 *  - Target hash = SHA-256 of target_canonical(): "tlm-target-v1\n" then key=value lines
 *    in a fixed order. It covers every field that may shape a schedule or the emitted
 *    binary, and nothing cosmetic:
 *      CPU:  kind, ISA bits, vector lanes and registers, logical and physical cores, L1d/L2/L3,
 *            FMA units, cc flags; for the host target (-march=native) also its cpuid
 *            identity (vendor, family/model/stepping, raw feature words less the
 *            microcode-dependent mitigation bits, XCR0), because -march=native means
 *            "whatever this chip has" and a .so built on one CPU model must never be served
 *            to another. Not the brand string (covered by the identity) nor the clock (it
 *            moves with governors and boost; it only feeds peak estimates).
 *      CUDA: sm, SM count, all shared-memory / register / thread / warp / block limits, L2,
 *            memory bandwidth and peak throughputs (they set the roofline balance the
 *            heuristics and tuners choose tiles by). Not the name or part label.
 *    Hence equal descriptors hash equal whatever the spelling (cuda:sm_90 == cuda:h100), and
 *    distinct hardware differs (cuda:h100 != cuda:h200: bandwidth). Identical cluster nodes
 *    share hashes, so they share cached kernels.
 *  - Thread safety: everything here may be called from any thread. Host detection runs once
 *    (pthread_once); its result is immutable afterwards.
 */
#ifndef TLM_TARGET_H
#define TLM_TARGET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "compiler/util/err.h"

#define TARGET_NAME_MAX 32
#define TARGET_HASH_HEX 65
#define TARGET_CANONICAL_MAX 1024 /* target_canonical() never needs more */

typedef enum { TARGET_CPU = 1, TARGET_CUDA = 2 } target_kind;

/* ISA bits: set only when the CPU has the feature AND the OS saves its register state. */
enum {
    TARGET_ISA_SSE42 = 1u << 0,
    TARGET_ISA_AVX = 1u << 1,
    TARGET_ISA_AVX2 = 1u << 2,
    TARGET_ISA_FMA = 1u << 3,
    TARGET_ISA_AVX512F = 1u << 4,
    TARGET_ISA_AVX512BW = 1u << 5,
    TARGET_ISA_AVX512VL = 1u << 6,
    TARGET_ISA_AVX512_VNNI = 1u << 7,
    TARGET_ISA_AVX512_BF16 = 1u << 8,
    TARGET_ISA_COUNT = 9
};

typedef struct target_cpu_info {
    uint32_t isa;         /* TARGET_ISA_* */
    int vector_lanes;     /* float32 lanes of the widest usable vector: 4, 8 or 16 */
    int vector_registers; /* architectural vector registers: 16, or 32 with AVX-512 */
    int x86_level;        /* x86-64 psABI level 1..4 (x86-64-v3 = avx2 class), 0 if not x86 */
    int cores;            /* logical CPUs this process may use (online, narrowed by affinity:
                             what OpenMP uses by default) */
    int physical_cores;   /* distinct cores among them (SMT siblings counted once), <= cores */
    int64_t l1d_bytes;    /* per core */
    int64_t l2_bytes;     /* per core */
    int64_t l3_bytes;     /* last-level cache seen by one core; equals l2 if there is no L3 */
    int fma_units;        /* FMA pipes per core, assumed 2 (peak estimate input) */
    int freq_mhz;         /* max clock if known, else 0; informational */
    char cc_flags[96];    /* -march/-m flags for the C compiler */
    /* Identity (the host; zero for named targets). */
    char vendor[16]; /* "GenuineIntel", "AuthenticAMD", ... */
    char model[64];  /* brand string */
    int family, model_id, stepping;
    uint32_t cpuid_words[10]; /* raw feature words + XCR0: what -march=native sees */
} target_cpu_info;

typedef struct target_gpu_info {
    int sm;           /* compute capability as major*10+minor: 90 */
    char part[16];    /* whose figures these are: "h100" */
    char product[32]; /* "H100 SXM5": the datasheet the figures come from */
    int sm_count;
    int smem_per_block;       /* default static limit, 48 KiB */
    int smem_per_block_optin; /* max dynamic shared memory with the opt-in attribute */
    int smem_per_sm;
    int regs_per_sm;           /* 32-bit registers */
    int max_regs_per_thread;   /* 255 */
    int max_threads_per_block; /* 1024 */
    int warp_size;             /* 32 */
    int max_warps_per_sm;
    int max_threads_per_sm;
    int max_blocks_per_sm;
    int64_t l2_bytes;
    double mem_bandwidth_gbs;       /* GB/s, datasheet */
    double peak_fp32_tflops;        /* non-tensor FP32, dense */
    double peak_fp16_tensor_tflops; /* dense, FP32 accumulate */
    double peak_bf16_tensor_tflops; /* dense, FP32 accumulate; 0 if unsupported (< sm_80) */
} target_gpu_info;

typedef struct target {
    target_kind kind;
    char name[TARGET_NAME_MAX]; /* canonical spelling: "cpu:avx2", "cuda:h200" */
    target_cpu_info cpu;        /* kind == TARGET_CPU, else zero */
    target_gpu_info gpu;        /* kind == TARGET_CUDA, else zero */
} target;

/* Parses a target string into *out (fully overwritten on success, untouched on failure). */
int target_parse(const char *s, target *out, tlm_error *err);

/* The detected host (the descriptor of target "cpu"). Never NULL. */
const target_cpu_info *target_host_cpu(void);

/* Whether a CPU vendor string ("AuthenticAMD", ...) names AMD's cores: AMD, or Hygon (Zen
 * cores under another name) */
bool target_vendor_amd(const char *vendor);

/* The logical CPUs of this process's OpenMP places (OMP_PLACES, or OMP_PROC_BIND's default
 * places), ascending, into list[0..cap): the set libgomp spreads its team over. Returns how
 * many; 0 when OpenMP has no places (its threads unbound: the affinity mask is the set). Not a
 * thread's mask: with places libgomp binds the initial thread, and the threads it starts
 * later inherit that, to the first place at start-up. */
int target_omp_place_cpus(int *list, int cap);

/* Fills names[0..min(cap,n)) with the canonical names (static strings) in a stable order;
 * returns n, the total count. target_list(NULL, 0) just counts. */
int target_list(const char **names, int cap);

/* Canonical serialisation (see the contract); returns its length or a negative code. */
int target_canonical(const target *t, char *buf, size_t cap);
int target_hash(const target *t, uint8_t out[32]);
int target_hash_hex(const target *t, char out[TARGET_HASH_HEX]);

/* JSON object for GET /v1/targets and compile answers; the caller owns the reference. NULL for
 * a target without a valid kind, or on allocation failure. Keys: name, kind ("cpu"|"cuda"),
 * hash; CPU: isa [names], x86_level, vector_lanes, vector_registers, cores, physical_cores,
 * cache {l1d,l2,l3} (bytes), fma_units, freq_mhz, peak_gflops_f32, cc_flags, vendor, model;
 * CUDA: sm, arch ("sm_90"), part, product, sm_count, shared_memory {per_block,
 * per_block_optin, per_sm}, registers_per_sm, max_registers_per_thread,
 * max_threads_per_block, warp_size, max_warps_per_sm, max_threads_per_sm, max_blocks_per_sm,
 * l2_bytes, memory_bandwidth_gbs, peak_fp32_tflops, peak_fp16_tensor_tflops,
 * peak_bf16_tensor_tflops. */
json_t *target_to_json(const target *t);

/* Flags for `cc` (CPU targets), "" for CUDA. Points into *t. */
const char *target_cc_flags(const target *t);
/* Compute capability for NVRTC's --gpu-architecture=sm_XX (CUDA), 0 for CPU targets. */
int target_sm(const target *t);

/* Float32 lanes and vector register count implied by a set of ISA bits. */
int target_isa_vector_lanes(uint32_t isa);
int target_isa_vector_registers(uint32_t isa);
/* Lowercase ISA name ("avx512_vnni") of one TARGET_ISA_* bit, NULL if not a single known bit. */
const char *target_isa_name(uint32_t bit);

/* Peak FP32 GFLOP/s estimate: physical_cores * fma_units * lanes * 2 * GHz; 0 if the clock is
 * unknown. An upper bound: it ignores AVX-512 down-clocking and double-pumped units. */
double target_cpu_peak_gflops(const target_cpu_info *c);

/* True if kernels for t can run on this machine: a CPU target whose ISA the host has. CUDA
 * targets: false here (the measure module checks the device it opens). */
bool target_host_can_run(const target *t);

#endif
