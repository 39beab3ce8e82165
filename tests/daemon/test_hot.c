/* test_hot.c — the hot-kernel cache (daemon/hot.c, a loop-thread module of tlmd with no
 * dependency on the loop itself, so it is compiled into this test directly): lookups, the LRU
 * order under a byte budget, a replaced kernel under the same key, what is refused, the
 * counters. The daemon's use of it is covered by test_integration (hits at max_jobs, GET). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/hot.c"

static void mk(store_kernel *k, int i, size_t bin, char shatag)
{
    memset(k, 0, sizeof *k);
    snprintf(k->key, sizeof k->key, "%016x%048d", (unsigned)(i * 2654435761u), 0);
    k->binary = malloc(bin);
    cr_assert_not_null(k->binary);
    memset(k->binary, i, bin);
    k->binary_size = bin;
    memset(k->binary_sha256, shatag, 64);
    k->binary_sha256[64] = 0;
    k->entry = strdup("kernel");
    k->format = strdup("elf-so");
    k->schedule_source = strdup("default");
}

Test(hot, off_when_the_budget_is_zero)
{
    cr_assert_null(hot_new(0));
    store_kernel k;
    mk(&k, 1, 100, 'a');
    hot_put(NULL, &k); /* every call takes the NULL cache */
    cr_assert_null(hot_get(NULL, k.key));
    hot_stats s;
    hot_stats_get(NULL, &s);
    cr_assert_eq(s.entries, 0);
    hot_free(NULL);
    store_kernel_free(&k);
}

Test(hot, get_returns_a_copy_and_counts)
{
    hot *h = hot_new(1 << 20);
    cr_assert_not_null(h);
    store_kernel k;
    mk(&k, 3, 1000, 'a');
    cr_assert_null(hot_get(h, k.key));
    hot_put(h, &k);
    const store_kernel *g = hot_get(h, k.key);
    cr_assert_not_null(g);
    cr_assert_neq(g->binary, k.binary, "the cache keeps its own copy");
    cr_assert_eq(g->binary_size, 1000);
    cr_assert_eq(memcmp(g->binary, k.binary, 1000), 0);
    cr_assert_str_eq(g->entry, "kernel");
    store_kernel_free(&k); /* the copy outlives the original */
    g = hot_get(h, g->key);
    cr_assert_not_null(g);
    cr_assert_eq(g->binary[999], 3);
    hot_stats s;
    hot_stats_get(h, &s);
    cr_assert_eq(s.entries, 1);
    cr_assert_eq(s.hits, 2);
    cr_assert_eq(s.misses, 1);
    cr_assert_gt(s.bytes, 1000);
    cr_assert_eq(s.max_bytes, 1 << 20);
    hot_free(h);
}

Test(hot, least_recently_used_go_first_within_the_budget)
{
    /* room for about 6 kernels of 10 KB */
    hot *h = hot_new(64 * 1024);
    store_kernel k[10];
    for (int i = 0; i < 10; i++)
        mk(&k[i], i + 1, 10 * 1024, 'a');
    for (int i = 0; i < 6; i++)
        hot_put(h, &k[i]);
    hot_stats s;
    hot_stats_get(h, &s);
    cr_assert_eq(s.entries, 6);
    cr_assert_eq(s.evicted, 0);
    /* 0 used again: 1 is now the oldest */
    cr_assert_not_null(hot_get(h, k[0].key));
    hot_put(h, &k[6]);
    hot_stats_get(h, &s);
    cr_assert_leq(s.bytes, s.max_bytes);
    cr_assert_eq(s.evicted, 1);
    cr_assert_null(hot_get(h, k[1].key), "the least recently used went");
    cr_assert_not_null(hot_get(h, k[0].key));
    for (int i = 7; i < 10; i++)
        hot_put(h, &k[i]);
    hot_stats_get(h, &s);
    cr_assert_leq(s.bytes, s.max_bytes);
    cr_assert_eq(s.entries, 6);
    cr_assert_not_null(hot_get(h, k[9].key), "the newest stays");
    cr_assert_not_null(hot_get(h, k[0].key), "used often, it stays");
    for (int i = 0; i < 10; i++)
        store_kernel_free(&k[i]);
    hot_free(h);
}

Test(hot, a_new_kernel_under_a_key_replaces_the_old_one)
{
    /* a tuned kernel is stored under the key generate looks up: it must not keep serving
     * the one served there before */
    hot *h = hot_new(1 << 20);
    store_kernel a, b;
    mk(&a, 5, 500, 'a');
    mk(&b, 5, 700, 'b');
    hot_put(h, &a);
    hot_put(h, &a); /* the same kernel again: nothing changes */
    hot_stats s;
    hot_stats_get(h, &s);
    cr_assert_eq(s.entries, 1);
    hot_put(h, &b);
    const store_kernel *g = hot_get(h, a.key);
    cr_assert_not_null(g);
    cr_assert_eq(g->binary_size, 700);
    cr_assert_eq(g->binary_sha256[0], 'b');
    hot_stats_get(h, &s);
    cr_assert_eq(s.entries, 1);
    store_kernel_free(&a);
    store_kernel_free(&b);
    hot_free(h);
}

Test(hot, refuses_kernels_without_a_binary_or_too_big)
{
    hot *h = hot_new(64 * 1024);
    store_kernel meta, big, ok;
    mk(&meta, 1, 10, 'a');
    free(meta.binary); /* what store_kernel_meta returns: no blob */
    meta.binary = NULL;
    mk(&big, 2, 20 * 1024, 'a'); /* over a quarter of the budget */
    mk(&ok, 3, 1024, 'a');
    hot_put(h, &ok);
    hot_put(h, &meta);
    hot_put(h, &big);
    cr_assert_null(hot_get(h, meta.key));
    cr_assert_null(hot_get(h, big.key));
    cr_assert_not_null(hot_get(h, ok.key), "a refused kernel evicts nothing");
    store_kernel_free(&meta);
    store_kernel_free(&big);
    store_kernel_free(&ok);
    hot_free(h);
}
