/* Tests for the CPU code generator (compiler/codegen/cpu.c), in the style of ggml's
 * test-backend-ops: for every op family, the default schedule and 20 distinct random
 * schedules (fixed seeds) are generated, compiled with the system cc, run in the measure
 * runner and compared with the reference interpreter (rel_err < 1e-4). The naive generator
 * is checked the same way. The test binary is sanitized; the kernels are compiled normally.
 *
 * On a failure the kernel's source is kept as /tmp/tlm-cg-fail-<pid>-<n>.c and the message
 * names the workload and the printed schedule: `tlm compile --workload W --target cpu
 * --schedule "<schedule>" --measure` reproduces it. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "compiler/codegen/codegen.h"
#include "compiler/driver/driver.h"
#include "compiler/ir/ir.h"
#include "compiler/lang/lang.h"
#include "compiler/measure/measure.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "compiler/toolchain/toolchain.h"
#include "proto/workload.h"

#define N_RANDOM 20

static char g_dir[64];
static int g_seq;

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/tlm-cgcpu-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

TestSuite(codegen_cpu, .init = setup, .fini = teardown, .timeout = 240);

static void keep_source(const char *src, char *path, size_t cap)
{
    snprintf(path, cap, "/tmp/tlm-cg-fail-%d-%d.c", (int)getpid(), g_seq);
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(path, cap, "(could not save the source)");
        return;
    }
    fputs(src, f);
    fclose(f);
}

/* Compiles k for target t, runs it on g and expects the reference's output. */
static void check_kernel(const ir_subgraph *g, const target *t, const cg_kernel *k, const char *wl,
                         const char *sched)
{
    char so[128], flags[160], kept[128];
    g_seq++;
    snprintf(so, sizeof so, "%s/k%d.so", g_dir, g_seq);
    snprintf(flags, sizeof flags, "-O2 %s", target_cc_flags(t));
    tlm_error err;
    tlm_err_clear(&err);
    int rc = tc_cc_compile(k->source, flags, so, NULL, &err);
    if (rc) {
        keep_source(k->source, kept, sizeof kept);
        cr_assert_fail("%s on %s, schedule [%s]: cc failed: %s (source: %s)", wl, t->name, sched,
                       err.msg, kept);
    }
    measure_opts o;
    measure_opts_init(&o);
    o.check_only = true;
    o.check_prepacked = true; /* and its prepack entries, when it has any */
    o.seed = 20240 + (uint64_t)g_seq;
    o.timeout_s = 60;
    measure_result res;
    rc = measure_cpu(g, so, k->entry, &o, &res, &err);
    cr_assert_eq(rc, 0, "%s: measure_cpu: %s", wl, err.msg);
    if (res.status != MEASURE_OK || !(res.rel_err < 1e-4)) {
        keep_source(k->source, kept, sizeof kept);
        cr_assert_fail("%s on %s, schedule [%s]: %s, rel_err %g, %s (source: %s)", wl, t->name,
                       sched, measure_status_name(res.status), res.rel_err, res.detail, kept);
    }
    unlink(so);
}

typedef struct {
    ir_subgraph *g;
    space *sp;
    target t;
} built;

static built build(const char *wl, const char *tg)
{
    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &w, &err), 0, "%s: %s: %s", wl,
                 err.field, err.msg);
    built b = {calloc(1, sizeof(ir_subgraph)), calloc(1, sizeof(space)), {0}};
    cr_assert(b.g && b.sp);
    cr_assert_eq(target_parse(tg, &b.t, &err), 0, "%s", err.msg);
    cr_assert_eq(ir_subgraph_build(&w, b.g, &err), 0, "%s: %s", wl, err.msg);
    cr_assert_eq(space_build(b.g, &b.t, b.sp, &err), 0, "%s: %s: %s", wl, err.field, err.msg);
    return b;
}

static void built_free(built *b)
{
    free(b->g);
    free(b->sp);
}

static int g_padded; /* schedules checked whose tiles pad some axis */

/* Kernels already compiled and checked in this test (Criterion runs each test in its own
 * process): a second schedule whose source comes out identical for the same workload and
 * compiler flags (a parallel slot on a one-task nest, the same rows kernel on a target with
 * a smaller L3 where nothing streams) is the same binary on the same inputs, checked once. */
#define MAX_SEEN_KERNELS 4096
static uint64_t g_seen[MAX_SEEN_KERNELS];
static int g_n_seen, g_n_repeated;

static uint64_t fnv1a(uint64_t h, const char *s)
{
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return (h ^ 0xff) * 0x100000001b3ull; /* a separator between the parts */
}

/* True the first time (workload, flags, source) comes up; false for a repeat. */
static bool first_time(const char *wl, const target *t, const char *src)
{
    uint64_t h = fnv1a(fnv1a(fnv1a(0xcbf29ce484222325ull, wl), target_cc_flags(t)), src);
    for (int i = 0; i < g_n_seen; i++)
        if (g_seen[i] == h) {
            g_n_repeated++;
            return false;
        }
    if (g_n_seen < MAX_SEEN_KERNELS) g_seen[g_n_seen++] = h;
    return true;
}

static void check_schedule(const built *b, const space_sched *s, const char *wl)
{
    if (b->sp->sketch == SKETCH_CPU_TILE || b->sp->sketch == SKETCH_CPU_WINDOW)
        for (int x = 0; x < b->sp->n_spatial; x++)
            if (space_padded_extent(b->sp, s, x) != b->g->stage[b->g->anchor].extent[x]) {
                g_padded++;
                break;
            }
    char text[4096];
    space_print(b->sp, s, text, sizeof text);
    tlm_error err;
    tlm_err_clear(&err);
    cg_kernel k;
    int rc = cg_generate(b->sp, s, NULL, &k, &err);
    cr_assert_eq(rc, 0, "%s, schedule [%s]: cg_generate: %s: %s", wl, text, err.field, err.msg);
    cr_assert_not_null(k.source);
    cr_assert(!k.cuda);
    cr_assert_str_eq(k.entry, "tlm_kernel");
    if (first_time(wl, &b->t, k.source)) check_kernel(b->g, &b->t, &k, wl, text);
    cg_kernel_free(&k);
}

/* n random schedules of b's space from seed, each checked (check_schedule) */
static void check_samples(const built *b, const char *wl, uint64_t seed, int n)
{
    space_sched s;
    for (int k = 0; k < n; k++) {
        space_sample(b->sp, &seed, &s);
        check_schedule(b, &s, wl);
    }
}

/* The default, then n_random distinct sampled schedules (fixed seeds), then the naive
 * generator. */
static void check_family(const char *wl, const char *tg, int n_random)
{
    built b = build(wl, tg);
    space_sched s;
    space_default(b.sp, &s);
    check_schedule(&b, &s, wl);

    space_sched *seen = calloc((size_t)n_random + 1, sizeof *seen);
    cr_assert_not_null(seen);
    seen[0] = s;
    int n_seen = 1;
    uint64_t rng = 0xC0DE6E4ull;
    for (int tries = 0; n_seen < n_random + 1 && tries < 40 * n_random; tries++) {
        space_sample(b.sp, &rng, &s);
        bool dup = false;
        for (int i = 0; i < n_seen && !dup; i++)
            dup = !memcmp(seen[i].v, s.v, sizeof(int64_t) * (size_t)s.n);
        if (dup) continue;
        seen[n_seen++] = s;
        check_schedule(&b, &s, wl);
    }
    /* every family's space has at least n_random + 1 schedules at these shapes */
    cr_expect_eq(n_seen, n_random + 1, "%s: only %d distinct schedules", wl, n_seen);
    free(seen);

    tlm_error err;
    tlm_err_clear(&err);
    cg_kernel k;
    cr_assert_eq(cg_generate_naive_c(b.g, "tlm_naive", &k, &err), 0, "%s: naive: %s", wl, err.msg);
    cr_assert_str_eq(k.entry, "tlm_naive");
    check_kernel(b.g, &b.t, &k, wl, "naive");
    cg_kernel_free(&k);
    built_free(&b);
}

#define FAMILY(name, wl)                                                                           \
    Test(codegen_cpu, name)                                                                        \
    {                                                                                              \
        check_family(wl, "cpu", N_RANDOM);                                                         \
    }

/* Small shapes (a few hundred to a few thousand outputs) with extents that are not powers of
 * two, so that tiles, vector widths and padding meet ragged cases. */
FAMILY(dense, "{\"op\":\"dense\",\"shape\":{\"M\":48,\"N\":40,\"K\":24}}")
FAMILY(dense_transpose_a,
       "{\"op\":\"dense\",\"shape\":{\"M\":48,\"N\":40,\"K\":24},\"transpose_a\":true}")
FAMILY(dense_transpose_b,
       "{\"op\":\"dense\",\"shape\":{\"M\":48,\"N\":40,\"K\":24},\"transpose_b\":true}")
FAMILY(dense_transpose_ab, "{\"op\":\"dense\",\"shape\":{\"M\":48,\"N\":40,\"K\":24},"
                           "\"transpose_a\":true,\"transpose_b\":true}")
FAMILY(batch_matmul, "{\"op\":\"batch_matmul\",\"shape\":{\"B\":3,\"M\":16,\"N\":24,\"K\":12}}")
FAMILY(batch_matmul_transposed,
       "{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":12,\"N\":20,\"K\":16},"
       "\"transpose_a\":true,\"transpose_b\":true}")
FAMILY(conv2d_nchw_stride2_bias_relu,
       "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":6,\"H\":15,\"W\":15,\"F\":16,\"KH\":3,"
       "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}")
FAMILY(conv2d_nhwc_stride2_dilation_groups_bias_relu,
       "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":8,\"H\":13,\"W\":13,\"F\":12,\"KH\":3,"
       "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"dilation\":[2,2],\"groups\":2,"
       "\"layout\":\"NHWC\",\"epilogue\":[\"bias_add\",\"relu\"]}")
FAMILY(conv2d_nchw_groups_dilation,
       "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":6,\"H\":12,\"W\":10,\"F\":9,\"KH\":3,"
       "\"KW\":2},\"pad\":[2,1],\"dilation\":[2,1],\"groups\":3}")
FAMILY(conv2d_nhwc_1x1, "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":7,\"W\":7,\"F\":24,"
                        "\"KH\":1,\"KW\":1},\"layout\":\"NHWC\",\"epilogue\":[\"add\"]}")
FAMILY(depthwise_nchw, "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":12,\"H\":14,\"W\":14,"
                       "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],"
                       "\"epilogue\":[\"bias_add\",\"relu6\"]}")
FAMILY(depthwise_nhwc, "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":16,\"H\":9,\"W\":9,"
                       "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"dilation\":[2,2],\"layout\":\"NHWC\"}")
FAMILY(max_pool_nchw,
       "{\"op\":\"max_pool2d\",\"shape\":{\"N\":2,\"C\":6,\"H\":15,\"W\":15,\"KH\":3,"
       "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}")
FAMILY(max_pool_nhwc, "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":24,\"H\":12,\"W\":12,"
                      "\"KH\":2,\"KW\":2},\"layout\":\"NHWC\"}")
FAMILY(avg_pool_nchw,
       "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":14,\"W\":14,\"KH\":2,"
       "\"KW\":2}}")
FAMILY(avg_pool_nhwc, "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":2,\"C\":12,\"H\":11,\"W\":11,"
                      "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"layout\":\"NHWC\"}")
FAMILY(global_avg_pool_nchw,
       "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":4,\"C\":24,\"H\":7,\"W\":7}}")
FAMILY(global_avg_pool_nhwc, "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":4,\"C\":24,\"H\":7,"
                             "\"W\":7},\"layout\":\"NHWC\"}")
FAMILY(softmax, "{\"op\":\"softmax\",\"shape\":{\"R\":24,\"C\":100}}")
FAMILY(layer_norm, "{\"op\":\"layer_norm\",\"shape\":{\"R\":24,\"C\":96}}")
FAMILY(layer_norm_add_relu, "{\"op\":\"layer_norm\",\"shape\":{\"R\":12,\"C\":40},"
                            "\"epilogue\":[\"add\",\"relu\"]}")
FAMILY(rms_norm, "{\"op\":\"rms_norm\",\"shape\":{\"R\":24,\"C\":96},\"eps\":1e-6}")
FAMILY(reduce_sum, "{\"op\":\"reduce_sum\",\"shape\":{\"R\":36,\"C\":70}}")
FAMILY(reduce_mean, "{\"op\":\"reduce_mean\",\"shape\":{\"R\":36,\"C\":70}}")
FAMILY(reduce_max, "{\"op\":\"reduce_max\",\"shape\":{\"R\":36,\"C\":70}}")
FAMILY(elementwise_chain_a, "{\"op\":\"elementwise\",\"shape\":{\"N\":1000},"
                            "\"epilogue\":[\"add\",\"gelu\",\"mul\",\"silu\"]}")
FAMILY(elementwise_chain_b,
       "{\"op\":\"elementwise\",\"shape\":{\"N\":1536},"
       "\"epilogue\":[\"sigmoid\",\"tanh\",\"bias_add\",\"relu6\",\"mul\",\"relu\"]}")
FAMILY(transpose, "{\"op\":\"transpose\",\"shape\":{\"R\":24,\"C\":40}}")
FAMILY(dense_bias_gelu, "{\"op\":\"dense\",\"shape\":{\"M\":32,\"N\":48,\"K\":20},"
                        "\"epilogue\":[\"bias_add\",\"gelu\"]}")
FAMILY(dense_residual_add, "{\"op\":\"dense\",\"shape\":{\"M\":20,\"N\":64,\"K\":36},"
                           "\"epilogue\":[\"add\"]}")
FAMILY(batch_matmul_residual_add,
       "{\"op\":\"batch_matmul\",\"shape\":{\"B\":3,\"M\":10,\"N\":40,\"K\":24},"
       "\"epilogue\":[\"add\",\"relu\"]}")

/* Odd extents (primes, 1, lanes +- 1): tiles that do not divide the extent pad, bounded tile
 * loops and clamped edge register tiles meet every family; both ISAs (AVX2 code runs on
 * AVX-512 hosts), the default plus random schedules. */
#define N_ODD 8
#define ODD(name, wl)                                                                              \
    Test(codegen_cpu, odd_##name)                                                                  \
    {                                                                                              \
        g_padded = 0;                                                                              \
        check_family(wl, "cpu", N_ODD);                                                            \
        check_family(wl, "cpu:avx2", N_ODD);                                                       \
        cr_expect_gt(g_padded, 0, "no schedule of %s padded a tile", wl);                          \
    }

ODD(dense_prime, "{\"op\":\"dense\",\"shape\":{\"M\":17,\"N\":33,\"K\":7}}")
ODD(dense_m1, "{\"op\":\"dense\",\"shape\":{\"M\":1,\"N\":31,\"K\":13}}")
ODD(dense_bias_gelu_prime, "{\"op\":\"dense\",\"shape\":{\"M\":13,\"N\":47,\"K\":9},"
                           "\"epilogue\":[\"bias_add\",\"gelu\"]}")
ODD(batch_matmul_transposed, "{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":7,\"N\":9,"
                             "\"K\":5},\"transpose_a\":true,\"transpose_b\":true}")
ODD(conv2d_stem_nchw, "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":11,\"W\":13,"
                      "\"F\":5,\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],"
                      "\"epilogue\":[\"bias_add\",\"relu\"]}")
ODD(conv2d_nhwc, "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":5,\"H\":7,\"W\":9,\"F\":7,"
                 "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"layout\":\"NHWC\"}")
/* a pointwise conv: its 7 x 9 positions one axis (ir/build.c), across two images */
ODD(conv2d_pointwise_nchw, "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":5,\"H\":7,\"W\":9,"
                           "\"F\":11,\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\",\"add\"]}")
ODD(depthwise_5x5, "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":7,\"H\":9,\"W\":11,"
                   "\"KH\":5,\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu6\"]}")
ODD(max_pool, "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":9,\"W\":9,\"KH\":3,"
              "\"KW\":3},\"stride\":[2,2]}")
ODD(depthwise_5x5_stride2, "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":3,\"H\":13,"
                           "\"W\":13,\"KH\":5,\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],"
                           "\"epilogue\":[\"bias_add\",\"relu\"]}")
ODD(max_pool_5x5_sppf, "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":11,\"W\":11,"
                       "\"KH\":5,\"KW\":5},\"stride\":[1,1],\"pad\":[2,2]}")
ODD(avg_pool_stride2, "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":2,\"C\":2,\"H\":15,\"W\":15,"
                      "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}")
/* output rows wider than 32 points: the rule of thumb's one-row register tiles */
ODD(avg_pool_stride2_wide, "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":7,\"W\":67,"
                           "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}")
ODD(max_pool_2x2_wide, "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":5,\"W\":71,"
                       "\"KH\":2,\"KW\":2},\"stride\":[2,2]}")
ODD(elementwise_prime, "{\"op\":\"elementwise\",\"shape\":{\"N\":1009},"
                       "\"epilogue\":[\"add\",\"relu\"]}")
ODD(transpose, "{\"op\":\"transpose\",\"shape\":{\"R\":17,\"C\":31}}")
/* a transpose whose register tiles move as 8 x 8 blocks transposed in registers, and edge
 * tasks (67 = 4 x 16 + 3 rows, 45 = 2 x 16 + 13 columns) point by point */
ODD(transpose_blocks, "{\"op\":\"transpose\",\"shape\":{\"R\":67,\"C\":45}}")

/* Reduction chunks that do not divide the extent (a prime K gets 16 and 32 besides 1 and K):
 * the last chunk is shorter, in the register tile's loop and in the packing loops. From the
 * default, every non-dividing value of each reduction slot, with packing on and off where
 * legal and the later slots kept when still legal; both ISAs; GEMMs (plain, transposed, a
 * batched Bt) and NCHW/NHWC convs whose channel reduction is prime. */
static int check_chunks(const char *wl, const char *tg, int *packed)
{
    built b = build(wl, tg);
    space_sched def;
    space_default(b.sp, &def);
    int64_t vals[SPACE_MAX_VALUES], later[SPACE_MAX_VALUES];
    int checked = 0;
    for (int i = 0; i < b.sp->n_slot; i++) {
        const space_slot *sl = &b.sp->slot[i];
        if (sl->kind != SLOT_TILE || sl->axis < b.sp->n_spatial) continue;
        int64_t e = b.g->stage[b.g->anchor].extent[sl->axis];
        int n = space_legal_values(b.sp, i, &def, vals);
        for (int k = 0; k < n; k++) {
            if (e % vals[k] == 0) continue;
            for (int pack = 0; pack < 2; pack++) {
                space_sched s = def;
                s.v[i] = vals[k];
                bool ok = true;
                for (int j = i + 1; j < b.sp->n_slot && ok; j++) {
                    int nl = space_legal_values(b.sp, j, &s, later);
                    int64_t want = b.sp->slot[j].kind == SLOT_PACK ? pack : def.v[j];
                    int64_t pick = nl > 0 ? later[0] : -1;
                    for (int q = 0; q < nl; q++)
                        if (later[q] == want) pick = want;
                    if (b.sp->slot[j].kind == SLOT_PACK && pick != pack) ok = false;
                    s.v[j] = pick;
                }
                if (!ok) continue;
                check_schedule(&b, &s, wl);
                checked++;
                *packed += pack;
            }
        }
    }
    built_free(&b);
    return checked;
}

Test(codegen_cpu, reduction_chunks_need_not_divide)
{
    static const char *const wls[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":13,\"N\":35,\"K\":37},"
        "\"epilogue\":[\"bias_add\",\"gelu\"]}",
        "{\"op\":\"dense\",\"shape\":{\"M\":9,\"N\":40,\"K\":41},\"transpose_a\":true}",
        "{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":5,\"N\":19,\"K\":67},"
        "\"transpose_b\":true}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":19,\"H\":7,\"W\":9,\"F\":16,"
        "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":23,\"H\":5,\"W\":5,\"F\":12,"
        "\"KH\":1,\"KW\":1},\"layout\":\"NHWC\"}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    int packed = 0;
    for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++)
        for (size_t t = 0; t < 2; t++) {
            int n = check_chunks(wls[w], tgs[t], &packed);
            cr_expect_geq(n, 2, "%s on %s: %d schedules with a short last chunk", wls[w], tgs[t],
                          n);
        }
    cr_expect_gt(packed, 0, "no packed schedule had a short last chunk");
}

/* CPU_WINDOW (depthwise / pools in NCHW: packed planes in stride phases, row-reusing register
 * tiles): output widths of lanes - 1, lanes, lanes + 1 on each ISA (7/8/9 and 15/16/17), a
 * single point, stride 2 and 3, dilation, -inf padding of a max pool, every schedule of a
 * small space checked against the reference on both targets. */
static void check_window_all(const char *wl, const char *tg)
{
    built b = build(wl, tg);
    cr_assert_eq(b.sp->sketch, SKETCH_CPU_WINDOW, "%s: sketch %s", wl,
                 space_sketch_name(b.sp->sketch));
    int64_t vals[SPACE_MAX_VALUES];
    space_sched s;
    memset(&s, 0, sizeof s);
    s.n = b.sp->n_slot;
    /* scalar code, vectors along OW and (where offered) along channels x every column count
     * (along channels, where the columns run to the register budget: 1, 2, the middle and the
     * two widest) x the fewest and the most rows (parallel alternating) */
    int nv = space_legal_values(b.sp, 0, &s, vals), checked = 0;
    for (int i = 0; i < nv; i++) {
        s.v[0] = vals[i];
        int64_t cv[SPACE_MAX_VALUES];
        int nc = space_legal_values(b.sp, 1, &s, cv);
        bool ch = vals[i] == WINDOW_VEC_CHANNELS;
        for (int ci = 0; ci < nc; ci++) {
            if (ch && ci > 1 && ci != nc / 2 && ci < nc - 2) continue;
            s.v[1] = cv[ci];
            int64_t rv[SPACE_MAX_VALUES];
            int nr = space_legal_values(b.sp, 2, &s, rv);
            for (int ri = 0; ri<nr; ri += nr> 1 ? nr - 1 : 1) { /* fewest, most rows */
                s.v[2] = rv[ri];
                s.v[3] = (ci + ri) % 2;
                check_schedule(&b, &s, wl);
                checked++;
            }
        }
    }
    cr_expect_geq(checked, 2, "%s on %s", wl, tg);
    built_free(&b);
}

static const char *const window_wls[] = {
    /* OW = 7, 8, 9 / 15, 16, 17 (stride 1, pad 1, 3x3) */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":3,\"W\":7,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":5,\"W\":9,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":1,\"H\":4,\"W\":17,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu6\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":3,\"W\":15,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1]}",
    /* stride 2, dilation 2, 7x7 taps, a 1x1 plane, stride 3 without padding */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":2,\"H\":11,\"W\":23,\"KH\":3,"
    "\"KW\":3},\"stride\":[2,2],\"pad\":[2,2],\"dilation\":[2,2]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":9,\"W\":10,\"KH\":7,"
    "\"KW\":7},\"pad\":[3,3],\"epilogue\":[\"bias_add\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":1,\"W\":1,\"KH\":1,"
    "\"KW\":1}}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":16,\"W\":17,\"KH\":3,"
    "\"KW\":3},\"stride\":[3,3]}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":9,\"W\":33,\"KH\":3,"
    "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":7,\"W\":31,\"KH\":2,"
    "\"KW\":2}}",
    /* 5x5 stride 2 (three FMA chains per input row: two accumulator sets); rows wide enough
     * for the packs' whole vectors and overlapping last one (each phase 16 < 23 columns) */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":7,\"W\":45,\"KH\":5,"
    "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":5,\"W\":41,\"KH\":3,"
    "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
    /* separable pools (each input row feeds three output rows or more) */
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":9,\"W\":21,\"KH\":5,"
    "\"KW\":5},\"stride\":[1,1],\"pad\":[2,2]}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":6,\"W\":19,\"KH\":3,"
    "\"KW\":3},\"stride\":[1,1],\"pad\":[1,1]}",
    /* a residual add reads along the columns (the write-back stays on the real points); a
     * 14-wide row under one AVX-512 vector (its store masked) */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":6,\"W\":30,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":14,\"W\":14,\"KH\":5,"
    "\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"silu\"]}",
    /* along channels: 20 channels (two blocks and a short one of 8 lanes, one and a short
     * one of 16), two images, input rows packed by transposes (19 >= 16 columns), output rows
     * of 19 in blocks whose last overlaps the one before it, a residual add through them; a
     * 16-channel 3x3 stride-2 avg pool, its 9-column rows transposed whole under 16 lanes */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":20,\"H\":6,\"W\":19,\"KH\":5,"
    "\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":9,\"W\":17,\"KH\":3,"
    "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
    /* along channels, a 3x3's 9 taps: on AVX2 its weights transposed in two blocks of 8 taps,
     * the second overlapping the first; under 16 lanes one by one; 11 channels (a short
     * block) */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":11,\"H\":5,\"W\":10,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
    /* along channels, fewer blocks than a whole number a core (3 of 8 lanes, 2 of 16 on 2
     * cores): tasks of bands of tile rows, each packing the input rows its windows read */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":24,\"H\":15,\"W\":17,\"KH\":5,"
    "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
    /* along channels, rows narrower than the vector: the plane packed by transposes of
     * points in memory order (a block spans rows, the last overlapping the one before it),
     * the output kept whole and stored the same way, through a residual add (7 x 7, 20
     * channels, two images); a stride-2 plane whose last column no window reads (8 columns, 7
     * packed); a 3 x 3 plane (9 points: under 16 lanes point by point, under 8 by
     * transposes); a max pool at 7 x 7, stride 2; 8 channels in one block on 2 cores: bands
     * of rows, packed by transposes where a band has a vector's worth of points */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":20,\"H\":7,\"W\":7,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":9,\"W\":8,\"KH\":3,"
    "\"KW\":3},\"stride\":[2,2],\"epilogue\":[\"bias_add\"]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":5,\"H\":3,\"W\":3,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"silu\"]}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":7,\"W\":7,\"KH\":3,"
    "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":11,\"W\":5,\"KH\":3,"
    "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
    /* 1 x 1 windows of stride 1 without padding (a squeeze-and-excitation scale): each plane
     * one loop over its points, a residual add read along the plane; a 1 x 1 max pool */
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":3,\"H\":5,\"W\":7,\"KH\":1,"
    "\"KW\":1},\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":3,\"W\":17,\"KH\":1,"
    "\"KW\":1}}",
};

#define N_WINDOW_WLS (sizeof window_wls / sizeof window_wls[0])

/* Window tiles whose input rows each feed fewer than four FMA chains (5x5 stride 2, one
 * vector column) alternate their sums between two accumulator sets; 7x7 stride 1 (seven
 * chains) and max pooling keep one. Pools whose input rows each feed three output rows or
 * more combine each row's taps once (separable); a 3x3 stride-2 pool does not. Defaults of
 * the named AVX-512 target (a host's may differ: Zen 5 weighs its depthwise columns; the
 * values are checked by the window_sketch tests above). Source only: nothing runs. */
static bool source_has(const built *b, const space_sched *s, const char *needle);

Test(codegen_cpu, window_sums_split_or_separable)
{
    static const struct {
        const char *wl;
        bool split;
    } cases[] = {
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":72,\"H\":56,\"W\":56,\"KH\":5,"
         "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
         true},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":56,\"W\":56,\"KH\":7,"
         "\"KW\":7},\"pad\":[3,3],\"epilogue\":[\"bias_add\"]}",
         false},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":112,\"W\":112,\"KH\":3,"
         "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
         false},
    };
    static const struct {
        const char *wl;
        bool sep;
    } pools[] = {
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":20,\"W\":20,\"KH\":5,"
         "\"KW\":5},\"stride\":[1,1],\"pad\":[2,2]}",
         true},
        {"{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":56,\"W\":56,\"KH\":3,"
         "\"KW\":3},\"stride\":[1,1],\"pad\":[1,1]}",
         true},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":112,\"W\":112,\"KH\":3,"
         "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
         false},
    };
    for (size_t i = 0; i < sizeof pools / sizeof pools[0]; i++) {
        built b = build(pools[i].wl, "cpu:avx512");
        space_sched s;
        space_default(b.sp, &s);
        bool has = source_has(&b, &s, "x0_0 = tlm_v_max(x0_0, x1_0);") ||
                   source_has(&b, &s, "x0_0 = x0_0 + x1_0;");
        cr_expect_eq(has, pools[i].sep, "%s: separable %d", pools[i].wl, has);
        built_free(&b);
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(cases[i].wl, "cpu:avx512");
        space_sched s;
        space_default(b.sp, &s);
        /* one vector column, as the default takes for 5x5 stride 2 on AVX-512 */
        bool one_col = space_window_lanes(b.sp, &s, b.sp->n_slot) == space_tile(b.sp, &s, 3, 3);
        bool has = source_has(&b, &s, "b0_0 += ");
        if (cases[i].split)
            cr_expect(one_col && has, "%s: one column %d, split %d", cases[i].wl, one_col, has);
        else
            cr_expect(!has, "%s: split", cases[i].wl);
        built_free(&b);
    }
}

