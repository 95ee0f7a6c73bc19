/* test_hf.c: Hugging Face GPT-2 folders in and out (model/hf_gpt2.h), against
 * transformers itself (tests/transformers_reference.py, in the venv that
 * `make venv` makes; no weights downloaded: random GPT2LMHeadModels).
 *
 * Our logits of a folder equal transformers' to 1e-5 of the largest; our
 * greedy continuation is its generate(do_sample=False), token for token; an
 * older file (no "transformer." prefix, the mask's buffers, lm_head) reads as
 * the same weights; a model bin/train fine-tunes from a folder and bin/export
 * writes back loads in transformers with our logits. Without the venv: our
 * own folders read back bit for bit, and the inputs we refuse.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/gpt.h"
#include "../model/hf_gpt2.h"
#include "../model/sample.h"
#include "../training/checkpoint.h"
#include "fixtures.h"
#include "reference.h"

TestSuite(hf, .init = test_stream_setup, .fini = test_stream_teardown, .timeout = 300);

/* The reference model: GPT-2's form, 2 layers, 4 heads, 32 wide, 48 positions, 101 ids. */
enum { VOCAB = 101, POSITIONS = 48, EMBD = 32, LAYERS = 2, HEADS = 4, PADDED = 128, B = 2, T = 20 };

/* tests/transformers_reference.py with the formatted arguments, its stdout to out (or nowhere); it must succeed. */
__attribute__((format(printf, 2, 3))) static void python(const char *out, const char *args_fmt, ...) {
    char args[1024], cmd[2400];
    va_list ap;
    va_start(ap, args_fmt);
    vsnprintf(args, sizeof args, args_fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s tests/transformers_reference.py %s >%s 2>/dev/null", venv_python(), args,
             out ? out : "/dev/null");
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static ModelConfig gpt2_form(int vocab, int block) {
    return (ModelConfig){ vocab, block, LAYERS, HEADS, EMBD, MODEL_GPT, 1, 1 };
}

static HfGpt2 open_folder(const char *path) {
    HfGpt2 hf;
    char err[1024];
    cr_assert_eq(hf_gpt2_open(path, &hf, err, sizeof err), 0, "%s", err);
    return hf;
}

/* The folder's weights in an arena of want's layout (malloc'd). */
static float *read_folder(const char *path, const ModelConfig *want) {
    HfGpt2 hf = open_folder(path);
    ArenaLayout layout;
    gpt_layout(want, 1, &layout);
    float *w = malloc(layout.total * sizeof(float));
    char err[1024];
    cr_assert_eq(hf_gpt2_read_weights(&hf, want, w, err, sizeof err), 0, "%s", err);
    return w;
}

/* A GPT of cfg holding the weights w, on the test stream, for rows of up to max_T. */
static GPT *model_with(const ModelConfig *cfg, const float *w, int max_T) {
    GPT *m = (GPT *)test_model(cfg, 1, max_T);
    stream_copy(test_stream, m->base.params, w, m->base.layout.total * sizeof(float));
    stream_synchronize(test_stream);
    return m;
}

/* Our logits [B, T, columns] of tokens [B, T]: a forward per prefix, whose last
 * position's logits the model computes (causal: the same as the whole row's).
 * zero_padding: the rows past VOCAB are zero (as read, not trained), and so
 * are their logits. */
static float *our_logits(const ModelConfig *cfg, const float *w, const int *tokens, int columns, int zero_padding) {
    GPT *m = model_with(cfg, w, T);
    float *logits = malloc((size_t)B * T * columns * sizeof(float)), *row = malloc((size_t)cfg->vocab * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            gpt_forward(m, tokens + b * T, NULL, 1, t + 1, 0, 0);
            stream_copy(test_stream, row, m->acts.logits, (size_t)cfg->vocab * sizeof(float));
            stream_synchronize(test_stream);
            memcpy(logits + ((size_t)b * T + t) * columns, row, (size_t)columns * sizeof(float));
            for (int j = VOCAB; zero_padding && j < cfg->vocab; j++)
                cr_expect_eq(row[j], 0.0f, "the padding's logit %d is %g, not 0 (its row is zero)", j, row[j]);
        }
    model_destroy(&m->base);
    free(row);
    return logits;
}

/* transformers' logits of the folder for tokens [B, T] (malloc'd, [B, T, VOCAB]). */
static float *their_logits(const char *dir, const char *folder, const int *tokens) {
    char tokens_path[512], out[512];
    snprintf(tokens_path, sizeof tokens_path, "%s/tokens.i32", dir);
    snprintf(out, sizeof out, "%s/logits.f32", dir);
    FILE *f = fopen(tokens_path, "wb");
    cr_assert(f && fwrite(tokens, sizeof(int), (size_t)B * T, f) == (size_t)B * T && fclose(f) == 0);
    python(NULL, "logits %s %s %s %d %d", folder, tokens_path, out, B, T);
    size_t n;
    float *logits = (float *)read_all(out, &n);
    cr_assert_eq(n, (size_t)B * T * VOCAB * sizeof(float), "transformers wrote %zu bytes of logits", n);
    return logits;
}

static void random_tokens(int *tokens, int n, unsigned seed) {
    srand(seed);
    for (int i = 0; i < n; i++) tokens[i] = rand() % VOCAB;
}

/* A random GPT2LMHeadModel of the reference shape, saved by save_pretrained into dir/NAME. */
static void make_reference(const char *dir, const char *name, char *folder, size_t len) {
    snprintf(folder, len, "%s/%s", dir, name);
    python(NULL, "make %s %d %d %d %d %d 7", folder, VOCAB, POSITIONS, EMBD, LAYERS, HEADS);
}

/* The start of a test against transformers: a fresh dir (64 bytes), a random
 * reference model in folder (128 bytes), its weights in cfg's layout (malloc'd). */
static float *start_with_reference(char *dir, char *folder, const ModelConfig *cfg) {
    need_transformers();
    temp_dir(dir, 64, "hf");
    make_reference(dir, "random", folder, 128);
    return read_folder(folder, cfg);
}

static void expect_close(const float *ours, const float *theirs, size_t n, const char *what) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)ours[i] - theirs[i]));
        scale = fmax(scale, fabs((double)theirs[i]));
    }
    cr_expect(scale > 0 && diff / scale <= 1e-5, "%s: max |ours - transformers'| / max |transformers'| = %g "
              "(at most 1e-5)", what, diff / scale);
}

