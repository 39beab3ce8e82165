/* Tests for compiler/tlm/decoder.c: greedy decoding against a reference loop that
 * recomputes the whole sequence without a cache for every token; batched decoding (mixed
 * prompt lengths, beams, requests joining and leaving mid-batch) against one request at a
 * time; forced tokens; beam search against brute-force enumeration; tie-breaking; and
 * every failure a request can hit. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tlm/tlm.h"

static const tlm_config CFG = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .n_ctx = 96, .vocab_size = 300};

static tlm_model *make_model(const tlm_config *cfg, uint64_t seed, float scale)
{
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_init_random(cfg, NULL, seed, &m, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] *= scale; /* peaked logits; LayerNorm gains scale too, harmlessly */
    return m;
}

/* ---- a configurable mask provider ---- */

typedef struct spec {
    int V;
    uint32_t salt;
    int density;     /* about 1/density of the vocabulary is allowed */
    int force_every; /* generated position g is forced when g % force_every == force_every-1 */
    int stop_mod;    /* stop after >= 2 generated tokens when the last one % stop_mod == 0 */
    int fail_at;     /* fail when asked at this sequence length */
    int empty_at;    /* allow nothing at this sequence length */
    int bad_force_at;
    int stop_at_start;
    int force_g1; /* if > 0: generated position force_g1 - 1 is forced to force_tok */
    int force_tok;
    const int32_t *fixed; /* if set: exactly these tokens are allowed everywhere */
    int n_fixed;
    int calls;
} spec;

static uint32_t mix(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

static int test_mask(void *user, const int32_t *tok, int n, int n_prompt, uint64_t *allowed,
                     int32_t *forced, tlm_error *err)
{
    spec *s = user;
    s->calls++;
    int g = n - n_prompt;
    if (s->stop_at_start) return TLM_MASK_STOP;
    if (s->stop_mod && g >= 2 && tok[n - 1] % s->stop_mod == 0) return TLM_MASK_STOP;
    if (s->fail_at && n == s->fail_at)
        return tlm_err_set(err, TLM_EINVAL, "test", "injected failure at %d", n);
    if (s->bad_force_at && n == s->bad_force_at) {
        *forced = s->V + 5;
        return TLM_MASK_NEXT;
    }
    if (s->empty_at && n == s->empty_at) return TLM_MASK_NEXT;
    if (s->force_g1 && g == s->force_g1 - 1) {
        *forced = s->force_tok;
        return TLM_MASK_NEXT;
    }
    if (s->force_every && g % s->force_every == s->force_every - 1) {
        *forced = (int32_t)(mix(s->salt ^ (uint32_t)n ^ (uint32_t)tok[n - 1] << 8) % s->V);
        return TLM_MASK_NEXT;
    }
    if (s->fixed) {
        for (int i = 0; i < s->n_fixed; i++)
            tlm_bitset_set(allowed, s->fixed[i]);
        return TLM_MASK_NEXT;
    }
    uint32_t h = mix(s->salt + (uint32_t)n * 31u + (uint32_t)tok[n - 1]);
    for (int t = 0; t < s->V; t++)
        if (mix(h ^ (uint32_t)t * 2654435761u) % (uint32_t)s->density == 0)
            tlm_bitset_set(allowed, t);
    tlm_bitset_set(allowed, (int32_t)(h % (uint32_t)s->V));
    return TLM_MASK_NEXT;
}

/* ---- reference: greedy with full recomputation, no cache reuse ---- */

static int ref_greedy(const tlm_model *m, const int32_t *prompt, int np, tlm_mask_fn fn, spec *sp,
                      int max_new, int32_t *out, double *score)
{
    const int V = m->cfg.vocab_size, W = (V + 63) / 64;
    int32_t tok[256];
    memcpy(tok, prompt, sizeof(int32_t) * np);
    int n = np;
    *score = 0;
    uint64_t mask[64];
    float *lg = malloc(sizeof(float) * V);
    tlm_workspace *ws = tlm_workspace_new();
    while (n - np < max_new) {
        memset(mask, 0, sizeof mask);
        int32_t forced = -1;
        if (fn) {
            tlm_error e = {0};
            int rc = fn(sp, tok, n, np, mask, &forced, &e);
            cr_assert_geq(rc, 0);
            if (rc == TLM_MASK_STOP) break;
        } else {
            for (int t = 0; t < V; t++)
                tlm_bitset_set(mask, t);
        }
        if (forced >= 0) {
            tok[n++] = forced;
            continue;
        }
        tlm_kv *kv;
        cr_assert_eq(tlm_kv_new(m, 0, &kv, NULL), 0);
        tlm_seq s = {.kv = kv, .tokens = tok, .n_tokens = n, .logits = lg};
        tlm_error err = {0};
        cr_assert_eq(tlm_forward_batch(m, ws, &s, 1, &err), 0, "%s", err.msg);
        tlm_kv_free(kv);
        int best = -1;
        float mx = -INFINITY;
        for (int t = 0; t < V; t++)
            if (tlm_bitset_get(mask, t)) {
                if (best < 0 || lg[t] > lg[best]) best = t;
                if (lg[t] > mx) mx = lg[t];
            }
        double sum = 0;
        for (int t = 0; t < V; t++)
            if (tlm_bitset_get(mask, t)) sum += exp((double)lg[t] - mx);
        *score += (double)lg[best] - (mx + log(sum));
        tok[n++] = best;
    }
    (void)W;
    free(lg);
    tlm_workspace_free(ws);
    memcpy(out, tok + np, sizeof(int32_t) * (n - np));
    return n - np;
}

/* ---- reference beam search: the contract's definition, recomputing everything ---- */

typedef struct rbeam {
    int32_t tok[128];
    int n;
    double score;
    uint64_t mask[8];
} rbeam;

typedef struct rcand {
    double score;
    int parent, token;
} rcand;

static int rcand_cmp(const void *pa, const void *pb)
{
    const rcand *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->parent != b->parent) return a->parent < b->parent ? -1 : 1;
    return (a->token > b->token) - (a->token < b->token);
}

