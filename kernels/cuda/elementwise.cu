/* elementwise.cu: GELU, residual add, biases, dropout and zero fill on the GPU;
 * each output rounded under autocast, as the CPU's (kernels.h); GELU's input
 * read as it is held, fp32 or bf16. */
#include <math.h>

#include "../dropout.h"
#include "cuda_kernels.cuh"

/* GELU exact (erf, nanoGPT's) or in GPT-2's tanh form (transformers' gelu_new) */
static constexpr float GELU_TANH_SCALE = 0.7978845608028654f, GELU_TANH_CUBIC = 0.044715f;

__global__ static void gelu_forward_kernel(Buf out, ConstBuf inp, size_t n, int tanh_form, int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = number_at(inp.data, inp.dtype, i);
    float y = tanh_form ? 0.5f * x * (1.0f + tanhf(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x * x * x)))
                        : 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
    number_put(out.data, out.dtype, i, rounded_if(y, rounds));
}

void cuda_gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding) {
    gelu_forward_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, inp, n, tanh_form,
                                                                       rounding == DTYPE_BF16);
    CHECK_LAUNCH("gelu_forward_kernel");
}

/* dy * GELU'(x), rounded to bf16 where `rounds` (the CPU's arithmetic). */
__device__ static float gelu_gradient(float x, float dy, int tanh_form, int rounds) {
    float g;
    if (tanh_form) {
        float t = tanhf(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x * x * x));
        float du = GELU_TANH_SCALE * (1.0f + 3.0f * GELU_TANH_CUBIC * x * x);
        g = dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
    } else {
        const float inv_sqrt_2pi = 0.3989422804014327f;
        float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
        g = dy * (cdf + x * pdf);
    }
    return rounded_if(g, rounds);
}

__global__ static void gelu_backward_kernel(Buf dinp, ConstBuf inp, ConstBuf dout, size_t n, int tanh_form,
                                            int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = gelu_gradient(number_at(inp.data, inp.dtype, i), number_at(dout.data, dout.dtype, i), tanh_form, rounds);
    number_put(dinp.data, dinp.dtype, i, g);
}

/* The gradient and the bias's parts in one pass: a thread a column of a
 * part, its rows from 0 in order (as bias_part_kernel adds the written
 * gradient), each element written as it is added. */
__global__ static void gelu_bias_part_kernel(float *partial, Buf dinp, ConstBuf inp, ConstBuf dout, int N, int OC,
                                             int tanh_form, int rounds) {
    int part = blockIdx.x;  /* the parts on x, whose limit is 2^31 - 1 blocks; the columns on y */
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float acc = 0.0f;
    for (int n = part_first_row(part); n < part_end_row(part, N); n++) {
        size_t i = (size_t)n * OC + c;
        float g = gelu_gradient(number_at(inp.data, inp.dtype, i), number_at(dout.data, dout.dtype, i), tanh_form,
                                rounds);
        number_put(dinp.data, dinp.dtype, i, g);
        acc += g;
    }
    partial[(size_t)part * OC + c] = acc;
}

void cuda_gelu_backward(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                        int tanh_form, DType rounding, float *scratch) {
    int rounds = rounding == DTYPE_BF16;
    if (!dbias.data) {
        size_t n = (size_t)N * OC;
        gelu_backward_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(dinp, inp, dout, n, tanh_form, rounds);
        CHECK_LAUNCH("gelu_backward_kernel");
        return;
    }
    if (N == 0) return;
    dim3 grid((unsigned)row_parts(N), blocks_for((size_t)OC));
    gelu_bias_part_kernel<<<grid, THREADS, 0, cuda_stream(s)>>>(scratch, dinp, inp, dout, N, OC, tanh_form, rounds);
    CHECK_LAUNCH("gelu_bias_part_kernel");
    cuda_add_column_parts(s, dbias, scratch, N, OC, rounds);
}

__global__ static void residual_kernel(Buf out, ConstBuf a, ConstBuf b, size_t n, int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = number_at(a.data, a.dtype, i) + number_at(b.data, b.dtype, i);
    number_put(out.data, out.dtype, i, rounded_if(v, rounds));
}

void cuda_residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding) {
    residual_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, a, b, n, rounding == DTYPE_BF16);
    CHECK_LAUNCH("residual_kernel");
}

__global__ static void bias_forward_kernel(Buf out, const float *inp, ConstBuf bias, int N, int OC, int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * OC) return;
    float v = inp[i];
    if (bias.data) v = v + number_at(bias.data, bias.dtype, i % OC);
    number_put(out.data, out.dtype, i, rounded_if(v, rounds));
}

void cuda_bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding) {
    bias_forward_kernel<<<blocks_for((size_t)N * OC), THREADS, 0, cuda_stream(s)>>>(out, inp, bias, N, OC,
                                                                                   rounding == DTYPE_BF16);
    CHECK_LAUNCH("bias_forward_kernel");
}

/* partial[part, c] = sum from 0, in row order, of the part's dout[., c]: the
 * parts of row_parts.h side by side, then added in order (column_sums.cu). */
__global__ static void bias_part_kernel(float *partial, ConstBuf dout, int N, int OC) {
    int part = blockIdx.x;  /* the parts on x, whose limit is 2^31 - 1 blocks; the columns on y */
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= OC) return;
    float acc = 0.0f;
    for (int n = part_first_row(part); n < part_end_row(part, N); n++)
        acc += number_at(dout.data, dout.dtype, (size_t)n * OC + c);
    partial[(size_t)part * OC + c] = acc;
}

void cuda_bias_backward(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding) {
    if (N == 0) return;
    dim3 grid((unsigned)row_parts(N), blocks_for((size_t)OC));
    bias_part_kernel<<<grid, THREADS, 0, cuda_stream(s)>>>(scratch, dout, N, OC);
    CHECK_LAUNCH("bias_part_kernel");
    cuda_add_column_parts(s, dbias, scratch, N, OC, rounding == DTYPE_BF16);
}

/* The same Philox mask as the CPU's, one element per thread. */
__global__ static void dropout_kernel(Buf out, ConstBuf inp, size_t n, Dropout drop, int rounds) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = number_at(inp.data, inp.dtype, i) * dropout_scale_at(drop, i);
    number_put(out.data, out.dtype, i, rounded_if(v, rounds));
}

void cuda_dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding) {
    dropout_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, inp, n, drop, rounding == DTYPE_BF16);
    CHECK_LAUNCH("dropout_kernel");
}

void cuda_fill_zero(Stream *s, void *x, size_t bytes) {
    CHECK_CUDA(cudaMemsetAsync(x, 0, bytes, cuda_stream(s)));
}
