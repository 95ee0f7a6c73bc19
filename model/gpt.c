/* gpt.c: the GPT's layout, init, forward and backward, written out layer by layer;
 * on a traced stream each unit's part of the forward and of the backward is a span. */
#include "gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/philox.h"
#include "../runtime/host.h"
#include "../runtime/trace.h"

/* The classifier's rows at once for batches of up to B x T: all of them
 * where their logits fit in CLASSIFIER_CHUNK_FLOATS, else as few chunks as
 * fit, of equal rows (the last may have fewer). */
static size_t classifier_rows(const ModelConfig *cfg, int B, int T) {
    size_t rows = (size_t)B * T, fit = CLASSIFIER_CHUNK_FLOATS / (size_t)cfg->vocab;
    size_t chunks = (rows + fit - 1) / fit;
    return (rows + chunks - 1) / chunks;
}

/* The bf16 numbers of the root's copy and of one whole block's: under
 * autocast, the root's and any other unit's (a whole block is the most a
 * unit holds under any policy), each tensor where the arena puts it, on its
 * operand boundary (arena.h). */
static void copy_numbers(const ModelConfig *cfg, size_t *root, size_t *block) {
    ModelConfig one = *cfg;
    one.layers = 1;
    ArenaLayout *layout = host_calloc(1, sizeof *layout);
    gpt_layout(&one, 1, layout);
    *root = layout->units[0].used;
    *block = layout->units[1].used;
    free(layout);
}

/* The block internals a block's backward reads, kept in bf16 under autocast
 * (keeps_bf16), every block's, or with recompute the one block's it makes
 * again: ln1, qkv, atty, resid2, ln2, fch and fch_gelu, 1 + 3 + 1 + 1 + 1 +
 * 4 + 4 = 15 C numbers a position; 11 C with recompute_gelu, 13 C with
 * recompute_norms, 9 C with both (made_again). */
enum { KEPT_LN1, KEPT_QKV, KEPT_ATTY, KEPT_RESID2, KEPT_LN2, KEPT_FCH, KEPT_FCH_GELU, KEPT_TENSORS };
static const size_t KEPT_WIDTHS[KEPT_TENSORS] = { 1, 3, 1, 1, 1, 4, 4 };  /* in C */

/* Whether a model computing so keeps its blocks' internals in bf16: under
 * autocast (with recompute, one block's: kept_blocks). */
static int keeps_bf16(ComputePolicy compute) { return compute.precision == DTYPE_BF16; }

/* The blocks whose internals are kept at once: every one of L, or with
 * recompute the one whose backward runs, made again over the last one's. */
static size_t kept_blocks(ComputePolicy compute, size_t L) { return compute.recompute ? 1 : L; }

/* Whether internal i is not kept but made again before the backward that
 * reads it, in one block's buffer: GELU's output with recompute_gelu, the
 * LayerNorms' with recompute_norms (recompute makes the whole block again). */
static int made_again(ComputePolicy compute, int i) {
    if (compute.recompute) return 0;
    if (i == KEPT_FCH_GELU) return compute.recompute_gelu;
    if (i == KEPT_LN1 || i == KEPT_LN2) return compute.recompute_norms;
    return 0;
}

/* Where in a block's kept numbers, at BT x C positions x channels, its
 * internal i begins: each kept one on its boundary (operand_numbers: the
 * backward's products read them in place), the made-again ones skipped;
 * i = KEPT_TENSORS: all a block keeps. */
static size_t kept_offset(ComputePolicy compute, int i, size_t BTC) {
    size_t at = 0;
    for (int j = 0; j < i; j++)
        if (!made_again(compute, j)) at += operand_numbers(KEPT_WIDTHS[j] * BTC);
    return at;
}

/* The floats of n numbers that are held in bf16 under autocast (held_numbers,
 * kept_at, stream_after, unit_copy), two a float, on their operand boundary
 * (a product's operand, read in place); else fp32's n. */
static size_t held_floats(ComputePolicy compute, size_t n) {
    return compute.precision == DTYPE_BF16 ? (operand_numbers(n) + 1) / 2 : n;
}

/* The floats of block internal i, n numbers a block, whose buffers are Lw
 * blocks' (below): one block's where it is made again, held as autocast
 * holds it (kept_tensor); else Lw blocks' in fp32. */
static size_t internal_floats(ComputePolicy compute, int i, size_t Lw, size_t n) {
    if (made_again(compute, i)) return held_floats(compute, n);
    return Lw * n;
}

/* The floats of the backward's wide gradients, one at a time, held as
 * autocast holds them: dfch, and dqkv (the fewer); and under autocast the
 * head's gradient [V,C]: its fp32 sums over the chunks, or with one chunk
 * (head_weight_gradient_last) itself in bf16, but with fresh gradients,
 * where one chunk's is made in the gradient itself. */
static size_t wide_floats(const ModelConfig *cfg, ComputePolicy compute, int B, int T) {
    size_t C = cfg->embd, V = cfg->vocab, BT = (size_t)B * T;
    size_t wide = held_floats(compute, BT * 4 * C), head = 0;
    if (compute.precision == DTYPE_BF16 && classifier_rows(cfg, B, T) < BT) head = V * C;
    else if (compute.precision == DTYPE_BF16 && !compute.grads_fresh) head = held_floats(compute, V * C);
    return head > wide ? head : wide;
}

/* The floats of the logits' buffer: a chunk's logits (in bf16 under
 * autocast), or each row's last position's (fp32); and under autocast with
 * chunks, the head's gradient [V,C] rounded from its sums, until the
 * embeddings' backward joins it. */
static size_t logits_floats(const ModelConfig *cfg, ComputePolicy compute, int B, int T) {
    size_t V = cfg->vocab, R = classifier_rows(cfg, B, T), chunk = held_floats(compute, R * V);
    size_t logits = chunk > (size_t)B * V ? chunk : (size_t)B * V;
    size_t head = compute.precision == DTYPE_BF16 && R < (size_t)B * T ? held_floats(compute, V * cfg->embd) : 0;
    return head > logits ? head : logits;
}

/* Whether a model built for B x T has room for the head's gradient summed
 * over chunks under autocast: its fp32 sums in dwide, then rounded in the
 * logits' buffer. A model built for one chunk may not (head_weight_gradient_last). */
static int head_sums_fit(const ModelConfig *cfg, ComputePolicy compute, int B, int T) {
    size_t VC = (size_t)cfg->vocab * cfg->embd;
    return wide_floats(cfg, compute, B, T) >= VC && logits_floats(cfg, compute, B, T) >= held_floats(compute, VC);
}

