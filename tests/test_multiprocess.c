/* test_multiprocess.c: bin/train as P processes of L rank threads under mpirun
 * (runtime/world.h), against one process of P x L simulated ranks.
 *
 * Every claim of the world is held to the bytes: the progress lines (losses,
 * evaluations, the sample; timings cut) and the final checkpoint's file, for
 * every strategy at 2 x 2, 4 x 1 and 3 x 1; checkpoints moving between splits;
 * the faults (a process killed, a rank that hangs, processes that disagree on
 * flags or data, an injected error in a rank of another process); and the
 * process group's pinned-order checks over 2 and 3 processes
 * (tests/mpi_collectives.c). Each test needs mpirun (test_mpirun(), ZF_MPIRUN
 * to override) and says SKIP without one, or fails under ZF_REQUIRE_MPI.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <libgen.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../model/safetensors.h"
#include "fixtures.h"
#include "reference.h"

TestSuite(multiprocess, .timeout = 240);

/* Small and quick, with a schedule that does not depend on --iters (so a run
 * cut in two follows the same rates), evaluating and saving every 2 steps. */
static const char BASE[] = "--layers=2 --embd=32 --heads=2 --block=32 --eval-iters=1 --eval-every=2 --log-every=1 "
                           "--sample-chars=20 --warmup=2 --lr-decay-iters=8 --lr=1e-2";

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* How to start bin/train as `procs` processes, or as one (procs 0: no launcher). */
static void launcher(char *cmd, size_t len, int procs) {
    if (procs == 0) snprintf(cmd, len, "%s", train_binary());
    else snprintf(cmd, len, "%s -np %d %s", test_mpirun(), procs, train_binary());
}

/* One finished run: its folder (--out, and its stdout), what it printed from
 * the first step on, and its final checkpoint's bytes. */
typedef struct {
    char dir[64];
    char *progress;
    unsigned char *ckpt;
    size_t ckpt_bytes;
} Run;

/* The lines of a run's stdout that must match between splits: from the first
 * evaluation or step on (the lines before name the device and the world), less
 * the timings of the iter lines, the lines naming the --out folder, the last
 * lines' seconds and the peak memory (a process's exchange staging is its
 * rank 0's, so the peak depends on the split). */
static char *progress_of(const char *stdout_path) {
    size_t n;
    char *text = (char *)read_all(stdout_path, &n), *kept = calloc(n + 1, 1), *end = kept;
    int started = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        started |= !strncmp(line, "iter ", 5) || !strncmp(line, "eval iter ", 10);
        if (!started || !strncmp(line, "saved ", 6) || !strncmp(line, "done: ", 6) || !strncmp(line, "peak ", 5))
            continue;
        char *ms = strstr(line, " ms/iter");
        if (ms) {
            *ms = 0;
            char *comma = strrchr(line, ',');
            if (comma) *comma = 0;
        }
        end += sprintf(end, "%s\n", line);
    }
    free(text);
    return kept;
}

/* bin/train `args` started by the command `cmd`, into a fresh --out folder;
 * it must succeed. */
static Run launch_with(const char *cmd, const char *args) {
    Run run = { 0 };
    temp_dir(run.dir, sizeof run.dir, "mp");
    char full[2048], out[128], ckpt[128], err[8192];
    snprintf(full, sizeof full, "%s --out=%s", args, run.dir);
    snprintf(out, sizeof out, "%s/stdout.txt", run.dir);
    int rc = run_tool(cmd, full, out, err, sizeof err);
    cr_assert_eq(rc, 0, "%s %s: exit %d, stderr:\n%s", cmd, full, rc, err);
    run.progress = progress_of(out);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", run.dir);
    run.ckpt = read_all(ckpt, &run.ckpt_bytes);
    return run;
}

/* bin/train `args` as `procs` processes (0: one, no launcher). */
static Run launch(int procs, const char *args) {
    char cmd[512];
    launcher(cmd, sizeof cmd, procs);
    return launch_with(cmd, args);
}

static void run_free(Run *run) {
    remove_dir(run->dir);
    free(run->progress);
    free(run->ckpt);
}

static int same_checkpoint(const Run *a, const Run *b) {
    return a->ckpt_bytes == b->ckpt_bytes && memcmp(a->ckpt, b->ckpt, a->ckpt_bytes) == 0;
}

static void expect_same_run(const Run *want, const Run *got, const char *what) {
    cr_expect_str_eq(got->progress, want->progress, "%s: the progress lines differ", what);
    cr_expect(same_checkpoint(want, got), "%s: the final checkpoints differ (%zu and %zu bytes)", what,
              want->ckpt_bytes, got->ckpt_bytes);
}

/* ---- the same bits at any split ---- */

typedef struct {
    int procs, local_ranks, ref_ranks;
    const char *flags;
    int sharded_only;  /* flags only the sharding strategies take (--shard-ranks): DDP is left out */
} Split;

/* For every strategy, `procs` x `local_ranks` against one process of ref_ranks. */
static void expect_every_strategy_same(Split split) {
    need_mpi();
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        if (split.sharded_only && !STRATEGIES[k].shards_adam) continue;
        char args[1024], what[256];
        snprintf(args, sizeof args, "%s --batch=3 --iters=4 %s --zero=%d --gpus=%d", BASE, split.flags, zero,
                 split.ref_ranks);
        Run want = launch(0, args);
        snprintf(args, sizeof args, "%s --batch=3 --iters=4 %s --zero=%d --gpus=%d", BASE, split.flags, zero,
                 split.local_ranks);
        Run got = launch(split.procs, args);
        snprintf(what, sizeof what, "--zero=%d %s: %d processes x %d ranks against 1 x %d", zero, split.flags,
                 split.procs, split.local_ranks, split.ref_ranks);
        expect_same_run(&want, &got, what);
        run_free(&want);
        run_free(&got);
    }
}

/* Dropout's masks are keyed by the global rank; a slow modeled link under overlap. */
Test(multiprocess, two_processes_of_two_ranks_give_the_bits_of_four_ranks) {
    expect_every_strategy_same((Split){ .procs = 2, .local_ranks = 2, .ref_ranks = 4,
                                        .flags = "--dropout=0.1 --link=5" });
}

