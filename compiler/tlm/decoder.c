/* decoder.c — continuous batching over request slots, greedy and beam search under masks.
 *
 * A request holds up to `width` active beams (greedy is width 1). Each beam is a token
 * history plus a KV cache holding the first kv->len of those tokens; the rest are pending
 * and go into the next forward pass. After a token is chosen, the mask callback is asked
 * about the next position right away: forced tokens are appended on the spot (so a run of
 * forced tokens costs no forward pass of its own, they are prefilled with the next step)
 * until the callback asks for a choice, stops the sequence, or max_new_tokens is reached.
 *
 * Choosing is deterministic: within a beam, candidates are ranked by logit (ties to the
 * lower token id); across beams by score (sum of log-softmax over the allowed tokens,
 * computed in double), then parent beam index, then token id. Because tlm_forward_batch
 * makes each row's logits independent of the batch, the tokens a request gets do not
 * depend on what else was decoded with it. A request's preference callback names one token
 * per position whose logit gains a bonus before ranking and scoring (the select layer's prior
 * on the default schedule).
 *
 * With a device (tlm_decoder_set_device) the caches are made there and the forward pass runs
 * there; caches are freed with tlm_kv_free_dev, which frees either kind.
 */
#include "compiler/tlm/tlm.h"
#include "compiler/tlm/tlm_cuda.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct beam {
    int32_t *tok;   /* (cap) prompt then generated tokens */
    int n;          /* tokens so far */
    tlm_kv *kv;     /* holds tok[0 .. kv->len) */
    uint64_t *mask; /* (words) allowed next tokens */
    int32_t prefer; /* the token the preference callback favours next, or -1 */
    double score;
    int parent; /* while building the next generation: index in cur */
} beam;

typedef struct hyp {
    int32_t *tok; /* (cap) */
    int n;
    double score;
} hyp;

typedef struct cand {
    double score;
    int parent;
    int32_t token;
} cand;

typedef struct req {
    tlm_slot_state state;
    int n_prompt, max_new, width, cap;
    tlm_mask_fn fn;
    tlm_prefer_fn prefer;
    float bonus;
    void *user;
    beam *cur, *nxt; /* (width) each; nxt is scratch for the next generation */
    int n_cur;
    hyp *fin; /* (width) best first */
    int n_fin;
    tlm_kv **kv_pool; /* (width) free caches */
    int n_pool;
    cand *cands;                /* (width * width) */
    unsigned char *parent_used; /* (width) */
    int row0;                   /* first logits row of this request in the current step */
    tlm_error err;
} req;

struct tlm_decoder {
    const tlm_model *m;
    tlm_device *dev; /* NULL: the CPU path (d->ws) */
    int max_slots, words, n_active;
    req *slots;
    uint64_t *full_mask; /* all V tokens, for requests without a mask callback */
    tlm_workspace *ws;
    tlm_seq *seqs;
    float *logits;
    size_t cap_rows;
};

int tlm_decoder_new(const tlm_model *m, int max_slots, tlm_decoder **out, tlm_error *err)
{
    *out = NULL;
    if (!m) return tlm_err_set(err, TLM_EINVAL, "model", "no model given");
    if (max_slots < 1 || max_slots > 65536)
        return tlm_err_set(err, TLM_EINVAL, "max_slots", "max_slots is %d; allowed 1..65536",
                           max_slots);
    tlm_decoder *d = calloc(1, sizeof *d);
    if (!d) return tlm_err_set(err, TLM_ENOMEM, "decoder", "out of memory");
    d->m = m;
    d->max_slots = max_slots;
    d->words = (m->cfg.vocab_size + 63) / 64;
    d->slots = calloc((size_t)max_slots, sizeof *d->slots);
    d->full_mask = calloc((size_t)d->words, sizeof(uint64_t));
    d->ws = tlm_workspace_new();
    if (!d->slots || !d->full_mask || !d->ws) {
        tlm_decoder_free(d);
        return tlm_err_set(err, TLM_ENOMEM, "decoder", "out of memory");
    }
    for (int t = 0; t < m->cfg.vocab_size; t++)
        tlm_bitset_set(d->full_mask, t);
    *out = d;
    return 0;
}

