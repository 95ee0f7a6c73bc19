/* world_none.c: world.h in a build without MPI (MPI=0: the GPU bundle): one
 * process, and a clear line when a launcher started several. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "world_backend.h"

int world_init(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    if (world_launched()) {
        fprintf(stderr, "error: started by an MPI launcher, but this build has no MPI (built with MPI=0)\n");
        return -1;
    }
    return 0;
}

void world_finalize(void) { world_wait_if_ending(); }

void world_abort(int status) {
    world_mark_ending();
    fflush(NULL);
    _exit(status);
}

void world_backend_exchange(WorldChannel channel, const WorldChunk *to, WorldChunk *from, const char *what) {
    (void)channel;
    (void)to;
    (void)from;
    fprintf(stderr, "fatal: an exchange ('%s') in a one-process world\n", what);
    abort();
}
