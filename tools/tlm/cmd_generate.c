/* cmd_generate.c — `tlm generate --workload W --target T [--weights F] [--candidates k]`:
 * the tensor sentences the TLM writes for a workload on a target.
 *
 * Prints one JSON object: {"workload_hash", "target", "sketch", "weights", "vocab_hash",
 * "prompt": sentence text, "candidates": [{"schedule": printed (accepted by `tlm compile
 * --schedule`), "sentence": decision tokens, "score": sum of log-probabilities}]}.
 * Greedy (k = 1) and beam search (k > 1) decode under the grammar masks, so every candidate
 * is a legal schedule and the same weights give the same output. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/tlm/select.h"
#include "compiler/target/target.h"
#include "tools/tlm/cli.h"

static const char generate_usage[] =
    "usage: tlm generate --workload W --target T [--weights F] [--candidates k]\n"
    "  decodes k (default 1, at most 64) schedules with the TLM in F (default\n"
    "  model_weights/tlm.bin; make one with `tlm model init`) and prints them as JSON.\n";

static int run(int argc, char **argv)
{
    const char *wl = NULL, *tg = NULL, *weights = TLM_WEIGHTS_DEFAULT_PATH;
    uint64_t k = 1;
    tlm_error e;
    static const struct option opts[] = {{"workload", required_argument, 0, 'w'},
                                         {"target", required_argument, 0, 't'},
                                         {"weights", required_argument, 0, 'm'},
                                         {"candidates", required_argument, 0, 'k'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'w': wl = optarg; break;
        case 't': tg = optarg; break;
        case 'm': weights = optarg; break;
        case 'k':
            if (cli_parse_u64("candidates", optarg, TLM_MAX_BEAM, &k, &e) || k == 0) {
                if (k == 0) tlm_err_set(&e, TLM_EINVAL, "candidates", "must be in [1, %d]", TLM_MAX_BEAM);
                return cli_report(&e);
            }
            break;
        case 'h': fputs(generate_usage, stdout); return CLI_OK;
        default: fputs(generate_usage, stderr); return cli_usage_error("generate: bad option");
        }
    }
    if (optind < argc) return cli_usage_error("generate: unexpected argument '%s'", argv[optind]);
    if (!wl || !tg) return cli_usage_error("generate: --workload and --target are required");
    ir_workload w;
    if (cli_load_workload("workload", wl, &w, &e)) return cli_report(&e);
    target t;
    if (target_parse(tg, &t, &e)) return cli_report(&e);
    ir_subgraph *g = malloc(sizeof *g);
    space *sp = malloc(sizeof *sp);
    tlm_candidate *cand = calloc(k, sizeof *cand);
    tlm_model *m = NULL;
    int rc = CLI_FAIL;
    if (!g || !sp || !cand) {
        tlm_err_set(&e, TLM_ENOMEM, "", "out of memory");
        rc = cli_report(&e);
        goto out;
    }
    uint8_t vh[32];
    lang_vocab_hash(vh);
    if (ir_subgraph_build(&w, g, &e) || space_build(g, &t, sp, &e)) {
        rc = cli_report(&e);
        goto out;
    }
    if (tlm_model_load(weights, lang_vocab_size(), vh, &m, &e)) {
        /* a missing or wrong weight file is bad input from the user's point of view */
        e.code = TLM_EINVAL;
        if (!e.field[0]) snprintf(e.field, sizeof e.field, "weights");
        rc = cli_report(&e);
        goto out;
    }
    int n = 0;
    if (tlm_select_generate(m, sp, (int)k, cand, &n, &e)) {
        rc = cli_report(&e);
        goto out;
    }
    char hash[IR_HASH_HEX], vhex[65];
    ir_workload_hash_hex(&w, hash);
    lang_vocab_hash_hex(vhex);
    int ptoks[LANG_MAX_SENTENCE];
    int np = lang_encode_prompt(sp, ptoks, LANG_MAX_SENTENCE);
    char *text = malloc(65536);
    json_t *o = json_object(), *arr = json_array();
    lang_sentence_text(ptoks, np, text, 65536);
    json_object_set_new(o, "workload_hash", json_string(hash));
    json_object_set_new(o, "target", json_string(t.name));
    json_object_set_new(o, "sketch", json_string(space_sketch_name(sp->sketch)));
    json_object_set_new(o, "weights", json_string(weights));
    json_object_set_new(o, "vocab_hash", json_string(vhex));
    json_object_set_new(o, "prompt", json_string(text));
    for (int i = 0; i < n; i++) {
        json_t *ci = json_object();
        int toks[LANG_MAX_SENTENCE];
        for (int j = 0; j < cand[i].n_tokens; j++) toks[j] = cand[i].tokens[j];
        space_print(sp, &cand[i].sched, text, 65536);
        json_object_set_new(ci, "schedule", json_string(text));
        lang_sentence_text(toks, cand[i].n_tokens, text, 65536);
        json_object_set_new(ci, "sentence", json_string(text));
        json_object_set_new(ci, "score", json_real(cand[i].score));
        json_array_append_new(arr, ci);
    }
    json_object_set_new(o, "candidates", arr);
    rc = cli_print_json(o);
    json_decref(o);
    free(text);
out:
    tlm_model_free(m);
    free(cand);
    free(sp);
    free(g);
    return rc;
}

const cli_cmd cli_cmd_generate = {"generate", "decode schedules with the tensor language model",
                                  run};
