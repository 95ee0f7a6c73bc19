/* host.c: the host allocation of host.h. */
#include "host.h"

#include <stdio.h>
#include <stdlib.h>

void *host_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "fatal: out of host memory (%zu x %zu bytes)\n", count, size);
        abort();
    }
    return p;
}