static void req_free_kvs(req *q)
{
    for (int i = 0; i < q->n_cur; i++) {
        tlm_kv_free_dev(q->cur[i].kv);
        q->cur[i].kv = NULL;
    }
    q->n_cur = 0;
    for (int i = 0; i < q->n_pool; i++)
        tlm_kv_free_dev(q->kv_pool[i]);
    q->n_pool = 0;
}

static void req_free(req *q)
{
    req_free_kvs(q);
    for (int i = 0; q->cur && i < q->width; i++) {
        free(q->cur[i].tok);
        free(q->cur[i].mask);
        free(q->nxt[i].tok);
        free(q->nxt[i].mask);
        free(q->fin[i].tok);
    }
    free(q->cur);
    free(q->nxt);
    free(q->fin);
    free(q->kv_pool);
    free(q->cands);
    free(q->parent_used);
    memset(q, 0, sizeof *q);
}

void tlm_decoder_free(tlm_decoder *d)
{
    if (!d) return;
    for (int i = 0; d->slots && i < d->max_slots; i++)
        req_free(&d->slots[i]);
    free(d->slots);
    free(d->full_mask);
    tlm_workspace_free(d->ws);
    free(d->seqs);
    free(d->logits);
    free(d);
}

enum { RES_ACTIVE, RES_DONE, RES_ERROR };

/* Asks the mask about beam b's next position, appending forced tokens, until a choice is
 * needed (RES_ACTIVE, b->mask filled), the sequence ends (RES_DONE) or something is wrong
 * (RES_ERROR, q->err filled). */
static int resolve(const tlm_decoder *d, req *q, beam *b)
{
    const int V = d->m->cfg.vocab_size;
    b->prefer = -1;
    for (;;) {
        if (b->n - q->n_prompt >= q->max_new) return RES_DONE;
        if (!q->fn) {
            memcpy(b->mask, d->full_mask, (size_t)d->words * sizeof(uint64_t));
            return RES_ACTIVE;
        }
        memset(b->mask, 0, (size_t)d->words * sizeof(uint64_t));
        int32_t forced = -1;
        tlm_error e = {0};
        int rc = q->fn(q->user, b->tok, b->n, q->n_prompt, b->mask, &forced, &e);
        if (rc < 0) {
            if (e.msg[0])
                q->err = e;
            else
                tlm_err_set(&q->err, rc, "mask", "the mask callback failed (%s) at position %d",
                            tlm_err_code_name(rc), b->n);
            if (!q->err.code) q->err.code = rc;
            return RES_ERROR;
        }
        if (rc == TLM_MASK_STOP) return RES_DONE;
        if (rc != TLM_MASK_NEXT) {
            tlm_err_set(&q->err, TLM_EINVAL, "mask", "the mask callback returned %d", rc);
            return RES_ERROR;
        }
        if (forced != -1) {
            if (forced < 0 || forced >= V) {
                tlm_err_set(&q->err, TLM_EINVAL, "mask.forced",
                            "forced token %d at position %d outside 0..%d", forced, b->n, V - 1);
                return RES_ERROR;
            }
            b->tok[b->n++] = forced;
            continue;
        }
        if (V % 64) b->mask[d->words - 1] &= (UINT64_C(1) << (V % 64)) - 1;
        int any = 0;
        for (int w = 0; w < d->words && !any; w++)
            any = b->mask[w] != 0;
        if (!any) {
            tlm_err_set(&q->err, TLM_EINVAL, "mask",
                        "the mask allowed no token at position %d and forced none", b->n);
            return RES_ERROR;
        }
        if (q->prefer) {
            int32_t t = q->prefer(q->user, b->tok, b->n, q->n_prompt);
            if (t >= 0 && t < V && tlm_bitset_get(b->mask, t)) b->prefer = t;
        }
        return RES_ACTIVE;
    }
}

static int get_kv(const tlm_decoder *d, req *q, tlm_kv **out)
{
    if (q->n_pool > 0) {
        *out = q->kv_pool[--q->n_pool];
        tlm_kv_reset(*out);
        return 0;
    }
    return tlm_kv_new_dev(d->dev, d->m, q->cap, out, &q->err);
}

