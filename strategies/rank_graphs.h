/* rank_graphs.h: a training micro-step of every local rank, captured once as
 * one graph (runtime/device.h) and run again (--graphs=1).
 *
 * Why: a GPU step of GPT-2 is some 600 launches a rank, each a few
 * microseconds of the host's and a gap on the GPU; a graph's launch is one.
 * The ranks' streams are joined by the simulator's collectives, so the
 * capture holds all of them: it begins on local rank 0's compute stream (the
 * origin), every other stream joins it, and joins back before it ends.
 *
 * The plan, per kind of micro-step (its place among the step's: first, last,
 * both or neither, which decides what the strategies enqueue):
 *   its first run    eager, as without graphs: what is made at first use
 *                    (cuBLASLt's workspace, a CPU stream's room) is made;
 *   its second       captured, then launched: the batch staged by the
 *                    forward's upload as the capture ran it;
 *   the rest         each rank's batch staged on the host
 *                    (model_stage_batch), then the graph launched.
 * Before a launch the origin waits on every other stream's work so far; after
 * it, every other stream waits on the origin, and each rank's upload event
 * is recorded there, so that the eager work between micro-steps (the loss's
 * read, clipping, AdamW, an evaluation) is ordered after the graph and never
 * waits on an event recorded inside it. What a graph cannot hold is refused
 * where the run is made (strategy_config_error, ranks_init): a modeled link
 * (its clock starts when the host enqueues), traces and the profile (their
 * events are read on the host), injected faults, and ranks past one device's
 * simulator (NCCL, MPI). Dropout's step is read from memory (kernels.h).
 */
#ifndef ZF_RANK_GRAPHS_H
#define ZF_RANK_GRAPHS_H

#include "ranks.h"

enum { GRAPH_KINDS = 4 };

typedef struct RankGraphs {
    Graph *graph[GRAPH_KINDS];
    int eager_runs[GRAPH_KINDS];  /* the warm-up runs of each kind so far (1 at most) */
    Event *fork, *done;           /* recorded on the origin: the capture's start, a launch's end */
    Event *ready[2 * MAX_RANKS];  /* each stream's work before a launch, or its end in a capture */
} RankGraphs;

/* The graphs of ranks (none captured yet); NULL with a line on stderr where
 * the ranks cannot be captured (past one process, or on GPUs through NCCL). */
RankGraphs *rank_graphs_create(Ranks *ranks);
void rank_graphs_destroy(RankGraphs *g);
/* A training micro-step of every local rank (ranks->x, y, step, micro and
 * micros set), eager (eager(ranks): the rank threads' run), captured or
 * launched, as the plan says. 0, or -1 after printing the failing rank. */
int rank_graphs_run(RankGraphs *g, Ranks *ranks, int (*eager)(Ranks *ranks));

#endif
