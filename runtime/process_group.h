/* process_group.h: N ranks' streams and the collectives between them.
 *
 * Each collective is called once, for all ranks, by the thread that holds the
 * baton (runtime/rank_threads.h), and runs each rank's part on that rank's
 * communication stream. Ordering is by events: a collective waits for the
 * producing work of every rank's compute stream. Then, by default, every
 * rank's compute stream waits for every rank's part before any later work, so
 * no rank reads a buffer a peer is still writing, even with asynchronous CPU
 * streams. To overlap, a caller passes `done` events instead: done[r] is
 * recorded on rank r's communication stream after its part, nothing else
 * waits, and the caller makes each later use wait (pg_wait_parts). done[r]
 * covers rank r's part only; in the simulator every rank's part reads every
 * rank's send buffer, so before a rank writes its send buffer again it must
 * wait for every done[q]. Under NCCL a rank waits for its own done[r] only:
 * NCCL orders the ranks itself, and the N-by-N waits are the simulator's need.
 *
 * Two backends move the data. The simulator puts a process's ranks on the same
 * hardware (the CPU, or one GPU), with a device handle of its own for each
 * rank's memory accounting, and runs the collectives as local kernels that
 * sum in rank order 0..N-1: the same bits every run. NCCL puts rank r on GPU r
 * and issues each collective for every rank inside one ncclGroupStart/
 * ncclGroupEnd: by default a reduce-scatter is an all-to-all of the shards
 * (ncclSend/ncclRecv) and the simulator's ordered sum on each rank's GPU, the
 * simulator's bits; NCCL's own reduce-scatter on request (pg_set_sums).
 *
 * Past one process (runtime/world.h) the group holds this process's L ranks
 * of a world of N = P x L: global ranks first_rank .. first_rank + L - 1, in
 * arrays indexed by the local rank 0..L-1, while shards and sums are the
 * world's. On the CPU, local rank 0's communication stream runs the exchange
 * between the processes (world_exchange: an all-to-all of the shards, the bytes
 * a ring's reduce-scatter puts on the wire), then every local rank sums its
 * shard over the world's ranks in order 0..N-1 in the simulator's kernel: the
 * bits of one process of N simulated ranks, for any split.
 *
 * Shards: a buffer of n floats splits into S shards of ceil(n / S) floats,
 * S = N (full sharding) unless pg_set_shard_ranks says fewer; global rank g
 * owns shard s = g % S, [s * shard, min(n, (s + 1) * shard)), so the last
 * shards may be short or empty when S does not divide n. Shard buffers are
 * always `shard` long; their tail past the valid part is neither read nor
 * written. With S < N (hybrid sharding) the N / S groups of S consecutive
 * ranks each hold every shard: a reduce-scatter still sums all N ranks in
 * order 0..N-1 into each of a shard's replicas (DDP's bits), and an
 * all-gather gathers each rank's own group.
 */
#ifndef ZF_PROCESS_GROUP_H
#define ZF_PROCESS_GROUP_H

#include <stddef.h>

#include "device.h"
#include "link_model.h"
#include "rank_threads.h"
#include "trace.h"

typedef struct ProcessGroup ProcessGroup;

/* How NCCL's ranks sum (--collectives): in the world's rank order 0..N-1, as
 * the simulator does, so any split gives the simulator's bits (the default); or
 * in NCCL's own reduce-scatter, faster, in an order NCCL picks (ring, tree,
 * NVLS), with bits that depend on the topology. The simulator always sums in
 * rank order. */
typedef enum { SUMS_ORDERED, SUMS_NCCL } SumOrder;

/* How a backend moves the data; the event ordering around it is shared
 * (process_group_order.c). `label` names the collective under way ("all-gather
 * unit 3") for the lines that may name it: a timeout's, an error's. send and
 * recv hold numbers as `held` says: floats, or bf16, 2 bytes each (mixed
 * precision's compute copy and gradients), which move as they are. `dtype`
 * is the numbers' precision (pg_reduce_scatter): a reduce-scatter's sum, and
 * what goes on the wire (bf16 for numbers held in bf16); an all-gather's in
 * bf16 of floats delivers each shard rounded to bf16 (pg_deliver), which a
 * backend may send in 16 bits. */
