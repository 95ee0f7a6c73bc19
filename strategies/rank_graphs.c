/* rank_graphs.c: the plan of rank_graphs.h: a micro-step's first run of its
 * kind eager, its second captured, the rest launched. */
#include "rank_graphs.h"

#include <stdio.h>
#include <stdlib.h>

#include "../runtime/host.h"
#include "../runtime/world.h"

/* The ranks' streams, the origin (local rank 0's compute stream) first. */
static int streams_of(const Ranks *ranks, Stream **streams) {
    int n = 0;
    streams[n++] = ranks->pg->compute[0];
    for (int r = 0; r < ranks->local; r++) {
        if (r > 0) streams[n++] = ranks->pg->compute[r];
        streams[n++] = ranks->pg->comm[r];
    }
    return n;
}

RankGraphs *rank_graphs_create(Ranks *ranks) {
    const char *refusal = NULL;
    if (world()->nprocs > 1) refusal = "--graphs=1 captures the ranks of one process; this run has several";
    else if (!ranks->pg->simulated) refusal = "--graphs=1 captures ranks simulated on one device; these run on GPUs "
                                              "through NCCL";
    if (refusal) {
        fprintf(stderr, "error: %s\n", refusal);
        return NULL;
    }
    RankGraphs *g = host_calloc(1, sizeof *g);
    Device *dev = ranks->pg->device[0];
    g->fork = event_create(dev);
    g->done = event_create(dev);
    for (int i = 0; i < 2 * ranks->local; i++) g->ready[i] = event_create(dev);
    return g;
}

void rank_graphs_destroy(RankGraphs *g) {
    if (!g) return;
    for (int k = 0; k < GRAPH_KINDS; k++) graph_destroy(g->graph[k]);
    event_destroy(g->fork);
    event_destroy(g->done);
    for (int i = 0; i < 2 * MAX_RANKS; i++) event_destroy(g->ready[i]);
    free(g);
}

/* Every other stream's end, waited on by the origin: its work so far before
 * a launch, or its captured work before the capture ends. */
static void origin_waits_for_all(RankGraphs *g, Stream *const *streams, int n) {
    for (int i = 1; i < n; i++) {
        event_record(g->ready[i], streams[i]);
        stream_wait_event(streams[0], g->ready[i]);
    }
}

/* The strategy's events recorded on the origin: at a capture's start, so
 * that a wait in it on work before it (a buffer's last use, a gather after
 * AdamW) waits on a point inside the graph, which the origin's wait before
 * the launch has made the end of that work; and after a launch, so that no
 * wait after it finds a record made in the graph. */
static void record_events_at(Ranks *ranks, Stream *origin) {
    for (int i = 0; i < ranks->nevents; i++) event_record(ranks->events[i], origin);
}

/* The capture of eager(ranks): every other stream joins at the origin's
 * start and joins back at its end. 0, or -1 (the graph then destroyed). */
static int capture(RankGraphs *g, Ranks *ranks, int kind, Stream *const *streams, int n,
                   int (*eager)(Ranks *ranks)) {
    graph_capture_begin(streams[0]);
    event_record(g->fork, streams[0]);
    for (int i = 1; i < n; i++) stream_wait_event(streams[i], g->fork);
    record_events_at(ranks, streams[0]);
    int rc = eager(ranks);
    origin_waits_for_all(g, streams, n);
    g->graph[kind] = graph_capture_end(streams[0]);
    ranks->base.graph_captures++;
    if (rc == 0) return 0;
    graph_destroy(g->graph[kind]);
    g->graph[kind] = NULL;
    return -1;
}

int rank_graphs_run(RankGraphs *g, Ranks *ranks, int (*eager)(Ranks *ranks)) {
    int kind = (ranks->micro == 0) | (ranks->micro == ranks->micros - 1) << 1;
    if (!g->eager_runs[kind]) {
        g->eager_runs[kind] = 1;
        return eager(ranks);
    }
    Stream *streams[2 * MAX_RANKS];
    int n = streams_of(ranks, streams);
    origin_waits_for_all(g, streams, n);
    int rc = 0;
    if (!g->graph[kind]) {
        rc = capture(g, ranks, kind, streams, n, eager);
    } else {
        int B = ranks->base.cfg.batch, T = ranks->base.cfg.model.block_size;
        for (int r = 0; r < ranks->local; r++) {
            size_t rows = ranks_batch_offset(ranks, r);
            model_stage_batch(ranks->model[r], ranks->x + rows, ranks->y + rows, (size_t)B * T,
                              ranks_dropout_step(ranks));
        }
    }
    if (rc == 0) {
        graph_launch(g->graph[kind], streams[0]);
        ranks->base.graph_launches++;
    }
    /* after a failed capture too: what ends the run (a save) may wait on them */
    event_record(g->done, streams[0]);
    for (int i = 1; i < n; i++) stream_wait_event(streams[i], g->done);
    record_events_at(ranks, streams[0]);
    for (int r = 0; r < ranks->local; r++) event_record(ranks->model[r]->uploaded, streams[0]);
    return rc;
}
