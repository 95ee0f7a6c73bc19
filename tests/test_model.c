/* test_model.c: the whole models: the GPT's and the MLP's gradients against
 * finite differences of the double reference, the GPT's loss at init, weight
 * files, and PyTorch's nanoGPT. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/data.h"
#include "../model/gpt.h"
#include "../model/models.h"
#include "../model/safetensors.h"
#include "../model/sample.h"
#include "fixtures.h"
#include "reference.h"

TestSuite(model, .init = test_stream_setup, .fini = test_stream_teardown);

/* Random weights large enough that every gradient is well above rounding. */
static void random_params(const ArenaLayout *layout, float *params, unsigned seed) {
    memset(params, 0, layout->total * sizeof(float));
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *t = &layout->tensors[i];
        if (t->ndim == 1) fill_uniform(params + t->offset, t->numel, 0.5f, 1.5f, seed + i);
        else fill_uniform(params + t->offset, t->numel, -0.3f, 0.3f, seed + i);
    }
}

/* Forward and backward of the float model on one batch; returns the loss. */
static float model_loss_and_grads(Model *m, const float *params, const int *x, const int *y, int B, int T,
                                  uint32_t step) {
    stream_copy(test_stream, m->params, params, m->layout.total * sizeof(float));
    fill_zero(test_stream, m->grads, m->layout.total);
    m->ops->forward(m, x, y, B, T, step, 1);
    m->ops->backward(m, 1.0f);
    return model_read_loss(m);
}

/* The float model's gradient against central differences of the double
 * reference, every tensor, with dropout p (the same masks on both sides). */
static void check_model_gradient(ModelKind kind, float p, int classifier_rows, int bias, int gelu_tanh) {
    ModelConfig cfg = { 7, 6, 2, 2, 8, kind, bias, gelu_tanh };  /* V, block, layers, heads, embd */
    int B = 2, T = 5;                    /* T below the block size on purpose */
    int x[10] = { 0, 3, 6, 2, 2, 5, 1, 4, 0, 6 }, y[10] = { 3, 6, 2, 2, 5, 1, 4, 0, 6, 1 };
    Dropout drop = { p, 11, 1, 5, 0, NULL };
    Model *m = test_model(&cfg, B, cfg.block_size);
    if (classifier_rows) ((GPT *)m)->classifier_rows = classifier_rows;
    m->dropout = p;
    m->seed = drop.seed;
    m->rank = drop.rank;
    size_t P = m->layout.total;
    float *params = malloc(P * sizeof(float)), *grads = malloc(P * sizeof(float));
    random_params(&m->layout, params, 100);
    float loss = model_loss_and_grads(m, params, x, y, B, T, drop.step);
    stream_copy(test_stream, grads, m->grads, P * sizeof(float));
    stream_synchronize(test_stream);

    double *dparams = to_double(params, P);
    double want = ref_model_loss(&cfg, &m->layout, dparams, x, y, B, T, drop);
    cr_expect(fabs(loss - want) < 1e-5 * want, "p=%g: loss %.8g, reference %.8g", p, loss, want);

    double *num = malloc(P * sizeof(double));
    const double h = 1e-5;
    for (size_t i = 0; i < P; i++) {
        double saved = dparams[i];
        dparams[i] = saved + h;
        double plus = ref_model_loss(&cfg, &m->layout, dparams, x, y, B, T, drop);
        dparams[i] = saved - h;
        double minus = ref_model_loss(&cfg, &m->layout, dparams, x, y, B, T, drop);
        dparams[i] = saved;
        num[i] = (plus - minus) / (2 * h);
    }
    /* per tensor, so a small tensor's error is not hidden by a large one's scale */
    for (int i = 0; i < m->layout.ntensors; i++) {
        const TensorSpec *t = &m->layout.tensors[i];
        double err = rel_error(grads + t->offset, num + t->offset, t->numel);
        cr_expect_lt(err, 1e-4, "p=%g: %s: relative error %g", p, t->name, err);
    }
    model_destroy(m);
    free(params); free(grads); free(dparams); free(num);
}

Test(model, gradient_matches_finite_differences) { check_model_gradient(MODEL_GPT, 0.0f, 0, 0, 0); }
Test(model, gradient_with_dropout_matches_finite_differences) { check_model_gradient(MODEL_GPT, 0.2f, 0, 0, 0); }
Test(model, mlp_gradient_matches_finite_differences) { check_model_gradient(MODEL_MLP, 0.0f, 0, 0, 0); }
/* the classifier in chunks of 3 of the 10 rows (3, 3, 3, then 1) */
Test(model, gradient_with_the_classifier_in_chunks_matches_finite_differences) {
    check_model_gradient(MODEL_GPT, 0.0f, 3, 0, 0);
}
/* The head runs once a training step, in the backward: the step's loss (no
 * dropout) is an evaluation's bits, in one chunk and in chunks of 3 (3, 3, 3,
 * then 1), in fp32 and bf16, and a training forward alone leaves the loss to it. */
