/* test_train.c: the trainer: learning, determinism, the schedule, and bin/train's
 * handling of bad input. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../kernels/backend.h"  /* cuda_kernel_ops: whether this build has CUDA */
#include "../strategies/trainer.h"
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
        .model = { data.vocab, 32, 2, 2, 32, MODEL_GPT }, .nranks = 1, .batch = 8, .dropout = dropout,
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
    Strategy *s = ddp_create(&sc);
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
    Strategy *s = ddp_create(&sc);
    ArenaLayout layout;
    gpt_layout(&sc.model, 1, &layout);
    float *w = malloc(layout.total * sizeof(float));
    s->ops->read_weights(s, w);
    w[layout.tensors[arena_find(&layout, "transformer.ln_f.weight")].offset] = NAN;
    s->ops->write_weights(s, w);
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

/* The binary under test: bin/train, or the sanitizer build's (ZF_TRAIN). */
static const char *train_binary(void) {
    const char *path = getenv("ZF_TRAIN");
    return path ? path : "./bin/train";
}

static int run_train(const char *args, char *err, size_t errlen) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>/tmp/zf_train_err_%d", train_binary(), args, (int)getpid());
    int status = system(cmd);
    snprintf(cmd, sizeof cmd, "/tmp/zf_train_err_%d", (int)getpid());
    FILE *f = fopen(cmd, "r");
    size_t n = f ? fread(err, 1, errlen - 1, f) : 0;
    err[n] = 0;
    if (f) fclose(f);
    unlink(cmd);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int count_lines(const char *text) {
    int n = 0;
    for (; *text; text++) n += *text == '\n';
    return n;
}

Test(train, bad_flags_exit_2_with_one_line) {
    static const struct { const char *args, *needle; } cases[] = {
        { "--bogus=1", "unknown flag '--bogus'" },
        { "--iters=abc", "--iters expects an integer, got 'abc'" },
        { "--lr=fast", "--lr expects a number" },
        { "--embd=100 --heads=3", "--embd=100 is not divisible by --heads=3" },
        { "--dropout=1.5", "--dropout" },
        { "--preset=huge", "unknown --preset 'huge'" },
        { "--iters", "--iters needs a value" },
        { "stray", "unexpected argument 'stray'" },
        { "--layers=200", "--layers=200 must be in 1..170" },
        { "--gpus=0", "--gpus=0 must be in 1..64" },
        { "--gpus=65", "--gpus=65 must be in 1..64" },
        { "--zero=4", "--zero=4 must be 0, 1, 2 or 3" },
        { "--batch=0", "--batch=0 (rows per rank) must be at least 1" },
        { "--trace-steps=0", "--trace-steps=0 must be at least 1" },
        { "--embd=600000000 --heads=1", "exceed 2^31 floats" },
        { "--block=100000", "exceed 2^31 floats" },
    };
    char err[4096];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = run_train(cases[i].args, err, sizeof err);
        cr_expect_eq(rc, 2, "%s: exit %d", cases[i].args, rc);
        cr_expect(strstr(err, cases[i].needle) != NULL, "%s: stderr was: %s", cases[i].args, err);
        cr_expect_eq(count_lines(err), 1, "%s: stderr was: %s", cases[i].args, err);
    }
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
    cr_expect_eq(rc, 1);
    cr_expect_eq(count_lines(err), 1, "%s", err);
    unlink(path);
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

/* bin/zero_memory (or the sanitizer build's, ZF_ZERO_MEMORY) on a small model:
 * it checks every rank against the ZeRO formulas itself and exits 1 if one is off. */
Test(train, zero_memory_prints_every_strategy_within_the_formulas) {
    const char *bin = getenv("ZF_ZERO_MEMORY") ? getenv("ZF_ZERO_MEMORY") : "./bin/zero_memory";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s --layers=3 --embd=24 --heads=2 --block=16", bin);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char out[8192];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = 0;
    cr_expect_eq(pclose(p), 0, "%s failed:\n%s", cmd, out);
    static const char *rows[] = { "| DDP | 1 |", "| ZeRO-1 | 2 |", "| ZeRO-2 | 4 |", "| ZeRO-3 | 8 |" };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        cr_expect(strstr(out, rows[i]) != NULL, "no row %s in:\n%s", rows[i], out);
    int table_rows = 0;
    for (const char *c = out; (c = strstr(c, " | 1.00")) != NULL; c++) table_rows++;
    cr_expect_eq(table_rows, 16, "16 rows at state / formula 1.00..:\n%s", out);
}

