/* fuzz_request.c — libFuzzer: bytes as the body of POST /v1/compile through
 * request_decode_compile (daemon/request.c), the decoder the server runs: fields, target,
 * mode, budget, workloads, graphs and zoo models (fused and deduplicated). The limits are the
 * server's defaults. An error must name what was wrong; a success must own its workloads. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "compiler/util/util.h"
#include "daemon/tlmd.h"

/* daemon/main.c's clock, which request.c times the fusion with */
double tlmd_now(void)
{
    return tlm_now_s();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static tlmd_env env;
    if (!env.cfg.max_workloads) {
        env.cfg.max_workloads = 64; /* daemon/main.c's defaults */
        env.cfg.max_candidates = 8;
        env.cfg.max_body = 1 << 20;
        snprintf(env.schedules_reason, sizeof env.schedules_reason, "no model (fuzzing)");
    }
    if (size > env.cfg.max_body) return 0; /* the server answers 413 before decoding */
    job_params p;
    memset(&p, 0, sizeof p);
    tlm_error e;
    tlm_err_clear(&e);
    int rc = request_decode_compile(&env, (const char *)data, size, NULL, &p, &e);
    if (rc) {
        if (!e.msg[0] || p.wl) __builtin_trap();
        return 0;
    }
    if (p.n < 1 || !p.wl) __builtin_trap();
    job_params_free(&p);
    return 0;
}
