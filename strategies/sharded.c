/* sharded.c: ZeRO-2 (--zero=2) and ZeRO-3 (--zero=3), unit by unit.
 *
 * Rank r owns its shard of every unit (ranks.h): the mean gradient and the
 * Adam state of those shards live in shard arenas of total / N floats. The
 * full gradient of a unit exists only in a gradient slot, for the span of that
 * unit's backward: the root unit has a slot of its own (its gradient completes
 * last, since the token embedding is also the output head), the other units
 * share one, or max_live_units (K) with overlap. Units are what the model's
 * unit policy makes them (whole blocks, halves, or weight matrices), and every
 * slot and gather buffer is as large as the largest of them. The unit hooks drive the collectives, the last rank
 * to arrive enqueuing each one for every rank:
 *
 *   before_backward(u)  zero the unit's slot
 *   after_backward(u)   reduce-scatter every rank's slot into the owners'
 *                       shards (the mean); the slot is free again once it ran
 *
 * ZeRO-2 keeps full weights: after AdamW on its shards, every unit's weights
 * are all-gathered, each as soon as its AdamW is done; with overlap they run
 * under the next forward, each unit's forward waiting for its own (FSDP's
 * SHARD_GRAD_OP does the same). ZeRO-3 keeps only its weight shards, and gathers a unit
 * into a gather buffer before its forward and before its backward:
 *
 *   before_forward(u)   all-gather unit u's weights, unless they are there
 *   before_backward(u)  the same for every unit but the root, gathered at the
 *                       start of the forward, stays so until the backward ends
 *
 * In bf16 (--dtype) each rank holds the ZeRO paper's mixed-precision state:
 * the fp32 master weights of its shards beside Adam's m and v (the paper's
 * K = 12 bytes a parameter), and the compute copy in bf16, 2 bytes a number
 * (ZeRO-2: full; ZeRO-3: its shards, gathered in bf16 into bf16 buffers).
 * After AdamW updates a unit's master shard, the shard is rounded into the
 * copy (and ZeRO-2 gathers the unit), as DeepSpeed refreshes its fp16
 * weights, and so after a write or the init, before the next forward
 * (ranks.h's refresh_copy); the model widens what it reads (model/gpt.h). The copy's values
 * are the master's rounded, as the model would round them itself, so the bits
 * are DDP's. Reduced in bf16 too (--reduce-dtype), the gradient slots and
 * shards are bf16 (the paper's 2 bytes), reduce-scattered as they are.
 *
 * A collective waits for every rank's compute work so far (runtime/
 * process_group.h). Without overlap every rank's compute stream then waits for
 * it at once. With overlap (FSDP's): the reduce-scatters run on the
 * communication streams under the backward of the units below, the units
 * take turns in K slots and K gather buffers, each gather prefetches the next
 * K - 1 units' (at most K gathered at once, K = 1 prefetching none), and the
 * compute streams wait on
 * each collective's events only where they use its buffers: a slot is zeroed
 * again only after every rank's part of the reduce-scatter that read it. No
 * host wait anywhere. The sums run in the same kernel and the same rank order
 * as DDP's all-reduce, and AdamW is elementwise, so without clipping the
 * weights are bit-identical to DDP's, overlapped or not.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../model/optim.h"
#include "../runtime/host.h"
#include "ranks.h"

/* Where a gather buffer stands, on one rank (as FSDP2's ShardedState): it
 * holds no unit; its unit's gather is enqueued, and with overlap the rank's
 * compute has not yet waited for its part; or the rank's compute may read it. */
typedef enum { BUFFER_EMPTY, BUFFER_GATHERING, BUFFER_GATHERED } BufferState;

/* A unit-sized working buffer on every rank (a gradient slot or a gather
 * buffer), with the events of the last collective that used it. */
