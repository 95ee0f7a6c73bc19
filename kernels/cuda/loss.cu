/* loss.cu: the classifier's fused softmax, cross-entropy and gradient, and the mean of the losses, on the GPU.
 *
 * A block per row, CROSSENTROPY_THREADS threads: one sweep over the row's
 * logits for the online max and sum (kernels/online_softmax.h), a fixed tree
 * over the threads' partials, then a second sweep writing the gradient. The
 * CPU's op runs the same partials, tree and arithmetic: the same bits. The
 * mean goes through a block-wide tree in double (block_sum) whose shape
 * depends only on the size, so it repeats bit for bit.
 */
#include "../online_softmax.h"
#include "cuda_kernels.cuh"

/* The row's max and sum: thread t's partial over logits t, t + THREADS, ...,
 * then the tree (partial t takes t + stride, stride halving); every thread
 * gets the row's. The row's logits are held as `held` says. */
__device__ static SoftmaxPartial row_softmax(const void *logits, DType held, size_t first, int V, int rounds) {
    __shared__ SoftmaxPartial part[CROSSENTROPY_THREADS];
    int t = threadIdx.x;
    SoftmaxPartial mine = softmax_partial_empty();
    for (int j = t; j < V; j += CROSSENTROPY_THREADS)
        mine = softmax_merge(mine, softmax_partial_of(softmax_logit(logits, held, first + j, rounds)));
    part[t] = mine;
    __syncthreads();
    for (int stride = CROSSENTROPY_THREADS / 2; stride > 0; stride /= 2) {
        if (t < stride) part[t] = softmax_merge(part[t], part[t + stride]);
        __syncthreads();
    }
    return part[0];
}

/* Row blockIdx.x's loss and, with dlogits, its gradient. In place
 * (dlogits over logits) the target's logit is read before any is written. */
__global__ static void crossentropy_kernel(float *losses, Buf dlogits, ConstBuf logits, const int *targets, int V,
                                           float dloss, int rounds) {
    size_t row = blockIdx.x, first = row * V;
    int target = targets[row];
    SoftmaxPartial total = row_softmax(logits.data, logits.dtype, first, V, rounds);
    if (threadIdx.x == 0)
        losses[row] = softmax_loss(softmax_logit(logits.data, logits.dtype, first + target, rounds), total);
    if (!dlogits.data) return;
    __syncthreads();
    for (int j = threadIdx.x; j < V; j += CROSSENTROPY_THREADS) {
        float g = softmax_grad(softmax_logit(logits.data, logits.dtype, first + j, rounds), total, j == target, dloss);
        number_put(dlogits.data, dlogits.dtype, first + j, rounded_if(g, rounds));
    }
}

void cuda_crossentropy_forward_backward(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                        const int *targets, int N, int V, float dloss, DType rounding) {
    if (N == 0) return;
    crossentropy_kernel<<<N, CROSSENTROPY_THREADS, 0, cuda_stream(s)>>>(losses, dlogits, logits, targets, V, dloss,
                                                                        rounding == DTYPE_BF16);
    CHECK_LAUNCH("crossentropy_kernel");
}

__global__ static void mean_kernel(float *mean, const float *x, int n) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += THREADS) acc += x[i];
    double total = block_sum(acc);
    if (threadIdx.x == 0) *mean = (float)(total / n);
}

void cuda_mean_forward(Stream *s, float *mean, const float *x, int n) {
    mean_kernel<<<1, THREADS, 0, cuda_stream(s)>>>(mean, x, n);
    CHECK_LAUNCH("mean_kernel");
}
