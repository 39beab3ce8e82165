/* test_models.c — "graph" and "model" requests on the real tlmd (loopback, temporary store):
 * fusion and deduplication reach the answer as one kernel per unique subgraph with its
 * occurrence count and anchor node, the summary adds up, a repeat is all cache hits, and bad
 * graphs or model options get field-level errors. GET /v1/models lists the zoo. The answer's
 * execution plan runs (compiler/runtime) from the kernels fetched by key.
 * ResNet-50 runs at image_size 32: the same 27 unique subgraphs and 56 launches as at 224
 * (the topology does not depend on the image size), at a fraction of the compile time. */
#include "tests/common/tlmd_harness.h"

#include <math.h>

#include "compiler/runtime/runtime.h"

/* x[8,64] → dense+relu → dense+relu → dense: the first two are the same workload. */
static const char mlp_graph[] =
    "{\"name\":\"mlp3\",\"inputs\":["
    "{\"name\":\"x\",\"shape\":[8,64]},"
    "{\"name\":\"w1\",\"shape\":[64,64],\"param\":true},"
    "{\"name\":\"w2\",\"shape\":[64,64],\"param\":true},"
    "{\"name\":\"w3\",\"shape\":[64,16],\"param\":true},"
    "{\"name\":\"b3\",\"shape\":[16],\"param\":true}],"
    "\"nodes\":["
    "{\"name\":\"fc1\",\"op\":\"dense\",\"inputs\":[\"x\",\"w1\"]},"
    "{\"name\":\"r1\",\"op\":\"relu\",\"inputs\":[\"fc1\"]},"
    "{\"name\":\"fc2\",\"op\":\"dense\",\"inputs\":[\"r1\",\"w2\"]},"
    "{\"name\":\"r2\",\"op\":\"relu\",\"inputs\":[\"fc2\"]},"
    "{\"name\":\"fc3\",\"op\":\"dense\",\"inputs\":[\"r2\",\"w3\"]},"
    "{\"name\":\"out\",\"op\":\"bias_add\",\"inputs\":[\"fc3\",\"b3\"]}],"
    "\"outputs\":[\"out\"]}";

