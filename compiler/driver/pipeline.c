/* pipeline.c — the one entry: workload + target + mode → artifact + records (see pipeline.h). */
#include "compiler/driver/pipeline.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tlm/select.h"
#include "compiler/util/util.h"

static const char *const mode_names[PL_MODE_COUNT] = {"default", "tlm",  "topk",
                                                      "given",   "tune", "refine"};
static const char *const source_names[PL_SRC_COUNT] = {"default", "tlm",   "topk",
                                                       "given",   "tuned", "htam"};

static struct {
    pl_search_fn fn;
    void *user;
} searches[PL_MODE_COUNT];

void pl_opts_init(pl_opts *o)
{
    memset(o, 0, sizeof *o);
    o->mode = PL_MODE_DEFAULT;
    o->k = 1;
    o->measure = PL_MEASURE_AUTO;
    measure_opts_init(&o->mo);
    /* candidates are compared, not benchmarked: a handful of short samples */
    o->mo.repeats = 5;
    o->mo.min_sample_s = 2e-4;
    o->mo.timeout_s = 5;
}

const char *pl_mode_name(pl_mode m)
{
    return (unsigned)m < PL_MODE_COUNT ? mode_names[m] : "unknown";
}

const char *pl_source_name(pl_source s)
{
    return (unsigned)s < PL_SRC_COUNT ? source_names[s] : "unknown";
}

int pl_mode_parse(const char *name, const char *field, pl_mode *out, tlm_error *err)
{
    if (name && !strcmp(name, "generate")) {
        *out = PL_MODE_TLM;
        return 0;
    }
    for (int m = 0; name && m < PL_MODE_COUNT; m++)
        if (!strcmp(name, mode_names[m])) {
            *out = (pl_mode)m;
            return 0;
        }
    return tlm_err_set(err, TLM_EINVAL, field,
                       "unknown mode \"%s\"; allowed: generate, default, tlm, topk, given, tune, "
                       "refine",
                       name ? name : "");
}

int pl_source_parse(const char *name)
{
    for (int s = 0; name && s < PL_SRC_COUNT; s++)
        if (!strcmp(name, source_names[s])) return s;
    return -1;
}

void pl_set_search(pl_mode mode, pl_search_fn fn, void *user)
{
    if (mode != PL_MODE_TUNE && mode != PL_MODE_REFINE) return;
    searches[mode].fn = fn;
    searches[mode].user = user;
}

bool pl_has_search(pl_mode mode)
{
    return (unsigned)mode < PL_MODE_COUNT && searches[mode].fn != NULL;
}

/* ---- candidates and records ---- */

int pl_add_candidate(pl_job *j, const space_sched *s, pl_source src, double score,
                     tlm_error *err)
{
    int rc = space_check(j->sp, s, err);
    if (rc) return rc;
    if (j->n_cands == j->cap_cands) {
        int cap = j->cap_cands ? 2 * j->cap_cands : 8;
        pl_candidate *c = realloc(j->cands, (size_t)cap * sizeof *c);
        if (!c) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        j->cands = c;
        j->cap_cands = cap;
    }
    pl_candidate *c = &j->cands[j->n_cands++];
    c->sched = *s;
    c->source = src;
    c->score = score;
    return 0;
}

static pl_record *record_new(pl_job *j, int i)
{
    if (j->n_recs == j->cap_recs) {
        int cap = j->cap_recs ? 2 * j->cap_recs : 8;
        pl_record *r = realloc(j->recs, (size_t)cap * sizeof *r);
        if (!r) return NULL;
        j->recs = r;
        j->cap_recs = cap;
    }
    pl_record *r = &j->recs[j->n_recs++];
    memset(r, 0, sizeof *r);
    r->cand = i;
    r->source = j->cands[i].source;
    r->median_s = r->min_s = r->gflops = r->rel_err = NAN;
    space_print(j->sp, &j->cands[i].sched, r->schedule, sizeof r->schedule);
    return r;
}

int pl_sentence(const pl_job *j, int i, char *buf, size_t cap)
{
    if (i < 0 || i >= j->n_cands) return TLM_EINVAL;
    int toks[LANG_MAX_SENTENCE];
    int n = lang_encode_decisions(j->sp, &j->cands[i].sched, toks, LANG_MAX_SENTENCE);
    if (n < 0) return n;
    return lang_sentence_text(toks, n, buf, cap);
}

/* ---- preparation ---- */

