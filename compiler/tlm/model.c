/* model.c — GPT-2 parameters: config limits, layout, GPT-2 init, the weight file.
 *
 * File layout (model_weights/README.md is the reference, keep both in step): a 128-byte
 * little-endian header, then every parameter as float32 little-endian in tlm_model.params
 * order. The loader checks the header fields one by one, the file size the header implies
 * against the real size (before allocating anything that size), the payload SHA-256, and
 * that every weight is finite.
 */
#include "compiler/tlm/tlm.h"
#include "compiler/util/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>


#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the weight file stores float32 little-endian; add byte swapping for this host"
#endif

static const char TLM_MAGIC[4] = {'T', 'L', 'M', 'W'};
enum { TLM_DTYPE_F32 = 1 };

/* Header offsets. */
enum {
    H_MAGIC = 0,
    H_VERSION = 4,
    H_HEADER_SIZE = 8,
    H_DTYPE = 12,
    H_N_LAYER = 16,
    H_N_HEAD = 20,
    H_N_EMBD = 24,
    H_N_CTX = 28,
    H_VOCAB = 32,
    H_RESERVED0 = 36,
    H_N_PARAMS = 40,
    H_FILE_SIZE = 48,
    H_VOCAB_HASH = 56,
    H_PAYLOAD_SHA = 88,
    H_RESERVED1 = 120,
    H_CHECKSUM = 124,
};

/* ---- config ---- */

int tlm_config_check(const tlm_config *c, tlm_error *err)
{
    if (!c) return tlm_err_set(err, TLM_EINVAL, "config", "no model configuration given");
    if (c->n_layer < 1 || c->n_layer > TLM_MAX_LAYERS)
        return tlm_err_set(err, TLM_ELIMIT, "n_layer", "n_layer is %d; allowed 1..%d", c->n_layer,
                           TLM_MAX_LAYERS);
    if (c->n_embd < 1 || c->n_embd > TLM_MAX_EMBD)
        return tlm_err_set(err, TLM_ELIMIT, "n_embd", "n_embd is %d; allowed 1..%d", c->n_embd,
                           TLM_MAX_EMBD);
    if (c->n_head < 1 || c->n_head > TLM_MAX_HEADS)
        return tlm_err_set(err, TLM_ELIMIT, "n_head", "n_head is %d; allowed 1..%d", c->n_head,
                           TLM_MAX_HEADS);
    if (c->n_embd % c->n_head != 0)
        return tlm_err_set(err, TLM_EINVAL, "n_head",
                           "n_embd (%d) is not a multiple of n_head (%d)", c->n_embd, c->n_head);
    if (c->n_ctx < 1 || c->n_ctx > TLM_MAX_CTX)
        return tlm_err_set(err, TLM_ELIMIT, "n_ctx", "n_ctx is %d; allowed 1..%d", c->n_ctx,
                           TLM_MAX_CTX);
    if (c->vocab_size < 1 || c->vocab_size > TLM_MAX_VOCAB)
        return tlm_err_set(err, TLM_ELIMIT, "vocab_size", "vocab_size is %d; allowed 1..%d",
                           c->vocab_size, TLM_MAX_VOCAB);
    uint64_t n = tlm_config_param_count(c);
    if (n > TLM_MAX_PARAMS)
        return tlm_err_set(err, TLM_ELIMIT, "n_params",
                           "the configuration has %llu parameters; at most %llu allowed",
                           (unsigned long long)n, (unsigned long long)TLM_MAX_PARAMS);
    return 0;
}

uint64_t tlm_config_param_count(const tlm_config *c)
{
    /* Every factor is bounded by the limits, so nothing here overflows 64 bits. */
    uint64_t C = (uint64_t)c->n_embd, L = (uint64_t)c->n_layer;
    uint64_t per_layer =
        2 * C + (C * 3 * C + 3 * C) + (C * C + C) + 2 * C + (C * 4 * C + 4 * C) + (4 * C * C + C);
    return (uint64_t)c->vocab_size * C + (uint64_t)c->n_ctx * C + L * per_layer + 2 * C;
}

