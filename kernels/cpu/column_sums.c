/* column_sums.c: the backward's column sums in the parts of row_parts.h, the
 * CPU's twin of kernels/cuda/column_sums.cu: the same adds in the same order,
 * so a bias's and LayerNorm's weight gradients are the GPU's bytes. */
#include "cpu_kernels.h"

void column_sums(Buf out, int N, int C, RowTerms row_terms, const void *ctx, int rounds) {
    if (N == 0) return;  /* as the GPU, which launches nothing */
    int nblocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK, parts = row_parts(N);
    #pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
        int c0 = blk * COLUMN_BLOCK, width = C - c0 < COLUMN_BLOCK ? C - c0 : COLUMN_BLOCK;
        float total[COLUMN_BLOCK] = { 0 }, terms[COLUMN_BLOCK];
        for (int p = 0; p < parts; p++) {
            float part[COLUMN_BLOCK] = { 0 };
            for (int i = part_first_row(p); i < part_end_row(p, N); i++) {
                row_terms(ctx, i, c0, width, terms);
                #pragma omp simd
                for (int c = 0; c < width; c++) part[c] += terms[c];
            }
            for (int c = 0; c < width; c++) total[c] += part[c];
        }
        for (int c = 0; c < width; c++) {
            size_t at = (size_t)(c0 + c);
            number_put(out.data, out.dtype, at, number_at(out.data, out.dtype, at) + rounded_if(total[c], rounds));
        }
    }
}
