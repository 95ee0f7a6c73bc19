/* mlp.c: the residual MLP's layout, forward and backward, layer by layer. */
#include "mlp.h"

#include <stdio.h>
#include <stdlib.h>

#include "../kernels/kernels.h"
#include "../runtime/host.h"
#include "../runtime/trace.h"

void mlp_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout) {
    int C = cfg->embd;
    char name[ARENA_NAME_MAX];
    arena_init(layout, shard_multiple);
    arena_begin_unit(layout);
    arena_add_tensor(layout, "transformer.wte.weight", cfg->vocab, C);
    arena_add_tensor(layout, "transformer.wpe.weight", cfg->block_size, C);
    arena_end_unit(layout);
    for (int l = 0; l < cfg->layers; l++) {
        arena_begin_unit(layout);
        snprintf(name, sizeof name, "layers.%d.ln.weight", l);
        arena_add_tensor(layout, name, C, 0);
        snprintf(name, sizeof name, "layers.%d.fc.weight", l);
        arena_add_tensor(layout, name, C, C);
        arena_end_unit(layout);
    }
}

static void mlp_destroy(Model *base) { free(base); }

static void mlp_forward(Model *base, const int *tokens, const int *targets, int B, int T,
                        uint32_t step, int training) {
    (void)training;  /* no dropout */
    MLP *m = (MLP *)base;
    Stream *s = base->stream;
    int C = base->cfg.embd, V = base->cfg.vocab, L = base->cfg.layers;
    size_t BT = (size_t)B * T;
    if (B < 1 || T < 1 || T > base->cfg.block_size || BT > base->positions) {
        fprintf(stderr, "fatal: mlp forward of %d x %d on a model built for %zu positions\n", B, T, base->positions);
        abort();
    }
    m->B = B;
    m->T = T;
    model_upload_batch(base, tokens, targets, BT, step);

    model_before_forward(base, 0);
    const float *wte = model_tensor(base, base->unit_weights, 0), *wpe = model_tensor(base, base->unit_weights, 1);
    trace_begin(s, "forward", 0);
    embedding_forward(s, fp32_buf(m->x), base->tokens, fp32_numbers(wte), fp32_numbers(wpe), B, T, C, DTYPE_FP32);
    trace_end(s);
    for (int l = 0; l < L; l++) {
        model_before_forward(base, 1 + l);
        trace_begin(s, "forward", 1 + l);
        const float *ln_w = model_tensor(base, base->unit_weights, 2 + 2 * l);
        const float *fc_w = model_tensor(base, base->unit_weights, 3 + 2 * l);
        float *x = m->x + l * BT * C, *x_next = x + BT * C;
        float *ln = m->ln + l * BT * C, *h = m->h + l * BT * C, *h_gelu = m->h_gelu + l * BT * C;
        layernorm_forward(s, fp32_buf(ln), m->ln_mean + l * BT, m->ln_rstd + l * BT, fp32_numbers(x),
                          fp32_numbers(ln_w), fp32_numbers(NULL), BT, C, DTYPE_FP32);
        matmul_forward(s, h, ln, fc_w, BT, C, C);
        gelu_forward(s, fp32_buf(h_gelu), fp32_numbers(h), BT * C, 0, DTYPE_FP32);
        residual_forward(s, fp32_buf(x_next), fp32_numbers(x), fp32_numbers(h_gelu), BT * C, DTYPE_FP32);
        trace_end(s);
    }
    trace_begin(s, "forward", 0);
    matmul_forward(s, m->logits, m->x + L * BT * C, wte, BT, C, V);
    if (targets) {
        crossentropy_forward_backward(s, m->losses, fp32_buf(NULL), fp32_numbers(m->logits), base->targets, (int)BT,
                                      V, 0.0f, DTYPE_FP32);
        mean_forward(s, m->loss, m->losses, (int)BT);
    }
    trace_end(s);
}

