/* ranks.c: the rank set every strategy shares, and the ops that do not depend
 * on how the state is split (ranks.h). */
#include "ranks.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../model/gpt.h"
#include "../model/models.h"
#include "../model/sample.h"
#include "../runtime/host.h"
#include "../runtime/world.h"
#include "rank_graphs.h"

/* Each rank's device told who allocates there ("ZeRO-3, N=4, rank 2") and
 * what to try if it runs out. */
static void set_owner(Ranks *ranks, const char *hint) {
    for (int r = 0; r < ranks->local; r++) {
        char owner[96];
        snprintf(owner, sizeof owner, "%s, N=%d, rank %d", ranks->base.kind->name, ranks->nranks, ranks_global(ranks, r));
        device_set_owner(ranks->pg->device[r], owner, hint);
    }
}

/* What a rank that runs out of memory should try: under a cap, the smallest
 * stage whose estimate (strategy_estimate: state, working buffers,
 * activations) fits; fewer rows when that is no higher stage than this one,
 * or none fits. */
static void set_memory_hint(Ranks *ranks) {
    double cap = (double)device_limit(ranks->pg->device[0]);
    int stage = ranks->base.kind->stage;
    char hint[160] = "a higher --zero stage, more --gpus, or fewer rows (--batch)";
    if (cap > 0) snprintf(hint, sizeof hint, "no stage fits: more --gpus or fewer rows (--batch)");
    for (int k = 0; cap > 0 && k < STRATEGY_KINDS; k++) {
        double bytes[MEM_KINDS], need = 0;
        strategy_estimate(&STRATEGIES[k], &ranks->base.cfg, device_kind(ranks->pg->device[0]), bytes);
        for (int i = 0; i < MEM_KINDS; i++) need += bytes[i];
        if (need > cap) continue;
        if (STRATEGIES[k].stage <= stage)
            snprintf(hint, sizeof hint, "its working buffers pass the cap: fewer rows (--batch) or more --gpus");
        else
            snprintf(hint, sizeof hint, "--zero=%d (%s) fits: about %.1f MB a rank", STRATEGIES[k].stage,
                     STRATEGIES[k].name, need / 1e6);
        break;
    }
    set_owner(ranks, hint);
}

int ranks_init(Ranks *ranks, const StrategyConfig *cfg, const StrategyOps *ops, const StrategyKind *kind) {
    ranks->base.ops = ops;
    ranks->base.kind = kind;
    ranks->base.cfg = *cfg;
    ranks->nranks = cfg->nranks;
    ranks->shards = strategy_shard_ranks(cfg);
    ranks->pg = pg_create(cfg->nranks, cfg->device, cfg->own_cores);
    ranks->threads = ranks->pg ? rank_threads_create(ranks->pg->nranks) : NULL;
    if (!ranks->pg || !ranks->threads) {
        pg_destroy(ranks->pg);
        rank_threads_destroy(ranks->threads);
        return -1;
    }
    ranks->local = ranks->pg->nranks;
    ranks->first = ranks->pg->first_rank;
    rank_threads_name_ranks_from(ranks->threads, ranks->first);
    pg_set_link(ranks->pg, cfg->link);
    pg_set_link_inter(ranks->pg, cfg->link_inter, strategy_link_shape(cfg).node_ranks);
    pg_set_sums(ranks->pg, cfg->sums);
    pg_set_shard_ranks(ranks->pg, ranks->shards);
    if (cfg->diagnostics.trace)
        pg_trace(ranks->pg, cfg->diagnostics.trace, cfg->diagnostics.trace_label ? cfg->diagnostics.trace_label : "");
    if (cfg->diagnostics.profile) profile_attach(cfg->diagnostics.profile, ranks->pg->compute[0]);
    ranks->base.sync_grads = 1;
    ranks->grads_held = strategy_grads_held(cfg);
    ranks->base.placement = ranks->pg->description;
    ranks->base.device_kind = device_kind(ranks->pg->device[0]);
    ranks->base.simulated = ranks->pg->simulated;
    for (int r = 0; r < ranks->local; r++) device_set_limit(ranks->pg->device[r], cfg->max_memory_bytes);
    set_owner(ranks, "the activations do not fit: fewer rows (--batch) or a smaller model");
    ArenaLayout layout;  /* padded to the shards; every rank's model takes a copy */
    model_layout_units(&cfg->model, cfg->units.cut, ranks->shards, &layout);
    for (int r = 0; r < ranks->local; r++) {
        Model *m = model_create(&cfg->model, &layout, strategy_compute(kind, cfg), ranks->pg->device[r],
                                ranks->pg->compute[r], cfg->batch, cfg->model.block_size);
        m->dropout = cfg->dropout;
        m->seed = cfg->seed;
        m->rank = (uint32_t)ranks_global(ranks, r);
        ranks->ref[r] = (RankRef){ ranks, r };
        m->hooks.ctx = &ranks->ref[r];
        ranks->model[r] = m;
        ranks->norm_parts[r] = device_alloc(ranks->pg->device[r], MEM_WORKING,
                                            (size_t)ranks->nranks * sizeof(SquareSum));
    }
    ranks->layout = &ranks->model[0]->layout;
    set_memory_hint(ranks);
    if (cfg->graphs && !(ranks->graphs = rank_graphs_create(ranks))) {
        ranks_release(ranks);
        return -1;
    }
    return 0;
}

