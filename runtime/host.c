/* host.c: the host allocation, the machine's memory, file checks and writes, thread start and clock of host.h. */
#include "host.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void *host_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "error: out of host memory (%zu x %zu bytes asked); stopping\n", count, size);
        exit(1);
    }
    return p;
}

size_t host_memory_free(void) {
    unsigned long long kb = 0, limit = 0, used = 0;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    size_t free_bytes = (size_t)kb * 1024;
    /* a container's limit (cgroup v2) may be lower than the machine's */
    f = fopen("/sys/fs/cgroup/memory.max", "r");
    int limited = f && fscanf(f, "%llu", &limit) == 1;
    if (f) fclose(f);
    f = limited ? fopen("/sys/fs/cgroup/memory.current", "r") : NULL;
    if (f && fscanf(f, "%llu", &used) == 1 && used < limit && limit - used < free_bytes)
        free_bytes = (size_t)(limit - used);
    if (f) fclose(f);
    return free_bytes;
}

/* The memory the run may take: what was free at its first take, less a
 * sixteenth (at most 1 GB) for what it does not count (its stacks, the
 * libraries' own buffers, the host's copies of the model at a save). */
static struct {
    pthread_mutex_t lock;
    int known;
    size_t budget, taken;
} machine = { .lock = PTHREAD_MUTEX_INITIALIZER };

int host_memory_take(size_t bytes) {
    pthread_mutex_lock(&machine.lock);
    if (!machine.known) {
        size_t free_bytes = host_memory_free(), spare = free_bytes / 16 < (1u << 30) ? free_bytes / 16 : 1u << 30;
        machine.budget = free_bytes ? free_bytes - spare : SIZE_MAX;  /* unknown: the kernel decides */
        machine.known = 1;
    }
    int fits = bytes <= machine.budget - machine.taken;
    if (fits) machine.taken += bytes;
    pthread_mutex_unlock(&machine.lock);
    return fits ? 0 : -1;
}

void host_memory_give_back(size_t bytes) {
    pthread_mutex_lock(&machine.lock);
    machine.taken -= bytes < machine.taken ? bytes : machine.taken;
    pthread_mutex_unlock(&machine.lock);
}

size_t host_memory_budget(void) {
    pthread_mutex_lock(&machine.lock);
    size_t budget = machine.known ? machine.budget : 0;
    pthread_mutex_unlock(&machine.lock);
    return budget;
}

int host_is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int host_regular_file(const char *path, const char *what, struct stat *st, char *err, size_t errlen) {
    if (stat(path, st) != 0) {
        snprintf(err, errlen, "cannot open %s '%s': %s", what, path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st->st_mode)) {
        snprintf(err, errlen, "%s '%s' is a directory, not a file", what, path);
        return -1;
    }
    if (!S_ISREG(st->st_mode)) {
        snprintf(err, errlen, "%s '%s' is not a regular file (a FIFO, a device or a socket): its size is not known",
                 what, path);
        return -1;
    }
    return 0;
}

int host_write_beside(const char *path, const void *bytes, size_t n, char *temp, size_t len, char *err,
                      size_t errlen) {
    if (snprintf(temp, len, "%s.tmp.%ld", path, (long)getpid()) >= (int)len) host_fatal("a temporary's path cut");
    FILE *f = fopen(temp, "wb");
    int ok = f && fwrite(bytes, 1, n, f) == n;
    ok = f && fflush(f) == 0 && fsync(fileno(f)) == 0 && ok;
    if (f && fclose(f) != 0) ok = 0;
    if (ok) return 0;
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    unlink(temp);
    return -1;
}

int host_write_file(const char *path, const void *bytes, size_t n, char *err, size_t errlen) {
    char tmp[4200];
    if (host_write_beside(path, bytes, n, tmp, sizeof tmp, err, errlen) != 0) return -1;
    if (rename(tmp, path) == 0) return 0;
    snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
    unlink(tmp);
    return -1;
}

const int HOST_STOP_SIGNALS[HOST_STOP_SIGNAL_COUNT] = { SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2 };

void host_stop_signals(sigset_t *set) {
    sigemptyset(set);
    for (int i = 0; i < HOST_STOP_SIGNAL_COUNT; i++) sigaddset(set, HOST_STOP_SIGNALS[i]);
}

int host_thread_create(pthread_t *thread, void *(*start)(void *), void *arg) {
    sigset_t stop, old;
    host_stop_signals(&stop);
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

void host_fatal(const char *what) {
    fprintf(stderr, "fatal: %s\n", what);
    abort();
}

double host_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
