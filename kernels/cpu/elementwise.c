/* elementwise.c: GELU, residual add, biases, dropout and zero fill; each
 * output rounded under autocast (kernels.h). */
#include <math.h>
#include <string.h>

#include "../dropout.h"
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"
#include "vector_math.h"

/* Elementwise loops run in chunks this long: a dropout mask fits on the stack,
 * and GELU's vector loops start at the same places on any number of threads. */
enum { CHUNK = 1024 };

/* Runs chunk(args, first, end) over n numbers in CHUNK-long pieces shared
 * among the threads: each piece starts at the same place on any number of
 * threads. */
typedef void (*ChunkFn)(const void *args, size_t first, size_t end);

static void over_chunks(size_t n, ChunkFn chunk, const void *args) {
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    #pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nchunks; c++) {
        size_t first = c * CHUNK;
        chunk(args, first, n - first < CHUNK ? n : first + CHUNK);
    }
}

/* GELU in one of its two forms: exact, x * Phi(x) with Phi from erf (nanoGPT's
 * nn.GELU()), or GPT-2's tanh approximation (transformers' gelu_new). Each
 * piece is one vector loop: a loop split by the threads would leave each
 * thread's last few numbers to the scalar erff and tanhf, which round
 * otherwise than libmvec's vector ones, and the bits would follow the thread
 * count. */
typedef struct { float *out; const float *inp; size_t n; int tanh_form, rounds; } GeluArgs;

/* sqrt(2 / pi) and the cubic's coefficient of the tanh form */
static const float GELU_TANH_SCALE = 0.7978845608028654f, GELU_TANH_CUBIC = 0.044715f;

/* out[first, end) rounded to bf16 in place, after a chunk's vector loop (so
 * that loop stays one). */
static void round_chunk(float *out, size_t first, size_t end) {
    for (size_t i = first; i < end; i++) out[i] = bf16_rounded(out[i]);
}

static void gelu_forward_chunk(const void *p, size_t first, size_t end) {
    const GeluArgs *a = p;
    if (a->tanh_form) {
        #pragma omp simd
        for (size_t i = first; i < end; i++) {
            float x = a->inp[i];
            a->out[i] = 0.5f * x * (1.0f + tanhf(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x * x * x)));
        }
    } else {
        #pragma omp simd
        for (size_t i = first; i < end; i++) {
            float x = a->inp[i];
            a->out[i] = 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
        }
    }
    if (a->rounds) round_chunk(a->out, first, end);
}

static void gelu_forward_task(void *p) {
    GeluArgs *a = p;
    over_chunks(a->n, gelu_forward_chunk, a);
}

/* A bf16 input widened into the room, and a bf16 output written there, in
 * place (each number from its own): GELU from bf16 into bf16 needs n. */
void cpu_gelu_forward(Stream *s, Buf out, ConstBuf inp, size_t n, int tanh_form, DType rounding) {
    const float *x = cpu_fp32_of(s, inp, n, 0);
    GeluArgs a = { cpu_fp32_for(s, out, n, 0), x, n, tanh_form, rounding == DTYPE_BF16 };
    stream_launch(s, gelu_forward_task, &a, sizeof a);
    cpu_store_output(s, out, a.out, n);
}

typedef struct {
    float *dinp;
    Buf dbias;
    const float *inp, *dout;
    int N, OC, tanh_form, rounds;
} GeluBackwardArgs;

static void gelu_backward_chunk(const void *p, size_t first, size_t end) {
    const GeluBackwardArgs *a = p;
    if (a->tanh_form) {
        #pragma omp simd
        for (size_t i = first; i < end; i++) {
            float x = a->inp[i];
            float t = tanhf(GELU_TANH_SCALE * (x + GELU_TANH_CUBIC * x * x * x));
            float du = GELU_TANH_SCALE * (1.0f + 3.0f * GELU_TANH_CUBIC * x * x);
            a->dinp[i] = a->dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
        }
    } else {
        const float inv_sqrt_2pi = 0.3989422804014327f;
        #pragma omp simd
        for (size_t i = first; i < end; i++) {
            float x = a->inp[i];
            float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
            float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
            a->dinp[i] = a->dout[i] * (cdf + x * pdf);
        }
    }
    if (a->rounds) round_chunk(a->dinp, first, end);
}
/* dbias's terms: dinp's row as written. */
static void gelu_dbias_terms(const void *p, int n, int c0, int width, float *terms) {
    const GeluBackwardArgs *a = p;
    const float *row = a->dinp + (size_t)n * a->OC + c0;
    for (int c = 0; c < width; c++) terms[c] = row[c];
}

/* The gradient in chunks, then the bias's column sums over it: the adds of
 * bias_backward over the written gradient (the GPU makes both in one pass). */
static void gelu_backward_task(void *p) {
    GeluBackwardArgs *a = p;
    over_chunks((size_t)a->N * a->OC, gelu_backward_chunk, a);
    if (a->dbias.data) column_sums(a->dbias, a->N, a->OC, gelu_dbias_terms, a, a->rounds);
}

/* In the room where held in bf16: the input widened at its start, dout after
 * it, and dinp made over dout (in place, each number from its own), then
 * stored. */
