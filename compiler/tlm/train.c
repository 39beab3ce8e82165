/* train.c — GPT-2 training on the CPU: forward with kept activations, backward, AdamW and
 * checkpoints (contract in train.h).
 *
 * llm.c style: one function per layer over raw float arrays, shapes in comments. R is the
 * number of rows (all tokens of the batch, sentences stacked), Rt the number of trained rows
 * (positions whose next token is in the loss), NH heads of hs = C / NH.
 *
 * Why it is written this way:
 *  - Matrix products are OpenBLAS sgemm over the stacked rows, forward and backward: a
 *    training step is dominated by them (about 90% of the multiply-adds at C = 128) and the
 *    batch-invariant gemm.c has no transposed variants. Batch invariance is not needed here;
 *    run-to-run determinism is (train.h), and OpenBLAS splits a product between threads by
 *    output blocks, never along the inner dimension, so a fixed thread count gives fixed bits.
 *  - Every loop of ours gives each output element to one thread and reduces in a fixed
 *    order. Sums over rows (bias, LayerNorm and embedding gradients) are split by column
 *    blocks: a thread owns some columns and walks all rows in order, so no atomics and no
 *    per-thread partial sums whose combination would depend on the thread count.
 *  - Attention keeps its probabilities (NH, n, n per sentence and layer) for the backward;
 *    for the sentence lengths the tensor language produces (hundreds of tokens) that is small
 *    next to the other activations (16 C + 4 floats per row and layer).
 *  - Only trained rows go through the final LayerNorm and the lm head: with V in the
 *    thousands the head is the largest product, and prompt rows have no loss.
 */
#include "compiler/tlm/train.h"
#include "compiler/util/util.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "checkpoints store little-endian data; add byte swapping for this host"
#endif

/* A loop goes parallel from this many floats of work, as in forward.c: on the busy 2-core
 * build machine a parallel region waits for descheduled threads. Measured there (load average
 * 6-7) on the bench model (bench/tlm_train.c, 2449 rows of 128): with regions from 2^17 floats,
 * 2 OpenMP threads took 2.7 s a step against 0.8 s on one. From 2^22 only the loss (trained
 * rows x V) and the largest products' neighbours go parallel. tlm_trainer_set_parallel_min
 * changes it; results never depend on it. */
#define PAR_MIN (1 << 22)

/* Columns per block in the row reductions: 16 floats, one cache line. */
#define COL_BLOCK 16

/* ---- options and schedule ---- */

void tlm_train_opts_default(tlm_train_opts *o)
{
    memset(o, 0, sizeof *o);
    o->lr = 1e-3;
    o->min_lr_frac = 0.1;
    o->warmup_steps = 100;
    o->total_steps = 10000;
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->grad_clip = 1.0;
    o->seed = 0;
}

int tlm_train_opts_check(const tlm_train_opts *o, tlm_error *err)
{
    if (!o) return tlm_err_set(err, TLM_EINVAL, "opts", "no options given");
    if (!(o->lr > 0 && isfinite(o->lr)))
        return tlm_err_set(err, TLM_EINVAL, "opts.lr", "lr %g; allowed: finite, > 0", o->lr);
    if (!(o->min_lr_frac >= 0 && o->min_lr_frac <= 1))
        return tlm_err_set(err, TLM_EINVAL, "opts.min_lr_frac", "min_lr_frac %g; allowed 0..1",
                           o->min_lr_frac);
    if (o->warmup_steps < 0)
        return tlm_err_set(err, TLM_EINVAL, "opts.warmup_steps", "warmup_steps %d; allowed >= 0",
                           o->warmup_steps);
    if (o->total_steps < 0 || (o->total_steps > 0 && o->total_steps < o->warmup_steps))
        return tlm_err_set(err, TLM_EINVAL, "opts.total_steps",
                           "total_steps %d; allowed 0 (no decay) or >= warmup_steps (%d)",
                           o->total_steps, o->warmup_steps);
    if (!(o->beta1 >= 0 && o->beta1 < 1))
        return tlm_err_set(err, TLM_EINVAL, "opts.beta1", "beta1 %g; allowed [0, 1)", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1))
        return tlm_err_set(err, TLM_EINVAL, "opts.beta2", "beta2 %g; allowed [0, 1)", o->beta2);
    if (!(o->eps > 0 && isfinite(o->eps)))
        return tlm_err_set(err, TLM_EINVAL, "opts.eps", "eps %g; allowed: finite, > 0", o->eps);
    if (!(o->weight_decay >= 0 && isfinite(o->weight_decay)))
        return tlm_err_set(err, TLM_EINVAL, "opts.weight_decay",
                           "weight_decay %g; allowed: finite, >= 0", o->weight_decay);
    if (!(o->grad_clip >= 0 && isfinite(o->grad_clip)))
        return tlm_err_set(err, TLM_EINVAL, "opts.grad_clip",
                           "grad_clip %g; allowed: finite, >= 0 (0 = no clipping)", o->grad_clip);
    return 0;
}

double tlm_train_lr(const tlm_train_opts *o, int step)
{
    if (step < 0) step = 0;
    if (step < o->warmup_steps) return o->lr * (double)(step + 1) / (double)o->warmup_steps;
    if (o->total_steps == 0) return o->lr;
    double min_lr = o->lr * o->min_lr_frac;
    int span = o->total_steps - o->warmup_steps;
    double frac = span > 0 ? (double)(step - o->warmup_steps) / (double)span : 1.0;
    if (frac > 1.0) frac = 1.0;
    return min_lr + (o->lr - min_lr) * 0.5 * (1.0 + cos(M_PI * frac));
}

/* ---- the batch ---- */

/* The batch as rows: where each sentence starts, each row's token and position, the trained
 * rows with their targets and loss scales, and the buffers every layer uses (grown on
 * demand, reused across steps). */
typedef struct train_ws {
    size_t par_min; /* see PAR_MIN */
    int n_ex;
    size_t R, Rt, att_floats; /* att_floats: attention probabilities per layer */
    int max_n;
    int *ex_off;     /* (n_ex + 1) first row of each sentence */
    size_t *att_off; /* (n_ex) offset of each sentence's (NH, n, n) probabilities */
    int *row_tok;    /* (R) */
    int *row_pos;    /* (R) */
    int *trow;       /* (Rt) row whose logits predict a trained token */
    int *ttgt;       /* (Rt) the trained token */
    double *tscale;  /* (Rt) weight / total weight */
    double *tloss;   /* (Rt) cross-entropy of each trained row */
    size_t cap_ex, cap_R, cap_Rt;
    float *acts;
    size_t cap_acts;
    float *scratch;
    size_t cap_scratch;
} train_ws;

static void ws_free(train_ws *ws)
{
    free(ws->ex_off);
    free(ws->att_off);
    free(ws->row_tok);
    free(ws->row_pos);
    free(ws->trow);
    free(ws->ttgt);
    free(ws->tscale);
    free(ws->tloss);
    free(ws->acts);
    free(ws->scratch);
    memset(ws, 0, sizeof *ws);
}

/* *p holds n elements afterwards (old contents not kept); -1 when out of memory (*p as
 * before). */
static int resize(void **p, size_t n, size_t elem)
{
    void *q = realloc(*p, (n ? n : 1) * elem);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap && *p) return 0;
    if (resize(p, need, elem)) return -1;
    *cap = need;
    return 0;
}

