/* attention.cu: causal multi-head self-attention on the GPU, through cuBLAS.
 *
 * The loop is over heads, each one strided-batched over the batch rows: q, k
 * and v of head h are column blocks of qkv[B,T,3C] with row stride 3C, with no
 * permutes. As in matmul.cu, each product is written for cuBLAS's column-major
 * view of the row-major matrices. The T x T probabilities are kept for the
 * backward (the CPU keeps one log-sum-exp a row instead).
 */
#include <math.h>

#include "../../runtime/gpu_libraries.h"
#include "../dropout.h"
#include "cuda_kernels.cuh"

/* A warp per row t of each (b, h): att = causal softmax of the scaled scores
 * already in att (keys 0..t), zero past t. */
__global__ static void causal_softmax_kernel(float *att, int rows, int T) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows) return;
    int t = (int)(row % T);
    float *a = att + (size_t)row * T;
    float maxval = -INFINITY;
    for (int j = lane; j <= t; j += WARP) maxval = fmaxf(maxval, a[j]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += WARP) {
        float e = expf(a[j] - maxval);
        a[j] = e;
        sum += e;
    }
    float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += WARP) a[j] = j <= t ? a[j] * inv : 0.0f;
}

/* weights = att * mask (the dropout of the attention weights); with datt given,
 * also datt *= mask. Element i is element i of [B,NH,T,T], as on the CPU. */
__global__ static void attention_dropout_kernel(float *weights, float *datt, const float *att, size_t n,
                                                Dropout drop) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float scale = dropout_scale_at(drop, i);
    weights[i] = att[i] * scale;
    if (datt) datt[i] *= scale;
}

/* A warp per row: dpre = att * (datt - sum(att * datt)) in place, zero past t. */
__global__ static void softmax_backward_kernel(float *datt, const float *att, int rows, int T) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows) return;
    int t = (int)(row % T);
    const float *a = att + (size_t)row * T;
    float *d = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += WARP) dot += a[j] * d[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += WARP) d[j] = j <= t ? a[j] * (d[j] - dot) : 0.0f;
}

/* C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for b < B, column-major. */
static void gemm_batched(cublasHandle_t blas, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                         float alpha, const float *a, int lda, long long stride_a, const float *b, int ldb,
                         long long stride_b, float beta, float *c, int ldc, long long stride_c, int batch) {
    CHECK_CUBLAS(gpu_cublas()->sgemm_strided_batched(blas, opa, opb, m, n, k, &alpha, a, lda, stride_a, b, ldb, stride_b,
                                           &beta, c, ldc, stride_c, batch));
}

/* The probabilities are kept for the backward; the scratch is the dropped
 * weights and the probabilities' gradient, each T x T a (batch row, head). */
AttentionBuffers cuda_attention_buffers(int B, int T, int NH) {
    size_t probs = (size_t)B * NH * T * T;
    AttentionBuffers sizes = { probs, 2 * probs };
    return sizes;
}

void cuda_attention_forward(Stream *s, float *out, float *att, float *scratch, const float *qkv, int B, int T,
                            int C, int NH, Dropout drop) {
    cublasHandle_t blas = cuda_blas(s);
    cudaStream_t stream = cuda_stream(s);
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    long long qkv_stride = (long long)T * 3 * C, att_stride = (long long)NH * T * T, out_stride = (long long)T * C;
    /* att[b,h] = scale * q @ k^T (every key; the softmax masks the future) */
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)h * hs, *k = q + C;
        gemm_batched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, 3 * C, qkv_stride, q, 3 * C, qkv_stride,
                     0.0f, att + (size_t)h * T * T, T, att_stride, B);
    }
    int rows = B * NH * T;
    causal_softmax_kernel<<<blocks_for((size_t)rows * WARP), THREADS, 0, stream>>>(att, rows, T);
    CHECK_LAUNCH("causal_softmax_kernel");
    const float *weights = att;
    if (drop.p > 0.0f) {
        size_t n = (size_t)rows * T;
        attention_dropout_kernel<<<blocks_for(n), THREADS, 0, stream>>>(scratch, NULL, att, n, drop);
        CHECK_LAUNCH("attention_dropout_kernel");
        weights = scratch;
    }
    /* y[b, :, h] = weights @ v */
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + 2 * C + (size_t)h * hs;
        gemm_batched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, 3 * C, qkv_stride,
                     weights + (size_t)h * T * T, T, att_stride, 0.0f, out + (size_t)h * hs, C, out_stride, B);
    }
}

void cuda_attention_backward(Stream *s, float *dqkv, float *scratch, const float *dout, const float *qkv,
                             const float * /* out: the kept probabilities say all */, const float *att, int B,
                             int T, int C, int NH, Dropout drop) {
    cublasHandle_t blas = cuda_blas(s);
    cudaStream_t stream = cuda_stream(s);
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    long long qkv_stride = (long long)T * 3 * C, att_stride = (long long)NH * T * T, out_stride = (long long)T * C;
    size_t n = (size_t)B * NH * T * T;
    float *datt = scratch, *mask = scratch + n;
    /* dweights = dy @ v^T */
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + 2 * C + (size_t)h * hs;
        gemm_batched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, 3 * C, qkv_stride, dout + (size_t)h * hs, C,
                     out_stride, 0.0f, datt + (size_t)h * T * T, T, att_stride, B);
    }
    /* through the dropout mask: datt = dweights * mask, weights = att * mask */
    const float *weights = att;
    if (drop.p > 0.0f) {
        attention_dropout_kernel<<<blocks_for(n), THREADS, 0, stream>>>(mask, datt, att, n, drop);
        CHECK_LAUNCH("attention_dropout_kernel");
        weights = mask;
    }
    /* dv = weights^T @ dy */
    for (int h = 0; h < NH; h++) {
        float *dv = dqkv + 2 * C + (size_t)h * hs;
        gemm_batched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dout + (size_t)h * hs, C, out_stride,
                     weights + (size_t)h * T * T, T, att_stride, 0.0f, dv, 3 * C, qkv_stride, B);
    }
    int rows = B * NH * T;
    softmax_backward_kernel<<<blocks_for((size_t)rows * WARP), THREADS, 0, stream>>>(datt, att, rows, T);
    CHECK_LAUNCH("softmax_backward_kernel");
    /* dq = scale * dpre @ k;  dk = scale * dpre^T @ q */
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)h * hs, *k = q + C;
        float *dq = dqkv + (size_t)h * hs, *dk = dq + C;
        const float *dpre = datt + (size_t)h * T * T;
        gemm_batched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, scale, k, 3 * C, qkv_stride, dpre, T, att_stride,
                     0.0f, dq, 3 * C, qkv_stride, B);
        gemm_batched(blas, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, scale, q, 3 * C, qkv_stride, dpre, T, att_stride,
                     0.0f, dk, 3 * C, qkv_stride, B);
    }
}
