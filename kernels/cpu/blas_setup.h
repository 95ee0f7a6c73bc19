/* blas_setup.h: the CPU backend's guard against OpenBLAS's generic kernels.
 *
 * Debian 12's OpenBLAS 0.3.21 does not recognise recent Intel CPUs and falls
 * back to kernels an eighth as fast; the core type can only be set before the
 * library loads. See blas_setup.c.
 */
#ifndef ZF_BLAS_SETUP_H
#define ZF_BLAS_SETUP_H

/* Call first thing in main: it may re-execute the program with
 * OPENBLAS_CORETYPE set. Returns a line describing the BLAS in use. */
const char *blas_ensure_core(char **argv);
/* Which OPENBLAS_CORETYPE suits a CPU when OpenBLAS chose `corename`, or NULL
 * when the choice is fine. */
const char *blas_better_core(const char *corename, int has_avx512, int has_avx2);

#endif