typedef struct {
    float *rank_buf[MAX_RANKS];
    /* Instead, in mixed precision: a gather buffer of the bf16 compute copy,
     * or a gradient slot of gradients held in bf16 (ranks.h's grads_held) */
    bf16 *rank_bf16[MAX_RANKS];
    size_t floats;
    Event *done[MAX_RANKS];  /* each rank's part of that collective (overlap) */
    int unit;                /* a gather buffer's unit, while not BUFFER_EMPTY */
    /* Set for every rank by the gather (which one rank enqueues for all, in
     * the rendezvous), then by each rank for itself when it waits. */
    BufferState state[MAX_RANKS];
} UnitBuffer;

enum { MAX_POOL = MAX_LIVE_UNITS };  /* unit buffers of each kind: K with overlap, else one */

/* What sets ZeRO-3 apart from ZeRO-2 (the kind's shards_weights): its
 * weights kept as shards, each unit gathered into a gather buffer for its
 * forward and its backward; or (ZeRO-2) full weights on every rank, each
 * unit all-gathered from the owners' shards after its AdamW. */
typedef enum { WEIGHTS_GATHERED_AFTER_STEP, WEIGHTS_GATHERED_PER_UNIT } WeightPolicy;

typedef struct {
    Ranks ranks;
    WeightPolicy weights;
    int pool;
    size_t part;                   /* shard arena length: total / S (the shards: N, or --shard-ranks) */
    float *grad_shard[MAX_RANKS];
    bf16 *grad_shard_bf16[MAX_RANKS];  /* instead, where the gradients are held in bf16 */
    /* The weights of its shards: fp32 (WEIGHTS_GATHERED_PER_UNIT), or in
     * mixed precision the fp32 master (both policies) */
    float *weight_shard[MAX_RANKS];
    int copy_bf16;                   /* mixed precision: the compute copy in bf16 */
    bf16 *copy_shard[MAX_RANKS];     /* WEIGHTS_GATHERED_PER_UNIT's copy of its shards */
    UnitBuffer slot[1 + MAX_POOL];   /* [0]: the root unit's; then the other units' */
    UnitBuffer gather[1 + MAX_POOL]; /* WEIGHTS_GATHERED_PER_UNIT, likewise */
    /* WEIGHTS_GATHERED_AFTER_STEP with overlap: each rank's part of each
     * unit's weight all-gather after the step ([unit][rank]), and whether some
     * are not yet waited for by every rank (settle_weights). */
    Event *(*weights_done)[MAX_RANKS];
    int weights_in_flight;
} Sharded;

/* Units take turns in the pool by unit number, so with K buffers a unit and
 * its K - 1 neighbours (the next ones in the forward, the ones below in the
 * backward) never share one. */
static UnitBuffer *slot_of(Sharded *d, int unit) { return &d->slot[unit == 0 ? 0 : 1 + unit % d->pool]; }
static UnitBuffer *gather_of(Sharded *d, int unit) { return &d->gather[unit == 0 ? 0 : 1 + unit % d->pool]; }

static Event *const *done_events(Sharded *d, UnitBuffer *b) { return d->ranks.base.cfg.overlap.enabled ? b->done : NULL; }

static int per_unit_gathers(const Sharded *d) { return d->weights == WEIGHTS_GATHERED_PER_UNIT; }

/* Without overlap the compute streams waited for the gather as it was
 * enqueued; with it, each rank's compute waits for its own part before it reads. */
static void set_gathered(Sharded *d, UnitBuffer *b, int unit) {
    b->unit = unit;
    BufferState state = d->ranks.base.cfg.overlap.enabled ? BUFFER_GATHERING : BUFFER_GATHERED;
    for (int r = 0; r < d->ranks.local; r++) b->state[r] = state;
}

static void set_empty(Sharded *d, UnitBuffer *b) {
    for (int r = 0; r < d->ranks.local; r++) b->state[r] = BUFFER_EMPTY;
}

/* The buffer holds the unit (gathered, or its gather enqueued), on every rank:
 * the gather sets every rank's state at once, so rank 0's says. */
static int holds(const UnitBuffer *b, int unit) { return b->state[0] != BUFFER_EMPTY && b->unit == unit; }

