/* embedding.cu: token plus position embedding, and its backward, on the GPU.
 *
 * The backward sums over rows without atomics: one thread per element of the
 * table it adds into, each scanning the rows in order.
 */
#include "cuda_kernels.cuh"

__global__ static void embedding_forward_kernel(float *out, const int *tokens, const float *wte, const float *wpe,
                                                int BT, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * C) return;
    int bt = (int)(i / C), c = (int)(i % C);
    out[i] = wte[(size_t)tokens[bt] * C + c] + wpe[(size_t)(bt % T) * C + c];
}

void cuda_embedding_forward(Stream *s, float *out, const int *tokens, const float *wte, const float *wpe,
                            int B, int T, int C) {
    embedding_forward_kernel<<<blocks_for((size_t)B * T * C), THREADS, 0, cuda_stream(s)>>>(out, tokens, wte, wpe,
                                                                                           B * T, T, C);
    CHECK_LAUNCH("embedding_forward_kernel");
}

/* dwte[v, c] += the rows of token v, in row order: one thread per (v, c) scans
 * the tokens, so repeated tokens need no atomics. V * C threads each read every
 * token: cheap for the byte-level vocabularies this project allows (V <= 256). */
__global__ static void embedding_dwte_kernel(float *dwte, const float *dout, const int *tokens, int BT, int V,
                                             int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)V * C) return;
    int v = (int)(i / C), c = (int)(i % C);
    float acc = 0.0f;
    for (int bt = 0; bt < BT; bt++)
        if (tokens[bt] == v) acc += dout[(size_t)bt * C + c];
    dwte[i] += acc;
}

/* dwpe[t, c] += the rows at position t, in batch order. */
__global__ static void embedding_dwpe_kernel(float *dwpe, const float *dout, int B, int T, int C) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)T * C) return;
    float acc = 0.0f;
    for (int b = 0; b < B; b++) acc += dout[(size_t)b * T * C + i];
    dwpe[i] += acc;
}

void cuda_embedding_backward(Stream *s, float *dwte, float *dwpe, const float *dout, const int *tokens,
                             int B, int T, int C, int V) {
    cudaStream_t stream = cuda_stream(s);
    embedding_dwte_kernel<<<blocks_for((size_t)V * C), THREADS, 0, stream>>>(dwte, dout, tokens, B * T, V, C);
    CHECK_LAUNCH("embedding_dwte_kernel");
    embedding_dwpe_kernel<<<blocks_for((size_t)T * C), THREADS, 0, stream>>>(dwpe, dout, B, T, C);
    CHECK_LAUNCH("embedding_dwpe_kernel");
}
