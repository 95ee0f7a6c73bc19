/* cpu_setup.c: the CPU backend's libraries set up before they load: OpenBLAS
 * off its generic kernels, and OpenMP's idle threads spinning briefly.
 * The CPU backend's alone: it has no twin in kernels/cuda/.
 *
 * OpenBLAS: Debian 12's OpenBLAS 0.3.21 does not recognise recent Intel CPUs
 * (e.g. family 6 model 207) and falls back to its generic "Prescott" kernels,
 * about an eighth of the speed of its SkylakeX kernels on the same AVX-512
 * cores. The program sets OPENBLAS_CORETYPE when the choice is wrong.
 *
 * OpenMP: libgomp's idle threads spin 300,000 times by default (about 3 ms,
 * by its own estimate) before they sleep. On a quiet machine that saves a
 * wake-up per parallel region; on a shared one the spinning threads take the
 * cores from the threads with work: beside two busy loops on two cores,
 * char-small's step took 4.0 times its quiet time, a tiny model's 6.8 times.
 * Sleeping at once (OMP_WAIT_POLICY=PASSIVE) costs the quiet step 5% to 8%;
 * spinning 3000 times (about 30 us) costs it nothing measurable and took the
 * loaded steps to 2.3 and 3.2 times (docs/performance.md,
 * bench/results/load.md). The program sets GOMP_SPINCOUNT=3000.
 *
 * Both are read as the libraries load, before main, so the program sets them
 * and re-executes itself once. What the user set is always respected.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_setup.h"

/* The spins libgomp's idle threads make before they sleep, as the program sets them. */
static const char OPENMP_SPINS[] = "3000";
/* What the re-executed program reads to say what was set: the core OpenBLAS
 * chose before, and whether the spin count is the program's. */
static const char RESTARTED_FROM_CORE[] = "ZEROFIBER_BLAS_RESTARTED_FROM";
static const char SET_SPINS[] = "ZEROFIBER_SET_GOMP_SPINCOUNT";

const char *blas_better_core(const char *corename, int has_avx512, int has_avx2) {
    int generic = strcmp(corename, "Prescott") == 0 || strcmp(corename, "Core2") == 0 ||
                  strcmp(corename, "Nehalem") == 0 || strcmp(corename, "Sandybridge") == 0;
    if (!generic) return NULL;
    if (has_avx512) return "SkylakeX";
    if (has_avx2) return "Haswell";
    return NULL;
}

const char *openmp_spin_count(const char *wait_policy, const char *spin_count) {
    return wait_policy || spin_count ? NULL : OPENMP_SPINS;
}

/* Re-execute the program with what it chose set, once; on failure, go on as it is. */
static void restart(char **argv, const char *core, const char *better_core, const char *spins) {
    if (better_core) {
        setenv(RESTARTED_FROM_CORE, core, 1);
        setenv("OPENBLAS_CORETYPE", better_core, 1);
    }
    if (spins) {
        setenv(SET_SPINS, "1", 1);
        setenv("GOMP_SPINCOUNT", spins, 1);
    }
    execv("/proc/self/exe", argv);
    fprintf(stderr, "cpu: restarting with%s%s%s%s failed; going on without\n",
            better_core ? " OPENBLAS_CORETYPE=" : "", better_core ? better_core : "",
            spins ? " GOMP_SPINCOUNT=" : "", spins ? spins : "");
    if (better_core) unsetenv("OPENBLAS_CORETYPE");
    if (spins) unsetenv("GOMP_SPINCOUNT");
    unsetenv(RESTARTED_FROM_CORE);
    unsetenv(SET_SPINS);
}

/* The kernels, and OPENBLAS_L2_SIZE where the environment sets it: it changes
 * OpenBLAS's blocking, and with it the speed, whatever the kernels. */
static void describe_blas(char *line, size_t len, const char *core, const char *user_core) {
    const char *restarted_from = getenv(RESTARTED_FROM_CORE), *l2 = getenv("OPENBLAS_L2_SIZE");
    int n;
    if (restarted_from)
        n = snprintf(line, len, "OpenBLAS %s kernels, %d threads (OpenBLAS chose its generic '%s' kernels on this "
                     "CPU, so the program restarted itself with OPENBLAS_CORETYPE=%s)", core,
                     openblas_get_num_threads(), restarted_from, core);
    else
        n = snprintf(line, len, "OpenBLAS %s kernels, %d threads%s%s", core, openblas_get_num_threads(),
                     user_core ? ", OPENBLAS_CORETYPE=" : "", user_core ? user_core : "");
    if (l2 && n > 0 && (size_t)n < len) snprintf(line + n, len - n, ", OPENBLAS_L2_SIZE=%s", l2);
}

/* How idle threads wait, then how big a stream's team is (runtime/device_cpu.c). */
static void describe_openmp(char *line, size_t len) {
    const char *policy = getenv("OMP_WAIT_POLICY"), *spins = getenv("GOMP_SPINCOUNT");
    const char *dynamic = getenv("OMP_DYNAMIC");
    int n;
    if (getenv(SET_SPINS))
        n = snprintf(line, len, "idle threads spin %s times, then sleep (GOMP_SPINCOUNT=%s, set by the program: "
                     "a shared machine's cores go to the threads with work)", spins, spins);
    else if (policy || spins)
        n = snprintf(line, len, "idle threads wait as the user set it:%s%s%s%s", policy ? " OMP_WAIT_POLICY=" : "",
                     policy ? policy : "", spins ? " GOMP_SPINCOUNT=" : "", spins ? spins : "");
    else
        n = snprintf(line, len, "idle threads wait as libgomp does by default (the program's restart failed)");
    if (n < 0 || (size_t)n >= len) return;
    if (dynamic)
        snprintf(line + n, len - n, "; teams as OMP_DYNAMIC=%s says", dynamic);
    else
        snprintf(line + n, len - n, "; a stream's team is one thread while a load leaves a core free");
}

const CpuSetup *cpu_setup(char **argv) {
    static CpuSetup setup;
    const char *core = openblas_get_corename(), *user_core = getenv("OPENBLAS_CORETYPE");
    int restarted = getenv(RESTARTED_FROM_CORE) || getenv(SET_SPINS);
    const char *better = user_core ? NULL : blas_better_core(core, __builtin_cpu_supports("avx512f"),
                                                             __builtin_cpu_supports("avx2"));
    const char *spins = openmp_spin_count(getenv("OMP_WAIT_POLICY"), getenv("GOMP_SPINCOUNT"));
    if (!restarted && (better || spins)) restart(argv, core, better, spins);
    describe_blas(setup.blas, sizeof setup.blas, core, user_core);
    describe_openmp(setup.openmp, sizeof setup.openmp);
    unsetenv(RESTARTED_FROM_CORE);
    unsetenv(SET_SPINS);
    return &setup;
}

void cpu_setup_print(const CpuSetup *setup) {
    printf("blas: %s\nopenmp: %s\n", setup->blas, setup->openmp);
}
