/* select.c — glue between the tensor language and the GPT-2 decoder. */
#include "compiler/tlm/select.h"

#include <stdlib.h>
#include <string.h>

/* Replays the decisions generated so far into c->st. */
static int replay(tlm_select_ctx *c, const int32_t *tokens, int n_tokens, int n_prompt,
                  tlm_error *err)
{
    lang_state *st = &c->st;
    lang_state_reset(st);
    for (int i = n_prompt; i < n_tokens; i++)
        if (lang_state_push(st, tokens[i]))
            return tlm_err_set(err, TLM_EINVAL, "sentence",
                               "internal: token %d at position %d left the grammar", tokens[i], i);
    return 0;
}

/* The mask depends only on the tokens. */
static int mask_cb(void *user, const int32_t *tokens, int n_tokens, int n_prompt, uint64_t *allowed,
                   int32_t *forced, tlm_error *err)
{
    tlm_select_ctx *c = user;
    lang_state *st = &c->st;
    int rc = replay(c, tokens, n_tokens, n_prompt, err);
    if (rc) return rc;
    int next = lang_state_next(st, allowed);
    if (next == -2) return TLM_MASK_STOP;
    if (next >= 0) *forced = next;
    return TLM_MASK_NEXT;
}

/* The next token of v's encoding after the current slot's value tokens so far, or -1 when
 * those are not the start of v's encoding (or already all of it). */
static int32_t next_value_token(const lang_state *st, int64_t v)
{
    int enc[LANG_MAX_VALUE_TOKENS];
    int n = lang_encode_int(v, enc, LANG_MAX_VALUE_TOKENS);
    if (n <= st->nprefix) return -1;
    for (int i = 0; i < st->nprefix; i++)
        if (st->prefix[i] != enc[i]) return -1;
    return enc[st->nprefix];
}

/* The default schedule's next token where the decisions so far still agree with its value
 * for the current slot (mask_cb has just replayed them into c->st); -1 elsewhere, e.g. once
 * the slot's value has left the default's encoding. Where the model chose another vector axis
 * (the first slot of a CPU tile), the default for that axis (space_default_vectorized) is
 * the one favoured from there on: the rule of thumb's tiles belong to its vector axis. */
static int32_t prefer_cb(void *user, const int32_t *tokens, int n_tokens, int n_prompt)
{
    (void)tokens, (void)n_tokens, (void)n_prompt;
    tlm_select_ctx *c = user;
    const lang_state *st = &c->st;
    if (!lang_state_in_value(st) || st->slot < 0 || st->slot >= c->anchor.n) return -1;
    if (st->slot > 0 && c->sp->slot[0].kind == SLOT_VECTORIZE &&
        st->partial.v[0] != c->anchor_for) {
        /* beams of one request may differ here: the anchor follows this history's axis */
        int64_t v = st->partial.v[0];
        c->anchor_for = v;
        c->anchor_none = false;
        if (v == c->default_v0) {
            space_default(c->sp, &c->anchor);
        } else {
            space_default_vectorized(c->sp, v, &c->anchor);
            c->anchor_none = c->anchor.v[0] != v; /* no default for this axis: no prior */
        }
    }
    if (st->slot > 0 && c->anchor_none) return -1;
    return next_value_token(st, c->anchor.v[st->slot]);
}

