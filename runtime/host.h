/* host.h: host memory that cannot fail, and a check on paths given as files.
 *
 * Running out of host memory leaves nothing sensible to do: host_calloc ends
 * the program with a one-line error and exit status 1 (never an abort and a
 * core) instead of returning NULL to every caller.
 */
#ifndef ZF_HOST_H
#define ZF_HOST_H

#include <stddef.h>

/* count * size zeroed bytes (at least one), or exit with a message. */
void *host_calloc(size_t count, size_t size);
/* 1 when path names a directory: a file was asked for, and reading one fails
 * with a message that does not say why. */
int host_is_directory(const char *path);

#endif