/* The activation size table: each buffer and its size in floats, for B x T.
 * With recompute the blocks' internals are kept for one block (Lk = 1), and
 * only each block's output (resid3, the next one's input) for all L. In bf16
 * the internals the backward reads are kept in bf16 for all L (with
 * recompute for the one: kept_blocks), written there by their ops
 * (kept_tensor: qkv and fc by their products, the bias added), and have no
 * fp32 buffer (Lw = 0); the other fp32 internals are one block's too (Lk =
 * 1) but for the statistics (LayerNorm's, attention's), kept for all L
 * without recompute (Ls). Under autocast the
 * branches' outputs are one block's, in bf16 (held_numbers). The internals
 * made again (made_again: GELU's output, the LayerNorms') are one block's and
 * not kept (internal_floats). What attention keeps and its scratch are the
 * device's backend's to size. */
static void activation_table(Activations *a, const ModelConfig *cfg, DeviceKind kind, ComputePolicy compute, int B,
                             int T, ActivationSlot table[ACTIVATION_TENSORS]) {
    size_t L = cfg->layers, C = cfg->embd, BT = (size_t)B * T;
    size_t logits = logits_floats(cfg, compute, B, T);
    size_t Lk = compute.recompute || keeps_bf16(compute) ? 1 : L, Ls = compute.recompute ? 1 : L;
    size_t Lw = keeps_bf16(compute) ? 0 : Lk;  /* the kept tensors, which their ops write in bf16 (kept_tensor) */
    /* a block's residual stream (stream_after): in bf16 under autocast */
    size_t stream = held_floats(compute, BT * C);
    size_t kept = keeps_bf16(compute)
                      ? held_floats(compute, kept_blocks(compute, L) * kept_offset(compute, KEPT_TENSORS, BT * C))
                      : 0;
    size_t wide = wide_floats(cfg, compute, B, T);
    size_t root = 0, block = 0, largest_block_tensor = 0;
    if (compute.precision == DTYPE_BF16) {
        if (!compute.weights_in_place) {  /* else the strategy's copy is read in place */
            copy_numbers(cfg, &root, &block);
            root = held_floats(compute, root);  /* the copies in bf16 */
            block = held_floats(compute, block);
        }
        if (!compute.grads_fresh) largest_block_tensor = held_floats(compute, 4 * C * C);  /* made_grad's */
    }
    AttentionBuffers att = attention_buffers(kind, B, T, cfg->embd, cfg->heads, compute.precision);
    ActivationSlot slots[ACTIVATION_TENSORS] = {
        { &a->encoded, stream }, { &a->ln1, internal_floats(compute, KEPT_LN1, Lw, BT * C) },
        { &a->ln1_mean, Ls * BT }, { &a->ln1_rstd, Ls * BT },
        { &a->qkv, internal_floats(compute, KEPT_QKV, Lw, BT * 3 * C) },
        { &a->att_saved, Ls * att.saved }, { &a->atty, internal_floats(compute, KEPT_ATTY, Lw, BT * C) },
        { &a->attproj, Lk * held_floats(compute, BT * C) },
        { &a->resid2, internal_floats(compute, KEPT_RESID2, Lw, BT * C) },
        { &a->ln2, internal_floats(compute, KEPT_LN2, Lw, BT * C) }, { &a->ln2_mean, Ls * BT },
        { &a->ln2_rstd, Ls * BT }, { &a->fch, internal_floats(compute, KEPT_FCH, Lw, BT * 4 * C) },
        { &a->fch_gelu, internal_floats(compute, KEPT_FCH_GELU, Lw, BT * 4 * C) },
        { &a->fcproj, Lk * held_floats(compute, BT * C) }, { &a->resid3, L * stream },
        { &a->lnf, held_floats(compute, BT * C) }, { &a->lnf_mean, BT }, { &a->lnf_rstd, BT },
        { &a->logits, logits }, { &a->losses, BT }, { &a->mean_loss, 1 },
        { &a->dresid, held_floats(compute, BT * C) }, { &a->dln, held_floats(compute, BT * C) },
        { &a->dproj, held_floats(compute, BT * C) },
        { &a->datty, held_floats(compute, BT * C) }, { &a->dwide, wide }, { &a->att_scratch, att.scratch },
        { &a->root_bf16, root }, { &a->unit_bf16, block }, { &a->dweight_bf16, largest_block_tensor },
        { &a->kept_storage, kept },
    };
    memcpy(table, slots, sizeof slots);
}

size_t gpt_activation_floats(const ModelConfig *cfg, DeviceKind kind, ComputePolicy compute, int B, int T) {
    Activations unused;
    ActivationSlot table[ACTIVATION_TENSORS];
    activation_table(&unused, cfg, kind, compute, B, T, table);
    return model_activation_floats(table, ACTIVATION_TENSORS);
}

/* The block's Linears, qkv, attention's projection, fc and the MLP's
 * projection: their input and output widths, in C (under autocast each
 * output held in bf16, and its gradient and its input's: held_numbers). */
static const size_t LINEAR_IN[4] = { 1, 1, 1, 4 }, LINEAR_OUT[4] = { 3, 1, 4, 1 };

size_t gpt_staging_bytes(const ModelConfig *cfg, DeviceKind kind, ComputePolicy compute, int B, int T) {
    if (compute.precision != DTYPE_BF16) return 0;
    size_t C = (size_t)cfg->embd, V = (size_t)cfg->vocab, BT = (size_t)B * T, R = classifier_rows(cfg, B, T);
    if (kind == DEVICE_CUDA) {
        /* a GPU's product reads every operand in place, each held in bf16 on its boundary (nothing restaged
         * into cuda_bf16_staging): only the products' cuBLASLt workspace */
        return DEVICE_PRODUCT_WORKSPACE_BYTES;
    }
    /* the CPU's room (cpu_stream_room), where its ops widen what they read in bf16 and make what they write in
     * bf16, n = B x T x C: GELU's backward, 8n (its input and its gradient, made over the output's), and
     * attention's, 8n (q, k, v, its output and its gradient, and dqkv), the most of the other ops';
     * a chunk of the head's logits, which its product writes, the loss reads and writes (in place) and its
     * backward reads, beside the head's weight and, in the backward, the chunk's rows of the final LayerNorm's
     * output and of their gradient; or a Linear's weight, beside what it reads and writes in bf16 (in the
     * backward its input's gradient and its weight's, summed there in fp32) */
    size_t n = BT * C, most = 8 * n, head = R * V + V * C + 2 * R * C;
    if (head > most) most = head;
    for (int i = 0; i < 4; i++) {
        size_t in = BT * LINEAR_IN[i] * C, out = BT * LINEAR_OUT[i] * C, weight = LINEAR_IN[i] * LINEAR_OUT[i] * C * C;
        size_t forward = in + out + weight, backward = forward + in + weight;
        if (forward > most) most = forward;
        if (backward > most) most = backward;
    }
    return most * sizeof(float);
}