void ranks_synchronize(Strategy *s) {
    Ranks *ranks = (Ranks *)s;
    for (int r = 0; r < ranks->local; r++) {
        stream_synchronize(ranks->pg->compute[r]);
        stream_synchronize(ranks->pg->comm[r]);
    }
}

void ranks_release(Ranks *ranks) {
    rank_graphs_destroy(ranks->graphs);
    free(ranks->events);
    for (int r = 0; r < ranks->local; r++) {
        device_free(ranks->pg->device[r], MEM_WORKING, ranks->norm_parts[r],
                    (size_t)ranks->nranks * sizeof(SquareSum));
        model_destroy(ranks->model[r]);
    }
    rank_threads_destroy(ranks->threads);
    pg_destroy(ranks->pg);
}

int ranks_global(const Ranks *ranks, int rank) { return ranks->first + rank; }
int ranks_shard_of(const Ranks *ranks, int rank) { return pg_shard_of(ranks->pg, ranks_global(ranks, rank)); }

size_t ranks_shard_offset(const Ranks *ranks, int unit, int rank) {
    const UnitSpec *u = &ranks->layout->units[unit];
    return u->offset + (size_t)ranks_shard_of(ranks, rank) * (u->size / (size_t)ranks->shards);
}

size_t ranks_shard_arena_offset(const Ranks *ranks, int unit) {
    return ranks->layout->units[unit].offset / (size_t)ranks->shards;
}

/* A rank that --inject-fault stops at `where` of the step in flight (at the
 * rendezvous of that name, for a collective) fails as a real error there
 * would, through its rank threads; 1 if so. */
static int injected_fault(Ranks *ranks, int rank, FaultSite where, const char *rendezvous) {
    char report[200];
    const Fault *fault = &ranks->base.cfg.diagnostics.fault;
    if (!ranks->training ||
        !fault_strikes(fault, ranks_global(ranks, rank), (int)ranks->step, where, rendezvous, report, sizeof report))
        return 0;
    rank_threads_fail(ranks->threads, rank, "%s", report);
    ranks->failed[rank] = 1;
    return 1;
}

/* --inject-fault=RANK:STEP:hang: the rank stops answering, as a stuck peer
 * would, for the timeout and a minute more (the other processes' timeout
 * ends the run first); then it fails, so that no test can hang for good. 1
 * if it struck. */
static int injected_hang(Ranks *ranks, int rank) {
    const Fault *fault = &ranks->base.cfg.diagnostics.fault;
    if (!ranks->training || !fault_strikes(fault, ranks_global(ranks, rank), (int)ranks->step, FAULT_HANG, NULL, NULL, 0))
        return 0;
    for (double slept = 0; slept < world()->timeout_s + 60.0; slept += 0.1)
        nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
    return injected_fault(ranks, rank, FAULT_HANG, NULL);
}

