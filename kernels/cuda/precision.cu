/* precision.cu: fp32 to bf16 and back on the GPU (kernels/bf16.h rounds each
 * value, as the CPU's kernels do, so both write the same bits). */
#include "cuda_kernels.cuh"

__global__ static void cast_to_bf16_kernel(bf16 *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_from_float(in[i]);
}

void cuda_cast_to_bf16(Stream *s, bf16 *out, const float *in, size_t n) {
    cast_to_bf16_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, in, n);
    CHECK_LAUNCH("cast_to_bf16_kernel");
}

__global__ static void cast_to_fp32_kernel(float *out, const bf16 *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float_from_bf16(in[i]);
}

void cuda_cast_to_fp32(Stream *s, float *out, const bf16 *in, size_t n) {
    cast_to_fp32_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, in, n);
    CHECK_LAUNCH("cast_to_fp32_kernel");
}
