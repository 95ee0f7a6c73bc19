/* test_strategies.c: the gates of DDP and ZeRO-1, 2 and 3 on the CPU simulator.
 *
 * The reference is the plain single-rank loop: one GPT, forward, backward,
 * clipping and AdamW called directly, no strategy, no ranks, no collectives.
 * Every ZeRO stage is then held to DDP: bit-identical, with clipping too, on
 * the small MLP and on a small GPT, through the trainer.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../model/gpt.h"
#include "../model/models.h"
#include "../model/sample.h"
#include "../strategies/buckets.h"
#include "../strategies/ranks.h"
#include "../training/trainer.h"
#include "fixtures.h"
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

/* Three blocks; units of 1312 and 3104 floats, which N = 3, 5, 6 and 7 all
 * pad (checked in gate 4 below). */
static const GptShape GATE_GPT = { 3, 16, 16, 3 };

/* Three layers 22 wide over rows of 14 positions: units of 1738 and 506 real
 * floats, which N = 3, 5, 6 and 7 all pad. */
static StrategyConfig small_mlp(int nranks, int batch) {
    StrategyConfig sc = {
        .model = { data.vocab, 14, 3, 1, 22, MODEL_MLP, 0 }, .nranks = nranks, .batch = batch,
        .seed = 5, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
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

/* ---- gate 1: DDP at N = 1 against the plain loop ---- */

Test(strategies, ddp_on_one_rank_is_the_plain_loop) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 1, 4, 0.1f);
    int B = sc.batch, T = sc.model.block_size;
    TrainConfig tc = quiet(0.05f);  /* a low limit, so every step clips */

    /* the plain loop */
    GPT *g = (GPT *)test_model(&sc.model, B, T);
    g->base.dropout = sc.dropout;
    g->base.seed = sc.seed;
    size_t P = g->base.layout.total;
    float *init = malloc(P * sizeof(float)), *plain = malloc(P * sizeof(float));
    model_init_params(&sc.model, &g->base.layout, sc.seed, init);
    stream_copy(test_stream, g->base.params, init, P * sizeof(float));
    float *m = device_alloc(test_device, MEM_OPTIMIZER, P * sizeof(float));
    float *v = device_alloc(test_device, MEM_OPTIMIZER, P * sizeof(float));
    SquareSum *sumsq = device_alloc(test_device, MEM_WORKING, sizeof(SquareSum));
    int *x = malloc(sizeof(int) * B * T), *y = malloc(sizeof(int) * B * T);
    float plain_lr = 0;
    for (int it = 0; it < ITERS; it++) {
        plain_lr = lr_at(&tc.schedule, it);
        test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, sc.seed, (uint32_t)it, 0, B, T, x, y);
        fill_zero(test_stream, g->base.grads, P);
        gpt_forward(g, x, y, B, T, (uint32_t)it, 1);
        gpt_backward(g, 1.0f);
        sumsq_reduce(test_stream, sumsq, g->base.grads, DTYPE_FP32, P, g->base.sumsq_scratch);
        AdamWParams hp = { plain_lr, sc.beta1, sc.beta2, sc.eps, sc.weight_decay, it + 1 };
        adamw_arena(test_stream, g->base.params, NULL, g->base.grads, DTYPE_FP32, m, v, 0, P, g->base.adamw_spans,
                    g->base.layout.ntensors, hp, (AdamWClip){ sumsq, 1, tc.grad_clip });
        model_read_loss(&g->base);
    }
    stream_copy(test_stream, plain, g->base.params, P * sizeof(float));
    int plain_text[40] = { 0 }, ddp_text[40] = { 0 };
    gpt_generate(g, plain_text, 1, 39, (Sampling){ 1.0f, 0, sc.seed, 0 });

    /* DDP through the trainer */
    Strategy *s = strategy_create(0, &sc);
    TrainResult r;
    cr_assert_eq(train_run(s, &tc, &data, &r), 0);
    float *ddp = malloc(P * sizeof(float));
    strategy_read_all(s, STATE_WEIGHTS, ddp);
    cr_assert_eq(s->ops->generate(s, ddp_text, 1, 39, (Sampling){ 1.0f, 0, sc.seed, 0 }), 0);
    cr_expect(memcmp(plain, ddp, P * sizeof(float)) == 0, "weights differ from the plain loop");
    cr_expect(memcmp(&plain_lr, &s->lr, sizeof plain_lr) == 0, "lr %g, plain %g", s->lr, plain_lr);
    cr_expect(memcmp(plain_text, ddp_text, sizeof plain_text) == 0, "generated text differs");
    s->ops->destroy(s);

    device_free(test_device, MEM_OPTIMIZER, m, P * sizeof(float));
    device_free(test_device, MEM_OPTIMIZER, v, P * sizeof(float));
    device_free(test_device, MEM_WORKING, sumsq, sizeof(SquareSum));
    model_destroy(&g->base);
    free(init); free(plain); free(ddp); free(x); free(y);
}

/* ---- gate 2: every ZeRO stage bit-identical to DDP without clipping ---- */

static void expect_stages_match_ddp(StrategyConfig sc, const char *model) {
    size_t n;
    float *ddp = train(0, sc, 0.0f, &n);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (!STRATEGIES[k].shards_adam) continue;
        int zero = STRATEGIES[k].stage;
        float *w = train(zero, sc, 0.0f, &n);
        cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "%s, N=%d: ZeRO-%d differs from DDP", model,
                  sc.nranks, zero);
        free(w);
    }
    free(ddp);
}

Test(strategies, every_stage_is_bit_identical_to_ddp_on_the_mlp) {
    for (int N = 1; N <= 7; N++) expect_stages_match_ddp(small_mlp(N, 2), "MLP");
}

/* The gates' GPT computing in a precision (--dtype). */
static StrategyConfig gpt_in(DType precision, int nranks, float dropout) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, nranks, 2, dropout);
    sc.precision = precision;
    return sc;
}

static const char *const DTYPE_GPT_NAMES[DTYPES] = { "fp32 GPT", "bf16 GPT" };

/* N = 2 pads no unit, the others every unit (gate 4); in fp32 and in bf16. */
Test(strategies, every_stage_is_bit_identical_to_ddp_on_a_gpt) {
    int counts[5] = { 2, 3, 5, 6, 7 };
    for (int p = 0; p < DTYPES; p++)
        for (int i = 0; i < 5; i++) expect_stages_match_ddp(gpt_in((DType)p, counts[i], 0.1f), DTYPE_GPT_NAMES[p]);
}

/* Every tensor is on its operand boundary in the arena at any width (arena.h):
 * in bf16 each rank's model reads its strategy's weights in place (the full
 * bf16 arena, or ZeRO-3's gathered units), with no copy of its own, in every
 * gate above; here in units of a tensor too, at N = 3, whose padding puts
 * every unit past its tensors: every stage still gives DDP's bits. */
Test(strategies, every_stage_gives_ddps_bits_with_the_weights_read_in_place_in_units_of_a_tensor, .timeout = 300) {
    StrategyConfig sc = gpt_in(DTYPE_BF16, 3, 0.1f);
    sc.units.cut = UNIT_TENSOR;
    cr_assert(strategy_compute(&STRATEGIES[0], &sc).weights_in_place, "the weights not read in place");
    expect_stages_match_ddp(sc, "bf16 GPT in units of a tensor, weights read in place");
}

