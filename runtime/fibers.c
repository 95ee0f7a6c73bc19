/* fibers.c: the rank threads, the baton and the rendezvous of fibers.h.
 *
 * One mutex and one condition variable guard everything: the baton holder, the
 * rendezvous count and generation, which ranks have finished, and the error.
 * Every wait rechecks the error, so a failure anywhere wakes everyone.
 */
#include "fibers.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"

struct Fibers {
    int nranks;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    int holder;                 /* rank that may run now; -1 when none */
    int arrived;                /* ranks waiting at the current rendezvous */
    char waiting_at[FIBERS_NAME_MAX];  /* its name, as the first rank to arrive gave it */
    int first_rank;
    unsigned long generation;   /* rendezvous completed so far */
    int finished[FIBERS_MAX_RANKS];
    int nfinished;
    int failed;
    int error_rank;
    char error[256];
    RankBody body;
    void *ctx;
};

typedef struct { Fibers *f; int rank; } RankThread;

Fibers *fibers_create(int nranks) {
    if (nranks < 1 || nranks > FIBERS_MAX_RANKS) {
        fprintf(stderr, "fibers: %d ranks, expected 1..%d\n", nranks, FIBERS_MAX_RANKS);
        return NULL;
    }
    Fibers *f = host_calloc(1, sizeof *f);
    f->nranks = nranks;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->changed, NULL);
    return f;
}

void fibers_destroy(Fibers *f) {
    if (!f) return;
    pthread_cond_destroy(&f->changed);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

int fibers_nranks(const Fibers *f) { return f->nranks; }
const char *fibers_error(const Fibers *f) { return f->error; }
int fibers_error_rank(const Fibers *f) { return f->error_rank; }

/* With the lock held: record the first error and wake everyone. */
static void fail_locked(Fibers *f, int rank, const char *fmt, va_list ap) {
    if (!f->failed) {
        char what[200];
        vsnprintf(what, sizeof what, fmt, ap);
        snprintf(f->error, sizeof f->error, "rank %d: %s", rank, what);
        f->error_rank = rank;
        f->failed = 1;
    }
    pthread_cond_broadcast(&f->changed);
}

static void fail_locked_fmt(Fibers *f, int rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_locked(f, rank, fmt, ap);
    va_end(ap);
}

int fibers_fail(Fibers *f, int rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&f->mu);
    fail_locked(f, rank, fmt, ap);
    pthread_mutex_unlock(&f->mu);
    va_end(ap);
    return -1;
}

/* With the lock held: hand the baton to the next rank still running. */
static void pass_baton(Fibers *f, int from) {
    f->holder = -1;
    for (int step = 1; step <= f->nranks; step++) {
        int next = (from + step) % f->nranks;
        if (!f->finished[next]) { f->holder = next; break; }
    }
    pthread_cond_broadcast(&f->changed);
}

int fibers_arrive(Fibers *f, int rank, const char *rendezvous) {
    pthread_mutex_lock(&f->mu);
    if (f->failed) { pthread_mutex_unlock(&f->mu); return -1; }
    if (f->nfinished > 0) {
        int gone = 0;
        while (!f->finished[gone]) gone++;
        fail_locked_fmt(f, rank, "reached a rendezvous that rank %d finished its step without (mismatch)", gone);
        pthread_mutex_unlock(&f->mu);
        return -1;
    }
    if (f->arrived == 0) {
        snprintf(f->waiting_at, sizeof f->waiting_at, "%s", rendezvous);
        f->first_rank = rank;
    } else if (strncmp(f->waiting_at, rendezvous, sizeof f->waiting_at - 1) != 0) {
        fail_locked_fmt(f, rank, "reached the rendezvous '%s' while rank %d waits at '%s' (mismatch)",
                        rendezvous, f->first_rank, f->waiting_at);
        pthread_mutex_unlock(&f->mu);
        return -1;
    }
    if (++f->arrived == f->nranks) {  /* last: keep the baton, enqueue, depart */
        pthread_mutex_unlock(&f->mu);
        return 1;
    }
    unsigned long generation = f->generation;
    pass_baton(f, rank);
    while (!f->failed && !(f->generation != generation && f->holder == rank))
        pthread_cond_wait(&f->changed, &f->mu);
    int rc = f->failed ? -1 : 0;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

int fibers_depart(Fibers *f, int rank) {
    pthread_mutex_lock(&f->mu);
    f->arrived = 0;
    f->generation++;
    pass_baton(f, rank);
    while (!f->failed && f->holder != rank) pthread_cond_wait(&f->changed, &f->mu);
    int rc = f->failed ? -1 : 0;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static void *rank_thread(void *arg) {
    RankThread *t = arg;
    Fibers *f = t->f;
    pthread_mutex_lock(&f->mu);
    while (!f->failed && f->holder != t->rank) pthread_cond_wait(&f->changed, &f->mu);
    int runs = !f->failed;
    pthread_mutex_unlock(&f->mu);

    int rc = runs ? f->body(f, t->rank, f->ctx) : 0;

    pthread_mutex_lock(&f->mu);
    if (rc != 0 && !f->failed) fail_locked_fmt(f, t->rank, "its step failed");
    if (!f->failed && f->arrived > 0)
        fail_locked_fmt(f, t->rank, "finished its step while %d rank(s) wait at a rendezvous (mismatch)",
                        f->arrived);
    f->finished[t->rank] = 1;
    f->nfinished++;
    if (f->holder == t->rank) pass_baton(f, t->rank);
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int fibers_run(Fibers *f, RankBody body, void *ctx) {
    pthread_t threads[FIBERS_MAX_RANKS];
    RankThread args[FIBERS_MAX_RANKS];
    pthread_mutex_lock(&f->mu);
    f->holder = 0;
    f->arrived = 0;
    f->nfinished = 0;
    f->failed = 0;
    f->error[0] = 0;
    f->error_rank = -1;
    memset(f->finished, 0, sizeof f->finished);
    f->body = body;
    f->ctx = ctx;
    pthread_mutex_unlock(&f->mu);

    int started = 0;
    for (; started < f->nranks; started++) {
        args[started] = (RankThread){ f, started };
        int rc = host_thread_create(&threads[started], rank_thread, &args[started]);
        if (rc != 0) {
            fibers_fail(f, started, "cannot start its thread: %s", strerror(rc));
            break;
        }
    }
    for (int r = 0; r < started; r++) pthread_join(threads[r], NULL);
    return f->failed ? -1 : 0;
}