int pl_prepare(pl_job *j, const ir_workload *wl, const target *t, const pl_opts *o,
               tlm_error *err)
{
    memset(j, 0, sizeof *j);
    j->chosen = -1;
    double t0 = tlm_now_s();
    j->wl = *wl;
    j->tgt = *t;
    if (o)
        j->o = *o;
    else
        pl_opts_init(&j->o);
    const pl_opts *op = &j->o;
    if ((unsigned)op->mode >= PL_MODE_COUNT)
        return tlm_err_set(err, TLM_EINVAL, "mode", "unknown mode %d", (int)op->mode);
    if (op->mode == PL_MODE_TOPK && (op->k < 1 || op->k > PL_MAX_CANDIDATES))
        return tlm_err_set(err, TLM_EINVAL, "candidates", "%d candidates; allowed 1..%d", op->k,
                           PL_MAX_CANDIDATES);
    if ((op->mode == PL_MODE_TUNE || op->mode == PL_MODE_REFINE) && !pl_has_search(op->mode))
        return tlm_err_set(err, TLM_EUNSUPPORTED, "mode",
                           "mode \"%s\" is not available in this build (no %s search is "
                           "registered); use generate, topk or default",
                           pl_mode_name(op->mode), op->mode == PL_MODE_TUNE ? "tuning" : "HTAM");
    j->can_run = t->kind == TARGET_CPU && target_host_can_run(t);
    if (op->measure == PL_MEASURE_ON && !j->can_run)
        return tlm_err_set(err, TLM_EINVAL, "measure",
                           t->kind == TARGET_CUDA
                               ? "%s kernels are compiled and checked against the device limits, "
                                 "not run, on this machine"
                               : "this machine's CPU cannot run %s kernels",
                           t->name);
    j->can_model = op->model_labels && t->kind == TARGET_CUDA && !j->can_run;
    if (op->mode == PL_MODE_TUNE && !j->can_run && !j->can_model)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "mode",
                           "tuning measures every candidate, and this machine cannot run %s "
                           "kernels (%s); use generate or topk, or tune on a machine that can",
                           t->name, t->kind == TARGET_CUDA ? "no GPU is used here"
                                                           : "its CPU lacks the instructions");
    if (ir_workload_canonical(wl, j->canon, sizeof j->canon) < 0 ||
        ir_workload_hash_hex(wl, j->whash) || target_hash_hex(t, j->target_hash))
        return tlm_err_set(err, TLM_ELIMIT, "workload", "cannot form the canonical workload");
    j->g = calloc(1, sizeof *j->g);
    j->sp = calloc(1, sizeof *j->sp);
    if (!j->g || !j->sp) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int rc = ir_subgraph_build(&j->wl, j->g, err);
    if (!rc) rc = space_build(j->g, &j->tgt, j->sp, err);
    if (rc) return rc;
    if (op->mode == PL_MODE_DEFAULT) {
        space_sched s;
        space_default(j->sp, &s);
        rc = pl_add_candidate(j, &s, PL_SRC_DEFAULT, NAN, err);
    } else if (op->mode == PL_MODE_GIVEN) {
        for (int i = 0; i < op->n_given && op->given && !rc; i++)
            rc = pl_add_candidate(j, &op->given[i], PL_SRC_GIVEN, NAN, err);
    }
    j->o.given = NULL; /* not the job's: never read after preparation */
    j->o.n_given = 0;
    j->prepare_s = tlm_now_s() - t0;
    return rc;
}

int pl_decode_count(const pl_job *j)
{
    switch (j->o.mode) {
    case PL_MODE_TLM:
        return 1;
    case PL_MODE_TOPK:
        return j->o.k;
    default:
        return 0;
    }
}

int pl_decode(pl_job *j, tlm_error *err)
{
    int k = pl_decode_count(j);
    if (k == 0) return 0;
    if (!j->o.model)
        return tlm_err_set(err, TLM_EINVAL, "weights",
                           "mode %s needs a model (weights); none was given",
                           pl_mode_name(j->o.mode));
    double t0 = tlm_now_s();
    tlm_candidate *c = calloc((size_t)k, sizeof *c);
    if (!c) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    int n = 0;
    int rc = tlm_select_generate(j->o.model, j->sp, k, c, &n, err);
    pl_source src = j->o.mode == PL_MODE_TOPK ? PL_SRC_TOPK : PL_SRC_TLM;
    for (int i = 0; i < n && !rc; i++)
        rc = pl_add_candidate(j, &c[i].sched, src, c[i].score, err);
    if (!rc && n == 0) rc = tlm_err_set(err, TLM_ERUNTIME, "", "the model produced no schedule");
    free(c);
    j->decode_s += tlm_now_s() - t0;
    return rc;
}