/* A model writes a gradient straight into the strategy's (grads_fresh) only
 * where each unit's gradient is zero as its backward begins and held in
 * bf16: ZeRO-2/3's slots, computing and reducing in bf16. DDP and ZeRO-1 add
 * each micro-step's gradient into the last's, and fp32 gradients take a bf16
 * one cast up. */
Test(strategies, gradients_are_written_in_place_only_where_each_units_starts_from_zero) {
    for (int k = 0; k < STRATEGY_KINDS; k++)
        for (int p = 0; p < DTYPES; p++)
            for (int r = 0; r < DTYPES; r++) {
                StrategyConfig sc = gpt_in((DType)p, 2, 0.0f);
                sc.reduce_precision = (DType)r;
                int want = STRATEGIES[k].stage >= 2 && p == DTYPE_BF16 && r == DTYPE_BF16;
                cr_expect_eq(strategy_compute(&STRATEGIES[k], &sc).grads_fresh, want, "%s, %s reduced in %s",
                             STRATEGIES[k].name, DTYPE_GPT_NAMES[p], DTYPE_TRAITS[r].name);
            }
}

/* The gradients reduced in bf16 (--reduce-dtype): every stage still gives
 * DDP's bits, in either compute precision, with overlap off and on (DDP's
 * buckets the same bits as its one arena), and on one rank, where the
 * reduction only rounds; and not the bits of a reduction in fp32, so the
 * precision reaches the sums. But on one rank computing in bf16, where every
 * gradient is made in bf16 already: rounding it again changes no bit. */
Test(strategies, every_stage_is_bit_identical_to_ddp_with_gradients_reduced_in_bf16, .timeout = 300) {
    int counts[4] = { 1, 2, 3, 5 };
    for (int p = 0; p < DTYPES; p++)
        for (int i = 0; i < 4; i++) {
            size_t n;
            StrategyConfig sc = gpt_in((DType)p, counts[i], 0.1f);
            float *fp32 = train(0, sc, 0.0f, &n);
            sc.reduce_precision = DTYPE_BF16;
            float *ddp = train(0, sc, 0.0f, &n);
            int made_in_bf16 = p == DTYPE_BF16 && sc.nranks == 1;
            cr_expect((memcmp(fp32, ddp, n * sizeof(float)) == 0) == made_in_bf16, "%s, N=%d: DDP's weights %s "
                      "fp32's with the gradients reduced in bf16", DTYPE_GPT_NAMES[p], sc.nranks,
                      made_in_bf16 ? "differ from" : "are");
            for (int overlap = 0; overlap <= 1; overlap++) {
                sc.overlap.enabled = overlap;
                sc.overlap.bucket_bytes = 8 << 10;
                if (overlap) {
                    float *buckets = train(0, sc, 0.0f, &n);
                    cr_expect(memcmp(ddp, buckets, n * sizeof(float)) == 0, "%s, N=%d, reduced in bf16: DDP's "
                              "buckets differ from its one all-reduce", DTYPE_GPT_NAMES[p], sc.nranks);
                    free(buckets);
                }
                expect_stages_match_ddp(sc, p ? "bf16 GPT reduced in bf16" : "fp32 GPT reduced in bf16");
            }
            free(fp32);
            free(ddp);
        }
}

/* The stress run: 64 ranks (MAX_RANKS), 128 stream workers and the
 * baton among 64 threads, overlap on with small buckets and the prefetch. */
Test(strategies, every_stage_is_bit_identical_to_ddp_at_64_ranks_with_overlap, .timeout = 300) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, MAX_RANKS, 1, 0.1f);
    sc.overlap.enabled = 1;
    sc.overlap.bucket_bytes = 8 << 10;
    expect_stages_match_ddp(sc, "GPT");
}

/* ---- gate 3: with clipping too, the norm's sum exact wherever the shards fall ---- */

Test(strategies, every_stage_is_bit_identical_to_ddp_with_clipping) {
    for (int N = 2; N <= 4; N++) {
        size_t n;
        /* a low limit, so every step clips */
        float *ddp = train(0, small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f), 0.05f, &n);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            if (!STRATEGIES[k].shards_adam) continue;
            int zero = STRATEGIES[k].stage;
            float *w = train(zero, small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f), 0.05f, &n);
            cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "N=%d, clipped: ZeRO-%d differs from DDP (%g)", N,
                      zero, max_rel_diff(w, ddp, n));
            free(w);
        }
        free(ddp);
    }
}

/* ---- clipping's squared-norm partials, pinned ---- */

/* Each rank's part of the gradient set by hand; after clip_grads every rank
 * holds every part's squared norm (its own first for DDP, where the part is
 * the whole arena), byte for byte the reference's exact sum, the gradient is
 * as it was, and the clip its AdamW takes has the coefficient of their sum. */
static void expect_pinned_clipping(int zero, int N) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f);
    Strategy *s = strategy_create(zero, &sc);
    Ranks *ranks = (Ranks *)s;
    size_t len = ranks->grad_part_len;
    int sharded = ranks->grad_parts_sharded, nparts = sharded ? N : 1;
    float *part[MAX_RANKS];
    SquareSum partial[MAX_RANKS], total = square_sum_zero();
    for (int r = 0; r < N; r++) {
        part[r] = malloc(len * sizeof(float));
        fill_uniform(part[r], len, -1, 1, (unsigned)(sharded ? 50 * N + r : 50 * N));  /* DDP's parts agree */
        stream_copy(ranks->pg->compute[r], ranks->grad_part[r], part[r], len * sizeof(float));
        partial[r] = ref_square_sum(part[r], len);
    }
    for (int q = 0; q < nparts; q++) total = square_sum_add(total, partial[q]);
    float max_norm = 0.5f, coef = max_norm / ((float)sqrt(square_sum_value(total)) + 1e-6f);
    cr_assert_lt(coef, 1.0f, "the test must clip");
    s->ops->clip_grads(s, max_norm);
    float *got = malloc(len * sizeof(float));
    SquareSum norms[MAX_RANKS];
    for (int r = 0; r < N; r++) {
        stream_copy(ranks->pg->compute[r], norms, ranks->norm_parts[r], (size_t)nparts * sizeof(SquareSum));
        stream_copy(ranks->pg->compute[r], got, ranks->grad_part[r], len * sizeof(float));
        stream_synchronize(ranks->pg->compute[r]);
        cr_expect(memcmp(norms, partial, (size_t)nparts * sizeof(SquareSum)) == 0,
                  "--zero=%d N=%d: rank %d's squared-norm partials differ from the host's", zero, N, r);
        cr_expect(memcmp(got, part[r], len * sizeof(float)) == 0, "--zero=%d N=%d: rank %d's gradient was written",
                  zero, N, r);
        AdamWClip clip = ranks_step_clip(ranks, r);
        cr_expect(clip.sumsq == ranks->norm_parts[r] && clip.nparts == nparts && clip.max_norm == max_norm,
                  "--zero=%d N=%d: rank %d's step takes another clip", zero, N, r);
        float got_coef = clip_coefficient(norms, nparts, max_norm);
        cr_expect(memcmp(&got_coef, &coef, sizeof coef) == 0, "--zero=%d N=%d rank %d: coefficient %.9g, want %.9g",
                  zero, N, r, got_coef, coef);
    }
    s->ops->clip_grads(s, 0.0f);
    for (int r = 0; r < N; r++)
        cr_expect_null(ranks_step_clip(ranks, r).sumsq, "--zero=%d N=%d: no clip, yet rank %d's step clips", zero, N, r);
    for (int r = 0; r < N; r++) free(part[r]);
    free(got);
    s->ops->destroy(s);
}

