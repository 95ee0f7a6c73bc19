/* test_train.c: the trainer: learning, determinism, the schedule, NaNs and skipped steps,
 * bin/sample, the gpt2 presets. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../kernels/backend.h"  /* cuda_kernel_ops: whether this build has CUDA */
#include "../kernels/cpu/cpu_setup.h"
#include "../model/models.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "../tools/options.h"
#include "fixtures.h"
#include "reference.h"

static Dataset data;

static void setup(void) {
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
}

static void teardown(void) { dataset_free(&data); }

TestSuite(train, .init = setup, .fini = teardown);

Test(train, a_short_run_lowers_the_validation_loss) {
    StrategyConfig sc = small_gpt(data.vocab, (GptShape){ 2, 32, 32, 1 }, 1, 8, 0.0f);
    Strategy *s = strategy_create(0, &sc);
    float before = evaluate(s, &data, SPLIT_VAL, 4);
    TrainConfig tc = quiet_run(80);
    TrainResult r;
    cr_assert_eq(train_run(s, &tc, &data, &r), 0);
    cr_expect_lt(r.val_loss, before - 0.5f, "val loss %g -> %g", before, r.val_loss);
    s->ops->destroy(s);
}

static float *train_and_read(StrategyConfig sc, int iters, size_t *n) {
    TrainConfig tc = quiet_run(iters);
    float *w = train_weights(0, &sc, &tc, &data, n);
    cr_assert_not_null(w);
    return w;
}

Test(train, the_same_seed_gives_bit_identical_weights) {
    size_t n;
    float *a = train_and_read(small_gpt(data.vocab, (GptShape){ 2, 32, 32, 7 }, 1, 8, 0.1f), 10, &n);
    float *b = train_and_read(small_gpt(data.vocab, (GptShape){ 2, 32, 32, 7 }, 1, 8, 0.1f), 10, &n);
    float *c = train_and_read(small_gpt(data.vocab, (GptShape){ 2, 32, 32, 8 }, 1, 8, 0.1f), 10, &n);
    cr_expect(memcmp(a, b, n * sizeof(float)) == 0, "two runs of seed 7 differ");
    cr_expect(memcmp(a, c, n * sizeof(float)) != 0, "seeds 7 and 8 gave the same weights");
    free(a); free(b); free(c);
}

Test(train, a_non_finite_loss_stops_the_run) {
    StrategyConfig sc = small_gpt(data.vocab, (GptShape){ 2, 32, 32, 1 }, 1, 8, 0.0f);
    Strategy *s = strategy_create(0, &sc);
    ArenaLayout layout;
    gpt_layout(&sc.model, 1, &layout);
    float *w = malloc(layout.total * sizeof(float));
    strategy_read_all(s, STATE_WEIGHTS, w);
    w[layout.tensors[arena_find(&layout, "transformer.ln_f.weight")].offset] = NAN;
    strategy_write_all(s, STATE_WEIGHTS, w);
    TrainConfig tc = quiet_run(5);
    TrainResult r;
    cr_expect_eq(train_run(s, &tc, &data, &r), 1);
    cr_expect(isnan(r.last_loss));
    s->ops->destroy(s);
    free(w);
}

Test(train, learning_rate_schedule) {
    LRSchedule s = { 1e-3f, 1e-4f, 100, 2000 };
    cr_expect_float_eq(lr_at(&s, 0), 1e-3f / 101, 1e-9f);
    cr_expect_float_eq(lr_at(&s, 99), 1e-3f * 100 / 101, 1e-9f);
    cr_expect_float_eq(lr_at(&s, 100), 1e-3f, 1e-9f);
    cr_expect_float_eq(lr_at(&s, 1050), 5.5e-4f, 1e-8f);  /* half way: the mean of lr and min_lr */
    cr_expect_float_eq(lr_at(&s, 2000), 1e-4f, 1e-9f);
    cr_expect_float_eq(lr_at(&s, 5000), 1e-4f, 1e-9f);
}

/* ---- bin/train on bad input: exit status and a single line on stderr ---- */