static int trained(const tlm_train_example *e, int t)
{
    return e->loss_mask ? e->loss_mask[t] != 0 : t >= e->n_prompt;
}

/* Validates the batch (nothing changes before it passed) and lays it out in ws. */
static int ws_prepare(train_ws *ws, const tlm_model *m, const tlm_train_example *batch, int n,
                      tlm_error *err)
{
    if (!m || !batch || n < 1)
        return tlm_err_set(err, TLM_EINVAL, "batch", "no model or no examples given");
    const int V = m->cfg.vocab_size, T = m->cfg.n_ctx, NH = m->cfg.n_head;
    size_t R = 0, Rt = 0, att = 0;
    double wsum = 0;
    int max_n = 0;
    for (int i = 0; i < n; i++) {
        const tlm_train_example *e = &batch[i];
        char field[48];
        snprintf(field, sizeof field, "batch[%d]", i);
        if (!e->tokens) return tlm_err_set(err, TLM_EINVAL, field, "example without tokens");
        if (e->n < 2 || e->n > T)
            return tlm_err_set(err, TLM_EINVAL, field, "n is %d; allowed 2..n_ctx (%d)", e->n, T);
        if (!(e->weight >= 0 && isfinite(e->weight)))
            return tlm_err_set(err, TLM_EINVAL, field, "weight %g; allowed: finite, >= 0",
                               (double)e->weight);
        if (!e->loss_mask && (e->n_prompt < 1 || e->n_prompt >= e->n))
            return tlm_err_set(err, TLM_EINVAL, field,
                               "n_prompt is %d; allowed 1..n-1 (%d) when loss_mask is NULL",
                               e->n_prompt, e->n - 1);
        if (e->loss_mask && e->loss_mask[0])
            return tlm_err_set(err, TLM_EINVAL, field,
                               "loss_mask[0] is set: the first token has nothing to predict it");
        for (int t = 0; t < e->n; t++)
            if (e->tokens[t] < 0 || e->tokens[t] >= V)
                return tlm_err_set(err, TLM_EINVAL, field, "token %d at %d outside 0..%d",
                                   e->tokens[t], t, V - 1);
        int k = 0;
        for (int t = 1; t < e->n; t++)
            k += trained(e, t);
        R += (size_t)e->n;
        Rt += (size_t)k;
        wsum += (double)e->weight * k;
        att += (size_t)NH * e->n * e->n;
        if (e->n > max_n) max_n = e->n;
    }
    if (!(wsum > 0))
        return tlm_err_set(err, TLM_EINVAL, "batch",
                           "no trained token of positive weight (%zu trained tokens)", Rt);
    if (R > (size_t)INT_MAX / (4 * (size_t)m->cfg.n_embd) || Rt > (size_t)INT_MAX / (size_t)V)
        return tlm_err_set(err, TLM_ELIMIT, "batch", "%zu rows in one batch; too many", R);

    int bad = 0;
    if ((size_t)n + 1 > ws->cap_ex) {
        bad = resize((void **)&ws->ex_off, (size_t)n + 1, sizeof(int)) ||
              resize((void **)&ws->att_off, (size_t)n + 1, sizeof(size_t));
        if (!bad) ws->cap_ex = (size_t)n + 1;
    }
    if (!bad && R > ws->cap_R) {
        bad = resize((void **)&ws->row_tok, R, sizeof(int)) ||
              resize((void **)&ws->row_pos, R, sizeof(int));
        if (!bad) ws->cap_R = R;
    }
    if (!bad && Rt > ws->cap_Rt) {
        bad = resize((void **)&ws->trow, Rt, sizeof(int)) ||
              resize((void **)&ws->ttgt, Rt, sizeof(int)) ||
              resize((void **)&ws->tscale, Rt, sizeof(double)) ||
              resize((void **)&ws->tloss, Rt, sizeof(double));
        if (!bad) ws->cap_Rt = Rt;
    }
    if (bad) return tlm_err_set(err, TLM_ENOMEM, "batch", "out of memory");

    ws->n_ex = n;
    ws->R = R;
    ws->Rt = Rt;
    ws->att_floats = att;
    ws->max_n = max_n;
    size_t r = 0, rt = 0, a = 0;
    for (int i = 0; i < n; i++) {
        const tlm_train_example *e = &batch[i];
        ws->ex_off[i] = (int)r;
        ws->att_off[i] = a;
        double scale = (double)e->weight / wsum;
        for (int t = 0; t < e->n; t++) {
            ws->row_tok[r + t] = e->tokens[t];
            ws->row_pos[r + t] = t;
            if (t > 0 && trained(e, t)) {
                ws->trow[rt] = (int)(r + t - 1);
                ws->ttgt[rt] = e->tokens[t];
                ws->tscale[rt] = scale;
                rt++;
            }
        }
        r += (size_t)e->n;
        a += (size_t)NH * e->n * e->n;
    }
    ws->ex_off[n] = (int)r;
    return 0;
}

/* ---- activations ---- */

typedef struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (R, C), (R), (R) */
    float *qkv;                       /* (R, 3C) */
    float *atty;                      /* (R, C) attention output, before the projection */
    float *att;                       /* per sentence (NH, n, n) softmax probabilities */
    float *res2;                      /* (R, C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (R, C), (R), (R) */
    float *fch, *fch_gelu;            /* (R, 4C) */
    float *res3;                      /* (R, C) residual after the MLP: the layer's output */
} layer_acts;

typedef struct acts {
    float *encoded;                   /* (R, C) */
    layer_acts layer[TLM_MAX_LAYERS]; /* (L) */
    float *xf;                        /* (Rt, C) final residual of the trained rows */
    float *lnf, *lnf_mean, *lnf_rstd; /* (Rt, C), (Rt), (Rt) */
    float *logits;                    /* (Rt, V): logits, then probabilities, then dlogits */
} acts;

static size_t acts_floats(const tlm_model *m, const train_ws *ws)
{
    size_t C = (size_t)m->cfg.n_embd, R = ws->R, Rt = ws->Rt;
    size_t per_layer = R * (16 * C + 4) + ws->att_floats;
    return R * C + (size_t)m->cfg.n_layer * per_layer + Rt * (2 * C + 2) +
           Rt * (size_t)m->cfg.vocab_size;
}

static void acts_carve(acts *a, float *p, const tlm_model *m, const train_ws *ws)
{
    size_t C = (size_t)m->cfg.n_embd, R = ws->R, Rt = ws->Rt;
#define TAKE(dst, n)                                                                               \
    do {                                                                                           \
        (dst) = p;                                                                                 \
        p += (n);                                                                                  \
    } while (0)
    TAKE(a->encoded, R * C);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        layer_acts *la = &a->layer[l];
        TAKE(la->ln1, R * C);
        TAKE(la->ln1_mean, R);
        TAKE(la->ln1_rstd, R);
        TAKE(la->qkv, R * 3 * C);
        TAKE(la->atty, R * C);
        TAKE(la->att, ws->att_floats);
        TAKE(la->res2, R * C);
        TAKE(la->ln2, R * C);
        TAKE(la->ln2_mean, R);
        TAKE(la->ln2_rstd, R);
        TAKE(la->fch, R * 4 * C);
        TAKE(la->fch_gelu, R * 4 * C);
        TAKE(la->res3, R * C);
    }
    TAKE(a->xf, Rt * C);
    TAKE(a->lnf, Rt * C);
    TAKE(a->lnf_mean, Rt);
    TAKE(a->lnf_rstd, Rt);
    TAKE(a->logits, Rt * (size_t)m->cfg.vocab_size);
