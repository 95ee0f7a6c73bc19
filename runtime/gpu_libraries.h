/* gpu_libraries.h: cuBLAS, cuBLASLt and NCCL, loaded at their first use (CUDA builds only).
 *
 * Why: a binary linked against them does not start where they are missing,
 * and most runs need neither (no GPU: the CPU trains; one GPU: no NCCL). The
 * driver is loaded this way already (cudart, linked in, opens libcuda.so.1).
 * Loaded on first use, from the loader's path (LD_LIBRARY_PATH, then the build
 * toolkit's folder), the binaries start on a machine with a driver and no
 * toolkit (cuBLAS and NCCL from a Python venv) or with neither (the CPU), and
 * the lines that describe a run say which file each library came from.
 *
 * Contract: gpu_cublas(), gpu_cublaslt() and gpu_nccl() give the functions this project calls,
 * loading the library on the first call (once, from any thread); a library or
 * one of its functions that cannot be loaded ends the run with one line naming
 * the file and the loader's reason (dlerror), exit 1. gpu_library_files()
 * says which files are loaded so far.
 */
#ifndef ZF_GPU_LIBRARIES_H
#define ZF_GPU_LIBRARIES_H

#include <cublasLt.h>
#include <cublas_v2.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The cuBLAS functions called here, by the names of cublas_v2.h. */
typedef struct {
    __typeof__(cublasCreate_v2) *create;
    __typeof__(cublasDestroy_v2) *destroy;
    __typeof__(cublasSetStream_v2) *set_stream;
    __typeof__(cublasSetMathMode) *set_math_mode;
    __typeof__(cublasSgemm_v2) *sgemm;
    __typeof__(cublasSgemmStridedBatched) *sgemm_strided_batched;
} Cublas;

/* The cuBLASLt functions called here (the bf16 products: kernels/cuda/matmul.cu). */
typedef struct {
    __typeof__(cublasLtCreate) *create;
    __typeof__(cublasLtDestroy) *destroy;
    __typeof__(cublasLtMatmulDescCreate) *desc_create;
    __typeof__(cublasLtMatmulDescDestroy) *desc_destroy;
    __typeof__(cublasLtMatmulDescSetAttribute) *desc_set;
    __typeof__(cublasLtMatrixLayoutCreate) *layout_create;
    __typeof__(cublasLtMatrixLayoutDestroy) *layout_destroy;
    __typeof__(cublasLtMatmulPreferenceCreate) *preference_create;
    __typeof__(cublasLtMatmulPreferenceDestroy) *preference_destroy;
    __typeof__(cublasLtMatmulPreferenceSetAttribute) *preference_set;
    __typeof__(cublasLtMatmulAlgoGetHeuristic) *heuristic;
    __typeof__(cublasLtMatmul) *matmul;
} Cublaslt;

/* The NCCL functions called here. */
typedef struct {
    __typeof__(ncclGetVersion) *get_version;
    __typeof__(ncclGetUniqueId) *get_unique_id;
    __typeof__(ncclCommInitRank) *comm_init_rank;
    __typeof__(ncclCommDestroy) *comm_destroy;
    __typeof__(ncclCommAbort) *comm_abort;
    __typeof__(ncclCommGetAsyncError) *comm_get_async_error;
    __typeof__(ncclGetErrorString) *get_error_string;
    __typeof__(ncclGetLastError) *get_last_error;
    __typeof__(ncclGroupStart) *group_start;
    __typeof__(ncclGroupEnd) *group_end;
    __typeof__(ncclSend) *send;
    __typeof__(ncclRecv) *recv;
    __typeof__(ncclReduceScatter) *reduce_scatter;
    __typeof__(ncclAllGather) *all_gather;
} Nccl;

const Cublas *gpu_cublas(void);
const Cublaslt *gpu_cublaslt(void);
const Nccl *gpu_nccl(void);
/* "cuBLAS from PATH, NCCL from PATH" for those loaded, or "cuBLAS, cuBLASLt and NCCL not loaded". */
void gpu_library_files(char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
