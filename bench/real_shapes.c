/* real_shapes.c — our CPU kernels on the public suite of real-model shapes
 * (bench/suites/real_shapes.json), for each target, beside OpenBLAS and oneDNN.
 *
 * For every workload and every target (default cpu and cpu:avx2; AVX2 code runs on AVX-512
 * hosts) it compiles through the pipeline entry (compiler/driver/pipeline.h) and measures:
 *   - default:  pl_run with PL_MODE_DEFAULT (space_default, what the server serves untrained);
 *   - random:   N schedules from space_sample (a seed per workload and target), each a
 *               pl_run with PL_MODE_GIVEN, measured: one run per schedule so that each gets
 *               a runner budget from the best time so far and the sweep can be paced
 *               (--budget-min); every candidate's time, and a failed one's schedule, is kept;
 *   - variants: before the random ones, the rule of thumb along every other vector axis the
 *               space offers (space_default_vectorized) and the default with packing
 *               toggled, measured the same way (the "random" fields count them too);
 *   - best:     the fastest of the default, the variants and the random ones.
 * Every figure is the median time of a kernel checked against the reference interpreter
 * (measure module; a wrong kernel counts as failed, not as fast). Then, once per workload and
 * right after our kernels, the peers of bench/peers.h in the same process: OpenBLAS sgemm for dense
 * / batch_matmul (bias+gelu as a second pass where that is the epilogue), oneDNN matmul for dense,
 * oneDNN convolution plain (our ABI's layouts) and blocked (its own layouts, reorders untimed) for
 * conv2d / depthwise_conv2d, oneDNN softmax / layer_norm / pooling; and the machine's limits
 * (FMA peak, read bandwidth) for the report's ratios and bandwidth floors.
 *
 * Resumable: one JSON line per (workload, target) and per workload's peers is appended to the
 * output file as soon as it is measured, and a rerun skips what is already there for the same
 * bench build (SHA-256 of this executable, which links libtlm statically: a changed compiler
 * re-measures) and the same N, unless --fresh (which truncates the file). The PyTorch and
 * ONNX Runtime records come from bench/peers_torch.py / peers_ort.py in --serve mode, asked
 * at the same moment. bench/report_real_shapes.py turns the file into
 * bench/results/real_shapes.md; bench/real_shapes.sh runs it all.
 *
 * Usage: real_shapes [--suite FILE] [--targets T1,T2] [--random N] [--only NAME[,NAME...]]
 *                    [--budget-min M] [--quick] [--part all|ours|peers] [--out FILE] [--fresh]
 *                    [--no-torch] [--no-ort] [--torch-python PY] [--ort-python PY] [--list]
 *                    [--rounds R] [--ours-from FILE]
 *   --only takes names or shell patterns (fnmatch), comma-separated.
 *   --rounds R: after each workload's first pass, R head-to-head rounds re-measure our kept
 *   kernels (default, best, and with --tune the search's winner) and the peers alternately
 *   (rs_rounds); 3 by default, 2 with --quick, 0 = off.
 *   --ours-from FILE: our kernels are the default and FILE's chosen schedule per (workload,
 *   target) instead of a new search (the AVX2-held peers pass re-measures the sweep's
 *   cpu:avx2 kernels beside the held peers, in the same machine state).
 *   --quick: the suite's "quick" workloads (unless --only), N = 4, fewer timing samples.
 *   --budget-min M: the sweep aims to finish in M minutes: each pair's random search gets a
 *   share of the time left after the fixed costs (defaults, peers) and stops early (>= 2
 *   candidates) when it has used it; the record's random_tried says how many of the N were
 *   measured. 0 (default): all N.
 *   --part ours: our kernels only; peers: the peers and the machine limits only.
 *   PyTorch (/usr/bin/python3 bench/peers_torch.py --serve) and ONNX Runtime
 *   (bench/.venv/bin/python bench/peers_ort.py --serve) run as helper processes, asked for
 *   each workload right after our kernels; a missing one leaves its column empty.
 * OpenBLAS is a peer here (directly and inside PyTorch): run this command with
 * OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (bench/real_shapes.sh does; see peers.h).
 */
#include <fcntl.h>
#include <fnmatch.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "bench/peers.h"
#include "compiler/driver/pipeline.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/tune/tune.h"
#include "compiler/util/util.h"
#include "proto/workload.h"

#define RS_MAX_TARGETS 8
#define RS_MAX_ONLY 64

typedef struct {
    const char *suite, *out, *part;
    const char *targets[RS_MAX_TARGETS];
    int n_targets;
    const char *only[RS_MAX_ONLY];
    int n_only;
    int nrand;
    int tune;          /* --tune N: the measured search with N trials (0: off) */
    int rounds;        /* --rounds R: head-to-head re-measurements per workload (see rs_rounds) */
    json_t *ours_from; /* --ours-from FILE: "name\ttarget" -> that run's best schedule ("" when
                        * the default won); our kernels are those schedules, not a new search */
    bool tune_random;  /* --tune-random: also the random strategy, N trials (the baseline) */
    double budget_s;                       /* the sweep's wall budget (0: none) */
    const char *torch_python, *ort_python; /* NULL: that peer is off */
    bool quick, fresh, list;
} rs_opts;

static char g_build[17]; /* first 16 hex digits of this executable's SHA-256 */

/* The sweep's clock, for --budget-min: what our part may still spend, shared by the pairs
 * (workload, target) left to measure. */
static struct {
    double start, def_spent;
    int n_def, pairs_left;
} g_clock;

/* ---- small helpers ---- */

static int rs_usage(void)
{
    fprintf(stderr,
            "usage: real_shapes [--suite FILE] [--targets T1,T2] [--random N] [--only NAMES]\n"
            "                   [--budget-min M] [--quick] [--part all|ours|peers] [--out FILE]\n"
            "                   [--fresh] [--no-torch] [--no-ort] [--torch-python PY]\n"
            "                   [--tune N] [--tune-random] [--rounds R] [--ours-from FILE]\n"
            "                   [--ort-python PY] [--list]\n");
    return 2;
}

/* Splits a comma list in place (s is modified and kept). */
static int rs_split(char *s, const char **out, int cap)
{
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < cap; tok = strtok(NULL, ","))
        if (*tok) out[n++] = tok;
    return n;
}

static void rs_build_id(void)
{
    snprintf(g_build, sizeof g_build, "unknown");
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return;
    size_t cap = 1 << 20, n = 0;
    unsigned char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        unsigned char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb, cap *= 2;
    }
    fclose(f);
    char hex[65];
    if (buf && tlm_sha256_hex(buf, n, hex) == 0) snprintf(g_build, sizeof g_build, "%.16s", hex);
    free(buf);
}

static uint64_t rs_hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static bool rs_selected(const rs_opts *o, const char *name, bool quick_flag)
{
    if (o->n_only) {
        for (int i = 0; i < o->n_only; i++)
            if (!fnmatch(o->only[i], name, 0)) return true;
        return false;
    }
    return !o->quick || quick_flag;
}

