/* err.h — the error report every fallible function fills.
 *
 * Contract: a function that can fail returns 0 or a negative TLM_E* code and, when
 * given a non-NULL tlm_error, writes a human message saying what was wrong, which
 * field (a JSON-path-like name such as "shape.K" or "epilogue[1]") and what is
 * allowed. Bad input is never an abort.
 */
#ifndef TLM_UTIL_ERR_H
#define TLM_UTIL_ERR_H

#include <stdarg.h>

enum {
    TLM_OK = 0,
    TLM_EINVAL = -1,      /* bad input: a field is wrong */
    TLM_EUNSUPPORTED = -2, /* well-formed, but not something we can do */
    TLM_ENOMEM = -3,
    TLM_EIO = -4,
    TLM_ETOOLCHAIN = -5,  /* compiler or NVRTC failed */
    TLM_ERUNTIME = -6,    /* a kernel crashed, hung or produced wrong output */
    TLM_ENOTFOUND = -7,
    TLM_ELIMIT = -8,      /* over a size or resource limit */
};

typedef struct tlm_error {
    int code;
    char field[96];
    char msg[512];
} tlm_error;

/* Sets err (if non-NULL) and returns code, so callers can `return tlm_err_set(...)`. */
int tlm_err_set(tlm_error *err, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void tlm_err_clear(tlm_error *err);
const char *tlm_err_code_name(int code);

#endif
