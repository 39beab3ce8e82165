/* test_plan.c — launches with argument bindings (fuse.c) and the execution plan (plan.c). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/frontend.h"
#include "tests/common/graph_text.h"

typedef struct {
    fe_graph *g;
    fe_fused f;
    fe_plan p;
} planned;

/* in_place_above: fe_plan_build's (0: every output may be written in place) */
static planned plan_graph_above(fe_graph *g, int64_t in_place_above)
{
    planned r = {.g = g};
    tlm_error err = {0};
    cr_assert_eq(fe_fuse(g, &r.f, &err), 0, "%s: %s", err.field, err.msg);
    cr_assert_eq(fe_plan_build(g, &r.f, in_place_above, &r.p, &err), 0, "%s: %s", err.field,
                 err.msg);
    return r;
}

static planned plan_graph(fe_graph *g)
{
    return plan_graph_above(g, 0);
}

static planned plan_text(const char *text)
{
    return plan_graph(graph_from_text(text));
}

static void planned_free(planned *r)
{
    fe_plan_free(&r->p);
    fe_fused_free(&r->f);
    fe_graph_free(r->g);
}

static const char *vname(const planned *r, int v)
{
    return r->g->values[v].name;
}

static int tensor_of(const planned *r, const char *name)
{
    for (int i = 0; i < r->p.n_tensor; i++)
        if (!strcmp(vname(r, r->p.tensor[i].value), name)) return i;
    return -1;
}

/* The invariants every plan must keep, checked by brute force:
 *  - launches are topological: each argument read is an input/param or written earlier;
 *  - every tensor lies inside the arena, aligned; views share their target's offset;
 *  - two tensors whose bytes overlap never live at the same time (so no launch's output
 *    overwrites a value still to be read, and no output overlaps its own inputs), except
 *    an output written in place: it takes the bytes of an intermediate of its size that its
 *    own launch reads last (once, as an argument no other one shares), and lives within
 *    that one's life, now extended over its own. */
static void check_invariants(const planned *r)
{
    const fe_plan *p = &r->p;
    int *written = calloc(r->g->n_values, sizeof *written);
    for (int v = 0; v < r->g->n_values; v++)
        written[v] = r->g->values[v].producer < 0 ? -2 : -1;
    for (int i = 0; i < r->f.n_launch; i++) {
        const fe_launch *L = &r->f.launch[i];
        for (int a = 0; a < L->n_args - 1; a++) {
            int v = L->args[a];
            /* a view reads what its target holds */
            while (r->g->values[v].producer >= 0 &&
                   r->g->nodes[r->g->values[v].producer].kind == FE_NODE_VIEW)
                v = r->g->nodes[r->g->values[v].producer].in[0];
            cr_assert(written[v] != -1, "launch %d (%s) reads %s before it is written", i,
                      vname(r, r->g->nodes[L->node].out), vname(r, v));
        }
        written[L->args[L->n_args - 1]] = i;
    }
    free(written);
    for (int i = 0; i < p->n_tensor; i++) {
        const fe_plan_tensor *t = &p->tensor[i];
        cr_assert(t->offset >= 0 && t->offset % FE_PLAN_ALIGN == 0);
        cr_assert(t->offset + t->bytes <= p->arena_bytes);
        if (t->alias >= 0) {
            cr_assert_eq(t->offset, p->tensor[t->alias].offset);
            cr_assert_eq(p->tensor[t->alias].alias, -1, "views resolve to a non-view");
            continue;
        }
        if (t->reuses >= 0) {
            const fe_plan_tensor *u = &p->tensor[t->reuses];
            cr_assert(u->alias < 0 && u->reuses < 0);
            cr_assert_eq(t->offset, u->offset);
            cr_assert_eq(t->bytes, u->bytes);
            cr_assert(t->kind == FE_T_INTERMEDIATE && u->kind == FE_T_INTERMEDIATE);
            cr_assert(u->first < t->first && t->last <= u->last);
            const fe_launch *L = &r->f.launch[t->first];
            int reads = 0;
            for (int a = 0; a < L->n_args - 1; a++) {
                int v = L->args[a];
                while (r->g->values[v].producer >= 0 &&
                       r->g->nodes[r->g->values[v].producer].kind == FE_NODE_VIEW)
                    v = r->g->nodes[r->g->values[v].producer].in[0];
                int k = 0;
                while (k < p->n_tensor && p->tensor[k].value != v)
                    k++;
                cr_assert(k < p->n_tensor);
                if (p->tensor[k].reuses >= 0) k = p->tensor[k].reuses;
                reads += k == t->reuses;
            }
            cr_assert_eq(reads, 1, "%s is written over %s, which its launch reads once",
                         vname(r, t->value), vname(r, u->value));
            for (int j = t->first + 1; j < r->f.n_launch; j++)
                for (int a = 0; a < r->f.launch[j].n_args; a++)
                    cr_assert_neq(r->f.launch[j].args[a], u->value,
                                  "%s is read after %s was written over it", vname(r, u->value),
                                  vname(r, t->value));
            continue;
        }
        for (int k = 0; k < i; k++) {
            const fe_plan_tensor *u = &p->tensor[k];
            if (u->alias >= 0 || u->reuses >= 0) continue;
            bool bytes = t->offset < u->offset + u->bytes && u->offset < t->offset + t->bytes;
            bool time = t->first <= u->last && u->first <= t->last;
            cr_assert(!(bytes && time), "%s and %s share bytes while both live", vname(r, t->value),
                      vname(r, u->value));
        }
    }
}

