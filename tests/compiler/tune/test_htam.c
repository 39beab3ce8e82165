/* test_htam.c — HTAM refinement: every step a legal, new schedule from the current best; the
 * same seed and memory give the same trajectory; the memory's statistics add up, persist
 * through its store io and merge; the ablations run; bad documents are refused by field; one
 * real refinement chooses an "htam" kernel. With a model: each step rewrites only the
 * strategy's slot (the later ones re-legalised) within its operator, says who wrote it, and a
 * model that prefers a value gets it; several kernels share a budget by the task scheduler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "compiler/tlm/select.h"
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
    int lucky_at; /* the lucky_at-th measurement reads 1000x fast (0: none) */
    int lucky_cand;
} land;

static double land_time(const pl_job *j, const land *L, const space_sched *c)
{
    double d = 0;
    for (int i = 0; i < j->sp->n_slot; i++) {
        double a = log2(1.0 + (double)c->v[i]), b = log2(1.0 + (double)L->opt.v[i]);
        d += (a - b) * (a - b);
    }
    return 1e-3 * (1 + d);
}

static int land_eval(pl_job *j, const int *idx, int n, double *secs, void *user, tlm_error *err)
{
    land *L = user;
    for (int k = 0; k < n; k++) {
        const space_sched *c = &j->cands[idx[k]].sched;
        cr_assert_eq(space_check(j->sp, c, err), 0, "illegal step: %s", err->msg);
        secs[k] = land_time(j, L, c);
        L->evaluated++;
        if (L->lucky_at && L->evaluated == L->lucky_at) {
            secs[k] *= 1e-3;
            L->lucky_cand = idx[k];
        }
        L->order = L->order * 1000003u ^ tune_sched_hash(c);
    }
    return 0;
}

/* A refinement of j on a landscape: its hidden optimum is the schedule sampled with opt_seed;
 * o gets the options (steps from seed, memory mem, evaluated by the landscape). Returns a fresh
 * memory for j's target (htam_free). */
static htam *land_setup(pl_job *j, land *L, uint64_t opt_seed, int steps, uint64_t seed,
                        htam_memory mem, htam_opts *o)
{
    *L = (land){0};
    uint64_t r = opt_seed;
    space_sample(j->sp, &r, &L->opt);
    htam_opts_init(o);
    o->steps = steps;
    o->seed = seed;
    o->memory = mem;
    o->eval = land_eval;
    o->eval_user = L;
    o->confirm = 0; /* the refinement alone (the second look has its own test) */
    return htam_new(j->tgt.kind);
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
        land L;
        htam_opts o;
        htam *m = land_setup(&j, &L, 77, 24, run < 2 ? 5 : 6, HTAM_FULL, &o);
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
        land L;
        htam_opts o;
        htam *m = land_setup(&j, &L, 9 + (uint64_t)run, 12, 3, HTAM_FULL, &o);
        tlm_error e;
        cr_assert_eq(htam_load(m, &io, &e), 0, "%s", e.msg);
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
        land L;
        htam_opts o;
        htam *m = land_setup(&j, &L, 4, 10, 1, mem, &o);
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
    /* the start and three steps, then the second look at the three fastest and the start
     * (unless among them), three rounds each */
    cr_assert(stored == 4 + 3 * 3 || stored == 4 + 3 * 4, "%d records", stored);
    pl_job_free(&j);
}

