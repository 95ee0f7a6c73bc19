/* test_train.c: the trainer: learning, determinism, the schedule, and bin/train's
 * handling of bad input. */
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
#include "../model/models.h"
#include "../runtime/host.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "../tools/options.h"
#include "reference.h"

static Dataset data;

static void setup(void) {
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
}

static void teardown(void) { dataset_free(&data); }

TestSuite(train, .init = setup, .fini = teardown);

static StrategyConfig small_model(float dropout, uint32_t seed) {
    StrategyConfig sc = {
        .model = { data.vocab, 32, 2, 2, 32, MODEL_GPT, 0, 0 }, .nranks = 1, .batch = 8, .dropout = dropout,
        .seed = seed, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f,
    };
    return sc;
}

static TrainConfig quiet_run(int iters) {
    TrainConfig tc = {
        .iters = iters, .schedule = { 1e-2f, 1e-3f, 5, iters }, .grad_clip = 1.0f,
        .eval_every = 0, .eval_iters = 4, .log_every = 0, .sample_chars = 0,
    };
    return tc;
}

Test(train, a_short_run_lowers_the_validation_loss) {
    StrategyConfig sc = small_model(0.0f, 1);
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
    float *a = train_and_read(small_model(0.1f, 7), 10, &n);
    float *b = train_and_read(small_model(0.1f, 7), 10, &n);
    float *c = train_and_read(small_model(0.1f, 8), 10, &n);
    cr_expect(memcmp(a, b, n * sizeof(float)) == 0, "two runs of seed 7 differ");
    cr_expect(memcmp(a, c, n * sizeof(float)) != 0, "seeds 7 and 8 gave the same weights");
    free(a); free(b); free(c);
}

