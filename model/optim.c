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

void adamw_spans(const ArenaLayout *layout, AdamWSpan *spans) {
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *t = &layout->tensors[i];
        spans[i] = (AdamWSpan){ t->offset, t->offset + t->numel, tensor_decays(t) };
    }
}
