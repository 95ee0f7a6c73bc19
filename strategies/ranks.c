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

/* Each rank's device told who allocates there ("ZeRO-3, N=4, rank 2") and
 * what to try if it runs out. */
static void set_owner(Ranks *d, const char *hint) {
    for (int r = 0; r < d->local; r++) {
        char owner[96];
        snprintf(owner, sizeof owner, "%s, N=%d, rank %d", d->base.kind->name, d->nranks, ranks_global(d, r));
        device_set_owner(d->pg->device[r], owner, hint);
    }
}

/* What a rank that runs out of memory should try: under a cap, the smallest
 * stage whose estimate (strategy_estimate: state, working buffers,
 * activations) fits; fewer rows when that is no higher stage than this one,
 * or none fits. */
static void set_memory_hint(Ranks *d) {
    double cap = (double)device_limit(d->pg->device[0]);
    int stage = d->base.kind->stage;
    char hint[160] = "a higher --zero stage, more --gpus, or fewer rows (--batch)";
    if (cap > 0) snprintf(hint, sizeof hint, "no stage fits: more --gpus or fewer rows (--batch)");
    for (int k = 0; cap > 0 && k < STRATEGY_KINDS; k++) {
        double bytes[MEM_KINDS], need = 0;
        strategy_estimate(&STRATEGIES[k], &d->base.cfg, device_kind(d->pg->device[0]), bytes);
        for (int i = 0; i < MEM_KINDS; i++) need += bytes[i];
        if (need > cap) continue;
        if (STRATEGIES[k].stage <= stage)
            snprintf(hint, sizeof hint, "its working buffers pass the cap: fewer rows (--batch) or more --gpus");
        else
            snprintf(hint, sizeof hint, "--zero=%d (%s) fits: about %.1f MB a rank", STRATEGIES[k].stage,
                     STRATEGIES[k].name, need / 1e6);
        break;
    }
    set_owner(d, hint);
}

int ranks_init(Ranks *d, const StrategyConfig *cfg, const StrategyOps *ops, const StrategyKind *kind) {
    d->base.ops = ops;
    d->base.kind = kind;
    d->base.cfg = *cfg;
    d->nranks = cfg->nranks;
    d->pg = pg_create(cfg->nranks, cfg->device, cfg->own_cores);
    d->fibers = d->pg ? fibers_create(d->pg->nranks) : NULL;
    if (!d->pg || !d->fibers) {
        pg_destroy(d->pg);
        fibers_destroy(d->fibers);
        return -1;
    }
    d->local = d->pg->nranks;
    d->first = d->pg->first_rank;
    fibers_name_ranks_from(d->fibers, d->first);
    pg_set_link(d->pg, cfg->link_gbps, cfg->link_latency_us);
    pg_set_sums(d->pg, cfg->sums);
    if (cfg->trace) pg_trace(d->pg, cfg->trace, cfg->trace_label ? cfg->trace_label : "");
    d->base.sync_grads = 1;
    d->base.placement = d->pg->description;
    d->base.device_kind = device_kind(d->pg->device[0]);
    d->base.simulated = d->pg->simulated;
    for (int r = 0; r < d->local; r++) device_set_limit(d->pg->device[r], cfg->max_memory_bytes);
    set_owner(d, "the activations do not fit: fewer rows (--batch) or a smaller model");
    ArenaLayout layout;  /* padded to the world's ranks; every rank's model takes a copy */
    model_layout_units(&cfg->model, cfg->unit, d->nranks, &layout);
    for (int r = 0; r < d->local; r++) {
        Model *m = model_create(&cfg->model, &layout, cfg->recompute, d->pg->device[r], d->pg->compute[r], cfg->batch,
                                cfg->model.block_size);
        m->dropout = cfg->dropout;
        m->seed = cfg->seed;
        m->rank = (uint32_t)ranks_global(d, r);
        d->ref[r] = (RankRef){ d, r };
        m->hooks.ctx = &d->ref[r];
        d->model[r] = m;
        d->norm_parts[r] = device_alloc(d->pg->device[r], MEM_WORKING, (size_t)d->nranks * sizeof(float));
    }
    d->layout = &d->model[0]->layout;
    set_memory_hint(d);
    return 0;
}

