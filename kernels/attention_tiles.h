/* attention_tiles.h: the tiles of causal attention in bf16 (kernels.h's
 * attention ops at DTYPE_BF16), one arithmetic for the GPU's tensor-core
 * kernels and the tests that check it on the CPU.
 *
 * Queries and keys go in blocks of FLASH_ROWS; a block of FLASH_WARPS warps
 * takes one (batch row, head) and one block of rows, each warp 16 of them, as
 * mma.sync's m16n8k16 takes them. A head's channels are padded with zeros to
 * the next of 16, 32 or 64 (a multiple of the product's k of 16), so one
 * kernel serves every head size up to FLASH_MAX_HEAD. Query row t sees keys
 * 0..t: a query block sees the key blocks up to its own, and a key block is
 * seen by the query blocks from its own on. The dropout mask of (t, c) is
 * element attention_mask_index of a [B, NH, T, T] mask, on both backends.
 * The functions compile for the host and, under nvcc, for the GPU too.
 */
#ifndef ZF_ATTENTION_TILES_H
#define ZF_ATTENTION_TILES_H

#include <stddef.h>

#ifdef __CUDACC__
#define TILES_FN static inline __host__ __device__
#else
#define TILES_FN static inline
#endif

enum { FLASH_ROWS = 64, FLASH_WARPS = 4, FLASH_WARP_ROWS = 16, FLASH_MAX_HEAD = 64 };

/* How many blocks of FLASH_ROWS rows T rows make. */
TILES_FN int flash_blocks(int T) { return (T + FLASH_ROWS - 1) / FLASH_ROWS; }

/* The channels a head of hs is padded to: 16, 32 or 64; 0 past FLASH_MAX_HEAD. */
TILES_FN int flash_head_width(int hs) {
    if (hs < 1 || hs > FLASH_MAX_HEAD) return 0;
    return hs <= 16 ? 16 : hs <= 32 ? 32 : 64;
}

/* The query block that launch block `block` of `blocks` takes: the last (the
 * longest, seeing every key block) first, so the short ones fill the tail. */
TILES_FN int flash_query_block(int block, int blocks) { return blocks - 1 - block; }

/* How many key blocks query block qb sees (0..qb), and the first query block
 * that sees key block kb (kb..the last). */
TILES_FN int flash_key_blocks(int qb) { return qb + 1; }
TILES_FN int flash_first_query_block(int kb) { return kb; }

/* mma.sync m16n8k16's fragments, as the PTX ISA lays them out: where number i
 * of lane l sits. A (16 x 16, rows by k): 8 numbers, two to a register; C and
 * D, the product (16 x 8): 4 numbers; B (k by n, 16 x 8): 4 numbers. */
TILES_FN int mma_a_row(int lane, int i) { return lane / 4 + 8 * (i / 2 % 2); }
TILES_FN int mma_a_col(int lane, int i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 4); }
TILES_FN int mma_c_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
TILES_FN int mma_c_col(int lane, int i) { return 2 * (lane % 4) + i % 2; }
TILES_FN int mma_b_k(int lane, int i) { return 2 * (lane % 4) + i % 2 + 8 * (i / 2); }
TILES_FN int mma_b_n(int lane) { return lane / 4; }

/* A product a warp holds as 8-column tiles (tile j: columns 8j..8j+7), read
 * as the A operand of its columns 16kk..16kk+15: A's number i is number
 * a_from_c_number(i) of product tile a_from_c_tile(kk, i), in the same lane. */
TILES_FN int a_from_c_tile(int kk, int i) { return 2 * kk + i / 4; }
TILES_FN int a_from_c_number(int i) { return i % 4; }

/* Whether query row t sees key c, both inside T. */
TILES_FN int flash_visible(int t, int c, int T) { return c <= t && t < T; }

/* The element of the dropout mask of (batch row, head) bh, query t and key c. */
TILES_FN size_t attention_mask_index(int bh, int T, int t, int c) {
    return ((size_t)bh * T + (size_t)t) * T + (size_t)c;
}

#endif
