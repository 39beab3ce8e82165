/* Tests for compiler/tlm/model.c: config limits, GPT-2 init, the weight file round trip and
 * every refusal of a bad file (truncated, trailing bytes, wrong magic, version, checksum,
 * absurd sizes, vocab size/hash mismatch, corrupt payload, non-finite weights, garbage).
 * Bad headers are built here byte by byte from model_weights/README.md, not through the
 * code under test. */
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "compiler/tlm/tlm.h"

static const tlm_config SMALL = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .n_ctx = 32, .vocab_size = 100};

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/tlm-model-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(model, .init = setup, .fini = teardown);

static void hash_of(const char *s, uint8_t out[32])
{
    unsigned len;
    cr_assert(EVP_Digest(s, strlen(s), out, &len, EVP_sha256(), NULL));
}

static char *path_in(const char *name)
{
    static char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "open %s", path);
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)sz + 1);
    cr_assert_eq(fread(b, 1, (size_t)sz, f), (size_t)sz);
    fclose(f);
    *n = (size_t)sz;
    return b;
}

static void spit(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static uint32_t rd32(const unsigned char *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static void wr32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

/* FNV-1a 32 of header bytes 0..123, stored at 124 (README). */
static void fix_checksum(unsigned char *h)
{
    uint32_t x = 2166136261u;
    for (int i = 0; i < 124; i++) {
        x ^= h[i];
        x *= 16777619u;
    }
    wr32(h + 124, x);
}

/* A valid file for SMALL; returns its bytes. */
static unsigned char *good_file(const char *name, size_t *n, tlm_model **model_out)
{
    uint8_t vh[32];
    hash_of("vocab-a", vh);
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_init_random(&SMALL, vh, 7, &m, &err), 0, "%s", err.msg);
    cr_assert_eq(tlm_model_save(m, path_in(name), &err), 0, "%s", err.msg);
    if (model_out)
        *model_out = m;
    else
        tlm_model_free(m);
    return slurp(path_in(name), n);
}

/* Loads `bytes` written to a file and expects a refusal naming `field`. */
static void expect_refused(const void *bytes, size_t n, const uint8_t *want_hash, const char *field,
                           const char *msg_part)
{
    spit(path_in("bad.bin"), bytes, n);
    tlm_model *m = (tlm_model *)0x1;
    tlm_error err = {0};
    int rc = tlm_model_load(path_in("bad.bin"), 0, want_hash, &m, &err);
    cr_assert_lt(rc, 0, "file accepted, expected refusal on %s", field);
    cr_assert_null(m);
    cr_assert_eq(err.code, rc);
    cr_assert_neq(err.msg[0], 0, "refusal without a message");
    if (field) cr_assert_str_eq(err.field, field, "field %s (msg: %s)", err.field, err.msg);
    if (msg_part) cr_assert_not_null(strstr(err.msg, msg_part), "message: %s", err.msg);
}

Test(model, param_count_matches_layout)
{
    /* 2 layers, C=64: V*C + T*C + L*(12C^2 + 13C) + 2C */
    uint64_t C = 64, want = 100 * C + 32 * C + 2 * (12 * C * C + 13 * C) + 2 * C;
    cr_assert_eq(tlm_config_param_count(&SMALL), want);
    tlm_model *m;
    cr_assert_eq(tlm_model_new(&SMALL, NULL, &m, NULL), 0);
    cr_assert_eq(m->n_params, want);
    /* tensors are consecutive in the documented order */
    cr_assert_eq(m->wpe, m->wte + 100 * C);
    cr_assert_eq(m->layers[0].ln1_w, m->wpe + 32 * C);
    cr_assert_eq(m->layers[0].qkv_w, m->layers[0].ln1_b + C);
    cr_assert_eq(m->layers[0].fc_proj_b + C, m->layers[1].ln1_w);
    cr_assert_eq(m->lnf_b + C, m->params + want);
    tlm_model_free(m);
}

Test(model, config_limits)
{
    struct {
        tlm_config c;
        const char *field;
    } bad[] = {
        {{0, 4, 64, 32, 100}, "n_layer"},  {{65, 4, 64, 32, 100}, "n_layer"},
        {{2, 4, 4097, 32, 100}, "n_embd"}, {{2, 3, 64, 32, 100}, "n_head"},
        {{2, 0, 64, 32, 100}, "n_head"},   {{2, 4, 64, 0, 100}, "n_ctx"},
        {{2, 4, 64, 65537, 100}, "n_ctx"}, {{2, 4, 64, 32, (1 << 20) + 1}, "vocab_size"},
        {{2, 4, 64, 32, 0}, "vocab_size"}, {{64, 64, 4096, 65536, 1 << 20}, "n_params"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tlm_error err = {0};
        cr_assert_lt(tlm_config_check(&bad[i].c, &err), 0, "case %zu accepted", i);
        cr_assert_str_eq(err.field, bad[i].field, "case %zu: %s", i, err.msg);
    }
    cr_assert_eq(tlm_config_check(&SMALL, NULL), 0);
    tlm_config edge = {64, 64, 1024, 1024, 1000};
    cr_assert_eq(tlm_config_check(&edge, NULL), 0);
}

static double stddev(const float *p, size_t n)
{
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) {
        s += p[i];
        s2 += (double)p[i] * p[i];
    }
    double mu = s / n;
    return sqrt(s2 / n - mu * mu);
}

Test(model, init_is_gpt2_and_deterministic)
{
    tlm_model *a, *b, *c;
    cr_assert_eq(tlm_model_init_random(&SMALL, NULL, 42, &a, NULL), 0);
    cr_assert_eq(tlm_model_init_random(&SMALL, NULL, 42, &b, NULL), 0);
    cr_assert_eq(tlm_model_init_random(&SMALL, NULL, 43, &c, NULL), 0);
    cr_assert_eq(memcmp(a->params, b->params, a->n_params * 4), 0, "same seed, other bytes");
    cr_assert_neq(memcmp(a->params, c->params, a->n_params * 4), 0, "seed ignored");
    size_t C = 64;
    const tlm_layer *ly = &a->layers[1];
    /* 12288 samples: the standard deviation is within a few percent of the target */
    cr_assert_float_eq(stddev(ly->qkv_w, C * 3 * C), 0.02, 0.001);
    cr_assert_float_eq(stddev(ly->fc_w, C * 4 * C), 0.02, 0.001);
    cr_assert_float_eq(stddev(a->wte, 100 * C), 0.02, 0.001);
    cr_assert_float_eq(stddev(ly->attn_proj_w, C * C), 0.02 / 2.0, 0.0007); /* 0.02/sqrt(2L) */
    cr_assert_float_eq(stddev(ly->fc_proj_w, 4 * C * C), 0.01, 0.0005);
    for (size_t i = 0; i < C; i++) {
        cr_assert_eq(ly->ln1_w[i], 1.0f);
        cr_assert_eq(ly->ln2_b[i], 0.0f);
        cr_assert_eq(ly->qkv_b[i], 0.0f);
        cr_assert_eq(a->lnf_w[i], 1.0f);
    }
    tlm_model_free(a);
    tlm_model_free(b);
    tlm_model_free(c);
}

Test(model, save_load_round_trip)
{
    tlm_model *m;
    size_t n;
    unsigned char *bytes = good_file("m.bin", &n, &m);
    cr_assert_eq(n, 128 + 4 * m->n_params);
    cr_assert_eq(memcmp(bytes, "TLMW", 4), 0);
    cr_assert_eq(rd32(bytes + 4), 1);
    cr_assert_eq(rd32(bytes + 16), 2);
    cr_assert_eq(rd32(bytes + 24), 64);
    cr_assert_eq(rd32(bytes + 32), 100);
    /* tensors follow the header verbatim, wte first */
    cr_assert_eq(memcmp(bytes + 128, m->wte, 4 * 64), 0);

    uint8_t vh[32];
    hash_of("vocab-a", vh);
    tlm_model *l;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_load(path_in("m.bin"), 100, vh, &l, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(&l->cfg, &m->cfg, sizeof m->cfg), 0);
    cr_assert_eq(memcmp(l->vocab_hash, vh, 32), 0);
    cr_assert_eq(l->n_params, m->n_params);
    cr_assert_eq(memcmp(l->params, m->params, 4 * m->n_params), 0);
    cr_assert_eq(l->lnf_b, l->params + l->n_params - 64);
    tlm_model_free(l);
    /* no expectation given: any vocabulary is accepted */
    cr_assert_eq(tlm_model_load(path_in("m.bin"), 0, NULL, &l, &err), 0, "%s", err.msg);
    tlm_model_free(l);
    /* no temporary file left behind */
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path_in("m.bin"), (long)getpid());
    cr_assert_neq(access(tmp, F_OK), 0);
    tlm_model_free(m);
    free(bytes);
}

