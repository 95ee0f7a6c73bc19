/* kernels.c: every op of kernels.h, sent to the kernels of its stream's device,
 * each one span of a traced stream (runtime/trace.h) and of a profiled one
 * (runtime/profile.h), named after the op. */
#include <stdio.h>
#include <stdlib.h>

#include "../runtime/profile.h"
#include "../runtime/trace.h"
#include "backend.h"

static const KernelOps *backend_of_kind(DeviceKind kind) {
    if (kind == DEVICE_CPU) return &cpu_kernel_ops;
    const KernelOps *ops = cuda_kernel_ops();
    if (!ops) {
        fprintf(stderr, "fatal: a GPU stream in a build without CUDA\n");
        abort();
    }
    return ops;
}

static const KernelOps *backend(Stream *s) { return backend_of_kind(device_kind(stream_device(s))); }

static void op_begin(Stream *s, const char *name) {
    trace_begin(s, name, -1);
    profile_begin(s, name);
}

static void op_end(Stream *s) {
    profile_end(s);
    trace_end(s);
}

void embedding_forward(Stream *s, Buf out, const int *tokens, ConstBuf wte, ConstBuf wpe,
                       int B, int T, int C, DType rounding) {
    op_begin(s, "embedding_forward");
    backend(s)->embedding_forward(s, out, tokens, wte, wpe, B, T, C, rounding);
    op_end(s);
}

void embedding_backward(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head, TokenBuckets buckets, int B,
                        int T, int V, int C, DType rounding) {
    op_begin(s, "embedding_backward");
    backend(s)->embedding_backward(s, dwte, dwpe, dout, head, buckets, B, T, V, C, rounding);
    op_end(s);
}

void layernorm_forward(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp,
                       ConstBuf weight, ConstBuf bias, int N, int C, DType rounding) {
    op_begin(s, "layernorm_forward");
    backend(s)->layernorm_forward(s, out, mean, rstd, inp, weight, bias, N, C, rounding);
    op_end(s);
}

void residual_layernorm_forward(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C,
                                DType rounding) {
    op_begin(s, "residual_layernorm_forward");
    backend(s)->residual_layernorm_forward(s, resid, out, mean, rstd, a, b, weight, bias, N, C, rounding);
    op_end(s);
}

size_t column_sums_scratch_floats(int N, int width) { return (size_t)row_parts(N) * (size_t)width; }

void layernorm_backward(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout, ConstBuf inp,
                        ConstBuf weight, const float *mean, const float *rstd, int N, int C, float *scratch,
                        DType rounding) {
    op_begin(s, "layernorm_backward");
    backend(s)->layernorm_backward(s, dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, scratch, rounding);
    op_end(s);
}

void matmul_forward(Stream *s, float *out, const float *inp, const float *weight, int N, int C,
                    int OC) {
    op_begin(s, "matmul_forward");
    backend(s)->matmul_forward(s, out, inp, weight, N, C, OC);
    op_end(s);
}

void matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    op_begin(s, "matmul_backward");
    backend(s)->matmul_backward(s, dinp, dweight, dout, inp, weight, N, C, OC);
    op_end(s);
}

void matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C, int OC) {
    if (bias.data && bias.dtype != out.dtype) {
        fprintf(stderr, "fatal: matmul_forward_bf16: a bias held in %s for an output in %s\n",
                DTYPE_TRAITS[bias.dtype].name, DTYPE_TRAITS[out.dtype].name);
        abort();
    }
    op_begin(s, "matmul_forward");
    backend(s)->matmul_forward_bf16(s, out, inp, weight, bias, N, C, OC);
    op_end(s);
}

void matmul_backward_bf16(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                          ConstBuf weight, int N, int C, int OC) {
    op_begin(s, "matmul_backward");
    backend(s)->matmul_backward_bf16(s, dinp, dweight, dout, inp, weight, N, C, OC);
    op_end(s);
}

AttentionBuffers attention_buffers(DeviceKind kind, int B, int T, int C, int NH, DType products) {
    return backend_of_kind(kind)->attention_buffers(B, T, C, NH, products);
}

void attention_forward(Stream *s, Buf out, float *saved, float *scratch, ConstBuf qkv, int B,
                       int T, int C, int NH, Dropout drop, DType products, DType rounding) {
    op_begin(s, "attention_forward");
    backend(s)->attention_forward(s, out, saved, scratch, qkv, B, T, C, NH, drop, products, rounding);
    op_end(s);
}