/* Gather the named unit's weights into its buffer on every rank, unless it is
 * there; a prefetch gathers the unit that computes next, ahead of its turn. */
static void ensure_gathered(Sharded *d, CollectiveName name) {
    Ranks *ranks = &d->ranks;
    int unit = name.unit;
    UnitBuffer *b = gather_of(d, unit);
    if (holds(b, unit)) return;
    size_t at = ranks_shard_arena_offset(ranks, unit), size = ranks->layout->units[unit].size;
    if (d->copy_bf16) {
        bf16 *shards[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) shards[r] = d->copy_shard[r] + at;
        pg_all_gather_bf16(ranks->pg, name, shards, b->rank_bf16, size, done_events(d, b));
    } else {
        float *shards[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) shards[r] = d->weight_shard[r] + at;
        pg_all_gather(ranks->pg, name, shards, b->rank_buf, size, DTYPE_FP32, done_events(d, b));
    }
    set_gathered(d, b, unit);
}

static CollectiveName prefetch(int unit) { return (CollectiveName){ "prefetch unit", unit, unit }; }

/* Before a unit's forward: the weights changed since the last forward, so the
 * root's gather starts afresh; with overlap, the next K - 1 units are
 * prefetched (the root's buffer is its own, so unit 0 prefetches K - 1 too). */
static void gather_forward(Ranks *ranks, CollectiveName name) {
    Sharded *d = (Sharded *)ranks;
    int unit = name.unit;
    if (unit == 0)
        for (int i = 0; i <= d->pool; i++) set_empty(d, &d->gather[i]);
    ensure_gathered(d, name);
    for (int next = unit + 1; ranks->base.cfg.overlap.enabled && next < unit + d->pool && next < ranks->layout->nunits; next++)
        ensure_gathered(d, prefetch(next));
}

/* Before a unit's backward; with overlap, the K - 1 units below are
 * prefetched. The last units of the forward are often still there. */
static void gather_backward(Ranks *ranks, CollectiveName name) {
    Sharded *d = (Sharded *)ranks;
    int unit = name.unit;
    ensure_gathered(d, name);
    for (int below = unit - 1; ranks->base.cfg.overlap.enabled && below > unit - d->pool && below > 0; below--)
        ensure_gathered(d, prefetch(below));
}

/* Every rank's slot of the unit, reduced into the owners' gradient shards;
 * after a step's first micro-step, added to them (REDUCE_ADD: the reduction
 * lands in the slot itself first, in place). */
static void reduce_scatter_unit(Ranks *ranks, CollectiveName name) {
    Sharded *d = (Sharded *)ranks;
    int unit = name.unit;
    UnitBuffer *slot = slot_of(d, unit);
    size_t size = ranks->layout->units[unit].size, at = ranks_shard_arena_offset(ranks, unit);
    ReduceInto into = ranks->micro > 0 ? REDUCE_ADD : REDUCE_WRITE;
    float scale = 1.0f / (float)ranks->nranks;
    if (ranks->grads_held == DTYPE_BF16) {
        bf16 *shards[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) shards[r] = d->grad_shard_bf16[r] + at;
        pg_reduce_scatter_bf16(ranks->pg, name, slot->rank_bf16, shards, size, scale, into, done_events(d, slot));
        return;
    }
    float *shards[MAX_RANKS];
    for (int r = 0; r < ranks->local; r++) shards[r] = d->grad_shard[r] + at;
    pg_reduce_scatter(ranks->pg, name, slot->rank_buf, shards, size, scale, ranks->base.cfg.reduce_precision, into,
                      done_events(d, slot));
}

static void rendezvous(RankRef *ref, const char *meet, int unit, void (*collective)(Ranks *, CollectiveName)) {
    ranks_rendezvous(ref->ranks, ref->rank, (CollectiveName){ "unit", unit, unit }, meet, collective);
}

