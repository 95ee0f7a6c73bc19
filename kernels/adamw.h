/* adamw.h: AdamW as torch.optim.AdamW (decoupled weight decay, bias
 * corrections), one element's update for the CPU's loop and the GPU's kernel
 * alike, and the spans that say which elements of an arena decay.
 *
 * The optimizer runs over a range of an arena in one launch (kernels.h's
 * adamw_arena): an element finds its tensor among the arena's spans (in
 * arena order), decays as that tensor does, and an element between tensors
 * (padding) is left alone. Clipping by the global norm is folded into the
 * same pass: each gradient is scaled as it is read (AdamWClip). The functions
 * compile for the host and, under nvcc, for the GPU too.
 */
#ifndef ZF_ADAMW_H
#define ZF_ADAMW_H

#include <math.h>
#include <stddef.h>

#include "../runtime/bf16.h"
#include "square_sum.h"

#ifdef __CUDACC__
#define ADAMW_FN static inline __host__ __device__
#else
#define ADAMW_FN static inline
#endif

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int step;  /* 1 for the first update */
} AdamWParams;

/* A tensor's elements [begin, end) of the arena, and whether it decays. */
typedef struct {
    size_t begin, end;
    int decays;
} AdamWSpan;

/* What every element of one step shares, computed once on the host. */
typedef struct {
    float beta1, beta2, eps, bias_correction2_sqrt, step_size, decay;
} AdamWConstants;

static inline AdamWConstants adamw_constants(AdamWParams hp) {
    float bias_correction1 = 1.0f - powf(hp.beta1, (float)hp.step);
    AdamWConstants k = { hp.beta1, hp.beta2, hp.eps, sqrtf(1.0f - powf(hp.beta2, (float)hp.step)),
                         hp.lr / bias_correction1, 1.0f - hp.lr * hp.weight_decay };
    return k;
}

/* Clipping by the global norm, as torch.nn.utils.clip_grad_norm_ before the
 * step: the squared norm is the exact sum of sumsq[0, nparts) (the ranks'
 * parts), and every gradient is scaled by clip_coefficient where it is
 * below 1. sumsq NULL: no clipping. sumsq is on the stream's device. */
typedef struct {
    const SquareSum *sumsq;
    int nparts;
    float max_norm;
} AdamWClip;

static const AdamWClip NO_CLIP = { NULL, 0, 0.0f };

/* max_norm / (norm + 1e-6), the norm's square the parts' exact sum; at least
 * 1 means the gradient is left as it is. */
ADAMW_FN float clip_coefficient(const SquareSum *sumsq, int nparts, float max_norm) {
    SquareSum total = square_sum_zero();
    for (int p = 0; p < nparts; p++) total = square_sum_add(total, sumsq[p]);
    return max_norm / ((float)sqrt(square_sum_value(total)) + 1e-6f);
}

/* A gradient g, held as `held`, as AdamW takes it: times coef where coef is
 * below 1, and rounded back where it is held in bf16 (as a bf16 tensor's mul_
 * rounds: the same bits as a clipped gradient written back, then read). */
ADAMW_FN float clip_gradient(float g, DType held, float coef) {
    if (coef >= 1.0f) return g;
    return rounded_if(g * coef, held == DTYPE_BF16);
}

/* Element i of a gradient, read as it is held, as AdamW takes it. */
ADAMW_FN float clipped_gradient(const void *grad, DType held, size_t i, float coef) {
    return clip_gradient(number_at(grad, held, i), held, coef);
}

/* The span of spans[0, n) that holds arena element i, or -1 (padding). */
ADAMW_FN int adamw_span_at(const AdamWSpan *spans, int n, size_t i) {
    int lo = 0, hi = n;  /* the first span that ends past i is in [lo, hi] */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (spans[mid].end > i) hi = mid;
        else lo = mid + 1;
    }
    return lo < n && spans[lo].begin <= i ? lo : -1;
}

/* One element's step, in torch's order: m and v moved on, the new weight
 * returned (a tensor that does not decay keeps its weight's factor of 1). */
ADAMW_FN float adamw_element(AdamWConstants k, int decays, float g, float *m, float *v, float param) {
    float mi = *m + (1.0f - k.beta1) * (g - *m);
    float vi = k.beta2 * *v + (1.0f - k.beta2) * g * g;
    float denom = sqrtf(vi) / k.bias_correction2_sqrt + k.eps;
    *m = mi;
    *v = vi;
    return param * (decays ? k.decay : 1.0f) - k.step_size * mi / denom;
}

#endif
