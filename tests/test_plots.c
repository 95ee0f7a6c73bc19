/* test_plots.c: bin/train's log and trace, and the plots drawn from them. */
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
#include "fixtures.h"
#include "reference.h"

static Dataset data;

static void setup(void) {
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 32, err, sizeof err), 0, "%s", err);
}

static void teardown(void) { dataset_free(&data); }

TestSuite(plots, .init = setup, .fini = teardown);

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

Test(plots, plot_loss_draws_a_log) {
    expect_plot("tools/plot_loss", "--iters=4 --eval-every=2 --eval-iters=1 --sample-chars=0 --log-every=1 "
                "--layers=1 --embd=16 --heads=2 --block=16", "--log");
}

/* ---- --trace: a Chrome trace of the first steps ---- */

static int count_spans(const TraceSpan *spans, int n, int pid, int tid, const char *name) {
    int count = 0;
    for (int i = 0; i < n; i++) count += spans[i].pid == pid && spans[i].tid == tid && !strcmp(spans[i].name, name);
    return count;
}

Test(plots, trace_writes_chrome_trace_events) {
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
        /* two steps traced of three: each op, unit and collective once a step, the head's matmul too (its
         * logits, loss and gradient made once, in the backward) */
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

Test(plots, trace_to_a_file_it_cannot_write_exits_1_with_one_line) {
    char err[4096];
    int rc = run_train("--iters=1 --layers=1 --embd=16 --heads=2 --block=16 --trace=/nonexistent/dir/t.json", err,
                       sizeof err);
    cr_expect_eq(rc, 1);
    cr_expect(strstr(err, "cannot write --trace file '/nonexistent/dir/t.json'") != NULL, "%s", err);
    cr_expect_eq(count_lines(err), 1, "%s", err);
}

Test(plots, plot_trace_draws_a_trace) {
    expect_plot("tools/plot_trace", "--iters=1 --eval-every=0 --eval-iters=0 --sample-chars=0 --layers=1 --embd=16 "
                "--heads=2 --block=16 --zero=2 --gpus=2", "--trace");
}
