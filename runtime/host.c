/* host.c: the host allocation and file checks of host.h. */
#include "host.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

void *host_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "error: out of host memory (%zu x %zu bytes asked); stopping\n", count, size);
        exit(1);
    }
    return p;
}

int host_is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
