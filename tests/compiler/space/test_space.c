/* Tests for compiler/space: for every op family and target, random walks through
 * space_legal_values never reach an empty legal set and always end in a schedule that
 * space_check accepts; the default is legal; printing and parsing round-trip; illegal
 * decision lists are refused naming the slot; counting matches brute force on tiny spaces. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir/ir.h"
#include "compiler/space/space.h"
#include "compiler/target/target.h"
#include "proto/workload.h"

TestSuite(space, .timeout = 120);

/* One workload per op family (and per layout / transpose variant), small enough that the
 * spaces are quick to walk but with composite extents so that tiles have real choices. */
static const char *const families[] = {
    "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":32,\"K\":20}}",
    "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":32,\"K\":20},\"transpose_a\":true}",
    "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":32,\"K\":20},\"transpose_b\":true}",
    "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":32,\"K\":20},\"transpose_a\":true,"
    "\"transpose_b\":true,\"epilogue\":[\"bias_add\",\"gelu\"]}",
    "{\"op\":\"batch_matmul\",\"shape\":{\"B\":3,\"M\":16,\"N\":12,\"K\":8}}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":9,\"W\":9,\"F\":8,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"epilogue\":[\"bias_add\",\"relu\"]}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":10,\"W\":10,\"F\":8,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"dilation\":[2,2],\"groups\":2,\"layout\":\"NHWC\"}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":8,\"W\":8,\"KH\":3,\"KW\":3},"
    "\"pad\":[1,1]}",
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":8,\"W\":8,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"layout\":\"NHWC\"}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":8,\"W\":8,\"KH\":2,\"KW\":2}}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":2,\"C\":4,\"H\":9,\"W\":9,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"layout\":\"NHWC\"}",
    "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":2,\"C\":8,\"H\":4,\"W\":4}}",
    "{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":2,\"C\":8,\"H\":4,\"W\":4},\"layout\":"
    "\"NHWC\"}",
    "{\"op\":\"softmax\",\"shape\":{\"R\":12,\"C\":32}}",
    "{\"op\":\"layer_norm\",\"shape\":{\"R\":12,\"C\":32}}",
    "{\"op\":\"rms_norm\",\"shape\":{\"R\":12,\"C\":32}}",
    "{\"op\":\"reduce_sum\",\"shape\":{\"R\":12,\"C\":32}}",
    "{\"op\":\"reduce_mean\",\"shape\":{\"R\":12,\"C\":32}}",
    "{\"op\":\"reduce_max\",\"shape\":{\"R\":12,\"C\":32}}",
    "{\"op\":\"elementwise\",\"shape\":{\"N\":96},\"epilogue\":[\"add\",\"gelu\",\"mul\"]}",
    "{\"op\":\"transpose\",\"shape\":{\"R\":12,\"C\":20}}",
    "{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":9,\"W\":9,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"layout\":\"NHWC\"}",
    "{\"op\":\"avg_pool2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":8,\"W\":8,\"KH\":2,\"KW\":2}}",
};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

static const char *const targets[] = {"cpu", "cpu:avx2", "cuda:sm_80", "cuda:sm_90"};
#define N_TARGETS ((int)(sizeof targets / sizeof targets[0]))

/* A built space with the subgraph it points into (both on the heap: they are large). */
typedef struct {
    ir_subgraph *g;
    space *sp;
} built;

/* The space of wl on target t (a parsed target, perhaps given another host's identity,
 * cores or caches). */
static built build_on(const char *wl, const target *t)
{
    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &w, &err), 0, "%s: %s: %s", wl,
                 err.field, err.msg);
    built b = {calloc(1, sizeof(ir_subgraph)), calloc(1, sizeof(space))};
    cr_assert(b.g && b.sp);
    cr_assert_eq(ir_subgraph_build(&w, b.g, &err), 0, "%s: %s", wl, err.msg);
    cr_assert_eq(space_build(b.g, t, b.sp, &err), 0, "%s on %s: %s: %s", wl, t->name, err.field,
                 err.msg);
    cr_assert_gt(b.sp->n_slot, 0, "%s on %s: no slots", wl, t->name);
    return b;
}

/* A parsed target tg. */
static target parsed(const char *tg)
{
    tlm_error err;
    tlm_err_clear(&err);
    target t;
    cr_assert_eq(target_parse(tg, &t, &err), 0, "%s: %s", tg, err.msg);
    return t;
}

static built build(const char *wl, const char *tg)
{
    target t = parsed(tg);
    return build_on(wl, &t);
}

static void unbuild(built *b)
{
    free(b->g);
    free(b->sp);
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

/* Properties a complete legal schedule must have, checked without space_legal_values. */
static void check_structure(const space *sp, const space_sched *s, const char *what)
{
    const ir_stage *a = &sp->g->stage[sp->g->anchor];
    if (sp->sketch == SKETCH_CPU_TILE || sp->sketch == SKETCH_GPU_TILE) {
        int64_t threads = 1;
        for (int x = 0; x < sp->n_spatial + sp->n_reduce; x++) {
            int L = x < sp->n_spatial ? sp->s_levels : sp->r_levels;
            int64_t p = 1;
            for (int l = 0; l < L; l++) {
                int64_t f = space_tile(sp, s, x, l);
                cr_assert_geq(f, 1, "%s: axis %d level %d factor %lld", what, x, l, (long long)f);
                p *= f;
            }
            int64_t e = a->extent[x];
            if (sp->sketch == SKETCH_CPU_TILE && x < sp->n_spatial) {
                /* CPU spatial tiles may pad, within the bound space.h states */
                int64_t limit = space_pad_limit(e);
                cr_assert_geq(limit, e + e / 8);
                cr_assert(p >= e && p <= limit,
                          "%s: tiles of axis %s multiply to %lld, extent %lld (padding bound %lld)",
                          what, a->axis[x], (long long)p, (long long)e, (long long)limit);
                cr_assert_eq(space_padded_extent(sp, s, x), p);
            } else if (sp->sketch == SKETCH_CPU_TILE) {
                /* CPU reduction chunks need not divide: ceil(e / chunk) chunks, the last one
                 * shorter and never empty, nothing padded */
                int64_t c = space_tile(sp, s, x, 1), n0 = space_tile(sp, s, x, 0);
                cr_assert(n0 == (e + c - 1) / c && (n0 - 1) * c < e && c <= e,
                          "%s: axis %s: %lld chunks of %lld for extent %lld", what, a->axis[x],
                          (long long)n0, (long long)c, (long long)e);
                cr_assert(e % c == 0 || (c >= 16 && c <= 512 && (c & (c - 1)) == 0),
                          "%s: axis %s: chunk %lld of extent %lld is neither a divisor nor a "
                          "power of two in 16..512",
                          what, a->axis[x], (long long)c, (long long)e);
            } else {
                cr_assert_eq(p, e, "%s: tiles of axis %s multiply to %lld, extent %lld", what,
                             a->axis[x], (long long)p, (long long)e);
            }
            if (sp->sketch == SKETCH_GPU_TILE && x < sp->n_spatial)
                threads *= space_tile(sp, s, x, 2);
        }
        if (sp->sketch == SKETCH_GPU_TILE) {
            cr_assert_leq(threads, sp->tgt.gpu.max_threads_per_block, "%s: %lld threads", what,
                          (long long)threads);
            if (space_get(sp, s, SLOT_STAGE, 0))
                cr_assert_leq(space_gpu_smem_bytes(sp, s), sp->tgt.gpu.smem_per_block,
                              "%s: staged footprint over the shared memory limit", what);
            if (!space_get(sp, s, SLOT_STAGE, 0))
                cr_assert_eq(space_get(sp, s, SLOT_VEC_LOAD, 1), 1,
                             "%s: vector loads without staging", what);
        }
    } else if (sp->sketch == SKETCH_GPU_MMA) {
        int64_t wm = space_get(sp, s, SLOT_WARP_M, 0), wn = space_get(sp, s, SLOT_WARP_N, 0);
        int64_t wpm = space_get(sp, s, SLOT_WARPS_M, 0), wpn = space_get(sp, s, SLOT_WARPS_N, 0);
        cr_assert(wm % 16 == 0 && wn % 8 == 0 && wm >= 16 && wn >= 8, "%s", what);
        cr_assert_leq((wm / 16) * (wn / 8) * 4, 128, "%s: accumulators", what);
        cr_assert_leq(wpm * wpn, 8, "%s: warps", what);
        cr_assert(wm * wpm == 16 || wm * wpm <= (sp->mma.M + 15) / 16 * 16, "%s: BM", what);
        cr_assert(wn * wpn == 8 || wn * wpn <= (sp->mma.N + 7) / 8 * 8, "%s: BN", what);
        int64_t st = space_get(sp, s, SLOT_PIPELINE, 0);
        cr_assert(st >= 1 && st <= 4, "%s", what);
        cr_assert_leq(space_mma_smem_bytes(sp, s), sp->tgt.gpu.smem_per_block_optin, "%s", what);
    } else if (sp->sketch == SKETCH_CPU_WINDOW) {
        /* register tile: columns of whole vectors (the last holding a real column), rows
         * within the extent, accumulators within the ISA's budget */
        int64_t vec = space_get(sp, s, SLOT_VECTORIZE, -1);
        cr_assert(vec == 0 || vec == 1 || vec == WINDOW_VEC_CHANNELS, "%s", what);
        int lanes = vec ? sp->tgt.cpu.vector_lanes : 1;
        int64_t cols = space_tile(sp, s, 3, 3), rows = space_tile(sp, s, 2, 3);
        if (vec == WINDOW_VEC_CHANNELS) {
            /* along channels (8 or 16 lanes): columns and rows within the extents, one
             * accumulator each, within the registers less the weight and a spare */
            cr_assert(lanes == 8 || lanes == 16, "%s: %d lanes", what, lanes);
            cr_assert(cols >= 1 && cols <= a->extent[3], "%s", what);
            cr_assert(rows >= 1 && rows <= 8 && rows <= a->extent[2], "%s", what);
            cr_assert_leq(rows * cols, sp->tgt.cpu.vector_registers - 2, "%s: accumulators",
                          what);
            return;
        }
        cr_assert(cols >= lanes && cols % lanes == 0 && cols / lanes <= (vec ? 4 : 8), "%s", what);
        cr_assert_lt(cols - lanes, a->extent[3], "%s: a column vector of padding only", what);
        cr_assert(rows >= 1 && rows <= 8 && rows <= a->extent[2], "%s", what);
        cr_assert_leq(rows * (cols / lanes),
                      vec ? (sp->tgt.cpu.vector_registers > 16 ? 24 : 12) : 16, "%s: accumulators",
                      what);
        for (int x = 2; x < 4; x++) {
            int64_t p = space_padded_extent(sp, s, x);
            cr_assert(p >= a->extent[x] && p - a->extent[x] < space_tile(sp, s, x, 3), "%s", what);
        }
    } else {
        int64_t rows = space_get(sp, s, SLOT_ROWS, 0);
        cr_assert_gt(rows, 0, "%s", what);
        cr_assert_eq(sp->rows % rows, 0, "%s: rows=%lld does not divide %lld", what,
                     (long long)rows, (long long)sp->rows);
        if (sp->sketch == SKETCH_GPU_ROWS) {
            int64_t th = space_get(sp, s, SLOT_THREADS, 0);
            cr_assert(th >= 32 && th <= sp->tgt.gpu.max_threads_per_block && (th & (th - 1)) == 0,
                      "%s: threads=%lld", what, (long long)th);
        }
    }
}

/* 300 random walks: at every slot the legal set is non-empty, ascending, without
 * duplicates, and every complete walk passes space_check. */
static void walk_family(const char *wl, const char *tg)
{
    built b = build(wl, tg);
    const space *sp = b.sp;
    int64_t *vals = malloc(sizeof(int64_t) * SPACE_MAX_VALUES);
    cr_assert_not_null(vals);
    uint64_t rng = 0x5EED0000ull + (uint64_t)strlen(wl) * 131 + (uint64_t)strlen(tg);
    char what[256];
    snprintf(what, sizeof what, "%s on %s", wl, tg);
    for (int walk = 0; walk < 300; walk++) {
        space_sched s;
        memset(&s, 0, sizeof s);
        s.n = sp->n_slot;
        for (int i = 0; i < sp->n_slot; i++) {
            int n = space_legal_values(sp, i, &s, vals);
            if (n < 1) {
                char buf[2048];
                s.n = i;
                space_print(sp, &s, buf, sizeof buf);
                cr_assert_fail("%s: dead end at slot %s after [%s] (n=%d)", what, sp->slot[i].name,
                               buf, n);
            }
            cr_assert_leq(n, SPACE_MAX_VALUES);
            for (int k = 1; k < n; k++)
                cr_assert_lt(vals[k - 1], vals[k], "%s: slot %s values not ascending", what,
                             sp->slot[i].name);
            s.v[i] = vals[xorshift(&rng) % (uint64_t)n];
        }
        tlm_error err;
        tlm_err_clear(&err);
        char buf[2048];
        space_print(sp, &s, buf, sizeof buf);
        cr_assert_eq(space_check(sp, &s, &err), 0, "%s: walk [%s] rejected: %s: %s", what, buf,
                     err.field, err.msg);
        check_structure(sp, &s, what);
    }
    /* space_sample follows the same rules, and is deterministic in its seed */
    for (int k = 0; k < 50; k++) {
        uint64_t r1 = 1000 + (uint64_t)k, r2 = r1;
        space_sched s1, s2;
        space_sample(sp, &r1, &s1);
        space_sample(sp, &r2, &s2);
        cr_assert_eq(s1.n, sp->n_slot);
        cr_assert_eq(memcmp(s1.v, s2.v, sizeof(int64_t) * (size_t)s1.n), 0,
                     "%s: space_sample is not deterministic", what);
        tlm_error err;
        tlm_err_clear(&err);
        cr_assert_eq(space_check(sp, &s1, &err), 0, "%s: sample rejected: %s: %s", what, err.field,
                     err.msg);
        check_structure(sp, &s1, what);
    }
    free(vals);
    unbuild(&b);
}

Test(space, random_walks_never_dead_end_and_always_check)
{
    for (int f = 0; f < N_FAMILIES; f++)
        for (int t = 0; t < N_TARGETS; t++)
            walk_family(families[f], targets[t]);
}

static void expect_round_trip(const space *sp, const space_sched *s, const char *what)
{
    char text[4096], text2[4096];
    space_print(sp, s, text, sizeof text);
    tlm_error err;
    tlm_err_clear(&err);
    space_sched p;
    cr_assert_eq(space_parse(sp, text, &p, &err), 0, "%s: [%s] does not parse: %s: %s", what, text,
                 err.field, err.msg);
    cr_assert_eq(p.n, s->n);
    cr_assert_eq(memcmp(p.v, s->v, sizeof(int64_t) * (size_t)s->n), 0, "%s: [%s] changed", what,
                 text);
    space_print(sp, &p, text2, sizeof text2);
    cr_assert_str_eq(text, text2);
    /* the bare values in slot order mean the same */
    size_t len = 0;
    for (int i = 0; i < s->n; i++)
        len += (size_t)snprintf(text2 + len, sizeof text2 - len, "%s%lld", i ? " " : "",
                                (long long)s->v[i]);
    cr_assert_eq(space_parse(sp, text2, &p, &err), 0, "%s: bare [%s]: %s: %s", what, text2,
                 err.field, err.msg);
    cr_assert_eq(memcmp(p.v, s->v, sizeof(int64_t) * (size_t)s->n), 0);
}

Test(space, default_is_legal_and_print_parse_round_trips)
{
    for (int f = 0; f < N_FAMILIES; f++)
        for (int t = 0; t < N_TARGETS; t++) {
            built b = build(families[f], targets[t]);
            char what[256];
            snprintf(what, sizeof what, "%s on %s", families[f], targets[t]);
            space_sched s;
            space_default(b.sp, &s);
            tlm_error err;
            tlm_err_clear(&err);
            cr_assert_eq(space_check(b.sp, &s, &err), 0, "%s: default rejected: %s: %s", what,
                         err.field, err.msg);
            check_structure(b.sp, &s, what);
            expect_round_trip(b.sp, &s, what);
            uint64_t rng = 77 + (uint64_t)f;
            for (int k = 0; k < 10; k++) {
                space_sample(b.sp, &rng, &s);
                expect_round_trip(b.sp, &s, what);
            }
            /* the default is a fixed rule, not a draw */
            space_sched s2;
            space_default(b.sp, &s);
            space_default(b.sp, &s2);
            cr_assert_eq(memcmp(s.v, s2.v, sizeof(int64_t) * (size_t)s.n), 0);
            unbuild(&b);
        }
}

Test(space, sketches_follow_the_family_and_target)
{
    static const struct {
        int family;
        const char *tg;
        space_sketch sk;
    } cases[] = {
        {0, "cpu", SKETCH_CPU_TILE},        {0, "cuda:sm_90", SKETCH_GPU_TILE},
        {13, "cpu", SKETCH_CPU_ROWS},       {13, "cuda:sm_80", SKETCH_GPU_ROWS},
        {11, "cpu", SKETCH_CPU_ROWS}, /* global pool NCHW reduces rows */
        {7, "cpu", SKETCH_CPU_WINDOW},      {7, "cpu:avx2", SKETCH_CPU_WINDOW},
        {9, "cpu", SKETCH_CPU_WINDOW}, /* depthwise and pools in NCHW: packed planes */
        {10, "cpu", SKETCH_CPU_TILE},       {8, "cpu", SKETCH_CPU_TILE}, /* NHWC: along C */
        {7, "cuda:sm_90", SKETCH_GPU_TILE}, {20, "cuda:sm_90", SKETCH_GPU_TILE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(families[cases[i].family], cases[i].tg);
        cr_expect_eq(b.sp->sketch, cases[i].sk, "%s on %s: sketch %s", families[cases[i].family],
                     cases[i].tg, space_sketch_name(b.sp->sketch));
        unbuild(&b);
    }
    /* dense 24x32x20 on a GPU: 5 spatial levels (4 slots each), 3 reduction levels (2 slots) */
    built b = build(families[0], "cuda:sm_90");
    int tiles = 0;
    for (int i = 0; i < b.sp->n_slot; i++)
        tiles += b.sp->slot[i].kind == SLOT_TILE;
    cr_expect_eq(tiles, 2 * 4 + 1 * 2);
    unbuild(&b);
    b = build(families[0], "cpu");
    tiles = 0;
    for (int i = 0; i < b.sp->n_slot; i++)
        tiles += b.sp->slot[i].kind == SLOT_TILE;
    cr_expect_eq(tiles, 2 * 3 + 1 * 1);
    unbuild(&b);
}

Test(space, float16_is_refused_naming_dtype)
{
    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    const char *wl = "{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8},\"dtype\":\"float16\"}";
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &w, &err), 0);
    ir_subgraph *g = calloc(1, sizeof *g);
    space *sp = calloc(1, sizeof *sp);
    cr_assert_eq(ir_subgraph_build(&w, g, &err), 0, "%s", err.msg);
    target t;
    cr_assert_eq(target_parse("cpu", &t, &err), 0);
    cr_expect_eq(space_build(g, &t, sp, &err), TLM_EUNSUPPORTED);
    cr_expect_str_eq(err.field, "dtype");
    free(g);
    free(sp);
}

