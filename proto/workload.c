/* workload.c — JSON <-> ir_workload. JSON-level checks here (types, presence, unknown keys,
 * array lengths, 64-bit range); meaning (extents, geometry, sizes) in ir_workload_check. */
#include "proto/workload.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    unsigned flags;
    tlm_error *err;
    const ir_op_info *info;
} dctx;

/* Attribute fields in the order encode writes them and error messages list them. */
static const struct {
    const char *name;
    unsigned flag;
} attr_fields[] = {
    {"transpose_a", IR_F_TRANSPOSE}, {"transpose_b", IR_F_TRANSPOSE},
    {"stride", IR_F_STRIDE},         {"pad", IR_F_PAD},
    {"dilation", IR_F_DILATION},     {"groups", IR_F_GROUPS},
    {"layout", IR_F_LAYOUT},         {"eps", IR_F_EPS},
};
#define N_ATTR ((int)(sizeof attr_fields / sizeof attr_fields[0]))

/* Appends to a fixed buffer, silently truncating: these build error messages only. */
static void cat(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void cat(char *buf, size_t cap, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* A string value in quotes, cut at 32 bytes: messages echo user input but stay short. */
static void quoted(const json_t *v, char *buf, size_t cap)
{
    const char *s = json_string_value(v);
    size_t n = strlen(s);
    snprintf(buf, cap, "\"%.*s%s\"%s", n > 32 ? 32 : (int)n, s, n > 32 ? "..." : "",
             n != json_string_length(v) ? " (with a NUL byte)" : "");
}

/* What a value is, for "(got ...)": the value itself for scalars, its type otherwise. */
static void describe(const json_t *v, char *buf, size_t cap)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT:
        snprintf(buf, cap, "an object");
        break;
    case JSON_ARRAY:
        snprintf(buf, cap, "an array");
        break;
    case JSON_STRING: {
        char q[48];
        quoted(v, q, sizeof q);
        snprintf(buf, cap, "the string %s", q);
        break;
    }
    case JSON_INTEGER:
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        break;
    case JSON_REAL: {
        double d = json_real_value(v);
        /* Keep a decimal point on integral reals so "got 16.0" does not read like a valid 16. */
        if (d == floor(d) && fabs(d) < 1e15)
            snprintf(buf, cap, "%.1f", d);
        else
            snprintf(buf, cap, "%.17g", d);
        break;
    }
    case JSON_TRUE:
        snprintf(buf, cap, "true");
        break;
    case JSON_FALSE:
        snprintf(buf, cap, "false");
        break;
    case JSON_NULL:
        snprintf(buf, cap, "null");
        break;
    }
}

/* A JSON string equal to a C string we can look up: no embedded NUL. */
static const char *plain_string(const json_t *v)
{
    if (!json_is_string(v)) return NULL;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v) ? s : NULL;
}

/* An integer field. `what` completes "must be ..." (e.g. "a positive integer"). */
static int get_int(dctx *c, const json_t *v, const char *field, const char *what, int64_t *out)
{
    char got[64];
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    if (json_is_real(v) && (c->flags & PROTO_DECODE_INTS_AS_REAL)) {
        double d = json_real_value(v);
        /* 2^63 is exactly representable; everything below it that is integral converts. */
        if (d == floor(d) && d >= -9223372036854775808.0 && d < 9223372036854775808.0) {
            *out = (int64_t)d;
            return 0;
        }
        if (d == floor(d)) {
            snprintf(got, sizeof got, "%.17g", d);
            return tlm_err_set(c->err, TLM_EINVAL, field,
                               "must be %s (got %s, beyond 64-bit integers)", what, got);
        }
    }
    describe(v, got, sizeof got);
    return tlm_err_set(c->err, TLM_EINVAL, field, "must be %s (got %s)", what, got);
}

static void list_ops(char *buf, size_t cap)
{
    buf[0] = 0;
    for (int i = 0; i < IR_OP_COUNT; i++) {
        cat(buf, cap, "%s%s", i ? ", " : "", ir_op_get((ir_op)i)->name);
        if (i == IR_OP_DENSE) cat(buf, cap, ", matmul (= dense)");
    }
}

static void list_fields(const ir_op_info *in, char *buf, size_t cap)
{
    snprintf(buf, cap, "op, shape, dtype, epilogue");
    for (int i = 0; i < N_ATTR; i++)
        if (in->fields & attr_fields[i].flag) cat(buf, cap, ", %s", attr_fields[i].name);
}