Test(train, a_non_finite_loss_stops_the_run) {
    StrategyConfig sc = small_model(0.0f, 1);
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

static int run_train(const char *args, char *err, size_t errlen) {
    return run_tool(train_binary(), args, "/dev/null", err, errlen);
}

static int count_lines(const char *text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

/* The binary under test: bin/zero_memory, or the sanitizer build's. */
static const char *zero_memory_binary(void) {
    const char *path = getenv("ZF_ZERO_MEMORY");
    return path ? path : "./bin/zero_memory";
}

/* exit status `want`, one line on stderr holding `needle` */
static void expect_one_line(int rc, int want, const char *err, const char *needle, const char *what) {
    cr_expect_eq(rc, want, "%s: exit %d, stderr: %s", what, rc, err);
    cr_expect(strstr(err, needle) != NULL, "%s: no '%s' in stderr: %s", what, needle, err);
    cr_expect_eq(count_lines(err), 1, "%s: stderr: %s", what, err);
}

/* Malformed, out-of-range and conflicting values of every tool's flags: each
 * its own one-line message and exit 2 (empty values: the test after next). */
Test(train, bad_flags_exit_2_with_one_line, .timeout = 60) {
    enum { TRAIN, SAMPLE, ZERO_MEMORY };
    static const struct { int tool; const char *args, *needle; } cases[] = {
        { TRAIN, "--bogus=1", "unknown flag '--bogus'" },
        { TRAIN, "--=", "unknown flag '--'" },
        { TRAIN, "-x", "unexpected argument '-x'" },
        { TRAIN, "stray", "unexpected argument 'stray'" },
        { TRAIN, "--iters", "--iters needs a value" },
        { TRAIN, "--preset=huge", "unknown --preset 'huge'" },
        { TRAIN, "--iters=abc", "--iters expects an integer, got 'abc'" },
        { TRAIN, "--iters=1e3", "--iters expects an integer, got '1e3'" },
        { TRAIN, "--iters=0x10", "--iters expects an integer, got '0x10'" },
        { TRAIN, "--iters=-1", "--iters=-1 must not be negative" },
        { TRAIN, "--seed=1.5", "--seed expects an integer, got '1.5'" },
        { TRAIN, "--lr=fast", "--lr expects a decimal number, got 'fast'" },
        { TRAIN, "--lr=1e-3x", "--lr expects a decimal number, got '1e-3x'" },
        { TRAIN, "--lr=nan", "--lr expects a decimal number, got 'nan'" },
        { TRAIN, "--lr=inf", "--lr expects a decimal number, got 'inf'" },
        { TRAIN, "--lr=1e39", "--lr=1e39 is out of range (a finite 32-bit float)" },
        { TRAIN, "--lr=0x1p-3", "--lr expects a decimal number, got '0x1p-3'" },
        { TRAIN, "--iters=' 5'", "--iters expects an integer, got ' 5'" },
        { TRAIN, "--lr=0", "--lr=0 must be positive" },
        { TRAIN, "--lr=-1", "--lr=-1 must be positive" },
        { TRAIN, "--min-lr=-0.1", "--min-lr=-0.1 must not be negative" },
        { TRAIN, "--warmup=-5", "--warmup=-5 must not be negative" },
        { TRAIN, "--lr-decay-iters=x", "--lr-decay-iters expects an integer, got 'x'" },
        { TRAIN, "--layers=0", "--layers=0 must be in 1..170" },
        { TRAIN, "--layers=200", "--layers=200 must be in 1..170" },
        { TRAIN, "--heads=0", "--heads=0 must be at least 1" },
        { TRAIN, "--heads=-2", "--heads=-2 must be at least 1" },
        { TRAIN, "--embd=0", "--embd=0 must be at least 1" },
        { TRAIN, "--embd=100 --heads=3", "--embd=100 is not divisible by --heads=3" },
        { TRAIN, "--block=0", "--block=0 must be at least 1" },
        { TRAIN, "--batch=0", "--batch=0 (rows per rank) must be at least 1" },
        { TRAIN, "--batch=-3", "--batch=-3 (rows per rank) must be at least 1" },
        { TRAIN, "--embd=600000000 --heads=1", "exceed 2^31 floats" },
        { TRAIN, "--block=100000", "exceed 2^31 floats" },
        { TRAIN, "--gpus=0", "--gpus=0 must be in 1..64" },
        { TRAIN, "--gpus=65", "--gpus=65 must be in 1..64" },
        { TRAIN, "--gpus=x", "--gpus expects an integer, got 'x'" },
        { TRAIN, "--zero=4", "--zero=4 must be 0, 1, 2 or 3" },
        { TRAIN, "--zero=-1", "--zero=-1 must be 0, 1, 2 or 3" },
        { TRAIN, "--zero=x", "--zero expects an integer, got 'x'" },
        { TRAIN, "--device=tpu", "--device=tpu must be auto, cpu or cuda" },
        { TRAIN, "--collectives=ring", "--collectives=ring must be ordered or nccl" },
        { TRAIN, "--collectives=NCCL", "--collectives=NCCL must be ordered or nccl" },
        { TRAIN, "--nodes=0", "--nodes=0 must be in 1..64" },
        { TRAIN, "--nodes=2", "--nodes=2 needs --rendezvous=file:PATH" },
        { TRAIN, "--nodes=2 --node-rank=2 --rendezvous=file:/tmp/zf_never", "--node-rank=2 must be in 0..1" },
        { TRAIN, "--node-rank=-1", "--node-rank=-1 must be in 0..0" },
        { TRAIN, "--rendezvous=tcp:host:29500", "--rendezvous=tcp:host:29500 must be file:PATH" },
        { TRAIN, "--nodes=2 --rendezvous=file:/tmp/zf_never --device=cpu", "across processes need mpirun" },
        { TRAIN, "--tf32=2", "--tf32=2 must be 0 or 1" },
        { TRAIN, "--tf32=1", "--tf32=1 needs a GPU, and the ranks run on the CPU" },
        { TRAIN, "--overlap=2", "--overlap=2 must be 0 or 1" },
        { TRAIN, "--bucket-mb=0", "--bucket-mb=0 must be in (0, 4096]" },
        { TRAIN, "--bucket-mb=5000", "--bucket-mb=5000 must be in (0, 4096]" },
        { TRAIN, "--bucket-mb=nan", "--bucket-mb expects a decimal number, got 'nan'" },
        { TRAIN, "--unit=layer", "--unit=layer must be block, half or tensor" },
        { TRAIN, "--unit=Block", "--unit=Block must be block, half or tensor" },
        { TRAIN, "--unit=tensors", "--unit=tensors must be block, half or tensor" },
        { TRAIN, "--max-live-units=0", "--max-live-units=0 must be in 1..8" },
        { TRAIN, "--max-live-units=9", "--max-live-units=9 must be in 1..8" },
        { TRAIN, "--max-live-units=two", "--max-live-units expects an integer, got 'two'" },
        { TRAIN, "--recompute=2", "--recompute=2 must be 0 or 1" },
        { TRAIN, "--gelu=relu", "--gelu=relu must be erf or tanh" },
        { TRAIN, "--recompute=yes", "--recompute expects an integer, got 'yes'" },
        { TRAIN, "--recompute=1 --unit=half", "--recompute=1 recomputes whole blocks: it needs --unit=block, not half" },
        { TRAIN, "--link=abc", "--link=abc must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--link=0", "--link=0 must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--link=1,-5", "--link=1,-5 must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--link=1,2,3", "--link=1,2,3 must be GBPS or GBPS,LATENCY_US" },
        { TRAIN, "--dropout=1.5", "--dropout=1.5 must be in [0, 1)" },
        { TRAIN, "--dropout=1", "--dropout=1 must be in [0, 1)" },
        { TRAIN, "--dropout=-0.1", "--dropout=-0.1 must be in [0, 1)" },
        { TRAIN, "--dropout=0.5.5", "--dropout expects a decimal number, got '0.5.5'" },
        { TRAIN, "--weight-decay=-1", "--weight-decay=-1 must not be negative" },
        { TRAIN, "--beta2=1", "--beta2=1 must be in [0, 1)" },
        { TRAIN, "--beta2=-0.5", "--beta2=-0.5 must be in [0, 1)" },
        { TRAIN, "--grad-clip=-1", "--grad-clip=-1 must not be negative" },
        { TRAIN, "--eval-every=-1", "--eval-every, --eval-iters and --log-every must not be negative" },
        { TRAIN, "--eval-iters=-1", "--eval-every, --eval-iters and --log-every must not be negative" },
        { TRAIN, "--log-every=-1", "--eval-every, --eval-iters and --log-every must not be negative" },
        { TRAIN, "--sample-chars=-5", "--sample-chars=-5 must not be negative" },
        { TRAIN, "--trace-steps=0", "--trace-steps=0 must be at least 1" },
        { TRAIN, "--trace-steps=-1", "--trace-steps=-1 must be at least 1" },
        { TRAIN, "--grad-accum=0", "--grad-accum=0 must be in 1..1024" },
        { TRAIN, "--grad-accum=2000", "--grad-accum=2000 must be in 1..1024" },
        { TRAIN, "--always-save=2", "--always-save=2 must be 0 or 1" },
        { TRAIN, "--resume=a --init-from=b", "--resume and --init-from exclude each other" },
        { TRAIN, "--max-skips=x", "--max-skips expects an integer, got 'x'" },
        { TRAIN, "--max-memory-mb=lots", "--max-memory-mb expects a decimal number, got 'lots'" },
        { TRAIN, "--temperature=0", "--temperature=0 must be positive" },
        { TRAIN, "--top-k=-1", "--top-k=-1 must not be negative" },
        { TRAIN, "--iters=99999999999", "--iters=99999999999 is out of range" },
        { TRAIN, "--seed=-9999999999999999999999", "is out of range" },
        { TRAIN, "--lr=1e99", "--lr=1e99 is out of range" },
        { TRAIN, "--iters=12x", "--iters expects an integer, got '12x'" },
        { TRAIN, "--min-lr=0.01 --lr=0.001", "--min-lr=0.01 is above --lr=0.001" },
        { TRAIN, "--on-nan=maybe", "--on-nan=maybe must be stop or skip" },
        { TRAIN, "--max-skips=-1", "--max-skips=-1 must not be negative" },
        { TRAIN, "--gpus=2 --link=0.000001", "--link=0.000001 would take" },
        { TRAIN, "--gpus=4 --zero=3 --link=10,100000000", "one step's collectives" },
        { TRAIN, "--inject-fault=1:2", "--inject-fault='1:2' must be RANK:STEP:WHERE" },
        { TRAIN, "--inject-fault=0:1:sideways", "WHERE 'sideways' must be forward, backward, collective, step, save or hang" },
        { TRAIN, "--inject-fault=-1:1:step", "RANK and STEP must not be negative" },
        { TRAIN, "--inject-fault=0:1:step:x", "must be RANK:STEP:WHERE" },
        { TRAIN, "--gpus=2 --inject-fault=2:1:forward", "names rank 2, and the run has ranks 0..1" },
        { TRAIN, "--timeout=0", "--timeout=0 must be in [1, 1e6] seconds" },
        { TRAIN, "--timeout=abc", "--timeout" },
        { TRAIN, "--timeout=0.001", "--timeout=0.001 must be in [1, 1e6] seconds" },
        { TRAIN, "--rendezvous=file:/tmp/zf_never", "--rendezvous=file:/tmp/zf_never needs --nodes" },
        { TRAIN, "--iters=10 --inject-fault=0:10:forward", "names step 10, and the run's steps are 0..9 (--iters=10)" },
        { TRAIN, "--iters=10 --inject-fault=0:11:save", "names step 11, and the run's saves hold steps 1..10" },
        { TRAIN, "--overwrite=2", "--overwrite=2 must be 0 or 1" },
        { SAMPLE, "", "--ckpt PATH is required" },
        { SAMPLE, "--bogus", "sample: unknown flag '--bogus'" },
        { SAMPLE, "stray", "sample: unexpected argument 'stray'" },
        { SAMPLE, "--chars", "sample: --chars needs a value" },
        { SAMPLE, "--chars=x", "sample: --chars expects an integer, got 'x'" },
        { SAMPLE, "--chars=-1", "sample: --chars=-1 must not be negative" },
        { SAMPLE, "--temperature=0", "sample: --temperature=0 must be positive" },
        { SAMPLE, "--temperature=-1", "sample: --temperature=-1 must be positive" },
        { SAMPLE, "--top-k=-2", "sample: --top-k=-2 must not be negative" },
        { SAMPLE, "--top-k=abc", "sample: --top-k expects an integer, got 'abc'" },
        { SAMPLE, "--device=gpu", "sample: --device=gpu must be auto, cpu or cuda" },
        { SAMPLE, "--seed=99999999999", "sample: --seed=99999999999 is out of range (a 32-bit integer)" },
        { ZERO_MEMORY, "--bogus=1", "zero_memory: unknown flag '--bogus'" },
        { ZERO_MEMORY, "stray", "zero_memory: unexpected argument 'stray'" },
        { ZERO_MEMORY, "--preset=nope", "zero_memory: unknown --preset 'nope'" },
        { ZERO_MEMORY, "--layers=0", "zero_memory: --layers=0 must be in 1..170" },
        { ZERO_MEMORY, "--embd=7 --heads=2", "zero_memory: --embd=7 is not divisible by --heads=2" },
        { ZERO_MEMORY, "--device=tpu", "zero_memory: --device=tpu must be auto, cpu or cuda" },
        { ZERO_MEMORY, "--overlap=3", "zero_memory: --overlap=3 must be 0 or 1" },
        { ZERO_MEMORY, "--bucket-mb=-1", "zero_memory: --bucket-mb=-1 must be in (0, 4096]" },
        { ZERO_MEMORY, "--unit=matrix", "zero_memory: --unit=matrix must be block, half or tensor" },
        { ZERO_MEMORY, "--max-live-units=-1", "zero_memory: --max-live-units=-1 must be in 1..8" },
        { ZERO_MEMORY, "--recompute=1 --unit=tensor", "zero_memory: --recompute=1 recomputes whole blocks" },
    };
    const char *binaries[] = { [TRAIN] = train_binary(), [SAMPLE] = sample_binary(),
                               [ZERO_MEMORY] = zero_memory_binary() };
    size_t n = sizeof cases / sizeof cases[0];
    cr_expect_geq(n, 60);
    char err[4096];
    for (size_t i = 0; i < n; i++)
        expect_one_line(run_tool(binaries[cases[i].tool], cases[i].args, "/dev/null", err, sizeof err), 2, err,
                        cases[i].needle, cases[i].args);
}

/* Split a command line at its spaces into argv[1..] (argv[0] "train"); argc. */
static int split_args(char *line, char **argv, int max) {
    int argc = 0;
    argv[argc++] = "train";
    for (char *word = strtok(line, " "); word && argc < max; word = strtok(NULL, " ")) argv[argc++] = word;
    return argc;
}

/* Each flag's hashes (options_flag_hashes) for a command line, which must parse. */
static int hashes_of(const char *args, uint64_t *hashes, const char **names) {
    char line[512], err[1024], *argv[32];
    snprintf(line, sizeof line, "%s", args);
    int argc = split_args(line, argv, 32);
    TrainOptions o;
    cr_assert_eq(options_read(&o, "train", "char-small", argc, argv, err, sizeof err), 0, "'%s': %s", args, err);
    return options_flag_hashes(&o, hashes, names);
}

/* What processes compare before they train (tools/options.h): a change of any
 * single flag's value, whatever the flag, changes that flag's hash, however the
 * value is written, and --node-rank (each process's own) changes none. Each
 * flag of the table needs a line here: a new flag without one fails. */
Test(train, every_flag_alone_tells_two_processes_apart) {
    static const char NODES[] = "--nodes=2 --rendezvous=file:/tmp/zf_r";
    static const struct { const char *flag, *base, *other; } changes[] = {
        { "preset", "", "--preset=char" }, { "data", "", "--data=other.txt" }, { "zero", "", "--zero=3" },
        { "tokenizer", "", "--tokenizer=t.json" },
        { "gpus", "", "--gpus=2" }, { "device", "", "--device=cpu" }, { "collectives", "", "--collectives=nccl" },
        { "tf32", "", "--tf32=1" }, { "overlap", "", "--overlap=0" }, { "bucket-mb", "", "--bucket-mb=1" },
        { "unit", "", "--unit=half" }, { "max-live-units", "", "--max-live-units=3" }, { "recompute", "", "--recompute=1" },
        { "link", "", "--link=5" }, { "layers", "", "--layers=3" }, { "heads", "", "--heads=2" }, { "embd", "", "--embd=64" },
        { "bias", "", "--bias=1" }, { "gelu", "", "--gelu=tanh" }, { "pad-vocab", "", "--pad-vocab=64" },
        { "block", "", "--block=32" }, { "batch", "", "--batch=4" }, { "iters", "", "--iters=10" }, { "lr", "", "--lr=2e-3" },
        { "min-lr", "", "--min-lr=2e-4" }, { "warmup", "", "--warmup=5" }, { "lr-decay-iters", "", "--lr-decay-iters=50" },
        { "dropout", "", "--dropout=0.1" }, { "weight-decay", "", "--weight-decay=0.01" }, { "beta2", "", "--beta2=0.95" },
        { "grad-clip", "", "--grad-clip=0.5" }, { "seed", "", "--seed=7" }, { "eval-every", "", "--eval-every=5" },
        { "eval-iters", "", "--eval-iters=3" }, { "log-every", "", "--log-every=2" }, { "sample-chars", "", "--sample-chars=9" },
        { "log", "", "--log=l.jsonl" }, { "trace", "", "--trace=t.json" }, { "trace-steps", "", "--trace-steps=2" },
        { "out", "", "--out=o" }, { "always-save", "", "--always-save=1" }, { "overwrite", "", "--overwrite=1" },
        { "resume", "", "--resume=r.safetensors" }, { "init-from", "", "--init-from=i.safetensors" },
        { "grad-accum", "", "--grad-accum=2" }, { "on-nan", "", "--on-nan=skip" }, { "max-skips", "", "--max-skips=3" },
        { "max-memory-mb", "", "--max-memory-mb=100" }, { "timeout", "", "--timeout=60" },
        { "nodes", "", NODES }, { "node-rank", NODES, "--nodes=2 --rendezvous=file:/tmp/zf_r --node-rank=1" },
        { "rendezvous", NODES, "--nodes=2 --rendezvous=file:/tmp/zf_s" }, { "inject-fault", "", "--inject-fault=0:1:forward" },
        { "ckpt", "", "--ckpt=c.safetensors" }, { "prompt", "", "--prompt=A" }, { "chars", "", "--chars=9" },
        { "temperature", "", "--temperature=0.5" }, { "top-k", "", "--top-k=3" },
    };
    uint64_t base[MAX_FLAGS], other[MAX_FLAGS];
    const char *names[MAX_FLAGS];
    int n = hashes_of("", base, names);
    for (int i = 0; i < n; i++) {
        size_t k = 0;
        while (k < sizeof changes / sizeof changes[0] && strcmp(changes[k].flag, names[i]) != 0) k++;
        cr_assert_lt(k, sizeof changes / sizeof changes[0], "--%s has no other value in this test: add one", names[i]);
        hashes_of(changes[k].base, base, names);
        hashes_of(changes[k].other, other, names);
        int differ = 0;
        for (int j = 0; j < n; j++) differ |= base[j] != other[j];
        if (strcmp(names[i], "node-rank") == 0) cr_expect(!differ, "--node-rank changed what processes compare");
        else cr_expect_neq(base[i], other[i], "'%s' left --%s's hash as '%s' has it", changes[k].other, names[i],
                           changes[k].base);
    }
    /* one value written two ways, flags in two orders: the same run */
    hashes_of("--lr=1e-3 --seed=5", base, names);
    hashes_of("--seed 5 --lr 0.001", other, names);
    cr_expect_eq(memcmp(base, other, (size_t)n * sizeof base[0]), 0, "--lr=1e-3 and --lr 0.001 told apart");
}

Test(train, a_value_longer_than_its_flag_holds_is_an_error) {
    char args[700] = "--data=", err[4096];
    memset(args + strlen(args), 'x', 600);  /* longer than any text flag holds */
    int rc = run_train(args, err, sizeof err);
    cr_expect_eq(rc, 2);
    cr_expect(strstr(err, "--data value is too long") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
}

Test(train, bad_data_exits_1_with_one_line) {
    char err[4096], args[512];
    int rc = run_train("--data=/nonexistent/file.txt", err, sizeof err);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(err, "/nonexistent/file.txt") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);

    char path[] = "/tmp/zf_short_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "too short for a block of 64\n", 28), 28);
    close(fd);
    snprintf(args, sizeof args, "--data=%s", path);
    rc = run_train(args, err, sizeof err);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(err, "each split needs more") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);

    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);  /* now empty */
    rc = run_train(args, err, sizeof err);
    expect_one_line(rc, 1, err, "has 0 bytes; each split needs more than --block=64", "an empty data file");
    unlink(path);

    /* a FIFO would block an open forever; /dev/zero never ends */
    char fifo[] = "/tmp/zf_fifo_XXXXXX";
    fd = mkstemp(fifo);
    cr_assert_geq(fd, 0);
    close(fd);
    unlink(fifo);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    const char *specials[] = { fifo, "/dev/zero" };
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof args, "--data=%s", specials[i]);
        char needle[128];
        snprintf(needle, sizeof needle, "data file '%s' is not a regular file", specials[i]);
        expect_one_line(run_train(args, err, sizeof err), 1, err, needle, args);
    }
    unlink(fifo);
}

Test(train, help_lists_every_flag_and_exits_0) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --help", train_binary());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_expect_eq(pclose(p), 0);
    static const char *flags[] = { "--layers", "--heads", "--embd", "--block", "--batch", "--iters",
        "--lr", "--min-lr", "--warmup", "--dropout", "--weight-decay", "--beta2", "--grad-clip",
        "--seed", "--eval-every", "--eval-iters", "--sample-chars", "--log", "--data", "--preset" };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        cr_expect(strstr(out, flags[i]) != NULL, "--help does not list %s", flags[i]);
}

