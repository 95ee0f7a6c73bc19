/* host.h: host memory that cannot fail, the machine's memory a run takes, a
 * check on paths given as files, a file written whole, the signals that stop a run, the one way the runtime starts a thread, the
 * clock of its deadlines, and its end on a broken contract of its own.
 *
 * Running out of host memory leaves nothing sensible to do: host_calloc ends
 * the program with a one-line error and exit status 1 (never an abort and a
 * core) instead of returning NULL to every caller.
 */
#ifndef ZF_HOST_H
#define ZF_HOST_H

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/stat.h>

/* count * size zeroed bytes (at least one), or exit with a message. */
void *host_calloc(size_t count, size_t size);

/* The machine's memory, for what a run holds the whole way: every CPU
 * device's allocations and the data's tokens are taken from what was free when
 * the run first asked (less a spare sixteenth, at most 1 GB), before any of
 * their pages is touched, so that a run too big for the machine stops at
 * once with one line, rather than be ended by the kernel's OOM killer later
 * with none. host_memory_take: 0, or -1 when `bytes` more would not fit;
 * host_memory_give_back returns them; host_memory_budget is what the run
 * could take (0 before the first take). host_memory_free: what the machine
 * has free now (MemAvailable, or less under a cgroup's limit). */
int host_memory_take(size_t bytes);
void host_memory_give_back(size_t bytes);
size_t host_memory_budget(void);
size_t host_memory_free(void);
/* 1 when path names a directory: a file was asked for, and reading one fails
 * with a message that does not say why. */
int host_is_directory(const char *path);
/* Before a file is opened for reading: it exists and is a regular file, its
 * stat in *st. A FIFO's open would wait for a writer forever, and a device's
 * size is not known. 0, or -1 with a one-line message naming `what` and path. */
int host_regular_file(const char *path, const char *what, struct stat *st, char *err, size_t errlen);
/* n bytes to path, written whole beside it (path.tmp.PID), flushed to the
 * disk, then renamed over it: a crash or a full disk leaves the old file, or
 * none, never half of the new one. 0, or -1 with a one-line message. */
int host_write_file(const char *path, const void *bytes, size_t n, char *err, size_t errlen);
/* Its first half, for files that go into place together: n bytes written
 * whole and flushed to path's temporary (its name into temp, len bytes), not
 * renamed; on failure none is left. 0, or -1 with a one-line message. */
int host_write_beside(const char *path, const void *bytes, size_t n, char *temp, size_t len, char *err,
                      size_t errlen);

/* The signals that stop a run at the next step (the trainer's handler sets a
 * flag it polls): SIGINT, SIGTERM, SIGHUP (a closed terminal), and SIGUSR1
 * and SIGUSR2 (a batch system's warning; mpirun passes them on); as a set. */
enum { HOST_STOP_SIGNAL_COUNT = 5 };
extern const int HOST_STOP_SIGNALS[HOST_STOP_SIGNAL_COUNT];
void host_stop_signals(sigset_t *set);

/* pthread_create, with the stop signals blocked in the new thread: every
 * thread of the runtime (rank threads, stream workers, and the OpenMP pools they
 * start) leaves them to the main thread. 0, or pthread_create's error. */
int host_thread_create(pthread_t *thread, void *(*start)(void *), void *arg);

/* Seconds on CLOCK_MONOTONIC: for deadlines. */
double host_seconds(void);

/* "fatal: what" on stderr, then abort: for a broken contract of the code
 * itself (a span ended twice), never for the user's input. */
void host_fatal(const char *what);

#endif
