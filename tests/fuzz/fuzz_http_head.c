/* fuzz_http_head.c — libFuzzer: bytes as what a client sends first, through the front door's
 * parse exactly as daemon/http.c runs it (leading empty lines skipped, the head up to the
 * blank line, or HEAD_MAX bytes of an incomplete one) into http_head_check (daemon/head.c).
 * An answer other than 0 must be one of the statuses the door sends, with a code and a
 * message. */
#include <stdint.h>
#include <string.h>

#include "daemon/tlmd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > HEAD_MAX) size = HEAD_MAX; /* the door peeks at most this much */
    const char *p = (const char *)data;
    size_t lead = 0;
    while (lead < size && (p[lead] == '\r' || p[lead] == '\n'))
        lead++;
    p += lead;
    size_t m = size - lead;
    const char *blank = NULL;
    for (size_t i = 0; i + 1 < m && !blank; i++)
        if (p[i] == '\n' &&
            (p[i + 1] == '\n' || (p[i + 1] == '\r' && i + 2 < m && p[i + 2] == '\n')))
            blank = p + i + 1;
    const char *code = NULL;
    char msg[256] = "";
    int st;
    if (blank)
        st = http_head_check(p, (size_t)(blank - p) + 1, true, &code, msg, sizeof msg);
    else if (m)
        st = http_head_check(p, m, size >= HEAD_MAX, &code, msg, sizeof msg);
    else
        return 0;
    if (st && ((st != 400 && st != 414 && st != 431 && st != 505) || !code || !msg[0]))
        __builtin_trap();
    return 0;
}
