/* test_tlm_compile.c — drives the real `tlm` binary (TLM_BIN, default build/san/tlm):
 * `tlm space` and `tlm compile` (schedules, files written, meta.json, measurement, CUDA
 * cubins, exit statuses). Results are cross-checked against the library in process. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "compiler/ir/ir.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/toolchain/toolchain.h"
#include "compiler/util/util.h"
#include "proto/workload.h"

#include "tests/common/run_tool.h"

static void setup(void)
{
    tool_dir_make("/tmp/tlm-compile-XXXXXX");
}

TestSuite(tlm_space, .init = setup, .fini = tool_dir_fini, .timeout = 120);
TestSuite(tlm_compile, .init = setup, .fini = tool_dir_fini, .timeout = 120);

/* Bad input: exit 2, nothing on stdout, one line on stderr containing must_contain. */
static void expect_one_line_error(const run_result *r, int status, const char *must_contain)
{
    cr_expect_eq(r->status, status, "exit %d, stderr: %s", r->status, r->err);
    cr_expect_str_empty(r->out, "stdout not empty: %s", r->out);
    cr_expect_eq(count_lines(r->err), 1, "stderr is not one line: [%s]", r->err);
    cr_expect(strncmp(r->err, "tlm: ", 5) == 0, "stderr lacks the tlm: prefix: %s", r->err);
    if (must_contain)
        cr_expect(strstr(r->err, must_contain) != NULL, "stderr [%s] lacks [%s]", r->err,
                  must_contain);
    cr_expect_null(strstr(r->err, "runtime error"), "sanitizer report: %s", r->err);
    cr_expect_null(strstr(r->err, "AddressSanitizer"), "sanitizer report: %s", r->err);
}

static json_t *parse_json(const char *text)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    cr_assert_not_null(j, "not JSON (%s at %d:%d): %s", je.text, je.line, je.column, text);
    return j;
}

static json_t *load_json_file(const char *path)
{
    char *t = slurp(path);
    json_t *j = parse_json(t);
    free(t);
    return j;
}

static const char *jstr(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    cr_assert_not_null(s, "\"%s\" is not a string in %s", key, json_dumps(o, JSON_COMPACT));
    return s;
}

/* The workload and space built in process, to check the tool's answers against. */
typedef struct {
    ir_workload w;
    ir_subgraph *g;
    space *sp;
    target t;
} ref;

static ref make_ref(const char *wl, const char *tg)
{
    ref r;
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &r.w, &err), 0, "%s", err.msg);
    cr_assert_eq(target_parse(tg, &r.t, &err), 0, "%s", err.msg);
    r.g = calloc(1, sizeof *r.g);
    r.sp = calloc(1, sizeof *r.sp);
    cr_assert(r.g && r.sp);
    cr_assert_eq(ir_subgraph_build(&r.w, r.g, &err), 0, "%s", err.msg);
    cr_assert_eq(space_build(r.g, &r.t, r.sp, &err), 0, "%s", err.msg);
    return r;
}

