/* vector_math.h: vector erff, expf and tanhf for `omp simd` loops.
 *
 * glibc's libmvec (2.35+) has AVX2 and AVX-512 versions of erff, expf and tanhf,
 * accurate to a few ulp. math.h declares them only under -ffast-math, which we
 * do not want (it would let the compiler reorder every sum), so the kernels that
 * need them include this instead. Link with -lmvec.
 */
#ifndef ZF_VECTOR_MATH_H
#define ZF_VECTOR_MATH_H

#include <math.h>

#pragma omp declare simd notinbranch
float erff(float x);
#pragma omp declare simd notinbranch
float expf(float x);
#pragma omp declare simd notinbranch
float tanhf(float x);

#endif
