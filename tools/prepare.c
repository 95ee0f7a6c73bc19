/* prepare.c: bin/prepare, a text file as a folder of token ids for bin/train.
 *
 *   bin/prepare --tokenizer=tokenizer.json --data=input.txt --out=DIR [--overwrite=1] [--newlines=raw]
 *
 * As nanoGPT's data/shakespeare/prepare.py splits: the text read as Python's
 * text mode reads it ("\r\n" and a lone "\r" as "\n"; --newlines=raw keeps
 * the bytes), the first 90% of its characters (int(n * 0.9) code points) and
 * the rest, each encoded alone, to DIR/train.bin and DIR/val.bin as uint16
 * (uint32 past 65536 ids), and DIR/meta.json with the vocabulary's size and
 * the ids' type. A text whose splits bin/train would refuse (fewer than 2 ids
 * in one) is refused before anything is written. No output may be the same
 * file as --data or --tokenizer (file_identity.h). Files already in DIR are
 * replaced only with --overwrite=1; all three are written whole beside their
 * places, then renamed into them, so a failed write leaves DIR as it was;
 * what a cut-short run left beside them is removed at the next start.
 *
 * Exit status: 0 done, 1 a file it could not use (the text, the tokenizer,
 * --out), 2 a command line no run can use.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/data.h"
#include "../model/safetensors.h"
#include "../model/tokenizer.h"
#include "../runtime/host.h"
#include "file_identity.h"
#include "options.h"

enum { N_OUTPUTS = TOKEN_FOLDER_FILES, PATH_BYTES = OPTION_PATH_MAX + 16 };

/* The fewest ids a split may hold: bin/train needs more than --block of them, and --block is at least 1. */
enum { MIN_SPLIT_IDS = 2 };

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

/* Python's universal newlines, in place: "\r\n" and a lone "\r" become "\n". The new length. */
static size_t universal_newlines(unsigned char *text, size_t n) {
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\r' && i + 1 < n && text[i + 1] == '\n') continue;
        text[kept++] = text[i] == '\r' ? '\n' : text[i];
    }
    return kept;
}

/* Output i's path in --out, and its temporary's (name.tmp.PID, which a later
 * run removes if this one is cut short: safetensors_remove_stale_temps). */
enum { TEMP_BYTES = PATH_BYTES + 64 };
typedef struct { char path[PATH_BYTES], temp[TEMP_BYTES]; } Output;

/* Output i written whole beside its place (host_write_beside). 0, or 1 after a line. */
static int write_beside(const char *dir, int i, const void *bytes, size_t n, Output *out) {
    char err[TEMP_BYTES + 256];
    snprintf(out->path, sizeof out->path, "%s/%s", dir, TOKEN_FOLDER_FILE[i]);
    if (host_write_beside(out->path, bytes, n, out->temp, sizeof out->temp, err, sizeof err) == 0) return 0;
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

/* The command line's files: no output the same file as an input, and none
 * already in --out unless --overwrite=1. 0, or 2 after a line. */
static int check_paths(const TrainOptions *o) {
    char outputs[N_OUTPUTS][PATH_BYTES], flags[N_OUTPUTS][32], err[4 * PATH_BYTES];
    ToolPath paths[N_OUTPUTS + 2] = { { "--data", o->data, 0, 0 }, { "--tokenizer", o->tokenizer, 0, 0 } };
    for (int i = 0; i < N_OUTPUTS; i++) {
        snprintf(outputs[i], sizeof outputs[i], "%s/%s", o->out, TOKEN_FOLDER_FILE[i]);
        snprintf(flags[i], sizeof flags[i], "--out's %s", TOKEN_FOLDER_FILE[i]);
        paths[2 + i] = (ToolPath){ flags[i], outputs[i], 1, 0 };
    }
    if (file_identity_distinct("prepare", paths, N_OUTPUTS + 2, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    for (int i = 0; i < N_OUTPUTS; i++)
        if (host_is_directory(outputs[i])) {  /* no file can be renamed over it */
            fprintf(stderr, "prepare: '%s' is a folder, where a file is to be written\n", outputs[i]);
            return 1;
        }
    for (int i = 0; i < N_OUTPUTS && !o->overwrite; i++)
        if (access(outputs[i], F_OK) == 0) {
            fprintf(stderr, "prepare: '%s' is there already (--overwrite=1 replaces it)\n", outputs[i]);
            return 2;
        }
    return 0;
}

/* --out made if missing, and a folder. 0, or 1 after a line. */
static int make_out(const char *dir) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "prepare: cannot make --out=%s: %s\n", dir, strerror(errno));
        return 1;
    }
    if (host_is_directory(dir)) return 0;
    fprintf(stderr, "prepare: --out '%s' is a file, not a folder\n", dir);
    return 1;
}