static void gpt_destroy(Model *base) { free(base); }

static void forward_op(Model *m, const int *tokens, const int *targets, int B, int T,
                       uint32_t step, int training) {
    gpt_forward((GPT *)m, tokens, targets, B, T, step, training);
}

static void backward_op(Model *m, float dloss) { gpt_backward((GPT *)m, dloss); }

static const ModelOps gpt_ops = { forward_op, backward_op, gpt_destroy };

GPT *gpt_create(const ModelConfig *cfg, const ArenaLayout *layout, ComputePolicy compute, Device *dev, Stream *stream,
                int max_B, int max_T) {
    GPT *m = host_calloc(1, sizeof *m);
    model_init(&m->base, &gpt_ops, cfg, layout, dev, stream);
    m->max_B = max_B;
    m->max_T = max_T;
    m->recompute = compute.recompute;
    m->recompute_gelu = compute.recompute_gelu;
    m->recompute_norms = compute.recompute_norms;
    m->weights_in_place = compute.weights_in_place;
    m->grads_fresh = compute.grads_fresh;
    m->precision = compute.precision;
    m->classifier_rows = (int)classifier_rows(cfg, max_B, max_T);
    m->head_sums_fit = head_sums_fit(cfg, compute, max_B, max_T);

    ActivationSlot table[ACTIVATION_TENSORS];
    activation_table(&m->acts, cfg, device_kind(dev), compute, max_B, max_T, table);
    model_alloc_activations(&m->base, table, ACTIVATION_TENSORS, (size_t)max_B * max_T);
    m->base.mean_loss = m->acts.mean_loss;
    return m;
}

/* A block's parts, in the layout's order (gpt_layout.c), after the root's
 * tensors: each a weight, followed by its bias with cfg.bias. */
enum { LN1, QKV, ATTPROJ, LN2, FC, FCPROJ, BLOCK_PARTS };

/* The index of part i's weight in block l; its bias is the next tensor. */
static int block_tensor(const GPT *m, int l, int i) {
    int per_part = 1 + m->base.cfg.bias, root = 3 + m->base.cfg.bias;
    return root + BLOCK_PARTS * per_part * l + per_part * i;
}
/* The part's last tensor: its bias, or its weight. */
static int part_last(const GPT *m, int l, int i) { return block_tensor(m, l, i) + m->base.cfg.bias; }

/* ---- mixed precision: where torch.autocast(bfloat16) rounds (gpt.h) ---- */

static int autocast(const GPT *m) { return m->precision == DTYPE_BF16; }

/* The model's ComputePolicy, as gpt_create was given it. */
static ComputePolicy compute_of(const GPT *m) {
    return (ComputePolicy){ .recompute = m->recompute, .recompute_gelu = m->recompute_gelu,
                            .recompute_norms = m->recompute_norms, .precision = m->precision,
                            .weights_in_place = m->weights_in_place, .grads_fresh = m->grads_fresh };
}

/* None: a bias's data NULL without cfg.bias. */
static const ConstBuf NO_NUMBERS = { NULL, DTYPE_FP32 };
static const Buf NO_GRADIENT = { NULL, DTYPE_FP32 };

/* An fp32 product's operands and output: a model holds bf16 only under autocast. */
static const float *fp32_input(ConstBuf inp) {
    if (inp.dtype == DTYPE_FP32) return inp.data;
    fprintf(stderr, "fatal: an fp32 product given a bf16 operand\n");
    abort();
}

static float *fp32_output(Buf out) { return (float *)fp32_input(const_buf(out)); }

/* out[N,OC] = inp @ weight^T, and its backward: under autocast, products of
 * bf16 values (the GPU's bf16 tensor cores; kernels.h), else fp32's. */
static void product_forward(GPT *m, Buf out, ConstBuf inp, ConstBuf weight, int N, int C, int OC) {
    if (autocast(m)) matmul_forward_bf16(m->base.stream, out, inp, weight, NO_NUMBERS, N, C, OC);
    else matmul_forward(m->base.stream, fp32_output(out), fp32_input(inp), fp32_input(weight), N, C, OC);
}

static void product_backward(GPT *m, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp, ConstBuf weight, int N,
                             int C, int OC) {
    if (autocast(m)) matmul_backward_bf16(m->base.stream, dinp, dweight, dout, inp, weight, N, C, OC);
    else matmul_backward(m->base.stream, fp32_output(dinp), fp32_output(dweight), fp32_input(dout), fp32_input(inp),
                         fp32_input(weight), N, C, OC);
}

/* Numbers from `at` on of a buffer the model holds in bf16 under autocast
 * (as autocast's ops make them), else fp32: a chunk of the head's logits
 * (its product writes them, the loss and the head's backward read them in
 * place), the final LayerNorm's output (the head's input), the branches'
 * outputs (their products write them, dropout and the residual add read
 * them), and the backward's gradients: the MLP's hidden one (dfch), a
 * LayerNorm's output's (dln), attention's output's and input's (datty,
 * dqkv), the residual stream's (dresid) and a branch's through its dropout
 * (dproj), each written rounded by its op and read in place by the next. */
static Buf held_numbers(const GPT *m, float *x, size_t at) {
    if (autocast(m)) return bf16_buf((bf16 *)x + at);
    return fp32_buf(x + at);
}

/* Under autocast, x rounded to bf16 in place: the output of a product run in
 * bf16 (cuBLAS's and sgemm's are fp32), or a gradient that flows into a bf16
 * tensor. Every other op rounds its own output (kernels.h's rounding). */
static void bf16_values(GPT *m, float *x, size_t n) {
    if (autocast(m)) round_to_bf16(m->base.stream, x, x, n);
}

/* The bf16 copy of unit u's weights the model computes with under autocast. */
static bf16 *unit_copy(GPT *m, int unit) { return (bf16 *)(unit == 0 ? m->acts.root_bf16 : m->acts.unit_bf16); }

/* As the model enters a unit, after its hook (its weights are there): under
 * autocast, the unit's weights in bf16 in its copy, each tensor where the
 * arena puts it, on its boundary, which the ops read in place until the model
 * enters the next unit (the root's, until the final LayerNorm's backward):
 * FSDP's MixedPrecision(param_dtype=bfloat16), every parameter's compute
 * copy bf16, the fp32 ones the master weights. Copied from the strategy's
 * bf16 copy where it holds one, else stored from fp32 (rounded): the same
 * values, in one copy of the unit. With weights_in_place nothing is copied:
 * the ops read the strategy's copy (compute_tensor). */