/* Along channels, blocks that do not come out even on the cores are cut into bands of tile
 * rows, each task packing the input rows its windows read: MobileNetV3's 72 channels (9
 * blocks of 8) on 2 cores in 2 bands (18 tasks); 96 (12 blocks) and one core stay whole.
 * Source only: the kernels are checked in window_sketch_odd_widths_strides_* */
Test(codegen_cpu, window_channel_blocks_band_their_rows)
{
    static const struct {
        int64_t c;
        int cores;
        const char *tasks;
    } cases[] = {
        {72, 2, "task < 18; task++"}, {96, 2, "task < 12; task++"}, {72, 1, "task < 9; task++"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[200];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":%lld,\"H\":56,"
                 "\"W\":56,\"KH\":5,\"KW\":5},\"stride\":[2,2],\"pad\":[2,2]}",
                 (long long)cases[i].c);
        built b = build(wl, "cpu:avx2");
        b.t.cpu.cores = b.sp->tgt.cpu.cores = cases[i].cores;
        space_sched s;
        tlm_error err;
        tlm_err_clear(&err);
        cr_assert_eq(
            space_parse(b.sp, "vectorize=2 tile.ow.3=14 tile.oh.3=1 parallel=1", &s, &err), 0,
            "%s", err.msg);
        cr_expect(source_has(&b, &s, cases[i].tasks), "case %zu: no '%s'", i, cases[i].tasks);
        cr_expect_eq(source_has(&b, &s, "ih = ih_lo; ih < ih_hi"), i == 0, "case %zu", i);
        built_free(&b);
    }
}

/* Along channels, a block's weights go from (channel, tap) to (tap, channel) by register
 * transposes of as many taps as lanes, the last block overlapping the one before it, where
 * the window has that many taps (7x7 on AVX2 and AVX-512, 3x3 on AVX2); a 3x3 under 16 lanes
 * copies them one by one. Source only: the kernels are checked in
 * window_sketch_odd_widths_strides_* (20 channels 5x5, 11 channels 3x3) */
Test(codegen_cpu, window_channel_weights_transposed_by_blocks)
{
    static const struct {
        const char *tg;
        int kh;
        const char *want;
    } cases[] = {
        {"cpu:avx2", 7, "*(tlm_vf *)&Wp[(t + k) * 8] = r[k];"},
        {"cpu:avx512", 7, "*(tlm_vf *)&Wp[(t + k) * 16] = r[k];"},
        {"cpu:avx2", 3, "*(tlm_vf *)&Wp[(t + k) * 8] = r[k];"},
        {"cpu:avx512", 3, "Wp[t * 16 + k] = Wt["},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[200];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":384,\"H\":14,"
                 "\"W\":14,\"KH\":%d,\"KW\":%d},\"pad\":[%d,%d]}",
                 cases[i].kh, cases[i].kh, cases[i].kh / 2, cases[i].kh / 2);
        built b = build(wl, cases[i].tg);
        space_sched s;
        tlm_error err;
        tlm_err_clear(&err);
        cr_assert_eq(space_parse(b.sp, "vectorize=2 tile.ow.3=7 tile.oh.3=1 parallel=1", &s, &err),
                     0, "%s", err.msg);
        cr_expect(source_has(&b, &s, cases[i].want), "case %zu: no '%s'", i, cases[i].want);
        built_free(&b);
    }
}

/* Along channels, a plane whose rows are narrower than the vector is packed by L x L
 * transposes of L points in memory order, each point's vector stored at its row and column
 * (7-wide rows on both ISAs, 14-wide on AVX-512), and, kept whole, goes back to NCHW the same
 * way, L points of a channel through the epilogue at once; rows of a vector or more (14 on
 * AVX2) keep their row-by-row transposes. Bands of rows (8 channels on 2 cores) pack their
 * points by transposes where the band holds a vector's worth. Source only: the kernels are
 * checked in window_sketch_odd_widths_strides_* */
Test(codegen_cpu, window_channel_narrow_rows_transposed_in_memory_order)
{
    static const struct {
        const char *tg;
        int hw, c;
        bool flat;
        const char *pack, *out;
    } cases[] = {
        {"cpu:avx512", 7, 384, true, "r[k] = *(const tlm_vfu *)&xp[(cb * 16 + k) * 49 + q];",
         "for (int64_t qq = q; qq < q + 16; qq++) {"},
        {"cpu:avx2", 7, 384, true, "r[k] = *(const tlm_vfu *)&xp[(cb * 8 + k) * 49 + q];",
         "for (int64_t qq = q; qq < q + 8; qq++) {"},
        {"cpu:avx512", 14, 384, true, "r[k] = *(const tlm_vfu *)&xp[(cb * 16 + k) * 196 + q];",
         "for (int64_t qq = q; qq < q + 16; qq++) {"},
        {"cpu:avx2", 14, 384, false, "r[k] = *(const tlm_vfu *)&xp[(cb * 8 + k) * 196 + q];",
         "qq < q + 8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[200];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":%d,\"H\":%d,"
                 "\"W\":%d,\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
                 cases[i].c, cases[i].hw, cases[i].hw);
        built b = build(wl, cases[i].tg);
        space_sched s;
        space_default_vectorized(b.sp, WINDOW_VEC_CHANNELS, &s);
        cr_assert_eq(space_get(b.sp, &s, SLOT_VECTORIZE, -1), WINDOW_VEC_CHANNELS, "case %zu", i);
        cr_expect_eq(source_has(&b, &s, cases[i].pack), cases[i].flat, "case %zu: pack", i);
        cr_expect_eq(source_has(&b, &s, cases[i].out), cases[i].flat, "case %zu: epilogue", i);
        built_free(&b);
    }
    built b = build(window_wls[N_WINDOW_WLS - 3], "cpu:avx512"); /* 8 channels, 11 x 5 */
    cr_assert(strstr(window_wls[N_WINDOW_WLS - 3], "\"C\":8,\"H\":11") != NULL);
    b.t.cpu.cores = b.sp->tgt.cpu.cores = 2;
    space_sched s;
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(space_parse(b.sp, "vectorize=2 tile.ow.3=5 tile.oh.3=1 parallel=1", &s, &err), 0,
                 "%s", err.msg);
    cr_expect(source_has(&b, &s, "if (q_hi - q_lo >= 16) {"), "bands: no transposed pack");
    cr_expect(source_has(&b, &s, "for (int64_t ih = ih_lo; ih < ih_hi; ih++) {"),
              "bands: no point-by-point fallback");
    built_free(&b);
}

/* A 1 x 1 window of stride 1 without padding (EfficientNet's squeeze-and-excitation scale, a
 * 1 x 1 depthwise conv) runs along OW on both ISAs as one loop over each plane's points: no
 * plane pack, no register tiles; a padded 1 x 1 keeps them. Source only: the kernels are
 * checked in window_sketch_odd_widths_strides_* */
Test(codegen_cpu, window_pointwise_planes_in_one_loop)
{
    static const struct {
        const char *tg;
        int c, hw, pad;
        bool flat;
    } cases[] = {
        {"cpu:avx512", 32, 112, 0, true},  {"cpu:avx2", 672, 14, 0, true},
        {"cpu:avx512", 1152, 7, 0, true},  {"cpu:avx2", 1152, 7, 0, true},
        {"cpu:avx512", 32, 112, 1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[220], loop[80];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":%d,\"H\":%d,"
                 "\"W\":%d,\"KH\":1,\"KW\":1},\"pad\":[%d,%d]}",
                 cases[i].c, cases[i].hw, cases[i].hw, cases[i].pad, cases[i].pad);
        snprintf(loop, sizeof loop, "for (int64_t q = 0; q < %d; q++) {",
                 (cases[i].hw + 2 * cases[i].pad) * (cases[i].hw + 2 * cases[i].pad));
        built b = build(wl, cases[i].tg);
        space_sched s;
        space_default(b.sp, &s);
        cr_expect_eq(space_get(b.sp, &s, SLOT_VECTORIZE, -1), 1, "case %zu", i);
        cr_expect_eq(source_has(&b, &s, loop), cases[i].flat, "case %zu: '%s'", i, loop);
        cr_expect_eq(source_has(&b, &s, "float Qb["), !cases[i].flat, "case %zu: plane pack", i);
        built_free(&b);
    }
}

/* A stride-2 plane pack splits each pair of loaded vectors into the two phases: one
 * two-source shuffle each on AVX-512, tlm_deint2 (in-lane shuffles and 64-bit permutes) on
 * AVX2; the kernels themselves are checked in window_sketch_odd_widths_strides_* */
Test(codegen_cpu, window_stride2_pack_splits_vectors)
{
    const char *wl = window_wls[10]; /* 5x5 stride 2, 45 columns */
    cr_assert(strstr(wl, "\"W\":45") != NULL);
    const char *tgt[] = {"cpu:avx512", "cpu:avx2"};
    const char *want[] = {"__builtin_shuffle(v0, v1", "tlm_deint2(&xr["};
    for (int t = 0; t < 2; t++) {
        built b = build(wl, tgt[t]);
        space_sched s;
        space_default_vectorized(b.sp, 1, &s); /* along OW (AVX2's default is along channels) */
        cr_expect(source_has(&b, &s, want[t]), "%s: no %s", tgt[t], want[t]);
        cr_expect(!source_has(&b, &s, want[1 - t]), "%s: %s", tgt[t], want[1 - t]);
        built_free(&b);
    }
}

/* On AVX-512 the write-back of a window row of at most two vectors goes through a barrier
 * (GCC otherwise forwards the accumulators into the epilogue and spills the tile) and, where
 * the epilogue reads nothing along the columns, stores whole vectors, the last one masked; a
 * residual add keeps the loop over the real points, and long rows and AVX2 keep GCC's way. The kernels themselves are checked against
 * the reference by the odd-width tests (the "cpu" target of an AVX-512 host takes this path). */
Test(codegen_cpu, window_writeback_whole_vectors_on_avx512)
{
    static const struct {
        const char *wl, *tg;
        bool barrier, vectors, masked;
    } cases[] = {
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":72,\"H\":56,\"W\":56,\"KH\":5,"
         "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
         "cpu:avx512", true, true, true}, /* 28 columns: one vector and 12 masked lanes */
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":14,\"W\":14,\"KH\":5,"
         "\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"silu\"]}",
         "cpu:avx512", true, false, true}, /* 14 columns: masked only */
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":64,\"W\":64,\"KH\":3,"
         "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
         "cpu:avx512", true, true, false}, /* 32 columns: whole vectors */
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":6,\"W\":30,\"KH\":3,"
         "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
         "cpu:avx512", false, false, false},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":144,\"H\":56,\"W\":56,\"KH\":3,"
         "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu6\"]}",
         "cpu:avx512", false, false, false}, /* 56 columns: a long row */
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":72,\"H\":56,\"W\":56,\"KH\":5,"
         "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
         "cpu:avx2", false, false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(cases[i].wl, cases[i].tg);
        cr_assert_eq(b.sp->sketch, SKETCH_CPU_WINDOW);
        space_sched s;
        space_default(b.sp, &s);
        cr_expect_eq(source_has(&b, &s, "__asm__ volatile(\"\" : \"+m\"(rowbuf));"),
                     cases[i].barrier, "case %zu: barrier", i);
        cr_expect_eq(source_has(&b, &s, "*(tlm_vfu *)&o[k] = *(const tlm_vf *)&rowbuf["),
                     cases[i].vectors, "case %zu: whole vectors", i);
        cr_expect_eq(source_has(&b, &s, "tlm_vstore_part(&o["), cases[i].masked,
                     "case %zu: masked last vector", i);
        built_free(&b);
    }
}

/* Vector registers' traffic with the stack in a kernel built as the pipeline builds it
 * (drv_build: the target's flags, -O3): FMAs that take an operand from the stack (a spilled
 * accumulator or weight reloaded) and stores of zmm registers to it, counted in the binary's
 * `objdump -d`. */
static void zmm_stack_traffic(const built *b, const space_sched *s, int *fma_mem, int *stores)
{
    tlm_error err;
    drv_artifact a;
    cr_assert_eq(drv_build(b->sp, s, &a, &err), 0, "drv_build: %s", err.msg);
    char so[128], cmd[256], line[512];
    snprintf(so, sizeof so, "%s/regs%d.so", g_dir, g_seq++);
    FILE *f = fopen(so, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(a.binary, 1, a.binary_size, f), a.binary_size);
    fclose(f);
    drv_artifact_free(&a);
    snprintf(cmd, sizeof cmd, "objdump -d --no-show-raw-insn '%s'", so);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    *fma_mem = *stores = 0;
    int lines = 0;
    while (fgets(line, sizeof line, p)) {
        lines++;
        const char *m = strstr(line, "(%rsp)") ? strstr(line, "(%rsp)") : strstr(line, "(%rbp)");
        const char *z = strstr(line, "%zmm");
        if (!m || !z) continue;
        if (strstr(line, "vfmadd") || strstr(line, "vfnmadd")) (*fma_mem)++;
        else if ((strstr(line, "vmovaps") || strstr(line, "vmovups")) && z < m) (*stores)++;
    }
    cr_assert_eq(pclose(p), 0, "objdump failed");
    cr_assert_gt(lines, 20, "objdump printed %d lines", lines);
}

/* The AVX-512 rule of thumb's register tiles stay in registers (GCC 12, as CI builds them):
 * no FMA reloads a spilled value, and a window kernel stores only its accumulators to the
 * row buffer and the epilogue's vectors back (2 x rows x vectors). Before the window
 * write-back's barrier MobileNetV3's 5x5 stride 2 + ReLU had 136 FMAs on the stack and 88
 * stores; ResNet-50's 3x3 at 7 x 7 under 7 x 4 filter tiles 11 and 17. The window tiles are
 * given (those a Zen 5 host's rule takes: the named target, without a host, takes narrower
 * ones), the others are the rule's. */
Test(codegen_cpu, avx512_default_tiles_keep_their_registers)
{
    static const struct {
        const char *wl, *sched;
    } cases[] = {
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":72,\"H\":56,\"W\":56,\"KH\":5,"
         "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
         "vectorize=1 tile.ow.3=32 tile.oh.3=4 parallel=1"},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":120,\"H\":28,\"W\":28,\"KH\":5,"
         "\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}",
         "vectorize=1 tile.ow.3=32 tile.oh.3=4 parallel=1"},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":192,\"H\":28,\"W\":28,\"KH\":7,"
         "\"KW\":7},\"pad\":[3,3],\"epilogue\":[\"bias_add\"]}",
         "vectorize=1 tile.ow.3=32 tile.oh.3=3 parallel=1"},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":480,\"H\":14,\"W\":14,\"KH\":5,"
         "\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"silu\"]}",
         "vectorize=1 tile.ow.3=16 tile.oh.3=7 parallel=1"},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":512,\"H\":7,\"W\":7,\"F\":512,\"KH\":3,"
         "\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
         NULL},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":512,\"H\":14,\"W\":14,\"F\":512,\"KH\":3,"
         "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
         NULL},
        {"{\"op\":\"dense\",\"shape\":{\"M\":197,\"N\":3072,\"K\":768},\"epilogue\":[\"bias_add\","
         "\"gelu\"]}",
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *wl = cases[i].wl;
        built b = build(wl, "cpu:avx512");
        space_sched s;
        tlm_error err;
        if (cases[i].sched)
            cr_assert_eq(space_parse(b.sp, cases[i].sched, &s, &err), 0, "%s", err.msg);
        else
            space_default(b.sp, &s);
        int fma_mem, stores;
        zmm_stack_traffic(&b, &s, &fma_mem, &stores);
        int64_t acc = 1;
        if (b.sp->sketch == SKETCH_CPU_WINDOW)
            acc = space_tile(b.sp, &s, 2, 3) * (space_tile(b.sp, &s, 3, 3) / 16);
        char text[1024];
        space_print(b.sp, &s, text, sizeof text);
        cr_expect_eq(fma_mem, 0, "%s [%s]: %d FMAs read the stack", wl, text, fma_mem);
        if (b.sp->sketch == SKETCH_CPU_WINDOW)
            cr_expect_leq(stores, 2 * acc, "%s [%s]: %d zmm stores to the stack", wl, text,
                          stores);
        built_free(&b);
    }
}

/* An output row of 77 (CLIP's tokens) or 100 columns in 16 lanes: 32, 48 and 64 pad it past
 * 15 %, so the AVX-512 rule of thumb takes it whole, 5 or 7 vectors under 4 or 3 register
 * rows (space.c pick_vec_row), not one vector under 8 rows whose broadcasts each feed one
 * FMA. The accumulators stay in registers (no FMA reads the stack), and the kernel agrees
 * with the reference where this host runs AVX-512 code (compiled only elsewhere). */