/* Points the named tensors into params, in file order. */
static void model_layout(tlm_model *m)
{
    size_t C = (size_t)m->cfg.n_embd;
    float *p = m->params;
#define TAKE(dst, n)                                                                               \
    do {                                                                                           \
        (dst) = p;                                                                                 \
        p += (n);                                                                                  \
    } while (0)
    TAKE(m->wte, (size_t)m->cfg.vocab_size * C);
    TAKE(m->wpe, (size_t)m->cfg.n_ctx * C);
    for (int l = 0; l < m->cfg.n_layer; l++) {
        tlm_layer *ly = &m->layers[l];
        TAKE(ly->ln1_w, C);
        TAKE(ly->ln1_b, C);
        TAKE(ly->qkv_w, C * 3 * C);
        TAKE(ly->qkv_b, 3 * C);
        TAKE(ly->attn_proj_w, C * C);
        TAKE(ly->attn_proj_b, C);
        TAKE(ly->ln2_w, C);
        TAKE(ly->ln2_b, C);
        TAKE(ly->fc_w, C * 4 * C);
        TAKE(ly->fc_b, 4 * C);
        TAKE(ly->fc_proj_w, 4 * C * C);
        TAKE(ly->fc_proj_b, C);
    }
    TAKE(m->lnf_w, C);
    TAKE(m->lnf_b, C);
#undef TAKE
    if ((size_t)(p - m->params) != m->n_params) abort(); /* our own invariant */
}

int tlm_model_new(const tlm_config *cfg, const uint8_t *vocab_hash, tlm_model **out, tlm_error *err)
{
    *out = NULL;
    int rc = tlm_config_check(cfg, err);
    if (rc) return rc;
    uint64_t n = tlm_config_param_count(cfg);
    if (n > SIZE_MAX / sizeof(float))
        return tlm_err_set(err, TLM_ELIMIT, "n_params", "model too large for this host");
    tlm_model *m = calloc(1, sizeof *m);
    if (!m) return tlm_err_set(err, TLM_ENOMEM, "model", "out of memory");
    m->cfg = *cfg;
    if (vocab_hash) memcpy(m->vocab_hash, vocab_hash, TLM_HASH_SIZE);
    m->n_params = (size_t)n;
    m->params = calloc(m->n_params, sizeof(float));
    m->layers = calloc((size_t)cfg->n_layer, sizeof *m->layers);
    if (!m->params || !m->layers) {
        tlm_model_free(m);
        return tlm_err_set(err, TLM_ENOMEM, "params", "cannot allocate %zu parameters", (size_t)n);
    }
    model_layout(m);
    *out = m;
    return 0;
}

void tlm_model_free(tlm_model *m)
{
    if (!m) return;
    free(m->params);
    free(m->layers);
    free(m);
}

