/* loss.cu: softmax + cross-entropy, the squared norm for clipping, and the count
 * of non-finite values, on the GPU.
 *
 * The means and sums go through a block-wide tree in double whose shape depends
 * only on the sizes, so they repeat bit for bit.
 */
#include "cuda_kernels.cuh"

/* The block's sum of its threads' values, in double, by a fixed tree; every
 * thread of the block gets it. blockDim.x must be THREADS. */
__device__ static double block_sum(double x) {
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

/* A warp per row: probs = softmax(logits), loss = -log softmax at the target. */
__global__ static void crossentropy_kernel(float *losses, float *probs, const float *logits, const int *targets,
                                           int N, int V) {
    size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP;
    int lane = threadIdx.x % WARP;
    if (row >= (size_t)N) return;
    const float *logit = logits + (size_t)row * V;
    float *prob = probs + (size_t)row * V;
    float maxval = -INFINITY;
    for (int j = lane; j < V; j += WARP) maxval = fmaxf(maxval, logit[j]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int j = lane; j < V; j += WARP) {
        float e = expf(logit[j] - maxval);
        prob[j] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    for (int j = lane; j < V; j += WARP) prob[j] /= sum;
    /* -log softmax from the logits themselves: exact even where prob underflows */
    if (targets && lane == 0) losses[row] = logf(sum) - (logit[targets[row]] - maxval);
}

__global__ static void mean_kernel(float *mean, const float *x, int n) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += THREADS) acc += x[i];
    double total = block_sum(acc);
    if (threadIdx.x == 0) *mean = (float)(total / n);
}

void cuda_crossentropy_forward(Stream *s, float *mean_loss, float *losses, float *probs, const float *logits,
                               const int *targets, int N, int V) {
    cudaStream_t stream = cuda_stream(s);
    crossentropy_kernel<<<blocks_for((size_t)N * WARP), THREADS, 0, stream>>>(losses, probs, logits, targets, N, V);
    CHECK_LAUNCH("crossentropy_kernel");
    if (!targets || !mean_loss) return;
    cuda_mean_forward(s, mean_loss, losses, N);
}

void cuda_mean_forward(Stream *s, float *mean, const float *x, int n) {
    mean_kernel<<<1, THREADS, 0, cuda_stream(s)>>>(mean, x, n);
    CHECK_LAUNCH("mean_kernel");
}

__global__ static void crossentropy_backward_kernel(float *dlogits, const float *probs, const int *targets, int N,
                                                    int V, float dloss) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * V) return;
    int row = (int)(i / V), j = (int)(i % V);
    dlogits[i] = dloss * (probs[i] - (j == targets[row] ? 1.0f : 0.0f));
}

void cuda_crossentropy_backward(Stream *s, float *dlogits, const float *probs, const int *targets, int N, int V,
                                float dloss) {
    crossentropy_backward_kernel<<<blocks_for((size_t)N * V), THREADS, 0, cuda_stream(s)>>>(dlogits, probs,
                                                                                           targets, N, V, dloss);
    CHECK_LAUNCH("crossentropy_backward_kernel");
}

/* partial[chunk] = the chunk's sum of squares, in double */
__global__ static void sumsq_chunk_kernel(double *partial, const float *x, size_t n) {
    size_t first = (size_t)blockIdx.x * SUMSQ_CHUNK;
    size_t end = first + SUMSQ_CHUNK < n ? first + SUMSQ_CHUNK : n;
    double acc = 0.0;
    for (size_t i = first + threadIdx.x; i < end; i += THREADS) acc += (double)x[i] * x[i];
    double total = block_sum(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

/* *out = the partials summed in chunk order */
__global__ static void sum_chunks_kernel(float *out, const double *partial, size_t nchunks) {
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += partial[c];
    *out = (float)total;
}

void cuda_sumsq_reduce(Stream *s, float *out, const float *x, size_t n, double *scratch) {
    cudaStream_t stream = cuda_stream(s);
    size_t nchunks = sumsq_scratch_doubles(n);
    double *partial = scratch;
    sumsq_chunk_kernel<<<(unsigned)nchunks, THREADS, 0, stream>>>(partial, x, n);
    CHECK_LAUNCH("sumsq_chunk_kernel");
    sum_chunks_kernel<<<1, 1, 0, stream>>>(out, partial, nchunks);
    CHECK_LAUNCH("sum_chunks_kernel");
}

/* partial[chunk] = how many of the chunk's values are NaN or infinite */
__global__ static void nonfinite_chunk_kernel(double *partial, const float *x, size_t n) {
    size_t first = (size_t)blockIdx.x * SUMSQ_CHUNK;
    size_t end = first + SUMSQ_CHUNK < n ? first + SUMSQ_CHUNK : n;
    double count = 0.0;
    for (size_t i = first + threadIdx.x; i < end; i += THREADS) count += isfinite(x[i]) ? 0.0 : 1.0;
    double total = block_sum(count);
    if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

void cuda_count_nonfinite(Stream *s, float *out, const float *x, size_t n, double *scratch) {
    cudaStream_t stream = cuda_stream(s);
    size_t nchunks = sumsq_scratch_doubles(n);
    nonfinite_chunk_kernel<<<(unsigned)nchunks, THREADS, 0, stream>>>(scratch, x, n);
    CHECK_LAUNCH("nonfinite_chunk_kernel");
    sum_chunks_kernel<<<1, 1, 0, stream>>>(out, scratch, nchunks);
    CHECK_LAUNCH("sum_chunks_kernel");
}
