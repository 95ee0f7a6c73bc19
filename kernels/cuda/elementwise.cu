/* elementwise.cu: GELU, residual add, biases, dropout and zero fill on the GPU;
 * each output rounded under autocast, as the CPU's (kernels.h); GELU's input
 * read as it is held, fp32 or bf16. The elementwise kernels take
 * PACK_NUMBERS numbers a thread (packs.h: 16-byte loads and stores where the
 * op's pointers allow), the column sums a column a thread. */
#include <math.h>

#include "../dropout.h"
#include "cuda_kernels.cuh"

/* GELU exact (erf, nanoGPT's) or in GPT-2's tanh form (transformers' gelu_new) */
static constexpr float GELU_TANH_SCALE = 0.7978845608028654f, GELU_TANH_CUBIC = 0.044715f;

__device__ static float gelu(float x, int tanh_form) {
    return tanh_form ? 0.5f * x * (1.0f + tanhf(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x * x * x)))
                     : 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
}

__global__ static void gelu_forward_kernel(Buf out, ConstBuf inp, size_t n, int tanh_form, int rounds,
                                           int aligned) {
    Tile tile = this_tile(n, aligned);
    float v[PACK_NUMBERS];
    load_pack(v, inp.data, inp.dtype, tile, n);
#pragma unroll
    for (int k = 0; k < PACK_NUMBERS; k++) v[k] = rounded_if(gelu(v[k], tanh_form), rounds);
    store_pack(out.data, out.dtype, tile, n, v);
}

void cuda_gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding) {
    gelu_forward_kernel<<<pack_blocks_for(n), THREADS, 0, cuda_stream(s)>>>(
        out, inp, n, tanh_form, rounding == DTYPE_BF16, packs_aligned(out.data, inp.data, NULL));
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
                                            int rounds, int aligned) {
    Tile tile = this_tile(n, aligned);
    float x[PACK_NUMBERS], g[PACK_NUMBERS];
    load_pack(x, inp.data, inp.dtype, tile, n);
    load_pack(g, dout.data, dout.dtype, tile, n);
#pragma unroll
    for (int k = 0; k < PACK_NUMBERS; k++) g[k] = gelu_gradient(x[k], g[k], tanh_form, rounds);
    store_pack(dinp.data, dinp.dtype, tile, n, g);
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
        gelu_backward_kernel<<<pack_blocks_for(n), THREADS, 0, cuda_stream(s)>>>(
            dinp, inp, dout, n, tanh_form, rounds, packs_aligned(dinp.data, inp.data, dout.data));
        CHECK_LAUNCH("gelu_backward_kernel");
        return;
    }
    if (N == 0) return;
    dim3 grid((unsigned)row_parts(N), blocks_for((size_t)OC));
    gelu_bias_part_kernel<<<grid, THREADS, 0, cuda_stream(s)>>>(scratch, dinp, inp, dout, N, OC, tanh_form, rounds);
    CHECK_LAUNCH("gelu_bias_part_kernel");
    cuda_add_column_parts(s, dbias, scratch, N, OC, rounds);
}

__global__ static void residual_kernel(Buf out, ConstBuf a, ConstBuf b, size_t n, int rounds, int aligned) {
    Tile tile = this_tile(n, aligned);
    float x[PACK_NUMBERS], y[PACK_NUMBERS];
    load_pack(x, a.data, a.dtype, tile, n);
    load_pack(y, b.data, b.dtype, tile, n);
#pragma unroll
    for (int k = 0; k < PACK_NUMBERS; k++) x[k] = rounded_if(x[k] + y[k], rounds);
    store_pack(out.data, out.dtype, tile, n, x);
}

void cuda_residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding) {
    residual_kernel<<<pack_blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, a, b, n, rounding == DTYPE_BF16,
                                                                        packs_aligned(out.data, a.data, b.data));
    CHECK_LAUNCH("residual_kernel");
}

__global__ static void bias_forward_kernel(Buf out, const float *inp, ConstBuf bias, int N, int OC, int rounds,
                                           int aligned) {
    size_t n = (size_t)N * OC;
    Tile tile = this_tile(n, aligned);
    float v[PACK_NUMBERS];
    load_pack(v, inp, DTYPE_FP32, tile, n);
#pragma unroll
    for (int k = 0; k < PACK_NUMBERS; k++) {
        if (bias.data) v[k] = v[k] + number_at(bias.data, bias.dtype, tile_number(tile, k) % OC);
        v[k] = rounded_if(v[k], rounds);
    }
    store_pack(out.data, out.dtype, tile, n, v);
}

void cuda_bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding) {
    bias_forward_kernel<<<pack_blocks_for((size_t)N * OC), THREADS, 0, cuda_stream(s)>>>(
        out, inp, bias, N, OC, rounding == DTYPE_BF16, packs_aligned(out.data, inp, NULL));
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

/* The same Philox mask as the CPU's, each element's scale from its index. */
__global__ static void dropout_kernel(Buf out, ConstBuf inp, size_t n, Dropout drop, int rounds, int aligned) {
    drop = dropout_resolved(drop);
    Tile tile = this_tile(n, aligned);
    float v[PACK_NUMBERS];
    load_pack(v, inp.data, inp.dtype, tile, n);
#pragma unroll
    for (int k = 0; k < PACK_NUMBERS; k++)
        v[k] = rounded_if(v[k] * dropout_scale_at(drop, tile_number(tile, k)), rounds);
    store_pack(out.data, out.dtype, tile, n, v);
}

void cuda_dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding) {
    dropout_kernel<<<pack_blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, inp, n, drop, rounding == DTYPE_BF16,
                                                                       packs_aligned(out.data, inp.data, NULL));
    CHECK_LAUNCH("dropout_kernel");
}

void cuda_fill_zero(Stream *s, void *x, size_t bytes) {
    CHECK_CUDA(cudaMemsetAsync(x, 0, bytes, cuda_stream(s)));
}
