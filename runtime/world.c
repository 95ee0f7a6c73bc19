/* world.c: what every world shares (world.h): its state, the lines that name
 * processes, the host's collectives, made of exchanges, the deadlines and the
 * run's end from a watching thread, and the file rendezvous's wait. The engine's part
 * is world_mpi.c, or world_none.c in a build without MPI; a world joined
 * through a file rendezvous hands its exchanges to world_nccl.c instead. */
#include "world.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host.h"
#include "world_backend.h"

static World the_world = { .nprocs = 1, .procs_on_node = 1, .local_ranks = 1, .timeout_s = 300.0,
                           .engine = "none" };

const World *world(void) { return &the_world; }
World *world_state(void) { return &the_world; }

int world_launched(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("PMI_SIZE") || getenv("PMI_RANK");
}

static WorldExchange joined_engine;  /* world_set_engine's, or NULL: world_backend_exchange */

void world_set_engine(WorldExchange exchange) { joined_engine = exchange; }

static void engine_exchange(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what) {
    if (joined_engine) joined_engine(channel, to, from, what);
    else world_backend_exchange(channel, to, from, what);
}

void world_set_timeout(double seconds) { the_world.timeout_s = seconds; }
void world_set_local_ranks(int local_ranks) { the_world.local_ranks = local_ranks; }

void world_name_process(int proc, char *buf, size_t len) {
    int L = the_world.local_ranks, first = proc * L;
    if (L == 1) snprintf(buf, len, "rank %d (process %d)", first, proc);
    else snprintf(buf, len, "ranks %d..%d (process %d)", first, first + L - 1, proc);
}

void world_all_gather(const void *mine, void *all, size_t bytes, const char *what) {
    int P = the_world.nprocs;
    memcpy((char *)all + (size_t)the_world.proc * bytes, mine, bytes);
    if (P == 1) return;
    WorldChunk *to = host_calloc((size_t)P, sizeof *to), *from = host_calloc((size_t)P, sizeof *from);
    for (int p = 0; p < P; p++) {
        to[p] = (WorldChunk){ (void *)mine, bytes };
        from[p] = (WorldChunk){ (char *)all + (size_t)p * bytes, bytes };
    }
    engine_exchange(WORLD_HOST, to, from, what);
    free(to);
    free(from);
}

void world_broadcast(void *buf, size_t bytes, const char *what) {
    int P = the_world.nprocs, root = the_world.proc == 0;
    if (P == 1) return;
    WorldChunk *to = host_calloc((size_t)P, sizeof *to), *from = host_calloc((size_t)P, sizeof *from);
    for (int p = 0; p < P; p++) {
        to[p] = (WorldChunk){ buf, root ? bytes : 0 };
        from[p] = (WorldChunk){ buf, p == 0 ? bytes : 0 };
    }
    engine_exchange(WORLD_HOST, to, from, what);
    free(to);
    free(from);
}

void world_gather(const void *mine, size_t bytes, const WorldChunk *at_root, const char *what) {
    int P = the_world.nprocs, root = the_world.proc == 0;
    if (root && bytes > 0 && at_root[0].data != mine) memcpy(at_root[0].data, mine, bytes);
    if (P == 1) return;
    WorldChunk *to = host_calloc((size_t)P, sizeof *to), *from = host_calloc((size_t)P, sizeof *from);
    if (root)
        for (int p = 1; p < P; p++) from[p] = at_root[p];
    else
        to[0] = (WorldChunk){ (void *)mine, bytes };
    engine_exchange(WORLD_HOST, to, from, what);
    free(to);
    free(from);
}

void world_scatter(const WorldChunk *at_root, void *mine, size_t bytes, const char *what) {
    int P = the_world.nprocs, root = the_world.proc == 0;
    if (root && bytes > 0 && at_root[0].data != mine) memcpy(mine, at_root[0].data, bytes);
    if (P == 1) return;
    WorldChunk *to = host_calloc((size_t)P, sizeof *to), *from = host_calloc((size_t)P, sizeof *from);
    if (root)
        for (int p = 1; p < P; p++) to[p] = at_root[p];
    else
        from[0] = (WorldChunk){ mine, bytes };
    engine_exchange(WORLD_HOST, to, from, what);
    free(to);
    free(from);
}

int world_first_nonzero(int value, int *proc, const char *what) {
    int P = the_world.nprocs, first = -1;
    int *values = host_calloc((size_t)P, sizeof *values);
    world_all_gather(&value, values, sizeof value, what);
    for (int p = 0; p < P && first < 0; p++)
        if (values[p]) first = p;
    int found = first < 0 ? 0 : values[first];
    free(values);
    if (proc) *proc = first < 0 ? 0 : first;
    return found;
}

void world_exchange(const WorldChunk *to, WorldChunk *from, const char *what) {
    if (the_world.nprocs > 1) engine_exchange(WORLD_STREAMS, to, from, what);
}