/* Every step clipped (the norm is a sum over processes), two micro-steps. */
Test(multiprocess, four_processes_of_one_rank_give_the_bits_of_four_ranks) {
    expect_every_strategy_same((Split){ .procs = 4, .local_ranks = 1, .ref_ranks = 4,
                                        .flags = "--grad-accum=2 --grad-clip=0.01 --overlap=0" });
}

/* Three ranks pad every unit and leave uneven shards. */
Test(multiprocess, three_processes_give_the_bits_of_three_ranks_with_uneven_shards) {
    expect_every_strategy_same((Split){ .procs = 3, .local_ranks = 1, .ref_ranks = 3,
                                        .flags = "--grad-accum=2 --grad-clip=0.01 --link=5 --dropout=0.1" });
}

/* In bf16 (each rank's compute as autocast's, the same master state), with
 * GPT-2's biases, clipping and two micro-steps. */
Test(multiprocess, two_processes_of_two_ranks_give_the_bits_of_four_ranks_in_bf16) {
    expect_every_strategy_same((Split){ .procs = 2, .local_ranks = 2, .ref_ranks = 4,
                                        .flags = "--dtype=bf16 --bias=1 --grad-accum=2 --grad-clip=0.01 --dropout=0.1" });
}

/* The gradients reduced in bf16: 16 bits a number between the processes, the
 * shards uneven and padded, with two micro-steps (the reduce-scatter's add)
 * and clipping. */
Test(multiprocess, three_processes_give_the_bits_of_three_ranks_reduced_in_bf16) {
    expect_every_strategy_same((Split){ .procs = 3, .local_ranks = 1, .ref_ranks = 3,
                                        .flags = "--reduce-dtype=bf16 --grad-accum=2 --grad-clip=0.01" });
}

/* Computing and reducing in bf16: the gradients held in bf16 (the ZeRO
 * paper's 2 bytes), 16 bits a number in memory and between the processes,
 * uneven shards, two micro-steps (the reduce-scatter's add in bf16) and
 * clipping. */
Test(multiprocess, three_processes_give_the_bits_of_three_ranks_with_gradients_held_in_bf16) {
    expect_every_strategy_same((Split){ .procs = 3, .local_ranks = 1, .ref_ranks = 3,
                                        .flags = "--dtype=bf16 --reduce-dtype=bf16 --grad-accum=2 --grad-clip=0.01" });
}

/* Hybrid sharding between processes (--shard-ranks): a group within each
 * process (S = L), a group of two processes (S = 2 L), and groups of 3 over
 * processes of 2 (rank 3 of process 1 starts the second group). Every ZeRO stage,
 * clipping at every step, prints DDP's lines and saves its checkpoint, one
 * process of N ranks, byte for byte; and with two micro-steps gives the bits
 * of one process of N ranks sharded the same way. */
Test(multiprocess, hybrid_sharding_over_processes_gives_the_bits_of_ddp) {
    need_mpi();
    static const struct { int procs, local_ranks, shard_ranks; } splits[] = { { 2, 2, 2 }, { 4, 1, 2 }, { 3, 2, 3 } };
    for (size_t i = 0; i < sizeof splits / sizeof splits[0]; i++) {
        int P = splits[i].procs, L = splits[i].local_ranks, S = splits[i].shard_ranks;
        char args[1024], what[256];
        snprintf(args, sizeof args, "%s --batch=3 --iters=4 --grad-clip=0.01 --zero=0 --gpus=%d", BASE, P * L);
        Run ddp = launch(0, args);
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            if (!STRATEGIES[k].shards_adam) continue;
            snprintf(args, sizeof args, "%s --batch=3 --iters=4 --grad-clip=0.01 --zero=%d --gpus=%d --shard-ranks=%d",
                     BASE, STRATEGIES[k].stage, L, S);
            Run got = launch(P, args);
            snprintf(what, sizeof what, "--zero=%d --shard-ranks=%d: %d processes x %d ranks against DDP on 1 x %d",
                     STRATEGIES[k].stage, S, P, L, P * L);
            expect_same_run(&ddp, &got, what);
            run_free(&got);
        }
        run_free(&ddp);
    }
    expect_every_strategy_same((Split){ .procs = 2, .local_ranks = 2, .ref_ranks = 4, .sharded_only = 1,
                                        .flags = "--shard-ranks=2 --grad-accum=2 --grad-clip=0.01 --dropout=0.1" });
}

/* How to start bin/train as two processes on two hosts: two network
 * namespaces joined by a veth pair, Open MPI held to TCP between them
 * (tests/two_hosts.sh); where they cannot be made (no root, no iproute2), a
 * skip, or under ZF_REQUIRE_MPI a failure. */
static void two_hosts(char *cmd, size_t len) {
    need_mpi();
    char probe[1024];
    snprintf(probe, sizeof probe, "tests/two_hosts.sh '%s' true >/dev/null 2>&1", test_mpirun());
    if (system(probe) != 0) {
        const char *why = "tests/two_hosts.sh cannot make two network namespaces and run mpirun across them (it "
                          "needs root and iproute2)";
        if (getenv("ZF_REQUIRE_MPI")) cr_assert_fail("ZF_REQUIRE_MPI is set, and %s", why);
        test_skip("%s; ZF_REQUIRE_MPI=1 makes this a failure", why);
    }
    snprintf(cmd, len, "tests/two_hosts.sh '%s' %s", test_mpirun(), train_binary());
}

/* Two hosts over TCP, as two network namespaces: every strategy, fully
 * sharded, as 2 hosts x 2 ranks gives one process of 4 ranks' lines and
 * checkpoint, byte for byte; and ZeRO-3 in groups of a host's ranks gives
 * DDP's (no clipping). */
