/* gpu_check.c — the CUDA code generator on a real GPU: every kernel checked against the
 * reference interpreter, then timed.
 *
 * For each workload (the headline shapes plus a small shape of every family) it generates the
 * default schedule and N sampled ones (fixed seeds), compiles them all with NVRTC for the
 * device's sm (in parallel, on all cores), then measures them one at a time with
 * measure_cuda (correctness against ir_interp_run_f64, then the median of timed runs). It
 * prints one table row for the default and one for the best sampled schedule, with how many
 * of the sampled kernels were ok / wrong / crashed / failed to load, and writes the table to
 * bench/results/gpu_check.md. Every kernel that is not OK has its source, schedule and
 * result written under bench/results/gpu_check_failures/ for debugging.
 *
 * Without a GPU (no driver, or cuInit fails) it exits 1 at once with a "no GPU" message.
 * Exit status: 0 when every kernel was OK, 1 when any was wrong, crashed, failed to load or
 * failed to compile (a code generator bug), 2 for bad usage.
 *
 * Usage: gpu_check [--random N] [--quick] [--out FILE] [--failures DIR]
 *                  [--compile-only [--target T]]
 *   --random N       sampled schedules per workload (default 8)
 *   --quick          only the small shapes, 4 sampled schedules each
 *   --compile-only   no GPU needed: generate and NVRTC-compile every kernel for target T
 *                    (default cuda:sm_90), report failures, measure nothing
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "compiler/codegen/codegen.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/toolchain/cuda_dl.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/util/util.h"
#include "proto/workload.h"

typedef struct {
    const char *name;
    const char *json;
    bool headline; /* large: skipped by --quick */
} check_case;

