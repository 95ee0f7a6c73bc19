/* replicated.c: DDP (--zero=0) and ZeRO-1 (--zero=1): N full replicas.
 *
 * Every rank holds full weights and gradients, in the arena layout padded so each
 * unit splits into N shards; rank r runs its rows of the global batch on its own
 * compute stream with dropout stream r. After the backward the last rank to
 * arrive enqueues, for every rank:
 *   DDP:    an all-reduce of the gradient arena (the mean); every rank then runs
 *           AdamW on everything and the replicas stay identical.
 *   ZeRO-1: a reduce-scatter (rank r gets the mean of its shard); rank r runs
 *           AdamW on its shard with m and v for that shard only; an all-gather of
 *           the weights makes the replicas identical again.
 * Both reduce with the same kernel, so without clipping they give the same bits.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/optim.h"
#include "../runtime/fibers.h"
#include "../runtime/host.h"
#include "../runtime/process_group.h"
#include "strategy.h"

typedef struct {
    Strategy base;
    int sharded;                   /* 0: DDP, 1: ZeRO-1 */
    int nranks;
    ProcessGroup *pg;
    Fibers *fibers;
    ArenaLayout plain_layout;      /* the tensors without padding, as at nranks = 1 */
    size_t total, shard;           /* padded arena length; total / N */
    GPT *model[FIBERS_MAX_RANKS];
    float *m[FIBERS_MAX_RANKS], *v[FIBERS_MAX_RANKS];  /* the owned range's Adam state */
    float *norm_parts[FIBERS_MAX_RANKS];               /* [N] squared-norm partials */
    const int *x, *y;              /* the global batch of the step in flight */
    uint32_t step;
} Replicated;

/* The part of the arena whose optimizer state rank r holds. */
static void owned_range(const Replicated *d, int rank, size_t *lo, size_t *len) {
    *lo = d->sharded ? (size_t)rank * d->shard : 0;
    *len = d->sharded ? d->shard : d->total;
}

static void set_lr(Strategy *s, float lr) { s->lr = lr; }

/* The collective after the backward, for every rank: the mean gradient. */
static void sync_grads(Replicated *d) {
    float *grads[FIBERS_MAX_RANKS];
    for (int r = 0; r < d->nranks; r++) grads[r] = d->model[r]->grads;
    float mean = 1.0f / (float)d->nranks;
    if (d->sharded) {
        float *shards[FIBERS_MAX_RANKS];
        for (int r = 0; r < d->nranks; r++) shards[r] = grads[r] + (size_t)r * d->shard;
        pg_reduce_scatter(d->pg, grads, shards, d->total, mean);
    } else {
        pg_all_reduce(d->pg, grads, d->total, mean);
    }
}

/* One rank's step: its rows forward and backward, then the gradient rendezvous. */
static int rank_step(Fibers *f, int rank, void *ctx) {
    Replicated *d = ctx;
    GPT *g = d->model[rank];
    int B = d->base.cfg.batch, T = d->base.cfg.model.block_size;
    size_t rows = (size_t)rank * B * T;
    fill_zero(g->stream, g->grads, d->total);
    gpt_forward(g, d->x + rows, d->y + rows, B, T, d->step, 1);
    gpt_backward(g, 1.0f);
    int rc = fibers_arrive(f, rank);
    if (rc == 1) {
        sync_grads(d);
        rc = fibers_depart(f, rank);
    }
    return rc < 0 ? -1 : 0;
}

static int forward_backward(Strategy *s, const int *x, const int *y, uint32_t step) {
    Replicated *d = (Replicated *)s;
    d->x = x;
    d->y = y;
    d->step = step;
    if (fibers_run(d->fibers, rank_step, d) == 0) return 0;
    fprintf(stderr, "error: %s\n", fibers_error(d->fibers));
    return -1;
}

/* Clip by the global norm: DDP sums each rank's whole (identical) gradient;
 * ZeRO-1 sums one part per rank and gathers the partials to every rank. */
static void clip_grads(Strategy *s, float max_norm) {
    Replicated *d = (Replicated *)s;
    if (max_norm <= 0.0f) return;
    float *own_part[FIBERS_MAX_RANKS];
    for (int r = 0; r < d->nranks; r++) {
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        own_part[r] = d->norm_parts[r] + (d->sharded ? r : 0);
        sumsq_reduce(d->pg->compute[r], own_part[r], d->model[r]->grads + lo, len);
    }
    if (d->sharded) pg_all_gather(d->pg, own_part, d->norm_parts, (size_t)d->nranks);
    for (int r = 0; r < d->nranks; r++) {
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        clip_scale(d->pg->compute[r], d->model[r]->grads + lo, len, d->norm_parts[r],
                   d->sharded ? d->nranks : 1, max_norm);
    }
}

/* AdamW on each rank's owned range, tensor by tensor (decay for 2-D tensors,
 * also where a shard boundary cuts through one); ZeRO-1 then gathers weights. */
static void step(Strategy *s) {
    Replicated *d = (Replicated *)s;
    const ArenaLayout *layout = &d->model[0]->layout;
    s->adam_step++;
    for (int r = 0; r < d->nranks; r++) {
        GPT *g = d->model[r];
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        for (int i = 0; i < layout->ntensors; i++) {
            const TensorSpec *t = &layout->tensors[i];
            size_t a = t->offset > lo ? t->offset : lo;
            size_t b = t->offset + t->numel < lo + len ? t->offset + t->numel : lo + len;
            if (a >= b) continue;
            AdamWParams hp = { s->lr, s->cfg.beta1, s->cfg.beta2, s->cfg.eps,
                               tensor_decays(t) ? s->cfg.weight_decay : 0.0f, s->adam_step };
            adamw_update(g->stream, g->params + a, g->grads + a, d->m[r] + (a - lo),
                         d->v[r] + (a - lo), b - a, hp);
        }
    }
    if (d->sharded) {
        float *params[FIBERS_MAX_RANKS], *shards[FIBERS_MAX_RANKS];
        for (int r = 0; r < d->nranks; r++) {
            params[r] = d->model[r]->params;
            shards[r] = params[r] + (size_t)r * d->shard;
        }
        pg_all_gather(d->pg, shards, params, d->total);
    }
}

