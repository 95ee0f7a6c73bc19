/* sample.c: bin/sample, text from a checkpoint.
 *
 *   bin/sample --ckpt PATH [--prompt TEXT] [--chars N] [--temperature T] [--top-k K] [--seed S]
 *   bin/sample --ckpt PATH --tokenizer JSON [--prompt TEXT] [--tokens N] [...]
 *
 * The model comes from the checkpoint (ours, or a Hugging Face GPT-2 folder,
 * model/hf_gpt2.h), not from the flags; the prompt must use
 * the checkpoint's vocabulary: its bytes, or, for a checkpoint of token ids,
 * the --tokenizer=tokenizer.json of its data, which encodes the prompt and
 * decodes what is generated: --tokens counts them, where --chars counts a
 * character model's (the other is refused). The prompt holds at most 511
 * bytes. Generation runs on one rank (a GPU if there is one, unless
 * --device=cpu). The text goes to stdout as it comes, a piece of
 * SAMPLE_PIECE characters at a time (training/trainer.h), so a long one
 * needs no more memory than a short one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_setup.h"
#include "../model/hf_gpt2.h"
#include "../model/tokenizer.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "options.h"

/* How the tokens are text: a checkpoint's bytes, or a tokenizer's ids. */
typedef struct {
    const CheckpointInfo *info;
    const Tokenizer *tokenizer;
} Decoder;

/* A piece of the text to stdout; 0, or 1 when it could not be written. */
static int emit_text(void *ctx, const int *piece, int n) {
    const Decoder *d = ctx;
    for (int i = 0; i < n; i++) {
        size_t len = 1;
        const unsigned char *bytes = d->tokenizer ? tokenizer_bytes(d->tokenizer, piece[i], &len)
                                                  : &d->info->itos[piece[i]];
        fwrite(bytes, 1, len, stdout);
    }
    return fflush(stdout) != 0 || ferror(stdout);
}

/* The prompt's tokens, by the checkpoint's bytes or by the tokenizer (which
 * must fit the model's vocabulary); NULL after a one-line error. */
static int *encode_prompt(const TrainOptions *o, const CheckpointInfo *info, const Tokenizer *tokenizer, int *n) {
    if (tokenizer) {
        TokenIds ids = { 0 };
        char err[512];
        if (tokenizer_encode(tokenizer, o->prompt, strlen(o->prompt), &ids, err, sizeof err) != 0) {
            fprintf(stderr, "sample: --prompt: %s\n", err);
            token_ids_free(&ids);
            return NULL;
        }
        int *tokens = host_calloc(ids.n, sizeof(int));
        for (size_t i = 0; i < ids.n; i++) tokens[i] = ids.ids[i];
        *n = (int)ids.n;
        token_ids_free(&ids);
        return tokens;
    }
    int stoi[256];
    for (int b = 0; b < 256; b++) stoi[b] = -1;
    for (int t = 0; t < info->chars; t++) stoi[info->itos[t]] = t;
    *n = (int)strlen(o->prompt);  /* not 0: an empty --prompt is refused */
    int *tokens = host_calloc((size_t)*n, sizeof(int));
    for (int i = 0; i < *n; i++) {
        tokens[i] = stoi[(unsigned char)o->prompt[i]];
        if (tokens[i] < 0) {
            fprintf(stderr, "sample: the prompt's character %d (byte 0x%02x) is not in the checkpoint's vocabulary\n",
                    i + 1, (unsigned char)o->prompt[i]);
            free(tokens);
            return NULL;
        }
    }
    return tokens;
}

/* The tokenizer a checkpoint needs: --tokenizer for one of token ids, of at
 * most the model's vocabulary; none for one of a text's bytes. 0, or 2 after
 * a one-line error. */
static int open_tokenizer(const TrainOptions *o, const CheckpointInfo *info, Tokenizer **tokenizer) {
    *tokenizer = NULL;
    char err[512];
    if (info->chars > 0 && o->tokenizer[0]) {
        fprintf(stderr, "sample: '%s' was trained on a text file's bytes, which need no --tokenizer\n", o->ckpt);
        return 2;
    }
    if (info->chars > 0) return 0;
    if (!o->tokenizer[0]) {
        fprintf(stderr, "sample: '%s' was trained on token ids: pass the --tokenizer of its data\n", o->ckpt);
        return 2;
    }
    if (!(*tokenizer = tokenizer_load(o->tokenizer, err, sizeof err))) {
        fprintf(stderr, "sample: %s\n", err);
        return 1;
    }
    if (tokenizer_vocab(*tokenizer) <= info->model.vocab) return 0;
    fprintf(stderr, "sample: --tokenizer=%s has %d ids, more than the model's vocabulary of %d\n", o->tokenizer,
            tokenizer_vocab(*tokenizer), info->model.vocab);
    tokenizer_free(*tokenizer);
    *tokenizer = NULL;
    return 2;
}

int main(int argc, char **argv) {
    cpu_setup(argv);
    TrainOptions o;
    int rc = options_parse(&o, TOOL_SAMPLE, "char", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (!o.ckpt[0]) {
        fprintf(stderr, "sample: --ckpt PATH is required (see --help)\n");
        return 2;
    }
    CheckpointInfo info;
    char err[768];
    HfGpt2 hf;
    int from_hf = hf_gpt2_at(o.ckpt);
    if (from_hf && hf_gpt2_open(o.ckpt, &hf, err, sizeof err) == 0)  /* its ids need the --tokenizer */
        info = (CheckpointInfo){ .model = hf.model, .seed = (uint32_t)o.seed, .foreign = 1 };
    else if (from_hf || checkpoint_read_info(o.ckpt, &info, err, sizeof err) != 0) {
        fprintf(stderr, "sample: %s\n", err);
        return 1;
    }
    Tokenizer *tokenizer;
    if ((rc = open_tokenizer(&o, &info, &tokenizer)) != 0) return rc;
    if (options_check_sample_unit(&o, TOOL_SAMPLE, info.chars > 0, argc, argv, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        tokenizer_free(tokenizer);
        return 2;
    }
    int n_prompt = 0;
    int *tokens = encode_prompt(&o, &info, tokenizer, &n_prompt);
    if (!tokens) {
        tokenizer_free(tokenizer);
        return 2;
    }
    StrategyConfig sc = { .model = info.model, .nranks = 1, .device = options_placement(&o), .batch = 1,
                          .seed = info.seed, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f };
    Strategy *s = strategy_create(0, &sc);
    if (!s) {
        free(tokens);
        tokenizer_free(tokenizer);
        return options_no_strategy_status(&o);
    }
    Decoder decoder = { &info, tokenizer };
    if (checkpoint_load(s, o.ckpt, 0, &info, err, sizeof err) != 0) {
        fprintf(stderr, "sample: %s\n", err);
        rc = -1;
    } else {
        int vocab = tokenizer ? tokenizer_vocab(tokenizer) : info.chars;  /* never the model's padding */
        Sampling how = { o.temperature, o.top_k, (uint32_t)o.seed, vocab };
        rc = emit_text(&decoder, tokens, n_prompt);
        if (rc == 0) rc = generate_pieces(s, tokens, n_prompt, o.sample_count, how, emit_text, &decoder);
        if (rc == 0) rc = putchar('\n') == EOF || fflush(stdout) != 0;
        if (rc != 0) fprintf(stderr, "sample: cannot write the text: %s\n", strerror(errno));
    }
    s->ops->destroy(s);
    free(tokens);
    tokenizer_free(tokenizer);
    return rc ? 1 : 0;
}
