/* test_frontend.c — graphs, fusion, the model zoo (compiler/frontend). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/frontend.h"
#include "tests/common/graph_text.h"

static int from_text(const char *text, fe_graph **g, tlm_error *err)
{
    json_t *j = J(text);
    int rc = fe_graph_from_json(j, g, err);
    json_decref(j);
    return rc;
}

static fe_fused fuse_text(const char *text)
{
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(from_text(text, &g, &err), 0, "%s: %s", err.field, err.msg);
    fe_fused f;
    cr_assert_eq(fe_fuse(g, &f, &err), 0, "%s: %s", err.field, err.msg);
    fe_graph_free(g);
    return f;
}

static bool epi_is(const ir_workload *w, int n, const ir_epilogue *e)
{
    if (w->n_epilogue != n) return false;
    for (int i = 0; i < n; i++)
        if (w->epilogue[i] != e[i]) return false;
    return true;
}

/* ---- the zoo ---- */

typedef struct {
    const char *name;
    int unique;
    int64_t launches;
    double macs_ref; /* reference multiply-accumulates at the default options */
    double tol;
} zoo_case;

/* References: ResNet-50 4.1 GMACs (torchvision v1.5: 4.09), MobileNetV2 300 MMACs,
 * EfficientNet-B0 390 MMACs (0.39 "FLOPs" in the paper, which counts MACs), BERT-base encoder
 * at seq 128 11.2 GMACs, GPT-2 and LLaMA-7B params x tokens MACs (2 x params x tokens FLOPs)
 * with 124.4M and 6.7B params at 128 tokens. Our convention: macs sums the anchors of dense,
 * batch_matmul, conv2d and depthwise_conv2d (attention included). */
static const zoo_case zoo_cases[] = {
    {"resnet50", 27, 56, 4.1e9, 0.02},         {"mobilenet_v2", 32, 54, 300e6, 0.02},
    {"efficientnet_b0", 68, 115, 390e6, 0.02}, {"bert_base", 10, 181, 11.2e9, 0.01},
    {"gpt2", 11, 182, 124.4e6 * 128, 0.03},    {"llama_7b", 14, 642, 6.7e9 * 128, 0.03},
};

Test(zoo, every_model_builds_fuses_and_matches_its_known_size)
{
    int n;
    const fe_zoo_info *info = fe_zoo_list(&n);
    cr_assert_eq(n, 6);
    for (int i = 0; i < n; i++) {
        const zoo_case *zc = &zoo_cases[i];
        cr_assert_str_eq(info[i].name, zc->name);
        fe_graph *g;
        tlm_error err = {0};
        cr_assert_eq(fe_zoo_build(zc->name, NULL, &g, &err), 0, "%s: %s", err.field, err.msg);
        fe_fused f;
        cr_assert_eq(fe_fuse(g, &f, &err), 0, "%s: %s: %s", zc->name, err.field, err.msg);
        cr_expect_eq(f.n, zc->unique, "%s: %d unique subgraphs", zc->name, f.n);
        cr_expect_eq(f.launches, zc->launches, "%s: %lld launches", zc->name,
                     (long long)f.launches);
        double rel = f.macs / zc->macs_ref - 1;
        cr_expect(rel > -zc->tol && rel < zc->tol, "%s: %.4g MACs vs %.4g (%.2f%%)", zc->name,
                  (double)f.macs, zc->macs_ref, 100 * rel);
        /* FLOPs: 2 per MAC plus the epilogues, norms, softmax and pools, a few percent. */
        cr_expect(f.flops >= 2 * f.macs && f.flops < 2.1 * f.macs, "%s: %lld FLOPs, %lld MACs",
                  zc->name, (long long)f.flops, (long long)f.macs);
        int64_t sum = 0, fl = 0;
        for (int k = 0; k < f.n; k++) {
            cr_assert_gt(f.sub[k].count, 0);
            cr_assert_eq(ir_workload_check(&f.sub[k].wl, NULL), 0);
            for (int m = 0; m < k; m++)
                cr_assert_str_neq(f.sub[k].hash, f.sub[m].hash);
            sum += f.sub[k].count;
            fl += f.sub[k].count * f.sub[k].flops;
        }
        cr_expect_eq(sum, f.launches);
        cr_expect_eq(fl, f.flops);
        fe_fused_free(&f);
        fe_graph_free(g);
    }
}

