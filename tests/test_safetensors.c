/* test_safetensors.c: the safetensors reader (model/safetensors.h) against the
 * format and against its reference, the safetensors package from PyPI.
 *
 * A header is accepted exactly when the reference accepts it, case by case,
 * the package asked at test time (make deps puts it in build/pylib): UTF-8 JSON,
 * one object and nothing after it but white space, integers where the format
 * has whole numbers, __metadata__ an object of strings, the known dtypes, and
 * byte ranges that tile the data. Three cases differ on purpose, each held to
 * what we do (docs/checkpoints.md): a key written twice, which the reference
 * resolves by keeping the last one, and a name with an escaped NUL in it, we
 * refuse; an offset written -0, which the reference takes for a float, Jansson
 * (our JSON reader) reads as the integer 0, and so do we.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/safetensors.h"
#include "fixtures.h"
#include "reference.h"

TestSuite(safetensors);

/* header_len (8 bytes, little-endian), the header's `len` bytes, then n zero bytes. */
static void write_safetensors_bytes(const char *path, const char *header, size_t len, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int b = 0; b < 8; b++) fputc((int)((uint64_t)len >> (8 * b)) & 0xff, f);
    cr_assert_eq(fwrite(header, 1, len, f), len);
    for (size_t i = 0; i < n; i++) fputc(0, f);
    cr_assert_eq(fclose(f), 0);
}

static void write_safetensors(const char *path, const char *header, size_t n) {
    write_safetensors_bytes(path, header, strlen(header), n);
}

Test(safetensors, tensors_must_cover_the_data_exactly) {
    static const struct { const char *header; size_t bytes; const char *needle; } cases[] = {
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, NULL },
        { "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},\"__metadata__\":{},"
          "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,16]},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 16, NULL },  /* any order */
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "tensors 'a' and 'b' overlap" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12, "data bytes [4, 8) belong to no tensor" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "4 trailing bytes" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8, "outside the 8 data bytes" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4]}}", 4, "of whole numbers" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets pair [begin, end]" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "has shape [3] of F32 (96 bits)" },
        { "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[18446744073709551615,8]}}", 8, "not JSON" },
    };
    char path[] = "/tmp/zf_cover_XXXXXX", err[512];
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_safetensors(path, cases[i].header, cases[i].bytes);
        StFile f;
        int rc = safetensors_open(&f, path, err, sizeof err);
        if (!cases[i].needle) {
            cr_expect_eq(rc, 0, "case %zu: %s", i, err);
            if (rc == 0) safetensors_close(&f);
            continue;
        }
        cr_expect_eq(rc, -1, "case %zu loaded", i);
        cr_expect(strstr(err, cases[i].needle) != NULL, "case %zu: %s", i, err);
        /* the header alone says the same: bin/sample reads it first */
        cr_expect_eq(safetensors_open_header(&f, path, err, sizeof err), -1, "case %zu: header alone", i);
    }
    unlink(path);
}

/* Headers over 8 data bytes, each with the verdict we must give: the
 * reference's, or ours whatever the reference says. */
typedef enum { AS_THE_REFERENCE, REFUSED_ON_PURPOSE, ACCEPTED_ON_PURPOSE } Verdict;
typedef struct { const char *what, *header; size_t len; Verdict verdict; } HeaderCase;