/* Our logits of w (cfg's model) for a random batch, against transformers' of folder. */
static void expect_transformers_logits(const char *dir, const char *folder, const ModelConfig *cfg, const float *w,
                                       int zero_padding, unsigned seed, const char *what) {
    int tokens[B * T];
    random_tokens(tokens, B * T, seed);
    float *ours = our_logits(cfg, w, tokens, VOCAB, zero_padding), *theirs = their_logits(dir, folder, tokens);
    expect_close(ours, theirs, (size_t)B * T * VOCAB, what);
    free(ours);
    free(theirs);
}

Test(hf, our_logits_equal_transformers) {
    char dir[64], folder[128];
    ModelConfig cfg = gpt2_form(PADDED, POSITIONS);  /* 101 ids padded to 128 with zero rows */
    float *w = start_with_reference(dir, folder, &cfg);
    expect_transformers_logits(dir, folder, &cfg, w, 1, 3, "logits");
    free(w);
    remove_dir(dir);
}

Test(hf, greedy_continuation_equals_transformers_generate) {
    char dir[64], folder[128], out[160];
    ModelConfig cfg = gpt2_form(PADDED, POSITIONS);
    float *w = start_with_reference(dir, folder, &cfg);
    enum { PROMPT = 3, NEW = 30 };
    int tokens[PROMPT + NEW] = { 5, 17, 64 }, theirs[NEW];
    GPT *m = model_with(&cfg, w, POSITIONS);
    gpt_generate(m, tokens, PROMPT, NEW, (Sampling){ 1.0f, 1, 0, VOCAB });
    snprintf(out, sizeof out, "%s/generated.txt", dir);
    python(out, "generate %s %d %d %d %d", folder, NEW, tokens[0], tokens[1], tokens[2]);
    FILE *f = fopen(out, "r");
    cr_assert_not_null(f);
    for (int i = 0; i < NEW; i++) cr_assert_eq(fscanf(f, "%d", &theirs[i]), 1, "transformers gave fewer ids");
    fclose(f);
    int distinct = 0;
    for (int i = 0; i < NEW; i++) {
        cr_expect_eq(tokens[PROMPT + i], theirs[i], "new token %d: ours %d, transformers' %d", i,
                     tokens[PROMPT + i], theirs[i]);
        distinct += i == 0 || theirs[i] != theirs[i - 1];
    }
    cr_expect_gt(distinct, 3, "the continuation changes token now and then (a test of more than one argmax)");
    model_destroy(&m->base);
    free(w);
    remove_dir(dir);
}

