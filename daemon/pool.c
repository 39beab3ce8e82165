/* pool.c — the compile pool: a fixed set of threads that run the pipeline's heavy steps
 * (pl_prepare; pl_finish with codegen, cc/NVRTC and measurement; the store inserts), first
 * in, first out. Store reads stay on libuv's thread pool and hot kernels on the loop
 * (hot.c), so they never queue behind a compile (issue 15: a hit took 4.4 s during a model
 * compile when both shared libuv's four threads). Completions come back to the loop through the pool's own uv_async,
 * drained whole per wake-up; while work is pending that handle is referenced, so the loop
 * does not end under a running compile (as with uv_queue_work). */
#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "daemon/tlmd.h"

/* The loop never takes a lock a pool thread can hold: work goes in through a lock-free stack
 * and a semaphore, and comes back through another lock-free stack and the uv_async. (With a
 * mutex shared both ways, a compile thread preempted while holding it, and these run at a
 * low priority on purpose, held the loop and every cache hit behind it: priority inversion,
 * seen as loop turns of 5-25 ms under bench/hits.sh's misses.) The threads' own FIFO is
 * under a mutex only they take. */
struct pool {
    uv_loop_t *loop;
    uv_async_t async;
    _Atomic(pool_work *) inbox; /* loop → threads: pushed newest first */
    sem_t avail;                /* one post per submitted work, and one per thread at stop */
    pthread_mutex_t tmu;        /* the threads' own */
    pool_work *fifo; /* under tmu: a batch taken from inbox, oldest first */
    _Atomic(pool_work *) done;        /* threads → loop: finished or posted, newest first */
    atomic_bool stop;
    atomic_int queued; /* submitted, not yet started */
    int pending;       /* loop thread: submitted, done not yet called */
    int n_threads;
    int nice;
    pthread_t *threads;
};

/* Pushes w on a lock-free stack. */
static void push(_Atomic(pool_work *) *top, pool_work *w)
{
    pool_work *old = atomic_load_explicit(top, memory_order_relaxed);
    do
        w->next = old;
    while (!atomic_compare_exchange_weak_explicit(top, &old, w, memory_order_release,
                                                  memory_order_relaxed));
}

/* Takes a whole stack, oldest first. */
static pool_work *take_all(_Atomic(pool_work *) *top)
{
    pool_work *w = atomic_exchange_explicit(top, NULL, memory_order_acquire), *fifo = NULL;
    while (w) {
        pool_work *next = w->next;
        w->next = fifo;
        fifo = w;
        w = next;
    }
    return fifo;
}

/* A thread: the next work (oldest first), or NULL when none is left. */
static pool_work *next_work(pool *p)
{
    pthread_mutex_lock(&p->tmu);
    if (!p->fifo) p->fifo = take_all(&p->inbox); /* the next batch only once this one is done */
    pool_work *w = p->fifo;
    if (w) {
        p->fifo = w->next;
        w->next = NULL;
    }
    pthread_mutex_unlock(&p->tmu);
    return w;
}

static void *pool_main(void *arg)
{
    pool *p = arg;
    /* Below the loop and the read pool: on a machine whose cores the compilers (cc, the
     * measurement runners: they inherit it) fill, a cache hit still gets a core at once.
     * Linux keeps a nice value per thread. Not SCHED_IDLE: these threads share the loop's
     * address space and locks (the mm's, malloc's), and one preempted holding them for as
     * long as the cores stay busy held the loop: measured with bench/hits.sh, hit p99 went
     * from 3.2 ms (nice) to 8-9 ms (SCHED_IDLE). */
    if (p->nice) setpriority(PRIO_PROCESS, (id_t)gettid(), p->nice);
    for (;;) {
        while (sem_wait(&p->avail) && errno == EINTR)
            ;
        pool_work *w = next_work(p);
        if (!w) {
            if (atomic_load(&p->stop)) break;
            continue;
        }
        atomic_fetch_sub(&p->queued, 1);
        w->work(w);
        push(&p->done, w);
        uv_async_send(&p->async);
    }
    return NULL;
}

static void on_done(uv_async_t *a)
{
    pool *p = a->data;
    pool_work *w = take_all(&p->done);
    while (w) {
        pool_work *next = w->next;
        w->next = NULL;
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
    pthread_mutex_init(&p->tmu, NULL);
    sem_init(&p->avail, 0, 0);
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
    w->posted = false;
    atomic_fetch_add(&p->queued, 1);
    push(&p->inbox, w);
    sem_post(&p->avail);
}

void pool_post(pool *p, pool_work *w)
{
    /* the running work holds a pending count, so the handle stays referenced until this
     * and the work's own completion have been delivered */
    w->posted = true;
    push(&p->done, w);
    uv_async_send(&p->async);
}

int pool_queued(pool *p)
{
    return p ? atomic_load(&p->queued) : 0;
}

static void pool_join(pool *p)
{
    atomic_store(&p->stop, true);
    for (int i = 0; i < p->n_threads; i++)
        sem_post(&p->avail);
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
    pthread_mutex_destroy(&p->tmu);
    sem_destroy(&p->avail);
    free(p);
}
