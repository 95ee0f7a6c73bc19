/* attention.c: causal multi-head self-attention, blocked as FlashAttention does.
 *
 * q, k and v of head h are column blocks of qkv[B,T,3C] with a row stride of 3C,
 * so each tile's products are plain strided sgemms, with no permutes. Queries go
 * in blocks of ATT_ROWS rows and keys in blocks of ATT_KEYS; a query block
 * ending at row r sees only keys 0..r. The forward walks the key blocks with an
 * online softmax (a running max and sum per query row, the output rescaled as
 * the max grows) and keeps only each row's log-sum-exp for the backward, which
 * recomputes each tile's probabilities from q, k and it, and its dropout mask
 * from the mask's Philox counters. No T x T matrix is ever held: a thread's
 * tiles (at most three of ATT_ROWS x ATT_KEYS floats, 24 KB) are on its stack.
 * (b, h) pairs run in parallel, each on one thread in an order fixed by the
 * shapes, so the bits do not depend on the thread count; inside a parallel
 * region an OpenMP OpenBLAS runs each sgemm on the calling thread.
 *
 * In bf16 (products = DTYPE_BF16, on bf16 values under autocast) the op
 * rounds where the GPU's tensor-core kernels (attention.cu), FlashAttention and
 * PyTorch's SDPA do: the dropped probabilities to bf16 before their products
 * with v (the output, dv), and the scores' gradient to bf16 before its
 * products with k and q (dq, dk); every sum stays fp32. Its output (y; dq,
 * dk and dv) is rounded where `rounding` says, as every op's (kernels.h).
 */
#include <cblas.h>
#include <math.h>

#include "../attention_tiles.h"
#include "../dropout.h"
#include "../../runtime/device_cpu.h"
#include "cpu_kernels.h"
#include "vector_math.h"

/* ATT_KEYS is a multiple of ATT_ROWS, so every key block a query block meets
 * starts at or before its first row: each tile row sees at least one key. Key
 * blocks are the GPU's (FLASH_ROWS), so that in bf16 the weights round
 * relative to the same running max on both backends. */
enum { ATT_ROWS = 32, ATT_KEYS = FLASH_ROWS, ATT_TILE = ATT_ROWS * ATT_KEYS };

static int min_int(int a, int b) { return a < b ? a : b; }

AttentionBuffers cpu_attention_buffers(int B, int T, int C, int NH, DType products) {
    (void)C, (void)products;  /* the same tiles either way */
    AttentionBuffers sizes = { .saved = (size_t)B * NH * T, .scratch = 0 };
    return sizes;
}

/* One (batch row, head) bh: its q, k and v, columns of qkv with a row stride
 * of 3C, and whether its products round to bf16 (products = DTYPE_BF16). */
typedef struct {
    const float *q, *k, *v;
    int bh, T, C, hs, round_products, round_output;
    float scale;
    Dropout drop;
} Head;

static Head head_of(const float *qkv, int bh, int T, int C, int NH, Dropout drop, DType products,
                    DType rounding) {
    int b = bh / NH, h = bh % NH, hs = C / NH;
    const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
    Head hd = { .q = q, .k = q + C, .v = q + 2 * C, .bh = bh, .T = T, .C = C, .hs = hs,
                .round_products = products == DTYPE_BF16, .round_output = rounding == DTYPE_BF16,
                .scale = 1.0f / sqrtf((float)hs), .drop = dropout_resolved(drop) };
    return hd;
}

/* x[0 .. n) rounded to bf16 in place, where `rounds`. */
static void rounded_values(int rounds, float *x, int n) {
    if (!rounds) return;
    for (int j = 0; j < n; j++) x[j] = bf16_rounded(x[j]);
}

/* The same where the head's products round. */
static void product_values(const Head *hd, float *x, int n) { rounded_values(hd->round_products, x, n); }

/* How many keys of the tile starting at key c0 (of `keys`) row t sees. */
static int visible_keys(int t, int c0, int keys) { return min_int(keys, t - c0 + 1); }

/* tile[i, j] = scale * q[r0 + i] . k[c0 + j], rows x keys, row stride ATT_KEYS. */
static void tile_scores(const Head *hd, int r0, int rows, int c0, int keys, float *tile) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd->hs, hd->scale,
                hd->q + (size_t)r0 * 3 * hd->C, 3 * hd->C, hd->k + (size_t)c0 * 3 * hd->C, 3 * hd->C,
                0.0f, tile, ATT_KEYS);
}

