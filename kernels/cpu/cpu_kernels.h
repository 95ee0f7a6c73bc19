/* cpu_kernels.h: the CPU kernels, each a task on a CPU stream (runtime/device_cpu.h).
 * kernels.h says what each op does; kernels.c calls these through cpu_kernel_ops.
 * Each kernels/cpu/X.c holds the ops of kernels/cuda/X.cu (cpu_setup.c is the CPU's alone). */
#ifndef ZF_CPU_KERNELS_H
#define ZF_CPU_KERNELS_H

#include "../kernels.h"

/* Columns per block in the weight-gradient sums that run over rows (LayerNorm,
 * biases): two cache lines. Each thread owns blocks of columns and adds the
 * rows in order, so the sums need no atomics and do not depend on the thread
 * count. */
enum { COLUMN_BLOCK = 32 };

/* The terms of row `row`, columns [c0, c0 + width), that a column sum adds. */
typedef void (*RowTerms)(const void *ctx, int row, int c0, int width, float *terms);
/* out[c] += the sum over rows [0, N) of each row's terms, C columns, in the
 * parts of row_parts.h: the GPU's adds, in its order (column_sums.c), each
 * sum rounded to bf16 first where `rounds`, and the total stored as out is
 * held (kernels.h). Called inside a task: it runs on the stream's OpenMP team. */
void column_sums(Buf out, int N, int C, RowTerms row_terms, const void *ctx, int rounds);

/* An input's n numbers as fp32 for an op about to be enqueued: its own, or
 * where it is held in bf16 widened (exact) into the stream's room, from its
 * float `at` on, by a task before the op's (precision.c). So an op reading
 * bf16 runs its fp32 loops on the same values, and gives their bytes. A room
 * that grows moves, so an op with two inputs widens them at two places of a
 * room it has grown for both first. */
const float *cpu_fp32_of(Stream *s, ConstBuf x, size_t n, size_t at);
/* Where an op about to be enqueued writes an output's n numbers in fp32: the
 * output itself, or where it is held in bf16 the stream's room from float
 * `at` on; and once the op is enqueued, cpu_store_output stores them there
 * into the bf16 output (rounded once: exact where the op rounded them). */
float *cpu_fp32_for(Stream *s, Buf out, size_t n, size_t at);
void cpu_store_output(Stream *s, Buf out, const float *written, size_t n);
/* The floats of room n numbers held as `held` take there: n in bf16, none in fp32. */
size_t cpu_room_for(DType held, size_t n);

void cpu_embedding_forward(Stream *s, Buf out, const int *tokens, ConstBuf wte,
                           ConstBuf wpe, int B, int T, int C, DType rounding);
void cpu_embedding_backward(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head, TokenBuckets buckets,
                            int B, int T, int V, int C, DType rounding);
void cpu_layernorm_forward(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp,
                           ConstBuf weight, ConstBuf bias, int N, int C, DType rounding);
void cpu_residual_layernorm_forward(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                    ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C,
                                    DType rounding);
void cpu_layernorm_backward(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout,
                            ConstBuf inp, ConstBuf weight, const float *mean,
                            const float *rstd, int N, int C, float *scratch, DType rounding);
void cpu_matmul_forward(Stream *s, float *out, const float *inp, const float *weight, int N, int C,
                        int OC);
void cpu_matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout,
                         const float *inp, const float *weight, int N, int C, int OC);
void cpu_matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C,
                             int OC);
void cpu_matmul_backward_bf16(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                              ConstBuf weight, int N, int C, int OC);
AttentionBuffers cpu_attention_buffers(int B, int T, int C, int NH, DType products);
void cpu_attention_forward(Stream *s, Buf out, float *saved, float *scratch, ConstBuf qkv,
                           int B, int T, int C, int NH, Dropout drop, DType products, DType rounding);
void cpu_attention_backward(Stream *s, Buf dqkv, float *scratch, ConstBuf dout,
                            ConstBuf qkv, ConstBuf out, const float *saved, int B, int T, int C,
                            int NH, Dropout drop, DType products, DType rounding);
void cpu_gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding);
void cpu_gelu_backward(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                       int tanh_form, DType rounding, float *scratch);
void cpu_residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding);
void cpu_bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding);
void cpu_bias_backward(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding);
void cpu_dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding);
void cpu_crossentropy_forward_backward(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                       const int *targets, int N, int V, float dloss, DType rounding);
void cpu_mean_forward(Stream *s, float *mean, const float *x, int n);
void cpu_adamw_arena(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                     size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip);
void cpu_sumsq_reduce(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch);
void cpu_fill_zero(Stream *s, void *x, size_t bytes);
void cpu_count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch);
/* precision.c */
void cpu_round_to_bf16(Stream *s, float *out, const float *in, size_t n);
void cpu_store_bf16(Stream *s, bf16 *out, const float *in, size_t n);
void cpu_load_bf16(Stream *s, float *out, const bf16 *in, size_t n);

#endif
