/* process_group.c: what every backend of the process group shares: a rank's
 * streams and events, numbers as they are held, the group's end, its shards
 * and its trace.
 *
 * The backends are process_group_simulator.c (ranks simulated on the CPU or
 * one GPU, with process_group_exchange.c between processes) and
 * process_group_nccl.c (a GPU a rank), each built on this file; the event
 * ordering every collective shares is process_group_order.c's; choosing a
 * backend (pg_create) is process_group_placement.c's, above them all.
 */
#include "process_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "profile.h"
#include "world.h"

void pg_add_rank(ProcessGroup *pg, int rank, Device *dev) {
    pg->device[rank] = dev;
    pg->compute[rank] = stream_create(dev);
    pg->comm[rank] = stream_create(dev);
    pg->produced[rank] = event_create(dev);
    pg->part_done[rank] = event_create(dev);
}

void pg_deliver(Stream *s, void *dst, const void *src, DType held, size_t len, DType dtype) {
    if (dtype == DTYPE_FP32 || held == DTYPE_BF16) {
        if (dst != src && len) stream_copy(s, dst, src, len * number_bytes(held));
        return;
    }
    const void *one[1] = { src };  /* a sum of one input rounds it */
    stream_sum_held(s, dst, one, held, 1, len, 1.0f, dtype);
}

void *pg_number(void *buf, DType held, size_t i) { return (unsigned char *)buf + i * number_bytes(held); }

int pg_global_rank(const ProcessGroup *pg, int rank) { return pg->first_rank + rank; }

/* This process's share of a world of world_size ranks; 0 with a message when
 * they do not divide over the processes. */
int pg_local_ranks(int world_size) {
    const World *w = world();
    if (world_size < 1 || world_size % w->nprocs != 0 || world_size > MAX_RANKS) {
        fprintf(stderr, "error: %d ranks over %d process%s, expected a multiple of the processes, at most %d\n",
                world_size, w->nprocs, w->nprocs == 1 ? "" : "es", MAX_RANKS);
        return 0;
    }
    return world_size / w->nprocs;
}

void pg_destroy(ProcessGroup *pg) {
    if (!pg) return;
    for (int r = 0; r < pg->nranks; r++) {
        if (pg->compute[r]) stream_synchronize(pg->compute[r]);
        if (pg->comm[r]) stream_synchronize(pg->comm[r]);
    }
    if (pg->trace) trace_collect(pg->trace);
    for (int r = 0; r < pg->nranks; r++)
        if (pg->compute[r]) profile_detach(pg->compute[r]);
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

size_t pg_shard_size(size_t n, int nshards) { return (n + (size_t)nshards - 1) / (size_t)nshards; }

size_t pg_shard_length(size_t n, int nshards, int s) {
    size_t shard = pg_shard_size(n, nshards), lo = (size_t)s * shard;
    return lo >= n ? 0 : (n - lo < shard ? n - lo : shard);
}

void pg_set_shard_ranks(ProcessGroup *pg, int shard_ranks) {
    if (shard_ranks < 0 || (shard_ranks > 0 && pg->world_size % shard_ranks != 0)) {
        fprintf(stderr, "fatal: %d shard ranks in a world of %d\n", shard_ranks, pg->world_size);
        abort();
    }
    pg->shard_ranks = shard_ranks == pg->world_size ? 0 : shard_ranks;
}

int pg_shards(const ProcessGroup *pg) { return pg->shard_ranks ? pg->shard_ranks : pg->world_size; }
int pg_shard_of(const ProcessGroup *pg, int g) { return g % pg_shards(pg); }
int pg_group_first(const ProcessGroup *pg, int g) { return g - pg_shard_of(pg, g); }

void pg_set_sums(ProcessGroup *pg, SumOrder sums) {
    pg->sums = sums;
    size_t len = strlen(pg->description);
    if (!pg->simulated && sums == SUMS_NCCL)
        snprintf(pg->description + len, sizeof pg->description - len, ", NCCL's own sums (--collectives=nccl)");
}

void pg_trace(ProcessGroup *pg, Trace *t, const char *label) {
    pg->trace = t;
    for (int r = 0; r < pg->nranks; r++) {
        char name[RENDEZVOUS_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%srank %d", label, label[0] ? " " : "", pg_global_rank(pg, r));
        int pid = trace_add_process(t, name);
        trace_attach(t, pg->compute[r], pid, 0, "compute");
        trace_attach(t, pg->comm[r], pid, 1, "comm");
    }
}
