/* test_tokenizer.c: the byte-level BPE (model/tokenizer.h) against its
 * reference, the `tokenizers` package from PyPI (make deps puts it in
 * build/pylib; tests/tokenizers_reference.py is its side).
 *
 * A tokenizer is trained at test time (no download) on tinyshakespeare and a
 * sample of scripts, emoji, combining marks and odd white space
 * (tests/tokenizer_sample.txt); both encode the same texts and the ids must
 * be the same, one for one. bin/prepare's files must be, byte for byte, what
 * nanoGPT's prepare.py split gives through the package. Then bin/train and
 * bin/sample on such a folder, and on folders they must refuse.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/tokenizer.h"
#include "fixtures.h"
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

/* At 300 ids (few merges, competing for the same symbols), 2000 and 8000. */
Test(tokenizer, ids_equal_the_tokenizers_package_over_shakespeare_and_many_scripts) {
    need_tokenizers();
    char dir[48], path[128], legacy[128];
    temp_dir(dir, sizeof dir, "bpe");
    static const char *sizes[] = { "300", "2000", "8000" };
    for (int i = 0; i < 3; i++) {
        train_tokenizer(dir, sizes[i], path, sizeof path);
        Tokenizer *t = load(path);
        cr_assert_eq(tokenizer_vocab(t), atoi(sizes[i]));
        same_ids(t, path, SHAKESPEARE, dir);
        same_ids(t, path, SAMPLE, dir);
        tokenizer_free(t);
    }
    /* merges written as "a b", as GPT-2's own file and older tokenizers write them */
    snprintf(legacy, sizeof legacy, "%s/legacy.json", dir);
    python("legacy %s %s", path, legacy);
    Tokenizer *t = load(legacy);
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

static int count_newlines(const char *text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

/* Whether two files hold the same bytes. */
static int same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
    int same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* bin/prepare against nanoGPT's prepare.py split done through the package: a
 * text of one byte a character, and one of many (where characters and bytes
 * part: the split counts characters). */
Test(tokenizer, bin_prepare_writes_what_the_prepare_py_split_writes) {
    need_tokenizers();
    char dir[48], path[128], ours[160], theirs[160], args[640], a[200], b[200], err[1024];
    temp_dir(dir, sizeof dir, "prep");
    train_tokenizer(dir, "700", path, sizeof path);
    const char *texts[] = { SHAKESPEARE, SAMPLE };
    for (int i = 0; i < 2; i++) {
        snprintf(ours, sizeof ours, "%s/ours%d", dir, i);
        snprintf(theirs, sizeof theirs, "%s/theirs%d", dir, i);
        cr_assert_eq(mkdir(theirs, 0777), 0);
        python("prepare %s %s %s", path, texts[i], theirs);
        snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s", path, texts[i], ours);
        int rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
        cr_assert_eq(rc, 0, "%s: exit %d: %s", args, rc, err);
        static const char *splits[] = { "train.bin", "val.bin" };
        for (int s = 0; s < 2; s++) {
            snprintf(a, sizeof a, "%s/%s", ours, splits[s]);
            snprintf(b, sizeof b, "%s/%s", theirs, splits[s]);
            cr_expect(same_file(a, b), "%s: %s differs from the prepare.py split's", texts[i], splits[s]);
        }
        snprintf(a, sizeof a, "%s/meta.json", ours);
        size_t n;
        char *meta = (char *)read_all(a, &n);
        cr_expect_str_eq(meta, "{\"vocab_size\": 700, \"dtype\": \"uint16\"}\n");
        free(meta);
    }
    /* a second time: refused, the files kept; with --overwrite=1, written again */
    snprintf(a, sizeof a, "%s/ours0/train.bin", dir);
    snprintf(b, sizeof b, "%s/theirs0/train.bin", dir);
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/ours0", path, SAMPLE, dir);
    int rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 2 && strstr(err, "is there already (--overwrite=1 replaces it)") && same_file(a, b),
              "exit %d: %s", rc, err);
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/ours0 --overwrite=1", path, SAMPLE, dir);
    cr_expect_eq(run_tool(prepare_binary(), args, "/dev/null", err, sizeof err), 0, "%s", err);
    snprintf(b, sizeof b, "%s/theirs1/train.bin", dir);
    cr_expect(same_file(a, b), "--overwrite=1 did not write the new text's ids");
    /* a meta.json that is a folder: refused before anything is written (the
     * splits would otherwise be replaced and the folder left half new) */
    char meta_dir[200];
    snprintf(meta_dir, sizeof meta_dir, "%s/ours0/meta.json", dir);
    cr_assert(unlink(meta_dir) == 0 && mkdir(meta_dir, 0777) == 0);
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/ours0 --overwrite=1", path, SHAKESPEARE, dir);
    rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "is a folder, where a file is to be written") && count_newlines(err) == 1,
              "exit %d: %s", rc, err);
    cr_expect(same_file(a, b), "a refused bin/prepare replaced train.bin");
    /* text that is not UTF-8: one line naming the byte */
    snprintf(a, sizeof a, "%s/latin1.txt", dir);
    FILE *f = fopen(a, "wb");
    fputs("caf\xe9 au lait", f);
    fclose(f);
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/latin1", path, a, dir);
    rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "not UTF-8 at byte 3") && count_newlines(err) == 1, "exit %d: %s", rc, err);
    /* the byte's offset is the file's, past "\r\n" lines and in the val split */
    f = fopen(a, "wb");
    for (int i = 0; i < 300; i++) fputs("ab\r\n", f);
    fputs("caf\xe9", f);
    fclose(f);
    rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "not UTF-8 at byte 1203") && count_newlines(err) == 1, "exit %d: %s", rc, err);
    remove_dir(dir);
}

