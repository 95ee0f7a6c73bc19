/* blas_setup.c: keep OpenBLAS off its generic kernels on CPUs it does not know.
 * The CPU backend's alone: it has no twin in kernels/cuda/.
 *
 * Why: Debian 12's OpenBLAS 0.3.21 does not recognise recent Intel CPUs (e.g.
 * family 6 model 207) and falls back to its generic "Prescott" kernels, about an
 * eighth of the speed of its SkylakeX kernels on the same AVX-512 cores. The core
 * type can only be chosen before the library loads, through OPENBLAS_CORETYPE, so
 * when the choice is wrong we set it and re-execute the program once. A core type
 * the user set is always respected.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "blas_setup.h"

const char *blas_better_core(const char *corename, int has_avx512, int has_avx2) {
    int generic = strcmp(corename, "Prescott") == 0 || strcmp(corename, "Core2") == 0 ||
                  strcmp(corename, "Nehalem") == 0 || strcmp(corename, "Sandybridge") == 0;
    if (!generic) return NULL;
    if (has_avx512) return "SkylakeX";
    if (has_avx2) return "Haswell";
    return NULL;
}

const char *blas_ensure_core(char **argv) {
    static char line[256];
    const char *core = openblas_get_corename();
    const char *user_choice = getenv("OPENBLAS_CORETYPE");
    const char *better = blas_better_core(core, __builtin_cpu_supports("avx512f"),
                                          __builtin_cpu_supports("avx2"));
    if (better && !user_choice) {
        /* the restarted process reports what happened, on its first line */
        setenv("ZEROFIBER_BLAS_RESTARTED_FROM", core, 1);
        setenv("OPENBLAS_CORETYPE", better, 1);
        execv("/proc/self/exe", argv);
        fprintf(stderr, "blas: restarting with OPENBLAS_CORETYPE=%s failed; continuing on the "
                        "slow generic '%s' kernels\n", better, core);
        unsetenv("OPENBLAS_CORETYPE");
    }
    const char *restarted_from = getenv("ZEROFIBER_BLAS_RESTARTED_FROM");
    if (restarted_from) {
        snprintf(line, sizeof line, "OpenBLAS %s kernels, %d threads (OpenBLAS chose its generic "
                 "'%s' kernels on this CPU, so the program restarted itself with "
                 "OPENBLAS_CORETYPE=%s)", core, openblas_get_num_threads(), restarted_from, core);
        unsetenv("ZEROFIBER_BLAS_RESTARTED_FROM");
    } else {
        snprintf(line, sizeof line, "OpenBLAS %s kernels, %d threads%s%s", core,
                 openblas_get_num_threads(), user_choice ? ", OPENBLAS_CORETYPE=" : "",
                 user_choice ? user_choice : "");
    }
    return line;
}
