/* fuzz_records.c — libFuzzer: bytes as a file given to `tlm records import`, through the same
 * steps (tools/tlm/cmd_records.c do_import): each line parsed as JSON, read as a
 * "tlm-records/1" record (store_measurement_from_json) and imported into a store
 * (store_measurement_import) on a temporary file. A line is rejected with the field at fault
 * or imported; importing the same record again must add nothing, and the store must keep
 * answering. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "store/store.h"

static store *st;
static char dir[64];

static void cleanup(void)
{
    store_close(st);
    char p[128];
    const char *suffix[] = {"", "-wal", "-shm"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/records.db%s", dir, suffix[i]);
        unlink(p);
    }
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    snprintf(dir, sizeof dir, "%s/tlm-fuzz-records-XXXXXX",
             access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) abort();
    char path[128];
    snprintf(path, sizeof path, "%s/records.db", dir);
    tlm_error e;
    tlm_err_clear(&e);
    st = store_open(path, NULL, &e);
    if (!st) abort();
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *p = (const char *)data, *end = p + size;
    int lines = 0;
    while (p < end && lines++ < 64) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_error_t je;
        json_t *o = len ? json_loadb(p, len, 0, &je) : NULL;
        p += len + (nl != NULL);
        if (!o) continue;
        store_measurement m;
        char *wl_text = NULL;
        const char *bad = store_measurement_from_json(o, &m, &wl_text);
        if (bad) {
            if (!*bad) __builtin_trap(); /* a rejection names its field */
        } else {
            tlm_error e;
            tlm_err_clear(&e);
            bool added = false, again = true;
            if (store_measurement_import(st, &m, &added, &e) == 0) {
                /* the same record twice: the second import adds nothing */
                if (store_measurement_import(st, &m, &again, &e) == 0 && again) __builtin_trap();
                store_measurement *got = NULL;
                size_t n = 0;
                if (store_measurements_list(st, m.workload_hash, m.target_hash, 4, &got, &n, &e) ==
                        0 &&
                    n == 0)
                    __builtin_trap(); /* imported, yet not there */
                store_measurements_free(got, n);
            } else if (!e.msg[0]) {
                __builtin_trap(); /* a failure says why */
            }
        }
        free(wl_text);
        json_decref(o);
    }
    return 0;
}