/* bin/prepare with args: exit `want`, one line holding needle. */
static void expect_prepare(const char *args, int want, const char *needle) {
    char err[2048];
    int rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == want && strstr(err, needle) && count_newlines(err) == 1, "%s: exit %d (want %d '%s'): %s", args,
              rc, want, needle, err);
}

/* An output of bin/prepare (train.bin, val.bin, meta.json in --out) that is
 * the same file as its --data or --tokenizer, by the same path, a symbolic
 * link, a hard link or --out reached through a linked folder: refused, exit 2,
 * --overwrite=1 or not, the input byte for byte as it was. */
Test(tokenizer, prepare_refuses_an_output_that_is_one_of_its_inputs) {
    need_tokenizers();
    char dir[48], tok[128], args[1024], cmd[512];
    temp_dir(dir, sizeof dir, "alias");
    train_tokenizer(dir, "300", tok, sizeof tok);
    size_t n_text, n_tok;
    unsigned char *text = read_all(SAMPLE, &n_text), *tokenizer = read_all(tok, &n_tok);
    /* the real file, the link made to it ("" for none, '@' a symbolic one), and the flags (%s: the folder) */
    const struct { const char *real, *link, *flags; } cases[] = {
        { "out/train.bin", "", "--data=%s/out/train.bin --out=%s/out" },
        { "out/val.bin", "@link.txt", "--data=%s/link.txt --out=%s/out" },
        { "text.txt", "out/train.bin", "--data=%s/text.txt --out=%s/out" },
        { "out/train.bin", "", "--data=%s/out/train.bin --out=%s/via" },
        { "out/meta.json", "", "--tokenizer=%s/via/meta.json --data=tests/tokenizer_sample.txt --out=%s/out" },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int overwrite = 0; overwrite < 2; overwrite++) {
            snprintf(cmd, sizeof cmd, "cd %s && rm -rf out via link.txt text.txt && mkdir out && ln -s out via", dir);
            cr_assert_eq(system(cmd), 0);
            int is_tok = strstr(cases[c].flags, "--tokenizer") != NULL;
            char real[160], flags[512];
            write_linked(dir, cases[c].real, cases[c].link, is_tok ? tokenizer : text, is_tok ? n_tok : n_text, real,
                         sizeof real);
            snprintf(flags, sizeof flags, cases[c].flags, dir, dir);
            if (is_tok) snprintf(args, sizeof args, "%s --overwrite=%d", flags, overwrite);
            else snprintf(args, sizeof args, "--tokenizer=%s %s --overwrite=%d", tok, flags, overwrite);
            expect_prepare(args, 2, "is the same file as --");
            expect_unchanged(real, is_tok ? tokenizer : text, is_tok ? n_tok : n_text, args);
        }
    free(text);
    free(tokenizer);
    remove_dir(dir);
}

