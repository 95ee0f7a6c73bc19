/* safetensors.c: the safetensors reader and writer of safetensors.h. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/host.h"

static size_t tensor_bytes(const StTensor *t) {
    size_t n = strcmp(t->dtype, "F32") == 0 || strcmp(t->dtype, "I32") == 0 ? 4 : 0;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

/* The temporary file of a save of path: path.tmp.PID, PID the writer's. */
static const char TEMP_INFIX[] = ".tmp.";

int safetensors_remove_stale_temps(const char *dir, const char *name) {
    DIR *folder = opendir(dir);
    if (!folder) return 0;
    size_t prefix = strlen(name);
    int removed = 0;
    for (struct dirent *e; (e = readdir(folder)) != NULL;) {
        const char *pid_text = e->d_name + prefix + strlen(TEMP_INFIX);
        if (strncmp(e->d_name, name, prefix) != 0 || strncmp(e->d_name + prefix, TEMP_INFIX, strlen(TEMP_INFIX)) ||
            *pid_text < '1' || *pid_text > '9')
            continue;
        char *end;
        long pid = strtol(pid_text, &end, 10);
        /* a save of a live process is its own; ours has none in flight yet */
        int writer_alive = pid != getpid() && (kill((pid_t)pid, 0) == 0 || errno == EPERM);
        char path[4096];
        if (*end || writer_alive || snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        removed += unlink(path) == 0;
    }
    closedir(folder);
    return removed;
}

/* The header of the tensors' list: their dtypes, shapes and data offsets in
 * the list's order, and the metadata; NULL with a message on bad metadata. */
static char *header_json(const StTensor *tensors, int n, const char *metadata_json, size_t *data_bytes, char *err,
                         size_t errlen) {
    json_t *header = json_object();
    if (metadata_json) {
        json_t *meta = json_loads(metadata_json, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(meta)) {
            snprintf(err, errlen, "bad metadata JSON");
            json_decref(meta);
            json_decref(header);
            return NULL;
        }
        json_object_set_new(header, "__metadata__", meta);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array(), *range = json_array();
        for (int d = 0; d < tensors[i].ndim; d++) json_array_append_new(shape, json_integer(tensors[i].shape[d]));
        json_array_append_new(range, json_integer((json_int_t)offset));
        offset += tensor_bytes(&tensors[i]);
        json_array_append_new(range, json_integer((json_int_t)offset));
        json_t *entry = json_pack("{s:s, s:o, s:o}", "dtype", tensors[i].dtype, "shape", shape, "data_offsets", range);
        json_object_set_new(header, tensors[i].name, entry);
    }
    char *json = json_dumps(header, JSON_COMPACT);
    json_decref(header);
    if (!json) snprintf(err, errlen, "out of host memory writing a header");
    *data_bytes = offset;
    return json;
}

int safetensors_begin(StWriter *w, const char *path, const StTensor *tensors, int n, const char *metadata_json,
                      char *err, size_t errlen) {
    memset(w, 0, sizeof *w);
    if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path ||
        snprintf(w->tmp, sizeof w->tmp, "%s%s%d", path, TEMP_INFIX, (int)getpid()) >= (int)sizeof w->tmp) {
        snprintf(err, errlen, "path too long: '%.100s...'", path);
        return -1;
    }
    char *json = header_json(tensors, n, metadata_json, &w->promised, err, errlen);
    if (!json) return -1;
    size_t json_len = strlen(json);
    size_t padded = (json_len + 7) / 8 * 8;  /* data starts 8-byte aligned */
    FILE *f = fopen(w->tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write '%s': %s", w->tmp, strerror(errno));
        free(json);
        return -1;
    }
    w->file = f;
    w->ok = 1;
    unsigned char len_bytes[8];
    for (int b = 0; b < 8; b++) len_bytes[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    w->ok = fwrite(len_bytes, 1, 8, f) == 8 && fwrite(json, 1, json_len, f) == json_len;
    for (size_t i = json_len; w->ok && i < padded; i++) w->ok = fputc(' ', f) != EOF;
    if (!w->ok) w->errno_seen = errno;
    free(json);
    return 0;
}

void safetensors_append(StWriter *w, const void *data, size_t bytes) {
    if (w->ok && fwrite(data, 1, bytes, w->file) != bytes) {
        w->ok = 0;
        w->errno_seen = errno;
    }
    w->written += bytes;
}

int safetensors_finish(StWriter *w, char *err, size_t errlen) {
    int short_data = w->written != w->promised, why = w->ok ? 0 : w->errno_seen;
    if (!why && !short_data && (fflush(w->file) != 0 || fsync(fileno(w->file)) != 0)) why = errno;
    if (fclose(w->file) != 0 && !why) why = errno;
    w->file = NULL;
    if (!why && !short_data && rename(w->tmp, w->path) == 0) return 0;
    if (!why && !short_data) why = errno;
    if (short_data && !why)
        snprintf(err, errlen, "cannot write '%s': %zu data bytes written, and its header promised %zu", w->path,
                 w->written, w->promised);
    else
        snprintf(err, errlen, "cannot write '%s': %s", w->path, strerror(why));
    unlink(w->tmp);
    return -1;
}

int safetensors_write(const char *path, const StTensor *tensors, int n,
                      const char *metadata_json, char *err, size_t errlen) {
    StWriter w;
    if (safetensors_begin(&w, path, tensors, n, metadata_json, err, errlen) != 0) return -1;
    for (int i = 0; i < n; i++) safetensors_append(&w, tensors[i].data, tensor_bytes(&tensors[i]));
    return safetensors_finish(&w, err, errlen);
}

/* The dtypes of the format, with their bits per element: the reference reader
 * (the safetensors package) refuses any other name. */
static const struct { const char *name; int bits; } DTYPES[] = {
    { "BOOL", 8 }, { "F4", 4 }, { "F6_E2M3", 6 }, { "F6_E3M2", 6 }, { "U8", 8 }, { "I8", 8 }, { "F8_E5M2", 8 },
    { "F8_E4M3", 8 }, { "F8_E8M0", 8 }, { "F8_E4M3FNUZ", 8 }, { "F8_E5M2FNUZ", 8 }, { "I16", 16 }, { "U16", 16 },
    { "F16", 16 }, { "BF16", 16 }, { "I32", 32 }, { "U32", 32 }, { "F32", 32 }, { "C64", 64 }, { "F64", 64 },
    { "I64", 64 }, { "U64", 64 },
};

/* Bits per element of a dtype, or 0 for a name the format does not define. */
static int dtype_bits(const char *dtype) {
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; i++)
        if (strcmp(DTYPES[i].name, dtype) == 0) return DTYPES[i].bits;
    return 0;
}

