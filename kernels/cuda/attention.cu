/* attention.cu: causal multi-head self-attention on the GPU.
 *
 * In bf16 (products = DTYPE_BF16, heads of at most FLASH_MAX_HEAD
 * channels), as FlashAttention-2 does it, on the tensor cores (mma.sync
 * m16n8k16, bf16 in, fp32 sums): a block takes 64 query rows of one (batch
 * row, head), walks the key blocks they see with an online softmax, and keeps
 * one log-sum-exp a row; no T x T matrix is held. The backward recomputes each
 * tile's probabilities from it, and makes its gradients without atomics: one
 * pass over the query blocks per key block for dk and dv, one over the key
 * blocks per query block for dq, each element written by one thread, the sums
 * in an order fixed by the shapes. q, k and v are read in place from qkv
 * (fp32 buffers of bf16 values), staged in shared memory as bf16 (exact). The
 * tiles' arithmetic is attention_tiles.h's; the CPU's op rounds where these
 * kernels do (kernels/cpu/attention.c).
 *
 * Otherwise through cuBLAS: the loop is over heads, each one strided-batched
 * over the batch rows (q, k and v of head h are column blocks of qkv[B,T,3C]
 * with row stride 3C, with no permutes); as in matmul.cu, each product is
 * written for cuBLAS's column-major view of the row-major matrices. The T x T
 * probabilities are kept for the backward. In bf16 (heads past
 * FLASH_MAX_HEAD) the weights and dS round where the CPU's op rounds them:
 * each probability relative to the running max of its block of FLASH_ROWS
 * keys, and dS from the delta dy . y.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../runtime/gpu_libraries.h"
#include "../attention_tiles.h"
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

/* In bf16, a warp per row t: att = the causal softmax of the scaled scores
 * there (kept for the backward, unrounded), and weights = what the CPU's op
 * and the tensor cores multiply v by: each probability taken relative to the
 * row's running max at the end of its block of FLASH_ROWS keys, dropped out
 * (element row * T + j of [B,NH,T,T], as on the CPU), rounded to bf16, then
 * brought to the row's final max and sum. Zero past t. */
__global__ static void causal_softmax_bf16_kernel(float *att, float *weights, int rows, int T, Dropout drop) {
    drop = dropout_resolved(drop);
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows) return;
    int t = (int)(row % T);
    float *a = att + (size_t)row * T, *w = weights + (size_t)row * T;
    float maxval = -INFINITY;
    for (int j = lane; j <= t; j += WARP) maxval = fmaxf(maxval, a[j]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += WARP) sum += expf(a[j] - maxval);
    float inv = 1.0f / warp_sum(sum), running = -INFINITY;
    for (int key0 = 0; key0 <= t; key0 += FLASH_ROWS) {
        int end = min(key0 + FLASH_ROWS, t + 1);
        float block_max = -INFINITY;
        for (int j = key0 + lane; j < end; j += WARP) block_max = fmaxf(block_max, a[j]);
        running = fmaxf(running, warp_max(block_max));
        float to_row = expf(running - maxval) * inv;
        for (int j = key0 + lane; j < end; j += WARP) {
            float s = a[j], kept = drop.p > 0.0f ? dropout_scale_at(drop, (size_t)row * T + j) : 1.0f;
            w[j] = bf16_rounded(expf(s - running) * kept) * to_row;
            a[j] = expf(s - maxval) * inv;
        }
    }
    for (int j = t + 1 + lane; j < T; j += WARP) a[j] = w[j] = 0.0f;
}

/* weights = att * mask (the dropout of the attention weights), rounded to
 * bf16 with round_weights; with datt given, also datt *= mask. Element i is
 * element i of [B,NH,T,T], as on the CPU. */
__global__ static void attention_dropout_kernel(float *weights, float *datt, const float *att, size_t n,
                                                Dropout drop, int round_weights) {
    drop = dropout_resolved(drop);
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float scale = drop.p > 0.0f ? dropout_scale_at(drop, i) : 1.0f;
    float w = att[i] * scale;
    weights[i] = rounded_if(w, round_weights);
    if (datt) datt[i] *= scale;
}

/* A warp per row: dpre = att * (datt - delta) in place, zero past t, where
 * delta = sum(att * datt), or the row's given delta[row] (dy . y). */
__global__ static void softmax_backward_kernel(float *datt, const float *att, const float *delta, int rows, int T) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)rows) return;
    int t = (int)(row % T);
    const float *a = att + (size_t)row * T;
    float *d = datt + (size_t)row * T;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += WARP) dot += a[j] * d[j];
    dot = delta ? delta[row] : warp_sum(dot);
    for (int j = lane; j < T; j += WARP) d[j] = j <= t ? a[j] * (d[j] - dot) : 0.0f;
}