/* ---- GPT-2 init ---- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]: 53 random bits, never 0 so log() is finite. */
static double uniform01(uint64_t *s)
{
    return ((double)(splitmix64(s) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

static void fill_normal(float *p, size_t n, double std, uint64_t *s)
{
    for (size_t i = 0; i < n; i += 2) {
        double u1 = uniform01(s), u2 = uniform01(s);
        double r = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
        p[i] = (float)(std * r * cos(th));
        if (i + 1 < n) p[i + 1] = (float)(std * r * sin(th));
    }
}

static void fill_const(float *p, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        p[i] = v;
}

int tlm_model_init_random(const tlm_config *cfg, const uint8_t *vocab_hash, uint64_t seed,
                          tlm_model **out, tlm_error *err)
{
    int rc = tlm_model_new(cfg, vocab_hash, out, err);
    if (rc) return rc;
    tlm_model *m = *out;
    size_t C = (size_t)cfg->n_embd;
    uint64_t s = seed;
    double std = 0.02, std_res = 0.02 / sqrt(2.0 * cfg->n_layer);
    fill_normal(m->wte, (size_t)cfg->vocab_size * C, std, &s);
    fill_normal(m->wpe, (size_t)cfg->n_ctx * C, std, &s);
    for (int l = 0; l < cfg->n_layer; l++) {
        tlm_layer *ly = &m->layers[l];
        fill_const(ly->ln1_w, C, 1.0f);
        fill_normal(ly->qkv_w, C * 3 * C, std, &s);
        fill_normal(ly->attn_proj_w, C * C, std_res, &s);
        fill_const(ly->ln2_w, C, 1.0f);
        fill_normal(ly->fc_w, C * 4 * C, std, &s);
        fill_normal(ly->fc_proj_w, 4 * C * C, std_res, &s);
        /* biases stay 0 (calloc) */
    }
    fill_const(m->lnf_w, C, 1.0f);
    return 0;
}

/* ---- header encoding ---- */

static void put32(uint8_t *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *b)
{
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static uint64_t get64(const uint8_t *b)
{
    return (uint64_t)get32(b) | (uint64_t)get32(b + 4) << 32;
}

/* FNV-1a 32 over the header bytes before the checksum field. */
static uint32_t header_checksum(const uint8_t *h)
{
    uint32_t x = 2166136261u;
    for (int i = 0; i < H_CHECKSUM; i++) {
        x ^= h[i];
        x *= 16777619u;
    }
    return x;
}

/* the first 8 bytes are enough to tell hashes apart in a message */
static void hex8(const uint8_t *h, char *out)
{
    tlm_hex(h, 8, out);
}

/* ---- save ---- */

static int write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int tlm_model_save(const tlm_model *m, const char *path, tlm_error *err)
{
    if (!m || !path) return tlm_err_set(err, TLM_EINVAL, "path", "no model or path given");
    uint8_t h[TLM_HEADER_SIZE] = {0};
    memcpy(h + H_MAGIC, TLM_MAGIC, 4);
    put32(h + H_VERSION, TLM_FORMAT_VERSION);
    put32(h + H_HEADER_SIZE, TLM_HEADER_SIZE);
    put32(h + H_DTYPE, TLM_DTYPE_F32);
    put32(h + H_N_LAYER, (uint32_t)m->cfg.n_layer);
    put32(h + H_N_HEAD, (uint32_t)m->cfg.n_head);
    put32(h + H_N_EMBD, (uint32_t)m->cfg.n_embd);
    put32(h + H_N_CTX, (uint32_t)m->cfg.n_ctx);
    put32(h + H_VOCAB, (uint32_t)m->cfg.vocab_size);
    put64(h + H_N_PARAMS, (uint64_t)m->n_params);
    put64(h + H_FILE_SIZE, TLM_HEADER_SIZE + 4 * (uint64_t)m->n_params);
    memcpy(h + H_VOCAB_HASH, m->vocab_hash, TLM_HASH_SIZE);
    if (tlm_sha256(m->params, m->n_params * sizeof(float), h + H_PAYLOAD_SHA))
        return tlm_err_set(err, TLM_EIO, "payload_sha256", "SHA-256 failed");
    put32(h + H_CHECKSUM, header_checksum(h));

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return tlm_err_set(err, TLM_ENOMEM, "path", "out of memory");
    snprintf(tmp, plen + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return tlm_err_set(err, TLM_EIO, "path", "cannot create %s.tmp: %s", path, strerror(e));
    }
    int bad = write_all(fd, h, sizeof h) || write_all(fd, m->params, m->n_params * sizeof(float));
    int e = errno;
    if (!bad && fsync(fd) != 0) bad = 1, e = errno;
    if (close(fd) != 0 && !bad) bad = 1, e = errno;
    if (!bad && rename(tmp, path) != 0) bad = 1, e = errno;
    if (bad) {
        unlink(tmp);
        free(tmp);
        return tlm_err_set(err, TLM_EIO, "path", "cannot write %s: %s", path, strerror(e));
    }
    free(tmp);
    return 0;
}

/* ---- load ---- */

static int read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) return 1; /* shorter than fstat said: changed under us */
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int load_fd(int fd, const char *path, int expect_vocab, const uint8_t *expect_hash,
                   tlm_model **out, tlm_error *err)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return tlm_err_set(err, TLM_EIO, "file", "cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tlm_err_set(err, TLM_EINVAL, "file", "%s is not a regular file", path);
    uint64_t fsize = (uint64_t)st.st_size;
    if (fsize < TLM_HEADER_SIZE)
        return tlm_err_set(err, TLM_EINVAL, "file",
                           "%s is %llu bytes, shorter than the %d-byte header (truncated?)", path,
                           (unsigned long long)fsize, TLM_HEADER_SIZE);
    uint8_t h[TLM_HEADER_SIZE];
    if (read_all(fd, h, sizeof h) != 0)
        return tlm_err_set(err, TLM_EIO, "file", "cannot read the header of %s", path);
    if (memcmp(h + H_MAGIC, TLM_MAGIC, 4) != 0)
        return tlm_err_set(err, TLM_EINVAL, "header.magic",
                           "%s is not a tlm weight file (magic %02x%02x%02x%02x, expected "
                           "\"TLMW\")",
                           path, h[0], h[1], h[2], h[3]);
    uint32_t version = get32(h + H_VERSION);
    if (version != TLM_FORMAT_VERSION)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "header.version",
                           "%s has format version %u; this build reads version %d", path, version,
                           TLM_FORMAT_VERSION);
    if (get32(h + H_CHECKSUM) != header_checksum(h))
        return tlm_err_set(err, TLM_EINVAL, "header.checksum",
                           "%s: header checksum mismatch (stored %08x, computed %08x): the "
                           "header is corrupt",
                           path, get32(h + H_CHECKSUM), header_checksum(h));
    if (get32(h + H_HEADER_SIZE) != TLM_HEADER_SIZE)
        return tlm_err_set(err, TLM_EINVAL, "header.header_size",
                           "header_size is %u; version %d headers are %d bytes",
                           get32(h + H_HEADER_SIZE), TLM_FORMAT_VERSION, TLM_HEADER_SIZE);
    if (get32(h + H_DTYPE) != TLM_DTYPE_F32)
        return tlm_err_set(err, TLM_EUNSUPPORTED, "header.dtype",
                           "dtype is %u; only 1 (float32) is supported", get32(h + H_DTYPE));
    if (get32(h + H_RESERVED0) != 0 || get32(h + H_RESERVED1) != 0)
        return tlm_err_set(err, TLM_EINVAL, "header.reserved", "reserved header fields are not 0");

    /* Sizes are u32 in the file; anything above INT_MAX is above every limit too. */
    const uint32_t sz[5] = {get32(h + H_N_LAYER), get32(h + H_N_HEAD), get32(h + H_N_EMBD),
                            get32(h + H_N_CTX), get32(h + H_VOCAB)};
    static const char *const names[5] = {"n_layer", "n_head", "n_embd", "n_ctx", "vocab_size"};
    for (int i = 0; i < 5; i++)
        if (sz[i] > (uint32_t)INT32_MAX)
            return tlm_err_set(err, TLM_ELIMIT, names[i], "%s: header.%s is %u, absurdly large",
                               path, names[i], sz[i]);
    tlm_config cfg = {(int)sz[0], (int)sz[1], (int)sz[2], (int)sz[3], (int)sz[4]};
    int rc = tlm_config_check(&cfg, err);
    if (rc) {
        if (err) {
            char m2[sizeof err->msg];
            memcpy(m2, err->msg, sizeof m2);
            snprintf(err->msg, sizeof err->msg, "%.200s: %.300s", path, m2);
        }
        return rc;
    }
    uint64_t n = tlm_config_param_count(&cfg);
    if (get64(h + H_N_PARAMS) != n)
        return tlm_err_set(err, TLM_EINVAL, "header.n_params",
                           "%s: n_params is %llu but the configuration has %llu", path,
                           (unsigned long long)get64(h + H_N_PARAMS), (unsigned long long)n);
    uint64_t want = TLM_HEADER_SIZE + 4 * n;
    if (get64(h + H_FILE_SIZE) != want)
        return tlm_err_set(err, TLM_EINVAL, "header.file_size",
                           "%s: header.file_size is %llu but the configuration needs %llu", path,
                           (unsigned long long)get64(h + H_FILE_SIZE), (unsigned long long)want);
    if (fsize != want)
        return tlm_err_set(err, TLM_EINVAL, "file",
                           "%s is %llu bytes but its header describes %llu bytes (%s)", path,
                           (unsigned long long)fsize, (unsigned long long)want,
                           fsize < want ? "truncated" : "trailing data");
    if (expect_vocab > 0 && cfg.vocab_size != expect_vocab)
        return tlm_err_set(err, TLM_EINVAL, "vocab_size",
                           "%s was trained for a vocabulary of %d tokens; this build's has %d",
                           path, cfg.vocab_size, expect_vocab);
    if (expect_hash && memcmp(expect_hash, h + H_VOCAB_HASH, TLM_HASH_SIZE) != 0) {
        char a[17], b[17];
        hex8(h + H_VOCAB_HASH, a);
        hex8(expect_hash, b);
        return tlm_err_set(err, TLM_EINVAL, "vocab_hash",
                           "%s was trained for vocabulary %s...; this build's vocabulary is "
                           "%s... (retrain or use the matching build)",
                           path, a, b);
    }

    tlm_model *m;
    rc = tlm_model_new(&cfg, h + H_VOCAB_HASH, &m, err);
    if (rc) return rc;
    int r = read_all(fd, m->params, m->n_params * sizeof(float));
    if (r != 0) {
        tlm_model_free(m);
        return tlm_err_set(err, TLM_EIO, "file", "cannot read the tensors of %s%s", path,
                           r > 0 ? ": file shrank while reading" : "");
    }
    uint8_t sha[32];
    if (tlm_sha256(m->params, m->n_params * sizeof(float), sha)) {
        tlm_model_free(m);
        return tlm_err_set(err, TLM_EIO, "payload_sha256", "SHA-256 failed");
    }
    if (memcmp(sha, h + H_PAYLOAD_SHA, 32) != 0) {
        tlm_model_free(m);
        return tlm_err_set(err, TLM_EINVAL, "header.payload_sha256",
                           "%s: the tensor data does not match its SHA-256 (corrupt file)", path);
    }
    for (size_t i = 0; i < m->n_params; i++) {
        if (!isfinite(m->params[i])) {
            tlm_model_free(m);
            return tlm_err_set(err, TLM_EINVAL, "params", "%s: parameter %zu is not finite", path,
                               i);
        }
    }
    *out = m;
    return 0;
}

int tlm_model_load(const char *path, int expect_vocab_size, const uint8_t *expect_vocab_hash,
                   tlm_model **out, tlm_error *err)
{
    *out = NULL;
    if (!path) return tlm_err_set(err, TLM_EINVAL, "path", "no weight file path given");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return tlm_err_set(err, e == ENOENT ? TLM_ENOTFOUND : TLM_EIO, "path",
                           "cannot open weight file %s: %s", path, strerror(e));
    }
    int rc = load_fd(fd, path, expect_vocab_size, expect_vocab_hash, out, err);
    close(fd);
    return rc;
}

static char *manifest_trim(char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = 0;
    return s;
}

/* Reads the MANIFEST beside path: trained = true, its sha256, serve = default and the
 * decoding prior (prior = X; 0 when absent or not a finite X >= 0). */
static void manifest_read(const char *path, bool *trained, char *sha, bool *held_back,
                          double *prior)
{
    *trained = false;
    *held_back = false;
    *prior = 0.0;
    sha[0] = 0;
    char dir[1024], mpath[1100];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    snprintf(mpath, sizeof mpath, "%s/MANIFEST", dir);
    FILE *f = fopen(mpath, "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *s = manifest_trim(line);
        const char *key = !strncmp(s, "trained", 7) ? "trained"
                          : !strncmp(s, "sha256", 6) ? "sha256"
                          : !strncmp(s, "serve", 5)  ? "serve"
                          : !strncmp(s, "prior", 5)  ? "prior"
                                                     : NULL;
        if (!key) continue;
        s = manifest_trim(s + strlen(key));
        if (*s != '=' && *s != ':') continue;
        char *v = manifest_trim(s + 1);
        if (!strcmp(key, "trained"))
            *trained = !strcmp(v, "true");
        else if (!strcmp(key, "sha256"))
            snprintf(sha, 65, "%.64s", v);
        else if (!strcmp(key, "prior")) {
            char *end;
            double x = strtod(v, &end);
            *prior = end != v && !*end && isfinite(x) && x >= 0.0 && x <= 100.0 ? x : 0.0;
        } else
            *held_back = !strcmp(v, "default");
    }
    fclose(f);
}

void tlm_weights_manifest(const char *path, tlm_weights_info *out)
{
    memset(out, 0, sizeof *out);
    if (tlm_sha256_file_hex(path, out->sha)) out->sha[0] = 0;
    bool trained, held;
    char msha[65];
    double prior;
    manifest_read(path, &trained, msha, &held, &prior);
    out->trained = out->sha[0] && trained && !strcasecmp(msha, out->sha);
    out->held_back = held;
    out->prior = out->trained ? prior : 0.0;
}

bool tlm_weights_trained(const char *path, char sha_hex[65])
{
    tlm_weights_info w;
    tlm_weights_manifest(path, &w);
    if (sha_hex) memcpy(sha_hex, w.sha, sizeof w.sha);
    return w.trained;
}