/* The reference reader's limit on a header. */
enum { HEADER_MAX_BYTES = 100000000 };

/* One tensor's entry, checked as the reference reads it: dtype, shape and its
 * byte range. */
typedef struct {
    const char *name, *dtype;
    int ndim;
    json_int_t shape[8];
    json_int_t begin, end;  /* in the data section */
} Entry;

/* "16,4": a shape as messages write it. */
static void shape_text(const json_int_t *shape, int ndim, char *text, size_t len) {
    text[0] = 0;
    for (int d = 0; d < ndim; d++)
        snprintf(text + strlen(text), len - strlen(text), "%s%lld", d ? "," : "", (long long)shape[d]);
}

/* A whole number >= 0 (JSON's integers: 4.0 and 4e0 are not). */
static int count_of(const json_t *x, json_int_t *out) {
    if (!json_is_integer(x) || json_integer_value(x) < 0) return 0;
    *out = json_integer_value(x);
    return 1;
}

/* The entry of tensor `name` as the format asks for it: an object with a known
 * "dtype", a "shape" of whole numbers and a "data_offsets" pair [begin, end]
 * of whole numbers that spans exactly the bytes of that shape (other fields,
 * as the reference, ignored). 0, or -1 with a one-line message. */
static int read_entry(const char *name, const json_t *e, const char *path, Entry *out, char *err, size_t errlen) {
    const json_t *dtype = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape");
    const json_t *range = json_object_get(e, "data_offsets");
    *out = (Entry){ .name = name, .dtype = json_string_value(dtype) };
    int bits = out->dtype ? dtype_bits(out->dtype) : 0;
    int ok = json_is_object(e) && bits > 0 && json_is_array(shape) && json_array_size(shape) <= 8 &&
             json_is_array(range) && json_array_size(range) == 2 && count_of(json_array_get(range, 0), &out->begin) &&
             count_of(json_array_get(range, 1), &out->end) && out->begin <= out->end;
    out->ndim = ok ? (int)json_array_size(shape) : 0;
    uint64_t numel = 1;
    for (int d = 0; ok && d < out->ndim; d++) {
        ok = count_of(json_array_get(shape, d), &out->shape[d]);
        if (ok && out->shape[d] > 0) ok = numel <= UINT64_MAX / (uint64_t)out->shape[d] / 64;
        numel *= ok ? (uint64_t)out->shape[d] : 1;
    }
    if (!ok) {
        snprintf(err, errlen, "'%s': tensor '%.100s' has no dtype of the format, shape of whole numbers or "
                 "data_offsets pair [begin, end] of whole numbers", path, name);
        return -1;
    }
    if (numel * (uint64_t)bits % 8 != 0 || numel * (uint64_t)bits / 8 != (uint64_t)(out->end - out->begin)) {
        char shape_of[160];
        shape_text(out->shape, out->ndim, shape_of, sizeof shape_of);
        snprintf(err, errlen, "'%s': tensor '%.100s' has shape [%s] of %s (%llu bits), and data offsets [%lld, %lld] "
                 "(%lld bytes)", path, name, shape_of, out->dtype, (unsigned long long)(numel * (uint64_t)bits),
                 (long long)out->begin, (long long)out->end, (long long)(out->end - out->begin));
        return -1;
    }
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* __metadata__, if there: null, or an object of strings. */
static int check_metadata(const json_t *meta, const char *path, char *err, size_t errlen) {
    const char *key;
    const json_t *value;
    if (!meta || json_is_null(meta)) return 0;
    if (!json_is_object(meta)) {
        snprintf(err, errlen, "'%s': __metadata__ is not an object of strings", path);
        return -1;
    }
    json_object_foreach((json_t *)meta, key, value) {
        if (json_is_string(value)) continue;
        snprintf(err, errlen, "'%s': __metadata__ value '%.100s' is not a string", path, key);
        return -1;
    }
    return 0;
}

/* Every tensor's entry checked, and their byte ranges covering the data
 * section exactly, as the format asks: none overlapping, no hole, nothing
 * after the last (in any order in the header). 0, or -1 with a one-line message. */
static int check_entries(const json_t *header, size_t data_size, const char *path, char *err, size_t errlen) {
    size_t n = json_object_size(header);
    Entry *entries = calloc(n + 1, sizeof *entries);
    if (!entries) { snprintf(err, errlen, "'%s': out of host memory reading the header", path); return -1; }
    int rc = check_metadata(json_object_get(header, "__metadata__"), path, err, errlen);
    size_t k = 0;
    const char *name;
    const json_t *e;
    json_object_foreach((json_t *)header, name, e) {
        if (rc != 0) break;
        if (strcmp(name, "__metadata__") == 0) continue;
        rc = read_entry(name, e, path, &entries[k], err, errlen);
        if (rc == 0 && (uint64_t)entries[k].end > data_size) {
            snprintf(err, errlen, "'%s': tensor '%.100s' has data offsets [%lld, %lld] outside the %zu data bytes",
                     path, name, (long long)entries[k].begin, (long long)entries[k].end, data_size);
            rc = -1;
        }
        k++;
    }
    if (rc == 0) qsort(entries, k, sizeof *entries, by_begin);
    json_int_t covered = 0;
    for (size_t i = 0; rc == 0 && i < k; i++) {
        if (entries[i].begin < covered) {
            snprintf(err, errlen, "'%s': tensors '%.100s' and '%.100s' overlap in the data", path, entries[i - 1].name,
                     entries[i].name);
            rc = -1;
        } else if (entries[i].begin > covered) {
            snprintf(err, errlen, "'%s': data bytes [%lld, %lld) belong to no tensor (a hole)", path,
                     (long long)covered, (long long)entries[i].begin);
            rc = -1;
        }
        covered = entries[i].end;
    }
    if (rc == 0 && (uint64_t)covered < data_size) {
        snprintf(err, errlen, "'%s': %llu trailing bytes after the last tensor's data", path,
                 (unsigned long long)(data_size - (uint64_t)covered));
        rc = -1;
    }
    free(entries);
    return rc;
}

/* safetensors_parse over the first `size` bytes of a file of file_size bytes.
 * The header is read as the reference reader reads it: UTF-8 JSON, one object,
 * nothing after it but JSON's white space, every key once (a key twice is
 * ambiguous, and refused: see docs/checkpoints.md), integers where the format
 * has them. */
static int parse(StFile *f, unsigned char *bytes, size_t size, size_t file_size, const char *path, char *err,
                 size_t errlen) {
    memset(f, 0, sizeof *f);
    f->bytes = bytes;
    f->size = size;
    if (size < 8) {
        snprintf(err, errlen, "'%s' is truncated: %zu bytes, shorter than the 8-byte header length", path, size);
        safetensors_close(f);
        return -1;
    }
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)f->bytes[b] << (8 * b);
    if (header_len > f->size - 8 || header_len > HEADER_MAX_BYTES) {
        snprintf(err, errlen, "'%s': header length %llu runs past the end of the file (%zu bytes)%s",
                 path, (unsigned long long)header_len, f->size, header_len > HEADER_MAX_BYTES ? " or 100 MB" : "");
        safetensors_close(f);
        return -1;
    }
    f->data_start = 8 + (size_t)header_len;
    json_error_t why;
    f->header = json_loadb((const char *)f->bytes + 8, (size_t)header_len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL,
                           &why);
    if (!f->header || !json_is_object((json_t *)f->header)) {
        if (f->header) snprintf(err, errlen, "'%s': the header is not a JSON object", path);
        else snprintf(err, errlen, "'%s': the header is not JSON: %s (at byte %d of it)", path, why.text, why.position);
        safetensors_close(f);
        return -1;
    }
    if (check_entries(f->header, file_size - f->data_start, path, err, errlen) != 0) {
        safetensors_close(f);
        return -1;
    }
    return 0;
}