Test(model, refuses_truncated_and_trailing)
{
    size_t n;
    unsigned char *b = good_file("m.bin", &n, NULL);
    size_t cuts[] = {0, 3, 64, 127, 128, 129, 1000, n / 2, n - 4, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++)
        expect_refused(b, cuts[i], NULL, "file", "truncated");
    unsigned char *longer = calloc(n + 8, 1);
    memcpy(longer, b, n);
    expect_refused(longer, n + 8, NULL, "file", "trailing");
    free(longer);
    free(b);
}

Test(model, refuses_wrong_magic_version_checksum)
{
    size_t n;
    unsigned char *b = good_file("m.bin", &n, NULL);
    unsigned char *c = malloc(n);

    memcpy(c, b, n);
    memcpy(c, "GGUF", 4);
    expect_refused(c, n, NULL, "header.magic", "not a tlm weight file");

    memcpy(c, b, n);
    wr32(c + 4, 2);
    fix_checksum(c);
    expect_refused(c, n, NULL, "header.version", "version 2");
    wr32(c + 4, 0);
    expect_refused(c, n, NULL, "header.version", NULL); /* checked before the checksum */

    memcpy(c, b, n);
    c[20] ^= 1; /* n_head, checksum not updated */
    expect_refused(c, n, NULL, "header.checksum", "corrupt");

    memcpy(c, b, n);
    wr32(c + 12, 2); /* dtype */
    fix_checksum(c);
    expect_refused(c, n, NULL, "header.dtype", NULL);

    memcpy(c, b, n);
    wr32(c + 8, 256); /* header_size */
    fix_checksum(c);
    expect_refused(c, n, NULL, "header.header_size", NULL);
    free(c);
    free(b);
}

