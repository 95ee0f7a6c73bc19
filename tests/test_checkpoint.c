/* test_checkpoint.c: checkpoints across strategies and rank counts, PyTorch
 * loading them, and gradient accumulation.
 *
 * Without clipping every strategy gives the same bits at the same N (the
 * strategies' gate 2), so there a checkpoint must be the same file whoever
 * wrote it, and a run resumed under any strategy must go on exactly as the
 * uninterrupted one. Across N the reductions add other partial sums: 1e-5. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/models.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "fixtures.h"
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

/* Two blocks 16 wide over rows of 16. */
static const GptShape GATE_GPT = { 2, 16, 16, 9 };

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
    strategy_read_all(s, STATE_WEIGHTS, st.w);
    strategy_read_all(s, STATE_EXP_AVG, st.m);
    strategy_read_all(s, STATE_EXP_AVG_SQ, st.v);
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

/* steps() without clipping, where the strategies give the same bits. */
static TrainConfig unclipped(int start, int iters, const char *out_dir) {
    TrainConfig tc = steps(start, iters, out_dir);
    tc.grad_clip = 0.0f;
    return tc;
}

/* Train --zero=zero from the start through tc (whose out_dir is dir) and keep
 * the checkpoint it saves at the end as `file`. */
static void save_run(int zero, const StrategyConfig *sc, TrainConfig tc, const char *file) {
    Strategy *s = strategy_create(zero, sc);
    cr_assert_not_null(s);
    run(s, tc);
    s->ops->destroy(s);
    cr_assert_eq(rename(path, file), 0, "rename %s to %s", path, file);
}

/* A --zero=zero strategy with the whole state of a checkpoint loaded. */
static Strategy *resumed(int zero, const StrategyConfig *sc, const char *file, CheckpointInfo *info) {
    Strategy *s = strategy_create(zero, sc);
    cr_assert_not_null(s);
    char err[512];
    cr_assert_eq(checkpoint_load(s, file, 1, info, err, sizeof err), 0, "%s", err);
    return s;
}

/* In fp32 and in bf16. */
Test(checkpoint, a_resumed_run_equals_an_uninterrupted_one_for_every_strategy) {
    for (int run_of = 0; run_of < DTYPES * STRATEGY_KINDS; run_of++) {
        int zero = STRATEGIES[run_of % STRATEGY_KINDS].stage;
        StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 2, 2, 0.1f);
        sc.precision = (DType)(run_of / STRATEGY_KINDS);
        Strategy *straight = strategy_create(zero, &sc);
        run(straight, steps(0, 8, NULL));
        State want = state_of(straight);

        Strategy *first = strategy_create(zero, &sc);
        run(first, steps(0, 4, dir));
        first->ops->destroy(first);
        CheckpointInfo info;
        Strategy *second = resumed(zero, &sc, path, &info);
        cr_expect_eq(info.iter, 4);
        run(second, steps(info.iter, 8, NULL));
        State got = state_of(second);
        cr_expect(same_state(want, got), "--zero=%d, precision %d: 4 + 4 steps differ from 8", zero, sc.precision);
        cr_expect_eq(second->adam_step, straight->adam_step);
        state_free(want);
        state_free(got);
        straight->ops->destroy(straight);
        second->ops->destroy(second);
    }
}

/* Saved by one strategy and config, loaded by another: the same state. */
static void check_reshard_cfg(int zero_from, const StrategyConfig *from_cfg, int zero_to, const StrategyConfig *to_cfg) {
    Strategy *from = strategy_create(zero_from, from_cfg);
    run(from, steps(0, 3, dir));
    State saved = state_of(from);
    from->ops->destroy(from);
    CheckpointInfo info;
    Strategy *to = resumed(zero_to, to_cfg, path, &info);
    State loaded = state_of(to);
    cr_expect(same_state(saved, loaded), "--zero=%d N=%d S=%d precision %d into --zero=%d N=%d S=%d precision %d: the "
              "state changed", zero_from, from_cfg->nranks, strategy_shard_ranks(from_cfg), from_cfg->precision, zero_to,
              to_cfg->nranks, strategy_shard_ranks(to_cfg), to_cfg->precision);
    TrainResult r;
    TrainConfig more = steps(info.iter, 5, NULL);
    cr_expect_eq(train_run(to, &more, &data, &r), 0);
    cr_expect(isfinite(r.last_loss), "training goes on");
    state_free(saved);
    state_free(loaded);
    to->ops->destroy(to);
}

