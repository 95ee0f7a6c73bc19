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
    for (int r = 0; r < pg->nranks; r++) {
        if (pg->link.gbps > 0) trace_begin_link(pg->comm[r], label, name.unit);
        else if (pg->trace) trace_begin(pg->comm[r], label, name.unit);
    }
}

/* The collective's end: the modeled link's time is up (the data moved
 * meanwhile), its span ends, then the compute streams wait for it, or done[r]
 * marks it. */
static void end(ProcessGroup *pg, LinkCollective what, size_t n, DType dtype, Event *const *done) {
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
 * loop does. (One in bf16 of fp32 numbers still rounds; numbers held in bf16
 * are bf16 already.) */
static int nothing_to_do(const ProcessGroup *pg, void *const *send, void *const *recv, DType held, float scale,
                         DType dtype) {
    int rounds = dtype == DTYPE_BF16 && held == DTYPE_FP32;
    return pg->world_size == 1 && scale == 1.0f && !rounds && send[0] == recv[0];
}

/* A collective with nothing to do is over at once. Its done events still mean
 * what they always do: the producers' work is done too (a caller may read the
 * buffers on the communication stream after them). */
static void skip(ProcessGroup *pg, Event *const *done) {
    if (!done) return;
    wait_for_producers(pg);
    for (int r = 0; r < pg->nranks; r++) event_record(done[r], pg->comm[r]);
}

/* Each local rank's own shard of its buffer of n numbers, in place (an empty
 * shard is never touched). */
static void own_shards(const ProcessGroup *pg, void *const *bufs, DType held, size_t n, void **shards) {
    size_t shard = pg_shard_size(n, pg_shards(pg));
    for (int r = 0; r < pg->nranks; r++) {
        size_t at = (size_t)pg_shard_of(pg, pg_global_rank(pg, r)) * shard;
        shards[r] = at < n ? pg_number(bufs[r], held, at) : bufs[r];
    }
}

/* REDUCE_ADD's add, recv[r] = recv[r] + reduced[r] over rank r's shard, on
 * streams[r]: in fp32, or for numbers held in bf16 in bf16 (the sum rounded). */
static void add_into(ProcessGroup *pg, Stream **streams, void *const *recv, void *const *reduced, DType held,
                     size_t n) {
    for (int r = 0; r < pg->nranks; r++) {
        const void *terms[2] = { recv[r], reduced[r] };
        size_t len = pg_shard_length(n, pg_shards(pg), pg_shard_of(pg, pg_global_rank(pg, r)));
        stream_sum_held(streams[r], recv[r], terms, held, 2, len, 1.0f, held);
    }
}

/* REDUCE_ADD with nothing to reduce is the add alone: on the compute streams,
 * in the callers' order; or, with done events, as skip's, on the
 * communication streams after the producers, the done events marking it. */
static void add_alone(ProcessGroup *pg, void *const *recv, void *const *reduced, DType held, size_t n,
                      Event *const *done) {
    if (!done) {
        add_into(pg, pg->compute, recv, reduced, held, n);
        return;
    }
    wait_for_producers(pg);
    add_into(pg, pg->comm, recv, reduced, held, n);
    for (int r = 0; r < pg->nranks; r++) event_record(done[r], pg->comm[r]);
}

/* The collectives of numbers held either way (send, recv and bufs: float *
 * or bf16 * arrays, as void *). */
static void reduce_scatter(ProcessGroup *pg, CollectiveName name, void *const *send, void *const *recv,
                           DType held, size_t n, float scale, DType dtype, ReduceInto into,
                           Event *const *done) {
    void *own[MAX_RANKS];
    own_shards(pg, send, held, n, own);
    void *const *reduced = into == REDUCE_ADD ? own : recv;
    if (nothing_to_do(pg, send, reduced, held, scale, dtype)) {
        if (into == REDUCE_ADD) add_alone(pg, recv, reduced, held, n, done);
        else skip(pg, done);
        return;
    }
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "reduce-scatter", name, label, sizeof label);
    pg->collectives->reduce_scatter(pg, send, reduced, held, n, scale, dtype, label);
    if (into == REDUCE_ADD) add_into(pg, pg->comm, recv, reduced, held, n);
    end(pg, LINK_REDUCE_SCATTER, n, dtype, done);
}

