/* select.h — the TLM as a schedule writer: (space, model) → schedules, through the tensor
 * language and the batched, grammar-masked decoder.
 *
 * Contract:
 *  - tlm_select_request prepares a decoder request for one space: the prompt tokens
 *    (lang_encode_prompt) and a mask callback that replays the decisions generated so far
 *    through a lang_state, so every sentence the decoder can produce decodes to a schedule
 *    that passes space_check. Greedy decoding is deterministic: same model, same space,
 *    same tokens. With m->default_prior > 0 the tokens of the space's default schedule gain
 *    that bonus on their logits (while the decisions agree with it slot by slot): the model
 *    writes the default except where it prefers another value by more than the margin.
 *  - A tlm_select_ctx belongs to one request and must outlive it in the decoder; it holds
 *    the prompt and scratch state for the callback (which runs on the decoder's thread).
 *  - tlm_select_generate is the one-shot convenience: a private decoder, k candidates by
 *    beam search (k = 1: greedy), best first.
 *  - tlm_select_regen rewrites one decision of a known schedule: the decisions before it are
 *    forced to the schedule's, the model chooses that slot's value under the grammar mask
 *    narrowed by a value filter (e.g. "larger than now"), and decoding stops once the slot is
 *    complete (what follows is the caller's: HTAM re-legalises it as the search does).
 */
#ifndef TLM_SELECT_H
#define TLM_SELECT_H

#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"

typedef struct tlm_select_ctx {
    const space *sp;
    int32_t prompt[LANG_MAX_SENTENCE];
    int n_prompt;
    lang_state st; /* scratch for the mask callback */
    space_sched anchor; /* the default schedule, favoured by the model's default_prior */
    int64_t default_v0, anchor_for; /* slot 0 of the default / of the history anchor is for */
    bool anchor_none;               /* no default for that history's vector axis */
} tlm_select_ctx;

typedef struct tlm_candidate {
    space_sched sched;
    double score; /* sum of log-probabilities of the chosen (non-forced) tokens */
    int32_t tokens[LANG_MAX_SENTENCE]; /* the decision part, ending with [EOS] */
    int n_tokens;
} tlm_candidate;

/* Fills ctx and req (req->prompt points into ctx). beam_width 1 = greedy. */
int tlm_select_request(const space *sp, const tlm_model *m, int beam_width, tlm_select_ctx *ctx,
                       tlm_request *req, tlm_error *err);
void tlm_select_ctx_free(tlm_select_ctx *ctx);
/* Turns a finished request's result into a candidate (decodes and validates it). */
int tlm_select_result(const tlm_decoder *dec, int slot, int rank, const space *sp,
                      tlm_candidate *out, tlm_error *err);
/* k candidates for one space with a private decoder; *n_out <= k. */
int tlm_select_generate(const tlm_model *m, const space *sp, int k, tlm_candidate *out,
                        int *n_out, tlm_error *err);

/* Which of a slot's legal values the model may choose (true: allowed). */
typedef bool (*tlm_value_filter)(int64_t v, void *user);

/* Up to k values for slot `slot` of schedule `base` (complete and legal), best first by the
 * model's log-probability (beam search over the slot's value tokens; the decisions before it
 * are forced to base's): vals[0..*n_out), scores alike (may be NULL). Only legal values that
 * `allow` accepts (NULL: any other than base's) are offered; *n_out is 0 when there is none.
 * Deterministic: same model, space, base, slot and filter, same values. */
int tlm_select_regen(const tlm_model *m, const space *sp, const space_sched *base, int slot,
                     tlm_value_filter allow, void *allow_user, int k, int64_t *vals, double *scores,
                     int *n_out, tlm_error *err);

#endif
