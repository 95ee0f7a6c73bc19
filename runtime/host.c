/* host.c: the host allocation, file checks, thread start and clock of host.h. */
#include "host.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

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

int host_thread_create(pthread_t *thread, void *(*start)(void *), void *arg) {
    sigset_t stop, old;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    int rc = pthread_sigmask(SIG_BLOCK, &stop, &old);
    if (rc != 0) return rc;
    rc = pthread_create(thread, NULL, start, arg);  /* the new thread inherits the mask */
    int restored = pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (restored != 0) {
        /* the caller would never see a signal again */
        fprintf(stderr, "error: cannot restore the signal mask: %s; stopping\n", strerror(restored));
        exit(1);
    }
    return rc;
}

double host_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