Test(codegen_cpu, whole_output_rows_of_five_to_seven_vectors)
{
    static const struct {
        const char *wl;
        int64_t cols, rows;
    } cases[] = {
        {"{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":37,\"N\":77,\"K\":40},"
         "\"transpose_b\":true}",
         80, 4},
        {"{\"op\":\"dense\",\"shape\":{\"M\":29,\"N\":100,\"K\":64},"
         "\"epilogue\":[\"bias_add\",\"gelu\"]}",
         112, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(cases[i].wl, "cpu:avx512");
        space_sched s;
        space_default(b.sp, &s);
        char text[1024];
        space_print(b.sp, &s, text, sizeof text);
        int vx = b.sp->n_spatial - 1;
        cr_expect_eq(space_tile(b.sp, &s, vx, 3), cases[i].cols, "%s [%s]: the whole row",
                     cases[i].wl, text);
        cr_expect_eq(space_tile(b.sp, &s, vx - 1, 3), cases[i].rows, "%s [%s]: register rows",
                     cases[i].wl, text);
        int fma_mem, stores;
        zmm_stack_traffic(&b, &s, &fma_mem, &stores);
        cr_expect_eq(fma_mem, 0, "%s [%s]: %d FMAs read the stack", cases[i].wl, text, fma_mem);
        if (target_host_can_run(&b.t)) check_schedule(&b, &s, cases[i].wl);
        built_free(&b);
    }
}

/* The window workloads in two halves a target, so that each test stays well within the
 * suite's timeout on a loaded 2-core host (the AVX2 set took 206 s in one test alone, and
 * timed out at 240 s beside a training run). */

Test(codegen_cpu, window_sketch_odd_widths_strides_avx512)
{
    for (size_t i = 0; i < N_WINDOW_WLS / 2; i++)
        check_window_all(window_wls[i], "cpu");
}

Test(codegen_cpu, window_sketch_odd_widths_strides_avx512_rest)
{
    for (size_t i = N_WINDOW_WLS / 2; i < N_WINDOW_WLS; i++)
        check_window_all(window_wls[i], "cpu");
}

Test(codegen_cpu, window_sketch_odd_widths_strides_avx2)
{
    for (size_t i = 0; i < N_WINDOW_WLS / 2; i++)
        check_window_all(window_wls[i], "cpu:avx2");
}

Test(codegen_cpu, window_sketch_odd_widths_strides_avx2_rest)
{
    for (size_t i = N_WINDOW_WLS / 2; i < N_WINDOW_WLS; i++)
        check_window_all(window_wls[i], "cpu:avx2");
}

/* Every vector axis the space offers (VECTORIZE = v: the v-th innermost spatial axis), each
 * through the rule of thumb for that axis, on both ISAs: a conv along F (filters packed and
 * gathered, inputs broadcast, bound checks per row with an interior copy), a GEMM along M, a
 * Bᵀ batch matmul along its batch; strided packing and transposing write-backs included. */
static void check_vector_axes(const char *wl, const char *tg, int min_axes)
{
    built b = build(wl, tg);
    cr_assert_eq(b.sp->sketch, SKETCH_CPU_TILE, "%s", wl);
    int64_t vals[SPACE_MAX_VALUES];
    space_sched none;
    memset(&none, 0, sizeof none);
    cr_assert_eq(b.sp->slot[0].kind, SLOT_VECTORIZE);
    int n = space_legal_values(b.sp, 0, &none, vals), axes = 0;
    for (int k = 0; k < n; k++) {
        if (vals[k] < 1) continue;
        space_sched s;
        space_default_vectorized(b.sp, vals[k], &s);
        cr_assert_eq(space_get(b.sp, &s, SLOT_VECTORIZE, -1), vals[k]);
        check_schedule(&b, &s, wl);
        axes++;
    }
    cr_expect_geq(axes, min_axes, "%s: %d vector axes", wl, axes);
    built_free(&b);
}

Test(codegen_cpu, every_vector_axis)
{
    static const char *const wls[] = {
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":13,\"W\":11,\"F\":20,"
        "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"epilogue\":[\"bias_add\","
        "\"relu\"]}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":5,\"H\":9,\"W\":9,\"F\":17,"
        "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
        "{\"op\":\"dense\",\"shape\":{\"M\":19,\"N\":23,\"K\":11},\"epilogue\":[\"bias_add\"]}",
        "{\"op\":\"batch_matmul\",\"shape\":{\"B\":5,\"M\":9,\"N\":13,\"K\":7},"
        "\"transpose_b\":true}",
        /* a plane too large for CPU_WINDOW's stack buffers keeps depthwise on CPU_TILE */
        "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":5,\"H\":300,\"W\":301,"
        "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
    };
    static const int min_axes[] = {3, 3, 2, 3, 3}; /* n = 1 or 2 never carries vectors */
    for (int i = 0; i < (int)(sizeof wls / sizeof wls[0]); i++) {
        check_vector_axes(wls[i], "cpu", min_axes[i]);
        check_vector_axes(wls[i], "cpu:avx2", min_axes[i]);
    }
}

/* Zero padding along the vector axis is one masked load per vector (lanes inside the image),
 * and register tiles that never touch the border run without bound checks. */
Test(codegen_cpu, padding_is_masked_loads_and_an_interior_copy)
{
    /* planes too large for CPU_WINDOW (whose own padding is tested above): CPU_TILE's path */
    const char *wl = "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":300,"
                     "\"W\":307,\"KH\":5,\"KW\":5},\"pad\":[2,2]}";
    const char *tg[] = {"cpu", "cpu:avx2"};
    for (int i = 0; i < 2; i++) {
        built b = build(wl, tg[i]);
        cr_assert_eq(b.sp->sketch, SKETCH_CPU_TILE);
        space_sched s;
        space_default(b.sp, &s);
        cr_expect_eq(space_get(b.sp, &s, SLOT_PACK, -1), 0, "a depthwise input is not reused");
        tlm_error err;
        cg_kernel k;
        cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
        cr_expect(strstr(k.source, "tlm_vload_range(&X[") != NULL, "%s: no masked row load", tg[i]);
        cr_expect(strstr(k.source, ") >= 0 && (") != NULL, "%s: no interior test", tg[i]);
        cg_kernel_free(&k);
        check_schedule(&b, &s, wl);
        built_free(&b);
    }
    /* a max pool pads with -inf: the masked-off lanes are filled, not zeroed */
    const char *pool = "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":5,\"H\":300,\"W\":309,"
                       "\"KH\":3,\"KW\":3},\"stride\":[1,1],\"pad\":[1,1]}";
    for (int i = 0; i < 2; i++) {
        built b = build(pool, tg[i]);
        cr_assert_eq(b.sp->sketch, SKETCH_CPU_TILE);
        space_sched s;
        space_default(b.sp, &s);
        tlm_error err;
        cg_kernel k;
        cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
        cr_expect(strstr(k.source, "tlm_vfill(tlm_vload_range(&X[") != NULL, "%s: no filled load",
                  tg[i]);
        cg_kernel_free(&k);
        check_schedule(&b, &s, pool);
        check_samples(&b, pool, 99, 4);
        built_free(&b);
    }
}

/* Whether a rows kernel streams its output (both rows generators allocate their per-thread
 * scratch rows only then). */
static bool rows_streamed(const char *src)
{
    /* softmax's scratch rows, the generic rows code's row, a norm's streamed last pass */
    return strstr(src, "tlm_buf") != NULL || strstr(src, "tlm_row =") != NULL ||
           strstr(src, ", pf, 1, ") != NULL;
}

/* Says the target's last-level cache is 64 KiB, in both copies codegen and the harness read
 * (the space's and the built target), so that small outputs take the streaming-store path. */
static void small_l3(built *b)
{
    b->t.cpu.l3_bytes = 64 << 10;
    b->sp->tgt.cpu.l3_bytes = 64 << 10;
}

/* cores and caches set on both the built target and the space's copy of it (l3 0: as is) */
static void set_caches(built *b, int cores, int64_t l2, int64_t l3)
{
    b->t.cpu.cores = b->sp->tgt.cpu.cores = cores;
    b->t.cpu.l2_bytes = b->sp->tgt.cpu.l2_bytes = l2;
    if (l3) b->t.cpu.l3_bytes = b->sp->tgt.cpu.l3_bytes = l3;
}

/* The schedule `sched` of workload `wl` on the target of `ti` (0: cpu, 1: cpu:avx2). */
static built build_sched(const char *wl, int ti, const char *sched, space_sched *s)
{
    built b = build(wl, ti ? "cpu:avx2" : "cpu");
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(space_parse(b.sp, sched, s, &err), 0, "%s: %s", sched, err.msg);
    return b;
}

/* The default of each workload on both ISAs, with a 64 KiB L3, checked against the reference;
 * `streamed`: the source must stream its rows, and the serial kernel is checked too (its
 * scratch row outside any parallel region). */
static void check_small_l3_defaults(const char *const *wls, int n, bool streamed)
{
    for (int i = 0; i < n; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(wls[i], ti ? "cpu:avx2" : "cpu");
            small_l3(&b);
            space_sched s;
            space_default(b.sp, &s);
            if (streamed) {
                tlm_error err;
                cg_kernel k;
                cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
                cr_expect(rows_streamed(k.source), "%s: not streamed", wls[i]);
                cg_kernel_free(&k);
            }
            check_schedule(&b, &s, wls[i]);
            if (streamed) {
                for (int sl = 0; sl < b.sp->n_slot; sl++)
                    if (b.sp->slot[sl].kind == SLOT_PARALLEL) s.v[sl] = 0;
                check_schedule(&b, &s, wls[i]);
            }
            built_free(&b);
        }
}

/* Rows kernels whose output outgrows the last-level cache stream it out with non-temporal
 * stores (softmax from a per-thread scratch row, the norms from their last pass): checked here
 * on a target that says its L3 is 64 KiB. */
Test(codegen_cpu, streaming_rows_past_the_last_level_cache)
{
    static const char *const wls[] = {
        "{\"op\":\"softmax\",\"shape\":{\"R\":37,\"C\":1001}}",
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":29,\"C\":771},\"epilogue\":[\"add\","
        "\"relu\"]}",
        "{\"op\":\"rms_norm\",\"shape\":{\"R\":31,\"C\":515}}",
    };
    check_small_l3_defaults(wls, 3, true);
    /* and a small output keeps plain stores */
    built b = build(wls[0], "cpu");
    space_sched s;
    space_default(b.sp, &s);
    tlm_error err;
    cg_kernel k;
    cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
    cr_expect(!rows_streamed(k.source));
    cg_kernel_free(&k);
    built_free(&b);
}

/* Whether the kernel generated for schedule s contains needle. */
static bool source_has(const built *b, const space_sched *s, const char *needle)
{
    tlm_error err;
    cg_kernel k;
    cr_assert_eq(cg_generate(b->sp, s, NULL, &k, &err), 0, "%s", err.msg);
    bool has = strstr(k.source, needle) != NULL;
    cg_kernel_free(&k);
    return has;
}

/* A transpose's default moves its register tiles as W x W blocks transposed in registers
 * (tlm_transpose): 16 x 16 where both rows are whole 64-byte lines on AVX-512, 8 x 8 where
 * they are not and on AVX2, through a bias and relu epilogue too; rows shorter than that keep
 * the rule's points GCC vectorises. Each checked against the reference on both ISAs. */
Test(codegen_cpu, transposes_move_register_blocks)
{
    static const struct {
        const char *wl;
        bool blocks512, blocks2; /* tlm_transpose(tt) on AVX-512, on AVX2 */
    } cases[] = {
        {"{\"op\":\"transpose\",\"shape\":{\"R\":64,\"C\":48}}", true, true},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":67,\"C\":45}}", true, true},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":48,\"C\":33},"
         "\"epilogue\":[\"bias_add\",\"relu\"]}",
         true, true},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":5,\"C\":300}}", false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int ti = 0; ti < 2; ti++) { /* the source on fixed ISAs */
            built b = build(cases[i].wl, ti ? "cpu:avx2" : "cpu:avx512");
            space_sched s;
            space_default(b.sp, &s);
            cr_expect_eq(source_has(&b, &s, "tlm_transpose(tt);"),
                         ti ? cases[i].blocks2 : cases[i].blocks512, "%s on %s", cases[i].wl,
                         ti ? "avx2" : "avx512");
            if (cases[i].blocks512 && !ti)
                cr_expect_eq(space_get(b.sp, &s, SLOT_TILE, 0), i == 0 ? 16 : 8,
                             "%s: register tile rows (tile.c.3, the first tile slot)", cases[i].wl);
            built_free(&b);
        }
        for (int ti = 0; ti < 2; ti++) { /* run on this host */
            built b = build(cases[i].wl, ti ? "cpu:avx2" : "cpu");
            space_sched s;
            space_default(b.sp, &s);
            check_schedule(&b, &s, cases[i].wl);
            built_free(&b);
        }
    }
    /* blocks under two fused task levels, a ragged level-1 tile and edge tasks */
    const char *wl = "{\"op\":\"transpose\",\"shape\":{\"R\":67,\"C\":45}}";
    for (int ti = 0; ti < 2; ti++) {
        built b = build(wl, ti ? "cpu:avx2" : "cpu");
        space_sched s;
        tlm_error err;
        cr_assert_eq(space_parse(b.sp,
                                 "vectorize=1 tile.c.3=8 tile.r.3=8 tile.c.2=1 tile.r.2=3 "
                                 "tile.c.1=2 tile.r.1=3 parallel=2 unroll=0",
                                 &s, &err),
                     0, "%s", err.msg);
        cr_expect(source_has(&b, &s, "tlm_transpose(tt);"), "fused tasks: no blocks");
        check_schedule(&b, &s, wl);
        built_free(&b);
    }
}

/* A register tile whose reduction has several loops (a direct conv along F: c, kh, kw)
 * requests the input rows some channels ahead at the top of each kh iteration; a GEMM (one
 * reduction loop, its broadcasts sequential) does not. Both checked against the reference,
 * padded (the prefetch reads the padding copy) and strided; inputs past L1 (32 KiB). */
Test(codegen_cpu, broadcast_prefetch_in_direct_convs)
{
    static const char *const convs[] = {
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":19,\"H\":33,\"W\":37,\"F\":40,"
        "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":16,\"H\":15,\"W\":15,\"F\":33,"
        "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
    };
    for (int i = 0; i < 2; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(convs[i], ti ? "cpu:avx2" : "cpu");
            space_sched s;
            space_default(b.sp, &s);
            space_sched f;
            space_default_vectorized(b.sp, 3, &f); /* along F */
            cr_expect(source_has(&b, &f, "__builtin_prefetch(&Pad0["),
                      "%s on %s: no prefetch of the input rows", convs[i], ti ? "avx2" : "avx512");
            cr_expect(!source_has(&b, &f, "__builtin_prefetch(&X["),
                      "the padding copy's source is not read in the tile");
            check_schedule(&b, &f, convs[i]);
            check_schedule(&b, &s, convs[i]);
            built_free(&b);
        }
    built b = build("{\"op\":\"dense\",\"shape\":{\"M\":37,\"N\":70,\"K\":29}}", "cpu");
    space_sched s;
    space_default(b.sp, &s);
    cr_expect(!source_has(&b, &s, "iterations of"), "a GEMM's broadcasts are sequential");
    built_free(&b);
}

/* A broadcast's rows requested ahead take a request every 16 floats of the span the tile's
 * points cover and one at its end, not one a point: a stride-2 1x1 conv along F reads every
 * other float (7 columns: 2 requests over 13 floats), on both ISAs, run against the
 * reference. */
Test(codegen_cpu, strided_broadcast_rows_requested_once_a_line)
{
    static const char *const wl = "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":64,\"F\":64,"
                                  "\"H\":28,\"W\":28,\"KH\":1,\"KW\":1},\"stride\":[2,2]}";
    for (int ti = 0; ti < 2; ti++) {
        built b = build(wl, ti ? "cpu:avx2" : "cpu");
        space_sched s;
        space_default_vectorized(b.sp, 3, &s); /* along F */
        char text[2048];
        space_print(b.sp, &s, text, sizeof text);
        const char *ow = strstr(text, "tile.ow.3=");
        int cols = 0;
        cr_assert(ow && sscanf(ow, "tile.ow.3=%d", &cols) == 1, "%s", text);
        tlm_error err;
        cg_kernel k;
        cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
        const char *at = strstr(k.source, "the rows ");
        cr_assert(at, "no rows requested");
        const char *end = strchr(at, '}');
        int n = 0;
        for (const char *p = strstr(at, "__builtin_prefetch("); p && p < end;
             p = strstr(p + 1, "__builtin_prefetch("))
            n++;
        const int hi = 2 * (cols - 1); /* the last column's offset */
        cr_expect_eq(n, hi / 16 + 1 + (hi % 16 != 0), "%s: %d columns, %d requests", text, cols, n);
        cg_kernel_free(&k);
        check_schedule(&b, &s, wl);
        built_free(&b);
    }
}

/* How many channels ahead the kernel for s requests its input rows (0: no request). */
static int prefetch_ahead_of(const built *b, const space_sched *s)
{
    tlm_error err;
    cg_kernel k;
    cr_assert_eq(cg_generate(b->sp, s, NULL, &k, &err), 0, "%s", err.msg);
    const char *at = strstr(k.source, "the rows ");
    int ahead = 0;
    if (at) cr_assert_eq(sscanf(at, "the rows %d iterations", &ahead), 1);
    cg_kernel_free(&k);
    return ahead;
}

/* The distance follows the work of a channel: a 1x1 conv's channel is the register tile
 * alone, so its rows are requested further ahead than the two channels of a 3x3 conv (each
 * 9 x the tile), at most half the channels; a stem's 3 channels keep 2. Checked against the
 * reference, strided and not, on both ISAs. */
Test(codegen_cpu, broadcast_prefetch_distance_follows_the_work_of_a_channel)
{
    static const struct {
        const char *wl;
        int lo, hi; /* the distance expected */
    } cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":64,\"H\":28,\"W\":28,\"F\":64,"
         "\"KH\":1,\"KW\":1},\"stride\":[2,2],\"epilogue\":[\"bias_add\"]}", 3, 16},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":14,\"W\":14,\"F\":48,"
         "\"KH\":1,\"KW\":1}}", 3, 16},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":64,\"W\":64,\"F\":32,"
         "\"KH\":1,\"KW\":1},\"stride\":[2,2]}", 2, 4},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":64,\"W\":64,\"F\":32,"
         "\"KH\":7,\"KW\":7},\"stride\":[2,2],\"pad\":[3,3]}", 2, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(cases[i].wl, ti ? "cpu:avx2" : "cpu");
            space_sched f;
            space_default_vectorized(b.sp, 3, &f); /* along F: the input broadcast */
            int ahead = prefetch_ahead_of(&b, &f);
            cr_expect(ahead >= cases[i].lo && ahead <= cases[i].hi,
                      "%s on %s: rows requested %d channels ahead, expected %d..%d", cases[i].wl,
                      ti ? "avx2" : "avx512", ahead, cases[i].lo, cases[i].hi);
            check_schedule(&b, &f, cases[i].wl);
            built_free(&b);
        }
}

/* A 1x1 conv along OW loads its input rows as vectors, a plane apart per channel: past what
 * a hardware stride prefetcher follows, they are requested ahead when a chunk's rows do not
 * stay in L1 (256 channels x 32 floats), not when they do (16 channels), nor in a conv with
 * taps (a 3x3 along OW). Checked against the reference on both ISAs. */
Test(codegen_cpu, vector_rows_requested_ahead_in_pointwise_convs)
{
    static const struct {
        const char *wl, *sched;
        bool expect;
    } cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":32,\"W\":32,\"F\":20,"
         "\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\"]}",
         "vectorize=1 tile.n.3=1 tile.f.3=3 tile.oh.3=1 tile.ow.3=32 tile.n.2=1 tile.f.2=7 tile.oh.2=1 "
         "tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=256 tile.kh.1=1 "
         "tile.kw.1=1 parallel=1 unroll=64 pack=0", true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":32,\"W\":32,\"F\":20,"
         "\"KH\":1,\"KW\":1}}",
         "vectorize=1 tile.n.3=1 tile.f.3=3 tile.oh.3=1 tile.ow.3=32 tile.n.2=1 tile.f.2=7 tile.oh.2=1 "
         "tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=16 tile.kh.1=1 "
         "tile.kw.1=1 parallel=1 unroll=64 pack=0", false},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":32,\"W\":32,\"F\":20,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
         "vectorize=1 tile.n.3=1 tile.f.3=3 tile.oh.3=1 tile.ow.3=32 tile.n.2=1 tile.f.2=7 tile.oh.2=1 "
         "tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=256 tile.kh.1=3 "
         "tile.kw.1=3 parallel=1 unroll=64 pack=0", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(cases[i].wl, ti ? "cpu:avx2" : "cpu");
            space_sched s;
            tlm_error err;
            cr_assert_eq(space_parse(b.sp, cases[i].sched, &s, &err), 0, "%s", err.msg);
            bool has = prefetch_ahead_of(&b, &s) > 0;
            cr_expect_eq(has, cases[i].expect, "%s on %s: rows requested ahead: %d",
                         cases[i].wl, ti ? "avx2" : "avx512", has);
            check_schedule(&b, &s, cases[i].wl);
            built_free(&b);
        }
}

/* The window kernels' packed plane: each phase row a whole number of vectors and the first
 * column the pack writes on a vector boundary (a 5x5 stride-2 depthwise padded by 2: rows of
 * 35 columns from column 1, 40 on AVX2 and 48 on AVX-512, Q 7 and 15 floats into its
 * buffer); checked against the reference there and on odd extents. */
Test(codegen_cpu, window_plane_rows_start_on_vectors)
{
    static const char *const wl = "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":8,"
                                  "\"H\":56,\"W\":56,\"KH\":5,\"KW\":5},\"stride\":[2,2],"
                                  "\"pad\":[2,2],\"epilogue\":[\"bias_add\",\"relu\"]}";
    static const char *const odd = "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":3,"
                                   "\"H\":13,\"W\":29,\"KH\":3,\"KW\":3},\"stride\":[2,2],"
                                   "\"pad\":[1,1]}";
    for (int ti = 0; ti < 2; ti++) {
        built b = build(wl, ti ? "cpu:avx2" : "cpu");
        space_sched s;
        tlm_error err;
        cr_assert_eq(space_parse(b.sp, "vectorize=1 tile.ow.3=32 tile.oh.3=2 parallel=1", &s, &err),
                     0, "%s", err.msg);
        cr_expect(source_has(&b, &s,
                             ti ? "float *const Q = Qb + 7;" : "float *const Q = Qb + 15;"));
        cr_expect(source_has(&b, &s, ti ? "Q + r * 80;" : "Q + r * 96;"));
        check_schedule(&b, &s, wl);
        built_free(&b);
        b = build(odd, ti ? "cpu:avx2" : "cpu");
        check_samples(&b, odd, 77, 6);
        built_free(&b);
    }
}

/* Along OW, a plane of 8 KiB or more is packed a row block ahead of the FMAs (inside the
 * blocks' loop), a smaller one whole before them; odd extents, strides and random schedules
 * of the first checked against the reference on both ISAs. */