/* Keys already in the output file: "name\ttarget" for ours (same build and N), "name\tpeers". */
typedef struct {
    char **k;
    int n, cap;
} rs_keys;

static void rs_keys_add(rs_keys *ks, const char *k)
{
    if (ks->n == ks->cap) {
        int nc = ks->cap ? ks->cap * 2 : 64;
        char **nk = realloc(ks->k, sizeof(char *) * (size_t)nc);
        if (!nk) return;
        ks->k = nk, ks->cap = nc;
    }
    ks->k[ks->n++] = strdup(k);
}

static bool rs_keys_has(const rs_keys *ks, const char *k)
{
    for (int i = 0; i < ks->n; i++)
        if (!strcmp(ks->k[i], k)) return true;
    return false;
}

static void rs_keys_load(rs_keys *ks, const char *path, int nrand)
{
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        if (!j) continue;
        const char *kind = json_string_value(json_object_get(j, "kind"));
        const char *name = json_string_value(json_object_get(j, "name"));
        char k[512];
        if (kind && name && !strcmp(kind, "ours")) {
            const char *b = json_string_value(json_object_get(j, "build"));
            const char *t = json_string_value(json_object_get(j, "target"));
            int n = (int)json_integer_value(json_object_get(j, "random_n"));
            if (b && t && !strcmp(b, g_build) && n == nrand) {
                snprintf(k, sizeof k, "%s\t%s", name, t);
                rs_keys_add(ks, k);
            }
        } else if (kind && name && !strcmp(kind, "peers")) {
            snprintf(k, sizeof k, "%s\tpeers", name);
            rs_keys_add(ks, k);
        } else if (kind && name && (!strcmp(kind, "torch") || !strcmp(kind, "ort")) &&
                   json_is_number(json_object_get(j, "median_s"))) {
            snprintf(k, sizeof k, "%s\t%s", name, kind);
            rs_keys_add(ks, k);
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
}

/* --ours-from: each (workload, target)'s chosen schedule in another run's output ("" where
 * the default won), the last record per pair. */
static json_t *rs_ours_load(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    json_t *m = json_object();
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        const char *kind = j ? json_string_value(json_object_get(j, "kind")) : NULL;
        const char *name = j ? json_string_value(json_object_get(j, "name")) : NULL;
        const char *t = j ? json_string_value(json_object_get(j, "target")) : NULL;
        const char *from = j ? json_string_value(json_object_get(j, "best_from")) : NULL;
        const char *bs = j ? json_string_value(json_object_get(j, "best_schedule")) : NULL;
        if (kind && !strcmp(kind, "ours") && name && t) {
            char k[512];
            snprintf(k, sizeof k, "%s\t%s", name, t);
            json_object_set_new(m, k, json_string(from && !strcmp(from, "random") && bs ? bs : ""));
        }
        json_decref(j);
    }
    free(line);
    fclose(f);
    return m;
}

static void rs_emit(FILE *out, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(6));
    if (s) {
        fprintf(out, "%s\n", s);
        fflush(out);
        fsync(fileno(out));
        free(s);
    }
    json_decref(j);
}