/* Replaces slot `name`'s value in the printed form of s by `val` (any text). */
static void print_with(const space *sp, const space_sched *s, const char *name, const char *val,
                       char *out, size_t cap)
{
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < sp->n_slot; i++) {
        bool hit = !strcmp(sp->slot[i].name, name);
        if (hit)
            len += (size_t)snprintf(out + len, cap - len, "%s%s=%s", i ? " " : "", name, val);
        else
            len += (size_t)snprintf(out + len, cap - len, "%s%s=%lld", i ? " " : "",
                                    sp->slot[i].name, (long long)s->v[i]);
    }
}

static void expect_refused(const space *sp, const char *text, const char *field)
{
    tlm_error err;
    tlm_err_clear(&err);
    space_sched p;
    int rc = space_parse(sp, text, &p, &err);
    cr_expect_eq(rc, TLM_EINVAL, "[%s] accepted (rc %d)", text, rc);
    cr_expect_str_eq(err.field, field, "[%s]: field %s (%s)", text, err.field, err.msg);
    cr_expect_gt(strlen(err.msg), 0);
}

Test(space, illegal_decisions_are_refused_naming_the_slot)
{
    /* dense 24x32x20 on cpu: vectorize comes first, then tile.i.3 */
    built b = build(families[0], "cpu");
    const space *sp = b.sp;
    space_sched s;
    space_default(sp, &s);
    cr_assert_str_eq(sp->slot[0].name, "vectorize");
    cr_assert_str_eq(sp->slot[1].name, "tile.i.3");
    char text[4096];

    /* 9 neither divides 24 nor is on the ladder (1..8, powers of two, multiples of lanes) */
    print_with(sp, &s, "tile.i.3", "9", text, sizeof text);
    expect_refused(sp, text, "tile.i.3");
    print_with(sp, &s, "tile.i.3", "0", text, sizeof text);
    expect_refused(sp, text, "tile.i.3");
    print_with(sp, &s, "tile.i.3", "-4", text, sizeof text);
    expect_refused(sp, text, "tile.i.3");
    print_with(sp, &s, "tile.k.1", "3", text, sizeof text); /* 3 does not divide 20 */
    expect_refused(sp, text, "tile.k.1");
    print_with(sp, &s, "unroll", "7", text, sizeof text);
    expect_refused(sp, text, "unroll");
    print_with(sp, &s, "unroll", "1024", text, sizeof text); /* a GPU value, not a CPU one */
    expect_refused(sp, text, "unroll");
    print_with(sp, &s, "parallel", "3", text, sizeof text);
    expect_refused(sp, text, "parallel");
    print_with(sp, &s, "vectorize", "3", text, sizeof text); /* dense has 2 spatial axes */
    expect_refused(sp, text, "vectorize");
    print_with(sp, &s, "unroll", "abc", text, sizeof text);
    expect_refused(sp, text, "unroll");
    print_with(sp, &s, "unroll", "16x", text, sizeof text);
    expect_refused(sp, text, "unroll");
    print_with(sp, &s, "unroll", "1.5", text, sizeof text);
    expect_refused(sp, text, "unroll");
    print_with(sp, &s, "unroll", "", text, sizeof text);
    expect_refused(sp, text, "unroll");

    /* unknown slot name */
    space_print(sp, &s, text, sizeof text);
    strcat(text, " bogus=1");
    expect_refused(sp, text, "bogus");
    /* a GPU slot on a CPU sketch is unknown too */
    space_print(sp, &s, text, sizeof text);
    strcat(text, " stage=1");
    expect_refused(sp, text, "stage");
    /* duplicated slot */
    space_print(sp, &s, text, sizeof text);
    char extra[64];
    snprintf(extra, sizeof extra, " tile.i.3=%lld", (long long)s.v[0]);
    strcat(text, extra);
    expect_refused(sp, text, "tile.i.3");
    /* wrong counts: one value short names the missing slot, one too many names the list */
    size_t len = 0;
    for (int i = 0; i < sp->n_slot - 1; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%lld ", (long long)s.v[i]);
    expect_refused(sp, text, sp->slot[sp->n_slot - 1].name);
    len = 0;
    for (int i = 0; i < sp->n_slot; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%lld ", (long long)s.v[i]);
    snprintf(text + len, sizeof text - len, "1");
    expect_refused(sp, text, "schedule");
    expect_refused(sp, "", sp->slot[0].name);

    /* space_check on a struct with the wrong count */
    tlm_error err;
    tlm_err_clear(&err);
    space_sched short_s = s;
    short_s.n = s.n - 1;
    cr_expect_eq(space_check(sp, &short_s, &err), TLM_EINVAL);
    cr_expect_str_eq(err.field, "schedule");
    /* a legal value for the slot in isolation can still be illegal given earlier choices:
     * the accumulator block caps tile.i.2 once tile.i.3 and tile.j.* are large */
    unbuild(&b);

    /* GPU: a thread count above the block limit names the thread-level tile */
    b = build("{\"op\":\"dense\",\"shape\":{\"M\":2048,\"N\":2048,\"K\":64}}", "cuda:sm_90");
    sp = b.sp;
    space_sched g;
    memset(&g, 0, sizeof g);
    g.n = sp->n_slot;
    for (int i = 0; i < sp->n_slot; i++) {
        int64_t vals[SPACE_MAX_VALUES];
        int n = space_legal_values(sp, i, &g, vals);
        cr_assert_geq(n, 1);
        g.v[i] = vals[0];
        if (sp->slot[i].kind == SLOT_TILE && sp->slot[i].level == 2) g.v[i] = 64;
    }
    /* 64 x 64 = 4096 threads per block */
    tlm_err_clear(&err);
    cr_expect_eq(space_check(sp, &g, &err), TLM_EINVAL);
    cr_expect(strstr(err.field, "tile.") == err.field && strstr(err.field, ".2") != NULL,
              "field %s", err.field);
    unbuild(&b);
}

/* Candidate values of a slot, a superset of anything legal (plus some illegal ones). */
static int superset(const space *sp, int slot, int64_t *out)
{
    const space_slot *sl = &sp->slot[slot];
    int n = 0;
    switch (sl->kind) {
    case SLOT_TILE: {
        int64_t e = sp->g->stage[sp->g->anchor].extent[sl->axis];
        /* non-divisors included, and values past the extent (a padded vector row; CPU_WINDOW:
         * up to 4 vectors of 16 lanes, the last holding a real column) */
        int64_t hi = sp->sketch == SKETCH_CPU_WINDOW ? 64 : e + (e + 3) / 4 + 1;
        for (int64_t v = 1; v <= hi; v++)
            out[n++] = v;
        break;
    }
    case SLOT_ROWS:
        for (int64_t v = 1; v <= sp->rows; v++)
            out[n++] = v;
        break;
    case SLOT_THREADS:
        for (int64_t v = 16; v <= 2048; v *= 2)
            out[n++] = v;
        break;
    case SLOT_UNROLL: {
        static const int64_t u[] = {0, 16, 64, 512, 1024};
        for (int i = 0; i < 5; i++)
            out[n++] = u[i];
        break;
    }
    case SLOT_VEC_LOAD:
        for (int64_t v = 0; v <= 4; v++)
            out[n++] = v;
        break;
    case SLOT_VECTORIZE: /* 0, then the v-th innermost spatial axis, and one past them */
        for (int64_t v = 0; v <= sp->n_spatial + 1; v++)
            out[n++] = v;
        break;
    default: /* flags and small choices: their legal values and one illegal value */
        for (int64_t v = 0; v <= 2; v++)
            out[n++] = v;
        break;
    }
    return n;
}

/* Counts complete schedules space_check accepts, trying every superset combination: an
 * enumeration that does not rely on space_legal_values' promise of no dead ends. To stay
 * fast it uses only the contract that the legality of slot i depends on slots [0, i]: when
 * space_check blames slot j, every combination sharing the first j+1 values is skipped. */
static double brute_count(const space *sp)
{
    int64_t cand[SPACE_MAX_SLOTS][64];
    int nc[SPACE_MAX_SLOTS], idx[SPACE_MAX_SLOTS] = {0};
    for (int i = 0; i < sp->n_slot; i++) {
        nc[i] = superset(sp, i, cand[i]);
        cr_assert_leq(nc[i], 64);
    }
    double count = 0;
    space_sched s;
    memset(&s, 0, sizeof s);
    s.n = sp->n_slot;
    for (;;) {
        for (int i = 0; i < sp->n_slot; i++)
            s.v[i] = cand[i][idx[i]];
        tlm_error err;
        tlm_err_clear(&err);
        int bad = sp->n_slot - 1;
        if (space_check(sp, &s, &err) == 0) {
            count++;
        } else {
            bad = -1;
            for (int i = 0; i < sp->n_slot; i++)
                if (!strcmp(sp->slot[i].name, err.field)) bad = i;
            cr_assert_geq(bad, 0, "space_check blamed \"%s\", not a slot", err.field);
        }
        int i = bad;
        for (int k = i + 1; k < sp->n_slot; k++)
            idx[k] = 0;
        while (i >= 0 && ++idx[i] == nc[i])
            idx[i--] = 0;
        if (i < 0) break;
    }
    return count;
}

static int64_t default_of(const space *sp, space_slot_kind k)
{
    space_sched s;
    space_default(sp, &s);
    return space_get(sp, &s, k, -1);
}

Test(space, vectorize_names_any_long_spatial_axis)
{
    /* conv2d NCHW 1x4x9x9 -> F 8, 5x5 out: axes n (1), f (8), oh (5), ow (5): every axis of
     * extent >= 4 may carry the vectors; n = 1 may not */
    built b = build(families[5], "cpu");
    int64_t vals[SPACE_MAX_VALUES];
    space_sched none;
    memset(&none, 0, sizeof none);
    cr_assert_eq(b.sp->slot[0].kind, SLOT_VECTORIZE);
    int n = space_legal_values(b.sp, 0, &none, vals);
    cr_assert_eq(n, 4);
    for (int k = 0; k < 4; k++)
        cr_expect_eq(vals[k], k);
    space_sched s = none;
    s.n = 1;
    s.v[0] = 3;
    cr_expect_eq(space_cpu_vec_axis(b.sp, &s, 1), 1, "vectorize=3 is f, the 3rd innermost");
    s.v[0] = 0;
    cr_expect_eq(space_cpu_vec_axis(b.sp, &s, 1), 3, "scalar code counts as the last axis");
    unbuild(&b);
    /* rows sketches and anchors without a reduction keep {0, 1} */
    for (int f = 0; f < N_FAMILIES; f++) {
        b = build(families[f], "cpu");
        for (int i = 0; i < b.sp->n_slot; i++) {
            if (b.sp->slot[i].kind != SLOT_VECTORIZE) continue;
            n = space_legal_values(b.sp, i, &none, vals);
            if (b.sp->sketch == SKETCH_CPU_ROWS || b.sp->n_reduce == 0)
                cr_expect_eq(n, 2, "%s", families[f]);
            else
                cr_expect_geq(n, 2, "%s", families[f]);
        }
        unbuild(&b);
    }
    /* the default's model: a conv whose output rows (5 wide) fill 16 lanes poorly
     * vectorises its 256 filters on AVX-512 and packs them; so does a padded 3x3 conv with
     * 64-wide rows (the direct micro-kernel), its window whole in each chunk, 4 output rows
     * a task and one register tile of filters a block, on AVX-512 and on AVX2; so does an
     * unpadded 3x3 conv whose window is deep against its filters (K = 576 >= 2 x 64); a 1x1
     * conv that expands and a 1-D conv keep the last axis, as does a GEMM */
    b = build("{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":128,\"H\":10,\"W\":10,"
              "\"F\":256,\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}",
              "cpu:avx512");
    cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), 3);
    cr_expect_eq(default_of(b.sp, SLOT_PACK), 1);
    space_sched forced;
    space_default_vectorized(b.sp, 1, &forced);
    cr_expect_eq(space_get(b.sp, &forced, SLOT_VECTORIZE, -1), 1, "the caller's vector axis");
    space_default_vectorized(b.sp, 4, &forced); /* n = 1 cannot carry vectors */
    cr_expect_eq(space_get(b.sp, &forced, SLOT_VECTORIZE, -1), 3);
    unbuild(&b);
    static const struct {
        const char *wl, *tg;
        int64_t vectorize, kh; /* kh: the window's side */
    } convs[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":64,\"W\":64,\"F\":64,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
         "cpu:avx512", 3, 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":64,\"W\":64,\"F\":64,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
         "cpu:avx2", 3, 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":66,\"W\":66,\"F\":64,"
         "\"KH\":3,\"KW\":3}}",
         "cpu:avx512", 3, 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":320,\"H\":32,\"W\":32,\"F\":640,"
         "\"KH\":1,\"KW\":1}}",
         "cpu:avx512", 1, 1},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":80,\"H\":1,\"W\":3000,\"F\":384,"
         "\"KH\":1,\"KW\":3},\"pad\":[0,1]}",
         "cpu:avx512", 1, 1},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":80,\"H\":1,\"W\":3000,\"F\":384,"
         "\"KH\":1,\"KW\":3},\"pad\":[0,1]}",
         "cpu:avx2", 1, 1},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":66,\"W\":66,\"F\":64,"
         "\"KH\":3,\"KW\":3}}",
         "cpu:avx2", 3, 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":640,\"W\":640,\"F\":32,"
         "\"KH\":6,\"KW\":6},\"stride\":[2,2],\"pad\":[2,2]}",
         "cpu:avx2", 3, 6},
    };
    for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
        b = build(convs[i].wl, convs[i].tg);
        cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), convs[i].vectorize, "conv %zu on %s", i,
                     convs[i].tg);
        if (convs[i].vectorize == 3) {
            space_sched d;
            space_default(b.sp, &d);
            cr_expect_eq(space_tile(b.sp, &d, 5, 1), convs[i].kh, "kh whole");
            cr_expect_eq(space_tile(b.sp, &d, 6, 1), convs[i].kh, "kw whole");
            cr_expect_eq(space_tile(b.sp, &d, 2, 1), 4, "4 output rows a task");
            cr_expect_eq(space_tile(b.sp, &d, 2, 2), 1, "a block of one row");
            cr_expect_eq(space_tile(b.sp, &d, 1, 2), 1, "of one register tile of filters");
        }
        unbuild(&b);
    }
    b = build("{\"op\":\"dense\",\"shape\":{\"M\":197,\"N\":768,\"K\":768}}", "cpu:avx2");
    cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), 1);
    unbuild(&b);
    /* 1x1 convs: along F when they reduce (K >= 2 F) onto more filters than one vector holds,
     * or when their columns fill the lanes poorly (7 of 16) or, on 16 registers, a 7 x 7 plane
     * leaves them one-vector register rows; along the columns when they expand or reduce onto
     * one vector of filters (MobileNetV2's 32 -> 16); a batched GEMM's
     * batch axis (both operands move along it) never carries the vectors */
    static const struct {
        int64_t c, hw, f;
        const char *tg;
        int64_t vectorize;
    } pw[] = {
        {2048, 7, 512, "cpu:avx512", 3}, {256, 56, 64, "cpu:avx2", 3},
        {1024, 14, 256, "cpu:avx512", 3}, {64, 56, 256, "cpu:avx512", 1},
        {512, 7, 2048, "cpu:avx512", 3}, {512, 7, 2048, "cpu:avx2", 3},
        {128, 28, 512, "cpu:avx2", 1}, {32, 112, 16, "cpu:avx512", 1},
    };
    for (size_t i = 0; i < sizeof pw / sizeof pw[0]; i++) {
        char wl[160];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":%lld,\"H\":%lld,\"W\":%lld,"
                 "\"F\":%lld,\"KH\":1,\"KW\":1}}",
                 (long long)pw[i].c, (long long)pw[i].hw, (long long)pw[i].hw, (long long)pw[i].f);
        b = build(wl, pw[i].tg);
        cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), pw[i].vectorize, "1x1 %zu on %s", i,
                     pw[i].tg);
        unbuild(&b);
    }
    b = build("{\"op\":\"batch_matmul\",\"shape\":{\"B\":16,\"M\":257,\"N\":257,\"K\":64},"
              "\"transpose_b\":true}",
              "cpu:avx512");
    cr_expect_neq(default_of(b.sp, SLOT_VECTORIZE), 3);
    unbuild(&b);
    /* strided convs whose input along the columns would be gathered in short runs (a window
     * reading fewer than 8 floats a stride) go along F: MobileNetV2's 3x3 s2 stem and
     * ConvNeXt's 4x4 s4 one on both ISAs, ResNet's 1x1 s2 downsample on AVX-512 (single
     * floats; on AVX2 it stays); ViT's 16x16 s16 patch embedding (16-float runs) stays */
    static const struct {
        const char *wl, *tg;
        int64_t vectorize;
    } strided[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":224,\"W\":224,\"F\":32,"
         "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}", "cpu:avx512", 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":224,\"W\":224,\"F\":32,"
         "\"KH\":3,\"KW\":3},\"stride\":[2,2],\"pad\":[1,1]}", "cpu:avx2", 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":224,\"W\":224,\"F\":96,"
         "\"KH\":4,\"KW\":4},\"stride\":[4,4]}", "cpu:avx2", 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":56,\"W\":56,\"F\":512,"
         "\"KH\":1,\"KW\":1},\"stride\":[2,2]}", "cpu:avx512", 3},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":56,\"W\":56,\"F\":512,"
         "\"KH\":1,\"KW\":1},\"stride\":[2,2]}", "cpu:avx2", 1},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":224,\"W\":224,\"F\":768,"
         "\"KH\":16,\"KW\":16},\"stride\":[16,16]}", "cpu:avx512", 1},
    };
    for (size_t i = 0; i < sizeof strided / sizeof strided[0]; i++) {
        b = build(strided[i].wl, strided[i].tg);
        cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), strided[i].vectorize, "strided %zu on %s",
                     i, strided[i].tg);
        unbuild(&b);
    }
    /* a 1x1 conv along its columns reads its input in place (contiguous there), unless its
     * channels are 4 KiB apart (32 x 32) or it is strided; 28 x 28 columns, a ragged vector a
     * row on AVX2, are 98 whole ones as a pointwise conv's positions (one axis) */
    static const struct {
        int64_t c, hw, f, stride;
        const char *tg;
        int64_t pack;
    } inplace[] = {
        {64, 56, 256, 1, "cpu:avx512", 0}, {128, 28, 512, 1, "cpu:avx512", 0},
        {64, 56, 256, 1, "cpu:avx2", 0},   {128, 28, 512, 1, "cpu:avx2", 0},
        {320, 32, 640, 1, "cpu:avx512", 1}, {256, 56, 512, 2, "cpu:avx2", 1},
    };
    for (size_t i = 0; i < sizeof inplace / sizeof inplace[0]; i++) {
        char wl[192];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":%lld,\"H\":%lld,\"W\":%lld,"
                 "\"F\":%lld,\"KH\":1,\"KW\":1},\"stride\":[%lld,%lld]}",
                 (long long)inplace[i].c, (long long)inplace[i].hw, (long long)inplace[i].hw,
                 (long long)inplace[i].f, (long long)inplace[i].stride,
                 (long long)inplace[i].stride);
        b = build(wl, inplace[i].tg);
        cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), 1, "case %zu", i);
        cr_expect_eq(default_of(b.sp, SLOT_PACK), inplace[i].pack, "case %zu on %s", i,
                     inplace[i].tg);
        unbuild(&b);
    }
    /* a grouped conv's input, reused by the 4 filters of its group only, is read in place
     * (packed per task it ran 4.9x slower); a GEMM's B, reused over a block of rows, packs */
    for (int ti = 0; ti < 2; ti++) {
        b = build("{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":128,\"H\":56,\"W\":56,"
                  "\"F\":128,\"KH\":3,\"KW\":3},\"pad\":[1,1],\"groups\":32}",
                  ti ? "cpu:avx2" : "cpu:avx512");
        cr_expect_eq(default_of(b.sp, SLOT_PACK), 0, "grouped conv on %s", ti ? "avx2" : "avx512");
        unbuild(&b);
        b = build("{\"op\":\"dense\",\"shape\":{\"M\":197,\"N\":768,\"K\":768}}",
                  ti ? "cpu:avx2" : "cpu:avx512");
        cr_expect_eq(default_of(b.sp, SLOT_PACK), 1, "dense on %s", ti ? "avx2" : "avx512");
        unbuild(&b);
    }
}

