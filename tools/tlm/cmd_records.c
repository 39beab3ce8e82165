/* cmd_records.c — `tlm records export|import`: the store's measurement records as JSONL, the
 * datasets the trainer reads and the way machines share what they measured.
 *
 *   tlm records export --store FILE [-o FILE|-] [--status ok]
 *   tlm records import --store FILE FILE...   (FILE "-" = stdin)
 *
 * One JSON object per line (format "tlm-records/1"):
 *   {"format", "workload_hash", "target_hash", "target", "workload" (the canonical workload
 *    object), "sketch", "schedule", "sentence", "status", "median_s", "min_s", "n_samples",
 *    "gflops", "rel_err", "toolchain", "model_id", "schedule_source", "host_id", "detail",
 *    "created_at" (µs since the epoch)}
 * "status" is "ok" for a measurement, the failure otherwise ("wrong", "crash", ...), or
 * "modelled" / "model_error" for a cuda record labelled by the analytic GPU model instead
 * of measured (`tlm datagen --labels model`; its "detail" holds the model's figures): such a
 * record is a prediction, so `--status ok` never exports it, and records measured on a GPU
 * imported beside it stay distinct (the status is part of a record's identity).
 * Numbers that were not measured are null. Import keeps created_at and host_id and merges
 * duplicates (store_measurement_import): importing a file twice adds nothing the second time.
 * A malformed line is reported with its number and skipped; the summary on stdout counts
 * read, added, duplicates and rejected lines (exit 1 when any was rejected). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/store.h"
#include "tools/tlm/cli.h"

#define RECORDS_FORMAT STORE_RECORDS_FORMAT

static const char records_usage[] =
    "usage: tlm records export --store FILE [-o FILE|-] [--status ok]\n"
    "       tlm records import --store FILE FILE...      (FILE - reads stdin)\n"
    "  measurement records as JSONL (one object per line, format \"" RECORDS_FORMAT "\");\n"
    "  import merges duplicates, so importing the same file twice adds nothing\n";

static json_t *num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

static json_t *str(const char *s)
{
    return s ? json_string(s) : json_null();
}

static json_t *record_json(const store_measurement *m)
{
    json_t *wl = m->workload_json ? json_loads(m->workload_json, 0, NULL) : NULL;
    return json_pack(
        "{s:s, s:s, s:s, s:o, s:o, s:o, s:s, s:o, s:s, s:o, s:o, s:i, s:o, s:o, "
        "s:o, s:o, s:o, s:o, s:o, s:I}",
        "format", RECORDS_FORMAT, "workload_hash", m->workload_hash, "target_hash", m->target_hash,
        "target", str(m->target_name), "workload", wl ? wl : json_null(), "sketch", str(m->sketch),
        "schedule", m->schedule, "sentence", str(m->sentence), "status", m->status, "median_s",
        num(m->median_s), "min_s", num(m->min_s), "n_samples", m->n_samples, "gflops",
        num(m->gflops), "rel_err", num(m->rel_err), "toolchain", str(m->toolchain_id), "model_id",
        str(m->model_id), "schedule_source", str(m->schedule_source), "host_id", str(m->host_id),
        "detail", str(m->detail), "created_at", (json_int_t)m->created_at);
}

static int do_export(const char *store_path, const char *out_path, const char *status)
{
    tlm_error err;
    tlm_err_clear(&err);
    store *st = store_open(store_path, NULL, &err);
    if (!st) {
        /* a path that cannot hold a store is the user's input */
        err.code = TLM_EINVAL;
        snprintf(err.field, sizeof err.field, "--store");
        return cli_report(&err);
    }
    bool to_stdout = !out_path || !strcmp(out_path, "-");
    FILE *f = to_stdout ? stdout : fopen(out_path, "w");
    if (!f) {
        fprintf(stderr, "tlm: -o: cannot write \"%s\": %s\n", out_path, strerror(errno));
        store_close(st);
        return CLI_USAGE;
    }
    int64_t after = 0;
    long long n = 0;
    int rc = 0;
    for (;;) {
        store_measurement *ms = NULL;
        size_t count = 0;
        if ((rc = store_measurements_page(st, after, 1000, &ms, &count, &err))) break;
        for (size_t i = 0; i < count; i++) {
            after = ms[i].id;
            if (status && strcmp(ms[i].status, status)) continue;
            json_t *o = record_json(&ms[i]);
            char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
            if (line) {
                fputs(line, f);
                fputc('\n', f);
                n++;
            }
            free(line);
            json_decref(o);
        }
        store_measurements_free(ms, count);
        if (count < 1000) break;
    }
    bool ok = !ferror(f);
    if (!to_stdout) ok = fclose(f) == 0 && ok;
    store_close(st);
    if (rc) return cli_report(&err);
    if (!ok) {
        fprintf(stderr, "tlm: -o: writing \"%s\" failed\n", to_stdout ? "-" : out_path);
        return CLI_FAIL;
    }
    fprintf(stderr, "tlm: records: exported %lld\n", n);
    return CLI_OK;
}

