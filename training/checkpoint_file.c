/* checkpoint_file.c: the checkpoint file itself (checkpoint.h): its metadata,
 * and the checks of every tensor, with no strategy in sight, so that a fuzzer
 * can run them on any bytes. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/gpt.h"
#include "../runtime/host.h"
#include "checkpoint.h"

const char CHECKPOINT_M_PREFIX[] = "optim.exp_avg.", CHECKPOINT_V_PREFIX[] = "optim.exp_avg_sq.",
           CHECKPOINT_HEAD[] = "lm_head.weight", CHECKPOINT_FILE_NAME[] = "ckpt.safetensors";

/* __metadata__: every value a string, as the format asks. */
char *checkpoint_metadata_json(const CheckpointInfo *info) {
    json_t *vocab = json_array();
    for (int i = 0; i < info->chars; i++)
        json_array_append_new(vocab, json_integer(info->itos[i]));
    json_t *config = json_pack("{s:i, s:i, s:i, s:i, s:i, s:b, s:s}", "vocab_size", info->model.vocab, "block_size",
                               info->model.block_size, "n_layer", info->model.layers, "n_head", info->model.heads,
                               "n_embd", info->model.embd, "bias", info->model.bias, "gelu",
                               info->model.gelu_tanh ? "tanh" : "erf");
    char *config_text = json_dumps(config, JSON_COMPACT), *vocab_text = json_dumps(vocab, JSON_COMPACT);
    char iter[16], adam_step[16], seed[16];
    snprintf(iter, sizeof iter, "%d", info->iter);
    snprintf(adam_step, sizeof adam_step, "%d", info->adam_step);
    snprintf(seed, sizeof seed, "%u", info->seed);
    json_t *meta = json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "format", "zerofiber checkpoint 1", "config",
                             config_text, "vocab", vocab_text, "iter", iter, "adam_step", adam_step, "seed", seed);
    char *json = json_dumps(meta, JSON_COMPACT);
    free(config_text);
    free(vocab_text);
    json_decref(config);
    json_decref(vocab);
    json_decref(meta);
    return json;
}

/* A whole decimal in [lo, hi], digits only, or -1 on anything else. */
static long parse_count(const char *text, long lo, long hi) {
    if (!text || *text < '0' || *text > '9') return -1;
    char *end;
    errno = 0;
    long x = strtol(text, &end, 10);
    return errno || *end || x < lo || x > hi ? -1 : x;
}

static int config_int(const json_t *config, const char *key, int *out) {
    const json_t *item = json_object_get(config, key);
    if (!json_is_integer(item) || json_integer_value(item) < 1 || json_integer_value(item) > INT_MAX) return -1;
    *out = (int)json_integer_value(item);
    return 0;
}

/* Whether the file's header has a tensor of this name. */
static int holds(const StFile *f, const char *name) {
    return json_object_get((const json_t *)f->header, name) != NULL;
}

