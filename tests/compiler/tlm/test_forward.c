/* Tests for compiler/tlm/forward.c: logits against an independent numpy GPT-2
 * (tests/compiler/tlm/gpt2_ref.py, run with Debian's /usr/bin/python3), KV-cached
 * incremental forward against full recomputation and batch invariance (bitwise), each under
 * every matrix-product path this CPU runs (scalar, AVX2, AVX-512: an AVX-512 host tests the
 * AVX2 path too), logits bitwise equal across those paths, a workspace reused across models,
 * and refusals that leave the caches untouched. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/tlm/internal.h"
#include "compiler/tlm/tlm.h"

#define PY "/usr/bin/python3"

static const tlm_config CFG = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .n_ctx = 64, .vocab_size = 97};

static uint64_t rng = 88172645463325252ULL;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void perturb(float *p, size_t n, float base, float amp)
{
    for (size_t i = 0; i < n; i++)
        p[i] = base + amp * (float)(2 * urand() - 1);
}

/* A random model with every tensor non-trivial: LayerNorm gains and all biases random,
 * matrices 5x the GPT-2 scale so attention is peaked and GELU is far from linear. */
static tlm_model *test_model(uint64_t seed)
{
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_init_random(&CFG, NULL, seed, &m, &err), 0, "%s", err.msg);
    size_t C = (size_t)CFG.n_embd;
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] *= 5.0f;
    for (int l = 0; l < CFG.n_layer; l++) {
        tlm_layer *ly = &m->layers[l];
        perturb(ly->ln1_w, C, 1.0f, 0.3f);
        perturb(ly->ln1_b, C, 0.0f, 0.2f);
        perturb(ly->qkv_b, 3 * C, 0.0f, 0.2f);
        perturb(ly->attn_proj_b, C, 0.0f, 0.2f);
        perturb(ly->ln2_w, C, 1.0f, 0.3f);
        perturb(ly->ln2_b, C, 0.0f, 0.2f);
        perturb(ly->fc_b, 4 * C, 0.0f, 0.5f);
        perturb(ly->fc_proj_b, C, 0.0f, 0.2f);
    }
    perturb(m->lnf_w, C, 1.0f, 0.3f);
    perturb(m->lnf_b, C, 0.0f, 0.2f);
    return m;
}

static void random_tokens(int32_t *t, int n, int V)
{
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(urand() * V);
}

static tlm_kv *kv_new(const tlm_model *m, int cap)
{
    tlm_kv *kv;
    tlm_error err = {0};
    cr_assert_eq(tlm_kv_new(m, cap, &kv, &err), 0, "%s", err.msg);
    return kv;
}

static void forward1(const tlm_model *m, tlm_workspace *ws, tlm_kv *kv, const int32_t *tok, int n,
                     float *logits, int all)
{
    tlm_seq s = {.kv = kv, .tokens = tok, .n_tokens = n, .logits = logits, .all_logits = all};
    tlm_error err = {0};
    cr_assert_eq(tlm_forward_batch(m, ws, &s, 1, &err), 0, "%s", err.msg);
}

static int have_numpy(void)
{
    if (access(PY, X_OK) != 0) return 0;
    return system(PY " -c 'import numpy' >/dev/null 2>&1") == 0;
}

