/* test_torch.c: the optimizer, the schedule and whole training steps against
 * PyTorch.
 *
 * The strategy gates compare the strategies with each other and with a plain
 * loop that calls the same AdamW, clipping and schedule code, so a bug there
 * would be invisible to them. Here PyTorch (tests/torch_gpt.py) is the oracle:
 * nanoGPT's get_lr against lr_at; torch.optim.AdamW with nanoGPT's parameter
 * groups after clip_grad_norm_ against sumsq_reduce and adamw_arena with its
 * clip, on the same weights and gradients; three training steps of
 * nanoGPT's model against DDP on one rank through the trainer, the weights
 * after each; the checkpoint's optim.* tensors against torch's exp_avg and
 * exp_avg_sq; and PyTorch resuming from the checkpoint through
 * optimizer.load_state_dict, its next step against ours; bf16's rounding
 * against .to(torch.bfloat16) bit for bit (a NaN to a NaN: which one,
 * PyTorch's own casts do not agree on), and --dtype=bf16's gradients and
 * losses against nanoGPT's model in mixed precision (a bf16 copy of fp32
 * master weights under torch.autocast). Every test needs
 * python3-torch: without it a SKIP line, or a failure with ZF_REQUIRE_TORCH=1.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/gpt.h"
#include "../model/models.h"
#include "../model/optim.h"
#include "../model/safetensors.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "fixtures.h"
#include "reference.h"

static Dataset data;
static char dir[] = "/tmp/zf_torch_XXXXXX";

/* Every test needs torch: skipped (or failed) here, before anything is made. */
static void setup(void) {
    need_torch();
    test_stream_setup();
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
    strcpy(dir, "/tmp/zf_torch_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_expect_eq(system(cmd), 0, "%s failed", cmd);
    dataset_free(&data);
    test_stream_teardown();
}

TestSuite(torch, .init = setup, .fini = teardown);

/* path = dir/name */
static void file_in_dir(char *path, size_t len, const char *name) {
    int n = snprintf(path, len, "%s/%s", dir, name);
    cr_assert(n > 0 && (size_t)n < len, "path too long");
}

static void run_or_fail(const char *cmd) { cr_assert_eq(system(cmd), 0, "%s failed", cmd); }

/* The F32 tensor `name` of f, of t's shape. */
static const float *tensor_of(const StFile *f, const char *name, const TensorSpec *t) {
    int64_t shape[2] = { t->shape[0], t->shape[1] };
    char err[512];
    const float *x = safetensors_tensor(f, name, "F32", t->ndim, shape, err, sizeof err);
    cr_assert_not_null(x, "%s", err);
    return x;
}

/* Expect every tensor of ours (a host arena) within tol of f's tensor
 * prefix + name, relative to that tensor's largest magnitude. */
static void expect_arena_matches(const StFile *f, const char *prefix, const ArenaLayout *layout, const float *ours,
                                 double tol, const char *what) {
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *t = &layout->tensors[i];
        char name[CHECKPOINT_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        double d = max_rel_diff(ours + t->offset, tensor_of(f, name, t), t->numel);
        cr_expect_lt(d, tol, "%s: %s: relative difference %g from PyTorch's %s", what, t->name, d, name);
    }
}

/* One tensor after whole training steps against PyTorch's. Adam divides each
 * gradient by its own running magnitude, so an element whose gradient is near
 * zero, down where float32 sums round differently on the two sides, steps by
 * an amount rounding decides: one element in a few thousand ends 1e-5 to 1e-4
 * of the tensor's largest weight away from PyTorch's, while the rest agree to
 * 1e-6, and the next steps' gradients (so m and v) inherit a little of it. So:
 * at most 1% of the elements beyond 1e-5 of the tensor's largest magnitude,
 * and none beyond 1e-3. A wrong learning rate, step count, clipping or weight
 * decay moves nearly every element by more. */
static void expect_close_but_for_a_few(const float *got, const float *want, size_t n, const char *what,
                                       const char *name) {
    double scale = 0;
    for (size_t j = 0; j < n; j++) scale = fmax(scale, fabs(want[j]));
    size_t off = 0;
    for (size_t j = 0; j < n; j++) off += fabs((double)got[j] - want[j]) > 1e-5 * scale;
    double d = max_rel_diff(got, want, n);
    cr_expect(off <= n / 100 && d < 1e-3, "%s: %s: %zu of %zu elements beyond 1e-5 of PyTorch's, the largest "
              "difference %g", what, name, off, n, d);
}

/* expect_close_but_for_a_few for every tensor of a host arena, against f's
 * prefix + name. */
static void expect_trained_arena_matches(const StFile *f, const char *prefix, const ArenaLayout *layout,
                                         const float *ours, const char *what) {
    for (int i = 0; i < layout->ntensors; i++) {
        const TensorSpec *t = &layout->tensors[i];
        char name[CHECKPOINT_NAME_MAX + 16];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        expect_close_but_for_a_few(ours + t->offset, tensor_of(f, name, t), t->numel, what, name);
    }
}

/* A scalar or [n] F32 tensor of f. */
static const float *values_of(const StFile *f, const char *name, int n) {
    int64_t shape[2] = { n, 0 };
    char err[512];
    const float *x = safetensors_tensor(f, name, "F32", n > 0, shape, err, sizeof err);
    cr_assert_not_null(x, "%s", err);
    return x;
}

/* lr_at for iters first..first+n-1, as a comma-separated list that parses
 * back to the same floats. */
static void lr_list(char *out, size_t len, const LRSchedule *sched, int first, int n) {
    size_t used = 0;
    for (int k = 0; k < n; k++) {
        int w = snprintf(out + used, len - used, "%s%.9g", k ? "," : "", lr_at(sched, first + k));
        cr_assert(w > 0 && (size_t)w < len - used, "lr list too long");
        used += (size_t)w;
    }
}

/* ---- bf16: the rounding against PyTorch's, bit for bit ---- */

/* Every bf16 pattern as the top half of an fp32, under each of the low halves
 * that decide a rounding: exact, just below a tie, the tie, just above, and
 * the most below the next pattern. That holds every exponent and sign, the
 * ties to even in both directions, the largest values rounding to infinity,
 * subnormals, and NaNs quiet and signalling with either sign. */
static const uint32_t LOW_HALVES[] = { 0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF };
enum { LOW_HALF_KINDS = sizeof LOW_HALVES / sizeof LOW_HALVES[0], BF16_PATTERNS = 1 << 16 };

static void write_raw(const char *path, const void *data, size_t bytes) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, bytes, f), bytes);
    cr_assert_eq(fclose(f), 0);
}

