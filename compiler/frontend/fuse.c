/* fuse.c — a checked graph → subgraphs (anchor + epilogue chain) → unique workloads.
 *
 * One pass in topological order: anchors open a group, epilogue ops extend the group whose
 * tail produced their input when nothing else reads that value. Deduplication by workload
 * hash happens once every group is final, in group order, so "first seen" is the order of
 * the anchors in the graph. */
#include "compiler/frontend/frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    ir_workload wl;
    int64_t count;
    int tail;   /* value produced by the group's last node */
    int anchor; /* node index */
    int last;   /* node index of the group's last node: groups run in this order */
    int n_args; /* the kernel's inputs so far (value indices, ABI order); the tail comes last */
    int args[IR_MAX_TENSORS];
} group;

int64_t fe_workload_macs(const ir_workload *w)
{
    const int64_t *s = w->shape;
    switch (w->op) {
    case IR_OP_DENSE:
        return s[IR_DENSE_M] * s[IR_DENSE_N] * s[IR_DENSE_K];
    case IR_OP_BATCH_MATMUL:
        return s[IR_BMM_B] * s[IR_BMM_M] * s[IR_BMM_N] * s[IR_BMM_K];
    case IR_OP_CONV2D:
    case IR_OP_DEPTHWISE_CONV2D: {
        int64_t oh, ow;
        ir_workload_out_hw(w, &oh, &ow);
        if (w->op == IR_OP_CONV2D)
            return s[IR_CONV_N] * s[IR_CONV_F] * oh * ow * (s[IR_CONV_C] / w->groups) *
                   s[IR_CONV_KH] * s[IR_CONV_KW];
        return s[IR_DW_N] * s[IR_DW_C] * oh * ow * s[IR_DW_KH] * s[IR_DW_KW];
    }
    default:
        return 0;
    }
}

/* Can a bias_add node with input value v join group gr? The bias must run along the axis the
 * IR's bias_add uses for the group's op (ir.h: N for matmuls, F/C for convs and pools, the
 * last axis otherwise), and that must be the axis the graph node adds along. */
static bool bias_fits(const fe_graph *g, const group *gr, const fe_node *e, int v)
{
    int nd = g->values[v].ndim;
    bool nhwc_attr = (e->attrs.set & FE_A_LAYOUT) && e->attrs.layout == IR_NHWC;
    switch (gr->wl.op) {
    case IR_OP_CONV2D:
    case IR_OP_DEPTHWISE_CONV2D:
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D:
        return nd == 4 && (gr->wl.layout == IR_NHWC) == nhwc_attr;
    case IR_OP_ELEMENTWISE:
    case IR_OP_REDUCE_SUM:
    case IR_OP_REDUCE_MEAN:
    case IR_OP_REDUCE_MAX:
        return nd == 1; /* the IR output is flat: only a 1-D value has the same last axis */
    default:
        /* dense, batch_matmul, global pool, row ops, transpose: the graph value's last axis is
         * the IR output's last axis; the graph node must add along it too. */
        return nd != 4 || nhwc_attr;
    }
}

static int find_hash(const fe_fused *f, const char *hash)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->sub[i].hash, hash) == 0) return i;
    return -1;
}

void fe_fused_free(fe_fused *f)
{
    if (!f) return;
    free(f->sub);
    free(f->launch);
    memset(f, 0, sizeof *f);
}

typedef struct {
    int last, group;
} run_key;

static int by_last(const void *a, const void *b)
{
    const run_key *x = a, *y = b;
    return (x->last > y->last) - (x->last < y->last);
}