Test(multiprocess, two_hosts_over_tcp_give_the_bits_of_one_process, .timeout = 300) {
    char cmd[1024], args[1024], what[256];
    two_hosts(cmd, sizeof cmd);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        snprintf(args, sizeof args, "%s --batch=3 --iters=4 --dropout=0.1 --zero=%d --gpus=4", BASE, zero);
        Run want = launch(0, args);
        snprintf(args, sizeof args, "%s --batch=3 --iters=4 --dropout=0.1 --zero=%d --gpus=2", BASE, zero);
        Run got = launch_with(cmd, args);
        snprintf(what, sizeof what, "--zero=%d: 2 hosts x 2 ranks over TCP against 1 x 4", zero);
        expect_same_run(&want, &got, what);
        run_free(&want);
        run_free(&got);
    }
    snprintf(args, sizeof args, "%s --batch=3 --iters=4 --grad-clip=0 --zero=0 --gpus=4", BASE);
    Run ddp = launch(0, args);
    snprintf(args, sizeof args, "%s --batch=3 --iters=4 --grad-clip=0 --zero=3 --gpus=2 --shard-ranks=2", BASE);
    Run hybrid = launch_with(cmd, args);
    expect_same_run(&ddp, &hybrid, "--zero=3 --shard-ranks=2 on 2 hosts x 2 ranks over TCP against DDP on 1 x 4");
    run_free(&ddp);
    run_free(&hybrid);
}

/* An odd width gives tensors of odd sizes, each on its 128-number boundary
 * in the arena (runtime/arena.h), split among 3 processes: each process's
 * own init gives the bits of one process's (test_model holds a part from an
 * odd element to its Box-Muller pair, which no split of today's arena makes). */
Test(multiprocess, an_odd_width_gives_the_bits_of_one_process) {
    expect_every_strategy_same((Split){ .procs = 3, .local_ranks = 1, .ref_ranks = 3,
                                        .flags = "--embd=15 --heads=3 --bias=1" });
}

/* The comparison can fail: another seed gives other lines and other bytes, and
 * --grad-clip=0.01 clips (without it the checkpoint differs). */
Test(multiprocess, the_comparisons_tell_runs_apart) {
    need_mpi();
    char args[1024];
    snprintf(args, sizeof args, "%s --batch=3 --iters=4 --gpus=4 --grad-clip=0.01", BASE);
    Run want = launch(0, args);
    snprintf(args, sizeof args, "%s --batch=3 --iters=4 --gpus=2 --grad-clip=0.01 --seed=7", BASE);
    Run other_seed = launch(2, args);
    snprintf(args, sizeof args, "%s --batch=3 --iters=4 --gpus=4 --grad-clip=0", BASE);
    Run unclipped = launch(0, args);
    cr_expect(strcmp(want.progress, other_seed.progress) != 0, "seeds 1337 and 7 printed the same lines");
    cr_expect(!same_checkpoint(&want, &other_seed), "seeds 1337 and 7 saved the same checkpoint");
    cr_expect(!same_checkpoint(&want, &unclipped), "--grad-clip=0.01 saved what no clipping saves: it never clipped");
    run_free(&want);
    run_free(&other_seed);
    run_free(&unclipped);
}

/* ---- checkpoints across splits ---- */

/* max |got - want| / max |want| over the tensors of one kind: 0 the weights,
 * 1 Adam's m (optim.exp_avg.*), 2 its v (optim.exp_avg_sq.*). */
static void kind_diffs(const StFile *want, const StFile *got, double diff[3]) {
    double max_diff[3] = { 0 }, scale[3] = { 0 };
    const char *name;
    const json_t *item;
    json_object_foreach((json_t *)want->header, name, item) {
        if (!strcmp(name, "__metadata__")) continue;
        int kind = !strncmp(name, "optim.exp_avg_sq.", 17) ? 2 : !strncmp(name, "optim.exp_avg.", 14);
        const json_t *other = json_object_get((const json_t *)got->header, name);
        const json_t *at = json_object_get(item, "data_offsets"), *other_at = json_object_get(other, "data_offsets");
        cr_assert(json_array_size(other_at) == 2, "%s is missing from the resumed run's file", name);
        size_t lo = (size_t)json_integer_value(json_array_get(at, 0));
        size_t hi = (size_t)json_integer_value(json_array_get(at, 1));
        size_t other_lo = (size_t)json_integer_value(json_array_get(other_at, 0));
        cr_assert_eq((size_t)json_integer_value(json_array_get(other_at, 1)) - other_lo, hi - lo, "%s", name);
        const float *a = (const float *)(want->bytes + want->data_start + lo);
        const float *b = (const float *)(got->bytes + got->data_start + other_lo);
        for (size_t i = 0; i < (hi - lo) / sizeof(float); i++) {
            max_diff[kind] = fmax(max_diff[kind], fabs((double)b[i] - a[i]));
            scale[kind] = fmax(scale[kind], fabs((double)a[i]));
        }
    }
    for (int k = 0; k < 3; k++) diff[k] = max_diff[k] / scale[k];
}

/* The file `got` within `tol` of `want` (weights, m and v, each relative to
 * its largest), at the same step and Adam step. */
static void expect_close_checkpoint(const Run *want, const Run *got, double tol, const char *what) {
    StFile a, b;
    char err[256];
    unsigned char *a_bytes = malloc(want->ckpt_bytes), *b_bytes = malloc(got->ckpt_bytes);
    memcpy(a_bytes, want->ckpt, want->ckpt_bytes);
    memcpy(b_bytes, got->ckpt, got->ckpt_bytes);
    cr_assert_eq(safetensors_parse(&a, a_bytes, want->ckpt_bytes, "want", err, sizeof err), 0, "%s", err);
    cr_assert_eq(safetensors_parse(&b, b_bytes, got->ckpt_bytes, "got", err, sizeof err), 0, "%s", err);
    double diff[3];
    kind_diffs(&a, &b, diff);
    cr_expect(diff[0] < tol && diff[1] < tol && diff[2] < tol, "%s: weights %g, m %g, v %g off", what, diff[0],
              diff[1], diff[2]);
    cr_expect_str_eq(safetensors_metadata(&b, "iter"), safetensors_metadata(&a, "iter"), "%s", what);
    cr_expect_str_eq(safetensors_metadata(&b, "adam_step"), safetensors_metadata(&a, "adam_step"), "%s", what);
    safetensors_close(&a);
    safetensors_close(&b);
}

