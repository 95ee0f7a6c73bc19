/* ranks.h: what every strategy is built on: N ranks' models on one process
 * group, each rank's step run by rank threads, and the ops the strategies share.
 *
 * N is the world's (runtime/world.h): this process holds L = N / P of the
 * ranks, global ranks first .. first + L - 1. Every per-rank array below is
 * indexed by the local rank 0..L-1; shards, rows and names are the global
 * rank's (ranks_global). What reads every rank's state (losses, counts,
 * checkpoints) goes through the world's collectives.
 *
 * A strategy embeds Ranks first and says, per rank, where two things live:
 *   weights[r]     the full padded arena (HELD_FULL), or rank r's shard arena:
 *                  its shard of each unit, one after another (HELD_UNIT_SHARDS;
 *                  ZeRO-3); in mixed precision the fp32 master weights, held
 *                  as Adam's state is, beside the model's bf16 compute copy,
 *                  which refresh_copy makes from them;
 *   m[r], v[r]     Adam's state, held as adam_held (DDP: full; ZeRO-1: parts;
 *                  ZeRO-2/3: unit shards);
 *   grad_part[r]   the part of the mean gradient rank r holds after
 *                  forward_backward, grad_part_len numbers held as grads_held
 *                  says (strategy_grads_held): the whole arena (DDP), or one
 *                  part per rank (ZeRO-1/2/3), as clipping sums.
 * Unit u's shard on rank r is the range [offset_u + s * size_u / S, + size_u / S)
 * of the padded arena, at offset_u / S in the shard arena, where S is the
 * shards (N, or --shard-ranks' fewer: hybrid sharding) and s = r % S the
 * rank's (runtime/process_group.h): each unit's size divides by S
 * (runtime/arena.h), and so does every offset. Under hybrid sharding the
 * ranks of each group of S hold every shard; the first group's are what a
 * checkpoint reads, and what it writes goes to every group.
 *
 * replicated.c builds DDP and ZeRO-1 on this, sharded.c ZeRO-2 and ZeRO-3.
 */
#ifndef ZF_RANKS_H
#define ZF_RANKS_H

#include "../runtime/rank_threads.h"
#include "../runtime/process_group.h"
#include "strategy.h"

typedef struct Ranks Ranks;

/* How a state is spread over the ranks' buffers: every rank a full padded
 * arena; rank r the part [r * total / N, (r + 1) * total / N) of it (ZeRO-1's
 * Adam state); or rank r its shard of every unit (ZeRO-2/3). */
typedef enum { HELD_FULL, HELD_PARTS, HELD_UNIT_SHARDS } Holding;

/* The context of a rank's unit hooks. */
typedef struct {
    Ranks *ranks;
    int rank;
} RankRef;

struct Ranks {
    Strategy base;
    int nranks;                    /* N, the world's ranks */
    int shards;                    /* S: the shards of a sharded state (N, or --shard-ranks) */
    int local, first;              /* this process's L ranks, the first one's global rank */
    ProcessGroup *pg;
    RankThreads *threads;
    const ArenaLayout *layout;     /* the padded layout every rank's model shares */
    Model *model[MAX_RANKS];
    float *weights[MAX_RANKS];
    Holding weights_held;
    /* Mixed precision: every rank's bf16 compute copy made anew from the
     * master weights (each rank its owned part, then gathered), as after
     * AdamW; run before the next forward once a write or the init changed
     * the master (copy_stale). NULL in fp32, where the model reads weights. */
    void (*refresh_copy)(Ranks *ranks);
    int copy_stale;
    float *m[MAX_RANKS], *v[MAX_RANKS];  /* Adam's state, held as adam_held */
    Holding adam_held;
    DType grads_held;          /* strategy_grads_held: fp32, or bf16 */
    void *grad_part[MAX_RANKS];
    size_t grad_part_len;
    int grad_parts_sharded;
    SquareSum *norm_parts[MAX_RANKS];  /* [N] squared-norm partials, for clipping */
    int norm_parts_fresh;          /* each rank's own partial is of the gradient as it is now */
    float clip_max_norm;           /* the clip the next step applies (clip_grads); 0: none */
    const int *x, *y;              /* the global batch of the run in flight */
    uint32_t step;
    int micro, micros;             /* its micro-step, of how many */
    int training;
    int failed[MAX_RANKS];  /* a rendezvous of this run failed on this rank */
    RankRef ref[MAX_RANKS]; /* hooks.ctx of rank r's model is &ref[r] */
    struct RankGraphs *graphs;  /* --graphs=1: the training micro-steps' graphs (rank_graphs.h); else NULL */
    Event **events;             /* the strategy's events (ranks_events_create), nevents of them */
    int nevents;
};

/* Set up the process group, the rank threads and each rank's model (no arenas: the
 * strategy places them); 0, or -1 with a message and nothing left allocated. */
