/* optimizer.c: the AdamW update (with clipping's scale folded in), the
 * squared-norm reduction, and the count of non-finite values that guards steps
 * and saves. A gradient is read as it is held, fp32 or bf16 (runtime/bf16.h's
 * number_at). */
#include <math.h>
#include <stdlib.h>

#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct {
    float *param;
    bf16 *copy;
    const void *grad;
    DType grad_held;
    float *m, *v;
    size_t lo, n;
    const AdamWSpan *spans;
    int nspans;
    AdamWConstants k;
    AdamWClip clip;
} AdamWArgs;

/* The range's part of each span in turn (the GPU finds each element's span:
 * the same arithmetic per element, adamw.h's); the clip's coefficient once,
 * here, where the GPU's threads each work it out alike. */
static void adamw_task(void *p) {
    AdamWArgs *a = p;
    size_t end = a->lo + a->n;
    float coef = a->clip.sumsq ? clip_coefficient(a->clip.sumsq, a->clip.nparts, a->clip.max_norm) : 1.0f;
    for (int t = 0; t < a->nspans; t++) {
        const AdamWSpan *span = &a->spans[t];
        size_t first = span->begin > a->lo ? span->begin : a->lo, last = span->end < end ? span->end : end;
        if (first >= last) continue;
        int decays = span->decays;
        #pragma omp parallel for schedule(static)
        for (size_t j = first - a->lo; j < last - a->lo; j++) {
            float g = clipped_gradient(a->grad, a->grad_held, j, coef);
            a->param[j] = adamw_element(a->k, decays, g, &a->m[j], &a->v[j], a->param[j]);
            if (a->copy) a->copy[j] = bf16_from_float(a->param[j]);
        }
    }
}

void cpu_adamw_arena(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                     size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip) {
    AdamWArgs a = { param, copy, grad, grad_held, m, v, lo, n, spans, nspans, adamw_constants(hp), clip };
    stream_launch(s, adamw_task, &a, sizeof a);
}

/* Fixed chunks (SUMSQ_CHUNK) shared among the threads, each by its band sums
 * (square_sum.h), then the chunks' sums in order, as the GPU's blocks and its
 * last block (the sum is exact: any order would give its bits). */
typedef struct { SquareSum *out; const void *x; DType held; size_t n; SquareSum *partial; } SumsqArgs;

static void sumsq_task(void *p) {
    SumsqArgs *a = p;
    size_t nchunks = (a->n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    SquareSum *partial = a->partial;
    #pragma omp parallel for schedule(static)
    for (size_t chunk = 0; chunk < nchunks; chunk++) {
        size_t end = (chunk + 1) * SUMSQ_CHUNK < a->n ? (chunk + 1) * SUMSQ_CHUNK : a->n;
        enum { TABLES = 8 };  /* a run of terms in one band adds into eight doubles, not one after the other */
        double band[TABLES][SQUARE_SUM_BANDS] = { { 0 } };
        int finite = 1;
        for (size_t i = chunk * SUMSQ_CHUNK; i < end; i++) {
            float term = square_term(number_at(a->x, a->held, i));
            finite &= square_term_finite(term);
            band[i % TABLES][square_band(term)] += term;
        }
        for (int t = 1; t < TABLES; t++)
            for (int b = 0; b < SQUARE_SUM_BANDS; b++) band[0][b] += band[t][b];
        partial[chunk] = square_sum_of_bands(band[0], finite);
    }
    SquareSum total = square_sum_zero();
    for (size_t chunk = 0; chunk < nchunks; chunk++) total = square_sum_add(total, partial[chunk]);
    *a->out = total;
}

void cpu_sumsq_reduce(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch) {
    SumsqArgs a = { out, x, held, n, scratch };
    stream_launch(s, sumsq_task, &a, sizeof a);
}

typedef struct { float *out; const void *x; DType held; size_t n; } CountArgs;

static void count_nonfinite_task(void *p) {
    CountArgs *a = p;
    size_t count = 0;
    #pragma omp parallel for schedule(static) reduction(+ : count)
    for (size_t i = 0; i < a->n; i++) count += !isfinite(number_at(a->x, a->held, i));
    *a->out = (float)count;
}

/* An OpenMP reduction of integers needs no scratch: the count is exact in any order. */
void cpu_count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch) {
    (void)scratch;
    CountArgs a = { out, x, held, n };
    stream_launch(s, count_nonfinite_task, &a, sizeof a);
}