/* mask[j] = the dropout scale of row t's key c0 + j, j < n. */
static void tile_row_mask(const Head *hd, int t, int c0, int n, float *mask) {
    dropout_scales(hd->drop, attention_mask_index(hd->bh, hd->T, t, c0), (size_t)n, mask);
}

/* One row of a forward tile: the scores become exp(score - new max) (0 past
 * the causal edge), the running max and sum move on, and the output row kept
 * so far is rescaled to the new max (not on the first key block: nothing kept). */
static void forward_tile_row(float *row, int n, int keys, float *max, float *sum, float *y, int hs, int first) {
    float row_max = row[0];
    #pragma omp simd reduction(max : row_max)
    for (int j = 1; j < n; j++) row_max = row[j] > row_max ? row[j] : row_max;
    float new_max = first || row_max > *max ? row_max : *max;
    float row_sum = 0.0f;
    #pragma omp simd reduction(+ : row_sum)
    for (int j = 0; j < n; j++) { row[j] = expf(row[j] - new_max); row_sum += row[j]; }
    for (int j = n; j < keys; j++) row[j] = 0.0f;
    if (first) {
        *sum = row_sum;
    } else {
        float rescale = expf(*max - new_max);
        *sum = *sum * rescale + row_sum;
        for (int c = 0; c < hs; c++) y[c] *= rescale;
    }
    *max = new_max;
}

/* Query rows r0 .. r0 + rows - 1 of one head: y = dropout(softmax) @ v over
 * the key blocks they see, then lse = max + log(sum) per row. */
static void forward_query_block(const Head *hd, int r0, int rows, float *y, float *lse) {
    float tile[ATT_TILE], mask[ATT_KEYS], max[ATT_ROWS], sum[ATT_ROWS];
    int end = r0 + rows, C = hd->C, hs = hd->hs;
    for (int c0 = 0; c0 < end; c0 += ATT_KEYS) {
        int keys = min_int(ATT_KEYS, end - c0);
        tile_scores(hd, r0, rows, c0, keys, tile);
        for (int i = 0; i < rows; i++) {
            int t = r0 + i, n = visible_keys(t, c0, keys);
            float *row = tile + (size_t)i * ATT_KEYS;
            forward_tile_row(row, n, keys, &max[i], &sum[i], y + (size_t)i * C, hs, c0 == 0);
            if (hd->drop.p > 0.0f) {
                tile_row_mask(hd, t, c0, n, mask);
                for (int j = 0; j < n; j++) row[j] *= mask[j];
            }
            product_values(hd, row, n);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys, 1.0f, tile, ATT_KEYS,
                    hd->v + (size_t)c0 * 3 * C, 3 * C, c0 == 0 ? 0.0f : 1.0f, y, C);
    }
    for (int i = 0; i < rows; i++) {
        float inv = 1.0f / sum[i];
        for (int c = 0; c < hs; c++) y[(size_t)i * C + c] *= inv;
        rounded_values(hd->round_output, y + (size_t)i * C, hs);
        lse[i] = max[i] + logf(sum[i]);
    }
}

typedef struct {
    float *out, *lse;
    const float *qkv;
    int B, T, C, NH;
    Dropout drop;
    DType products, rounding;
} AttentionArgs;

static void attention_forward_task(void *p) {
    AttentionArgs *a = p;
    int B = a->B, T = a->T, C = a->C, NH = a->NH;
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        Head hd = head_of(a->qkv, bh, T, C, NH, a->drop, a->products, a->rounding);
        float *y = a->out + (size_t)(bh / NH) * T * C + (size_t)(bh % NH) * hd.hs;
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS)
            forward_query_block(&hd, r0, min_int(ATT_ROWS, T - r0), y + (size_t)r0 * C,
                                a->lse + (size_t)bh * T + r0);
    }
}

/* Where q, k, v (3n numbers) or the output (n) are held in bf16, the room
 * for both, grown before either is placed in it: a room that grows moves.
 * q, k, v are widened at its start, the output made or widened past them. */
static void attention_room(Stream *s, DType qkv_held, DType out_held, size_t n) {
    if (qkv_held == DTYPE_BF16 || out_held == DTYPE_BF16) cpu_stream_room(s, 4 * n);
}

/* The backward's: q, k, v (3n) and the output (n) widened, then the output's
 * gradient (n) and dqkv made in fp32 (3n): all, before any, as a room that
 * grows moves. */
static void attention_backward_room(Stream *s, DType qkv_held, DType out_held, DType dout_held, DType dqkv_held,
                                    size_t n) {
    int held = qkv_held == DTYPE_BF16 || out_held == DTYPE_BF16 || dout_held == DTYPE_BF16 || dqkv_held == DTYPE_BF16;
    if (held) cpu_stream_room(s, 8 * n);
}