/* Resume `saved` for 2 more steps, unclipped, as `procs` x `ranks` with
 * `batch` rows per rank. */
static Run resume(const Run *saved, int procs, int ranks, int batch, int zero) {
    char args[1024];
    snprintf(args, sizeof args, "%s --grad-clip=0 --batch=%d --iters=4 --zero=%d --gpus=%d "
             "--resume=%s/ckpt.safetensors", BASE, batch, zero, ranks, saved->dir);
    return launch(procs, args);
}

/* Saved after 2 steps by 2 x 2 and resumed by 1 x 4, and saved by 1 x 4 and
 * resumed by 2 x 2, each under another strategy: the uninterrupted run's file,
 * byte for byte. Resumed by 1 x 1 (the same global batch): within 1e-5, as
 * test_checkpoint holds a change of N (float sums over other ranks). No
 * clipping, under which the strategies agree to 1e-6 only, and no dropout,
 * whose masks are keyed by rank. */
Test(multiprocess, a_checkpoint_moves_between_splits) {
    need_mpi();
    char args[1024], what[128];
    snprintf(args, sizeof args, "%s --grad-clip=0 --batch=3 --iters=4 --gpus=4", BASE);
    Run straight = launch(0, args);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        int other = (zero + 1) % 4;
        snprintf(args, sizeof args, "%s --grad-clip=0 --batch=3 --iters=2 --zero=%d --gpus=2", BASE, zero);
        Run saved = launch(2, args);
        Run in_one = resume(&saved, 0, 4, 3, other), in_one_rank = resume(&saved, 0, 1, 12, other);
        snprintf(what, sizeof what, "saved by --zero=%d 2 x 2, resumed by --zero=%d 1 x 4", zero, other);
        cr_expect(same_checkpoint(&straight, &in_one), "%s: the final checkpoints differ", what);
        snprintf(what, sizeof what, "saved by --zero=%d 2 x 2, resumed by --zero=%d 1 x 1", zero, other);
        expect_close_checkpoint(&straight, &in_one_rank, 1e-5, what);
        snprintf(args, sizeof args, "%s --grad-clip=0 --batch=3 --iters=2 --zero=%d --gpus=4", BASE, zero);
        Run saved_in_one = launch(0, args);
        Run in_two = resume(&saved_in_one, 2, 2, 3, other);
        snprintf(what, sizeof what, "saved by --zero=%d 1 x 4, resumed by --zero=%d 2 x 2", zero, other);
        cr_expect(same_checkpoint(&straight, &in_two), "%s: the final checkpoints differ", what);
        run_free(&saved);
        run_free(&in_one);
        run_free(&in_one_rank);
        run_free(&saved_in_one);
        run_free(&in_two);
    }
    run_free(&straight);
}

/* ---- no process holds the whole model ---- */

/* bin/train `args` as 4 processes of one rank, each under /usr/bin/time: the
 * largest peak resident memory of a process, in MB, and (from its last line)
 * the allocator's peak of rank 0 in *rank_mb. It must succeed. */
static double largest_process_rss(const char *args, double *rank_mb) {
    char dir[64], cmd[1024], out[128], rss_path[128], err[8192];
    temp_dir(dir, sizeof dir, "rss");
    snprintf(rss_path, sizeof rss_path, "%s/rss", dir);
    snprintf(out, sizeof out, "%s/stdout.txt", dir);
    /* -a: the processes append their lines to one file, each in one write */
    snprintf(cmd, sizeof cmd, "%s -np 4 /usr/bin/time -a -o %s -f %%M %s", test_mpirun(), rss_path, train_binary());
    int rc = run_tool(cmd, args, out, err, sizeof err);
    cr_assert_eq(rc, 0, "%s %s: exit %d:\n%s", cmd, args, rc, err);
    char text[4096];
    take_text(out, text, sizeof text);
    const char *peak = strstr(text, "peak memory of ");
    cr_assert_not_null(peak, "no peak memory line in:\n%s", text);
    *rank_mb = strtod(strstr(peak, ": ") + 2, NULL);
    FILE *f = fopen(rss_path, "r");
    cr_assert_not_null(f);
    double largest = 0, kb;
    int n = 0;
    for (; fscanf(f, "%lf", &kb) == 1; n++) largest = fmax(largest, kb / 1e3);
    fclose(f);
    cr_assert_eq(n, 4, "%d lines of /usr/bin/time, and 4 processes", n);
    remove_dir(dir);
    return largest;
}

/* ZeRO-3 over 4 processes: through init, a save, --resume and --init-from,
 * no process's peak passes its rank's own (the allocator's high-water mark,
 * the exchange's staging included), plus what a process of a tiny model
 * holds (libraries, buffers), plus a quarter of the weights. A full host copy
 * of the weights (50 MB here; the rank needs about 130) would pass it, and a
 * copy of the state thrice that. */
Test(multiprocess, no_process_of_zero3_holds_the_whole_model) {
    need_mpi();
#ifdef __SANITIZE_ADDRESS__
    test_skip("resident memory under AddressSanitizer is its shadow and its quarantine of freed memory too");
#endif
    char dir[64], args[1024];
    temp_dir(dir, sizeof dir, "whole");
    static const char RUN[] = "--zero=3 --gpus=1 --block=16 --batch=1 --eval-iters=1 --eval-every=2 --sample-chars=20";
    double tiny_rank, rank_mb;
    snprintf(args, sizeof args, "%s --layers=1 --embd=32 --heads=2 --iters=2", RUN);
    double tiny = largest_process_rss(args, &tiny_rank);
    const char *model = "--layers=4 --embd=512 --heads=8";  /* 12.6M parameters */
    double quarter_weights = 12.6e6 * 4 / 4 / 1e6;
    const char *steps[] = { "--iters=2 --out=%s/a", "--iters=4 --resume=%s/a/ckpt.safetensors --out=%s/a",
                            "--iters=2 --init-from=%s/a/ckpt.safetensors --out=%s/b" };
    const char *names[] = { "init and a save", "--resume and a save", "--init-from and a save" };
    for (int i = 0; i < 3; i++) {
        char step[512];
        snprintf(step, sizeof step, steps[i], dir, dir);
        snprintf(args, sizeof args, "%s %s %s", RUN, model, step);
        double rss = largest_process_rss(args, &rank_mb);
        cr_expect_lt(rss, rank_mb + tiny + quarter_weights, "%s: a process peaked at %.1f MB, its rank needs %.1f, "
                     "a tiny model's process %.1f", names[i], rss, rank_mb, tiny);
    }
    remove_dir(dir);
}