/* The tile of the k slot (the first reduction tile) in the default. */
static int64_t default_k_chunk(const space *sp)
{
    space_sched s;
    space_default(sp, &s);
    for (int i = 0; i < sp->n_slot; i++)
        if (sp->slot[i].kind == SLOT_TILE && sp->slot[i].axis >= sp->n_spatial) return s.v[i];
    return -1;
}

Test(space, reduction_chunks_need_not_divide)
{
    /* a prime K offers cache-sized chunks (powers of two 16..512 below K) besides 1 and K,
     * and the default takes 256 (1009 = 3 x 256 + 241) and packs */
    built b = build("{\"op\":\"dense\",\"shape\":{\"M\":1021,\"N\":1031,\"K\":1009}}", "cpu");
    int64_t vals[SPACE_MAX_VALUES];
    space_sched s;
    space_default(b.sp, &s);
    int k_slot = -1;
    for (int i = 0; i < b.sp->n_slot && k_slot < 0; i++)
        if (b.sp->slot[i].kind == SLOT_TILE && b.sp->slot[i].axis >= b.sp->n_spatial) k_slot = i;
    cr_assert_geq(k_slot, 0);
    int n = space_legal_values(b.sp, k_slot, &s, vals);
    static const int64_t want[] = {1, 16, 32, 64, 128, 256, 512, 1009};
    cr_assert_eq(n, 8, "K = 1009: %d chunk sizes", n);
    for (int k = 0; k < n; k++)
        cr_expect_eq(vals[k], want[k]);
    cr_expect_eq(s.v[k_slot], 256);
    cr_expect_eq(space_get(b.sp, &s, SLOT_PACK, -1), 1, "a prime K packs its chunks");
    tlm_error err;
    tlm_err_clear(&err);
    cr_expect_eq(space_check(b.sp, &s, &err), 0, "%s: %s", err.field, err.msg);
    unbuild(&b);
    /* divisors win when they are good (320: 160, 2048: 256); a chunk whose last piece would
     * be a sliver is not taken (257 = 256 + 1 keeps one chunk); AVX2 follows the same rule.
     * With 32 registers a dense layer's chunks go up to 512 (320 whole, 3072: 512), as far as
     * its packed panel fits (1009 above: 256 under 128 columns); a batched GEMM's stay at 256
     * (300: 150) */
    static const struct {
        const char *wl, *tg;
        int64_t chunk;
    } cases[] = {
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":64,\"K\":320}}", "cpu:avx2", 160},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":64,\"K\":320}}", "cpu:avx512", 320},
        {"{\"op\":\"dense\",\"shape\":{\"M\":512,\"N\":2048,\"K\":2048}}", "cpu:avx2", 256},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":64,\"K\":257}}", "cpu", 257},
        {"{\"op\":\"dense\",\"shape\":{\"M\":577,\"N\":1152,\"K\":577}}", "cpu:avx2", 256},
        {"{\"op\":\"dense\",\"shape\":{\"M\":197,\"N\":768,\"K\":3072}}", "cpu:avx512", 512},
        {"{\"op\":\"dense\",\"shape\":{\"M\":197,\"N\":768,\"K\":3072}}", "cpu:avx2", 256},
        {"{\"op\":\"batch_matmul\",\"shape\":{\"B\":12,\"M\":64,\"N\":300,\"K\":300},"
         "\"transpose_b\":true}",
         "cpu:avx512", 150},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        b = build(cases[i].wl, cases[i].tg);
        cr_expect_eq(default_k_chunk(b.sp), cases[i].chunk, "%s on %s: chunk %lld", cases[i].wl,
                     cases[i].tg, (long long)default_k_chunk(b.sp));
        unbuild(&b);
    }
}

