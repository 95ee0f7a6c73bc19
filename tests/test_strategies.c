/* test_strategies.c: the gates of DDP and ZeRO-1 on the CPU simulator.
 *
 * The reference is the plain single-rank loop: one GPT, forward, backward,
 * clipping and AdamW called directly, no strategy, no ranks, no collectives.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/sample.h"
#include "../strategies/trainer.h"
#include "reference.h"

static Dataset data;

static void setup(void) {
    test_stream_setup();
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 16, err, sizeof err), 0, "%s", err);
}

static void teardown(void) {
    dataset_free(&data);
    test_stream_teardown();
}

TestSuite(strategies, .init = setup, .fini = teardown);

enum { ITERS = 6 };

/* Units of 1312 and 3104 floats: neither divides by 3, so N = 3 pads. */
static StrategyConfig small_gpt(int nranks, int batch, float dropout) {
    StrategyConfig sc = {
        .model = { data.vocab, 16, 2, 2, 16 }, .nranks = nranks, .batch = batch, .dropout = dropout,
        .seed = 3, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
    };
    return sc;
}

static TrainConfig quiet(float grad_clip) {
    TrainConfig tc = {
        .iters = ITERS, .schedule = { 1e-2f, 1e-3f, 2, ITERS }, .grad_clip = grad_clip,
        .eval_every = 0, .eval_iters = 0, .log_every = 0, .sample_chars = 0,
    };
    return tc;
}

/* Train through the trainer; return the weights in the unpadded layout. */
static float *train(int zero, StrategyConfig sc, float grad_clip, size_t *n) {
    TrainConfig tc = quiet(grad_clip);
    float *w = train_weights(zero, &sc, &tc, &data, n);
    cr_assert_not_null(w, "--zero=%d on %d ranks failed", zero, sc.nranks);
    return w;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    return diff / scale;
}

/* ---- gate 1: DDP at N = 1 against the plain loop ---- */

Test(strategies, ddp_on_one_rank_is_the_plain_loop) {
    StrategyConfig sc = small_gpt(1, 4, 0.1f);
    int B = sc.batch, T = sc.model.block_size;
    TrainConfig tc = quiet(1.0f);

    /* the plain loop */
    GPT *g = gpt_create(&sc.model, 1, test_device, test_stream, B, T, 1);
    g->dropout = sc.dropout;
    g->seed = sc.seed;
    size_t P = g->layout.total;
    float *init = malloc(P * sizeof(float)), *plain = malloc(P * sizeof(float));
    gpt_init_params(&sc.model, &g->layout, sc.seed, init);
    stream_copy(test_stream, g->params, init, P * sizeof(float));
    float *m = device_alloc(test_device, MEM_OPTIMIZER, P * sizeof(float));
    float *v = device_alloc(test_device, MEM_OPTIMIZER, P * sizeof(float));
    float *sumsq = device_alloc(test_device, MEM_WORKING, sizeof(float));
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    float plain_lr = 0;
    for (int it = 0; it < ITERS; it++) {
        plain_lr = lr_at(&tc.schedule, it);
        dataset_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, sc.seed, (uint32_t)it, 0, B, T, x, y);
        fill_zero(test_stream, g->grads, P);
        gpt_forward(g, x, y, B, T, (uint32_t)it, 1);
        gpt_backward(g, 1.0f);
        sumsq_reduce(test_stream, sumsq, g->grads, P);
        clip_scale(test_stream, g->grads, P, sumsq, 1, tc.grad_clip);
        for (int i = 0; i < g->layout.ntensors; i++) {
            const TensorSpec *t = &g->layout.tensors[i];
            AdamWParams hp = { plain_lr, sc.beta1, sc.beta2, sc.eps,
                               tensor_decays(t) ? sc.weight_decay : 0.0f, it + 1 };
            adamw_update(test_stream, g->params + t->offset, g->grads + t->offset, m + t->offset,
                         v + t->offset, t->numel, hp);
        }
        gpt_read_loss(g);
    }
    stream_copy(test_stream, plain, g->params, P * sizeof(float));
    int plain_text[40] = { 0 }, ddp_text[40] = { 0 };
    gpt_generate(g, plain_text, 1, 39, 1.0f, sc.seed);

    /* DDP through the trainer */
    Strategy *s = strategy_create(0, &sc);
    TrainResult r;
    cr_assert_eq(train_run(s, &tc, &data, &r), 0);
    float *ddp = malloc(P * sizeof(float));
    s->ops->read_weights(s, ddp);
    gpt_generate(s->ops->sampler(s), ddp_text, 1, 39, 1.0f, sc.seed);
    cr_expect(memcmp(plain, ddp, P * sizeof(float)) == 0, "weights differ from the plain loop");
    cr_expect(memcmp(&plain_lr, &s->lr, sizeof plain_lr) == 0, "lr %g, plain %g", s->lr, plain_lr);
    cr_expect(memcmp(plain_text, ddp_text, sizeof plain_text) == 0, "generated text differs");
    s->ops->destroy(s);

    device_free(test_device, MEM_OPTIMIZER, m, P * sizeof(float));
    device_free(test_device, MEM_OPTIMIZER, v, P * sizeof(float));
    device_free(test_device, MEM_WORKING, sumsq, sizeof(float));
    gpt_destroy(g);
    free(init); free(plain); free(ddp); free(x); free(y);
}

