/* process_group.c: placing ranks, the collectives' event ordering, and the
 * simulator's collectives (NCCL's are in process_group_nccl.c).
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

void pg_add_rank(ProcessGroup *pg, int rank, Device *dev) {
    pg->device[rank] = dev;
    pg->compute[rank] = stream_create(dev);
    pg->comm[rank] = stream_create(dev);
    pg->produced[rank] = event_create(dev);
    pg->part_done[rank] = event_create(dev);
}

static const Collectives simulator_collectives;

ProcessGroup *pg_create_simulator(int nranks, DeviceKind kind) {
    if (nranks < 1 || nranks > FIBERS_MAX_RANKS) {
        fprintf(stderr, "error: %d ranks, expected 1..%d\n", nranks, FIBERS_MAX_RANKS);
        return NULL;
    }
    ProcessGroup *pg = host_calloc(1, sizeof *pg);
    pg->collectives = &simulator_collectives;
    pg->simulated = 1;
    pg->nranks = nranks;
    for (int r = 0; r < nranks; r++) {
        Device *dev = kind == DEVICE_CUDA ? device_create_cuda(0) : device_create_cpu(nranks);
        if (!dev) {
            pg_destroy(pg);
            return NULL;
        }
        pg_add_rank(pg, r, dev);
    }
    if (kind == DEVICE_CUDA && nranks > 1)
        snprintf(pg->description, sizeof pg->description, "cuda simulator, %d ranks on one GPU, %s", nranks,
                 device_name(pg->device[0]));
    else if (kind == DEVICE_CUDA)
        snprintf(pg->description, sizeof pg->description, "cuda, one rank (no NCCL), %s", device_name(pg->device[0]));
    else if (nranks > 1)
        snprintf(pg->description, sizeof pg->description, "cpu simulator, %d ranks on the CPU", nranks);
    else
        snprintf(pg->description, sizeof pg->description, "cpu, one rank");
    return pg;
}

ProcessGroup *pg_create(int nranks, Placement where) {
    int gpus = where == PLACE_CPU ? 0 : device_cuda_count();
    if (gpus < 0) return NULL;  /* CUDA failed, and said why: no silent fall-back to the CPU */
    if (gpus == 0 && where != PLACE_AUTO && where != PLACE_CPU) {
        fprintf(stderr, "error: --device=cuda, but no GPU is visible (or this build has no CUDA)\n");
        return NULL;
    }
    ProcessGroup *pg;
    if (gpus == 0) pg = pg_create_simulator(nranks, DEVICE_CPU);
    else if (nranks >= 2 && gpus >= nranks && where != PLACE_CUDA_SIMULATOR) pg = pg_create_nccl(nranks);
    else pg = pg_create_simulator(nranks, DEVICE_CUDA);
    if (!pg) return NULL;
    size_t len = strlen(pg->description);
    if (where == PLACE_CPU)
        snprintf(pg->description + len, sizeof pg->description - len, " (--device=cpu)");
    else if (gpus == 0)
        snprintf(pg->description + len, sizeof pg->description - len, " (no GPU visible)");
    else if (gpus < nranks)
        snprintf(pg->description + len, sizeof pg->description - len, " (%d GPU%s visible for %d ranks)",
                 gpus, gpus == 1 ? "" : "s", nranks);
    else if (nranks >= 2 && where == PLACE_CUDA_SIMULATOR)
        snprintf(pg->description + len, sizeof pg->description - len, " (simulator asked for)");
    return pg;
}

void pg_destroy(ProcessGroup *pg) {
    if (!pg) return;
    for (int r = 0; r < pg->nranks; r++) {
        if (pg->compute[r]) stream_synchronize(pg->compute[r]);
        if (pg->comm[r]) stream_synchronize(pg->comm[r]);
    }
    if (pg->trace) trace_collect(pg->trace);
    if (pg->collectives->destroy) pg->collectives->destroy(pg);
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

/* ---- the local kernels ---- */

/* Rank r's part of a reduce-scatter: its shard of every rank's send, summed in
 * rank order on its communication stream. */
static void simulator_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv,
                                   size_t n, float scale) {
    size_t shard = pg_shard_size(n, pg->nranks);
    for (int r = 0; r < pg->nranks; r++) {
        float *parts[FIBERS_MAX_RANKS];
        for (int q = 0; q < pg->nranks; q++) parts[q] = send[q] + (size_t)r * shard;
        stream_sum(pg->comm[r], recv[r], parts, pg->nranks, shard_length(n, shard, r), scale);
    }
}

/* Rank r's part of an all-gather: every rank's shard copied into its recv. */
static void simulator_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n) {
    size_t shard = pg_shard_size(n, pg->nranks);
    for (int r = 0; r < pg->nranks; r++)
        for (int q = 0; q < pg->nranks; q++) {
            float *dst = recv[r] + (size_t)q * shard;
            if (dst != send[q]) stream_copy(pg->comm[r], dst, send[q], shard_length(n, shard, q) * sizeof(float));
        }
}