void cpu_gelu_backward(Stream *s, Buf dinp, Buf dbias, ConstBuf inp, ConstBuf dout, int N, int OC,
                       int tanh_form, DType rounding, float *scratch) {
    (void)scratch;  /* the parts stay in registers (column_sums) */
    size_t n = (size_t)N * OC, x = cpu_room_for(inp.dtype, n);
    cpu_stream_room(s, x + (dout.dtype == DTYPE_BF16 || dinp.dtype == DTYPE_BF16 ? n : 0));  /* all, before any */
    const float *in = cpu_fp32_of(s, inp, n, 0), *d = cpu_fp32_of(s, dout, n, x);
    GeluBackwardArgs a = { cpu_fp32_for(s, dinp, n, x), dbias, in, d, N, OC, tanh_form, rounding == DTYPE_BF16 };
    stream_launch(s, gelu_backward_task, &a, sizeof a);
    cpu_store_output(s, dinp, a.dinp, n);
}

typedef struct { float *out; const float *a, *b; size_t n; int rounds; } ResidualArgs;

static void residual_forward_task(void *p) {
    ResidualArgs *a = p;
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < a->n; i++) {
        float v = a->a[i] + a->b[i];
        a->out[i] = rounded_if(v, a->rounds);
    }
}

/* In the room where held in bf16: a widened at its start and out made over
 * it (in place, each number from its own), b widened after them. */
void cpu_residual_forward(Stream *s, Buf out, ConstBuf a, ConstBuf b, size_t n, DType rounding) {
    size_t x = a.dtype == DTYPE_BF16 || out.dtype == DTYPE_BF16 ? n : 0;
    cpu_stream_room(s, x + cpu_room_for(b.dtype, n));  /* all, before any */
    const float *in = cpu_fp32_of(s, a, n, 0), *y = cpu_fp32_of(s, b, n, x);
    ResidualArgs args = { cpu_fp32_for(s, out, n, 0), in, y, n, rounding == DTYPE_BF16 };
    stream_launch(s, residual_forward_task, &args, sizeof args);
    cpu_store_output(s, out, args.out, n);
}

typedef struct { float *out; const float *inp; ConstBuf bias; int N, OC, rounds; } BiasArgs;

static void bias_forward_task(void *p) {
    BiasArgs *a = p;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < a->N; n++) {
        float *row = a->out + (size_t)n * a->OC;
        const float *x = a->inp + (size_t)n * a->OC;
        if (!a->bias.data) {
            for (int c = 0; c < a->OC; c++) row[c] = rounded_if(x[c], a->rounds);
            continue;
        }
        #pragma omp simd
        for (int c = 0; c < a->OC; c++) {
            float v = x[c] + number_at(a->bias.data, a->bias.dtype, c);
            row[c] = rounded_if(v, a->rounds);
        }
    }
}

/* A bf16 output made in the room and stored. */
void cpu_bias_forward(Stream *s, Buf out, const float *inp, ConstBuf bias, int N, int OC, DType rounding) {
    size_t n = (size_t)N * OC;
    BiasArgs a = { cpu_fp32_for(s, out, n, 0), inp, bias, N, OC, rounding == DTYPE_BF16 };
    stream_launch(s, bias_forward_task, &a, sizeof a);
    cpu_store_output(s, out, a.out, n);
}

typedef struct { Buf dbias; const float *dout; int N, OC, rounds; } BiasBackwardArgs;

/* dbias's terms: dout's row itself. */
static void dbias_terms(const void *p, int n, int c0, int width, float *terms) {
    const BiasBackwardArgs *a = p;
    const float *row = a->dout + (size_t)n * a->OC + c0;
    for (int c = 0; c < width; c++) terms[c] = row[c];
}

static void bias_backward_task(void *p) {
    BiasBackwardArgs *a = p;
    column_sums(a->dbias, a->N, a->OC, dbias_terms, a, a->rounds);
}

void cpu_bias_backward(Stream *s, Buf dbias, ConstBuf dout, int N, int OC, float *scratch, DType rounding) {
    (void)scratch;  /* the parts stay in registers (column_sums) */
    BiasBackwardArgs a = { dbias, cpu_fp32_of(s, dout, (size_t)N * OC, 0), N, OC, rounding == DTYPE_BF16 };
    stream_launch(s, bias_backward_task, &a, sizeof a);
}

typedef struct { float *out; const float *inp; size_t n; Dropout drop; int rounds; } DropoutArgs;

static void dropout_chunk(const void *p, size_t first, size_t end) {
    const DropoutArgs *a = p;
    float scale[CHUNK];
    dropout_scales(a->drop, first, end - first, scale);
    for (size_t i = first; i < end; i++) {
        float v = a->inp[i] * scale[i - first];
        a->out[i] = rounded_if(v, a->rounds);
    }
}

static void dropout_task(void *p) {
    DropoutArgs *a = p;
    a->drop = dropout_resolved(a->drop);
    over_chunks(a->n, dropout_chunk, a);
}

/* bf16 in and out in the room, in place (each number from its own). */
void cpu_dropout_forward(Stream *s, Buf out, ConstBuf inp, size_t n, Dropout drop, DType rounding) {
    const float *x = cpu_fp32_of(s, inp, n, 0);
    DropoutArgs a = { cpu_fp32_for(s, out, n, 0), x, n, drop, rounding == DTYPE_BF16 };
    stream_launch(s, dropout_task, &a, sizeof a);
    cpu_store_output(s, out, a.out, n);
}

typedef struct { void *x; size_t bytes; } FillArgs;

static void fill_zero_task(void *p) {
    FillArgs *a = p;
    memset(a->x, 0, a->bytes);
}

void cpu_fill_zero(Stream *s, void *x, size_t bytes) {
    FillArgs a = { x, bytes };
    stream_launch(s, fill_zero_task, &a, sizeof a);
}
