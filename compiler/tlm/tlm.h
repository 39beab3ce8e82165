/* tlm.h — the GPT-2 runtime: weight file, CPU forward with KV cache, batched decoder.
 *
 * Contract:
 *  - A tlm_model is a GPT-2 (pre-LayerNorm, GELU tanh approximation, learned positions,
 *    causal attention, lm head tied to the token embedding) held as ONE contiguous float
 *    array in the weight file's tensor order (see model_weights/README.md), so a trainer
 *    can treat it as a flat parameter vector. Models come from tlm_model_new (zeros),
 *    tlm_model_init_random (GPT-2 init, deterministic in the seed) or tlm_model_load.
 *  - tlm_model_load validates everything before trusting a byte: magic, version, header
 *    checksum, sane sizes, file size equal to the size the header implies, payload SHA-256,
 *    finite weights, and (when the caller passes them) vocab size and vocab hash. Any
 *    mismatch is refused with a tlm_error naming the field; truncated or garbage files
 *    never crash. tlm_model_save writes a temporary file and renames it into place.
 *  - The vocabulary is not this module's business: callers pass its size and a 32-byte
 *    hash; the file records both so a model trained for one vocabulary is refused by
 *    another.
 *  - tlm_forward_batch runs new tokens of many sequences in one pass: their rows are
 *    stacked into one (sum of new tokens, C) matrix for every matrix product, attention is
 *    per sequence against its own tlm_kv. Logits come out for the last new token of each
 *    sequence (or for all of them on request).
 *  - Batch invariance (what makes batched decoding give the same tokens as one at a time):
 *    the result for a row is bitwise independent of which other rows share the call and of
 *    how a sequence's tokens were split across calls. Matrix products are our own
 *    (compiler/tlm/gemm.c, contract in internal.h): each output element is one sequential
 *    chain of fused multiply-adds over the inner dimension, plus the bias once, so its bits
 *    depend on nothing but its row, its column of weights and its bias, whatever the batch,
 *    the register tile, the thread or the instruction set (AVX-512, AVX2 and the scalar
 *    path agree bitwise). Everything else (LayerNorm, attention, GELU, residual) is plain C
 *    where one thread computes a whole row in a fixed order, built without -ffast-math. So
 *    the guarantee holds by construction on every host, 1 or many threads, and the logits
 *    themselves are the same bits on every host and ISA for the same weights and the same
 *    build and libm (expf is libm's, and not exactly rounded; TLM_GEMM_ISA=scalar | avx2 |
 *    avx512 forces a product path: it changes speed only).
 *  - A tlm_workspace keeps a transposed copy of the lm head (wte) of the last model it ran,
 *    recognised by the model's address, its wte pointer and a sample of wte: a model whose
 *    weights changed in place (against "read-only after creation" below) needs a new
 *    workspace.
 *  - The decoder owns a set of request slots. tlm_decoder_add admits a request (prompt,
 *    mask callback, max_new_tokens, beam width); tlm_decoder_step runs one forward over
 *    every active beam of every request (new requests get their prompt prefilled in that
 *    same step), picks the next token under the mask (greedy: argmax, ties to the lowest
 *    token id; beam search: top `width` by summed log-softmax over the allowed tokens),
 *    and retires requests that finished. Forced tokens (the mask callback names exactly
 *    one token) are appended without consulting logits and score 0; they are still fed
 *    through the model (with the next step's tokens) so the KV cache stays complete.
 *  - Threads: a tlm_model is read-only after creation and may be shared. A tlm_kv,
 *    tlm_workspace or tlm_decoder belongs to one thread at a time (the decoder thread);
 *    mask callbacks run on that thread. Inside a call, OpenMP uses its own worker threads.
 */
#ifndef TLM_TLM_H
#define TLM_TLM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler/util/err.h"

#define TLM_WEIGHTS_DEFAULT_PATH "model_weights/tlm.bin"
#define TLM_FORMAT_VERSION 1
#define TLM_HEADER_SIZE 128
#define TLM_HASH_SIZE 32

