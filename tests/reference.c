/* reference.c: the double-precision reference of reference.h. */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/attention_tiles.h"
#include "../kernels/dropout.h"
#include "../model/models.h"

void ref_embedding(double *out, const int *tokens, const double *wte, const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] = wte[(size_t)tokens[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

void ref_layernorm(double *out, const double *inp, const double *weight, int N, int C) {
    for (int i = 0; i < N; i++) {
        const double *x = inp + (size_t)i * C;
        double mean = 0, var = 0;
        for (int c = 0; c < C; c++) mean += x[c];
        mean /= C;
        for (int c = 0; c < C; c++) var += (x[c] - mean) * (x[c] - mean);
        var /= C;
        for (int c = 0; c < C; c++) out[(size_t)i * C + c] = (x[c] - mean) / sqrt(var + 1e-5) * weight[c];
    }
}

void ref_matmul(double *out, const double *inp, const double *weight, int N, int C, int OC) {
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double acc = 0;
            for (int c = 0; c < C; c++) acc += inp[(size_t)i * C + c] * weight[(size_t)o * C + c];
            out[(size_t)i * OC + o] = acc;
        }
}

void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int C, int NH, Dropout drop) {
    int hs = C / NH;
    double *w = malloc(sizeof(double) * T);
    float *mask = malloc(sizeof(float) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double maxval = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int d = 0; d < hs; d++) dot += q[d] * k[d];
                    w[j] = dot / sqrt((double)hs);
                    if (w[j] > maxval) maxval = w[j];
                }
                for (int j = 0; j <= t; j++) { w[j] = exp(w[j] - maxval); sum += w[j]; }
                if (lse) lse[((size_t)b * NH + h) * T + t] = maxval + log(sum);
                if (drop.p > 0) dropout_scales(drop, (((size_t)b * NH + h) * T + t) * T, (size_t)T, mask);
                for (int d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int j = 0; j <= t; j++) {
                        const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                        acc += w[j] / sum * (drop.p > 0 ? mask[j] : 1.0) * v[d];
                    }
                    out[((size_t)b * T + t) * C + h * hs + d] = acc;
                }
            }
    free(w);
    free(mask);
}

/* x rounded to bf16 (through fp32, as the ops hold it). */
static double bf16_of(double x) { return bf16_rounded((float)x); }

void ref_attention_bf16(double *out, double *dqkv, const double *qkv, const double *dout, int B, int T, int C,
                        int NH, Dropout drop) {
    int hs = C / NH;
    double scale = 1.0 / sqrt((double)hs);
    double *s = malloc(sizeof(double) * T), *running = malloc(sizeof(double) * T), *lse = malloc(sizeof(double) * T);
    float *mask = malloc(sizeof(float) * T);
    memset(dqkv, 0, sizeof(double) * B * T * 3 * C);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double *head = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
            double *dhead = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
            size_t bh = (size_t)b * NH + h;
            /* forward, row by row; each row's lse kept for the backward */
            for (int t = 0; t < T; t++) {
                const double *q = head + (size_t)t * 3 * C;
                double maxval = -INFINITY, sum = 0;
                for (int j = 0; j <= t; j++) {
                    double dot = 0;
                    for (int d = 0; d < hs; d++) dot += q[d] * head[(size_t)j * 3 * C + C + d];
                    s[j] = dot * scale;
                }
                for (int j = 0; j <= t; j++) {
                    if (j % FLASH_ROWS == 0)  /* a key block: the running max takes in its keys */
                        for (int i = j; i <= t && i < j + FLASH_ROWS; i++) maxval = fmax(maxval, s[i]);
                    running[j] = maxval;
                }
                for (int j = 0; j <= t; j++) sum += exp(s[j] - maxval);
                lse[t] = maxval + log(sum);
                for (int j = 0; j <= t; j++) mask[j] = 1.0f;
                if (drop.p > 0) dropout_scales(drop, attention_mask_index((int)bh, T, t, 0), (size_t)t + 1, mask);
                double *y = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) y[d] = 0;
                for (int j = 0; j <= t; j++) {
                    double w = bf16_of(exp(s[j] - running[j]) * mask[j]) * exp(running[j] - maxval) / sum;
                    for (int d = 0; d < hs; d++) y[d] += w * head[(size_t)j * 3 * C + 2 * C + d];
                }
            }
            /* backward, row by row: each row's dq, and its parts of dk and dv */
            for (int t = 0; t < T; t++) {
                const double *q = head + (size_t)t * 3 * C;
                const double *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const double *y = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                double delta = 0;
                for (int d = 0; d < hs; d++) delta += dy[d] * y[d];
                for (int j = 0; j <= t; j++) mask[j] = 1.0f;
                if (drop.p > 0) dropout_scales(drop, attention_mask_index((int)bh, T, t, 0), (size_t)t + 1, mask);
                for (int j = 0; j <= t; j++) {
                    const double *k = head + (size_t)j * 3 * C + C, *v = k + C;
                    double dot = 0, dp = 0;
                    for (int d = 0; d < hs; d++) {
                        dot += q[d] * k[d];
                        dp += dy[d] * v[d];
                    }
                    double p = exp(dot * scale - lse[t]);
                    double w = bf16_of(p * mask[j]), ds = bf16_of(p * (dp * mask[j] - delta));
                    double *dq = dhead + (size_t)t * 3 * C, *dk = dhead + (size_t)j * 3 * C + C, *dv = dk + C;
                    for (int d = 0; d < hs; d++) {
                        dv[d] += w * dy[d];
                        dq[d] += scale * ds * k[d];
                        dk[d] += scale * ds * q[d];
                    }
                }
            }
        }
    free(s); free(running); free(lse); free(mask);
}

