/* train.c: bin/train, the trainer's command line. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../kernels/cpu/blas_setup.h"
#include "../model/gpt.h"
#include "../runtime/host.h"
#include "../runtime/world.h"
#include "../strategies/checkpoint.h"
#include "../strategies/trainer.h"
#include "options.h"

/* Room for a few steps of 64 ranks of the char preset; past it spans are counted, not kept. */
enum { TRACE_MAX_SPANS = 1 << 18 };

/* Write the trace of the run's first `steps` steps; 0, or 1 after a one-line error. */
static int write_trace(Trace *trace, const TrainOptions *o, int steps) {
    char err[768];
    if (trace_write(trace, o->trace, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    printf("trace: %zu spans of %d steps in %s", trace_spans(trace), steps, o->trace);
    if (trace_dropped(trace)) printf(" (%zu more dropped past %d)", trace_dropped(trace), TRACE_MAX_SPANS);
    printf("\n");
    return 0;
}

/* --resume or --init-from into s; the run's first step. 0, or 1 (or 2 for a
 * mismatch with the flags) after a one-line error. */
static int start_from(Strategy *s, const TrainOptions *o, const Dataset *data, int *start_iter) {
    const char *path = o->resume[0] ? o->resume : o->init_from;
    *start_iter = 0;
    if (!path[0]) return 0;
    CheckpointInfo info;
    char err[768];
    if (checkpoint_load(s, path, o->resume[0] != 0, &info, err, sizeof err) != 0) {
        fprintf(stderr, "train: %s\n", err);
        return 1;
    }
    if (info.foreign)
        printf("init-from: %s holds no zerofiber metadata: its weights taken by nanoGPT's names, in this run's "
               "shapes, the vocabulary %s's\n", path, o->data);
    else if (memcmp(info.itos, data->itos, (size_t)data->vocab) != 0) {
        fprintf(stderr, "train: '%s' was trained on another vocabulary than %s's\n", path, o->data);
        return 2;
    }
    if (!o->resume[0]) return 0;
    if (info.seed != (uint32_t)o->seed) {
        fprintf(stderr, "train: '%s' was trained with --seed=%u; resume it with the same seed\n", path, info.seed);
        return 2;
    }
    if (info.iter >= o->iters) {
        fprintf(stderr, "train: '%s' has done %d steps already; ask for more with --iters\n", path, info.iter);
        return 2;
    }
    *start_iter = info.iter;
    printf("resumed: %s, %d steps done\n", path, info.iter);
    return 0;
}

/* The --out folder: made if missing, proved writable with a probe file (removed)
 * before any training time is spent, and cleared of the temporary files that
 * cut-short saves left. 0, or 1 after a one-line error. */
static int prepare_out(const char *dir) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "train: cannot make the --out folder '%s': %s\n", dir, strerror(errno));
        return 1;
    }
    if (!host_is_directory(dir)) {
        fprintf(stderr, "train: --out '%s' is a file, not a folder\n", dir);
        return 1;
    }
    char probe[OPTION_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/.zf-probe.%d", dir, (int)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    int ok = fd >= 0 && write(fd, "probe", 5) == 5;
    int saved_errno = errno;
    if (fd >= 0 && close(fd) != 0) ok = 0;
    if (fd >= 0) unlink(probe);
    if (!ok) {
        fprintf(stderr, "train: cannot write in the --out folder '%s': %s\n", dir, strerror(saved_errno));
        return 1;
    }
    int stale = safetensors_remove_stale_temps(dir, CHECKPOINT_FILE_NAME);
    if (stale > 0) printf("out: removed %d temporary file(s) that cut-short saves left in %s\n", stale, dir);
    return 0;
}

/* The modeled link's seconds for one step's collectives, unit by unit: a
 * reduce-scatter and an all-gather (an all-reduce's worth) under DDP, ZeRO-1
 * and ZeRO-2, two all-gathers and a reduce-scatter under ZeRO-3. */
