#include "compiler/util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <openssl/evp.h>

#include "compiler/util/err.h"

int64_t tlm_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double tlm_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

bool tlm_huge_pages_wanted(void)
{
    const char *e = getenv("TLM_HUGE_PAGES");
    return !e || (strcmp(e, "off") && strcmp(e, "0"));
}

void *tlm_alloc_big(size_t bytes, size_t align, bool *huge)
{
    *huge = false;
    if (bytes < TLM_HUGE_PAGE_BYTES || !tlm_huge_pages_wanted())
        return aligned_alloc(align, (bytes + align - 1) / align * align);
    const size_t b = (bytes + TLM_HUGE_PAGE_BYTES - 1) / TLM_HUGE_PAGE_BYTES * TLM_HUGE_PAGE_BYTES;
    void *p = aligned_alloc(TLM_HUGE_PAGE_BYTES, b);
    *huge = p && madvise(p, b, MADV_HUGEPAGE) == 0;
    return p;
}

void tlm_hex(const void *bytes, size_t n, char *out)
{
    static const char digit[] = "0123456789abcdef";
    const uint8_t *b = bytes;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digit[b[i] >> 4];
        out[2 * i + 1] = digit[b[i] & 15];
    }
    out[2 * n] = 0;
}

int tlm_sha256(const void *p, size_t n, uint8_t out[32])
{
    unsigned len = 0;
    if (!EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) || len != 32) {
        memset(out, 0, 32);
        return TLM_ENOMEM;
    }
    return 0;
}

int tlm_sha256_hex(const void *p, size_t n, char hex[65])
{
    uint8_t md[32];
    int rc = tlm_sha256(p, n, md);
    if (rc) {
        hex[0] = 0;
        return rc;
    }
    tlm_hex(md, 32, hex);
    return 0;
}

int tlm_sha256_file_hex(const char *path, char hex[65])
{
    hex[0] = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return TLM_EIO;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
    unsigned char buf[65536];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = EVP_DigestUpdate(ctx, buf, n);
    unsigned char md[32];
    unsigned int len = 0;
    ok = ok && !ferror(f) && EVP_DigestFinal_ex(ctx, md, &len) && len == 32;
    EVP_MD_CTX_free(ctx);
    fclose(f);
    if (!ok) return TLM_EIO;
    tlm_hex(md, 32, hex);
    return 0;
}
