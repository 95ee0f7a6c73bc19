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

/* The activation size table: each buffer and its size in floats, for B x T. */
static void activation_table(Activations *a, const ModelConfig *cfg, int B, int T,
                             ActivationSlot table[ACTIVATION_TENSORS]) {
    size_t L = cfg->layers, C = cfg->embd, NH = cfg->heads, V = cfg->vocab, BT = (size_t)B * T;
    size_t att = (size_t)B * NH * T * T;
    ActivationSlot slots[ACTIVATION_TENSORS] = {
        { &a->encoded, BT * C },
        { &a->ln1, L * BT * C }, { &a->ln1_mean, L * BT }, { &a->ln1_rstd, L * BT },
        { &a->qkv, L * BT * 3 * C },
        { &a->att, L * att },
        { &a->atty, L * BT * C }, { &a->attproj, L * BT * C }, { &a->resid2, L * BT * C },
        { &a->ln2, L * BT * C }, { &a->ln2_mean, L * BT }, { &a->ln2_rstd, L * BT },
        { &a->fch, L * BT * 4 * C }, { &a->fch_gelu, L * BT * 4 * C },
        { &a->fcproj, L * BT * C }, { &a->resid3, L * BT * C },
        { &a->lnf, BT * C }, { &a->lnf_mean, BT }, { &a->lnf_rstd, BT },
        { &a->logits, BT * V }, { &a->probs, BT * V }, { &a->losses, BT }, { &a->mean_loss, 1 },
        { &a->dresid, BT * C }, { &a->dln, BT * C }, { &a->dproj, BT * C }, { &a->datty, BT * C },
        { &a->dqkv, BT * 3 * C }, { &a->dfch, BT * 4 * C }, { &a->dfch_gelu, BT * 4 * C },
        { &a->dlogits, BT * V },
        { &a->att_scratch, 2 * att },
    };
    memcpy(table, slots, sizeof slots);
}

static void gpt_destroy(Model *base) { free(base); }

static void forward_op(Model *m, const int *tokens, const int *targets, int B, int T,
                       uint32_t step, int training) {
    gpt_forward((GPT *)m, tokens, targets, B, T, step, training);
}

static void backward_op(Model *m, float dloss) { gpt_backward((GPT *)m, dloss); }

static const ModelOps gpt_ops = { forward_op, backward_op, gpt_destroy };

GPT *gpt_create(const ModelConfig *cfg, UnitPolicy unit, int shard_multiple, Device *dev, Stream *stream,
                int max_B, int max_T) {
    GPT *m = host_calloc(1, sizeof *m);
    model_init(&m->base, &gpt_ops, cfg, unit, shard_multiple, dev, stream);
    m->max_B = max_B;
    m->max_T = max_T;

    ActivationSlot table[ACTIVATION_TENSORS];
    activation_table(&m->acts, cfg, max_B, max_T, table);
    model_alloc_activations(&m->base, table, ACTIVATION_TENSORS, (size_t)max_B * max_T);
    m->base.mean_loss = m->acts.mean_loss;
    return m;
}

/* A block's tensors, in the layout's order (gpt_layout.c), after the root's three. */
enum { LN1, QKV, ATTPROJ, LN2, FC, FCPROJ, BLOCK_TENSORS, ROOT_TENSORS = 3 };

static int block_tensor(int l, int i) { return ROOT_TENSORS + BLOCK_TENSORS * l + i; }
static float *weights_of(GPT *m, int l, int i) { return model_tensor(&m->base, m->base.unit_weights, block_tensor(l, i)); }
static float *grads_of(GPT *m, int l, int i) { return model_tensor(&m->base, m->base.unit_grads, block_tensor(l, i)); }

/* The forward reaches tensor i of block l: where it opens a unit, the unit's
 * hook, and its span of the trace (a block's first tensor opens one always).
 * Returns the tensor's weights, read after the hook. */
static const float *forward_weights(GPT *m, int l, int i) {
    int t = block_tensor(l, i), unit = m->base.layout.tensors[t].unit;
    if (model_opens_unit(&m->base, t)) {
        if (i != LN1) trace_end(m->base.stream);
        model_before_forward(&m->base, unit);
        trace_begin(m->base.stream, "forward", unit);
    }
    return weights_of(m, l, i);
}

/* The backward reaches tensor i of block l, going down: where it closes a unit
 * (a block's last tensor always does), the unit's hook and span begin. */
static void enter_backward(GPT *m, int l, int i) {
    int t = block_tensor(l, i), unit = m->base.layout.tensors[t].unit;
    if (!model_closes_unit(&m->base, t)) return;
    model_before_backward(&m->base, unit);
    trace_begin(m->base.stream, "backward", unit);
}

/* The backward is done with tensor i of block l: where it opens its unit, the
 * unit's gradient is complete. */
