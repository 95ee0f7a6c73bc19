/* replicated.c: DDP (--zero=0) and ZeRO-1 (--zero=1): N full replicas.
 *
 * Every rank holds full weights and gradients, in the arena layout padded so each
 * unit splits into N shards; rank r runs its rows of the global batch on its own
 * compute stream with dropout stream r. The last rank to arrive at a rendezvous
 * enqueues, for every rank:
 *   DDP:    all-reduces of the gradient (the mean), bucket by bucket; every rank
 *           then runs AdamW on everything and the replicas stay identical.
 *   ZeRO-1: when the backward is done, a reduce-scatter (rank r gets the mean of
 *           its part of the arena); rank r runs AdamW on its part with m and v
 *           for that part only; an all-gather of the weights makes the replicas
 *           identical again.
 * DDP's buckets are PyTorch's (buckets.h), each all-reduced on the
 * communication stream as soon as its last tensor's gradient is done (the
 * model's grad_done hook, whatever --unit is), while the backward of the
 * tensors below goes on; the last bucket holds the root, done last. The compute streams wait for them
 * all only at the end.
 * Without overlap there is one bucket, the whole arena, all-reduced at the end.
 * Every sum runs in the same kernel, element by element in rank order, so the
 * buckets, overlap and ZeRO-1 all give the same bits.
 *
 * In bf16 (--dtype) each rank holds the ZeRO paper's mixed-precision weights:
 * the fp32 master weights of what it owns (DDP: all; ZeRO-1: its part of the
 * arena), counted with Adam's m and v, and the full compute copy in bf16
 * (2 bytes a number). AdamW updates the master, each rank rounds its owned
 * range into its copy, and ZeRO-1 gathers the copy in bf16; the model widens
 * what it reads, the master's values rounded as it would round them itself.
 * Reduced in bf16 too (--reduce-dtype), the gradient arena is bf16 (the
 * paper's 2 bytes): the model adds into it in bf16, and the buckets and the
 * arena are reduced as the 16-bit numbers they are (ranks.h's grads_held).
 */
#include <stdlib.h>

#include "../model/optim.h"
#include "../runtime/host.h"
#include "buckets.h"
#include "ranks.h"

/* A range of the arena, all-reduced once its lowest tensor's gradient is done
 * (the root's: once the backward is). */
typedef struct {
    size_t offset, length;
    int unit;                          /* of that tensor, for the trace */
    Event *done[MAX_RANKS];     /* each rank's part of its all-reduce (overlap) */
} Bucket;

typedef struct {
    Ranks ranks;
    int shards_adam;               /* the kind's: 0 DDP, 1 ZeRO-1 */
    int copy_bf16;                 /* mixed precision: the compute copy in bf16 */
    float *master[MAX_RANKS];      /* copy_bf16's fp32 master weights of the owned range */
    size_t total, part;            /* padded arena length; total / S (the shards: N, or --shard-ranks) */
    int nbuckets;                  /* DDP */
    Bucket bucket[ARENA_MAX_TENSORS];
    int bucket_ending_at[ARENA_MAX_TENSORS];  /* the bucket a tensor's grad_done finishes, or -1 */
} Replicated;

/* DDP's buckets (buckets.h), and the bucket each tensor's grad_done completes. */
static void plan_buckets(Replicated *d, const StrategyConfig *cfg) {
    const ArenaLayout *layout = d->ranks.layout;
    BucketSpan plan[ARENA_MAX_TENSORS];
    d->nbuckets = ddp_plan_buckets(layout, cfg->overlap.bucket_bytes, cfg->overlap.enabled, plan);
    for (int t = 0; t < layout->ntensors; t++) d->bucket_ending_at[t] = -1;
    for (int k = 0; k < d->nbuckets; k++) {
        Bucket *b = &d->bucket[k];
        b->offset = plan[k].offset;
        b->length = plan[k].length;
        b->unit = layout->tensors[plan[k].last_tensor].unit;
        d->bucket_ending_at[plan[k].last_tensor] = k;
    }
}

/* The part of the arena whose optimizer state local rank r holds. */
static void owned_range(const Replicated *d, int rank, size_t *lo, size_t *len) {
    *lo = d->shards_adam ? (size_t)ranks_shard_of(&d->ranks, rank) * d->part : 0;
    *len = d->shards_adam ? d->part : d->total;
}

/* Before a step's first backward: gradients start from zero (the model adds
 * into them, over the micro-steps too). */
static void zero_grads(void *ctx, int unit) {
    RankRef *ref = ctx;
    Model *m = ref->ranks->model[ref->rank];
    if (unit != 0 || ref->ranks->micro != 0) return;
    if (m->grads_bf16) fill_zero_bf16(m->stream, m->grads_bf16, m->layout.total);
    else fill_zero(m->stream, m->grads, m->layout.total);
}

