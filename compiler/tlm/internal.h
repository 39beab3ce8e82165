/* internal.h — helpers shared by forward.c (CPU) and cuda.c (GPU); not part of the API. */
#ifndef TLM_TLM_INTERNAL_H
#define TLM_TLM_INTERNAL_H

#include <stddef.h>

#include "compiler/tlm/tlm.h"

size_t tlm__round_up(size_t n, size_t k);
/* Validates a batch before anything changes: model, caches of this model with room for the
 * new tokens, tokens in range, no cache twice. R: rows (new tokens), Rl: logit rows, T (may be
 * NULL): the longest sequence after the call. */
int tlm__check_batch(const tlm_model *m, const tlm_seq *seqs, int n_seqs, size_t *R, size_t *Rl,
                     int *T, tlm_error *err);

#endif