typedef struct {
    void (*reduce_scatter)(ProcessGroup *pg, void *const *send, void *const *recv, DType held, size_t n,
                           float scale, DType dtype, const char *label);
    void (*all_gather)(ProcessGroup *pg, void *const *send, void *const *recv, DType held, size_t n,
                       DType dtype, const char *label);
    void (*destroy)(ProcessGroup *pg);   /* the backend's own state */
} Collectives;

/* A collective's name, one value for every line that names it: what it is
 * for, in words `what` and `index` ("unit" and 3: "unit 3"; "arena" and -1:
 * "arena"; collective_name_text), and the unit its span belongs to in a trace
 * (-1: none). Its trace span and a timeout's line call it "all-gather unit
 * 3"; the ranks' rendezvous for it, "unit 3 gather" (strategies/ranks.h). */
typedef struct {
    const char *what;  /* "unit", "prefetch unit", "bucket", "weights", ... */
    int index;         /* which one (unit 3, bucket 2); -1: `what` alone */
    int unit;
} CollectiveName;

/* "unit 3": the name's what and index, in len bytes of text. */
void collective_name_text(CollectiveName name, char *text, size_t len);

/* What a reduce-scatter does with its recv: writes the reduction there, or
 * adds the reduction into what recv holds (gradient accumulation over
 * micro-steps). */
typedef enum { REDUCE_WRITE, REDUCE_ADD } ReduceInto;

struct ProcessGroup {
    const Collectives *collectives;
    char description[256];              /* where the ranks run, in words */
    int simulated;                      /* 1: the simulator; 0: NCCL */
    void *nccl;                         /* NCCL's state: communicators, staging, watchdog (process_group_nccl.c) */
    SumOrder sums;                      /* how NCCL sums (pg_set_sums) */
    int nranks;                         /* this process's ranks, L */
    int world_size;                     /* every process's, N = P x L: sums are over them */
    int shard_ranks;                    /* S, the shards of a buffer (pg_set_shard_ranks); 0: N */
    int first_rank;                     /* the global rank of local rank 0 */
    Device *device[MAX_RANKS];   /* each rank's device handle */
    Stream *compute[MAX_RANKS];
    Stream *comm[MAX_RANKS];
    Event *produced[MAX_RANKS];  /* compute work a collective waits for */
    Event *part_done[MAX_RANKS]; /* each rank's part of the last phase */
    LinkModel link;                     /* the modeled link (gbps 0: none); see pg_set_link */
    LinkModel link_inter;               /* its tier between nodes (gbps 0: one tier) */
    int node_ranks;                     /* the ranks of a node on a two-tier link */
    Trace *trace;                       /* where the ranks' streams are traced, or NULL; see pg_trace */
    /* The exchange between processes (world_size > nranks): the host's staging
     * buffers of the shards sent and received, each proc x L x L shards; the
     * exchange done (on local rank 0's communication stream), and each rank's
     * last read of the staging (the next exchange waits for them). */
    float *stage_send, *stage_recv;
    size_t stage_floats;
    Event *staged;
    Event *stage_free[MAX_RANKS];
};

/* Where ranks may run: the CPU (the zero value, what the tests ask for), any
 * GPUs there are, else the CPU (bin/train's default), GPUs only, or all ranks
 * simulated on GPU 0 however many GPUs there are (the GPU tests' gates). */
typedef enum { PLACE_CPU, PLACE_AUTO, PLACE_CUDA, PLACE_CUDA_SIMULATOR } Placement;

