/* ab_kernels: times compiled kernels side by side in one process, alternating, so that a
 * shared machine's drifting memory bandwidth moves every candidate alike (the same GEMV took
 * 11.8 ms in one minute and 19.9 in another on the developers' VM; interleaved, old and new
 * kernels differ by what the code does).
 *
 *   ab_kernels SIZES KERNEL.so [KERNEL.so ...]
 *
 * SIZES: the element counts of the kernel's tensors, comma-separated, in its parameter order
 * (inputs, then the output: a dense M x N x K is M*K,K*N,M*N; with a bias, ...,N,M*N); each
 * KERNEL.so is a `tlm compile` output directory's kernel.so, called through
 * tlm_kernel_packed (e.g. the same workload compiled by two builds of tlm). Inputs are filled with
 * a fixed pattern. Every kernel is called once per round in the order given, REPS rounds (env,
 * default 11); prints each kernel's median and minimum in ms, and the largest difference of
 * its output from the first kernel's (the candidates must agree; each kernel runs once on the
 * inputs before the timing). COLD=MiB (env): calls rotate through copies of all the arguments
 * totalling at least that much (at least 3 and at most 64 copies, each kernel taking each in
 * turn), so each call's data comes from DRAM, e.g. COLD=1024 where a VM's L3 may be large.
 * KERNEL.so@pre: that kernel with its constant operands packed once (its tlm_kernel_prepack
 * entries, as a plan's params are; one packed copy per argument copy) and called through
 * tlm_kernel_prepacked; COLD_ARGS=MASK (env) rotates only those arguments' copies (bit i: the
 * i-th), the others staying warm; PRE_ARGS=MASK (env) packs only the
 * entries of those arguments (0x2: the weights, where a kernel also exports its input's pack,
 * which a plan packs per call), the others packed by each call. Threads: the kernels' own
 * OpenMP settings (OMP_NUM_THREADS, OMP_PROC_BIND). Built by `make build/bench/ab_kernels`
 * (`make bench` builds it too); not a benchmark of its own, so bench/run.sh does not call it. */
#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "compiler/codegen/codegen.h"

#define MAX_ARGS 16
#define MAX_KERNELS 32
#define MAX_REPS 1000
#define MAX_COPIES 64

typedef void (*kernel_fn)(void *const *args);

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int gcd_int(int a, int b)
{
    while (b) {
        const int t = a % b;
        a = b, b = t;
    }
    return a;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ab_kernels SIZES KERNEL.so [KERNEL.so ...] (REPS=n, COLD=MiB)\n");
        return 2;
    }
    size_t n[MAX_ARGS];
    int na = 0;
    for (char *p = argv[1]; *p && na < MAX_ARGS;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v <= 0) {
            fprintf(stderr, "ab_kernels: SIZES: '%s' is not a list of positive counts\n", argv[1]);
            return 2;
        }
        n[na++] = (size_t)v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            fprintf(stderr, "ab_kernels: SIZES: unexpected '%c'\n", *end);
            return 2;
        }
    }
    int nk = argc - 2, reps = getenv("REPS") ? atoi(getenv("REPS")) : 11;
    if (nk > MAX_KERNELS || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "ab_kernels: at most %d kernels and 1..%d REPS\n", MAX_KERNELS, MAX_REPS);
        return 2;
    }
    /* COLD=MiB: rotate the calls through copies of every argument totalling at least that
     * much, so each call finds its data in DRAM (as the measure runner's cold_cache) */
    size_t set = 0;
    for (int i = 0; i < na; i++) set += (n[i] * sizeof(float) + 63) / 64 * 64;
    const double cold_mib = getenv("COLD") ? atof(getenv("COLD")) : 0.0;
    int nc = cold_mib > 0 ? (int)ceil(cold_mib * 1048576.0 / (double)set) : 1;
    if (nc < 1) nc = 1;
    /* ... at least 3, and prime to nk + 1: call (round r, kernel k) takes copy
     * (r (nk + 1) + k) mod nc, so no call finds the copy the call before it used and every
     * kernel takes every copy in turn. (With 2 copies and an even number of kernels each
     * kernel always took the same one: on this VM the second and fourth of four calls ran
     * 11-13 % faster whatever kernel they were, and an A B order read as a 1.1x gain.) */
    if (cold_mib > 0 && nc < 3) nc = 3;
    while (cold_mib > 0 && nc < MAX_COPIES && gcd_int(nk + 1, nc) != 1)
        nc++;
    if (nc > MAX_COPIES) nc = MAX_COPIES;
    /* COLD_ARGS=MASK: only those arguments rotate (0x4: a conv's third); the others keep
     * one copy, warm from the call before, as a plan's freshly written input is */
    const char *ce = getenv("COLD_ARGS");
    const unsigned cold_args = ce ? (unsigned)strtoul(ce, NULL, 0) : ~0u;
