/* tokenizer.h: GPT-2's byte-level BPE, read from a Hugging Face tokenizer.json.
 *
 * Encoding is the `tokenizers` package's, id for id: the text is split at
 * the added tokens (<|endoftext|>), each part into pieces by GPT-2's
 * pre-tokenizer regex (PCRE2, Unicode properties), each piece's bytes mapped
 * to GPT-2's printable characters and merged pair by pair, the lowest-ranked
 * merge first. Decoding maps each id back to the bytes it stands for.
 * What the reader does not implement (a normalizer, BPE dropout, merges of
 * another kind) is refused when the file is read, never guessed at.
 */
#ifndef ZF_TOKENIZER_H
#define ZF_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

/* A growing list of token ids. */
typedef struct {
    int32_t *ids;
    size_t n, capacity;
} TokenIds;

/* The tokenizer of a tokenizer.json, or NULL with a one-line message in err. */
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);
void tokenizer_free(Tokenizer *t);

/* One more than the largest id, added tokens included. */
int tokenizer_vocab(const Tokenizer *t);

/* Appends the ids of n bytes of UTF-8 text to out. 0, or -1 with a one-line
 * message in err (text that is not UTF-8, a byte with no token). */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t n, TokenIds *out, char *err, size_t errlen);
/* Whether n bytes of text are UTF-8 throughout (PCRE2's check, as the
 * encoder's): 0, or -1 with a line naming the first bad byte's offset. */
int tokenizer_check_utf8(const Tokenizer *t, const char *text, size_t n, char *err, size_t errlen);
void token_ids_free(TokenIds *ids);

/* The pre-tokenizer alone: piece(ctx, bytes, len) for each piece of n bytes
 * of UTF-8 text in order, the pieces tiling the text (no added tokens and no
 * prefix space here). 0, -1 with a line in err, or what piece returned if not 0. */
int tokenizer_pieces(const Tokenizer *t, const char *text, size_t n,
                     int (*piece)(void *ctx, const char *bytes, size_t len), void *ctx, char *err, size_t errlen);

/* The bytes that id stands for (*len of them; none for an id out of range). */
const unsigned char *tokenizer_bytes(const Tokenizer *t, int id, size_t *len);

#endif
