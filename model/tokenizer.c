/* tokenizer.c: GPT-2's byte-level BPE (tokenizer.h): the tokenizer.json
 * reader, the pre-tokenizer, the merges and the byte map. */
#include "tokenizer.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "../runtime/host.h"

/* GPT-2's pre-tokenizer (its encoder.py, and the `tokenizers` ByteLevel's):
 * contractions, letters, numbers, other symbols, each with one space before;
 * then whitespace runs, all but the last space of a run that a word follows. */
static const char PIECE_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { MAX_IDS = 1 << 24 };

/* Text -> id, open addressing; the keys are the tokenizer's own strings. */
typedef struct {
    const char **keys;
    int *ids;
    size_t mask;
} TextTable;

/* (left id, right id) -> the merge's rank and the id it makes. */
typedef struct {
    uint64_t *pairs;  /* UINT64_MAX: empty */
    int *ranks, *merged;
    size_t mask;
} MergeTable;

typedef struct {
    const char *content;
    size_t len;
    int id;
} AddedToken;

struct Tokenizer {
    int vocab;
    char **text;             /* [vocab] each id's string in the file, NULL for an unused id */
    unsigned char **bytes;   /* [vocab] the bytes each id decodes to */
    size_t *nbytes;
    int byte_token[256];     /* the id of each byte's one-character token, -1 if none */
    TextTable by_text;
    MergeTable merges;
    AddedToken *added;       /* matched before pre-tokenizing, longest first at a position */
    int n_added;
    int add_prefix_space;
    pcre2_code *pieces;
};

static uint64_t hash_bytes(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static uint64_t hash_pair(uint64_t pair) {
    pair ^= pair >> 33;
    pair *= 0xff51afd7ed558ccdull;
    return pair ^ (pair >> 33);
}

static size_t table_size(size_t count) {
    size_t n = 16;
    while (n < 2 * count) n *= 2;
    return n;
}

static int text_find(const TextTable *t, const char *key) {
    for (size_t i = hash_bytes(key) & t->mask;; i = (i + 1) & t->mask) {
        if (!t->keys[i]) return -1;
        if (strcmp(t->keys[i], key) == 0) return t->ids[i];
    }
}

static void text_insert(TextTable *t, const char *key, int id) {
    size_t i = hash_bytes(key) & t->mask;
    while (t->keys[i]) i = (i + 1) & t->mask;
    t->keys[i] = key;
    t->ids[i] = id;
}

static size_t merge_slot(const MergeTable *m, uint64_t pair) {
    size_t i = hash_pair(pair) & m->mask;
    while (m->pairs[i] != UINT64_MAX && m->pairs[i] != pair) i = (i + 1) & m->mask;
    return i;
}

static uint64_t pair_of(int left, int right) { return (uint64_t)(uint32_t)left << 32 | (uint32_t)right; }

/* The rank of merging left and right (INT_MAX: no such merge), and what it makes. */
static int merge_rank(const MergeTable *m, int left, int right, int *merged) {
    size_t i = merge_slot(m, pair_of(left, right));
    if (m->pairs[i] == UINT64_MAX) return INT_MAX;
    *merged = m->merged[i];
    return m->ranks[i];
}

/* GPT-2's byte map: the printable bytes stand for themselves, the others for
 * the code points from 256 up, in byte order (its encoder.py's bytes_to_unicode). */
static int byte_code_point(int b) {
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF))) n++;
    return 256 + n;
}

/* One code point of valid UTF-8 (Jansson has checked its strings); its length in *len. */
static int utf8_decode(const unsigned char *s, int *len) {
    if (s[0] < 0x80) { *len = 1; return s[0]; }
    if (s[0] < 0xE0) { *len = 2; return (s[0] & 0x1F) << 6 | (s[1] & 0x3F); }
    if (s[0] < 0xF0) { *len = 3; return (s[0] & 0x0F) << 12 | (s[1] & 0x3F) << 6 | (s[2] & 0x3F); }
    *len = 4;
    return (s[0] & 0x07) << 18 | (s[1] & 0x3F) << 12 | (s[2] & 0x3F) << 6 | (s[3] & 0x3F);
}

static int utf8_encode(int cp, char *out) {
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | cp >> 6);
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;  /* the byte map's code points are below 0x800 */
}

