/* cmd_train.c — `tlm train`: teach the TLM to write the schedules that measured fastest.
 *
 *   tlm train --records FILE... --out FILE [--init FILE|random] [model shape] [options]
 *
 * Data: measurement records (JSONL, `tlm records export`, format tlm-records/1). Records are
 * grouped by (workload, target, sketch); the schedules that ran correctly are ranked by
 * median time and the best --top of each group become training sentences
 * (prompt ‖ decisions ‖ [EOS], rebuilt here from the workload, target and schedule text, so
 * records outlive vocabulary changes as long as the schedule still parses), weighted by
 * (best / time)^--alpha. The loss covers the value tokens only: the prompt and the tokens the
 * grammar forces (slot names, [EOS]) carry no decision. A record whose schedule no longer
 * parses in today's space is counted as stale and skipped.
 *
 * Labels: records with status "ok" are measurements; records with status "modelled" carry
 * the analytic GPU model's prediction (cuda targets trained without a GPU: `tlm datagen
 * --labels model`). Both are labels, never mixed: in a group that has any measurement, the
 * modelled records are dropped (counted as records_modelled_superseded), so imported GPU
 * measurements take over from the model group by group. The summary counts the records and
 * groups of each kind per target ("labels", and "labels_line", the text MANIFEST's labels
 * line is written from).
 *
 * Validation: groups whose workload hash falls in the --val-pct bucket are held out (never
 * trained on); their loss is reported every --eval-every steps and, at the end, how often
 * greedy decoding writes exactly the best measured schedule (val_exact) and the share of
 * decision slots it gets right (val_slots); train_exact / train_slots say the same of (up to
 * 200) training groups: how well the model fits its labels.
 *
 * Pre-training (--pretrain-steps N): the first N steps train on uniform samples of the
 * training groups' spaces (drawn from the seed and the step), which teaches the grammar's
 * distribution of legal values before the measured labels refine it.
 *
 * Checkpoints (--checkpoint FILE, every --checkpoint-every steps and at the end) hold the
 * model, the optimizer and the step; --resume continues from one, and because batches are a
 * function of (seed, step) alone, a resumed run is bitwise identical to one never stopped
 * (same build, same OpenBLAS threads). Prints one JSON summary; progress as JSON lines on
 * stderr (and --log FILE). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cblas.h>

#include "compiler/driver/driver.h"
#include "compiler/measure/gpu_model.h"
#include "compiler/lang/lang.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/tlm/select.h"
#include "compiler/tlm/tlm.h"
#include "compiler/tlm/train.h"
#include "compiler/util/util.h"
#include "proto/workload.h"
#include "tools/tlm/cli.h"

static const char train_usage[] =
    "usage: tlm train --records FILE [--records FILE ...] --out FILE [options]\n"
    "  trains the TLM on the best measured schedules of each (workload, target, sketch)\n"
    "model:\n"
    "  --init FILE|random  start from a weight file, or a fresh model (default random)\n"
    "  --layers L --heads H --dim D --ctx T   shape of a fresh model (4, 4, 128, auto)\n"
    "data:\n"
    "  --top K             best schedules per group (default 2)\n"
    "  --alpha A           weight (best/time)^A (default 4)\n"
    "  --margin M          the default schedule stays the label unless the best measured\n"
    "                      beats it by more than M (default 0: the fastest is the label)\n"
    "  --target NAME       only records of this target name (default: all)\n"
    "  --val-pct P         groups held out for validation, by workload hash (default 10)\n"
    "  --teacher N         N workloads per training group with its extents perturbed, each\n"
    "                      labelled with its space's default schedule (no measurement: the\n"
    "                      rule of thumb taught over many shapes; default 0)\n"
    "  --teacher-weight W  those examples' weight (default 1; a measured best weighs 1)\n"
    "  --teacher-targets L the copies' targets, taken in turn (comma-separated, e.g.\n"
    "                      cpu,cpu:avx2; default: each group's own target)\n"
    "optimisation:\n"
    "  --steps N           optimizer steps (default 2000)\n"
    "  --pretrain-steps N  of which the first N on uniform samples (default 0)\n"
    "  --batch B           sentences per step (default 16)\n"
    "  --lr X              peak learning rate (default 1e-3); --warmup N (default 100)\n"
    "  --weight-decay X    (default 0.1)\n"
    "  --seed S            batches, samples and a fresh model's init (default 1)\n"
    "  --eval-every N      validation loss every N steps (default 200)\n"
    "  --checkpoint FILE   save every --checkpoint-every N steps (default 500) and at the end\n"
    "  --resume            continue from --checkpoint\n"
    "  --until N           stop after step N (saving the checkpoint); the schedule still\n"
    "                      spans --steps, so runs can be cut into pieces and resumed\n"
    "  --log FILE          progress JSON lines (also on stderr unless --quiet)\n";

typedef struct {
    char *sched;
    double s;
    bool is_default; /* today's default schedule (space_default), whatever made the record */
    bool modelled;   /* status "modelled": a GPU-model prediction, not a measurement */
} tr_meas;

typedef struct {
    char whash[IR_HASH_HEX];
    char target[64];
    char sketch[32];
    json_t *workload;
    tr_meas *m;
    int n, cap;
    /* built */
    bool built, val;
    bool teacher; /* a --teacher workload: no records, the label is its space's default */
    ir_subgraph *g;
    space *sp;
    space_sched best;
    int first_ex, n_ex; /* its examples in the example table */
    int next;           /* the next group with a workload hash in the same bucket, or -1 */
} tr_group;

typedef struct {
    int32_t *tokens;
    uint8_t *mask;
    int n, n_prompt;
    float weight;
    int group;
} tr_ex;

