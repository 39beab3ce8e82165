/* The TLM as a schedule writer: random weights, random (workload, target) pairs, every
 * decoded sentence a legal schedule that generates and compiles; decoding is deterministic
 * and batched decoding equals one-at-a-time decoding. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/codegen/codegen.h"
#include "compiler/tlm/select.h"
#include "compiler/toolchain/toolchain.h"
#include "proto/workload.h"

#define N_PAIRS 1000
#define BATCH 32

static const char *targets[] = {"cpu", "cpu:avx2", "cpu:avx512", "cuda:sm_80", "cuda:sm_90",
                                "cuda:a100", "cuda:h200"};

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static int64_t pick(uint64_t *s, const int64_t *v, int n)
{
    return v[rnd(s) % (uint64_t)n];
}

/* A random valid workload of a random family (small to large extents). */
static void random_workload(uint64_t *s, ir_workload *w)
{
    static const int64_t ext[] = {1, 2, 3, 7, 8, 12, 16, 28, 56, 64, 96, 128, 384, 768, 1000, 1024};
    for (;;) {
        ir_op op = (ir_op)(rnd(s) % IR_OP_COUNT);
        ir_workload_init(w, op);
        const ir_op_info *in = ir_op_get(op);
        for (int k = 0; k < in->n_keys; k++) w->shape[k] = pick(s, ext, 16);
        if (op == IR_OP_CONV2D || op == IR_OP_DEPTHWISE_CONV2D || op == IR_OP_MAX_POOL2D ||
            op == IR_OP_AVG_POOL2D) {
            int kh = op == IR_OP_CONV2D ? IR_CONV_KH : IR_DW_KH;
            static const int64_t ks[] = {1, 3, 5, 7};
            w->shape[kh] = w->shape[kh + 1] = pick(s, ks, 4);
            w->pad[0] = w->pad[1] = w->shape[kh] / 2;
            if (op != IR_OP_MAX_POOL2D && op != IR_OP_AVG_POOL2D) w->stride[0] = w->stride[1] = 1 + rnd(s) % 2;
            if (rnd(s) % 2) w->layout = IR_NHWC;
        }
        if (op == IR_OP_DENSE || op == IR_OP_BATCH_MATMUL) {
            w->transpose_a = rnd(s) % 2;
            w->transpose_b = rnd(s) % 2;
        }
        int ne = (int)(rnd(s) % 3);
        if (op == IR_OP_ELEMENTWISE && ne == 0) ne = 1;
        for (int i = 0; i < ne; i++) w->epilogue[w->n_epilogue++] = (ir_epilogue)(rnd(s) % IR_EPI_COUNT);
        ir_workload_normalize(w);
        if (ir_workload_check(w, NULL) == 0) return;
    }
}

typedef struct {
    ir_subgraph g;
    space sp;
    tlm_select_ctx ctx;
    tlm_request req;
    int slot;
    tlm_candidate cand;
} job;

static tlm_model *model(void)
{
    tlm_config cfg = {2, 4, 64, 512, lang_vocab_size()};
    uint8_t vh[32];
    lang_vocab_hash(vh);
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_init_random(&cfg, vh, 42, &m, &e), 0, "%s", e.msg);
    return m;
}

/* Decodes jobs[0..n) through one decoder, BATCH requests at a time. */
static void decode_all(const tlm_model *m, job *jobs, int n, int batch)
{
    tlm_decoder *dec = NULL;
    tlm_error e;
    cr_assert_eq(tlm_decoder_new(m, batch, &dec, &e), 0, "%s", e.msg);
    for (int base = 0; base < n; base += batch) {
        int hi = base + batch < n ? base + batch : n;
        for (int i = base; i < hi; i++) {
            cr_assert_eq(tlm_select_request(&jobs[i].sp, m, 1, &jobs[i].ctx, &jobs[i].req, &e), 0,
                         "%s", e.msg);
            jobs[i].slot = tlm_decoder_add(dec, &jobs[i].req, &e);
            cr_assert_geq(jobs[i].slot, 0, "%s", e.msg);
        }
        cr_assert_eq(tlm_decoder_run(dec, &e), 0, "%s", e.msg);
        for (int i = base; i < hi; i++) {
            cr_assert_eq(tlm_select_result(dec, jobs[i].slot, 0, &jobs[i].sp, &jobs[i].cand, &e), 0,
                         "pair %d: %s: %s", i, e.field, e.msg);
            tlm_decoder_release(dec, jobs[i].slot);
            tlm_select_ctx_free(&jobs[i].ctx);
        }
    }
    tlm_decoder_free(dec);
}