static const check_case cases[] = {
    {"dense 1024^3", "{\"op\":\"dense\",\"shape\":{\"M\":1024,\"N\":1024,\"K\":1024}}", true},
    {"BERT dense 128x3072x768 +bias+gelu",
     "{\"op\":\"dense\",\"shape\":{\"M\":128,\"N\":3072,\"K\":768},\"epilogue\":[\"bias_add\","
     "\"gelu\"]}",
     true},
    {"ResNet conv 1x64x56x56 F64 3x3 p1 +bias+relu",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":56,\"W\":56,\"F\":64,\"KH\":3,"
     "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
     true},
    {"MobileNet depthwise 1x144x56x56 3x3 s2",
     "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":144,\"H\":56,\"W\":56,\"KH\":3,"
     "\"KW\":3},\"pad\":[1,1],\"stride\":[2,2],\"epilogue\":[\"bias_add\",\"relu6\"]}",
     true},
    {"softmax 128x768", "{\"op\":\"softmax\",\"shape\":{\"R\":128,\"C\":768}}", true},
    {"layer_norm 128x768", "{\"op\":\"layer_norm\",\"shape\":{\"R\":128,\"C\":768}}", true},
    /* tensor cores (GPU_MMA): bf16/f16, aligned and odd shapes, NHWC and NCHW convs */
    {"dense 4096^3 bf16",
     "{\"op\":\"dense\",\"shape\":{\"M\":4096,\"N\":4096,\"K\":4096},\"dtype\":\"bfloat16\"}",
     true},
    {"mma dense 100x72x56 f16 tb +bias+gelu",
     "{\"op\":\"dense\",\"shape\":{\"M\":100,\"N\":72,\"K\":56},\"dtype\":\"float16\","
     "\"transpose_b\":true,\"epilogue\":[\"bias_add\",\"gelu\"]}",
     false},
    {"mma dense 37x21x45 bf16 (odd)",
     "{\"op\":\"dense\",\"shape\":{\"M\":37,\"N\":21,\"K\":45},\"dtype\":\"bfloat16\"}",
     false},
    {"mma batch_matmul 4x64x96x48 ta bf16",
     "{\"op\":\"batch_matmul\",\"shape\":{\"B\":4,\"M\":64,\"N\":96,\"K\":48},"
     "\"transpose_a\":true,\"dtype\":\"bfloat16\"}",
     false},
    {"mma conv NHWC 2x32x14x14 F48 3x3 p1 bf16 +bias+relu",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":32,\"H\":14,\"W\":14,\"F\":48,\"KH\":3,"
     "\"KW\":3},\"pad\":[1,1],\"layout\":\"NHWC\",\"dtype\":\"bfloat16\","
     "\"epilogue\":[\"bias_add\",\"relu\"]}",
     false},
    {"mma conv NCHW 1x16x15x15 F24 3x3 s2 f16",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":15,\"W\":15,\"F\":24,\"KH\":3,"
     "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"dtype\":\"float16\"}",
     false},
    /* small shapes of every family */
    {"dense 64x96x80 ta tb",
     "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":96,\"K\":80},\"transpose_a\":true,"
     "\"transpose_b\":true}",
     false},
    {"batch_matmul 4x64x96x48 tb",
     "{\"op\":\"batch_matmul\",\"shape\":{\"B\":4,\"M\":64,\"N\":96,\"K\":48},"
     "\"transpose_b\":true}",
     false},
    {"conv2d NCHW 1x16x14x14 F32 3x3 p1 +bias+relu",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":14,\"W\":14,\"F\":32,\"KH\":3,"
     "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
     false},
    {"conv2d NHWC s2 d2 g4",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":16,\"H\":15,\"W\":15,\"F\":32,\"KH\":3,"
     "\"KW\":3},\"stride\":[2,2],\"pad\":[2,2],\"dilation\":[2,2],\"groups\":4,"
     "\"layout\":\"NHWC\",\"epilogue\":[\"bias_add\",\"relu\"]}",
     false},
    {"depthwise NHWC 1x32x14x14",
     "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":32,\"H\":14,\"W\":14,\"KH\":3,"
     "\"KW\":3},\"pad\":[1,1],\"layout\":\"NHWC\"}",
     false},
    {"max_pool 2x16x28x28 3x3 s2 p1",
     "{\"op\":\"max_pool2d\",\"shape\":{\"N\":2,\"C\":16,\"H\":28,\"W\":28,\"KH\":3,\"KW\":3},"
     "\"stride\":[2,2],\"pad\":[1,1]}",
     false},
    {"avg_pool NHWC 2x16x28x28 2x2",
     "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":2,\"C\":16,\"H\":28,\"W\":28,\"KH\":2,\"KW\":2},"
     "\"layout\":\"NHWC\"}",
     false},
    {"global_avg_pool NCHW 4x64x7x7",
     "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":4,\"C\":64,\"H\":7,\"W\":7}}", false},
    {"global_avg_pool NHWC 4x64x7x7",
     "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":4,\"C\":64,\"H\":7,\"W\":7},"
     "\"layout\":\"NHWC\"}",
     false},
    {"rms_norm 64x512 +silu",
     "{\"op\":\"rms_norm\",\"shape\":{\"R\":64,\"C\":512},\"epilogue\":[\"silu\"]}", false},
    {"reduce_sum 96x300", "{\"op\":\"reduce_sum\",\"shape\":{\"R\":96,\"C\":300}}", false},
    {"reduce_mean 96x300", "{\"op\":\"reduce_mean\",\"shape\":{\"R\":96,\"C\":300}}", false},
    {"reduce_max 96x300", "{\"op\":\"reduce_max\",\"shape\":{\"R\":96,\"C\":300}}", false},
    {"elementwise 65536 mul,sigmoid,add,tanh",
     "{\"op\":\"elementwise\",\"shape\":{\"N\":65536},\"epilogue\":[\"mul\",\"sigmoid\","
     "\"add\",\"tanh\"]}",
     false},
    {"transpose 256x384", "{\"op\":\"transpose\",\"shape\":{\"R\":256,\"C\":384}}", false},
    {"dense 128x256x256 +residual",
     "{\"op\":\"dense\",\"shape\":{\"M\":128,\"N\":256,\"K\":256},\"epilogue\":[\"add\"]}", false},
};
#define N_CASES (int)(sizeof cases / sizeof cases[0])

/* One kernel: its schedule, source, binary and result. */
typedef struct {
    space_sched sched;
    cg_kernel k;
    tc_cubin c;
    int gen_rc, nvrtc_rc;
    char gen_msg[640];
    measure_result res;
    int measure_rc;
    char measure_msg[640];
} kernel_job;

typedef struct {
    const check_case *cc;
    ir_subgraph g;
    space sp;
    int build_rc;
    char build_msg[640];
    int n;
    kernel_job *jobs; /* [0] is the default schedule */
} case_run;