/* The metadata of an open file, checked. */
int checkpoint_info_of(const StFile *f, const char *path, CheckpointInfo *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    const char *format = safetensors_metadata(f, "format");
    if (format && strcmp(format, "zerofiber checkpoint 1") != 0) {
        snprintf(err, errlen, "'%s' is a checkpoint of another format ('%.60s')", path, format);
        safetensors_one_line(err);
        return -1;
    }
    const char *config_text = safetensors_metadata(f, "config"), *vocab_text = safetensors_metadata(f, "vocab");
    if (!config_text || !vocab_text) {
        snprintf(err, errlen, "'%s' is no checkpoint: its metadata lacks the model config or the vocabulary", path);
        return -1;
    }
    json_t *config = json_loads(config_text, JSON_REJECT_DUPLICATES, NULL);
    json_t *vocab = json_loads(vocab_text, JSON_REJECT_DUPLICATES, NULL);
    ModelConfig *mc = &info->model;
    int bad = !json_is_object(config) || config_int(config, "vocab_size", &mc->vocab) ||
              config_int(config, "block_size", &mc->block_size) || config_int(config, "n_layer", &mc->layers) ||
              config_int(config, "n_head", &mc->heads) || config_int(config, "n_embd", &mc->embd);
    const json_t *bias = json_object_get(config, "bias");  /* nanoGPT's GPTConfig.bias; absent: none */
    if (!bad && bias && !json_is_boolean(bias)) bad = 1;
    mc->bias = json_is_true(bias);
    const json_t *gelu = json_object_get(config, "gelu");  /* absent: exact, as nanoGPT's */
    const char *gelu_text = gelu ? json_string_value(gelu) : "erf";
    if (!bad && (!gelu_text || (strcmp(gelu_text, "erf") && strcmp(gelu_text, "tanh")))) bad = 1;
    mc->gelu_tanh = gelu_text && strcmp(gelu_text, "tanh") == 0;
    const char *why = bad ? "its model config is not valid JSON with positive whole numbers (and a true or false "
                            "bias, a gelu of erf or tanh)" : gpt_config_error(mc);
    /* a text file's bytes, the first ids' (the rest, padding, stand for none), or none: a tokenizer's ids */
    info->chars = (int)json_array_size(vocab);
    if (!why && (!json_is_array(vocab) || json_array_size(vocab) > (size_t)mc->vocab))
        why = "its vocabulary is not a list of at most vocab_size bytes (or an empty one, for a tokenizer's ids)";
    int seen[256] = { 0 };
    for (int i = 0; !why && i < info->chars; i++) {
        const json_t *b = json_array_get(vocab, (size_t)i);
        json_int_t x = json_is_integer(b) ? json_integer_value(b) : -1;
        if (x < 0 || x > 255) why = "its vocabulary holds a non-byte";
        else if (seen[x]++) why = "its vocabulary holds a byte twice";
        else info->itos[i] = (unsigned char)x;
    }
    json_decref(config);
    json_decref(vocab);
    long iter = parse_count(safetensors_metadata(f, "iter"), 0, INT_MAX);
    long adam_step = parse_count(safetensors_metadata(f, "adam_step"), 0, INT_MAX);
    long seed = parse_count(safetensors_metadata(f, "seed"), 0, UINT32_MAX);
    if (!why && (iter < 0 || adam_step < 0 || seed < 0)) why = "its iter, adam_step or seed is not a whole number";
    if (!why && adam_step > iter) why = "its adam_step is above its iter (more updates than steps)";
    if (why) {
        snprintf(err, errlen, "'%s': %s", path, why);
        return -1;
    }
    info->iter = (int)iter;
    info->adam_step = (int)adam_step;
    info->seed = (uint32_t)seed;
    char name[CHECKPOINT_NAME_MAX];
    snprintf(name, sizeof name, "%stransformer.wte.weight", CHECKPOINT_M_PREFIX);
    info->has_state = holds(f, name);
    return 0;
}

int checkpoint_read_info(const char *path, CheckpointInfo *info, char *err, size_t errlen) {
    StFile f;
    if (safetensors_open_header(&f, path, err, errlen) != 0) return -1;
    int rc = checkpoint_info_of(&f, path, info, err, errlen);
    safetensors_close(&f);
    return rc;
}

/* Adam's second moment is a running mean of squares: a negative element makes
 * its square root, and the next update, NaN. 0, or -1 naming the first one. */
static int check_second_moment(const char *path, const char *name, const float *v, size_t n, char *err,
                               size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        if (v[i] >= 0.0f) continue;
        snprintf(err, errlen, "'%s': tensor '%s' holds a negative value (element %zu is %g), and Adam's second "
                 "moment is a mean of squares", path, name, i, v[i]);
        return -1;
    }
    return 0;
}

/* The file's name of tensor ts of a state. */
static void state_name(StateOf what, const TensorSpec *ts, char *name, size_t len) {
    const char *prefix = what == STATE_EXP_AVG ? CHECKPOINT_M_PREFIX : what == STATE_EXP_AVG_SQ ? CHECKPOINT_V_PREFIX : "";
    snprintf(name, len, "%s%s", prefix, ts->name);
}

int checkpoint_read_tensor(const StFile *f, const char *path, StateOf what, const TensorSpec *ts, float *out,
                           char *err, size_t errlen) {
    int64_t shape[2] = { ts->shape[0], ts->shape[1] };
    char name[CHECKPOINT_NAME_MAX], why[256];
    state_name(what, ts, name, sizeof name);
    if (safetensors_read(f, name, "F32", ts->ndim, shape, out, why, sizeof why) != 0) {
        snprintf(err, errlen, "'%s': %s", path, why);
        return -1;
    }
    return what == STATE_EXP_AVG_SQ ? check_second_moment(path, name, out, ts->numel, err, errlen) : 0;
}

/* A tensor of the state that is not read: there, of its dtype and shape. */
static int check_unread(const StFile *f, const char *path, StateOf what, const TensorSpec *ts, char *err,
                        size_t errlen) {
    int64_t shape[2] = { ts->shape[0], ts->shape[1] };
    char name[CHECKPOINT_NAME_MAX], why[256];
    state_name(what, ts, name, sizeof name);
    if (safetensors_check(f, name, "F32", ts->ndim, shape, why, sizeof why) == 0) return 0;
    snprintf(err, errlen, "'%s': %s", path, why);
    return -1;
}

