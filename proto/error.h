/* error.h — the wire form of errors (DESIGN §10).
 *
 * Contract: every error the API returns is the JSON body
 *     {"error": {"code": CODE, "message": MESSAGE, "field": FIELD}}
 * where FIELD is a JSON path into the request ("shape.K", "stride[1]", "epilogue[2]") or ""
 * when no single field is to blame. CODE is one of the strings below; clients branch on it,
 * so the set only grows.
 *
 *   code                      HTTP  meaning
 *   "invalid_json"            400   the body is not JSON (syntax error, duplicate key)
 *   "invalid_field"           400   a field has the wrong type, is missing, unknown or out of range
 *   "unsupported"             422   well-formed, but names something we do not implement
 *                                   (an op, dtype, epilogue or layout outside our lists)
 *   "limit_exceeded"          422   well-formed, but over a size or resource limit
 *   "bad_request"             400   the HTTP request itself is malformed (request line, headers,
 *                                   Content-Length / Transfer-Encoding framing, RFC 9112)
 *   "unauthorized"            401   bearer token missing or wrong
 *   "not_found"               404   no such kernel, job or route
 *   "method_not_allowed"      405
 *   "request_timeout"         408   the request head or body did not arrive in time
 *   "body_too_large"          413
 *   "uri_too_long"            414
 *   "headers_too_large"       431
 *   "unsupported_media_type"  415
 *   "queue_full"              429
 *   "unavailable"             503   shutting down, not ready, or too many connections
 *   "http_version"            505   not HTTP/1.0 or HTTP/1.1
 *   "toolchain_failed"        500   the C compiler or NVRTC failed on our own output
 *   "runtime_failed"          500   a kernel crashed, hung or gave wrong results
 *   "internal"                500   anything else (out of memory, I/O); never bad input
 *
 * The first five rows are produced from a tlm_error by proto_error_from_tlm; the HTTP-level
 * ones (400 bad_request, 401, 405, 408, 413, 414, 415, 429, 431, 503, 505) are produced by the
 * server with proto_error_body.
 */
#ifndef TLM_PROTO_ERROR_H
#define TLM_PROTO_ERROR_H

#include <jansson.h>

#include "compiler/util/err.h"

/* The decoders' code for "the text is not JSON". It lives here, not in err.h, because only
 * the wire layer parses text; it maps to "invalid_json". */
#define PROTO_EJSON (-64)

#define PROTO_CODE_INVALID_JSON "invalid_json"
#define PROTO_CODE_INVALID_FIELD "invalid_field"
#define PROTO_CODE_UNSUPPORTED "unsupported"
#define PROTO_CODE_LIMIT_EXCEEDED "limit_exceeded"
#define PROTO_CODE_BAD_REQUEST "bad_request"
#define PROTO_CODE_UNAUTHORIZED "unauthorized"
#define PROTO_CODE_NOT_FOUND "not_found"
#define PROTO_CODE_METHOD_NOT_ALLOWED "method_not_allowed"
#define PROTO_CODE_REQUEST_TIMEOUT "request_timeout"
#define PROTO_CODE_BODY_TOO_LARGE "body_too_large"
#define PROTO_CODE_URI_TOO_LONG "uri_too_long"
#define PROTO_CODE_HEADERS_TOO_LARGE "headers_too_large"
#define PROTO_CODE_HTTP_VERSION "http_version"
#define PROTO_CODE_UNSUPPORTED_MEDIA_TYPE "unsupported_media_type"
#define PROTO_CODE_QUEUE_FULL "queue_full"
#define PROTO_CODE_UNAVAILABLE "unavailable"
#define PROTO_CODE_TOOLCHAIN_FAILED "toolchain_failed"
#define PROTO_CODE_RUNTIME_FAILED "runtime_failed"
#define PROTO_CODE_INTERNAL "internal"

/* Wire code and HTTP status for a TLM_E* (or PROTO_EJSON) code. Unknown codes are "internal"
 * and 500. */
const char *proto_error_code(int tlm_code);
int proto_error_http_status(int tlm_code);

/* {"error": {"code", "message", "field"}}; NULL message or field become "". New reference, or
 * NULL when out of memory. */
json_t *proto_error_body(const char *code, const char *message, const char *field);

/* The body for a filled tlm_error; *http_status (if non-NULL) gets the matching status. */
json_t *proto_error_from_tlm(const tlm_error *err, int *http_status);

/* Re-roots err->field under prefix, for errors found inside a nested object:
 * ("workloads[2]", "shape.K") -> "workloads[2].shape.K", ("workloads[2]", "") ->
 * "workloads[2]", ("x", "[1]") -> "x[1]". Truncates to the field's capacity. */
void proto_error_prefix(tlm_error *err, const char *prefix);

#endif
