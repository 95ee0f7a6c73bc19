/* sample.h: generating text from a GPT, one token per forward. */
#ifndef ZF_SAMPLE_H
#define ZF_SAMPLE_H

#include <stdint.h>

#include "gpt.h"

/* How to draw each token: softmax(logits / temperature) over the top_k
 * likeliest tokens (0: all of them) among ids 0..vocab-1, from Philox(seed),
 * one counter per position. vocab is the data's or the tokenizer's: ids past
 * it are the model's padding (--pad-vocab), never drawn; 0 for the model's. */
typedef struct {
    float temperature;
    int top_k;
    uint32_t seed;
    int vocab;
} Sampling;

/* tokens[0, n_prompt) is the prompt (at least one token); fills
 * tokens[n_prompt, n_prompt + n_new). Each step runs the forward over the last
 * block_size tokens and draws the next token as `how` says. */
void gpt_generate(GPT *m, int *tokens, int n_prompt, int n_new, Sampling how);

#endif
