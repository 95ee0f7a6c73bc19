/* gpt.h: nanoGPT's GPT (its char configs, and GPT-2's with biases): layout, forward, backward, on the Model base.
 *
 * Unit 0 is the root (token embedding wte, tied to the output head; position
 * embedding wpe; final LayerNorm ln_f); then transformer block l is unit 1 + l,
 * or two or four units (model.h's UnitPolicy).
 * Tensor names are nanoGPT's, so weights move to and from PyTorch unchanged.
 * The weights, gradients and hooks a strategy sees are the base's
 * (model/model.h).
 */
#ifndef ZF_GPT_H
#define ZF_GPT_H

#include <stdint.h>

#include "../kernels/kernels.h"
#include "model.h"
/* Forward activations (kept for the backward) and the backward's workspace,
 * reused by every block. One allocation; see gpt.c for the size table. */
typedef struct {
    float *encoded;                          /* [B,T,C] embeddings after dropout (the residual stream: in bf16
                                                under autocast, two numbers a float; gpt.c's stream_after) */
    float *ln1, *ln1_mean, *ln1_rstd;        /* [L,B,T,C], [L,B,T] */
    float *qkv;                              /* [L,B,T,3C] */
    float *att_saved;                        /* [L, attention_buffers().saved]: a log-sum-exp a row [B,NH,T]
                                                (the GPU's cuBLAS path, for widths without tiles: the
                                                probabilities [B,NH,T,T]) */
    float *atty;                             /* [L,B,T,C] attention output */
    float *attproj;                          /* [L,B,T,C] after dropout (one block's in bf16 under autocast,
                                                two numbers a float: gpt.c's held_numbers) */
    float *resid2;                           /* [L,B,T,C] */
    float *ln2, *ln2_mean, *ln2_rstd;        /* [L,B,T,C], [L,B,T] */
    float *fch, *fch_gelu;                   /* [L,B,T,4C] */
    float *fcproj;                           /* [L,B,T,C] after dropout, held as attproj is */
    float *resid3;                           /* [L,B,T,C], held as encoded is */
    float *lnf, *lnf_mean, *lnf_rstd;        /* [B,T,C] (in bf16 under autocast: held_numbers), [B,T] */
    float *logits;                           /* [R,V]: a chunk of R = classifier_rows rows (bf16 under
                                                autocast, two numbers a float: gpt.c's held_numbers), its dlogits
                                                in place in the backward; or each row's last position
                                                (generation, fp32); under autocast, once the head is done over
                                                chunks, the head's gradient [V,C] in bf16 until the embeddings'
                                                joins it */
    float *losses;                           /* [B,T] */
    float *mean_loss;                        /* [1] */
    float *dresid, *dln, *dproj, *datty;     /* [B,T,C], each in bf16 under autocast (held_numbers) */
    float *dwide;                            /* the backward's wide gradients, one at a time: a block's MLP's
                                                hidden one [B,T,4C] (dfch, through the GELU in place), then its
                                                attention's [B,T,3C] (dqkv), each in bf16 under autocast
                                                (held_numbers); under autocast also the head's fp32 sums [V,C] before
                                                the blocks, or with one chunk its bf16 gradient after them */
    float *att_scratch;                      /* attention_buffers().scratch: none on the CPU */
    /* bf16 only (none in fp32). The weights the model computes with, in bf16
     * (two numbers a float), copied as each unit is entered (gpt.c:
     * compute_weights), each tensor on its operand boundary: the root's, and
     * the unit's in hand (a whole block's, the most any unit policy puts in
     * one); none with weights_in_place. A block matrix's gradient made in bf16 by its product before it
     * is added into the gradient as held ([4C, C], the largest; none with grads_fresh). */
    float *root_bf16, *unit_bf16, *dweight_bf16;
    /* bf16: what each block's backward reads of its internals (ln1, qkv,
     * atty, resid2, ln2, fch, fch_gelu: [L,B,T,15C], with recompute [1,B,T,15C],
     * each tensor padded to operand_numbers; 11C with recompute_gelu, which
     * makes fch_gelu again, 13C with recompute_norms, which makes ln1 and
     * ln2 again), kept in bf16, two numbers to a float of the allocation,
     * and read there by the backward; the internals above are then one
     * block's, where the forward works (and the made-again ones are made
     * again, in bf16), but for those their ops write where they are kept
     * (none): ln1, qkv, atty, resid2, ln2, fch and fch_gelu. */
    float *kept_storage;
} Activations;

enum { ACTIVATION_TENSORS = 32 };
/* The classifier's logits at once, at most 2^27 (512 MiB in fp32): past it,
 * rows in equal chunks, so that a vocabulary of 50304 costs a chunk, not B x
 * T x V numbers (GPT-2's 12 x 1024 rows: five chunks of 2458, 494 MB in fp32,
 * 247 MB in bf16), and each chunk is thousands of rows, a launch that fills
 * the GPU. */
