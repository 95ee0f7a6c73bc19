/* layernorm.cu: LayerNorm (no bias, eps 1e-5) on the GPU.
 *
 * A warp per row for the per-row work. The weight gradient sums over rows
 * without atomics: blocks of LAYERNORM_PART_ROWS rows write per-column
 * partials into the caller's scratch, and one thread per column adds the
 * partials in order.
 */
#include "cuda_kernels.cuh"

/* A warp per row: mean, then variance about it (two passes, as the CPU). */
__global__ static void layernorm_forward_kernel(float *out, float *mean, float *rstd, const float *inp,
                                                const float *weight, int N, int C) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)N) return;
    const float *x = inp + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP) sum += x[c];
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += WARP) var += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
    float *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += WARP) o[c] = (x[c] - m) * r * weight[c];
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

void cuda_layernorm_forward(Stream *s, float *out, float *mean, float *rstd, const float *inp,
                            const float *weight, int N, int C) {
    layernorm_forward_kernel<<<blocks_for((size_t)N * WARP), THREADS, 0, cuda_stream(s)>>>(out, mean, rstd, inp,
                                                                                          weight, N, C);
    CHECK_LAUNCH("layernorm_forward_kernel");
}

/* dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w */
__global__ static void layernorm_dinp_kernel(float *dinp, const float *dout, const float *inp, const float *weight,
                                             const float *mean, const float *rstd, int N, int C) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)N) return;
    const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = dy[c] * weight[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (x[c] - m) * r;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (x[c] - m) * r;
        dx[c] += r * (dy[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean);
    }
}

/* partial[part, c] = sum over the part's rows of dout * norm */
__global__ static void layernorm_dweight_part_kernel(float *partial, const float *dout, const float *inp,
                                                     const float *mean, const float *rstd, int N, int C) {
    int part = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int end = min(N, (part + 1) * LAYERNORM_PART_ROWS);
    float acc = 0.0f;
    for (int i = part * LAYERNORM_PART_ROWS; i < end; i++)
        acc += dout[(size_t)i * C + c] * (inp[(size_t)i * C + c] - mean[i]) * rstd[i];
    partial[(size_t)part * C + c] = acc;
}

/* out[c] += sum over parts, in order, of partial[part, c] */
__global__ static void sum_parts_kernel(float *out, const float *partial, int parts, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int p = 0; p < parts; p++) acc += partial[(size_t)p * C + c];
    out[c] += acc;
}

void cuda_layernorm_backward(Stream *s, float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C,
                             float *scratch) {
    if (N == 0) return;
    cudaStream_t stream = cuda_stream(s);
    layernorm_dinp_kernel<<<blocks_for((size_t)N * WARP), THREADS, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                              rstd, N, C);
    CHECK_LAUNCH("layernorm_dinp_kernel");
    int parts = (N + LAYERNORM_PART_ROWS - 1) / LAYERNORM_PART_ROWS;
    float *partial = scratch;  /* layernorm_scratch_floats(N, C): parts x C */
    dim3 grid(blocks_for((size_t)C), (unsigned)parts);
    layernorm_dweight_part_kernel<<<grid, THREADS, 0, stream>>>(partial, dout, inp, mean, rstd, N, C);
    CHECK_LAUNCH("layernorm_dweight_part_kernel");
    sum_parts_kernel<<<blocks_for((size_t)C), THREADS, 0, stream>>>(dweight, partial, parts, C);
    CHECK_LAUNCH("sum_parts_kernel");
}
