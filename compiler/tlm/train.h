/* train.h — training the TLM (GPT-2) on the CPU: loss, backward, AdamW, checkpoints.
 *
 * Contract:
 *  - The trainer trains a tlm_model in place. Its forward is its own (train.c, llm.c style:
 *    one function per layer, activations kept for the backward) and computes exactly what
 *    tlm_forward_batch computes (pre-LN, LayerNorm eps 1e-5, attention scaled by
 *    1/sqrt(C/NH), GELU tanh, lm head tied to wte) up to float rounding: the matrix products
 *    are OpenBLAS sgemm here, not compiler/tlm/gemm.c, so logits agree to ~1e-6 relative, not
 *    bitwise.
 *  - A batch is a set of whole sentences of different lengths. Their rows are stacked into
 *    one (total tokens, C) matrix for every matrix product; attention runs per sentence and
 *    head (sgemm calls over the head's columns). Every sentence starts at position 0.
 *  - Loss: the cross-entropy of the tokens marked in loss_mask (token t predicted from tokens
 *    0..t-1, i.e. from the logits of position t-1), each weighted by its sentence's weight,
 *    divided by the sum of those weights (the weighted count of trained tokens). A batch
 *    whose trained tokens weigh 0 in all is refused.
 *  - Optimizer: AdamW (bias-corrected, decoupled weight decay lr * weight_decay * p) after
 *    clipping the gradient to a global L2 norm. Weight decay applies to the 2-D tensors:
 *    qkv_w, attn_proj_w, fc_w, fc_proj_w and the two embeddings wte (which is also the lm
 *    head) and wpe, as GPT-2 / nanoGPT do; never to biases or LayerNorm gains and shifts.
 *    Learning rate: linear warm-up over warmup_steps (step s, counted from 0, uses
 *    lr * (s + 1) / warmup_steps), then a half cosine from lr down to lr * min_lr_frac at
 *    total_steps, and lr * min_lr_frac after it (total_steps 0: lr constant after warm-up).
 *  - Determinism: every loop of ours computes each output element on one thread in a fixed
 *    order, so given the same model bits, optimizer state, batch, build, OpenBLAS library and
 *    OpenBLAS thread count (OPENBLAS_NUM_THREADS, else the CPU count) a step gives the same
 *    bits, whatever the OpenMP thread count. OpenBLAS picks its kernels by CPU (or
 *    OPENBLAS_CORETYPE), so other hosts may differ in the last bits. Consequently a run that
 *    saves a checkpoint, loads it into a fresh trainer and continues is bitwise identical to
 *    one that never stopped (tested).
 *  - Checkpoint (model_weights/README.md, "Trainer checkpoints"): parameters, AdamW first and
 *    second moments, step count and options in one file, written to PATH.tmp.PID, fsynced and
 *    renamed into place. Loading validates everything (magic, version, header checksum, sizes,
 *    payload SHA-256, finiteness, a configuration and vocabulary hash equal to the trainer's
 *    model) before changing anything; a failure names the field. Loading restores the options
 *    saved with it (tlm_trainer_set_opts changes them afterwards, e.g. to extend a run).
 *  - A step whose loss or gradient is not finite is refused (TLM_ERUNTIME, field "grad")
 *    before any update: model, moments and step count stay as they were.
 *  - Speed (bench/tlm_train.c, bench/results/tlm_train.md): L=4, C=128, V=4281, 16 sentences of
 *    ~150 tokens take 0.65-0.8 s a step on one core of the busy 2-core build machine (about
 *    3000-3700 tokens/s); there OpenBLAS's own threads (its default is one per core) made steps
 *    slower, so a trainer on a shared machine should run with OPENBLAS_NUM_THREADS=1 (or
 *    openblas_set_num_threads(1)); the library does not change that process-wide setting.
 *  - Threads: a tlm_trainer and its model belong to one thread at a time; nothing else may
 *    read the model during tlm_trainer_step (it changes in place). OpenMP and OpenBLAS use
 *    their own worker threads inside a call. A tlm_workspace used with the model before a
 *    step still holds the old lm head: use a fresh workspace after training (tlm.h).
 */
#ifndef TLM_TRAIN_H
#define TLM_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "compiler/tlm/tlm.h"

#define TLM_CKPT_VERSION 1
#define TLM_CKPT_HEADER_SIZE 256

