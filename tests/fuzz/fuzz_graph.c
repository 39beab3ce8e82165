/* fuzz_graph.c — libFuzzer: bytes → JSON → fe_graph_from_json (the "graph" of a compile
 * request, proto/graph.md) → fe_fuse (subgraphs, deduplicated by workload hash) → the graph
 * back to JSON. */
#include <stdint.h>
#include <string.h>

#include <jansson.h>

#include "compiler/frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    if (!j) return 0;
    fe_graph *g = NULL;
    tlm_error e;
    tlm_err_clear(&e);
    if (fe_graph_from_json(j, &g, &e) == 0) {
        fe_fused fu;
        if (fe_fuse(g, &fu, &e) == 0) fe_fused_free(&fu);
        json_decref(fe_graph_to_json(g));
        fe_graph_free(g);
    } else if (!e.msg[0]) {
        __builtin_trap();
    }
    json_decref(j);
    return 0;
}