void ranks_synchronize(Ranks *d) {
    for (int r = 0; r < d->local; r++) {
        stream_synchronize(d->pg->compute[r]);
        stream_synchronize(d->pg->comm[r]);
    }
}

void ranks_release(Ranks *d) {
    for (int r = 0; r < d->local; r++) {
        device_free(d->pg->device[r], MEM_WORKING, d->norm_parts[r], (size_t)d->nranks * sizeof(float));
        model_destroy(d->model[r]);
    }
    fibers_destroy(d->fibers);
    pg_destroy(d->pg);
}

int ranks_global(const Ranks *d, int rank) { return d->first + rank; }

size_t ranks_shard_offset(const Ranks *d, int unit, int rank) {
    const UnitSpec *u = &d->layout->units[unit];
    return u->offset + (size_t)ranks_global(d, rank) * (u->size / (size_t)d->nranks);
}

size_t ranks_shard_arena_offset(const Ranks *d, int unit) {
    return d->layout->units[unit].offset / (size_t)d->nranks;
}

/* A rank that --inject-fault stops at `where` of the step in flight (at the
 * rendezvous of that name, for a collective) fails as a real error there
 * would, through its fibers; 1 if so. */
static int injected_fault(Ranks *d, int rank, FaultSite where, const char *rendezvous) {
    char report[200];
    if (!d->training || !fault_strikes(&d->base.cfg.fault, ranks_global(d, rank), (int)d->step, where, rendezvous,
                                       report, sizeof report))
        return 0;
    fibers_fail(d->fibers, rank, "%s", report);
    d->failed[rank] = 1;
    return 1;
}

/* --inject-fault=RANK:STEP:hang: the rank stops answering, as a stuck peer
 * would, for the timeout and a minute more (the other processes' timeout
 * ends the run first); then it fails, so that no test can hang for good. 1
 * if it struck. */
static int injected_hang(Ranks *d, int rank) {
    if (!d->training ||
        !fault_strikes(&d->base.cfg.fault, ranks_global(d, rank), (int)d->step, FAULT_HANG, NULL, NULL, 0))
        return 0;
    for (double slept = 0; slept < world()->timeout_s + 60.0; slept += 0.1)
        nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
    return injected_fault(d, rank, FAULT_HANG, NULL);
}

void ranks_rendezvous(Ranks *d, int rank, CollectiveName name, const char *meet,
                      void (*collective)(Ranks *d, CollectiveName name)) {
    /* room for both parts; fibers_arrive compares the first FIBERS_NAME_MAX - 1 bytes */
    char what[FIBERS_NAME_MAX], rendezvous[2 * FIBERS_NAME_MAX];
    collective_name_text(name, what, sizeof what);
    snprintf(rendezvous, sizeof rendezvous, "%s %s", what, meet);
    if (d->failed[rank] || injected_fault(d, rank, FAULT_COLLECTIVE, rendezvous)) return;
    int rc = fibers_arrive(d->fibers, rank, rendezvous);
    if (rc == 1) {
        collective(d, name);
        rc = fibers_depart(d->fibers, rank);
    }
    if (rc < 0) d->failed[rank] = 1;
}

void ranks_wait_all(Ranks *d, int rank, Event *const *done) {
    pg_wait_parts(d->pg, rank, d->pg->compute[rank], done);
}

void ranks_events_create(Ranks *d, Event **events) {
    for (int r = 0; r < d->local; r++) events[r] = event_create(d->pg->device[r]);
}

void ranks_events_destroy(Ranks *d, Event **events) {
    for (int r = 0; r < d->local; r++) event_destroy(events[r]);
}

