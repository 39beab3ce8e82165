/* test_runtime.c — compiler/runtime: a plan and its kernels, compiled here through the
 * pipeline, loaded, bound, run and checked (against loops written in this file, and against
 * the reference interpreter over the same plan); bad manifests and bindings. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/runtime/runtime.h"
#include "tests/common/graph_text.h"
#include "tests/common/plan_dir.h"

static char *compile_graph(const char *graph_text)
{
    return plan_dir_compile(graph_from_text(graph_text));
}

static void remove_dir(char *dir)
{
    plan_dir_remove(dir);
}

static const char mlp[] = "{'inputs': [{'name': 'x', 'shape': [4, 2, 16]},"
                          " {'name': 'w1', 'shape': [16, 32], 'param': true},"
                          " {'name': 'b1', 'shape': [32], 'param': true},"
                          " {'name': 'w2', 'shape': [32, 8], 'param': true}],"
                          " 'nodes': ["
                          "  {'name': 'fc1', 'op': 'dense', 'inputs': ['x', 'w1']},"
                          "  {'name': 'bias', 'op': 'bias_add', 'inputs': ['fc1', 'b1']},"
                          "  {'name': 'act', 'op': 'gelu', 'inputs': ['bias']},"
                          "  {'name': 't', 'op': 'transpose', 'inputs': ['act']},"
                          "  {'name': 'r', 'op': 'reshape', 'inputs': ['t'],"
                          "   'attrs': {'shape': [8, 32]}},"
                          "  {'name': 'fc2', 'op': 'dense', 'inputs': ['r', 'w2']},"
                          "  {'name': 'res', 'op': 'add', 'inputs': ['r', 'r']}]}";

static void fill(float *v, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        v[i] = (float)((seed >> 8) % 2001) / 1000.0f - 1.0f;
    }
}

Test(runtime, mlp_matches_loops_written_here)
{
    char *dir = compile_graph(mlp);
    rt_model *m;
    tlm_error err = {0};
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s: %s", err.field, err.msg);
    float x[128], w1[512], b1[32], w2[256];
    fill(x, 128, 1), fill(w1, 512, 2), fill(b1, 32, 3), fill(w2, 256, 4);
    cr_assert_eq(rt_bind(m, "x", x, 128, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_bind(m, "w1", w1, 512, &err), 0);
    cr_assert_eq(rt_bind(m, "b1", b1, 32, &err), 0);
    cr_assert_eq(rt_bind(m, "w2", w2, 256, &err), 0);
    double times[8];
    cr_assert_eq(rt_run(m, times, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_model_n_launches(m), 4);

    /* act[8,32] = gelu(x[8,16] w1 + b1); t[4][32][2] = per batch transpose of act[4][2][32];
     * r = t viewed [8,32]; fc2 = r w2; res = r + r */
    double act[8][32], r[8][32];
    for (int i = 0; i < 8; i++)
        for (int n = 0; n < 32; n++) {
            double s = b1[n];
            for (int k = 0; k < 16; k++)
                s += (double)x[i * 16 + k] * w1[k * 32 + n];
            act[i][n] = 0.5 * s * (1 + erf(s / sqrt(2.0)));
        }
    for (int b = 0; b < 4; b++)
        for (int c = 0; c < 32; c++)
            for (int rr = 0; rr < 2; rr++) {
                int flat = b * 64 + c * 2 + rr;
                r[flat / 32][flat % 32] = act[b * 2 + rr][c];
            }
    const float *fc2 = rt_model_data(m, rt_model_find(m, "fc2"));
    const float *res = rt_model_data(m, rt_model_find(m, "res"));
    for (int i = 0; i < 8; i++) {
        for (int n = 0; n < 8; n++) {
            double s = 0;
            for (int k = 0; k < 32; k++)
                s += r[i][k] * w2[k * 8 + n];
            cr_assert_float_eq(fc2[i * 8 + n], s, 1e-4, "fc2[%d][%d] %g vs %g", i, n,
                               fc2[i * 8 + n], s);
        }
        for (int k = 0; k < 32; k++)
            cr_assert_float_eq(res[i * 32 + k], 2 * r[i][k], 1e-5);
    }
    rt_check ck;
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0, "%s", err.msg);
    cr_assert(ck.finite);
    cr_assert_lt(ck.max_rel_err, 1e-5);
    rt_model_free(m);
    remove_dir(dir);
}