static void mkdir_p(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

/* Device 0's compute capability and a target string for it. */
static int device_target(const tc_cuda *cu, char *tgt, size_t cap, int *sm, char *devname,
                         size_t dcap)
{
    tc_cu_device dev;
    tlm_error err = {0};
    if (tc_cuda_check(cu, cu->device_get(&dev, 0), "cuDeviceGet", &err)) {
        fprintf(stderr, "gpu_check: %s\n", err.msg);
        return -1;
    }
    int major = 0, minor = 0;
    if (cu->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) ||
        cu->device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)) {
        fprintf(stderr, "gpu_check: cannot read the compute capability; assuming sm_90\n");
        major = 9, minor = 0;
    }
    *sm = major * 10 + minor;
    devname[0] = 0;
    cu->device_get_name(devname, (int)dcap, dev);
    /* A named part when we know it (its figures are exact), else the sm's representative. */
    static const struct {
        const char *needle, *target;
    } parts[] = {{"H200", "cuda:h200"}, {"H100", "cuda:h100"}, {"A100", "cuda:a100"},
                 {"A10", "cuda:a10"},   {"L4", "cuda:l4"},     {"4090", "cuda:rtx4090"},
                 {"T4", "cuda:t4"},     {"V100", "cuda:v100"}};
    target t;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (strstr(devname, parts[i].needle) && target_parse(parts[i].target, &t, NULL) == 0 &&
            target_sm(&t) == *sm) {
            snprintf(tgt, cap, "%s", parts[i].target);
            return 0;
        }
    snprintf(tgt, cap, "cuda:sm_%d", *sm);
    if (target_parse(tgt, &t, NULL) != 0) {
        fprintf(stderr, "gpu_check: no target descriptor for sm_%d; using cuda:sm_90\n", *sm);
        snprintf(tgt, cap, "cuda:sm_90");
    }
    return 0;
}

static void write_failure(const char *dir, const case_run *cr, int idx, const kernel_job *kj,
                          const char *why)
{
    mkdir_p(dir);
    char path[768];
    snprintf(path, sizeof path, "%s/case%02d_%s%02d.cu", dir, (int)(cr->cc - cases),
             idx == 0 ? "default" : "random", idx);
    FILE *f = fopen(path, "w");
    if (!f) return;
    char sched[2048];
    space_print(&cr->sp, &kj->sched, sched, sizeof sched);
    fprintf(f,
            "/* gpu_check failure: %s\n * workload: %s\n * schedule: %s\n * launch: grid %d %d %d "
            "block %d smem %d\n * %s */\n",
            cr->cc->name, cr->cc->json, sched, kj->k.grid[0], kj->k.grid[1], kj->k.grid[2],
            kj->k.block[0], kj->k.smem_bytes, why);
    if (kj->k.source) fputs(kj->k.source, f);
    if (kj->c.log && kj->nvrtc_rc) fprintf(f, "\n/* NVRTC log:\n%s\n*/\n", kj->c.log);
    fclose(f);
    fprintf(stderr, "  -> %s\n", path);
}

