/* decoder.c — the decoder thread: it owns the tlm_decoder (and so the model's KV caches) and
 * batches every pending decode, continuous-batching style: requests arrive through a queue,
 * are admitted into free slots (their prompt is prefilled by the next step) and each step
 * advances every active request by one token. Finished requests are turned into candidates
 * (tlm_select_result validates them against the space) and posted back to the loop. */
#include <stdlib.h>
#include <string.h>

#include "daemon/tlmd.h"

struct dec {
    const tlmd_env *env;
    metrics *m;
    tlmd_inbox *q;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dec_item *pending_head, *pending_tail; /* under mu */
    bool stop, running, started;           /* under mu */
    int depth;                             /* queued + active, for metrics; under mu */
    /* the decoder thread's own */
    tlm_decoder *tdec;
    const tlm_model *model;
};

int dec_queue_depth(dec *d)
{
    if (!d) return 0;
    pthread_mutex_lock(&d->mu);
    int n = d->depth;
    pthread_mutex_unlock(&d->mu);
    return n;
}

int dec_submit(dec *d, dec_item *it)
{
    if (!d) return TLM_EUNSUPPORTED;
    it->t_submit = tlmd_now();
    it->next = NULL;
    it->slot = -1;
    pthread_mutex_lock(&d->mu);
    if (d->stop || !d->running) {
        pthread_mutex_unlock(&d->mu);
        return TLM_EUNSUPPORTED;
    }
    if (d->pending_tail)
        d->pending_tail->next = it;
    else
        d->pending_head = it;
    d->pending_tail = it;
    d->depth++;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static void finish(dec *d, dec_item *it)
{
    it->t_done = tlmd_now();
    if (it->ctx) {
        tlm_select_ctx_free(it->ctx);
        free(it->ctx);
        it->ctx = NULL;
    }
    pthread_mutex_lock(&d->mu);
    d->depth--;
    pthread_mutex_unlock(&d->mu);
    tlmd_post(d->q, it->done, it->user);
}

/* Prepares and admits one request; on failure it is finished with its error. */
static bool admit(dec *d, dec_item *it)
{
    it->ctx = calloc(1, sizeof *it->ctx);
    if (!it->ctx) {
        it->rc = tlm_err_set(&it->err, TLM_ENOMEM, "", "out of memory");
        finish(d, it);
        return false;
    }
    it->rc = tlm_select_request(it->sp, d->model, it->k, it->ctx, &it->req, &it->err);
    if (it->rc == 0) {
        it->slot = tlm_decoder_add(d->tdec, &it->req, &it->err);
        if (it->slot >= 0) {
            it->t_start = tlmd_now();
            return true;
        }
        it->rc = it->slot;
    }
    finish(d, it);
    return false;
}

static void collect(dec *d, dec_item *it)
{
    tlm_decoder *td = d->tdec;
    tlm_slot_state s = tlm_decoder_state(td, it->slot);
    int n = tlm_decoder_n_results(td, it->slot);
    it->n_cands = 0;
    if (s == TLM_SLOT_FAILED) {
        const int32_t *tk;
        int nt;
        double sc;
        it->rc = tlm_decoder_result(td, it->slot, 0, &tk, &nt, &sc, &it->err);
        if (!it->rc) it->rc = tlm_err_set(&it->err, TLM_ERUNTIME, "", "decoding failed");
    } else {
        for (int r = 0; r < n && it->n_cands < it->k; r++) {
            tlm_error e;
            if (tlm_select_result(td, it->slot, r, it->sp, &it->cands[it->n_cands], &e) == 0)
                it->n_cands++;
            else if (!it->n_cands)
                it->err = e;
        }
        it->rc = it->n_cands ? 0 : (it->err.code ? it->err.code : TLM_ERUNTIME);
        if (it->rc && !it->err.msg[0])
            tlm_err_set(&it->err, TLM_ERUNTIME, "", "the model produced no schedule");
    }
    tlm_decoder_release(td, it->slot);
    finish(d, it);
}

static void *dec_main(void *arg)
{
    dec *d = arg;
    tlm_decoder *td = d->tdec;
    int max_slots = d->env->cfg.decoder_slots;
    dec_item **active = calloc((size_t)max_slots, sizeof *active);
    int n_active = 0;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && !d->pending_head && n_active == 0)
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->stop && n_active == 0 && !d->pending_head) break;
        /* admit what fits */
        dec_item *batch = NULL;
        int room = max_slots - n_active;
        while (d->pending_head && room > 0) {
            dec_item *it = d->pending_head;
            d->pending_head = it->next;
            if (!d->pending_head) d->pending_tail = NULL;
            it->next = batch;
            batch = it;
            room--;
        }
        bool stopping = d->stop;
        pthread_mutex_unlock(&d->mu);
        while (batch) {
            dec_item *it = batch;
            batch = it->next;
            if (stopping) {
                it->rc = tlm_err_set(&it->err, TLM_EUNSUPPORTED, "", "the server is shutting down");
                finish(d, it);
            } else if (admit(d, it)) {
                active[n_active++] = it;
            }
        }
        /* items the mask stopped at once are already done */
        int busy = 0;
        for (int i = 0; i < n_active; i++)
            if (tlm_decoder_state(td, active[i]->slot) == TLM_SLOT_ACTIVE) busy++;
        if (busy) {
            metrics_batch(d->m, busy);
            tlm_error e;
            tlm_err_clear(&e);
            tlm_decoder_step(td, &e); /* a failed step fails its requests: collected below */
        }
        int keep = 0;
        for (int i = 0; i < n_active; i++) {
            if (tlm_decoder_state(td, active[i]->slot) == TLM_SLOT_ACTIVE)
                active[keep++] = active[i];
            else
                collect(d, active[i]);
        }
        n_active = keep;
        pthread_mutex_lock(&d->mu);
    }
    pthread_mutex_unlock(&d->mu);
    free(active);
    return NULL;
}

int dec_start(const tlmd_env *env, metrics *m, tlmd_inbox *q, dec **out, tlm_error *err)
{
    *out = NULL;
    dec *d = calloc(1, sizeof *d);
    if (!d) return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    d->env = env;
    d->m = m;
    d->q = q;
    d->model = env->model;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    int rc = tlm_decoder_new(d->model, env->cfg.decoder_slots, &d->tdec, err);
    /* the forward passes run where main.c put the weights (the GPU for cuda / auto) */
    if (!rc && env->dev) rc = tlm_decoder_set_device(d->tdec, env->dev, err);
    if (rc) {
        dec_free(d);
        return rc;
    }
    d->running = true;
    if (pthread_create(&d->thread, NULL, dec_main, d)) {
        d->running = false;
        dec_free(d);
        return tlm_err_set(err, TLM_ENOMEM, "", "cannot start the decoder thread");
    }
    d->started = true;
    *out = d;
    return 0;
}

/* Active decodes run to completion (they are short); queued ones are failed. */
void dec_stop(dec *d)
{
    if (!d || !d->started) return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    d->started = false;
    d->running = false;
}

void dec_free(dec *d)
{
    if (!d) return;
    dec_stop(d);
    tlm_decoder_free(d->tdec);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d);
}
