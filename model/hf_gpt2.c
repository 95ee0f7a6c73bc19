/* hf_gpt2.c: Hugging Face GPT-2 folders read and written (hf_gpt2.h). */
#include "hf_gpt2.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../runtime/host.h"
#include "gpt.h"
#include "safetensors.h"

const char HF_CONFIG_NAME[] = "config.json", HF_WEIGHTS_NAME[] = "model.safetensors";
static const char SHARD_INDEX_NAME[] = "model.safetensors.index.json";

static int is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The folder of path: path itself when it is one, else the part before its last '/'. */
static void folder_of(const char *path, char *folder, size_t len) {
    if (host_is_directory(path)) {
        snprintf(folder, len, "%s", path);
        return;
    }
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(folder, len, ".");
    else snprintf(folder, len, "%.*s", (int)(slash - path == 0 ? 1 : slash - path), path);
}

int hf_gpt2_at(const char *path) {
    char folder[HF_PATH_MAX], config[HF_PATH_MAX + 16];
    folder_of(path, folder, sizeof folder);
    snprintf(config, sizeof config, "%s/%s", folder, HF_CONFIG_NAME);
    if (host_is_directory(path)) return is_file(config);
    json_t *c = is_file(path) && is_file(config) ? json_load_file(config, JSON_REJECT_DUPLICATES, NULL) : NULL;
    const char *type = json_string_value(json_object_get(c, "model_type"));
    int gpt2 = type && strcmp(type, "gpt2") == 0;
    json_decref(c);
    return gpt2;
}

/* config[key] as a whole number in 1..2^24 into *out; 0, or -1. */
static int positive(const json_t *config, const char *key, int *out) {
    const json_t *x = json_object_get(config, key);
    if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > (1 << 24)) return -1;
    *out = (int)json_integer_value(x);
    return 0;
}

/* config[key] is absent (GPT2Config's default, want) or the boolean want. */
static int flag_is(const json_t *config, const char *key, int want) {
    const json_t *x = json_object_get(config, key);
    return !x || (json_is_boolean(x) && json_is_true(x) == want);
}

/* Why config (a GPT2Config) is not a GPT this runtime runs, or NULL; its shape into m. */
static const char *config_error(const json_t *config, ModelConfig *m, char *why, size_t len) {
    if (!json_is_object(config)) return "is not a JSON object";
    const char *type = json_string_value(json_object_get(config, "model_type"));
    if (!type || strcmp(type, "gpt2") != 0) {
        snprintf(why, len, "has model_type '%.40s', not gpt2", type ? type : "(none)");
        return why;
    }
    *m = (ModelConfig){ .kind = MODEL_GPT, .bias = 1 };
    const char *missing = positive(config, "vocab_size", &m->vocab) ? "vocab_size"
                          : positive(config, "n_positions", &m->block_size) ? "n_positions"
                          : positive(config, "n_layer", &m->layers) ? "n_layer"
                          : positive(config, "n_head", &m->heads) ? "n_head"
                          : positive(config, "n_embd", &m->embd) ? "n_embd" : NULL;
    if (missing) {
        snprintf(why, len, "has no %s of a whole number in 1..16777216", missing);
        return why;
    }
    const json_t *inner = json_object_get(config, "n_inner");
    if (inner && !json_is_null(inner) && !(json_is_integer(inner) && json_integer_value(inner) == 4 * m->embd)) {
        snprintf(why, len, "has an n_inner other than 4 x n_embd (%d), the MLP's width here", 4 * m->embd);
        return why;
    }
    const json_t *act = json_object_get(config, "activation_function");
    const char *activation = act ? json_string_value(act) : "gelu_new";  /* GPT2Config's default */
    if (activation && (strcmp(activation, "gelu_new") == 0 || strcmp(activation, "gelu_pytorch_tanh") == 0))
        m->gelu_tanh = 1;
    else if (!activation || strcmp(activation, "gelu") != 0) {
        snprintf(why, len, "has activation_function '%.40s' (gelu_new, gelu_pytorch_tanh or gelu here)",
                 activation ? activation : "(not a string)");
        return why;
    }
    const json_t *eps = json_object_get(config, "layer_norm_epsilon");
    if (eps && !(json_is_number(eps) && json_number_value(eps) == 1e-5)) return "has a layer_norm_epsilon other than 1e-5";
    if (!flag_is(config, "scale_attn_weights", 1)) return "has scale_attn_weights false (attention here is scaled)";
    if (!flag_is(config, "scale_attn_by_inverse_layer_idx", 0))
        return "has scale_attn_by_inverse_layer_idx true, which this GPT does not do";
    if (!flag_is(config, "add_cross_attention", 0)) return "has cross-attention, which this GPT does not have";
    if (!flag_is(config, "tie_word_embeddings", 1)) return "has an untied head (tie_word_embeddings false)";
    return gpt_config_error(m);
}

