/* test_kernels.c: every CPU op against the double reference; every backward
 * against central finite differences of that reference, in double. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_setup.h"
#include "../kernels/dropout.h"
#include "../kernels/attention_tiles.h"
#include "../kernels/kernels.h"
#include "../kernels/online_softmax.h"
#include "../kernels/packs.h"
#include "fixtures.h"
#include "reference.h"

TestSuite(kernels, .init = test_stream_setup, .fini = test_stream_teardown);

/* ---- finite differences ---- */

/* Central differences, step h, of objective(ctx) for every element of x. */
static void numeric_grad(double *x, size_t n, double (*objective)(void *), void *ctx, double *grad) {
    const double h = 1e-5;
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + h;
        double plus = objective(ctx);
        x[i] = saved - h;
        double minus = objective(ctx);
        x[i] = saved;
        grad[i] = (plus - minus) / (2 * h);
    }
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Every gradient buffer starts at random values. Where an op adds (parameter
 * gradients, LayerNorm's input gradient) the test subtracts them back, so an op
 * that overwrote would fail; where it writes, they must be gone. */
static void subtract_base(float *grad, const float *base, size_t n) {
    for (size_t i = 0; i < n; i++) grad[i] -= base[i];
}

static float *alloc_floats(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static const double GRAD_TOL = 1e-4;   /* float kernel vs exact double gradient */
static const double FWD_TOL = 1e-5;    /* float forward vs double forward */
/* bf16 attention against a double reference that rounds the same numbers
 * (rms): fp32's accuracy, but for the rare number that rounds to the next
 * bf16 on one side only (one weight near 1 moves its row's output by ~1e-3);
 * the fp32 op is 1.2e-3 to 1.6e-3 away */
static const double BF16_ATTENTION_TOL = 2e-4;

/* ---- matmul ---- */

typedef struct { double *inp, *weight, *g, *out; int N, C, OC; } MatmulCtx;

static double matmul_objective(void *p) {
    MatmulCtx *c = p;
    ref_matmul(c->out, c->inp, c->weight, c->N, c->C, c->OC);
    return dot(c->g, c->out, (size_t)c->N * c->OC);
}

Test(kernels, matmul_forward_backward) {
    int N = 5, C = 7, OC = 6;
    float *inp = alloc_floats(N * C), *w = alloc_floats(OC * C), *g = alloc_floats(N * OC);
    float *out = alloc_floats(N * OC), *dinp = alloc_floats(N * C), *dw = alloc_floats(OC * C);
    float *base_inp = alloc_floats(N * C), *base_w = alloc_floats(OC * C);
    fill_uniform(inp, N * C, -1, 1, 1);
    fill_uniform(w, OC * C, -1, 1, 2);
    fill_uniform(g, N * OC, -1, 1, 3);
    fill_uniform(base_inp, N * C, -1, 1, 4);
    fill_uniform(base_w, OC * C, -1, 1, 5);
    memcpy(dinp, base_inp, sizeof(float) * N * C);
    memcpy(dw, base_w, sizeof(float) * OC * C);
    matmul_forward(test_stream, out, inp, w, N, C, OC);
    matmul_backward(test_stream, dinp, dw, g, inp, w, N, C, OC);
    stream_synchronize(test_stream);
    subtract_base(dw, base_w, OC * C);  /* dinp is written, dweight added */

    MatmulCtx c = { to_double(inp, N * C), to_double(w, OC * C), to_double(g, N * OC),
                    malloc(sizeof(double) * N * OC), N, C, OC };
    ref_matmul(c.out, c.inp, c.weight, N, C, OC);
    cr_expect_lt(rel_error(out, c.out, N * OC), FWD_TOL, "matmul forward");
    double *num = malloc(sizeof(double) * N * C), *numw = malloc(sizeof(double) * OC * C);
    numeric_grad(c.inp, N * C, matmul_objective, &c, num);
    numeric_grad(c.weight, OC * C, matmul_objective, &c, numw);
    cr_expect_lt(rel_error(dinp, num, N * C), GRAD_TOL, "matmul dinp: %g", rel_error(dinp, num, N * C));
    cr_expect_lt(rel_error(dw, numw, OC * C), GRAD_TOL, "matmul dweight: %g", rel_error(dw, numw, OC * C));
    free(inp); free(w); free(g); free(out); free(dinp); free(dw); free(base_inp); free(base_w);
    free(c.inp); free(c.weight); free(c.g); free(c.out); free(num); free(numw);
}

/* ---- layernorm ---- */

typedef struct { double *inp, *weight, *g, *out; int N, C; } LayerNormCtx;

static double layernorm_objective(void *p) {
    LayerNormCtx *c = p;
    ref_layernorm(c->out, c->inp, c->weight, c->N, c->C);
    return dot(c->g, c->out, (size_t)c->N * c->C);
}

static void check_layernorm(int N, int C) {
    float *inp = alloc_floats(N * C), *w = alloc_floats(C), *g = alloc_floats(N * C);
    float *out = alloc_floats(N * C), *mean = alloc_floats(N), *rstd = alloc_floats(N);
    float *dinp = alloc_floats(N * C), *dw = alloc_floats(C), *base = alloc_floats(N * C), *basew = alloc_floats(C);
    fill_uniform(inp, N * C, -2, 2, 11);
    fill_uniform(w, C, 0.5f, 1.5f, 12);
    fill_uniform(g, N * C, -1, 1, 13);
    fill_uniform(base, N * C, -1, 1, 14);
    fill_uniform(basew, C, -1, 1, 15);
    memcpy(dinp, base, sizeof(float) * N * C);
    memcpy(dw, basew, sizeof(float) * C);
    layernorm_forward(test_stream, fp32_buf(out), mean, rstd, fp32_numbers(inp), fp32_numbers(w), fp32_numbers(NULL),
                      N, C, DTYPE_FP32);
    float *scratch = alloc_floats(column_sums_scratch_floats(N, C));
    layernorm_backward(test_stream, fp32_buf(dinp), fp32_buf(dw), fp32_buf(NULL), fp32_numbers(g), fp32_numbers(inp),
                       fp32_numbers(w), mean, rstd, N, C, scratch, DTYPE_FP32);
    stream_synchronize(test_stream);
    free(scratch);
    subtract_base(dinp, base, N * C);
    subtract_base(dw, basew, C);

    LayerNormCtx c = { to_double(inp, N * C), to_double(w, C), to_double(g, N * C),
                       malloc(sizeof(double) * N * C), N, C };
    ref_layernorm(c.out, c.inp, c.weight, N, C);
    cr_expect_lt(rel_error(out, c.out, N * C), FWD_TOL, "layernorm forward");
    double *num = malloc(sizeof(double) * N * C), *numw = malloc(sizeof(double) * C);
    numeric_grad(c.inp, N * C, layernorm_objective, &c, num);
    numeric_grad(c.weight, C, layernorm_objective, &c, numw);
    cr_expect_lt(rel_error(dinp, num, N * C), GRAD_TOL, "layernorm dinp: %g", rel_error(dinp, num, N * C));
    cr_expect_lt(rel_error(dw, numw, C), GRAD_TOL, "layernorm dweight: %g", rel_error(dw, numw, C));
    free(inp); free(w); free(g); free(out); free(mean); free(rstd); free(dinp); free(dw); free(base); free(basew);
    free(c.inp); free(c.weight); free(c.g); free(c.out); free(num); free(numw);
}

Test(kernels, layernorm_forward_backward) { check_layernorm(6, 16); }
/* more columns than one block of the weight-gradient sum (32), the last one partial */
Test(kernels, layernorm_wide_rows) { check_layernorm(5, 70); }

/* ---- attention ---- */

typedef struct { double *qkv, *g, *out; int B, T, C, NH; Dropout drop; } AttentionCtx;

static double attention_objective(void *p) {
    AttentionCtx *c = p;
    ref_attention(c->out, NULL, c->qkv, c->B, c->T, c->C, c->NH, c->drop);
    return dot(c->g, c->out, (size_t)c->B * c->T * c->C);
}

/* One attention forward and backward on `stream`, into buffers of exactly the
 * sizes the backend asks for (so that AddressSanitizer sees any access past them). */
typedef struct { float *out, *saved, *scratch, *dqkv; AttentionBuffers sizes; } AttentionRun;

static AttentionRun run_attention(Stream *stream, const float *qkv, const float *g, const float *base, int B,
                                  int T, int C, int NH, Dropout drop, DType products) {
    size_t nqkv = (size_t)B * T * 3 * C;
    AttentionRun r = { .sizes = attention_buffers(device_kind(stream_device(stream)), B, T, C, NH, products) };
    r.out = alloc_floats((size_t)B * T * C);
    r.saved = alloc_floats(r.sizes.saved);
    r.scratch = alloc_floats(r.sizes.scratch);
    r.dqkv = alloc_floats(nqkv);
    memcpy(r.dqkv, base, sizeof(float) * nqkv);
    attention_forward(stream, fp32_buf(r.out), r.saved, r.scratch, fp32_numbers(qkv), B, T, C, NH,
                      drop, products, DTYPE_FP32);
    attention_backward(stream, fp32_buf(r.dqkv), r.scratch, fp32_numbers(g), fp32_numbers(qkv), fp32_numbers(r.out),
                       r.saved, B, T, C, NH, drop, products, DTYPE_FP32);
    stream_synchronize(stream);
    return r;
}

static void free_attention_run(AttentionRun r) { free(r.out); free(r.saved); free(r.scratch); free(r.dqkv); }

/* Scores that grow with the key's position: every query's first component 1,
 * every key's rising to 4 at the last one, so each key block a row meets past
 * its first raises the row's max and the online softmax must rescale what it
 * kept (random scores raise it in few rows of a block, and a missed rescale
 * can hide there). */
static void rising_scores(float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                float *row = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
                row[0] = 1.0f;
                row[C] = 4.0f * (float)(t + 1) / (float)T;
            }
}

typedef enum { RANDOM_SCORES, RISING_SCORES } Scores;

static void check_attention_of(float p, int B, int T, Scores scores) {
    int C = 8, NH = 2;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, rows = (size_t)B * NH * T;
    Dropout drop = { p, 42, 3, 7, 11, NULL };
    float *qkv = alloc_floats(nqkv), *g = alloc_floats(nout), *base = alloc_floats(nqkv);
    fill_uniform(qkv, nqkv, -1.5f, 1.5f, 21);
    if (scores == RISING_SCORES) rising_scores(qkv, B, T, C, NH);
    fill_uniform(g, nout, -1, 1, 22);
    fill_uniform(base, nqkv, -1, 1, 23);
    AttentionRun r = run_attention(test_stream, qkv, g, base, B, T, C, NH, drop, DTYPE_FP32);
    /* the CPU keeps one float a row of scores and no T x T scratch */
    cr_expect_eq(r.sizes.saved, rows);
    cr_expect_eq(r.sizes.scratch, (size_t)0);

    AttentionCtx c = { to_double(qkv, nqkv), to_double(g, nout), malloc(sizeof(double) * nout), B, T, C, NH, drop };
    double *lse = malloc(sizeof(double) * rows);
    ref_attention(c.out, lse, c.qkv, B, T, C, NH, drop);
    cr_expect_lt(rel_error(r.out, c.out, nout), FWD_TOL, "attention forward (p=%g): %g", p, rel_error(r.out, c.out, nout));
    cr_expect_lt(rel_error(r.saved, lse, rows), FWD_TOL, "attention log-sum-exp (p=%g): %g", p,
                 rel_error(r.saved, lse, rows));
    double *num = malloc(sizeof(double) * nqkv);
    numeric_grad(c.qkv, nqkv, attention_objective, &c, num);
    cr_expect_lt(rel_error(r.dqkv, num, nqkv), GRAD_TOL, "attention dqkv (p=%g): %g", p, rel_error(r.dqkv, num, nqkv));
    free_attention_run(r);
    free(qkv); free(g); free(base);
    free(c.qkv); free(c.g); free(c.out); free(lse); free(num);
}

static void check_attention(float p, int B, int T) { check_attention_of(p, B, T, RANDOM_SCORES); }

Test(kernels, attention_forward_backward) { check_attention(0.0f, 2, 5); }
Test(kernels, attention_with_dropout) { check_attention(0.3f, 2, 5); }
/* longer than a row block (32), and not a multiple of it */
Test(kernels, attention_in_row_blocks) { check_attention(0.0f, 1, 70); }
Test(kernels, attention_in_row_blocks_with_dropout) { check_attention(0.2f, 1, 45); }
/* more than one key block (64), the last one partial */
Test(kernels, attention_in_key_blocks_with_dropout) { check_attention(0.2f, 1, 131); }
/* A key block is 64 keys: T just below, at and just above one, and three with
 * a ragged last one (64 + 64 + 22), each with and without dropout, over scores
 * that raise every row's max from block to block. */
Test(kernels, attention_below_one_key_block) {
    check_attention_of(0.0f, 1, 63, RISING_SCORES);
    check_attention_of(0.2f, 1, 63, RISING_SCORES);
}
Test(kernels, attention_at_one_key_block) {
    check_attention_of(0.0f, 1, 64, RISING_SCORES);
    check_attention_of(0.2f, 1, 64, RISING_SCORES);
}
Test(kernels, attention_just_past_one_key_block) {
    check_attention_of(0.0f, 1, 65, RISING_SCORES);
    check_attention_of(0.2f, 1, 65, RISING_SCORES);
}
Test(kernels, attention_over_key_blocks_with_a_ragged_last) { check_attention_of(0.0f, 1, 150, RISING_SCORES); }
Test(kernels, attention_over_key_blocks_with_a_ragged_last_with_dropout) {
    check_attention_of(0.2f, 1, 150, RISING_SCORES);
}

/* In bf16 the op rounds the weights and the scores' gradient to bf16 before
 * their products, where FlashAttention does: on bf16 values (as autocast's),
 * its output and gradients are a double reference's that rounds the same
 * numbers (ref_attention_bf16), to fp32's accuracy, and the fp32 op's are
 * not (so the rounding shows at this size). Three key blocks, the last
 * ragged, over scores that raise each row's max from block to block. */
static void check_attention_bf16(float p) {
    int B = 2, T = 150, C = 32, NH = 2;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    Dropout drop = { p, 42, 3, 7, 11, NULL };
    float *qkv = alloc_floats(nqkv), *g = alloc_floats(nout), *base = alloc_floats(nqkv);
    fill_uniform(qkv, nqkv, -1.5f, 1.5f, 41);
    rising_scores(qkv, B, T, C, NH);
    fill_uniform(g, nout, -1, 1, 42);
    fill_uniform(base, nqkv, -1, 1, 43);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = bf16_rounded(qkv[i]);
    for (size_t i = 0; i < nout; i++) g[i] = bf16_rounded(g[i]);
    AttentionRun rounded = run_attention(test_stream, qkv, g, base, B, T, C, NH, drop, DTYPE_BF16);
    AttentionRun exact = run_attention(test_stream, qkv, g, base, B, T, C, NH, drop, DTYPE_FP32);
    double *qkv64 = to_double(qkv, nqkv), *g64 = to_double(g, nout);
    double *out = malloc(sizeof(double) * nout), *dqkv = malloc(sizeof(double) * nqkv);
    ref_attention_bf16(out, dqkv, qkv64, g64, B, T, C, NH, drop);
    double out_err = rms_rel_error(rounded.out, out, nout), dqkv_err = rms_rel_error(rounded.dqkv, dqkv, nqkv);
    double out_exact = rms_rel_error(exact.out, out, nout), dqkv_exact = rms_rel_error(exact.dqkv, dqkv, nqkv);
    cr_expect_lt(out_err, BF16_ATTENTION_TOL, "bf16 attention out (p=%g): %g", p, out_err);
    cr_expect_lt(dqkv_err, BF16_ATTENTION_TOL, "bf16 attention dqkv (p=%g): %g", p, dqkv_err);
    cr_expect_gt(out_exact, 4 * BF16_ATTENTION_TOL, "the fp32 op's out (p=%g) is as near the rounding reference: %g",
                 p, out_exact);
    cr_expect_gt(dqkv_exact, 4 * BF16_ATTENTION_TOL,
                 "the fp32 op's dqkv (p=%g) is as near the rounding reference: %g", p, dqkv_exact);
    free_attention_run(rounded);
    free_attention_run(exact);
    free(qkv); free(g); free(base); free(qkv64); free(g64); free(out); free(dqkv);
}

Test(kernels, attention_in_bf16_rounds_as_flashattention) { check_attention_bf16(0.0f); }
Test(kernels, attention_in_bf16_rounds_as_flashattention_with_dropout) { check_attention_bf16(0.2f); }

/* The tensor cores' fragments (attention_tiles.h): A's 8 numbers a lane,
 * C's 4 and B's 4 each cover their matrix once over the 32 lanes; a
 * register's two numbers are side by side along k (one 32-bit read of a
 * tile); and the A operand the kernels take from a product, tile 2kk and
 * 2kk + 1, holds in each lane the numbers at A's places. */
Test(kernels, attention_tensor_core_fragments_cover_their_matrices) {
    int a_seen[16][16] = { 0 }, c_seen[16][8] = { 0 }, b_seen[16][8] = { 0 };
    for (int lane = 0; lane < 32; lane++) {
        for (int i = 0; i < 8; i++) {
            a_seen[mma_a_row(lane, i)][mma_a_col(lane, i)]++;
            if (i % 2) {
                cr_expect_eq(mma_a_row(lane, i), mma_a_row(lane, i - 1));
                cr_expect_eq(mma_a_col(lane, i), mma_a_col(lane, i - 1) + 1, "lane %d, A number %d", lane, i);
            }
            for (int kk = 0; kk < 4; kk++) {
                int tile = a_from_c_tile(kk, i), number = a_from_c_number(i);
                cr_expect_eq(mma_c_row(lane, number), mma_a_row(lane, i), "lane %d, A number %d", lane, i);
                cr_expect_eq(8 * tile + mma_c_col(lane, number), 16 * kk + mma_a_col(lane, i), "lane %d, A number %d",
                             lane, i);
            }
        }
        for (int i = 0; i < 4; i++) {
            c_seen[mma_c_row(lane, i)][mma_c_col(lane, i)]++;
            b_seen[mma_b_k(lane, i)][mma_b_n(lane)]++;
            if (i % 2) cr_expect_eq(mma_b_k(lane, i), mma_b_k(lane, i - 1) + 1, "lane %d, B number %d", lane, i);
        }
    }
    for (int r = 0; r < 16; r++) {
        for (int c = 0; c < 16; c++) cr_expect_eq(a_seen[r][c], 1, "A (%d, %d)", r, c);
        for (int c = 0; c < 8; c++) {
            cr_expect_eq(c_seen[r][c], 1, "C (%d, %d)", r, c);
            cr_expect_eq(b_seen[r][c], 1, "B (%d, %d)", r, c);
        }
    }
}

/* The GPU's tiles of the causal triangle: every pair (t, c) a row sees lies in
 * a tile both passes visit (the query blocks' over key blocks, the key
 * blocks' over query blocks), every tile visited holds a pair seen, the
 * launch order takes each query block once, the longest first, and a head is
 * padded to a multiple of 16 that holds it. */
Test(kernels, attention_tiles_cover_the_causal_triangle) {
    const int lengths[] = { 1, 15, 63, 64, 65, 150, 1024 };
    for (size_t n = 0; n < sizeof lengths / sizeof *lengths; n++) {
        int T = lengths[n], blocks = flash_blocks(T);
        cr_expect_eq(blocks * FLASH_ROWS >= T && (blocks - 1) * FLASH_ROWS < T, 1, "T = %d: %d blocks", T, blocks);
        for (int t = 0; t < T; t++)
            for (int c = 0; c < T; c++) {
                int qb = t / FLASH_ROWS, kb = c / FLASH_ROWS;
                cr_expect_eq(flash_visible(t, c, T), c <= t);
                if (c > t) continue;
                cr_expect_lt(kb, flash_key_blocks(qb), "T = %d: (%d, %d)", T, t, c);
                cr_expect_geq(qb, flash_first_query_block(kb), "T = %d: (%d, %d)", T, t, c);
            }
        int taken[64] = { 0 };
        for (int qb = 0; qb < blocks && blocks <= 64; qb++) {
            int kb = flash_key_blocks(qb) - 1;  /* the last a query block sees: its first row sees its first key */
            cr_expect(flash_visible(qb * FLASH_ROWS, kb * FLASH_ROWS, T), "T = %d: tile (%d, %d) sees nothing", T, qb, kb);
            taken[flash_query_block(qb, blocks)]++;
        }
        cr_expect_eq(flash_query_block(0, blocks), blocks - 1, "the longest query block first");
        for (int qb = 0; qb < blocks && blocks <= 64; qb++) cr_expect_eq(taken[qb], 1, "T = %d: query block %d", T, qb);
    }
    for (int hs = 1; hs <= FLASH_MAX_HEAD; hs++) {
        int width = flash_head_width(hs);
        cr_expect(width >= hs && width % 16 == 0 && width - hs < width / 2 + 8, "head %d padded to %d", hs, width);
    }
    cr_expect_eq(flash_head_width(FLASH_MAX_HEAD + 1), 0);
    cr_expect_eq(attention_mask_index(2, 10, 3, 4), (size_t)(2 * 100 + 3 * 10 + 4), "[B, NH, T, T]'s element");
}

/* The same bits on one thread as on every core: each (batch row, head) runs
 * on one thread, in an order fixed by the shapes. */
Test(kernels, attention_same_bits_at_any_thread_count) {
    int B = 2, T = 100, C = 16, NH = 4;
    size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    Dropout drop = { 0.2f, 5, 1, 3, 4, NULL };
    float *qkv = alloc_floats(nqkv), *g = alloc_floats(nout), *base = alloc_floats(nqkv);
    fill_uniform(qkv, nqkv, -1.5f, 1.5f, 31);
    fill_uniform(g, nout, -1, 1, 32);
    Device *one_thread = device_create_cpu(1024, -1);
    Stream *one_thread_stream = stream_create(one_thread);
    for (DType products = DTYPE_FP32; products < DTYPES; products++) {
        AttentionRun every_core = run_attention(test_stream, qkv, g, base, B, T, C, NH, drop, products);
        AttentionRun single = run_attention(one_thread_stream, qkv, g, base, B, T, C, NH, drop, products);
        cr_expect_eq(memcmp(every_core.out, single.out, sizeof(float) * nout), 0, "attention out (%d)", products);
        cr_expect_eq(memcmp(every_core.saved, single.saved, sizeof(float) * every_core.sizes.saved), 0,
                     "log-sum-exp (%d)", products);
        cr_expect_eq(memcmp(every_core.dqkv, single.dqkv, sizeof(float) * nqkv), 0, "attention dqkv (%d)", products);
        free_attention_run(every_core);
        free_attention_run(single);
    }
    stream_destroy(one_thread_stream);
    device_destroy(one_thread);
    free(qkv); free(g); free(base);
}

/* ---- embedding ---- */

typedef struct { double *wte, *wpe, *g, *out; const int *tokens; int B, T, C; } EmbeddingCtx;

static double embedding_objective(void *p) {
    EmbeddingCtx *c = p;
    ref_embedding(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->g, c->out, (size_t)c->B * c->T * c->C);
}

static void check_embedding(int C) {
    int B = 3, T = 4, V = 6;
    int tokens[12] = { 0, 5, 5, 2, 1, 1, 1, 3, 5, 0, 2, 2 };  /* repeats: dwte must add them up */
    float *wte = alloc_floats(V * C), *wpe = alloc_floats(T * C), *g = alloc_floats(B * T * C);
    float *out = alloc_floats(B * T * C), *dwte = alloc_floats(V * C), *dwpe = alloc_floats(T * C);
    float *base_wte = alloc_floats(V * C), *base_wpe = alloc_floats(T * C);
    fill_uniform(base_wte, V * C, -1, 1, 34);
    fill_uniform(base_wpe, T * C, -1, 1, 35);
    memcpy(dwte, base_wte, sizeof(float) * V * C);
    memcpy(dwpe, base_wpe, sizeof(float) * T * C);
    fill_uniform(wte, V * C, -1, 1, 31);
    fill_uniform(wpe, T * C, -1, 1, 32);
    fill_uniform(g, B * T * C, -1, 1, 33);
    embedding_forward(test_stream, fp32_buf(out), tokens, fp32_numbers(wte), fp32_numbers(wpe), B, T, C, DTYPE_FP32);
    TokenBuckets buckets = buckets_of(tokens, B * T, V);
    embedding_backward(test_stream, fp32_buf(dwte), fp32_buf(dwpe), fp32_numbers(g), fp32_numbers(NULL), buckets, B, T,
                       V, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    subtract_base(dwte, base_wte, V * C);  /* parameter gradients are added */
    subtract_base(dwpe, base_wpe, T * C);
    EmbeddingCtx c = { to_double(wte, V * C), to_double(wpe, T * C), to_double(g, B * T * C),
                       malloc(sizeof(double) * B * T * C), tokens, B, T, C };
    ref_embedding(c.out, tokens, c.wte, c.wpe, B, T, C);
    cr_expect_lt(rel_error(out, c.out, B * T * C), FWD_TOL);
    double *num = malloc(sizeof(double) * V * C), *nump = malloc(sizeof(double) * T * C);
    numeric_grad(c.wte, V * C, embedding_objective, &c, num);
    numeric_grad(c.wpe, T * C, embedding_objective, &c, nump);
    cr_expect_lt(rel_error(dwte, num, V * C), GRAD_TOL);
    cr_expect_lt(rel_error(dwpe, nump, T * C), GRAD_TOL);
    free(wte); free(wpe); free(g); free(out); free(dwte); free(dwpe); free(base_wte); free(base_wpe);
    free(c.wte); free(c.wpe); free(c.g); free(c.out); free(num); free(nump);
    buckets_free(buckets);
}

Test(kernels, embedding_forward_backward) { check_embedding(5); }
Test(kernels, embedding_wide_rows) { check_embedding(70); }

/* Every position once, in its token's bucket, tokens ascending, each bucket's
 * positions in row order: tokens drawn with repeats (and some never). */
Test(kernels, token_buckets_group_the_positions_stably) {
    enum { BT = 2000, V = 300 };
    int tokens[BT], seen[BT] = { 0 };
    for (int i = 0; i < BT; i++) tokens[i] = (int)((i * 7919u + (unsigned)(i * i) % 61u) % 150u) * 2;  /* odd ids absent */
    TokenBuckets b = buckets_of(tokens, BT, V);
    cr_assert_eq(b.start[0], 0);
    cr_assert_eq(b.start[b.ntokens], BT);
    cr_expect_eq(b.ntokens, 150, "%d tokens present", b.ntokens);
    for (int k = 0; k < b.ntokens; k++) {
        if (k > 0) cr_expect_gt(b.token[k], b.token[k - 1], "bucket %d", k);
        cr_expect_lt(b.start[k], b.start[k + 1], "bucket %d is empty", k);
        for (int i = b.start[k]; i < b.start[k + 1]; i++) {
            int pos = b.positions[i];
            cr_expect_eq(tokens[pos], b.token[k], "position %d in bucket of token %d", pos, b.token[k]);
            if (i > b.start[k]) cr_expect_gt(pos, b.positions[i - 1], "bucket %d out of row order", k);
            seen[pos]++;
        }
    }
    for (int i = 0; i < BT; i++) cr_expect_eq(seen[i], 1, "position %d seen %d times", i, seen[i]);
    buckets_free(b);
}

/* Padded to the arrays' room, the search finds every token's bucket as
 * before, and none for a token the batch lacks: the count a graph captured
 * serves every batch. */
Test(kernels, token_buckets_padded_find_the_same_buckets) {
    enum { BT = 400, V = 300 };
    int tokens[BT];
    for (int i = 0; i < BT; i++) tokens[i] = (i * 37 + 5) % 97 * 3;  /* 97 tokens, multiples of 3 */
    TokenBuckets b = buckets_of(tokens, BT, V), padded = buckets_of(tokens, BT, V);
    token_buckets_pad(&padded, BT);
    cr_assert_eq(padded.ntokens, BT);
    for (int v = 0; v < V; v++)
        cr_expect_eq(token_bucket(padded, v), token_bucket(b, v), "token %d", v);
    cr_expect_eq(token_bucket(padded, 3 * 96), 96);
    cr_expect_eq(token_bucket(padded, 1), -1);
    buckets_free(b);
    buckets_free(padded);
}

/* The bits the buckets promise: dwte's rows take each row of dout in row
 * order, dwpe's in batch order, onto what the gradient held; a plain loop
 * over the batch in row order makes the same adds. */
Test(kernels, embedding_backward_adds_the_rows_in_row_order) {
    enum { B = 3, T = 50, C = 40, V = 37 };
    int tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 13 + i / 7) % V;
    float *g = alloc_floats(B * T * C), *dwte = alloc_floats(V * C), *dwpe = alloc_floats(T * C);
    float *want_wte = alloc_floats(V * C), *want_wpe = alloc_floats(T * C);
    fill_wide(g, B * T * C, 41);
    fill_wide(dwte, V * C, 42);
    fill_wide(dwpe, T * C, 43);
    memcpy(want_wte, dwte, sizeof(float) * V * C);
    memcpy(want_wpe, dwpe, sizeof(float) * T * C);
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++) {
            want_wte[tokens[bt] * C + c] += g[bt * C + c];
            want_wpe[(bt % T) * C + c] += g[bt * C + c];
        }
    TokenBuckets buckets = buckets_of(tokens, B * T, V);
    embedding_backward(test_stream, fp32_buf(dwte), fp32_buf(dwpe), fp32_numbers(g), fp32_numbers(NULL), buckets, B, T,
                       V, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    cr_expect(memcmp(dwte, want_wte, sizeof(float) * V * C) == 0, "dwte: not the row-order sums' bits");
    cr_expect(memcmp(dwpe, want_wpe, sizeof(float) * T * C) == 0, "dwpe: not the batch-order sums' bits");
    free(g); free(dwte); free(dwpe); free(want_wte); free(want_wpe);
    buckets_free(buckets);
}

/* Under bf16 the embeddings' backward is the ops it stands for, to the
 * bytes: the sums into a zeroed buffer, round_to_bf16, wte's joined by the
 * head's bf16 gradient (residual_forward into bf16), then the add into the
 * gradient, fp32 or held in bf16; rows of tokens the batch does not hold
 * take the head's alone. The rounding shows (the test could fail). */
Test(kernels, embedding_backward_in_bf16_is_its_sums_rounded_joined_by_the_heads_and_added) {
    enum { B = 3, T = 50, C = 300, V = 37 };  /* C past one block of the CPU's columns */
    int tokens[B * T];
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 13 + i / 7) % (V - 5);  /* the last 5 ids absent */
    size_t nw = (size_t)(V + T) * C;
    float *g = alloc_floats(B * T * C), *start = alloc_floats(nw), *made = alloc_floats(nw), *want = alloc_floats(nw);
    float *got = alloc_floats(nw), *head = alloc_floats((size_t)V * C);
    bf16 *head16 = malloc((size_t)V * C * sizeof(bf16)), *held = malloc(nw * sizeof(bf16));
    bf16 *held_want = malloc(nw * sizeof(bf16));
    fill_uniform(g, (size_t)B * T * C, -1, 1, 44);
    fill_uniform(start, nw, -1, 1, 45);
    fill_uniform(head, (size_t)V * C, -1, 1, 46);
    for (size_t i = 0; i < (size_t)V * C; i++) head16[i] = bf16_from_float(head[i]);
    for (size_t i = 0; i < nw; i++) start[i] = bf16_rounded(start[i]);
    TokenBuckets buckets = buckets_of(tokens, B * T, V);
    /* apart: the sums from zero, rounded, the head's joined, then added */
    memset(made, 0, nw * sizeof(float));
    embedding_backward(test_stream, fp32_buf(made), fp32_buf(made + (size_t)V * C), fp32_numbers(g),
                       fp32_numbers(NULL), buckets, B, T, V, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    int rounded = 0;
    for (size_t i = 0; i < nw; i++) rounded += bf16_rounded(made[i]) != made[i];
    cr_assert_gt(rounded, 0, "no sum needed rounding: the test could not fail");
    round_to_bf16(test_stream, made, made, nw);
    residual_forward(test_stream, fp32_buf(made), fp32_numbers(made), bf16_numbers(head16), (size_t)V * C,
                     DTYPE_BF16);
    memcpy(want, start, nw * sizeof(float));
    residual_forward(test_stream, fp32_buf(want), fp32_numbers(want), fp32_numbers(made), nw, DTYPE_FP32);
    for (size_t i = 0; i < nw; i++) held_want[i] = bf16_from_float(start[i]);
    residual_forward(test_stream, bf16_buf(held_want), bf16_numbers(held_want), fp32_numbers(made), nw, DTYPE_BF16);
    /* the one op, into fp32 and into bf16 gradients */
    memcpy(got, start, nw * sizeof(float));
    for (size_t i = 0; i < nw; i++) held[i] = bf16_from_float(start[i]);
    embedding_backward(test_stream, fp32_buf(got), fp32_buf(got + (size_t)V * C), fp32_numbers(g),
                       bf16_numbers(head16), buckets, B, T, V, C, DTYPE_BF16);
    embedding_backward(test_stream, bf16_buf(held), bf16_buf(held + (size_t)V * C), fp32_numbers(g),
                       bf16_numbers(head16), buckets, B, T, V, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_expect(memcmp(got, want, nw * sizeof(float)) == 0, "into fp32 gradients");
    cr_expect(memcmp(held, held_want, nw * sizeof(bf16)) == 0, "into bf16 gradients");
    cr_expect(memcmp(got + (size_t)(V - 1) * C, start + (size_t)(V - 1) * C, C * sizeof(float)) != 0,
              "an id the batch does not hold took no head's gradient");
    free(g); free(start); free(made); free(want); free(got); free(head); free(head16); free(held); free(held_want);
    buckets_free(buckets);
}

/* ---- the GPU's packs of numbers (packs.h) ---- */

/* The tiles of the GPU's elementwise kernels: over n = 100003 numbers
 * (a last tile short) in blocks of 256 threads, every number taken once,
 * whether the op's pointers are aligned (packed tiles but the last) or not;
 * a packed tile's thread holds 8 numbers side by side, an unpacked one's
 * lie 256 apart. And the halves of a 32-bit word as memory holds two bf16s:
 * a 16-byte load of numbers 0..7 gives words whose low halves are the even
 * numbers, as on the host, which is little-endian as the GPU is. */
Test(kernels, packs_take_every_number_once_and_words_hold_them_in_order) {
    enum { THREADS = 256 };
    size_t n = 100003, tiles = pack_tiles(n, THREADS);
    cr_expect_eq(tiles, 49, "100003 numbers in tiles of 2048");
    unsigned char *taken = malloc(n + (size_t)THREADS * PACK_NUMBERS);
    cr_assert(taken);
    for (int aligned = 0; aligned < 2; aligned++) {
        memset(taken, 0, n + (size_t)THREADS * PACK_NUMBERS);
        size_t packed_tiles = 0;
        for (size_t b = 0; b < tiles; b++) {
            size_t first = tile_first(b, THREADS);
            int packed = tile_packed(first, THREADS, n, aligned);
            packed_tiles += (size_t)packed;
            for (int t = 0; t < THREADS; t++)
                for (int k = 0; k < PACK_NUMBERS; k++) taken[pack_number(first, THREADS, t, k, packed)]++;
        }
        size_t wrong = 0;
        for (size_t i = 0; i < n; i++) wrong += taken[i] != 1;
        cr_expect_eq(wrong, 0, "aligned %d: %zu numbers not taken once", aligned, wrong);
        cr_expect_eq(packed_tiles, aligned ? tiles - 1 : 0, "aligned %d: %zu tiles packed", aligned, packed_tiles);
    }
    free(taken);
    cr_expect_eq(pack_number(2048, THREADS, 3, 5, 1), 2048 + 3 * 8 + 5);
    cr_expect_eq(pack_number(2048, THREADS, 3, 5, 0), 2048 + 3 + 5 * 256);
    _Alignas(16) bf16 numbers[PACK_NUMBERS + 1];
    for (int k = 0; k <= PACK_NUMBERS; k++) numbers[k] = (bf16)(0x3F80 + k);
    cr_expect(packs_aligned(numbers, numbers + PACK_NUMBERS, NULL), "16 bytes on: on the boundary");
    cr_expect(!packs_aligned(numbers, numbers + 1, NULL), "one bf16 past a boundary");
    cr_expect(!packs_aligned(NULL, NULL, (const float *)numbers + 1), "one float past a boundary");
    uint32_t words[PACK_NUMBERS / 2];
    memcpy(words, numbers, sizeof words);
    for (int k = 0; k < PACK_NUMBERS / 2; k++) {
        cr_expect_eq(pack_low(words[k]), numbers[2 * k], "word %d's low half", k);
        cr_expect_eq(pack_high(words[k]), numbers[2 * k + 1], "word %d's high half", k);
        cr_expect_eq(pack_word(numbers[2 * k], numbers[2 * k + 1]), words[k], "word %d made of its halves", k);
    }
}

/* ---- the column sums in parts (row_parts.h) ---- */

/* want[c] += (0 + part 0) + part 1 + ..., each part (0 + its rows in order):
 * the adds both backends make, written as a plain loop. */
static void parted_sums(float *want, const float *terms, int N, int C) {
    for (int c = 0; c < C; c++) {
        float total = 0.0f;
        for (int p = 0; p < row_parts(N); p++) {
            float part = 0.0f;
            for (int i = part_first_row(p); i < part_end_row(p, N); i++) part += terms[(size_t)i * C + c];
            total += part;
        }
        want[c] += total;
    }
}

Test(kernels, row_parts_cover_the_rows_once) {
    for (int N = 0; N < 3 * PART_ROWS + 2; N++) {
        int covered = 0;
        for (int p = 0; p < row_parts(N); p++) {
            cr_assert_eq(part_first_row(p), covered, "N=%d part %d", N, p);
            cr_assert_gt(part_end_row(p, N), part_first_row(p), "N=%d: part %d is empty", N, p);
            cr_assert_leq(part_end_row(p, N) - part_first_row(p), PART_ROWS);
            covered = part_end_row(p, N);
        }
        cr_assert_eq(covered, N, "N=%d: %d rows covered", N, covered);
    }
}

/* LayerNorm with the bias after it is LayerNorm, then bias_forward, to the
 * bytes, in fp32 and rounded; and the residual add fused before it is
 * residual_forward, then layernorm_forward, to the bytes (sum and output,
 * mean and rstd). */
Test(kernels, layernorm_with_its_bias_and_the_residual_before_it_are_the_ops_they_stand_for) {
    enum { N = 37, C = 96 };
    size_t n = (size_t)N * C;
    float *a = alloc_floats(n), *b = alloc_floats(n), *w = alloc_floats(C), *bias = alloc_floats(C);
    float *fused = alloc_floats(n), *apart = alloc_floats(n), *sum_fused = alloc_floats(n), *sum_apart = alloc_floats(n);
    float *stats_fused = alloc_floats(2 * N), *stats_apart = alloc_floats(2 * N);
    fill_uniform(a, n, -2, 2, 61);
    fill_uniform(b, n, -1, 1, 62);
    fill_uniform(w, C, 0.5f, 1.5f, 63);
    fill_uniform(bias, C, -0.5f, 0.5f, 64);
    for (int p = 0; p < DTYPES; p++) {
        const char *what = p == DTYPE_BF16 ? "bf16" : "fp32";
        layernorm_forward(test_stream, fp32_buf(fused), stats_fused, stats_fused + N, fp32_numbers(a),
                          fp32_numbers(w), fp32_numbers(bias), N, C, (DType)p);
        layernorm_forward(test_stream, fp32_buf(apart), stats_apart, stats_apart + N, fp32_numbers(a),
                          fp32_numbers(w), fp32_numbers(NULL), N, C, DTYPE_FP32);
        bias_forward(test_stream, fp32_buf(apart), apart, fp32_numbers(bias), N, C, (DType)p);
        stream_synchronize(test_stream);
        cr_expect_eq(memcmp(fused, apart, n * sizeof(float)), 0, "%s: LayerNorm with its bias", what);
        residual_layernorm_forward(test_stream, fp32_buf(sum_fused), fp32_buf(fused), stats_fused, stats_fused + N,
                                   fp32_numbers(a), fp32_numbers(b), fp32_numbers(w), fp32_numbers(bias), N, C,
                                   (DType)p);
        residual_forward(test_stream, fp32_buf(sum_apart), fp32_numbers(a), fp32_numbers(b), n, (DType)p);
        layernorm_forward(test_stream, fp32_buf(apart), stats_apart, stats_apart + N, fp32_numbers(sum_apart),
                          fp32_numbers(w), fp32_numbers(bias), N, C, (DType)p);
        stream_synchronize(test_stream);
        cr_expect_eq(memcmp(sum_fused, sum_apart, n * sizeof(float)), 0, "%s: the residual add fused", what);
        cr_expect_eq(memcmp(fused, apart, n * sizeof(float)), 0, "%s: the LayerNorm after the add", what);
        cr_expect_eq(memcmp(stats_fused, stats_apart, 2 * N * sizeof(float)), 0, "%s: mean and rstd", what);
    }
    free(a); free(b); free(w); free(bias); free(fused); free(apart); free(sum_fused); free(sum_apart);
    free(stats_fused); free(stats_apart);
}

/* A bias's and LayerNorm's weight gradients are the parted sums' bits (which
 * the GPU makes too): over three parts and a ragged fourth, onto what the
 * gradient held; and LayerNorm's backward making the bias's too (the bias
 * after a LayerNorm) gives both the same bits, and its input's the same. */
Test(kernels, bias_and_layernorm_weight_gradients_sum_in_parts) {
    enum { N = 3 * PART_ROWS + 41, C = 70 };
    float *dout = alloc_floats(N * C), *inp = alloc_floats(N * C), *mean = alloc_floats(N), *rstd = alloc_floats(N);
    float *w = alloc_floats(C), *dinp = alloc_floats(N * C), *dbias = alloc_floats(C), *dw = alloc_floats(C);
    float *want_bias = alloc_floats(C), *want_w = alloc_floats(C), *terms = alloc_floats(N * C);
    float *scratch = alloc_floats(column_sums_scratch_floats(N, C));
    fill_wide(dout, N * C, 51);
    fill_uniform(inp, N * C, -2, 2, 52);
    fill_uniform(mean, N, -0.5f, 0.5f, 53);
    fill_uniform(rstd, N, 0.5f, 2, 54);
    fill_uniform(w, C, 0.5f, 1.5f, 55);
    fill_uniform(dbias, C, -1, 1, 56);
    fill_uniform(dw, C, -1, 1, 57);
    memcpy(want_bias, dbias, sizeof(float) * C);
    memcpy(want_w, dw, sizeof(float) * C);
    parted_sums(want_bias, dout, N, C);
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++)
            terms[i * C + c] = dout[i * C + c] * (inp[i * C + c] - mean[i]) * rstd[i];
    parted_sums(want_w, terms, N, C);
    float *start_bias = alloc_floats(C), *start_w = alloc_floats(C), *fused_dinp = alloc_floats(N * C);
    memcpy(start_bias, dbias, sizeof(float) * C);
    memcpy(start_w, dw, sizeof(float) * C);
    bias_backward(test_stream, fp32_buf(dbias), fp32_numbers(dout), N, C, scratch, DTYPE_FP32);
    layernorm_backward(test_stream, fp32_buf(dinp), fp32_buf(dw), fp32_buf(NULL), fp32_numbers(dout), fp32_numbers(inp),
                       fp32_numbers(w), mean, rstd, N, C, scratch, DTYPE_FP32);
    stream_synchronize(test_stream);
    cr_expect(memcmp(dbias, want_bias, sizeof(float) * C) == 0, "dbias: not the parted sums' bits");
    cr_expect(memcmp(dw, want_w, sizeof(float) * C) == 0, "dweight: not the parted sums' bits");
    memcpy(dbias, start_bias, sizeof(float) * C);
    memcpy(dw, start_w, sizeof(float) * C);
    layernorm_backward(test_stream, fp32_buf(fused_dinp), fp32_buf(dw), fp32_buf(dbias), fp32_numbers(dout),
                       fp32_numbers(inp), fp32_numbers(w), mean, rstd, N, C, scratch, DTYPE_FP32);
    stream_synchronize(test_stream);
    cr_expect(memcmp(dbias, want_bias, sizeof(float) * C) == 0, "LayerNorm's backward's dbias: not the parted sums' bits");
    cr_expect(memcmp(dw, want_w, sizeof(float) * C) == 0, "dweight beside dbias: not the parted sums' bits");
    cr_expect(memcmp(fused_dinp, dinp, sizeof(float) * N * C) == 0, "dinp beside dbias: other bits");
    free(dout); free(inp); free(mean); free(rstd); free(w); free(dinp); free(dbias); free(dw);
    free(want_bias); free(want_w); free(terms); free(scratch); free(start_bias); free(start_w); free(fused_dinp);
}

/* ---- gelu, dropout, residual ---- */

typedef struct { double *inp, *g, *out; size_t n; Dropout drop; int tanh_form; } PointwiseCtx;

static double gelu_objective(void *p) {
    PointwiseCtx *c = p;
    ref_gelu(c->out, c->inp, c->n, c->tanh_form);
    return dot(c->g, c->out, c->n);
}

static double dropout_objective(void *p) {
    PointwiseCtx *c = p;
    ref_dropout(c->out, c->inp, c->n, c->drop);
    return dot(c->g, c->out, c->n);
}

static void check_gelu(int tanh_form) {
    size_t n = 203;  /* not a multiple of any vector width */
    float *x = alloc_floats(n), *g = alloc_floats(n), *out = alloc_floats(n), *dx = alloc_floats(n), *base = alloc_floats(n);
    fill_uniform(x, n, -6, 6, 41);
    fill_uniform(g, n, -1, 1, 42);
    fill_uniform(base, n, -1, 1, 43);
    memcpy(dx, base, sizeof(float) * n);
    gelu_forward(test_stream, fp32_buf(out), fp32_numbers(x), n, tanh_form, DTYPE_FP32);
    gelu_backward(test_stream, fp32_buf(dx), fp32_buf(NULL), fp32_numbers(x), fp32_numbers(g), 1, (int)n, tanh_form,
                  DTYPE_FP32, NULL);
    stream_synchronize(test_stream);
    PointwiseCtx c = { to_double(x, n), to_double(g, n), malloc(sizeof(double) * n), n, { 0, 0, 0, 0, 0, NULL },
                       tanh_form };
    ref_gelu(c.out, c.inp, n, tanh_form);
    cr_expect_lt(rel_error(out, c.out, n), FWD_TOL, "gelu forward (tanh %d): %g", tanh_form, rel_error(out, c.out, n));
    double *num = malloc(sizeof(double) * n);
    numeric_grad(c.inp, n, gelu_objective, &c, num);
    cr_expect_lt(rel_error(dx, num, n), GRAD_TOL, "gelu backward (tanh %d): %g", tanh_form, rel_error(dx, num, n));
    /* in place (dinp = dout, as the model runs it): the same bits */
    gelu_backward(test_stream, fp32_buf(g), fp32_buf(NULL), fp32_numbers(x), fp32_numbers(g), 1, (int)n, tanh_form,
                  DTYPE_FP32, NULL);
    stream_synchronize(test_stream);
    cr_expect_eq(memcmp(g, dx, sizeof(float) * n), 0, "gelu backward in place");
    free(x); free(g); free(out); free(dx); free(base); free(c.inp); free(c.g); free(c.out); free(num);
}

Test(kernels, gelu_forward_backward) { check_gelu(0); }

/* ---- rounding under autocast: each op's output as round_to_bf16 after it ---- */

/* Every op with a rounding writes under DTYPE_BF16 the bytes of its
 * DTYPE_FP32 output rounded to bf16 (the model's old separate pass):
 * the embeddings, LayerNorm, a bias, the residual add, dropout both ways,
 * GELU in both forms, attention both ways; LayerNorm's backward adds as
 * bf16(dinp + bf16(its gradient)); the loss reads the logits rounded and
 * rounds dlogits. */
Test(kernels, every_op_rounds_its_output_as_round_to_bf16_after_it) {
    enum { B = 2, T = 33, C = 48, NH = 2, V = 301 };
    size_t BT = (size_t)B * T, n = BT * C;
    float *x = alloc_floats(n), *y = alloc_floats(n), *w = alloc_floats(C), *fp = alloc_floats(n), *bf = alloc_floats(n);
    float *mean = alloc_floats(BT), *rstd = alloc_floats(BT), *dw = alloc_floats(C), *wte = alloc_floats((size_t)V * C);
    int *tokens = malloc(BT * sizeof(int));
    fill_uniform(x, n, -2, 2, 51);
    fill_uniform(y, n, -1, 1, 52);
    fill_uniform(w, C, 0.5f, 1.5f, 53);
    fill_uniform(wte, (size_t)V * C, -1, 1, 54);
    for (size_t i = 0; i < BT; i++) tokens[i] = (int)(i * 37 % V);
    Dropout drop = { 0.25f, 9, 1, 4, 2, NULL };

    embedding_forward(test_stream, fp32_buf(fp), tokens, fp32_numbers(wte), fp32_numbers(y), B, T, C, DTYPE_FP32);
    embedding_forward(test_stream, fp32_buf(bf), tokens, fp32_numbers(wte), fp32_numbers(y), B, T, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "embedding_forward");
    layernorm_forward(test_stream, fp32_buf(fp), mean, rstd, fp32_numbers(x), fp32_numbers(w), fp32_numbers(NULL),
                      (int)BT, C, DTYPE_FP32);
    layernorm_forward(test_stream, fp32_buf(bf), mean, rstd, fp32_numbers(x), fp32_numbers(w), fp32_numbers(NULL),
                      (int)BT, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "layernorm_forward");
    memcpy(fp, x, n * sizeof(float));
    memcpy(bf, x, n * sizeof(float));
    bias_forward(test_stream, fp32_buf(fp), fp, fp32_numbers(w), (int)BT, C, DTYPE_FP32);
    bias_forward(test_stream, fp32_buf(bf), bf, fp32_numbers(w), (int)BT, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "bias_forward");
    residual_forward(test_stream, fp32_buf(fp), fp32_numbers(x), fp32_numbers(y), n, DTYPE_FP32);
    residual_forward(test_stream, fp32_buf(bf), fp32_numbers(x), fp32_numbers(y), n, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "residual_forward");
    dropout_forward(test_stream, fp32_buf(fp), fp32_numbers(x), n, drop, DTYPE_FP32);
    dropout_forward(test_stream, fp32_buf(bf), fp32_numbers(x), n, drop, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "dropout_forward");
    dropout_backward(test_stream, fp32_buf(fp), fp32_numbers(y), n, drop, DTYPE_FP32);
    dropout_backward(test_stream, fp32_buf(bf), fp32_numbers(y), n, drop, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "dropout_backward");
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
        gelu_forward(test_stream, fp32_buf(fp), fp32_numbers(x), n, tanh_form, DTYPE_FP32);
        gelu_forward(test_stream, fp32_buf(bf), fp32_numbers(x), n, tanh_form, DTYPE_BF16);
        stream_synchronize(test_stream);
        expect_rounded(bf, fp, n, tanh_form ? "gelu_forward, tanh form" : "gelu_forward");
    }

    /* LayerNorm's backward: its gradient alone (into zeros), then the bf16 add */
    float *dinp = alloc_floats(n), *scratch = alloc_floats(column_sums_scratch_floats((int)BT, C));
    layernorm_forward(test_stream, fp32_buf(fp), mean, rstd, fp32_numbers(x), fp32_numbers(w), fp32_numbers(NULL),
                      (int)BT, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    memset(fp, 0, n * sizeof(float));
    fill_uniform(dinp, n, -1, 1, 55);
    for (size_t i = 0; i < n; i++) dinp[i] = bf16_rounded(dinp[i]);
    memcpy(bf, dinp, n * sizeof(float));
    layernorm_backward(test_stream, fp32_buf(fp), fp32_buf(dw), fp32_buf(NULL), fp32_numbers(y), fp32_numbers(x),
                       fp32_numbers(w), mean, rstd, (int)BT, C, scratch, DTYPE_FP32);
    layernorm_backward(test_stream, fp32_buf(bf), fp32_buf(dw), fp32_buf(NULL), fp32_numbers(y), fp32_numbers(x),
                       fp32_numbers(w), mean, rstd, (int)BT, C, scratch, DTYPE_BF16);
    stream_synchronize(test_stream);
    for (size_t i = 0; i < n; i++) fp[i] = dinp[i] + bf16_rounded(fp[i]);
    expect_rounded(bf, fp, n, "layernorm_backward's add");

    /* the loss: its logits rounded as read, dlogits as written */
    size_t nl = BT * V;
    float *logits = alloc_floats(nl), *rounded = alloc_floats(nl), *dfp = alloc_floats(nl), *dbf = alloc_floats(nl);
    float *loss_fp = alloc_floats(BT), *loss_bf = alloc_floats(BT);
    fill_uniform(logits, nl, -4, 4, 56);
    for (size_t i = 0; i < nl; i++) rounded[i] = bf16_rounded(logits[i]);
    crossentropy_forward_backward(test_stream, loss_fp, fp32_buf(dfp), fp32_numbers(rounded), tokens, (int)BT, V,
                                  0.5f, DTYPE_FP32);
    crossentropy_forward_backward(test_stream, loss_bf, fp32_buf(dbf), fp32_numbers(logits), tokens, (int)BT, V, 0.5f,
                                  DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_expect_eq(memcmp(loss_fp, loss_bf, BT * sizeof(float)), 0, "crossentropy: the losses of the rounded logits");
    crossentropy_forward_backward(test_stream, loss_fp, fp32_buf(logits), fp32_numbers(logits), tokens, (int)BT, V,
                                  0.5f, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_expect_eq(memcmp(logits, dbf, nl * sizeof(float)), 0, "crossentropy in place in bf16: other dlogits");
    cr_expect_eq(memcmp(loss_fp, loss_bf, BT * sizeof(float)), 0, "crossentropy in place in bf16: other losses");
    expect_rounded(dbf, dfp, nl, "crossentropy's dlogits");

    /* attention: the output, then the backward from the rounded output */
    size_t nqkv = BT * 3 * C;
    float *qkv = alloc_floats(nqkv), *dq_fp = alloc_floats(nqkv), *dq_bf = alloc_floats(nqkv);
    AttentionBuffers sizes = attention_buffers(DEVICE_CPU, B, T, C, NH, DTYPE_BF16);
    float *saved = alloc_floats(sizes.saved), *att_scratch = alloc_floats(sizes.scratch + 1);
    fill_uniform(qkv, nqkv, -1.5f, 1.5f, 57);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = bf16_rounded(qkv[i]);
    attention_forward(test_stream, fp32_buf(fp), saved, att_scratch, fp32_numbers(qkv), B, T, C, NH,
                      drop, DTYPE_BF16, DTYPE_FP32);
    attention_forward(test_stream, fp32_buf(bf), saved, att_scratch, fp32_numbers(qkv), B, T, C, NH,
                      drop, DTYPE_BF16, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(bf, fp, n, "attention_forward");
    attention_backward(test_stream, fp32_buf(dq_fp), att_scratch, fp32_numbers(y), fp32_numbers(qkv), fp32_numbers(bf),
                       saved, B, T, C, NH, drop, DTYPE_BF16, DTYPE_FP32);
    attention_backward(test_stream, fp32_buf(dq_bf), att_scratch, fp32_numbers(y), fp32_numbers(qkv), fp32_numbers(bf),
                       saved, B, T, C, NH, drop, DTYPE_BF16, DTYPE_BF16);
    stream_synchronize(test_stream);
    expect_rounded(dq_bf, dq_fp, nqkv, "attention_backward");

    free(x); free(y); free(w); free(fp); free(bf); free(mean); free(rstd); free(dw); free(wte); free(tokens);
    free(dinp); free(scratch); free(logits); free(rounded); free(dfp); free(dbf); free(loss_fp); free(loss_bf);
    free(qkv); free(dq_fp); free(dq_bf); free(saved); free(att_scratch);
}

/* GELU's backward with fc's bias (the fused op) against the ops it stands
 * for, to the bytes: the gradient alone, round_to_bf16 under autocast, then
 * bias_backward over what was written, rounding alike; in both forms, both roundings, in
 * place, over rows that end in a short part (row_parts.h). Under bf16 the
 * rounding shows (the test could fail). */
Test(kernels, gelu_backward_with_the_bias_is_the_gradient_its_rounding_then_the_bias_sums) {
    int N = 2 * PART_ROWS + 37, OC = 70;
    size_t n = (size_t)N * OC;
    float *x = alloc_floats(n), *dy = alloc_floats(n), *fused = alloc_floats(n), *apart = alloc_floats(n);
    float *bias_start = alloc_floats(OC), *dbias_fused = alloc_floats(OC), *dbias_apart = alloc_floats(OC);
    fill_uniform(x, n, -4, 4, 44);
    fill_uniform(dy, n, -1, 1, 45);
    fill_uniform(bias_start, OC, -1, 1, 46);
    for (int tanh_form = 0; tanh_form < 2; tanh_form++)
        for (int p = 0; p < DTYPES; p++) {
            memcpy(fused, dy, n * sizeof(float));
            memcpy(dbias_fused, bias_start, OC * sizeof(float));
            memcpy(dbias_apart, bias_start, OC * sizeof(float));
            gelu_backward(test_stream, fp32_buf(fused), fp32_buf(dbias_fused), fp32_numbers(x), fp32_numbers(fused), N,
                          OC, tanh_form, (DType)p, NULL);
            gelu_backward(test_stream, fp32_buf(apart), fp32_buf(NULL), fp32_numbers(x), fp32_numbers(dy), N, OC,
                          tanh_form, DTYPE_FP32, NULL);
            stream_synchronize(test_stream);
            int rounded = 0;
            for (size_t i = 0; i < n; i++) rounded += p == DTYPE_BF16 && bf16_rounded(apart[i]) != apart[i];
            if (p == DTYPE_BF16) round_to_bf16(test_stream, apart, apart, n);
            bias_backward(test_stream, fp32_buf(dbias_apart), fp32_numbers(apart), N, OC, NULL, (DType)p);
            stream_synchronize(test_stream);
            cr_expect(p == DTYPE_FP32 || rounded > 0, "no gradient needed rounding: the test could not fail");
            cr_expect_eq(memcmp(fused, apart, n * sizeof(float)), 0, "tanh %d, %s: the gradient", tanh_form,
                         p ? "bf16" : "fp32");
            cr_expect_eq(memcmp(dbias_fused, dbias_apart, OC * sizeof(float)), 0, "tanh %d, %s: the bias's sums",
                         tanh_form, p ? "bf16" : "fp32");
        }
    free(x); free(dy); free(fused); free(apart); free(bias_start); free(dbias_fused); free(dbias_apart);
}

/* A column sum added into a gradient under bf16 (bias_backward's, and
 * LayerNorm's weight and bias sums) is the ops it stands for, to the bytes:
 * the fp32 sum into a zeroed buffer, round_to_bf16, then its add into an fp32
 * gradient or into one held in bf16 (residual_forward, the sum rounded).
 * Rows that end in a short part; the rounding shows (the test could fail). */
Test(kernels, a_column_sum_into_a_gradient_under_bf16_is_its_rounding_then_its_add) {
    int N = PART_ROWS + 41, C = 70;
    size_t n = (size_t)N * C;
    float *dy = alloc_floats(n), *x = alloc_floats(n), *lw = alloc_floats(C), *stats = alloc_floats(2 * (size_t)N);
    float *start = alloc_floats(3 * (size_t)C), *sums = alloc_floats(3 * (size_t)C), *dx = alloc_floats(n);
    float *fused = alloc_floats(3 * (size_t)C), *apart = alloc_floats(3 * (size_t)C);
    bf16 *held = malloc(3 * (size_t)C * sizeof(bf16)), *held_apart = malloc(3 * (size_t)C * sizeof(bf16));
    fill_uniform(dy, n, -1, 1, 61);
    fill_uniform(x, n, -2, 2, 62);
    fill_uniform(lw, C, 0.5f, 1.5f, 63);
    fill_uniform(stats, N, -0.5f, 0.5f, 64);
    fill_uniform(stats + N, N, 0.5f, 2, 65);
    fill_uniform(start, 3 * (size_t)C, -1, 1, 66);
    for (size_t i = 0; i < 3 * (size_t)C; i++) start[i] = bf16_rounded(start[i]);
    /* apart: the fp32 sums (a bias's, the LayerNorm weight's and bias's), rounded, then added */
    memset(sums, 0, 3 * (size_t)C * sizeof(float));
    bias_backward(test_stream, fp32_buf(sums), fp32_numbers(dy), N, C, NULL, DTYPE_FP32);
    layernorm_backward(test_stream, fp32_buf(dx), fp32_buf(sums + C), fp32_buf(sums + 2 * C), fp32_numbers(dy),
                       fp32_numbers(x), fp32_numbers(lw), stats, stats + N, N, C, NULL, DTYPE_FP32);
    stream_synchronize(test_stream);
    int rounded = 0;
    for (size_t i = 0; i < 3 * (size_t)C; i++) rounded += bf16_rounded(sums[i]) != sums[i];
    cr_assert_gt(rounded, 0, "no sum needed rounding: the test could not fail");
    round_to_bf16(test_stream, sums, sums, 3 * (size_t)C);
    memcpy(apart, start, 3 * (size_t)C * sizeof(float));
    residual_forward(test_stream, fp32_buf(apart), fp32_numbers(apart), fp32_numbers(sums), 3 * (size_t)C,
                     DTYPE_FP32);
    for (size_t i = 0; i < 3 * (size_t)C; i++) held_apart[i] = bf16_from_float(start[i]);
    residual_forward(test_stream, bf16_buf(held_apart), bf16_numbers(held_apart), fp32_numbers(sums), 3 * (size_t)C,
                     DTYPE_BF16);
    /* fused: each op adds its rounded sums into the gradient as it is held */
    for (int k = 0; k < 2; k++) {
        Buf grad[3];
        for (int t = 0; t < 3; t++)
            grad[t] = k ? bf16_buf(held + (size_t)t * C) : fp32_buf(fused + (size_t)t * C);
        memcpy(fused, start, 3 * (size_t)C * sizeof(float));
        for (size_t i = 0; i < 3 * (size_t)C; i++) held[i] = bf16_from_float(start[i]);
        bias_backward(test_stream, grad[0], fp32_numbers(dy), N, C, NULL, DTYPE_BF16);
        layernorm_backward(test_stream, fp32_buf(dx), grad[1], grad[2], fp32_numbers(dy), fp32_numbers(x),
                           fp32_numbers(lw), stats, stats + N, N, C, NULL, DTYPE_BF16);
        stream_synchronize(test_stream);
        if (k) cr_expect_eq(memcmp(held, held_apart, 3 * (size_t)C * sizeof(bf16)), 0, "into bf16-held gradients");
        else cr_expect_eq(memcmp(fused, apart, 3 * (size_t)C * sizeof(float)), 0, "into fp32 gradients");
    }
    free(dy); free(x); free(lw); free(stats); free(start); free(sums); free(dx); free(fused); free(apart);
    free(held); free(held_apart);
}

/* x's n numbers held in bf16: stored into held, and their values into values
 * (which may be x itself), so that an op given either gives the same bytes. */
static void hold_in_bf16(const float *x, size_t n, bf16 *held, float *values) {
    for (size_t i = 0; i < n; i++) {
        held[i] = bf16_from_float(x[i]);
        values[i] = float_from_bf16(held[i]);
    }
}

/* n numbers stored in bf16 equal, byte for byte, fp32 ones stored. */
static int same_as_stored(const bf16 *got, const float *fp32, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (got[i] != bf16_from_float(fp32[i])) return 0;
    return 1;
}

/* The LayerNorms and the residual add as the forward writes what a bf16
 * block keeps: a LayerNorm's output, and the fused add's sum and
 * LayerNorm, written in bf16 (each, or both, in the room at once), are the
 * bytes of the same op's fp32 outputs stored, its statistics the same, and
 * so a Linear's bias after its product, dropout's (in place) and the
 * embeddings'; from a residual stream held in bf16 the residual add,
 * LayerNorm and the fused add give the bytes of its fp32 values. Rows enough (512 KB
 * a tensor) that a room grown under a sum it holds would be unmapped
 * (glibc maps such a room apart; an ASan run catches it at any size). */
Test(kernels, outputs_held_in_bf16_are_the_bytes_of_their_fp32_outputs_stored) {
    enum { N = 2048, C = 64 };
    size_t n = (size_t)N * C;
    float *a = alloc_floats(n), *b = alloc_floats(n), *w = alloc_floats(C), *bias = alloc_floats(C);
    float *sum = alloc_floats(n), *out = alloc_floats(n), *stats = alloc_floats(2 * N), *stats16 = alloc_floats(2 * N);
    bf16 *sum16 = malloc(n * sizeof(bf16)), *out16 = malloc(n * sizeof(bf16)), *a16 = malloc(n * sizeof(bf16));
    fill_uniform(a, n, -2, 2, 71);
    fill_uniform(b, n, -1, 1, 72);
    fill_uniform(w, C, 0.5f, 1.5f, 73);
    fill_uniform(bias, C, -0.5f, 0.5f, 74);
    /* a residual stream held in bf16 (a's numbers rounded, ar in fp32): first, a LayerNorm from it into bf16,
     * on a room not yet grown (it grows once, for both, before either is placed) */
    float *ar = alloc_floats(n);
    bf16 *ar16 = malloc(n * sizeof(bf16));
    hold_in_bf16(a, n, ar16, ar);
    layernorm_forward(test_stream, bf16_buf(out16), stats16, stats16 + N, bf16_numbers(ar16), fp32_numbers(w),
                      fp32_numbers(bias), N, C, DTYPE_BF16);
    layernorm_forward(test_stream, fp32_buf(out), stats, stats + N, fp32_numbers(ar), fp32_numbers(w),
                      fp32_numbers(bias), N, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(out16, out, n), "layernorm_forward from bf16 into bf16");
    cr_assert(memcmp(stats, stats16, 2 * N * sizeof(float)) == 0, "layernorm_forward's statistics from bf16");
    /* the fused add and LayerNorm from it, all three in bf16: 3n of room, grown past 2n before any is placed */
    residual_layernorm_forward(test_stream, bf16_buf(sum16), bf16_buf(out16), stats16, stats16 + N,
                               bf16_numbers(ar16), fp32_numbers(b), fp32_numbers(w), fp32_numbers(bias), N, C,
                               DTYPE_BF16);
    residual_layernorm_forward(test_stream, fp32_buf(sum), fp32_buf(out), stats, stats + N, fp32_numbers(ar),
                               fp32_numbers(b), fp32_numbers(w), fp32_numbers(bias), N, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(sum16, sum, n) && same_as_stored(out16, out, n), "residual_layernorm_forward from bf16");
    cr_assert(memcmp(stats, stats16, 2 * N * sizeof(float)) == 0, "residual_layernorm_forward's statistics from bf16");
    /* the residual add from bf16 into bf16, and dropout from bf16 in place */
    residual_forward(test_stream, bf16_buf(sum16), bf16_numbers(ar16), fp32_numbers(b), n, DTYPE_BF16);
    residual_forward(test_stream, fp32_buf(sum), fp32_numbers(ar), fp32_numbers(b), n, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(sum16, sum, n), "residual_forward from bf16 into bf16");
    Dropout mask = { 0.3f, 7, 1, 5, 0, NULL };
    memcpy(sum16, ar16, n * sizeof(bf16));
    dropout_forward(test_stream, bf16_buf(sum16), bf16_numbers(sum16), n, mask, DTYPE_BF16);
    dropout_forward(test_stream, fp32_buf(sum), fp32_numbers(ar), n, mask, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(sum16, sum, n), "dropout_forward in bf16, in place");
    /* the embeddings into bf16: wte a's first 50 rows, wpe b's N */
    int *tokens = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tokens[i] = (i * 7) % 50;
    embedding_forward(test_stream, bf16_buf(out16), tokens, fp32_numbers(a), fp32_numbers(b), 1, N, C, DTYPE_BF16);
    embedding_forward(test_stream, fp32_buf(out), tokens, fp32_numbers(a), fp32_numbers(b), 1, N, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(out16, out, n), "embedding_forward into bf16");
    free(tokens); free(ar); free(ar16);
    layernorm_forward(test_stream, fp32_buf(out), stats, stats + N, fp32_numbers(a), fp32_numbers(w),
                      fp32_numbers(bias), N, C, DTYPE_BF16);
    layernorm_forward(test_stream, bf16_buf(out16), stats16, stats16 + N, fp32_numbers(a), fp32_numbers(w),
                      fp32_numbers(bias), N, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(out16, out, n), "layernorm_forward into bf16");
    cr_assert(memcmp(stats, stats16, 2 * N * sizeof(float)) == 0, "layernorm_forward's statistics");
    residual_layernorm_forward(test_stream, fp32_buf(sum), fp32_buf(out), stats, stats + N, fp32_numbers(a),
                               fp32_numbers(b), fp32_numbers(w), fp32_numbers(bias), N, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    for (int held = 1; held < 4; held++) {  /* bit 0: the sum in bf16, bit 1: the LayerNorm's output */
        memset(sum16, 0xFF, n * sizeof(bf16));
        memset(out16, 0xFF, n * sizeof(bf16));
        float *sum32 = alloc_floats(n), *out32 = alloc_floats(n);
        Buf sum_buf = held & 1 ? bf16_buf(sum16) : fp32_buf(sum32);
        Buf out_buf = held & 2 ? bf16_buf(out16) : fp32_buf(out32);
        residual_layernorm_forward(test_stream, sum_buf, out_buf, stats16, stats16 + N, fp32_numbers(a),
                                   fp32_numbers(b), fp32_numbers(w), fp32_numbers(bias), N, C, DTYPE_BF16);
        stream_synchronize(test_stream);
        cr_assert(held & 1 ? same_as_stored(sum16, sum, n) : memcmp(sum32, sum, n * sizeof(float)) == 0,
                  "residual_layernorm_forward's sum, held %d", held);
        cr_assert(held & 2 ? same_as_stored(out16, out, n) : memcmp(out32, out, n * sizeof(float)) == 0,
                  "residual_layernorm_forward's output, held %d", held);
        cr_assert(memcmp(stats, stats16, 2 * N * sizeof(float)) == 0, "its statistics, held %d", held);
        free(sum32);
        free(out32);
    }
    /* a sum held in bf16 under fp32's rounding is normalised as it is held, rounded (as the GPU reads it back) */
    float *normed = alloc_floats(n);
    residual_forward(test_stream, fp32_buf(sum), fp32_numbers(a), fp32_numbers(b), n, DTYPE_BF16);
    layernorm_forward(test_stream, fp32_buf(out), stats, stats + N, fp32_numbers(sum), fp32_numbers(w),
                      fp32_numbers(bias), N, C, DTYPE_FP32);
    residual_layernorm_forward(test_stream, bf16_buf(sum16), fp32_buf(normed), stats16, stats16 + N, fp32_numbers(a),
                               fp32_numbers(b), fp32_numbers(w), fp32_numbers(bias), N, C, DTYPE_FP32);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(sum16, sum, n), "residual_layernorm_forward's bf16 sum under fp32's rounding");
    cr_assert(memcmp(normed, out, n * sizeof(float)) == 0, "the LayerNorm of a bf16 sum under fp32's rounding");
    free(normed);
    /* a Linear's bias after its product (or none): in place in fp32, or out of place into bf16 */
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        memcpy(out, a, n * sizeof(float));
        bias_forward(test_stream, fp32_buf(out), out, fp32_numbers(with_bias ? bias : NULL), N, C, DTYPE_BF16);
        bias_forward(test_stream, bf16_buf(out16), a, fp32_numbers(with_bias ? bias : NULL), N, C, DTYPE_BF16);
        stream_synchronize(test_stream);
        size_t rounded = 0;
        for (size_t i = 0; i < n; i++) rounded += out[i] != a[i];
        cr_assert(rounded > 0, "bias_forward changed nothing: the test could not fail");
        cr_assert(same_as_stored(out16, out, n), "bias_forward into bf16, bias %d", with_bias);
    }
    hold_in_bf16(a, n, a16, a);
    residual_forward(test_stream, fp32_buf(sum), fp32_numbers(a), fp32_numbers(b), n, DTYPE_BF16);
    residual_forward(test_stream, fp32_buf(out), bf16_numbers(a16), fp32_numbers(b), n, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(sum, out, n * sizeof(float)) == 0, "residual_forward from bf16");
    /* attention from q, k, v held in bf16 into a bf16 output, and its backward from both: 4n of room (2 MiB),
     * grown past the 2n above at once, before either is placed (a room grown under q, k, v would be unmapped);
     * then the backward from a bf16 output gradient into a bf16 dqkv too (the model's attention's gradients):
     * 8n, grown at once */
    enum { NH = 2 };
    Dropout drop = { 0.1f, 3, 0, 2, 1, NULL };
    float *qkv = alloc_floats(3 * n), *saved = alloc_floats(attention_buffers(DEVICE_CPU, 1, N, C, NH, DTYPE_BF16).saved);
    float *dqkv = alloc_floats(3 * n), *dqkv16 = alloc_floats(3 * n);
    bf16 *qkv16 = malloc(3 * n * sizeof(bf16)), *b16 = malloc(n * sizeof(bf16)), *dqkv_held = malloc(3 * n * sizeof(bf16));
    hold_in_bf16(b, n, b16, b);
    fill_uniform(qkv, 3 * n, -2, 2, 75);
    hold_in_bf16(qkv, 3 * n, qkv16, qkv);
    attention_forward(test_stream, fp32_buf(out), saved, NULL, fp32_numbers(qkv), 1, N, C, NH, drop, DTYPE_BF16,
                      DTYPE_BF16);
    attention_forward(test_stream, bf16_buf(out16), saved, NULL, bf16_numbers(qkv16), 1, N, C, NH, drop, DTYPE_BF16,
                      DTYPE_BF16);
    attention_backward(test_stream, fp32_buf(dqkv), NULL, fp32_numbers(b), fp32_numbers(qkv), fp32_numbers(out), saved,
                       1, N, C, NH, drop, DTYPE_BF16, DTYPE_BF16);
    attention_backward(test_stream, fp32_buf(dqkv16), NULL, fp32_numbers(b), bf16_numbers(qkv16), bf16_numbers(out16),
                       saved, 1, N, C, NH, drop, DTYPE_BF16, DTYPE_BF16);
    attention_backward(test_stream, bf16_buf(dqkv_held), NULL, bf16_numbers(b16), bf16_numbers(qkv16),
                       bf16_numbers(out16), saved, 1, N, C, NH, drop, DTYPE_BF16, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(out16, out, n), "attention_forward from bf16 into bf16");
    cr_assert(memcmp(dqkv, dqkv16, 3 * n * sizeof(float)) == 0, "attention_backward from bf16");
    cr_assert(same_as_stored(dqkv_held, dqkv, 3 * n), "attention_backward from a bf16 gradient into a bf16 dqkv");
    free(qkv); free(saved); free(dqkv); free(dqkv16); free(qkv16); free(b16); free(dqkv_held);
    free(a); free(b); free(w); free(bias); free(sum); free(out); free(stats); free(stats16);
    free(sum16); free(out16); free(a16);
}

/* The ops that read an input held in bf16 (what a model keeps of a block,
 * read in place by its backward) give, byte for byte, what they give the
 * same values held in fp32: each input widened as it is read; and an op
 * that writes bf16 (where a model keeps it) the bytes of its fp32 output
 * stored. The room the CPU widens into is used twice over, smaller then
 * larger (it grows). */
Test(kernels, inputs_held_in_bf16_give_the_bytes_of_their_fp32_values) {
    enum { N = 37, C = 24, OC = 72 };  /* OC = 3C: x holds attention's qkv too */
    size_t nx = (size_t)N * OC;  /* the widest input: GELU's, and the product's of width OC */
    float *x = alloc_floats(nx), *dy = alloc_floats(nx), *w = alloc_floats((size_t)OC * C), *lw = alloc_floats(C);
    bf16 *x16 = malloc(nx * sizeof(bf16)), *out16 = malloc(nx * sizeof(bf16));
    fill_uniform(x, nx, -2, 2, 61);
    fill_uniform(dy, nx, -1, 1, 62);
    fill_uniform(w, (size_t)OC * C, -1, 1, 63);
    fill_uniform(lw, C, 0.5f, 1.5f, 64);
    hold_in_bf16(x, nx, x16, x);
    float *got[2], *dw[2], *db[2], *mean = alloc_floats(N), *rstd = alloc_floats(N);
    float *scratch = alloc_floats(column_sums_scratch_floats(N, 2 * OC));
    for (int k = 0; k < 2; k++) {
        got[k] = alloc_floats(nx);
        dw[k] = alloc_floats((size_t)OC * C);
        db[k] = alloc_floats(OC);
    }
    ConstBuf held[2] = { fp32_numbers(x), bf16_numbers(x16) };
    layernorm_forward(test_stream, fp32_buf(got[0]), mean, rstd, fp32_numbers(x), fp32_numbers(lw),
                      fp32_numbers(NULL), N, C, DTYPE_FP32);
    /* the statistics */
    stream_synchronize(test_stream);
    for (int k = 0; k < 2; k++) {
        memset(got[k], 0, nx * sizeof(float));
        layernorm_backward(test_stream, fp32_buf(got[k]), fp32_buf(dw[k]), fp32_buf(db[k]), fp32_numbers(dy), held[k],
                           fp32_numbers(lw), mean, rstd, N, C, scratch, DTYPE_BF16);
    }
    stream_synchronize(test_stream);
    cr_assert(memcmp(got[0], got[1], (size_t)N * C * sizeof(float)) == 0, "layernorm_backward's dinp");
    cr_assert(memcmp(dw[0], dw[1], C * sizeof(float)) == 0 && memcmp(db[0], db[1], C * sizeof(float)) == 0,
              "layernorm_backward's weight and bias gradients");
    for (int tanh_form = 0; tanh_form < 2; tanh_form++) {
        for (int k = 0; k < 2; k++) gelu_forward(test_stream, fp32_buf(got[k]), held[k], nx, tanh_form, DTYPE_BF16);
        stream_synchronize(test_stream);
        cr_assert(memcmp(got[0], got[1], nx * sizeof(float)) == 0, "gelu_forward, tanh form %d", tanh_form);
        /* written in bf16 from either: the bytes of the fp32 output stored */
        for (int k = 0; k < 2; k++) {
            memset(out16, 0xFF, nx * sizeof(bf16));
            gelu_forward(test_stream, bf16_buf(out16), held[k], nx, tanh_form, DTYPE_BF16);
            stream_synchronize(test_stream);
            cr_assert(same_as_stored(out16, got[0], nx), "gelu_forward into bf16, from %s, tanh form %d",
                      k ? "bf16" : "fp32", tanh_form);
        }
        for (int k = 0; k < 2; k++) {
            memset(db[k], 0, OC * sizeof(float));
            gelu_backward(test_stream, fp32_buf(got[k]), fp32_buf(db[k]), held[k], fp32_numbers(dy), N, OC, tanh_form,
                          DTYPE_BF16, scratch);
        }
        stream_synchronize(test_stream);
        cr_assert(memcmp(got[0], got[1], nx * sizeof(float)) == 0 && memcmp(db[0], db[1], OC * sizeof(float)) == 0,
                  "gelu_backward and its bias, tanh form %d", tanh_form);
    }
    /* GELU from bf16 into bf16, large enough (512 KiB of room) that a room
     * grown under the widened input would be unmapped, not left readable */
    size_t nbig = (size_t)1 << 17;
    bf16 *big16 = malloc(nbig * sizeof(bf16)), *big_out16 = malloc(nbig * sizeof(bf16));
    float *big = alloc_floats(nbig);
    for (size_t i = 0; i < nbig; i++) big16[i] = x16[i % nx];
    load_bf16(test_stream, big, big16, nbig);
    gelu_forward(test_stream, fp32_buf(big), fp32_numbers(big), nbig, 0, DTYPE_BF16);
    gelu_forward(test_stream, bf16_buf(big_out16), bf16_numbers(big16), nbig, 0, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(big_out16, big, nbig), "gelu_forward from bf16 into bf16, 2^17 numbers");
    free(big16);
    free(big_out16);
    free(big);
    /* a Linear's bias gradient from its output's gradient held in bf16 (qkv's: attention's input's gradient) */
    for (int k = 0; k < 2; k++) {
        memset(db[k], 0, OC * sizeof(float));
        bias_backward(test_stream, fp32_buf(db[k]), held[k], N, OC, scratch, DTYPE_FP32);
    }
    stream_synchronize(test_stream);
    cr_assert(memcmp(db[0], db[1], OC * sizeof(float)) == 0, "bias_backward");
    /* the product's input, [N, C] of x, and dout [N, OC] */
    for (int k = 0; k < 2; k++) matmul_forward_bf16(test_stream, fp32_buf(got[k]), held[k], fp32_numbers(w),
                                                    fp32_numbers(NULL), N, C, OC);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got[0], got[1], (size_t)N * OC * sizeof(float)) == 0, "matmul_forward_bf16");
    for (int k = 0; k < 2; k++) {
        memset(dw[k], 0, (size_t)OC * C * sizeof(float));
        matmul_backward_bf16(test_stream, fp32_buf(got[k]), fp32_buf(dw[k]), fp32_numbers(dy), held[k], fp32_numbers(w),
                             N, C, OC);
    }
    stream_synchronize(test_stream);
    cr_assert(memcmp(got[0], got[1], (size_t)N * C * sizeof(float)) == 0, "matmul_backward_bf16's dinp");
    cr_assert(memcmp(dw[0], dw[1], (size_t)OC * C * sizeof(float)) == 0, "matmul_backward_bf16's dweight");
    /* the weight gradient written into bf16 (a Linear's, as the model makes it): not added into what was there,
     * the fp32 sums from zero (dw[0]) stored, each rounded once */
    bf16 *dw16 = malloc((size_t)OC * C * sizeof(bf16));
    for (size_t i = 0; i < (size_t)OC * C; i++) dw16[i] = bf16_from_float(1.0f);
    matmul_backward_bf16(test_stream, fp32_buf(got[1]), bf16_buf(dw16), fp32_numbers(dy), held[1], fp32_numbers(w), N,
                         C, OC);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(dw16, dw[0], (size_t)OC * C), "matmul_backward_bf16's dweight into bf16");
    free(dw16);
    /* attention's backward, its q, k, v and output (two inputs at once), with dropout: rows of x's numbers */
    enum { B = 1, NH = 2 };
    int T = N;
    size_t n = (size_t)B * T * C;
    AttentionBuffers sizes = attention_buffers(DEVICE_CPU, B, T, C, NH, DTYPE_BF16);
    float *saved = alloc_floats(sizes.saved), *att_out = alloc_floats(n);
    Dropout drop = { 0.2f, 9, 1, 4, 2, NULL };
    attention_forward(test_stream, fp32_buf(att_out), saved, NULL, fp32_numbers(x), B, T, C, NH, drop, DTYPE_BF16,
                      DTYPE_BF16);
    /* its forward from q, k, v held in bf16 into a bf16 output: the fp32 output's bytes stored, which the
     * backward then reads */
    memset(out16, 0xFF, n * sizeof(bf16));
    attention_forward(test_stream, bf16_buf(out16), saved, NULL, bf16_numbers(x16), B, T, C, NH, drop, DTYPE_BF16,
                      DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(out16, att_out, n), "attention_forward from bf16 into bf16");
    ConstBuf att_held[2][2] = { { fp32_numbers(x), fp32_numbers(att_out) },
                                               { bf16_numbers(x16), bf16_numbers(out16) } };
    for (int k = 0; k < 2; k++)
        attention_backward(test_stream, fp32_buf(got[k]), NULL, fp32_numbers(dy), att_held[k][0], att_held[k][1], saved,
                           B, T, C, NH, drop, DTYPE_BF16, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got[0], got[1], 3 * n * sizeof(float)) == 0, "attention_backward's dqkv");
    free(saved);
    free(att_out);
    for (int k = 0; k < 2; k++) {
        free(got[k]);
        free(dw[k]);
        free(db[k]);
    }
    free(x);
    free(dy);
    free(w);
    free(lw);
    free(x16);
    free(out16);
    free(mean);
    free(rstd);
    free(scratch);
}

