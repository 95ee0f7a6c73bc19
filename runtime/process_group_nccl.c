/* process_group_nccl.c: the NCCL backend of the process group: this process's
 * L ranks on its GPUs 0..L-1, global ranks first_rank .. first_rank + L - 1 of
 * a world of N = P x L.
 *
 * Process 0 makes the unique id and world_broadcast gives it to the others
 * (over MPI; with one process there is nothing to send); each local rank joins
 * with its global rank, ncclCommInitRank for every local rank inside one
 * ncclGroupStart/ncclGroupEnd. Each collective is issued for every local rank
 * inside one group too, on the ranks' communication streams; the event
 * ordering around it is process_group.c's, each rank's streams waiting on its
 * own events only: NCCL orders the ranks itself. NCCL sums, and the mean's
 * scaling runs after it as a one-input stream_sum.
 *
 * NCCL adds the ranks' shards in an order of its own (ring, tree or NVLS, as it
 * picks), not in rank order as the simulator does: across N > 1 GPUs the bits
 * may differ from the simulator's, and from one collective kind to another.
 * At N = 1 they are the simulator's (tests/test_gpu.c checks it).
 */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "device_cuda.h"
#include "host.h"
#include "process_group.h"
#include "world.h"

/* NCCL's side of a group. */
typedef struct {
    ncclComm_t comm[FIBERS_MAX_RANKS];   /* local rank r's, on GPU r */
} NcclState;

static NcclState *state_of(const ProcessGroup *pg) { return (NcclState *)pg->nccl; }

/* As cuda_check (runtime/device_cuda.cu): one line, and the end of every process. */
static void nccl_check(ncclResult_t rc, const char *what, const char *file, int line) {
    if (rc == ncclSuccess) return;
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", what, file, line, ncclGetErrorString(rc));
    world_abort(1);
}

/* NCCL's shards are exactly n / N long: lengths must divide by N. */
static size_t equal_shard(const ProcessGroup *pg, size_t n) {
    if (n % (size_t)pg->world_size != 0) {
        fprintf(stderr, "fatal: an NCCL collective of %zu floats over %d ranks (lengths must divide)\n", n,
                pg->world_size);
        abort();
    }
    return n / (size_t)pg->world_size;
}

static void nccl_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv, size_t n, float scale) {
    NcclState *st = state_of(pg);
    size_t shard = equal_shard(pg, n);
    nccl_check(ncclGroupStart(), "ncclGroupStart", __FILE__, __LINE__);
    for (int r = 0; r < pg->nranks; r++)
        nccl_check(ncclReduceScatter(send[r], recv[r], shard, ncclFloat, ncclSum, st->comm[r],
                                     cuda_stream(pg->comm[r])),
                   "ncclReduceScatter", __FILE__, __LINE__);
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
    if (scale != 1.0f)
        for (int r = 0; r < pg->nranks; r++) stream_sum(pg->comm[r], recv[r], &recv[r], 1, shard, scale);
}

static void nccl_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n) {
    NcclState *st = state_of(pg);
    size_t shard = equal_shard(pg, n);
    nccl_check(ncclGroupStart(), "ncclGroupStart", __FILE__, __LINE__);
    for (int r = 0; r < pg->nranks; r++)
        nccl_check(ncclAllGather(send[r], recv[r], shard, ncclFloat, st->comm[r], cuda_stream(pg->comm[r])),
                   "ncclAllGather", __FILE__, __LINE__);
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
}

static void nccl_destroy(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    if (!st) return;
    for (int r = 0; r < pg->nranks; r++)
        if (st->comm[r]) nccl_check(ncclCommDestroy(st->comm[r]), "ncclCommDestroy", __FILE__, __LINE__);
    free(st);
    pg->nccl = NULL;
}

static const Collectives nccl_collectives = {
    .reduce_scatter = nccl_reduce_scatter, .all_gather = nccl_all_gather, .destroy = nccl_destroy,
};

/* Every local rank joins the world's communicator with its global rank, the
 * unique id made by process 0 and broadcast to the others. */
static void join_communicator(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    ncclUniqueId id;
    if (world()->proc == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", __FILE__, __LINE__);
    world_broadcast(&id, sizeof id, "the NCCL unique id");
    nccl_check(ncclGroupStart(), "ncclGroupStart", __FILE__, __LINE__);
    for (int r = 0; r < pg->nranks; r++) {
        cuda_check(cudaSetDevice(device_ordinal(pg->device[r])), "cudaSetDevice", __FILE__, __LINE__);
        nccl_check(ncclCommInitRank(&st->comm[r], pg->world_size, id, pg_global_rank(pg, r)), "ncclCommInitRank",
                   __FILE__, __LINE__);
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
}

static void describe(ProcessGroup *pg) {
    const World *w = world();
    int version = 0, L = pg->nranks;
    nccl_check(ncclGetVersion(&version), "ncclGetVersion", __FILE__, __LINE__);
    char nccl[32];
    snprintf(nccl, sizeof nccl, "NCCL %d.%d.%d", version / 10000, version / 100 % 100, version % 100);
    if (w->nprocs > 1)
        snprintf(pg->description, sizeof pg->description, "cuda, %d processes x %d rank%s on GPUs 0..%d of each "
                 "through %s (id over %s); process %d holds rank%s %d..%d, %s", w->nprocs, L, L == 1 ? "" : "s",
                 L - 1, nccl, w->engine, w->proc, L == 1 ? "" : "s", pg->first_rank, pg->first_rank + L - 1,
                 device_name(pg->device[0]));
    else
        snprintf(pg->description, sizeof pg->description, "cuda, %d rank%s on %d GPU%s through %s, %s", L,
                 L == 1 ? "" : "s", L, L == 1 ? "" : "s", nccl, device_name(pg->device[0]));
}

ProcessGroup *pg_create_nccl(int world_size) {
    int nranks = pg_local_ranks(world_size), gpus = device_cuda_count();
    if (!nranks || gpus < 0) return NULL;  /* the reason is printed */
    if (nranks > gpus) {
        fprintf(stderr, "error: NCCL over %d rank%s in this process needs as many GPUs (%d visible)\n", nranks,
                nranks == 1 ? "" : "s", gpus);
        return NULL;
    }
    ProcessGroup *pg = host_calloc(1, sizeof *pg);
    pg->collectives = &nccl_collectives;
    pg->nranks = nranks;
    pg->world_size = world_size;
    pg->first_rank = world()->proc * nranks;
    for (int r = 0; r < nranks; r++) {
        Device *dev = device_create_cuda(r);
        if (!dev) {
            pg->nranks = r;
            pg_destroy(pg);
            return NULL;
        }
        pg_add_rank(pg, r, dev);
    }
    pg->nccl = host_calloc(1, sizeof(NcclState));
    join_communicator(pg);
    describe(pg);
    return pg;
}
