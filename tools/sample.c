/* sample.c: bin/sample, text from a checkpoint.
 *
 *   bin/sample --ckpt PATH [--prompt TEXT] [--chars N] [--temperature T] [--top-k K] [--seed S]
 *
 * The model comes from the checkpoint, not from the flags; the prompt must use
 * the checkpoint's vocabulary. Generation runs on one rank (a GPU if there is
 * one, unless --device=cpu). The text goes to stdout as it comes, a piece of
 * SAMPLE_PIECE characters at a time (strategies/trainer.h), so a long one
 * needs no more memory than a short one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/blas_setup.h"
#include "../runtime/host.h"
#include "../strategies/checkpoint.h"
#include "../strategies/trainer.h"
#include "options.h"

/* A piece of the text to stdout; 0, or 1 when it could not be written. */
static int emit_text(void *ctx, const int *piece, int n) {
    const CheckpointInfo *info = ctx;
    for (int i = 0; i < n; i++) putchar(info->itos[piece[i]]);
    return fflush(stdout) != 0 || ferror(stdout);
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
    int *tokens = host_calloc((size_t)n_prompt, sizeof(int));
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
    if (!s) {
        free(tokens);
        return options_no_strategy_status(&o);
    }
    if (checkpoint_load(s, o.ckpt, 0, &info, err, sizeof err) != 0) {
        fprintf(stderr, "sample: %s\n", err);
        s->ops->destroy(s);
        free(tokens);
        return 1;
    }
    Sampling how = { o.temperature, o.top_k, (uint32_t)o.seed };
    for (int i = 0; i < n_prompt; i++) putchar(info.itos[tokens[i]]);
    rc = generate_pieces(s, tokens, n_prompt, o.sample_chars, how, emit_text, &info);
    if (rc == 0) rc = putchar('\n') == EOF || fflush(stdout) != 0;
    if (rc != 0) fprintf(stderr, "sample: cannot write the text: %s\n", strerror(errno));
    s->ops->destroy(s);
    free(tokens);
    return rc ? 1 : 0;
}
