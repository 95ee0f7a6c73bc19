/* process_group_nccl.c: the NCCL backend of the process group: this process's
 * L ranks on its GPUs 0..L-1, global ranks first_rank .. first_rank + L - 1 of
 * a world of N = P x L.
 *
 * Process 0 makes the unique id and world_broadcast gives it to the others
 * (over MPI; with one process there is nothing to send); each local rank joins
 * with its global rank, ncclCommInitRank for every local rank inside one
 * ncclGroupStart/ncclGroupEnd. Each collective is issued for every local rank
 * inside one group too, on the ranks' communication streams; the event
 * ordering around it is process_group_order.c's, each rank's streams waiting on its
 * own events only: NCCL orders the ranks itself.
 *
 * Ordered sums (the default): a reduce-scatter is an all-to-all of the shards,
 * ncclSend/ncclRecv in one group (global rank g sends each peer q its shard q
 * and receives shard g of every peer's buffer into a staging buffer on its
 * GPU), then stream_sum, the simulator's kernel, adds the N parts in rank
 * order 0..N-1 and scales: the simulator's bits for any split P x L. These are
 * the bytes a ring's reduce-scatter puts on the wire, in N - 1 messages a rank
 * instead of a ring's pipeline.
 *
 * --collectives=nccl (SUMS_NCCL): NCCL's own ncclReduceScatter, then the scale
 * as a one-input stream_sum. NCCL adds in an order of its own (ring, tree or
 * NVLS, as it picks): across N > 2 GPUs the bits may differ from the
 * simulator's, and from one topology to another. Its lengths must divide by N
 * (the arenas pad every unit to a multiple of N); a collective whose length
 * does not takes the ordered path.
 *
 * A reduction in bf16 (--reduce-dtype) takes the ordered path whatever
 * --collectives says, and stream_sum sums the shards in bf16, the simulator's
 * bits: numbers held in bf16 (mixed precision's gradients) travel as
 * ncclBfloat16, fp32 ones as fp32 (bf16 values from the second half of an
 * all-reduce on).
 *
 * An all-gather moves copies, so its bits never depend on the order:
 * ncclAllGather where the length divides by N, else ncclSend/ncclRecv.
 *
 * The watchdog, as PyTorch's: a thread per group polls every communicator's
 * ncclCommGetAsyncError, and an event recorded on each rank's communication
 * stream after each collective. A collective not done within --timeout
 * (world()->timeout_s) of its enqueue, or an error NCCL reports (a peer that
 * died, a network that failed), aborts the communicators and ends the run: one
 * line naming the collective, exit 1 in every process (world_abort). NCCL's
 * own calls block in them otherwise, and a dead peer would hang the others.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device_cuda.h"
#include "gpu_libraries.h"
#include "host.h"
#include "process_group.h"
#include "world.h"

/* A collective the watchdog waits for: done once every local rank's event is. */
enum { WATCH_SLOTS = 1024 };
typedef struct {
    cudaEvent_t done[MAX_RANKS];
    double enqueued;                     /* host_seconds() */
    char what[2 * RENDEZVOUS_NAME_MAX];      /* "all-gather unit 3" */
} Watched;

/* NCCL's side of a group. */
typedef struct {
    ncclComm_t comm[MAX_RANKS];   /* local rank r's, on GPU r */
    /* Each local rank's staging for the shards its peers send it, N shards, on
     * its GPU (MEM_WORKING); grown only between collectives, never under one. */
    float *stage[MAX_RANKS];
    size_t stage_floats;
    /* The watchdog's queue: the collectives enqueued and not yet seen done,
     * oldest at head; a full queue holds the next collective until one is. */
    Watched watched[WATCH_SLOTS];
    int head, count, stop;
    /* When the collective being enqueued began (0: none): NCCL's first send to a
     * peer waits in ncclGroupEnd for the peer to connect, a wait the watchdog
     * bounds too. */
    double enqueuing_since;
    char enqueuing_what[2 * RENDEZVOUS_NAME_MAX];
    pthread_mutex_t lock;
    pthread_cond_t freed;
    pthread_t watchdog;
    int watchdog_started;
} NcclState;

static NcclState *state_of(const ProcessGroup *pg) { return (NcclState *)pg->nccl; }