/* By rank count and precision (a bf16 run's master weights, m and v are fp32 as fp32's are). */
static void check_reshard_in(int zero_from, int n_from, DType p_from, int zero_to, int n_to, DType p_to) {
    StrategyConfig from_cfg = small_gpt(data.vocab, GATE_GPT, n_from, 2, 0.0f), to_cfg = small_gpt(data.vocab, GATE_GPT, n_to, 2, 0.0f);
    from_cfg.precision = p_from;
    to_cfg.precision = p_to;
    check_reshard_cfg(zero_from, &from_cfg, zero_to, &to_cfg);
}

static void check_reshard(int zero_from, int n_from, int zero_to, int n_to) {
    check_reshard_in(zero_from, n_from, DTYPE_FP32, zero_to, n_to, DTYPE_FP32);
}

Test(checkpoint, zero3_on_four_ranks_resumes_as_ddp_on_two_and_back) {
    check_reshard(3, 4, 0, 2);
    check_reshard(0, 2, 3, 4);
    check_reshard(1, 3, 2, 2);
}

Test(checkpoint, saved_in_bf16_resumes_in_fp32_and_back_to_the_same_state) {
    check_reshard_in(3, 2, DTYPE_BF16, 1, 3, DTYPE_FP32);
    check_reshard_in(0, 3, DTYPE_FP32, 2, 2, DTYPE_BF16);
}

/* Hybrid sharding (--shard-ranks): full DDP's checkpoint resumed as ZeRO-3
 * over 2 groups of 2, and hybrid ZeRO-3's resumed as full ZeRO-1, 3 + 3
 * unclipped steps give DDP's 6 uninterrupted, bit for bit: every group loads
 * the state (a stale replica's forward would move the mean gradient), and
 * reading takes the first group's shards. */
Test(checkpoint, hybrid_sharding_resumes_from_full_and_back) {
    StrategyConfig ddp = small_gpt(data.vocab, GATE_GPT, 4, 2, 0.0f), hybrid = ddp;
    hybrid.shard_ranks = 2;
    Strategy *straight = strategy_create(0, &ddp);
    run(straight, unclipped(0, 6, NULL));
    State want = state_of(straight);
    straight->ops->destroy(straight);
    static const struct { int zero_from, hybrid_from, zero_to, hybrid_to; } moves[] = { { 0, 0, 3, 1 }, { 3, 1, 1, 0 } };
    for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++) {
        Strategy *first = strategy_create(moves[i].zero_from, moves[i].hybrid_from ? &hybrid : &ddp);
        cr_assert_not_null(first);
        run(first, unclipped(0, 3, dir));
        first->ops->destroy(first);
        CheckpointInfo info;
        Strategy *second = resumed(moves[i].zero_to, moves[i].hybrid_to ? &hybrid : &ddp, path, &info);
        run(second, unclipped(info.iter, 6, NULL));
        State got = state_of(second);
        cr_expect(same_state(want, got), "--zero=%d%s saved, --zero=%d%s resumed: 3 + 3 steps differ from DDP's 6",
                  moves[i].zero_from, moves[i].hybrid_from ? " --shard-ranks=2" : "", moves[i].zero_to,
                  moves[i].hybrid_to ? " --shard-ranks=2" : "");
        state_free(got);
        second->ops->destroy(second);
    }
    state_free(want);
}

/* And across N: hybrid ZeRO-3 at N = 4 in groups of 2 into full ZeRO-2 at 3,
 * full ZeRO-1 at 3 into hybrid ZeRO-2 at 6 in groups of 3, and hybrid into
 * hybrid of other groups, the state exactly as saved. */
Test(checkpoint, hybrid_sharding_reshards_across_rank_counts) {
    StrategyConfig four = small_gpt(data.vocab, GATE_GPT, 4, 2, 0.0f), three = small_gpt(data.vocab, GATE_GPT, 3, 2, 0.0f);
    StrategyConfig six = small_gpt(data.vocab, GATE_GPT, 6, 2, 0.0f);
    four.shard_ranks = 2;
    six.shard_ranks = 3;
    check_reshard_cfg(3, &four, 2, &three);
    check_reshard_cfg(1, &three, 2, &six);
    check_reshard_cfg(2, &six, 1, &four);
}

enum { K = 3 };  /* steps before the save, and after it */

