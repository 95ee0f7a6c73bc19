/* ops.c: the CPU kernels as kernels.c's table. */
#include "../backend.h"
#include "cpu_kernels.h"

const KernelOps cpu_kernel_ops = {
    cpu_embedding_forward,
    cpu_embedding_backward,
    cpu_layernorm_forward,
    cpu_layernorm_backward,
    cpu_matmul_forward,
    cpu_matmul_backward,
    cpu_attention_forward,
    cpu_attention_backward,
    cpu_gelu_forward,
    cpu_gelu_backward,
    cpu_residual_forward,
    cpu_dropout_forward,
    cpu_crossentropy_forward,
    cpu_crossentropy_backward,
    cpu_adamw_update,
    cpu_sumsq_reduce,
    cpu_clip_scale,
    cpu_fill_zero,
    cpu_count_nonfinite,
};
