/* util.h — the small helpers every module used to copy: a monotonic clock, SHA-256 as
 * lower-case hex, and whether big host buffers go in huge pages.
 *
 * Contract: any thread; no allocation except inside libcrypto. util.c needs only libc and
 * libcrypto, so programs that do not link libtlm (clients/tlmc) compile it on its own.
 */
#ifndef TLM_UTIL_UTIL_H
#define TLM_UTIL_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* CLOCK_MONOTONIC: for durations and deadlines, never for dates. It is system-wide, so a
 * deadline taken in one process can be compared in another (measure's runner does). */
double tlm_now_s(void);
int64_t tlm_now_ns(void);

/* Writes the n bytes as 2n lower-case hex digits and a NUL into out (2n + 1 bytes). */
void tlm_hex(const void *bytes, size_t n, char *out);

/* SHA-256 of n bytes at p. Returns 0, or TLM_ENOMEM when libcrypto cannot allocate its
 * context (the only way SHA-256 can fail); then out is zeroed / hex is "". */
int tlm_sha256(const void *p, size_t n, uint8_t out[32]);
int tlm_sha256_hex(const void *p, size_t n, char hex[65]);
/* SHA-256 of a whole file, streamed; TLM_EIO when it cannot be read. */
int tlm_sha256_file_hex(const char *path, char hex[65]);

/* Big host buffers (a plan's arena and packed weights in compiler/runtime, the measure
 * runner's timing copies): tlm_alloc_big gives bytes aligned to align (a power of two, at
 * most TLM_HUGE_PAGE_BYTES) and rounded up to it, from free(); where the buffer spans a huge
 * page and huge pages are wanted (not when the environment sets TLM_HUGE_PAGES=off or 0:
 * tlm_huge_pages_wanted), from a huge-page boundary, rounded up to whole huge pages and
 * advised as transparent huge pages, *huge telling whether the kernel took the advice
 * (false otherwise). NULL when out of memory. */
#define TLM_HUGE_PAGE_BYTES ((size_t)2 << 20)
bool tlm_huge_pages_wanted(void);
void *tlm_alloc_big(size_t bytes, size_t align, bool *huge);

#endif