/* Limits the loader enforces; anything above is refused as absurd. */
#define TLM_MAX_LAYERS 64
#define TLM_MAX_EMBD 4096
#define TLM_MAX_HEADS 256
#define TLM_MAX_VOCAB (1 << 20)
#define TLM_MAX_CTX 65536
#define TLM_MAX_PARAMS (UINT64_C(1) << 31) /* 8 GiB of float32 */

#define TLM_MAX_BEAM 64

typedef struct tlm_config {
    int n_layer;    /* L */
    int n_head;     /* NH; n_embd % n_head == 0 */
    int n_embd;     /* C */
    int n_ctx;      /* T: maximum positions */
    int vocab_size; /* V */
} tlm_config;

/* Pointers into tlm_model.params for one transformer block. Linear weights are stored
 * (in, out), so y = x @ w + b. */
typedef struct tlm_layer {
    float *ln1_w, *ln1_b;             /* (C) */
    float *qkv_w, *qkv_b;             /* (C, 3C), (3C): columns q | k | v, heads contiguous */
    float *attn_proj_w, *attn_proj_b; /* (C, C), (C) */
    float *ln2_w, *ln2_b;             /* (C) */
    float *fc_w, *fc_b;               /* (C, 4C), (4C) */
    float *fc_proj_w, *fc_proj_b;     /* (4C, C), (C) */
} tlm_layer;

typedef struct tlm_model {
    tlm_config cfg;
    uint8_t vocab_hash[TLM_HASH_SIZE];
    float *params; /* all parameters, file order */
    size_t n_params;
    float *wte;           /* (V, C), also the lm head */
    float *wpe;           /* (T, C) */
    tlm_layer *layers;    /* (L) */
    float *lnf_w, *lnf_b; /* (C) */
    /* Decoding, not stored in the file: the bonus (in logits, >= 0) that the tokens of the
     * space's default schedule get when the model writes a schedule (tlm_select_request), so
     * that it departs from the rule of thumb only where it prefers another value by more than
     * that margin (a prior on the default; 0 = none). Set by whoever loads the model (the
     * MANIFEST's "prior", tlm_weights_manifest; --prior on the CLI). */
    float default_prior;
} tlm_model;

/* 0 if cfg is within the limits above, else TLM_EINVAL/TLM_ELIMIT naming the field. */
int tlm_config_check(const tlm_config *cfg, tlm_error *err);
/* Parameter count of a checked config. */
uint64_t tlm_config_param_count(const tlm_config *cfg);

/* A model with every parameter zero. vocab_hash may be NULL (all zero bytes). */
int tlm_model_new(const tlm_config *cfg, const uint8_t *vocab_hash, tlm_model **out,
                  tlm_error *err);
/* GPT-2 initialisation: weights N(0, 0.02), the two residual projections (attn_proj_w,
 * fc_proj_w) N(0, 0.02/sqrt(2L)), LayerNorm weights 1, biases 0. Same seed, same bytes. */
int tlm_model_init_random(const tlm_config *cfg, const uint8_t *vocab_hash, uint64_t seed,
                          tlm_model **out, tlm_error *err);
void tlm_model_free(tlm_model *m);

/* Loads and validates a weight file. expect_vocab_size (0 = any) and expect_vocab_hash
 * (NULL = any) are compared with the header; a mismatch is refused with TLM_EINVAL. */
int tlm_model_load(const char *path, int expect_vocab_size, const uint8_t *expect_vocab_hash,
                   tlm_model **out, tlm_error *err);
/* Writes the model atomically (PATH.tmp.PID, then rename). */
int tlm_model_save(const tlm_model *m, const char *path, tlm_error *err);

