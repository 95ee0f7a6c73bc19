/* process_group_placement.c: placing ranks: which devices they run on and
 * through which backend (pg_create). It sits above the backends
 * (process_group_simulator.c, process_group_nccl.c), which are built on
 * process_group.c and never call back up here.
 */
#include <stdio.h>
#include <string.h>

#include "process_group.h"
#include "world.h"

/* NCCL where every process has a GPU for each of its ranks: past one process
 * always (ranks on GPUs are NCCL's there), in one from two ranks on (one rank
 * needs no NCCL, and gets the simulator's bits). */
static int nccl_fits(int nranks, int gpus, Placement where) {
    int P = world()->nprocs;
    if (where == PLACE_CUDA_SIMULATOR || nranks % P != 0) return 0;
    return gpus >= nranks / P && (P > 1 || nranks >= 2);
}

ProcessGroup *pg_create(int nranks, Placement where, int own_cores) {
    int gpus = where == PLACE_CPU ? 0 : device_cuda_count();
    if (gpus < 0) return NULL;  /* CUDA failed, and said why: no silent fall-back to the CPU */
    if (gpus == 0 && where != PLACE_AUTO && where != PLACE_CPU) {
        fprintf(stderr, "error: --device=cuda, but no GPU is visible (%s)\n", device_cuda_absence());
        return NULL;
    }
    ProcessGroup *pg;
    if (gpus == 0) pg = pg_create_simulator(nranks, DEVICE_CPU, own_cores);
    else if (nccl_fits(nranks, gpus, where)) pg = pg_create_nccl(nranks);
    else pg = pg_create_simulator(nranks, DEVICE_CUDA, 0);
    if (!pg) return NULL;
    size_t len = strlen(pg->description);
    if (where == PLACE_CPU)
        snprintf(pg->description + len, sizeof pg->description - len, " (--device=cpu)");
    else if (gpus == 0)
        snprintf(pg->description + len, sizeof pg->description - len, " (no GPU visible: %s)", device_cuda_absence());
    else if (pg->simulated && gpus < nranks)
        snprintf(pg->description + len, sizeof pg->description - len, " (%d GPU%s visible for %d ranks)",
                 gpus, gpus == 1 ? "" : "s", nranks);
    else if (nranks >= 2 && where == PLACE_CUDA_SIMULATOR)
        snprintf(pg->description + len, sizeof pg->description - len, " (simulator asked for)");
    return pg;
}
