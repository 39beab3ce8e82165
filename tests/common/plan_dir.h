/* plan_dir.h — for runtime tests: what `tlm compile --graph` does, in process. A graph is
 * fused and planned, each unique subgraph compiled with the default schedule for this CPU
 * (the pipeline entry), and NNN.so + manifest.json written into a fresh directory that
 * compiler/runtime loads. Header-only (static functions). */
#ifndef TLM_TESTS_PLAN_DIR_H
#define TLM_TESTS_PLAN_DIR_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/driver/pipeline.h"
#include "compiler/frontend/frontend.h"
#include "compiler/target/target.h"
#include "proto/workload.h"

static void plan_dir_write(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* Takes g (freed here); returns the directory (free with plan_dir_remove). */
static char *plan_dir_compile(fe_graph *g)
{
    char *dir = strdup("/tmp/tlm-plan-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    tlm_error err = {0};
    fe_fused f;
    fe_plan p;
    cr_assert_eq(fe_fuse(g, &f, &err), 0, "%s", err.msg);
    /* every residual that may be written over is (a CPU plan does so past a core's L2), so
     * the runs and checks of these small graphs go through in-place launches too */
    cr_assert_eq(fe_plan_build(g, &f, 0, &p, &err), 0, "%s", err.msg);
    target t;
    cr_assert_eq(target_parse("cpu", &t, &err), 0);
    pl_opts o;
    pl_opts_init(&o);
    o.measure = PL_MEASURE_OFF;
    json_t *ks = json_array();
    for (int i = 0; i < f.n; i++) {
        pl_job j;
        cr_assert_eq(pl_run(&j, &f.sub[i].wl, &t, &o, &err), 0, "%s", err.msg);
        char name[32], path[512];
        snprintf(name, sizeof name, "%03d.so", i);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        plan_dir_write(path, j.art.binary, j.art.binary_size);
        json_array_append_new(ks, json_pack("{s:s, s:s, s:s, s:{}, s:o}", "binary", name, "entry",
                                            j.art.entry, "format", j.art.format, "launch",
                                            "workload", proto_workload_encode(&f.sub[i].wl)));
        pl_job_free(&j);
    }
    json_t *man = json_pack("{s:o, s:o, s:{s:I}}", "kernels", ks, "plan",
                            fe_plan_to_json(g, &f, &p), "model", "flops", (json_int_t)f.flops);
    char path[512];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    cr_assert_eq(json_dump_file(man, path, 0), 0);
    json_decref(man);
    fe_plan_free(&p);
    fe_fused_free(&f);
    fe_graph_free(g);
    return dir;
}

static void plan_dir_remove(char *dir)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    free(dir);
}

#endif