Test(train, on_nan_stop_stops_and_skip_skips_within_max_skips, .timeout = 300) {
    char dir[64], ckpt[128], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    setenv("ZF_INJECT_NAN", "loss:3", 1);
    snprintf(args, sizeof args, "%s --iters=6 --out=%s --resume=%s", TINY, dir, ckpt);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "the training loss is NaN at iter 3; stopping",
                    "--on-nan=stop");
    expect_unchanged(ckpt, good, n, "a stopped run changed the checkpoint");
    free(good);
    /* skipped steps apply no update: 6 steps, 2 of them skipped, 4 updates */
    setenv("ZF_INJECT_NAN", "grad:3:2", 1);
    snprintf(args, sizeof args, "%s --iters=6 --on-nan=skip --max-skips=2 --out=%s --resume=%s", TINY, dir, ckpt);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "%s", err);
    cr_expect_eq(adam_steps_of(ckpt), 4);
    /* a skipped step logs no loss: the JSON lines hold no NaN */
    char log[160];
    snprintf(log, sizeof log, "%s/log.jsonl", dir);
    setenv("ZF_INJECT_NAN", "loss:1", 1);
    snprintf(args, sizeof args, "%s --iters=3 --on-nan=skip --log-every=1 --log=%s", TINY, log);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "%s", err);
    size_t log_n;
    char *log_text = (char *)read_all(log, &log_n);
    log_text[log_n] = 0;
    cr_expect(strstr(log_text, "\"iter\": 0, \"loss\"") && strstr(log_text, "\"iter\": 2, \"loss\""), "%s", log_text);
    cr_expect(!strstr(log_text, "\"iter\": 1, \"loss\"") && !strstr(log_text, "nan"), "%s", log_text);
    free(log_text);
    /* one more than --max-skips stops the run */
    setenv("ZF_INJECT_NAN", "grad:6:3", 1);
    snprintf(args, sizeof args, "%s --iters=10 --on-nan=skip --max-skips=2 --out=%s --resume=%s", TINY, dir, ckpt);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "the gradient is not finite (1 NaN or infinite values) at iter 8, after 2 skipped steps", "--max-skips");
    unsetenv("ZF_INJECT_NAN");
    cr_expect_eq(adam_steps_of(ckpt), 4, "the stopped run saved");
    remove_dir(dir);
}

/* In fp32, and with the gradients held in bf16 (computed and reduced in bf16). */
Test(train, count_nonfinite_finds_a_poisoned_gradient_under_every_strategy, .timeout = 60) {
    StrategyConfig sc = small_gpt(data.vocab, (GptShape){ 2, 32, 32, 1 }, 1, 8, 0.0f);
    int x[16 * 32] = { 0 };
    /* read once, at the first step: it poisons step 1 only */
    setenv("ZF_INJECT_NAN", "grad:1", 1);
    for (int p = 0; p < DTYPES; p++)
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            int zero = STRATEGIES[k].stage;
            sc.nranks = 2;
            sc.batch = 4;
            sc.precision = sc.reduce_precision = (DType)p;
            const char *held = p ? "gradients held in bf16" : "fp32";
            Strategy *s = strategy_create(zero, &sc);
            cr_assert_eq(s->ops->forward_backward(s, x, x, 0, 0, 1), 0);
            cr_expect_eq(s->ops->count_nonfinite(s, NONFINITE_GRADS), 0, "%s, %s", s->kind->name, held);
            cr_expect_eq(s->ops->count_nonfinite(s, NONFINITE_STATE), 0, "%s, %s", s->kind->name, held);
            cr_assert_eq(s->ops->forward_backward(s, x, x, 1, 0, 1), 0);
            cr_expect_eq(s->ops->count_nonfinite(s, NONFINITE_GRADS), 1, "%s, %s", s->kind->name, held);
            s->ops->destroy(s);
        }
    unsetenv("ZF_INJECT_NAN");
}