/* A text too short for bin/train (a split of fewer than 2 ids: none would
 * hold a block of 1 and its target) is refused before anything is written. */
Test(tokenizer, prepare_refuses_a_text_too_short_for_train) {
    need_tokenizers();
    char dir[48], tok[128], path[160], args[1024], out[160];
    temp_dir(dir, sizeof dir, "short");
    train_tokenizer(dir, "300", tok, sizeof tok);
    snprintf(path, sizeof path, "%s/short.txt", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    const char *texts[] = { "", "a", "abc" };
    for (int i = 0; i < 3; i++) {
        write_all(path, texts[i], strlen(texts[i]));
        snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s", tok, path, out);
        expect_prepare(args, 1, "bin/train needs at least 2 ids in each split");
        cr_expect_neq(access(out, F_OK), 0, "'%s' (%zu bytes) made %s", texts[i], strlen(texts[i]), out);
    }
    remove_dir(dir);
}

/* The ids of dir/name (uint16). */
static unsigned char *split_of(const char *dir, const char *name, size_t *n) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return read_all(path, n);
}

/* As prepare.py reads text (universal newlines): "\r\n" and a lone "\r" are
 * "\n", before the split; --newlines=raw keeps the bytes. */
Test(tokenizer, prepare_reads_newlines_as_prepare_py_does) {
    need_tokenizers();
    char dir[48], tok[128], crlf[160], lf[160], args[1024], err[2048];
    temp_dir(dir, sizeof dir, "newlines");
    train_tokenizer(dir, "300", tok, sizeof tok);
    snprintf(crlf, sizeof crlf, "%s/crlf.txt", dir);
    snprintf(lf, sizeof lf, "%s/lf.txt", dir);
    FILE *a = fopen(crlf, "wb"), *b = fopen(lf, "wb");
    for (int i = 0; i < 40; i++) {
        fprintf(a, "line %d of the text,\r\nand its half %d\r%s", i, i, i % 7 ? "" : "\r\n\r\r\n");
        fprintf(b, "line %d of the text,\nand its half %d\n%s", i, i, i % 7 ? "" : "\n\n\n");
    }
    fclose(a);
    fclose(b);
    const char *runs[][2] = { { crlf, "" }, { lf, "" }, { crlf, " --newlines=raw" }, { lf, " --newlines=raw" } };
    for (int r = 0; r < 4; r++) {
        snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/out%d%s", tok, runs[r][0], dir, r, runs[r][1]);
        int rc = run_tool(prepare_binary(), args, "/dev/null", err, sizeof err);
        cr_assert_eq(rc, 0, "%s: exit %d: %s", args, rc, err);
    }
    const char *splits[] = { "train.bin", "val.bin" };
    for (int s = 0; s < 2; s++) {
        char d0[128], d1[128], d2[128], d3[128];
        snprintf(d0, sizeof d0, "%s/out0", dir);
        snprintf(d1, sizeof d1, "%s/out1", dir);
        snprintf(d2, sizeof d2, "%s/out2", dir);
        snprintf(d3, sizeof d3, "%s/out3", dir);
        size_t n0, n1, n2, n3;
        unsigned char *ids0 = split_of(d0, splits[s], &n0), *ids1 = split_of(d1, splits[s], &n1),
                      *ids2 = split_of(d2, splits[s], &n2), *ids3 = split_of(d3, splits[s], &n3);
        cr_expect(n0 == n1 && memcmp(ids0, ids1, n0) == 0, "%s: the \\r\\n text's ids are not the \\n text's", splits[s]);
        cr_expect(n3 == n1 && memcmp(ids3, ids1, n3) == 0, "%s: --newlines=raw changed a text without \\r", splits[s]);
        cr_expect(n2 != n0 || memcmp(ids2, ids0, n0) != 0, "%s: --newlines=raw dropped the \\r", splits[s]);
        free(ids0);
        free(ids1);
        free(ids2);
        free(ids3);
    }
    expect_prepare("--newlines=dos --data=x --tokenizer=y --out=z", 2, "--newlines=dos");
    remove_dir(dir);
}