/* Pairs [lo, hi) of the fixed sequence of N_PAIRS random (workload, target) pairs: decoded in
 * batches of BATCH, every one legal and generated, every 10th compiled; with `again`, the
 * first 64 decoded again one at a time must give the same tokens. The thousand are split over
 * two tests so that Criterion's two jobs share them. */
static void random_pairs(int lo, int hi, bool again_check)
{
    tlm_model *m = model();
    job *jobs = calloc((size_t)hi, sizeof *jobs); /* [lo, hi) used */
    uint64_t s = 2026;
    tlm_error e;
    for (int i = 0; i < hi; i++) { /* the same sequence whatever the range */
        ir_workload w;
        random_workload(&s, &w);
        target t;
        cr_assert_eq(target_parse(targets[rnd(&s) % (sizeof targets / sizeof targets[0])], &t, &e), 0);
        if (i < lo) continue;
        cr_assert_eq(ir_subgraph_build(&w, &jobs[i].g, &e), 0, "%s", e.msg);
        cr_assert_eq(space_build(&jobs[i].g, &t, &jobs[i].sp, &e), 0, "%s", e.msg);
    }
    decode_all(m, jobs + lo, hi - lo, BATCH);
    int compiled = 0;
    char dir[] = "/tmp/tlm-select-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    for (int i = lo; i < hi; i++) {
        cr_assert_eq(space_check(&jobs[i].sp, &jobs[i].cand.sched, &e), 0, "%s", e.msg);
        cg_kernel k;
        cr_assert_eq(cg_generate(&jobs[i].sp, &jobs[i].cand.sched, NULL, &k, &e), 0, "pair %d: %s", i,
                     e.msg);
        /* Compiling all 1000 would take most of the test budget on 2 cores; every 10th is
         * compiled (CPU with cc, CUDA with NVRTC), every one is generated and checked. */
        if (i % 10 == 0) {
            if (k.cuda) {
                tc_cubin cb;
                int rc = tc_nvrtc_compile(k.source, k.entry, target_sm(&jobs[i].sp.tgt), &cb, &e);
                if (rc == TLM_EUNSUPPORTED) cr_log_warn("NVRTC unavailable: %s", e.msg);
                else {
                    cr_assert_eq(rc, 0, "pair %d: %s", i, e.msg);
                    tc_cubin_free(&cb);
                    compiled++;
                }
            } else {
                char so[256];
                snprintf(so, sizeof so, "%s/k%d.so", dir, i);
                cr_assert_eq(tc_cc_compile(k.source, "-O1", so, NULL, &e), 0, "pair %d: %s", i, e.msg);
                unlink(so);
                compiled++;
            }
        }
        cg_kernel_free(&k);
    }
    rmdir(dir);
    cr_assert_geq(compiled, (hi - lo) / 20);
    if (!again_check) {
        free(jobs);
        tlm_model_free(m);
        return;
    }

    /* determinism: a second run gives the same tokens; batch 1 equals batch 32 */
    job *again = calloc(64, sizeof *again);
    for (int i = 0; i < 64; i++) {
        again[i].g = jobs[i].g;
        again[i].sp = jobs[i].sp;
        again[i].sp.g = &again[i].g;
    }
    decode_all(m, again, 64, 1);
    for (int i = 0; i < 64; i++) {
        cr_assert_eq(again[i].cand.n_tokens, jobs[i].cand.n_tokens);
        cr_assert_eq(memcmp(again[i].cand.tokens, jobs[i].cand.tokens,
                            sizeof(int32_t) * (size_t)jobs[i].cand.n_tokens), 0,
                     "pair %d differs between batch 32 and batch 1", i);
    }
    free(again);
    free(jobs);
    tlm_model_free(m);
}