Test(hf, an_older_file_reads_as_the_same_weights) {
    char dir[64], folder[128], older[128];
    ModelConfig cfg = gpt2_form(VOCAB, POSITIONS);
    float *w = start_with_reference(dir, folder, &cfg);
    snprintf(older, sizeof older, "%s/older", dir);
    python(NULL, "legacy %s %s", folder, older);
    ArenaLayout layout;
    gpt_layout(&cfg, 1, &layout);
    float *w_older = read_folder(older, &cfg);
    cr_expect_eq(memcmp(w, w_older, layout.total * sizeof(float)), 0,
                 "no prefix, the mask's buffers and lm_head.weight: the same weights");
    free(w);
    free(w_older);
    remove_dir(dir);
}

/* A folder of token ids < VOCAB for bin/train. */
static void token_folder(const char *dir) {
    char path[256];
    for (int split = 0; split < 2; split++) {
        uint16_t ids[3000];
        srand(11 + split);
        for (int i = 0; i < 3000; i++) ids[i] = (uint16_t)(rand() % VOCAB);
        snprintf(path, sizeof path, "%s/%s", dir, split ? "val.bin" : "train.bin");
        FILE *f = fopen(path, "wb");
        cr_assert(f && fwrite(ids, sizeof ids, 1, f) == 1 && fclose(f) == 0);
    }
    snprintf(path, sizeof path, "%s/meta.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f && fprintf(f, "{\"vocab_size\": %d, \"dtype\": \"uint16\"}\n", VOCAB) > 0 && fclose(f) == 0);
}

/* The weights of our checkpoint at path (malloc'd), its model into cfg. */
static float *read_checkpoint(const char *path, ModelConfig *cfg) {
    CheckpointInfo info;
    StFile f;
    char err[1024];
    cr_assert_eq(checkpoint_read_info(path, &info, err, sizeof err), 0, "%s", err);
    cr_assert_eq(safetensors_open(&f, path, err, sizeof err), 0, "%s", err);
    ArenaLayout layout;
    gpt_layout(&info.model, 1, &layout);
    float *w = malloc(layout.total * sizeof(float));
    cr_assert_eq(checkpoint_check(&f, path, &info.model, 0, &info, w, NULL, NULL, err, sizeof err), 0, "%s", err);
    safetensors_close(&f);
    *cfg = info.model;
    return w;
}

