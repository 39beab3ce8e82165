/* records_json.c — one measurement record of the "tlm-records/1" JSONL format (tlm records
 * export|import, tools/tlm/cmd_records.c) into a store_measurement; tests/fuzz/fuzz_records.c
 * feeds it and store_measurement_import arbitrary lines. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "store/store.h"

static const char *opt_str(const json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static double opt_num(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

const char *store_measurement_from_json(const json_t *o, store_measurement *m, char **wl_text)
{
    memset(m, 0, sizeof *m);
    *wl_text = NULL;
    if (!json_is_object(o)) return "(the line is not a JSON object)";
    const char *fmt = opt_str(o, "format");
    if (!fmt || strcmp(fmt, STORE_RECORDS_FORMAT)) return "format";
    static const char *const req[] = {"workload_hash", "target_hash", "schedule", "status"};
    for (int i = 0; i < 4; i++) {
        const char *v = opt_str(o, req[i]);
        if (!v || !*v) return req[i];
    }
    m->workload_hash = (char *)opt_str(o, "workload_hash");
    m->target_hash = (char *)opt_str(o, "target_hash");
    m->schedule = (char *)opt_str(o, "schedule");
    m->status = (char *)opt_str(o, "status");
    if (strlen(m->workload_hash) != 64 || strlen(m->target_hash) != 64) return "workload_hash";
    m->sketch = (char *)opt_str(o, "sketch");
    m->target_name = (char *)opt_str(o, "target");
    m->sentence = (char *)opt_str(o, "sentence");
    m->toolchain_id = (char *)opt_str(o, "toolchain");
    m->model_id = (char *)opt_str(o, "model_id");
    m->schedule_source = (char *)opt_str(o, "schedule_source");
    m->host_id = (char *)opt_str(o, "host_id");
    m->detail = (char *)opt_str(o, "detail");
    m->median_s = opt_num(o, "median_s");
    m->min_s = opt_num(o, "min_s");
    m->gflops = opt_num(o, "gflops");
    m->rel_err = opt_num(o, "rel_err");
    double ns = opt_num(o, "n_samples");
    m->n_samples = isfinite(ns) && ns > 0 && ns < 1e9 ? (int)ns : 0;
    const json_t *at = json_object_get(o, "created_at");
    if (!json_is_integer(at) || json_integer_value(at) <= 0) return "created_at";
    m->created_at = json_integer_value(at);
    const json_t *wl = json_object_get(o, "workload");
    if (json_is_object(wl)) {
        *wl_text = json_dumps(wl, JSON_COMPACT | JSON_SORT_KEYS);
        m->workload_json = *wl_text;
    }
    return NULL;
}