static const char *jstr(const json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static json_int_t jint(const json_t *o, const char *k)
{
    return json_integer_value(json_object_get(o, k));
}

Test(models, small_graph_streams_unique_subgraphs_with_counts)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char body[4096];
    snprintf(body, sizeof body, "{\"target\":\"cpu\",\"stream\":true,\"graph\":%s}", mlp_graph);
    resp r = post(&d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    int kernels = 0;
    bool seen[2] = {0}, accepted = false, done = false;
    for (char *l = r.body.p; l && *l;) {
        char *e = strchr(l, '\n');
        cr_assert(e);
        *e = 0;
        json_t *ev = json_loads(l, 0, NULL);
        cr_assert(ev, "not JSON: %s", l);
        const char *type = jstr(ev, "event");
        json_t *model = json_object_get(ev, "model");
        if (!strcmp(type, "accepted")) {
            accepted = true;
            cr_assert_eq(jint(ev, "kernels"), 2);
            cr_assert_str_eq(jstr(model, "kind"), "graph");
            cr_assert_str_eq(jstr(model, "name"), "mlp3");
            cr_assert_eq(jint(model, "launches"), 3);
        } else if (!strcmp(type, "kernel")) {
            int idx = (int)jint(ev, "index");
            cr_assert(idx == 0 || idx == 1);
            cr_assert(!seen[idx]);
            seen[idx] = true;
            kernels++;
            json_t *k = json_object_get(ev, "kernel");
            json_t *wl = json_object_get(k, "workload");
            json_t *epi = json_object_get(wl, "epilogue");
            if (idx == 0) {
                /* fc1 and fc2: one workload, two launches, named after its first anchor */
                cr_assert_eq(jint(k, "occurrences"), 2);
                cr_assert_str_eq(jstr(k, "node"), "fc1");
                cr_assert_eq(jint(json_object_get(wl, "shape"), "N"), 64);
                cr_assert_str_eq(json_string_value(json_array_get(epi, 0)), "relu");
            } else {
                cr_assert_eq(jint(k, "occurrences"), 1);
                cr_assert_str_eq(jstr(k, "node"), "fc3");
                cr_assert_eq(jint(json_object_get(wl, "shape"), "N"), 16);
                cr_assert_str_eq(json_string_value(json_array_get(epi, 0)), "bias_add");
            }
            cr_assert_str_eq(jstr(k, "cache"), "miss");
            cr_assert_str_eq(jstr(k, "format"), "elf-so");
        } else {
            cr_assert_str_eq(type, "done", "%s", l);
            done = true;
            json_t *st = json_object_get(ev, "stats");
            cr_assert_eq(jint(st, "subgraphs"), 2);
            cr_assert_eq(jint(st, "misses"), 2);
            cr_assert_eq(jint(st, "hits"), 0);
            cr_assert_eq(jint(st, "launches"), 3);
            cr_assert(json_real_value(json_object_get(st, "seconds")) > 0);
            cr_assert_str_eq(jstr(model, "name"), "mlp3");
        }
        json_decref(ev);
        l = e + 1;
    }
    cr_assert(accepted && done);
    cr_assert_eq(kernels, 2);
    resp_free(&r);
    teardown(&d);
}

/* The answer's execution plan, run: the kernels fetched by key into a directory with a
 * manifest, loaded by compiler/runtime, fed known weights, compared with loops written here. */
Test(models, graph_answer_carries_a_plan_that_runs)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char body[4096];
    snprintf(body, sizeof body, "{\"target\":\"cpu\",\"graph\":%s}", mlp_graph);
    resp r = post(&d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *ans = body_json(&r);
    json_t *plan = json_object_get(ans, "plan"), *ks = json_object_get(ans, "kernels");
    json_t *ls = json_object_get(plan, "launches");
    cr_assert_eq(json_array_size(ls), 3, "fc1, fc2, fc3 in order");
    static const char *const nodes[] = {"fc1", "fc2", "fc3"};
    static const char *const outs[] = {"r1", "r2", "out"};
    for (size_t i = 0; i < 3; i++) {
        json_t *l = json_array_get(ls, i);
        cr_assert_str_eq(jstr(l, "node"), nodes[i]);
        json_t *k = json_array_get(ks, (size_t)jint(l, "subgraph"));
        cr_assert_str_eq(jstr(l, "kernel"), jstr(k, "key"), "the launch names its kernel");
        json_t *args = json_object_get(l, "args");
        cr_assert_str_eq(json_string_value(json_array_get(args, json_array_size(args) - 1)),
                         outs[i]);
    }
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(plan, "outputs"), 0)), "out");

    char dir[] = "/tmp/tlmd-plan-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    json_t *mk = json_array();
    for (size_t i = 0; i < json_array_size(ks); i++) {
        json_t *k = json_array_get(ks, i);
        char path[600], name[32];
        snprintf(path, sizeof path, "/v1/kernels/%s", jstr(k, "key"));
        resp b = get(&d, path);
        cr_assert_eq(b.status, 200);
        snprintf(name, sizeof name, "%03zu.so", i);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "wb");
        cr_assert_not_null(f);
        cr_assert_eq(fwrite(b.body.p, 1, b.body.n, f), b.body.n);
        fclose(f);
        resp_free(&b);
        json_array_append_new(mk, json_pack("{s:s, s:O, s:O, s:O, s:O}", "binary", name, "entry",
                                            json_object_get(k, "entry"), "format",
                                            json_object_get(k, "format"), "launch",
                                            json_object_get(k, "launch"), "workload",
                                            json_object_get(k, "workload")));
    }
    json_t *man = json_pack("{s:o, s:O}", "kernels", mk, "plan", plan);
    char mpath[600];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    cr_assert_eq(json_dump_file(man, mpath, 0), 0);
    json_decref(man);

    rt_model *m;
    tlm_error err = {0};
    cr_assert_eq(rt_model_load(dir, &m, &err), 0, "%s: %s", err.field, err.msg);
    static float x[8 * 64], w1[64 * 64], w2[64 * 64], w3[64 * 16], b3[16];
    for (int i = 0; i < 8 * 64; i++)
        x[i] = (float)((i * 37) % 19) / 19.0f - 0.5f;
    for (int i = 0; i < 64 * 64; i++) {
        w1[i] = (float)((i * 13) % 29) / 29.0f - 0.45f;
        w2[i] = (float)((i * 7) % 31) / 31.0f - 0.55f;
    }
    for (int i = 0; i < 64 * 16; i++)
        w3[i] = (float)((i * 11) % 23) / 23.0f - 0.5f;
    for (int i = 0; i < 16; i++)
        b3[i] = (float)i / 16.0f;
    cr_assert_eq(rt_bind(m, "x", x, 8 * 64, &err), 0, "%s", err.msg);
    cr_assert_eq(rt_bind(m, "w1", w1, 64 * 64, &err), 0);
    cr_assert_eq(rt_bind(m, "w2", w2, 64 * 64, &err), 0);
    cr_assert_eq(rt_bind(m, "w3", w3, 64 * 16, &err), 0);
    cr_assert_eq(rt_bind(m, "b3", b3, 16, &err), 0);
    cr_assert_eq(rt_run(m, NULL, &err), 0, "%s", err.msg);
    double h1[8][64], h2[8][64];
    for (int i = 0; i < 8; i++)
        for (int n = 0; n < 64; n++) {
            double s = 0;
            for (int k = 0; k < 64; k++)
                s += (double)x[i * 64 + k] * w1[k * 64 + n];
            h1[i][n] = s > 0 ? s : 0;
        }
    for (int i = 0; i < 8; i++)
        for (int n = 0; n < 64; n++) {
            double s = 0;
            for (int k = 0; k < 64; k++)
                s += h1[i][k] * w2[k * 64 + n];
            h2[i][n] = s > 0 ? s : 0;
        }
    const float *out = rt_model_data(m, rt_model_find(m, "out"));
    for (int i = 0; i < 8; i++)
        for (int n = 0; n < 16; n++) {
            double s = b3[n];
            for (int k = 0; k < 64; k++)
                s += h2[i][k] * w3[k * 16 + n];
            cr_assert_float_eq(out[i * 16 + n], s, 1e-3 * (1 + fabs(s)), "out[%d][%d]: %g vs %g", i,
                               n, out[i * 16 + n], s);
        }
    rt_model_free(m);
    char cmd[100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    json_decref(ans);
    resp_free(&r);
    teardown(&d);
}

