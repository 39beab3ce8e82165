/* fuzz_onnx.c — libFuzzer: bytes as an ONNX model for fe_onnx_import (compiler/frontend), the
 * path of POST /v1/compile's "onnx", `tlmc compile --onnx` and `tlm run --inputs FILE.onnx`.
 * A model that imports is also fused and planned, as the server does with it; a refusal must
 * say why. Seeds: the test models of tests/data/onnx (tests/fuzz/corpus/onnx). */
#include <stdint.h>
#include <stdlib.h>

#include "compiler/frontend/frontend.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fe_graph *g = NULL;
    fe_onnx_weights w = {0};
    tlm_error e;
    tlm_err_clear(&e);
    if (fe_onnx_import(data, size, &g, &w, &e) != 0) {
        if (!e.msg[0] || !e.field[0] || g) __builtin_trap(); /* an error names its field */
        fe_onnx_weights_free(&w);
        return 0;
    }
    fe_fused fu;
    if (fe_fuse(g, &fu, &e) == 0) {
        fe_plan plan = {0};
        if (fe_plan_build(g, &fu, 0, &plan, &e) == 0) fe_plan_free(&plan);
        fe_fused_free(&fu);
    }
    fe_onnx_weights_free(&w);
    fe_graph_free(g);
    return 0;
}