typedef struct {
    const char *records[64];
    int n_records;
    const char *out, *init, *target, *checkpoint, *log;
    char teacher_tg[8][64]; /* --teacher-targets, and each parsed */
    target teacher_t[8];
    int n_teacher_tg;
    uint64_t layers, heads, dim, ctx, top, steps, pretrain, batch, warmup, seed, eval_every,
        ckpt_every, val_pct, until, teacher;
    double alpha, lr, wd, margin, teacher_w;
    bool resume, quiet;
} tr_args;

typedef struct {
    tr_group *g;
    int n, cap;
    int *bucket; /* groups by workload hash: the first in each of n_bucket chains, or -1 */
    int n_bucket;
    tr_ex *ex;
    int n_ex, cap_ex;
    long read, ok, stale, skipped;
    long modelled, superseded; /* of ok: modelled records; modelled records dropped */
    long teacher_tries, teacher_groups; /* perturbed workloads tried; built and labelled */
    int max_len;
} tr_data;

/* ---- records ---- */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* The first group of workload hash wh (its chain goes on through .next), or -1. */
static int group_first(const tr_data *d, const char *wh)
{
    if (!d->n_bucket) return -1;
    int i = d->bucket[fnv1a(wh) & (uint64_t)(d->n_bucket - 1)];
    while (i >= 0 && strcmp(d->g[i].whash, wh)) i = d->g[i].next;
    return i;
}

static int group_next(const tr_data *d, int i)
{
    const char *wh = d->g[i].whash;
    for (i = d->g[i].next; i >= 0 && strcmp(d->g[i].whash, wh); i = d->g[i].next) {}
    return i;
}

/* Chains group i into its bucket; the table doubles (rehashing every group) past half full. */
static int group_index(tr_data *d, int i)
{
    if (2 * (d->n + 1) > d->n_bucket) {
        int nb = d->n_bucket ? 2 * d->n_bucket : 1024;
        int *b = malloc((size_t)nb * sizeof *b);
        if (!b) return -1;
        for (int k = 0; k < nb; k++) b[k] = -1;
        free(d->bucket);
        d->bucket = b;
        d->n_bucket = nb;
        for (int q = 0; q < i; q++) {
            int h = (int)(fnv1a(d->g[q].whash) & (uint64_t)(nb - 1));
            d->g[q].next = b[h];
            b[h] = q;
        }
    }
    int h = (int)(fnv1a(d->g[i].whash) & (uint64_t)(d->n_bucket - 1));
    d->g[i].next = d->bucket[h];
    d->bucket[h] = i;
    return 0;
}

static tr_group *group_for(tr_data *d, const char *wh, const char *tg, const char *sk, json_t *wl)
{
    for (int i = group_first(d, wh); i >= 0; i = group_next(d, i))
        if (!strcmp(d->g[i].target, tg) && !strcmp(d->g[i].sketch, sk)) return &d->g[i];
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 256;
        tr_group *v = realloc(d->g, (size_t)cap * sizeof *v);
        if (!v) return NULL;
        d->g = v;
        d->cap = cap;
    }
    tr_group *g = &d->g[d->n];
    memset(g, 0, sizeof *g);
    snprintf(g->whash, sizeof g->whash, "%s", wh);
    snprintf(g->target, sizeof g->target, "%s", tg);
    snprintf(g->sketch, sizeof g->sketch, "%s", sk);
    if (group_index(d, d->n)) return NULL;
    d->n++;
    g->workload = json_incref(wl);
    return g;
}

static int read_records(const char *path, const tr_args *a, tr_data *d, tlm_error *err)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
    if (!f) return tlm_err_set(err, TLM_EINVAL, "--records", "%s: cannot open", path);
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    int rc = 0;
    while (!rc && getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t je;
        json_t *r = json_loads(line, 0, &je);
        d->read++;
        if (!r) {
            rc = tlm_err_set(err, TLM_EINVAL, "--records", "%s:%ld: %s", path, lineno, je.text);
            break;
        }
        const char *st = json_string_value(json_object_get(r, "status"));
        const char *wh = json_string_value(json_object_get(r, "workload_hash"));
        const char *tg = json_string_value(json_object_get(r, "target"));
        const char *sk = json_string_value(json_object_get(r, "sketch"));
        const char *sc = json_string_value(json_object_get(r, "schedule"));
        json_t *wl = json_object_get(r, "workload");
        double s = json_number_value(json_object_get(r, "median_s"));
        if (!st || !wh || !tg || !sk || !sc || !json_is_object(wl)) {
            rc = tlm_err_set(err, TLM_EINVAL, "--records",
                             "%s:%ld: not a measurement record (tlm-records/1)", path, lineno);
        } else if ((strcmp(st, "ok") && strcmp(st, "modelled")) || !(s > 0) ||
                   (a->target && strcmp(a->target, tg))) {
            d->skipped++;
        } else {
            tr_group *g = group_for(d, wh, tg, sk, wl);
            if (g && g->n == g->cap) {
                int c = g->cap ? 2 * g->cap : 16;
                tr_meas *v = realloc(g->m, (size_t)c * sizeof *v);
                if (v) g->m = v, g->cap = c;
            }
            if (!g || g->n == g->cap) {
                rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
            } else {
                g->m[g->n].sched = strdup(sc);
                g->m[g->n].is_default = false; /* decided against today's space */
                g->m[g->n].modelled = !strcmp(st, "modelled");
                d->modelled += g->m[g->n].modelled;
                g->m[g->n++].s = s;
                d->ok++;
            }
        }
        json_decref(r);
    }
    free(line);
    if (f != stdin) fclose(f);
    return rc;
}

static int cmp_meas(const void *x, const void *y)
{
    const tr_meas *a = x, *b = y;
    return a->s < b->s ? -1 : a->s > b->s ? 1 : strcmp(a->sched, b->sched);
}