Test(select, thousand_random_pairs_decode_to_legal_compilable_schedules, .timeout = 600)
{
    random_pairs(0, N_PAIRS / 2, true);
}

Test(select, thousand_random_pairs_second_half, .timeout = 600)
{
    random_pairs(N_PAIRS / 2, N_PAIRS, false);
}

Test(select, beam_candidates_are_distinct_legal_and_ranked)
{
    tlm_model *m = model();
    ir_workload w;
    ir_workload_init(&w, IR_OP_DENSE);
    w.shape[0] = 128, w.shape[1] = 768, w.shape[2] = 3072;
    ir_subgraph *g = malloc(sizeof *g);
    space sp;
    target t;
    tlm_error e;
    cr_assert_eq(ir_subgraph_build(&w, g, &e), 0);
    cr_assert_eq(target_parse("cpu", &t, &e), 0);
    cr_assert_eq(space_build(g, &t, &sp, &e), 0);
    tlm_candidate *c = calloc(4, sizeof *c);
    int n = 0;
    cr_assert_eq(tlm_select_generate(m, &sp, 4, c, &n, &e), 0, "%s", e.msg);
    cr_assert_eq(n, 4);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(space_check(&sp, &c[i].sched, &e), 0);
        if (i) cr_assert_geq(c[i - 1].score, c[i].score, "best first");
        for (int j = 0; j < i; j++)
            cr_assert_neq(memcmp(c[i].sched.v, c[j].sched.v, sizeof(int64_t) * (size_t)sp.n_slot), 0);
    }
    /* greedy equals the best beam when the beam is 1 */
    tlm_candidate *g1 = calloc(1, sizeof *g1);
    cr_assert_eq(tlm_select_generate(m, &sp, 1, g1, &n, &e), 0);
    cr_assert_eq(n, 1);
    cr_assert_eq(space_check(&sp, &g1->sched, &e), 0);
    free(g1);
    free(c);
    free(g);
    tlm_model_free(m);
}

Test(select, wrong_vocabulary_is_refused)
{
    tlm_config cfg = {1, 2, 32, 256, 100};
    tlm_model *m = NULL;
    tlm_error e;
    cr_assert_eq(tlm_model_init_random(&cfg, NULL, 1, &m, &e), 0);
    ir_workload w;
    ir_workload_init(&w, IR_OP_SOFTMAX);
    w.shape[0] = 4, w.shape[1] = 8;
    ir_subgraph *g = malloc(sizeof *g);
    space sp;
    target t;
    cr_assert_eq(ir_subgraph_build(&w, g, &e), 0);
    cr_assert_eq(target_parse("cpu", &t, &e), 0);
    cr_assert_eq(space_build(g, &t, &sp, &e), 0);
    tlm_candidate c;
    int n;
    cr_assert_neq(tlm_select_generate(m, &sp, 1, &c, &n, &e), 0);
    cr_assert_str_eq(e.field, "weights");
    free(g);
    tlm_model_free(m);
}

/* One space of a workload on a target (caller frees g). */
static void space_of(const char *op_wl, const char *tg, ir_subgraph **g, space *sp)
{
    tlm_error e;
    ir_workload w;
    cr_assert_eq(proto_workload_from_string(op_wl, strlen(op_wl), &w, &e), 0, "%s", e.msg);
    *g = malloc(sizeof **g);
    target t;
    cr_assert_eq(ir_subgraph_build(&w, *g, &e), 0, "%s", e.msg);
    cr_assert_eq(target_parse(tg, &t, &e), 0);
    cr_assert_eq(space_build(*g, &t, sp, &e), 0, "%s", e.msg);
}