static fe_fused zoo_fused(const char *name, const fe_zoo_opts *o)
{
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(fe_zoo_build(name, o, &g, &err), 0, "%s: %s", err.field, err.msg);
    fe_fused f;
    cr_assert_eq(fe_fuse(g, &f, &err), 0, "%s: %s", err.field, err.msg);
    fe_graph_free(g);
    return f;
}

Test(zoo, fused_chains_are_the_expected_ones)
{
    fe_fused r = zoo_fused("resnet50", NULL);
    ir_epilogue br[] = {IR_EPI_BIAS_ADD, IR_EPI_RELU};
    ir_epilogue bar[] = {IR_EPI_BIAS_ADD, IR_EPI_ADD, IR_EPI_RELU};
    cr_assert_eq(r.sub[0].wl.op, IR_OP_CONV2D);
    cr_expect(epi_is(&r.sub[0].wl, 2, br));
    cr_expect_eq(r.sub[0].wl.shape[IR_CONV_KH], 7);
    cr_expect_eq(r.sub[0].wl.stride[0], 2);
    cr_assert_str_eq(r.sub[4].name, "layer1.0.conv3");
    cr_expect(epi_is(&r.sub[4].wl, 3, bar), "residual add fused into conv3 + relu");
    cr_expect_eq(r.sub[4].count, 3);
    cr_expect_eq(r.sub[r.n - 1].wl.op, IR_OP_DENSE);
    fe_fused_free(&r);

    fe_fused l = zoo_fused("llama_7b", NULL);
    int gate = -1, scores = -1;
    for (int i = 0; i < l.n; i++) {
        if (strstr(l.sub[i].name, "feed_forward.w1")) gate = i;
        if (strstr(l.sub[i].name, "attention.scores")) scores = i;
    }
    cr_assert(gate >= 0 && scores >= 0);
    ir_epilogue sm[] = {IR_EPI_SILU, IR_EPI_MUL};
    cr_expect(epi_is(&l.sub[gate].wl, 2, sm), "silu(gate) * up via the mul epilogue");
    cr_expect_eq(l.sub[gate].wl.shape[IR_DENSE_N], 11008);
    cr_expect_eq(l.sub[scores].wl.op, IR_OP_BATCH_MATMUL);
    cr_expect_eq(l.sub[scores].wl.shape[IR_BMM_B], 32);
    cr_expect_eq(l.sub[scores].wl.shape[IR_BMM_K], 128);
    cr_expect(l.sub[scores].wl.transpose_a);
    fe_fused_free(&l);

    fe_fused b = zoo_fused("bert_base", NULL);
    ir_epilogue bg[] = {IR_EPI_BIAS_ADD, IR_EPI_GELU};
    bool found = false;
    for (int i = 0; i < b.n; i++)
        if (b.sub[i].wl.op == IR_OP_DENSE && b.sub[i].wl.shape[IR_DENSE_N] == 3072) {
            found = true;
            cr_expect(epi_is(&b.sub[i].wl, 2, bg));
            cr_expect_eq(b.sub[i].count, 12);
        }
    cr_expect(found);
    fe_fused_free(&b);
}

