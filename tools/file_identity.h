/* file_identity.h: the one rule every tool applies before it writes a file:
 * no output may be the same file as an input or another output.
 *
 * Opening an output truncates it, and a rename into its place replaces it, so
 * an output that is the same file as something the tool reads (the same path,
 * a hard link, a symbolic link, or a folder reached through a link: the same
 * device and inode) would lose that file. Such a command line is refused,
 * naming both flags, exit 2 (a command line no run can use), --overwrite=1 or
 * not. bin/train, bin/prepare and bin/export name their paths here; bin/sample
 * and bin/zero_memory write nothing but their standard output.
 */
#ifndef ZF_FILE_IDENTITY_H
#define ZF_FILE_IDENTITY_H

#include <stddef.h>

/* One path a tool reads or writes, named by the flag it came from ("--out's
 * train.bin"). A checkpoint the run continues may be written over by the
 * checkpoint it saves (bin/train's rename over the one it resumes): such an
 * output and such an input both say continued = 1, and that pair is allowed. */
typedef struct {
    const char *flag, *path;
    int output, continued;
} ToolPath;

/* Whether two paths name the same file: the same device and inode where both
 * exist, the same canonical path (its folder resolved) where neither does. A
 * character device (/dev/null) is the same file as nothing. */
int file_identity_same(const char *a, const char *b);
/* 0, or 2 with a one-line message "TOOL: FLAG 'PATH' is the same file as ..."
 * in err when an output in paths is the same file as any other path there
 * (empty paths are skipped). */
int file_identity_distinct(const char *tool, const ToolPath *paths, int n, char *err, size_t errlen);

#endif