Test(torch, rounding_to_bf16_is_pytorchs_bit_for_bit) {
    size_t n = (size_t)BF16_PATTERNS * LOW_HALF_KINDS;
    uint32_t *bits = malloc(n * sizeof(uint32_t)), *rounded = malloc(n * sizeof(uint32_t));
    for (uint32_t top = 0; top < BF16_PATTERNS; top++)
        for (int k = 0; k < LOW_HALF_KINDS; k++) bits[(size_t)top * LOW_HALF_KINDS + k] = top << 16 | LOW_HALVES[k];
    round_to_bf16(test_stream, (float *)rounded, (const float *)bits, n);
    stream_synchronize(test_stream);

    char floats[300], theirs[300], cmd[1400];
    file_in_dir(floats, sizeof floats, "floats.bin");
    file_in_dir(theirs, sizeof theirs, "rounded.bin");
    write_raw(floats, bits, n * sizeof(uint32_t));
    torch_gpt_command(cmd, sizeof cmd, "bf16 --floats %s --out %s", floats, theirs);
    run_or_fail(cmd);
    size_t got;
    unsigned char *want = read_all(theirs, &got);
    cr_assert_eq(got, n * sizeof(bf16));
    size_t differ = 0, first = n;
    for (size_t i = 0; i < n; i++) {
        uint32_t torch_bits = (uint32_t)(want[2 * i] | want[2 * i + 1] << 8) << 16;
        float ours, torchs;
        memcpy(&ours, &rounded[i], sizeof ours);
        memcpy(&torchs, &torch_bits, sizeof torchs);
        if (rounded[i] != torch_bits && !(isnan(ours) && isnan(torchs)) && differ++ == 0) first = i;
    }
    cr_expect_eq(differ, 0, "%zu of %zu roundings differ from torch's; the first: 0x%08X to 0x%08X, torch's 0x%02X%02X0000",
                 differ, n, first < n ? bits[first] : 0, first < n ? rounded[first] : 0,
                 first < n ? want[2 * first + 1] : 0, first < n ? want[2 * first] : 0);
    free(want);
    free(bits);
    free(rounded);
}

Test(torch, lr_at_is_nanogpts_get_lr) {
    LRSchedule sched = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_iters = 5, .decay_iters = 20 };
    int iters = 30;  /* warmup, cosine decay, and min_lr past decay_iters */
    char cmd[1024];
    torch_gpt_command(cmd, sizeof cmd, "lr --lr %.9g --min-lr %.9g --warmup %d --decay-iters %d --iters %d",
                      sched.lr, sched.min_lr, sched.warmup_iters, sched.decay_iters, iters);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "%s", cmd);
    for (int it = 0; it < iters; it++) {
        double want = NAN;
        cr_assert_eq(fscanf(p, "%lf", &want), 1, "%s printed no lr for iter %d", cmd, it);
        float got = lr_at(&sched, it);
        cr_expect(fabs(got - want) <= 1e-6 * want, "iter %d: lr_at %.9g, nanoGPT's get_lr %.9g", it, got, want);
    }
    cr_expect_eq(pclose(p), 0, "%s failed", cmd);
}