static json_t *rs_num(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

/* ---- our kernels ---- */

static json_t *rs_time_json(const char *status, double median_s, double gflops)
{
    json_t *j = json_object();
    json_object_set_new(j, "status", json_string(status));
    json_object_set_new(j, "gflops", median_s > 0 ? rs_num(gflops) : json_null());
    json_object_set_new(j, "median_s", median_s > 0 ? json_real(median_s) : json_null());
    return j;
}

/* One pl_run, measured: the default (given == NULL) or the n given schedules, of which the
 * pipeline keeps the fastest correct one. repeats: timing samples per candidate; timeout_s:
 * the runner's budget per candidate (a slow one is cut short: timeout, not competitive). */
static int rs_pipeline(pl_job *j, const ir_workload *w, const target *t, const space_sched *given,
                       int n, uint64_t seed, int repeats, double timeout_s)
{
    pl_opts o;
    pl_opts_init(&o);
    o.mode = given ? PL_MODE_GIVEN : PL_MODE_DEFAULT;
    o.given = given;
    o.n_given = given ? n : 0;
    o.measure = PL_MEASURE_ON;
    measure_opts_init(&o.mo);
    o.mo.seed = seed; /* one input set per workload: the reference is computed once */
    o.mo.repeats = repeats;
    o.mo.timeout_s = timeout_s;
    tlm_error e;
    int rc = pl_run(j, w, t, &o, &e);
    if (rc && j->n_recs == 0) fprintf(stderr, "  pipeline: %s %s\n", e.field, e.msg);
    return rc == 0 && j->measured && j->chosen_mr.status == MEASURE_OK ? 0 : -1;
}

static double rs_build_s(const pl_job *j)
{
    double s = 0;
    for (int i = 0; i < j->n_recs; i++)
        s += j->recs[i].codegen_s + j->recs[i].compile_s;
    return s;
}

/* Our kernels kept for the head-to-head rounds (rs_rounds): the default's and the best
 * candidate's shared objects, written to the run's scratch directory. */
typedef struct {
    const char *target;
    char path[3][512]; /* [0] default, [1] best when it is not the default, [2] the tuned
                        * winner (--tune, evolutionary); "" when absent */
    char entry[CG_ENTRY_MAX + 192];
    uint64_t seed;
    int repeats;
} rs_kept;

static char g_scratch[64]; /* mkdtemp'd; "" when there is none (no rounds for ours) */
static const char *const rs_slot_name[3] = {"default", "best", "tuned"};

static void rs_keep(rs_kept *kp, int slot, const char *tname, const drv_artifact *a)
{
    if (!kp || !g_scratch[0] || !a->binary) return;
    char tag[64];
    snprintf(tag, sizeof tag, "%s", tname);
    for (char *c = tag; *c; c++)
        if (*c == ':') *c = '_';
    snprintf(kp->path[slot], sizeof kp->path[slot], "%s/%s.%s.so", g_scratch, tag,
             rs_slot_name[slot]);
    FILE *f = fopen(kp->path[slot], "wb");
    bool ok = f && fwrite(a->binary, 1, a->binary_size, f) == a->binary_size;
    if (f && fclose(f)) ok = false;
    if (!ok) kp->path[slot][0] = '\0';
    snprintf(kp->entry, sizeof kp->entry, "%s", a->entry);
}

static int rs_bench_ours(const rs_opts *o, const char *name, const ir_workload *w,
                         const char *tname, FILE *out, rs_kept *kp)
{
    tlm_error e;
    target t;
    if (target_parse(tname, &t, &e)) {
        fprintf(stderr, "%s: target %s: %s\n", name, tname, e.msg);
        return -1;
    }
    if (!target_host_can_run(&t)) {
        fprintf(stderr, "%s: this host cannot run %s kernels; skipped\n", name, tname);
        return -1;
    }
    const double t0 = tlm_now_s();
    const uint64_t seed = 0x7e57 ^ rs_hash_str(name);
    const int rep_full = o->quick ? 5 : 7, rep_search = 3;

    /* the default, as the server serves it untrained */
    pl_job dj;
    int drc = rs_pipeline(&dj, w, &t, NULL, 0, seed, rep_full, 120.0);
    if (!dj.sp) {
        fprintf(stderr, "%s [%s]: could not prepare the job\n", name, tname);
        pl_job_free(&dj);
        return -1;
    }
    const space *sp = dj.sp;
    const double flops = (double)ir_subgraph_flops(dj.g), bytes = (double)ir_subgraph_bytes(dj.g);
    int exact = 0;
    const double log10_size = space_log10_size(sp, &exact);
    const char *def_status = dj.n_recs ? dj.recs[dj.n_recs - 1].status : "error";
    double def_s = drc == 0 ? dj.chosen_mr.median_s : 0,
           def_gf = drc == 0 ? dj.chosen_mr.gflops : 0;
    char def_txt[1024] = "";
    if (dj.n_cands) space_print(sp, &dj.cands[0].sched, def_txt, sizeof def_txt);
    double build_s = rs_build_s(&dj);
    if (kp) {
        memset(kp, 0, sizeof *kp);
        kp->target = tname, kp->seed = seed, kp->repeats = rep_full;
        if (drc == 0) rs_keep(kp, 0, tname, &dj.art);
    }
    fprintf(stderr, "[%s %s] default %s %.2f GFLOP/s %.3g ms (%.1f s)\n", name, tname,
            drc == 0 ? "ok" : def_status, def_gf, def_s * 1e3, tlm_now_s() - t0);

    /* N random schedules, each through the pipeline in mode "given", measured. Each gets a
     * runner budget from the best time so far: the runner takes fewer samples of a candidate
     * slower than about twice that and stops one slower still (timeout: it could not have
     * been the best), so slow schedules cannot eat the sweep. With a sweep budget (--budget-min)
     * the search of this pair stops once it has used its share of what is left (at least 2
     * candidates): random_tried says how many it measured. */
    g_clock.def_spent += tlm_now_s() - t0;
    g_clock.n_def++;
    double allowance = INFINITY;
    if (o->budget_s > 0) {
        double left = o->budget_s - (tlm_now_s() - g_clock.start);
        double mean_def = g_clock.def_spent / g_clock.n_def;
        allowance = (left - mean_def * (g_clock.pairs_left - 1)) / g_clock.pairs_left;
    }
    json_t *rand_s = json_array(), *fails = json_array();
    int n_ok = 0, n_fail = 0, tried = 0;
    double rand_s_best = 0, rand_gf_best = 0, budget = 0;
    char rand_txt[1024] = "";
    uint64_t rng = seed ^ rs_hash_str(tname);
    /* structured variants first, as a tuner seeds its population: the rule of thumb along
     * every other vector axis the space offers, and the default with packing toggled */
    space_sched var[16];
    int nvar = 0, nrand = o->nrand;
    if (o->ours_from) {
        /* --ours-from: the other run's best schedule, when it was not the default, is the one
         * candidate (the held-peers pass re-measures the kernels the sweep chose) */
        char key[512];
        snprintf(key, sizeof key, "%s\t%s", name, tname);
        const char *txt = json_string_value(json_object_get(o->ours_from, key));
        tlm_error pe;
        nrand = 0;
        if (txt && *txt) {
            if (space_parse(sp, txt, &var[0], &pe) == 0 && space_check(sp, &var[0], &pe) == 0)
                nvar = 1;
            else
                fprintf(stderr, "[%s %s] --ours-from schedule refused: %s\n", name, tname, pe.msg);
        }
    } else if ((sp->sketch == SKETCH_CPU_TILE || sp->sketch == SKETCH_CPU_WINDOW) && dj.n_cands) {
        const space_sched *d = &dj.cands[0].sched;
        int64_t vals[SPACE_MAX_VALUES];
        space_sched none;
        memset(&none, 0, sizeof none);
        int nv = sp->slot[0].kind == SLOT_VECTORIZE ? space_legal_values(sp, 0, &none, vals) : 0;
        for (int k = 0; k < nv && nvar < 15; k++)
            if (vals[k] >= 1 && vals[k] != space_get(sp, d, SLOT_VECTORIZE, 1))
                space_default_vectorized(sp, vals[k], &var[nvar++]);
        for (int i = 0; i < sp->n_slot; i++)
            if (sp->slot[i].kind == SLOT_PACK) {
                var[nvar] = *d;
                var[nvar].v[i] = !d->v[i];
                tlm_error ce;
                if (space_check(sp, &var[nvar], &ce) == 0) nvar++;
            }
    }
    const double t_rand = tlm_now_s();
    for (int k = 0; k < nvar + nrand; k++) {
        space_sched s;
        if (k < nvar)
            s = var[k];
        else
            space_sample(sp, &rng, &s); /* drawn even when skipped: the sequence stays the same */
        if (k >= nvar + 2 && tlm_now_s() - t_rand > allowance) break;
        double ref_s = rand_s_best > 0 && (def_s <= 0 || rand_s_best < def_s) ? rand_s_best : def_s;
        budget = ref_s > 0 ? 2.0 + 2.0 * ref_s * (rep_search + 2) : 20.0;
        if (budget > 20.0) budget = 20.0;
        pl_job rj;
        int rrc = rs_pipeline(&rj, w, &t, &s, 1, seed, rep_search, budget);
        tried++;
        const pl_record *r = rj.n_recs ? &rj.recs[rj.n_recs - 1] : NULL;
        if (rrc == 0) {
            n_ok++;
            json_array_append_new(rand_s, json_real(rj.chosen_mr.median_s));
            if (rand_s_best <= 0 || rj.chosen_mr.median_s < rand_s_best) {
                rand_s_best = rj.chosen_mr.median_s, rand_gf_best = rj.chosen_mr.gflops;
                space_print(sp, &s, rand_txt, sizeof rand_txt);
                if (def_s <= 0 || rand_s_best < def_s) rs_keep(kp, 1, tname, &rj.art);
            }
        } else {
            n_fail++;
            json_array_append_new(rand_s, json_string(r ? r->status : "error"));
            /* kept for whoever fixes it: a failed candidate is a bug or a timeout */
            json_t *f = json_object();
            char txt[1024];
            space_print(sp, &s, txt, sizeof txt);
            json_object_set_new(f, "status", json_string(r ? r->status : "error"));
            json_object_set_new(f, "schedule", json_string(txt));
            json_object_set_new(f, "detail", json_string(r ? r->detail : ""));
            json_array_append_new(fails, f);
        }
        build_s += rs_build_s(&rj);
        pl_job_free(&rj);
    }
    /* --tune N: the measured search (compiler/tune) from the default, N trials; its best is
     * then measured again as fully as the default, so the two compare alike. With
     * --tune-random the random strategy gets the same N trials (the cost model's baseline). */
    json_t *tuned = NULL;
    for (int strat = 0; o->tune > 0 && strat < (o->tune_random ? 2 : 1); strat++) {
        pl_opts po;
        pl_opts_init(&po);
        po.mo.seed = seed;
        po.mo.repeats = rep_search;
        po.mo.timeout_s = def_s > 0 ? fmin(20.0, 2.0 + 20.0 * def_s) : 20.0;
        pl_job tj;
        tlm_error te;
        tune_opts to;
        tune_opts_init(&to);
        to.trials = o->tune;
        to.seed = 1;
        to.strategy = strat ? TUNE_RANDOM : TUNE_EVOLUTIONARY;
        tune_stats st;
        memset(&st, 0, sizeof st);
        const double tt0 = tlm_now_s();
        int trc = pl_prepare(&tj, w, &t, &po, &te);
        if (!trc) trc = tune_run(&tj, &to, &st, &te);
        const double tune_wall = tlm_now_s() - tt0;
        json_t *tj_json = json_object();
        json_t *curve = json_array();
        for (int k = 0; k < st.trials; k++)
            json_array_append_new(curve, rs_num(isfinite(st.best_curve[k]) ? st.best_curve[k] : 0));
        json_object_set_new(tj_json, "trials", json_integer(st.trials));
        json_object_set_new(tj_json, "wall_s", json_real(tune_wall));
        json_object_set_new(tj_json, "model_s", json_real(st.model_s));
        json_object_set_new(tj_json, "search_best_s", rs_num(isfinite(st.best_s) ? st.best_s : 0));
        /* the search's second look: its start (the default) and its winner in the same rounds */
        json_object_set_new(tj_json, "confirmed_s",
                            rs_num(isfinite(st.confirmed_s) ? st.confirmed_s : 0));
        json_object_set_new(tj_json, "first_confirmed_s",
                            rs_num(isfinite(st.first_confirmed_s) ? st.first_confirmed_s : 0));
        json_object_set_new(tj_json, "curve_s", curve);
        if (trc) {
            fprintf(stderr, "[%s %s] tune: %s\n", name, tname, te.msg);
            json_object_set_new(tj_json, "status", json_string("error"));
        } else if (st.best_cand >= 0) {
            /* the winner again, measured as the default was */
            pl_job fj;
            space_sched bs = tj.cands[st.best_cand].sched;
            int frc = rs_pipeline(&fj, w, &t, &bs, 1, seed, rep_full, 120.0);
            char txt[1024];
            space_print(tj.sp, &bs, txt, sizeof txt);
            json_object_set_new(tj_json, "status", json_string(frc == 0 ? "ok" : "error"));
            json_object_set_new(tj_json, "median_s", rs_num(frc == 0 ? fj.chosen_mr.median_s : 0));
            json_object_set_new(tj_json, "gflops", rs_num(frc == 0 ? fj.chosen_mr.gflops : 0));
            json_object_set_new(tj_json, "schedule", json_string(txt));
            /* the evolutionary winner joins the head-to-head rounds (rs_rounds) beside the
             * default and the peers, so that its figure, like theirs, is the best of several
             * medians and not one later measurement a stall can double */
            if (frc == 0 && !strat) rs_keep(kp, 2, tname, &fj.art);
            fprintf(stderr, "[%s %s] tune %s@%d: %.2f GFLOP/s %.3g ms (search %.3g ms) in %.1f s\n",
                    name, tname, strat ? "random" : "evolutionary", st.trials,
                    frc == 0 ? fj.chosen_mr.gflops : 0, frc == 0 ? fj.chosen_mr.median_s * 1e3 : 0,
                    st.best_s * 1e3, tune_wall);
            pl_job_free(&fj);
        }
        if (!tuned) tuned = json_object();
        json_object_set_new(tuned, strat ? "random" : "evolutionary", tj_json);
        tune_stats_free(&st);
        pl_job_free(&tj);
    }
    const bool rand_wins = rand_s_best > 0 && (def_s <= 0 || rand_s_best < def_s);
    if (kp && !rand_wins) kp->path[1][0] = '\0'; /* the best is the default */
    const double best_s = rand_wins ? rand_s_best : def_s,
                 best_gf = rand_wins ? rand_gf_best : def_gf;
    const double wall = tlm_now_s() - t0;
    fprintf(stderr,
            "[%s %s] best of %d variants + random %.2f GFLOP/s (%d ok); best %.2f GFLOP/s "
            "%.3g ms; %.1f s\n",
            name, tname, tried, rand_gf_best, n_ok, best_gf, best_s * 1e3, wall);

    json_t *j = json_object();
    json_object_set_new(j, "kind", json_string("ours"));
    json_object_set_new(j, "name", json_string(name));
    json_object_set_new(j, "target", json_string(tname));
    json_object_set_new(j, "build", json_string(g_build));
    json_object_set_new(j, "random_n", json_integer(o->nrand));
    json_object_set_new(j, "flops", json_real(flops));
    json_object_set_new(j, "bytes", json_real(bytes));
    json_object_set_new(j, "space_log10", rs_num(log10_size));
    json_object_set_new(j, "sketch", json_string(space_sketch_name(sp->sketch)));
    json_object_set_new(j, "default", rs_time_json(drc == 0 ? "ok" : def_status, def_s, def_gf));
    json_object_set_new(j, "default_schedule", json_string(def_txt));
    json_object_set_new(j, "random",
                        rs_time_json(rand_s_best > 0 ? "ok" : "none", rand_s_best, rand_gf_best));
    json_object_set_new(j, "random_schedule", json_string(rand_txt));
    json_object_set_new(j, "random_ok", json_integer(n_ok));
    json_object_set_new(j, "random_failed", json_integer(n_fail));
    json_object_set_new(j, "random_tried", json_integer(tried));
    json_object_set_new(j, "variants", json_integer(nvar));
    json_object_set_new(j, "random_allowance_s", rs_num(allowance));
    json_object_set_new(j, "random_median_s", rand_s);
    json_object_set_new(j, "random_failures", fails);
    json_object_set_new(j, "best", rs_time_json(best_s > 0 ? "ok" : "none", best_s, best_gf));
    json_object_set_new(j, "best_from", json_string(rand_wins ? "random" : "default"));
    json_object_set_new(j, "best_schedule", json_string(rand_wins ? rand_txt : def_txt));
    if (tuned) json_object_set_new(j, "tune", tuned);
    json_object_set_new(j, "compile_s", json_real(build_s));
    json_object_set_new(j, "wall_s", json_real(wall));
    json_object_set_new(j, "time", json_integer((json_int_t)time(NULL)));
    rs_emit(out, j);
    pl_job_free(&dj);
    return drc == 0 ? 0 : -1;
}

/* ---- peers (OpenBLAS, oneDNN) ---- */

static bool rs_epi_is(const ir_workload *w, int n, const ir_epilogue *e)
{
    if (w->n_epilogue != n) return false;
    for (int i = 0; i < n; i++)
        if (w->epilogue[i] != e[i]) return false;
    return true;
}

static void rs_peer_set(json_t *j, const char *key, double sec)
{
    json_object_set_new(j, key, sec > 0 ? json_real(sec) : json_null());
}

/* Memory-bound rows (softmax, the norms, reductions) whose bytes exceed the L3: the DRAM-sized
 * ones, timed cold as well as warm in the rounds (ours with the measure runner's cold_cache,
 * the floor with peer_mem_floor_s's cold copies), as the DRAM criterion asks. */
static bool rs_dram_rows(const ir_workload *w, const ir_subgraph *g)
{
    const bool rows = w->op == IR_OP_SOFTMAX || w->op == IR_OP_LAYER_NORM ||
                      w->op == IR_OP_RMS_NORM || w->op == IR_OP_REDUCE_SUM ||
                      w->op == IR_OP_REDUCE_MEAN || w->op == IR_OP_REDUCE_MAX;
    const int64_t l3 = target_host_cpu()->l3_bytes;
    return rows && l3 > 0 && (int64_t)ir_subgraph_bytes(g) > l3;
}

/* The peers' times for workload w as a "peers" record (not emitted); with_floor: also the
 * memory-bound floor, warm ("floor_s") and, for an op whose bytes exceed the L3, cold
 * ("floor_cold_s", see rs_dram_rows). The rounds time it again beside our kernels: what part
 * of a DRAM-sized operand a VM's L3 keeps changes from minute to minute (the same 64 MiB copy
 * took 1.6 ms in one run and 2.6 in another), so a floor timed minutes away from our kernels
 * compares two machine states. */
static json_t *rs_peers_json(const char *name, const ir_workload *w, bool with_floor)
{
    double t0 = tlm_now_s();
    json_t *j = json_object();
    json_object_set_new(j, "kind", json_string("peers"));
    json_object_set_new(j, "name", json_string(name));
    const int64_t *s = w->shape;
    static const ir_epilogue bias_gelu[2] = {IR_EPI_BIAS_ADD, IR_EPI_GELU};
    switch (w->op) {
    case IR_OP_DENSE: {
        bool bg = rs_epi_is(w, 2, bias_gelu) && !w->transpose_a && !w->transpose_b;
        double t = bg ? peer_sgemm_bias_gelu_s(s[IR_DENSE_M], s[IR_DENSE_N], s[IR_DENSE_K])
                      : peer_sgemm_s(s[IR_DENSE_M], s[IR_DENSE_N], s[IR_DENSE_K], w->transpose_a,
                                     w->transpose_b);
        rs_peer_set(j, "openblas_s", t);
        /* OpenBLAS figures cover the GEMM plus, for bias+gelu, a separate epilogue pass;
         * other epilogues are not timed on this side. */
        json_object_set_new(j, "openblas_epilogue", json_boolean(bg || w->n_epilogue == 0));
        if (!w->transpose_a && !w->transpose_b) {
            rs_peer_set(j, "dnnl_matmul_s",
                        peer_dnnl_matmul_s(s[IR_DENSE_M], s[IR_DENSE_N], s[IR_DENSE_K]));
            json_object_set_new(j, "dnnl_matmul_impl", json_string(peer_dnnl_last_impl()));
        }
        break;
    }
    case IR_OP_BATCH_MATMUL: {
        /* B independent sgemm calls, each on all cores: what a BLAS-backed framework loops */
        double t =
            peer_sgemm_s(s[IR_BMM_M], s[IR_BMM_N], s[IR_BMM_K], w->transpose_a, w->transpose_b);
        rs_peer_set(j, "openblas_s", t > 0 ? t * (double)s[IR_BMM_B] : -1);
        json_object_set_new(j, "openblas_epilogue", json_boolean(w->n_epilogue == 0));
        break;
    }
    case IR_OP_CONV2D:
    case IR_OP_DEPTHWISE_CONV2D:
        rs_peer_set(j, "dnnl_plain_s", peer_dnnl_conv_s(w, false));
        json_object_set_new(j, "dnnl_plain_impl", json_string(peer_dnnl_last_impl()));
        rs_peer_set(j, "dnnl_blocked_s", peer_dnnl_conv_s(w, true));
        json_object_set_new(j, "dnnl_blocked_impl", json_string(peer_dnnl_last_impl()));
        break;
    case IR_OP_MAX_POOL2D:
    case IR_OP_AVG_POOL2D:
        rs_peer_set(j, "dnnl_plain_s", peer_dnnl_pool_s(w));
        json_object_set_new(j, "dnnl_plain_impl", json_string(peer_dnnl_last_impl()));
        break;
    case IR_OP_SOFTMAX:
        if (w->n_epilogue == 0) {
            rs_peer_set(j, "dnnl_plain_s", peer_dnnl_softmax_s(s[IR_ROW_R], s[IR_ROW_C]));
            json_object_set_new(j, "dnnl_plain_impl", json_string(peer_dnnl_last_impl()));
        }
        break;
    case IR_OP_LAYER_NORM:
        if (w->n_epilogue == 0) {
            rs_peer_set(j, "dnnl_plain_s", peer_dnnl_layer_norm_s(s[IR_ROW_R], s[IR_ROW_C]));
            json_object_set_new(j, "dnnl_plain_impl", json_string(peer_dnnl_last_impl()));
        }
        break;
    default:
        break; /* rms_norm, reductions, elementwise, transpose: PyTorch only */
    }
    /* memory-bound ops: the copy (or read) of their own bytes, timed here, is their floor */
    ir_subgraph *g = with_floor ? calloc(1, sizeof *g) : NULL;
    tlm_error err;
    tlm_err_clear(&err);
    if (g && ir_subgraph_build(w, g, &err) == 0) {
        double total = (double)ir_subgraph_bytes(g), flops = (double)ir_subgraph_flops(g);
        double out_b = (double)ir_tensor_numel(&g->tensor[g->output]) * sizeof(float);
        bool rows = w->op == IR_OP_SOFTMAX || w->op == IR_OP_LAYER_NORM ||
                    w->op == IR_OP_RMS_NORM || w->op == IR_OP_REDUCE_SUM ||
                    w->op == IR_OP_REDUCE_MEAN || w->op == IR_OP_REDUCE_MAX ||
                    w->op == IR_OP_ELEMENTWISE || w->op == IR_OP_TRANSPOSE;
        if (rows || flops < 4.0 * total) {
            rs_peer_set(j, "floor_s", peer_mem_floor_s(total - out_b, out_b, false));
            if (rs_dram_rows(w, g))
                rs_peer_set(j, "floor_cold_s", peer_mem_floor_s(total - out_b, out_b, true));
            json_object_set_new(j, "floor_kind",
                                json_string(2 * out_b >= total - out_b ? "copy" : "read"));
        }
    }
    free(g);
    json_object_set_new(j, "wall_s", json_real(tlm_now_s() - t0));
    return j;
}

static void rs_bench_peers(const char *name, const ir_workload *w, FILE *out)
{
    double t0 = tlm_now_s();
    json_t *j = rs_peers_json(name, w, true);
    fprintf(stderr, "[%s peers] %.1f s\n", name, tlm_now_s() - t0);
    rs_emit(out, j);
}

/* ---- PyTorch and ONNX Runtime, asked beside our kernels ---- */

/* A peer script in --serve mode (bench/peers_torch.py, peers_ort.py): one request line in
 * ({"name", "workload"}), one record line out, so each workload's framework peers run right
 * after our kernels, on the same machine state. */
typedef struct {
    const char *kind; /* "torch" | "ort" */
    pid_t pid;
    FILE *to, *from;
    bool live;
} rs_helper;

extern char **environ;

static void rs_helper_start(rs_helper *h, const char *kind, const char *python, const char *script)
{
    memset(h, 0, sizeof *h);
    h->kind = kind;
    if (access(python, X_OK)) {
        fprintf(stderr, "%s peer: no %s; its column stays empty (bench/setup.sh)\n", kind, python);
        return;
    }
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC)) return;
    if (pipe2(out, O_CLOEXEC)) {
        close(in[0]), close(in[1]);
        return;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    char *argv[] = {(char *)python, (char *)script, "--serve", NULL};
    int rc = posix_spawn(&h->pid, python, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]), close(out[1]);
    if (rc) {
        fprintf(stderr, "%s peer: cannot start %s: %s\n", kind, python, strerror(rc));
        close(in[1]), close(out[0]);
        return;
    }
    h->to = fdopen(in[1], "w");
    h->from = fdopen(out[0], "r");
    /* the first line says it is ready (its imports worked) */
    char *line = NULL;
    size_t cap = 0;
    json_t *j =
        h->to && h->from && getline(&line, &cap, h->from) > 0 ? json_loads(line, 0, NULL) : NULL;
    h->live = j && json_is_true(json_object_get(j, "ready"));
    if (!h->live)
        fprintf(stderr, "%s peer: %s %s did not start; its column stays empty\n", kind, python,
                script);
    json_decref(j);
    free(line);
}