/* What the MANIFEST next to a weight file (same directory) says of it, read with one hash of
 * the file:
 *   trained    "trained = true" (or "trained: true") AND "sha256 = HEX" names this file's
 *              SHA-256, so a manifest written for other weights, or one naming no hash, never
 *              vouches for a file (a freshly initialised model has none);
 *   held_back  "serve = default": trained weights that lost to the rule-of-thumb schedules on
 *              the held-out evaluation, so a server keeps the default schedules;
 *   prior      "prior = X", 0 <= X <= 100, the decoding bonus in logits on the default
 *              schedule (tlm_model.default_prior); 0 when it gives none or does not vouch for
 *              the file;
 *   sha        the file's SHA-256 in hex, "" when unreadable.
 * Any thread. */
typedef struct {
    bool trained;
    bool held_back;
    double prior;
    char sha[65];
} tlm_weights_info;
void tlm_weights_manifest(const char *path, tlm_weights_info *out);
/* tlm_weights_manifest's `trained`; sha_hex (may be NULL) receives the file's SHA-256. */
bool tlm_weights_trained(const char *path, char sha_hex[65]);

/* ---- KV cache: one per sequence ---- */

typedef struct tlm_kv {
    int n_layer, n_embd;
    int capacity; /* positions it can hold, <= n_ctx */
    int len;      /* positions filled */
    float *k, *v; /* (L, capacity, C) each */
} tlm_kv;

/* capacity 0 means the model's n_ctx. */
int tlm_kv_new(const tlm_model *m, int capacity, tlm_kv **out, tlm_error *err);
void tlm_kv_reset(tlm_kv *kv);
/* dst takes src's first src->len positions; dst must be from the same model with capacity
 * >= src->len. */
int tlm_kv_copy(tlm_kv *dst, const tlm_kv *src, tlm_error *err);
void tlm_kv_free(tlm_kv *kv);

/* ---- forward ---- */

/* Scratch buffers reused across forward calls (grown on demand). */
typedef struct tlm_workspace tlm_workspace;
tlm_workspace *tlm_workspace_new(void);
void tlm_workspace_free(tlm_workspace *ws);
/* Loops with less work than this (floats touched, or multiply-adds; matrix products count
 * 32 multiply-adds as one) stay on the calling thread; the default suits a busy 2-core
 * machine (see forward.c); 0 makes every loop an OpenMP region. Results never depend on it. */
void tlm_workspace_set_parallel_min(tlm_workspace *ws, size_t work);

typedef struct tlm_seq {
    tlm_kv *kv;            /* new tokens go to positions kv->len .. kv->len + n_tokens - 1 */
    const int32_t *tokens; /* (n_tokens) */
    int n_tokens;          /* >= 1 */
    float *logits;         /* (V) for the last new token, (n_tokens, V) with all_logits, or NULL */
    int all_logits;
} tlm_seq;

/* One forward pass over the new tokens of n_seqs sequences; appends them to each kv.
 * Everything is validated before any kv changes (tokens in [0, V), room in each kv, no kv
 * used twice); on error nothing was modified. */
int tlm_forward_batch(const tlm_model *m, tlm_workspace *ws, const tlm_seq *seqs, int n_seqs,
                      tlm_error *err);

/* ---- decoder ---- */

/* The mask callback. tokens[0..n_tokens) is the sequence so far (the prompt, then what was
 * generated); the callback decides the next token's constraints:
 *   - return TLM_MASK_NEXT after setting bits in `allowed` (a bitset of V bits, bit t of
 *     word t/64, zeroed before the call) for the tokens that may come next, or after
 *     setting *forced to the one token that must come next (then `allowed` is ignored);
 *   - return TLM_MASK_STOP: the sequence is complete (the stop predicate);
 *   - return a negative TLM_E* code (filling err) to fail the request.
 * It must depend only on its arguments and user data (beam search calls it for many
 * histories, in an order that is not part of the contract). */
enum { TLM_MASK_NEXT = 0, TLM_MASK_STOP = 1 };
typedef int (*tlm_mask_fn)(void *user, const int32_t *tokens, int n_tokens, int n_prompt,
                           uint64_t *allowed, int32_t *forced, tlm_error *err);

