/* export.c: bin/export, a checkpoint's weights as a Hugging Face GPT-2 folder.
 *
 *   bin/export --ckpt=PATH --hf=DIR [--vocab=N] [--overwrite=1]
 *
 * DIR gets config.json and model.safetensors (model/hf_gpt2.h), which
 * transformers' GPT2LMHeadModel.from_pretrained(DIR) loads. --vocab=N keeps
 * the token embedding's first N rows (GPT-2's 50257 of a model padded to
 * 50304); by default every row goes. A DIR that holds a model.safetensors
 * already is left as it is, unless --overwrite=1; an output that is the same
 * file as --ckpt is refused either way (file_identity.h). Temporary files that
 * a cut-short export left in DIR are removed at start.
 *
 * Exit status: 0 done, 1 a file it could not use (the checkpoint, DIR), 2 a
 * command line no run can use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/gpt.h"
#include "../model/hf_gpt2.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"
#include "file_identity.h"

/* Its flags, one a line as the other tools list theirs (tools/options.h). */
static const char USAGE[] = "usage: export --ckpt=PATH --hf=DIR [--vocab=N] [--overwrite=1]\n"
                            "  a checkpoint's weights as a Hugging Face GPT-2 folder (config.json, model.safetensors)\n\n"
                            "flags:\n"
                            "  --ckpt             the checkpoint to export\n"
                            "  --hf               the folder to write\n"
                            "  --vocab            keep the token embedding's first N rows (default: all)\n"
                            "  --overwrite        1: replace the folder's model.safetensors (default: 0)\n";

typedef struct {
    const char *ckpt, *hf;
    int vocab, overwrite;
} ExportFlags;

/* A whole number in lo..hi, or -1. */
static long count_of(const char *text, long lo, long hi) {
    char *end;
    long x = strtol(text, &end, 10);
    return *text && !*end && x >= lo && x <= hi ? x : -1;
}

/* Whether arg's name, its first len bytes, is --name. */
static int named(const char *arg, size_t len, const char *name) {
    return len == strlen(name) && strncmp(arg, name, len) == 0;
}

/* 0, 1 for --help, or 2 after a one-line error. */
static int read_flags(int argc, char **argv, ExportFlags *f) {
    *f = (ExportFlags){ 0 };
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 1;
        if (!eq || !eq[1]) {
            fprintf(stderr, "export: '%s' is not --flag=value (see --help)\n", arg);
            return 2;
        }
        const char *value = eq + 1;
        size_t len = (size_t)(eq - arg);
        if (named(arg, len, "--ckpt")) {
            f->ckpt = value;
        } else if (named(arg, len, "--hf")) {
            f->hf = value;
        } else if (named(arg, len, "--vocab")) {
            if ((f->vocab = (int)count_of(value, 1, 1 << 24)) >= 0) continue;
            fprintf(stderr, "export: --vocab=%s must be a whole number in 1..16777216\n", value);
            return 2;
        } else if (named(arg, len, "--overwrite")) {
            if ((f->overwrite = (int)count_of(value, 0, 1)) >= 0) continue;
            fprintf(stderr, "export: --overwrite=%s must be 0 or 1\n", value);
            return 2;
        } else {
            fprintf(stderr, "export: unknown flag '%.*s' (see --help)\n", (int)len, arg);
            return 2;
        }
    }
    if (f->ckpt && f->hf) return 0;
    fprintf(stderr, "export: --ckpt=PATH and --hf=DIR are needed (see --help)\n");
    return 2;
}

/* No output in --hf the same file as --ckpt, and no model.safetensors there
 * already unless --overwrite=1. 0, or 2 after a line. */
static int check_paths(const ExportFlags *f) {
    char weights[HF_PATH_MAX + 32], config[HF_PATH_MAX + 32], err[4 * HF_PATH_MAX], weights_flag[64], config_flag[64];
    snprintf(weights, sizeof weights, "%s/%s", f->hf, HF_WEIGHTS_NAME);
    snprintf(config, sizeof config, "%s/%s", f->hf, HF_CONFIG_NAME);
    snprintf(weights_flag, sizeof weights_flag, "--hf's %s", HF_WEIGHTS_NAME);
    snprintf(config_flag, sizeof config_flag, "--hf's %s", HF_CONFIG_NAME);
    const ToolPath paths[] = {
        { weights_flag, weights, 1, 0 }, { config_flag, config, 1, 0 }, { "--ckpt", f->ckpt, 0, 0 },
    };
    if (file_identity_distinct("export", paths, sizeof paths / sizeof paths[0], err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (f->overwrite || access(weights, F_OK) != 0) return 0;
    fprintf(stderr, "export: '%s' is there already (--overwrite=1 replaces it)\n", weights);
    return 2;
}

int main(int argc, char **argv) {
    ExportFlags flags;
    int rc = read_flags(argc, argv, &flags);
    if (rc == 1) fputs(USAGE, stdout);
    if (rc) return rc == 1 ? 0 : 2;
    if ((rc = check_paths(&flags)) != 0) return rc;
    char err[1024];
    int stale = safetensors_remove_stale_temps(flags.hf, HF_WEIGHTS_NAME) +
                safetensors_remove_stale_temps(flags.hf, HF_CONFIG_NAME);
    if (stale > 0) printf("export: removed %d temporary file(s) that cut-short exports left in %s\n", stale, flags.hf);
    CheckpointInfo info;
    StFile f;
    if (checkpoint_read_info(flags.ckpt, &info, err, sizeof err) != 0 ||
        safetensors_open(&f, flags.ckpt, err, sizeof err) != 0) {
        fprintf(stderr, "export: %s\n", err);
        return 1;
    }
    int vocab = flags.vocab ? flags.vocab : info.model.vocab;
    if (vocab > info.model.vocab) {  /* a flag that asks another model: the command line's error */
        fprintf(stderr, "export: --vocab=%d, and '%s' has %d token rows\n", vocab, flags.ckpt, info.model.vocab);
        safetensors_close(&f);
        return 2;
    }
    ArenaLayout layout;
    gpt_layout(&info.model, 1, &layout);
    float *w = host_calloc(layout.total, sizeof(float));
    rc = checkpoint_check(&f, flags.ckpt, &info.model, 0, &info, w, NULL, NULL, err, sizeof err);
    safetensors_close(&f);
    if (rc == 0) rc = hf_gpt2_write(flags.hf, &info.model, vocab, w, err, sizeof err);
    if (rc == 0)
        printf("export: %s (%d layers, %d heads, %d wide, block %d, vocabulary %d of %d) to %s\n", flags.ckpt,
               info.model.layers, info.model.heads, info.model.embd, info.model.block_size, vocab, info.model.vocab,
               flags.hf);
    else
        fprintf(stderr, "export: %s\n", err);
    free(w);
    return rc ? 1 : 0;
}