static void compute_weights(GPT *m, int unit) {
    if (!autocast(m)) return;
    size_t n = m->base.layout.units[unit].used;
    bf16 *held = m->base.unit_weights_bf16[unit];
    if (m->weights_in_place) {
        if (held) return;
        fprintf(stderr, "fatal: gpt: weights read in place, but no bf16 copy of unit %d is held\n", unit);
        abort();
    }
    if (held) stream_copy(m->base.stream, unit_copy(m, unit), held, n * sizeof(bf16));
    else store_bf16(m->base.stream, unit_copy(m, unit), m->base.unit_weights[unit], n);
}

/* Tensor t's weights as the model computes with them: its unit's in fp32,
 * or under autocast their bf16 copy: the strategy's (weights_in_place), or
 * the model's own. */
static ConstBuf compute_tensor(GPT *m, int t) {
    int unit = m->base.layout.tensors[t].unit;
    if (!autocast(m)) return fp32_numbers(model_tensor(&m->base, m->base.unit_weights, t));
    bf16 *copy = m->weights_in_place ? m->base.unit_weights_bf16[unit] : unit_copy(m, unit);
    return bf16_numbers(copy + model_tensor_offset(&m->base, t));
}

static ConstBuf weights_of(GPT *m, int l, int i) { return compute_tensor(m, block_tensor(m, l, i)); }

/* Tensor t's fp32 gradient, which the model adds into without autocast. */
static float *grad_of(GPT *m, int t) { return model_tensor(&m->base, m->base.unit_grads, t); }
/* The bias after weight tensor t; -1 (none) without cfg.bias. */
static int bias_after(const GPT *m, int t) { return m->base.cfg.bias ? t + 1 : -1; }

/* Part i of block l's bias as the model computes with it; none without cfg.bias. */
static ConstBuf part_bias(GPT *m, int l, int i) {
    return m->base.cfg.bias ? compute_tensor(m, block_tensor(m, l, i) + 1) : NO_NUMBERS;
}

/* Tensor t's gradient as the strategy holds it, for the ops that add a
 * column sum into it (rounded to bf16 first under autocast: kernels.h's
 * column sums): fp32, or bf16 where the strategy holds the gradients in bf16
 * (reduced in bf16). */
static Buf grad_held(GPT *m, int t) {
    bf16 *held = m->base.unit_grads_bf16[m->base.layout.tensors[t].unit];
    if (autocast(m) && held) return bf16_buf(held + model_tensor_offset(&m->base, t));
    return fp32_buf(grad_of(m, t));
}

/* Where a Linear's weight gradient (tensor t) is made: added into itself,
 * or under autocast written in bf16 by its product (each number its fp32 sum
 * rounded once): into dweight_bf16, for add_bf16_grad; with fresh gradients
 * (grads_fresh: zero, in bf16) into the gradient itself, where add_bf16_grad
 * would add it to zero. */
static Buf made_grad(GPT *m, int t) {
    if (!autocast(m)) return fp32_buf(grad_of(m, t));
    if (m->grads_fresh) return grad_held(m, t);
    return bf16_buf((bf16 *)m->acts.dweight_bf16);
}

/* Under autocast, tensor t's gradient += the one made in bf16 in
 * dweight_bf16: cast up into the master's fp32 gradient, as the reference's
 * fp32 master takes it; or, where the strategy holds the gradients in bf16
 * (reduced in bf16), added and the sum rounded. */
static void add_bf16_grad(GPT *m, int t, size_t n) {
    if (!autocast(m) || m->grads_fresh) return;
    Buf grad = grad_held(m, t);
    residual_forward(m->base.stream, grad, const_buf(grad), bf16_numbers((const bf16 *)m->acts.dweight_bf16), n,
                     grad.dtype);
}

/* Bias tensor t's gradient (t < 0: none) += dout[N,OC]'s column sums (dout
 * read as it is held), each rounded to bf16 under autocast. */
static void bias_grad(GPT *m, int t, ConstBuf dout, size_t N, int OC) {
    if (t < 0) return;
    bias_backward(m->base.stream, grad_held(m, t), dout, (int)N, OC, m->base.column_sums_scratch, m->precision);
}

/* The forward reaches tensor i of block l: where it opens a unit, the unit's
 * hook, and its span of the trace (a block's first tensor opens one always).
 * Returns the tensor's weights, read after the hook. */
static ConstBuf forward_weights(GPT *m, int l, int i) {
    int t = block_tensor(m, l, i), unit = m->base.layout.tensors[t].unit;
    if (model_opens_unit(&m->base, t)) {
        if (i != LN1) trace_end(m->base.stream);
        model_before_forward(&m->base, unit);
        trace_begin(m->base.stream, "forward", unit);
        compute_weights(m, unit);
    }
    return weights_of(m, l, i);
}

/* The backward reaches part i of block l, going down: where its last tensor
 * closes a unit (a block's last always does), the unit's hook and span begin. */
static void enter_backward(GPT *m, int l, int i) {
    int t = part_last(m, l, i), unit = m->base.layout.tensors[t].unit;
    if (!model_closes_unit(&m->base, t)) return;
    model_before_backward(&m->base, unit);
    trace_begin(m->base.stream, "backward", unit);
    compute_weights(m, unit);
}

/* The backward is done with part i of block l: its gradients are complete
 * (said in the arena's order reversed: the bias, then the weight), and where
 * it opens its unit, the unit's gradient too. */
static void leave_backward(GPT *m, int l, int i) {
    int t = block_tensor(m, l, i), unit = m->base.layout.tensors[t].unit;
    if (m->base.cfg.bias) model_grad_done(&m->base, t + 1);
    model_grad_done(&m->base, t);
    if (!model_opens_unit(&m->base, t)) return;
    trace_end(m->base.stream);
    model_after_backward(&m->base, unit);
}

/* Where the forward reads weights: in the forward itself, through the unit
 * hooks (forward_weights); recomputed inside the backward, where the
 * backward's hook has made the block's unit present, directly. */
static ConstBuf block_weights(GPT *m, int l, int i, int hooks) {
    return hooks ? forward_weights(m, l, i) : weights_of(m, l, i);
}

/* Part i of block l as a Linear: out[N,OC] = inp[N,C] @ weight^T (+ bias),
 * its weights read through block_weights. Under autocast inp holds bf16
 * values (the op that wrote it rounded them: LayerNorm, attention, GELU),
 * and out is held in bf16, rounded once, after the bias: the fp32 sums of
 * products of bf16 values (on the CPU sgemm, each product of two bf16 exact
 * in fp32) with the bias added, stored by the product itself. */