int hf_gpt2_open(const char *path, HfGpt2 *hf, char *err, size_t errlen) {
    char folder[HF_PATH_MAX - 64], why[160];
    memset(hf, 0, sizeof *hf);
    folder_of(path, folder, sizeof folder);
    snprintf(hf->config_path, sizeof hf->config_path, "%s/%s", folder, HF_CONFIG_NAME);
    if (host_is_directory(path)) snprintf(hf->weights_path, sizeof hf->weights_path, "%s/%s", folder, HF_WEIGHTS_NAME);
    else snprintf(hf->weights_path, sizeof hf->weights_path, "%s", path);
    char index[HF_PATH_MAX + 32];
    snprintf(index, sizeof index, "%s/%s", folder, SHARD_INDEX_NAME);
    if (host_is_directory(path) && !is_file(hf->weights_path) && is_file(index)) {
        snprintf(err, errlen, "'%s' holds its weights in shards (%s), which are not read here: save it with a "
                 "max_shard_size that keeps one model.safetensors", path, SHARD_INDEX_NAME);
        return -1;
    }
    if (!is_file(hf->weights_path)) {
        snprintf(err, errlen, "'%s' has no %s (a Hugging Face GPT-2 folder holds config.json and model.safetensors)",
                 path, HF_WEIGHTS_NAME);
        return -1;
    }
    json_error_t jerr;
    json_t *config = json_load_file(hf->config_path, JSON_REJECT_DUPLICATES, &jerr);
    const char *bad = config ? config_error(config, &hf->model, why, sizeof why) : NULL;
    if (!config) snprintf(err, errlen, "'%s' is not JSON: %s (line %d)", hf->config_path, jerr.text, jerr.line);
    else if (bad) snprintf(err, errlen, "'%s' %s", hf->config_path, bad);
    json_decref(config);
    if (config && !bad) return 0;
    safetensors_one_line(err);
    return -1;
}

/* Conv1D's weights, stored [in, out]: the four matrices of a block. */
static int is_conv1d(const char *name) {
    static const char *const parts[] = { ".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight",
                                         ".mlp.c_proj.weight" };
    size_t n = strlen(name);
    for (int i = 0; i < 4; i++) {
        size_t k = strlen(parts[i]);
        if (n > k && strcmp(name + n - k, parts[i]) == 0) return 1;
    }
    return 0;
}

/* Our name without "transformer.": GPT-2's own, to which a file may add the prefix. */
static const char *gpt2_name(const char *ours) {
    static const char prefix[] = "transformer.";
    return strncmp(ours, prefix, sizeof prefix - 1) == 0 ? ours + sizeof prefix - 1 : ours;
}

/* The causal mask's buffers of older files: h.N.attn.bias and h.N.attn.masked_bias. */
static int is_mask_buffer(const char *name) {
    int layer, end = 0;
    if (sscanf(name, "h.%d.attn.%n", &layer, &end) != 1 || end == 0) return 0;
    return strcmp(name + end, "bias") == 0 || strcmp(name + end, "masked_bias") == 0;
}

static int same_shape(const ModelConfig *a, const ModelConfig *b) {
    return a->layers == b->layers && a->heads == b->heads && a->embd == b->embd && a->bias == b->bias &&
           a->gelu_tanh == b->gelu_tanh;
}

/* Every tensor of f is one of the layout's, the head, or a mask buffer; NULL, or the first that is not. */
static const char *stranger(const StFile *f, const ArenaLayout *layout, const char *prefix) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)f->header, key, value) {
        if (strcmp(key, "__metadata__") == 0 || strcmp(key, "lm_head.weight") == 0) continue;
        if (strncmp(key, prefix, strlen(prefix)) != 0) return key;
        const char *name = key + strlen(prefix);
        int known = is_mask_buffer(name);
        for (int i = 0; !known && i < layout->ntensors; i++) known = strcmp(gpt2_name(layout->tensors[i].name), name) == 0;
        if (!known) return key;
    }
    return NULL;
}