/* ---- gate 2: ZeRO-1 bit-identical to DDP without clipping ---- */

Test(strategies, zero1_is_bit_identical_to_ddp_without_clipping) {
    for (int N = 1; N <= 4; N++) {
        size_t n;
        float *ddp = train(0, small_gpt(N, 2, 0.1f), 0.0f, &n);
        float *zero1 = train(1, small_gpt(N, 2, 0.1f), 0.0f, &n);
        cr_expect(memcmp(ddp, zero1, n * sizeof(float)) == 0, "N=%d: ZeRO-1 differs from DDP", N);
        free(ddp);
        free(zero1);
    }
}

/* ---- gate 3: with clipping they differ only in how the norm is summed ---- */

Test(strategies, zero1_agrees_with_ddp_with_clipping) {
    for (int N = 2; N <= 3; N++) {
        size_t n;
        /* a low limit, so every step clips */
        float *ddp = train(0, small_gpt(N, 2, 0.0f), 0.05f, &n);
        float *zero1 = train(1, small_gpt(N, 2, 0.0f), 0.05f, &n);
        double d = max_rel_diff(zero1, ddp, n);
        cr_expect_lt(d, 1e-6, "N=%d: relative difference %g", N, d);
        free(ddp);
        free(zero1);
    }
}

/* ---- gate 4: the global batch, not N, decides the result ---- */

Test(strategies, the_same_global_batch_on_one_and_two_ranks) {
    size_t n;
    float *one = train(0, small_gpt(1, 4, 0.0f), 1.0f, &n);
    float *two = train(0, small_gpt(2, 2, 0.0f), 1.0f, &n);
    float *two_zero1 = train(1, small_gpt(2, 2, 0.0f), 1.0f, &n);
    double d = max_rel_diff(two, one, n), dz = max_rel_diff(two_zero1, one, n);
    cr_expect_lt(d, 1e-5, "DDP N=2 against N=1: relative difference %g", d);
    cr_expect_lt(dz, 1e-5, "ZeRO-1 N=2 against N=1: relative difference %g", dz);
    free(one);
    free(two);
    free(two_zero1);
}

Test(strategies, zero1_holds_a_shard_of_the_optimizer_state) {
    Strategy *ddp = strategy_create(0, &(StrategyConfig){ 0 });
    cr_expect_null(ddp, "zero ranks is refused");
    StrategyConfig sc = small_gpt(4, 2, 0.0f);
    Strategy *d = strategy_create(0, &sc), *z = strategy_create(1, &sc);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(z->ops->rank_bytes(z, r, MEM_OPTIMIZER) * 4, d->ops->rank_bytes(d, r, MEM_OPTIMIZER));
        cr_expect_eq(z->ops->rank_bytes(z, r, MEM_WEIGHTS), d->ops->rank_bytes(d, r, MEM_WEIGHTS));
    }
    cr_expect_null(strategy_create(2, &sc), "ZeRO-2 is not there yet");
    d->ops->destroy(d);
    z->ops->destroy(z);
}