/* C[b] = alpha * op(A[b]) @ op(B[b]) + beta * C[b] for b < B, column-major. */
static void gemm_batched(cublasHandle_t blas, cublasOperation_t opa, cublasOperation_t opb, int m, int n, int k,
                         float alpha, const float *a, int lda, long long stride_a, const float *b, int ldb,
                         long long stride_b, float beta, float *c, int ldc, long long stride_c, int batch) {
    CHECK_CUBLAS(gpu_cublas()->sgemm_strided_batched(blas, opa, opb, m, n, k, &alpha, a, lda, stride_a, b, ldb, stride_b,
                                           &beta, c, ldc, stride_c, batch));
}

/* ---- bf16, on the tensor cores ------------------------------------------- */

/* Shared-memory tiles of bf16 are FLASH_ROWS rows of a head's (padded) HS
 * channels, or transposed, HS rows of FLASH_ROWS; each row FLASH_PAD numbers
 * longer than it holds, so that a warp's reads of a column fall in more banks. */
enum { FLASH_THREADS = FLASH_WARPS * WARP, FLASH_PAD = 8, FLASH_COLUMN = FLASH_ROWS + FLASH_PAD };

/* Two numbers rounded to bf16 in 32 bits, the first in the low half: a pair
 * of mma.sync's operands. */
__device__ static inline uint32_t bf16_pair(float first, float second) {
    return (uint32_t)bf16_from_float(first) | (uint32_t)bf16_from_float(second) << 16;
}

/* The pair at (row, col) of a tile with rows of `stride` numbers (col even). */
__device__ static inline uint32_t pair_at(const bf16 *tile, int stride, int row, int col) {
    return *(const uint32_t *)(tile + row * stride + col);
}

/* mma.sync m16n8k16's A operand (16 x 16, row-major) for lane `lane`: rows
 * r0.., columns k0.. of a tile (attention_tiles.h's mma_a_row and mma_a_col). */
__device__ static inline void a_fragment(uint32_t a[4], const bf16 *tile, int stride, int r0, int k0, int lane) {
    #pragma unroll
    for (int r = 0; r < 4; r++) a[r] = pair_at(tile, stride, r0 + mma_a_row(lane, 2 * r), k0 + mma_a_col(lane, 2 * r));
}

/* Its B operand (16 x 8, k by n) for lane l: rows k0.. of column n0.., read
 * from a tile that holds B transposed (row n, column k). */
__device__ static inline void b_fragment(uint32_t b[2], const bf16 *tile, int stride, int n0, int k0, int lane) {
    b[0] = pair_at(tile, stride, n0 + mma_b_n(lane), k0 + mma_b_k(lane, 0));
    b[1] = pair_at(tile, stride, n0 + mma_b_n(lane), k0 + mma_b_k(lane, 2));
}

/* The A operand of columns 16kk.. of a 16-row product a warp holds (acc[j]
 * its columns 8j..8j+7 as mma.sync leaves them), rounded to bf16: product
 * tiles 2kk and 2kk+1 hold, in the same lane, exactly the numbers A takes. */
__device__ static inline void a_from_product(uint32_t a[4], const float acc[][4], int kk) {
    #pragma unroll
    for (int r = 0; r < 4; r++)
        a[r] = bf16_pair(acc[a_from_c_tile(kk, 2 * r)][a_from_c_number(2 * r)],
                         acc[a_from_c_tile(kk, 2 * r + 1)][a_from_c_number(2 * r + 1)]);
}

/* d += a @ b for one warp: bf16 inputs, fp32 sums (sm_80 and later). */
__device__ static inline void mma_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* The max and the sum over the four lanes that share a row of a product. */
__device__ static inline float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ static inline float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* acc (16 rows x HS, as mma.sync leaves them) += p @ a tile: p the 16 x
 * FLASH_ROWS product a warp holds, rounded to bf16, the tile FLASH_ROWS x HS
 * held transposed (row d, column key or query). */
template <int HS>
__device__ static inline void add_product_times_tile(float acc[][4], const float p[][4], const bf16 *tile, int lane) {
    #pragma unroll
    for (int kk = 0; kk < FLASH_ROWS / 16; kk++) {
        uint32_t a[4];
        a_from_product(a, p, kk);
        #pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            uint32_t bf[2];
            b_fragment(bf, tile, FLASH_COLUMN, 8 * n, 16 * kk, lane);
            mma_bf16(acc[n], a, bf);
        }
    }
}

/* The 16 x HS product a warp holds, its rows row0.. (each times factor[r],
 * r the row's half of the fragment, rounded to bf16 where `rounds`: the op's
 * rounding) into rows of x from its number `first`, `stride` numbers apart,
 * held as x says: rows past T and channels past hs left alone. */
template <int HS>
__device__ static inline void store_rows(Buf x, size_t first, size_t stride, const float acc[][4],
                                         const float factor[2], int row0, int T, int hs, int lane, int rounds) {
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = row0 + lane / 4 + 8 * r;
        if (t >= T) continue;
        size_t row = first + (size_t)t * stride;
        #pragma unroll
        for (int n = 0; n < HS / 8; n++)
            #pragma unroll
            for (int e = 0; e < 2; e++) {
                int d = 8 * n + 2 * (lane % 4) + e;
                if (d < hs) {
                    float v = acc[n][2 * r + e] * factor[r];
                    number_put(x.data, x.dtype, row + d, rounded_if(v, rounds));
                }
            }
    }
}