/* The rank's compute waits here for its own part of a gather still
 * BUFFER_GATHERING (overlap); once waited, the buffer is gathered for it. */
static void wait_gathered(RankRef *ref, int unit) {
    Sharded *d = (Sharded *)ref->ranks;
    UnitBuffer *b = gather_of(d, unit);
    if (b->state[ref->rank] != BUFFER_GATHERING) return;
    stream_wait_event(d->ranks.pg->compute[ref->rank], b->done[ref->rank]);
    b->state[ref->rank] = BUFFER_GATHERED;
}

static void before_forward(void *ctx, int unit) {
    rendezvous(ctx, "gather", unit, gather_forward);
    wait_gathered(ctx, unit);
}

/* The slot is free once every rank's part of its last reduce-scatter is done. */
static void before_backward(void *ctx, int unit) {
    RankRef *ref = ctx;
    Sharded *d = (Sharded *)ref->ranks;
    Model *m = ref->ranks->model[ref->rank];
    if (per_unit_gathers(d) && unit != 0) {
        rendezvous(ref, "gather", unit, gather_backward);
        wait_gathered(ref, unit);
    }
    UnitBuffer *slot = slot_of(d, unit);
    if (d->ranks.base.cfg.overlap.enabled) ranks_wait_all(ref->ranks, ref->rank, slot->done);
    if (slot->rank_bf16[ref->rank]) fill_zero_bf16(m->stream, slot->rank_bf16[ref->rank], m->layout.units[unit].size);
    else fill_zero(m->stream, slot->rank_buf[ref->rank], m->layout.units[unit].size);
}

/* After the root's, the last one, the optimizer reads every gradient shard and
 * writes every weight shard, which peers' gathers may still be reading: with
 * overlap, wait here for every rank's part of every collective. */
static void after_backward(void *ctx, int unit) {
    RankRef *ref = ctx;
    Sharded *d = (Sharded *)ref->ranks;
    if (d->ranks.base.sync_grads) rendezvous(ref, "reduce-scatter", unit, reduce_scatter_unit);
    if (unit != 0 || !d->ranks.base.cfg.overlap.enabled) return;
    for (int i = 0; i <= d->pool; i++) {
        ranks_wait_all(ref->ranks, ref->rank, d->slot[i].done);
        if (per_unit_gathers(d)) ranks_wait_all(ref->ranks, ref->rank, d->gather[i].done);
    }
}

/* WEIGHTS_GATHERED_AFTER_STEP: before its forward, a rank waits for its own part of the unit's
 * weight gather (its part alone writes its full weights). */
static void wait_weights(void *ctx, int unit) {
    RankRef *ref = ctx;
    Sharded *d = (Sharded *)ref->ranks;
    if (d->weights_in_flight) stream_wait_event(d->ranks.pg->compute[ref->rank], d->weights_done[unit][ref->rank]);
}

/* Every rank's compute waits for every rank's part of the weight gathers in
 * flight: before anything but a forward reads the full weights, and before
 * AdamW writes the shards that peers' parts read. */
static void settle_weights(Sharded *d) {
    if (!d->weights_in_flight) return;
    for (int r = 0; r < d->ranks.local; r++)
        for (int u = 0; u < d->ranks.layout->nunits; u++) ranks_wait_all(&d->ranks, r, d->weights_done[u]);
    d->weights_in_flight = 0;
}

/* WEIGHTS_GATHERED_AFTER_STEP: every rank's full weights of unit u (fp32, or
 * the bf16 copy) gathered from the owners' shards; with overlap, under what
 * follows, until a forward or settle_weights waits for it. */
