/* test_onnx.c — ONNX import (compiler/frontend/onnx.c): the test models of tests/data/onnx
 * (made by make_models.py with onnx.helper) import, compile and run to ONNX Runtime's outputs
 * and the reference; bad files name the field, node and op; truncated and corrupted bytes
 * never crash the importer. Paths are relative to TLM_ROOT (the repository). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/frontend.h"
#include "compiler/runtime/runtime.h"
#include "tests/common/plan_dir.h"

static char *read_data(const char *name, size_t *len)
{
    const char *root = getenv("TLM_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/onnx/%s", root && *root ? root : ".", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* The float32 payload of a version-1 .npy file (numpy.save), and its element count. */
static float *read_npy(const char *name, int64_t *n)
{
    size_t len;
    char *b = read_data(name, &len);
    cr_assert(len > 10 && !memcmp(b, "\x93NUMPY\x01", 7));
    size_t h = 10 + (unsigned char)b[8] + 256 * (unsigned char)b[9];
    cr_assert(strstr(b + 10, "'<f4'"), "%s is not float32", name);
    *n = (int64_t)((len - h) / 4);
    float *v = malloc(len - h);
    memcpy(v, b + h, len - h);
    free(b);
    return v;
}

static tlm_error import_err(const char *name)
{
    size_t len;
    char *b = read_data(name, &len);
    fe_graph *g = NULL;
    tlm_error err = {0};
    cr_assert_neq(fe_onnx_import(b, len, &g, NULL, &err), 0, "%s must be refused", name);
    cr_assert_null(g);
    free(b);
    return err;
}

/* Imports, compiles, runs with the file's weights and the saved input; compares with ONNX
 * Runtime's saved output and with the reference interpreter over the same plan. */
static void run_model(const char *stem, const char *input, const char *output, int n_launch_min)
{
    char f[128];
    snprintf(f, sizeof f, "%s.onnx", stem);
    size_t len;
    char *b = read_data(f, &len);
    fe_graph *g;
    fe_onnx_weights w;
    tlm_error err = {0};
    cr_assert_eq(fe_onnx_import(b, len, &g, &w, &err), 0, "%s: %s", err.field, err.msg);
    free(b);
    char *dir = plan_dir_compile(g);
    rt_model *m;
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s: %s", err.field, err.msg);
    cr_assert_geq(rt_model_n_launches(m), n_launch_min);
    for (int i = 0; i < w.n; i++)
        cr_assert_eq(rt_bind(m, w.p[i].name, w.p[i].data, w.p[i].n, &err), 0, "%s: %s", w.p[i].name,
                     err.msg);
    int64_t nx, ny;
    snprintf(f, sizeof f, "%s.in.npy", stem);
    float *x = read_npy(f, &nx);
    snprintf(f, sizeof f, "%s.out.npy", stem);
    float *want = read_npy(f, &ny);
    cr_assert_eq(rt_bind(m, input, x, nx, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    int o = rt_model_find(m, output);
    cr_assert(o >= 0, "no output %s", output);
    cr_assert_eq(rt_model_tensor(m, o)->bytes / 4, ny);
    const float *got = rt_model_data(m, o);
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < ny; i++) {
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    cr_assert_lt(diff / scale, 1e-4, "%s vs ONNX Runtime: %g", stem, diff / scale);
    rt_check ck;
    cr_assert_eq(rt_reference(m, proto_workload_decode, &ck, &err), 0, "%s", err.msg);
    cr_assert(ck.finite);
    cr_assert_lt(ck.max_rel_err, 1e-5);
    free(x);
    free(want);
    rt_model_free(m);
    fe_onnx_weights_free(&w);
    plan_dir_remove(dir);
}

Test(onnx, resnet_style_block_runs_to_onnx_runtimes_output)
{
    /* conv+bn+relu, maxpool, conv+bn + residual add + relu, conv+bias, clip(0,6), global
     * average pool, flatten, gemm, softmax */
    run_model("resnet_block", "x", "prob", 6);
}

Test(onnx, transformer_block_runs_to_onnx_runtimes_output)
{
    /* layer norm, q/k/v matmuls, transpose, attention, bias adds, residuals, gelu MLP */
    run_model("transformer_block", "x", "y", 10);
}

Test(onnx, batch_norm_is_folded_and_weights_are_params)
{
    size_t len;
    char *b = read_data("resnet_block.onnx", &len);
    fe_graph *g;
    fe_onnx_weights w;
    tlm_error err = {0};
    cr_assert_eq(fe_onnx_import(b, len, &g, &w, &err), 0, "%s", err.msg);
    free(b);
    /* no node of the graph is a batch norm: conv1's output feeds relu1 through its bias */
    int v = fe_graph_find(g, "r1");
    cr_assert(v >= 0);
    const fe_node *relu = &g->nodes[g->values[v].producer];
    cr_assert_str_eq(g->values[relu->in[0]].name, "c1");
    bool found = false;
    for (int i = 0; i < w.n; i++)
        found |= !strcmp(w.p[i].name, "c1.weight") && w.p[i].n == 8 * 3 * 3 * 3;
    cr_assert(found, "the conv weight is a param of its own");
    fe_onnx_weights_free(&w);
    fe_graph_free(g);
}

Test(onnx, bad_files_name_the_field)
{
    tlm_error e = import_err("unknown_op.onnx");
    cr_assert_eq(e.code, TLM_EUNSUPPORTED);
    cr_assert_str_eq(e.field, "onnx.graph.node[1]");
    cr_assert(strstr(e.msg, "Sin") && strstr(e.msg, "wave"), "%s", e.msg);
    e = import_err("dynamic.onnx");
    cr_assert_str_eq(e.field, "onnx.graph.input[0]");
    cr_assert(strstr(e.msg, "batch"), "%s", e.msg);
    e = import_err("huge_claim.onnx");
    cr_assert_eq(e.code, TLM_EINVAL);
    cr_assert_str_eq(e.field, "onnx.graph.initializer[0]");
    fe_graph *g = NULL;
    cr_assert_eq(fe_onnx_import("{\"not\": \"onnx\"}", 15, &g, NULL, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "onnx");
}

Test(onnx, truncated_and_corrupted_bytes_never_crash)
{
    size_t len;
    unsigned char *b = (unsigned char *)read_data("transformer_block.onnx", &len);
    unsigned char *c = malloc(len);
    int refused = 0, tries = 0;
    for (size_t cut = 0; cut < len; cut += 61, tries++) {
        fe_graph *g = NULL;
        tlm_error e = {0};
        int rc = fe_onnx_import(b, cut, &g, NULL, &e);
        if (rc) {
            refused++;
            cr_assert(!strncmp(e.field, "onnx", 4), "field %s", e.field);
        }
        fe_graph_free(g);
    }
    cr_assert_gt(refused, tries * 9 / 10, "truncations are refused");
    uint64_t s = 12345;
    for (int t = 0; t < 400; t++) {
        memcpy(c, b, len);
        for (int k = 0; k < 4; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            c[(s >> 33) % len] ^= (unsigned char)(1u << ((s >> 20) % 8));
        }
        fe_graph *g = NULL;
        fe_onnx_weights w;
        tlm_error e = {0};
        if (fe_onnx_import(c, len, &g, &w, &e) == 0) {
            /* a flip inside weight data still imports: the graph must then be usable */
            fe_fused f;
            if (fe_fuse(g, &f, &e) == 0) fe_fused_free(&f);
            fe_onnx_weights_free(&w);
        }
        fe_graph_free(g);
    }
    free(b);
    free(c);
}