static double link_step_seconds(const StrategyConfig *sc, int zero) {
    ArenaLayout layout;
    model_layout(&sc->model, 1, &layout);
    double seconds = 0.0;
    for (int u = 0; u < layout.nunits; u++) {
        size_t n = layout.units[u].size;
        seconds += zero == 3 ? 3.0 * ring_seconds(sc->link_gbps, sc->link_latency_us, sc->nranks, 0, n)
                             : ring_seconds(sc->link_gbps, sc->link_latency_us, sc->nranks, 1, n);
    }
    return seconds;
}

/* A link this slow would make a run last days for nothing: a mistyped unit. */
enum { LINK_STEP_MAX_SECONDS = 60 };

/* The first SIGINT or SIGTERM: its number, for the trainer to stop after the
 * step in flight and save. */
static volatile sig_atomic_t stop_signal;

/* A second one exits at once: a save it cuts short leaves only its temporary
 * file (removed at the next start), never a half-written checkpoint. */
static void on_stop_signal(int sig) {
    if (stop_signal) {
        static const char line[] = "train: a second signal: stopping at once (the last checkpoint is as it was)\n";
        ssize_t written = write(STDERR_FILENO, line, sizeof line - 1);
        (void)written;  /* nothing more to do about a failed write in a handler */
        _exit(128 + sig);
    }
    stop_signal = sig;
}

/* Handle SIGINT and SIGTERM on this (the main) thread; the runtime's threads
 * block them (runtime/host.h). 0, or 1 after a one-line error. */
static int catch_stop_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;  /* a write or read under way goes on */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    int rc = sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ? errno : 0;
    /* a parent may have left them blocked, which exec keeps */
    if (rc == 0) rc = pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
    if (rc == 0) return 0;
    fprintf(stderr, "train: cannot handle SIGINT and SIGTERM: %s\n", strerror(rc));
    return 1;
}

/* The one line of a run a signal stopped; its exit status, 128 + the signal. */
static int report_stop(const TrainResult *result, const TrainOptions *o, int start_iter) {
    if (world()->proc != 0) return 128 + result->stopped_by;  /* process 0 says it for every process */
    const char *name = result->stopped_by == SIGINT ? "SIGINT" : "SIGTERM";
    if (!o->out[0])
        fprintf(stderr, "train: stopped by %s after %d steps; nothing saved (no --out)\n", name, result->iters_done);
    else if (result->iters_done == start_iter)
        fprintf(stderr, "train: stopped by %s before any step; nothing to save\n", name);
    else
        fprintf(stderr, "train: stopped by %s after %d steps, saved in %s/%s (--resume it to go on)\n", name,
                result->iters_done, o->out, CHECKPOINT_FILE_NAME);
    return 128 + result->stopped_by;
}

/* FNV-1a, 64 bits: enough to tell two command lines or data files apart. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t bytes) {
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* Every process must run the same flags on the same data: each hashes its
 * command line and its data file's tokens, and they compare. 0, or 2 (every
 * process) after process 0 names, in one line, the first process that differs. */
static int same_run_everywhere(int argc, char **argv, const Dataset *data) {
    const World *w = world();
    if (w->nprocs == 1) return 0;
    uint64_t mine[2] = { 0xcbf29ce484222325ull, 0xcbf29ce484222325ull };
    for (int i = 1; i < argc; i++) {  /* --node-rank is each process's own */
        if (strcmp(argv[i], "--node-rank") == 0) i++;
        else if (strncmp(argv[i], "--node-rank=", 12) != 0) mine[0] = fnv1a(mine[0], argv[i], strlen(argv[i]) + 1);
    }
    mine[1] = fnv1a(mine[1], data->tokens, data->ntokens * sizeof(int));
    uint64_t *all = host_calloc((size_t)w->nprocs * 2, sizeof(uint64_t));
    world_all_gather(mine, all, sizeof mine, "the flags' hashes");
    int status = 0;
    for (int p = 1; p < w->nprocs && status == 0; p++) {
        if (all[2 * p] == all[0] && all[2 * p + 1] == all[1]) continue;
        char who[64];
        world_name_process(p, who, sizeof who);
        if (w->proc == 0)
            fprintf(stderr, "train: %s was started with %s than process 0; every process must run the same\n", who,
                    all[2 * p] != all[0] ? "other flags" : "another data file (--data)");
        status = 2;
    }
    free(all);
    return status;
}

