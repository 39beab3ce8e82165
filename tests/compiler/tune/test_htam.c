/* test_htam.c — HTAM refinement: every step a legal, new schedule from the current best; the
 * same seed and memory give the same trajectory; the memory's statistics add up, persist
 * through its store io and merge; the ablations run; bad documents are refused by field; one
 * real refinement chooses an "htam" kernel. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "compiler/tune/htam.h"

static void prepare(pl_job *j, int64_t M, int64_t N, int64_t K, const char *tname)
{
    ir_workload w;
    ir_workload_init(&w, IR_OP_DENSE);
    w.shape[IR_DENSE_M] = M;
    w.shape[IR_DENSE_N] = N;
    w.shape[IR_DENSE_K] = K;
    target t;
    tlm_error e;
    cr_assert_eq(target_parse(tname, &t, &e), 0);
    pl_opts o;
    pl_opts_init(&o);
    o.measure = PL_MEASURE_OFF;
    cr_assert_eq(pl_prepare(j, &w, &t, &o, &e), 0, "%s", e.msg); /* the default: candidate 0 */
}

/* time grows with the distance from a hidden optimum (as in test_tune.c) */
typedef struct {
    space_sched opt;
    int evaluated;
    uint64_t order;
} land;

static int land_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    land *L = user;
    for (int k = 0; k < n; k++) {
        const space_sched *c = &j->cands[idx[k]].sched;
        cr_assert_eq(space_check(j->sp, c, err), 0, "illegal step: %s", err->msg);
        double d = 0;
        for (int i = 0; i < j->sp->n_slot; i++) {
            double a = log2(1.0 + (double)c->v[i]), b = log2(1.0 + (double)L->opt.v[i]);
            d += (a - b) * (a - b);
        }
        secs[k] = 1e-3 * (1 + d);
        L->evaluated++;
        L->order = L->order * 1000003u ^ tune_sched_hash(c);
    }
    return 0;
}

static htam_opts land_opts(land *L, int steps, uint64_t seed, htam_memory mem)
{
    htam_opts o;
    htam_opts_init(&o);
    o.steps = steps;
    o.seed = seed;
    o.memory = mem;
    o.eval = land_eval;
    o.eval_user = L;
    return o;
}

/* an in-memory store io: the document */
static json_t *g_doc;
static int mem_load(void *st, const char *kind, json_t **doc, tlm_error *err)
{
    *doc = g_doc ? json_deep_copy(g_doc) : NULL;
    return 0;
}
static int mem_save(void *st, const char *kind, const json_t *doc, tlm_error *err)
{
    json_decref(g_doc);
    g_doc = json_deep_copy(doc);
    return 0;
}

static double sum_of(const json_t *arr, const char *key)
{
    double s = 0;
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) s += json_number_value(json_object_get(x, key));
    return s;
}

Test(htam, steps_are_legal_new_and_reproducible)
{
    uint64_t order[3];
    for (int run = 0; run < 3; run++) {
        pl_job j;
        prepare(&j, 197, 256, 96, "cpu");
        land L = {0};
        uint64_t r = 77;
        space_sample(j.sp, &r, &L.opt);
        htam *m = htam_new(TARGET_CPU);
        htam_opts o = land_opts(&L, 24, run < 2 ? 5 : 6, HTAM_FULL);
        htam_result res;
        tlm_error e;
        cr_assert_eq(htam_run(m, &j, 0, &o, &res, &e), 0, "%s", e.msg);
        cr_assert_eq(L.evaluated, res.steps + 1);
        cr_assert_geq(res.steps, 10, "a dense space has strategies to try (%d steps)", res.steps);
        cr_assert_eq(res.traj[0].global, -1, "the start comes first");
        cr_assert_leq(res.best_s, res.first_s);
        for (int a = 0; a < j.n_cands; a++)
            for (int b = a + 1; b < j.n_cands; b++)
                cr_assert_neq(tune_sched_hash(&j.cands[a].sched), tune_sched_hash(&j.cands[b].sched));
        /* improvements are monotone along the trajectory */
        double best = res.traj[0].ms;
        for (int k = 1; k <= res.steps; k++) {
            cr_assert(res.traj[k].global >= 0 && res.traj[k].local >= 0);
            if (res.traj[k].improved) {
                cr_assert_lt(res.traj[k].ms, best);
                best = res.traj[k].ms;
            }
        }
        cr_assert_float_eq(best * 1e-3, res.best_s, 1e-12);
        order[run] = L.order;
        htam_result_free(&res);
        htam_free(m);
        pl_job_free(&j);
    }
    cr_assert_eq(order[0], order[1], "same seed, same memory, same trajectory");
    cr_assert_neq(order[0], order[2]);
}