/* Two tiles of a workload's default on a target (tile AXIS.LEVEL wants WANT), its sketch
 * first. */
typedef struct {
    const char *wl, *tg;
    space_sketch sketch;
    int axis[2], level[2];
    int64_t want[2];
} default_tiles;

static void expect_default_tiles(const default_tiles *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const default_tiles *c = &cases[i];
        built b = build(c->wl, c->tg);
        cr_assert_eq(b.sp->sketch, c->sketch, "case %zu", i);
        space_sched d;
        space_default(b.sp, &d);
        for (int k = 0; k < 2; k++) {
            int64_t got = space_tile(b.sp, &d, c->axis[k], c->level[k]);
            cr_expect_eq(got, c->want[k], "case %zu on %s: tile %s.%d is %lld", i, c->tg,
                         b.sp->g->stage[b.sp->g->anchor].axis[c->axis[k]], c->level[k],
                         (long long)got);
        }
        unbuild(&b);
    }
}

/* A GEMM's block of register rows cuts the rows into equal pieces when a block down to half
 * the usual size does: 1021 rows are 171 tiles of 6, 3 x 57 on AVX2 (not 64 + 64 + 43) and
 * 9 x 19 on AVX-512 (not 5 x 32 + 11); 768 rows (128 tiles, 2 x 64) are even already. */
Test(space, gemm_row_blocks_come_out_even)
{
    static const default_tiles cases[] = {
        {"{\"op\":\"dense\",\"shape\":{\"M\":1021,\"N\":1031,\"K\":1009}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 0}, {3, 2}, {6, 57}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":1021,\"N\":1031,\"K\":1009}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 0}, {3, 2}, {6, 19}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":768,\"N\":1024,\"K\":512}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 0}, {3, 2}, {6, 64}},
    };
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* The block of filter tiles evens the threads' work when the positions' last task is short:
 * ResNet-50's 1x1 256 -> 1024 at 14 x 14 has 196 positions in 6 tiles of 32 and one of 4, so
 * 171 filter tiles in blocks of 57 (3 x 7 tasks) leave one thread 10 full tasks and the other
 * 8; blocks of 43 (4 x 7) give each 12. A GEMM with a short last column block and an even
 * split keeps its block (768 rows: 2 x 64). */
Test(space, filter_blocks_even_the_threads_work)
{
#define PW1(c, hw, f)                                                                        \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw ",\"F\":" #f \
    ",\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\",\"add\",\"relu\"]}"
    static const default_tiles cases[] = {
        {PW1(256, 14, 1024), "cpu:avx512", SKETCH_CPU_TILE, {1, 3}, {3, 3}, {6, 32}},
        {PW1(256, 14, 1024), "cpu:avx512", SKETCH_CPU_TILE, {1, 1}, {3, 2}, {6, 43}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":768,\"N\":1000,\"K\":512}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 0}, {3, 2}, {6, 64}},
    };
#undef PW1
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* A conv whose vector row is one vector (14 columns in 16 lanes; 7 or 20 in 8) takes two
 * output rows in its register tile, its filter rows counted against two vectors: 8 x 2 on
 * AVX-512, 6 x 2 on AVX2 (16 ymm); 14 columns on AVX2 are two vectors already and keep one
 * row; a GEMM's and a pool's tiles are as before. (A pointwise conv's positions are one
 * axis: the 3x1 convs here have the rows 1x1 ones had.) */
Test(space, one_vector_rows_take_a_second_row)
{
#define PATCH                                                                                \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":224,\"W\":224,\"F\":768,\"KH\":16," \
    "\"KW\":16},\"stride\":[16,16],\"epilogue\":[\"bias_add\"]}"
#define PW(c, hw, f)                                                                         \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw ",\"F\":" #f \
    ",\"KH\":3,\"KW\":1},\"pad\":[1,0],\"epilogue\":[\"bias_add\",\"relu\"]}"
    /* axes: n 0, f 1, oh 2, ow 3 (NHWC: n, oh, ow, c) */
    static const default_tiles cases[] = {
        {PATCH, "cpu:avx512", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {8, 2}},
        {PATCH, "cpu:avx2", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {6, 1}},
        {PW(256, 14, 1024), "cpu:avx512", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {8, 2}},
        {PW(512, 7, 2048), "cpu:avx2", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {6, 2}},
        {PW(256, 20, 512), "cpu:avx2", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {6, 2}},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":9,\"W\":9,\"KH\":3,\"KW\":3},"
         "\"stride\":[1,1],\"pad\":[1,1],\"layout\":\"NHWC\"}",
         "cpu:avx512", SKETCH_CPU_TILE, {2, 3}, {3, 3}, {1, 16}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":16,\"K\":64}}", "cpu:avx512", SKETCH_CPU_TILE,
         {0, 1}, {3, 3}, {8, 16}},
    };
#undef PATCH
#undef PW
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* With 32 vector registers an output row the padding leaves no 2-4 vector tile (77 or 100
 * columns in 16 lanes: 32, 48 and 64 pad them past 15 %) is one register tile, 5 or 7 vectors
 * under 4 or 3 rows, instead of one vector under 8 rows (pick_vec_row); the register tile may
 * go past CPU_INNER_MAX to 8 vectors along the vector axis only there. AVX2 (16 registers), a
 * row of 13 vectors (197) and convs, where it lost (80 filters along F; a 1x1's 100 positions
 * at 10 x 10 along the last axis), keep the rule before it. */
Test(space, output_rows_of_five_to_seven_vectors_are_one_tile_on_32_registers)
{
#define XATTN "{\"op\":\"batch_matmul\",\"shape\":{\"B\":8,\"M\":4096,\"N\":77,\"K\":40}," \
              "\"transpose_b\":true}"
    /* axes: bmm b 0, i 1, j 2; dense i 0, j 1; conv n 0, f 1, oh 2, ow 3 */
    static const default_tiles cases[] = {
        {XATTN, "cpu:avx512", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {4, 80}},
        {XATTN, "cpu:avx2", SKETCH_CPU_TILE, {1, 2}, {3, 3}, {6, 16}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":1024,\"N\":100,\"K\":512}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {3, 3}, {3, 112}},
        {"{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":197,\"K\":64}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {3, 3}, {6, 32}},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":240,\"H\":14,\"W\":14,\"F\":80,"
         "\"KH\":1,\"KW\":1}}",
         "cpu:avx512", SKETCH_CPU_TILE, {1, 3}, {3, 3}, {16, 8}},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":10,\"W\":10,\"F\":576,"
         "\"KH\":1,\"KW\":1}}",
         "cpu:avx512", SKETCH_CPU_TILE, {1, 3}, {3, 3}, {8, 16}},
    };
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
    /* the vector axis' register tile: up to 8 vectors with 32 registers, 64 floats with 16 */
    static const char *const tgs[] = {"cpu:avx512", "cpu:avx2"};
    for (int t = 0; t < 2; t++) {
        built b = build("{\"op\":\"dense\",\"shape\":{\"M\":64,\"N\":4096,\"K\":64}}",
                        tgs[t]);
        space_sched p;
        memset(&p, 0, sizeof p);
        int64_t *vals = malloc(sizeof(int64_t) * SPACE_MAX_VALUES), top = 0;
        cr_assert_not_null(vals);
        for (int i = 0; i < b.sp->n_slot; i++) {
            const space_slot *sl = &b.sp->slot[i];
            if (sl->kind == SLOT_TILE && sl->axis == 1 && sl->level == 3) {
                int n = space_legal_values(b.sp, i, &p, vals);
                for (int k = 0; k < n; k++) top = vals[k] > top ? vals[k] : top;
                break;
            }
            p.v[i] = 1; /* vectors along j (vectorize=1) under one register row */
            p.n = i + 1;
        }
        cr_expect_eq(top, t == 0 ? 128 : 64, "%s: the widest register row %lld", tgs[t],
                     (long long)top);
        free(vals);
        unbuild(&b);
    }
#undef XATTN
}

/* A pointwise conv along F (its positions one axis, ir/build.c) tiles them as over the output
 * rows they came from: EfficientNet's 1152 -> 192 at 7 x 7 takes 7 x 7 tiles a block (not 9
 * tiles of 6, one block a filter tile); at 56 x 56 a block is a row's 10 tiles of 6 (8, the
 * ladder's nearest), 4 blocks a task while that leaves 32 tasks a core (batch 8), else 1. */
Test(space, pointwise_convs_along_f_tile_as_their_rows)
{
#define PWF(n, c, hw, f)                                                                     \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":" #n ",\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw \
    ",\"F\":" #f ",\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\"]}"
    /* axes: n 0, f 1, oh 2 (1), ow 3 (the positions) */
    static const default_tiles cases[] = {
        {PWF(1, 1152, 7, 192), "cpu:avx512", SKETCH_CPU_TILE, {3, 3}, {3, 2}, {7, 1}},
        {PWF(8, 256, 56, 128), "cpu:avx512", SKETCH_CPU_TILE, {3, 3}, {2, 1}, {8, 4}},
        {PWF(1, 256, 56, 64), "cpu:avx512", SKETCH_CPU_TILE, {3, 3}, {2, 1}, {8, 1}},
        {PWF(8, 256, 56, 64), "cpu:avx2", SKETCH_CPU_TILE, {3, 3}, {2, 1}, {8, 4}},
    };
#undef PWF
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const default_tiles *c = &cases[i];
        built b = build(c->wl, c->tg);
        b.sp->tgt.cpu.cores = 2; /* the tasks a core are counted for 2 cores, whatever the host */
        b.sp->tgt.cpu.l2_bytes = 64 << 20; /* and the input near (along F at batch 8) */
        cr_assert_eq(b.sp->g->stage[b.sp->g->anchor].extent[2], 1, "case %zu: oh", i);
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, -1), 3, "case %zu: along F", i);
        for (int k = 0; k < 2; k++)
            cr_expect_eq(space_tile(b.sp, &d, c->axis[k], c->level[k]), c->want[k],
                         "case %zu on %s: tile ow.%d is %lld", i, c->tg, c->level[k],
                         (long long)space_tile(b.sp, &d, c->axis[k], c->level[k]));
        unbuild(&b);
    }
}

/* A GEMV (decode's M = 1) streams its matrix: a register tile of one 64-byte line of each
 * row (one AVX-512 vector, two AVX2 ones), and tasks as wide as the accumulator buffer
 * (16384 floats) allows, spread evenly: the busiest thread's columns within 1/64 of an even
 * share, each task at least half of min(share, 16384) wide. 51865 columns are a prime count
 * of lines (3242 = 2 x 1621): the even splits of the ladder give 4 tasks of 811 lines. */
Test(space, gemv_tasks_are_wide_and_even)
{
    static const int64_t shapes[][2] = {{32000, 4096}, {4096, 4096}, {51865, 512}, {50257, 1600},
                                        {11008, 4096}};
    static const char *const isas[] = {"cpu:avx512", "cpu:avx2"};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t t = 0; t < 2; t++) {
            char wl[128];
            snprintf(wl, sizeof wl, "{\"op\":\"dense\",\"shape\":{\"M\":1,\"N\":%lld,\"K\":%lld}}",
                     (long long)shapes[i][0], (long long)shapes[i][1]);
            built b = build(wl, isas[t]);
            space_sched d;
            space_default(b.sp, &d);
            int64_t N = shapes[i][0], cores = b.sp->tgt.cpu.cores > 0 ? b.sp->tgt.cpu.cores : 1;
            int64_t line = space_tile(b.sp, &d, 1, 3), width = line * space_tile(b.sp, &d, 1, 2);
            int64_t tasks = (N + width - 1) / width, share = (N + cores - 1) / cores;
            int64_t busiest = (tasks + cores - 1) / cores * width;
            int64_t wide = share < 16384 ? share : 16384;
            cr_expect_eq(line, 16, "%s on %s: a register tile of %lld floats", wl, isas[t],
                         (long long)line);
            cr_expect_leq(64 * busiest, 65 * share, "%s on %s: %lld tasks of %lld, %lld cores", wl,
                          isas[t], (long long)tasks, (long long)width, (long long)cores);
            cr_expect_geq(2 * width, wide, "%s on %s: tasks of %lld columns", wl, isas[t],
                          (long long)width);
            unbuild(&b);
        }
    /* not a GEMV: a conv along F decides its vector tile before its rows (output columns),
     * and keeps four vectors of filters over 5 columns */
    static const default_tiles conv[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":20,\"W\":20,\"F\":512,"
         "\"KH\":3,\"KW\":1},\"pad\":[1,0]}",
         "cpu:avx512", SKETCH_CPU_TILE, {1, 3}, {3, 3}, {64, 5}},
    };
    expect_default_tiles(conv, 1);
}