/* What a token decodes to, as the ByteLevel decoder does it: each character
 * back to its byte, or, if any character is not one of the map's (an added
 * token's text), the token's own UTF-8. */
static void token_decoding(Tokenizer *t, int id, const int byte_of[512]) {
    const unsigned char *s = (const unsigned char *)t->text[id];
    size_t n = strlen(t->text[id]), k = 0;
    unsigned char *out = host_calloc(n + 1, 1);
    for (size_t i = 0; i < n;) {
        int len, cp = utf8_decode(s + i, &len);
        if (cp >= 512 || byte_of[cp] < 0) {
            memcpy(out, s, n);
            k = n;
            break;
        }
        out[k++] = (unsigned char)byte_of[cp];
        i += (size_t)len;
    }
    t->bytes[id] = out;
    t->nbytes[id] = k;
}

static int refuse(char *err, size_t errlen, const char *path, const char *why) {
    snprintf(err, errlen, "tokenizer '%s': %s", path, why);
    return -1;
}

/* A field that must be absent, null, false or "" for this reader. */
static int unset(const json_t *x) {
    return !x || json_is_null(x) || json_is_false(x) || (json_is_string(x) && !json_string_value(x)[0]);
}

/* The file's settings that change the ids: refused unless this reader does what they ask. */
static int check_settings(const json_t *root, const json_t *model, const char *path, int *add_prefix_space,
                          char *err, size_t errlen) {
    const char *type = json_string_value(json_object_get(model, "type"));
    if (!type || strcmp(type, "BPE") != 0) return refuse(err, errlen, path, "its model is not BPE");
    static const char *model_unsupported[] = { "dropout", "continuing_subword_prefix", "end_of_word_suffix",
                                               "byte_fallback", "ignore_merges" };
    for (size_t i = 0; i < sizeof model_unsupported / sizeof *model_unsupported; i++)
        if (!unset(json_object_get(model, model_unsupported[i]))) {
            snprintf(err, errlen, "tokenizer '%s': its BPE sets %s, which this reader does not implement", path,
                     model_unsupported[i]);
            return -1;
        }
    if (!unset(json_object_get(root, "normalizer")))
        return refuse(err, errlen, path, "it has a normalizer, which this reader does not implement");
    const json_t *pre = json_object_get(root, "pre_tokenizer");
    const char *pre_type = json_string_value(json_object_get(pre, "type"));
    if (!pre_type || strcmp(pre_type, "ByteLevel") != 0 || json_is_false(json_object_get(pre, "use_regex")))
        return refuse(err, errlen, path, "its pre-tokenizer is not ByteLevel with GPT-2's regex (byte-level BPE)");
    *add_prefix_space = json_is_true(json_object_get(pre, "add_prefix_space"));
    const json_t *post = json_object_get(root, "post_processor");
    const char *post_type = json_string_value(json_object_get(post, "type"));
    if (!unset(post) && (!post_type || strcmp(post_type, "ByteLevel") != 0))
        return refuse(err, errlen, path, "its post-processor adds tokens, which this reader does not implement");
    return 0;
}

/* Places an id's string; a second string for one id is refused. */
static int place_token(Tokenizer *t, int id, const char *text, const char *path, char *err, size_t errlen) {
    if (t->text[id]) {
        if (strcmp(t->text[id], text) == 0) return 0;  /* an added token that is in the vocabulary too */
        snprintf(err, errlen, "tokenizer '%s': id %d is both '%.40s' and '%.40s'", path, id, t->text[id], text);
        return -1;
    }
    t->text[id] = strdup(text);
    return 0;
}

/* The largest id of the vocabulary and the added tokens, checked. */
static int largest_id(const json_t *vocab, const json_t *added, const char *path, char *err, size_t errlen) {
    int largest = -1;
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)vocab, key, value) {
        json_int_t id = json_is_integer(value) ? json_integer_value(value) : -1;
        if (id < 0 || id >= MAX_IDS) {
            snprintf(err, errlen, "tokenizer '%s': the id of '%.40s' is not a whole number in 0..%d", path, key,
                     MAX_IDS - 1);
            return -1;
        }
        if (id > largest) largest = (int)id;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
        const char *content = json_string_value(json_object_get(a, "content"));
        if (!content || !content[0] || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= MAX_IDS)
            return refuse(err, errlen, path, "an added token lacks its content or a valid id");
        if (!unset(json_object_get(a, "lstrip")) || !unset(json_object_get(a, "rstrip")) ||
            !unset(json_object_get(a, "single_word"))) {
            snprintf(err, errlen, "tokenizer '%s': added token '%.40s' sets lstrip, rstrip or single_word, which "
                     "this reader does not implement", path, content);
            return -1;
        }
        if (json_integer_value(id) > largest) largest = (int)json_integer_value(id);
    }
    if (largest < 0) return refuse(err, errlen, path, "its vocabulary is empty");
    return largest;
}