void world_timed_out(const char *what, const int *missing) {
    char line[1024];
    int len = snprintf(line, sizeof line, "error: process %d: '%s' had nothing from", the_world.proc, what);
    const char *sep = " ";
    for (int p = 0; p < the_world.nprocs && len < (int)sizeof line - 64; p++) {
        if (!missing[p]) continue;
        char who[64];
        world_name_process(p, who, sizeof who);
        len += snprintf(line + len, sizeof line - len, "%s%s", sep, who);
        sep = ", ";
    }
    fprintf(stderr, "%s within %g s (--timeout): they never arrived; stopping every process\n", line,
            the_world.timeout_s);
    world_abort(1);
}

/* ---- deadlines for calls without a timeout ---- */

static struct {
    pthread_mutex_t lock;
    pthread_t thread;
    int armed;
    double until;       /* host_seconds() */
    char what[128];
} deadline = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void deadline_lock(int lock) {
    int rc = lock ? pthread_mutex_lock(&deadline.lock) : pthread_mutex_unlock(&deadline.lock);
    if (rc) {
        fprintf(stderr, "fatal: the deadline's lock failed (%d)\n", rc);
        abort();
    }
}

/* Every 20 ms, until disarmed or past the deadline. */
static void *deadline_main(void *arg) {
    (void)arg;
    for (;;) {
        deadline_lock(1);
        int armed = deadline.armed, late = armed && host_seconds() > deadline.until;
        if (late)
            fprintf(stderr, "error: process %d: %s did not finish within %g s (--timeout): a process never came; "
                    "stopping every process\n", the_world.proc, deadline.what, the_world.timeout_s);
        deadline_lock(0);
        if (late) world_abort(1);
        if (!armed) return NULL;
        nanosleep(&(struct timespec){ 0, 20 * 1000 * 1000 }, NULL);
    }
}

void world_deadline_start(const char *what) {
    deadline_lock(1);
    deadline.armed = 1;
    deadline.until = host_seconds() + the_world.timeout_s;
    snprintf(deadline.what, sizeof deadline.what, "%s", what);
    deadline_lock(0);
    int rc = host_thread_create(&deadline.thread, deadline_main, NULL);
    if (rc) {
        fprintf(stderr, "error: cannot start the deadline of %s: %s\n", what, strerror(rc));
        world_abort(1);
    }
}

void world_deadline_end(void) {
    deadline_lock(1);
    deadline.armed = 0;
    deadline_lock(0);
    int rc = pthread_join(deadline.thread, NULL);
    if (rc) {
        fprintf(stderr, "fatal: pthread_join of a deadline failed (%d)\n", rc);
        abort();
    }
}

/* ---- the run's end from a watching thread ---- */

static atomic_int ending;

int world_mark_ending(void) { return atomic_exchange(&ending, 1); }

/* The thread that ends the run leaves by _exit within moments; until then this
 * one sleeps, its stop signals blocked (a handler must not exit it first with
 * a status of its own). */
void world_wait_if_ending(void) {
    if (!atomic_load(&ending)) return;
    sigset_t stop;
    host_stop_signals(&stop);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    for (;;) nanosleep(&(struct timespec){ 1, 0 }, NULL);
}

typedef struct {
    void (*cleanup)(void *);
    void *arg;
} Cleanup;

static void *run_cleanup(void *arg) {
    Cleanup *c = arg;
    c->cleanup(c->arg);
    return NULL;
}

void world_end_run(const char *line, void (*cleanup)(void *), void *arg, double seconds) {
    if (world_mark_ending()) world_wait_if_ending();  /* another thread is ending it, its line said */
    fprintf(stderr, "%s; stopping every process\n", line);
    fflush(stderr);
    static Cleanup c;
    c = (Cleanup){ cleanup, arg };
    pthread_t thread;
    if (cleanup && host_thread_create(&thread, run_cleanup, &c) == 0) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long nanos = until.tv_nsec + (long)((seconds - (long)seconds) * 1e9);
        until.tv_sec += (time_t)seconds + nanos / 1000000000L;
        until.tv_nsec = nanos % 1000000000L;
        pthread_timedjoin_np(thread, NULL, &until);  /* past it, the process leaves with the cleanup under way */
    }
    world_abort(1);
}

/* ---- the file rendezvous ---- */

int world_read_rendezvous(const char *path, void *buf, size_t bytes, const char *what) {
    double deadline = host_seconds() + the_world.timeout_s;
    for (;;) {
        FILE *f = fopen(path, "rb");
        if (f) {
            int whole = fread(buf, bytes, 1, f) == 1 && fgetc(f) == EOF;
            fclose(f);
            if (whole) return 0;
            fprintf(stderr, "error: process %d: the --rendezvous file %s is not %s (%zu bytes)\n", the_world.proc,
                    path, what, bytes);
            return -1;
        }
        if (errno != ENOENT) {
            fprintf(stderr, "error: process %d: cannot read the --rendezvous file %s: %s\n", the_world.proc, path,
                    strerror(errno));
            return -1;
        }
        if (host_seconds() > deadline) {
            fprintf(stderr, "error: process %d: no --rendezvous file %s from process 0 within %g s (--timeout)\n",
                    the_world.proc, path, the_world.timeout_s);
            return -1;
        }
        nanosleep(&(struct timespec){ 0, 50 * 1000 * 1000 }, NULL);
    }
}
