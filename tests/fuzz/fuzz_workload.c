/* fuzz_workload.c — libFuzzer: bytes → JSON → proto_workload_decode_opts (the workload decoder
 * of every request) → when it decodes, the canonical form and the hash, which the cache key is
 * made of. Bad input must come back as an error naming a field, never a crash or a leak. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "compiler/ir/ir.h"
#include "proto/workload.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    unsigned flags = 0;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!j && strstr(je.text, "too big")) {
        j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_INT_AS_REAL,
                       &je);
        flags = PROTO_DECODE_INTS_AS_REAL;
    }
    if (!j) return 0;
    ir_workload w;
    tlm_error e;
    tlm_err_clear(&e);
    if (proto_workload_decode_opts(j, flags, &w, &e) == 0) {
        char canon[1024], hash[65];
        if (ir_workload_canonical(&w, canon, sizeof canon) >= 0) ir_workload_hash_hex(&w, hash);
    } else if (!e.msg[0]) {
        __builtin_trap(); /* an error must say what was wrong */
    }
    json_decref(j);
    return 0;
}