void ranks_rendezvous(Ranks *ranks, int rank, CollectiveName name, const char *meet,
                      void (*collective)(Ranks *ranks, CollectiveName name)) {
    /* room for both parts; rank_threads_arrive compares the first RENDEZVOUS_NAME_MAX - 1 bytes */
    char what[RENDEZVOUS_NAME_MAX], rendezvous[2 * RENDEZVOUS_NAME_MAX];
    collective_name_text(name, what, sizeof what);
    snprintf(rendezvous, sizeof rendezvous, "%s %s", what, meet);
    if (ranks->failed[rank] || injected_fault(ranks, rank, FAULT_COLLECTIVE, rendezvous)) return;
    int rc = rank_threads_arrive(ranks->threads, rank, rendezvous);
    if (rc == 1) {
        collective(ranks, name);
        rc = rank_threads_depart(ranks->threads, rank);
    }
    if (rc < 0) ranks->failed[rank] = 1;
}

void ranks_wait_all(Ranks *ranks, int rank, Event *const *done) {
    pg_wait_parts(ranks->pg, rank, ranks->pg->compute[rank], done);
}

void ranks_events_create(Ranks *ranks, Event **events) {
    Event **grown = host_calloc((size_t)(ranks->nevents + ranks->local), sizeof *grown);
    if (ranks->nevents) memcpy(grown, ranks->events, (size_t)ranks->nevents * sizeof *grown);
    free(ranks->events);
    ranks->events = grown;
    for (int r = 0; r < ranks->local; r++) {
        events[r] = event_create(ranks->pg->device[r]);
        ranks->events[ranks->nevents++] = events[r];
    }
}

void ranks_events_destroy(Ranks *ranks, Event **events) {
    for (int r = 0; r < ranks->local; r++) {
        for (int i = 0; i < ranks->nevents; i++)
            if (ranks->events[i] == events[r]) ranks->events[i--] = ranks->events[--ranks->nevents];
        event_destroy(events[r]);
    }
}

/* One rank's part of a run: its rows forward, and backward when training. */
static int rank_body(RankThreads *f, int rank, void *ctx) {
    (void)f;
    Ranks *ranks = ctx;
    Model *m = ranks->model[rank];
    int B = ranks->base.cfg.batch, T = ranks->base.cfg.model.block_size;
    size_t rows = ranks_batch_offset(ranks, rank);
    if (injected_hang(ranks, rank) || injected_fault(ranks, rank, FAULT_FORWARD, NULL)) return -1;
    m->ops->forward(m, ranks->x + rows, ranks->y + rows, B, T, ranks_dropout_step(ranks), ranks->training);
    if (ranks->training && !injected_fault(ranks, rank, FAULT_BACKWARD, NULL)) m->ops->backward(m, 1.0f / (float)ranks->micros);
    return ranks->failed[rank] ? -1 : 0;
}

uint32_t ranks_dropout_step(const Ranks *ranks) {
    return ranks->step * (uint32_t)ranks->micros + (uint32_t)ranks->micro;
}

size_t ranks_batch_offset(const Ranks *ranks, int rank) {
    return (size_t)ranks_global(ranks, rank) * (size_t)ranks->base.cfg.batch * (size_t)ranks->base.cfg.model.block_size;
}

/* Every local rank's body on its thread: 0, or -1 after printing the failing rank. */
static int run_rank_threads(Ranks *ranks, int (*body)(RankThreads *f, int rank, void *ctx), void *ctx) {
    for (int r = 0; r < ranks->local; r++) ranks->failed[r] = 0;
    if (rank_threads_run(ranks->threads, body, ctx) == 0) return 0;
    if (world()->nprocs > 1) fprintf(stderr, "error: process %d: %s\n", world()->proc, rank_threads_error(ranks->threads));
    else fprintf(stderr, "error: %s\n", rank_threads_error(ranks->threads));
    return -1;
}

/* Every local rank's forward (and backward) on its thread, enqueued as it goes. */
static int run_ranks_eager(Ranks *ranks) { return run_rank_threads(ranks, rank_body, ranks); }

