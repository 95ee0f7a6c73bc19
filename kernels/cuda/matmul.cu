/* matmul.cu: Linear layers on the GPU, through cuBLAS.
 *
 * cuBLAS is column-major; a row-major [rows, cols] matrix is a column-major
 * [cols, rows] one with the same leading dimension, so each product below is
 * written for the transposed, column-major view.
 */
#include "../../runtime/gpu_libraries.h"
#include "cuda_kernels.cuh"

static const float ONE = 1.0f, ZERO = 0.0f;

/* out[N,OC] = inp[N,C] @ weight[OC,C]^T */
void cuda_matmul_forward(Stream *s, float *out, const float *inp, const float *weight, int N, int C, int OC) {
    CHECK_CUBLAS(gpu_cublas()->sgemm(cuda_blas(s), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &ONE, weight, C, inp, C, &ZERO,
                             out, OC));
}

void cuda_matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC) {
    cublasHandle_t blas = cuda_blas(s);
    /* dinp[N,C] = dout[N,OC] @ weight[OC,C] */
    CHECK_CUBLAS(gpu_cublas()->sgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &ONE, weight, C, dout, OC, &ZERO, dinp, C));
    /* dweight[OC,C] += dout[N,OC]^T @ inp[N,C] */
    CHECK_CUBLAS(gpu_cublas()->sgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &ONE, inp, C, dout, OC, &ONE, dweight, C));
}