/* As cuda_check (runtime/device_cuda.cu): one line, and the end of every process. */
static void nccl_check(ncclResult_t rc, const char *what, const char *file, int line) {
    if (rc == ncclSuccess) return;
    fprintf(stderr, "error: %s failed at %s:%d: %s\n", what, file, line, gpu_nccl()->get_error_string(rc));
    world_abort(1);
}

static void lock(pthread_mutex_t *m) {
    int rc = pthread_mutex_lock(m);
    if (rc) {
        fprintf(stderr, "fatal: pthread_mutex_lock failed (%d)\n", rc);
        abort();
    }
}

static void unlock(pthread_mutex_t *m) {
    int rc = pthread_mutex_unlock(m);
    if (rc) {
        fprintf(stderr, "fatal: pthread_mutex_unlock failed (%d)\n", rc);
        abort();
    }
}

/* Tell the watchdog a collective is being enqueued. */
static void enqueuing(ProcessGroup *pg, const char *label) {
    NcclState *st = state_of(pg);
    lock(&st->lock);
    st->enqueuing_since = host_seconds();
    snprintf(st->enqueuing_what, sizeof st->enqueuing_what, "%s", label);
    unlock(&st->lock);
}

/* Queue the collective just enqueued for the watchdog: an event after it on
 * every local rank's communication stream. */
static void watch(ProcessGroup *pg, const char *label) {
    NcclState *st = state_of(pg);
    lock(&st->lock);
    st->enqueuing_since = 0;
    while (st->count == WATCH_SLOTS) {  /* the watchdog frees a slot, or ends the run */
        int rc = pthread_cond_wait(&st->freed, &st->lock);
        if (rc) {
            fprintf(stderr, "fatal: pthread_cond_wait failed (%d)\n", rc);
            abort();
        }
    }
    Watched *w = &st->watched[(st->head + st->count) % WATCH_SLOTS];
    for (int r = 0; r < pg->nranks; r++)
        cuda_check(cudaEventRecord(w->done[r], cuda_stream(pg->comm[r])), "cudaEventRecord", __FILE__, __LINE__);
    w->enqueued = host_seconds();
    snprintf(w->what, sizeof w->what, "%s", label);
    st->count++;
    unlock(&st->lock);
}

static void group_start(void) { nccl_check(gpu_nccl()->group_start(), "ncclGroupStart", __FILE__, __LINE__); }
static void group_end(void) { nccl_check(gpu_nccl()->group_end(), "ncclGroupEnd", __FILE__, __LINE__); }

/* Whether NCCL's own collectives can take n floats: exactly n / N a rank. */
/* NCCL's own collectives shard over every rank, in lengths that divide by N:
 * full sharding only (a hybrid one takes the exchanges below). */
static int divides(const ProcessGroup *pg, size_t n) {
    return pg_shards(pg) == pg->world_size && n % (size_t)pg->world_size == 0;
}

/* Room for N shards of `shard` floats in every local rank's staging. Growing
 * waits for every collective under way (they read the old staging); the
 * first steps grow it, later ones find it large enough. */
static void reserve_stage(ProcessGroup *pg, size_t shard) {
    NcclState *st = state_of(pg);
    size_t need = (size_t)pg->world_size * shard;
    if (need <= st->stage_floats) return;
    for (int r = 0; r < pg->nranks; r++) {
        stream_synchronize(pg->comm[r]);
        if (st->stage[r]) device_free(pg->device[r], MEM_WORKING, st->stage[r], st->stage_floats * sizeof(float));
        st->stage[r] = device_alloc(pg->device[r], MEM_WORKING, need * sizeof(float));
    }
    st->stage_floats = need;
}

/* Global rank g's send to and receive from peer q, skipped when empty (both
 * sides agree: the lengths are the valid parts of the shards). */
static void send_numbers(const void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, Stream *s) {
    if (count) nccl_check(gpu_nccl()->send(buf, count, type, peer, comm, cuda_stream(s)), "ncclSend", __FILE__, __LINE__);
}

static void recv_numbers(void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, Stream *s) {
    if (count) nccl_check(gpu_nccl()->recv(buf, count, type, peer, comm, cuda_stream(s)), "ncclRecv", __FILE__, __LINE__);
}

/* NCCL's type of numbers held as `held` says. */
static ncclDataType_t nccl_type(DType held) { return held == DTYPE_BF16 ? ncclBfloat16 : ncclFloat; }

/* The all-to-all of the shards (each peer the shard it holds), then each
 * rank's ordered sum of its shard. */