/* Appends forced tokens; returns 1 when the beam is finished, 0 when it needs a choice. */
static int ref_resolve(rbeam *b, int np, int max_new, spec *sp, int V)
{
    for (;;) {
        if (b->n - np >= max_new) return 1;
        memset(b->mask, 0, sizeof b->mask);
        int32_t forced = -1;
        tlm_error e = {0};
        int rc = test_mask(sp, b->tok, b->n, np, b->mask, &forced, &e);
        cr_assert_geq(rc, 0);
        if (rc == TLM_MASK_STOP) return 1;
        if (forced < 0) return 0;
        cr_assert_lt(forced, V);
        b->tok[b->n++] = forced;
    }
}

/* Each active beam proposes its `width` best allowed tokens (by logit, ties to the lower
 * id); all proposals are ranked by (score, parent, token); they are taken in that order,
 * finished ones going to the result list (best first, earlier first on ties, at most
 * width), until width beams are active; a proposal no better than the worst of a full
 * result list ends the scan, and so does an active best no better than it. */
static int ref_beam(const tlm_model *m, const int32_t *prompt, int np, spec *sp, int max_new,
                    int width, rbeam *fin)
{
    const int V = m->cfg.vocab_size;
    rbeam *cur = calloc(width, sizeof(rbeam)), *nxt = calloc(width, sizeof(rbeam));
    rcand *c = calloc((size_t)width * width, sizeof(rcand));
    float *lg = malloc(sizeof(float) * V);
    tlm_workspace *ws = tlm_workspace_new();
    int n_cur = 1, n_fin = 0;
    memcpy(cur[0].tok, prompt, sizeof(int32_t) * np);
    cur[0].n = np;
#define ADD_FIN(bp)                                                                                \
    do {                                                                                           \
        int pos = n_fin;                                                                           \
        while (pos > 0 && fin[pos - 1].score < (bp)->score)                                        \
            pos--;                                                                                 \
        if (pos < width) {                                                                         \
            int last = n_fin < width ? n_fin : width - 1;                                          \
            memmove(&fin[pos + 1], &fin[pos], sizeof(rbeam) * (last - pos));                       \
            fin[pos] = *(bp);                                                                      \
            if (n_fin < width) n_fin++;                                                            \
        }                                                                                          \
    } while (0)
    if (ref_resolve(&cur[0], np, max_new, sp, V)) {
        ADD_FIN(&cur[0]);
        n_cur = 0;
    }
    while (n_cur > 0) {
        int nc = 0;
        for (int i = 0; i < n_cur; i++) {
            tlm_kv *kv;
            cr_assert_eq(tlm_kv_new(m, 0, &kv, NULL), 0);
            tlm_seq s = {.kv = kv, .tokens = cur[i].tok, .n_tokens = cur[i].n, .logits = lg};
            cr_assert_eq(tlm_forward_batch(m, ws, &s, 1, NULL), 0);
            tlm_kv_free(kv);
            float mx = -INFINITY;
            for (int t = 0; t < V; t++)
                if (tlm_bitset_get(cur[i].mask, t) && lg[t] > mx) mx = lg[t];
            double sum = 0;
            for (int t = 0; t < V; t++)
                if (tlm_bitset_get(cur[i].mask, t)) sum += exp((double)lg[t] - (double)mx);
            double lse = (double)mx + log(sum);
            /* this beam's width best tokens: repeated selection, simple and obviously right */
            unsigned char taken[512] = {0};
            for (int k = 0; k < width; k++) {
                int best = -1;
                for (int t = 0; t < V; t++)
                    if (tlm_bitset_get(cur[i].mask, t) && !taken[t] &&
                        (best < 0 || lg[t] > lg[best]))
                        best = t;
                if (best < 0) break;
                taken[best] = 1;
                c[nc++] = (rcand){cur[i].score + ((double)lg[best] - lse), i, best};
            }
        }
        qsort(c, nc, sizeof(rcand), rcand_cmp);
        int n_new = 0;
        for (int k = 0; k < nc && n_new < width; k++) {
            if (n_fin == width && c[k].score <= fin[width - 1].score) break;
            rbeam *b = &nxt[n_new];
            *b = cur[c[k].parent];
            b->tok[b->n++] = c[k].token;
            b->score = c[k].score;
            if (ref_resolve(b, np, max_new, sp, V))
                ADD_FIN(b);
            else
                n_new++;
        }
        if (n_new == 0 || (n_fin == width && nxt[0].score <= fin[width - 1].score)) break;
        rbeam *t = cur;
        cur = nxt;
        nxt = t;
        n_cur = n_new;
    }
#undef ADD_FIN
    free(cur);
    free(nxt);
    free(c);
    free(lg);
    tlm_workspace_free(ws);
    return n_fin;
}