/* A merge as "left right" or as ["left", "right"]; 0, or -1. */
static int merge_halves(const json_t *m, char *left, char *right, size_t cap) {
    if (json_is_array(m) && json_array_size(m) == 2) {
        const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
        if (!a || !b || strlen(a) >= cap || strlen(b) >= cap) return -1;
        strcpy(left, a);
        strcpy(right, b);
        return 0;
    }
    const char *s = json_string_value(m), *space = s ? strchr(s, ' ') : NULL;
    if (!space || strchr(space + 1, ' ') || (size_t)(space - s) >= cap || strlen(space + 1) >= cap) return -1;
    memcpy(left, s, (size_t)(space - s));
    left[space - s] = 0;
    strcpy(right, space + 1);
    return 0;
}

static int read_merges(Tokenizer *t, const json_t *merges, const char *path, char *err, size_t errlen) {
    size_t count = json_array_size(merges);
    MergeTable *m = &t->merges;
    m->mask = table_size(count) - 1;
    m->pairs = host_calloc(m->mask + 1, sizeof *m->pairs);
    memset(m->pairs, 0xff, (m->mask + 1) * sizeof *m->pairs);
    m->ranks = host_calloc(m->mask + 1, sizeof *m->ranks);
    m->merged = host_calloc(m->mask + 1, sizeof *m->merged);
    enum { CAP = 1024 };
    char left[CAP], right[CAP], both[2 * CAP];
    for (size_t r = 0; r < count; r++) {
        if (merge_halves(json_array_get(merges, r), left, right, CAP) != 0) {
            snprintf(err, errlen, "tokenizer '%s': merge %zu is not two tokens", path, r);
            return -1;
        }
        snprintf(both, sizeof both, "%s%s", left, right);
        int a = text_find(&t->by_text, left), b = text_find(&t->by_text, right), ab = text_find(&t->by_text, both);
        if (a < 0 || b < 0 || ab < 0) {
            snprintf(err, errlen, "tokenizer '%s': merge %zu ('%.40s' '%.40s') uses or makes a token that is not "
                     "in the vocabulary", path, r, left, right);
            return -1;
        }
        size_t i = merge_slot(m, pair_of(a, b));
        if (m->pairs[i] != UINT64_MAX) {
            snprintf(err, errlen, "tokenizer '%s': merge %zu ('%.40s' '%.40s') is listed twice", path, r, left, right);
            return -1;
        }
        m->pairs[i] = pair_of(a, b);
        m->ranks[i] = (int)r;
        m->merged[i] = ab;
    }
    return 0;
}