Test(forward, matches_numpy_reference)
{
    if (!have_numpy()) cr_skip_test("%s with numpy not available (apt install python3-numpy)", PY);
    const char *root = getenv("TLM_ROOT");
    char script[512];
    snprintf(script, sizeof script, "%s/tests/compiler/tlm/gpt2_ref.py", root ? root : ".");
    cr_assert_eq(access(script, R_OK), 0, "reference script %s not found", script);

    char dir[] = "/tmp/tlm-fwd-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char wpath[600], opath[600];
    snprintf(wpath, sizeof wpath, "%s/m.bin", dir);
    snprintf(opath, sizeof opath, "%s/ref.bin", dir);
    tlm_model *m = test_model(3);
    tlm_error err = {0};
    cr_assert_eq(tlm_model_save(m, wpath, &err), 0, "%s", err.msg);
    tlm_workspace *ws = tlm_workspace_new();
    const int V = CFG.vocab_size;

    int lengths[] = {1, 5, 17, 40, 64};
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        int T = lengths[li];
        int32_t tok[64];
        random_tokens(tok, T, V);
        char *cmd = malloc(2048 + 8 * T);
        int o = snprintf(cmd, 2048, PY " %s %s %s", script, wpath, opath);
        for (int i = 0; i < T; i++)
            o += sprintf(cmd + o, " %d", tok[i]);
        cr_assert_eq(system(cmd), 0, "reference failed: %s", cmd);
        free(cmd);
        double *ref = malloc(sizeof(double) * T * V);
        FILE *f = fopen(opath, "rb");
        cr_assert_not_null(f);
        cr_assert_eq(fread(ref, sizeof(double), (size_t)T * V, f), (size_t)T * V);
        fclose(f);

        tlm_kv *kv = kv_new(m, 0);
        float *lg = malloc(sizeof(float) * T * V);
        forward1(m, ws, kv, tok, T, lg, 1);
        double worst = 0;
        for (int t = 0; t < T; t++) {
            double scale = 0, d = 0;
            for (int v = 0; v < V; v++) {
                scale = fmax(scale, fabs(ref[(size_t)t * V + v]));
                d = fmax(d, fabs(lg[(size_t)t * V + v] - ref[(size_t)t * V + v]));
            }
            cr_assert_gt(scale, 0.5, "degenerate reference logits (max %g)", scale);
            worst = fmax(worst, d / scale);
        }
        cr_assert_lt(worst, 1e-4, "T=%d: max relative logit error %g", T, worst);
        /* the logits are not trivially close: positions differ */
        if (T > 1) cr_assert_gt(fabs(ref[0] - ref[(size_t)(T - 1) * V]), 1e-3);
        free(lg);
        free(ref);
        tlm_kv_free(kv);
    }
    tlm_workspace_free(ws);
    tlm_model_free(m);
    char rm[64];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    cr_assert_eq(system(rm), 0);
}

/* Selects a matrix-product path for the rest of the test, or skips the test. */
static void use_isa(tlm_gemm_isa_t isa)
{
    if (!tlm_gemm_isa_supported(isa))
        cr_skip_test("this CPU cannot run the %s path", tlm_gemm_isa_name(isa));
    cr_assert_eq(tlm_gemm_set_isa(isa), 0);
}