Test(strategies, clipping_gathers_each_parts_exact_squared_norm) {
    for (int N = 1; N <= 8; N++)
        for (int k = 0; k < STRATEGY_KINDS; k++) expect_pinned_clipping(STRATEGIES[k].stage, N);
}

/* The step's non-finite check makes the gradient's squared norm, for the
 * clip to reuse: after the check, each rank's own partial is its part's, byte
 * for byte the reference's. A step that does not clip leaves it there; after
 * the next forward_backward (another batch, a new gradient) a clip with no
 * check before it makes it again rather than take the last step's; and a
 * check of the state between the step's check and the clip (its counts pass
 * through the partials' buffer) has the clip make it again too. */
static void expect_clip_norm_of_this_gradient(int zero, int N) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f);
    Strategy *s = strategy_create(zero, &sc);
    Ranks *ranks = (Ranks *)s;
    size_t len = ranks->grad_part_len, rows = (size_t)N * sc.batch * sc.model.block_size;
    int *x = malloc(rows * sizeof(int)), *y = malloc(rows * sizeof(int));
    float *part = malloc(len * sizeof(float));
    static const char *after[3] = { "after the check", "a new gradient after the last check",
                                     "a check of the state between the check and the clip" };
    for (int batch = 0; batch < 3; batch++) {
        for (size_t i = 0; i < rows; i++) {
            x[i] = (int)((i * (batch ? 7 : 3) + (size_t)batch) % (size_t)data.vocab);
            y[i] = (int)((i * 5 + 1) % (size_t)data.vocab);
        }
        cr_assert_eq(s->ops->forward_backward(s, x, y, (uint32_t)batch, 0, 1), 0);
        if (batch != 1) cr_assert_eq(s->ops->count_nonfinite(s, NONFINITE_GRADS), 0);
        if (batch == 2) cr_assert_eq(s->ops->count_nonfinite(s, NONFINITE_STATE), 0);
        if (batch != 0) s->ops->clip_grads(s, 1e-3f);
        for (int r = 0; r < N; r++) {
            SquareSum own;
            int at = ranks->grad_parts_sharded ? ranks_shard_of(ranks, r) : 0;
            stream_copy(ranks->pg->compute[r], part, ranks->grad_part[r], len * sizeof(float));
            stream_copy(ranks->pg->compute[r], &own, ranks->norm_parts[r] + at, sizeof own);
            stream_synchronize(ranks->pg->compute[r]);
            SquareSum want = ref_square_sum(part, len);
            cr_expect(memcmp(&own, &want, sizeof want) == 0, "--zero=%d N=%d rank %d, %s: partial %.17g, want %.17g",
                      zero, N, r, after[batch], square_sum_value(own), square_sum_value(want));
        }
        if (batch == 0) s->ops->clip_grads(s, 0.0f);
        s->ops->step(s);
    }
    free(x); free(y); free(part);
    s->ops->destroy(s);
}

Test(strategies, the_clip_takes_the_norm_of_this_steps_gradient) {
    for (int k = 0; k < STRATEGY_KINDS; k++) expect_clip_norm_of_this_gradient(STRATEGIES[k].stage, 2);
}

/* ---- gate 4: units that N does not divide are padded, and still match ---- */

/* Units pad to lcm(N, ARENA_ALIGN = 128) numbers: 128 for N = 1, 2, 4, 8,
 * which pad only to the alignment. These counts pad every unit of both test
 * models past that: none of their units' floats fills a multiple of N's. */
Test(strategies, the_test_models_have_units_that_every_padding_count_pads) {
    struct { int nranks, multiple; } counts[4] = {
        { .nranks = 3, .multiple = 384 }, { .nranks = 5, .multiple = 640 },
        { .nranks = 6, .multiple = 384 }, { .nranks = 7, .multiple = 896 },
    };
    for (int c = 0; c < 4; c++) {
        int N = counts[c].nranks;
        size_t multiple = (size_t)counts[c].multiple;
        StrategyConfig models[2] = { small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f), small_mlp(N, 2) };
        for (int i = 0; i < 2; i++) {
            ArenaLayout plain, padded;
            model_layout(&models[i].model, 1, &plain);
            model_layout(&models[i].model, N, &padded);
            for (int u = 0; u < plain.nunits; u++) {
                size_t size = plain.units[u].used, padded_size = padded.units[u].size;
                cr_expect_neq(size % multiple, 0, "model %d unit %d: %zu floats need no padding at N=%d", i, u,
                              size, N);
                cr_expect_eq(padded_size % multiple, 0, "model %d unit %d at N=%d: %zu floats", i, u, N,
                             padded_size);
                cr_expect(padded_size > size && padded_size - size < multiple, "model %d unit %d at N=%d: %zu -> %zu",
                          i, u, N, size, padded_size);
            }
        }
    }
}

/* ---- the global batch, not N, decides the result ---- */

Test(strategies, the_same_global_batch_on_one_and_two_ranks) {
    size_t n;
    float *one = train(0, small_gpt(data.vocab, GATE_GPT, 1, 4, 0.0f), 1.0f, &n);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        float *two = train(zero, small_gpt(data.vocab, GATE_GPT, 2, 2, 0.0f), 1.0f, &n);
        double d = max_rel_diff(two, one, n);
        /* fp32 sums split over two ranks instead of one: 1.3e-5 on OpenBLAS's Zen kernels */
        cr_expect_lt(d, 5e-5, "--zero=%d N=2 against DDP N=1: relative difference %g", zero, d);
        free(two);
    }
    free(one);
}

/* ---- evaluation and generation under every stage ---- */

Test(strategies, every_stage_evaluates_and_generates_as_ddp_does) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 3, 2, 0.1f);
    TrainConfig tc = quiet(0.0f);
    int text[4][30];
    float eval[4];
    int rows = sc.nranks * sc.batch, T = sc.model.block_size;
    int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
    test_batch(&data, SPLIT_VAL, BATCH_EVAL, sc.seed, 0, 0, rows, T, x, y);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        Strategy *s = strategy_create(zero, &sc);
        TrainResult r;
        cr_assert_eq(train_run(s, &tc, &data, &r), 0);
        eval[zero] = s->ops->eval_loss(s, x, y);
        text[zero][0] = 1;
        cr_assert_eq(s->ops->generate(s, text[zero], 1, 29, (Sampling){ 1.0f, 0, 7, 0 }), 0);
        s->ops->destroy(s);
        cr_expect(memcmp(&eval[zero], &eval[0], sizeof(float)) == 0, "--zero=%d: eval loss %.9g, DDP %.9g",
                  zero, eval[zero], eval[0]);
        cr_expect(memcmp(text[zero], text[0], sizeof text[0]) == 0, "--zero=%d: other text than DDP", zero);
    }
    cr_expect(isfinite(eval[0]) && eval[0] > 0);
    free(x);
    free(y);
}

