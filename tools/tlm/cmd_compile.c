/* cmd_compile.c — `tlm compile --workload W --target T [--schedule S] [--measure] [-o DIR]`:
 * one workload to one kernel on disk, without a server.
 *
 * Writes into DIR (default ./tlm-out, created if missing):
 *   kernel.c + kernel.so       CPU targets (cc with the target's -march flags and -O3)
 *   kernel.cu + kernel.cubin   CUDA targets (NVRTC for the target's sm, then the cubin's
 *                              registers and shared memory are checked against its limits)
 *   meta.json                  target (descriptor with its hash), workload (canonical object),
 *                              workload_hash, sketch, schedule (printed), entry, format,
 *                              launch, source, binary, binary_sha256, binary_size, flops,
 *                              bytes, toolchain (identity), compile_flags; CUDA: resources
 *                              (ptxas figures) and gpu_model (the analytic GPU model's
 *                              PREDICTION for the target, compiler/measure/gpu_model.h: id,
 *                              time_s, bound, occupancy, limiter, blocks_per_sm, waves,
 *                              dram_bytes, l2_bytes, coalesce, bank_ways, detail; or error);
 *                              with --measure: status, median_s, min_s, gflops, rel_err,
 *                              n_samples, threads (CPU: the OpenMP threads it ran on), seed,
 *                              detail
 * and prints a short JSON summary on stdout: {dir, source, binary, meta, workload_hash,
 * schedule, binary_sha256, status ("compiled" or the measurement's status)}.
 * Files of the other target kind left in DIR by an earlier run are removed, and so are the
 * binary and meta.json before compiling, so DIR always describes one kernel (after a failed
 * compile: the source alone, for inspection).
 *
 * Schedules: "default" (space_default), "random:SEED" (the first sample of `tlm space --seed
 * SEED`), or a decision list in space_print's form ("tile.i.3=4 ... vectorize=1") or as bare
 * values in slot order. "tlm": the model's greedy schedule (tlm_select_generate) with the
 * weights of --weights (default model_weights/tlm.bin); "topk:K": K beam candidates, measured
 * with --measure (the fastest correct one wins), else the best-scored one that builds.
 * Everything goes through the pipeline entry (compiler/driver/pipeline.h); meta.json and the
 * summary say the schedule_source ("default", "tlm", "topk", "given") and the selection.
 *
 * Exit status: 2 for bad input (workload, target, an illegal decision: the message names the
 * slot; --measure where it cannot run), 1 when the work fails (code generation, the compiler,
 * the device limits, writing DIR, or a measured kernel that is not "ok"). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compiler/codegen/codegen.h"
#include "compiler/driver/pipeline.h"
#include "compiler/measure/gpu_model.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/tlm/select.h"
#include "tools/tlm/cli.h"

static const char compile_usage[] =
    "usage: tlm compile --workload W --target T [--schedule S] [--measure] [-o DIR]\n"
    "  W is inline JSON, @FILE or @- (stdin); T a target (cpu, cpu:avx2, cuda:sm_90, ...)\n"
    "  S is one of\n"
    "    default        the rule-of-thumb schedule (the default)\n"
    "    random:SEED    the first schedule `tlm space --seed SEED --sample 1` prints\n"
    "    DECISIONS      \"tile.i.3=4 tile.j.3=16 ... vectorize=1\" as `tlm space` prints it,\n"
    "                   or the bare values in slot order\n"
    "    tlm            the TLM's greedy schedule (weights: --weights F, default\n"
    "                   model_weights/tlm.bin)\n"
    "    topk:K         K beam candidates of the TLM; with --measure the fastest correct one,\n"
    "                   else the best-scored one that builds\n"
    "  --prior X (tlm, topk:K) the bonus in logits on the default schedule's tokens while the\n"
    "                   model writes (0 = none; default: the weights' MANIFEST \"prior\", else 0)\n"
    "  --measure runs the kernel against the reference interpreter and times it (CPU targets\n"
    "  this machine can run). Writes DIR/kernel.c|.cu, DIR/kernel.so|.cubin, DIR/meta.json\n"
    "  (DIR defaults to ./tlm-out) and prints a JSON summary.\n"
    "A whole network: tlm compile (--model NAME | --graph FILE | --onnx FILE) --target T [-o DIR]\n"
    "  (see tlm compile --model x --help)\n";

/* ---- small file helpers ---- */

