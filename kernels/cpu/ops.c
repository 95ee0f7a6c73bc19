/* ops.c: the CPU kernels as kernels.c's table. */
#include "../backend.h"
#include "cpu_kernels.h"

const KernelOps cpu_kernel_ops = {
    .embedding_forward = cpu_embedding_forward,
    .embedding_backward = cpu_embedding_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .residual_layernorm_forward = cpu_residual_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .matmul_forward_bf16 = cpu_matmul_forward_bf16,  /* sgemm: each product of bf16 values exact in fp32 */
    .matmul_backward_bf16 = cpu_matmul_backward_bf16,
    .attention_buffers = cpu_attention_buffers,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .bias_forward = cpu_bias_forward,
    .bias_backward = cpu_bias_backward,
    .dropout_forward = cpu_dropout_forward,
    .crossentropy_forward_backward = cpu_crossentropy_forward_backward,
    .mean_forward = cpu_mean_forward,
    .adamw_arena = cpu_adamw_arena,
    .sumsq_reduce = cpu_sumsq_reduce,
    .fill_zero = cpu_fill_zero,
    .count_nonfinite = cpu_count_nonfinite,
    .round_to_bf16 = cpu_round_to_bf16,
    .store_bf16 = cpu_store_bf16,
    .load_bf16 = cpu_load_bf16,
};
