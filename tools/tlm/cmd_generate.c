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

#include "compiler/driver/pipeline.h"
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
    tlm_model *m = NULL;
    pl_job j;
    memset(&j, 0, sizeof j);
    int rc = CLI_FAIL;
    uint8_t vh[32];
    lang_vocab_hash(vh);
    if (tlm_model_load(weights, lang_vocab_size(), vh, &m, &e)) {
        /* a missing or wrong weight file is bad input from the user's point of view */
        e.code = TLM_EINVAL;
        if (!e.field[0]) snprintf(e.field, sizeof e.field, "weights");
        rc = cli_report(&e);
        goto out;
    }
    /* the pipeline's first half: subgraph, space and the model's candidates (nothing built) */
    pl_opts o;
    pl_opts_init(&o);
    o.mode = k > 1 ? PL_MODE_TOPK : PL_MODE_TLM;
    o.k = (int)k;
    o.model = m;
    if (pl_prepare(&j, &w, &t, &o, &e) || pl_decode(&j, &e)) {
        rc = cli_report(&e);
        goto out;
    }
    char vhex[65];
    lang_vocab_hash_hex(vhex);
    int ptoks[LANG_MAX_SENTENCE];
    int np = lang_encode_prompt(j.sp, ptoks, LANG_MAX_SENTENCE);
    char *text = malloc(65536);
    json_t *o_json = json_object(), *arr = json_array();
    if (!text || !o_json || !arr) {
        free(text);
        json_decref(o_json);
        json_decref(arr);
        tlm_err_set(&e, TLM_ENOMEM, "", "out of memory");
        rc = cli_report(&e);
        goto out;
    }
    lang_sentence_text(ptoks, np, text, 65536);
    json_object_set_new(o_json, "workload_hash", json_string(j.whash));
    json_object_set_new(o_json, "target", json_string(t.name));
    json_object_set_new(o_json, "sketch", json_string(space_sketch_name(j.sp->sketch)));
    json_object_set_new(o_json, "weights", json_string(weights));
    json_object_set_new(o_json, "vocab_hash", json_string(vhex));
    json_object_set_new(o_json, "prompt", json_string(text));
    for (int i = 0; i < j.n_cands; i++) {
        json_t *ci = json_object();
        space_print(j.sp, &j.cands[i].sched, text, 65536);
        json_object_set_new(ci, "schedule", json_string(text));
        if (pl_sentence(&j, i, text, 65536) < 0) text[0] = 0;
        json_object_set_new(ci, "sentence", json_string(text));
        json_object_set_new(ci, "score", json_real(j.cands[i].score));
        json_object_set_new(ci, "schedule_source", json_string(pl_source_name(j.cands[i].source)));
        json_array_append_new(arr, ci);
    }
    json_object_set_new(o_json, "candidates", arr);
    rc = cli_print_json(o_json);
    json_decref(o_json);
    free(text);
out:
    pl_job_free(&j);
    tlm_model_free(m);
    return rc;
}

const cli_cmd cli_cmd_generate = {"generate", "decode schedules with the tensor language model",
                                  run};