/* Tensor `name` of the layout's tensor ts (its shape) holds the same bytes in both files. */
static void expect_same_tensor(const StFile *want, const StFile *got, const char *name, const TensorSpec *ts,
                               int zero, int N) {
    int64_t shape[2] = { ts->shape[0], ts->shape[1] };
    char err[256];
    const void *a = safetensors_tensor(want, name, "F32", ts->ndim, shape, err, sizeof err);
    const void *b = safetensors_tensor(got, name, "F32", ts->ndim, shape, err, sizeof err);
    cr_assert(a && b, "%s", err);
    cr_expect(memcmp(a, b, ts->numel * sizeof(float)) == 0, "N=%d: %s of --zero=%d differs from DDP's", N, name, zero);
}

/* After the same steps the four strategies write the same file: every
 * tensor (weights, lm_head, Adam's m and v) to the byte, and the metadata
 * too, since none of it names the strategy or N. */
Test(checkpoint, every_strategy_writes_the_same_file_after_the_same_steps) {
    for (int N = 2; N <= 3; N++) {
        StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, N, 2, 0.1f);
        ArenaLayout layout;
        model_layout(&sc.model, 1, &layout);
        char files[4][300], err[256];
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            int zero = STRATEGIES[k].stage;
            snprintf(files[zero], sizeof files[zero], "%s/zero%d.safetensors", dir, zero);
            save_run(zero, &sc, unclipped(0, K, dir), files[zero]);
        }
        StFile ddp;
        cr_assert_eq(safetensors_open(&ddp, files[0], err, sizeof err), 0, "%s", err);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            if (!STRATEGIES[k].shards_adam) continue;
            int zero = STRATEGIES[k].stage;
            StFile f;
            cr_assert_eq(safetensors_open(&f, files[zero], err, sizeof err), 0, "%s", err);
            cr_expect_eq(safetensors_count(&f), safetensors_count(&ddp));
            for (int i = 0; i < layout.ntensors; i++) {
                const TensorSpec *ts = &layout.tensors[i];
                char m_name[CHECKPOINT_NAME_MAX], v_name[CHECKPOINT_NAME_MAX];
                snprintf(m_name, sizeof m_name, "%s%s", CHECKPOINT_M_PREFIX, ts->name);
                snprintf(v_name, sizeof v_name, "%s%s", CHECKPOINT_V_PREFIX, ts->name);
                expect_same_tensor(&ddp, &f, ts->name, ts, zero, N);
                expect_same_tensor(&ddp, &f, m_name, ts, zero, N);
                expect_same_tensor(&ddp, &f, v_name, ts, zero, N);
            }
            expect_same_tensor(&ddp, &f, CHECKPOINT_HEAD, &layout.tensors[arena_find(&layout, "transformer.wte.weight")],
                               zero, N);
            cr_expect(f.size == ddp.size && memcmp(f.bytes, ddp.bytes, f.size) == 0,
                      "N=%d: the file of --zero=%d is not DDP's, byte for byte", N, zero);
            safetensors_close(&f);
        }
        safetensors_close(&ddp);
        for (int k = 0; k < STRATEGY_KINDS; k++) unlink(files[STRATEGIES[k].stage]);
    }
}

/* Saved under each strategy after K steps and resumed under each one at
 * the same N (3, which pads every unit), K more steps give the uninterrupted
 * run's weights, m, v and Adam step, bit for bit. The uninterrupted run is
 * DDP's: at the same N without clipping every strategy's is the same. */
Test(checkpoint, saved_under_any_strategy_and_resumed_under_any_other_goes_on_bit_for_bit) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 3, 2, 0.1f);
    Strategy *straight = strategy_create(0, &sc);
    run(straight, unclipped(0, 2 * K, NULL));
    State want = state_of(straight);
    char file[300];
    snprintf(file, sizeof file, "%s/saved.safetensors", dir);
    for (int from = 0; from <= 3; from++) {
        save_run(from, &sc, unclipped(0, K, dir), file);
        for (int to = 0; to <= 3; to++) {
            CheckpointInfo info;
            Strategy *s = resumed(to, &sc, file, &info);
            cr_expect_eq(info.iter, K);
            run(s, unclipped(info.iter, 2 * K, NULL));
            State got = state_of(s);
            cr_expect(same_state(want, got), "saved by --zero=%d, resumed by --zero=%d: %d + %d steps differ from %d",
                      from, to, K, K, 2 * K);
            cr_expect_eq(s->adam_step, straight->adam_step);
            state_free(got);
            s->ops->destroy(s);
        }
    }
    unlink(file);
    state_free(want);
    straight->ops->destroy(straight);
}

