/* cmd_network.c — `tlm compile --model NAME | --graph FILE --target T [-o DIR]`: a whole network
 * to a directory of kernels and a manifest with its execution plan, without a server.
 *
 * (--onnx FILE: an ONNX model, imported by fe_onnx_import; its initializers are its weights,
 * which `tlm run --plan DIR --inputs FILE.onnx` binds.)
 * DIR gets the layout `tlmc compile -o DIR` writes (so `tlm run --plan DIR` reads either):
 *   NNN_<op>.so|.cubin, NNN_<op>.c|.cu   one kernel per unique subgraph (NNN its index)
 *   manifest.json   {"version", "server": null, "model" (kind, name, options, subgraphs,
 *                   launches, flops, macs), "target", "kernels": [{"index", "node",
 *                   "occurrences", "workload", "workload_hash", "entry", "format", "launch",
 *                   "binary", "source", "schedule_source", "compile_s"}], "plan" (proto/graph.md),
 *                   "stats": {"subgraphs", "launches", "seconds", "jobs"}}
 * Every kernel goes through the pipeline entry (compiler/driver/pipeline.h) with the default
 * schedule, --jobs of them at a time. Prints a JSON summary; exit status as `tlm compile`. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "compiler/driver/pipeline.h"
#include "compiler/frontend/frontend.h"
#include "compiler/target/target.h"
#include "compiler/util/util.h"
#include "tools/tlm/cli.h"

static const char network_usage[] =
    "usage: tlm compile (--model NAME [--batch B] [--image-size S] [--seq-len L] | --graph FILE\n"
    "                   | --onnx FILE.onnx)\n"
    "                   --target T [-o DIR] [--jobs N]\n"
    "  compiles every unique subgraph of the network with the default schedule into DIR\n"
    "  (default ./tlm-out): NNN_<op>.so|.cubin, the sources and manifest.json with the\n"
    "  execution plan (proto/graph.md); --jobs N kernels at a time (default 2)\n";

typedef struct {
    const char *model, *graph, *onnx, *tg, *dir;
    fe_zoo_opts zo;
    int jobs;
} net_args;

static int parse_net_args(int argc, char **argv, net_args *a, tlm_error *err)
{
    memset(a, 0, sizeof *a);
    a->dir = "tlm-out";
    a->jobs = 2;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(network_usage, stdout);
            return -1;
        }
        if (i + 1 >= argc) return cli_usage_error("compile: %s needs a value", o);
        const char *v = argv[++i];
        uint64_t n;
        if (!strcmp(o, "--model"))
            a->model = v;
        else if (!strcmp(o, "--graph"))
            a->graph = v;
        else if (!strcmp(o, "--onnx"))
            a->onnx = v;
        else if (!strcmp(o, "--target"))
            a->tg = v;
        else if (!strcmp(o, "-o") || !strcmp(o, "--out"))
            a->dir = v;
        else if (!strcmp(o, "--batch") || !strcmp(o, "--image-size") || !strcmp(o, "--seq-len") ||
                 !strcmp(o, "--jobs")) {
            if (cli_parse_u64(o, v, 1u << 20, &n, err)) return cli_report(err);
            if (!strcmp(o, "--batch"))
                a->zo.batch = (int64_t)n;
            else if (!strcmp(o, "--image-size"))
                a->zo.image_size = (int64_t)n;
            else if (!strcmp(o, "--seq-len"))
                a->zo.seq_len = (int64_t)n;
            else
                a->jobs = n < 1 ? 1 : n > 64 ? 64 : (int)n;
        } else
            return cli_usage_error("compile: unknown option %s (see tlm compile --help)", o);
    }
    if (!!a->model + !!a->graph + !!a->onnx != 1)
        return cli_usage_error(
            "compile: give exactly one of --model, --graph, --onnx (or --workload)");
    if (!a->tg) return cli_usage_error("compile: --target is required (see tlm compile --help)");
    return 0;
}

static int load_network(const net_args *a, fe_graph **g, tlm_error *err)
{
    if (a->model) {
        int rc = fe_zoo_build(a->model, &a->zo, g, err);
        /* every error here is the user's input: an unknown name exits 2 like a bad option */
        if (rc == TLM_ENOTFOUND) err->code = rc = TLM_EINVAL;
        if (rc && !strcmp(err->field, "name")) snprintf(err->field, sizeof err->field, "--model");
        return rc;
    }
    if (a->onnx) {
        size_t n;
        char *bytes = cli_read_onnx(a->onnx, &n, err);
        if (!bytes) return err->code;
        int rc = fe_onnx_import(bytes, n, g, NULL, err);
        free(bytes);
        return rc;
    }
    size_t len;
    char *text = cli_read_file("--graph", a->graph, &len, err);
    if (!text) return err->code;
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    free(text);
    if (!j)
        return tlm_err_set(err, TLM_EINVAL, "--graph", "not JSON: %s (line %d)", je.text, je.line);
    int rc = fe_graph_from_json(j, g, err);
    json_decref(j);
    return rc;
}