static char *b64_file(const char *name)
{
    const char *root = getenv("TLM_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/data/onnx/%s", root && *root ? root : ".", name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    static unsigned char d[1 << 16];
    size_t n = fread(d, 1, sizeof d, f);
    fclose(f);
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc((n + 2) / 3 * 4 + 1), *p = o;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) |
                     (i + 2 < n ? d[i + 2] : 0);
        *p++ = a[v >> 18 & 63];
        *p++ = a[v >> 12 & 63];
        *p++ = i + 1 < n ? a[v >> 6 & 63] : '=';
        *p++ = i + 2 < n ? a[v & 63] : '=';
    }
    *p = 0;
    return o;
}

Test(models, onnx_models_compile_with_a_plan_and_bad_ones_name_the_node)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char *b64 = b64_file("transformer_block.onnx");
    char *body = malloc(strlen(b64) + 64);
    sprintf(body, "{\"target\":\"cpu\",\"onnx\":\"%s\"}", b64);
    resp r = post(&d, body);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    json_t *ans = body_json(&r);
    cr_assert_str_eq(jstr(json_object_get(ans, "model"), "kind"), "onnx");
    json_t *plan = json_object_get(ans, "plan");
    cr_assert_geq(json_array_size(json_object_get(plan, "launches")), 10);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(plan, "outputs"), 0)), "y");
    json_decref(ans);
    resp_free(&r);
    free(b64);
    free(body);

    b64 = b64_file("unknown_op.onnx");
    body = malloc(strlen(b64) + 64);
    sprintf(body, "{\"target\":\"cpu\",\"onnx\":\"%s\"}", b64);
    r = post(&d, body);
    cr_assert_eq(r.status, 422, "%s", r.body.p);
    cr_assert(strstr(r.body.p, "onnx.graph.node[1]") && strstr(r.body.p, "Sin"), "%s", r.body.p);
    resp_free(&r);
    /* truncated: the protobuf does not decode */
    b64[strlen(b64) / 2 / 4 * 4] = 0;
    sprintf(body, "{\"target\":\"cpu\",\"onnx\":\"%s\"}", b64);
    r = post(&d, body);
    cr_assert_eq(r.status, 400, "%s", r.body.p);
    cr_assert(strstr(r.body.p, "\"onnx\""), "%s", r.body.p);
    resp_free(&r);
    r = post(&d, "{\"target\":\"cpu\",\"onnx\":\"not base64!\"}");
    cr_assert_eq(r.status, 400);
    resp_free(&r);
    free(b64);
    free(body);
    cr_assert(healthy(&d));
    teardown(&d);
}

