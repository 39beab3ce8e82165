/* cmd_htam.c — `tlm htam export|import|show`: the HTAM memory (compiler/tune/htam.h) in a
 * store, as JSON, to inspect it and move it between machines.
 *
 *   tlm htam export --store FILE [--target cpu|cuda] [-o FILE]   the "tlm-htam/1" document
 *   tlm htam import --store FILE FILE                            adds a document's statistics
 *   tlm htam show --store FILE [--target cpu|cuda]               a readable table */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "compiler/tune/htam.h"
#include "store/store.h"
#include "tools/tlm/cli.h"

static const char htam_usage[] =
    "usage: tlm htam export --store FILE [--target cpu|cuda] [-o FILE]\n"
    "       tlm htam import --store FILE FILE\n"
    "       tlm htam show --store FILE [--target cpu|cuda]\n"
    "  the HTAM memory (directions, strategies, transitions, their statistics) in a store\n";

static void row(const char *name, const json_t *o)
{
    double n = json_number_value(json_object_get(o, "n"));
    double r = json_number_value(json_object_get(o, "reward"));
    printf("  %-48s tries %5.0f  wins %4.0f  fails %4.0f  mean reward %+.3f\n", name, n,
           json_number_value(json_object_get(o, "wins")),
           json_number_value(json_object_get(o, "fails")), n > 0 ? r / n : 0.0);
}

static int run_htam(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(htam_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    const char *verb = argv[1], *store_path = NULL, *tname = "cpu", *out = NULL, *file = NULL;
    for (int i = 2; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--store") || !strcmp(o, "--target") || !strcmp(o, "-o")) {
            if (i + 1 >= argc) return cli_usage_error("htam: %s needs a value", o);
            const char *v = argv[++i];
            if (!strcmp(o, "--store"))
                store_path = v;
            else if (!strcmp(o, "--target"))
                tname = v;
            else
                out = v;
        } else if (o[0] == '-' && strcmp(o, "-")) {
            return cli_usage_error("htam: unknown option %s (see tlm htam --help)", o);
        } else if (!file) {
            file = o;
        } else {
            return cli_usage_error("htam: one FILE at most");
        }
    }
    if (!store_path) return cli_usage_error("htam: --store is required");
    if (strcmp(tname, "cpu") && strcmp(tname, "cuda"))
        return cli_usage_error("htam: --target must be cpu or cuda");
    bool exp = !strcmp(verb, "export"), imp = !strcmp(verb, "import"), show = !strcmp(verb, "show");
    if (!exp && !imp && !show)
        return cli_usage_error("htam: unknown verb \"%s\"; allowed: export, import, show", verb);
    if (imp && !file) return cli_usage_error("htam: import needs a FILE");
    if (!imp && file) return cli_usage_error("htam: %s takes no FILE", verb);
    tlm_error err;
    tlm_err_clear(&err);
    store *st = store_open(store_path, NULL, &err);
    if (!st) {
        err.code = TLM_EINVAL;
        snprintf(err.field, sizeof err.field, "--store");
        return cli_report(&err);
    }
    htam *m = htam_new(!strcmp(tname, "cuda") ? TARGET_CUDA : TARGET_CPU);
    htam_store_io io = {.load = store_htam_load, .save = store_htam_save, .st = st};
    int rc = htam_load(m, &io, &err);
    int status = CLI_OK;
    if (!rc && imp) {
        json_error_t je;
        json_t *doc = strcmp(file, "-") ? json_load_file(file, 0, &je) : json_loadf(stdin, 0, &je);
        if (!doc) {
            fprintf(stderr, "tlm: %s: not JSON: %s (line %d)\n", file, je.text, je.line);
            status = CLI_USAGE;
        } else if ((rc = htam_merge_json(m, doc, &err)) == 0) {
            /* the document's statistics are this run's increments */
            rc = htam_save(m, &io, &err);
        }
        json_decref(doc);
    }
    json_t *doc = !rc && status == CLI_OK ? htam_to_json(m) : NULL;
    if (doc && exp) {
        if (out && strcmp(out, "-")) {
            if (json_dump_file(doc, out, JSON_INDENT(2))) {
                fprintf(stderr, "tlm: -o: cannot write \"%s\"\n", out);
                status = CLI_FAIL;
            }
        } else {
            status = cli_print_json(doc);
        }
    } else if (doc && show) {
        printf("HTAM memory for %s targets (%s)\n", tname, store_path);
        size_t i;
        json_t *x;
        printf("directions (global nodes):\n");
        json_array_foreach(json_object_get(doc, "globals"), i, x)
            row(json_string_value(json_object_get(x, "name")), x);
        printf("strategies (local nodes):\n");
        json_array_foreach(json_object_get(doc, "locals"), i, x)
        {
            char nm[160];
            snprintf(nm, sizeof nm, "%s / %s", json_string_value(json_object_get(x, "global")),
                     json_string_value(json_object_get(x, "name")));
            row(nm, x);
        }
        printf("transitions:\n");
        json_array_foreach(json_object_get(doc, "edges"), i, x)
        {
            char nm[160];
            snprintf(nm, sizeof nm, "%s -> %s", json_string_value(json_object_get(x, "from")),
                     json_string_value(json_object_get(x, "to")));
            row(nm, x);
        }
    } else if (doc && imp) {
        status = cli_print_json(doc);
    }
    json_decref(doc);
    htam_free(m);
    store_close(st);
    if (rc) return cli_report(&err);
    return status;
}

const cli_cmd cli_cmd_htam = {"htam", "export / import / show the HTAM memory of a store",
                              run_htam};
