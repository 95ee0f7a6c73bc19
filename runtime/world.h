/* world.h: the processes of a run, and what moves between them.
 *
 * A run is P processes of L rank threads each: world size W = P x L, process
 * p holding global ranks p*L .. p*L+L-1. Within a process the ranks meet as
 * they always have (runtime/rank_threads.h, runtime/process_group.h); between
 * processes an existing engine moves the bytes: MPI (world_mpi.c, Open MPI
 * from Debian) when the run was started by mpirun or srun; NCCL when the
 * processes meet through a file (world_join_file, world_nccl.c: GPUs without
 * MPI); else nothing (one process; world_none.c in a build without MPI).
 * Never a transport of our own.
 *
 * Everything here is blocking for its caller and bounded by the timeout
 * (--timeout): a peer that never arrives ends the run in every process, with
 * one line naming the operation and the processes that did not come. The
 * collectives of this header are the host's (flags' hashes, losses, the
 * checkpoint's state); the process group's device-side data moves through
 * world_exchange, run on a communication stream's worker thread. MPI is
 * initialised for threads (MPI_THREAD_MULTIPLE): the main thread and the
 * streams' workers call it at once, on communicators of their own.
 */
#ifndef ZF_WORLD_H
#define ZF_WORLD_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int nprocs;          /* P; 1 without a launcher */
    int proc;            /* this process's index, 0 .. P-1 */
    int procs_on_node;   /* the processes sharing this machine (and its cores) */
    int local_ranks;     /* L, for the lines that name ranks (world_set_local_ranks) */
    double timeout_s;    /* how long an operation waits for its peers (--timeout) */
    char engine[64];     /* "Open MPI 4.1.4", or "none" */
} World;

/* This process's world: one process until world_init has joined a launcher's. */
const World *world(void);
/* Join the launcher's world when one started this process (mpirun, srun: their
 * environment says so), else stay one process. 0, or -1 with a message. */
int world_init(int *argc, char ***argv);
void world_set_timeout(double seconds);
void world_set_local_ranks(int local_ranks);
/* "ranks 2..3 (process 1)", or "rank 1 (process 1)". */
void world_name_process(int proc, char *buf, size_t len);
/* Join a world of `nprocs` processes, this one `proc`, through a file (NCCL's
 * unique id written by process 0, read by the others within the timeout;
 * world_nccl.c): for runs on GPUs without MPI (--nodes, --node-rank,
 * --rendezvous=file:PATH). 0, or -1 with a message. */
int world_join_file(int nprocs, int proc, const char *path);
/* Bound a blocking call that has no timeout of its own (NCCL's init, which
 * waits for every peer) by the timeout: past it, one line naming `what` and
 * the end of every process (world_abort). One at a time; world_deadline_end
 * once the call is back. */
void world_deadline_start(const char *what);
void world_deadline_end(void);
/* Process 1 .. P-1's side of a file rendezvous: PATH as soon as it is there,
 * exactly `bytes` of it (`what` names them for the line) into buf, up to the
 * timeout. 0, or -1 after one line naming the file, or what it held. */
int world_read_rendezvous(const char *path, void *buf, size_t bytes, const char *what);
/* Leave the world after a run every process ended the same way (MPI_Finalize).
 * Where the run is ending already (world_abort or world_end_run under way on
 * another thread), it never returns: that end's status is the process's. */
void world_finalize(void);
/* End every process of the run now, this one with `status` (MPI_Abort): for an
 * error the others cannot know of. A one-process world just leaves. Every
 * output is flushed first, and the process leaves with _exit, never exit():
 * from any thread, with CUDA, NCCL or MPI calls in flight on others, whose
 * libraries' teardown would hang or crash under them. */
void world_abort(int status) __attribute__((noreturn));
/* End the run from a thread that watches the others (the NCCL watchdog): its
 * `line` and "; stopping every process", flushed; then cleanup(arg) on a
 * thread of its own, given at most `seconds` (ncclCommAbort may wait for the
 * very kernel that hangs); then world_abort(1), whatever the cleanup did. From
 * the line on the run is ending, so a main thread that meanwhile finishes its
 * work waits in world_finalize for that end: a run whose watchdog fired never
 * leaves with status 0. Where the run is ending already, it says nothing and
 * waits for that end. */
void world_end_run(const char *line, void (*cleanup)(void *), void *arg, double seconds) __attribute__((noreturn));

/* all[p * bytes ..] = process p's `mine`, on every process; `what` names the
 * operation for a timeout's line. */
void world_all_gather(const void *mine, void *all, size_t bytes, const char *what);
/* buf on every process = buf on process 0. */
void world_broadcast(void *buf, size_t bytes, const char *what);
/* A piece of host memory, to send or to fill. */
typedef struct {
    void *data;
    size_t bytes;
} WorldChunk;
/* Process p's `mine` (its `bytes`) into at_root[p] on process 0, which alone
 * reads at_root (P chunks, each as large as that process's piece; zero bytes
 * allowed); and the reverse, at_root[p] on process 0 into process p's mine.
 * For a state too large for one host (a checkpoint's tensors): only process
 * 0 ever holds more than its own piece. */
void world_gather(const void *mine, size_t bytes, const WorldChunk *at_root, const char *what);
void world_scatter(const WorldChunk *at_root, void *mine, size_t bytes, const char *what);
/* The value of the first process (in process order) that passes a non-zero
 * one, and that process in *proc (when not NULL); 0 when none does. */
int world_first_nonzero(int value, int *proc, const char *what);

/* One exchange of the process group: to[p] goes to process p and from[p]
 * arrives from it, for every p but this process (their own entries unused;
 * zero bytes are allowed). Called by one thread of a process at a time, every
 * process making the same exchanges in the same order. */
void world_exchange(const WorldChunk *to, WorldChunk *from, const char *what);

#ifdef __cplusplus
}
#endif

#endif