Test(models, resnet50_cpu_unique_subgraphs_then_all_hits)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    resp m = get(&d, "/v1/models");
    cr_assert_eq(m.status, 200);
    json_t *mj = body_json(&m);
    json_t *list = json_object_get(mj, "models");
    bool found = false;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        if (strcmp(jstr(e, "name"), "resnet50")) continue;
        found = true;
        json_t *batch = json_object_get(json_object_get(e, "options"), "batch");
        cr_assert_eq(jint(batch, "default"), 1);
        cr_assert(!json_object_get(json_object_get(e, "options"), "seq_len"));
    }
    cr_assert(found, "resnet50 is not in /v1/models: %s", m.body.p);
    cr_assert(json_array_size(list) >= 6);
    json_decref(mj);
    resp_free(&m);

    const char *body = "{\"target\":\"cpu\",\"model\":{\"name\":\"resnet50\",\"batch\":1,"
                       "\"image_size\":32}}";
    for (int pass = 0; pass < 2; pass++) {
        resp r = post(&d, body);
        cr_assert_eq(r.status, 200, "%s", r.body.p);
        json_t *a = body_json(&r);
        json_t *model = json_object_get(a, "model");
        cr_assert_str_eq(jstr(model, "name"), "resnet50");
        cr_assert_eq(jint(model, "subgraphs"), 27);
        cr_assert_eq(jint(model, "launches"), 56);
        cr_assert_eq(jint(model, "image_size"), 32);
        json_t *ks = json_object_get(a, "kernels");
        cr_assert_eq(json_array_size(ks), 27);
        json_int_t launches = 0;
        int conv = 0;
        for (size_t i = 0; i < json_array_size(ks); i++) {
            json_t *k = json_array_get(ks, i);
            json_int_t occ = jint(k, "occurrences");
            cr_assert(occ >= 1);
            launches += occ;
            cr_assert(jstr(k, "node")[0]);
            cr_assert_str_eq(jstr(k, "cache"), pass ? "hit" : "miss");
            if (!strcmp(jstr(json_object_get(k, "workload"), "op"), "conv2d")) conv++;
            /* the stage-3 1x1 expansion with the residual add runs in all six blocks */
            if (!strcmp(jstr(k, "node"), "layer3.0.conv3")) cr_assert_eq(occ, 6);
            if (i == 0) cr_assert_str_eq(jstr(k, "node"), "conv1");
        }
        cr_assert_eq(launches, 56);
        cr_assert_eq(conv, 24);
        json_t *st = json_object_get(a, "stats");
        cr_assert_eq(jint(st, "subgraphs"), 27);
        cr_assert_eq(jint(st, "hits"), pass ? 27 : 0);
        cr_assert_eq(jint(st, "misses"), pass ? 0 : 27);
        json_decref(a);
        resp_free(&r);
    }
    cr_assert_eq(cache_stat(&d, "compiles"), 27);
    teardown(&d);
}