static int do_import(const char *store_path, char **files, int n_files)
{
    tlm_error err;
    tlm_err_clear(&err);
    store *st = store_open(store_path, NULL, &err);
    if (!st) {
        /* a path that cannot hold a store is the user's input */
        err.code = TLM_EINVAL;
        snprintf(err.field, sizeof err.field, "--store");
        return cli_report(&err);
    }
    long long read = 0, added = 0, dups = 0, rejected = 0;
    int rc = CLI_OK;
    for (int fi = 0; fi < n_files && rc == CLI_OK; fi++) {
        const char *path = files[fi];
        FILE *f = strcmp(path, "-") ? fopen(path, "r") : stdin;
        if (!f) {
            fprintf(stderr, "tlm: %s: cannot read: %s\n", path, strerror(errno));
            rc = CLI_USAGE;
            break;
        }
        char *line = NULL;
        size_t cap = 0;
        ssize_t len;
        long lineno = 0;
        while ((len = getline(&line, &cap, f)) >= 0) {
            lineno++;
            if (len == 0 || line[0] == '\n') continue;
            read++;
            json_error_t je;
            json_t *o = json_loadb(line, (size_t)len, 0, &je);
            store_measurement m;
            char *wl_text = NULL;
            const char *bad = o ? store_measurement_from_json(o, &m, &wl_text) : "(not JSON)";
            if (bad) {
                fprintf(stderr, "tlm: %s:%ld: %s: missing or invalid; line skipped\n", path, lineno,
                        bad);
                rejected++;
            } else {
                bool was_added = false;
                if (store_measurement_import(st, &m, &was_added, &err)) {
                    fprintf(stderr, "tlm: %s:%ld: %s\n", path, lineno, err.msg);
                    rc = CLI_FAIL;
                } else if (was_added) {
                    added++;
                } else {
                    dups++;
                }
            }
            free(wl_text);
            json_decref(o);
            if (rc != CLI_OK) break;
        }
        free(line);
        if (f != stdin) fclose(f);
    }
    store_close(st);
    json_t *sum =
        json_pack("{s:I, s:I, s:I, s:I}", "read", (json_int_t)read, "added", (json_int_t)added,
                  "duplicates", (json_int_t)dups, "rejected", (json_int_t)rejected);
    cli_print_json(sum);
    json_decref(sum);
    if (rc == CLI_OK && rejected) rc = CLI_FAIL;
    return rc;
}

static int run_records(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(records_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? CLI_USAGE : CLI_OK;
    }
    const char *verb = argv[1];
    const char *store_path = NULL, *out = NULL, *status = NULL;
    char **files = calloc((size_t)argc, sizeof *files);
    int n_files = 0;
    if (!files) return CLI_FAIL;
    int rc = CLI_OK;
    for (int i = 2; i < argc && rc == CLI_OK; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--store") || !strcmp(o, "-o") || !strcmp(o, "--out") ||
            !strcmp(o, "--status")) {
            if (i + 1 >= argc) {
                rc = cli_usage_error("records: %s needs a value", o);
                break;
            }
            const char *v = argv[++i];
            if (!strcmp(o, "--store"))
                store_path = v;
            else if (!strcmp(o, "--status"))
                status = v;
            else
                out = v;
        } else if (o[0] == '-' && strcmp(o, "-")) {
            rc = cli_usage_error("records: unknown option %s (see tlm records --help)", o);
        } else {
            files[n_files++] = argv[i];
        }
    }
    if (rc == CLI_OK && !store_path)
        rc = cli_usage_error("records: --store is required (see tlm records --help)");
    if (rc == CLI_OK) {
        if (!strcmp(verb, "export")) {
            rc = n_files ? cli_usage_error("records: export takes no file arguments (use -o)")
                         : do_export(store_path, out, status);
        } else if (!strcmp(verb, "import")) {
            rc = !n_files ? cli_usage_error("records: import needs at least one FILE")
                 : out    ? cli_usage_error("records: import takes no -o")
                          : do_import(store_path, files, n_files);
        } else {
            rc = cli_usage_error("records: unknown verb \"%s\"; allowed: export, import", verb);
        }
    }
    free(files);
    return rc;
}

const cli_cmd cli_cmd_records = {"records", "export / import measurement records (JSONL)",
                                 run_records};