/* Saved on N ranks and resumed on fewer with the same global batch (rows
 * per rank scaled up), under every pair of strategies: K more steps agree with
 * the uninterrupted run on the N ranks the run started on to 1e-5 (weights, m
 * and v), with clipping. No dropout: its masks are keyed by rank. */
Test(checkpoint, resumed_on_fewer_ranks_agrees_with_the_uninterrupted_run) {
    struct { int from, to; } counts[2] = { { .from = 4, .to = 2 }, { .from = 3, .to = 1 } };
    char file[300];
    snprintf(file, sizeof file, "%s/saved.safetensors", dir);
    for (int c = 0; c < 2; c++) {
        int rows = 2 * counts[c].from;  /* the global batch */
        StrategyConfig from_cfg = small_gpt(data.vocab, GATE_GPT, counts[c].from, rows / counts[c].from, 0.0f);
        StrategyConfig to_cfg = small_gpt(data.vocab, GATE_GPT, counts[c].to, rows / counts[c].to, 0.0f);
        Strategy *straight = strategy_create(0, &from_cfg);
        run(straight, steps(0, 2 * K, NULL));
        State want = state_of(straight);
        for (int from = 0; from <= 3; from++) {
            save_run(from, &from_cfg, steps(0, K, dir), file);
            for (int to = 0; to <= 3; to++) {
                CheckpointInfo info;
                Strategy *s = resumed(to, &to_cfg, file, &info);
                run(s, steps(info.iter, 2 * K, NULL));
                State got = state_of(s);
                double dw = max_rel_diff(got.w, want.w, want.n), dm = max_rel_diff(got.m, want.m, want.n),
                       dv = max_rel_diff(got.v, want.v, want.n);
                cr_expect(dw < 1e-5 && dm < 1e-5 && dv < 1e-5,
                          "--zero=%d on %d ranks, resumed by --zero=%d on %d: weights %g, m %g, v %g off", from,
                          counts[c].from, to, counts[c].to, dw, dm, dv);
                cr_expect_eq(s->adam_step, straight->adam_step);
                state_free(got);
                s->ops->destroy(s);
            }
        }
        state_free(want);
        straight->ops->destroy(straight);
    }
    unlink(file);
}

Test(checkpoint, pytorch_loads_it_and_gets_the_same_loss) {
    need_torch();
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 2, 3, 0.0f);
    Strategy *s = strategy_create(3, &sc);
    run(s, steps(0, 5, dir));
    int rows = sc.batch * sc.nranks, T = sc.model.block_size;
    int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
    test_batch(&data, SPLIT_VAL, BATCH_EVAL, sc.seed, 0, 0, rows, T, x, y);
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
        StrategyConfig micro = small_gpt(data.vocab, GATE_GPT, 2, 2, 0.0f), large = small_gpt(data.vocab, GATE_GPT, 2, 2 * K, 0.0f);
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

/* ---- the non-finite check before a save ---- */

/* The unpadded (host) index of the padded arena's element `at` under N ranks,
 * or -1 when `at` is padding; the tensor it falls in, in *tensor. */
static long host_index(const ArenaLayout *padded, const ArenaLayout *plain, size_t at, int *tensor) {
    for (int t = 0; t < padded->ntensors; t++) {
        const TensorSpec *ts = &padded->tensors[t];
        if (at < ts->offset || at >= ts->offset + ts->numel) continue;
        *tensor = t;
        return (long)(plain->tensors[t].offset + (at - ts->offset));
    }
    return -1;
}

/* The first and last element of every rank's shard of every unit and of its
 * part of the arena (ZeRO-1's), where they are no padding: every edge of what
 * any strategy holds per rank. Host indices into at[], their tensors into
 * tensor[]; how many. */
static int shard_edges(const ModelConfig *model, int nranks, long *at, int *tensor) {
    ArenaLayout padded, plain;
    gpt_layout(model, nranks, &padded);
    gpt_layout(model, 1, &plain);
    int n = 0;
    for (int u = 0; u <= padded.nunits; u++) {
        size_t base = u < padded.nunits ? padded.units[u].offset : 0;
        size_t shard = (u < padded.nunits ? padded.units[u].size : padded.total) / (size_t)nranks;
        for (int r = 0; r < nranks; r++)
            for (int edge = 0; edge < 2; edge++) {
                long i = host_index(&padded, &plain, base + (size_t)r * shard + (edge ? shard - 1 : 0), &tensor[n]);
                if (i >= 0) at[n++] = i;
            }
    }
    return n;
}