/* DDP: the mean of a bucket's gradients, on every rank. */
static void all_reduce_bucket(Ranks *ranks, CollectiveName name) {
    Replicated *d = (Replicated *)ranks;
    Bucket *b = &d->bucket[name.index];
    float scale = 1.0f / (float)ranks->nranks;
    Event *const *done = ranks->base.cfg.overlap.enabled ? b->done : NULL;
    if (ranks->grads_held == DTYPE_BF16) {
        bf16 *grads[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) grads[r] = ranks->model[r]->grads_bf16 + b->offset;
        pg_all_reduce_bf16(ranks->pg, name, grads, b->length, scale, done);
        return;
    }
    float *grads[MAX_RANKS];
    for (int r = 0; r < ranks->local; r++) grads[r] = ranks->model[r]->grads + b->offset;
    pg_all_reduce(ranks->pg, name, grads, b->length, scale, ranks->base.cfg.reduce_precision, done);
}

/* ZeRO-1: rank r gets the mean of its part of the arena. */
static void reduce_scatter_arena(Ranks *ranks, CollectiveName name) {
    Replicated *d = (Replicated *)ranks;
    float scale = 1.0f / (float)ranks->nranks;
    if (ranks->grads_held == DTYPE_BF16) {
        bf16 *grads[MAX_RANKS], *parts[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) {
            grads[r] = ranks->model[r]->grads_bf16;
            parts[r] = ranks->grad_part[r];
        }
        pg_reduce_scatter_bf16(ranks->pg, name, grads, parts, d->total, scale, REDUCE_WRITE, NULL);
        return;
    }
    float *grads[MAX_RANKS], *parts[MAX_RANKS];
    for (int r = 0; r < ranks->local; r++) {
        grads[r] = ranks->model[r]->grads;
        parts[r] = ranks->grad_part[r];
    }
    pg_reduce_scatter(ranks->pg, name, grads, parts, d->total, scale, ranks->base.cfg.reduce_precision, REDUCE_WRITE,
                      NULL);
}

/* no_sync until the last micro-step */
static int syncs_now(const Replicated *d) {
    return d->ranks.base.sync_grads && d->ranks.micro == d->ranks.micros - 1;
}

/* DDP: the bucket that tensor's gradient completes, if any, is all-reduced. */
static void grad_done(void *ctx, int tensor) {
    RankRef *ref = ctx;
    Replicated *d = (Replicated *)ref->ranks;
    int k = d->bucket_ending_at[tensor];
    if (k < 0 || !syncs_now(d)) return;
    CollectiveName name = { "bucket", k, d->bucket[k].unit };
    ranks_rendezvous(ref->ranks, ref->rank, name, "all-reduce", all_reduce_bucket);
}

/* The root's gradient completes the backward: ZeRO-1's reduce-scatter, or
 * DDP's last bucket, after which the optimizer reads every bucket. */
static void after_backward(void *ctx, int unit) {
    RankRef *ref = ctx;
    Replicated *d = (Replicated *)ref->ranks;
    if (unit != 0 || !syncs_now(d)) return;
    if (d->shards_adam) {
        ranks_rendezvous(ref->ranks, ref->rank, (CollectiveName){ "arena", -1, -1 }, "reduce-scatter",
                         reduce_scatter_arena);
        return;
    }
    grad_done(ref, 0);  /* the root's bucket ends at tensor 0 */
    if (d->ranks.base.cfg.overlap.enabled)
        for (int i = 0; i < d->nbuckets; i++) ranks_wait_all(ref->ranks, ref->rank, d->bucket[i].done);
}

/* The weights of local rank r's owned range: its fp32 weights, or the master. */
static float *owned_weights(Replicated *d, int r) {
    size_t lo, len;
    owned_range(d, r, &lo, &len);
    return d->copy_bf16 ? d->master[r] : d->ranks.model[r]->params + lo;
}

/* Mixed precision's bf16 copy of rank r's owned range; NULL in fp32. */
static bf16 *owned_copy(Replicated *d, int r) {
    size_t lo, len;
    owned_range(d, r, &lo, &len);
    return d->copy_bf16 ? d->ranks.model[r]->params_bf16 + lo : NULL;
}

/* The owned ranges and their copies are new: ZeRO-1 gathers every rank's
 * part of the weights (fp32, or the bf16 copy). */
static void gather_owned(Ranks *ranks) {
    Replicated *d = (Replicated *)ranks;
    CollectiveName name = { "weights", -1, -1 };
    if (!d->shards_adam) return;
    if (d->copy_bf16) {
        bf16 *full[MAX_RANKS], *parts[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) {
            full[r] = ranks->model[r]->params_bf16;
            parts[r] = full[r] + (size_t)ranks_shard_of(ranks, r) * d->part;
        }
        pg_all_gather_bf16(ranks->pg, name, parts, full, d->total, NULL);
    } else {
        float *full[MAX_RANKS], *parts[MAX_RANKS];
        for (int r = 0; r < ranks->local; r++) {
            full[r] = ranks->model[r]->params;
            parts[r] = full[r] + (size_t)ranks_shard_of(ranks, r) * d->part;
        }
        pg_all_gather(ranks->pg, name, parts, full, d->total, DTYPE_FP32, NULL);
    }
}