/* ---- AdamW and clipping alone, on given gradients ---- */

enum { ADAMW_STEPS = 6 };

/* Random gradients for every step, each scaled to its global norm: above the
 * clipping threshold of 1 on steps 1, 3 and 5 only. The units' padding holds
 * zeros, as a backward leaves it (PyTorch's tensors have none). */
static void adamw_gradients(const ArenaLayout *layout, float *grads) {
    static const double norms[ADAMW_STEPS] = { 0.3, 2.5, 0.8, 4.0, 0.05, 1.7 };
    for (int k = 0; k < ADAMW_STEPS; k++) {
        float *g = grads + (size_t)k * layout->total;
        memset(g, 0, layout->total * sizeof(float));
        for (int t = 0; t < layout->ntensors; t++)
            fill_uniform(g + layout->tensors[t].offset, layout->tensors[t].numel, -1.0f, 1.0f, 100 + 31 * k + t);
        double sumsq = 0;
        for (size_t i = 0; i < layout->total; i++) sumsq += (double)g[i] * g[i];
        for (size_t i = 0; i < layout->total; i++) g[i] = (float)(g[i] * norms[k] / sqrt(sumsq));
    }
}

static void write_adamw_gradients(const char *path, const ArenaLayout *layout, const float *grads) {
    int n = ADAMW_STEPS * layout->ntensors;
    StTensor *tensors = calloc((size_t)n, sizeof *tensors);
    char (*names)[CHECKPOINT_NAME_MAX] = calloc((size_t)n, sizeof *names);
    for (int k = 0; k < ADAMW_STEPS; k++)
        for (int i = 0; i < layout->ntensors; i++) {
            const TensorSpec *t = &layout->tensors[i];
            int j = k * layout->ntensors + i;
            snprintf(names[j], sizeof names[j], "step%d.%s", k, t->name);
            tensors[j] = (StTensor){ names[j], "F32", t->ndim, { t->shape[0], t->shape[1] },
                                     grads + (size_t)k * layout->total + t->offset };
        }
    char err[512];
    cr_assert_eq(safetensors_write(path, tensors, n, NULL, err, sizeof err), 0, "%s", err);
    free(tensors);
    free(names);
}

Test(torch, adamw_and_clipping_match_torch_optim_adamw) {
    ModelConfig cfg = { 11, 8, 2, 2, 16, MODEL_GPT, 0, 0 };  /* 2-D weights that decay, LayerNorm weights that do not */
    ArenaLayout layout;
    gpt_layout(&cfg, 1, &layout);
    size_t P = layout.total;
    float *w = malloc(P * sizeof(float)), *m = calloc(P, sizeof(float)), *v = calloc(P, sizeof(float));
    float *grads = malloc(ADAMW_STEPS * P * sizeof(float)), *g = malloc(P * sizeof(float));
    fill_uniform(w, P, -0.5f, 0.5f, 7);
    adamw_gradients(&layout, grads);
    LRSchedule sched = { .lr = 1e-2f, .min_lr = 1e-3f, .warmup_iters = 2, .decay_iters = 5 };  /* then min_lr */
    AdamWParams hp = { .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f };
    float max_norm = 1.0f;
    AdamWSpan spans[ARENA_MAX_TENSORS];
    adamw_spans(&layout, spans);

    char wpath[300], gpath[300], opath[300], lrs[512], cmd[2048], err[512];
    file_in_dir(wpath, sizeof wpath, "weights.safetensors");
    file_in_dir(gpath, sizeof gpath, "grads.safetensors");
    file_in_dir(opath, sizeof opath, "adamw.safetensors");
    cr_assert_eq(weights_save(wpath, &layout, w, err, sizeof err), 0, "%s", err);
    write_adamw_gradients(gpath, &layout, grads);
    lr_list(lrs, sizeof lrs, &sched, 0, ADAMW_STEPS);
    torch_gpt_command(cmd, sizeof cmd, "adamw --weights %s --grads %s --lrs %s --beta2 %.9g --weight-decay %.9g "
                      "--grad-clip %.9g --out %s", wpath, gpath, lrs, hp.beta2, hp.weight_decay, max_norm, opath);
    run_or_fail(cmd);

    StFile f;
    cr_assert_eq(safetensors_open(&f, opath, err, sizeof err), 0, "%s", err);
    void *sumsq_scratch = calloc(sumsq_scratch_bytes(P), 1);
    for (int k = 0; k < ADAMW_STEPS; k++) {
        SquareSum sumsq;
        memcpy(g, grads + (size_t)k * P, P * sizeof(float));
        sumsq_reduce(test_stream, &sumsq, g, DTYPE_FP32, P, sumsq_scratch);
        hp.lr = lr_at(&sched, k);
        hp.step = k + 1;
        adamw_arena(test_stream, w, NULL, g, DTYPE_FP32, m, v, 0, P, spans, layout.ntensors, hp,
                    (AdamWClip){ &sumsq, 1, max_norm });
        stream_synchronize(test_stream);

        char name[64], what[64];
        snprintf(name, sizeof name, "step%d.norm", k);
        float torch_norm = *values_of(&f, name, 0);
        float norm = (float)sqrt(square_sum_value(sumsq));
        cr_expect(fabsf(norm - torch_norm) <= 1e-6f * torch_norm, "step %d: norm %.9g, PyTorch's %.9g", k, norm,
                  torch_norm);
        snprintf(what, sizeof what, "step %d (lr %.3g, norm %.2f) weights", k, hp.lr, torch_norm);
        snprintf(name, sizeof name, "step%d.", k);
        expect_arena_matches(&f, name, &layout, w, 1e-6, what);
        snprintf(what, sizeof what, "step %d exp_avg", k);
        snprintf(name, sizeof name, "step%d.%s", k, CHECKPOINT_M_PREFIX);
        expect_arena_matches(&f, name, &layout, m, 1e-6, what);
        snprintf(what, sizeof what, "step %d exp_avg_sq", k);
        snprintf(name, sizeof name, "step%d.%s", k, CHECKPOINT_V_PREFIX);
        expect_arena_matches(&f, name, &layout, v, 1e-6, what);
    }
    safetensors_close(&f);
    free(w); free(m); free(v); free(grads); free(g); free(sumsq_scratch);
}