static void ordered_reduce_scatter(ProcessGroup *pg, void *const *send, void *const *recv, DType held, size_t n,
                                   float scale, DType dtype) {
    NcclState *st = state_of(pg);
    int N = pg->world_size, S = pg_shards(pg);
    size_t shard = pg_shard_size(n, S);
    reserve_stage(pg, shard);
    group_start();
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r);
        for (int q = 0; q < N; q++) {
            if (q == g) continue;
            int theirs = pg_shard_of(pg, q), mine = pg_shard_of(pg, g);
            send_numbers(pg_number(send[r], held, (size_t)theirs * shard), pg_shard_length(n, S, theirs),
                         nccl_type(held), q, st->comm[r], pg->comm[r]);
            recv_numbers(pg_number(st->stage[r], held, (size_t)q * shard), pg_shard_length(n, S, mine),
                         nccl_type(held), q, st->comm[r], pg->comm[r]);
        }
    }
    group_end();
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r), mine = pg_shard_of(pg, g);
        size_t len = pg_shard_length(n, S, mine);
        const void *parts[STREAM_SUM_MAX];
        for (int q = 0; q < N; q++)
            parts[q] = q == g ? pg_number(send[r], held, (size_t)mine * shard)
                              : pg_number(st->stage[r], held, (size_t)q * shard);
        stream_sum_held(pg->comm[r], recv[r], parts, held, N, len, scale, dtype);
    }
}

static void nccl_reduce_scatter(ProcessGroup *pg, void *const *send, void *const *recv, DType held, size_t n,
                                float scale, DType dtype, const char *label) {
    enqueuing(pg, label);
    if (pg->sums == SUMS_ORDERED || !divides(pg, n) || dtype == DTYPE_BF16) {
        ordered_reduce_scatter(pg, send, recv, held, n, scale, dtype);
        watch(pg, label);
        return;
    }
    NcclState *st = state_of(pg);
    size_t shard = n / (size_t)pg->world_size;
    group_start();
    for (int r = 0; r < pg->nranks; r++)
        nccl_check(gpu_nccl()->reduce_scatter(send[r], recv[r], shard, ncclFloat, ncclSum, st->comm[r],
                                     cuda_stream(pg->comm[r])),
                   "ncclReduceScatter", __FILE__, __LINE__);
    group_end();
    if (scale != 1.0f)
        for (int r = 0; r < pg->nranks; r++) {
            const void *one[1] = { recv[r] };
            stream_sum_held(pg->comm[r], recv[r], one, DTYPE_FP32, 1, shard, scale, DTYPE_FP32);
        }
    watch(pg, label);
}

/* Each rank's shard to every peer of its group, and every peer's into its
 * recv: numbers of `size` bytes, of NCCL's `type`. */
static void exchange_all_gather(ProcessGroup *pg, void *const *send, void *const *recv, size_t n,
                                ncclDataType_t type, size_t size) {
    NcclState *st = state_of(pg);
    int S = pg_shards(pg);
    size_t shard = pg_shard_size(n, S);
    group_start();
    for (int r = 0; r < pg->nranks; r++) {
        int g = pg_global_rank(pg, r), first = pg_group_first(pg, g);
        for (int s = 0; s < S; s++) {
            int q = first + s;
            if (q == g) continue;
            send_numbers(send[r], pg_shard_length(n, S, pg_shard_of(pg, g)), type, q, st->comm[r], pg->comm[r]);
            recv_numbers((char *)recv[r] + (size_t)s * shard * size, pg_shard_length(n, S, s), type, q, st->comm[r],
                         pg->comm[r]);
        }
    }
    group_end();
    for (int r = 0; r < pg->nranks; r++) {
        int mine = pg_shard_of(pg, pg_global_rank(pg, r));
        char *own = (char *)recv[r] + (size_t)mine * shard * size;
        size_t len = pg_shard_length(n, S, mine);
        if (own != send[r] && len) stream_copy(pg->comm[r], own, send[r], len * size);
    }
}

/* The gather of n numbers of NCCL's `type`, `size` bytes each: NCCL's own
 * where the ranks' shards divide n, else exchange_all_gather. */