/* ---- helpers ---- */

typedef struct job {
    int32_t prompt[64];
    int np, max_new, width;
    spec sp;
    int use_mask;
} job;

static tlm_request req_of(job *j)
{
    return (tlm_request){.prompt = j->prompt,
                         .n_prompt = j->np,
                         .mask = j->use_mask ? test_mask : NULL,
                         .user = &j->sp,
                         .max_new_tokens = j->max_new,
                         .beam_width = j->width};
}

typedef struct outcome {
    int n_results;
    int32_t tok[TLM_MAX_BEAM][96];
    int n[TLM_MAX_BEAM];
    double score[TLM_MAX_BEAM];
} outcome;

static void collect(tlm_decoder *d, int slot, outcome *o)
{
    cr_assert_eq(tlm_decoder_state(d, slot), TLM_SLOT_DONE);
    o->n_results = tlm_decoder_n_results(d, slot);
    for (int r = 0; r < o->n_results; r++) {
        const int32_t *t;
        tlm_error err = {0};
        cr_assert_eq(tlm_decoder_result(d, slot, r, &t, &o->n[r], &o->score[r], &err), 0, "%s",
                     err.msg);
        memcpy(o->tok[r], t, sizeof(int32_t) * o->n[r]);
    }
}

static void run_alone(const tlm_model *m, job *j, outcome *o)
{
    tlm_decoder *d;
    cr_assert_eq(tlm_decoder_new(m, 1, &d, NULL), 0);
    tlm_request r = req_of(j);
    tlm_error err = {0};
    int slot = tlm_decoder_add(d, &r, &err);
    cr_assert_geq(slot, 0, "%s", err.msg);
    cr_assert_eq(tlm_decoder_run(d, &err), 0, "%s", err.msg);
    collect(d, slot, o);
    tlm_decoder_free(d);
}