/* ---- whole training steps of the GPT ---- */

/* Adam's m and v after one step from the same state, relative to each
 * tensor's largest value: linear in the gradients, which agree to 6e-7 there. */
static const double STATE_TOL = 2e-6;
static const float GRAD_CLIP = 0.5f;  /* below every step's norm: each step is clipped */

/* DDP on one rank, as bin/train --gpus=1 runs it, without dropout. */
static StrategyConfig one_rank_gpt(void) {
    StrategyConfig sc = {
        .model = { data.vocab, 32, 2, 4, 32, MODEL_GPT, 0, 0 }, .nranks = 1, .batch = 4, .dropout = 0.0f,
        .seed = 5, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
    };
    return sc;
}

static TrainConfig steps(int start, int iters, const char *out_dir) {
    TrainConfig tc = {
        .iters = iters, .start_iter = start, .grad_accum = 1, .out_dir = out_dir,
        .schedule = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_iters = 1, .decay_iters = 4 }, .grad_clip = GRAD_CLIP,
    };
    return tc;
}

/* Step `iter` of s through the trainer (saving DIR/ckpt.safetensors after it
 * with out_dir); its weights after it into w, and its training loss. */
static float train_one_step(Strategy *s, int iter, const char *out_dir, float *w) {
    TrainConfig tc = steps(iter, iter + 1, out_dir);
    TrainResult r;
    cr_assert_eq(train_run(s, &tc, &data, &r), 0);
    strategy_read_all(s, STATE_WEIGHTS, w);
    return r.last_loss;
}

/* The trainer's batches of iters first..first+n-1, rows stacked, as "x" and "y". */
static void write_batches(const char *path, const StrategyConfig *sc, int first, int n) {
    int rows = sc->batch * sc->nranks, T = sc->model.block_size;
    int *x = malloc(sizeof(int) * n * rows * T), *y = malloc(sizeof(int) * n * rows * T);
    for (int k = 0; k < n; k++)
        test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, sc->seed, (uint32_t)(first + k), 0, rows, T,
                      x + (size_t)k * rows * T, y + (size_t)k * rows * T);
    StTensor batch[2] = { { "x", "I32", 2, { n * rows, T }, x }, { "y", "I32", 2, { n * rows, T }, y } };
    char err[512];
    cr_assert_eq(safetensors_write(path, batch, 2, NULL, err, sizeof err), 0, "%s", err);
    free(x);
    free(y);
}

/* tests/torch_gpt.py train from `weights` over the trainer's iters first..first+n-1. */
static void torch_train(const char *weights, const StrategyConfig *sc, int first, int n, const char *out) {
    char bpath[300], lrs[512], cmd[2048];
    file_in_dir(bpath, sizeof bpath, "batches.safetensors");
    write_batches(bpath, sc, first, n);
    TrainConfig tc = steps(first, first + n, NULL);
    lr_list(lrs, sizeof lrs, &tc.schedule, first, n);
    torch_gpt_command(cmd, sizeof cmd, "train --weights %s --batches %s --heads %d --lrs %s --beta2 %.9g "
                      "--weight-decay %.9g --grad-clip %.9g --out %s", weights, bpath, sc->model.heads, lrs,
                      sc->beta2, sc->weight_decay, tc.grad_clip, out);
    run_or_fail(cmd);
}