/* The file's names carry "transformer." or not. */
static const char *prefix_of(const StFile *f) {
    return json_object_get(f->header, "transformer.wte.weight") ? "transformer." : "";
}

int hf_gpt2_read_tensor(const HfGpt2 *hf, const StFile *f, const ModelConfig *want, int t, float *out, char *err,
                        size_t errlen) {
    const ModelConfig *got = &hf->model;
    ArenaLayout layout;
    gpt_layout(want, 1, &layout);
    const TensorSpec *ts = &layout.tensors[t];
    char name[ARENA_NAME_MAX + 16], why[256];
    snprintf(name, sizeof name, "%s%s", prefix_of(f), gpt2_name(ts->name));
    int conv = is_conv1d(ts->name), is_wte = strstr(ts->name, "wte.") != NULL, is_wpe = strstr(ts->name, "wpe.") != NULL;
    int64_t shape[2] = { conv ? ts->shape[1] : is_wte ? got->vocab : is_wpe ? got->block_size : ts->shape[0],
                         conv ? ts->shape[0] : ts->shape[1] };
    size_t file_numel = (size_t)shape[0] * (size_t)(ts->ndim > 1 ? shape[1] : 1);
    /* the token embedding's rows land in place (the padding's stay zero); a
     * transposed or cropped tensor goes through scratch of its own size */
    int in_place = !conv && !is_wpe;
    float *src = in_place ? out : host_calloc(file_numel, sizeof(float));
    if (is_wte) memset(out, 0, ts->numel * sizeof(float));
    int rc = safetensors_read(f, name, "F32", ts->ndim, shape, src, why, sizeof why);
    if (rc != 0) snprintf(err, errlen, "'%s': %s", hf->weights_path, why);
    if (rc == 0 && conv) {  /* [in, out] to [out, in] */
        size_t in = (size_t)shape[0], outs = (size_t)shape[1];
        for (size_t o = 0; o < outs; o++)
            for (size_t k = 0; k < in; k++) out[o * in + k] = src[k * outs + o];
    } else if (rc == 0 && is_wpe) {  /* the first block_size rows, as nanoGPT's crop_block_size */
        memcpy(out, src, ts->numel * sizeof(float));
    }
    if (!in_place) free(src);
    return rc;
}

int hf_gpt2_check(const HfGpt2 *hf, const StFile *f, const ModelConfig *want, char *err, size_t errlen) {
    const ModelConfig *got = &hf->model;
    const char *path = hf->weights_path;
    if (!same_shape(want, got) || want->block_size > got->block_size || want->vocab < got->vocab) {
        snprintf(err, errlen, "'%s' holds a GPT-2 of %d layers, %d heads, %d wide, %d positions, vocabulary %d; this "
                 "run's is %d, %d, %d, block %d, vocabulary %d%s%s", hf->config_path, got->layers, got->heads,
                 got->embd, got->block_size, got->vocab, want->layers, want->heads, want->embd, want->block_size,
                 want->vocab, want->bias ? "" : ", no biases", want->gelu_tanh == got->gelu_tanh ? "" : ", another GELU");
        return HF_GPT2_OTHER_MODEL;
    }
    const char *prefix = prefix_of(f);
    ArenaLayout layout;
    gpt_layout(want, 1, &layout);
    const char *extra = stranger(f, &layout, prefix);
    if (extra) {
        snprintf(err, errlen, "'%s' holds tensor '%.100s', which is not GPT-2's", path, extra);
        safetensors_one_line(err);
        return -1;
    }
    size_t most = arena_largest_tensor(&layout);
    float *scratch = host_calloc(most, sizeof(float));
    int rc = 0;
    for (int i = 0; rc == 0 && i < layout.ntensors; i++) rc = hf_gpt2_read_tensor(hf, f, want, i, scratch, err, errlen);
    free(scratch);
    if (rc == 0 && json_object_get(f->header, "lm_head.weight")) {
        int64_t shape[2] = { got->vocab, got->embd };
        char why[256], wte[32];
        snprintf(wte, sizeof wte, "%swte.weight", prefix);
        rc = safetensors_check(f, "lm_head.weight", "F32", 2, shape, why, sizeof why);
        int tied = rc == 0 ? safetensors_same_data(f, "lm_head.weight", wte, why, sizeof why) : -1;
        if (rc != 0 || tied < 0) snprintf(err, errlen, "'%s': %s", path, why);
        else if (!tied) snprintf(err, errlen, "'%s': lm_head.weight differs from the token embedding (an untied head)", path);
        rc = tied == 1 ? 0 : -1;
    }
    return rc;
}