#define SHARES_COPY0(c, arg) ((c) > 0 && !((cold_args >> (arg)) & 1u))
    static void *args[MAX_COPIES][MAX_ARGS];
    for (int c = 0; c < nc; c++)
        for (int i = 0; i < na; i++) {
            if (SHARES_COPY0(c, i)) {
                args[c][i] = args[0][i];
                continue;
            }
            float *f = aligned_alloc(64, (n[i] * sizeof(float) + 63) / 64 * 64);
            if (!f) {
                fprintf(stderr, "ab_kernels: out of memory\n");
                return 1;
            }
            for (size_t j = 0; j < n[i]; j++)
                f[j] = (float)((int)((j * 7 + (size_t)i) % 13) - 6) * 0.05f;
            args[c][i] = f;
        }
    const size_t nout = n[na - 1];
    float *first = malloc(nout * sizeof(float));
    kernel_fn fn[MAX_KERNELS];
    cg_prepack_abi pa[MAX_KERNELS] = {0};
    static const float *pre[MAX_KERNELS][MAX_COPIES][CG_MAX_PRE];
    static double t[MAX_KERNELS][MAX_REPS];
    double diff[MAX_KERNELS] = {0};
    /* PRE_ARGS: the arguments @pre packs once (a bitmask; default all that have entries): a
     * plan packs its params only, so 0x2 (a conv's or dense layer's weights) where the
     * kernel also exports a pack of its input */
    const char *pe = getenv("PRE_ARGS");
    const unsigned pre_args = pe ? (unsigned)strtoul(pe, NULL, 0) : ~0u;
    for (int k = 0; k < nk; k++) {
        char path[4096];
        snprintf(path, sizeof path, "%s", argv[2 + k]);
        char *at = strstr(path, "@pre");
        if (at) *at = 0;
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        fn[k] = h ? (kernel_fn)dlsym(h, "tlm_kernel_packed") : NULL;
        if (!fn[k]) {
            fprintf(stderr, "ab_kernels: %s: %s\n", path, h ? "no tlm_kernel_packed" : dlerror());
            return 1;
        }
        if (!at) continue;
        tlm_error err;
        tlm_err_clear(&err);
        if (cg_prepack_find(h, "tlm_kernel", &pa[k], &err)) {
            fprintf(stderr, "ab_kernels: %s: %s\n", path, err.msg);
            return 1;
        }
        for (int q = 0; q < pa[k].n; q++) {
            if (!((pre_args >> pa[k].arg[q]) & 1u)) continue; /* packed by each call */
            for (int c = 0; c < nc; c++) {
                if (SHARES_COPY0(c, pa[k].arg[q])) {
                    pre[k][c][q] = pre[k][0][q];
                    continue;
                }
                float *d = aligned_alloc(64, ((size_t)pa[k].floats[q] * 4 + 63) / 64 * 64);
                if (!d) {
                    fprintf(stderr, "ab_kernels: out of memory\n");
                    return 1;
                }
                pa[k].pack(q, args[c], d);
                pre[k][c][q] = d;
            }
        }
    }
    for (int k = 0; k < nk; k++) { /* each once on the first copy: their outputs agree */
        if (pa[k].n) pa[k].run(args[0], pre[k][0]);
        else fn[k](args[0]);
        const float *o = args[0][na - 1];
        if (k == 0 && first) memcpy(first, o, nout * sizeof(float));
        for (size_t j = 0; k > 0 && first && j < nout; j++)
            if (fabs((double)o[j] - first[j]) > diff[k]) diff[k] = fabs((double)o[j] - first[j]);
    }
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < nk; k++) {
            const int c = (int)(((int64_t)r * (nk + 1) + k) % nc);
            void *const *a_ = args[c];
            const float *const *p_ = pre[k][c];
            double a = now_s();
            if (pa[k].n) pa[k].run(a_, p_);
            else fn[k](a_);
            t[k][r] = now_s() - a;
        }
    for (int k = 0; k < nk; k++) {
        qsort(t[k], (size_t)reps, sizeof(double), cmp_double);
        printf("%-48s median %9.4f ms  min %9.4f ms  max |out - first| %.3g\n", argv[2 + k],
               t[k][reps / 2] * 1e3, t[k][0] * 1e3, diff[k]);
    }
    return 0;
}
