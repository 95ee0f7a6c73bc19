/* test_memory.c: memory: bin/zero_memory's formulas, measures and estimate, the --max-memory-mb
 * cap, runs bigger than the machine. */
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

TestSuite(memory, .init = setup, .fini = teardown);

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
Test(memory, zero_memory_prints_every_strategy_within_the_formulas) {
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
Test(memory, zero_memory_with_gpus_measures_every_rank_count_up_to_it) {
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

Test(memory, a_model_larger_than_memory_is_one_line_and_exit_1, .timeout = 60) {
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
    expect_one_line(rc, 1, err, "error: out of memory on cpu for DDP, N=1: this process's 1 rank(s) need about",
                    "a model larger than memory");
    cr_expect(strstr(err, "a smaller model or fewer rows (--batch)") != NULL, "no hint: %s", err);
}

/* Eight ranks of a small model, each with 13 GB of activations: one rank's
 * would fit the machine, the eight do not. Refused at once, before the first
 * rank's activations are made and zeroed (half a minute) for the second
 * rank's to fail. */
Test(memory, ranks_whose_activations_pass_the_machine_are_refused_at_once, .timeout = 60) {
    if (host_memory_free() > (size_t)80 << 30) test_skip("the machine has more than 80 GB free: eight ranks fit");
    char err[4096];
    double t0 = wall_seconds();
    int rc = run_train("--layers=2 --embd=64 --heads=1 --block=1024 --batch=1000 --gpus=8 --device=cpu --iters=1 "
                       "--eval-iters=1", err, sizeof err);
    expect_one_line(rc, 1, err, "error: out of memory on cpu for DDP, N=8: this process's 8 rank(s) need about",
                    "eight ranks' activations");
    cr_expect(strstr(err, "MB of activations") != NULL, "%s", err);
    cr_expect_lt(wall_seconds() - t0, 5.0, "%.1f s to refuse", wall_seconds() - t0);
}

/* 8 blocks of 128 on 4 ranks: DDP holds 28 MB a rank, ZeRO-3 12.3 MB (bin/train's memory line). */
/* The command that runs a tool with its address space capped near the
 * machine's free memory (ulimit -v), so that a run that took more than the
 * machine has fails to allocate, rather than wake the kernel's OOM killer
 * (which may take the test's neighbours with it); not under AddressSanitizer,
 * whose shadow memory needs terabytes of address space. */
static void capped(char *cmd, size_t len, const char *binary) {
#ifdef __SANITIZE_ADDRESS__
    snprintf(cmd, len, "%s", binary);
#else
    snprintf(cmd, len, "ulimit -v %zu; exec %s", host_memory_free() / 1024 * 5 / 4, binary);
#endif
}

/* How many blocks 2048 wide (16 heads) hold `times` the machine's free
 * memory in weights alone; the test skips past the 170 a model may have. */
static int layers_past_the_machine(double times) {
    double free_bytes = (double)host_memory_free(), per_layer = 12.0 * 2048 * 2048 * sizeof(float);
    int layers = (int)ceil(times * free_bytes / per_layer);
    if (layers > 170) test_skip("the machine has %.0f GB free, more than 170 layers 2048 wide hold", free_bytes / 1e9);
    return layers;
}

/* A model whose weights alone pass the memory the machine has free (each
 * allocation under what the kernel would refuse by itself, so it would be
 * granted, touched and OOM-killed) stops at its first allocation past it:
 * one line naming the machine's free memory, exit 1, within seconds. */
Test(memory, a_run_bigger_than_the_machine_stops_at_once_in_one_line, .timeout = 60) {
    int layers = layers_past_the_machine(1.1);
    char cmd[1024], args[512], err[4096];
    capped(cmd, sizeof cmd, train_binary());
    snprintf(args, sizeof args, "%s --embd=2048 --heads=16 --layers=%d --batch=1 --device=cpu", TINY, layers);
    double t0 = wall_seconds();
    int rc = run_tool(cmd, args, "/dev/null", err, sizeof err);
    expect_one_line(rc, 1, err, "error: out of memory on cpu for DDP, N=1", "too big a model");
    cr_expect(strstr(err, "the machine had free for the run") != NULL, "not the machine's memory: %s", err);
    cr_expect_lt(wall_seconds() - t0, 30.0, "%.1f s to refuse", wall_seconds() - t0);
}

/* Past bin/train's own check (bin/zero_memory builds each strategy as it
 * is, as a test or a tool would): the allocator itself holds the CPU's
 * allocations to the machine's free memory, one line naming it, exit 1.
 * The weights alone pass the address space the command is capped at, so an
 * allocator that did not check fails at the cap, with another line, and
 * never touches what the machine does not have. */
Test(memory, the_allocator_holds_the_cpu_to_the_machines_free_memory, .timeout = 60) {
    int layers = layers_past_the_machine(1.3);
    char cmd[1024], err[4096], args[256];
    capped(cmd, sizeof cmd, zero_memory_binary());
    snprintf(args, sizeof args, "--embd=2048 --heads=16 --layers=%d --batch=1 --block=16 --device=cpu", layers);
    int rc = run_tool(cmd, args, "/dev/null", err, sizeof err);
    expect_one_line(rc, 1, err, "error: out of memory on cpu for DDP, N=1, rank 0: cannot allocate", "weights past the machine");
    cr_expect(strstr(err, "the machine had free for the run") != NULL, "not the machine's memory: %s", err);
}

/* A data file whose bytes and tokens would take twice the machine's free
 * memory (a sparse file: no disk taken) is refused before a byte is read. */
Test(memory, a_data_file_bigger_than_the_machine_is_refused_before_reading, .timeout = 60) {
    char dir[64], big[128], cmd[1024], args[512], err[4096];
    temp_dir(dir, sizeof dir, "bigdata");
    snprintf(big, sizeof big, "%s/big.txt", dir);
    int fd = open(big, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)(host_memory_free() / 5 * 2)), 0);
    close(fd);
    capped(cmd, sizeof cmd, train_binary());
    snprintf(args, sizeof args, "%s --iters=2 --data=%s", TINY, big);
    double t0 = wall_seconds();
    expect_one_line(run_tool(cmd, args, "/dev/null", err, sizeof err), 1, err,
                    "of host memory (its bytes and their tokens), and the machine has", "a sparse data file");
    cr_expect_lt(wall_seconds() - t0, 10.0, "%.1f s to refuse", wall_seconds() - t0);
    remove_dir(dir);
}