/* The peer's record for this workload (a new reference), or NULL when the helper is gone. */
static json_t *rs_helper_ask(rs_helper *h, const char *name, json_t *wj)
{
    if (!h->live) return NULL;
    json_t *req = json_pack("{s:s, s:O}", "name", name, "workload", wj);
    char *txt = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    char *line = NULL;
    size_t cap = 0;
    json_t *rec = NULL;
    if (txt && fprintf(h->to, "%s\n", txt) > 0 && fflush(h->to) == 0 &&
        getline(&line, &cap, h->from) > 0)
        rec = json_loads(line, 0, NULL);
    free(txt);
    free(line);
    if (!json_is_object(rec)) {
        fprintf(stderr, "%s peer: no answer for %s; stopped\n", h->kind, name);
        h->live = false;
        json_decref(rec);
        return NULL;
    }
    return rec;
}

static void rs_helper_stop(rs_helper *h)
{
    if (h->to) fclose(h->to); /* EOF: the script's loop ends */
    if (h->from) fclose(h->from);
    if (h->pid > 0) waitpid(h->pid, NULL, 0);
    memset(h, 0, sizeof *h);
}

/* Appends seconds (null when not measured) to the array obj[key], made on first use. */
static void rs_push(json_t *obj, const char *key, double sec)
{
    json_t *arr = json_object_get(obj, key);
    if (!arr) {
        arr = json_array();
        json_object_set_new(obj, key, arr);
    }
    json_array_append_new(arr, sec > 0 ? rs_num(sec) : json_null());
}