/* The text's two splits encoded, each holding at least MIN_SPLIT_IDS. 0, or 1 after a line. */
static int encode_splits(const TrainOptions *o, const Tokenizer *t, unsigned char *text, size_t n, TokenIds split[2]) {
    char err[1024];
    /* checked whole before the newlines change the bytes, so the offset is the file's */
    if (tokenizer_check_utf8(t, (const char *)text, n, err, sizeof err) != 0) {
        fprintf(stderr, "prepare: %s: %s\n", o->data, err);
        return 1;
    }
    if (strcmp(o->newlines, "universal") == 0) n = universal_newlines(text, n);
    size_t cut = split_byte(text, n);
    if (tokenizer_encode(t, (const char *)text, cut, &split[0], err, sizeof err) != 0 ||
        tokenizer_encode(t, (const char *)text + cut, n - cut, &split[1], err, sizeof err) != 0) {
        fprintf(stderr, "prepare: %s: %s\n", o->data, err);
        return 1;
    }
    if (split[0].n >= MIN_SPLIT_IDS && split[1].n >= MIN_SPLIT_IDS) return 0;
    fprintf(stderr, "prepare: '%s' gives %zu train and %zu val ids; bin/train needs at least %d ids in each split "
            "(more than --block)\n", o->data, split[0].n, split[1].n, MIN_SPLIT_IDS);
    return 1;
}

/* train.bin, val.bin and meta.json into --out: each written whole beside its
 * place, and only when all three are there each renamed into place, so that
 * a failed write (a full disk, a meta.json that is a folder) leaves the
 * folder as it was. 0, or 1 after a line. */
static int write_splits(const TrainOptions *o, const TokenIds split[2], int vocab) {
    int token_bytes = vocab <= 65536 ? 2 : 4, rc = make_out(o->out), written = 0;  /* temporaries there */
    Output out[N_OUTPUTS];
    for (int s = 0; s < 2 && rc == 0; s++) {
        void *ids = narrow(&split[s], token_bytes);
        rc = write_beside(o->out, s, ids, split[s].n * (size_t)token_bytes, &out[s]);
        written += rc == 0;
        free(ids);
    }
    char meta[128];
    snprintf(meta, sizeof meta, "{\"vocab_size\": %d, \"dtype\": \"uint%d\"}\n", vocab, 8 * token_bytes);
    if (rc == 0) {
        rc = write_beside(o->out, 2, meta, strlen(meta), &out[2]);
        written += rc == 0;
    }
    for (int i = 0; i < N_OUTPUTS && rc == 0; i++)  /* a rename fails only into a folder, which check_paths refused */
        if (rename(out[i].temp, out[i].path) != 0) {
            fprintf(stderr, "prepare: cannot write '%s': %s\n", out[i].path, strerror(errno));
            rc = 1;
        }
    for (int i = 0; rc != 0 && i < written; i++) unlink(out[i].temp);  /* what a failure left of them */
    if (rc == 0)
        printf("prepare: %s: %zu train / %zu val ids (uint%d, vocabulary %d) in %s\n", o->data, split[0].n,
               split[1].n, 8 * token_bytes, vocab, o->out);
    return rc;
}

int main(int argc, char **argv) {
    TrainOptions o;
    int rc = options_parse(&o, TOOL_PREPARE, "char", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!o.tokenizer[0] || !o.out[0]) {
        fprintf(stderr, "prepare: --tokenizer=tokenizer.json, --data=FILE and --out=DIR are needed (see --help)\n");
        return 2;
    }
    if ((rc = check_paths(&o)) != 0) return rc;
    for (int i = 0; i < N_OUTPUTS && host_is_directory(o.out); i++)
        safetensors_remove_stale_temps(o.out, TOKEN_FOLDER_FILE[i]);
    char err[1024];
    Tokenizer *t = tokenizer_load(o.tokenizer, err, sizeof err);
    if (!t) {
        fprintf(stderr, "prepare: %s\n", err);
        return 1;
    }
    unsigned char *text;
    size_t n;
    /* the ids take at most 4 bytes a byte of text */
    if (data_read_file(o.data, "data file", sizeof(int32_t), "its bytes and their ids", &text, &n, err,
                       sizeof err) != 0) {
        fprintf(stderr, "prepare: %s\n", err);
        tokenizer_free(t);
        return 1;
    }
    TokenIds split[2] = { { 0 }, { 0 } };
    rc = encode_splits(&o, t, text, n, split);
    if (rc == 0) rc = write_splits(&o, split, tokenizer_vocab(t));
    token_ids_free(&split[0]);
    token_ids_free(&split[1]);
    host_memory_give_back(n * (1 + sizeof(int32_t)));
    free(text);
    tokenizer_free(t);
    return rc;
}