Test(zoo, options_scale_the_model_and_are_validated)
{
    fe_fused a = zoo_fused("resnet50", NULL);
    fe_zoo_opts o = {.batch = 2};
    fe_fused b = zoo_fused("resnet50", &o);
    cr_expect_eq(b.macs, 2 * a.macs);
    cr_expect_eq(b.n, a.n);
    cr_expect_eq(b.sub[0].wl.shape[IR_CONV_N], 2);
    fe_fused_free(&b);
    o = (fe_zoo_opts){.image_size = 112};
    b = zoo_fused("resnet50", &o);
    /* Not exactly a quarter: the 7x7 stem and the padding weigh more at small sizes. */
    cr_expect(b.macs < a.macs / 3.6 && b.macs > a.macs / 4.1, "%lld", (long long)b.macs);
    fe_fused_free(&b);
    fe_fused_free(&a);

    /* Batch 2 of BERT: the batched head transposes launch twice as often. */
    fe_fused t1 = zoo_fused("bert_base", NULL);
    o = (fe_zoo_opts){.batch = 2, .seq_len = 64};
    fe_fused t2 = zoo_fused("bert_base", &o);
    cr_expect_eq(t2.n, t1.n);
    cr_expect_eq(t2.launches, t1.launches + 48);
    fe_fused_free(&t1);
    fe_fused_free(&t2);

    fe_graph *g = NULL;
    tlm_error err = {0};
    cr_expect_eq(fe_zoo_build("resnet51", NULL, &g, &err), TLM_ENOTFOUND);
    cr_expect_str_eq(err.field, "name");
    o = (fe_zoo_opts){.seq_len = 64};
    cr_expect_eq(fe_zoo_build("resnet50", &o, &g, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "seq_len");
    o = (fe_zoo_opts){.seq_len = 513};
    cr_expect_eq(fe_zoo_build("bert_base", &o, &g, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "seq_len");
    o = (fe_zoo_opts){.batch = -3};
    cr_expect_eq(fe_zoo_build("gpt2", &o, &g, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "batch");
    cr_expect_null(g);

    json_t *m = J("{'name': 'mobilenet_v2', 'batch': 4, 'image_size': 160}");
    cr_assert_eq(fe_zoo_from_json(m, &g, &err), 0, "%s: %s", err.field, err.msg);
    cr_expect_eq(g->values[0].shape[0], 4);
    cr_expect_eq(g->values[0].shape[3], 160);
    fe_graph_free(g);
    json_decref(m);
    m = J("{'name': 'gpt2', 'seq_len': 'long'}");
    cr_expect_eq(fe_zoo_from_json(m, &g, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "model.seq_len");
    json_decref(m);
    m = J("{'name': 'gpt2', 'image_size': 64}");
    cr_expect_eq(fe_zoo_from_json(m, &g, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "model.image_size");
    json_decref(m);
    m = J("{'batch': 1}");
    cr_expect_eq(fe_zoo_from_json(m, &g, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "model.name");
    json_decref(m);
}

Test(zoo, list_json_names_every_model_with_its_options)
{
    json_t *l = fe_zoo_list_json();
    cr_assert(json_is_array(l));
    cr_assert_eq(json_array_size(l), 6);
    json_t *r = json_array_get(l, 0);
    cr_expect_str_eq(json_string_value(json_object_get(r, "name")), "resnet50");
    json_t *img = json_object_get(json_object_get(r, "options"), "image_size");
    cr_expect_eq(json_integer_value(json_object_get(img, "default")), 224);
    json_t *llama = json_array_get(l, 5);
    json_t *opts = json_object_get(llama, "options");
    cr_expect_null(json_object_get(opts, "image_size"));
    cr_expect_eq(json_integer_value(json_object_get(json_object_get(opts, "seq_len"), "default")),
                 128);
    json_decref(l);
}

/* Every model survives JSON out and back in with the same unique subgraphs, in order. */
Test(zoo, json_round_trip_keeps_the_fusion)
{
    int n;
    const fe_zoo_info *info = fe_zoo_list(&n);
    for (int i = 0; i < n; i++) {
        fe_graph *g, *h;
        tlm_error err = {0};
        cr_assert_eq(fe_zoo_build(info[i].name, NULL, &g, &err), 0);
        json_t *j = fe_graph_to_json(g);
        cr_assert(j);
        /* Reverse the nodes: the decoder must restore a topological order. */
        json_t *nodes = json_object_get(j, "nodes"), *rev = json_array();
        for (size_t k = json_array_size(nodes); k-- > 0;)
            json_array_append(rev, json_array_get(nodes, k));
        json_object_set_new(j, "nodes", rev);
        cr_assert_eq(fe_graph_from_json(j, &h, &err), 0, "%s: %s: %s", info[i].name, err.field,
                     err.msg);
        fe_fused a, b;
        cr_assert_eq(fe_fuse(g, &a, &err), 0);
        cr_assert_eq(fe_fuse(h, &b, &err), 0);
        /* Independent branches may come out in another order; the multiset is the same. */
        cr_assert_eq(a.n, b.n, "%s", info[i].name);
        for (int k = 0; k < a.n; k++) {
            int m = 0;
            while (m < b.n && strcmp(a.sub[k].hash, b.sub[m].hash))
                m++;
            cr_assert_lt(m, b.n, "%s: %s missing after the round trip", info[i].name,
                         a.sub[k].name);
            cr_expect_eq(a.sub[k].count, b.sub[m].count);
        }
        cr_expect_eq(a.flops, b.flops);
        fe_fused_free(&a);
        fe_fused_free(&b);
        json_decref(j);
        fe_graph_free(g);
        fe_graph_free(h);
    }
}

/* ---- fusion rules on small graphs ---- */

#define XW                                                                                         \
    "{'inputs': [{'name': 'x', 'shape': [4, 8]}, {'name': 'w', 'shape': [8, 8], "                  \
    "'param': true}, {'name': 'b', 'shape': [8], 'param': true}], "

Test(fuse, chain_stops_at_a_value_with_two_readers)
{
    /* d feeds relu and the add: bias_add joins, relu does not (two readers of the bias_add);
     * relu and then add(relu, y) form an elementwise chain. */
    fe_fused f = fuse_text(XW "'nodes': ["
                              "{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w']},"
                              "{'name': 'db', 'op': 'bias_add', 'inputs': ['d', 'b']},"
                              "{'name': 'r', 'op': 'relu', 'inputs': ['db']},"
                              "{'name': 's', 'op': 'add', 'inputs': ['r', 'db']}]}");
    cr_assert_eq(f.n, 2);
    ir_epilogue b[] = {IR_EPI_BIAS_ADD}, ra[] = {IR_EPI_RELU, IR_EPI_ADD};
    cr_expect_eq(f.sub[0].wl.op, IR_OP_DENSE);
    cr_expect(epi_is(&f.sub[0].wl, 1, b));
    cr_expect_eq(f.sub[1].wl.op, IR_OP_ELEMENTWISE);
    cr_expect_eq(f.sub[1].wl.shape[IR_EW_N], 32);
    cr_expect(epi_is(&f.sub[1].wl, 2, ra));
    fe_fused_free(&f);
}

Test(fuse, declared_outputs_and_views_end_chains)
{
    fe_fused f = fuse_text(XW "'nodes': ["
                              "{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w']},"
                              "{'name': 'r', 'op': 'relu', 'inputs': ['d']}],"
                              "'outputs': ['d', 'r']}");
    cr_assert_eq(f.n, 2);
    cr_expect_eq(f.sub[0].wl.n_epilogue, 0);
    cr_expect_eq(f.sub[1].wl.op, IR_OP_ELEMENTWISE);
    fe_fused_free(&f);

    f = fuse_text(XW "'nodes': ["
                     "{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w']},"
                     "{'name': 'v', 'op': 'reshape', 'inputs': ['d'], 'attrs': {'shape': [32]}},"
                     "{'name': 'r', 'op': 'gelu', 'inputs': ['v']},"
                     "{'name': 'f', 'op': 'flatten', 'inputs': ['r'], 'attrs': {'axis': 0}}]}");
    cr_assert_eq(f.n, 2);
    cr_expect_eq(f.sub[1].wl.op, IR_OP_ELEMENTWISE);
    fe_fused_free(&f);
}

Test(fuse, residual_on_the_second_operand_and_deduplication)
{
    /* add(y, d2): y is a graph input, so the chain of d2 takes the add. The two dense+add
     * subgraphs are the same workload: one entry with count 2. */
    fe_fused f = fuse_text(XW "'nodes': ["
                              "{'name': 'd1', 'op': 'dense', 'inputs': ['x', 'w']},"
                              "{'name': 'a1', 'op': 'add', 'inputs': ['x', 'd1']},"
                              "{'name': 'd2', 'op': 'dense', 'inputs': ['a1', 'w']},"
                              "{'name': 'a2', 'op': 'add', 'inputs': ['d2', 'a1']}]}");
    cr_assert_eq(f.n, 1);
    cr_expect_eq(f.sub[0].count, 2);
    cr_expect_str_eq(f.sub[0].name, "d1");
    ir_epilogue a[] = {IR_EPI_ADD};
    cr_expect(epi_is(&f.sub[0].wl, 1, a));
    cr_expect_eq(f.macs, 2 * 4 * 8 * 8);
    fe_fused_free(&f);
}

Test(fuse, const_args_name_the_weights_every_launch_binds)
{
    /* resnet50: a conv's weight and bias are params (bits 1, 2); the residual operand and the
     * pools' inputs are activations */
    fe_fused r = zoo_fused("resnet50", NULL);
    cr_assert_str_eq(r.sub[4].name, "layer1.0.conv3");
    cr_expect_eq(r.sub[0].const_args, 0x6u, "conv1: 0x%x", r.sub[0].const_args);
    cr_expect_eq(r.sub[1].wl.op, IR_OP_MAX_POOL2D);
    cr_expect_eq(r.sub[1].const_args, 0u);
    cr_expect_eq(r.sub[4].const_args, 0x6u, "conv3 + add: 0x%x", r.sub[4].const_args);
    cr_expect_eq(r.sub[r.n - 1].wl.op, IR_OP_DENSE);
    cr_expect_eq(r.sub[r.n - 1].const_args, 0x6u);
    fe_fused_free(&r);

    /* the same dense workload twice: once on the param w, once on an input y as its right
     * operand; a kernel's const_args hold for every launch, so nothing here (and x is an
     * input in both); the dense + gelu kernel binds w alone */
    fe_fused f = fuse_text("{'inputs': [{'name': 'x', 'shape': [4, 8]}, {'name': 'w', "
                           "'shape': [8, 8], 'param': true}, {'name': 'y', 'shape': [8, 8]}], "
                           "'nodes': ["
                           "{'name': 'd1', 'op': 'dense', 'inputs': ['x', 'w']},"
                           "{'name': 'd2', 'op': 'dense', 'inputs': ['x', 'y']},"
                           "{'name': 'd3', 'op': 'dense', 'inputs': ['x', 'w']},"
                           "{'name': 'g', 'op': 'gelu', 'inputs': ['d3']}], "
                           "'outputs': ['d1', 'd2', 'g']}");
    int plain = -1;
    for (int i = 0; i < f.n; i++)
        if (f.sub[i].wl.op == IR_OP_DENSE && f.sub[i].wl.n_epilogue == 0) plain = i;
    cr_assert(plain >= 0);
    cr_expect_eq(f.sub[plain].count, 2, "d1 and d2 are one kernel");
    cr_expect_eq(f.sub[plain].const_args, 0u, "d2 binds the input y: 0x%x",
                 f.sub[plain].const_args);
    for (int i = 0; i < f.n; i++)
        if (f.sub[i].wl.n_epilogue == 1) cr_expect_eq(f.sub[i].const_args, 0x2u);
    fe_fused_free(&f);
}

Test(fuse, long_chains_spill_into_an_elementwise_subgraph)
{
    char text[4096];
    size_t k = snprintf(text, sizeof text,
                        XW "'nodes': [{'name': 'n0', 'op': 'dense', 'inputs': ['x', 'w']}");
    for (int i = 1; i <= 10; i++)
        k += snprintf(text + k, sizeof text - k,
                      ", {'name': 'n%d', 'op': 'tanh', "
                      "'inputs': ['n%d']}",
                      i, i - 1);
    snprintf(text + k, sizeof text - k, "]}");
    fe_fused f = fuse_text(text);
    cr_assert_eq(f.n, 2);
    cr_expect_eq(f.sub[0].wl.n_epilogue, IR_MAX_EPILOGUE);
    cr_expect_eq(f.sub[1].wl.op, IR_OP_ELEMENTWISE);
    cr_expect_eq(f.sub[1].wl.n_epilogue, 10 - IR_MAX_EPILOGUE);
    fe_fused_free(&f);
}

Test(fuse, batched_transpose_counts_launches)
{
    fe_fused f = fuse_text("{'inputs': [{'name': 'x', 'shape': [2, 3, 5, 7]}], 'nodes': ["
                           "{'name': 't', 'op': 'transpose', 'inputs': ['x']}]}");
    cr_assert_eq(f.n, 1);
    cr_expect_eq(f.sub[0].count, 6);
    cr_expect_eq(f.sub[0].wl.shape[IR_ROW_R], 5);
    cr_expect_eq(f.sub[0].wl.shape[IR_ROW_C], 7);
    fe_fused_free(&f);
}

Test(fuse, bias_add_fuses_only_along_the_channel_axis)
{
    const char *pre = "{'inputs': [{'name': 'x', 'shape': [1, 4, 6, 6]}, "
                      "{'name': 'w', 'shape': [8, 4, 3, 3]}, {'name': 'b', 'shape': [8]}], ";
    char text[1024];
    snprintf(text, sizeof text,
             "%s'nodes': [{'name': 'c', 'op': 'conv2d', 'inputs': ['x', 'w'],"
             " 'attrs': {'pad': [1, 1]}}, {'name': 'cb', 'op': 'bias_add', 'inputs': ['c', 'b']}]}",
             pre);
    fe_fused f = fuse_text(text);
    cr_assert_eq(f.n, 1);
    cr_expect_eq(f.sub[0].wl.n_epilogue, 1);
    fe_fused_free(&f);

    /* A bias along the last axis of an NCHW conv output (W = 8 here) cannot be fused, and a
     * standalone broadcasting bias_add does not exist in the IR. */
    snprintf(text, sizeof text,
             "%s'nodes': [{'name': 'c', 'op': 'conv2d', 'inputs': ['x', 'w'],"
             " 'attrs': {'pad': [2, 2]}}, {'name': 'cb', 'op': 'bias_add', 'inputs': ['c', 'b'],"
             " 'attrs': {'layout': 'NHWC'}}]}",
             pre);
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(from_text(text, &g, &err), 0, "%s: %s", err.field, err.msg);
    cr_expect_eq(g->values[fe_graph_find(g, "c")].shape[3], 8);
    fe_fused ff;
    cr_expect_eq(fe_fuse(g, &ff, &err), TLM_EUNSUPPORTED);
    cr_expect_str_eq(err.field, "nodes[1]");
    cr_expect_eq(ff.n, 0);
    fe_graph_free(g);
}

Test(graph, shape_inference)
{
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(from_text("{'inputs': [{'name': 'x', 'shape': [1, 8, 8, 3]},"
                           "{'name': 'w', 'shape': [3, 3, 3, 16]}],"
                           "'nodes': [{'name': 'c', 'op': 'conv2d', 'inputs': ['x', 'w'],"
                           " 'attrs': {'layout': 'NHWC', 'stride': [2, 2], 'pad': [1, 1]}},"
                           "{'name': 'p', 'op': 'max_pool2d', 'inputs': ['c'],"
                           " 'attrs': {'layout': 'NHWC', 'kernel': [2, 2]}},"
                           "{'name': 'g', 'op': 'global_avg_pool2d', 'inputs': ['p'],"
                           " 'attrs': {'layout': 'NHWC'}},"
                           "{'name': 'f', 'op': 'reshape', 'inputs': ['g'],"
                           " 'attrs': {'shape': [-1, 4]}},"
                           "{'name': 's', 'op': 'reduce_sum', 'inputs': ['f']}]}",
                           &g, &err),
                 0, "%s: %s", err.field, err.msg);
    const fe_value *c = &g->values[fe_graph_find(g, "c")];
    cr_expect(c->ndim == 4 && c->shape[1] == 4 && c->shape[2] == 4 && c->shape[3] == 16);
    const fe_value *p = &g->values[fe_graph_find(g, "p")];
    cr_expect(p->shape[1] == 2 && p->shape[3] == 16);
    cr_expect_eq(g->nodes[1].wl.stride[0], 2, "a pool's stride defaults to its window");
    const fe_value *gv = &g->values[fe_graph_find(g, "g")];
    cr_expect(gv->ndim == 2 && gv->shape[1] == 16);
    const fe_value *f = &g->values[fe_graph_find(g, "f")];
    cr_expect(f->ndim == 2 && f->shape[0] == 4 && f->shape[1] == 4);
    const fe_value *s = &g->values[fe_graph_find(g, "s")];
    cr_expect(s->ndim == 1 && s->shape[0] == 4);
    fe_graph_free(g);
}

/* ---- bad graphs ---- */

typedef struct {
    const char *json;
    int code;
    const char *field;
    const char *says; /* a piece of the message */
} bad_case;

#define IN2 "{'inputs': [{'name': 'x', 'shape': [4, 8]}, {'name': 'w', 'shape': [8, 3]}], "

static const bad_case bad_cases[] = {
    {"[1, 2]", TLM_EINVAL, "", "object"},
    {"{'inputs': [{'name': 'x', 'shape': [4]}]}", TLM_EINVAL, "nodes", "required"},
    {IN2 "'nodes': [], 'weights': []}", TLM_EINVAL, "weights", "unknown field"},
    {"{'inputs': [{'name': 'x', 'shape': [4, 0]}], 'nodes': []}", TLM_EINVAL, "inputs[0].shape",
     "dimension 1"},
    {"{'inputs': [{'name': 'x'}], 'nodes': []}", TLM_EINVAL, "inputs[0].shape", "required"},
    {"{'inputs': [{'name': 'x', 'shape': [4], 'dtype': 'int8'}], 'nodes': []}", TLM_EUNSUPPORTED,
     "inputs[0].dtype", "int8"},
    {IN2 "'nodes': [{'name': 'x', 'op': 'relu', 'inputs': ['w']}]}", TLM_EINVAL, "nodes[0].name",
     "duplicate"},
    {IN2 "'nodes': [{'name': 'a', 'op': 'relu', 'inputs': ['x']},"
         "{'name': 'b', 'op': 'add', 'inputs': ['a', 'y']}]}",
     TLM_EINVAL, "nodes[1].inputs[1]", "unknown input name \"y\""},
    {IN2 "'nodes': [{'name': 'a', 'op': 'conv3d', 'inputs': ['x']}]}", TLM_EUNSUPPORTED,
     "nodes[0].op", "conv3d"},
    {IN2 "'nodes': [{'name': 'a', 'op': 'relu', 'inputs': ['b']},"
         "{'name': 'b', 'op': 'tanh', 'inputs': ['a']}]}",
     TLM_EINVAL, "nodes[0].inputs[0]", "cycle"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['w', 'x']}]}", TLM_EINVAL,
     "nodes[0].inputs[1]", "K=4"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w']},"
         "{'name': 'e', 'op': 'add', 'inputs': ['d', 'x']}]}",
     TLM_EINVAL, "nodes[1].inputs[1]", "no broadcasting"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w'], "
         "'attrs': {'stride': [1, 1]}}]}",
     TLM_EINVAL, "nodes[0].attrs.stride", "transpose_a"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w'], "
         "'attrs': {'alpha': 1}}]}",
     TLM_EINVAL, "nodes[0].attrs.alpha", "unknown attribute"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['x']}]}", TLM_EINVAL, "nodes[0].inputs",
     "takes 2 inputs"},
    {IN2 "'nodes': [{'name': 'r', 'op': 'reshape', 'inputs': ['x'], "
         "'attrs': {'shape': [5, -1]}}]}",
     TLM_EINVAL, "nodes[0].attrs.shape", "element count"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w']},"
         "{'name': 'e', 'op': 'bias_add', 'inputs': ['d', 'x']}]}",
     TLM_EINVAL, "nodes[1].inputs[1]", "1-D"},
    {IN2 "'nodes': [{'name': 'd', 'op': 'relu', 'inputs': ['x']}], 'outputs': ['q']}", TLM_EINVAL,
     "outputs[0]", "unknown"},
    {"{'inputs': [{'name': 'x', 'shape': [1, 3, 8, 8]}], "
     "'nodes': [{'name': 'p', 'op': 'max_pool2d', 'inputs': ['x']}]}",
     TLM_EINVAL, "nodes[0].attrs.kernel", "window"},
    {"{'inputs': [{'name': 'x', 'shape': [1, 3, 8, 8]}, {'name': 'w', 'shape': [4, 3, 3, 3]}], "
     "'nodes': [{'name': 'c', 'op': 'conv2d', 'inputs': ['x', 'w'], "
     "'attrs': {'stride': [0, 1]}}]}",
     TLM_EINVAL, "nodes[0].attrs.stride[0]", "[1, 65536]"},
    {"{'inputs': [{'name': 'x', 'shape': [1, 3, 8, 8]}, {'name': 'w', 'shape': [4, 3, 3, 3]}], "
     "'nodes': [{'name': 'c', 'op': 'conv2d', 'inputs': ['x', 'w'], "
     "'attrs': {'groups': 2}}]}",
     TLM_EINVAL, "nodes[0].attrs.groups", "divide"},
    {"{'inputs': [{'name': 'x', 'shape': [1, 3, 2, 2]}, {'name': 'w', 'shape': [4, 3, 3, 3]}], "
     "'nodes': [{'name': 'c', 'op': 'conv2d', 'inputs': ['x', 'w']}]}",
     TLM_EINVAL, "nodes[0]", "empty"},
    {"{'inputs': [{'name': 'x', 'shape': [4, 8]}, {'name': 'w', 'shape': [8, 3], "
     "'dtype': 'float16'}], 'nodes': [{'name': 'd', 'op': 'dense', 'inputs': ['x', 'w']}]}",
     TLM_EINVAL, "nodes[0].inputs[1]", "float16"},
    {IN2 "'nodes': [{'name': 'n', 'op': 'layer_norm', 'inputs': ['x', 'w', 'w']}]}", TLM_EINVAL,
     "nodes[0].inputs[1]", "[8]"},
    {IN2 "'nodes': [{'name': 'n', 'op': 'softmax', 'inputs': ['x'], "
         "'attrs': {'layout': 'NCDHW'}}]}",
     TLM_EUNSUPPORTED, "nodes[0].attrs.layout", "NCDHW"},
    {IN2 "'nodes': [{'name': 'n', 'op': 'transpose', 'inputs': [3]}]}", TLM_EINVAL,
     "nodes[0].inputs[0]", "name"},
    {"{'inputs': [{'name': 'x', 'shape': [4, 8]}, {'name': 'w', 'shape': [8]}], "
     "'nodes': [{'name': 'n', 'op': 'rms_norm', 'inputs': ['x', 'w'], 'attrs': {'eps': 2}}]}",
     TLM_EINVAL, "nodes[0].attrs.eps", "rms_norm: must be a number in (0, 1]"},
};