Test(model, a_training_steps_loss_is_an_evaluations_bits) {
    ModelConfig cfg = { 7, 6, 2, 2, 8, MODEL_GPT, 1, 0 };
    int B = 2, T = 5;
    int x[10] = { 0, 3, 6, 2, 2, 5, 1, 4, 0, 6 }, y[10] = { 3, 6, 2, 2, 5, 1, 4, 0, 6, 1 };
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        ArenaLayout layout;
        model_layout(&cfg, 1, &layout);
        ComputePolicy compute = { .precision = bf16 ? DTYPE_BF16 : DTYPE_FP32 };
        Model *m = model_create(&cfg, &layout, compute, test_device, test_stream, B, cfg.block_size);
        model_own_weights(m);
        model_own_grads(m);
        float *params = malloc(layout.total * sizeof(float));
        random_params(&layout, params, 100);
        stream_copy(test_stream, m->params, params, layout.total * sizeof(float));
        const int chunk_rows[2] = { 10, 3 };
        for (int c = 0; c < 2; c++) {
            int rows = chunk_rows[c];
            ((GPT *)m)->classifier_rows = rows;
            m->ops->forward(m, x, y, B, T, 0, 0);
            float evaluated = model_read_loss(m);
            fill_zero(test_stream, m->mean_loss, 1);
            fill_zero(test_stream, m->grads, layout.total);
            m->ops->forward(m, x, y, B, T, 0, 1);
            cr_expect_eq(model_read_loss(m), 0.0f, "a training forward took the loss (bf16 %d)", bf16);
            m->ops->backward(m, 1.0f);
            float trained = model_read_loss(m);
            cr_expect_eq(memcmp(&trained, &evaluated, sizeof trained), 0, "rows %d, bf16 %d: loss %.9g, evaluated %.9g",
                         rows, bf16, trained, evaluated);
        }
        model_destroy(m);
        free(params);
    }
}

/* GPT-2's biases, every Linear's and LayerNorm's, with dropout */
Test(model, gradient_with_biases_matches_finite_differences) { check_model_gradient(MODEL_GPT, 0.2f, 0, 1, 0); }
/* GPT-2's whole form: biases and GELU's tanh approximation */
Test(model, gradient_in_gpt2_form_matches_finite_differences) { check_model_gradient(MODEL_GPT, 0.0f, 0, 1, 1); }

Test(model, loss_at_init_is_log_vocab) {
    Dataset data;
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 64, err, sizeof err), 0, "%s", err);
    cr_assert_eq(data.vocab, 65);
    ModelConfig cfg = { data.vocab, 64, 4, 4, 128, MODEL_GPT, 0, 0 };
    int B = 12, T = 64;
    GPT *m = (GPT *)test_model(&cfg, B, T);
    float *params = malloc(m->base.layout.total * sizeof(float));
    model_init_params(&cfg, &m->base.layout, 1337, params);
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, 1337, 0, 0, B, T, x, y);
    stream_copy(test_stream, m->base.params, params, m->base.layout.total * sizeof(float));
    gpt_forward(m, x, y, B, T, 0, 0);
    float loss = model_read_loss(&m->base);
    cr_expect(fabs(loss - log(65.0)) < 0.1, "loss at init %g, ln(65) = %g", loss, log(65.0));
    /* init statistics: a 2-D weight has std 0.02, a residual projection 0.02/sqrt(2L) */
    const TensorSpec *fc = &m->base.layout.tensors[arena_find(&m->base.layout, "transformer.h.0.mlp.c_fc.weight")];
    const TensorSpec *proj = &m->base.layout.tensors[arena_find(&m->base.layout, "transformer.h.0.mlp.c_proj.weight")];
    double s_fc = 0, s_proj = 0;
    for (size_t i = 0; i < fc->numel; i++) s_fc += (double)params[fc->offset + i] * params[fc->offset + i];
    for (size_t i = 0; i < proj->numel; i++) s_proj += (double)params[proj->offset + i] * params[proj->offset + i];
    cr_expect(fabs(sqrt(s_fc / fc->numel) - 0.02) < 0.001, "c_fc std %g", sqrt(s_fc / fc->numel));
    cr_expect(fabs(sqrt(s_proj / proj->numel) - 0.02 / sqrt(8.0)) < 0.0005, "c_proj std %g", sqrt(s_proj / proj->numel));
    model_destroy(&m->base);
    dataset_free(&data);
    free(params); free(x); free(y);
}

Test(model, dataset_splits_and_batches) {
    Dataset data;
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 8, err, sizeof err), 0, "%s", err);
    cr_expect_eq(data.len[SPLIT_TRAIN] + data.len[SPLIT_VAL], 1115394);
    cr_expect_eq(data.len[SPLIT_TRAIN], 1003854);  /* nanoGPT's int(0.9 * n) */
    for (int v = 1; v < data.vocab; v++) cr_expect_lt(data.itos[v - 1], data.itos[v], "vocabulary is sorted");
    int x[4 * 8], y[4 * 8], x2[2 * 8], y2[2 * 8];
    test_batch(&data, SPLIT_VAL, BATCH_TRAIN, 5, 3, 0, 4, 8, x, y);
    for (int r = 0; r < 4; r++)
        for (int t = 0; t + 1 < 8; t++) cr_expect_eq(y[r * 8 + t], x[r * 8 + t + 1], "targets are the next tokens");
    /* rows depend on their global index only: rows 2..3 drawn alone are the same */
    test_batch(&data, SPLIT_VAL, BATCH_TRAIN, 5, 3, 2, 2, 8, x2, y2);
    cr_expect(memcmp(x + 16, x2, sizeof x2) == 0);
    dataset_free(&data);
}