static int64_t value_numel(const fe_value *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

/* The groups as launches in execution order, each argument bound to a graph value in the
 * kernel ABI's order (ir.h: the INPUT tensors, then the output).
 *
 * Order: by each group's last node. A group reads only values produced before its own nodes,
 * and every value it reads from another group is that group's tail (a value inside a chain
 * has exactly one reader, the chain's next node), produced at that group's last node. So
 * sorting by last node is a topological order of the launches.
 *
 * Every binding is checked against the lowered subgraph's tensor sizes: a value must have the
 * kernel tensor's element count, or repeat times it (it then advances by one slice per
 * repeat; a smaller one, a bias, stays put). A mismatch is our bug, reported, never run. */
static int make_launches(const fe_graph *g, group *gr, int ng, const int *sub_of,
                         const int *n_abi, int64_t (*abi)[IR_MAX_TENSORS + 1], fe_fused *out,
                         tlm_error *err)
{
    run_key *order = malloc((ng + 1) * sizeof *order);
    out->launch = calloc(ng + 1, sizeof *out->launch);
    if (!order || !out->launch) {
        free(order);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    for (int i = 0; i < ng; i++)
        order[i] = (run_key){.last = gr[i].last, .group = i};
    qsort(order, ng, sizeof *order, by_last);
    int rc = 0;
    for (int o = 0; o < ng && !rc; o++) {
        const group *G = &gr[order[o].group];
        int u = sub_of[order[o].group];
        fe_launch *L = &out->launch[out->n_launch++];
        L->sub = u;
        L->node = G->anchor;
        L->repeat = G->count;
        L->n_args = G->n_args + 1;
        memcpy(L->args, G->args, G->n_args * sizeof *G->args);
        L->args[G->n_args] = G->tail;
        if (L->n_args != n_abi[u]) {
            rc = tlm_err_set(err, TLM_EUNSUPPORTED, "", "internal: node \"%.48s\" binds %d "
                             "tensors to a kernel of %d arguments",
                             g->values[g->nodes[G->anchor].out].name, L->n_args, n_abi[u]);
            break;
        }
        for (int a = 0; a < L->n_args; a++) {
            int64_t have = value_numel(&g->values[L->args[a]]), want = abi[u][a];
            if (have == want * L->repeat)
                L->step[a] = L->repeat > 1 ? want : 0;
            else if (have == want && L->repeat > 1 && a < L->n_args - 1)
                L->step[a] = 0;
            else {
                rc = tlm_err_set(err, TLM_EUNSUPPORTED, "",
                                 "internal: node \"%.48s\" binds \"%.48s\" (%lld elements) "
                                 "to kernel argument %d of %lld elements x %lld",
                                 g->values[g->nodes[G->anchor].out].name,
                                 g->values[L->args[a]].name, (long long)have, a,
                                 (long long)want, (long long)L->repeat);
                break;
            }
        }
        uint32_t consts = 0;
        for (int a = 0; a + 1 < L->n_args && a < 32; a++)
            if (g->values[L->args[a]].param && g->values[L->args[a]].producer < 0 &&
                L->step[a] == 0)
                consts |= 1u << a;
        out->sub[u].const_args &= consts; /* every launch's (a new kernel's starts all ones) */
    }
    free(order);
    return rc;
}

int fe_fuse(const fe_graph *g, fe_fused *out, tlm_error *err)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    int *users = calloc(g->n_values + 1, sizeof *users);
    int *group_of = malloc((g->n_nodes + 1) * sizeof *group_of);
    group *gr = malloc((g->n_nodes + 1) * sizeof *gr);
    ir_subgraph *sg = malloc(sizeof *sg);
    fe_subgraph *sub = NULL;
    int *sub_of = malloc((g->n_nodes + 1) * sizeof *sub_of); /* group -> unique subgraph */
    int *n_abi = calloc(g->n_nodes + 1, sizeof *n_abi);       /* per subgraph: kernel args */
    int64_t(*abi)[IR_MAX_TENSORS + 1] = malloc((g->n_nodes + 1) * sizeof *abi); /* their numel */
    int ng = 0;
    if (!users || !group_of || !gr || !sg || !sub_of || !n_abi || !abi) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            users[g->nodes[i].in[k]]++;
    /* A declared output must be materialised: it counts as one more reader. */
    for (int i = 0; i < g->n_outputs; i++)
        users[g->outputs[i]]++;

    for (int i = 0; i < g->n_nodes; i++) {
        const fe_node *n = &g->nodes[i];
        group_of[i] = -1;
        if (n->kind == FE_NODE_VIEW) continue;
        if (n->kind == FE_NODE_ANCHOR) {
            gr[ng] = (group){.wl = n->wl, .count = n->count, .tail = n->out, .anchor = i,
                             .last = i, .n_args = n->n_in};
            memcpy(gr[ng].args, n->in, n->n_in * sizeof *n->in);
            group_of[i] = ng++;
            continue;
        }
        /* Epilogue op: try to extend the chain that produced an operand. */
        bool binary = n->epi == IR_EPI_ADD || n->epi == IR_EPI_MUL;
        for (int k = 0; k < (binary ? 2 : 1) && group_of[i] < 0; k++) {
            int v = n->in[k], p = g->values[v].producer;
            if (p < 0 || g->nodes[p].kind == FE_NODE_VIEW || group_of[p] < 0) continue;
            group *G = &gr[group_of[p]];
            if (G->tail != v || users[v] != 1 || G->wl.n_epilogue >= IR_MAX_EPILOGUE) continue;
            if (n->epi == IR_EPI_BIAS_ADD && !bias_fits(g, G, n, v)) continue;
            G->wl.epilogue[G->wl.n_epilogue++] = n->epi;
            G->tail = n->out;
            G->last = i;
            /* bias_add, add and mul read one more tensor: the operand that is not the chain */
            if (n->epi == IR_EPI_BIAS_ADD || binary) G->args[G->n_args++] = n->in[1 - k];
            group_of[i] = group_of[p];
        }
        if (group_of[i] >= 0) continue;
        const fe_value *x = &g->values[n->in[0]];
        if (n->epi == IR_EPI_BIAS_ADD && x->ndim != 1) {
            char f[32];
            snprintf(f, sizeof f, "nodes[%d]", n->index);
            rc = tlm_err_set(err, TLM_EUNSUPPORTED, f,
                             "bias_add \"%.48s\" does not directly follow an op it can fuse "
                             "into (the op's output must have no other reader, and the bias "
                             "must run along that op's channel axis); the IR has no standalone "
                             "broadcasting add",
                             g->values[n->out].name);
            goto out;
        }
        ir_workload w;
        ir_workload_init(&w, IR_OP_ELEMENTWISE);
        w.dtype = x->dtype;
        w.shape[IR_EW_N] = 1;
        for (int d = 0; d < x->ndim; d++)
            w.shape[IR_EW_N] *= x->shape[d];
        w.epilogue[w.n_epilogue++] = n->epi;
        gr[ng] = (group){.wl = w, .count = 1, .tail = n->out, .anchor = i, .last = i,
                         .n_args = n->n_in};
        memcpy(gr[ng].args, n->in, n->n_in * sizeof *n->in);
        group_of[i] = ng++;
    }

    sub = calloc(ng + 1, sizeof *sub);
    if (!sub) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto out;
    }
    out->sub = sub;
    for (int i = 0; i < ng; i++) {
        char hash[IR_HASH_HEX];
        ir_workload_normalize(&gr[i].wl);
        tlm_error ie = {0};
        const fe_node *an = &g->nodes[gr[i].anchor];
        char f[32];
        snprintf(f, sizeof f, "nodes[%d]", an->index);
        /* The anchor was checked alone; its epilogue is checked here, with the tensor count. */
        if (ir_workload_check(&gr[i].wl, &ie) || ir_workload_hash_hex(&gr[i].wl, hash) < 0) {
            rc = tlm_err_set(err, ie.code ? ie.code : TLM_EINVAL, f,
                             "the fused subgraph is not a valid workload: %s (%s)", ie.msg,
                             ie.field);
            goto out;
        }
        int u = find_hash(out, hash);
        if (u < 0) {
            u = out->n++;
            fe_subgraph *s = &sub[u];
            s->wl = gr[i].wl;
            s->const_args = UINT32_MAX; /* narrowed by each launch (make_launches) */
            memcpy(s->hash, hash, sizeof hash);
            snprintf(s->name, sizeof s->name, "%s", g->values[an->out].name);
            if ((rc = ir_subgraph_build(&s->wl, sg, &ie))) {
                rc = tlm_err_set(err, rc, f, "cannot lower the fused subgraph: %s (%s)", ie.msg,
                                 ie.field);
                goto out;
            }
            s->flops = ir_subgraph_flops(sg);
            s->bytes = ir_subgraph_bytes(sg);
            s->macs = fe_workload_macs(&s->wl);
            s->in_place_arg = ir_subgraph_inplace_input(sg);
            int idx[IR_MAX_TENSORS];
            int ni = ir_subgraph_inputs(sg, idx);
            for (int a = 0; a < ni; a++)
                abi[u][a] = ir_tensor_numel(&sg->tensor[idx[a]]);
            abi[u][ni] = ir_tensor_numel(&sg->tensor[sg->output]);
            n_abi[u] = ni + 1;
        }
        sub_of[i] = u;
        fe_subgraph *s = &sub[u];
        s->count += gr[i].count;
        out->launches += gr[i].count;
        out->flops += gr[i].count * s->flops;
        out->macs += gr[i].count * s->macs;
        out->bytes += gr[i].count * s->bytes;
    }
    rc = make_launches(g, gr, ng, sub_of, n_abi, abi, out, err);
out:
    if (rc) fe_fused_free(out);
    free(sub_of);
    free(n_abi);
    free(abi);
    free(users);
    free(group_of);
    free(gr);
    free(sg);
    return rc;
}