Test(runtime, small_cnn_end_to_end_against_the_reference)
{
    char *dir = compile_graph(
        "{'name': 'cnn', 'inputs': [{'name': 'img', 'shape': [2, 3, 16, 16]},"
        " {'name': 'c1w', 'shape': [8, 3, 3, 3], 'param': true},"
        " {'name': 'c1b', 'shape': [8], 'param': true},"
        " {'name': 'dww', 'shape': [8, 3, 3], 'param': true},"
        " {'name': 'c2w', 'shape': [8, 8, 1, 1], 'param': true},"
        " {'name': 'c2b', 'shape': [8], 'param': true},"
        " {'name': 'fcw', 'shape': [8, 10], 'param': true},"
        " {'name': 'fcb', 'shape': [10], 'param': true}],"
        " 'nodes': ["
        "  {'name': 'c1', 'op': 'conv2d', 'inputs': ['img', 'c1w'], 'attrs': {'pad': [1, 1]}},"
        "  {'name': 'c1+b', 'op': 'bias_add', 'inputs': ['c1', 'c1b']},"
        "  {'name': 'a1', 'op': 'relu', 'inputs': ['c1+b']},"
        "  {'name': 'p1', 'op': 'max_pool2d', 'inputs': ['a1'], 'attrs': {'kernel': [2, 2]}},"
        "  {'name': 'dw', 'op': 'depthwise_conv2d', 'inputs': ['p1', 'dww'],"
        "   'attrs': {'pad': [1, 1]}},"
        "  {'name': 'a2', 'op': 'relu6', 'inputs': ['dw']},"
        "  {'name': 'c2', 'op': 'conv2d', 'inputs': ['a2', 'c2w']},"
        "  {'name': 'c2+b', 'op': 'bias_add', 'inputs': ['c2', 'c2b']},"
        "  {'name': 'sum', 'op': 'add', 'inputs': ['c2+b', 'p1']},"
        "  {'name': 'gap', 'op': 'global_avg_pool2d', 'inputs': ['sum']},"
        "  {'name': 'flat', 'op': 'flatten', 'inputs': ['gap']},"
        "  {'name': 'fc', 'op': 'dense', 'inputs': ['flat', 'fcw']},"
        "  {'name': 'logits', 'op': 'bias_add', 'inputs': ['fc', 'fcb']},"
        "  {'name': 'prob', 'op': 'softmax', 'inputs': ['logits']}]}");
    /* the 1x1 conv writes its sum over p1, which it reads last (run and checked so below) */
    char mpath[512];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    json_t *man = json_load_file(mpath, 0, NULL), *t;
    cr_assert_not_null(man);
    size_t k;
    const char *over = NULL;
    json_array_foreach(json_object_get(json_object_get(man, "plan"), "tensors"), k, t)
    {
        if (!strcmp(json_string_value(json_object_get(t, "name")), "sum"))
            over = json_string_value(json_object_get(t, "in_place_of"));
    }
    cr_assert(over && !strcmp(over, "p1"), "sum in place of %s", over ? over : "nothing");
    json_decref(man);
    rt_model *m;
    tlm_error err = {0};
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s: %s", err.field, err.msg);
    rt_bind_random(m, 7);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    int out = rt_model_find(m, "prob");
    cr_assert(out >= 0);
    float first[20];
    memcpy(first, rt_model_data(m, out), sizeof first);
    double s = 0;
    for (int i = 0; i < 10; i++)
        s += first[i];
    cr_assert_float_eq(s, 1.0, 1e-5, "a softmax row sums to 1");
    rt_check ck;
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0, "%s", err.msg);
    cr_assert(ck.finite);
    cr_assert_lt(ck.max_rel_err, 1e-4, "%g on %s", ck.max_rel_err, ck.worst);
    /* a second run gives the same answer (nothing depends on what the arena held) */
    cr_assert_eq(rt_run(m, NULL, &err), 0);
    cr_assert_arr_eq(first, rt_model_data(m, out), sizeof first);
    /* and the check can fail: a corrupted output is caught */
    rt_model_data(m, out)[3] += 0.5f;
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0);
    cr_assert_gt(ck.max_rel_err, 0.1);
    cr_assert_str_eq(ck.worst, "prob");
    rt_model_free(m);
    remove_dir(dir);
}

/* Weights a kernel packs (a conv's along F, a GEMM's B) are packed once, after binding, and
 * again when a param is bound anew; the launches read the packed copies and give what the
 * kernels give packing in every call, bit for bit. */
