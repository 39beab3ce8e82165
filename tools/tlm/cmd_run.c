/* cmd_run.c — `tlm run --plan DIR [--inputs random|FILE.npz] [--repeat N] [--check auto|on|off]`:
 * run a compiled network (compiler/runtime) and time it.
 *
 * DIR is what `tlmc compile -o DIR` or `tlm compile --model|--graph|--onnx ... -o DIR` wrote.
 * Inputs and params are random (rt_bind_random, --seed) or come from an .npz file (numpy.savez,
 * uncompressed: float32 C-order arrays named like the plan's inputs and params; arrays the
 * file lacks stay random) or from the ONNX file the plan was compiled from (its initializers,
 * folded as the import folds them; graph inputs stay random). One warm-up run, then --repeat timed
 * runs. Prints JSON: per launch (node, op, repeat, median ms over the runs), end to end (median,
 * min, mean ms), and the check: the reference interpreter over the same plan (rt_reference),
 * compared with the last run. --check auto runs it when the model has at most 2 GFLOP (the
 * reference is a double precision interpreter; BLAS for the contractions, loops for the rest). Exit
 * status: 0, 1 when running fails or the check exceeds --tolerance, 2 bad usage/input. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/runtime/runtime.h"
#include "compiler/util/util.h"
#include "proto/workload.h"
#include "tools/tlm/cli.h"

static const char run_usage[] =
    "usage: tlm run --plan DIR [--inputs random|FILE.npz|FILE.onnx] [--seed S] [--repeat N]\n"
    "               [--check auto|on|off] [--tolerance T] [--save-outputs DIR]\n"
    "               [--prepack on|off]\n"
    "  runs the network compiled into DIR (manifest.json with its plan, and the kernels):\n"
    "  one warm-up, then N timed runs (default 10); prints per-launch and end-to-end times\n"
    "  and the check against the reference interpreter over the same plan (auto: models of\n"
    "  at most 2 GFLOP; tolerance on max|ours - ref| / max|ref|, default 1e-3);\n"
    "  --save-outputs DIR writes each output of the last run as DIR/NAME.npy;\n"
    "  --prepack off: every call packs its weights (default on: packed once, after binding)\n";

#define AUTO_CHECK_FLOPS 2e9

/* ---- .npz (uncompressed zip of .npy) ---- */

static uint32_t le16(const unsigned char *p)
{
    return p[0] | (uint32_t)p[1] << 8;
}
static uint32_t le32(const unsigned char *p)
{
    return le16(p) | le16(p + 2) << 16;
}

/* One .npy member: float32, C order; binds it to the tensor of the same name. */
static int bind_npy(rt_model *m, const char *name, const unsigned char *p, size_t n, tlm_error *err)
{
    if (n < 10 || memcmp(p, "\x93NUMPY", 6))
        return tlm_err_set(err, TLM_EINVAL, "--inputs", "%s: not a .npy array", name);
    size_t hl = p[6] == 1 ? le16(p + 8) : le32(p + 8), h0 = p[6] == 1 ? 10 : 12;
    if (h0 + hl > n) return tlm_err_set(err, TLM_EINVAL, "--inputs", "%s: truncated header", name);
    char hdr[1024];
    snprintf(hdr, sizeof hdr, "%.*s", (int)(hl < sizeof hdr ? hl : sizeof hdr - 1), p + h0);
    if (!strstr(hdr, "'descr': '<f4'") || !strstr(hdr, "'fortran_order': False"))
        return tlm_err_set(err, TLM_EINVAL, "--inputs",
                           "%s: must be float32 ('<f4') in C order, header %s", name, hdr);
    size_t bytes = n - h0 - hl;
    float *data = malloc(bytes + 4);
    if (!data) return tlm_err_set(err, TLM_ENOMEM, "--inputs", "out of memory");
    memcpy(data, p + h0 + hl, bytes);
    int rc = rt_bind(m, name, data, (int64_t)(bytes / 4), err);
    free(data);
    if (rc == TLM_ENOTFOUND) return 0; /* an array the plan does not use */
    if (rc) snprintf(err->field, sizeof err->field, "--inputs");
    return rc;
}