static void outcome_eq(const outcome *a, const outcome *b, const char *what, int i)
{
    cr_assert_eq(a->n_results, b->n_results, "%s %d: %d vs %d results", what, i, a->n_results,
                 b->n_results);
    for (int r = 0; r < a->n_results; r++) {
        cr_assert_eq(a->n[r], b->n[r], "%s %d rank %d: lengths %d vs %d", what, i, r, a->n[r],
                     b->n[r]);
        cr_assert_eq(memcmp(a->tok[r], b->tok[r], sizeof(int32_t) * a->n[r]), 0,
                     "%s %d rank %d: tokens differ", what, i, r);
        cr_assert_eq(a->score[r], b->score[r], "%s %d rank %d: score %.17g vs %.17g", what, i, r,
                     a->score[r], b->score[r]);
    }
}

static void make_jobs(job *jobs, int nj, int V)
{
    for (int i = 0; i < nj; i++) {
        job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->np = 1 + (int)(mix(100 + i) % 40);
        for (int k = 0; k < j->np; k++)
            j->prompt[k] = (int32_t)(mix(i * 1000 + k) % V);
        j->max_new = 5 + (int)(mix(200 + i) % 26);
        j->width = (i % 5 == 3) ? 3 : 1;
        j->use_mask = (i % 7 != 6);
        j->sp = (spec){.V = V,
                       .salt = mix(300 + i),
                       .density = 3 + i % 8,
                       .force_every = i % 3 == 0 ? 0 : 2 + i % 3,
                       .stop_mod = i % 4 == 1 ? 5 : 0};
    }
}

/* ---- tests ---- */

Test(decoder, greedy_matches_full_recompute)
{
    tlm_model *m = make_model(&CFG, 11, 5.0f);
    job jobs[8];
    make_jobs(jobs, 8, CFG.vocab_size);
    int forced_seen = 0, stopped_seen = 0;
    for (int i = 0; i < 8; i++) {
        job *j = &jobs[i];
        j->width = 1;
        outcome o;
        run_alone(m, j, &o);
        int32_t ref[96];
        double rs;
        int n = ref_greedy(m, j->prompt, j->np, j->use_mask ? test_mask : NULL, &j->sp, j->max_new,
                           ref, &rs);
        cr_assert_eq(o.n_results, 1);
        cr_assert_eq(o.n[0], n, "job %d: %d tokens, reference %d", i, o.n[0], n);
        cr_assert_eq(memcmp(o.tok[0], ref, sizeof(int32_t) * n), 0, "job %d: tokens differ", i);
        cr_assert_float_eq(o.score[0], rs, 1e-9 * (1 + fabs(rs)), "job %d: score", i);
        cr_assert_lt(o.score[0], 0.0);
        forced_seen += j->sp.force_every > 0;
        stopped_seen += n < j->max_new;
    }
    cr_assert_gt(forced_seen, 0);
    cr_assert_gt(stopped_seen, 0, "no job exercised the stop predicate");
    tlm_model_free(m);
}

/* Requests join while others run and leave as they finish; each one's tokens, results
 * and scores must be identical to decoding it alone. */