Test(codegen_cpu, window_packs_large_planes_a_block_ahead)
{
    static const char *const large[] = {
        "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":5,\"H\":45,\"W\":71,"
        "\"KH\":5,\"KW\":5},\"stride\":[2,2],\"pad\":[2,2],\"epilogue\":[\"bias_add\","
        "\"relu\"]}",
        "{\"op\":\"max_pool2d\",\"shape\":{\"N\":2,\"C\":3,\"H\":47,\"W\":53,\"KH\":3,"
        "\"KW\":3},\"stride\":[1,1],\"pad\":[1,1]}",
    };
    static const char *const small = "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,"
                                     "\"C\":4,\"H\":14,\"W\":14,\"KH\":3,\"KW\":3},"
                                     "\"pad\":[1,1]}";
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu";
        for (int i = 0; i < 2; i++) {
            built b = build(large[i], tg);
            space_sched s;
            space_default_vectorized(b.sp, 1, &s); /* along OW */
            cr_expect(source_has(&b, &s, "for (int64_t r = rdone; r < rend; r++)"), "%s on %s",
                      large[i], tg);
            check_schedule(&b, &s, large[i]);
            check_samples(&b, large[i], 31 + (uint64_t)i, 4);
            built_free(&b);
        }
        built b = build(small, tg);
        space_sched s;
        space_default_vectorized(b.sp, 1, &s);
        cr_expect(source_has(&b, &s, "for (int64_t r = 0; r < "), "%s", tg);
        cr_expect(!source_has(&b, &s, "rdone"), "%s", tg);
        built_free(&b);
    }
}

/* Along OW, an output past the streaming bound (space_cpu_output_streams: half the L3, here a
 * 16 KiB L3 on 2 cores) in rows of whole 64-byte lines goes out of the row buffer with
 * non-temporal stores after its epilogue ran in place: a 32-wide depthwise + bias + ReLU6 and
 * a 32-wide stride-2 avg pool (its 1/n scale in place) on both ISAs, default and random
 * schedules against the reference; 30-wide rows keep plain stores, and so does every output
 * under the bound, however small the L2 (a 4 KiB L2 and a 256 MiB L3: the plan's next launch
 * reads it from the cache). */
Test(codegen_cpu, window_streams_whole_line_rows_past_the_bound)
{
    static const char *const wls[] = {
        "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":3,\"H\":32,\"W\":32,"
        "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu6\"]}",
        "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":2,\"C\":5,\"H\":63,\"W\":64,\"KH\":3,"
        "\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
        "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":3,\"H\":32,\"W\":30,"
        "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
    };
    for (int i = 0; i < 3; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(wls[i], ti ? "cpu:avx2" : "cpu");
            space_sched s;
            set_caches(&b, 2, 4096, 256 << 20);
            space_default_vectorized(b.sp, 1, &s); /* along OW */
            cr_expect(!source_has(&b, &s, "tlm_stream_row(&"), "%s on %s under the bound", wls[i],
                      ti ? "cpu:avx2" : "cpu");
            set_caches(&b, 2, 4096, 16 << 10);
            space_default_vectorized(b.sp, 1, &s);
            cr_expect_eq(source_has(&b, &s, "tlm_stream_row(&"), i < 2, "%s on %s", wls[i],
                         ti ? "cpu:avx2" : "cpu");
            if (i < 2) {
                check_schedule(&b, &s, wls[i]);
                check_samples(&b, wls[i], 5 + (uint64_t)i, 3);
            }
            built_free(&b);
        }
}

/* A conv along F whose transposed copy-out writes an output past the streaming bound (half the
 * L3), from a window of at most 256 taps, streams its whole 64-byte lines on AVX-512 (an
 * aligned 16 x 16 tile's rows; the rest, 34-float rows here, are plain stores); a deep
 * window, an output under the bound (even past the cores' L2, as streamed here before) or
 * AVX2 keeps plain stores. The L3 is shrunk so that a small conv crosses the bound, and where
 * the host runs AVX-512 the streamed kernel is checked against the reference. */