/* bin/zero_memory on a small model, with these flags: its table into out. */
static void run_zero_memory(const char *flags, char *out, size_t len) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --layers=2 --embd=96 --heads=2 --block=16 --batch=2 %s", zero_memory_binary(), flags);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = 0;
    cr_expect_eq(pclose(p), 0, "%s failed:\n%s", cmd, out);
}

/* A row's numbers: weights, gradients, optimizer, state, formula, state /
 * formula, working, total, activations, peak. */
enum { ROW_WORKING = 6, ROW_TOTAL, ROW_ACTIVATIONS, ROW_PEAK, ROW_VALUES };

static void read_row(const char *out, const char *row, double v[ROW_VALUES]) {
    const char *at = strstr(out, row);
    cr_assert_not_null(at, "no row %s in:\n%s", row, out);
    at += strlen(row);
    for (int i = 0; i < ROW_VALUES; i++) {
        char *end;
        v[i] = strtod(at, &end);
        cr_assert(end != at && strncmp(end, " |", 2) == 0, "row %s: value %d unreadable in:\n%s", row, i, out);
        at = end + 2;
    }
}

/* It checks every rank against the ZeRO formulas itself and exits 1 if one is
 * off; activations and the peak come from a real step, and no step allocates:
 * the peak is what the strategy built. Finer units shrink ZeRO-3's working
 * buffers. */
Test(train, zero_memory_prints_every_strategy_within_the_formulas) {
    char out[8192], tensor[8192];
    run_zero_memory("", out, sizeof out);
    static const char *rows[] = { "| DDP | 1 | ", "| ZeRO-1 | 2 | ", "| ZeRO-2 | 4 | ", "| ZeRO-3 | 8 | " };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        double v[ROW_VALUES];
        read_row(out, rows[i], v);
        cr_expect_gt(v[ROW_ACTIVATIONS], 0.0, "%s: no activations:\n%s", rows[i], out);
        cr_expect_lt(fabs(v[ROW_PEAK] - v[ROW_TOTAL] - v[ROW_ACTIVATIONS]), 0.2, "%s: peak %.1f, built %.1f:\n%s",
                     rows[i], v[ROW_PEAK], v[ROW_TOTAL] + v[ROW_ACTIVATIONS], out);
    }
    int table_rows = 0;
    for (const char *c = out; (c = strstr(c, " | 1.00")) != NULL; c++) table_rows++;
    cr_expect_eq(table_rows, 16, "16 rows at state / formula 1.00..:\n%s", out);
    run_zero_memory("--unit=tensor", tensor, sizeof tensor);
    double block_row[ROW_VALUES], tensor_row[ROW_VALUES];
    read_row(out, "| ZeRO-3 | 2 | ", block_row);
    read_row(tensor, "| ZeRO-3 | 2 | ", tensor_row);
    cr_expect_lt(tensor_row[ROW_WORKING], block_row[ROW_WORKING], "ZeRO-3's working buffers: %.1f MB with tensors, "
                 "%.1f MB with blocks", tensor_row[ROW_WORKING], block_row[ROW_WORKING]);
}

/* --gpus=K: every N of 1..K, no other */
Test(train, zero_memory_with_gpus_measures_every_rank_count_up_to_it) {
    char out[8192];
    run_zero_memory("--gpus=3", out, sizeof out);
    double v[ROW_VALUES];
    read_row(out, "| ZeRO-3 | 3 | ", v);
    read_row(out, "| DDP | 2 | ", v);
    cr_expect_null(strstr(out, "| ZeRO-3 | 4 | "), "past --gpus=3:\n%s", out);
    int table_rows = 0;
    for (const char *c = out; (c = strstr(c, " | 1.00")) != NULL; c++) table_rows++;
    cr_expect_eq(table_rows, 12, "4 strategies x N = 1, 2, 3:\n%s", out);
}

/* ---- bad checkpoint files: one line, exit 1, nothing overwritten ---- */

/* The file at path still holds exactly the n bytes of `good`. */
static void expect_unchanged(const char *path, const unsigned char *good, size_t n, const char *what) {
    size_t after_n;
    unsigned char *after = read_all(path, &after_n);
    cr_expect(after_n == n && memcmp(after, good, n) == 0, "%s", what);
    free(after);
}

static void write_all(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
}

/* The good file with `from` replaced by `to` (same length) in its header. */
static void write_replaced(const char *path, const unsigned char *good, size_t n, const char *from, const char *to) {
    unsigned char *bad = malloc(n);
    memcpy(bad, good, n);
    char *at = memmem(bad + 8, n - 8, from, strlen(from));
    cr_assert_not_null(at, "'%s' is not in the header", from);
    memcpy(at, to, strlen(to));
    write_all(path, bad, n);
    free(bad);
}

/* Bytes that are no text train as the data they are: every byte value, or a
 * single one repeated (a vocabulary of one, whose sample can only be it). */
Test(train, binary_data_and_a_single_byte_train_as_they_are, .timeout = 60) {
    char path[] = "/tmp/zf_bytes_XXXXXX", out[] = "/tmp/zf_bytes_out_XXXXXX", args[512], err[4096];
    int fd = mkstemp(path), out_fd = mkstemp(out);
    cr_assert(fd >= 0 && out_fd >= 0);
    close(out_fd);
    unsigned char bytes[4096];
    for (size_t i = 0; i < sizeof bytes; i++) bytes[i] = (unsigned char)(i * 7919 % 256);
    cr_assert_eq(write(fd, bytes, sizeof bytes), (ssize_t)sizeof bytes);
    close(fd);
    snprintf(args, sizeof args, "--layers=1 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --iters=2 "
             "--sample-chars=16 --data=%s", path);
    cr_expect_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "binary data: %s", err);
    memset(bytes, 'q', sizeof bytes);
    write_all(path, bytes, sizeof bytes);
    cr_expect_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "one byte: %s", err);
    size_t n;
    char *text = (char *)read_all(out, &n);
    text[n] = 0;
    cr_expect(strstr(text, "vocabulary 1,") && strstr(text, "sample:\nqqqqqqqqqqqqqqqq\n"), "%s", text);
    free(text);
    unlink(path);
    unlink(out);
}

Test(train, bad_checkpoints_are_one_line_errors_and_overwrite_nothing, .timeout = 300) {
    static const char *model = "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0";
    char dir[] = "/tmp/zf_bad_XXXXXX", good_path[256], bad_path[256], args[1024], err[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(good_path, sizeof good_path, "%s/ckpt.safetensors", dir);
    snprintf(bad_path, sizeof bad_path, "%s/bad.safetensors", dir);
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", model, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    size_t n;
    unsigned char *good = read_all(good_path, &n);

    /* a tensor name, and ln_f's header entry, as the writer lays them out */
    static const char *ln_f = "\"transformer.ln_f.weight\":{\"dtype\":\"F32\",\"shape\":[16]";
    struct { const char *what, *from, *to, *needle; } edits[] = {
        { "wrong dtype", "\"dtype\":\"F32\"", "\"dtype\":\"I32\"", "dtype I32, expected F32" },
        { "missing tensor", "transformer.ln_f.weight", "transformer.ln_x.weight", "missing tensor 'transformer.ln_f.weight'" },
        { "wrong shape", ln_f, "\"transformer.ln_f.weight\":{\"dtype\":\"F32\",\"shape\":[15]", "'transformer.ln_f.weight' has shape [15] of F32 (480 bits)" },
        { "malformed JSON", "{", "#", "the header is not JSON" },
        { "more updates than steps", "\"adam_step\":\"2\"", "\"adam_step\":\"3\"", "its adam_step is above its iter" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        write_replaced(bad_path, good, n, edits[i].from, edits[i].to);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", model, dir, bad_path);
        int rc = run_train(args, err, sizeof err);
        cr_expect_eq(rc, 1, "%s: exit %d", edits[i].what, rc);
        cr_expect(strstr(err, edits[i].needle) != NULL, "%s: stderr was: %s", edits[i].what, err);
        cr_expect_eq(count_lines(err), 1, "%s: stderr was: %s", edits[i].what, err);
    }

    /* truncated; a header length past the end; an extra tensor */
    unsigned char *longer = malloc(n + 128);
    memcpy(longer, good, n);
    memset(longer, 0xff, 8);
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)good[b] << (8 * b);
    static const char extra[] = "\"extra\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},";
    struct { const char *what, *needle; } cases[] = {
        { "truncated", "tensor" }, { "header length past the end", "runs past the end" }, { "extra tensor", "overlap" },
    };
    for (int c = 0; c < 3; c++) {
        if (c == 0) write_all(bad_path, good, n / 2);
        if (c == 1) write_all(bad_path, longer, n);
        if (c == 2) {
            uint64_t len = header_len + strlen(extra);
            for (int b = 0; b < 8; b++) longer[b] = (unsigned char)(len >> (8 * b));
            longer[8] = '{';
            memcpy(longer + 9, extra, strlen(extra));
            memcpy(longer + 9 + strlen(extra), good + 9, n - 9);
            write_all(bad_path, longer, n + strlen(extra));
        }
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", model, dir, bad_path);
        int rc = run_train(args, err, sizeof err);
        cr_expect_eq(rc, 1, "%s: exit %d", cases[c].what, rc);
        cr_expect(strstr(err, cases[c].needle) != NULL, "%s: stderr was: %s", cases[c].what, err);
        cr_expect_eq(count_lines(err), 1, "%s: stderr was: %s", cases[c].what, err);
    }

    /* a model the flags disagree with */
    snprintf(args, sizeof args, "%s --layers=3 --iters=4 --out=%s --resume=%s", model, dir, good_path);
    int rc = run_train(args, err, sizeof err);
    cr_expect_eq(rc, 1, "another model: exit %d", rc);
    cr_expect(strstr(err, "holds a model of 2 layers") != NULL, "another model: stderr was: %s", err);
    cr_expect_eq(count_lines(err), 1, "another model: stderr was: %s", err);

    expect_unchanged(good_path, good, n, "the good checkpoint was overwritten");
    free(longer);
    free(good);
    unlink(good_path);
    unlink(bad_path);
    rmdir(dir);
}

/* The file begins as a PNG does. */
static void expect_png(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    unsigned char magic[8];
    cr_expect_eq(fread(magic, 1, 8, f), 8);
    fclose(f);
    cr_expect(memcmp(magic, "\x89PNG\r\n\x1a\n", 8) == 0, "%s is not a PNG", path);
}

/* bin/train with train_args writes a file through `flag` (--log, --trace);
 * `tool` draws it as a PNG, and refuses an empty one. The files are this
 * process's own: runs of the suites side by side share /tmp. */
static void expect_plot(const char *tool, const char *train_args, const char *flag) {
    if (system("command -v gnuplot >/dev/null") != 0) test_skip("gnuplot is missing (make deps installs it)");
    char input[64], png[64], args[512], cmd[256], err[4096];
    snprintf(input, sizeof input, "/tmp/zf_plot_%d.in", (int)getpid());
    snprintf(png, sizeof png, "/tmp/zf_plot_%d.png", (int)getpid());
    snprintf(args, sizeof args, "%s %s=%s", train_args, flag, input);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(cmd, sizeof cmd, "%s %s %s >/dev/null", tool, input, png);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    expect_png(png);
    snprintf(cmd, sizeof cmd, "%s /dev/null %s 2>/dev/null", tool, png);
    cr_expect_neq(system(cmd), 0, "%s: an input without data is an error", tool);
    unlink(input);
    unlink(png);
}

Test(train, plot_loss_draws_a_log) {
    expect_plot("tools/plot_loss", "--iters=4 --eval-every=2 --eval-iters=1 --sample-chars=0 --log-every=1 "
                "--layers=1 --embd=16 --heads=2 --block=16", "--log");
}

/* ---- --trace: a Chrome trace of the first steps ---- */

static int count_spans(const TraceSpan *spans, int n, int pid, int tid, const char *name) {
    int count = 0;
    for (int i = 0; i < n; i++) count += spans[i].pid == pid && spans[i].tid == tid && !strcmp(spans[i].name, name);
    return count;
}

Test(train, trace_writes_chrome_trace_events) {
    char path[64], args[512], err[4096];
    snprintf(path, sizeof path, "/tmp/zf_train_trace_%d.json", (int)getpid());
    snprintf(args, sizeof args, "--iters=3 --trace-steps=2 --eval-every=0 --eval-iters=1 --sample-chars=0 --layers=2 "
             "--embd=16 --heads=2 --block=16 --batch=2 --zero=3 --gpus=2 --trace=%s", path);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    int n;
    TraceSpan *spans = trace_read_spans(path, &n, err, sizeof err);
    cr_assert_not_null(spans, "%s", err);
    cr_expect(trace_spans_nest(spans, n), "spans of one stream overlap without nesting");
    for (int rank = 0; rank < 2; rank++) {
        /* two steps traced of three: each op, unit and collective once a step, but the head's matmul twice
         * (the loss in the forward, again for its gradient in the backward) */
        cr_expect_eq(count_spans(spans, n, rank, 0, "matmul_forward"), 2 * (2 * 4 + 2), "rank %d", rank);
        cr_expect_eq(count_spans(spans, n, rank, 0, "backward"), 2 * (2 + 2), "rank %d", rank);
        cr_expect_eq(count_spans(spans, n, rank, 1, "reduce-scatter unit 1"), 2, "rank %d", rank);
        cr_expect_eq(count_spans(spans, n, rank, 1, "all-gather prefetch unit 2"), 2, "rank %d", rank);
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(spans[i].name, "backward")) cr_expect(spans[i].unit >= 0 && spans[i].unit <= 2, "unit %d", spans[i].unit);
    free(spans);
    /* the rows' names: processes "rank r", threads compute and comm */
    static const char *rows[] = { "\"rank 0\"", "\"rank 1\"", "\"compute\"", "\"comm\"" };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "grep -q '\"name\": %s' %s", rows[i], path);
        cr_expect_eq(system(cmd), 0, "no row named %s", rows[i]);
    }
    unlink(path);
}