/* The head as autocast runs it in bf16: its product writes the logits in
 * bf16, the loss reads them there and writes dlogits over them (in place),
 * and the product's backward reads dlogits there. Each is, byte for byte,
 * the same op's fp32 output stored, or from the same values held in fp32:
 * the forward into bf16; the loss from bf16 logits in place, apart, and
 * from fp32 logits into bf16; the backward from a bf16 dout and a bf16
 * input at once, and each of its products asked for alone (as autocast's
 * head makes them apart: each cut in two halves of its output's rows). A
 * vocabulary of 4099 (ragged) and rows enough that the room (over 1 MB) is
 * unmapped when it moves. */
Test(kernels, the_heads_logits_and_dlogits_held_in_bf16_are_the_bytes_of_fp32s_stored) {
    enum { N = 64, C = 32, V = 4099 };
    size_t nl = (size_t)N * V, nx = (size_t)N * C;
    float *x = alloc_floats(nx), *w = alloc_floats((size_t)V * C), *logits = alloc_floats(nl);
    float *dlogits = alloc_floats(nl), *losses = alloc_floats(N), *losses16 = alloc_floats(N);
    bf16 *x16 = malloc(nx * sizeof(bf16)), *logits16 = malloc(nl * sizeof(bf16)), *d16 = malloc(nl * sizeof(bf16));
    int *targets = malloc(N * sizeof(int));
    fill_uniform(x, nx, -2, 2, 81);
    fill_uniform(w, (size_t)V * C, -1, 1, 82);
    hold_in_bf16(x, nx, x16, x);
    for (size_t i = 0; i < (size_t)V * C; i++) w[i] = bf16_rounded(w[i]);
    for (int i = 0; i < N; i++) targets[i] = (i * 131) % V;
    /* the forward into fp32 and into bf16, from a bf16 input (both in the room: grown once, before either) */
    matmul_forward_bf16(test_stream, fp32_buf(logits), fp32_numbers(x), fp32_numbers(w), fp32_numbers(NULL), N, C, V);
    matmul_forward_bf16(test_stream, bf16_buf(logits16), bf16_numbers(x16), fp32_numbers(w), fp32_numbers(NULL), N, C,
                        V);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(logits16, logits, nl), "matmul_forward_bf16 into bf16");
    /* the loss: fp32's over the logits (read rounded), then bf16's in place over logits16 */
    crossentropy_forward_backward(test_stream, losses, fp32_buf(dlogits), fp32_numbers(logits), targets, N, V, 0.25f,
                                  DTYPE_BF16);
    crossentropy_forward_backward(test_stream, losses16, bf16_buf(d16), fp32_numbers(logits), targets, N, V, 0.25f,
                                  DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(d16, dlogits, nl), "crossentropy from fp32 logits into bf16 dlogits");
    cr_assert(memcmp(losses, losses16, N * sizeof(float)) == 0, "its losses");
    crossentropy_forward_backward(test_stream, losses16, bf16_buf(d16), bf16_numbers(logits16), targets, N, V, 0.25f,
                                  DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(d16, dlogits, nl), "crossentropy from bf16 logits into bf16 dlogits, apart");
    cr_assert(memcmp(losses, losses16, N * sizeof(float)) == 0, "its losses");
    crossentropy_forward_backward(test_stream, losses16, bf16_buf(logits16), bf16_numbers(logits16), targets, N, V,
                                  0.25f, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(logits16, dlogits, nl), "crossentropy in place in bf16");
    cr_assert(memcmp(losses, losses16, N * sizeof(float)) == 0, "its losses in place");
    /* the backward from dlogits and the input both in bf16 (in the room at once) and from their fp32 values */
    for (size_t i = 0; i < nl; i++) dlogits[i] = float_from_bf16(logits16[i]);
    float *dx = alloc_floats(nx), *dx16 = alloc_floats(nx), *dw = alloc_floats((size_t)V * C);
    float *dw16 = alloc_floats((size_t)V * C);
    matmul_backward_bf16(test_stream, fp32_buf(dx), fp32_buf(dw), fp32_numbers(dlogits), fp32_numbers(x),
                         fp32_numbers(w), N, C, V);
    matmul_backward_bf16(test_stream, fp32_buf(dx16), fp32_buf(dw16), bf16_numbers(logits16), bf16_numbers(x16),
                         fp32_numbers(w), N, C, V);
    stream_synchronize(test_stream);
    cr_assert(memcmp(dx, dx16, nx * sizeof(float)) == 0, "matmul_backward_bf16's dinp from bf16 dout");
    cr_assert(memcmp(dw, dw16, (size_t)V * C * sizeof(float)) == 0, "matmul_backward_bf16's dweight from bf16 dout");
    float *dx_alone = alloc_floats(nx), *dw_alone = alloc_floats((size_t)V * C);
    matmul_backward_bf16(test_stream, fp32_buf(dx_alone), fp32_buf(NULL), bf16_numbers(logits16), bf16_numbers(x16),
                         fp32_numbers(w), N, C, V);
    matmul_backward_bf16(test_stream, fp32_buf(NULL), fp32_buf(dw_alone), bf16_numbers(logits16), bf16_numbers(x16),
                         fp32_numbers(w), N, C, V);
    stream_synchronize(test_stream);
    cr_expect(memcmp(dx, dx_alone, nx * sizeof(float)) == 0, "matmul_backward_bf16's dinp asked for alone");
    cr_expect(memcmp(dw, dw_alone, (size_t)V * C * sizeof(float)) == 0, "matmul_backward_bf16's dweight alone");
    free(x); free(w); free(logits); free(dlogits); free(losses); free(losses16); free(dx_alone); free(dw_alone);
    free(x16); free(logits16); free(d16); free(targets); free(dx); free(dx16); free(dw); free(dw16);
}