/* Rows row0.. of x from its number `first` (rows of `stride` numbers, a
 * head's hs channels at each, held as x says) into a tile as bf16 (exact:
 * they are bf16 values), zero past T rows and hs channels; row-major (HS +
 * FLASH_PAD a row) or transposed (FLASH_COLUMN). */
template <int HS>
__device__ static void load_tile(bf16 *tile, ConstBuf x, size_t first, size_t stride, int row0, int T, int hs,
                                 int transposed) {
    for (int i = threadIdx.x; i < FLASH_ROWS * HS; i += FLASH_THREADS) {
        int r = i / HS, d = i % HS, t = row0 + r;
        bf16 v = bf16_from_float(t < T && d < hs ? number_at(x.data, x.dtype, first + (size_t)t * stride + d) : 0.0f);
        if (transposed) tile[d * FLASH_COLUMN + r] = v;
        else tile[r * (HS + FLASH_PAD) + d] = v;
    }
}

/* Where a (batch row, head) bh's rows begin: q, k and v, numbers of qkv
 * (rows of 3C), and the output and its gradient (rows of C). */
typedef struct {
    size_t q, k, v, out_at;
    int hs;
} FlashHead;

__device__ static FlashHead flash_head(int bh, int T, int C, int NH) {
    int b = bh / NH, h = bh % NH, hs = C / NH;
    size_t q = (size_t)b * T * 3 * C + (size_t)h * hs;
    FlashHead fh = { q, q + C, q + 2 * (size_t)C, (size_t)b * T * C + (size_t)h * hs, hs };
    return fh;
}

/* The forward of query block flash_query_block(blockIdx.y) of bh = blockIdx.x.
 * Each warp takes 16 rows, each lane two of them (t_of), and walks the key
 * blocks: scores on the tensor cores, the online softmax in fp32 (as the
 * CPU's op: the max and sum move on, the output rescaled), then the dropped
 * probabilities rounded to bf16 times v. Then out = o / sum, lse = max + log(sum). */
template <int HS>
__global__ static void __launch_bounds__(FLASH_THREADS, 1)
    flash_forward_kernel(Buf out, float *lse, ConstBuf qkv, int T, int C, int NH, float scale, Dropout drop,
                         int rounds) {
    drop = dropout_resolved(drop);
    const int ROW = HS + FLASH_PAD;
    __shared__ __align__(16) bf16 q_tile[FLASH_ROWS * ROW], k_tile[FLASH_ROWS * ROW], vt_tile[HS * FLASH_COLUMN];
    int bh = blockIdx.x, qb = flash_query_block(blockIdx.y, gridDim.y);
    int lane = threadIdx.x % WARP, warp_row = threadIdx.x / WARP * FLASH_WARP_ROWS, row0 = qb * FLASH_ROWS;
    FlashHead fh = flash_head(bh, T, C, NH);
    size_t stride = 3 * (size_t)C;
    load_tile<HS>(q_tile, qkv, fh.q, stride, row0, T, fh.hs, 0);
    __syncthreads();
    uint32_t qf[HS / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) a_fragment(qf[kk], q_tile, ROW, warp_row, 16 * kk, lane);
    /* a row past T is T - 1's again, never written */
    int t_of[2] = { min(row0 + warp_row + lane / 4, T - 1), min(row0 + warp_row + lane / 4 + 8, T - 1) };
    float o[HS / 8][4] = {}, max[2] = { -INFINITY, -INFINITY }, sum[2] = { 0.0f, 0.0f };
    for (int kb = 0; kb < flash_key_blocks(qb); kb++) {
        int key0 = kb * FLASH_ROWS;
        __syncthreads();  /* every warp is done with the last key block's tiles */
        load_tile<HS>(k_tile, qkv, fh.k, stride, key0, T, fh.hs, 0);
        load_tile<HS>(vt_tile, qkv, fh.v, stride, key0, T, fh.hs, 1);
        __syncthreads();
        float s[FLASH_ROWS / 8][4] = {};
        #pragma unroll
        for (int j = 0; j < FLASH_ROWS / 8; j++)
            #pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                uint32_t bf[2];
                b_fragment(bf, k_tile, ROW, 8 * j, 16 * kk, lane);
                mma_bf16(s[j], qf[kk], bf);
            }
        #pragma unroll
        for (int r = 0; r < 2; r++) {
            int t = t_of[r];
            float tile_max = -INFINITY;
            #pragma unroll
            for (int j = 0; j < FLASH_ROWS / 8; j++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    int c = key0 + 8 * j + 2 * (lane % 4) + e;
                    float x = flash_visible(t, c, T) ? s[j][2 * r + e] * scale : -INFINITY;
                    s[j][2 * r + e] = x;
                    tile_max = fmaxf(tile_max, x);
                }
            float new_max = fmaxf(max[r], quad_max(tile_max)), row_sum = 0.0f;
            #pragma unroll
            for (int j = 0; j < FLASH_ROWS / 8; j++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    float p = expf(s[j][2 * r + e] - new_max);
                    s[j][2 * r + e] = p;
                    row_sum += p;
                }
            float rescale = expf(max[r] - new_max);  /* 0 at the first key block */
            sum[r] = sum[r] * rescale + quad_sum(row_sum);
            max[r] = new_max;
            #pragma unroll
            for (int n = 0; n < HS / 8; n++) {
                o[n][2 * r] *= rescale;
                o[n][2 * r + 1] *= rescale;
            }
            if (drop.p > 0.0f)
                #pragma unroll
                for (int j = 0; j < FLASH_ROWS / 8; j++)
                    #pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int c = key0 + 8 * j + 2 * (lane % 4) + e;
                        if (c <= t) s[j][2 * r + e] *= dropout_scale_at(drop, attention_mask_index(bh, T, t, c));
                    }
        }
        add_product_times_tile<HS>(o, s, vt_tile, lane);
    }
    float inv[2] = { 1.0f / sum[0], 1.0f / sum[1] };
    store_rows<HS>(out, fh.out_at, C, o, inv, row0 + warp_row, T, fh.hs, lane, rounds);
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = row0 + warp_row + lane / 4 + 8 * r;
        if (t < T && lane % 4 == 0) lse[(size_t)bh * T + t] = max[r] + logf(sum[r]);
    }
}