Test(train, trace_to_a_file_it_cannot_write_exits_1_with_one_line) {
    char err[4096];
    int rc = run_train("--iters=1 --layers=1 --embd=16 --heads=2 --block=16 --trace=/nonexistent/dir/t.json", err,
                       sizeof err);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(err, "cannot write --trace file '/nonexistent/dir/t.json'") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
}

Test(train, plot_trace_draws_a_trace) {
    expect_plot("tools/plot_trace", "--iters=1 --eval-every=0 --eval-iters=0 --sample-chars=0 --layers=1 --embd=16 "
                "--heads=2 --block=16 --zero=2 --gpus=2", "--trace");
}

/* A CUDA that is there but fails (an old driver, a fabric manager that is not
 * running) stops the run with one line naming CUDA's error, instead of reading
 * as "no GPU" and training on the CPU; --device=cpu never asks CUDA. The CUDA
 * toolkit's stub driver, which fails every call, stands in for a broken one. */
Test(train, a_failing_cuda_stops_the_run_with_one_line) {
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (!cuda_kernel_ops()) test_skip("a build without CUDA never asks CUDA");
    if (access(stub, R_OK) != 0) test_skip("no CUDA stub driver at %s", stub);
    char dir[] = "/tmp/zf_stub_XXXXXX", driver[64], err[4096];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(driver, sizeof driver, "%s/libcuda.so.1", dir);
    cr_assert_eq(symlink(stub, driver), 0);
    cr_assert_eq(setenv("LD_LIBRARY_PATH", dir, 1), 0);  /* this test's worker process only */
    const char *tiny = "--iters=1 --eval-iters=1 --sample-chars=0 --layers=1 --embd=16 --heads=2 --block=16";
    int rc = run_train(tiny, err, sizeof err);
    cr_expect_eq(rc, 1, "a failing CUDA: exit %d (1: a run that could not go on)", rc);
    cr_expect(strstr(err, "CUDA cannot count the GPUs") != NULL, "a failing CUDA: stderr was: %s", err);
    cr_expect_eq(count_lines(err), 1, "a failing CUDA: stderr was: %s", err);
    char on_cpu[256];
    snprintf(on_cpu, sizeof on_cpu, "%s --device=cpu", tiny);
    rc = run_train(on_cpu, err, sizeof err);
    cr_expect_eq(rc, 0, "--device=cpu with a failing CUDA: exit %d, stderr: %s", rc, err);
    unlink(driver);
    rmdir(dir);
}

/* ---- what goes wrong around a run (README "When things go wrong") ---- */

/* A small model, every eval one batch, nothing sampled. */
static const char TINY[] = "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0";

Test(train, an_empty_value_is_an_error_for_every_flag) {
    char cmd[512], out[16384], args[128], err[4096];
    snprintf(cmd, sizeof cmd, "%s --help", train_binary());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0);
    int flags = 0;
    for (const char *line = out; (line = strstr(line, "\n  --")) != NULL; line++) {
        char name[64];
        cr_assert_eq(sscanf(line + 5, "%63[a-z0-9-]", name), 1);
        snprintf(args, sizeof args, "--%s=", name);
        snprintf(cmd, sizeof cmd, "--%s has an empty value", name);
        expect_one_line(run_train(args, err, sizeof err), 2, err, cmd, args);
        flags++;
    }
    cr_expect_geq(flags, 40, "--help listed %d flags", flags);
    /* the form with a space, as `--resume "$UNSET"` writes it */
    expect_one_line(run_train("--resume ''", err, sizeof err), 2, err, "--resume has an empty value", "--resume ''");
}

Test(train, a_directory_given_as_a_file_says_so) {
    char err[4096];
    /* a folder is a token folder's place (model/data.h): it says what it lacks */
    expect_one_line(run_train("--data=/tmp", err, sizeof err), 1, err, "cannot open '/tmp/train.bin': No such file or "
                    "directory (a token folder holds train.bin and val.bin", "--data=/tmp");
    expect_one_line(run_train("--resume=/tmp --iters=1", err, sizeof err), 1, err, "'/tmp' is a directory, not a checkpoint",
                    "--resume=/tmp");
    expect_one_line(run_train("--log=/tmp --iters=1", err, sizeof err), 1, err,
                    "cannot write --log file '/tmp': Is a directory", "--log=/tmp");
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

Test(train, out_is_checked_writable_before_training, .timeout = 60) {
    char dir[64], file[128], args[512], err[4096];
    temp_dir(dir, sizeof dir, "out");
    snprintf(file, sizeof file, "%s/plain_file", dir);
    write_all(file, "x", 1);
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", TINY, file);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "is a file, not a folder", "--out naming a file");
    /* /proc refuses new files even to root, as a read-only place does */
    snprintf(args, sizeof args, "%s --iters=2 --out=/proc", TINY);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "cannot write in the --out folder '/proc'", "--out=/proc");
    /* a folder that works keeps no probe behind */
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", TINY, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    char listing[512];
    snprintf(args, sizeof args, "ls -A %s", dir);
    FILE *p = popen(args, "r");
    size_t n = fread(listing, 1, sizeof listing - 1, p);
    listing[n] = 0;
    pclose(p);
    cr_expect_str_eq(listing, "ckpt.safetensors\nplain_file\n", "the folder holds:\n%s", listing);
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect_eq(system(args), 0);
}

/* A process id no process has now. */
static int dead_pid(void) {
    for (int pid = 4000000;; pid--)
        if (kill(pid, 0) != 0 && errno == ESRCH) return pid;
}

Test(train, stale_temporary_files_of_cut_short_saves_are_removed_at_start, .timeout = 60) {
    char dir[64], stale[128], live[128], other[128], args[512], err[4096];
    temp_dir(dir, sizeof dir, "stale");
    snprintf(stale, sizeof stale, "%s/ckpt.safetensors.tmp.%d", dir, dead_pid());
    snprintf(live, sizeof live, "%s/ckpt.safetensors.tmp.%d", dir, (int)getpid());  /* a live writer's */
    snprintf(other, sizeof other, "%s/notes.tmp.1", dir);
    write_all(stale, "half a checkpoint", 17);
    write_all(live, "a save in flight", 16);
    write_all(other, "not ours", 8);
    snprintf(args, sizeof args, "%s --iters=2 --out=%s", TINY, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    cr_expect(!file_exists(stale), "%s is still there", stale);
    cr_expect(file_exists(live), "a live process's temporary file was removed");
    cr_expect(file_exists(other), "a file that is not ours was removed");
    snprintf(args, sizeof args, "rm -rf %s", dir);
    cr_expect_eq(system(args), 0);
}

Test(train, a_write_error_on_the_log_or_stdout_ends_the_run_with_exit_1, .timeout = 60) {
    char args[512], err[4096];
    snprintf(args, sizeof args, "%s --iters=2 --log-every=1 --log=/dev/full", TINY);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "cannot write the --log file", "--log=/dev/full");
    snprintf(args, sizeof args, "%s --iters=2", TINY);
    expect_one_line(run_tool(train_binary(), args, "/dev/full", err, sizeof err), 1, err,
                    "cannot write the progress output", "stdout on /dev/full");
}

/* Drop the lines a sanitizer adds to stderr (each starts "=="). */
static void drop_sanitizer_lines(char *err) {
    char *out = err;
    for (char *line = err; *line;) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) + 1 : strlen(line);
        if (strncmp(line, "==", 2) != 0) {
            memmove(out, line, len);
            out += len;
        }
        line += len;
    }
    *out = 0;
}

Test(train, a_failed_allocation_is_one_line_and_exit_1, .timeout = 60) {
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = -1;
    if (f && fscanf(f, "%d", &mode) != 1) mode = -1;
    if (f) fclose(f);
    if (mode == 1) test_skip("vm.overcommit_memory=1 grants any allocation; the test would fill memory");
    /* 620 G parameters: 2.5 TB of weights, refused by the kernel at once (and
     * by ASan, told to return NULL as malloc does) */
    char args[512], err[4096];
    snprintf(args, sizeof args, "%s --embd=65536 --heads=1 --layers=12 --batch=1 --device=cpu", TINY);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ASAN_OPTIONS=$ASAN_OPTIONS:allocator_may_return_null=1 %s", train_binary());
    int rc = run_tool(cmd, args, "/dev/null", err, sizeof err);
    drop_sanitizer_lines(err);
    expect_one_line(rc, 1, err,
                    "error: out of memory on cpu for DDP, N=1, rank 0: cannot allocate 2473928949760 bytes for weights",
                    "a model larger than memory");
    cr_expect(strstr(err, "a higher --zero stage, more --gpus, or fewer rows") != NULL, "no hint: %s", err);
}

/* 8 blocks of 128 on 4 ranks: DDP holds 28 MB a rank, ZeRO-3 12.3 MB (bin/train's memory line). */
/* The command that runs bin/train with its address space capped near the
 * machine's free memory (ulimit -v), so that a run that took more than the
 * machine has fails to allocate, rather than wake the kernel's OOM killer
 * (which may take the test's neighbours with it); not under AddressSanitizer,
 * whose shadow memory needs terabytes of address space. */
static void capped_train(char *cmd, size_t len) {
#ifdef __SANITIZE_ADDRESS__
    snprintf(cmd, len, "%s", train_binary());
#else
    snprintf(cmd, len, "ulimit -v %zu; exec %s", host_memory_free() / 1024 * 5 / 4, train_binary());
#endif
}

/* A model whose weights alone pass the memory the machine has free (each
 * allocation under what the kernel would refuse by itself, so it would be
 * granted, touched and OOM-killed) stops at its first allocation past it:
 * one line naming the machine's free memory, exit 1, within seconds. */