Test(hf, a_fine_tuned_export_loads_in_transformers_with_our_logits) {
    need_transformers();
    char dir[64], folder[128], args[1024], err[2048], out[160], exported[128], ckpt[160];
    temp_dir(dir, sizeof dir, "hf");
    make_reference(dir, "random", folder, sizeof folder);
    token_folder(dir);
    snprintf(out, sizeof out, "%s/train.out", dir);
    /* cropped to 32 positions, padded to 128 ids, ZeRO-3 on 2 ranks */
    snprintf(args, sizeof args, "--init-from=%s --data=%s --block=32 --batch=2 --iters=3 --eval-iters=1 "
             "--sample-chars=0 --pad-vocab=64 --zero=3 --gpus=2 --lr=1e-2 --warmup=0 --out=%s/run", folder, dir, dir);
    cr_assert_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "train: %s", err);
    size_t n;
    char *said = (char *)read_all(out, &n);
    cr_expect(strstr(said, "a Hugging Face GPT-2") && strstr(said, "2 layers, 4 heads, 32 wide, block 32, "
              "vocabulary 128, biases, GELU tanh"), "the model is the folder's: %s", said);
    free(said);
    snprintf(ckpt, sizeof ckpt, "%s/run/ckpt.safetensors", dir);
    snprintf(exported, sizeof exported, "%s/exported", dir);
    snprintf(args, sizeof args, "--ckpt=%s --hf=%s --vocab=%d", ckpt, exported, VOCAB);
    cr_assert_eq(run_tool(export_binary(), args, out, err, sizeof err), 0, "export: %s", err);
    ModelConfig tuned;
    float *w = read_checkpoint(ckpt, &tuned);
    ModelConfig start_cfg = tuned;
    float *start = read_folder(folder, &start_cfg);
    ArenaLayout layout;
    gpt_layout(&tuned, 1, &layout);
    cr_expect_gt(max_rel_diff(w, start, layout.total), 1e-3, "three steps moved the weights");
    expect_transformers_logits(dir, exported, &tuned, w, 0, 5, "the fine-tuned model's logits");
    free(start);
    free(w);
    remove_dir(dir);
}

/* Random weights of cfg's layout (malloc'd). */
static float *random_weights(const ModelConfig *cfg, unsigned seed) {
    ArenaLayout layout;
    gpt_layout(cfg, 1, &layout);
    float *w = calloc(layout.total, sizeof(float));
    for (int i = 0; i < layout.ntensors; i++)
        fill_uniform(w + layout.tensors[i].offset, layout.tensors[i].numel, -1, 1, seed + (unsigned)i);
    return w;
}

/* The folder's tensor `name` of the arena w (cfg's layout at nranks 1). */
static const float *tensor_of(const ModelConfig *cfg, const float *w, const char *name) {
    ArenaLayout layout;
    gpt_layout(cfg, 1, &layout);
    int i = arena_find(&layout, name);
    cr_assert_geq(i, 0, "no tensor %s", name);
    return w + layout.tensors[i].offset;
}

