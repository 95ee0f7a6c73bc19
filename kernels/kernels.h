/* kernels.h: the ops of the GPT, declared once for every backend.
 *
 * Every op is enqueued on a Stream and returns at once. Shapes are explicit:
 * B batch rows, T positions, C channels, NH heads, V vocabulary, N = B*T rows.
 * Matrices are row-major; a Linear weight is [out, in] as in PyTorch.
 * Backward ops write (=) the gradients of their activation inputs, except
 * layernorm_backward, which adds its input gradient: its input is the residual
 * stream, whose gradient collects both branches. Gradients of parameters are
 * always added (+=), so they accumulate over tied uses and micro-batches.
 *
 * An op that writes activations or their gradients takes a `rounding`: under
 * autocast (DTYPE_BF16) it runs as a bf16 op runs, each number it writes
 * rounded to a bf16 value (held in fp32) in the same pass, as round_to_bf16
 * after it would; DTYPE_FP32 writes the numbers as computed.
 *
 * An input an op reads in either dtype is a ConstBuf: its numbers and how
 * they are held (the weights, which a model computes with in bf16 under
 * autocast; the block internals it keeps in bf16, read in place by the
 * backward). A bf16 input is widened (exact) as it is read, so the op
 * gives the bytes it gives the same values held in fp32. An output it
 * writes in either dtype is a Buf (the block internals the forward writes
 * where they are kept), stored as it is written: in bf16 the bytes of the
 * fp32 output stored by store_bf16.
 */
#ifndef ZF_KERNELS_H
#define ZF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../runtime/device.h"
#include "../runtime/bf16.h"
#include "adamw.h"
#include "row_parts.h"
#include "token_buckets.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Numbers an op reads, held as dtype says (runtime/bf16.h's number_at);
 * made on the host or, by the GPU's kernels, on the device. */
typedef struct {
    const void *data;
    DType dtype;
} ConstBuf;

BF16_FN ConstBuf fp32_numbers(const float *x) {
    ConstBuf b = { x, DTYPE_FP32 };
    return b;
}

BF16_FN ConstBuf bf16_numbers(const bf16 *x) {
    ConstBuf b = { x, DTYPE_BF16 };
    return b;
}

/* Numbers an op writes, held as dtype says: it computes each in fp32 and
 * stores it as number_put does (into bf16, rounded once: exact where the
 * op's rounding made it a bf16 value already). What it wrote is read as
 * the ConstBuf of the same numbers. An output may be an input of its op
 * (in place) only where both are held alike: a bf16 output over an fp32
 * input would write numbers other threads have yet to read. */
typedef struct {
    void *data;
    DType dtype;
} Buf;

BF16_FN Buf fp32_buf(float *x) {
    Buf b = { x, DTYPE_FP32 };
    return b;
}

BF16_FN Buf bf16_buf(bf16 *x) {
    Buf b = { x, DTYPE_BF16 };
    return b;
}

BF16_FN ConstBuf const_buf(Buf x) {
    ConstBuf b = { x.data, x.dtype };
    return b;
}

/* A dropout site: the mask element i is Philox(key = (seed, rank),
 * counter = (i / 4, i / 2^34, site, step)) word i % 4, kept when its uniform
 * is >= p, and kept values are scaled by 1 / (1 - p). p = 0 is the identity.
 * Where step_at is not NULL the step is read there, in the device's memory,
 * as the op runs (step is then unused): a graph's launch reads the step its
 * batch's upload brought, where a step given by value would be the capture's.
 * Being device memory, only ops enqueued on a stream ordered after its write
 * may draw masks from it, each reading it once as it starts
 * (dropout.h's dropout_resolved); host code never does. */
typedef struct {
    float p;
    uint32_t seed, rank, step, site;
    const uint32_t *step_at;
} Dropout;

/* out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:], rounded as `rounding` says; the backward adds into dwte[V,C]
 * and dwpe[T,C] as they are held: each row of dwte its token's rows of dout
 * (read as it is held; the batch's buckets, on the stream's device:
 * token_buckets.h) one by one in row order, each row of dwpe its position's
 * in batch order. In fp32 (rounding DTYPE_FP32) each row adds them into the
 * gradient one by one, a plain loop's adds. Under DTYPE_BF16 (autocast's
 * bf16 parameters) each row's sum is made from zero and rounded to bf16, a
 * row of dwte's joined first by the head's gradient of the same row (`head`,
 * [V,C] bf16 values; its data NULL: none) in a bf16 add, and then added into
 * the gradient as it is held: dwte += bf16(bf16(sum) + head), every row of
 * V (one no token holds takes the head's alone), and dwpe += bf16(sum); the
 * bytes of the sums into a zeroed buffer, round_to_bf16, residual_forward of
 * the head's and the add, in one op. */