Test(model, weights_round_trip_and_bad_files) {
    ModelConfig cfg = { 11, 8, 2, 2, 8, MODEL_GPT, 0, 0 };
    ArenaLayout layout;
    gpt_layout(&cfg, 1, &layout);
    float *params = malloc(layout.total * sizeof(float)), *back = calloc(layout.total, sizeof(float));
    random_params(&layout, params, 7);
    char dir[] = "/tmp/zf_weights_XXXXXX", path[256], err[512];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    cr_assert_eq(weights_save(path, &layout, params, err, sizeof err), 0, "%s", err);
    cr_assert_eq(weights_load(path, &layout, back, err, sizeof err), 0, "%s", err);
    cr_expect(memcmp(params, back, layout.total * sizeof(float)) == 0);

    /* a model of another shape: the error names the tensor and both shapes */
    ModelConfig wider = cfg;
    wider.embd = 16;
    ArenaLayout wide_layout;
    gpt_layout(&wider, 1, &wide_layout);
    float *wide = calloc(wide_layout.total, sizeof(float));
    cr_expect_neq(weights_load(path, &wide_layout, wide, err, sizeof err), 0);
    cr_expect(strstr(err, "transformer.wte.weight") && strstr(err, "shape"), "%s", err);

    /* truncated file */
    FILE *f = fopen(path, "r+b");
    cr_assert_not_null(f);
    cr_assert_eq(ftruncate(fileno(f), 100), 0);
    fclose(f);
    cr_expect_neq(weights_load(path, &layout, back, err, sizeof err), 0);
    cr_expect(strlen(err) > 0 && !strchr(err, '\n'), "one line: %s", err);
    unlink(path);
    cr_expect_neq(weights_load(path, &layout, back, err, sizeof err), 0);
    cr_expect(strstr(err, "cannot open") != NULL, "%s", err);
    rmdir(dir);
    free(params); free(back); free(wide);
}

/* ---- PyTorch's nanoGPT on the same weights and batch ---- */

/* Our loss and every gradient against nanoGPT's model in PyTorch (tests/torch_gpt.py), with or without biases. */
static void expect_pytorchs_gradients(int bias) {
    need_torch();
    Dataset data;
    char err[512];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
    ModelConfig cfg = { data.vocab, 32, 2, 4, 32, MODEL_GPT, bias, 0 };
    int B = 4, T = 32;
    GPT *m = (GPT *)test_model(&cfg, B, T);
    size_t P = m->base.layout.total;
    float *params = malloc(P * sizeof(float)), *grads = malloc(P * sizeof(float));
    random_params(&m->base.layout, params, 3);
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, 1, 0, 0, B, T, x, y);
    float loss = model_loss_and_grads(&m->base, params, x, y, B, T, 0);
    stream_copy(test_stream, grads, m->base.grads, P * sizeof(float));
    stream_synchronize(test_stream);

    char dir[] = "/tmp/zf_torch_XXXXXX", wpath[256], bpath[256], gpath[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(wpath, sizeof wpath, "%s/weights.safetensors", dir);
    snprintf(bpath, sizeof bpath, "%s/batch.safetensors", dir);
    snprintf(gpath, sizeof gpath, "%s/grads.safetensors", dir);
    cr_assert_eq(weights_save(wpath, &m->base.layout, params, err, sizeof err), 0, "%s", err);
    StTensor batch[2] = {
        { "x", "I32", 2, { B, T }, x },
        { "y", "I32", 2, { B, T }, y },
    };
    cr_assert_eq(safetensors_write(bpath, batch, 2, NULL, err, sizeof err), 0, "%s", err);
    char cmd[2048];
    torch_gpt_command(cmd, sizeof cmd, "grads --weights %s --batch %s --heads %d --out %s", wpath, bpath, cfg.heads,
                      gpath);
    cr_assert_eq(system(cmd), 0, "%s failed", cmd);

    StFile f;
    cr_assert_eq(safetensors_open(&f, gpath, err, sizeof err), 0, "%s", err);
    const float *torch_loss = safetensors_tensor(&f, "loss", "F32", 0, NULL, err, sizeof err);
    cr_assert_not_null(torch_loss, "%s", err);
    cr_expect(fabsf(loss - *torch_loss) < 1e-4f * *torch_loss, "loss %.7g, PyTorch %.7g", loss, *torch_loss);
    for (int i = 0; i < m->base.layout.ntensors; i++) {
        const TensorSpec *t = &m->base.layout.tensors[i];
        int64_t shape[2] = { t->shape[0], t->shape[1] };
        const float *want = safetensors_tensor(&f, t->name, "F32", t->ndim, shape, err, sizeof err);
        cr_assert_not_null(want, "%s", err);
        double *wd = to_double(want, t->numel);
        double e = rel_error(grads + t->offset, wd, t->numel);
        cr_expect_lt(e, 1e-4, "%s: relative error %g against PyTorch", t->name, e);
        free(wd);
    }
    safetensors_close(&f);
    unlink(wpath); unlink(bpath); unlink(gpath); rmdir(dir);
    model_destroy(&m->base);
    dataset_free(&data);
    free(params); free(grads); free(x); free(y);
}

Test(model, matches_pytorch_nanogpt) { expect_pytorchs_gradients(0); }
Test(model, matches_pytorch_nanogpt_with_gpt2s_biases) { expect_pytorchs_gradients(1); }

Test(model, generation_is_deterministic_and_in_vocabulary) {
    ModelConfig cfg = { 11, 8, 2, 2, 8, MODEL_GPT, 0, 0 };
    GPT *m = (GPT *)test_model(&cfg, 1, cfg.block_size);
    float *params = malloc(m->base.layout.total * sizeof(float));
    random_params(&m->base.layout, params, 9);
    stream_copy(test_stream, m->base.params, params, m->base.layout.total * sizeof(float));
    int a[20] = { 3 }, b[20] = { 3 }, c[20] = { 3 };
    gpt_generate(m, a, 1, 19, (Sampling){ 1.0f, 0, 5, 0 });  /* longer than the block: the window slides */
    gpt_generate(m, b, 1, 19, (Sampling){ 1.0f, 0, 5, 0 });
    gpt_generate(m, c, 1, 19, (Sampling){ 1.0f, 0, 6, 0 });
    cr_expect(memcmp(a, b, sizeof a) == 0, "the same seed samples the same text");
    cr_expect(memcmp(a, c, sizeof a) != 0, "another seed samples other text");
    cr_expect_eq(a[0], 3, "the prompt is kept");
    for (int i = 0; i < 20; i++) cr_expect(a[i] >= 0 && a[i] < cfg.vocab, "token %d out of range", a[i]);
    model_destroy(&m->base);
    free(params);
}