#undef TAKE
}

/* ---- layers: forward ---- */

/* out (R, C) = wte[token] + wpe[position] */
static void encoder_forward(float *out, const int *row_tok, const int *row_pos, const float *wte,
                            const float *wpe, int R, int C, size_t pm)
{
#pragma omp parallel for schedule(static) if ((size_t)R * C >= pm)
    for (int r = 0; r < R; r++) {
        const float *te = wte + (size_t)row_tok[r] * C, *pe = wpe + (size_t)row_pos[r] * C;
        float *o = out + (size_t)r * C;
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }
}

/* out (R, C) = (inp - mean) * rstd * w + b per row, eps 1e-5; keeps mean and rstd (R). */
static void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                              const float *w, const float *b, int R, int C, size_t pm)
{
#pragma omp parallel for schedule(static) if ((size_t)R * C >= pm)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * C;
        float *o = out + (size_t)r * C;
        float m = 0.0f;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= (float)C;
        float v = 0.0f;
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        for (int i = 0; i < C; i++)
            o[i] = (x[i] - m) * s * w[i] + b[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* out (R, N) = inp (R, K) @ w (K, N) + b (N); b may be NULL. */
static void matmul_forward(float *out, const float *inp, const float *w, const float *b, int R,
                           int K, int N, size_t pm)
{
    if (b) {
#pragma omp parallel for schedule(static) if ((size_t)R * N >= pm)
        for (int r = 0; r < R; r++)
            memcpy(out + (size_t)r * N, b, (size_t)N * sizeof(float));
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, R, N, K, 1.0f, inp, K, w, N,
                b ? 1.0f : 0.0f, out, N);
}

/* Causal self-attention of every sentence: qkv (R, 3C) holds each row's q | k | v, heads
 * contiguous; out (R, C); att keeps each sentence's (NH, n, n) probabilities, zero above the
 * diagonal. Per (sentence, head): S = scale * Q K^T and Y = P V as two sgemm calls over the
 * strided head columns; computing the masked upper half too costs less than scalar loops over
 * the lower half (sgemm runs at the CPU's vector width, the library is built for generic
 * x86-64). */
static void attention_forward(float *out, float *att, const float *qkv, const int *ex_off,
                              const size_t *att_off, int n_ex, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int it = 0; it < n_ex * NH; it++) {
        int e = it / NH, h = it % NH;
        int off = ex_off[e], n = ex_off[e + 1] - off;
        float *p = att + att_off[e] + (size_t)h * n * n; /* (n, n) */
        const float *q = qkv + (size_t)off * C3 + (size_t)h * hs;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hs, scale, q, C3, q + C, C3,
                    0.0f, p, n);
        for (int t = 0; t < n; t++) {
            float *row = p + (size_t)t * n;
            float maxv = -INFINITY;
            for (int t2 = 0; t2 <= t; t2++)
                if (row[t2] > maxv) maxv = row[t2];
            float sum = 0.0f;
            for (int t2 = 0; t2 <= t; t2++) {
                float ev = expf(row[t2] - maxv);
                row[t2] = ev;
                sum += ev;
            }
            float inv = 1.0f / sum;
            for (int t2 = 0; t2 <= t; t2++)
                row[t2] *= inv;
            for (int t2 = t + 1; t2 < n; t2++)
                row[t2] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, n, 1.0f, p, n, q + 2 * C, C3,
                    0.0f, out + (size_t)off * C + (size_t)h * hs, C);
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* tanh(u) as forward.c computes it inside GELU: 1 - 2 / (exp(2u) + 1) */
static inline float gelu_tanh(float x)
{
    float u = GELU_SCALE * (x + 0.044715f * x * x * x);
    return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}

/* out (n) = GELU(inp), the tanh approximation */
static void gelu_forward(float *out, const float *inp, size_t n, size_t pm)
{
#pragma omp parallel for schedule(static) if (n >= pm)
    for (size_t i = 0; i < n; i++)
        out[i] = 0.5f * inp[i] * (1.0f + gelu_tanh(inp[i]));
}

/* x (n) += d (n) */
static void residual_forward(float *x, const float *d, size_t n, size_t pm)
{
#pragma omp parallel for schedule(static) if (n >= pm)
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* probs (Rt, V) = softmax(logits) in place; loss[r] = -log probs[r][target[r]]. */
static void crossentropy_forward(float *logits, double *loss, const int *target, int Rt, int V,
                                 size_t pm)
{
#pragma omp parallel for schedule(static) if ((size_t)Rt * V >= pm)
    for (int r = 0; r < Rt; r++) {
        float *l = logits + (size_t)r * V;
        float maxv = -INFINITY;
        for (int i = 0; i < V; i++)
            if (l[i] > maxv) maxv = l[i];
        double sum = 0.0;
        float lt = l[target[r]];
        for (int i = 0; i < V; i++) {
            float ev = expf(l[i] - maxv);
            l[i] = ev;
            sum += ev;
        }
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < V; i++)
            l[i] *= inv;
        loss[r] = log(sum) - ((double)lt - (double)maxv);
    }
}

/* ---- layers: backward ---- */

/* dlogits (Rt, V) = (probs - onehot(target)) * scale, in place over probs. */
static void crossentropy_backward(float *probs, const int *target, const double *scale, int Rt,
                                  int V, size_t pm)
{
#pragma omp parallel for schedule(static) if ((size_t)Rt * V >= pm)
    for (int r = 0; r < Rt; r++) {
        float *p = probs + (size_t)r * V;
        float s = (float)scale[r];
        p[target[r]] -= 1.0f;
        for (int i = 0; i < V; i++)
            p[i] *= s;
    }
}

/* db (N) += sum over rows of dout (R, N): each thread owns column blocks, rows in order. */
static void bias_backward(float *db, const float *dout, int R, int N, size_t pm)
{
    int nb = (N + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)R * N >= pm)
    for (int bi = 0; bi < nb; bi++) {
        int c0 = bi * COL_BLOCK, c1 = c0 + COL_BLOCK < N ? c0 + COL_BLOCK : N;
        float acc[COL_BLOCK] = {0};
        for (int r = 0; r < R; r++) {
            const float *d = dout + (size_t)r * N;
            for (int c = c0; c < c1; c++)
                acc[c - c0] += d[c];
        }
        for (int c = c0; c < c1; c++)
            db[c] += acc[c - c0];
    }
}

/* For out (R, N) = inp (R, K) @ w (K, N) + b:
 *   dinp (R, K) = dout @ w^T (overwritten), dw (K, N) += inp^T @ dout, db (N) += sum dout.
 * dinp may be NULL (not wanted), db NULL (no bias). */
static void matmul_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                            const float *w, int R, int K, int N, size_t pm)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, K, N, 1.0f, dout, N, w, N, 0.0f,
                    dinp, K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, K, N, R, 1.0f, inp, K, dout, N, 1.0f, dw,
                N);
    if (db) bias_backward(db, dout, R, N, pm);
}