Test(codegen_cpu, copyout_streams_large_outputs_from_shallow_windows)
{
    static const char *const shallow = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,"
                                       "\"H\":30,\"W\":34,\"F\":48,\"KH\":3,\"KW\":3},"
                                       "\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}";
    static const char *const deep = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":32,"
                                    "\"H\":30,\"W\":34,\"F\":48,\"KH\":3,\"KW\":3},"
                                    "\"pad\":[1,1]}";
    static const struct {
        const char *wl, *tg;
        int64_t l3;
        bool stream;
    } cases[] = {
        {shallow, "cpu:avx512", 64 << 10, true},   /* 196 KB out, a 32 KB bound, 27 taps */
        {shallow, "cpu:avx512", 256 << 20, false}, /* under the bound, past 2 x 16 KB of L2 */
        {deep, "cpu:avx512", 64 << 10, false},     /* 288 taps */
        {shallow, "cpu:avx2", 64 << 10, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(cases[i].wl, cases[i].tg);
        set_caches(&b, 2, 16384, cases[i].l3);
        space_sched s;
        space_default_vectorized(b.sp, 3, &s); /* along F */
        cr_expect(source_has(&b, &s, "tlm_transpose(r);"), "case %zu: no transposed copy-out", i);
        cr_expect_eq(source_has(&b, &s, "_mm512_stream_ps(d, (__m512)r[q]);"), cases[i].stream,
                     "case %zu", i);
        built_free(&b);
    }
    built b = build(shallow, "cpu");
    if (b.t.cpu.vector_lanes == 16) {
        set_caches(&b, 2, 16384, 64 << 10);
        space_sched s;
        space_default_vectorized(b.sp, 3, &s);
        cr_expect(source_has(&b, &s, "_mm512_stream_ps(d, (__m512)r[q]);"));
        check_schedule(&b, &s, shallow);
    }
    built_free(&b);
}

/* Workload wl on the target of ti (0: cpu, 1: cpu:avx2) with two cores of l2-byte L2s and
 * an l3-byte L3, under schedule sched (NULL: the default): its source must hold `also` (NULL:
 * nothing more), and `needle` exactly where `want`; a kernel that holds it is checked
 * against the reference. Case i names a failure. */
static void expect_request(const char *wl, const char *sched, int ti, int64_t l2, int64_t l3,
                           const char *needle, bool want, const char *also, size_t i)
{
    space_sched s;
    built b = sched ? build_sched(wl, ti, sched, &s) : build(wl, ti ? "cpu:avx2" : "cpu");
    set_caches(&b, 2, l2, l3);
    if (!sched) space_default(b.sp, &s);
    if (also) cr_expect(source_has(&b, &s, also), "case %zu: no %s", i, also);
    cr_expect_eq(source_has(&b, &s, needle), want, "case %zu on %s", i, ti ? "avx2" : "avx512");
    if (want) check_schedule(&b, &s, wl);
    built_free(&b);
}

/* A conv along F whose transposed copy-out writes rows of 8 lines or fewer a block into an
 * output larger than a core's L2 requests those lines before the block's reduction
 * (copyout_prefetches); rows of a longer block, an output within the L2 or a streamed copy-out
 * do not. On a target of 16 KiB L2s and a 256 MiB L3 (no streaming); each requesting kernel,
 * with partial blocks along OW and F, checked against the reference on both ISAs. */
Test(codegen_cpu, copyout_lines_requested_ahead_of_the_block)
{
    static const char *const wl = "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":3,"
                                  "\"H\":9,\"W\":150,\"F\":40,\"KH\":3,\"KW\":3},"
                                  "\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}";
    /* OW blocks of 4 x 7 = 28 floats (the last one partial) and of 6 x 25 = 150 (600 bytes) */
    static const char *const short_rows =
        "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=4 tile.n.2=1 tile.f.2=1 "
        "tile.oh.2=1 tile.ow.2=7 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=3 "
        "tile.kh.1=3 tile.kw.1=3 parallel=1 unroll=64 pack=1";
    static const char *const long_rows =
        "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=6 tile.n.2=1 tile.f.2=1 "
        "tile.oh.2=1 tile.ow.2=25 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=3 "
        "tile.kh.1=3 tile.kw.1=3 parallel=1 unroll=64 pack=1";
    static const struct {
        const char *sched;
        int64_t l2;
        bool req;
    } cases[] = {
        {short_rows, 16 << 10, true},
        {long_rows, 16 << 10, false},
        {short_rows, 4 << 20, false}, /* 432 KB out within the L2 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++)
            expect_request(wl, cases[i].sched, ti, cases[i].l2, 256 << 20,
                           "requested for ownership", cases[i].req, "tlm_transpose(r);", i);
    /* a streamed copy-out (AVX-512, an output past half the L3, a shallow window) asks nothing */
    built b = build(wl, "cpu:avx512");
    set_caches(&b, 2, 16 << 10, 64 << 10);
    space_sched s;
    tlm_error err;
    cr_assert_eq(space_parse(b.sp, short_rows, &s, &err), 0, "%s", err.msg);
    cr_expect(source_has(&b, &s, "_mm512_stream_ps(d, (__m512)r[q]);"));
    cr_expect(!source_has(&b, &s, "requested for ownership"));
    built_free(&b);
}

/* A window kernel over planes of 8 KiB or more (packed block by block) requests its share of
 * the next task's plane into L2 in each row block, where the input is larger than the cores'
 * L2s together; not within them, nor with one plane. Odd extents, a stride-2 depthwise with
 * its epilogue and a max pool, each requesting kernel checked against the reference. */
Test(codegen_cpu, next_plane_requested_ahead)
{
    static const char *const dw = "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":2,\"C\":3,"
                                  "\"H\":47,\"W\":53,\"KH\":3,\"KW\":3},\"stride\":[2,2],"
                                  "\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu6\"]}";
    static const char *const mp = "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":5,"
                                  "\"H\":45,\"W\":49,\"KH\":3,\"KW\":3},\"stride\":[1,1],"
                                  "\"pad\":[1,1]}";
    static const char *const one = "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":1,"
                                   "\"H\":64,\"W\":64,\"KH\":3,\"KW\":3},\"pad\":[1,1]}";
    static const struct {
        const char *wl;
        int64_t l2;
        bool req;
    } cases[] = {
        {dw, 16 << 10, true},   /* 6 planes of 9.7 KB past two 16 KiB L2s */
        {dw, 4 << 20, false},   /* within them */
        {mp, 16 << 10, true},   /* 5 planes of 8.6 KB */
        {one, 16 << 10, false}, /* one plane: no next one */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++)
            expect_request(cases[i].wl, NULL, ti, cases[i].l2, 256 << 20,
                           "the next plane's share, into L2", cases[i].req, NULL, i);
}

/* On 16-register targets a direct conv's window (its kernel rows around the unrolled columns)
 * is unrolled whole, and a tile of at most 10 accumulators reads its broadcast input through
 * one base pointer; with 32 registers the rows stay a loop (and every tile has its base). A
 * window of 7 x 7 taps exceeds the unroll budget of a 2 x 4 tile (whole tiles along OW: a
 * remainder tile of one column would have its window unrolled). Each kernel checked against
 * the reference, padded, with odd extents. */
Test(codegen_cpu, conv_window_in_straight_code_on_avx2)
{
    static const char *const wl3 = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":13,\"H\":11,"
                                   "\"W\":17,\"F\":40,\"KH\":3,\"KW\":3},\"pad\":[1,1],"
                                   "\"epilogue\":[\"bias_add\",\"silu\"]}";
    static const char *const wl7 = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":5,\"H\":11,"
                                   "\"W\":16,\"F\":16,\"KH\":7,\"KW\":7},\"pad\":[3,3]}";
    static const struct {
        const char *wl, *sched;
        bool window, base; /* on AVX2 */
    } cases[] = {
        {wl3, "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=5 tile.n.2=1 tile.f.2=1 "
              "tile.oh.2=1 tile.ow.2=2 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=13 "
              "tile.kh.1=3 tile.kw.1=3 parallel=1 unroll=64 pack=1", true, true},
        {wl3, "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=6 tile.n.2=1 tile.f.2=1 "
              "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=13 "
              "tile.kh.1=3 tile.kw.1=3 parallel=1 unroll=64 pack=1", true, false},
        {wl7, "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=4 tile.n.2=1 tile.f.2=1 "
              "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=5 "
              "tile.kh.1=7 tile.kw.1=7 parallel=1 unroll=64 pack=1", false, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(cases[i].wl, ti ? "cpu:avx2" : "cpu");
            space_sched s;
            tlm_error err;
            cr_assert_eq(space_parse(b.sp, cases[i].sched, &s, &err), 0, "%s", err.msg);
            char rows[64];
            snprintf(rows, sizeof rows, "#pragma GCC unroll %d\n", i < 2 ? 3 : 7);
            bool window = false, base = source_has(&b, &s, "const float *const Lb");
            cg_kernel k;
            cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
            for (const char *p = k.source; (p = strstr(p, rows)) != NULL; p += strlen(rows)) {
                const char *q = p + strlen(rows);
                while (*q == ' ') q++;
                window |= strncmp(q, "for (int64_t kh1 ", 17) == 0;
            }
            cg_kernel_free(&k);
            cr_expect_eq(window, ti && cases[i].window, "case %zu on %s: window unrolled: %d", i,
                         ti ? "avx2" : "avx512", window);
            cr_expect_eq(base, !ti || cases[i].base, "case %zu on %s: base pointer: %d", i,
                         ti ? "avx2" : "avx512", base);
            check_schedule(&b, &s, cases[i].wl);
            built_free(&b);
        }
}

/* A GEMM whose B, packed by each task a reduction chunk at a time, is larger than the last-
 * level cache requests the next chunk's source rows into L2 over the tiles of this one
 * (emit_next_chunk_source); not within the cache, nor with one chunk. Odd extents, chunks of
 * 103 and of 128 (the last one 3 long), an epilogue; each requesting kernel checked against
 * the reference on both ISAs, with and without its weights packed once. */
Test(codegen_cpu, next_chunk_source_requested_ahead)
{
    static const char *const wl = "{\"op\":\"dense\",\"shape\":{\"M\":37,\"N\":300,\"K\":515},"
                                  "\"epilogue\":[\"bias_add\",\"gelu\"]}";
    static const char *const chunks = /* 128, 128, 128, 128 and 3 */
        "vectorize=1 tile.i.3=6 tile.j.3=16 tile.i.2=7 tile.j.2=2 tile.i.1=1 tile.j.1=1 "
        "tile.k.1=128 parallel=1 unroll=64 pack=1";
    static const char *const whole = /* one chunk */
        "vectorize=1 tile.i.3=6 tile.j.3=16 tile.i.2=7 tile.j.2=2 tile.i.1=1 tile.j.1=1 "
        "tile.k.1=515 parallel=1 unroll=64 pack=1";
    static const struct {
        const char *sched;
        int64_t l3;
        bool req;
    } cases[] = {
        {NULL, 64 << 10, true},   /* the default's chunks of 103: 618 KB past a 64 KiB L3 */
        {NULL, 256 << 20, false}, /* within it */
        {chunks, 64 << 10, true},
        {whole, 64 << 10, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++)
            expect_request(wl, cases[i].sched, ti, 16 << 10, cases[i].l3,
                           "the next chunk's source rows", cases[i].req, NULL, i);
}

/* On 16-register targets a direct conv's base pointer to its input is opaque to GCC (an
 * empty asm) where a tap reads its columns' values again only two taps on (stride 2), not
 * where the next tap does (stride 1, dilation 2); with 32 registers it stays plain. Odd
 * extents, padding and an epilogue; each kernel checked against the reference on both ISAs. */
Test(codegen_cpu, strided_window_base_opaque_on_avx2)
{
    static const char *const s2 = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":7,\"H\":23,"
                                  "\"W\":39,\"F\":40,\"KH\":3,\"KW\":3},\"stride\":[2,2],"
                                  "\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"silu\"]}";
    static const char *const s1 = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":7,\"H\":11,"
                                  "\"W\":20,\"F\":40,\"KH\":3,\"KW\":3},\"pad\":[1,1]}";
    static const char *const d2 = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":7,\"H\":11,"
                                  "\"W\":20,\"F\":40,\"KH\":3,\"KW\":3},\"pad\":[2,2],"
                                  "\"dilation\":[2,2]}";
    static const char *const tile =
        "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=5 tile.n.2=1 tile.f.2=1 "
        "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=7 "
        "tile.kh.1=3 tile.kw.1=3 parallel=1 unroll=64 pack=1";
    static const struct {
        const char *wl;
        bool opaque; /* on AVX2 */
    } cases[] = {{s2, true}, {s1, false}, {d2, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            space_sched s;
            built b = build_sched(cases[i].wl, ti, tile, &s);
            const bool opaque = source_has(&b, &s, "__asm__(\"\" : \"+r\"(Lb");
            cr_expect_eq(opaque, ti && cases[i].opaque, "case %zu on %s: opaque base: %d", i,
                         ti ? "avx2" : "avx512", opaque);
            cr_expect(source_has(&b, &s, opaque ? "const float *Lb" : "const float *const Lb"),
                      "case %zu on %s: no base pointer", i, ti ? "avx2" : "avx512");
            check_schedule(&b, &s, cases[i].wl);
            built_free(&b);
        }
}

/* Tile kernels whose register tiles store straight to the output (one reduction chunk, vectors
 * along the last axis) stream it out past the last-level cache when its rows are whole 64-byte
 * lines: checked on a target that says its L3 is 64 KiB. An epilogue applied in place before
 * the rows go out, edge tiles (plain stores), random schedules (streamed or not) and the
 * serial kernel; rows of 133 floats (every segment across two lines) keep plain stores. */
Test(codegen_cpu, streaming_tiles_past_the_last_level_cache)
{
    static const char *const wls[] = {
        "{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":37,\"N\":256,\"K\":40},"
        "\"transpose_b\":true}",
        "{\"op\":\"dense\",\"shape\":{\"M\":61,\"N\":320,\"K\":24},\"epilogue\":[\"bias_add\","
        "\"gelu\"]}",
    };
    for (int i = 0; i < 2; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(wls[i], ti ? "cpu:avx2" : "cpu");
            small_l3(&b);
            space_sched s;
            space_default(b.sp, &s);
            cr_expect(source_has(&b, &s, "tlm_stream_row(&out["), "%s on %s: not streamed",
                      wls[i], ti ? "cpu:avx2" : "cpu");
            cr_expect(source_has(&b, &s, "_mm_sfence();"));
            check_schedule(&b, &s, wls[i]);
            for (int sl = 0; sl < b.sp->n_slot; sl++)
                if (b.sp->slot[sl].kind == SLOT_PARALLEL) s.v[sl] = 0;
            check_schedule(&b, &s, wls[i]);
            check_samples(&b, wls[i], 7 + (uint64_t)i, 4);
            built_free(&b);
        }
    /* a cached output, and rows that are not whole lines, keep plain stores */
    static const char *const plain[] = {
        wls[0], "{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":37,\"N\":133,\"K\":40},"
                "\"transpose_b\":true}"};
    for (int i = 0; i < 2; i++) {
        built b = build(plain[i], "cpu");
        if (i) small_l3(&b);
        space_sched s;
        space_default(b.sp, &s);
        cr_expect(!source_has(&b, &s, "tlm_stream_row"), "%s: streamed", plain[i]);
        if (i) check_schedule(&b, &s, plain[i]);
        built_free(&b);
    }
}

/* ... and only past the streaming bound (space_cpu_output_streams), however short the window
 * and small the L2: a 78 KiB output from K = 24 with a 16 KiB L2 on 2 cores keeps plain stores
 * under a 256 MiB L3 (it streamed before, from twice the cores' L2: in a plan its reader
 * wants it cached), and streams past half a 64 KiB L3 on both ISAs, run against the
 * reference. */
Test(codegen_cpu, streaming_tiles_only_past_the_bound)
{
    static const char *const shallow = "{\"op\":\"dense\",\"shape\":{\"M\":61,\"N\":320,"
                                       "\"K\":24},\"epilogue\":[\"bias_add\",\"relu\"]}";
    static const char *const deep = "{\"op\":\"dense\",\"shape\":{\"M\":61,\"N\":320,"
                                    "\"K\":200}}";
    static const struct {
        const char *wl;
        int64_t l3;
        bool stream;
    } cases[] = {{shallow, 256 << 20, false}, {shallow, 64 << 10, true}, {deep, 256 << 20, false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(cases[i].wl, ti ? "cpu:avx2" : "cpu");
            set_caches(&b, 2, 16384, cases[i].l3);
            space_sched s;
            space_default(b.sp, &s);
            cr_expect_eq(source_has(&b, &s, "tlm_stream_row(&out["), cases[i].stream,
                         "case %zu on %s", i, ti ? "cpu:avx2" : "cpu");
            if (cases[i].stream) check_schedule(&b, &s, cases[i].wl);
            built_free(&b);
        }
}

/* A kernel without a reduction whose inputs outgrow the cores' L2s requests each input it
 * reads along the lanes' loop (the anchor's load and a residual) 2048 floats ahead of every
 * run of that loop: on a target of 2 cores with 16 KiB L2s, a GELU and an add + silu over
 * 12289 floats (48 KiB an input) on both ISAs, the default and random schedules checked
 * against the reference (the prefetches past the inputs' ends too); the same kernels on the
 * host's caches, and a transpose (its input not read along the lanes), request nothing. */
Test(codegen_cpu, streamed_inputs_requested_ahead)
{
    static const struct {
        const char *wl, *needle[2];
    } cases[] = {
        {"{\"op\":\"elementwise\",\"shape\":{\"N\":12289},\"epilogue\":[\"gelu\"]}",
         {"__builtin_prefetch(&X[(i) + 2048], 0, 3);", NULL}},
        {"{\"op\":\"elementwise\",\"shape\":{\"N\":12289},\"epilogue\":[\"add\","
         "\"silu\"]}",
         {"__builtin_prefetch(&X[(i) + 2048], 0, 3);",
          "__builtin_prefetch(&res[(i) + 2048], 0, 3);"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            const char *tg = ti ? "cpu:avx2" : "cpu";
            built b = build(cases[i].wl, tg);
            space_sched s;
            space_default(b.sp, &s);
            cr_expect(!source_has(&b, &s, "__builtin_prefetch"), "case %zu on %s: prefetched", i,
                      tg);
            set_caches(&b, 2, 16384, 0);
            for (int k = 0; k < 2 && cases[i].needle[k]; k++)
                cr_expect(source_has(&b, &s, cases[i].needle[k]), "case %zu on %s: no %s", i, tg,
                          cases[i].needle[k]);
            check_schedule(&b, &s, cases[i].wl);
            check_samples(&b, cases[i].wl, 11 + (uint64_t)i, 3);
            built_free(&b);
        }
    static const char *const tr = "{\"op\":\"transpose\",\"shape\":{\"R\":160,\"C\":96}}";
    built b = build(tr, "cpu");
    set_caches(&b, 2, 16384, 0);
    space_sched s;
    space_default(b.sp, &s);
    cr_expect(!source_has(&b, &s, "__builtin_prefetch"), "transpose prefetched");
    built_free(&b);
}

/* A task of a register-tile kernel requests the next task's block of an unpacked operand it
 * loads along the vectors (a 1x1 conv's input along OW) over its tiles after the first: on a
 * target of 2 cores with 16 KiB L2s, sampled schedules of a 1x1 conv on both ISAs, among
 * them ones spreading a line a step and ones taking several a step (few tiles a task over
 * wide rows), serial and fused task loops, each checked against the reference (the
 * requests past the input's end too); a 3x3 conv (overlapping windows) and the same conv on
 * 64 MiB L2s (its input within one) request none. */
Test(codegen_cpu, next_task_block_requested_ahead)
{
    static const char *const wl = "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":64,\"F\":20,"
                                  "\"H\":6,\"W\":64,\"KH\":1,\"KW\":1},\"epilogue\":"
                                  "[\"bias_add\",\"relu\"]}";
    static const char *const w3 = "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":64,\"F\":20,"
                                  "\"H\":12,\"W\":32,\"KH\":3,\"KW\":3},\"pad\":[1,1]}";
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu";
        built b = build(wl, tg);
        set_caches(&b, 2, 16384, 0);
        uint64_t seed = 0x5EED0 + (uint64_t)ti;
        int one = 0, several = 0, par[3] = {0, 0, 0};
        space_sched s;
        for (int k = 0; k < 4000 && (one < 3 || several < 2); k++) {
            space_sample(b.sp, &seed, &s);
            if (!source_has(&b, &s, "__builtin_prefetch(&X[tlm_nx")) continue;
            const bool loop = source_has(&b, &s, "tlm_q++) {");
            if (loop ? several >= 2 : one >= 3) continue;
            if (loop)
                several++;
            else
                one++;
            par[space_get(b.sp, &s, SLOT_PARALLEL, 0)]++;
            check_schedule(&b, &s, wl);
        }
        cr_expect_eq(one, 3, "%s: %d schedules with a line a step", tg, one);
        cr_expect_eq(several, 2, "%s: %d with several a step", tg, several);
        cr_expect(par[1] + par[2] > 0, "%s: no parallel task loop", tg);
        set_caches(&b, 2, (int64_t)64 << 20, 0);
        space_default(b.sp, &s);
        cr_expect(!source_has(&b, &s, "tlm_nx"), "%s: requested under 64 MiB L2s", tg);
        built_free(&b);
        built b3 = build(w3, tg);
        set_caches(&b3, 2, 16384, 0);
        for (int k = 0; k < 40; k++) {
            space_sample(b3.sp, &seed, &s);
            cr_expect(!source_has(&b3, &s, "tlm_nx"), "%s: a 3x3 conv requested", tg);
        }
        built_free(&b3);
    }
}

/* A direct register tile over a short reduction (a 1x1 conv of 64 channels with a residual)
 * requests its output's and its residual's lines one vector an iteration of its channels'
 * loop, from a table of the tile's offsets, checked against the reference on both ISAs; over
 * 256 channels, and in a GEMM (one reduction loop), they are all requested before it. */
Test(codegen_cpu, short_reductions_spread_their_output_requests)
{
    static const struct {
        const char *wl;
        bool spread;
    } cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":64,\"F\":40,\"H\":17,\"W\":17,\"KH\":1,"
         "\"KW\":1},\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
         true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":256,\"F\":40,\"H\":17,\"W\":17,"
         "\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
         false},
        {"{\"op\":\"dense\",\"shape\":{\"M\":61,\"N\":320,\"K\":24},\"epilogue\":[\"bias_add\","
         "\"add\"]}",
         false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            const char *tg = ti ? "cpu:avx2" : "cpu";
            built b = build(cases[i].wl, tg);
            space_sched s;
            space_default(b.sp, &s);
            cr_expect_eq(source_has(&b, &s, "] + tlm_pfo["), cases[i].spread, "case %zu on %s", i,
                         tg);
            cr_expect(source_has(&b, &s, "__builtin_prefetch(&res["), "case %zu on %s", i, tg);
            if (cases[i].spread) {
                check_schedule(&b, &s, cases[i].wl);
                check_samples(&b, cases[i].wl, 5, 3);
            }
            built_free(&b);
        }
}

/* The vectorised rows kernels (softmax, layer_norm, rms_norm, row reductions alone): row
 * lengths of 1, lanes - 1, lanes, lanes + 1 of each ISA (on AVX2 also 15 and 17: one vector
 * and a tail of 7 or two vectors and 1), 33 (past the 4-vector unrolled block, a multiple of
 * neither) and a long row (lengths that run the same code paths as these on an ISA are not
 * repeated there: 7, 8 and 9 are all tail on AVX-512);
 * 13 rows (not a multiple of the threads or of a rows block); plain stores, streamed stores (a
 * target whose L3 is 64 KiB: misaligned row starts, partial lines) where the op writes rows;
 * each value of the rows block and of parallel (serial: one thread's scratch rows, no
 * worksharing). */
static void check_rows_vec(const char *op, const char *fn, bool can_stream)
{
    static const int cs[2][9] = {{1, 15, 16, 17, 33, 1500}, {1, 7, 8, 9, 15, 16, 17, 33, 1500}};
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (int ti = 0; ti < 2; ti++)
        for (size_t ci = 0; ci < 9 && cs[ti][ci]; ci++)
            for (int st = 0; st < 2; st++) {
                char wl[160];
                snprintf(wl, sizeof wl, "{\"op\":\"%s\",\"shape\":{\"R\":13,\"C\":%d}}", op,
                         cs[ti][ci]);
                built b = build(wl, tgs[ti]);
                if (st) small_l3(&b);
                bool big = 4 * 13 * cs[ti][ci] > 32 << 10;
                space_sched s;
                space_default(b.sp, &s);
                tlm_error err;
                cg_kernel k;
                cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
                cr_expect(strstr(k.source, fn) != NULL, "%s on %s: not the vectorised kernel", wl,
                          tgs[ti]);
                cr_expect_eq(rows_streamed(k.source), can_stream && st && big,
                             "%s on %s, L3 %lld: streamed %d", wl, tgs[ti],
                             (long long)b.sp->tgt.cpu.l3_bytes, (int)rows_streamed(k.source));
                cg_kernel_free(&k);
                /* every rows block x parallel (vectorize on) */
                int64_t vals[SPACE_MAX_VALUES];
                for (int sl = 0; sl < b.sp->n_slot; sl++) {
                    if (b.sp->slot[sl].kind != SLOT_ROWS && b.sp->slot[sl].kind != SLOT_PARALLEL)
                        continue;
                    int nv = space_legal_values(b.sp, sl, &s, vals);
                    space_sched v = s;
                    for (int i = 0; i < nv; i++) {
                        v.v[sl] = vals[i];
                        if (space_check(b.sp, &v, &err) == 0) check_schedule(&b, &v, wl);
                    }
                }
                built_free(&b);
            }
}

Test(codegen_cpu, rows_vec_softmax_odd_lengths)
{
    check_rows_vec("softmax", "tlm_softmax_row(x", true);
}

Test(codegen_cpu, rows_vec_layer_norm_odd_lengths)
{
    check_rows_vec("layer_norm", "tlm_layer_norm_row(x", true);
}

Test(codegen_cpu, rows_vec_rms_norm_odd_lengths)
{
    check_rows_vec("rms_norm", "tlm_rms_norm_row(x", true);
}

/* Row reductions: the same kernels' reading half (one float per row out: never streamed).
 * One test per reduction, each within the suite's timeout on a slow 2-core host (the three
 * together took over 240 s under the sanitizers at 2.0 GHz). */
/* A rows reduction whose axes every load walks as one strided run (an NCHW global pool's
 * H x W plane) runs as one loop of H x W points named after the innermost axis (the outer
 * axis's term 0), not a loop per row; odd extents (7 x 5 and 5 x 7, 13 channels and 1), the
 * default and random schedules against the reference on both ISAs. */
Test(codegen_cpu, rows_reduction_axes_run_as_one_loop)
{
    static const char *const wls[] = {
        "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":2,\"C\":13,\"H\":7,\"W\":5}}",
        "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":1,\"H\":5,\"W\":7}}",
    };
    for (int i = 0; i < 2; i++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(wls[i], ti ? "cpu:avx2" : "cpu");
            space_sched s;
            space_default(b.sp, &s);
            cr_expect(source_has(&b, &s, "for (int64_t w = 0; w < 35; w++) {"), "%s", wls[i]);
            cr_expect(!source_has(&b, &s, "for (int64_t h = 0; h < 7; h++) {"), "%s", wls[i]);
            check_schedule(&b, &s, wls[i]);
            check_samples(&b, wls[i], 11 + (uint64_t)i, 4);
            built_free(&b);
        }
}

/* A register tile along OW whose weights are broadcast per filter row, each row contiguous
 * over the whole reduction in one chunk (a 1x1 conv's C, a 3x3's C x 9), requests the next
 * tile's rows (the next f block, one run R rows on) each channel; not over a chunk of the
 * channels, nor for weights that stay in cache. Both ISAs; the kernels checked. */
Test(codegen_cpu, next_filter_rows_prefetched_over_whole_rows)
{
    static const struct {
        const char *wl, *sched, *want;
    } cases[] = {
        {"{\"op\":\"conv2d\",\"layout\":\"NCHW\",\"epilogue\":[\"bias_add\",\"relu\"],"
         "\"shape\":{\"N\":1,\"C\":256,\"F\":70,\"H\":3,\"W\":32,\"KH\":1,\"KW\":1}}",
         "vectorize=1 tile.n.3=1 tile.f.3=6 tile.oh.3=1 tile.ow.3=16 tile.n.2=1 tile.f.2=3 "
         "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=256 "
         "tile.kh.1=1 tile.kw.1=1 parallel=1 unroll=64 pack=1",
         "+ 1536 + p0], 0, 2);"},
        {"{\"op\":\"conv2d\",\"layout\":\"NCHW\",\"pad\":[1,1],"
         "\"shape\":{\"N\":1,\"C\":32,\"F\":97,\"H\":6,\"W\":16,\"KH\":3,\"KW\":3}}",
         "vectorize=1 tile.n.3=1 tile.f.3=6 tile.oh.3=1 tile.ow.3=16 tile.n.2=1 tile.f.2=2 "
         "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=32 "
         "tile.kh.1=3 tile.kw.1=3 parallel=1 unroll=64 pack=1",
         "+ 1728 + p3], 0, 2);"},
        {"{\"op\":\"conv2d\",\"layout\":\"NCHW\",\"epilogue\":[\"bias_add\",\"relu\"],"
         "\"shape\":{\"N\":1,\"C\":256,\"F\":70,\"H\":3,\"W\":32,\"KH\":1,\"KW\":1}}",
         "vectorize=1 tile.n.3=1 tile.f.3=6 tile.oh.3=1 tile.ow.3=16 tile.n.2=1 tile.f.2=3 "
         "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=128 "
         "tile.kh.1=1 tile.kw.1=1 parallel=1 unroll=64 pack=1",
         NULL},
        {"{\"op\":\"conv2d\",\"layout\":\"NCHW\",\"epilogue\":[\"bias_add\",\"relu\"],"
         "\"shape\":{\"N\":1,\"C\":64,\"F\":70,\"H\":3,\"W\":32,\"KH\":1,\"KW\":1}}",
         "vectorize=1 tile.n.3=1 tile.f.3=6 tile.oh.3=1 tile.ow.3=16 tile.n.2=1 tile.f.2=3 "
         "tile.oh.2=1 tile.ow.2=1 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=64 "
         "tile.kh.1=1 tile.kw.1=1 parallel=1 unroll=64 pack=1",
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++) {
            space_sched s;
            built b = build_sched(cases[i].wl, ti, cases[i].sched, &s);
            bool has = source_has(&b, &s, "the next tile's rows along f (6 on)");
            cr_expect_eq(has, cases[i].want != NULL, "case %zu, %s", i, ti ? "avx2" : "avx512");
            if (cases[i].want)
                cr_expect(source_has(&b, &s, cases[i].want), "case %zu: %s", i, cases[i].want);
            check_schedule(&b, &s, cases[i].wl);
            built_free(&b);
        }
}

/* A prepacked operand larger than an eighth of the L2 (a conv's weights along F, a GEMM's
 * B; two chunks of 128 along the reduction) has its next panel requested over the first
 * register tiles of each, when it is handed in (tlm_pre); with an L2 that holds it, none. Both
 * ISAs, the kernels and their prepacked entries checked. */
Test(codegen_cpu, next_packed_panel_prefetched_past_the_l2)
{
    static const struct {
        const char *wl, *sched[2], *want[2];
    } cases[] = {
        {"{\"op\":\"conv2d\",\"layout\":\"NCHW\",\"epilogue\":[\"bias_add\",\"relu\"],"
         "\"shape\":{\"N\":1,\"C\":256,\"F\":128,\"H\":7,\"W\":7,\"KH\":1,\"KW\":1}}",
         {"vectorize=3 tile.n.3=1 tile.f.3=64 tile.oh.3=1 tile.ow.3=7 tile.n.2=1 tile.f.2=1 "
          "tile.oh.2=1 tile.ow.2=7 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=128 "
          "tile.kh.1=1 tile.kw.1=1 parallel=1 unroll=64 pack=1",
          "vectorize=3 tile.n.3=1 tile.f.3=16 tile.oh.3=1 tile.ow.3=6 tile.n.2=1 tile.f.2=1 "
          "tile.oh.2=1 tile.ow.2=9 tile.n.1=1 tile.f.1=1 tile.oh.1=1 tile.ow.1=1 tile.c.1=128 "
          "tile.kh.1=1 tile.kw.1=1 parallel=1 unroll=64 pack=1"},
         /* 512 lines of 64 x 128 floats over 128 steps a tile: 4 tiles (AVX2: 128 lines of
          * 16 x 128, the first) */
         {"if (tlm_pre0 && q2 < 4)", "if (tlm_pre0 && q2 < 1)"}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":30,\"N\":128,\"K\":256},\"epilogue\":[\"bias_add\"]}",
         {"vectorize=1 tile.i.3=6 tile.j.3=64 tile.i.2=5 tile.j.2=1 tile.i.1=1 tile.j.1=1 "
          "tile.k.1=128 parallel=1 unroll=64 pack=1",
          "vectorize=1 tile.i.3=6 tile.j.3=16 tile.i.2=5 tile.j.2=1 tile.i.1=1 tile.j.1=1 "
          "tile.k.1=128 parallel=1 unroll=64 pack=1"},
         {"if (tlm_pre0 && q2 < 4)", "if (tlm_pre0 && q2 < 1)"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int ti = 0; ti < 2; ti++)
            for (int big = 0; big < 2; big++) {
                space_sched s;
                built b = build_sched(cases[i].wl, ti, cases[i].sched[ti], &s);
                set_caches(&b, 2, big ? 8 << 20 : 256 << 10, 0);
                const bool has = source_has(&b, &s, "the next panel of P");
                cr_expect_eq(has, !big, "case %zu, %s, L2 %s", i, ti ? "avx2" : "avx512",
                             big ? "8 MiB" : "256 KiB");
                if (!big)
                    cr_expect(source_has(&b, &s, cases[i].want[ti]), "case %zu, %s: %s", i,
                              ti ? "avx2" : "avx512", cases[i].want[ti]);
                check_schedule(&b, &s, cases[i].wl);
                built_free(&b);
            }
}

Test(codegen_cpu, rows_vec_reduce_sum_odd_lengths)
{
    check_rows_vec("reduce_sum", "tlm_reduce_row(x", false);
}

Test(codegen_cpu, rows_vec_reduce_mean_odd_lengths)
{
    check_rows_vec("reduce_mean", "tlm_reduce_row(x", false);
}

Test(codegen_cpu, rows_vec_reduce_max_odd_lengths)
{
    check_rows_vec("reduce_max", "tlm_reduce_row(x", false);
}

/* Long streamed rows (past L1: prefetch into L2; a row's end in a partial line), odd row
 * counts (3, 5, 7), both ISAs. */
Test(codegen_cpu, rows_vec_streamed_long_rows)
{
    static const char *const wls[] = {
        "{\"op\":\"softmax\",\"shape\":{\"R\":5,\"C\":50257}}",
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":7,\"C\":40961}}",
        "{\"op\":\"rms_norm\",\"shape\":{\"R\":3,\"C\":65537},\"eps\":1e-6}",
    };
    check_small_l3_defaults(wls, 3, false);
}

/* The generic (named) target path: portable -march flags, 8 lanes, 16 registers. */
Test(codegen_cpu, avx2_target_dense_and_conv)
{
    built b = build("{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8}}", "cpu:avx2");
    cr_expect_str_eq(b.t.name, "cpu:avx2");
    cr_expect_eq(b.sp->tgt.cpu.vector_lanes, 8);
    bool runs = target_host_can_run(&b.t);
    built_free(&b);
    if (!runs) cr_skip_test("this host cannot run x86-64-v3 code");
    check_family("{\"op\":\"dense\",\"shape\":{\"M\":40,\"N\":48,\"K\":24},"
                 "\"epilogue\":[\"bias_add\",\"relu\"]}",
                 "cpu:avx2", 6);
    check_family("{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":11,\"W\":11,\"F\":16,"
                 "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1],\"layout\":\"NHWC\"}",
                 "cpu:avx2", 6);
}

/* A wrong kernel must be caught: the harness itself is tested once, so that a generator bug
 * cannot hide behind a check that always passes. */
/* Activations on the values where their fast forms go wrong first (infinities, NaN, huge and
 * tiny magnitudes, signed zeros): silu multiplies by tlm_rcp1 (a Newton reciprocal, no
 * divide), sigmoid and gelu divide; each matches the reference's formula in double (within
 * 1e-6 relative, or for gelu 2.5e-7 min(|x|, 8) absolute: its erf is a rational function good
 * to 5e-7, and exactly +-1 beyond |x| = 5.54 (3.92 sqrt 2), so a huge negative x gives 0, not
 * a huge value times erf's last ulp), NaN and infinities included (silu(-inf) and gelu(-inf)
 * are NaN there); scalar and vector code, both ISAs. */
static double ref_act(const char *f, double x)
{
    if (!strcmp(f, "silu")) return x / (1.0 + exp(-x));
    if (!strcmp(f, "sigmoid")) return 1.0 / (1.0 + exp(-x));
    return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
}

Test(codegen_cpu, activations_keep_special_values)
{
    static const float xs[] = {0.0f,   -0.0f,   1.0f,    -1.0f,  0.5f,     -3.25f,    10.0f,
                               -10.0f, 30.0f,   -30.0f,  87.0f,  -87.0f,   88.5f,     -88.5f,
                               100.0f, -100.0f, 1e10f,   -1e10f, 1e30f,    -1e30f,    3e38f,
                               -3e38f, 1e-30f,  -1e-30f, 1e-40f, INFINITY, -INFINITY, NAN};
    enum { NX = sizeof xs / sizeof xs[0], N = 64 };
    static const char *const fns[] = {"silu", "sigmoid", "gelu"};
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (int fi = 0; fi < 3; fi++)
        for (int ti = 0; ti < 2; ti++)
            for (int vec = 0; vec < 2; vec++) {
                char wl[160];
                snprintf(wl, sizeof wl,
                         "{\"op\":\"elementwise\",\"shape\":{\"N\":%d},\"epilogue\":[\"%s\"]}", N,
                         fns[fi]);
                built b = build(wl, tgs[ti]);
                space_sched s;
                space_default(b.sp, &s);
                for (int i = 0; i < b.sp->n_slot; i++)
                    if (b.sp->slot[i].kind == SLOT_VECTORIZE) s.v[i] = vec;
                tlm_error err;
                tlm_err_clear(&err);
                cg_kernel k;
                cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
                char so[128], flags[160];
                snprintf(so, sizeof so, "%s/act%d-%d-%d.so", g_dir, fi, ti, vec);
                snprintf(flags, sizeof flags, "-O2 %s", target_cc_flags(&b.t));
                cr_assert_eq(tc_cc_compile(k.source, flags, so, NULL, &err), 0, "%s", err.msg);
                void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
                cr_assert_not_null(h, "%s", dlerror());
                void (*fn)(const float *, float *) =
                    (void (*)(const float *, float *))dlsym(h, k.entry);
                cr_assert_not_null(fn);
                float in[N], out[N];
                for (int i = 0; i < N; i++)
                    in[i] = xs[i % NX];
                fn(in, out);
                for (int i = 0; i < N; i++) {
                    double want = ref_act(fns[fi], (double)in[i]);
                    double got = out[i];
                    const char *what = fns[fi];
                    if (isnan(want)) {
                        cr_expect(isnan(got), "%s(%g) on %s vec %d: %g, want NaN", what, in[i],
                                  tgs[ti], vec, got);
                    } else if (isinf(want)) {
                        cr_expect(got == want, "%s(%g) on %s vec %d: %g, want %g", what, in[i],
                                  tgs[ti], vec, got, want);
                    } else {
                        double tol = fmax(1e-6 * fabs(want),
                                          2.5e-7 * fmin(fabs((double)in[i]), 8.0) + 1e-30);
                        cr_expect(fabs(got - want) <= tol, "%s(%.9g) on %s vec %d: %.9g, want %.9g",
                                  what, in[i], tgs[ti], vec, got, want);
                    }
                }
                dlclose(h);
                unlink(so);
                cg_kernel_free(&k);
                built_free(&b);
            }
}

typedef void (*packed_fn)(void *const *args);

/* Compiles kernel k (-O2 and target t's flags) into g_dir/<tag>.so and loads its packed entry;
 * *h and so (its path) are for dlclose and unlink. */
static packed_fn load_packed(const cg_kernel *k, const target *t, const char *tag, void **h,
                             char *so, size_t cap)
{
    char flags[160], sym[96];
    tlm_error err;
    tlm_err_clear(&err);
    snprintf(so, cap, "%s/%s.so", g_dir, tag);
    snprintf(flags, sizeof flags, "-O2 %s", target_cc_flags(t));
    cr_assert_eq(tc_cc_compile(k->source, flags, so, NULL, &err), 0, "%s", err.msg);
    *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(*h, "%s", dlerror());
    snprintf(sym, sizeof sym, "%s_packed", k->entry);
    packed_fn fn = (packed_fn)dlsym(*h, sym);
    cr_assert_not_null(fn, "%s: no %s", so, sym);
    return fn;
}

/* The default schedule's kernel, which must contain needle (e.g. the vectorised rows code). */
static void default_kernel(const built *b, const char *needle, cg_kernel *k)
{
    space_sched s;
    space_default(b->sp, &s);
    tlm_error err;
    tlm_err_clear(&err);
    cr_assert_eq(cg_generate(b->sp, &s, NULL, k, &err), 0, "%s", err.msg);
    cr_assert(strstr(k->source, needle) != NULL, "not the expected kernel: no %s", needle);
}

/* A rows op's default kernel (needle: its row function) on tg, streamed (small_l3) or not as
 * asked, built and loaded: its packed entry; rows_loaded_free undoes it all. */
typedef struct {
    built b;
    cg_kernel k;
    void *h;
    char so[128];
} rows_loaded;

static packed_fn rows_load_default(const char *wl, const char *tg, bool streamed,
                                   const char *needle, const char *tag, rows_loaded *r)
{
    r->b = build(wl, tg);
    if (streamed) small_l3(&r->b);
    default_kernel(&r->b, needle, &r->k);
    cr_assert_eq(rows_streamed(r->k.source), streamed, "%s on %s", wl, tg);
    return load_packed(&r->k, &r->b.t, tag, &r->h, r->so, sizeof r->so);
}

static void rows_loaded_free(rows_loaded *r)
{
    dlclose(r->h);
    unlink(r->so);
    cg_kernel_free(&r->k);
    built_free(&r->b);
}

/* The vectorised softmax (tlm_vexp_neg: one ln2 constant and a degree-5 polynomial) is
 * accurate element by element, not only relative to the row's largest value as the harness
 * checks: each output within 1e-6 of the double-precision softmax relatively (1e-30
 * absolutely for outputs below 1e-30), on rows whose x - max spans 0 to -100 with -inf
 * (masked logits) and values past exp's float range; an odd length (vector tail) on both
 * ISAs, plain and streamed stores. */
Test(codegen_cpu, softmax_accurate_per_element)
{
    enum { R = 8, C = 1531 }; /* 49 KB: streamed under small_l3 */
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (int ti = 0; ti < 2; ti++)
        for (int st = 0; st < 2; st++) {
            char wl[96];
            snprintf(wl, sizeof wl, "{\"op\":\"softmax\",\"shape\":{\"R\":%d,\"C\":%d}}", R, C);
            char tag[32];
            snprintf(tag, sizeof tag, "softmax%d-%d", ti, st);
            rows_loaded rl;
            packed_fn fn = rows_load_default(wl, tgs[ti], st, "tlm_softmax_row(x", tag, &rl);
            const size_t bytes = (sizeof(float) * R * C + 63) / 64 * 64;
            float *x = aligned_alloc(64, bytes), *y = aligned_alloc(64, bytes);
            cr_assert(x && y);
            for (int r = 0; r < R; r++)
                for (int c = 0; c < C; c++) /* row r's max 3 - r at c = 0; down to -97 - r */
                    x[r * C + c] = c % 97 == 50 ? -INFINITY
                                                : (float)(3 - r) - (float)(c % 1000) * 0.1f;
            fn((void *const[]){x, y});
            int bad = 0;
            for (int r = 0; r < R; r++) {
                double m = -INFINITY, sum = 0;
                for (int c = 0; c < C; c++) m = fmax(m, (double)x[r * C + c]);
                for (int c = 0; c < C; c++) sum += exp((double)x[r * C + c] - m);
                for (int c = 0; c < C; c++) {
                    double want = exp((double)x[r * C + c] - m) / sum, got = y[r * C + c];
                    double tol = want < 1e-30 ? 1e-30 : 1e-6 * want;
                    if (!(fabs(got - want) <= tol) && bad++ < 5)
                        cr_expect(0, "%s%s: softmax[%d][%d] (x - max %.3g) = %.9g, want %.9g",
                                  tgs[ti], st ? " streamed" : "", r, c, (double)x[r * C + c] - m,
                                  got, want);
                }
            }
            cr_expect_eq(bad, 0, "%s%s: %d outputs off", tgs[ti], st ? " streamed" : "", bad);
            free(x);
            free(y);
            rows_loaded_free(&rl);
        }
}

static void scratch_fill(float *x, int64_t n, uint64_t seed);

/* layer_norm takes a row's moments in one pass, shifted by the mean of its first vector
 * (tlm_row_shift): on rows far from 0 relative to their spread (offsets 1000 and -3000, spread
 * 0.05, where the unshifted E[x^2] - E[x]^2 has no correct digit left) every output is within
 * 2e-3 of the double-precision two-pass layer_norm of the same float inputs, plus what the
 * rounding of a float mean of 1000 or 3000 moves it (a few 1e-3 here); a row whose first
 * element is an outlier (100 spreads off) and a constant row (variance 0: output = beta) too.
 * An odd length (tails on both ISAs) and a 4096-float row, plain and streamed (the moments
 * carried beside the row before), both ISAs. */
Test(codegen_cpu, layer_norm_moments_far_from_zero)
{
    enum { R = 16 }; /* 49 KB and more: streamed under small_l3 */
    static const int cs[] = {771, 4096};
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (int ci = 0; ci < 2; ci++)
        for (int ti = 0; ti < 2; ti++)
            for (int st = 0; st < 2; st++) {
                const int C = cs[ci];
                char wl[96];
                snprintf(wl, sizeof wl, "{\"op\":\"layer_norm\",\"shape\":{\"R\":%d,\"C\":%d}}",
                         R, C);
                char tag[48];
                snprintf(tag, sizeof tag, "lnfar%d-%d-%d", ci, ti, st);
                rows_loaded rl;
                packed_fn fn =
                    rows_load_default(wl, tgs[ti], st, "tlm_layer_norm_row(x", tag, &rl);
                const size_t bytes = (sizeof(float) * R * C + 63) / 64 * 64;
                float *x = aligned_alloc(64, bytes), *y = aligned_alloc(64, bytes);
                float *g = malloc(sizeof(float) * C), *be = malloc(sizeof(float) * C);
                cr_assert(x && y && g && be);
                scratch_fill(x, (int64_t)R * C, 11);
                scratch_fill(g, C, 12);
                scratch_fill(be, C, 13);
                for (int r = 0; r < R; r++)
                    for (int c = 0; c < C; c++) {
                        const float off = r % 2 ? -3000.0f : 1000.0f;
                        x[r * C + c] = r == 4 ? 7.25f : off + 0.05f * x[r * C + c];
                    }
                x[0] += 5.0f; /* row 0's first element 100 spreads off */
                fn((void *const[]){x, g, be, y});
                int bad = 0;
                for (int r = 0; r < R; r++) {
                    double m = 0, v = 0;
                    for (int c = 0; c < C; c++) m += x[r * C + c];
                    m /= C;
                    for (int c = 0; c < C; c++) v += (x[r * C + c] - m) * (x[r * C + c] - m);
                    v /= C;
                    const double s = 1.0 / sqrt(v + (double)(float)1e-5);
                    for (int c = 0; c < C; c++) {
                        const double want = (x[r * C + c] - m) * s * g[c] + be[c];
                        const double got = y[r * C + c];
                        /* and the float mean's own rounding, which any float kernel has */
                        const double ulp = ldexp(1.0, ilogb(fabs(m) + 1.0) - 23);
                        const double tol = 2e-3 + 2.0 * ulp * s * fabs(g[c]);
                        if (!(fabs(got - want) <= tol) && bad++ < 5)
                            cr_expect(0, "%s %s%s: y[%d][%d] = %.7g, want %.7g", wl, tgs[ti],
                                      st ? " streamed" : "", r, c, got, want);
                    }
                }
                cr_expect_eq(bad, 0, "%s %s%s: %d outputs off", wl, tgs[ti], st ? " streamed" : "",
                             bad);
                free(x);
                free(y);
                free(g);
                free(be);
                rows_loaded_free(&rl);
            }
}

/* Streamed (DRAM-sized) norms on an AMD target take each row's sum beside the previous row's
 * last pass (tlm_norm_out), in the same chunks and order as the pass of its own that a
 * thread's first row takes: so the output does not depend on how the rows are split among
 * threads (1, 2 or 3 threads give the same bits). On an Intel target and the generic ones
 * they take their sums in a pass of their own, still streamed; the same bits across threads
 * there too. Odd lengths (a vector tail, rows whose lines straddle), both ISAs; a cached
 * output takes its sums in their own pass (no carry) on any vendor. */
static void set_vendor(built *b, const char *v)
{
    snprintf(b->t.cpu.vendor, sizeof b->t.cpu.vendor, "%s", v);
    snprintf(b->sp->tgt.cpu.vendor, sizeof b->sp->tgt.cpu.vendor, "%s", v);
}

Test(codegen_cpu, streamed_norms_sum_beside_the_row_before)
{
    static const char *const wls[] = {
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":29,\"C\":771}}",
        "{\"op\":\"rms_norm\",\"shape\":{\"R\":31,\"C\":515}}",
        "{\"op\":\"layer_norm\",\"shape\":{\"R\":9,\"C\":4096}}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    /* the vendor the target names ("": as built; a generic target names none) */
    static const char *const vendors[] = {"AuthenticAMD", "GenuineIntel", ""};
    for (int w = 0; w < 3; w++)
        for (int vi = 0; vi < 3; vi++)
            for (int ti = 0; ti < 2; ti++) {
                built b = build(wls[w], tgs[ti]);
                if (vendors[vi][0]) set_vendor(&b, vendors[vi]);
                const bool beside = !strcmp(b.sp->tgt.cpu.vendor, "AuthenticAMD");
                cg_kernel k;
                default_kernel(&b, "_norm_row(x, y", &k);
                cr_expect(strstr(k.source, "&cy);") == NULL, "%s on %s: carried in the caches",
                          wls[w], tgs[ti]);
                cg_kernel_free(&k);
                small_l3(&b);
                space_sched s;
                space_default(b.sp, &s);
                for (int sl = 0; sl < b.sp->n_slot; sl++)
                    if (b.sp->slot[sl].kind == SLOT_PARALLEL) s.v[sl] = 1;
                tlm_error err;
                cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
                cr_assert((strstr(k.source, "&cy);") != NULL) == beside, "%s on %s (%s): %s", wls[w],
                          tgs[ti], b.sp->tgt.cpu.vendor, beside ? "no carry" : "carried");
                cr_assert(strstr(k.source, ", pf, 1, ") != NULL, "%s on %s (%s): not streamed",
                          wls[w], tgs[ti], b.sp->tgt.cpu.vendor);
                cr_assert(strstr(k.source, "#pragma omp for") != NULL);
                char so[128], tag[48];
                void *h;
                snprintf(tag, sizeof tag, "norm%d-%d-%d", w, vi, ti);
            packed_fn fn = load_packed(&k, &b.t, tag, &h, so, sizeof so);
            int ins[IR_MAX_TENSORS];
            const int n_in = ir_subgraph_inputs(b.g, ins);
            cr_assert(n_in >= 1 && n_in <= 3);
            const int64_t n_out = ir_tensor_numel(&b.g->tensor[b.g->output]);
            void *args[4];
            for (int a = 0; a < n_in; a++) {
                const int64_t n = ir_tensor_numel(&b.g->tensor[ins[a]]);
                float *x = aligned_alloc(64, (size_t)(n * 4 + 63) / 64 * 64);
                cr_assert_not_null(x);
                scratch_fill(x, n, 7 + (uint64_t)a);
                for (int64_t e = 0; e < n; e++) x[e] = x[e] * 3.0f + 1.5f;
                args[a] = x;
            }
            float *y[3];
            for (int t = 0; t < 3; t++) {
                y[t] = aligned_alloc(64, (size_t)(n_out * 4 + 63) / 64 * 64);
                cr_assert_not_null(y[t]);
                args[n_in] = y[t];
                omp_set_num_threads(t + 1);
                fn((void *const *)args);
            }
            omp_set_num_threads(omp_get_num_procs());
            for (int t = 1; t < 3; t++)
                cr_expect(memcmp(y[0], y[t], (size_t)n_out * 4) == 0,
                          "%s on %s: %d threads differ from one", wls[w], tgs[ti], t + 1);
            check_schedule(&b, &s, wls[w]); /* and against the reference */
            for (int a = 0; a < n_in; a++) free(args[a]);
            for (int t = 0; t < 3; t++) free(y[t]);
            dlclose(h);
            unlink(so);
            cg_kernel_free(&k);
            built_free(&b);
        }
}

/* Max reductions keep a NaN once seen, as the reference does (v > acc || isnan(v)): every
 * output the reference makes NaN is NaN and the others equal it. Inputs with a few NaNs
 * (first, middle and last elements and one more), kernels run directly (the harness treats
 * any NaN output as wrong). Max pools in the window sketch (separable 5x5 stride 1, 3x3
 * stride 2) and in the tile sketch (NHWC), row reductions (vectorised and scalar: the
 * generic rows code) and softmax; each vector axis value of the schedule (scalar and
 * vector), both ISAs. */
Test(codegen_cpu, max_reductions_keep_nan)
{
    static const char *const wls[] = {
        "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":9,\"W\":21,\"KH\":5,\"KW\":5},"
        "\"stride\":[1,1],\"pad\":[2,2]}",
        "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":11,\"W\":41,\"KH\":3,\"KW\":3},"
        "\"stride\":[2,2],\"pad\":[1,1]}",
        "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":9,\"W\":9,\"KH\":3,\"KW\":3},"
        "\"stride\":[1,1],\"pad\":[1,1],\"layout\":\"NHWC\"}",
        "{\"op\":\"reduce_max\",\"shape\":{\"R\":6,\"C\":77}}",
        "{\"op\":\"softmax\",\"shape\":{\"R\":5,\"C\":40}}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    int runs = 0;
    for (size_t wi = 0; wi < sizeof wls / sizeof wls[0]; wi++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(wls[wi], tgs[ti]);
            int vs = -1;
            for (int i = 0; i < b.sp->n_slot; i++)
                if (b.sp->slot[i].kind == SLOT_VECTORIZE) vs = i;
            space_sched s;
            space_default(b.sp, &s);
            int64_t vals[SPACE_MAX_VALUES];
            int nv = vs >= 0 ? space_legal_values(b.sp, vs, &s, vals) : 1;
            for (int vi = 0; vi < nv; vi++) {
                space_sched v = s;
                if (vs >= 0) v.v[vs] = vals[vi];
                tlm_error err;
                tlm_err_clear(&err);
                if (space_check(b.sp, &v, &err)) continue;
                cg_kernel k;
                cr_assert_eq(cg_generate(b.sp, &v, NULL, &k, &err), 0, "%s", err.msg);
                char so[128], tag[48];
                void *h;
                snprintf(tag, sizeof tag, "nan%zu-%d-%d", wi, ti, vi);
                packed_fn fn = load_packed(&k, &b.t, tag, &h, so, sizeof so);
                int idx[IR_MAX_TENSORS];
                int nin = ir_subgraph_inputs(b.g, idx);
                void *args[IR_MAX_TENSORS + 1];
                uint64_t seed = 77 + wi;
                for (int a = 0; a < nin; a++) {
                    int64_t n = ir_tensor_numel(&b.g->tensor[idx[a]]);
                    float *x = aligned_alloc(64, (size_t)(n * 4 + 63) / 64 * 64);
                    scratch_fill(x, n, seed + (uint64_t)a);
                    const int64_t at[4] = {0, n / 2, n - 1, n / 3 + 1};
                    for (int j = 0; j < 4; j++) x[at[j]] = NAN;
                    args[a] = x;
                }
                const int64_t no = ir_tensor_numel(&b.g->tensor[b.g->output]);
                float *y = aligned_alloc(64, (size_t)(no * 4 + 63) / 64 * 64);
                double *want = malloc(sizeof(double) * (size_t)no);
                cr_assert(y && want);
                args[nin] = y;
                fn(args);
                cr_assert_eq(ir_interp_run_f64(b.g, (const float *const *)args, want, NULL), 0);
                int bad = 0, nans = 0;
                for (int64_t j = 0; j < no; j++) {
                    nans += isnan(want[j]) != 0;
                    const bool ok = isnan(want[j]) ? isnan(y[j]) != 0
                                                   : fabs((double)y[j] - want[j]) <=
                                                         1e-5 * fmax(1.0, fabs(want[j]));
                    if (!ok && bad++ < 3)
                        cr_expect(0, "%s on %s, vector axis %lld: out[%lld] = %g, want %g",
                                  wls[wi], tgs[ti], (long long)(vs >= 0 ? vals[vi] : -1),
                                  (long long)j, (double)y[j], want[j]);
                }
                cr_expect_eq(bad, 0, "%s on %s: %d outputs off", wls[wi], tgs[ti], bad);
                cr_expect(nans > 0 && nans < no, "%s: %d of %lld outputs NaN", wls[wi], nans,
                          (long long)no);
                runs++;
                for (int a = 0; a <= nin; a++) free(args[a]);
                free(want);
                dlclose(h);
                unlink(so);
                cg_kernel_free(&k);
            }
            built_free(&b);
        }
    cr_expect_geq(runs, 15, "%d kernels run", runs);
    /* a row with +inf and -inf and no NaN: its sum is NaN (the vectorised max's NaN check),
     * its max +inf */
    for (int ti = 0; ti < 2; ti++) {
        built b = build("{\"op\":\"reduce_max\",\"shape\":{\"R\":2,\"C\":77}}", tgs[ti]);
        cg_kernel k;
        default_kernel(&b, "tlm_reduce_row(x", &k);
        char so[128], tag[32];
        void *h;
        snprintf(tag, sizeof tag, "naninf%d", ti);
        packed_fn fn = load_packed(&k, &b.t, tag, &h, so, sizeof so);
        float x[2 * 77] __attribute__((aligned(64))), y[16] __attribute__((aligned(64))) = {0};
        scratch_fill(x, 2 * 77, 5);
        x[5] = INFINITY, x[9] = -INFINITY, x[77 + 3] = -INFINITY;
        void *args[2] = {x, y};
        fn(args);
        cr_expect(isinf(y[0]) && y[0] > 0, "%s: max of a row with +-inf = %g", tgs[ti],
                  (double)y[0]);
        float m = -INFINITY;
        for (int i = 77; i < 2 * 77; i++) m = x[i] > m ? x[i] : m;
        cr_expect_eq(y[1], m, "%s: %g, want %g", tgs[ti], (double)y[1], (double)m);
        dlclose(h);
        unlink(so);
        cg_kernel_free(&k);
        built_free(&b);
    }
}

/* The call buffers a kernel fills per call (its padded input copy, its packed weights) stay
 * with the loaded kernel between calls (codegen's scratch_slots): the second and third calls,
 * on other inputs, and two threads calling at once on their own inputs, each still give the
 * reference's output. Both ISAs; a padded conv vectorised along F (copied padding and weights
 * packed once per call: one slot each) and a softmax of 50257-wide rows streamed out of two
 * scratch rows per thread (one slot per thread in the team). */
typedef struct {
    void (*fn)(void *const *);
    void *args[IR_MAX_TENSORS];
    int reps;
} scratch_call;

static void *scratch_calls(void *p)
{
    scratch_call *c = p;
    for (int i = 0; i < c->reps; i++) c->fn(c->args);
    return NULL;
}

static void scratch_fill(float *x, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(seed >> 40) / (double)(1ull << 24) * 2.0 - 1.0);
    }
}

static double scratch_err(const float *got, const double *want, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs((double)got[i] - want[i]));
        den = fmax(den, fabs(want[i]));
    }
    return num / (den > 0 ? den : 1);
}

Test(codegen_cpu, call_buffers_kept_across_calls)
{
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    static const struct {
        const char *wl, *needle;
    } cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":7,\"H\":11,\"W\":11,\"F\":24,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
         "tlm_scratch_take(1,"},
        {"{\"op\":\"softmax\",\"shape\":{\"R\":9,\"C\":50257}}",
         "tlm_scratch_take(omp_get_thread_num(),"},
    };
    for (int ci = 0; ci < 2; ci++)
        for (int ti = 0; ti < 2; ti++) {
            const char *wl = cases[ci].wl;
            built b = build(wl, tgs[ti]);
            space_sched s;
            if (ci == 0) {
                space_default_vectorized(b.sp, 3, &s);
            } else {
                small_l3(&b); /* streamed rows */
                space_default(b.sp, &s);
            }
            tlm_error err;
            tlm_err_clear(&err);
            cg_kernel k;
            cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
            cr_assert_not_null(strstr(k.source, cases[ci].needle), "%s: %s: no %s", wl, tgs[ti],
                               cases[ci].needle);
            char so[128], tag[32];
            void *h;
            snprintf(tag, sizeof tag, "scratch%d-%d", ci, ti);
            packed_fn fn = load_packed(&k, &b.t, tag, &h, so, sizeof so);
            int in[IR_MAX_TENSORS];
            int nin = ir_subgraph_inputs(b.g, in);
            cr_assert_lt(nin, IR_MAX_TENSORS);
            int64_t nout = ir_tensor_numel(&b.g->tensor[b.g->output]);
            /* three input sets, each with its reference */
            float *x[3][IR_MAX_TENSORS], *y[3];
            double *want[3];
            for (int set = 0; set < 3; set++) {
                for (int i = 0; i < nin; i++) {
                    int64_t n = ir_tensor_numel(&b.g->tensor[in[i]]);
                    x[set][i] = malloc(sizeof(float) * (size_t)n);
                    cr_assert_not_null(x[set][i]);
                    scratch_fill(x[set][i], n, 1000u * (uint64_t)set + (uint64_t)i + 1);
                }
                y[set] = calloc((size_t)nout, sizeof(float));
                want[set] = malloc(sizeof(double) * (size_t)nout);
                cr_assert(y[set] && want[set]);
                cr_assert_eq(ir_interp_run_f64(b.g, (const float *const *)x[set], want[set], &err),
                             0, "%s", err.msg);
            }
            /* one after another: each call overwrites what the last one left in the buffers */
            for (int set = 0; set < 3; set++) {
                void *args[IR_MAX_TENSORS];
                for (int i = 0; i < nin; i++)
                    args[i] = x[set][i];
                args[nin] = y[set];
                fn(args);
                double e = scratch_err(y[set], want[set], nout);
                cr_expect(e < 1e-5, "%s: %s: call %d: rel err %g", wl, tgs[ti], set, e);
            }
            /* two threads at once, 20 calls each: one of them finds a slot empty and allocates */
            scratch_call c[2];
            pthread_t th[2];
            for (int t = 0; t < 2; t++) {
                memset(y[t + 1], 0, sizeof(float) * (size_t)nout);
                c[t] = (scratch_call){.fn = fn, .reps = 20};
                for (int i = 0; i < nin; i++)
                    c[t].args[i] = x[t + 1][i];
                c[t].args[nin] = y[t + 1];
                cr_assert_eq(pthread_create(&th[t], NULL, scratch_calls, &c[t]), 0);
            }
            for (int t = 0; t < 2; t++)
                pthread_join(th[t], NULL);
            for (int t = 0; t < 2; t++) {
                double e = scratch_err(y[t + 1], want[t + 1], nout);
                cr_expect(e < 1e-5, "%s: %s: thread %d: rel err %g", wl, tgs[ti], t, e);
            }
            dlclose(h);
            unlink(so);
            for (int set = 0; set < 3; set++) {
                for (int i = 0; i < nin; i++)
                    free(x[set][i]);
                free(y[set]);
                free(want[set]);
            }
            cg_kernel_free(&k);
            built_free(&b);
        }
}

/* A slot value a test asks for: slots of this kind (axis and level too for tiles; -1: any). */
typedef struct {
    space_slot_kind kind;
    int axis, level;
    int64_t v;
} want_rule;

/* s with every slot after VECTORIZE set, in order, to the value the last matching rule asks
 * for where that value is legal given the slots before it, else to the first legal value. */
static void force_slots(const space *sp, space_sched *s, const want_rule *rules, int n_rules)
{
    int64_t vals[SPACE_MAX_VALUES];
    for (int i = 1; i < sp->n_slot; i++) {
        const space_slot *sl = &sp->slot[i];
        int64_t want = s->v[i];
        for (int r = 0; r < n_rules; r++)
            if (rules[r].kind == sl->kind && (rules[r].axis < 0 || rules[r].axis == sl->axis) &&
                (rules[r].level < 0 || rules[r].level == sl->level))
                want = rules[r].v;
        int n = space_legal_values(sp, i, s, vals);
        int64_t pick = vals[0];
        for (int q = 0; q < n; q++)
            if (vals[q] == want) pick = want;
        s->v[i] = pick;
    }
}

/* b's default with VECTORIZE = vec and the rules forced (force_slots), asserted packed. */
static space_sched forced_packed(const built *b, int64_t vec, const want_rule *rules, int n_rules,
                                 const char *wl)
{
    space_sched s;
    space_default(b->sp, &s);
    s.v[0] = vec;
    force_slots(b->sp, &s, rules, n_rules);
    cr_assert_eq(space_get(b->sp, &s, SLOT_PACK, 0), 1, "%s on %s: packed", wl, b->t.name);
    return s;
}

/* The kernel of s carries the pack form named by needle, and matches the reference. */
static void check_pack_form(built *b, const space_sched *s, const char *wl, const char *needle)
{
    cr_expect(source_has(b, s, needle), "%s on %s: no '%s'", wl, b->t.name, needle);
    check_schedule(b, s, wl);
    built_free(b);
}

/* A conv along F packs its weights by transposing W x W blocks in registers: the flattened
 * (c, kh, kw) run of a chunk is contiguous in the weights (5 channels x 9 taps = 45: whole
 * blocks and a tail of 13 on AVX-512, 5 on AVX2; all 10 channels: 90); so does a batched
 * Bᵀ (its batch a packed axis too), 45 columns padded to 48 (the rows past them clamped).
 * Checked against the reference on both ISAs, padded and strided. */
Test(codegen_cpu, weight_packs_transpose_in_registers)
{
    static const char *const wls[] = {
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":10,\"H\":9,\"W\":9,\"F\":32,\"KH\":3,"
        "\"KW\":3},"
        "\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":10,\"H\":11,\"W\":8,\"F\":45,\"KH\":3,"
        "\"KW\":3},"
        "\"stride\":[2,2]}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    static const int64_t chunks[] = {5, 10};
    for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++)
        for (int t = 0; t < 2; t++)
            for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
                built b = build(wls[w], tgs[t]);
                const int ns = b.sp->n_spatial; /* n, f, oh, ow; then c, kh, kw */
                const want_rule rules[] = {
                    {SLOT_TILE, -1, -1, 1},
                    {SLOT_TILE, 1, 3, 16},
                    {SLOT_TILE, 3, 3, 2},
                    {SLOT_TILE, ns, 1, chunks[ci]},
                    {SLOT_TILE, ns + 1, 1, 3},
                    {SLOT_TILE, ns + 2, 1, 3},
                    {SLOT_PACK, -1, -1, 1},
                };
                /* vectors along F */
                space_sched s =
                    forced_packed(&b, ns - 1, rules, sizeof rules / sizeof rules[0], wls[w]);
                cr_assert_eq(space_tile(b.sp, &s, ns, 1), chunks[ci]);
                check_pack_form(&b, &s, wls[w], "transposed, ");
            }
    static const char bt[] =
        "{\"op\":\"batch_matmul\",\"shape\":{\"B\":3,\"M\":5,\"N\":45,\"K\":21},"
        "\"transpose_b\":true}";
    for (int t = 0; t < 2; t++) {
        built b = build(bt, tgs[t]); /* b, i, j; then k */
        const want_rule rules[] = {
            {SLOT_TILE, -1, -1, 1},
            {SLOT_TILE, 2, 3, 16},
            {SLOT_TILE, 1, 3, 2},
            {SLOT_TILE, 0, 2, 3},
            {SLOT_TILE, 3, 1, 21},
            {SLOT_PACK, -1, -1, 1},
        };
        /* vectors along j */
        space_sched s = forced_packed(&b, 1, rules, sizeof rules / sizeof rules[0], bt);
        cr_assert_eq(space_tile(b.sp, &s, 0, 2), 3);
        check_pack_form(&b, &s, bt, "transposed, ");
    }
}

/* A packed operand whose vector axis is padded (45 columns in runs of 16: 16, 16 and a last
 * 13) copies its whole runs without clamping their indices (clamped, GCC copied them by
 * gathers: GPT-2's LM head 2.8x slower) and clamps only the run past the extent; checked
 * against the reference on both ISAs, a GEMM's B and a transposed Bᵀ. */
Test(codegen_cpu, packs_clamp_only_the_ragged_run)
{
    static const char *const wls[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":7,\"N\":45,\"K\":19}}",
        "{\"op\":\"batch_matmul\",\"shape\":{\"B\":2,\"M\":5,\"N\":45,\"K\":11},"
        "\"transpose_b\":true}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++)
        for (int t = 0; t < 2; t++) {
            built b = build(wls[w], tgs[t]);
            const want_rule rules[] = {
                {SLOT_TILE, -1, -1, 1},
                {SLOT_TILE, b.sp->n_spatial - 1, 3, 16},
                {SLOT_TILE, b.sp->n_spatial - 2, 3, 2},
                {SLOT_PACK, -1, -1, 1},
            };
            /* vectors along j */
            space_sched s = forced_packed(&b, 1, rules, sizeof rules / sizeof rules[0], wls[w]);
            cr_assert_eq(space_tile(b.sp, &s, b.sp->n_spatial - 1, 3), 16);
            check_pack_form(&b, &s, wls[w], "if (run_end < 45) {");
        }
}

/* A ragged last block of rows (512 rows in blocks of 6 x 32 = 192: 192, 192, 128) makes the
 * tasks of the last row block short; on 2 cores the contiguous static split leaves one
 * thread idle, so the task loop deals them one at a time. Even blocks (8 x 16 = 128: four
 * whole ones) and a single core keep the plain split. Every kernel is checked. */
Test(codegen_cpu, ragged_task_blocks_are_dealt_one_at_a_time)
{
    const char *wl = "{\"op\":\"dense\",\"shape\":{\"M\":512,\"N\":256,\"K\":32}}";
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu";
        for (int k = 0; k < 3; k++) {
            built b = build(wl, tg);
            int cores = k == 2 ? 1 : 2;
            b.t.cpu.cores = b.sp->tgt.cpu.cores = cores;
            const int64_t rows = k == 1 ? 8 : 6, block = k == 1 ? 16 : 32;
            /* unpacked: a packed B panel is kept across the tasks, whose order then runs the
             * row blocks fastest and shares the ragged one out by itself */
            const want_rule rules[] = {{SLOT_TILE, 0, 3, rows},
                                       {SLOT_TILE, 0, 2, block},
                                       {SLOT_TILE, 1, 2, 1},
                                       {SLOT_PARALLEL, -1, -1, 1},
                                       {SLOT_PACK, -1, -1, 0}};
            space_sched s;
            space_default(b.sp, &s);
            force_slots(b.sp, &s, rules, 5);
            char txt[1024];
            space_print(b.sp, &s, txt, sizeof txt);
            cr_assert(space_tile(b.sp, &s, 0, 3) == rows && space_tile(b.sp, &s, 0, 2) == block,
                      "%s: rows not forced: %s", tg, txt);
            bool dealt = source_has(&b, &s, "schedule(static, 1)");
            cr_expect_eq(dealt, k == 0, "%s, [%s], %d cores: dealt one at a time: %d", tg, txt,
                         cores, dealt);
            check_schedule(&b, &s, wl);
            built_free(&b);
        }
    }
}

/* The first axis the task index decodes (the fastest), e.g. "f" or "ow", into name. */
static void first_task_axis(const built *b, const space_sched *s, char *name, size_t cap)
{
    tlm_error err;
    cg_kernel kn;
    cr_assert_eq(cg_generate(b->sp, s, NULL, &kn, &err), 0, "%s", err.msg);
    const char *r = strstr(kn.source, "int64_t rem = task;");
    r = r ? strstr(r, "const int64_t ") : NULL;
    cr_assert(r != NULL, "no task decode");
    r += strlen("const int64_t ");
    size_t n = 0;
    while (r[n] && r[n] != ' ' && n + 1 < cap) n++;
    snprintf(name, cap, "%.*s", (int)(n - 1), r); /* less the level digit */
    cg_kernel_free(&kn);
}

/* A B panel packed per task is kept by each thread across the tasks that read it: the task
 * index runs the row blocks fastest, the panel is repacked only when the column block
 * changes, and the kernel still matches the reference with ragged row blocks, a K split in
 * chunks (the last one short), one core or two, on both ISAs. Unpacked, or with two column
 * blocks per task (s1 > 1), nothing is kept. */
Test(codegen_cpu, packed_panel_kept_across_tasks)
{
    const char *wl = "{\"op\":\"dense\",\"shape\":{\"M\":77,\"N\":256,\"K\":50},"
                     "\"epilogue\":[\"bias_add\"]}";
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu";
        for (int k = 0; k < 4; k++) {
            built b = build(wl, tg);
            b.t.cpu.cores = b.sp->tgt.cpu.cores = k == 1 ? 1 : 2;
            /* a 64 KiB L2: B (50 KB) is packed per task, not once per call */
            b.t.cpu.l2_bytes = b.sp->tgt.cpu.l2_bytes = 64 << 10;
            const want_rule rules[] = {{SLOT_TILE, 0, 3, 4},
                                       {SLOT_TILE, 1, 3, 16},
                                       {SLOT_TILE, 0, 2, 3},
                                       {SLOT_TILE, 1, 2, 1},
                                       {SLOT_TILE, 1, 1, k == 3 ? 2 : 1},
                                       {SLOT_TILE, 2, 1, 16},
                                       {SLOT_PARALLEL, -1, -1, 1},
                                       {SLOT_PACK, -1, -1, k == 2 ? 0 : 1}};
            space_sched s;
            space_default(b.sp, &s);
            force_slots(b.sp, &s, rules, 8);
            char txt[1024];
            space_print(b.sp, &s, txt, sizeof txt);
            cr_assert(space_get(b.sp, &s, SLOT_PACK, 0) == (k == 2 ? 0 : 1) &&
                          space_tile(b.sp, &s, 1, 1) == (k == 3 ? 2 : 1),
                      "%s: slots not forced: %s", tg, txt);
            const bool kept = k < 2;
            cr_expect_eq(source_has(&b, &s, "K0_key = key;"), kept, "%s [%s]: kept %d", tg, txt,
                         !kept);
            /* the row blocks (i) decoded first (fastest) when the panel is kept (otherwise
             * task_order's traffic rule decides) */
            char first[16];
            first_task_axis(&b, &s, first, sizeof first);
            if (kept) cr_expect_eq(first[0], 'i', "%s [%s]: first decoded %s", tg, txt, first);
            check_schedule(&b, &s, wl);
            built_free(&b);
        }
    }
}

/* A 1x1 stride-2 conv whose input (64 x 56 x 56: 800 KB) outgrows a 256 KiB L2 beside its
 * weights (64 KB), its tasks one register block of filters each, runs those blocks fastest,
 * so each thread reads its share of the input once instead of once per block of filters;
 * with a 4 MiB L2 (everything fits), or as a 3x3 conv (neighbouring tasks share rows), the
 * output plane stays fastest. Every kernel is checked against the reference, both ISAs. */
Test(codegen_cpu, tasks_run_filters_fastest_where_the_input_outgrows_l2)
{
    static const struct {
        int k, pad;
        int64_t l2;
        bool filters_first;
    } cases[] = {{1, 0, 256 << 10, true}, {1, 0, 4 << 20, false}, {3, 1, 256 << 10, false}};
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu:avx512";
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char wl[256];
            snprintf(wl, sizeof wl,
                     "{\"op\":\"conv2d\",\"layout\":\"NCHW\",\"shape\":{\"N\":1,\"C\":64,"
                     "\"H\":56,\"W\":56,\"F\":256,\"KH\":%d,\"KW\":%d},\"stride\":[2,2],"
                     "\"pad\":[%d,%d],\"epilogue\":[\"bias_add\"]}",
                     cases[i].k, cases[i].k, cases[i].pad, cases[i].pad);
            built b = build(wl, tg);
            b.t.cpu.cores = b.sp->tgt.cpu.cores = 2;
            b.t.cpu.l2_bytes = b.sp->tgt.cpu.l2_bytes = cases[i].l2;
            /* the default's tiles, one register block of filters a task */
            const want_rule rules[] = {{SLOT_TILE, 1, 2, 1}, {SLOT_TILE, 1, 1, 1}};
            space_sched s;
            space_default(b.sp, &s);
            force_slots(b.sp, &s, rules, 2);
            char txt[1024], first[16];
            space_print(b.sp, &s, txt, sizeof txt);
            /* the premise: one task level, several blocks of filters */
            cr_assert(b.sp->sketch == SKETCH_CPU_TILE && space_tile(b.sp, &s, 1, 0) > 1 &&
                          space_get(b.sp, &s, SLOT_PARALLEL, 0) == 1,
                      "%s %s: not a tile kernel over several filter blocks: %s", tg, wl, txt);
            first_task_axis(&b, &s, first, sizeof first);
            cr_expect_eq(strcmp(first, "f") == 0, cases[i].filters_first,
                         "%s %s, L2 %lld [%s]: first decoded %s", tg, wl,
                         (long long)cases[i].l2, txt, first);
            check_schedule(&b, &s, wl);
            built_free(&b);
        }
    }
}

/* Where one axis other than the vectors' is padded, its last register tile is emitted at its
 * true size, not as a whole tile on clamped indices: a GEMM's 13 rows in tiles of 4 (4, 4, 4
 * and a tile of 1); a block padded above the register tile only (20 rows: 5 tiles in blocks
 * of 2) has no edge version at all; with two padded axes the clamped edge tile stays. Every
 * kernel is checked, both ISAs. */
Test(codegen_cpu, last_register_tile_takes_its_true_size)
{
    static const struct {
        const char *wl;
        int64_t rows, block;
        const char *want, *unwanted;
    } cases[] = {
        {"{\"op\":\"dense\",\"shape\":{\"M\":13,\"N\":64,\"K\":40},\"epilogue\":[\"relu\"]}", 4, 2,
         "the last 1 of i", "tlm_imin(i_b"},
        {"{\"op\":\"dense\",\"shape\":{\"M\":20,\"N\":64,\"K\":40}}", 4, 2, NULL, "the last"},
        {"{\"op\":\"dense\",\"shape\":{\"M\":13,\"N\":61,\"K\":40}}", 4, 2, "tlm_imin(i_b",
         "the last"},
    };
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu";
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            built b = build(cases[k].wl, tg);
            const want_rule rules[] = {{SLOT_TILE, 0, 3, cases[k].rows},
                                       {SLOT_TILE, 0, 2, cases[k].block}};
            space_sched s;
            space_default(b.sp, &s);
            force_slots(b.sp, &s, rules, 2);
            char txt[1024];
            space_print(b.sp, &s, txt, sizeof txt);
            cr_assert(space_tile(b.sp, &s, 0, 3) == cases[k].rows &&
                          space_tile(b.sp, &s, 0, 2) == cases[k].block,
                      "%s: not forced: %s", tg, txt);
            if (cases[k].want)
                cr_expect(source_has(&b, &s, cases[k].want), "%s, [%s]: no \"%s\"", tg, txt,
                          cases[k].want);
            cr_expect(!source_has(&b, &s, cases[k].unwanted), "%s, [%s]: \"%s\"", tg, txt,
                      cases[k].unwanted);
            check_schedule(&b, &s, cases[k].wl);
            built_free(&b);
        }
    }
}