/* A padded vocabulary (--pad-vocab, or GPT-2's 50257 in 50304): ids past the
 * data's are never drawn, even where the temperature makes every id about as
 * likely; and top-k of 1 is the argmax over the data's ids. */
Test(model, sampling_never_draws_the_padding_and_top_1_is_the_argmax) {
    ModelConfig cfg = { 11, 8, 2, 2, 8, MODEL_GPT, 1, 1 };
    int data_vocab = 7;
    GPT *m = (GPT *)test_model(&cfg, 1, cfg.block_size);
    float *params = malloc(m->base.layout.total * sizeof(float));
    random_params(&m->base.layout, params, 9);
    stream_copy(test_stream, m->base.params, params, m->base.layout.total * sizeof(float));
    int hot[40] = { 3 }, all[40] = { 3 }, greedy[8] = { 3 };
    gpt_generate(m, hot, 1, 39, (Sampling){ 100.0f, 0, 5, data_vocab });
    gpt_generate(m, all, 1, 39, (Sampling){ 100.0f, 0, 5, 0 });
    int padding_drawn = 0;
    for (int i = 0; i < 40; i++) {
        cr_expect(hot[i] >= 0 && hot[i] < data_vocab, "token %d of the padding drawn at %d", hot[i], i);
        padding_drawn += all[i] >= data_vocab;
    }
    cr_expect_gt(padding_drawn, 0, "the model's whole vocabulary, unlimited, draws the padding too");
    gpt_generate(m, greedy, 1, 7, (Sampling){ 1.0f, 1, 5, data_vocab });
    float logits[11];
    for (int n = 1; n < 8; n++) {
        gpt_forward(m, greedy, NULL, 1, n, 0, 0);
        stream_copy(test_stream, logits, m->acts.logits, sizeof logits);
        stream_synchronize(test_stream);
        int best = 0;
        for (int j = 1; j < data_vocab; j++) best = logits[j] > logits[best] ? j : best;
        cr_expect_eq(greedy[n], best, "position %d: top-1 drew %d, the argmax is %d", n, greedy[n], best);
    }
    model_destroy(&m->base);
    free(params);
}

Test(model, configs_beyond_the_arena_tables_are_refused) {
    ModelConfig ok = { 65, 16, 170, 1, 8, MODEL_GPT, 0, 0 }, too_deep = { 65, 16, 171, 1, 8, MODEL_GPT, 0, 0 };
    cr_expect_null(gpt_config_error(&ok));
    const char *why = gpt_config_error(&too_deep);
    cr_expect(why && strstr(why, "--layers=171"), "%s", why ? why : "accepted");
}

/* The GPT's activations grow linearly with the block, with and without
 * recompute: no T x T buffer (attention keeps one log-sum-exp a row of scores
 * on the CPU). A quadratic term would make the second difference non-zero. */
static size_t activation_floats(const ModelConfig *cfg, int recompute, int B, int T) {
    ArenaLayout layout;
    model_layout(cfg, 1, &layout);
    Model *m = model_create(cfg, &layout, (ComputePolicy){ .recompute = recompute }, test_device, test_stream, B, T);
    size_t floats = m->acts_floats;
    model_destroy(m);
    return floats;
}

/* In bf16, what each block keeps for its backward is under half its fp32
 * bytes: its internals and its output in bf16, the statistics in fp32. A
 * block more adds that to the activations (gpt_activation_floats, what
 * gpt_create allocates); with recompute, only its output: half fp32's. */
Test(model, bf16_keeps_each_block_in_under_half_the_bytes) {
    ModelConfig cfg = { 65, 64, 2, 4, 64, MODEL_GPT, 0, 0 }, more = cfg;
    more.layers = 3;
    size_t block[2][DTYPES];
    for (int recompute = 0; recompute <= 1; recompute++)
        for (int p = 0; p < DTYPES; p++) {
            ComputePolicy compute = { .recompute = recompute, .precision = (DType)p };
            block[recompute][p] = gpt_activation_floats(&more, DEVICE_CPU, compute, 4, 64) -
                                  gpt_activation_floats(&cfg, DEVICE_CPU, compute, 4, 64);
        }
    cr_expect_lt(2 * block[0][DTYPE_BF16], block[0][DTYPE_FP32], "a block keeps %zu floats in bf16, %zu in fp32",
                 block[0][DTYPE_BF16], block[0][DTYPE_FP32]);
    cr_expect_eq(2 * block[1][DTYPE_BF16], block[1][DTYPE_FP32], "with recompute: %zu in bf16, %zu in fp32",
                 block[1][DTYPE_BF16], block[1][DTYPE_FP32]);
}

/* Every activation buffer starts on a 256-byte boundary of the allocation,
 * at shapes whose sizes are not multiples of 64 floats: what a bf16 model
 * keeps (on its own operand boundaries within, kernels.h's operand_numbers)
 * begins where the GPU's staging of a product's operand does, so cuBLAS
 * reads either with the same kernel. */
