/* pool.c — the compile pool: a fixed set of threads that run the pipeline's heavy steps
 * (pl_prepare; pl_finish with codegen, cc/NVRTC and measurement; the store inserts), first
 * in, first out. Store reads and cache hits stay on libuv's thread pool, so they never queue
 * behind a compile (issue 15: a hit took 4.4 s during a model compile when both shared
 * libuv's four threads). Completions come back to the loop through the pool's own uv_async,
 * drained whole per wake-up; while work is pending that handle is referenced, so the loop
 * does not end under a running compile (as with uv_queue_work). */
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/tlmd.h"

struct pool {
    uv_loop_t *loop;
    uv_async_t async;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pool_work *todo_head, *todo_tail; /* under mu: waiting for a thread */
    pool_work *done_head, *done_tail; /* under mu: finished, for the loop */
    bool stop;                        /* under mu */
    int pending;                      /* loop thread: submitted, done not yet called */
    int running;                      /* under mu */
    int n_threads;
    int nice;
    pthread_t *threads;
};

static void *pool_main(void *arg)
{
    pool *p = arg;
    /* Below the loop and the read pool: on a machine whose cores the compilers (cc, the
     * measurement runners: they inherit it) fill, a cache hit still gets a core at once.
     * Linux keeps a nice value per thread. */
    if (p->nice) setpriority(PRIO_PROCESS, (id_t)gettid(), p->nice);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->todo_head && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        if (!p->todo_head) break; /* stopping, nothing left */
        pool_work *w = p->todo_head;
        p->todo_head = w->next;
        if (!p->todo_head) p->todo_tail = NULL;
        p->running++;
        pthread_mutex_unlock(&p->mu);
        w->work(w);
        pthread_mutex_lock(&p->mu);
        p->running--;
        w->next = NULL;
        if (p->done_tail)
            p->done_tail->next = w;
        else
            p->done_head = w;
        p->done_tail = w;
        uv_async_send(&p->async);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void on_done(uv_async_t *a)
{
    pool *p = a->data;
    pthread_mutex_lock(&p->mu);
    pool_work *w = p->done_head;
    p->done_head = p->done_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (w) {
        pool_work *next = w->next;
        if (!w->posted && --p->pending == 0) uv_unref((uv_handle_t *)&p->async);
        w->done(w);
        w = next;
    }
}

pool *pool_new(uv_loop_t *loop, int n_threads, int nice)
{
    pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->loop = loop;
    p->nice = nice;
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads || uv_async_init(loop, &p->async, on_done)) {
        free(p->threads);
        free(p);
        return NULL;
    }
    p->async.data = p;
    uv_unref((uv_handle_t *)&p->async);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    for (int i = 0; i < n_threads; i++) {
        if (pthread_create(&p->threads[i], NULL, pool_main, p)) break;
        p->n_threads++;
    }
    if (p->n_threads == 0) {
        uv_close((uv_handle_t *)&p->async, NULL);
        free(p->threads);
        p->threads = NULL;
        pool_free(p); /* the handle closes on the loop's first turn: p must outlive it */
        return NULL;
    }
    return p;
}

void pool_submit(pool *p, pool_work *w)
{
    if (p->pending++ == 0) uv_ref((uv_handle_t *)&p->async);
    w->next = NULL;
    w->posted = false;
    pthread_mutex_lock(&p->mu);
    if (p->todo_tail)
        p->todo_tail->next = w;
    else
        p->todo_head = w;
    p->todo_tail = w;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

void pool_post(pool *p, pool_work *w)
{
    /* the running work holds a pending count, so the handle stays referenced until this
     * and the work's own completion have been delivered */
    w->next = NULL;
    w->posted = true;
    pthread_mutex_lock(&p->mu);
    if (p->done_tail)
        p->done_tail->next = w;
    else
        p->done_head = w;
    p->done_tail = w;
    pthread_mutex_unlock(&p->mu);
    uv_async_send(&p->async);
}

int pool_queued(pool *p)
{
    if (!p) return 0;
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (pool_work *w = p->todo_head; w; w = w->next)
        n++;
    pthread_mutex_unlock(&p->mu);
    return n;
}

static void pool_join(pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++)
        pthread_join(p->threads[i], NULL);
    free(p->threads);
    p->threads = NULL;
}

void pool_stop(pool *p)
{
    if (!p || !p->threads) return;
    pool_join(p);
    uv_close((uv_handle_t *)&p->async, NULL);
}

void pool_free(pool *p)
{
    if (!p) return;
    if (p->threads) pool_join(p); /* a start-up that failed: the loop never ran */
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}
