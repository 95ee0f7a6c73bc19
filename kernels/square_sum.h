/* square_sum.h: a sum of squares held exactly, so that its bits do not depend
 * on the order or the grouping of its terms. The clip's global norm is one:
 * DDP's rank sums the whole gradient and each ZeRO rank its shard, wherever
 * the shards fall, and the sums agree to the bit.
 *
 * The terms: each x's square rounded to a float (x * x, the same bits on any
 * IEEE machine), and 0 below 2^-63 (|x| under about 3.3e-10). The sum is an
 * integer of 256 bits (four words, least significant first) in units of 2^-86,
 * where every term is a whole number of units: nothing rounds.
 *
 * The sum is taken in two steps, so that a thread adds floats, not integers.
 * A term's band is the top 4 bits of its exponent: the terms of one band are
 * multiples of one power of two (2^-23 of the band's smallest) spanning 16
 * binades, so 2^14 of them (a chunk) add exactly in a double's 53 bits, in
 * any order. A chunk's 16 band sums then go into the integer. A term of 2^128
 * or more (|x| of about 2^64 or more, or x not finite) makes the sum
 * infinite, as a float sum's would be. The largest finite term is below 2^128,
 * so 2^37 terms stay below 2^251 units: the top bit is free to mark infinity.
 *
 * The functions compile for the host and, under nvcc, for the GPU too: the
 * CPU's and the GPU's sums are the same integer.
 */
#ifndef ZF_SQUARE_SUM_H
#define ZF_SQUARE_SUM_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SQUARE_SUM_FN static inline __host__ __device__
#else
#define SQUARE_SUM_FN static inline
#endif

enum {
    SQUARE_SUM_WORDS = 4,
    SQUARE_SUM_UNIT_BITS = 86,        /* a unit is 2^-86: 2^-23 of 2^-63, the smallest term */
    SQUARE_SUM_BANDS = 16,
    SQUARE_SUM_BAND_TERMS = 1 << 14,  /* the most terms a band's double holds exactly */
};
#define SQUARE_SUM_INFINITE 0x8000000000000000ull /* the top bit of word 3 */

typedef struct {
    uint64_t word[SQUARE_SUM_WORDS];
} SquareSum;

/* A sum crosses between ranks as the bytes of this many floats: a gather
 * copies them unchanged. */
enum { SQUARE_SUM_FLOATS = SQUARE_SUM_WORDS * 2 };

SQUARE_SUM_FN SquareSum square_sum_zero(void) {
    SquareSum s = { { 0, 0, 0, 0 } };
    return s;
}

SQUARE_SUM_FN int square_sum_infinite(SquareSum s) { return (s.word[3] & SQUARE_SUM_INFINITE) != 0; }

SQUARE_SUM_FN SquareSum square_sum_infinity(void) {
    SquareSum s = { { 0, 0, 0, SQUARE_SUM_INFINITE } };
    return s;
}

/* a + b, exactly; infinite where either is. Each word's carry goes into the
 * next: a word's sum wrapped below what it added exactly where it carried. */
SQUARE_SUM_FN SquareSum square_sum_add(SquareSum a, SquareSum b) {
    if (square_sum_infinite(a) || square_sum_infinite(b)) return square_sum_infinity();
    SquareSum s;
    uint64_t carry = 0;
    for (int w = 0; w < SQUARE_SUM_WORDS; w++) {
        uint64_t t = a.word[w] + b.word[w];
        uint64_t carried = t < b.word[w];
        s.word[w] = t + carry;
        carry = carried | (s.word[w] < carry);
    }
    return s;
}

/* x's term: x * x as a float, 0 below 2^-63 (a NaN stays NaN). */
SQUARE_SUM_FN float square_term(float x) {
    float square = x * x;
    return square < 0x1p-63f ? 0.0f : square;
}

/* A term's band: the top 4 bits of its exponent (15 holds the infinite and
 * the NaN, which square_term_finite tells apart). */
SQUARE_SUM_FN int square_band(float term) {
    uint32_t bits;
    memcpy(&bits, &term, sizeof bits);
    return (int)((bits >> 27) & 0xFu);
}

SQUARE_SUM_FN int square_term_finite(float term) { return term <= FLT_MAX; }

/* A band's sum as the integer: a double that is a whole number of units
 * (a sum of one band's terms), d = mantissa * 2^exponent, shifted to bit
 * exponent + 86: its lowest bit at most bit 176, so it lands in words 0 to 3. */
SQUARE_SUM_FN SquareSum square_sum_of_band(double d) {
    SquareSum s = square_sum_zero();
    if (d == 0.0) return s;
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    uint64_t mantissa = (bits & 0xFFFFFFFFFFFFFull) | 0x10000000000000ull;  /* d is normal: at least 2^-86 */
    int at = (int)(bits >> 52) - 1075 + SQUARE_SUM_UNIT_BITS;
    if (at < 0) {  /* the bits shifted out are zeros: d is whole in units */
        s.word[0] = mantissa >> -at;
        return s;
    }
    int word = at / 64, shift = at % 64;
    for (int w = 0; w < SQUARE_SUM_WORDS; w++) {
        uint64_t low = w == word ? mantissa << shift : 0;
        uint64_t high = w == word + 1 && shift ? mantissa >> (64 - shift) : 0;
        s.word[w] = low | high;
    }
    return s;
}

/* A chunk's sum: its band sums (each of at most SQUARE_SUM_BAND_TERMS terms)
 * into the integer, infinite where a term was not finite. */
SQUARE_SUM_FN SquareSum square_sum_of_bands(const double band[SQUARE_SUM_BANDS], int finite) {
    if (!finite) return square_sum_infinity();
    SquareSum s = square_sum_zero();
    for (int b = 0; b < SQUARE_SUM_BANDS; b++) s = square_sum_add(s, square_sum_of_band(band[b]));
    return s;
}

/* The sum as a double (infinite where it is): each word's value, the highest
 * first, each rounded as the conversion and the adds round, the same on both
 * backends. */
SQUARE_SUM_FN double square_sum_value(SquareSum s) {
    if (square_sum_infinite(s)) return INFINITY;
    double value = 0.0;
    for (int w = SQUARE_SUM_WORDS - 1; w >= 0; w--)
        value += ldexp((double)s.word[w], 64 * w - SQUARE_SUM_UNIT_BITS);
    return value;
}

#endif
