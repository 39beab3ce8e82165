#include "compiler/util/util.h"

#include <string.h>
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
