/* matmul.cu: Linear layers on the GPU: sgemm through cuBLAS, or for bf16
 * values (autocast's Linear) cuBLASLt's matmul on the bf16 tensor cores,
 * a bias added in its epilogue.
 *
 * cuBLAS is column-major; a row-major [rows, cols] matrix is a column-major
 * [cols, rows] one with the same leading dimension, so each product below is
 * written for the transposed, column-major view.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/gpu_libraries.h"
#include "../../runtime/world.h"
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

/* A product of bf16 values as cuBLASLt is told it, the key of its algorithm:
 * the operations, the shape and leading dimensions, the output's dtype, the
 * bias epilogue or none, and the alignment its pointers share
 * (product_alignment: 16 bytes, or less). Each follows from the
 * model's shapes, never from which buffer holds an operand (each buffer and
 * weight starts on an operand boundary), so DDP's arena and ZeRO-3's gather
 * buffers get one algorithm. Its fields are all 4 bytes: no padding, so keys
 * compare as bytes. */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldo, out_bf16, bias;
    unsigned alignment;
} ProductKey;

/* The algorithm chosen for each key, once, by the first stream to run it, and
 * kept for every stream of the process: a product's bits are its shape's. */
typedef struct {
    ProductKey key;
    cublasLtMatmulAlgo_t algo;
} ChosenAlgorithm;

static ChosenAlgorithm *chosen;
static size_t nchosen;
static pthread_mutex_t chosen_lock = PTHREAD_MUTEX_INITIALIZER;

/* cuBLASLt's choice for the key: its heuristic's best for the key's pointer
 * alignment (so no algorithm that needs more), no split of the sums over k
 * (each output's sum one sequence, whatever the GPU's SM count), and the
 * stream's fixed workspace. */
static cublasLtMatmulAlgo_t chosen_algorithm(const ProductKey *key, cublasLtHandle_t lt, cublasLtMatmulDesc_t desc,
                                             cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                             cublasLtMatrixLayout_t lo) {
    const Cublaslt *api = gpu_cublaslt();
    pthread_mutex_lock(&chosen_lock);
    for (size_t i = 0; i < nchosen; i++) {
        if (memcmp(&chosen[i].key, key, sizeof *key) != 0) continue;
        cublasLtMatmulAlgo_t algo = chosen[i].algo;
        pthread_mutex_unlock(&chosen_lock);
        return algo;
    }
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(api->preference_create(&pref));
    uint64_t workspace = DEVICE_PRODUCT_WORKSPACE_BYTES;
    uint32_t no_split = CUBLASLT_REDUCTION_SCHEME_NONE, alignment = key->alignment;
    CHECK_CUBLAS(api->preference_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    CHECK_CUBLAS(api->preference_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_split, sizeof no_split));
    const cublasLtMatmulPreferenceAttributes_t aligned[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES
    };
    for (int i = 0; i < 4; i++) CHECK_CUBLAS(api->preference_set(pref, aligned[i], &alignment, sizeof alignment));
    cublasLtMatmulHeuristicResult_t best;
    int found = 0;
    cublasStatus_t asked = api->heuristic(lt, desc, la, lb, lo, lo, pref, 1, &best, &found);
    CHECK_CUBLAS(api->preference_destroy(pref));
    if (asked != CUBLAS_STATUS_NOT_SUPPORTED) CHECK_CUBLAS(asked);
    if (asked == CUBLAS_STATUS_NOT_SUPPORTED || found < 1) {  /* either way: none fits */
        fprintf(stderr, "error: cuBLASLt has no algorithm for a bf16 product of m %d, n %d, k %d (%s output%s, "
                "pointers aligned to %u bytes)\n", key->m, key->n, key->k, key->out_bf16 ? "bf16" : "fp32",
                key->bias ? ", a bias" : "", key->alignment);
        world_abort(1);
    }
    CHECK_CUBLAS(best.state);
    ChosenAlgorithm *grown = (ChosenAlgorithm *)realloc(chosen, (nchosen + 1) * sizeof *chosen);
    if (!grown) {
        fprintf(stderr, "fatal: out of host memory keeping a cuBLASLt algorithm\n");
        abort();
    }
    chosen = grown;
    chosen[nchosen].key = *key;
    chosen[nchosen++].algo = best.algo;
    pthread_mutex_unlock(&chosen_lock);
    return best.algo;
}

