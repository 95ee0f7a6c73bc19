/* process_group_nccl.c: the NCCL backend of the process group: rank r on GPU r.
 *
 * The communicators come from ncclCommInitAll, one per GPU, all made by this
 * one thread. Each collective is issued for every rank inside one
 * ncclGroupStart/ncclGroupEnd, on the ranks' communication streams; the event
 * ordering around it is process_group.c's, each rank's streams waiting on its
 * own events only: NCCL orders the ranks itself. NCCL sums, and the mean's scaling
 * runs after it as a one-input stream_sum.
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

/* As cuda_check (runtime/device_cuda.cu): one line and exit 1. */
static void nccl_check(ncclResult_t rc, const char *what, const char *file, int line) {
    if (rc == ncclSuccess) return;
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", what, file, line, ncclGetErrorString(rc));
    exit(1);
}

/* NCCL's shards are exactly n / N long: lengths must divide by N. */
static size_t equal_shard(const ProcessGroup *pg, size_t n) {
    if (n % (size_t)pg->nranks != 0) {
        fprintf(stderr, "fatal: an NCCL collective of %zu floats over %d ranks (lengths must divide)\n", n,
                pg->nranks);
        abort();
    }
    return n / (size_t)pg->nranks;
}

static void nccl_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv, size_t n, float scale) {
    size_t shard = equal_shard(pg, n);
    nccl_check(ncclGroupStart(), "ncclGroupStart", __FILE__, __LINE__);
    for (int r = 0; r < pg->nranks; r++)
        nccl_check(ncclReduceScatter(send[r], recv[r], shard, ncclFloat, ncclSum, (ncclComm_t)pg->nccl[r],
                                     cuda_stream(pg->comm[r])),
                   "ncclReduceScatter", __FILE__, __LINE__);
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
    if (scale != 1.0f)
        for (int r = 0; r < pg->nranks; r++) stream_sum(pg->comm[r], recv[r], &recv[r], 1, shard, scale);
}

static void nccl_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n) {
    size_t shard = equal_shard(pg, n);
    nccl_check(ncclGroupStart(), "ncclGroupStart", __FILE__, __LINE__);
    for (int r = 0; r < pg->nranks; r++)
        nccl_check(ncclAllGather(send[r], recv[r], shard, ncclFloat, (ncclComm_t)pg->nccl[r],
                                 cuda_stream(pg->comm[r])),
                   "ncclAllGather", __FILE__, __LINE__);
    nccl_check(ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__);
}

static void nccl_destroy(ProcessGroup *pg) {
    for (int r = 0; r < pg->nranks; r++)
        if (pg->nccl[r]) nccl_check(ncclCommDestroy((ncclComm_t)pg->nccl[r]), "ncclCommDestroy", __FILE__, __LINE__);
}

static const Collectives nccl_collectives = {
    .reduce_scatter = nccl_reduce_scatter, .all_gather = nccl_all_gather, .destroy = nccl_destroy,
};

ProcessGroup *pg_create_nccl(int nranks) {
    int gpus = device_cuda_count();
    if (gpus < 0) return NULL;  /* the reason is printed */
    if (nranks < 1 || nranks > FIBERS_MAX_RANKS || nranks > gpus) {
        fprintf(stderr, "error: NCCL over %d ranks needs as many GPUs (%d visible)\n", nranks, gpus);
        return NULL;
    }
    ProcessGroup *pg = host_calloc(1, sizeof *pg);
    pg->collectives = &nccl_collectives;
    pg->nranks = nranks;
    pg->world_size = nranks;
    int ordinals[FIBERS_MAX_RANKS];
    for (int r = 0; r < nranks; r++) {
        ordinals[r] = r;
        Device *dev = device_create_cuda(r);
        if (!dev) {
            pg->nranks = r;
            pg_destroy(pg);
            return NULL;
        }
        pg_add_rank(pg, r, dev);
    }
    ncclComm_t comms[FIBERS_MAX_RANKS];
    nccl_check(ncclCommInitAll(comms, nranks, ordinals), "ncclCommInitAll", __FILE__, __LINE__);
    for (int r = 0; r < nranks; r++) pg->nccl[r] = comms[r];
    int version = 0;
    nccl_check(ncclGetVersion(&version), "ncclGetVersion", __FILE__, __LINE__);
    snprintf(pg->description, sizeof pg->description, "cuda, %d rank%s on %d GPU%s through NCCL %d.%d.%d, %s",
             nranks, nranks == 1 ? "" : "s", nranks, nranks == 1 ? "" : "s", version / 10000,
             version / 100 % 100, version % 100, device_name(pg->device[0]));
    return pg;
}