/* Weights are large (GPT-2: 0.5 GB): the whole file, up to 16 GiB, not cli_read_file's 16 MiB. */
static char *read_big(const char *path, size_t *len, tlm_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        tlm_err_set(err, TLM_EINVAL, "--inputs", "cannot open \"%s\": %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
    if (n >= 0 && n <= (INT64_C(16) << 30) && !fseek(f, 0, SEEK_SET)) buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        tlm_err_set(err, TLM_EINVAL, "--inputs", "cannot read \"%s\" (a file of at most 16 GiB)",
                    path);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

char *cli_read_onnx(const char *path, size_t *len, tlm_error *err)
{
    return read_big(path, len, err);
}

/* An ONNX model's initializers (after the import's folding) bound to the params of the same
 * name: the plan must come from `tlm compile --onnx` of the same file. */
static int bind_onnx(rt_model *m, const char *path, tlm_error *err)
{
    size_t len;
    char *buf = read_big(path, &len, err);
    if (!buf) return err->code;
    fe_graph *g = NULL;
    fe_onnx_weights w;
    int rc = fe_onnx_import(buf, len, &g, &w, err);
    free(buf);
    fe_graph_free(g);
    for (int i = 0; !rc && i < w.n; i++) {
        rc = rt_bind(m, w.p[i].name, w.p[i].data, w.p[i].n, err);
        if (rc) snprintf(err->field, sizeof err->field, "--inputs");
    }
    if (rc && err->code != TLM_ENOMEM) err->code = rc = TLM_EINVAL;
    fe_onnx_weights_free(&w);
    return rc;
}

static int bind_npz(rt_model *m, const char *path, tlm_error *err)
{
    size_t len;
    char *buf = read_big(path, &len, err);
    if (!buf) return err->code;
    const unsigned char *z = (const unsigned char *)buf;
    size_t pos = 0;
    int rc = 0;
    while (!rc && pos + 30 <= len && le32(z + pos) == 0x04034b50) {
        uint32_t method = le16(z + pos + 8), csize = le32(z + pos + 18);
        uint32_t nlen = le16(z + pos + 26), xlen = le16(z + pos + 28);
        size_t data = pos + 30 + nlen + xlen;
        if (method != 0 || csize == 0xFFFFFFFFu || data + csize > len) {
            rc = tlm_err_set(err, TLM_EINVAL, "--inputs",
                             "only uncompressed .npz files below 4 GiB (numpy.savez) are read");
            break;
        }
        char name[FE_MAX_NAME + 8];
        snprintf(name, sizeof name, "%.*s", (int)(nlen < sizeof name ? nlen : sizeof name - 1),
                 z + pos + 30);
        size_t nl = strlen(name);
        if (nl > 4 && !strcmp(name + nl - 4, ".npy")) name[nl - 4] = 0;
        rc = bind_npy(m, name, z + data, csize, err);
        pos = data + csize;
    }
    free(buf);
    return rc;
}

/* One output as a version-1 .npy file (float32, C order, the plan's shape). */
static int save_npy(const char *dir, const rt_tensor *t, const float *data, tlm_error *err)
{
    char path[4400], name[FE_MAX_NAME + 1], hdr[256];
    snprintf(name, sizeof name, "%s", t->name);
    for (char *p = name; *p; p++)
        if (*p == '/') *p = '_';
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    int n = snprintf(hdr, sizeof hdr, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int d = 0; d < t->ndim; d++)
        n += snprintf(hdr + n, sizeof hdr - n, "%lld,%s", (long long)t->shape[d],
                      d + 1 < t->ndim ? " " : "");
    n += snprintf(hdr + n, sizeof hdr - n, "), }");
    /* magic (6) + version (2) + length (2) + header, padded with spaces to 64 and ending '\n' */
    int total = (10 + n + 1 + 63) / 64 * 64;
    memset(hdr + n, ' ', total - 10 - n);
    hdr[total - 10 - 1] = '\n';
    FILE *f = fopen(path, "wb");
    if (!f) return tlm_err_set(err, TLM_EIO, "--save-outputs", "cannot write %s", path);
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)((total - 10) & 0xff),
                             (unsigned char)((total - 10) >> 8)};
    bool ok = fwrite(pre, 1, 10, f) == 10 &&
              fwrite(hdr, 1, total - 10, f) == (size_t)(total - 10) &&
              fwrite(data, 4, (size_t)(t->bytes / 4), f) == (size_t)(t->bytes / 4);
    if (fclose(f) || !ok)
        return tlm_err_set(err, TLM_EIO, "--save-outputs", "cannot write %s", path);
    return 0;
}