/* out = op(a) @ op(b) (+ bias a row of out, or + out with accumulate),
 * column-major as cuBLAS sees it, of bf16 inputs on the tensor cores, fp32
 * accumulation: the output held as out_held says (in bf16, each number
 * rounded once from its fp32 sum, the bias added first), the bias held as
 * out is (kernels.c). */
static void gemm_bf16(Stream *s, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16 *a,
                      int lda, const bf16 *b, int ldb, void *out, DType out_held, int ldo, const void *bias,
                      int accumulate) {
    if ((uintptr_t)bias % 16 != 0) {  /* the epilogue may read it 16 bytes at a time, whatever it is told */
        fprintf(stderr, "fatal: a bf16 product's bias off a 16-byte boundary (a model's tensors start on one)\n");
        abort();
    }
    const Cublaslt *api = gpu_cublaslt();
    void *workspace;
    cublasLtHandle_t lt = cuda_blaslt(s, &workspace);
    ProductKey key = { (int)ta, (int)tb, m, n, k, lda, ldb, ldo, out_held == DTYPE_BF16, bias != NULL,
                       product_alignment(a, b, out, bias) };
    cudaDataType out_type = out_held == DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lo;
    CHECK_CUBLAS(api->desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_CUBLAS(api->desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_CUBLAS(api->desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasLtEpilogue_t epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    CHECK_CUBLAS(api->desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (bias) CHECK_CUBLAS(api->desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    CHECK_CUBLAS(api->layout_create(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda));
    CHECK_CUBLAS(api->layout_create(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb));
    CHECK_CUBLAS(api->layout_create(&lo, out_type, m, n, ldo));
    cublasLtMatmulAlgo_t algo = chosen_algorithm(&key, lt, desc, la, lb, lo);
    CHECK_CUBLAS(api->matmul(lt, desc, &ONE, a, la, b, lb, accumulate ? &ONE : &ZERO, out, lo, out, lo, &algo,
                             workspace, DEVICE_PRODUCT_WORKSPACE_BYTES, cuda_stream(s)));
    CHECK_CUBLAS(api->layout_destroy(lo));
    CHECK_CUBLAS(api->layout_destroy(lb));
    CHECK_CUBLAS(api->layout_destroy(la));
    CHECK_CUBLAS(api->desc_destroy(desc));
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
 * the forward's bias added to the fp32 sums in the product's epilogue, before
 * out is stored, so a bf16 output is rounded once. */
void cuda_matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C,
                              int OC) {
    size_t w = staged_numbers(weight, (size_t)OC * C), x = staged_numbers(inp, (size_t)N * C);
    bf16 *staging = cuda_bf16_staging(s, w + x);
    const bf16 *w16 = bf16_operand(s, weight, staging, (size_t)OC * C);
    const bf16 *x16 = bf16_operand(s, inp, staging + w, (size_t)N * C);
    gemm_bf16(s, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, w16, C, x16, C, out.data, out.dtype, OC, bias.data, 0);
}

void cuda_matmul_backward_bf16(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                               ConstBuf weight, int N, int C, int OC) {
    int to_inp = dinp.data != NULL, to_weight = dweight.data != NULL;  /* a product for each gradient asked for */
    size_t w = to_inp ? staged_numbers(weight, (size_t)OC * C) : 0;
    size_t x = to_weight ? staged_numbers(inp, (size_t)N * C) : 0, d = staged_numbers(dout, (size_t)N * OC);
    bf16 *staging = cuda_bf16_staging(s, w + x + d);
    const bf16 *d16 = bf16_operand(s, dout, staging + w + x, (size_t)N * OC);
    /* dinp = dout @ weight; dweight += dout^T @ inp in fp32, or = in bf16 */
    if (to_inp) {
        const bf16 *w16 = bf16_operand(s, weight, staging, (size_t)OC * C);
        gemm_bf16(s, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, w16, C, d16, OC, dinp.data, dinp.dtype, C, NULL, 0);
    }
    if (to_weight) {
        const bf16 *x16 = bf16_operand(s, inp, staging + w, (size_t)N * C);
        gemm_bf16(s, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, x16, C, d16, OC, dweight.data, dweight.dtype, C, NULL,
                  dweight.dtype == DTYPE_FP32);
    }
}
