/* fuzz_checkpoint.c: libFuzzer over the checkpoint reader (make fuzz).
 *
 * Any bytes must come out as a checkpoint or as a one-line error: never a
 * crash, a hang or an out-of-bounds read (ASan and UBSan watch), and never a
 * silent wrong load: an error is one line, not empty; a load gives finite
 * weights and Adam state and the model asked for, a vocabulary of distinct
 * bytes and step counts that make sense. A broken contract aborts, which
 * libFuzzer reports with the input. The model asked for is the one of the seed
 * corpus in tests/corpus, so mutations of a good file reach every check down to
 * the last tensor.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/gpt.h"
#include "../training/checkpoint.h"

/* A broken contract: say which, and abort for libFuzzer to keep the input. */
static void broken(const char *what, const char *err) {
    fprintf(stderr, "fuzz_checkpoint: %s (message: '%s')\n", what, err);
    abort();
}

static void expect_one_line(const char *err) {
    if (!err[0]) broken("an error without a message", err);
    if (strchr(err, '\n')) broken("an error of more than one line", err);
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* After a load: what the file gave is what was asked, finite, and consistent. */
static void expect_sound_load(const CheckpointInfo *info, const ModelConfig *want, const float *w, const float *m,
                              const float *v, size_t n) {
    if (memcmp(&info->model, want, sizeof *want) != 0) broken("a load of another model", "");
    if (!all_finite(w, n) || !all_finite(m, n) || !all_finite(v, n)) broken("a load of non-finite values", "");
    if (info->iter < 0 || info->adam_step < 0 || info->adam_step > info->iter)
        broken("a load of impossible step counts", "");
    int seen[256] = { 0 };
    for (int t = 0; t < info->chars; t++)
        if (seen[info->itos[t]]++) broken("a load of a vocabulary with a repeated byte", "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *bytes = malloc(size ? size : 1);
    if (!bytes) return 0;
    memcpy(bytes, data, size);
    StFile f;
    char err[512];
    err[0] = 0;
    if (safetensors_parse(&f, bytes, size, "fuzz input", err, sizeof err) != 0) {
        expect_one_line(err);
        return 0;
    }
    ModelConfig want = { 65, 8, 1, 1, 8, MODEL_GPT, 0, 0 };  /* tests/corpus/tiny.safetensors */
    ArenaLayout layout;
    gpt_layout(&want, 1, &layout);
    float *w = calloc(layout.total, sizeof(float)), *m = calloc(layout.total, sizeof(float)),
          *v = calloc(layout.total, sizeof(float));
    CheckpointInfo info;
    if (w && m && v) {
        if (checkpoint_check(&f, "fuzz input", &want, 1, &info, w, m, v, err, sizeof err) != 0) expect_one_line(err);
        else expect_sound_load(&info, &want, w, m, v, layout.total);
    }
    free(w);
    free(m);
    free(v);
    safetensors_close(&f);
    return 0;
}
