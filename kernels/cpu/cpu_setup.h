/* cpu_setup.h: what the CPU backend's libraries read once, as they load:
 * OpenBLAS's kernels (its core type) and how OpenMP's idle threads wait (their
 * spin count). Both can only be set before the libraries load, so the program
 * sets what the user left unset and re-executes itself once. See cpu_setup.c.
 */
#ifndef ZF_CPU_SETUP_H
#define ZF_CPU_SETUP_H

/* What cpu_setup chose, a line each, for a tool's start-up lines. */
typedef struct {
    char blas[256];    /* "OpenBLAS SkylakeX kernels, 2 threads ..." */
    char openmp[320];  /* "idle threads spin 3000 times, then sleep ...; a stream's team ..." */
} CpuSetup;

/* Call first thing in main: it may re-execute the program with
 * OPENBLAS_CORETYPE or GOMP_SPINCOUNT set. Returns what is in use. */
const CpuSetup *cpu_setup(char **argv);
/* Its two lines, "blas: ..." and "openmp: ...", on stdout. */
void cpu_setup_print(const CpuSetup *setup);
/* Which OPENBLAS_CORETYPE suits a CPU when OpenBLAS chose `corename`, or NULL
 * when the choice is fine. */
const char *blas_better_core(const char *corename, int has_avx512, int has_avx2);
/* The GOMP_SPINCOUNT the program sets, given the user's OMP_WAIT_POLICY and
 * GOMP_SPINCOUNT (NULL where unset): NULL where the user set either. */
const char *openmp_spin_count(const char *wait_policy, const char *spin_count);

#endif