/* For out = LayerNorm(inp) * w + b: dinp (R, C) += ..., dw, db (C) += ... */
static void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                               const float *inp, const float *w, const float *mean,
                               const float *rstd, int R, int C, size_t pm)
{
#pragma omp parallel for schedule(static) if ((size_t)R * C >= pm)
    for (int r = 0; r < R; r++) {
        const float *d = dout + (size_t)r * C, *x = inp + (size_t)r * C;
        float *di = dinp + (size_t)r * C;
        float m = mean[r], s = rstd[r];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dnorm = w[i] * d[i];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= (float)C;
        dnorm_norm_mean /= (float)C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dnorm = w[i] * d[i];
            di[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
    int nb = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)R * C >= pm)
    for (int bi = 0; bi < nb; bi++) {
        int c0 = bi * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        float aw[COL_BLOCK] = {0}, ab[COL_BLOCK] = {0};
        for (int r = 0; r < R; r++) {
            const float *d = dout + (size_t)r * C, *x = inp + (size_t)r * C;
            float m = mean[r], s = rstd[r];
            for (int c = c0; c < c1; c++) {
                aw[c - c0] += (x[c] - m) * s * d[c];
                ab[c - c0] += d[c];
            }
        }
        for (int c = c0; c < c1; c++) {
            dw[c] += aw[c - c0];
            db[c] += ab[c - c0];
        }
    }
}

/* dinp (n) = dout (n) * GELU'(inp); dinp may be dout. */
static void gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, size_t pm)
{
#pragma omp parallel for schedule(static) if (n >= pm)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float t = gelu_tanh(x);
        float sech2 = 1.0f - t * t;
        float local =
            0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * local;
    }
}

/* Backward of attention_forward: dqkv (R, 3C) overwritten from dout (R, C). Per (sentence,
 * head): dP = dY V^T, dV = P^T dY, dS = P * (dP - rowsum(P * dP)) * scale (zero above the
 * diagonal, where P is), dQ = dS K, dK = dS^T Q. scratch: max_n * max_n floats. */
static void attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                               const int *ex_off, const size_t *att_off, int n_ex, int C, int NH,
                               float *scratch)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    for (int it = 0; it < n_ex * NH; it++) {
        int e = it / NH, h = it % NH;
        int off = ex_off[e], n = ex_off[e + 1] - off;
        const float *p = att + att_off[e] + (size_t)h * n * n;
        const float *q = qkv + (size_t)off * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
        const float *dy = dout + (size_t)off * C + (size_t)h * hs;
        float *dq = dqkv + (size_t)off * C3 + (size_t)h * hs, *dk = dq + C, *dv = dq + 2 * C;
        float *ds = scratch; /* (n, n): dP, then dS in place */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, hs, 1.0f, dy, C, v, C3, 0.0f, ds,
                    n);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, n, 1.0f, p, n, dy, C, 0.0f, dv,
                    C3);
        for (int t = 0; t < n; t++) {
            const float *prow = p + (size_t)t * n;
            float *drow = ds + (size_t)t * n;
            float dsum = 0.0f;
            for (int t2 = 0; t2 <= t; t2++)
                dsum += prow[t2] * drow[t2];
            for (int t2 = 0; t2 <= t; t2++)
                drow[t2] = prow[t2] * (drow[t2] - dsum) * scale;
            for (int t2 = t + 1; t2 < n; t2++)
                drow[t2] = 0.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, n, 1.0f, ds, n, k, C3, 0.0f,
                    dq, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, n, 1.0f, ds, n, q, C3, 0.0f, dk,
                    C3);
    }
}

/* dwte[token] += dout, dwpe[position] += dout over rows in order, by column blocks. */
static void encoder_backward(float *dwte, float *dwpe, const float *dout, const int *row_tok,
                             const int *row_pos, int R, int C, size_t pm)
{
    int nb = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)R * C >= pm)
    for (int bi = 0; bi < nb; bi++) {
        int c0 = bi * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int r = 0; r < R; r++) {
            const float *d = dout + (size_t)r * C;
            float *te = dwte + (size_t)row_tok[r] * C, *pe = dwpe + (size_t)row_pos[r] * C;
            for (int c = c0; c < c1; c++) {
                te[c] += d[c];
                pe[c] += d[c];
            }
        }
    }
}

/* ---- forward and backward of a batch ---- */

/* Floats of backward scratch: dres (R, C), dbuf (R, C), dqkv (R, 3C), dfch (R, 4C), dxf
 * (Rt, C), dlnf (Rt, C), attention (max_n, max_n). */
static size_t scratch_floats(const tlm_model *m, const train_ws *ws)
{
    size_t C = (size_t)m->cfg.n_embd;
    return ws->R * C * 9 + ws->Rt * C * 2 + (size_t)ws->max_n * (size_t)ws->max_n;
}

/* The forward over a prepared batch up to the logits of the trained rows, keeping
 * activations in a. */
static void forward(const tlm_model *m, train_ws *ws, acts *a)
{
    const size_t pm = ws->par_min;
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    const int R = (int)ws->R, Rt = (int)ws->Rt;
    encoder_forward(a->encoded, ws->row_tok, ws->row_pos, m->wte, m->wpe, R, C, pm);
    const float *residual = a->encoded;
    for (int l = 0; l < L; l++) {
        const tlm_layer *ly = &m->layers[l];
        layer_acts *la = &a->layer[l];
        layernorm_forward(la->ln1, la->ln1_mean, la->ln1_rstd, residual, ly->ln1_w, ly->ln1_b, R, C,
                          pm);
        matmul_forward(la->qkv, la->ln1, ly->qkv_w, ly->qkv_b, R, C, 3 * C, pm);
        attention_forward(la->atty, la->att, la->qkv, ws->ex_off, ws->att_off, ws->n_ex, C, NH);
        matmul_forward(la->res2, la->atty, ly->attn_proj_w, ly->attn_proj_b, R, C, C, pm);
        residual_forward(la->res2, residual, (size_t)R * C, pm);
        layernorm_forward(la->ln2, la->ln2_mean, la->ln2_rstd, la->res2, ly->ln2_w, ly->ln2_b, R, C,
                          pm);
        matmul_forward(la->fch, la->ln2, ly->fc_w, ly->fc_b, R, C, 4 * C, pm);
        gelu_forward(la->fch_gelu, la->fch, (size_t)R * 4 * C, pm);
        matmul_forward(la->res3, la->fch_gelu, ly->fc_proj_w, ly->fc_proj_b, R, 4 * C, C, pm);
        residual_forward(la->res3, la->res2, (size_t)R * C, pm);
        residual = la->res3;
    }
    for (int r = 0; r < Rt; r++)
        memcpy(a->xf + (size_t)r * C, residual + (size_t)ws->trow[r] * C,
               (size_t)C * sizeof(float));
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->xf, m->lnf_w, m->lnf_b, Rt, C, pm);
    /* logits (Rt, V) = lnf (Rt, C) @ wte^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Rt, V, C, 1.0f, a->lnf, C, m->wte, C, 0.0f,
                a->logits, V);
}

static double weighted_loss(const train_ws *ws)
{
    double loss = 0.0;
    for (size_t r = 0; r < ws->Rt; r++)
        loss += ws->tscale[r] * ws->tloss[r];
    return loss;
}

/* The backward after forward() and crossentropy_forward(): grad (n_params, file order) is
 * overwritten. */