enum { TRAIN_STEPS = 3 };

Test(torch, three_steps_match_nanogpt_and_the_checkpoint_holds_torchs_adam_state) {
    StrategyConfig sc = one_rank_gpt();
    Strategy *s = strategy_create(0, &sc);
    cr_assert_not_null(s);
    ArenaLayout layout;
    model_layout(&sc.model, 1, &layout);
    size_t P = layout.total;
    float *w = malloc((TRAIN_STEPS + 1) * P * sizeof(float)), loss[TRAIN_STEPS];
    strategy_read_all(s, STATE_WEIGHTS, w);
    for (int k = 0; k < TRAIN_STEPS; k++)
        loss[k] = train_one_step(s, k, k == TRAIN_STEPS - 1 ? dir : NULL, w + (k + 1) * P);
    s->ops->destroy(s);

    char wpath[300], opath[300], ckpt[300], err[512];
    file_in_dir(wpath, sizeof wpath, "init.safetensors");
    file_in_dir(opath, sizeof opath, "train.safetensors");
    file_in_dir(ckpt, sizeof ckpt, "ckpt.safetensors");
    cr_assert_eq(weights_save(wpath, &layout, w, err, sizeof err), 0, "%s", err);
    torch_train(wpath, &sc, 0, TRAIN_STEPS, opath);

    StFile theirs, file;
    cr_assert_eq(safetensors_open(&theirs, opath, err, sizeof err), 0, "%s", err);
    const float *torch_loss = values_of(&theirs, "loss", TRAIN_STEPS), *norm = values_of(&theirs, "norm", TRAIN_STEPS);
    for (int k = 0; k < TRAIN_STEPS; k++) {
        char prefix[32], what[64];
        snprintf(prefix, sizeof prefix, "step%d.", k);
        snprintf(what, sizeof what, "after step %d (norm %.3f)", k, norm[k]);
        cr_expect(fabsf(loss[k] - torch_loss[k]) <= 1e-5f * torch_loss[k], "step %d: loss %.8g, PyTorch's %.8g", k,
                  loss[k], torch_loss[k]);
        expect_trained_arena_matches(&theirs, prefix, &layout, w + (k + 1) * P, what);
        cr_expect_gt(norm[k], GRAD_CLIP, "step %d was not clipped, so its clipping went unchecked", k);
    }

    /* the checkpoint's optimizer tensors are torch's exp_avg and exp_avg_sq, by name */
    cr_assert_eq(safetensors_open(&file, ckpt, err, sizeof err), 0, "%s", err);
    cr_expect_eq(safetensors_count(&theirs), TRAIN_STEPS * layout.ntensors + 2 + 2 * layout.ntensors,
                 "PyTorch's optimizer holds state for another set of tensors than the checkpoint");
    for (int i = 0; i < layout.ntensors; i++) {
        const TensorSpec *t = &layout.tensors[i];
        const char *prefixes[2] = { CHECKPOINT_M_PREFIX, CHECKPOINT_V_PREFIX };
        for (int j = 0; j < 2; j++) {
            char name[CHECKPOINT_NAME_MAX];
            snprintf(name, sizeof name, "%s%s", prefixes[j], t->name);
            expect_close_but_for_a_few(tensor_of(&file, name, t), tensor_of(&theirs, name, t), t->numel,
                                       "the checkpoint after 3 steps", name);
        }
    }
    safetensors_close(&file);
    safetensors_close(&theirs);
    free(w);
}

