/* arena.h: the parameter arena's size table, laid out unit by unit.
 *
 * All parameters of a model live in one flat fp32 buffer; each tensor is a
 * range of it. Tensors are grouped into units (a transformer block, or the root
 * unit of embeddings and final norm), and each unit is padded to a multiple of
 * `shard_multiple` so that it splits into equal shards, one per rank, and of
 * ARENA_ALIGN numbers, so that every unit starts as aligned as a fresh buffer
 * does (cudaMalloc's 256 bytes). Within a unit each tensor starts on a
 * multiple of ARENA_ALIGN numbers too, the gap before it zero: 512 bytes in
 * fp32, and in a bf16 copy of the arena 256 bytes, a product's operand
 * boundary (kernels.h's operand_numbers). A tensor then has the same
 * alignment in the arena as in a gradient slot, a gather buffer or a bf16
 * copy, a BLAS that picks its kernels by alignment (cuBLAS does) picks the
 * same ones for every strategy, and a model reads its strategy's bf16
 * weights in place at any shape. Gradients and optimizer state use the same
 * layout, so a unit or a shard is one range of one buffer.
 */
#ifndef ZF_ARENA_H
#define ZF_ARENA_H

#include <stddef.h>

enum { ARENA_NAME_MAX = 64, ARENA_MAX_TENSORS = 1024, ARENA_MAX_UNITS = 1024, ARENA_ALIGN = 128 };

typedef struct {
    char name[ARENA_NAME_MAX];
    int unit;
    int ndim;            /* 1 or 2; weight decay applies to 2-D tensors only */
    int shape[2];
    size_t offset;       /* in floats, from the start of the arena */
    size_t numel;
} TensorSpec;

typedef struct {
    size_t offset;       /* in floats */
    size_t used;         /* floats to the end of its last tensor (the gaps before its tensors included) */
    size_t size;         /* used, padded to a multiple of shard_multiple and ARENA_ALIGN */
} UnitSpec;

typedef struct {
    int shard_multiple;
    int ntensors, nunits;
    TensorSpec tensors[ARENA_MAX_TENSORS];
    UnitSpec units[ARENA_MAX_UNITS];
    size_t total;        /* floats, padding included */
    size_t numel;        /* floats of real tensors (no padding) */
} ArenaLayout;

void arena_init(ArenaLayout *a, int shard_multiple);
/* Open a new unit; tensors added after this belong to it. */
void arena_begin_unit(ArenaLayout *a);
/* Add a tensor of shape rows x cols (cols = 0 for a 1-D tensor of rows). */
int arena_add_tensor(ArenaLayout *a, const char *name, int rows, int cols);
/* Close the current unit, padding it to the least common multiple of
 * shard_multiple and ARENA_ALIGN. */
void arena_end_unit(ArenaLayout *a);
int arena_find(const ArenaLayout *a, const char *name);
/* The floats of the layout's largest tensor: a buffer that holds any one of them. */
size_t arena_largest_tensor(const ArenaLayout *a);

#endif