Test(htam, the_second_look_measures_the_fastest_steps_and_the_start_again)
{
    pl_job j;
    prepare(&j, 197, 256, 96, "cpu");
    land L;
    htam_opts o;
    htam *m = land_setup(&j, &L, 77, 12, 5, HTAM_FULL, &o);
    L.lucky_at = 4; /* a step that reads faster than anything */
    o.confirm = 1;
    o.confirm_rounds = 2;
    htam_result res;
    tlm_error e;
    cr_assert_eq(htam_run(m, &j, 0, &o, &res, &e), 0, "%s", e.msg);
    cr_assert_gt(L.lucky_cand, 0);
    cr_assert_float_eq(res.best_s, land_time(&j, &L, &j.cands[L.lucky_cand].sched) * 1e-3, 1e-15,
                       "the lucky step led the search");
    /* the second look: the lucky step and the start, two rounds each */
    cr_assert_eq(res.confirmed, 2);
    cr_assert_eq(L.evaluated, res.steps + 1 + 2 * 2);
    double start = land_time(&j, &L, &j.cands[0].sched);
    double lucky = land_time(&j, &L, &j.cands[L.lucky_cand].sched);
    cr_assert_float_eq(res.first_confirmed_s, start, 1e-15);
    cr_assert_float_eq(res.confirmed_s, fmin(start, lucky), 1e-15);
    cr_assert_eq(res.best_cand, start <= lucky ? 0 : L.lucky_cand, "the faster of the two");
    htam_result_free(&res);
    htam_free(m);
    pl_job_free(&j);
}

/* ---- regeneration by a model ---- */

static tlm_model *tiny_model(uint64_t seed)
{
    tlm_config cfg = {2, 4, 64, 512, lang_vocab_size()};
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_init_random(&cfg, NULL, seed, &m, &e), 0, "%s", e.msg);
    return m;
}

/* A model whose every next-token distribution puts (nearly) all its mass on value v: the
 * final LayerNorm outputs its bias e_0 whatever the input, and only v's token has a weight
 * along e_0 in the (tied) lm head. */
static tlm_model *model_preferring(int64_t v)
{
    tlm_config cfg = {1, 2, 16, 512, lang_vocab_size()};
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_new(&cfg, NULL, &m, &e), 0, "%s", e.msg);
    int tok[LANG_MAX_VALUE_TOKENS];
    cr_assert_eq(lang_encode_int(v, tok, LANG_MAX_VALUE_TOKENS), 1);
    m->lnf_b[0] = 1.0f;
    m->wte[(size_t)tok[0] * (size_t)cfg.n_embd] = 30.0f;
    return m;
}

/* What step k of res must be: base's slots before the rewritten one, the new value within the
 * strategy's operator, the later slots re-legalised as the search does; legal, new. */
static void check_step(const pl_job *j, const htam *m, const htam_step *st)
{
    const space_sched *base = &j->cands[st->from_cand].sched, *c = &j->cands[st->cand].sched;
    cr_assert(st->slot >= 0 && st->slot < j->sp->n_slot);
    cr_assert_eq(base->v[st->slot], st->from);
    cr_assert_eq(c->v[st->slot], st->to);
    int dir = htam_local_direction(m, st->local);
    if (dir > 0) cr_assert_gt(st->to, st->from, "%s", htam_local_name(m, st->local));
    if (dir < 0) cr_assert_lt(st->to, st->from, "%s", htam_local_name(m, st->local));
    cr_assert_neq(st->to, st->from);
    space_sched want = *base;
    want.v[st->slot] = st->to;
    tune_legalise(j->sp, &want, st->slot + 1);
    for (int i = 0; i < j->sp->n_slot; i++)
        cr_assert_eq(c->v[i], want.v[i], "slot %d (%s) of a step rewriting %s", i,
                     j->sp->slot[i].name, j->sp->slot[st->slot].name);
    tlm_error e;
    cr_assert_eq(space_check(j->sp, c, &e), 0, "%s", e.msg);
    for (int k = 0; k < st->cand; k++)
        cr_assert_neq(tune_sched_hash(&j->cands[k].sched), tune_sched_hash(c), "a step repeats");
}

