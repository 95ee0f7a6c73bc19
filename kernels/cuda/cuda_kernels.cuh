/* cuda_kernels.cuh: what the CUDA kernel files share: the ops they implement
 * (kernels.h says what each does), launch shapes, the checks, and the warp and
 * block sums. Each kernels/cuda/X.cu holds the ops of kernels/cpu/X.c.
 *
 * Every reduction here sums in an order fixed by the shapes alone (a fixed
 * tree per block, then blocks in index order), never with atomics, so a run
 * repeats bit for bit and the strategies stay bit-identical on the GPU too.
 */
#ifndef ZF_CUDA_KERNELS_CUH
#define ZF_CUDA_KERNELS_CUH

#include "../../runtime/device_cuda.h"
#include "../backend.h"

/* Check the launch just made (CUDA reports a bad configuration here). */
#define CHECK_LAUNCH(name) cuda_check_launch(name, __FILE__, __LINE__)
#define CHECK_CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)
#define CHECK_CUBLAS(call) cublas_check((call), #call, __FILE__, __LINE__)

enum { THREADS = 256, WARP = 32 };

/* At least one block, so an empty op is still a valid launch. */
static inline unsigned blocks_for(size_t n) { return n ? (unsigned)((n + THREADS - 1) / THREADS) : 1u; }

/* Warp-wide sum and max, the same butterfly every time. */
__device__ static inline float warp_sum(float x) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ static inline float warp_max(float x) {
    for (int offset = WARP / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    return x;
}

/* The block's sum of its threads' values, in double, by a fixed tree; every
 * thread of the block gets it. blockDim.x must be THREADS. */
__device__ static inline double block_sum(double x) {
    __shared__ double shared[THREADS];
    shared[threadIdx.x] = x;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
        __syncthreads();
    }
    double total = shared[0];
    __syncthreads();
    return total;
}

void cuda_embedding_forward(Stream *s, Buf out, const int *tokens, ConstBuf wte, ConstBuf wpe,
                            int B, int T, int C, DType rounding);
void cuda_embedding_backward(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head, TokenBuckets buckets,
                             int B, int T, int V, int C, DType rounding);
void cuda_layernorm_forward(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp,
                            ConstBuf weight, ConstBuf bias, int N, int C, DType rounding);
void cuda_residual_layernorm_forward(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                     ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C,
                                     DType rounding);
void cuda_layernorm_backward(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout, ConstBuf inp,
                             ConstBuf weight, const float *mean, const float *rstd, int N, int C,
                             float *scratch, DType rounding);
void cuda_matmul_forward(Stream *s, float *out, const float *inp, const float *weight, int N, int C, int OC);
void cuda_matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC);
void cuda_matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C,
                              int OC);
void cuda_matmul_backward_bf16(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                               ConstBuf weight, int N, int C, int OC);
AttentionBuffers cuda_attention_buffers(int B, int T, int C, int NH, DType products);
void cuda_attention_forward(Stream *s, Buf out, float *saved, float *scratch, ConstBuf qkv, int B, int T,
                            int C, int NH, Dropout drop, DType products, DType rounding);
void cuda_attention_backward(Stream *s, Buf dqkv, float *scratch, ConstBuf dout, ConstBuf qkv,
                             ConstBuf out, const float *saved, int B, int T, int C, int NH, Dropout drop,
                             DType products, DType rounding);
void cuda_gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding);
void cuda_gelu_backward(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                        int tanh_form, DType rounding, float *scratch);
void cuda_residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding);
void cuda_bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding);
void cuda_bias_backward(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding);
void cuda_dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding);
void cuda_crossentropy_forward_backward(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                        const int *targets, int N, int V, float dloss, DType rounding);
void cuda_mean_forward(Stream *s, float *mean, const float *x, int n);
void cuda_adamw_arena(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                      size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip);
void cuda_sumsq_reduce(Stream *s, float *out, const void *x, DType held, size_t n, double *scratch);
void cuda_count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, double *scratch);
void cuda_fill_zero(Stream *s, void *x, size_t bytes);
/* column_sums.cu: out[c] += partial[0, c] + partial[1, c] + ..., the parts of N rows in order, the sum
 * rounded to bf16 first where `rounds`, stored as out is held. */
void cuda_add_column_parts(Stream *s, Buf out, const float *partial, int N, int width, int rounds);
/* precision.cu */
void cuda_round_to_bf16(Stream *s, float *out, const float *in, size_t n);
void cuda_store_bf16(Stream *s, bf16 *out, const float *in, size_t n);
void cuda_load_bf16(Stream *s, float *out, const bf16 *in, size_t n);

#endif
