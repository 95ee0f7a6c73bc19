/* file_identity.c: no output of a tool is the same file as another of its paths (file_identity.h). */
#include "file_identity.h"

#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { NAME_MAX_BYTES = 1024 };

/* What a path names: the file's device and inode where it exists, else the
 * canonical path it would be made at (its folder resolved, links and all). */
typedef struct {
    int exists, device;  /* device: a character device (/dev/null), which no write destroys */
    dev_t dev;
    ino_t ino;
    char canonical[PATH_MAX + NAME_MAX_BYTES];
} Identity;

/* Where a symbolic link that leads nowhere yet points: writing through it
 * makes that file. Its target, relative to the link's folder; 0, or -1 when
 * path is no such link. */
static int dangling_target(const char *path, char *target, size_t len) {
    struct stat st;
    char link[PATH_MAX], dir_copy[PATH_MAX];
    if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return -1;
    ssize_t n = readlink(path, link, sizeof link - 1);
    if (n < 0) return -1;
    link[n] = 0;
    snprintf(dir_copy, sizeof dir_copy, "%s", path);
    int made = link[0] == '/' ? snprintf(target, len, "%s", link) : snprintf(target, len, "%s/%s", dirname(dir_copy), link);
    return made < 0 || (size_t)made >= len ? -1 : 0;  /* a target too long for a path names no file */
}

static void identify(const char *given, Identity *id) {
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(given, &st) == 0) {
        *id = (Identity){ .exists = 1, .device = S_ISCHR(st.st_mode), .dev = st.st_dev, .ino = st.st_ino };
        return;
    }
    char path[PATH_MAX], target[PATH_MAX];
    snprintf(path, sizeof path, "%s", given);
    for (int hops = 0; hops < 40 && dangling_target(path, target, sizeof target) == 0; hops++)
        snprintf(path, sizeof path, "%s", target);  /* as the kernel follows links, at most 40 */
    char dir_copy[PATH_MAX], base_copy[PATH_MAX], folder[PATH_MAX];
    snprintf(dir_copy, sizeof dir_copy, "%s", path);
    snprintf(base_copy, sizeof base_copy, "%s", path);
    if (realpath(dirname(dir_copy), folder)) snprintf(id->canonical, sizeof id->canonical, "%s/%s", folder,
                                                      basename(base_copy));
    else snprintf(id->canonical, sizeof id->canonical, "%s", path);
}

static int same_identity(const Identity *a, const Identity *b) {
    if (a->exists != b->exists || a->device || b->device) return 0;
    return a->exists ? a->dev == b->dev && a->ino == b->ino : strcmp(a->canonical, b->canonical) == 0;
}

int file_identity_same(const char *a, const char *b) {
    Identity ia, ib;
    identify(a, &ia);
    identify(b, &ib);
    return same_identity(&ia, &ib);
}

int file_identity_distinct(const char *tool, const ToolPath *paths, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const ToolPath *out = &paths[i], *other = &paths[j];
            int by_design = out->continued && other->continued && !other->output;
            /* each pair of outputs once: from the first of the two */
            if (i == j || !out->output || (other->output && j < i) || by_design) continue;
            if (!out->path[0] || !other->path[0] || !file_identity_same(out->path, other->path)) continue;
            snprintf(err, errlen, "%s: %s '%s' is the same file as %s '%s': writing it would destroy the other "
                     "before the run began; give it another path", tool, out->flag, out->path, other->flag, other->path);
            return 2;
        }
    return 0;
}
