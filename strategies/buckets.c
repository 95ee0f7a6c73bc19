/* buckets.c: DDP's bucket plan (buckets.h). */
#include "buckets.h"

int ddp_plan_buckets(const ArenaLayout *layout, size_t bucket_bytes, int overlap, BucketSpan *plan) {
    size_t target = bucket_bytes < FIRST_BUCKET_BYTES ? bucket_bytes : FIRST_BUCKET_BYTES, bytes = 0;
    size_t end = layout->total;
    int nbuckets = 0, first = layout->ntensors - 1;
    for (int t = layout->ntensors - 1; t >= 0; t--) {
        const TensorSpec *tensor = &layout->tensors[t];
        bytes += tensor->numel * sizeof(float);
        if (t > 0 && (!overlap || bytes < target || tensor->unit == 0)) continue;
        /* tensor 0 is at 0: the last bucket ends at the arena's start */
        plan[nbuckets++] = (BucketSpan){ first, t, tensor->offset, end - tensor->offset };
        end = tensor->offset;
        first = t - 1;
        bytes = 0;
        target = bucket_bytes;
    }
    return nbuckets;
}