void ref_gelu(double *out, const double *inp, size_t n, int tanh_form) {
    for (size_t i = 0; i < n; i++) {
        double x = inp[i];
        out[i] = tanh_form ? 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))
                           : 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    }
}

void ref_dropout(double *out, const double *inp, size_t n, Dropout drop) {
    float *mask = malloc(sizeof(float) * (n ? n : 1));
    dropout_scales(drop, 0, n, mask);
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * mask[i];
    free(mask);
}

double ref_crossentropy_row(const double *logit, int target, int V, double *dlogit) {
    double maxval = logit[0], sum = 0;
    for (int j = 1; j < V; j++) if (logit[j] > maxval) maxval = logit[j];
    for (int j = 0; j < V; j++) sum += exp(logit[j] - maxval);
    for (int j = 0; dlogit && j < V; j++) dlogit[j] = exp(logit[j] - maxval) / sum - (j == target ? 1.0 : 0.0);
    return log(sum) - (logit[target] - maxval);
}

/* 1 at bit `bit` of words, carried up */
static void add_bit(uint64_t words[4], int bit) {
    for (int w = bit / 64; w < 4; w++) {
        uint64_t one = w == bit / 64 ? 1ull << (bit % 64) : 1;
        words[w] += one;
        if (words[w] >= one) return;  /* no carry out of this word */
    }
}

SquareSum ref_square_sum(const float *x, size_t n) {
    SquareSum sum = { { 0, 0, 0, 0 } };
    uint64_t *words = sum.word;
    for (size_t i = 0; i < n; i++) {
        float square = x[i] * x[i];
        if (!isfinite(square)) return (SquareSum){ { 0, 0, 0, 1ull << 63 } };
        if (square < 0x1p-63f) continue;
        int exponent;
        float fraction = frexpf(square, &exponent);  /* square = fraction * 2^exponent, fraction in [0.5, 1) */
        uint32_t mantissa = (uint32_t)ldexpf(fraction, 24);
        for (int b = 0; b < 24; b++)
            if (mantissa >> b & 1) add_bit(words, exponent - 24 + 86 + b);
    }
    return sum;
}

double ref_crossentropy(const double *logits, const int *targets, int N, int V) {
    double total = 0;
    for (int i = 0; i < N; i++) total += ref_crossentropy_row(logits + (size_t)i * V, targets[i], V, NULL);
    return total / N;
}

/* The tensor named by fmt (with layer l) in a double arena. */
static const double *param(const ArenaLayout *layout, const double *params, const char *fmt, int l) {
    char name[ARENA_NAME_MAX];
    snprintf(name, sizeof name, fmt, l);
    return params + layout->tensors[arena_find(layout, name)].offset;
}

/* out[N,OC] += the bias of that name, where the layout has one (a model with biases). */
static void add_bias(double *out, const ArenaLayout *layout, const double *params, const char *fmt, int l, size_t N,
                     int OC) {
    char name[ARENA_NAME_MAX];
    snprintf(name, sizeof name, fmt, l);
    if (arena_find(layout, name) < 0) return;
    const double *b = params + layout->tensors[arena_find(layout, name)].offset;
    for (size_t n = 0; n < N; n++)
        for (int c = 0; c < OC; c++) out[n * OC + c] += b[c];
}

/* drop at one site */
static Dropout at_site(Dropout drop, uint32_t site) {
    drop.site = site;
    return drop;
}

