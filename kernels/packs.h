/* packs.h: how the GPU's elementwise kernels take their numbers, PACK_NUMBERS
 * a thread.
 *
 * Why: a thread that moves one bf16 a load keeps two bytes in flight; eight
 * a thread, moved by 16-byte loads and stores (one for a bf16 pack, two for
 * an fp32 one), keep the memory system busy with a fraction of the
 * instructions, as llm.c's Packed128 does.
 *
 * A block takes a tile of threads x PACK_NUMBERS numbers. Where every
 * pointer of the op is on a 16-byte boundary and the tile lies whole below
 * n, the tile is packed: thread t's numbers lie side by side from t x
 * PACK_NUMBERS on, moved by 16-byte accesses. Otherwise (a pointer off its
 * boundary, or the last tile) they lie `threads` apart from t on, moved one
 * at a time, so that a warp's accesses stay side by side. Each number's
 * arithmetic is the same either way, so the bits are; an op that needs a
 * number's index (dropout's mask, a bias's column) takes it from
 * pack_number.
 *
 * A 16-byte load of bf16s gives four 32-bit words: numbers 2k and 2k + 1 are
 * the low and the high half of word k (little-endian, as the host and the
 * GPU are). pack_low, pack_high and pack_word say so. test_kernels holds
 * them to the bytes in memory, and the tiles to covering every number once,
 * on the host; the functions compile for the GPU too under nvcc.
 */
#ifndef ZF_PACKS_H
#define ZF_PACKS_H

#include <stddef.h>
#include <stdint.h>

#include "../runtime/bf16.h"

#ifdef __CUDACC__
#define PACKS_FN static inline __host__ __device__
#else
#define PACKS_FN static inline
#endif

enum { PACK_NUMBERS = 8, PACK_ALIGN_BYTES = 16 };

/* The tiles of n numbers for blocks of `threads`; tile b's first number. */
PACKS_FN size_t pack_tiles(size_t n, int threads) {
    size_t tile = (size_t)threads * PACK_NUMBERS;
    return (n + tile - 1) / tile;
}
PACKS_FN size_t tile_first(size_t b, int threads) { return b * threads * PACK_NUMBERS; }

/* Whether every pointer of an op (NULL: none) is on a 16-byte boundary. */
PACKS_FN int packs_aligned(const void *a, const void *b, const void *c) {
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & (PACK_ALIGN_BYTES - 1)) == 0;
}

/* Whether the tile from `first` on is packed: the op's pointers aligned and
 * the tile whole below n. */
PACKS_FN int tile_packed(size_t first, int threads, size_t n, int aligned) {
    return aligned && first + (size_t)threads * PACK_NUMBERS <= n;
}

/* Number k of thread t in the tile from `first` on: side by side where the
 * tile is packed, else `threads` apart. */
PACKS_FN size_t pack_number(size_t first, int threads, int t, int k, int packed) {
    return packed ? first + (size_t)t * PACK_NUMBERS + k : first + t + (size_t)k * threads;
}

/* The two bf16 numbers of a 32-bit word, and the word of two. */
PACKS_FN bf16 pack_low(uint32_t word) { return (bf16)(word & 0xFFFFu); }
PACKS_FN bf16 pack_high(uint32_t word) { return (bf16)(word >> 16); }
PACKS_FN uint32_t pack_word(bf16 low, bf16 high) { return (uint32_t)low | (uint32_t)high << 16; }

#endif