void safetensors_one_line(char *message) {
    for (; *message; message++)
        if ((unsigned char)*message < 0x20 || *message == 0x7f) *message = '?';
}

int safetensors_parse(StFile *f, unsigned char *bytes, size_t size, const char *path, char *err, size_t errlen) {
    int rc = parse(f, bytes, size, size, path, err, errlen);
    if (rc != 0) safetensors_one_line(err);
    return rc;
}

/* Read the file whole, or (header_only) its length and JSON header alone. */
static int open_file(StFile *f, const char *path, int header_only, char *err, size_t errlen) {
    memset(f, 0, sizeof *f);
    if (host_is_directory(path)) {
        char config[4096];
        struct stat cst;
        snprintf(config, sizeof config, "%s/config.json", path);
        if (stat(config, &cst) == 0)  /* what bin/export writes, which --init-from and bin/sample read */
            snprintf(err, errlen, "'%s' is a Hugging Face folder, not a checkpoint file (bin/train's --init-from and "
                     "bin/sample's --ckpt take one; this does not)", path);
        else
            snprintf(err, errlen, "'%s' is a folder without config.json: neither a Hugging Face folder nor a "
                     "checkpoint file", path);
        return -1;
    }
    struct stat st;
    if (host_regular_file(path, "checkpoint", &st, err, errlen) != 0) return -1;
    FILE *in = fopen(path, "rb");
    if (!in) { snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno)); return -1; }
    long size = fseek(in, 0, SEEK_END) == 0 ? ftell(in) : -1;
    if (size < 8) {
        fclose(in);
        snprintf(err, errlen, "'%s' is truncated: %ld bytes, shorter than the 8-byte header length", path, size);
        return -1;
    }
    size_t want = (size_t)size;
    unsigned char len_bytes[8];
    if (header_only && fseek(in, 0, SEEK_SET) == 0 && fread(len_bytes, 1, 8, in) == 8) {
        uint64_t header_len = 0;
        for (int b = 0; b < 8; b++) header_len |= (uint64_t)len_bytes[b] << (8 * b);
        if (header_len <= want - 8) want = 8 + (size_t)header_len;  /* else parse says it runs past the end */
    }
    unsigned char *bytes = malloc(want + 1);
    int ok = bytes && fseek(in, 0, SEEK_SET) == 0 && fread(bytes, 1, want, in) == want;
    if (!ok || !header_only) fclose(in);
    if (!ok) {
        free(bytes);
        snprintf(err, errlen, bytes ? "cannot read '%s'" : "'%s' does not fit in host memory", path);
        return -1;
    }
    int rc = parse(f, bytes, want, (size_t)size, path, err, errlen);
    if (rc != 0) safetensors_one_line(err);
    if (rc != 0 && header_only) fclose(in);
    if (rc == 0 && header_only) f->file = in;  /* the data is read from it, tensor by tensor */
    return rc;
}