Test(graph, bad_graphs_get_field_level_errors)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof *bad_cases; i++) {
        const bad_case *bc = &bad_cases[i];
        fe_graph *g = (fe_graph *)1;
        tlm_error err = {0};
        int rc = from_text(bc->json, &g, &err);
        cr_expect_eq(rc, bc->code, "case %zu: rc %d (%s: %s)", i, rc, err.field, err.msg);
        cr_expect_str_eq(err.field, bc->field, "case %zu: field \"%s\" (%s)", i, err.field,
                         err.msg);
        cr_expect(strstr(err.msg, bc->says), "case %zu: message \"%s\" lacks \"%s\"", i, err.msg,
                  bc->says);
        cr_expect_null(g, "case %zu", i);
    }
}

Test(graph, builder_reports_the_same_fields)
{
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(fe_graph_new("t", &g), 0);
    int64_t xs[2] = {4, 8}, ws[2] = {8, 3};
    cr_assert_eq(fe_graph_add_input(g, "x", 2, xs, IR_FLOAT32, false, &err), 0);
    cr_assert_eq(fe_graph_add_input(g, "w", 2, ws, IR_FLOAT32, true, &err), 1);
    cr_expect_eq(fe_graph_add_input(g, "w", 2, ws, IR_FLOAT32, true, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "inputs[2].name");
    const char *in[2] = {"x", "w"};
    cr_assert_eq(fe_graph_add_node(g, "d", "matmul", 2, in, NULL, &err), 2);
    const char *bad[2] = {"d", "nope"};
    cr_expect_eq(fe_graph_add_node(g, "e", "add", 2, bad, NULL, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "nodes[1].inputs[1]");
    fe_attrs a = {.set = FE_A_GROUPS, .groups = 2};
    cr_expect_eq(fe_graph_add_node(g, "e", "relu", 1, in, &a, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "nodes[1].attrs.groups");
    cr_expect_eq(g->n_nodes, 1, "a failed add leaves the graph unchanged");
    cr_expect_eq(fe_graph_find(g, "e"), -1);
    cr_expect_eq(g->values[2].shape[1], 3);
    fe_graph_free(g);
}
