/* world_nccl.c: the world of world.h over NCCL, for runs without MPI: P
 * processes that meet through a file (--rendezvous=file:PATH, as llm.c's
 * filesystem mode), one rank per process on its GPU 0 in a communicator of
 * the processes.
 *
 * Process 0 makes an NCCL unique id and writes it to PATH (a temporary file
 * renamed into place, so no reader sees half of it); the others poll for PATH
 * up to --timeout (world_read_rendezvous). Once every process has joined,
 * process 0 removes the file: a file left there is an earlier run's, which
 * process 0 refuses to reuse (a process that reads one waits in NCCL's init
 * for peers that never come, until the timeout: world_deadline_start).
 *
 * The host's collectives (world_all_gather, world_broadcast: the flags'
 * hashes, losses, checkpoint state) then run as world_backend_exchange's
 * contract does, over NCCL: the host's chunks copied to GPU 0, ncclSend and
 * ncclRecv with every peer in one group, the received bytes copied back, all
 * on a stream of its own, under a deadline of the timeout (world_deadline_start:
 * NCCL does not say which peer is missing, so the line names the operation). The process group's own
 * collectives are NCCL's (process_group_nccl.c); ranks on the CPU across
 * processes need MPI (world_mpi.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_cuda.h"
#include "gpu_libraries.h"
#include "host.h"
#include "world_backend.h"

static ncclComm_t processes;   /* one rank per process, on its GPU 0 */
static cudaStream_t moves;     /* where the host's chunks move */

/* A failed NCCL call in the world's own engine: one line and the end of this
 * process (the others' timeouts end them). */
static void check_nccl(ncclResult_t rc, const char *what) {
    if (rc == ncclSuccess) return;
    fprintf(stderr, "error: process %d: %s failed: %s\n", world()->proc, what, gpu_nccl()->get_error_string(rc));
    world_abort(1);
}

/* Process 0's side of the rendezvous: the id, written whole under PATH. */
static int write_id(const char *path, const ncclUniqueId *id) {
    if (access(path, F_OK) == 0) {
        fprintf(stderr, "error: --rendezvous file %s exists (an earlier run's?): remove it, or name another\n", path);
        return -1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(id, sizeof *id, 1, f) == 1;
    if (f && fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        fprintf(stderr, "error: cannot write the --rendezvous file %s: %s\n", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void nccl_exchange(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what);

int world_join_file(int nprocs, int proc, const char *path) {
    int gpus = device_cuda_count();
    if (gpus < 0) return -1;  /* the reason is printed */
    if (gpus == 0) {
        fprintf(stderr, "error: process %d: the --rendezvous joins processes through NCCL, and no GPU is visible (%s)\n",
                proc, device_cuda_absence());
        return -1;
    }
    World *w = world_state();
    w->nprocs = nprocs;
    w->proc = proc;
    ncclUniqueId id;
    if (proc == 0) {
        check_nccl(gpu_nccl()->get_unique_id(&id), "ncclGetUniqueId");
        if (write_id(path, &id) != 0) return -1;
    } else if (world_read_rendezvous(path, &id, sizeof id, "an NCCL unique id") != 0) {
        return -1;
    }
    cuda_check(cudaSetDevice(0), "cudaSetDevice", __FILE__, __LINE__);
    cuda_check(cudaStreamCreateWithFlags(&moves, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", __FILE__,
               __LINE__);
    world_deadline_start("joining NCCL's communicator of the processes");
    check_nccl(gpu_nccl()->comm_init_rank(&processes, nprocs, id, proc), "ncclCommInitRank");
    world_deadline_end();
    if (proc == 0 && unlink(path) != 0)
        fprintf(stderr, "warning: cannot remove the --rendezvous file %s: %s\n", path, strerror(errno));
    int version = 0;
    check_nccl(gpu_nccl()->get_version(&version), "ncclGetVersion");
    snprintf(w->engine, sizeof w->engine, "NCCL %d.%d.%d, file rendezvous", version / 10000, version / 100 % 100,
             version % 100);
    world_set_engine(nccl_exchange);
    return 0;
}

static void nccl_exchange(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what) {
    const World *w = world();
    if (channel != WORLD_HOST) {
        fprintf(stderr, "error: '%s': ranks on the CPU across processes need mpirun; the --rendezvous carries "
                        "NCCL's runs only\n", what);
        world_abort(1);
    }
    /* one device buffer: per peer, what goes to it, then what comes from it */
    size_t *at = host_calloc((size_t)w->nprocs + 1, sizeof *at);
    for (int p = 0; p < w->nprocs; p++) at[p + 1] = at[p] + (p == w->proc ? 0 : to[p].bytes + from[p].bytes);
    char *buf = NULL;
    world_deadline_start(what);  /* NCCL's first send to a peer waits for it to connect, in ncclGroupEnd */
    cuda_check(cudaSetDevice(0), "cudaSetDevice", __FILE__, __LINE__);
    cuda_check(cudaMalloc((void **)&buf, at[w->nprocs] + 1), "cudaMalloc", __FILE__, __LINE__);
    for (int p = 0; p < w->nprocs; p++)
        if (p != w->proc && to[p].bytes)
            cuda_check(cudaMemcpyAsync(buf + at[p], to[p].data, to[p].bytes, cudaMemcpyHostToDevice, moves),
                       "cudaMemcpyAsync", __FILE__, __LINE__);
    check_nccl(gpu_nccl()->group_start(), "ncclGroupStart");
    for (int p = 0; p < w->nprocs; p++) {
        if (p == w->proc) continue;
        if (to[p].bytes) check_nccl(gpu_nccl()->send(buf + at[p], to[p].bytes, ncclUint8, p, processes, moves), "ncclSend");
        if (from[p].bytes)
            check_nccl(gpu_nccl()->recv(buf + at[p] + to[p].bytes, from[p].bytes, ncclUint8, p, processes, moves), "ncclRecv");
    }
    check_nccl(gpu_nccl()->group_end(), "ncclGroupEnd");
    for (int p = 0; p < w->nprocs; p++)
        if (p != w->proc && from[p].bytes)
            cuda_check(cudaMemcpyAsync(from[p].data, buf + at[p] + to[p].bytes, from[p].bytes, cudaMemcpyDeviceToHost,
                                       moves),
                       "cudaMemcpyAsync", __FILE__, __LINE__);
    cuda_check(cudaStreamSynchronize(moves), "cudaStreamSynchronize", __FILE__, __LINE__);
    world_deadline_end();
    cuda_check(cudaFree(buf), "cudaFree", __FILE__, __LINE__);
    free(at);
}
