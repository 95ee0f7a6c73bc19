/* device_cuda.h: what the CUDA kernels need of a CUDA stream (CUDA files only).
 *
 * Every CUDA call is checked: a failure prints what failed, where, and CUDA's
 * own words, and aborts, since a device left in an unknown state cannot be
 * trusted with a training run.
 */
#ifndef ZF_DEVICE_CUDA_H
#define ZF_DEVICE_CUDA_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Make the stream's GPU current on this thread, and return its CUDA stream. */
cudaStream_t cuda_stream(Stream *s);
/* The stream's cuBLAS handle (made on first use; fp32, or TF32 when enabled). */
cublasHandle_t cuda_blas(Stream *s);
/* The stream's cuBLASLt handle, and in *workspace its fixed workspace of
 * DEVICE_PRODUCT_WORKSPACE_BYTES (MEM_WORKING), both made on first use: the
 * bf16 products' (kernels/cuda/matmul.cu). */
cublasLtHandle_t cuda_blaslt(Stream *s, void **workspace);
/* Room for n bf16 numbers on the stream's GPU (MEM_WORKING), for the stream's
 * work only: the inputs of a product in bf16 (kernels/cuda/matmul.cu). Grown
 * once the stream's earlier work is done; the first steps grow it. */
bf16 *cuda_bf16_staging(Stream *s, size_t n);

void cuda_check(cudaError_t rc, const char *what, const char *file, int line);
void cublas_check(cublasStatus_t rc, const char *what, const char *file, int line);
/* After a kernel launch: the launch's own error, if any. */
void cuda_check_launch(const char *kernel, const char *file, int line);

#ifdef __cplusplus
}
#endif

#endif
