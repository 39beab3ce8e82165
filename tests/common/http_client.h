/* http_client.h — the tests' one HTTP client (libcurl, blocking): a request to 127.0.0.1:PORT
 * that returns its status, body and raw header block; a header lookup, the body as JSON, and
 * base64 for include_binary answers. Every request is bounded (120 s). A status of 0 means no
 * complete answer (refused, reset, cut short): `err` then says what curl saw.
 * Header-only: every function is static inline, so a test includes what it uses. */
#ifndef TLM_TESTS_HTTP_CLIENT_H
#define TLM_TESTS_HTTP_CLIENT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>

typedef struct {
    char *p; /* NUL-terminated; NULL while empty */
    size_t n;
} buf;

typedef struct {
    long status; /* 0: no complete answer (connection refused, reset or cut short) */
    buf body, headers;
    char err[CURL_ERROR_SIZE]; /* curl's message when status is 0 */
} resp;

static inline size_t on_data(char *d, size_t sz, size_t nm, void *u)
{
    buf *b = u;
    size_t n = sz * nm;
    char *p = realloc(b->p, b->n + n + 1);
    if (!p) return 0;
    memcpy(p + b->n, d, n);
    b->p = p;
    b->n += n;
    b->p[b->n] = 0;
    return n;
}

static inline void resp_free(resp *r)
{
    free(r->body.p);
    free(r->headers.p);
    memset(r, 0, sizeof *r);
}

/* method and path ("/v1/compile") on 127.0.0.1:port. hdrs: NULL-terminated "Name: value"
 * lines or NULL; body NULL for no body. */
static inline resp http_request(int port, const char *method, const char *path, const char *body,
                                size_t body_len, const char *const *hdrs)
{
    resp r;
    memset(&r, 0, sizeof r);
    CURL *c = curl_easy_init();
    cr_assert(c, "curl_easy_init failed");
    char url[512];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.headers);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r.err);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    struct curl_slist *hl = NULL;
    for (int i = 0; hdrs && hdrs[i]; i++)
        hl = curl_slist_append(hl, hdrs[i]);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)body_len);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hl);
    CURLcode rc = curl_easy_perform(c);
    if (rc == CURLE_OK)
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    else if (!r.err[0])
        snprintf(r.err, sizeof r.err, "%s", curl_easy_strerror(rc));
    curl_slist_free_all(hl);
    curl_easy_cleanup(c);
    return r;
}

static const char *const json_hdr[] = {"Content-Type: application/json", NULL};

/* The value of header `name` (case-insensitive) of the final answer's header block, copied to
 * out without the line end; NULL when absent. */
static inline const char *http_header(const resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    const char *found = NULL;
    for (const char *l = r->headers.p; l && *l;) {
        const char *e = strchr(l, '\n');
        if (!strncmp(l, "HTTP/", 5)) found = NULL; /* a new block (after 100 Continue) */
        if (!strncasecmp(l, name, nl) && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t len = e ? (size_t)(e - v) : strlen(v);
            while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
                len--;
            snprintf(out, cap, "%.*s", (int)len, v);
            found = out;
        }
        l = e ? e + 1 : NULL;
    }
    return found;
}

/* The body as JSON; fails the test when it is not. The caller json_decref()s it. */
static inline json_t *body_json(const resp *r)
{
    json_error_t e;
    json_t *j = r->body.p ? json_loads(r->body.p, 0, &e) : NULL;
    cr_assert(j, "not JSON (status %ld): %.300s", r->status, r->body.p ? r->body.p : "(none)");
    return j;
}

/* Standard base64 (padding optional, other characters skipped) into out, which holds at
 * least strlen(s) * 3 / 4 bytes; returns the decoded length. */
static inline size_t http_b64_decode(const char *s, unsigned char *out)
{
    static const char tb[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *p = strchr(tb, *s);
        if (!p) continue;
        acc = acc << 6 | (uint32_t)(p - tb);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

#endif
