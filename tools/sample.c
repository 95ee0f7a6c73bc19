/* sample.c: bin/sample, text from a checkpoint.
 *
 *   bin/sample --ckpt PATH [--prompt TEXT] [--chars N] [--temperature T] [--top-k K] [--seed S]
 *
 * The model comes from the checkpoint, not from the flags; the prompt must use
 * the checkpoint's vocabulary. Generation runs on one rank (a GPU if there is
 * one, unless --device=cpu).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/blas_setup.h"
#include "../runtime/host.h"
#include "../strategies/checkpoint.h"
#include "options.h"

/* New tokens per piece of output: memory stays bounded, and text appears as it comes. */
enum { SAMPLE_PIECE = 4096 };

/* Write tokens (the prompt, n_prompt of them, first) and o->sample_chars
 * generated after them to stdout, piece by piece. 0, or 1 after a one-line
 * error when stdout cannot be written. */
static int sample_out(Strategy *s, const TrainOptions *o, const CheckpointInfo *info, int *tokens, int n_prompt) {
    int block = info->model.block_size, have = n_prompt, left = o->sample_chars;
    Sampling how = { o->temperature, o->top_k, (uint32_t)o->seed };
    for (int i = 0; i < n_prompt; i++) putchar(info->itos[tokens[i]]);
    while (left > 0) {
        int n = left < SAMPLE_PIECE ? left : SAMPLE_PIECE;
        s->ops->generate(s, tokens, have, n, how);
        for (int i = have; i < have + n; i++) putchar(info->itos[tokens[i]]);
        if (fflush(stdout) != 0) break;
        have += n;
        left -= n;
        if (have > block) {  /* keep the last block: all the next piece's forward sees */
            memmove(tokens, tokens + have - block, (size_t)block * sizeof(int));
            have = block;
        }
        /* the draws are keyed by position in the buffer, which the next piece
         * reuses: a key of its own (a golden-ratio step) keeps them independent */
        how.seed += 0x9E3779B9u;
    }
    putchar('\n');
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "sample: cannot write the text: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    blas_ensure_core(argv);
    TrainOptions o;
    int rc = options_parse(&o, "sample", "char", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!o.ckpt[0]) {
        fprintf(stderr, "sample: --ckpt PATH is required (see --help)\n");
        return 2;
    }
    CheckpointInfo info;
    char err[768];
    if (checkpoint_read_info(o.ckpt, &info, err, sizeof err) != 0) {
        fprintf(stderr, "sample: %s\n", err);
        return 1;
    }
    int stoi[256];
    for (int b = 0; b < 256; b++) stoi[b] = -1;
    for (int t = 0; t < info.model.vocab; t++) stoi[info.itos[t]] = t;
    int n_prompt = (int)strlen(o.prompt);  /* not 0: an empty --prompt is refused */
    int block = info.model.block_size;
    /* the prompt, then at most SAMPLE_PIECE new tokens: the text goes out piece
     * by piece, each piece continuing the last block of tokens before it */
    int *tokens = host_calloc((size_t)(n_prompt > block ? n_prompt : block) + SAMPLE_PIECE, sizeof(int));
    for (int i = 0; i < n_prompt; i++) {
        int t = stoi[(unsigned char)o.prompt[i]];
        if (t < 0) {
            fprintf(stderr, "sample: the prompt's character %d (byte 0x%02x) is not in the checkpoint's vocabulary\n",
                    i + 1, (unsigned char)o.prompt[i]);
            free(tokens);
            return 2;
        }
        tokens[i] = t;
    }
    StrategyConfig sc = { .model = info.model, .nranks = 1, .device = options_placement(&o), .batch = 1,
                          .seed = info.seed, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f };
    Strategy *s = strategy_create(0, &sc);
    if (!s) {  /* --device=cuda without a GPU: a usage error, as in bin/train */
        free(tokens);
        return 2;
    }
    if (checkpoint_load(s, o.ckpt, 0, &info, err, sizeof err) != 0) {
        fprintf(stderr, "sample: %s\n", err);
        s->ops->destroy(s);
        free(tokens);
        return 1;
    }
    rc = sample_out(s, &o, &info, tokens, n_prompt);
    s->ops->destroy(s);
    free(tokens);
    return rc;
}
