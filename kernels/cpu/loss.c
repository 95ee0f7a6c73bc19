/* loss.c: the classifier's fused softmax, cross-entropy and gradient, and the mean of the losses.
 *
 * Each row runs as the GPU's block runs it (kernels/online_softmax.h): the
 * CROSSENTROPY_THREADS partials of a block, partial t over logits t, t +
 * THREADS, ..., merged by the same tree with the same exp, so that the losses
 * and dlogits are the GPU's bits.
 */
#include "../../runtime/device_cpu.h"
#include "../online_softmax.h"
#include "cpu_kernels.h"

/* In order, in double: the same bits whatever the threads. */
static float mean_of(const float *x, int n) {
    double total = 0.0;
    for (int i = 0; i < n; i++) total += x[i];
    return (float)(total / n);
}

typedef struct { float *mean; const float *x; int n; } MeanArgs;

static void mean_task(void *p) {
    MeanArgs *a = p;
    *a->mean = mean_of(a->x, a->n);
}

void cpu_mean_forward(Stream *s, float *mean, const float *x, int n) {
    MeanArgs a = { mean, x, n };
    stream_launch(s, mean_task, &a, sizeof a);
}

/* A row's max and sum of exponentials: the GPU block's partials, a sweep of
 * CROSSENTROPY_THREADS logits at a time, then its tree. */
static SoftmaxPartial row_softmax(const float *logit, int V, int rounds) {
    SoftmaxPartial part[CROSSENTROPY_THREADS];
    for (int t = 0; t < CROSSENTROPY_THREADS; t++) part[t] = softmax_partial_empty();
    for (int first = 0; first < V; first += CROSSENTROPY_THREADS) {
        int n = V - first < CROSSENTROPY_THREADS ? V - first : CROSSENTROPY_THREADS;
        #pragma omp simd
        for (int t = 0; t < n; t++)
            part[t] = softmax_merge(part[t], softmax_partial_of(softmax_logit(logit, DTYPE_FP32, first + t, rounds)));
    }
    for (int stride = CROSSENTROPY_THREADS / 2; stride > 0; stride /= 2) {
        #pragma omp simd
        for (int t = 0; t < stride; t++) part[t] = softmax_merge(part[t], part[t + stride]);
    }
    return part[0];
}

typedef struct {
    float *losses, *dlogits;
    const float *logits;
    const int *targets;
    int N, V;
    float dloss;
    int rounds;
} CrossEntropyArgs;

/* Row i's loss, then its gradient (in place where dlogits is logits: the
 * target's logit is read first). */
static void crossentropy_row(const CrossEntropyArgs *a, int i) {
    int V = a->V, target = a->targets[i], rounds = a->rounds;
    const float *logit = a->logits + (size_t)i * V;
    SoftmaxPartial row = row_softmax(logit, V, rounds);
    a->losses[i] = softmax_loss(softmax_logit(logit, DTYPE_FP32, target, rounds), row);
    if (!a->dlogits) return;
    float *d = a->dlogits + (size_t)i * V;
    #pragma omp simd
    for (int j = 0; j < V; j++) {
        float g = softmax_grad(softmax_logit(logit, DTYPE_FP32, j, rounds), row, j == target, a->dloss);
        d[j] = rounded_if(g, rounds);
    }
}

static void crossentropy_task(void *p) {
    CrossEntropyArgs *a = p;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < a->N; i++) crossentropy_row(a, i);
}

/* Logits held in bf16 are widened into the stream's room, and dlogits held in
 * bf16 made there (over the widened logits, in place) and stored. */
void cpu_crossentropy_forward_backward(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                       const int *targets, int N, int V, float dloss, DType rounding) {
    size_t n = (size_t)N * V;
    const float *x = cpu_fp32_of(s, logits, n, 0);
    float *d = dlogits.data ? cpu_fp32_for(s, dlogits, n, 0) : NULL;
    CrossEntropyArgs a = { losses, d, x, targets, N, V, dloss, rounding == DTYPE_BF16 };
    stream_launch(s, crossentropy_task, &a, sizeof a);
    if (d) cpu_store_output(s, dlogits, d, n);
}