static void all_gather(ProcessGroup *pg, CollectiveName name, void *const *send, void *const *recv, DType held,
                       size_t n, DType dtype, Event *const *done) {
    if (nothing_to_do(pg, send, recv, held, 1.0f, dtype)) {
        skip(pg, done);
        return;
    }
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "all-gather", name, label, sizeof label);
    pg->collectives->all_gather(pg, send, recv, held, n, dtype, label);
    end(pg, LINK_ALL_GATHER, n, dtype, done);
}

static void all_reduce(ProcessGroup *pg, CollectiveName name, void *const *bufs, DType held, size_t n,
                       float scale, DType dtype, Event *const *done) {
    if (nothing_to_do(pg, bufs, bufs, held, scale, dtype)) {
        skip(pg, done);
        return;
    }
    void *shards[MAX_RANKS];
    own_shards(pg, bufs, held, n, shards);
    char label[2 * RENDEZVOUS_NAME_MAX];
    begin(pg, "all-reduce", name, label, sizeof label);
    pg->collectives->reduce_scatter(pg, bufs, shards, held, n, scale, dtype, label);
    wait_for_parts(pg, pg->comm);
    pg->collectives->all_gather(pg, shards, bufs, held, n, dtype, label);
    end(pg, LINK_ALL_REDUCE, n, dtype, done);
}

/* The local ranks' buffers, as the collectives above take them. */
static void floats_as_numbers(const ProcessGroup *pg, float *const *bufs, void **numbers) {
    for (int r = 0; r < pg->nranks; r++) numbers[r] = bufs[r];
}

static void bf16_as_numbers(const ProcessGroup *pg, bf16 *const *bufs, void **numbers) {
    for (int r = 0; r < pg->nranks; r++) numbers[r] = bufs[r];
}

void pg_reduce_scatter(ProcessGroup *pg, CollectiveName name, float *const *send, float *const *recv, size_t n,
                       float scale, DType dtype, ReduceInto into, Event *const *done) {
    void *sends[MAX_RANKS], *recvs[MAX_RANKS];
    floats_as_numbers(pg, send, sends);
    floats_as_numbers(pg, recv, recvs);
    reduce_scatter(pg, name, sends, recvs, DTYPE_FP32, n, scale, dtype, into, done);
}

void pg_reduce_scatter_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *send, bf16 *const *recv, size_t n,
                            float scale, ReduceInto into, Event *const *done) {
    void *sends[MAX_RANKS], *recvs[MAX_RANKS];
    bf16_as_numbers(pg, send, sends);
    bf16_as_numbers(pg, recv, recvs);
    reduce_scatter(pg, name, sends, recvs, DTYPE_BF16, n, scale, DTYPE_BF16, into, done);
}

void pg_all_gather(ProcessGroup *pg, CollectiveName name, float *const *send, float *const *recv, size_t n,
                   DType dtype, Event *const *done) {
    void *sends[MAX_RANKS], *recvs[MAX_RANKS];
    floats_as_numbers(pg, send, sends);
    floats_as_numbers(pg, recv, recvs);
    all_gather(pg, name, sends, recvs, DTYPE_FP32, n, dtype, done);
}

void pg_all_gather_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *send, bf16 *const *recv, size_t n,
                        Event *const *done) {
    void *sends[MAX_RANKS], *recvs[MAX_RANKS];
    bf16_as_numbers(pg, send, sends);
    bf16_as_numbers(pg, recv, recvs);
    all_gather(pg, name, sends, recvs, DTYPE_BF16, n, DTYPE_BF16, done);
}

void pg_all_reduce(ProcessGroup *pg, CollectiveName name, float *const *bufs, size_t n, float scale,
                   DType dtype, Event *const *done) {
    void *numbers[MAX_RANKS];
    floats_as_numbers(pg, bufs, numbers);
    all_reduce(pg, name, numbers, DTYPE_FP32, n, scale, dtype, done);
}

void pg_all_reduce_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *bufs, size_t n, float scale,
                        Event *const *done) {
    void *numbers[MAX_RANKS];
    bf16_as_numbers(pg, bufs, numbers);
    all_reduce(pg, name, numbers, DTYPE_BF16, n, scale, DTYPE_BF16, done);
}