/* The weights as a model computes with them under autocast, held in bf16
 * (its compute copy): every op that reads a weight gives, byte for byte,
 * what it gives the same values held in fp32, each weight widened as it is
 * read. First on an empty room, each larger than the last, at sizes (512 KB
 * a tensor) where a room that grew under what was widened into it would be
 * unmapped: LayerNorm's backward (its input and weight in the room at
 * once), the product's forward (its input and weight), its backward (its
 * input, output gradient and weight); then LayerNorm's forward with its
 * bias, the fused add, a Linear's bias and the embeddings. */
Test(kernels, weights_held_in_bf16_give_the_bytes_of_their_fp32_values) {
    enum { N = 2048, C = 64, OC = 128, V = 50 };
    size_t n = (size_t)N * C, nw = (size_t)OC * C;
    float *x = alloc_floats(n), *dy = alloc_floats((size_t)N * OC), *w = alloc_floats(nw), *lw = alloc_floats(2 * C);
    float *b = alloc_floats(n), *got[2], *got2[2], *dw[2], *db[2], *stats = alloc_floats(2 * N);
    bf16 *x16 = malloc(n * sizeof(bf16)), *w16 = malloc(nw * sizeof(bf16)), *lw16 = malloc(2 * C * sizeof(bf16));
    bf16 *dy16 = malloc((size_t)N * OC * sizeof(bf16));
    fill_uniform(x, n, -2, 2, 131);
    fill_uniform(b, n, -1, 1, 132);
    fill_uniform(dy, (size_t)N * OC, -1, 1, 133);
    fill_uniform(w, nw, -1, 1, 134);
    fill_uniform(lw, 2 * C, 0.5f, 1.5f, 135);
    hold_in_bf16(x, n, x16, x);
    hold_in_bf16(w, nw, w16, w);
    hold_in_bf16(dy, (size_t)N * OC, dy16, dy);
    hold_in_bf16(lw, 2 * C, lw16, lw);
    for (int k = 0; k < 2; k++) {
        got[k] = alloc_floats((size_t)N * OC);
        got2[k] = alloc_floats(n);
        dw[k] = alloc_floats(nw);
        db[k] = alloc_floats(C);
    }
    fill_uniform(stats, N, -0.5f, 0.5f, 136);  /* a mean and a 1/std a row */
    fill_uniform(stats + N, N, 0.5f, 2.0f, 137);
    /* k = 1 first: the room empty, grown once for the input and the weight before either is widened */
    ConstBuf inp[2] = { fp32_numbers(x), bf16_numbers(x16) }, weight[2] = { fp32_numbers(lw), bf16_numbers(lw16) };
    ConstBuf bias[2] = { fp32_numbers(lw + C), bf16_numbers(lw16 + C) };
    ConstBuf product_weight[2] = { fp32_numbers(w), bf16_numbers(w16) };
    for (int k = 1; k >= 0; k--)
        layernorm_backward(test_stream, fp32_buf(got2[k]), fp32_buf(dw[k]), fp32_buf(db[k]), fp32_numbers(dy), inp[k],
                           weight[k], stats, stats + N, N, C, NULL, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got2[0], got2[1], n * sizeof(float)) == 0, "layernorm_backward's dinp from a bf16 weight");
    cr_assert(memcmp(dw[0], dw[1], C * sizeof(float)) == 0 && memcmp(db[0], db[1], C * sizeof(float)) == 0,
              "layernorm_backward's weight and bias gradients from a bf16 weight");
    for (int k = 1; k >= 0; k--)
        matmul_forward_bf16(test_stream, fp32_buf(got[k]), inp[k], product_weight[k], fp32_numbers(NULL), N, C, OC);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got[0], got[1], (size_t)N * OC * sizeof(float)) == 0, "matmul_forward_bf16 from a bf16 weight");
    /* with a bias (OC = 2C: lw's numbers): into bf16 from a bf16 bias, the bytes of the fp32 product and
     * bias_forward's rounding stored; into fp32, the fp32 sums */
    float *want = alloc_floats((size_t)N * OC);
    bf16 *got16 = malloc((size_t)N * OC * sizeof(bf16));
    bias_forward(test_stream, fp32_buf(want), got[0], fp32_numbers(lw), N, OC, DTYPE_BF16);
    matmul_forward_bf16(test_stream, bf16_buf(got16), inp[1], product_weight[1], bf16_numbers(lw16), N, C, OC);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(got16, want, (size_t)N * OC), "matmul_forward_bf16 with its bias into bf16");
    bias_forward(test_stream, fp32_buf(want), got[0], fp32_numbers(lw), N, OC, DTYPE_FP32);
    matmul_forward_bf16(test_stream, fp32_buf(got[1]), inp[0], product_weight[0], fp32_numbers(lw), N, C, OC);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got[1], want, (size_t)N * OC * sizeof(float)) == 0, "matmul_forward_bf16 with its bias");
    free(want);
    free(got16);
    ConstBuf dout[2] = { fp32_numbers(dy), bf16_numbers(dy16) };
    for (int k = 1; k >= 0; k--) {
        memset(dw[k], 0, nw * sizeof(float));
        matmul_backward_bf16(test_stream, fp32_buf(got2[k]), fp32_buf(dw[k]), dout[k], inp[k], product_weight[k], N, C,
                             OC);
    }
    stream_synchronize(test_stream);
    cr_assert(memcmp(got2[0], got2[1], n * sizeof(float)) == 0, "matmul_backward_bf16's dinp from a bf16 weight");
    cr_assert(memcmp(dw[0], dw[1], nw * sizeof(float)) == 0, "matmul_backward_bf16's dweight from a bf16 weight");
    for (int k = 0; k < 2; k++) {
        layernorm_forward(test_stream, fp32_buf(got2[k]), stats, stats + N, inp[k], weight[k], bias[k], N, C,
                          DTYPE_BF16);
        stream_synchronize(test_stream);
    }
    cr_assert(memcmp(got2[0], got2[1], n * sizeof(float)) == 0, "layernorm_forward with a bf16 weight and bias");
    for (int k = 0; k < 2; k++) {
        residual_layernorm_forward(test_stream, fp32_buf(got[k]), fp32_buf(got2[k]), stats, stats + N, inp[k],
                                   fp32_numbers(b), weight[k], bias[k], N, C, DTYPE_BF16);
        stream_synchronize(test_stream);
    }
    cr_assert(memcmp(got[0], got[1], n * sizeof(float)) == 0 && memcmp(got2[0], got2[1], n * sizeof(float)) == 0,
              "residual_layernorm_forward with a bf16 weight and bias");
    for (int k = 0; k < 2; k++) bias_forward(test_stream, fp32_buf(got2[k]), b, bias[k], N, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got2[0], got2[1], n * sizeof(float)) == 0, "bias_forward with a bf16 bias");
    int *tokens = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) tokens[i] = (i * 7) % V;
    for (int k = 0; k < 2; k++)  /* wte: x's first V rows; wpe: x's rows from V on, T = N / 4 of them */
        embedding_forward(test_stream, fp32_buf(got2[k]), tokens, inp[k], k ? bf16_numbers(x16 + (size_t)V * C)
                                                                             : fp32_numbers(x + (size_t)V * C),
                          4, N / 4, C, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(got2[0], got2[1], n * sizeof(float)) == 0, "embedding_forward from bf16 wte and wpe");
    for (int k = 0; k < 2; k++) {
        free(got[k]); free(got2[k]); free(dw[k]); free(db[k]);
    }
    free(x); free(dy); free(w); free(lw); free(b); free(stats); free(x16); free(w16); free(lw16); free(dy16);
    free(tokens);
}