static void free_ref(ref *r)
{
    free(r->g);
    free(r->sp);
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void sha256_file(const char *path, char hex[65], size_t *size)
{
    size_t n;
    char *data = slurp_len(path, &n);
    cr_assert_eq(tlm_sha256_hex(data, n, hex), 0);
    *size = n;
    free(data);
}

static bool has_elf_magic(const char *path)
{
    size_t n;
    char *d = slurp_len(path, &n);
    static const char magic[4] = {0x7f, 'E', 'L', 'F'};
    bool ok = n > 4 && !memcmp(d, magic, 4);
    free(d);
    return ok;
}

#define DENSE                                                                                      \
    "{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":48,\"K\":32},\"epilogue\":[\"bias_add\"]}"

/* The host target and its defaults do not change when OpenMP binds its threads (OMP_PLACES
 * and OMP_PROC_BIND, as the README advises for timing and deployment): libgomp binds the
 * initial thread to the first place at start-up, and the cores were read from that thread's
 * affinity mask, so a 2-CPU host compiled as 1 core (single-threaded defaults) under another
 * target hash. The same hash and default with and without, and with places alone. */
Test(tlm_space, host_target_is_the_same_with_threads_bound)
{
    static const char *const wl = "{\"op\":\"dense\",\"shape\":{\"M\":1,\"N\":32,\"K\":8}}";
    run_result plain = RUN("space", "--workload", wl, "--target", "cpu");
    cr_assert_eq(plain.status, 0, "exit %d: %s", plain.status, plain.err);
    json_t *a = parse_json(plain.out);
    static const char *const env[][2] = {{"OMP_PLACES", "threads"}, {"OMP_PROC_BIND", "close"}};
    for (int k = 0; k < 2; k++) {
        setenv(env[k][0], env[k][1], 1);
        run_result r = RUN("space", "--workload", wl, "--target", "cpu");
        cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
        json_t *b = parse_json(r.out);
        cr_expect_str_eq(jstr(b, "target_hash"), jstr(a, "target_hash"), "with %s", env[k][0]);
        cr_expect_str_eq(jstr(b, "default"), jstr(a, "default"), "with %s", env[k][0]);
        json_decref(b);
        free(r.out);
        free(r.err);
    }
    json_decref(a);
    free(plain.out);
    free(plain.err);
}

/* The OpenMP threads `tlm compile --measure` timed its kernel on (meta.json "threads") */
static int measured_threads(const char *sub)
{
    char out[128], meta[256];
    snprintf(out, sizeof out, "%s/%s", tool_dir, sub);
    run_result r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--measure", "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s\n%s", r.status, r.err, r.out);
    snprintf(meta, sizeof meta, "%s/meta.json", out);
    json_t *m = load_json_file(meta);
    json_t *t = json_object_get(m, "threads");
    cr_assert(json_is_integer(t), "meta.json has no \"threads\"");
    const int n = (int)json_integer_value(t);
    json_decref(m);
    free(r.out);
    free(r.err);
    return n;
}

/* A kernel is timed on every CPU OpenMP may use, its threads bound or not: where OMP_PLACES or
 * OMP_PROC_BIND is set, libgomp binds the initial thread (and the threads started from it) to
 * the first place at start-up, and the measure runner, spawned from such a thread, inherited
 * that one CPU: under the README's bound settings every kernel was timed on one thread and the
 * search chose for one core. As many threads as the caller's CPUs with and without the
 * settings; under the caller's own narrower mask (taskset) and no settings, that mask's. */
Test(tlm_compile, measured_on_every_place_with_threads_bound)
{
    cpu_set_t mask;
    cr_assert_eq(sched_getaffinity(0, sizeof mask, &mask), 0);
    const int cpus = CPU_COUNT(&mask);
    cr_expect_eq(measured_threads("t0"), cpus, "unbound");
    static const char *const env[][2] = {{"OMP_PLACES", "threads"}, {"OMP_PROC_BIND", "close"}};
    for (int k = 0; k < 2; k++) {
        setenv(env[k][0], env[k][1], 1);
        cr_expect_eq(measured_threads("t1"), cpus, "with %s%s", k ? "OMP_PLACES and " : "",
                     env[k][0]);
    }
    unsetenv("OMP_PLACES");
    cr_expect_eq(measured_threads("t2"), cpus, "with OMP_PROC_BIND alone");
    unsetenv("OMP_PROC_BIND");
    cpu_set_t one;
    CPU_ZERO(&one);
    int first = 0;
    while (!CPU_ISSET(first, &mask))
        first++;
    CPU_SET(first, &one);
    cr_assert_eq(sched_setaffinity(0, sizeof one, &one), 0);
    cr_expect_eq(measured_threads("t3"), 1, "under a one-CPU mask");
    cr_assert_eq(sched_setaffinity(0, sizeof mask, &mask), 0);
}

/* ---- tlm space ---- */

Test(tlm_space, prints_slots_size_default_and_samples)
{
    run_result r =
        RUN("space", "--workload", DENSE, "--target", "cpu", "--sample", "6", "--seed", "3");
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    cr_expect_str_empty(r.err);
    json_t *j = parse_json(r.out);
    ref f = make_ref(DENSE, "cpu");

    char whex[IR_HASH_HEX], thex[TARGET_HASH_HEX];
    cr_assert_eq(ir_workload_hash_hex(&f.w, whex), 0);
    cr_assert_eq(target_hash_hex(&f.t, thex), 0);
    cr_expect_str_eq(jstr(j, "workload_hash"), whex);
    cr_expect_str_eq(jstr(j, "target"), "cpu");
    cr_expect_str_eq(jstr(j, "target_hash"), thex);
    cr_expect_str_eq(jstr(j, "sketch"), space_sketch_name(f.sp->sketch));

    json_t *slots = json_object_get(j, "slots");
    cr_assert_eq(json_array_size(slots), (size_t)f.sp->n_slot);
    for (int i = 0; i < f.sp->n_slot; i++) {
        json_t *s = json_array_get(slots, (size_t)i);
        cr_expect_str_eq(jstr(s, "name"), f.sp->slot[i].name);
        const char *kind = jstr(s, "kind");
        if (f.sp->slot[i].kind == SLOT_TILE) {
            cr_expect_str_eq(kind, "tile");
            cr_expect_eq(json_integer_value(json_object_get(s, "level")), f.sp->slot[i].level);
        } else {
            cr_expect_str_eq(kind, f.sp->slot[i].name); /* CPU_TILE's other slots: kind = name */
        }
    }

    int exact = 0;
    double l = space_log10_size(f.sp, &exact);
    cr_expect(fabs(json_real_value(json_object_get(j, "log10_size")) - l) < 1e-9);
    cr_expect_eq(json_is_true(json_object_get(j, "size_exact")), exact == 1);

    space_sched s;
    char text[4096];
    space_default(f.sp, &s);
    space_print(f.sp, &s, text, sizeof text);
    cr_expect_str_eq(jstr(j, "default"), text);

    json_t *samples = json_object_get(j, "samples");
    cr_assert_eq(json_array_size(samples), 6);
    int distinct = 0;
    for (size_t i = 0; i < 6; i++) {
        const char *t = json_string_value(json_array_get(samples, i));
        cr_assert_not_null(t);
        tlm_error err;
        tlm_err_clear(&err);
        cr_expect_eq(space_parse(f.sp, t, &s, &err), 0, "sample [%s]: %s: %s", t, err.field,
                     err.msg);
        distinct += i == 0 || strcmp(t, json_string_value(json_array_get(samples, i - 1))) != 0;
    }
    cr_expect_gt(distinct, 1, "samples are all the same");

    /* the same seed gives the same samples, another seed other ones */
    run_result r2 =
        RUN("space", "--workload", DENSE, "--target", "cpu", "--sample", "6", "--seed", "3");
    run_result r3 =
        RUN("space", "--workload", DENSE, "--target", "cpu", "--sample", "6", "--seed", "4");
    json_t *j2 = parse_json(r2.out), *j3 = parse_json(r3.out);
    cr_expect(json_equal(samples, json_object_get(j2, "samples")), "not deterministic");
    cr_expect(!json_equal(samples, json_object_get(j3, "samples")), "seed ignored");
    json_decref(j);
    json_decref(j2);
    json_decref(j3);
    free_result(&r);
    free_result(&r2);
    free_result(&r3);
    free_ref(&f);
}

Test(tlm_space, gpu_rows_sketch_and_no_samples_by_default)
{
    const char *wl = "{\"op\":\"softmax\",\"shape\":{\"R\":64,\"C\":128}}";
    run_result r = RUN("space", "--workload", wl, "--target", "cuda:sm_80");
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    json_t *j = parse_json(r.out);
    cr_expect_str_eq(jstr(j, "sketch"), "gpu_rows");
    cr_expect_str_eq(jstr(j, "target"), "cuda:sm_80");
    cr_expect_eq(json_array_size(json_object_get(j, "samples")), 0);
    json_t *slots = json_object_get(j, "slots");
    bool threads = false;
    for (size_t i = 0; i < json_array_size(slots); i++)
        threads |= !strcmp(jstr(json_array_get(slots, i), "kind"), "threads");
    cr_expect(threads, "no threads slot: %s", r.out);
    json_decref(j);
    free_result(&r);
}

Test(tlm_space, bad_input_exits_2_naming_the_field)
{
    run_result r = RUN("space", "--workload", DENSE, "--target", "tpu:v5");
    expect_one_line_error(&r, 2, "tlm: target: ");
    free_result(&r);
    r = RUN("space", "--workload", "{\"op\":\"dense\",\"shape\":{\"M\":0,\"N\":4,\"K\":4}}",
            "--target", "cpu");
    expect_one_line_error(&r, 2, "tlm: shape.M: ");
    free_result(&r);
    r = RUN("space", "--workload", DENSE, "--target", "cpu", "--sample", "many");
    expect_one_line_error(&r, 2, "--sample");
    free_result(&r);
    r = RUN("space", "--workload", DENSE, "--target", "cpu", "--sample", "-3");
    expect_one_line_error(&r, 2, "--sample");
    free_result(&r);
    r = RUN("space", "--workload", DENSE, "--target", "cpu", "--seed", "1x");
    expect_one_line_error(&r, 2, "--seed");
    free_result(&r);
    r = RUN("space", "--workload", DENSE);
    expect_one_line_error(&r, 2, "--target");
    free_result(&r);
    r = RUN("space", "--target", "cpu");
    expect_one_line_error(&r, 2, "--workload");
    free_result(&r);
    r = RUN("space", "--workload",
            "{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8},\"dtype\":\"bfloat16\"}",
            "--target", "cpu");
    expect_one_line_error(&r, 2, "tlm: dtype: ");
    free_result(&r);
}

/* ---- tlm compile ---- */

static void path_in(char *buf, size_t cap, const char *sub, const char *file)
{
    snprintf(buf, cap, "%s/%s/%s", tool_dir, sub, file);
}

Test(tlm_compile, measure_on_cpu_writes_everything_and_is_ok)
{
    char out[128];
    snprintf(out, sizeof out, "%s/a/b", tool_dir); /* nested: created as needed */
    run_result r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--measure", "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s\n%s", r.status, r.err, r.out);
    cr_expect_str_empty(r.err);
    ref f = make_ref(DENSE, "cpu");

    char src[256], so[256], meta[256];
    path_in(src, sizeof src, "a/b", "kernel.c");
    path_in(so, sizeof so, "a/b", "kernel.so");
    path_in(meta, sizeof meta, "a/b", "meta.json");
    cr_assert(file_exists(src) && file_exists(so) && file_exists(meta));
    cr_expect(has_elf_magic(so));
    char *source = slurp(src);
    cr_expect_not_null(strstr(source, "tlm_kernel_packed"), "%s", source);
    free(source);

    json_t *sum = parse_json(r.out);
    cr_expect_str_eq(jstr(sum, "status"), "ok");
    cr_expect_str_eq(jstr(sum, "source"), src);
    cr_expect_str_eq(jstr(sum, "binary"), so);
    cr_expect_str_eq(jstr(sum, "meta"), meta);

    json_t *m = load_json_file(meta);
    char whex[IR_HASH_HEX], thex[TARGET_HASH_HEX], canon[1024], bhex[65];
    size_t bsize;
    cr_assert_eq(ir_workload_hash_hex(&f.w, whex), 0);
    cr_assert_eq(target_hash_hex(&f.t, thex), 0);
    cr_assert_gt(ir_workload_canonical(&f.w, canon, sizeof canon), 0);
    sha256_file(so, bhex, &bsize);
    cr_expect_str_eq(jstr(m, "workload_hash"), whex);
    cr_expect_str_eq(jstr(sum, "workload_hash"), whex);
    json_t *cj = parse_json(canon);
    cr_expect(json_equal(json_object_get(m, "workload"), cj), "workload is not canonical");
    json_decref(cj);
    json_t *tj = json_object_get(m, "target");
    cr_expect_str_eq(jstr(tj, "name"), "cpu");
    cr_expect_str_eq(jstr(tj, "hash"), thex);
    cr_expect_str_eq(jstr(m, "sketch"), "cpu_tile");
    space_sched s;
    char text[4096];
    space_default(f.sp, &s);
    space_print(f.sp, &s, text, sizeof text);
    cr_expect_str_eq(jstr(m, "schedule"), text);
    cr_expect_str_eq(jstr(m, "entry"), "tlm_kernel");
    cr_expect_str_eq(jstr(m, "format"), "elf-so");
    cr_expect(json_is_object(json_object_get(m, "launch")));
    cr_expect_eq(json_object_size(json_object_get(m, "launch")), 0);
    cr_expect_str_eq(jstr(m, "binary_sha256"), bhex);
    cr_expect_str_eq(jstr(sum, "binary_sha256"), bhex);
    cr_expect_eq(json_integer_value(json_object_get(m, "binary_size")), (json_int_t)bsize);
    cr_expect_eq(json_integer_value(json_object_get(m, "flops")), ir_subgraph_flops(f.g));
    cr_expect_eq(json_integer_value(json_object_get(m, "bytes")), ir_subgraph_bytes(f.g));
    cr_expect_str_eq(jstr(m, "toolchain"), tc_cc_identity());
    cr_expect(strstr(jstr(m, "compile_flags"), "-O3") != NULL);
    cr_expect_str_eq(jstr(m, "status"), "ok");
    double rel = json_real_value(json_object_get(m, "rel_err"));
    cr_expect(rel >= 0 && rel < 1e-4, "rel_err %g", rel);
    cr_expect_gt(json_real_value(json_object_get(m, "median_s")), 0);
    cr_expect_gt(json_real_value(json_object_get(m, "gflops")), 0);
    cr_expect(json_is_integer(json_object_get(m, "n_samples")));
    json_decref(m);
    json_decref(sum);
    free_result(&r);
    free_ref(&f);
}

/* The schedule of `random:S` is the first sample of `tlm space --seed S`. */
Test(tlm_compile, random_seed_matches_tlm_space_and_is_not_measured_by_default)
{
    run_result sp =
        RUN("space", "--workload", DENSE, "--target", "cpu", "--sample", "1", "--seed", "7");
    cr_assert_eq(sp.status, 0, "%s", sp.err);
    json_t *sj = parse_json(sp.out);
    const char *want = json_string_value(json_array_get(json_object_get(sj, "samples"), 0));
    cr_assert_not_null(want);

    char out[128], meta[256];
    snprintf(out, sizeof out, "%s/r", tool_dir);
    path_in(meta, sizeof meta, "r", "meta.json");
    run_result r =
        RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "random:7", "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    json_t *sum = parse_json(r.out);
    cr_expect_str_eq(jstr(sum, "status"), "compiled");
    cr_expect_str_eq(jstr(sum, "schedule"), want);
    json_t *m = load_json_file(meta);
    cr_expect_str_eq(jstr(m, "schedule"), want);
    cr_expect_null(json_object_get(m, "status"), "not measured, yet meta has a status");
    cr_expect_null(json_object_get(m, "rel_err"));
    json_decref(m);
    json_decref(sum);
    json_decref(sj);
    free_result(&r);
    free_result(&sp);
}

Test(tlm_compile, printed_and_bare_decisions_are_accepted)
{
    ref f = make_ref(DENSE, "cpu");
    space_sched s;
    uint64_t rng = 99;
    space_sample(f.sp, &rng, &s);
    space_sample(f.sp, &rng, &s);
    char text[4096], bare[4096];
    space_print(f.sp, &s, text, sizeof text);
    size_t len = 0;
    for (int i = 0; i < s.n; i++)
        len += (size_t)snprintf(bare + len, sizeof bare - len, "%s%lld", i ? " " : "",
                                (long long)s.v[i]);

    char out[128], meta[256];
    snprintf(out, sizeof out, "%s/p", tool_dir);
    path_in(meta, sizeof meta, "p", "meta.json");
    run_result r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", text,
                       "--measure", "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    json_t *m = load_json_file(meta);
    cr_expect_str_eq(jstr(m, "schedule"), text);
    cr_expect_str_eq(jstr(m, "status"), "ok");
    char sha1[65];
    snprintf(sha1, sizeof sha1, "%s", jstr(m, "binary_sha256"));
    json_decref(m);
    free_result(&r);

    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", bare, "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    m = load_json_file(meta);
    cr_expect_str_eq(jstr(m, "schedule"), text);
    /* the same source compiled twice with the same compiler gives the same binary */
    cr_expect_str_eq(jstr(m, "binary_sha256"), sha1);
    json_decref(m);
    free_result(&r);
    free_ref(&f);
}

Test(tlm_compile, illegal_decisions_exit_2_naming_the_slot)
{
    ref f = make_ref(DENSE, "cpu");
    space_sched s;
    space_default(f.sp, &s);
    char out[128];
    snprintf(out, sizeof out, "%s/bad", tool_dir);

    /* tile.i.3 (slot 1, after vectorize) = 9 neither divides M = 64 nor is on the padding
     * ladder (1..8, powers of two, multiples of the lanes) */
    char text[4096];
    s.v[1] = 9;
    space_print(f.sp, &s, text, sizeof text);
    cr_assert(strstr(text, " tile.i.3=9 ") != NULL, "%s", text);
    run_result r =
        RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", text, "-o", out);
    expect_one_line_error(&r, 2, "tlm: tile.i.3: ");
    free_result(&r);
    cr_expect(!file_exists(out), "an output directory was made for a refused schedule");

    space_default(f.sp, &s);
    for (int i = 0; i < f.sp->n_slot; i++)
        if (f.sp->slot[i].kind == SLOT_UNROLL) s.v[i] = 7;
    space_print(f.sp, &s, text, sizeof text);
    cr_assert_not_null(strstr(text, "unroll=7"), "%s", text);
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", text, "-o", out);
    expect_one_line_error(&r, 2, "tlm: unroll: ");
    free_result(&r);

    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "bogus=1", "-o", out);
    expect_one_line_error(&r, 2, "tlm: bogus: ");
    free_result(&r);
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "random:x", "-o", out);
    expect_one_line_error(&r, 2, "--schedule");
    free_result(&r);
    /* the model's schedule needs a readable weight file (the repository ships one, so name a
     * missing file rather than rely on the default path) */
    char missing[160];
    snprintf(missing, sizeof missing, "%s/missing.bin", tool_dir);
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "tlm", "--weights",
            missing, "-o", out);
    expect_one_line_error(&r, 2, "--weights");
    free_result(&r);
    cr_expect(!file_exists(out));
    free_ref(&f);
}

