/* mlp.h: a small residual MLP over tokens, the second model of the strategy gates.
 *
 * It shares the GPT's root unit (token embedding tied to the output head, and
 * position embedding), so its root gradient also completes only at the end of
 * the backward, and replaces each transformer block by one residual MLP layer:
 *
 *     x_0     = wte[token] + wpe[position]
 *     x_{l+1} = x_l + gelu(layernorm(x_l) @ fc_l^T)       (unit 1 + l)
 *     loss    = cross-entropy(x_L @ wte^T, target)
 *
 * Each unit mixes a 1-D tensor (no weight decay) with a 2-D one (decay), so a
 * shard boundary can cut between them. Positions never mix, and there is no
 * dropout: the model is small enough to check by hand.
 */
#ifndef ZF_MLP_H
#define ZF_MLP_H

#include "model.h"

typedef struct {
    Model base;                /* first: an MLP * is a Model * */
    int B, T;                  /* the shape of the last forward */
    /* activations, one allocation (mlp.c has the size table) */
    float *x;                  /* [L+1, BT, C] the residual stream entering each layer, and out */
    float *ln, *ln_mean, *ln_rstd;  /* [L, BT, C], [L, BT], [L, BT] */
    float *h, *h_gelu;         /* [L, BT, C] */
    float *logits;             /* [BT, V] */
    float *losses, *loss;      /* [BT], [1] */
    float *dx, *dln, *dh;      /* [BT, C] */
    float *dlogits;            /* [BT, V] */
} MLP;

/* Root unit: transformer.wte.weight [V, C], transformer.wpe.weight [block_size, C];
 * unit 1 + l: layers.l.ln.weight [C], layers.l.fc.weight [C, C]. */
void mlp_layout(const ModelConfig *cfg, int shard_multiple, ArenaLayout *layout);
/* An MLP over a layout of cfg (mlp_layout: a layer is one unit, whatever the
 * policy; the model copies it), for up to max_B x max_T positions, no arenas
 * (see model.h). */
MLP *mlp_create(const ModelConfig *cfg, const ArenaLayout *layout, Device *dev, Stream *stream, int max_B,
                int max_T);

#endif