enum { CLASSIFIER_CHUNK_FLOATS = 1 << 27 };

typedef struct {
    Model base;                    /* first: a GPT * is a Model * */
    int max_B, max_T;              /* activation capacity */
    int recompute;                 /* 1: keep only the blocks' outputs; each block's forward runs again in its backward */
    int recompute_gelu;            /* 1: fch_gelu one block's, GELU run again before the MLP's backward */
    int recompute_norms;           /* 1: ln1, ln2 one block's, each LayerNorm run again before its Linear's backward */
    DType precision;               /* DTYPE_BF16: a bf16 copy of the model under torch.autocast (gpt.c) */
    int weights_in_place;          /* 1: that copy read where the strategy holds it (ComputePolicy) */
    int grads_fresh;               /* 1: each unit's gradient zero as its backward begins, in bf16 (ComputePolicy) */
    int classifier_rows;           /* rows of logits at once (gpt.c: classifier_rows; fewer may be set) */
    int head_sums_fit;             /* 1: room for the head's gradient summed over chunks (gpt.c) */
    Activations acts;
    /* the shape and step of the last forward */
    int B, T;
    uint32_t step;
    int training;
} GPT;

/* NULL when the config is usable, else a message naming what is wrong. */
const char *gpt_config_error(const ModelConfig *cfg);
/* The unit-by-unit layout with nanoGPT's names; units padded to shard_multiple:
 * whole blocks (gpt_layout), or the units of a policy. */
void gpt_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout);
void gpt_layout_units(const ModelConfig *cfg, UnitPolicy unit, int shard_multiple, ArenaLayout *layout);

/* A GPT over a layout of cfg (gpt_layout_units, in any policy's units; the
 * model copies it), with activations for up to max_B x max_T and no arenas: own them with model_own_weights / model_own_grads, free with
 * model_destroy. recompute = 1 (with whole-block units only: the recomputed
 * forward reads the whole block) keeps each block's input and one block's
 * internals, and runs each block's forward again just before its backward,
 * after its before_backward hook: the same bits, less memory;
 * recompute_gelu = 1 and recompute_norms = 1 make only GELU's output and the
 * LayerNorms' again (any unit policy), the same bits. In precision
 * DTYPE_BF16 it computes as a bf16 copy of nanoGPT's model under
 * torch.autocast(device_type, dtype=torch.bfloat16), FSDP's
 * MixedPrecision(param_dtype=bfloat16): it reads every weight through a copy
 * rounded to bf16 as it enters the weight's unit; each Linear (the
 * attention's and the MLP's, and the head) takes its input rounded to bf16,
 * accumulates in fp32 and rounds its output; the embeddings' sum, the
 * residual stream, attention, GELU and dropout are rounded after each op;
 * LayerNorm, softmax and the loss compute in fp32 on bf16 values; each
 * gradient into a bf16 tensor is rounded, and every parameter's is made in
 * bf16 before it adds into its fp32 gradient (or its bf16 one, where the
 * strategy holds the gradients in bf16). What the backward reads of each
 * block's internals is kept in bf16 (half the bytes, as autocast saves bf16
 * tensors), written there by the forward's ops and read there by the
 * backward's; the other ops work in fp32 buffers of bf16 values.
 * The classifier (logits, softmax, loss) runs classifier_rows rows at a
 * time, one chunk of logits ever held. In training it runs once, in the
 * backward: each chunk's logits, loss and gradient at once (the backward
 * knows dloss, and the root's gradient is the model's from its
 * before_backward hook), so a training forward leaves mean_loss to the
 * backward that follows it; a forward with targets but not training
 * computes the loss itself. A forward without targets (generation) computes
 * the logits of each row's last position only. */
GPT *gpt_create(const ModelConfig *cfg, const ArenaLayout *layout, ComputePolicy compute, Device *dev, Stream *stream,
                int max_B, int max_T);
/* The floats of gpt_create's activations for max_B x max_T on a device of
 * that kind (its one MEM_ACTIVATIONS allocation), without allocating them. */
size_t gpt_activation_floats(const ModelConfig *cfg, DeviceKind kind, ComputePolicy compute, int max_B, int max_T);
/* The bytes a bf16 model's compute stream holds for its ops' operands, at
 * most (MEM_WORKING, made at first use; 0 in fp32): on a GPU the staging its
 * products restage into and their cuBLASLt workspace, on the CPU the room
 * where its ops widen what they read in bf16 and make what they write in
 * bf16 (cpu_stream_room). */
size_t gpt_staging_bytes(const ModelConfig *cfg, DeviceKind kind, ComputePolicy compute, int max_B, int max_T);

/* The Model ops, by their GPT names (model.h says what each does). */
void gpt_forward(GPT *m, const int *tokens, const int *targets, int B, int T,
                 uint32_t step, int training);
void gpt_backward(GPT *m, float dloss);

#endif