/* A safetensors file of one header and n data bytes. */
Test(train, bin_sample_names_its_own_flags_and_streams_long_text, .timeout = 300) {
    char dir[64], ckpt[128], args[512], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(args, sizeof args, "--ckpt=%s --chars=-1", ckpt);
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 2, err,
                    "the sample's length (--chars or --tokens) is -1: it must not be negative", "--chars=-1");
    cr_expect(strstr(err, "sample-chars") == NULL, "bin/sample named train's flag: %s", err);
    /* past a piece of output (4096 characters): the shorter text is the
     * longer one's beginning, and each is as long as asked */
    char out_long[160], out_short[160];
    snprintf(out_long, sizeof out_long, "%s/long.txt", dir);
    snprintf(out_short, sizeof out_short, "%s/short.txt", dir);
    snprintf(args, sizeof args, "--ckpt=%s --chars=4500 --prompt=ab", ckpt);
    cr_assert_eq(run_tool(sample_binary(), args, out_long, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "--ckpt=%s --chars=4200 --prompt=ab", ckpt);
    cr_assert_eq(run_tool(sample_binary(), args, out_short, err, sizeof err), 0, "%s", err);
    size_t n_long, n_short;
    unsigned char *text_long = read_all(out_long, &n_long), *text_short = read_all(out_short, &n_short);
    cr_expect_eq(n_long, 2 + 4500 + 1);
    cr_expect_eq(n_short, 2 + 4200 + 1);
    cr_expect(n_short <= n_long && memcmp(text_long, text_short, n_short - 1) == 0,
              "4200 characters are not the beginning of 4500");
    free(text_long);
    free(text_short);
    snprintf(args, sizeof args, "--ckpt=%s --chars=10", ckpt);
    expect_one_line(run_tool(sample_binary(), args, "/dev/full", err, sizeof err), 1, err, "cannot write the text",
                    "bin/sample on /dev/full");
    remove_dir(dir);
}

/* bin/train's options from a line of flags over a default preset; they must parse. */
static TrainOptions options_of(const char *flags, const char *preset) {
    char line[128], err[256], *argv[8];
    snprintf(line, sizeof line, "%s", flags);
    int argc = split_args(line, argv, 8);
    TrainOptions o;
    cr_assert_eq(options_read(&o, TOOL_TRAIN, preset, argc, argv, err, sizeof err), 0, "'%s': %s", flags, err);
    return o;
}

/* The GPT-2 presets: nanoGPT's configs, with biases, over its train_gpt2
 * recipe, and GPT-2's 50257 ids padded to 50304 (a text's 65 stay 65). */
Test(train, the_gpt2_presets_are_nanogpts_configs_and_recipe) {
    static const struct { const char *name; int layers, heads, embd; } want[] = {
        { "gpt2", 12, 12, 768 }, { "gpt2-medium", 24, 16, 1024 }, { "gpt2-large", 36, 20, 1280 },
        { "gpt2-xl", 48, 25, 1600 },
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char line[64];
        snprintf(line, sizeof line, "--preset=%s", want[i].name);
        TrainOptions o = options_of(line, "char");
        cr_expect(o.layers == want[i].layers && o.heads == want[i].heads && o.embd == want[i].embd, "%s",
                  want[i].name);
        cr_expect(o.block == 1024 && o.bias == 1 && o.batch == 12 && o.grad_accum == 5 && o.warmup == 2000 &&
                  o.lr == 6e-4f && o.min_lr == 6e-5f && o.beta2 == 0.95f && o.weight_decay == 0.1f && o.dropout == 0,
                  "%s: not nanoGPT's train_gpt2 recipe", want[i].name);
        cr_expect_eq(options_model_vocab(&o, GPT2_VOCAB), 50304, "%s", want[i].name);
        ModelConfig cfg = options_model(&o, GPT2_VOCAB);
        cr_expect(cfg.vocab == 50304 && cfg.gelu_tanh, "%s: GPT-2's padded vocabulary and its GELU", want[i].name);
        cr_expect_null(gpt_config_error(&cfg), "%s", want[i].name);
    }
    TrainOptions o = options_of("", "char");
    cr_expect_eq(options_model_vocab(&o, 65), 65);
    cr_expect_eq(o.bias, 0);
    cr_expect_eq(options_model(&o, 65).gelu_tanh, 0, "the char presets keep nanoGPT's exact GELU");
}

/* The precision flags reach the run's config: fp32 by default, bf16 asked
 * (--dtype for the compute, --reduce-dtype for the gradients' sums), each
 * apart from the other. */
Test(train, the_precision_flags_reach_the_config) {
    static const struct { const char *flags; DType compute, reduce; } runs[] = {
        { "", DTYPE_FP32, DTYPE_FP32 },
        { "--dtype=bf16", DTYPE_BF16, DTYPE_FP32 },
        { "--reduce-dtype=bf16", DTYPE_FP32, DTYPE_BF16 },
        { "--dtype=bf16 --reduce-dtype=bf16", DTYPE_BF16, DTYPE_BF16 },
    };
    for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
        TrainOptions o = options_of(runs[i].flags, "char-small");
        cr_expect_eq(options_precision(&o), runs[i].compute, "'%s': the compute's precision", runs[i].flags);
        cr_expect_eq(options_reduce_precision(&o), runs[i].reduce, "'%s': the reductions' precision", runs[i].flags);
    }
}

