/* test_pipeline.c — the one pipeline entry: every mode's candidates, schedule source,
 * measurement policy, choice and records; the search hook; the refusals naming their field. */
#include <math.h>
#include <string.h>

#include <criterion/criterion.h>

#include "compiler/driver/pipeline.h"
#include "compiler/toolchain/toolchain.h"

static void dense(ir_workload *w, int64_t M, int64_t N, int64_t K)
{
    ir_workload_init(w, IR_OP_DENSE);
    w->shape[IR_DENSE_M] = M;
    w->shape[IR_DENSE_N] = N;
    w->shape[IR_DENSE_K] = K;
    w->n_epilogue = 1;
    w->epilogue[0] = IR_EPI_RELU;
}

static target tgt(const char *name)
{
    target t;
    tlm_error e;
    cr_assert_eq(target_parse(name, &t, &e), 0, "%s", e.msg);
    return t;
}

static tlm_model *small_model(uint64_t seed)
{
    tlm_config cfg = {.n_layer = 1, .n_head = 2, .n_embd = 32, .n_ctx = 256,
                      .vocab_size = lang_vocab_size()};
    uint8_t vh[32];
    lang_vocab_hash(vh);
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_init_random(&cfg, vh, seed, &m, &e), 0, "%s", e.msg);
    return m;
}

Test(pipeline, default_mode_builds_the_rule_of_thumb_unmeasured)
{
    ir_workload w;
    dense(&w, 32, 48, 16);
    target t = tgt("cpu");
    pl_opts o;
    pl_opts_init(&o);
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(j.source, PL_SRC_DEFAULT);
    cr_assert_str_eq(pl_source_name(j.source), "default");
    cr_assert_str_eq(j.selection, "first");
    cr_assert(!j.measured);
    cr_assert_eq(j.chosen, 0);
    space_sched s;
    space_default(j.sp, &s);
    char want[DRV_SCHED_MAX];
    space_print(j.sp, &s, want, sizeof want);
    cr_assert_str_eq(j.art.schedule, want);
    cr_assert(j.art.binary && j.art.binary_size > 0);
    cr_assert_eq(j.n_recs, 1);
    cr_assert_str_eq(j.recs[0].status, "built");
    cr_assert(!pl_record_storable(&j.recs[0]));
    cr_assert_eq(strlen(j.whash), 64);
    cr_assert_eq(strlen(j.target_hash), 64);
    pl_job_free(&j);
}

Test(pipeline, verify_measures_the_single_candidate)
{
    ir_workload w;
    dense(&w, 17, 33, 9);
    target t = tgt("cpu");
    pl_opts o;
    pl_opts_init(&o);
    o.verify = true;
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert(j.measured);
    cr_assert_str_eq(j.selection, "verified");
    cr_assert_eq(j.chosen_mr.status, MEASURE_OK);
    cr_assert(j.chosen_mr.median_s > 0);
    cr_assert_eq(j.n_recs, 1);
    cr_assert_str_eq(j.recs[0].status, "ok");
    cr_assert(pl_record_storable(&j.recs[0]));
    cr_assert(j.recs[0].median_s > 0 && j.recs[0].min_s <= j.recs[0].median_s);
    cr_assert(j.recs[0].rel_err >= 0 && j.recs[0].rel_err < 1e-4);
    cr_assert(j.recs[0].n_samples > 0);
    pl_job_free(&j);
}