static int same_model(const ModelConfig *a, const ModelConfig *b) {
    return a->vocab == b->vocab && a->block_size == b->block_size && a->layers == b->layers &&
           a->heads == b->heads && a->embd == b->embd && a->bias == b->bias && a->gelu_tanh == b->gelu_tanh;
}

int checkpoint_check(const StFile *f, const char *path, const ModelConfig *want, int with_state,
                     CheckpointInfo *info, float *w, float *m, float *v, char *err, size_t errlen) {
    int foreign = !with_state && !safetensors_metadata(f, "config") && !safetensors_metadata(f, "vocab");
    if (foreign) *info = (CheckpointInfo){ .model = *want, .foreign = 1 };
    else if (checkpoint_info_of(f, path, info, err, errlen) != 0) return -1;
    const ModelConfig *got = &info->model;
    if (!same_model(want, got)) {
        snprintf(err, errlen, "'%s' holds a model of %d layers, %d heads, %d wide, block %d, vocabulary %d, bias %d, "
                 "GELU %s; this run's is %d, %d, %d, %d, %d, %d, %s", path, got->layers, got->heads, got->embd,
                 got->block_size, got->vocab, got->bias, got->gelu_tanh ? "tanh" : "erf", want->layers, want->heads,
                 want->embd, want->block_size, want->vocab, want->bias, want->gelu_tanh ? "tanh" : "erf");
        return CHECKPOINT_OTHER_MODEL;
    }
    if (with_state && !info->has_state) {
        snprintf(err, errlen, "'%s' holds no optimizer state (optim.*): start from it with --init-from", path);
        return -1;
    }
    ArenaLayout layout;
    gpt_layout(want, 1, &layout);
    size_t most = arena_largest_tensor(&layout);
    /* every tensor that will be loaded is read and checked, one at a time;
     * Adam's state, when it will not be, only for its dtype and shape */
    float *scratch = host_calloc(most, sizeof(float));
    int rc = 0;
    for (int what = STATE_WEIGHTS; rc == 0 && what < (info->has_state ? STATE_KINDS : STATE_EXP_AVG); what++)
        for (int i = 0; rc == 0 && i < layout.ntensors; i++)
            rc = what == STATE_WEIGHTS || with_state
                     ? checkpoint_read_tensor(f, path, (StateOf)what, &layout.tensors[i], scratch, err, errlen)
                     : check_unread(f, path, (StateOf)what, &layout.tensors[i], err, errlen);
    free(scratch);
    /* the head is the token embedding: nanoGPT ties them (a foreign file may
     * leave it out, as safetensors' save_model does) */
    if (rc == 0 && (!info->foreign || holds(f, CHECKPOINT_HEAD))) {
        const TensorSpec *wte = &layout.tensors[arena_find(&layout, "transformer.wte.weight")];
        int64_t shape[2] = { wte->shape[0], wte->shape[1] };
        char why[256];
        rc = safetensors_check(f, CHECKPOINT_HEAD, "F32", 2, shape, why, sizeof why);
        int tied = rc == 0 ? safetensors_same_data(f, CHECKPOINT_HEAD, wte->name, why, sizeof why) : -1;
        if (rc != 0 || tied < 0) snprintf(err, errlen, "'%s': %s", path, why);
        else if (!tied) snprintf(err, errlen, "'%s': lm_head.weight differs from transformer.wte.weight (an untied head)", path);
        rc = tied == 1 ? 0 : -1;
    }
    int expected = layout.ntensors * (info->has_state ? 3 : 1) + (!info->foreign || holds(f, CHECKPOINT_HEAD));
    if (rc == 0 && safetensors_count(f) != expected) {
        snprintf(err, errlen, "'%s' holds %d tensors, and this model has %d", path, safetensors_count(f), expected);
        rc = -1;
    }
    float *into[STATE_KINDS] = { w, m, v };
    for (int what = STATE_WEIGHTS; rc == 0 && what < STATE_KINDS; what++)
        for (int i = 0; rc == 0 && into[what] && (what == STATE_WEIGHTS || info->has_state) && i < layout.ntensors; i++)
            rc = checkpoint_read_tensor(f, path, (StateOf)what, &layout.tensors[i], into[what] + layout.tensors[i].offset,
                                        err, errlen);
    return rc;
}