/* Head-to-head rounds. One median per kernel, taken seconds away from its peer's, says as
 * much about the machine's stalls as about the kernels on a shared VM (this one stalls for
 * milliseconds at a time, long enough to double a median of seven 1-ms samples), and the
 * best of N random candidates is itself the luckiest of N measurements. So after the first
 * pass, each of our kept kernels (default, best) and each peer is measured again, R times,
 * alternating (ours for every target, the C peers and the memory floor, PyTorch, ONNX
 * Runtime; then again), and one "rounds" record keeps every time. DRAM-sized rows
 * (rs_dram_rows) are also timed cold each round, ours ("default_cold", "best_cold") and the
 * floor ("floor_cold_s"), and our kernels there are timed with the floor beside them in the
 * measure runner (opts.mem_floor: "<slot>[_cold]_floor_ratio", the median over the samples
 * of kernel / floor, each pair a sample apart). The report takes each figure's best median over the
 * first pass and the rounds, alike for ours and for the peers. A workload whose kernels were
 * measured by an earlier (resumed) run has none kept: its rounds are skipped, so neither
 * side gets more tries than the other. */
static void rs_rounds(const rs_opts *o, const char *name, const ir_workload *w, json_t *wj,
                      const rs_kept *kept, int n_kept, bool do_ours, bool do_peers,
                      rs_helper *helpers, FILE *out)
{
    int n_paths = 0;
    for (int k = 0; k < n_kept; k++)
        for (int slot = 0; slot < 3; slot++) n_paths += kept[k].path[slot][0] != 0;
    if (o->rounds <= 0 || (do_ours && n_paths == 0) || (!do_ours && !do_peers)) return;
    const double t0 = tlm_now_s();
    ir_subgraph *g = calloc(1, sizeof *g);
    tlm_error err;
    const bool have_g = g && ir_subgraph_build(w, g, &err) == 0;
    json_t *ours = json_object(), *pj = json_object(), *hj = json_object();
    const bool dram = have_g && rs_dram_rows(w, g);
    /* a conv's or a dense layer's weights (input 1) are a model's params: its kernels also
     * timed with them packed once, as the runtime runs a plan ("<slot>_pre"); ONNX Runtime
     * packs its initializers at session creation, oneDNN blocked's reorders are not timed */
    const ir_op_info *opi = ir_op_get(w->op);
    const bool weights = opi && (!strcmp(opi->name, "conv2d") || !strcmp(opi->name, "dense"));
    for (int r = 0; r < o->rounds; r++) {
        for (int k = 0; k < n_kept && have_g; k++) {
            json_t *tj = json_object_get(ours, kept[k].target);
            if (!tj) {
                tj = json_object();
                json_object_set_new(ours, kept[k].target, tj);
            }
            for (int slot = 0; slot < 3; slot++) {
                if (!kept[k].path[slot][0]) continue;
                /* "best", then "best_cold" (DRAM rows) or "best_pre" (weights) */
                for (int v = 0; v <= (int)(dram || weights); v++) {
                    const bool cold = v && dram, pre = v && weights && !dram;
                    measure_opts mo;
                    measure_opts_init(&mo);
                    mo.seed = kept[k].seed;
                    mo.repeats = kept[k].repeats;
                    mo.timeout_s = 120.0;
                    mo.cold_cache = cold;
                    mo.const_args = pre ? 1u << 1 : 0;
                    mo.mem_floor = dram; /* the floor sample for sample beside the kernel */
                    measure_result mr;
                    tlm_error me;
                    const bool ok =
                        measure_cpu(g, kept[k].path[slot], kept[k].entry, &mo, &mr, &me) == 0 &&
                        mr.status == MEASURE_OK;
                    char key[48];
                    snprintf(key, sizeof key, "%s%s", rs_slot_name[slot],
                             cold ? "_cold" : pre ? "_pre" : "");
                    rs_push(tj, key, ok ? mr.median_s : 0);
                    if (dram) { /* "<key>_floor_ratio": kernel / floor, paired in the runner */
                        strcat(key, "_floor_ratio");
                        rs_push(tj, key, ok ? mr.floor_ratio : 0);
                    }
                }
            }
        }
        if (!do_peers) continue;
        json_t *p = rs_peers_json(name, w, true); /* the floor too, beside our kernels */
        const char *key;
        json_t *v;
        json_object_foreach(p, key, v)
        {
            size_t n = strlen(key);
            if (n >= 3 && !strcmp(key + n - 2, "_s") && strcmp(key, "wall_s"))
                rs_push(pj, key, json_number_value(v)); /* 0 for a null */
        }
        json_decref(p);
        for (int h = 0; h < 2; h++) {
            if (!helpers[h].live) continue;
            json_t *rec = rs_helper_ask(&helpers[h], name, wj);
            rs_push(hj, helpers[h].kind, json_number_value(json_object_get(rec, "median_s")));
            json_decref(rec);
        }
    }
    free(g);
    json_t *j = json_object();
    json_object_set_new(j, "kind", json_string("rounds"));
    json_object_set_new(j, "name", json_string(name));
    json_object_set_new(j, "build", json_string(g_build));
    json_object_set_new(j, "rounds", json_integer(o->rounds));
    json_object_set_new(j, "ours", ours);
    json_object_set_new(j, "peers", pj);
    json_object_update(j, hj); /* "torch", "ort": the helpers' medians */
    json_decref(hj);
    json_object_set_new(j, "wall_s", json_real(tlm_now_s() - t0));
    json_object_set_new(j, "time", json_integer((json_int_t)time(NULL)));
    fprintf(stderr, "[%s rounds] %d in %.1f s\n", name, o->rounds, tlm_now_s() - t0);
    rs_emit(out, j);
}

