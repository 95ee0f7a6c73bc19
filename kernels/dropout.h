/* dropout.h: the dropout mask of kernels.h, as a pure function of the element index. */
#ifndef ZF_DROPOUT_H
#define ZF_DROPOUT_H

#include <stddef.h>

#include "kernels.h"
#include "philox.h"

/* scale[k] = the mask value (0 or 1/(1-p)) of element first + k, for k < n.
 * One Philox call covers four consecutive elements. */
static inline void dropout_scales(Dropout d, size_t first, size_t n, float *scale) {
    float keep_scale = 1.0f / (1.0f - d.p);
    size_t k = 0;
    while (k < n) {
        size_t i = first + k;
        Philox4 ctr = {{ (uint32_t)(i >> 2), (uint32_t)(i >> 34), d.site, d.step }};
        Philox4 bits = philox4x32_10(ctr, d.seed, d.rank);
        for (size_t w = i & 3; w < 4 && k < n; w++, k++)
            scale[k] = philox_uniform(bits.v[w]) >= d.p ? keep_scale : 0.0f;
    }
}

#endif