static void backward(const tlm_model *m, train_ws *ws, acts *a, float *scr, float *grad)
{
    const size_t pm = ws->par_min;
    const int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    const int R = (int)ws->R, Rt = (int)ws->Rt;
#define G(p) (grad + ((p)-m->params))
    float *dres = scr;                      /* (R, C) gradient of the residual stream */
    float *dbuf = dres + (size_t)R * C;     /* (R, C) */
    float *dqkv = dbuf + (size_t)R * C;     /* (R, 3C) */
    float *dfch = dqkv + (size_t)R * 3 * C; /* (R, 4C) */
    float *dxf = dfch + (size_t)R * 4 * C;  /* (Rt, C) */
    float *dlnf = dxf + (size_t)Rt * C;     /* (Rt, C) */
    float *att_scr = dlnf + (size_t)Rt * C; /* (max_n, max_n) */

    memset(grad, 0, m->n_params * sizeof(float));
    crossentropy_backward(a->logits, ws->ttgt, ws->tscale, Rt, V, pm);
    /* logits = lnf @ wte^T: dlnf = dlogits @ wte, dwte += dlogits^T @ lnf */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Rt, C, V, 1.0f, a->logits, V, m->wte, C,
                0.0f, dlnf, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, Rt, 1.0f, a->logits, V, a->lnf, C,
                1.0f, G(m->wte), C);
    memset(dxf, 0, (size_t)Rt * C * sizeof(float));
    layernorm_backward(dxf, G(m->lnf_w), G(m->lnf_b), dlnf, a->xf, m->lnf_w, a->lnf_mean,
                       a->lnf_rstd, Rt, C, pm);
    memset(dres, 0, (size_t)R * C * sizeof(float));
    for (int r = 0; r < Rt; r++) /* trained rows are distinct */
        memcpy(dres + (size_t)ws->trow[r] * C, dxf + (size_t)r * C, (size_t)C * sizeof(float));

    for (int l = L - 1; l >= 0; l--) {
        const tlm_layer *ly = &m->layers[l];
        layer_acts *la = &a->layer[l];
        const float *residual = l == 0 ? a->encoded : a->layer[l - 1].res3;
        /* res3 = res2 + fc_proj(gelu(fc(ln2(res2)))): dres flows on unchanged, plus the MLP */
        matmul_backward(dfch, G(ly->fc_proj_w), G(ly->fc_proj_b), dres, la->fch_gelu, ly->fc_proj_w,
                        R, 4 * C, C, pm);
        gelu_backward(dfch, la->fch, dfch, (size_t)R * 4 * C, pm);
        matmul_backward(dbuf, G(ly->fc_w), G(ly->fc_b), dfch, la->ln2, ly->fc_w, R, C, 4 * C, pm);
        layernorm_backward(dres, G(ly->ln2_w), G(ly->ln2_b), dbuf, la->res2, ly->ln2_w,
                           la->ln2_mean, la->ln2_rstd, R, C, pm);
        /* res2 = residual + attn_proj(attention(qkv(ln1(residual)))) */
        matmul_backward(dbuf, G(ly->attn_proj_w), G(ly->attn_proj_b), dres, la->atty,
                        ly->attn_proj_w, R, C, C, pm);
        attention_backward(dqkv, dbuf, la->qkv, la->att, ws->ex_off, ws->att_off, ws->n_ex, C, NH,
                           att_scr);
        matmul_backward(dbuf, G(ly->qkv_w), G(ly->qkv_b), dqkv, la->ln1, ly->qkv_w, R, C, 3 * C,
                        pm);
        layernorm_backward(dres, G(ly->ln1_w), G(ly->ln1_b), dbuf, residual, ly->ln1_w,
                           la->ln1_mean, la->ln1_rstd, R, C, pm);
    }
    encoder_backward(G(m->wte), G(m->wpe), dres, ws->row_tok, ws->row_pos, R, C, pm);
#undef G
}

/* Loss (and gradient when grad != NULL) of a prepared batch, with ws's buffers. */
static int loss_grad(const tlm_model *m, train_ws *ws, double *loss, float *grad, float *logits_out,
                     tlm_error *err)
{
    size_t na = acts_floats(m, ws);
    if (grow((void **)&ws->acts, &ws->cap_acts, na, sizeof(float)))
        return tlm_err_set(err, TLM_ENOMEM, "batch", "out of memory for %zu activations", na);
    if (grad) {
        size_t ns = scratch_floats(m, ws);
        if (grow((void **)&ws->scratch, &ws->cap_scratch, ns, sizeof(float)))
            return tlm_err_set(err, TLM_ENOMEM, "batch", "out of memory");
    }
    const size_t pm = ws->par_min;
    acts a;
    acts_carve(&a, ws->acts, m, ws);
    forward(m, ws, &a);
    if (logits_out)
        memcpy(logits_out, a.logits, ws->Rt * (size_t)m->cfg.vocab_size * sizeof(float));
    crossentropy_forward(a.logits, ws->tloss, ws->ttgt, (int)ws->Rt, m->cfg.vocab_size, pm);
    *loss = weighted_loss(ws);
    if (grad) backward(m, ws, &a, ws->scratch, grad);
    return 0;
}

int tlm_loss_and_grad(const tlm_model *m, const tlm_train_example *batch, int n, double *loss,
                      float *grad, tlm_error *err)
{
    train_ws ws = {.par_min = PAR_MIN};
    double l = 0;
    int rc = ws_prepare(&ws, m, batch, n, err);
    if (!rc) rc = loss_grad(m, &ws, &l, grad, NULL, err);
    ws_free(&ws);
    if (!rc && loss) *loss = l;
    return rc;
}

int tlm_train_logits(const tlm_model *m, const tlm_train_example *batch, int n, float *out,
                     tlm_error *err)
{
    if (!out) return tlm_err_set(err, TLM_EINVAL, "out", "no output buffer given");
    train_ws ws = {.par_min = PAR_MIN};
    double l = 0;
    int rc = ws_prepare(&ws, m, batch, n, err);
    if (!rc) rc = loss_grad(m, &ws, &l, NULL, out, err);
    ws_free(&ws);
    return rc;
}

/* ---- the trainer ---- */

#define MAX_TENSORS (2 + 12 * TLM_MAX_LAYERS + 2)

typedef struct tensor_range {
    size_t off, n;
    int decay; /* 2-D: weight decay applies */
} tensor_range;

struct tlm_trainer {
    tlm_model *m;
    tlm_train_opts opts;
    int step;
    float *grad;   /* (n_params) */
    float *adam_m; /* (n_params) */
    float *adam_v; /* (n_params) */
    int have_grad; /* grad holds the last step's clipped gradient */
    tensor_range *tensors;
    int n_tensors;
    train_ws ws;
};

