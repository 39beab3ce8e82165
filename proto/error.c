#include "proto/error.h"

#include <stdio.h>
#include <string.h>

const char *proto_error_code(int tlm_code)
{
    switch (tlm_code) {
    case PROTO_EJSON:
        return PROTO_CODE_INVALID_JSON;
    case TLM_EINVAL:
        return PROTO_CODE_INVALID_FIELD;
    case TLM_EUNSUPPORTED:
        return PROTO_CODE_UNSUPPORTED;
    case TLM_ELIMIT:
        return PROTO_CODE_LIMIT_EXCEEDED;
    case TLM_ENOTFOUND:
        return PROTO_CODE_NOT_FOUND;
    case TLM_ETOOLCHAIN:
        return PROTO_CODE_TOOLCHAIN_FAILED;
    case TLM_ERUNTIME:
        return PROTO_CODE_RUNTIME_FAILED;
    }
    return PROTO_CODE_INTERNAL;
}

int proto_error_http_status(int tlm_code)
{
    switch (tlm_code) {
    case PROTO_EJSON:
    case TLM_EINVAL:
        return 400;
    case TLM_EUNSUPPORTED:
    case TLM_ELIMIT:
        return 422;
    case TLM_ENOTFOUND:
        return 404;
    }
    return 500;
}

json_t *proto_error_body(const char *code, const char *message, const char *field)
{
    /* json_string fails on invalid UTF-8; messages quote user input, so fall back to a
     * lossless-enough ASCII copy rather than losing the whole error. */
    json_t *msg = json_string(message ? message : "");
    if (!msg && message) {
        char ascii[512];
        size_t n = 0;
        for (const char *p = message; *p && n + 1 < sizeof ascii; p++)
            ascii[n++] = (unsigned char)*p < 0x80 ? *p : '?';
        ascii[n] = 0;
        msg = json_string(ascii);
    }
    json_t *fld = json_string(field ? field : "");
    if (!fld) fld = json_string("");
    json_t *inner = json_object();
    json_t *body = json_object();
    if (!msg || !fld || !inner || !body ||
        json_object_set_new(inner, "code", json_string(code ? code : PROTO_CODE_INTERNAL)) ||
        json_object_set(inner, "message", msg) || json_object_set(inner, "field", fld) ||
        json_object_set(body, "error", inner)) {
        json_decref(body);
        body = NULL;
    }
    json_decref(msg);
    json_decref(fld);
    json_decref(inner);
    return body;
}

json_t *proto_error_from_tlm(const tlm_error *err, int *http_status)
{
    int code = err ? err->code : TLM_EINVAL;
    if (http_status) *http_status = proto_error_http_status(code);
    return proto_error_body(proto_error_code(code), err ? err->msg : "", err ? err->field : "");
}

void proto_error_prefix(tlm_error *err, const char *prefix)
{
    if (!err || !prefix || !*prefix) return;
    char old[sizeof err->field];
    memcpy(old, err->field, sizeof old);
    old[sizeof old - 1] = 0;
    const char *sep = (old[0] && old[0] != '[') ? "." : "";
    char joined[2 * sizeof err->field + 8];
    snprintf(joined, sizeof joined, "%.*s%s%s", (int)sizeof err->field, prefix, sep, old);
    size_t n = strlen(joined);
    if (n >= sizeof err->field) n = sizeof err->field - 1;
    memcpy(err->field, joined, n);
    err->field[n] = 0;
}