Test(decoder, batched_equals_one_at_a_time)
{
    tlm_model *m = make_model(&CFG, 12, 5.0f);
    enum { NJ = 16, SLOTS = 6 };
    job jobs[NJ];
    make_jobs(jobs, NJ, CFG.vocab_size);
    static outcome alone[NJ], batched[NJ];
    for (int i = 0; i < NJ; i++)
        run_alone(m, &jobs[i], &alone[i]);

    tlm_decoder *d;
    cr_assert_eq(tlm_decoder_new(m, SLOTS, &d, NULL), 0);
    int slot_job[SLOTS], next = 0, done = 0, max_active = 0, joined_mid = 0, step = 0;
    for (int s = 0; s < SLOTS; s++)
        slot_job[s] = -1;
    while (done < NJ) {
        /* admit at most two per step, and only every other step, so that requests join a
         * batch that is already decoding */
        int admitted = 0;
        while (next < NJ && admitted < 2 && step % 2 == 0) {
            tlm_request r = req_of(&jobs[next]);
            tlm_error err = {0};
            int slot = tlm_decoder_add(d, &r, &err);
            if (slot == TLM_ELIMIT) break;
            cr_assert_geq(slot, 0, "%s", err.msg);
            if (tlm_decoder_active(d) > 1) joined_mid++;
            slot_job[slot] = next++;
            admitted++;
        }
        if (tlm_decoder_active(d) > max_active) max_active = tlm_decoder_active(d);
        tlm_error err = {0};
        cr_assert_geq(tlm_decoder_step(d, &err), 0, "%s", err.msg);
        step++;
        for (int s = 0; s < SLOTS; s++) {
            if (slot_job[s] < 0 || tlm_decoder_state(d, s) == TLM_SLOT_ACTIVE) continue;
            collect(d, s, &batched[slot_job[s]]);
            tlm_decoder_release(d, s);
            slot_job[s] = -1;
            done++;
        }
        cr_assert_lt(step, 1000);
    }
    cr_assert_geq(max_active, 4, "the batch never held more than %d requests", max_active);
    cr_assert_geq(joined_mid, 5);
    for (int i = 0; i < NJ; i++)
        outcome_eq(&batched[i], &alone[i], "job", i);
    int beams = 0;
    for (int i = 0; i < NJ; i++)
        beams += alone[i].n_results > 1;
    cr_assert_gt(beams, 0, "no beam request produced several results");
    tlm_decoder_free(d);
    tlm_model_free(m);
}

Test(decoder, forced_tokens_cost_no_step)
{
    tlm_model *m = make_model(&CFG, 13, 5.0f);
    job j = {0};
    j.np = 4;
    for (int i = 0; i < 4; i++)
        j.prompt[i] = 10 + i;
    j.max_new = 21;
    j.width = 1;
    j.use_mask = 1;
    j.sp = (spec){.V = CFG.vocab_size, .salt = 5, .density = 4, .force_every = 2};
    tlm_decoder *d;
    cr_assert_eq(tlm_decoder_new(m, 2, &d, NULL), 0);
    tlm_request r = req_of(&j);
    int slot = tlm_decoder_add(d, &r, NULL);
    cr_assert_geq(slot, 0);
    int steps = 0;
    tlm_error err = {0};
    while (tlm_decoder_step(d, &err) > 0)
        steps++;
    steps++;
    outcome o;
    collect(d, slot, &o);
    int32_t ref[96];
    double rs;
    int n = ref_greedy(m, j.prompt, j.np, test_mask, &j.sp, j.max_new, ref, &rs);
    cr_assert_eq(o.n[0], 21);
    cr_assert_eq(n, 21);
    cr_assert_eq(memcmp(o.tok[0], ref, sizeof ref[0] * n), 0);
    /* 11 chosen (g even), 10 forced: one forward step per chosen token */
    cr_assert_eq(steps, 11, "%d steps for 11 chosen tokens", steps);
    tlm_decoder_free(d);
    tlm_model_free(m);
}

static int cmp_score_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* With as many beams as there are possible continuations, beam search is exhaustive: its
 * results must be every continuation, ranked by their true scores (computed here from a
 * full forward of each complete sequence). Forced positions score 0. */
