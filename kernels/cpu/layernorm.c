/* layernorm.c: LayerNorm (eps 1e-5) and the bias after it, with the
 * residual add before it, and its backward; the output, and the gradient
 * added into the residual stream's, rounded under autocast (kernels.h). */
#include <math.h>

#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct {
    float *out, *mean, *rstd;
    const float *inp;
    ConstBuf weight, bias;  /* read as they are held (number_at): C numbers each */
    int N, C, rounds;
} LayerNormArgs;

static void layernorm_forward_task(void *p) {
    LayerNormArgs *a = p;
    int C = a->C;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < a->N; i++) {
        const float *x = a->inp + (size_t)i * C;
        float m = 0.0f;
        #pragma omp simd reduction(+ : m)
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float var = 0.0f;
        #pragma omp simd reduction(+ : var)
        for (int c = 0; c < C; c++) var += (x[c] - m) * (x[c] - m);
        var /= C;
        float r = 1.0f / sqrtf(var + 1e-5f);
        float *o = a->out + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float v = (x[c] - m) * r * number_at(a->weight.data, a->weight.dtype, c);
            if (a->bias.data) v = v + number_at(a->bias.data, a->bias.dtype, c);
            o[c] = rounded_if(v, a->rounds);
        }
        a->mean[i] = m;
        a->rstd[i] = r;
    }
}

/* A bf16 input widened at the room's start, a bf16 output made past it. */
void cpu_layernorm_forward(Stream *s, Buf out, float *mean, float *rstd, ConstBuf inp,
                       ConstBuf weight, ConstBuf bias, int N, int C, DType rounding) {
    size_t n = (size_t)N * C;
    if (inp.dtype == DTYPE_BF16 || out.dtype == DTYPE_BF16) cpu_stream_room(s, 2 * n);  /* both, before either */
    const float *x = cpu_fp32_of(s, inp, n, 0);
    LayerNormArgs a = { cpu_fp32_for(s, out, n, n), mean, rstd, x, weight, bias, N, C, rounding == DTYPE_BF16 };
    stream_launch(s, layernorm_forward_task, &a, sizeof a);
    cpu_store_output(s, out, a.out, n);
}

/* The two ops one after the other: on the CPU a pass saved is not worth a
 * second copy of their loops (the GPU's fused kernel gives its own two ops'
 * bits, as this does). In the room where held in bf16: a widened at its
 * start, the sum after it, the LayerNorm's output after that, b after them;
 * a sum held in bf16 is normalised as it is held, rounded (the GPU's reads
 * it back). */
void cpu_residual_layernorm_forward(Stream *s, Buf resid, Buf out, float *mean, float *rstd, ConstBuf a,
                                    ConstBuf b, ConstBuf weight, ConstBuf bias, int N, int C,
                                    DType rounding) {
    size_t n = (size_t)N * C;
    size_t held = a.dtype == DTYPE_BF16 || resid.dtype == DTYPE_BF16 || out.dtype == DTYPE_BF16 ? 3 * n : 0;
    cpu_stream_room(s, held + cpu_room_for(b.dtype, n));  /* all, before any: a room that grows moves */
    const float *x = cpu_fp32_of(s, a, n, 0), *y = cpu_fp32_of(s, b, n, held);
    float *sum = cpu_fp32_for(s, resid, n, n), *normed = cpu_fp32_for(s, out, n, 2 * n);
    cpu_residual_forward(s, fp32_buf(sum), fp32_numbers(x), fp32_numbers(y), n,
                         resid.dtype == DTYPE_BF16 ? DTYPE_BF16 : rounding);
    cpu_layernorm_forward(s, fp32_buf(normed), mean, rstd, fp32_numbers(sum), weight, bias, N, C, rounding);
    cpu_store_output(s, resid, sum, n);
    cpu_store_output(s, out, normed, n);
}

typedef struct {
    float *dinp;
    Buf dweight, dbias;
    const float *dout, *inp, *weight, *mean, *rstd;
    int N, C, rounds;
} LayerNormBackwardArgs;

/* dweight's terms: dout * norm. */
static void dweight_terms(const void *p, int i, int c0, int width, float *terms) {
    const LayerNormBackwardArgs *a = p;
    const float *dy = a->dout + (size_t)i * a->C + c0, *x = a->inp + (size_t)i * a->C + c0;
    float m = a->mean[i], r = a->rstd[i];
    #pragma omp simd
    for (int c = 0; c < width; c++) terms[c] = dy[c] * (x[c] - m) * r;
}

/* dbias's terms: dout's row itself, as bias_backward's. */
static void dbias_terms(const void *p, int i, int c0, int width, float *terms) {
    const LayerNormBackwardArgs *a = p;
    const float *dy = a->dout + (size_t)i * a->C + c0;
    for (int c = 0; c < width; c++) terms[c] = dy[c];
}

static void layernorm_backward_task(void *p) {
    LayerNormBackwardArgs *a = p;
    int N = a->N, C = a->C;
    /* dinp = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w */
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = a->inp + (size_t)i * C, *dy = a->dout + (size_t)i * C;
        float m = a->mean[i], r = a->rstd[i];
        float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
        #pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
        for (int c = 0; c < C; c++) {
            float dnorm = dy[c] * a->weight[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * (x[c] - m) * r;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        float *dx = a->dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * r;
            float g = r * (dy[c] * a->weight[c] - dnorm_mean - norm * dnorm_norm_mean);
            dx[c] = rounded_if(dx[c] + rounded_if(g, a->rounds), a->rounds);
        }
    }
    column_sums(a->dweight, N, C, dweight_terms, a, a->rounds);
    if (a->dbias.data) column_sums(a->dbias, N, C, dbias_terms, a, a->rounds);
}

/* A bf16 input widened at the room's start, a bf16 weight after it (its
 * sums run as fp32's do: read through a float pointer, so vectorised alike),
 * a bf16 dout after that, and a bf16 dinp widened after that, added into
 * there and stored back. */
void cpu_layernorm_backward(Stream *s, Buf dinp, Buf dweight, Buf dbias, ConstBuf dout, ConstBuf inp,
                            ConstBuf weight, const float *mean, const float *rstd, int N, int C, float *scratch,
                            DType rounding) {
    (void)scratch;  /* the weight gradient's parts stay in registers (column_sums) */
    size_t n = (size_t)N * C, x = cpu_room_for(inp.dtype, n), w = cpu_room_for(weight.dtype, (size_t)C);
    size_t dy_room = cpu_room_for(dout.dtype, n);
    cpu_stream_room(s, x + w + dy_room + cpu_room_for(dinp.dtype, n));  /* all, before any */
    const float *in = cpu_fp32_of(s, inp, n, 0), *dy = cpu_fp32_of(s, dout, n, x + w);
    float *dx = cpu_fp32_for(s, dinp, n, x + w + dy_room);
    if (dinp.dtype == DTYPE_BF16) cpu_load_bf16(s, dx, dinp.data, n);  /* the gradient so far, added into */
    LayerNormBackwardArgs a = { dx, dweight, dbias, dy, in, cpu_fp32_of(s, weight, (size_t)C, x), mean, rstd, N, C,
                                rounding == DTYPE_BF16 };
    stream_launch(s, layernorm_backward_task, &a, sizeof a);
    cpu_store_output(s, dinp, dx, n);
}