static int build(Tokenizer *t, const json_t *root, const char *path, char *err, size_t errlen) {
    const json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges"), *added = json_object_get(root, "added_tokens");
    if (!json_is_object(model) || !json_is_object(vocab) || !json_is_array(merges) || (added && !json_is_array(added)))
        return refuse(err, errlen, path, "it lacks model.vocab or model.merges (not a tokenizers file)");
    if (check_settings(root, model, path, &t->add_prefix_space, err, errlen) != 0) return -1;
    int largest = largest_id(vocab, added, path, err, errlen);
    if (largest < 0) return -1;
    t->vocab = largest + 1;
    t->text = host_calloc((size_t)t->vocab, sizeof *t->text);
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)vocab, key, value)
        if (place_token(t, (int)json_integer_value(value), key, path, err, errlen) != 0) return -1;
    t->n_added = (int)json_array_size(added);
    t->added = host_calloc((size_t)t->n_added + 1, sizeof *t->added);
    for (int i = 0; i < t->n_added; i++) {
        const json_t *a = json_array_get(added, (size_t)i);
        int id = (int)json_integer_value(json_object_get(a, "id"));
        if (place_token(t, id, json_string_value(json_object_get(a, "content")), path, err, errlen) != 0) return -1;
        t->added[i] = (AddedToken){ t->text[id], strlen(t->text[id]), id };
    }

    t->by_text.mask = table_size((size_t)t->vocab) - 1;
    t->by_text.keys = host_calloc(t->by_text.mask + 1, sizeof *t->by_text.keys);
    t->by_text.ids = host_calloc(t->by_text.mask + 1, sizeof *t->by_text.ids);
    for (int id = 0; id < t->vocab; id++)
        if (t->text[id]) text_insert(&t->by_text, t->text[id], id);
    if (read_merges(t, merges, path, err, errlen) != 0) return -1;

    int byte_of[512];
    for (int cp = 0; cp < 512; cp++) byte_of[cp] = -1;
    for (int b = 0; b < 256; b++) {
        char one[3] = { 0 };
        int cp = byte_code_point(b);
        utf8_encode(cp, one);
        byte_of[cp] = b;
        t->byte_token[b] = text_find(&t->by_text, one);
    }
    t->bytes = host_calloc((size_t)t->vocab, sizeof *t->bytes);
    t->nbytes = host_calloc((size_t)t->vocab, sizeof *t->nbytes);
    for (int id = 0; id < t->vocab; id++)
        if (t->text[id]) token_decoding(t, id, byte_of);

    int code;
    PCRE2_SIZE at;
    t->pieces = pcre2_compile((PCRE2_SPTR)PIECE_PATTERN, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at,
                              NULL);
    if (!t->pieces) return refuse(err, errlen, path, "PCRE2 cannot compile GPT-2's pre-tokenizer pattern");
    pcre2_jit_compile(t->pieces, PCRE2_JIT_COMPLETE);  /* an interpreted match if the JIT is not there */
    return 0;
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen) {
    if (host_is_directory(path)) {  /* jansson would call it a parse error */
        snprintf(err, errlen, "tokenizer '%s' is a folder, not a file", path);
        return NULL;
    }
    struct stat st;
    if (host_regular_file(path, "tokenizer", &st, err, errlen) != 0) return NULL;
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        snprintf(err, errlen, "tokenizer '%s': %s (line %d)", path, je.text, je.line);
        return NULL;
    }
    Tokenizer *t = host_calloc(1, sizeof *t);
    int rc = json_is_object(root) ? build(t, root, path, err, errlen) : refuse(err, errlen, path, "not a JSON object");
    json_decref(root);
    if (rc != 0) {
        tokenizer_free(t);
        return NULL;
    }
    return t;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (int id = 0; id < t->vocab; id++) {
        free(t->text[id]);
        if (t->bytes) free(t->bytes[id]);
    }
    free(t->text);
    free(t->bytes);
    free(t->nbytes);
    free(t->by_text.keys);
    free(t->by_text.ids);
    free(t->merges.pairs);
    free(t->merges.ranks);
    free(t->merges.merged);
    free(t->added);
    pcre2_code_free(t->pieces);
    free(t);
}

int tokenizer_vocab(const Tokenizer *t) { return t->vocab; }

const unsigned char *tokenizer_bytes(const Tokenizer *t, int id, size_t *len) {
    *len = id >= 0 && id < t->vocab && t->bytes[id] ? t->nbytes[id] : 0;
    return *len ? t->bytes[id] : (const unsigned char *)"";
}

static void push_id(TokenIds *out, int id) {
    if (out->n == out->capacity) {
        out->capacity = out->capacity ? 2 * out->capacity : 1024;
        out->ids = realloc(out->ids, out->capacity * sizeof *out->ids);
        if (!out->ids) host_calloc(SIZE_MAX, 1);  /* host.h's one line for a host out of memory */
    }
    out->ids[out->n++] = id;
}

void token_ids_free(TokenIds *ids) {
    free(ids->ids);
    *ids = (TokenIds){ 0 };
}

/* The BPE of one piece, as the `tokenizers` Word does it: its bytes' tokens
 * in a list, merged lowest rank first (leftmost among equals) through a heap
 * of candidate pairs, a candidate dropped when either side has changed. */
typedef struct { int rank, at, left, right, merged; } Candidate;
typedef struct {
    int *id, *prev, *next;  /* the list of symbols; -1 ends it */
    Candidate *heap;
    size_t cap, n_heap;
} Scratch;

