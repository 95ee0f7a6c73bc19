/* process_group_exchange.h: the exchange between processes under the
 * simulator's collectives on the CPU (process_group_simulator.c), where the
 * world's N = P x L ranks are P processes of L.
 *
 * A collective's exchange runs on local rank 0's communication stream, after
 * the producers: it packs this process's shards for each other process into
 * host staging, moves them with world_exchange (an all-to-all: the bytes a
 * ring's reduce-scatter puts on the wire), and every local rank's stream waits
 * for it; each rank then reads what the others sent from the staging. For a
 * reduce-scatter, process p gets from each of our L ranks its own L shards;
 * for an all-gather, each of our ranks' own shard. In bf16 (a reduction in
 * bf16, and the all-gather of its result) each number travels in 16 bits,
 * rounded at the sender as the receiver's sum would round it, and is widened
 * into the staging: the same bits at half the bytes. Numbers held in bf16
 * travel and land in the staging as they are.
 */
#ifndef ZF_PROCESS_GROUP_EXCHANGE_H
#define ZF_PROCESS_GROUP_EXCHANGE_H

#include "process_group.h"

/* The staging's events, past one process; their end, and the staging's. */
void exchange_create(ProcessGroup *pg);
void exchange_destroy(ProcessGroup *pg);

/* Enqueue the exchange of a collective of n numbers of `send`, held as `held`
 * says (gather 0: a reduce-scatter's shards; 1: an all-gather's) in that
 * precision (numbers held in bf16 go as they are), named `label` in a
 * timeout's line, and make every local rank's communication stream wait for
 * it. */
void exchange_start(ProcessGroup *pg, void *const *send, DType held, size_t n, int gather, DType dtype,
                    const char *label);
/* After every local rank's last read of the staging, for the next exchange. */
void exchange_end(ProcessGroup *pg);

/* Whether global rank g is this process's (its data in its own buffer). */
int exchange_is_local(const ProcessGroup *pg, int g);
/* The floats each rank's stride in the staging holds: a reduce-scatter's L
 * shards, an all-gather's one. */
size_t exchange_stride(const ProcessGroup *pg, size_t shard, int gather);
/* What global rank g (of another process) sent, `offset` numbers (held as
 * the exchange held them) into its stride of the staging received. */
void *exchange_received(const ProcessGroup *pg, DType held, int g, size_t stride, size_t offset);

#endif
