/* process_group.c: placing ranks, the collectives' event ordering, the
 * simulator's collectives, and their exchange between processes on the CPU
 * (NCCL's collectives are in process_group_nccl.c).
 *
 * An all-reduce is a reduce-scatter and an all-gather, both in place: every
 * element is summed once, in rank order, by the rank that owns it, then copied
 * to the others. Between the phases every rank waits for every rank's part.
 */
#include "process_group.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_cpu.h"
#include "host.h"
#include "world.h"

void pg_add_rank(ProcessGroup *pg, int rank, Device *dev) {
    pg->device[rank] = dev;
    pg->compute[rank] = stream_create(dev);
    pg->comm[rank] = stream_create(dev);
    pg->produced[rank] = event_create(dev);
    pg->part_done[rank] = event_create(dev);
}

int pg_global_rank(const ProcessGroup *pg, int rank) { return pg->first_rank + rank; }

static const Collectives simulator_collectives;

/* This process's share of a world of world_size ranks; 0 with a message when
 * they do not divide over the processes. */
int pg_local_ranks(int world_size) {
    const World *w = world();
    if (world_size < 1 || world_size % w->nprocs != 0 || world_size > FIBERS_MAX_RANKS) {
        fprintf(stderr, "error: %d ranks over %d process%s, expected a multiple of the processes, at most %d\n",
                world_size, w->nprocs, w->nprocs == 1 ? "" : "es", FIBERS_MAX_RANKS);
        return 0;
    }
    return world_size / w->nprocs;
}

/* How many ranks share the cores this process may use: its own, when the
 * launcher bound it to some of the machine's cores (they are its share);
 * else every process's on the machine, so that 2 processes of 2 ranks on 2
 * cores run one thread a stream, not four. */
static int cpu_sharers(int nranks) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int bound = online > 0 && omp_get_num_procs() < online;
    return nranks * (bound ? 1 : world()->procs_on_node);
}

ProcessGroup *pg_create_simulator(int world_size, DeviceKind kind, int own_cores) {
    int nranks = pg_local_ranks(world_size);
    if (!nranks) return NULL;
    const World *w = world();
    if (kind == DEVICE_CUDA && w->nprocs > 1) {
        fprintf(stderr, "error: ranks simulated on a GPU run in one process; past one, each rank needs a GPU "
                        "of its own (NCCL)\n");
        return NULL;
    }
    ProcessGroup *pg = host_calloc(1, sizeof *pg);
    pg->collectives = &simulator_collectives;
    pg->simulated = 1;
    pg->nranks = nranks;
    pg->world_size = world_size;
    pg->first_rank = w->proc * nranks;
    for (int r = 0; r < nranks; r++) {
        /* the cores are this process's alone when it is bound, or the only one on its node */
        int sharing = cpu_sharers(nranks), slot = own_cores && sharing == nranks ? r : -1;
        Device *dev = kind == DEVICE_CUDA ? device_create_cuda(0) : device_create_cpu(sharing, slot);
        if (!dev) {
            pg_destroy(pg);
            return NULL;
        }
        pg_add_rank(pg, r, dev);
    }
    if (w->nprocs > 1) {
        pg->staged = event_create(pg->device[0]);
        for (int r = 0; r < nranks; r++) pg->stage_free[r] = event_create(pg->device[r]);
        snprintf(pg->description, sizeof pg->description, "cpu, %d processes x %d rank%s through %s; process %d "
                 "holds rank%s %d..%d", w->nprocs, nranks, nranks == 1 ? "" : "s", w->engine, w->proc,
                 nranks == 1 ? "" : "s", pg->first_rank, pg->first_rank + nranks - 1);
    } else if (kind == DEVICE_CUDA && nranks > 1)
        snprintf(pg->description, sizeof pg->description, "cuda simulator, %d ranks on one GPU, %s", nranks,
                 device_name(pg->device[0]));
    else if (kind == DEVICE_CUDA)
        snprintf(pg->description, sizeof pg->description, "cuda, one rank (no NCCL), %s", device_name(pg->device[0]));
    else if (nranks > 1)
        snprintf(pg->description, sizeof pg->description, "cpu simulator, %d ranks on the CPU%s", nranks,
                 own_cores && cpu_sharers(nranks) == nranks && omp_get_num_procs() > 1 ? ", each on cores of its own" : "");
    else
        snprintf(pg->description, sizeof pg->description, "cpu, one rank");
    return pg;
}