static int before(Candidate a, Candidate b) { return a.rank < b.rank || (a.rank == b.rank && a.at < b.at); }

static void heap_push(Scratch *s, Candidate c) {
    size_t i = s->n_heap++;
    while (i > 0 && before(c, s->heap[(i - 1) / 2])) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = c;
}

static Candidate heap_pop(Scratch *s) {
    Candidate top = s->heap[0], last = s->heap[--s->n_heap];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= s->n_heap) break;
        if (child + 1 < s->n_heap && before(s->heap[child + 1], s->heap[child])) child++;
        if (!before(s->heap[child], last)) break;
        s->heap[i] = s->heap[child];
        i = child;
    }
    s->heap[i] = last;
    return top;
}

/* The pair that starts at symbol i, if a merge takes it. */
static void offer(const Tokenizer *t, Scratch *s, int i) {
    if (i < 0 || s->next[i] < 0) return;
    int j = s->next[i], merged;
    int rank = merge_rank(&t->merges, s->id[i], s->id[j], &merged);
    if (rank != INT_MAX) heap_push(s, (Candidate){ rank, i, s->id[i], s->id[j], merged });
}

static int encode_piece(const Tokenizer *t, Scratch *s, const unsigned char *piece, size_t n, TokenIds *out,
                        char *err, size_t errlen) {
    if (n > s->cap) {
        s->cap = n;
        s->id = realloc(s->id, n * sizeof *s->id);
        s->prev = realloc(s->prev, n * sizeof *s->prev);
        s->next = realloc(s->next, n * sizeof *s->next);
        s->heap = realloc(s->heap, 3 * n * sizeof *s->heap);  /* n - 1 at first, then at most 2 per merge */
        if (!s->id || !s->prev || !s->next || !s->heap) host_calloc(SIZE_MAX, 1);
    }
    for (size_t i = 0; i < n; i++) {
        s->id[i] = t->byte_token[piece[i]];
        if (s->id[i] < 0) {
            snprintf(err, errlen, "byte 0x%02x has no token in the tokenizer (not a byte-level vocabulary)", piece[i]);
            return -1;
        }
        s->prev[i] = (int)i - 1;
        s->next[i] = i + 1 < n ? (int)i + 1 : -1;
    }
    s->n_heap = 0;
    for (size_t i = 0; i + 1 < n; i++) offer(t, s, (int)i);
    while (s->n_heap > 0) {
        Candidate c = heap_pop(s);
        int i = c.at, j = s->next[i];
        if (s->id[i] != c.left || j < 0 || s->id[j] != c.right) continue;  /* stale */
        s->id[i] = c.merged;
        s->next[i] = s->next[j];
        if (s->next[j] >= 0) s->prev[s->next[j]] = i;
        s->id[j] = -1;  /* gone: no candidate from it matches again */
        offer(t, s, s->prev[i]);
        offer(t, s, i);
    }
    for (int i = 0; i >= 0; i = s->next[i]) push_id(out, s->id[i]);
    return 0;
}

int tokenizer_check_utf8(const Tokenizer *t, const char *text, size_t n, char *err, size_t errlen) {
    pcre2_match_data *match = pcre2_match_data_create_from_pattern(t->pieces, NULL);
    if (!match) host_fatal("pcre2_match_data_create_from_pattern");
    /* the first match of a subject checks all of it before it looks for a piece */
    int found = pcre2_match(t->pieces, (PCRE2_SPTR)text, n, 0, 0, match, NULL), rc = 0;
    if (found <= PCRE2_ERROR_UTF8_ERR1 && found >= PCRE2_ERROR_UTF8_ERR21) {
        snprintf(err, errlen, "the text is not UTF-8 at byte %zu", (size_t)pcre2_get_startchar(match));
        rc = -1;
    }
    pcre2_match_data_free(match);
    return rc;
}

/* The pieces of text by the pattern, any text between two matches a piece
 * of its own (as `tokenizers` keeps it); error offsets count from `base`. */
