/* loss.c: fused softmax + cross-entropy over the vocabulary, and its backward. */
#include <math.h>

#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"
#include "vector_math.h"

typedef struct {
    float *mean_loss, *losses, *probs;
    const float *logits;
    const int *targets;
    int N, V;
} CrossEntropyArgs;

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

static void crossentropy_forward_task(void *p) {
    CrossEntropyArgs *a = p;
    int V = a->V;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < a->N; i++) {
        const float *logit = a->logits + (size_t)i * V;
        float *prob = a->probs + (size_t)i * V;
        float maxval = logit[0];
        #pragma omp simd reduction(max : maxval)
        for (int j = 1; j < V; j++) maxval = logit[j] > maxval ? logit[j] : maxval;
        float sum = 0.0f;
        #pragma omp simd reduction(+ : sum)
        for (int j = 0; j < V; j++) { prob[j] = expf(logit[j] - maxval); sum += prob[j]; }
        for (int j = 0; j < V; j++) prob[j] /= sum;
        /* -log softmax from the logits themselves: exact even where prob underflows */
        if (a->targets) a->losses[i] = logf(sum) - (logit[a->targets[i]] - maxval);
    }
    if (a->targets && a->mean_loss) *a->mean_loss = mean_of(a->losses, a->N);
}

void cpu_crossentropy_forward(Stream *s, float *mean_loss, float *losses, float *probs,
                          const float *logits, const int *targets, int N, int V) {
    CrossEntropyArgs a = { mean_loss, losses, probs, logits, targets, N, V };
    stream_launch(s, crossentropy_forward_task, &a, sizeof a);
}

typedef struct { float *dlogits; const float *probs; const int *targets; int N, V; float dloss; } CrossEntropyBackwardArgs;

static void crossentropy_backward_task(void *p) {
    CrossEntropyBackwardArgs *a = p;
    int V = a->V;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < a->N; i++) {
        const float *prob = a->probs + (size_t)i * V;
        float *d = a->dlogits + (size_t)i * V;
        for (int j = 0; j < V; j++) d[j] = a->dloss * (prob[j] - (j == a->targets[i] ? 1.0f : 0.0f));
    }
}

void cpu_crossentropy_backward(Stream *s, float *dlogits, const float *probs, const int *targets,
                           int N, int V, float dloss) {
    CrossEntropyBackwardArgs a = { dlogits, probs, targets, N, V, dloss };
    stream_launch(s, crossentropy_backward_task, &a, sizeof a);
}
