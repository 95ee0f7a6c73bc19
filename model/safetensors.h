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
} StFile;

int safetensors_open(StFile *f, const char *path, char *err, size_t errlen);
/* The header alone (names, shapes, metadata), without reading the data: the
 * tensors' data cannot be had from it. */
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
int safetensors_count(const StFile *f);  /* tensors, __metadata__ excluded */
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
