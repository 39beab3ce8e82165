/* tuner_io.c — the HTAM memory document (compiler/tune/htam.h, "tlm-htam/1") in the store's
 * tuner tables: one node row per global and local node (payload: its JSON entry; a local's
 * parent is its global), one edge row per transition (parent = from, child = to). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "store/store.h"

#define HTAM_SCOPE "htam"

int store_htam_load(void *stp, const char *target, json_t **doc, tlm_error *err)
{
    store *st = stp;
    *doc = NULL;
    store_tuner_row *nodes = NULL, *edges = NULL;
    size_t nn = 0, ne = 0;
    int rc = store_tuner_load(st, HTAM_SCOPE, target, &nodes, &nn, &edges, &ne, err);
    if (rc) return rc;
    if (nn == 0) {
        store_tuner_rows_free(edges, ne);
        return 0;
    }
    json_t *gs = json_array(), *ls = json_array(), *es = json_array();
    for (size_t i = 0; i < nn; i++) {
        json_t *p = nodes[i].payload ? json_loads(nodes[i].payload, 0, NULL) : NULL;
        if (!p) continue; /* a row another tool wrote: not ours to read */
        json_array_append_new(!strcmp(nodes[i].kind, "global") ? gs : ls, p);
    }
    for (size_t i = 0; i < ne; i++) {
        json_t *p = edges[i].payload ? json_loads(edges[i].payload, 0, NULL) : NULL;
        if (p) json_array_append_new(es, p);
    }
    *doc = json_pack("{s:s, s:s, s:o, s:o, s:o}", "format", "tlm-htam/1", "target", target,
                     "globals", gs, "locals", ls, "edges", es);
    store_tuner_rows_free(nodes, nn);
    store_tuner_rows_free(edges, ne);
    return 0;
}

static int index_of(const json_t *arr, const char *name)
{
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x)
    {
        const char *n = json_string_value(json_object_get(x, "name"));
        if (n && name && !strcmp(n, name)) return (int)i;
    }
    return -1;
}

int store_htam_save(void *stp, const char *target, const json_t *doc, tlm_error *err)
{
    store *st = stp;
    const json_t *gs = json_object_get(doc, "globals"), *ls = json_object_get(doc, "locals"),
                 *es = json_object_get(doc, "edges");
    size_t ng = json_array_size(gs), nl = json_array_size(ls), ne = json_array_size(es);
    store_tuner_row *nodes = calloc(ng + nl + 1, sizeof *nodes);
    store_tuner_row *edges = calloc(ne + 1, sizeof *edges);
    if (!nodes || !edges) {
        free(nodes);
        free(edges);
        return tlm_err_set(err, TLM_ENOMEM, "", "out of memory");
    }
    size_t n = 0, m = 0;
    for (size_t i = 0; i < ng; i++) {
        const json_t *g = json_array_get(gs, i);
        nodes[n].kind = "global";
        nodes[n].payload = json_dumps(g, JSON_COMPACT);
        nodes[n].score = json_number_value(json_object_get(g, "reward"));
        n++;
    }
    for (size_t i = 0; i < nl; i++) {
        const json_t *l = json_array_get(ls, i);
        int g = index_of(gs, json_string_value(json_object_get(l, "global")));
        nodes[n].kind = "local";
        nodes[n].parent = g >= 0 ? g + 1 : 0;
        nodes[n].payload = json_dumps(l, JSON_COMPACT);
        nodes[n].score = json_number_value(json_object_get(l, "reward"));
        n++;
    }
    for (size_t i = 0; i < ne; i++) {
        const json_t *e = json_array_get(es, i);
        int a = index_of(gs, json_string_value(json_object_get(e, "from")));
        int b = index_of(gs, json_string_value(json_object_get(e, "to")));
        if (a < 0 || b < 0) continue;
        edges[m].kind = "transition";
        edges[m].parent = a + 1;
        edges[m].child = b + 1;
        edges[m].payload = json_dumps(e, JSON_COMPACT);
        edges[m].score = json_number_value(json_object_get(e, "reward"));
        m++;
    }
    int rc = store_tuner_replace(st, HTAM_SCOPE, target, nodes, n, edges, m, err);
    for (size_t i = 0; i < n; i++) free(nodes[i].payload);
    for (size_t i = 0; i < m; i++) free(edges[i].payload);
    free(nodes);
    free(edges);
    return rc;
}