/* Records a finished beam, keeping fin sorted best first (equal scores: earlier first) and
 * at most width long. */
static void add_finished(req *q, const beam *b)
{
    int pos = q->n_fin;
    while (pos > 0 && q->fin[pos - 1].score < b->score)
        pos--;
    if (pos >= q->width) return;
    int last = q->n_fin < q->width ? q->n_fin : q->width - 1;
    int32_t *buf = q->fin[last].tok; /* dropped or unused entry: reuse its buffer */
    memmove(&q->fin[pos + 1], &q->fin[pos], (size_t)(last - pos) * sizeof(hyp));
    q->fin[pos].tok = buf;
    memcpy(buf, b->tok, (size_t)b->n * sizeof(int32_t));
    q->fin[pos].n = b->n;
    q->fin[pos].score = b->score;
    if (q->n_fin < q->width) q->n_fin++;
}

static void req_finish(tlm_decoder *d, req *q, tlm_slot_state st)
{
    req_free_kvs(q);
    if (q->state == TLM_SLOT_ACTIVE) d->n_active--;
    q->state = st;
}

int tlm_decoder_add(tlm_decoder *d, const tlm_request *r, tlm_error *err)
{
    if (!d || !r) return tlm_err_set(err, TLM_EINVAL, "request", "no decoder or request given");
    const tlm_config *cfg = &d->m->cfg;
    int width = r->beam_width < 1 ? 1 : r->beam_width;
    if (width > TLM_MAX_BEAM)
        return tlm_err_set(err, TLM_ELIMIT, "beam_width", "beam_width is %d; allowed 1..%d",
                           r->beam_width, TLM_MAX_BEAM);
    if (!r->prompt || r->n_prompt < 1)
        return tlm_err_set(err, TLM_EINVAL, "n_prompt", "the prompt needs at least one token");
    if (r->prefer && (!r->mask || !(r->prefer_bonus >= 0.0f) || !isfinite(r->prefer_bonus)))
        return tlm_err_set(err, TLM_EINVAL, "prefer",
                           "a preference needs a mask callback and a finite bonus >= 0");
    if (r->max_new_tokens < 1)
        return tlm_err_set(err, TLM_EINVAL, "max_new_tokens", "max_new_tokens is %d; at least 1",
                           r->max_new_tokens);
    if (r->n_prompt > cfg->n_ctx || r->max_new_tokens > cfg->n_ctx - r->n_prompt)
        return tlm_err_set(err, TLM_ELIMIT, "max_new_tokens",
                           "prompt (%d tokens) + max_new_tokens (%d) exceed the model context %d",
                           r->n_prompt, r->max_new_tokens, cfg->n_ctx);
    for (int i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= cfg->vocab_size)
            return tlm_err_set(err, TLM_EINVAL, "prompt", "prompt token %d at %d outside 0..%d",
                               r->prompt[i], i, cfg->vocab_size - 1);
    int slot = -1;
    for (int i = 0; i < d->max_slots && slot < 0; i++)
        if (d->slots[i].state == TLM_SLOT_FREE) slot = i;
    if (slot < 0)
        return tlm_err_set(err, TLM_ELIMIT, "slots", "all %d decoder slots are busy", d->max_slots);

    req *q = &d->slots[slot];
    memset(q, 0, sizeof *q);
    q->n_prompt = r->n_prompt;
    q->max_new = r->max_new_tokens;
    q->width = width;
    q->cap = r->n_prompt + r->max_new_tokens;
    q->fn = r->mask;
    q->prefer = r->prefer;
    q->bonus = r->prefer_bonus;
    q->user = r->user;
    q->cur = calloc((size_t)width, sizeof(beam));
    q->nxt = calloc((size_t)width, sizeof(beam));
    q->fin = calloc((size_t)width, sizeof(hyp));
    q->kv_pool = calloc((size_t)width, sizeof(tlm_kv *));
    q->cands = calloc((size_t)width * width, sizeof(cand));
    q->parent_used = calloc((size_t)width, 1);
    int ok = q->cur && q->nxt && q->fin && q->kv_pool && q->cands && q->parent_used;
    for (int i = 0; ok && i < width; i++) {
        q->cur[i].tok = malloc((size_t)q->cap * sizeof(int32_t));
        q->nxt[i].tok = malloc((size_t)q->cap * sizeof(int32_t));
        q->fin[i].tok = malloc((size_t)q->cap * sizeof(int32_t));
        q->cur[i].mask = malloc((size_t)d->words * sizeof(uint64_t));
        q->nxt[i].mask = malloc((size_t)d->words * sizeof(uint64_t));
        ok = q->cur[i].tok && q->nxt[i].tok && q->fin[i].tok && q->cur[i].mask && q->nxt[i].mask;
    }
    if (!ok) {
        req_free(q);
        return tlm_err_set(err, TLM_ENOMEM, "request", "out of memory");
    }
    beam *b = &q->cur[0];
    memcpy(b->tok, r->prompt, (size_t)r->n_prompt * sizeof(int32_t));
    b->n = r->n_prompt;
    b->score = 0.0;
    int res = resolve(d, q, b);
    if (res == RES_ERROR) {
        tlm_error e = q->err;
        req_free(q);
        if (err) *err = e;
        return e.code ? e.code : TLM_EINVAL;
    }
    if (res == RES_DONE) {
        add_finished(q, b);
        q->state = TLM_SLOT_DONE;
        return slot;
    }
    if (get_kv(d, q, &b->kv) != 0) {
        tlm_error e = q->err;
        req_free(q);
        if (err) *err = e;
        return TLM_ENOMEM;
    }
    q->n_cur = 1;
    q->state = TLM_SLOT_ACTIVE;
    d->n_active++;
    return slot;
}

