/* process_group.h: N ranks' streams and the collectives between them.
 *
 * Each collective is called once, for all ranks, by the thread that holds the
 * baton (runtime/fibers.h), and runs each rank's part on that rank's
 * communication stream. Ordering is by events: a collective waits for the
 * producing work of every rank's compute stream, and every rank's compute
 * stream waits for every rank's part before any later use, so no rank reads a
 * buffer a peer is still writing, even with asynchronous CPU streams.
 *
 * The simulator backend puts every rank on the same hardware (the CPU), with a
 * device handle of its own for its memory accounting, and runs the collectives
 * as local kernels that sum in rank order 0..N-1: the same bits every run.
 *
 * Shards: a buffer of n floats splits into N shards of ceil(n / N) floats; rank
 * r owns [r * shard, min(n, (r + 1) * shard)), so the last shards may be short
 * or empty when N does not divide n. Shard buffers are always `shard` long;
 * their tail past the valid part is neither read nor written.
 */
#ifndef ZF_PROCESS_GROUP_H
#define ZF_PROCESS_GROUP_H

#include <stddef.h>

#include "device.h"
#include "fibers.h"

typedef struct {
    int nranks;
    Device *device[FIBERS_MAX_RANKS];   /* each rank's device handle */
    Stream *compute[FIBERS_MAX_RANKS];
    Stream *comm[FIBERS_MAX_RANKS];
    Event *produced[FIBERS_MAX_RANKS];  /* compute work a collective waits for */
    Event *part_done[FIBERS_MAX_RANKS]; /* each rank's part of the last phase */
} ProcessGroup;

/* N ranks on the CPU, each with a device handle, a compute and a communication stream. */
ProcessGroup *pg_create_simulator(int nranks);
void pg_destroy(ProcessGroup *pg);

size_t pg_shard_size(size_t n, int nranks);

/* bufs[r] = scale * sum over ranks q (in order) of bufs[q], on every rank. */
void pg_all_reduce(ProcessGroup *pg, float *const *bufs, size_t n, float scale);
/* recv[r][0, shard) = scale * sum over q of send[q][r's shard]. recv[r] may be
 * send[r] + r * shard (in place). */
void pg_reduce_scatter(ProcessGroup *pg, float *const *send, float *const *recv, size_t n, float scale);
/* recv[r][q's shard] = send[q][0, shard) for every q. send[q] may be
 * recv[q] + q * shard (in place). */
void pg_all_gather(ProcessGroup *pg, float *const *send, float *const *recv, size_t n);

#endif
