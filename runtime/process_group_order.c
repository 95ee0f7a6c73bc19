/* process_group_order.c: the collectives as every backend runs them: their
 * event ordering around the backend's data movement (process_group.h's
 * contract: a collective waits for every rank's compute so far, then the
 * compute streams wait for it, or done events mark it), their names and
 * trace spans, the modeled link's hold, and the reduce-scatter's add into its
 * output.
 */
#include <stdio.h>

#include "process_group.h"

void collective_name_text(CollectiveName name, char *text, size_t len) {
    if (name.index >= 0) snprintf(text, len, "%s %d", name.what, name.index);
    else snprintf(text, len, "%s", name.what);
}

/* The ranks whose events rank r's streams wait on around a collective: every
 * rank in the simulator, whose parts read and write the peers' buffers
 * themselves; rank r alone under NCCL, which orders the ranks itself (a
 * rank's part is done only once its peers are done with its buffers). */
static int first_peer(const ProcessGroup *pg, int r) { return pg->simulated ? 0 : r; }
static int end_peer(const ProcessGroup *pg, int r) { return pg->simulated ? pg->nranks : r + 1; }

void pg_wait_parts(const ProcessGroup *pg, int rank, Stream *waiter, Event *const *done) {
    for (int q = first_peer(pg, rank); q < end_peer(pg, rank); q++) stream_wait_event(waiter, done[q]);
}

/* Every comm stream waits for its peers' compute work so far. */
static void wait_for_producers(ProcessGroup *pg) {
    for (int r = 0; r < pg->nranks; r++) event_record(pg->produced[r], pg->compute[r]);
    for (int r = 0; r < pg->nranks; r++) pg_wait_parts(pg, r, pg->comm[r], pg->produced);
}

/* Every stream in `waiters` waits for its peers' parts of the phase just enqueued. */
static void wait_for_parts(ProcessGroup *pg, Stream **waiters) {
    for (int r = 0; r < pg->nranks; r++) event_record(pg->part_done[r], pg->comm[r]);
    for (int r = 0; r < pg->nranks; r++) pg_wait_parts(pg, r, waiters[r], pg->part_done);
}

/* The collective's start: its producers, then its span, named "all-gather
 * unit 3" into label, and the modeled link's clock start. */
static void begin(ProcessGroup *pg, const char *collective, CollectiveName name, char *label, size_t len) {
    wait_for_producers(pg);
    char what[RENDEZVOUS_NAME_MAX];
    collective_name_text(name, what, sizeof what);
    snprintf(label, len, "%s %s", collective, what);
    if (pg->trace)
        for (int r = 0; r < pg->nranks; r++) trace_begin(pg->comm[r], label, name.unit);
    if (pg->link.gbps > 0)
        for (int r = 0; r < pg->nranks; r++) stream_timer_start(pg->comm[r]);
}

/* The collective's end: the modeled link's time is up (the data moved
 * meanwhile), its span ends, then the compute streams wait for it, or done[r]
 * marks it. */
static void end(ProcessGroup *pg, LinkCollective what, size_t n, Precision dtype, Event *const *done) {
    double seconds = pg_link_cost(pg, what, n, dtype).seconds;
    for (int r = 0; r < pg->nranks; r++) {
        stream_hold(pg->comm[r], seconds);
        trace_end(pg->comm[r]);
    }
    if (!done) {
        wait_for_parts(pg, pg->compute);
        return;
    }
    for (int r = 0; r < pg->nranks; r++) event_record(done[r], pg->comm[r]);
}

/* On one rank an in-place collective in fp32 without scaling changes nothing:
 * skip it, and its stream hand-offs, so DDP on one rank costs what the plain
 * loop does. (One in bf16 still rounds.) */
static int nothing_to_do(const ProcessGroup *pg, float *const *send, float *const *recv, float scale,
                         Precision dtype) {
    return pg->world_size == 1 && scale == 1.0f && dtype == PRECISION_FP32 && send[0] == recv[0];
}

/* A collective with nothing to do is over at once. Its done events still mean
 * what they always do: the producers' work is done too (a caller may read the
 * buffers on the communication stream after them). */
static void skip(ProcessGroup *pg, Event *const *done) {
    if (!done) return;
    wait_for_producers(pg);
    for (int r = 0; r < pg->nranks; r++) event_record(done[r], pg->comm[r]);
}