static int mkdir_p(const char *dir, tlm_error *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return tlm_err_set(err, TLM_EINVAL, "-o", "the directory name is too long");
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p) continue;
        char c = *p;
        *p = 0;
        if (mkdir(path, 0777) && errno != EEXIST)
            return tlm_err_set(err, TLM_EIO, "-o", "cannot create \"%s\": %s", path,
                               strerror(errno));
        *p = c;
        if (!c) break;
    }
    struct stat st;
    if (stat(dir, &st) || !S_ISDIR(st.st_mode))
        return tlm_err_set(err, TLM_EIO, "-o", "\"%s\" is not a directory", dir);
    return 0;
}

static json_t *real_or_null(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* ---- the command ---- */

typedef struct {
    const char *wl, *tg, *sched, *dir, *weights;
    bool measure;
    double prior; /* < 0: the MANIFEST's */
} compile_args;

/* Everything a run owns, freed in one place. */
typedef struct {
    pl_job j;
    tlm_model *model;
    json_t *meta;
} compile_state;

static void state_free(compile_state *st)
{
    pl_job_free(&st->j);
    tlm_model_free(st->model);
    json_decref(st->meta);
}

/* A failure of the work (not of the input): the message, then exit 1. */
static int work_failed(const tlm_error *err)
{
    cli_report(err);
    return CLI_FAIL;
}

/* Loads the weights for --schedule tlm|topk:K (a missing or mismatched file is the user's
 * input: the message names the flag that chose it). */
static int load_model(const char *weights, double prior, tlm_model **m, tlm_error *err)
{
    const char *path = weights ? weights : TLM_WEIGHTS_DEFAULT_PATH;
    if (cli_load_weights(weights ? "--weights" : "--schedule", path, m, err)) return TLM_EINVAL;
    if (prior >= 0.0) (*m)->default_prior = (float)prior;
    return 0;
}

/* --schedule → pipeline mode: default | tlm | topk:K go to the pipeline as modes; random:SEED
 * and decision lists are "given" schedules, added after pl_prepare (they need the space). */
static int schedule_mode(const char *text, pl_opts *o, tlm_error *err)
{
    if (!strcmp(text, "default")) {
        o->mode = PL_MODE_DEFAULT;
    } else if (!strcmp(text, "tlm")) {
        o->mode = PL_MODE_TLM;
    } else if (!strncmp(text, "topk:", 5)) {
        uint64_t k;
        int rc = cli_parse_u64("--schedule", text + 5, PL_MAX_CANDIDATES, &k, err);
        if (rc) return rc;
        if (k < 1)
            return tlm_err_set(err, TLM_EINVAL, "--schedule", "topk:K needs K in 1..%d",
                               PL_MAX_CANDIDATES);
        o->mode = PL_MODE_TOPK;
        o->k = (int)k;
    } else {
        o->mode = PL_MODE_GIVEN;
    }
    return 0;
}

static int add_given(pl_job *j, const char *text, tlm_error *err)
{
    space_sched s;
    if (!strncmp(text, "random:", 7)) {
        uint64_t seed;
        int rc = cli_parse_u64("--schedule", text + 7, UINT64_MAX, &seed, err);
        if (rc) return rc;
        uint64_t rng = cli_seed_state(seed);
        space_sample(j->sp, &rng, &s);
    } else {
        int rc = space_parse(j->sp, text, &s, err);
        if (rc) return rc;
    }
    return pl_add_candidate(j, &s, PL_SRC_GIVEN, NAN, err);
}

/* The artifact's binary and its description (driver.c built and checked it). */
static int write_artifact(const target *t, const drv_artifact *a, const char *bin_path,
                          json_t *meta, tlm_error *err)
{
    int rc = cli_write_file(bin_path, a->binary, a->binary_size, err);
    if (rc) return rc;
    bool cuda = t->kind == TARGET_CUDA;
    json_object_set_new(meta, "toolchain",
                        json_string(cuda ? tc_nvrtc_identity() : tc_cc_identity()));
    json_object_set_new(meta, "compile_flags", json_string(a->flags));
    json_object_set_new(meta, "entry", json_string(a->entry));
    json_object_set_new(meta, "format", json_string(a->format));
    if (cuda) json_object_set_new(meta, "resources", json_loads(a->resources_json, 0, NULL));
    json_object_set_new(meta, "binary_sha256", json_string(a->sha256));
    json_object_set_new(meta, "binary_size", json_integer((json_int_t)a->binary_size));
    return 0;
}

/* A cuda kernel's predicted time by the GPU model (never a measurement: it says so). */
static json_t *gpu_model_json(const pl_job *j, const drv_artifact *a)
{
    measure_gpu_pred p;
    tlm_error e;
    tlm_err_clear(&e);
    if (drv_gpu_model(j->sp, &j->cands[j->chosen].sched, a, &p, &e))
        return json_pack("{s:s, s:s}", "id", MEASURE_GPU_MODEL_ID, "error", e.msg);
    char detail[512];
    measure_gpu_pred_text(&p, j->tgt.gpu.part, detail, sizeof detail);
    return json_pack("{s:s, s:s, s:f, s:s, s:f, s:s, s:i, s:f, s:f, s:f, s:f, s:f, s:s}", "id",
                     MEASURE_GPU_MODEL_ID, "kind", "prediction", "time_s", p.time_s, "bound",
                     p.bound, "occupancy", p.occupancy, "limiter", p.limiter, "blocks_per_sm",
                     p.blocks_per_sm, "waves", p.waves, "dram_bytes", p.dram_bytes, "l2_bytes",
                     p.l2_bytes, "coalesce", p.coalesce, "bank_ways", p.bank_ways, "detail",
                     detail);
}

/* The pipeline measured the chosen kernel (--measure): its figures go into meta.json. */
static void measurement_into(const pl_job *j, json_t *meta)
{
    const measure_result *res = &j->chosen_mr;
    const pl_record *r = NULL;
    for (int i = j->n_recs - 1; i >= 0 && !r; i--)
        if (j->recs[i].cand == j->chosen) r = &j->recs[i];
    json_object_set_new(meta, "status", json_string(r ? r->status : "ok"));
    json_object_set_new(meta, "median_s", real_or_null(res->median_s));
    json_object_set_new(meta, "min_s", real_or_null(res->min_s));
    json_object_set_new(meta, "gflops", real_or_null(res->gflops));
    json_object_set_new(meta, "rel_err", real_or_null(res->rel_err >= 0 ? res->rel_err : NAN));
    json_object_set_new(meta, "n_samples", json_integer(res->n_samples));
    if (res->threads > 0) json_object_set_new(meta, "threads", json_integer(res->threads));
    json_object_set_new(meta, "seed", json_integer((json_int_t)(res->seed & INT64_MAX)));
    json_object_set_new(meta, "detail", json_string(res->detail));
}

static int parse_args(int argc, char **argv, compile_args *a)
{
    static const struct option opts[] = {
        {"workload", required_argument, NULL, 'w'}, {"target", required_argument, NULL, 't'},
        {"schedule", required_argument, NULL, 's'}, {"weights", required_argument, NULL, 'W'},
        {"measure", no_argument, NULL, 'm'},        {"out", required_argument, NULL, 'o'},
        {"prior", required_argument, NULL, 'p'},    {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(a, 0, sizeof *a);
    a->sched = "default";
    a->dir = "tlm-out";
    a->prior = -1.0;
    opterr = 0;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, ":w:t:s:mo:p:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'w':
            a->wl = optarg;
            break;
        case 't':
            a->tg = optarg;
            break;
        case 's':
            a->sched = optarg;
            break;
        case 'W':
            a->weights = optarg;
            break;
        case 'm':
            a->measure = true;
            break;
        case 'o':
            a->dir = optarg;
            break;
        case 'p': {
            tlm_error e;
            tlm_err_clear(&e);
            if (cli_parse_prior("--prior", optarg, &a->prior, &e)) return cli_report(&e);
            break;
        }
        case 'h':
            fputs(compile_usage, stdout);
            return -1;
        case ':':
            return cli_usage_error("compile: %s needs a value", argv[optind - 1]);
        default:
            return cli_usage_error("compile: unknown option %s (see tlm compile --help)",
                                   argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("compile: unexpected argument \"%s\" (see tlm compile --help)",
                               argv[optind]);
    if (!a->wl) return cli_usage_error("compile: --workload is required (see tlm compile --help)");
    if (!a->tg) return cli_usage_error("compile: --target is required (see tlm compile --help)");
    if (!a->dir[0]) return cli_usage_error("compile: -o needs a directory name");
    if (a->weights && strcmp(a->sched, "tlm") && strncmp(a->sched, "topk:", 5))
        return cli_usage_error("compile: --weights is only used with --schedule tlm or topk:K");
    if (a->prior >= 0.0 && strcmp(a->sched, "tlm") && strncmp(a->sched, "topk:", 5))
        return cli_usage_error("compile: --prior is only used with --schedule tlm or topk:K");
    return 0;
}

static int run_compile(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "--graph") ||
            !strcmp(argv[i], "--onnx"))
            return cli_compile_network(argc, argv);
    compile_args a;
    int prc = parse_args(argc, argv, &a);
    if (prc) return prc < 0 ? CLI_OK : prc;

    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    if (cli_load_workload("--workload", a.wl, &w, &err)) return cli_report(&err);
    target t;
    if (target_parse(a.tg, &t, &err)) return cli_report(&err);
    bool cuda = t.kind == TARGET_CUDA;
    if (a.measure && cuda)
        return cli_usage_error("--measure: tlm compile measures CPU kernels only; %s kernels are "
                               "compiled and checked against the device limits, not run",
                               t.name);
    if (a.measure && !target_host_can_run(&t))
        return cli_usage_error("--measure: this machine's CPU cannot run %s kernels", t.name);

    compile_state st;
    memset(&st, 0, sizeof st);
    int rc = CLI_OK;
    char src_path[4200], bin_path[4200], meta_path[4200];
    const char *src_name = cuda ? "kernel.cu" : "kernel.c";
    const char *bin_name = cuda ? "kernel.cubin" : "kernel.so";
    pl_job *j = &st.j;
    pl_opts o;
    pl_opts_init(&o);
    /* --measure: a full measurement of the chosen kernel (the runner's defaults), not the
     * short comparison runs the pipeline uses between candidates */
    measure_opts_init(&o.mo);
    o.measure = a.measure ? PL_MEASURE_ON : PL_MEASURE_OFF;

    if (schedule_mode(a.sched, &o, &err) || ((o.mode == PL_MODE_TLM || o.mode == PL_MODE_TOPK) &&
                                             load_model(a.weights, a.prior, &st.model, &err))) {
        rc = cli_report(&err);
        goto done;
    }
    o.model = st.model;
    /* the space, then the candidates: bad input (workload, schedule, weights) exits 2 */
    if (pl_prepare(j, &w, &t, &o, &err) ||
        (o.mode == PL_MODE_GIVEN && add_given(j, a.sched, &err)) || pl_decode(j, &err)) {
        rc = cli_report(&err);
        goto done;
    }
    snprintf(src_path, sizeof src_path, "%s/%s", a.dir, src_name);
    snprintf(bin_path, sizeof bin_path, "%s/%s", a.dir, bin_name);
    snprintf(meta_path, sizeof meta_path, "%s/meta.json", a.dir);
    if (mkdir_p(a.dir, &err)) {
        rc = work_failed(&err);
        goto done;
    }
    {
        /* DIR describes one kernel: drop the other kind's files from an earlier run, and
         * this kind's binary and meta.json, so that a failure below leaves no binary that
         * does not belong to kernel.c / kernel.cu. */
        char stale[4200];
        snprintf(stale, sizeof stale, "%s/%s", a.dir, cuda ? "kernel.c" : "kernel.cu");
        unlink(stale);
        snprintf(stale, sizeof stale, "%s/%s", a.dir, cuda ? "kernel.so" : "kernel.cubin");
        unlink(stale);
        unlink(bin_path);
        unlink(meta_path);
    }
    /* codegen + cc/NVRTC + device limits (+ measurement); the source is written even when
     * compiling failed */
    int brc = pl_finish(j, &err);
    const char *source = brc ? j->failed_source : j->art.source;
    tlm_error werr;
    if (source && cli_write_file(src_path, source, strlen(source), &werr) && !brc) {
        err = werr;
        brc = werr.code;
    }
    if (brc) {
        rc = work_failed(&err);
        goto done;
    }

    const drv_artifact *art = &j->art;
    json_t *canon_obj = json_loads(j->canon, 0, NULL);
    json_t *launch_obj = json_loads(art->launch_json, 0, NULL);
    st.meta = json_pack("{s:o*, s:o*, s:s, s:s, s:s, s:s, s:s, s:o*, s:s, s:s, s:I, s:I}", "target",
                        target_to_json(&t), "workload", canon_obj, "workload_hash", j->whash,
                        "sketch", space_sketch_name(j->sp->sketch), "schedule", art->schedule,
                        "schedule_source", pl_source_name(j->source), "selection", j->selection,
                        "launch", launch_obj, "source", src_name, "binary", bin_name, "flops",
                        (json_int_t)ir_subgraph_flops(j->g), "bytes",
                        (json_int_t)ir_subgraph_bytes(j->g));
    if (!st.meta || !canon_obj || !launch_obj) {
        tlm_err_set(&err, TLM_ENOMEM, "", "cannot build meta.json");
        rc = work_failed(&err);
        goto done;
    }
    if (write_artifact(&t, art, bin_path, st.meta, &err)) {
        rc = work_failed(&err);
        goto done;
    }
    if (t.kind == TARGET_CUDA) json_object_set_new(st.meta, "gpu_model", gpu_model_json(j, art));
    if (j->measured) measurement_into(j, st.meta);
    char *meta_text = json_dumps(st.meta, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!meta_text) {
        tlm_err_set(&err, TLM_ENOMEM, "", "cannot serialise meta.json");
        rc = work_failed(&err);
        goto done;
    }
    size_t ml = strlen(meta_text);
    char *with_nl = realloc(meta_text, ml + 2);
    if (with_nl) {
        meta_text = with_nl;
        meta_text[ml++] = '\n';
        meta_text[ml] = 0;
    }
    int wrc = cli_write_file(meta_path, meta_text, ml, &err);
    free(meta_text);
    if (wrc) {
        rc = work_failed(&err);
        goto done;
    }

    const char *status = j->measured ? "ok" : "compiled";
    json_t *sum =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}", "dir", a.dir, "source", src_path,
                  "binary", bin_path, "meta", meta_path, "workload_hash", j->whash, "schedule",
                  art->schedule, "schedule_source", pl_source_name(j->source), "binary_sha256",
                  art->sha256, "status", status);
    rc = sum ? cli_print_json(sum) : CLI_FAIL;
    json_decref(sum);
done:
    state_free(&st);
    return rc;
}

const cli_cmd cli_cmd_compile = {
    "compile", "compile one workload for a target into DIR (kernel, binary, meta.json)",
    run_compile};
