/* data.c: loading the text file or the token folder, and batching. */
#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/philox.h"
#include "../runtime/host.h"

int data_read_file(const char *path, const char *what, size_t per_byte, const char *uses, unsigned char **bytes,
                   size_t *n, char *err, size_t errlen) {
    struct stat st;
    if (host_regular_file(path, what, &st, err, errlen) != 0) return -1;
    /* before a byte is read: a file too big for the machine is one line, not the OOM killer's work */
    size_t size = (size_t)st.st_size, need = size * (1 + per_byte);
    if (size > SIZE_MAX / (1 + per_byte) || host_memory_take(need) != 0) {
        snprintf(err, errlen, "%s '%s' has %.1f MB; reading it takes %.1f MB of host memory (%s), and the machine "
                 "has %.1f MB for the run", what, path, size / 1e6, need / 1e6, uses, host_memory_budget() / 1e6);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    unsigned char *text = f ? malloc(size + 1) : NULL;
    size_t got = text ? fread(text, 1, size, f) : 0;
    int more = f && fgetc(f) != EOF;
    if (f) fclose(f);
    if (!text || got != size || more) {
        host_memory_give_back(need);
        snprintf(err, errlen, f ? "cannot read %s '%s' (or it changed as it was read)" : "cannot open %s '%s': %s",
                 what, path, strerror(errno));
        free(text);
        return -1;
    }
    text[size] = 0;
    *bytes = text;
    *n = size;
    return 0;
}

static int split_too_short(const char *what, size_t tokens, int block_size, char *err, size_t errlen) {
    snprintf(err, errlen, "%s holds %zu tokens; each split needs more than --block=%d (at least %d)", what, tokens,
             block_size, block_size + 1);
    return -1;
}

/* A text file: its bytes, each a token of the sorted distinct bytes. */
static int load_text(Dataset *d, const char *path, int block_size, char *err, size_t errlen) {
    unsigned char *text;
    size_t n;
    if (data_read_file(path, "data file", sizeof(uint16_t), "its bytes and their tokens", &text, &n, err,
                       errlen) != 0)
        return -1;
    size_t ntrain = n * 9 / 10;  /* nanoGPT's int(n * 0.9) */
    if (n - ntrain < (size_t)block_size + 1 || ntrain < (size_t)block_size + 1) {
        host_memory_give_back(n * (1 + sizeof(uint16_t)));
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
    uint16_t *tokens = host_calloc(n, sizeof *tokens);
    for (size_t i = 0; i < n; i++) tokens[i] = (uint16_t)d->stoi[text[i]];
    free(text);
    host_memory_give_back(n);  /* the text's; the tokens' stay taken until dataset_free */
    d->characters = 1;
    d->token_bytes = sizeof *tokens;
    d->tokens[SPLIT_TRAIN] = tokens;
    d->tokens[SPLIT_VAL] = tokens + ntrain;
    d->len[SPLIT_TRAIN] = ntrain;
    d->len[SPLIT_VAL] = n - ntrain;
    d->owned[SPLIT_TRAIN] = tokens;
    d->owned_bytes[SPLIT_TRAIN] = n * sizeof *tokens;
    return 0;
}

/* meta.json: the ids' width and the vocabulary's size; without one, nanoGPT's uint16 and GPT-2's vocabulary. */
static int read_meta(Dataset *d, const char *dir, char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, TOKEN_FOLDER_FILE[2]);
    d->token_bytes = sizeof(uint16_t);
    d->vocab = GPT2_VOCAB;
    if (access(path, F_OK) != 0) return 0;
    if (host_is_directory(path)) {  /* jansson would call it a parse error */
        snprintf(err, errlen, "'%s' is a folder, not a file", path);
        return -1;
    }
    struct stat st;
    if (host_regular_file(path, "meta.json", &st, err, errlen) != 0) return -1;
    json_error_t je;
    json_t *meta = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!meta) {
        snprintf(err, errlen, "'%s': %s (line %d)", path, je.text, je.line);
        return -1;
    }
    const json_t *vocab = json_object_get(meta, "vocab_size");
    const char *dtype = json_string_value(json_object_get(meta, "dtype"));
    const char *why = NULL;
    if (!json_is_integer(vocab) || json_integer_value(vocab) < 1 || json_integer_value(vocab) > (1 << 24))
        why = "its vocab_size is not a whole number in 1..16777216";
    else if (dtype && strcmp(dtype, "uint16") != 0 && strcmp(dtype, "uint32") != 0)
        why = "its dtype is neither uint16 nor uint32";
    else {
        d->vocab = (int)json_integer_value(vocab);
        if (dtype && strcmp(dtype, "uint32") == 0) d->token_bytes = sizeof(uint32_t);
        if (d->token_bytes == 2 && d->vocab > 65536) why = "its vocab_size does not fit its dtype uint16";
    }
    json_decref(meta);
    if (!why) return 0;
    snprintf(err, errlen, "'%s': %s", path, why);
    return -1;
}