/* The full sentence of schedule s in sp and its loss mask (value tokens only). */
static int encode(const space *sp, const space_sched *s, int32_t *toks, uint8_t *mask,
                  int *n_prompt)
{
    int t[LANG_MAX_SENTENCE];
    int np = lang_encode_prompt(sp, t, LANG_MAX_SENTENCE);
    if (np < 0) return np;
    int nd = lang_encode_decisions(sp, s, t + np, LANG_MAX_SENTENCE - np);
    if (nd < 0) return nd;
    lang_state st;
    if (lang_state_init(&st, sp)) return TLM_ENOMEM;
    uint64_t *bits = calloc(((size_t)lang_vocab_size() + 63) / 64, sizeof *bits);
    int rc = bits ? 0 : TLM_ENOMEM;
    for (int i = 0; i < np + nd; i++) {
        toks[i] = t[i];
        mask[i] = 0;
        if (i < np || rc) continue;
        int forced = lang_state_next(&st, bits);
        mask[i] = forced == -1;
        if (lang_state_push(&st, t[i])) rc = TLM_EINVAL;
    }
    free(bits);
    lang_state_free(&st);
    *n_prompt = np;
    return rc ? rc : np + nd;
}

static int add_example(tr_data *d, const space *sp, const space_sched *s, float w, int group)
{
    int32_t toks[LANG_MAX_SENTENCE];
    uint8_t mask[LANG_MAX_SENTENCE];
    int np = 0, n = encode(sp, s, toks, mask, &np);
    if (n < 0) return n;
    if (d->n_ex == d->cap_ex) {
        int c = d->cap_ex ? 2 * d->cap_ex : 256;
        tr_ex *v = realloc(d->ex, (size_t)c * sizeof *v);
        if (!v) return TLM_ENOMEM;
        d->ex = v;
        d->cap_ex = c;
    }
    tr_ex *e = &d->ex[d->n_ex];
    e->tokens = malloc((size_t)n * sizeof *e->tokens);
    e->mask = malloc((size_t)n);
    if (!e->tokens || !e->mask) {
        free(e->tokens);
        free(e->mask);
        return TLM_ENOMEM;
    }
    memcpy(e->tokens, toks, (size_t)n * sizeof *toks);
    memcpy(e->mask, mask, (size_t)n);
    e->n = n;
    e->n_prompt = np;
    e->weight = w;
    e->group = group;
    d->n_ex++;
    if (n > d->max_len) d->max_len = n;
    return 0;
}

/* Measured labels win: a group with any measurement drops its modelled records. */
static void drop_superseded(tr_data *d)
{
    for (int gi = 0; gi < d->n; gi++) {
        tr_group *g = &d->g[gi];
        bool measured = false;
        for (int k = 0; k < g->n && !measured; k++)
            measured = !g->m[k].modelled;
        if (!measured) continue;
        int kept = 0;
        for (int k = 0; k < g->n; k++) {
            if (g->m[k].modelled) {
                free(g->m[k].sched);
                d->superseded++;
                d->modelled--;
                d->ok--;
            } else {
                g->m[kept++] = g->m[k];
            }
        }
        g->n = kept;
    }
}

/* Per target: records and built groups of each label kind, as JSON and as one line of text
 * ("cpu:avx2: measured (120 records, 3 groups); cuda:sm_90: modelled by gpu_model/1 (...)"). */
static json_t *labels_summary(const tr_data *d, char *line, size_t cap)
{
    json_t *o = json_object();
    for (int gi = 0; gi < d->n; gi++) {
        const tr_group *g = &d->g[gi];
        if (g->teacher) continue;
        json_t *t = json_object_get(o, g->target);
        if (!t) {
            t = json_pack("{s:I, s:I, s:I, s:I}", "measured_records", (json_int_t)0,
                          "modelled_records", (json_int_t)0, "measured_groups", (json_int_t)0,
                          "modelled_groups", (json_int_t)0);
            json_object_set_new(o, g->target, t);
        }
        long mod = 0;
        for (int k = 0; k < g->n; k++)
            mod += g->m[k].modelled;
        const char *keys[2][2] = {{"measured_records", "measured_groups"},
                                  {"modelled_records", "modelled_groups"}};
        json_int_t nm = json_integer_value(json_object_get(t, keys[0][0]));
        json_int_t nd = json_integer_value(json_object_get(t, keys[1][0]));
        json_object_set_new(t, keys[0][0], json_integer(nm + (g->n - mod)));
        json_object_set_new(t, keys[1][0], json_integer(nd + mod));
        if (g->built) {
            const char *gk = keys[g->n > 0 && g->m[0].modelled][1];
            json_object_set_new(t, gk,
                                json_integer(json_integer_value(json_object_get(t, gk)) + 1));
        }
    }
    size_t len = 0;
    line[0] = 0;
    const char *name;
    json_t *t;
    json_object_foreach(o, name, t)
    {
        json_int_t mr = json_integer_value(json_object_get(t, "measured_records"));
        json_int_t dr = json_integer_value(json_object_get(t, "modelled_records"));
        json_int_t mg = json_integer_value(json_object_get(t, "measured_groups"));
        json_int_t dg = json_integer_value(json_object_get(t, "modelled_groups"));
        char part[256];
        if (mr && dr)
            snprintf(part, sizeof part,
                     "%s: measured (%lld records, %lld groups) and modelled by the GPU model "
                     "(%lld records, %lld groups)",
                     name, (long long)mr, (long long)mg, (long long)dr, (long long)dg);
        else if (dr)
            snprintf(part, sizeof part, "%s: modelled by the GPU model (%lld records, %lld groups)",
                     name, (long long)dr, (long long)dg);
        else
            snprintf(part, sizeof part, "%s: measured (%lld records, %lld groups)", name,
                     (long long)mr, (long long)mg);
        int n = snprintf(line + len, cap - len, "%s%s", len ? "; " : "", part);
        if (n < 0 || (size_t)n >= cap - len) break;
        len += (size_t)n;
    }
    return o;
}

