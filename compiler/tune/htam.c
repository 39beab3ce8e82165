/* htam.c — HTAM refinement over the schedule space (see htam.h). */
#include "compiler/tune/htam.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tlm/select.h"
#include "compiler/util/util.h"

/* ---- the taxonomy: data, per target kind ---- */

typedef enum { SEL_NONE, SEL_SPATIAL, SEL_VEC, SEL_NONVEC, SEL_RED } axis_sel;
typedef enum { OP_UP, OP_DOWN, OP_FLIP, OP_RESAMPLE } op_kind;

typedef struct {
    const char *name, *intent, *triggers, *risks;
} gdef;

typedef struct {
    const char *name;
    int g;                /* its global node */
    space_slot_kind kind; /* the slots it rewrites */
    int level;            /* TILE: the split level (-1: any) */
    axis_sel sel;         /* TILE: which axes */
    op_kind op;
} ldef;

static const gdef CPU_G[] = {
    {"memory_access", "block the loops so each level's working set fits its cache",
     "large reduction or spatial extents; time far above the FMA bound", "too small blocks add "
                                                                          "loop overhead"},
    {"data_reuse", "keep more of the result in registers and the accumulator block, so each "
                   "load feeds more FMAs",
     "compute-bound kernels below peak", "register spills, padding waste on odd extents"},
    {"parallelism", "spread the work over the cores without starving or over-splitting them",
     "few outer tasks, or tiny tasks", "OpenMP overhead on small kernels"},
    {"vectorization", "put a long contiguous axis in the vector lanes",
     "short or strided innermost axes", "gathers along a strided axis"},
    {"ilp", "unroll so independent chains hide latency", "short inner loops",
     "code size, instruction-cache misses"},
    {"packing", "copy strided operands into contiguous, vector-ordered buffers",
     "strided or set-conflicting operand walks", "the copy costs more than it saves on small "
                                                 "reuse"},
};

static const ldef CPU_L[] = {
    {"grow the reduction chunk", 0, SLOT_TILE, 1, SEL_RED, OP_UP},
    {"shrink the reduction chunk", 0, SLOT_TILE, 1, SEL_RED, OP_DOWN},
    {"grow the outer spatial tile", 0, SLOT_TILE, 1, SEL_SPATIAL, OP_UP},
    {"shrink the outer spatial tile", 0, SLOT_TILE, 1, SEL_SPATIAL, OP_DOWN},
    {"widen the register tile along the vector axis", 1, SLOT_TILE, 3, SEL_VEC, OP_UP},
    {"narrow the register tile along the vector axis", 1, SLOT_TILE, 3, SEL_VEC, OP_DOWN},
    {"more register-tile rows", 1, SLOT_TILE, 3, SEL_NONVEC, OP_UP},
    {"fewer register-tile rows", 1, SLOT_TILE, 3, SEL_NONVEC, OP_DOWN},
    {"grow the accumulator block", 1, SLOT_TILE, 2, SEL_SPATIAL, OP_UP},
    {"shrink the accumulator block", 1, SLOT_TILE, 2, SEL_SPATIAL, OP_DOWN},
    {"parallelise more loop levels", 2, SLOT_PARALLEL, -1, SEL_NONE, OP_UP},
    {"parallelise fewer loop levels", 2, SLOT_PARALLEL, -1, SEL_NONE, OP_DOWN},
    {"more rows per task", 2, SLOT_ROWS, -1, SEL_NONE, OP_UP},
    {"fewer rows per task", 2, SLOT_ROWS, -1, SEL_NONE, OP_DOWN},
    {"vectorise along another axis", 3, SLOT_VECTORIZE, -1, SEL_NONE, OP_RESAMPLE},
    {"unroll more", 4, SLOT_UNROLL, -1, SEL_NONE, OP_UP},
    {"unroll less", 4, SLOT_UNROLL, -1, SEL_NONE, OP_DOWN},
    {"toggle operand packing", 5, SLOT_PACK, -1, SEL_NONE, OP_FLIP},
};

static const gdef GPU_G[] = {
    {"memory_access", "size the reduction tiles so global loads coalesce and are reused",
     "memory-bound kernels", "too few loads in flight"},
    {"data_reuse", "grow each thread's tile so a load feeds more FMAs", "compute-bound kernels",
     "register pressure lowers occupancy"},
    {"parallelism", "threads per block and blocks enough to fill the SMs",
     "few blocks, idle SMs", "too many threads: fewer registers each"},
    {"shared_memory_staging", "stage inputs in shared memory with vector loads",
     "operands reused across threads", "shared-memory limits, bank conflicts"},
    {"ilp", "unroll and use virtual threads to hide latency", "latency-bound inner loops",
     "register pressure"},
};