Test(torch, pytorch_resumes_from_the_checkpoint_and_steps_as_we_do) {
    StrategyConfig sc = one_rank_gpt();
    Strategy *s = strategy_create(0, &sc);
    cr_assert_not_null(s);
    ArenaLayout layout;
    model_layout(&sc.model, 1, &layout);
    size_t P = layout.total;
    float *w = malloc(P * sizeof(float)), *m = malloc(P * sizeof(float)), *v = malloc(P * sizeof(float));
    for (int k = 0; k < TRAIN_STEPS; k++) train_one_step(s, k, k == TRAIN_STEPS - 1 ? dir : NULL, w);
    train_one_step(s, TRAIN_STEPS, NULL, w);
    strategy_read_all(s, STATE_EXP_AVG, m);
    strategy_read_all(s, STATE_EXP_AVG_SQ, v);
    s->ops->destroy(s);

    /* the checkpoint after 3 steps into nanoGPT's model and torch.optim.AdamW
     * (load_state_dict, step 3), then our 4th step */
    char opath[300], ckpt[300], err[512];
    file_in_dir(opath, sizeof opath, "resumed.safetensors");
    file_in_dir(ckpt, sizeof ckpt, "ckpt.safetensors");
    torch_train(ckpt, &sc, TRAIN_STEPS, 1, opath);
    StFile theirs;
    cr_assert_eq(safetensors_open(&theirs, opath, err, sizeof err), 0, "%s", err);
    expect_trained_arena_matches(&theirs, "step0.", &layout, w, "the step after resuming");
    expect_arena_matches(&theirs, CHECKPOINT_M_PREFIX, &layout, m, STATE_TOL, "exp_avg after resuming");
    expect_arena_matches(&theirs, CHECKPOINT_V_PREFIX, &layout, v, STATE_TOL, "exp_avg_sq after resuming");
    safetensors_close(&theirs);
    free(w); free(m); free(v);
}

/* ---- mixed precision against a bf16 copy under torch.autocast ---- */

enum { AUTOCAST_STEPS = 50 };

/* nanoGPT's char-small shape (4 layers, 4 heads, 128 wide, block 64, 12 rows)
 * on one rank without dropout, computing in `precision`. */
static StrategyConfig char_small(DType precision) {
    StrategyConfig sc = {
        .model = { data.vocab, 64, 4, 4, 128, MODEL_GPT, 0, 0 }, .nranks = 1, .batch = 12, .seed = 3,
        .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f, .precision = precision,
    };
    return sc;
}

/* The schedule of the comparison: warmup 5, decay to 1e-4 over the steps, clipping at 1. */
static TrainConfig autocast_steps(int first, int n) {
    TrainConfig tc = {
        .iters = first + n, .start_iter = first, .grad_accum = 1, .grad_clip = 1.0f,
        .schedule = { .lr = 1e-3f, .min_lr = 1e-4f, .warmup_iters = 5, .decay_iters = AUTOCAST_STEPS },
    };
    return tc;
}

/* Our loss at each of the steps, from the init (saved to wpath when given). */
static void our_losses(DType precision, const char *wpath, float loss[AUTOCAST_STEPS]) {
    StrategyConfig sc = char_small(precision);
    Strategy *s = strategy_create(0, &sc);
    cr_assert_not_null(s);
    ArenaLayout layout;
    model_layout(&sc.model, 1, &layout);
    float *w = malloc(layout.total * sizeof(float));
    strategy_read_all(s, STATE_WEIGHTS, w);
    char err[512];
    if (wpath) cr_assert_eq(weights_save(wpath, &layout, w, err, sizeof err), 0, "%s", err);
    for (int k = 0; k < AUTOCAST_STEPS; k++) {
        TrainConfig tc = autocast_steps(k, 1);
        TrainResult r;
        cr_assert_eq(train_run(s, &tc, &data, &r), 0);
        loss[k] = r.last_loss;
    }
    s->ops->destroy(s);
    free(w);
}

/* PyTorch 2.x's (the venv's) losses from those weights over the same batches,
 * in mixed precision (tests/torch_gpt.py train --autocast) or in fp32. */
static void torch_losses(const char *wpath, int autocast, float loss[AUTOCAST_STEPS]) {
    StrategyConfig sc = char_small(DTYPE_FP32);
    char bpath[300], opath[300], lrs[1024], cmd[4096], err[512];
    file_in_dir(bpath, sizeof bpath, "batches.safetensors");
    file_in_dir(opath, sizeof opath, autocast ? "autocast.safetensors" : "fp32.safetensors");
    write_batches(bpath, &sc, 0, AUTOCAST_STEPS);
    TrainConfig tc = autocast_steps(0, AUTOCAST_STEPS);
    lr_list(lrs, sizeof lrs, &tc.schedule, 0, AUTOCAST_STEPS);
    int n = snprintf(cmd, sizeof cmd, "%s tests/torch_gpt.py train --weights %s --batches %s --heads %d --lrs %s "
                     "--beta2 %.9g --weight-decay %.9g --grad-clip %.9g --out %s%s", venv_python(), wpath, bpath,
                     sc.model.heads, lrs, sc.beta2, sc.weight_decay, tc.grad_clip, opath, autocast ? " --autocast" : "");
    cr_assert(n > 0 && (size_t)n < sizeof cmd);
    run_or_fail(cmd);
    StFile f;
    cr_assert_eq(safetensors_open(&f, opath, err, sizeof err), 0, "%s", err);
    memcpy(loss, values_of(&f, "loss", AUTOCAST_STEPS), AUTOCAST_STEPS * sizeof(float));
    safetensors_close(&f);
}

