/* bench_mpi.c: what the MPI transport between processes moves, against the
 * ring model of --link.
 *
 * Run under a launcher (mpirun -np P bench/bench_mpi). For buffers of 4 KB to
 * 64 MB per process it times world_exchange, the call the process group's
 * collectives make between processes: an all-to-all in which each process
 * sends every peer its shard of the buffer (bytes / P), as in a reduce-scatter
 * of the buffer over P ranks, one a process. Prints, on process 0, the median
 * microseconds of an exchange, the GB/s each process sent ((P-1)/P of the
 * buffer over that time), and the bandwidth a modeled link would need for
 * ring_seconds (process_group.h) to give the same time, at the latency per
 * hop of the fastest smallest exchange (its time / (P-1)): the --link=GBPS,
 * LATENCY_US that models this transport, to compare with the one
 * bench_overlap chose. Each size's exchange is checked once: every byte from
 * process p must be p's.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/host.h"
#include "../runtime/process_group.h"
#include "../runtime/world.h"
#include "../training/trainer.h"
#include "steps.h"

enum { MIN_BYTES = 4 << 10, MAX_BYTES = 64 << 20, MIN_REPS = 5, MAX_REPS = 200 };
static const double SECONDS_PER_SIZE = 0.3;

/* One all-to-all of `bytes` per process: shard p of `send` to process p. */
static void exchange(uint8_t *send, uint8_t *recv, size_t bytes) {
    int P = world()->nprocs;
    size_t shard = bytes / (size_t)P;
    WorldChunk to[MAX_RANKS], from[MAX_RANKS];
    for (int p = 0; p < P; p++) {
        to[p] = (WorldChunk){ send + (size_t)p * shard, shard };
        from[p] = (WorldChunk){ recv + (size_t)p * shard, shard };
    }
    world_exchange(to, from, "bench_mpi's exchange");
}

/* Whether every byte process p sent arrived from it (our own shard untouched). */
static int arrived_intact(const uint8_t *recv, size_t bytes) {
    int P = world()->nprocs;
    size_t shard = bytes / (size_t)P;
    for (int p = 0; p < P; p++)
        for (size_t i = 0; i < shard && p != world()->proc; i++)
            if (recv[(size_t)p * shard + i] != (uint8_t)(p + 1)) return 0;
    return 1;
}

/* Median seconds of an exchange of `bytes`, and in *fastest the least, every
 * process taking the same number of them (process 0's count, from a first
 * timed one). */
static double exchange_seconds(uint8_t *send, uint8_t *recv, size_t bytes, double *fastest) {
    double t = wall_seconds();
    exchange(send, recv, bytes);
    t = wall_seconds() - t;
    int reps = t > 0 ? (int)(SECONDS_PER_SIZE / t) : MAX_REPS;
    reps = reps < MIN_REPS ? MIN_REPS : reps > MAX_REPS ? MAX_REPS : reps;
    world_broadcast(&reps, sizeof reps, "bench_mpi's repetitions");
    double *seconds = host_calloc((size_t)reps, sizeof(double));
    for (int i = 0; i < reps; i++) {
        (void)world_first_nonzero(0, NULL, "bench_mpi's start");  /* every process starts together */
        t = wall_seconds();
        exchange(send, recv, bytes);
        seconds[i] = wall_seconds() - t;
    }
    double m = median(seconds, reps);
    *fastest = seconds[0];  /* median sorted them */
    free(seconds);
    return m;
}

int main(int argc, char **argv) {
    if (world_init(&argc, &argv) != 0) return 1;
    const World *w = world();
    if (argc > 1) {
        if (w->proc == 0) fprintf(stderr, "bench_mpi: takes no flags (run it as mpirun -np P bench_mpi)\n");
        world_finalize();
        return 2;
    }
    if (w->nprocs < 2 || w->nprocs > MAX_RANKS) {
        fprintf(stderr, "bench_mpi: %d process%s: run it under mpirun -np P, 2 <= P <= %d\n", w->nprocs,
                w->nprocs == 1 ? "" : "es", MAX_RANKS);
        world_finalize();
        return 2;
    }
    int P = w->nprocs;
    uint8_t *send = host_calloc(MAX_BYTES, 1), *recv = host_calloc(MAX_BYTES, 1);
    memset(send, w->proc + 1, MAX_BYTES);
    if (w->proc == 0) {
        printf("transport: %s, %d processes on this machine (%d on its node); median exchange of each size\n",
               w->engine, P, w->procs_on_node);
        printf("| bytes per process | us per exchange | GB/s sent per process | ring link to match, GB/s |\n"
               "|---|---|---|---|\n");
    }
    int status = 0;
    double latency_s = 0;  /* per hop, from the smallest exchange */
    for (size_t bytes = MIN_BYTES; bytes <= MAX_BYTES; bytes *= 4) {
        memset(recv, 0, bytes);
        double fastest, seconds = exchange_seconds(send, recv, bytes, &fastest);
        if (world_first_nonzero(!arrived_intact(recv, bytes), NULL, "bench_mpi's check")) {
            if (w->proc == 0) fprintf(stderr, "bench_mpi: the exchange of %zu bytes delivered wrong bytes\n", bytes);
            status = 1;
            break;
        }
        if (bytes == MIN_BYTES) latency_s = fastest / (P - 1);
        double sent = (double)(P - 1) / P * (double)bytes, transfer = seconds - (P - 1) * latency_s;
        char ring[32] = "- (all latency)";
        if (transfer > 0) snprintf(ring, sizeof ring, "%.3g", sent / transfer / 1e9);
        if (w->proc == 0)
            printf("| %zu KB | %.1f | %.3g | %s |\n", bytes >> 10, 1e6 * seconds, sent / seconds / 1e9, ring);
        fflush(stdout);
    }
    if (w->proc == 0 && status == 0)
        printf("\nring link to match = the GB/s at which ring_seconds, with %.1f us per hop (the fastest %d KB "
               "exchange / (P-1)), gives the measured time\n", 1e6 * latency_s, MIN_BYTES >> 10);
    free(send);
    free(recv);
    world_finalize();
    return status;
}