/* Ranks within one beam's allowed tokens: top k by logit, ties to the lower id. Writes the
 * candidates with their scores; returns how many. */
static int beam_candidates(const tlm_decoder *d, const req *q, int bi, const float *lg, cand *out)
{
    const beam *b = &q->cur[bi];
    const int V = d->m->cfg.vocab_size;
    /* the preferred token's logit with its bonus (the others as they are) */
#define LOGIT(t) ((t) == b->prefer ? lg[t] + q->bonus : lg[t])
    int k = 0;
    float maxv = -INFINITY;
    for (int t = 0; t < V; t++) {
        if (!tlm_bitset_get(b->mask, t)) continue;
        float v = LOGIT(t);
        if (v > maxv) maxv = v;
        /* insertion into out[0..k), best first; equal logits keep the lower id first */
        int pos = k < q->width ? k : q->width;
        while (pos > 0 && LOGIT(out[pos - 1].token) < v)
            pos--;
        if (pos >= q->width) continue;
        int last = k < q->width ? k : q->width - 1;
        memmove(&out[pos + 1], &out[pos], (size_t)(last - pos) * sizeof(cand));
        out[pos].token = t;
        out[pos].parent = bi;
        if (k < q->width) k++;
    }
    double sum = 0.0;
    for (int t = 0; t < V; t++)
        if (tlm_bitset_get(b->mask, t)) sum += exp((double)LOGIT(t) - (double)maxv);
    double lse = (double)maxv + log(sum);
    for (int i = 0; i < k; i++)
        out[i].score = b->score + ((double)LOGIT(out[i].token) - lse);
#undef LOGIT
    return k;
}

static int cand_cmp(const void *pa, const void *pb)
{
    const cand *a = pa, *b = pb;
    if (a->score != b->score) return a->score > b->score ? -1 : 1;
    if (a->parent != b->parent) return a->parent < b->parent ? -1 : 1;
    return (a->token > b->token) - (a->token < b->token);
}

/* After a failure half-way through handing out caches, a cache may be referenced from
 * cur, nxt and the pool at once: free every distinct one. */
