/* host.h: host memory that cannot fail.
 *
 * Running out of host memory leaves nothing sensible to do: these end the
 * program with a message instead of returning NULL to every caller.
 */
#ifndef ZF_HOST_H
#define ZF_HOST_H

#include <stddef.h>

/* count * size zeroed bytes (at least one), or exit with a message. */
void *host_calloc(size_t count, size_t size);

#endif