/* NCCL where every process has a GPU for each of its ranks: past one process
 * always (ranks on GPUs are NCCL's there), in one from two ranks on (one rank
 * needs no NCCL, and gets the simulator's bits). */
static int nccl_fits(int nranks, int gpus, Placement where) {
    int P = world()->nprocs;
    if (where == PLACE_CUDA_SIMULATOR || nranks % P != 0) return 0;
    return gpus >= nranks / P && (P > 1 || nranks >= 2);
}

ProcessGroup *pg_create(int nranks, Placement where, int own_cores) {
    int gpus = where == PLACE_CPU ? 0 : device_cuda_count();
    if (gpus < 0) return NULL;  /* CUDA failed, and said why: no silent fall-back to the CPU */
    if (gpus == 0 && where != PLACE_AUTO && where != PLACE_CPU) {
        fprintf(stderr, "error: --device=cuda, but no GPU is visible (%s)\n", device_cuda_absence());
        return NULL;
    }
    ProcessGroup *pg;
    if (gpus == 0) pg = pg_create_simulator(nranks, DEVICE_CPU, own_cores);
    else if (nccl_fits(nranks, gpus, where)) pg = pg_create_nccl(nranks);
    else pg = pg_create_simulator(nranks, DEVICE_CUDA, 0);
    if (!pg) return NULL;
    size_t len = strlen(pg->description);
    if (where == PLACE_CPU)
        snprintf(pg->description + len, sizeof pg->description - len, " (--device=cpu)");
    else if (gpus == 0)
        snprintf(pg->description + len, sizeof pg->description - len, " (no GPU visible: %s)", device_cuda_absence());
    else if (pg->simulated && gpus < nranks)
        snprintf(pg->description + len, sizeof pg->description - len, " (%d GPU%s visible for %d ranks)",
                 gpus, gpus == 1 ? "" : "s", nranks);
    else if (nranks >= 2 && where == PLACE_CUDA_SIMULATOR)
        snprintf(pg->description + len, sizeof pg->description - len, " (simulator asked for)");
    return pg;
}

/* The exchange's staging between processes (reserve_stage), local rank 0's. */
static void free_stage(ProcessGroup *pg) {
    device_free(pg->device[0], MEM_WORKING, pg->stage_send, pg->stage_floats * sizeof(float));
    device_free(pg->device[0], MEM_WORKING, pg->stage_recv, pg->stage_floats * sizeof(float));
}

