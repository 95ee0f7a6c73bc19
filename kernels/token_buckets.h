/* token_buckets.h: a batch's positions grouped by token, for the embedding's
 * backward (kernels.h: embedding_backward).
 *
 * Why: the gradient of wte's row v is the sum of dout's rows at the positions
 * that hold token v. Grouped by token, each row of dwte is one bucket's work,
 * summed by one worker in row order: no atomics, the same order (and bits) on
 * the CPU and the GPU; the rows' reads in proportion to the batch (a row no
 * token holds reads none of them).
 *
 * A stable counting sort over the vocabulary, made on the host from the batch
 * it holds anyway and uploaded with it (model/model.c: model_upload_batch).
 * token_bucket compiles for the host and, under nvcc, for the GPU too.
 */
#ifndef ZF_TOKEN_BUCKETS_H
#define ZF_TOKEN_BUCKETS_H

#ifdef __CUDACC__
#define TOKEN_BUCKETS_FN static inline __host__ __device__
#else
#define TOKEN_BUCKETS_FN static inline
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int ntokens;     /* the distinct tokens of the batch */
    int *token;      /* [ntokens]: bucket k's token, ascending */
    int *start;      /* [ntokens + 1]: bucket k holds positions[start[k] .. start[k + 1]) */
    int *positions;  /* [BT]: the positions, bucket by bucket, each bucket's in row order */
} TokenBuckets;

/* The buckets of tokens[0, BT), each in [0, V), into out's arrays (room for
 * BT, BT + 1 and BT ints); counts: V + 1 ints of the caller's for the sort. */
void token_buckets_build(const int *tokens, int BT, int V, int *counts, TokenBuckets *out);

/* The tokens padded to `length` (at most the arrays' room) with INT_MAX, which no token
 * is: the same search over the same count for every batch, so that a graph
 * that captured it (runtime/device.h) finds the next batch's buckets. */
void token_buckets_pad(TokenBuckets *b, int length);

/* The bucket of token v, or -1 where the batch holds none: a binary search
 * of the ascending tokens (the arrays where the caller's device reads them). */
TOKEN_BUCKETS_FN int token_bucket(TokenBuckets b, int v) {
    int lo = 0, hi = b.ntokens;  /* the answer in [lo, hi) if anywhere */
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (b.token[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    return lo < b.ntokens && b.token[lo] == v ? lo : -1;
}

#ifdef __cplusplus
}
#endif

#endif