/* Each local rank's own shard of its buffer of n floats, in place (an empty
 * shard is never touched). */
static void own_shards(const ProcessGroup *pg, float *const *bufs, size_t n, float **shards) {
    size_t shard = pg_shard_size(n, pg_shards(pg));
    for (int r = 0; r < pg->nranks; r++) {
        size_t at = (size_t)pg_shard_of(pg, pg_global_rank(pg, r)) * shard;
        shards[r] = at < n ? bufs[r] + at : bufs[r];
    }
}

/* REDUCE_ADD's add, recv[r] = recv[r] + reduced[r] over rank r's shard, on streams[r]. */
static void add_into(ProcessGroup *pg, Stream **streams, float *const *recv, float *const *reduced, size_t n) {
    for (int r = 0; r < pg->nranks; r++) {
        float *terms[2] = { recv[r], reduced[r] };
        size_t len = pg_shard_length(n, pg_shards(pg), pg_shard_of(pg, pg_global_rank(pg, r)));
        stream_sum(streams[r], recv[r], terms, 2, len, 1.0f, PRECISION_FP32);
    }
}

/* REDUCE_ADD with nothing to reduce is the add alone: on the compute streams,
 * in the callers' order; or, with done events, as skip's, on the
 * communication streams after the producers, the done events marking it. */
static void add_alone(ProcessGroup *pg, float *const *recv, float *const *reduced, size_t n, Event *const *done) {
    if (!done) {
        add_into(pg, pg->compute, recv, reduced, n);
        return;
    }
    wait_for_producers(pg);
    add_into(pg, pg->comm, recv, reduced, n);
    for (int r = 0; r < pg->nranks; r++) event_record(done[r], pg->comm[r]);
}

void pg_reduce_scatter(ProcessGroup *pg, CollectiveName name, float *const *send, float *const *recv, size_t n,
                       float scale, Precision dtype, ReduceInto into, Event *const *done) {
    float *own[MAX_RANKS];
    own_shards(pg, send, n, own);
    float *const *reduced = into == REDUCE_ADD ? own : recv;
    if (nothing_to_do(pg, send, reduced, scale, dtype)) {
        if (into == REDUCE_ADD) add_alone(pg, recv, reduced, n, done);
        else skip(pg, done);
        return;
    }
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "reduce-scatter", name, label, sizeof label);
    pg->collectives->reduce_scatter(pg, send, reduced, n, scale, dtype, label);
    if (into == REDUCE_ADD) add_into(pg, pg->comm, recv, reduced, n);
    end(pg, LINK_REDUCE_SCATTER, n, dtype, done);
}

void pg_all_gather(ProcessGroup *pg, CollectiveName name, float *const *send, float *const *recv, size_t n,
                   Precision dtype, Event *const *done) {
    if (nothing_to_do(pg, send, recv, 1.0f, dtype)) {
        skip(pg, done);
        return;
    }
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "all-gather", name, label, sizeof label);
    pg->collectives->all_gather(pg, send, recv, n, dtype, label);
    end(pg, LINK_ALL_GATHER, n, dtype, done);
}

void pg_all_gather_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *send, bf16 *const *recv, size_t n,
                        Event *const *done) {
    if (pg->world_size == 1 && send[0] == recv[0]) {
        skip(pg, done);
        return;
    }
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "all-gather", name, label, sizeof label);
    pg->collectives->all_gather_bf16(pg, send, recv, n, label);
    end(pg, LINK_ALL_GATHER, n, PRECISION_BF16, done);
}

void pg_all_reduce(ProcessGroup *pg, CollectiveName name, float *const *bufs, size_t n, float scale,
                   Precision dtype, Event *const *done) {
    if (nothing_to_do(pg, bufs, bufs, scale, dtype)) {
        skip(pg, done);
        return;
    }
    float *shards[MAX_RANKS];
    own_shards(pg, bufs, n, shards);
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "all-reduce", name, label, sizeof label);
    pg->collectives->reduce_scatter(pg, bufs, shards, n, scale, dtype, label);
    wait_for_parts(pg, pg->comm);
    pg->collectives->all_gather(pg, shards, bufs, n, dtype, label);
    end(pg, LINK_ALL_REDUCE, n, dtype, done);
}