/* bin/train's "openmp:" start-up line, its stdout's, with the environment as
 * the test process has it. */
static void openmp_line_of_a_run(char *line, size_t len) {
    char dir[256], out[512], err[1024], text[4096];
    temp_dir(dir, sizeof dir, "openmp");
    snprintf(out, sizeof out, "%s/out.txt", dir);
    cr_assert_eq(run_tool(train_binary(), "--layers=1 --embd=16 --heads=2 --block=16 --batch=2 --iters=1 "
                          "--eval-every=0 --sample-chars=0", out, err, sizeof err), 0, "%s", err);
    take_text(out, text, sizeof text);
    remove_dir(dir);
    const char *at = strstr(text, "openmp: ");
    cr_assert_not_null(at, "no openmp line in:\n%s", text);
    snprintf(line, len, "%.*s", (int)strcspn(at, "\n"), at);
}

/* OpenMP's idle threads spin 3000 times, then sleep, as the program sets
 * it (kernels/cpu/cpu_setup.c): bin/train restarts itself with
 * GOMP_SPINCOUNT=3000 and says so, and that a stream's team shrinks under
 * load (runtime/device_cpu.c). What the user set is theirs. */
Test(train, the_program_sets_how_openmps_threads_wait_unless_the_user_did) {
    cr_expect_str_eq(openmp_spin_count(NULL, NULL), "3000");
    cr_expect_null(openmp_spin_count("PASSIVE", NULL));
    cr_expect_null(openmp_spin_count(NULL, "100"));
    char line[512];
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("GOMP_SPINCOUNT");
    openmp_line_of_a_run(line, sizeof line);
    cr_expect(strstr(line, "spin 3000 times") && strstr(line, "GOMP_SPINCOUNT=3000, set by the program"), "%s", line);
    cr_expect(strstr(line, "; a stream's team is one thread while a load leaves a core free"), "%s", line);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    openmp_line_of_a_run(line, sizeof line);
    cr_expect_str_eq(line, "openmp: idle threads wait as the user set it: OMP_WAIT_POLICY=PASSIVE; "
                     "a stream's team is one thread while a load leaves a core free");
    unsetenv("OMP_WAIT_POLICY");
    setenv("GOMP_SPINCOUNT", "100", 1);
    setenv("OMP_DYNAMIC", "false", 1);
    openmp_line_of_a_run(line, sizeof line);
    cr_expect_str_eq(line, "openmp: idle threads wait as the user set it: GOMP_SPINCOUNT=100; "
                     "teams as OMP_DYNAMIC=false says");
    unsetenv("GOMP_SPINCOUNT");
    unsetenv("OMP_DYNAMIC");
}

/* A text's run with a vocabulary padded past its characters, and past a
 * byte's 256 ids (--pad-vocab=300): the checkpoint lists the 65 characters
 * (the padded ids stand for no byte), the run resumes from it, and its
 * samples draw the text's ids only. The list once ran to the model's 300
 * ids, read past the table of 256 and listed zeros twice, which no resume
 * would take. */
Test(train, a_padded_vocabulary_saves_its_characters_and_resumes, .init = setup, .fini = teardown) {
    char dir[256], args[1024], err[4096], ckpt[300];
    temp_dir(dir, sizeof dir, "padded");
    const char *run = "--layers=1 --embd=32 --heads=2 --block=16 --batch=2 --eval-every=0 --pad-vocab=300";
    snprintf(args, sizeof args, "%s --iters=2 --sample-chars=64 --out=%s", run, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    CheckpointInfo info;
    cr_assert_eq(checkpoint_read_info(ckpt, &info, err, sizeof err), 0, "%s", err);
    cr_expect_eq(info.model.vocab, 300);
    cr_expect_eq(info.chars, data.vocab, "%d characters listed, the text has %d", info.chars, data.vocab);
    cr_expect_eq(memcmp(info.itos, data.itos, (size_t)data.vocab), 0, "the characters listed are not the text's");
    snprintf(args, sizeof args, "%s --iters=3 --sample-chars=0 --out=%s --resume=%s", run, dir, ckpt);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "the run does not resume: %s", err);
    remove_dir(dir);
}