static void gather_weights(Sharded *d, int u) {
    Ranks *ranks = &d->ranks;
    CollectiveName name = { "weights unit", u, u };
    size_t size = ranks->layout->units[u].size;
    int overlap = ranks->base.cfg.overlap.enabled;
    Event *const *done = overlap ? d->weights_done[u] : NULL;
    if (d->copy_bf16) {
        bf16 *shards[MAX_RANKS], *full[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) {
            full[r] = ranks->model[r]->unit_weights_bf16[u];
            shards[r] = ranks->model[r]->params_bf16 + ranks_shard_offset(ranks, u, r);
        }
        pg_all_gather_bf16(ranks->pg, name, shards, full, size, done);
    } else {
        float *shards[MAX_RANKS], *full[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) {
            full[r] = ranks->model[r]->unit_weights[u];
            shards[r] = ranks->model[r]->params + ranks_shard_offset(ranks, u, r);
        }
        pg_all_gather(ranks->pg, name, shards, full, size, DTYPE_FP32, done);
    }
    d->weights_in_flight |= overlap;
}

/* Unit u's weight shard of local rank r: its fp32 weights, or the master. */
static float *weights_of_shard(Sharded *d, int u, int r) {
    if (per_unit_gathers(d) || d->copy_bf16) return d->weight_shard[r] + ranks_shard_arena_offset(&d->ranks, u);
    return d->ranks.model[r]->params + ranks_shard_offset(&d->ranks, u, r);
}

/* Mixed precision's bf16 copy of unit u's shard of local rank r; NULL in fp32. */
static bf16 *copy_of_shard(Sharded *d, int u, int r) {
    Ranks *ranks = &d->ranks;
    if (!d->copy_bf16) return NULL;
    return per_unit_gathers(d) ? d->copy_shard[r] + ranks_shard_arena_offset(ranks, u)
                               : ranks->model[r]->params_bf16 + ranks_shard_offset(ranks, u, r);
}

/* Mixed precision's refresh_copy (ranks.h; a write, the init): each rank
 * rounds its master shards into its bf16 copy; with full weights, every
 * rank's unit is then gathered. */
static void publish_all(Ranks *ranks) {
    Sharded *d = (Sharded *)ranks;
    settle_weights(d);
    for (int u = 0; u < ranks->layout->nunits; u++) {
        size_t len = ranks->layout->units[u].size / (size_t)ranks->shards;
        for (int r = 0; r < ranks->local; r++)
            store_bf16(ranks->pg->compute[r], copy_of_shard(d, u, r), weights_of_shard(d, u, r), len);
        if (!per_unit_gathers(d)) gather_weights(d, u);
    }
}

/* AdamW on every shard a rank owns, a launch a unit (which scales the
 * gradient by the clip's coefficient as it reads it, and in mixed precision
 * also rounds the new weights into the rank's copy); with full weights, each
 * unit gathered once its shards are updated. */
static void step(Strategy *s) {
    Sharded *d = (Sharded *)s;
    Ranks *ranks = &d->ranks;
    const ArenaLayout *layout = ranks->layout;
    settle_weights(d);
    s->adam_step++;
    AdamWParams hp = { s->lr, s->cfg.beta1, s->cfg.beta2, s->cfg.eps, s->cfg.weight_decay, s->adam_step };
    for (int u = 0; u < layout->nunits; u++) {
        for (int r = 0; r < ranks->local; r++) {
            Model *m = ranks->model[r];
            size_t lo = ranks_shard_offset(ranks, u, r), at = ranks_shard_arena_offset(ranks, u);
            adamw_arena(m->stream, weights_of_shard(d, u, r), copy_of_shard(d, u, r),
                        pg_number(ranks->grad_part[r], ranks->grads_held, at), ranks->grads_held, d->ranks.m[r] + at,
                        d->ranks.v[r] + at, lo, layout->units[u].size / ranks->shards, m->adamw_spans,
                        layout->ntensors, hp, ranks_step_clip(ranks, r));
        }
        if (!per_unit_gathers(d)) gather_weights(d, u);
    }
    ranks->clip_max_norm = 0.0f;
}

/* The ops that read or write the full weights outside a forward: after the
 * weight gathers in flight. */
static void settled_read_tensor(Strategy *s, StateOf what, int tensor, float *host) {
    settle_weights((Sharded *)s);
    ranks_read_tensor(s, what, tensor, host);
}

