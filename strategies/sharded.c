/* sharded.c: ZeRO-2 (--zero=2) and ZeRO-3 (--zero=3), unit by unit.
 *
 * Rank r owns its shard of every unit (ranks.h): the mean gradient and the
 * Adam state of those shards live in shard arenas of total / N floats. The
 * full gradient of a unit exists only in a gradient slot, for the span of that
 * unit's backward: the root unit has a slot of its own (its gradient completes
 * last, since the token embedding is also the output head), the blocks share
 * one. The unit hooks drive the collectives, the last rank to arrive enqueuing
 * each one for every rank:
 *
 *   before_backward(u)  zero the unit's slot
 *   after_backward(u)   reduce-scatter every rank's slot into the owners'
 *                       shards (the mean); the slot is free again once it ran
 *
 * ZeRO-2 keeps full weights: after AdamW on its shards, every unit's weights
 * are all-gathered. ZeRO-3 keeps only its weight shards, and gathers a unit
 * into a gather buffer before its forward and before its backward:
 *
 *   before_forward(u)   all-gather unit u's weights
 *   before_backward(u)  the same for a block; the root unit, gathered at the
 *                       start of the forward, stays so until the backward ends
 *
 * A collective waits for every rank's compute work so far, and every rank's
 * compute stream waits for the collective (runtime/process_group.h), so a slot
 * or a gather buffer is reused only after the collective that read or wrote it
 * is done, by events, with no host wait. The sums run in the same kernel and
 * the same rank order as DDP's all-reduce, and AdamW is elementwise, so without
 * clipping the weights are bit-identical to DDP's.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../model/optim.h"
#include "../runtime/host.h"
#include "ranks.h"

typedef struct {
    Ranks ranks;
    int stage;                     /* 2 or 3 */
    size_t part;                   /* shard arena length: total / N */
    size_t root_size, block_size;  /* floats of the root unit and of the largest block */
    float *grad_shard[FIBERS_MAX_RANKS];
    float *m[FIBERS_MAX_RANKS], *v[FIBERS_MAX_RANKS];
    float *root_slot[FIBERS_MAX_RANKS], *block_slot[FIBERS_MAX_RANKS];
    /* ZeRO-3 */
    float *weight_shard[FIBERS_MAX_RANKS];
    float *root_gather[FIBERS_MAX_RANKS], *block_gather[FIBERS_MAX_RANKS];
} Sharded;

/* Every rank's weight shard of the unit, gathered into its gather buffer. */
static void gather_unit(Ranks *ranks, int unit) {
    Sharded *d = (Sharded *)ranks;
    float *shards[FIBERS_MAX_RANKS], *full[FIBERS_MAX_RANKS];
    for (int r = 0; r < ranks->nranks; r++) {
        shards[r] = d->weight_shard[r] + ranks_shard_arena_offset(ranks, unit);
        full[r] = ranks->model[r]->unit_weights[unit];
    }
    pg_all_gather(ranks->pg, shards, full, ranks->layout->units[unit].size);
}

/* Every rank's slot of the unit, reduced into the owners' gradient shards. */
static void reduce_scatter_unit(Ranks *ranks, int unit) {
    Sharded *d = (Sharded *)ranks;
    float *slots[FIBERS_MAX_RANKS], *shards[FIBERS_MAX_RANKS];
    for (int r = 0; r < ranks->nranks; r++) {
        slots[r] = ranks->model[r]->unit_grads[unit];
        shards[r] = d->grad_shard[r] + ranks_shard_arena_offset(ranks, unit);
    }
    pg_reduce_scatter(ranks->pg, slots, shards, ranks->layout->units[unit].size, 1.0f / (float)ranks->nranks);
}

static void rendezvous(RankRef *ref, const char *what, int unit, void (*collective)(Ranks *, int)) {
    char name[FIBERS_NAME_MAX];
    snprintf(name, sizeof name, "unit %d %s", unit, what);
    ranks_rendezvous(ref->ranks, ref->rank, name, collective, unit);
}

static void before_forward(void *ctx, int unit) {
    rendezvous(ctx, "gather", unit, gather_unit);
}

static void before_backward(void *ctx, int unit) {
    RankRef *ref = ctx;
    Sharded *d = (Sharded *)ref->ranks;
    Model *m = ref->ranks->model[ref->rank];
    if (d->stage == 3 && unit != 0) rendezvous(ref, "gather", unit, gather_unit);
    fill_zero(m->stream, m->unit_grads[unit], m->layout.units[unit].size);
}

static void after_backward(void *ctx, int unit) {
    rendezvous(ctx, "reduce-scatter", unit, reduce_scatter_unit);
}

static int forward_backward(Strategy *s, const int *x, const int *y, uint32_t step) {
    return ranks_run((Ranks *)s, x, y, step, 1);
}