const char *const TOKEN_FOLDER_FILE[TOKEN_FOLDER_FILES] = { "train.bin", "val.bin", "meta.json" };

/* DIR/NAME.bin, mapped: a whole number of ids, more than a block of them. */
static int map_split(Dataset *d, const char *dir, int split, int block_size, char *err, size_t errlen) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, TOKEN_FOLDER_FILE[split == SPLIT_TRAIN ? 0 : 1]);
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "cannot open '%s': %s (a token folder holds train.bin and val.bin, as nanoGPT's "
                 "prepare.py or bin/prepare writes them)", path, strerror(errno));
        return -1;
    }
    if (host_regular_file(path, "token file", &st, err, errlen) != 0) return -1;
    size_t bytes = (size_t)st.st_size;
    if (bytes % (size_t)d->token_bytes != 0) {
        snprintf(err, errlen, "'%s' has %zu bytes, not a whole number of uint%d ids", path, bytes, 8 * d->token_bytes);
        return -1;
    }
    if (bytes / (size_t)d->token_bytes < (size_t)block_size + 1)
        return split_too_short(path, bytes / (size_t)d->token_bytes, block_size, err, errlen);
    int fd = open(path, O_RDONLY);
    void *map = fd >= 0 ? mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
    int why = errno;
    if (fd >= 0) close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, errlen, "cannot map '%s': %s", path, strerror(why));
        return -1;
    }
    madvise(map, bytes, MADV_RANDOM);  /* windows at random offsets: no read-ahead past them */
    d->tokens[split] = map;
    d->len[split] = bytes / (size_t)d->token_bytes;
    d->owned[split] = map;
    d->owned_bytes[split] = bytes;
    return 0;
}

int dataset_load(Dataset *d, const char *path, int block_size, char *err, size_t errlen) {
    memset(d, 0, sizeof *d);
    snprintf(d->source, sizeof d->source, "%s", path);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return load_text(d, path, block_size, err, errlen);
    if (read_meta(d, path, err, errlen) != 0 || map_split(d, path, SPLIT_TRAIN, block_size, err, errlen) != 0 ||
        map_split(d, path, SPLIT_VAL, block_size, err, errlen) != 0) {
        dataset_free(d);
        return -1;
    }
    return 0;
}

void dataset_free(Dataset *d) {
    if (d->characters) {
        host_memory_give_back(d->owned_bytes[SPLIT_TRAIN]);
        free(d->owned[SPLIT_TRAIN]);
    } else {
        for (int s = 0; s < SPLITS; s++)
            if (d->owned[s]) munmap(d->owned[s], d->owned_bytes[s]);
    }
    memset(d->owned, 0, sizeof d->owned);
}

static uint32_t token_at(const Dataset *d, int split, size_t i) {
    return d->token_bytes == 2 ? ((const uint16_t *)d->tokens[split])[i] : ((const uint32_t *)d->tokens[split])[i];
}

int dataset_batch(const Dataset *d, int split, int purpose, uint32_t seed, uint32_t index, int row0, int rows,
                  int T, int *x, int *y, char *err, size_t errlen) {
    size_t starts = d->len[split] - (size_t)T;  /* windows of T + 1 tokens fit */
    for (int r = 0; r < rows; r++) {
        uint32_t row = (uint32_t)(row0 + r);
        Philox4 ctr = {{ row, index, (uint32_t)split, (uint32_t)purpose }};
        Philox4 bits = philox4x32_10(ctr, seed, PHILOX_STREAM_BATCH);
        size_t start = (((uint64_t)bits.v[0] << 32) | bits.v[1]) % starts;
        for (int t = 0; t <= T; t++) {
            uint32_t id = token_at(d, split, start + (size_t)t);
            if (id >= (uint32_t)d->vocab) {
                snprintf(err, errlen, "%s: the %s split's id %u at position %zu is not below the vocabulary's %d",
                         d->source, split == SPLIT_TRAIN ? "train" : "val", id, start + (size_t)t, d->vocab);
                return -1;
            }
            if (t < T) x[(size_t)r * T + t] = (int)id;
            if (t > 0) y[(size_t)r * T + t - 1] = (int)id;
        }
    }
    return 0;
}
