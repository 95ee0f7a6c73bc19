/* rank_threads.c: the rank threads, the baton and the rendezvous of rank_threads.h.
 *
 * One mutex and one condition variable guard everything: the run in flight,
 * the baton holder, the rendezvous count and generation, which ranks have
 * finished, and the error. Every wait rechecks the error, so a failure anywhere
 * wakes everyone. The threads start once, in rank_threads_create; each run bumps
 * `run`, which wakes them, and the last to finish wakes rank_threads_run.
 */
#include "rank_threads.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"

/* What a rank's thread is started with. */
typedef struct { RankThreads *f; int rank; } RankThread;

struct RankThreads {
    int nranks;
    pthread_mutex_t mu;
    pthread_cond_t changed;
    int holder;                 /* rank that may run now; -1 when none */
    int arrived;                /* ranks waiting at the current rendezvous */
    char waiting_at[RENDEZVOUS_NAME_MAX];  /* its name, as the first rank to arrive gave it */
    int first_rank;
    int name_offset;            /* rank 0's global rank, for the error lines (rank_threads_name_ranks_from) */
    unsigned long generation;   /* rendezvous completed so far */
    int finished[MAX_RANKS];
    int nfinished;
    int failed;
    int error_rank;
    char error[256];
    RankBody body;
    void *ctx;
    unsigned long run;          /* runs started so far; a thread runs each once */
    int stopping;               /* rank_threads_destroy: the threads return */
    int nthreads;               /* threads started */
    pthread_t threads[MAX_RANKS];
    RankThread thread_arg[MAX_RANKS];
};

static void *rank_thread(void *arg);

/* Ask the threads started so far to return, and join them. */
static void stop_threads(RankThreads *f) {
    pthread_mutex_lock(&f->mu);
    f->stopping = 1;
    pthread_cond_broadcast(&f->changed);
    pthread_mutex_unlock(&f->mu);
    for (int r = 0; r < f->nthreads; r++) pthread_join(f->threads[r], NULL);
}

static void free_threads(RankThreads *f) {
    pthread_cond_destroy(&f->changed);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

RankThreads *rank_threads_create(int nranks) {
    if (nranks < 1 || nranks > MAX_RANKS) {
        fprintf(stderr, "rank threads: %d ranks, expected 1..%d\n", nranks, MAX_RANKS);
        return NULL;
    }
    RankThreads *f = host_calloc(1, sizeof *f);
    f->nranks = nranks;
    int rc = pthread_mutex_init(&f->mu, NULL);
    if (rc == 0) rc = pthread_cond_init(&f->changed, NULL);
    if (rc != 0) {
        fprintf(stderr, "rank threads: cannot make the baton's lock: %s\n", strerror(rc));
        free(f);
        return NULL;
    }
    for (; f->nthreads < nranks; f->nthreads++) {
        f->thread_arg[f->nthreads] = (RankThread){ f, f->nthreads };
        rc = host_thread_create(&f->threads[f->nthreads], rank_thread, &f->thread_arg[f->nthreads]);
        if (rc != 0) {
            fprintf(stderr, "rank threads: cannot start the thread of rank %d: %s\n", f->nthreads, strerror(rc));
            stop_threads(f);
            free_threads(f);
            return NULL;
        }
    }
    return f;
}

void rank_threads_destroy(RankThreads *f) {
    if (!f) return;
    stop_threads(f);
    free_threads(f);
}

int rank_threads_nranks(const RankThreads *f) { return f->nranks; }
void rank_threads_name_ranks_from(RankThreads *f, int first) { f->name_offset = first; }
const char *rank_threads_error(const RankThreads *f) { return f->error; }
int rank_threads_error_rank(const RankThreads *f) { return f->error_rank; }

/* With the lock held: record the first error and wake everyone. */
static void fail_locked(RankThreads *f, int rank, const char *fmt, va_list ap) {
    if (!f->failed) {
        char what[200];
        vsnprintf(what, sizeof what, fmt, ap);
        snprintf(f->error, sizeof f->error, "rank %d: %s", f->name_offset + rank, what);
        f->error_rank = rank;
        f->failed = 1;
    }
    pthread_cond_broadcast(&f->changed);
}

static void fail_locked_fmt(RankThreads *f, int rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fail_locked(f, rank, fmt, ap);
    va_end(ap);
}

int rank_threads_fail(RankThreads *f, int rank, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&f->mu);
    fail_locked(f, rank, fmt, ap);
    pthread_mutex_unlock(&f->mu);
    va_end(ap);
    return -1;
}

/* With the lock held: hand the baton to the next rank still running. */
static void pass_baton(RankThreads *f, int from) {
    f->holder = -1;
    for (int step = 1; step <= f->nranks; step++) {
        int next = (from + step) % f->nranks;
        if (!f->finished[next]) { f->holder = next; break; }
    }
    pthread_cond_broadcast(&f->changed);
}

int rank_threads_arrive(RankThreads *f, int rank, const char *rendezvous) {
    pthread_mutex_lock(&f->mu);
    if (f->failed) { pthread_mutex_unlock(&f->mu); return -1; }
    if (f->nfinished > 0) {
        int gone = 0;
        while (!f->finished[gone]) gone++;
        fail_locked_fmt(f, rank, "reached a rendezvous that rank %d finished its step without (mismatch)",
                        f->name_offset + gone);
        pthread_mutex_unlock(&f->mu);
        return -1;
    }
    if (f->arrived == 0) {
        snprintf(f->waiting_at, sizeof f->waiting_at, "%s", rendezvous);
        f->first_rank = rank;
    } else if (strncmp(f->waiting_at, rendezvous, sizeof f->waiting_at - 1) != 0) {
        fail_locked_fmt(f, rank, "reached the rendezvous '%s' while rank %d waits at '%s' (mismatch)",
                        rendezvous, f->name_offset + f->first_rank, f->waiting_at);
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

int rank_threads_depart(RankThreads *f, int rank) {
    pthread_mutex_lock(&f->mu);
    f->arrived = 0;
    f->generation++;
    pass_baton(f, rank);
    while (!f->failed && f->holder != rank) pthread_cond_wait(&f->changed, &f->mu);
    int rc = f->failed ? -1 : 0;
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* A rank's thread: for each run, wait for the baton, run the body, finish. */
static void *rank_thread(void *arg) {
    RankThread *t = arg;
    RankThreads *f = t->f;
    unsigned long done_runs = 0;
    pthread_mutex_lock(&f->mu);
    for (;;) {
        while (!f->stopping && f->run == done_runs) pthread_cond_wait(&f->changed, &f->mu);
        if (f->stopping) break;
        done_runs = f->run;
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
        pthread_cond_broadcast(&f->changed);  /* the last one wakes rank_threads_run */
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

int rank_threads_run(RankThreads *f, RankBody body, void *ctx) {
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
    f->run++;
    pthread_cond_broadcast(&f->changed);
    while (f->nfinished < f->nranks) pthread_cond_wait(&f->changed, &f->mu);
    int rc = f->failed ? -1 : 0;
    pthread_mutex_unlock(&f->mu);
    return rc;
}
