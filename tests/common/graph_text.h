/* graph_text.h — JSON in tests is written with ' for " to stay readable: J parses such text,
 * graph_from_text decodes it into a graph (fe_graph_from_json); both fail the test on bad
 * text. Header-only (static inline functions), for the frontend and runtime tests. */
#ifndef TLM_TESTS_GRAPH_TEXT_H
#define TLM_TESTS_GRAPH_TEXT_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/frontend/frontend.h"

static inline json_t *J(const char *text)
{
    char *s = strdup(text);
    for (char *p = s; *p; p++)
        if (*p == '\'') *p = '"';
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    cr_assert(j, "test JSON does not parse: %s: %s", je.text, s);
    free(s);
    return j;
}

/* The graph of text (free with fe_graph_free); the test fails if it does not decode. */
static inline fe_graph *graph_from_text(const char *text)
{
    json_t *j = J(text);
    fe_graph *g;
    tlm_error err = {0};
    cr_assert_eq(fe_graph_from_json(j, &g, &err), 0, "%s: %s", err.field, err.msg);
    json_decref(j);
    return g;
}

#endif