Test(htam, a_model_regenerates_only_the_strategys_slot)
{
    tlm_model *model = tiny_model(3);
    uint64_t order[2];
    htam_gen gens[2][20];
    int n_tlm = 0;
    for (int run = 0; run < 3; run++) {
        pl_job j;
        prepare(&j, 197, 256, 96, "cpu");
        land L;
        htam_opts o;
        htam *m = land_setup(&j, &L, 77, 20, 5, HTAM_FULL, &o);
        o.model = run < 2 ? model : NULL;
        htam_result res;
        tlm_error e;
        cr_assert_eq(htam_run(m, &j, 0, &o, &res, &e), 0, "%s", e.msg);
        cr_assert_geq(res.steps, 10);
        cr_assert_eq(res.traj[0].gen, HTAM_GEN_START);
        cr_assert_str_eq(htam_gen_name(res.traj[0].gen), "start");
        int fallbacks = 0;
        for (int k = 1; k <= res.steps; k++) {
            check_step(&j, m, &res.traj[k]);
            if (run == 2) {
                cr_assert_eq(res.traj[k].gen, HTAM_GEN_MUTATION, "no model: the operators");
            } else {
                gens[run][k - 1] = res.traj[k].gen;
                n_tlm += run == 0 && res.traj[k].gen == HTAM_GEN_TLM;
                fallbacks += res.traj[k].gen == HTAM_GEN_MUTATION;
            }
        }
        if (run < 2) {
            cr_assert_eq(res.fallbacks, fallbacks, "every operator step with a model is counted");
            order[run] = L.order;
        }
        htam_result_free(&res);
        htam_free(m);
        pl_job_free(&j);
    }
    cr_log_info("%d steps written by the model", n_tlm);
    cr_assert_geq(n_tlm, 10, "the model wrote most steps (%d of at least 10)", n_tlm);
    cr_assert_eq(order[0], order[1], "same seed, same model: the same trajectory");
    cr_assert_eq(memcmp(gens[0], gens[1], sizeof gens[0]), 0);
    tlm_model_free(model);
}

/* The legal values slot i of s may take under a strategy of direction dir. */
static bool allowed_for(const pl_job *j, const space_sched *s, int i, int dir, int64_t v)
{
    int64_t *vals = malloc(SPACE_MAX_VALUES * sizeof *vals);
    space_sched p = *s;
    p.n = i;
    int nv = space_legal_values(j->sp, i, &p, vals);
    bool ok = false;
    for (int k = 0; k < nv; k++)
        if (vals[k] == v) ok = true;
    free(vals);
    int64_t cur = s->v[i];
    return ok && (dir > 0 ? v > cur : dir < 0 ? v < cur : v != cur);
}

Test(htam, a_model_that_prefers_a_value_gets_it)
{
    const int64_t V = 16;
    tlm_model *model = model_preferring(V);
    int hits[2] = {0, 0}, checked = 0;
    for (int run = 0; run < 2; run++) {
        pl_job j;
        prepare(&j, 256, 256, 256, "cpu");
        land L;
        htam_opts o;
        htam *m = land_setup(&j, &L, 21, 24, 9, HTAM_FULL, &o);
        o.model = run == 0 ? model : NULL;
        htam_result res;
        tlm_error e;
        cr_assert_eq(htam_run(m, &j, 0, &o, &res, &e), 0, "%s", e.msg);
        for (int k = 1; k <= res.steps; k++) {
            const htam_step *st = &res.traj[k];
            check_step(&j, m, st);
            hits[run] += st->to == V;
            if (run == 1 || st->gen != HTAM_GEN_TLM) continue;
            /* where V was allowed and new, the model's choice is V */
            const space_sched *base = &j.cands[st->from_cand].sched;
            int dir = htam_local_direction(m, st->local);
            if (!allowed_for(&j, base, st->slot, dir, V)) continue;
            space_sched withv = *base;
            withv.v[st->slot] = V;
            tune_legalise(j.sp, &withv, st->slot + 1);
            bool seen = false;
            for (int c = 0; c < st->cand; c++)
                seen = seen || tune_sched_hash(&j.cands[c].sched) == tune_sched_hash(&withv);
            checked += !seen;
            if (!seen)
                cr_assert_eq(st->to, V, "step %d (%s on %s): the model wants %lld, got %lld", k,
                             htam_local_name(m, st->local), j.sp->slot[st->slot].name, (long long)V,
                             (long long)st->to);
        }
        htam_result_free(&res);
        htam_free(m);
        pl_job_free(&j);
    }
    cr_log_info("value %lld: %d steps with the model, %d without; %d steps could take it",
                (long long)V, hits[0], hits[1], checked);
    cr_assert_geq(checked, 3, "steps where the model's value was allowed and new");
    cr_assert_gt(hits[0], hits[1], "the model's value %lld: %d steps with it, %d without",
                 (long long)V, hits[0], hits[1]);
    tlm_model_free(model);
}