/* One forward and backward of sc's GPT from weights w over the first batch
 * (x, y written there), in sc's precision, the classifier classifier_rows
 * rows at a time (0: as the model is built, all at once): the loss, and the
 * gradient into grads (the layout's floats). */
static float our_gradient(const StrategyConfig *sc, const float *w, int *x, int *y, float *grads,
                          int classifier_rows) {
    int B = sc->batch, T = sc->model.block_size;
    ArenaLayout layout;
    model_layout(&sc->model, 1, &layout);
    Model *m = model_create(&sc->model, &layout, (ComputePolicy){ .precision = sc->precision }, test_device,
                            test_stream, B, T);
    if (classifier_rows) ((GPT *)m)->classifier_rows = classifier_rows;
    model_own_weights(m);
    model_own_grads(m);
    test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, sc->seed, 0, 0, B, T, x, y);
    stream_copy(test_stream, m->params, w, layout.total * sizeof(float));
    fill_zero(test_stream, m->grads, layout.total);
    m->ops->forward(m, x, y, B, T, 0, 1);
    m->ops->backward(m, 1.0f);
    float loss = model_read_loss(m);
    stream_copy(test_stream, grads, m->grads, layout.total * sizeof(float));
    stream_synchronize(test_stream);
    model_destroy(m);
    return loss;
}

/* PyTorch 2.x's loss and gradients (tests/torch_gpt.py grads) from wpath over bpath, with autocast or without. */
static void torch_gradient(const char *wpath, const char *bpath, int heads, int autocast, StFile *f) {
    char opath[300], cmd[2048], err[512];
    file_in_dir(opath, sizeof opath, autocast ? "grads_bf16.safetensors" : "grads_fp32.safetensors");
    int n = snprintf(cmd, sizeof cmd, "%s tests/torch_gpt.py grads --weights %s --batch %s --heads %d --out %s%s",
                     venv_python(), wpath, bpath, heads, opath, autocast ? " --autocast" : "");
    cr_assert(n > 0 && (size_t)n < sizeof cmd);
    run_or_fail(cmd);
    cr_assert_eq(safetensors_open(f, opath, err, sizeof err), 0, "%s", err);
}

/* Our bf16 gradient against the reference's (a bf16 copy of the weights under
 * autocast, tests/torch_gpt.py), with fp32's as the yardstick. Both round at
 * the same places, so where the two fp32 sums before a rounding agree, the
 * bf16 results are the same bits; they part where sums run in other orders
 * (attention's among them: both round the probabilities to bf16 before the
 * product with v, but each relative to a running max over key blocks of its
 * own size), and what parts there moves everything downstream by about an
 * ulp. Every gradient is made in bf16, so fp32's has no element of the same
 * bits. Measured on char-small at init, without biases and with: 28-88% of
 * each tensor's elements are the reference's bits (wpe's 28%, the fewest:
 * the bottom of the network, where every difference above has arrived), and
 * each tensor's L1 distance to it is 0.10-0.84 of fp32's (wpe's 0.84, the
 * most). The
 * bounds: at least a fifth of the elements the same, and a distance under
 * 0.9 of fp32's. A rounding left out, or a sum run in bf16 (as the CPU's
 * bf16 LayerNorm backward runs its weight's: 0.95-1.0 of fp32's distance),
 * falls to fp32's side. */
static const double AUTOCAST_CLOSER = 0.9, AUTOCAST_SAME = 0.2;

/* As nanoGPT's model (no biases) and as GPT-2's (biases, drawn away from
 * their init's zeros, so that a bias left out of an op would show); the
 * classifier all at once (its weight gradient made after the blocks, in
 * bf16), and with biases in chunks of 200 rows too (its fp32 sums over the
 * chunks, rounded and kept through the blocks). */
