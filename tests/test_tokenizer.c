/* test_tokenizer.c: the byte-level BPE (model/tokenizer.h) against its
 * reference, the `tokenizers` package from PyPI (make deps puts it in
 * build/pylib; tests/tokenizers_reference.py is its side).
 *
 * A tokenizer is trained at test time (no download) on tinyshakespeare and a
 * sample of scripts, emoji, combining marks and odd white space
 * (tests/tokenizer_sample.txt); both encode the same texts and the ids must
 * be the same, one for one. bin/prepare's files must be, byte for byte, what
 * nanoGPT's prepare.py split gives through the package.
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/tokenizer.h"
#include "reference.h"

TestSuite(tokenizer, .timeout = 300);

static const char SHAKESPEARE[] = "data/tinyshakespeare.txt", SAMPLE[] = "tests/tokenizer_sample.txt";

/* tests/tokenizers_reference.py with the formatted arguments; it must succeed. */
__attribute__((format(printf, 1, 2))) static void python(const char *args_fmt, ...) {
    char args[1024], cmd[2048];
    va_list ap;
    va_start(ap, args_fmt);
    vsnprintf(args, sizeof args, args_fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "PYTHONPATH=build/pylib %s tests/tokenizers_reference.py %s", test_python(), args);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* A byte-level BPE of `vocab` ids trained on both texts, as dir/tokenizer.json. */
static void train_tokenizer(const char *dir, const char *vocab, char *path, size_t len) {
    snprintf(path, len, "%s/tokenizer.json", dir);
    python("train %s %s %s %s", path, vocab, SHAKESPEARE, SAMPLE);
}

static Tokenizer *load(const char *path) {
    char err[512];
    Tokenizer *t = tokenizer_load(path, err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    return t;
}

/* The file's ids by our encoder. */
static TokenIds encode_file(const Tokenizer *t, const char *path) {
    size_t n;
    unsigned char *text = read_all(path, &n);
    TokenIds ids = { 0 };
    char err[512];
    cr_assert_eq(tokenizer_encode(t, (const char *)text, n, &ids, err, sizeof err), 0, "%s: %s", path, err);
    free(text);
    return ids;
}

/* Our ids of `text_path` equal the package's, one for one. */
static void same_ids(const Tokenizer *t, const char *tokenizer_path, const char *text_path, const char *dir) {
    char out[256];
    snprintf(out, sizeof out, "%s/reference.u32", dir);
    python("encode %s %s %s", tokenizer_path, text_path, out);
    size_t bytes;
    uint32_t *want = (uint32_t *)read_all(out, &bytes);
    TokenIds got = encode_file(t, text_path);
    size_t n = bytes / 4, first = 0;
    while (first < n && first < got.n && (uint32_t)got.ids[first] == want[first]) first++;
    cr_assert(first == n && got.n == n, "%s: %zu ids against the package's %zu; the first difference at id %zu: "
              "%d against %u", text_path, got.n, n, first, first < got.n ? got.ids[first] : -1,
              first < n ? want[first] : 0u);
    free(want);
    token_ids_free(&got);
}

Test(tokenizer, ids_equal_the_tokenizers_package_over_shakespeare_and_many_scripts) {
    need_tokenizers();
    char dir[48], path[128], legacy[128];
    temp_dir(dir, sizeof dir, "bpe");
    train_tokenizer(dir, "2000", path, sizeof path);
    Tokenizer *t = load(path);
    cr_assert_eq(tokenizer_vocab(t), 2000);
    same_ids(t, path, SHAKESPEARE, dir);
    same_ids(t, path, SAMPLE, dir);
    tokenizer_free(t);
    /* merges written as "a b", as GPT-2's own file and older tokenizers write them */
    snprintf(legacy, sizeof legacy, "%s/legacy.json", dir);
    python("legacy %s %s", path, legacy);
    t = load(legacy);
    same_ids(t, legacy, SAMPLE, dir);
    tokenizer_free(t);
    remove_dir(dir);
}

typedef struct { size_t *ends, n, cap; const char *text; } PieceEnds;

static int note_end(void *ctx, const char *bytes, size_t len) {
    PieceEnds *p = ctx;
    if (p->n == p->cap) p->ends = realloc(p->ends, (p->cap = 2 * p->cap + 1024) * sizeof *p->ends);
    p->ends[p->n++] = (size_t)(bytes - p->text) + len;
    return 0;
}

/* The pieces alone, where the ids could hide a difference (no merge across
 * the boundary that moved): Unicode white space, letters and numbers. */
Test(tokenizer, pieces_end_where_the_packages_pre_tokenizer_ends_them) {
    need_tokenizers();
    char dir[48], path[128], out[128], err[256];
    temp_dir(dir, sizeof dir, "bpe");
    train_tokenizer(dir, "300", path, sizeof path);
    Tokenizer *t = load(path);
    const char *files[] = { SHAKESPEARE, SAMPLE };
    for (int f = 0; f < 2; f++) {
        snprintf(out, sizeof out, "%s/ends.u32", dir);
        python("pieces %s %s", files[f], out);
        size_t bytes, n;
        uint32_t *want = (uint32_t *)read_all(out, &bytes);
        char *text = (char *)read_all(files[f], &n);
        PieceEnds got = { .text = text };
        cr_assert_eq(tokenizer_pieces(t, text, n, note_end, &got, err, sizeof err), 0, "%s", err);
        size_t first = 0;
        while (first < got.n && first < bytes / 4 && got.ends[first] == want[first]) first++;
        cr_assert(first == got.n && got.n == bytes / 4, "%s: %zu pieces against the package's %zu; piece %zu ends "
                  "at byte %zu, the package's at %u", files[f], got.n, bytes / 4, first,
                  first < got.n ? got.ends[first] : 0, first < bytes / 4 ? want[first] : 0u);
        free(got.ends);
        free(want);
        free(text);
    }
    tokenizer_free(t);
    remove_dir(dir);
}

/* A few merges: the BPE's order matters where merges compete for a symbol. */
Test(tokenizer, ids_equal_the_package_with_few_merges_and_with_many) {
    need_tokenizers();
    char dir[48], path[128];
    temp_dir(dir, sizeof dir, "bpe");
    static const char *sizes[] = { "300", "8000" };
    for (int i = 0; i < 2; i++) {
        train_tokenizer(dir, sizes[i], path, sizeof path);
        Tokenizer *t = load(path);
        same_ids(t, path, SAMPLE, dir);
        same_ids(t, path, SHAKESPEARE, dir);
        tokenizer_free(t);
    }
    remove_dir(dir);
}

Test(tokenizer, decoding_gives_back_every_byte) {
    need_tokenizers();
    char dir[48], path[128];
    temp_dir(dir, sizeof dir, "bpe");
    train_tokenizer(dir, "1000", path, sizeof path);
    Tokenizer *t = load(path);
    const char *files[] = { SHAKESPEARE, SAMPLE };
    for (int f = 0; f < 2; f++) {
        size_t n;
        unsigned char *text = read_all(files[f], &n);
        TokenIds ids = encode_file(t, files[f]);
        cr_assert_lt(ids.n, n, "%s: no merge shortened it", files[f]);
        size_t at = 0;
        for (size_t i = 0; i < ids.n; i++) {
            size_t len;
            const unsigned char *bytes = tokenizer_bytes(t, ids.ids[i], &len);
            cr_assert(len > 0 && at + len <= n && memcmp(bytes, text + at, len) == 0,
                      "%s: token %zu (id %d) does not decode to the bytes at %zu", files[f], i, ids.ids[i], at);
            at += len;
        }
        cr_assert_eq(at, n, "%s: the ids decode to %zu of its %zu bytes", files[f], at, n);
        token_ids_free(&ids);
        free(text);
    }
    size_t len;
    tokenizer_bytes(t, 1000, &len);
    cr_assert_eq(len, 0, "an id past the vocabulary decodes to nothing");
    tokenizer_free(t);
    remove_dir(dir);
}

/* A tokenizer.json built from one that works, with one change. */
static void write_variant(const char *from, const char *to, const char *python_edit) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s -c 'import json,sys\nd=json.load(open(\"%s\"))\n%s\njson.dump(d,open(\"%s\",\"w\"))'",
             test_python(), from, python_edit, to);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

Test(tokenizer, a_file_it_cannot_read_as_asked_is_refused_in_one_line) {
    need_tokenizers();
    char dir[48], path[128], bad[128], err[512];
    temp_dir(dir, sizeof dir, "bpe");
    train_tokenizer(dir, "400", path, sizeof path);
    static const struct { const char *edit, *needle; } cases[] = {
        { "d[\"model\"][\"type\"]=\"WordPiece\"", "not BPE" },
        { "d[\"normalizer\"]={\"type\":\"NFC\"}", "normalizer" },
        { "d[\"model\"][\"dropout\"]=0.1", "dropout" },
        { "d[\"model\"][\"byte_fallback\"]=True", "byte_fallback" },
        { "d[\"pre_tokenizer\"]={\"type\":\"Whitespace\"}", "pre-tokenizer" },
        { "d[\"post_processor\"]={\"type\":\"TemplateProcessing\"}", "post-processor" },
        { "d[\"model\"][\"merges\"].append([\"zzq\",\"qzz\"])", "not in the vocabulary" },
        { "d[\"model\"][\"merges\"].append(d[\"model\"][\"merges\"][0])", "listed twice" },
        { "d[\"model\"][\"merges\"][3]=\"a b c\"", "merge 3 is not two tokens" },
        { "d[\"model\"][\"vocab\"][\"zzq\"]=-4", "not a whole number" },
        { "d[\"model\"][\"vocab\"][\"zzq\"]=5", "id 5 is both" },
        { "d[\"added_tokens\"][0][\"lstrip\"]=True", "lstrip" },
        { "del d[\"model\"][\"vocab\"]", "lacks model.vocab" },
    };
    snprintf(bad, sizeof bad, "%s/bad.json", dir);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_variant(path, bad, cases[i].edit);
        err[0] = 0;
        cr_assert_null(tokenizer_load(bad, err, sizeof err), "%s: accepted", cases[i].edit);
        cr_assert(strstr(err, cases[i].needle) && !strchr(err, '\n'), "%s: '%s'", cases[i].edit, err);
    }
    FILE *f = fopen(bad, "w");
    fputs("{\"model\": ", f);
    fclose(f);
    cr_assert_null(tokenizer_load(bad, err, sizeof err));
    cr_assert(strstr(err, "bad.json") && strstr(err, "line"), "%s", err);

    Tokenizer *t = load(path);
    TokenIds ids = { 0 };
    static const char not_utf8[] = "fine text, then \xff\xfe bytes";
    cr_assert_eq(tokenizer_encode(t, not_utf8, sizeof not_utf8 - 1, &ids, err, sizeof err), -1);
    cr_assert(strstr(err, "not UTF-8 at byte 16"), "%s", err);
    token_ids_free(&ids);
    tokenizer_free(t);
    remove_dir(dir);
}
