/* data.h: the character data set: tokenizer, train/val split, and batches.
 *
 * The vocabulary is the sorted distinct bytes of the text; the first 90% of the
 * tokens train, the last 10% validate. Batch row r of step s starts at an offset
 * drawn from Philox(seed, r, s), so a global batch is the same whatever the
 * number of ranks that build its rows.
 */
#ifndef ZF_DATA_H
#define ZF_DATA_H

#include <stddef.h>
#include <stdint.h>

enum { SPLIT_TRAIN = 0, SPLIT_VAL = 1 };
/* What a batch is drawn for: training steps, or the fixed evaluation batches. */
enum { BATCH_TRAIN = 0, BATCH_EVAL = 1 };

typedef struct {
    int vocab;
    unsigned char itos[256];  /* token -> byte */
    int stoi[256];            /* byte -> token, -1 if absent */
    int *tokens;              /* the whole text, encoded */
    size_t ntokens, ntrain;   /* train = tokens[0, ntrain), val = the rest */
} Dataset;

/* Load and tokenize a text file whose splits each hold at least block_size + 1
 * tokens. Returns 0, or -1 with a one-line message in err. */
int dataset_load(Dataset *d, const char *path, int block_size, char *err, size_t errlen);
void dataset_free(Dataset *d);

/* Rows [row0, row0 + rows) of a batch of windows of T tokens: x[i] the inputs,
 * y[i] the next tokens. index is the step (BATCH_TRAIN) or the eval batch number. */
void dataset_batch(const Dataset *d, int split, int purpose, uint32_t seed, uint32_t index,
                   int row0, int rows, int T, int *x, int *y);

#endif