/* Kernels without a reduction: an elementwise op's task is a run of 32 vectors (not 2). A
 * transpose, whose input strides across the output's rows, takes register tiles of 16 x 16
 * on AVX-512 where both rows are whole 64-byte lines (768 x 128, 16 x 4096), else 8 x 8 (4093
 * x 1027, and on AVX2), which codegen moves as blocks transposed in registers, 4 x 2 of them
 * a task at 16 (the output's rows the longer side; 16 rows leave one), 2 x 2 at 8; rows
 * shorter than that (5 x 300 on AVX2) keep the previous rule: 4-row tiles on AVX-512 and 2-row
 * ones under AVX2's budget (4 x 2, a divisor of a 64-byte line), a task the whole of the
 * axis its input runs along. Against that rule, each kernel alone on a Xeon (2 threads):
 * 1024 x 1024 0.37 -> 0.19 ms, 768 x 128 0.029 -> 0.006, 4093 x 1027 1.30 -> 0.98, AVX2
 * 1.56 -> 1.01. */
Test(space, no_reduction_tasks_are_long_runs)
{
    static const default_tiles cases[] = {
        {"{\"op\":\"elementwise\",\"shape\":{\"N\":16777213},\"epilogue\":[\"gelu\"]}",
         "cpu:avx2", SKETCH_CPU_TILE, {0, 0}, {3, 2}, {8, 32}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":4093,\"C\":1027}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {3, 3}, {8, 8}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":4093,\"C\":1027}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {2, 2}, {2, 2}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":16,\"C\":4096}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {3, 3}, {16, 16}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":16,\"C\":4096}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {2, 2}, {4, 1}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":16,\"C\":4096}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 1}, {2, 2}, {2, 2}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":768,\"C\":128}}", "cpu:avx512",
         SKETCH_CPU_TILE, {0, 1}, {2, 2}, {4, 2}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":4093,\"C\":1027}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 1}, {3, 3}, {8, 8}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":4093,\"C\":1027}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 1}, {2, 2}, {2, 2}},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":5,\"C\":300}}", "cpu:avx2",
         SKETCH_CPU_TILE, {0, 1}, {3, 3}, {4, 2}},
    };
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
    for (int t = 0; t < 2; t++) {
        built b = build("{\"op\":\"transpose\",\"shape\":{\"R\":4093,\"C\":1027}}",
                        t ? "cpu:avx2" : "cpu:avx512");
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, 0), 1, "rows as short vectors");
        unbuild(&b);
    }
}

/* CPU_WINDOW's rows: enough for the accumulators to cover the FMA latency. A 14-wide 5x5
 * depthwise plane takes 7 rows under one AVX-512 vector (no padded row; a 7x7 there goes along
 * channels) and a 7x7 5 under two AVX2
 * vectors (2 rows padded none but left 4 accumulators). A 56-wide plane: on AVX-512 the
 * narrowest columns that pad least (one vector) and so 8 rows, where its input vectors are
 * loaded least often; on AVX2 four vectors (8 padded columns) and 2 rows, where each weight
 * broadcast feeds four FMAs (one unpadded vector and 8 rows measured 1.17x slower); a max
 * pool (no weights) keeps the columns that pad least: the widest of those on AVX-512, and so
 * 4 rows; on AVX2 the one unpadded vector, and so 8 rows. */
Test(space, window_rows_cover_the_fma_latency)
{
#define DW(h, c) "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #h \
                 ",\"W\":" #h ",\"KH\":7,\"KW\":7},\"pad\":[3,3]}"
    static const default_tiles cases[] = {
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":672,\"H\":14,\"W\":14,"
         "\"KH\":5,\"KW\":5},\"pad\":[2,2]}",
         "cpu:avx512",
         SKETCH_CPU_WINDOW,
         {3, 2},
         {3, 3},
         {16, 7}},
        {DW(56, 96), "cpu:avx512", SKETCH_CPU_WINDOW, {3, 2}, {3, 3}, {16, 8}},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":56,\"W\":56,\"KH\":7,"
         "\"KW\":7},\"stride\":[1,1],\"pad\":[3,3]}",
         "cpu:avx512",
         SKETCH_CPU_WINDOW,
         {3, 2},
         {3, 3},
         {64, 4}},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":56,\"W\":56,\"KH\":7,"
         "\"KW\":7},\"stride\":[1,1],\"pad\":[3,3]}",
         "cpu:avx2",
         SKETCH_CPU_WINDOW,
         {3, 2},
         {3, 3},
         {8, 8}},
    };
#undef DW
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* A pool of stride 2 or more whose output rows are wider than 32 points takes one row a
 * register tile, its columns as before (ResNet's 3x3 stem pool from 112 x 112: 4 x 16 lanes
 * on AVX-512, one 8-lane vector on AVX2; a 2x2 from 224 x 224); from 56 x 56 (28 out) and
 * at stride 1 the rows stay. */
Test(space, strided_pools_over_wide_rows_take_one_row)
{
#define POOL(op, h, k, s, p)                                                                       \
    "{\"op\":\"" op "\",\"shape\":{\"N\":1,\"C\":64,\"H\":" #h ",\"W\":" #h ",\"KH\":" #k          \
    ",\"KW\":" #k "},\"stride\":[" #s "," #s "],\"pad\":[" #p "," #p "]}"
    static const default_tiles cases[] = {
        {POOL("max_pool2d", 112, 3, 2, 1),
         "cpu:avx512",
         SKETCH_CPU_WINDOW,
         {3, 2},
         {3, 3},
         {64, 1}},
        {POOL("max_pool2d", 112, 3, 2, 1), "cpu:avx2", SKETCH_CPU_WINDOW, {3, 2}, {3, 3}, {8, 1}},
        {POOL("avg_pool2d", 127, 3, 2, 1),
         "cpu:avx512",
         SKETCH_CPU_WINDOW,
         {3, 2},
         {3, 3},
         {64, 1}},
        {POOL("max_pool2d", 224, 2, 2, 0), "cpu:avx2", SKETCH_CPU_WINDOW, {3, 2}, {3, 3}, {16, 1}},
        {POOL("max_pool2d", 56, 3, 2, 1), "cpu:avx512", SKETCH_CPU_WINDOW, {3, 2}, {3, 3}, {32, 4}},
        {POOL("max_pool2d", 56, 3, 1, 1), "cpu:avx512", SKETCH_CPU_WINDOW, {3, 2}, {3, 3}, {64, 4}},
    };
#undef POOL
    expect_default_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* A depthwise conv on a 16-register target (AVX2) of 25 taps or more, or whose output rows
 * take less than two vectors, puts its vectors along blocks of channels: one row of as many
 * columns as the registers allow and recompute least (7x7 at 14 and 56: 14 columns; 3x3 at
 * 14: 14; 3x3 at 7: 7). On AVX-512 output rows of at most half a vector go along channels
 * whatever the window (7x7 and 5x5 at 7: 7 columns), 14-wide ones from 49 taps (7x7 at 14).
 * 3x3 windows of other widths, pools, and the other AVX-512 windows (a 7x7 at 28, a 5x5 at
 * 28: 16 columns x 7 rows) stay along OW, where the rule along OW still gives the AVX2 7x7
 * its 2 vectors x 5 rows (14 wide) and 4 x 2 (56); so does an AVX2 5x5 whose output rows are
 * 3 or 4 vectors (28: 4 x 2; 14 goes along channels). */
Test(space, wide_depthwise_windows_put_vectors_along_channels)
{
#define DW(h, c, k, p)                                                                         \
    "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #h ",\"W\":" #h         \
    ",\"KH\":" #k ",\"KW\":" #k "},\"pad\":[" #p "," #p "]}"
    static const struct {
        const char *wl, *tg;
        int64_t vec, cols, rows, ow_cols, ow_rows; /* the default; the rule along OW */
    } cases[] = {
        {DW(14, 384, 7, 3), "cpu:avx2", WINDOW_VEC_CHANNELS, 14, 1, 16, 5},
        {DW(56, 96, 7, 3), "cpu:avx2", WINDOW_VEC_CHANNELS, 14, 1, 32, 2},
        {DW(28, 120, 5, 2), "cpu:avx2", 1, 32, 2, 32, 2},
        {DW(14, 480, 5, 2), "cpu:avx2", WINDOW_VEC_CHANNELS, 14, 1, 16, 5},
        {DW(14, 480, 3, 1), "cpu:avx2", WINDOW_VEC_CHANNELS, 14, 1, 16, 5},
        {DW(7, 960, 3, 1), "cpu:avx2", WINDOW_VEC_CHANNELS, 7, 1, 8, 7},
        {DW(7, 768, 7, 3), "cpu:avx512", WINDOW_VEC_CHANNELS, 7, 1, 16, 7},
        {DW(7, 1152, 5, 2), "cpu:avx512", WINDOW_VEC_CHANNELS, 7, 1, 16, 7},
        {DW(14, 384, 7, 3), "cpu:avx512", WINDOW_VEC_CHANNELS, 14, 1, 16, 7},
        {DW(14, 672, 5, 2), "cpu:avx512", 1, 16, 7, 16, 7},
        {DW(28, 192, 7, 3), "cpu:avx512", 1, 16, 7, 16, 7},
        {DW(28, 192, 5, 2), "cpu:avx512", 1, 16, 7, 16, 7},
        {DW(56, 96, 7, 3), "cpu:avx512", 1, 16, 8, 16, 8},
        {DW(56, 144, 3, 1), "cpu:avx2", 1, 32, 2, 32, 2},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":14,\"W\":14,\"KH\":5,"
         "\"KW\":5},\"stride\":[1,1],\"pad\":[2,2]}",
         "cpu:avx2", 1, 16, 5, 16, 5},
    };
#undef DW
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(cases[i].wl, cases[i].tg);
        cr_assert_eq(b.sp->sketch, SKETCH_CPU_WINDOW, "case %zu", i);
        space_sched d, o;
        space_default(b.sp, &d);
        space_default_vectorized(b.sp, 1, &o);
        cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, -1), cases[i].vec, "case %zu", i);
        cr_expect(space_tile(b.sp, &d, 3, 3) == cases[i].cols &&
                      space_tile(b.sp, &d, 2, 3) == cases[i].rows,
                  "case %zu on %s: %lld x %lld", i, cases[i].tg,
                  (long long)space_tile(b.sp, &d, 3, 3), (long long)space_tile(b.sp, &d, 2, 3));
        cr_expect_eq(space_get(b.sp, &o, SLOT_VECTORIZE, -1), 1, "case %zu", i);
        cr_expect(space_tile(b.sp, &o, 3, 3) == cases[i].ow_cols &&
                      space_tile(b.sp, &o, 2, 3) == cases[i].ow_rows,
                  "case %zu on %s along OW: %lld x %lld", i, cases[i].tg,
                  (long long)space_tile(b.sp, &o, 3, 3), (long long)space_tile(b.sp, &o, 2, 3));
        unbuild(&b);
    }
}