/* The end of main in every process: a failure every process met (bad flags,
 * a run they refused together) leaves the world as a success does; one of
 * this process alone ends the others now, rather than after their timeout. */
static int finish(int status, int every_process) {
    if (status != 0 && !every_process && world()->nprocs > 1) world_abort(status);
    world_finalize();
    return status;
}

/* Parse the flags; past one process only process 0 says what is wrong with
 * them (every process has the same): 0 to run, or the exit status. */
static int parse_flags(TrainOptions *o, int argc, char **argv) {
    int saved = -1, quiet = world()->proc != 0;
    if (quiet) {
        fflush(stderr);
        saved = dup(STDERR_FILENO);
        int null = open("/dev/null", O_WRONLY);
        if (saved < 0 || null < 0 || dup2(null, STDERR_FILENO) < 0) quiet = 0;
        if (null >= 0) close(null);
    }
    int rc = options_parse(o, "train", "char-small", argc, argv);
    if (quiet) {
        fflush(stderr);
        dup2(saved, STDERR_FILENO);
    }
    if (saved >= 0) close(saved);
    return rc;
}

/* The last writes to stdout and the log: a full disk must not pass for a
 * finished run. 0, or 1 after a one-line error. */
static int close_output(FILE *log) {
    int ok = fflush(stdout) == 0 && !ferror(stdout);
    if (!ok) fprintf(stderr, "train: cannot write the progress output: %s\n", strerror(errno));
    if (log && (fclose(log) != 0) && ok) {
        fprintf(stderr, "train: cannot write the --log file: %s\n", strerror(errno));
        ok = 0;
    }
    return ok ? 0 : 1;
}

/* What a run holds from its start to its end. */
typedef struct {
    TrainOptions o;
    Dataset data;
    StrategyConfig sc;
    Strategy *s;
    FILE *log;
    Trace *trace;
    int start_iter;
} Run;

/* The run's strategy made, its files opened and its start loaded, each check
 * in turn. 0, or the exit status after a one-line error; *every_process says
 * whether every process met it (bad flags) or this one alone (a file). */
static int open_run(Run *run, int *every_process) {
    TrainOptions *o = &run->o;
    int leader = world()->proc == 0;
    run->sc = (StrategyConfig){
        .model = { run->data.vocab, o->block, o->layers, o->heads, o->embd, MODEL_GPT },
        .nranks = o->gpus * world()->nprocs, .device = options_placement(o),
        .sums = options_sums(o), .batch = o->batch, .dropout = o->dropout,
        .seed = (uint32_t)o->seed, .beta1 = 0.9f, .beta2 = o->beta2, .eps = 1e-8f, .weight_decay = o->weight_decay,
        .overlap = o->overlap, .bucket_bytes = (size_t)(o->bucket_mb * 1e6), .fault = o->fault,
        .unit = (UnitPolicy)unit_policy_parse(o->unit), .max_live_units = o->max_live_units,
        .recompute = o->recompute,
        .max_memory_bytes = (size_t)(o->max_memory_mb * 1e6),
    };
    StrategyConfig *sc = &run->sc;
    options_link(o, &sc->link_gbps, &sc->link_latency_us);
    sc->own_cores = sc->link_gbps > 0;  /* a modeled link times the ranks as devices */
    /* past one process, process 0 traces its ranks, writes the log and saves */
    run->trace = o->trace[0] && leader ? trace_create(TRACE_MAX_SPANS) : NULL;
    sc->trace = run->trace;
    FILE *trace_file = NULL;
    int status = 0;
    *every_process = 1;
    const char *bad = gpt_config_error(&sc->model);
    double link_seconds = bad ? 0.0 : link_step_seconds(sc, o->zero);
    if (bad) {
        fprintf(stderr, "train: %s\n", bad);
        status = 2;
    } else if (link_seconds > LINK_STEP_MAX_SECONDS) {
        fprintf(stderr, "train: --link=%s would take %.0f s for one step's collectives (at most %d s)\n", o->link,
                link_seconds, LINK_STEP_MAX_SECONDS);
        status = 2;
    } else if (leader && o->log[0] && !(run->log = fopen(o->log, "w"))) {
        fprintf(stderr, "train: cannot write --log file '%s': %s\n", o->log, strerror(errno));
        status = 1;
        *every_process = 0;
    } else if (leader && o->trace[0] && !(trace_file = fopen(o->trace, "w"))) {
        fprintf(stderr, "train: cannot write --trace file '%s': %s\n", o->trace, strerror(errno));
        status = 1;
        *every_process = 0;
    } else if (leader && o->out[0] && prepare_out(o->out) != 0) {
        status = 1;
        *every_process = 0;
    } else if (!(run->s = strategy_create(o->zero, sc))) {
        status = options_no_strategy_status(o);
        *every_process = 0;
    } else if (o->tf32 && run->s->device_kind != DEVICE_CUDA) {
        fprintf(stderr, "train: --tf32=1 needs a GPU, and the ranks run on the CPU\n");
        status = 2;
    } else if (sc->link_gbps > 0 && !run->s->simulated) {
        fprintf(stderr, "train: --link models a link for simulated ranks; these run on GPUs through NCCL\n");
        status = 2;
    } else {
        status = start_from(run->s, o, &run->data, &run->start_iter);
    }
    if (trace_file) fclose(trace_file);
    return status;
}