static void gather_numbers(ProcessGroup *pg, void *const *send, void *const *recv, size_t n, ncclDataType_t type,
                           size_t size) {
    if (!divides(pg, n)) {
        exchange_all_gather(pg, send, recv, n, type, size);
        return;
    }
    NcclState *st = state_of(pg);
    size_t shard = n / (size_t)pg->world_size;
    group_start();
    for (int r = 0; r < pg->nranks; r++)
        nccl_check(gpu_nccl()->all_gather(send[r], recv[r], shard, type, st->comm[r], cuda_stream(pg->comm[r])),
                   "ncclAllGather", __FILE__, __LINE__);
    group_end();
}

/* Numbers go as they are held (fp32, or bf16 as ncclBfloat16); floats in
 * bf16 are then rounded in each rank's recv in place, every shard as the
 * simulator delivers it. */
static void nccl_all_gather(ProcessGroup *pg, void *const *send, void *const *recv, DType held, size_t n,
                            DType dtype, const char *label) {
    enqueuing(pg, label);
    gather_numbers(pg, send, recv, n, nccl_type(held), number_bytes(held));
    for (int r = 0; r < pg->nranks; r++) pg_deliver(pg->comm[r], recv[r], recv[r], held, n, dtype);
    watch(pg, label);
}

/* ---- the watchdog ---- */

/* The communicators' aborts get a second at most: ncclCommAbort may wait for
 * the very kernel that hangs, and the run must end within moments of its line. */
static const double ABORT_SECONDS = 1.0;

static void abort_communicators(void *arg) {
    ProcessGroup *pg = arg;
    NcclState *st = state_of(pg);
    for (int r = 0; r < pg->nranks; r++) gpu_nccl()->comm_abort(st->comm[r]);
}

/* End every process with the one line, the communicators aborted first
 * (NCCL's kernels and threads stop waiting for the peers): world_end_run. */
static void end_run(ProcessGroup *pg, const char *line) { world_end_run(line, abort_communicators, pg, ABORT_SECONDS); }

/* Whether local rank r's event is past; a CUDA error there ends the run. */
static int event_done(const ProcessGroup *pg, int r, cudaEvent_t ev) {
    cuda_check(cudaSetDevice(device_ordinal(pg->device[r])), "cudaSetDevice", __FILE__, __LINE__);
    cudaError_t rc = cudaEventQuery(ev);
    if (rc == cudaErrorNotReady) return 0;
    cuda_check(rc, "cudaEventQuery", __FILE__, __LINE__);
    return 1;
}

/* An error NCCL reports on a communicator, as the run's last line. */
static void check_async_errors(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    for (int r = 0; r < pg->nranks; r++) {
        ncclResult_t async = ncclSuccess;
        nccl_check(gpu_nccl()->comm_get_async_error(st->comm[r], &async), "ncclCommGetAsyncError", __FILE__, __LINE__);
        if (async == ncclSuccess || async == ncclInProgress) continue;
        char line[512];
        snprintf(line, sizeof line, "error: rank %d (process %d): NCCL failed under '%s': %s (%s)",
                 pg_global_rank(pg, r), world()->proc, st->count ? st->watched[st->head].what : "no collective",
                 gpu_nccl()->get_error_string(async), gpu_nccl()->get_last_error(st->comm[r]));
        end_run(pg, line);
    }
}

/* Drop the collectives that are done; the oldest past the timeout, or one
 * whose enqueue is, ends the run. */
static void check_collectives(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    char line[512];
    if (st->enqueuing_since > 0 && host_seconds() - st->enqueuing_since > world()->timeout_s) {
        snprintf(line, sizeof line, "error: process %d: NCCL's '%s' could not be enqueued within %g s (--timeout): "
                 "a peer never connected", world()->proc, st->enqueuing_what, world()->timeout_s);
        end_run(pg, line);
    }
    while (st->count) {
        Watched *w = &st->watched[st->head];
        int late = -1;
        for (int r = 0; r < pg->nranks && late < 0; r++)
            if (!event_done(pg, r, w->done[r])) late = r;
        if (late < 0) {
            st->head = (st->head + 1) % WATCH_SLOTS;
            st->count--;
            int rc = pthread_cond_broadcast(&st->freed);
            if (rc) {
                fprintf(stderr, "fatal: pthread_cond_broadcast failed (%d)\n", rc);
                abort();
            }
            continue;
        }
        if (host_seconds() - w->enqueued <= world()->timeout_s) return;
        snprintf(line, sizeof line, "error: rank %d (process %d): NCCL's '%s' did not complete within %g s "
                 "(--timeout): a peer never arrived, or its GPU is stuck", pg_global_rank(pg, late), world()->proc,
                 w->what, world()->timeout_s);
        end_run(pg, line);
    }
}