typedef struct {
    pl_job job;
    int rc;
    tlm_error err;
    double seconds;
} net_kernel;

int cli_compile_network(int argc, char **argv)
{
    net_args a;
    tlm_error err;
    tlm_err_clear(&err);
    int prc = parse_net_args(argc, argv, &a, &err);
    if (prc) return prc < 0 ? CLI_OK : prc;
    target t;
    if (target_parse(a.tg, &t, &err)) return cli_report(&err);
    bool cuda = t.kind == TARGET_CUDA;
    fe_graph *g = NULL;
    fe_fused fu = {0};
    fe_plan plan = {0};
    net_kernel *ks = NULL;
    json_t *man = NULL;
    int rc = CLI_OK;
    double t0 = tlm_now_s();
    if (load_network(&a, &g, &err) || fe_fuse(g, &fu, &err) ||
        fe_plan_build(g, &fu, cuda ? -1 : t.cpu.l2_bytes, &plan, &err)) {
        rc = cli_report(&err);
        goto done;
    }
    if (mkdir(a.dir, 0777) && errno != EEXIST) {
        tlm_err_set(&err, TLM_EIO, "-o", "cannot create \"%s\": %s", a.dir, strerror(errno));
        rc = cli_report(&err);
        goto done;
    }
    ks = calloc(fu.n + 1, sizeof *ks);
    if (!ks) {
        tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
        rc = cli_report(&err);
        goto done;
    }
    pl_opts o;
    pl_opts_init(&o);
    o.mode = PL_MODE_DEFAULT;
    o.measure = PL_MEASURE_OFF;
    /* each kernel is one cc / NVRTC run: a thread per job keeps --jobs compilers busy */
#pragma omp parallel for schedule(dynamic, 1) num_threads(a.jobs)
    for (int i = 0; i < fu.n; i++) {
        double s0 = tlm_now_s();
        tlm_err_clear(&ks[i].err);
        ks[i].rc = pl_run(&ks[i].job, &fu.sub[i].wl, &t, &o, &ks[i].err);
        ks[i].seconds = tlm_now_s() - s0;
    }
    json_t *list = json_array();
    man = json_pack("{s:i, s:n, s:o*, s:o*}", "version", 1, "server", "target", target_to_json(&t),
                    "kernels", list);
    for (int i = 0; man && i < fu.n; i++) {
        if (ks[i].rc) {
            char f[112];
            snprintf(f, sizeof f, "kernels[%d] (%s)", i, fu.sub[i].name);
            tlm_err_set(&err, ks[i].rc, f, "%s", ks[i].err.msg);
            rc = cli_report(&err);
            goto done;
        }
        const drv_artifact *art = &ks[i].job.art;
        const char *op = ir_op_get(fu.sub[i].wl.op)->name;
        char bin[96], src[96], path[4300];
        snprintf(bin, sizeof bin, "%03d_%s.%s", i, op, cuda ? "cubin" : "so");
        snprintf(src, sizeof src, "%03d_%s.%s", i, op, cuda ? "cu" : "c");
        snprintf(path, sizeof path, "%s/%s", a.dir, bin);
        if (cli_write_file(path, art->binary, art->binary_size, &err)) {
            rc = CLI_FAIL;
            cli_report(&err);
            goto done;
        }
        snprintf(path, sizeof path, "%s/%s", a.dir, src);
        if (cli_write_file(path, art->source, strlen(art->source), &err)) {
            rc = CLI_FAIL;
            cli_report(&err);
            goto done;
        }
        json_t *e = json_pack(
            "{s:i, s:s, s:I, s:o*, s:s, s:s, s:s, s:o*, s:s, s:s, s:s, s:f}", "index", i, "node",
            fu.sub[i].name, "occurrences", (json_int_t)fu.sub[i].count, "workload",
            json_loads(ks[i].job.canon, 0, NULL), "workload_hash", ks[i].job.whash, "entry",
            art->entry, "format", art->format, "launch", json_loads(art->launch_json, 0, NULL),
            "binary", bin, "source", src, "schedule_source", pl_source_name(ks[i].job.source),
            "compile_s", ks[i].seconds);
        if (!e || json_array_append_new(list, e)) {
            tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
            rc = cli_report(&err);
            goto done;
        }
    }
    json_t *pj = fe_plan_to_json(g, &fu, &plan);
    double secs = tlm_now_s() - t0;
    json_t *mj = json_pack("{s:s, s:o*, s:i, s:I, s:I, s:I}", "kind",
                           a.model  ? "model"
                           : a.onnx ? "onnx"
                                    : "graph",
                           "name", g->name ? json_string(g->name) : json_null(), "subgraphs", fu.n,
                           "launches", (json_int_t)fu.launches, "flops", (json_int_t)fu.flops,
                           "macs", (json_int_t)fu.macs);
    json_t *sj = json_pack("{s:i, s:I, s:f, s:i}", "subgraphs", fu.n, "launches",
                           (json_int_t)fu.launches, "seconds", secs, "jobs", a.jobs);
    if (!man || !pj || !mj || !sj) {
        json_decref(pj);
        json_decref(mj);
        json_decref(sj);
        tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
        rc = cli_report(&err);
        goto done;
    }
    if (a.model) {
        const fe_zoo_info *zi = fe_zoo_find(a.model);
        if (zi && (zi->options & FE_ZOO_BATCH))
            json_object_set_new(mj, "batch",
                                json_integer(a.zo.batch ? a.zo.batch : zi->defaults.batch));
        if (zi && (zi->options & FE_ZOO_IMAGE_SIZE))
            json_object_set_new(
                mj, "image_size",
                json_integer(a.zo.image_size ? a.zo.image_size : zi->defaults.image_size));
        if (zi && (zi->options & FE_ZOO_SEQ_LEN))
            json_object_set_new(mj, "seq_len",
                                json_integer(a.zo.seq_len ? a.zo.seq_len : zi->defaults.seq_len));
    }
    json_object_set_new(man, "model", mj);
    json_object_set_new(man, "plan", pj);
    json_object_set_new(man, "stats", sj);
    char *text = json_dumps(man, JSON_INDENT(1));
    char path[4300];
    snprintf(path, sizeof path, "%s/manifest.json", a.dir);
    if (!text || cli_write_file(path, text, strlen(text), &err)) {
        free(text);
        if (!text) tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
        rc = CLI_FAIL;
        cli_report(&err);
        goto done;
    }
    free(text);
    json_t *sum = json_pack("{s:s, s:s, s:i, s:I, s:I, s:f}", "dir", a.dir, "manifest", path,
                            "subgraphs", fu.n, "launches", (json_int_t)fu.launches, "arena_bytes",
                            (json_int_t)plan.arena_bytes, "seconds", secs);
    rc = sum ? cli_print_json(sum) : CLI_FAIL;
    json_decref(sum);
done:
    for (int i = 0; ks && i < fu.n; i++)
        pl_job_free(&ks[i].job);
    free(ks);
    json_decref(man);
    fe_plan_free(&plan);
    fe_fused_free(&fu);
    fe_graph_free(g);
    return rc;
}