static const ldef GPU_L[] = {
    {"grow the inner reduction tile", 0, SLOT_TILE, 2, SEL_RED, OP_UP},
    {"shrink the inner reduction tile", 0, SLOT_TILE, 2, SEL_RED, OP_DOWN},
    {"grow the staged reduction chunk", 0, SLOT_TILE, 1, SEL_RED, OP_UP},
    {"shrink the staged reduction chunk", 0, SLOT_TILE, 1, SEL_RED, OP_DOWN},
    {"grow the thread's inner tile", 1, SLOT_TILE, 4, SEL_SPATIAL, OP_UP},
    {"shrink the thread's inner tile", 1, SLOT_TILE, 4, SEL_SPATIAL, OP_DOWN},
    {"grow the thread's outer tile", 1, SLOT_TILE, 3, SEL_SPATIAL, OP_UP},
    {"shrink the thread's outer tile", 1, SLOT_TILE, 3, SEL_SPATIAL, OP_DOWN},
    {"more threads per block", 2, SLOT_TILE, 2, SEL_SPATIAL, OP_UP},
    {"fewer threads per block", 2, SLOT_TILE, 2, SEL_SPATIAL, OP_DOWN},
    {"more threads (rows)", 2, SLOT_THREADS, -1, SEL_NONE, OP_UP},
    {"fewer threads (rows)", 2, SLOT_THREADS, -1, SEL_NONE, OP_DOWN},
    {"toggle shared-memory staging", 3, SLOT_STAGE, -1, SEL_NONE, OP_FLIP},
    {"wider staging loads", 3, SLOT_VEC_LOAD, -1, SEL_NONE, OP_UP},
    {"narrower staging loads", 3, SLOT_VEC_LOAD, -1, SEL_NONE, OP_DOWN},
    {"unroll more", 4, SLOT_UNROLL, -1, SEL_NONE, OP_UP},
    {"unroll less", 4, SLOT_UNROLL, -1, SEL_NONE, OP_DOWN},
    {"more virtual threads", 4, SLOT_TILE, 1, SEL_SPATIAL, OP_UP},
    {"fewer virtual threads", 4, SLOT_TILE, 1, SEL_SPATIAL, OP_DOWN},
    /* the tensor-core sketch (gpu_mma) */
    {"deeper reduction chunk per stage", 0, SLOT_BLOCK_K, -1, SEL_NONE, OP_UP},
    {"shallower reduction chunk per stage", 0, SLOT_BLOCK_K, -1, SEL_NONE, OP_DOWN},
    {"taller warp tile", 1, SLOT_WARP_M, -1, SEL_NONE, OP_UP},
    {"shorter warp tile", 1, SLOT_WARP_M, -1, SEL_NONE, OP_DOWN},
    {"wider warp tile", 1, SLOT_WARP_N, -1, SEL_NONE, OP_UP},
    {"narrower warp tile", 1, SLOT_WARP_N, -1, SEL_NONE, OP_DOWN},
    {"more warps along M", 2, SLOT_WARPS_M, -1, SEL_NONE, OP_UP},
    {"fewer warps along M", 2, SLOT_WARPS_M, -1, SEL_NONE, OP_DOWN},
    {"more warps along N", 2, SLOT_WARPS_N, -1, SEL_NONE, OP_UP},
    {"fewer warps along N", 2, SLOT_WARPS_N, -1, SEL_NONE, OP_DOWN},
    {"more pipeline stages", 3, SLOT_PIPELINE, -1, SEL_NONE, OP_UP},
    {"fewer pipeline stages", 3, SLOT_PIPELINE, -1, SEL_NONE, OP_DOWN},
    {"toggle the swizzled shared layout", 3, SLOT_SWIZZLE, -1, SEL_NONE, OP_FLIP},
};

#define MAX_EVIDENCE 5

typedef struct {
    double n, wins, fails, reward;
} stats;

struct htam {
    target_kind kind;
    const gdef *g;
    int ng;
    const ldef *l;
    int nl;
    stats *gs, *ls, *es;    /* now */
    stats *gs0, *ls0, *es0; /* as loaded (the increments to save are the difference) */
    json_t **evidence;      /* per local: array of the newest evidence (this run's first) */
    json_t **evidence_new;  /* per local: what this run adds */
};

htam *htam_new(target_kind k)
{
    htam *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->kind = k;
    if (k == TARGET_CUDA) {
        m->g = GPU_G, m->ng = (int)(sizeof GPU_G / sizeof GPU_G[0]);
        m->l = GPU_L, m->nl = (int)(sizeof GPU_L / sizeof GPU_L[0]);
    } else {
        m->g = CPU_G, m->ng = (int)(sizeof CPU_G / sizeof CPU_G[0]);
        m->l = CPU_L, m->nl = (int)(sizeof CPU_L / sizeof CPU_L[0]);
    }
    m->gs = calloc((size_t)m->ng, sizeof *m->gs);
    m->ls = calloc((size_t)m->nl, sizeof *m->ls);
    m->es = calloc((size_t)(m->ng * m->ng), sizeof *m->es);
    m->gs0 = calloc((size_t)m->ng, sizeof *m->gs0);
    m->ls0 = calloc((size_t)m->nl, sizeof *m->ls0);
    m->es0 = calloc((size_t)(m->ng * m->ng), sizeof *m->es0);
    m->evidence = calloc((size_t)m->nl, sizeof *m->evidence);
    m->evidence_new = calloc((size_t)m->nl, sizeof *m->evidence_new);
    if (!m->gs || !m->ls || !m->es || !m->gs0 || !m->ls0 || !m->es0 || !m->evidence ||
        !m->evidence_new) {
        htam_free(m);
        return NULL;
    }
    for (int i = 0; i < m->nl; i++) {
        m->evidence[i] = json_array();
        m->evidence_new[i] = json_array();
    }
    return m;
}

void htam_free(htam *m)
{
    if (!m) return;
    for (int i = 0; m->evidence && i < m->nl; i++) json_decref(m->evidence[i]);
    for (int i = 0; m->evidence_new && i < m->nl; i++) json_decref(m->evidence_new[i]);
    free(m->evidence);
    free(m->evidence_new);
    free(m->gs);
    free(m->ls);
    free(m->es);
    free(m->gs0);
    free(m->ls0);
    free(m->es0);
    free(m);
}

const char *htam_global_name(const htam *m, int g)
{
    return g >= 0 && g < m->ng ? m->g[g].name : "start";
}

const char *htam_local_name(const htam *m, int l)
{
    return l >= 0 && l < m->nl ? m->l[l].name : "start";
}

int htam_n_globals(const htam *m)
{
    return m->ng;
}

int htam_n_locals(const htam *m)
{
    return m->nl;
}

int htam_local_direction(const htam *m, int l)
{
    if (l < 0 || l >= m->nl) return 0;
    return m->l[l].op == OP_UP ? 1 : m->l[l].op == OP_DOWN ? -1 : 0;
}

int htam_memory_parse(const char *name, const char *field, htam_memory *out, tlm_error *err)
{
    static const char *const names[] = {"full", "flat", "no-transitions", "no-local"};
    for (int i = 0; name && i < 4; i++)
        if (!strcmp(name, names[i])) {
            *out = (htam_memory)i;
            return 0;
        }
    return tlm_err_set(err, TLM_EINVAL, field,
                       "unknown memory \"%s\"; allowed: full, flat, no-transitions, no-local",
                       name ? name : "");
}