static void linear_forward(GPT *m, Buf out, ConstBuf inp, int l, int i, int hooks, size_t N, int C, int OC) {
    ConstBuf weight = block_weights(m, l, i, hooks), bias = part_bias(m, l, i);
    if (autocast(m)) {
        matmul_forward_bf16(m->base.stream, out, inp, weight, bias, (int)N, C, OC);
        return;
    }
    matmul_forward(m->base.stream, fp32_output(out), fp32_input(inp), fp32_input(weight), (int)N, C, OC);
    if (bias.data) bias_forward(m->base.stream, out, out.data, bias, (int)N, OC, DTYPE_FP32);
}

/* Its backward, from dout (bf16 values under autocast: the callers round it):
 * dinp = dout @ weight (written, rounded under autocast: by the product
 * where dinp is held in bf16, else after it), and the weight's gradient
 * added, and with with_bias the bias's, each made in bf16 under autocast
 * (without, the op that made dout made the bias's too). */
static void linear_backward(GPT *m, Buf dinp, int l, int i, ConstBuf dout, ConstBuf inp, size_t N, int C, int OC,
                            int with_bias) {
    int t = block_tensor(m, l, i);
    product_backward(m, dinp, made_grad(m, t), dout, inp, weights_of(m, l, i), (int)N, C, OC);
    if (dinp.dtype == DTYPE_FP32) bf16_values(m, dinp.data, N * C);
    add_bf16_grad(m, t, (size_t)OC * C);
    if (with_bias) bias_grad(m, bias_after(m, t), dout, N, OC);
}

/* A LayerNorm's backward from dln (a block's, or the final one's): its
 * weight's (tensor t) and bias's gradients added, in one op, each column
 * sum rounded to bf16 under autocast, and the input's added into dresid,
 * under autocast as autocast's bf16 add of the stream's two uses: dresid =
 * bf16(dresid + bf16(the input's)). */
static void norm_backward(GPT *m, int t, ConstBuf inp, ConstBuf weight, const float *mean, const float *rstd) {
    Activations *a = &m->acts;
    size_t BT = (size_t)m->B * m->T, C = (size_t)m->base.cfg.embd;
    int bias = bias_after(m, t);
    Buf dbias = bias >= 0 ? grad_held(m, bias) : NO_GRADIENT;
    ConstBuf dln = const_buf(held_numbers(m, a->dln, 0));
    layernorm_backward(m->base.stream, held_numbers(m, a->dresid, 0), grad_held(m, t), dbias, dln, inp, weight, mean,
                       rstd, (int)BT, (int)C, m->base.column_sums_scratch, m->precision);
}

/* A branch's gradient from the residual stream's (both held in bf16 under
 * autocast), through the branch's last op, its dropout, run in bf16: in
 * dbranch, or without dropout the stream's gradient itself, read in place
 * (it is the same numbers; a copy would cost a pass over them). */
static ConstBuf branch_backward(GPT *m, float *dbranch, float *dresid, size_t n, Dropout drop) {
    ConstBuf stream = const_buf(held_numbers(m, dresid, 0));
    if (drop.p == 0.0f) return stream;
    Buf branch = held_numbers(m, dbranch, 0);
    dropout_backward(m->base.stream, branch, stream, n, drop, m->precision);
    return const_buf(branch);
}

/* The residual stream after block l for this forward's B x T (l = -1: the
 * embeddings', block 0's input): in bf16 under autocast, as autocast keeps
 * it, each block's on its boundary (operand_numbers); else fp32. */
static Buf stream_after(const GPT *m, int l) {
    size_t BTC = (size_t)m->B * m->T * m->base.cfg.embd, at = l < 0 ? 0 : (size_t)l;
    float *held = l < 0 ? m->acts.encoded : m->acts.resid3;
    return held_numbers(m, held, at * (autocast(m) ? operand_numbers(BTC) : BTC));
}

/* Block l's activations for this forward's B x T: its input x, its output
 * resid3 (stream_after), and its internals, which with recompute every
 * block writes over the one block's buffers that there are; in bf16 too
 * (those it keeps are kept_tensor's), but for the statistics (LayerNorm's
 * mean and 1/std, attention's saved), every block's without recompute. */
typedef struct {
    ConstBuf x;
    Buf resid3;
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att_saved, *atty, *attproj, *resid2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj;
} BlockActivations;

static BlockActivations block_activations(const GPT *m, int l) {
    const Activations *a = &m->acts;
    size_t BT = (size_t)m->B * m->T, C = m->base.cfg.embd;
    size_t att = attention_buffers(device_kind(m->base.dev), m->B, m->T, m->base.cfg.embd, m->base.cfg.heads,
                                   m->precision).saved;
    ComputePolicy c = compute_of(m);
    size_t k = m->recompute || keeps_bf16(c) ? 0 : (size_t)l;  /* the internals' block */
    size_t ks = m->recompute ? 0 : (size_t)l;                  /* the statistics' block */
    size_t kn = made_again(c, KEPT_LN1) ? 0 : k, kg = made_again(c, KEPT_FCH_GELU) ? 0 : k;  /* one block's */
    BlockActivations b = {
        .x = const_buf(stream_after(m, l - 1)), .resid3 = stream_after(m, l),
        .ln1 = a->ln1 + kn * BT * C, .ln1_mean = a->ln1_mean + ks * BT, .ln1_rstd = a->ln1_rstd + ks * BT,
        .qkv = a->qkv + k * BT * 3 * C, .att_saved = a->att_saved + ks * att,
        .atty = a->atty + k * BT * C, .attproj = a->attproj + k * BT * C, .resid2 = a->resid2 + k * BT * C,
        .ln2 = a->ln2 + kn * BT * C, .ln2_mean = a->ln2_mean + ks * BT, .ln2_rstd = a->ln2_rstd + ks * BT,
        .fch = a->fch + k * BT * 4 * C, .fch_gelu = a->fch_gelu + kg * BT * 4 * C,
        .fcproj = a->fcproj + k * BT * C,
    };
    return b;
}

typedef struct { ConstBuf wte, wpe, lnf_w, lnf_b; } RootWeights;  /* lnf_b: none without cfg.bias */
enum { WTE, WPE, LNF_W };  /* the root's tensors in the arena (ln_f's bias next, with cfg.bias) */

/* The root's weights as the model computes with them (compute_weights). */
static RootWeights root_weights(GPT *m) {
    RootWeights r = { compute_tensor(m, WTE), compute_tensor(m, WPE), compute_tensor(m, LNF_W), NO_NUMBERS };
    if (m->base.cfg.bias) r.lnf_b = compute_tensor(m, LNF_W + 1);
    return r;
}

/* Dropout sites: 0 for the embeddings, then three per block. */
static Dropout dropout_at(const GPT *m, uint32_t site) {
    Dropout d = { m->training ? m->base.dropout : 0.0f, m->base.seed, m->base.rank, m->step, site, m->base.step_at };
    return d;
}