static void close_run(Run *run) {
    if (run->s) run->s->ops->destroy(run->s);
    trace_destroy(run->trace);
    if (run->log) fclose(run->log);
    dataset_free(&run->data);
}

/* The lines that say what is about to run. 0, or 1 after a one-line error
 * when they could not be written. */
static int print_header(const Run *run, const char *blas) {
    const TrainOptions *o = &run->o;
    const StrategyConfig *sc = &run->sc;
    Strategy *s = run->s;
    printf("device: %s\n", s->placement);
    if (world()->nprocs > 1)
        printf("world: %d processes x %d ranks through %s, a collective's --timeout %g s\n", world()->nprocs, o->gpus,
               world()->engine, o->timeout);
    if (sc->link_gbps > 0)
        printf("link: modeled, %g GB/s and %g us per hop, ring collectives (simulated ranks share one device)\n",
               sc->link_gbps, sc->link_latency_us);
    printf("blas: %s\n", blas);
    ArenaLayout layout;
    model_layout(&sc->model, 1, &layout);
    printf("data: %s, %zu characters, vocabulary %d, %zu train / %zu val tokens\n",
           o->data, run->data.ntokens, run->data.vocab, run->data.ntrain, run->data.ntokens - run->data.ntrain);
    printf("model: preset %s, %d layers, %d heads, %d wide, block %d, %.2fM parameters\n",
           o->preset, o->layers, o->heads, o->embd, o->block, layout.numel / 1e6);
    printf("training: %s, %d iters, batch %d x %d ranks x %d micro-steps, lr %g -> %g, warmup %d, dropout %g, "
           "grad clip %g, seed %d, overlap %s, units %s, at most %d live%s\n", s->name, o->iters, o->batch, sc->nranks,
           o->grad_accum, o->lr, o->min_lr, o->warmup, o->dropout, o->grad_clip, o->seed, o->overlap ? "on" : "off",
           o->unit, o->max_live_units, o->recompute ? ", recompute" : "");
    printf("memory of rank 0: weights %.1f MB, gradients %.1f MB, optimizer %.1f MB, "
           "working %.1f MB, activations %.1f MB%s\n", s->ops->rank_bytes(s, 0, MEM_WEIGHTS) / 1e6,
           s->ops->rank_bytes(s, 0, MEM_GRADS) / 1e6, s->ops->rank_bytes(s, 0, MEM_OPTIMIZER) / 1e6,
           s->ops->rank_bytes(s, 0, MEM_WORKING) / 1e6, s->ops->rank_bytes(s, 0, MEM_ACTIVATIONS) / 1e6,
           s->device_kind == DEVICE_CUDA ? " (not counted: the CUDA context, cuBLAS's workspaces, NCCL's buffers)"
                                         : "");
    if (fflush(stdout) == 0 && !ferror(stdout)) return 0;
    fprintf(stderr, "train: cannot write the progress output: %s\n", strerror(errno));
    return 1;
}

