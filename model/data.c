/* data.c: loading, tokenizing and batching the character data set. */
#include "data.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../kernels/philox.h"
#include "../runtime/host.h"

int dataset_load(Dataset *d, const char *path, int block_size, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    /* before opening: a FIFO's open would wait for a writer, forever */
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "cannot open data file '%s': %s", path, strerror(errno));
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "data file '%s' is a directory, not a file", path);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "data file '%s' is not a regular file (a FIFO, a device or a socket): its size is "
                 "not known", path);
        return -1;
    }
    /* the text and its tokens, before a byte is read: a file too big for the
     * machine is one line, not the OOM killer's work */
    size_t size_bytes = (size_t)st.st_size, need = size_bytes * (1 + sizeof(int));
    if (size_bytes > SIZE_MAX / (1 + sizeof(int)) || host_memory_take(need) != 0) {
        snprintf(err, errlen, "data file '%s' has %.1f MB; reading it takes %.1f MB of host memory (its bytes and "
                 "their tokens), and the machine has %.1f MB for the run", path, size_bytes / 1e6, need / 1e6,
                 host_memory_budget() / 1e6);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        host_memory_give_back(need);
        snprintf(err, errlen, "cannot open data file '%s': %s", path, strerror(errno));
        return -1;
    }
    long size = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    unsigned char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    size_t n = 0;
    if (text && fseek(f, 0, SEEK_SET) == 0) n = fread(text, 1, (size_t)size, f);
    fclose(f);
    if (!text || n != (size_t)size || n != size_bytes) {
        host_memory_give_back(need);
        snprintf(err, errlen, text || size < 0 ? "cannot read data file '%s' (or it changed as it was read)"
                                               : "data file '%s' does not fit in host memory", path);
        free(text);
        return -1;
    }
    size_t ntrain = n * 9 / 10;  /* nanoGPT's int(n * 0.9) */
    if (n - ntrain < (size_t)block_size + 1 || ntrain < (size_t)block_size + 1) {
        host_memory_give_back(need);
        free(text);
        snprintf(err, errlen, "data file '%s' has %zu bytes; each split needs more than --block=%d "
                 "(at least %zu bytes)", path, n, block_size, (size_t)(block_size + 1) * 10);
        return -1;
    }
    int present[256] = {0};
    for (size_t i = 0; i < n; i++) present[text[i]] = 1;
    for (int b = 0; b < 256; b++) {
        d->stoi[b] = -1;
        if (present[b]) {
            d->itos[d->vocab] = (unsigned char)b;
            d->stoi[b] = d->vocab++;
        }
    }
    d->tokens = malloc(n * sizeof(int));
    if (!d->tokens) {
        host_memory_give_back(need);
        free(text);
        snprintf(err, errlen, "out of memory for '%s'", path);
        return -1;
    }
    for (size_t i = 0; i < n; i++) d->tokens[i] = d->stoi[text[i]];
    free(text);
    host_memory_give_back(n);  /* the text's; the tokens' stay taken until dataset_free */
    d->ntokens = n;
    d->ntrain = ntrain;
    return 0;
}

void dataset_free(Dataset *d) {
    if (d->tokens) host_memory_give_back(d->ntokens * sizeof(int));
    free(d->tokens);
    d->tokens = NULL;
}

void dataset_batch(const Dataset *d, int split, int purpose, uint32_t seed, uint32_t index,
                   int row0, int rows, int T, int *x, int *y) {
    const int *base = split == SPLIT_TRAIN ? d->tokens : d->tokens + d->ntrain;
    size_t len = split == SPLIT_TRAIN ? d->ntrain : d->ntokens - d->ntrain;
    size_t starts = len - (size_t)T;  /* windows of T + 1 tokens fit */
    for (int r = 0; r < rows; r++) {
        uint32_t row = (uint32_t)(row0 + r);
        Philox4 ctr = {{ row, index, (uint32_t)split, (uint32_t)purpose }};
        Philox4 bits = philox4x32_10(ctr, seed, PHILOX_STREAM_BATCH);
        size_t start = (((uint64_t)bits.v[0] << 32) | bits.v[1]) % starts;
        memcpy(x + (size_t)r * T, base + start, (size_t)T * sizeof(int));
        memcpy(y + (size_t)r * T, base + start + 1, (size_t)T * sizeof(int));
    }
}