/* ---- the command ---- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double manifest_flops(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    json_t *f = json_object_get(json_object_get(j, "model"), "flops");
    double v = json_is_integer(f) ? (double)json_integer_value(f) : -1;
    json_decref(j);
    return v;
}

static int run_run(int argc, char **argv)
{
    const char *dir = NULL, *inputs = "random", *check = "auto", *save = NULL, *prepack = "on";
    uint64_t repeat = 10, seed = 1;
    double tol = 1e-3;
    tlm_error err;
    tlm_err_clear(&err);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(run_usage, stdout);
            return CLI_OK;
        }
        if (i + 1 >= argc) return cli_usage_error("run: %s needs a value", o);
        const char *v = argv[++i];
        if (!strcmp(o, "--plan"))
            dir = v;
        else if (!strcmp(o, "--inputs"))
            inputs = v;
        else if (!strcmp(o, "--check"))
            check = v;
        else if (!strcmp(o, "--save-outputs"))
            save = v;
        else if (!strcmp(o, "--prepack"))
            prepack = v;
        else if (!strcmp(o, "--repeat")) {
            if (cli_parse_u64(o, v, 100000, &repeat, &err)) return cli_report(&err);
            if (repeat < 1) return cli_usage_error("run: --repeat must be at least 1");
        } else if (!strcmp(o, "--seed")) {
            if (cli_parse_u64(o, v, UINT64_MAX, &seed, &err)) return cli_report(&err);
        } else if (!strcmp(o, "--tolerance")) {
            char *end;
            tol = strtod(v, &end);
            if (*end || !(tol > 0)) return cli_usage_error("run: --tolerance must be > 0");
        } else
            return cli_usage_error("run: unknown option %s (see tlm run --help)", o);
    }
    if (!dir) return cli_usage_error("run: --plan DIR is required (see tlm run --help)");
    if (strcmp(check, "auto") && strcmp(check, "on") && strcmp(check, "off"))
        return cli_usage_error("run: --check must be auto, on or off");
    if (strcmp(prepack, "on") && strcmp(prepack, "off"))
        return cli_usage_error("run: --prepack must be on or off");

    rt_model *m = NULL;
    if (rt_model_load(dir, &m, &err)) {
        if (err.code == TLM_EINVAL) snprintf(err.field, sizeof err.field, "--plan");
        return cli_report(&err);
    }
    int rc = CLI_OK, nl = rt_model_n_launches(m);
    double *times = calloc((size_t)nl * repeat, sizeof *times);
    double *e2e = calloc(repeat, sizeof *e2e), *col = calloc(repeat, sizeof *col);
    json_t *out = NULL;
    if (!times || !e2e || !col) {
        tlm_err_set(&err, TLM_ENOMEM, "", "out of memory");
        rc = cli_report(&err);
        goto done;
    }
    rt_set_prepack(m, !strcmp(prepack, "on"));
    rt_bind_random(m, seed);
    size_t il = strlen(inputs);
    bool onnx = il > 5 && !strcmp(inputs + il - 5, ".onnx");
    if (strcmp(inputs, "random") &&
        (onnx ? bind_onnx(m, inputs, &err) : bind_npz(m, inputs, &err))) {
        rc = cli_report(&err);
        goto done;
    }
    if (rt_run(m, NULL, &err)) { /* warm-up: page faults, OpenMP threads, caches */
        cli_report(&err);
        rc = CLI_FAIL;
        goto done;
    }
    for (uint64_t r = 0; r < repeat; r++) {
        double t0 = tlm_now_s();
        if (rt_run(m, times + r * nl, &err)) {
            cli_report(&err);
            rc = CLI_FAIL;
            goto done;
        }
        e2e[r] = tlm_now_s() - t0;
    }
    for (int i = 0; save && i < rt_model_n_tensors(m); i++) {
        const rt_tensor *t = rt_model_tensor(m, i);
        if (t->kind == FE_T_OUTPUT && save_npy(save, t, rt_model_data(m, i), &err)) {
            cli_report(&err);
            rc = CLI_FAIL;
            goto done;
        }
    }
    json_t *ls = json_array();
    double sum_med = 0;
    for (int i = 0; i < nl; i++) {
        const rt_launch *L = rt_model_launch(m, i);
        for (uint64_t r = 0; r < repeat; r++)
            col[r] = times[r * nl + i];
        double med = median(col, (int)repeat);
        sum_med += med;
        json_array_append_new(ls, json_pack("{s:i, s:s, s:i, s:I, s:f}", "index", i, "node",
                                            L->node, "subgraph", L->kernel, "repeat",
                                            (json_int_t)L->repeat, "median_ms", med * 1e3));
    }
    double mean = 0;
    for (uint64_t r = 0; r < repeat; r++)
        mean += e2e[r] / (double)repeat;
    double med = median(e2e, (int)repeat); /* sorts e2e: e2e[0] is the minimum */
    json_t *outs = json_array();
    for (int i = 0; i < rt_model_n_tensors(m); i++) {
        const rt_tensor *t = rt_model_tensor(m, i);
        if (t->kind != FE_T_OUTPUT) continue;
        const float *d = rt_model_data(m, i);
        double sum = 0;
        for (int64_t e = 0; e < t->bytes / 4; e++)
            sum += d[e];
        json_array_append_new(outs, json_pack("{s:s, s:I, s:f}", "name", t->name, "elements",
                                              (json_int_t)(t->bytes / 4), "sum", sum));
    }
    out = json_pack("{s:s, s:s, s:i, s:I, s:I, s:b, s:I, s:s, s:{s:f, s:f, s:f}, s:f, s:o, s:o}",
                    "plan", dir, "device", rt_model_cuda(m) ? "cuda" : "cpu", "launches_in_plan",
                    nl, "arena_bytes", (json_int_t)rt_model_arena_bytes(m), "prepacked_bytes",
                    (json_int_t)rt_model_prepack_bytes(m), "huge_pages", rt_model_huge_pages(m),
                    "repeat", (json_int_t)repeat, "inputs", inputs, "e2e_ms", "median", med * 1e3,
                    "min", e2e[0] * 1e3, "mean", mean * 1e3, "sum_launch_median_ms", sum_med * 1e3,
                    "outputs", outs, "launches", ls);
    double flops = manifest_flops(dir);
    bool do_check =
        !strcmp(check, "on") || (!strcmp(check, "auto") && flops >= 0 && flops <= AUTO_CHECK_FLOPS);
    if (do_check) {
        rt_check ck;
        if (rt_reference(m, proto_workload_decode, &ck, &err)) {
            cli_report(&err);
            rc = CLI_FAIL;
            goto done;
        }
        bool ok = ck.finite && ck.max_rel_err <= tol;
        json_object_set_new(out, "check",
                            json_pack("{s:s, s:f, s:s, s:f, s:b, s:f}", "status",
                                      ok ? "ok" : "wrong", "max_rel_err", ck.max_rel_err, "worst",
                                      ck.worst, "tolerance", tol, "finite", ck.finite, "seconds",
                                      ck.seconds));
        if (!ok) rc = CLI_FAIL;
    } else {
        json_object_set_new(
            out, "check",
            json_pack("{s:s, s:s}", "status", "skipped", "why",
                      flops < 0 ? "the manifest has no model.flops" : "over 2 GFLOP (--check on)"));
    }
    if (cli_print_json(out) && rc == CLI_OK) rc = CLI_FAIL;
done:
    json_decref(out);
    free(times);
    free(e2e);
    free(col);
    rt_model_free(m);
    return rc;
}

const cli_cmd cli_cmd_run = {"run", "run a compiled network (plan + kernels) and time it", run_run};
