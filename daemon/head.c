/* head.c — a request head checked against RFC 9112 before libmicrohttpd sees it (the front
 * door in http.c; tests/fuzz/fuzz_http_head.c). Pure: no state, any thread. */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "daemon/tlmd.h"
#include "proto/error.h"

static bool tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* A request head (p, n) checked against RFC 9112: request line, version, field syntax,
 * framing (Content-Length, Transfer-Encoding) and Host. complete: n runs through the blank
 * line; otherwise only what is there is judged (a head that outgrew HEAD_MAX). Returns 0, or
 * the status to answer with *code and msg; f (may be NULL) gets the body's framing and the
 * target of a good complete head. */
int http_head_parse(const char *p, size_t n, bool complete, http_frame *f, const char **code,
                    char *msg, size_t cap)
{
    *code = PROTO_CODE_BAD_REQUEST;
    if (f) memset(f, 0, sizeof *f);
    const char *end = p + n;
    const char *eol = memchr(p, '\n', n);
    if (!eol) {
        *code = PROTO_CODE_URI_TOO_LONG;
        snprintf(msg, cap, "the request line is longer than %d bytes", HEAD_MAX);
        return 414;
    }
    size_t ll = (size_t)(eol - p);
    if (ll && p[ll - 1] == '\r') ll--;
    const char *sp1 = memchr(p, ' ', ll);
    const char *sp2 = sp1 ? memchr(sp1 + 1, ' ', (size_t)(p + ll - sp1 - 1)) : NULL;
    if (!sp1 || !sp2 || sp1 == p || sp2 == sp1 + 1) {
        snprintf(msg, cap, "the request line is not \"METHOD TARGET HTTP/1.1\"");
        return 400;
    }
    for (const char *c = p; c < sp1; c++)
        if (!tchar((unsigned char)*c)) {
            snprintf(msg, cap, "the method has a character outside RFC 9110's token");
            return 400;
        }
    for (const char *c = sp1 + 1; c < sp2; c++)
        if ((unsigned char)*c <= 0x20 || (unsigned char)*c >= 0x7f) {
            snprintf(msg, cap,
                     "the request target has a control, space or non-ASCII byte "
                     "(percent-encode it)");
            return 400;
        }
    if (sp2 - sp1 - 1 > TARGET_MAX) {
        *code = PROTO_CODE_URI_TOO_LONG;
        snprintf(msg, cap, "the request target is longer than %d bytes", TARGET_MAX);
        return 414;
    }
    const char *v = sp2 + 1;
    size_t vl = (size_t)(p + ll - v);
    if (vl != 8 || strncmp(v, "HTTP/", 5) || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9') {
        snprintf(msg, cap, "the request line does not end in a version like HTTP/1.1");
        return 400;
    }
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1')) {
        *code = PROTO_CODE_HTTP_VERSION;
        snprintf(msg, cap, "%.8s is not supported; use HTTP/1.1 or HTTP/1.0", v);
        return 505;
    }
    bool http11 = v[7] == '1';
    int fields = 0, n_cl = 0, n_te = 0, n_host = 0;
    char cl[24] = "";
    for (const char *line = eol + 1; line < end;) {
        const char *le = memchr(line, '\n', (size_t)(end - line));
        if (!le) break; /* an incomplete last line: judged once it is complete */
        size_t len = (size_t)(le - line);
        if (len && line[len - 1] == '\r') len--;
        if (len == 0) break; /* the blank line */
        if (++fields > FIELDS_MAX) {
            *code = PROTO_CODE_HEADERS_TOO_LARGE;
            snprintf(msg, cap, "more than %d header fields", FIELDS_MAX);
            return 431;
        }
        if (line[0] == ' ' || line[0] == '\t') {
            snprintf(msg, cap, "a header line starts with white space (obsolete line folding)");
            return 400;
        }
        const char *colon = memchr(line, ':', len);
        if (!colon || colon == line) {
            snprintf(msg, cap, "a header line has no \"name:\"");
            return 400;
        }
        for (const char *c = line; c < colon; c++)
            if (!tchar((unsigned char)*c)) {
                snprintf(msg, cap, "the header name \"%.*s\" has a character outside the token",
                         (int)(colon - line < 64 ? colon - line : 64), line);
                return 400;
            }
        const char *val = colon + 1, *ve = line + len;
        for (const char *c = val; c < ve; c++) {
            unsigned char u = (unsigned char)*c;
            if ((u < 0x20 && u != '\t') || u == 0x7f) {
                snprintf(msg, cap, "the header %.*s has a control character in its value",
                         (int)(colon - line < 64 ? colon - line : 64), line);
                return 400;
            }
        }
        while (val < ve && (*val == ' ' || *val == '\t'))
            val++;
        while (ve > val && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        size_t nl = (size_t)(colon - line), vlen = (size_t)(ve - val);
        if (nl == 14 && !strncasecmp(line, "Content-Length", 14)) {
            bool digits = vlen > 0;
            for (size_t i = 0; i < vlen; i++)
                digits &= val[i] >= '0' && val[i] <= '9';
            if (!digits || vlen > 19) {
                snprintf(msg, cap, "Content-Length \"%.*s\" is not a byte count (1 to 19 digits)",
                         (int)(vlen < 32 ? vlen : 32), val);
                return 400;
            }
            if (n_cl++ && (strlen(cl) != vlen || strncmp(cl, val, vlen))) {
                snprintf(msg, cap, "two Content-Length headers that differ");
                return 400;
            }
            memcpy(cl, val, vlen);
            cl[vlen] = 0;
        } else if (nl == 17 && !strncasecmp(line, "Transfer-Encoding", 17)) {
            n_te++;
            if (vlen != 7 || strncasecmp(val, "chunked", 7)) {
                snprintf(msg, cap, "Transfer-Encoding \"%.*s\" is not supported; only chunked",
                         (int)(vlen < 32 ? vlen : 32), val);
                return 400;
            }
        } else if (nl == 4 && !strncasecmp(line, "Host", 4)) {
            n_host++;
        }
        line = le + 1;
    }
    if (!complete) {
        *code = PROTO_CODE_HEADERS_TOO_LARGE;
        snprintf(msg, cap, "the request head is larger than %d bytes", HEAD_MAX);
        return 431;
    }
    if (n_te && n_cl) {
        snprintf(msg, cap, "Transfer-Encoding and Content-Length together (RFC 9112 6.1)");
        return 400;
    }
    if (n_te > 1) {
        snprintf(msg, cap, "Transfer-Encoding appears more than once");
        return 400;
    }
    if (n_te && !http11) {
        snprintf(msg, cap, "Transfer-Encoding in an HTTP/1.0 request");
        return 400;
    }
    if (http11 && n_host != 1) {
        snprintf(msg, cap, n_host ? "more than one Host header" : "an HTTP/1.1 request needs Host");
        return 400;
    }
    if (f) {
        f->chunked = n_te > 0;
        for (const char *c = cl; *c; c++)
            f->length = f->length * 10 + (uint64_t)(*c - '0'); /* <= 19 digits: no overflow */
        f->target = sp1 + 1;
        f->target_len = (size_t)(sp2 - sp1 - 1);
    }
    return 0;
}

int http_head_check(const char *p, size_t n, bool complete, const char **code, char *msg,
                    size_t cap)
{
    return http_head_parse(p, n, complete, NULL, code, msg, cap);
}
