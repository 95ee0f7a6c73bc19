/* run_files.c: bin/train's files, checked before any is opened for writing (run_files.h). */
#include "run_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../model/data.h"
#include "../model/safetensors.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"
#include "file_identity.h"

int run_files_distinct(const TrainOptions *o, char *err, size_t errlen) {
    char ckpt[OPTION_PATH_MAX + 64], folder_file[TOKEN_FOLDER_FILES][OPTION_PATH_MAX + 16];
    char folder_flag[TOKEN_FOLDER_FILES][32];
    snprintf(ckpt, sizeof ckpt, "%s/%s", o->out, CHECKPOINT_FILE_NAME);
    /* a token folder's files are the inputs a write would destroy, not the folder */
    int folder = host_is_directory(o->data);
    for (int i = 0; i < TOKEN_FOLDER_FILES; i++) {
        snprintf(folder_file[i], sizeof folder_file[i], "%s", "");
        if (folder) snprintf(folder_file[i], sizeof folder_file[i], "%s/%s", o->data, TOKEN_FOLDER_FILE[i]);
        snprintf(folder_flag[i], sizeof folder_flag[i], "--data's %s", TOKEN_FOLDER_FILE[i]);
    }
    /* the checkpoint is written over the one it resumes by design (an atomic rename), and over no other input */
    const ToolPath paths[] = {
        { "--log", o->log, 1, 0 }, { "--trace", o->trace, 1, 0 }, { "--out's checkpoint", o->out[0] ? ckpt : "", 1, 1 },
        { "--data", o->data, 0, 0 }, { folder_flag[0], folder_file[0], 0, 0 }, { folder_flag[1], folder_file[1], 0, 0 },
        { folder_flag[2], folder_file[2], 0, 0 }, { "--tokenizer", o->tokenizer, 0, 0 },
        { "--resume", o->resume, 0, 1 }, { "--init-from", o->init_from, 0, 0 },
    };
    return file_identity_distinct("train", paths, sizeof paths / sizeof paths[0], err, errlen);
}

int run_files_keep_checkpoint(const TrainOptions *o, char *err, size_t errlen) {
    char ckpt[OPTION_PATH_MAX + 64];
    snprintf(ckpt, sizeof ckpt, "%s/%s", o->out, CHECKPOINT_FILE_NAME);
    struct stat st;
    if (!o->out[0] || o->overwrite || stat(ckpt, &st) != 0) return 0;
    if (o->resume[0] && file_identity_same(ckpt, o->resume)) return 0;
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
