/* optimizer.c: the AdamW update, the squared-norm reduction and the scale for
 * clipping, and the count of non-finite values that guards steps and saves.
 * A gradient is read as it is held, fp32 or bf16 (runtime/bf16.h's number_at). */
#include <math.h>
#include <stdlib.h>

#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct {
    float *param;
    const void *grad;
    Precision grad_held;
    float *m, *v;
    size_t n;
    AdamWParams hp;
} AdamWArgs;

/* The arithmetic of torch.optim.AdamW (single-tensor path), in the same order. */
static void adamw_task(void *p) {
    AdamWArgs *a = p;
    AdamWParams hp = a->hp;
    float bias_correction1 = 1.0f - powf(hp.beta1, (float)hp.step);
    float bias_correction2_sqrt = sqrtf(1.0f - powf(hp.beta2, (float)hp.step));
    float step_size = hp.lr / bias_correction1;
    float decay = 1.0f - hp.lr * hp.weight_decay;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < a->n; i++) {
        float g = number_at(a->grad, a->grad_held, i);
        float m = a->m[i] + (1.0f - hp.beta1) * (g - a->m[i]);
        float v = hp.beta2 * a->v[i] + (1.0f - hp.beta2) * g * g;
        float denom = sqrtf(v) / bias_correction2_sqrt + hp.eps;
        a->m[i] = m;
        a->v[i] = v;
        a->param[i] = a->param[i] * decay - step_size * m / denom;
    }
}

void cpu_adamw_update(Stream *s, float *param, const void *grad, Precision grad_held, float *m, float *v, size_t n,
                      AdamWParams hp) {
    AdamWArgs a = { param, grad, grad_held, m, v, n, hp };
    stream_launch(s, adamw_task, &a, sizeof a);
}

/* Fixed chunks (SUMSQ_CHUNK), each summed by the same vector code, then the
 * chunks in index order: the same bits whatever the thread count. */
typedef struct { float *out; const void *x; Precision held; size_t n; double *partial; } SumsqArgs;

static void sumsq_task(void *p) {
    SumsqArgs *a = p;
    size_t nchunks = (a->n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    double *partial = a->partial;
    #pragma omp parallel for schedule(static)
    for (size_t chunk = 0; chunk < nchunks; chunk++) {
        size_t end = (chunk + 1) * SUMSQ_CHUNK < a->n ? (chunk + 1) * SUMSQ_CHUNK : a->n;
        double acc = 0.0;
        #pragma omp simd reduction(+ : acc)
        for (size_t i = chunk * SUMSQ_CHUNK; i < end; i++) {
            double x = number_at(a->x, a->held, i);
            acc += x * x;
        }
        partial[chunk] = acc;
    }
    double total = 0.0;
    for (size_t chunk = 0; chunk < nchunks; chunk++) total += partial[chunk];
    *a->out = (float)total;
}

void cpu_sumsq_reduce(Stream *s, float *out, const void *x, Precision held, size_t n, double *scratch) {
    SumsqArgs a = { out, x, held, n, scratch };
    stream_launch(s, sumsq_task, &a, sizeof a);
}

typedef struct { void *x; Precision held; size_t n; const float *sumsq; int nparts; float max_norm; } ClipArgs;

static void clip_scale_task(void *p) {
    ClipArgs *a = p;
    double total = 0.0;
    for (int i = 0; i < a->nparts; i++) total += a->sumsq[i];
    /* torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1 */
    float coef = a->max_norm / ((float)sqrt(total) + 1e-6f);
    if (coef >= 1.0f) return;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < a->n; i++) number_put(a->x, a->held, i, number_at(a->x, a->held, i) * coef);
}

void cpu_clip_scale(Stream *s, void *x, Precision held, size_t n, const float *sumsq, int nparts, float max_norm) {
    ClipArgs a = { x, held, n, sumsq, nparts, max_norm };
    stream_launch(s, clip_scale_task, &a, sizeof a);
}

typedef struct { float *out; const void *x; Precision held; size_t n; } CountArgs;

static void count_nonfinite_task(void *p) {
    CountArgs *a = p;
    size_t count = 0;
    #pragma omp parallel for schedule(static) reduction(+ : count)
    for (size_t i = 0; i < a->n; i++) count += !isfinite(number_at(a->x, a->held, i));
    *a->out = (float)count;
}

/* An OpenMP reduction of integers needs no scratch: the count is exact in any order. */
void cpu_count_nonfinite(Stream *s, float *out, const void *x, Precision held, size_t n, double *scratch) {
    (void)scratch;
    CountArgs a = { out, x, held, n };
    stream_launch(s, count_nonfinite_task, &a, sizeof a);
}