int tlm_select_request(const space *sp, const tlm_model *m, int beam_width, tlm_select_ctx *ctx,
                       tlm_request *req, tlm_error *err)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->sp = sp;
    if (m->cfg.vocab_size != lang_vocab_size())
        return tlm_err_set(err, TLM_EINVAL, "weights",
                           "the model's vocabulary has %d tokens, the tensor language %d",
                           m->cfg.vocab_size, lang_vocab_size());
    int toks[LANG_MAX_SENTENCE];
    int n = lang_encode_prompt(sp, toks, LANG_MAX_SENTENCE);
    if (n < 0) return tlm_err_set(err, n, "workload", "the prompt does not fit");
    for (int i = 0; i < n; i++) ctx->prompt[i] = toks[i];
    ctx->n_prompt = n;
    /* decisions: slot + hint + value (each at most 7 tokens) per slot, then [EOS] */
    int max_new = sp->n_slot * (1 + 2 * LANG_MAX_VALUE_TOKENS) + 1;
    if (n + max_new > m->cfg.n_ctx) max_new = m->cfg.n_ctx - n;
    if (max_new < sp->n_slot * 3 + 1)
        return tlm_err_set(err, TLM_ELIMIT, "weights",
                           "the model's context (%d) is too short for this sentence (%d + %d)",
                           m->cfg.n_ctx, n, sp->n_slot * 3 + 1);
    if (lang_state_init(&ctx->st, sp)) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    memset(req, 0, sizeof *req);
    req->prompt = ctx->prompt;
    req->n_prompt = n;
    req->mask = mask_cb;
    req->user = ctx;
    req->max_new_tokens = max_new;
    req->beam_width = beam_width;
    if (m->default_prior > 0.0f) {
        space_default(sp, &ctx->anchor);
        ctx->default_v0 = ctx->anchor_for = ctx->anchor.v[0];
        ctx->anchor_none = false;
        req->prefer = prefer_cb;
        req->prefer_bonus = m->default_prior;
    }
    return 0;
}

void tlm_select_ctx_free(tlm_select_ctx *ctx)
{
    lang_state_free(&ctx->st);
}

int tlm_select_result(const tlm_decoder *dec, int slot, int rank, const space *sp,
                      tlm_candidate *out, tlm_error *err)
{
    const int32_t *toks;
    int n;
    double score;
    int rc = tlm_decoder_result(dec, slot, rank, &toks, &n, &score, err);
    if (rc) return rc;
    if (n > LANG_MAX_SENTENCE) return tlm_err_set(err, TLM_ELIMIT, "sentence", "too long");
    int t[LANG_MAX_SENTENCE];
    for (int i = 0; i < n; i++) t[i] = toks[i], out->tokens[i] = toks[i];
    out->n_tokens = n;
    out->score = score;
    return lang_decode_decisions(sp, t, n, &out->sched, err);
}