typedef struct tlm_train_example {
    const int32_t *tokens; /* (n) a whole sentence: prompt ‖ decisions ‖ [EOS] */
    int n;                 /* 2 .. model n_ctx */
    /* (n) or NULL. loss_mask[t] != 0: the model is trained to predict tokens[t] from
     * tokens[0..t-1] (so loss_mask[0] must be 0). NULL: every t >= n_prompt. */
    const uint8_t *loss_mask;
    int n_prompt; /* 1 .. n - 1; used when loss_mask == NULL */
    float weight; /* >= 0, finite; e.g. from measured speed */
} tlm_train_example;

typedef struct tlm_train_opts {
    double lr;                              /* peak learning rate, > 0 */
    double min_lr_frac;                     /* the cosine ends at lr * min_lr_frac; 0 .. 1 */
    int warmup_steps;                       /* >= 0 */
    int total_steps;                        /* 0 (no decay) or >= warmup_steps */
    double beta1, beta2, eps, weight_decay; /* AdamW: betas in [0, 1), eps > 0, decay >= 0 */
    double grad_clip;                       /* global L2 norm clip; 0 = none */
    uint64_t seed; /* recorded in checkpoints; nothing in a step is random today */
} tlm_train_opts;

/* lr 1e-3, min_lr_frac 0.1, warm-up 100 of 10000 steps, betas 0.9 / 0.95, eps 1e-8, weight
 * decay 0.1, clip 1.0, seed 0. */
void tlm_train_opts_default(tlm_train_opts *o);
/* 0 or TLM_EINVAL naming the offending field. */
int tlm_train_opts_check(const tlm_train_opts *o, tlm_error *err);
/* The learning rate step `step` (from 0) uses. */
double tlm_train_lr(const tlm_train_opts *o, int step);

typedef struct tlm_train_stats {
    double loss;      /* weighted mean cross-entropy per trained token */
    double grad_norm; /* global L2 norm of the gradient, before clipping */
    double lr;        /* learning rate this step used */
    long tokens;      /* trained (loss) tokens in the batch */
    long rows;        /* all tokens in the batch (rows through the model) */
    int step;         /* steps done, this one included */
} tlm_train_stats;

typedef struct tlm_trainer tlm_trainer;

/* A trainer for m (trained in place; m must outlive it). AdamW moments start at zero. */
int tlm_trainer_new(tlm_model *m, const tlm_train_opts *o, tlm_trainer **out, tlm_error *err);
void tlm_trainer_free(tlm_trainer *tr);

/* One optimizer step over a batch of n >= 1 examples: forward, backward, clip, AdamW. On a
 * refused batch (validated before anything changes) model and state are untouched. st may be
 * NULL. */
int tlm_trainer_step(tlm_trainer *tr, const tlm_train_example *batch, int n, tlm_train_stats *st,
                     tlm_error *err);
/* Loss only (no update), e.g. validation. tokens (may be NULL): trained tokens. */
int tlm_trainer_eval(tlm_trainer *tr, const tlm_train_example *batch, int n, double *loss,
                     long *tokens, tlm_error *err);

/* Loss and full gradient (n_params floats, file order; grad may be NULL for the loss only) of
 * a batch, with a private workspace: used by the gradient checks and tests. */
int tlm_loss_and_grad(const tlm_model *m, const tlm_train_example *batch, int n, double *loss,
                      float *grad, tlm_error *err);

/* The training forward's logits (V each) of every trained token, in batch order then position
 * order: for each t with a trained tokens[t], the logits of position t - 1. out holds (trained
 * tokens, V) floats. For comparing the training forward with tlm_forward_batch. */
int tlm_train_logits(const tlm_model *m, const tlm_train_example *batch, int n, float *out,
                     tlm_error *err);

/* Checkpoints; see the contract above. */
int tlm_trainer_save(const tlm_trainer *tr, const char *path, tlm_error *err);
int tlm_trainer_load(tlm_trainer *tr, const char *path, tlm_error *err);

int tlm_trainer_step_count(const tlm_trainer *tr);
const tlm_train_opts *tlm_trainer_opts(const tlm_trainer *tr);
int tlm_trainer_set_opts(tlm_trainer *tr, const tlm_train_opts *o, tlm_error *err);
/* Loops with less work than this (floats) stay on the calling thread (default 2^22, see
 * train.c); 0 makes every loop an OpenMP region. Results never depend on it. */
void tlm_trainer_set_parallel_min(tlm_trainer *tr, size_t work);
/* The gradient the last step applied (after clipping), n_params floats; NULL before the first
 * step. */
const float *tlm_trainer_grad(const tlm_trainer *tr);

#endif
