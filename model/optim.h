/* optim.h: nanoGPT's learning-rate schedule, which tensors decay, and AdamW
 * over any range of the arena. */
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

/* AdamW on the arena range [lo, lo + len), tensor by tensor: hp.weight_decay
 * applies only to the 2-D tensors, also where a shard boundary cuts through
 * one; padding between tensors is left alone. params, grads, m and v point at
 * element lo of their buffers; grads hold their numbers as grads_held says. */
void adamw_range(Stream *s, const ArenaLayout *layout, size_t lo, size_t len, float *params,
                 const void *grads, Precision grads_held, float *m, float *v, AdamWParams hp);

#endif