static int tensor_table(const tlm_model *m, tensor_range *t)
{
    int k = 0;
    size_t C = (size_t)m->cfg.n_embd;
#define ADD(p, cnt, dec)                                                                           \
    do {                                                                                           \
        t[k].off = (size_t)((p)-m->params);                                                        \
        t[k].n = (cnt);                                                                            \
        t[k].decay = (dec);                                                                        \
        k++;                                                                                       \
    } while (0)
    ADD(m->wte, (size_t)m->cfg.vocab_size * C, 1);
    ADD(m->wpe, (size_t)m->cfg.n_ctx * C, 1);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const tlm_layer *ly = &m->layers[l];
        ADD(ly->ln1_w, C, 0);
        ADD(ly->ln1_b, C, 0);
        ADD(ly->qkv_w, C * 3 * C, 1);
        ADD(ly->qkv_b, 3 * C, 0);
        ADD(ly->attn_proj_w, C * C, 1);
        ADD(ly->attn_proj_b, C, 0);
        ADD(ly->ln2_w, C, 0);
        ADD(ly->ln2_b, C, 0);
        ADD(ly->fc_w, C * 4 * C, 1);
        ADD(ly->fc_b, 4 * C, 0);
        ADD(ly->fc_proj_w, 4 * C * C, 1);
        ADD(ly->fc_proj_b, C, 0);
    }
    ADD(m->lnf_w, C, 0);
    ADD(m->lnf_b, C, 0);
#undef ADD
    return k;
}

int tlm_trainer_new(tlm_model *m, const tlm_train_opts *o, tlm_trainer **out, tlm_error *err)
{
    *out = NULL;
    if (!m || !m->params) return tlm_err_set(err, TLM_EINVAL, "model", "no model given");
    int rc = tlm_train_opts_check(o, err);
    if (rc) return rc;
    tlm_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) return tlm_err_set(err, TLM_ENOMEM, "trainer", "out of memory");
    tr->m = m;
    tr->opts = *o;
    tr->ws.par_min = PAR_MIN;
    tr->grad = malloc(m->n_params * sizeof(float));
    tr->adam_m = calloc(m->n_params, sizeof(float));
    tr->adam_v = calloc(m->n_params, sizeof(float));
    tr->tensors = malloc(MAX_TENSORS * sizeof(tensor_range));
    if (!tr->grad || !tr->adam_m || !tr->adam_v || !tr->tensors) {
        tlm_trainer_free(tr);
        return tlm_err_set(err, TLM_ENOMEM, "trainer",
                           "out of memory for the optimizer state of %zu parameters", m->n_params);
    }
    tr->n_tensors = tensor_table(m, tr->tensors);
    *out = tr;
    return 0;
}

void tlm_trainer_free(tlm_trainer *tr)
{
    if (!tr) return;
    free(tr->grad);
    free(tr->adam_m);
    free(tr->adam_v);
    free(tr->tensors);
    ws_free(&tr->ws);
    free(tr);
}

int tlm_trainer_step_count(const tlm_trainer *tr)
{
    return tr ? tr->step : 0;
}

const tlm_train_opts *tlm_trainer_opts(const tlm_trainer *tr)
{
    return tr ? &tr->opts : NULL;
}

int tlm_trainer_set_opts(tlm_trainer *tr, const tlm_train_opts *o, tlm_error *err)
{
    if (!tr) return tlm_err_set(err, TLM_EINVAL, "trainer", "no trainer given");
    int rc = tlm_train_opts_check(o, err);
    if (rc) return rc;
    tr->opts = *o;
    return 0;
}

void tlm_trainer_set_parallel_min(tlm_trainer *tr, size_t work)
{
    if (tr) tr->ws.par_min = work;
}

const float *tlm_trainer_grad(const tlm_trainer *tr)
{
    return tr && tr->have_grad ? tr->grad : NULL;
}

/* Chunks of the gradient whose squares are summed on one thread, then added in chunk order:
 * the same bits whatever the thread count. */
#define NORM_CHUNK 65536

static double grad_norm(const float *g, size_t n, size_t pm)
{
    size_t nc = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double *part = malloc((nc ? nc : 1) * sizeof(double));
    double total = 0.0;
    if (!part) { /* serial, same chunking, same bits */
        for (size_t c = 0; c < nc; c++) {
            double s = 0.0;
            for (size_t i = c * NORM_CHUNK; i < n && i < (c + 1) * NORM_CHUNK; i++)
                s += (double)g[i] * g[i];
            total += s;
        }
        return sqrt(total);
    }
#pragma omp parallel for schedule(static) if (n >= pm)
    for (size_t c = 0; c < nc; c++) {
        double s = 0.0;
        size_t end = (c + 1) * NORM_CHUNK < n ? (c + 1) * NORM_CHUNK : n;
        for (size_t i = c * NORM_CHUNK; i < end; i++)
            s += (double)g[i] * g[i];
        part[c] = s;
    }
    for (size_t c = 0; c < nc; c++)
        total += part[c];
    free(part);
    return sqrt(total);
}

/* p -= lr * (mhat / (sqrt(vhat) + eps) + decay * p) over one tensor, after the moment
 * updates; bias corrections come in as 1 / (1 - beta^t). */
static void adamw_update(float *p, const float *g, float *mom, float *var, size_t n, float lr,
                         float b1, float b2, float c1, float c2, float eps, float wd, size_t pm)
{
#pragma omp parallel for schedule(static) if (n >= pm)
    for (size_t i = 0; i < n; i++) {
        float mi = b1 * mom[i] + (1.0f - b1) * g[i];
        float vi = b2 * var[i] + (1.0f - b2) * g[i] * g[i];
        mom[i] = mi;
        var[i] = vi;
        float mhat = mi * c1, vhat = vi * c2;
        p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p[i]);
    }
}

int tlm_trainer_step(tlm_trainer *tr, const tlm_train_example *batch, int n, tlm_train_stats *st,
                     tlm_error *err)
{
    if (!tr) return tlm_err_set(err, TLM_EINVAL, "trainer", "no trainer given");
    if (tr->step == INT_MAX)
        return tlm_err_set(err, TLM_ELIMIT, "step", "step counter at its limit");
    tlm_model *m = tr->m;
    int rc = ws_prepare(&tr->ws, m, batch, n, err);
    if (rc) return rc;
    double loss = 0;
    tr->have_grad = 0; /* grad is overwritten from here on */
    rc = loss_grad(m, &tr->ws, &loss, tr->grad, NULL, err);
    if (rc) return rc;
    const size_t pm = tr->ws.par_min;
    double norm = grad_norm(tr->grad, m->n_params, pm);
    if (!isfinite(loss) || !isfinite(norm))
        return tlm_err_set(err, TLM_ERUNTIME, "grad",
                           "loss %g, gradient norm %g: not finite; no update made", loss, norm);
    const tlm_train_opts *o = &tr->opts;
    if (o->grad_clip > 0 && norm > o->grad_clip) {
        float s = (float)(o->grad_clip / norm);
        float *g = tr->grad;
        size_t np = m->n_params;
#pragma omp parallel for schedule(static) if (np >= pm)
        for (size_t i = 0; i < np; i++)
            g[i] *= s;
    }
    tr->have_grad = 1;
    double lr = tlm_train_lr(o, tr->step);
    int t = tr->step + 1;
    float c1 = (float)(1.0 / (1.0 - pow(o->beta1, t)));
    float c2 = (float)(1.0 / (1.0 - pow(o->beta2, t)));
    for (int k = 0; k < tr->n_tensors; k++) {
        const tensor_range *tn = &tr->tensors[k];
        adamw_update(m->params + tn->off, tr->grad + tn->off, tr->adam_m + tn->off,
                     tr->adam_v + tn->off, tn->n, (float)lr, (float)o->beta1, (float)o->beta2, c1,
                     c2, (float)o->eps, tn->decay ? (float)o->weight_decay : 0.0f, pm);
    }
    tr->step = t;
    if (st) {
        st->loss = loss;
        st->grad_norm = norm;
        st->lr = lr;
        st->tokens = (long)tr->ws.Rt;
        st->rows = (long)tr->ws.R;
        st->step = t;
    }
    return 0;
}

