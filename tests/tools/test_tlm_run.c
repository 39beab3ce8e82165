/* test_tlm_run.c — drives the real `tlm` binary (TLM_BIN): `tlm compile --graph` writes kernels
 * and a manifest with the execution plan, `tlm run` runs it (random or .npz weights), times
 * it, checks it against the reference and reports bad input with exit status 2. */
#include <stdint.h>

#include <jansson.h>

#include "tests/common/run_tool.h"

static char g_graph[96], g_out[96];

static const char graph[] =
    "{\"name\": \"mlp\", \"inputs\": [{\"name\": \"x\", \"shape\": [4, 2, 16]},"
    " {\"name\": \"w1\", \"shape\": [16, 32], \"param\": true},"
    " {\"name\": \"b1\", \"shape\": [32], \"param\": true}],"
    " \"nodes\": [{\"name\": \"fc1\", \"op\": \"dense\", \"inputs\": [\"x\", \"w1\"]},"
    " {\"name\": \"y\", \"op\": \"bias_add\", \"inputs\": [\"fc1\", \"b1\"]},"
    " {\"name\": \"t\", \"op\": \"transpose\", \"inputs\": [\"y\"]}]}";

static void setup(void)
{
    tool_dir_make("/tmp/tlm-run-XXXXXX");
    tool_path(g_graph, sizeof g_graph, "g.json");
    tool_path(g_out, sizeof g_out, "k");
    write_file(g_graph, graph);
    run_result r = RUN("compile", "--graph", g_graph, "--target", "cpu", "-o", g_out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_eq(json_integer_value(json_object_get(j, "subgraphs")), 2);
    cr_assert_eq(json_integer_value(json_object_get(j, "launches")), 5, "1 dense + 4 transposes");
    json_decref(j);
    free_result(&r);
}

static void teardown(void)
{
    cr_assert_eq(tool_dir_remove(), 0);
}

TestSuite(tlm_run, .init = setup, .fini = teardown);

Test(tlm_run, runs_times_and_checks_a_compiled_graph)
{
    char path[128];
    snprintf(path, sizeof path, "%s/manifest.json", g_out);
    json_t *man = json_load_file(path, 0, NULL);
    json_t *plan = json_object_get(man, "plan");
    cr_assert_eq(json_array_size(json_object_get(plan, "launches")), 2);
    cr_assert_eq(json_array_size(json_object_get(man, "kernels")), 2);
    json_decref(man);

    run_result r = RUN("run", "--plan", g_out, "--repeat", "3");
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    cr_assert_not_null(j, "%s", r.out);
    cr_assert_eq(json_array_size(json_object_get(j, "launches")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "check"), "status")),
                     "ok");
    cr_assert_gt(json_real_value(json_object_get(json_object_get(j, "e2e_ms"), "median")), 0);
    json_decref(j);
    free_result(&r);
}

/* An .npz (uncompressed zip) of float32 arrays, as numpy.savez writes it; CRCs are left 0
 * (tlm does not check them). */
static void write_npz(const char *path, int n, const char *const *names, const float *const *data,
                      const int *counts, const char *descr)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int i = 0; i < n; i++) {
        char hdr[128];
        int hl =
            snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }",
                     descr, counts[i]);
        int total = (10 + hl + 1 + 63) / 64 * 64;
        memset(hdr + hl, ' ', total - 10 - hl);
        hdr[total - 11] = '\n';
        uint32_t size = (uint32_t)(total + 4 * counts[i]);
        char fname[64];
        int nl = snprintf(fname, sizeof fname, "%s.npy", names[i]);
        unsigned char lh[30] = {'P', 'K', 3, 4, 20};
        memcpy(lh + 18, &size, 4);
        memcpy(lh + 22, &size, 4);
        lh[26] = (unsigned char)nl;
        fwrite(lh, 1, 30, f);
        fwrite(fname, 1, nl, f);
        unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(total - 10),
                                 0};
        fwrite(pre, 1, 10, f);
        fwrite(hdr, 1, total - 10, f);
        fwrite(data[i], 4, counts[i], f);
    }
    fclose(f);
}

Test(tlm_run, npz_weights_are_bound_by_name)
{
    /* x = 1, w1 = 0, b1 = 2: every output element is 2, so the sum is 2 x 256 */
    static float x[128], w1[512], b1[32];
    for (int i = 0; i < 128; i++)
        x[i] = 1;
    for (int i = 0; i < 32; i++)
        b1[i] = 2;
    char npz[128];
    tool_path(npz, sizeof npz, "w.npz");
    write_npz(npz, 3, (const char *const[]){"x", "w1", "b1"}, (const float *const[]){x, w1, b1},
              (const int[]){128, 512, 32}, "<f4");
    run_result r = RUN("run", "--plan", g_out, "--inputs", npz, "--repeat", "1");
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *j = json_loads(r.out, 0, NULL);
    json_t *o = json_array_get(json_object_get(j, "outputs"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(o, "name")), "t");
    cr_assert_float_eq(json_real_value(json_object_get(o, "sum")), 512.0, 1e-6);
    json_decref(j);
    free_result(&r);

    /* wrong dtype, wrong size: exit 2 naming --inputs */
    write_npz(npz, 1, (const char *const[]){"x"}, (const float *const[]){x}, (const int[]){128},
              "<f8");
    r = RUN("run", "--plan", g_out, "--inputs", npz);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "--inputs"), "%s", r.err);
    free_result(&r);
    write_npz(npz, 1, (const char *const[]){"x"}, (const float *const[]){x}, (const int[]){100},
              "<f4");
    r = RUN("run", "--plan", g_out, "--inputs", npz);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "128 elements"), "%s", r.err);
    free_result(&r);
}

Test(tlm_run, bad_usage_exits_2)
{
    run_result r = RUN("run");
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--plan"), "%s", r.err);
    free_result(&r);
    r = RUN("run", "--plan", tool_dir); /* no manifest.json there */
    cr_assert_neq(r.status, 0);
    free_result(&r);
    r = RUN("run", "--plan", g_out, "--repeat", "0");
    cr_assert_eq(r.status, 2);
    free_result(&r);
    r = RUN("run", "--plan", g_out, "--check", "maybe");
    cr_assert_eq(r.status, 2);
    free_result(&r);
    r = RUN("compile", "--model", "nosuchnet", "--target", "cpu", "-o", tool_dir);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "--model"), "%s", r.err);
    cr_assert_eq(count_lines(r.err), 1, "one line: %s", r.err);
    free_result(&r);
}
