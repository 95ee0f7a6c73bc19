/* replicated.c: DDP (--zero=0) and ZeRO-1 (--zero=1): N full replicas.
 *
 * Every rank holds full weights and gradients, in the arena layout padded so each
 * unit splits into N shards; rank r runs its rows of the global batch on its own
 * compute stream with dropout stream r. When the backward is done (the root
 * unit's after_backward hook) the last rank to arrive enqueues, for every rank:
 *   DDP:    an all-reduce of the gradient arena (the mean); every rank then runs
 *           AdamW on everything and the replicas stay identical.
 *   ZeRO-1: a reduce-scatter (rank r gets the mean of its part of the arena);
 *           rank r runs AdamW on its part with m and v for that part only; an
 *           all-gather of the weights makes the replicas identical again.
 * Both reduce with the same kernel, so without clipping they give the same bits.
 */
#include <stdlib.h>

#include "../model/optim.h"
#include "../runtime/host.h"
#include "ranks.h"

typedef struct {
    Ranks ranks;
    int sharded;                   /* 0: DDP, 1: ZeRO-1 */
    size_t total, part;            /* padded arena length; total / N */
    float *m[FIBERS_MAX_RANKS], *v[FIBERS_MAX_RANKS];  /* the owned range's Adam state */
} Replicated;

/* The part of the arena whose optimizer state rank r holds. */
static void owned_range(const Replicated *d, int rank, size_t *lo, size_t *len) {
    *lo = d->sharded ? (size_t)rank * d->part : 0;
    *len = d->sharded ? d->part : d->total;
}

/* Before the backward: gradients start from zero (the model adds into them). */
static void zero_grads(void *ctx, int unit) {
    RankRef *ref = ctx;
    Model *m = ref->ranks->model[ref->rank];
    if (unit == 0) fill_zero(m->stream, m->grads, m->layout.total);
}

/* The collective after the backward, for every rank: the mean gradient. */
static void sync_grads(Ranks *ranks, int unit) {
    (void)unit;
    Replicated *d = (Replicated *)ranks;
    float *grads[FIBERS_MAX_RANKS];
    for (int r = 0; r < ranks->nranks; r++) grads[r] = ranks->model[r]->grads;
    float mean = 1.0f / (float)ranks->nranks;
    if (d->sharded) {
        float *parts[FIBERS_MAX_RANKS];
        for (int r = 0; r < ranks->nranks; r++) parts[r] = grads[r] + (size_t)r * d->part;
        pg_reduce_scatter(ranks->pg, grads, parts, d->total, mean);
    } else {
        pg_all_reduce(ranks->pg, grads, d->total, mean);
    }
}

static void after_backward(void *ctx, int unit) {
    RankRef *ref = ctx;
    if (unit == 0) ranks_rendezvous(ref->ranks, ref->rank, "gradients", sync_grads, 0);
}

static int forward_backward(Strategy *s, const int *x, const int *y, uint32_t step) {
    return ranks_run((Ranks *)s, x, y, step, 1);
}

/* AdamW on each rank's owned range; ZeRO-1 then gathers the weights. */
static void step(Strategy *s) {
    Replicated *d = (Replicated *)s;
    Ranks *ranks = &d->ranks;
    s->adam_step++;
    AdamWParams hp = { s->lr, s->cfg.beta1, s->cfg.beta2, s->cfg.eps, s->cfg.weight_decay, s->adam_step };
    for (int r = 0; r < ranks->nranks; r++) {
        Model *g = ranks->model[r];
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        adamw_range(g->stream, ranks->layout, lo, len, g->params + lo, g->grads + lo, d->m[r], d->v[r], hp);
    }
    if (d->sharded) {
        float *params[FIBERS_MAX_RANKS], *parts[FIBERS_MAX_RANKS];
        for (int r = 0; r < ranks->nranks; r++) {
            params[r] = ranks->model[r]->params;
            parts[r] = params[r] + (size_t)r * d->part;
        }
        pg_all_gather(ranks->pg, parts, params, d->total);
    }
}

static void destroy(Strategy *s) {
    Replicated *d = (Replicated *)s;
    if (!d) return;
    for (int r = 0; r < d->ranks.nranks; r++) {
        stream_synchronize(d->ranks.pg->compute[r]);
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        device_free(d->ranks.pg->device[r], MEM_OPTIMIZER, d->m[r], len * sizeof(float));
        device_free(d->ranks.pg->device[r], MEM_OPTIMIZER, d->v[r], len * sizeof(float));
    }
    ranks_release(&d->ranks);
    free(d);
}

static const StrategyOps replicated_ops = {
    ranks_set_lr, forward_backward, ranks_clip_grads, step, ranks_train_loss, ranks_eval_loss,
    ranks_generate, ranks_read_weights, ranks_write_weights, ranks_rank_bytes, destroy,
};

static Strategy *replicated_create(const StrategyConfig *cfg, int sharded) {
    Replicated *d = host_calloc(1, sizeof *d);
    Ranks *ranks = &d->ranks;
    if (ranks_init(ranks, cfg, &replicated_ops, sharded ? "ZeRO-1" : "DDP") != 0) {
        free(d);
        return NULL;
    }
    d->sharded = sharded;
    d->total = ranks->layout->total;
    d->part = d->total / (size_t)ranks->nranks;
    for (int r = 0; r < ranks->nranks; r++) {
        Model *g = ranks->model[r];
        model_own_weights(g);
        model_own_grads(g);
        g->hooks.before_backward = zero_grads;
        g->hooks.after_backward = after_backward;
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        d->m[r] = device_alloc(g->dev, MEM_OPTIMIZER, len * sizeof(float));
        d->v[r] = device_alloc(g->dev, MEM_OPTIMIZER, len * sizeof(float));
        ranks->weights[r] = g->params;
        ranks->grad_part[r] = g->grads + lo;
    }
    ranks->grad_part_len = sharded ? d->part : d->total;
    ranks->grad_parts_sharded = sharded;
    ranks_init_weights(ranks);
    return &d->ranks.base;
}

Strategy *ddp_create(const StrategyConfig *cfg) { return replicated_create(cfg, 0); }
Strategy *zero1_create(const StrategyConfig *cfg) { return replicated_create(cfg, 1); }