/* Rebuilds each group's space and turns its best schedules into examples. */
static int build_examples(tr_data *d, const tr_args *a, tlm_error *err)
{
    for (int gi = 0; gi < d->n; gi++) {
        tr_group *g = &d->g[gi];
        qsort(g->m, (size_t)g->n, sizeof *g->m, cmp_meas);
        ir_workload w;
        target t;
        tlm_error e;
        g->g = calloc(1, sizeof *g->g);
        g->sp = calloc(1, sizeof *g->sp);
        if (!g->g || !g->sp) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        if (proto_workload_decode(g->workload, &w, &e) || target_parse(g->target, &t, &e) ||
            ir_subgraph_build(&w, g->g, &e) || space_build(g->g, &t, g->sp, &e) ||
            strcmp(space_sketch_name(g->sp->sketch), g->sketch)) {
            d->stale += g->n;
            continue;
        }
        g->val = fnv1a(g->whash) % 100 < a->val_pct;
        /* The sentences' hints are today's default, so "the default" is that schedule,
         * whether its record came from a search's first round, a relabelling or an older
         * rule of thumb. */
        space_sched def;
        space_default(g->sp, &def);
        for (int k = 0; k < g->n; k++) {
            space_sched s;
            g->m[k].is_default = !space_parse(g->sp, g->m[k].sched, &s, &e) &&
                                 !memcmp(s.v, def.v, sizeof *s.v * (size_t)g->sp->n_slot);
        }
        /* Near-ties are noise on a busy machine: unless the fastest beats the default by more
         * than --margin, the default (its best time) leads the ranking, so the model learns to
         * leave the rule of thumb only where the measurements clearly say so. */
        if (a->margin > 0) {
            int di = -1;
            for (int k = 0; k < g->n && di < 0; k++)
                if (g->m[k].is_default) di = k;
            if (di > 0 && g->m[0].s * (1 + a->margin) >= g->m[di].s) {
                tr_meas dm = g->m[di];
                memmove(&g->m[1], &g->m[0], (size_t)di * sizeof *g->m);
                g->m[0] = dm;
            }
        }
        g->first_ex = d->n_ex;
        int taken = 0;
        for (int k = 0; k < g->n && taken < (int)a->top; k++) {
            space_sched s;
            if (space_parse(g->sp, g->m[k].sched, &s, &e)) {
                d->stale++;
                continue;
            }
            bool dup = false;
            for (int q = 0; q < k && !dup; q++)
                dup = !strcmp(g->m[q].sched, g->m[k].sched);
            if (dup) continue;
            if (!taken) g->best = s;
            float wgt = (float)fmin(1.0, pow(g->m[0].s / g->m[k].s, a->alpha));
            int rc = add_example(d, g->sp, &s, wgt, gi);
            if (rc) return tlm_err_set(err, rc, "", "cannot encode a schedule of %s", g->whash);
            taken++;
        }
        g->n_ex = d->n_ex - g->first_ex;
        g->built = taken > 0;
    }
    return 0;
}

