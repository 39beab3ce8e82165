/* forward.c — GPT-2 forward on the CPU over stacked rows of many sequences, with KV cache.
 *
 * llm.c style: each layer is a function over raw float arrays with the shapes in comments.
 * R is the number of new tokens in the call.
 *
 * Why every loop is written the way it is: the result for a row must be bitwise the same
 * whatever else is in the batch (tlm.h, "Batch invariance"). Matrix products go to tlm_gemm
 * (gemm.c), where each output element is one sequential fma chain over k, so a row's
 * products do not depend on the other rows, the thread or the instruction set (OpenBLAS,
 * used before, gave a row other bits when the batch changed on AVX2 hosts, even in
 * fixed-shape calls). The remaining loops give each row (or row and head) to one thread and
 * reduce in an order that depends only on the length (the *_fixed helpers), compiled
 * without -ffast-math so the compiler may not reassociate.
 */
#include "compiler/tlm/internal.h"
#include "compiler/tlm/tlm.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A parallel region costs microseconds on an idle machine, but on a busy one (the 2-core
 * build machine with other jobs) the team waits for descheduled threads and OpenMP's
 * spinning workers fight other pools: measured there, a 10M-parameter decode step of 64
 * rows took 655 ms with regions from 1M floats of work and 103 ms on one thread. So a
 * loop goes parallel only with several milliseconds of work: this many floats touched (or
 * multiply-adds, for attention), or GEMM_MACS_PER_UNIT times as many multiply-adds in a
 * matrix product. Decode steps stay on the calling thread; big prefills use the team. Which
 * thread computes a row (or an output column) changes nothing in its result. */
#define PAR_MIN (1 << 22)

/* A multiply-add in tlm_gemm's register-tiled kernel is far cheaper than a float in the
 * simple loops (about 0.02 ns at 32-64 rows on this host's AVX-512 path). With matrix
 * products parallel from 4M multiply-adds, the 2M model decoding 64 sequences on 2 threads
 * of the busy 2-core machine took 720 ms a step against 94 ms on one. */
#define GEMM_MACS_PER_UNIT 32

struct tlm_workspace {
    size_t par_min; /* see PAR_MIN */
    size_t cap_floats;
    float *buf;
    size_t cap_rows_meta;
    int *row_seq, *row_pos;
    /* The lm head as tlm_gemm wants it: wte (V, C) transposed to (C, V), made on the first
     * forward of a model and kept while the same model comes back (lm_head_for). */
    float *wte_t;
    size_t cap_wte_t;
    const tlm_model *wte_t_model;
    const float *wte_t_src;
    int wte_t_V, wte_t_C;
};

tlm_workspace *tlm_workspace_new(void)
{
    tlm_workspace *ws = calloc(1, sizeof(tlm_workspace));
    if (ws) ws->par_min = PAR_MIN;
    return ws;
}

void tlm_workspace_set_parallel_min(tlm_workspace *ws, size_t work)
{
    if (ws) ws->par_min = work;
}

void tlm_workspace_free(tlm_workspace *ws)
{
    if (!ws) return;
    free(ws->buf);
    free(ws->row_seq);
    free(ws->row_pos);
    free(ws->wte_t);
    free(ws);
}

int tlm_kv_new(const tlm_model *m, int capacity, tlm_kv **out, tlm_error *err)
{
    *out = NULL;
    if (!m) return tlm_err_set(err, TLM_EINVAL, "model", "no model given");
    if (capacity == 0) capacity = m->cfg.n_ctx;
    if (capacity < 1 || capacity > m->cfg.n_ctx)
        return tlm_err_set(err, TLM_EINVAL, "capacity", "KV capacity %d; allowed 1..n_ctx (%d)",
                           capacity, m->cfg.n_ctx);
    tlm_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return tlm_err_set(err, TLM_ENOMEM, "kv", "out of memory");
    kv->n_layer = m->cfg.n_layer;
    kv->n_embd = m->cfg.n_embd;
    kv->capacity = capacity;
    size_t n = (size_t)kv->n_layer * (size_t)capacity * (size_t)kv->n_embd;
    kv->k = malloc(n * sizeof(float));
    kv->v = malloc(n * sizeof(float));
    if (!kv->k || !kv->v) {
        tlm_kv_free(kv);
        return tlm_err_set(err, TLM_ENOMEM, "kv", "cannot allocate a KV cache of %d positions",
                           capacity);
    }
    *out = kv;
    return 0;
}

