/* ops.cu: the CUDA kernels as kernels.c's table. */
#include "cuda_kernels.cuh"

static const KernelOps cuda_ops = {
    cuda_embedding_forward,
    cuda_embedding_backward,
    cuda_layernorm_forward,
    cuda_layernorm_backward,
    cuda_matmul_forward,
    cuda_matmul_backward,
    cuda_attention_forward,
    cuda_attention_backward,
    cuda_gelu_forward,
    cuda_gelu_backward,
    cuda_residual_forward,
    cuda_dropout_forward,
    cuda_crossentropy_forward,
    cuda_crossentropy_backward,
    cuda_adamw_update,
    cuda_sumsq_reduce,
    cuda_clip_scale,
    cuda_fill_zero,
    cuda_count_nonfinite,
};

const KernelOps *cuda_kernel_ops(void) { return &cuda_ops; }