/* Weights written after training computes with them, as in a strategy that
 * was given them at its start: the eval loss to the bit, every stage, fp32
 * and bf16 (where the write lands in the master and the bf16 copy is made
 * anew from it). */
Test(strategies, weights_written_mid_run_are_what_the_next_forward_reads) {
    for (int p = 0; p < DTYPES; p++) {
        StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 2, 2, 0.0f);
        sc.precision = (DType)p;
        TrainConfig tc = quiet(0.0f);
        int rows = sc.nranks * sc.batch, T = sc.model.block_size;
        int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
        test_batch(&data, SPLIT_VAL, BATCH_EVAL, sc.seed, 0, 0, rows, T, x, y);
        ArenaLayout layout;
        model_layout(&sc.model, 1, &layout);
        float *w = malloc(layout.total * sizeof(float));
        model_init_params(&sc.model, &layout, sc.seed + 1, w);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            int zero = STRATEGIES[k].stage;
            Strategy *trained = strategy_create(zero, &sc), *fresh = strategy_create(zero, &sc);
            TrainResult r;
            cr_assert_eq(train_run(trained, &tc, &data, &r), 0);
            strategy_write_all(trained, STATE_WEIGHTS, w);
            strategy_write_all(fresh, STATE_WEIGHTS, w);
            float after = trained->ops->eval_loss(trained, x, y), given = fresh->ops->eval_loss(fresh, x, y);
            cr_expect(memcmp(&after, &given, sizeof after) == 0, "--zero=%d %s: eval loss %.9g after a write past "
                      "training, %.9g given the weights at the start", zero, p ? "bf16" : "fp32", after, given);
            trained->ops->destroy(trained);
            fresh->ops->destroy(fresh);
        }
        free(w);
        free(x);
        free(y);
    }
}

/* ---- overlap: the collectives under the compute change no bit ---- */

/* The same run with overlap off and on: small buckets, so DDP has several; a
 * slow link, so the collectives really run under the backward. */
static void expect_overlap_changes_nothing(int zero, int N, int grad_accum, DType precision) {
    size_t n;
    StrategyConfig sc = gpt_in(precision, N, 0.1f);
    TrainConfig tc = quiet(1.0f);
    tc.grad_accum = grad_accum;
    float *off = train_weights(zero, &sc, &tc, &data, &n);
    sc.overlap.enabled = 1;
    sc.overlap.bucket_bytes = 8 << 10;
    sc.link.gbps = 0.2;
    sc.link.latency_us = 20;
    float *on = train_weights(zero, &sc, &tc, &data, &n);
    cr_assert(off && on, "--zero=%d on %d ranks failed", zero, N);
    cr_expect(memcmp(off, on, n * sizeof(float)) == 0, "--zero=%d N=%d, %d micro-step(s), %s: overlap changed the weights",
              zero, N, grad_accum, DTYPE_GPT_NAMES[precision]);
    free(off);
    free(on);
}

Test(strategies, overlap_on_and_off_give_the_same_bits, .timeout = 300) {
    for (int p = 0; p < DTYPES; p++)
        for (int N = 2; N <= 3; N++)
            for (int k = 0; k < STRATEGY_KINDS; k++)
                expect_overlap_changes_nothing(STRATEGIES[k].stage, N, 1, (DType)p);
}

/* With gradient accumulation too, and on one rank, where the reduce-scatter
 * into the slot itself has nothing to move but must still wait for the backward. */
Test(strategies, overlap_with_gradient_accumulation_gives_the_same_bits, .timeout = 300) {
    for (int N = 1; N <= 2; N++)
        for (int p = 0; p < DTYPES; p++)
            for (int k = 0; k < STRATEGY_KINDS; k++)
                expect_overlap_changes_nothing(STRATEGIES[k].stage, N, 3, (DType)p);
}

/* Each kind of micro-step captured once and launched after (rank_graphs.h)
 * gives the eager run's bytes: every stage, with overlap, clipping, dropout
 * (each launch's masks drawn for its own micro-step, read from memory) and
 * three micro-steps (a first, a middle and a last kind), in fp32 and bf16. */
static void expect_graphs_change_nothing(int zero, int N, DType precision) {
    size_t n;
    StrategyConfig sc = gpt_in(precision, N, 0.1f);
    sc.overlap.enabled = 1;
    sc.overlap.bucket_bytes = 8 << 10;
    TrainConfig tc = quiet(1.0f);
    tc.grad_accum = 3;
    float *eager = train_weights(zero, &sc, &tc, &data, &n);
    sc.graphs = 1;
    float *graphs = train_weights(zero, &sc, &tc, &data, &n);
    cr_assert(eager && graphs, "--zero=%d on %d ranks failed", zero, N);
    cr_expect(memcmp(eager, graphs, n * sizeof(float)) == 0, "--zero=%d N=%d, %s: graphs changed the weights", zero, N,
              DTYPE_GPT_NAMES[precision]);
    free(eager);
    free(graphs);
}

Test(strategies, graphs_give_the_eager_runs_bits, .timeout = 300) {
    for (int p = 0; p < DTYPES; p++)
        for (int N = 1; N <= 3; N += 2)
            for (int k = 0; k < STRATEGY_KINDS; k++) expect_graphs_change_nothing(STRATEGIES[k].stage, N, (DType)p);
}

/* A graph keeps its kernels' arguments as captured: what changes from step
 * to step in one and is not read from memory is refused. Dropout's step is
 * (kernels.h's step_at). */
Test(strategies, graphs_refuse_what_a_graph_cannot_hold) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 2, 2, 0.1f);
    sc.graphs = 1;
    char err[160];
    cr_expect_eq(strategy_config_error(3, &sc, err, sizeof err), 0, "%s", err);
    sc.link.gbps = 1.0;
    cr_expect_neq(strategy_config_error(3, &sc, err, sizeof err), 0, "a modeled link with graphs");
}

/* ---- memory: what each stage holds, from the allocations ---- */