Test(htam, the_memory_adds_up_persists_and_transfers)
{
    json_decref(g_doc);
    g_doc = NULL;
    htam_store_io io = {.load = mem_load, .save = mem_save};
    int total = 0;
    for (int run = 0; run < 2; run++) {
        pl_job j;
        prepare(&j, 64 + 32 * run, 128, 64, "cpu"); /* two workloads: one memory */
        land L = {0};
        uint64_t r = 9 + (uint64_t)run;
        space_sample(j.sp, &r, &L.opt);
        htam *m = htam_new(TARGET_CPU);
        tlm_error e;
        cr_assert_eq(htam_load(m, &io, &e), 0, "%s", e.msg);
        htam_opts o = land_opts(&L, 12, 3, HTAM_FULL);
        htam_result res;
        cr_assert_eq(htam_run(m, &j, 0, &o, &res, &e), 0, "%s", e.msg);
        total += res.steps;
        cr_assert_eq(htam_save(m, &io, &e), 0, "%s", e.msg);
        htam_result_free(&res);
        htam_free(m);
        pl_job_free(&j);
    }
    cr_assert_not_null(g_doc);
    /* every step counted once in its direction and its strategy; transitions: all but the
     * first step of each run */
    cr_assert_float_eq(sum_of(json_object_get(g_doc, "globals"), "n"), total, 1e-9);
    cr_assert_float_eq(sum_of(json_object_get(g_doc, "locals"), "n"), total, 1e-9);
    cr_assert_float_eq(sum_of(json_object_get(g_doc, "edges"), "n"), total - 2, 1e-9);
    json_t *l0 = NULL;
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(g_doc, "locals"), i, x) if (!l0 &&
                                                                    json_number_value(json_object_get(x, "n")) > 0) l0 = x;
    cr_assert(l0 && json_array_size(json_object_get(l0, "evidence")) >= 1, "evidence is kept");
    /* merging a document adds its statistics; a bad one is refused by field */
    htam *m = htam_new(TARGET_CPU);
    tlm_error e;
    cr_assert_eq(htam_merge_json(m, g_doc, &e), 0);
    cr_assert_eq(htam_merge_json(m, g_doc, &e), 0);
    json_t *twice = htam_to_json(m);
    cr_assert_float_eq(sum_of(json_object_get(twice, "globals"), "n"), 2.0 * total, 1e-9);
    json_decref(twice);
    json_t *bad = json_pack("{s:s, s:s}", "format", "tlm-htam/1", "target", "cuda");
    cr_assert_eq(htam_merge_json(m, bad, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "target");
    json_decref(bad);
    bad = json_pack("{s:s}", "format", "v0");
    cr_assert_eq(htam_merge_json(m, bad, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "format");
    json_decref(bad);
    htam_free(m);
    json_decref(g_doc);
    g_doc = NULL;
}

Test(htam, every_ablation_runs_and_a_gpu_memory_has_its_own_taxonomy)
{
    static const char *const names[] = {"full", "flat", "no-transitions", "no-local"};
    for (int k = 0; k < 4; k++) {
        htam_memory mem;
        tlm_error e;
        cr_assert_eq(htam_memory_parse(names[k], "--memory", &mem, &e), 0);
        pl_job j;
        prepare(&j, 128, 128, 128, k >= 2 ? "cuda:sm_80" : "cpu");
        if (k == 3) { /* the tensor-core sketch has its own strategies */
            pl_job_free(&j);
            ir_workload w;
            ir_workload_init(&w, IR_OP_DENSE);
            w.shape[IR_DENSE_M] = 256, w.shape[IR_DENSE_N] = 192, w.shape[IR_DENSE_K] = 128;
            w.dtype = IR_BFLOAT16;
            target t;
            cr_assert_eq(target_parse("cuda:sm_90", &t, &e), 0);
            pl_opts po;
            pl_opts_init(&po);
            po.measure = PL_MEASURE_OFF;
            cr_assert_eq(pl_prepare(&j, &w, &t, &po, &e), 0, "%s", e.msg);
            cr_assert_str_eq(space_sketch_name(j.sp->sketch), "gpu_mma");
        }
        land L = {0};
        uint64_t r = 4;
        space_sample(j.sp, &r, &L.opt);
        htam *m = htam_new(j.tgt.kind);
        htam_opts o = land_opts(&L, 10, 1, mem);
        htam_result res;
        cr_assert_eq(htam_run(m, &j, 0, &o, &res, &e), 0, "%s: %s", names[k], e.msg);
        cr_assert_geq(res.steps, 5, "%s", names[k]);
        htam_result_free(&res);
        htam_free(m);
        pl_job_free(&j);
    }
    htam *g = htam_new(TARGET_CUDA), *c = htam_new(TARGET_CPU);
    cr_assert_str_eq(htam_global_name(g, 3), "shared_memory_staging");
    cr_assert_str_eq(htam_global_name(c, 5), "packing");
    htam_free(g);
    htam_free(c);
    htam_memory mem;
    tlm_error e;
    cr_assert_eq(htam_memory_parse("deep", "--memory", &mem, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "--memory");
}

Test(htam, a_real_refinement_chooses_an_htam_kernel, .timeout = 600)
{
    ir_workload w;
    ir_workload_init(&w, IR_OP_DENSE);
    w.shape[IR_DENSE_M] = 24;
    w.shape[IR_DENSE_N] = 40;
    w.shape[IR_DENSE_K] = 16;
    target t;
    tlm_error e;
    cr_assert_eq(target_parse("cpu", &t, &e), 0);
    tune_register();
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_TUNE;
    o.strategy = "htam";
    o.trials = 4;
    htam_set_store_io(NULL);
    pl_job j;
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(j.source, PL_SRC_HTAM);
    cr_assert_str_eq(j.selection, "htam");
    cr_assert(j.art.binary);
    int stored = 0;
    for (int i = 0; i < j.n_recs; i++) stored += pl_record_storable(&j.recs[i]);
    cr_assert_eq(stored, 4, "the start and three steps, measured");
    pl_job_free(&j);
}