static void leave_backward(GPT *m, int l, int i) {
    int t = block_tensor(l, i), unit = m->base.layout.tensors[t].unit;
    if (!model_opens_unit(&m->base, t)) return;
    trace_end(m->base.stream);
    model_after_backward(&m->base, unit);
}

typedef struct { float *wte, *wpe, *lnf_w; } RootTensors;

static RootTensors root_tensors(const GPT *m, float *unit_base) {
    RootTensors r;
    const ModelConfig *cfg = &m->base.cfg;
    r.wte = unit_base;
    r.wpe = r.wte + (size_t)cfg->vocab * cfg->embd;
    r.lnf_w = r.wpe + (size_t)cfg->block_size * cfg->embd;
    return r;
}

/* Dropout sites: 0 for the embeddings, then three per block. */
static Dropout dropout_at(const GPT *m, uint32_t site) {
    Dropout d = { m->training ? m->base.dropout : 0.0f, m->base.seed, m->base.rank, m->step, site };
    return d;
}

void gpt_forward(GPT *m, const int *tokens, const int *targets, int B, int T,
                 uint32_t step, int training) {
    Stream *s = m->base.stream;
    const ModelConfig *cfg = &m->base.cfg;
    int C = cfg->embd, NH = cfg->heads, V = cfg->vocab, L = cfg->layers;
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
    model_upload_batch(&m->base, tokens, targets, BT);

    model_before_forward(&m->base, 0);
    RootTensors root = root_tensors(m, m->base.unit_weights[0]);
    trace_begin(s, "forward", 0);
    embedding_forward(s, a->encoded, m->base.tokens, root.wte, root.wpe, B, T, C);
    dropout_forward(s, a->encoded, a->encoded, BT * C, dropout_at(m, 0));
    trace_end(s);

    const float *x = a->encoded;  /* the residual stream entering each block */
    for (int l = 0; l < L; l++) {
        float *ln1 = a->ln1 + l * BT * C, *ln1_mean = a->ln1_mean + l * BT, *ln1_rstd = a->ln1_rstd + l * BT;
        float *qkv = a->qkv + l * BT * 3 * C, *att = a->att + l * BT * NH * T;
        float *atty = a->atty + l * BT * C, *attproj = a->attproj + l * BT * C;
        float *resid2 = a->resid2 + l * BT * C;
        float *ln2 = a->ln2 + l * BT * C, *ln2_mean = a->ln2_mean + l * BT, *ln2_rstd = a->ln2_rstd + l * BT;
        float *fch = a->fch + l * BT * 4 * C, *fch_gelu = a->fch_gelu + l * BT * 4 * C;
        float *fcproj = a->fcproj + l * BT * C, *resid3 = a->resid3 + l * BT * C;
        uint32_t site = 1 + 3 * (uint32_t)l;

        layernorm_forward(s, ln1, ln1_mean, ln1_rstd, x, forward_weights(m, l, LN1), BT, C);
        matmul_forward(s, qkv, ln1, forward_weights(m, l, QKV), BT, C, 3 * C);
        attention_forward(s, atty, att, a->att_scratch, qkv, B, T, C, NH, dropout_at(m, site));
        matmul_forward(s, attproj, atty, forward_weights(m, l, ATTPROJ), BT, C, C);
        dropout_forward(s, attproj, attproj, BT * C, dropout_at(m, site + 1));
        residual_forward(s, resid2, x, attproj, BT * C);
        layernorm_forward(s, ln2, ln2_mean, ln2_rstd, resid2, forward_weights(m, l, LN2), BT, C);
        matmul_forward(s, fch, ln2, forward_weights(m, l, FC), BT, C, 4 * C);
        gelu_forward(s, fch_gelu, fch, BT * 4 * C);
        matmul_forward(s, fcproj, fch_gelu, forward_weights(m, l, FCPROJ), BT, 4 * C, C);
        dropout_forward(s, fcproj, fcproj, BT * C, dropout_at(m, site + 2));
        residual_forward(s, resid3, resid2, fcproj, BT * C);
        trace_end(s);
        x = resid3;
    }

    trace_begin(s, "forward", 0);
    layernorm_forward(s, a->lnf, a->lnf_mean, a->lnf_rstd, x, root.lnf_w, BT, C);
    matmul_forward(s, a->logits, a->lnf, root.wte, BT, C, V);  /* head tied to wte */
    crossentropy_forward(s, a->mean_loss, a->losses, a->probs, a->logits,
                         targets ? m->base.targets : NULL, BT, V);
    trace_end(s);
}

