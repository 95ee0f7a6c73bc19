/* inputs.c: the tests' seeded inputs and the pinned host sum (reference.h).
 *
 * Apart from reference.c because it needs no Criterion: a plain program that
 * a test starts (tests/mpi_collectives.c, under mpirun) links it too, and a
 * program linked with Criterion, started from inside a test, takes itself for
 * one of Criterion's sandboxed workers (BXFI_MAP in the environment) and aborts.
 */
#include <math.h>
#include <stdlib.h>

#include "fixtures.h"
#include "reference.h"

void fill_uniform(float *x, size_t n, float lo, float hi, unsigned seed) {
    unsigned long long state = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (size_t i = 0; i < n; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((state >> 40) * (1.0 / 16777216.0));
    }
}

void fill_wide(float *x, size_t n, unsigned seed) {
    fill_uniform(x, n, -1, 1, seed);
    float *exponent = malloc(n * sizeof(float));
    fill_uniform(exponent, n, -12, 12, seed + 7919);
    for (size_t i = 0; i < n; i++) x[i] = ldexpf(x[i], (int)exponent[i]);
    free(exponent);
}

bf16 bf16_pattern(unsigned seed, size_t k) {
    uint32_t x = (uint32_t)seed * 2654435761u ^ (uint32_t)k * 2246822519u;
    x ^= x >> 15;
    x *= 2654435761u;
    return (bf16)(x >> 16);
}

float ordered_sum(float *const *host, int N, size_t i, float scale) {
    float acc = host[0][i];
    for (int q = 1; q < N; q++) acc += host[q][i];
    return acc * scale;
}

/* A bf16 value, as an fp32. */
static float rounded(float x) { return float_from_bf16(bf16_from_float(x)); }

float ordered_sum_in(DType dtype, float *const *host, int N, size_t i, float scale) {
    if (dtype == DTYPE_FP32) return ordered_sum(host, N, i, scale);
    float acc = rounded(host[0][i]);
    for (int q = 1; q < N; q++) {
        float term = rounded(host[q][i]);
        acc = rounded(acc + term);
    }
    return rounded(acc * scale);
}
