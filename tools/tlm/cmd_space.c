/* cmd_space.c — `tlm space --workload W --target T [--sample N] [--seed S]`: the schedule
 * space the compiler searches for a workload on a target.
 *
 * Prints one JSON object: {"workload_hash", "target": canonical name, "target_hash",
 * "sketch", "slots": [{"name", "kind"[, "axis", "level"]}], "log10_size", "size_exact",
 * "default": printed schedule, "default_by_vector_axis": {axis: printed schedule, ...} (CPU_TILE
 * with a reduction: the rule of thumb with the vectors along each axis they may take;
 * CPU_WINDOW: along "ow" and, where legal, along "channels"),
 * "samples": [printed schedule, ...]}.
 * Samples are drawn with space_sample from the RNG state cli_seed_state(S); the first one is
 * the schedule `tlm compile --schedule random:S` builds, so a sample seen here can be
 * compiled by its seed. */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver/pipeline.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "tools/tlm/cli.h"

#define SPACE_SAMPLES_MAX 10000
#define SCHED_TEXT_MAX 4096 /* 64 slots x "tile.xxxxxxx.3=123456789 " fits easily */

static const char space_usage[] =
    "usage: tlm space --workload W --target T [--sample N] [--seed S]\n"
    "  W is inline JSON, @FILE or @- (stdin); T a target (cpu, cpu:avx2, cuda:sm_90, ...)\n"
    "  prints the sketch, the decision slots, log10 of the number of legal schedules, the\n"
    "  default schedule and N (default 0, at most 10000) schedules sampled with seed S\n"
    "  (default 1); `tlm compile --schedule random:S` compiles the first of them.\n";

static const char *slot_kind_name(space_slot_kind k)
{
    switch (k) {
    case SLOT_TILE:
        return "tile";
    case SLOT_PARALLEL:
        return "parallel";
    case SLOT_VECTORIZE:
        return "vectorize";
    case SLOT_UNROLL:
        return "unroll";
    case SLOT_ROWS:
        return "rows";
    case SLOT_THREADS:
        return "threads";
    case SLOT_STAGE:
        return "stage";
    case SLOT_VEC_LOAD:
        return "vec_load";
    case SLOT_PACK:
        return "pack";
    case SLOT_WARP_M:
        return "warp_m";
    case SLOT_WARP_N:
        return "warp_n";
    case SLOT_WARPS_M:
        return "warps_m";
    case SLOT_WARPS_N:
        return "warps_n";
    case SLOT_BLOCK_K:
        return "block_k";
    case SLOT_PIPELINE:
        return "pipeline";
    case SLOT_SWIZZLE:
        return "swizzle";
    case SLOT_KIND_COUNT:
        break;
    }
    return "?";
}

static json_t *sched_json(const space *sp, const space_sched *s)
{
    char buf[SCHED_TEXT_MAX];
    space_print(sp, s, buf, sizeof buf);
    return json_string(buf);
}