void tlm_kv_reset(tlm_kv *kv)
{
    if (kv) kv->len = 0;
}

int tlm_kv_copy(tlm_kv *dst, const tlm_kv *src, tlm_error *err)
{
    if (!dst || !src || dst->n_layer != src->n_layer || dst->n_embd != src->n_embd)
        return tlm_err_set(err, TLM_EINVAL, "kv", "KV caches of different models");
    if (src->len > dst->capacity)
        return tlm_err_set(err, TLM_ELIMIT, "kv.capacity",
                           "destination holds %d positions, source has %d", dst->capacity,
                           src->len);
    size_t C = (size_t)src->n_embd;
    for (int l = 0; l < src->n_layer; l++) {
        memcpy(dst->k + (size_t)l * dst->capacity * C, src->k + (size_t)l * src->capacity * C,
               (size_t)src->len * C * sizeof(float));
        memcpy(dst->v + (size_t)l * dst->capacity * C, src->v + (size_t)l * src->capacity * C,
               (size_t)src->len * C * sizeof(float));
    }
    dst->len = src->len;
    return 0;
}

void tlm_kv_free(tlm_kv *kv)
{
    if (!kv) return;
    free(kv->k);
    free(kv->v);
    free(kv);
}

/* out (R, N) = inp (R, K) @ w (K, N) + b (N); b may be NULL. */
static void matmul_forward(float *out, const float *inp, const float *w, const float *b, int R,
                           int K, int N, size_t par_min)
{
    size_t macs_min =
        par_min > SIZE_MAX / GEMM_MACS_PER_UNIT ? SIZE_MAX : par_min * GEMM_MACS_PER_UNIT;
    tlm_gemm(out, inp, w, (size_t)N, b, R, K, N, macs_min);
}

/* Entries of wte compared with the workspace's transposed copy before it is trusted. */
#define LM_HEAD_SAMPLES 64

/* wte transposed, (C, V), from ws's copy when it is this model's, else made now. A copy is
 * recognised by the model's address, its wte pointer and sizes, and LM_HEAD_SAMPLES entries
 * spread over wte (bitwise): a freed model whose successor reuses the address and its weight
 * memory is caught by the sample. Models are read-only after creation (tlm.h); one changed
 * in place needs a fresh workspace. NULL when out of memory. */
static const float *lm_head_for(tlm_workspace *ws, const tlm_model *m)
{
    const int V = m->cfg.vocab_size, C = m->cfg.n_embd;
    const size_t n = (size_t)V * C;
    if (ws->wte_t && ws->wte_t_model == m && ws->wte_t_src == m->wte && ws->wte_t_V == V &&
        ws->wte_t_C == C) {
        int same = 1;
        for (uint32_t s = 0; s < LM_HEAD_SAMPLES && same; s++) {
            /* s = 0 and 1: the first and the last entry; then a scatter */
            uint32_t v = s == 0 ? 0 : s == 1 ? (uint32_t)V - 1 : (s * 2654435761u) % (uint32_t)V;
            uint32_t k = s == 0 ? 0 : s == 1 ? (uint32_t)C - 1 : (s * 40503u + 7u) % (uint32_t)C;
            same =
                !memcmp(&m->wte[(size_t)v * C + k], &ws->wte_t[(size_t)k * V + v], sizeof(float));
        }
        if (same) return ws->wte_t;
    }
    if (n > ws->cap_wte_t) {
        free(ws->wte_t);
        ws->wte_t = malloc(n * sizeof(float));
        ws->cap_wte_t = ws->wte_t ? n : 0;
        if (!ws->wte_t) return NULL;
    }
    tlm_transpose(ws->wte_t, m->wte, V, C);
    ws->wte_t_model = m;
    ws->wte_t_src = m->wte;
    ws->wte_t_V = V;
    ws->wte_t_C = C;
    return ws->wte_t;
}