/* The bf16 compute copy made anew where the master changed since it was made. */
static void refresh_if_stale(Ranks *ranks) {
    if (!ranks->copy_stale) return;
    ranks->refresh_copy(ranks);
    ranks->copy_stale = 0;
}

int ranks_run(Ranks *ranks, const int *x, const int *y, uint32_t step, int micro, int micros, int training) {
    refresh_if_stale(ranks);
    ranks->x = x;
    ranks->y = y;
    ranks->step = step;
    ranks->micro = micro;
    ranks->micros = micros;
    ranks->training = training;
    if (training && ranks->graphs) return rank_graphs_run(ranks->graphs, ranks, run_ranks_eager);
    return run_ranks_eager(ranks);
}

/* The value ZF_INJECT_NAN (ranks.h) poisons at this step, if any: rank 0's
 * loss, its gradient part (held as the gradients are) or its weights (in
 * process 0). */
static void *injected_nan_target(Ranks *ranks, uint32_t step, DType *held) {
    NanTarget what = ranks->first == 0 ? nan_injected_at(step) : NAN_NONE;
    *held = what == NAN_GRAD ? ranks->grads_held : DTYPE_FP32;
    if (what == NAN_LOSS) return ranks->model[0]->mean_loss;
    if (what == NAN_GRAD) return ranks->grad_part[0];
    return what == NAN_WEIGHT ? ranks->weights[0] : NULL;
}

int ranks_forward_backward(Strategy *s, const int *x, const int *y, uint32_t step, int micro, int micros) {
    Ranks *ranks = (Ranks *)s;
    ranks->norm_parts_fresh = 0;
    int rc = ranks_run(ranks, x, y, step, micro, micros, 1);
    DType held = DTYPE_FP32;
    void *target = micro == micros - 1 ? injected_nan_target(ranks, step, &held) : NULL;
    static const float nan_fp32 = NAN;
    static const bf16 nan_bf16 = BF16_QUIET_NAN;
    const void *nan_value = held == DTYPE_BF16 ? (const void *)&nan_bf16 : (const void *)&nan_fp32;
    if (rc == 0 && target) stream_copy(ranks->pg->compute[0], target, nan_value, number_bytes(held));
    return rc;
}

void ranks_set_lr(Strategy *s, float lr) { s->lr = lr; }

/* Where rank r's own squared-norm partial goes among its norm_parts: with
 * one part per rank of a group (its shard), at its place in the group. */
static SquareSum *own_norm_part(const Ranks *ranks, int r) {
    return ranks->norm_parts[r] + (ranks->grad_parts_sharded ? ranks_shard_of(ranks, r) : 0);
}

/* Rank r's squared norm of its gradient part, into its own partial. */
static void own_norm_reduce(Ranks *ranks, int r) {
    sumsq_reduce(ranks->pg->compute[r], own_norm_part(ranks, r), ranks->grad_part[r], ranks->grads_held,
                 ranks->grad_part_len, ranks->model[r]->sumsq_scratch);
}

/* Clip by the global norm: each rank sums the squares of its gradient part
 * (unless the step's non-finite check has: norm_parts_fresh); sharded, the
 * group's partials are all-gathered, as floats' bytes. Each sum is exact, so
 * the norm is DDP's wherever the shards fall. The scaling
 * itself is the step's: AdamW scales each gradient as it reads it
 * (ranks_step_clip), so no pass writes the gradient. */
void ranks_clip_grads(Strategy *s, float max_norm) {
    Ranks *ranks = (Ranks *)s;
    ranks->clip_max_norm = 0.0f;
    if (max_norm <= 0.0f) return;
    float *own_part[MAX_RANKS], *parts[MAX_RANKS];
    for (int r = 0; r < ranks->local; r++) {
        own_part[r] = (float *)own_norm_part(ranks, r);
        parts[r] = (float *)ranks->norm_parts[r];
        if (!ranks->norm_parts_fresh) own_norm_reduce(ranks, r);
    }
    ranks->norm_parts_fresh = 0;
    if (ranks->grad_parts_sharded) {
        pg_all_gather(ranks->pg, (CollectiveName){ "norm", -1, -1 }, own_part, parts,
                      (size_t)ranks->shards * SQUARE_SUM_FLOATS, DTYPE_FP32, NULL);
    }
    ranks->clip_max_norm = max_norm;
}