/* The space of wl on target tg as a host of that vendor and family would see it. */
static built build_on_host(const char *wl, const char *tg, const char *vendor, int family)
{
    target t = parsed(tg);
    snprintf(t.cpu.vendor, sizeof t.cpu.vendor, "%s", vendor);
    t.cpu.family = family;
    return build_on(wl, &t);
}

/* The narrow depthwise columns were fitted on Zen 4, whose 64-byte loads run at half rate; a
 * host whose loads run at full rate (AMD from Zen 5, family 0x1a) weighs padding against width
 * instead: 7x7 at 56 x 56 takes 4 vectors x 4 rows (1.31x over 1 x 8 on Zen 5), a 14-wide plane
 * keeps its one vector and 7 rows (the rule along OW; its default goes along channels). Named
 * targets (no host identity) and Zen 4 stay narrow. */
Test(space, depthwise_columns_follow_the_hosts_load_width)
{
    static const struct {
        const char *vendor;
        int family;
        int64_t h, cols, rows;
    } cases[] = {
        {"AuthenticAMD", 0x1a, 56, 64, 4}, {"AuthenticAMD", 0x19, 56, 16, 8},
        {"", 0, 56, 16, 8},                {"AuthenticAMD", 0x1a, 14, 16, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[256];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":%lld,"
                 "\"W\":%lld,\"KH\":7,\"KW\":7},\"pad\":[3,3]}",
                 (long long)cases[i].h, (long long)cases[i].h);
        built b = build_on_host(wl, "cpu:avx512", cases[i].vendor, cases[i].family);
        space_sched d;
        space_default_vectorized(b.sp, 1, &d); /* along OW (a 7x7 at 14 defaults to channels) */
        cr_expect_eq(space_tile(b.sp, &d, 3, 3), cases[i].cols, "case %zu: columns %lld", i,
                     (long long)space_tile(b.sp, &d, 3, 3));
        cr_expect_eq(space_tile(b.sp, &d, 2, 3), cases[i].rows, "case %zu: rows %lld", i,
                     (long long)space_tile(b.sp, &d, 2, 3));
        unbuild(&b);
    }
}

/* A depthwise conv of at most 3x3 taps, stride 2, whose output rows are wider than 32 points
 * takes one row a register tile, its columns the widest that pad least, on AVX-512 targets
 * whose depthwise columns are otherwise the narrowest (MobileNetV2's 96 channels from 112 x
 * 112: 4 vectors x 1 row). AVX2, a Zen 5 host, a 5x5, and rows of 28 keep the rule. */
Test(space, strided_3x3_depthwise_over_wide_rows_takes_one_row)
{
    static const struct {
        const char *tg, *vendor;
        int family, hw, k;
        int64_t cols, rows;
    } cases[] = {
        {"cpu:avx512", "", 0, 112, 3, 64, 1},
        {"cpu:avx512", "AuthenticAMD", 0x19, 112, 3, 64, 1},
        {"cpu:avx2", "", 0, 112, 3, 32, 2},
        {"cpu:avx512", "", 0, 112, 5, 16, 5},
        {"cpu:avx512", "", 0, 56, 3, 16, 7},
        {"cpu:avx512", "AuthenticAMD", 0x1a, 112, 3, -1, -1}, /* Zen 5: not this rule */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[256];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":%d,\"W\":%d,"
                 "\"KH\":%d,\"KW\":%d},\"stride\":[2,2],\"pad\":[1,1]}",
                 cases[i].hw, cases[i].hw, cases[i].k, cases[i].k);
        built b = build_on_host(wl, cases[i].tg, cases[i].vendor, cases[i].family);
        space_sched d;
        space_default(b.sp, &d);
        const int64_t cols = space_tile(b.sp, &d, 3, 3), rows = space_tile(b.sp, &d, 2, 3);
        if (cases[i].rows < 0)
            cr_expect(rows > 1, "case %zu: %lld x %lld", i, (long long)cols, (long long)rows);
        else
            cr_expect(cols == cases[i].cols && rows == cases[i].rows, "case %zu: %lld x %lld", i,
                      (long long)cols, (long long)rows);
        unbuild(&b);
    }
}

/* Case i: wl's default on t puts its vectors along F and takes reduction chunks of `chunk`
 * channels */
/* The cpu:avx512 target as a host of this vendor has it ("GenuineIntel": family 6,
 * "AuthenticAMD" or none: 0x1a) */
static target avx512_of(const char *vendor)
{
    target t = parsed("cpu:avx512");
    snprintf(t.cpu.vendor, sizeof t.cpu.vendor, "%s", vendor);
    t.cpu.family = vendor[0] == 'G' ? 6 : 0x1a;
    return t;
}

static void expect_chunk_along_f(const char *wl, const target *t, size_t i, int64_t chunk)
{
    built b = build_on(wl, t);
    space_sched d;
    space_default(b.sp, &d);
    cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, 0), 3, "case %zu: vectors along F", i);
    cr_expect_eq(space_tile(b.sp, &d, 4, 1), chunk, "case %zu: chunk %lld", i,
                 (long long)space_tile(b.sp, &d, 4, 1));
    unbuild(&b);
}

/* A 1-D conv along F (one kernel row) on Intel keeps the chunk's weight panel (channels x taps
 * x the register tile's filters) within L1: Whisper's 384 -> 384 x 3 stride 2 takes chunks of
 * 64 channels (48 KiB with 64 filters) where the rule of thumb otherwise takes 128 (96 KiB;
 * 1.33x on a Xeon); a 5-tap one 32. AMD, vendorless targets and 3x3 convs keep their chunks. */
Test(space, one_d_conv_chunks_keep_the_weight_panel_in_l1_on_intel)
{
    static const struct {
        const char *wl, *vendor;
        int64_t chunk;
    } cases[] = {
#define W1D(c, w, k, s)                                                                            \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":1,\"W\":" #w ",\"F\":" #c      \
    ",\"KH\":1,\"KW\":" #k "},\"stride\":[1," #s "],\"pad\":[0,1]}"
        {W1D(384, 3000, 3, 2), "GenuineIntel", 64},
        {W1D(384, 3000, 3, 2), "AuthenticAMD", 128},
        {W1D(384, 3000, 3, 2), "", 128},
        {W1D(256, 4000, 5, 2), "GenuineIntel", 32},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":80,\"W\":80,\"F\":64,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
         "GenuineIntel", 32},
#undef W1D
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        target t = avx512_of(cases[i].vendor);
        t.cpu.l1d_bytes = 48 * 1024;
        expect_chunk_along_f(cases[i].wl, &t, i, cases[i].chunk);
    }
}

/* On Intel a pointwise conv that keeps or grows its channels over a plane of 56 x 56 or more,
 * or over 128 channels or more, packs its input (ResNet-50's 64 -> 256 at 56 x 56, 256 ->
 * 1024 at 14 x 14); a reduction (144 -> 24) and a small expansion at 28 x 28 (32 -> 192) read
 * it in place, as every one does on AMD and on targets without a vendor. */
/* a 1x1 conv, C -> F at hw x hw, with a bias and a relu */
#define PW1X1(c, hw, f)                                                                            \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw ",\"F\":" #f     \
    ",\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\",\"relu\"]}"

Test(space, pointwise_expansions_pack_their_input_on_intel)
{
    static const struct {
        const char *wl, *vendor;
        bool pack;
    } cases[] = {
        {PW1X1(64, 56, 256), "GenuineIntel", true},  {PW1X1(256, 14, 1024), "GenuineIntel", true},
        {PW1X1(64, 56, 64), "GenuineIntel", true},   {PW1X1(144, 56, 24), "GenuineIntel", false},
        {PW1X1(32, 28, 192), "GenuineIntel", false}, {PW1X1(64, 56, 256), "AuthenticAMD", false},
        {PW1X1(256, 14, 1024), "", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        target t = avx512_of(cases[i].vendor);
        built b = build_on(cases[i].wl, &t);
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, 0), 1, "case %zu: along the positions", i);
        cr_expect_eq(space_get(b.sp, &d, SLOT_PACK, 0) != 0, cases[i].pack, "case %zu", i);
        unbuild(&b);
    }
}

/* A reducing pointwise conv whose input fits the cores' L2 twice goes along F (broadcasting
 * its input), but on Intel only under a plane of 28 x 28: ResNet-50's 256 -> 64 at 56 x 56 and
 * MobileNetV2's 192 -> 32 at 28 x 28 go along the positions there, its 1024 -> 256 at 14 x 14
 * stays along F, and on AMD and without a vendor all three keep F. */
Test(space, reducing_pointwise_convs_keep_f_under_28_x_28_on_intel)
{
    static const struct {
        const char *wl, *vendor;
        int64_t vectorize; /* 1: the positions, 3: F */
    } cases[] = {
        {PW1X1(256, 56, 64), "GenuineIntel", 1},
        {PW1X1(192, 28, 32), "GenuineIntel", 1},
        {PW1X1(1024, 14, 256), "GenuineIntel", 3},
        {PW1X1(256, 56, 64), "AuthenticAMD", 3},
        {PW1X1(192, 28, 32), "", 3},
        {PW1X1(1024, 14, 256), "AuthenticAMD", 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        target t = avx512_of(cases[i].vendor);
        t.cpu.cores = 2;
        t.cpu.l2_bytes = 2 << 20;
        built b = build_on(cases[i].wl, &t);
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, 0), cases[i].vectorize, "case %zu", i);
        unbuild(&b);
    }
}
#undef PW1X1

/* On a Zen 4 host (AMD before family 0x1a) a pointwise conv over a plane of 14 x 14 or fewer
 * positions that reduces 256 channels or more goes along F, at batch 8 too (ResNet-50's
 * layer 3: its input past twice the cores' L2) and expanding (256 -> 1024); 96 channels
 * (MobileNetV2's expansion) and a 28 x 28 plane keep the positions, as do Zen 5 (beyond the
 * L2 bound), Intel, targets without a vendor and 16-register targets. */
#define PW1X1N(n, c, hw, f)                                                                        \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":" #n ",\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw             \
    ",\"F\":" #f ",\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\",\"relu\"]}"
Test(space, deep_pointwise_convs_over_small_planes_go_along_f_on_zen4)
{
    static const struct {
        const char *wl, *tg, *vendor;
        int family;
        int64_t vectorize; /* 1: the positions, 3: F */
    } cases[] = {
        {PW1X1N(8, 256, 14, 1024), "cpu:avx512", "AuthenticAMD", 0x19, 3},
        {PW1X1N(8, 1024, 14, 256), "cpu:avx512", "AuthenticAMD", 0x19, 3},
        {PW1X1N(1, 256, 14, 1024), "cpu:avx512", "AuthenticAMD", 0x19, 3},
        {PW1X1N(8, 256, 14, 1024), "cpu:avx512", "", 0, 1},
        {PW1X1N(8, 96, 14, 576), "cpu:avx512", "AuthenticAMD", 0x19, 1},
        {PW1X1N(8, 128, 28, 512), "cpu:avx512", "AuthenticAMD", 0x19, 1},
        {PW1X1N(8, 1024, 14, 256), "cpu:avx512", "AuthenticAMD", 0x1a, 1},
        {PW1X1N(8, 256, 14, 1024), "cpu:avx512", "GenuineIntel", 6, 1},
        {PW1X1N(8, 256, 14, 1024), "cpu:avx2", "AuthenticAMD", 0x19, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build_on_host(cases[i].wl, cases[i].tg, cases[i].vendor, cases[i].family);
        b.sp->tgt.cpu.cores = 2;
        b.sp->tgt.cpu.l2_bytes = 1 << 20;
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, 0), cases[i].vectorize, "case %zu", i);
        unbuild(&b);
    }
}
#undef PW1X1N

/* On a 16-register target a 2-D window along F keeps the chunk's weight panel (channels x
 * taps x the register tile's filters) within half of L1: a 3x3 conv 320 -> 320 takes 40
 * channels (23 KiB with 16 filters) and 64 -> 64 takes 32 where the rule of thumb took 160
 * and 64; with 32 KiB of L1 16; on AVX-512 and for a 1-D conv without a vendor the chunks
 * stay. */
Test(space, window_chunks_keep_the_weight_panel_in_half_of_l1_on_16_registers)
{
#define W3(c, h)                                                                                   \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #h ",\"W\":" #h ",\"F\":" #c    \
    ",\"KH\":3,\"KW\":3},\"pad\":[1,1]}"
    static const struct {
        const char *wl, *target;
        int64_t l1d, chunk;
    } cases[] = {
        {W3(320, 64), "cpu:avx2", 48 * 1024, 40},
        {W3(64, 80), "cpu:avx2", 48 * 1024, 32},
        {W3(64, 80), "cpu:avx2", 32 * 1024, 16},
        {W3(320, 64), "cpu:avx512", 48 * 1024, 40},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":384,\"H\":1,\"W\":3000,\"F\":384,"
         "\"KH\":1,\"KW\":3},\"stride\":[1,2],\"pad\":[0,1]}",
         "cpu:avx2", 48 * 1024, 192},
    };
#undef W3
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        target t = parsed(cases[i].target);
        t.cpu.l1d_bytes = cases[i].l1d;
        expect_chunk_along_f(cases[i].wl, &t, i, cases[i].chunk);
    }
}

/* On Intel a block whose register tiles store straight to the output (one reduction chunk of
 * at most 64) along rows of 4 KiB or more keeps to 32 rows (Whisper's 1500 x 1500 x 64 scores:
 * 30, 1.13-1.15x on a Xeon); AMD and vendorless targets keep their taller blocks, and so do
 * an output streamed out (SD's 4096 x 4096 x 40 on a 2-core host with a large L3), rows under
 * 4 KiB (ViT's 197) and a longer reduction. */
