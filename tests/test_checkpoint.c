/* test_checkpoint.c: checkpoints across strategies and rank counts, PyTorch
 * loading them, and gradient accumulation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../strategies/checkpoint.h"
#include "../strategies/trainer.h"
#include "reference.h"

static Dataset data;
static char dir[] = "/tmp/zf_ckpt_XXXXXX";
static char path[256];

static void setup(void) {
    test_stream_setup();
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 16, err, sizeof err), 0, "%s", err);
    strcpy(dir, "/tmp/zf_ckpt_XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/ckpt.safetensors", dir);
}

static void teardown(void) {
    unlink(path);
    rmdir(dir);
    dataset_free(&data);
    test_stream_teardown();
}

TestSuite(checkpoint, .init = setup, .fini = teardown);

static StrategyConfig small_gpt(int nranks, int batch, float dropout) {
    StrategyConfig sc = {
        .model = { data.vocab, 16, 2, 2, 16, MODEL_GPT }, .nranks = nranks, .batch = batch, .dropout = dropout,
        .seed = 9, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
    };
    return sc;
}

static TrainConfig steps(int start, int iters, const char *out_dir) {
    TrainConfig tc = {
        .iters = iters, .start_iter = start, .grad_accum = 1, .out_dir = out_dir,
        .schedule = { 1e-2f, 1e-3f, 2, 8 }, .grad_clip = 1.0f,
    };
    return tc;
}

/* The weights and Adam state of s, in the host layout. */
typedef struct { float *w, *m, *v; size_t n; } State;

static State state_of(Strategy *s) {
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    State st = { malloc(layout.total * 4), malloc(layout.total * 4), malloc(layout.total * 4), layout.total };
    s->ops->read_weights(s, st.w);
    s->ops->read_state(s, st.m, st.v);
    return st;
}

static int same_state(State a, State b) {
    return memcmp(a.w, b.w, a.n * 4) == 0 && memcmp(a.m, b.m, a.n * 4) == 0 && memcmp(a.v, b.v, a.n * 4) == 0;
}

static void state_free(State st) { free(st.w); free(st.m); free(st.v); }

static void run(Strategy *s, TrainConfig tc) {
    TrainResult r;
    cr_assert_eq(train_run(s, &tc, &data, &r), 0);
}

Test(checkpoint, a_resumed_run_equals_an_uninterrupted_one_for_every_strategy) {
    for (int zero = 0; zero <= 3; zero++) {
        StrategyConfig sc = small_gpt(2, 2, 0.1f);
        Strategy *straight = strategy_create(zero, &sc);
        run(straight, steps(0, 8, NULL));
        State want = state_of(straight);

        Strategy *first = strategy_create(zero, &sc);
        run(first, steps(0, 4, dir));
        first->ops->destroy(first);
        Strategy *second = strategy_create(zero, &sc);
        CheckpointInfo info;
        char err[512];
        cr_assert_eq(checkpoint_load(second, path, 1, &info, err, sizeof err), 0, "%s", err);
        cr_expect_eq(info.iter, 4);
        run(second, steps(info.iter, 8, NULL));
        State got = state_of(second);
        cr_expect(same_state(want, got), "--zero=%d: 4 + 4 steps differ from 8", zero);
        cr_expect_eq(second->adam_step, straight->adam_step);
        state_free(want);
        state_free(got);
        straight->ops->destroy(straight);
        second->ops->destroy(second);
    }
}

/* Saved by one strategy and rank count, loaded by another: the same state. */
static void check_reshard(int zero_from, int n_from, int zero_to, int n_to) {
    StrategyConfig from_cfg = small_gpt(n_from, 2, 0.0f), to_cfg = small_gpt(n_to, 2, 0.0f);
    Strategy *from = strategy_create(zero_from, &from_cfg);
    run(from, steps(0, 3, dir));
    State saved = state_of(from);
    from->ops->destroy(from);
    Strategy *to = strategy_create(zero_to, &to_cfg);
    CheckpointInfo info;
    char err[512];
    cr_assert_eq(checkpoint_load(to, path, 1, &info, err, sizeof err), 0, "%s", err);
    State loaded = state_of(to);
    cr_expect(same_state(saved, loaded), "--zero=%d N=%d into --zero=%d N=%d: the state changed", zero_from, n_from,
              zero_to, n_to);
    TrainResult r;
    TrainConfig more = steps(info.iter, 5, NULL);
    cr_expect_eq(train_run(to, &more, &data, &r), 0);
    cr_expect(isfinite(r.last_loss), "training goes on");
    state_free(saved);
    state_free(loaded);
    to->ops->destroy(to);
}

Test(checkpoint, zero3_on_four_ranks_resumes_as_ddp_on_two_and_back) {
    check_reshard(3, 4, 0, 2);
    check_reshard(0, 2, 3, 4);
    check_reshard(1, 3, 2, 2);
}

Test(checkpoint, pytorch_loads_it_and_gets_the_same_loss) {
    need_torch();
    StrategyConfig sc = small_gpt(2, 3, 0.0f);
    Strategy *s = strategy_create(3, &sc);
    run(s, steps(0, 5, dir));
    int rows = sc.batch * sc.nranks, T = sc.model.block_size;
    int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
    dataset_batch(&data, SPLIT_VAL, BATCH_EVAL, sc.seed, 0, 0, rows, T, x, y);
    float ours = s->ops->eval_loss(s, x, y);
    char bpath[300], err[256];
    snprintf(bpath, sizeof bpath, "%s/batch.safetensors", dir);
    StTensor batch[2] = { { "x", "I32", 2, { rows, T }, x }, { "y", "I32", 2, { rows, T }, y } };
    cr_assert_eq(safetensors_write(bpath, batch, 2, NULL, err, sizeof err), 0, "%s", err);
    char cmd[1024];
    torch_gpt_command(cmd, sizeof cmd, "loss --ckpt %s --batch %s", path, bpath);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    double theirs = NAN;
    cr_expect_eq(fscanf(p, "%lf", &theirs), 1, "%s printed no loss", cmd);
    cr_expect_eq(pclose(p), 0, "%s failed", cmd);
    cr_expect(fabs(ours - theirs) <= 1e-5 * theirs, "loss %.8g, PyTorch %.8g", ours, theirs);
    unlink(bpath);
    free(x);
    free(y);
    s->ops->destroy(s);
}

Test(checkpoint, gradient_accumulation_equals_a_larger_batch) {
    int zeros[3] = { 0, 2, 3 };
    for (int i = 0; i < 3; i++) {
        int K = 3;
        StrategyConfig micro = small_gpt(2, 2, 0.0f), large = small_gpt(2, 2 * K, 0.0f);
        TrainConfig tc = steps(0, 4, NULL);
        Strategy *a = strategy_create(zeros[i], &large);
        run(a, tc);
        State want = state_of(a);
        Strategy *b = strategy_create(zeros[i], &micro);
        tc.grad_accum = K;
        run(b, tc);
        State got = state_of(b);
        double d = max_rel_diff(got.w, want.w, want.n);
        cr_expect_lt(d, 1e-6, "--zero=%d: %d micro-steps against one batch %d times larger: %g", zeros[i], K, K, d);
        state_free(want);
        state_free(got);
        a->ops->destroy(a);
        b->ops->destroy(b);
    }
}
