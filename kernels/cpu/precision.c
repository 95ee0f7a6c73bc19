/* precision.c: fp32 rounded to bf16's values (runtime/bf16.h rounds each value). */
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct { float *out; const float *in; size_t n; } RoundArgs;

static void round_to_bf16_task(void *p) {
    RoundArgs *a = p;
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) a->out[i] = bf16_rounded(a->in[i]);
}

void cpu_round_to_bf16(Stream *s, float *out, const float *in, size_t n) {
    RoundArgs a = { out, in, n };
    stream_launch(s, round_to_bf16_task, &a, sizeof a);
}
