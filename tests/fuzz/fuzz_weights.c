/* fuzz_weights.c — libFuzzer: bytes as a weight file for tlm_model_load, which must validate
 * magic, version, header, sizes and the tensor table before it trusts a byte (compiler/tlm/
 * tlm.h). The file is a memfd, named through /proc/self/fd. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "compiler/tlm/tlm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0) fd = memfd_create("tlm-weights", 0);
    if (fd < 0 || ftruncate(fd, 0) || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    tlm_model *m = NULL;
    tlm_error e;
    tlm_err_clear(&e);
    if (tlm_model_load(path, 0, NULL, &m, &e) == 0)
        tlm_model_free(m);
    else if (!e.msg[0] || m)
        __builtin_trap();
    return 0;
}