/* ---- faults ---- */

/* The lines of text that hold needle. */
static int count_lines_with(const char *text, const char *needle) {
    int n = 0;
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        n += memmem(line, len, needle, strlen(needle)) != NULL;
        line += len + (end != NULL);
    }
    return n;
}

/* The line of text holding needle (one line, malloc'd), or NULL. */
static char *line_with(const char *text, const char *needle) {
    const char *at = strstr(text, needle);
    if (!at) return NULL;
    const char *start = at, *end = strchr(at, '\n');
    while (start > text && start[-1] != '\n') start--;
    return strndup(start, end ? (size_t)(end - start) : strlen(start));
}

/* mpirun with `launch_args` (-np and bin/train's command line, or MPMD's
 * contexts): its exit status, its stderr in err and the seconds it took. */
static int run_failing(const char *launch_args, char *err, size_t errlen, double *seconds) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s", test_mpirun());
    double start = seconds_now();
    int rc = run_tool(cmd, launch_args, "/dev/null", err, errlen);
    *seconds = seconds_now() - start;
    return rc;
}

/* A rank that stops answering: after --timeout, one line names the collective
 * it never joined and the ranks of its process; every process ends (exit 1),
 * long before the hang's own end (timeout + 60 s); the last checkpoint (the
 * eval of step 2, before the hang) is whole. */
Test(multiprocess, a_hung_rank_is_named_after_the_timeout) {
    need_mpi();
    static const struct { int zero; const char *collective; } cases[] = {
        { .zero = 0, .collective = "'all-reduce bucket" },
        { .zero = 3, .collective = "'all-gather unit" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64], args[2048], err[8192], ckpt[128];
        temp_dir(dir, sizeof dir, "mp_hang");
        snprintf(args, sizeof args, "-np 2 %s %s --batch=3 --iters=6 --zero=%d --gpus=2 --out=%s "
                 "--inject-fault=3:2:hang --timeout=3", train_binary(), BASE, cases[i].zero, dir);
        double seconds;
        int rc = run_failing(args, err, sizeof err, &seconds);
        cr_expect_neq(rc, 0, "--zero=%d: a hung rank exited 0", cases[i].zero);
        cr_expect_lt(seconds, 3 + 10, "--zero=%d: %g s to end after a 3 s timeout", cases[i].zero, seconds);
        cr_expect_eq(count_lines_with(err, "never arrived"), 1, "--zero=%d: stderr:\n%s", cases[i].zero, err);
        char *line = line_with(err, "never arrived");
        cr_assert_not_null(line, "--zero=%d: stderr:\n%s", cases[i].zero, err);
        cr_expect(strstr(line, "ranks 2..3 (process 1)") && strstr(line, cases[i].collective) &&
                  strstr(line, "within 3 s (--timeout)"),
                  "--zero=%d: the line names the collective (%s...), the ranks and the timeout: %s", cases[i].zero,
                  cases[i].collective, line);
        free(line);
        StFile f;
        snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
        cr_assert_eq(safetensors_open(&f, ckpt, err, sizeof err), 0, "--zero=%d: %s", cases[i].zero, err);
        cr_expect_str_eq(safetensors_metadata(&f, "iter"), "2", "--zero=%d", cases[i].zero);
        safetensors_close(&f);
        remove_dir(dir);
    }
}

/* An injected error in rank 3 (process 1): every process ends at once, exit
 * non-zero, the error printed once, naming rank 3. */
Test(multiprocess, an_error_in_a_rank_of_another_process_ends_every_process_once) {
    need_mpi();
    char args[2048], err[8192];
    snprintf(args, sizeof args, "-np 2 %s %s --batch=3 --iters=6 --gpus=2 --inject-fault=3:2:forward", train_binary(),
             BASE);
    double seconds;
    int rc = run_failing(args, err, sizeof err, &seconds);
    cr_expect_neq(rc, 0, "an injected fault exited 0");
    cr_expect_lt(seconds, 20, "%g s to end after an error (the --timeout is 300 s)", seconds);
    cr_expect_eq(count_lines_with(err, "injected fault"), 1, "stderr:\n%s", err);
    char *line = line_with(err, "injected fault");
    cr_assert_not_null(line, "stderr:\n%s", err);
    cr_expect(strstr(line, "rank 3:") && strstr(line, "step 2") && strstr(line, "forward"), "%s", line);
    free(line);
}

/* A tiny run, flag by flag: process 1 gets one of them changed. A --timeout
 * of 30 s bounds a run whose processes do not agree (a regression) that the
 * tests below must see end within 20. */
static const char *const TINY_FLAGS[] = {
    "--layers=1", "--embd=16", "--heads=2", "--block=16", "--batch=2", "--iters=2", "--lr=1e-3", "--seed=1",
    "--eval-iters=1", "--dropout=0", "--grad-clip=1", "--timeout=30", "--sample-chars=0",
};
enum { TINY_COUNT = sizeof TINY_FLAGS / sizeof TINY_FLAGS[0] };

/* The tiny run's flags, the flag at `changed` (if in range) as `instead`. */
static void tiny_flags(char *out, size_t len, int changed, const char *instead) {
    out[0] = 0;
    for (int i = 0; i < TINY_COUNT; i++)
        snprintf(out + strlen(out), len - strlen(out), " %s", i == changed ? instead : TINY_FLAGS[i]);
}