Test(train, a_run_bigger_than_the_machine_stops_at_once_in_one_line, .timeout = 60) {
    double free_bytes = (double)host_memory_free(), per_layer = 12.0 * 2048 * 2048 * sizeof(float);
    int layers = (int)ceil(1.1 * free_bytes / per_layer);
    if (layers > 170) test_skip("the machine has %.0f GB free, more than 170 layers 2048 wide hold", free_bytes / 1e9);
    char cmd[1024], args[512], err[4096];
    capped_train(cmd, sizeof cmd);
    snprintf(args, sizeof args, "%s --embd=2048 --heads=16 --layers=%d --batch=1 --device=cpu", TINY, layers);
    double t0 = wall_seconds();
    int rc = run_tool(cmd, args, "/dev/null", err, sizeof err);
    expect_one_line(rc, 1, err, "error: out of memory on cpu for DDP, N=1, rank 0: cannot allocate", "too big a model");
    cr_expect(strstr(err, "the machine had free for the run") != NULL, "not the machine's memory: %s", err);
    cr_expect_lt(wall_seconds() - t0, 30.0, "%.1f s to refuse", wall_seconds() - t0);
}

/* A data file whose bytes and tokens would take twice the machine's free
 * memory (a sparse file: no disk taken) is refused before a byte is read. */
Test(train, a_data_file_bigger_than_the_machine_is_refused_before_reading, .timeout = 60) {
    char dir[64], big[128], cmd[1024], args[512], err[4096];
    temp_dir(dir, sizeof dir, "bigdata");
    snprintf(big, sizeof big, "%s/big.txt", dir);
    int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)(host_memory_free() / 5 * 2)), 0);
    close(fd);
    capped_train(cmd, sizeof cmd);
    snprintf(args, sizeof args, "%s --iters=2 --data=%s", TINY, big);
    double t0 = wall_seconds();
    expect_one_line(run_tool(cmd, args, "/dev/null", err, sizeof err), 1, err,
                    "of host memory (its bytes and their tokens), and the machine has", "a sparse data file");
    cr_expect_lt(wall_seconds() - t0, 10.0, "%.1f s to refuse", wall_seconds() - t0);
    remove_dir(dir);
}

static const char CAPPED[] = "--layers=8 --embd=128 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0 "
                             "--iters=2 --gpus=4";

Test(train, max_memory_mb_caps_each_rank_and_the_refusal_names_the_stage_that_fits, .timeout = 60) {
    char args[512], err[4096];
    snprintf(args, sizeof args, "%s --zero=0 --max-memory-mb=14", CAPPED);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "error: out of memory on cpu for DDP, N=4, rank 0: cannot allocate", "DDP under the cap");
    cr_expect(strstr(err, "of the 14.0 MB --max-memory-mb allows); --zero=3 (ZeRO-3) fits: about 12.") != NULL,
              "%s", err);
    snprintf(args, sizeof args, "%s --zero=2 --max-memory-mb=14", CAPPED);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "--zero=3 (ZeRO-3) fits", "ZeRO-2 under the cap");
    snprintf(args, sizeof args, "%s --zero=3 --max-memory-mb=14", CAPPED);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "ZeRO-3 under the cap: %s", err);
    /* under ZeRO-3's own need, and under the activations' */
    snprintf(args, sizeof args, "%s --zero=3 --max-memory-mb=11", CAPPED);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "no stage fits: more --gpus or fewer rows",
                    "ZeRO-3 under a smaller cap");
    snprintf(args, sizeof args, "%s --zero=3 --max-memory-mb=1", CAPPED);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "for activations (0.0 MB in use there, of the 1.0 MB --max-memory-mb allows); the activations do not fit",
                    "activations over the cap");
    expect_one_line(run_train("--max-memory-mb=-1", err, sizeof err), 2, err, "--max-memory-mb=-1 must not be negative",
                    "a negative cap");
}

/* ---- each rank's share: the estimate, and a cap between ZeRO-3's and DDP's ---- */

/* A row's total of `zero_memory --estimate` (its last column). */
static double estimate_total(const char *out, const char *row) {
    const char *at = strstr(out, row);
    cr_assert_not_null(at, "no row %s in:\n%s", row, out);
    const char *end = strchr(at, '\n'), *last = end - 2;
    while (last > at && last[-1] != '|') last--;
    return strtod(last, NULL);
}

/* The formulas, allocating nothing, at a size this machine could not build:
 * gpt2-xl's 1.56G parameters at N = 8 in a process of a few MB; the state as
 * the ZeRO paper's 16P, 8P + 8P/N, 4P + 12P/N, 16P/N. Where a model fits,
 * bin/zero_memory holds every kind of the estimate to the allocator's count
 * within 1% itself, and its exit status says so: for each unit policy,
 * overlap and recompute, and a GPT-2-shaped model (biases, GELU's tanh form). */
Test(train, zero_memory_estimate_agrees_with_the_allocator_and_allocates_nothing, .timeout = 120) {
    char cmd[512], out[16384];
    snprintf(cmd, sizeof cmd, "%s --preset=gpt2-xl --gpus=8 --estimate", zero_memory_binary());
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    out[fread(out, 1, sizeof out - 1, p)] = 0;
    cr_assert_eq(pclose(p), 0, "%s:\n%s", cmd, out);
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    cr_expect_lt(usage.ru_maxrss, 100 * 1024, "%s peaked at %ld KB", cmd, usage.ru_maxrss);
    const char *p_at = strstr(out, "P = ");
    cr_assert_not_null(p_at, "%s", out);
    double P = strtod(p_at + 4, NULL), N = 8;
    cr_expect_eq(P, 1557686400.0, "gpt2-xl padded to 50304 ids: %.0f parameters", P);
    static const char *rows[] = { "| DDP | 8 | ", "| ZeRO-1 | 8 | ", "| ZeRO-2 | 8 | ", "| ZeRO-3 | 8 | " };
    double per_param[] = { 16, 8 + 8 / N, 4 + 12 / N, 16 / N };
    for (int i = 0; i < 4; i++) {
        const char *at = strstr(out, rows[i]);
        cr_assert_not_null(at, "no row %s in:\n%s", rows[i], out);
        double v[4];
        at += strlen(rows[i]);
        for (int k = 0; k < 4; k++) v[k] = strtod(at, (char **)&at), at += 2;
        cr_expect_lt(fabs(v[3] * 1e6 / (per_param[i] * P) - 1), 0.01, "%s state %.1f MB, the formula %.1f", rows[i],
                     v[3], per_param[i] * P / 1e6);
    }
    static const char *settings[] = { "--gpus=3 --unit=half --max-live-units=3", "--overlap=0 --recompute=1",
                                      "--unit=tensor --bias=1 --gelu=tanh --gpus=2" };
    for (int i = 0; i < 3; i++) run_zero_memory(settings[i], out, sizeof out);
}

/* A model shaped as GPT-2 (biases, GELU's tanh form; 16 blocks: its blocks,
 * not its embeddings, hold most of it) at N = 8 simulated ranks, under a cap
 * halfway between ZeRO-3's estimate and ZeRO-2's: ZeRO-3 trains, evaluates,
 * samples, saves and resumes with every rank's peak under the cap, and DDP
 * refuses at once, naming ZeRO-3. */
static const char EIGHT[] = "--layers=16 --embd=64 --heads=2 --block=16 --batch=1 --bias=1 --gelu=tanh --gpus=8 "
                            "--eval-iters=1 --eval-every=2 --sample-chars=16";

Test(train, a_cap_between_zero3_and_ddp_trains_saves_and_resumes_zero3_and_ddp_refuses, .timeout = 120) {
    char cmd[512], out[8192], dir[64], args[1024], err[4096], log[128];
    snprintf(cmd, sizeof cmd, "%s %s --estimate", zero_memory_binary(), EIGHT);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    out[fread(out, 1, sizeof out - 1, p)] = 0;
    cr_assert_eq(pclose(p), 0, "%s:\n%s", cmd, out);
    double zero3 = estimate_total(out, "| ZeRO-3 | 8 |"), zero2 = estimate_total(out, "| ZeRO-2 | 8 |");
    cr_assert_lt(zero3, zero2, "%s", out);
    double cap = (zero3 + zero2) / 2;
    temp_dir(dir, sizeof dir, "cap");
    snprintf(log, sizeof log, "%s/stdout.txt", dir);
    const char *steps[] = { "--iters=2 --zero=3", "--iters=4 --zero=3 --resume=%s/ckpt.safetensors" };
    for (int i = 0; i < 2; i++) {
        char step[256];
        snprintf(step, sizeof step, steps[i], dir);
        snprintf(args, sizeof args, "%s %s --max-memory-mb=%.3f --out=%s", EIGHT, step, cap, dir);
        int rc = run_tool(train_binary(), args, log, err, sizeof err);
        char text[8192];
        take_text(log, text, sizeof text);
        cr_assert_eq(rc, 0, "ZeRO-3 under a %.1f MB cap (%s): exit %d:\n%s", cap, step, rc, err);
        cr_expect(strstr(text, "sample:") && strstr(text, "saved "), "%s: no sample or save:\n%s", step, text);
        const char *peak = strstr(text, "peak memory of a rank: ");
        cr_assert_not_null(peak, "%s", text);
        double peak_mb = strtod(peak + strlen("peak memory of a rank: "), NULL);
        cr_expect_leq(peak_mb, cap, "%s: a rank peaked at %.1f MB, over the %.1f MB cap", step, peak_mb, cap);
    }
    snprintf(args, sizeof args, "%s --iters=2 --zero=0 --max-memory-mb=%.3f", EIGHT, cap);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "--zero=3 (ZeRO-3) fits", "DDP under the cap");
    remove_dir(dir);
}

/* A trained checkpoint of TINY in a fresh folder: its path in ckpt. */
static void train_checkpoint(char *dir, size_t dirlen, char *ckpt, size_t len, int iters) {
    char args[512], err[4096];
    temp_dir(dir, dirlen, "ckpt");
    snprintf(ckpt, len, "%s/ckpt.safetensors", dir);
    snprintf(args, sizeof args, "%s --iters=%d --out=%s", TINY, iters, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
}

/* The good file with tensor `name`'s shape set to `shape` (JSON), its data as it was. */
static void write_reshaped(const char *path, const unsigned char *good, size_t n, const char *name, const char *shape) {
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)good[b] << (8 * b);
    json_t *header = json_loadb((const char *)good + 8, (size_t)header_len, 0, NULL);
    json_t *entry = json_object_get(header, name);
    cr_assert_not_null(entry, "no tensor '%s'", name);
    cr_assert_eq(json_object_set_new(entry, "shape", json_loads(shape, 0, NULL)), 0, "%s", shape);
    char *text = json_dumps(header, JSON_COMPACT);
    size_t len = strlen(text);
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    for (int b = 0; b < 8; b++) fputc((int)((uint64_t)len >> (8 * b)) & 0xff, f);
    fputs(text, f);
    fwrite(good + 8 + header_len, 1, n - 8 - (size_t)header_len, f);
    cr_assert_eq(fclose(f), 0);
    free(text);
    json_decref(header);
}

/* Every tensor of a shape other than the flags' is a one-line error (exit 1)
 * naming it, from --resume, --init-from and bin/sample alike, and nothing is
 * written: a rank more or less ([16] as [16, 1], [48, 16] as [768] or
 * [48, 16, 1]), the same rank with other sizes of the same bytes ([16, 48]),
 * and other bytes ([15], [17]), for a 1-D weight, a 2-D weight and Adam's v. */
