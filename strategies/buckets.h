/* buckets.h: DDP's gradient buckets, planned as PyTorch's DDP plans them.
 *
 * Tensors merge in backward order (the arena's last tensor first) until a
 * bucket holds at least bucket_bytes of them, the first one at least
 * min(1 MB, bucket_bytes): PyTorch keeps its first bucket small so that an
 * all-reduce starts early in the backward. A bucket closes at the tensor that
 * fills it. The root's tensors (unit 0: the token embedding, which is also the
 * head, the position embedding and ln_f) are done only when the whole backward
 * is, so all of them join the last bucket, which closes at tensor 0. Without
 * overlap there is one bucket, the whole arena, all-reduced after the backward.
 *
 * A bucket is one range of the arena, from its lowest tensor's offset up to the
 * bucket before it in the plan (the arena's end for the first), so the units'
 * padding rides with the tensors below it and the buckets tile the arena.
 */
#ifndef ZF_BUCKETS_H
#define ZF_BUCKETS_H

#include <stddef.h>

#include "../runtime/arena.h"

enum { FIRST_BUCKET_BYTES = 1 << 20 };

typedef struct {
    int first_tensor;      /* the first of its tensors in backward order: the highest index */
    int last_tensor;       /* the last: the lowest index, whose gradient completes the bucket */
    size_t offset, length; /* floats of the arena */
} BucketSpan;

/* The plan of layout's buckets into plan (ARENA_MAX_TENSORS of room), in the
 * order they are all-reduced; the number of buckets. */
int ddp_plan_buckets(const ArenaLayout *layout, size_t bucket_bytes, int overlap, BucketSpan *plan);

#endif
