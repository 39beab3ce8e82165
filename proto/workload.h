/* workload.h — one workload between its JSON form (DESIGN §10) and ir_workload.
 *
 * Contract:
 *  - proto_workload_decode accepts exactly the fields of the op's row in DESIGN §10: "op",
 *    "shape" (every key of the op, nothing else), optional "dtype", "epilogue", and only the
 *    attributes the op takes ("transpose_a"/"transpose_b", "stride"/"pad"/"dilation" as
 *    [h, w], "groups", "layout", "eps"). Anything else is an error naming the field as a
 *    JSON path ("op", "shape.K", "stride[1]", "epilogue[2]", "" for the value as a whole)
 *    and saying what is allowed. After the JSON-level checks it normalizes the workload
 *    (a pool's omitted stride becomes its window) and runs ir_workload_check, so a decoded
 *    workload is always a checked one.
 *  - Error codes: TLM_EINVAL for wrong types, missing, unknown or out-of-range fields;
 *    TLM_EUNSUPPORTED for a well-typed name outside our lists (op, dtype, epilogue, layout);
 *    PROTO_EJSON (proto/error.h) for text that is not JSON.
 *  - Decoding never aborts and allocates nothing that outlives the call; on failure *w is
 *    unspecified.
 *  - proto_workload_encode spells every field the op takes, defaults included, so
 *    decode(encode(w)) == w for any decoded w. It is not the canonical form (that is
 *    ir_workload_canonical, whose bytes are hashed); keys come in DESIGN order.
 *
 * Integers beyond int64: jansson refuses them while parsing. proto_workload_from_string
 * then re-parses with every number read as a double and decodes with
 * PROTO_DECODE_INTS_AS_REAL, so the error still names the field ("shape.K"). Callers that
 * parse a larger document themselves can do the same.
 */
#ifndef TLM_PROTO_WORKLOAD_H
#define TLM_PROTO_WORKLOAD_H

#include <stddef.h>

#include <jansson.h>

#include "compiler/ir/ir.h"
#include "compiler/util/err.h"
#include "proto/error.h"

/* Numbers were parsed with JSON_DECODE_INT_AS_REAL: integral reals count as integers. */
#define PROTO_DECODE_INTS_AS_REAL 1u

int proto_workload_decode(const json_t *j, ir_workload *w, tlm_error *err);
int proto_workload_decode_opts(const json_t *j, unsigned flags, ir_workload *w, tlm_error *err);

/* New reference, or NULL when out of memory (or w->op is not an op). */
json_t *proto_workload_encode(const ir_workload *w);

/* Parses text (len bytes, NUL not needed) and decodes it. Syntax errors are PROTO_EJSON with
 * field "" and the line and column in the message; duplicate keys are syntax errors. */
int proto_workload_from_string(const char *text, size_t len, ir_workload *w, tlm_error *err);

/* Compact JSON of proto_workload_encode(w); malloc'ed, free() it. NULL when out of memory. */
char *proto_workload_to_string(const ir_workload *w);

#endif