void pg_destroy(ProcessGroup *pg) {
    if (!pg) return;
    for (int r = 0; r < pg->nranks; r++) {
        if (pg->compute[r]) stream_synchronize(pg->compute[r]);
        if (pg->comm[r]) stream_synchronize(pg->comm[r]);
    }
    if (pg->trace) trace_collect(pg->trace);
    if (pg->collectives->destroy) pg->collectives->destroy(pg);
    if (pg->staged) event_destroy(pg->staged);
    for (int r = 0; r < pg->nranks; r++)
        if (pg->stage_free[r]) event_destroy(pg->stage_free[r]);
    free_stage(pg);
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

/* The valid length of (global) rank r's shard. */
static size_t shard_length(size_t n, size_t shard, int r) {
    size_t lo = (size_t)r * shard;
    return lo >= n ? 0 : (n - lo < shard ? n - lo : shard);
}

size_t pg_shard_length(size_t n, int nranks, int rank) { return shard_length(n, pg_shard_size(n, nranks), rank); }

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

/* ---- the exchange between processes ---- */

/* What an exchange task moves: the staging buffers are packed by the task
 * itself, on local rank 0's communication stream, once the producers are done. */
typedef struct {
    ProcessGroup *pg;
    float *send[FIBERS_MAX_RANKS];
    size_t n, shard;
    int gather;            /* 0: a reduce-scatter's shards; 1: an all-gather's */
    char what[2 * FIBERS_NAME_MAX];
} Exchange;

/* Floats process p sends another for a reduce-scatter, from each of its L
 * ranks: the other's L shards; for an all-gather, each rank's own shard. */
static size_t stage_stride(const ProcessGroup *pg, size_t shard, int gather) {
    return gather ? shard : (size_t)pg->nranks * shard;
}

/* Staging room for a collective of n floats: P x L strides each way, local
 * rank 0's working memory (its device is the CPU, whose memory MPI moves).
 * Grown only between collectives (the first step), never under one. */
static void reserve_stage(ProcessGroup *pg, size_t n) {
    int P = pg->world_size / pg->nranks;
    size_t shard = pg_shard_size(n, pg->world_size), need = (size_t)P * pg->nranks * stage_stride(pg, shard, 0);
    if (need <= pg->stage_floats) return;
    for (int r = 0; r < pg->nranks; r++) stream_synchronize(pg->comm[r]);
    free_stage(pg);
    pg->stage_send = device_alloc(pg->device[0], MEM_WORKING, need * sizeof(float));
    pg->stage_recv = device_alloc(pg->device[0], MEM_WORKING, need * sizeof(float));
    pg->stage_floats = need;
}

/* Copy the len floats of src from `from` into a staging stride, clipped to
 * the n that src holds, the rest zero: nothing undefined goes on the wire. */
static void pack(float *dst, const float *src, size_t from, size_t len, size_t n) {
    size_t valid = from >= n ? 0 : (n - from < len ? n - from : len);
    memcpy(dst, src + from, valid * sizeof(float));
    memset(dst + valid, 0, (len - valid) * sizeof(float));
}

static void exchange_task(void *args) {
    Exchange *x = *(Exchange **)args;
    ProcessGroup *pg = x->pg;
    int L = pg->nranks, P = pg->world_size / L, me = pg->first_rank / L;
    size_t stride = stage_stride(pg, x->shard, x->gather), block = (size_t)L * stride;
    WorldChunk to[STREAM_SUM_MAX], from[STREAM_SUM_MAX];  /* P <= N <= STREAM_SUM_MAX */
    for (int p = 0; p < P; p++) {
        float *out = pg->stage_send + (size_t)p * block;
        for (int q = 0; q < L && p != me; q++) {
            /* to process p: its ranks' shards of our rank q's buffer, or our rank q's own shard */
            if (x->gather) pack(out + (size_t)q * stride, x->send[q], 0, stride,
                                shard_length(x->n, x->shard, pg->first_rank + q));
            else pack(out + (size_t)q * stride, x->send[q], (size_t)p * L * x->shard, stride, x->n);
        }
        to[p] = (WorldChunk){ out, block * sizeof(float) };
        from[p] = (WorldChunk){ pg->stage_recv + (size_t)p * block, block * sizeof(float) };
    }
    world_exchange(to, from, x->what);
    free(x);
}

/* Enqueue the exchange of a collective on local rank 0's communication stream
 * (after the last reads of the staging), and make every rank's wait for it. */
static void exchange(ProcessGroup *pg, float *const *send, size_t n, int gather, const char *what) {
    reserve_stage(pg, n);
    Exchange *x = host_calloc(1, sizeof *x);
    *x = (Exchange){ .pg = pg, .n = n, .shard = pg_shard_size(n, pg->world_size), .gather = gather };
    for (int r = 0; r < pg->nranks; r++) x->send[r] = send[r];
    snprintf(x->what, sizeof x->what, "%s", what);
    for (int r = 0; r < pg->nranks; r++) stream_wait_event(pg->comm[0], pg->stage_free[r]);
    stream_launch(pg->comm[0], exchange_task, &x, sizeof x);
    event_record(pg->staged, pg->comm[0]);
    for (int r = 1; r < pg->nranks; r++) stream_wait_event(pg->comm[r], pg->staged);
}

/* After a rank's last read of the staging, for the next exchange. */
static void release_stage(ProcessGroup *pg) {
    for (int r = 0; r < pg->nranks; r++) event_record(pg->stage_free[r], pg->comm[r]);
}

/* Where global rank g's data for a collective lies on this process: in its
 * own buffer when it is local, else in the staging from its process, at
 * `offset` floats into g's stride there. */
static int is_local(const ProcessGroup *pg, int g) { return g >= pg->first_rank && g < pg->first_rank + pg->nranks; }

static float *staged_from(const ProcessGroup *pg, int g, size_t stride, size_t offset) {
    int L = pg->nranks;
    return pg->stage_recv + (size_t)(g / L) * L * stride + (size_t)(g % L) * stride + offset;
}

/* ---- the local kernels ---- */

/* Rank r's part of a reduce-scatter: its shard of every rank's send, summed in
 * rank order on its communication stream (the world's ranks, when another
 * process holds some). */
static void simulator_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv,
                                     size_t n, float scale) {
    size_t shard = pg_shard_size(n, pg->world_size);
    int multiprocess = pg->world_size > pg->nranks;
    if (multiprocess) exchange(pg, send, n, 0, pg->exchange_label);
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r);
        float *parts[STREAM_SUM_MAX];
        for (int q = 0; q < pg->world_size; q++)
            parts[q] = is_local(pg, q) ? send[q - pg->first_rank] + (size_t)g * shard
                                       : staged_from(pg, q, stage_stride(pg, shard, 0), (size_t)r * shard);
        stream_sum(pg->comm[r], recv[r], parts, pg->world_size, shard_length(n, shard, g), scale);
    }
    if (multiprocess) release_stage(pg);
}

