/* run_files.c: bin/train's files, checked before any is opened for writing (run_files.h). */
#include "run_files.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/safetensors.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"

/* What a path names: the file's device and inode where it exists, else the
 * canonical path it would be made at (its folder resolved, links and all). */
typedef struct {
    int exists, device;  /* device: a character device (/dev/null), which no write destroys */
    dev_t dev;
    ino_t ino;
    char canonical[PATH_MAX + OPTION_PATH_MAX];
} Identity;

static void identify(const char *path, Identity *id) {
    struct stat st;
    memset(id, 0, sizeof *id);
    if (stat(path, &st) == 0) {
        *id = (Identity){ .exists = 1, .device = S_ISCHR(st.st_mode), .dev = st.st_dev, .ino = st.st_ino };
        return;
    }
    char dir_copy[OPTION_PATH_MAX + 64], base_copy[OPTION_PATH_MAX + 64], folder[PATH_MAX];
    snprintf(dir_copy, sizeof dir_copy, "%s", path);
    snprintf(base_copy, sizeof base_copy, "%s", path);
    if (realpath(dirname(dir_copy), folder)) snprintf(id->canonical, sizeof id->canonical, "%s/%s", folder,
                                                      basename(base_copy));
    else snprintf(id->canonical, sizeof id->canonical, "%s", path);
}

static int same_file(const Identity *a, const Identity *b) {
    if (a->exists != b->exists || a->device || b->device) return 0;
    return a->exists ? a->dev == b->dev && a->ino == b->ino : strcmp(a->canonical, b->canonical) == 0;
}

/* The run's paths: outputs first. */
typedef struct { const char *flag, *path; int output; } RunPath;

int run_files_distinct(const TrainOptions *o, char *err, size_t errlen) {
    char ckpt[OPTION_PATH_MAX + 64];
    snprintf(ckpt, sizeof ckpt, "%s/%s", o->out, CHECKPOINT_FILE_NAME);
    const RunPath paths[] = {
        { "--log", o->log, 1 }, { "--trace", o->trace, 1 }, { "--out's checkpoint", o->out[0] ? ckpt : "", 1 },
        { "--data", o->data, 0 }, { "--resume", o->resume, 0 }, { "--init-from", o->init_from, 0 },
    };
    enum { NPATHS = sizeof paths / sizeof paths[0] };
    Identity ids[NPATHS];
    for (int i = 0; i < NPATHS; i++)
        if (paths[i].path[0]) identify(paths[i].path, &ids[i]);
    for (int i = 0; i < NPATHS; i++)
        for (int j = i + 1; paths[i].output && j < NPATHS; j++) {
            /* the checkpoint is written over the one it resumes or starts from by design (an atomic rename;
               run_files_keep_checkpoint asks a fresh run to say --overwrite=1) */
            int by_design = i == 2 && j >= 4;
            if (!paths[i].path[0] || !paths[j].path[0] || by_design || !same_file(&ids[i], &ids[j])) continue;
            snprintf(err, errlen, "train: %s '%s' is the same file as %s '%s': writing it would destroy the other "
                     "before the run began; give it another path", paths[i].flag, paths[i].path, paths[j].flag,
                     paths[j].path);
            return 2;
        }
    return 0;
}

int run_files_keep_checkpoint(const TrainOptions *o, char *err, size_t errlen) {
    char ckpt[OPTION_PATH_MAX + 64];
    snprintf(ckpt, sizeof ckpt, "%s/%s", o->out, CHECKPOINT_FILE_NAME);
    struct stat st;
    if (!o->out[0] || o->overwrite || stat(ckpt, &st) != 0) return 0;
    if (o->resume[0]) {
        Identity held, resumed;
        identify(ckpt, &held);
        identify(o->resume, &resumed);
        if (same_file(&held, &resumed)) return 0;
    }
    snprintf(err, errlen, "train: --out '%s' holds a checkpoint already (%s), which this run would replace at its "
             "first save: --resume it to go on, or --overwrite=1 to replace it", o->out, ckpt);
    return 2;
}

int run_files_open_log(const char *path, FILE **log, char *err, size_t errlen) {
    /* nonblocking, so a FIFO without a reader fails at once (ENXIO) rather than waiting for one */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
    int flags = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
    if (flags >= 0 && fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0 && (*log = fdopen(fd, "w"))) return 0;
    if (errno == ENXIO)
        snprintf(err, errlen, "train: --log '%s' is a FIFO or a socket that nothing reads: the log would wait for "
                 "a reader forever", path);
    else
        snprintf(err, errlen, "train: cannot write --log file '%s': %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
}

int run_files_check_trace(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0 && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) {
        snprintf(err, errlen, "train: --trace '%s' is a FIFO or a socket: the trace is written whole at the end, "
                 "to a file", path);
        return 1;
    }
    FILE *probe = fopen(path, "w");
    if (probe && fclose(probe) == 0) return 0;
    snprintf(err, errlen, "train: cannot write --trace file '%s': %s", path, strerror(errno));
    return 1;
}

int run_files_prepare_out(const char *dir, int *stale, char *err, size_t errlen) {
    *stale = 0;
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "train: cannot make the --out folder '%s': %s", dir, strerror(errno));
        return 1;
    }
    if (!host_is_directory(dir)) {
        snprintf(err, errlen, "train: --out '%s' is a file, not a folder", dir);
        return 1;
    }
    char probe[OPTION_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.zf-probe.%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int ok = fd >= 0 && write(fd, "probe", 5) == 5;
    int saved_errno = errno;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (fd >= 0) unlink(probe);
    if (!ok) {
        snprintf(err, errlen, "train: cannot write in the --out folder '%s': %s", dir, strerror(saved_errno));
        return 1;
    }
    *stale = safetensors_remove_stale_temps(dir, CHECKPOINT_FILE_NAME);
    return 0;
}
