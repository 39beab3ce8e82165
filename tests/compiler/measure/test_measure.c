/* Tests for compiler/measure: tiny kernels are written as C, compiled with the system cc into a
 * temporary directory, and measured; every failure mode must come back as a status while the
 * test process (the "daemon") stays healthy and has no children left over. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "compiler/ir/ir.h"
#include "compiler/measure/measure.h"
#include "compiler/measure/runner.h"
#include "compiler/toolchain/cuda_dl.h"
#include "compiler/toolchain/toolchain.h"

static char g_dir[64];

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/tlm-measure-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

TestSuite(measure, .init = setup, .fini = teardown, .timeout = 120);

/* Compiles src into <dir>/<name>.so; returns the path (static buffer per call site is fine:
 * callers copy). */
static void build_so(const char *name, const char *src, const char *flags, char *so, size_t cap)
{
    char c_path[256], cmd[1024];
    snprintf(c_path, sizeof c_path, "%s/%s.c", g_dir, name);
    snprintf(so, cap, "%s/%s.so", g_dir, name);
    FILE *f = fopen(c_path, "w");
    cr_assert_not_null(f);
    fputs(src, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -O2 -shared -fPIC %s -o '%s' '%s' 2>&1", flags ? flags : "", so,
             c_path);
    cr_assert_eq(system(cmd), 0, "cc failed for %s", name);
}

static void dense16(ir_subgraph *g)
{
    ir_workload w;
    ir_workload_init(&w, IR_OP_DENSE);
    w.shape[IR_DENSE_M] = 16;
    w.shape[IR_DENSE_N] = 16;
    w.shape[IR_DENSE_K] = 16;
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(ir_subgraph_build(&w, g, &err), 0, "%s", err.msg);
}

/* A dense 16x16x16 kernel; BODY_EXTRA runs after the product (to break it on purpose),
 * KLIMIT is the reduction bound. */
#define DENSE_SRC(NAME, KLIMIT, BODY_EXTRA)                                                        \
    "#include <stdlib.h>\n"                                                                        \
    "void " NAME "_packed(void *const *args) {\n"                                                  \
    "  const float *A = args[0], *B = args[1]; float *C = args[2];\n"                              \
    "  for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) {\n"                              \
    "    float s = 0; for (int k = 0; k < " KLIMIT "; k++) s += A[i*16+k] * B[k*16+j];\n"          \
    "    C[i*16+j] = s; }\n" BODY_EXTRA "}\n"

static const char *const k_ok = DENSE_SRC("dense", "16", "");

static measure_opts quick_opts(void)
{
    measure_opts o;
    measure_opts_init(&o);
    o.repeats = 3;
    o.min_warmup_s = 1e-3;
    o.min_sample_s = 2e-4;
    return o;
}

/* No runner may outlive a measurement, not even as a zombie. */
static void assert_no_children(void)
{
    int st;
    errno = 0;
    pid_t r = waitpid(-1, &st, WNOHANG);
    cr_assert(r == -1 && errno == ECHILD, "a child process is left over (waitpid -> %d)", (int)r);
}

static void measure_expect(const ir_subgraph *g, const char *so, const measure_opts *o, int status,
                           measure_result *res)
{
    tlm_error err;
    tlm_err_clear(&err);
    int rc = measure_cpu(g, so, "dense", o, res, &err);
    cr_assert_eq(rc, 0, "measure_cpu failed: %s", err.msg);
    cr_assert_eq(res->status, status, "status %s (%s), expected %s",
                 measure_status_name(res->status), res->detail, measure_status_name(status));
    assert_no_children();
}

