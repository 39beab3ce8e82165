/* cost.c — the tuner's cost model: gradient-boosted regression trees (XGBoost's C API) from
 * schedule features to normalised throughput (see tune.h). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xgboost/c_api.h>

#include "compiler/tune/tune.h"

/* Boosting rounds per fit: the data are at most a few thousand rows of ~100 features, so a
 * fit from scratch takes milliseconds and keeps the model a pure function of the data. */
#define COST_ROUNDS 60

struct tune_cost {
    int nf;
    uint64_t seed;
    BoosterHandle b; /* NULL until trained */
};

static pthread_once_t quiet_once = PTHREAD_ONCE_INIT;

static void quiet(void)
{
    XGBSetGlobalConfig("{\"verbosity\": 0}");
}

static int xgb_err(tlm_error *err, const char *what)
{
    return tlm_err_set(err, TLM_ERUNTIME, "", "cost model: %s: %s", what, XGBGetLastError());
}

tune_cost *tune_cost_new(int n_features, uint64_t seed, tlm_error *err)
{
    pthread_once(&quiet_once, quiet);
    tune_cost *c = calloc(1, sizeof *c);
    if (!c) {
        tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
        return NULL;
    }
    c->nf = n_features;
    c->seed = seed;
    return c;
}

void tune_cost_free(tune_cost *c)
{
    if (!c) return;
    if (c->b) XGBoosterFree(c->b);
    free(c);
}

int tune_cost_fit(tune_cost *c, const float *x, const float *y, int n, tlm_error *err)
{
    if (n <= 0) return 0;
    DMatrixHandle d = NULL;
    if (XGDMatrixCreateFromMat(x, (bst_ulong)n, (bst_ulong)c->nf, -1e30f, &d))
        return xgb_err(err, "building the training matrix");
    BoosterHandle b = NULL;
    int rc = 0;
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)(c->seed % 2147483647u));
    const char *params[][2] = {
        {"objective", "reg:squarederror"},
        {"max_depth", "6"},
        {"eta", "0.2"},
        {"min_child_weight", "1"},
        {"subsample", "1"},
        {"lambda", "1"},
        {"tree_method", "hist"},
        {"nthread", "1"}, /* deterministic, and the builds get the cores */
        {"seed", seed},
    };
    if (XGDMatrixSetFloatInfo(d, "label", y, (bst_ulong)n)) rc = xgb_err(err, "setting labels");
    if (!rc && XGBoosterCreate(&d, 1, &b)) rc = xgb_err(err, "creating the booster");
    for (size_t i = 0; !rc && i < sizeof params / sizeof params[0]; i++)
        if (XGBoosterSetParam(b, params[i][0], params[i][1]))
            rc = xgb_err(err, "setting a parameter");
    for (int it = 0; !rc && it < COST_ROUNDS; it++)
        if (XGBoosterUpdateOneIter(b, it, d)) rc = xgb_err(err, "training");
    XGDMatrixFree(d);
    if (rc) {
        if (b) XGBoosterFree(b);
        return rc;
    }
    if (c->b) XGBoosterFree(c->b);
    c->b = b;
    return 0;
}

int tune_cost_predict(tune_cost *c, const float *x, int n, float *out, tlm_error *err)
{
    if (n <= 0) return 0;
    if (!c->b) {
        memset(out, 0, (size_t)n * sizeof *out);
        return 0;
    }
    DMatrixHandle d = NULL;
    if (XGDMatrixCreateFromMat(x, (bst_ulong)n, (bst_ulong)c->nf, -1e30f, &d))
        return xgb_err(err, "building the prediction matrix");
    bst_ulong len = 0;
    const float *res = NULL;
    int rc = 0;
    if (XGBoosterPredict(c->b, d, 0, 0, 0, &len, &res))
        rc = xgb_err(err, "predicting");
    else if (len != (bst_ulong)n)
        rc = tlm_err_set(err, TLM_ERUNTIME, "", "cost model: %llu predictions for %d rows",
                         (unsigned long long)len, n);
    else
        memcpy(out, res, (size_t)n * sizeof *out);
    XGDMatrixFree(d);
    return rc;
}