int main(int argc, char **argv)
{
    int n_random = 8;
    bool quick = false;
    const char *out_path = "bench/results/gpu_check.md";
    const char *fail_dir = "bench/results/gpu_check_failures";
    const char *compile_target = NULL;
    bool compile_only = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--random") == 0 && i + 1 < argc)
            n_random = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out_path = argv[++i];
        else if (strcmp(argv[i], "--failures") == 0 && i + 1 < argc)
            fail_dir = argv[++i];
        else if (strcmp(argv[i], "--compile-only") == 0)
            compile_only = true;
        else if (strcmp(argv[i], "--target") == 0 && i + 1 < argc)
            compile_target = argv[++i];
        else {
            fprintf(stderr, "usage: gpu_check [--random N] [--quick] [--out FILE] [--failures DIR] "
                            "[--compile-only [--target T]]\n");
            return 2;
        }
    }
    if (n_random < 0 || n_random > 1000) {
        fprintf(stderr, "gpu_check: --random must be in 0..1000\n");
        return 2;
    }
    if (quick && n_random > 4) n_random = 4;

    tlm_error err = {0};
    const tc_cuda *cu = NULL;
    char tgt_name[64], devname[128] = "no device (compile only)";
    int dev_sm = 90;
    if (!compile_only) {
        if (tc_cuda_get(&cu, &err) != 0) {
            fprintf(stderr, "gpu_check: no GPU: %s\n", err.msg);
            return 1;
        }
        if (device_target(cu, tgt_name, sizeof tgt_name, &dev_sm, devname, sizeof devname))
            return 1;
    } else {
        snprintf(tgt_name, sizeof tgt_name, "%s", compile_target ? compile_target : "cuda:sm_90");
    }
    if (tc_nvrtc_available(&err) != 0) {
        fprintf(stderr, "gpu_check: NVRTC unavailable: %s\n", err.msg);
        return 1;
    }
    target tgt;
    if (target_parse(tgt_name, &tgt, &err) != 0 || tgt.kind != TARGET_CUDA) {
        fprintf(stderr, "gpu_check: target %s: %s\n", tgt_name,
                err.msg[0] ? err.msg : "not a CUDA target");
        return 2;
    }
    if (compile_only) dev_sm = target_sm(&tgt);
    int sm = dev_sm;
    printf("gpu_check: %s (sm_%d), target %s, driver %d, %s\n", devname, dev_sm, tgt.name,
           cu ? cu->driver_version : 0, tc_nvrtc_identity());

    /* ---- generate and compile everything, in parallel ---- */
    double t0 = tlm_now_s();
    case_run *runs = calloc(N_CASES, sizeof *runs);
    if (!runs) return 1;
    int n_runs = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        if (quick && cases[ci].headline) continue;
        case_run *cr = &runs[n_runs++];
        cr->cc = &cases[ci];
        ir_workload w;
        tlm_error e = {0};
        cr->build_rc = proto_workload_from_string(cr->cc->json, strlen(cr->cc->json), &w, &e);
        if (!cr->build_rc) cr->build_rc = ir_subgraph_build(&w, &cr->g, &e);
        if (!cr->build_rc) cr->build_rc = space_build(&cr->g, &tgt, &cr->sp, &e);
        if (cr->build_rc) {
            snprintf(cr->build_msg, sizeof cr->build_msg, "%s: %s", e.field, e.msg);
            continue;
        }
        cr->n = 1 + n_random;
        cr->jobs = calloc((size_t)cr->n, sizeof *cr->jobs);
        if (!cr->jobs) return 1;
        space_default(&cr->sp, &cr->jobs[0].sched);
        for (int i = 1; i < cr->n; i++) {
            uint64_t rng = 0x9E3779B97F4A7C15ull ^ ((uint64_t)ci << 32) ^ (uint64_t)i;
            space_sample(&cr->sp, &rng, &cr->jobs[i].sched);
        }
    }
    int total = 0;
    for (int r = 0; r < n_runs; r++)
        total += runs[r].n;
    /* flat list of (run, job) for the parallel loop */
    int *flat_r = malloc(sizeof(int) * (size_t)(total + 1));
    int *flat_j = malloc(sizeof(int) * (size_t)(total + 1));
    int nf = 0;
    for (int r = 0; r < n_runs; r++)
        for (int j = 0; j < runs[r].n; j++)
            flat_r[nf] = r, flat_j[nf] = j, nf++;