Test(strategies, each_stage_holds_its_share_of_the_state) {
    cr_expect_null(strategy_create(0, &(StrategyConfig){ 0 }), "zero ranks is refused");
    int N = 4;
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f);
    ArenaLayout padded;
    model_layout(&sc.model, N, &padded);
    size_t full = padded.total * sizeof(float), part = full / N;
    /* bytes per rank of weights, gradients, optimizer state (m and v) */
    size_t want[4][3] = {
        { full, full, 2 * full },
        { full, full, 2 * part },
        { full, part, 2 * part },
        { part, part, 2 * part },
    };
    MemKind kinds[3] = { MEM_WEIGHTS, MEM_GRADS, MEM_OPTIMIZER };
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        Strategy *s = strategy_create(zero, &sc);
        for (int r = 0; r < N; r++)
            for (int i = 0; i < 3; i++)
                cr_expect_eq(s->ops->rank_bytes(s, r, kinds[i]), want[zero][i], "--zero=%d rank %d kind %d: %zu, want %zu",
                             zero, r, i, s->ops->rank_bytes(s, r, kinds[i]), want[zero][i]);
        size_t working = s->ops->rank_bytes(s, 0, MEM_WORKING);
        size_t slots = (padded.units[0].size + padded.units[1].size) * sizeof(float);
        /* the clipping partials, the model's reduction scratch and AdamW's table, and the slots */
        size_t scratch = column_sums_scratch_floats(sc.batch * sc.model.block_size,
                                                    COLUMN_SUMS_WIDEST * sc.model.embd) * sizeof(float) +
                         sumsq_scratch_bytes(padded.total) + adamw_spans_bytes(&padded);
        size_t expect_working = N * sizeof(SquareSum) + scratch + (zero >= 2 ? slots : 0) + (zero == 3 ? slots : 0);
        cr_expect_eq(working, expect_working, "--zero=%d: working %zu, want %zu", zero, working, expect_working);
        s->ops->destroy(s);
    }
}

/* ---- hybrid sharding: groups of S ranks, replicated over the N / S groups ---- */

/* The (N, S) pairs of the hybrid gates: every S dividing 4, and 6's proper ones. */
static const int HYBRID[][2] = { { 4, 1 }, { 4, 2 }, { 4, 4 }, { 6, 2 }, { 6, 3 } };
enum { HYBRIDS = sizeof HYBRID / sizeof HYBRID[0] };

/* ZeRO-1/2/3 sharded over groups of S ranks (--shard-ranks) give DDP's bits
 * at the same N, overlap off and on: every gradient element is still the sum
 * over ranks 0..N-1 in order, each replica of a shard updated alike. */
Test(strategies, hybrid_sharding_is_bit_identical_to_ddp, .timeout = 300) {
    for (int i = 0; i < HYBRIDS; i++)
        for (int overlap = 0; overlap <= 1; overlap++) {
            size_t n;
            StrategyConfig sc = gpt_in(DTYPE_FP32, HYBRID[i][0], 0.1f);
            sc.overlap.enabled = overlap;
            sc.overlap.bucket_bytes = 8 << 10;
            float *ddp = train(0, sc, 0.0f, &n);
            sc.shard_ranks = HYBRID[i][1];
            for (int k = 0; k < STRATEGY_KINDS; k++) {
                if (!STRATEGIES[k].shards_adam) continue;
                float *w = train(STRATEGIES[k].stage, sc, 0.0f, &n);
                cr_expect(memcmp(ddp, w, n * sizeof(float)) == 0, "N=%d --shard-ranks=%d overlap %d: ZeRO-%d differs "
                          "from DDP", sc.nranks, sc.shard_ranks, overlap, STRATEGIES[k].stage);
                free(w);
            }
            free(ddp);
        }
}

/* With two micro-steps (ZeRO-2/3 reduce each one) hybrid sharding gives full
 * sharding's bits, with clipping too (its norm sums S shards' partials, not
 * N: exact sums, the same). */
Test(strategies, hybrid_sharding_accumulates_and_clips_as_full_sharding, .timeout = 300) {
    for (int i = 0; i < HYBRIDS; i++)
        for (int clip = 0; clip <= 1; clip++)
            for (int k = 0; k < STRATEGY_KINDS; k++) {
                if (!STRATEGIES[k].shards_adam) continue;
                size_t n;
                StrategyConfig sc = gpt_in(DTYPE_FP32, HYBRID[i][0], 0.1f);
                TrainConfig tc = quiet(clip ? 0.05f : 0.0f);
                tc.grad_accum = 2;
                float *full = train_weights(STRATEGIES[k].stage, &sc, &tc, &data, &n);
                sc.shard_ranks = HYBRID[i][1];
                float *hybrid = train_weights(STRATEGIES[k].stage, &sc, &tc, &data, &n);
                cr_assert(full && hybrid);
                cr_expect(memcmp(full, hybrid, n * sizeof(float)) == 0, "N=%d --shard-ranks=%d, two micro-steps%s: "
                          "ZeRO-%d differs from full sharding", sc.nranks, sc.shard_ranks, clip ? ", clipped" : "",
                          STRATEGIES[k].stage);
                free(full);
                free(hybrid);
            }
}

/* Each rank holds the stage's share at S: what it shards, 1/S of the arena
 * padded for S. */
Test(strategies, hybrid_sharding_holds_the_share_of_its_group) {
    int N = 6, S = 3;
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f);
    sc.shard_ranks = S;
    ArenaLayout padded;
    model_layout(&sc.model, S, &padded);
    size_t full = padded.total * sizeof(float), part = full / S;
    MemKind kinds[3] = { MEM_WEIGHTS, MEM_GRADS, MEM_OPTIMIZER };
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        const StrategyKind *kind = &STRATEGIES[k];
        if (!kind->shards_adam) continue;
        size_t want[3] = { kind->shards_weights ? part : full, kind->shards_grads ? part : full, 2 * part };
        Strategy *s = strategy_create(kind->stage, &sc);
        cr_assert_not_null(s);
        double estimate[MEM_KINDS];
        strategy_estimate(kind, &sc, DEVICE_CPU, estimate);
        for (int r = 0; r < N; r++)
            for (int i = 0; i < 3; i++)
                cr_expect_eq(s->ops->rank_bytes(s, r, kinds[i]), want[i], "--zero=%d --shard-ranks=%d rank %d kind %d: "
                             "%zu, want %zu", kind->stage, S, r, i, s->ops->rank_bytes(s, r, kinds[i]), want[i]);
        for (int i = 0; i < 3; i++)
            cr_expect_eq((size_t)estimate[kinds[i]], want[i], "--zero=%d --shard-ranks=%d: the estimate of kind %d is "
                         "%.0f, want %zu", kind->stage, S, i, estimate[kinds[i]], want[i]);
        s->ops->destroy(s);
    }
}

/* Computing in bf16, every stage holds the ZeRO paper's mixed-precision
 * state, to the byte: 2 bytes a parameter of the bf16 compute copy, the
 * gradients in the precision they are reduced in (bf16: the paper's 2; fp32:
 * 4), and K = 12 of master weights, m and v, each whole or its shards as the
 * stage shards it. The estimate says the same, and the formula of bytes per
 * parameter. */