Test(train, a_tensor_of_another_shape_is_refused_by_every_reader, .timeout = 300) {
    char dir[64], ckpt[128], bad[160], args[1024], err[4096], what[256];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    static const char *const LN_F = "transformer.ln_f.weight", *const ATTN = "transformer.h.0.attn.c_attn.weight",
                             *const V_FC = "optim.exp_avg_sq.transformer.h.1.mlp.c_fc.weight";
    static const struct { const char *tensor, *shape, *needle; } cases[] = {
        { LN_F, "[16,1]", "has shape [16,1], expected [16]" },
        { LN_F, "[1,16]", "has shape [1,16], expected [16]" },
        { LN_F, "[2,8]", "has shape [2,8], expected [16]" },
        { LN_F, "[16,1,1]", "has shape [16,1,1], expected [16]" },
        { LN_F, "[15]", "has shape [15] of F32 (480 bits)" },
        { LN_F, "[17]", "has shape [17] of F32 (544 bits)" },
        { ATTN, "[768]", "has shape [768], expected [48,16]" },
        { ATTN, "[16,48]", "has shape [16,48], expected [48,16]" },
        { ATTN, "[96,8]", "has shape [96,8], expected [48,16]" },
        { ATTN, "[48,16,1]", "has shape [48,16,1], expected [48,16]" },
        { ATTN, "[1,48,16]", "has shape [1,48,16], expected [48,16]" },
        { V_FC, "[64,16,1]", "has shape [64,16,1], expected [64,16]" },
        { V_FC, "[1024]", "has shape [1024], expected [64,16]" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_reshaped(bad, good, n, cases[i].tensor, cases[i].shape);
        char needle[256];
        snprintf(needle, sizeof needle, "'%s' %s", cases[i].tensor, cases[i].needle);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", TINY, dir, bad);
        snprintf(what, sizeof what, "--resume, %s as %s", cases[i].tensor, cases[i].shape);
        expect_one_line(run_train(args, err, sizeof err), 1, err, needle, what);
        snprintf(args, sizeof args, "%s --iters=2 --init-from=%s", TINY, bad);
        snprintf(what, sizeof what, "--init-from, %s as %s", cases[i].tensor, cases[i].shape);
        expect_one_line(run_train(args, err, sizeof err), 1, err, needle, what);
        snprintf(args, sizeof args, "--ckpt=%s --chars=4", bad);
        snprintf(what, sizeof what, "bin/sample, %s as %s", cases[i].tensor, cases[i].shape);
        expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 1, err, needle, what);
    }
    expect_unchanged(ckpt, good, n, "the good checkpoint was overwritten");
    free(good);
    remove_dir(dir);
}

/* Adam's v is a mean of squares: a file with a negative element in it is
 * refused at load, naming the tensor, not trained on until a save fails. */
Test(train, a_negative_second_moment_is_refused_at_load, .timeout = 60) {
    char dir[64], ckpt[128], bad[160], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    size_t n;
    unsigned char *bytes = read_all(ckpt, &n);
    StFile f;
    unsigned char *copy = malloc(n);
    memcpy(copy, bytes, n);
    cr_assert_eq(safetensors_parse(&f, copy, n, ckpt, err, sizeof err), 0, "%s", err);
    int64_t shape[2] = { 64, 16 };
    const unsigned char *v = safetensors_tensor(&f, "optim.exp_avg_sq.transformer.h.1.mlp.c_fc.weight", "F32", 2,
                                                shape, err, sizeof err);
    cr_assert_not_null(v, "%s", err);
    float minus = -1e-3f;
    memcpy(bytes + (v - f.bytes) + 5 * sizeof(float), &minus, sizeof minus);
    safetensors_close(&f);
    write_all(bad, bytes, n);
    snprintf(args, sizeof args, "%s --iters=4 --out=%s --overwrite=1 --resume=%s", TINY, dir, bad);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "tensor 'optim.exp_avg_sq.transformer.h.1.mlp.c_fc.weight' holds a negative value (element 5 is "
                    "-0.001)", "a negative v");
    free(bytes);
    remove_dir(dir);
}

Test(train, a_non_finite_state_is_never_saved_for_any_strategy, .timeout = 300) {
    char dir[64], ckpt[128], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 4);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    /* a weight turns NaN in the last step: the final save must refuse it */
    setenv("ZF_INJECT_NAN", "weight:5", 1);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        snprintf(args, sizeof args, "%s --iters=6 --zero=%d --gpus=3 --out=%s --resume=%s", TINY, zero, dir, ckpt);
        expect_one_line(run_train(args, err, sizeof err), 1, err,
                        "saving at iter 6: the state is not finite ('transformer.wte.weight' element 0 is nan)",
                        "final save");
    }
    /* and the saves at evaluations, --always-save included */
    snprintf(args, sizeof args, "%s --iters=8 --eval-every=6 --always-save=1 --out=%s --resume=%s", TINY, dir, ckpt);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "saving at iter 6: the state is not finite",
                    "--always-save");
    unsetenv("ZF_INJECT_NAN");
    expect_unchanged(ckpt, good, n, "the good checkpoint was overwritten");
    free(good);
    remove_dir(dir);
}

/* The steps the optimizer took, as the checkpoint says. */
static int adam_steps_of(const char *ckpt) {
    CheckpointInfo info;
    char err[512];
    cr_assert_eq(checkpoint_read_info(ckpt, &info, err, sizeof err), 0, "%s", err);
    return info.adam_step;
}

/* ---- the run's files: no output over another file, no checkpoint replaced unasked ---- */

/* A command line whose output is the same file as another of its paths is
 * refused at start (exit 2, one line naming both flags), and the file is as it
 * was: the same path, a hard link and a symbolic link alike, for every output
 * against every other path (--log, --trace, --out's checkpoint; --data,
 * --resume, --init-from). Two outputs to /dev/null are no such case. */
Test(train, an_output_over_another_file_of_the_run_is_refused, .timeout = 120) {
    char dir[64], ckpt[128], data[160], hard[160], soft[160], fresh[160], args[2048], err[4096], what[1024];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(data, sizeof data, "%s/data.txt", dir);
    snprintf(hard, sizeof hard, "%s/hard", dir);
    snprintf(soft, sizeof soft, "%s/soft", dir);
    snprintf(fresh, sizeof fresh, "%s/fresh.jsonl", dir);
    size_t n_ckpt, n_data;
    unsigned char *good_ckpt = read_all(ckpt, &n_ckpt), *good_data = read_all("data/tinyshakespeare.txt", &n_data);
    write_all(data, good_data, n_data);
    cr_assert_eq(link(ckpt, hard), 0);
    cr_assert_eq(symlink(ckpt, soft), 0);
    /* (with --out, the output is also the same file as --out's checkpoint, which may be named first) */
    const struct { const char *output, *input, *needle; } cases[] = {
        { "--log=%s", "--resume=%s --out=%s", "--log '%s' is the same file as --" },
        { "--trace=%s", "--resume=%s --out=%s", "--trace '%s' is the same file as --" },
        { "--log=%s", "--init-from=%s", "--log '%s' is the same file as --init-from '%s'" },
        { "--trace=%s", "--init-from=%s", "--trace '%s' is the same file as --init-from '%s'" },
    };
    const char *aliases[] = { ckpt, hard, soft };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int a = 0; a < 3; a++) {
            char output[256], input[512], needle[512];
            snprintf(output, sizeof output, cases[c].output, aliases[a]);
            snprintf(input, sizeof input, cases[c].input, ckpt, dir);
            snprintf(needle, sizeof needle, cases[c].needle, aliases[a], ckpt);
            snprintf(args, sizeof args, "%s --iters=4 --data=%s %s %s --overwrite=1", TINY, data, output, input);
            snprintf(what, sizeof what, "%s %s", output, input);
            expect_one_line(run_train(args, err, sizeof err), 2, err, needle, what);
        }
    /* the data, and the checkpoint's own path as the log of its --out */
    cr_assert_eq(unlink(hard), 0);
    cr_assert_eq(link(data, hard), 0);
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --log=%s", TINY, data, hard);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --data", "--log over --data");
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --trace=%s", TINY, data, data);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --data", "--trace over --data");
    snprintf(args, sizeof args, "%s --iters=4 --data=%s --out=%s --log=%s --resume=%s", TINY, data, dir, ckpt, ckpt);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "is the same file as --out's checkpoint",
                    "--log over --out's checkpoint");
    /* two outputs of one new file; two outputs to a device */
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --log=%s --trace=%s/./fresh.jsonl", TINY, data, fresh, dir);
    expect_one_line(run_train(args, err, sizeof err), 2, err, "--log", "--log and --trace of one new file");
    cr_expect_neq(access(fresh, F_OK), 0, "the refused run made %s", fresh);
    snprintf(args, sizeof args, "%s --iters=2 --data=%s --log=/dev/null --trace=/dev/null", TINY, data);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "/dev/null twice: %s", err);
    expect_unchanged(ckpt, good_ckpt, n_ckpt, "the checkpoint changed");
    expect_unchanged(data, good_data, n_data, "the data changed");
    free(good_ckpt);
    free(good_data);
    remove_dir(dir);
}

/* A checkpoint in --out is another run's state: a run that does not resume it
 * (fresh, --init-from it, or --resume of another file) is refused at start,
 * exit 2, the file as it was; --resume it, or --overwrite=1, and the run goes. */
Test(train, a_checkpoint_in_out_is_replaced_only_by_its_own_resume, .timeout = 120) {
    char dir[64], ckpt[128], other[160], args[2048], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(other, sizeof other, "%s/other.safetensors", dir);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    write_all(other, good, n);
    const char *refused[] = { "", "--init-from=%s", "--resume=%s" };
    const char *paths[] = { "", ckpt, other };
    for (int i = 0; i < 3; i++) {
        char start[256];
        snprintf(start, sizeof start, refused[i], paths[i]);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s %s", TINY, dir, start);
        expect_one_line(run_train(args, err, sizeof err), 2, err, "holds a checkpoint already", start);
        expect_unchanged(ckpt, good, n, "a refused run changed the checkpoint");
    }
    snprintf(args, sizeof args, "%s --iters=4 --out=%s --resume=%s", TINY, dir, ckpt);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "its own resume: %s", err);
    cr_expect_eq(adam_steps_of(ckpt), 4);
    snprintf(args, sizeof args, "%s --iters=3 --out=%s --overwrite=1", TINY, dir);
    cr_expect_eq(run_train(args, err, sizeof err), 0, "--overwrite=1: %s", err);
    cr_expect_eq(adam_steps_of(ckpt), 3);
    free(good);
    remove_dir(dir);
}

/* A FIFO that nothing reads, as --log, fails at once with one line rather
 * than wait in its open (exit 1); one that something reads takes the log; a
 * FIFO as --trace, written whole at the end, is refused. */
Test(train, a_fifo_log_needs_a_reader_and_a_trace_a_file, .timeout = 60) {
    char dir[64], fifo[128], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "fifo");
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    cr_assert_eq(mkfifo(fifo, 0666), 0);
    snprintf(args, sizeof args, "%s --iters=2 --log=%s", TINY, fifo);
    double t0 = wall_seconds();
    expect_one_line(run_train(args, err, sizeof err), 1, err, "is a FIFO or a socket that nothing reads", "--log");
    cr_expect_lt(wall_seconds() - t0, 20.0, "the refusal took %.1f s", wall_seconds() - t0);
    snprintf(args, sizeof args, "%s --iters=2 --trace=%s", TINY, fifo);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "the trace is written whole at the end", "--trace");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "cat %s > %s/read.jsonl & sleep 0.2; %s %s --iters=2 --log-every=1 --log=%s >/dev/null; "
             "status=$?; wait; exit $status", fifo, dir, train_binary(), TINY, fifo);
    cr_expect_eq(system(cmd), 0, "a FIFO with a reader");
    char read_path[128];
    snprintf(read_path, sizeof read_path, "%s/read.jsonl", dir);
    size_t n;
    char *text = (char *)read_all(read_path, &n);
    cr_expect(strstr(text, "\"iter\": 1") != NULL, "the reader got: %s", text);
    free(text);
    remove_dir(dir);
}

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