Test(decoder, beam_search_exhaustive_matches_bruteforce)
{
    const tlm_config tiny = {.n_layer = 1, .n_head = 2, .n_embd = 16, .n_ctx = 16, .vocab_size = 8};
    tlm_model *m = make_model(&tiny, 21, 20.0f);
    const int32_t allowed[4] = {1, 3, 4, 6};
    job j = {0};
    j.np = 3;
    j.prompt[0] = 2;
    j.prompt[1] = 7;
    j.prompt[2] = 0;
    j.max_new = 4; /* g = 0, 2, 3 chosen; g = 1 forced */
    j.width = 64;
    j.use_mask = 1;
    j.sp = (spec){.V = 8, .fixed = allowed, .n_fixed = 4, .force_g1 = 2, .force_tok = 5};
    outcome o;
    tlm_decoder *d;
    cr_assert_eq(tlm_decoder_new(m, 1, &d, NULL), 0);
    tlm_request r = req_of(&j);
    int slot = tlm_decoder_add(d, &r, NULL);
    cr_assert_geq(slot, 0);
    tlm_error err = {0};
    cr_assert_eq(tlm_decoder_run(d, &err), 0, "%s", err.msg);
    collect(d, slot, &o);
    cr_assert_eq(o.n_results, 64);

    /* brute force: score all 64 continuations from full forwards */
    double truth[64];
    tlm_workspace *ws = tlm_workspace_new();
    for (int c = 0; c < 64; c++) {
        int32_t seq[7] = {2, 7, 0, allowed[c % 4], 5, allowed[(c / 4) % 4], allowed[c / 16]};
        float lg[7 * 8];
        tlm_kv *kv;
        cr_assert_eq(tlm_kv_new(m, 0, &kv, NULL), 0);
        tlm_seq s = {.kv = kv, .tokens = seq, .n_tokens = 7, .logits = lg, .all_logits = 1};
        cr_assert_eq(tlm_forward_batch(m, ws, &s, 1, NULL), 0);
        tlm_kv_free(kv);
        double sc = 0;
        for (int pos = 3; pos < 7; pos++) {
            if (pos == 4) continue; /* forced */
            const float *l = lg + (pos - 1) * 8;
            double mx = -INFINITY, sum = 0;
            for (int a = 0; a < 4; a++)
                mx = fmax(mx, l[allowed[a]]);
            for (int a = 0; a < 4; a++)
                sum += exp(l[allowed[a]] - mx);
            sc += l[seq[pos]] - (mx + log(sum));
        }
        truth[c] = sc;
        /* find this continuation among the beam results */
        int found = -1;
        for (int rr = 0; rr < 64 && found < 0; rr++)
            if (o.n[rr] == 4 && memcmp(o.tok[rr], seq + 3, sizeof(int32_t) * 4) == 0) found = rr;
        cr_assert_geq(found, 0, "continuation %d missing from the beam results", c);
        cr_assert_float_eq(o.score[found], sc, 1e-9, "continuation %d: %.12g vs %.12g", c,
                           o.score[found], sc);
    }
    qsort(truth, 64, sizeof(double), cmp_score_desc);
    for (int rr = 0; rr < 64; rr++)
        cr_assert_float_eq(o.score[rr], truth[rr], 1e-9, "rank %d out of order", rr);
    cr_assert_gt(truth[0] - truth[63], 1.0, "scores too flat to test ranking");
    tlm_decoder_release(d, slot);

    /* a narrow beam: sorted, distinct, scores true, best no worse than greedy here */
    j.width = 4;
    r = req_of(&j);
    slot = tlm_decoder_add(d, &r, NULL);
    cr_assert_eq(tlm_decoder_run(d, &err), 0);
    outcome o4;
    collect(d, slot, &o4);
    cr_assert_eq(o4.n_results, 4);
    for (int rr = 0; rr < 4; rr++) {
        if (rr) cr_assert_geq(o4.score[rr - 1], o4.score[rr]);
        for (int q = 0; q < rr; q++)
            cr_assert_neq(memcmp(o4.tok[q], o4.tok[rr], sizeof(int32_t) * 4), 0);
    }
    cr_assert_float_eq(o4.score[0], truth[0], 1e-9, "4 beams missed the best (%g vs %g)",
                       o4.score[0], truth[0]);
    tlm_decoder_release(d, slot);

    /* width 1 is greedy */
    j.width = 1;
    r = req_of(&j);
    slot = tlm_decoder_add(d, &r, NULL);
    cr_assert_eq(tlm_decoder_run(d, &err), 0);
    outcome o1;
    collect(d, slot, &o1);
    int32_t ref[8];
    double rs;
    int n = ref_greedy(m, j.prompt, j.np, test_mask, &j.sp, j.max_new, ref, &rs);
    cr_assert_eq(n, o1.n[0]);
    cr_assert_eq(memcmp(ref, o1.tok[0], sizeof(int32_t) * n), 0);
    tlm_workspace_free(ws);
    tlm_decoder_free(d);
    tlm_model_free(m);
}

