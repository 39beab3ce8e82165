/* l2.h — the cluster tier: Redis (hiredis) behind the local SQLite store (DESIGN §14).
 *
 * Contract:
 *  - Lookup order is L1 (the store) → L2 (Redis) → compile; an L2 hit fills L1; a compile
 *    writes L1 and L2 (jobs.c). Keys are namespaced and versioned:
 *      <ns>:v1:kernel:<cache key>   one string: "TLMK1\n", a JSON header (every store_kernel
 *                                   field but the blob, with binary_sha256), "\n", the blob
 *      <ns>:v1:lease:<cache key>    the compile lease: owner id, SET NX PX, renewed while held
 *      <ns>:v1:measure:<target>     measurement streams (cluster.h)
 *    A blob whose SHA-256 (or header, or key) does not match is a miss and is deleted.
 *  - Bounds: every kernel key gets the TTL redis_ttl_s (0: none); a blob over
 *    redis_max_blob_bytes is not written (L1 still has it). Redis' own memory bound is its
 *    `maxmemory` with an LRU policy (allkeys-lru, or volatile-lru since every key has a TTL):
 *    tlmd warns at start-up when the server reports maxmemory 0.
 *  - Degradation: every call has short connect/command timeouts. A failed call marks L2 down:
 *    calls fail fast (TLM_EIO, no network) until the back-off (0.25 s doubling to 8 s) has
 *    passed, then one reconnect is tried. A failure is never an error for a request: callers
 *    fall back to L1 and compiling. A warning is logged when L2 goes down and info when back.
 *  - Threads: any thread except the loop (every call may touch the network). Each thread has
 *    its own hiredis connection (thread-local, freed at thread exit). A keeper thread renews
 *    held leases and performs the releases that the loop asks for (l2_lease_drop).
 */
#ifndef TLMD_L2_H
#define TLMD_L2_H

#include <stdbool.h>
#include <stdint.h>

#include "compiler/util/err.h"
#include "store/store.h"

typedef struct l2 l2;

typedef struct l2_config {
    char url[1024];           /* redis://[:PASSWORD@]HOST:PORT[/DB], "" = no L2 */
    char password_file[1024]; /* first line is the password ("" = none or in the URL) */
    char ns[64];              /* key namespace (default "tlmd") */
    double ttl_s;             /* kernel TTL, 0 = none (default 7 days) */
    int64_t max_blob_bytes;   /* larger kernels stay L1-only (default 64 MiB) */
    int timeout_ms;           /* connect and command timeout (default 250) */
    int lease_ms;             /* compile lease TTL; renewed every lease_ms/3 (default 30000) */
    int claim_idle_ms;        /* measurement entries idle this long are claimed (default 60000) */
    int workers;              /* measurement workers in this daemon (default 1, 0: none) */
} l2_config;

void l2_config_defaults(l2_config *c);

/* Parses the URL and reads the password file; does not connect (a Redis that is down at
 * start-up is a degraded start, not an error). TLM_EINVAL naming the field ("redis",
 * "redis_password_file") for bad input; TLM_EUNSUPPORTED for rediss:// when hiredis has no
 * TLS. Starts the keeper thread. */
int l2_new(const l2_config *c, l2 **out, tlm_error *err);
void l2_free(l2 *l); /* NULL is a no-op; stops the keeper thread */
const l2_config *l2_cfg(const l2 *l);
const char *l2_owner_id(const l2 *l); /* "<host>:<pid>:<random>" */
bool l2_up(const l2 *l);

/* A kernel: 0 and *out filled (caller frees with store_kernel_free), TLM_ENOTFOUND on a miss
 * (including a corrupt entry, which is deleted), TLM_EIO when L2 is unavailable. */
int l2_kernel_get(l2 *l, const char *key, store_kernel *out);
/* Writes k (binary_sha256 must be set) with the TTL. 0, TLM_ELIMIT (over the blob cap), TLM_EIO. */
int l2_kernel_put(l2 *l, const store_kernel *k);

/* The compile lease of key: 1 taken (the keeper renews it until l2_lease_drop), 0 held by
 * another daemon, TLM_EIO. */
int l2_lease_take(l2 *l, const char *key);
/* Stops renewing and releases the lease (only if still ours) from the keeper thread: safe on
 * the loop thread, never blocks. */
void l2_lease_drop(l2 *l, const char *key);

/* Raw commands for cluster.c and the tests (the thread's connection; NULL when down). The
 * reply is a redisReply * the caller frees with freeReplyObject. */
void *l2_command(l2 *l, int argc, const char **argv, const size_t *lens);
/* Like l2_command, with a longer socket timeout for blocking reads (XREADGROUP BLOCK). */
void *l2_command_blocking(l2 *l, int block_ms, int argc, const char **argv, const size_t *lens);

/* Counters for /metrics (any thread). */
typedef enum l2_counter {
    L2_C_MEASURED,    /* measurements this daemon's workers made for the cluster */
    L2_C_LEASE_WAITS, /* flights that waited for another daemon's compile */
    L2_C_TAKEOVERS,   /* flights that took a lease after waiting (its holder died or failed) */
    L2_C_WAIT_HITS,   /* flights that waited and got the other daemon's kernel */
    L2_C_CLAIMED,     /* measurement entries claimed from a worker idle too long */
    L2_C_COUNT
} l2_counter;
void l2_count(l2 *l, l2_counter c); /* NULL l: no-op */
/* Prometheus text of the tlmd_l2_* series, appended to /metrics; malloc'ed. NULL l: the
 * series with l2 absent (tlmd_l2_up 0, tlmd_l2_enabled 0). */
char *l2_metrics_render(const l2 *l);

#endif