static void list_keys(const ir_op_info *in, char *buf, size_t cap)
{
    buf[0] = 0;
    for (int i = 0; i < in->n_keys; i++)
        cat(buf, cap, "%s%s", i ? ", " : "", in->keys[i]);
}

static int decode_op(dctx *c, const json_t *j, ir_op *op)
{
    char allowed[512], got[64];
    list_ops(allowed, sizeof allowed);
    const json_t *v = json_object_get(j, "op");
    if (!v) return tlm_err_set(c->err, TLM_EINVAL, "op", "required; one of: %s", allowed);
    if (!json_is_string(v)) {
        describe(v, got, sizeof got);
        return tlm_err_set(c->err, TLM_EINVAL, "op", "must be a string, one of: %s (got %s)",
                           allowed, got);
    }
    const char *s = plain_string(v);
    if (!s || ir_op_from_name(s, op)) {
        quoted(v, got, sizeof got);
        return tlm_err_set(c->err, TLM_EUNSUPPORTED, "op", "unknown op %s; allowed: %s", got,
                           allowed);
    }
    return 0;
}

static int decode_shape(dctx *c, const json_t *v, ir_workload *w)
{
    char keys[128], field[96], got[64];
    list_keys(c->info, keys, sizeof keys);
    if (!json_is_object(v)) {
        describe(v, got, sizeof got);
        return tlm_err_set(c->err, TLM_EINVAL, "shape",
                           "must be an object with the keys %s of op %s (got %s)", keys,
                           c->info->name, got);
    }
    const char *key;
    json_t *x;
    json_object_foreach((json_t *)v, key, x)
    {
        snprintf(field, sizeof field, "shape.%s", key);
        int i = ir_op_key_index(w->op, key);
        if (i < 0)
            return tlm_err_set(c->err, TLM_EINVAL, field,
                               "unknown shape key for op %s; its keys are %s", c->info->name, keys);
        int rc = get_int(c, x, field, "a positive integer", &w->shape[i]);
        if (rc) return rc;
    }
    for (int i = 0; i < c->info->n_keys; i++)
        if (!json_object_get(v, c->info->keys[i])) {
            snprintf(field, sizeof field, "shape.%s", c->info->keys[i]);
            return tlm_err_set(c->err, TLM_EINVAL, field, "required for op %s (its keys are %s)",
                               c->info->name, keys);
        }
    return 0;
}

/* stride, pad, dilation: [h, w], each an integer >= lo. The upper bounds belong to
 * ir_workload_check; the lower one is checked here because a pool's stride of 0 means "the
 * window" inside ir_workload and must not be reachable from the wire. */
static int decode_pair(dctx *c, const json_t *v, const char *name, int64_t lo, int64_t out[2])
{
    char field[32], got[64], what[48];
    snprintf(what, sizeof what, "an integer >= %lld", (long long)lo);
    if (!json_is_array(v) || json_array_size(v) != 2) {
        if (json_is_array(v))
            snprintf(got, sizeof got, "%zu entries", json_array_size(v));
        else
            describe(v, got, sizeof got);
        return tlm_err_set(c->err, TLM_EINVAL, name,
                           "must be an array [h, w] of two integers >= %lld (got %s)",
                           (long long)lo, got);
    }
    for (int d = 0; d < 2; d++) {
        snprintf(field, sizeof field, "%s[%d]", name, d);
        int rc = get_int(c, json_array_get(v, (size_t)d), field, what, &out[d]);
        if (rc) return rc;
        if (out[d] < lo)
            return tlm_err_set(c->err, TLM_EINVAL, field, "must be %s (got %lld)", what,
                               (long long)out[d]);
    }
    return 0;
}

static int decode_epilogue(dctx *c, const json_t *v, ir_workload *w)
{
    char allowed[256], field[32], got[64];
    allowed[0] = 0;
    for (int i = 0; i < IR_EPI_COUNT; i++)
        cat(allowed, sizeof allowed, "%s%s", i ? ", " : "", ir_epilogue_name((ir_epilogue)i));
    cat(allowed, sizeof allowed, ", swish (= silu)");
    if (!json_is_array(v)) {
        describe(v, got, sizeof got);
        return tlm_err_set(c->err, TLM_EINVAL, "epilogue",
                           "must be an array of names from: %s (got %s)", allowed, got);
    }
    if (json_array_size(v) > IR_MAX_EPILOGUE)
        return tlm_err_set(c->err, TLM_EINVAL, "epilogue", "at most %d entries (got %zu)",
                           IR_MAX_EPILOGUE, json_array_size(v));
    w->n_epilogue = 0;
    size_t i;
    json_t *x;
    json_array_foreach((json_t *)v, i, x)
    {
        snprintf(field, sizeof field, "epilogue[%zu]", i);
        const char *s = plain_string(x);
        if (!json_is_string(x)) {
            describe(x, got, sizeof got);
            return tlm_err_set(c->err, TLM_EINVAL, field, "must be a string, one of: %s (got %s)",
                               allowed, got);
        }
        if (!s || ir_epilogue_from_name(s, &w->epilogue[w->n_epilogue])) {
            quoted(x, got, sizeof got);
            return tlm_err_set(c->err, TLM_EUNSUPPORTED, field, "unknown epilogue %s; allowed: %s",
                               got, allowed);
        }
        w->n_epilogue++;
    }
    return 0;
}

