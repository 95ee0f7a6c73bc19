/* process_group_simulator.c: the simulator backend of the process group: this
 * process's ranks on one device (the CPU, or GPU 0), each with a device handle
 * of its own, and the collectives as local kernels that sum in the world's
 * rank order 0..N-1; past one process, with the exchange of
 * process_group_exchange.c. And the modeled link (pg_set_link).
 *
 * An all-reduce is a reduce-scatter and an all-gather, both in place: every
 * element is summed once, in rank order, by the rank that owns it, then copied
 * to the others (process_group_order.c).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "host.h"
#include "process_group.h"
#include "process_group_exchange.h"
#include "world.h"

/* The first local rank that holds rank r's shard: r itself under full
 * sharding; under hybrid sharding, the replica that sums it for the others. */
static int shard_lead(const ProcessGroup *pg, int r) {
    int s = pg_shard_of(pg, pg_global_rank(pg, r)), lead = 0;
    while (pg_shard_of(pg, pg_global_rank(pg, lead)) != s) lead++;
    return lead;
}

/* Rank r's part of a reduce-scatter: its shard of every rank's send, summed in
 * rank order on its communication stream (the world's ranks, when another
 * process holds some). A shard's replicas (hybrid sharding) read what each
 * other's in-place result overwrites, so the lead replica sums and the others
 * copy its result once it is made: the same bits. */
static void simulator_reduce_scatter(ProcessGroup *pg, void *const *send, void *const *recv, DType held,
                                     size_t n, float scale, DType dtype, const char *label) {
    size_t shard = pg_shard_size(n, pg_shards(pg)), stride = exchange_stride(pg, shard, 0);
    int multiprocess = pg->world_size > pg->nranks;
    if (multiprocess) exchange_start(pg, send, held, n, 0, dtype, label);
    for (int r = 0; r < pg->nranks; r++) {
        if (shard_lead(pg, r) != r) continue;
        int s = pg_shard_of(pg, pg_global_rank(pg, r));
        const void *parts[STREAM_SUM_MAX];
        for (int q = 0; q < pg->world_size; q++)
            parts[q] = exchange_is_local(pg, q) ? pg_number(send[q - pg->first_rank], held, (size_t)s * shard)
                     : exchange_received(pg, held, q, stride, (size_t)r * shard);
        stream_sum_held(pg->comm[r], recv[r], parts, held, pg->world_size, pg_shard_length(n, pg_shards(pg), s), scale,
                        dtype);
        event_record(pg->part_done[r], pg->comm[r]);
    }
    for (int r = 0; r < pg->nranks; r++) {
        int lead = shard_lead(pg, r);
        if (lead == r) continue;
        stream_wait_event(pg->comm[r], pg->part_done[lead]);
        size_t len = pg_shard_length(n, pg_shards(pg), pg_shard_of(pg, pg_global_rank(pg, r)));
        stream_copy(pg->comm[r], recv[r], recv[lead], len * number_bytes(held));
    }
    if (multiprocess) exchange_end(pg);
}

/* Whether an all-gather needs the exchange: a group of S ranks spans processes. */
static int gather_exchanged(const ProcessGroup *pg) {
    return pg->world_size > pg->nranks && pg->nranks % pg_shards(pg) != 0;
}

/* Rank r's part of an all-gather: the shard of every rank of its group
 * delivered into its recv (pg_deliver: copied, or rounded to bf16). Past one
 * process only where a group spans them. */
static void simulator_all_gather(ProcessGroup *pg, void *const *send, void *const *recv, DType held, size_t n,
                                 DType dtype, const char *label) {
    int S = pg_shards(pg);
    size_t shard = pg_shard_size(n, S);
    int exchanged = gather_exchanged(pg);
    if (exchanged) exchange_start(pg, send, held, n, 1, dtype, label);
    for (int r = 0; r < pg->nranks; r++)
        for (int s = 0; s < S; s++) {
            int q = pg_group_first(pg, pg_global_rank(pg, r)) + s;
            void *dst = pg_number(recv[r], held, (size_t)s * shard);
            const void *src = exchange_is_local(pg, q) ? send[q - pg->first_rank]
                                                       : exchange_received(pg, held, q, shard, 0);
            pg_deliver(pg->comm[r], dst, src, held, pg_shard_length(n, S, s), dtype);
        }
    if (exchanged) exchange_end(pg);
}

static const Collectives simulator_collectives = {
    .reduce_scatter = simulator_reduce_scatter, .all_gather = simulator_all_gather, .destroy = exchange_destroy,
};

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
        exchange_create(pg);
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

/* ---- the modeled link ---- */

void pg_set_link(ProcessGroup *pg, LinkModel link) {
    pg->link = link;
}

void pg_set_link_inter(ProcessGroup *pg, LinkModel inter, int node_ranks) {
    pg->link_inter = inter;
    pg->node_ranks = node_ranks;
}

LinkShape pg_link_shape(const ProcessGroup *pg) {
    return (LinkShape){ pg->link, pg->link_inter, pg->world_size, pg_shards(pg), pg->node_ranks };
}

LinkCost pg_link_cost(const ProcessGroup *pg, LinkCollective what, size_t n, DType dtype) {
    LinkShape shape = pg_link_shape(pg);
    return link_cost(&shape, what, n, dtype);
}
