/* safetensors.c: the safetensors reader and writer of safetensors.h. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/host.h"

static size_t dtype_size(const char *dtype) {
    return strcmp(dtype, "F32") == 0 || strcmp(dtype, "I32") == 0 ? 4 : 0;
}

static size_t tensor_bytes(const StTensor *t) {
    size_t n = dtype_size(t->dtype);
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

int safetensors_write(const char *path, const StTensor *tensors, int n,
                      const char *metadata_json, char *err, size_t errlen) {
    cJSON *header = cJSON_CreateObject();
    if (metadata_json) {
        cJSON *meta = cJSON_Parse(metadata_json);
        if (!meta) { snprintf(err, errlen, "bad metadata JSON"); cJSON_Delete(header); return -1; }
        cJSON_AddItemToObject(header, "__metadata__", meta);
    }
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        cJSON *entry = cJSON_AddObjectToObject(header, tensors[i].name);
        cJSON_AddStringToObject(entry, "dtype", tensors[i].dtype);
        cJSON *shape = cJSON_AddArrayToObject(entry, "shape");
        for (int d = 0; d < tensors[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)tensors[i].shape[d]));
        cJSON *range = cJSON_AddArrayToObject(entry, "data_offsets");
        cJSON_AddItemToArray(range, cJSON_CreateNumber((double)offset));
        offset += tensor_bytes(&tensors[i]);
        cJSON_AddItemToArray(range, cJSON_CreateNumber((double)offset));
    }
    char *json = cJSON_PrintUnformatted(header);
    cJSON_Delete(header);
    if (!json) { snprintf(err, errlen, "out of memory writing '%s'", path); return -1; }
    size_t json_len = strlen(json);
    size_t padded = (json_len + 7) / 8 * 8;  /* data starts 8-byte aligned */

    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s%s%d", path, TEMP_INFIX, (int)getpid()) >= (int)sizeof tmp) {
        snprintf(err, errlen, "path too long: '%.100s...'", path);
        cJSON_free(json);
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write '%s': %s", tmp, strerror(errno));
        cJSON_free(json);
        return -1;
    }
    unsigned char len_bytes[8];
    for (int b = 0; b < 8; b++) len_bytes[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    int ok = fwrite(len_bytes, 1, 8, f) == 8 && fwrite(json, 1, json_len, f) == json_len;
    for (size_t i = json_len; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++) {
        size_t bytes = tensor_bytes(&tensors[i]);
        ok = fwrite(tensors[i].data, 1, bytes, f) == bytes;
    }
    cJSON_free(json);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* One tensor's byte range in the data section, for the coverage check. */
typedef struct { double begin, end; const char *name; } ByteRange;

static int by_begin(const void *a, const void *b) {
    const ByteRange *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : x->end < y->end ? -1 : x->end > y->end;
}

/* The format asks that the tensors cover the data section exactly: every range
 * whole numbers inside it, none overlapping, no hole, nothing after the last
 * (in any order in the header). 0, or -1 with a one-line message. */
static int check_coverage(const cJSON *header, size_t data_size, const char *path, char *err, size_t errlen) {
    int n = 0;
    for (const cJSON *e = header->child; e; e = e->next) n += strcmp(e->string, "__metadata__") != 0;
    ByteRange *ranges = calloc((size_t)n + 1, sizeof *ranges);
    if (!ranges) { snprintf(err, errlen, "'%s': out of host memory reading the header", path); return -1; }
    int k = 0, rc = 0;
    for (const cJSON *e = header->child; e && rc == 0; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        const cJSON *range = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
        const cJSON *first = cJSON_GetArrayItem(range, 0), *last = cJSON_GetArrayItem(range, 1);
        if (!cJSON_IsArray(range) || cJSON_GetArraySize(range) != 2 || !cJSON_IsNumber(first) ||
            !cJSON_IsNumber(last)) {
            snprintf(err, errlen, "'%s': tensor '%.100s' has no data_offsets pair", path, e->string);
            rc = -1;
            break;
        }
        ByteRange r = { first->valuedouble, last->valuedouble, e->string };
        if (!(r.begin >= 0 && r.end >= r.begin && r.end <= (double)data_size && r.begin == floor(r.begin) &&
              r.end == floor(r.end))) {
            snprintf(err, errlen, "'%s': tensor '%.100s' has data offsets [%.0f, %.0f] outside the %zu data bytes",
                     path, e->string, r.begin, r.end, data_size);
            rc = -1;
        }
        ranges[k++] = r;
    }
    if (rc == 0) qsort(ranges, (size_t)k, sizeof *ranges, by_begin);
    double covered = 0;
    for (int i = 0; rc == 0 && i < k; i++) {
        if (ranges[i].begin < covered) {
            snprintf(err, errlen, "'%s': tensors '%.100s' and '%.100s' overlap in the data", path,
                     ranges[i - 1].name, ranges[i].name);
            rc = -1;
        } else if (ranges[i].begin > covered) {
            snprintf(err, errlen, "'%s': data bytes [%.0f, %.0f) belong to no tensor (a hole)", path, covered,
                     ranges[i].begin);
            rc = -1;
        }
        covered = ranges[i].end;
    }
    if (rc == 0 && covered < (double)data_size) {
        snprintf(err, errlen, "'%s': %.0f trailing bytes after the last tensor's data", path,
                 (double)data_size - covered);
        rc = -1;
    }
    free(ranges);
    return rc;
}

/* safetensors_parse over the first `size` bytes of a file of file_size bytes. */
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
    if (header_len > f->size - 8) {
        snprintf(err, errlen, "'%s': header length %llu runs past the end of the file (%zu bytes)",
                 path, (unsigned long long)header_len, f->size);
        safetensors_close(f);
        return -1;
    }
    f->data_start = 8 + (size_t)header_len;
    f->header = cJSON_ParseWithLength((const char *)f->bytes + 8, (size_t)header_len);
    if (!f->header || !cJSON_IsObject((cJSON *)f->header)) {
        snprintf(err, errlen, "'%s': the header is not a JSON object", path);
        safetensors_close(f);
        return -1;
    }
    if (check_coverage(f->header, file_size - f->data_start, path, err, errlen) != 0) {
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
        snprintf(err, errlen, "'%s' is a directory, not a checkpoint file", path);
        return -1;
    }
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
    fclose(in);
    if (!ok) {
        free(bytes);
        snprintf(err, errlen, bytes ? "cannot read '%s'" : "'%s' does not fit in host memory", path);
        return -1;
    }
    int rc = parse(f, bytes, want, (size_t)size, path, err, errlen);
    if (rc != 0) safetensors_one_line(err);
    return rc;
}

