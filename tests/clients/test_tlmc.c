/* test_tlmc.c — the tlmc client (TLMC_BIN, default build/san/tlmc) against a real tlmd on
 * loopback: a model compiled into a directory (every kernel's binary, source and meta, and a
 * manifest that matches them), the second run all cache hits; a graph file, --stream, get,
 * stats, health, the bearer token from TLMC_TOKEN and the server from TLMC_SERVER, and the
 * exit codes 0/1/2. ResNet-50 runs at image_size 32: the same 27 unique subgraphs as at 224
 * for a fraction of the compile time. */
#include "tests/common/tlmd_harness.h"

typedef struct {
    int status; /* exit code, or -1 when it did not exit normally */
    char *out, *err;
} run_result;

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *p = NULL;
    size_t len = 0;
    char chunk[65536];
    size_t k;
    while ((k = fread(chunk, 1, sizeof chunk, f)) > 0) {
        p = realloc(p, len + k + 1);
        memcpy(p + len, chunk, k);
        len += k;
    }
    fclose(f);
    if (!p) p = calloc(1, 1);
    p[len] = 0;
    if (n) *n = len;
    return p;
}

/* Runs tlmc with args (NULL-terminated) and env "K=V" pairs (NULL-terminated or NULL). */
static run_result tlmc(const tlmd *d, const char *const *env, const char *const *args)
{
    const char *bin = getenv("TLMC_BIN");
    if (!bin || !bin[0]) bin = "build/san/tlmc";
    char outp[400], errp[400];
    snprintf(outp, sizeof outp, "%s/tlmc.out", d->dir);
    snprintf(errp, sizeof errp, "%s/tlmc.err", d->dir);
    const char *argv[40] = {bin};
    int n = 1;
    for (int i = 0; args[i] && n < 39; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, 1);
        dup2(e, 2);
        unsetenv("TLMC_SERVER");
        unsetenv("TLMC_TOKEN");
        for (int i = 0; env && env[i]; i++)
            putenv((char *)env[i]);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    double t0 = tlm_now_s();
    while (waitpid(pid, &st, WNOHANG) != pid) {
        if (tlm_now_s() - t0 > 300) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            cr_assert_fail("tlmc did not finish within 300 s");
        }
        usleep(20000);
    }
    run_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, slurp(outp, NULL), slurp(errp, NULL)};
    cr_assert(r.status != 127, "cannot run %s", bin);
    return r;
}

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
}

static const char *server_url(const tlmd *d, char *out, size_t cap)
{
    snprintf(out, cap, "http://127.0.0.1:%d", d->port);
    return out;
}

static void sha256_file(const char *path, char hex[65], size_t *size)
{
    size_t n = 0;
    char *p = slurp(path, &n);
    cr_assert(p, "missing %s", path);
    cr_assert_eq(tlm_sha256_hex(p, n, hex), 0);
    *size = n;
    free(p);
}

/* Checks DIR/manifest.json against the files; returns the number of cache hits. */
static int check_manifest(const char *dir, int want_kernels, const char *want_ext)
{
    char path[600];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    cr_assert(m, "manifest: %s", je.text);
    json_t *ks = json_object_get(m, "kernels");
    cr_assert_eq((int)json_array_size(ks), want_kernels);
    int hits = 0;
    json_int_t launches = 0;
    for (size_t i = 0; i < json_array_size(ks); i++) {
        json_t *k = json_array_get(ks, i);
        cr_assert_eq(json_integer_value(json_object_get(k, "index")), (json_int_t)i);
        const char *bin = json_string_value(json_object_get(k, "binary"));
        const char *src = json_string_value(json_object_get(k, "source"));
        const char *meta = json_string_value(json_object_get(k, "meta"));
        cr_assert(bin && src && meta);
        char stem[32];
        snprintf(stem, sizeof stem, "%03d_", (int)i);
        cr_assert(!strncmp(bin, stem, 4), "%s", bin);
        cr_assert(strstr(bin, want_ext), "%s", bin);
        cr_assert(json_is_object(json_object_get(k, "launch")));
        cr_assert(json_string_value(json_object_get(k, "entry")));
        json_int_t occ = json_integer_value(json_object_get(k, "occurrences"));
        cr_assert(occ >= 1);
        launches += occ;
        /* the binary on disk is the one the server vouched for */
        char hex[65];
        size_t size;
        snprintf(path, sizeof path, "%s/%s", dir, bin);
        sha256_file(path, hex, &size);
        cr_assert_str_eq(hex, json_string_value(json_object_get(k, "binary_sha256")));
        cr_assert_eq((json_int_t)size, json_integer_value(json_object_get(k, "binary_size")));
        snprintf(path, sizeof path, "%s/%s", dir, src);
        char *s = slurp(path, NULL);
        cr_assert(s && strlen(s) > 50, "source %s", path);
        free(s);
        snprintf(path, sizeof path, "%s/%s", dir, meta);
        json_t *mj = json_load_file(path, 0, &je);
        cr_assert(mj, "meta %s: %s", path, je.text);
        cr_assert_str_eq(json_string_value(json_object_get(mj, "key")),
                         json_string_value(json_object_get(k, "key")));
        cr_assert_eq(json_integer_value(json_object_get(mj, "occurrences")), occ);
        json_decref(mj);
        if (!strcmp(json_string_value(json_object_get(k, "cache")), "hit")) hits++;
    }
    json_t *model = json_object_get(m, "model");
    if (json_is_object(model))
        cr_assert_eq(json_integer_value(json_object_get(model, "launches")), launches);
    json_decref(m);
    return hits;
}