AdamWClip ranks_step_clip(const Ranks *ranks, int r) {
    if (ranks->clip_max_norm <= 0.0f) return NO_CLIP;
    AdamWClip clip = { ranks->norm_parts[r], ranks->grad_parts_sharded ? ranks->shards : 1, ranks->clip_max_norm };
    return clip;
}

/* Mean over the world's ranks, in rank order, of each rank's mean loss. */
float ranks_train_loss(Strategy *s) {
    Ranks *ranks = (Ranks *)s;
    float mine[MAX_RANKS], all[MAX_RANKS];
    for (int r = 0; r < ranks->local; r++) mine[r] = model_read_loss(ranks->model[r]);
    world_all_gather(mine, all, (size_t)ranks->local * sizeof(float), "the losses");
    double total = 0.0;
    for (int g = 0; g < ranks->nranks; g++) total += all[g];
    return (float)(total / ranks->nranks);
}

/* Evaluation is split over the ranks: each runs its rows, without dropout. */
float ranks_eval_loss(Strategy *s, const int *x, const int *y) {
    Ranks *ranks = (Ranks *)s;
    if (ranks_run(ranks, x, y, 0, 0, 1, 0) != 0) return NAN;
    return ranks_train_loss(s);
}

/* One generation's arguments, for its rank bodies. */
typedef struct {
    Ranks *ranks;
    int *tokens;
    int n_prompt, n_new;
    Sampling how;
} Generation;

/* Global rank 0 generates; every other rank arrives at the unit hooks of each
 * of its forwards (one per new token, every unit in order), so that the
 * strategy gathers each unit in turn into its own buffers. */
static int generate_body(RankThreads *f, int rank, void *ctx) {
    (void)f;
    Generation *gen = ctx;
    Ranks *ranks = gen->ranks;
    Model *m = ranks->model[rank];
    if (ranks_global(ranks, rank) == 0) {
        gpt_generate((GPT *)m, gen->tokens, gen->n_prompt, gen->n_new, gen->how);
    } else {
        for (int n = 0; n < gen->n_new; n++)
            for (int u = 0; u < m->layout.nunits; u++) model_before_forward(m, u);
    }
    return ranks->failed[rank] ? -1 : 0;
}

/* On global rank 0, whose tokens every process then has. With sharded
 * weights no rank holds the whole model even here: each forward gathers one
 * unit at a time, as in training. */
int ranks_generate(Strategy *s, int *tokens, int n_prompt, int n_new, Sampling how) {
    Ranks *ranks = (Ranks *)s;
    if (s->cfg.model.kind != MODEL_GPT) return -1;
    refresh_if_stale(ranks);
    int rc = 0;
    Model *first = ranks->model[0];
    if (first->params || first->params_bf16) {  /* full weights (fp32, or the bf16 copy) in every rank's model */
        if (ranks->first == 0) gpt_generate((GPT *)ranks->model[0], tokens, n_prompt, n_new, how);
    } else {
        Generation gen = { ranks, tokens, n_prompt, n_new, how };
        ranks->training = 0;
        rc = run_rank_threads(ranks, generate_body, &gen);
    }
    world_broadcast(tokens + n_prompt, (size_t)n_new * sizeof(int), "the sample");
    return rc;
}

/* Floats in a rank's buffer of a state held as `how`. */
static size_t held_length(const Ranks *ranks, Holding how) {
    return how == HELD_FULL ? ranks->layout->total : ranks->layout->total / (size_t)ranks->shards;
}

/* The part of tensor t that global rank g holds as `how`: the padded arena's
 * elements [*from, *from + n) at *at in its buffer; n, 0 when it holds none.
 * A rank's holding is one range of the arena: all of it (HELD_FULL), its part
 * (HELD_PARTS), or its shard of the tensor's unit (HELD_UNIT_SHARDS). */
