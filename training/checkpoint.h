/* checkpoint.h: a whole run in one safetensors file, movable between strategies.
 *
 * The file holds the weights under nanoGPT's state_dict names and shapes, plus
 * lm_head.weight (the tied token embedding, as nanoGPT's state_dict has it), so
 * that nanoGPT's GPT(bias=False) loads them with load_state_dict; Adam's m and v
 * under "optim.exp_avg." and "optim.exp_avg_sq." and the same names; and in
 * __metadata__, as JSON strings: the model ("config", nanoGPT's GPTConfig
 * names), the vocabulary (the bytes of tokens 0..V-1), the steps done, Adam's
 * step, and the seed. Every random draw here (batches, dropout, sampling) is a
 * function of the seed and the step, so those two are the generators' state.
 *
 * Both ways stream, one tensor at a time, through the strategy's read_tensor
 * and write_tensor: a save writes the header first (from the layout), then
 * each tensor as its shards arrive, to a temporary file that is flushed and
 * renamed over the old one; a load checks every tensor, reading one at a
 * time, before it changes anything, then reads each again and sends every
 * rank its part. So the most any host holds of the state is one tensor, and
 * only process 0's; and a file saved by any strategy at any N resumes under
 * any other. Past one process (runtime/world.h) only process 0, global rank
 * 0's, reads or writes the file, and tells the others its outcome: no shared
 * filesystem is needed.
 */
#ifndef ZF_CHECKPOINT_H
#define ZF_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "../model/safetensors.h"
#include "../strategies/strategy.h"

typedef struct {
    ModelConfig model;
    int chars;                 /* the ids that are a text's bytes (itos), [0, chars), the model's ids past
                                  them (--pad-vocab) standing for none; 0: a tokenizer's ids (the file lists
                                  no vocabulary) */
    unsigned char itos[256];   /* token -> byte, chars of them */
    int iter;                  /* training steps done */
    int adam_step;
    uint32_t seed;
    int has_state;             /* the file holds Adam's state */
    int foreign;               /* a safetensors file without our metadata (weights only): the model is the
                                  one asked for, and the file says nothing of the vocabulary or steps */
    int hf_vocab;              /* a Hugging Face GPT-2 folder (model/hf_gpt2.h), foreign too: its vocabulary;
                                  0 for any other file */
} CheckpointInfo;

/* The file's side (checkpoint_file.c). */
enum { CHECKPOINT_NAME_MAX = ARENA_NAME_MAX + 32 };
extern const char CHECKPOINT_M_PREFIX[], CHECKPOINT_V_PREFIX[], CHECKPOINT_HEAD[];
extern const char CHECKPOINT_FILE_NAME[];  /* the trainer's file in its --out folder */
/* __metadata__ for info, as a JSON object of strings (free it). */
char *checkpoint_metadata_json(const CheckpointInfo *info);
/* The metadata of an open file, checked. 0, or -1 with a one-line message. */
int checkpoint_info_of(const StFile *f, const char *path, CheckpointInfo *info, char *err, size_t errlen);
/* Check an open file (whole, or header-only) against the model `want`, one
 * tensor at a time: every weight (F32, want's shapes, finite), and Adam's m
 * and v (finite, v never negative) when with_state, which asks for them;
 * without it only their dtypes and shapes. Without with_state, a file with no
 * model config or vocabulary in its metadata (one that PyTorch's
 * safetensors.torch.save_file wrote from nanoGPT's state_dict) is taken as
 * info->foreign: its tensors must have nanoGPT's names, lm_head.weight, if
 * there, equal to the token embedding. Then the arenas given (w, m, v, of the
 * GPT's layout at nranks = 1; any may be NULL, m and v read only when the
 * file holds them) get the file's tensors. 0, or -1 with a one-line message
 * naming the problem (CHECKPOINT_OTHER_MODEL where the file is whole but its
 * model is not want: the flags ask another one). */
enum { CHECKPOINT_OTHER_MODEL = -2 };
int checkpoint_check(const StFile *f, const char *path, const ModelConfig *want, int with_state,
                     CheckpointInfo *info, float *w, float *m, float *v, char *err, size_t errlen);

/* Tensor ts (of the layout at nranks = 1) of a state from an open file
 * checked by checkpoint_check, into out (its numel floats), checked again: 0,
 * or -1 with a one-line message. */
int checkpoint_read_tensor(const StFile *f, const char *path, StateOf what, const TensorSpec *ts, float *out,
                           char *err, size_t errlen);

/* Save s's weights and Adam state with info's metadata (info->model and the
 * vocabulary must be s's). 0, or -1 with a one-line message in err. */
int checkpoint_save(Strategy *s, const char *path, const CheckpointInfo *info, char *err, size_t errlen);

/* Read and check a checkpoint's metadata (its header alone). 0, or -1 with a
 * one-line message. */
int checkpoint_read_info(const char *path, CheckpointInfo *info, char *err, size_t errlen);

/* Load the weights, and with `with_state` Adam's m, v and step, into s, whose
 * model must be the file's. Every tensor is checked (names, dtype, shapes, no
 * missing or extra ones) before s changes. Without with_state, path may also
 * be a Hugging Face GPT-2 (hf_gpt2_at), read as model/hf_gpt2.h says. 0, or -1
 * with a one-line message (CHECKPOINT_OTHER_MODEL: s's model is not the file's). */
int checkpoint_load(Strategy *s, const char *path, int with_state, CheckpointInfo *info, char *err,
                    size_t errlen);

#endif