int safetensors_open(StFile *f, const char *path, char *err, size_t errlen) {
    return open_file(f, path, 0, err, errlen);
}

int safetensors_open_header(StFile *f, const char *path, char *err, size_t errlen) {
    return open_file(f, path, 1, err, errlen);
}

void safetensors_close(StFile *f) {
    if (f->file) fclose(f->file);
    json_decref((json_t *)f->header);
    free(f->bytes);
    memset(f, 0, sizeof *f);
}

const char *safetensors_metadata(const StFile *f, const char *key) {
    return json_string_value(json_object_get(json_object_get((json_t *)f->header, "__metadata__"), key));
}

int safetensors_count(const StFile *f) {
    return (int)json_object_size((json_t *)f->header) - (json_object_get((json_t *)f->header, "__metadata__") != NULL);
}

/* The entry of tensor `name`, if its dtype and shape are as given. */
static int find_tensor(const StFile *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
                       Entry *entry, char *err, size_t errlen) {
    const json_t *e = json_object_get((json_t *)f->header, name);
    if (!e || strcmp(name, "__metadata__") == 0) { snprintf(err, errlen, "missing tensor '%s'", name); return -1; }
    if (read_entry(name, e, "", entry, err, errlen) != 0) return -1;  /* checked at open: never here */
    if (strcmp(entry->dtype, dtype) != 0) {
        snprintf(err, errlen, "tensor '%s' has dtype %s, expected %s", name, entry->dtype, dtype);
        return -1;
    }
    int same = entry->ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = entry->shape[d] == shape[d];
    if (!same) {
        char want[160], got[160];
        json_int_t wanted[2] = { ndim > 0 ? shape[0] : 0, ndim > 1 ? shape[1] : 0 };
        shape_text(wanted, ndim, want, sizeof want);
        shape_text(entry->shape, entry->ndim, got, sizeof got);
        snprintf(err, errlen, "tensor '%s' has shape [%s], expected [%s]", name, got, want);
        return -1;
    }
    return 0;
}