/* The exit status of docs/errors.md: 1 for files the run cannot use (an
 * --out it cannot make or write in, a missing tokenizer or text), 2 for a
 * command line no run can use. */
Test(tokenizer, prepare_exit_status_follows_the_one_rule) {
    need_tokenizers();
    char dir[48], tok[128], args[1024], plain[160];
    temp_dir(dir, sizeof dir, "status");
    train_tokenizer(dir, "300", tok, sizeof tok);
    snprintf(plain, sizeof plain, "%s/plain", dir);
    write_all(plain, "x", 1);
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=/proc/zf_out", tok, SAMPLE);
    expect_prepare(args, 1, "cannot make --out");
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s", tok, SAMPLE, plain);
    expect_prepare(args, 1, "is a file, not a folder");
    snprintf(args, sizeof args, "--tokenizer=%s/none.json --data=%s --out=%s/out", dir, SAMPLE, dir);
    expect_prepare(args, 1, "none.json");
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s/none.txt --out=%s/out", tok, dir, dir);
    expect_prepare(args, 1, "none.txt");
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s", tok, SAMPLE);
    expect_prepare(args, 2, "are needed");
    remove_dir(dir);
}

/* A --tokenizer, or a token folder's meta.json, that is a folder says so. */
Test(tokenizer, a_folder_given_as_a_tokenizer_or_meta_json_says_so) {
    char dir[48], args[512], err[2048];
    temp_dir(dir, sizeof dir, "folders");
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/out", dir, SAMPLE, dir);
    expect_prepare(args, 1, "is a folder, not a file");
    snprintf(args, sizeof args, "mkdir %s/meta.json", dir);
    cr_assert_eq(system(args), 0);
    snprintf(args, sizeof args, "--data=%s --iters=1", dir);
    int rc = run_tool(train_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "meta.json' is a folder, not a file") && count_newlines(err) == 1,
              "exit %d: %s", rc, err);
    remove_dir(dir);
}

/* ---- bin/train and bin/sample on a folder of token ids ---- */

TestSuite(token_data, .timeout = 300);

static const char SMALL[] = "--layers=2 --embd=32 --heads=2 --block=32 --batch=4 --eval-iters=2 --lr=3e-3 --warmup=0";

/* The first number after `key` in text, or NAN. */
static float number_after(const char *text, const char *key) {
    const char *at = strstr(text, key);
    return at ? strtof(at + strlen(key), NULL) : NAN;
}