static void free_all_kvs(req *q, int n_new)
{
    tlm_kv *all[3 * TLM_MAX_BEAM];
    int n = 0;
    for (int i = 0; i < q->n_cur; i++)
        all[n++] = q->cur[i].kv;
    for (int i = 0; i < n_new; i++)
        all[n++] = q->nxt[i].kv;
    for (int i = 0; i < q->n_pool; i++)
        all[n++] = q->kv_pool[i];
    for (int i = 0; i < n; i++) {
        int seen = all[i] == NULL;
        for (int j = 0; j < i && !seen; j++)
            seen = all[j] == all[i];
        if (!seen) tlm_kv_free_dev(all[i]);
    }
    for (int i = 0; i < q->n_cur; i++)
        q->cur[i].kv = NULL;
    for (int i = 0; i < n_new; i++)
        q->nxt[i].kv = NULL;
    q->n_cur = 0;
    q->n_pool = 0;
}

/* Takes the logits of every active beam of q and builds the next generation. */
static void advance(tlm_decoder *d, req *q, const float *logits)
{
    const int V = d->m->cfg.vocab_size;
    int nc = 0;
    for (int bi = 0; bi < q->n_cur; bi++)
        nc += beam_candidates(d, q, bi, logits + (size_t)(q->row0 + bi) * V, q->cands + nc);
    if (q->n_cur > 1) qsort(q->cands, (size_t)nc, sizeof(cand), cand_cmp);

    int n_new = 0;
    for (int i = 0; i < nc && n_new < q->width; i++) {
        const cand *c = &q->cands[i];
        if (q->n_fin == q->width && c->score <= q->fin[q->width - 1].score) break;
        const beam *p = &q->cur[c->parent];
        beam *b = &q->nxt[n_new];
        memcpy(b->tok, p->tok, (size_t)p->n * sizeof(int32_t));
        b->n = p->n;
        b->tok[b->n++] = c->token;
        b->score = c->score;
        b->parent = c->parent;
        b->kv = NULL;
        int res = resolve(d, q, b);
        if (res == RES_ERROR) {
            req_finish(d, q, TLM_SLOT_FAILED);
            return;
        }
        if (res == RES_DONE)
            add_finished(q, b);
        else
            n_new++;
    }
    if (n_new == 0 || (q->n_fin == q->width && q->nxt[0].score <= q->fin[q->width - 1].score)) {
        req_finish(d, q, TLM_SLOT_DONE);
        return;
    }

    /* Caches: the first child of a parent inherits its cache, other children get a copy;
     * caches of parents without children go back to the pool first, so copies never
     * need more than width caches in all. */
    memset(q->parent_used, 0, (size_t)q->width);
    for (int j = 0; j < n_new; j++) {
        beam *b = &q->nxt[j];
        if (!q->parent_used[b->parent]) {
            q->parent_used[b->parent] = 1;
            b->kv = q->cur[b->parent].kv;
        }
    }
    for (int bi = 0; bi < q->n_cur; bi++)
        if (!q->parent_used[bi]) q->kv_pool[q->n_pool++] = q->cur[bi].kv;
    for (int j = 0; j < n_new; j++) {
        beam *b = &q->nxt[j];
        if (b->kv) continue;
        if (get_kv(d, q, &b->kv) != 0 || tlm_kv_copy_dev(b->kv, q->cur[b->parent].kv, &q->err)) {
            free_all_kvs(q, n_new);
            req_finish(d, q, TLM_SLOT_FAILED);
            return;
        }
    }
    beam *t = q->cur;
    q->cur = q->nxt;
    q->nxt = t;
    q->n_cur = n_new;
}

int tlm_decoder_set_device(tlm_decoder *d, tlm_device *dev, tlm_error *err)
{
    if (!d) return tlm_err_set(err, TLM_EINVAL, "decoder", "no decoder given");
    if (d->n_active > 0)
        return tlm_err_set(err, TLM_EINVAL, "device",
                           "%d requests are active; their KV caches live on the current device",
                           d->n_active);
    d->dev = tlm_device_kind(dev) == TLM_DEVICE_CUDA ? dev : NULL;
    return 0;
}