/* The activation gradients a model holds in bf16 under autocast (the MLP's
 * hidden one, a LayerNorm's output's, the residual stream's): GELU's
 * backward in place over a bf16 gradient from a bf16 input, and a product's
 * backward writing its input's gradient in bf16, are the bytes of their fp32
 * outputs stored (GELU's bias sums the same); LayerNorm's backward from a
 * bf16 gradient gives the bytes of the same values in fp32, and added into
 * a bf16 input gradient (the residual stream's) their bytes stored; dropout's
 * backward from bf16 into bf16 and the embedding's from a bf16 gradient the
 * same. First on an empty room, each larger than the last, at sizes (512 KB
 * and up) where a room that grew under what was widened into it would be
 * unmapped. */
Test(kernels, activation_gradients_held_in_bf16_are_the_bytes_of_fp32s_stored) {
    enum { N = 2048, C = 64, OC = 256 };
    size_t n = (size_t)N * OC, nc = (size_t)N * C, nw = (size_t)OC * C;
    float *x = alloc_floats(n), *dy = alloc_floats(n), *w = alloc_floats(nw), *got = alloc_floats(n);
    float *dbias = alloc_floats(OC), *dbias16 = alloc_floats(OC), *dw = alloc_floats(nw), *dw16 = alloc_floats(nw);
    float *lw = alloc_floats(C), *stats = alloc_floats(2 * N), *dx = alloc_floats(nc), *dx16 = alloc_floats(nc);
    bf16 *x16 = malloc(n * sizeof(bf16)), *dy16 = malloc(n * sizeof(bf16)), *got16 = malloc(n * sizeof(bf16));
    fill_uniform(x, n, -2, 2, 161);
    fill_uniform(dy, n, -1, 1, 162);
    fill_uniform(w, nw, -1, 1, 163);
    fill_uniform(lw, C, 0.5f, 1.5f, 164);
    fill_uniform(stats, N, -0.5f, 0.5f, 165);
    fill_uniform(stats + N, N, 0.5f, 2.0f, 166);
    hold_in_bf16(x, n, x16, x);
    hold_in_bf16(dy, n, dy16, dy);
    for (size_t i = 0; i < nw; i++) w[i] = bf16_rounded(w[i]);
    /* GELU's backward, bf16 in place from bf16 (the room: its input, then the gradient over dout), then fp32's */
    memcpy(got16, dy16, n * sizeof(bf16));
    gelu_backward(test_stream, bf16_buf(got16), fp32_buf(dbias16), bf16_numbers(x16), bf16_numbers(got16), N, OC, 1,
                  DTYPE_BF16, NULL);
    gelu_backward(test_stream, fp32_buf(got), fp32_buf(dbias), fp32_numbers(x), fp32_numbers(dy), N, OC, 1, DTYPE_BF16,
                  NULL);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(got16, got, n), "gelu_backward into bf16, in place");
    cr_assert(memcmp(dbias, dbias16, OC * sizeof(float)) == 0, "gelu_backward's bias sums into bf16");
    /* the product's backward: its input's gradient into bf16 from a bf16 dout and input (the room: all four) */
    matmul_backward_bf16(test_stream, bf16_buf(got16), fp32_buf(dw16), bf16_numbers(dy16), bf16_numbers(x16),
                         fp32_numbers(w), N, OC, C);
    matmul_backward_bf16(test_stream, fp32_buf(got), fp32_buf(dw), fp32_numbers(dy), fp32_numbers(x), fp32_numbers(w),
                         N, OC, C);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(got16, got, n), "matmul_backward_bf16's dinp into bf16");
    cr_assert(memcmp(dw, dw16, nw * sizeof(float)) == 0, "its weight gradient");
    /* LayerNorm's backward from a bf16 gradient (x's first N x C as its input, dy's as its dout) */
    memset(dw, 0, 2 * C * sizeof(float));
    memset(dw16, 0, 2 * C * sizeof(float));
    layernorm_backward(test_stream, fp32_buf(dx16), fp32_buf(dw16), fp32_buf(dw16 + C), bf16_numbers(dy16),
                       fp32_numbers(x), fp32_numbers(lw), stats, stats + N, N, C, NULL, DTYPE_BF16);
    layernorm_backward(test_stream, fp32_buf(dx), fp32_buf(dw), fp32_buf(dw + C), fp32_numbers(dy), fp32_numbers(x),
                       fp32_numbers(lw), stats, stats + N, N, C, NULL, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(dx, dx16, nc * sizeof(float)) == 0, "layernorm_backward's dinp from a bf16 gradient");
    cr_assert(memcmp(dw, dw16, 2 * C * sizeof(float)) == 0, "its weight and bias gradients");
    /* added into a bf16 dinp, the residual stream's gradient so far (dy's last N x C), widened, added into and
     * stored back; and into the same values in fp32 */
    bf16 *dx_held = malloc(nc * sizeof(bf16));
    memcpy(dx_held, dy16 + n - nc, nc * sizeof(bf16));
    memcpy(dx, dy + n - nc, nc * sizeof(float));
    layernorm_backward(test_stream, bf16_buf(dx_held), fp32_buf(dw16), fp32_buf(dw16 + C), bf16_numbers(dy16),
                       fp32_numbers(x), fp32_numbers(lw), stats, stats + N, N, C, NULL, DTYPE_BF16);
    layernorm_backward(test_stream, fp32_buf(dx), fp32_buf(dw), fp32_buf(dw + C), fp32_numbers(dy), fp32_numbers(x),
                       fp32_numbers(lw), stats, stats + N, N, C, NULL, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(dx_held, dx, nc), "layernorm_backward added into a bf16 dinp");
    /* a branch's gradient through its dropout, from the residual stream's, both in bf16 */
    Dropout drop = { 0.3f, 5, 0, 1, 3, NULL };
    dropout_backward(test_stream, bf16_buf(got16), bf16_numbers(dy16), n, drop, DTYPE_BF16);
    dropout_backward(test_stream, fp32_buf(got), fp32_numbers(dy), n, drop, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(got16, got, n), "dropout_backward from bf16 into bf16");
    /* the embeddings' gradients from the residual stream's in bf16: dy's first B x T x C as it, 40 tokens */
    enum { B = 4, T = 512, V = 40 };
    int *tokens = malloc(B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) tokens[i] = (i * 7 + i / 5) % V;
    TokenBuckets buckets = buckets_of(tokens, B * T, V);
    float *dwte[2], *dwpe[2];
    for (int k = 0; k < 2; k++) {
        dwte[k] = alloc_floats((size_t)V * C);
        dwpe[k] = alloc_floats((size_t)T * C);
        embedding_backward(test_stream, fp32_buf(dwte[k]), fp32_buf(dwpe[k]), k ? bf16_numbers(dy16) : fp32_numbers(dy),
                           fp32_numbers(NULL), buckets, B, T, V, C, DTYPE_FP32);
    }
    stream_synchronize(test_stream);
    cr_assert(memcmp(dwte[0], dwte[1], (size_t)V * C * sizeof(float)) == 0, "embedding_backward's dwte from bf16");
    cr_assert(memcmp(dwpe[0], dwpe[1], (size_t)T * C * sizeof(float)) == 0, "embedding_backward's dwpe from bf16");
    for (int k = 0; k < 2; k++) {
        free(dwte[k]);
        free(dwpe[k]);
    }
    free(tokens);
    buckets_free(buckets);
    free(x); free(dy); free(w); free(got); free(dbias); free(dbias16); free(dw); free(dw16); free(lw); free(stats);
    free(dx); free(dx16); free(x16); free(dy16); free(got16); free(dx_held);
}