static int split_pieces(const Tokenizer *t, const char *text, size_t n, size_t base,
                        int (*piece)(void *ctx, const char *bytes, size_t len), void *ctx, char *err, size_t errlen) {
    pcre2_match_data *match = pcre2_match_data_create_from_pattern(t->pieces, NULL);
    int rc = 0;
    uint32_t options = 0;  /* the first match checks the UTF-8 of the whole text */
    for (size_t at = 0; rc == 0 && at < n;) {
        int found = pcre2_match(t->pieces, (PCRE2_SPTR)text, n, at, options, match, NULL);
        options = PCRE2_NO_UTF_CHECK;
        size_t start = n, end = n;
        if (found > 0) {
            PCRE2_SIZE *span = pcre2_get_ovector_pointer(match);
            start = span[0];
            end = span[1];
        } else if (found <= PCRE2_ERROR_UTF8_ERR1 && found >= PCRE2_ERROR_UTF8_ERR21) {
            snprintf(err, errlen, "the text is not UTF-8 at byte %zu", base + (size_t)pcre2_get_startchar(match));
            rc = -1;
            break;
        } else if (found != PCRE2_ERROR_NOMATCH) {
            snprintf(err, errlen, "PCRE2 failed on the text near byte %zu (error %d)", base + at, found);
            rc = -1;
            break;
        }
        if (start > at) rc = piece(ctx, text + at, start - at);
        if (rc == 0 && end > start) rc = piece(ctx, text + start, end - start);
        at = end;
    }
    pcre2_match_data_free(match);
    return rc;
}

int tokenizer_pieces(const Tokenizer *t, const char *text, size_t n,
                     int (*piece)(void *ctx, const char *bytes, size_t len), void *ctx, char *err, size_t errlen) {
    return split_pieces(t, text, n, 0, piece, ctx, err, errlen);
}

typedef struct {
    const Tokenizer *t;
    Scratch *scratch;
    TokenIds *out;
    char *err;
    size_t errlen;
} PieceSink;

static int bpe_piece(void *ctx, const char *bytes, size_t len) {
    PieceSink *k = ctx;
    return encode_piece(k->t, k->scratch, (const unsigned char *)bytes, len, k->out, k->err, k->errlen);
}

/* A part of the text between added tokens, which starts at byte `offset`: a
 * space before it where the file asks for one, then its pieces' BPE. */
static int encode_part(const Tokenizer *t, Scratch *s, const char *text, size_t n, TokenIds *out, char *err,
                       size_t errlen, size_t offset) {
    char *with_space = NULL;
    if (t->add_prefix_space && text[0] != ' ') {
        with_space = host_calloc(n + 1, 1);
        with_space[0] = ' ';
        memcpy(with_space + 1, text, n);
        text = with_space;
        n++;
        offset--;  /* the space is not the text's */
    }
    PieceSink sink = { t, s, out, err, errlen };
    int rc = split_pieces(t, text, n, offset, bpe_piece, &sink, err, errlen);
    free(with_space);
    return rc;
}

/* The first added token at or after `from` (the longest of those that start
 * there), or NULL. seen[i] is where token i is next (n: nowhere; SIZE_MAX:
 * not looked for yet), looked for again only once the text has passed it. */
static const AddedToken *next_added(const Tokenizer *t, const char *text, size_t n, size_t from, size_t *seen,
                                    size_t *at) {
    const AddedToken *best = NULL;
    for (int i = 0; i < t->n_added; i++) {
        const AddedToken *a = &t->added[i];
        if (seen[i] == SIZE_MAX || seen[i] < from) {
            const char *hit = memmem(text + from, n - from, a->content, a->len);
            seen[i] = hit ? (size_t)(hit - text) : n;
        }
        if (seen[i] < n && (!best || seen[i] < *at || (seen[i] == *at && a->len > best->len))) {
            best = a;
            *at = seen[i];
        }
    }
    return best;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t n, TokenIds *out, char *err, size_t errlen) {
    Scratch s = { 0 };
    size_t *seen = host_calloc((size_t)t->n_added + 1, sizeof *seen);
    memset(seen, 0xff, ((size_t)t->n_added + 1) * sizeof *seen);
    int rc = 0;
    for (size_t from = 0; rc == 0 && from < n;) {
        size_t at = n;
        const AddedToken *a = next_added(t, text, n, from, seen, &at);
        if (at > from) rc = encode_part(t, &s, text + from, at - from, out, err, errlen, from);
        if (rc == 0 && a) push_id(out, a->id);
        from = a ? at + a->len : n;
    }
    free(seen);
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.heap);
    return rc;
}
