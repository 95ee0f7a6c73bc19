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
#include "../packs.h"

/* Check the launch just made (CUDA reports a bad configuration here). */
#define CHECK_LAUNCH(name) cuda_check_launch(name, __FILE__, __LINE__)
#define CHECK_CUDA(call) cuda_check((call), #call, __FILE__, __LINE__)
#define CHECK_CUBLAS(call) cublas_check((call), #call, __FILE__, __LINE__)

enum { THREADS = 256, WARP = 32 };

/* At least one block, so an empty op is still a valid launch. */
static inline unsigned blocks_for(size_t n) { return n ? (unsigned)((n + THREADS - 1) / THREADS) : 1u; }

/* A kernel that takes PACK_NUMBERS numbers a thread (packs.h): its blocks,
 * a tile each, and where this thread's numbers lie in its block's tile. */
static inline unsigned pack_blocks_for(size_t n) { return n ? (unsigned)pack_tiles(n, THREADS) : 1u; }

typedef struct {
    size_t first;  /* the tile's first number */
    int packed;    /* side by side, by 16-byte accesses (tile_packed) */
} Tile;

__device__ static inline Tile this_tile(size_t n, int aligned) {
    size_t first = tile_first(blockIdx.x, THREADS);
    Tile tile = { first, tile_packed(first, THREADS, n, aligned) };
    return tile;
}

/* This thread's number k of its tile. */
__device__ static inline size_t tile_number(Tile tile, int k) {
    return pack_number(tile.first, THREADS, threadIdx.x, k, tile.packed);
}

/* This thread's numbers of x, held as `held`, as fp32 (0 at n and past it):
 * by a 16-byte load of bf16s or two of fp32s where the tile is packed, else
 * one at a time by number_at. */
__device__ static inline void load_pack(float v[PACK_NUMBERS], const void *x, DType held, Tile tile, size_t n) {
    size_t at = tile_number(tile, 0);
    if (tile.packed && held == DTYPE_BF16) {
        uint4 raw = *(const uint4 *)((const bf16 *)x + at);
        const uint32_t words[PACK_NUMBERS / 2] = { raw.x, raw.y, raw.z, raw.w };
#pragma unroll
        for (int k = 0; k < PACK_NUMBERS / 2; k++) {
            v[2 * k] = float_from_bf16(pack_low(words[k]));
            v[2 * k + 1] = float_from_bf16(pack_high(words[k]));
        }
    } else if (tile.packed && held == DTYPE_FP32) {
        const float4 *four = (const float4 *)((const float *)x + at);
        float4 lo = four[0], hi = four[1];
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
        v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
#pragma unroll
        for (int k = 0; k < PACK_NUMBERS; k++) {
            size_t i = tile_number(tile, k);
            v[k] = i < n ? number_at(x, held, i) : 0.0f;
        }
    }
}

/* This thread's numbers below n stored into x as it is held (number_put's
 * rounding into bf16), by 16-byte stores where the tile is packed. */
__device__ static inline void store_pack(void *x, DType held, Tile tile, size_t n, const float v[PACK_NUMBERS]) {
    size_t at = tile_number(tile, 0);
    if (tile.packed && held == DTYPE_BF16) {
        uint32_t words[PACK_NUMBERS / 2];
#pragma unroll
        for (int k = 0; k < PACK_NUMBERS / 2; k++)
            words[k] = pack_word(bf16_from_float(v[2 * k]), bf16_from_float(v[2 * k + 1]));
        *(uint4 *)((bf16 *)x + at) = make_uint4(words[0], words[1], words[2], words[3]);
    } else if (tile.packed && held == DTYPE_FP32) {
        float4 *four = (float4 *)((float *)x + at);
        four[0] = make_float4(v[0], v[1], v[2], v[3]);
        four[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int k = 0; k < PACK_NUMBERS; k++) {
            size_t i = tile_number(tile, k);
            if (i < n) number_put(x, held, i, v[k]);
        }
    }
}

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
void cuda_sumsq_reduce(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch);
void cuda_count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch);
void cuda_fill_zero(Stream *s, void *x, size_t bytes);
/* column_sums.cu: out[c] += partial[0, c] + partial[1, c] + ..., the parts of N rows in order, the sum
 * rounded to bf16 first where `rounds`, stored as out is held. */
void cuda_add_column_parts(Stream *s, Buf out, const float *partial, int N, int width, int rounds);
/* precision.cu */
void cuda_round_to_bf16(Stream *s, float *out, const float *in, size_t n);
void cuda_store_bf16(Stream *s, bf16 *out, const float *in, size_t n);
void cuda_load_bf16(Stream *s, float *out, const bf16 *in, size_t n);

#endif