/* A branch's output held in bf16 (attention's projection's, the MLP's, under
 * autocast): the residual add and the fused add and LayerNorm from it give
 * the bytes they give its values in fp32, with the stream in bf16 or fp32.
 * First on an empty room, each larger than the last, at sizes (512 KB a
 * tensor) where a room that grew under what was widened into it would be
 * unmapped. */
Test(kernels, a_branch_held_in_bf16_gives_the_residual_adds_the_bytes_of_its_fp32_values) {
    enum { N = 2048, C = 64 };
    size_t n = (size_t)N * C;
    float *a = alloc_floats(n), *b = alloc_floats(n), *w = alloc_floats(2 * C), *stats = alloc_floats(4 * N);
    float *sum = alloc_floats(n), *sum2 = alloc_floats(n), *out = alloc_floats(n), *out2 = alloc_floats(n);
    bf16 *a16 = malloc(n * sizeof(bf16)), *b16 = malloc(n * sizeof(bf16)), *got16 = malloc(n * sizeof(bf16));
    fill_uniform(a, n, -2, 2, 191);
    fill_uniform(b, n, -1, 1, 192);
    fill_uniform(w, 2 * C, 0.5f, 1.5f, 193);
    hold_in_bf16(a, n, a16, a);
    hold_in_bf16(b, n, b16, b);
    residual_forward(test_stream, fp32_buf(sum), fp32_numbers(a), bf16_numbers(b16), n, DTYPE_BF16);
    residual_forward(test_stream, fp32_buf(sum2), fp32_numbers(a), fp32_numbers(b), n, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(memcmp(sum, sum2, n * sizeof(float)) == 0, "residual_forward from a bf16 branch");
    residual_forward(test_stream, bf16_buf(got16), bf16_numbers(a16), bf16_numbers(b16), n, DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(got16, sum2, n), "residual_forward from a bf16 stream and branch into bf16");
    residual_layernorm_forward(test_stream, bf16_buf(got16), fp32_buf(out), stats, stats + N, bf16_numbers(a16),
                               bf16_numbers(b16), fp32_numbers(w), fp32_numbers(w + C), N, C, DTYPE_BF16);
    residual_layernorm_forward(test_stream, fp32_buf(sum), fp32_buf(out2), stats + 2 * N, stats + 3 * N,
                               fp32_numbers(a), fp32_numbers(b), fp32_numbers(w), fp32_numbers(w + C), N, C,
                               DTYPE_BF16);
    stream_synchronize(test_stream);
    cr_assert(same_as_stored(got16, sum, n) && memcmp(out, out2, n * sizeof(float)) == 0,
              "residual_layernorm_forward from a bf16 branch");
    cr_assert(memcmp(stats, stats + 2 * N, 2 * N * sizeof(float)) == 0, "its statistics");
    free(a); free(b); free(w); free(stats); free(sum); free(sum2); free(out); free(out2); free(a16); free(b16);
    free(got16);
}

/* A bias is held as the product's output is: cuBLASLt's epilogue reads it in
 * the output's dtype on a GPU. Another dtype is refused, on both backends. */
Test(kernels, a_product_refuses_an_fp32_bias_into_a_bf16_output, .signal = SIGABRT) {
    float x[4] = { 1, 2, 3, 4 }, w[4] = { 1, 0, 0, 1 }, bias[2] = { 0.1f, 0.2f };
    bf16 out[4];
    matmul_forward_bf16(test_stream, bf16_buf(out), fp32_numbers(x), fp32_numbers(w), fp32_numbers(bias), 2, 2, 2);
    stream_synchronize(test_stream);
}

Test(kernels, a_product_refuses_a_bf16_bias_into_an_fp32_output, .signal = SIGABRT) {
    float x[4] = { 1, 2, 3, 4 }, w[4] = { 1, 0, 0, 1 }, out[4];
    bf16 bias[2] = { 0 };
    matmul_forward_bf16(test_stream, fp32_buf(out), fp32_numbers(x), fp32_numbers(w), bf16_numbers(bias), 2, 2, 2);
    stream_synchronize(test_stream);
}

/* The alignment a GPU's bf16 product tells cuBLASLt its pointers share: 16
 * bytes where all are on operand boundaries (a null bias too), else the
 * least any of them has, whichever it is. */
Test(kernels, a_products_alignment_is_the_least_its_pointers_share) {
    const char *base = (const char *)(uintptr_t)(1u << 20);  /* an address on every boundary up to 1 MiB */
    cr_expect_eq(product_alignment(base, base + 256, base + 512, NULL), 16u);
    cr_expect_eq(product_alignment(base, base + 256, base + 512, base + 768), 16u);
    cr_expect_eq(product_alignment(base + 48, base, base, NULL), 16u, "16 is the most told");
    cr_expect_eq(product_alignment(base + 8, base, base, NULL), 8u, "a");
    cr_expect_eq(product_alignment(base, base + 2, base, NULL), 2u, "b");
    cr_expect_eq(product_alignment(base, base, base + 4, NULL), 4u, "out");
    cr_expect_eq(product_alignment(base, base, base, base + 6), 2u, "the bias");
    cr_expect_eq(product_alignment(base + 3200, base, base, NULL), 16u, "past a row of 1600 bf16 numbers");
    cr_expect_eq(product_alignment(base + 40, base, base, NULL), 8u, "past a row of 20");
}

/* GPT-2's form: the two differ by up to 4.7e-4 (at |x| = 2.7), far above FWD_TOL, so each is checked as itself */
Test(kernels, gelu_tanh_form_forward_backward) {
    check_gelu(1);
    float x = 2.7f, exact, approx;
    gelu_forward(test_stream, fp32_buf(&exact), fp32_numbers(&x), 1, 0, DTYPE_FP32);
    gelu_forward(test_stream, fp32_buf(&approx), fp32_numbers(&x), 1, 1, DTYPE_FP32);
    stream_synchronize(test_stream);
    cr_expect_gt(fabsf(exact - approx), 4e-4f, "the tanh form is another function: %g and %g", exact, approx);
}

/* Dropout's step read from memory (step_at) as the op runs: one capture of
 * the op, launched after each step is written there, draws that step's mask,
 * the bytes of the op given the step by value; a step given by value would
 * keep the capture's. */
Test(kernels, dropout_reads_its_step_from_memory_at_each_graph_launch) {
    size_t n = 1001;
    float *x = alloc_floats(n), *out = alloc_floats(n), *want = alloc_floats(n), *last = alloc_floats(n);
    fill_uniform(x, n, 0.5f, 1.5f, 54);
    uint32_t *step = device_alloc(test_device, MEM_WORKING, sizeof *step);
    *step = 0;
    Dropout from_memory = { 0.3f, 7, 1, 0, 2, step };
    graph_capture_begin(test_stream);
    dropout_forward(test_stream, fp32_buf(out), fp32_numbers(x), n, from_memory, DTYPE_FP32);
    Graph *g = graph_capture_end(test_stream);
    for (uint32_t s = 4; s <= 6; s++) {
        *step = s;
        graph_launch(g, test_stream);
        Dropout by_value = { 0.3f, 7, 1, s, 2, NULL };
        dropout_forward(test_stream, fp32_buf(want), fp32_numbers(x), n, by_value, DTYPE_FP32);
        stream_synchronize(test_stream);
        cr_expect(memcmp(out, want, n * sizeof(float)) == 0, "the launch at step %u drew another mask", s);
        if (s > 4) cr_expect(memcmp(out, last, n * sizeof(float)) != 0, "steps %u and %u drew one mask", s - 1, s);
        memcpy(last, out, n * sizeof(float));
    }
    graph_destroy(g);
    device_free(test_device, MEM_WORKING, step, sizeof *step);
}

Test(kernels, dropout_forward_backward) {
    size_t n = 100003;
    Dropout drop = { 0.25f, 7, 1, 9, 4, NULL };
    float *x = alloc_floats(n), *g = alloc_floats(n), *out = alloc_floats(n), *dx = alloc_floats(n), *base = alloc_floats(n);
    fill_uniform(x, n, 0.5f, 1.5f, 51);
    fill_uniform(g, n, -1, 1, 52);
    fill_uniform(base, n, -1, 1, 53);
    memcpy(dx, base, sizeof(float) * n);
    dropout_forward(test_stream, fp32_buf(out), fp32_numbers(x), n, drop, DTYPE_FP32);
    dropout_backward(test_stream, fp32_buf(dx), fp32_numbers(g), n, drop, DTYPE_FP32);
    stream_synchronize(test_stream);
    size_t dropped = 0;
    for (size_t i = 0; i < n; i++) {
        if (out[i] == 0.0f) dropped++;
        else cr_assert_float_eq(out[i], x[i] / 0.75f, 1e-6f);
    }
    double rate = (double)dropped / n;
    cr_expect(fabs(rate - 0.25) < 0.01, "dropped fraction %g, expected 0.25", rate);
    /* the mask is a pure function of (seed, rank, step, site, element) */
    Dropout other_rank = drop, other_step = drop;
    other_rank.rank = 2;
    other_step.step = 10;
    float m1[64], m2[64], m3[64], m4[64];
    dropout_scales(drop, 1000, 64, m1);
    dropout_scales(drop, 1000, 64, m2);
    dropout_scales(other_rank, 1000, 64, m3);
    dropout_scales(other_step, 1000, 64, m4);
    cr_expect(memcmp(m1, m2, sizeof m1) == 0);
    cr_expect(memcmp(m1, m3, sizeof m1) != 0, "another rank draws another mask");
    cr_expect(memcmp(m1, m4, sizeof m1) != 0, "another step draws another mask");

    size_t small = 37;
    PointwiseCtx c = { to_double(x, small), to_double(g, small), malloc(sizeof(double) * small), small, drop, 0 };
    double *num = malloc(sizeof(double) * small);
    numeric_grad(c.inp, small, dropout_objective, &c, num);
    cr_expect_lt(rel_error(dx, num, small), GRAD_TOL);
    free(x); free(g); free(out); free(dx); free(base); free(c.inp); free(c.g); free(c.out); free(num);
}

Test(kernels, residual_forward) {
    float a[5] = { 1, 2, 3, 4, 5 }, b[5] = { 0.5f, -2, 0.25f, 1e-3f, -5 }, out[5];
    residual_forward(test_stream, fp32_buf(out), fp32_numbers(a), fp32_numbers(b), 5, DTYPE_FP32);
    stream_synchronize(test_stream);
    for (int i = 0; i < 5; i++) cr_expect_eq(out[i], a[i] + b[i]);
}

/* ---- cross-entropy ---- */

typedef struct { double *logits; const int *targets; int N, V; } CrossEntropyCtx;

static double crossentropy_objective(void *p) {
    CrossEntropyCtx *c = p;
    return ref_crossentropy(c->logits, c->targets, c->N, c->V);
}

Test(kernels, crossentropy_forward_backward) {
    int N = 6, V = 11;
    int targets[6] = { 0, 10, 3, 3, 7, 1 };
    float *logits = alloc_floats(N * V), *losses = alloc_floats(N);
    float *dlogits = alloc_floats(N * V), mean;
    fill_uniform(logits, N * V, -4, 4, 61);
    fill_uniform(dlogits, N * V, -1, 1, 62);  /* written, not added: this must vanish */
    crossentropy_forward_backward(test_stream, losses, fp32_buf(dlogits), fp32_numbers(logits), targets, N, V,
                                  1.0f / N, DTYPE_FP32);
    mean_forward(test_stream, &mean, losses, N);
    stream_synchronize(test_stream);
    CrossEntropyCtx c = { to_double(logits, N * V), targets, N, V };
    double want = ref_crossentropy(c.logits, targets, N, V);
    cr_expect(fabs(mean - want) < 1e-5 * want, "loss %g, want %g", mean, want);
    double *num = malloc(sizeof(double) * N * V);
    numeric_grad(c.logits, N * V, crossentropy_objective, &c, num);
    cr_expect_lt(rel_error(dlogits, num, N * V), GRAD_TOL);
    free(logits); free(losses); free(dlogits); free(c.logits); free(num);
}

/* GPT-2's rows (V = 50304) against the double reference, row by row: random
 * logits; the same with the row's largest logit last, so that the online max
 * grows at the last step of its partial and rescales the whole sum in the
 * tree; logits rising along the row (every step of every partial a new max);
 * and a wide row (-80 .. 80) whose exponentials mostly underflow. The loss
 * alone, the gradient beside it, and the gradient in place over the logits:
 * the same losses, the same gradient, bit for bit. */
Test(kernels, crossentropy_at_gpt2_vocabulary_against_double) {
    int N = 4, V = 50304;
    int targets[4] = { 17, 50303, 25000, 3 };
    size_t n = (size_t)N * V;
    float *logits = alloc_floats(n), *dlogits = alloc_floats(n), *in_place = alloc_floats(n);
    float losses[4], losses_alone[4], losses_in_place[4];
    fill_uniform(logits, 2 * (size_t)V, -4, 4, 63);
    logits[2 * (size_t)V - 1] = 9.0f;  /* row 1's max, at its end */
    for (int j = 0; j < V; j++) logits[2 * (size_t)V + j] = -10.0f + 20.0f * (float)j / (float)V;
    fill_uniform(logits + 3 * (size_t)V, V, -80, 80, 64);
    memcpy(in_place, logits, n * sizeof(float));
    float dloss = 1.0f / 3.0f;
    crossentropy_forward_backward(test_stream, losses_alone, fp32_buf(NULL), fp32_numbers(logits), targets, N, V,
                                  dloss, DTYPE_FP32);
    crossentropy_forward_backward(test_stream, losses, fp32_buf(dlogits), fp32_numbers(logits), targets, N, V, dloss,
                                  DTYPE_FP32);
    crossentropy_forward_backward(test_stream, losses_in_place, fp32_buf(in_place), fp32_numbers(in_place), targets,
                                  N, V, dloss, DTYPE_FP32);
    stream_synchronize(test_stream);
    double *row = malloc(V * sizeof(double)), *want = malloc(V * sizeof(double));
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < V; j++) row[j] = logits[(size_t)i * V + j];
        double loss = ref_crossentropy_row(row, targets[i], V, want);
        for (int j = 0; j < V; j++) want[j] *= dloss;
        cr_expect(fabs(losses[i] - loss) < 1e-6 * fmax(1.0, fabs(loss)), "row %d: loss %.9g, reference %.9g", i,
                  losses[i], loss);
        double e = rel_error(dlogits + (size_t)i * V, want, V);
        cr_expect_lt(e, 1e-6, "row %d: dlogits relative error %g", i, e);
    }
    cr_expect_eq(memcmp(losses_alone, losses, sizeof losses), 0, "the loss alone has other bits");
    cr_expect_eq(memcmp(losses_in_place, losses, sizeof losses), 0, "the loss in place has other bits");
    cr_expect_eq(memcmp(in_place, dlogits, n * sizeof(float)), 0, "the gradient in place has other bits");
    free(logits); free(dlogits); free(in_place); free(row); free(want);
}