int safetensors_open(StFile *f, const char *path, char *err, size_t errlen) {
    return open_file(f, path, 0, err, errlen);
}

int safetensors_open_header(StFile *f, const char *path, char *err, size_t errlen) {
    return open_file(f, path, 1, err, errlen);
}

void safetensors_close(StFile *f) {
    cJSON_Delete((cJSON *)f->header);
    free(f->bytes);
    memset(f, 0, sizeof *f);
}

const char *safetensors_metadata(const StFile *f, const char *key) {
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive((const cJSON *)f->header, "__metadata__");
    const cJSON *value = meta ? cJSON_GetObjectItemCaseSensitive(meta, key) : NULL;
    return cJSON_IsString(value) ? value->valuestring : NULL;
}

int safetensors_count(const StFile *f) {
    int n = 0;
    for (cJSON *e = ((cJSON *)f->header)->child; e; e = e->next)
        if (strcmp(e->string, "__metadata__") != 0) n++;
    return n;
}

static const void *tensor_data(const StFile *f, const char *name, const char *dtype, int ndim,
                               const int64_t *shape, char *err, size_t errlen) {
    cJSON *e = cJSON_GetObjectItemCaseSensitive((cJSON *)f->header, name);
    if (!e) { snprintf(err, errlen, "missing tensor '%s'", name); return NULL; }
    cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    cJSON *range = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(range) ||
        cJSON_GetArraySize(range) != 2) {
        snprintf(err, errlen, "tensor '%s' has a malformed header entry", name);
        return NULL;
    }
    if (strcmp(dt->valuestring, dtype) != 0) {
        snprintf(err, errlen, "tensor '%s' has dtype %s, expected %s", name, dt->valuestring, dtype);
        return NULL;
    }
    char want[64] = "", got[64] = "";
    int same = cJSON_GetArraySize(sh) == ndim;
    for (int d = 0; d < ndim; d++) {
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s%lld", d ? "," : "", (long long)shape[d]);
    }
    for (int d = 0; d < cJSON_GetArraySize(sh); d++) {
        cJSON *x = cJSON_GetArrayItem(sh, d);
        double v = cJSON_IsNumber(x) ? x->valuedouble : -1;
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%.0f", d ? "," : "", v);
        if (d < ndim && v != (double)shape[d]) same = 0;
    }
    if (!same) {
        snprintf(err, errlen, "tensor '%s' has shape [%s], expected [%s]", name, got, want);
        return NULL;
    }
    size_t bytes = dtype_size(dtype);
    for (int d = 0; d < ndim; d++) bytes *= (size_t)shape[d];
    cJSON *first = cJSON_GetArrayItem(range, 0), *last = cJSON_GetArrayItem(range, 1);
    if (!cJSON_IsNumber(first) || !cJSON_IsNumber(last)) {
        snprintf(err, errlen, "tensor '%s' has non-numeric data offsets", name);
        return NULL;
    }
    double begin = first->valuedouble, end = last->valuedouble;
    size_t data_size = f->size - f->data_start;
    if (!(begin >= 0 && end >= begin && end <= (double)data_size && begin == floor(begin) && end == floor(end) &&
          (size_t)end - (size_t)begin == bytes)) {
        snprintf(err, errlen, "tensor '%s' has data offsets [%.0f, %.0f] outside the %zu data bytes "
                 "or not %zu bytes long", name, begin, end, data_size, bytes);
        return NULL;
    }
    const unsigned char *data = f->bytes + f->data_start + (size_t)begin;
    size_t numel = bytes / sizeof(float), bad = strcmp(dtype, "F32") == 0 ? safetensors_first_nonfinite(data, numel)
                                                                          : numel;
    if (bad < numel) {
        float x;
        memcpy(&x, data + bad * sizeof x, sizeof x);
        snprintf(err, errlen, "tensor '%s' is not finite (element %zu is %g)", name, bad, x);
        return NULL;
    }
    return data;
}

const void *safetensors_tensor(const StFile *f, const char *name, const char *dtype, int ndim,
                               const int64_t *shape, char *err, size_t errlen) {
    const void *data = tensor_data(f, name, dtype, ndim, shape, err, errlen);
    if (!data) safetensors_one_line(err);
    return data;
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