/* AdamW on every shard a rank owns; ZeRO-2 then gathers every unit's weights. */
static void step(Strategy *s) {
    Sharded *d = (Sharded *)s;
    Ranks *ranks = &d->ranks;
    const ArenaLayout *layout = ranks->layout;
    s->adam_step++;
    AdamWParams hp = { s->lr, s->cfg.beta1, s->cfg.beta2, s->cfg.eps, s->cfg.weight_decay, s->adam_step };
    for (int r = 0; r < ranks->nranks; r++) {
        Model *m = ranks->model[r];
        for (int u = 0; u < layout->nunits; u++) {
            size_t lo = ranks_shard_offset(ranks, u, r), at = ranks_shard_arena_offset(ranks, u);
            float *params = d->stage == 3 ? d->weight_shard[r] + at : m->params + lo;
            adamw_range(m->stream, layout, lo, layout->units[u].size / ranks->nranks, params,
                        d->grad_shard[r] + at, d->m[r] + at, d->v[r] + at, hp);
        }
    }
    if (d->stage == 3) return;
    for (int u = 0; u < layout->nunits; u++) {
        float *shards[FIBERS_MAX_RANKS], *full[FIBERS_MAX_RANKS];
        for (int r = 0; r < ranks->nranks; r++) {
            full[r] = ranks->model[r]->unit_weights[u];
            shards[r] = ranks->model[r]->params + ranks_shard_offset(ranks, u, r);
        }
        pg_all_gather(ranks->pg, shards, full, layout->units[u].size);
    }
}

/* Every buffer of a rank, its kind and its length in floats. */
typedef struct { float **ptr; MemKind kind; size_t floats; } Buffer;

static int rank_buffers(Sharded *d, int r, Buffer out[8]) {
    int n = 0;
    out[n++] = (Buffer){ &d->grad_shard[r], MEM_GRADS, d->part };
    out[n++] = (Buffer){ &d->m[r], MEM_OPTIMIZER, d->part };
    out[n++] = (Buffer){ &d->v[r], MEM_OPTIMIZER, d->part };
    out[n++] = (Buffer){ &d->root_slot[r], MEM_WORKING, d->root_size };
    out[n++] = (Buffer){ &d->block_slot[r], MEM_WORKING, d->block_size };
    if (d->stage == 3) {
        out[n++] = (Buffer){ &d->weight_shard[r], MEM_WEIGHTS, d->part };
        out[n++] = (Buffer){ &d->root_gather[r], MEM_WORKING, d->root_size };
        out[n++] = (Buffer){ &d->block_gather[r], MEM_WORKING, d->block_size };
    }
    return n;
}

static void destroy(Strategy *s) {
    Sharded *d = (Sharded *)s;
    if (!d) return;
    for (int r = 0; r < d->ranks.nranks; r++) {
        stream_synchronize(d->ranks.pg->compute[r]);
        stream_synchronize(d->ranks.pg->comm[r]);
        Buffer buffers[8];
        int n = rank_buffers(d, r, buffers);
        for (int i = 0; i < n; i++)
            device_free(d->ranks.pg->device[r], buffers[i].kind, *buffers[i].ptr, buffers[i].floats * sizeof(float));
    }
    ranks_release(&d->ranks);
    free(d);
}

static const StrategyOps sharded_ops = {
    ranks_set_lr, forward_backward, ranks_clip_grads, step, ranks_train_loss, ranks_eval_loss,
    ranks_generate, ranks_read_weights, ranks_write_weights, ranks_rank_bytes, destroy,
};

static Strategy *sharded_create(const StrategyConfig *cfg, int stage) {
    Sharded *d = host_calloc(1, sizeof *d);
    Ranks *ranks = &d->ranks;
    if (ranks_init(ranks, cfg, &sharded_ops, stage == 3 ? "ZeRO-3" : "ZeRO-2") != 0) {
        free(d);
        return NULL;
    }
    const ArenaLayout *layout = ranks->layout;
    d->stage = stage;
    d->part = layout->total / (size_t)ranks->nranks;
    d->root_size = layout->units[0].size;
    for (int u = 1; u < layout->nunits; u++)
        if (layout->units[u].size > d->block_size) d->block_size = layout->units[u].size;
    for (int r = 0; r < ranks->nranks; r++) {
        Model *m = ranks->model[r];
        Buffer buffers[8];
        int n = rank_buffers(d, r, buffers);
        for (int i = 0; i < n; i++)
            *buffers[i].ptr = device_alloc(m->dev, buffers[i].kind, buffers[i].floats * sizeof(float));
        for (int u = 0; u < layout->nunits; u++) m->unit_grads[u] = u == 0 ? d->root_slot[r] : d->block_slot[r];
        if (stage == 3) {
            for (int u = 0; u < layout->nunits; u++)
                m->unit_weights[u] = u == 0 ? d->root_gather[r] : d->block_gather[r];
            m->hooks.before_forward = before_forward;
            ranks->weights[r] = d->weight_shard[r];
        } else {
            model_own_weights(m);
            ranks->weights[r] = m->params;
        }
        m->hooks.before_backward = before_backward;
        m->hooks.after_backward = after_backward;
        ranks->grad_part[r] = d->grad_shard[r];
    }
    ranks->weights_sharded = stage == 3;
    ranks->grad_part_len = d->part;
    ranks->grad_parts_sharded = 1;
    ranks_init_weights(ranks);
    return &ranks->base;
}

Strategy *zero2_create(const StrategyConfig *cfg) { return sharded_create(cfg, 2); }
Strategy *zero3_create(const StrategyConfig *cfg) { return sharded_create(cfg, 3); }