/* After any failure the caller must still be able to measure a good kernel. */
static void still_healthy(const ir_subgraph *g)
{
    char so[256];
    build_so("healthy", k_ok, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.check_only = true;
    measure_result res;
    measure_expect(g, so, &o, MEASURE_OK, &res);
    cr_assert_lt(res.rel_err, 1e-5);
}

Test(measure, status_names)
{
    cr_assert_str_eq(measure_status_name(MEASURE_OK), "ok");
    cr_assert_str_eq(measure_status_name(MEASURE_WRONG), "wrong");
    cr_assert_str_eq(measure_status_name(MEASURE_CRASH), "crash");
    cr_assert_str_eq(measure_status_name(MEASURE_TIMEOUT), "timeout");
    cr_assert_str_eq(measure_status_name(MEASURE_LOAD_ERROR), "load_error");
    cr_assert_str_eq(measure_status_name(99), "unknown");
}

Test(measure, correct_kernel_is_ok_and_timed)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("ok", k_ok, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.seed = 1234;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_lt(res.rel_err, 1e-5);
    cr_assert_geq(res.rel_err, 0);
    cr_assert_gt(res.median_s, 0);
    cr_assert_gt(res.min_s, 0);
    cr_assert_leq(res.min_s, res.median_s);
    cr_assert_gt(res.n_samples, 0);
    cr_assert_leq(res.n_samples, 3);
    cr_assert_geq(res.inner, 1);
    cr_assert_gt(res.gflops, 0);
    cr_assert_eq(res.seed, 1234);
    /* The same seed gives the same inputs, hence bit-identical error. */
    measure_result again;
    measure_expect(&g, so, &o, MEASURE_OK, &again);
    cr_assert_eq(again.rel_err, res.rel_err);
}

Test(measure, defaults_and_clock_seed)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("ok", k_ok, NULL, so, sizeof so);
    measure_result res;
    tlm_error err;
    cr_assert_eq(measure_cpu(&g, so, "dense", NULL, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.status, MEASURE_OK, "%s", res.detail);
    cr_assert_neq(res.seed, 0);
    cr_assert_gt(res.n_samples, 0);
    assert_no_children();
}

Test(measure, check_only_skips_timing)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("ok", k_ok, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.check_only = true;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_eq(res.n_samples, 0);
    cr_assert_eq(res.median_s, 0);
    cr_assert_gt(res.check_s, 0);
}

Test(measure, cold_cache_rotation_is_ok)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("ok", k_ok, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.cold_cache = true;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_gt(res.n_samples, 0);
    cr_assert_gt(res.median_s, 0);
}

Test(measure, wrong_kernel)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("wrong", DENSE_SRC("dense", "15", ""), NULL, so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_WRONG, &res);
    cr_assert_gt(res.rel_err, 1e-4);
    cr_assert(isfinite(res.rel_err));
    cr_assert_eq(res.median_s, 0, "a wrong kernel is not timed");
    cr_assert_not_null(strstr(res.detail, "rel_err"), "%s", res.detail);
    still_healthy(&g);
}

Test(measure, tolerance_is_respected)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    /* A 1e-3 relative perturbation: wrong at the default 1e-4, right at 1e-2. */
    build_so("nudge", DENSE_SRC("dense", "16", "  for (int i = 0; i < 256; i++) C[i] *= 1.001f;\n"),
             NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.check_only = true;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_WRONG, &res);
    o.rtol = 1e-2;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_gt(res.rel_err, 1e-5);
}

Test(measure, nan_output_is_wrong)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("nan", DENSE_SRC("dense", "16", "  C[37] = __builtin_nanf(\"\");\n"), NULL, so,
             sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_WRONG, &res);
    cr_assert(isinf(res.rel_err));
    cr_assert_not_null(strstr(res.detail, "out[37]"), "%s", res.detail);
    still_healthy(&g);
}

Test(measure, unwritten_output_is_wrong)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    /* Skips one element: only the poison can catch this. */
    const char *src = "void dense_packed(void *const *args) {\n"
                      "  const float *A = args[0], *B = args[1]; float *C = args[2];\n"
                      "  for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) {\n"
                      "    if (i == 3 && j == 5) continue;\n"
                      "    float s = 0; for (int k = 0; k < 16; k++) s += A[i*16+k] * B[k*16+j];\n"
                      "    C[i*16+j] = s; }\n}\n";
    build_so("hole", src, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_WRONG, &res);
    cr_assert_not_null(strstr(res.detail, "out[53]"), "%s", res.detail);
    cr_assert_not_null(strstr(res.detail, "never written"), "%s", res.detail);
}

Test(measure, null_dereference_is_crash)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("null", DENSE_SRC("dense", "16", "  *(volatile float *)0 = 1.0f;\n"), NULL, so,
             sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_CRASH, &res);
    cr_assert_not_null(strstr(res.detail, "SIGSEGV"), "%s", res.detail);
    cr_assert_not_null(strstr(res.detail, "check run"), "%s", res.detail);
    cr_assert_eq(res.rel_err, -1);
    still_healthy(&g);
}