Test(space, intel_blocks_storing_long_rows_keep_to_32_rows)
{
#define BMM(b, m, n, k)                                                                            \
    "{\"op\":\"batch_matmul\",\"shape\":{\"B\":" #b ",\"M\":" #m ",\"N\":" #n ",\"K\":" #k  \
    "},\"transpose_b\":true}"
    static const struct {
        const char *wl, *vendor;
        bool short_block;
    } cases[] = {
        {BMM(6, 1500, 1500, 64), "GenuineIntel", true},
        {BMM(6, 1500, 1500, 64), "AuthenticAMD", false},
        {BMM(6, 1500, 1500, 64), "", false},
        {BMM(1, 4096, 4096, 40), "GenuineIntel", false},
        {BMM(12, 197, 197, 64), "GenuineIntel", false},
        {BMM(6, 1500, 1500, 256), "GenuineIntel", false},
    };
#undef BMM
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        target t = avx512_of(cases[i].vendor);
        t.cpu.cores = 2;
        t.cpu.l3_bytes = 300ll << 20;
        built b = build_on(cases[i].wl, &t);
        space_sched d;
        space_default(b.sp, &d);
        int64_t rows = space_tile(b.sp, &d, 1, 3) * space_tile(b.sp, &d, 1, 2);
        cr_expect_eq(rows <= 32, cases[i].short_block, "case %zu: a block of %lld rows", i,
                     (long long)rows);
        unbuild(&b);
    }
}

Test(space, exact_count_matches_brute_force_on_tiny_spaces)
{
    static const struct {
        const char *wl, *tg;
    } cases[] = {
        {"{\"op\":\"dense\",\"shape\":{\"M\":4,\"N\":4,\"K\":4}}", "cpu"},
        /* a prime K: chunks 16 and 32 that do not divide it */
        {"{\"op\":\"dense\",\"shape\":{\"M\":2,\"N\":3,\"K\":37}}", "cpu:avx2"},
        {"{\"op\":\"dense\",\"shape\":{\"M\":6,\"N\":8,\"K\":4}}", "cuda:sm_90"},
        {"{\"op\":\"transpose\",\"shape\":{\"R\":4,\"C\":6}}", "cpu:avx2"},
        {"{\"op\":\"softmax\",\"shape\":{\"R\":6,\"C\":8}}", "cpu"},
        {"{\"op\":\"reduce_max\",\"shape\":{\"R\":12,\"C\":8}}", "cuda:sm_80"},
        {"{\"op\":\"elementwise\",\"shape\":{\"N\":6},\"epilogue\":[\"relu\"]}", "cuda:sm_90"},
        /* CPU_WINDOW on odd extents: 7x7 output (lanes - 1 on AVX2), 3x17 (lanes + 1) */
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":3,\"H\":13,\"W\":13,\"KH\":5,"
         "\"KW\":5},\"stride\":[2,2],\"pad\":[2,2]}",
         "cpu:avx2"},
        {"{\"op\":\"max_pool2d\",\"shape\":{\"N\":1,\"C\":2,\"H\":5,\"W\":19,\"KH\":3,"
         "\"KW\":3},\"stride\":[1,1]}",
         "cpu"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build(cases[i].wl, cases[i].tg);
        int exact = 0;
        double l = space_log10_size(b.sp, &exact);
        double brute = brute_count(b.sp);
        cr_expect_eq(exact, 1, "%s: small space not counted exactly", cases[i].wl);
        cr_expect_gt(brute, 1);
        cr_expect(fabs(pow(10.0, l) - brute) < 0.5, "%s on %s: counted 10^%.6f = %.1f, brute %.0f",
                  cases[i].wl, cases[i].tg, l, pow(10.0, l), brute);
        unbuild(&b);
    }
}

Test(space, log10_size_is_finite_and_positive)
{
    /* one target per family, in turn: counting is the slow part of this file */
    for (int f = 0; f < N_FAMILIES; f++)
        for (int t = f % N_TARGETS; t == f % N_TARGETS; t++) {
            built b = build(families[f], targets[t]);
            int exact = -1;
            double l = space_log10_size(b.sp, &exact);
            cr_expect(isfinite(l) && l > 0, "%s on %s: log10 size %g", families[f], targets[t], l);
            cr_expect(exact == 0 || exact == 1);
            unbuild(&b);
        }
    /* a large space is estimated, and the estimate is large */
    built b = build("{\"op\":\"conv2d\",\"shape\":{\"N\":8,\"C\":256,\"H\":56,\"W\":56,\"F\":256,"
                    "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
                    "cuda:sm_90");
    int exact = -1;
    double l = space_log10_size(b.sp, &exact);
    cr_expect_eq(exact, 0);
    cr_expect(isfinite(l) && l > 8, "conv log10 size %g", l);
    unbuild(&b);
}

/* float16/bfloat16: the tensor-core sketch on sm_80+, for the contractions it covers; every
 * other case is refused naming "dtype" (CPU targets, older GPUs, other ops). */
static const char *const mma_families[] = {
    "{\"op\":\"dense\",\"shape\":{\"M\":24,\"N\":40,\"K\":20},\"dtype\":\"bfloat16\"}",
    "{\"op\":\"dense\",\"shape\":{\"M\":200,\"N\":96,\"K\":130},\"dtype\":\"float16\","
    "\"transpose_a\":true,\"epilogue\":[\"bias_add\",\"gelu\"]}",
    "{\"op\":\"batch_matmul\",\"shape\":{\"B\":3,\"M\":16,\"N\":12,\"K\":8},\"dtype\":\"bfloat16\"}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":4,\"H\":9,\"W\":9,\"F\":8,\"KH\":3,\"KW\":3},"
    "\"stride\":[2,2],\"pad\":[1,1],\"dtype\":\"float16\",\"epilogue\":[\"bias_add\",\"relu\"]}",
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":16,\"H\":10,\"W\":10,\"F\":8,\"KH\":3,\"KW\":3},"
    "\"pad\":[1,1],\"groups\":2,\"layout\":\"NHWC\",\"dtype\":\"bfloat16\"}",
};

Test(space, half_types_take_the_tensor_core_sketch)
{
    for (size_t f = 0; f < sizeof mma_families / sizeof mma_families[0]; f++)
        for (int t = 2; t < N_TARGETS; t++) {
            walk_family(mma_families[f], targets[t]);
            built b = build(mma_families[f], targets[t]);
            cr_expect_eq(b.sp->sketch, SKETCH_GPU_MMA, "%s", mma_families[f]);
            cr_expect_eq(b.sp->n_slot, 7);
            space_sched s;
            space_default(b.sp, &s);
            tlm_error err;
            tlm_err_clear(&err);
            cr_expect_eq(space_check(b.sp, &s, &err), 0, "%s: %s", mma_families[f], err.msg);
            /* block tiles never exceed the GEMM by more than a fragment, and fit shared memory */
            int64_t bm = space_get(b.sp, &s, SLOT_WARP_M, 0) * space_get(b.sp, &s, SLOT_WARPS_M, 0);
            cr_expect(bm == 16 || bm <= (b.sp->mma.M + 15) / 16 * 16, "%s: bm %lld", mma_families[f],
                      (long long)bm);
            cr_expect_leq(space_mma_smem_bytes(b.sp, &s), b.sp->tgt.gpu.smem_per_block_optin);
            unbuild(&b);
        }
    /* the GEMM view of a conv: M = (n, oh, ow), N = f, K = (c, kh, kw) */
    built b = build(mma_families[3], "cuda:sm_80");
    cr_expect_eq(b.sp->mma.M, 1 * 5 * 5);
    cr_expect_eq(b.sp->mma.N, 8);
    cr_expect_eq(b.sp->mma.K, 4 * 3 * 3);
    cr_expect_eq(b.sp->mma.n_b, 0);
    unbuild(&b);
    /* grouped NHWC: the group is a batch axis; c (contiguous in X) is the innermost k */
    b = build(mma_families[4], "cuda:sm_90");
    cr_expect_eq(b.sp->mma.batch, 2);
    cr_expect_str_eq(b.sp->g->stage[b.sp->g->anchor].axis[b.sp->mma.k_axis[b.sp->mma.n_k - 1]], "c");
    unbuild(&b);
}

static void expect_dtype_refusal(const char *wl, const char *tg)
{
    tlm_error err;
    tlm_err_clear(&err);
    ir_workload w;
    cr_assert_eq(proto_workload_from_string(wl, strlen(wl), &w, &err), 0);
    ir_subgraph *g = calloc(1, sizeof *g);
    space *sp = calloc(1, sizeof *sp);
    cr_assert_eq(ir_subgraph_build(&w, g, &err), 0, "%s", err.msg);
    target t;
    cr_assert_eq(target_parse(tg, &t, &err), 0);
    cr_expect_eq(space_build(g, &t, sp, &err), TLM_EUNSUPPORTED, "%s on %s", wl, tg);
    cr_expect_str_eq(err.field, "dtype", "%s on %s", wl, tg);
    free(g);
    free(sp);
}

Test(space, half_types_elsewhere_are_refused_naming_dtype)
{
    expect_dtype_refusal("{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8},\"dtype\":\"bfloat16\"}",
                         "cpu:avx512");
    expect_dtype_refusal("{\"op\":\"dense\",\"shape\":{\"M\":8,\"N\":8,\"K\":8},\"dtype\":\"float16\"}",
                         "cuda:sm_75");
    expect_dtype_refusal("{\"op\":\"softmax\",\"shape\":{\"R\":6,\"C\":10},\"dtype\":\"bfloat16\"}",
                         "cuda:sm_90");
    expect_dtype_refusal("{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":8,\"H\":8,\"W\":8,"
                         "\"KH\":3,\"KW\":3},\"dtype\":\"float16\"}",
                         "cuda:sm_90");
}

/* Parallel tasks (rows and window sketches) from 8 K points of work: a fork-join of two
 * threads costs about a microsecond on the hosts measured. EfficientNet's squeeze-excite
 * pools and channel scales (1x1 depthwise) at 7 x 7 ran 1.5-1.8x faster across two threads
 * (Zen 5, both ISAs: 672 x 7 x 7 pool 0.0045 -> 0.0030 ms, scale 0.0091 -> 0.0054; 240 x 7 x 7
 * 1.2x more at 8 K than at 16 K); a pool over 64 x 4 x 4 and an 8-row softmax stay serial. */
Test(space, rows_and_windows_run_on_every_core_from_8k_points)
{
    static const struct {
        const char *wl;
        space_sketch sk;
        int64_t parallel;
    } cases[] = {
        {"{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":672,\"H\":7,\"W\":7}}",
         SKETCH_CPU_ROWS, 1},
        {"{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":240,\"H\":7,\"W\":7}}",
         SKETCH_CPU_ROWS, 1},
        {"{\"op\":\"global_avg_pool2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":4,\"W\":4}}",
         SKETCH_CPU_ROWS, 0},
        {"{\"op\":\"softmax\",\"shape\":{\"R\":8,\"C\":64}}", SKETCH_CPU_ROWS, 0},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":672,\"H\":7,\"W\":7,\"KH\":1,"
         "\"KW\":1}}",
         SKETCH_CPU_WINDOW, 1},
        {"{\"op\":\"depthwise_conv2d\",\"shape\":{\"N\":1,\"C\":96,\"H\":4,\"W\":4,\"KH\":1,"
         "\"KW\":1}}",
         SKETCH_CPU_WINDOW, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 0; t < 2; t++) {
            built b = build(cases[i].wl, t ? "cpu:avx2" : "cpu:avx512");
            cr_assert_eq(b.sp->sketch, cases[i].sk, "%s", cases[i].wl);
            space_sched d;
            space_default(b.sp, &d);
            cr_expect_eq(space_get(b.sp, &d, SLOT_PARALLEL, 0), cases[i].parallel, "%s on %s",
                         cases[i].wl, t ? "avx2" : "avx512");
            unbuild(&b);
        }
}

/* A batched GEMM whose column operand is strided too (transpose_b: the zoo's attention
 * context, 64 x seq x seq) packs one operand transposed along either axis, and its vectors go
 * along the rows (64: four whole vectors) at 50 and 384 tokens, on both ISAs; 37 rows (not
 * whole vectors) stay along the columns, as do seq x seq
 * scores (K = 64) and a dense with transpose_b (a weight a plan packs once) stay along the
 * columns, and so does a batched GEMM whose B is not transposed. */
Test(space, batched_gemms_strided_both_ways_vectorise_their_rows)
{
#define BMM(b, m, n, k, tb) "{\"op\":\"batch_matmul\",\"shape\":{\"B\":" #b ",\"M\":" #m \
                            ",\"N\":" #n ",\"K\":" #k "},\"transpose_b\":" #tb "}"
    static const struct {
        const char *wl;
        int64_t vectorize;
    } cases[] = {
        {BMM(12, 64, 50, 50, true), 2},
        {BMM(12, 64, 384, 384, true), 2},
        {BMM(12, 197, 197, 64, true), 1},
        {BMM(12, 64, 50, 50, false), 1},
        {BMM(2, 37, 256, 40, true), 1},
        {"{\"op\":\"dense\",\"shape\":{\"M\":128,\"N\":768,\"K\":768},\"transpose_b\":true}", 1},
    };
#undef BMM
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int t = 0; t < 2; t++) {
            built b = build(cases[i].wl, t ? "cpu:avx2" : "cpu:avx512");
            space_sched d;
            space_default(b.sp, &d);
            cr_expect_eq(space_get(b.sp, &d, SLOT_VECTORIZE, 0), cases[i].vectorize,
                         "%s on %s", cases[i].wl, t ? "avx2" : "avx512");
            unbuild(&b);
        }
}