Test(train, count_nonfinite_finds_a_poisoned_gradient_under_every_strategy, .timeout = 60) {
    StrategyConfig sc = small_model(0.0f, 1);
    int x[16 * 32] = { 0 };
    /* read once, at the first step: it poisons step 1 only */
    setenv("ZF_INJECT_NAN", "grad:1", 1);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        sc.nranks = 2;
        sc.batch = 4;
        Strategy *s = strategy_create(zero, &sc);
        cr_assert_eq(s->ops->forward_backward(s, x, x, 0, 0, 1), 0);
        cr_expect_eq(s->ops->count_nonfinite(s, NONFINITE_GRADS), 0, "%s", s->kind->name);
        cr_expect_eq(s->ops->count_nonfinite(s, NONFINITE_STATE), 0, "%s", s->kind->name);
        cr_assert_eq(s->ops->forward_backward(s, x, x, 1, 0, 1), 0);
        cr_expect_eq(s->ops->count_nonfinite(s, NONFINITE_GRADS), 1, "%s", s->kind->name);
        s->ops->destroy(s);
    }
    unsetenv("ZF_INJECT_NAN");
}

/* ckpt with the first float of its data section (transformer.wte.weight's
 * first element, as the writer lays them out) made NaN, at bad. */
static void write_nan_checkpoint(const char *ckpt, const char *bad) {
    size_t n;
    unsigned char *bytes = read_all(ckpt, &n);
    uint64_t header_len = 0;
    for (int b = 0; b < 8; b++) header_len |= (uint64_t)bytes[b] << (8 * b);
    static const unsigned char nan_bits[4] = { 0x00, 0x00, 0xc0, 0x7f };
    memcpy(bytes + 8 + header_len, nan_bits, 4);
    write_all(bad, bytes, n);
    free(bytes);
}

Test(train, checkpoints_with_non_finite_values_are_refused, .timeout = 60) {
    char dir[64], ckpt[128], bad[160], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(bad, sizeof bad, "%s/nan.safetensors", dir);
    write_nan_checkpoint(ckpt, bad);
    snprintf(args, sizeof args, "--ckpt=%s --chars=10", bad);
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 1, err,
                    "tensor 'transformer.wte.weight' is not finite (element 0 is nan)", "bin/sample");
    snprintf(args, sizeof args, "%s --iters=4 --init-from=%s", TINY, bad);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "tensor 'transformer.wte.weight' is not finite",
                    "--init-from");
    remove_dir(dir);
}

/* A safetensors file of one header and n data bytes. */
Test(train, bin_sample_names_its_own_flags_and_streams_long_text, .timeout = 300) {
    char dir[64], ckpt[128], args[512], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(args, sizeof args, "--ckpt=%s --chars=-1", ckpt);
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 2, err,
                    "--chars=-1 must not be negative", "--chars=-1");
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

Test(train, device_cuda_without_a_gpu_is_exit_2_from_every_tool, .timeout = 60) {
    if (device_cuda_count() > 0) test_skip("a GPU is visible; --device=cuda is no error here");
    char dir[64], ckpt[128], args[512], err[4096], out[160];
    expect_one_line(run_train("--device=cuda --iters=1", err, sizeof err), 2, err, "no GPU is visible", "bin/train");
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 1);
    snprintf(out, sizeof out, "%s/zero_memory.txt", dir);
    snprintf(args, sizeof args, "--ckpt=%s --device=cuda", ckpt);
    expect_one_line(run_tool(sample_binary(), args, "/dev/null", err, sizeof err), 2, err, "no GPU is visible",
                    "bin/sample");
    expect_one_line(run_tool(zero_memory_binary(), "--device=cuda", out, err, sizeof err), 2, err,
                    "no GPU is visible", "bin/zero_memory");
    size_t n;
    unsigned char *printed = read_all(out, &n);
    cr_expect_eq(n, 0, "bin/zero_memory printed before its error: %s", printed);
    free(printed);
    remove_dir(dir);
}

/* ---- injected faults (--inject-fault) ---- */

static const char *const FAULT_SITES_TESTED[] = { "forward", "backward", "collective", "step", "save" };

/* Each site, every strategy, at N = 1 and 3: one line naming the rank, the
 * step and the place, exit 1, in seconds, and the checkpoint left byte for
 * byte as it was. The faults strike at step 3 of a run resumed at 2, the save's
 * at the final save (5). */
Test(train, an_injected_fault_ends_the_run_with_one_line_and_the_checkpoint_intact, .timeout = 300) {
    char dir[64], ckpt[128], args[1024], err[4096], needle[160];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        for (int nranks = 1; nranks <= 3; nranks += 2) {
            for (size_t w = 0; w < sizeof FAULT_SITES_TESTED / sizeof FAULT_SITES_TESTED[0]; w++) {
                const char *site = FAULT_SITES_TESTED[w];
                int rank = nranks - 1, step = strcmp(site, "save") == 0 ? 5 : 3;
                snprintf(args, sizeof args, "%s --iters=5 --zero=%d --gpus=%d --out=%s --resume=%s "
                         "--inject-fault=%d:%d:%s", TINY, zero, nranks, dir, ckpt, rank, step, site);
                snprintf(needle, sizeof needle, "rank %d: injected fault (--inject-fault) at step %d in the %s", rank,
                         step, site);
                double t0 = wall_seconds();
                expect_one_line(run_train(args, err, sizeof err), 1, err, needle, args);
                cr_expect_lt(wall_seconds() - t0, 20.0, "%s: the run did not end promptly", args);
                char what[1100];
                snprintf(what, sizeof what, "%s changed the checkpoint", args);
                expect_unchanged(ckpt, good, n, what);
                if (w == sizeof FAULT_SITES_TESTED / sizeof FAULT_SITES_TESTED[0] - 1)
                    cr_expect(strstr(err, "is as it was)") != NULL, "%s: %s", args, err);
            }
        }
    }
    /* a failed first save says that there is no checkpoint, not that one is as it was */
    char fresh[64];
    temp_dir(fresh, sizeof fresh, "fresh");
    snprintf(args, sizeof args, "%s --iters=2 --out=%s --inject-fault=0:2:save", TINY, fresh);
    snprintf(needle, sizeof needle, "nothing was saved (there is no %s/ckpt.safetensors)", fresh);
    expect_one_line(run_train(args, err, sizeof err), 1, err, needle, "the first save");
    remove_dir(fresh);
    free(good);
    remove_dir(dir);
}

/* A run of `zero` at `nranks` to 4 steps: from scratch, saving at 2 into
 * out_dir (NULL: no saves) with `fault` injected; or, with `resume`, from that
 * file. Its status; the weights in *weights (malloc'd) when it went through. */
static int fault_run(int zero, int nranks, Fault fault, const char *out_dir, const char *resume, float **weights) {
    StrategyConfig sc = small_model(0.1f, 3);
    sc.nranks = nranks;
    sc.batch = 2;
    sc.fault = fault;
    Strategy *s = strategy_create(zero, &sc);
    cr_assert_not_null(s);
    TrainConfig tc = quiet_run(4);
    tc.eval_every = 2;
    tc.eval_iters = 1;
    tc.always_save = 1;
    tc.out_dir = out_dir;
    if (resume) {
        CheckpointInfo info;
        char err[512];
        cr_assert_eq(checkpoint_load(s, resume, 1, &info, err, sizeof err), 0, "%s", err);
        tc.start_iter = info.iter;
    }
    TrainResult r;
    int status = train_run(s, &tc, &data, &r);
    if (status == 0) {
        ArenaLayout layout;
        model_layout(&sc.model, 1, &layout);
        *weights = malloc(layout.total * sizeof(float));
        strategy_read_all(s, STATE_WEIGHTS, *weights);
    }
    s->ops->destroy(s);
    return status;
}

/* A run that a fault stopped after its save at step 2 resumes from that file
 * to the uninterrupted run's weights, byte for byte: every site, every
 * strategy, N = 1 and 3 (the fault at step 3, the save's at the final save). */
Test(train, a_run_stopped_by_a_fault_resumes_to_the_same_bits, .timeout = 300) {
    char dir[64], ckpt[128];
    temp_dir(dir, sizeof dir, "fault");
    snprintf(ckpt, sizeof ckpt, "%s/%s", dir, CHECKPOINT_FILE_NAME);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        for (int nranks = 1; nranks <= 3; nranks += 2) {
            float *whole = NULL;
            ArenaLayout layout;
            StrategyConfig sc = small_model(0.1f, 3);
            model_layout(&sc.model, 1, &layout);
            cr_assert_eq(fault_run(zero, nranks, (Fault){ .where = FAULT_NONE }, NULL, NULL, &whole), 0);
            /* a hang is for the other processes' timeout: tests/test_multiprocess.c */
            for (int where = FAULT_FORWARD; where <= FAULT_SAVE; where++) {
                Fault fault = { .where = (FaultSite)where, .rank = nranks - 1, .step = where == FAULT_SAVE ? 4 : 3 };
                float *resumed = NULL;
                unlink(ckpt);
                cr_expect_eq(fault_run(zero, nranks, fault, dir, NULL, &resumed), 1, "ZeRO-%d N=%d %s: not stopped",
                             zero, nranks, fault_site_name(fault.where));
                cr_expect_eq(adam_steps_of(ckpt), 2);
                cr_assert_eq(fault_run(zero, nranks, (Fault){ .where = FAULT_NONE }, NULL, ckpt, &resumed), 0);
                cr_expect(memcmp(resumed, whole, layout.total * sizeof(float)) == 0,
                          "ZeRO-%d N=%d, a fault in the %s: the resumed run differs from the whole one", zero, nranks,
                          fault_site_name(fault.where));
                free(resumed);
            }
            free(whole);
        }
    }
    remove_dir(dir);
}

/* ---- signals ---- */

typedef struct { pid_t pid; FILE *out; char err_path[64]; } Child;