/* dtype and layout: `ok` says whether the value was a string naming one of `allowed`. */
static int decode_enum(dctx *c, const json_t *v, const char *field, const char *allowed, bool ok,
                       bool is_string)
{
    char got[64];
    if (ok) return 0;
    if (!is_string) {
        describe(v, got, sizeof got);
        return tlm_err_set(c->err, TLM_EINVAL, field, "must be a string, one of: %s (got %s)",
                           allowed, got);
    }
    quoted(v, got, sizeof got);
    return tlm_err_set(c->err, TLM_EUNSUPPORTED, field, "unsupported %s %s; allowed: %s", field,
                       got, allowed);
}

static int decode_attr(dctx *c, const char *key, const json_t *v, ir_workload *w)
{
    char got[64], allowed[64];
    if (!strcmp(key, "transpose_a") || !strcmp(key, "transpose_b")) {
        if (!json_is_boolean(v)) {
            describe(v, got, sizeof got);
            return tlm_err_set(c->err, TLM_EINVAL, key, "must be true or false (got %s)", got);
        }
        *(key[10] == 'a' ? &w->transpose_a : &w->transpose_b) = json_is_true(v);
        return 0;
    }
    if (!strcmp(key, "stride")) return decode_pair(c, v, key, 1, w->stride);
    if (!strcmp(key, "dilation")) return decode_pair(c, v, key, 1, w->dilation);
    if (!strcmp(key, "pad")) return decode_pair(c, v, key, 0, w->pad);
    if (!strcmp(key, "groups")) return get_int(c, v, key, "a positive integer", &w->groups);
    if (!strcmp(key, "eps")) {
        if (!json_is_number(v)) {
            describe(v, got, sizeof got);
            return tlm_err_set(c->err, TLM_EINVAL, key, "must be a number in (0, 1] (got %s)", got);
        }
        w->eps = json_number_value(v);
        return 0;
    }
    if (!strcmp(key, "dtype")) {
        allowed[0] = 0;
        for (int i = 0; i < IR_DTYPE_COUNT; i++)
            cat(allowed, sizeof allowed, "%s%s", i ? ", " : "", ir_dtype_name((ir_dtype)i));
        const char *s = plain_string(v);
        return decode_enum(c, v, key, allowed, s && !ir_dtype_from_name(s, &w->dtype),
                           json_is_string(v));
    }
    if (!strcmp(key, "layout")) {
        allowed[0] = 0;
        for (int i = 0; i < IR_LAYOUT_COUNT; i++)
            cat(allowed, sizeof allowed, "%s%s", i ? ", " : "", ir_layout_name((ir_layout)i));
        const char *s = plain_string(v);
        return decode_enum(c, v, key, allowed, s && !ir_layout_from_name(s, &w->layout),
                           json_is_string(v));
    }
    return tlm_err_set(c->err, TLM_EINVAL, key, "internal: unhandled field");
}

