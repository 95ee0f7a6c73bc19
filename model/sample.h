/* sample.h: generating text from a GPT, one token per forward. */
#ifndef ZF_SAMPLE_H
#define ZF_SAMPLE_H

#include <stdint.h>

#include "gpt.h"

/* tokens[0, n_prompt) is the prompt (at least one token); fills
 * tokens[n_prompt, n_prompt + n_new). Each step runs the forward over the last
 * block_size tokens and samples softmax(logits / temperature). Draws come from
 * Philox(seed), one counter per position. */
void gpt_generate(GPT *m, int *tokens, int n_prompt, int n_new, float temperature, uint32_t seed);

#endif
