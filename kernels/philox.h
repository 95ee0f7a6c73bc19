/* philox.h: the Philox 4x32-10 counter-based generator (Salmon et al., 2011).
 *
 * Why counter-based: a random number is a pure function of (key, counter), so a
 * dropout mask element, an init value or a batch row can be drawn on any
 * backend, in any order, and come out the same. Keys name the stream: dropout
 * uses (seed, rank); the other uses below name their own. The functions compile
 * for the host and, under nvcc, for the GPU too (PHILOX_FN).
 */
#ifndef ZF_PHILOX_H
#define ZF_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static inline __host__ __device__
#else
#define PHILOX_FN static inline
#endif

/* key[1] values of the non-dropout streams; dropout uses key[1] = rank < 2^31. */
enum {
    PHILOX_STREAM_INIT = 0x80000001u,
    PHILOX_STREAM_BATCH = 0x80000002u,
    PHILOX_STREAM_SAMPLE = 0x80000003u,
};

typedef struct { uint32_t v[4]; } Philox4;

PHILOX_FN Philox4 philox4x32_10(Philox4 ctr, uint32_t key0, uint32_t key1) {
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * ctr.v[0];
        uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr.v[2];
        Philox4 next = {{
            (uint32_t)(p1 >> 32) ^ ctr.v[1] ^ key0,
            (uint32_t)p1,
            (uint32_t)(p0 >> 32) ^ ctr.v[3] ^ key1,
            (uint32_t)p0,
        }};
        ctr = next;
        key0 += 0x9E3779B9u;
        key1 += 0xBB67AE85u;
    }
    return ctr;
}

/* Uniform in [0, 1) with 24 random bits, exactly representable in fp32. */
PHILOX_FN float philox_uniform(uint32_t bits) {
    return (float)(bits >> 8) * (1.0f / 16777216.0f);
}

#endif