Test(tlm_compile, cuda_writes_cu_cubin_and_launch)
{
    tlm_error err;
    tlm_err_clear(&err);
    if (tc_nvrtc_available(&err)) cr_skip_test("NVRTC is not available: %s", err.msg);
    char out[128], cu[256], cubin[256], meta[256], csrc[256], so[256];
    snprintf(out, sizeof out, "%s/g", tool_dir);
    path_in(cu, sizeof cu, "g", "kernel.cu");
    path_in(cubin, sizeof cubin, "g", "kernel.cubin");
    path_in(meta, sizeof meta, "g", "meta.json");
    path_in(csrc, sizeof csrc, "g", "kernel.c");
    path_in(so, sizeof so, "g", "kernel.so");

    /* a CPU kernel first: the CUDA run must replace it, not sit next to it */
    run_result r = RUN("compile", "--workload", DENSE, "--target", "cpu", "-o", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    cr_assert(file_exists(so));

    r = RUN("compile", "--workload", DENSE, "--target", "cuda:sm_90", "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    cr_assert(file_exists(cu) && file_exists(cubin) && file_exists(meta));
    cr_expect(!file_exists(csrc) && !file_exists(so), "stale CPU files left in %s", out);
    cr_expect(has_elf_magic(cubin), "kernel.cubin is not an ELF image");
    char *source = slurp(cu);
    cr_expect_not_null(strstr(source, "__global__"), "%s", source);
    free(source);

    json_t *sum = parse_json(r.out);
    cr_expect_str_eq(jstr(sum, "status"), "compiled");
    json_t *m = load_json_file(meta);
    cr_expect_str_eq(jstr(m, "format"), "cubin");
    cr_expect_str_eq(jstr(m, "sketch"), "gpu_tile");
    cr_expect_gt(strlen(jstr(m, "entry")), 0);
    json_t *tj = json_object_get(m, "target");
    cr_expect_str_eq(jstr(tj, "name"), "cuda:sm_90");
    cr_expect_eq(json_integer_value(json_object_get(tj, "sm")), 90);
    json_t *launch = json_object_get(m, "launch");
    int64_t threads = 1;
    for (int i = 0; i < 3; i++) {
        json_t *g = json_array_get(json_object_get(launch, "grid"), (size_t)i);
        json_t *b = json_array_get(json_object_get(launch, "block"), (size_t)i);
        cr_assert(json_is_integer(g) && json_is_integer(b), "launch: %s",
                  json_dumps(launch, JSON_COMPACT));
        cr_expect_geq(json_integer_value(g), 1);
        cr_expect_geq(json_integer_value(b), 1);
        threads *= json_integer_value(b);
    }
    cr_expect_leq(threads, 1024);
    cr_expect(json_is_integer(json_object_get(launch, "smem")));
    char bhex[65];
    size_t bsize;
    sha256_file(cubin, bhex, &bsize);
    cr_expect_str_eq(jstr(m, "binary_sha256"), bhex);
    cr_expect_eq(json_integer_value(json_object_get(m, "binary_size")), (json_int_t)bsize);
    cr_expect_str_eq(jstr(m, "toolchain"), tc_nvrtc_identity());
    json_t *res = json_object_get(m, "resources");
    cr_expect_gt(json_integer_value(json_object_get(res, "registers")), 0);
    cr_expect_null(json_object_get(m, "status"));
    /* the GPU model's prediction, labelled as one (not a measurement: no status) */
    json_t *gm = json_object_get(m, "gpu_model");
    cr_assert_not_null(gm, "meta.json has no gpu_model");
    cr_expect_str_eq(jstr(gm, "kind"), "prediction");
    cr_expect_str_eq(jstr(gm, "id"), "gpu_model/1");
    double gt = json_number_value(json_object_get(gm, "time_s"));
    cr_expect(gt > 0 && isfinite(gt), "time_s %g", gt);
    cr_expect_geq(json_integer_value(json_object_get(gm, "blocks_per_sm")), 1);
    json_decref(m);
    json_decref(sum);
    free_result(&r);

    /* a rows kernel too */
    r = RUN("compile", "--workload", "{\"op\":\"layer_norm\",\"shape\":{\"R\":32,\"C\":256}}",
            "--target", "cuda:sm_80", "-o", out);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    m = load_json_file(meta);
    cr_expect_str_eq(jstr(m, "sketch"), "gpu_rows");
    cr_expect(has_elf_magic(cubin));
    json_decref(m);
    free_result(&r);
}

Test(tlm_compile, measure_needs_a_cpu_target_this_host_runs)
{
    char out[128];
    snprintf(out, sizeof out, "%s/m", tool_dir);
    run_result r =
        RUN("compile", "--workload", DENSE, "--target", "cuda:sm_90", "--measure", "-o", out);
    expect_one_line_error(&r, 2, "--measure");
    free_result(&r);
    cr_expect(!file_exists(out));
}

Test(tlm_compile, compiler_failure_exits_1_and_leaves_no_stale_binary)
{
    char out[128], src[256], so[256], meta[256];
    snprintf(out, sizeof out, "%s/f", tool_dir);
    path_in(src, sizeof src, "f", "kernel.c");
    path_in(so, sizeof so, "f", "kernel.so");
    path_in(meta, sizeof meta, "f", "meta.json");
    run_result r = RUN("compile", "--workload", DENSE, "--target", "cpu", "-o", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    cr_assert(file_exists(so) && file_exists(meta));

    cr_assert_eq(setenv("CC", "/bin/false", 1), 0); /* this test's own process only */
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "random:5", "-o", out);
    cr_expect_eq(r.status, 1, "exit %d: %s", r.status, r.err);
    cr_expect_eq(count_lines(r.err), 1, "[%s]", r.err);
    cr_expect(strncmp(r.err, "tlm: ", 5) == 0, "%s", r.err);
    cr_expect_str_empty(r.out);
    free_result(&r);
    /* the new source stays for inspection; the old binary and meta.json are gone */
    cr_expect(file_exists(src));
    cr_expect(!file_exists(so), "a binary of another schedule is left next to kernel.c");
    cr_expect(!file_exists(meta));
}

Test(tlm_compile, usage_errors)
{
    const char *const *argsets[] = {
        (const char *const[]){"compile", "--target", "cpu", NULL},
        (const char *const[]){"compile", "--workload", DENSE, NULL},
        (const char *const[]){"compile", "--workload", DENSE, "--target", "cpu", "--frob", NULL},
        (const char *const[]){"compile", "--workload", DENSE, "--target", "cpu", "extra", NULL},
        (const char *const[]){"compile", "--workload", DENSE, "--target", "cuda", NULL},
        (const char *const[]){"compile", "--workload", DENSE, "--target", "cpu", "--weights",
                              "w.bin", NULL},
        (const char *const[]){"compile", "--workload", DENSE, "--target", "cpu", "--prior", "2",
                              NULL},
        (const char *const[]){"compile", "--workload", DENSE, "--target", "cpu", "--schedule",
                              "tlm", "--prior", "-3", NULL},
    };
    const char *expect[] = {"--workload", "--target", "--frob", "extra", "target", "--weights",
                            "--prior", "--prior"};
    for (size_t i = 0; i < sizeof argsets / sizeof argsets[0]; i++) {
        run_result r = run_tlm_in(NULL, argsets[i]);
        expect_one_line_error(&r, 2, expect[i]);
        free_result(&r);
    }
    run_result r = RUN("--help");
    cr_expect_eq(r.status, 0);
    cr_expect(strstr(r.out, "space ") && strstr(r.out, "compile "), "%s", r.out);
    free_result(&r);
    r = RUN("compile", "--help");
    cr_expect_eq(r.status, 0);
    cr_expect(strstr(r.out, "random:SEED") != NULL, "%s", r.out);
    free_result(&r);
}

/* Every schedule source goes through the pipeline entry and says so: default, given (random:S
 * and decision lists), tlm, topk:K (measured: every candidate tried, the fastest correct one
 * kept); `tlm generate` prints the model's candidates with their source. */
Test(tlm_compile, schedule_sources_through_the_pipeline)
{
    char model[256], out[256], meta[300];
    path_in(model, sizeof model, "", "m.bin");
    run_result r = RUN("model", "init", "--layers", "1", "--heads", "2", "--dim", "32", "--ctx",
                       "256", "-o", model);
    cr_assert_eq(r.status, 0, "%s", r.err);
    free_result(&r);
    path_in(out, sizeof out, "", "o");
    path_in(meta, sizeof meta, "o", "meta.json");
    static const struct {
        const char *sched, *source;
        bool weights, measure;
    } cases[] = {
        {"default", "default", false, false}, {"random:3", "given", false, false},
        {"tlm", "tlm", true, false},          {"topk:3", "topk", true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[16] = {"compile", "--workload", DENSE, "--target", "cpu", "--schedule",
                                cases[i].sched, "-o", out};
        int n = 9;
        if (cases[i].weights) args[n++] = "--weights", args[n++] = model;
        if (cases[i].measure) args[n++] = "--measure";
        args[n] = NULL;
        r = run_tlm_in(NULL, args);
        cr_assert_eq(r.status, 0, "%s: exit %d: %s", cases[i].sched, r.status, r.err);
        json_t *sum = parse_json(r.out);
        cr_expect_str_eq(jstr(sum, "schedule_source"), cases[i].source, "%s", cases[i].sched);
        json_t *m = load_json_file(meta);
        cr_expect_str_eq(jstr(m, "schedule_source"), cases[i].source, "%s", cases[i].sched);
        if (cases[i].measure) {
            cr_expect_str_eq(jstr(m, "selection"), "measured");
            cr_expect_str_eq(jstr(m, "status"), "ok");
        }
        json_decref(m);
        json_decref(sum);
        free_result(&r);
    }
    /* --prior 100: the model writes the rule of thumb's schedule */
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "-o", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *def = parse_json(r.out);
    free_result(&r);
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "tlm", "--weights",
            model, "--prior", "100", "-o", out);
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *pri = parse_json(r.out);
    cr_expect_str_eq(jstr(pri, "schedule_source"), "tlm");
    cr_expect_str_eq(jstr(pri, "schedule"), jstr(def, "schedule"));
    json_decref(pri);
    json_decref(def);
    free_result(&r);
    r = RUN("generate", "--workload", DENSE, "--target", "cpu", "--weights", model,
            "--candidates", "2");
    cr_assert_eq(r.status, 0, "%s", r.err);
    json_t *g = parse_json(r.out);
    json_t *cands = json_object_get(g, "candidates");
    cr_assert_eq(json_array_size(cands), 2);
    cr_expect_str_eq(jstr(json_array_get(cands, 0), "schedule_source"), "topk");
    cr_expect(strstr(jstr(json_array_get(cands, 0), "sentence"), "[EOS]") != NULL);
    json_decref(g);
    free_result(&r);
    /* topk:K outside 1..64 is bad input naming the flag */
    r = RUN("compile", "--workload", DENSE, "--target", "cpu", "--schedule", "topk:0", "--weights",
            model, "-o", out);
    expect_one_line_error(&r, 2, "--schedule");
    free_result(&r);
}
