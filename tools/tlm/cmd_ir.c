/* cmd_ir.c — `tlm ir --workload W [--stages]`: what the IR makes of a workload.
 *
 * Prints one JSON object: {"workload": canonical form as an object, "canonical": its bytes,
 * "workload_hash", "flops", "bytes", "tensors": [{"name", "shape", "dtype", "kind"}],
 * "stages": count}. With --stages, the text dump of the lowered stages instead. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/tlm/cli.h"

static const char ir_usage[] =
    "usage: tlm ir --workload W [--stages]\n"
    "  W is inline JSON, @FILE or @- (stdin), e.g.\n"
    "    tlm ir --workload '{\"op\": \"dense\", \"shape\": {\"M\": 64, \"N\": 32, \"K\": 16}}'\n"
    "  prints the canonical form, workload hash, FLOPs, bytes moved and tensors as JSON;\n"
    "  --stages prints the lowered stages as text instead.\n";

static const char *kind_name(ir_tensor_kind k)
{
    switch (k) {
    case IR_T_INPUT:
        return "input";
    case IR_T_TEMP:
        return "temp";
    case IR_T_OUTPUT:
        return "output";
    }
    return "?";
}

static int print_stages(const ir_subgraph *g)
{
    /* ir_subgraph_print truncates; grow until the dump fits. */
    for (size_t cap = 1u << 16; cap <= (64u << 20); cap *= 4) {
        char *buf = malloc(cap);
        if (!buf) break;
        int n = ir_subgraph_print(g, buf, cap);
        if (n >= 0 && (size_t)n < cap - 1) {
            fwrite(buf, 1, (size_t)n, stdout);
            if (n == 0 || buf[n - 1] != '\n') fputc('\n', stdout);
            free(buf);
            return fflush(stdout) ? CLI_FAIL : CLI_OK;
        }
        free(buf);
        if (n < 0) break;
    }
    tlm_error e;
    tlm_err_set(&e, TLM_ENOMEM, "", "cannot print the stages");
    return cli_report(&e);
}

static json_t *describe(const ir_workload *w, const ir_subgraph *g, tlm_error *err)
{
    char canon[1024], hex[IR_HASH_HEX];
    int n = ir_workload_canonical(w, canon, sizeof canon);
    if (n < 0) {
        tlm_err_set(err, n, "", "cannot form the canonical form");
        return NULL;
    }
    int rc = ir_workload_hash_hex(w, hex);
    if (rc) {
        tlm_err_set(err, rc, "", "cannot hash the workload");
        return NULL;
    }
    json_error_t je;
    json_t *canon_obj = json_loadb(canon, (size_t)n, 0, &je);
    if (!canon_obj) {
        tlm_err_set(err, TLM_EIO, "", "internal: the canonical form is not JSON: %s", je.text);
        return NULL;
    }
    json_t *tensors = json_array();
    for (int i = 0; tensors && i < g->n_tensor; i++) {
        const ir_tensor *t = &g->tensor[i];
        json_t *shape = json_array();
        for (int d = 0; shape && d < t->ndim; d++)
            json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(tensors, json_pack("{s:s, s:o*, s:s, s:s}", "name", t->name, "shape",
                                                 shape, "dtype", ir_dtype_name(t->dtype), "kind",
                                                 kind_name(t->kind)));
    }
    json_t *out =
        json_pack("{s:o, s:s, s:s, s:I, s:I, s:o*, s:i}", "workload", canon_obj, "canonical", canon,
                  "workload_hash", hex, "flops", (json_int_t)ir_subgraph_flops(g), "bytes",
                  (json_int_t)ir_subgraph_bytes(g), "tensors", tensors, "stages", g->n_stage);
    if (!out || !tensors || json_array_size(tensors) != (size_t)g->n_tensor) {
        json_decref(out);
        tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        return NULL;
    }
    return out;
}

static int run_ir(int argc, char **argv)
{
    static const struct option opts[] = {
        {"workload", required_argument, NULL, 'w'},
        {"stages", no_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *wl = NULL;
    bool stages = false;
    opterr = 0;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, ":w:sh", opts, NULL)) != -1) {
        switch (ch) {
        case 'w':
            wl = optarg;
            break;
        case 's':
            stages = true;
            break;
        case 'h':
            fputs(ir_usage, stdout);
            return CLI_OK;
        case ':':
            return cli_usage_error("ir: %s needs a value", argv[optind - 1]);
        default:
            return cli_usage_error("ir: unknown option %s (see tlm ir --help)", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("ir: unexpected argument \"%s\" (see tlm ir --help)", argv[optind]);
    if (!wl) return cli_usage_error("ir: --workload is required (see tlm ir --help)");

    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    if (cli_load_workload("--workload", wl, &w, &err)) return cli_report(&err);
    /* A subgraph is a few hundred KB: heap, not stack. */
    ir_subgraph *g = calloc(1, sizeof *g);
    if (!g) {
        tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
        return cli_report(&err);
    }
    int rc;
    if (ir_subgraph_build(&w, g, &err)) {
        rc = cli_report(&err);
    } else if (stages) {
        rc = print_stages(g);
    } else {
        json_t *out = describe(&w, g, &err);
        rc = out ? cli_print_json(out) : cli_report(&err);
        json_decref(out);
    }
    free(g);
    return rc;
}

const cli_cmd cli_cmd_ir = {"ir", "canonical form, workload hash, FLOPs and bytes of a workload",
                            run_ir};