Test(measure, write_one_past_the_end_is_crash)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    /* C has 256 elements: C[256] lands on the guard page after the output. */
    build_so("oob", DENSE_SRC("dense", "16", "  ((volatile float *)C)[256] = 1.0f;\n"), NULL, so,
             sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_CRASH, &res);
    cr_assert_not_null(strstr(res.detail, "SIGSEGV"), "%s", res.detail);
    still_healthy(&g);
}

Test(measure, writing_an_input_is_crash)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("winput", DENSE_SRC("dense", "16", "  ((volatile float *)args[0])[0] = 0.0f;\n"), NULL,
             so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_CRASH, &res);
    cr_assert_not_null(strstr(res.detail, "SIGSEGV"), "%s", res.detail);
}

Test(measure, abort_and_exit_are_crash)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    measure_opts o = quick_opts();
    measure_result res;
    build_so("abort", DENSE_SRC("dense", "16", "  abort();\n"), NULL, so, sizeof so);
    measure_expect(&g, so, &o, MEASURE_CRASH, &res);
    cr_assert_not_null(strstr(res.detail, "SIGABRT"), "%s", res.detail);
    build_so("exit", DENSE_SRC("dense", "16", "  exit(3);\n"), NULL, so, sizeof so);
    measure_expect(&g, so, &o, MEASURE_CRASH, &res);
    cr_assert_not_null(strstr(res.detail, "status 3"), "%s", res.detail);
    still_healthy(&g);
}

Test(measure, infinite_loop_is_timeout)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("hang", DENSE_SRC("dense", "16", "  for (;;) __asm__ volatile(\"\");\n"), NULL, so,
             sizeof so);
    measure_opts o = quick_opts();
    o.timeout_s = 1.0;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_TIMEOUT, &res);
    cr_assert_not_null(strstr(res.detail, "check run"), "%s", res.detail);
    cr_assert_eq(res.median_s, 0);
    still_healthy(&g);
}

Test(measure, hang_in_timing_phase_is_timeout)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    /* Correct on the first call, hangs on the second: the check passes, timing never ends. */
    build_so("hang2",
             DENSE_SRC("dense", "16",
                       "  static int calls; if (++calls > 1) for (;;) __asm__ volatile(\"\");\n"),
             NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.timeout_s = 1.0;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_TIMEOUT, &res);
    cr_assert_not_null(strstr(res.detail, "timing"), "%s", res.detail);
    cr_assert_lt(res.rel_err, 1e-5, "the check ran and passed");
}

Test(measure, slow_kernel_gets_fewer_samples_not_a_timeout)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    /* 0.2 s per call, 20 samples asked (4 s), 2 s allowed: the runner must stop early. */
    build_so("slow", "#include <unistd.h>\n" DENSE_SRC("dense", "16", "  usleep(200000);\n"), NULL,
             so, sizeof so);
    measure_opts o;
    measure_opts_init(&o);
    o.timeout_s = 2.0;
    o.repeats = 20;
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_lt(res.n_samples, 20);
    cr_assert_gt(res.median_s, 0.15);
    cr_assert_eq(res.inner, 1);
}

Test(measure, missing_symbol_and_file_are_load_errors)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("other", DENSE_SRC("other", "16", ""), NULL, so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_LOAD_ERROR, &res);
    cr_assert_not_null(strstr(res.detail, "dense_packed"), "%s", res.detail);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nope.so", g_dir);
    measure_expect(&g, missing, &o, MEASURE_LOAD_ERROR, &res);
    cr_assert_not_null(strstr(res.detail, "dlopen"), "%s", res.detail);
    still_healthy(&g);
}