static size_t held_part(const Ranks *ranks, Holding how, int g, int t, size_t *from, size_t *at) {
    const TensorSpec *ts = &ranks->layout->tensors[t];
    size_t start = 0, end = ranks->layout->total, base = 0;  /* the holding, and where it starts in the buffer */
    size_t s = (size_t)pg_shard_of(ranks->pg, g), S = (size_t)ranks->shards;
    if (how == HELD_PARTS) {
        start = s * held_length(ranks, how);
        end = start + held_length(ranks, how);
    } else if (how == HELD_UNIT_SHARDS) {
        const UnitSpec *u = &ranks->layout->units[ts->unit];
        start = u->offset + s * (u->size / S);
        end = start + u->size / S;
        base = u->offset / S;
    }
    size_t lo = ts->offset > start ? ts->offset : start, hi = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
    *from = lo;
    *at = base + (lo - start);
    return hi > lo ? hi - lo : 0;
}

/* Whether global rank g's part is one a state's reading takes: under hybrid
 * sharding each shard is read from the first group alone (every group holds
 * the same); a write goes to every rank that holds a part. */
static int read_from(const Ranks *ranks, int g) { return g < ranks->shards; }

/* The part of tensor t that process p's ranks hold (HELD_PARTS, HELD_UNIT_SHARDS),
 * those of the first group alone when `reading`, as one range: the first
 * group's ranks follow each other, so what a process reads is just what they
 * hold; what it writes may span shards it does not hold (a group that wraps
 * past a process's end: ranks 2, 3 holding shards 2 and 0 of 3), sent along
 * and not copied. *from the tensor's start when empty. */
static size_t process_part(const Ranks *ranks, Holding how, int p, int t, int reading, size_t *from) {
    size_t lo = SIZE_MAX, hi = 0;
    for (int g = p * ranks->local; g < (p + 1) * ranks->local; g++) {
        if (reading && !read_from(ranks, g)) continue;
        size_t f, at, n = held_part(ranks, how, g, t, &f, &at);
        if (n && f < lo) lo = f;
        if (n && f + n > hi) hi = f + n;
    }
    *from = hi > lo ? lo : ranks->layout->tensors[t].offset;
    return hi > lo ? hi - lo : 0;
}

/* What this process's ranks hold of tensor t: all of it (HELD_FULL), else
 * process_part's range. */
static size_t this_process_part(const Ranks *ranks, Holding how, int t, int reading, size_t *from) {
    if (how != HELD_FULL) return process_part(ranks, how, world()->proc, t, reading, from);
    *from = ranks->layout->tensors[t].offset;
    return ranks->layout->tensors[t].numel;
}

/* Local rank r's part of tensor t between its buffer and a host piece that
 * holds the arena's elements from piece_from on. */
static void copy_part(Ranks *ranks, float *const *bufs, Holding how, int r, int t, float *piece, size_t piece_from,
                      int to_host) {
    if (to_host && !read_from(ranks, ranks_global(ranks, r))) return;
    size_t from, at, n = held_part(ranks, how, ranks_global(ranks, r), t, &from, &at);
    if (n == 0) return;
    float *host = piece + (from - piece_from), *dev = bufs[r] + at;
    stream_copy(ranks->pg->compute[r], to_host ? host : dev, to_host ? dev : host, n * sizeof(float));
}

static void synchronize_compute(Ranks *ranks) {
    for (int r = 0; r < ranks->local; r++) stream_synchronize(ranks->pg->compute[r]);
}

/* Where each process's part of tensor t goes in process 0's host copy of it. */
static WorldChunk *parts_at_root(const Ranks *ranks, Holding how, int t, int reading, float *host) {
    if (world()->proc != 0) return NULL;
    WorldChunk *at = host_calloc((size_t)world()->nprocs, sizeof *at);
    for (int p = 0; p < world()->nprocs; p++) {
        size_t from, n = process_part(ranks, how, p, t, reading, &from);
        at[p] = (WorldChunk){ host + (from - ranks->layout->tensors[t].offset), n * sizeof(float) };
    }
    return at;
}

