/* Tensor language: vocabulary, number encoding, round trips, grammar masks. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/lang/lang.h"
#include "proto/workload.h"

static const char *workloads[] = {
    "{\"op\":\"dense\",\"shape\":{\"M\":1024,\"N\":1024,\"K\":1024},\"epilogue\":[\"bias_add\"]}",
    "{\"op\":\"batch_matmul\",\"shape\":{\"B\":12,\"M\":128,\"N\":128,\"K\":64},\"transpose_b\":true}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":56,\"W\":56,\"F\":64,\"KH\":3,\"KW\":3},"
    "\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":32,\"H\":17,\"W\":17,\"F\":64,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"groups\":4,\"layout\":\"NHWC\"}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":144,\"H\":56,\"W\":56,\"KH\":3,\"KW\":3},"
    "\"pad\":[1,1]}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":112,\"W\":112,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1]}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":9,\"W\":9,\"KH\":3,\"KW\":3}}",
    "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":2048,\"H\":7,\"W\":7}}",
    "{\"op\":\"softmax\",\"shape\":{\"R\":1536,\"C\":128}}",
    "{\"op\":\"layer_norm\",\"shape\":{\"R\":128,\"C\":768}}",
    "{\"op\":\"rms_norm\",\"shape\":{\"R\":32,\"C\":4096}}",
    "{\"op\":\"reduce_max\",\"shape\":{\"R\":100,\"C\":1000}}",
    "{\"op\":\"elementwise\",\"shape\":{\"N\":17179869184},\"epilogue\":[\"silu\",\"mul\"]}",
    "{\"op\":\"transpose\",\"shape\":{\"R\":768,\"C\":3072}}",
};
static const char *targets[] = {"cpu", "cpu:avx2", "cuda:sm_80", "cuda:sm_90"};
#define NW (sizeof workloads / sizeof workloads[0])
#define NT (sizeof targets / sizeof targets[0])

typedef struct {
    ir_subgraph g;
    space sp;
} fixture;

static fixture *make(const char *wl, const char *tg)
{
    fixture *f = malloc(sizeof *f);
    ir_workload w;
    tlm_error e;
    target t;
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &w, &e), 0, "%s", e.msg);
    cr_assert_eq(ir_subgraph_build(&w, &f->g, &e), 0, "%s", e.msg);
    cr_assert_eq(target_parse(tg, &t, &e), 0, "%s", e.msg);
    cr_assert_eq(space_build(&f->g, &t, &f->sp, &e), 0, "%s", e.msg);
    return f;
}

Test(lang, vocabulary_is_stable_and_names_are_unique)
{
    int n = lang_vocab_size();
    cr_assert_gt(n, LANG_SMALL + 64);
    for (int i = 0; i < n; i++) {
        const char *nm = lang_token_name(i);
        cr_assert_not_null(nm);
        cr_assert_eq(lang_token_id(nm), i, "duplicate or unknown name %s", nm);
    }
    cr_assert_null(lang_token_name(n));
    cr_assert_null(lang_token_name(-1));
    char h1[65], h2[65];
    lang_vocab_hash_hex(h1);
    lang_vocab_hash_hex(h2);
    cr_assert_str_eq(h1, h2);
    cr_assert_eq(strlen(h1), 64);
}

Test(lang, every_integer_is_representable)
{
    int64_t probes[] = {0, 1, 7, 4095, 4096, 4097, 65536, 1000003, INT64_C(1) << 34,
                        (INT64_C(1) << 36) - 1};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        int t[LANG_MAX_VALUE_TOKENS];
        int k = lang_encode_int(probes[i], t, LANG_MAX_VALUE_TOKENS);
        cr_assert(k == 1 || k == 1 + LANG_DIGITS);
        cr_assert_eq(k == 1, probes[i] < LANG_SMALL);
        int64_t v = 0;
        if (k == 1) {
            v = atoll(lang_token_name(t[0]) + 2);
        } else {
            cr_assert_eq(t[0], LANG_NUM);
            for (int d = 0; d < LANG_DIGITS; d++) v = v * 64 + atoll(lang_token_name(t[1 + d]) + 2);
        }
        cr_assert_eq(v, probes[i]);
    }
    int t[LANG_MAX_VALUE_TOKENS];
    cr_assert_lt(lang_encode_int(-1, t, LANG_MAX_VALUE_TOKENS), 0);
    cr_assert_lt(lang_encode_int(INT64_C(1) << 36, t, LANG_MAX_VALUE_TOKENS), 0);
    cr_assert_lt(lang_encode_int(5000, t, 3), 0);
}

Test(lang, prompt_differs_by_target_and_workload)
{
    fixture *a = make(workloads[0], "cpu"), *b = make(workloads[0], "cuda:sm_90"),
            *c = make(workloads[2], "cpu");
    int ta[512], tb[512], tc[512];
    int na = lang_encode_prompt(&a->sp, ta, 512), nb = lang_encode_prompt(&b->sp, tb, 512),
        nc = lang_encode_prompt(&c->sp, tc, 512);
    cr_assert_gt(na, 5);
    cr_assert_eq(ta[0], LANG_BOS);
    cr_assert_eq(ta[na - 1], LANG_SEP);
    cr_assert(na != nb || memcmp(ta, tb, sizeof(int) * (size_t)na));
    cr_assert(na != nc || memcmp(ta, tc, sizeof(int) * (size_t)na));
    cr_assert_lt(lang_encode_prompt(&a->sp, ta, 4), 0, "a short buffer is an error");
    free(a), free(b), free(c);
}

/* Every slot's value follows its hint, the rule of thumb's value given the decisions before
 * it (forced, so the grammar walks it too): the default's sentence has hint = value at every
 * slot, for every family and target; a schedule along another vector axis gets, from the
 * second slot on, the hints of that axis' default (space_default_vectorized). */