int htam_regen_parse(const char *name, const char *field, bool *tlm, tlm_error *err)
{
    if (name && (!strcmp(name, "tlm") || !strcmp(name, "mutation"))) {
        *tlm = !strcmp(name, "tlm");
        return 0;
    }
    return tlm_err_set(err, TLM_EINVAL, field, "unknown generator \"%s\"; allowed: tlm, mutation",
                       name ? name : "");
}

const char *htam_gen_name(htam_gen g)
{
    return g == HTAM_GEN_TLM ? "tlm" : g == HTAM_GEN_MUTATION ? "mutation" : "start";
}

/* ---- JSON ---- */

static json_t *stats_json(const stats *s, json_t *o)
{
    json_object_set_new(o, "n", json_real(s->n));
    json_object_set_new(o, "wins", json_real(s->wins));
    json_object_set_new(o, "fails", json_real(s->fails));
    json_object_set_new(o, "reward", json_real(s->reward));
    return o;
}

static int stats_add(stats *s, const json_t *o)
{
    const char *keys[] = {"n", "wins", "fails", "reward"};
    double *dst[] = {&s->n, &s->wins, &s->fails, &s->reward};
    for (int i = 0; i < 4; i++) {
        const json_t *v = json_object_get(o, keys[i]);
        if (v && !json_is_number(v)) return -1;
        if (v) *dst[i] += json_number_value(v);
    }
    return 0;
}

json_t *htam_to_json(const htam *m)
{
    json_t *gs = json_array(), *ls = json_array(), *es = json_array();
    for (int g = 0; g < m->ng; g++)
        json_array_append_new(
            gs, stats_json(&m->gs[g], json_pack("{s:s, s:s, s:s, s:s}", "name", m->g[g].name,
                                                 "intent", m->g[g].intent, "triggers",
                                                 m->g[g].triggers, "risks", m->g[g].risks)));
    for (int l = 0; l < m->nl; l++) {
        json_t *ev = json_deep_copy(m->evidence_new[l]);
        size_t i;
        json_t *x;
        json_array_foreach(m->evidence[l], i, x)
        {
            if (json_array_size(ev) >= MAX_EVIDENCE) break;
            json_array_append(ev, x);
        }
        json_array_append_new(
            ls, stats_json(&m->ls[l], json_pack("{s:s, s:s, s:o}", "name", m->l[l].name, "global",
                                                 m->g[m->l[l].g].name, "evidence", ev)));
    }
    for (int a = 0; a < m->ng; a++)
        for (int b = 0; b < m->ng; b++)
            if (m->es[a * m->ng + b].n > 0)
                json_array_append_new(es, stats_json(&m->es[a * m->ng + b],
                                                     json_pack("{s:s, s:s}", "from", m->g[a].name,
                                                               "to", m->g[b].name)));
    return json_pack("{s:s, s:s, s:o, s:o, s:o}", "format", "tlm-htam/1", "target",
                     m->kind == TARGET_CUDA ? "cuda" : "cpu", "globals", gs, "locals", ls,
                     "edges", es);
}

static int find_g(const htam *m, const char *name)
{
    for (int g = 0; name && g < m->ng; g++)
        if (!strcmp(m->g[g].name, name)) return g;
    return -1;
}

static int find_l(const htam *m, const char *name)
{
    for (int l = 0; name && l < m->nl; l++)
        if (!strcmp(m->l[l].name, name)) return l;
    return -1;
}

int htam_merge_json(htam *m, const json_t *doc, tlm_error *err)
{
    if (!json_is_object(doc)) return tlm_err_set(err, TLM_EINVAL, "", "not a JSON object");
    const char *fmt = json_string_value(json_object_get(doc, "format"));
    if (!fmt || strcmp(fmt, "tlm-htam/1"))
        return tlm_err_set(err, TLM_EINVAL, "format", "must be \"tlm-htam/1\"");
    const char *tg = json_string_value(json_object_get(doc, "target"));
    if (!tg || strcmp(tg, m->kind == TARGET_CUDA ? "cuda" : "cpu"))
        return tlm_err_set(err, TLM_EINVAL, "target", "must be \"%s\" for this memory",
                           m->kind == TARGET_CUDA ? "cuda" : "cpu");
    size_t i;
    json_t *x;
    /* unknown names (another taxonomy version) are skipped, not errors */
    json_array_foreach(json_object_get(doc, "globals"), i, x)
    {
        int g = find_g(m, json_string_value(json_object_get(x, "name")));
        if (g >= 0 && stats_add(&m->gs[g], x))
            return tlm_err_set(err, TLM_EINVAL, "globals", "entry %zu: statistics must be numbers", i);
    }
    json_array_foreach(json_object_get(doc, "locals"), i, x)
    {
        int l = find_l(m, json_string_value(json_object_get(x, "name")));
        if (l < 0) continue;
        if (stats_add(&m->ls[l], x))
            return tlm_err_set(err, TLM_EINVAL, "locals", "entry %zu: statistics must be numbers", i);
        size_t k;
        json_t *e;
        json_array_foreach(json_object_get(x, "evidence"), k, e)
        {
            if (json_array_size(m->evidence[l]) >= MAX_EVIDENCE) break;
            json_array_append(m->evidence[l], e);
        }
    }
    json_array_foreach(json_object_get(doc, "edges"), i, x)
    {
        int a = find_g(m, json_string_value(json_object_get(x, "from")));
        int b = find_g(m, json_string_value(json_object_get(x, "to")));
        if (a >= 0 && b >= 0 && stats_add(&m->es[a * m->ng + b], x))
            return tlm_err_set(err, TLM_EINVAL, "edges", "entry %zu: statistics must be numbers", i);
    }
    return 0;
}

static void snapshot(htam *m)
{
    memcpy(m->gs0, m->gs, (size_t)m->ng * sizeof *m->gs);
    memcpy(m->ls0, m->ls, (size_t)m->nl * sizeof *m->ls);
    memcpy(m->es0, m->es, (size_t)(m->ng * m->ng) * sizeof *m->es);
}

int htam_load(htam *m, const htam_store_io *io, tlm_error *err)
{
    if (!io || !io->load) return 0;
    json_t *doc = NULL;
    int rc = io->load(io->st, m->kind == TARGET_CUDA ? "cuda" : "cpu", &doc, err);
    if (!rc && doc) rc = htam_merge_json(m, doc, err);
    json_decref(doc);
    if (!rc) snapshot(m);
    return rc;
}

