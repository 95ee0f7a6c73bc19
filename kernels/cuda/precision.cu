/* precision.cu: fp32 rounded to bf16's values on the GPU (runtime/bf16.h rounds
 * each value, as the CPU's kernel does, so both write the same bits). */
#include "cuda_kernels.cuh"

__global__ static void round_to_bf16_kernel(float *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_rounded(in[i]);
}

void cuda_round_to_bf16(Stream *s, float *out, const float *in, size_t n) {
    round_to_bf16_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, in, n);
    CHECK_LAUNCH("round_to_bf16_kernel");
}