static json_t *describe(const ir_workload *w, const target *t, const space *sp,
                        const space_sched *dflt, uint64_t nsamp, uint64_t seed, tlm_error *err)
{
    char whex[IR_HASH_HEX], thex[TARGET_HASH_HEX];
    if (ir_workload_hash_hex(w, whex) || target_hash_hex(t, thex)) {
        tlm_err_set(err, TLM_ENOMEM, "", "cannot hash the workload or the target");
        return NULL;
    }
    json_t *slots = json_array();
    for (int i = 0; slots && i < sp->n_slot; i++) {
        const space_slot *sl = &sp->slot[i];
        json_t *o = json_pack("{s:s, s:s}", "name", sl->name, "kind", slot_kind_name(sl->kind));
        if (o && sl->kind == SLOT_TILE) {
            json_object_set_new(o, "axis", json_string(sp->g->stage[sp->g->anchor].axis[sl->axis]));
            json_object_set_new(o, "level", json_integer(sl->level));
        }
        json_array_append_new(slots, o);
    }
    int exact = 0;
    double lsz = space_log10_size(sp, &exact);
    json_t *def = sched_json(sp, dflt);
    space_sched s;
    json_t *samples = json_array();
    uint64_t rng = cli_seed_state(seed);
    for (uint64_t i = 0; samples && i < nsamp; i++) {
        space_sample(sp, &rng, &s);
        json_array_append_new(samples, sched_json(sp, &s));
    }
    /* The rule of thumb for each vector axis the VECTORIZE slot offers (what the default
     * would be with it): CPU_TILE with a reduction keyed by the axis' name, CPU_WINDOW along
     * OW ("ow") and, where legal, along blocks of channels ("channels") */
    json_t *by_axis = json_object();
    const bool tile = sp->sketch == SKETCH_CPU_TILE && sp->n_reduce > 0;
    const bool window = sp->sketch == SKETCH_CPU_WINDOW;
    if (by_axis && (tile || window) && sp->n_slot > 0 && sp->slot[0].kind == SLOT_VECTORIZE) {
        int64_t vals[SPACE_MAX_VALUES];
        space_sched none;
        memset(&none, 0, sizeof none);
        int n = space_legal_values(sp, 0, &none, vals);
        const ir_stage *a = &sp->g->stage[sp->g->anchor];
        for (int k = 0; k < n; k++) {
            const char *key = vals[k] < 1                      ? NULL
                              : tile                           ? a->axis[a->n_spatial - vals[k]]
                              : vals[k] == 1                   ? "ow"
                              : vals[k] == WINDOW_VEC_CHANNELS ? "channels"
                                                               : NULL;
            if (!key) continue;
            space_default_vectorized(sp, vals[k], &s);
            json_object_set_new(by_axis, key, sched_json(sp, &s));
        }
    }
    json_t *out =
        json_pack("{s:s, s:s, s:s, s:s, s:o*, s:f, s:b, s:o*, s:o*, s:o*}", "workload_hash", whex,
                  "target", t->name, "target_hash", thex, "sketch", space_sketch_name(sp->sketch),
                  "slots", slots, "log10_size", isfinite(lsz) ? lsz : 0.0, "size_exact", exact != 0,
                  "default", def, "default_by_vector_axis", by_axis, "samples", samples);
    if (!out || !slots || json_array_size(slots) != (size_t)sp->n_slot || !samples ||
        json_array_size(samples) != nsamp) {
        json_decref(out);
        tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        return NULL;
    }
    return out;
}

static int run_space(int argc, char **argv)
{
    static const struct option opts[] = {
        {"workload", required_argument, NULL, 'w'}, {"target", required_argument, NULL, 't'},
        {"sample", required_argument, NULL, 'n'},   {"seed", required_argument, NULL, 's'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0},
    };
    const char *wl = NULL, *tg = NULL, *nsamp_text = NULL, *seed_text = NULL;
    opterr = 0;
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, ":w:t:n:s:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'w':
            wl = optarg;
            break;
        case 't':
            tg = optarg;
            break;
        case 'n':
            nsamp_text = optarg;
            break;
        case 's':
            seed_text = optarg;
            break;
        case 'h':
            fputs(space_usage, stdout);
            return CLI_OK;
        case ':':
            return cli_usage_error("space: %s needs a value", argv[optind - 1]);
        default:
            return cli_usage_error("space: unknown option %s (see tlm space --help)",
                                   argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("space: unexpected argument \"%s\" (see tlm space --help)",
                               argv[optind]);
    if (!wl) return cli_usage_error("space: --workload is required (see tlm space --help)");
    if (!tg) return cli_usage_error("space: --target is required (see tlm space --help)");

    tlm_error err;
    tlm_err_clear(&err);
    uint64_t nsamp = 0, seed = 1;
    if (nsamp_text && cli_parse_u64("--sample", nsamp_text, SPACE_SAMPLES_MAX, &nsamp, &err))
        return cli_report(&err);
    if (seed_text && cli_parse_u64("--seed", seed_text, UINT64_MAX, &seed, &err))
        return cli_report(&err);
    ir_workload w;
    if (cli_load_workload("--workload", wl, &w, &err)) return cli_report(&err);
    target t;
    if (target_parse(tg, &t, &err)) return cli_report(&err);
    /* The pipeline's preparation: the subgraph, the space and the default candidate. */
    pl_opts o;
    pl_opts_init(&o);
    pl_job j;
    int rc;
    if (pl_prepare(&j, &w, &t, &o, &err)) {
        rc = cli_report(&err);
    } else {
        json_t *out = describe(&w, &t, j.sp, &j.cands[0].sched, nsamp, seed, &err);
        rc = out ? cli_print_json(out) : cli_report(&err);
        json_decref(out);
    }
    pl_job_free(&j);
    return rc;
}

const cli_cmd cli_cmd_space = {
    "space", "the schedule space of a workload on a target: slots, size, samples", run_space};
