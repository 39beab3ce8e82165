/* records.c — a pipeline job's records into the store's measurements (see store.h). */
#include <stdio.h>
#include <string.h>

#include "compiler/driver/pipeline.h"
#include "store/store.h"

int store_pl_records(store *st, const pl_job *j, int from, int to, const char *model_id,
                     int *stored, tlm_error *err)
{
    if (stored) *stored = 0;
    if (from < 0) from = 0;
    if (to > j->n_recs) to = j->n_recs;
    char toolchain[768];
    drv_record_toolchain(&j->tgt, j->o.mo.const_args, toolchain, sizeof toolchain);
    const char *sketch = j->sp ? space_sketch_name(j->sp->sketch) : NULL;
    int rc = 0;
    for (int i = from; i < to; i++) {
        const pl_record *r = &j->recs[i];
        if (!pl_record_storable(r)) continue;
        char sentence[8192];
        if (pl_sentence(j, r->cand, sentence, sizeof sentence) < 0) sentence[0] = 0;
        store_measurement m = {.workload_hash = (char *)j->whash,
                               .target_hash = (char *)j->target_hash,
                               .sketch = (char *)sketch,
                               .schedule = (char *)r->schedule,
                               .status = (char *)r->status,
                               .median_s = r->median_s,
                               .gflops = r->gflops,
                               .rel_err = r->rel_err,
                               .workload_json = (char *)j->canon,
                               .target_name = (char *)j->tgt.name,
                               .toolchain_id = toolchain,
                               .model_id = (char *)(model_id ? model_id : "none"),
                               .sentence = sentence[0] ? sentence : NULL,
                               .schedule_source = (char *)pl_source_name(r->source),
                               .min_s = r->min_s,
                               .n_samples = r->n_samples,
                               .detail = r->detail[0] ? (char *)r->detail : NULL};
        tlm_error e;
        if (store_measurement_add(st, &m, NULL, &e)) {
            if (!rc) {
                rc = e.code ? e.code : TLM_EIO;
                if (err) *err = e;
            }
        } else if (stored) {
            (*stored)++;
        }
    }
    return rc;
}