Test(htam, tlm_select_regen_keeps_the_prefix_and_the_filter)
{
    tlm_model *model = model_preferring(16);
    pl_job j;
    prepare(&j, 256, 256, 256, "cpu");
    const space_sched *base = &j.cands[0].sched;
    int64_t vals[8];
    double scores[8];
    int n = 0;
    tlm_error e;
    /* the first tile slot: every legal value but the current, best first: 16 when legal */
    int slot = -1;
    for (int i = 0; i < j.sp->n_slot && slot < 0; i++)
        if (j.sp->slot[i].kind == SLOT_TILE && allowed_for(&j, base, i, 0, 16)) slot = i;
    cr_assert_geq(slot, 0);
    cr_assert_eq(tlm_select_regen(model, j.sp, base, slot, NULL, NULL, 8, vals, scores, &n, &e), 0,
                 "%s", e.msg);
    cr_assert_geq(n, 1);
    cr_assert_eq(vals[0], 16);
    for (int k = 0; k < n; k++) {
        cr_assert(allowed_for(&j, base, slot, 0, vals[k]));
        if (k) cr_assert_leq(scores[k], scores[k - 1]);
    }
    tlm_model_free(model);
    pl_job_free(&j);
}

/* Two kernels on one landscape, one of them 50 times heavier. */
Test(htam, several_kernels_share_the_budget_by_the_task_scheduler)
{
    pl_job j[2];
    tune_task tasks[2];
    for (int i = 0; i < 2; i++) {
        prepare(&j[i], 197, 256, 96, "cpu");
        tasks[i] = (tune_task){.job = &j[i], .weight = i == 1 ? 50.0 : 1.0};
    }
    land L;
    htam_opts o;
    htam *m = land_setup(&j[0], &L, 77, 40, 2, HTAM_FULL, &o);
    htam_result res[2];
    tlm_error e;
    cr_assert_eq(htam_tasks(m, tasks, 2, &o, 4, res, NULL, NULL, &e), 0, "%s", e.msg);
    cr_assert_eq(L.evaluated, tasks[0].trials + tasks[1].trials);
    cr_assert_eq(L.evaluated, 40, "the whole budget is spent");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(tasks[i].trials, res[i].steps + 1);
        cr_assert_float_eq(tasks[i].best_s, res[i].best_s, 1e-15);
        for (int k = 1; k <= res[i].steps; k++)
            check_step(&j[i], m, &res[i].traj[k]);
    }
    cr_log_info("trials: heavy %d, light %d", tasks[1].trials, tasks[0].trials);
    cr_assert_geq(tasks[1].trials, 30, "the heavy kernel gets the budget (%d to %d)",
                  tasks[1].trials, tasks[0].trials);
    /* every step is one measurement in the shared memory */
    json_t *doc = htam_to_json(m);
    cr_assert_float_eq(sum_of(json_object_get(doc, "globals"), "n"), 38, 1e-9);
    json_decref(doc);
    for (int i = 0; i < 2; i++)
        htam_result_free(&res[i]);
    htam_free(m);
    pl_job_free(&j[0]);
    pl_job_free(&j[1]);
}