int tlm_trainer_eval(tlm_trainer *tr, const tlm_train_example *batch, int n, double *loss,
                     long *tokens, tlm_error *err)
{
    if (!tr) return tlm_err_set(err, TLM_EINVAL, "trainer", "no trainer given");
    int rc = ws_prepare(&tr->ws, tr->m, batch, n, err);
    if (rc) return rc;
    double l = 0;
    rc = loss_grad(tr->m, &tr->ws, &l, NULL, NULL, err);
    if (rc) return rc;
    if (loss) *loss = l;
    if (tokens) *tokens = (long)tr->ws.Rt;
    return 0;
}

/* ---- checkpoints ---- */

static const char CKPT_MAGIC[4] = {'T', 'L', 'M', 'C'};
enum { CKPT_DTYPE_F32 = 1 };

/* Header offsets (model_weights/README.md, "Trainer checkpoints"). */
enum {
    K_MAGIC = 0,
    K_VERSION = 4,
    K_HEADER_SIZE = 8,
    K_DTYPE = 12,
    K_N_LAYER = 16,
    K_N_HEAD = 20,
    K_N_EMBD = 24,
    K_N_CTX = 28,
    K_VOCAB = 32,
    K_RESERVED0 = 36,
    K_N_PARAMS = 40,
    K_FILE_SIZE = 48,
    K_STEP = 56,
    K_VOCAB_HASH = 64,
    K_PAYLOAD_SHA = 96,
    K_LR = 128,
    K_MIN_LR_FRAC = 136,
    K_WARMUP = 144,
    K_TOTAL = 152,
    K_BETA1 = 160,
    K_BETA2 = 168,
    K_EPS = 176,
    K_WD = 184,
    K_CLIP = 192,
    K_SEED = 200,
    K_RESERVED1 = 208, /* .. 251, zero */
    K_CHECKSUM = 252,
};

static void put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static void putf64(uint8_t *b, double d)
{
    uint64_t v;
    memcpy(&v, &d, 8);
    put64(b, v);
}
static uint32_t get32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t get64(const uint8_t *b)
{
    return (uint64_t)get32(b) | (uint64_t)get32(b + 4) << 32;
}
static double getf64(const uint8_t *b)
{
    uint64_t v = get64(b);
    double d;
    memcpy(&d, &v, 8);
    return d;
}

/* FNV-1a 32 over the header bytes before the checksum field. */
static uint32_t ckpt_checksum(const uint8_t *h)
{
    uint32_t x = 2166136261u;
    for (int i = 0; i < K_CHECKSUM; i++) {
        x ^= h[i];
        x *= 16777619u;
    }
    return x;
}

/* SHA-256 of params ‖ m ‖ v (n floats each). */
static int payload_sha(const float *p, const float *mo, const float *v, size_t n, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned len = 0;
    int ok =
        c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) &&
        EVP_DigestUpdate(c, p, n * sizeof(float)) && EVP_DigestUpdate(c, mo, n * sizeof(float)) &&
        EVP_DigestUpdate(c, v, n * sizeof(float)) && EVP_DigestFinal_ex(c, out, &len) && len == 32;
    EVP_MD_CTX_free(c);
    return ok ? 0 : -1;
}

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) return 1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int tlm_trainer_save(const tlm_trainer *tr, const char *path, tlm_error *err)
{
    if (!tr || !path) return tlm_err_set(err, TLM_EINVAL, "path", "no trainer or path given");
    const tlm_model *m = tr->m;
    const tlm_train_opts *o = &tr->opts;
    size_t n = m->n_params;
    uint8_t h[TLM_CKPT_HEADER_SIZE] = {0};
    memcpy(h + K_MAGIC, CKPT_MAGIC, 4);
    put32(h + K_VERSION, TLM_CKPT_VERSION);
    put32(h + K_HEADER_SIZE, TLM_CKPT_HEADER_SIZE);
    put32(h + K_DTYPE, CKPT_DTYPE_F32);
    put32(h + K_N_LAYER, (uint32_t)m->cfg.n_layer);
    put32(h + K_N_HEAD, (uint32_t)m->cfg.n_head);
    put32(h + K_N_EMBD, (uint32_t)m->cfg.n_embd);
    put32(h + K_N_CTX, (uint32_t)m->cfg.n_ctx);
    put32(h + K_VOCAB, (uint32_t)m->cfg.vocab_size);
    put64(h + K_N_PARAMS, (uint64_t)n);
    put64(h + K_FILE_SIZE, TLM_CKPT_HEADER_SIZE + 12 * (uint64_t)n);
    put64(h + K_STEP, (uint64_t)tr->step);
    memcpy(h + K_VOCAB_HASH, m->vocab_hash, TLM_HASH_SIZE);
    if (payload_sha(m->params, tr->adam_m, tr->adam_v, n, h + K_PAYLOAD_SHA))
        return tlm_err_set(err, TLM_ENOMEM, "payload_sha256", "SHA-256 failed");
    putf64(h + K_LR, o->lr);
    putf64(h + K_MIN_LR_FRAC, o->min_lr_frac);
    put64(h + K_WARMUP, (uint64_t)(int64_t)o->warmup_steps);
    put64(h + K_TOTAL, (uint64_t)(int64_t)o->total_steps);
    putf64(h + K_BETA1, o->beta1);
    putf64(h + K_BETA2, o->beta2);
    putf64(h + K_EPS, o->eps);
    putf64(h + K_WD, o->weight_decay);
    putf64(h + K_CLIP, o->grad_clip);
    put64(h + K_SEED, o->seed);
    put32(h + K_CHECKSUM, ckpt_checksum(h));

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return tlm_err_set(err, TLM_ENOMEM, "path", "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return tlm_err_set(err, TLM_EIO, "path", "cannot create %s.tmp: %s", path, strerror(e));
    }
    int bad = write_all(fd, h, sizeof h) || write_all(fd, m->params, n * sizeof(float)) ||
              write_all(fd, tr->adam_m, n * sizeof(float)) ||
              write_all(fd, tr->adam_v, n * sizeof(float));
    int e = errno;
    if (!bad && fsync(fd) != 0) bad = 1, e = errno;
    if (close(fd) != 0 && !bad) bad = 1, e = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, e = errno;
    if (bad) {
        unlink(tmp);
        free(tmp);
        return tlm_err_set(err, TLM_EIO, "path", "cannot write %s: %s", path, strerror(e));
    }
    free(tmp);
    return 0;
}

static int all_finite(const float *p, size_t n)
{
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= isfinite(p[i]) != 0;
    return ok;
}