/* Fixed-order reductions. Eight interleaved partial sums (lane j takes i = j mod 8),
 * combined in one fixed tree, then the tail in index order: the order depends on n
 * only, so every row is reduced the same way, and GCC's vector extension (two 4-lane
 * vectors: SSE, no -march needed) lets it use SIMD without -ffast-math's licence to
 * reorder. */
typedef float v4f __attribute__((vector_size(16)));

static inline v4f load4(const float *p)
{
    v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store4(float *p, v4f v)
{
    memcpy(p, &v, sizeof v);
}

/* lanes 0..7 = a0[0..3], a1[0..3] */
static inline float hsum8(v4f a0, v4f a1)
{
    return ((a0[0] + a1[0]) + (a0[1] + a1[1])) + ((a0[2] + a1[2]) + (a0[3] + a1[3]));
}

static inline float dot_fixed(const float *a, const float *b, int n)
{
    v4f a0 = {0}, a1 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += load4(a + i) * load4(b + i);
        a1 += load4(a + i + 4) * load4(b + i + 4);
    }
    float s = hsum8(a0, a1);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static inline float sum_fixed(const float *a, int n)
{
    v4f a0 = {0}, a1 = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += load4(a + i);
        a1 += load4(a + i + 4);
    }
    float s = hsum8(a0, a1);
    for (; i < n; i++)
        s += a[i];
    return s;
}

/* o (n) += a * x (n) */
static inline void axpy(float *o, float a, const float *x, int n)
{
    v4f av = {a, a, a, a};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        store4(o + i, load4(o + i) + av * load4(x + i));
    for (; i < n; i++)
        o[i] += a * x[i];
}