Test(hf, a_folder_we_write_reads_back_bit_for_bit) {
    char dir[64], folder[128], err[1024];
    temp_dir(dir, sizeof dir, "hf");
    snprintf(folder, sizeof folder, "%s/out", dir);
    ModelConfig padded = gpt2_form(PADDED, POSITIONS), cut = gpt2_form(VOCAB, POSITIONS);
    float *w = random_weights(&padded, 1);
    cr_assert_eq(hf_gpt2_write(folder, &padded, VOCAB, w, err, sizeof err), 0, "%s", err);
    HfGpt2 hf = open_folder(folder);
    cr_expect(hf.model.vocab == VOCAB && hf.model.block_size == POSITIONS && hf.model.layers == LAYERS &&
              hf.model.heads == HEADS && hf.model.embd == EMBD && hf.model.bias && hf.model.gelu_tanh,
              "config.json holds the shape written");
    /* begin and end of text: ids the vocabulary has (transformers' default, GPT-2's 50256, is past it) */
    char config[160];
    snprintf(config, sizeof config, "%s/config.json", folder);
    json_t *c = json_load_file(config, 0, NULL);
    cr_expect(json_integer_value(json_object_get(c, "bos_token_id")) == VOCAB - 1 &&
              json_integer_value(json_object_get(c, "eos_token_id")) == VOCAB - 1, "bos and eos are not id %d",
              VOCAB - 1);
    json_decref(c);
    /* a tool that reads checkpoint files only names the folder for what it is */
    char args[512], out_dir[160];
    snprintf(out_dir, sizeof out_dir, "%s/again", dir);
    snprintf(args, sizeof args, "--ckpt=%s --hf=%s", folder, out_dir);
    expect_one_line(run_tool(export_binary(), args, "/dev/null", err, sizeof err), 1, err,
                    "is a Hugging Face folder, not a checkpoint file", "bin/export of an export");
    snprintf(args, sizeof args, "--iters=2 --resume=%s --out=%s", folder, out_dir);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "is a Hugging Face folder, not a checkpoint file",
                    "--resume of an export");
    float *back = read_folder(folder, &padded);
    ArenaLayout layout;
    gpt_layout(&padded, 1, &layout);
    for (int i = 0; i < layout.ntensors; i++) {
        const TensorSpec *ts = &layout.tensors[i];
        size_t kept = strstr(ts->name, "wte.") ? (size_t)VOCAB * EMBD : ts->numel;
        cr_expect_eq(memcmp(back + ts->offset, w + ts->offset, kept * sizeof(float)), 0, "%s read back", ts->name);
        for (size_t k = kept; k < ts->numel; k++)
            cr_expect_eq(back[ts->offset + k], 0.0f, "the padding's rows are zero");
    }
    /* a model without biases: zero ones, which read back into GPT-2's form */
    ModelConfig plain = cut;
    plain.bias = 0;
    float *w_plain = random_weights(&plain, 2);
    cr_assert_eq(hf_gpt2_write(folder, &plain, VOCAB, w_plain, err, sizeof err), 0, "%s", err);
    float *back_biased = read_folder(folder, &cut);
    cr_expect_eq(memcmp(tensor_of(&cut, back_biased, "transformer.h.1.mlp.c_fc.weight"),
                        tensor_of(&plain, w_plain, "transformer.h.1.mlp.c_fc.weight"), 4 * EMBD * EMBD * sizeof(float)),
                 0, "a Conv1D weight, transposed out and back");
    const float *bias = tensor_of(&cut, back_biased, "transformer.h.1.mlp.c_fc.bias");
    for (int k = 0; k < 4 * EMBD; k++) cr_expect_eq(bias[k], 0.0f, "a bias the model lacked is zero");
    free(back_biased);
    free(w_plain);
    free(back);
    free(w);
    remove_dir(dir);
}

/* dir/config.json with `from` replaced by `to` (which must be there). */
static void edit_config(const char *folder, const char *from, const char *to) {
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", folder);
    size_t n;
    char *text = (char *)read_all(path, &n), *at = strstr(text, from);
    cr_assert_not_null(at, "config.json holds no %s", from);
    FILE *f = fopen(path, "w");
    cr_assert(f && fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from)) > 0 && fclose(f) == 0);
    free(text);
}

/* hf_gpt2_open of the folder fails, saying `why`. */
static void expect_refused(const char *folder, const char *why) {
    HfGpt2 hf;
    char err[1024] = "";
    cr_expect_neq(hf_gpt2_open(folder, &hf, err, sizeof err), 0, "accepted, where %s was expected", why);
    cr_expect(strstr(err, why) != NULL, "the message names %s: %s", why, err);
}

