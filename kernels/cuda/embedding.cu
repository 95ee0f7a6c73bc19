/* embedding.cu: token plus position embedding, and its backward by the
 * batch's token buckets (token_buckets.h), on the GPU: the CPU's twin
 * (kernels/cpu/embedding.c), the same adds in the same order.
 */
#include "cuda_kernels.cuh"

__global__ static void embedding_forward_kernel(Buf out, const int *tokens, ConstBuf wte, ConstBuf wpe, int BT, int T,
                                                int C, int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * C) return;
    int bt = (int)(i / C), c = (int)(i % C);
    float v = number_at(wte.data, wte.dtype, (size_t)tokens[bt] * C + c) +
              number_at(wpe.data, wpe.dtype, (size_t)(bt % T) * C + c);
    number_put(out.data, out.dtype, i, rounded_if(v, rounds));
}

void cuda_embedding_forward(Stream *s, Buf out, const int *tokens, ConstBuf wte, ConstBuf wpe,
                            int B, int T, int C, DType rounding) {
    embedding_forward_kernel<<<blocks_for((size_t)B * T * C), THREADS, 0, cuda_stream(s)>>>(
        out, tokens, wte, wpe, B * T, T, C, rounding == DTYPE_BF16);
    CHECK_LAUNCH("embedding_forward_kernel");
}

/* dwte's row of bucket k's token takes the bucket's rows of dout one by one,
 * in row order: a block a bucket, a thread a column (and each THREADS-th one
 * past it), so each row of dwte is read and written once, with no atomics:
 * the CPU's adds, in its order. */
__global__ static void embedding_dwte_kernel(float *dwte, ConstBuf dout, TokenBuckets buckets, int C) {
    int k = blockIdx.x, first = buckets.start[k], end = buckets.start[k + 1];
    float *row = dwte + (size_t)buckets.token[k] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = row[c];
        for (int i = first; i < end; i++) acc += number_at(dout.data, dout.dtype, (size_t)buckets.positions[i] * C + c);
        row[c] = acc;
    }
}

/* dwpe[t, c] takes the rows at position t one by one, in batch order. */
__global__ static void embedding_dwpe_kernel(float *dwpe, ConstBuf dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float acc = dwpe[i];
    for (int b = 0; b < B; b++) acc += number_at(dout.data, dout.dtype, (size_t)b * T * C + i);
    dwpe[i] = acc;
}

void cuda_embedding_backward(Stream *s, float *dwte, float *dwpe, ConstBuf dout, TokenBuckets buckets,
                             int B, int T, int C) {
    cudaStream_t stream = cuda_stream(s);
    if (buckets.ntokens > 0) {
        embedding_dwte_kernel<<<(unsigned)buckets.ntokens, THREADS, 0, stream>>>(dwte, dout, buckets, C);
        CHECK_LAUNCH("embedding_dwte_kernel");
    }
    embedding_dwpe_kernel<<<blocks_for((size_t)T * C), THREADS, 0, stream>>>(dwpe, dout, B, T, C);
    CHECK_LAUNCH("embedding_dwpe_kernel");
}