Test(plan, bindings_follow_the_kernel_abi)
{
    planned r = plan_text("{'inputs': [{'name': 'x', 'shape': [4, 2, 16]},"
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
                          "  {'name': 'res', 'op': 'add', 'inputs': ['r', 'r']}]}");
    cr_assert_eq(r.f.n_launch, 4);
    /* dense(x, w1) + bias_add(b1) + gelu → args x, w1, b1, then the chain's tail act */
    const fe_launch *L = &r.f.launch[0];
    cr_assert_eq(L->n_args, 4);
    cr_assert_str_eq(vname(&r, L->args[0]), "x");
    cr_assert_str_eq(vname(&r, L->args[1]), "w1");
    cr_assert_str_eq(vname(&r, L->args[2]), "b1");
    cr_assert_str_eq(vname(&r, L->args[3]), "act");
    /* the batched transpose: 4 repeats over slices of 2x32 */
    L = &r.f.launch[1];
    cr_assert_eq(L->repeat, 4);
    cr_assert_eq(L->step[0], 64);
    cr_assert_eq(L->step[1], 64);
    cr_assert_str_eq(vname(&r, L->args[1]), "t");
    /* the view r reads t's bytes */
    int ti = tensor_of(&r, "t"), ri = tensor_of(&r, "r");
    cr_assert(ti >= 0 && ri >= 0);
    cr_assert_eq(r.p.tensor[ri].alias, ti);
    /* values fused away have no storage */
    cr_assert_eq(tensor_of(&r, "fc1"), -1);
    cr_assert_eq(tensor_of(&r, "bias"), -1);
    /* kinds */
    cr_assert_eq(r.p.tensor[tensor_of(&r, "x")].kind, FE_T_INPUT);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "w2")].kind, FE_T_PARAM);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "act")].kind, FE_T_INTERMEDIATE);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "fc2")].kind, FE_T_OUTPUT);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "res")].kind, FE_T_OUTPUT);
    check_invariants(&r);

    json_t *j = fe_plan_to_json(r.g, &r.f, &r.p);
    cr_assert_not_null(j);
    json_t *l1 = json_array_get(json_object_get(j, "launches"), 1);
    cr_assert_str_eq(json_string_value(json_object_get(l1, "op")), "transpose");
    cr_assert_eq(json_integer_value(json_object_get(l1, "repeat")), 4);
    cr_assert_eq(json_array_size(json_object_get(l1, "steps")), 2);
    json_t *rt = json_array_get(json_object_get(j, "tensors"), ri);
    cr_assert_str_eq(json_string_value(json_object_get(rt, "alias_of")), "t");
    cr_assert_eq(json_array_size(json_object_get(j, "outputs")), 2);
    json_decref(j);
    planned_free(&r);
}

