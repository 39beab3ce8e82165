/* gpu_peers.c — our CUDA kernels against cuBLAS on this machine's GPU: fp32 (CUDA cores, the
 * GPU_TILE sketch) and bf16 (tensor cores, GPU_MMA) on a 4096^3 GEMM and a ResNet 3x3 conv.
 *
 * For each case: the default schedule and N sampled ones are generated, NVRTC-compiled (in
 * parallel) and measured with measure_cuda (checked against the reference, then the median of
 * timed runs, warm cache). The peer is cuBLAS, dlopen'ed (never linked): cublasSgemm for
 * fp32 (CUBLAS_DEFAULT_MATH: no TF32) and cublasGemmEx with bf16 operands and fp32 compute
 * for bf16 (cuBLAS runs cuBLASLt's tensor-core kernels there). A conv's peer is cuBLAS on the
 * GEMM of the same size (M = N*OH*OW, N = F, K = C*KH*KW): what an implicit-GEMM conv is
 * measured against when cuDNN is not at hand; it is not cuDNN. Times are medians of event-timed
 * runs. Output: a markdown table on stdout and in --out (default bench/results/gpu_peers.md).
 *
 * Without a GPU it exits 1 at once with "no GPU"; without libcublas the peer columns say so.
 * Usage: gpu_peers [--random N] [--out FILE]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/codegen/codegen.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/toolchain/cuda_dl.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/util/util.h"
#include "proto/workload.h"

typedef struct {
    const char *name, *json;
    int64_t m, n, k; /* the GEMM the peer runs */
    bool bf16;
} peer_case;

static const peer_case cases[] = {
    {"dense 4096^3 fp32", "{\"op\":\"dense\",\"shape\":{\"M\":4096,\"N\":4096,\"K\":4096}}", 4096,
     4096, 4096, false},
    {"dense 4096^3 bf16",
     "{\"op\":\"dense\",\"shape\":{\"M\":4096,\"N\":4096,\"K\":4096},\"dtype\":\"bfloat16\"}", 4096,
     4096, 4096, true},
    {"ResNet conv 8x64x56x56 F64 3x3 p1 fp32 NCHW",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":8,\"C\":64,\"H\":56,\"W\":56,\"F\":64,\"KH\":3,\"KW\":3},"
     "\"pad\":[1,1]}",
     8 * 56 * 56, 64, 64 * 9, false},
    {"ResNet conv 8x64x56x56 F64 3x3 p1 bf16 NHWC",
     "{\"op\":\"conv2d\",\"shape\":{\"N\":8,\"C\":64,\"H\":56,\"W\":56,\"F\":64,\"KH\":3,\"KW\":3},"
     "\"pad\":[1,1],\"layout\":\"NHWC\",\"dtype\":\"bfloat16\"}",
     8 * 56 * 56, 64, 64 * 9, true},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- cuBLAS through dlopen (the constants are cuBLAS's stable enum values) ---- */
typedef int (*cublas_create_fn)(void **);
typedef int (*cublas_destroy_fn)(void *);
typedef int (*cublas_sgemm_fn)(void *, int, int, int, int, int, const float *, const float *, int,
                               const float *, int, const float *, float *, int);
typedef int (*cublas_gemmex_fn)(void *, int, int, int, int, int, const void *, const void *, int,
                                int, const void *, int, int, const void *, void *, int, int, int,
                                int);
enum { OP_N = 0, R_32F = 0, R_16BF = 14, COMPUTE_32F = 68, GEMM_DEFAULT_TENSOR_OP = 99 };

typedef struct {
    void *h, *handle;
    cublas_sgemm_fn sgemm;
    cublas_gemmex_fn gemmex;
    cublas_destroy_fn destroy;
} cublas;

static int cublas_open(cublas *cb, char *why, size_t cap)
{
    static const char *const names[] = {"libcublas.so", "libcublas.so.13", "libcublas.so.12",
                                        "libcublas.so.11"};
    memset(cb, 0, sizeof *cb);
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !cb->h; i++)
        cb->h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!cb->h) {
        snprintf(why, cap, "no libcublas: %s", dlerror());
        return -1;
    }
    cublas_create_fn create = (cublas_create_fn)dlsym(cb->h, "cublasCreate_v2");
    cb->destroy = (cublas_destroy_fn)dlsym(cb->h, "cublasDestroy_v2");
    cb->sgemm = (cublas_sgemm_fn)dlsym(cb->h, "cublasSgemm_v2");
    cb->gemmex = (cublas_gemmex_fn)dlsym(cb->h, "cublasGemmEx");
    if (!create || !cb->destroy || !cb->sgemm || !cb->gemmex || create(&cb->handle) != 0) {
        snprintf(why, cap, "libcublas lacks a symbol or cublasCreate failed");
        return -1;
    }
    return 0;
}