static const Collectives simulator_collectives = {
    .reduce_scatter = simulator_reduce_scatter, .all_gather = simulator_all_gather,
};

/* ---- the collectives ---- */

void pg_set_link(ProcessGroup *pg, double gbps, double latency_us) {
    pg->link_gbps = gbps;
    pg->link_latency_us = latency_us;
}

double ring_seconds(double gbps, double latency_us, int nranks, int all_reduce, size_t n) {
    if (gbps <= 0 || nranks == 1) return 0.0;
    double N = nranks, bytes = (double)n * sizeof(float);
    double volume = (all_reduce ? 2.0 : 1.0) * (N - 1) / N * bytes;
    return (N - 1) * latency_us * 1e-6 + volume / (gbps * 1e9);
}

double pg_link_seconds(const ProcessGroup *pg, int all_reduce, size_t n) {
    return ring_seconds(pg->link_gbps, pg->link_latency_us, pg->nranks, all_reduce, n);
}

void pg_trace(ProcessGroup *pg, Trace *t, const char *label) {
    pg->trace = t;
    for (int r = 0; r < pg->nranks; r++) {
        char name[FIBERS_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%srank %d", label, label[0] ? " " : "", r);
        int pid = trace_add_process(t, name);
        trace_attach(t, pg->compute[r], pid, 0, "compute");
        trace_attach(t, pg->comm[r], pid, 1, "comm");
    }
}

void pg_trace_next(ProcessGroup *pg, const char *what, int unit) {
    if (!pg->trace) return;
    snprintf(pg->next_label, sizeof pg->next_label, "%s", what);
    pg->next_unit = unit;
}

/* The label pg_trace_next gave the collective starting now, used up. */
static void take_label(ProcessGroup *pg, const char *collective, char *name, size_t len, int *unit) {
    snprintf(name, len, "%s%s%s", collective, pg->next_label[0] ? " " : "", pg->next_label);
    *unit = pg->next_label[0] ? pg->next_unit : -1;
    pg->next_label[0] = 0;
}

/* The collective's start: its producers, then its span and the modeled link's
 * clock start. */
static void begin(ProcessGroup *pg, const char *collective) {
    wait_for_producers(pg);
    if (pg->trace) {
        char name[2 * FIBERS_NAME_MAX];
        int unit;
        take_label(pg, collective, name, sizeof name, &unit);
        for (int r = 0; r < pg->nranks; r++) trace_begin(pg->comm[r], name, unit);
    }
    if (pg->link_gbps > 0)
        for (int r = 0; r < pg->nranks; r++) stream_timer_start(pg->comm[r]);
}

/* The collective's end: the modeled link's time is up (the data moved
 * meanwhile), its span ends, then the compute streams wait for it, or done[r]
 * marks it. */
static void end(ProcessGroup *pg, int all_reduce, size_t n, Event *const *done) {
    double seconds = pg_link_seconds(pg, all_reduce, n);
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

/* A collective with nothing to do is over at once. Its done events still mean
 * what they always do: the producers' work is done too (a caller may read the
 * buffers on the communication stream after them). */
static void skip(ProcessGroup *pg, Event *const *done) {
    pg->next_label[0] = 0;
    if (!done) return;
    wait_for_producers(pg);
    for (int r = 0; r < pg->nranks; r++) event_record(done[r], pg->comm[r]);
}

/* On one rank an in-place collective without scaling changes nothing: skip it,
 * and its stream hand-offs, so DDP on one rank costs what the plain loop does. */
static int nothing_to_do(const ProcessGroup *pg, float *const *send, float *const *recv, float scale) {
    return pg->nranks == 1 && scale == 1.0f && send[0] == recv[0];
}

void pg_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv, size_t n, float scale,
                       Event *const *done) {
    if (nothing_to_do(pg, send, recv, scale)) {
        skip(pg, done);
        return;
    }
    begin(pg, "reduce-scatter");
    pg->collectives->reduce_scatter(pg, send, recv, n, scale);
    end(pg, 0, n, done);
}

void pg_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n, Event *const *done) {
    if (nothing_to_do(pg, send, recv, 1.0f)) {
        skip(pg, done);
        return;
    }
    begin(pg, "all-gather");
    pg->collectives->all_gather(pg, send, recv, n);
    end(pg, 0, n, done);
}

void pg_all_reduce(ProcessGroup *pg, float *const *bufs, size_t n, float scale, Event *const *done) {
    if (nothing_to_do(pg, bufs, bufs, scale)) {
        skip(pg, done);
        return;
    }
    size_t shard = pg_shard_size(n, pg->nranks);
    float *shards[FIBERS_MAX_RANKS];
    for (int r = 0; r < pg->nranks; r++)  /* an empty shard is never touched */
        shards[r] = (size_t)r * shard < n ? bufs[r] + (size_t)r * shard : bufs[r];
    begin(pg, "all-reduce");
    pg->collectives->reduce_scatter(pg, bufs, shards, n, scale);
    wait_for_parts(pg, pg->comm);
    pg->collectives->all_gather(pg, shards, bufs, n);
    end(pg, 1, n, done);
}