static void mlp_backward(Model *base, float dloss) {
    MLP *m = (MLP *)base;
    Stream *s = base->stream;
    int C = base->cfg.embd, V = base->cfg.vocab, L = base->cfg.layers, BT = m->B * m->T;

    model_before_backward(base, 0);
    const float *wte = model_tensor(base, base->unit_weights, 0);
    float *dwte = model_tensor(base, base->unit_grads, 0), *dwpe = model_tensor(base, base->unit_grads, 1);
    trace_begin(s, "backward", 0);
    /* the losses again, the same bits, with their gradient */
    crossentropy_forward_backward(s, m->losses, fp32_buf(m->dlogits), fp32_numbers(m->logits), base->targets, BT, V,
                                  dloss / (float)BT, DTYPE_FP32);
    matmul_backward(s, m->dx, dwte, m->dlogits, m->x + (size_t)L * BT * C, wte, BT, C, V);
    trace_end(s);

    for (int l = L - 1; l >= 0; l--) {
        model_before_backward(base, 1 + l);
        /* tensors: wte, wpe, then ln and fc a layer */
        const float *ln_w = model_tensor(base, base->unit_weights, 2 + 2 * l);
        const float *fc_w = model_tensor(base, base->unit_weights, 3 + 2 * l);
        float *dln_w = model_tensor(base, base->unit_grads, 2 + 2 * l);
        float *dfc_w = model_tensor(base, base->unit_grads, 3 + 2 * l);
        size_t at = (size_t)l * BT * C;
        trace_begin(s, "backward", 1 + l);
        /* dx reaches x_l through the residual as it is, and through the branch */
        gelu_backward(s, fp32_buf(m->dh), fp32_buf(NULL), fp32_numbers(m->h + at), fp32_numbers(m->dx), BT, C, 0,
                      DTYPE_FP32, NULL);
        matmul_backward(s, m->dln, dfc_w, m->dh, m->ln + at, fc_w, BT, C, C);
        model_grad_done(base, 2 + 2 * l + 1);
        layernorm_backward(s, fp32_buf(m->dx), fp32_buf(dln_w), fp32_buf(NULL), fp32_numbers(m->dln),
                           fp32_numbers(m->x + at), fp32_numbers(ln_w), m->ln_mean + (size_t)l * BT,
                           m->ln_rstd + (size_t)l * BT, BT, C, base->column_sums_scratch, DTYPE_FP32);
        model_grad_done(base, 2 + 2 * l);
        trace_end(s);
        model_after_backward(base, 1 + l);
    }
    trace_begin(s, "backward", 0);
    ConstBuf none = { NULL, DTYPE_FP32 };
    embedding_backward(s, fp32_buf(dwte), fp32_buf(dwpe), fp32_numbers(m->dx), none, base->buckets, m->B, m->T, V, C,
                       DTYPE_FP32);
    trace_end(s);
    model_after_backward(base, 0);
}

static const ModelOps mlp_ops = { mlp_forward, mlp_backward, mlp_destroy };

MLP *mlp_create(const ModelConfig *cfg, const ArenaLayout *layout, Device *dev, Stream *stream, int max_B,
                int max_T) {
    MLP *m = host_calloc(1, sizeof *m);
    model_init(&m->base, &mlp_ops, cfg, layout, dev, stream);
    size_t L = cfg->layers, C = cfg->embd, V = cfg->vocab, BT = (size_t)max_B * max_T;
    /* the size table */
    ActivationSlot table[] = {
        { &m->x, (L + 1) * BT * C },
        { &m->ln, L * BT * C }, { &m->ln_mean, L * BT }, { &m->ln_rstd, L * BT },
        { &m->h, L * BT * C }, { &m->h_gelu, L * BT * C },
        { &m->logits, BT * V }, { &m->losses, BT }, { &m->loss, 1 },
        { &m->dx, BT * C }, { &m->dln, BT * C }, { &m->dh, BT * C }, { &m->dlogits, BT * V },
    };
    model_alloc_activations(&m->base, table, (int)(sizeof table / sizeof table[0]), BT);
    m->base.mean_loss = m->loss;
    return m;
}