Test(strategies, mixed_precision_holds_the_papers_state) {
    MemKind kinds[3] = { MEM_WEIGHTS, MEM_GRADS, MEM_OPTIMIZER };
    for (int reduce = 0; reduce < DTYPES; reduce++)
        for (int N = 1; N <= 4; N *= 2)
            for (int k = 0; k < STRATEGY_KINDS; k++) {
                const StrategyKind *kind = &STRATEGIES[k];
                StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.0f);
                sc.precision = DTYPE_BF16;
                sc.reduce_precision = (DType)reduce;
                ArenaLayout padded;
                model_layout_units(&sc.model, sc.units.cut, N, &padded);
                size_t numbers = padded.total, part = numbers / (size_t)N, grad_bytes = reduce ? 2 : 4;
                size_t want[3] = { (kind->shards_weights ? part : numbers) * 2,
                                   (kind->shards_grads ? part : numbers) * grad_bytes,
                                   (kind->shards_adam ? part : numbers) * 12 };
                Strategy *s = strategy_create(kind->stage, &sc);
                cr_assert_not_null(s);
                double estimate[MEM_KINDS];
                strategy_estimate(kind, &sc, DEVICE_CPU, estimate);
                double whole, sharded;
                strategy_state_bytes_per_param(kind, N, DTYPE_BF16, (DType)reduce, &whole, &sharded);
                cr_expect_eq((size_t)(whole * numbers + sharded * part), want[0] + want[1] + want[2],
                             "%s at N=%d, reduced in %s: the formula says %g + %g/N bytes a parameter", kind->name, N,
                             reduce ? "bf16" : "fp32", whole, sharded);
                for (int i = 0; i < 3; i++) {
                    for (int r = 0; r < N; r++)
                        cr_expect_eq(s->ops->rank_bytes(s, r, kinds[i]), want[i], "%s in bf16 reduced in %s at N=%d, "
                                     "rank %d, kind %d: %zu bytes, want %zu", kind->name, reduce ? "bf16" : "fp32", N,
                                     r, i, s->ops->rank_bytes(s, r, kinds[i]), want[i]);
                    cr_expect_eq((size_t)estimate[kinds[i]], want[i], "%s in bf16 reduced in %s at N=%d: the "
                                 "estimate of kind %d is %.0f, want %zu", kind->name, reduce ? "bf16" : "fp32", N, i,
                                 estimate[kinds[i]], want[i]);
                }
                s->ops->destroy(s);
            }
}

/* What no run can shard so: an S that does not divide N, and DDP given one. */
Test(strategies, hybrid_sharding_refuses_what_it_cannot_shard) {
    char err[256];
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 4, 2, 0.0f);
    sc.shard_ranks = 3;
    cr_expect_eq(strategy_config_error(3, &sc, err, sizeof err), -1);
    cr_expect(strstr(err, "--shard-ranks=3 must divide the run's 4 ranks") != NULL, "%s", err);
    sc.shard_ranks = 2;
    cr_expect_eq(strategy_config_error(0, &sc, err, sizeof err), -1);
    cr_expect(strstr(err, "DDP (--zero=0) shards nothing") != NULL, "%s", err);
    cr_expect_eq(strategy_config_error(1, &sc, err, sizeof err), 0, "%s", err);
}

/* ---- gate 5: a rank that skips a unit's rendezvous is an error, not a hang ---- */

typedef struct {
    UnitHooks inner;
    int skip_unit;
} SkippingHooks;

static void skip_after_backward(void *ctx, int unit) {
    SkippingHooks *h = ctx;
    if (unit != h->skip_unit) h->inner.after_backward(h->inner.ctx, unit);
}

static void skip_before_forward(void *ctx, int unit) {
    SkippingHooks *h = ctx;
    if (unit != h->skip_unit) h->inner.before_forward(h->inner.ctx, unit);
}

static void pass_before_backward(void *ctx, int unit) {
    SkippingHooks *h = ctx;
    h->inner.before_backward(h->inner.ctx, unit);
}

static void pass_before_forward(void *ctx, int unit) {
    SkippingHooks *h = ctx;
    h->inner.before_forward(h->inner.ctx, unit);
}

Test(strategies, a_rank_skipping_a_units_rendezvous_is_a_mismatch, .timeout = 60) {
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (!STRATEGIES[k].shards_grads) continue;
        int zero = STRATEGIES[k].stage;
        StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 3, 2, 0.0f);
        Strategy *s = strategy_create(zero, &sc);
        Ranks *ranks = (Ranks *)s;
        Model *m = ranks->model[1];
        SkippingHooks h = { m->hooks, 2 };
        m->hooks.ctx = &h;
        m->hooks.before_backward = pass_before_backward;
        m->hooks.before_forward = pass_before_forward;  /* ZeRO-2's waits for the weights' gathers */
        if (zero == 2) m->hooks.after_backward = skip_after_backward;
        else {  /* skip a forward gather instead */
            m->hooks.before_forward = skip_before_forward;
            m->hooks.after_backward = skip_after_backward;
            h.skip_unit = 1;
        }
        int rows = sc.nranks * sc.batch, T = sc.model.block_size;
        int *x = calloc((size_t)rows * T, sizeof(int)), *y = calloc((size_t)rows * T, sizeof(int));
        cr_expect_eq(s->ops->forward_backward(s, x, y, 0, 0, 1), -1, "--zero=%d: the run failed", zero);
        /* rank 1 goes on to the next unit's rendezvous while rank 0 waits at the skipped one */
        const char *e = rank_threads_error(ranks->threads);
        const char *skipped = zero == 2 ? "'unit 2 reduce-scatter'" : "'unit 1 gather'";
        const char *reached = zero == 2 ? "'unit 1 reduce-scatter'" : "'unit 2 gather'";
        cr_expect(strstr(e, "mismatch") && strstr(e, skipped) && strstr(e, reached) && strncmp(e, "rank 1: ", 8) == 0,
                  "--zero=%d: the error names rank 1, %s and %s: %s", zero, reached, skipped, e);
        s->ops->destroy(s);
        free(x);
        free(y);
    }
}

/* ---- units: how finely the blocks are cut, and how many live at once, change no bit ---- */

/* The run of sc, held to DDP's with whole blocks and overlap off: the same
 * bits. With overlap, small buckets and a slow link, as above. */
static void expect_same_bits(const float *want, size_t n, int zero, StrategyConfig sc, int overlap) {
    if (overlap) {
        sc.overlap.enabled = 1;
        sc.overlap.bucket_bytes = 8 << 10;
        sc.link.gbps = 0.2;
        sc.link.latency_us = 20;
    }
    size_t got_n;
    float *got = train(zero, sc, 0.0f, &got_n);
    cr_assert_eq(got_n, n);
    cr_expect(memcmp(got, want, n * sizeof(float)) == 0, "--zero=%d N=%d --unit=%s --max-live-units=%d overlap %d: "
              "other weights than DDP's with whole blocks", zero, sc.nranks, unit_policy_name(sc.units.cut),
              strategy_live_units(&sc), overlap);
    free(got);
}

/* A block is one unit, two or four; ZeRO-2/3's working buffers shrink with them. */
static void expect_units_of(UnitPolicy unit, int zero, const StrategyConfig *sc, size_t *working) {
    static const int per_block[UNIT_POLICIES] = { [UNIT_BLOCK] = 1, [UNIT_HALF] = 2, [UNIT_TENSOR] = 4 };
    Strategy *s = strategy_create(zero, sc);
    cr_assert_not_null(s);
    Ranks *ranks = (Ranks *)s;
    cr_expect_eq(ranks->layout->nunits, 1 + per_block[unit] * sc->model.layers, "--unit=%s: %d units",
                 unit_policy_name(unit), ranks->layout->nunits);
    *working = s->ops->rank_bytes(s, 0, MEM_WORKING);
    s->ops->destroy(s);
}