/* The prior on the default schedule: none (0) leaves decoding as it was; a bonus far above
 * any logit gap writes the default exactly, greedy and as the beam's best; a bonus in between
 * departs from the default no more often than none, on random weights over several spaces;
 * every sentence stays legal, and the same prior gives the same schedule twice. */
Test(select, the_prior_on_the_default_schedule_pulls_the_model_towards_it)
{
    static const char *const wls[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":197,\"N\":768,\"K\":3072}}",
        "{\"op\":\"batch_matmul\",\"shape\":{\"B\":12,\"M\":197,\"N\":197,\"K\":64},"
        "\"transpose_b\":true}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":80,\"W\":80,\"F\":64,\"KH\":3,"
        "\"KW\":3},\"pad\":[1,1]}",
        "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":56,\"W\":56,\"KH\":7,"
        "\"KW\":7},\"pad\":[3,3]}",
        "{\"op\":\"softmax\",\"shape\":{\"R\":2364,\"C\":197}}",
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":197,\"C\":768}}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    tlm_model *m = model();
    tlm_error e;
    int departs_none = 0, departs_mid = 0, pairs = 0;
    for (size_t wi = 0; wi < sizeof wls / sizeof wls[0]; wi++)
        for (int ti = 0; ti < 2; ti++) {
            ir_subgraph *g;
            space sp;
            space_of(wls[wi], tgs[ti], &g, &sp);
            space_sched def;
            space_default(&sp, &def);
            size_t bytes = sizeof(int64_t) * (size_t)sp.n_slot;
            tlm_candidate *c = calloc(3, sizeof *c);
            int n = 0;
            m->default_prior = 0.0f;
            cr_assert_eq(tlm_select_generate(m, &sp, 1, &c[0], &n, &e), 0, "%s", e.msg);
            m->default_prior = 100.0f;
            cr_assert_eq(tlm_select_generate(m, &sp, 1, &c[1], &n, &e), 0, "%s", e.msg);
            cr_assert_eq(n, 1);
            cr_assert_eq(memcmp(c[1].sched.v, def.v, bytes), 0,
                         "%s on %s: a prior of 100 did not write the default", wls[wi], tgs[ti]);
            cr_assert_eq(tlm_select_generate(m, &sp, 3, c, &n, &e), 0, "%s", e.msg);
            cr_assert_geq(n, 1);
            cr_assert_eq(memcmp(c[0].sched.v, def.v, bytes), 0, "the beam's best is the default");
            for (int i = 0; i < n; i++) cr_assert_eq(space_check(&sp, &c[i].sched, &e), 0, "%s", e.msg);
            m->default_prior = 2.0f;
            cr_assert_eq(tlm_select_generate(m, &sp, 1, &c[0], &n, &e), 0, "%s", e.msg);
            cr_assert_eq(tlm_select_generate(m, &sp, 1, &c[1], &n, &e), 0, "%s", e.msg);
            cr_assert_eq(memcmp(c[0].sched.v, c[1].sched.v, bytes), 0, "deterministic");
            cr_assert_eq(space_check(&sp, &c[0].sched, &e), 0, "%s", e.msg);
            for (int s = 0; s < sp.n_slot; s++) departs_mid += c[0].sched.v[s] != def.v[s];
            /* a beam whose histories differ on the vector axis: each follows its own anchor,
             * the same way every time */
            tlm_candidate *b1 = calloc(4, sizeof *b1), *b2 = calloc(4, sizeof *b2);
            int n1 = 0, n2 = 0;
            cr_assert_eq(tlm_select_generate(m, &sp, 4, b1, &n1, &e), 0, "%s", e.msg);
            cr_assert_eq(tlm_select_generate(m, &sp, 4, b2, &n2, &e), 0, "%s", e.msg);
            cr_assert_eq(n1, n2);
            for (int i = 0; i < n1; i++) {
                cr_assert_eq(space_check(&sp, &b1[i].sched, &e), 0, "%s", e.msg);
                cr_assert_eq(memcmp(b1[i].sched.v, b2[i].sched.v, bytes), 0, "beam %d differs", i);
            }
            free(b1);
            free(b2);
            for (int s = 0; s < sp.n_slot; s++) pairs++;
            m->default_prior = 0.0f;
            cr_assert_eq(tlm_select_generate(m, &sp, 1, &c[2], &n, &e), 0, "%s", e.msg);
            for (int s = 0; s < sp.n_slot; s++) departs_none += c[2].sched.v[s] != def.v[s];
            free(c);
            free(g);
        }
    /* counted per slot: a bonus of 2 logits on the default's tokens never departs more than
     * none (random weights with tied embeddings mostly copy the hint token just before each
     * value, the rule of thumb's, so both may be small) */
    cr_expect_leq(departs_mid, departs_none, "a prior of 2 departed from the default on %d of %d "
                  "slots, none on %d", departs_mid, pairs, departs_none);
    tlm_model_free(m);
}

/* The decoder's preference: a favoured token with a large bonus is chosen wherever it is
 * allowed; a preference without a mask, or with a bonus that is negative or not finite, is
 * refused with the field named. */
static int all_tokens(void *user, const int32_t *tokens, int n_tokens, int n_prompt,
                      uint64_t *allowed, int32_t *forced, tlm_error *err)
{
    (void)user, (void)tokens, (void)n_prompt, (void)forced, (void)err;
    if (n_tokens >= n_prompt + 5) return TLM_MASK_STOP;
    for (int t = 0; t < lang_vocab_size(); t++) tlm_bitset_set(allowed, t);
    return TLM_MASK_NEXT;
}

static int32_t favour_7(void *user, const int32_t *tokens, int n_tokens, int n_prompt)
{
    (void)user, (void)tokens, (void)n_tokens, (void)n_prompt;
    return 7;
}

Test(select, a_decoder_preference_is_checked_and_followed)
{
    tlm_model *m = model();
    tlm_decoder *dec = NULL;
    tlm_error e;
    cr_assert_eq(tlm_decoder_new(m, 1, &dec, &e), 0);
    int32_t prompt[2] = {LANG_BOS, LANG_SEP};
    tlm_request r = {.prompt = prompt, .n_prompt = 2, .mask = all_tokens, .prefer = favour_7,
                     .prefer_bonus = 1000.0f, .max_new_tokens = 8, .beam_width = 1};
    int slot = tlm_decoder_add(dec, &r, &e);
    cr_assert_geq(slot, 0, "%s", e.msg);
    cr_assert_eq(tlm_decoder_run(dec, &e), 0, "%s", e.msg);
    const int32_t *toks;
    int n;
    double score;
    cr_assert_eq(tlm_decoder_result(dec, slot, 0, &toks, &n, &score, &e), 0);
    cr_assert_eq(n, 5, "generated %d tokens", n); /* the result leaves the prompt out */
    for (int i = 0; i < n; i++) cr_assert_eq(toks[i], 7, "position %d: token %d", i, toks[i]);
    cr_assert(score > -1e-3 && score <= 0.0, "a 1000-logit favourite has probability ~1: %g", score);
    tlm_decoder_release(dec, slot);
    float bad[] = {-1.0f, NAN, INFINITY};
    for (int i = 0; i < 3; i++) {
        r.prefer_bonus = bad[i];
        cr_assert_lt(tlm_decoder_add(dec, &r, &e), 0, "bonus %g accepted", (double)bad[i]);
        cr_assert_str_eq(e.field, "prefer");
    }
    r.prefer_bonus = 1.0f;
    r.mask = NULL;
    cr_assert_lt(tlm_decoder_add(dec, &r, &e), 0);
    cr_assert_str_eq(e.field, "prefer");
    tlm_decoder_free(dec);
    tlm_model_free(m);
}