Test(runtime, params_packed_once_and_again_when_bound)
{
    char *dir = compile_graph(
        "{'inputs': [{'name': 'img', 'shape': [1, 64, 8, 8]},"
        " {'name': 'cw', 'shape': [64, 64, 3, 3], 'param': true},"
        " {'name': 'x', 'shape': [32, 256]},"
        " {'name': 'w', 'shape': [256, 256], 'param': true}],"
        " 'nodes': ["
        "  {'name': 'conv', 'op': 'conv2d', 'inputs': ['img', 'cw'], 'attrs': {'pad': [1, 1]}},"
        "  {'name': 'act', 'op': 'relu', 'inputs': ['conv']},"
        "  {'name': 'fc', 'op': 'dense', 'inputs': ['x', 'w']}]}");
    rt_model *m;
    tlm_error err = {0};
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s: %s", err.field, err.msg);
    cr_assert_eq(rt_model_prepack_bytes(m), 0, "nothing packed before the first run");
    rt_bind_random(m, 3);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    /* both weights packed: 64 x 576 and 256 x 256 floats at least */
    cr_assert_geq(rt_model_prepack_bytes(m), (64 * 576 + 256 * 256) * 4,
                  "%lld bytes packed", (long long)rt_model_prepack_bytes(m));
    rt_check ck;
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0, "%s", err.msg);
    cr_assert(ck.finite);
    cr_assert_lt(ck.max_rel_err, 1e-4, "%g on %s", ck.max_rel_err, ck.worst);
    const int act = rt_model_find(m, "act"), fc = rt_model_find(m, "fc");
    cr_assert(act >= 0 && fc >= 0);
    enum { NA = 64 * 64, NF = 32 * 256 };
    static float before[NA + NF], w[256 * 256], cw[64 * 576];
    memcpy(before, rt_model_data(m, act), NA * 4);
    memcpy(before + NA, rt_model_data(m, fc), NF * 4);
    /* new weights: the next run packs them again (the reference reads the arena) */
    fill(w, 256 * 256, 11);
    fill(cw, 64 * 576, 12);
    for (int i = 0; i < 64 * 576; i++) cw[i] *= 0.05f;
    for (int i = 0; i < 256 * 256; i++) w[i] *= 0.0625f;
    cr_assert_eq(rt_bind(m, "w", w, 256 * 256, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_bind(m, "cw", cw, 64 * 576, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0, "%s", err.msg);
    cr_assert(ck.finite);
    cr_assert_lt(ck.max_rel_err, 1e-4, "after rebinding: %g on %s", ck.max_rel_err, ck.worst);
    cr_assert(memcmp(before + NA, rt_model_data(m, fc), NF * 4) != 0, "new weights, new output");
    static float packed[NA + NF];
    memcpy(packed, rt_model_data(m, act), NA * 4);
    memcpy(packed + NA, rt_model_data(m, fc), NF * 4);
    /* the kernels as compiled, packing in each call: the same bits */
    rt_set_prepack(m, false);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    cr_assert(memcmp(packed, rt_model_data(m, act), NA * 4) == 0);
    cr_assert(memcmp(packed + NA, rt_model_data(m, fc), NF * 4) == 0);
    rt_model_free(m);
    remove_dir(dir);
}

/* whether this kernel gives transparent huge pages to a region advised so */
static bool thp_available(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (f) {
        if (!fgets(line, sizeof line, f)) line[0] = 0;
        fclose(f);
    }
    return f && !strstr(line, "[never]");
}

/* one run of the plan in dir with TLM_HUGE_PAGES as given (NULL: unset), the weights
 * bound again between two runs; the output of the second run into out */
static void run_big(const char *dir, const char *huge, bool *advised, float *out, int n)
{
    if (huge)
        setenv("TLM_HUGE_PAGES", huge, 1);
    else
        unsetenv("TLM_HUGE_PAGES");
    rt_model *m;
    tlm_error err = {0};
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s: %s", err.field, err.msg);
    *advised = rt_model_huge_pages(m);
    rt_bind_random(m, 5);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    cr_assert_geq(rt_model_prepack_bytes(m), 1024 * 1024 * 4, "the 4 MiB weights packed once");
    static float w[1024 * 1024];
    fill(w, 1024 * 1024, 21);
    for (int i = 0; i < 1024 * 1024; i++)
        w[i] *= 0.03f;
    cr_assert_eq(rt_bind(m, "w", w, 1024 * 1024, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    rt_check ck;
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0, "%s", err.msg);
    cr_assert(ck.finite);
    cr_assert_lt(ck.max_rel_err, 1e-4, "huge pages %s: %g on %s", huge ? huge : "default",
                 ck.max_rel_err, ck.worst);
    const int act = rt_model_find(m, "act");
    cr_assert(act >= 0);
    memcpy(out, rt_model_data(m, act), (size_t)n * 4);
    rt_model_free(m);
    unsetenv("TLM_HUGE_PAGES");
}

Test(runtime, big_plans_live_in_huge_pages_unless_told_not_to)
{
    char *dir = compile_graph("{'inputs': [{'name': 'x', 'shape': [256, 1024]},"
                              " {'name': 'w', 'shape': [1024, 1024], 'param': true}],"
                              " 'nodes': [{'name': 'fc', 'op': 'dense', 'inputs': ['x', 'w']},"
                              "  {'name': 'act', 'op': 'relu', 'inputs': ['fc']}]}");
    enum { N = 256 * 1024 };
    static float on[N], off[N];
    bool adv_on, adv_off;
    run_big(dir, NULL, &adv_on, on, N);
    run_big(dir, "off", &adv_off, off, N);
    cr_assert_eq(adv_on, thp_available(), "an arena of 6 MiB advised where THP is on");
    cr_assert(!adv_off, "TLM_HUGE_PAGES=off: plain pages");
    cr_assert(memcmp(on, off, sizeof on) == 0, "the same bits either way");
    run_big(dir, "0", &adv_off, off, N);
    cr_assert(!adv_off, "TLM_HUGE_PAGES=0: plain pages");
    remove_dir(dir);
}

Test(runtime, bindings_are_checked)
{
    char *dir = compile_graph(mlp);
    rt_model *m;
    tlm_error err = {0};
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s", err.msg);
    float v[600] = {0};
    cr_assert_eq(rt_bind(m, "x", v, 127, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "x");
    cr_assert_eq(rt_bind(m, "act", v, 256, &err), TLM_EINVAL, "intermediates are not bound");
    cr_assert_eq(rt_bind(m, "nope", v, 1, &err), TLM_ENOTFOUND);
    rt_model_free(m);
    remove_dir(dir);
}

/* Loads DIR after edit() changed its manifest; returns the error. */
static tlm_error load_edited(const char *dir, void (*edit)(json_t *man))
{
    char path[600], bak[600];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    snprintf(bak, sizeof bak, "%s/manifest.orig", dir);
    json_t *man = json_load_file(access(bak, R_OK) ? path : bak, 0, NULL);
    cr_assert_not_null(man);
    if (access(bak, R_OK)) cr_assert_eq(json_dump_file(man, bak, 0), 0);
    edit(man);
    cr_assert_eq(json_dump_file(man, path, 0), 0);
    json_decref(man);
    rt_model *m = NULL;
    tlm_error err = {0};
    cr_assert_neq(rt_model_load(dir, &m, &err), 0, "the edited manifest must be refused");
    cr_assert_null(m);
    return err;
}

static json_t *plan_of(json_t *man)
{
    return json_object_get(man, "plan");
}
static json_t *launch0(json_t *man)
{
    return json_array_get(json_object_get(plan_of(man), "launches"), 0);
}

static void no_plan(json_t *man)
{
    json_object_del(man, "plan");
}
static void small_arena(json_t *man)
{
    json_object_set_new(plan_of(man), "arena_bytes", json_integer(256));
}
static void unknown_arg(json_t *man)
{
    json_array_set_new(json_object_get(launch0(man), "args"), 1, json_string("ghost"));
}
static void writes_param(json_t *man)
{
    json_t *args = json_object_get(launch0(man), "args");
    json_array_set_new(args, json_array_size(args) - 1, json_string("w1"));
}
static void bad_subgraph(json_t *man)
{
    json_object_set_new(launch0(man), "subgraph", json_integer(99));
}
static void path_in_binary(json_t *man)
{
    json_object_set_new(json_array_get(json_object_get(man, "kernels"), 0), "binary",
                        json_string("../../etc/passwd"));
}
static void wrong_bytes(json_t *man)
{
    json_object_set_new(json_array_get(json_object_get(plan_of(man), "tensors"), 0), "bytes",
                        json_integer(12));
}

Test(runtime, bad_manifests_name_the_field)
{
    char *dir = compile_graph(mlp);
    tlm_error e = load_edited(dir, no_plan);
    cr_assert_str_eq(e.field, "plan");
    e = load_edited(dir, small_arena);
    cr_assert_str_eq(e.field, "plan.tensors[0]", "%s", e.field);
    e = load_edited(dir, unknown_arg);
    cr_assert_str_eq(e.field, "plan.launches[0].args[1]", "%s", e.field);
    e = load_edited(dir, writes_param);
    cr_assert_str_eq(e.field, "plan.launches[0].args[3]", "%s", e.field);
    e = load_edited(dir, bad_subgraph);
    cr_assert_str_eq(e.field, "plan.launches[0]");
    e = load_edited(dir, path_in_binary);
    cr_assert_str_eq(e.field, "kernels[0]");
    e = load_edited(dir, wrong_bytes);
    cr_assert_str_eq(e.field, "plan.tensors[0]");
    cr_assert_eq(e.code, TLM_EINVAL);
    remove_dir(dir);
}
