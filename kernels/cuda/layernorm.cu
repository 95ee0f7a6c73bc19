/* layernorm.cu: LayerNorm (eps 1e-5) and the bias after it, with the
 * residual add before it in one kernel, and its backward, on the GPU,
 * rounding as the CPU's; the backward reads the input as it is held, fp32 or
 * bf16.
 *
 * A warp per row for the per-row work. The weight gradient sums over rows
 * without atomics, in the parts of row_parts.h (column_sums.cu): the CPU's
 * adds, its bits.
 */
#include "cuda_kernels.cuh"

/* Row `row` by its warp: mean, then variance about it (two passes, as the
 * CPU), then out = the normalised row times the weight, plus the bias where
 * there is one, rounded where `rounds`, each held as its buffer says. Lane
 * l takes channels l, l + WARP, ... */
__device__ static void layernorm_row(Buf out, float *mean, float *rstd, ConstBuf inp, ConstBuf weight,
                                     ConstBuf bias, size_t row, int C, int lane, int rounds) {
    size_t first = row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP) sum += number_at(inp.data, inp.dtype, first + c);
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float d = number_at(inp.data, inp.dtype, first + c) - m;
        var += d * d;
    }
    float r = 1.0f / sqrtf(warp_sum(var) / C + 1e-5f);
    for (int c = lane; c < C; c += WARP) {
        float v = (number_at(inp.data, inp.dtype, first + c) - m) * r * number_at(weight.data, weight.dtype, c);
        if (bias.data) v = v + number_at(bias.data, bias.dtype, c);
        number_put(out.data, out.dtype, first + c, rounded_if(v, rounds));
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

__global__ static void layernorm_forward_kernel(Buf out, float *mean, float *rstd, ConstBuf inp,
                                                ConstBuf weight, ConstBuf bias, int N, int C, int rounds) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    if (row < (size_t)N) layernorm_row(out, mean, rstd, inp, weight, bias, row, C, threadIdx.x % WARP, rounds);
}

void cuda_layernorm_forward(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp,
                            ConstBuf weight, ConstBuf bias, int N, int C, DType rounding) {
    layernorm_forward_kernel<<<blocks_for((size_t)N * WARP), THREADS, 0, cuda_stream(s)>>>(
        out, mean, rstd, inp, weight, bias, N, C, rounding == DTYPE_BF16);
    CHECK_LAUNCH("layernorm_forward_kernel");
}

/* The residual add, then the LayerNorm of the sum, a warp a row: each lane
 * reads back only the channels it wrote (layernorm_row's), so the row needs
 * no barrier, and the sum is read from cache rather than a kernel later. */
__global__ static void residual_layernorm_kernel(Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                                 ConstBuf b, ConstBuf weight, ConstBuf bias, int N,
                                                 int C, int rounds) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)N) return;
    for (int c = lane; c < C; c += WARP) {
        size_t i = row * C + c;
        float v = number_at(a.data, a.dtype, i) + number_at(b.data, b.dtype, i);
        number_put(resid.data, resid.dtype, i, rounded_if(v, rounds));
    }
    layernorm_row(out, mean, rstd, const_buf(resid), weight, bias, row, C, lane, rounds);
}

void cuda_residual_layernorm_forward(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                     ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C,
                                     DType rounding) {
    residual_layernorm_kernel<<<blocks_for((size_t)N * WARP), THREADS, 0, cuda_stream(s)>>>(
        resid, out, mean, rstd, a, b, weight, bias, N, C, rounding == DTYPE_BF16);
    CHECK_LAUNCH("residual_layernorm_kernel");
}

/* dinp += rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w;
 * rounding as the CPU's: dinp = bf16(dinp + bf16(the gradient)) */
__global__ static void layernorm_dinp_kernel(Buf dinp, ConstBuf dout, ConstBuf inp, ConstBuf weight,
                                             const float *mean, const float *rstd, int N, int C, int rounds) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)N) return;
    size_t x0 = (size_t)row * C;  /* the row's first number in inp and in dout */
    float m = mean[row], r = rstd[row];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        float dnorm = number_at(dout.data, dout.dtype, x0 + c) * number_at(weight.data, weight.dtype, c);
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * (number_at(inp.data, inp.dtype, x0 + c) - m) * r;
    }
    dnorm_mean = warp_sum(dnorm_mean) / C;
    dnorm_norm_mean = warp_sum(dnorm_norm_mean) / C;
    for (int c = lane; c < C; c += WARP) {
        float norm = (number_at(inp.data, inp.dtype, x0 + c) - m) * r;
        float dnorm = number_at(dout.data, dout.dtype, x0 + c) * number_at(weight.data, weight.dtype, c);
        float g = r * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
        float dx = number_at(dinp.data, dinp.dtype, x0 + c) + rounded_if(g, rounds);
        number_put(dinp.data, dinp.dtype, x0 + c, rounded_if(dx, rounds));
    }
}

/* partial[part, c] = sum from 0, in row order, of the part's dout * norm;
 * with bias_partial, also bias_partial[part, c] = the part's sum of dout (a
 * bias after the LayerNorm: bias_part_kernel's adds), from the same reads */
__global__ static void layernorm_dweight_part_kernel(float *partial, float *bias_partial, ConstBuf dout,
                                                     ConstBuf inp, const float *mean, const float *rstd, int N,
                                                     int C) {
    int part = blockIdx.x;  /* the parts on x, whose limit is 2^31 - 1 blocks; the columns on y */
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f, bias_acc = 0.0f;
    for (int i = part_first_row(part); i < part_end_row(part, N); i++) {
        float dy = number_at(dout.data, dout.dtype, (size_t)i * C + c);
        acc += dy * (number_at(inp.data, inp.dtype, (size_t)i * C + c) - mean[i]) * rstd[i];
        bias_acc += dy;
    }
    partial[(size_t)part * C + c] = acc;
    if (bias_partial) bias_partial[(size_t)part * C + c] = bias_acc;
}

void cuda_layernorm_backward(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout, ConstBuf inp,
                             ConstBuf weight, const float *mean, const float *rstd, int N, int C,
                             float *scratch, DType rounding) {
    if (N == 0) return;
    cudaStream_t stream = cuda_stream(s);
    layernorm_dinp_kernel<<<blocks_for((size_t)N * WARP), THREADS, 0, stream>>>(dinp, dout, inp, weight, mean,
                                                                              rstd, N, C, rounding == DTYPE_BF16);
    CHECK_LAUNCH("layernorm_dinp_kernel");
    /* column_sums_scratch_floats(N, 2C): parts x C for the weight, then parts x C for the bias */
    float *partial = scratch, *bias_partial = dbias.data ? scratch + (size_t)row_parts(N) * C : NULL;
    dim3 grid((unsigned)row_parts(N), blocks_for((size_t)C));
    layernorm_dweight_part_kernel<<<grid, THREADS, 0, stream>>>(partial, bias_partial, dout, inp, mean, rstd, N, C);
    CHECK_LAUNCH("layernorm_dweight_part_kernel");
    cuda_add_column_parts(s, dweight, partial, N, C, rounding == DTYPE_BF16);
    if (dbias.data) cuda_add_column_parts(s, dbias, bias_partial, N, C, rounding == DTYPE_BF16);
}
