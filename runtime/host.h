/* host.h: host memory that cannot fail, a check on paths given as files, the
 * one way the runtime starts a thread, and the clock of its deadlines.
 *
 * Running out of host memory leaves nothing sensible to do: host_calloc ends
 * the program with a one-line error and exit status 1 (never an abort and a
 * core) instead of returning NULL to every caller.
 */
#ifndef ZF_HOST_H
#define ZF_HOST_H

#include <pthread.h>
#include <stddef.h>

/* count * size zeroed bytes (at least one), or exit with a message. */
void *host_calloc(size_t count, size_t size);
/* 1 when path names a directory: a file was asked for, and reading one fails
 * with a message that does not say why. */
int host_is_directory(const char *path);

/* pthread_create, with SIGINT and SIGTERM blocked in the new thread: every
 * thread of the runtime (rank fibers, stream workers, and the OpenMP pools they
 * start) leaves them to the main thread, whose handler the trainer polls
 * between steps. 0, or pthread_create's error. */
int host_thread_create(pthread_t *thread, void *(*start)(void *), void *arg);

/* Seconds on CLOCK_MONOTONIC: for deadlines. */
double host_seconds(void);

#endif