/* delta[bh * T + t] = dy[t] . y[t] over the head's channels, the sum of each
 * row's probabilities times their gradients: a warp a row. */
__global__ static void flash_delta_kernel(float *delta, ConstBuf dout, ConstBuf out, int B, int T, int C,
                                          int NH) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)B * NH * T) return;
    int bh = (int)(row / T), t = (int)(row % T), b = bh / NH, h = bh % NH, hs = C / NH;
    size_t at = ((size_t)b * T + t) * C + (size_t)h * hs;
    float d = 0.0f;
    for (int c = lane; c < hs; c += WARP)
        d += number_at(dout.data, dout.dtype, at + c) * number_at(out.data, out.dtype, at + c);
    d = warp_sum(d);
    if (lane == 0) delta[row] = d;
}

/* The key blocks' pass (dk, dv) of key block blockIdx.y of bh = blockIdx.x:
 * each warp takes 16 keys, holds their k and v rows as A operands, and walks
 * the query blocks that see them: scores and the probabilities' gradient
 * transposed (keys x queries) on the tensor cores, then dv += the dropped
 * probabilities^T @ dy and dk += dscores^T @ q, each rounded to bf16 first. */
template <int HS>
__global__ static void __launch_bounds__(FLASH_THREADS, 1)
    flash_dkdv_kernel(Buf dqkv, ConstBuf dy, ConstBuf qkv, const float *lse, const float *delta, int T,
                      int C, int NH, float scale, Dropout drop, int rounds) {
    drop = dropout_resolved(drop);
    const int ROW = HS + FLASH_PAD;
    __shared__ __align__(16) bf16 q_tile[FLASH_ROWS * ROW], qt_tile[HS * FLASH_COLUMN];
    __shared__ __align__(16) bf16 dy_tile[FLASH_ROWS * ROW], dyt_tile[HS * FLASH_COLUMN];
    int bh = blockIdx.x, kb = blockIdx.y;
    int lane = threadIdx.x % WARP, warp_key = threadIdx.x / WARP * FLASH_WARP_ROWS, key0 = kb * FLASH_ROWS;
    FlashHead fh = flash_head(bh, T, C, NH);
    size_t stride = 3 * (size_t)C;
    const float *row_lse = lse + (size_t)bh * T, *row_delta = delta + (size_t)bh * T;
    /* the warp's k and v rows, staged through the query tiles */
    load_tile<HS>(q_tile, qkv, fh.k, stride, key0, T, fh.hs, 0);
    load_tile<HS>(dy_tile, qkv, fh.v, stride, key0, T, fh.hs, 0);
    __syncthreads();
    uint32_t kf[HS / 16][4], vf[HS / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        a_fragment(kf[kk], q_tile, ROW, warp_key, 16 * kk, lane);
        a_fragment(vf[kk], dy_tile, ROW, warp_key, 16 * kk, lane);
    }
    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int qb = flash_first_query_block(kb); qb < flash_blocks(T); qb++) {
        int row0 = qb * FLASH_ROWS;
        __syncthreads();  /* every warp is done with the last tiles (the first time: with k's and v's) */
        load_tile<HS>(q_tile, qkv, fh.q, stride, row0, T, fh.hs, 0);
        load_tile<HS>(qt_tile, qkv, fh.q, stride, row0, T, fh.hs, 1);
        load_tile<HS>(dy_tile, dy, fh.out_at, C, row0, T, fh.hs, 0);
        load_tile<HS>(dyt_tile, dy, fh.out_at, C, row0, T, fh.hs, 1);
        __syncthreads();
        /* the query block in halves of 32: both products of a half fit in registers beside dk and dv */
        for (int query0 = 0; query0 < FLASH_ROWS; query0 += 32) {
            float st[4][4] = {}, dpt[4][4] = {};
            #pragma unroll
            for (int j = 0; j < 4; j++)
                #pragma unroll
                for (int kk = 0; kk < HS / 16; kk++) {
                    uint32_t bf[2];
                    b_fragment(bf, q_tile, ROW, query0 + 8 * j, 16 * kk, lane);
                    mma_bf16(st[j], kf[kk], bf);
                    b_fragment(bf, dy_tile, ROW, query0 + 8 * j, 16 * kk, lane);
                    mma_bf16(dpt[j], vf[kk], bf);
                }
            #pragma unroll
            for (int r = 0; r < 2; r++)
                #pragma unroll
                for (int j = 0; j < 4; j++)
                    #pragma unroll
                    for (int e = 0; e < 2; e++) {
                        int c = key0 + warp_key + lane / 4 + 8 * r, t = row0 + query0 + 8 * j + 2 * (lane % 4) + e;
                        float w = 0.0f, ds = 0.0f;
                        if (flash_visible(t, c, T)) {
                            float p = expf(st[j][2 * r + e] * scale - row_lse[t]), dp = dpt[j][2 * r + e];
                            if (drop.p > 0.0f) {
                                float mask = dropout_scale_at(drop, attention_mask_index(bh, T, t, c));
                                w = p * mask;
                                dp *= mask;
                            } else {
                                w = p;
                            }
                            ds = p * (dp - row_delta[t]);
                        }
                        st[j][2 * r + e] = w;
                        dpt[j][2 * r + e] = ds;
                    }
            #pragma unroll
            for (int kk = 0; kk < 2; kk++) {
                uint32_t w[4], ds[4];
                a_from_product(w, st, kk);
                a_from_product(ds, dpt, kk);
                #pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    uint32_t bf[2];
                    b_fragment(bf, dyt_tile, FLASH_COLUMN, 8 * n, query0 + 16 * kk, lane);
                    mma_bf16(dv[n], w, bf);
                    b_fragment(bf, qt_tile, FLASH_COLUMN, 8 * n, query0 + 16 * kk, lane);
                    mma_bf16(dk[n], ds, bf);
                }
            }
        }
    }
    float dk_factor[2] = { scale, scale }, dv_factor[2] = { 1.0f, 1.0f };
    store_rows<HS>(dqkv, fh.k, stride, dk, dk_factor, key0 + warp_key, T, fh.hs, lane, rounds);
    store_rows<HS>(dqkv, fh.v, stride, dv, dv_factor, key0 + warp_key, T, fh.hs, lane, rounds);
}

