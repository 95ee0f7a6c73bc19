/* data.h: the data set: a text file's characters, or a folder of token ids
 * as nanoGPT prepares them; the train/val split, and batches.
 *
 * A text file: the vocabulary is the sorted distinct bytes of the text; the
 * first 90% of the tokens train, the last 10% validate.
 * A folder (nanoGPT's data/openwebtext/, or what bin/prepare writes): its
 * train.bin and val.bin hold token ids, uint16 unless its meta.json says
 * uint32, of a vocabulary of meta.json's vocab_size (GPT-2's 50257 without
 * one, as nanoGPT assumes). They are memory-mapped, never read whole: a
 * 17 GB train.bin costs nothing at start, and only the windows a batch
 * draws are read (and checked against the vocabulary).
 * Batch row r of step s starts at an offset drawn from Philox(seed, r, s), so
 * a global batch is the same whatever the number of ranks that build its rows.
 */
#ifndef ZF_DATA_H
#define ZF_DATA_H

#include <stddef.h>
#include <stdint.h>

enum { SPLIT_TRAIN = 0, SPLIT_VAL = 1, SPLITS = 2 };
/* What a batch is drawn for: training steps, or the fixed evaluation batches. */
enum { BATCH_TRAIN = 0, BATCH_EVAL = 1 };
/* A token folder's files, as nanoGPT's prepare.py and bin/prepare write them:
 * the train split's ids, the val split's, and meta.json. */
enum { TOKEN_FOLDER_FILES = 3 };
extern const char *const TOKEN_FOLDER_FILE[TOKEN_FOLDER_FILES];
/* nanoGPT's vocabulary for a folder without meta.json: GPT-2's. */
enum { GPT2_VOCAB = 50257 };

typedef struct {
    int vocab;
    int characters;            /* 1: a text file, each token one byte (itos, stoi); 0: a folder's token ids */
    unsigned char itos[256];   /* token -> byte */
    int stoi[256];             /* byte -> token, -1 if absent */
    const void *tokens[SPLITS];  /* each split's ids, token_bytes each */
    size_t len[SPLITS];
    int token_bytes;           /* 2 (uint16) or 4 (uint32) */
    char source[512];          /* the path, for messages */
    void *owned[SPLITS];       /* what dataset_free gives back: the text's tokens, or the mappings */
    size_t owned_bytes[SPLITS];
} Dataset;

/* Load a text file or a token folder whose splits each hold at least
 * block_size + 1 tokens. Returns 0, or -1 with a one-line message in err. */
int dataset_load(Dataset *d, const char *path, int block_size, char *err, size_t errlen);
void dataset_free(Dataset *d);

/* Rows [row0, row0 + rows) of a batch of windows of T tokens: x[i] the inputs,
 * y[i] the next tokens. index is the step (BATCH_TRAIN) or the eval batch
 * number. 0, or -1 with a one-line message in err when a window holds an id
 * at or above the vocabulary. */
int dataset_batch(const Dataset *d, int split, int purpose, uint32_t seed, uint32_t index, int row0, int rows,
                  int T, int *x, int *y, char *err, size_t errlen);

/* A whole regular file into memory (malloc'd, a NUL after its *n bytes).
 * Before a byte is read, (1 + per_byte) times its size is taken from the
 * machine's memory (host_memory_take): the bytes, and what the caller makes
 * of them (`uses` names both in the refusal); the caller gives it back. The
 * file is `what` in messages. 0, or -1 with a one-line message in err. */
int data_read_file(const char *path, const char *what, size_t per_byte, const char *uses, unsigned char **bytes,
                   size_t *n, char *err, size_t errlen);

#endif