/* mpirun's MPMD form, `launch` ("-np 1 [-wdir D] TRAIN ARGS : ..."): exit
 * `want` within 20 s (the --timeout is 300), and stderr one line of ours
 * holding `needle`. */
static void expect_launch_refused(const char *launch, const char *needle, int want, const char *what) {
    char err[8192];
    double seconds;
    int rc = run_failing(launch, err, sizeof err, &seconds);
    cr_expect_eq(rc, want, "%s: exit %d, stderr:\n%s", what, rc, err);
    cr_expect_lt(seconds, 20, "%s: %.1f s to refuse", what, seconds);
    cr_expect_eq(count_lines_with(err, "train: "), 1, "%s: stderr:\n%s", what, err);
    cr_expect(strstr(err, needle) != NULL, "%s: no '%s' in stderr:\n%s", what, needle, err);
}

/* Process 0 with args0 and process 1 with args1, as expect_launch_refused. */
static void expect_refused(const char *args0, const char *args1, const char *needle, int want, const char *what) {
    char args[8192];
    char *train = realpath(train_binary(), NULL);  /* a process may run in a folder of its own */
    cr_assert_not_null(train, "%s", train_binary());
    snprintf(args, sizeof args, "-np 1 %s %s : -np 1 %s %s", train, args0, train, args1);
    expect_launch_refused(args, needle, want, what);
    free(train);
}

/* Processes started with other flags (any one of them, wherever it stands),
 * or with the same flags on other data (a byte changed at the start, the
 * middle or the end): one line naming process 1 and what differs, exit 2. */
Test(multiprocess, processes_that_disagree_refuse_to_start) {
    need_mpi();
    char same[1024], other[1024], needle[128];
    tiny_flags(same, sizeof same, -1, NULL);
    static const struct { int at; const char *instead, *flag; } changes[] = {
        { 0, "--layers=2", "layers" }, { 6, "--lr=2e-3", "lr" }, { 7, "--seed=2", "seed" },
        { TINY_COUNT - 1, "--sample-chars=5", "sample-chars" },
    };
    for (size_t i = 0; i < sizeof changes / sizeof changes[0]; i++) {
        tiny_flags(other, sizeof other, changes[i].at, changes[i].instead);
        snprintf(needle, sizeof needle, "rank 1 (process 1) was started with another --%s than process 0",
                 changes[i].flag);
        expect_refused(same, other, needle, 2, changes[i].instead);
    }
    char dirs[2][64], file[160], cmd[256], args[1200];
    static const long positions[] = { 0, 5000, 9999 };
    for (size_t k = 0; k < sizeof positions / sizeof positions[0]; k++) {
        for (int d = 0; d < 2; d++) {
            temp_dir(dirs[d], sizeof dirs[d], "mp_data");
            snprintf(file, sizeof file, "%s/d.txt", dirs[d]);
            snprintf(cmd, sizeof cmd, "head -c 10000 data/tinyshakespeare.txt > %s", file);
            cr_assert_eq(system(cmd), 0);
        }
        /* process 1's copy: one byte swapped for another letter of the text */
        snprintf(file, sizeof file, "%s/d.txt", dirs[1]);
        FILE *f = fopen(file, "r+b");
        cr_assert_not_null(f);
        cr_assert_eq(fseek(f, positions[k], SEEK_SET), 0);
        int c = fgetc(f);
        cr_assert_eq(fseek(f, positions[k], SEEK_SET), 0);
        fputc(c == 'e' ? 't' : 'e', f);
        cr_assert_eq(fclose(f), 0);
        snprintf(args, sizeof args, "%s --data=d.txt", same);
        char *train = realpath(train_binary(), NULL), launch[4096], what[64];
        snprintf(launch, sizeof launch, "-np 1 -wdir %s %s %s : -np 1 -wdir %s %s %s", dirs[0], train, args, dirs[1],
                 train, args);
        snprintf(what, sizeof what, "data with byte %ld changed", positions[k]);
        expect_launch_refused(launch, "rank 1 (process 1) was started with another data file", 2, what);
        free(train);
        for (int d = 0; d < 2; d++) remove_dir(dirs[d]);
    }
}

/* A flag that no run can use, given to process 1 alone: every process stops
 * within seconds, exit 2, with one line naming process 1 and the flag (not a
 * silent process 1 and the others waiting out their --timeout). */