/* One rank's part of a run: its rows forward, and backward when training. */
static int rank_body(Fibers *f, int rank, void *ctx) {
    (void)f;
    Ranks *d = ctx;
    Model *m = d->model[rank];
    int B = d->base.cfg.batch, T = d->base.cfg.model.block_size;
    size_t rows = (size_t)ranks_global(d, rank) * B * T;
    /* each micro-step its own dropout masks */
    uint32_t dropout_step = d->step * (uint32_t)d->micros + (uint32_t)d->micro;
    if (injected_hang(d, rank) || injected_fault(d, rank, FAULT_FORWARD, NULL)) return -1;
    m->ops->forward(m, d->x + rows, d->y + rows, B, T, dropout_step, d->training);
    if (d->training && !injected_fault(d, rank, FAULT_BACKWARD, NULL)) m->ops->backward(m, 1.0f / (float)d->micros);
    return d->failed[rank] ? -1 : 0;
}

/* Every local rank's body on its fiber: 0, or -1 after printing the failing rank. */
static int run_fibers(Ranks *d, int (*body)(Fibers *f, int rank, void *ctx), void *ctx) {
    for (int r = 0; r < d->local; r++) d->failed[r] = 0;
    if (fibers_run(d->fibers, body, ctx) == 0) return 0;
    if (world()->nprocs > 1) fprintf(stderr, "error: process %d: %s\n", world()->proc, fibers_error(d->fibers));
    else fprintf(stderr, "error: %s\n", fibers_error(d->fibers));
    return -1;
}

int ranks_run(Ranks *d, const int *x, const int *y, uint32_t step, int micro, int micros, int training) {
    d->x = x;
    d->y = y;
    d->step = step;
    d->micro = micro;
    d->micros = micros;
    d->training = training;
    return run_fibers(d, rank_body, d);
}

/* The value ZF_INJECT_NAN (ranks.h) poisons at this step, if any: rank 0's
 * loss, its gradient part or its weights (in process 0). */
static float *injected_nan_target(Ranks *d, uint32_t step) {
    NanTarget what = d->first == 0 ? nan_injected_at(step) : NAN_NONE;
    if (what == NAN_LOSS) return d->model[0]->mean_loss;
    if (what == NAN_GRAD) return d->grad_part[0];
    return what == NAN_WEIGHT ? d->weights[0] : NULL;
}

int ranks_forward_backward(Strategy *s, const int *x, const int *y, uint32_t step, int micro, int micros) {
    Ranks *d = (Ranks *)s;
    int rc = ranks_run(d, x, y, step, micro, micros, 1);
    float *target = micro == micros - 1 ? injected_nan_target(d, step) : NULL;
    static const float nan_value = NAN;
    if (rc == 0 && target) stream_copy(d->pg->compute[0], target, &nan_value, sizeof nan_value);
    return rc;
}

void ranks_set_lr(Strategy *s, float lr) { s->lr = lr; }

/* Clip by the global norm: each rank sums the squares of its gradient part;
 * with one part per rank, the partials are all-gathered and summed in order. */
void ranks_clip_grads(Strategy *s, float max_norm) {
    Ranks *d = (Ranks *)s;
    if (max_norm <= 0.0f) return;
    int sharded = d->grad_parts_sharded;
    float *own_part[FIBERS_MAX_RANKS];
    for (int r = 0; r < d->local; r++) {
        own_part[r] = d->norm_parts[r] + (sharded ? ranks_global(d, r) : 0);
        sumsq_reduce(d->pg->compute[r], own_part[r], d->grad_part[r], d->grad_part_len,
                     d->model[r]->sumsq_scratch);
    }
    if (sharded) {
        pg_all_gather(d->pg, (CollectiveName){ "norm", -1, -1 }, own_part, d->norm_parts, (size_t)d->nranks, NULL);
    }
    for (int r = 0; r < d->local; r++)
        clip_scale(d->pg->compute[r], d->grad_part[r], d->grad_part_len, d->norm_parts[r],
                   sharded ? d->nranks : 1, max_norm);
}