/* The exp and log that the CPU and the GPU share (online_softmax.h): within
 * 2 ulp of the double's exp over [-87.3, 0] (0 below), and of its log over
 * [1, 2^17]. */
Test(kernels, softmax_exp_and_log_within_2_ulp) {
    double worst_exp = 0, worst_log = 0;
    for (int k = 0; k <= 1000000; k++) {
        float x = -87.33f * (float)k / 1000000.0f;
        double want = exp((double)x);
        worst_exp = fmax(worst_exp, fabs(softmax_exp(x) - want) / (want * FLT_EPSILON));
        float y = ldexpf(1.0f + (float)k / 1000000.0f, k % 17);
        double want_log = log((double)y);
        if (y > 1.0f) worst_log = fmax(worst_log, fabs(softmax_log(y) - want_log) / (want_log * FLT_EPSILON));
    }
    cr_expect_leq(worst_exp, 2.0, "exp: %g ulp", worst_exp);
    cr_expect_leq(worst_log, 2.0, "log: %g ulp", worst_log);
    cr_expect_eq(softmax_exp(-88.0f), 0.0f);
    cr_expect_eq(softmax_exp(-INFINITY), 0.0f);
    cr_expect(isnan(softmax_exp(NAN)));
    cr_expect_eq(softmax_exp(0.0f), 1.0f);
    cr_expect_eq(softmax_log(1.0f), 0.0f);
    cr_expect(isnan(softmax_log(NAN)));
}

