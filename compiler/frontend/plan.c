/* plan.c — the execution plan of a fused graph: materialised tensors, their arena offsets
 * (dead intermediates' bytes reused) and the launches with their argument bindings.
 *
 * Liveness is counted in launches (fe_fused.launch order). Placement is the greedy "largest
 * first, lowest fitting offset" of TFLite's and ONNX Runtime's memory planners: simple, and
 * within a few percent of optimal on chain-like networks. */
#include "compiler/frontend/frontend.h"

#include <stdlib.h>
#include <string.h>

static const char *const kind_names[] = {"input", "param", "intermediate", "output"};

const char *fe_tensor_kind_name(fe_tensor_kind k)
{
    return k >= 0 && k <= FE_T_OUTPUT ? kind_names[k] : "?";
}

void fe_plan_free(fe_plan *p)
{
    if (!p) return;
    free(p->tensor);
    memset(p, 0, sizeof *p);
}

static int64_t align_up(int64_t n)
{
    return (n + FE_PLAN_ALIGN - 1) / FE_PLAN_ALIGN * FE_PLAN_ALIGN;
}

static int64_t value_bytes(const fe_value *v)
{
    int64_t n = (int64_t)ir_dtype_size(v->dtype);
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

static bool lives_overlap(const fe_plan_tensor *a, const fe_plan_tensor *b)
{
    return a->first <= b->last && b->first <= a->last;
}

/* Sort key for placement: pinned tensors first (they all overlap), then larger first, then
 * plan order so the result is deterministic. */
static _Thread_local const fe_plan_tensor *sort_base;
static int by_placement(const void *x, const void *y)
{
    const fe_plan_tensor *a = &sort_base[*(const int *)x], *b = &sort_base[*(const int *)y];
    bool pa = a->first < 0, pb = b->first < 0;
    if (pa != pb) return pa ? -1 : 1;
    if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
    return (*(const int *)x > *(const int *)y) - (*(const int *)x < *(const int *)y);
}

static int by_offset(const void *x, const void *y)
{
    const fe_plan_tensor *a = &sort_base[*(const int *)x], *b = &sort_base[*(const int *)y];
    return (a->offset > b->offset) - (a->offset < b->offset);
}

/* Places every tensor that is neither a view nor written in place; those take their
 * target's offset afterwards. */
static int place(fe_plan *p, tlm_error *err)
{
    int n = p->n_tensor;
    int *order = malloc((n + 1) * sizeof *order), *live = malloc((n + 1) * sizeof *live);
    if (!order || !live) {
        free(order);
        free(live);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (p->tensor[i].alias < 0 && p->tensor[i].reuses < 0) order[m++] = i;
    /* qsort has no context argument: the base goes through a thread-local (any thread may
     * plan) */
    sort_base = p->tensor;
    qsort(order, m, sizeof *order, by_placement);
    for (int k = 0; k < m; k++) {
        fe_plan_tensor *t = &p->tensor[order[k]];
        int nl = 0;
        for (int j = 0; j < k; j++)
            if (lives_overlap(t, &p->tensor[order[j]])) live[nl++] = order[j];
        qsort(live, nl, sizeof *live, by_offset);
        int64_t off = 0, need = align_up(t->bytes);
        for (int j = 0; j < nl; j++) {
            const fe_plan_tensor *o = &p->tensor[live[j]];
            if (o->offset >= off + need) break; /* the gap before o fits */
            int64_t end = o->offset + align_up(o->bytes);
            if (end > off) off = end;
        }
        t->offset = off;
        if (off + need > p->arena_bytes) p->arena_bytes = off + need;
        p->unshared_bytes += need;
    }
    free(order);
    free(live);
    return 0;
}

/* The tensor whose bytes plan tensor t occupies: its view target, or what it writes over */
static int storage_of(const fe_plan *p, int t)
{
    if (p->tensor[t].alias >= 0) t = p->tensor[t].alias;
    return p->tensor[t].reuses >= 0 ? p->tensor[t].reuses : t;
}

/* In place (frontend.h): each launch, in order, whose kernel may write over an input that
 * dies there (fe_subgraph.in_place_arg) takes over that input's storage, which then lives on
 * as long as the output. tensor_of maps values to plan tensors; lives are final except for
 * this. */
static void plan_in_place(const fe_fused *f, const int *tensor_of, int64_t above, fe_plan *p)
{
    for (int i = 0; i < f->n_launch; i++) {
        const fe_launch *L = &f->launch[i];
        const int a = f->sub[L->sub].in_place_arg;
        if (a < 0 || a >= L->n_args - 1 || L->repeat != 1) continue;
        const int o = tensor_of[L->args[L->n_args - 1]], r = storage_of(p, tensor_of[L->args[a]]);
        fe_plan_tensor *to = &p->tensor[o], *tr = &p->tensor[r];
        if (to->kind != FE_T_INTERMEDIATE || to->alias >= 0 || to->first != i ||
            tr->kind != FE_T_INTERMEDIATE || tr->last != i || tr->bytes != to->bytes ||
            to->bytes <= above)
            continue;
        bool once = true; /* the launch reads those bytes through no other argument */
        for (int k = 0; k < L->n_args - 1 && once; k++)
            once = k == a || storage_of(p, tensor_of[L->args[k]]) != r;
        if (!once) continue;
        to->reuses = r;
        tr->last = to->last;
    }
}

int fe_plan_build(const fe_graph *g, const fe_fused *f, int64_t in_place_above, fe_plan *out,
                  tlm_error *err)
{
    memset(out, 0, sizeof *out);
    int *tensor_of = malloc((g->n_values + 1) * sizeof *tensor_of);
    bool *is_out = calloc(g->n_values + 1, sizeof *is_out);
    int *readers = calloc(g->n_values + 1, sizeof *readers);
    int *writer = malloc((g->n_values + 1) * sizeof *writer);
    out->tensor = calloc(g->n_values + 1, sizeof *out->tensor);
    int rc = 0;
    if (!tensor_of || !is_out || !readers || !writer || !out->tensor) {
        rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        goto done;
    }
    for (int v = 0; v < g->n_values; v++)
        tensor_of[v] = -1, writer[v] = -1;
    for (int i = 0; i < f->n_launch; i++) {
        const fe_launch *L = &f->launch[i];
        writer[L->args[L->n_args - 1]] = i;
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++)
            readers[g->nodes[i].in[k]]++;
    if (g->n_outputs)
        for (int i = 0; i < g->n_outputs; i++)
            is_out[g->outputs[i]] = true;
    else
        for (int v = 0; v < g->n_values; v++)
            is_out[v] = g->values[v].producer >= 0 && readers[v] == 0;

    /* Which values have storage, and what a view aliases. Values are in an order where a
     * view's input precedes the view (nodes are topological, inputs come first). */
    int nt = 0;
    for (int v = 0; v < g->n_values; v++) {
        const fe_value *val = &g->values[v];
        int alias = -1;
        if (val->producer >= 0) {
            const fe_node *nd = &g->nodes[val->producer];
            if (nd->kind == FE_NODE_VIEW) {
                alias = tensor_of[nd->in[0]];
                if (alias < 0)
                    continue; /* a view of a value fused away cannot happen (that
                                 value's one reader would be the view), but stay safe */
                if (out->tensor[alias].alias >= 0) alias = out->tensor[alias].alias;
            } else if (writer[v] < 0) {
                continue; /* inside a fused chain: never stored */
            }
        }
        fe_plan_tensor *t = &out->tensor[nt];
        t->value = v;
        t->alias = alias;
        t->reuses = -1;
        t->bytes = value_bytes(val);
        t->kind = val->producer < 0 ? (val->param ? FE_T_PARAM : FE_T_INPUT)
                  : is_out[v]       ? FE_T_OUTPUT
                                    : FE_T_INTERMEDIATE;
        bool pinned = t->kind != FE_T_INTERMEDIATE;
        t->first = pinned ? -1 : writer[v];
        t->last = pinned ? f->n_launch : writer[v];
        if (alias >= 0) {
            fe_plan_tensor *r = &out->tensor[alias];
            /* an output view keeps its target for the whole run */
            if (t->kind == FE_T_OUTPUT) r->first = -1, r->last = f->n_launch;
            t->first = r->first;
            t->last = r->last;
        }
        tensor_of[v] = nt++;
    }
    out->n_tensor = nt;
    /* Last reads: a launch reading a view extends the view's target. */
    for (int i = 0; i < f->n_launch; i++) {
        const fe_launch *L = &f->launch[i];
        for (int a = 0; a < L->n_args - 1; a++) {
            int t = tensor_of[L->args[a]];
            if (t < 0) {
                rc = tlm_err_set(err, TLM_EUNSUPPORTED, "",
                                 "internal: launch %d reads \"%.48s\", which has no storage", i,
                                 g->values[L->args[a]].name);
                goto done;
            }
            if (out->tensor[t].alias >= 0) t = out->tensor[t].alias;
            if (out->tensor[t].last < i) out->tensor[t].last = i;
        }
    }
    if (in_place_above >= 0) plan_in_place(f, tensor_of, in_place_above, out);
    if ((rc = place(out, err))) goto done;
    for (int i = 0; i < nt; i++) {
        fe_plan_tensor *t = &out->tensor[i];
        if (t->reuses >= 0) {
            t->offset = out->tensor[t->reuses].offset;
            out->unshared_bytes += align_up(t->bytes);
        }
    }
    for (int i = 0; i < nt; i++) {
        fe_plan_tensor *t = &out->tensor[i];
        if (t->alias >= 0) {
            t->offset = out->tensor[t->alias].offset;
            t->first = out->tensor[t->alias].first;
            t->last = out->tensor[t->alias].last;
        }
    }
done:
    if (rc) fe_plan_free(out);
    free(tensor_of);
    free(is_out);
    free(readers);
    free(writer);
    return rc;
}

static json_t *shape_json(const fe_value *v)
{
    json_t *a = json_array();
    for (int d = 0; a && d < v->ndim; d++)
        json_array_append_new(a, json_integer((json_int_t)v->shape[d]));
    return a;
}

json_t *fe_plan_to_json(const fe_graph *g, const fe_fused *f, const fe_plan *p)
{
    json_t *ts = json_array(), *ins = json_array(), *params = json_array(), *outs = json_array(),
           *ls = json_array();
    json_t *j = json_pack("{s:i, s:i, s:I, s:I, s:o*, s:o*, s:o*, s:o*, s:o*}", "version", 1,
                          "alignment", FE_PLAN_ALIGN, "arena_bytes", (json_int_t)p->arena_bytes,
                          "unshared_bytes", (json_int_t)p->unshared_bytes, "tensors", ts, "inputs",
                          ins, "params", params, "outputs", outs, "launches", ls);
    if (!j || !ts || !ins || !params || !outs || !ls) {
        json_decref(j);
        return NULL;
    }
    bool ok = true;
    for (int i = 0; i < p->n_tensor; i++) {
        const fe_plan_tensor *t = &p->tensor[i];
        const fe_value *v = &g->values[t->value];
        json_t *o = json_pack("{s:s, s:s, s:o*, s:s, s:I, s:I}", "name", v->name, "kind",
                              fe_tensor_kind_name(t->kind), "shape", shape_json(v), "dtype",
                              ir_dtype_name(v->dtype), "bytes", (json_int_t)t->bytes, "offset",
                              (json_int_t)t->offset);
        if (o && t->alias >= 0)
            json_object_set_new(o, "alias_of",
                                json_string(g->values[p->tensor[t->alias].value].name));
        if (o && t->reuses >= 0)
            json_object_set_new(o, "in_place_of",
                                json_string(g->values[p->tensor[t->reuses].value].name));
        ok = ok && o && !json_array_append_new(ts, o);
        json_t *list = t->kind == FE_T_INPUT    ? ins
                       : t->kind == FE_T_PARAM  ? params
                       : t->kind == FE_T_OUTPUT ? outs
                                                : NULL;
        if (list) ok = ok && !json_array_append_new(list, json_string(v->name));
    }
    for (int i = 0; i < f->n_launch; i++) {
        const fe_launch *L = &f->launch[i];
        const fe_node *nd = &g->nodes[L->node];
        json_t *args = json_array();
        for (int a = 0; args && a < L->n_args; a++)
            json_array_append_new(args, json_string(g->values[L->args[a]].name));
        json_t *o = json_pack("{s:i, s:s, s:s, s:o*, s:I}", "subgraph", L->sub, "node",
                              g->values[nd->out].name, "op", ir_op_get(f->sub[L->sub].wl.op)->name,
                              "args", args, "repeat", (json_int_t)L->repeat);
        if (o && L->repeat > 1) {
            json_t *st = json_array();
            for (int a = 0; st && a < L->n_args; a++)
                json_array_append_new(st, json_integer((json_int_t)L->step[a]));
            json_object_set_new(o, "steps", st);
        }
        ok = ok && o && !json_array_append_new(ls, o);
    }
    if (!ok) {
        json_decref(j);
        return NULL;
    }
    return j;
}