/* ---- training ---- */

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- teacher examples (--teacher) ----
 * The rule of thumb (space_default) is a function of the extents that costs nothing to
 * evaluate, while the measured groups are few (hundreds of shapes), so a model trained on them
 * alone meets unseen extents with little to go on. Each training group lends its workload to N
 * copies with perturbed extents: each shape key but the window's (KH, KW) is kept with
 * probability 1/2, else scaled by 2^u, u uniform in [-2, 2], and one time in four moved off by
 * one (odd and prime extents); a matmul's operands are each transposed or not with probability
 * 1/4 (the zoo's attention matmuls all transpose one operand, while a model's own batched
 * matmul may transpose none). With --teacher-targets the copies take those targets in turn
 * (the rule of thumb of cpu:avx2 taught from records measured on cpu: the same shapes, the
 * other ISA's lanes and registers). A copy that builds under its target is labelled
 * with its space's default schedule. Copies only train: one whose workload hash is a measured
 * group's (training or held out) or an earlier copy's is dropped, so no held-out workload is
 * ever a label, and their labels say nothing a measurement said. Seeded: the copies are a
 * function of (seed, the group's workload hash, N). */
static int add_teachers(tr_data *d, const tr_args *a, tlm_error *err)
{
    int n0 = d->n;
    for (int gi = 0; gi < n0; gi++) {
        if (!d->g[gi].built || d->g[gi].val) continue;
        ir_workload w0;
        tlm_error e;
        if (proto_workload_decode(d->g[gi].workload, &w0, &e)) continue;
        const ir_op_info *oi = ir_op_get(w0.op);
        char own[sizeof d->g[gi].target];
        memcpy(own, d->g[gi].target, sizeof own);
        target own_t;
        if (!oi || (!a->n_teacher_tg && target_parse(own, &own_t, &e))) continue;
        uint64_t s = mix(a->seed ^ mix(0x7465616368ull + fnv1a(d->g[gi].whash)));
        for (uint64_t k = 0; k < a->teacher; k++) {
            int ti = a->n_teacher_tg ? (int)(k % (uint64_t)a->n_teacher_tg) : -1;
            const char *tg = ti >= 0 ? a->teacher_tg[ti] : own;
            const target *t = ti >= 0 ? &a->teacher_t[ti] : &own_t;
            ir_workload w = w0;
            for (int q = 0; q < oi->n_keys; q++) {
                if (!strcmp(oi->keys[q], "KH") || !strcmp(oi->keys[q], "KW")) continue;
                s = mix(s);
                if (s & 1) continue;
                double u = (double)(s >> 11) / 9007199254740992.0 * 4.0 - 2.0;
                int64_t v = llround((double)w.shape[q] * exp2(u));
                if (((s >> 1) & 3) == 0) v += (s >> 3) & 1 ? 1 : -1;
                w.shape[q] = v < 1 ? 1 : v;
            }
            if (oi->fields & IR_F_TRANSPOSE) { /* either operand transposed or not */
                s = mix(s);
                if ((s & 3) == 0) w.transpose_a = !w.transpose_a;
                if (((s >> 2) & 3) == 0) w.transpose_b = !w.transpose_b;
            }
            d->teacher_tries++;
            char wh[IR_HASH_HEX];
            if (ir_workload_hash_hex(&w, wh)) continue;
            bool seen = false; /* as a measured group of any target, or an earlier copy */
            for (int q = group_first(d, wh); q >= 0 && !seen; q = group_next(d, q))
                seen = !d->g[q].teacher || !strcmp(d->g[q].target, tg);
            if (seen) continue;
            ir_subgraph *sg = calloc(1, sizeof *sg);
            space *sp = calloc(1, sizeof *sp);
            if (!sg || !sp) {
                free(sg);
                free(sp);
                return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
            }
            if (ir_subgraph_build(&w, sg, &e) || space_build(sg, t, sp, &e)) {
                free(sg);
                free(sp);
                continue;
            }
            json_t *wj = proto_workload_encode(&w);
            tr_group *g = wj ? group_for(d, wh, tg, space_sketch_name(sp->sketch), wj) : NULL;
            json_decref(wj);
            if (!g) {
                free(sg);
                free(sp);
                return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
            }
            g->g = sg;
            g->sp = sp;
            g->teacher = true;
            space_default(sp, &g->best);
            g->first_ex = d->n_ex;
            int rc = add_example(d, sp, &g->best, (float)a->teacher_w, (int)(g - d->g));
            if (rc == TLM_ENOMEM) return tlm_err_set(err, rc, "", "out of memory");
            g->n_ex = d->n_ex - g->first_ex;
            g->built = g->n_ex > 0;
            d->teacher_groups += g->built;
        }
    }
    return 0;
}

/* The training examples' order for an epoch: a permutation from (seed, epoch) alone. */
static void epoch_order(const int *train, int n, uint64_t seed, long epoch, int *out)
{
    memcpy(out, train, (size_t)n * sizeof *out);
    uint64_t s = mix(seed ^ mix((uint64_t)epoch + 1));
    for (int i = n - 1; i > 0; i--) {
        s = mix(s);
        int k = (int)(s % (uint64_t)(i + 1));
        int t = out[i];
        out[i] = out[k];
        out[k] = t;
    }
}

static void to_example(const tr_ex *e, tlm_train_example *x)
{
    x->tokens = e->tokens;
    x->n = e->n;
    x->loss_mask = e->mask;
    x->n_prompt = e->n_prompt;
    x->weight = e->weight;
}

static int val_loss(tlm_trainer *tr, const tr_data *d, const int *val, int n_val, int B,
                    double *loss, tlm_error *err)
{
    double sum = 0, wsum = 0;
    tlm_train_example *xs = calloc((size_t)B, sizeof *xs);
    if (!xs) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = 0;
    for (int i = 0; i < n_val && !rc; i += B) {
        int m = n_val - i < B ? n_val - i : B;
        double wl = 0;
        for (int k = 0; k < m; k++) {
            to_example(&d->ex[val[i + k]], &xs[k]);
            for (int t = 0; t < xs[k].n; t++)
                wl += xs[k].loss_mask[t] ? xs[k].weight : 0;
        }
        double l = 0;
        rc = tlm_trainer_eval(tr, xs, m, &l, NULL, err);
        sum += l * wl;
        wsum += wl;
    }
    free(xs);
    *loss = wsum > 0 ? sum / wsum : NAN;
    return rc;
}

static void progress(FILE *log, bool quiet, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (s) {
        if (!quiet) fprintf(stderr, "%s\n", s);
        if (log) fprintf(log, "%s\n", s), fflush(log);
    }
    free(s);
    json_decref(j);
}

/* Greedy decoding on the held-out groups (which 0), up to `cap` measured training groups
 * (which 1) or up to `cap` teacher groups (which 2), each decoded once: how often it writes
 * exactly the label (the best measured schedule; exact[0], slots[0]) and exactly the space's
 * default (exact[1], slots[1]), and the share of decision slots it gets right. */
static void decode_check(const tlm_model *m, const tr_data *d, int which, int cap,
                         double exact[2], double slots[2])
{
    int n = 0, hit[2] = {0, 0};
    long sl = 0, sl_ok[2] = {0, 0};
    for (int gi = 0; gi < d->n && n < cap; gi++) {
        const tr_group *g = &d->g[gi];
        if (!g->built || g->val != (which == 0) || g->teacher != (which == 2)) continue;
        space_sched want[2] = {g->best};
        space_default(g->sp, &want[1]);
        tlm_candidate *c = malloc(sizeof *c);
        int got = 0;
        tlm_error e;
        if (c && !tlm_select_generate(m, g->sp, 1, c, &got, &e) && got == 1) {
            n++;
            for (int l = 0; l < 2; l++) {
                bool same = c->sched.n == want[l].n;
                for (int i = 0; i < want[l].n; i++) {
                    bool ok = i < c->sched.n && c->sched.v[i] == want[l].v[i];
                    same = same && ok;
                    sl_ok[l] += ok;
                    sl += !l;
                }
                hit[l] += same;
            }
        }
        free(c);
    }
    for (int l = 0; l < 2; l++) {
        exact[l] = n ? (double)hit[l] / n : NAN;
        slots[l] = sl ? (double)sl_ok[l] / (double)sl : NAN;
    }
}

static int parse(int argc, char **argv, tr_args *a, tlm_error *err)
{
    memset(a, 0, sizeof *a);
    a->layers = 4, a->heads = 4, a->dim = 128, a->top = 2, a->steps = 2000, a->batch = 16;
    a->warmup = 100, a->seed = 1, a->eval_every = 200, a->ckpt_every = 500, a->val_pct = 10;
    a->alpha = 4, a->lr = 1e-3, a->wd = 0.1, a->teacher_w = 1;
    a->init = "random";
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            fputs(train_usage, stdout);
            return -1;
        }
        if (!strcmp(k, "--resume")) {
            a->resume = true;
            continue;
        }
        if (!strcmp(k, "--quiet")) {
            a->quiet = true;
            continue;
        }
        if (i + 1 >= argc) return cli_usage_error("train: %s needs a value", k);
        const char *v = argv[++i];
        int rc = 0;
        struct {
            const char *flag;
            uint64_t *dst, max;
        } u[] = {{"--layers", &a->layers, TLM_MAX_LAYERS},
                 {"--heads", &a->heads, TLM_MAX_HEADS},
                 {"--dim", &a->dim, TLM_MAX_EMBD},
                 {"--ctx", &a->ctx, LANG_MAX_SENTENCE},
                 {"--top", &a->top, 1000},
                 {"--steps", &a->steps, 100000000},
                 {"--pretrain-steps", &a->pretrain, 100000000},
                 {"--batch", &a->batch, 4096},
                 {"--warmup", &a->warmup, 100000000},
                 {"--seed", &a->seed, UINT64_MAX},
                 {"--eval-every", &a->eval_every, 100000000},
                 {"--checkpoint-every", &a->ckpt_every, 100000000},
                 {"--val-pct", &a->val_pct, 99},
                 {"--until", &a->until, 100000000},
                 {"--teacher", &a->teacher, 1000}};
        struct {
            const char *flag;
            double *dst;
        } f[] = {{"--alpha", &a->alpha},
                 {"--lr", &a->lr},
                 {"--weight-decay", &a->wd},
                 {"--margin", &a->margin},
                 {"--teacher-weight", &a->teacher_w}};
        bool found = false;
        for (size_t q = 0; q < sizeof u / sizeof u[0] && !found; q++)
            if (!strcmp(k, u[q].flag))
                found = true, rc = cli_parse_u64(k, v, u[q].max, u[q].dst, err);
        for (size_t q = 0; q < sizeof f / sizeof f[0] && !found; q++)
            if (!strcmp(k, f[q].flag)) {
                found = true;
                char *end = NULL;
                *f[q].dst = strtod(v, &end);
                if (!end || *end || !isfinite(*f[q].dst) || *f[q].dst < 0)
                    rc = tlm_err_set(err, TLM_EINVAL, k, "expected a number >= 0, got '%s'", v);
            }
        if (found) {
        } else if (!strcmp(k, "--records")) {
            if (a->n_records == 64) return cli_usage_error("train: at most 64 --records");
            a->records[a->n_records++] = v;
        } else if (!strcmp(k, "--out") || !strcmp(k, "-o"))
            a->out = v;
        else if (!strcmp(k, "--init"))
            a->init = v;
        else if (!strcmp(k, "--target"))
            a->target = v;
        else if (!strcmp(k, "--teacher-targets")) {
            a->n_teacher_tg = 0;
            for (const char *p = v; *p;) {
                size_t len = strcspn(p, ",");
                tlm_error e;
                char name[64];
                if (!len || len >= sizeof name || a->n_teacher_tg == 8)
                    return cli_usage_error("train: --teacher-targets: at most 8 targets, "
                                           "comma-separated, got '%s'", v);
                memcpy(name, p, len);
                name[len] = 0;
                if (target_parse(name, &a->teacher_t[a->n_teacher_tg], &e))
                    return cli_usage_error("train: --teacher-targets: '%s': %s", name, e.msg);
                memcpy(a->teacher_tg[a->n_teacher_tg++], name, len + 1);
                p += len + (p[len] == ',');
            }
        }
        else if (!strcmp(k, "--checkpoint"))
            a->checkpoint = v;
        else if (!strcmp(k, "--log"))
            a->log = v;
        else {
            fputs(train_usage, stderr);
            return cli_usage_error("train: unknown option '%s'", k);
        }
        if (rc) return cli_report(err);
    }
    if (!a->n_records) return cli_usage_error("train: --records is required");
    if (!a->out) return cli_usage_error("train: --out is required");
    if (!a->layers || !a->heads || !a->dim || !a->batch || !a->top)
        return cli_usage_error("train: --layers, --heads, --dim, --batch and --top must be >= 1");
    if (a->resume && !a->checkpoint) return cli_usage_error("train: --resume needs --checkpoint");
    if (a->pretrain > a->steps) return cli_usage_error("train: --pretrain-steps exceeds --steps");
    if (a->until && !a->checkpoint) return cli_usage_error("train: --until needs --checkpoint");
    if (!a->until || a->until > a->steps) a->until = a->steps;
    return 0;
}