Test(model, refuses_absurd_sizes)
{
    size_t n;
    unsigned char *b = good_file("m.bin", &n, NULL);
    unsigned char *c = malloc(n);
    struct {
        int off;
        uint32_t v;
        const char *field;
    } cases[] = {
        {16, 0, "n_layer"},
        {16, 65, "n_layer"},
        {16, 0xFFFFFFFFu, "n_layer"},
        {20, 3, "n_head"},
        {20, 0, "n_head"},
        {24, 5000, "n_embd"},
        {24, 0x80000000u, "n_embd"},
        {28, 70000, "n_ctx"},
        {28, 0, "n_ctx"},
        {32, 1u << 21, "vocab_size"},
        {32, 0, "vocab_size"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(c, b, n);
        wr32(c + cases[i].off, cases[i].v);
        fix_checksum(c);
        expect_refused(c, n, NULL, cases[i].field, NULL);
    }
    /* a plausible config that does not match the file's size */
    memcpy(c, b, n);
    wr32(c + 16, 3); /* n_layer 3: more parameters than stored */
    fix_checksum(c);
    expect_refused(c, n, NULL, "header.n_params", NULL);
    /* n_params fixed up too: then file_size disagrees */
    tlm_config three = SMALL;
    three.n_layer = 3;
    uint64_t np = tlm_config_param_count(&three);
    for (int i = 0; i < 8; i++)
        c[40 + i] = (unsigned char)(np >> (8 * i));
    fix_checksum(c);
    expect_refused(c, n, NULL, "header.file_size", NULL);
    /* and with file_size matching the header: the real size disagrees (truncated) */
    uint64_t fs = 128 + 4 * np;
    for (int i = 0; i < 8; i++)
        c[48 + i] = (unsigned char)(fs >> (8 * i));
    fix_checksum(c);
    expect_refused(c, n, NULL, "file", "truncated");
    free(c);
    free(b);
}

Test(model, refuses_wrong_vocab)
{
    free(good_file("m.bin", &(size_t){0}, NULL));
    uint8_t other[32];
    hash_of("vocab-b", other);
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_load(path_in("m.bin"), 0, other, &m, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "vocab_hash");
    cr_assert_null(m);
    cr_assert_eq(tlm_model_load(path_in("m.bin"), 101, NULL, &m, &err), TLM_EINVAL);
    cr_assert_str_eq(err.field, "vocab_size");
    cr_assert_not_null(strstr(err.msg, "100"), "%s", err.msg);
}

Test(model, refuses_corrupt_payload_and_nonfinite)
{
    size_t n;
    unsigned char *b = good_file("m.bin", &n, NULL);
    unsigned char *c = malloc(n);
    memcpy(c, b, n);
    c[n - 7] ^= 0x10;
    expect_refused(c, n, NULL, "header.payload_sha256", "corrupt");

    /* a NaN with a matching payload hash (a buggy trainer, not a bit flip) */
    memcpy(c, b, n);
    float nan = NAN;
    memcpy(c + 128 + 4 * 1000, &nan, 4);
    unsigned len;
    cr_assert(EVP_Digest(c + 128, n - 128, c + 88, &len, EVP_sha256(), NULL));
    fix_checksum(c);
    expect_refused(c, n, NULL, "params", "not finite");
    free(c);
    free(b);
}

Test(model, refuses_garbage_without_crashing)
{
    size_t n;
    unsigned char *b = good_file("m.bin", &n, NULL);
    unsigned char *c = malloc(n);
    uint64_t s = 12345;
    for (int trial = 0; trial < 200; trial++) {
        size_t len = (trial % 4 == 0) ? n : (size_t)(s % (n + 64));
        for (size_t i = 0; i < len && i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            c[i] = (unsigned char)(s >> 56);
        }
        if (trial % 2) memcpy(c, "TLMW\x01\0\0\0", len < 8 ? len : 8);
        if (trial % 8 == 1 && len >= 128) fix_checksum(c);
        expect_refused(c, len < n ? len : n, NULL, NULL, NULL);
    }
    free(c);
    free(b);
}

Test(model, refuses_missing_and_directory)
{
    tlm_model *m;
    tlm_error err = {0};
    cr_assert_eq(tlm_model_load(path_in("nope.bin"), 0, NULL, &m, &err), TLM_ENOTFOUND);
    cr_assert_not_null(strstr(err.msg, "nope.bin"));
    cr_assert_lt(tlm_model_load(dir, 0, NULL, &m, &err), 0);
    cr_assert_lt(tlm_model_save(NULL, path_in("x"), &err), 0);
    /* save into a directory that does not exist */
    tlm_model *ok;
    cr_assert_eq(tlm_model_new(&SMALL, NULL, &ok, NULL), 0);
    cr_assert_eq(tlm_model_save(ok, "/nonexistent-dir/x.bin", &err), TLM_EIO);
    tlm_model_free(ok);
}