void embedding_forward(Stream *s, Buf out, const int *tokens, ConstBuf wte, ConstBuf wpe, int B, int T, int C,
                       DType rounding);
void embedding_backward(Stream *s, Buf dwte, Buf dwpe, ConstBuf dout, ConstBuf head, TokenBuckets buckets, int B,
                        int T, int V, int C, DType rounding);

/* The backward's column sums over N rows (LayerNorm's weight gradient, a
 * bias's) in the parts of row_parts.h, the same adds on the CPU and the GPU,
 * each column's sum added into its gradient as the gradient is held: under
 * DTYPE_BF16 rounded to bf16 first (the bf16 parameter's gradient, as
 * autocast makes it), so grad + bf16(sum) into an fp32 gradient, or
 * bf16(grad + bf16(sum)) into one held in bf16 (reduced in bf16): what
 * round_to_bf16 of the sum, then its add into the gradient, give, in one op.
 * The GPU keeps each part's sums in `scratch`: column_sums_scratch_floats(N,
 * width) floats of the stream's device for rows `width` wide, allocated once
 * by the caller (no step allocates); the CPU keeps them in registers and
 * leaves scratch untouched. */
size_t column_sums_scratch_floats(int N, int width);

/* LayerNorm, eps 1e-5, and with bias (its data NULL: none) the bias after it: out =
 * (inp - mean) * rstd * weight (+ bias), rounded once as `rounding` says
 * (the bytes of bias_forward after it); saves mean and 1/std per row (fp32)
 * for the backward. The backward adds the
 * input's gradient into dinp (the residual stream's, read and written as it
 * is held), under DTYPE_BF16
 * as autocast's bf16 add of the stream's two uses: dinp = bf16(dinp +
 * bf16(this gradient)); and the weight's into dweight, and with dbias (its
 * data NULL: none) the gradient of a bias after the LayerNorm into dbias, as
 * bias_backward over dout adds it, both column sums (above) rounded as
 * `rounding` says, in one pass on a GPU (scratch:
 * column_sums_scratch_floats(N, 2C)). */
void layernorm_forward(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp, ConstBuf weight, ConstBuf bias,
                       int N, int C, DType rounding);
/* The residual add and the LayerNorm after it, in one pass on a GPU: resid =
 * a + b, then layernorm_forward of resid into out, each rounded as
 * `rounding` says: the bytes of residual_forward, then layernorm_forward. */
void residual_layernorm_forward(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C, DType rounding);
void layernorm_backward(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout, ConstBuf inp,
                        ConstBuf weight, const float *mean, const float *rstd, int N, int C, float *scratch,
                        DType rounding);

/* Where an operand of a product is held, by the GPU's staging or in place
 * (what a model keeps, a model's activations, attention's scratch), it
 * starts on a 256-byte boundary (buffers themselves begin on one), so that
 * cuBLAS, which picks its kernel by the operands' alignment too, runs the
 * same kernel, and adds in the same order, whichever buffer holds it: n
 * numbers of `bytes` each take aligned_numbers(n, bytes) of room, a bf16
 * operand's n operand_numbers(n). */
enum { OPERAND_ALIGN_BYTES = 256 };
static inline size_t aligned_numbers(size_t n, size_t bytes) {
    size_t per = OPERAND_ALIGN_BYTES / bytes;
    return (n + per - 1) / per * per;
}
static inline size_t operand_numbers(size_t n) { return aligned_numbers(n, sizeof(bf16)); }
/* The alignment a bf16 product's pointers share, as the GPU tells cuBLASLt
 * (which then picks among the algorithms that need no more): the largest
 * power of two up to 16 bytes that divides every address, a null one (no
 * bias) dividing by any. Operands on their boundaries share 16 bytes; a row
 * of an odd width may start one on less, the same in every strategy. */
static inline unsigned product_alignment(const void *a, const void *b, const void *out, const void *bias) {
    uintptr_t bits = 16 | (uintptr_t)a | (uintptr_t)b | (uintptr_t)out | (uintptr_t)bias;
    return (unsigned)(bits & (~bits + 1));  /* its lowest set bit */
}

/* out[N,OC] = inp[N,C] @ weight[OC,C]^T, through BLAS sgemm. */
void matmul_forward(Stream *s, float *out, const float *inp, const float *weight,
                    int N, int C, int OC);
void matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout,
                     const float *inp, const float *weight, int N, int C, int OC);
