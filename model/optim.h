/* optim.h: nanoGPT's learning-rate schedule and which tensors decay. */
#ifndef ZF_OPTIM_H
#define ZF_OPTIM_H

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

#endif