Test(tlmc, model_to_dir_then_all_cache_hits)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char url[64], dir[400];
    server_url(&d, url, sizeof url);
    snprintf(dir, sizeof dir, "%s/out/resnet50", d.dir);
    const char *args[] = {"--server",     url,  "compile",  "--model", "resnet50", "--batch", "1",
                          "--image-size", "32", "--target", "cpu",     "-o",       dir,       NULL};
    run_result r = tlmc(&d, NULL, args);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    /* not a terminal: one plain progress line per kernel */
    cr_assert(strstr(r.err, "kernel 27/27"), "%s", r.err);
    cr_assert(strstr(r.out, "resnet50 -> cpu: 27 kernels (56 launches), 0 hits, 27 misses"), "%s",
              r.out);
    run_free(&r);
    cr_assert_eq(check_manifest(dir, 27, ".so"), 0);
    /* again, into a fresh directory: every kernel is a cache hit, nothing is compiled */
    json_int_t compiles = cache_stat(&d, "compiles");
    snprintf(dir, sizeof dir, "%s/out/again", d.dir);
    r = tlmc(&d, NULL, args);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "27 hits, 0 misses"), "%s", r.out);
    run_free(&r);
    cr_assert_eq(check_manifest(dir, 27, ".so"), 27);
    cr_assert_eq(cache_stat(&d, "compiles"), compiles);
    teardown(&d);
}

static const char graph_doc[] =
    "{\"name\":\"tiny-mlp\",\"inputs\":[{\"name\":\"x\",\"shape\":[4,32]},"
    "{\"name\":\"w1\",\"shape\":[32,32]},{\"name\":\"w2\",\"shape\":[32,32]}],"
    "\"nodes\":[{\"name\":\"fc1\",\"op\":\"dense\",\"inputs\":[\"x\",\"w1\"]},"
    "{\"name\":\"a1\",\"op\":\"gelu\",\"inputs\":[\"fc1\"]},"
    "{\"name\":\"fc2\",\"op\":\"dense\",\"inputs\":[\"a1\",\"w2\"]},"
    "{\"name\":\"a2\",\"op\":\"gelu\",\"inputs\":[\"fc2\"]}]}";

