/* cuda_absent.c: the CUDA entry points of the runtime in a build without CUDA
 * (make CUDA=0): there are no GPUs, so there is never a GPU device, an NCCL
 * group or a world joined through NCCL. */
#include <stdio.h>

#include "device.h"
#include "process_group.h"
#include "world.h"

int device_cuda_count(void) { return 0; }

const char *device_cuda_absence(void) { return "this build has no CUDA"; }

void device_cuda_libraries(char *buf, size_t len) { snprintf(buf, len, "none: this build has no CUDA"); }

Device *device_create_cuda(int ordinal) {
    fprintf(stderr, "error: GPU %d: this build has no CUDA support (make CUDA=0)\n", ordinal);
    return NULL;
}

void device_cuda_set_tf32(int on) { (void)on; }

int world_join_file(int nprocs, int proc, const char *path) {
    (void)nprocs;
    (void)path;
    fprintf(stderr, "error: process %d: the --rendezvous joins processes through NCCL: this build has no CUDA "
                    "support (make CUDA=0)\n", proc);
    return -1;
}

ProcessGroup *pg_create_nccl(int nranks) {
    fprintf(stderr, "error: NCCL over %d ranks: this build has no CUDA support (make CUDA=0)\n", nranks);
    return NULL;
}
