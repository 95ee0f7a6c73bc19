/* row_parts.h: the partition of the backward's column sums (a bias's gradient,
 * LayerNorm's weight's: kernels.h), one for the CPU and the GPU.
 *
 * Why: a column summed over N rows by one thread is a long serial chain on a
 * GPU (12288 rows for GPT-2's batch). Cut into parts of PART_ROWS rows, the
 * parts run side by side, then their sums are added in order. The cut depends
 * on N alone, never on the device, and both backends make the same adds in
 * the same order: each part's rows from 0 in row order, then the parts from 0
 * in part order, then that total into the gradient. So their bits agree.
 * The functions compile for the host and, under nvcc, for the GPU too.
 */
#ifndef ZF_ROW_PARTS_H
#define ZF_ROW_PARTS_H

#ifdef __CUDACC__
#define ROW_PARTS_FN static inline __host__ __device__
#else
#define ROW_PARTS_FN static inline
#endif

enum { PART_ROWS = 128 };

/* How many parts N rows make, and part p's rows [part_first_row(p), part_end_row(p, N)). */
ROW_PARTS_FN int row_parts(int N) { return (N + PART_ROWS - 1) / PART_ROWS; }
ROW_PARTS_FN int part_first_row(int p) { return p * PART_ROWS; }
ROW_PARTS_FN int part_end_row(int p, int N) { return (p + 1) * PART_ROWS < N ? (p + 1) * PART_ROWS : N; }

#endif