static void expect_hints(const space *sp, const space_sched *s, const space_sched *want_hints,
                         const char *what)
{
    int d[LANG_MAX_SENTENCE];
    int nd = lang_encode_decisions(sp, s, d, LANG_MAX_SENTENCE);
    cr_assert_gt(nd, 1, "%s", what);
    int at = 0;
    for (int i = 0; i < sp->n_slot; i++) {
        at++; /* the slot token */
        int h[LANG_MAX_VALUE_TOKENS], v[LANG_MAX_VALUE_TOKENS];
        int nh = lang_encode_int(want_hints->v[i], h, LANG_MAX_VALUE_TOKENS);
        int nv = lang_encode_int(s->v[i], v, LANG_MAX_VALUE_TOKENS);
        cr_assert_eq(memcmp(d + at, h, sizeof(int) * (size_t)nh), 0, "%s: slot %s's hint", what,
                     sp->slot[i].name);
        at += nh;
        cr_assert_eq(memcmp(d + at, v, sizeof(int) * (size_t)nv), 0, "%s: slot %s's value", what,
                     sp->slot[i].name);
        at += nv;
    }
    cr_assert_eq(at, nd - 1, "%s", what);
    cr_assert_eq(d[nd - 1], LANG_EOS);
    /* the grammar forces the slot and hint tokens, and the sentence decodes back */
    lang_state st;
    cr_assert_eq(lang_state_init(&st, sp), 0);
    uint64_t *bits = calloc(((size_t)lang_vocab_size() + 63) / 64, sizeof *bits);
    int forced = 0;
    for (int i = 0; i < nd; i++) {
        forced += lang_state_next(&st, bits) >= 0;
        cr_assert_eq(lang_state_push(&st, d[i]), 0, "%s: token %d", what, i);
    }
    cr_assert_geq(forced, 2 * sp->n_slot + 1, "%s: slots, hints and [EOS] are forced", what);
    free(bits);
    lang_state_free(&st);
    space_sched back;
    tlm_error e;
    cr_assert_eq(lang_decode_decisions(sp, d, nd, &back, &e), 0, "%s: %s", what, e.msg);
    cr_assert_eq(memcmp(back.v, s->v, sizeof(int64_t) * (size_t)sp->n_slot), 0, "%s", what);
}

Test(lang, every_value_follows_the_rule_of_thumbs_hint)
{
    for (size_t w = 0; w < NW; w++)
        for (size_t ti = 0; ti < NT; ti++) {
            fixture *f = make(workloads[w], targets[ti]);
            char what[256];
            snprintf(what, sizeof what, "%s on %s", workloads[w], targets[ti]);
            space_sched d;
            space_default(&f->sp, &d);
            expect_hints(&f->sp, &d, &d, what);
            if (f->sp.slot[0].kind == SLOT_VECTORIZE) {
                int64_t vals[SPACE_MAX_VALUES];
                space_sched none = {0};
                int n = space_legal_values(&f->sp, 0, &none, vals);
                for (int k = 0; k < n; k++) {
                    if (vals[k] == d.v[0] || vals[k] < 1) continue;
                    space_sched other;
                    space_default_vectorized(&f->sp, vals[k], &other);
                    if (other.v[0] != vals[k]) continue; /* no rule for this axis */
                    space_sched hints = other;
                    hints.v[0] = d.v[0]; /* the first hint is the plain default's */
                    expect_hints(&f->sp, &other, &hints, what);
                }
            }
            free(f);
        }
}

Test(lang, decisions_round_trip_for_every_family_and_target)
{
    uint64_t rng = 99;
    for (size_t wi = 0; wi < NW; wi++)
        for (size_t ti = 0; ti < NT; ti++) {
            fixture *f = make(workloads[wi], targets[ti]);
            for (int k = 0; k < 40; k++) {
                space_sched s, s2;
                if (k == 0) space_default(&f->sp, &s);
                else space_sample(&f->sp, &rng, &s);
                int toks[LANG_MAX_SENTENCE];
                int n = lang_encode_decisions(&f->sp, &s, toks, LANG_MAX_SENTENCE);
                cr_assert_gt(n, 0);
                cr_assert_eq(toks[n - 1], LANG_EOS);
                tlm_error e;
                cr_assert_eq(lang_decode_decisions(&f->sp, toks, n, &s2, &e), 0, "%s %s: %s: %s",
                             workloads[wi], targets[ti], e.field, e.msg);
                cr_assert_eq(memcmp(s.v, s2.v, sizeof(int64_t) * (size_t)f->sp.n_slot), 0);
            }
            free(f);
        }
}