/* Train, and say how the run ended: its exit status. */
static int train(Run *run) {
    const TrainOptions *o = &run->o;
    Strategy *s = run->s;
    TrainConfig tc = {
        .iters = o->iters, .start_iter = run->start_iter, .grad_accum = o->grad_accum,
        .out_dir = o->out[0] ? o->out : NULL, .always_save = o->always_save,
        .schedule = { o->lr, o->min_lr, o->warmup, o->decay_iters < 0 ? o->iters : o->decay_iters },
        .grad_clip = o->grad_clip, .eval_every = o->eval_every, .eval_iters = o->eval_iters,
        .log_every = o->log_every, .sample_chars = o->sample_chars, .out = stdout, .log = run->log,
        .trace = run->trace, .trace_steps = o->trace_steps,
        .skip_nonfinite = strcmp(o->on_nan, "skip") == 0, .max_skips = o->max_skips, .stop_signal = &stop_signal,
    };
    TrainResult result = { 0 };
    /* from here on a signal stops the run between steps; before, it ends it as by default */
    int status = catch_stop_signals();
    if (status == 0) status = train_run(s, &tc, &run->data, &result);
    if (status != 0 && !result.every_process) finish(status, 0);  /* the others are waiting in a collective */
    char skipped[64] = "";
    if (result.skipped > 0) snprintf(skipped, sizeof skipped, ", %d skipped (not finite)", result.skipped);
    if (status == 0 && result.stopped_by)
        status = report_stop(&result, o, run->start_iter);
    else if (status == 0 && o->eval_iters > 0)
        printf("done: %d iters%s in %.1f s of steps, final val loss %.4f\n",
               o->iters, skipped, result.seconds, result.val_loss);
    else if (status == 0)
        printf("done: %d iters%s in %.1f s of steps (no evaluation: --eval-iters=0)\n",
               o->iters, skipped, result.seconds);
    if (status == 0)
        printf("peak memory of rank 0: %.1f MB (the allocator's high-water mark over the run)\n",
               s->ops->rank_peak_bytes(s, 0) / 1e6);
    int traced = o->iters - run->start_iter < o->trace_steps ? o->iters - run->start_iter : o->trace_steps;
    if (run->trace && write_trace(run->trace, o, traced) != 0 && status == 0) status = 1;
    return status;
}

int main(int argc, char **argv) {
    const char *blas = blas_ensure_core(argv);
    if (world_init(&argc, &argv) != 0) return 1;
    Run run = { 0 };
    int rc = parse_flags(&run.o, argc, argv);
    if (rc) return finish(rc == 1 ? 0 : 2, 1);
    world_set_timeout(run.o.timeout);
    world_set_local_ranks(run.o.gpus);
    if (options_join_world(&run.o) != 0) return finish(1, 1);

    char err[512];
    if (dataset_load(&run.data, run.o.data, run.o.block, err, sizeof err) != 0) {
        if (world()->nprocs > 1) fprintf(stderr, "train: process %d: %s\n", world()->proc, err);
        else fprintf(stderr, "train: %s\n", err);
        return finish(1, 0);
    }
    if (same_run_everywhere(argc, argv, &run.data) != 0) {
        dataset_free(&run.data);
        return finish(2, 1);
    }
    int every_process, status = open_run(&run, &every_process);
    if (status != 0) {
        if (!every_process) finish(status, 0);  /* the others are waiting in a collective */
        close_run(&run);
        return finish(status, 1);
    }
    device_cuda_set_tf32(run.o.tf32);
    /* past one process, process 0 alone prints: the others' stdout is quiet */
    if (world()->proc != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "train: process %d: cannot quiet its output: %s\n", world()->proc, strerror(errno));
        return finish(1, 0);
    }
    if (print_header(&run, blas) != 0) {
        finish(1, 0);
        close_run(&run);
        return 1;
    }
    status = train(&run);
    FILE *log = run.log;
    run.log = NULL;  /* close_output closes it, checking the last writes */
    close_run(&run);
    int closed = close_output(log);
    return finish(status ? status : closed, 1);
}
