/* world_backend.h: what an engine of world.h implements (for world*.c only). */
#ifndef ZF_WORLD_BACKEND_H
#define ZF_WORLD_BACKEND_H

#include "world.h"

/* The exchanges of the host's collectives and those of the streams run on
 * channels of their own (MPI communicators), so they never match each other. */
typedef enum { WORLD_HOST, WORLD_STREAMS } WorldChannel;

World *world_state(void);
/* Whether a launcher (mpirun, srun) started this process: its environment says so. */
int world_launched(void);
/* world_exchange's contract, on a channel; a peer silent past the timeout ends
 * the run through world_timed_out. */
void world_backend_exchange(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what);
/* An engine joined after world_init in place of the launcher's (the file
 * rendezvous over NCCL, world_nccl.c): the host's exchanges go to it from then on. */
typedef void (*WorldExchange)(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what);
void world_set_engine(WorldExchange exchange);
/* One line naming the operation and the processes flagged in missing[P], then
 * world_abort(1). */
void world_timed_out(const char *what, const int *missing) __attribute__((noreturn));
/* The run is ending (world_abort: world_end_run, a timeout, an error): marked
 * first, so that world_finalize on another thread waits for the end rather
 * than return (world_wait_if_ending). Whether it was marked already. */
int world_mark_ending(void);
/* Where the run is ending, wait for the thread that ends it, never returning;
 * else return at once. */
void world_wait_if_ending(void);

#endif
