/* sample.c: autoregressive sampling on the host from the model's last logits. */
#include "sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/philox.h"
#include "../runtime/host.h"

/* qsort's order: larger first */
static int descending(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

void gpt_generate(GPT *m, int *tokens, int n_prompt, int n_new, Sampling how) {
    int V = m->base.cfg.vocab, drawn = how.vocab > 0 && how.vocab < V ? how.vocab : V;
    int window = m->base.cfg.block_size < m->max_T ? m->base.cfg.block_size : m->max_T;
    float *logits = host_calloc((size_t)V, sizeof(float)), *sorted = host_calloc((size_t)V, sizeof(float));
    double *weight = host_calloc((size_t)V, sizeof(double));
    for (int n = n_prompt; n < n_prompt + n_new; n++) {
        int T = n < window ? n : window;
        gpt_forward(m, tokens + n - T, NULL, 1, T, 0, 0);
        stream_copy(m->base.stream, logits, m->acts.logits, (size_t)V * sizeof(float));  /* the last position's */
        stream_synchronize(m->base.stream);

        float maxval = -INFINITY;
        for (int j = 0; j < drawn; j++) maxval = fmaxf(maxval, logits[j]);
        /* top-k: keep the logits at least as large as the k-th largest */
        float floor = -INFINITY;
        if (how.top_k > 0 && how.top_k < drawn) {
            memcpy(sorted, logits, (size_t)drawn * sizeof(float));
            qsort(sorted, (size_t)drawn, sizeof(float), descending);
            floor = sorted[how.top_k - 1];
        }
        double total = 0.0;
        for (int j = 0; j < drawn; j++) {
            weight[j] = logits[j] >= floor ? exp((logits[j] - maxval) / how.temperature) : 0.0;
            total += weight[j];
        }
        Philox4 ctr = {{ (uint32_t)n, 0, 0, 0 }};
        Philox4 bits = philox4x32_10(ctr, how.seed, PHILOX_STREAM_SAMPLE);
        double u = ((double)bits.v[0] + (double)bits.v[1] / 4294967296.0) / 4294967296.0 * total;
        int next = drawn - 1;
        for (int j = 0; j < drawn; j++) {
            if (u < weight[j]) { next = j; break; }
            u -= weight[j];
        }
        tokens[n] = next;
    }
    free(logits);
    free(sorted);
    free(weight);
}
