/* Tests for compiler/tlm/train.c: the gradient of every parameter tensor against central
 * finite differences and against an independent float64 numpy backward
 * (tests/compiler/tlm/gpt2_train_ref.py), the training forward's logits against
 * tlm_forward_batch, a tiny overfit that greedy decoding reproduces, checkpoint resume bitwise
 * identical to an uninterrupted run, refused checkpoints and batches, the learning-rate
 * schedule, AdamW against a float64 reference, and clipping. */
#include <criterion/criterion.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/tlm/train.h"

#define PY "/usr/bin/python3"

/* The tiny model of the gradient checks. */
static const tlm_config CFG = {
    .n_layer = 2, .n_head = 2, .n_embd = 16, .n_ctx = 16, .vocab_size = 23};

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
 * matrices mul times the GPT-2 scale (4 in the gradient checks, so attention is not uniform
 * and GELU not linear). Reseeds the test's generator: same seed, same model, same draws
 * after it. */
static tlm_model *test_model(const tlm_config *cfg, uint64_t seed, float mul)
{
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_init_random(cfg, NULL, seed, &m, &err), 0, "%s", err.msg);
    rng = 0x9E3779B97F4A7C15ULL * (seed + 1); /* same seed, same model */
    size_t C = (size_t)cfg->n_embd;
    for (size_t i = 0; i < m->n_params; i++)
        m->params[i] *= mul;
    for (int l = 0; l < cfg->n_layer; l++) {
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

/* A batch of sentences of different lengths: explicit masks (prompt and a hole), one with
 * loss_mask NULL, different weights, one of weight 0. */
#define NB 4
typedef struct batch {
    int32_t tok[NB][16];
    uint8_t mask[NB][16];
    tlm_train_example ex[NB];
} batch;

static void make_batch(batch *b, int V)
{
    static const int len[NB] = {16, 9, 5, 7};
    static const float weight[NB] = {1.0f, 0.5f, 2.0f, 0.0f};
    for (int i = 0; i < NB; i++) {
        for (int t = 0; t < len[i]; t++) {
            b->tok[i][t] = (int32_t)(urand() * V);
            b->mask[i][t] = t >= 3 && t != 6;
        }
        b->ex[i] = (tlm_train_example){.tokens = b->tok[i],
                                       .n = len[i],
                                       .loss_mask = b->mask[i],
                                       .n_prompt = 0,
                                       .weight = weight[i]};
    }
    b->ex[2].loss_mask = NULL;
    b->ex[2].n_prompt = 2;
}

typedef struct tensor {
    const char *name;
    float *p;
    size_t n;
} tensor;

static int tensors(tlm_model *m, tensor *t)
{
    size_t C = (size_t)m->cfg.n_embd;
    int k = 0;
    t[k++] = (tensor){"wte", m->wte, (size_t)m->cfg.vocab_size * C};
    t[k++] = (tensor){"wpe", m->wpe, (size_t)m->cfg.n_ctx * C};
    static char names[TLM_MAX_LAYERS][12][24];
    static const char *base[12] = {"ln1_w", "ln1_b", "qkv_w", "qkv_b", "attn_proj_w", "attn_proj_b",
                                   "ln2_w", "ln2_b", "fc_w",  "fc_b",  "fc_proj_w",   "fc_proj_b"};
    for (int l = 0; l < m->cfg.n_layer; l++) {
        tlm_layer *ly = &m->layers[l];
        float *ps[12] = {ly->ln1_w,       ly->ln1_b,       ly->qkv_w,     ly->qkv_b,
                         ly->attn_proj_w, ly->attn_proj_b, ly->ln2_w,     ly->ln2_b,
                         ly->fc_w,        ly->fc_b,        ly->fc_proj_w, ly->fc_proj_b};
        size_t ns[12] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
        for (int j = 0; j < 12; j++) {
            snprintf(names[l][j], sizeof names[l][j], "h%d.%s", l, base[j]);
            t[k++] = (tensor){names[l][j], ps[j], ns[j]};
        }
    }
    t[k++] = (tensor){"lnf_w", m->lnf_w, C};
    t[k++] = (tensor){"lnf_b", m->lnf_b, C};
    size_t total = 0;
    for (int i = 0; i < k; i++)
        total += t[i].n;
    cr_assert_eq(total, m->n_params, "tensor table does not cover the parameters");
    return k;
}

static double loss_of(const tlm_model *m, const batch *b)
{
    double loss;
    tlm_error err = {0};
    cr_assert_eq(tlm_loss_and_grad(m, b->ex, NB, &loss, NULL, &err), 0, "%s", err.msg);
    return loss;
}

/* Central differences of the float forward, taken in double: h = 1e-2 keeps the loss's
 * rounding (~1e-7 relative, ~3e-7 absolute here) at ~1e-5 of the difference quotient, and the
 * truncation error (h^2 f''' / 6) stays below it for these smooth functions. Per tensor, the
 * 6 elements with the largest |gradient| and 4 random ones are checked; each must satisfy
 * |fd - g| <= 2e-4 * max|g of the tensor| + 1e-2 * |g|. */
Test(train, grad_matches_finite_differences)
{
    tlm_model *m = test_model(&CFG, 7, 4.0f);
    batch b;
    make_batch(&b, CFG.vocab_size);
    float *g = malloc(m->n_params * sizeof(float));
    double loss;
    tlm_error err = {0};
    cr_assert_eq(tlm_loss_and_grad(m, b.ex, NB, &loss, g, &err), 0, "%s", err.msg);
    cr_assert(isfinite(loss) && loss > 0.5, "loss %g", loss);
    tensor t[4 + 12 * 2];
    int nt = tensors(m, t);
    const double h = 1e-2;
    double worst = 0;
    const char *worst_name = "";
    for (int k = 0; k < nt; k++) {
        const float *gk = g + (t[k].p - m->params);
        double gmax = 0;
        for (size_t i = 0; i < t[k].n; i++)
            gmax = fmax(gmax, fabs(gk[i]));
        cr_assert_gt(gmax, 1e-6, "%s: gradient all zero", t[k].name);
        size_t idx[10];
        int ni = 0;
        for (int s = 0; s < 6; s++) { /* the largest, excluding those already taken */
            size_t best = 0;
            double bv = -1;
            for (size_t i = 0; i < t[k].n; i++) {
                int taken = 0;
                for (int j = 0; j < ni; j++)
                    taken |= idx[j] == i;
                if (!taken && fabs(gk[i]) > bv) bv = fabs(gk[i]), best = i;
            }
            if (bv >= 0) idx[ni++] = best;
        }
        for (int s = 0; s < 4; s++)
            idx[ni++] = (size_t)(urand() * (double)t[k].n);
        for (int j = 0; j < ni; j++) {
            float *p = t[k].p + idx[j];
            float p0 = *p;
            float hp = (float)(p0 + h), hm = (float)(p0 - h);
            *p = hp;
            double lp = loss_of(m, &b);
            *p = hm;
            double lm = loss_of(m, &b);
            *p = p0;
            double fd = (lp - lm) / ((double)hp - (double)hm);
            double ga = gk[idx[j]];
            double tol = 2e-4 * gmax + 1e-2 * fabs(ga);
            cr_assert_leq(fabs(fd - ga), tol, "%s[%zu]: analytic %.8g, finite difference %.8g",
                          t[k].name, idx[j], ga, fd);
            if (fabs(fd - ga) / tol > worst) worst = fabs(fd - ga) / tol, worst_name = t[k].name;
        }
    }
    cr_log_info("finite differences: worst error %.2f of the tolerance (%s)", worst, worst_name);
    free(g);
    tlm_model_free(m);
}

static int have_numpy(void)
{
    if (access(PY, X_OK) != 0) return 0;
    return system(PY " -c 'import numpy' >/dev/null 2>&1") == 0;
}

static const char *script_path(const char *name, char *buf, size_t n)
{
    const char *root = getenv("TLM_ROOT");
    snprintf(buf, n, "%s/tests/compiler/tlm/%s", root ? root : ".", name);
    cr_assert_eq(access(buf, R_OK), 0, "reference script %s not found", buf);
    return buf;
}

/* The loss and every gradient element against the float64 numpy backward: loss to 1e-5
 * relative, each tensor's gradient to 1e-4 of that tensor's largest element (float forward
 * and backward against float64). */
Test(train, matches_numpy_reference)
{
    if (!have_numpy()) cr_skip_test("%s with numpy not available (apt install python3-numpy)", PY);
    char script[512];
    script_path("gpt2_train_ref.py", script, sizeof script);
    char dir[] = "/tmp/tlm-train-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char wpath[600], bpath[600], opath[600], cmd[2600];
    snprintf(wpath, sizeof wpath, "%s/m.bin", dir);
    snprintf(bpath, sizeof bpath, "%s/batch.txt", dir);
    snprintf(opath, sizeof opath, "%s/ref.bin", dir);
    tlm_model *m = test_model(&CFG, 11, 4.0f);
    tlm_error err = {0};
    cr_assert_eq(tlm_model_save(m, wpath, &err), 0, "%s", err.msg);
    batch b;
    make_batch(&b, CFG.vocab_size);
    FILE *f = fopen(bpath, "w");
    cr_assert_not_null(f);
    for (int i = 0; i < NB; i++) {
        const tlm_train_example *e = &b.ex[i];
        fprintf(f, "%.9g %d", (double)e->weight, e->n);
        for (int t = 0; t < e->n; t++)
            fprintf(f, " %d", e->tokens[t]);
        for (int t = 0; t < e->n; t++)
            fprintf(f, " %d", e->loss_mask ? e->loss_mask[t] != 0 : t >= e->n_prompt);
        fprintf(f, "\n");
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, PY " %s %s %s %s", script, wpath, bpath, opath);
    cr_assert_eq(system(cmd), 0, "reference failed: %s", cmd);
    double *ref = malloc((m->n_params + 1) * sizeof(double));
    f = fopen(opath, "rb");
    cr_assert_not_null(f);
    cr_assert_eq(fread(ref, sizeof(double), m->n_params + 1, f), m->n_params + 1);
    fclose(f);

    float *g = malloc(m->n_params * sizeof(float));
    double loss;
    cr_assert_eq(tlm_loss_and_grad(m, b.ex, NB, &loss, g, &err), 0, "%s", err.msg);
    cr_assert_lt(fabs(loss - ref[0]), 1e-5 * fabs(ref[0]), "loss %.9g, reference %.9g", loss,
                 ref[0]);
    tensor t[4 + 12 * 2];
    int nt = tensors(m, t);
    double worst = 0;
    for (int k = 0; k < nt; k++) {
        size_t off = (size_t)(t[k].p - m->params);
        double scale = 0, d = 0;
        for (size_t i = 0; i < t[k].n; i++) {
            scale = fmax(scale, fabs(ref[1 + off + i]));
            d = fmax(d, fabs(g[off + i] - ref[1 + off + i]));
        }
        cr_assert_gt(scale, 1e-6, "%s: reference gradient all zero", t[k].name);
        cr_assert_lt(d / scale, 1e-4, "%s: max gradient error %g of its largest element %g",
                     t[k].name, d, scale);
        worst = fmax(worst, d / scale);
    }
    cr_log_info("numpy reference: loss %.9g vs %.9g, worst relative gradient error %.2g", loss,
                ref[0], worst);
    free(g);
    free(ref);
    tlm_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* The training forward computes the inference forward's logits (OpenBLAS here, gemm.c there:
 * equal to float rounding, 1e-5 of the largest logit). */
Test(train, logits_match_forward_batch)
{
    tlm_model *m = test_model(&CFG, 13, 4.0f);
    batch b;
    make_batch(&b, CFG.vocab_size);
    const int V = CFG.vocab_size;
    float *tl = malloc(sizeof(float) * 64 * V);
    tlm_error err = {0};
    cr_assert_eq(tlm_train_logits(m, b.ex, NB, tl, &err), 0, "%s", err.msg);
    tlm_workspace *ws = tlm_workspace_new();
    size_t row = 0;
    double worst = 0;
    for (int i = 0; i < NB; i++) {
        const tlm_train_example *e = &b.ex[i];
        tlm_kv *kv;
        cr_assert_eq(tlm_kv_new(m, 0, &kv, &err), 0, "%s", err.msg);
        float *fl = malloc(sizeof(float) * e->n * V);
        tlm_seq s = {
            .kv = kv, .tokens = e->tokens, .n_tokens = e->n, .logits = fl, .all_logits = 1};
        cr_assert_eq(tlm_forward_batch(m, ws, &s, 1, &err), 0, "%s", err.msg);
        for (int t = 1; t < e->n; t++) {
            if (!(e->loss_mask ? e->loss_mask[t] : t >= e->n_prompt)) continue;
            double scale = 0, d = 0;
            for (int v = 0; v < V; v++) {
                scale = fmax(scale, fabs(fl[(size_t)(t - 1) * V + v]));
                d = fmax(d, fabs(fl[(size_t)(t - 1) * V + v] - tl[row * V + v]));
            }
            cr_assert_gt(scale, 0.1);
            worst = fmax(worst, d / scale);
            row++;
        }
        free(fl);
        tlm_kv_free(kv);
    }
    cr_assert_gt(row, 10);
    cr_assert_lt(worst, 1e-5, "max relative logit difference %g", worst);
    tlm_workspace_free(ws);
    free(tl);
    tlm_model_free(m);
}

/* ---- training ---- */

static tlm_train_opts opts_for(double lr, int warmup, int total)
{
    tlm_train_opts o;
    tlm_train_opts_default(&o);
    o.lr = lr;
    o.warmup_steps = warmup;
    o.total_steps = total;
    return o;
}

static tlm_trainer *trainer(tlm_model *m, const tlm_train_opts *o)
{
    tlm_trainer *tr;
    tlm_error err = {0};
    cr_assert_eq(tlm_trainer_new(m, o, &tr, &err), 0, "%s", err.msg);
    return tr;
}

static void step(tlm_trainer *tr, const tlm_train_example *ex, int n, tlm_train_stats *st)
{
    tlm_error err = {0};
    cr_assert_eq(tlm_trainer_step(tr, ex, n, st, &err), 0, "%s", err.msg);
}

/* Five sentences (a 3-token prompt that tells them apart, 8 to 12 decision tokens, [EOS]),
 * 200 steps: the loss on the decisions falls below 0.05 and greedy decoding from each prompt
 * gives its decisions back. */
Test(train, overfit_then_greedy_decoding_reproduces)
{
    const tlm_config cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .n_ctx = 32, .vocab_size = 29};
    const int EOS = 28, NS = 5, NP = 3;
    tlm_model *m = test_model(&cfg, 21, 1.0f);
    int32_t tok[5][16];
    tlm_train_example ex[5];
    for (int s = 0; s < NS; s++) {
        int n = NP + 8 + s;
        tok[s][0] = s; /* distinct prompts */
        for (int t = 1; t < n - 1; t++)
            tok[s][t] = 5 + (int32_t)(urand() * 23);
        tok[s][n - 1] = EOS;
        ex[s] = (tlm_train_example){.tokens = tok[s], .n = n, .n_prompt = NP, .weight = 1.0f};
    }
    tlm_train_opts o = opts_for(1e-2, 10, 200);
    o.weight_decay = 0.0;
    tlm_trainer *tr = trainer(m, &o);
    tlm_train_stats st = {0}, first = {0};
    for (int i = 0; i < 200; i++) {
        step(tr, ex, NS, &st);
        if (i == 0) first = st;
    }
    cr_assert_eq(st.step, 200);
    cr_assert_eq(st.tokens, 5 * 8 + 10, "trained tokens %ld", st.tokens);
    double loss;
    long ntok;
    tlm_error err = {0};
    cr_assert_eq(tlm_trainer_eval(tr, ex, NS, &loss, &ntok, &err), 0, "%s", err.msg);
    cr_log_info("overfit: loss %.4f at step 1, %.5f after 200 steps", first.loss, loss);
    cr_assert_gt(first.loss, 2.0);
    cr_assert_lt(loss, 0.05, "loss %g after 200 steps", loss);

    tlm_decoder *dec;
    cr_assert_eq(tlm_decoder_new(m, NS, &dec, &err), 0, "%s", err.msg);
    int slot[5];
    for (int s = 0; s < NS; s++) {
        tlm_request r = {.prompt = tok[s], .n_prompt = NP, .max_new_tokens = ex[s].n - NP};
        slot[s] = tlm_decoder_add(dec, &r, &err);
        cr_assert_geq(slot[s], 0, "%s", err.msg);
    }
    cr_assert_eq(tlm_decoder_run(dec, &err), 0, "%s", err.msg);
    for (int s = 0; s < NS; s++) {
        const int32_t *out;
        int n;
        double score;
        cr_assert_eq(tlm_decoder_result(dec, slot[s], 0, &out, &n, &score, &err), 0, "%s", err.msg);
        cr_assert_eq(n, ex[s].n - NP);
        cr_assert_eq(memcmp(out, tok[s] + NP, (size_t)n * sizeof(int32_t)), 0,
                     "sentence %d not reproduced", s);
    }
    tlm_decoder_free(dec);
    tlm_trainer_free(tr);
    tlm_model_free(m);
}

