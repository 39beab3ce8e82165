/* cmd_model.c — `tlm model init --layers L --heads H --dim D --ctx N [--seed S] -o FILE`:
 * a randomly initialised TLM for the current tensor-language vocabulary (GPT-2 init), and
 * `tlm model info FILE`: what a weight file holds. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"
#include "compiler/util/util.h"
#include "tools/tlm/cli.h"

static const char model_usage[] =
    "usage: tlm model init --layers L --heads H --dim D --ctx N [--seed S] -o FILE\n"
    "       tlm model info FILE\n"
    "  init writes a randomly initialised GPT-2 whose vocabulary is the tensor language's\n"
    "  (its size and hash are recorded in the file); info prints a file's header as JSON, with\n"
    "  \"trained\": true only when the MANIFEST beside the file says trained = true and names\n"
    "  the file's SHA-256; \"served\": trained and not held back (MANIFEST serve = default).\n";

static int init(int argc, char **argv)
{
    uint64_t L = 0, H = 0, D = 0, T = 0, seed = 1;
    const char *out = NULL;
    tlm_error e;
    static const struct option opts[] = {{"layers", required_argument, 0, 'l'},
                                         {"heads", required_argument, 0, 'H'},
                                         {"dim", required_argument, 0, 'd'},
                                         {"ctx", required_argument, 0, 'c'},
                                         {"seed", required_argument, 0, 's'},
                                         {"output", required_argument, 0, 'o'},
                                         {0, 0, 0, 0}};
    optind = 1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "o:", opts, NULL)) != -1) {
        int rc = 0;
        switch (c) {
        case 'l': rc = cli_parse_u64("layers", optarg, TLM_MAX_LAYERS, &L, &e); break;
        case 'H': rc = cli_parse_u64("heads", optarg, TLM_MAX_HEADS, &H, &e); break;
        case 'd': rc = cli_parse_u64("dim", optarg, TLM_MAX_EMBD, &D, &e); break;
        case 'c': rc = cli_parse_u64("ctx", optarg, TLM_MAX_CTX, &T, &e); break;
        case 's': rc = cli_parse_u64("seed", optarg, UINT64_MAX, &seed, &e); break;
        case 'o': out = optarg; break;
        default: fputs(model_usage, stderr); return cli_usage_error("model init: bad option");
        }
        if (rc) return cli_report(&e);
    }
    if (optind < argc) return cli_usage_error("model init: unexpected argument '%s'", argv[optind]);
    if (!L || !H || !D || !T || !out)
        return cli_usage_error("model init: --layers, --heads, --dim, --ctx and -o are required");
    tlm_config cfg = {(int)L, (int)H, (int)D, (int)T, lang_vocab_size()};
    uint8_t vh[32];
    lang_vocab_hash(vh);
    tlm_model *m = NULL;
    if (tlm_config_check(&cfg, &e)) return cli_report(&e);
    if (tlm_model_init_random(&cfg, vh, seed, &m, &e)) return cli_report(&e);
    int rc = tlm_model_save(m, out, &e);
    if (rc) {
        tlm_model_free(m);
        return cli_report(&e);
    }
    printf("{\"path\": \"%s\", \"params\": %zu, \"layers\": %d, \"heads\": %d, \"dim\": %d, "
           "\"ctx\": %d, \"vocab\": %d}\n",
           out, m->n_params, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_ctx, cfg.vocab_size);
    tlm_model_free(m);
    return CLI_OK;
}

static int info(int argc, char **argv)
{
    if (argc != 2) return cli_usage_error("model info: expected one FILE");
    tlm_error e;
    tlm_model *m = NULL;
    if (tlm_model_load(argv[1], 0, NULL, &m, &e)) {
        e.code = TLM_EINVAL;
        return cli_report(&e);
    }
    uint8_t vh[32];
    lang_vocab_hash(vh);
    char hex[65];
    tlm_hex(m->vocab_hash, 32, hex);
    tlm_weights_info wi;
    tlm_weights_manifest(argv[1], &wi);
    printf("{\"path\": \"%s\", \"params\": %zu, \"layers\": %d, \"heads\": %d, \"dim\": %d, "
           "\"ctx\": %d, \"vocab\": %d, \"vocab_hash\": \"%s\", \"sha256\": \"%s\", "
           "\"trained\": %s, \"served\": %s, \"matches_language\": %s}\n",
           argv[1], m->n_params, m->cfg.n_layer, m->cfg.n_head, m->cfg.n_embd, m->cfg.n_ctx,
           m->cfg.vocab_size, hex, wi.sha, wi.trained ? "true" : "false",
           wi.trained && !wi.held_back ? "true" : "false",
           m->cfg.vocab_size == lang_vocab_size() && !memcmp(vh, m->vocab_hash, 32) ? "true"
                                                                                     : "false");
    tlm_model_free(m);
    return CLI_OK;
}

static int run(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "init")) return init(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "info")) return info(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(model_usage, stdout);
        return CLI_OK;
    }
    fputs(model_usage, stderr);
    return cli_usage_error("model: expected 'init' or 'info'");
}

const cli_cmd cli_cmd_model = {"model", "make or inspect TLM weight files", run};