/* Block l's internals that its backward reads, kept in bf16 (keeps_bf16):
 * where kept tensor i begins. */
static bf16 *kept_at(const GPT *m, int l, int i) {
    size_t BTC = (size_t)m->B * m->T * m->base.cfg.embd;
    ComputePolicy c = compute_of(m);
    size_t block = c.recompute ? 0 : (size_t)l;  /* with recompute the one block's (kept_blocks) */
    size_t at = block * kept_offset(c, KEPT_TENSORS, BTC) + kept_offset(c, i, BTC);
    return (bf16 *)m->acts.kept_storage + at;
}

/* Where block l's internal i is: the forward writes it there (its op's
 * output a Buf) and the backward reads it there. Under keeps_bf16 where the
 * block keeps it, or one made again (made_again) in its one block's buffer
 * `fp32` (block_activations'), in bf16; else in that buffer, in fp32. */
static Buf kept_tensor(const GPT *m, int l, int i, float *fp32) {
    ComputePolicy c = compute_of(m);
    if (keeps_bf16(c)) return made_again(c, i) ? bf16_buf((bf16 *)fp32) : bf16_buf(kept_at(m, l, i));
    return fp32_buf(fp32);
}

/* What block l's backward reads of its internals, as they are held: under
 * keeps_bf16, in place where the block kept them in bf16; else the block's
 * fp32 buffers (kept_tensor); those made again, where they are made again. */
typedef struct { ConstBuf ln1, qkv, atty, resid2, ln2, fch, fch_gelu; } BlockReads;

static BlockReads block_reads(GPT *m, int l) {
    BlockActivations b = block_activations(m, l);
    BlockReads r = {
        const_buf(kept_tensor(m, l, KEPT_LN1, b.ln1)), const_buf(kept_tensor(m, l, KEPT_QKV, b.qkv)),
        const_buf(kept_tensor(m, l, KEPT_ATTY, b.atty)), const_buf(kept_tensor(m, l, KEPT_RESID2, b.resid2)),
        const_buf(kept_tensor(m, l, KEPT_LN2, b.ln2)), const_buf(kept_tensor(m, l, KEPT_FCH, b.fch)),
        const_buf(kept_tensor(m, l, KEPT_FCH_GELU, b.fch_gelu)),
    };
    return r;
}

/* Block l's forward from its input, with this forward's dropout masks (pure
 * functions of seed, rank, step, site and element), so that a recomputation
 * writes the same bits. hooks: 1 in the forward, 0 recomputed in the backward. */
static void block_forward(GPT *m, int l, int hooks) {
    Stream *s = m->base.stream;
    int B = m->B, T = m->T, C = m->base.cfg.embd, NH = m->base.cfg.heads;
    size_t BT = (size_t)B * T;
    BlockActivations b = block_activations(m, l);
    uint32_t site = 1 + 3 * (uint32_t)l;
    DType rounding = m->precision;
    ConstBuf ln1_weight = block_weights(m, l, LN1, hooks);  /* after its hook: then its bias is there too */
    Buf ln1 = kept_tensor(m, l, KEPT_LN1, b.ln1);
    layernorm_forward(s, ln1, b.ln1_mean, b.ln1_rstd, b.x, ln1_weight, part_bias(m, l, LN1), BT, C, rounding);
    Buf qkv = kept_tensor(m, l, KEPT_QKV, b.qkv);
    linear_forward(m, qkv, const_buf(ln1), l, QKV, hooks, BT, C, 3 * C);
    Buf atty = kept_tensor(m, l, KEPT_ATTY, b.atty);
    attention_forward(s, atty, b.att_saved, m->acts.att_scratch, const_buf(qkv), B, T, C, NH, dropout_at(m, site),
                      m->precision, rounding);
    Buf attproj = held_numbers(m, b.attproj, 0);
    linear_forward(m, attproj, const_buf(atty), l, ATTPROJ, hooks, BT, C, C);
    dropout_forward(s, attproj, const_buf(attproj), BT * C, dropout_at(m, site + 1), rounding);
    ConstBuf ln2_weight = block_weights(m, l, LN2, hooks);  /* its unit's hook, before the add it follows */
    Buf resid2 = kept_tensor(m, l, KEPT_RESID2, b.resid2), ln2 = kept_tensor(m, l, KEPT_LN2, b.ln2);
    residual_layernorm_forward(s, resid2, ln2, b.ln2_mean, b.ln2_rstd, b.x, const_buf(attproj), ln2_weight,
                               part_bias(m, l, LN2), BT, C, rounding);
    Buf fch = kept_tensor(m, l, KEPT_FCH, b.fch);
    linear_forward(m, fch, const_buf(ln2), l, FC, hooks, BT, C, 4 * C);
    Buf fch_gelu = kept_tensor(m, l, KEPT_FCH_GELU, b.fch_gelu);
    gelu_forward(s, fch_gelu, const_buf(fch), BT * 4 * C, m->base.cfg.gelu_tanh, rounding);
    Buf fcproj = held_numbers(m, b.fcproj, 0);
    linear_forward(m, fcproj, const_buf(fch_gelu), l, FCPROJ, hooks, BT, 4 * C, C);
    if (!hooks) return;  /* the output is kept: the rest would write it again */
    dropout_forward(s, fcproj, const_buf(fcproj), BT * C, dropout_at(m, site + 2), rounding);
    residual_forward(s, b.resid3, const_buf(resid2), const_buf(fcproj), BT * C, rounding);
}

/* The classifier over rows [r0, r0 + classifier_rows) of B x T (head tied to
 * wte): logits, softmax and each row's loss; with backward, also the
 * gradient, at dloss a row: to dln's rows, and into dwte where it is given
 * (fp32: added into, the sum over every chunk; bf16: written), the logits
 * computed once, the loss and dlogits fused (crossentropy_forward_backward,
 * dlogits over the logits in place). Under autocast the head is a Linear as
 * linear_forward's (lnf's rows bf16 values, the logits rounded once from the
 * product's fp32 sums), the loss fp32, dlogits rounded, and dwte the fp32 sum
 * over every chunk, which the backward rounds once the last is in; or, with
 * one chunk, not given here: the backward makes it after the blocks
 * (head_weight_gradient_last), from the dlogits left in the logits' buffer;
 * or, with fresh gradients, written in bf16 into wte's (head_into_gradient)
 * by a product of its own after dln's, as the two independent products are
 * made where dwte is not given: the CPU's room (gpt_staging_bytes) then
 * holds one product's operands at a time. */
