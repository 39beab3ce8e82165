#include "compiler/lang/lang.h"
#include "compiler/tlm/tlm.h"
#include "tools/tlm/cli.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "proto/error.h"
#include "proto/workload.h"

/* Messages quote user input; a stray newline must not break the one-line promise. */
static void put_line_part(const char *s)
{
    for (; *s; s++)
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, stderr);
}

int cli_report(const tlm_error *err)
{
    fputs("tlm: ", stderr);
    if (err->field[0]) {
        put_line_part(err->field);
        fputs(": ", stderr);
    }
    put_line_part(err->msg[0] ? err->msg : tlm_err_code_name(err->code));
    fputc('\n', stderr);
    switch (err->code) {
    case TLM_EINVAL:
    case TLM_EUNSUPPORTED:
    case TLM_ELIMIT:
    case PROTO_EJSON:
        return CLI_USAGE;
    }
    return CLI_FAIL;
}

int cli_usage_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fputs("tlm: ", stderr);
    put_line_part(msg);
    fputc('\n', stderr);
    return CLI_USAGE;
}

char *cli_read_file(const char *flag, const char *path, size_t *len, tlm_error *err)
{
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        tlm_err_set(err, TLM_EINVAL, flag, "cannot open \"%s\": %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            if (cap > CLI_MAX_INPUT) {
                tlm_err_set(err, TLM_EINVAL, flag, "\"%s\" is larger than %u bytes", path,
                            CLI_MAX_INPUT);
                free(buf);
                buf = NULL;
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - 1 - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f)) {
                tlm_err_set(err, TLM_EINVAL, flag, "cannot read \"%s\": %s", path, strerror(errno));
                free(buf);
                buf = NULL;
            }
            break;
        }
    }
    if (!buf && err && !err->code) tlm_err_set(err, TLM_ENOMEM, flag, "out of memory");
    if (!is_stdin) fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = n;
    }
    return buf;
}

int cli_write_file(const char *path, const void *data, size_t len, tlm_error *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return tlm_err_set(err, TLM_EIO, "-o", "cannot write \"%s\": %s", tmp, strerror(errno));
    bool ok = fwrite(data, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path)) {
        int e = errno;
        unlink(tmp);
        return tlm_err_set(err, TLM_EIO, "-o", "cannot write \"%s\": %s", path, strerror(e));
    }
    return 0;
}

int cli_load_workload(const char *flag, const char *arg, ir_workload *w, tlm_error *err)
{
    if (arg[0] != '@') return proto_workload_from_string(arg, strlen(arg), w, err);
    size_t len = 0;
    tlm_err_clear(err);
    char *text = cli_read_file(flag, arg + 1, &len, err);
    if (!text) return err->code ? err->code : TLM_EIO;
    int rc = proto_workload_from_string(text, len, w, err);
    free(text);
    return rc;
}

int cli_print_json(const json_t *j)
{
    if (json_dumpf(j, stdout, JSON_INDENT(2)) || fputc('\n', stdout) == EOF || fflush(stdout))
        return CLI_FAIL;
    return CLI_OK;
}

int cli_parse_u64(const char *flag, const char *text, uint64_t max, uint64_t *out, tlm_error *err)
{
    /* strtoull accepts blanks and a minus sign (and wraps it); neither is a count or a seed. */
    if (text[0] < '0' || text[0] > '9')
        return tlm_err_set(err, TLM_EINVAL, flag, "expected a non-negative integer, got \"%s\"",
                           text);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (*end)
        return tlm_err_set(err, TLM_EINVAL, flag, "expected a non-negative integer, got \"%s\"",
                           text);
    if (errno == ERANGE)
        return tlm_err_set(err, TLM_EINVAL, flag, "%s is too large (at most %" PRIu64 ")", text,
                           max);
    if (v > max)
        return tlm_err_set(err, TLM_EINVAL, flag, "%llu is too large (at most %" PRIu64 ")", v,
                           max);
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_prior(const char *flag, const char *text, double *out, tlm_error *err)
{
    char *end;
    double v = strtod(text, &end);
    if (end == text || *end || !isfinite(v) || v < 0.0 || v > 100.0)
        return tlm_err_set(err, TLM_EINVAL, flag,
                           "expected a bonus in logits from 0 to 100 (0 = no prior), got \"%s\"",
                           text);
    *out = v;
    return 0;
}

uint64_t cli_seed_state(uint64_t seed)
{
    /* splitmix64: nearby seeds give unrelated states, and the state is never 0 (xorshift's
     * fixed point). */
    uint64_t x = seed + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x ? x : 1;
}

int cli_load_weights(const char *flag, const char *path, struct tlm_model **out, tlm_error *err)
{
    uint8_t vh[32];
    lang_vocab_hash(vh);
    if (!tlm_model_load(path, lang_vocab_size(), vh, out, err)) {
        tlm_weights_info wi;
        tlm_weights_manifest(path, &wi);
        (*out)->default_prior = (float)wi.prior;
        return 0;
    }
    err->code = TLM_EINVAL;
    snprintf(err->field, sizeof err->field, "%s", flag);
    return err->code;
}