#define TENSOR_A "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
static const HeaderCase HEADERS[] = {
    { "a plain header", "{" TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "white space before", "  {" TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "white space after (the writers' padding)", "{" TENSOR_A "}  \t\r\n ", 0, AS_THE_REFERENCE },
    { "a UTF-8 byte order mark", "\xef\xbb\xbf{" TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "text after the object", "{" TENSOR_A "}x", 0, AS_THE_REFERENCE },
    { "NULs after the object", "{" TENSOR_A "}\0\0\0", sizeof("{" TENSOR_A "}") + 2, AS_THE_REFERENCE },
    { "a second object after the first", "{" TENSOR_A "}{}", 0, AS_THE_REFERENCE },
    { "float offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0.0,8]}}", 0, AS_THE_REFERENCE },
    { "an exponent in an offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8e0]}}", 0,
      AS_THE_REFERENCE },
    { "a float shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 0, AS_THE_REFERENCE },
    { "a negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,8]}}", 0, AS_THE_REFERENCE },
    { "a plus sign", "{\"a\":{\"dtype\":\"F32\",\"shape\":[+2],\"data_offsets\":[0,8]}}", 0, AS_THE_REFERENCE },
    { "a leading zero", "{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}}", 0, AS_THE_REFERENCE },
    { "three offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 0, AS_THE_REFERENCE },
    { "a number as __metadata__ value", "{\"__metadata__\":{\"k\":1}," TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "an object as __metadata__ value", "{\"__metadata__\":{\"k\":{\"x\":\"y\"}}," TENSOR_A "}", 0,
      AS_THE_REFERENCE },
    { "a list as __metadata__", "{\"__metadata__\":[]," TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "null as __metadata__", "{\"__metadata__\":null," TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "strings as __metadata__", "{\"__metadata__\":{\"k\":\"1\",\"\xc3\xa9\":\"\\u00e9\"}," TENSOR_A "}", 0,
      AS_THE_REFERENCE },
    { "an unknown field in an entry", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":[1]}}", 0,
      AS_THE_REFERENCE },
    { "no shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 0, AS_THE_REFERENCE },
    { "an unknown dtype", "{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, AS_THE_REFERENCE },
    { "a dtype in lower case", "{\"a\":{\"dtype\":\"f32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "another dtype of the format", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "sub-byte elements that fill whole bytes", "{\"a\":{\"dtype\":\"F4\",\"shape\":[16],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "sub-byte elements that do not", "{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "a shape that is not the bytes", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "a 0-d tensor", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, AS_THE_REFERENCE },
    { "an entry that is no object", "{\"a\":1}", 0, AS_THE_REFERENCE },
    { "a list for a header", "[]", 0, AS_THE_REFERENCE },
    { "a trailing comma", "{" TENSOR_A ",}", 0, AS_THE_REFERENCE },
    { "a comment", "{/* x */" TENSOR_A "}", 0, AS_THE_REFERENCE },
    { "a byte that is no UTF-8", "{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "a lone surrogate", "{\"a\\ud800\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0,
      AS_THE_REFERENCE },
    { "a UTF-8 name", "{\"\xc3\xa9\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, AS_THE_REFERENCE },
    { "an offset past 2^64", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,18446744073709551624]}}", 0,
      AS_THE_REFERENCE },
    { "__metadata__ twice", "{\"__metadata__\":{},\"__metadata__\":{}," TENSOR_A "}", 0, REFUSED_ON_PURPOSE },
    { "a tensor twice, ranges that differ", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, REFUSED_ON_PURPOSE },
    { "a tensor twice, the same", "{" TENSOR_A "," TENSOR_A "}", 0, REFUSED_ON_PURPOSE },
    { "a metadata key twice", "{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," TENSOR_A "}", 0, REFUSED_ON_PURPOSE },
    { "a field of an entry twice", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
      0, REFUSED_ON_PURPOSE },
    { "an escaped NUL in a name", "{\"a\\u0000\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0,
      REFUSED_ON_PURPOSE },
    { "an offset written -0", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-0,8]}}", 0,
      ACCEPTED_ON_PURPOSE },
};
enum { NCASES = sizeof HEADERS / sizeof HEADERS[0] };

/* The reference's verdict on each file: 1 accepted, 0 refused, read from one
 * Python run over them all. */
static void reference_verdicts(char paths[][80], int n, int *accepted) {
    char cmd[8192];
    int len = snprintf(cmd, sizeof cmd, "PYTHONPATH=build/pylib %s -c '\n"
                       "import sys\nfrom safetensors import deserialize\n"
                       "for p in sys.argv[1:]:\n"
                       "    try:\n        deserialize(open(p, \"rb\").read()); print(1)\n"
                       "    except Exception:\n        print(0)\n'", test_python());
    for (int i = 0; i < n; i++) len += snprintf(cmd + len, sizeof cmd - (size_t)len, " %s", paths[i]);
    cr_assert_lt(len, (int)sizeof cmd);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    for (int i = 0; i < n; i++) cr_assert_eq(fscanf(p, "%d", &accepted[i]), 1, "the reference said nothing of case %d", i);
    cr_assert_eq(pclose(p), 0, "%s", cmd);
}

Test(safetensors, a_header_is_read_as_the_reference_reads_it) {
    need_safetensors();
    char dir[48], paths[NCASES][80];
    temp_dir(dir, sizeof dir, "st");
    for (int i = 0; i < NCASES; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%d.safetensors", dir, i);
        const HeaderCase *c = &HEADERS[i];
        write_safetensors_bytes(paths[i], c->header, c->len ? c->len : strlen(c->header), 8);
    }
    int reference[NCASES];
    reference_verdicts(paths, NCASES, reference);
    for (int i = 0; i < NCASES; i++) {
        StFile f;
        char err[512] = "";
        int ours = safetensors_open(&f, paths[i], err, sizeof err) == 0;
        if (ours) safetensors_close(&f);
        else cr_expect(err[0] && !strchr(err, '\n'), "%s: not one line: '%s'", HEADERS[i].what, err);
        if (HEADERS[i].verdict != AS_THE_REFERENCE)
            cr_expect_eq(ours, HEADERS[i].verdict == ACCEPTED_ON_PURPOSE, "%s: we %s it (the reference %s it)",
                         HEADERS[i].what, ours ? "accept" : "refuse", reference[i] ? "accepts" : "refuses");
        else
            cr_expect_eq(ours, reference[i], "%s: we %s it, the reference %s it (%s)", HEADERS[i].what,
                         ours ? "accept" : "refuse", reference[i] ? "accepts" : "refuses", err);
    }
    remove_dir(dir);
}