int hf_gpt2_read_weights(const HfGpt2 *hf, const ModelConfig *want, float *w, char *err, size_t errlen) {
    StFile f;
    if (safetensors_open_header(&f, hf->weights_path, err, errlen) != 0) return -1;
    ArenaLayout layout;
    gpt_layout(want, 1, &layout);
    memset(w, 0, layout.total * sizeof(float));
    int rc = hf_gpt2_check(hf, &f, want, err, errlen);
    for (int i = 0; rc == 0 && i < layout.ntensors; i++)
        rc = hf_gpt2_read_tensor(hf, &f, want, i, w + layout.tensors[i].offset, err, errlen);
    safetensors_close(&f);
    return rc;
}

int hf_gpt2_write(const char *dir, const ModelConfig *model, int vocab, const float *w, char *err, size_t errlen) {
    if (vocab < 1 || vocab > model->vocab) {
        snprintf(err, errlen, "a vocabulary of %d rows to write, and the model has %d", vocab, model->vocab);
        return -1;
    }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "cannot make the folder '%s': %s", dir, strerror(errno));
        return -1;
    }
    ModelConfig with_bias = *model;
    with_bias.bias = 1;
    ArenaLayout ours, theirs;  /* the model's tensors, and GPT-2's (biases in every layer) */
    gpt_layout(model, 1, &ours);
    gpt_layout(&with_bias, 1, &theirs);
    StTensor *t = host_calloc((size_t)theirs.ntensors, sizeof *t);
    float *data = host_calloc(theirs.total, sizeof(float));  /* GPT-2's tensors, transposed where Conv1D's */
    for (int i = 0; i < theirs.ntensors; i++) {
        const TensorSpec *ts = &theirs.tensors[i];
        float *dst = data + ts->offset;
        int k = arena_find(&ours, ts->name), conv = is_conv1d(ts->name);
        const float *src = k >= 0 ? w + ours.tensors[k].offset : NULL;  /* NULL: a bias the model lacks, zero */
        if (src && conv) {
            size_t out = (size_t)ts->shape[0], in = (size_t)ts->shape[1];
            for (size_t o = 0; o < out; o++)
                for (size_t j = 0; j < in; j++) dst[j * out + o] = src[o * in + j];
        } else if (src) {
            memcpy(dst, src, ts->numel * sizeof(float));
        }
        int rows = strstr(ts->name, "wte.") ? vocab : ts->shape[0];
        t[i] = (StTensor){ ts->name, "F32", ts->ndim, { conv ? ts->shape[1] : rows, conv ? ts->shape[0] : ts->shape[1] },
                           dst };
    }
    char path[HF_PATH_MAX + 32];
    /* bos and eos: the last id, GPT-2's <|endoftext|> (50256 of 50257) and one the vocabulary has at any size,
       where transformers' default, 50256, is past a smaller vocabulary */
    json_t *config = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:n, s:s, s:f, s:b, s:b, s:b, s:b, s:s}", "architectures",
        "GPT2LMHeadModel", "model_type", "gpt2", "vocab_size", vocab, "bos_token_id", vocab - 1, "eos_token_id",
        vocab - 1, "n_positions", model->block_size, "n_embd",
        model->embd, "n_layer", model->layers, "n_head", model->heads, "n_inner", "activation_function",
        model->gelu_tanh ? "gelu_new" : "gelu", "layer_norm_epsilon", 1e-5, "scale_attn_weights", 1,
        "scale_attn_by_inverse_layer_idx", 0, "add_cross_attention", 0, "tie_word_embeddings", 1, "dtype", "float32");
    char *text = json_dumps(config, JSON_INDENT(2) | JSON_REAL_PRECISION(6));  /* 1e-5, not 1.0000000000000001e-5 */
    snprintf(path, sizeof path, "%s/%s", dir, HF_WEIGHTS_NAME);
    int rc = safetensors_write(path, t, theirs.ntensors, "{\"format\":\"pt\"}", err, errlen);
    snprintf(path, sizeof path, "%s/%s", dir, HF_CONFIG_NAME);
    if (rc == 0) rc = host_write_file(path, text, strlen(text), err, errlen);
    free(text);
    json_decref(config);
    free(data);
    free(t);
    return rc;
}