/* In fp32 at N = 1..4, in bf16 at N = 2 and 3. */
Test(strategies, every_unit_policy_gives_the_same_bits, .timeout = 300) {
    for (int run = 0; run < 6; run++) {
        DType precision = run < 4 ? DTYPE_FP32 : DTYPE_BF16;
        int N = run < 4 ? run + 1 : run - 2;
        size_t n;
        float *ddp = train(0, gpt_in(precision, N, 0.1f), 0.0f, &n);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            int zero = STRATEGIES[k].stage;
            size_t working[UNIT_POLICIES];
            for (int unit = 0; unit < UNIT_POLICIES; unit++) {
                StrategyConfig sc = gpt_in(precision, N, 0.1f);
                sc.units.cut = (UnitPolicy)unit;
                expect_units_of(sc.units.cut, zero, &sc, &working[unit]);
                for (int overlap = 0; overlap <= 1; overlap++) expect_same_bits(ddp, n, zero, sc, overlap);
            }
            if (zero >= 2)
                cr_expect(working[UNIT_BLOCK] > working[UNIT_HALF] && working[UNIT_HALF] > working[UNIT_TENSOR],
                          "--zero=%d N=%d: working %zu, %zu, %zu bytes for blocks, halves, tensors", zero, N,
                          working[UNIT_BLOCK], working[UNIT_HALF], working[UNIT_TENSOR]);
        }
        free(ddp);
    }
}

/* GPT-2's biases, in every unit policy: each bias in its weight's unit. */
Test(strategies, every_unit_policy_gives_the_same_bits_with_biases, .timeout = 300) {
    for (int N = 2; N <= 3; N++) {
        StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.1f);
        sc.model.bias = 1;
        size_t n;
        float *ddp = train(0, sc, 0.0f, &n);
        for (int k = 0; k < STRATEGY_KINDS; k++)
            for (int unit = 0; unit < UNIT_POLICIES; unit++) {
                sc.units.cut = (UnitPolicy)unit;
                expect_same_bits(ddp, n, STRATEGIES[k].stage, sc, 1);
            }
        /* DDP with a bucket a tensor: each bias's all-reduce starts at its own grad_done */
        StrategyConfig each = sc;
        each.overlap.enabled = 1;
        each.overlap.bucket_bytes = 4;
        size_t got_n;
        float *got = train(0, each, 0.0f, &got_n);
        cr_expect(got_n == n && memcmp(got, ddp, n * sizeof(float)) == 0, "N=%d: a bucket a tensor differs", N);
        free(got);
        free(ddp);
    }
}

/* GPT-2's shape, reduced: biases, GELU's tanh form, its vocabulary of 50304
 * (the classifier in chunks of 333 rows, the last of a sequence's 512
 * ragged), a block of 512 (half GPT-2's, which keeps the sanitizer's run
 * short), 2 layers; over 3 ranks: uneven shards, padded units. */
static void expect_stages_match_ddp_on_a_reduced_gpt2(DType precision) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 3, 1, 0.1f);
    sc.model = (ModelConfig){ 50304, 512, 2, 2, 32, MODEL_GPT, 1, 1 };
    sc.precision = precision;
    expect_stages_match_ddp(sc, precision == DTYPE_BF16 ? "reduced GPT-2 in bf16" : "reduced GPT-2");
}

Test(strategies, every_stage_is_bit_identical_to_ddp_on_a_reduced_gpt2, .timeout = 300) {
    expect_stages_match_ddp_on_a_reduced_gpt2(DTYPE_FP32);
}

Test(strategies, every_stage_is_bit_identical_to_ddp_on_a_reduced_gpt2_in_bf16, .timeout = 300) {
    expect_stages_match_ddp_on_a_reduced_gpt2(DTYPE_BF16);
}

/* K = 1, 2, 3 units live at once (ZeRO-3 prefetching 0, 1, 2 ahead), on the
 * finest units, where K = 3 runs ahead across a block's boundary. */
Test(strategies, every_live_unit_limit_gives_the_same_bits, .timeout = 300) {
    for (int N = 2; N <= 3; N++) {
        size_t n;
        float *ddp = train(0, small_gpt(data.vocab, GATE_GPT, N, 2, 0.1f), 0.0f, &n);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            if (!STRATEGIES[k].shards_grads) continue;
            int zero = STRATEGIES[k].stage;
            for (int K = 1; K <= 3; K++) {
                StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.1f);
                sc.units.cut = UNIT_TENSOR;
                sc.overlap.max_live_units = K;
                expect_same_bits(ddp, n, zero, sc, 1);
            }
        }
        free(ddp);
    }
}

/* ---- activation recompute: the same losses and weights, fewer activations ---- */

/* ITERS steps of sc under a stage, driven by hand so that every step's loss
 * is seen; returns the weights, the losses into losses[ITERS] and rank 0's
 * activation bytes into *activations. */
static float *train_with_losses(int zero, const StrategyConfig *sc, float losses[ITERS], size_t *activations) {
    Strategy *s = strategy_create(zero, sc);
    cr_assert_not_null(s);
    int rows = sc->nranks * sc->batch, T = sc->model.block_size;
    int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
    for (int it = 0; it < ITERS; it++) {
        test_batch(&data, SPLIT_TRAIN, BATCH_TRAIN, sc->seed, (uint32_t)it, 0, rows, T, x, y);
        s->ops->set_lr(s, 1e-2f);
        cr_assert_eq(s->ops->forward_backward(s, x, y, (uint32_t)it, 0, 1), 0);
        losses[it] = s->ops->train_loss(s);
        s->ops->step(s);
    }
    ArenaLayout plain;
    model_layout(&sc->model, 1, &plain);
    float *w = malloc(plain.total * sizeof(float));
    strategy_read_all(s, STATE_WEIGHTS, w);
    *activations = s->ops->rank_bytes(s, 0, MEM_ACTIVATIONS);
    s->ops->destroy(s);
    free(x);
    free(y);
    return w;
}

/* Recompute (each block's forward run again before its backward) gives the
 * losses and weights of keeping every block's internals, every strategy at
 * N = 2 and 3, overlap off and on, in fp32 and in bf16; in bf16 with biases,
 * the one block's internals kept in bf16 as every block's are without. */
Test(strategies, recompute_gives_the_same_losses_and_weights, .timeout = 300) {
    for (int N = 2; N <= 3; N++) {
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            int zero = STRATEGIES[k].stage;
            for (int variant = 0; variant < 4; variant++) {  /* overlap off and on, in fp32 and in bf16 */
                int overlap = variant % 2;
                StrategyConfig sc = gpt_in(variant < 2 ? DTYPE_FP32 : DTYPE_BF16, N, 0.1f);
                sc.model.bias = variant >= 2;
                sc.overlap.enabled = overlap;
                float kept_loss[ITERS], again_loss[ITERS];
                size_t kept_bytes, again_bytes;
                float *kept = train_with_losses(zero, &sc, kept_loss, &kept_bytes);
                sc.units.recompute = 1;
                float *again = train_with_losses(zero, &sc, again_loss, &again_bytes);
                ArenaLayout plain;
                model_layout(&sc.model, 1, &plain);
                cr_expect(memcmp(kept_loss, again_loss, sizeof kept_loss) == 0,
                          "--zero=%d N=%d overlap %d %s: recompute changed a loss", zero, N, overlap,
                          DTYPE_GPT_NAMES[sc.precision]);
                cr_expect(memcmp(kept, again, plain.total * sizeof(float)) == 0,
                          "--zero=%d N=%d overlap %d %s: recompute changed the weights", zero, N, overlap,
                          DTYPE_GPT_NAMES[sc.precision]);
                cr_expect_lt(again_bytes, kept_bytes, "--zero=%d: activations %zu bytes with recompute, %zu without",
                             zero, again_bytes, kept_bytes);
                free(kept);
                free(again);
            }
        }
    }
}

