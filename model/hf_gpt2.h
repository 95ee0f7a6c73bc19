/* hf_gpt2.h: GPT-2 as Hugging Face's transformers keeps it, in and out.
 *
 * A folder of config.json (GPT2Config: n_layer, n_head, n_embd, n_positions,
 * vocab_size, activation_function, ...) and model.safetensors, as
 * GPT2LMHeadModel's save_pretrained writes them. Its tensors have our names
 * (nanoGPT took them from GPT-2) with or without the "transformer." prefix,
 * and three differences:
 *   - attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj are Conv1D weights,
 *     stored [in, out]: the transpose of our (nanoGPT's Linear) [out, in];
 *   - lm_head.weight, if there, is the token embedding (tied; save_pretrained
 *     leaves it out);
 *   - older files keep attn.bias and attn.masked_bias, the causal mask's
 *     buffers, not parameters: ignored.
 * GPT-2 has a bias in every Linear and LayerNorm, and GELU's tanh form
 * (activation_function "gelu_new"; "gelu" is the exact one).
 */
#ifndef ZF_HF_GPT2_H
#define ZF_HF_GPT2_H

#include <stddef.h>

#include "model.h"
#include "safetensors.h"

enum { HF_PATH_MAX = 4096 };
/* The folder's two files. */
extern const char HF_CONFIG_NAME[], HF_WEIGHTS_NAME[];

typedef struct {
    char config_path[HF_PATH_MAX];   /* DIR/config.json */
    char weights_path[HF_PATH_MAX];  /* DIR/model.safetensors */
    ModelConfig model;               /* config.json's shape: its vocabulary, n_positions as block_size, biases */
} HfGpt2;

/* Whether path names a Hugging Face GPT-2: a folder holding config.json, or a
 * file whose folder holds a config.json of model_type "gpt2". */
int hf_gpt2_at(const char *path);

/* Read and check config.json of the GPT-2 at path (a folder, or its
 * model.safetensors). 0, or -1 with a one-line message naming what GPT2Config
 * holds that this GPT is not (another model_type, an n_inner other than
 * 4 n_embd, another activation or LayerNorm epsilon, unscaled attention,
 * cross-attention, an untied head). */
int hf_gpt2_open(const char *path, HfGpt2 *hf, char *err, size_t errlen);

/* The weights of hf into host arena w of want's layout at nranks 1. want has
 * hf's layers, heads, width, biases and GELU; a block_size of at most
 * n_positions (the first rows of the position embedding are kept, as
 * nanoGPT's crop_block_size keeps them); and a vocabulary of at least the
 * file's, whose extra rows are zero. Every tensor is checked (F32, finite,
 * shape) and none but GPT-2's may be there. 0, or -1 with a one-line message. */
int hf_gpt2_read_weights(const HfGpt2 *hf, const ModelConfig *want, float *w, char *err, size_t errlen);
/* The same, streamed from hf's model.safetensors opened header-only in f:
 * check every tensor as hf_gpt2_read_weights does, reading one at a time;
 * then tensor t of want's layout into out (its numel floats). 0, or -1 with a
 * one-line message (HF_GPT2_OTHER_MODEL: the folder's GPT-2 is not want). */
enum { HF_GPT2_OTHER_MODEL = -2 };
int hf_gpt2_check(const HfGpt2 *hf, const StFile *f, const ModelConfig *want, char *err, size_t errlen);
int hf_gpt2_read_tensor(const HfGpt2 *hf, const StFile *f, const ModelConfig *want, int t, float *out, char *err,
                        size_t errlen);

/* Write the GPT of host arena w (layout of model at nranks 1) as a Hugging
 * Face GPT-2 folder dir (made if missing): config.json and model.safetensors,
 * each written to a temporary file and renamed into place. The first vocab
 * rows of the token embedding go (the rest is padding); a model without
 * biases gets zero ones, which GPT-2's layers add to the same outputs. 0, or
 * -1 with a one-line message. */
int hf_gpt2_write(const char *dir, const ModelConfig *model, int vocab, const float *w, char *err, size_t errlen);

#endif
