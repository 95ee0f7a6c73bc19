/* rank_threads.h: one OS thread per rank, one of them enqueueing at a time.
 *
 * Why: a collective over one unit must be enqueued after every rank's work on
 * that unit and before any rank's next use of it. Each rank's step therefore
 * runs on its own thread, and a baton passes between the threads at unit
 * boundaries, so the enqueue order is block-major and the same in every run:
 *
 *     R0 work(u) | R1 work(u) | ... | collective(u) | R0 work(u+1) | ...
 *
 * Contract:
 *  1. One body per rank. Only the baton holder runs; bodies share state only
 *     through what they own.
 *  2. Every rank reaches the same rendezvous in the same order; each names
 *     the rendezvous it arrives at, and a rank arriving at another name than
 *     the ranks waiting there is a mismatch error.
 *  3. rank_threads_arrive() returns 1 on the last rank to arrive; it enqueues the
 *     collective for all ranks, then calls rank_threads_depart(), which hands the
 *     baton on and returns when it comes back. The others block (no spinning)
 *     until then, and get 0 when the baton is back with them.
 *  4. An error in any rank ends the run: the others get -1 from their current or
 *     next rank_threads_arrive() and return; rank_threads_run() joins every thread and
 *     returns the first error, naming its rank.
 *  5. A rank that finishes its body while others wait at a rendezvous, or that
 *     reaches a rendezvous a finished rank skipped, is a mismatch error, not a
 *     hang.
 */
#ifndef ZF_RANK_THREADS_H
#define ZF_RANK_THREADS_H

enum { MAX_RANKS = 64, RENDEZVOUS_NAME_MAX = 48 };

typedef struct RankThreads RankThreads;

/* A rank's step: 0, or non-zero after rank_threads_fail() said why. */
typedef int (*RankBody)(RankThreads *f, int rank, void *ctx);

/* Start the N rank threads, which live until rank_threads_destroy and wait, without
 * spinning, for each run. NULL (with a message on stderr) unless 1 <= nranks
 * <= MAX_RANKS and every thread started. */
RankThreads *rank_threads_create(int nranks);
/* Stop and join the rank threads (no run may be in flight). */
void rank_threads_destroy(RankThreads *f);
int rank_threads_nranks(const RankThreads *f);
/* Name rank r "rank first + r" in the error lines: its global rank, when
 * these are one process's ranks of many (runtime/world.h). */
void rank_threads_name_ranks_from(RankThreads *f, int first);

/* Wake every rank's thread to run body, rank 0 first, and wait until every
 * rank has finished it. Returns 0, or -1 with the first error in
 * rank_threads_error(). One run at a time. */
int rank_threads_run(RankThreads *f, RankBody body, void *ctx);
/* "rank R: what went wrong" for the last failed run. */
const char *rank_threads_error(const RankThreads *f);
int rank_threads_error_rank(const RankThreads *f);

/* Inside a body: see the contract above. Both return -1 when the run is failing. */
int rank_threads_arrive(RankThreads *f, int rank, const char *rendezvous);
int rank_threads_depart(RankThreads *f, int rank);
/* Record an error of this rank (the first one wins) and wake every rank; -1. */
int rank_threads_fail(RankThreads *f, int rank, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
