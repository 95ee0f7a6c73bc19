/* process_group.c: the simulator's collectives and their event ordering.
 *
 * An all-reduce is a reduce-scatter and an all-gather, both in place: every
 * element is summed once, in rank order, by the rank that owns it, then copied
 * to the others. Between the phases every rank waits for every rank's part.
 */
#include "process_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"

ProcessGroup *pg_create_simulator(int nranks) {
    if (nranks < 1 || nranks > FIBERS_MAX_RANKS) {
        fprintf(stderr, "process group: %d ranks, expected 1..%d\n", nranks, FIBERS_MAX_RANKS);
        return NULL;
    }
    ProcessGroup *pg = host_calloc(1, sizeof *pg);
    pg->nranks = nranks;
    for (int r = 0; r < nranks; r++) {
        pg->device[r] = device_create_cpu(nranks);
        pg->compute[r] = stream_create(pg->device[r]);
        pg->comm[r] = stream_create(pg->device[r]);
        pg->produced[r] = event_create();
        pg->part_done[r] = event_create();
    }
    return pg;
}

void pg_destroy(ProcessGroup *pg) {
    if (!pg) return;
    for (int r = 0; r < pg->nranks; r++) {
        stream_destroy(pg->compute[r]);
        stream_destroy(pg->comm[r]);
        event_destroy(pg->produced[r]);
        event_destroy(pg->part_done[r]);
        device_destroy(pg->device[r]);
    }
    free(pg);
}

size_t pg_shard_size(size_t n, int nranks) { return (n + (size_t)nranks - 1) / (size_t)nranks; }

/* The valid length of rank r's shard. */
static size_t shard_length(size_t n, size_t shard, int r) {
    size_t lo = (size_t)r * shard;
    return lo >= n ? 0 : (n - lo < shard ? n - lo : shard);
}

/* Every comm stream waits for every compute stream's work so far. */
static void wait_for_producers(ProcessGroup *pg) {
    for (int r = 0; r < pg->nranks; r++) event_record(pg->produced[r], pg->compute[r]);
    for (int r = 0; r < pg->nranks; r++)
        for (int q = 0; q < pg->nranks; q++) stream_wait_event(pg->comm[r], pg->produced[q]);
}

/* Every stream in `waiters` waits for every rank's part of the phase just enqueued. */
static void wait_for_parts(ProcessGroup *pg, Stream **waiters) {
    for (int r = 0; r < pg->nranks; r++) event_record(pg->part_done[r], pg->comm[r]);
    for (int r = 0; r < pg->nranks; r++)
        for (int q = 0; q < pg->nranks; q++) stream_wait_event(waiters[r], pg->part_done[q]);
}

/* ---- the local kernels ---- */

enum { SUM_CHUNK = 1024 };

typedef struct {
    float *send[FIBERS_MAX_RANKS];
    float *recv;
    int nranks, rank;
    size_t n, shard;
    float scale;
} ReduceScatterArgs;

/* Rank r's shard, summed over ranks in order through a stack buffer (recv may
 * alias send[r]), then scaled. */
static void reduce_scatter_task(void *p) {
    ReduceScatterArgs *a = p;
    size_t lo = (size_t)a->rank * a->shard, len = shard_length(a->n, a->shard, a->rank);
    float acc[SUM_CHUNK];
    for (size_t c0 = 0; c0 < len; c0 += SUM_CHUNK) {
        size_t m = len - c0 < SUM_CHUNK ? len - c0 : SUM_CHUNK;
        memcpy(acc, a->send[0] + lo + c0, m * sizeof(float));
        for (int q = 1; q < a->nranks; q++) {
            const float *src = a->send[q] + lo + c0;
            for (size_t i = 0; i < m; i++) acc[i] += src[i];
        }
        for (size_t i = 0; i < m; i++) a->recv[c0 + i] = acc[i] * a->scale;
    }
}

typedef struct {
    float *send[FIBERS_MAX_RANKS];
    float *recv;
    int nranks;
    size_t n, shard;
} AllGatherArgs;

static void all_gather_task(void *p) {
    AllGatherArgs *a = p;
    for (int q = 0; q < a->nranks; q++) {
        float *dst = a->recv + (size_t)q * a->shard;
        size_t len = shard_length(a->n, a->shard, q);
        if (len && dst != a->send[q]) memcpy(dst, a->send[q], len * sizeof(float));
    }
}

static void enqueue_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv,
                                   size_t n, float scale) {
    ReduceScatterArgs a = { .nranks = pg->nranks, .n = n, .shard = pg_shard_size(n, pg->nranks),
                            .scale = scale };
    memcpy(a.send, send, sizeof(float *) * pg->nranks);
    for (int r = 0; r < pg->nranks; r++) {
        a.rank = r;
        a.recv = recv[r];
        stream_launch(pg->comm[r], reduce_scatter_task, &a, sizeof a);
    }
}

static void enqueue_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n) {
    AllGatherArgs a = { .nranks = pg->nranks, .n = n, .shard = pg_shard_size(n, pg->nranks) };
    memcpy(a.send, send, sizeof(float *) * pg->nranks);
    for (int r = 0; r < pg->nranks; r++) {
        a.recv = recv[r];
        stream_launch(pg->comm[r], all_gather_task, &a, sizeof a);
    }
}

/* ---- the collectives ---- */

/* On one rank an in-place collective without scaling changes nothing: skip it,
 * and its stream hand-offs, so DDP on one rank costs what the plain loop does. */
static int nothing_to_do(const ProcessGroup *pg, float *const *send, float *const *recv, float scale) {
    return pg->nranks == 1 && scale == 1.0f && send[0] == recv[0];
}

void pg_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv, size_t n, float scale) {
    if (nothing_to_do(pg, send, recv, scale)) return;
    wait_for_producers(pg);
    enqueue_reduce_scatter(pg, send, recv, n, scale);
    wait_for_parts(pg, pg->compute);
}

void pg_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n) {
    if (nothing_to_do(pg, send, recv, 1.0f)) return;
    wait_for_producers(pg);
    enqueue_all_gather(pg, send, recv, n);
    wait_for_parts(pg, pg->compute);
}

void pg_all_reduce(ProcessGroup *pg, float *const *bufs, size_t n, float scale) {
    if (nothing_to_do(pg, bufs, bufs, scale)) return;
    size_t shard = pg_shard_size(n, pg->nranks);
    float *shards[FIBERS_MAX_RANKS];
    for (int r = 0; r < pg->nranks; r++)  /* an empty shard is never touched */
        shards[r] = (size_t)r * shard < n ? bufs[r] + (size_t)r * shard : bufs[r];
    wait_for_producers(pg);
    enqueue_reduce_scatter(pg, bufs, shards, n, scale);
    wait_for_parts(pg, pg->comm);
    enqueue_all_gather(pg, shards, bufs, n);
    wait_for_parts(pg, pg->compute);
}