void ranks_tensor_to_host(Ranks *ranks, float *const *bufs, Holding how, int t, float *host) {
    const TensorSpec *ts = &ranks->layout->tensors[t];
    int root = world()->proc == 0;
    if (how == HELD_FULL) {  /* global rank 0 has it all */
        if (root) copy_part(ranks, bufs, how, 0, t, host, ts->offset, 1);
        synchronize_compute(ranks);
        return;
    }
    size_t from, n = this_process_part(ranks, how, t, 1, &from);
    float *mine = root ? host + (from - ts->offset) : host_calloc(n ? n : 1, sizeof(float));
    for (int r = 0; r < ranks->local; r++) copy_part(ranks, bufs, how, r, t, mine, from, 1);
    synchronize_compute(ranks);
    WorldChunk *at_root = parts_at_root(ranks, how, t, 1, host);
    world_gather(mine, n * sizeof(float), at_root, "a tensor of the state");
    free(at_root);
    if (!root) free(mine);
}

void ranks_tensor_from_host(Ranks *ranks, float *const *bufs, Holding how, int t, const float *host) {
    const TensorSpec *ts = &ranks->layout->tensors[t];
    int root = world()->proc == 0;
    size_t from, n = this_process_part(ranks, how, t, 0, &from);
    float *mine = root ? (float *)host + (from - ts->offset) : host_calloc(n ? n : 1, sizeof(float));
    if (how == HELD_FULL) {  /* every rank holds it whole */
        world_broadcast(mine, n * sizeof(float), "a tensor of the state");
    } else {
        WorldChunk *at_root = parts_at_root(ranks, how, t, 0, (float *)host);
        world_scatter(at_root, mine, n * sizeof(float), "a tensor of the state");
        free(at_root);
    }
    for (int r = 0; r < ranks->local; r++) copy_part(ranks, bufs, how, r, t, mine, from, 0);
    synchronize_compute(ranks);
    if (!root) free(mine);
}

/* A state's buffers, and how they are held. */
static float *const *state_buffers(Ranks *ranks, StateOf what, Holding *how) {
    *how = what == STATE_WEIGHTS ? ranks->weights_held : ranks->adam_held;
    return what == STATE_WEIGHTS ? ranks->weights : what == STATE_EXP_AVG ? ranks->m : ranks->v;
}

void ranks_read_tensor(Strategy *s, StateOf what, int tensor, float *host) {
    Ranks *ranks = (Ranks *)s;
    Holding how;
    float *const *bufs = state_buffers(ranks, what, &how);
    ranks_tensor_to_host(ranks, bufs, how, tensor, host);
}

void ranks_write_tensor(Strategy *s, StateOf what, int tensor, const float *host) {
    Ranks *ranks = (Ranks *)s;
    Holding how;
    float *const *bufs = state_buffers(ranks, what, &how);
    ranks_tensor_from_host(ranks, bufs, how, tensor, host);
    if (what == STATE_WEIGHTS && ranks->refresh_copy) ranks->copy_stale = 1;
}

/* Each process computes the initial values of its ranks' parts of each tensor
 * (model_init_tensor_part: the bits of the whole arena's init), one tensor at
 * a time, and copies them into place: no process ever holds more of the
 * model than its ranks' own part of one tensor (all of it, when they hold the
 * full weights). */
void ranks_init_weights(Ranks *ranks) {
    Holding how = ranks->weights_held;
    size_t most = 1;
    for (int t = 0; t < ranks->layout->ntensors; t++) {
        size_t from, n = this_process_part(ranks, how, t, 0, &from);
        if (n > most) most = n;
    }
    float *piece = host_calloc(most, sizeof(float));
    for (int t = 0; t < ranks->layout->ntensors; t++) {
        const TensorSpec *ts = &ranks->layout->tensors[t];
        size_t from, n = this_process_part(ranks, how, t, 0, &from);
        if (n == 0) continue;
        model_init_tensor_part(&ranks->base.cfg.model, ranks->layout, t, ranks->base.cfg.seed, from - ts->offset, n, piece);
        for (int r = 0; r < ranks->local; r++) copy_part(ranks, ranks->weights, how, r, t, piece, from, 0);
        synchronize_compute(ranks);
    }
    free(piece);
    if (ranks->refresh_copy) ranks->copy_stale = 1;
}

