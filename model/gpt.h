/* gpt.h: nanoGPT's character GPT: config, parameter layout, forward, backward.
 *
 * Parameters are laid out unit by unit in one arena (runtime/arena.h): unit 0 is
 * the root (token embedding wte, tied to the output head; position embedding wpe;
 * final LayerNorm ln_f), unit 1 + l is transformer block l. Tensor names are
 * nanoGPT's, so weights move to and from PyTorch unchanged.
 *
 * The model reads a unit's weights through unit_weights[u] and writes its
 * gradient through unit_grads[u]. Both point into the model's own arenas unless a
 * strategy redirects them from its hooks (a gather buffer, a gradient slot).
 */
#ifndef ZF_GPT_H
#define ZF_GPT_H

#include <stdint.h>

#include "../kernels/kernels.h"
#include "../runtime/arena.h"
#include "../runtime/device.h"

typedef struct {
    int vocab;       /* V */
    int block_size;  /* maximum T */
    int layers;      /* L */
    int heads;       /* NH */
    int embd;        /* C */
} GPTConfig;

/* Called at unit boundaries; any may be NULL. */
typedef struct {
    void (*before_forward)(void *ctx, int unit);
    void (*before_backward)(void *ctx, int unit);
    void (*after_backward)(void *ctx, int unit);
    void *ctx;
} UnitHooks;

/* Forward activations (kept for the backward) and the backward's workspace,
 * reused by every block. One allocation; see gpt.c for the size table. */
typedef struct {
    float *encoded;                          /* [B,T,C] embeddings after dropout */
    float *ln1, *ln1_mean, *ln1_rstd;        /* [L,B,T,C], [L,B,T] */
    float *qkv;                              /* [L,B,T,3C] */
    float *att;                              /* [L,B,NH,T,T] softmax probabilities */
    float *atty;                             /* [L,B,T,C] attention output */
    float *attproj;                          /* [L,B,T,C] after dropout */
    float *resid2;                           /* [L,B,T,C] */
    float *ln2, *ln2_mean, *ln2_rstd;        /* [L,B,T,C], [L,B,T] */
    float *fch, *fch_gelu;                   /* [L,B,T,4C] */
    float *fcproj;                           /* [L,B,T,C] after dropout */
    float *resid3;                           /* [L,B,T,C] */
    float *lnf, *lnf_mean, *lnf_rstd;        /* [B,T,C], [B,T] */
    float *logits, *probs;                   /* [B,T,V] */
    float *losses;                           /* [B,T] */
    float *mean_loss;                        /* [1] */
    float *dresid, *dln, *dproj, *datty;     /* [B,T,C] */
    float *dqkv;                             /* [B,T,3C] */
    float *dfch, *dfch_gelu;                 /* [B,T,4C] */
    float *dlogits;                          /* [B,T,V] */
    float *att_scratch;                      /* [2,B,NH,T,T] */
} Activations;

enum { ACTIVATION_TENSORS = 32 };

typedef struct {
    GPTConfig cfg;
    int max_B, max_T;              /* activation capacity */
    ArenaLayout layout;
    Device *dev;
    Stream *stream;                /* compute stream: every op of this model */
    float *params, *grads;         /* arenas of layout.total floats (NULL if not owned) */
    float **unit_weights;          /* [nunits] where each unit's weights are read */
    float **unit_grads;            /* [nunits] where each unit's gradient goes */
    Activations acts;
    float *acts_memory;
    size_t acts_floats;
    int *tokens, *targets;         /* device copies of the batch, [max_B * max_T] */
    UnitHooks hooks;
    /* dropout: keyed by (seed, rank, step, site) */
    float dropout;
    uint32_t seed, rank;
    /* the shape and step of the last forward */
    int B, T;
    uint32_t step;
    int training;
} GPT;

/* NULL when the config is usable, else a message naming what is wrong. */
const char *gpt_config_error(const GPTConfig *cfg);
/* The unit-by-unit layout with nanoGPT's names; units padded to shard_multiple. */
void gpt_layout(const GPTConfig *cfg, int shard_multiple, ArenaLayout *layout);
/* nanoGPT's init into a host buffer of layout->total floats (padding zeroed):
 * N(0, 0.02), residual output projections N(0, 0.02 / sqrt(2L)), norms 1. */
void gpt_init_params(const GPTConfig *cfg, const ArenaLayout *layout, uint32_t seed, float *host);

/* Allocate activations for up to max_B x max_T, and, when own_arenas, the
 * parameter and gradient arenas (zeroed). */
GPT *gpt_create(const GPTConfig *cfg, int shard_multiple, Device *dev, Stream *stream,
                int max_B, int max_T, int own_arenas);
void gpt_destroy(GPT *m);

/* Enqueue the forward over host tokens/targets [B*T] (targets may be NULL);
 * the host arrays must stay unchanged until the stream has run the copies.
 * training = 1 applies dropout with this step's masks. */
void gpt_forward(GPT *m, const int *tokens, const int *targets, int B, int T,
                 uint32_t step, int training);
/* Enqueue the backward of the last forward (which had targets), accumulating
 * into the unit gradients: d(mean loss) scaled by dloss. */
void gpt_backward(GPT *m, float dloss);
/* Wait for the stream and return the mean loss of the last forward. */
float gpt_read_loss(GPT *m);

#endif