/* Narrow beams (pruning matters) with random masks, forced tokens and stops, against the
 * reference beam search above. */
Test(decoder, beam_search_matches_reference)
{
    tlm_model *m = make_model(&CFG, 15, 5.0f);
    job jobs[6];
    make_jobs(jobs, 6, CFG.vocab_size);
    int pruned = 0;
    static rbeam fin[8];
    for (int i = 0; i < 6; i++) {
        job *j = &jobs[i];
        j->use_mask = 1;
        j->width = 2 + i % 4;
        j->max_new = 6 + i;
        j->sp.density = 2 + i % 3; /* many allowed tokens: more proposals than beams */
        outcome o;
        run_alone(m, j, &o);
        int nf = ref_beam(m, j->prompt, j->np, &j->sp, j->max_new, j->width, fin);
        cr_assert_eq(o.n_results, nf, "job %d: %d results, reference %d", i, o.n_results, nf);
        for (int r = 0; r < nf; r++) {
            cr_assert_eq(o.n[r], fin[r].n - j->np, "job %d rank %d: length", i, r);
            cr_assert_eq(memcmp(o.tok[r], fin[r].tok + j->np, sizeof(int32_t) * o.n[r]), 0,
                         "job %d rank %d: tokens differ", i, r);
            cr_assert_float_eq(o.score[r], fin[r].score, 1e-12, "job %d rank %d: score", i, r);
            if (r) cr_assert_geq(o.score[r - 1], o.score[r]);
        }
        pruned += nf == j->width;
    }
    cr_assert_gt(pruned, 2);
    tlm_model_free(m);
}

Test(decoder, ties_go_to_lowest_token)
{
    tlm_model *m;
    cr_assert_eq(tlm_model_new(&CFG, NULL, &m, NULL), 0); /* all zero: every logit equal */
    const int32_t allowed[3] = {70, 9, 5};
    job j = {0};
    j.np = 2;
    j.prompt[0] = 1;
    j.prompt[1] = 2;
    j.max_new = 6;
    j.use_mask = 1;
    j.sp = (spec){.V = CFG.vocab_size, .fixed = allowed, .n_fixed = 3};
    outcome o;
    run_alone(m, &j, &o);
    cr_assert_eq(o.n[0], 6);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(o.tok[0][i], 5);
    cr_assert_float_eq(o.score[0], -6 * log(3.0), 1e-9);
    tlm_model_free(m);
}