static void data_free(tr_data *d)
{
    for (int i = 0; i < d->n; i++) {
        for (int k = 0; k < d->g[i].n; k++)
            free(d->g[i].m[k].sched);
        free(d->g[i].m);
        json_decref(d->g[i].workload);
        free(d->g[i].sp);
        free(d->g[i].g);
    }
    for (int i = 0; i < d->n_ex; i++) {
        free(d->ex[i].tokens);
        free(d->ex[i].mask);
    }
    free(d->g);
    free(d->bucket);
    free(d->ex);
}

static int run_train(int argc, char **argv)
{
    tr_args a;
    tlm_error err;
    tlm_err_clear(&err);
    int prc = parse(argc, argv, &a, &err);
    if (prc) return prc < 0 ? CLI_OK : prc;
    /* One OpenBLAS thread unless the caller says otherwise: faster beside OpenMP on a small
     * machine, and part of what makes a run's bytes reproducible (train.h). */
    if (!getenv("OPENBLAS_NUM_THREADS")) openblas_set_num_threads(1);
    double t0 = tlm_now_s();
    tr_data d = {0};
    int rc = 0;
    for (int i = 0; i < a.n_records && !rc; i++)
        rc = read_records(a.records[i], &a, &d, &err);
    if (!rc) drop_superseded(&d);
    if (!rc) rc = build_examples(&d, &a, &err);
    if (!rc && a.teacher) rc = add_teachers(&d, &a, &err);
    int *train = rc ? NULL : malloc(((size_t)d.n_ex + 1) * sizeof *train);
    int *val = rc ? NULL : malloc(((size_t)d.n_ex + 1) * sizeof *val);
    int n_train = 0, n_val = 0, g_train = 0, g_val = 0;
    if (!rc && (!train || !val)) rc = tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
    for (int i = 0; !rc && i < d.n_ex; i++) {
        if (d.g[d.ex[i].group].val)
            val[n_val++] = i;
        else
            train[n_train++] = i;
    }
    for (int i = 0; !rc && i < d.n; i++)
        if (d.g[i].built && !d.g[i].teacher) d.g[i].val ? g_val++ : g_train++;
    if (!rc && !n_train)
        rc = tlm_err_set(&err, TLM_EINVAL, "--records",
                         "no trainable records (%ld read, %ld ok, %ld stale)", d.read, d.ok,
                         d.stale);
    double prep_s = tlm_now_s() - t0;
    /* the model */
    tlm_model *m = NULL;
    uint8_t vh[32];
    lang_vocab_hash(vh);
    if (!rc && strcmp(a.init, "random")) {
        if (cli_load_weights("--init", a.init, &m, &err)) {
            rc = err.code;
        } else if (m->cfg.n_ctx < d.max_len) {
            rc = tlm_err_set(&err, TLM_EINVAL, "--init",
                             "the model holds %d positions; the data has sentences of %d",
                             m->cfg.n_ctx, d.max_len);
        }
    } else if (!rc) {
        int T = a.ctx ? (int)a.ctx : (d.max_len + 63) / 64 * 64 + 64;
        if (T > LANG_MAX_SENTENCE) T = LANG_MAX_SENTENCE;
        if (T < d.max_len)
            rc = tlm_err_set(&err, TLM_EINVAL, "--ctx",
                             "%d positions; the data has sentences of %d", T, d.max_len);
        tlm_config cfg = {(int)a.layers, (int)a.heads, (int)a.dim, T, lang_vocab_size()};
        if (!rc &&
            (tlm_config_check(&cfg, &err) || tlm_model_init_random(&cfg, vh, a.seed, &m, &err)))
            rc = err.code;
    }
    tlm_train_opts o;
    tlm_train_opts_default(&o);
    o.lr = a.lr;
    o.warmup_steps = (int)(a.warmup < a.steps ? a.warmup : a.steps);
    o.total_steps = (int)a.steps;
    o.weight_decay = a.wd;
    o.seed = a.seed;
    tlm_trainer *tr = NULL;
    if (!rc && tlm_trainer_new(m, &o, &tr, &err)) rc = err.code;
    if (!rc && a.resume) {
        struct stat sb;
        if (stat(a.checkpoint, &sb) == 0 && tlm_trainer_load(tr, a.checkpoint, &err)) {
            snprintf(err.field, sizeof err.field, "--checkpoint");
            rc = err.code;
        }
        /* the schedule of this invocation wins over the one saved (a run may be extended) */
        if (!rc && tlm_trainer_set_opts(tr, &o, &err)) rc = err.code;
    }
    FILE *log = !rc && a.log ? fopen(a.log, "a") : NULL;
    if (!rc && a.log && !log) rc = tlm_err_set(&err, TLM_EINVAL, "--log", "cannot open %s", a.log);
    int B = (int)a.batch;
    int *order = rc ? NULL : malloc((size_t)n_train * sizeof *order);
    tlm_train_example *xs = rc ? NULL : calloc((size_t)B, sizeof *xs);
    tr_ex *samples = rc ? NULL : calloc((size_t)B, sizeof *samples);
    if (!rc && (!order || !xs || !samples)) rc = tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
    int start = rc ? 0 : tlm_trainer_step_count(tr);
    long epoch_cached = -1;
    double t_train = tlm_now_s(), loss_ema = NAN, last_val = NAN;
    long tokens = 0, rows = 0;
    for (int step = start; !rc && step < (int)a.until; step++) {
        int n = 0;
        if (step < (int)a.pretrain) {
            /* uniform samples of the training groups' spaces, from (seed, step) alone */
            uint64_t s = mix(a.seed ^ mix(0x70726574ull + (uint64_t)step));
            for (int k = 0; k < B; k++) {
                s = mix(s);
                const tr_group *g = &d.g[d.ex[train[s % (uint64_t)n_train]].group];
                space_sched sc;
                uint64_t rs = mix(s + 1);
                space_sample(g->sp, &rs, &sc);
                int np = 0;
                free(samples[k].tokens);
                free(samples[k].mask);
                samples[k].tokens = malloc(LANG_MAX_SENTENCE * sizeof(int32_t));
                samples[k].mask = malloc(LANG_MAX_SENTENCE);
                int len = samples[k].tokens && samples[k].mask
                              ? encode(g->sp, &sc, samples[k].tokens, samples[k].mask, &np)
                              : TLM_ENOMEM;
                if (len < 0 || len > m->cfg.n_ctx) continue;
                samples[k].n = len;
                samples[k].n_prompt = np;
                samples[k].weight = 1;
                to_example(&samples[k], &xs[n++]);
            }
        } else {
            long pos = (long)(step - (int)a.pretrain) * B;
            for (int k = 0; k < B && k < n_train; k++, pos++) {
                long epoch = pos / n_train;
                if (epoch != epoch_cached) {
                    epoch_order(train, n_train, a.seed, epoch, order);
                    epoch_cached = epoch;
                }
                to_example(&d.ex[order[pos % n_train]], &xs[n++]);
            }
        }
        if (!n) continue;
        tlm_train_stats st;
        if (tlm_trainer_step(tr, xs, n, &st, &err)) {
            rc = err.code;
            break;
        }
        tokens += st.tokens;
        rows += st.rows;
        loss_ema = isfinite(loss_ema) ? 0.95 * loss_ema + 0.05 * st.loss : st.loss;
        bool last = step + 1 == (int)a.until;
        bool ev = n_val && a.eval_every && ((step + 1) % (int)a.eval_every == 0 || last);
        if (ev && val_loss(tr, &d, val, n_val, B, &last_val, &err)) {
            rc = err.code;
            break;
        }
        if (ev || (step + 1) % 50 == 0 || last) {
            double el = tlm_now_s() - t_train;
            progress(log, a.quiet,
                     json_pack("{s:i, s:s, s:f, s:f, s:o, s:f, s:f, s:f}", "step", step + 1,
                               "phase", step < (int)a.pretrain ? "pretrain" : "finetune", "loss",
                               st.loss, "loss_ema", loss_ema, "val_loss",
                               ev && isfinite(last_val) ? json_real(last_val) : json_null(), "lr",
                               st.lr, "grad_norm", st.grad_norm, "rows_per_s",
                               el > 0 ? rows / el : 0.0));
        }
        if (a.checkpoint && ((a.ckpt_every && (step + 1) % (int)a.ckpt_every == 0) || last) &&
            tlm_trainer_save(tr, a.checkpoint, &err)) {
            rc = err.code;
            break;
        }
    }
    double train_s = tlm_now_s() - t_train;
    if (!rc && tlm_model_save(m, a.out, &err)) rc = err.code;
    int out = CLI_OK;
    if (rc) {
        out = cli_report(&err);
    } else {
        double vx[2], vs[2], tx[2], ts[2], ex[2] = {NAN, NAN}, es[2] = {NAN, NAN};
        double t1 = tlm_now_s();
        decode_check(m, &d, 0, d.n, vx, vs);
        decode_check(m, &d, 1, 200, tx, ts);
        if (a.teacher) decode_check(m, &d, 2, 200, ex, es);
        double exact = vx[0], slots = vs[0], texact = tx[0], tslots = ts[0];
        double vdexact = vx[1], vdslots = vs[1], teexact = ex[0], teslots = es[0];
        char line[2048];
        json_t *labels = labels_summary(&d, line, sizeof line);
        json_t *r = json_pack(
            "{s:s, s:I, s:I, s:I, s:I, s:I, s:s, s:o, s:s, s:I, s:I, s:i, s:i, s:i, s:i, s:i, "
            "s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:o, s:o, s:o, s:o, s:o, s:o, s:f, s:i}",
            "out", a.out, "records_read", (json_int_t)d.read, "records_ok", (json_int_t)d.ok,
            "labels_measured", (json_int_t)(d.ok - d.modelled), "labels_modelled",
            (json_int_t)d.modelled, "records_modelled_superseded", (json_int_t)d.superseded,
            "gpu_model", MEASURE_GPU_MODEL_ID, "labels", labels, "labels_line", line,
            "records_stale", (json_int_t)d.stale, "records_skipped", (json_int_t)d.skipped,
            "groups_train", g_train, "groups_val", g_val, "examples_train", n_train, "examples_val",
            n_val, "max_len", d.max_len, "steps", (int)a.steps, "params", (int)m->n_params,
            "tokens_trained", (json_int_t)tokens, "rows", (json_int_t)rows, "prepare_s", prep_s,
            "train_s", train_s, "rows_per_s", train_s > 0 ? rows / train_s : 0.0, "loss_ema",
            isfinite(loss_ema) ? json_real(loss_ema) : json_null(), "val_loss",
            isfinite(last_val) ? json_real(last_val) : json_null(), "val_exact",
            isfinite(exact) ? json_real(exact) : json_null(), "val_slots",
            isfinite(slots) ? json_real(slots) : json_null(), "train_exact",
            isfinite(texact) ? json_real(texact) : json_null(), "train_slots",
            isfinite(tslots) ? json_real(tslots) : json_null(), "decode_check_s", tlm_now_s() - t1,
            "step", tlm_trainer_step_count(tr));
        /* the held-out groups against their default schedules (what the teacher examples teach),
         * and the teacher examples' own fit */
        json_object_set_new(r, "val_default_exact",
                            isfinite(vdexact) ? json_real(vdexact) : json_null());
        json_object_set_new(r, "val_default_slots",
                            isfinite(vdslots) ? json_real(vdslots) : json_null());
        if (a.teacher) {
            json_object_set_new(r, "teacher_tries", json_integer(d.teacher_tries));
            json_object_set_new(r, "teacher_groups", json_integer(d.teacher_groups));
            json_object_set_new(r, "teacher_exact",
                                isfinite(teexact) ? json_real(teexact) : json_null());
            json_object_set_new(r, "teacher_slots",
                                isfinite(teslots) ? json_real(teslots) : json_null());
        }
        out = cli_print_json(r);
        json_decref(r);
    }
    if (log) fclose(log);
    for (int k = 0; samples && k < B; k++) {
        free(samples[k].tokens);
        free(samples[k].mask);
    }
    free(samples);
    free(xs);
    free(order);
    free(train);
    free(val);
    tlm_trainer_free(tr);
    tlm_model_free(m);
    data_free(&d);
    return out;
}

const cli_cmd cli_cmd_train = {"train", "train the TLM on measured records", run_train};
