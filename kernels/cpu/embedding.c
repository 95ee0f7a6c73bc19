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

typedef struct {
    Buf dwte, dwpe;
    const float *dout;
    ConstBuf head;
    TokenBuckets buckets;
    int B, T, V, C, rounds;
} EmbeddingBackwardArgs;

enum { EMBEDDING_COLUMNS = 256 };  /* a row's columns summed at once, in registers */

/* A row's sums of its `rows` rows of dout (n of them, `stride` floats apart,
 * listed or in turn), EMBEDDING_COLUMNS columns at a time: from the
 * gradient's value one by one in fp32 (its own adds), else from zero, then
 * each rounded, joined by the head's (a bf16 add) and added into the
 * gradient as it is held. */
static void add_rows(Buf out, size_t row, const float *dout, const int *rows, int n, size_t stride, ConstBuf head,
                     int C, int rounds) {
    for (int c0 = 0; c0 < C; c0 += EMBEDDING_COLUMNS) {
        int width = C - c0 < EMBEDDING_COLUMNS ? C - c0 : EMBEDDING_COLUMNS;
        float acc[EMBEDDING_COLUMNS];
        size_t at = row * (size_t)C + (size_t)c0;
        for (int c = 0; c < width; c++) acc[c] = rounds ? 0.0f : number_at(out.data, out.dtype, at + (size_t)c);
        for (int i = 0; i < n; i++) {
            const float *d = dout + (size_t)(rows ? rows[i] : i) * stride + (size_t)c0;
            #pragma omp simd
            for (int c = 0; c < width; c++) acc[c] += d[c];
        }
        for (int c = 0; c < width; c++) {
            float v = acc[c];
            if (rounds) {
                float part = bf16_rounded(v);
                if (head.data) part = bf16_rounded(part + number_at(head.data, head.dtype, at + (size_t)c));
                v = number_at(out.data, out.dtype, at + (size_t)c) + part;
            }
            number_put(out.data, out.dtype, at + (size_t)c, v);
        }
    }
}

/* A row of dwte a worker (the GPU's block a row): its token's rows one by
 * one in row order, every row of V where the head joins them (else only the
 * tokens the batch holds); then each row of dwpe its position's rows in
 * batch order. */
static void embedding_backward_task(void *p) {
    EmbeddingBackwardArgs *a = p;
    int B = a->B, T = a->T, C = a->C;
    const TokenBuckets *bk = &a->buckets;
    #pragma omp parallel for schedule(dynamic, 64)
    for (int v = 0; v < a->V; v++) {
        int k = token_bucket(*bk, v);
        if (k < 0 && !a->head.data) continue;
        const int *rows = k < 0 ? NULL : bk->positions + bk->start[k];
        int n = k < 0 ? 0 : bk->start[k + 1] - bk->start[k];
        add_rows(a->dwte, (size_t)v, a->dout, rows, n, (size_t)C, a->head, C, a->rounds);
    }
    ConstBuf none = { NULL, DTYPE_FP32 };
    #pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++)  /* position t's rows: t, T + t, ..., a stride of T rows from row t */
        add_rows(a->dwpe, (size_t)t, a->dout + (size_t)t * C, NULL, B, (size_t)T * C, none, C, a->rounds);
}

void cpu_embedding_backward(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head, TokenBuckets buckets,
                            int B, int T, int V, int C, DType rounding) {
    EmbeddingBackwardArgs a = { dwte, dwpe, cpu_fp32_of(s, dout, (size_t)B * T * C, 0), head, buckets, B, T, V, C,
                                rounding == DTYPE_BF16 };
    stream_launch(s, embedding_backward_task, &a, sizeof a);
}