/* An F32 tensor's data refused when it holds a NaN or an infinity. */
static int check_finite(const char *name, const char *dtype, const void *data, size_t bytes, char *err,
                        size_t errlen) {
    size_t numel = bytes / sizeof(float);
    size_t bad = strcmp(dtype, "F32") == 0 ? safetensors_first_nonfinite(data, numel) : numel;
    if (bad == numel) return 0;
    float x;
    memcpy(&x, (const unsigned char *)data + bad * sizeof x, sizeof x);
    snprintf(err, errlen, "tensor '%s' is not finite (element %zu is %g)", name, bad, x);
    return -1;
}

/* Bytes [at, at + bytes) of the data section: from memory, or from the file. */
static int read_data(const StFile *f, size_t at, size_t bytes, void *out) {
    if (!f->file) {
        memcpy(out, f->bytes + f->data_start + at, bytes);
        return 0;
    }
    ssize_t got = pread(fileno(f->file), out, bytes, (off_t)(f->data_start + at));
    for (size_t done = got > 0 ? (size_t)got : 0; got > 0 && done < bytes; done += (size_t)got)
        got = pread(fileno(f->file), (char *)out + done, bytes - done, (off_t)(f->data_start + at + done));
    return got > 0 || bytes == 0 ? 0 : -1;
}

static const void *tensor_data(const StFile *f, const char *name, const char *dtype, int ndim,
                               const int64_t *shape, char *err, size_t errlen) {
    Entry entry;
    if (f->file) { snprintf(err, errlen, "tensor '%s' is on disk: read it with safetensors_read", name); return NULL; }
    if (find_tensor(f, name, dtype, ndim, shape, &entry, err, errlen) != 0) return NULL;
    const unsigned char *data = f->bytes + f->data_start + (size_t)entry.begin;
    return check_finite(name, dtype, data, (size_t)(entry.end - entry.begin), err, errlen) == 0 ? data : NULL;
}

