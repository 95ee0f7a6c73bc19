/* kernels.c: every op of kernels.h, sent to the kernels of its stream's device. */
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"

static const KernelOps *backend(Stream *s) {
    if (device_kind(stream_device(s)) == DEVICE_CPU) return &cpu_kernel_ops;
    const KernelOps *ops = cuda_kernel_ops();
    if (!ops) {
        fprintf(stderr, "fatal: a GPU stream in a build without CUDA\n");
        abort();
    }
    return ops;
}

void embedding_forward(Stream *s, float *out, const int *tokens, const float *wte, const float *wpe,
                       int B, int T, int C) {
    backend(s)->embedding_forward(s, out, tokens, wte, wpe, B, T, C);
}

void embedding_backward(Stream *s, float *dwte, float *dwpe, const float *dout, const int *tokens,
                        int B, int T, int C, int V) {
    backend(s)->embedding_backward(s, dwte, dwpe, dout, tokens, B, T, C, V);
}

void layernorm_forward(Stream *s, float *out, float *mean, float *rstd, const float *inp,
                       const float *weight, int N, int C) {
    backend(s)->layernorm_forward(s, out, mean, rstd, inp, weight, N, C);
}

void layernorm_backward(Stream *s, float *dinp, float *dweight, const float *dout, const float *inp,
                        const float *weight, const float *mean, const float *rstd, int N, int C) {
    backend(s)->layernorm_backward(s, dinp, dweight, dout, inp, weight, mean, rstd, N, C);
}

void matmul_forward(Stream *s, float *out, const float *inp, const float *weight, int N, int C,
                    int OC) {
    backend(s)->matmul_forward(s, out, inp, weight, N, C, OC);
}

void matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout, const float *inp,
                     const float *weight, int N, int C, int OC) {
    backend(s)->matmul_backward(s, dinp, dweight, dout, inp, weight, N, C, OC);
}

void attention_forward(Stream *s, float *out, float *att, float *scratch, const float *qkv, int B,
                       int T, int C, int NH, Dropout drop) {
    backend(s)->attention_forward(s, out, att, scratch, qkv, B, T, C, NH, drop);
}

void attention_backward(Stream *s, float *dqkv, float *scratch, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH, Dropout drop) {
    backend(s)->attention_backward(s, dqkv, scratch, dout, qkv, att, B, T, C, NH, drop);
}

void gelu_forward(Stream *s, float *out, const float *inp, size_t n) {
    backend(s)->gelu_forward(s, out, inp, n);
}

void gelu_backward(Stream *s, float *dinp, const float *inp, const float *dout, size_t n) {
    backend(s)->gelu_backward(s, dinp, inp, dout, n);
}

void residual_forward(Stream *s, float *out, const float *a, const float *b, size_t n) {
    backend(s)->residual_forward(s, out, a, b, n);
}

void dropout_forward(Stream *s, float *out, const float *inp, size_t n, Dropout drop) {
    if (drop.p <= 0.0f) {
        if (out != inp) stream_copy(s, out, inp, n * sizeof(float));
        return;
    }
    backend(s)->dropout_forward(s, out, inp, n, drop);
}

/* The backward multiplies by the same mask: it is the forward applied to dout. */
void dropout_backward(Stream *s, float *dinp, const float *dout, size_t n, Dropout drop) {
    dropout_forward(s, dinp, dout, n, drop);
}

void crossentropy_forward(Stream *s, float *mean_loss, float *losses, float *probs,
                          const float *logits, const int *targets, int N, int V) {
    backend(s)->crossentropy_forward(s, mean_loss, losses, probs, logits, targets, N, V);
}

void crossentropy_backward(Stream *s, float *dlogits, const float *probs, const int *targets, int N,
                           int V, float dloss) {
    backend(s)->crossentropy_backward(s, dlogits, probs, targets, N, V, dloss);
}

void adamw_update(Stream *s, float *param, const float *grad, float *m, float *v, size_t n,
                  AdamWParams hp) {
    backend(s)->adamw_update(s, param, grad, m, v, n, hp);
}

void sumsq_reduce(Stream *s, float *out, const float *x, size_t n) {
    backend(s)->sumsq_reduce(s, out, x, n);
}

void clip_scale(Stream *s, float *x, size_t n, const float *sumsq, int nparts, float max_norm) {
    backend(s)->clip_scale(s, x, n, sumsq, nparts, max_norm);
}

void fill_zero(Stream *s, float *x, size_t n) {
    backend(s)->fill_zero(s, x, n);
}

void count_nonfinite(Stream *s, float *out, const float *x, size_t n) {
    backend(s)->count_nonfinite(s, out, x, n);
}