static void rs_host_line(FILE *out, const rs_opts *o, bool limits)
{
    const target_cpu_info *c = target_host_cpu();
    json_t *j = json_object();
    json_object_set_new(j, "kind", json_string("host"));
    json_object_set_new(j, "part", json_string(o->part));
    json_object_set_new(j, "cpu_model", json_string(c->model));
    json_object_set_new(j, "cores", json_integer(c->cores));
    json_object_set_new(j, "physical_cores", json_integer(c->physical_cores));
    json_object_set_new(j, "vector_lanes", json_integer(c->vector_lanes));
    json_t *isa = json_array();
    for (int b = 0; b < TARGET_ISA_COUNT; b++)
        if (c->isa & (1u << b)) json_array_append_new(isa, json_string(target_isa_name(1u << b)));
    json_object_set_new(j, "isa", isa);
    json_object_set_new(j, "l3_bytes", json_integer(c->l3_bytes));
    json_object_set_new(j, "build", json_string(g_build));
    json_object_set_new(j, "random_n", json_integer(o->nrand));
    json_object_set_new(j, "quick", json_boolean(o->quick));
    if (limits) {
        json_object_set_new(j, "openblas_core", json_string(peer_openblas_corename()));
        json_object_set_new(j, "openblas_pinned", json_boolean(peer_openblas_pinned()));
        /* real_shapes.sh pins OpenBLAS up where its autodetection falls back to an older core
         * than this CPU runs (a model its version does not know): what it picked alone */
        const char *auto_core = getenv("TLM_BENCH_BLAS_AUTODETECTED");
        if (auto_core && *auto_core)
            json_object_set_new(j, "openblas_autodetected", json_string(auto_core));
        json_object_set_new(j, "openblas_threads", json_integer(peer_openblas_threads()));
        json_object_set_new(j, "fma_isa", json_string(peer_fma_isa()));
        json_object_set_new(j, "fma_peak_gflops", rs_num(peer_fma_peak_gflops(0)));
        json_object_set_new(j, "fma_peak1_gflops", rs_num(peer_fma_peak_gflops(1)));
        json_object_set_new(j, "read_bw_gbs", rs_num(peer_mem_bandwidth_gbs()));
        json_object_set_new(j, "copy_bw_gbs", rs_num(peer_mem_copy_gbs()));
    }
    json_object_set_new(j, "time", json_integer((json_int_t)time(NULL)));
    rs_emit(out, j);
}