static int load_fd(tlm_trainer *tr, int fd, const char *path, tlm_error *err)
{
    const tlm_model *m = tr->m;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return tlm_err_set(err, TLM_EIO, "file", "cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tlm_err_set(err, TLM_EINVAL, "file", "%s is not a regular file", path);
    if (st.st_size < TLM_CKPT_HEADER_SIZE)
        return tlm_err_set(err, TLM_EINVAL, "file",
                           "%s: %lld bytes, shorter than the %d-byte header (truncated)", path,
                           (long long)st.st_size, TLM_CKPT_HEADER_SIZE);
    uint8_t h[TLM_CKPT_HEADER_SIZE];
    if (read_all(fd, h, sizeof h))
        return tlm_err_set(err, TLM_EIO, "file", "cannot read the header of %s", path);
    if (memcmp(h + K_MAGIC, CKPT_MAGIC, 4) != 0)
        return tlm_err_set(err, TLM_EINVAL, "header.magic",
                           "%s is not a trainer checkpoint (magic is not TLMC)", path);
    if (get32(h + K_VERSION) != TLM_CKPT_VERSION)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "header.version",
                           "%s: checkpoint version %u; this build reads version %d", path,
                           get32(h + K_VERSION), TLM_CKPT_VERSION);
    if (get32(h + K_CHECKSUM) != ckpt_checksum(h))
        return tlm_err_set(err, TLM_EINVAL, "header.checksum",
                           "%s: the header does not match its checksum (corrupt file)", path);
    if (get32(h + K_HEADER_SIZE) != TLM_CKPT_HEADER_SIZE)
        return tlm_err_set(err, TLM_EINVAL, "header.header_size", "header_size %u; expected %d",
                           get32(h + K_HEADER_SIZE), TLM_CKPT_HEADER_SIZE);
    if (get32(h + K_DTYPE) != CKPT_DTYPE_F32)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "header.dtype", "dtype %u; only 1 (float32)",
                           get32(h + K_DTYPE));
    int reserved = get32(h + K_RESERVED0) != 0;
    for (int i = K_RESERVED1; i < K_CHECKSUM; i++)
        reserved |= h[i] != 0;
    if (reserved)
        return tlm_err_set(err, TLM_EINVAL, "header.reserved", "reserved header bytes not zero");
    static const char *const names[5] = {"config.n_layer", "config.n_head", "config.n_embd",
                                         "config.n_ctx", "config.vocab_size"};
    const int have[5] = {m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.n_ctx,
                         m->cfg.vocab_size};
    for (int i = 0; i < 5; i++) {
        uint32_t v = get32(h + K_N_LAYER + 4 * i);
        if (v != (uint32_t)have[i])
            return tlm_err_set(err, TLM_EINVAL, names[i],
                               "%s: the checkpoint's %s is %u; the model's is %d (a checkpoint "
                               "of another configuration)",
                               path, names[i] + 7, v, have[i]);
    }
    if (memcmp(h + K_VOCAB_HASH, m->vocab_hash, TLM_HASH_SIZE) != 0)
        return tlm_err_set(err, TLM_EINVAL, "vocab_hash",
                           "%s: trained for another vocabulary than the model's", path);
    uint64_t np = get64(h + K_N_PARAMS);
    if (np != (uint64_t)m->n_params)
        return tlm_err_set(err, TLM_EINVAL, "n_params", "n_params %llu; the configuration has %zu",
                           (unsigned long long)np, m->n_params);
    uint64_t fsz = get64(h + K_FILE_SIZE);
    if (fsz != TLM_CKPT_HEADER_SIZE + 12 * np)
        return tlm_err_set(err, TLM_EINVAL, "file_size", "file_size %llu; expected %llu",
                           (unsigned long long)fsz,
                           (unsigned long long)(TLM_CKPT_HEADER_SIZE + 12 * np));
    if ((uint64_t)st.st_size != fsz)
        return tlm_err_set(err, TLM_EINVAL, "file", "%s: %lld bytes, the header says %llu (%s)",
                           path, (long long)st.st_size, (unsigned long long)fsz,
                           (uint64_t)st.st_size < fsz ? "truncated" : "trailing data");
    uint64_t step = get64(h + K_STEP);
    if (step > INT_MAX)
        return tlm_err_set(err, TLM_EINVAL, "step", "step %llu; allowed 0..%d",
                           (unsigned long long)step, INT_MAX);
    tlm_train_opts o = {0};
    o.lr = getf64(h + K_LR);
    o.min_lr_frac = getf64(h + K_MIN_LR_FRAC);
    int64_t wu = (int64_t)get64(h + K_WARMUP), tot = (int64_t)get64(h + K_TOTAL);
    if (wu < 0 || wu > INT_MAX || tot < 0 || tot > INT_MAX)
        return tlm_err_set(err, TLM_EINVAL, "opts.warmup_steps",
                           "warmup_steps %lld / total_steps %lld out of range", (long long)wu,
                           (long long)tot);
    o.warmup_steps = (int)wu;
    o.total_steps = (int)tot;
    o.beta1 = getf64(h + K_BETA1);
    o.beta2 = getf64(h + K_BETA2);
    o.eps = getf64(h + K_EPS);
    o.weight_decay = getf64(h + K_WD);
    o.grad_clip = getf64(h + K_CLIP);
    o.seed = get64(h + K_SEED);
    int rc = tlm_train_opts_check(&o, err);
    if (rc) return rc;

    size_t n = (size_t)np;
    float *buf = malloc(3 * n * sizeof(float));
    if (!buf) return tlm_err_set(err, TLM_ENOMEM, "file", "out of memory");
    if (read_all(fd, buf, 3 * n * sizeof(float))) {
        free(buf);
        return tlm_err_set(err, TLM_EIO, "file", "cannot read %s (changed while reading?)", path);
    }
    uint8_t sha[32];
    if (payload_sha(buf, buf + n, buf + 2 * n, n, sha)) {
        free(buf);
        return tlm_err_set(err, TLM_ENOMEM, "payload_sha256", "SHA-256 failed");
    }
    if (memcmp(sha, h + K_PAYLOAD_SHA, 32) != 0) {
        free(buf);
        return tlm_err_set(err, TLM_EINVAL, "payload_sha256",
                           "%s: the tensor data does not match its SHA-256 (corrupt file)", path);
    }
    const char *bad = !all_finite(buf, n)           ? "params"
                      : !all_finite(buf + n, n)     ? "adam_m"
                      : !all_finite(buf + 2 * n, n) ? "adam_v"
                                                    : NULL;
    for (size_t i = 0; !bad && i < n; i++)
        if (buf[2 * n + i] < 0) bad = "adam_v";
    if (bad) {
        free(buf);
        return tlm_err_set(err, TLM_EINVAL, bad, "%s: %s holds a value that is not finite%s", path,
                           bad, strcmp(bad, "adam_v") ? "" : " or negative");
    }
    memcpy(tr->m->params, buf, n * sizeof(float));
    memcpy(tr->adam_m, buf + n, n * sizeof(float));
    memcpy(tr->adam_v, buf + 2 * n, n * sizeof(float));
    free(buf);
    tr->step = (int)step;
    tr->opts = o;
    tr->have_grad = 0;
    return 0;
}

int tlm_trainer_load(tlm_trainer *tr, const char *path, tlm_error *err)
{
    if (!tr || !path) return tlm_err_set(err, TLM_EINVAL, "path", "no trainer or path given");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tlm_err_set(err, errno == ENOENT ? TLM_ENOTFOUND : TLM_EIO, "path",
                           "cannot open %s: %s", path, strerror(errno));
    int rc = load_fd(tr, fd, path, err);
    close(fd);
    return rc;
}
