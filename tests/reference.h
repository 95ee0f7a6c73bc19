/* reference.h: double-precision forwards of every op and of the whole models.
 *
 * The tests' independent reference: plain loops in double, written from the
 * definitions, sharing nothing with kernels/ but the dropout mask. Gradients of
 * the float kernels are checked against central finite differences of these.
 */
#ifndef ZF_REFERENCE_H
#define ZF_REFERENCE_H

#include <stddef.h>

#include "../kernels/kernels.h"
#include "../model/gpt.h"

void ref_embedding(double *out, const int *tokens, const double *wte, const double *wpe, int B, int T, int C);
void ref_layernorm(double *out, const double *inp, const double *weight, int N, int C);
void ref_matmul(double *out, const double *inp, const double *weight, int N, int C, int OC);
/* Causal attention over qkv[B,T,3C]; drop.p > 0 applies the kernels' mask. */
/* lse, where not NULL, gets each row's log-sum-exp of scores [B,NH,T]. */
void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int C, int NH, Dropout drop);
/* The same attention as the ops run it in bf16 (DTYPE_BF16), forward and
 * backward, written out in double: the weights (each key's exp(score - max)
 * by its dropout mask, the max the row's running one over the key blocks of
 * FLASH_ROWS seen so far) rounded to bf16 before their product with v; in the
 * backward the dropped probabilities exp(score - lse) by the mask and the
 * scores' gradient p (dp mask - delta) each rounded to bf16 before their
 * products. out[B,T,C]; dqkv[B,T,3C] from dout[B,T,C]. */
void ref_attention_bf16(double *out, double *dqkv, const double *qkv, const double *dout, int B, int T, int C,
                        int NH, Dropout drop);
/* Exact GELU, or with tanh_form GPT-2's tanh approximation. */
void ref_gelu(double *out, const double *inp, size_t n, int tanh_form);
void ref_dropout(double *out, const double *inp, size_t n, Dropout drop);
/* Mean cross-entropy of softmax(logits) against targets. */
double ref_crossentropy(const double *logits, const int *targets, int N, int V);
/* One row's: its loss, and with dlogit (else NULL) d(loss)/d(logit) = softmax - onehot. */
double ref_crossentropy_row(const double *logit, int target, int V, double *dlogit);
/* The sum of squares as kernels/square_sum.h defines it, bit by bit: each
 * x * x rounded to a float, dropped below 2^-63, its 24-bit mantissa added
 * into a 256-bit integer (four words, least significant first) at bit
 * exponent + 86, one set bit at a time with its carries; infinite (only
 * the top bit set) where a square is not finite. */
SquareSum ref_square_sum(const float *x, size_t n);
/* The GPT's mean loss in double from params in the arena layout, with the
 * model's dropout sites (0 after the embeddings; 1 + 3l attention weights, 2 + 3l
 * and 3 + 3l the block's output projections) keyed by drop's p, seed, rank, step. */
double ref_gpt_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                    const int *tokens, const int *targets, int B, int T, Dropout drop);
/* The loss of either model: the GPT's above, or the MLP's (model/mlp.h). */
double ref_model_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                      const int *tokens, const int *targets, int B, int T, Dropout drop);

#endif