/* The same products of bf16 values (autocast's Linear: every input a bf16
 * value), accumulated in fp32: on the CPU through sgemm, each product of two
 * bf16 exact in fp32; on the GPU on its bf16 tensor cores, each input in 16
 * bits (read where it is held in bf16: the weight, inp, dout; else stored,
 * exact) and cuBLASLt's matmul with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F. The forward
 * adds a bias (its data NULL: none) to every row of the fp32 sums, and
 * stores each number as out is held: in bf16 (the head's logits, a kept
 * Linear's output) rounded once from the fp32 sum with its bias. A bias is
 * held as out is (a bf16 output's in bf16, as a model's compute copy holds
 * it): on the GPU cuBLASLt adds it in its epilogue, in out's dtype. The
 * backward's dinp is stored as it is held (in bf16, rounded once from its
 * fp32 sums: the model's gradients of the MLP's hidden tensor and of a
 * LayerNorm's output); its dweight held in fp32 is added into (the head's
 * sums over its chunks), one held in bf16 written, each number its fp32 sum
 * rounded once (a Linear's weight gradient as autocast makes it). A
 * gradient whose data is NULL is not made, and what only its product reads
 * (the weight for dinp, inp for dweight) may be NULL too: the head's weight
 * gradient made apart from its input's. */
void matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C, int OC);
void matmul_backward_bf16(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                          ConstBuf weight, int N, int C, int OC);

/* Causal self-attention over qkv[B,T,3C] (q, k, v side by side, heads of C/NH
 * channels); out[B,T,C] the heads side by side. `saved` is what the forward
 * keeps for the backward, and `scratch` what both use, each in floats as the
 * device's backend says (attention_buffers). Blocked as FlashAttention, with
 * one log-sum-exp kept a row of scores (B*NH*T) and no T x T matrix: the CPU
 * always, the GPU in bf16, on its tensor cores (heads of at most
 * FLASH_MAX_HEAD channels; attention_tiles.h), with B*NH*T floats of scratch.
 * In fp32 the GPU keeps the probabilities (B*NH*T*T) and uses two T x T
 * matrices of scratch (cuBLAS). products = DTYPE_BF16 (on bf16 values,
 * under autocast) rounds the dropped probabilities and the scores' gradient to
 * bf16 before their products, as FlashAttention does; every sum is fp32.
 * `rounding` rounds the op's output (out; dqkv) as it writes it, as every
 * op's. The forward reads qkv and writes out as they are held, and the
 * backward reads the forward's out too, and reads qkv, out and dout and
 * writes dqkv as they are held (bf16: what a bf16 model keeps, and its
 * attention's gradients); the GPU's cuBLAS path takes bf16 only with
 * products = DTYPE_BF16, widening qkv into its scratch, which then holds 7
 * B*T*C floats more for it, for a bf16 output (or dout) in fp32 and for a
 * bf16 dqkv made in fp32, each on a 256-byte boundary. */
typedef struct { size_t saved, scratch; } AttentionBuffers;
AttentionBuffers attention_buffers(DeviceKind kind, int B, int T, int C, int NH, DType products);
void attention_forward(Stream *s, Buf out, float *saved, float *scratch, ConstBuf qkv,
                       int B, int T, int C, int NH, Dropout drop, DType products, DType rounding);
void attention_backward(Stream *s, Buf dqkv, float *scratch, ConstBuf dout,
                        ConstBuf qkv, ConstBuf out, const float *saved, int B, int T,
                        int C, int NH, Dropout drop, DType products, DType rounding);

/* GELU: exact, x * Phi(x) with Phi through erf (nanoGPT's nn.GELU()), or with
 * tanh_form GPT-2's tanh approximation, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715
 * x^3))) (transformers' gelu_new). */
void gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding);
/* Its backward over N rows of width OC, fused with the bias gradient of the
 * Linear before it (GPT's fc): dinp = dout * GELU'(inp), rounded to bf16 where
 * rounding is DTYPE_BF16 (autocast's bf16 gradient, as round_to_bf16
 * after it), and with dbias, dbias[OC] += the column sums of dinp as written,
 * as bias_backward sums and rounds them (scratch: column_sums_scratch_floats(N,
 * OC)), in the same pass on a GPU. dbias's data NULL: none (scratch unused). dinp may be dout
 * (in place, held alike: the model's MLP keeps one hidden-sized gradient, in
 * bf16 under autocast), each number stored as dinp is held. */
void gelu_backward(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                   int tanh_form, DType rounding, float *scratch);

/* out = a + b (the residual add; its backward passes the gradient to both). */
void residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding);

