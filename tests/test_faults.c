/* test_faults.c: a failing rank, a device missing, injected faults and stop signals: one line, the
 * whole run ended, the checkpoint intact. */
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

TestSuite(faults, .init = setup, .fini = teardown);

/* A CUDA that is there but fails (an old driver, a fabric manager that is not
 * running) stops the run with one line naming CUDA's error, instead of reading
 * as "no GPU" and training on the CPU; --device=cpu never asks CUDA. The CUDA
 * toolkit's stub driver, which fails every call, stands in for a broken one. */
Test(faults, a_failing_cuda_stops_the_run_with_one_line) {
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

Test(faults, device_cuda_without_a_gpu_is_exit_2_from_every_tool, .timeout = 60) {
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
Test(faults, an_injected_fault_ends_the_run_with_one_line_and_the_checkpoint_intact, .timeout = 300) {
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
    StrategyConfig sc = small_gpt(data.vocab, (GptShape){ 2, 32, 32, 3 }, 1, 8, 0.1f);
    sc.nranks = nranks;
    sc.batch = 2;
    sc.diagnostics.fault = fault;
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
Test(faults, a_run_stopped_by_a_fault_resumes_to_the_same_bits, .timeout = 300) {
    char dir[64], ckpt[128];
    temp_dir(dir, sizeof dir, "fault");
    snprintf(ckpt, sizeof ckpt, "%s/%s", dir, CHECKPOINT_FILE_NAME);
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        int zero = STRATEGIES[k].stage;
        for (int nranks = 1; nranks <= 3; nranks += 2) {
            float *whole = NULL;
            ArenaLayout layout;
            StrategyConfig sc = small_gpt(data.vocab, (GptShape){ 2, 32, 32, 3 }, 1, 8, 0.1f);
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

/* A process that kills the child with SIGKILL after `seconds`: a run that
 * does not stop when it should is ended, and fails its test, rather than
 * running on after it. */
static pid_t start_watchdog(const Child *c, int seconds) {
    pid_t watchdog = fork();
    cr_assert_geq(watchdog, 0);
    if (watchdog == 0) {
        sleep((unsigned)seconds);
        kill(c->pid, SIGKILL);
        _exit(0);
    }
    return watchdog;
}

static void stop_watchdog(pid_t watchdog) {
    kill(watchdog, SIGKILL);
    waitpid(watchdog, NULL, 0);
}

/* A stopped run's checkpoint holds the steps its line (err) names, after
 * "after ", and resumes for two more (bin/train with TINY and `more`). */
static void expect_resumable(const char *err, const char *dir, const char *ckpt, const char *more) {
    const char *after = strstr(err, "after ");
    int done = -1;
    cr_assert(after && sscanf(after + 6, "%d", &done) == 1, "%s", err);
    cr_expect_gt(done, 0);
    cr_expect_eq(adam_steps_of(ckpt), done);
    char args[1024], resumed[4096];
    snprintf(args, sizeof args, "%s --iters=%d %s --out=%s --resume=%s", TINY, done + 2, more, dir, ckpt);
    cr_expect_eq(run_train(args, resumed, sizeof resumed), 0, "resuming: %s", resumed);
    cr_expect_eq(adam_steps_of(ckpt), done + 2);
}

/* Every stop signal: SIGINT, SIGTERM, SIGHUP (a terminal closed), SIGUSR1
 * and SIGUSR2 (a batch system's warning). */
Test(faults, a_signal_finishes_the_step_saves_and_exits_128_plus_it, .timeout = 300) {
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
        expect_resumable(err, dir, ckpt, "--zero=1 --gpus=2");
        remove_dir(dir);
    }
}

/* A signal in the middle of a long evaluation (at step 3 of a run resumed at
 * 2), or of the end's long sample, stops the run within seconds (between two
 * evaluation batches, or two calls of the sample), saved at the step the
 * evaluation was for, or with every step done. */
Test(faults, a_signal_in_an_evaluation_or_the_sample_stops_the_run_at_once, .timeout = 300) {
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
        pid_t watchdog = start_watchdog(&c, 20);  /* a run that does not stop fails below */
        int rc = finish_child(&c, err, sizeof err);
        double seconds = wall_seconds() - t0;
        stop_watchdog(watchdog);
        expect_one_line(rc, 128 + cases[i].sig, err, cases[i].needle, cases[i].what);
        cr_expect_lt(seconds, 5.0, "%s: %.1f s from the signal to the end", cases[i].what, seconds);
        cr_expect_eq(adam_steps_of(ckpt), cases[i].steps, "%s", cases[i].what);
        remove_dir(dir);
    }
}

/* A long evaluation (an 87M model's 20 batches on two cores take minutes)
 * says how far it is every PROGRESS_SECONDS, so that it does not pass for a
 * hang; a short one says nothing more than its losses. */
Test(faults, a_long_evaluation_shows_its_progress, .timeout = 120) {
    char dir[64], ckpt[128], args[1024], err[4096];
    train_checkpoint(dir, sizeof dir, ckpt, sizeof ckpt, 2);
    snprintf(args, sizeof args, "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --iters=100 --eval-every=3 "
             "--eval-iters=1000000 --log-every=1 --out=%s --resume=%s", dir, ckpt);
    Child c = start_train(args);
    pid_t watchdog = start_watchdog(&c, 60);  /* a run that never says it fails below */
    cr_expect(wait_for_line(&c, "eval iter 3: train split, batch "), "no progress line in a long evaluation");
    kill(c.pid, SIGTERM);
    int rc = finish_child(&c, err, sizeof err);
    stop_watchdog(watchdog);
    expect_one_line(rc, 143, err, "train: stopped by SIGTERM after 3 steps", "a long evaluation");
    remove_dir(dir);
}

/* A sample says how many it draws, in what it counts (a text file's
 * characters here), before the first of them: a GPT-2's take minutes on a
 * CPU, and its text comes SAMPLE_CALL at a time. */
Test(faults, a_sample_says_what_it_draws_before_it_starts, .timeout = 60) {
    char args[512], out[64], err[4096], printed[16384];
    snprintf(out, sizeof out, "/tmp/zf_sample_out_%d", (int)getpid());
    snprintf(args, sizeof args, "--layers=2 --embd=16 --heads=2 --block=16 --batch=2 --iters=1 --eval-iters=1 "
             "--sample-chars=100");
    cr_assert_eq(run_tool(train_binary(), args, out, err, sizeof err), 0, "%s", err);
    take_text(out, printed, sizeof printed);
    cr_expect(strstr(printed, "\nsample: 100 characters (each one pass of the model; they appear 64 at a time):\n"),
              "%s", printed);
}

/* A signal while the run starts (reading a 200 MB data file) is taken as any
 * other: no step done, nothing saved, exit 143; not the default death. */
Test(faults, a_signal_in_the_start_stops_the_run_before_any_step, .timeout = 120) {
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
Test(faults, a_closed_pipe_is_a_failed_write_in_one_line, .timeout = 60) {
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

/* A reader gone with --out (`bin/train --out=run | head -1`) stops the run as
 * a signal does: the step in flight finished and saved, then one line on
 * stderr naming the failed write and the checkpoint, exit 1. */
Test(faults, a_closed_pipe_saves_the_steps_done_and_exits_1, .timeout = 120) {
    char dir[64], ckpt[128], cmd[1024], full[1200], err_path[64], err[4096];
    temp_dir(dir, sizeof dir, "pipe");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    snprintf(err_path, sizeof err_path, "/tmp/zf_pipe_err_%d", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s %s --iters=100000 --log-every=1 --eval-iters=0 --out=%s 2>%s | head -1 >/dev/null; "
             "exit ${PIPESTATUS[0]}", train_binary(), TINY, dir, err_path);
    snprintf(full, sizeof full, "bash -c '%s'", cmd);
    int status = system(full);
    take_text(err_path, err, sizeof err);
    expect_one_line(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 1, err,
                    "error: cannot write the progress output: Broken pipe; stopped after ", "a closed pipe with --out");
    cr_expect(strstr(err, "saved in") != NULL, "%s", err);
    expect_resumable(err, dir, ckpt, "");
    remove_dir(dir);
}

/* A full disk under --log (ENOSPC on its first line, after step 0: no
 * evaluation at iter 0) stops the run the same way: step 0 saved, one line,
 * exit 1. Stdout on a full disk fails at the header, before any step
 * (test_files.c). */
Test(faults, a_full_disk_under_the_log_saves_the_steps_done_and_exits_1, .timeout = 60) {
    char dir[64], ckpt[128], args[512], err[4096];
    temp_dir(dir, sizeof dir, "full");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    snprintf(args, sizeof args, "%s --iters=50 --eval-iters=0 --log-every=1 --log=/dev/full --out=%s", TINY, dir);
    expect_one_line(run_train(args, err, sizeof err), 1, err,
                    "error: cannot write the --log file: No space left on device; stopped after 1 steps, saved in",
                    "--log=/dev/full with --out");
    expect_resumable(err, dir, ckpt, "");
    remove_dir(dir);
}

/* A signal while an evaluation's save is written (ZF_INJECT_SIGNAL raises it
 * there, runtime/inject.h) stops the run right after that save: no further
 * step, and no second save of the same state. */
Test(faults, a_signal_in_an_evaluations_save_stops_the_run_after_it, .timeout = 60) {
    char dir[64], ckpt[128], args[512], out[128], err[4096];
    temp_dir(dir, sizeof dir, "evalsave");
    snprintf(ckpt, sizeof ckpt, "%s/ckpt.safetensors", dir);
    snprintf(out, sizeof out, "/tmp/zf_evalsave_out_%d", (int)getpid());
    snprintf(args, sizeof args, "%s --iters=20 --eval-every=4 --log-every=1 --out=%s", TINY, dir);
    cr_assert_eq(setenv("ZF_INJECT_SIGNAL", "15:4", 1), 0);  /* SIGTERM in the save at iter 4 */
    int rc = run_tool(train_binary(), args, out, err, sizeof err);
    unsetenv("ZF_INJECT_SIGNAL");
    expect_one_line(rc, 143, err, "train: stopped by SIGTERM after 4 steps, saved in", "a signal in the save");
    char printed[16384];
    take_text(out, printed, sizeof printed);
    const char *saved = strstr(printed, "saved ");
    cr_expect(saved && strstr(saved, "(iter 4)\n") && !strstr(saved + 1, "saved "),
              "one save, at iter 4; stdout was: %s", printed);
    cr_expect(!strstr(printed, "iter 4: loss"), "a step ran after the save; stdout was: %s", printed);
    cr_expect_eq(adam_steps_of(ckpt), 4);
    remove_dir(dir);
}

/* A step of several seconds (ZeRO-3 on 2 ranks over a link of 0.5 s a hop): the
 * first SIGINT waits for it, a second one exits at once, the checkpoint of the
 * run before as it was. */
Test(faults, a_second_signal_exits_at_once_with_the_checkpoint_intact, .timeout = 300) {
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
