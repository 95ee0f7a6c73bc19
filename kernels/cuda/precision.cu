/* precision.cu: fp32 rounded to bf16's values on the GPU, kept in fp32 or stored in
 * 16 bits, and bf16 widened back (runtime/bf16.h rounds each value, as the CPU's
 * kernels do, so both write the same bits). */
#include "cuda_kernels.cuh"

__global__ static void round_to_bf16_kernel(float *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_rounded(in[i]);
}

void cuda_round_to_bf16(Stream *s, float *out, const float *in, size_t n) {
    round_to_bf16_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, in, n);
    CHECK_LAUNCH("round_to_bf16_kernel");
}

__global__ static void store_bf16_kernel(bf16 *out, const float *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_from_float(in[i]);
}

void cuda_store_bf16(Stream *s, bf16 *out, const float *in, size_t n) {
    store_bf16_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, in, n);
    CHECK_LAUNCH("store_bf16_kernel");
}

__global__ static void load_bf16_kernel(float *out, const bf16 *in, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = float_from_bf16(in[i]);
}

void cuda_load_bf16(Stream *s, float *out, const bf16 *in, size_t n) {
    load_bf16_kernel<<<blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, in, n);
    CHECK_LAUNCH("load_bf16_kernel");
}
