/* ops.cu: the CUDA kernels as kernels.c's table. */
#include "cuda_kernels.cuh"

static const KernelOps cuda_ops = {
    .embedding_forward = cuda_embedding_forward,
    .embedding_backward = cuda_embedding_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .residual_layernorm_forward = cuda_residual_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .matmul_forward_bf16 = cuda_matmul_forward_bf16,
    .matmul_backward_bf16 = cuda_matmul_backward_bf16,
    .attention_buffers = cuda_attention_buffers,
    .attention_forward = cuda_attention_forward,
    .attention_backward = cuda_attention_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .residual_forward = cuda_residual_forward,
    .bias_forward = cuda_bias_forward,
    .bias_backward = cuda_bias_backward,
    .dropout_forward = cuda_dropout_forward,
    .crossentropy_forward_backward = cuda_crossentropy_forward_backward,
    .mean_forward = cuda_mean_forward,
    .adamw_arena = cuda_adamw_arena,
    .sumsq_reduce = cuda_sumsq_reduce,
    .fill_zero = cuda_fill_zero,
    .count_nonfinite = cuda_count_nonfinite,
    .round_to_bf16 = cuda_round_to_bf16,
    .store_bf16 = cuda_store_bf16,
    .load_bf16 = cuda_load_bf16,
};

const KernelOps *cuda_kernel_ops(void) { return &cuda_ops; }