Test(measure, openmp_kernel_after_parent_used_openmp)
{
    /* The parent's own OpenMP pool must not matter to the runner (a plain fork would inherit
     * a broken pool). */
    volatile int sink = 0;
#pragma omp parallel for reduction(+ : sink)
    for (int i = 0; i < 64; i++)
        sink += i;
    cr_assert_eq(sink, 2016);

    ir_subgraph g;
    dense16(&g);
    char so[256];
    const char *src = "void dense_packed(void *const *args) {\n"
                      "  const float *A = args[0], *B = args[1]; float *C = args[2];\n"
                      "  #pragma omp parallel for\n"
                      "  for (int i = 0; i < 16; i++) for (int j = 0; j < 16; j++) {\n"
                      "    float s = 0; for (int k = 0; k < 16; k++) s += A[i*16+k] * B[k*16+j];\n"
                      "    C[i*16+j] = s; }\n}\n";
    build_so("omp", src, "-fopenmp", so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_gt(res.n_samples, 0);
}

/* The runner binds the kernel's OpenMP threads (OMP_PLACES=threads, OMP_PROC_BIND=close) unless
 * the caller chose a placement itself: the kernel below makes its output wrong when its
 * threads are unbound, so it measures ok only bound, and wrong under OMP_PROC_BIND=false. */
Test(measure, openmp_threads_bound_unless_the_caller_says)
{
    cr_assert_null(getenv("OMP_PROC_BIND"), "run this test without OMP_PROC_BIND");
    cr_assert_null(getenv("OMP_PLACES"), "run this test without OMP_PLACES");
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("bound", DENSE_SRC("dense", "16",
                                "  if (omp_get_proc_bind() == omp_proc_bind_false) C[0] += 1.0f;\n"),
             "-fopenmp -include omp.h", so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_eq(setenv("OMP_PROC_BIND", "false", 1), 0);
    measure_expect(&g, so, &o, MEASURE_WRONG, &res);
    cr_assert_eq(unsetenv("OMP_PROC_BIND"), 0);
}

Test(measure, fork_mode_works_and_isolates)
{
    ir_subgraph g;
    dense16(&g);
    char so[256];
    measure_opts o = quick_opts();
    o.use_fork = true;
    measure_result res;
    build_so("ok", k_ok, NULL, so, sizeof so);
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_gt(res.n_samples, 0);
    build_so("null", DENSE_SRC("dense", "16", "  *(volatile float *)0 = 1.0f;\n"), NULL, so,
             sizeof so);
    measure_expect(&g, so, &o, MEASURE_CRASH, &res);
    o.timeout_s = 1.0;
    build_so("hang", DENSE_SRC("dense", "16", "  for (;;) __asm__ volatile(\"\");\n"), NULL, so,
             sizeof so);
    measure_expect(&g, so, &o, MEASURE_TIMEOUT, &res);
}

Test(measure, elementwise_one_input)
{
    ir_workload w;
    ir_workload_init(&w, IR_OP_ELEMENTWISE);
    w.shape[IR_EW_N] = 1000;
    w.n_epilogue = 1;
    w.epilogue[0] = IR_EPI_RELU;
    ir_subgraph g;
    tlm_error err;
    cr_assert_eq(ir_subgraph_build(&w, &g, &err), 0, "%s", err.msg);
    int in[IR_MAX_TENSORS];
    cr_assert_eq(ir_subgraph_inputs(&g, in), 1);
    const char *src = "void relu_packed(void *const *args) {\n"
                      "  const float *x = args[0]; float *y = args[1];\n"
                      "  for (int i = 0; i < 1000; i++) y[i] = x[i] > 0 ? x[i] : 0;\n}\n";
    char so[256];
    build_so("relu", src, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    cr_assert_eq(measure_cpu(&g, so, "relu", &o, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.status, MEASURE_OK, "%s", res.detail);
    cr_assert_eq(res.rel_err, 0, "relu is exact");
}

/* opts.mem_floor on a relu over n floats whose body runs `passes` times: memory-bound */
static measure_result relu_with_floor(int64_t n, int passes)
{
    ir_workload w;
    ir_workload_init(&w, IR_OP_ELEMENTWISE);
    w.shape[IR_EW_N] = n;
    w.n_epilogue = 1;
    w.epilogue[0] = IR_EPI_RELU;
    ir_subgraph g;
    tlm_error err;
    cr_assert_eq(ir_subgraph_build(&w, &g, &err), 0, "%s", err.msg);
    char src[512], name[32], so[256];
    snprintf(name, sizeof name, "relu%d", passes);
    snprintf(src, sizeof src,
             "void %s_packed(void *const *args) {\n"
             "  const float *x = args[0]; float *y = args[1];\n"
             "  for (int p = 0; p < %d; p++)\n"
             "    for (long i = 0; i < %lld; i++) y[i] = x[i] > 0 ? x[i] : 0;\n}\n",
             name, passes, (long long)n);
    build_so(name, src, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.repeats = 5;
    o.mem_floor = true;
    measure_result res;
    cr_assert_eq(measure_cpu(&g, so, name, &o, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.status, MEASURE_OK, "%s", res.detail);
    return res;
}

/* The floor is timed beside the kernel: a kernel that moves its bytes eight times has a
 * ratio far above one that moves them once (each against the same floor: a copy of 16 MiB);
 * without the option the fields stay 0 */
Test(measure, mem_floor_is_timed_beside_the_kernel)
{
    measure_result once = relu_with_floor(1 << 22, 1), eight = relu_with_floor(1 << 22, 8);
    cr_assert_gt(once.floor_s, 0);
    cr_assert_gt(once.floor_ratio, 0);
    cr_assert_gt(eight.floor_s, 0);
    cr_assert_gt(eight.floor_ratio, 2 * once.floor_ratio, "8 passes %g, 1 pass %g",
                 eight.floor_ratio, once.floor_ratio);
    ir_subgraph g;
    dense16(&g);
    char so[256];
    build_so("ok", k_ok, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    measure_result res;
    measure_expect(&g, so, &o, MEASURE_OK, &res);
    cr_assert_eq(res.floor_s, 0);
    cr_assert_eq(res.floor_ratio, 0);
}

/* The floor's two forms: a read of the inputs for a reduction (it writes far less than it
 * reads), and a copy whose source (input 0) is shorter than the output and wraps around at
 * an unaligned length (dense 16 x 64 x 3: A has 48 floats, C 1024), cold and warm */
Test(measure, mem_floor_reads_for_reductions_and_wraps_a_short_input)
{
    ir_workload w;
    ir_workload_init(&w, IR_OP_REDUCE_SUM);
    w.shape[IR_ROW_R] = 64;
    w.shape[IR_ROW_C] = 4099;
    ir_subgraph g;
    tlm_error err;
    cr_assert_eq(ir_subgraph_build(&w, &g, &err), 0, "%s", err.msg);
    const char *rsum = "void rsum_packed(void *const *args) {\n"
                       "  const float *x = args[0]; float *y = args[1];\n"
                       "  for (int r = 0; r < 64; r++) { double s = 0;\n"
                       "    for (int c = 0; c < 4099; c++) s += x[r * 4099 + c];\n"
                       "    y[r] = (float)s; }\n}\n";
    char so[256];
    build_so("rsum", rsum, NULL, so, sizeof so);
    measure_opts o = quick_opts();
    o.mem_floor = true;
    measure_result res;
    cr_assert_eq(measure_cpu(&g, so, "rsum", &o, &res, &err), 0, "%s", err.msg);
    cr_assert_eq(res.status, MEASURE_OK, "%s", res.detail);
    cr_assert_gt(res.floor_s, 0);
    cr_assert_gt(res.floor_ratio, 0);

    ir_workload_init(&w, IR_OP_DENSE);
    w.shape[IR_DENSE_M] = 16;
    w.shape[IR_DENSE_N] = 64;
    w.shape[IR_DENSE_K] = 3;
    cr_assert_eq(ir_subgraph_build(&w, &g, &err), 0, "%s", err.msg);
    const char *d3 = "void d3_packed(void *const *args) {\n"
                     "  const float *A = args[0], *B = args[1]; float *C = args[2];\n"
                     "  for (int i = 0; i < 16; i++) for (int j = 0; j < 64; j++) {\n"
                     "    float s = 0; for (int k = 0; k < 3; k++) s += A[i*3+k] * B[k*64+j];\n"
                     "    C[i*64+j] = s; }\n}\n";
    build_so("d3", d3, NULL, so, sizeof so);
    for (int cold = 0; cold < 2; cold++) {
        o.cold_cache = cold;
        cr_assert_eq(measure_cpu(&g, so, "d3", &o, &res, &err), 0, "%s", err.msg);
        cr_assert_eq(res.status, MEASURE_OK, "%s", res.detail);
        cr_assert_gt(res.floor_s, 0);
        cr_assert_gt(res.floor_ratio, 0);
    }
    assert_no_children();
}

typedef struct {
    const ir_subgraph *g;
    const char *so;
    int rc, status;
} thread_job;

static void *measure_thread(void *arg)
{
    thread_job *t = arg;
    measure_opts o = quick_opts();
    measure_result res;
    t->rc = measure_cpu(t->g, t->so, "dense", &o, &res, NULL);
    t->status = res.status;
    return NULL;
}

Test(measure, concurrent_callers)
{
    ir_subgraph g;
    dense16(&g);
    char so_ok[256], so_bad[256];
    build_so("ok", k_ok, NULL, so_ok, sizeof so_ok);
    build_so("null", DENSE_SRC("dense", "16", "  *(volatile float *)0 = 1.0f;\n"), NULL, so_bad,
             sizeof so_bad);
    thread_job jobs[3] = {{&g, so_ok, -1, -1}, {&g, so_bad, -1, -1}, {&g, so_ok, -1, -1}};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, measure_thread, &jobs[i]), 0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(jobs[0].rc, 0);
    cr_assert_eq(jobs[0].status, MEASURE_OK);
    cr_assert_eq(jobs[1].rc, 0);
    cr_assert_eq(jobs[1].status, MEASURE_CRASH);
    cr_assert_eq(jobs[2].status, MEASURE_OK);
    assert_no_children();
}

Test(measure, bad_arguments)
{
    ir_subgraph g;
    dense16(&g);
    measure_result res;
    tlm_error err;
    cr_assert_eq(measure_cpu(NULL, "x.so", "dense", NULL, &res, &err), TLM_EINVAL);
    cr_assert_eq(measure_cpu(&g, "x.so", "bad-name", NULL, &res, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "entry");
    cr_assert_eq(measure_cpu(&g, "x.so", "", NULL, &res, &err), TLM_EINVAL);
    measure_opts o;
    measure_opts_init(&o);
    o.timeout_s = NAN;
    cr_assert_eq(measure_cpu(&g, "x.so", "dense", &o, &res, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "opts.timeout_s");

    unsigned char blob[16] = {0};
    measure_launch l = {{1, 1, 1}, {0, 1, 1}, 0};
    cr_assert_eq(measure_cuda(&g, blob, sizeof blob, "k", &l, NULL, &res, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "launch.block");
    measure_launch big = {{1, 1, 1}, {64, 32, 1}, 0};
    cr_assert_eq(measure_cuda(&g, blob, sizeof blob, "k", &big, NULL, &res, &err), TLM_EINVAL);
    cr_assert_eq(measure_cuda(&g, blob, 0, "k", &big, NULL, &res, &err), TLM_EINVAL);
    assert_no_children();
}

static bool have_gpu(void)
{
    const tc_cuda *cu;
    return tc_cuda_get(&cu, NULL) == 0;
}

/* No fixture: a skipped test does not run .fini, and these need no files. */
TestSuite(measure_cuda, .timeout = 120);

Test(measure_cuda, without_gpu_is_unsupported)
{
    if (have_gpu()) cr_skip_test("a GPU is present; see the cuda_* tests");
    ir_subgraph g;
    dense16(&g);
    unsigned char blob[16] = {0};
    measure_launch l = {{1, 1, 1}, {16, 16, 1}, 0};
    measure_result res;
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(measure_cuda(&g, blob, sizeof blob, "dense", &l, NULL, &res, &err),
                 TLM_EUNSUPPORTED);
    cr_assert_gt(strlen(err.msg), 0);
    assert_no_children();
}

/* ---- only where a GPU exists (skipped here) ---- */

#define CU_DENSE(EXTRA)                                                                            \
    "extern \"C\" __global__ void dense(const float *A, const float *B, float *C) {\n"             \
    "  int i = threadIdx.y, j = threadIdx.x; float s = 0;\n"                                       \
    "  for (int k = 0; k < 16; k++) s += A[i*16+k] * B[k*16+j];\n"                                 \
    "  C[i*16+j] = s;\n" EXTRA "}\n"

static int gpu_sm(void)
{
    const tc_cuda *cu;
    if (tc_cuda_get(&cu, NULL) != 0) return 0;
    tc_cu_device dev;
    int major = 0, minor = 0;
    cu->device_get(&dev, 0);
    cu->device_get_attribute(&major, (tc_cu_device_attribute)75, dev);
    cu->device_get_attribute(&minor, (tc_cu_device_attribute)76, dev);
    return major * 10 + minor;
}

static void cuda_expect(const char *src, double timeout_s, int status, measure_result *res)
{
    ir_subgraph g;
    dense16(&g);
    tc_cubin cub;
    tlm_error err;
    tlm_err_clear(&err);
    int rc = tc_nvrtc_compile(src, "dense", gpu_sm(), &cub, &err);
    cr_assert_eq(rc, 0, "nvrtc: %s", err.msg);
    measure_launch l = {{1, 1, 1}, {16, 16, 1}, 0};
    measure_opts o = quick_opts();
    if (timeout_s > 0) o.timeout_s = timeout_s;
    rc = measure_cuda(&g, cub.data, cub.size, cub.entry, &l, &o, res, &err);
    tc_cubin_free(&cub);
    cr_assert_eq(rc, 0, "measure_cuda: %s", err.msg);
    cr_assert_eq(res->status, status, "status %s (%s), expected %s",
                 measure_status_name(res->status), res->detail, measure_status_name(status));
    assert_no_children();
}

Test(measure_cuda, ok_wrong_crash_timeout)
{
    if (!have_gpu()) cr_skip_test("no GPU");
    measure_result res;
    cuda_expect(CU_DENSE(""), 0, MEASURE_OK, &res);
    cr_assert_lt(res.rel_err, 1e-5);
    cr_assert_gt(res.median_s, 0);
    cr_assert_gt(res.n_samples, 0);
    cuda_expect(CU_DENSE("  if (i == 0 && j == 0) C[0] += 1.0f;\n"), 0, MEASURE_WRONG, &res);
    cuda_expect(CU_DENSE("  if (i == 0 && j == 0) C[256 + 7] = 1.0f;\n"), 0, MEASURE_CRASH, &res);
    cr_assert_not_null(strstr(res.detail, "past the end"), "%s", res.detail);
    cuda_expect(CU_DENSE("  if (i == 0) *(volatile float *)(C + (1ull << 40)) = 1.0f;\n"), 0,
                MEASURE_CRASH, &res);
    cuda_expect(CU_DENSE("  for (volatile int z = 0; z >= 0; z = 0) {}\n"), 2.0, MEASURE_TIMEOUT,
                &res);
    cuda_expect(CU_DENSE(""), 0, MEASURE_OK, &res);
}

/* The CUDA runner's 16-bit conversions (float16/bfloat16 kernels) against the compiler's:
 * GCC's _Float16 for IEEE binary16, and bfloat16 as the upper half of a float (exact on
 * values that are bfloat16 already, round-to-nearest-even on the rest). */
Test(measure, half_conversions_round_to_nearest_even)
{
    uint64_t x = 0x1234567;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint32_t u = (uint32_t)x;
        if (i % 4 == 0) u = (u & 0x807fffffu) | ((uint32_t)(100 + i % 60) << 23); /* |f| in f16 range */
        float f;
        memcpy(&f, &u, 4);
        if (isnan(f)) continue;
        _Float16 want = (_Float16)f;
        uint16_t w;
        memcpy(&w, &want, 2);
        uint16_t got = measure__f32_to_half(IR_FLOAT16, f);
        cr_assert_eq(got, w, "float16 of %a: got 0x%04x, want 0x%04x", (double)f, got, w);
        cr_assert(measure__half_to_f32(IR_FLOAT16, got) == (float)want ||
                      isnan(measure__half_to_f32(IR_FLOAT16, got)),
                  "float16 0x%04x back to float", got);
        uint16_t b = measure__f32_to_half(IR_BFLOAT16, f);
        float bf = measure__half_to_f32(IR_BFLOAT16, b);
        /* the nearest bfloat16: no representable value between f and bf's neighbours */
        uint32_t bu;
        memcpy(&bu, &bf, 4);
        cr_assert_eq(bu & 0xffffu, 0u);
        if (isfinite(bf)) cr_assert_leq(fabs((double)bf - f), ldexp(fabs((double)f), -8) + 0x1p-133);
    }
    /* ties go to even */
    cr_assert_eq(measure__f32_to_half(IR_BFLOAT16, 1.0f + 0x1p-8f), 0x3f80);
    cr_assert_eq(measure__f32_to_half(IR_BFLOAT16, 1.0f + 0x3p-8f), 0x3f82);
    cr_assert_eq(measure__f32_to_half(IR_FLOAT16, 65520.0f), 0x7c00);
    cr_assert(isnan(measure__half_to_f32(IR_BFLOAT16, measure__f32_to_half(IR_BFLOAT16, NAN))));
    cr_assert(isnan(measure__half_to_f32(IR_FLOAT16, measure__f32_to_half(IR_FLOAT16, NAN))));
}