Test(pipeline, tlm_mode_is_deterministic_and_says_tlm)
{
    ir_workload w;
    dense(&w, 64, 64, 64);
    target t = tgt("cpu");
    tlm_model *m = small_model(7);
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_TLM;
    o.model = m;
    pl_job a, b;
    tlm_error e;
    cr_assert_eq(pl_run(&a, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(pl_run(&b, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(a.source, PL_SRC_TLM);
    cr_assert_str_eq(a.art.schedule, b.art.schedule);
    cr_assert_str_eq(a.art.sha256, b.art.sha256);
    cr_assert(isfinite(a.cands[0].score));
    char sent[8192];
    cr_assert_geq(pl_sentence(&a, 0, sent, sizeof sent), 0);
    cr_assert(strstr(sent, "[EOS]"), "%s", sent);
    pl_job_free(&a);
    pl_job_free(&b);
    tlm_model_free(m);
}

Test(pipeline, topk_on_this_cpu_measures_every_candidate_and_takes_the_fastest)
{
    ir_workload w;
    dense(&w, 48, 40, 24);
    target t = tgt("cpu");
    tlm_model *m = small_model(11);
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_TOPK;
    o.k = 3;
    o.model = m;
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(j.source, PL_SRC_TOPK);
    cr_assert_gt(j.n_cands, 1);
    cr_assert_eq(j.n_recs, j.n_cands, "every candidate gives a record");
    cr_assert_str_eq(j.selection, "measured");
    double best = INFINITY;
    int best_i = -1;
    for (int i = 0; i < j.n_recs; i++) {
        cr_assert(pl_record_storable(&j.recs[i]));
        cr_assert_eq(j.recs[i].cand, i);
        if (!strcmp(j.recs[i].status, "ok") && j.recs[i].median_s < best) {
            best = j.recs[i].median_s;
            best_i = i;
        }
    }
    cr_assert_eq(j.chosen, best_i);
    cr_assert_float_eq(j.chosen_mr.median_s, best, 0);
    char sched[DRV_SCHED_MAX];
    space_print(j.sp, &j.cands[j.chosen].sched, sched, sizeof sched);
    cr_assert_str_eq(j.art.schedule, sched);
    pl_job_free(&j);
    tlm_model_free(m);
}

Test(pipeline, topk_for_a_gpu_ranks_by_model_score_without_measuring)
{
    ir_workload w;
    dense(&w, 64, 64, 64);
    target t = tgt("cuda:sm_90");
    tlm_model *m = small_model(3);
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_TOPK;
    o.k = 2;
    o.model = m;
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert(!j.measured);
    cr_assert_str_eq(j.selection, "model_score");
    cr_assert_str_eq(j.art.format, "cubin");
    cr_assert_eq(j.chosen, 0, "best score first, and it builds");
    pl_job_free(&j);
    tlm_model_free(m);
}

Test(pipeline, given_schedules_are_checked_and_the_fastest_correct_wins)
{
    ir_workload w;
    dense(&w, 32, 32, 32);
    target t = tgt("cpu");
    pl_opts o;
    pl_opts_init(&o);
    pl_job j;
    tlm_error e;
    /* two samples of the space as the given schedules */
    cr_assert_eq(pl_prepare(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    space_sched s[2];
    uint64_t rng = 12345;
    space_sample(j.sp, &rng, &s[0]);
    space_sample(j.sp, &rng, &s[1]);
    pl_job_free(&j);
    o.mode = PL_MODE_GIVEN;
    o.given = s;
    o.n_given = 2;
    o.measure = PL_MEASURE_ON;
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(j.source, PL_SRC_GIVEN);
    cr_assert_eq(j.n_recs, 2);
    int other = 1 - j.chosen;
    cr_assert_str_eq(j.recs[j.chosen].status, "ok");
    cr_assert(strcmp(j.recs[other].status, "ok") ||
              j.recs[other].median_s >= j.recs[j.chosen].median_s);
    pl_job_free(&j);

    /* an illegal decision is refused naming its slot */
    s[0].v[0] = 1000003;
    o.n_given = 1;
    cr_assert_neq(pl_run(&j, &w, &t, &o, &e), 0);
    cr_assert_eq(e.code, TLM_EINVAL);
    cr_assert(e.field[0], "the slot is named");
    pl_job_free(&j);
}

Test(pipeline, refusals_name_their_field)
{
    ir_workload w;
    dense(&w, 8, 8, 8);
    pl_opts o;
    pl_opts_init(&o);
    pl_job j;
    tlm_error e;

    target gpu = tgt("cuda:sm_80");
    o.measure = PL_MEASURE_ON;
    cr_assert_eq(pl_run(&j, &w, &gpu, &o, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "measure");
    pl_job_free(&j);

    target cpu = tgt("cpu");
    pl_opts_init(&o);
    o.mode = PL_MODE_TLM;
    cr_assert_eq(pl_run(&j, &w, &cpu, &o, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "weights");
    pl_job_free(&j);

    pl_opts_init(&o);
    o.mode = PL_MODE_TOPK;
    o.k = PL_MAX_CANDIDATES + 1;
    cr_assert_eq(pl_prepare(&j, &w, &cpu, &o, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "candidates");
    pl_job_free(&j);

    pl_opts_init(&o);
    o.mode = PL_MODE_REFINE;
    cr_assert_eq(pl_prepare(&j, &w, &cpu, &o, &e), TLM_EUNSUPPORTED);
    cr_assert_str_eq(e.field, "mode");
    pl_job_free(&j);

    pl_mode pm;
    cr_assert_eq(pl_mode_parse("generate", "mode", &pm, &e), 0);
    cr_assert_eq(pm, PL_MODE_TLM);
    cr_assert_eq(pl_mode_parse("fastest", "mode", &pm, &e), TLM_EINVAL);
    cr_assert_str_eq(e.field, "mode");
    cr_assert_eq(pl_source_parse("tuned"), PL_SRC_TUNED);
    cr_assert_eq(pl_source_parse("nope"), -1);
}

/* A stand-in search: adds the default and one sample, measures both, keeps the faster. */
static int calls;
static int toy_search(pl_job *j, void *user, tlm_error *err)
{
    calls++;
    cr_assert_eq(user, &calls);
    space_sched s;
    space_default(j->sp, &s);
    int rc = pl_add_candidate(j, &s, PL_SRC_TUNED, NAN, err);
    uint64_t rng = 99;
    space_sample(j->sp, &rng, &s);
    if (!rc) rc = pl_add_candidate(j, &s, PL_SRC_TUNED, NAN, err);
    if (rc) return rc;
    drv_artifact a[2];
    double t[2];
    for (int i = 0; i < 2; i++) {
        int ri = pl_evaluate(j, i, true, &a[i], err);
        cr_assert_geq(ri, 0);
        t[i] = strcmp(j->recs[ri].status, "ok") ? INFINITY : j->recs[ri].median_s;
    }
    int w = t[1] < t[0];
    drv_artifact_free(&a[1 - w]);
    pl_choose(j, w, &a[w], NULL, "search");
    return 0;
}

Test(pipeline, tune_goes_through_the_registered_search)
{
    ir_workload w;
    dense(&w, 16, 16, 16);
    target t = tgt("cpu");
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_TUNE;
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_prepare(&j, &w, &t, &o, &e), TLM_EUNSUPPORTED);
    cr_assert_str_eq(e.field, "mode");
    pl_job_free(&j);
    pl_set_search(PL_MODE_TUNE, toy_search, &calls);
    cr_assert(pl_has_search(PL_MODE_TUNE));
    cr_assert_eq(pl_run(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert_eq(calls, 1);
    cr_assert_eq(j.source, PL_SRC_TUNED);
    cr_assert_str_eq(pl_source_name(j.source), "tuned");
    cr_assert_str_eq(j.selection, "search");
    cr_assert_eq(j.n_recs, 2);
    cr_assert(j.art.binary);
    pl_job_free(&j);
    pl_set_search(PL_MODE_TUNE, NULL, NULL);
}

Test(pipeline, a_batch_builds_in_parallel_and_records_in_order)
{
    ir_workload w;
    dense(&w, 24, 40, 16);
    target t = tgt("cpu");
    pl_opts o;
    pl_opts_init(&o);
    pl_job j;
    tlm_error e;
    cr_assert_eq(pl_prepare(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    uint64_t rng = 5;
    for (int i = 0; i < 3; i++) {
        space_sched s;
        space_sample(j.sp, &rng, &s);
        cr_assert_eq(pl_add_candidate(&j, &s, PL_SRC_GIVEN, NAN, &e), 0);
    }
    int idx[4] = {3, 0, 2, 1}, rec[4];
    cr_assert_eq(pl_evaluate_batch(&j, idx, 4, true, 2, rec, &e), 0, "%s", e.msg);
    cr_assert_eq(j.n_recs, 4);
    for (int k = 0; k < 4; k++) {
        cr_assert_eq(rec[k], k);
        cr_assert_eq(j.recs[k].cand, idx[k], "records follow idx's order");
        cr_assert_str_eq(j.recs[k].status, "ok", "%s", j.recs[k].detail);
        cr_assert_gt(j.recs[k].median_s, 0);
        cr_assert(pl_record_storable(&j.recs[k]));
    }
    /* unmeasured: built only, nothing to store */
    cr_assert_eq(pl_evaluate_batch(&j, idx, 2, false, 2, NULL, &e), 0);
    cr_assert_str_eq(j.recs[4].status, "built");
    cr_assert(!pl_record_storable(&j.recs[4]));
    /* cancelled before the batch: nothing is built, and nothing is a trial to store */
    bool cancel = true;
    j.o.cancel = &cancel;
    cr_assert_eq(pl_evaluate_batch(&j, idx, 3, true, 2, rec, &e), 0);
    for (int k = 0; k < 3; k++) {
        cr_assert_str_eq(j.recs[rec[k]].status, "cancelled");
        cr_assert(!pl_record_storable(&j.recs[rec[k]]));
    }
    pl_job_free(&j);
}

/* cuda without a GPU: TUNE is refused unless model_labels, which labels every evaluated
 * candidate with the GPU model: status "modelled" (storable and timed, never "ok"). A choice
 * made on modelled times is not a measurement of the kernel. */
Test(pipeline, model_labels_label_cuda_candidates_as_modelled)
{
    tlm_error e;
    tlm_err_clear(&e);
    if (tc_nvrtc_available(&e)) cr_skip_test("NVRTC is not available: %s", e.msg);
    ir_workload w;
    dense(&w, 64, 64, 64);
    target t = tgt("cuda:sm_90");
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_TUNE;
    pl_set_search(PL_MODE_TUNE, toy_search, &calls);
    pl_job j;
    cr_assert_eq(pl_prepare(&j, &w, &t, &o, &e), TLM_EUNSUPPORTED);
    cr_assert_str_eq(e.field, "mode");
    pl_job_free(&j);
    o.model_labels = true;
    cr_assert_eq(pl_prepare(&j, &w, &t, &o, &e), 0, "%s", e.msg);
    cr_assert(!j.can_run);
    cr_assert(j.can_model);
    space_sched s;
    space_default(j.sp, &s);
    cr_assert_eq(pl_add_candidate(&j, &s, PL_SRC_DEFAULT, NAN, &e), 0, "%s", e.msg);
    int ri = pl_evaluate(&j, 0, true, NULL, &e);
    cr_assert_geq(ri, 0, "%s", e.msg);
    const pl_record *r = &j.recs[ri];
    cr_assert_str_eq(r->status, "modelled");
    cr_assert(r->median_s > 0 && isfinite(r->median_s));
    cr_assert_eq(r->n_samples, 0);
    cr_assert(!strncmp(r->detail, MEASURE_GPU_MODEL_ID, strlen(MEASURE_GPU_MODEL_ID)), "%s",
              r->detail);
    cr_assert(pl_record_storable(r));
    cr_assert(pl_record_timed(r));
    /* without `measure` the candidate is only built */
    ri = pl_evaluate(&j, 0, false, NULL, &e);
    cr_assert_str_eq(j.recs[ri].status, "built");
    cr_assert(!pl_record_timed(&j.recs[ri]));
    pl_job_free(&j);
    /* model_labels changes nothing for a CPU target this host runs: it measures */
    target cpu = tgt("cpu");
    o.mode = PL_MODE_DEFAULT;
    cr_assert_eq(pl_prepare(&j, &w, &cpu, &o, &e), 0, "%s", e.msg);
    cr_assert(!j.can_model);
    pl_job_free(&j);
    pl_set_search(PL_MODE_TUNE, NULL, NULL);
}
