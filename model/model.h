/* model.h: what a strategy sees of a model, whichever model it is.
 *
 * Parameters are laid out unit by unit in one arena (runtime/arena.h). A model
 * reads unit u's weights through unit_weights[u] and writes unit u's gradient
 * through unit_grads[u]; a strategy points these into arenas (model_own_*), or
 * redirects them from its hooks to a gather buffer or a gradient slot. The hooks
 * run on the host, at unit boundaries, as the model enqueues its work:
 *
 *     forward:  before_forward(0), before_forward(1), ..., before_forward(U)
 *     backward: before_backward(0), before_backward(U), after_backward(U), ...,
 *               before_backward(1), after_backward(1), after_backward(0)
 *
 * and grad_done(t) for each tensor of units 1..U as its gradient completes.
 *
 * Unit 0, the root, holds the token embedding tied to the output head, so it is
 * first in and last out of the backward, and its gradient completes last. The
 * other units cut the blocks as a UnitPolicy says (FSDP's wrapping policy): a
 * unit's hooks come just before the first op that reads its weights in the
 * forward, and around the ops that make its gradient in the backward, so a
 * finer unit is gathered, and its gradient slot held, for less of the step.
 *
 * Two models implement this: nanoGPT's GPT (model/gpt.h), and a small MLP
 * (model/mlp.h) that the strategy gates run as well; model/models.h lays out,
 * creates and estimates either by its kind.
 */
#ifndef ZF_MODEL_H
#define ZF_MODEL_H

#include <stdint.h>

#include "../runtime/bf16.h"
#include "../runtime/arena.h"
#include "../runtime/device.h"
#include "../kernels/adamw.h"
#include "../kernels/token_buckets.h"

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
    int bias;        /* 1: a bias in every Linear and LayerNorm, as GPT-2's (the GPT only) */
    int gelu_tanh;   /* 1: GELU's tanh form, as GPT-2 and transformers' gelu_new; 0: exact, as nanoGPT's (the GPT only) */
} ModelConfig;

/* How the blocks are cut into units: a whole block; its attention half (ln_1,
 * c_attn, c_proj) and its MLP half (ln_2, c_fc, c_proj); or each weight
 * matrix, with the norm before it. The root unit is the same in all three, and
 * so is every tensor's value: only the arena's unit boundaries (and padding)
 * move. A model without such halves (the MLP) has the same units in all three. */
typedef enum { UNIT_BLOCK, UNIT_HALF, UNIT_TENSOR, UNIT_POLICIES } UnitPolicy;

/* How a model computes, beyond its shape (the GPT's; the MLP computes in fp32
 * and keeps everything): recompute = 1 runs each block's forward again inside
 * its backward (model/gpt.h), recompute_gelu = 1 only its GELU,
 * recompute_norms = 1 only its LayerNorms; precision DTYPE_BF16 computes as
 * a bf16 copy of the fp32 weights under torch.autocast(bfloat16) does, and
 * with weights_in_place = 1 reads that copy where its strategy holds it
 * (unit_weights_bf16, every unit's) rather than copying each unit into its
 * own: every tensor is on its operand boundary there (arena.h), so a
 * product reads a weight with the same alignment in every strategy's
 * buffers. With grads_fresh = 1 every unit's gradient is zero as the unit's
 * backward begins (its before_backward hook zeroes it: ZeRO-2/3's gradient
 * slots) and is held in bf16: a bf16 model then writes a weight's gradient
 * made by a product (each Linear's, and the head's) straight into it, where
 * it would make it apart and add it in: 0 + x is x, but for a zero's sign (a
 * sum that rounds to bf16's -0 stays -0, where the add made +0), which AdamW
 * and the clip's norm take alike: the same weights and optimizer state,
 * without the buffers. */
typedef struct {
    int recompute, recompute_gelu, recompute_norms;
    DType precision;
    int weights_in_place;
    int grads_fresh;
} ComputePolicy;