/* One non-finite value (NaN, or +inf at the last edge) in the weights, m or v,
 * at each edge of each rank's shard, under every strategy at N = 3 (padded,
 * uneven shards): every save refuses, naming the tensor and the element, and
 * writes nothing; the state restored, the save goes through. */
Test(checkpoint, a_non_finite_value_anywhere_in_the_state_is_never_saved) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 3, 2, 0.0f);
    ArenaLayout plain;
    gpt_layout(&sc.model, 1, &plain);
    long at[4 * ARENA_MAX_UNITS];
    int tensor[4 * ARENA_MAX_UNITS], edges = shard_edges(&sc.model, sc.nranks, at, tensor);
    cr_assert_gt(edges, 12);
    static const char *const prefix[3] = { "", "optim.exp_avg.", "optim.exp_avg_sq." };
    CheckpointInfo info = { .model = sc.model, .chars = data.vocab, .iter = 2, .adam_step = 2, .seed = sc.seed };
    memcpy(info.itos, data.itos, sizeof info.itos);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        Strategy *s = strategy_create(zero, &sc);
        cr_assert_not_null(s);
        run(s, unclipped(0, 2, NULL));
        State st = state_of(s);
        for (int kind = 0; kind < 3; kind++)
            for (int e = 0; e < edges; e++) {
                float *x = (kind == 0 ? st.w : kind == 1 ? st.m : st.v) + at[e], kept = *x;
                *x = e == edges - 1 ? INFINITY : NAN;
                strategy_write_all(s, (StateOf)kind, kind == 0 ? st.w : kind == 1 ? st.m : st.v);
                char err[512], want[256];
                cr_assert_eq(checkpoint_save(s, path, &info, err, sizeof err), -1,
                             "--zero=%d: saved a %s in %s%s", zero, e == edges - 1 ? "inf" : "NaN", prefix[kind],
                             plain.tensors[tensor[e]].name);
                snprintf(want, sizeof want, "the state is not finite ('%s%s' element %ld is %s)", prefix[kind],
                         plain.tensors[tensor[e]].name, at[e] - (long)plain.tensors[tensor[e]].offset,
                         e == edges - 1 ? "inf" : "nan");
                cr_expect(strstr(err, want), "--zero=%d: '%s', expected '%s'", zero, err, want);
                cr_expect_neq(access(path, F_OK), 0, "--zero=%d: a file was written", zero);
                *x = kept;
                strategy_write_all(s, (StateOf)kind, kind == 0 ? st.w : kind == 1 ? st.m : st.v);
            }
        char err[512];
        cr_expect_eq(checkpoint_save(s, path, &info, err, sizeof err), 0, "--zero=%d, restored: %s", zero, err);
        unlink(path);
        state_free(st);
        s->ops->destroy(s);
    }
}

/* The GELU's form is the model's: kept in the file's config ("gelu"), and a
 * run of the other form refuses the file in one line. */
Test(checkpoint, the_gelu_form_is_saved_and_a_run_of_the_other_refuses_it) {
    StrategyConfig sc = small_gpt(data.vocab, GATE_GPT, 1, 2, 0.0f);
    sc.model.gelu_tanh = 1;
    char file[300];
    snprintf(file, sizeof file, "%s/tanh.safetensors", dir);
    save_run(0, &sc, steps(0, 2, dir), file);
    CheckpointInfo info;
    char err[768];
    cr_assert_eq(checkpoint_read_info(file, &info, err, sizeof err), 0, "%s", err);
    cr_expect_eq(info.model.gelu_tanh, 1, "the file says tanh");
    Strategy *same = resumed(0, &sc, file, &info);
    same->ops->destroy(same);
    sc.model.gelu_tanh = 0;
    Strategy *other = strategy_create(0, &sc);
    cr_assert_not_null(other);
    cr_expect_neq(checkpoint_load(other, file, 1, &info, err, sizeof err), 0, "an exact-GELU run took a tanh file");
    cr_expect(strstr(err, "GELU tanh; this run's is") && strstr(err, ", erf"), "%s", err);
    other->ops->destroy(other);
    unlink(file);
}