/* ---- evaluation and choice ---- */

/* Measures the built artifact *a of candidate i into record r. */
static void measure_into(pl_job *j, const drv_artifact *a, pl_record *r)
{
    measure_result mr;
    memset(&mr, 0, sizeof mr);
    tlm_error me;
    tlm_err_clear(&me);
    double t0 = tlm_now_s();
    int mrc = drv_measure_cpu(j->g, a, &j->o.mo, &mr, &me);
    r->measure_s = tlm_now_s() - t0;
    j->measure_s += r->measure_s;
    if (mrc) {
        snprintf(r->status, sizeof r->status, "load_error");
        snprintf(r->detail, sizeof r->detail, "%.255s", me.msg);
        return;
    }
    snprintf(r->status, sizeof r->status, "%s", measure_status_name(mr.status));
    r->seed = mr.seed;
    snprintf(r->detail, sizeof r->detail, "%s", mr.detail);
    if (mr.status == MEASURE_OK) {
        r->median_s = mr.median_s;
        r->min_s = mr.min_s;
        r->gflops = mr.gflops;
        r->n_samples = mr.n_samples;
        r->threads = mr.threads;
    }
    if (mr.rel_err >= 0) r->rel_err = mr.rel_err;
}

/* Labels the built CUDA artifact *a of candidate r->cand with the GPU model into record r. */
static void model_into(pl_job *j, const drv_artifact *a, pl_record *r)
{
    measure_gpu_pred p;
    tlm_error me;
    tlm_err_clear(&me);
    double t0 = tlm_now_s();
    int mrc = drv_gpu_model(j->sp, &j->cands[r->cand].sched, a, &p, &me);
    r->measure_s = tlm_now_s() - t0;
    j->measure_s += r->measure_s;
    if (mrc) {
        snprintf(r->status, sizeof r->status, "model_error");
        snprintf(r->detail, sizeof r->detail, "%s: %.200s", MEASURE_GPU_MODEL_ID, me.msg);
        return;
    }
    snprintf(r->status, sizeof r->status, "modelled");
    r->median_s = r->min_s = p.time_s;
    r->gflops = p.flops / p.time_s * 1e-9;
    r->n_samples = 0;
    measure_gpu_pred_text(&p, j->tgt.gpu.part, r->detail, sizeof r->detail);
}

/* Measures (or, for cuda without a GPU under model_labels, models) candidate r->cand. */
static void label_into(pl_job *j, const drv_artifact *a, pl_record *r)
{
    if (j->can_run)
        measure_into(j, a, r);
    else if (j->can_model)
        model_into(j, a, r);
}

/* Appends the record of a build of candidate i (rc: drv_build's code, *a its artifact,
 * *be its error); a failed build's artifact is released (its source kept once for
 * inspection). NULL when even the record could not be kept. */
static pl_record *record_build(pl_job *j, int i, int rc, drv_artifact *a, const tlm_error *be)
{
    j->codegen_s += a->codegen_s;
    j->compile_s += a->compile_s;
    pl_record *r = record_new(j, i);
    if (!r) return NULL;
    r->codegen_s = a->codegen_s;
    r->compile_s = a->compile_s;
    if (rc) {
        snprintf(r->status, sizeof r->status, "build_error");
        snprintf(r->detail, sizeof r->detail, "%.255s", be->msg);
        if (a->source && !j->failed_source) {
            j->failed_source = a->source; /* for inspection: what did not compile */
            a->source = NULL;
        }
        drv_artifact_free(a);
    } else {
        snprintf(r->status, sizeof r->status, "built");
    }
    return r;
}