Test(model, activations_start_on_256_byte_boundaries) {
    ModelConfig cfg = { 65, 24, 2, 3, 33, MODEL_GPT, 1, 0 };
    ArenaLayout layout;
    model_layout(&cfg, 1, &layout);
    for (int p = 0; p < DTYPES; p++) {
        GPT *m = (GPT *)model_create(&cfg, &layout, (ComputePolicy){ .precision = (DType)p }, test_device,
                                     test_stream, 3, 31);
        float *const *slots = (float *const *)&m->acts;
        for (size_t i = 0; i < sizeof m->acts / sizeof(float *); i++) {
            size_t at = (size_t)(slots[i] - m->base.acts_memory) * sizeof(float);
            cr_expect_eq(at % 256, 0, "%s: activation buffer %zu at byte %zu", DTYPE_TRAITS[p].name, i, at);
        }
        model_destroy(&m->base);
    }
}

/* One step of a bf16 model computing so, from params, on 2 rows of 16 fixed
 * ids: its loss, and its gradient's bytes into grads (the fp32 arena's, or
 * with bf16_grads a strategy's bf16 gradients, zeroed first); the weights
 * rounded into a strategy's bf16 copy where it reads them in place. Returns
 * its activation floats. */
enum { STEP_B = 2, STEP_T = 16 };
static size_t bf16_step(const ModelConfig *cfg, const ArenaLayout *layout, ComputePolicy compute, int bf16_grads,
                        const float *params, float *loss, void *grads) {
    int x[STEP_B * STEP_T], y[STEP_B * STEP_T];
    for (int i = 0; i < STEP_B * STEP_T; i++) {
        x[i] = (i * 37 + 5) % cfg->vocab;
        y[i] = (i * 11 + 3) % cfg->vocab;
    }
    size_t P = layout->total;
    Model *m = model_create(cfg, layout, compute, test_device, test_stream, STEP_B, STEP_T);
    model_own_weights(m);
    model_own_grads(m);
    if (compute.weights_in_place) {
        model_own_weights_bf16(m);
        store_bf16(test_stream, m->params_bf16, params, P);
    }
    if (bf16_grads) {
        model_own_grads_bf16(m);
        fill_zero_bf16(test_stream, m->grads_bf16, P);
    }
    *loss = model_loss_and_grads(m, params, x, y, STEP_B, STEP_T, 0);
    if (bf16_grads) stream_copy(test_stream, grads, m->grads_bf16, P * sizeof(bf16));
    else stream_copy(test_stream, grads, m->grads, P * sizeof(float));
    stream_synchronize(test_stream);
    size_t floats = m->acts_floats;
    model_destroy(m);
    return floats;
}

/* Every tensor is on its operand boundary in the arena (arena.h), at a
 * width of 128 as GPT-2's and at a ragged one (40 wide, 65 ids) alike, so a
 * bf16 model reads its weights where its strategy holds them in bf16
 * (weights_in_place), with no copy of its own: the loss and gradients the
 * copies give, byte for byte, and fewer activation floats by exactly the
 * copies (the root's and a block's, two numbers a float). */
static void expect_weights_in_place_give_the_copies_bytes(ModelConfig cfg) {
    ArenaLayout layout;
    model_layout(&cfg, 1, &layout);
    size_t P = layout.total, floats[2];
    float *params = malloc(P * sizeof(float)), loss[2], *grads[2];
    random_params(&layout, params, 21);
    for (int k = 0; k < 2; k++) {
        grads[k] = malloc(P * sizeof(float));
        ComputePolicy compute = { .precision = DTYPE_BF16, .weights_in_place = k };
        floats[k] = bf16_step(&cfg, &layout, compute, 0, params, &loss[k], grads[k]);
    }
    int C = cfg.embd;
    cr_expect(memcmp(&loss[0], &loss[1], sizeof(float)) == 0, "%d wide: loss %.9g read in place, %.9g copied", C,
              loss[1], loss[0]);
    cr_expect(memcmp(grads[0], grads[1], P * sizeof(float)) == 0, "%d wide: the gradients in place differ", C);
    size_t block = 0;
    for (int u = 1; u < layout.nunits; u++)
        if (layout.units[u].used > block) block = layout.units[u].used;
    size_t copies = (operand_numbers(layout.units[0].used) + operand_numbers(block)) / 2;
    cr_expect_eq(floats[0] - floats[1], copies, "%d wide: %zu activation floats fewer in place, the copies are %zu",
                 C, floats[0] - floats[1], copies);
    free(params);
    free(grads[0]);
    free(grads[1]);
}

Test(model, weights_read_in_place_give_the_bytes_of_the_copies) {
    ModelConfig wide = { 256, 16, 2, 2, 128, MODEL_GPT, 1, 0 }, ragged = wide;
    ragged.vocab = 65;
    ragged.embd = 40;
    expect_weights_in_place_give_the_copies_bytes(wide);
    expect_weights_in_place_give_the_copies_bytes(ragged);
}

/* With fresh gradients (grads_fresh: each unit's gradient zero as its
 * backward begins, held in bf16, as ZeRO-2/3's slots are) a bf16 model
 * writes each Linear's weight gradient and the head's straight into the
 * gradient, where it would make them apart and add them in: the gradient's
 * bytes the same (0 + x is x; no sum here rounds to bf16's -0), with biases and a vocabulary wider than the
 * MLP's hidden gradient, and fewer activation floats by exactly the two
 * buffers (the head's [V,C] in the wide gradients' place, and [4C,C]). */
