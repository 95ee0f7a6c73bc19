/* backend.h: what a backend of kernels.h implements (for backends only).
 *
 * kernels.c sends each op to the table of the stream's device kind. A backend
 * implements every op but dropout's backward (the forward applied to the
 * gradient) and dropout at p = 0 (a copy), which kernels.c does for all.
 */
#ifndef ZF_KERNELS_BACKEND_H
#define ZF_KERNELS_BACKEND_H

#include "kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    void (*embedding_forward)(Stream *s, Buf out, const int *tokens, ConstBuf wte,
                              ConstBuf wpe, int B, int T, int C, DType rounding);
    void (*embedding_backward)(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head,
                               TokenBuckets buckets, int B, int T, int V, int C, DType rounding);
    void (*layernorm_forward)(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp,
                              ConstBuf weight, ConstBuf bias, int N, int C, DType rounding);
    void (*residual_layernorm_forward)(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                       ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C,
                                       DType rounding);
    void (*layernorm_backward)(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout,
                               ConstBuf inp, ConstBuf weight, const float *mean,
                               const float *rstd, int N, int C, float *scratch, DType rounding);
    void (*matmul_forward)(Stream *s, float *out, const float *inp, const float *weight, int N,
                           int C, int OC);
    void (*matmul_backward)(Stream *s, float *dinp, float *dweight, const float *dout,
                            const float *inp, const float *weight, int N, int C, int OC);
    void (*matmul_forward_bf16)(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C,
                                int OC);
    void (*matmul_backward_bf16)(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                                 ConstBuf weight, int N, int C, int OC);
    AttentionBuffers (*attention_buffers)(int B, int T, int C, int NH, DType products);
    void (*attention_forward)(Stream *s, Buf out, float *saved, float *scratch, ConstBuf qkv,
                              int B, int T, int C, int NH, Dropout drop, DType products, DType rounding);
    void (*attention_backward)(Stream *s, Buf dqkv, float *scratch, ConstBuf dout,
                               ConstBuf qkv, ConstBuf out, const float *saved, int B,
                               int T, int C, int NH, Dropout drop, DType products, DType rounding);
    void (*gelu_forward)(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding);
    void (*gelu_backward)(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                          int tanh_form, DType rounding, float *scratch);
    void (*residual_forward)(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding);
    void (*bias_forward)(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding);
    void (*bias_backward)(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding);
    void (*dropout_forward)(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding);
    void (*crossentropy_forward_backward)(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                          const int *targets, int N, int V, float dloss, DType rounding);
    void (*mean_forward)(Stream *s, float *mean, const float *x, int n);
    void (*adamw_arena)(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                        size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip);
    void (*sumsq_reduce)(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch);
    void (*fill_zero)(Stream *s, void *x, size_t bytes);
    void (*count_nonfinite)(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch);
    void (*round_to_bf16)(Stream *s, float *out, const float *in, size_t n);
    void (*store_bf16)(Stream *s, bf16 *out, const float *in, size_t n);
    void (*load_bf16)(Stream *s, float *out, const bf16 *in, size_t n);
} KernelOps;

extern const KernelOps cpu_kernel_ops;
/* The CUDA kernels; NULL in a build without CUDA (kernels/cuda_absent.c). */
const KernelOps *cuda_kernel_ops(void);

#ifdef __cplusplus
}
#endif

#endif