/* Median ms of `reps` timed cuBLAS calls of case c (after warm-up); < 0 on failure. */
static double cublas_time(const tc_cuda *cu, cublas *cb, const peer_case *c, int reps)
{
    size_t es = c->bf16 ? 2 : 4;
    tc_cu_deviceptr a, b, o;
    if (cu->mem_alloc(&a, (size_t)(c->m * c->k) * es) || cu->mem_alloc(&b, (size_t)(c->k * c->n) * es) ||
        cu->mem_alloc(&o, (size_t)(c->m * c->n) * 4))
        return -1;
    cu->memset_d8(a, 0x3c, (size_t)(c->m * c->k) * es); /* small finite values in both types */
    cu->memset_d8(b, 0x3c, (size_t)(c->k * c->n) * es);
    float one = 1, zero = 0;
    /* row-major out[M][N] = A[M][K] B[K][N] is column-major out^T = B^T A^T */
    int m = (int)c->n, n = (int)c->m, k = (int)c->k;
    double *t = calloc((size_t)reps, sizeof *t);
    tc_cu_event e0, e1;
    cu->event_create(&e0, 0);
    cu->event_create(&e1, 0);
    int rc = 0;
    for (int r = -3; r < reps && rc == 0; r++) {
        cu->event_record(e0, NULL);
        if (c->bf16)
            rc = cb->gemmex(cb->handle, OP_N, OP_N, m, n, k, &one, (void *)b, R_16BF, m, (void *)a,
                            R_16BF, k, &zero, (void *)o, R_32F, m, COMPUTE_32F,
                            GEMM_DEFAULT_TENSOR_OP);
        else
            rc = cb->sgemm(cb->handle, OP_N, OP_N, m, n, k, &one, (const float *)b, m,
                           (const float *)a, k, &zero, (float *)o, m);
        cu->event_record(e1, NULL);
        cu->event_synchronize(e1);
        float ms = 0;
        cu->event_elapsed_time(&ms, e0, e1);
        if (r >= 0) t[r] = ms;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: reps is small */
        for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    double med = rc == 0 ? t[reps / 2] : -1;
    free(t);
    cu->mem_free(a), cu->mem_free(b), cu->mem_free(o);
    cu->event_destroy(e0), cu->event_destroy(e1);
    return med;
}

typedef struct {
    space_sched sched;
    cg_kernel k;
    tc_cubin c;
    int rc;
    double ms; /* < 0: failed */
    int regs, spills;
} our_kernel;

int main(int argc, char **argv)
{
    int n_random = 8;
    const char *out_path = "bench/results/gpu_peers.md";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--random") == 0 && i + 1 < argc) n_random = atoi(argv[++i]);
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc) out_path = argv[++i];
        else {
            fprintf(stderr, "usage: gpu_peers [--random N] [--out FILE]\n");
            return 2;
        }
    }
    if (n_random < 0 || n_random > 64) n_random = 8;
    tlm_error err = {0};
    const tc_cuda *cu;
    if (tc_cuda_get(&cu, &err) != 0) {
        fprintf(stderr, "gpu_peers: no GPU: %s\n", err.msg);
        return 1;
    }
    tc_cu_device dev;
    tc_cu_context ctx;
    int major = 9, minor = 0;
    char devname[128] = "?";
    if (cu->device_get(&dev, 0) || cu->primary_ctx_retain(&ctx, dev) || cu->ctx_set_current(ctx)) {
        fprintf(stderr, "gpu_peers: no GPU: cannot open device 0\n");
        return 1;
    }
    cu->device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    cu->device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    cu->device_get_name(devname, sizeof devname, dev);
    int sm = major * 10 + minor;
    char tgt_name[32];
    snprintf(tgt_name, sizeof tgt_name, "cuda:sm_%d", sm);
    target tgt;
    if (target_parse(tgt_name, &tgt, &err) != 0) {
        fprintf(stderr, "gpu_peers: %s\n", err.msg);
        return 1;
    }
    cublas cb;
    char cb_why[256] = "";
    bool have_cb = cublas_open(&cb, cb_why, sizeof cb_why) == 0;

    FILE *out = fopen(out_path, "w");
    FILE *fs[2] = {stdout, out};
    for (int f = 0; f < 2; f++) {
        if (!fs[f]) continue;
        fprintf(fs[f], "# tlmd CUDA kernels vs cuBLAS — %s (sm_%d)\n\n", devname, sm);
        fprintf(fs[f], "Ours: default schedule and best of %d sampled (measure_cuda medians, checked "
                       "against the reference). Peer: cuBLAS %s. Conv peers run the equal-size "
                       "GEMM (not cuDNN).\n\n",
                n_random, have_cb ? "(dlopen'ed)" : cb_why);
        fprintf(fs[f], "| case | ours default ms | ours best ms | regs/spill (default) | cuBLAS ms "
                       "| default/cuBLAS | best/cuBLAS | TFLOP/s best |\n|---|---|---|---|---|---|---|---|\n");
    }
    int bad = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        const peer_case *pc = &cases[ci];
        ir_workload w;
        ir_subgraph *g = calloc(1, sizeof *g);
        space *sp = calloc(1, sizeof *sp);
        tlm_error e = {0};
        if (proto_workload_from_string(pc->json, strlen(pc->json), &w, &e) ||
            ir_subgraph_build(&w, g, &e) || space_build(g, &tgt, sp, &e)) {
            fprintf(stderr, "%s: %s %s\n", pc->name, e.field, e.msg);
            bad++;
            continue;
        }
        int n = 1 + n_random;
        our_kernel *ks = calloc((size_t)n, sizeof *ks);
        space_default(sp, &ks[0].sched);
        for (int i = 1; i < n; i++) {
            uint64_t rng = 0xC0FFEEull * (uint64_t)(ci + 1) + (uint64_t)i;
            space_sample(sp, &rng, &ks[i].sched);
        }
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < n; i++) {
            tlm_error ee = {0};
            ks[i].rc = cg_generate_cuda(sp, &ks[i].sched, NULL, &ks[i].k, &ee);
            if (!ks[i].rc) ks[i].rc = tc_nvrtc_compile(ks[i].k.source, ks[i].k.entry, sm, &ks[i].c, &ee);
        }
        measure_opts mo;
        measure_opts_init(&mo);
        mo.seed = 77;
        double best = -1;
        for (int i = 0; i < n; i++) {
            ks[i].ms = -1;
            if (ks[i].rc) {
                bad++;
                continue;
            }
            measure_launch ml;
            for (int d = 0; d < 3; d++) {
                ml.grid[d] = (unsigned)ks[i].k.grid[d];
                ml.block[d] = (unsigned)ks[i].k.block[d];
            }
            ml.smem = (unsigned)ks[i].k.smem_bytes;
            measure_result res;
            tlm_error ee = {0};
            int rc = measure_cuda(g, ks[i].c.data, ks[i].c.size, ks[i].c.entry, &ml, &mo, &res, &ee);
            if (rc || res.status != MEASURE_OK) {
                char sched[1024];
                space_print(sp, &ks[i].sched, sched, sizeof sched);
                fprintf(stderr, "%s [%s]: %s %s (rel_err %g)\n", pc->name, sched,
                        rc ? ee.msg : measure_status_name(res.status), rc ? "" : res.detail,
                        rc ? 0.0 : res.rel_err);
                bad++;
                continue;
            }
            ks[i].ms = res.median_s * 1e3;
            if (best < 0 || ks[i].ms < best) best = ks[i].ms;
        }
        double peer = have_cb ? cublas_time(cu, &cb, pc, 20) : -1;
        double flops = 2.0 * (double)pc->m * (double)pc->n * (double)pc->k;
        for (int f = 0; f < 2; f++) {
            if (!fs[f]) continue;
            fprintf(fs[f], "| %s | %.3f | %.3f | %d/%d | ", pc->name, ks[0].ms, best, ks[0].c.regs,
                    ks[0].c.spill_stores);
            if (peer > 0 && ks[0].ms > 0 && best > 0)
                fprintf(fs[f], "%.3f | %.2fx | %.2fx | %.1f |\n", peer, peer / ks[0].ms, peer / best,
                        flops / (best * 1e-3) / 1e12);
            else
                fprintf(fs[f], "%s | | | %.1f |\n", peer > 0 ? "ours failed" : "n/a",
                        best > 0 ? flops / (best * 1e-3) / 1e12 : 0.0);
            fflush(fs[f]);
        }
        for (int i = 0; i < n; i++) {
            cg_kernel_free(&ks[i].k);
            tc_cubin_free(&ks[i].c);
        }
        free(ks);
        free(g);
        free(sp);
    }
    if (out) {
        fprintf(out, "\nRatios are cuBLAS time / our time (1.00x = as fast as cuBLAS). Targets of "
                     "issue 16: fp32 >= 0.8x, bf16 >= 0.7x.\n");
        fclose(out);
    }
    if (have_cb) cb.destroy(cb.handle);
    return bad ? 1 : 0;
}