/* into[i] += now[i] - base[i], for n statistics */
static void add_delta(stats *into, const stats *now, const stats *base, int n)
{
    for (int i = 0; i < n; i++) {
        into[i].n += now[i].n - base[i].n;
        into[i].wins += now[i].wins - base[i].wins;
        into[i].fails += now[i].fails - base[i].fails;
        into[i].reward += now[i].reward - base[i].reward;
    }
}

int htam_save(htam *m, const htam_store_io *io, tlm_error *err)
{
    if (!io || !io->save) return 0;
    /* the stored memory now (another run may have added to it), plus this run's increments */
    htam *fresh = htam_new(m->kind);
    if (!fresh) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = 0;
    if (io->load) {
        json_t *doc = NULL;
        rc = io->load(io->st, m->kind == TARGET_CUDA ? "cuda" : "cpu", &doc, err);
        if (!rc && doc) rc = htam_merge_json(fresh, doc, err);
        json_decref(doc);
    }
    if (!rc) {
        add_delta(fresh->gs, m->gs, m->gs0, m->ng);
        add_delta(fresh->ls, m->ls, m->ls0, m->nl);
        add_delta(fresh->es, m->es, m->es0, m->ng * m->ng);
        for (int l = 0; l < m->nl; l++) json_array_extend(fresh->evidence_new[l], m->evidence_new[l]);
    }
    if (!rc) {
        json_t *doc = htam_to_json(fresh);
        rc = io->save(io->st, m->kind == TARGET_CUDA ? "cuda" : "cpu", doc, err);
        json_decref(doc);
    }
    if (!rc) {
        /* what is stored now is this memory's new base */
        memcpy(m->gs, fresh->gs, (size_t)m->ng * sizeof *m->gs);
        memcpy(m->ls, fresh->ls, (size_t)m->nl * sizeof *m->ls);
        memcpy(m->es, fresh->es, (size_t)(m->ng * m->ng) * sizeof *m->es);
        snapshot(m);
        for (int l = 0; l < m->nl; l++) json_array_clear(m->evidence_new[l]);
    }
    htam_free(fresh);
    return rc;
}

/* ---- strategies on a schedule ---- */

static uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static double unit(uint64_t *s)
{
    return (double)(rnd(s) >> 11) * 0x1.0p-53;
}

static bool slot_matches(const space *sp, const space_sched *s, int i, const ldef *d)
{
    const space_slot *sl = &sp->slot[i];
    if (sl->kind != d->kind) return false;
    if (d->kind != SLOT_TILE) return true;
    if (d->level >= 0 && sl->level != d->level) return false;
    bool spatial = sl->axis < sp->n_spatial;
    int vaxis = sp->sketch == SKETCH_CPU_TILE ? space_cpu_vec_axis(sp, s, sp->n_slot)
                                              : sp->n_spatial - 1;
    switch (d->sel) {
    case SEL_SPATIAL: return spatial;
    case SEL_VEC: return spatial && sl->axis == vaxis;
    case SEL_NONVEC: return spatial && sl->axis != vaxis;
    case SEL_RED: return !spatial;
    default: return true;
    }
}

/* Picks the slot local strategy d rewrites in s: one matching slot, at random among those
 * the operator changes, and the operator's value for it. false when no slot changes. */
static bool pick_slot(const space *sp, const space_sched *s, const ldef *d, uint64_t *rng,
                      int64_t *vals, int *slot, int64_t *value)
{
    int cand[SPACE_MAX_SLOTS];
    int64_t newv[SPACE_MAX_SLOTS];
    int n = 0;
    for (int i = 0; i < sp->n_slot; i++) {
        if (!slot_matches(sp, s, i, d)) continue;
        int nv = space_legal_values(sp, i, s, vals);
        if (nv <= 1) continue;
        int cur = -1;
        for (int k = 0; k < nv; k++)
            if (vals[k] == s->v[i]) cur = k;
        int64_t v = s->v[i];
        switch (d->op) {
        case OP_UP:
            if (cur >= 0 && cur + 1 < nv) v = vals[cur + 1];
            break;
        case OP_DOWN:
            if (cur > 0) v = vals[cur - 1];
            break;
        case OP_FLIP:
            for (int k = 0; k < nv; k++)
                if (vals[k] == !s->v[i]) v = vals[k];
            break;
        case OP_RESAMPLE: {
            int pick = (int)(rnd(rng) % (uint64_t)nv);
            if (pick == cur) pick = (pick + 1) % nv;
            v = vals[pick];
            break;
        }
        }
        if (v == s->v[i]) continue;
        cand[n] = i;
        newv[n] = v;
        n++;
    }
    if (n == 0) return false;
    int k = (int)(rnd(rng) % (uint64_t)n);
    *slot = cand[k];
    *value = newv[k];
    return true;
}

/* s with slot i set to v and the slots after it re-legalised. */
static void rewrite(const space *sp, const space_sched *s, int i, int64_t v, space_sched *out)
{
    *out = *s;
    out->n = sp->n_slot;
    out->v[i] = v;
    tune_legalise(sp, out, i + 1);
}

/* The operator as a constraint on the model's value: up / down the legal values, or any
 * other value (toggle, resample). */
typedef struct {
    op_kind op;
    int64_t cur;
} op_filter;

static bool op_allows(int64_t v, void *user)
{
    const op_filter *f = user;
    switch (f->op) {
    case OP_UP:
        return v > f->cur;
    case OP_DOWN:
        return v < f->cur;
    default:
        return v != f->cur;
    }
}

static bool seen_has(const uint64_t *seen, int n, uint64_t h)
{
    for (int k = 0; k < n; k++)
        if (seen[k] == h) return true;
    return false;
}

/* The model's value for slot i of s under d's operator: its best values (beam) in order, the
 * first whose schedule is new. 1 with *out filled, 0 when it offers nothing new. */