int proto_workload_decode_opts(const json_t *j, unsigned flags, ir_workload *w, tlm_error *err)
{
    char got[64], allowed[256];
    dctx c = {flags, err, NULL};
    if (!json_is_object(j)) {
        if (!j) return tlm_err_set(err, TLM_EINVAL, "", "a workload is required");
        describe(j, got, sizeof got);
        return tlm_err_set(err, TLM_EINVAL, "",
                           "a workload must be a JSON object such as {\"op\": \"dense\", "
                           "\"shape\": {\"M\": 64, \"N\": 64, \"K\": 64}} (got %s)",
                           got);
    }
    ir_op op;
    int rc = decode_op(&c, j, &op);
    if (rc) return rc;
    ir_workload_init(w, op);
    c.info = ir_op_get(op);
    list_fields(c.info, allowed, sizeof allowed);

    const char *key;
    json_t *v;
    bool have_shape = false;
    json_object_foreach((json_t *)j, key, v)
    {
        if (!strcmp(key, "op")) continue;
        if (!strcmp(key, "shape")) {
            have_shape = true;
            rc = decode_shape(&c, v, w);
        } else if (!strcmp(key, "epilogue")) {
            rc = decode_epilogue(&c, v, w);
        } else if (!strcmp(key, "dtype")) {
            rc = decode_attr(&c, key, v, w);
        } else {
            int a = 0;
            while (a < N_ATTR && strcmp(attr_fields[a].name, key))
                a++;
            if (a == N_ATTR)
                return tlm_err_set(err, TLM_EINVAL, key, "unknown field; op %s takes: %s",
                                   c.info->name, allowed);
            if (!(c.info->fields & attr_fields[a].flag))
                return tlm_err_set(err, TLM_EINVAL, key, "not a field of op %s; it takes: %s",
                                   c.info->name, allowed);
            rc = decode_attr(&c, key, v, w);
        }
        if (rc) return rc;
    }
    if (!have_shape) {
        list_keys(c.info, allowed, sizeof allowed);
        return tlm_err_set(err, TLM_EINVAL, "shape", "required: an object with the keys %s",
                           allowed);
    }
    ir_workload_normalize(w);
    return ir_workload_check(w, err);
}

int proto_workload_decode(const json_t *j, ir_workload *w, tlm_error *err)
{
    return proto_workload_decode_opts(j, 0, w, err);
}

static json_t *pair(const int64_t v[2])
{
    return json_pack("[II]", (json_int_t)v[0], (json_int_t)v[1]);
}

json_t *proto_workload_encode(const ir_workload *win)
{
    const ir_op_info *in = ir_op_get(win->op);
    if (!in) return NULL;
    ir_workload w = *win;
    ir_workload_normalize(&w);
    json_t *o = json_object(), *shape = json_object(), *epi = json_array();
    int bad = !o || !shape || !epi;
    for (int i = 0; !bad && i < in->n_keys; i++)
        bad |= json_object_set_new(shape, in->keys[i], json_integer(w.shape[i]));
    for (int i = 0; !bad && i < w.n_epilogue; i++)
        bad |= json_array_append_new(epi, json_string(ir_epilogue_name(w.epilogue[i])));
    if (!bad) {
        unsigned f = in->fields;
        bad |= json_object_set_new(o, "op", json_string(in->name));
        bad |= json_object_set(o, "shape", shape);
        if (f & IR_F_TRANSPOSE) {
            bad |= json_object_set_new(o, "transpose_a", json_boolean(w.transpose_a));
            bad |= json_object_set_new(o, "transpose_b", json_boolean(w.transpose_b));
        }
        if (f & IR_F_STRIDE) bad |= json_object_set_new(o, "stride", pair(w.stride));
        if (f & IR_F_PAD) bad |= json_object_set_new(o, "pad", pair(w.pad));
        if (f & IR_F_DILATION) bad |= json_object_set_new(o, "dilation", pair(w.dilation));
        if (f & IR_F_GROUPS) bad |= json_object_set_new(o, "groups", json_integer(w.groups));
        if (f & IR_F_LAYOUT)
            bad |= json_object_set_new(o, "layout", json_string(ir_layout_name(w.layout)));
        if (f & IR_F_EPS) bad |= json_object_set_new(o, "eps", json_real(w.eps));
        bad |= json_object_set_new(o, "dtype", json_string(ir_dtype_name(w.dtype)));
        bad |= json_object_set(o, "epilogue", epi);
    }
    json_decref(shape);
    json_decref(epi);
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

int proto_workload_from_string(const char *text, size_t len, ir_workload *w, tlm_error *err)
{
    json_error_t je;
    size_t flags = JSON_DECODE_ANY | JSON_REJECT_DUPLICATES;
    json_t *j = json_loadb(text ? text : "", text ? len : 0, flags, &je);
    unsigned dflags = 0;
    if (!j && json_error_code(&je) == json_error_numeric_overflow) {
        /* An integer beyond int64: read numbers as doubles so the decoder can name its field. */
        json_error_t je2;
        j = json_loadb(text, len, flags | JSON_DECODE_INT_AS_REAL, &je2);
        dflags = PROTO_DECODE_INTS_AS_REAL;
    }
    if (!j)
        return tlm_err_set(err, PROTO_EJSON, "", "invalid JSON at line %d, column %d: %s", je.line,
                           je.column, je.text);
    int rc = proto_workload_decode_opts(j, dflags, w, err);
    json_decref(j);
    return rc;
}

char *proto_workload_to_string(const ir_workload *w)
{
    json_t *j = proto_workload_encode(w);
    if (!j) return NULL;
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}