static const char CAPPED[] = "--layers=8 --embd=128 --heads=2 --block=16 --batch=2 --eval-iters=1 --sample-chars=0 "
                             "--iters=2 --gpus=4";

Test(memory, max_memory_mb_caps_each_rank_and_the_refusal_names_the_stage_that_fits, .timeout = 60) {
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

/* The ZeRO paper's Figure 1 from the registry's shard flags alone: mixed
 * precision (2 bytes of weights, 2 of gradients, K = 12), Psi = 7.5B
 * parameters, N_d = 64: 120, 31.4, 16.6 and 1.9 GB per device; and each
 * kind's bytes per parameter in both precisions, as the paper writes them,
 * and with the gradients held in fp32 for an fp32 reduction. */
/* --estimate and --shard-ranks are rows of the flag table as any other:
 * --estimate alone is --estimate=1, --estimate=0 builds, and --shard-ranks
 * takes its value either way (found by a probe: --estimate=0 was an unknown
 * flag, --shard-ranks 2 another tool's). */
Test(memory, zero_memory_reads_estimate_and_shard_ranks_as_its_other_flags) {
    static char alone[16384], one[16384], zero[16384], spaced[16384], joined[16384], whole[16384];
    run_zero_memory("--estimate --gpus=1", alone, sizeof alone);
    run_zero_memory("--estimate=1 --gpus=1", one, sizeof one);
    cr_expect_str_eq(alone, one, "--estimate and --estimate=1 differ");
    cr_expect(strstr(alone, "estimate for ") != NULL, "%s", alone);
    run_zero_memory("--estimate=0 --gpus=1", zero, sizeof zero);
    cr_expect(strstr(zero, "counted by the allocator") != NULL, "--estimate=0 builds nothing:\n%s", zero);
    run_zero_memory("--estimate --gpus=4 --shard-ranks 2", spaced, sizeof spaced);
    run_zero_memory("--estimate --gpus=4 --shard-ranks=2", joined, sizeof joined);
    cr_expect_str_eq(spaced, joined, "--shard-ranks 2 and --shard-ranks=2 differ");
    run_zero_memory("--estimate --gpus=4", whole, sizeof whole);
    const char *sharded = strstr(joined, "| ZeRO-3 | 4 |"), *full = strstr(whole, "| ZeRO-3 | 4 |");
    cr_assert(sharded && full, "no ZeRO-3 row at N = 4:\n%s", joined);
    cr_expect_neq(strncmp(sharded, full, strcspn(full, "\n")), 0, "--shard-ranks=2 left ZeRO-3's row at N = 4 as it was");
}

Test(memory, zero_memory_estimate_reproduces_the_zero_papers_figure_1) {
    char out[16384];
    run_zero_memory("--estimate --gpus=1", out, sizeof out);
    static const char *rows[STRATEGY_KINDS] = {
        "| DDP | 16 | 16 | 18 | 120.0 GB | 120 GB |",
        "| ZeRO-1 | 8 + 8/N | 4 + 12/N | 6 + 12/N | 31.4 GB | 31.4 GB |",
        "| ZeRO-2 | 4 + 12/N | 2 + 14/N | 2 + 16/N | 16.6 GB | 16.6 GB |",
        "| ZeRO-3 | 16/N | 16/N | 18/N | 1.9 GB | 1.9 GB |",
    };
    for (int k = 0; k < STRATEGY_KINDS; k++) cr_expect_not_null(strstr(out, rows[k]), "no row %s in:\n%s", rows[k], out);
}

/* The formulas, allocating nothing, at a size this machine could not build:
 * gpt2-xl's 1.56G parameters at N = 8 in a process of a few MB; the state as
 * the ZeRO paper's 16P, 8P + 8P/N, 4P + 12P/N, 16P/N. Where a model fits,
 * bin/zero_memory holds every kind of the estimate to the allocator's count
 * within 1% itself, and its exit status says so: for each unit policy,
 * overlap and recompute, and a GPT-2-shaped model (biases, GELU's tanh form). */
Test(memory, zero_memory_estimate_agrees_with_the_allocator_and_allocates_nothing, .timeout = 120) {
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
    /* the last two: a vocabulary whose chunk of logits is the CPU's widest room in bf16, and ZeRO-2/3's head
     * gradient written in place (fresh gradients), its two products made apart in that room */
    static const char *settings[] = { "--gpus=3 --unit=half --max-live-units=3", "--overlap=0 --recompute=1",
                                      "--unit=tensor --bias=1 --gelu=tanh --gpus=2", "--dtype=bf16 --bias=1 --gpus=2",
                                      "--dtype=bf16 --pad-vocab=4096 --gpus=1",
                                      "--dtype=bf16 --reduce-dtype=bf16 --pad-vocab=4096 --gpus=2" };
    for (int i = 0; i < 6; i++) run_zero_memory(settings[i], out, sizeof out);
}

/* bin/zero_memory's estimate for a GPU (a CUDA build's; no GPU needed) holds
 * each rank's cuBLASLt workspace for its bf16 products as working memory:
 * 33.6 MB more in bf16 than in fp32, whose products hold none of ours. */
Test(memory, a_gpus_estimate_holds_its_bf16_products_workspace) {
    if (!cuda_kernel_ops()) test_skip("a build without CUDA estimates no GPU");
    static char out[16384];
    double working[2];
    for (int k = 0; k < 2; k++) {
        run_zero_memory(k ? "--estimate --gpus=1 --device=cuda --dtype=bf16" : "--estimate --gpus=1 --device=cuda",
                        out, sizeof out);
        const char *at = strstr(out, "| DDP | 1 | ");
        cr_assert_not_null(at, "no row for DDP at N = 1 in:\n%s", out);
        at += strlen("| DDP | 1 | ");
        for (int column = 0; column < 5; column++) working[k] = strtod(at, (char **)&at), at += 2;
    }
    cr_expect_lt(fabs(working[1] - working[0] - DEVICE_PRODUCT_WORKSPACE_BYTES / 1e6), 0.1,
                 "working: %.1f MB in bf16, %.1f in fp32", working[1], working[0]);
}

/* A model shaped as GPT-2 (biases, GELU's tanh form; 16 blocks: its blocks,
 * not its embeddings, hold most of it) at N = 8 simulated ranks, under a cap
 * halfway between ZeRO-3's estimate and ZeRO-2's: ZeRO-3 trains, evaluates,
 * samples, saves and resumes with every rank's peak under the cap, and DDP
 * refuses at once, naming ZeRO-3. */
static const char EIGHT[] = "--layers=16 --embd=64 --heads=2 --block=16 --batch=1 --bias=1 --gelu=tanh --gpus=8";
static const char EIGHT_RUN[] = "--eval-iters=1 --eval-every=2 --sample-chars=16";  /* bin/train's alone */

Test(memory, a_cap_between_zero3_and_ddp_trains_saves_and_resumes_zero3_and_ddp_refuses, .timeout = 120) {
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
        snprintf(args, sizeof args, "%s %s %s --max-memory-mb=%.3f --out=%s", EIGHT, EIGHT_RUN, step, cap, dir);
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
    snprintf(args, sizeof args, "%s %s --iters=2 --zero=0 --max-memory-mb=%.3f", EIGHT, EIGHT_RUN, cap);
    expect_one_line(run_train(args, err, sizeof err), 1, err, "--zero=3 (ZeRO-3) fits", "DDP under the cap");
    remove_dir(dir);
}