Test(hf, what_this_gpt_is_not_is_refused_in_one_line) {
    char dir[64], folder[128], err[1024], args[512], out[160], text[2048];
    temp_dir(dir, sizeof dir, "hf");
    snprintf(folder, sizeof folder, "%s/out", dir);
    ModelConfig cfg = gpt2_form(VOCAB, POSITIONS);
    float *w = random_weights(&cfg, 3);
    struct { const char *from, *to, *why; } edits[] = {
        { "\"gelu_new\"", "\"relu\"", "activation_function 'relu'" },
        { "\"n_inner\": null", "\"n_inner\": 96", "n_inner" },
        { "\"model_type\": \"gpt2\"", "\"model_type\": \"gptj\"", "model_type 'gptj'" },
        { "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false", "untied head" },
        { "\"n_layer\": 2", "\"n_layer\": 0", "n_layer" },
        { "\"layer_norm_epsilon\": 1e-5", "\"layer_norm_epsilon\": 1e-06", "layer_norm_epsilon" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) {
        cr_assert_eq(hf_gpt2_write(folder, &cfg, VOCAB, w, err, sizeof err), 0, "%s", err);
        edit_config(folder, edits[i].from, edits[i].to);
        expect_refused(folder, edits[i].why);
    }
    /* a tensor GPT-2 does not have */
    cr_assert_eq(hf_gpt2_write(folder, &cfg, VOCAB, w, err, sizeof err), 0, "%s", err);
    ModelConfig deeper = cfg;
    deeper.layers = 3;
    float *w_deeper = random_weights(&deeper, 4);
    char deeper_folder[160];
    snprintf(deeper_folder, sizeof deeper_folder, "%s/deeper", dir);
    cr_assert_eq(hf_gpt2_write(deeper_folder, &deeper, VOCAB, w_deeper, err, sizeof err), 0, "%s", err);
    edit_config(deeper_folder, "\"n_layer\": 3", "\"n_layer\": 2");
    HfGpt2 hf = open_folder(deeper_folder);
    ArenaLayout layout;
    gpt_layout(&cfg, 1, &layout);
    float *into = malloc(layout.total * sizeof(float));
    cr_expect_neq(hf_gpt2_read_weights(&hf, &cfg, into, err, sizeof err), 0, "a third layer's tensors read");
    cr_expect(strstr(err, "transformer.h.2.") && strstr(err, "not GPT-2's"), "%s", err);
    /* bin/train: a shape flag that asks another model, data with more ids than the folder */
    token_folder(dir);
    snprintf(out, sizeof out, "%s/train.out", dir);
    snprintf(args, sizeof args, "--init-from=%s --data=%s --layers=3 --iters=1", folder, dir);
    cr_expect_eq(run_tool(train_binary(), args, out, text, sizeof text), 2, "--layers=3 over 2 layers: %s", text);
    cr_expect(strstr(text, "--layers=3, and the Hugging Face --init-from") != NULL, "%s", text);
    snprintf(args, sizeof args, "--init-from=%s --data=%s --block=64 --iters=1", folder, dir);
    cr_expect_eq(run_tool(train_binary(), args, out, text, sizeof text), 2, "--block=64 over 48 positions: %s", text);
    cr_expect(strstr(text, "has 48 positions") != NULL, "%s", text);
    snprintf(args, sizeof args, "--init-from=%s --data=data/tinyshakespeare.txt --iters=1", folder);
    cr_expect_eq(run_tool(train_binary(), args, out, text, sizeof text), 2, "a text file's bytes: %s", text);
    cr_expect(strstr(text, "is a text file, whose bytes are its tokens") != NULL, "%s", text);
    ModelConfig small = gpt2_form(50, POSITIONS);
    float *w_small = random_weights(&small, 5);
    cr_assert_eq(hf_gpt2_write(folder, &small, 50, w_small, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--init-from=%s --data=%s --iters=1", folder, dir);
    cr_expect_eq(run_tool(train_binary(), args, out, text, sizeof text), 2, "101 ids over 50: %s", text);
    cr_expect(strstr(text, "has 101 ids, more than the 50") != NULL, "%s", text);
    /* bin/export leaves a folder's model.safetensors as it is, unless --overwrite=1 */
    snprintf(args, sizeof args, "--ckpt=tests/corpus/tiny.safetensors --hf=%s", folder);
    cr_expect_eq(run_tool(export_binary(), args, out, text, sizeof text), 2, "%s", text);
    cr_expect(strstr(text, "is there already") != NULL, "%s", text);
    HfGpt2 kept = open_folder(folder);
    cr_expect_eq(kept.model.vocab, 50, "the folder is as it was");
    free(w_small);
    free(into);
    free(w_deeper);
    free(w);
    remove_dir(dir);
}