/* A register tile that presses on 32 vector registers loads each step's vector operands once
 * into pinned variables (the AVX-512 GEMM tile: 6 x 4 vectors); a small one (2 rows x 16
 * columns) and every tile on 16 registers (AVX2) keep the plain statements. On the host's ISA
 * and on AVX2; every kernel is checked against the reference. */
Test(codegen_cpu, step_vectors_pinned_where_registers_are_tight)
{
    static const struct {
        const char *wl, *tg;
        bool big; /* the default tile (else forced to 2 x 16) */
    } cases[] = {
        {"{\"op\":\"dense\",\"shape\":{\"M\":60,\"N\":64,\"K\":40},\"epilogue\":[\"relu\"]}",
         "cpu", true},
        {"{\"op\":\"dense\",\"shape\":{\"M\":61,\"N\":32,\"K\":37}}", "cpu:avx2", true},
        {"{\"op\":\"dense\",\"shape\":{\"M\":60,\"N\":64,\"K\":40}}", "cpu", false},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        built b = build(cases[k].wl, cases[k].tg);
        space_sched s;
        space_default(b.sp, &s);
        if (!cases[k].big) {
            const want_rule rules[] = {{SLOT_TILE, 0, 3, 2}, {SLOT_TILE, 1, 3, 16}};
            force_slots(b.sp, &s, rules, 2);
        }
        const bool want = cases[k].big && b.sp->tgt.cpu.vector_registers > 16;
        char txt[1024];
        space_print(b.sp, &s, txt, sizeof txt);
        cr_expect_eq(source_has(&b, &s, "TLM_PIN(v0)"), want, "%s on %s (%d registers) [%s]",
                     cases[k].wl, cases[k].tg, b.sp->tgt.cpu.vector_registers, txt);
        check_schedule(&b, &s, cases[k].wl);
        built_free(&b);
    }
}