double ref_gpt_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                    const int *tokens, const int *targets, int B, int T, Dropout drop) {
    int C = cfg->embd, NH = cfg->heads, V = cfg->vocab;
    size_t BT = (size_t)B * T;
    double *x = malloc(sizeof(double) * BT * C), *ln = malloc(sizeof(double) * BT * C);
    double *qkv = malloc(sizeof(double) * BT * 3 * C), *y = malloc(sizeof(double) * BT * C);
    double *proj = malloc(sizeof(double) * BT * C), *fc = malloc(sizeof(double) * BT * 4 * C);
    double *act = malloc(sizeof(double) * BT * 4 * C), *logits = malloc(sizeof(double) * BT * V);
    ref_embedding(x, tokens, param(layout, params, "transformer.wte.weight", 0), param(layout, params, "transformer.wpe.weight", 0), B, T, C);
    ref_dropout(x, x, BT * C, at_site(drop, 0));
    for (int l = 0; l < cfg->layers; l++) {
        ref_layernorm(ln, x, param(layout, params, "transformer.h.%d.ln_1.weight", l), BT, C);
        add_bias(ln, layout, params, "transformer.h.%d.ln_1.bias", l, BT, C);
        ref_matmul(qkv, ln, param(layout, params, "transformer.h.%d.attn.c_attn.weight", l), BT, C, 3 * C);
        add_bias(qkv, layout, params, "transformer.h.%d.attn.c_attn.bias", l, BT, 3 * C);
        uint32_t site = 1 + 3 * (uint32_t)l;
        ref_attention(y, NULL, qkv, B, T, C, NH, at_site(drop, site));
        ref_matmul(proj, y, param(layout, params, "transformer.h.%d.attn.c_proj.weight", l), BT, C, C);
        add_bias(proj, layout, params, "transformer.h.%d.attn.c_proj.bias", l, BT, C);
        ref_dropout(proj, proj, BT * C, at_site(drop, site + 1));
        for (size_t i = 0; i < BT * C; i++) x[i] += proj[i];
        ref_layernorm(ln, x, param(layout, params, "transformer.h.%d.ln_2.weight", l), BT, C);
        add_bias(ln, layout, params, "transformer.h.%d.ln_2.bias", l, BT, C);
        ref_matmul(fc, ln, param(layout, params, "transformer.h.%d.mlp.c_fc.weight", l), BT, C, 4 * C);
        add_bias(fc, layout, params, "transformer.h.%d.mlp.c_fc.bias", l, BT, 4 * C);
        ref_gelu(act, fc, BT * 4 * C, cfg->gelu_tanh);
        ref_matmul(proj, act, param(layout, params, "transformer.h.%d.mlp.c_proj.weight", l), BT, 4 * C, C);
        add_bias(proj, layout, params, "transformer.h.%d.mlp.c_proj.bias", l, BT, C);
        ref_dropout(proj, proj, BT * C, at_site(drop, site + 2));
        for (size_t i = 0; i < BT * C; i++) x[i] += proj[i];
    }
    ref_layernorm(ln, x, param(layout, params, "transformer.ln_f.weight", 0), BT, C);
    add_bias(ln, layout, params, "transformer.ln_f.bias", 0, BT, C);
    ref_matmul(logits, ln, param(layout, params, "transformer.wte.weight", 0), BT, C, V);
    double loss = ref_crossentropy(logits, targets, BT, V);
    free(x); free(ln); free(qkv); free(y); free(proj); free(fc); free(act); free(logits);
    return loss;
}

static double ref_mlp_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                           const int *tokens, const int *targets, int B, int T) {
    int C = cfg->embd, V = cfg->vocab;
    size_t BT = (size_t)B * T;
    double *x = malloc(sizeof(double) * BT * C), *ln = malloc(sizeof(double) * BT * C);
    double *h = malloc(sizeof(double) * BT * C), *logits = malloc(sizeof(double) * BT * V);
    ref_embedding(x, tokens, param(layout, params, "transformer.wte.weight", 0),
                  param(layout, params, "transformer.wpe.weight", 0), B, T, C);
    for (int l = 0; l < cfg->layers; l++) {
        ref_layernorm(ln, x, param(layout, params, "layers.%d.ln.weight", l), BT, C);
        ref_matmul(h, ln, param(layout, params, "layers.%d.fc.weight", l), BT, C, C);
        ref_gelu(h, h, BT * C, 0);
        for (size_t i = 0; i < BT * C; i++) x[i] += h[i];
    }
    ref_matmul(logits, x, param(layout, params, "transformer.wte.weight", 0), BT, C, V);
    double loss = ref_crossentropy(logits, targets, BT, V);
    free(x); free(ln); free(h); free(logits);
    return loss;
}

double ref_model_loss(const ModelConfig *cfg, const ArenaLayout *layout, const double *params,
                      const int *tokens, const int *targets, int B, int T, Dropout drop) {
    if (cfg->kind == MODEL_MLP) return ref_mlp_loss(cfg, layout, params, tokens, targets, B, T);
    return ref_gpt_loss(cfg, layout, params, tokens, targets, B, T, drop);
}
