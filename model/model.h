/* model.h: what a strategy sees of a model, whichever model it is.
 *
 * Parameters are laid out unit by unit in one arena (runtime/arena.h). A model
 * reads unit u's weights through unit_weights[u] and writes unit u's gradient
 * through unit_grads[u]; a strategy points these into arenas (model_own_*), or
 * redirects them from its hooks to a gather buffer or a gradient slot. The hooks
 * run on the host, at unit boundaries, as the model enqueues its work:
 *
 *     forward:  before_forward(0), before_forward(1), ..., before_forward(L)
 *     backward: before_backward(0), before_backward(L), after_backward(L), ...,
 *               before_backward(1), after_backward(1), after_backward(0)
 *
 * Unit 0, the root, holds the token embedding tied to the output head, so it is
 * first in and last out of the backward, and its gradient completes last.
 *
 * Two models implement this: nanoGPT's GPT (model/gpt.h), and a small MLP
 * (model/mlp.h) that the strategy gates run as well.
 */
#ifndef ZF_MODEL_H
#define ZF_MODEL_H

#include <stdint.h>

#include "../runtime/arena.h"
#include "../runtime/device.h"

typedef enum { MODEL_GPT, MODEL_MLP } ModelKind;

/* The GPT's shape. The MLP reads vocab, block_size (positions per row), layers
 * and embd (its width); kind comes last, so that a zeroed config is a GPT. */
typedef struct {
    int vocab;       /* V */
    int block_size;  /* maximum T */
    int layers;      /* L */
    int heads;       /* NH */
    int embd;        /* C */
    ModelKind kind;
} ModelConfig;

/* Called at unit boundaries; any may be NULL. */
typedef struct {
    void (*before_forward)(void *ctx, int unit);
    void (*before_backward)(void *ctx, int unit);
    void (*after_backward)(void *ctx, int unit);
    void *ctx;
} UnitHooks;

typedef struct Model Model;

/* One buffer of a model's activations: where its pointer goes, and its floats. */
typedef struct {
    float **ptr;
    size_t floats;
} ActivationSlot;

typedef struct {
    /* Enqueue the forward over host tokens/targets [B*T] (targets may be NULL;
     * they are staged, so the host arrays may change once it returns).
     * training = 1 applies dropout with this step's masks. */
    void (*forward)(Model *m, const int *tokens, const int *targets, int B, int T,
                    uint32_t step, int training);
    /* Enqueue the backward of the last forward (which had targets), adding
     * d(mean loss) * dloss into the unit gradients. */
    void (*backward)(Model *m, float dloss);
    /* Free the model itself (model_destroy frees what the base holds). */
    void (*destroy)(Model *m);
} ModelOps;

struct Model {
    const ModelOps *ops;
    ModelConfig cfg;
    ArenaLayout layout;
    Device *dev;
    Stream *stream;                /* compute stream: every op of this model */
    float *params, *grads;         /* full arenas from model_own_*, or NULL */
    float **unit_weights;          /* [nunits] where each unit's weights are read */
    float **unit_grads;            /* [nunits] where each unit's gradient goes */
    float *mean_loss;              /* [1] on the device: the last forward's mean loss */
    float *acts_memory;            /* every activation, one allocation (model_alloc_activations) */
    size_t acts_floats;
    int *tokens, *targets;         /* device copies of the batch, [positions] */
    size_t positions;              /* the most a forward takes: max B x max T */
    int *upload;                   /* host staging of the batch (pinned on a GPU): tokens, then targets */
    Event *uploaded;               /* the last upload from it is done */
    /* the reductions' scratch (MEM_WORKING), made once so that no step allocates */
    float *layernorm_scratch;      /* layernorm_scratch_floats(positions, embd) */
    double *sumsq_scratch;         /* sumsq_scratch_doubles(layout.total): any part of the gradient */
    UnitHooks hooks;
    /* dropout: keyed by (seed, rank, step, site) */
    float dropout;
    uint32_t seed, rank;
};

/* The unit-by-unit layout, units padded to shard_multiple. */
void model_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout);
/* nanoGPT's init into a host buffer of layout->total floats (padding zeroed):
 * 2-D tensors N(0, 0.02), residual output projections (c_proj) N(0, 0.02 /
 * sqrt(2L)), 1-D tensors (norm weights) 1. */
void model_init_params(const ModelConfig *cfg, const ArenaLayout *layout, uint32_t seed, float *host);

/* A model of cfg->kind with activations for up to max_B x max_T, no arenas. */
Model *model_create(const ModelConfig *cfg, int shard_multiple, Device *dev, Stream *stream,
                    int max_B, int max_T);
/* The base's part of a model's creation: layout and unit tables. */
void model_init(Model *m, const ModelOps *ops, const ModelConfig *cfg, int shard_multiple,
                Device *dev, Stream *stream);
/* One MEM_ACTIVATIONS allocation carved into the table's n buffers (the size
 * table of a model's create), the batch's token buffers for `positions` and
 * their staging, and the reductions' scratch. */
void model_alloc_activations(Model *m, const ActivationSlot *table, int n, size_t positions);
/* Enqueue the copy of a batch's BT tokens (and targets, if any) to the device
 * through the staging buffer; the host arrays may change once it returns. */
void model_upload_batch(Model *m, const int *tokens, const int *targets, size_t BT);
/* Allocate the full weight (MEM_WEIGHTS) or gradient (MEM_GRADS) arena, zeroed,
 * and point every unit into it. */
void model_own_weights(Model *m);
void model_own_grads(Model *m);
void model_destroy(Model *m);

/* Call the hook of that name, if any, for a unit. */
void model_before_forward(Model *m, int unit);
void model_before_backward(Model *m, int unit);
void model_after_backward(Model *m, int unit);

/* Wait for the stream and return the mean loss of the last forward. */
float model_read_loss(Model *m);

#endif