/* ---- bad checkpoint files: one line, exit 1, nothing overwritten ---- */

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot read %s", path);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = malloc(*n + 1);
    cr_assert_eq(fread(bytes, 1, *n, f), *n);
    fclose(f);
    return bytes;
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

Test(train, bad_checkpoints_are_one_line_errors_and_overwrite_nothing, .timeout = 120) {
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
        { "wrong shape", ln_f, "\"transformer.ln_f.weight\":{\"dtype\":\"F32\",\"shape\":[15]", "shape [15], expected [16]" },
        { "malformed JSON", "{", "#", "not a JSON object" },
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        write_replaced(bad_path, good, n, edits[i].from, edits[i].to);
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --resume=%s", model, dir, bad_path);
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
        { "truncated", "tensor" }, { "header length past the end", "runs past the end" }, { "extra tensor", "holds" },
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
        snprintf(args, sizeof args, "%s --iters=4 --out=%s --resume=%s", model, dir, bad_path);
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

    size_t after_n;
    unsigned char *after = read_all(good_path, &after_n);
    cr_expect(after_n == n && memcmp(after, good, n) == 0, "the good checkpoint was overwritten");
    free(after);
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

Test(train, plot_loss_draws_a_log) {
    if (system("command -v gnuplot >/dev/null") != 0) test_skip("gnuplot is missing (make deps installs it)");
    char err[4096];
    cr_assert_eq(run_train("--iters=4 --eval-every=2 --eval-iters=1 --sample-chars=0 --log-every=1 "
                           "--layers=1 --embd=16 --heads=2 --block=16 --log=/tmp/zf_plot.jsonl", err, sizeof err), 0, "%s", err);
    cr_assert_eq(system("tools/plot_loss /tmp/zf_plot.jsonl /tmp/zf_plot.png >/dev/null"), 0);
    expect_png("/tmp/zf_plot.png");
    cr_expect_neq(system("tools/plot_loss /dev/null /tmp/zf_plot_empty.png 2>/dev/null"), 0, "an empty log is an error");
    unlink("/tmp/zf_plot.jsonl");
    unlink("/tmp/zf_plot.png");
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
        /* two steps traced of three: each op, unit and collective once a step */
        cr_expect_eq(count_spans(spans, n, rank, 0, "matmul_forward"), 2 * (2 * 4 + 1), "rank %d", rank);
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
    if (system("command -v gnuplot >/dev/null") != 0) test_skip("gnuplot is missing (make deps installs it)");
    char err[4096];
    cr_assert_eq(run_train("--iters=1 --eval-every=0 --eval-iters=0 --sample-chars=0 --layers=1 --embd=16 --heads=2 "
                           "--block=16 --zero=2 --gpus=2 --trace=/tmp/zf_plot_trace.json", err, sizeof err), 0, "%s", err);
    cr_assert_eq(system("tools/plot_trace /tmp/zf_plot_trace.json /tmp/zf_plot_trace.png >/dev/null"), 0);
    expect_png("/tmp/zf_plot_trace.png");
    cr_expect_neq(system("tools/plot_trace /dev/null /tmp/zf_plot_trace_empty.png 2>/dev/null"), 0,
                  "a trace without spans is an error");
    unlink("/tmp/zf_plot_trace.json");
    unlink("/tmp/zf_plot_trace.png");
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
    cr_expect_neq(rc, 0, "a failing CUDA: exit 0");
    cr_expect(strstr(err, "CUDA cannot count the GPUs") != NULL, "a failing CUDA: stderr was: %s", err);
    cr_expect_eq(count_lines(err), 1, "a failing CUDA: stderr was: %s", err);
    char on_cpu[256];
    snprintf(on_cpu, sizeof on_cpu, "%s --device=cpu", tiny);
    rc = run_train(on_cpu, err, sizeof err);
    cr_expect_eq(rc, 0, "--device=cpu with a failing CUDA: exit %d, stderr: %s", rc, err);
    unlink(driver);
    rmdir(dir);
}