void cpu_attention_forward(Stream *s, Buf out, float *saved, float *scratch, ConstBuf qkv,
                           int B, int T, int C, int NH, Dropout drop, DType products, DType rounding) {
    (void)scratch;  /* the tiles are on each thread's stack */
    size_t n = (size_t)B * T * C;  /* out's numbers; qkv's are 3n */
    attention_room(s, qkv.dtype, out.dtype, n);
    const float *x = cpu_fp32_of(s, qkv, 3 * n, 0);
    AttentionArgs a = { cpu_fp32_for(s, out, n, 3 * n), saved, x, B, T, C, NH, drop, products, rounding };
    stream_launch(s, attention_forward_task, &a, sizeof a);
    cpu_store_output(s, out, a.out, n);
}

/* One head's gradient rows, q's, k's and v's (stride 3C), and the output's
 * gradient dy and the output y (stride C). */
typedef struct {
    float *dq, *dk, *dv;
    const float *dy, *y, *lse;
} HeadGrads;

/* The tile's probabilities again: exp(score - lse) up to the causal edge, 0 past it. */
static void tile_probabilities(const Head *hd, int r0, int rows, int c0, int keys, const float *lse,
                               float *tile) {
    tile_scores(hd, r0, rows, c0, keys, tile);
    for (int i = 0; i < rows; i++) {
        int n = visible_keys(r0 + i, c0, keys);
        float *row = tile + (size_t)i * ATT_KEYS, row_lse = lse[r0 + i];
        #pragma omp simd
        for (int j = 0; j < n; j++) row[j] = expf(row[j] - row_lse);
        for (int j = n; j < keys; j++) row[j] = 0.0f;
    }
}

/* Through the tile's dropout: dweights (dy @ v^T) becomes the probabilities'
 * gradient (times the mask), and weights the dropped probabilities, rounded
 * as the forward's were. Returns the weights the forward multiplied v by:
 * weights, or probs where neither dropout nor rounding changed them. */
static const float *tile_dropout_backward(const Head *hd, int r0, int rows, int c0, int keys,
                                          const float *probs, float *dweights, float *weights) {
    if (hd->drop.p == 0.0f && !hd->round_products) return probs;
    for (int i = 0; i < rows; i++) {
        int n = visible_keys(r0 + i, c0, keys);
        float *w = weights + (size_t)i * ATT_KEYS, *dw = dweights + (size_t)i * ATT_KEYS;
        const float *pr = probs + (size_t)i * ATT_KEYS;
        if (hd->drop.p > 0.0f) {
            tile_row_mask(hd, r0 + i, c0, n, w);
            for (int j = 0; j < n; j++) { dw[j] *= w[j]; w[j] *= pr[j]; }
        } else {
            for (int j = 0; j < n; j++) w[j] = pr[j];
        }
        product_values(hd, w, n);
        for (int j = n; j < keys; j++) w[j] = 0.0f;
    }
    return weights;
}

/* dscores = probs * (dprobs - delta), in place of probs (0 past the causal
 * edge stays 0), rounded to bf16 where the head's products round. */
static void tile_dscores(const Head *hd, int r0, int rows, int c0, int keys, const float *delta, float *probs,
                         const float *dprobs) {
    for (int i = 0; i < rows; i++) {
        int n = visible_keys(r0 + i, c0, keys);
        float *pr = probs + (size_t)i * ATT_KEYS;
        const float *dp = dprobs + (size_t)i * ATT_KEYS;
        float d = delta[i];
        #pragma omp simd
        for (int j = 0; j < n; j++) pr[j] *= dp[j] - d;
        product_values(hd, pr, n);
    }
}

/* Query rows r0 .. r0 + rows - 1 of one head: their dq, and their parts of dk
 * and dv, over the key blocks they see. delta[i] = dy[t] . y[t] is the row's
 * sum of probabilities times their gradients, as the softmax's backward needs. */
