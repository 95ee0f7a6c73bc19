/* matmul.cu: Linear layers on the GPU, through cuBLAS: sgemm, or for bf16
 * values (autocast's Linear) cublasGemmEx on the bf16 tensor cores.
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

/* out = op(a) @ op(b) (+ out with accumulate), column-major as cuBLAS sees it,
 * of bf16 inputs on the tensor cores, fp32 accumulation: the output held as
 * out_held says (in bf16, each number rounded once from its fp32 sum). */
static void gemm_bf16(cublasHandle_t blas, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const bf16 *a, int lda, const bf16 *b, int ldb, void *out, DType out_held, int ldo,
                      int accumulate) {
    cudaDataType out_type = out_held == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    CHECK_CUBLAS(gpu_cublas()->gemm_ex(blas, ta, tb, m, n, k, &ONE, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                                       accumulate ? &ONE : &ZERO, out, out_type, ldo, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
}

/* The staging an operand of n numbers takes: none where it is held in bf16
 * (read in place), else n on its boundary (operand_numbers). */
static size_t staged_numbers(ConstBuf x, size_t n) { return x.dtype == DTYPE_BF16 ? 0 : operand_numbers(n); }

/* An operand of n numbers of a bf16 product as 16 bits: where it is held in
 * bf16, read where it is; else stored (exact: bf16 values) into `room`. */
static const bf16 *bf16_operand(Stream *s, ConstBuf x, bf16 *room, size_t n) {
    if (x.dtype == DTYPE_BF16) return (const bf16 *)x.data;
    cuda_store_bf16(s, room, (const float *)x.data, n);
    return room;
}

/* The same products of bf16 values (kernels.h): each operand held in fp32
 * (the weight, the input, the output gradient) stored in the stream's bf16
 * staging first (exact: bf16 values), each on its boundary, then gemm_bf16;
 * the forward's bias written into every row of out first, which the
 * product then adds to in fp32 before out is stored (accumulate: beta = 1),
 * so a bf16 output is rounded once. */
void cuda_matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C,
                              int OC) {
    size_t w = staged_numbers(weight, (size_t)OC * C), x = staged_numbers(inp, (size_t)N * C);
    bf16 *staging = cuda_bf16_staging(s, w + x);
    const bf16 *w16 = bf16_operand(s, weight, staging, (size_t)OC * C);
    const bf16 *x16 = bf16_operand(s, inp, staging + w, (size_t)N * C);
    if (bias.data) cuda_bias_rows(s, out, bias, N, OC);  /* exact: held as out is, or out fp32 (kernels.c) */
    gemm_bf16(cuda_blas(s), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w16, C, x16, C, out.data, out.dtype, OC,
              bias.data != NULL);
}

void cuda_matmul_backward_bf16(Stream *s, Buf dinp, float *dweight, ConstBuf dout, ConstBuf inp,
                               ConstBuf weight, int N, int C, int OC) {
    size_t w = staged_numbers(weight, (size_t)OC * C), x = staged_numbers(inp, (size_t)N * C);
    size_t d = staged_numbers(dout, (size_t)N * OC);
    bf16 *staging = cuda_bf16_staging(s, w + x + d);
    const bf16 *w16 = bf16_operand(s, weight, staging, (size_t)OC * C);
    const bf16 *x16 = bf16_operand(s, inp, staging + w, (size_t)N * C);
    const bf16 *d16 = bf16_operand(s, dout, staging + w + x, (size_t)N * OC);
    cublasHandle_t blas = cuda_blas(s);
    /* dinp = dout @ weight, dweight += dout^T @ inp */
    gemm_bf16(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w16, C, d16, OC, dinp.data, dinp.dtype, C, 0);
    gemm_bf16(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x16, C, d16, OC, dweight, DTYPE_FP32, C, 1);
}
