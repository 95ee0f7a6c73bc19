/* fuzz_checkpoint.c: libFuzzer over the checkpoint reader (make fuzz).
 *
 * Any bytes must come out as a checkpoint or as a one-line error: never a
 * crash, a hang or an out-of-bounds read (ASan and UBSan watch). The model
 * asked for is the one of the seed corpus in tests/corpus, so mutations of a
 * good file reach every check down to the last tensor.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../model/gpt.h"
#include "../strategies/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    unsigned char *bytes = malloc(size ? size : 1);
    if (!bytes) return 0;
    memcpy(bytes, data, size);
    StFile f;
    char err[512];
    if (safetensors_parse(&f, bytes, size, "fuzz input", err, sizeof err) != 0) return 0;
    ModelConfig want = { 65, 8, 1, 1, 8, MODEL_GPT };  /* tests/corpus/tiny.safetensors */
    ArenaLayout layout;
    gpt_layout(&want, 1, &layout);
    float *w = calloc(layout.total, sizeof(float)), *m = calloc(layout.total, sizeof(float)),
          *v = calloc(layout.total, sizeof(float));
    CheckpointInfo info;
    if (w && m && v) checkpoint_check(&f, "fuzz input", &want, 1, &info, w, m, v, err, sizeof err);
    free(w);
    free(m);
    free(v);
    safetensors_close(&f);
    return 0;
}