Test(token_data, a_prepared_folder_trains_with_falling_loss_and_a_decoded_sample) {
    need_tokenizers();
    char dir[48], tok[128], args[1024], out[160], err[4096], a[200], b[200];
    temp_dir(dir, sizeof dir, "tokens");
    train_tokenizer(dir, "500", tok, sizeof tok);
    snprintf(args, sizeof args, "--tokenizer=%s --data=%s --out=%s/data", tok, SHAKESPEARE, dir);
    cr_assert_eq(run_tool(prepare_binary(), args, "/dev/null", err, sizeof err), 0, "%s", err);
    snprintf(out, sizeof out, "%s/stdout", dir);
    /* ZeRO-3 on 2 ranks, then DDP on 2: the same checkpoint, byte for byte */
    for (int zero = 3; zero >= 0; zero -= 3) {
        snprintf(args, sizeof args, "%s --data=%s/data --tokenizer=%s --iters=30 --eval-every=29 --sample-tokens=40 "
                 "--zero=%d --gpus=2 --out=%s/zero%d", SMALL, dir, tok, zero, dir, zero);
        int rc = run_tool(train_binary(), args, out, err, sizeof err);
        cr_assert_eq(rc, 0, "--zero=%d: exit %d: %s", zero, rc, err);
    }
    snprintf(a, sizeof a, "%s/zero3/ckpt.safetensors", dir);
    snprintf(b, sizeof b, "%s/zero0/ckpt.safetensors", dir);
    cr_expect(same_file(a, b), "ZeRO-3 and DDP on token ids saved different checkpoints");
    size_t n;
    char *text = (char *)read_all(out, &n);
    cr_expect(strstr(text, "token ids (uint16, memory-mapped), vocabulary 500"), "%s", text);
    float first = number_after(text, "eval iter 0: train loss "), last = number_after(text, "eval iter 29: train loss ");
    cr_expect(first > 5.5f && last < first - 0.5f, "the loss went from %.3f to %.3f in 29 steps", first, last);
    const char *sample = strstr(text, "sample: 40 tokens");
    cr_assert_not_null(sample, "%s", text);
    sample = strchr(sample, '\n') + 1;
    cr_expect_geq(strlen(sample), 40, "40 tokens decode to at least 40 bytes: '%s'", sample);
    free(text);

    snprintf(args, sizeof args, "--ckpt=%s --tokenizer=%s --prompt=ROMEO: --tokens=20", a, tok);
    int rc = run_tool(sample_binary(), args, out, err, sizeof err);
    text = (char *)read_all(out, &n);
    cr_expect(rc == 0 && strncmp(text, "ROMEO:", 6) == 0 && n > 26, "exit %d: '%s' %s", rc, text, err);
    free(text);
    snprintf(args, sizeof args, "--ckpt=%s --prompt=ROMEO:", a);
    rc = run_tool(sample_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 2 && strstr(err, "was trained on token ids: pass the --tokenizer") && count_newlines(err) == 1,
              "exit %d: %s", rc, err);
    /* a tokenizer it cannot read is a file the run cannot use: exit 1 */
    snprintf(args, sizeof args, "--ckpt=%s --tokenizer=%s --prompt=ROMEO:", a, dir);
    rc = run_tool(sample_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 1 && strstr(err, "is a folder, not a file") && count_newlines(err) == 1, "exit %d: %s", rc, err);
    /* bin/train's --log over its --tokenizer: refused, the tokenizer as it was */
    size_t n_tok;
    unsigned char *good_tok = read_all(tok, &n_tok);
    snprintf(args, sizeof args, "%s --data=%s/data --tokenizer=%s --iters=1 --log=%s", SMALL, dir, tok, tok);
    rc = run_tool(train_binary(), args, "/dev/null", err, sizeof err);
    cr_expect(rc == 2 && strstr(err, "is the same file as --tokenizer") && count_newlines(err) == 1, "exit %d: %s", rc,
              err);
    expect_unchanged(tok, good_tok, n_tok, "--log over --tokenizer");
    free(good_tok);
    remove_dir(dir);
}