int pl_evaluate(pl_job *j, int i, bool measure, drv_artifact *art_out, tlm_error *err)
{
    if (i < 0 || i >= j->n_cands) return tlm_err_set(err, TLM_EINVAL, "", "no candidate %d", i);
    drv_artifact a;
    tlm_error be;
    tlm_err_clear(&be);
    int brc = drv_build(j->sp, &j->cands[i].sched, &a, &be);
    pl_record *r = record_build(j, i, brc, &a, &be);
    if (!r) {
        drv_artifact_free(&a);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    int ri = j->n_recs - 1;
    if (brc) {
        if (art_out) memset(art_out, 0, sizeof *art_out);
        *err = be;
        return ri;
    }
    if (measure) label_into(j, &a, r);
    if (art_out)
        *art_out = a;
    else
        drv_artifact_free(&a);
    return ri;
}

/* ---- batches: builds in parallel, measurements one at a time ---- */

typedef struct {
    pl_job *j;
    const int *idx;
    int n;
    drv_artifact *arts;
    tlm_error *errs;
    int *rcs;
    int next; /* the next build to take (atomic) */
} build_batch;

static void *build_worker(void *arg)
{
    build_batch *b = arg;
    for (;;) {
        int k = __atomic_fetch_add(&b->next, 1, __ATOMIC_RELAXED);
        if (k >= b->n) break;
        if (b->j->o.cancel && __atomic_load_n(b->j->o.cancel, __ATOMIC_ACQUIRE)) {
            b->rcs[k] = TLM_EUNSUPPORTED;
            memset(&b->arts[k], 0, sizeof b->arts[k]);
            tlm_err_set(&b->errs[k], TLM_EUNSUPPORTED, "", "cancelled");
            continue;
        }
        tlm_err_clear(&b->errs[k]);
        b->rcs[k] = drv_build(b->j->sp, &b->j->cands[b->idx[k]].sched, &b->arts[k], &b->errs[k]);
    }
    return NULL;
}

int pl_evaluate_batch(pl_job *j, const int *idx, int n, bool measure, int threads, int *rec_out,
                      tlm_error *err)
{
    for (int k = 0; k < n; k++)
        if (idx[k] < 0 || idx[k] >= j->n_cands)
            return tlm_err_set(err, TLM_EINVAL, "", "no candidate %d", idx[k]);
    if (n <= 0) return 0;
    build_batch b = {.j = j, .idx = idx, .n = n};
    b.arts = calloc((size_t)n, sizeof *b.arts);
    b.errs = calloc((size_t)n, sizeof *b.errs);
    b.rcs = calloc((size_t)n, sizeof *b.rcs);
    if (!b.arts || !b.errs || !b.rcs) {
        free(b.arts);
        free(b.errs);
        free(b.rcs);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    if (threads < 1) threads = 1;
    if (threads > n) threads = n;
    pthread_t th[16];
    if (threads > 16) threads = 16;
    int started = 0;
    for (int t = 1; t < threads; t++)
        if (pthread_create(&th[started], NULL, build_worker, &b) == 0) started++;
    build_worker(&b); /* this thread builds too */
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    int rc = 0;
    for (int k = 0; k < n; k++) {
        pl_record *r = rc ? NULL : record_build(j, idx[k], b.rcs[k], &b.arts[k], &b.errs[k]);
        if (!r) {
            if (!rc) rc = tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
            drv_artifact_free(&b.arts[k]);
            continue;
        }
        if (b.rcs[k] == TLM_EUNSUPPORTED && !strcmp(b.errs[k].msg, "cancelled"))
            snprintf(r->status, sizeof r->status, "cancelled");
        if (rec_out) rec_out[k] = j->n_recs - 1;
        if (!b.rcs[k] && measure &&
            !(j->o.cancel && __atomic_load_n(j->o.cancel, __ATOMIC_ACQUIRE)))
            label_into(j, &b.arts[k], r);
        drv_artifact_free(&b.arts[k]);
    }
    free(b.arts);
    free(b.errs);
    free(b.rcs);
    return rc;
}

void pl_choose(pl_job *j, int i, drv_artifact *art, const measure_result *mr, const char *selection)
{
    drv_artifact_free(&j->art);
    j->art = *art;
    memset(art, 0, sizeof *art);
    j->chosen = i;
    j->source = j->cands[i].source;
    j->selection = selection;
    j->measured = mr != NULL;
    if (mr)
        j->chosen_mr = *mr;
    else
        memset(&j->chosen_mr, 0, sizeof j->chosen_mr);
}

/* The measure_result of record r (for pl_choose). */
static void record_result(const pl_record *r, measure_result *mr)
{
    memset(mr, 0, sizeof *mr);
    mr->status = MEASURE_OK;
    mr->median_s = r->median_s;
    mr->min_s = r->min_s;
    mr->gflops = r->gflops;
    mr->rel_err = isfinite(r->rel_err) ? r->rel_err : -1;
    mr->n_samples = r->n_samples;
    mr->threads = r->threads;
    mr->seed = r->seed;
    snprintf(mr->detail, sizeof mr->detail, "%s", r->detail);
}

int pl_finish(pl_job *j, tlm_error *err)
{
    if (j->o.mode == PL_MODE_TUNE || j->o.mode == PL_MODE_REFINE) {
        pl_search_fn fn = searches[j->o.mode].fn;
        if (!fn)
            return tlm_err_set(err, TLM_EUNSUPPORTED, "mode", "mode \"%s\" is not available",
                               pl_mode_name(j->o.mode));
        int rc = fn(j, searches[j->o.mode].user, err);
        if (!rc && j->chosen < 0)
            rc = tlm_err_set(err, TLM_ERUNTIME, "", "the %s search chose no kernel",
                             pl_mode_name(j->o.mode));
        return rc;
    }
    int n = j->n_cands;
    if (n == 0) return tlm_err_set(err, TLM_ERUNTIME, "", "no candidate schedule to build");
    bool measure = j->can_run && (j->o.measure == PL_MEASURE_ON ||
                                  (j->o.measure == PL_MEASURE_AUTO && (n > 1 || j->o.verify)));
    int best = -1;
    double best_t = INFINITY;
    drv_artifact best_a;
    memset(&best_a, 0, sizeof best_a);
    tlm_error first;
    tlm_err_clear(&first);
    int first_rc = 0;
    for (int i = 0; i < n; i++) {
        drv_artifact a;
        tlm_error e;
        tlm_err_clear(&e);
        int ri = pl_evaluate(j, i, measure, &a, &e);
        if (ri < 0) {
            drv_artifact_free(&best_a);
            *err = e;
            return ri;
        }
        const pl_record *r = &j->recs[ri];
        if (!a.binary || (measure && strcmp(r->status, "ok"))) {
            if (!first_rc) {
                first_rc = a.binary ? TLM_ERUNTIME : (e.code ? e.code : TLM_ERUNTIME);
                if (a.binary)
                    tlm_err_set(&first, TLM_ERUNTIME, "",
                                "candidate %d (%s) failed verification: %s: %s", i,
                                pl_source_name(j->cands[i].source), r->status, r->detail);
                else
                    first = e;
            }
            drv_artifact_free(&a);
            continue;
        }
        double t = measure ? r->median_s : INFINITY;
        if (best < 0 || t < best_t) {
            drv_artifact_free(&best_a);
            best_a = a;
            best = i;
            best_t = t;
        } else {
            drv_artifact_free(&a);
        }
        /* without timings the candidates' order decides: the first that builds wins */
        if (!measure) break;
    }
    if (best < 0) {
        *err = first;
        return first_rc ? first_rc : tlm_err_set(err, TLM_ERUNTIME, "", "no candidate built");
    }
    const char *selection = measure ? (n > 1 ? "measured" : "verified")
                            : n > 1 && j->o.mode == PL_MODE_TOPK ? "model_score"
                                                                 : "first";
    if (measure) {
        measure_result mr;
        const pl_record *r = NULL;
        for (int k = j->n_recs - 1; k >= 0 && !r; k--)
            if (j->recs[k].cand == best) r = &j->recs[k];
        record_result(r, &mr);
        pl_choose(j, best, &best_a, &mr, selection);
    } else {
        pl_choose(j, best, &best_a, NULL, selection);
    }
    return 0;
}

int pl_run(pl_job *j, const ir_workload *wl, const target *t, const pl_opts *o, tlm_error *err)
{
    if ((o->mode == PL_MODE_TLM || o->mode == PL_MODE_TOPK) && !o->model) {
        memset(j, 0, sizeof *j);
        j->chosen = -1;
        return tlm_err_set(err, TLM_EINVAL, "weights", "mode %s needs a model (weights)",
                           pl_mode_name(o->mode));
    }
    int rc = pl_prepare(j, wl, t, o, err);
    if (!rc) rc = pl_decode(j, err);
    if (!rc) rc = pl_finish(j, err);
    return rc;
}

bool pl_record_storable(const pl_record *r)
{
    return strcmp(r->status, "built") != 0 && strcmp(r->status, "cancelled") != 0;
}

bool pl_record_timed(const pl_record *r)
{
    return (!strcmp(r->status, "ok") || !strcmp(r->status, "modelled")) && r->median_s > 0;
}

void pl_job_free(pl_job *j)
{
    if (!j) return;
    free(j->g);
    free(j->sp);
    free(j->cands);
    free(j->recs);
    free(j->failed_source);
    drv_artifact_free(&j->art);
    memset(j, 0, sizeof *j);
    j->chosen = -1;
}
