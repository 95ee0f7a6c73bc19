/* optim.c: the learning-rate schedule and AdamW over arena ranges (optim.h). */
#include "optim.h"

#include <math.h>

float lr_at(const LRSchedule *s, int iter) {
    if (iter < s->warmup_iters) return s->lr * (float)(iter + 1) / (float)(s->warmup_iters + 1);
    if (iter >= s->decay_iters) return s->min_lr;
    float ratio = (float)(iter - s->warmup_iters) / (float)(s->decay_iters - s->warmup_iters);
    float coeff = 0.5f * (1.0f + cosf((float)M_PI * ratio));
    return s->min_lr + coeff * (s->lr - s->min_lr);
}

void adamw_range(Stream *s, const ArenaLayout *layout, size_t lo, size_t len, float *params,
                 const void *grads, Precision grads_held, float *m, float *v, AdamWParams hp) {
    float decay = hp.weight_decay;
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *t = &layout->tensors[i];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < lo + len ? t->offset + t->numel : lo + len;
        if (a >= b) continue;
        hp.weight_decay = tensor_decays(t) ? decay : 0.0f;
        const void *grad = (const unsigned char *)grads + (a - lo) * number_bytes(grads_held);
        adamw_update(s, params + (a - lo), grad, grads_held, m + (a - lo), v + (a - lo), b - a, hp);
    }
}