Test(multiprocess, a_bad_flag_on_one_process_ends_every_process_at_once) {
    need_mpi();
    char same[1024], bad[1200];
    tiny_flags(same, sizeof same, -1, NULL);
    static const struct { const char *flag, *needle; } cases[] = {
        { "--bogus=1", "train: process 1: unknown flag '--bogus'" },
        { "--lr=abc", "train: process 1: --lr expects a decimal number, got 'abc'" },
        { "--help", "train: process 1: it was started with --help, and the others were not" },
        { "--out=", "train: process 1: --out has an empty value" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(bad, sizeof bad, "%s %s", same, cases[i].flag);
        expect_refused(same, bad, cases[i].needle, 2, cases[i].flag);
    }
    /* the same bad flag everywhere: said once, as one process says it */
    snprintf(bad, sizeof bad, "%s --lr=abc", same);
    expect_refused(bad, bad, "train: --lr expects a decimal number, got 'abc'", 2, "--lr=abc everywhere");
}

/* What every process meets (data that cannot be read, a checkpoint that cannot
 * be loaded) is said once, by process 0, and every process exits 1. */
Test(multiprocess, an_error_every_process_meets_is_said_once) {
    need_mpi();
    char same[1024], args[1200];
    tiny_flags(same, sizeof same, -1, NULL);
    snprintf(args, sizeof args, "%s --data=/nonexistent/d.txt", same);
    expect_refused(args, args, "train: cannot open data file '/nonexistent/d.txt'", 1, "missing data");
    snprintf(args, sizeof args, "%s --resume=/nonexistent/c.safetensors", same);
    expect_refused(args, args, "train: cannot open checkpoint '/nonexistent/c.safetensors'", 1, "missing checkpoint");
}

/* The bin/train children of mpirun (pid `parent`), process p's at pids[p];
 * how many were found. */
static int train_children(pid_t parent, pid_t *pids, int max) {
    int found = 0;
    char cmd[128], line[256];
    snprintf(cmd, sizeof cmd, "ps -o pid= --ppid %d", (int)parent);
    FILE *ps = popen(cmd, "r");
    while (ps && fgets(line, sizeof line, ps)) {
        char path[64], env[65536];
        pid_t pid = (pid_t)atoi(line);
        snprintf(path, sizeof path, "/proc/%d/environ", (int)pid);
        FILE *f = fopen(path, "rb");
        size_t n = f ? fread(env, 1, sizeof env - 1, f) : 0;
        if (f) fclose(f);
        env[n] = 0;
        for (size_t at = 0; at < n; at += strlen(env + at) + 1) {
            int p;
            if (sscanf(env + at, "OMPI_COMM_WORLD_RANK=%d", &p) == 1 && p >= 0 && p < max) {
                pids[p] = pid;
                found++;
            }
        }
    }
    if (ps) pclose(ps);
    return found;
}

/* A process that is gone, or a zombie no one has reaped yet. */
static int process_ended(pid_t pid) {
    char path[64], stat[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = 0;
    const char *state = strrchr(stat, ')');
    return state && state[1] == ' ' && (state[2] == 'Z' || state[2] == 'X');
}

/* Wait, at most `limit` seconds, for process 0 to print step 1 (or 10, 100,
 * ... with --log-every) into the file `out` (training is under way); 1 if it did. */
static int wait_for_steps(const char *out, double limit) {
    for (double until = seconds_now() + limit; seconds_now() < until; usleep(50000)) {
        FILE *f = fopen(out, "r");
        char line[1024];
        int stepping = 0;
        while (f && !stepping && fgets(line, sizeof line, f)) stepping = !strncmp(line, "iter 1", 6);
        if (f) fclose(f);
        if (stepping) return 1;
    }
    return 0;
}

/* `cmd` run by the shell in a process group of its own (its pid, the group's
 * id), for a test to kill whole at its end, whatever happened. */
static pid_t start_in_own_group(const char *cmd) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

/* Process 1 killed with SIGKILL while the run trains: mpirun and process 0 end,
 * non-zero, within the --timeout (5 s) plus 10 s. mpirun runs in a process
 * group of its own, killed whole at the end whatever happened, and nothing
 * asserts before that: a failed check must not leave a training run behind. */
Test(multiprocess, a_killed_process_ends_the_others_within_the_timeout) {
    need_mpi();
    char dir[64], out[128], args[4096];
    temp_dir(dir, sizeof dir, "mp_kill");
    snprintf(out, sizeof out, "%s/stdout.txt", dir);
    snprintf(args, sizeof args, "exec %s -np 2 %s --layers=2 --embd=64 --heads=2 --block=64 --batch=4 --iters=20000 "
             "--eval-every=0 --log-every=1 --sample-chars=0 --gpus=2 --timeout=5 >%s 2>%s/stderr.txt",
             test_mpirun(), train_binary(), out, dir);
    pid_t mpirun = start_in_own_group(args);
    pid_t pids[2] = { 0, 0 };
    int stepping = wait_for_steps(out, 60), found = stepping ? train_children(mpirun, pids, 2) : 0;
    int killed = found == 2 && kill(pids[1], SIGKILL) == 0, status = 0;
    double start = seconds_now();
    pid_t done = 0;
    while (killed && (done = waitpid(mpirun, &status, WNOHANG)) == 0 && seconds_now() - start < 5 + 10) usleep(50000);
    double seconds = seconds_now() - start;
    for (double grace = seconds_now() + 2; done && !process_ended(pids[0]) && seconds_now() < grace;) usleep(50000);
    int others_ended = done && process_ended(pids[0]);
    kill(-mpirun, SIGKILL);
    if (done == 0) waitpid(mpirun, &status, 0);
    remove_dir(dir);
    cr_assert(stepping && found == 2 && killed, "no two training processes under mpirun to kill (stepping %d, %d found)",
              stepping, found);
    cr_expect_neq(done, 0, "mpirun still ran %g s after process 1 was killed", seconds);
    cr_expect(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "mpirun exited 0 after a process was killed");
    cr_expect(others_ended, "process 0 (pid %d) still ran after mpirun ended", (int)pids[0]);
}

/* A training run under mpirun (2 processes of 1 rank, saving to a fresh
 * folder) that steps, then gets `sig`: at process `target`, or at mpirun
 * itself (target -1). Its folder, its stderr, and mpirun's exit status (-1 if
 * it had to be killed 30 s after the signal). */
typedef struct { char dir[64]; char err[8192]; int status; } Stopped;

static Stopped signal_a_run(int target, int sig, const char *mpirun_flags) {
    Stopped run = { .status = -1 };
    char out[128], err_path[128], args[4096];
    temp_dir(run.dir, sizeof run.dir, "mp_signal");
    snprintf(out, sizeof out, "%s/stdout.txt", run.dir);
    snprintf(err_path, sizeof err_path, "%s/stderr.txt", run.dir);
    /* a progress line every 100 steps, as a run prints a few a second: mpirun stops reading the processes' output
       once signalled, and a process that fills the pipe waits in its write until SIGKILL */
    snprintf(args, sizeof args, "exec %s %s -np 2 %s %s --batch=3 --iters=100000 --eval-every=0 --log-every=100 "
             "--gpus=1 --out=%s >%s 2>%s", test_mpirun(), mpirun_flags, train_binary(), BASE, run.dir, out, err_path);
    pid_t mpirun = start_in_own_group(args);
    pid_t pids[2] = { 0, 0 };
    int stepping = wait_for_steps(out, 60), found = stepping ? train_children(mpirun, pids, 2) : 0;
    int sent = found == 2 && kill(target < 0 ? mpirun : pids[target], sig) == 0, status = 0;
    double start = seconds_now();
    pid_t done = 0;
    while (sent && (done = waitpid(mpirun, &status, WNOHANG)) == 0 && seconds_now() - start < 30) usleep(50000);
    kill(-mpirun, SIGKILL);
    if (done == 0) waitpid(mpirun, &status, 0);
    take_text(err_path, run.err, sizeof run.err);
    cr_assert(stepping && found == 2 && sent, "no two training processes to signal");
    if (done != 0 && WIFEXITED(status)) run.status = WEXITSTATUS(status);
    return run;
}

/* The stop line's step count ("after N steps"), or -1. */
static int steps_in(const char *err) {
    const char *at = strstr(err, " after ");
    int steps = -1;
    return at && sscanf(at, " after %d steps", &steps) == 1 ? steps : -1;
}

/* The run's checkpoint, resumed by 2 x 1 for 2 steps more, is the file of
 * 1 x 2 never stopped: every process stopped at the same step, and process 0
 * saved that step's state. */
static void expect_resumes_as_never_stopped(const Stopped *run, const char *what) {
    int steps = steps_in(run->err);
    cr_assert_gt(steps, 0, "%s: stderr:\n%s", what, run->err);
    char args[2048];
    snprintf(args, sizeof args, "%s --batch=3 --iters=%d --eval-every=0 --gpus=1 --resume=%s/ckpt.safetensors", BASE,
             steps + 2, run->dir);
    Run resumed = launch(2, args);
    snprintf(args, sizeof args, "%s --batch=3 --iters=%d --eval-every=0 --gpus=2", BASE, steps + 2);
    Run straight = launch(0, args);
    cr_expect(same_checkpoint(&straight, &resumed), "%s: stopped at %d and resumed, the file differs from a run never "
              "stopped", what, steps);
    run_free(&resumed);
    run_free(&straight);
}

/* SIGTERM and SIGINT sent to each process in turn: every process stops at the
 * same step and process 0 saves it; the line names the signal and the process
 * it reached, mpirun exits 128 + the signal, and the checkpoint resumes. */
Test(multiprocess, a_signal_to_any_process_stops_every_process_at_the_same_step, .timeout = 300) {
    need_mpi();
    static const struct { int sig; const char *name; } signals[] = { { SIGTERM, "SIGTERM" }, { SIGINT, "SIGINT" } };
    for (int target = 0; target < 2; target++)
        for (size_t k = 0; k < sizeof signals / sizeof signals[0]; k++) {
            char what[64], needle[96];
            snprintf(what, sizeof what, "%s to process %d", signals[k].name, target);
            Stopped run = signal_a_run(target, signals[k].sig, "");
            cr_expect_eq(run.status, 128 + signals[k].sig, "%s: mpirun's exit status, stderr:\n%s", what, run.err);
            snprintf(needle, sizeof needle, "train: stopped by %s (to process %d) after ", signals[k].name, target);
            cr_expect_eq(count_lines_with(run.err, "train: "), 1, "%s: stderr:\n%s", what, run.err);
            cr_expect(strstr(run.err, needle) && strstr(run.err, "saved in"), "%s: stderr:\n%s", what, run.err);
            expect_resumes_as_never_stopped(&run, what);
            remove_dir(run.dir);
        }
}

/* mpirun itself signalled. SIGUSR1, which it passes on to every process: the
 * run stops and saves as for any stop signal, and mpirun exits 138. SIGINT (a
 * Ctrl-C at mpirun's terminal), which mpirun turns into SIGTERM for every
 * process, with SIGKILL after its odls_base_sigkill_timeout (1 s; 10 here, so
 * that a loaded machine cannot make the test fail): the line says SIGTERM and
 * the checkpoint resumes; mpirun's own exit status there is Open MPI's (1). */
Test(multiprocess, a_signal_to_mpirun_stops_and_saves_within_its_grace, .timeout = 300) {
    need_mpi();
    Stopped run = signal_a_run(-1, SIGUSR1, "");
    cr_expect_eq(run.status, 128 + SIGUSR1, "SIGUSR1 to mpirun: its exit status, stderr:\n%s", run.err);
    /* every process gets it, the first to catch it is named */
    cr_expect(strstr(run.err, "train: stopped by SIGUSR1 (to process ") && strstr(run.err, "saved in"),
              "SIGUSR1 to mpirun: stderr:\n%s", run.err);
    expect_resumes_as_never_stopped(&run, "SIGUSR1 to mpirun");
    remove_dir(run.dir);
    run = signal_a_run(-1, SIGINT, "--mca odls_base_sigkill_timeout 10");
    cr_expect_neq(run.status, 0, "SIGINT to mpirun: exit 0");
    cr_expect(strstr(run.err, "train: stopped by SIGTERM (to process ") && strstr(run.err, "saved in"),
              "SIGINT to mpirun: stderr:\n%s", run.err);
    expect_resumes_as_never_stopped(&run, "SIGINT to mpirun");
    remove_dir(run.dir);
}

/* ---- the process group over processes ---- */

/* tests/mpi_collectives beside this test binary, under `procs` processes: exit 0. */
static void expect_collectives_pass(int procs) {
    char self[4096], cmd[8192], out[128], err[8192];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    cr_assert_gt(n, 0);
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "%s -np %d %s/mpi_collectives", test_mpirun(), procs, dirname(self));
    snprintf(out, sizeof out, "/tmp/zf_mpi_collectives_%d.txt", (int)getpid());
    int rc = run_tool(cmd, "", out, err, sizeof err);
    size_t len;
    char *text = (char *)read_all(out, &len);
    unlink(out);
    cr_expect_eq(rc, 0, "%s: exit %d\n%s%s", cmd, rc, text, err);
    cr_expect(strstr(text, "ok: every collective") != NULL, "%s:\n%s", cmd, text);
    free(text);
}

Test(multiprocess, the_collectives_are_ordered_sums_over_two_processes) {
    need_mpi();
    expect_collectives_pass(2);
}

Test(multiprocess, the_collectives_are_ordered_sums_over_three_processes) {
    need_mpi();
    expect_collectives_pass(3);
}
