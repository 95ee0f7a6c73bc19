/* bf16.h: bfloat16, one value's rounding, for the CPU's kernels and the GPU's
 * alike, and for the process group's reductions in bf16 (--reduce-dtype).
 *
 * A bf16 is the top 16 bits of an fp32: the same sign and 8-bit exponent, 7 bits
 * of mantissa. Widening is exact (the low 16 bits zero). Narrowing rounds to
 * nearest, ties to even, as PyTorch's .to(torch.bfloat16) does, bit for bit: a
 * value past the largest bf16 goes to infinity, and a subnormal rounds as any
 * other value. Every NaN becomes the one quiet NaN 0x7FC0, as PyTorch's scalar
 * c10::BFloat16 makes it (its vectorised CPU cast writes 0xFFFF, CUDA's
 * __float2bfloat16 0x7FFF: NaNs all); the GPU's kernels call this too, so both
 * backends write the same bits, but for a NaN out of a cuBLAS product into
 * bf16 (cuBLAS's own conversion: 0x7FFF), which the next op reads as a NaN.
 */
#ifndef ZF_BF16_H
#define ZF_BF16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "dtype.h"

#ifdef __CUDACC__
#define BF16_FN static inline __host__ __device__
#else
#define BF16_FN static inline
#endif

typedef uint16_t bf16;

enum { BF16_QUIET_NAN = 0x7FC0 };

BF16_FN bf16 bf16_from_float(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return BF16_QUIET_NAN;
    uint32_t to_even = 0x7FFFu + ((bits >> 16) & 1u);  /* a tie rounds up only from an odd bf16 */
    return (bf16)((bits + to_even) >> 16);
}

BF16_FN float float_from_bf16(bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* x rounded to the nearest bf16, as an fp32. */
BF16_FN float bf16_rounded(float x) { return float_from_bf16(bf16_from_float(x)); }

/* x rounded so where `rounds` (an op's rounding under autocast), else x. */
BF16_FN float rounded_if(float x, int rounds) { return rounds ? bf16_rounded(x) : x; }

/* Element i of numbers held as `held` says (a gradient's buffer in either
 * dtype), read as an fp32; and written, rounded where it is bf16. */
BF16_FN float number_at(const void *x, DType held, size_t i) {
    return held == DTYPE_BF16 ? float_from_bf16(((const bf16 *)x)[i]) : ((const float *)x)[i];
}

BF16_FN void number_put(void *x, DType held, size_t i, float value) {
    if (held == DTYPE_BF16) ((bf16 *)x)[i] = bf16_from_float(value);
    else ((float *)x)[i] = value;
}

#endif
