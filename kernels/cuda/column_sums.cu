/* column_sums.cu: the backward's column sums in the parts of row_parts.h, the
 * GPU's half: each op's part kernel (a thread a column of a part, its rows
 * from 0 in order) writes parts x width sums into the caller's scratch, and
 * cuda_add_column_parts adds them from 0 in part order and their sum into the
 * gradient as it is held, rounded first to bf16 under autocast. The
 * CPU's twin is kernels/cpu/column_sums.c: the same adds, the same bits.
 */
#include "cuda_kernels.cuh"

/* out[c] += sum over parts, from 0 in order, of partial[part, c], rounded where `rounds`; out as it is held */
__global__ static void add_column_parts_kernel(Buf out, const float *partial, int parts, int width, int rounds) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    float total = 0.0f;
    for (int p = 0; p < parts; p++) total += partial[(size_t)p * width + c];
    number_put(out.data, out.dtype, c, number_at(out.data, out.dtype, c) + rounded_if(total, rounds));
}

void cuda_add_column_parts(Stream *s, Buf out, const float *partial, int N, int width, int rounds) {
    add_column_parts_kernel<<<blocks_for((size_t)width), THREADS, 0, cuda_stream(s)>>>(out, partial, row_parts(N),
                                                                                     width, rounds);
    CHECK_LAUNCH("add_column_parts_kernel");
}