Test(model, fresh_gradients_give_the_bytes_of_the_gradients_made_apart) {
    ModelConfig cfg = { 256, 16, 2, 2, 128, MODEL_GPT, 1, 0 };
    ArenaLayout layout;
    model_layout(&cfg, 1, &layout);
    size_t P = layout.total, floats[2];
    float *params = malloc(P * sizeof(float)), loss[2];
    bf16 *grads[2];
    random_params(&layout, params, 23);
    for (int fresh = 0; fresh < 2; fresh++) {
        grads[fresh] = malloc(P * sizeof(bf16));
        ComputePolicy compute = { .precision = DTYPE_BF16, .weights_in_place = 1, .grads_fresh = fresh };
        floats[fresh] = bf16_step(&cfg, &layout, compute, 1, params, &loss[fresh], grads[fresh]);
    }
    cr_expect(memcmp(&loss[0], &loss[1], sizeof(float)) == 0, "loss %.9g fresh, %.9g apart", loss[1], loss[0]);
    cr_expect(memcmp(grads[0], grads[1], P * sizeof(bf16)) == 0, "the gradients made in place differ");
    size_t V = cfg.vocab, C = cfg.embd;
    size_t head = (operand_numbers(V * C) + 1) / 2, hidden = (operand_numbers(STEP_B * STEP_T * 4 * C) + 1) / 2;
    size_t apart = head - hidden + (operand_numbers(4 * C * C) + 1) / 2;
    cr_expect_eq(floats[0] - floats[1], apart, "%zu activation floats fewer with fresh gradients, %zu held apart",
                 floats[0] - floats[1], apart);
    free(params);
    free(grads[0]);
    free(grads[1]);
}

/* The floats from activation buffer `at` to the next one above it (or the
 * allocation's end): what it may hold, whatever the table's order. */
static size_t room_at(const GPT *m, const float *at) {
    const float *end = m->base.acts_memory + m->base.acts_floats;
    float *const *slots = (float *const *)&m->acts;
    for (size_t i = 0; i < sizeof m->acts / sizeof(float *); i++)
        if (slots[i] > at && slots[i] < end) end = slots[i];
    return (size_t)(end - at);
}

/* The backward's shared buffers hold what is made in them, at shapes where
 * each size rules: the wide gradients' buffer a block's MLP's hidden
 * gradient (4C a position, in bf16 under autocast; attention's, 3C, held
 * alike, is fewer), and under autocast, at a vocabulary far wider than the
 * rows, the head's gradient (V x C): in bf16 where the rows are one chunk
 * of the classifier, made after the blocks; else its fp32 sums over the
 * chunks (3 x 1024 rows of 50304 are two); the logits' buffer its chunk,
 * and under autocast with chunks the head's gradient in bf16 (V x C)
 * through the blocks, where there are more channels than a chunk's rows
 * (129 rows of 2^20 ids are two chunks of 65, 72 channels). A buffer too small would spill into the next, which
 * nothing may read after the backward: no loss or gradient could show it. */
Test(model, the_backwards_shared_buffers_hold_what_is_made_in_them) {
    struct { ModelConfig cfg; int B, T; } shapes[4] = {
        { { 65, 16, 1, 2, 8, MODEL_GPT, 0, 0 }, 4, 16 },
        { { 50304, 16, 1, 2, 128, MODEL_GPT, 0, 0 }, 4, 16 },
        { { 50304, 1024, 1, 2, 8, MODEL_GPT, 0, 0 }, 3, 1024 },
        { { 1 << 20, 129, 1, 2, 72, MODEL_GPT, 0, 0 }, 1, 129 },
    };
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < DTYPES; p++) {
            const ModelConfig *cfg = &shapes[k].cfg;
            int B = shapes[k].B, T = shapes[k].T;
            ArenaLayout layout;
            model_layout(cfg, 1, &layout);
            GPT *m = (GPT *)model_create(cfg, &layout, (ComputePolicy){ .precision = (DType)p }, test_device,
                                         test_stream, B, T);
            size_t BT = (size_t)B * T, C = cfg->embd, V = cfg->vocab, bf16s = p == DTYPE_BF16 ? 2 : 1;
            size_t fit = CLASSIFIER_CHUNK_FLOATS / V, chunks = (BT + fit - 1) / fit, R = (BT + chunks - 1) / chunks;
            cr_expect_eq(chunks, k >= 2 ? 2 : 1, "V = %zu, %zu rows: %zu chunks", V, BT, chunks);
            size_t wide = BT * 4 * C / bf16s;
            size_t logits = R * V / bf16s;
            if (p == DTYPE_BF16) {
                size_t head = chunks > 1 ? V * C : V * C / 2;
                if (head > wide) wide = head;
                if (chunks > 1 && V * C / 2 > logits) logits = V * C / 2;
            }
            cr_expect_geq(room_at(m, m->acts.dwide), wide, "V = %zu, %s: dwide holds %zu floats, want %zu", V,
                          DTYPE_TRAITS[p].name, room_at(m, m->acts.dwide), wide);
            cr_expect_geq(room_at(m, m->acts.logits), logits, "V = %zu, %s: logits hold %zu floats, want %zu", V,
                          DTYPE_TRAITS[p].name, room_at(m, m->acts.logits), logits);
            if (k == 1 && p == DTYPE_BF16) {  /* one chunk: the head's gradient made where it has room */
                model_own_weights(&m->base);
                model_own_grads(&m->base);
                float *params = malloc(layout.total * sizeof(float));
                int *x = malloc(BT * sizeof(int));
                random_params(&layout, params, 5);
                for (size_t i = 0; i < BT; i++) x[i] = (int)(i * 7919 % V);
                float loss = model_loss_and_grads(&m->base, params, x, x, B, T, 0);
                cr_expect(isfinite(loss), "V = %zu, bf16: loss %g", V, loss);
                free(params);
                free(x);
            }
            model_destroy(&m->base);
        }
}