/* The query blocks' pass (dq) of query block flash_query_block(blockIdx.y)
 * of bh = blockIdx.x: each warp takes 16 rows, holds their q and dy as A
 * operands, and walks the key blocks they see: dq += dscores @ k, dscores
 * rounded to bf16 first, as the key blocks' pass rounds them. */
template <int HS>
__global__ static void __launch_bounds__(FLASH_THREADS, 1)
    flash_dq_kernel(Buf dqkv, ConstBuf dy, ConstBuf qkv, const float *lse, const float *delta, int T,
                    int C, int NH, float scale, Dropout drop, int rounds) {
    drop = dropout_resolved(drop);
    const int ROW = HS + FLASH_PAD;
    __shared__ __align__(16) bf16 k_tile[FLASH_ROWS * ROW], v_tile[FLASH_ROWS * ROW], kt_tile[HS * FLASH_COLUMN];
    int bh = blockIdx.x, qb = flash_query_block(blockIdx.y, gridDim.y);
    int lane = threadIdx.x % WARP, warp_row = threadIdx.x / WARP * FLASH_WARP_ROWS, row0 = qb * FLASH_ROWS;
    FlashHead fh = flash_head(bh, T, C, NH);
    size_t stride = 3 * (size_t)C;
    /* the warp's q and dy rows, staged through the key tiles */
    load_tile<HS>(k_tile, qkv, fh.q, stride, row0, T, fh.hs, 0);
    load_tile<HS>(v_tile, dy, fh.out_at, C, row0, T, fh.hs, 0);
    __syncthreads();
    uint32_t qf[HS / 16][4], dyf[HS / 16][4];
    #pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        a_fragment(qf[kk], k_tile, ROW, warp_row, 16 * kk, lane);
        a_fragment(dyf[kk], v_tile, ROW, warp_row, 16 * kk, lane);
    }
    float row_lse[2], row_delta[2], dq[HS / 8][4] = {};
    #pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = min(row0 + warp_row + lane / 4 + 8 * r, T - 1);  /* a row past T: T - 1's, never written */
        row_lse[r] = lse[(size_t)bh * T + t];
        row_delta[r] = delta[(size_t)bh * T + t];
    }
    for (int kb = 0; kb < flash_key_blocks(qb); kb++) {
        int key0 = kb * FLASH_ROWS;
        __syncthreads();  /* every warp is done with the last tiles (the first time: with q's and dy's) */
        load_tile<HS>(k_tile, qkv, fh.k, stride, key0, T, fh.hs, 0);
        load_tile<HS>(kt_tile, qkv, fh.k, stride, key0, T, fh.hs, 1);
        load_tile<HS>(v_tile, qkv, fh.v, stride, key0, T, fh.hs, 0);
        __syncthreads();
        float ds_tile[FLASH_ROWS / 8][4] = {}, dp[FLASH_ROWS / 8][4] = {};
        #pragma unroll
        for (int j = 0; j < FLASH_ROWS / 8; j++)
            #pragma unroll
            for (int kk = 0; kk < HS / 16; kk++) {
                uint32_t bf[2];
                b_fragment(bf, k_tile, ROW, 8 * j, 16 * kk, lane);
                mma_bf16(ds_tile[j], qf[kk], bf);
                b_fragment(bf, v_tile, ROW, 8 * j, 16 * kk, lane);
                mma_bf16(dp[j], dyf[kk], bf);
            }
        #pragma unroll
        for (int r = 0; r < 2; r++)
            #pragma unroll
            for (int j = 0; j < FLASH_ROWS / 8; j++)
                #pragma unroll
                for (int e = 0; e < 2; e++) {
                    int t = row0 + warp_row + lane / 4 + 8 * r, c = key0 + 8 * j + 2 * (lane % 4) + e;
                    float ds = 0.0f;
                    if (flash_visible(t, c, T)) {
                        float p = expf(ds_tile[j][2 * r + e] * scale - row_lse[r]), dprob = dp[j][2 * r + e];
                        if (drop.p > 0.0f) dprob *= dropout_scale_at(drop, attention_mask_index(bh, T, t, c));
                        ds = p * (dprob - row_delta[r]);
                    }
                    ds_tile[j][2 * r + e] = ds;
                }
        add_product_times_tile<HS>(dq, ds_tile, kt_tile, lane);
    }
    float dq_factor[2] = { scale, scale };
    store_rows<HS>(dqkv, fh.q, stride, dq, dq_factor, row0 + warp_row, T, fh.hs, lane, rounds);
}