/* A GEMV's register row follows the host's load width too: where 64-byte loads run at full
 * rate (AMD family 0x1a) four AVX-512 vectors when the row is whole blocks of them (LLaMA's
 * 4096 outputs) or fits in one (a squeeze-excite's 48), one elsewhere (1000 classes, Zen 4,
 * named targets); an outer product (K = 1) keeps one; AVX2 keeps two. */
Test(space, gemv_rows_follow_the_hosts_load_width)
{
    static const struct {
        const char *tg, *vendor;
        int family;
        int64_t n, k, cols;
    } cases[] = {
        {"cpu:avx512", "AuthenticAMD", 0x1a, 4096, 4096, 64},
        {"cpu:avx512", "AuthenticAMD", 0x1a, 48, 1152, 48},
        {"cpu:avx512", "AuthenticAMD", 0x1a, 1000, 2048, 16},
        {"cpu:avx512", "AuthenticAMD", 0x1a, 4096, 1, 16},
        {"cpu:avx512", "AuthenticAMD", 0x19, 4096, 4096, 16},
        {"cpu:avx512", "", 0, 4096, 4096, 16},
        {"cpu:avx2", "AuthenticAMD", 0x1a, 4096, 4096, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[160];
        snprintf(wl, sizeof wl, "{\"op\":\"dense\",\"shape\":{\"M\":1,\"N\":%lld,\"K\":%lld}}",
                 (long long)cases[i].n, (long long)cases[i].k);
        built b = build_on_host(wl, cases[i].tg, cases[i].vendor, cases[i].family);
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_tile(b.sp, &d, 1, 3), cases[i].cols, "case %zu: %lld columns", i,
                     (long long)space_tile(b.sp, &d, 1, 3));
        unbuild(&b);
    }
}

/* The space of wl on target tg with that many cores of that much L2 each. */
static built build_with_caches(const char *wl, const char *tg, int cores, int64_t l2)
{
    target t = parsed(tg);
    t.cpu.cores = cores;
    t.cpu.l2_bytes = l2;
    return build_on(wl, &t);
}

/* A reducing 1x1 conv goes along F on AVX-512 while its input (within a plan, what the layer
 * before left in L2 and L3) is at most twice the cores' L2, past that along its columns:
 * ResNet-50's 256 -> 64 at 56 x 56 (3.2 MB at batch 1, 25.7 MB at batch 8) with 2 cores of
 * 1 MiB along F at batch 1, along the columns at batch 8 or with 512 KiB of L2 a core. AVX2
 * keeps F, and a conv that expands keeps its columns whatever its size. */
Test(space, reducing_convs_leave_f_when_their_input_leaves_l2)
{
    static const struct {
        int64_t n, c, f;
        const char *tg;
        int cores;
        int64_t l2, vectorize;
    } cases[] = {
        {1, 256, 64, "cpu:avx512", 2, 1 << 20, 3},  {8, 256, 64, "cpu:avx512", 2, 1 << 20, 1},
        {1, 256, 64, "cpu:avx512", 2, 512 << 10, 1}, {1, 256, 64, "cpu:avx512", 4, 1 << 20, 3},
        {8, 256, 64, "cpu:avx2", 2, 1 << 20, 3},     {1, 64, 256, "cpu:avx512", 2, 8 << 20, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[160];
        snprintf(wl, sizeof wl,
                 "{\"op\":\"conv2d\",\"shape\":{\"N\":%lld,\"C\":%lld,\"H\":56,\"W\":56,"
                 "\"F\":%lld,\"KH\":1,\"KW\":1}}",
                 (long long)cases[i].n, (long long)cases[i].c, (long long)cases[i].f);
        built b = build_with_caches(wl, cases[i].tg, cases[i].cores, cases[i].l2);
        cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), cases[i].vectorize, "case %zu", i);
        unbuild(&b);
    }
}

/* A windowed conv along F whose output row is one register tile (a 7 x 7 map on AVX-512: 7
 * columns of 2 filter vectors) takes the plane's rows into its block while every core keeps
 * two tasks (16 filter tiles: 7 rows on 2 and 8 cores, 4 on 16); so does one whose row is two
 * tiles (14 x 14; 7 x 7 on AVX2) when its weights outgrow L2 (512 x 512 x 3 x 3: 9.4 MB, the
 * test's L2 1 MiB); a block stays one row where they fit (128 channels: 0.6 MB) or the conv
 * has no window (a 1x1 stride-2 downsample onto 5 x 5). */
#define CONV3(h, s)                                                                          \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":512,\"H\":" #h ",\"W\":" #h ",\"F\":512,"  \
    "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"stride\":[" #s "," #s "]}"
Test(space, one_tile_rows_block_the_planes_rows)
{
    static const struct {
        const char *wl, *tg;
        int cores;
        int64_t rows;
    } cases[] = {
        {CONV3(7, 1), "cpu:avx512", 2, 7},  {CONV3(7, 1), "cpu:avx512", 8, 7},
        {CONV3(7, 1), "cpu:avx512", 16, 4},
        {CONV3(14, 2), "cpu:avx512", 2, 7},
        /* two tiles a row: the rows blocked where the weights (9.4 MB) outgrow L2 */
        {CONV3(14, 1), "cpu:avx512", 2, 14}, {CONV3(7, 1), "cpu:avx2", 2, 7},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":128,\"H\":14,\"W\":14,\"F\":128,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}",
         "cpu:avx512", 2, 1},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":1024,\"H\":10,\"W\":10,\"F\":2048,"
         "\"KH\":1,\"KW\":1},\"stride\":[2,2]}",
         "cpu:avx512", 2, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build_with_caches(cases[i].wl, cases[i].tg, cases[i].cores, 1 << 20);
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(default_of(b.sp, SLOT_VECTORIZE), 3, "case %zu: along F", i);
        cr_expect_eq(space_tile(b.sp, &d, 2, 2), cases[i].rows, "case %zu: %lld rows a block", i,
                     (long long)space_tile(b.sp, &d, 2, 2));
        unbuild(&b);
    }
}
#undef CONV3

/* Default register tiles of convs along F: filters (f3) and output columns (ow3) */
typedef struct {
    const char *wl, *tg;
    int64_t f3, ow3;
} conv_tiles;

static void expect_conv_tiles(const conv_tiles *cases, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        built b = build(cases[i].wl, cases[i].tg);
        space_sched d;
        space_default(b.sp, &d);
        cr_assert_eq(default_of(b.sp, SLOT_VECTORIZE), 3, "case %zu: along F", i);
        cr_expect_eq(space_tile(b.sp, &d, 1, 3), cases[i].f3, "case %zu: %lld filters", i,
                     (long long)space_tile(b.sp, &d, 1, 3));
        cr_expect_eq(space_tile(b.sp, &d, 3, 3), cases[i].ow3, "case %zu: %lld columns", i,
                     (long long)space_tile(b.sp, &d, 3, 3));
        unbuild(&b);
    }
}

/* A windowed conv along F whose output columns take 7 rows keeps two filter vectors on
 * AVX-512 (7 x 4 accumulators and their weights spill), where a row of three stays and a
 * pointwise conv, a 56-wide map and AVX2 keep their rule. */
Test(space, seven_rows_of_filters_keep_two_vectors_on_avx512)
{
    static const conv_tiles cases[] = {
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":256,\"H\":14,\"W\":14,\"F\":256,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}", "cpu:avx512", 32, 7},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":128,\"H\":56,\"W\":56,\"F\":128,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1],\"stride\":[2,2]}", "cpu:avx512", 32, 7},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":28,\"W\":28,\"F\":96,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}", "cpu:avx512", 48, 7},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":2048,\"H\":7,\"W\":7,\"F\":512,"
         "\"KH\":1,\"KW\":1}}", "cpu:avx512", 64, 7},
        {"{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":64,\"H\":56,\"W\":56,\"F\":64,"
         "\"KH\":3,\"KW\":3},\"pad\":[1,1]}", "cpu:avx512", 64, 6},
    };
    expect_conv_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* A windowed conv along F whose output rows are 8, 16 or 32 columns (6 x 4 pads them by an
 * eighth or more, 4 x 4 under 8) takes 8 x 2 on AVX-512: whole tiles, a row of one tile taking
 * the plane's rows in its block; 40 and 64 columns and AVX2 keep their rule. */
Test(space, rows_of_eight_columns_take_eight_by_two_on_avx512)
{
#define SD3(c, hw, s)                                                                       \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw ",\"F\":" #c \
    ",\"KH\":3,\"KW\":3},\"stride\":[" #s "," #s "],\"pad\":[1,1],\"epilogue\":[\"bias_add\"]}"
    static const conv_tiles cases[] = {
        {SD3(640, 32, 1), "cpu:avx512", 32, 8},  {SD3(1280, 16, 1), "cpu:avx512", 32, 8},
        {SD3(1280, 8, 1), "cpu:avx512", 32, 8},  {SD3(320, 64, 2), "cpu:avx512", 32, 8},
        {SD3(320, 64, 1), "cpu:avx512", 64, 6},  {SD3(256, 80, 2), "cpu:avx512", 64, 5},
        {SD3(640, 32, 1), "cpu:avx2", 16, 6},
    };
#undef SD3
    expect_conv_tiles(cases, sizeof cases / sizeof cases[0]);
}

/* A pointwise conv along F whose weights outgrow L2 takes all its positions into its block
 * (tiles of 7 over 7 x 7: 7 of them), where it fits a row's (EfficientNet's 1152 -> 192 at
 * 7 x 7, 0.9 MB under the test's 1 MiB L2: one tile) */
Test(space, pointwise_convs_whose_weights_outgrow_l2_block_their_positions)
{
#define PW1(c, hw, f)                                                                        \
    "{\"op\":\"conv2d\",\"shape\":{\"N\":1,\"C\":" #c ",\"H\":" #hw ",\"W\":" #hw ",\"F\":" #f \
    ",\"KH\":1,\"KW\":1},\"epilogue\":[\"bias_add\"]}"
    static const struct {
        const char *wl;
        int64_t ow3, ow2;
    } cases[] = {
        {PW1(512, 7, 2048), 7, 7},
        {PW1(2048, 7, 512), 7, 7},
        {PW1(1152, 7, 192), 7, 1},
    };
#undef PW1
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        built b = build_with_caches(cases[i].wl, "cpu:avx512", 2, 1 << 20);
        space_sched d;
        space_default(b.sp, &d);
        cr_assert_eq(default_of(b.sp, SLOT_VECTORIZE), 3, "case %zu: along F", i);
        cr_expect_eq(space_tile(b.sp, &d, 3, 3), cases[i].ow3, "case %zu: %lld positions a tile",
                     i, (long long)space_tile(b.sp, &d, 3, 3));
        cr_expect_eq(space_tile(b.sp, &d, 3, 2), cases[i].ow2, "case %zu: %lld tiles a block", i,
                     (long long)space_tile(b.sp, &d, 3, 2));
        unbuild(&b);
    }
}

/* A dense layer whose rows are one block, whose A outgrows half of L2 (prefill's 77 tokens x
 * 4096) and whose B is over 8 times the cores' L2 widens its block of columns up to 128 as
 * far as the accumulators stay within L1 (78 rows: 8 AVX2 tiles in 48 KiB, 6 in 32 KiB),
 * keeping 4 tasks a core (768 columns: 6 a block); a small A (77 x 768), a small B (BERT's
 * 128 x 768 x 3072: 9.4 MB), rows in several blocks (257) and AVX-512's 64-column tiles keep
 * 2 tiles. */
Test(space, prefill_dense_blocks_widen_within_l1)
{
    static const struct {
        int64_t m, n, k;
        const char *tg;
        int64_t l1, l2, j2;
    } cases[] = {
        {77, 4096, 4096, "cpu:avx2", 48 << 10, 2 << 20, 8},
        {77, 4096, 4096, "cpu:avx2", 32 << 10, 2 << 20, 6},
        {77, 768, 16384, "cpu:avx2", 48 << 10, 2 << 20, 6},
        {128, 768, 3072, "cpu:avx2", 48 << 10, 2 << 20, 2},
        {77, 3072, 768, "cpu:avx2", 48 << 10, 2 << 20, 2},
        {257, 4096, 1024, "cpu:avx2", 48 << 10, 1 << 20, 2},
        {77, 4096, 4096, "cpu:avx512", 48 << 10, 2 << 20, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char wl[120];
        snprintf(wl, sizeof wl, "{\"op\":\"dense\",\"shape\":{\"M\":%lld,\"N\":%lld,\"K\":%lld}}",
                 (long long)cases[i].m, (long long)cases[i].n, (long long)cases[i].k);
        target t = parsed(cases[i].tg);
        t.cpu.cores = 2;
        t.cpu.l1d_bytes = cases[i].l1;
        t.cpu.l2_bytes = cases[i].l2;
        built b = build_on(wl, &t);
        space_sched d;
        space_default(b.sp, &d);
        cr_expect_eq(space_tile(b.sp, &d, 1, 2), cases[i].j2, "case %zu: j.2 %lld", i,
                     (long long)space_tile(b.sp, &d, 1, 2));
        unbuild(&b);
    }
}