/* Every 10 ms, until the group goes. */
static void *watchdog_main(void *arg) {
    ProcessGroup *pg = arg;
    NcclState *st = state_of(pg);
    for (;;) {
        lock(&st->lock);
        int stop = st->stop;
        if (!stop) {
            check_async_errors(pg);
            check_collectives(pg);
        }
        unlock(&st->lock);
        if (stop) return NULL;
        nanosleep(&(struct timespec){ 0, 10 * 1000 * 1000 }, NULL);
    }
}

static void start_watchdog(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    int rc = pthread_mutex_init(&st->lock, NULL);
    if (!rc) rc = pthread_cond_init(&st->freed, NULL);
    if (rc) {
        fprintf(stderr, "error: the NCCL watchdog's lock: %s\n", strerror(rc));
        world_abort(1);
    }
    for (int i = 0; i < WATCH_SLOTS; i++)
        for (int r = 0; r < pg->nranks; r++) {
            cuda_check(cudaSetDevice(device_ordinal(pg->device[r])), "cudaSetDevice", __FILE__, __LINE__);
            cuda_check(cudaEventCreateWithFlags(&st->watched[i].done[r], cudaEventDisableTiming),
                       "cudaEventCreateWithFlags", __FILE__, __LINE__);
        }
    rc = host_thread_create(&st->watchdog, watchdog_main, pg);
    if (rc) {
        fprintf(stderr, "error: cannot start the NCCL watchdog: %s\n", strerror(rc));
        world_abort(1);
    }
    st->watchdog_started = 1;
}

static void stop_watchdog(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    if (!st->watchdog_started) return;
    lock(&st->lock);
    st->stop = 1;
    unlock(&st->lock);
    int rc = pthread_join(st->watchdog, NULL);
    if (rc) {
        fprintf(stderr, "fatal: pthread_join of the NCCL watchdog failed (%d)\n", rc);
        abort();
    }
    for (int i = 0; i < WATCH_SLOTS; i++)
        for (int r = 0; r < pg->nranks; r++)
            cuda_check(cudaEventDestroy(st->watched[i].done[r]), "cudaEventDestroy", __FILE__, __LINE__);
    if (pthread_cond_destroy(&st->freed) || pthread_mutex_destroy(&st->lock)) {
        fprintf(stderr, "fatal: the NCCL watchdog's lock is still in use\n");
        abort();
    }
}

static void nccl_destroy(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    if (!st) return;
    stop_watchdog(pg);
    for (int r = 0; r < pg->nranks; r++) {
        if (st->stage[r]) device_free(pg->device[r], MEM_WORKING, st->stage[r], st->stage_floats * sizeof(float));
        if (st->comm[r]) nccl_check(gpu_nccl()->comm_destroy(st->comm[r]), "ncclCommDestroy", __FILE__, __LINE__);
    }
    free(st);
    pg->nccl = NULL;
}

static const Collectives nccl_collectives = {
    .reduce_scatter = nccl_reduce_scatter, .all_gather = nccl_all_gather,
    .destroy = nccl_destroy,
};

/* Every local rank joins the world's communicator with its global rank, the
 * unique id made by process 0 and broadcast to the others. */
static void join_communicator(ProcessGroup *pg) {
    NcclState *st = state_of(pg);
    ncclUniqueId id;
    if (world()->proc == 0) nccl_check(gpu_nccl()->get_unique_id(&id), "ncclGetUniqueId", __FILE__, __LINE__);
    world_broadcast(&id, sizeof id, "the NCCL unique id");
    world_deadline_start("NCCL's init of the ranks (ncclCommInitRank)");
    group_start();
    for (int r = 0; r < pg->nranks; r++) {
        cuda_check(cudaSetDevice(device_ordinal(pg->device[r])), "cudaSetDevice", __FILE__, __LINE__);
        nccl_check(gpu_nccl()->comm_init_rank(&st->comm[r], pg->world_size, id, pg_global_rank(pg, r)), "ncclCommInitRank",
                   __FILE__, __LINE__);
    }
    group_end();
    world_deadline_end();
}

static void describe(ProcessGroup *pg) {
    const World *w = world();
    int version = 0, L = pg->nranks;
    nccl_check(gpu_nccl()->get_version(&version), "ncclGetVersion", __FILE__, __LINE__);
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
    start_watchdog(pg);
    describe(pg);
    return pg;
}