template <int HS>
static void flash_forward(cudaStream_t stream, Buf out, float *lse, ConstBuf qkv, int B, int T, int C, int NH,
                          float scale, Dropout drop, int rounds) {
    dim3 grid((unsigned)(B * NH), (unsigned)flash_blocks(T));
    flash_forward_kernel<HS><<<grid, FLASH_THREADS, 0, stream>>>(out, lse, qkv, T, C, NH, scale, drop, rounds);
    CHECK_LAUNCH("flash_forward_kernel");
}

template <int HS>
static void flash_backward(cudaStream_t stream, Buf dqkv, ConstBuf dout, ConstBuf qkv, const float *lse,
                           const float *delta, int B, int T, int C, int NH, float scale, Dropout drop, int rounds) {
    dim3 grid((unsigned)(B * NH), (unsigned)flash_blocks(T));
    flash_dkdv_kernel<HS><<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, delta, T, C, NH, scale, drop,
                                                              rounds);
    CHECK_LAUNCH("flash_dkdv_kernel");
    flash_dq_kernel<HS><<<grid, FLASH_THREADS, 0, stream>>>(dqkv, dout, qkv, lse, delta, T, C, NH, scale, drop,
                                                            rounds);
    CHECK_LAUNCH("flash_dq_kernel");
}

/* ---- the ops ----------------------------------------------------------------- */

/* Whether the op runs on the tensor cores: in bf16, heads of at most FLASH_MAX_HEAD. */
static int flash_runs(int C, int NH, DType products) {
    return products == DTYPE_BF16 && flash_head_width(C / NH) != 0;
}

/* Where the cuBLAS path's widened q, k, v begin in its scratch: past the two
 * T x T matrices and the deltas, on a 256-byte boundary (aligned_numbers),
 * as a model's fp32 qkv begins, so cuBLAS runs the same kernels on either;
 * where a bf16 output is made in fp32 (the forward's), or a bf16 output
 * gradient widened (the backward's), past them, on its boundary as a
 * model's fp32 output; and where a bf16 dqkv is made in fp32, past that. */
static size_t blas_room_at(size_t probs, size_t rows) { return aligned_numbers(2 * probs + rows, sizeof(float)); }
static size_t blas_output_at(size_t probs, size_t rows, size_t btc) {
    return blas_room_at(probs, rows) + aligned_numbers(3 * btc, sizeof(float));
}
static size_t blas_dqkv_at(size_t probs, size_t rows, size_t btc) {
    return blas_output_at(probs, rows, btc) + aligned_numbers(btc, sizeof(float));
}

