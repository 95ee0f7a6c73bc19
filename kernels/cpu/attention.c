/* attention.c: causal multi-head self-attention, one (batch row, head) at a time.
 *
 * q, k and v of head h are column blocks of qkv[B,T,3C] with a row stride of 3C,
 * so each head's products are plain strided sgemms, with no permutes. Rows go
 * in blocks of ATT_ROWS: a block of rows ending at row r only sees keys 0..r,
 * so its sgemms stop there, which skips most of the masked upper triangle.
 * (b, h) pairs run in parallel; inside a parallel region an OpenMP OpenBLAS
 * runs each sgemm on the calling thread.
 */
#include <cblas.h>
#include <math.h>

#include "../dropout.h"
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"
#include "vector_math.h"

enum { ATT_ROWS = 32 };

static int min_int(int a, int b) { return a < b ? a : b; }

typedef struct {
    float *out, *att, *scratch;
    const float *qkv;
    int B, T, C, NH;
    Dropout drop;
} AttentionArgs;

static void attention_forward_task(void *p) {
    AttentionArgs *a = p;
    int B = a->B, T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        const float *q = a->qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
        const float *k = q + C, *v = q + 2 * C;
        float *att = a->att + (size_t)bh * T * T;
        /* att = scale * q @ k^T over the keys each row block sees, then a causal
         * softmax per row (which zeroes the rest of the row) */
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            int rows = min_int(ATT_ROWS, T - r0), keys = r0 + rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs,
                        scale, q + (size_t)r0 * 3 * C, 3 * C, k, 3 * C, 0.0f, att + (size_t)r0 * T, T);
        }
        for (int t = 0; t < T; t++) {
            float *row = att + (size_t)t * T;
            float maxval = row[0];
            #pragma omp simd reduction(max : maxval)
            for (int j = 1; j <= t; j++) maxval = row[j] > maxval ? row[j] : maxval;
            float sum = 0.0f;
            #pragma omp simd reduction(+ : sum)
            for (int j = 0; j <= t; j++) { row[j] = expf(row[j] - maxval); sum += row[j]; }
            float inv = 1.0f / sum;
            for (int j = 0; j <= t; j++) row[j] *= inv;
            for (int j = t + 1; j < T; j++) row[j] = 0.0f;
        }
        /* y = dropout(att) @ v */
        const float *weights = att;
        if (a->drop.p > 0.0f) {
            float *dropped = a->scratch + (size_t)bh * T * T;
            dropout_scales(a->drop, (size_t)bh * T * T, (size_t)T * T, dropped);
            for (int i = 0; i < T * T; i++) dropped[i] *= att[i];
            weights = dropped;
        }
        float *y = a->out + (size_t)b * T * C + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            int rows = min_int(ATT_ROWS, T - r0), keys = r0 + rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys,
                        1.0f, weights + (size_t)r0 * T, T, v, 3 * C, 0.0f, y + (size_t)r0 * C, C);
        }
    }
}

void cpu_attention_forward(Stream *s, float *out, float *att, float *scratch, const float *qkv,
                       int B, int T, int C, int NH, Dropout drop) {
    AttentionArgs a = { out, att, scratch, qkv, B, T, C, NH, drop };
    stream_launch(s, attention_forward_task, &a, sizeof a);
}

typedef struct {
    float *dqkv, *scratch;
    const float *dout, *qkv, *att;
    int B, T, C, NH;
    Dropout drop;
} AttentionBackwardArgs;

static void attention_backward_task(void *p) {
    AttentionBackwardArgs *a = p;
    int B = a->B, T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        size_t head = (size_t)b * T * 3 * C + (size_t)h * hs;
        const float *q = a->qkv + head, *k = q + C, *v = q + 2 * C;
        float *dq = a->dqkv + head, *dk = dq + C, *dv = dq + 2 * C;
        const float *dy = a->dout + (size_t)b * T * C + (size_t)h * hs;
        const float *att = a->att + (size_t)bh * T * T;
        float *datt = a->scratch + (size_t)bh * T * T;
        float *mask = a->scratch + ((size_t)B * NH + bh) * T * T;

        /* dweights = dy @ v^T (only where the forward had weights); through the
         * dropout mask, datt = dweights * mask */
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
            int rows = min_int(ATT_ROWS, T - r0), keys = r0 + rows;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs,
                        1.0f, dy + (size_t)r0 * C, C, v, 3 * C, 0.0f, datt + (size_t)r0 * T, T);
        }
        const float *weights = att;
        if (a->drop.p > 0.0f) {
            dropout_scales(a->drop, (size_t)bh * T * T, (size_t)T * T, mask);
            for (int i = 0; i < T * T; i++) {
                datt[i] *= mask[i];
                mask[i] *= att[i];
            }
            weights = mask;
        }
        /* dv = weights^T @ dy. Row blocks run last first: the last block sees every
         * key and writes all of dv, the earlier ones add into its prefix. */
        for (int r0 = (T - 1) / ATT_ROWS * ATT_ROWS; r0 >= 0; r0 -= ATT_ROWS) {
            int rows = min_int(ATT_ROWS, T - r0), keys = r0 + rows;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, rows,
                        1.0f, weights + (size_t)r0 * T, T, dy + (size_t)r0 * C, C,
                        keys == T ? 0.0f : 1.0f, dv, 3 * C);
        }
        /* softmax backward, in place: dpre = att * (datt - sum(att * datt)) */
        for (int t = 0; t < T; t++) {
            const float *arow = att + (size_t)t * T;
            float *drow = datt + (size_t)t * T;
            float dot = 0.0f;
            #pragma omp simd reduction(+ : dot)
            for (int j = 0; j <= t; j++) dot += arow[j] * drow[j];
            for (int j = 0; j <= t; j++) drow[j] = arow[j] * (drow[j] - dot);
            for (int j = t + 1; j < T; j++) drow[j] = 0.0f;
        }
        /* dq = scale * dpre @ k;  dk = scale * dpre^T @ q (last block first, as dv) */
        for (int r0 = (T - 1) / ATT_ROWS * ATT_ROWS; r0 >= 0; r0 -= ATT_ROWS) {
            int rows = min_int(ATT_ROWS, T - r0), keys = r0 + rows;
            const float *dpre = datt + (size_t)r0 * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys,
                        scale, dpre, T, k, 3 * C, 0.0f, dq + (size_t)r0 * 3 * C, 3 * C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, rows,
                        scale, dpre, T, q + (size_t)r0 * 3 * C, 3 * C,
                        keys == T ? 0.0f : 1.0f, dk, 3 * C);
        }
    }
}

void cpu_attention_backward(Stream *s, float *dqkv, float *scratch, const float *dout,
                        const float *qkv, const float *att, int B, int T, int C, int NH,
                        Dropout drop) {
    AttentionBackwardArgs a = { dqkv, scratch, dout, qkv, att, B, T, C, NH, drop };
    stream_launch(s, attention_backward_task, &a, sizeof a);
}