typedef struct {
    const char *name;
    const char *body; /* the request body */
    long status;
    const char *code, *field;
} bad_case;

Test(models, bad_graphs_and_models_name_the_field)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
#define G(inputs, nodes)                                                                           \
    "{\"target\":\"cpu\",\"graph\":{\"inputs\":[" inputs "],\"nodes\":[" nodes "]}}"
#define X "{\"name\":\"x\",\"shape\":[4,8]}"
#define W "{\"name\":\"w\",\"shape\":[8,8]}"
    const bad_case cases[] = {
        {"graph not an object", "{\"target\":\"cpu\",\"graph\":[1]}", 400, "invalid_field",
         "graph"},
        {"unknown input name", G(X, "{\"name\":\"y\",\"op\":\"dense\",\"inputs\":[\"x\",\"w\"]}"),
         400, "invalid_field", "graph.nodes[0].inputs[1]"},
        {"cycle",
         G(X, "{\"name\":\"a\",\"op\":\"relu\",\"inputs\":[\"b\"]},"
              "{\"name\":\"b\",\"op\":\"relu\",\"inputs\":[\"a\"]}"),
         400, "invalid_field", NULL},
        {"shape mismatch",
         G(X ",{\"name\":\"w\",\"shape\":[5,8]}",
           "{\"name\":\"y\",\"op\":\"dense\",\"inputs\":[\"x\",\"w\"]}"),
         400, "invalid_field", "graph.nodes[0].inputs[1]"},
        {"unknown op", G(X "," W, "{\"name\":\"y\",\"op\":\"conv3d\",\"inputs\":[\"x\",\"w\"]}"),
         422, "unsupported", "graph.nodes[0].op"},
        {"bad input shape",
         G("{\"name\":\"x\",\"shape\":[4,0]}",
           "{\"name\":\"y\",\"op\":\"relu\",\"inputs\":[\"x\"]}"),
         400, "invalid_field", "graph.inputs[0].shape"},
        {"unknown key in graph",
         "{\"target\":\"cpu\",\"graph\":{\"inputs\":[" X "],\"nodes\":[],"
         "\"weights\":1}}",
         400, "invalid_field", NULL},
        {"model not an object", "{\"target\":\"cpu\",\"model\":\"resnet50\"}", 400, "invalid_field",
         "model"},
        {"unknown model", "{\"target\":\"cpu\",\"model\":{\"name\":\"vgg16\"}}", 422, "unsupported",
         "model.name"},
        {"option the model lacks",
         "{\"target\":\"cpu\",\"model\":{\"name\":\"resnet50\",\"seq_len\":64}}", 400,
         "invalid_field", "model.seq_len"},
        {"option out of range",
         "{\"target\":\"cpu\",\"model\":{\"name\":\"bert_base\",\"batch\":0}}", 400,
         "invalid_field", "model.batch"},
        {"graph and model", "{\"target\":\"cpu\",\"model\":{\"name\":\"gpt2\"},\"graph\":{}}", 400,
         "invalid_field", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        resp r = post(&d, c->body);
        cr_expect_eq(r.status, c->status, "%s: status %ld: %s", c->name, r.status, r.body.p);
        json_t *j = body_json(&r);
        json_t *e = json_object_get(j, "error");
        cr_expect_str_eq(jstr(e, "code"), c->code, "%s: %s", c->name, r.body.p);
        if (c->field) cr_expect_str_eq(jstr(e, "field"), c->field, "%s: %s", c->name, r.body.p);
        /* the graph cases all name a field inside the graph */
        if (!c->field && strstr(c->body, "\"graph\":{\"inputs")) {
            cr_expect(!strncmp(jstr(e, "field"), "graph.", 6), "%s: %s", c->name, r.body.p);
        }
        cr_expect(jstr(e, "message")[0]);
        json_decref(j);
        resp_free(&r);
    }
    /* nothing was compiled */
    cr_assert_eq(cache_stat(&d, "compiles"), 0);
    teardown(&d);
}