/* On the tensor cores, the log-sum-exp of each row is kept and the scratch is
 * each row's delta; through cuBLAS, the probabilities are kept and the scratch
 * is the dropped weights and the probabilities' gradient, each T x T a
 * (batch row, head), and in bf16 each row's delta after them, then room for
 * qkv widened from bf16 (blas_room_at), a bf16 output or output gradient
 * (blas_output_at) and a bf16 dqkv (blas_dqkv_at). */
AttentionBuffers cuda_attention_buffers(int B, int T, int C, int NH, DType products) {
    size_t rows = (size_t)B * NH * T, probs = rows * T, btc = (size_t)B * T * C;
    AttentionBuffers flash = { rows, rows };
    AttentionBuffers blas = { probs, products == DTYPE_BF16 ? blas_dqkv_at(probs, rows, btc) + 3 * btc : 2 * probs };
    return flash_runs(C, NH, products) ? flash : blas;
}

/* The cuBLAS path's q, k, v as fp32: as held, or held in bf16 widened into
 * the scratch's room (blas_room_at), which only bf16 products have; bf16
 * buffers (qkv, or any other: others_held) with fp32 products are refused,
 * naming the op. */
static const float *blas_qkv(Stream *s, const char *op, ConstBuf qkv, DType others_held, DType products,
                             float *scratch, int B, int T, int C, int NH) {
    if (products != DTYPE_BF16 && (qkv.dtype != DTYPE_FP32 || others_held != DTYPE_FP32)) {
        fprintf(stderr, "fatal: %s given bf16 buffers with fp32 products\n", op);
        abort();
    }
    if (qkv.dtype == DTYPE_FP32) return (const float *)qkv.data;
    size_t rows = (size_t)B * NH * T;
    float *room = scratch + blas_room_at(rows * T, rows);
    cuda_load_bf16(s, room, (const bf16 *)qkv.data, 3 * (size_t)B * T * C);
    return room;
}

void cuda_attention_forward(Stream *s, Buf out_held, float *saved, float *scratch, ConstBuf qkv_held, int B, int T,
                            int C, int NH, Dropout drop, DType products, DType rounding) {
    cudaStream_t stream = cuda_stream(s);
    int hs = C / NH, rounds = rounding == DTYPE_BF16;
    float scale = 1.0f / sqrtf((float)hs);
    if ((size_t)B * NH * T == 0) return;
    if (flash_runs(C, NH, products)) {
        switch (flash_head_width(hs)) {
        case 16: flash_forward<16>(stream, out_held, saved, qkv_held, B, T, C, NH, scale, drop, rounds); break;
        case 32: flash_forward<32>(stream, out_held, saved, qkv_held, B, T, C, NH, scale, drop, rounds); break;
        default: flash_forward<64>(stream, out_held, saved, qkv_held, B, T, C, NH, scale, drop, rounds); break;
        }
        return;
    }
    size_t probs = (size_t)B * NH * T * T, btc = (size_t)B * T * C;
    const float *qkv = blas_qkv(s, "attention_forward", qkv_held, out_held.dtype, products, scratch, B, T, C, NH);
    /* a bf16 output made in fp32 in the scratch's room past q, k, v's (bf16 products only) */
    float *out = out_held.dtype == DTYPE_BF16 ? scratch + blas_output_at(probs, (size_t)B * NH * T, btc)
                                              : (float *)out_held.data;
    cublasHandle_t blas = cuda_blas(s);
    float *att = saved;
    long long qkv_stride = (long long)T * 3 * C, att_stride = (long long)NH * T * T, out_stride = (long long)T * C;
    /* att[b,h] = scale * q @ k^T (every key; the softmax masks the future) */
    for (int h = 0; h < NH; h++) {
        const float *q = qkv + (size_t)h * hs, *k = q + C;
        gemm_batched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, k, 3 * C, qkv_stride, q, 3 * C, qkv_stride,
                     0.0f, att + (size_t)h * T * T, T, att_stride, B);
    }
    int rows = B * NH * T;
    const float *weights = att;
    if (products == DTYPE_BF16) {
        causal_softmax_bf16_kernel<<<blocks_for((size_t)rows * WARP), THREADS, 0, stream>>>(att, scratch, rows, T, drop);
        CHECK_LAUNCH("causal_softmax_bf16_kernel");
        weights = scratch;
    } else {
        causal_softmax_kernel<<<blocks_for((size_t)rows * WARP), THREADS, 0, stream>>>(att, rows, T);
        CHECK_LAUNCH("causal_softmax_kernel");
        if (drop.p > 0.0f) {
            size_t n = (size_t)rows * T;
            attention_dropout_kernel<<<blocks_for(n), THREADS, 0, stream>>>(scratch, NULL, att, n, drop, 0);
            CHECK_LAUNCH("attention_dropout_kernel");
            weights = scratch;
        }
    }
    /* y[b, :, h] = weights @ v */
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + 2 * C + (size_t)h * hs;
        gemm_batched(blas, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, v, 3 * C, qkv_stride,
                     weights + (size_t)h * T * T, T, att_stride, 0.0f, out + (size_t)h * hs, C, out_stride, B);
    }
    if (out_held.dtype == DTYPE_BF16) cuda_store_bf16(s, (bf16 *)out_held.data, out, btc);  /* rounds as it stores */
    else if (rounds) cuda_round_to_bf16(s, out, out, btc);
}

