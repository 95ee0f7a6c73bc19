/* precision.c: fp32 rounded to bf16's values, kept in fp32 or stored in 16
 * bits, and bf16 widened back (runtime/bf16.h rounds each value); and the
 * room where the CPU's ops widen what they read in bf16. */
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

typedef struct { bf16 *out; const float *in; size_t n; } StoreArgs;

static void store_bf16_task(void *p) {
    StoreArgs *a = p;
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) a->out[i] = bf16_from_float(a->in[i]);
}

void cpu_store_bf16(Stream *s, bf16 *out, const float *in, size_t n) {
    StoreArgs a = { out, in, n };
    stream_launch(s, store_bf16_task, &a, sizeof a);
}

typedef struct { float *out; const bf16 *in; size_t n; } LoadArgs;

static void load_bf16_task(void *p) {
    LoadArgs *a = p;
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < a->n; i++) a->out[i] = float_from_bf16(a->in[i]);
}

void cpu_load_bf16(Stream *s, float *out, const bf16 *in, size_t n) {
    LoadArgs a = { out, in, n };
    stream_launch(s, load_bf16_task, &a, sizeof a);
}

size_t cpu_room_for(DType held, size_t n) { return held == DTYPE_BF16 ? n : 0; }

const float *cpu_fp32_of(Stream *s, ConstBuf x, size_t n, size_t at) {
    if (x.dtype == DTYPE_FP32) return x.data;
    float *room = cpu_stream_room(s, at + n) + at;
    cpu_load_bf16(s, room, x.data, n);
    return room;
}

float *cpu_fp32_for(Stream *s, Buf out, size_t n, size_t at) {
    return out.dtype == DTYPE_FP32 ? out.data : cpu_stream_room(s, at + n) + at;
}

void cpu_store_output(Stream *s, Buf out, const float *written, size_t n) {
    if (out.dtype == DTYPE_BF16) cpu_store_bf16(s, out.data, written, n);
}