int main(int argc, char **argv)
{
    rs_opts o = {.suite = "bench/suites/real_shapes.json",
                 .out = "bench/results/real_shapes.jsonl",
                 .part = "all",
                 .nrand = -1,
                 .rounds = -1};
    char *targets_arg = NULL, *only_arg = NULL;
    bool no_torch = false, no_ort = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(a, "--suite") && more)
            o.suite = argv[++i];
        else if (!strcmp(a, "--out") && more)
            o.out = argv[++i];
        else if (!strcmp(a, "--targets") && more)
            targets_arg = strdup(argv[++i]);
        else if (!strcmp(a, "--only") && more)
            only_arg = strdup(argv[++i]);
        else if (!strcmp(a, "--random") && more)
            o.nrand = atoi(argv[++i]);
        else if (!strcmp(a, "--tune") && more)
            o.tune = atoi(argv[++i]);
        else if (!strcmp(a, "--rounds") && more)
            o.rounds = atoi(argv[++i]);
        else if (!strcmp(a, "--ours-from") && more) {
            const char *f = argv[++i];
            if (!(o.ours_from = rs_ours_load(f))) {
                fprintf(stderr, "--ours-from %s: cannot read it\n", f);
                return 2;
            }
        }
        else if (!strcmp(a, "--tune-random"))
            o.tune_random = true;
        else if (!strcmp(a, "--part") && more)
            o.part = argv[++i];
        else if (!strcmp(a, "--budget-min") && more)
            o.budget_s = 60.0 * atof(argv[++i]);
        else if (!strcmp(a, "--torch-python") && more)
            o.torch_python = argv[++i];
        else if (!strcmp(a, "--ort-python") && more)
            o.ort_python = argv[++i];
        else if (!strcmp(a, "--no-torch"))
            no_torch = true;
        else if (!strcmp(a, "--no-ort"))
            no_ort = true;
        else if (!strcmp(a, "--quick"))
            o.quick = true;
        else if (!strcmp(a, "--fresh"))
            o.fresh = true;
        else if (!strcmp(a, "--list"))
            o.list = true;
        else if (!strcmp(a, "--blas-core")) { /* the kernels OpenBLAS picks here (real_shapes.sh) */
            printf("%s\n", peer_openblas_corename());
            return 0;
        }
        else
            return rs_usage();
    }
    if (strcmp(o.part, "all") && strcmp(o.part, "ours") && strcmp(o.part, "peers"))
        return rs_usage();
    if (o.nrand < 0) o.nrand = o.quick ? 4 : 16;
    if (o.rounds < 0) o.rounds = o.quick ? 2 : 3;
    if (o.rounds > 20) {
        fprintf(stderr, "--rounds: at most 20\n");
        return 2;
    }
    if (o.budget_s < 0) o.budget_s = 0;
    if (no_torch)
        o.torch_python = NULL;
    else if (!o.torch_python)
        o.torch_python = "/usr/bin/python3";
    if (no_ort)
        o.ort_python = NULL;
    else if (!o.ort_python)
        o.ort_python = "bench/.venv/bin/python";
    if (o.nrand > PL_MAX_CANDIDATES) {
        fprintf(stderr, "--random: at most %d (one pipeline job)\n", PL_MAX_CANDIDATES);
        return 2;
    }
    o.n_targets =
        rs_split(targets_arg ? targets_arg : strdup("cpu,cpu:avx2"), o.targets, RS_MAX_TARGETS);
    if (only_arg) o.n_only = rs_split(only_arg, o.only, RS_MAX_ONLY);
    const bool do_ours = strcmp(o.part, "peers") != 0, do_peers = strcmp(o.part, "ours") != 0;

    json_error_t je;
    json_t *suite = json_load_file(o.suite, 0, &je);
    json_t *list = suite ? json_object_get(suite, "workloads") : NULL;
    if (!json_is_array(list)) {
        fprintf(stderr, "%s: %s (line %d)\n", o.suite, suite ? "no \"workloads\" array" : je.text,
                je.line);
        return 2;
    }
    rs_build_id();
    rs_keys done = {0};
    if (!o.fresh) rs_keys_load(&done, o.out, o.nrand);
    FILE *out = o.list ? NULL : fopen(o.out, o.fresh ? "w" : "a+");
    if (!o.list && !out) {
        perror(o.out);
        return 1;
    }
    /* a line cut by an interrupted run must not swallow the next one */
    if (out && !o.fresh && fseek(out, -1, SEEK_END) == 0 && fgetc(out) != '\n') {
        fseek(out, 0, SEEK_END);
        fputc('\n', out);
    }
    if (do_peers && !o.list) {
        const char *auto_core = getenv("TLM_BENCH_BLAS_AUTODETECTED");
        if (auto_core && *auto_core)
            fprintf(stderr, "OpenBLAS pinned up to %s (its autodetection picked %s here)\n",
                    peer_openblas_corename(), auto_core);
        else if (peer_openblas_pinned())
            fprintf(stderr,
                    "warning: OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE set: OpenBLAS may run "
                    "older kernels than this CPU has (core %s)\n",
                    peer_openblas_corename());
        fprintf(stderr, "machine limits (FMA peak, bandwidth)...\n");
    }
    if (!o.list) rs_host_line(out, &o, do_peers);
    if (do_ours && !o.list && o.rounds > 0) {
        snprintf(g_scratch, sizeof g_scratch, "/tmp/tlm-rs-XXXXXX");
        if (!mkdtemp(g_scratch)) {
            perror("real_shapes: scratch directory (no rounds for our kernels)");
            g_scratch[0] = '\0';
        }
    }
    rs_helper helpers[2];
    memset(helpers, 0, sizeof helpers);
    if (do_peers && !o.list) {
        if (o.torch_python)
            rs_helper_start(&helpers[0], "torch", o.torch_python, "bench/peers_torch.py");
        if (o.ort_python) rs_helper_start(&helpers[1], "ort", o.ort_python, "bench/peers_ort.py");
    }

    double t_start = tlm_now_s();
    int n_sel = 0, n_fail = 0;
    size_t idx;
    json_t *item;
    /* the pairs this run will measure, for the budget's shares */
    g_clock.start = t_start;
    json_array_foreach(list, idx, item)
    {
        const char *name = json_string_value(json_object_get(item, "name"));
        if (!do_ours || !name ||
            !rs_selected(&o, name, json_is_true(json_object_get(item, "quick"))))
            continue;
        for (int ti = 0; ti < o.n_targets; ti++) {
            char key[512];
            snprintf(key, sizeof key, "%s\t%s", name, o.targets[ti]);
            g_clock.pairs_left += !rs_keys_has(&done, key);
        }
    }
    if (do_ours && !o.list && o.budget_s > 0)
        fprintf(stderr, "%d (workload, target) pairs to measure in about %.1f min\n",
                g_clock.pairs_left, o.budget_s / 60);
    json_array_foreach(list, idx, item)
    {
        const char *name = json_string_value(json_object_get(item, "name"));
        json_t *wj = json_object_get(item, "workload");
        if (!name || !wj) {
            fprintf(stderr, "%s: workloads[%zu]: needs \"name\" and \"workload\"\n", o.suite, idx);
            n_fail++;
            continue;
        }
        if (!rs_selected(&o, name, json_is_true(json_object_get(item, "quick")))) continue;
        n_sel++;
        ir_workload w;
        tlm_error e;
        if (proto_workload_decode(wj, &w, &e)) {
            fprintf(stderr, "%s: workload.%s: %s\n", name, e.field, e.msg);
            n_fail++;
            continue;
        }
        if (o.list) {
            printf("%s\n", name);
            continue;
        }
        char key[512];
        rs_kept kept[RS_MAX_TARGETS];
        memset(kept, 0, sizeof kept);
        int n_kept = 0;
        if (do_ours) {
            for (int ti = 0; ti < o.n_targets; ti++) {
                snprintf(key, sizeof key, "%s\t%s", name, o.targets[ti]);
                if (rs_keys_has(&done, key)) {
                    fprintf(stderr, "[%s %s] done (resume)\n", name, o.targets[ti]);
                    continue;
                }
                if (rs_bench_ours(&o, name, &w, o.targets[ti], out, &kept[n_kept])) n_fail++;
                n_kept++;
                if (g_clock.pairs_left > 1) g_clock.pairs_left--;
            }
        }
        if (do_peers) {
            /* right after our kernels, so both see the same machine state */
            double tp = tlm_now_s();
            snprintf(key, sizeof key, "%s\tpeers", name);
            if (rs_keys_has(&done, key))
                fprintf(stderr, "[%s peers] done (resume)\n", name);
            else
                rs_bench_peers(name, &w, out);
            for (int h = 0; h < 2; h++) {
                if (!helpers[h].live) continue;
                snprintf(key, sizeof key, "%s\t%s", name, helpers[h].kind);
                if (rs_keys_has(&done, key)) continue;
                json_t *rec = rs_helper_ask(&helpers[h], name, wj);
                if (rec) rs_emit(out, rec);
            }
            g_clock.def_spent += tlm_now_s() - tp; /* a fixed cost, like the defaults */
        }
        double tr = tlm_now_s();
        rs_rounds(&o, name, &w, wj, kept, n_kept, do_ours, do_peers, helpers, out);
        g_clock.def_spent += tlm_now_s() - tr;
        for (int k = 0; k < n_kept; k++)
            for (int slot = 0; slot < 3; slot++)
                if (kept[k].path[slot][0]) unlink(kept[k].path[slot]);
    }
    if (!o.list)
        fprintf(stderr, "%d workloads, %d failures, %.0f s; results in %s\n", n_sel, n_fail,
                tlm_now_s() - t_start, o.out);
    for (int h = 0; h < 2; h++)
        rs_helper_stop(&helpers[h]);
    /* the limits again at the end: a busy moment lowers one measurement, and the report
     * takes the best of them (the floor is a physical limit) */
    if (do_peers && !o.list) {
        fprintf(stderr, "machine limits again...\n");
        rs_host_line(out, &o, true);
    }
    if (out) fclose(out);
    if (g_scratch[0]) rmdir(g_scratch);
    json_decref(suite);
    return n_fail ? 1 : 0;
}