#pragma omp parallel for schedule(dynamic, 1)
    for (int f = 0; f < nf; f++) {
        case_run *cr = &runs[flat_r[f]];
        kernel_job *kj = &cr->jobs[flat_j[f]];
        tlm_error e = {0};
        kj->gen_rc = cg_generate_cuda(&cr->sp, &kj->sched, NULL, &kj->k, &e);
        if (kj->gen_rc) {
            snprintf(kj->gen_msg, sizeof kj->gen_msg, "generate: %s %s", e.field, e.msg);
            continue;
        }
        kj->nvrtc_rc = tc_nvrtc_compile(kj->k.source, kj->k.entry, sm, &kj->c, &e);
        if (kj->nvrtc_rc == TLM_EUNSUPPORTED) {
            snprintf(kj->gen_msg, sizeof kj->gen_msg, "nvrtc cannot target sm_%d: %s", sm, e.msg);
        } else if (kj->nvrtc_rc) {
            snprintf(kj->gen_msg, sizeof kj->gen_msg, "nvrtc: %s", e.msg);
        }
    }
    printf("generated and compiled %d kernels in %.1f s\n", nf, tlm_now_s() - t0);
    if (compile_only) {
        int failed = 0;
        for (int r = 0; r < n_runs; r++) {
            case_run *cr = &runs[r];
            if (cr->build_rc) {
                fprintf(stderr, "%s: %s\n", cr->cc->name, cr->build_msg);
                failed++;
                continue;
            }
            int regs_max = 0, spills = 0;
            for (int j = 0; j < cr->n; j++) {
                kernel_job *kj = &cr->jobs[j];
                if (kj->gen_rc || kj->nvrtc_rc) {
                    fprintf(stderr, "%s #%d: %s\n", cr->cc->name, j, kj->gen_msg);
                    write_failure(fail_dir, cr, j, kj, kj->gen_msg);
                    failed++;
                    continue;
                }
                if (kj->c.regs > regs_max) regs_max = kj->c.regs;
                if (kj->c.spill_stores > 0) spills++;
            }
            printf("  %-45s %d kernels, max %d regs, %d spilling\n", cr->cc->name, cr->n, regs_max,
                   spills);
        }
        printf("%d kernel(s) failed to generate or compile\n", failed);
        return failed ? 1 : 0;
    }

    /* ---- measure, one kernel at a time ---- */
    measure_opts mo;
    measure_opts_init(&mo);
    mo.seed = 1234;
    int bad = 0;
    double t1 = tlm_now_s();
    for (int r = 0; r < n_runs; r++) {
        case_run *cr = &runs[r];
        if (cr->build_rc) {
            fprintf(stderr, "%s: %s\n", cr->cc->name, cr->build_msg);
            bad++;
            continue;
        }
        for (int j = 0; j < cr->n; j++) {
            kernel_job *kj = &cr->jobs[j];
            if (kj->gen_rc || kj->nvrtc_rc) {
                fprintf(stderr, "%s #%d: %s\n", cr->cc->name, j, kj->gen_msg);
                write_failure(fail_dir, cr, j, kj, kj->gen_msg);
                bad++;
                continue;
            }
            measure_launch ml;
            for (int d = 0; d < 3; d++) {
                ml.grid[d] = (unsigned)kj->k.grid[d];
                ml.block[d] = (unsigned)kj->k.block[d];
            }
            ml.smem = (unsigned)kj->k.smem_bytes;
            tlm_error e = {0};
            kj->measure_rc =
                measure_cuda(&cr->g, kj->c.data, kj->c.size, kj->c.entry, &ml, &mo, &kj->res, &e);
            if (kj->measure_rc) {
                snprintf(kj->measure_msg, sizeof kj->measure_msg, "measure: %s", e.msg);
                fprintf(stderr, "%s #%d: %s\n", cr->cc->name, j, kj->measure_msg);
                write_failure(fail_dir, cr, j, kj, kj->measure_msg);
                bad++;
            } else if (kj->res.status != MEASURE_OK) {
                char why[400];
                snprintf(why, sizeof why, "%s: rel_err %g; %s", measure_status_name(kj->res.status),
                         kj->res.rel_err, kj->res.detail);
                fprintf(stderr, "%s #%d: %s\n", cr->cc->name, j, why);
                write_failure(fail_dir, cr, j, kj, why);
                bad++;
            }
        }
        printf("  measured %s\n", cr->cc->name);
        fflush(stdout);
    }
    printf("measured in %.1f s\n", tlm_now_s() - t1);

    /* ---- table ---- */
    FILE *md = NULL;
    {
        char dir[512];
        snprintf(dir, sizeof dir, "%s", out_path);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            mkdir_p(dir);
        }
        md = fopen(out_path, "w");
        if (!md) fprintf(stderr, "gpu_check: cannot write %s: %s\n", out_path, strerror(errno));
    }
    char hdr[512];
    snprintf(hdr, sizeof hdr,
             "# gpu_check: %s (sm_%d), target %s\n\n%s; %d sampled schedules per workload; "
             "times are medians of measure_cuda (warm cache).\n\n",
             devname, dev_sm, tgt.name, tc_nvrtc_identity(), n_random);
    printf("\n%s", hdr);
    if (md) fputs(hdr, md);
    const char *th = "| workload | schedule | status | rel_err | median us | GFLOP/s | regs | "
                     "smem B | sampled ok/wrong/crash/other |\n"
                     "|---|---|---|---|---|---|---|---|---|\n";
    printf("%s", th);
    if (md) fputs(th, md);
    for (int r = 0; r < n_runs; r++) {
        case_run *cr = &runs[r];
        if (cr->build_rc) continue;
        int cnt[4] = {0};
        int best = -1;
        for (int j = 1; j < cr->n; j++) {
            kernel_job *kj = &cr->jobs[j];
            int st = kj->gen_rc || kj->nvrtc_rc || kj->measure_rc ? -1 : kj->res.status;
            if (st == MEASURE_OK)
                cnt[0]++;
            else if (st == MEASURE_WRONG)
                cnt[1]++;
            else if (st == MEASURE_CRASH)
                cnt[2]++;
            else
                cnt[3]++;
            if (st == MEASURE_OK && (best < 0 || kj->res.median_s < cr->jobs[best].res.median_s))
                best = j;
        }
        for (int row = 0; row < 2; row++) {
            int j = row == 0 ? 0 : best;
            char line[1024];
            if (j < 0) {
                snprintf(line, sizeof line,
                         "| %s | best of %d sampled | none ok | | | | | | %d/%d/%d/%d |\n",
                         cr->cc->name, cr->n - 1, cnt[0], cnt[1], cnt[2], cnt[3]);
            } else {
                kernel_job *kj = &cr->jobs[j];
                bool ran = !kj->gen_rc && !kj->nvrtc_rc && !kj->measure_rc;
                const char *st = !ran ? (kj->gen_rc     ? "gen_error"
                                         : kj->nvrtc_rc ? "nvrtc_error"
                                                        : "measure_error")
                                      : measure_status_name(kj->res.status);
                char cnts[64] = "";
                if (row == 1)
                    snprintf(cnts, sizeof cnts, "%d/%d/%d/%d", cnt[0], cnt[1], cnt[2], cnt[3]);
                char sched_label[48];
                if (row == 0)
                    snprintf(sched_label, sizeof sched_label, "default");
                else
                    snprintf(sched_label, sizeof sched_label, "best of %d sampled (#%d)", cr->n - 1,
                             j);
                snprintf(line, sizeof line,
                         "| %s | %s | %s | %.2g | %.1f | %.1f | %d | %d | %s |\n", cr->cc->name,
                         sched_label, st, ran ? kj->res.rel_err : -1.0,
                         ran ? kj->res.median_s * 1e6 : 0.0, ran ? kj->res.gflops : 0.0, kj->c.regs,
                         kj->k.smem_bytes, cnts);
            }
            printf("%s", line);
            if (md) fputs(line, md);
        }
    }
    /* the best schedules, so a rerun or a tuner can start from them */
    if (md) {
        fprintf(md, "\nBest sampled schedules:\n\n");
        for (int r = 0; r < n_runs; r++) {
            case_run *cr = &runs[r];
            if (cr->build_rc) continue;
            int best = -1;
            for (int j = 1; j < cr->n; j++)
                if (!cr->jobs[j].gen_rc && !cr->jobs[j].nvrtc_rc && !cr->jobs[j].measure_rc &&
                    cr->jobs[j].res.status == MEASURE_OK &&
                    (best < 0 || cr->jobs[j].res.median_s < cr->jobs[best].res.median_s))
                    best = j;
            if (best < 0) continue;
            char sched[2048];
            space_print(&cr->sp, &cr->jobs[best].sched, sched, sizeof sched);
            fprintf(md, "- %s: `%s`\n", cr->cc->name, sched);
        }
        fprintf(md, "\n%d kernel(s) not OK%s\n", bad,
                bad ? " (sources under the failures directory)" : "");
        fclose(md);
    }
    printf("\n%d kernel(s) not OK; table in %s\n", bad, out_path);
    for (int r = 0; r < n_runs; r++) {
        for (int j = 0; j < runs[r].n; j++) {
            cg_kernel_free(&runs[r].jobs[j].k);
            tc_cubin_free(&runs[r].jobs[j].c);
        }
        free(runs[r].jobs);
    }
    free(runs);
    free(flat_r);
    free(flat_j);
    return bad ? 1 : 0;
}