/* out (R, C) = LayerNorm(inp (R, C)) * w + b, eps 1e-5 as GPT-2. out may be inp. */
static void layernorm_forward(float *out, const float *inp, const float *w, const float *b, int R,
                              int C, size_t par_min)
{
#pragma omp parallel for schedule(static) if ((size_t)R * C >= par_min)
    for (int r = 0; r < R; r++) {
        const float *x = inp + (size_t)r * C;
        float *o = out + (size_t)r * C;
        float mean = sum_fixed(x, C) / (float)C;
        v4f a0 = {0}, a1 = {0}, mv = {mean, mean, mean, mean};
        int i = 0;
        for (; i + 8 <= C; i += 8) {
            v4f d0 = load4(x + i) - mv, d1 = load4(x + i + 4) - mv;
            a0 += d0 * d0;
            a1 += d1 * d1;
        }
        float var = hsum8(a0, a1);
        for (; i < C; i++)
            var += (x[i] - mean) * (x[i] - mean);
        var /= (float)C;
        float rstd = 1.0f / sqrtf(var + 1e-5f);
        for (i = 0; i < C; i++)
            o[i] = (x[i] - mean) * rstd * w[i] + b[i];
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2/pi) */

/* x (N) = GELU(x), tanh approximation as GPT-2. tanh(u) = 1 - 2 / (exp(2u) + 1): expf is
 * several times cheaper than tanhf, and GELU only needs 1 + tanh(u), where this form loses
 * nothing (absolute error ~1e-7); exp overflow gives exactly +-1. */
static void gelu_forward(float *x, size_t n, size_t par_min)
{
#pragma omp parallel for schedule(static) if (n >= par_min)
    for (size_t i = 0; i < n; i++) {
        float v = x[i];
        float u = GELU_SCALE * (v + 0.044715f * v * v * v);
        float t = 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
        x[i] = 0.5f * v * (1.0f + t);
    }
}

/* x (n) += d (n) */
static void residual_forward(float *x, const float *d, size_t n, size_t par_min)
{
#pragma omp parallel for schedule(static) if (n >= par_min)
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* Causal attention of every new row against its sequence's cache for layer l.
 * qkv (R, 3C) holds each row's q | k | v; the k and v of all new rows are already in the
 * caches, so row r at position p attends to cache positions 0..p. out (R, C).
 * scratch: n_threads * n_ctx floats. */
static void attention_forward(float *out, const float *qkv, const tlm_seq *seqs, const int *row_seq,
                              const int *row_pos, int R, int l, int C, int NH, float *scratch,
                              int n_ctx, size_t par_min)
{
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    long items = (long)R * NH;
    double work = 0; /* multiply-adds: q.k and p.v over every attended position */
    for (int r = 0; r < R; r++)
        work += 2.0 * (row_pos[r] + 1) * C;
#pragma omp parallel for schedule(dynamic, 4) if (work >= par_min)
    for (long it = 0; it < items; it++) {
        int r = (int)(it / NH), h = (int)(it % NH);
        const tlm_kv *kv = seqs[row_seq[r]].kv;
        int pos = row_pos[r];
        const float *q = qkv + (size_t)r * 3 * C + (size_t)h * hs;
        const float *kb = kv->k + (size_t)l * kv->capacity * C + (size_t)h * hs;
        const float *vb = kv->v + (size_t)l * kv->capacity * C + (size_t)h * hs;
        float *att = scratch + (size_t)omp_get_thread_num() * n_ctx;

        float maxv = -INFINITY;
        for (int t = 0; t <= pos; t++) {
            float s = dot_fixed(q, kb + (size_t)t * C, hs) * scale;
            att[t] = s;
            if (s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (int t = 0; t <= pos; t++) {
            float e = expf(att[t] - maxv);
            att[t] = e;
            sum += e;
        }
        float inv = 1.0f / sum;
        float *o = out + (size_t)r * C + (size_t)h * hs;
        memset(o, 0, (size_t)hs * sizeof(float));
        for (int t = 0; t <= pos; t++)
            axpy(o, att[t] * inv, vb + (size_t)t * C, hs);
    }
}

size_t tlm__round_up(size_t n, size_t k)
{
    return (n + k - 1) / k * k;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t) * (void *const *)a, y = (uintptr_t) * (void *const *)b;
    return x < y ? -1 : x > y;
}

int tlm__check_batch(const tlm_model *m, const tlm_seq *seqs, int n_seqs, size_t *R_out,
                     size_t *Rl_out, int *T_out, tlm_error *err)
{
    if (!m || !seqs || n_seqs < 1)
        return tlm_err_set(err, TLM_EINVAL, "seqs", "no model or no sequences given");
    size_t R = 0, Rl = 0;
    int T = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tlm_seq *q = &seqs[s];
        char field[48];
        snprintf(field, sizeof field, "seqs[%d]", s);
        if (!q->kv || !q->tokens)
            return tlm_err_set(err, TLM_EINVAL, field, "sequence without KV cache or tokens");
        if (q->kv->n_layer != m->cfg.n_layer || q->kv->n_embd != m->cfg.n_embd ||
            q->kv->capacity > m->cfg.n_ctx)
            return tlm_err_set(err, TLM_EINVAL, field, "KV cache belongs to another model");
        if (q->n_tokens < 1)
            return tlm_err_set(err, TLM_EINVAL, field, "n_tokens is %d; at least 1 needed",
                               q->n_tokens);
        if (q->n_tokens > q->kv->capacity - q->kv->len)
            return tlm_err_set(err, TLM_ELIMIT, field,
                               "%d new tokens do not fit: the KV cache holds %d of %d positions",
                               q->n_tokens, q->kv->len, q->kv->capacity);
        for (int i = 0; i < q->n_tokens; i++)
            if (q->tokens[i] < 0 || q->tokens[i] >= m->cfg.vocab_size)
                return tlm_err_set(err, TLM_EINVAL, field, "token %d at %d outside 0..%d",
                                   q->tokens[i], i, m->cfg.vocab_size - 1);
        R += (size_t)q->n_tokens;
        if (q->logits) Rl += q->all_logits ? (size_t)q->n_tokens : 1;
        if (q->kv->len + q->n_tokens > T) T = q->kv->len + q->n_tokens;
    }
    const void **kvs = malloc((size_t)n_seqs * sizeof *kvs);
    if (!kvs) return tlm_err_set(err, TLM_ENOMEM, "seqs", "out of memory");
    for (int s = 0; s < n_seqs; s++)
        kvs[s] = seqs[s].kv;
    qsort(kvs, (size_t)n_seqs, sizeof *kvs, cmp_ptr);
    int dup = 0;
    for (int s = 1; s < n_seqs; s++)
        dup |= kvs[s] == kvs[s - 1];
    free(kvs);
    if (dup) return tlm_err_set(err, TLM_EINVAL, "seqs", "one KV cache appears twice in a batch");
    if (R > (size_t)INT32_MAX / 4)
        return tlm_err_set(err, TLM_ELIMIT, "seqs", "%zu rows in one call; too many", R);
    *R_out = R;
    *Rl_out = Rl;
    if (T_out) *T_out = T;
    return 0;
}

int tlm_forward_batch(const tlm_model *m, tlm_workspace *ws, const tlm_seq *seqs, int n_seqs,
                      tlm_error *err)
{
    size_t R = 0, Rl = 0;
    int rc = tlm__check_batch(m, seqs, n_seqs, &R, &Rl, NULL, err);
    if (rc) return rc;
    if (!ws) return tlm_err_set(err, TLM_EINVAL, "workspace", "no workspace given");
    const int C = m->cfg.n_embd, V = m->cfg.vocab_size, NH = m->cfg.n_head, T = m->cfg.n_ctx;
    const int nthr = omp_get_max_threads();
    const size_t pm = ws->par_min;

    /* One buffer: x, h, att, tmp (R, C); qkv (R, 3C); fc (R, 4C); lm_in (Rl, C);
     * lm_out (Rl, V); attention scratch (threads, T). */
    size_t need = R * (size_t)C * 11 + Rl * (size_t)C + Rl * (size_t)V + (size_t)nthr * T;
    if (need > ws->cap_floats) {
        free(ws->buf);
        ws->buf = malloc(need * sizeof(float));
        ws->cap_floats = ws->buf ? need : 0;
        if (!ws->buf) return tlm_err_set(err, TLM_ENOMEM, "workspace", "out of memory");
    }
    if (R > ws->cap_rows_meta) {
        free(ws->row_seq);
        free(ws->row_pos);
        ws->row_seq = malloc(R * sizeof(int));
        ws->row_pos = malloc(R * sizeof(int));
        ws->cap_rows_meta = (ws->row_seq && ws->row_pos) ? R : 0;
        if (!ws->cap_rows_meta) return tlm_err_set(err, TLM_ENOMEM, "workspace", "out of memory");
    }
    /* Made before any cache changes, so running out of memory leaves them untouched. */
    const float *wte_t = Rl ? lm_head_for(ws, m) : NULL;
    if (Rl && !wte_t) return tlm_err_set(err, TLM_ENOMEM, "workspace", "out of memory");
    float *x = ws->buf;               /* (R, C) residual stream */
    float *h = x + R * C;             /* (R, C) LayerNorm output */
    float *att = h + R * C;           /* (R, C) attention output */
    float *tmp = att + R * C;         /* (R, C) projection output */
    float *qkv = tmp + R * C;         /* (R, 3C) */
    float *fc = qkv + R * 3 * C;      /* (R, 4C) */
    float *lm_in = fc + R * 4 * C;    /* (Rl, C) */
    float *lm_out = lm_in + Rl * C;   /* (Rl, V) */
    float *scratch = lm_out + Rl * V; /* (nthr, T) */
    int *row_seq = ws->row_seq, *row_pos = ws->row_pos;

    /* Embeddings: x[r] = wte[token] + wpe[position]. */
    size_t r = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int i = 0; i < seqs[s].n_tokens; i++, r++) {
            row_seq[r] = s;
            row_pos[r] = seqs[s].kv->len + i;
        }
#pragma omp parallel for schedule(static) if (R * C >= pm)
    for (size_t i = 0; i < R; i++) {
        const tlm_seq *q = &seqs[row_seq[i]];
        int tok = q->tokens[row_pos[i] - q->kv->len];
        const float *te = m->wte + (size_t)tok * C, *pe = m->wpe + (size_t)row_pos[i] * C;
        float *o = x + i * C;
        for (int c = 0; c < C; c++)
            o[c] = te[c] + pe[c];
    }

    const int Ri = (int)R;
    for (int l = 0; l < m->cfg.n_layer; l++) {
        const tlm_layer *ly = &m->layers[l];
        layernorm_forward(h, x, ly->ln1_w, ly->ln1_b, Ri, C, pm);
        matmul_forward(qkv, h, ly->qkv_w, ly->qkv_b, Ri, C, 3 * C, pm);
        /* Append this layer's k and v of every new row to its cache first, so attention
         * of a later row of the same sequence sees them. */
#pragma omp parallel for schedule(static) if (R * C >= pm)
        for (size_t i = 0; i < R; i++) {
            tlm_kv *kv = seqs[row_seq[i]].kv;
            size_t off = ((size_t)l * kv->capacity + (size_t)row_pos[i]) * C;
            memcpy(kv->k + off, qkv + i * 3 * C + C, (size_t)C * sizeof(float));
            memcpy(kv->v + off, qkv + i * 3 * C + 2 * C, (size_t)C * sizeof(float));
        }
        attention_forward(att, qkv, seqs, row_seq, row_pos, Ri, l, C, NH, scratch, T, pm);
        matmul_forward(tmp, att, ly->attn_proj_w, ly->attn_proj_b, Ri, C, C, pm);
        residual_forward(x, tmp, R * C, pm);
        layernorm_forward(h, x, ly->ln2_w, ly->ln2_b, Ri, C, pm);
        matmul_forward(fc, h, ly->fc_w, ly->fc_b, Ri, C, 4 * C, pm);
        gelu_forward(fc, R * 4 * C, pm);
        matmul_forward(tmp, fc, ly->fc_proj_w, ly->fc_proj_b, Ri, 4 * C, C, pm);
        residual_forward(x, tmp, R * C, pm);
    }

    for (int s = 0; s < n_seqs; s++)
        seqs[s].kv->len += seqs[s].n_tokens;
    if (Rl == 0) return 0;

    /* Final LayerNorm and the tied lm head only for the rows whose logits are wanted. */
    size_t lr = 0;
    r = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tlm_seq *q = &seqs[s];
        if (q->logits) {
            int first = q->all_logits ? 0 : q->n_tokens - 1;
            for (int i = first; i < q->n_tokens; i++, lr++)
                memcpy(lm_in + lr * C, x + (r + i) * C, (size_t)C * sizeof(float));
        }
        r += (size_t)q->n_tokens;
    }
    layernorm_forward(lm_in, lm_in, m->lnf_w, m->lnf_b, (int)Rl, C, pm);
    matmul_forward(lm_out, lm_in, wte_t, NULL, (int)Rl, C, V, pm);
    lr = 0;
    for (int s = 0; s < n_seqs; s++) {
        const tlm_seq *q = &seqs[s];
        if (!q->logits) continue;
        size_t n = q->all_logits ? (size_t)q->n_tokens : 1;
        memcpy(q->logits, lm_out + lr * V, n * V * sizeof(float));
        lr += n;
    }
    return 0;
}
