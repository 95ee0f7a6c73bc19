/* precision.cu: fp32 rounded to bf16's values on the GPU, kept in fp32 or stored in
 * 16 bits, and bf16 widened back (runtime/bf16.h rounds each value, as the CPU's
 * kernels do, so both write the same bits), PACK_NUMBERS numbers a thread (packs.h). */
#include "cuda_kernels.cuh"

/* out = in as out is held (store_pack's rounding into bf16), each number
 * rounded to bf16's values first where `rounds`. */
__global__ static void convert_kernel(void *out, DType out_held, const void *in, DType in_held, size_t n, int rounds,
                                      int aligned) {
    Tile tile = this_tile(n, aligned);
    float v[PACK_NUMBERS];
    load_pack(v, in, in_held, tile, n);
#pragma unroll
    for (int k = 0; k < PACK_NUMBERS; k++) v[k] = rounded_if(v[k], rounds);
    store_pack(out, out_held, tile, n, v);
}

static void convert(Stream *s, void *out, DType out_held, const void *in, DType in_held, size_t n, int rounds) {
    convert_kernel<<<pack_blocks_for(n), THREADS, 0, cuda_stream(s)>>>(out, out_held, in, in_held, n, rounds,
                                                                       packs_aligned(out, in, NULL));
    CHECK_LAUNCH("convert_kernel");
}

void cuda_round_to_bf16(Stream *s, float *out, const float *in, size_t n) {
    convert(s, out, DTYPE_FP32, in, DTYPE_FP32, n, 1);
}

void cuda_store_bf16(Stream *s, bf16 *out, const float *in, size_t n) {
    convert(s, out, DTYPE_BF16, in, DTYPE_FP32, n, 0);
}

void cuda_load_bf16(Stream *s, float *out, const bf16 *in, size_t n) {
    convert(s, out, DTYPE_FP32, in, DTYPE_BF16, n, 0);
}
