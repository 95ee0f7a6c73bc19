/* token_buckets.c: the counting sort of token_buckets.h. */
#include "token_buckets.h"

#include <limits.h>
#include <string.h>

void token_buckets_build(const int *tokens, int BT, int V, int *counts, TokenBuckets *out) {
    memset(counts, 0, (size_t)(V + 1) * sizeof(int));
    for (int i = 0; i < BT; i++) counts[tokens[i] + 1]++;
    for (int v = 0; v < V; v++) counts[v + 1] += counts[v];  /* counts[v]: token v's first slot */
    int n = 0;
    for (int v = 0; v < V; v++)
        if (counts[v + 1] > counts[v]) {
            out->token[n] = v;
            out->start[n++] = counts[v];
        }
    out->start[n] = BT;
    out->ntokens = n;
    for (int i = 0; i < BT; i++) out->positions[counts[tokens[i]]++] = i;  /* i ascending: stable */
}

void token_buckets_pad(TokenBuckets *b, int length) {
    for (int k = b->ntokens; k < length; k++) b->token[k] = INT_MAX;
    if (length > b->ntokens) b->ntokens = length;
}
