/* embedding.c: token plus position embedding, and its backward by the
 * batch's token buckets (token_buckets.h). */
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct { float *out; const int *tokens; ConstBuf wte, wpe; int B, T, C, rounds; } EmbeddingArgs;

static void embedding_forward_task(void *p) {
    EmbeddingArgs *a = p;
    int B = a->B, T = a->T, C = a->C;
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        size_t tok = (size_t)a->tokens[bt] * C, pos = (size_t)(bt % T) * C;
        float *o = a->out + (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            float v = number_at(a->wte.data, a->wte.dtype, tok + c) + number_at(a->wpe.data, a->wpe.dtype, pos + c);
            o[c] = rounded_if(v, a->rounds);
        }
    }
}

void cpu_embedding_forward(Stream *s, Buf out, const int *tokens, ConstBuf wte,
                       ConstBuf wpe, int B, int T, int C, DType rounding) {
    size_t n = (size_t)B * T * C;
    EmbeddingArgs a = { cpu_fp32_for(s, out, n, 0), tokens, wte, wpe, B, T, C, rounding == DTYPE_BF16 };
    stream_launch(s, embedding_forward_task, &a, sizeof a);
    cpu_store_output(s, out, a.out, n);
}

typedef struct { float *dwte, *dwpe; const float *dout; TokenBuckets buckets; int B, T, C; } EmbeddingBackwardArgs;

/* A bucket a worker (the GPU's block a bucket): each row of dwte takes its
 * token's rows one by one in row order; then each row of dwpe its position's
 * rows in batch order. */
static void embedding_backward_task(void *p) {
    EmbeddingBackwardArgs *a = p;
    int B = a->B, T = a->T, C = a->C;
    const TokenBuckets *bk = &a->buckets;
    #pragma omp parallel for schedule(dynamic, 16)
    for (int k = 0; k < bk->ntokens; k++) {
        float *row = a->dwte + (size_t)bk->token[k] * C;
        for (int i = bk->start[k]; i < bk->start[k + 1]; i++) {
            const float *d = a->dout + (size_t)bk->positions[i] * C;
            #pragma omp simd
            for (int c = 0; c < C; c++) row[c] += d[c];
        }
    }
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *row = a->dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = a->dout + ((size_t)b * T + t) * C;
            #pragma omp simd
            for (int c = 0; c < C; c++) row[c] += d[c];
        }
    }
}

void cpu_embedding_backward(Stream *s, float *dwte, float *dwpe, ConstBuf dout, TokenBuckets buckets,
                            int B, int T, int C) {
    EmbeddingBackwardArgs a = { dwte, dwpe, cpu_fp32_of(s, dout, (size_t)B * T * C, 0), buckets, B, T, C };
    stream_launch(s, embedding_backward_task, &a, sizeof a);
}
