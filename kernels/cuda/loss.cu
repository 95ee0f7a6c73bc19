/* loss.cu: softmax + cross-entropy, its backward, and the mean of the losses, on the GPU.
 *
 * The mean goes through a block-wide tree in double (block_sum) whose shape
 * depends only on the size, so it repeats bit for bit.
 */
#include "cuda_kernels.cuh"

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
