/* dropout.h: the dropout mask of kernels.h, as a pure function of the element index. */
#ifndef ZF_DROPOUT_H
#define ZF_DROPOUT_H

#include <stddef.h>

#include "kernels.h"
#include "philox.h"

/* The site as the op runs: its step read from step_at where that is set
 * (kernels.h), once, at the start of each GPU kernel and CPU task that draws
 * masks, so that their loops take it from a register, not memory. */
PHILOX_FN Dropout dropout_resolved(Dropout d) {
    if (d.step_at && d.p > 0.0f) d.step = *d.step_at;
    d.step_at = NULL;
    return d;
}

/* The Philox output that holds the mask of element i and its three neighbours,
 * of a resolved site (dropout_resolved) or one given its step by value. */
PHILOX_FN Philox4 dropout_bits(Dropout d, size_t i) {
    Philox4 ctr = {{ (uint32_t)(i >> 2), (uint32_t)(i >> 34), d.site, d.step }};
    return philox4x32_10(ctr, d.seed, d.rank);
}

/* The mask value (0 or 1/(1-p)) of element i alone: the GPU's kernels draw
 * each element's by its index (packs.h's pack_number). Its word picked by
 * selects, not an index, which would put the four words in a kernel's local
 * memory. */
PHILOX_FN float dropout_scale_at(Dropout d, size_t i) {
    Philox4 bits = dropout_bits(d, i);
    unsigned w = (unsigned)(i & 3);
    uint32_t word = w == 0 ? bits.v[0] : w == 1 ? bits.v[1] : w == 2 ? bits.v[2] : bits.v[3];
    return philox_uniform(word) >= d.p ? 1.0f / (1.0f - d.p) : 0.0f;
}

/* scale[k] = the mask value of element first + k, for k < n: one Philox call
 * covers four consecutive elements. */
static inline void dropout_scales(Dropout d, size_t first, size_t n, float *scale) {
    float keep_scale = 1.0f / (1.0f - d.p);
    size_t k = 0;
    while (k < n) {
        size_t i = first + k;
        Philox4 bits = dropout_bits(d, i);
        for (size_t w = i & 3; w < 4 && k < n; w++, k++)
            scale[k] = philox_uniform(bits.v[w]) >= d.p ? keep_scale : 0.0f;
    }
}

#endif