/* One test per path for a body: NAME_scalar, NAME_avx2, NAME_avx512. */
#define TEST_EACH_ISA(NAME)                                                                        \
    Test(forward, NAME##_scalar)                                                                   \
    {                                                                                              \
        use_isa(TLM_GEMM_SCALAR);                                                                  \
        NAME();                                                                                    \
    }                                                                                              \
    Test(forward, NAME##_avx2)                                                                     \
    {                                                                                              \
        use_isa(TLM_GEMM_AVX2);                                                                    \
        NAME();                                                                                    \
    }                                                                                              \
    Test(forward, NAME##_avx512)                                                                   \
    {                                                                                              \
        use_isa(TLM_GEMM_AVX512);                                                                  \
        NAME();                                                                                    \
    }

static void incremental_equals_full_recompute(void)
{
    tlm_model *m = test_model(5);
    tlm_workspace *ws = tlm_workspace_new();
    const int V = CFG.vocab_size, T = 40;
    int32_t tok[40];
    random_tokens(tok, T, V);
    float *full = malloc(sizeof(float) * T * V), *inc = malloc(sizeof(float) * T * V);
    tlm_kv *kf = kv_new(m, 0);
    forward1(m, ws, kf, tok, T, full, 1);
    cr_assert_eq(kf->len, T);

    /* one token at a time */
    tlm_kv *ki = kv_new(m, T);
    for (int t = 0; t < T; t++)
        forward1(m, ws, ki, tok + t, 1, inc + (size_t)t * V, 0);
    cr_assert_eq(memcmp(full, inc, sizeof(float) * T * V), 0, "one-at-a-time logits differ");

    /* uneven chunks, last-position logits only */
    tlm_kv *kc = kv_new(m, T);
    int chunks[] = {7, 1, 13, 19}, at = 0;
    for (size_t c = 0; c < 4; c++) {
        float lg[97];
        forward1(m, ws, kc, tok + at, chunks[c], lg, 0);
        at += chunks[c];
        cr_assert_eq(memcmp(lg, full + (size_t)(at - 1) * V, sizeof lg), 0, "chunk %zu", c);
    }
    /* caches hold the same keys and values whichever way they were filled */
    for (int l = 0; l < CFG.n_layer; l++) {
        size_t C = (size_t)CFG.n_embd, n = (size_t)T * C;
        cr_assert_eq(memcmp(kf->k + l * kf->capacity * C, ki->k + l * ki->capacity * C, n * 4), 0);
        cr_assert_eq(memcmp(kf->v + l * kf->capacity * C, kc->v + l * kc->capacity * C, n * 4), 0);
    }
    /* and the cache matters: a different prefix gives different logits */
    tlm_kv *kd = kv_new(m, T);
    int32_t other[40];
    memcpy(other, tok, sizeof other);
    other[0] = (other[0] + 1) % V;
    float lg[97];
    forward1(m, ws, kd, other, T, lg, 0);
    cr_assert_neq(memcmp(lg, full + (size_t)(T - 1) * V, sizeof lg), 0);

    /* copying a cache continues identically */
    tlm_kv *kx = kv_new(m, T), *ky = kv_new(m, T);
    forward1(m, ws, kx, tok, 20, NULL, 0);
    tlm_error err = {0};
    cr_assert_eq(tlm_kv_copy(ky, kx, &err), 0, "%s", err.msg);
    forward1(m, ws, ky, tok + 20, 20, lg, 0);
    cr_assert_eq(memcmp(lg, full + (size_t)(T - 1) * V, sizeof lg), 0);

    tlm_kv_free(kf);
    tlm_kv_free(ki);
    tlm_kv_free(kc);
    tlm_kv_free(kd);
    tlm_kv_free(kx);
    tlm_kv_free(ky);
    free(full);
    free(inc);
    tlm_workspace_free(ws);
    tlm_model_free(m);
}
TEST_EACH_ISA(incremental_equals_full_recompute)

/* Each sequence alone, then all of them in one call, in two orders and with different
 * chunking: the logits must be bitwise identical (register tiles crossed in every way). */
static void batch_invariant_bitwise(void)
{
    tlm_model *m = test_model(9);
    tlm_workspace *ws = tlm_workspace_new();
    const int V = CFG.vocab_size;
    enum { NS = 9 };
    int prefix[NS] = {0, 3, 15, 16, 1, 30, 7, 0, 22};
    int fresh[NS] = {1, 1, 17, 1, 33, 2, 16, 15, 1};
    int32_t tok[NS][64];
    for (int s = 0; s < NS; s++)
        random_tokens(tok[s], prefix[s] + fresh[s], V);

    float alone[NS][97];
    for (int s = 0; s < NS; s++) {
        tlm_kv *kv = kv_new(m, 0);
        if (prefix[s]) forward1(m, ws, kv, tok[s], prefix[s], NULL, 0);
        forward1(m, ws, kv, tok[s] + prefix[s], fresh[s], alone[s], 0);
        tlm_kv_free(kv);
    }
    int orders[2][NS] = {{0, 1, 2, 3, 4, 5, 6, 7, 8}, {8, 6, 4, 2, 0, 7, 5, 3, 1}};
    for (int o = 0; o < 2; o++) {
        for (int nb = 1; nb <= NS; nb += (o ? 3 : 1)) {
            tlm_kv *kv[NS];
            tlm_seq seqs[NS];
            float out[NS][97];
            for (int i = 0; i < nb; i++) {
                int s = orders[o][i];
                kv[i] = kv_new(m, 0);
                if (prefix[s]) forward1(m, ws, kv[i], tok[s], prefix[s], NULL, 0);
                seqs[i] = (tlm_seq){.kv = kv[i],
                                    .tokens = tok[s] + prefix[s],
                                    .n_tokens = fresh[s],
                                    .logits = out[i]};
            }
            tlm_error err = {0};
            cr_assert_eq(tlm_forward_batch(m, ws, seqs, nb, &err), 0, "%s", err.msg);
            for (int i = 0; i < nb; i++) {
                int s = orders[o][i];
                cr_assert_eq(memcmp(out[i], alone[s], sizeof alone[s]), 0,
                             "order %d, batch of %d: sequence %d differs from alone", o, nb, s);
                cr_assert_eq(kv[i]->len, prefix[s] + fresh[s]);
                tlm_kv_free(kv[i]);
            }
        }
    }
    tlm_workspace_free(ws);
    tlm_model_free(m);
}
TEST_EACH_ISA(batch_invariant_bitwise)

/* A mixed batch (prefill and decode rows, all logits) under each path the CPU runs: the
 * logits and the caches are the same bits on every path, so hosts with different vector
 * units decode the same tokens. */
Test(forward, logits_identical_across_isas)
{
    tlm_model *m = test_model(12);
    const int V = CFG.vocab_size;
    enum { NS = 4 };
    int n[NS] = {1, 23, 2, 40};
    static int32_t tok[NS][64];
    static float out[3][NS][64 * 97];
    static float kcache[3][NS][2 * 64 * 64];
    for (int s = 0; s < NS; s++)
        random_tokens(tok[s], n[s], V);
    const tlm_gemm_isa_t isas[3] = {TLM_GEMM_SCALAR, TLM_GEMM_AVX2, TLM_GEMM_AVX512};
    int ran[3] = {0};
    for (int i = 0; i < 3; i++) {
        if (!tlm_gemm_isa_supported(isas[i])) continue;
        cr_assert_eq(tlm_gemm_set_isa(isas[i]), 0);
        tlm_workspace *ws = tlm_workspace_new();
        tlm_kv *kv[NS];
        tlm_seq seqs[NS];
        for (int s = 0; s < NS; s++) {
            kv[s] = kv_new(m, 0);
            if (s == 2) forward1(m, ws, kv[s], tok[s] + 40, 10, NULL, 0); /* a prefix first */
            seqs[s] = (tlm_seq){kv[s], tok[s], n[s], out[i][s], 1};
        }
        tlm_error err = {0};
        cr_assert_eq(tlm_forward_batch(m, ws, seqs, NS, &err), 0, "%s", err.msg);
        for (int s = 0; s < NS; s++) {
            memcpy(kcache[i][s], kv[s]->k, sizeof(float) * (size_t)kv[s]->len * CFG.n_embd);
            tlm_kv_free(kv[s]);
        }
        tlm_workspace_free(ws);
        ran[i] = 1;
    }
    cr_assert(ran[0], "the scalar path always runs");
    for (int i = 1; i < 3; i++) {
        if (!ran[i]) continue;
        cr_assert_eq(memcmp(out[i], out[0], sizeof out[0]), 0, "%s logits differ from scalar",
                     tlm_gemm_isa_name(isas[i]));
        cr_assert_eq(memcmp(kcache[i], kcache[0], sizeof kcache[0]), 0,
                     "%s keys differ from scalar", tlm_gemm_isa_name(isas[i]));
    }
    if (ran[1] && ran[2])
        cr_assert_eq(memcmp(out[1], out[2], sizeof out[1]), 0, "avx2 and avx512 logits differ");
    /* not vacuous: the logits vary */
    cr_assert_neq(memcmp(out[0][0], out[0][1], sizeof(float) * V), 0);
    tlm_model_free(m);
}

/* A workspace keeps the lm head of the last model it ran. Another model (including one that
 * reuses the freed model's memory) must get its own: logits equal a fresh workspace's. */
Test(forward, workspace_reused_across_models)
{
    const int V = CFG.vocab_size;
    int32_t tok[6] = {1, 5, 9, 2, 60, 7};
    float a[97], b[97];
    tlm_workspace *ws = tlm_workspace_new();
    for (uint64_t seed = 20; seed < 26; seed++) {
        tlm_model *m = test_model(seed);
        tlm_workspace *fresh = tlm_workspace_new();
        tlm_kv *k1 = kv_new(m, 0), *k2 = kv_new(m, 0);
        forward1(m, ws, k1, tok, 6, a, 0);
        forward1(m, fresh, k2, tok, 6, b, 0);
        cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "seed %d: stale lm head", (int)seed);
        /* and the cached copy serves the next call of the same model */
        forward1(m, ws, k1, tok, 1, a, 0);
        forward1(m, fresh, k2, tok, 1, b, 0);
        cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0);
        tlm_kv_free(k1);
        tlm_kv_free(k2);
        tlm_workspace_free(fresh);
        tlm_model_free(m); /* the next model may land at the same addresses */
    }
    /* What a successor at the same addresses looks like (the sanitizer's allocator never
     * reuses them quickly): same model and weight pointers, other weights. */
    tlm_model *m = test_model(30), *other = test_model(31);
    tlm_kv *k1 = kv_new(m, 0), *k2 = kv_new(m, 0);
    forward1(m, ws, k1, tok, 6, a, 0);
    memcpy(m->params, other->params, sizeof(float) * m->n_params);
    tlm_workspace *fresh = tlm_workspace_new();
    tlm_kv_reset(k1);
    forward1(m, ws, k1, tok, 6, a, 0);
    forward1(m, fresh, k2, tok, 6, b, 0);
    cr_assert_eq(memcmp(a, b, sizeof(float) * V), 0, "stale lm head at a reused address");
    tlm_kv_free(k1);
    tlm_kv_free(k2);
    tlm_workspace_free(fresh);
    tlm_model_free(m);
    tlm_model_free(other);
    tlm_workspace_free(ws);
}

/* The same batch with every loop an OpenMP region (and OpenMP's threads racing for rows)
 * gives the same bits as with every loop on the calling thread. */
Test(forward, thread_count_does_not_change_bits)
{
    tlm_model *m = test_model(4);
    tlm_workspace *serial = tlm_workspace_new(), *par = tlm_workspace_new();
    tlm_workspace_set_parallel_min(serial, (size_t)1 << 62);
    tlm_workspace_set_parallel_min(par, 0);
    const int V = CFG.vocab_size;
    enum { NS = 5 };
    int n[NS] = {40, 1, 17, 3, 64};
    static int32_t tok[NS][64];
    static float out[2][NS][64 * 97];
    for (int s = 0; s < NS; s++)
        random_tokens(tok[s], n[s], V);
    for (int w = 0; w < 2; w++) {
        tlm_kv *kv[NS];
        tlm_seq seqs[NS];
        for (int s = 0; s < NS; s++) {
            kv[s] = kv_new(m, 0);
            seqs[s] = (tlm_seq){kv[s], tok[s], n[s], out[w][s], 1};
        }
        tlm_error err = {0};
        cr_assert_eq(tlm_forward_batch(m, w ? par : serial, seqs, NS, &err), 0, "%s", err.msg);
        for (int s = 0; s < NS; s++)
            tlm_kv_free(kv[s]);
    }
    cr_assert_eq(memcmp(out[0], out[1], sizeof out[0]), 0, "parallel and serial differ");
    tlm_workspace_free(serial);
    tlm_workspace_free(par);
    tlm_model_free(m);
}

Test(forward, refusals_leave_caches_untouched)
{
    tlm_model *m = test_model(1);
    tlm_workspace *ws = tlm_workspace_new();
    tlm_kv *a = kv_new(m, 8), *b = kv_new(m, 8);
    int32_t good[4] = {1, 2, 3, 4}, bad[2] = {5, 97}, neg[1] = {-1};
    float lg[97];
    forward1(m, ws, a, good, 4, lg, 0);
    struct {
        tlm_seq s[2];
        int n;
        const char *want;
    } cases[] = {
        {{{b, good, 4, NULL, 0}, {a, bad, 2, NULL, 0}}, 2, "outside"},
        {{{a, neg, 1, NULL, 0}}, 1, "outside"},
        {{
             {b, good, 4, NULL, 0},
             {a, good, 4, NULL, 0},
         },
         2,
         NULL}, /* a: 4 + 4 <= 8 is fine */
        {{{b, good, 1, NULL, 0}, {b, good, 1, NULL, 0}}, 2, "twice"},
        {{{b, good, 0, NULL, 0}}, 1, "at least 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int la = a->len, lb = b->len;
        tlm_error err = {0};
        int rc = tlm_forward_batch(m, ws, cases[i].s, cases[i].n, &err);
        if (!cases[i].want) {
            cr_assert_eq(rc, 0, "case %zu: %s", i, err.msg);
            continue;
        }
        cr_assert_lt(rc, 0, "case %zu accepted", i);
        cr_assert_not_null(strstr(err.msg, cases[i].want), "case %zu: %s", i, err.msg);
        cr_assert_eq(a->len, la);
        cr_assert_eq(b->len, lb);
    }
    /* a is now full (8 of 8) */
    tlm_error err = {0};
    tlm_seq over = {a, good, 1, NULL, 0};
    cr_assert_eq(tlm_forward_batch(m, ws, &over, 1, &err), TLM_ELIMIT);
    cr_assert_not_null(strstr(err.msg, "do not fit"), "%s", err.msg);
    /* a cache of another model */
    tlm_config c2 = CFG;
    c2.n_embd = 32;
    tlm_model *m2;
    cr_assert_eq(tlm_model_new(&c2, NULL, &m2, NULL), 0);
    tlm_kv *k2 = kv_new(m2, 4);
    tlm_seq wrong = {k2, good, 1, NULL, 0};
    cr_assert_lt(tlm_forward_batch(m, ws, &wrong, 1, &err), 0);
    cr_assert_lt(tlm_kv_new(m, 65, &k2, &err), 0);
    tlm_kv_free(wrong.kv);
    tlm_model_free(m2);
    tlm_kv_free(a);
    tlm_kv_free(b);
    tlm_workspace_free(ws);
    tlm_model_free(m);
}