static int regen_tlm(const tlm_model *model, const space *sp, const space_sched *s, const ldef *d,
                     int i, const uint64_t *seen, int nseen, space_sched *out, tlm_error *err)
{
    op_filter f = {d->op, s->v[i]};
    int64_t vals[HTAM_REGEN_BEAM];
    int n = 0;
    int rc = tlm_select_regen(model, sp, s, i, op_allows, &f, HTAM_REGEN_BEAM, vals, NULL, &n, err);
    if (rc) return rc;
    for (int k = 0; k < n; k++) {
        rewrite(sp, s, i, vals[k], out);
        if (!seen_has(seen, nseen, tune_sched_hash(out))) return 1;
    }
    return 0;
}

/* ---- the policy ---- */

static double q(const stats *s)
{
    return s->n > 0 ? s->reward / s->n : 0;
}

static double explore(const stats *s, double total)
{
    return 0.3 * sqrt(log(total + 2) / (s->n + 1));
}

static int softmax_pick(const double *score, const bool *ok, int n, double temp, uint64_t *rng)
{
    double mx = -INFINITY;
    for (int i = 0; i < n; i++)
        if (ok[i] && score[i] > mx) mx = score[i];
    if (!isfinite(mx)) return -1;
    double tot = 0, w[64];
    for (int i = 0; i < n && i < 64; i++) {
        w[i] = ok[i] ? exp((score[i] - mx) / temp) : 0;
        tot += w[i];
    }
    double r = unit(rng) * tot;
    for (int i = 0; i < n && i < 64; i++) {
        if (!ok[i]) continue;
        r -= w[i];
        if (r <= 0) return i;
    }
    for (int i = n - 1; i >= 0; i--)
        if (ok[i]) return i;
    return -1;
}

void htam_opts_init(htam_opts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = 32;
    o->seed = 1;
    o->memory = HTAM_FULL;
    o->temperature = 0.25;
    tune_opts to;
    tune_opts_init(&to);
    o->eval = to.eval;
    o->eval_user = to.eval_user;
    o->build_threads = to.build_threads;
    o->confirm = to.confirm;
    o->confirm_rounds = to.confirm_rounds;
}

void htam_result_free(htam_result *r)
{
    if (!r) return;
    free(r->traj);
    r->traj = NULL;
}

static int eval_local(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    (void)user;
    int *rec = malloc((size_t)n * sizeof *rec);
    if (!rec) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = pl_evaluate_batch(j, idx, n, true, 1, rec, err);
    for (int k = 0; k < n; k++) {
        const pl_record *r = rc ? NULL : &j->recs[rec[k]];
        secs[k] = r && !strcmp(r->status, "ok") && r->median_s > 0 ? r->median_s : INFINITY;
    }
    free(rec);
    return rc;
}

static bool stop_now(const pl_job *j, const htam_opts *o, double t0)
{
    if (j->o.cancel && __atomic_load_n(j->o.cancel, __ATOMIC_ACQUIRE)) return true;
    return o->seconds > 0 && tlm_now_s() - t0 >= o->seconds;
}

/* One kernel's refinement in progress (htam_run runs one to the end; htam_tasks runs many
 * in rounds). */
typedef struct {
    htam *m;
    pl_job *j;
    htam_opts o;
    htam_result *res;
    tune_eval_fn eval;
    void *eval_user;
    int64_t *vals;
    space_sched *cands; /* per local: the operator's rewrite of the current best */
    int *cslot;         /* per local: the slot it rewrites */
    int64_t *cval;      /* per local: the operator's value */
    bool *lok, *lnew;   /* per local: it applies; its rewrite is new */
    double *lscore;
    uint64_t *seen;
    int nseen;
    uint64_t rng;
    int cur, prev_g[3];
    bool last_failed, started, exhausted;
    double t0;
} hrun;

static void hrun_free(hrun *h)
{
    free(h->vals);
    free(h->cands);
    free(h->cslot);
    free(h->cval);
    free(h->lok);
    free(h->lnew);
    free(h->lscore);
    free(h->seen);
}

