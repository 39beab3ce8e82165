/* decoder.c — the decoder thread: it owns the tlm_decoder (and so the model's KV caches) and
 * batches every pending decode, continuous-batching style: requests arrive through a queue,
 * are admitted into free slots (their prompt is prefilled by the next step) and each step
 * advances every active request by one token. Finished requests are turned into candidates
 * (tlm_select_result validates them against the space) and posted back to the loop. */
#include <stdlib.h>
#include <string.h>

#include "daemon/tlmd.h"

static pthread_t thread;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static dec_item *pending_head, *pending_tail;
static bool stop, running, started;
static int depth; /* queued + active, for metrics */
static tlm_decoder *dec;
static const tlm_model *model;

int dec_queue_depth(void)
{
    pthread_mutex_lock(&mu);
    int d = depth;
    pthread_mutex_unlock(&mu);
    return d;
}

int dec_submit(dec_item *it)
{
    it->t_submit = tlmd_now();
    it->next = NULL;
    it->slot = -1;
    pthread_mutex_lock(&mu);
    if (stop || !running) {
        pthread_mutex_unlock(&mu);
        return TLM_EUNSUPPORTED;
    }
    if (pending_tail)
        pending_tail->next = it;
    else
        pending_head = it;
    pending_tail = it;
    depth++;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    return 0;
}

static void finish(dec_item *it)
{
    it->t_done = tlmd_now();
    if (it->ctx) {
        tlm_select_ctx_free(it->ctx);
        free(it->ctx);
        it->ctx = NULL;
    }
    pthread_mutex_lock(&mu);
    depth--;
    pthread_mutex_unlock(&mu);
    srv_post(it->done, it->user);
}

/* Prepares and admits one request; on failure it is finished with its error. */
static bool admit(dec_item *it)
{
    it->ctx = calloc(1, sizeof *it->ctx);
    if (!it->ctx) {
        it->rc = tlm_err_set(&it->err, TLM_ENOMEM, "", "out of memory");
        finish(it);
        return false;
    }
    it->rc = tlm_select_request(it->sp, model, it->k, it->ctx, &it->req, &it->err);
    if (it->rc == 0) {
        it->slot = tlm_decoder_add(dec, &it->req, &it->err);
        if (it->slot >= 0) {
            it->t_start = tlmd_now();
            return true;
        }
        it->rc = it->slot;
    }
    finish(it);
    return false;
}

static void collect(dec_item *it)
{
    tlm_slot_state s = tlm_decoder_state(dec, it->slot);
    int n = tlm_decoder_n_results(dec, it->slot);
    it->n_cands = 0;
    if (s == TLM_SLOT_FAILED) {
        const int32_t *tk;
        int nt;
        double sc;
        it->rc = tlm_decoder_result(dec, it->slot, 0, &tk, &nt, &sc, &it->err);
        if (!it->rc) it->rc = tlm_err_set(&it->err, TLM_ERUNTIME, "", "decoding failed");
    } else {
        for (int r = 0; r < n && it->n_cands < it->k; r++) {
            tlm_error e;
            if (tlm_select_result(dec, it->slot, r, it->sp, &it->cands[it->n_cands], &e) == 0)
                it->n_cands++;
            else if (!it->n_cands)
                it->err = e;
        }
        it->rc = it->n_cands ? 0 : (it->err.code ? it->err.code : TLM_ERUNTIME);
        if (it->rc && !it->err.msg[0])
            tlm_err_set(&it->err, TLM_ERUNTIME, "", "the model produced no schedule");
    }
    tlm_decoder_release(dec, it->slot);
    finish(it);
}

static void *dec_main(void *arg)
{
    int max_slots = g_srv.cfg.decoder_slots;
    dec_item **active = calloc((size_t)max_slots, sizeof *active);
    int n_active = 0;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!stop && !pending_head && n_active == 0)
            pthread_cond_wait(&cv, &mu);
        if (stop && n_active == 0 && !pending_head) break;
        /* admit what fits */
        dec_item *batch = NULL;
        int room = max_slots - n_active;
        while (pending_head && room > 0) {
            dec_item *it = pending_head;
            pending_head = it->next;
            if (!pending_head) pending_tail = NULL;
            it->next = batch;
            batch = it;
            room--;
        }
        bool stopping = stop;
        pthread_mutex_unlock(&mu);
        while (batch) {
            dec_item *it = batch;
            batch = it->next;
            if (stopping) {
                it->rc = tlm_err_set(&it->err, TLM_EUNSUPPORTED, "", "the server is shutting down");
                finish(it);
            } else if (admit(it)) {
                active[n_active++] = it;
            }
        }
        /* items the mask stopped at once are already done */
        int busy = 0;
        for (int i = 0; i < n_active; i++)
            if (tlm_decoder_state(dec, active[i]->slot) == TLM_SLOT_ACTIVE) busy++;
        if (busy) {
            metrics_batch(busy);
            tlm_error e;
            tlm_err_clear(&e);
            tlm_decoder_step(dec, &e); /* a failed step fails its requests: collected below */
        }
        int keep = 0;
        for (int i = 0; i < n_active; i++) {
            if (tlm_decoder_state(dec, active[i]->slot) == TLM_SLOT_ACTIVE)
                active[keep++] = active[i];
            else
                collect(active[i]);
        }
        n_active = keep;
        pthread_mutex_lock(&mu);
    }
    pthread_mutex_unlock(&mu);
    free(active);
    return NULL;
}

int dec_start(tlmd_server *s, tlm_error *err)
{
    model = s->model;
    int rc = tlm_decoder_new(model, s->cfg.decoder_slots, &dec, err);
    if (rc) return rc;
    running = true;
    if (pthread_create(&thread, NULL, dec_main, NULL)) {
        running = false;
        tlm_decoder_free(dec);
        dec = NULL;
        return tlm_err_set(err, TLM_ENOMEM, "", "cannot start the decoder thread");
    }
    started = true;
    return 0;
}

/* Active decodes run to completion (they are short); queued ones are failed. */
void dec_stop(void)
{
    if (!started) return;
    pthread_mutex_lock(&mu);
    stop = true;
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    pthread_join(thread, NULL);
    started = false;
    running = false;
    tlm_decoder_free(dec);
    dec = NULL;
}