Test(decoder, failures_are_per_request)
{
    tlm_model *m = make_model(&CFG, 14, 5.0f);
    tlm_decoder *d;
    cr_assert_eq(tlm_decoder_new(m, 3, &d, NULL), 0);
    job good = {0}, bad = {0};
    make_jobs(&good, 1, CFG.vocab_size);
    good.width = 1;
    bad = good;
    tlm_error err = {0};

    /* the mask fails right after the prompt: add refuses, the slot stays free */
    bad.sp.fail_at = bad.np;
    tlm_request r = req_of(&bad);
    cr_assert_eq(tlm_decoder_add(d, &r, &err), TLM_EINVAL);
    cr_assert_not_null(strstr(err.msg, "injected failure"), "%s", err.msg);
    cr_assert_eq(tlm_decoder_active(d), 0);

    /* failures later on: the failing request alone is FAILED */
    int kinds[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
    const char *want[3] = {"injected failure", "allowed no token", "forced token"};
    outcome alone;
    run_alone(m, &good, &alone);
    cr_assert_gt(alone.n[0], 3);
    for (int k = 0; k < 3; k++) {
        bad = good;
        bad.sp.force_every = 0;
        int at = bad.np + 2;
        bad.sp.fail_at = kinds[k][0] ? at : 0;
        bad.sp.empty_at = kinds[k][1] ? at : 0;
        bad.sp.bad_force_at = kinds[k][2] ? at : 0;
        tlm_request rb = req_of(&bad), rg = req_of(&good);
        int sb = tlm_decoder_add(d, &rb, &err);
        int sg = tlm_decoder_add(d, &rg, &err);
        cr_assert_geq(sb, 0);
        cr_assert_geq(sg, 0);
        cr_assert_eq(tlm_decoder_run(d, &err), 0, "%s", err.msg);
        cr_assert_eq(tlm_decoder_state(d, sb), TLM_SLOT_FAILED);
        tlm_error e = {0};
        cr_assert_lt(tlm_decoder_result(d, sb, 0, NULL, NULL, NULL, &e), 0);
        cr_assert_not_null(strstr(e.msg, want[k]), "kind %d: %s", k, e.msg);
        cr_assert_eq(tlm_decoder_n_results(d, sb), 0);
        outcome og;
        collect(d, sg, &og);
        outcome_eq(&og, &alone, "survivor", k);
        tlm_decoder_release(d, sb);
        tlm_decoder_release(d, sg);
    }

    /* a mask that stops at once: DONE at add, no tokens, no step needed */
    bad = good;
    bad.sp.stop_at_start = 1;
    r = req_of(&bad);
    int s0 = tlm_decoder_add(d, &r, &err);
    cr_assert_geq(s0, 0);
    cr_assert_eq(tlm_decoder_state(d, s0), TLM_SLOT_DONE);
    cr_assert_eq(tlm_decoder_active(d), 0);
    outcome o0;
    collect(d, s0, &o0);
    cr_assert_eq(o0.n_results, 1);
    cr_assert_eq(o0.n[0], 0);

    /* slots full */
    r = req_of(&good);
    int s1 = tlm_decoder_add(d, &r, &err), s2 = tlm_decoder_add(d, &r, &err);
    cr_assert_geq(s1, 0);
    cr_assert_geq(s2, 0);
    cr_assert_eq(tlm_decoder_add(d, &r, &err), TLM_ELIMIT);
    cr_assert_not_null(strstr(err.msg, "busy"));
    /* releasing an active slot cancels it */
    tlm_decoder_release(d, s1);
    cr_assert_eq(tlm_decoder_active(d), 1);
    cr_assert_eq(tlm_decoder_state(d, s1), TLM_SLOT_FREE);
    tlm_error e2 = {0};
    cr_assert_lt(tlm_decoder_result(d, s2, 0, NULL, NULL, NULL, &e2), 0); /* still active */
    cr_assert_eq(tlm_decoder_run(d, &err), 0);
    outcome o2;
    collect(d, s2, &o2);
    outcome_eq(&o2, &alone, "after cancel", 0);

    /* bad requests */
    int32_t toks[2] = {1, 300};
    tlm_request bads[] = {
        {.prompt = toks, .n_prompt = 0, .max_new_tokens = 4},
        {.prompt = toks, .n_prompt = 1, .max_new_tokens = 0},
        {.prompt = toks, .n_prompt = 1, .max_new_tokens = 96},
        {.prompt = toks, .n_prompt = 2, .max_new_tokens = 4},
        {.prompt = toks, .n_prompt = 1, .max_new_tokens = 4, .beam_width = TLM_MAX_BEAM + 1},
    };
    const char *fields[] = {"n_prompt", "max_new_tokens", "max_new_tokens", "prompt", "beam_width"};
    tlm_decoder_release(d, s0);
    tlm_decoder_release(d, s2);
    for (size_t i = 0; i < sizeof bads / sizeof bads[0]; i++) {
        cr_assert_lt(tlm_decoder_add(d, &bads[i], &err), 0, "bad request %zu accepted", i);
        cr_assert_str_eq(err.field, fields[i], "request %zu: %s", i, err.msg);
    }
    tlm_request edge = {.prompt = toks, .n_prompt = 1, .max_new_tokens = 95};
    int se = tlm_decoder_add(d, &edge, &err);
    cr_assert_geq(se, 0, "%s", err.msg);
    tlm_decoder_free(d); /* frees an active request too */
    tlm_model_free(m);
}