/* ---- optimizer and reductions ---- */

/* AdamW over n numbers of one tensor that decays (by hp.weight_decay), with a clip or NO_CLIP. */
static void adamw_clipped(float *param, const void *grad, DType held, float *m, float *v, size_t n,
                          AdamWParams hp, AdamWClip clip) {
    AdamWSpan *span = malloc(sizeof *span);  /* the stream's device memory: the host's, on the CPU */
    *span = (AdamWSpan){ 0, n, 1 };
    adamw_arena(test_stream, param, NULL, grad, held, m, v, 0, n, span, 1, hp, clip);
    stream_synchronize(test_stream);
    free(span);
}

static void adamw_tensor(float *param, const void *grad, DType held, float *m, float *v, size_t n, AdamWParams hp) {
    adamw_clipped(param, grad, held, m, v, n, hp, NO_CLIP);
}

Test(kernels, adamw_matches_hand_computation) {
    /* lr 0.1, betas (0.9, 0.99), eps 1e-8, weight decay 0.1; p = 1, grads 0.5 then -0.25.
     * step 1: p = 1 * (1 - 0.01) = 0.99; m = 0.05; v = 0.0025;
     *         step_size = 0.1 / (1 - 0.9) = 1; denom = sqrt(0.0025) / sqrt(0.01) + 1e-8 = 0.5
     *         p = 0.99 - 1 * 0.05 / 0.5 = 0.89
     * step 2: p = 0.89 * 0.99 = 0.8811; m = 0.045 - 0.025 = 0.02; v = 0.002475 + 0.000625 = 0.0031
     *         step_size = 0.1 / 0.19 = 0.526315789; denom = sqrt(0.0031) / sqrt(0.0199) + 1e-8
     *         = 0.0556776436 / 0.1410673598 = 0.3946900384
     *         p = 0.8811 - 0.526315789 * 0.02 / 0.3946900384 = 0.8811 - 0.0266696924 = 0.8544303076 */
    float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
    AdamWParams hp = { 0.1f, 0.9f, 0.99f, 1e-8f, 0.1f, 1 };
    adamw_tensor(&p, &g, DTYPE_FP32, &m, &v, 1, hp);
    cr_expect_float_eq(p, 0.89f, 1e-6f, "step 1: p = %.9g", p);
    cr_expect_float_eq(m, 0.05f, 1e-7f);
    cr_expect_float_eq(v, 0.0025f, 1e-8f);
    g = -0.25f;
    hp.step = 2;
    adamw_tensor(&p, &g, DTYPE_FP32, &m, &v, 1, hp);
    cr_expect_float_eq(p, 0.8544303076f, 1e-6f, "step 2: p = %.9g", p);
    cr_expect_float_eq(m, 0.02f, 1e-7f);
    cr_expect_float_eq(v, 0.0031f, 1e-8f);
    /* no weight decay: step 1 is p - lr * sign(g) exactly as Adam's first step */
    float q = 1.0f, gq = 0.5f, mq = 0.0f, vq = 0.0f;
    AdamWParams nodecay = { 0.1f, 0.9f, 0.99f, 1e-8f, 0.0f, 1 };
    adamw_tensor(&q, &gq, DTYPE_FP32, &mq, &vq, 1, nodecay);
    cr_expect_float_eq(q, 0.9f, 1e-6f, "no decay: q = %.9g", q);
}

/* The GPU's search of AdamW's table (adamw.h): each element of an arena finds
 * the tensor that holds it, padding none, against a scan of the table; over
 * tables of 1 to 9 tensors, adjacent or with padding between. */
Test(kernels, adamw_span_at_finds_each_elements_tensor) {
    AdamWSpan spans[9];
    for (int n = 1; n <= 9; n++) {
        size_t at = 0;
        for (int t = 0; t < n; t++) {
            size_t numel = 1 + (size_t)(t * 7 % 5), gap = (size_t)(t % 3 == 1 ? 0 : t % 4);
            spans[t] = (AdamWSpan){ at, at + numel, t % 2 };
            at += numel + gap;
        }
        for (size_t i = 0; i < at + 3; i++) {
            int want = -1;
            for (int t = 0; t < n; t++)
                if (i >= spans[t].begin && i < spans[t].end) want = t;
            cr_expect_eq(adamw_span_at(spans, n, i), want, "%d tensors: element %zu", n, i);
        }
    }
}

/* AdamW over a range of an arena in one launch, as a ZeRO shard takes it: a
 * range that starts and ends inside tensors, tensors that decay and tensors
 * that do not, padding between and after them left alone (weights, m, v and
 * copy), and the bf16 copy of each new weight; against torch's arithmetic
 * written out here, element by element, to the bytes. */