int tlm_decoder_step(tlm_decoder *d, tlm_error *err)
{
    if (!d) return tlm_err_set(err, TLM_EINVAL, "decoder", "no decoder given");
    size_t rows = 0;
    for (int s = 0; s < d->max_slots; s++)
        if (d->slots[s].state == TLM_SLOT_ACTIVE) rows += (size_t)d->slots[s].n_cur;
    if (rows == 0) return 0;
    const size_t V = (size_t)d->m->cfg.vocab_size;
    if (rows > d->cap_rows) {
        free(d->seqs);
        free(d->logits);
        d->seqs = malloc(rows * sizeof *d->seqs);
        d->logits = malloc(rows * V * sizeof(float));
        d->cap_rows = (d->seqs && d->logits) ? rows : 0;
        if (!d->cap_rows) return tlm_err_set(err, TLM_ENOMEM, "decoder", "out of memory");
    }
    int n = 0;
    for (int s = 0; s < d->max_slots; s++) {
        req *q = &d->slots[s];
        if (q->state != TLM_SLOT_ACTIVE) continue;
        q->row0 = n;
        for (int bi = 0; bi < q->n_cur; bi++, n++) {
            beam *b = &q->cur[bi];
            d->seqs[n] = (tlm_seq){.kv = b->kv,
                                   .tokens = b->tok + b->kv->len,
                                   .n_tokens = b->n - b->kv->len,
                                   .logits = d->logits + (size_t)n * V,
                                   .all_logits = 0};
        }
    }
    tlm_error e = {0};
    int rc = d->dev ? tlm_forward_batch_dev(d->dev, d->m, d->seqs, n, &e)
                    : tlm_forward_batch(d->m, d->ws, d->seqs, n, &e);
    if (rc) {
        for (int s = 0; s < d->max_slots; s++)
            if (d->slots[s].state == TLM_SLOT_ACTIVE) {
                d->slots[s].err = e;
                req_finish(d, &d->slots[s], TLM_SLOT_FAILED);
            }
        if (err) *err = e;
        return rc;
    }
    for (int s = 0; s < d->max_slots; s++)
        if (d->slots[s].state == TLM_SLOT_ACTIVE) advance(d, &d->slots[s], d->logits);
    return d->n_active;
}

int tlm_decoder_run(tlm_decoder *d, tlm_error *err)
{
    for (;;) {
        int rc = tlm_decoder_step(d, err);
        if (rc <= 0) return rc;
    }
}

int tlm_decoder_active(const tlm_decoder *d)
{
    return d ? d->n_active : 0;
}

tlm_slot_state tlm_decoder_state(const tlm_decoder *d, int slot)
{
    if (!d || slot < 0 || slot >= d->max_slots) return TLM_SLOT_FREE;
    return d->slots[slot].state;
}

int tlm_decoder_n_results(const tlm_decoder *d, int slot)
{
    if (tlm_decoder_state(d, slot) != TLM_SLOT_DONE) return 0;
    return d->slots[slot].n_fin;
}

int tlm_decoder_result(const tlm_decoder *d, int slot, int rank, const int32_t **tokens,
                       int *n_tokens, double *score, tlm_error *err)
{
    tlm_slot_state st = tlm_decoder_state(d, slot);
    if (st == TLM_SLOT_FAILED) {
        const tlm_error *e = &d->slots[slot].err;
        if (err) *err = *e;
        return e->code ? e->code : TLM_ERUNTIME;
    }
    if (st != TLM_SLOT_DONE)
        return tlm_err_set(err, TLM_EINVAL, "slot", "slot %d is %s", slot,
                           st == TLM_SLOT_ACTIVE ? "still decoding" : "not in use");
    const req *q = &d->slots[slot];
    if (rank < 0 || rank >= q->n_fin)
        return tlm_err_set(err, TLM_EINVAL, "rank", "rank %d; slot %d has %d results", rank, slot,
                           q->n_fin);
    const hyp *h = &q->fin[rank];
    if (tokens) *tokens = h->tok + q->n_prompt;
    if (n_tokens) *n_tokens = h->n - q->n_prompt;
    if (score) *score = h->score;
    return 0;
}

void tlm_decoder_release(tlm_decoder *d, int slot)
{
    if (!d || slot < 0 || slot >= d->max_slots) return;
    req *q = &d->slots[slot];
    if (q->state == TLM_SLOT_ACTIVE) d->n_active--;
    req_free(q);
}