const void *safetensors_tensor(const StFile *f, const char *name, const char *dtype, int ndim,
                               const int64_t *shape, char *err, size_t errlen) {
    const void *data = tensor_data(f, name, dtype, ndim, shape, err, errlen);
    if (!data) safetensors_one_line(err);
    return data;
}

int safetensors_check(const StFile *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
                      char *err, size_t errlen) {
    Entry entry;
    int rc = find_tensor(f, name, dtype, ndim, shape, &entry, err, errlen);
    if (rc != 0) safetensors_one_line(err);
    return rc;
}

int safetensors_read(const StFile *f, const char *name, const char *dtype, int ndim, const int64_t *shape,
                     void *out, char *err, size_t errlen) {
    Entry entry;
    int rc = find_tensor(f, name, dtype, ndim, shape, &entry, err, errlen);
    size_t bytes = rc == 0 ? (size_t)(entry.end - entry.begin) : 0;
    if (rc == 0 && read_data(f, (size_t)entry.begin, bytes, out) != 0) {
        snprintf(err, errlen, "tensor '%s' cannot be read: %s", name, strerror(errno));
        rc = -1;
    }
    if (rc == 0) rc = check_finite(name, dtype, out, bytes, err, errlen);
    if (rc != 0) safetensors_one_line(err);
    return rc;
}

int safetensors_same_data(const StFile *f, const char *a, const char *b, char *err, size_t errlen) {
    enum { CHUNK = 1 << 20 };
    Entry x, y;
    const json_t *ex = json_object_get((json_t *)f->header, a), *ey = json_object_get((json_t *)f->header, b);
    if (!ex || !ey || read_entry(a, ex, "", &x, err, errlen) || read_entry(b, ey, "", &y, err, errlen)) return -1;
    if (x.end - x.begin != y.end - y.begin) return 0;
    unsigned char *cx = host_calloc(CHUNK, 1), *cy = host_calloc(CHUNK, 1);
    size_t bytes = (size_t)(x.end - x.begin);
    int same = 1;
    for (size_t at = 0; same == 1 && at < bytes; at += CHUNK) {
        size_t n = bytes - at < CHUNK ? bytes - at : CHUNK;
        if (read_data(f, (size_t)x.begin + at, n, cx) || read_data(f, (size_t)y.begin + at, n, cy)) {
            snprintf(err, errlen, "tensors '%s' and '%s' cannot be read: %s", a, b, strerror(errno));
            same = -1;
        } else {
            same = memcmp(cx, cy, n) == 0;
        }
    }
    free(cx);
    free(cy);
    if (same < 0) safetensors_one_line(err);
    return same;
}

size_t safetensors_first_nonfinite(const void *data, size_t n) {
    const unsigned char *bytes = data;
    for (size_t i = 0; i < n; i++) {
        float x;  /* the data section need not be 4-byte aligned */
        memcpy(&x, bytes + i * sizeof x, sizeof x);
        if (!isfinite(x)) return i;
    }
    return n;
}

int weights_save(const char *path, const ArenaLayout *layout, const float *params,
                 char *err, size_t errlen) {
    StTensor *t = calloc((size_t)layout->ntensors, sizeof *t);
    if (!t) { snprintf(err, errlen, "out of memory"); return -1; }
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *s = &layout->tensors[i];
        t[i] = (StTensor){ s->name, "F32", s->ndim, { s->shape[0], s->shape[1] }, params + s->offset };
    }
    int rc = safetensors_write(path, t, layout->ntensors, NULL, err, errlen);
    free(t);
    return rc;
}

int weights_load(const char *path, const ArenaLayout *layout, float *params,
                 char *err, size_t errlen) {
    StFile f;
    char why[256];
    if (safetensors_open(&f, path, err, errlen) != 0) return -1;
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *s = &layout->tensors[i];
        int64_t shape[2] = { s->shape[0], s->shape[1] };
        const void *data = safetensors_tensor(&f, s->name, "F32", s->ndim, shape, why, sizeof why);
        if (!data) {
            snprintf(err, errlen, "'%s': %s", path, why);
            safetensors_close(&f);
            return -1;
        }
        memcpy(params + s->offset, data, s->numel * sizeof(float));
    }
    int extra = safetensors_count(&f) - layout->ntensors;
    safetensors_close(&f);
    if (extra > 0) {
        snprintf(err, errlen, "'%s' holds %d tensor(s) this model does not have", path, extra);
        return -1;
    }
    return 0;
}