/* What --recompute-gelu and --recompute-norms make again (llm.c's
 * --recompute 1 and 2), each and both: the same losses and weights under DDP
 * and ZeRO-3 (in units of a tensor, where each LayerNorm's weights come with
 * its Linear's unit), in fp32 and in bf16 with dropout and biases, and
 * exactly what is not kept the fewer activation bytes: every block's but
 * one, GELU's output 4C numbers a position and the LayerNorms' 2C, fp32's or
 * bf16's. */
Test(strategies, what_is_made_again_gives_the_same_losses_and_weights, .timeout = 300) {
    int zeros[2] = { 0, 3 };
    for (int z = 0; z < 2; z++)
        for (int p = 0; p < DTYPES; p++) {
            StrategyConfig sc = gpt_in((DType)p, 2, 0.1f);
            sc.model.bias = 1;
            if (zeros[z] == 3) sc.units.cut = UNIT_TENSOR;
            float kept_loss[ITERS], again_loss[ITERS];
            size_t kept_bytes, again_bytes;
            float *kept = train_with_losses(zeros[z], &sc, kept_loss, &kept_bytes);
            ArenaLayout plain;
            model_layout(&sc.model, 1, &plain);
            for (int what = 1; what <= 3; what++) {
                sc.units.recompute_gelu = what & 1;
                sc.units.recompute_norms = what >> 1;
                const char *name = what == 1 ? "gelu" : what == 2 ? "norms" : "gelu and norms";
                float *again = train_with_losses(zeros[z], &sc, again_loss, &again_bytes);
                cr_expect(memcmp(kept_loss, again_loss, sizeof kept_loss) == 0, "--zero=%d %s: recompute %s changed "
                          "a loss", zeros[z], DTYPE_GPT_NAMES[p], name);
                cr_expect(memcmp(kept, again, plain.total * sizeof(float)) == 0, "--zero=%d %s: recompute %s changed "
                          "the weights", zeros[z], DTYPE_GPT_NAMES[p], name);
                size_t BTC = (size_t)sc.batch * sc.model.block_size * sc.model.embd, L = (size_t)sc.model.layers;
                size_t per_block = (what & 1 ? 4 : 0) + (what & 2 ? 2 : 0);
                size_t saved = (L - 1) * per_block * BTC * (p == DTYPE_BF16 ? sizeof(bf16) : sizeof(float));
                cr_expect_eq(kept_bytes - again_bytes, saved, "--zero=%d %s, recompute %s: %zu activation bytes "
                             "fewer, want %zu", zeros[z], DTYPE_GPT_NAMES[p], name, kept_bytes - again_bytes, saved);
                free(again);
            }
            free(kept);
        }
}

/* PyTorch's rule, from the tensors' shapes: in backward order, a bucket takes
 * tensors until it holds at least the cap (1 MB or less for the first, then
 * bucket_bytes); the root's tensors all wait for tensor 0. Each bucket's range
 * runs from its lowest tensor to where the bucket before it began. */
static int expected_buckets(const ArenaLayout *layout, size_t bucket_bytes, BucketSpan *want) {
    int n = 0, first = layout->ntensors - 1;
    size_t held = 0, cap = bucket_bytes < (1u << 20) ? bucket_bytes : (1u << 20), above = layout->total;
    for (int t = layout->ntensors - 1; t >= 0; t--) {
        const TensorSpec *ts = &layout->tensors[t];
        held += (size_t)ts->shape[0] * (size_t)(ts->ndim == 2 ? ts->shape[1] : 1) * sizeof(float);
        int closes = t == 0 || (held >= cap && ts->unit != 0);
        if (!closes) continue;
        want[n++] = (BucketSpan){ first, t, ts->offset, above - ts->offset };
        above = ts->offset;
        first = t - 1;
        held = 0;
        cap = bucket_bytes;
    }
    return n;
}

static void expect_plan(const ModelConfig *model, int nranks, size_t bucket_bytes, int min_buckets) {
    ArenaLayout layout;
    gpt_layout(model, nranks, &layout);
    BucketSpan got[ARENA_MAX_TENSORS], want[ARENA_MAX_TENSORS];
    int n = ddp_plan_buckets(&layout, bucket_bytes, 1, got), expected = expected_buckets(&layout, bucket_bytes, want);
    cr_assert_eq(n, expected, "%zu-byte buckets: %d planned, %d expected", bucket_bytes, n, expected);
    cr_expect_geq(n, min_buckets, "%zu-byte buckets: %d", bucket_bytes, n);
    size_t covered = 0;
    for (int k = 0; k < n; k++) {
        cr_expect(got[k].first_tensor == want[k].first_tensor && got[k].last_tensor == want[k].last_tensor,
                  "%zu-byte buckets: bucket %d holds tensors %d..%d, expected %d..%d", bucket_bytes, k,
                  got[k].last_tensor, got[k].first_tensor, want[k].last_tensor, want[k].first_tensor);
        cr_expect(got[k].offset == want[k].offset && got[k].length == want[k].length,
                  "%zu-byte buckets: bucket %d is [%zu, +%zu) floats, expected [%zu, +%zu)", bucket_bytes, k,
                  got[k].offset, got[k].length, want[k].offset, want[k].length);
        covered += got[k].length;
    }
    cr_expect_eq(covered, layout.total, "the buckets do not tile the arena");
    cr_expect_eq(ddp_plan_buckets(&layout, bucket_bytes, 0, got), 1, "without overlap, one bucket");
    cr_expect(got[0].offset == 0 && got[0].length == layout.total, "without overlap, the whole arena");
}

/* The exact plan at two bucket sizes on a GPT of four blocks (tensors of 1 to
 * 48 KB, units padded for 3 ranks), and at the default 25 MB on the char preset,
 * whose first bucket is 1 MB. */
Test(strategies, ddp_buckets_are_planned_as_pytorch_plans_them) {
    ModelConfig gpt = { data.vocab, 64, 4, 2, 64, MODEL_GPT, 0, 0 }, char_preset = { 65, 256, 6, 6, 384, MODEL_GPT, 0, 0 };
    expect_plan(&gpt, 3, 8 << 10, 16);
    expect_plan(&gpt, 3, 100 << 10, 3);
    expect_plan(&char_preset, 1, 25000000, 3);
}

Test(strategies, recompute_needs_whole_block_units) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 2, 2, 0.0f);
    sc.units.recompute = 1;
    sc.units.cut = UNIT_HALF;
    cr_expect_null(strategy_create(3, &sc), "--recompute=1 with --unit=half is refused");
}