/* The vector row's last register tile takes only the vectors its points need: 197 columns in
 * tiles of two vectors (32 floats on AVX-512, 16 on AVX2) end in 5, one vector, whether the
 * rows are ragged too (13 in tiles of 4) or not (12). Every kernel is checked, both ISAs. */
Test(codegen_cpu, last_vector_tile_takes_the_vectors_it_needs)
{
    static const char *const wls[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":13,\"N\":197,\"K\":40},\"epilogue\":[\"relu\"]}",
        "{\"op\":\"dense\",\"shape\":{\"M\":12,\"N\":197,\"K\":40}}",
    };
    for (int ti = 0; ti < 2; ti++) {
        const char *tg = ti ? "cpu:avx2" : "cpu";
        for (size_t k = 0; k < sizeof wls / sizeof wls[0]; k++) {
            built b = build(wls[k], tg);
            const int64_t two = ti ? 16 : 32;
            const want_rule rules[] = {{SLOT_TILE, 0, 3, 4}, {SLOT_TILE, 1, 3, two}};
            space_sched s;
            space_default(b.sp, &s);
            force_slots(b.sp, &s, rules, 2);
            char txt[1024];
            space_print(b.sp, &s, txt, sizeof txt);
            cr_assert(space_tile(b.sp, &s, 0, 3) == 4 && space_tile(b.sp, &s, 1, 3) == two,
                      "%s: not forced: %s", tg, txt);
            cr_expect(source_has(&b, &s, "the last 5 of j"), "%s, [%s]: no narrow last tile", tg,
                      txt);
            check_schedule(&b, &s, wls[k]);
            built_free(&b);
        }
    }
}

/* The innermost reduction loop is unrolled in the source under the unroll slot (steps that
 * divide the chunk, or a remainder loop after them: K = 37 in one chunk), rolled with unroll
 * 0; with 32 vector registers the broadcast operand is read through one base pointer per
 * step, with 16 per point. With 16 registers the steps stay rolled unless the target names an
 * Intel CPU (codegen's source_unroll_pays): each target is tried as Intel's, AMD's and
 * vendorless. Every kernel is checked, both ISAs. */
Test(codegen_cpu, reduction_steps_unrolled_in_the_source)
{
    static const char *const wls[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":12,\"N\":64,\"K\":64},\"epilogue\":[\"bias_add\"]}",
        "{\"op\":\"dense\",\"shape\":{\"M\":12,\"N\":64,\"K\":37}}",
    };
    static const char *const vendors[] = {"GenuineIntel", "AuthenticAMD", ""};
    for (int ti = 0; ti < 2; ti++)
        for (int vi = 0; vi < 3; vi++) {
            const char *tg = ti ? "cpu:avx2" : "cpu";
            for (int w = 0; w < 2; w++)
                for (int un = 0; un < 2; un++) {
                    built b = build(wls[w], tg);
                    snprintf(b.sp->tgt.cpu.vendor, sizeof b.sp->tgt.cpu.vendor, "%s", vendors[vi]);
                    const bool regs32 = b.sp->tgt.cpu.vector_registers > 16;
                    const bool unrolled = un == 1 && (regs32 || vi == 0);
                    const int64_t k1 = w ? 37 : 64;
                    const want_rule rules[] = {{SLOT_TILE, 0, 3, 6},
                                               {SLOT_TILE, 2, -1, k1},
                                               {SLOT_UNROLL, -1, -1, un ? 64 : 0}};
                    space_sched s;
                    space_default(b.sp, &s);
                    force_slots(b.sp, &s, rules, 3);
                    char txt[1024];
                    space_print(b.sp, &s, txt, sizeof txt);
                    cr_assert(space_tile(b.sp, &s, 0, 3) == 6 && space_tile(b.sp, &s, 2, 1) == k1 &&
                                  space_get(b.sp, &s, SLOT_UNROLL, -1) == (un ? 64 : 0),
                              "%s: not forced: %s", tg, txt);
                    cr_expect_eq(source_has(&b, &s, "k1u += "), unrolled, "%s (%s), [%s]: unrolled",
                                 tg, vendors[vi], txt);
                    cr_expect_eq(source_has(&b, &s, "for (int64_t k1 = k1u;"), unrolled && w == 1,
                                 "%s (%s), [%s]: remainder loop", tg, vendors[vi], txt);
                    cr_expect_eq(source_has(&b, &s, "const float *const Lb"), regs32,
                                 "%s (%s), [%s]: base", tg, vendors[vi], txt);
                    if (vi == 0 || w == 0) check_schedule(&b, &s, wls[w]);
                    built_free(&b);
                }
        }
}

/* The rule of thumb with the vectors along F (axis 3 from the last of a conv's n, f, oh, ow),
 * then the rules' slot values where legal. */
static void schedule_along_f(const space *sp, space_sched *s, const want_rule *rules, int n_rules)
{
    space_default_vectorized(sp, 3, s);
    cr_assert_eq(space_get(sp, s, SLOT_VECTORIZE, -1), 3);
    force_slots(sp, s, rules, n_rules);
}

/* Packed operands that many tasks read are packed once per call (the weights of a conv
 * vectorised along F, under every output row), and the epilogue of a block whose vectors run
 * along F runs in place before the block is copied out: checked against the reference with a
 * short last reduction chunk (C = 19, chunks of 16), padded rows, silu and bias, both ISAs. */
