/* optim.h: nanoGPT's learning-rate schedule, which tensors decay, and the
 * table of them that AdamW reads over any range of the arena. */
#ifndef ZF_OPTIM_H
#define ZF_OPTIM_H

#include "../kernels/kernels.h"
#include "../runtime/arena.h"

typedef struct {
    float lr, min_lr;
    int warmup_iters, decay_iters;
} LRSchedule;

/* Linear warmup to lr over warmup_iters, cosine decay to min_lr at decay_iters,
 * min_lr after (nanoGPT's get_lr). */
float lr_at(const LRSchedule *s, int iter);

/* Weight decay applies to 2-D tensors (matmul weights, embeddings) only. */
static inline int tensor_decays(const TensorSpec *t) { return t->ndim == 2; }

/* AdamW's table of the arena (kernels.h's adamw_arena): spans[i] is tensor
 * i's extent, decaying as tensor_decays says, also where a shard boundary
 * cuts through it; layout->ntensors of them. */
void adamw_spans(const ArenaLayout *layout, AdamWSpan *spans);
static inline size_t adamw_spans_bytes(const ArenaLayout *layout) { return (size_t)layout->ntensors * sizeof(AdamWSpan); }

#endif