size_t ranks_rank_bytes(Strategy *s, int rank, MemKind kind) {
    return device_bytes_in_use(((Ranks *)s)->pg->device[rank], kind);
}

size_t ranks_rank_peak_bytes(Strategy *s, int rank) { return device_peak_bytes(((Ranks *)s)->pg->device[rank]); }

/* This process's count of the state's non-finite values (weights, m and v).
 * Each count goes through the first bytes of the rank's norm_parts, free
 * between clippings (a partial the step's check left there is then no longer
 * the gradient's), and the model's sumsq scratch (any part of the arena
 * fits): no allocation per step. The counts follow each other on the rank's
 * compute stream. */
static size_t state_nonfinite(Ranks *ranks) {
    enum { BUFFERS = 3 };
    float counts[MAX_RANKS][BUFFERS];
    ranks->norm_parts_fresh = 0;
    for (int r = 0; r < ranks->local; r++) {
        const void *bufs[BUFFERS] = { ranks->weights[r], ranks->m[r], ranks->v[r] };
        size_t lens[BUFFERS] = { held_length(ranks, ranks->weights_held), held_length(ranks, ranks->adam_held),
                                 held_length(ranks, ranks->adam_held) };
        for (int b = 0; b < BUFFERS; b++) {
            float *count = (float *)ranks->norm_parts[r];
            count_nonfinite(ranks->pg->compute[r], count, bufs[b], DTYPE_FP32, lens[b], ranks->model[r]->sumsq_scratch);
            stream_copy(ranks->pg->compute[r], &counts[r][b], count, sizeof(float));
        }
    }
    size_t total = 0;
    for (int r = 0; r < ranks->local; r++) {
        stream_synchronize(ranks->pg->compute[r]);
        for (int b = 0; b < BUFFERS; b++) total += (size_t)counts[r][b];
    }
    return total;
}

/* This process's count of the gradient's non-finite values, folded into the
 * clip's pass: each rank sums its part's squares into its own partial, where
 * clip_grads then finds it (norm_parts_fresh). An exact sum is infinite
 * only where a value is not finite or past 2^64 (square_sum.h), so only a
 * rank whose sum is infinite counts its values, in a second pass that leaves
 * the partials to be made again. */
static size_t grads_nonfinite(Ranks *ranks) {
    SquareSum sums[MAX_RANKS];
    float counts[MAX_RANKS] = { 0 };
    for (int r = 0; r < ranks->local; r++) {
        own_norm_reduce(ranks, r);
        stream_copy(ranks->pg->compute[r], &sums[r], own_norm_part(ranks, r), sizeof(SquareSum));
    }
    ranks->norm_parts_fresh = 1;
    for (int r = 0; r < ranks->local; r++) {
        stream_synchronize(ranks->pg->compute[r]);
        if (!square_sum_infinite(sums[r])) continue;
        ranks->norm_parts_fresh = 0;
        float *count = (float *)own_norm_part(ranks, r);
        count_nonfinite(ranks->pg->compute[r], count, ranks->grad_part[r], ranks->grads_held, ranks->grad_part_len,
                        ranks->model[r]->sumsq_scratch);
        stream_copy(ranks->pg->compute[r], &counts[r], count, sizeof(float));
        stream_synchronize(ranks->pg->compute[r]);
    }
    size_t total = 0;
    for (int r = 0; r < ranks->local; r++) total += (size_t)counts[r];
    return total;
}

/* The counts of every process's ranks together. */
size_t ranks_count_nonfinite(Strategy *s, NonfiniteOf what) {
    Ranks *ranks = (Ranks *)s;
    size_t total = what == NONFINITE_GRADS ? grads_nonfinite(ranks) : state_nonfinite(ranks);
    size_t totals[MAX_RANKS];
    world_all_gather(&total, totals, sizeof total, "the non-finite counts");
    for (int p = 0; p < world()->nprocs; p++)
        if (p != world()->proc) total += totals[p];
    return total;
}