void gpt_backward(GPT *m, float dloss) {
    Stream *s = m->base.stream;
    const ModelConfig *cfg = &m->base.cfg;
    int B = m->B, T = m->T, C = cfg->embd, NH = cfg->heads, V = cfg->vocab, L = cfg->layers;
    size_t BT = (size_t)B * T;
    Activations *a = &m->acts;

    model_before_backward(&m->base, 0);
    RootTensors root = root_tensors(m, m->base.unit_weights[0]);
    RootTensors droot = root_tensors(m, m->base.unit_grads[0]);
    const float *x_last = a->resid3 + (size_t)(L - 1) * BT * C;

    /* loss -> logits -> final LayerNorm; dresid carries d(residual stream) down */
    trace_begin(s, "backward", 0);
    crossentropy_backward(s, a->dlogits, a->probs, m->base.targets, BT, V, dloss / (float)BT);
    matmul_backward(s, a->dln, droot.wte, a->dlogits, a->lnf, root.wte, BT, C, V);
    fill_zero(s, a->dresid, BT * C);
    layernorm_backward(s, a->dresid, droot.lnf_w, a->dln, x_last, root.lnf_w,
                       a->lnf_mean, a->lnf_rstd, BT, C, m->base.layernorm_scratch);
    trace_end(s);

    for (int l = L - 1; l >= 0; l--) {
        const float *x = l > 0 ? a->resid3 + (size_t)(l - 1) * BT * C : a->encoded;
        float *ln1 = a->ln1 + l * BT * C, *ln1_mean = a->ln1_mean + l * BT, *ln1_rstd = a->ln1_rstd + l * BT;
        float *qkv = a->qkv + l * BT * 3 * C, *att = a->att + l * BT * NH * T;
        float *atty = a->atty + l * BT * C;
        float *resid2 = a->resid2 + l * BT * C;
        float *ln2 = a->ln2 + l * BT * C, *ln2_mean = a->ln2_mean + l * BT, *ln2_rstd = a->ln2_rstd + l * BT;
        float *fch = a->fch + l * BT * 4 * C, *fch_gelu = a->fch_gelu + l * BT * 4 * C;
        uint32_t site = 1 + 3 * (uint32_t)l;

        /* MLP: resid3 = resid2 + dropout(gelu(ln2(resid2) @ fc^T) @ fcproj^T) */
        enter_backward(m, l, FCPROJ);
        dropout_backward(s, a->dproj, a->dresid, BT * C, dropout_at(m, site + 2));
        matmul_backward(s, a->dfch_gelu, grads_of(m, l, FCPROJ), a->dproj, fch_gelu, weights_of(m, l, FCPROJ), BT,
                        4 * C, C);
        leave_backward(m, l, FCPROJ);
        enter_backward(m, l, FC);
        gelu_backward(s, a->dfch, fch, a->dfch_gelu, BT * 4 * C);
        matmul_backward(s, a->dln, grads_of(m, l, FC), a->dfch, ln2, weights_of(m, l, FC), BT, C, 4 * C);
        leave_backward(m, l, FC);
        enter_backward(m, l, LN2);
        layernorm_backward(s, a->dresid, grads_of(m, l, LN2), a->dln, resid2, weights_of(m, l, LN2), ln2_mean,
                           ln2_rstd, BT, C, m->base.layernorm_scratch);
        leave_backward(m, l, LN2);

        /* attention: resid2 = x + dropout(attention(ln1(x) @ qkv^T) @ attproj^T) */
        enter_backward(m, l, ATTPROJ);
        dropout_backward(s, a->dproj, a->dresid, BT * C, dropout_at(m, site + 1));
        matmul_backward(s, a->datty, grads_of(m, l, ATTPROJ), a->dproj, atty, weights_of(m, l, ATTPROJ), BT, C, C);
        leave_backward(m, l, ATTPROJ);
        enter_backward(m, l, QKV);
        attention_backward(s, a->dqkv, a->att_scratch, a->datty, qkv, att, B, T, C, NH,
                           dropout_at(m, site));
        matmul_backward(s, a->dln, grads_of(m, l, QKV), a->dqkv, ln1, weights_of(m, l, QKV), BT, C, 3 * C);
        leave_backward(m, l, QKV);
        enter_backward(m, l, LN1);
        layernorm_backward(s, a->dresid, grads_of(m, l, LN1), a->dln, x, weights_of(m, l, LN1), ln1_mean, ln1_rstd,
                           BT, C, m->base.layernorm_scratch);
        leave_backward(m, l, LN1);
    }

    /* embeddings: encoded = dropout(wte[tokens] + wpe) */
    trace_begin(s, "backward", 0);
    dropout_backward(s, a->dproj, a->dresid, BT * C, dropout_at(m, 0));
    embedding_backward(s, droot.wte, droot.wpe, a->dproj, m->base.tokens, B, T, C, V);
    trace_end(s);
    model_after_backward(&m->base, 0);
}