/* Called at unit boundaries; any may be NULL. */
typedef struct {
    void (*before_forward)(void *ctx, int unit);
    void (*before_backward)(void *ctx, int unit);
    void (*after_backward)(void *ctx, int unit);
    /* A tensor of units 1..U has its whole gradient: called as the backward
     * finishes each, in their arena order reversed (the root's tensors are
     * complete at after_backward(0)). DDP's buckets close here, tensor by
     * tensor as PyTorch's per-parameter hooks do, whatever the units. */
    void (*grad_done)(void *ctx, int tensor);
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
     * training = 1 applies dropout with this step's masks, and says that the
     * backward follows: a model may leave the loss to it (the GPT's head). */
    void (*forward)(Model *m, const int *tokens, const int *targets, int B, int T,
                    uint32_t step, int training);
    /* Enqueue the backward of the last forward (which had targets), adding
     * d(mean loss) * dloss into the unit gradients; mean_loss is then the
     * forward's mean loss. */
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
    /* Where a bf16 model (ComputePolicy) reads them instead when a strategy
     * holds its compute copy in bf16, 2 bytes a number (the ZeRO paper's
     * 16-bit weights beside fp32 master weights): [nunits], each NULL until
     * pointed (model_own_weights_bf16, or a gather buffer). */
    bf16 **unit_weights_bf16;
    bf16 *params_bf16;             /* the full bf16 arena from model_own_weights_bf16, or NULL */
    float **unit_grads;            /* [nunits] where each unit's gradient goes */
    /* Where a bf16 model adds it instead when a strategy holds the gradients
     * in bf16 (gradients reduced in bf16: the ZeRO paper's 16-bit
     * gradients): [nunits], each NULL until pointed. */
    bf16 **unit_grads_bf16;
    bf16 *grads_bf16;              /* the full bf16 arena from model_own_grads_bf16, or NULL */
    float *mean_loss;              /* [1] on the device: the last step's mean loss (a training step's once its backward ran) */
    float *acts_memory;            /* every activation, one allocation (model_alloc_activations) */
    size_t acts_floats;
    int *tokens, *targets;         /* device copies of the batch, [positions] */
    uint32_t *step_at;             /* device [1]: the last upload's step, which the dropout masks read (kernels.h) */
    size_t positions;              /* the most a forward takes: max B x max T */
    /* The last batch with targets grouped by token for the embedding's
     * backward (kernels/token_buckets.h): its arrays on the device, in
     * bucket_memory (3 x positions + 1 ints), the tokens padded to positions
     * (token_buckets_pad), so that its count is the same for every batch. */
    TokenBuckets buckets;
    int *bucket_memory;
    int *bucket_counts;            /* host: the sort's vocab + 1 counts */
    /* host staging of the batch (pinned on a GPU): tokens, targets, then the
     * buckets' arrays, laid out as bucket_memory, then the step */
    int *upload;
    Event *uploaded;               /* the last upload from it is done */
    /* the reductions' scratch (MEM_WORKING), made once so that no step allocates */
    float *column_sums_scratch;    /* column_sums_scratch_floats(positions, COLUMN_SUMS_WIDEST x embd) */
    void *sumsq_scratch;           /* sumsq_scratch_bytes(layout.total): any part of the gradient */
    AdamWSpan *adamw_spans;        /* [layout.ntensors] on the device: which elements AdamW decays (optim.h) */
    UnitHooks hooks;
    /* dropout: keyed by (seed, rank, step, site) */
    float dropout;
    uint32_t seed, rank;
};

/* "block", "half", "tensor"; and back (-1 for another name). */
const char *unit_policy_name(UnitPolicy unit);
int unit_policy_parse(const char *name);
/* nanoGPT's init into a host buffer of layout->total floats (padding zeroed):
 * 2-D tensors N(0, 0.02), residual output projections (c_proj) N(0, 0.02 /
 * sqrt(2L)), 1-D tensors (norm weights) 1. */
void model_init_params(const ModelConfig *cfg, const ArenaLayout *layout, uint32_t seed, float *host);
/* Elements [first, first + count) of that init's tensor `tensor` into out: a
 * pure function of the seed and the element, so that each rank initialises
 * its own shards in place (as DeepSpeed's zero.Init) with the same bits. */
void model_init_tensor_part(const ModelConfig *cfg, const ArenaLayout *layout, int tensor, uint32_t seed,
                            size_t first, size_t count, float *out);

/* The base's part of a model's creation: a copy of the layout its caller
 * computed (model/models.h: model_layout_units), and unit tables. */
void model_init(Model *m, const ModelOps *ops, const ModelConfig *cfg, const ArenaLayout *layout, Device *dev,
                Stream *stream);
/* The widest rows whose columns a backward sums, in widths of embd: the MLP's
 * hidden layer (its fc bias), 4 x embd. */
enum { COLUMN_SUMS_WIDEST = 4 };
/* The batch's device ints for `positions` (tokens, targets, their buckets, the step). */
size_t model_batch_ints(size_t positions);
/* One MEM_ACTIVATIONS allocation carved into the table's n buffers (the size
 * table of a model's create), each starting on a 256-byte boundary, the
 * batch's token buffers for `positions` and their staging, the reductions'
 * scratch and AdamW's table of the arena. */
void model_alloc_activations(Model *m, const ActivationSlot *table, int n, size_t positions);
/* The floats that allocation holds for the table's n buffers, the boundaries'
 * padding included. */
size_t model_activation_floats(const ActivationSlot *table, int n);
/* Enqueue the copy of a batch's BT tokens (and targets, if any, with the
 * tokens' buckets) and of its step (into step_at) to the device through the
 * staging buffer; the host arrays may change once it returns. It is
 * model_stage_batch, then the copies. */
void model_upload_batch(Model *m, const int *tokens, const int *targets, size_t BT, uint32_t step);
/* Its host half: the batch and step into the staging buffer, once the last
 * upload from it is done (m->uploaded), and nothing enqueued. A graph that
 * captured a forward runs its copies again from there. */
void model_stage_batch(Model *m, const int *tokens, const int *targets, size_t BT, uint32_t step);
/* Allocate the full weight (MEM_WEIGHTS) or gradient (MEM_GRADS) arena, zeroed,
 * and point every unit into it. */
void model_own_weights(Model *m);
void model_own_grads(Model *m);
/* The same for a full arena of the weights in bf16 (MEM_WEIGHTS, 2 bytes a
 * number), read through unit_weights_bf16; and of the gradients in bf16
 * (MEM_GRADS), through unit_grads_bf16. */
void model_own_weights_bf16(Model *m);
void model_own_grads_bf16(Model *m);
void model_destroy(Model *m);

/* Where tensor t is, through a unit table (unit_weights or unit_grads); and
 * its offset in its unit, for the bf16 tables. */
float *model_tensor(const Model *m, float *const *units, int tensor);
size_t model_tensor_offset(const Model *m, int tensor);
/* Whether tensor t is the first of its unit (it opens it), or the last. */
int model_opens_unit(const Model *m, int tensor);
int model_closes_unit(const Model *m, int tensor);

/* Call the hook of that name, if any, for a unit (a tensor: grad_done). */
void model_before_forward(Model *m, int unit);
void model_before_backward(Model *m, int unit);
void model_after_backward(Model *m, int unit);
void model_grad_done(Model *m, int tensor);

/* Wait for the stream and return the mean loss of the last forward. */
float model_read_loss(Model *m);

#endif
