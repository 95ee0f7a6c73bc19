/* online_softmax.h: the arithmetic of the classifier's softmax that the CPU and
 * the GPU share, so that both compute its loss and gradient bit for bit.
 *
 * Why: the fused cross-entropy (kernels.h: crossentropy_forward_backward) reads
 * a row of logits once for its max and its sum of exponentials, keeping
 * partials (m, s): the largest logit m seen and the sum s of exp(x - m) over
 * the logits seen, rescaled as m grows (online softmax, Milakov and
 * Gimelshein, 2018). CUDA's expf and glibc's differ in the last bits, so both
 * backends compute exp and log here, from + - * / alone (IEEE-rounded on both;
 * no fused multiply-adds: C11 and -fmad=false; subnormals kept on both), and
 * the results agree bit for bit wherever the order of the merges does
 * (CROSSENTROPY_THREADS): for every finite input (a NaN stays a NaN, its bits
 * each machine's own). The functions compile for the host and, under nvcc,
 * for the GPU too.
 */
#ifndef ZF_ONLINE_SOFTMAX_H
#define ZF_ONLINE_SOFTMAX_H

#include <float.h>
#include <stdint.h>
#include <string.h>

#include "../runtime/bf16.h"

#ifdef __CUDACC__
#define SOFTMAX_FN static inline __host__ __device__
#else
#define SOFTMAX_FN static inline
#endif

/* A row's partials: thread t of a row's block takes logits t, t + THREADS, ...
 * in order, then the partials merge by a fixed tree (stride THREADS / 2, then
 * half as much, ..., 1: partial i takes partial i + stride). The CPU runs the
 * same partials and the same tree. A power of two. */
enum { CROSSENTROPY_THREADS = 256 };

typedef struct {
    float max;  /* m: the largest logit seen; -FLT_MAX before any */
    float sum;  /* s: the sum of exp(x - m) over the logits seen */
} SoftmaxPartial;

SOFTMAX_FN SoftmaxPartial softmax_partial_empty(void) {
    SoftmaxPartial none = { -FLT_MAX, 0.0f };
    return none;
}

/* Logit i of logits held as `held` says, as the op reads it: rounded to bf16
 * where `rounds` (autocast's bf16 head: exact where the logits are held in
 * bf16), else as it is. */
SOFTMAX_FN float softmax_logit(const void *logits, DType held, size_t i, int rounds) {
    return rounded_if(number_at(logits, held, i), rounds);
}

/* A logit as a partial of its own. */
SOFTMAX_FN SoftmaxPartial softmax_partial_of(float logit) {
    SoftmaxPartial one = { logit, 1.0f };
    return one;
}

/* A float's bits, and back (as runtime/bf16.h reads them, on either side). */
SOFTMAX_FN uint32_t bits_of(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

SOFTMAX_FN float float_of(uint32_t bits) {
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* exp(x) for x <= 0 (Cephes' expf, to about 1 ulp): x = n ln2 + r, |r| <= ln2 / 2,
 * exp(r) by its polynomial, times 2^n. Below ln(FLT_MIN) 0 (a probability
 * under 1e-38 is 0 here); -inf gives 0, NaN NaN. */
SOFTMAX_FN float softmax_exp(float x) {
    const float shifter = 12582912.0f;  /* 1.5 * 2^23: adding it rounds to an integer, kept in the low bits */
    float shifted = x * 1.44269504088896341f + shifter;
    float n = shifted - shifter;
    float r = x - n * 0.693359375f;  /* ln 2's first 9 bits: n times it is exact */
    r = r - n * -2.12194440e-4f;     /* the rest of ln 2 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t biased = bits_of(shifted) - bits_of(shifter) + 127u;  /* n + 127, in [1, 127] where used */
    float scaled = p * float_of(biased << 23);
    return x < -87.33654f ? 0.0f : scaled;
}

/* log(x) for x >= 1 (a row's sum of exponentials, whose largest term is 1):
 * x = 2^e * f with f in [sqrt(1/2), sqrt(2)), log f = 2 atanh((f - 1) / (f + 1))
 * by its series, in double, rounded once. inf and NaN come back as they are. */
SOFTMAX_FN float softmax_log(float x) {
    if (!(x < FLT_MAX)) return x;
    uint32_t bits = bits_of(x);
    int e = (int)(bits >> 23) - 127;
    double f = float_of((bits & 0x7fffffu) | 0x3f800000u);  /* in [1, 2) */
    if (f > 1.4142135623730951) {
        f = f * 0.5;
        e = e + 1;
    }
    double z = (f - 1.0) / (f + 1.0), z2 = z * z, series = 0.0;
    for (int k = 15; k >= 1; k -= 2) series = series * z2 + 1.0 / k;
    return (float)(e * 0.6931471805599453 + 2.0 * z * series);
}

/* The partials of two runs of a row as one; the same bits in either order. */
SOFTMAX_FN SoftmaxPartial softmax_merge(SoftmaxPartial a, SoftmaxPartial b) {
    float d = b.max - a.max;
    float scale = softmax_exp(d > 0.0f ? -d : d);  /* exp(-|d|): the smaller max's terms rescaled */
    SoftmaxPartial grown = { b.max, a.sum * scale + b.sum }, kept = { a.max, a.sum + b.sum * scale };
    return d > 0.0f ? grown : kept;
}

/* dloss * (softmax - onehot) at a logit x of a row with max m and sum s. */
SOFTMAX_FN float softmax_grad(float x, SoftmaxPartial row, int is_target, float dloss) {
    float prob = softmax_exp(x - row.max) / row.sum;
    return dloss * (prob - (is_target ? 1.0f : 0.0f));
}

/* -log softmax at the target's logit: from the logits themselves, exact even
 * where the probability underflows. */
SOFTMAX_FN float softmax_loss(float target_logit, SoftmaxPartial row) {
    return softmax_log(row.sum) - (target_logit - row.max);
}

#endif