/* A Linear's bias (a LayerNorm's is layernorm_forward's) after its product:
 * out[N,OC] = inp + bias[OC] on every row (bias's data NULL: none, out = inp, the
 * product's output rounded and stored as out is held), rounded as rounding
 * says; out may be inp (in place). And dbias[OC] += the column sums of
 * dout[N,OC] (read as it is held), in the parts of row_parts.h, rounded as
 * `rounding` says and added as dbias is held (the column sums, above;
 * scratch: column_sums_scratch_floats(N, OC) floats). */
void bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding);
void bias_backward(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding);

/* out = mask * inp / (1 - p); out may be inp. dinp = mask * dout / (1 - p).
 * At p = 0 each is the identity (a copy, unless in place), which rounds
 * nothing: the model's inputs to dropout are already what rounding makes. */
void dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding);
void dropout_backward(Stream *s, Buf dinp, ConstBuf dout, size_t n, Dropout drop, DType rounding);

/* The classifier's softmax, cross-entropy and gradient fused, over
 * logits[N,V] and targets[N]: losses[i] = -log softmax(logits[i])[targets[i]];
 * with dlogits (its data NULL: none), also dlogits = dloss * (softmax(logits) -
 * onehot(targets)), written; dlogits may be logits itself (in place, held
 * alike). Each row's max and sum of exponentials come from one sweep, online,
 * in an order and an arithmetic fixed by V (online_softmax.h): the same bits
 * on the CPU and the GPU. Under DTYPE_BF16 (autocast's bf16 head) each logit
 * is rounded to bf16 as it is read (exact where they are held in bf16), and
 * dlogits as it is written. */
void crossentropy_forward_backward(Stream *s, float *losses, Buf dlogits, ConstBuf logits,
                                   const int *targets, int N, int V, float dloss, DType rounding);
/* *mean = the mean of x[0, n), summed in double in an order fixed by n: in
 * order on the CPU, a fixed tree on the GPU. */
void mean_forward(Stream *s, float *mean, const float *x, int n);

/* AdamW (adamw.h) over elements [lo, lo + n) of an arena, in one launch:
 * param, grad, m and v (and copy) point at element lo of their buffers;
 * spans[0, nspans) are the arena's tensors in order (on the stream's device),
 * each decaying by hp.weight_decay or not, and an element outside them
 * (padding) is left alone. grad holds its numbers as grad_held says: fp32, or
 * bf16 (mixed precision's gradients reduced in bf16), read as fp32. With
 * copy, each new weight is also stored there in bf16 (mixed precision's
 * compute copy), in the same pass. With clip.sumsq, each gradient is scaled
 * by the clip's coefficient as it is read (adamw.h's clipped_gradient): the
 * step a clipped gradient takes, without a pass that writes the gradient. */
void adamw_arena(Stream *s, float *param, bf16 *copy, const void *grad, DType grad_held, float *m, float *v,
                 size_t lo, size_t n, const AdamWSpan *spans, int nspans, AdamWParams hp, AdamWClip clip);

/* *out = sum of x[i]^2, exactly (square_sum.h): the same bits however x is
 * cut into parts and on either backend. Summed by fixed chunks of SUMSQ_CHUNK
 * for the threads, then the chunks. scratch: sumsq_scratch_bytes(n) bytes of
 * the stream's device for the chunks' sums, allocated once by the caller. */
enum { SUMSQ_CHUNK = SQUARE_SUM_BAND_TERMS };
size_t sumsq_scratch_bytes(size_t n);
void sumsq_reduce(Stream *s, SquareSum *out, const void *x, DType held, size_t n, void *scratch);
void fill_zero(Stream *s, float *x, size_t n);
void fill_zero_bf16(Stream *s, bf16 *x, size_t n);
/* *out = how many of x[0, n) are NaN or infinite, as a float (exact up to 2^24,
 * and never 0 when one is): the finiteness check before a save or a step.
 * scratch: sumsq_scratch_bytes(n) bytes, as sumsq_reduce's. */
void count_nonfinite(Stream *s, float *out, const void *x, DType held, size_t n, void *scratch);

/* DType (runtime/bf16.h): out = in rounded to the nearest bf16 as
 * PyTorch's .to(torch.bfloat16) rounds (bit for bit, but for which NaN a NaN
 * becomes), kept in fp32 (out may be in): what autocast's bf16 tensors hold,
 * in the fp32 buffers of the ops. */
void round_to_bf16(Stream *s, float *out, const float *in, size_t n);
/* Storage in bf16 (2 bytes a number): out = in rounded as round_to_bf16
 * rounds, in 16 bits; and back, widened (exact) into fp32 for the ops. */
void store_bf16(Stream *s, bf16 *out, const float *in, size_t n);
void load_bf16(Stream *s, float *out, const bf16 *in, size_t n);

#ifdef __cplusplus
}
#endif

#endif