/* Each rank initialises its own part of a tensor (model_init_tensor_part):
 * any part, from an odd element on or of an odd count too, is those
 * elements of the whole arena's init, byte for byte; a part from an odd
 * element takes the Box-Muller pair that element belongs to. (The arena puts
 * every tensor and shard on an even element today; the contract is any
 * part.) */
Test(model, a_part_of_a_tensors_init_is_the_whole_inits_bytes) {
    ModelConfig cfg = { 65, 16, 1, 3, 15, MODEL_GPT, 1, 0 };
    ArenaLayout layout;
    model_layout(&cfg, 1, &layout);
    float *whole = malloc(layout.total * sizeof(float)), part[64];
    model_init_params(&cfg, &layout, 1337, whole);
    const size_t firsts[4] = { 0, 1, 7, 50 }, counts[3] = { 1, 2, 33 };
    for (int t = 0; t < layout.ntensors; t++)
        for (int f = 0; f < 4; f++)
            for (int c = 0; c < 3; c++) {
                const TensorSpec *ts = &layout.tensors[t];
                size_t first = firsts[f], count = counts[c];
                if (first + count > ts->numel) continue;
                model_init_tensor_part(&cfg, &layout, t, 1337, first, count, part);
                cr_expect_eq(memcmp(part, whole + ts->offset + first, count * sizeof(float)), 0,
                             "%s: elements [%zu, %zu) differ from the whole init's", ts->name, first, first + count);
            }
    free(whole);
}

Test(model, activations_hold_no_t_by_t_buffer) {
    ModelConfig cfg = { 11, 192, 2, 3, 24, MODEL_GPT, 0, 0 };
    for (int recompute = 0; recompute <= 1; recompute++) {
        size_t a = activation_floats(&cfg, recompute, 2, 64), b = activation_floats(&cfg, recompute, 2, 128),
               c = activation_floats(&cfg, recompute, 2, 192);
        cr_expect_eq(c - b, b - a, "recompute=%d: %zu, %zu, %zu floats at T = 64, 128, 192", recompute, a, b, c);
    }
}

/* How many of a device buffer's n floats are not bf16 values (low half not zero). */
static size_t not_bf16(const float *buffer, size_t n) {
    uint32_t *bits = malloc(n * sizeof(uint32_t));
    stream_copy(test_stream, bits, buffer, n * sizeof(float));
    stream_synchronize(test_stream);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += (bits[i] & 0xFFFFu) != 0;
    free(bits);
    return count;
}

/* --dtype=bf16 holds bf16 values where a bf16 model (FSDP's param_dtype)
 * holds bf16 tensors: the embeddings' sum, the residual stream, every
 * Linear's input and output, attention's and GELU's outputs, and after the
 * backward the residual stream's gradient and every parameter's (one
 * micro-step: each made in bf16, added into zero); and fp32 holds none of
 * these as bf16 values only. With biases and dropout, so that every op is
 * there, with biases alone, where only the bias's op rounds a Linear's
 * output, and without either, where the Linears' products round on their
 * own and dropout's identity rounds nothing. (In bf16 a block's internals,
 * the branches' outputs, the residual stream, the final LayerNorm's output
 * and the residual stream's gradient are held in bf16 themselves: none of
 * them to check here.) */
static void expect_bf16_tensors_hold_bf16_values(int with_bias, float dropout, DType p) {
    ModelConfig cfg = { 11, 8, 2, 2, 16, MODEL_GPT, with_bias, 0 };
    int B = 2, T = 8, x[16], y[16];
    for (int i = 0; i < B * T; i++) {
        x[i] = (i * 5 + 1) % cfg.vocab;
        y[i] = (i * 3 + 2) % cfg.vocab;
    }
    ArenaLayout layout;
    model_layout(&cfg, 1, &layout);
    GPT *m = (GPT *)model_create(&cfg, &layout, (ComputePolicy){ .precision = p }, test_device,
                                 test_stream, B, T);
    model_own_weights(&m->base);
    model_own_grads(&m->base);
    m->base.dropout = dropout;
    float *params = malloc(layout.total * sizeof(float));
    random_params(&layout, params, 5);
    model_loss_and_grads(&m->base, params, x, y, B, T, 3);
    size_t BT = (size_t)B * T, L = cfg.layers, C = cfg.embd;
    size_t Lw = p == DTYPE_BF16 ? 0 : L;  /* written in bf16 where held: no fp32 buffer */
    size_t stream = p == DTYPE_BF16 ? 0 : 1;  /* the residual stream: itself in bf16 */
    const Activations *a = &m->acts;
    struct { const char *name; const float *at; size_t n; } held[] = {
        { "encoded", a->encoded, stream * BT * C }, { "ln1", a->ln1, Lw * BT * C }, { "qkv", a->qkv, Lw * BT * 3 * C },
        { "atty", a->atty, Lw * BT * C }, { "attproj", a->attproj, Lw * BT * C },
        { "resid2", a->resid2, Lw * BT * C }, { "ln2", a->ln2, Lw * BT * C }, { "fch", a->fch, Lw * BT * 4 * C },
        { "fch_gelu", a->fch_gelu, Lw * BT * 4 * C }, { "fcproj", a->fcproj, Lw * BT * C },
        { "resid3", a->resid3, stream * L * BT * C }, { "lnf", a->lnf, stream * BT * C },
        { "dresid", a->dresid, stream * BT * C }, { "gradients", m->base.grads, layout.total },
    };
    for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) {
        if (held[i].n == 0) continue;
        size_t off = not_bf16(held[i].at, held[i].n);
        if (p == DTYPE_BF16)
            cr_expect_eq(off, 0, "bf16, bias %d, dropout %g: %zu of %s's %zu floats are not bf16 values", with_bias,
                         (double)dropout, off, held[i].name, held[i].n);
        else
            cr_expect_gt(off, 0, "fp32, bias %d: every one of %s's %zu floats is a bf16 value", with_bias,
                         held[i].name, held[i].n);
    }
    model_destroy(&m->base);
    free(params);
}