void attention_backward(Stream *s, Buf dqkv, float *scratch, ConstBuf dout, ConstBuf qkv,
                        ConstBuf out, const float *saved, int B, int T, int C, int NH, Dropout drop,
                        DType products, DType rounding) {
    op_begin(s, "attention_backward");
    backend(s)->attention_backward(s, dqkv, scratch, dout, qkv, out, saved, B, T, C, NH, drop, products, rounding);
    op_end(s);
}

void gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding) {
    op_begin(s, "gelu_forward");
    backend(s)->gelu_forward(s, out, inp, n, tanh_form, rounding);
    op_end(s);
}

void gelu_backward(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                   int tanh_form, DType rounding, float *scratch) {
    op_begin(s, "gelu_backward");
    backend(s)->gelu_backward(s, dinp, dbias, inp, dout, N, OC, tanh_form, rounding, scratch);
    op_end(s);
}

void bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding) {
    op_begin(s, "bias_forward");
    backend(s)->bias_forward(s, out, inp, bias, N, OC, rounding);
    op_end(s);
}

void bias_backward(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding) {
    op_begin(s, "bias_backward");
    backend(s)->bias_backward(s, dbias, dout, N, OC, scratch, rounding);
    op_end(s);
}

void residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding) {
    op_begin(s, "residual_forward");
    backend(s)->residual_forward(s, out, a, b, n, rounding);
    op_end(s);
}

/* At p = 0 a copy, unless in place (or from one dtype to the other). */
static void dropout_apply(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding) {
    if (drop.p > 0.0f || out.dtype != inp.dtype) backend(s)->dropout_forward(s, out, inp, n, drop, rounding);
    else if (out.data != inp.data) stream_copy(s, out.data, inp.data, n * number_bytes(out.dtype));
}

void dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding) {
    op_begin(s, "dropout_forward");
    dropout_apply(s, out, inp, n, drop, rounding);
    op_end(s);
}

/* The backward multiplies by the same mask: it is the forward applied to dout. */
void dropout_backward(Stream *s, Buf dinp, ConstBuf dout, size_t n, Dropout drop, DType rounding) {
    op_begin(s, "dropout_backward");
    dropout_apply(s, dinp, dout, n, drop, rounding);
    op_end(s);
}

void crossentropy_forward_backward(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                   const int *targets, int N, int V, float dloss, DType rounding) {
    op_begin(s, "crossentropy_forward_backward");
    backend(s)->crossentropy_forward_backward(s, losses, dlogits, logits, targets, N, V, dloss, rounding);
    op_end(s);
}

void mean_forward(Stream *s, float *mean, const float *x, int n) {
    op_begin(s, "mean_forward");
    backend(s)->mean_forward(s, mean, x, n);
    op_end(s);
}

void adamw_arena(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                 size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip) {
    op_begin(s, "adamw_arena");
    backend(s)->adamw_arena(s, param, copy, grad, grad_held, m, v, lo, n, spans, nspans, hp, clip);
    op_end(s);
}

size_t sumsq_scratch_bytes(size_t n) { return (n ? (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK : 1) * sizeof(SquareSum); }

void sumsq_reduce(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch) {
    op_begin(s, "sumsq_reduce");
    backend(s)->sumsq_reduce(s, out, x, held, n, scratch);
    op_end(s);
}

void fill_zero(Stream *s, float *x, size_t n) {
    op_begin(s, "fill_zero");
    backend(s)->fill_zero(s, x, n * sizeof(float));
    op_end(s);
}

void fill_zero_bf16(Stream *s, bf16 *x, size_t n) {
    op_begin(s, "fill_zero");
    backend(s)->fill_zero(s, x, n * sizeof(bf16));
    op_end(s);
}

void count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch) {
    backend(s)->count_nonfinite(s, out, x, held, n, scratch);
}

void round_to_bf16(Stream *s, float *out, const float *in, size_t n) {
    op_begin(s, "round_to_bf16");
    backend(s)->round_to_bf16(s, out, in, n);
    op_end(s);
}

void store_bf16(Stream *s, bf16 *out, const float *in, size_t n) {
    op_begin(s, "store_bf16");
    backend(s)->store_bf16(s, out, in, n);
    op_end(s);
}

void load_bf16(Stream *s, float *out, const bf16 *in, size_t n) {
    op_begin(s, "load_bf16");
    backend(s)->load_bf16(s, out, in, n);
    op_end(s);
}

