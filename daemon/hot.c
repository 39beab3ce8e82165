/* hot.c — the hot-kernel cache: the kernels this server served or compiled last, in memory,
 * on the loop thread, so a cache hit (GET /v1/kernels/{key}, or POST /v1/compile of a cached
 * workload) is answered in the loop's own turn: no thread hop, no store read, nothing shared
 * with the threads that compile. Measured under a mixed load (bench/hits.sh), the hop to
 * libuv's pool was what a hit waited for: the loop blocked on the pool's mutex while a worker
 * holding it waited for a core.
 *
 * Entries are deep copies of store_kernel rows whose blob was verified (a store read checks
 * the SHA-256; a compile computed it). Keys name their content (store_cache_key), so an entry
 * never goes stale; the store may evict a kernel the hot cache still serves, which is the
 * same kernel. Least recently used entries go when the bytes exceed the budget (hot_cache_bytes).
 * Uses are still counted in the store (store_kernel_note_use). Loop thread only: no locks. */
#include <stdlib.h>
#include <string.h>

#include "daemon/tlmd.h"

typedef struct hot_entry {
    store_kernel k;
    size_t bytes;
    struct hot_entry *prev, *next; /* LRU: head is the most recent */
    struct hot_entry *chain;       /* hash bucket */
} hot_entry;

struct hot {
    size_t max_bytes, bytes;
    hot_entry **buckets;
    size_t n_buckets, n;
    hot_entry *head, *tail;
    uint64_t hits, misses, inserted, evicted;
};

static size_t slen(const char *s)
{
    return s ? strlen(s) + 1 : 0;
}

static size_t kernel_bytes(const store_kernel *k)
{
    return sizeof(hot_entry) + k->binary_size + slen(k->workload_hash) + slen(k->target_hash) +
           slen(k->compiler_id) + slen(k->model_id) + slen(k->workload_json) +
           slen(k->target_name) + slen(k->schedule) + slen(k->sentence) + slen(k->source) +
           slen(k->format) + slen(k->entry) + slen(k->launch_json) + slen(k->schedule_source);
}

/* The key is 64 hex digits of a SHA-256: its first 16 are already uniform. */
static size_t bucket_of(const hot *h, const char *key)
{
    uint64_t v = 0;
    for (int i = 0; i < 16 && key[i]; i++) {
        char c = key[i];
        v = v << 4 | (uint64_t)(c <= '9' ? c - '0' : (c | 32) - 'a' + 10);
    }
    return (size_t)(v % h->n_buckets);
}

hot *hot_new(size_t max_bytes)
{
    if (!max_bytes) return NULL;
    hot *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->max_bytes = max_bytes;
    h->n_buckets = 4093;
    h->buckets = calloc(h->n_buckets, sizeof *h->buckets);
    if (!h->buckets) {
        free(h);
        return NULL;
    }
    return h;
}

static void lru_unlink(hot *h, hot_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        h->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        h->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(hot *h, hot_entry *e)
{
    e->prev = NULL;
    e->next = h->head;
    if (h->head) h->head->prev = e;
    h->head = e;
    if (!h->tail) h->tail = e;
}

static hot_entry *find(const hot *h, const char *key)
{
    for (hot_entry *e = h->buckets[bucket_of(h, key)]; e; e = e->chain)
        if (!strcmp(e->k.key, key)) return e;
    return NULL;
}

static void drop(hot *h, hot_entry *e)
{
    hot_entry **pp = &h->buckets[bucket_of(h, e->k.key)];
    while (*pp != e)
        pp = &(*pp)->chain;
    *pp = e->chain;
    lru_unlink(h, e);
    h->bytes -= e->bytes;
    h->n--;
    store_kernel_free(&e->k);
    free(e);
}

const store_kernel *hot_get(hot *h, const char *key)
{
    if (!h) return NULL;
    hot_entry *e = find(h, key);
    if (!e) {
        h->misses++;
        return NULL;
    }
    h->hits++;
    lru_unlink(h, e);
    lru_push(h, e);
    return &e->k;
}

void hot_put(hot *h, const store_kernel *k)
{
    if (!h || !k->binary || !k->binary_size) return;
    size_t bytes = kernel_bytes(k);
    if (bytes > h->max_bytes / 4) return; /* one huge kernel must not empty the cache */
    hot_entry *old = find(h, k->key);
    if (old && !strcmp(old->k.binary_sha256, k->binary_sha256)) {
        lru_unlink(h, old);
        lru_push(h, old);
        return;
    }
    if (old) drop(h, old); /* a tuned kernel replaces the one generate served under its key */
    hot_entry *e = calloc(1, sizeof *e);
    if (!e) return;
    if (store_kernel_copy(&e->k, k)) {
        free(e);
        return;
    }
    e->bytes = bytes;
    size_t b = bucket_of(h, k->key);
    e->chain = h->buckets[b];
    h->buckets[b] = e;
    lru_push(h, e);
    h->bytes += bytes;
    h->n++;
    h->inserted++;
    while (h->bytes > h->max_bytes && h->tail != e) {
        drop(h, h->tail);
        h->evicted++;
    }
}

void hot_stats_get(const hot *h, hot_stats *s)
{
    memset(s, 0, sizeof *s);
    if (!h) return;
    s->entries = h->n;
    s->bytes = h->bytes;
    s->max_bytes = h->max_bytes;
    s->hits = h->hits;
    s->misses = h->misses;
    s->evicted = h->evicted;
}

void hot_free(hot *h)
{
    if (!h) return;
    while (h->head)
        drop(h, h->head);
    free(h->buckets);
    free(h);
}