void cuda_attention_backward(Stream *s, Buf dqkv_held, float *scratch, ConstBuf dout_held, ConstBuf qkv_held,
                             ConstBuf out_held, const float *saved, int B, int T, int C, int NH, Dropout drop,
                             DType products, DType rounding) {
    cudaStream_t stream = cuda_stream(s);
    int hs = C / NH, round_products = products == DTYPE_BF16, rounds = rounding == DTYPE_BF16;
    float scale = 1.0f / sqrtf((float)hs);
    if ((size_t)B * NH * T == 0) return;
    if (flash_runs(C, NH, products)) {
        size_t rows = (size_t)B * NH * T;
        flash_delta_kernel<<<blocks_for(rows * WARP), THREADS, 0, stream>>>(scratch, dout_held, out_held, B, T, C,
                                                                            NH);
        CHECK_LAUNCH("flash_delta_kernel");
        switch (flash_head_width(hs)) {
        case 16: flash_backward<16>(stream, dqkv_held, dout_held, qkv_held, saved, scratch, B, T, C, NH, scale, drop,
                                    rounds);
            break;
        case 32: flash_backward<32>(stream, dqkv_held, dout_held, qkv_held, saved, scratch, B, T, C, NH, scale, drop,
                                    rounds);
            break;
        default: flash_backward<64>(stream, dqkv_held, dout_held, qkv_held, saved, scratch, B, T, C, NH, scale, drop,
                                    rounds);
            break;
        }
        return;
    }
    cublasHandle_t blas = cuda_blas(s);
    const float *att = saved;
    long long qkv_stride = (long long)T * 3 * C, att_stride = (long long)NH * T * T, out_stride = (long long)T * C;
    size_t n = (size_t)B * NH * T * T, rows_all = (size_t)B * NH * T, btc = (size_t)B * T * C;
    float *datt = scratch, *mask = scratch + n, *delta = round_products ? scratch + 2 * n : NULL;
    /* out is read as held (flash_delta_kernel); q, k, v, dout and dqkv in fp32, held or in the scratch's room */
    DType others = dout_held.dtype == DTYPE_BF16 || dqkv_held.dtype == DTYPE_BF16 ? DTYPE_BF16 : out_held.dtype;
    const float *qkv = blas_qkv(s, "attention_backward", qkv_held, others, products, scratch, B, T, C, NH);
    const float *dout = (const float *)dout_held.data;
    if (dout_held.dtype == DTYPE_BF16) {
        float *room = scratch + blas_output_at(n, rows_all, btc);
        cuda_load_bf16(s, room, (const bf16 *)dout_held.data, btc);
        dout = room;
    }
    float *dqkv = dqkv_held.dtype == DTYPE_BF16 ? scratch + blas_dqkv_at(n, rows_all, btc) : (float *)dqkv_held.data;
    /* dweights = dy @ v^T */
    for (int h = 0; h < NH; h++) {
        const float *v = qkv + 2 * C + (size_t)h * hs;
        gemm_batched(blas, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, v, 3 * C, qkv_stride, dout + (size_t)h * hs, C,
                     out_stride, 0.0f, datt + (size_t)h * T * T, T, att_stride, B);
    }
    /* through the dropout mask: datt = dweights * mask, weights = att * mask (rounded as the forward's) */
    const float *weights = att;
    if (drop.p > 0.0f || round_products) {
        attention_dropout_kernel<<<blocks_for(n), THREADS, 0, stream>>>(mask, datt, att, n, drop, round_products);
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
    if (delta) {  /* dy . y, as the CPU's op takes it in bf16 (y made of the rounded weights) */
        flash_delta_kernel<<<blocks_for((size_t)rows * WARP), THREADS, 0, stream>>>(delta, fp32_numbers(dout), out_held,
                                                                                     B, T, C, NH);
        CHECK_LAUNCH("flash_delta_kernel");
    }
    softmax_backward_kernel<<<blocks_for((size_t)rows * WARP), THREADS, 0, stream>>>(datt, att, delta, rows, T);
    CHECK_LAUNCH("softmax_backward_kernel");
    if (round_products) cuda_round_to_bf16(s, datt, datt, n);
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
    if (dqkv_held.dtype == DTYPE_BF16) cuda_store_bf16(s, (bf16 *)dqkv_held.data, dqkv, 3 * btc);  /* rounds */
    else if (rounds) cuda_round_to_bf16(s, dqkv, dqkv, 3 * btc);
}
