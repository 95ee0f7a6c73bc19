/* safetensors.h: reading and writing tensors in the safetensors format.
 *
 * A file is an 8-byte little-endian header length, a JSON header naming each
 * tensor's dtype, shape and byte range, then the raw data. The GPT's weights are
 * written with nanoGPT's names, so PyTorch loads them into its model directly.
 */
#ifndef ZF_SAFETENSORS_H
#define ZF_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../runtime/arena.h"

typedef struct {
    const char *name;
    const char *dtype;     /* "F32" or "I32" */
    int ndim;              /* 0, 1 or 2 */
    int64_t shape[2];
    const void *data;
} StTensor;

/* Write n tensors (and an optional JSON object as __metadata__) to a temporary
 * file beside path (path.tmp.PID), flush it, then rename it over path: a crash
 * never leaves a broken file. Returns 0, or -1 with a one-line message in err. */
int safetensors_write(const char *path, const StTensor *tensors, int n,
                      const char *metadata_json, char *err, size_t errlen);
/* The same write, streamed: begin writes the header of the n tensors (their
 * data unread), append then takes their data in the list's order, piece by
 * piece, and finish flushes the temporary file and renames it over path: -1
 * with a one-line message, and the temporary file gone, if anything failed or
 * the data is not what the header promised. */
typedef struct {
    FILE *file;
    char path[4096], tmp[4096 + 32];
    size_t promised, written;  /* data bytes */
    int ok, errno_seen;
} StWriter;
int safetensors_begin(StWriter *w, const char *path, const StTensor *tensors, int n, const char *metadata_json,
                      char *err, size_t errlen);
void safetensors_append(StWriter *w, const void *data, size_t bytes);
int safetensors_finish(StWriter *w, char *err, size_t errlen);

/* Remove the temporary files that saves of dir/name cut short left behind
 * (name.tmp.PID, their writer gone); the number removed. */
int safetensors_remove_stale_temps(const char *dir, const char *name);

/* A file read whole into memory, its header parsed and checked: the tensors'
 * byte ranges cover the data exactly (no overlap, hole or trailing byte). */
typedef struct {
    unsigned char *bytes;
    size_t size;
    size_t data_start;
    void *header;          /* the JSON header (a jansson json_t object) */
    FILE *file;            /* opened header-only: the file, whose data is read on demand */
} StFile;

int safetensors_open(StFile *f, const char *path, char *err, size_t errlen);
/* The header alone (names, shapes, metadata), the file left open: its
 * tensors are read one at a time (safetensors_read), never the whole. */
int safetensors_open_header(StFile *f, const char *path, char *err, size_t errlen);
/* The same over bytes already in memory (malloc'd; the StFile owns them from
 * here, even on failure); path only names them in messages. */
int safetensors_parse(StFile *f, unsigned char *bytes, size_t size, const char *path, char *err, size_t errlen);
/* A string of __metadata__, or NULL. */
const char *safetensors_metadata(const StFile *f, const char *key);
void safetensors_close(StFile *f);
/* The data of tensor `name` if its dtype and shape are as given (ndim 0..2)
 * and, for F32, every value finite; NULL with a one-line message in err
 * otherwise. */
const void *safetensors_tensor(const StFile *f, const char *name, const char *dtype, int ndim,
                               const int64_t *shape, char *err, size_t errlen);
int safetensors_count(const StFile *f);
/* Tensor `name`'s data into out, checked as safetensors_tensor checks it,
 * from memory or from the file (header-only). 0, or -1 with a one-line message. */
int safetensors_read(const StFile *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
                     void *out, char *err, size_t errlen);
/* Whether tensor `name` is there with that dtype and shape (its data unread):
 * 0, or -1 with a one-line message. */
int safetensors_check(const StFile *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
                      char *err, size_t errlen);
/* Whether two tensors hold the same bytes, compared a megabyte at a time: 1,
 * 0, or -1 with a one-line message. */
int safetensors_same_data(const StFile *f, const char *a, const char *b, char *err, size_t errlen);  /* tensors, __metadata__ excluded */
/* A message that quotes a file's own strings (names, dtypes, metadata may hold
 * any byte) kept on one line: every control character becomes '?'. Every
 * message of this reader has been through it. */
void safetensors_one_line(char *message);
/* The index of the first NaN or infinity among n floats at data (any
 * alignment), or n. safetensors_tensor refuses an F32 tensor that holds one. */
size_t safetensors_first_nonfinite(const void *data, size_t n);

/* The GPT's parameters by their arena names, from and to a host arena. */
int weights_save(const char *path, const ArenaLayout *layout, const float *params,
                 char *err, size_t errlen);
/* Exactly the layout's tensors, F32, right shapes, no others. */
int weights_load(const char *path, const ArenaLayout *layout, float *params,
                 char *err, size_t errlen);

#endif
