/* precision.c: fp32 to bf16 and back (kernels/bf16.h rounds each value). */
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct { bf16 *out; const float *in; size_t n; } NarrowArgs;

static void cast_to_bf16_task(void *p) {
    NarrowArgs *a = p;
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) a->out[i] = bf16_from_float(a->in[i]);
}

void cpu_cast_to_bf16(Stream *s, bf16 *out, const float *in, size_t n) {
    NarrowArgs a = { out, in, n };
    stream_launch(s, cast_to_bf16_task, &a, sizeof a);
}

typedef struct { float *out; const bf16 *in; size_t n; } WidenArgs;

static void cast_to_fp32_task(void *p) {
    WidenArgs *a = p;
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) a->out[i] = float_from_bf16(a->in[i]);
}

void cpu_cast_to_fp32(Stream *s, float *out, const bf16 *in, size_t n) {
    WidenArgs a = { out, in, n };
    stream_launch(s, cast_to_fp32_task, &a, sizeof a);
}