static void expect_autocasts_gradient(int bias) {
    StrategyConfig sc = char_small(DTYPE_BF16);
    sc.model.bias = bias;
    int B = sc.batch, T = sc.model.block_size;
    ArenaLayout layout;
    model_layout(&sc.model, 1, &layout);
    size_t P = layout.total;
    float *w = malloc(P * sizeof(float)), *grads = malloc(P * sizeof(float)), *chunked = malloc(P * sizeof(float));
    model_init_params(&sc.model, &layout, sc.seed, w);
    for (int i = 0; i < layout.ntensors; i++) {
        const TensorSpec *t = &layout.tensors[i];
        size_t len = strlen(t->name);
        if (len > 5 && strcmp(t->name + len - 5, ".bias") == 0)
            fill_uniform(w + t->offset, t->numel, -0.1f, 0.1f, 90 + (unsigned)i);
    }
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    float loss = our_gradient(&sc, w, x, y, grads, 0), loss_chunked = our_gradient(&sc, w, x, y, chunked, 200);
    cr_assert_lt(200, B * T, "200 rows a chunk: one chunk");

    char wpath[300], bpath[300], err[512];
    file_in_dir(wpath, sizeof wpath, "init.safetensors");
    file_in_dir(bpath, sizeof bpath, "batch.safetensors");
    cr_assert_eq(weights_save(wpath, &layout, w, err, sizeof err), 0, "%s", err);
    StTensor batch[2] = { { "x", "I32", 2, { B, T }, x }, { "y", "I32", 2, { B, T }, y } };
    cr_assert_eq(safetensors_write(bpath, batch, 2, NULL, err, sizeof err), 0, "%s", err);
    StFile bf16, fp32;
    torch_gradient(wpath, bpath, sc.model.heads, 1, &bf16);
    torch_gradient(wpath, bpath, sc.model.heads, 0, &fp32);
    cr_expect_eq(memcmp(&loss, &loss_chunked, sizeof loss), 0, "loss %.9g, in chunks %.9g", loss, loss_chunked);
    cr_expect(fabsf(loss - *values_of(&bf16, "loss", 0)) <= 0x1p-9f * loss, "loss %.7g, autocast's %.7g", loss,
              *values_of(&bf16, "loss", 0));
    for (int c = 0; c <= bias; c++) {
        const float *ours = c ? chunked : grads;
        for (int i = 0; i < layout.ntensors; i++) {
            const TensorSpec *t = &layout.tensors[i];
            const float *autocast = tensor_of(&bf16, t->name, t), *exact = tensor_of(&fp32, t->name, t);
            double ours_off = 0, fp32_off = 0, size = 0;
            size_t same = 0;
            for (size_t j = 0; j < t->numel; j++) {
                ours_off += fabs((double)ours[t->offset + j] - autocast[j]);
                fp32_off += fabs((double)exact[j] - autocast[j]);
                size += fabs((double)autocast[j]);
                same += ours[t->offset + j] == autocast[j];
            }
            cr_expect_lt(ours_off, AUTOCAST_CLOSER * fp32_off, "bias %d%s: %s: L1 distance %.2e from autocast's "
                         "gradient, fp32's %.2e", bias, c ? ", in chunks" : "", t->name, ours_off / size,
                         fp32_off / size);
            cr_expect_geq(same, AUTOCAST_SAME * t->numel, "bias %d%s: %s: %zu of %zu elements bit-equal to "
                          "autocast's", bias, c ? ", in chunks" : "", t->name, same, t->numel);
        }
    }
    safetensors_close(&bf16);
    safetensors_close(&fp32);
    free(w); free(grads); free(chunked); free(x); free(y);
}

Test(torch, bf16_gradients_are_autocasts) {
    need_transformers();
    expect_autocasts_gradient(0);
    expect_autocasts_gradient(1);
}

/* 50 steps of char-small in bf16 against nanoGPT's model in mixed precision
 * (PyTorch 2.x, the venv's: fp32 master weights, a bf16 copy of them under
 * autocast), and in fp32 against fp32. The tolerance for bf16: half an ulp
 * of the loss in bf16 (2^-9 of it), the most two computations of a loss in
 * bf16 may differ and still round to the same bf16 value; measured: at most
 * 2.5e-4 of it (median 3.7e-5), where the reference's own loss parts from
 * fp32's by up to 8.1e-4. */
Test(torch, bf16_trains_as_nanogpt_under_torch_autocast, .timeout = 300) {
    need_transformers();
    char wpath[300];
    file_in_dir(wpath, sizeof wpath, "init.safetensors");
    float ours[2][AUTOCAST_STEPS], theirs[2][AUTOCAST_STEPS];
    our_losses(DTYPE_FP32, wpath, ours[0]);
    our_losses(DTYPE_BF16, NULL, ours[1]);
    torch_losses(wpath, 0, theirs[0]);
    torch_losses(wpath, 1, theirs[1]);
    int moved = 0;
    for (int k = 0; k < AUTOCAST_STEPS; k++) {
        cr_expect(fabsf(ours[0][k] - theirs[0][k]) <= 1e-5f * theirs[0][k], "step %d: fp32 loss %.8g, PyTorch's %.8g",
                  k, ours[0][k], theirs[0][k]);
        cr_expect(fabsf(ours[1][k] - theirs[1][k]) <= 0x1p-9f * theirs[1][k],
                  "step %d: bf16 loss %.8g, autocast's %.8g (fp32: %.8g)", k, ours[1][k], theirs[1][k], theirs[0][k]);
        moved += ours[1][k] != ours[0][k];
    }
    cr_expect_geq(moved, AUTOCAST_STEPS - 5, "bf16's loss is fp32's on %d of %d steps", AUTOCAST_STEPS - moved,
                 AUTOCAST_STEPS);
}