/* Mean over ranks, in rank order, of each rank's mean loss. */
static float mean_loss(Replicated *d) {
    double total = 0.0;
    for (int r = 0; r < d->nranks; r++) total += gpt_read_loss(d->model[r]);
    return (float)(total / d->nranks);
}

static float train_loss(Strategy *s) { return mean_loss((Replicated *)s); }

/* Evaluation is split over the ranks: each runs its rows, without dropout. */
static float eval_loss(Strategy *s, const int *x, const int *y) {
    Replicated *d = (Replicated *)s;
    int B = s->cfg.batch, T = s->cfg.model.block_size;
    for (int r = 0; r < d->nranks; r++) {
        size_t rows = (size_t)r * B * T;
        gpt_forward(d->model[r], x + rows, y + rows, B, T, 0, 0);
    }
    return mean_loss(d);
}

static GPT *sampler(Strategy *s) { return ((Replicated *)s)->model[0]; }

/* Weights move to and from the host in the unpadded layout of one rank. */
static void read_weights(Strategy *s, float *host) {
    Replicated *d = (Replicated *)s;
    GPT *g = d->model[0];
    for (int i = 0; i < g->layout.ntensors; i++)
        stream_copy(g->stream, host + d->plain_layout.tensors[i].offset, g->params + g->layout.tensors[i].offset,
                    g->layout.tensors[i].numel * sizeof(float));
    stream_synchronize(g->stream);
}

static void write_weights(Strategy *s, const float *host) {
    Replicated *d = (Replicated *)s;
    for (int r = 0; r < d->nranks; r++) {
        GPT *g = d->model[r];
        for (int i = 0; i < g->layout.ntensors; i++)
            stream_copy(g->stream, g->params + g->layout.tensors[i].offset, host + d->plain_layout.tensors[i].offset,
                        g->layout.tensors[i].numel * sizeof(float));
        stream_synchronize(g->stream);
    }
}

static size_t rank_bytes(Strategy *s, int rank, MemKind kind) {
    return device_bytes_in_use(((Replicated *)s)->pg->device[rank], kind);
}

static void destroy(Strategy *s) {
    Replicated *d = (Replicated *)s;
    if (!d) return;
    for (int r = 0; r < d->nranks; r++) {
        stream_synchronize(d->pg->compute[r]);
        stream_synchronize(d->pg->comm[r]);
    }
    for (int r = 0; r < d->nranks; r++) {
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        device_free(d->pg->device[r], MEM_OPTIMIZER, d->m[r], len * sizeof(float));
        device_free(d->pg->device[r], MEM_OPTIMIZER, d->v[r], len * sizeof(float));
        device_free(d->pg->device[r], MEM_WORKING, d->norm_parts[r], (size_t)d->nranks * sizeof(float));
        gpt_destroy(d->model[r]);
    }
    fibers_destroy(d->fibers);
    pg_destroy(d->pg);
    free(d);
}

static const StrategyOps replicated_ops = {
    set_lr, forward_backward, clip_grads, step, train_loss, eval_loss, sampler,
    read_weights, write_weights, rank_bytes, destroy,
};

static Strategy *replicated_create(const StrategyConfig *cfg, int sharded) {
    Replicated *d = host_calloc(1, sizeof *d);
    d->base.ops = &replicated_ops;
    d->base.name = sharded ? "ZeRO-1" : "DDP";
    d->base.cfg = *cfg;
    d->sharded = sharded;
    d->nranks = cfg->nranks;
    d->pg = pg_create_simulator(cfg->nranks);
    d->fibers = fibers_create(cfg->nranks);
    if (!d->pg || !d->fibers) {
        pg_destroy(d->pg);
        fibers_destroy(d->fibers);
        free(d);
        return NULL;
    }
    gpt_layout(&cfg->model, 1, &d->plain_layout);
    float *init = host_calloc(d->plain_layout.total, sizeof(float));
    gpt_init_params(&cfg->model, &d->plain_layout, cfg->seed, init);
    for (int r = 0; r < d->nranks; r++) {
        GPT *g = gpt_create(&cfg->model, d->nranks, d->pg->device[r], d->pg->compute[r], cfg->batch,
                            cfg->model.block_size, 1);
        g->dropout = cfg->dropout;
        g->seed = cfg->seed;
        g->rank = (uint32_t)r;
        d->model[r] = g;
    }
    d->total = d->model[0]->layout.total;
    d->shard = d->total / (size_t)d->nranks;
    for (int r = 0; r < d->nranks; r++) {
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        d->m[r] = device_alloc(d->pg->device[r], MEM_OPTIMIZER, len * sizeof(float));
        d->v[r] = device_alloc(d->pg->device[r], MEM_OPTIMIZER, len * sizeof(float));
        d->norm_parts[r] = device_alloc(d->pg->device[r], MEM_WORKING, (size_t)d->nranks * sizeof(float));
    }
    write_weights(&d->base, init);
    free(init);
    return &d->base;
}

Strategy *ddp_create(const StrategyConfig *cfg) { return replicated_create(cfg, 0); }
Strategy *zero1_create(const StrategyConfig *cfg) { return replicated_create(cfg, 1); }
