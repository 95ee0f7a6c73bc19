/* world_mpi.c: the world of world.h over MPI (Open MPI from Debian).
 *
 * A launcher (mpirun, srun) says so in the environment; then MPI_Init_thread
 * asks for MPI_THREAD_MULTIPLE, since the main thread and a communication
 * stream's worker call MPI at the same time, each on a communicator of its own
 * (duplicates of MPI_COMM_WORLD, one per channel). Every exchange is
 * nonblocking sends and receives, one per peer, polled until the timeout: a
 * peer that never sends is named. A process that dies is the launcher's to
 * notice: mpirun ends the others at once.
 */
#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host.h"
#include "world_backend.h"

static MPI_Comm channels[2];
static int joined, finalized;

/* As cuda_check: a failed MPI call is one line and the end of every process. */
static void mpi_check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", rc);
    fprintf(stderr, "error: process %d: %s failed: %s\n", world()->proc, what, text);
    world_abort(1);
}

/* An exit that skipped world_finalize (an error deep in a step) takes the
 * others with it, rather than leaving them waiting for the timeout. */
static void abort_unless_finalized(void) {
    if (joined && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
}

int world_init(int *argc, char ***argv) {
    if (!world_launched()) return 0;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "error: MPI_Init_thread failed\n");
        return -1;
    }
    joined = 1;
    atexit(abort_unless_finalized);
    World *w = world_state();
    mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &w->nprocs), "MPI_Comm_size");
    mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &w->proc), "MPI_Comm_rank");
    if (provided < MPI_THREAD_MULTIPLE) {
        if (w->proc == 0)
            fprintf(stderr, "error: this MPI gives thread level %d; zerofiber needs MPI_THREAD_MULTIPLE (%d)\n",
                    provided, MPI_THREAD_MULTIPLE);
        world_abort(1);
    }
    for (int c = 0; c < 2; c++) mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &channels[c]), "MPI_Comm_dup");
    MPI_Comm node;
    mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w->proc, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    mpi_check(MPI_Comm_size(node, &w->procs_on_node), "MPI_Comm_size");
    mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    mpi_check(MPI_Get_library_version(version, &len), "MPI_Get_library_version");
    version[strcspn(version, ",\n")] = 0;  /* "Open MPI v4.1.4, package: ..." */
    snprintf(w->engine, sizeof w->engine, "%.63s", version);
    return 0;
}

void world_finalize(void) {
    world_wait_if_ending();
    if (!joined || finalized) return;
    for (int c = 0; c < 2; c++) MPI_Comm_free(&channels[c]);
    finalized = 1;
    mpi_check(MPI_Finalize(), "MPI_Finalize");
}

void world_abort(int status) {
    world_mark_ending();
    fflush(NULL);
    if (joined && !finalized) MPI_Abort(MPI_COMM_WORLD, status);
    _exit(status);
}

/* A message is at most INT_MAX bytes: larger ones go as pieces, in order. */
enum { PIECE_BYTES = 1 << 30 };

static int pieces_of(size_t bytes) { return (int)((bytes + PIECE_BYTES - 1) / PIECE_BYTES); }

void world_backend_exchange(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what) {
    const World *w = world();
    int P = w->nprocs, n = 0;
    for (int p = 0; p < P; p++)
        if (p != w->proc) n += pieces_of(to[p].bytes) + pieces_of(from[p].bytes);
    MPI_Request *req = host_calloc((size_t)n + 1, sizeof *req);
    int *peer_of = host_calloc((size_t)n + 1, sizeof *peer_of), *missing = host_calloc((size_t)P, sizeof *missing);
    int k = 0;
    for (int p = 0; p < P; p++) {
        if (p == w->proc) continue;
        for (size_t at = 0; at < from[p].bytes; at += PIECE_BYTES, k++) {
            size_t len = from[p].bytes - at < PIECE_BYTES ? from[p].bytes - at : PIECE_BYTES;
            mpi_check(MPI_Irecv((char *)from[p].data + at, (int)len, MPI_BYTE, p, 0, channels[channel], &req[k]),
                      "MPI_Irecv");
            peer_of[k] = p;
        }
        for (size_t at = 0; at < to[p].bytes; at += PIECE_BYTES, k++) {
            size_t len = to[p].bytes - at < PIECE_BYTES ? to[p].bytes - at : PIECE_BYTES;
            mpi_check(MPI_Isend((char *)to[p].data + at, (int)len, MPI_BYTE, p, 0, channels[channel], &req[k]),
                      "MPI_Isend");
            peer_of[k] = p;
        }
    }
    /* Poll: a few yields for the quick case, then short naps, so a waiting
     * stream leaves the cores to the compute. */
    double deadline = host_seconds() + w->timeout_s;
    for (int polls = 0;; polls++) {
        int done = 0;
        mpi_check(MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
        if (done) break;
        if (host_seconds() > deadline) {
            for (int i = 0; i < n; i++) {
                int finished = 0;
                mpi_check(MPI_Test(&req[i], &finished, MPI_STATUS_IGNORE), "MPI_Test");
                if (!finished) missing[peer_of[i]] = 1;
            }
            world_timed_out(what, missing);
        }
        if (polls < 100) sched_yield();
        else nanosleep(&(struct timespec){ 0, 50000 }, NULL);
    }
    free(req);
    free(peer_of);
    free(missing);
}