/* Random choices inside the masks always give a schedule the space accepts. */
Test(lang, masked_random_walks_are_always_valid)
{
    uint64_t rng = 12345;
    uint64_t mask[(8192 + 63) / 64];
    int V = lang_vocab_size();
    for (size_t wi = 0; wi < NW; wi++)
        for (size_t ti = 0; ti < NT; ti++) {
            fixture *f = make(workloads[wi], targets[ti]);
            for (int k = 0; k < 20; k++) {
                lang_state st;
                cr_assert_eq(lang_state_init(&st, &f->sp), 0);
                int seq[LANG_MAX_SENTENCE], m = 0;
                for (;;) {
                    int tok = lang_state_next(&st, mask);
                    if (tok == -2) break;
                    if (tok == -1) {
                        int cand[8192], nc = 0;
                        for (int i = 0; i < V; i++)
                            if (mask[i / 64] >> (i % 64) & 1) cand[nc++] = i;
                        cr_assert_gt(nc, 1, "a mask with fewer than 2 tokens is a forced token");
                        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                        tok = cand[(rng >> 33) % (uint64_t)nc];
                    }
                    cr_assert_eq(lang_state_push(&st, tok), 0);
                    seq[m++] = tok;
                    cr_assert_lt(m, LANG_MAX_SENTENCE);
                }
                space_sched s;
                tlm_error e;
                cr_assert_eq(lang_decode_decisions(&f->sp, seq, m, &s, &e), 0, "%s", e.msg);
                lang_state_free(&st);
            }
            free(f);
        }
}

Test(lang, tokens_outside_the_grammar_are_refused)
{
    fixture *f = make(workloads[0], "cpu");
    lang_state st;
    uint64_t mask[(8192 + 63) / 64];
    cr_assert_eq(lang_state_init(&st, &f->sp), 0);
    int slot_tok = lang_state_next(&st, mask);
    cr_assert_geq(slot_tok, 0, "slot tokens are forced");
    cr_assert_neq(lang_state_push(&st, LANG_EOS), 0, "EOS before the decisions");
    cr_assert_eq(lang_state_push(&st, slot_tok), 0);
    /* the hint (the default vectorises j) is forced: nothing else is taken there */
    int hint = lang_state_next(&st, mask);
    cr_assert_eq(hint, lang_token_id("N_1"));
    cr_assert_neq(lang_state_push(&st, lang_token_id("N_2")), 0, "a hint is forced");
    cr_assert(!lang_state_in_value(&st));
    cr_assert_eq(lang_state_push(&st, hint), 0);
    cr_assert(lang_state_in_value(&st));
    /* vectorize takes 0 (scalar), 1 (j, the last axis) or 2 (i): dense has two spatial axes */
    cr_assert_neq(lang_state_push(&st, lang_token_id("N_3")), 0);
    cr_assert_eq(lang_state_push(&st, lang_token_id("N_1")), 0);
    cr_assert_eq(lang_state_push(&st, lang_state_next(&st, mask)), 0); /* slot tile.i.3 */
    cr_assert_eq(lang_state_push(&st, lang_state_next(&st, mask)), 0); /* its hint */
    /* tile.i.3 on 1024: 9 neither divides 1024 nor is on the padding ladder (space.h) */
    cr_assert_neq(lang_state_push(&st, lang_token_id("N_9")), 0);
    cr_assert_eq(lang_state_push(&st, lang_token_id("N_4")), 0);
    lang_state_free(&st);
    /* a truncated sentence and a wrong value are reported with the slot */
    space_sched s;
    space_default(&f->sp, &s);
    int toks[LANG_MAX_SENTENCE];
    int n = lang_encode_decisions(&f->sp, &s, toks, LANG_MAX_SENTENCE);
    tlm_error e;
    cr_assert_neq(lang_decode_decisions(&f->sp, toks, n - 3, &s, &e), 0);
    toks[2] = lang_token_id("N_3"); /* vectorize = 3 */
    cr_assert_neq(lang_decode_decisions(&f->sp, toks, n, &s, &e), 0);
    cr_assert_str_eq(e.field, f->sp.slot[0].name);
    toks[2] = toks[1];
    toks[1] = lang_token_id("N_2"); /* a hint other than the rule's */
    cr_assert_neq(lang_decode_decisions(&f->sp, toks, n, &s, &e), 0);
    cr_assert_str_eq(e.field, f->sp.slot[0].name);
    free(f);
}