/* N ranks of the world placed as asked, this process holding N / P of them
 * (world.h; N must divide): N >= 2 and N GPUs or more: NCCL, rank r on GPU r;
 * one rank, or fewer GPUs: the simulator on GPU 0 (one rank needs no NCCL, and
 * gets the simulator's bits); none (or PLACE_CPU): the simulator on the CPU.
 * NULL with a message when a GPU is asked for and none is visible, when CUDA
 * fails (device_cuda_count), or when N is out of range. own_cores: as for
 * pg_create_simulator. (runtime/process_group_placement.c, above the backends.) */
ProcessGroup *pg_create(int nranks, Placement where, int own_cores);
/* N simulated ranks on the CPU, or all on GPU 0 (one process only;
 * runtime/process_group_simulator.c); this process's N / P of them, with the
 * exchanges between processes on the CPU (runtime/process_group_exchange.c).
 * own_cores = 1: on the CPU each rank keeps to a share of the process's cores
 * of its own (device_create_cpu's slot), where the process has the cores to
 * itself (bound, or alone on its node), so the ranks progress alike, as
 * devices do: what a modeled link's timings need. 0 leaves the cores to the
 * OS, which keeps them busier (a plain step at N = 4 on two cores is about 10%
 * faster) but lets one rank race ahead while the others wait for it. */
ProcessGroup *pg_create_simulator(int nranks, DeviceKind kind, int own_cores);
/* N ranks of the world through NCCL (runtime/process_group_nccl.c), this
 * process's N / P of them on its GPUs 0..N/P-1: process 0 makes the unique id,
 * world_broadcast sends it to the others, each local rank joins with its
 * global rank. */
ProcessGroup *pg_create_nccl(int nranks);
/* This process's share of a world of `world_size` ranks: world_size / P; 0
 * with a message when they do not divide over the processes. */
int pg_local_ranks(int world_size);
/* Collects the group's trace, if any, before its streams go (runtime/trace.h). */
void pg_destroy(ProcessGroup *pg);

/* Shared by the backends: each rank's device handle and streams, and its events. */
void pg_add_rank(ProcessGroup *pg, int rank, Device *dev);
/* An all-gather's shard of len numbers landing at dst on stream s: copied;
 * or floats in DTYPE_BF16 rounded to bf16 (stream_sum of the one shard;
 * dst may be src). */
void pg_deliver(Stream *s, void *dst, const void *src, DType held, size_t len, DType dtype);
/* Number i of a buffer holding numbers as `held` says. */
void *pg_number(void *buf, DType held, size_t i);

/* The global rank of local rank r. */
int pg_global_rank(const ProcessGroup *pg, int rank);
size_t pg_shard_size(size_t n, int nshards);
/* The valid length of shard s of n floats in nshards (short or empty at the
 * end when nshards does not divide n). */
size_t pg_shard_length(size_t n, int nshards, int s);
/* Hybrid sharding (--shard-ranks): buffers split into S shards over groups of
 * S consecutive ranks, S dividing N (N, or 0, is full sharding). */
void pg_set_shard_ranks(ProcessGroup *pg, int shard_ranks);
/* S; the shard global rank g holds, g % S; and the first rank of g's group. */
int pg_shards(const ProcessGroup *pg);
int pg_shard_of(const ProcessGroup *pg, int g);
int pg_group_first(const ProcessGroup *pg, int g);

/* A modeled link for simulated ranks (--link): each collective then holds every
 * rank's communication stream, with no processor busy, as long as the link
 * model (runtime/link_model.h) says such a collective takes on it: a ring's
 * time, the bytes 4 a number, or 2 for a reduction in bf16. The data moves as
 * before; only time is added. gbps = 0 turns it off. pg_set_link_inter gives
 * it a second tier (--link-inter), between nodes of node_ranks ranks. */
void pg_set_link(ProcessGroup *pg, LinkModel link);
void pg_set_link_inter(ProcessGroup *pg, LinkModel inter, int node_ranks);
/* How NCCL's ranks sum from now on (SUMS_ORDERED, the zero value, by
 * default); a simulated group always sums in rank order. */