Test(kernels, adamw_over_an_arena_range_decays_by_tensor_and_skips_padding) {
    AdamWSpan table[4] = { { 0, 300, 1 }, { 304, 310, 0 }, { 320, 1000, 1 }, { 1000, 1003, 0 } };
    size_t lo = 150, n = 1008 - lo;
    float *p = alloc_floats(n), *m = alloc_floats(n), *v = alloc_floats(n), *g = alloc_floats(n);
    float *p0 = alloc_floats(n), *m0 = alloc_floats(n), *v0 = alloc_floats(n);
    bf16 *copy = malloc(n * sizeof(bf16));
    AdamWSpan *spans = malloc(sizeof table);
    memcpy(spans, table, sizeof table);
    fill_uniform(p, n, -1, 1, 73);
    fill_uniform(m, n, -0.1f, 0.1f, 74);
    fill_uniform(v, n, 0, 0.1f, 75);
    fill_uniform(g, n, -1, 1, 76);
    memcpy(p0, p, n * sizeof(float));
    memcpy(m0, m, n * sizeof(float));
    memcpy(v0, v, n * sizeof(float));
    for (size_t j = 0; j < n; j++) copy[j] = 0x1234;
    AdamWParams hp = { 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 4 };
    adamw_arena(test_stream, p, copy, g, DTYPE_FP32, m, v, lo, n, spans, 4, hp, NO_CLIP);
    stream_synchronize(test_stream);

    float bias_correction1 = 1.0f - powf(hp.beta1, 4.0f), bias_correction2_sqrt = sqrtf(1.0f - powf(hp.beta2, 4.0f));
    float step_size = hp.lr / bias_correction1, decay = 1.0f - hp.lr * hp.weight_decay;
    int padding = 0, undecayed = 0, wrong = 0;
    for (size_t j = 0; j < n; j++) {
        int t = -1;
        for (int k = 0; k < 4; k++)
            if (lo + j >= table[k].begin && lo + j < table[k].end) t = k;
        if (t < 0) {
            padding++;
            wrong += p[j] != p0[j] || m[j] != m0[j] || v[j] != v0[j] || copy[j] != 0x1234;
            continue;
        }
        undecayed += !table[t].decays;
        float mi = m0[j] + (1.0f - hp.beta1) * (g[j] - m0[j]);
        float vi = hp.beta2 * v0[j] + (1.0f - hp.beta2) * g[j] * g[j];
        float denom = sqrtf(vi) / bias_correction2_sqrt + hp.eps;
        float want = p0[j] * (table[t].decays ? decay : 1.0f) - step_size * mi / denom;
        int same = memcmp(&p[j], &want, sizeof want) == 0 && memcmp(&m[j], &mi, sizeof mi) == 0 &&
                   memcmp(&v[j], &vi, sizeof vi) == 0 && copy[j] == bf16_from_float(want);
        if (!same && wrong++ < 3)
            cr_expect(0, "element %zu (tensor %d): %.9g, want %.9g; copy %04x", lo + j, t, p[j], want, copy[j]);
    }
    cr_expect_eq(wrong, 0, "%d of %zu elements differ", wrong, n);
    cr_expect_eq(padding, 4 + 10 + 5, "padding seen: %d", padding);
    cr_expect_eq(undecayed, 6 + 3, "undecayed seen: %d", undecayed);
    free(p); free(m); free(v); free(g); free(p0); free(m0); free(v0); free(copy); free(spans);
}

/* The same AdamW step twice from the same state, over grad_a and grad_b:
 * whether its weights, m and v come out the same bytes. Leaves the state. */
static int same_steps(const float *p0, const float *m0, const float *v0, size_t n, const void *grad_a, AdamWClip clip_a,
                      const void *grad_b, AdamWClip clip_b, DType held) {
    AdamWParams hp = { 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 3 };
    float *state[2][3];
    for (int k = 0; k < 2; k++) {
        state[k][0] = alloc_floats(n);
        state[k][1] = alloc_floats(n);
        state[k][2] = alloc_floats(n);
        memcpy(state[k][0], p0, n * sizeof(float));
        memcpy(state[k][1], m0, n * sizeof(float));
        memcpy(state[k][2], v0, n * sizeof(float));
    }
    adamw_clipped(state[0][0], grad_a, held, state[0][1], state[0][2], n, hp, clip_a);
    adamw_clipped(state[1][0], grad_b, held, state[1][1], state[1][2], n, hp, clip_b);
    int same = 1;
    for (int i = 0; i < 3; i++) same &= memcmp(state[0][i], state[1][i], n * sizeof(float)) == 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 3; i++) free(state[k][i]);
    return same;
}

/* ---- the exact sum of squares (square_sum.h) ---- */

/* Single terms land where the unit (2^-86) says, the small ones go, the
 * words carry, and a sum is infinite exactly where a square reaches 2^128. */
Test(kernels, square_sum_places_each_term) {
    struct { float x; uint64_t word[SQUARE_SUM_WORDS]; } cases[] = {
        { 1.0f, { 0, 1ull << 22, 0, 0 } },              /* 2^86 units */
        { -0x1p-31f, { 1ull << 24, 0, 0, 0 } },         /* 2^-62: 2^24 units */
        { 0x1p-32f, { 0, 0, 0, 0 } },                   /* 2^-64: below 2^-63, dropped */
        { 0x1.8p0f, { 0, 9ull << 20, 0, 0 } },          /* 2.25: 9 * 2^84 units */
        { 0x1p63f, { 0, 0, 0, 1ull << 20 } },           /* 2^126: bit 212 */
    };
    void *scratch = calloc(sumsq_scratch_bytes(1), 1);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SquareSum s = ref_square_sum(&cases[c].x, 1);
        SquareSum got;
        sumsq_reduce(test_stream, &got, &cases[c].x, DTYPE_FP32, 1, scratch);
        stream_synchronize(test_stream);
        cr_expect(memcmp(s.word, cases[c].word, sizeof s.word) == 0 && memcmp(&got, &s, sizeof s) == 0,
                  "%a: words %016llx %016llx %016llx %016llx", (double)cases[c].x, (unsigned long long)got.word[3],
                  (unsigned long long)got.word[2], (unsigned long long)got.word[1], (unsigned long long)got.word[0]);
    }
    SquareSum low = { { UINT64_MAX, UINT64_MAX, 0, 0 } }, one = { { 1, 0, 0, 0 } };
    SquareSum carried = square_sum_add(low, one);
    cr_expect(carried.word[0] == 0 && carried.word[1] == 0 && carried.word[2] == 1 && carried.word[3] == 0,
              "a carry through two words went astray");
    cr_expect_eq(square_sum_value(ref_square_sum((float[]){ 3.0f, 4.0f }, 2)), 25.0);
    float edges[] = { 0x1.fffffep63f, 0x1p64f, INFINITY, NAN, -INFINITY };
    for (int e = 0; e < 5; e++) {
        SquareSum got;
        sumsq_reduce(test_stream, &got, &edges[e], DTYPE_FP32, 1, scratch);
        stream_synchronize(test_stream);
        cr_expect_eq(square_sum_infinite(got), e > 0, "%a: infinite %d", (double)edges[e], square_sum_infinite(got));
        cr_expect_eq(square_sum_infinite(square_sum_add(got, one)), e > 0);
    }
    free(scratch);
}

/* Values over 60 binades, some below the cut and one at 2^63: the sum by
 * chunks and bands is the reference's integer (bit by bit); any cut of the values into
 * parts gives it again, to the byte; and its value is a double's sum of the
 * terms within 1e-15. */
Test(kernels, square_sum_is_the_same_however_cut) {
    size_t n = 3 * SUMSQ_CHUNK + 12345;
    float *x = alloc_floats(n);
    fill_uniform(x, n, -1, 1, 81);
    for (size_t i = 0; i < n; i++) x[i] = ldexpf(x[i], (int)(i * 7919 % 61) - 40);
    x[100] = 0x1p63f;
    void *scratch = calloc(sumsq_scratch_bytes(n), 1);
    SquareSum whole, want = ref_square_sum(x, n);
    sumsq_reduce(test_stream, &whole, x, DTYPE_FP32, n, scratch);
    stream_synchronize(test_stream);
    cr_expect(memcmp(&whole, &want, sizeof whole) == 0, "the chunks' bands are not the plain loop's sum");
    double terms = 0.0;
    for (size_t i = 0; i < n; i++) terms += (double)square_term(x[i]);
    cr_expect(fabs(square_sum_value(whole) - terms) <= 1e-15 * terms, "%.17g, a double's %.17g",
              square_sum_value(whole), terms);
    uint64_t state = 5;
    for (int trial = 0; trial < 20; trial++) {
        SquareSum total = square_sum_zero();
        for (size_t from = 0; from < n;) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            size_t len = 1 + (size_t)(state >> 33) % (trial < 10 ? 97 : 2 * SUMSQ_CHUNK);
            if (len > n - from) len = n - from;
            SquareSum part;
            sumsq_reduce(test_stream, &part, x + from, DTYPE_FP32, len, scratch);
            stream_synchronize(test_stream);
            total = square_sum_add(total, part);
            from += len;
        }
        cr_expect(memcmp(&total, &whole, sizeof total) == 0, "cut %d: the parts add to another sum", trial);
    }
    free(x);
    free(scratch);
}

/* The squared norm against a double's, and the clip folded into AdamW: the
 * step over the gradient clipped by the norm of its three parts is the step
 * over the gradient scaled by hand beforehand, to the bytes, and leaves the
 * gradient as it was; under the limit, the unscaled gradient's step. */
Test(kernels, sumsq_and_the_clip_in_adamw) {
    size_t n = 100001, cut[4] = { 0, 30000, 70001, n };
    float *x = alloc_floats(n), *scaled = alloc_floats(n), *before = alloc_floats(n);
    float *p0 = alloc_floats(n), *m0 = alloc_floats(n), *v0 = alloc_floats(n);
    SquareSum sumsq, parts[3];
    void *scratch = calloc(sumsq_scratch_bytes(n), 1);
    fill_uniform(x, n, -1, 1, 71);
    fill_uniform(p0, n, -1, 1, 77);
    fill_uniform(m0, n, -0.1f, 0.1f, 78);
    fill_uniform(v0, n, 0, 0.1f, 79);
    memcpy(before, x, n * sizeof(float));
    double want = 0;
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    sumsq_reduce(test_stream, &sumsq, x, DTYPE_FP32, n, scratch);
    stream_synchronize(test_stream);
    cr_expect(fabs(square_sum_value(sumsq) - want) < 1e-6 * want, "sumsq %g, want %g", square_sum_value(sumsq), want);

    for (int k = 0; k < 3; k++) {
        sumsq_reduce(test_stream, &parts[k], x + cut[k], DTYPE_FP32, cut[k + 1] - cut[k], scratch);
        stream_synchronize(test_stream);
    }
    SquareSum total = square_sum_add(square_sum_add(parts[0], parts[1]), parts[2]);
    cr_expect(memcmp(&total, &sumsq, sizeof total) == 0, "the parts' sums add to another sum than the whole's");
    float coef = 1.0f / ((float)sqrt(square_sum_value(total)) + 1e-6f);
    cr_assert_lt(coef, 0.1f, "the test must clip");
    for (size_t i = 0; i < n; i++) scaled[i] = x[i] * coef;
    cr_expect(same_steps(p0, m0, v0, n, x, (AdamWClip){ parts, 3, 1.0f }, scaled, NO_CLIP, DTYPE_FP32),
              "AdamW clipping to norm 1 is not AdamW over the gradient scaled by %.9g", coef);
    cr_expect_eq(memcmp(x, before, n * sizeof(float)), 0, "the clip wrote the gradient");
    cr_expect(same_steps(p0, m0, v0, n, x, (AdamWClip){ parts, 3, 1000.0f }, x, NO_CLIP, DTYPE_FP32),
              "a norm under the limit changed AdamW's step");
    cr_expect(!same_steps(p0, m0, v0, n, x, NO_CLIP, scaled, NO_CLIP, DTYPE_FP32),
              "the scaled gradient takes the same step: the test could not fail");
    free(x); free(scaled); free(before); free(p0); free(m0); free(v0);
    free(scratch);
}

Test(kernels, count_nonfinite_counts_nan_and_inf_only) {
    size_t n = 100001;  /* several chunks, and a ragged end */
    float *x = alloc_floats(n), count = -1;
    void *scratch = calloc(sumsq_scratch_bytes(n), 1);
    fill_uniform(x, n, -1, 1, 72);
    x[17] = 3.0e38f;    /* finite however large: its square would overflow a float sumsq */
    x[50000] = -3.0e38f;
    count_nonfinite(test_stream, &count, x, DTYPE_FP32, n, scratch);
    stream_synchronize(test_stream);
    cr_expect_eq(count, 0.0f, "all finite: %g", count);
    x[0] = NAN;
    x[40000] = INFINITY;
    x[n - 1] = -INFINITY;
    count_nonfinite(test_stream, &count, x, DTYPE_FP32, n, scratch);
    stream_synchronize(test_stream);
    cr_expect_eq(count, 3.0f, "one NaN, two infinities: %g", count);
    count_nonfinite(test_stream, &count, x, DTYPE_FP32, 0, scratch);
    stream_synchronize(test_stream);
    cr_expect_eq(count, 0.0f, "nothing to count: %g", count);
    free(x);
    free(scratch);
}

/* Gradients held in bf16 (mixed precision reduced in bf16): AdamW, the norm
 * and the count read each as its value, the same bits as the fp32 buffer of
 * the same values; the clip's products are rounded to bf16 before AdamW
 * takes them (the step over the clipped gradient written back in 16 bits);
 * and one taking a part made in bf16 (residual_forward in place, as the
 * model adds a parameter's gradient into it) is the plain loop's rounded
 * sum. */
Test(kernels, gradients_held_in_bf16_are_read_as_their_values) {
    size_t n = 40001;  /* several sumsq chunks, and a ragged end */
    float *values = alloc_floats(n), *x = alloc_floats(n);
    SquareSum sumsq_fp32, sumsq_bf16;
    bf16 *held = malloc(n * sizeof(bf16)), *acc = malloc(n * sizeof(bf16));
    void *scratch = calloc(sumsq_scratch_bytes(n), 1);
    fill_uniform(values, n, -2, 2, 91);
    fill_uniform(x, n, -1, 1, 92);
    hold_in_bf16(values, n, held, values);
    float *p[2], *m[2], *v[2];
    for (int k = 0; k < 2; k++) {
        p[k] = alloc_floats(n);
        m[k] = alloc_floats(n);
        v[k] = alloc_floats(n);
        fill_uniform(p[k], n, -1, 1, 93);
        fill_uniform(m[k], n, -0.1f, 0.1f, 94);
        fill_uniform(v[k], n, 0, 0.1f, 95);
    }
    AdamWParams hp = { 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 3 };
    adamw_tensor(p[0], values, DTYPE_FP32, m[0], v[0], n, hp);
    adamw_tensor(p[1], held, DTYPE_BF16, m[1], v[1], n, hp);
    sumsq_reduce(test_stream, &sumsq_fp32, values, DTYPE_FP32, n, scratch);
    sumsq_reduce(test_stream, &sumsq_bf16, held, DTYPE_BF16, n, scratch);
    stream_synchronize(test_stream);
    cr_expect(memcmp(p[0], p[1], n * sizeof(float)) == 0 && memcmp(m[0], m[1], n * sizeof(float)) == 0 &&
              memcmp(v[0], v[1], n * sizeof(float)) == 0, "AdamW reads a bf16 gradient as other values");
    cr_expect(memcmp(&sumsq_fp32, &sumsq_bf16, sizeof sumsq_bf16) == 0, "sumsq of bf16 %.17g, of its values %.17g",
              square_sum_value(sumsq_bf16), square_sum_value(sumsq_fp32));

    float coef = 1.0f / ((float)sqrt(square_sum_value(sumsq_bf16)) + 1e-6f);
    bf16 *clipped = malloc(n * sizeof(bf16));
    size_t unrounded = 0;
    for (size_t i = 0; i < n; i++) {
        clipped[i] = bf16_from_float(float_from_bf16(held[i]) * coef);
        unrounded += float_from_bf16(clipped[i]) != float_from_bf16(held[i]) * coef;
    }
    cr_expect(unrounded > 0, "no clipped product needed rounding: the test could not fail");
    cr_expect(same_steps(p[0], m[0], v[0], n, held, (AdamWClip){ &sumsq_bf16, 1, 1.0f }, clipped, NO_CLIP,
                         DTYPE_BF16), "AdamW's clip of a bf16 gradient is not the rounded products' step");
    free(clipped);

    float count = -1;
    held[5] = BF16_QUIET_NAN;
    held[20000] = 0x7F80;   /* +inf */
    held[n - 1] = 0xFF80;   /* -inf */
    held[7] = 0x7F7F;       /* the largest finite bf16 */
    count_nonfinite(test_stream, &count, held, DTYPE_BF16, n, scratch);
    stream_synchronize(test_stream);
    cr_expect_eq(count, 3.0f, "one NaN, two infinities held in bf16: %g", count);

    bf16 *part = malloc(n * sizeof(bf16));
    for (size_t i = 0; i < n; i++) acc[i] = bf16_from_float(values[i]), part[i] = bf16_from_float(x[i]);
    memcpy(held, acc, n * sizeof(bf16));
    residual_forward(test_stream, bf16_buf(acc), bf16_numbers(acc), bf16_numbers(part), n, DTYPE_BF16);
    stream_synchronize(test_stream);
    for (size_t i = 0; i < n; i++) {
        bf16 want = bf16_from_float(float_from_bf16(held[i]) + float_from_bf16(part[i]));
        cr_assert_eq(acc[i], want, "the add into bf16, element %zu is 0x%04x, not 0x%04x", i, acc[i], want);
    }
    free(part);
    for (int k = 0; k < 2; k++) {
        free(p[k]);
        free(m[k]);
        free(v[k]);
    }
    free(values);
    free(x);
    free(held);
    free(acc);
    free(scratch);
}

Test(kernels, blas_core_choice) {
    cr_expect_str_eq(blas_better_core("Prescott", 1, 1), "SkylakeX");
    cr_expect_str_eq(blas_better_core("Prescott", 0, 1), "Haswell");
    cr_expect_null(blas_better_core("Prescott", 0, 0));
    cr_expect_null(blas_better_core("SkylakeX", 1, 1));
    cr_expect_null(blas_better_core("Haswell", 0, 1));
}