/* DIR/name: count ids of `value`, `width` bytes each (then `extra` stray bytes). */
static void write_ids(const char *dir, const char *name, int width, size_t count, uint32_t value, int extra) {
    char path[200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (size_t i = 0; i < count; i++) cr_assert_eq(fwrite(&value, (size_t)width, 1, f), 1);  /* little-endian */
    for (int i = 0; i < extra; i++) fputc(0, f);
    cr_assert_eq(fclose(f), 0);
}

static void write_meta(const char *dir, const char *json) {
    char path[200];
    snprintf(path, sizeof path, "%s/meta.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(json, f);
    cr_assert_eq(fclose(f), 0);
}

/* bin/train on dir with more flags: its exit status, stderr in err. */
static int train_on(const char *dir, const char *more, char *err, size_t errlen) {
    char args[1024];
    snprintf(args, sizeof args, "--layers=1 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --iters=1 "
             "--sample-chars=0 --data=%s %s", dir, more);
    return run_tool(train_binary(), args, "/dev/null", err, errlen);
}

static void expect_refused(int rc, int want, const char *err, const char *needle, const char *what) {
    cr_expect(rc == want && strstr(err, needle) && count_newlines(err) == 1, "%s: exit %d (not %d), stderr: %s", what,
              rc, want, err);
}

Test(token_data, a_folder_it_cannot_use_is_refused_in_one_line) {
    char dir[48], err[4096];
    temp_dir(dir, sizeof dir, "badtok");
    write_ids(dir, "train.bin", 2, 100, 7, 1);
    write_ids(dir, "val.bin", 2, 100, 7, 0);
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "train.bin' has 201 bytes, not a whole number of uint16",
                   "an odd byte count");
    write_ids(dir, "train.bin", 2, 100, 7, 0);
    write_ids(dir, "val.bin", 2, 10, 7, 0);
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "val.bin holds 10 tokens; each split needs more than "
                   "--block=16 (at least 17)", "a split shorter than the block");
    char path[200];
    snprintf(path, sizeof path, "%s/val.bin", dir);
    unlink(path);
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "val.bin': No such file or directory (a token folder "
                   "holds train.bin and val.bin", "no val.bin");
    write_ids(dir, "val.bin", 2, 100, 7, 0);
    /* no meta.json: uint16 ids of GPT-2's vocabulary, as nanoGPT's own folders */
    cr_expect_eq(train_on(dir, "", err, sizeof err), 0, "%s", err);
    write_meta(dir, "{\"vocab_size\": 100, \"dtype\": \"int8\"}");
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "meta.json': its dtype is neither uint16 nor uint32",
                   "a dtype of another kind");
    write_meta(dir, "{\"vocab_size\": 70000, \"dtype\": \"uint16\"}");
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "its vocab_size does not fit its dtype uint16",
                   "a vocabulary too big for uint16");
    write_meta(dir, "{\"vocab_size\": 100");
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "meta.json': ", "a meta.json cut short");
    /* ids at or above the vocabulary: found in the first batch */
    write_meta(dir, "{\"vocab_size\": 5, \"dtype\": \"uint16\"}");
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "split's id 7 at position", "ids past the vocabulary");
    cr_expect(strstr(err, "is not below the vocabulary's 5"), "%s", err);
    write_meta(dir, "{\"vocab_size\": 7}");  /* the ids are 7: one past the last */
    expect_refused(train_on(dir, "", err, sizeof err), 1, err, "id 7 at position", "ids equal to the vocabulary");
    /* uint32 ids, as meta.json says */
    write_meta(dir, "{\"vocab_size\": 100000, \"dtype\": \"uint32\"}");
    write_ids(dir, "train.bin", 4, 100, 99999, 0);
    write_ids(dir, "val.bin", 4, 100, 99999, 0);
    cr_expect_eq(train_on(dir, "", err, sizeof err), 0, "%s", err);
    expect_refused(train_on(SHAKESPEARE, "--tokenizer=t.json", err, sizeof err), 2, err,
                   "--tokenizer decodes a folder of token ids, and --data=data/tinyshakespeare.txt is a text file",
                   "a tokenizer for a text file");
    remove_dir(dir);
}

Test(token_data, a_tokenizer_of_another_vocabulary_is_refused) {
    need_tokenizers();
    char dir[48], tok[128], more[256], err[4096];
    temp_dir(dir, sizeof dir, "tokvocab");
    train_tokenizer(dir, "300", tok, sizeof tok);
    write_ids(dir, "train.bin", 2, 100, 7, 0);
    write_ids(dir, "val.bin", 2, 100, 7, 0);
    write_meta(dir, "{\"vocab_size\": 299, \"dtype\": \"uint16\"}");
    snprintf(more, sizeof more, "--tokenizer=%s", tok);
    expect_refused(train_on(dir, more, err, sizeof err), 2, err, "has 300 ids, and the vocabulary of", "a vocabulary "
                   "one short of the tokenizer's");
    write_meta(dir, "{\"vocab_size\": 300, \"dtype\": \"uint16\"}");
    cr_expect_eq(train_on(dir, more, err, sizeof err), 0, "%s", err);
    remove_dir(dir);
}