static inline void tlm_bitset_set(uint64_t *bits, int32_t t)
{
    bits[t >> 6] |= UINT64_C(1) << (t & 63);
}
static inline int tlm_bitset_get(const uint64_t *bits, int32_t t)
{
    return (int)((bits[t >> 6] >> (t & 63)) & 1);
}

/* The preference callback (optional): called right after the mask callback returned
 * TLM_MASK_NEXT without forcing, for the same tokens; returns the token to favour at that
 * position (it gains tlm_request.prefer_bonus on its logit when it is allowed), or -1 for
 * none. Same purity rules as the mask. */
typedef int32_t (*tlm_prefer_fn)(void *user, const int32_t *tokens, int n_tokens, int n_prompt);

typedef struct tlm_request {
    const int32_t *prompt; /* copied by tlm_decoder_add */
    int n_prompt;          /* >= 1 */
    tlm_mask_fn mask;      /* NULL: every token allowed, never stops early */
    void *user;
    int max_new_tokens; /* >= 1; n_prompt + max_new_tokens <= n_ctx */
    int beam_width;     /* 0 or 1: greedy; k > 1: beam search returning up to k results:
                         * every active beam proposes its k best allowed tokens, proposals
                         * are ranked by score (then beam, then token id) and taken in
                         * order, finished ones into the results, until k beams are active;
                         * stops when no beam is active or none can beat the k-th result */
    tlm_prefer_fn prefer;  /* NULL: no preference (needs mask) */
    float prefer_bonus;    /* added to the preferred token's logit before ranking and scoring */
} tlm_request;

typedef enum {
    TLM_SLOT_FREE = 0,
    TLM_SLOT_ACTIVE,
    TLM_SLOT_DONE,
    TLM_SLOT_FAILED,
} tlm_slot_state;

typedef struct tlm_decoder tlm_decoder;

/* max_slots: requests decoded concurrently (a beam request counts once). */
int tlm_decoder_new(const tlm_model *m, int max_slots, tlm_decoder **out, tlm_error *err);
void tlm_decoder_free(tlm_decoder *dec);

/* Admits a request; returns its slot id (>= 0) or a negative code (TLM_ELIMIT when every
 * slot is taken). Forced tokens right after the prompt are resolved here; a request the
 * mask stops at once is DONE immediately. The prompt is prefilled by the next step. */
int tlm_decoder_add(tlm_decoder *dec, const tlm_request *req, tlm_error *err);

/* One decoding step for every active request. Returns the number of requests still
 * active afterwards (>= 0) or a negative code when the forward pass failed (then every
 * active request is FAILED with that error). A request whose mask callback fails, or
 * allows no token, becomes FAILED alone. */
int tlm_decoder_step(tlm_decoder *dec, tlm_error *err);

/* Steps until no request is active. Returns 0 or the first step error. */
int tlm_decoder_run(tlm_decoder *dec, tlm_error *err);

int tlm_decoder_active(const tlm_decoder *dec); /* requests still active */
tlm_slot_state tlm_decoder_state(const tlm_decoder *dec, int slot);

/* Results of a DONE request, best first (ties in order of completion): n_results is at
 * most the beam width; result `rank` gives the generated tokens (without the prompt),
 * valid until the slot is released, and their score (sum of log-softmax over the allowed
 * tokens at each chosen position, forced tokens 0). For a FAILED slot returns its error. */
int tlm_decoder_n_results(const tlm_decoder *dec, int slot);
int tlm_decoder_result(const tlm_decoder *dec, int slot, int rank, const int32_t **tokens,
                       int *n_tokens, double *score, tlm_error *err);
/* Frees a DONE or FAILED slot for reuse (an ACTIVE one is cancelled). */
void tlm_decoder_release(tlm_decoder *dec, int slot);

#endif