static void backward_query_block(const Head *hd, const HeadGrads *g, int r0, int rows) {
    float probs[ATT_TILE], dprobs[ATT_TILE], weights[ATT_TILE], delta[ATT_ROWS];
    int end = r0 + rows, C = hd->C, hs = hd->hs;
    const float *dy = g->dy + (size_t)r0 * C;
    for (int i = 0; i < rows; i++) {
        const float *dyr = dy + (size_t)i * C, *yr = g->y + (size_t)(r0 + i) * C;
        float d = 0.0f;
        #pragma omp simd reduction(+ : d)
        for (int c = 0; c < hs; c++) d += dyr[c] * yr[c];
        delta[i] = d;
    }
    for (int c0 = 0; c0 < end; c0 += ATT_KEYS) {
        int keys = min_int(ATT_KEYS, end - c0);
        size_t key_rows = (size_t)c0 * 3 * C;
        tile_probabilities(hd, r0, rows, c0, keys, g->lse, probs);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hs, 1.0f, dy, C,
                    hd->v + key_rows, 3 * C, 0.0f, dprobs, ATT_KEYS);
        const float *kept = tile_dropout_backward(hd, r0, rows, c0, keys, probs, dprobs, weights);
        /* dv += kept^T @ dy */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, rows, 1.0f, kept, ATT_KEYS, dy, C,
                    1.0f, g->dv + key_rows, 3 * C);
        tile_dscores(hd, r0, rows, c0, keys, delta, probs, dprobs);
        /* dq += scale * dscores @ k;  dk += scale * dscores^T @ q */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, keys, hd->scale, probs, ATT_KEYS,
                    hd->k + key_rows, 3 * C, 1.0f, g->dq + (size_t)r0 * 3 * C, 3 * C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, hs, rows, hd->scale, probs, ATT_KEYS,
                    hd->q + (size_t)r0 * 3 * C, 3 * C, 1.0f, g->dk + key_rows, 3 * C);
    }
}

/* x[t, 0 .. hs) = 0 for the T rows of a head's columns of qkv (stride 3C). */
static void zero_head_columns(float *x, int T, int C, int hs) {
    for (int t = 0; t < T; t++)
        for (int c = 0; c < hs; c++) x[(size_t)t * 3 * C + c] = 0.0f;
}

/* The same rows rounded to bf16, where the head's output rounds. */
static void round_head_columns(const Head *hd, float *x, int T, int C) {
    for (int t = 0; t < T; t++) rounded_values(hd->round_output, x + (size_t)t * 3 * C, hd->hs);
}

typedef struct {
    float *dqkv;
    const float *dout, *qkv, *out, *lse;
    int B, T, C, NH;
    Dropout drop;
    DType products, rounding;
} AttentionBackwardArgs;

static void attention_backward_task(void *p) {
    AttentionBackwardArgs *a = p;
    int B = a->B, T = a->T, C = a->C, NH = a->NH;
    #pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * NH; bh++) {
        Head hd = head_of(a->qkv, bh, T, C, NH, a->drop, a->products, a->rounding);
        float *dq = a->dqkv + (hd.q - a->qkv);
        size_t rows_at = (size_t)(bh / NH) * T * C + (size_t)(bh % NH) * hd.hs;
        HeadGrads g = { dq, dq + C, dq + 2 * C, a->dout + rows_at, a->out + rows_at, a->lse + (size_t)bh * T };
        /* every tile adds into the head's gradients, which start at 0 */
        zero_head_columns(g.dq, T, C, hd.hs);
        zero_head_columns(g.dk, T, C, hd.hs);
        zero_head_columns(g.dv, T, C, hd.hs);
        for (int r0 = 0; r0 < T; r0 += ATT_ROWS) backward_query_block(&hd, &g, r0, min_int(ATT_ROWS, T - r0));
        round_head_columns(&hd, g.dq, T, C);
        round_head_columns(&hd, g.dk, T, C);
        round_head_columns(&hd, g.dv, T, C);
    }
}

void cpu_attention_backward(Stream *s, Buf dqkv, float *scratch, ConstBuf dout,
                            ConstBuf qkv, ConstBuf out, const float *saved, int B, int T, int C,
                            int NH, Dropout drop, DType products, DType rounding) {
    (void)scratch;  /* the tiles are on each thread's stack */
    size_t n = (size_t)B * T * C;  /* out's numbers; qkv's are 3n, widened first */
    attention_backward_room(s, qkv.dtype, out.dtype, dout.dtype, dqkv.dtype, n);
    AttentionBackwardArgs a = { cpu_fp32_for(s, dqkv, 3 * n, 5 * n), cpu_fp32_of(s, dout, n, 4 * n),
                                cpu_fp32_of(s, qkv, 3 * n, 0), cpu_fp32_of(s, out, n, 3 * n), saved,
                                B, T, C, NH, drop, products, rounding };
    stream_launch(s, attention_backward_task, &a, sizeof a);
    cpu_store_output(s, dqkv, a.dqkv, 3 * n);
}