static void settled_write_tensor(Strategy *s, StateOf what, int tensor, const float *host) {
    settle_weights((Sharded *)s);
    ranks_write_tensor(s, what, tensor, host);
}

static size_t settled_count_nonfinite(Strategy *s, NonfiniteOf what) {
    settle_weights((Sharded *)s);
    return ranks_count_nonfinite(s, what);
}

/* Every buffer of a rank: its kind, its length in numbers, and where its
 * pointer goes (fp32 or bf16, one of the two). */
typedef struct { float **fp32; bf16 **bf16; MemKind kind; size_t count; } Buffer;
enum { MAX_BUFFERS = 5 + 2 * (1 + MAX_POOL) };

static size_t buffer_bytes(const Buffer *b) { return b->count * (b->fp32 ? sizeof(float) : sizeof(bf16)); }

static int rank_buffers(Sharded *d, int r, Buffer out[MAX_BUFFERS]) {
    int n = 0;
    if (d->ranks.grads_held == DTYPE_BF16) {
        out[n++] = (Buffer){ NULL, &d->grad_shard_bf16[r], MEM_GRADS, d->part };
        for (int i = 0; i <= d->pool; i++)
            out[n++] = (Buffer){ NULL, &d->slot[i].rank_bf16[r], MEM_WORKING, d->slot[i].floats };
    } else {
        out[n++] = (Buffer){ &d->grad_shard[r], NULL, MEM_GRADS, d->part };
        for (int i = 0; i <= d->pool; i++)
            out[n++] = (Buffer){ &d->slot[i].rank_buf[r], NULL, MEM_WORKING, d->slot[i].floats };
    }
    out[n++] = (Buffer){ &d->ranks.m[r], NULL, MEM_OPTIMIZER, d->part };
    out[n++] = (Buffer){ &d->ranks.v[r], NULL, MEM_OPTIMIZER, d->part };
    if (d->copy_bf16) out[n++] = (Buffer){ &d->weight_shard[r], NULL, MEM_OPTIMIZER, d->part };  /* the master */
    if (per_unit_gathers(d) && d->copy_bf16) {
        out[n++] = (Buffer){ NULL, &d->copy_shard[r], MEM_WEIGHTS, d->part };
        for (int i = 0; i <= d->pool; i++)
            out[n++] = (Buffer){ NULL, &d->gather[i].rank_bf16[r], MEM_WORKING, d->gather[i].floats };
    } else if (per_unit_gathers(d)) {
        out[n++] = (Buffer){ &d->weight_shard[r], NULL, MEM_WEIGHTS, d->part };
        for (int i = 0; i <= d->pool; i++)
            out[n++] = (Buffer){ &d->gather[i].rank_buf[r], NULL, MEM_WORKING, d->gather[i].floats };
    }
    return n;
}

static void destroy(Strategy *s) {
    Sharded *d = (Sharded *)s;
    if (!d) return;
    ranks_synchronize(s);
    for (int r = 0; r < d->ranks.local; r++) {
        Buffer buffers[MAX_BUFFERS];
        int n = rank_buffers(d, r, buffers);
        for (int i = 0; i < n; i++) {
            void *p = buffers[i].fp32 ? (void *)*buffers[i].fp32 : (void *)*buffers[i].bf16;
            device_free(d->ranks.pg->device[r], buffers[i].kind, p, buffer_bytes(&buffers[i]));
        }
    }
    for (int i = 0; i <= d->pool; i++) {
        ranks_events_destroy(&d->ranks, d->slot[i].done);
        ranks_events_destroy(&d->ranks, d->gather[i].done);
    }
    for (int u = 0; u < d->ranks.layout->nunits; u++) ranks_events_destroy(&d->ranks, d->weights_done[u]);
    free(d->weights_done);
    ranks_release(&d->ranks);
    free(d);
}

