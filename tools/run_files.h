/* run_files.h: the files bin/train reads and writes, checked before any of
 * them is opened for writing.
 *
 * A run reads --data, --tokenizer, --resume and --init-from, and writes --log, --trace and
 * its checkpoint, --out/ckpt.safetensors. An output that is the same file as
 * an input or another output is refused by the rule every tool applies
 * (file_identity.h); the checkpoint alone may replace the one it resumes or
 * starts from. A checkpoint already in --out is another run's state, and a run that
 * does not resume it would replace it at its first save: refused, unless
 * --overwrite=1 says so. The log may be a FIFO that something reads (`--log
 * >(jq .)`), never one that nothing does, whose open would wait forever; the
 * trace, written whole at the end, must be a file or a device.
 *
 * Every function here gives 0, or an exit status (1: a file that cannot be
 * used; 2: a command line no run can use) with a one-line message in err.
 */
#ifndef ZF_RUN_FILES_H
#define ZF_RUN_FILES_H

#include <stdio.h>

#include "options.h"

/* No output of o is the same file as any other path o names. */
int run_files_distinct(const TrainOptions *o, char *err, size_t errlen);
/* A checkpoint in --out is replaced only by the run that resumes it, or with --overwrite=1. */
int run_files_keep_checkpoint(const TrainOptions *o, char *err, size_t errlen);
/* The --log file opened for writing (a FIFO only with a reader): *log, or NULL with a status. */
int run_files_open_log(const char *path, FILE **log, char *err, size_t errlen);
/* The --trace path can take the trace at the end: a file it can write, or a device. */
int run_files_check_trace(const char *path, char *err, size_t errlen);
/* The --out folder: made if missing, proved writable with a probe file
 * (removed) before any training time is spent, and cleared of the temporary
 * files that cut-short saves left (how many in *stale). */
int run_files_prepare_out(const char *dir, int *stale, char *err, size_t errlen);

#endif