Test(plan, a_residual_produced_later_orders_the_launches)
{
    /* a = dense(x, w) is the first anchor; add(a, b) joins a's chain but reads b, whose
     * anchor comes after a's: a's launch must run after b's. */
    planned r = plan_text("{'inputs': [{'name': 'x', 'shape': [8, 8]},"
                          " {'name': 'w', 'shape': [8, 8], 'param': true},"
                          " {'name': 'v', 'shape': [8, 8], 'param': true}],"
                          " 'nodes': ["
                          "  {'name': 'a', 'op': 'dense', 'inputs': ['x', 'w']},"
                          "  {'name': 'b', 'op': 'dense', 'inputs': ['x', 'v']},"
                          "  {'name': 's', 'op': 'add', 'inputs': ['a', 'b']}]}");
    cr_assert_eq(r.f.n_launch, 2);
    cr_assert_str_eq(vname(&r, r.f.launch[0].args[2]), "b");
    cr_assert_str_eq(vname(&r, r.f.launch[1].args[3]), "s");
    cr_assert_str_eq(vname(&r, r.f.launch[1].args[2]), "b", "the residual is the 3rd input");
    check_invariants(&r);
    planned_free(&r);
}

Test(plan, dead_intermediates_are_reused)
{
    /* a chain of 6 relu'd dense layers: each activation dies after the next layer, so the
     * arena holds the params, the input, the output and two activations at a time */
    fe_graph *g;
    cr_assert_eq(fe_graph_new("chain", &g), 0);
    tlm_error err = {0};
    int64_t xs[2] = {64, 256}, ws[2] = {256, 256};
    cr_assert(fe_graph_add_input(g, "x", 2, xs, IR_FLOAT32, false, &err) >= 0);
    cr_assert(fe_graph_add_input(g, "w", 2, ws, IR_FLOAT32, true, &err) >= 0);
    const char *prev = "x";
    char names[12][16];
    for (int i = 0; i < 6; i++) {
        snprintf(names[2 * i], 16, "d%d", i);
        snprintf(names[2 * i + 1], 16, "r%d", i);
        const char *in[2] = {prev, "w"};
        cr_assert(fe_graph_add_node(g, names[2 * i], "dense", 2, in, NULL, &err) >= 0, "%s",
                  err.msg);
        const char *act_in[1] = {names[2 * i]};
        cr_assert(fe_graph_add_node(g, names[2 * i + 1], "relu", 1, act_in, NULL, &err) >= 0);
        prev = names[2 * i + 1];
    }
    planned r = plan_graph(g);
    check_invariants(&r);
    int64_t act = 64 * 256 * 4;
    cr_assert_eq(r.p.unshared_bytes, 256 * 256 * 4 + 7 * act);
    cr_assert_eq(r.p.arena_bytes, 256 * 256 * 4 + 4 * act, "arena %lld",
                 (long long)r.p.arena_bytes);
    planned_free(&r);
}

/* Four 1x1 convs over 8 x 16 x 16; the third's output adds the first's ("r0") unless
 * `tail` reads it again (after the add, or as the add's conv input). */
static planned residual_block(const char *tail, int64_t in_place_above)
{
    char text[2048];
    snprintf(text, sizeof text,
             "{'inputs': [{'name': 'x', 'shape': [1, 8, 16, 16]},"
             " {'name': 'w', 'shape': [8, 8, 1, 1], 'param': true}],"
             " 'nodes': ["
             "  {'name': 'c0', 'op': 'conv2d', 'inputs': ['x', 'w']},"
             "  {'name': 'r0', 'op': 'relu', 'inputs': ['c0']},"
             "  {'name': 'c1', 'op': 'conv2d', 'inputs': ['r0', 'w']},"
             "  {'name': 'r1', 'op': 'relu', 'inputs': ['c1']},"
             "  {'name': 'c2', 'op': 'conv2d', 'inputs': ['%s', 'w']},"
             "  {'name': 's', 'op': 'add', 'inputs': ['c2', 'r0']},"
             "  {'name': 'r2', 'op': 'relu', 'inputs': ['s']},"
             "  {'name': 'c3', 'op': 'conv2d', 'inputs': ['r2', 'w']}%s]}",
             strcmp(tail, "conv input") ? "r1" : "r0",
             strcmp(tail, "read later")
                 ? ""
                 : ", {'name': 'late', 'op': 'add', 'inputs': ['c3', 'r0']}");
    return plan_graph_above(graph_from_text(text), in_place_above);
}