static int hrun_init(hrun *h, htam *m, pl_job *j, int start, const htam_opts *o, htam_result *res,
                     double t0, tlm_error *err)
{
    memset(h, 0, sizeof *h);
    memset(res, 0, sizeof *res);
    res->best_cand = -1;
    res->first_s = res->best_s = INFINITY;
    res->confirmed_s = res->first_confirmed_s = NAN;
    if (start < 0 || start >= j->n_cands)
        return tlm_err_set(err, TLM_EINVAL, "start", "no starting candidate");
    if (o->steps < 1) return tlm_err_set(err, TLM_EINVAL, "budget.trials", "must be at least 1");
    h->m = m, h->j = j, h->o = *o, h->res = res, h->cur = start, h->t0 = t0;
    h->eval = o->eval ? o->eval : eval_local;
    h->eval_user = o->eval ? o->eval_user : NULL;
    res->traj = calloc((size_t)o->steps, sizeof *res->traj);
    h->vals = malloc(SPACE_MAX_VALUES * sizeof *h->vals);
    h->cands = calloc((size_t)m->nl, sizeof *h->cands);
    h->cslot = calloc((size_t)m->nl, sizeof *h->cslot);
    h->cval = calloc((size_t)m->nl, sizeof *h->cval);
    h->lok = calloc((size_t)m->nl, sizeof *h->lok);
    h->lnew = calloc((size_t)m->nl, sizeof *h->lnew);
    h->lscore = calloc((size_t)m->nl, sizeof *h->lscore);
    h->seen = calloc((size_t)o->steps + 2, sizeof *h->seen);
    h->prev_g[0] = h->prev_g[1] = h->prev_g[2] = -1;
    h->rng = o->seed ? o->seed : 1;
    for (int i = 0; i < 4; i++)
        rnd(&h->rng);
    if (!res->traj || !h->vals || !h->cands || !h->cslot || !h->cval || !h->lok || !h->lnew ||
        !h->lscore || !h->seen) {
        hrun_free(h);
        free(res->traj);
        res->traj = NULL;
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    return 0;
}

/* Measures the starting point. */
static int hrun_start(hrun *h, tlm_error *err)
{
    pl_job *j = h->j;
    htam_result *res = h->res;
    int start = h->cur, rec0 = j->n_recs;
    double secs = INFINITY;
    int rc = h->eval(j, &start, 1, &secs, h->eval_user, err);
    if (rc) return rc;
    h->started = true;
    h->seen[h->nseen++] = tune_sched_hash(&j->cands[start].sched);
    res->first_s = res->best_s = secs;
    res->best_cand = isfinite(secs) ? start : -1;
    res->traj[0] = (htam_step){.global = -1,
                               .local = -1,
                               .ms = secs * 1e3,
                               .gen = HTAM_GEN_START,
                               .cand = start,
                               .from_cand = -1,
                               .slot = -1};
    res->steps = 0;
    if (j->o.on_records && j->n_recs > rec0) j->o.on_records(j, rec0, j->n_recs, j->o.user);
    return 0;
}

/* Chooses a direction and a strategy among those marked in lok; l < 0 when none. */
static void hrun_choose_strategy(hrun *h, int *gout, int *lout)
{
    htam *m = h->m;
    const htam_opts *o = &h->o;
    bool gok[64] = {0};
    for (int k = 0; k < m->nl; k++)
        if (h->lok[k]) gok[m->l[k].g] = true;
    int g = -1, l = -1;
    if (o->memory == HTAM_FLAT) {
        double ltotal = 0;
        for (int k = 0; k < m->nl; k++)
            ltotal += m->ls[k].n;
        for (int k = 0; k < m->nl; k++)
            h->lscore[k] = q(&m->ls[k]) + explore(&m->ls[k], ltotal);
        l = softmax_pick(h->lscore, h->lok, m->nl, o->temperature, &h->rng);
        g = l >= 0 ? m->l[l].g : -1;
    } else {
        double gtotal = 0;
        for (int k = 0; k < m->ng; k++)
            gtotal += m->gs[k].n;
        double gscore[64];
        for (int k = 0; k < m->ng; k++) {
            gscore[k] = q(&m->gs[k]) + explore(&m->gs[k], gtotal);
            if (o->memory != HTAM_NO_TRANSITIONS) {
                static const double w[3] = {1.0, 0.5, 0.25};
                for (int p = 0; p < 3; p++)
                    if (h->prev_g[p] >= 0) gscore[k] += w[p] * q(&m->es[h->prev_g[p] * m->ng + k]);
            }
        }
        g = softmax_pick(gscore, gok, m->ng, o->temperature, &h->rng);
        /* the local strategy under it */
        bool under[64] = {0};
        double ltotal = 0;
        for (int k = 0; k < m->nl; k++) {
            under[k] = h->lok[k] && m->l[k].g == g;
            if (m->l[k].g == g) ltotal += m->ls[k].n;
        }
        if (o->memory == HTAM_NO_LOCAL) {
            for (int k = 0; k < m->nl; k++)
                h->lscore[k] = 0;
        } else {
            for (int k = 0; k < m->nl; k++) {
                const stats *s = &m->ls[k];
                h->lscore[k] = q(s) + explore(s, ltotal);
                /* after a failure, the strategies that tend to fail are avoided */
                if (h->last_failed && s->n > 0) h->lscore[k] -= s->fails / s->n;
            }
        }
        l = g >= 0 ? softmax_pick(h->lscore, under, m->nl, o->temperature, &h->rng) : -1;
    }
    *gout = g, *lout = l;
}

/* One step: a strategy rewrites the current best, the result is measured and the memory
 * learns. 1 when a step was taken, 0 when no strategy has anything new, else an error. */
static int hrun_step(hrun *h, tlm_error *err)
{
    htam *m = h->m;
    pl_job *j = h->j;
    htam_result *res = h->res;
    const htam_opts *o = &h->o;
    const space_sched *base = &j->cands[h->cur].sched;
    /* what every strategy's operator would make of the current best (legal; new or not) */
    int n_ok = 0;
    for (int l = 0; l < m->nl; l++) {
        h->lok[l] = pick_slot(j->sp, base, &m->l[l], &h->rng, h->vals, &h->cslot[l], &h->cval[l]);
        h->lnew[l] = false;
        if (h->lok[l]) {
            rewrite(j->sp, base, h->cslot[l], h->cval[l], &h->cands[l]);
            h->lnew[l] = !seen_has(h->seen, h->nseen, tune_sched_hash(&h->cands[l]));
        }
        /* without a model only a new rewrite is a candidate; with one, the model may still
         * find a new value where the operator's is measured already */
        if (!o->model) h->lok[l] = h->lnew[l];
        n_ok += h->lok[l];
    }
    int g = -1, l = -1;
    htam_gen gen = HTAM_GEN_MUTATION;
    space_sched next;
    while (n_ok > 0) {
        hrun_choose_strategy(h, &g, &l);
        if (l < 0) break;
        if (o->model) {
            int got = regen_tlm(o->model, j->sp, base, &m->l[l], h->cslot[l], h->seen, h->nseen,
                                &next, err);
            if (got == TLM_ENOMEM) return got;
            if (got == 1) {
                gen = HTAM_GEN_TLM;
                break;
            }
            /* the model offered nothing new (or could not decode): the operator's value */
            if (h->lnew[l]) {
                next = h->cands[l];
                gen = HTAM_GEN_MUTATION;
                res->fallbacks++;
                break;
            }
            h->lok[l] = false;
            n_ok--;
            l = -1;
            continue;
        }
        next = h->cands[l];
        break;
    }
    if (l < 0) return 0; /* a local optimum of every strategy: nothing new to try */
    int rc = pl_add_candidate(j, &next, PL_SRC_HTAM, NAN, err);
    if (rc) return rc;
    int ci = j->n_cands - 1;
    base = &j->cands[h->cur].sched; /* the candidates may have moved */
    int slot = h->cslot[l];
    int64_t from = base->v[slot], to = next.v[slot];
    h->seen[h->nseen++] = tune_sched_hash(&next);
    int rec0 = j->n_recs;
    double secs = INFINITY;
    rc = h->eval(j, &ci, 1, &secs, h->eval_user, err);
    if (rc) return rc;
    if (j->o.on_records && j->n_recs > rec0) j->o.on_records(j, rec0, j->n_recs, j->o.user);
    /* the reward, and what the memory learns */
    bool failed = !isfinite(secs);
    double before = res->best_s;
    double r = failed ? -1.0 : isfinite(before) ? fmax(-1.0, fmin(1.0, log(before / secs))) : 1.0;
    bool improved = !failed && secs < before;
    int *prev_g = h->prev_g;
    stats *st[3] = {&m->gs[g], &m->ls[l], prev_g[0] >= 0 ? &m->es[prev_g[0] * m->ng + g] : NULL};
    for (int k = 0; k < 3; k++) {
        if (!st[k]) continue;
        st[k]->n += 1;
        st[k]->reward += r;
        st[k]->wins += improved;
        st[k]->fails += failed;
    }
    json_array_insert_new(
        m->evidence_new[l], 0,
        json_pack("{s:s, s:o, s:o, s:b, s:s, s:s}", "workload", j->whash, "before_ms",
                  isfinite(before) ? json_real(before * 1e3) : json_null(), "after_ms",
                  failed ? json_null() : json_real(secs * 1e3), "failed", failed, "gen",
                  htam_gen_name(gen), "slot", j->sp->slot[slot].name));
    while (json_array_size(m->evidence_new[l]) > MAX_EVIDENCE)
        json_array_remove(m->evidence_new[l], MAX_EVIDENCE);
    int step = res->steps + 1;
    res->traj[step] = (htam_step){.global = g,
                                  .local = l,
                                  .ms = failed ? INFINITY : secs * 1e3,
                                  .improved = improved,
                                  .gen = gen,
                                  .cand = ci,
                                  .from_cand = h->cur,
                                  .slot = slot,
                                  .from = from,
                                  .to = to};
    res->steps = step;
    if (improved) {
        res->best_s = secs;
        res->best_cand = ci;
        h->cur = ci;
    }
    h->last_failed = failed;
    prev_g[2] = prev_g[1], prev_g[1] = prev_g[0], prev_g[0] = g;
    if (j->o.progress) {
        pl_progress p = {.trials = step + 1,
                         .trials_budget = o->steps,
                         .elapsed_s = tlm_now_s() - h->t0,
                         .best_s = res->best_s,
                         .first_s = res->first_s,
                         .best_cand = res->best_cand,
                         .round = step,
                         .phase = "measure"};
        j->o.progress(j, &p, j->o.user);
    }
    return 1;
}

/* Up to `budget` measurements (the starting point first); the count made, 0 when there is
 * nothing left to try (or no time), else an error. */
static int hrun_round(hrun *h, int budget, tlm_error *err)
{
    int made = 0;
    if (!h->started && budget > 0) {
        int rc = hrun_start(h, err);
        if (rc) return rc;
        made++;
    }
    /* steps counts measurements, the starting point's included */
    while (made < budget && !h->exhausted && h->res->steps + 1 < h->o.steps &&
           !stop_now(h->j, &h->o, h->t0)) {
        int got = hrun_step(h, err);
        if (got < 0) return got;
        if (got == 0) h->exhausted = true;
        made += got;
    }
    return made;
}

/* The second look: the `confirm` fastest distinct candidates of the trajectory and the
 * starting point, measured again in rotating rounds; the fastest median there is the best.
 * The memory keeps what the steps taught it (their own measurements). */
static int hrun_confirm(hrun *h, tlm_error *err)
{
    htam_result *res = h->res;
    int k = h->o.confirm, ns = res->steps + 1;
    if (k <= 0 || res->best_cand < 0 || !res->traj) return 0;
    if (h->j->o.cancel && __atomic_load_n(h->j->o.cancel, __ATOMIC_ACQUIRE)) return 0;
    int fast[8], n = 0;
    if (k > 8) k = 8;
    bool *used = calloc((size_t)ns, sizeof *used);
    if (!used) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    while (n < k) { /* the k fastest steps' distinct candidates, fastest first */
        int b = -1;
        for (int s = 0; s < ns; s++)
            if (!used[s] && isfinite(res->traj[s].ms) &&
                (b < 0 || res->traj[s].ms < res->traj[b].ms))
                b = s;
        if (b < 0) break;
        used[b] = true;
        bool dup = false;
        for (int i = 0; i < n; i++) dup = dup || fast[i] == res->traj[b].cand;
        if (!dup) fast[n++] = res->traj[b].cand;
    }
    free(used);
    bool won;
    tune_confirmed c;
    int rc = tune_confirm(h->j, fast, n, isfinite(res->traj[0].ms) ? res->traj[0].cand : -1,
                          h->o.confirm_rounds, h->eval, h->eval_user, &won, &c, err);
    if (rc || !won) return rc;
    res->best_cand = c.best_cand;
    res->confirmed = c.confirmed;
    res->confirmed_s = c.confirmed_s;
    res->first_confirmed_s = c.first_confirmed_s;
    return 0;
}

/* The best is rebuilt and chosen (TUNE jobs). */
static int hrun_choose(hrun *h, tlm_error *err)
{
    pl_job *j = h->j;
    htam_result *res = h->res;
    if (j->o.mode != PL_MODE_TUNE) return 0;
    if (res->best_cand < 0)
        return tlm_err_set(err, TLM_ERUNTIME, "",
                           "HTAM: neither the starting point nor any step was correct");
    drv_artifact a;
    tlm_error be;
    tlm_err_clear(&be);
    int ri = pl_evaluate(j, res->best_cand, false, &a, &be);
    if (ri < 0 || !a.binary) {
        *err = be;
        return ri < 0 ? ri : be.code ? be.code : TLM_ERUNTIME;
    }
    measure_result mr;
    memset(&mr, 0, sizeof mr);
    mr.status = MEASURE_OK;
    mr.median_s = isfinite(res->confirmed_s) ? res->confirmed_s : res->best_s;
    mr.rel_err = -1;
    pl_choose(j, res->best_cand, &a, &mr, "htam");
    j->source = PL_SRC_HTAM;
    return 0;
}

int htam_run(htam *m, pl_job *j, int start, const htam_opts *o, htam_result *res, tlm_error *err)
{
    hrun h;
    int rc = hrun_init(&h, m, j, start, o, res, tlm_now_s(), err);
    if (rc) return rc;
    rc = hrun_round(&h, o->steps, err);
    if (rc >= 0) rc = hrun_confirm(&h, err);
    if (rc >= 0) rc = hrun_choose(&h, err);
    hrun_free(&h);
    return rc;
}

typedef struct {
    hrun *h;
    tune_task *tasks;
    int round;
} htam_sched;

static int htam_task_round(int task, int budget, void *user, tlm_error *err)
{
    htam_sched *s = user;
    hrun *h = &s->h[task];
    int got = hrun_round(h, budget < s->round ? budget : s->round, err);
    if (got < 0) return got;
    tune_task *tk = &s->tasks[task];
    tk->trials = h->started ? h->res->steps + 1 : 0;
    tk->best_s = h->res->best_s;
    tk->first_s = h->res->first_s;
    return got;
}

int htam_tasks(htam *m, tune_task *tasks, int n, const htam_opts *o, int round, htam_result *res,
               tune_task_progress_fn progress, void *user, tlm_error *err)
{
    if (n <= 0) return 0;
    hrun *h = calloc((size_t)n, sizeof *h);
    htam_result *own = res ? NULL : calloc((size_t)n, sizeof *own);
    htam_result *r = res ? res : own;
    if (!h || !r) {
        free(h);
        free(own);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    int rc = 0, inited = 0;
    const double t0 = tlm_now_s();
    for (int i = 0; i < n && !rc; i++) {
        htam_opts oi = *o;
        oi.seed = (o->seed ? o->seed : 1) + 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1);
        pl_job *j = tasks[i].job;
        if (!j->o.mo.seed) j->o.mo.seed = oi.seed | 1;
        rc = hrun_init(&h[i], m, j, 0, &oi, &r[i], t0, err);
        if (!rc) inited++;
    }
    htam_sched s = {.h = h, .tasks = tasks, .round = round > 0 ? round : 4};
    if (!rc)
        rc = tune_schedule(tasks, n, o->steps, o->seconds, o->seed, tasks[0].job->o.cancel,
                           htam_task_round, &s, progress, user, err);
    int first_failed = -1;
    for (int i = 0; i < inited && !rc; i++) {
        tlm_error ce;
        tlm_err_clear(&ce);
        int cr = hrun_choose(&h[i], &ce);
        if (cr == TLM_ERUNTIME && first_failed < 0) {
            first_failed = i;
        } else if (cr) {
            *err = ce;
            rc = cr;
        }
    }
    if (!rc && first_failed >= 0)
        rc = tlm_err_set(err, TLM_ERUNTIME, "", "task %d: HTAM measured nothing correct",
                         first_failed);
    for (int i = 0; i < inited; i++)
        hrun_free(&h[i]);
    for (int i = 0; own && i < inited; i++)
        htam_result_free(&own[i]);
    free(own);
    free(h);
    return rc;
}

/* ---- the TUNE hook's HTAM branch ---- */

static htam_store_io g_io;
static bool g_io_set;
static const tlm_model *g_regen_model;

void htam_set_regen_model(const tlm_model *model)
{
    g_regen_model = model;
}

void htam_set_store_io(const htam_store_io *io)
{
    if (io) {
        g_io = *io;
        g_io_set = true;
    } else {
        g_io_set = false;
    }
}

/* The starting point: the model's one pass when a model is served, else the default. */
static int add_start(pl_job *j, tlm_error *err)
{
    if (j->o.model) {
        tlm_candidate c;
        int n = 0;
        tlm_error me;
        if (tlm_select_generate(j->o.model, j->sp, 1, &c, &n, &me) == 0 && n == 1) {
            int rc = pl_add_candidate(j, &c.sched, PL_SRC_TLM, c.score, err);
            if (rc) return rc;
        }
    }
    if (j->n_cands > 0) return 0;
    space_sched s;
    space_default(j->sp, &s);
    return pl_add_candidate(j, &s, PL_SRC_DEFAULT, NAN, err);
}

int htam_search_hook(pl_job *j, tlm_error *err)
{
    htam *m = htam_new(j->tgt.kind);
    if (!m) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    const htam_store_io *io = g_io_set ? &g_io : NULL;
    int rc = htam_load(m, io, err);
    if (!rc) rc = add_start(j, err);
    htam_opts o;
    htam_opts_init(&o);
    if (j->o.trials > 0) o.steps = j->o.trials;
    o.seconds = j->o.seconds;
    if (j->o.seed) o.seed = j->o.seed;
    o.model = g_regen_model;
    if (!j->o.mo.seed) j->o.mo.seed = o.seed * 0x9e3779b97f4a7c15ull | 1;
    htam_result res;
    memset(&res, 0, sizeof res);
    if (!rc) rc = htam_run(m, j, 0, &o, &res, err);
    if (!rc) {
        tlm_error se;
        if (htam_save(m, io, &se)) fprintf(stderr, "htam: saving the memory: %s\n", se.msg);
    }
    htam_result_free(&res);
    htam_free(m);
    return rc;
}

int htam_search_tasks(tune_task *tasks, int n, int trials, double seconds, uint64_t seed,
                      tlm_error *err)
{
    if (n <= 0) return 0;
    htam *m = htam_new(tasks[0].job->tgt.kind);
    if (!m) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    const htam_store_io *io = g_io_set ? &g_io : NULL;
    int rc = htam_load(m, io, err);
    for (int i = 0; i < n && !rc; i++)
        rc = add_start(tasks[i].job, err);
    htam_opts o;
    htam_opts_init(&o);
    o.steps = trials > 0 ? trials : 32 * n;
    o.seconds = seconds;
    if (seed) o.seed = seed;
    o.model = g_regen_model;
    if (!rc) rc = htam_tasks(m, tasks, n, &o, 0, NULL, NULL, NULL, err);
    /* what was learnt is kept even when a kernel found nothing correct */
    tlm_error se;
    if (htam_save(m, io, &se)) fprintf(stderr, "htam: saving the memory: %s\n", se.msg);
    htam_free(m);
    return rc;
}
