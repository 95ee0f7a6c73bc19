/* optimizer.cu: AdamW (with clipping's scale folded in), the squared-norm
 * reduction, and the count of non-finite values that guards steps and saves,
 * on the GPU.
 * A gradient is read as it is held, fp32 or bf16 (runtime/bf16.h's number_at).
 *
 * The AdamW update over an arena range in one launch (adamw.h). The sums go
 * by fixed chunks (SUMSQ_CHUNK), each through a block-wide tree, then the
 * chunks' sums through one block's. The sum of squares is exact
 * (square_sum.h), the CPU's integer; the count's tree is in double, an order
 * fixed by the length, so it repeats bit for bit.
 */
#include <math.h>

#include "cuda_kernels.cuh"

/* torch.optim.AdamW's arithmetic, as the CPU's; the scalars come from the host. */
/* A thread PACK_NUMBERS elements of the range (packs.h: 16-byte loads and
 * stores where every buffer allows): each element's span found in the table,
 * padding left as it was; the bf16 copy written in the same pass where there
 * is one. Every thread works out the clip's coefficient itself (the parts
 * are at most a rank count, added exactly): no launch before it. */
__global__ static void adamw_kernel(float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                                    size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWConstants k,
                                    AdamWClip clip, int aligned) {
    Tile tile = this_tile(n, aligned);
    float coef = clip.sumsq ? clip_coefficient(clip.sumsq, clip.nparts, clip.max_norm) : 1.0f;
    float w[PACK_NUMBERS], g[PACK_NUMBERS], mk[PACK_NUMBERS], vk[PACK_NUMBERS];
    load_pack(w, param, DTYPE_FP32, tile, n);
    load_pack(g, grad, grad_held, tile, n);
    load_pack(mk, m, DTYPE_FP32, tile, n);
    load_pack(vk, v, DTYPE_FP32, tile, n);
#pragma unroll
    for (int e = 0; e < PACK_NUMBERS; e++) {
        size_t j = tile_number(tile, e);
        int t = j < n ? adamw_span_at(spans, nspans, lo + j) : -1;
        if (t < 0) continue;
        w[e] = adamw_element(k, spans[t].decays, clip_gradient(g[e], grad_held, coef), &mk[e], &vk[e], w[e]);
    }
    store_pack(param, DTYPE_FP32, tile, n, w);
    store_pack(m, DTYPE_FP32, tile, n, mk);
    store_pack(v, DTYPE_FP32, tile, n, vk);
    if (copy) store_pack(copy, DTYPE_BF16, tile, n, w);
}

void cuda_adamw_arena(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                      size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip) {
    if (n == 0) return;
    int aligned = packs_aligned(param, grad, m) && packs_aligned(v, copy, NULL);
    adamw_kernel<<<pack_blocks_for(n), THREADS, 0, cuda_stream(s)>>>(param, copy, grad, grad_held, m, v, lo, n, spans,
                                                                     nspans, adamw_constants(hp), clip, aligned);
    CHECK_LAUNCH("adamw_kernel");
}

/* The block's exact sum of its threads' sums, by a tree; every thread of the
 * block gets it. blockDim.x must be THREADS. */
__device__ static SquareSum block_square_sum(SquareSum x) {
    __shared__ SquareSum shared[THREADS];
    shared[threadIdx.x] = x;
    __syncthreads();
    for (int stride = THREADS / 2; stride > 0; stride /= 2) {
        if ((int)threadIdx.x < stride)
            shared[threadIdx.x] = square_sum_add(shared[threadIdx.x], shared[threadIdx.x + stride]);
        __syncthreads();
    }
    return shared[0];
}

/* partial[chunk] = the chunk's sum of squares, exactly: each thread's terms
 * into its band sums (held in registers: a term is added to every band, 0
 * where it is not that band's), those into its integer, then the block's. */
__global__ static void sumsq_chunk_kernel(SquareSum *partial, const void *x, DType held, size_t n) {
    size_t first = (size_t)blockIdx.x * SUMSQ_CHUNK;
    size_t end = first + SUMSQ_CHUNK < n ? first + SUMSQ_CHUNK : n;
    double band[SQUARE_SUM_BANDS];
#pragma unroll
    for (int b = 0; b < SQUARE_SUM_BANDS; b++) band[b] = 0.0;
    int finite = 1;
    for (size_t i = first + threadIdx.x; i < end; i += THREADS) {
        float term = square_term(number_at(x, held, i));
        int in = square_band(term);
        finite &= square_term_finite(term);
#pragma unroll
        for (int b = 0; b < SQUARE_SUM_BANDS; b++) band[b] += b == in ? (double)term : 0.0;
    }
    SquareSum total = block_square_sum(square_sum_of_bands(band, finite));
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

/* *out = the chunks' sums summed by one block: thread t adds chunks t, t +
 * THREADS, ..., then the block's tree (GPT-2's 7,600 chunks are 30 adds a
 * thread, not one thread's 7,600). */
__global__ static void sum_square_chunks_kernel(SquareSum *out, const SquareSum *partial, size_t nchunks) {
    SquareSum total = square_sum_zero();
    for (size_t c = threadIdx.x; c < nchunks; c += THREADS) total = square_sum_add(total, partial[c]);
    total = block_square_sum(total);
    if (threadIdx.x == 0) *out = total;
}

void cuda_sumsq_reduce(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch) {
    cudaStream_t stream = cuda_stream(s);
    size_t nchunks = sumsq_scratch_bytes(n) / sizeof(SquareSum);
    SquareSum *partial = (SquareSum *)scratch;
    sumsq_chunk_kernel<<<(unsigned)nchunks, THREADS, 0, stream>>>(partial, x, held, n);
    CHECK_LAUNCH("sumsq_chunk_kernel");
    sum_square_chunks_kernel<<<1, THREADS, 0, stream>>>(out, partial, nchunks);
    CHECK_LAUNCH("sum_square_chunks_kernel");
}

/* partial[chunk] = how many of the chunk's values are NaN or infinite */
__global__ static void nonfinite_chunk_kernel(double *partial, const void *x, DType held, size_t n) {
    size_t first = (size_t)blockIdx.x * SUMSQ_CHUNK;
    size_t end = first + SUMSQ_CHUNK < n ? first + SUMSQ_CHUNK : n;
    double count = 0.0;
    for (size_t i = first + threadIdx.x; i < end; i += THREADS) count += isfinite(number_at(x, held, i)) ? 0.0 : 1.0;
    double total = block_sum(count);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

/* *out = the chunks' counts summed by one block, as sum_square_chunks_kernel. */
__global__ static void sum_counts_kernel(float *out, const double *partial, size_t nchunks) {
    double total = 0.0;
    for (size_t c = threadIdx.x; c < nchunks; c += THREADS) total += partial[c];
    total = block_sum(total);
    if (threadIdx.x == 0) *out = (float)total;
}

/* scratch: sumsq_scratch_bytes(n) bytes, the chunks' counts as doubles in its first quarter */
void cuda_count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch) {
    cudaStream_t stream = cuda_stream(s);
    size_t nchunks = sumsq_scratch_bytes(n) / sizeof(SquareSum);
    double *partial = (double *)scratch;
    nonfinite_chunk_kernel<<<(unsigned)nchunks, THREADS, 0, stream>>>(partial, x, held, n);
    CHECK_LAUNCH("nonfinite_chunk_kernel");
    sum_counts_kernel<<<1, THREADS, 0, stream>>>(out, partial, nchunks);
    CHECK_LAUNCH("sum_counts_kernel");
}
