/* prepare.c: bin/prepare, a text file as a folder of token ids for bin/train.
 *
 *   bin/prepare --tokenizer=tokenizer.json --data=input.txt --out=DIR [--overwrite=1]
 *
 * As nanoGPT's data/shakespeare/prepare.py splits: the first 90% of the
 * text's characters (int(n * 0.9) code points) and the rest, each encoded
 * alone, to DIR/train.bin and DIR/val.bin as uint16 (uint32 past 65536 ids),
 * and DIR/meta.json with the vocabulary's size and the ids' type. The text's
 * bytes are encoded as they are (prepare.py's text mode would turn "\r\n"
 * into "\n"). No output may be the same file as --data or --tokenizer
 * (file_identity.h). Files already in DIR are replaced only with
 * --overwrite=1; each is written whole beside its place, then renamed into it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/data.h"
#include "../model/tokenizer.h"
#include "../runtime/host.h"
#include "file_identity.h"
#include "options.h"

static const char *const OUTPUTS[] = { "train.bin", "val.bin", "meta.json" };
enum { N_OUTPUTS = 3 };

/* The byte where the text's first int(n * 0.9) characters end (UTF-8: a
 * character starts at every byte that is not 10xxxxxx). */
static size_t split_byte(const unsigned char *text, size_t n) {
    size_t chars = 0;
    for (size_t i = 0; i < n; i++) chars += (text[i] & 0xC0) != 0x80;
    size_t want = (size_t)((double)chars * 0.9), seen = 0;
    for (size_t i = 0; i < n; i++) {
        if ((text[i] & 0xC0) == 0x80) continue;
        if (seen++ == want) return i;
    }
    return n;
}

/* DIR/name, written whole beside its place, then renamed into it. 0, or 1 after a line. */
static int write_output(const char *dir, const char *name, const void *bytes, size_t n) {
    char path[1200], err[1400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if (host_write_file(path, bytes, n, err, sizeof err) == 0) return 0;
    fprintf(stderr, "prepare: %s\n", err);
    return 1;
}

/* The ids in the narrowest of uint16 and uint32 that holds the vocabulary. */
static void *narrow(const TokenIds *ids, int token_bytes) {
    void *out = host_calloc(ids->n ? ids->n : 1, (size_t)token_bytes);
    for (size_t i = 0; i < ids->n; i++) {
        if (token_bytes == 2) ((uint16_t *)out)[i] = (uint16_t)ids->ids[i];
        else ((uint32_t *)out)[i] = (uint32_t)ids->ids[i];
    }
    return out;
}

/* No output the same file as --data or --tokenizer. 0, or 2 after a line. */
static int check_aliases(const TrainOptions *o) {
    char outputs[N_OUTPUTS][1200], flags[N_OUTPUTS][32], err[4000];
    ToolPath paths[N_OUTPUTS + 2] = { { "--data", o->data, 0, 0 }, { "--tokenizer", o->tokenizer, 0, 0 } };
    for (int i = 0; i < N_OUTPUTS; i++) {
        snprintf(outputs[i], sizeof outputs[i], "%s/%s", o->out, OUTPUTS[i]);
        snprintf(flags[i], sizeof flags[i], "--out's %s", OUTPUTS[i]);
        paths[2 + i] = (ToolPath){ flags[i], outputs[i], 1, 0 };
    }
    if (file_identity_distinct("prepare", paths, N_OUTPUTS + 2, err, sizeof err) == 0) return 0;
    fprintf(stderr, "%s\n", err);
    return 2;
}

/* --out ready: made if missing; none of its outputs there unless --overwrite=1. 0, or 2 after a line. */
static int check_out(const TrainOptions *o) {
    if (mkdir(o->out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "prepare: cannot make --out=%s: %s\n", o->out, strerror(errno));
        return 2;
    }
    for (int i = 0; i < N_OUTPUTS && !o->overwrite; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", o->out, OUTPUTS[i]);
        if (access(path, F_OK) == 0) {
            fprintf(stderr, "prepare: '%s' is there already (--overwrite=1 replaces it)\n", path);
            return 2;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    TrainOptions o;
    int rc = options_parse(&o, TOOL_PREPARE, "char", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!o.tokenizer[0] || !o.out[0]) {
        fprintf(stderr, "prepare: --tokenizer=tokenizer.json, --data=FILE and --out=DIR are needed (see --help)\n");
        return 2;
    }
    if ((rc = check_aliases(&o)) != 0) return rc;
    char err[1024];
    Tokenizer *t = tokenizer_load(o.tokenizer, err, sizeof err);
    if (!t) {
        fprintf(stderr, "prepare: %s\n", err);
        return 2;
    }
    unsigned char *text;
    size_t n;
    if ((rc = check_out(&o)) != 0) {
        tokenizer_free(t);
        return rc;
    }
    /* the ids take at most 4 bytes a byte of text */
    if (data_read_file(o.data, "data file", sizeof(int32_t), "its bytes and their ids", &text, &n, err,
                       sizeof err) != 0) {
        fprintf(stderr, "prepare: %s\n", err);
        tokenizer_free(t);
        return 2;
    }
    size_t cut = split_byte(text, n);
    TokenIds split[2] = { { 0 }, { 0 } };
    if (tokenizer_encode(t, (const char *)text, cut, &split[0], err, sizeof err) != 0 ||
        tokenizer_encode(t, (const char *)text + cut, n - cut, &split[1], err, sizeof err) != 0) {
        fprintf(stderr, "prepare: %s: %s\n", o.data, err);
        rc = 2;
    }
    int vocab = tokenizer_vocab(t), token_bytes = vocab <= 65536 ? 2 : 4;
    char meta[128];
    snprintf(meta, sizeof meta, "{\"vocab_size\": %d, \"dtype\": \"uint%d\"}\n", vocab, 8 * token_bytes);
    for (int s = 0; s < 2 && rc == 0; s++) {
        void *ids = narrow(&split[s], token_bytes);
        rc = write_output(o.out, OUTPUTS[s], ids, split[s].n * (size_t)token_bytes);
        free(ids);
    }
    if (rc == 0) rc = write_output(o.out, OUTPUTS[2], meta, strlen(meta));
    if (rc == 0)
        printf("prepare: %s: %zu train / %zu val ids (uint%d, vocabulary %d) in %s\n", o.data, split[0].n,
               split[1].n, 8 * token_bytes, vocab, o.out);
    token_ids_free(&split[0]);
    token_ids_free(&split[1]);
    host_memory_give_back(n * (1 + sizeof(int32_t)));
    free(text);
    tokenizer_free(t);
    return rc;
}
