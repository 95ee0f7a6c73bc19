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

/* A row's sum over its rows of dout, column c: from the gradient's value one
 * by one in fp32 (its own adds), else from zero, then rounded, joined by the
 * head's (a bf16 add) and added into the gradient as it is held: the CPU's
 * add_rows, in its order. */
__device__ static void add_rows(Buf out, size_t at, ConstBuf dout, const int *rows, int n, size_t first, size_t stride,
                                ConstBuf head, int rounds) {
    float acc = rounds ? 0.0f : number_at(out.data, out.dtype, at);
    for (int i = 0; i < n; i++)
        acc += number_at(dout.data, dout.dtype, first + (size_t)(rows ? rows[i] : i) * stride);
    if (rounds) {
        float part = bf16_rounded(acc);
        if (head.data) part = bf16_rounded(part + number_at(head.data, head.dtype, at));
        acc = number_at(out.data, out.dtype, at) + part;
    }
    number_put(out.data, out.dtype, at, acc);
}

/* dwte's row v takes its token's bucket of dout's rows one by one, in row
 * order: a block a row (every row of V where the head joins them, else the
 * rows of tokens the batch holds), a thread a column (and each THREADS-th
 * one past it), so each row of dwte is read and written once, with no
 * atomics: the CPU's adds, in its order. */
__global__ static void embedding_dwte_kernel(Buf dwte, ConstBuf dout, ConstBuf head, TokenBuckets buckets, int C,
                                             int rounds) {
    int v = blockIdx.x, k = token_bucket(buckets, v);
    if (k < 0 && !head.data) return;
    const int *rows = k < 0 ? NULL : buckets.positions + buckets.start[k];
    int n = k < 0 ? 0 : buckets.start[k + 1] - buckets.start[k];
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        add_rows(dwte, (size_t)v * C + c, dout, rows, n, (size_t)c, (size_t)C, head, rounds);
}

/* dwpe[t, c] takes the rows at position t one by one, in batch order. */
__global__ static void embedding_dwpe_kernel(Buf dwpe, ConstBuf dout, int B, int T, int C, int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    ConstBuf none = { NULL, DTYPE_FP32 };
    add_rows(dwpe, i, dout, NULL, B, i, (size_t)T * C, none, rounds);
}

void cuda_embedding_backward(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head, TokenBuckets buckets,
                             int B, int T, int V, int C, DType rounding) {
    cudaStream_t stream = cuda_stream(s);
    int rounds = rounding == DTYPE_BF16;
    if (V > 0) {
        embedding_dwte_kernel<<<(unsigned)V, THREADS, 0, stream>>>(dwte, dout, head, buckets, C, rounds);
        CHECK_LAUNCH("embedding_dwte_kernel");
    }
    embedding_dwpe_kernel<<<blocks_for((size_t)T * C), THREADS, 0, stream>>>(dwpe, dout, B, T, C, rounds);
    CHECK_LAUNCH("embedding_dwpe_kernel");
}