/* Every kernel splits its work as the shapes say, not as the threads do, so a
 * run gives the same bytes on one thread as on three (uneven splits) or four,
 * in fp32 and in bf16: the ranks of P x L splits have teams of other sizes,
 * and a stream's team shrinks and grows in mid-run as a load on the machine
 * comes and goes (runtime/device_cpu.c). In bf16 with 1000 ids too, where the
 * head's two products run apart, each long enough (a sum over 1000 ids) that
 * OpenBLAS's threaded sgemm would sum it in another order. */
Test(train, a_run_gives_the_same_bits_on_any_number_of_threads, .timeout = 120) {
    const char *runs[] = { "--dropout=0.1", "--dtype=bf16 --bias=1 --dropout=0.1",
                           "--dtype=bf16 --pad-vocab=1000 --embd=64" };
    const char *threads[] = { "1", "3", "4" };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char dir[256], args[1024], err[4096], ckpt[300];
        unsigned char *bytes[3];
        size_t n[3];
        temp_dir(dir, sizeof dir, "threads");
        for (int k = 0; k < 3; k++) {
            setenv("OMP_NUM_THREADS", threads[k], 1);
            setenv("OMP_DYNAMIC", "false", 1);
            snprintf(args, sizeof args, "--layers=2 --embd=32 --heads=2 --block=32 --batch=4 --iters=3 "
                     "--eval-every=0 --sample-chars=0 %s --out=%s/%d", runs[r], dir, k);
            cr_assert_eq(run_train(args, err, sizeof err), 0, "%s: %s", runs[r], err);
            snprintf(ckpt, sizeof ckpt, "%s/%d/ckpt.safetensors", dir, k);
            bytes[k] = read_all(ckpt, &n[k]);
        }
        unsetenv("OMP_NUM_THREADS");
        unsetenv("OMP_DYNAMIC");
        for (int k = 1; k < 3; k++)
            cr_expect(n[k] == n[0] && memcmp(bytes[k], bytes[0], n[0]) == 0,
                      "%s: %s threads and one give other bytes", runs[r], threads[k]);
        for (int k = 0; k < 3; k++) free(bytes[k]);
        remove_dir(dir);
    }
}

/* --graphs=1: each kind of micro-step (here a first and a last) captured once,
 * after one eager run, and launched from then on; the run says so, and saves
 * the eager run's bytes, dropout on and each block's forward made again in
 * its backward (whose masks read the launch's step), with a step skipped
 * under an injected NaN between. */
Test(train, graphs_capture_each_kind_once_and_save_the_eager_runs_bytes, .timeout = 120) {
    char dir[64], out[160], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "graphs");
    static const char RUN[] = "--zero=3 --gpus=2 --dropout=0.1 --recompute=1 --iters=5 --grad-accum=2 "
                              "--eval-every=0 --on-nan=skip";
    setenv("ZF_INJECT_NAN", "grad:3", 1);
    snprintf(args, sizeof args, "%s %s --out=%s/eager", TINY, RUN, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "%s %s --graphs=1 --out=%s/graphs", TINY, RUN, dir);
    snprintf(out, sizeof out, "%s/graphs.txt", dir);
    cr_assert_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "%s", err);
    unsetenv("ZF_INJECT_NAN");
    size_t n, m;
    char *text = (char *)read_all(out, &n);
    cr_expect(strstr(text, "graphs: 2 micro-step(s) captured, 8 run as a graph's launch"), "%s", text);
    cr_expect(strstr(text, "iter 3: the gradient is not finite"), "%s", text);
    char path[200];
    snprintf(path, sizeof path, "%s/eager/ckpt.safetensors", dir);
    unsigned char *eager = read_all(path, &n);
    snprintf(path, sizeof path, "%s/graphs/ckpt.safetensors", dir);
    unsigned char *graphs = read_all(path, &m);
    cr_expect(n == m && memcmp(eager, graphs, n) == 0, "--graphs=1 saved other bytes than the eager run");
    free(text);
    free(eager);
    free(graphs);
    remove_dir(dir);
}