/* Rank r's part of an all-gather: every rank's shard copied into its recv. */
static void simulator_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n) {
    size_t shard = pg_shard_size(n, pg->world_size);
    int multiprocess = pg->world_size > pg->nranks;
    if (multiprocess) exchange(pg, send, n, 1, pg->exchange_label);
    for (int r = 0; r < pg->nranks; r++)
        for (int q = 0; q < pg->world_size; q++) {
            float *dst = recv[r] + (size_t)q * shard;
            const float *src = is_local(pg, q) ? send[q - pg->first_rank] : staged_from(pg, q, shard, 0);
            if (dst != src) stream_copy(pg->comm[r], dst, src, shard_length(n, shard, q) * sizeof(float));
        }
    if (multiprocess) release_stage(pg);
}

static const Collectives simulator_collectives = {
    .reduce_scatter = simulator_reduce_scatter, .all_gather = simulator_all_gather,
};

/* ---- the collectives ---- */

void pg_set_link(ProcessGroup *pg, double gbps, double latency_us) {
    pg->link_gbps = gbps;
    pg->link_latency_us = latency_us;
}

void pg_set_sums(ProcessGroup *pg, SumOrder sums) {
    pg->sums = sums;
    size_t len = strlen(pg->description);
    if (!pg->simulated && sums == SUMS_NCCL)
        snprintf(pg->description + len, sizeof pg->description - len, ", NCCL's own sums (--collectives=nccl)");
}

double ring_seconds(double gbps, double latency_us, int nranks, int all_reduce, size_t n) {
    if (gbps <= 0 || nranks == 1) return 0.0;
    double N = nranks, bytes = (double)n * sizeof(float);
    double volume = (all_reduce ? 2.0 : 1.0) * (N - 1) / N * bytes;
    return (N - 1) * latency_us * 1e-6 + volume / (gbps * 1e9);
}

double pg_link_seconds(const ProcessGroup *pg, int all_reduce, size_t n) {
    return ring_seconds(pg->link_gbps, pg->link_latency_us, pg->world_size, all_reduce, n);
}

void pg_trace(ProcessGroup *pg, Trace *t, const char *label) {
    pg->trace = t;
    for (int r = 0; r < pg->nranks; r++) {
        char name[FIBERS_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%srank %d", label, label[0] ? " " : "", pg_global_rank(pg, r));
        int pid = trace_add_process(t, name);
        trace_attach(t, pg->compute[r], pid, 0, "compute");
        trace_attach(t, pg->comm[r], pid, 1, "comm");
    }
}

void pg_trace_next(ProcessGroup *pg, const char *what, int unit) {
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
    int unit;
    take_label(pg, collective, pg->exchange_label, sizeof pg->exchange_label, &unit);
    if (pg->trace)
        for (int r = 0; r < pg->nranks; r++) trace_begin(pg->comm[r], pg->exchange_label, unit);
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
    return pg->world_size == 1 && scale == 1.0f && send[0] == recv[0];
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
    size_t shard = pg_shard_size(n, pg->world_size);
    float *shards[FIBERS_MAX_RANKS];
    for (int r = 0; r < pg->nranks; r++) {  /* an empty shard is never touched */
        size_t at = (size_t)pg_global_rank(pg, r) * shard;
        shards[r] = at < n ? bufs[r] + at : bufs[r];
    }
    begin(pg, "all-reduce");
    pg->collectives->reduce_scatter(pg, bufs, shards, n, scale);
    wait_for_parts(pg, pg->comm);
    pg->collectives->all_gather(pg, shards, bufs, n);
    end(pg, 1, n, done);
}