static void classifier_chunk(GPT *m, ConstBuf wte, size_t r0, size_t BT, int backward, Buf dwte, float dloss) {
    Stream *s = m->base.stream;
    Activations *a = &m->acts;
    int C = m->base.cfg.embd, V = m->base.cfg.vocab;
    int rows = (int)(BT - r0 < (size_t)m->classifier_rows ? BT - r0 : (size_t)m->classifier_rows);
    ConstBuf lnf = const_buf(held_numbers(m, a->lnf, r0 * C));
    const int *targets = m->base.targets + r0;
    Buf logits = held_numbers(m, a->logits, 0), none = { NULL, logits.dtype };
    product_forward(m, logits, lnf, wte, rows, C, V);
    crossentropy_forward_backward(s, a->losses + r0, backward ? logits : none, const_buf(logits), targets, rows, V,
                                  dloss, m->precision);
    if (!backward) return;
    Buf dln = held_numbers(m, a->dln, r0 * C);
    if (dwte.dtype == DTYPE_BF16) {
        product_backward(m, dln, NO_GRADIENT, const_buf(logits), lnf, wte, rows, C, V);
        product_backward(m, NO_GRADIENT, dwte, const_buf(logits), lnf, NO_NUMBERS, rows, C, V);
        return;
    }
    product_backward(m, dln, dwte, const_buf(logits), lnf, wte, rows, C, V);
}

/* Under autocast with the batch's rows in one chunk of the classifier: the
 * head's weight gradient [V,C] is made after the blocks' backward, from the
 * dlogits and lnf the head left (nothing writes either in between), written
 * in bf16 by its product (each number its fp32 sum rounded once, as the sums
 * over chunks are once they are in) into the wide gradients' buffer, free again,
 * where the embeddings' backward reads it: no fp32 buffer [V,C], nor a place
 * for it to wait in through the blocks. With fresh gradients (grads_fresh)
 * it is not made last but in the head's own product, into wte's gradient
 * itself (head_into_gradient). */
static int head_weight_gradient_last(const GPT *m, size_t BT) {
    return autocast(m) && BT <= (size_t)m->classifier_rows && !m->grads_fresh;
}

/* Under autocast with fresh gradients (zero, in bf16) and the batch's rows
 * in one chunk: the head's weight gradient written by its product into wte's
 * gradient, which the embeddings' backward then adds its own to in a bf16
 * sum: bf16(head + bf16(embedding's)), the bits of bf16(bf16(embedding's) +
 * head) added to zero but for a zero's sign (model.h's grads_fresh), with no
 * buffer [V,C] of its own. */
static int head_into_gradient(const GPT *m, size_t BT) {
    return autocast(m) && BT <= (size_t)m->classifier_rows && m->grads_fresh;
}

void gpt_forward(GPT *m, const int *tokens, const int *targets, int B, int T,
                 uint32_t step, int training) {
    Stream *s = m->base.stream;
    const ModelConfig *cfg = &m->base.cfg;
    int C = cfg->embd, V = cfg->vocab, L = cfg->layers;
    size_t BT = (size_t)B * T;
    Activations *a = &m->acts;
    if (B < 1 || B > m->max_B || T < 1 || T > m->max_T || T > cfg->block_size) {
        fprintf(stderr, "fatal: gpt_forward of %d x %d on a model built for %d x %d (block %d)\n",
                B, T, m->max_B, m->max_T, cfg->block_size);
        abort();
    }
    m->B = B;
    m->T = T;
    m->step = step;
    m->training = training;
    model_upload_batch(&m->base, tokens, targets, BT, step);

    model_before_forward(&m->base, 0);
    RootWeights root = root_weights(m);
    trace_begin(s, "forward", 0);
    compute_weights(m, 0);
    Buf encoded = stream_after(m, -1);
    embedding_forward(s, encoded, m->base.tokens, root.wte, root.wpe, B, T, C, m->precision);
    dropout_forward(s, encoded, const_buf(encoded), BT * C, dropout_at(m, 0), m->precision);
    trace_end(s);

    for (int l = 0; l < L; l++) {
        block_forward(m, l, 1);
        trace_end(s);
    }
    ConstBuf x = const_buf(stream_after(m, L - 1));  /* the last block's output */

    trace_begin(s, "forward", 0);
    layernorm_forward(s, held_numbers(m, a->lnf, 0), a->lnf_mean, a->lnf_rstd, x, root.lnf_w, root.lnf_b, BT, C,
                      m->precision);
    ConstBuf head = root.wte;
    if (targets && !training) {
        for (size_t r0 = 0; r0 < BT; r0 += (size_t)m->classifier_rows)
            classifier_chunk(m, head, r0, BT, 0, NO_GRADIENT, 0.0f);
        mean_forward(s, a->mean_loss, a->losses, (int)BT);
    } else if (!targets) {
        for (int b = 0; b < B; b++) {  /* each row's last position: what generation draws from */
            ConstBuf last = const_buf(held_numbers(m, a->lnf, ((size_t)b * T + T - 1) * C));
            float *logits = a->logits + (size_t)b * V;
            product_forward(m, fp32_buf(logits), last, head, 1, C, V);
            bf16_values(m, logits, V);
        }
    }
    trace_end(s);
}

