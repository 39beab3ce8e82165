/* test_driver.c — drv_build: (space, schedule) → in-memory artifact for CPU and CUDA targets,
 * the toolchain key, and drv_measure_cpu on the artifact. */
#include <string.h>

#include <criterion/criterion.h>

#include "compiler/driver/driver.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/util/util.h"

static void build_space(const char *tgt, ir_workload *w, ir_subgraph *g, space *sp)
{
    ir_workload_init(w, IR_OP_DENSE);
    w->shape[IR_DENSE_M] = 32;
    w->shape[IR_DENSE_N] = 48;
    w->shape[IR_DENSE_K] = 16;
    w->n_epilogue = 1;
    w->epilogue[0] = IR_EPI_RELU;
    target t;
    tlm_error e;
    cr_assert_eq(target_parse(tgt, &t, &e), 0, "%s", e.msg);
    cr_assert_eq(ir_subgraph_build(w, g, &e), 0, "%s", e.msg);
    cr_assert_eq(space_build(g, &t, sp, &e), 0, "%s", e.msg);
}

static void check_sha(const drv_artifact *a)
{
    char hex[65];
    cr_assert_eq(tlm_sha256_hex(a->binary, a->binary_size, hex), 0);
    cr_assert_str_eq(hex, a->sha256);
}

Test(driver, cpu_artifact_builds_and_measures)
{
    static ir_subgraph g;
    static space sp;
    ir_workload w;
    build_space("cpu", &w, &g, &sp);
    space_sched s;
    space_default(&sp, &s);
    drv_artifact a;
    tlm_error e;
    cr_assert_eq(drv_build(&sp, &s, &a, &e), 0, "%s", e.msg);
    cr_assert_str_eq(a.format, "elf-so");
    cr_assert(a.binary_size > 4 && !memcmp(a.binary,
                                           "\x7f"
                                           "ELF",
                                           4));
    check_sha(&a);
    cr_assert_str_eq(a.entry, "tlm_kernel");
    cr_assert(strstr(a.source, "tlm_kernel"));
    cr_assert_str_eq(a.launch_json, "{}");
    cr_assert(strstr(a.flags, "-O3"));
    char sched[DRV_SCHED_MAX];
    space_print(&sp, &s, sched, sizeof sched);
    cr_assert_str_eq(a.schedule, sched);
    measure_opts o;
    measure_opts_init(&o);
    o.check_only = true;
    measure_result r;
    cr_assert_eq(drv_measure_cpu(&g, &a, &o, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r.status, MEASURE_OK, "%s", r.detail);
    drv_artifact_free(&a);
    cr_assert_null(a.binary);
}

Test(driver, cuda_artifact_is_a_checked_cubin)
{
    tlm_error e;
    if (tc_nvrtc_available(&e)) cr_skip_test("no NVRTC: %s", e.msg);
    static ir_subgraph g;
    static space sp;
    ir_workload w;
    build_space("cuda:sm_80", &w, &g, &sp);
    space_sched s;
    space_default(&sp, &s);
    drv_artifact a;
    cr_assert_eq(drv_build(&sp, &s, &a, &e), 0, "%s", e.msg);
    cr_assert_str_eq(a.format, "cubin");
    cr_assert(a.binary_size > 4 && !memcmp(a.binary,
                                           "\x7f"
                                           "ELF",
                                           4));
    check_sha(&a);
    cr_assert(strstr(a.launch_json, "grid"));
    cr_assert(strstr(a.resources_json, "registers"));
    cr_assert(a.launch.block[0] >= 1 && a.launch.grid[0] >= 1);
    cr_assert_str_eq(a.flags, "--gpu-architecture=sm_80");
    drv_artifact_free(&a);
}

Test(driver, illegal_schedule_is_refused)
{
    static ir_subgraph g;
    static space sp;
    ir_workload w;
    build_space("cpu", &w, &g, &sp);
    space_sched s;
    space_default(&sp, &s);
    s.v[0] = 999999; /* never a legal value of the first slot */
    drv_artifact a;
    tlm_error e;
    cr_assert_lt(drv_build(&sp, &s, &a, &e), 0);
    cr_assert_null(a.binary);
    drv_artifact_free(&a);
}

Test(driver, toolchain_key_names_target_flags)
{
    target c, a, g8, g9;
    cr_assert_eq(target_parse("cpu", &c, NULL), 0);
    cr_assert_eq(target_parse("cpu:avx2", &a, NULL), 0);
    cr_assert_eq(target_parse("cuda:sm_80", &g8, NULL), 0);
    cr_assert_eq(target_parse("cuda:sm_90", &g9, NULL), 0);
    char k1[768], k2[768], k3[768], k4[768];
    cr_assert_gt(drv_toolchain_key(&c, k1, sizeof k1), 0);
    cr_assert_gt(drv_toolchain_key(&a, k2, sizeof k2), 0);
    cr_assert_gt(drv_toolchain_key(&g8, k3, sizeof k3), 0);
    cr_assert_gt(drv_toolchain_key(&g9, k4, sizeof k4), 0);
    cr_assert_str_neq(k1, k2);
    cr_assert_str_neq(k3, k4);
    cr_assert(strstr(k3, "sm_80") && strstr(k4, "sm_90"));
    char tiny[8];
    cr_assert_lt(drv_toolchain_key(&c, tiny, sizeof tiny), 0);
}