/* Mean over the world's ranks, in rank order, of each rank's mean loss. */
float ranks_train_loss(Strategy *s) {
    Ranks *d = (Ranks *)s;
    float mine[FIBERS_MAX_RANKS], all[FIBERS_MAX_RANKS];
    for (int r = 0; r < d->local; r++) mine[r] = model_read_loss(d->model[r]);
    world_all_gather(mine, all, (size_t)d->local * sizeof(float), "the losses");
    double total = 0.0;
    for (int g = 0; g < d->nranks; g++) total += all[g];
    return (float)(total / d->nranks);
}

/* Evaluation is split over the ranks: each runs its rows, without dropout. */
float ranks_eval_loss(Strategy *s, const int *x, const int *y) {
    Ranks *d = (Ranks *)s;
    if (ranks_run(d, x, y, 0, 0, 1, 0) != 0) return NAN;
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
static int generate_body(Fibers *f, int rank, void *ctx) {
    (void)f;
    Generation *gen = ctx;
    Ranks *d = gen->ranks;
    Model *m = d->model[rank];
    if (ranks_global(d, rank) == 0) {
        gpt_generate((GPT *)m, gen->tokens, gen->n_prompt, gen->n_new, gen->how);
    } else {
        for (int n = 0; n < gen->n_new; n++)
            for (int u = 0; u < m->layout.nunits; u++) model_before_forward(m, u);
    }
    return d->failed[rank] ? -1 : 0;
}

/* On global rank 0, whose tokens every process then has. With sharded
 * weights no rank holds the whole model even here: each forward gathers one
 * unit at a time, as in training. */
int ranks_generate(Strategy *s, int *tokens, int n_prompt, int n_new, Sampling how) {
    Ranks *d = (Ranks *)s;
    if (s->cfg.model.kind != MODEL_GPT) return -1;
    int rc = 0;
    if (d->weights_held == HELD_FULL) {
        if (d->first == 0) gpt_generate((GPT *)d->model[0], tokens, n_prompt, n_new, how);
    } else {
        Generation gen = { d, tokens, n_prompt, n_new, how };
        d->training = 0;
        rc = run_fibers(d, generate_body, &gen);
    }
    world_broadcast(tokens + n_prompt, (size_t)n_new * sizeof(int), "the sample");
    return rc;
}

/* Floats in a rank's buffer of a state held as `how`. */
static size_t held_length(const Ranks *d, Holding how) {
    return how == HELD_FULL ? d->layout->total : d->layout->total / (size_t)d->nranks;
}

/* The part of tensor t that global rank g holds as `how`: the padded arena's
 * elements [*from, *from + n) at *at in its buffer; n, 0 when it holds none.
 * A rank's holding is one range of the arena: all of it (HELD_FULL), its part
 * (HELD_PARTS), or its shard of the tensor's unit (HELD_UNIT_SHARDS). */
static size_t held_part(const Ranks *d, Holding how, int g, int t, size_t *from, size_t *at) {
    const TensorSpec *ts = &d->layout->tensors[t];
    size_t start = 0, end = d->layout->total, base = 0;  /* the holding, and where it starts in the buffer */
    if (how == HELD_PARTS) {
        start = (size_t)g * held_length(d, how);
        end = start + held_length(d, how);
    } else if (how == HELD_UNIT_SHARDS) {
        const UnitSpec *u = &d->layout->units[ts->unit];
        start = u->offset + (size_t)g * (u->size / (size_t)d->nranks);
        end = start + u->size / (size_t)d->nranks;
        base = u->offset / (size_t)d->nranks;
    }
    size_t lo = ts->offset > start ? ts->offset : start, hi = ts->offset + ts->numel < end ? ts->offset + ts->numel : end;
    *from = lo;
    *at = base + (lo - start);
    return hi > lo ? hi - lo : 0;
}

/* The part of tensor t that process p's ranks hold (HELD_PARTS, HELD_UNIT_SHARDS):
 * one range, as their global ranks follow each other; *from the tensor's start when empty. */
static size_t process_part(const Ranks *d, Holding how, int p, int t, size_t *from) {
    size_t lo = SIZE_MAX, hi = 0;
    for (int g = p * d->local; g < (p + 1) * d->local; g++) {
        size_t f, at, n = held_part(d, how, g, t, &f, &at);
        if (n && f < lo) lo = f;
        if (n && f + n > hi) hi = f + n;
    }
    *from = hi > lo ? lo : d->layout->tensors[t].offset;
    return hi > lo ? hi - lo : 0;
}

/* What this process's ranks hold of tensor t: all of it (HELD_FULL), else
 * process_part's range. */
static size_t this_process_part(const Ranks *d, Holding how, int t, size_t *from) {
    if (how != HELD_FULL) return process_part(d, how, world()->proc, t, from);
    *from = d->layout->tensors[t].offset;
    return d->layout->tensors[t].numel;
}

/* Local rank r's part of tensor t between its buffer and a host piece that
 * holds the arena's elements from piece_from on. */
static void copy_part(Ranks *d, float *const *bufs, Holding how, int r, int t, float *piece, size_t piece_from,
                      int to_host) {
    size_t from, at, n = held_part(d, how, ranks_global(d, r), t, &from, &at);
    if (n == 0) return;
    float *host = piece + (from - piece_from), *dev = bufs[r] + at;
    stream_copy(d->pg->compute[r], to_host ? host : dev, to_host ? dev : host, n * sizeof(float));
}

static void synchronize_compute(Ranks *d) {
    for (int r = 0; r < d->local; r++) stream_synchronize(d->pg->compute[r]);
}

/* Where each process's part of tensor t goes in process 0's host copy of it. */
static WorldChunk *parts_at_root(const Ranks *d, Holding how, int t, float *host) {
    if (world()->proc != 0) return NULL;
    WorldChunk *at = host_calloc((size_t)world()->nprocs, sizeof *at);
    for (int p = 0; p < world()->nprocs; p++) {
        size_t from, n = process_part(d, how, p, t, &from);
        at[p] = (WorldChunk){ host + (from - d->layout->tensors[t].offset), n * sizeof(float) };
    }
    return at;
}

void ranks_tensor_to_host(Ranks *d, float *const *bufs, Holding how, int t, float *host) {
    const TensorSpec *ts = &d->layout->tensors[t];
    int root = world()->proc == 0;
    if (how == HELD_FULL) {  /* global rank 0 has it all */
        if (root) copy_part(d, bufs, how, 0, t, host, ts->offset, 1);
        synchronize_compute(d);
        return;
    }
    size_t from, n = this_process_part(d, how, t, &from);
    float *mine = root ? host + (from - ts->offset) : host_calloc(n ? n : 1, sizeof(float));
    for (int r = 0; r < d->local; r++) copy_part(d, bufs, how, r, t, mine, from, 1);
    synchronize_compute(d);
    WorldChunk *at_root = parts_at_root(d, how, t, host);
    world_gather(mine, n * sizeof(float), at_root, "a tensor of the state");
    free(at_root);
    if (!root) free(mine);
}

void ranks_tensor_from_host(Ranks *d, float *const *bufs, Holding how, int t, const float *host) {
    const TensorSpec *ts = &d->layout->tensors[t];
    int root = world()->proc == 0;
    size_t from, n = this_process_part(d, how, t, &from);
    float *mine = root ? (float *)host + (from - ts->offset) : host_calloc(n ? n : 1, sizeof(float));
    if (how == HELD_FULL) {  /* every rank holds it whole */
        world_broadcast(mine, n * sizeof(float), "a tensor of the state");
    } else {
        WorldChunk *at_root = parts_at_root(d, how, t, (float *)host);
        world_scatter(at_root, mine, n * sizeof(float), "a tensor of the state");
        free(at_root);
    }
    for (int r = 0; r < d->local; r++) copy_part(d, bufs, how, r, t, mine, from, 0);
    synchronize_compute(d);
    if (!root) free(mine);
}

/* A state's buffers, and how they are held. */
static float *const *state_buffers(Ranks *d, StateOf what, Holding *how) {
    *how = what == STATE_WEIGHTS ? d->weights_held : d->adam_held;
    return what == STATE_WEIGHTS ? d->weights : what == STATE_EXP_AVG ? d->m : d->v;
}

void ranks_read_tensor(Strategy *s, StateOf what, int tensor, float *host) {
    Ranks *d = (Ranks *)s;
    Holding how;
    float *const *bufs = state_buffers(d, what, &how);
    ranks_tensor_to_host(d, bufs, how, tensor, host);
}

void ranks_write_tensor(Strategy *s, StateOf what, int tensor, const float *host) {
    Ranks *d = (Ranks *)s;
    Holding how;
    float *const *bufs = state_buffers(d, what, &how);
    ranks_tensor_from_host(d, bufs, how, tensor, host);
}

/* Each process computes the initial values of its ranks' parts of each tensor
 * (model_init_tensor_part: the bits of the whole arena's init), one tensor at
 * a time, and copies them into place: no process ever holds more of the
 * model than its ranks' own part of one tensor (all of it, when they hold the
 * full weights). */
void ranks_init_weights(Ranks *d) {
    Holding how = d->weights_held;
    size_t most = 1;
    for (int t = 0; t < d->layout->ntensors; t++) {
        size_t from, n = this_process_part(d, how, t, &from);
        if (n > most) most = n;
    }
    float *piece = host_calloc(most, sizeof(float));
    for (int t = 0; t < d->layout->ntensors; t++) {
        const TensorSpec *ts = &d->layout->tensors[t];
        size_t from, n = this_process_part(d, how, t, &from);
        if (n == 0) continue;
        model_init_tensor_part(&d->base.cfg.model, d->layout, t, d->base.cfg.seed, from - ts->offset, n, piece);
        for (int r = 0; r < d->local; r++) copy_part(d, d->weights, how, r, t, piece, from, 0);
        synchronize_compute(d);
    }
    free(piece);
}

size_t ranks_rank_bytes(Strategy *s, int rank, MemKind kind) {
    return device_bytes_in_use(((Ranks *)s)->pg->device[rank], kind);
}

size_t ranks_rank_peak_bytes(Strategy *s, int rank) { return device_peak_bytes(((Ranks *)s)->pg->device[rank]); }

/* Each count goes through the first float of the rank's norm_parts, free
 * between clippings, and the model's sumsq scratch (any part of the arena
 * fits): no allocation per step. The counts follow each other on the rank's
 * compute stream. */
size_t ranks_count_nonfinite(Strategy *s, NonfiniteOf what) {
    Ranks *d = (Ranks *)s;
    enum { MAX_BUFFERS = 3 };
    float counts[FIBERS_MAX_RANKS][MAX_BUFFERS] = { { 0 } };
    for (int r = 0; r < d->local; r++) {
        const float *bufs[MAX_BUFFERS] = { d->grad_part[r] };
        size_t lens[MAX_BUFFERS] = { d->grad_part_len };
        int nbufs = 1;
        if (what == NONFINITE_STATE) {
            bufs[0] = d->weights[r];
            bufs[1] = d->m[r];
            bufs[2] = d->v[r];
            lens[0] = held_length(d, d->weights_held);
            lens[1] = lens[2] = held_length(d, d->adam_held);
            nbufs = 3;
        }
        for (int b = 0; b < nbufs; b++) {
            count_nonfinite(d->pg->compute[r], d->norm_parts[r], bufs[b], lens[b], d->model[r]->sumsq_scratch);
            stream_copy(d->pg->compute[r], &counts[r][b], d->norm_parts[r], sizeof(float));
        }
    }
    size_t total = 0;
    for (int r = 0; r < d->local; r++) {
        stream_synchronize(d->pg->compute[r]);
        for (int b = 0; b < MAX_BUFFERS; b++) total += (size_t)counts[r][b];
    }
    size_t totals[FIBERS_MAX_RANKS];
    world_all_gather(&total, totals, sizeof total, "the non-finite counts");
    for (int p = 0; p < world()->nprocs; p++)
        if (p != world()->proc) total += totals[p];
    return total;
}