void gpt_backward(GPT *m, float dloss) {
    Stream *s = m->base.stream;
    const ModelConfig *cfg = &m->base.cfg;
    int B = m->B, T = m->T, C = cfg->embd, NH = cfg->heads, V = cfg->vocab, L = cfg->layers;
    size_t BT = (size_t)B * T;
    Activations *a = &m->acts;

    model_before_backward(&m->base, 0);
    RootWeights root = root_weights(m);
    ConstBuf x_last = const_buf(stream_after(m, L - 1));

    /* The head, a chunk at a time: logits, loss and dlogits at once (a
     * training forward left it here, where dloss is known and the root's
     * gradient is the model's to add into), then the final LayerNorm; dresid
     * carries d(residual stream) down. Under autocast the head's gradient is
     * made in bf16 and kept apart: with one chunk after the blocks
     * (head_weight_gradient_last), or now in wte's fresh gradient itself
     * (head_into_gradient); else its fp32 sums over the chunks made in
     * dwide (which the blocks' gradients take next), rounded once into the
     * logits' buffer (the chunks are done), where it waits for wte's other
     * use, the embedding, whose backward adds its own to it in a bf16 sum and
     * that into the gradient. The root's copy is the forward's: the root's
     * weights stay as they were for the whole step. */
    trace_begin(s, "backward", 0);
    ConstBuf head = root.wte;
    int head_last = head_weight_gradient_last(m, BT), head_in_place = head_into_gradient(m, BT);
    Buf dhead = autocast(m) ? fp32_buf(a->dwide) : fp32_buf(grad_of(m, WTE));
    if (head_last) dhead = NO_GRADIENT;
    if (head_in_place) dhead = grad_held(m, WTE);
    if (autocast(m) && !head_last && !head_in_place) {
        if (!m->head_sums_fit) {
            fprintf(stderr, "fatal: gpt_backward: the head's gradient over %zu chunks, in a model built for one\n",
                    (BT + m->classifier_rows - 1) / m->classifier_rows);
            abort();
        }
        fill_zero(s, a->dwide, (size_t)V * C);
    }
    for (size_t r0 = 0; r0 < BT; r0 += (size_t)m->classifier_rows)
        classifier_chunk(m, head, r0, BT, 1, dhead, dloss / (float)BT);
    mean_forward(s, a->mean_loss, a->losses, (int)BT);
    if (autocast(m) && !head_last && !head_in_place) store_bf16(s, (bf16 *)a->logits, a->dwide, (size_t)V * C);
    fill_zero(s, a->dresid, held_floats(compute_of(m), BT * C));
    norm_backward(m, LNF_W, x_last, root.lnf_w, a->lnf_mean, a->lnf_rstd);
    trace_end(s);

    for (int l = L - 1; l >= 0; l--) {
        BlockActivations b = block_activations(m, l);
        uint32_t site = 1 + 3 * (uint32_t)l;

        /* MLP: resid3 = resid2 + dropout(gelu(ln2(resid2) @ fc^T) @ fcproj^T) */
        enter_backward(m, l, FCPROJ);
        if (m->recompute) block_forward(m, l, 0);  /* the block's one unit is there (gpt_create) */
        /* what the forward made and did not keep (made_again), made again by
         * the forward's op from what it kept: the same bits. GELU's output
         * from fch as it is held; each LayerNorm's output once its Linear's
         * unit is entered, which holds the norm's weights under every unit
         * policy (its statistics written again, the values they hold). */
        BlockReads r = block_reads(m, l);
        ComputePolicy compute = compute_of(m);
        if (made_again(compute, KEPT_FCH_GELU))
            gelu_forward(s, kept_tensor(m, l, KEPT_FCH_GELU, b.fch_gelu), r.fch, BT * 4 * C, m->base.cfg.gelu_tanh,
                         m->precision);
        ConstBuf dfcproj = branch_backward(m, a->dproj, a->dresid, BT * C, dropout_at(m, site + 2));
        Buf dfch = held_numbers(m, a->dwide, 0), dln = held_numbers(m, a->dln, 0);
        linear_backward(m, dfch, l, FCPROJ, dfcproj, r.fch_gelu, BT, 4 * C, C, 1);
        leave_backward(m, l, FCPROJ);
        enter_backward(m, l, FC);
        if (made_again(compute, KEPT_LN2))
            layernorm_forward(s, kept_tensor(m, l, KEPT_LN2, b.ln2), b.ln2_mean, b.ln2_rstd, r.resid2,
                              weights_of(m, l, LN2), part_bias(m, l, LN2), BT, C, m->precision);
        /* GELU's gradient (in place: one hidden-sized gradient, rounded under
         * autocast) and fc's bias's from it, in one op */
        int fc_bias = bias_after(m, block_tensor(m, l, FC));
        gelu_backward(s, dfch, fc_bias >= 0 ? grad_held(m, fc_bias) : NO_GRADIENT, r.fch, const_buf(dfch), (int)BT,
                      4 * C, m->base.cfg.gelu_tanh, m->precision, m->base.column_sums_scratch);
        linear_backward(m, dln, l, FC, const_buf(dfch), r.ln2, BT, C, 4 * C, 0);
        leave_backward(m, l, FC);
        enter_backward(m, l, LN2);
        norm_backward(m, block_tensor(m, l, LN2), r.resid2, weights_of(m, l, LN2), b.ln2_mean, b.ln2_rstd);
        leave_backward(m, l, LN2);

        /* attention: resid2 = x + dropout(attention(ln1(x) @ qkv^T) @ attproj^T) */
        enter_backward(m, l, ATTPROJ);
        ConstBuf dattproj = branch_backward(m, a->dproj, a->dresid, BT * C, dropout_at(m, site + 1));
        Buf datty = held_numbers(m, a->datty, 0);
        linear_backward(m, datty, l, ATTPROJ, dattproj, r.atty, BT, C, C, 1);
        leave_backward(m, l, ATTPROJ);
        enter_backward(m, l, QKV);
        if (made_again(compute, KEPT_LN1))
            layernorm_forward(s, kept_tensor(m, l, KEPT_LN1, b.ln1), b.ln1_mean, b.ln1_rstd, b.x,
                              weights_of(m, l, LN1), part_bias(m, l, LN1), BT, C, m->precision);
        Buf dqkv = held_numbers(m, a->dwide, 0);  /* dfch's buffer: fc's backward is done with it */
        attention_backward(s, dqkv, a->att_scratch, const_buf(datty), r.qkv, r.atty, b.att_saved, B, T, C, NH,
                           dropout_at(m, site), m->precision, m->precision);
        linear_backward(m, dln, l, QKV, const_buf(dqkv), r.ln1, BT, C, 3 * C, 1);
        leave_backward(m, l, QKV);
        enter_backward(m, l, LN1);
        norm_backward(m, block_tensor(m, l, LN1), b.x, weights_of(m, l, LN1), b.ln1_mean, b.ln1_rstd);
        leave_backward(m, l, LN1);
    }

    /* embeddings: encoded = dropout(wte[tokens] + wpe) */
    trace_begin(s, "backward", 0);
    ConstBuf dencoded = branch_backward(m, a->dproj, a->dresid, BT * C, dropout_at(m, 0));
    /* under autocast wte's and wpe's gradients made in bf16 (each an fp32 sum
     * over its positions, rounded once), wte's joined by the head's (in the
     * logits' buffer, or with one chunk made now in dwide) in a bf16 add, and
     * added into the gradients as held; or added to the head's where it is
     * in wte's gradient already (head_into_gradient) */
    if (head_last)
        product_backward(m, NO_GRADIENT, held_numbers(m, a->dwide, 0), const_buf(held_numbers(m, a->logits, 0)),
                         const_buf(held_numbers(m, a->lnf, 0)), NO_NUMBERS, (int)BT, C, V);
    ConstBuf dhead16 = autocast(m) && !head_in_place ? bf16_numbers((const bf16 *)(head_last ? a->dwide : a->logits))
                                                      : NO_NUMBERS;
    embedding_backward(s, grad_held(m, WTE), grad_held(m, WPE), dencoded, dhead16, m->base.buckets, B, T, V, C,
                       m->precision);
    trace_end(s);
    model_after_backward(&m->base, 0);
}