static const StrategyOps sharded_ops = {
    .set_lr = ranks_set_lr, .forward_backward = ranks_forward_backward, .clip_grads = ranks_clip_grads,
    .step = step, .train_loss = ranks_train_loss, .eval_loss = ranks_eval_loss, .generate = ranks_generate,
    .read_tensor = settled_read_tensor, .write_tensor = settled_write_tensor, .rank_bytes = ranks_rank_bytes,
    .rank_peak_bytes = ranks_rank_peak_bytes, .destroy = destroy,
    .count_nonfinite = settled_count_nonfinite, .synchronize = ranks_synchronize,
};

Strategy *sharded_create(const StrategyKind *kind, const StrategyConfig *cfg) {
    Sharded *d = host_calloc(1, sizeof *d);
    Ranks *ranks = &d->ranks;
    if (ranks_init(ranks, cfg, &sharded_ops, kind) != 0) {
        free(d);
        return NULL;
    }
    const ArenaLayout *layout = ranks->layout;
    d->weights = kind->shards_weights ? WEIGHTS_GATHERED_PER_UNIT : WEIGHTS_GATHERED_AFTER_STEP;
    d->copy_bf16 = cfg->precision == DTYPE_BF16;
    d->pool = cfg->overlap.enabled ? strategy_live_units(cfg) : 1;
    d->part = layout->total / (size_t)ranks->shards;
    size_t unit_size = 0;  /* the largest unit's, but the root's */
    for (int u = 1; u < layout->nunits; u++)
        if (layout->units[u].size > unit_size) unit_size = layout->units[u].size;
    for (int i = 0; i <= d->pool; i++) {
        d->slot[i].floats = d->gather[i].floats = i == 0 ? layout->units[0].size : unit_size;
        ranks_events_create(ranks, d->slot[i].done);
        ranks_events_create(ranks, d->gather[i].done);
    }
    d->weights_done = host_calloc((size_t)layout->nunits, sizeof *d->weights_done);
    for (int u = 0; u < layout->nunits; u++) ranks_events_create(ranks, d->weights_done[u]);
    for (int r = 0; r < ranks->local; r++) {
        Model *m = ranks->model[r];
        Buffer buffers[MAX_BUFFERS];
        int n = rank_buffers(d, r, buffers);
        for (int i = 0; i < n; i++) {
            void *p = device_alloc(m->dev, buffers[i].kind, buffer_bytes(&buffers[i]));
            if (buffers[i].fp32) *buffers[i].fp32 = p;
            else *buffers[i].bf16 = p;
        }
        for (int u = 0; u < layout->nunits; u++) {
            m->unit_grads[u] = slot_of(d, u)->rank_buf[r];
            m->unit_grads_bf16[u] = slot_of(d, u)->rank_bf16[r];
        }
        if (per_unit_gathers(d)) {
            for (int u = 0; u < layout->nunits; u++) {
                m->unit_weights[u] = gather_of(d, u)->rank_buf[r];
                m->unit_weights_bf16[u] = gather_of(d, u)->rank_bf16[r];
            }
            m->hooks.before_forward = before_forward;
        } else {
            if (d->copy_bf16) model_own_weights_bf16(m);
            else model_own_weights(m);
            m->hooks.before_forward = wait_weights;
        }
        ranks->weights[r] = per_unit_gathers(d) || d->copy_bf16 ? d->weight_shard[r] : m->params;
        m->hooks.before_backward = before_backward;
        m->hooks.after_backward = after_backward;
        ranks->grad_part[r] = d->grad_shard_bf16[r] ? (void *)d->grad_shard_bf16[r] : (void *)d->grad_shard[r];
    }
    ranks->weights_held = per_unit_gathers(d) || d->copy_bf16 ? HELD_UNIT_SHARDS : HELD_FULL;
    ranks->adam_held = HELD_UNIT_SHARDS;
    ranks->grad_part_len = d->part;
    ranks->grad_parts_sharded = 1;
    if (d->copy_bf16) ranks->refresh_copy = publish_all;
    ranks_init_weights(ranks);
    return &ranks->base;
}
