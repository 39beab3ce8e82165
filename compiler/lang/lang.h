/* lang.h — the tensor language: vocabulary, sentences, grammar masks.
 *
 * Contract:
 *  - A sentence is  prompt ‖ decisions ‖ [EOS].
 *      prompt    = [BOS] target-tokens op-tokens axis-pairs sketch [SEP]
 *      decisions = for each slot of the space, in order: SLOT token (forced), HINT (forced:
 *                  the rule of thumb's value for the slot after the decisions before it,
 *                  space_default_given, encoded as a value), then VALUE (chosen). The model
 *                  reads the rule's suggestion right before each choice and learns where to
 *                  depart from it; a departure moves the later hints with it (another vector
 *                  axis: that axis' default tiles).
 *    The vocabulary is fixed by this code; LANG_VERSION changes whenever it or the grammar
 *    (what values a slot may take) does, and
 *    lang_vocab_hash (SHA-256 of every token name in order, with the version) goes into weight
 *    files so a model is never used with a vocabulary it was not trained on.
 *  - Every integer is representable: 0..LANG_SMALL-1 are single tokens (N_<v>); larger values
 *    (up to 2^36-1) are [NUM] followed by LANG_DIGITS base-64 digit tokens (D_<d>), most
 *    significant first. The encoding is prefix-free, so grammar masks work digit by digit.
 *  - Masks: lang_state walks a decision part token by token. At each position it either
 *    forces one token (slot tokens, [EOS], the only possible continuation) or offers the set
 *    of tokens that begin or continue the encoding of some value in space_legal_values for
 *    the current slot given the decisions so far. Any sentence built by always choosing inside
 *    the mask decodes to a schedule that passes space_check.
 *  - Thread safety: all functions are pure or act on caller-owned state.
 */
#ifndef TLM_LANG_H
#define TLM_LANG_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/space/space.h"
#include "compiler/util/err.h"

/* Version history: 1 first vocabulary; 2 the same tokens under a wider grammar (CPU spatial
 * tiles may be padded non-divisors, space.h): weights trained on v1 sentences would be
 * asked for decisions they never saw, so they are refused by the vocabulary hash; 3 the CPU
 * vectorize slot names the vector axis (v-th innermost spatial axis; space.h), and packing
 * takes strided operands; 4 the tensor-core sketch gpu_mma and its slots (warp_m, warp_n,
 * warps_m, warps_n, block_k, pipeline, swizzle), and float16/bfloat16 prompts on cuda targets:
 * weight files of v3 are refused by the vocabulary hash (tlm_model_load names both hashes);
 * 5 the CPU sketch cpu_window (depthwise conv and windowed pools in NCHW: vectorize, the
 * register tile's ow columns and oh rows, parallel) replaces cpu_tile for those workloads;
 * 6 every slot's value follows a forced hint, the rule of thumb's value given the decisions
 * before it, so a model learns where to depart from the rule rather than the rule itself;
 * 7 on targets with 32 vector registers the register tile along the vector axis may be up to
 * 8 vectors (128 floats in 16 lanes, was 64), so that a 77-wide output row is one tile of 5. */
#define LANG_VERSION 7
#define LANG_SMALL 4096 /* values below this are one token */
#define LANG_DIGITS 6   /* base-64 digits after [NUM]: values < 2^36 */
#define LANG_MAX_SENTENCE 1024
#define LANG_MAX_VALUE_TOKENS (1 + LANG_DIGITS)

/* Token ids (stable within a LANG_VERSION). */
enum {
    LANG_PAD = 0,
    LANG_BOS,
    LANG_SEP,
    LANG_EOS,
    LANG_NUM,
    LANG_SPECIAL_COUNT
};

int lang_vocab_size(void);
/* The token's name ("[BOS]", "op:dense", "N_16", "slot:tile.a2.l3", ...), or NULL. */
const char *lang_token_name(int id);
/* Reverse lookup; -1 when unknown. */
int lang_token_id(const char *name);
void lang_vocab_hash(uint8_t out[32]);
void lang_vocab_hash_hex(char out[65]);

/* Appends the encoding of v (0 <= v < 2^36) to toks; returns the count written (1 or 7), or
 * a negative code if cap is too small or v out of range. */
int lang_encode_int(int64_t v, int *toks, int cap);

/* The prompt for (subgraph, target, sketch) of sp. Returns its length or a negative code. */
int lang_encode_prompt(const space *sp, int *toks, int cap);
/* The decision part (slot/value pairs, then [EOS]) of a complete schedule. */
int lang_encode_decisions(const space *sp, const space_sched *s, int *toks, int cap);
/* Parses a decision part back into a schedule and validates it with the space. */
int lang_decode_decisions(const space *sp, const int *toks, int n, space_sched *out,
                          tlm_error *err);
/* Human-readable sentence, token names separated by spaces. */
int lang_sentence_text(const int *toks, int n, char *buf, size_t cap);

/* ---- grammar-masked decoding ---- */

typedef struct lang_state {
    const space *sp;
    space_sched partial; /* decisions so far (partial.n = slots complete) */
    int slot;            /* current slot */
    bool want_slot;      /* next token is the slot token */
    int prefix[LANG_MAX_VALUE_TOKENS];
    int nprefix;         /* value tokens emitted for the current slot */
    int hint[LANG_MAX_VALUE_TOKENS]; /* the current slot's hint tokens (forced) */
    int nhint, hint_pos;             /* its length, and how many are emitted */
    /* cache of the rule's completion (space_default_given of the first dflt_n decisions,
     * dflt_given); kept by lang_state_reset */
    space_sched dflt, dflt_given;
    int dflt_n;
    bool dflt_ok;
    bool done;           /* [EOS] emitted */
    int64_t *vals;       /* scratch: legal values of the current slot */
    int nvals;
} lang_state;

/* Starts a decision part for sp (owns a scratch buffer: lang_state_free). */
int lang_state_init(lang_state *st, const space *sp);
void lang_state_free(lang_state *st);
/* Back to the start of the decision part (same space; the scratch and the cache stay). */
void lang_state_reset(lang_state *st);
/* The next token is (a token of) the current slot's chosen value: not a slot token, a hint
 * token or [EOS]. */
bool lang_state_in_value(const lang_state *st);
/* Next position: returns the forced token id (>= 0) when only one token is possible, or -1
 * and fills mask (a bitset of lang_vocab_size() bits, 64 per word) with the allowed tokens.
 * Returns -2 when the sentence is complete. */
int lang_state_next(lang_state *st, uint64_t *mask);
/* Feeds the chosen token; TLM_EINVAL if it is outside the grammar. */
int lang_state_push(lang_state *st, int token);

#endif
