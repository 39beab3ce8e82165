#include "compiler/util/err.h"

#include <stdio.h>
#include <string.h>

int tlm_err_set(tlm_error *err, int code, const char *field, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    snprintf(err->field, sizeof err->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

void tlm_err_clear(tlm_error *err)
{
    if (err) memset(err, 0, sizeof *err);
}

const char *tlm_err_code_name(int code)
{
    switch (code) {
    case TLM_OK: return "ok";
    case TLM_EINVAL: return "invalid";
    case TLM_EUNSUPPORTED: return "unsupported";
    case TLM_ENOMEM: return "no_memory";
    case TLM_EIO: return "io";
    case TLM_ETOOLCHAIN: return "toolchain";
    case TLM_ERUNTIME: return "runtime";
    case TLM_ENOTFOUND: return "not_found";
    case TLM_ELIMIT: return "limit";
    }
    return "unknown";
}