void pg_set_sums(ProcessGroup *pg, SumOrder sums);
/* The group's ranks and modeled link, as the link model takes them; and what
 * a collective of n numbers costs on it (0 seconds without a link). */
LinkShape pg_link_shape(const ProcessGroup *pg);
LinkCost pg_link_cost(const ProcessGroup *pg, LinkCollective what, size_t n, DType dtype);

/* Trace every rank's streams: process "LABEL rank r" (or "rank r" for an empty
 * label; r the global rank), threads "compute" and "comm". Each collective is then one span on
 * every rank's communication stream, from the end of its waits for the
 * producers to the end of the modeled link's hold, named after the collective
 * and its CollectiveName ("reduce-scatter unit 3"). */
void pg_trace(ProcessGroup *pg, Trace *t, const char *label);
/* Make `waiter` (a stream of rank `rank`) wait for the parts of a collective
 * whose done events are `done`: every rank's in the simulator, its own under NCCL. */
void pg_wait_parts(const ProcessGroup *pg, int rank, Stream *waiter, Event *const *done);

/* The collectives' buffers are the local ranks'; the sums and shards run over
 * the world's ranks q = 0..N-1, rank r's shard being its global rank's. Each
 * is named by `name`, for its span and the lines that may name it. A
 * reduction's dtype is the precision it sums and sends in (FSDP's
 * reduce_dtype): DTYPE_FP32; or DTYPE_BF16, stream_sum's bf16 sum, in
 * the same rank order (so any split P x L still gives the same bits), at half
 * the bytes on a link, its result bf16 values in the fp32 buffers; on one rank
 * too, where it only rounds. */
/* bufs[r] = scale * sum over ranks q (in order) of bufs[q], on every rank. */
void pg_all_reduce(ProcessGroup *pg, CollectiveName name, float *const *bufs, size_t n, float scale,
                   DType dtype, Event *const *done);
/* REDUCE_WRITE: recv[r][0, shard) = scale * sum over q of send[q][r's shard].
 * recv[r] may be send[r] + r * shard (in place). REDUCE_ADD: the reduction
 * lands in send[r]'s own shard (in place, overwriting it), then recv[r] =
 * recv[r] + that in fp32, on the communication stream, within the collective
 * (its done events mark the sum). */
void pg_reduce_scatter(ProcessGroup *pg, CollectiveName name, float *const *send, float *const *recv, size_t n,
                       float scale, DType dtype, ReduceInto into, Event *const *done);
/* The reductions of numbers held in bf16, 2 bytes each in memory, on a link
 * and on every wire: mixed precision's gradients reduced in bf16, with the
 * bits of the fp32-held ones in DTYPE_BF16 (REDUCE_ADD's add in bf16,
 * the sum rounded). */
void pg_reduce_scatter_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *send, bf16 *const *recv, size_t n,
                            float scale, ReduceInto into, Event *const *done);
void pg_all_reduce_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *bufs, size_t n, float scale,
                        Event *const *done);
/* recv[r][q's shard] = send[q][0, shard) for every q. send[q] may be
 * recv[q] + q * shard (in place). In dtype DTYPE_BF16 each shard arrives
 * rounded to bf16 (the second half of an all-reduce in bf16), at 2 bytes a
 * number on a link and between processes on the CPU (NCCL's wire stays fp32,
 * the shards rounded where they land: the same bits). */
void pg_all_gather(ProcessGroup *pg, CollectiveName name, float *const *send, float *const *recv, size_t n,
                   DType dtype, Event *const *done);
/* The same gather of numbers held in bf16, 2 bytes each in memory, on a link
 * and on every wire (NCCL's ncclBfloat16): the compute copy of the weights
 * in mixed precision (strategies/strategy.h), moved bit for bit. */
void pg_all_gather_bf16(ProcessGroup *pg, CollectiveName name, bf16 *const *send, bf16 *const *recv, size_t n,
                        Event *const *done);

#endif