/* bin/train args as a child: its stdout on child->out (a pipe), its stderr to a file. */
static Child start_train(const char *args) {
    Child c;
    snprintf(c.err_path, sizeof c.err_path, "/tmp/zf_child_err_%d", (int)getpid());
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s %s 2>%s", train_binary(), args, c.err_path);
    c.pid = fork();
    cr_assert_geq(c.pid, 0);
    if (c.pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    c.out = fdopen(fds[0], "r");
    cr_assert_not_null(c.out);
    return c;
}

/* Read the child's lines until one starts with `prefix`; 1 if one did. */
static int wait_for_line(Child *c, const char *prefix) {
    char line[1024];
    while (fgets(line, sizeof line, c->out))
        if (strncmp(line, prefix, strlen(prefix)) == 0) return 1;
    return 0;
}

/* The rest of its output read, its exit status (-1 unless it exited) and its stderr. */
static int finish_child(Child *c, char *err, size_t errlen) {
    char line[1024];
    while (fgets(line, sizeof line, c->out)) continue;
    fclose(c->out);
    int status;
    cr_assert_eq(waitpid(c->pid, &status, 0), c->pid);
    size_t n;
    char *text = (char *)read_all(c->err_path, &n);
    snprintf(err, errlen, "%.*s", (int)n, text);
    free(text);
    unlink(c->err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Every stop signal: SIGINT, SIGTERM, SIGHUP (a terminal closed), SIGUSR1
 * and SIGUSR2 (a batch system's warning). */
Test(train, a_signal_finishes_the_step_saves_and_exits_128_plus_it, .timeout = 300) {
    static const struct { int sig; const char *name; } cases[] = {
        { SIGINT, "SIGINT" }, { SIGTERM, "SIGTERM" }, { SIGHUP, "SIGHUP" }, { SIGUSR1, "SIGUSR1" }, { SIGUSR2, "SIGUSR2" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64], ckpt[128], args[1024], err[4096], needle[128];
        temp_dir(dir, sizeof dir, "signal");
        snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
        snprintf(args, sizeof args, "%s --iters=1000000 --log-every=1 --zero=3 --gpus=3 --out=%s", TINY, dir);
        Child c = start_train(args);
        cr_assert(wait_for_line(&c, "iter "), "no iter line");
        cr_assert_eq(kill(c.pid, cases[i].sig), 0);
        int rc = finish_child(&c, err, sizeof err);
        snprintf(needle, sizeof needle, "train: stopped by %s after", cases[i].name);
        expect_one_line(rc, 128 + cases[i].sig, err, needle, cases[i].name);
        cr_expect(strstr(err, "saved in") != NULL, "%s", err);
        /* the file holds the steps the line names, and resumes for two more */
        int done = -1;
        cr_assert_eq(sscanf(strstr(err, "after ") + 6, "%d", &done), 1, "%s", err);
        cr_expect_eq(adam_steps_of(ckpt), done);
        snprintf(args, sizeof args, "%s --iters=%d --zero=1 --gpus=2 --out=%s --resume=%s", TINY, done + 2, dir, ckpt);
        cr_expect_eq(run_train(args, err, sizeof err), 0, "resuming: %s", err);
        cr_expect_eq(adam_steps_of(ckpt), done + 2);
        remove_dir(dir);
    }
}

/* A signal in the middle of a long evaluation (at step 3 of a run resumed at
 * 2), or of the end's long sample, stops the run within seconds (between two
 * evaluation batches, or two calls of the sample), saved at the step the
 * evaluation was for, or with every step done. */
Test(train, a_signal_in_an_evaluation_or_the_sample_stops_the_run_at_once, .timeout = 300) {
    static const struct { const char *what, *args, *wait_for, *needle; int sig, steps; } cases[] = {
        { "an evaluation", "--iters=100 --eval-every=3 --eval-iters=1000000 --log-every=1", "iter 2:",
          "train: stopped by SIGTERM after 3 steps, saved in", SIGTERM, 3 },
        { "the sample", "--iters=4 --eval-iters=1 --sample-chars=100000000", "sample:",
          "train: stopped by SIGINT after 4 steps, saved in", SIGINT, 4 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64], ckpt[128], args[1024], err[4096];
        train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
        snprintf(args, sizeof args, "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 %s --out=%s --resume=%s",
                 cases[i].args, dir, ckpt);
        Child c = start_train(args);
        cr_assert(wait_for_line(&c, cases[i].wait_for), "%s: no '%s' line", cases[i].what, cases[i].wait_for);
        usleep(300 * 1000);
        double t0 = wall_seconds();
        cr_assert_eq(kill(c.pid, cases[i].sig), 0);
        /* a run that does not stop is killed after 20 s, and fails below */
        pid_t watchdog = fork();
        cr_assert_geq(watchdog, 0);
        if (watchdog == 0) {
            sleep(20);
            kill(c.pid, SIGKILL);
            _exit(0);
        }
        int rc = finish_child(&c, err, sizeof err);
        double seconds = wall_seconds() - t0;
        kill(watchdog, SIGKILL);
        waitpid(watchdog, NULL, 0);
        expect_one_line(rc, 128 + cases[i].sig, err, cases[i].needle, cases[i].what);
        cr_expect_lt(seconds, 5.0, "%s: %.1f s from the signal to the end", cases[i].what, seconds);
        cr_expect_eq(adam_steps_of(ckpt), cases[i].steps, "%s", cases[i].what);
        remove_dir(dir);
    }
}

/* A signal while the run starts (reading a 200 MB data file) is taken as any
 * other: no step done, nothing saved, exit 143; not the default death. */
Test(train, a_signal_in_the_start_stops_the_run_before_any_step, .timeout = 120) {
    char dir[64], data_path[128], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "signal");
    snprintf(data_path, sizeof data_path, "%s/big.txt", dir);
    FILE *f = fopen(data_path, "wb");
    cr_assert_not_null(f);
    char block[1 << 16];
    for (size_t i = 0; i < sizeof block; i++) block[i] = (char)('a' + i % 26);
    for (int i = 0; i < 200 * 16; i++) cr_assert_eq(fwrite(block, 1, sizeof block, f), sizeof block);
    cr_assert_eq(fclose(f), 0);
    snprintf(args, sizeof args, "%s --iters=5 --data=%s --out=%s", TINY, data_path, dir);
    Child c = start_train(args);
    usleep(300 * 1000);
    cr_assert_eq(kill(c.pid, SIGTERM), 0);
    int rc = finish_child(&c, err, sizeof err);
    expect_one_line(rc, 143, err, "train: stopped by SIGTERM before any step; nothing to save", "a signal at start");
    remove_dir(dir);
}

/* A reader that goes away (`bin/train | head -1`) is a failed write: one line,
 * exit 1, not SIGPIPE's silent death. */
Test(train, a_closed_pipe_is_a_failed_write_in_one_line, .timeout = 60) {
    char cmd[1024], err_path[64], err[4096];
    snprintf(err_path, sizeof err_path, "/tmp/zf_pipe_err_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s %s --iters=200 --log-every=1 2>%s | head -1 >/dev/null; exit ${PIPESTATUS[0]}",
             train_binary(), TINY, err_path);
    char full[1200];
    snprintf(full, sizeof full, "bash -c '%s'", cmd);
    int status = system(full);
    take_text(err_path, err, sizeof err);
    expect_one_line(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1, err, "cannot write the progress output: Broken pipe",
                    "a closed pipe");
}

/* A step of several seconds (ZeRO-3 on 2 ranks over a link of 0.5 s a hop): the
 * first SIGINT waits for it, a second one exits at once, the checkpoint of the
 * run before as it was. */
Test(train, a_second_signal_exits_at_once_with_the_checkpoint_intact, .timeout = 300) {
    char dir[64], ckpt[128], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    size_t n;
    unsigned char *good = read_all(ckpt, &n);
    snprintf(args, sizeof args, "%s --iters=10 --log-every=1 --zero=3 --gpus=2 --link=10,500000 --out=%s --resume=%s",
             TINY, dir, ckpt);
    Child c = start_train(args);
    cr_assert(wait_for_line(&c, "iter 2:"), "no iter line");
    cr_assert_eq(kill(c.pid, SIGINT), 0);
    usleep(200 * 1000);
    double t0 = wall_seconds();
    cr_assert_eq(kill(c.pid, SIGINT), 0);
    int rc = finish_child(&c, err, sizeof err);
    double seconds = wall_seconds() - t0;
    expect_one_line(rc, 130, err, "train: a second signal: stopping at once", "a second SIGINT");
    cr_expect_lt(seconds, 2.0, "the second signal took %.1f s to end the run (a step takes 3)", seconds);
    expect_unchanged(ckpt, good, n, "the checkpoint changed");
    free(good);
    remove_dir(dir);
}

/* ---- a file PyTorch's safetensors package wrote ---- */

/* nanoGPT's state_dict (tests/torch_gpt.py's copy of the model, PyTorch's own
 * init) written by safetensors.torch.save_file, with no metadata of ours:
 * --init-from takes it, and the weights it starts from are the file's, byte
 * for byte (saved after 0 steps). A file of other shapes than the flags' is a
 * one-line error naming the tensor. */
Test(train, init_from_takes_nanogpts_state_dict_saved_by_the_safetensors_package, .timeout = 300) {
    need_safetensors();
    char dir[64], torch_file[128], ckpt[128], cmd[2048], args[1024], err[4096];
    temp_dir(dir, sizeof dir, "torch_st");
    snprintf(torch_file, sizeof torch_file, "%s/nanogpt.safetensors", dir);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    snprintf(cmd, sizeof cmd, "PYTHONPATH=build/pylib:tools %s -c '"
             "import torch, torch_gpt\n"
             "from safetensors.torch import save_file\n"
             "torch.manual_seed(0)\n"
             "m = torch_gpt.GPT(%d, 16, 2, 2, 16)\n"
             "save_file({k: v.detach().clone().contiguous() for k, v in m.state_dict().items()}, \"%s\")'",
             test_python(), data.vocab, torch_file);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(args, sizeof args, "%s --iters=0 --init-from=%s --out=%s", TINY, torch_file, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    ModelConfig model = { data.vocab, 16, 2, 2, 16, MODEL_GPT, 0, 0 };
    ArenaLayout layout;
    gpt_layout(&model, 1, &layout);
    StFile theirs, ours;
    cr_assert_eq(safetensors_open(&theirs, torch_file, err, sizeof err), 0, "%s", err);
    cr_assert_eq(safetensors_open(&ours, ckpt, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < layout.ntensors; i++) {
        const TensorSpec *ts = &layout.tensors[i];
        int64_t shape[2] = { ts->shape[0], ts->shape[1] };
        const void *a = safetensors_tensor(&theirs, ts->name, "F32", ts->ndim, shape, err, sizeof err);
        const void *b = safetensors_tensor(&ours, ts->name, "F32", ts->ndim, shape, err, sizeof err);
        cr_assert(a && b, "%s: %s", ts->name, err);
        cr_expect(memcmp(a, b, ts->numel * sizeof(float)) == 0, "%s is not the file's", ts->name);
    }
    safetensors_close(&theirs);
    safetensors_close(&ours);
    snprintf(args, sizeof args, "%s --embd=32 --iters=1 --init-from=%s", TINY, torch_file);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "tensor 'transformer.wte.weight' has shape [65,16], expected [65,32]", "other shapes");
    remove_dir(dir);
}

/* GPT-2's biases through the checkpoint: 3 steps of ZeRO-3 on 2 ranks, resumed
 * by DDP on 2 for 3 more, save the file an unbroken run of 6 saves, byte for
 * byte; a run without biases refuses it. */
Test(train, a_checkpoint_with_biases_resumes_under_another_strategy_to_the_same_bytes, .timeout = 120) {
    char dir[64], args[1024], err[4096], whole[160], resumed[160];
    temp_dir(dir, sizeof dir, "bias");
    static const char MODEL[] = "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0 "
                                "--dropout=0.1 --bias=1 --gpus=2";
    snprintf(whole, sizeof whole, "%s/whole/%s", dir, CHECKPOINT_FILE_NAME);
    snprintf(resumed, sizeof resumed, "%s/parts/%s", dir, CHECKPOINT_FILE_NAME);
    snprintf(args, sizeof args, "%s --zero=3 --iters=6 --out=%s/whole", MODEL, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "%s --zero=3 --iters=3 --out=%s/parts", MODEL, dir);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "%s --zero=0 --iters=6 --out=%s/parts --resume=%s", MODEL, dir, resumed);
    cr_assert_eq(run_train(args, err, sizeof err), 0, "%s", err);
    size_t na, nb;
    unsigned char *a = read_all(whole, &na), *b = read_all(resumed, &nb);
    cr_expect(na == nb && memcmp(a, b, na) == 0, "the resumed run's checkpoint differs from the unbroken run's");
    free(a);
    free(b);
    snprintf(args, sizeof args, "--layers=2 --embd=16 --heads=2 --block=16 --iters=8 --init-from=%s", whole);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "bias 1, GELU erf; this run's is 2, 2, 16, 16, 65, 0, erf",
                    "a run without biases from a checkpoint with them");
    remove_dir(dir);
}

/* The GPT-2 presets: nanoGPT's configs, with biases, over its train_gpt2
 * recipe, and GPT-2's 50257 ids padded to 50304 (a text's 65 stay 65). */
Test(train, the_gpt2_presets_are_nanogpts_configs_and_recipe) {
    static const struct { const char *name; int layers, heads, embd; } want[] = {
        { "gpt2", 12, 12, 768 }, { "gpt2-medium", 24, 16, 1024 }, { "gpt2-large", 36, 20, 1280 },
        { "gpt2-xl", 48, 25, 1600 },
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char line[64], err[256], *argv[4];
        snprintf(line, sizeof line, "--preset=%s", want[i].name);
        int argc = split_args(line, argv, 4);
        TrainOptions o;
        cr_assert_eq(options_read(&o, "train", "char", argc, argv, err, sizeof err), 0, "%s", err);
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
    char line[64] = "", err[256], *argv[2];
    int argc = split_args(line, argv, 2);
    TrainOptions o;
    cr_assert_eq(options_read(&o, "train", "char", argc, argv, err, sizeof err), 0, "%s", err);
    cr_expect_eq(options_model_vocab(&o, 65), 65);
    cr_expect_eq(o.bias, 0);
    cr_expect_eq(options_model(&o, 65).gelu_tanh, 0, "the char presets keep nanoGPT's exact GELU");
}