int ranks_init(Ranks *ranks, const StrategyConfig *cfg, const StrategyOps *ops, const StrategyKind *kind);
/* Wait for every stream of every rank (StrategyOps' synchronize; and before a
 * strategy frees its buffers). */
void ranks_synchronize(Strategy *s);
/* Free what ranks_init made, once ranks_synchronize has run. */
void ranks_release(Ranks *ranks);
/* Each rank's forward (and backward, when training) over its rows of the
 * global batch x, y, on its own thread; the strategy's collectives run from its
 * unit hooks. A training step's --inject-fault (cfg.diagnostics.fault) in the forward, the
 * backward or a collective fails its rank there. 0, or -1 after printing the
 * failing rank. */
int ranks_run(Ranks *ranks, const int *x, const int *y, uint32_t step, int micro, int micros, int training);
/* Where local rank r's rows begin in the global batch, in tokens. */
size_t ranks_batch_offset(const Ranks *ranks, int rank);
/* The step the dropout masks of the micro-step under way are drawn for: each
 * micro-step its own (step x micros + micro). */
uint32_t ranks_dropout_step(const Ranks *ranks);
/* The ops' forward_backward: ranks_run, training. For the tests of what a
 * non-finite step or state does, ZF_INJECT_NAN=WHAT:ITER[:COUNT] (WHAT: loss,
 * grad or weight; runtime/inject.h) then makes rank 0's loss, or the first value of its gradient
 * part or of its weights, NaN after the last micro-step of steps ITER ..
 * ITER + COUNT - 1 (COUNT 1 if absent). A weight so poisoned shows in the
 * next forward, or in the check before a save. */
int ranks_forward_backward(Strategy *s, const int *x, const int *y, uint32_t step, int micro, int micros);
/* Inside a hook of rank `rank`: arrive at the rendezvous for the collective
 * `name`, which the ranks meet to `meet` ("gather", "all-reduce"): "unit 3
 * gather" in a mismatch's or an injected fault's line; the last rank to arrive
 * runs collective(ranks, name) for every rank (name.index: a unit, a bucket).
 * After a failure it does nothing, and the rank's step fails once its model
 * returns. */
void ranks_rendezvous(Ranks *ranks, int rank, CollectiveName name, const char *meet,
                      void (*collective)(Ranks *ranks, CollectiveName name));
/* Rank r's compute stream waits for a collective's parts (pg_wait_parts). */
void ranks_wait_all(Ranks *ranks, int rank, Event *const *done);
/* N events on each rank's device, for a collective's parts; and their end.
 * Each is in ranks->events while it lives: what a graph records again where
 * it begins and after it runs (rank_graphs.h). */
void ranks_events_create(Ranks *ranks, Event **events);
void ranks_events_destroy(Ranks *ranks, Event **events);
/* Write the initial weights of cfg->seed, each rank its own part (strategies
 * call it once placed; in mixed precision the master's, the copy then
 * stale). */
void ranks_init_weights(Ranks *ranks);
/* The global rank of local rank r; the shard it holds (its global rank % S). */
int ranks_global(const Ranks *ranks, int rank);
int ranks_shard_of(const Ranks *ranks, int rank);
/* Where unit u's shard of local rank r starts, in the padded arena and in a shard arena. */
size_t ranks_shard_offset(const Ranks *ranks, int unit, int rank);
size_t ranks_shard_arena_offset(const Ranks *ranks, int unit);

/* Tensor t of a state held in bufs, to the host of process 0 (its numel
 * floats, from every rank that holds a part) or from there to every rank
 * that holds a part (strategy.h's read_tensor, write_tensor). Waits. */
void ranks_tensor_to_host(Ranks *ranks, float *const *bufs, Holding how, int t, float *host);
void ranks_tensor_from_host(Ranks *ranks, float *const *bufs, Holding how, int t, const float *host);

/* The clip that rank r's AdamW applies this step (ranks_clip_grads armed
 * it), or none. */
AdamWClip ranks_step_clip(const Ranks *ranks, int r);

/* The ops every strategy shares. */
void ranks_set_lr(Strategy *s, float lr);
void ranks_clip_grads(Strategy *s, float max_norm);
float ranks_train_loss(Strategy *s);
float ranks_eval_loss(Strategy *s, const int *x, const int *y);
int ranks_generate(Strategy *s, int *tokens, int n_prompt, int n_new, Sampling how);
void ranks_read_tensor(Strategy *s, StateOf what, int tensor, float *host);
void ranks_write_tensor(Strategy *s, StateOf what, int tensor, const float *host);
size_t ranks_rank_bytes(Strategy *s, int rank, MemKind kind);
size_t ranks_rank_peak_bytes(Strategy *s, int rank);
size_t ranks_count_nonfinite(Strategy *s, NonfiniteOf what);

#endif
