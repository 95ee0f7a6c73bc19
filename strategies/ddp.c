/* ddp.c: plain data parallelism (--zero=0), for now on one rank.
 *
 * Every rank holds full weights, gradients and Adam m and v. After the backward
 * each rank's gradient is the mean over ranks (on one rank: its own), and every
 * rank runs AdamW on everything, so the replicas stay identical.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../model/optim.h"
#include "strategy.h"

typedef struct {
    Strategy base;
    Device *dev;
    Stream *stream;
    GPT *model;
    float *m, *v;          /* Adam state, arena layout */
    float *grad_sumsq;     /* [1] on the device */
} DDP;

static void ddp_set_lr(Strategy *s, float lr) { s->lr = lr; }

static void ddp_forward_backward(Strategy *s, const int *x, const int *y, uint32_t step) {
    DDP *d = (DDP *)s;
    GPT *g = d->model;
    fill_zero(d->stream, g->grads, g->layout.total);
    gpt_forward(g, x, y, s->cfg.batch, s->cfg.model.block_size, step, 1);
    gpt_backward(g, 1.0f);
}

static void ddp_clip_grads(Strategy *s, float max_norm) {
    DDP *d = (DDP *)s;
    if (max_norm <= 0.0f) return;
    sumsq_reduce(d->stream, d->grad_sumsq, d->model->grads, d->model->layout.total);
    clip_scale(d->stream, d->model->grads, d->model->layout.total, d->grad_sumsq, 1, max_norm);
}

static void ddp_step(Strategy *s) {
    DDP *d = (DDP *)s;
    const ArenaLayout *layout = &d->model->layout;
    s->adam_step++;
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *t = &layout->tensors[i];
        AdamWParams hp = { s->lr, s->cfg.beta1, s->cfg.beta2, s->cfg.eps,
                           tensor_decays(t) ? s->cfg.weight_decay : 0.0f, s->adam_step };
        adamw_update(d->stream, d->model->params + t->offset, d->model->grads + t->offset,
                     d->m + t->offset, d->v + t->offset, t->numel, hp);
    }
}

static float ddp_train_loss(Strategy *s) { return gpt_read_loss(((DDP *)s)->model); }

static float ddp_eval_loss(Strategy *s, const int *x, const int *y) {
    DDP *d = (DDP *)s;
    gpt_forward(d->model, x, y, s->cfg.batch, s->cfg.model.block_size, 0, 0);
    return gpt_read_loss(d->model);
}

static GPT *ddp_sampler(Strategy *s) { return ((DDP *)s)->model; }

static void ddp_read_weights(Strategy *s, float *host) {
    DDP *d = (DDP *)s;
    stream_copy(d->stream, host, d->model->params, d->model->layout.total * sizeof(float));
    stream_synchronize(d->stream);
}

static void ddp_write_weights(Strategy *s, const float *host) {
    DDP *d = (DDP *)s;
    stream_copy(d->stream, d->model->params, host, d->model->layout.total * sizeof(float));
    stream_synchronize(d->stream);
}

static size_t ddp_rank_bytes(Strategy *s, int rank, MemKind kind) {
    (void)rank;
    return device_bytes_in_use(((DDP *)s)->dev, kind);
}

static void ddp_destroy(Strategy *s) {
    DDP *d = (DDP *)s;
    if (!d) return;
    stream_synchronize(d->stream);
    size_t bytes = d->model->layout.total * sizeof(float);
    device_free(d->dev, MEM_OPTIMIZER, d->m, bytes);
    device_free(d->dev, MEM_OPTIMIZER, d->v, bytes);
    device_free(d->dev, MEM_WORKING, d->grad_sumsq, sizeof(float));
    gpt_destroy(d->model);
    stream_destroy(d->stream);
    device_destroy(d->dev);
    free(d);
}

static const StrategyOps ddp_ops = {
    ddp_set_lr, ddp_forward_backward, ddp_clip_grads, ddp_step, ddp_train_loss,
    ddp_eval_loss, ddp_sampler, ddp_read_weights, ddp_write_weights, ddp_rank_bytes, ddp_destroy,
};

Strategy *ddp_create(const StrategyConfig *cfg) {
    if (cfg->nranks != 1) {
        fprintf(stderr, "error: DDP runs on one rank until the process group exists\n");
        return NULL;
    }
    DDP *d = calloc(1, sizeof *d);
    if (!d) { fprintf(stderr, "fatal: out of host memory\n"); abort(); }
    d->base.ops = &ddp_ops;
    d->base.name = "DDP";
    d->base.cfg = *cfg;
    d->dev = device_create_cpu();
    d->stream = stream_create(d->dev);
    d->model = gpt_create(&cfg->model, 1, d->dev, d->stream, cfg->batch, cfg->model.block_size, 1);
    d->model->dropout = cfg->dropout;
    d->model->seed = cfg->seed;
    d->model->rank = 0;
    size_t bytes = d->model->layout.total * sizeof(float);
    d->m = device_alloc(d->dev, MEM_OPTIMIZER, bytes);
    d->v = device_alloc(d->dev, MEM_OPTIMIZER, bytes);
    d->grad_sumsq = device_alloc(d->dev, MEM_WORKING, sizeof(float));
    float *init = malloc(bytes);
    if (!init) { fprintf(stderr, "fatal: out of host memory\n"); abort(); }
    gpt_init_params(&cfg->model, &d->model->layout, cfg->seed, init);
    ddp_write_weights(&d->base, init);
    free(init);
    return &d->base;
}