int tlm_select_generate(const tlm_model *m, const space *sp, int k, tlm_candidate *out,
                        int *n_out, tlm_error *err)
{
    *n_out = 0;
    if (k < 1) k = 1;
    tlm_decoder *dec = NULL;
    int rc = tlm_decoder_new(m, 1, &dec, err);
    if (rc) return rc;
    tlm_select_ctx *ctx = malloc(sizeof *ctx);
    tlm_request req;
    if (!ctx) {
        tlm_decoder_free(dec);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    rc = tlm_select_request(sp, m, k, ctx, &req, err);
    int slot = rc ? rc : tlm_decoder_add(dec, &req, err);
    if (slot < 0) rc = slot;
    if (rc == 0) rc = tlm_decoder_run(dec, err);
    if (rc == 0) {
        int nr = tlm_decoder_n_results(dec, slot);
        if (nr <= 0) {
            const int32_t *t;
            int n;
            double s;
            rc = tlm_decoder_result(dec, slot, 0, &t, &n, &s, err);
            if (rc == 0) rc = tlm_err_set(err, TLM_ERUNTIME, "", "the decoder produced nothing");
        }
        for (int r = 0; r < nr && r < k && rc == 0; r++) {
            rc = tlm_select_result(dec, slot, r, sp, &out[r], err);
            if (rc == 0) (*n_out)++;
        }
    }
    tlm_select_ctx_free(ctx);
    free(ctx);
    tlm_decoder_free(dec);
    return rc;
}

/* ---- regenerating one slot ---- */

typedef struct {
    tlm_select_ctx sel; /* first: the prompt and the replay state */
    const space_sched *base;
    int slot;
    tlm_value_filter allow;
    void *allow_user;
} regen_ctx;

static bool other_than_base(int64_t v, void *user)
{
    return v != *(const int64_t *)user;
}

/* Keeps the legal values of the current slot that c's filter accepts. */
static int filter_values(const regen_ctx *c, int64_t *vals, int nv)
{
    int n = 0;
    for (int i = 0; i < nv; i++)
        if (c->allow(vals[i], c->allow_user)) vals[n++] = vals[i];
    return n;
}

/* Before the slot: base's tokens, forced; the slot: its filtered legal values; after: stop. */
static int regen_mask(void *user, const int32_t *tokens, int n_tokens, int n_prompt,
                      uint64_t *allowed, int32_t *forced, tlm_error *err)
{
    regen_ctx *c = user;
    lang_state *st = &c->sel.st;
    int rc = replay(&c->sel, tokens, n_tokens, n_prompt, err);
    if (rc) return rc;
    if (st->done || st->slot > c->slot) return TLM_MASK_STOP;
    if (lang_state_in_value(st) && st->slot < c->slot) {
        int32_t t = next_value_token(st, c->base->v[st->slot]);
        if (t < 0) return tlm_err_set(err, TLM_EINVAL, "sentence", "internal: base value overrun");
        *forced = t;
        return TLM_MASK_NEXT;
    }
    if (lang_state_in_value(st)) st->nvals = filter_values(c, st->vals, st->nvals);
    int next = lang_state_next(st, allowed);
    if (next == -2) return TLM_MASK_STOP;
    if (next >= 0) *forced = next;
    return TLM_MASK_NEXT;
}

int tlm_select_regen(const tlm_model *m, const space *sp, const space_sched *base, int slot,
                     tlm_value_filter allow, void *allow_user, int k, int64_t *vals, double *scores,
                     int *n_out, tlm_error *err)
{
    *n_out = 0;
    if (slot < 0 || slot >= sp->n_slot || base->n < sp->n_slot)
        return tlm_err_set(err, TLM_EINVAL, "slot", "slot %d is not in the space (%d slots)", slot,
                           sp->n_slot);
    if (k < 1) k = 1;
    if (k > TLM_MAX_BEAM) k = TLM_MAX_BEAM;
    int64_t cur = base->v[slot];
    regen_ctx *c = calloc(1, sizeof *c);
    int64_t *legal = malloc(SPACE_MAX_VALUES * sizeof *legal);
    if (!c || !legal) {
        free(c);
        free(legal);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    c->base = base;
    c->slot = slot;
    c->allow = allow ? allow : other_than_base;
    c->allow_user = allow ? allow_user : &cur;
    /* nothing to choose from: no decoding (the decoder would fail the request) */
    space_sched prefix = *base;
    prefix.n = slot;
    int nv = space_legal_values(sp, slot, &prefix, legal);
    int nallowed = filter_values(c, legal, nv > 0 ? nv : 0);
    free(legal);
    tlm_request req;
    int rc = nallowed > 0 ? tlm_select_request(sp, m, k, &c->sel, &req, err) : 0;
    if (nallowed == 0) {
        free(c);
        return 0;
    }
    req.mask = regen_mask;
    req.prefer = NULL; /* the slot's values as the model ranks them: no prior on the default */
    req.user = c;
    tlm_decoder *dec = NULL;
    if (!rc) rc = tlm_decoder_new(m, 1, &dec, err);
    int id = rc ? rc : tlm_decoder_add(dec, &req, err);
    if (id < 0) rc = id;
    if (!rc) rc = tlm_decoder_run(dec, err);
    int nr = rc ? 0 : tlm_decoder_n_results(dec, id);
    if (!rc && nr <= 0) {
        const int32_t *t;
        int n;
        double s;
        rc = tlm_decoder_result(dec, id, 0, &t, &n, &s, err);
        if (!rc) rc = tlm_err_set(err, TLM_ERUNTIME, "", "the decoder produced nothing");
    }
    for (int r = 0; r < nr && r < k && !rc; r++) {
        const int32_t *t;
        int n;
        double s;
        rc = tlm_decoder_result(dec, id, r, &t, &n, &s, err);
        if (!rc) rc = replay(&c->sel, t, n, 0, err);
        if (!rc && c->sel.st.slot <= slot)
            rc = tlm_err_set(err, TLM_ERUNTIME, "sentence", "internal: the slot is incomplete");
        if (rc) break;
        vals[*n_out] = c->sel.st.partial.v[slot];
        if (scores) scores[*n_out] = s;
        (*n_out)++;
    }
    tlm_decoder_free(dec);
    tlm_select_ctx_free(&c->sel);
    free(c);
    return rc;
}