Test(model, bf16_holds_bf16_values_where_a_bf16_model_holds_bf16_tensors) {
    for (int p = 0; p < DTYPES; p++) {
        expect_bf16_tensors_hold_bf16_values(0, 0.0f, (DType)p);
        expect_bf16_tensors_hold_bf16_values(1, 0.2f, (DType)p);
        expect_bf16_tensors_hold_bf16_values(1, 0.0f, (DType)p);  /* no dropout to round a Linear's output after it */
    }
}

/* On a GPU each rank's compute stream holds its bf16 products' cuBLASLt
 * workspace (DEVICE_PRODUCT_WORKSPACE_BYTES, made at the first), which the
 * estimate counts beside the products' staging: all of it where a bf16
 * block keeps its Linears' inputs in bf16 (nothing staged); fp32's products
 * (cuBLAS's sgemm) hold none of ours. Formulas alone: no GPU needed. */
Test(model, a_gpus_bf16_products_workspace_is_counted) {
    ModelConfig cfg = { 65, 64, 2, 2, 32, MODEL_GPT, 0, 0 };
    ComputePolicy bf16 = { .precision = DTYPE_BF16 }, fp32 = { .precision = DTYPE_FP32 };
    cr_expect_eq(gpt_staging_bytes(&cfg, DEVICE_CUDA, bf16, 4, 64), (size_t)DEVICE_PRODUCT_WORKSPACE_BYTES);
    cr_expect_eq(gpt_staging_bytes(&cfg, DEVICE_CUDA, fp32, 4, 64), 0);
    cr_expect_lt(gpt_staging_bytes(&cfg, DEVICE_CPU, bf16, 4, 64), (size_t)DEVICE_PRODUCT_WORKSPACE_BYTES,
                 "the CPU's room is its own");
}

/* GPT-2's vocabulary: the classifier's rows all at once where their logits
 * fit in CLASSIFIER_CHUNK_FLOATS, past it in equal chunks (no B x T x V
 * buffer held); in chunks of 150 rows (the last of 400 ragged) the loss the
 * double reference's; generation's logits those of the last position. */
Test(model, a_vocabulary_of_50304_costs_a_chunk_of_logits_not_b_t_v) {
    ModelConfig cfg = { 50304, 400, 1, 2, 8, MODEL_GPT, 0, 0 };
    int B = 1, T = 400;
    GPT *m = (GPT *)test_model(&cfg, B, T);
    cr_expect_eq(m->classifier_rows, B * T);
    m->classifier_rows = 150;
    /* past the budget (8000 rows of logits), rows add what the blocks keep of them, no logits */
    ComputePolicy fp32 = { .precision = DTYPE_FP32 };
    size_t one = gpt_activation_floats(&cfg, DEVICE_CPU, fp32, 20, T);
    size_t two = gpt_activation_floats(&cfg, DEVICE_CPU, fp32, 40, T);
    cr_expect_gt((size_t)20 * T * cfg.vocab, (size_t)CLASSIFIER_CHUNK_FLOATS / 2);
    cr_expect_lt(two - one, (size_t)20 * T * cfg.vocab / 10, "8000 positions added %zu floats", two - one);
    size_t P = m->base.layout.total;
    float *params = malloc(P * sizeof(float));
    random_params(&m->base.layout, params, 7);
    int *x = malloc(sizeof(int) * T), *y = malloc(sizeof(int) * T);
    for (int t = 0; t < T; t++) {
        x[t] = (t * 7919) % cfg.vocab;
        y[t] = (t * 104729 + 13) % cfg.vocab;
    }
    float loss = model_loss_and_grads(&m->base, params, x, y, B, T, 0);
    double *dparams = to_double(params, P);
    Dropout none = { 0 };
    double want = ref_model_loss(&cfg, &m->base.layout, dparams, x, y, B, T, none);
    cr_expect(fabs(loss - want) < 1e-5 * want, "loss %.8g, reference %.8g", loss, want);
    gpt_forward(m, x, NULL, B, T, 0, 0);
    float *last = malloc(cfg.vocab * sizeof(float));
    stream_copy(test_stream, last, m->acts.logits, cfg.vocab * sizeof(float));
    stream_synchronize(test_stream);
    /* each logit the dot product of the last position's final norm with the id's embedding */
    int C = cfg.embd;
    float *lnf = malloc((size_t)T * C * sizeof(float));
    stream_copy(test_stream, lnf, m->acts.lnf, (size_t)T * C * sizeof(float));
    stream_synchronize(test_stream);
    const float *wte = params + m->base.layout.tensors[arena_find(&m->base.layout, "transformer.wte.weight")].offset;
    double worst = 0.0, largest = 0.0;
    for (int v = 0; v < cfg.vocab; v++) {
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)lnf[(size_t)(T - 1) * C + c] * wte[(size_t)v * C + c];
        worst = fmax(worst, fabs(last[v] - dot));
        largest = fmax(largest, fabs(dot));
    }
    cr_expect_lt(worst, 1e-5 * largest, "generation's logits are off by %g, the largest %g", worst, largest);
    model_destroy(&m->base);
    free(params); free(dparams); free(x); free(y); free(last); free(lnf);
}
