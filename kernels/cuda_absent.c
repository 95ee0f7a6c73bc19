/* cuda_absent.c: no CUDA kernels in a build without CUDA (make CUDA=0). */
#include "backend.h"

const KernelOps *cuda_kernel_ops(void) { return NULL; }
