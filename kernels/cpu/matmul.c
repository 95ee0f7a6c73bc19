/* matmul.c: Linear layers through BLAS sgemm (weights [out, in], as PyTorch). */
#include <cblas.h>

#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"

typedef struct { float *out; const float *inp, *weight; int N, C, OC; } MatmulForwardArgs;

/* The forward's rows are cut into an even number of blocks of at most
 * MATMUL_ROWS, one sgemm each, whatever the number of threads: OpenBLAS picks
 * its kernel by a product's size (its small-matrix kernels add in another
 * order), so rows cut by the thread count gave other bits on four threads
 * than on one, and the ranks of P x L splits have teams of other sizes, as
 * has a stream whose team shrinks under load (runtime/device_cpu.c).
 * Fewer, larger products run faster (128-row blocks cost 5% to 8%); an even
 * count shares two cores evenly. The price is on more cores: char-small's 768
 * rows are two blocks, so its forward products use two cores of four. */
enum { MATMUL_ROWS = 384 };

static void matmul_forward_task(void *p) {
    MatmulForwardArgs *a = p;
    int blocks = 2 * ((a->N + 2 * MATMUL_ROWS - 1) / (2 * MATMUL_ROWS));
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < blocks; b++) {
        int r0 = (int)((long)a->N * b / blocks), r1 = (int)((long)a->N * (b + 1) / blocks);
        if (r1 > r0)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, a->OC, a->C,
                        1.0f, a->inp + (size_t)r0 * a->C, a->C, a->weight, a->C, 0.0f,
                        a->out + (size_t)r0 * a->OC, a->OC);
    }
}

void cpu_matmul_forward(Stream *s, float *out, const float *inp, const float *weight,
                    int N, int C, int OC) {
    MatmulForwardArgs a = { out, inp, weight, N, C, OC };
    stream_launch(s, matmul_forward_task, &a, sizeof a);
}

typedef struct {
    float *dinp, *dweight;
    const float *dout, *inp, *weight;
    int N, C, OC;
} MatmulBackwardArgs;

/* dinp rows [r0, r1) = dout rows [r0, r1) @ weight[OC,C] */
static void dinp_rows(const MatmulBackwardArgs *a, int r0, int r1) {
    if (r1 > r0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r1 - r0, a->C, a->OC, 1.0f,
                    a->dout + (size_t)r0 * a->OC, a->OC, a->weight, a->C, 0.0f, a->dinp + (size_t)r0 * a->C, a->C);
}

/* dweight rows [o0, o1) += dout[N, o0:o1]^T @ inp[N,C] */
static void dweight_rows(const MatmulBackwardArgs *a, int o0, int o1) {
    if (o1 > o0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o1 - o0, a->C, a->N, 1.0f, a->dout + o0, a->OC,
                    a->inp, a->C, 1.0f, a->dweight + (size_t)o0 * a->C, a->C);
}

/* The two products are independent and equally large: on two or more threads
 * they run side by side, each sgemm on one thread (inside a parallel region an
 * OpenMP OpenBLAS does not fork again), which beats splitting each small sgemm.
 * One asked for alone (the head's two under autocast, made apart) is cut in
 * two halves of its output's rows, one section each: cut so whatever the
 * thread count, where OpenBLAS's own threads would cut it by their number. */
static void matmul_backward_task(void *p) {
    MatmulBackwardArgs *a = p;
    int alone_inp = a->dinp && !a->dweight, alone_weight = a->dweight && !a->dinp;
    if (!a->dinp && !a->dweight) return;
    #pragma omp parallel sections
    {
        #pragma omp section
        {
            if (alone_inp) dinp_rows(a, 0, a->N / 2);
            else if (alone_weight) dweight_rows(a, 0, a->OC / 2);
            else dinp_rows(a, 0, a->N);
        }
        #pragma omp section
        {
            if (alone_inp) dinp_rows(a, a->N / 2, a->N);
            else if (alone_weight) dweight_rows(a, a->OC / 2, a->OC);
            else dweight_rows(a, 0, a->OC);
        }
    }
}

void cpu_matmul_backward(Stream *s, float *dinp, float *dweight, const float *dout,
                     const float *inp, const float *weight, int N, int C, int OC) {
    MatmulBackwardArgs a = { dinp, dweight, dout, inp, weight, N, C, OC };
    stream_launch(s, matmul_backward_task, &a, sizeof a);
}

/* The bf16 products (kernels.h): sgemm's, with inputs held in bf16 widened
 * into the stream's room first (the same values, so the same bits) and an
 * output held in bf16 made there (with its bias added in fp32) and stored:
 * side by side from 0, what is held in bf16 of the input, the output (or
 * the output gradient), the weight (and the input's gradient and the
 * weight's), the room grown for all before any is placed. A weight
 * gradient held in bf16 is summed from zero there (sgemm adding into it, as
 * into one held in fp32) and stored. */
void cpu_matmul_forward_bf16(Stream *s, Buf out, ConstBuf inp, ConstBuf weight, ConstBuf bias, int N, int C,
                             int OC) {
    size_t x = cpu_room_for(inp.dtype, (size_t)N * C), y = cpu_room_for(out.dtype, (size_t)N * OC);
    cpu_stream_room(s, x + y + cpu_room_for(weight.dtype, (size_t)OC * C));
    const float *in = cpu_fp32_of(s, inp, (size_t)N * C, 0);
    float *written = cpu_fp32_for(s, out, (size_t)N * OC, x);
    cpu_matmul_forward(s, written, in, cpu_fp32_of(s, weight, (size_t)OC * C, x + y), N, C, OC);
    if (bias.data) cpu_bias_forward(s, fp32_buf(written), written, bias, N, OC, DTYPE_FP32);
    cpu_store_output(s, out, written, (size_t)N * OC);
}

void cpu_matmul_backward_bf16(Stream *s, Buf dinp, Buf dweight, ConstBuf dout, ConstBuf inp,
                              ConstBuf weight, int N, int C, int OC) {
    size_t nx = (size_t)N * C, nw = (size_t)OC * C;
    int to_inp = dinp.data != NULL, to_weight = dweight.data != NULL;  /* a product for each gradient asked for */
    size_t x = to_weight ? cpu_room_for(inp.dtype, nx) : 0, y = cpu_room_for(dout.dtype, (size_t)N * OC);
    size_t w = to_inp ? cpu_room_for(weight.dtype, nw) : 0, dx = to_inp ? cpu_room_for(dinp.dtype, nx) : 0;
    cpu_stream_room(s, x + y + w + dx + (to_weight ? cpu_room_for(dweight.dtype, nw) : 0));
    const float *in = to_weight ? cpu_fp32_of(s, inp, nx, 0) : NULL, *d = cpu_fp32_of(s, dout, (size_t)N * OC, x);
    const float *wt = to_inp ? cpu_fp32_of(s, weight, nw, x + y) : NULL;
    float *written = to_inp ? cpu_fp32_for(s, dinp, nx, x + y + w) : NULL;
    float *summed = to_weight ? cpu_fp32_for(s, dweight, nw, x + y + w + dx) : NULL;
    if (to_weight && dweight.dtype == DTYPE_BF16) cpu_fill_zero(s, summed, nw * sizeof(float));
    cpu_matmul_backward(s, written, summed, d, in, wt, N, C, OC);
    if (to_inp) cpu_store_output(s, dinp, written, nx);
    if (to_weight) cpu_store_output(s, dweight, summed, nw);
}