Test(tlmc, graph_stream_get_stats_health_token_and_exit_codes)
{
    tlmd d;
    setup_dir(&d);
    char tok[400];
    snprintf(tok, sizeof tok, "%s/tokens", d.dir);
    FILE *f = fopen(tok, "w");
    fputs("tlmc-secret\n", f);
    fclose(f);
    const char *extra[] = {"--token-file", tok, NULL};
    start(&d, extra);
    char url[64], env_server[100], gpath[400], dir[400];
    server_url(&d, url, sizeof url);
    snprintf(env_server, sizeof env_server, "TLMC_SERVER=%s", url);
    snprintf(gpath, sizeof gpath, "%s/graph.json", d.dir);
    f = fopen(gpath, "w");
    fputs(graph_doc, f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/g", d.dir);
    const char *env[] = {env_server, "TLMC_TOKEN=tlmc-secret", NULL};

    /* a graph for CUDA, events copied to stdout */
    const char *a1[] = {"compile", "--graph", gpath,      "--target", "cuda:sm_90",
                        "-o",      dir,       "--stream", NULL};
    run_result r = tlmc(&d, env, a1);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    int lines = 0, kernels = 0;
    for (char *l = r.out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        lines++;
        kernels += !strncmp(l, "{\"event\":\"kernel\"", 17);
    }
    cr_assert_eq(kernels, 1, "%s", r.out); /* fc1+gelu and fc2+gelu are one workload */
    cr_assert_eq(lines, 3, "%s", r.out);   /* accepted, kernel, done */
    run_free(&r);
    cr_assert_eq(check_manifest(dir, 1, ".cubin"), 0);
    char mpath[500];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    json_t *m = json_load_file(mpath, 0, NULL);
    json_t *k0 = json_array_get(json_object_get(m, "kernels"), 0);
    cr_assert_eq(json_integer_value(json_object_get(k0, "occurrences")), 2);
    cr_assert_str_eq(json_string_value(json_object_get(k0, "node")), "fc1");
    cr_assert(json_object_get(json_object_get(k0, "launch"), "grid"));
    char key[65];
    snprintf(key, sizeof key, "%s", json_string_value(json_object_get(k0, "key")));
    json_decref(m);

    /* get KEY -o FILE: the same bytes as the manifest's binary */
    char kpath[500], bpath[500];
    snprintf(kpath, sizeof kpath, "%s/k.cubin", d.dir);
    snprintf(bpath, sizeof bpath, "%s/000_dense.cubin", dir);
    const char *a2[] = {"get", key, "-o", kpath, NULL};
    r = tlmc(&d, env, a2);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    run_free(&r);
    char h1[65], h2[65];
    size_t s1, s2;
    sha256_file(kpath, h1, &s1);
    sha256_file(bpath, h2, &s2);
    cr_assert_str_eq(h1, h2);

    /* an inline workload, without -o: keys on stdout */
    const char *a3[] = {
        "compile",  "--workload", "{\"op\":\"softmax\",\"shape\":{\"R\":16,\"C\":64}}",
        "--target", "cpu",        NULL};
    r = tlmc(&d, env, a3);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.out, "workloads -> cpu: 1 kernels"), "%s", r.out);
    run_free(&r);

    const char *a4[] = {"stats", NULL};
    r = tlmc(&d, env, a4);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    json_t *st = json_loads(r.out, 0, NULL);
    cr_assert(st, "%s", r.out);
    cr_assert_eq(json_integer_value(json_object_get(st, "kernels")), 2);
    json_decref(st);
    run_free(&r);

    const char *a5[] = {"health", NULL};
    r = tlmc(&d, env, a5);
    cr_assert_eq(r.status, 0, "%s %s", r.out, r.err);
    cr_assert(strstr(r.out, "healthy, ready"));
    run_free(&r);

    /* exit 2: a bad graph (the server names the field), a refused token, bad usage */
    const char *env_notoken[] = {env_server, NULL};
    const char *bad_graph =
        "{\"inputs\":[{\"name\":\"x\",\"shape\":[4,8]}],"
        "\"nodes\":[{\"name\":\"y\",\"op\":\"dense\",\"inputs\":[\"x\",\"w\"]}]}";
    f = fopen(gpath, "w");
    fputs(bad_graph, f);
    fclose(f);
    const char *a6[] = {"compile", "--graph", gpath, "--target", "cpu", NULL};
    r = tlmc(&d, env, a6);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "graph.nodes[0].inputs[1]"), "%s", r.err);
    run_free(&r);
    r = tlmc(&d, env_notoken, a3);
    cr_assert_eq(r.status, 2, "%s", r.err);
    cr_assert(strstr(r.err, "401"), "%s", r.err);
    run_free(&r);
    const char *a7[] = {"compile", "--model", "resnet50", "--target",
                        "cpu",     "--batch", "zero",     NULL};
    r = tlmc(&d, env, a7);
    cr_assert_eq(r.status, 2);
    run_free(&r);
    const char *a8[] = {"frobnicate", NULL};
    r = tlmc(&d, env, a8);
    cr_assert_eq(r.status, 2);
    run_free(&r);

    /* exit 1: nobody listens there (--server wins over TLMC_SERVER) */
    int dead = free_port();
    char dead_url[64];
    snprintf(dead_url, sizeof dead_url, "127.0.0.1:%d", dead);
    const char *a9[] = {"--server", dead_url, "health", NULL};
    r = tlmc(&d, env, a9);
    cr_assert_eq(r.status, 1, "%s", r.err);
    run_free(&r);
    teardown(&d);
}

Test(tlmc, tune_a_graph_with_one_budget)
{
    tlmd d;
    setup_dir(&d);
    start(&d, NULL);
    char url[64], gpath[400], dir[400];
    server_url(&d, url, sizeof url);
    snprintf(gpath, sizeof gpath, "%s/graph.json", d.dir);
    FILE *f = fopen(gpath, "w");
    fputs(graph_doc, f);
    fclose(f);
    snprintf(dir, sizeof dir, "%s/tuned", d.dir);
    const char *args[] = {"--server", url,      "compile", "--graph", gpath,   "--target", "cpu",
                          "--mode",   "tune",   "--trials", "10",     "-o",    dir,        NULL};
    run_result r = tlmc(&d, NULL, args);
    cr_assert_eq(r.status, 0, "stderr: %s", r.err);
    cr_assert(strstr(r.err, "tune kernel 0: "), "progress lines: %s", r.err);
    run_free(&r);
    char path[600];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    json_error_t je;
    json_t *m = json_load_file(path, 0, &je);
    cr_assert(m, "%s", je.text);
    json_t *ks = json_object_get(m, "kernels");
    cr_assert_geq(json_array_size(ks), 1);
    for (size_t i = 0; i < json_array_size(ks); i++)
        cr_assert_str_eq(
            json_string_value(json_object_get(json_array_get(ks, i), "schedule_source")), "tuned");
    json_decref(m);
    /* the budget flags go with --mode tune only */
    const char *bad[] = {"--server", url, "compile", "--graph", gpath, "--target", "cpu",
                         "--trials", "10", NULL};
    r = tlmc(&d, NULL, bad);
    cr_assert_eq(r.status, 2);
    cr_assert(strstr(r.err, "--mode tune"), "%s", r.err);
    run_free(&r);
    teardown(&d);
}