/* Batches that change every step (a rotation of the test batch). */
static void rotated(const batch *b, int k, tlm_train_example *out)
{
    for (int i = 0; i < NB; i++)
        out[i] = b->ex[(i + k) % NB];
}

static char *tmp_path(char *dir, const char *name)
{
    static char buf[4][600];
    static int next;
    char *p = buf[next++ % 4];
    snprintf(p, 600, "%s/%s", dir, name);
    return p;
}

/* N steps in one go against K steps, a checkpoint, a fresh model and trainer loading it, and
 * N - K more steps: parameters, moments (through the next save) and losses bitwise equal. */
Test(train, resume_is_bitwise_identical)
{
    const int N = 7, K = 3;
    batch b;
    make_batch(&b, CFG.vocab_size);
    tlm_train_opts o = opts_for(3e-3, 2, 10);
    o.grad_clip = 0.5;
    char dir[] = "/tmp/tlm-ckpt-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));

    tlm_model *ma = test_model(&CFG, 31, 1.0f);
    tlm_trainer *ta = trainer(ma, &o);
    double la[16];
    for (int i = 0; i < N; i++) {
        tlm_train_example ex[NB];
        tlm_train_stats st;
        rotated(&b, i, ex);
        step(ta, ex, NB, &st);
        la[i] = st.loss;
    }

    tlm_model *mb = test_model(&CFG, 31, 1.0f);
    tlm_trainer *tb = trainer(mb, &o);
    for (int i = 0; i < K; i++) {
        tlm_train_example ex[NB];
        rotated(&b, i, ex);
        step(tb, ex, NB, NULL);
    }
    tlm_error err = {0};
    cr_assert_eq(tlm_trainer_save(tb, tmp_path(dir, "k.ckpt"), &err), 0, "%s", err.msg);
    tlm_trainer_free(tb);
    tlm_model_free(mb);

    tlm_model *mc = test_model(&CFG, 99, 1.0f); /* other weights: all must come from the file */
    tlm_train_opts other = opts_for(1.0, 0, 0);
    tlm_trainer *tc = trainer(mc, &other);
    cr_assert_eq(tlm_trainer_load(tc, tmp_path(dir, "k.ckpt"), &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_trainer_step_count(tc), K);
    cr_assert_eq(memcmp(tlm_trainer_opts(tc), &o, sizeof o), 0, "options not restored");
    for (int i = K; i < N; i++) {
        tlm_train_example ex[NB];
        tlm_train_stats st;
        rotated(&b, i, ex);
        step(tc, ex, NB, &st);
        cr_assert_eq(st.loss, la[i], "step %d: loss %.17g resumed, %.17g uninterrupted", i, st.loss,
                     la[i]);
    }
    cr_assert_eq(tlm_trainer_step_count(tc), N);
    cr_assert_eq(memcmp(ma->params, mc->params, ma->n_params * sizeof(float)), 0,
                 "parameters differ after resume");
    /* the optimizer state too: both checkpoints are the same bytes */
    cr_assert_eq(tlm_trainer_save(ta, tmp_path(dir, "a.ckpt"), &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_trainer_save(tc, tmp_path(dir, "c.ckpt"), &err), 0, "%s", err.msg);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", tmp_path(dir, "a.ckpt"), tmp_path(dir, "c.ckpt"));
    cr_assert_eq(system(cmd), 0, "checkpoints after N steps differ");
    /* and a model trained a different way does differ (the comparison can fail) */
    cr_assert_neq(la[N - 1], la[0]);

    tlm_trainer_free(ta);
    tlm_trainer_free(tc);
    tlm_model_free(ma);
    tlm_model_free(mc);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

static void write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static void *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*n);
    cr_assert_eq(fread(p, 1, *n, f), *n);
    fclose(f);
    return p;
}

static uint32_t fnv(const uint8_t *h, int n)
{
    uint32_t x = 2166136261u;
    for (int i = 0; i < n; i++) {
        x ^= h[i];
        x *= 16777619u;
    }
    return x;
}

/* A load that must fail with this field; the trainer's model and step stay as they were. */
static void expect_refused(tlm_trainer *tr, const tlm_model *m, const char *path, const char *field)
{
    float *before = malloc(m->n_params * sizeof(float));
    memcpy(before, m->params, m->n_params * sizeof(float));
    int step0 = tlm_trainer_step_count(tr);
    tlm_error err = {0};
    int rc = tlm_trainer_load(tr, path, &err);
    cr_assert_lt(rc, 0, "a bad checkpoint (%s) was accepted", field);
    cr_assert_str_eq(err.field, field, "expected field %s, got %s: %s", field, err.field, err.msg);
    cr_assert_eq(memcmp(before, m->params, m->n_params * sizeof(float)), 0);
    cr_assert_eq(tlm_trainer_step_count(tr), step0);
    free(before);
}

Test(train, bad_checkpoints_are_refused)
{
    batch b;
    make_batch(&b, CFG.vocab_size);
    tlm_train_opts o = opts_for(1e-3, 0, 0);
    tlm_model *m = test_model(&CFG, 41, 1.0f);
    tlm_trainer *tr = trainer(m, &o);
    step(tr, b.ex, NB, NULL);
    char dir[] = "/tmp/tlm-ckpt-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char *good = tmp_path(dir, "good.ckpt"), *bad = tmp_path(dir, "bad.ckpt");
    tlm_error err = {0};
    cr_assert_eq(tlm_trainer_save(tr, good, &err), 0, "%s", err.msg);
    size_t n;
    uint8_t *img = read_file(good, &n);
    cr_assert_eq(n, TLM_CKPT_HEADER_SIZE + 12 * m->n_params);
    uint8_t *c = malloc(n);

    tlm_model *m2 = test_model(&CFG, 42, 1.0f);
    tlm_trainer *t2 = trainer(m2, &o);
    cr_assert_eq(tlm_trainer_load(t2, good, &err), 0, "%s", err.msg); /* the unchanged file */
    cr_assert_eq(memcmp(m2->params, m->params, m->n_params * sizeof(float)), 0);
    cr_assert_eq(tlm_trainer_step_count(t2), 1);
    tlm_trainer_free(t2);
    tlm_model_free(m2);
    m2 = test_model(&CFG, 43, 1.0f);
    t2 = trainer(m2, &o);

    write_file(bad, img, n - 4); /* truncated */
    expect_refused(t2, m2, bad, "file");
    write_file(bad, img, 100); /* shorter than the header */
    expect_refused(t2, m2, bad, "file");
    memcpy(c, img, n); /* trailing data */
    write_file(bad, c, n);
    FILE *f = fopen(bad, "ab");
    fputc(0, f);
    fclose(f);
    expect_refused(t2, m2, bad, "file");
    memcpy(c, img, n); /* a flipped bit in the moments */
    c[n - 5] ^= 0x10;
    write_file(bad, c, n);
    expect_refused(t2, m2, bad, "payload_sha256");
    memcpy(c, img, n); /* a flipped bit in the header (the learning rate) */
    c[130] ^= 0x01;
    write_file(bad, c, n);
    expect_refused(t2, m2, bad, "header.checksum");
    memcpy(c, img, n);
    c[0] = 'X';
    write_file(bad, c, n);
    expect_refused(t2, m2, bad, "header.magic");
    memcpy(c, img, n); /* a future version, checksum fixed up */
    c[4] = 2;
    uint32_t x = fnv(c, 252);
    memcpy(c + 252, &x, 4);
    write_file(bad, c, n);
    expect_refused(t2, m2, bad, "header.version");
    memcpy(c, img, n); /* a learning rate that is not allowed, checksum fixed up */
    double neg = -1.0;
    memcpy(c + 128, &neg, 8);
    x = fnv(c, 252);
    memcpy(c + 252, &x, 4);
    write_file(bad, c, n);
    expect_refused(t2, m2, bad, "opts.lr");
    write_file(bad, "TLMW", 4);
    expect_refused(t2, m2, bad, "file");
    expect_refused(t2, m2, tmp_path(dir, "missing.ckpt"), "path");
    tlm_trainer_free(t2);
    tlm_model_free(m2);

    /* another configuration, another vocabulary */
    tlm_config wide = CFG;
    wide.n_embd = 32;
    m2 = test_model(&wide, 44, 1.0f);
    t2 = trainer(m2, &o);
    expect_refused(t2, m2, good, "config.n_embd");
    tlm_trainer_free(t2);
    tlm_model_free(m2);
    uint8_t vh[TLM_HASH_SIZE] = {1};
    cr_assert_eq(tlm_model_new(&CFG, vh, &m2, &err), 0, "%s", err.msg);
    t2 = trainer(m2, &o);
    expect_refused(t2, m2, good, "vocab_hash");
    tlm_trainer_free(t2);
    tlm_model_free(m2);

    /* no temporary file left behind by the saves */
    char cmd[800];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q tmp", dir);
    cr_assert_neq(system(cmd), 0, "a temporary file was left in %s", dir);
    free(c);
    free(img);
    tlm_trainer_free(tr);
    tlm_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

/* Refused batches change nothing. */
Test(train, bad_batches_are_refused)
{
    tlm_model *m = test_model(&CFG, 51, 1.0f);
    tlm_train_opts o = opts_for(1e-3, 0, 0);
    tlm_trainer *tr = trainer(m, &o);
    float *before = malloc(m->n_params * sizeof(float));
    memcpy(before, m->params, m->n_params * sizeof(float));
    int32_t tok[20] = {1, 2, 3, 4, 5};
    uint8_t mask[20] = {0, 1, 1, 1, 1};
    struct {
        tlm_train_example ex;
        const char *why;
    } cases[] = {
        {{tok, 1, NULL, 0, 1.0f}, "n = 1"},
        {{tok, 17, NULL, 1, 1.0f}, "n > n_ctx"},
        {{tok, 5, NULL, 5, 1.0f}, "n_prompt = n"},
        {{tok, 5, NULL, 0, 1.0f}, "n_prompt = 0"},
        {{tok, 5, mask, 0, -1.0f}, "negative weight"},
        {{tok, 5, mask, 0, NAN}, "NaN weight"},
        {{tok, 5, mask, 0, 0.0f}, "all weight 0"},
        {{NULL, 5, mask, 0, 1.0f}, "no tokens"},
    };
    tlm_error err;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        err = (tlm_error){0};
        cr_assert_lt(tlm_trainer_step(tr, &cases[i].ex, 1, NULL, &err), 0, "%s accepted",
                     cases[i].why);
        cr_assert(strstr(err.field, "batch"), "%s: field %s", cases[i].why, err.field);
    }
    uint8_t m0[5] = {1, 1, 1, 1, 1};
    tlm_train_example e = {tok, 5, m0, 0, 1.0f};
    cr_assert_lt(tlm_trainer_step(tr, &e, 1, NULL, &err), 0, "loss_mask[0] accepted");
    tok[2] = CFG.vocab_size;
    e.loss_mask = mask;
    cr_assert_lt(tlm_trainer_step(tr, &e, 1, NULL, &err), 0, "token out of range accepted");
    cr_assert(strstr(err.msg, "token"), "%s", err.msg);
    cr_assert_lt(tlm_trainer_step(tr, &e, 0, NULL, &err), 0, "empty batch accepted");
    cr_assert_eq(memcmp(before, m->params, m->n_params * sizeof(float)), 0);
    cr_assert_eq(tlm_trainer_step_count(tr), 0);
    cr_assert_null(tlm_trainer_grad(tr));
    tlm_train_opts bad = o;
    bad.total_steps = 5;
    bad.warmup_steps = 10;
    cr_assert_lt(tlm_trainer_set_opts(tr, &bad, &err), 0);
    cr_assert_str_eq(err.field, "opts.total_steps");
    free(before);
    tlm_trainer_free(tr);
    tlm_model_free(m);
}

Test(train, lr_schedule_warmup_cosine)
{
    tlm_train_opts o = opts_for(1.0, 10, 110);
    o.min_lr_frac = 0.1;
    cr_assert_float_eq(tlm_train_lr(&o, 0), 0.1, 1e-12); /* warm-up: (s + 1) / 10 */
    cr_assert_float_eq(tlm_train_lr(&o, 4), 0.5, 1e-12);
    cr_assert_float_eq(tlm_train_lr(&o, 9), 1.0, 1e-12);   /* peak at the end of warm-up */
    cr_assert_float_eq(tlm_train_lr(&o, 10), 1.0, 1e-12);  /* cosine starts at the peak */
    cr_assert_float_eq(tlm_train_lr(&o, 60), 0.55, 1e-12); /* half way: the mean */
    cr_assert_float_eq(tlm_train_lr(&o, 35), 0.1 + 0.9 * 0.5 * (1 + cos(M_PI * 0.25)), 1e-12);
    cr_assert_float_eq(tlm_train_lr(&o, 110), 0.1, 1e-12); /* the floor at total_steps */
    cr_assert_float_eq(tlm_train_lr(&o, 1000), 0.1, 1e-12);
    for (int s = 10; s < 110; s++) /* never increases after the peak */
        cr_assert_leq(tlm_train_lr(&o, s + 1), tlm_train_lr(&o, s));
    o.total_steps = 0; /* no decay */
    cr_assert_float_eq(tlm_train_lr(&o, 500), 1.0, 1e-12);
    o.warmup_steps = 0;
    cr_assert_float_eq(tlm_train_lr(&o, 0), 1.0, 1e-12);

    /* the trainer uses it: stats.lr of each step */
    tlm_model *m = test_model(&CFG, 61, 1.0f);
    batch b;
    make_batch(&b, CFG.vocab_size);
    tlm_train_opts t = opts_for(2e-3, 3, 6);
    tlm_trainer *tr = trainer(m, &t);
    for (int s = 0; s < 8; s++) {
        tlm_train_stats st;
        step(tr, b.ex, NB, &st);
        cr_assert_eq(st.lr, tlm_train_lr(&t, s));
        cr_assert_eq(st.step, s + 1);
    }
    tlm_trainer_free(tr);
    tlm_model_free(m);
}

/* Three steps of the trainer against AdamW written out in double from tlm_loss_and_grad's
 * gradients: bias-corrected moments, decoupled decay on the 2-D tensors only (wte, wpe and
 * the four linear weights), none on biases and LayerNorm. */
Test(train, adamw_matches_reference)
{
    tlm_model *m = test_model(&CFG, 71, 1.0f);
    batch b;
    make_batch(&b, CFG.vocab_size);
    tlm_train_opts o = opts_for(1e-2, 0, 0);
    o.weight_decay = 0.5;
    o.grad_clip = 0.0;
    size_t n = m->n_params;
    tensor t[4 + 12 * 2];
    int nt = tensors(m, t);
    uint8_t *decay = calloc(n, 1);
    for (int k = 0; k < nt; k++) {
        const char *s = strrchr(t[k].name, '.');
        s = s ? s + 1 : t[k].name;
        int d = !strcmp(s, "wte") || !strcmp(s, "wpe") || !strcmp(s, "qkv_w") ||
                !strcmp(s, "attn_proj_w") || !strcmp(s, "fc_w") || !strcmp(s, "fc_proj_w");
        memset(decay + (t[k].p - m->params), d, t[k].n);
    }
    double *p = malloc(n * sizeof(double)), *mo = calloc(n, sizeof(double)),
           *v = calloc(n, sizeof(double));
    float *g = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = m->params[i];
    tlm_trainer *tr = trainer(m, &o);
    tlm_error err = {0};
    for (int s = 1; s <= 3; s++) {
        double loss;
        cr_assert_eq(tlm_loss_and_grad(m, b.ex, NB, &loss, g, &err), 0, "%s", err.msg);
        step(tr, b.ex, NB, NULL);
        cr_assert_eq(memcmp(g, tlm_trainer_grad(tr), n * sizeof(float)), 0,
                     "the trainer's gradient differs from tlm_loss_and_grad's");
        double worst = 0, moved = 0;
        for (size_t i = 0; i < n; i++) {
            mo[i] = o.beta1 * mo[i] + (1 - o.beta1) * g[i];
            v[i] = o.beta2 * v[i] + (1 - o.beta2) * (double)g[i] * g[i];
            double mh = mo[i] / (1 - pow(o.beta1, s)), vh = v[i] / (1 - pow(o.beta2, s));
            double old = p[i];
            p[i] -= o.lr * (mh / (sqrt(vh) + o.eps) + (decay[i] ? o.weight_decay * p[i] : 0));
            worst = fmax(worst, fabs(p[i] - m->params[i]));
            moved = fmax(moved, fabs(p[i] - old));
        }
        cr_assert_gt(moved, 0.5 * o.lr);
        cr_assert_lt(worst, 1e-6, "step %d: max parameter difference %g", s, worst);
    }
    /* Decay visible on its own: with sentences of at most 9 tokens, wpe rows of positions 9
     * and up get no gradient, so only the decay moves them (by lr * wd * p); without decay they
     * stay. */
    for (int wd = 0; wd < 2; wd++) {
        tlm_model *mw = test_model(&CFG, 72, 1.0f);
        tlm_train_opts ow = o;
        ow.weight_decay = wd ? 0.5 : 0.0;
        tlm_trainer *tw = trainer(mw, &ow);
        const float *row = mw->wpe + 12 * CFG.n_embd;
        float before[16];
        memcpy(before, row, sizeof before);
        step(tw, b.ex + 1, NB - 1, NULL);
        for (int c = 0; c < CFG.n_embd; c++) {
            float want =
                wd ? before[c] - (float)o.lr * ((float)ow.weight_decay * before[c]) : before[c];
            cr_assert_float_eq(row[c], want, 1e-9, "wpe[12][%d]: %g, want %g", c, row[c], want);
        }
        cr_assert_eq(tlm_trainer_grad(tw)[row - mw->params], 0.0f);
        tlm_trainer_free(tw);
        tlm_model_free(mw);
    }
    free(p);
    free(mo);
    free(v);
    free(g);
    free(decay);
    tlm_trainer_free(tr);
    tlm_model_free(m);
}

/* Clipping scales the whole gradient to grad_clip when its norm is above it; stats report the
 * norm before clipping; below the threshold (or with 0) the gradient is untouched. */
Test(train, clipping_caps_the_global_norm)
{
    tlm_model *m = test_model(&CFG, 81, 1.0f);
    batch b;
    make_batch(&b, CFG.vocab_size);
    size_t n = m->n_params;
    float *g = malloc(n * sizeof(float));
    double loss, norm = 0;
    tlm_error err = {0};
    cr_assert_eq(tlm_loss_and_grad(m, b.ex, NB, &loss, g, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < n; i++)
        norm += (double)g[i] * g[i];
    norm = sqrt(norm);
    cr_assert_gt(norm, 1e-3);

    for (int c = 0; c < 3; c++) {
        tlm_model *mc = test_model(&CFG, 81, 1.0f);
        tlm_train_opts o = opts_for(1e-3, 0, 0);
        o.grad_clip = c == 0 ? 0.25 * norm : c == 1 ? 4.0 * norm : 0.0;
        tlm_trainer *tr = trainer(mc, &o);
        tlm_train_stats st;
        step(tr, b.ex, NB, &st);
        cr_assert_float_eq(st.grad_norm, norm, 1e-7 * norm); /* summed in another order */
        const float *gc = tlm_trainer_grad(tr);
        cr_assert_not_null(gc);
        double nc = 0, dev = 0;
        double scale = c == 0 ? 0.25 : 1.0;
        for (size_t i = 0; i < n; i++) {
            nc += (double)gc[i] * gc[i];
            dev = fmax(dev, fabs(gc[i] - scale * g[i]));
        }
        nc = sqrt(nc);
        if (c == 0) {
            cr_assert_float_eq(nc, o.grad_clip, 1e-5 * o.grad_clip, "clipped norm %g, clip %g", nc,
                               o.grad_clip);
            cr_assert_lt(dev, 1e-6 * norm, "clipping changed the gradient's direction");
        } else {
            cr_assert_eq(memcmp(gc, g, n * sizeof(float)), 0, "unclipped gradient changed");
        }
        tlm_trainer_free(tr);
        tlm_model_free(mc);
    }
    free(g);
    tlm_model_free(m);
}

/* Our loops give each output element to one thread with a fixed order, so a step's bits do
 * not depend on the OpenMP thread count (OpenBLAS's own count stays fixed). With the parallel
 * threshold at 0 every loop of train.c is an OpenMP region. */
Test(train, step_bits_independent_of_openmp_threads)
{
    const tlm_config cfg = {
        .n_layer = 1, .n_head = 2, .n_embd = 64, .n_ctx = 160, .vocab_size = 64};
    enum { NS = 6, LEN = 130 };
    int32_t *tok = malloc(sizeof(int32_t) * NS * LEN);
    tlm_train_example ex[NS];
    for (int s = 0; s < NS; s++) {
        for (int t = 0; t < LEN; t++)
            tok[s * LEN + t] = (int32_t)(urand() * cfg.vocab_size);
        ex[s] = (tlm_train_example){
            .tokens = tok + s * LEN, .n = LEN - 7 * s, .n_prompt = 5, .weight = 1.0f + s};
    }
    tlm_model *m[2];
    tlm_trainer *tr[2];
    tlm_train_opts o = opts_for(1e-3, 0, 0);
    for (int k = 0; k < 2; k++) {
        m[k] = test_model(&cfg, 91, 1.0f);
        tr[k] = trainer(m[k], &o);
        tlm_trainer_set_parallel_min(tr[k], 0);
        omp_set_num_threads(k + 1);
        for (int i = 0; i < 2; i++)
            step(tr[k], ex, NS, NULL);
    }
    cr_assert_eq(
        memcmp(tlm_trainer_grad(tr[0]), tlm_trainer_grad(tr[1]), m[0]->n_params * sizeof(float)), 0,
        "gradient bits depend on the OpenMP thread count");
    cr_assert_eq(memcmp(m[0]->params, m[1]->params, m[0]->n_params * sizeof(float)), 0,
                 "parameters depend on the OpenMP thread count");
    for (int k = 0; k < 2; k++) {
        tlm_trainer_free(tr[k]);
        tlm_model_free(m[k]);
    }
    free(tok);
}

/* A step whose loss is not finite (an infinite LayerNorm gain: the logits are inf and NaN)
 * changes nothing and says so. */
Test(train, non_finite_step_is_refused)
{
    tlm_model *m = test_model(&CFG, 101, 1.0f);
    for (int c = 0; c < CFG.n_embd; c++)
        m->lnf_w[c] = INFINITY;
    batch b;
    make_batch(&b, CFG.vocab_size);
    tlm_train_opts o = opts_for(1e-3, 0, 0);
    tlm_trainer *tr = trainer(m, &o);
    float *before = malloc(m->n_params * sizeof(float));
    memcpy(before, m->params, m->n_params * sizeof(float));
    tlm_error err = {0};
    cr_assert_eq(tlm_trainer_step(tr, b.ex, NB, NULL, &err), TLM_ERUNTIME);
    cr_assert_str_eq(err.field, "grad", "%s", err.msg);
    cr_assert_eq(memcmp(before, m->params, m->n_params * sizeof(float)), 0);
    cr_assert_eq(tlm_trainer_step_count(tr), 0);
    cr_assert_null(tlm_trainer_grad(tr));
    free(before);
    tlm_trainer_free(tr);
    tlm_model_free(m);
}