Test(codegen_cpu, shared_panels_packed_once_and_epilogue_along_f)
{
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    const char *wl =
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":19,\"H\":13,\"W\":13,"
        "\"F\":32,\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"silu\"]}";
    for (int ti = 0; ti < 2; ti++) {
        built b = build(wl, tgs[ti]);
        space_sched s;
        /* force: the filters' vectors, 5 padded column rows (13 = 5 + 5 + 3), C in chunks of
         * 16, small blocks (39 tasks read the weights), packed */
        static const want_rule rules[] = {
            {SLOT_TILE, 3, 3, 5},       {SLOT_TILE, 0, 2, 1},   {SLOT_TILE, 2, 2, 1},
            {SLOT_TILE, 3, 2, 1},       {SLOT_TILE, 4, -1, 16}, {SLOT_PACK, -1, -1, 1},
            {SLOT_PARALLEL, -1, -1, 1},
        };
        schedule_along_f(b.sp, &s, rules, sizeof rules / sizeof rules[0]);
        cr_assert_eq(space_get(b.sp, &s, SLOT_PACK, -1), 1);
        tlm_error err;
        tlm_err_clear(&err);
        cg_kernel k;
        cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
        char text[2048];
        space_print(b.sp, &s, text, sizeof text);
        cr_expect(strstr(k.source, "packed once") != NULL, "%s: [%s] packs per task", tgs[ti],
                  text);
        cr_expect(strstr(k.source, "c1_n") != NULL, "%s: [%s] no short chunk", tgs[ti], text);
        check_kernel(b.g, &b.t, &k, wl, text);
        cg_kernel_free(&k);
        /* and each task packing its own panels (pack off the table: fewer readers) still
         * agrees: the same schedule with one output row block per task is checked by the
         * families above */
        built_free(&b);
    }
}

typedef struct {
    const char *wl;
    bool copied;
} pad_case;

/* Each case's kernel, both ISAs: copied once with its padding written in (or not) as the case
 * says, with no bound check left when copied and its checks kept when not, and checked
 * against the reference. packed: vectors along OW with the input packed; else vectors along F
 * (along OW, unpacked, for a case that keeps its checks). */
static void expect_padding_copies(const pad_case *cases, size_t n, bool packed)
{
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (size_t ci = 0; ci < n; ci++)
        for (int ti = 0; ti < 2; ti++) {
            built b = build(cases[ci].wl, tgs[ti]);
            space_sched s;
            space_default_vectorized(b.sp, packed || !cases[ci].copied ? 1 : 3, &s);
            /* with vectors along OW: packed, or (unpacked) the single filter's input read in
             * place */
            int64_t vals[SPACE_MAX_VALUES];
            for (int i = 1; i < b.sp->n_slot; i++) {
                if (b.sp->slot[i].kind != SLOT_PACK || (!packed && cases[ci].copied)) continue;
                int nv = space_legal_values(b.sp, i, &s, vals);
                cr_assert(nv > (packed ? 1 : 0), "%s: case %zu: pack slot", tgs[ti], ci);
                s.v[i] = packed ? 1 : vals[0];
                cr_assert_eq(s.v[i], packed ? 1 : 0);
            }
            tlm_error err;
            tlm_err_clear(&err);
            cg_kernel k;
            cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
            char text[2048];
            space_print(b.sp, &s, text, sizeof text);
            if (packed)
                cr_assert(strstr(k.source, "/* pack operand 0 */") != NULL,
                          "%s: case %zu [%s]: no pack", tgs[ti], ci, text);
            bool copied = strstr(k.source, "with its padding written in (0.0f)") != NULL;
            cr_expect_eq(copied, cases[ci].copied, "%s: case %zu [%s]: copied %d", tgs[ti], ci,
                         text, copied);
            /* a copied kernel has no bound check left (no interior test, no checked load or
             * pack); the other keeps them */
            bool checks = strstr(k.source, "(uint64_t)(") != NULL;
            cr_expect_eq(checks, !cases[ci].copied, "%s: case %zu [%s]: bound checks %d", tgs[ti],
                         ci, text, checks);
            check_kernel(b.g, &b.t, &k, cases[ci].wl, text);
            cg_kernel_free(&k);
            built_free(&b);
        }
}

/* A padded conv whose register tile reads its input unpacked (vectors along F) reads a copy
 * of the input with the padding written in, made once per call, instead of bound-checking
 * its border tiles: checked against the reference with symmetric and uneven padding, strides,
 * dilation and a 1-D conv, both ISAs; where the work is small beside the copy (one filter),
 * the kernel keeps its checks. */
Test(codegen_cpu, padding_copied_in_once)
{
    static const pad_case cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":7,\"H\":11,\"W\":11,\"F\":24,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
         true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":5,\"H\":13,\"W\":9,\"F\":17,"
         "\"KH\":5,\"KW\":3},\"stride\":[2,1],\"pad\":[2,1]}",
         true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":6,\"H\":12,\"W\":12,\"F\":32,"
         "\"KH\":3,\"KW\":3},\"pad\":[2,2],\"dilation\":[2,2],\"epilogue\":[\"relu\"]}",
         true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":9,\"H\":1,\"W\":31,\"F\":48,"
         "\"KH\":1,\"KW\":5},\"pad\":[0,2]}",
         true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":15,\"W\":15,\"F\":1,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
         false},
    };
    expect_padding_copies(cases, sizeof cases / sizeof cases[0], false);
}

/* A padded input packed along OW (im2col panels per task) is also copied once with its
 * padding written in when the packs read it 4 times over or more: the pack is then a plain
 * copy, with no bound check left in the kernel (a 3x3 conv from 4 channels to 96 filters,
 * one output row per task). Read about once (a stride-2 1-D conv whose tasks each pack their
 * own columns), the pack keeps its checks. Checked against the reference, both ISAs. */
Test(codegen_cpu, packed_padding_copied_when_read_over)
{
    static const pad_case cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":20,\"W\":20,\"F\":96,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}",
         true},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":1,\"W\":61,\"F\":8,"
         "\"KH\":1,\"KW\":3},\"stride\":[1,2],\"pad\":[0,1]}",
         false},
    };
    expect_padding_copies(cases, sizeof cases / sizeof cases[0], true);
}

/* A block vectorised along F is copied out in W x W tiles transposed in registers; its
 * ragged edges (a block of 48 filters over 40, rows of 21 columns: 16 + 5 on AVX-512,
 * 2 x 8 + 5 on AVX2) go point by point. Checked against the reference with two images,
 * bias and relu, both ISAs. */
Test(codegen_cpu, block_along_f_copied_out_transposed)
{
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    const char *wl = "{\"op\":\"conv2d\",\"shape\":{\"N\":2,\"C\":5,\"H\":9,\"W\":21,"
                     "\"F\":40,\"KH\":3,\"KW\":3},\"pad\":[1,1],\"epilogue\":[\"bias_add\","
                     "\"relu\"]}";
    for (int ti = 0; ti < 2; ti++) {
        built b = build(wl, tgs[ti]);
        space_sched s;
        /* 48 filters in 16-wide rows (one or two vectors), 21 columns in 7 tiles of 3, one
         * block per task */
        static const want_rule rules[] = {
            {SLOT_TILE, 1, 3, 16}, {SLOT_TILE, 1, 2, 3}, {SLOT_TILE, 3, 3, 3}, {SLOT_TILE, 3, 2, 7},
            {SLOT_TILE, 0, 1, 1},  {SLOT_TILE, 1, 1, 1}, {SLOT_TILE, 2, 1, 1}, {SLOT_TILE, 3, 1, 1},
        };
        schedule_along_f(b.sp, &s, rules, sizeof rules / sizeof rules[0]);
        char text[2048];
        space_print(b.sp, &s, text, sizeof text);
        cr_assert_eq(space_tile(b.sp, &s, 1, 2) * space_tile(b.sp, &s, 1, 3), 48, "%s: [%s]",
                     tgs[ti], text);
        cr_assert_eq(space_tile(b.sp, &s, 3, 2) * space_tile(b.sp, &s, 3, 3), 21);
        tlm_error err;
        tlm_err_clear(&err);
        cg_kernel k;
        cr_assert_eq(cg_generate(b.sp, &s, NULL, &k, &err), 0, "%s", err.msg);
        cr_expect(strstr(k.source, "tlm_transpose(r);") != NULL, "%s: [%s] no transposed copy-out",
                  tgs[ti], text);
        check_kernel(b.g, &b.t, &k, wl, text);
        cg_kernel_free(&k);
        built_free(&b);
    }
}

Test(codegen_cpu, harness_catches_a_wrong_kernel)
{
    built b = build("{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8}}", "cpu");
    tlm_error err;
    tlm_err_clear(&err);
    cg_kernel k;
    cr_assert_eq(cg_generate_naive_c(b.g, "tlm_kernel", &k, &err), 0);
    /* drop the last reduction step: "k < 8" becomes "k < 7" */
    char *p = strstr(k.source, "k < 8");
    cr_assert_not_null(p, "naive source has no 'k < 8' loop:\n%s", k.source);
    p[4] = '7';
    char so[128];
    snprintf(so, sizeof so, "%s/wrong.so", g_dir);
    cr_assert_eq(tc_cc_compile(k.source, "-O2", so, NULL, &err), 0, "%s", err.msg);
    measure_opts o;
    measure_opts_init(&o);
    o.check_only = true;
    o.seed = 7;
    measure_result res;
    cr_assert_eq(measure_cpu(b.g, so, "tlm_kernel", &o, &res, &err), 0, "%s", err.msg);
    cr_expect_eq(res.status, MEASURE_WRONG, "status %s", measure_status_name(res.status));
    cg_kernel_free(&k);
    built_free(&b);
}

/* Compiles src for b's target into so and runs the harness on it with check_prepacked:
 * MEASURE_OK when intact (broken 0), else a crash whose detail names `needle` (the check
 * that caught it). */
/* The harness's check (no timing) of so's kernel, with check_prepacked as asked. */
static void harness_check(const built *b, const char *so, bool prepacked, uint64_t seed,
                          measure_result *res)
{
    tlm_error err;
    tlm_err_clear(&err);
    measure_opts o;
    measure_opts_init(&o);
    o.check_only = true;
    o.check_prepacked = prepacked;
    o.seed = seed;
    cr_assert_eq(measure_cpu(b->g, so, "tlm_kernel", &o, res, &err), 0, "%s", err.msg);
}

static void harness_catches(const built *b, const char *src, const char *so, const char *wl,
                            int broken, const char *needle, uint64_t seed)
{
    tlm_error err;
    tlm_err_clear(&err);
    char flags[160];
    snprintf(flags, sizeof flags, "-O2 %s", target_cc_flags(&b->t));
    cr_assert_eq(tc_cc_compile(src, flags, so, NULL, &err), 0, "%s", err.msg);
    measure_result res;
    harness_check(b, so, true, seed, &res);
    if (!broken)
        cr_expect_eq(res.status, MEASURE_OK, "%s on %s: %s %s", wl, b->t.name,
                     measure_status_name(res.status), res.detail);
    else
        cr_expect(res.status == MEASURE_CRASH && strstr(res.detail, needle),
                  "%s on %s, broken %d: %s %s", wl, b->t.name, broken,
                  measure_status_name(res.status), res.detail);
}

/* A kernel a plan may run with its output over its residual (ir_subgraph_inplace_input)
 * is checked that way too by the harness (opts.check_prepacked, on in check_kernel for every
 * schedule above, whose families add residuals to GEMMs, batched GEMMs, pointwise and
 * windowed convs): a kernel that writes its output before it has read the residual there
 * passes run apart and fails in place. Both ISAs. A depthwise conv is not run in place (its
 * row blocks may overlap); the harness caught that on the window families' residuals. */
Test(codegen_cpu, in_place_kernels_checked_by_the_harness)
{
    static const char *const wls[] = {
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":32,\"H\":14,\"W\":14,\"F\":64,\"KH\":1,"
        "\"KW\":1},\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}",
        "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":96,\"K\":40},\"epilogue\":[\"add\"]}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++)
        for (int t = 0; t < 2; t++) {
            built b = build(wls[w], tgs[t]);
            const int ip = ir_subgraph_inplace_input(b.g);
            int in[IR_MAX_TENSORS];
            cr_assert_eq(ip, ir_subgraph_inputs(b.g, in) - 1, "%s: the residual, last input",
                         wls[w]);
            cg_kernel k;
            default_kernel(&b, "void tlm_kernel(", &k);
            /* the two arguments lose restrict; the others keep it */
            cr_assert(strstr(k.source, "const float *res, float *out)"), "%s", wls[w]);
            cr_assert(strstr(k.source, w ? "const float *restrict B" : "const float *restrict Wt"),
                      "%s", wls[w]);
            char so[128];
            snprintf(so, sizeof so, "%s/inplace%zu%d.so", g_dir, w, t);
            for (int broken = 0; broken < 2; broken++) {
                /* broken: the output zeroed before the kernel runs */
                const char *entry = strstr(k.source, "void tlm_kernel(");
                cr_assert_not_null(entry);
                const char *body = strchr(entry, '{');
                cr_assert_not_null(body);
                char zero[160];
                snprintf(zero, sizeof zero, "\n    for (long i = 0; i < %lld; i++) out[i] = 0.0f;",
                         (long long)ir_tensor_numel(&b.g->tensor[b.g->output]));
                size_t at = (size_t)(body + 1 - k.source), n = strlen(k.source);
                char *src = malloc(n + sizeof zero);
                cr_assert_not_null(src);
                memcpy(src, k.source, at);
                strcpy(src + at, broken ? zero : "");
                strcat(src, k.source + at);
                harness_catches(&b, src, so, wls[w], broken, "in place", 11);
                free(src);
                measure_result res;
                harness_check(&b, so, false, 11, &res);
                cr_expect_eq(res.status, MEASURE_OK, "%s on %s, broken %d, run apart: %s %s",
                             wls[w], tgs[t], broken, measure_status_name(res.status), res.detail);
            }
            unlink(so);
            cg_kernel_free(&k);
            built_free(&b);
        }
}

/* A kernel whose packed operands are inputs exports prepack entries (codegen.h); the
 * harness (opts.check_prepacked, on in check_kernel for every schedule above) catches a
 * prepacked entry that still reads the operand it was handed packed: the operand's copy is
 * NaN by then. Both ISAs, a GEMM's B kept across tasks, a conv's weights packed once, and a
 * depthwise conv's along channels (20 channels: a short last block). */
Test(codegen_cpu, prepacked_entries_checked_by_the_harness)
{
    static const char *const wls[] = {
        "{\"op\":\"dense\",\"shape\":{\"M\":32,\"N\":256,\"K\":256}}",
        "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":8,\"W\":8,\"F\":64,\"KH\":3,"
        "\"KW\":3},\"pad\":[1,1]}",
        "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":20,\"H\":7,\"W\":7,\"KH\":5,"
        "\"KW\":5},\"pad\":[2,2],\"epilogue\":[\"bias_add\"]}",
    };
    static const char *const tgs[] = {"cpu", "cpu:avx2"};
    for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++)
        for (int t = 0; t < 2; t++) {
            built b = build(wls[w], tgs[t]);
            cg_kernel k;
            default_kernel(&b, "void tlm_kernel(", &k);
            cr_assert(strstr(k.source, "int tlm_kernel_prepacks("), "%s on %s", wls[w], tgs[t]);
            tlm_error err;
            tlm_err_clear(&err);
            char so[128];
            snprintf(so, sizeof so, "%s/pre%zu%d.so", g_dir, w, t);
            measure_result res;
            /* broken 1: the prepacked entry hands the kernel no packs (it packs the
             * operands itself, from what it was given); 2: the prepack entry packs nothing */
            for (int broken = 0; broken < 3; broken++) {
                char *src = strdup(k.source);
                cr_assert_not_null(src);
                char *p = strstr(src, broken == 1 ? "void tlm_kernel_prepacked("
                                                  : "void tlm_kernel_prepack(");
                cr_assert_not_null(p);
                if (broken == 1) {
                    p = strstr(p, "], pre);");
                    cr_assert_not_null(p);
                    memcpy(p, "], 0  );", 8);
                } else if (broken == 2) {
                    p = strstr(p, "tlm_kernel_prepack_run(k,");
                    cr_assert_not_null(p);
                    p[strlen("tlm_kernel_prepack_run(")] = '9'; /* no such operand */
                }
                harness_catches(&b, src, so, wls[w], broken, "prepacked", 9);
                free(src);
                /* timed as a plan runs it (the weights, input 1, packed once): checked and
                 * timed through the prepacked entry, so unfilled packs are wrong */
                measure_opts c;
                measure_opts_init(&c);
                c.const_args = 1u << 1;
                c.seed = 9;
                c.repeats = 2;
                cr_assert_eq(measure_cpu(b.g, so, "tlm_kernel", &c, &res, &err), 0, "%s",
                             err.msg);
                cr_expect_eq(res.status, broken == 2 ? MEASURE_WRONG : MEASURE_OK,
                             "%s on %s, broken %d: %s %s", wls[w], tgs[t], broken,
                             measure_status_name(res.status), res.detail);
                cr_expect(broken == 2 || res.median_s > 0);
            }
            unlink(so);
            cg_kernel_free(&k);
            built_free(&b);
        }
}

Test(codegen_cpu, generated_source_reads_well)
{
    built b = build("{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":64,\"K\":64}}", "cpu");
    space_sched s;
    space_default(b.sp, &s);
    tlm_error err;
    tlm_err_clear(&err);
    cg_kernel k;
    cr_assert_eq(cg_generate(b.sp, &s, "my_gemm", &k, &err), 0, "%s", err.msg);
    cr_expect_str_eq(k.entry, "my_gemm");
    cr_expect_not_null(strstr(k.source, "void my_gemm("), "typed entry missing");
    cr_expect_not_null(strstr(k.source, "void my_gemm_packed(void *const *args)"));
    char sched[4096];
    space_print(b.sp, &s, sched, sizeof sched);
    cr_expect_not_null(strstr(k.source, sched), "the schedule is not in the source's header");
    char launch[64];
    cg_launch_json(&k, launch, sizeof launch);
    cr_expect_str_eq(launch, "{}");
    cg_kernel_free(&k);

    /* cg_generate refuses a schedule the space does not accept, naming the slot */
    s.v[0] = 5;
    cr_expect_eq(cg_generate(b.sp, &s, NULL, &k, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, b.sp->slot[0].name);
    built_free(&b);
}

/* Pool threads generate code concurrently (tlmd): generation must not share state between
 * calls. Regression: a static buffer in the rows generator let one thread's per-row variable
 * names leak into another thread's softmax source. */
typedef struct {
    const space *sp;
    const space_sched *s;
    char *src;
} gen_job;

static void *gen_many(void *arg)
{
    gen_job *j = arg;
    for (int i = 0; i < 200; i++) {
        cg_kernel k;
        tlm_error e;
        if (cg_generate(j->sp, j->s, NULL, &k, &e)) return NULL;
        if (!j->src)
            j->src = k.source;
        else {
            if (strcmp(j->src, k.source) != 0) {
                cg_kernel_free(&k);
                free(j->src);
                j->src = NULL;
                return NULL;
            }
            cg_kernel_free(&k);
        }
    }
    return j;
}

Test(codegen_cpu, concurrent_generation_is_independent)
{
    static const char *wls[] = {"{\"op\":\"softmax\",\"shape\":{\"R\":8,\"C\":16}}",
                                "{\"op\":\"layer_norm\",\"shape\":{\"R\":8,\"C\":16}}",
                                "{\"op\":\"rms_norm\",\"shape\":{\"R\":4,\"C\":32}}",
                                "{\"op\":\"reduce_mean\",\"shape\":{\"R\":4,\"C\":32}}"};
    ir_subgraph *g = calloc(4, sizeof *g);
    space *sp = calloc(4, sizeof *sp);
    space_sched s[4];
    gen_job jobs[4];
    pthread_t th[4];
    target t;
    tlm_error e;
    cr_assert_eq(target_parse("cpu", &t, &e), 0);
    for (int i = 0; i < 4; i++) {
        ir_workload w;
        cr_assert_eq(proto_workload_from_string(wls[i], strlen(wls[i]), &w, &e), 0);
        cr_assert_eq(ir_subgraph_build(&w, &g[i], &e), 0);
        cr_assert_eq(space_build(&g[i], &t, &sp[i], &e), 0);
        space_default(&sp[i], &s[i]);
        jobs[i] = (gen_job){&sp[i], &s[i], NULL};
    }
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, gen_many, &jobs[i]);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_expect_not_null(r, "thread %d produced differing or failing sources", i);
        free(jobs[i].src);
    }
    free(g);
    free(sp);
}

/* The sketch table is the one place a sketch is declared: each has its vocabulary token and
 * exactly one code generator route, for its own target kind. */
Test(codegen_cpu, every_sketch_has_one_route_and_a_token)
{
    for (int s = 0; s < SKETCH_COUNT; s++) {
        bool cpu = space_sketch_target((space_sketch)s) == TARGET_CPU;
        cr_expect_eq(cg_cpu_has_route((space_sketch)s), cpu, "sketch %s", space_sketch_name(s));
        cr_expect_eq(cg_cuda_has_route((space_sketch)s), !cpu, "sketch %s", space_sketch_name(s));
        char tok[64];
        snprintf(tok, sizeof tok, "sketch:%s", space_sketch_name((space_sketch)s));
        cr_expect_geq(lang_token_id(tok), 0, "no vocabulary token %s", tok);
    }
    cr_expect_str_eq(space_sketch_name(SKETCH_COUNT), "?");
    cr_expect(!cg_cpu_has_route(SKETCH_COUNT) && !cg_cuda_has_route(SKETCH_COUNT));
}

/* A register tile whose epilogue reads an input at the output's own points (a residual add)
 * requests that input's lines for reading beside the output's for writing, while its FMAs
 * run; a bias (one value per filter) is not requested, and a tile without such an input has
 * no read prefetch. Checked against the reference on both ISAs. */
Test(codegen_cpu, tiles_prefetch_their_residual)
{
    static const char *const res = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":12,"
                                   "\"W\":12,\"F\":24,\"KH\":1,\"KW\":1},"
                                   "\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}";
    static const char *const plain = "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":12,"
                                     "\"W\":12,\"F\":24,\"KH\":1,\"KW\":1},"
                                     "\"epilogue\":[\"bias_add\",\"relu\"]}";
    static const char *const tg[] = {"cpu", "cpu:avx2"}; /* the host's code, and AVX2's */
    for (int i = 0; i < 2; i++) {
        built b = build(res, tg[i]);
        space_sched s;
        space_default(b.sp, &s);
        cr_expect(source_has(&b, &s, "__builtin_prefetch(&res["), "%s: no residual prefetch",
                  tg[i]);
        cr_expect(!source_has(&b, &s, "__builtin_prefetch(&bias["), "%s", tg[i]);
        check_schedule(&b, &s, res);
        built_free(&b);
        b = build(plain, tg[i]);
        space_default(b.sp, &s);
        cr_expect(!source_has(&b, &s, ", 0, 3);"), "%s: a read prefetch without a twin", tg[i]);
        built_free(&b);
    }
}