/* Mixed precision's refresh_copy (a write or the init): each rank rounds its
 * master into its copy, then the copies are gathered. */
static void publish(Ranks *ranks) {
    Replicated *d = (Replicated *)ranks;
    for (int r = 0; r < ranks->local; r++) {
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        store_bf16(ranks->pg->compute[r], owned_copy(d, r), d->master[r], len);
    }
    gather_owned(ranks);
}

/* AdamW on each rank's owned range in one launch, which scales the gradient
 * by the clip's coefficient as it reads it and in mixed precision also
 * rounds the new weights into the rank's copy; then gathered. */
static void step(Strategy *s) {
    Replicated *d = (Replicated *)s;
    Ranks *ranks = &d->ranks;
    s->adam_step++;
    AdamWParams hp = { s->lr, s->cfg.beta1, s->cfg.beta2, s->cfg.eps, s->cfg.weight_decay, s->adam_step };
    for (int r = 0; r < ranks->local; r++) {
        Model *m = ranks->model[r];
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        adamw_arena(m->stream, owned_weights(d, r), owned_copy(d, r), ranks->grad_part[r], ranks->grads_held,
                    d->ranks.m[r], d->ranks.v[r], lo, len, m->adamw_spans, m->layout.ntensors, hp,
                    ranks_step_clip(ranks, r));
    }
    ranks->clip_max_norm = 0.0f;
    gather_owned(ranks);
}

static void destroy(Strategy *s) {
    Replicated *d = (Replicated *)s;
    if (!d) return;
    ranks_synchronize(s);
    for (int r = 0; r < d->ranks.local; r++) {
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        device_free(d->ranks.pg->device[r], MEM_OPTIMIZER, d->ranks.m[r], len * sizeof(float));
        device_free(d->ranks.pg->device[r], MEM_OPTIMIZER, d->ranks.v[r], len * sizeof(float));
        device_free(d->ranks.pg->device[r], MEM_OPTIMIZER, d->master[r], len * sizeof(float));
    }
    for (int i = 0; i < d->nbuckets; i++) ranks_events_destroy(&d->ranks, d->bucket[i].done);
    ranks_release(&d->ranks);
    free(d);
}

static const StrategyOps replicated_ops = {
    .set_lr = ranks_set_lr, .forward_backward = ranks_forward_backward, .clip_grads = ranks_clip_grads,
    .step = step, .train_loss = ranks_train_loss, .eval_loss = ranks_eval_loss, .generate = ranks_generate,
    .read_tensor = ranks_read_tensor, .write_tensor = ranks_write_tensor, .rank_bytes = ranks_rank_bytes,
    .rank_peak_bytes = ranks_rank_peak_bytes, .destroy = destroy,
    .count_nonfinite = ranks_count_nonfinite, .synchronize = ranks_synchronize,
};

Strategy *replicated_create(const StrategyKind *kind, const StrategyConfig *cfg) {
    Replicated *d = host_calloc(1, sizeof *d);
    Ranks *ranks = &d->ranks;
    int sharded = kind->shards_adam;
    if (ranks_init(ranks, cfg, &replicated_ops, kind) != 0) {
        free(d);
        return NULL;
    }
    d->shards_adam = sharded;
    d->copy_bf16 = cfg->precision == DTYPE_BF16;
    d->total = ranks->layout->total;
    d->part = d->total / (size_t)ranks->shards;
    for (int r = 0; r < ranks->local; r++) {
        Model *m = ranks->model[r];
        if (d->copy_bf16) model_own_weights_bf16(m);
        else model_own_weights(m);
        if (ranks->grads_held == DTYPE_BF16) model_own_grads_bf16(m);
        else model_own_grads(m);
        m->hooks.before_backward = zero_grads;
        m->hooks.after_backward = after_backward;
        if (!sharded) m->hooks.grad_done = grad_done;
        size_t lo, len;
        owned_range(d, r, &lo, &len);
        d->ranks.m[r] = device_alloc(m->dev, MEM_OPTIMIZER, len * sizeof(float));
        d->ranks.v[r] = device_alloc(m->dev, MEM_OPTIMIZER, len * sizeof(float));
        if (d->copy_bf16) d->master[r] = device_alloc(m->dev, MEM_OPTIMIZER, len * sizeof(float));
        ranks->weights[r] = d->copy_bf16 ? d->master[r] : m->params;
        ranks->grad_part[r] = m->grads_bf16 ? (void *)(m->grads_bf16 + lo) : (void *)(m->grads + lo);
    }
    if (!sharded) {
        plan_buckets(d, cfg);
        for (int i = 0; i < d->nbuckets; i++) ranks_events_create(ranks, d->bucket[i].done);
    }
    ranks->adam_held = sharded ? HELD_PARTS : HELD_FULL;
    ranks->weights_held = d->copy_bf16 ? ranks->adam_held : HELD_FULL;
    if (d->copy_bf16) ranks->refresh_copy = publish;
    ranks->grad_part_len = sharded ? d->part : d->total;
    ranks->grad_parts_sharded = sharded;
    ranks_init_weights(ranks);
    return &d->ranks.base;
}