Test(plan, a_residual_dying_at_its_add_is_written_over)
{
    planned r = residual_block("", 0);
    check_invariants(&r);
    int r0 = tensor_of(&r, "r0"), r2 = tensor_of(&r, "r2");
    cr_assert(r0 >= 0 && r2 >= 0);
    cr_assert_eq(r.p.tensor[r2].reuses, r0, "c2 + r0 written over r0");
    cr_assert_eq(r.p.tensor[r2].offset, r.p.tensor[r0].offset);
    cr_assert_eq(r.p.tensor[r0].last, r.p.tensor[r2].last, "r0's bytes live as long as r2");
    cr_assert_eq(r.p.tensor[tensor_of(&r, "r1")].reuses, -1, "c1 has no residual");
    json_t *j = fe_plan_to_json(r.g, &r.f, &r.p);
    json_t *ts = json_object_get(j, "tensors"), *t;
    size_t k;
    int named = 0;
    json_array_foreach(ts, k, t)
    {
        const char *n = json_string_value(json_object_get(t, "name"));
        const char *of = json_string_value(json_object_get(t, "in_place_of"));
        named += of != NULL;
        if (of) cr_assert(!strcmp(n, "r2") && !strcmp(of, "r0"), "%s in place of %s", n, of);
    }
    cr_assert_eq(named, 1);
    json_decref(j);
    planned_free(&r);

    /* not past the bound: the 8 KiB output is no larger than 8 KiB */
    r = residual_block("", 8 * 16 * 16 * 4);
    check_invariants(&r);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "r2")].reuses, -1);
    planned_free(&r);
    r = residual_block("", 8 * 16 * 16 * 4 - 1);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "r2")].reuses, tensor_of(&r, "r0"));
    planned_free(&r);
    r = residual_block("", -1);
    cr_assert_eq(r.p.tensor[tensor_of(&r, "r2")].reuses, -1, "negative: never");
    planned_free(&r);
}

Test(plan, a_residual_read_again_is_not_written_over)
{
    static const char *const tails[] = {"read later", "conv input"};
    for (int i = 0; i < 2; i++) {
        planned r = residual_block(tails[i], 0);
        check_invariants(&r);
        for (int t = 0; t < r.p.n_tensor; t++)
            cr_assert_eq(r.p.tensor[t].reuses, -1, "%s: %s written in place", tails[i],
                         vname(&r, r.p.tensor[t].value));
        planned_free(&r);
    }
}

Test(plan, zoo_plans_keep_the_invariants)
{
    static const char *const models[] = {"resnet50", "mobilenet_v2", "efficientnet_b0", "bert_base",
                                         "gpt2"};
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        fe_graph *g;
        tlm_error err = {0};
        fe_zoo_opts o = {0};
        if (!strcmp(models[m], "bert_base") || !strcmp(models[m], "gpt2")) o.seq_len = 32;
        cr_assert_eq(fe_zoo_build(models[m], &o, &g, &err), 0, "%s", err.msg);
        planned r = plan_graph(g);
        check_invariants(&r);
        int64_t launches = 0;
        for (int i = 0; i < r.f.n_launch; i++)
            launches += r.f.launch[i].repeat;
        cr_assert_eq(launches, r.f.launches, "%s: the launches add up to the fused count",
                     models[m]);
        cr_assert_lt(r.p.arena_bytes, r.p.unshared_bytes, "%s: some bytes are reused", models[m]);
        planned_free(&r);
    }
}

Test(plan, resnet50_has_56_launches_and_one_output)
{
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(fe_zoo_build("resnet50", &(fe_zoo_opts){0}, &g, &err), 0, "%s", err.msg);
    planned r = plan_graph(g);
    cr_assert_eq(r.f.n_launch, 56);
    int outs = 0, params = 0;
    for (int i = 0; i < r.p.n_tensor; i++) {
        outs += r.p.tensor[i].kind == FE_T_OUTPUT;
        params += r.p.tensor[i].kind == FE_T_PARAM;
    }
    cr_assert_eq(outs, 1);
    cr_assert_eq(params, 2 * 53 + 2, "53 convs (weight + folded-BN bias) and the fc");
    int in_place = 0;
    for (int i = 0; i < r.p.n_tensor; i++)
        in_place += r.p.tensor[i].reuses >= 0;
    cr_assert_eq(in_place, 16, "each bottleneck's conv3 written over its residual");
    planned_free(&r);
}
