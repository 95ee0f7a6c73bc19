/* train.c: bin/train, the trainer's command line. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../kernels/cpu/cpu_setup.h"
#include "../model/gpt.h"
#include "../model/hf_gpt2.h"
#include "../model/models.h"
#include "../model/tokenizer.h"
#include "../runtime/host.h"
#include "../runtime/world.h"
#include "../training/checkpoint.h"
#include "../training/trainer.h"
#include "options.h"
#include "run_files.h"

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
    /* every process learns process 0's outcome, the one that reads the file, which says it */
    int rc = checkpoint_load(s, path, o->resume[0] != 0, &info, err, sizeof err);
    if (rc != 0) {
        if (world()->proc == 0) fprintf(stderr, "train: %s\n", err);
        return rc == CHECKPOINT_OTHER_MODEL ? 2 : 1;  /* the flags ask another model (docs/errors.md), or a bad file */
    }
    if (info.hf_vocab)
        printf("init-from: %s, a Hugging Face GPT-2 (Conv1D weights transposed, the tied head), vocabulary %d%s\n",
               path, info.hf_vocab, info.hf_vocab < s->cfg.model.vocab ? ", padded with zero rows" : "");
    else if (info.foreign)
        printf("init-from: %s holds no zerofiber metadata: its weights taken by nanoGPT's names, in this run's "
               "shapes, the vocabulary %s's\n", path, o->data);
    else if ((info.chars > 0) != data->characters ||
             (data->characters && (info.chars != data->vocab || memcmp(info.itos, data->itos, (size_t)data->vocab)))) {
        if (world()->proc == 0)
            fprintf(stderr, "train: '%s' was trained on another vocabulary than %s's%s\n", path, o->data,
                    (info.chars > 0) == data->characters ? ""
                    : info.chars > 0 ? " (on a text file's characters, not token ids)"
                                      : " (on token ids, not a text file's characters)");
        return 2;
    }
    if (!o->resume[0]) return 0;
    if (info.seed != (uint32_t)o->seed) {
        if (world()->proc == 0)
            fprintf(stderr, "train: '%s' was trained with --seed=%u; resume it with the same seed\n", path, info.seed);
        return 2;
    }
    if (info.iter >= o->iters) {
        if (world()->proc == 0)
            fprintf(stderr, "train: '%s' has done %d steps already; ask for more with --iters\n", path, info.iter);
        return 2;
    }
    *start_iter = info.iter;
    printf("resumed: %s, %d steps done\n", path, info.iter);
    return 0;
}

/* A link this slow would make a run last days for nothing: a mistyped unit. */
enum { LINK_STEP_MAX_SECONDS = 60 };

/* The first stop signal (runtime/host.h: SIGINT, SIGTERM, SIGHUP, SIGUSR1,
 * SIGUSR2): its number, for the trainer to stop after the step in flight and
 * save. */
static volatile sig_atomic_t stop_signal;

/* The run's exit status once it is over and only the world's end is left:
 * -1 before. */
static volatile sig_atomic_t finishing_status = -1;

/* A second one exits at once: a save it cuts short leaves only its temporary
 * file (removed at the next start), never a half-written checkpoint. Once the
 * run is over, a signal ends it quietly with its own status: mpirun ends the
 * job as soon as one process exits with a status other than 0, and the
 * others, their lines said, may still be in MPI_Finalize. */
static void on_stop_signal(int sig) {
    if (finishing_status >= 0) _exit(finishing_status);
    if (stop_signal) {
        static const char line[] = "train: a second signal: stopping at once (the last checkpoint is as it was)\n";
        ssize_t written = write(STDERR_FILENO, line, sizeof line - 1);
        (void)written;  /* nothing more to do about a failed write in a handler */
        _exit(128 + sig);
    }
    stop_signal = sig;
}

/* From the start of main: the stop signals handled on this (the main) thread,
 * which the runtime's threads leave to it (runtime/host.h), and SIGPIPE
 * ignored, so that a reader gone (`| head`) is a failed write, said in one
 * line. 0, or 1 after a one-line error. */
static int catch_stop_signals(void) {
    struct sigaction sa, ignore;
    memset(&sa, 0, sizeof sa);
    memset(&ignore, 0, sizeof ignore);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;  /* a write or read under way goes on */
    ignore.sa_handler = SIG_IGN;
    int rc = sigaction(SIGPIPE, &ignore, NULL) != 0 ? errno : 0;
    for (int i = 0; rc == 0 && i < HOST_STOP_SIGNAL_COUNT; i++)
        if (sigaction(HOST_STOP_SIGNALS[i], &sa, NULL) != 0) rc = errno;
    sigset_t stop;
    host_stop_signals(&stop);
    /* a parent may have left them blocked, which exec keeps */
    if (rc == 0) rc = pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
    if (rc == 0) return 0;
    fprintf(stderr, "train: cannot handle the stop signals: %s\n", strerror(rc));
    return 1;
}

/* The one line of a run a signal stopped; its exit status, 128 + the signal. */
static int report_stop(const TrainResult *result, const TrainOptions *o, int start_iter) {
    if (world()->proc != 0) return 128 + result->stopped_by;  /* process 0 says it for every process */
    char name[48];
    const char *abbrev = sigabbrev_np(result->stopped_by);
    if (world()->nprocs > 1)
        snprintf(name, sizeof name, "SIG%s (to process %d)", abbrev ? abbrev : "?", result->stopped_in);
    else
        snprintf(name, sizeof name, "SIG%s", abbrev ? abbrev : "?");
    if (!o->out[0])
        fprintf(stderr, "train: stopped by %s after %d steps; nothing saved (no --out)\n", name, result->iters_done);
    else if (result->iters_done == start_iter)
        fprintf(stderr, "train: stopped by %s before any step; nothing to save\n", name);
    else
        fprintf(stderr, "train: stopped by %s after %d steps, saved in %s/%s (--resume it to go on)\n", name,
                result->iters_done, o->out, CHECKPOINT_FILE_NAME);
    return 128 + result->stopped_by;
}

/* One process's verdict on a check of the start: its status (0: go on) and
 * its one-line message. */
typedef struct {
    int status;
    char message[OPTION_PATH_MAX + 256];
} Verdict;

/* Every process of the run must end a check of the start the same way: each
 * gives its verdict, and process 0 prints one line for all of them: the
 * message once when every process met it, else the first process that failed,
 * named (`unsaid` says what a failure without a message is). The status every
 * process leaves with (0: go on): the failure's, or disagreement_status (when
 * not 0) where the processes did not all fail alike. One process says its own
 * message. */
static int agree(const Verdict *mine, int disagreement_status, const char *unsaid) {
    const World *w = world();
    if (w->nprocs == 1) {
        if (mine->status && mine->message[0]) fprintf(stderr, "%s\n", mine->message);
        return mine->status;
    }
    Verdict *all = host_calloc((size_t)w->nprocs, sizeof *all);
    world_all_gather(mine, all, sizeof *mine, "the start's checks");
    int first = -1, same = 1;
    for (int p = 0; p < w->nprocs; p++) {
        if (first < 0 && all[p].status) first = p;
        same &= all[p].status == all[0].status && strcmp(all[p].message, all[0].message) == 0;
    }
    int status = first < 0 ? 0 : same ? all[first].status : disagreement_status ? disagreement_status
                                                                                : all[first].status;
    if (first >= 0 && w->proc == 0 && same && all[0].message[0]) fprintf(stderr, "%s\n", all[0].message);
    else if (first >= 0 && w->proc == 0 && !same) {
        const char *message = all[first].message[0] ? all[first].message : unsaid, *colon = strstr(message, ": ");
        fprintf(stderr, "train: process %d: %s\n", first, colon ? colon + 2 : message);
    }
    free(all);
    return status;
}

/* What tells two processes' data apart: its vocabulary, and every id of each
 * split; past DATA_HASHED_WHOLE bytes, a split's size and DATA_HASH_SAMPLES
 * spans of 4 KB spread over it (hashing 17 GB would cost each start minutes). */
enum { DATA_HASHED_WHOLE = 256 << 20, DATA_HASH_SAMPLES = 256, DATA_HASH_SPAN = 4096 };

static uint64_t data_hash(const Dataset *data) {
    uint64_t h = options_hash(0xcbf29ce484222325ull, &data->vocab, sizeof data->vocab);
    h = options_hash(h, &data->characters, sizeof data->characters);
    h = options_hash(h, data->itos, sizeof data->itos);
    for (int split = 0; split < SPLITS; split++) {
        size_t bytes = data->len[split] * (size_t)data->token_bytes;
        const unsigned char *ids = data->tokens[split];
        h = options_hash(h, &bytes, sizeof bytes);
        if (bytes <= DATA_HASHED_WHOLE) {
            h = options_hash(h, ids, bytes);
            continue;
        }
        for (size_t k = 0; k < DATA_HASH_SAMPLES; k++)
            h = options_hash(h, ids + (bytes - DATA_HASH_SPAN) / (DATA_HASH_SAMPLES - 1) * k, DATA_HASH_SPAN);
    }
    return h;
}

/* Every process must run the same flags on the same data: each hashes its
 * flags' values (options_flag_hashes) and its data's vocabulary and tokens,
 * and they compare. 0, or 2 (every process) after process 0 names, in one
 * line, the first process that differs and what differs. */
static int same_run_everywhere(TrainOptions *o, const Dataset *data) {
    const World *w = world();
    if (w->nprocs == 1) return 0;
    enum { SLOTS = MAX_FLAGS + 1 };  /* the flags', then the data's */
    uint64_t mine[SLOTS] = { 0 };
    const char *names[MAX_FLAGS];
    int nflags = options_flag_hashes(o, mine, names);
    mine[MAX_FLAGS] = data_hash(data);
    uint64_t *all = host_calloc((size_t)w->nprocs * SLOTS, sizeof(uint64_t));
    world_all_gather(mine, all, sizeof mine, "the flags' hashes");
    int status = 0;
    for (int p = 1; p < w->nprocs && status == 0; p++) {
        const uint64_t *theirs = all + (size_t)p * SLOTS;
        int flag = 0;
        while (flag < nflags && theirs[flag] == all[flag]) flag++;
        if (flag == nflags && theirs[MAX_FLAGS] == all[MAX_FLAGS]) continue;
        char who[64];
        world_name_process(p, who, sizeof who);
        if (w->proc == 0 && flag < nflags)
            fprintf(stderr, "train: %s was started with another --%s than process 0; every process must run the "
                    "same\n", who, names[flag]);
        else if (w->proc == 0)
            fprintf(stderr, "train: %s was started with another data file (--data) than process 0; every process "
                    "must run the same\n", who);
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
    finishing_status = status;
    world_finalize();
    return status;
}

/* Read the flags in every process, which then agree: 0 to run, or the exit
 * status (0 after --help, which process 0 prints; 2 after one line naming
 * what is wrong, and past one process, where only some processes were given
 * it, the process). */
static int parse_flags(TrainOptions *o, int argc, char **argv) {
    Verdict mine = { 0 };
    mine.status = options_read(o, TOOL_TRAIN, "char-small", argc, argv, mine.message, sizeof mine.message);
    int status = agree(&mine, 2, "train: it was started with --help, and the others were not; every process must "
                                 "run the same flags");
    if (status == 1 && world()->proc == 0) options_usage(stdout, TOOL_TRAIN, o);
    return status;
}

/* The last writes to stdout and the log: a full disk must not pass for a
 * finished run. 0, or 1 after a one-line error (none when the run failed
 * already: its line is said). */
static int close_output(FILE *log, int failed) {
    int ok = (fflush(stdout) == 0 && !ferror(stdout)) || failed;
    if (!ok) fprintf(stderr, "train: cannot write the progress output: %s\n", strerror(errno));
    if (log && (fclose(log) != 0) && ok && !failed) {
        fprintf(stderr, "train: cannot write the --log file: %s\n", strerror(errno));
        ok = 0;
    }
    return ok ? 0 : 1;
}

/* ZF_PROFILE=1 (any value but "" and "0"): the per-op table at the end of
 * the run (runtime/profile.h); an environment variable, so that the flags'
 * table stays the same. */
static int profile_wanted(void) {
    const char *v = getenv("ZF_PROFILE");
    return v && v[0] && strcmp(v, "0") != 0;
}

/* What a run holds from its start to its end. */
typedef struct {
    TrainOptions o;
    Dataset data;
    Tokenizer *tokenizer;  /* a token folder's decoder; NULL for none */
    StrategyConfig sc;
    Strategy *s;
    FILE *log;
    Trace *trace;
    Profile *profile;
    int start_iter;
} Run;

/* Process 0's files (run_files.h), checked, then opened: none written over
 * another, no checkpoint in --out replaced unasked, the log opened, the trace
 * and --out proved writable. Its verdict. */
static Verdict open_files(Run *run) {
    const TrainOptions *o = &run->o;
    Verdict v = { 0 };
    char *err = v.message;
    size_t len = sizeof v.message;
    int stale = 0;
    if ((v.status = run_files_distinct(o, err, len)) || (v.status = run_files_keep_checkpoint(o, err, len)) ||
        (o->log[0] && (v.status = run_files_open_log(o->log, &run->log, err, len))) ||
        (o->trace[0] && (v.status = run_files_check_trace(o->trace, err, len))) ||
        (o->out[0] && (v.status = run_files_prepare_out(o->out, &stale, err, len))))
        return v;
    if (stale > 0) printf("out: removed %d temporary file(s) that cut-short saves left in %s\n", stale, o->out);
    return v;
}

/* What the flags make of the run's strategy (its diagnostics aside). */
static StrategyConfig run_config(const TrainOptions *o, const Dataset *data) {
    return (StrategyConfig){
        .model = options_model(o, data->vocab),
        .nranks = o->gpus * world()->nprocs, .shard_ranks = o->shard_ranks, .device = options_placement(o),
        .sums = options_sums(o), .batch = o->batch, .dropout = o->dropout,
        .seed = (uint32_t)o->seed, .beta1 = 0.9f, .beta2 = o->beta2, .eps = 1e-8f, .weight_decay = o->weight_decay,
        .precision = options_precision(o), .reduce_precision = options_reduce_precision(o),
        .overlap = options_overlap(o), .units = options_units(o), .link = options_link(o),
        .link_inter = options_link_inter(o), .graphs = o->graphs,
        .diagnostics.fault = o->fault, .max_memory_bytes = (size_t)(o->max_memory_mb * 1e6),
    };
}

/* The run's strategy made and its start loaded, each check in turn. 0, or
 * the exit status after a one-line error; *alone is 1 when this process alone
 * failed (its ranks could not be made), which must end the others. */
static int open_run(Run *run, int *alone) {
    TrainOptions *o = &run->o;
    run->sc = run_config(o, &run->data);
    StrategyConfig *sc = &run->sc;
    sc->own_cores = sc->link.gbps > 0;  /* a modeled link times the ranks as devices */
    /* past one process, process 0 traces its ranks, writes the log and saves */
    run->trace = o->trace[0] && world()->proc == 0 ? trace_create(TRACE_MAX_SPANS) : NULL;
    sc->diagnostics.trace = run->trace;
    run->profile = profile_wanted() && world()->proc == 0 ? profile_create() : NULL;
    sc->diagnostics.profile = run->profile;
    *alone = !(run->s = strategy_create(o->zero, sc));
    if (*alone) return options_no_strategy_status(o);
    const char *bad = NULL;
    if (o->tf32 && run->s->device_kind != DEVICE_CUDA) bad = "--tf32=1 needs a GPU, and the ranks run on the CPU";
    else if (sc->link.gbps > 0 && !run->s->simulated)
        bad = "--link models a link for simulated ranks; these run on GPUs through NCCL";
    else if (sc->link_inter.gbps > 0 && !run->s->simulated)
        bad = "--link-inter models a link for simulated ranks; these run on GPUs through NCCL";
    if (bad && world()->proc == 0) fprintf(stderr, "train: %s\n", bad);
    if (bad) return 2;
    return start_from(run->s, o, &run->data, &run->start_iter);
}

/* A Hugging Face GPT-2 in --init-from sets the model (options_take_hf_model):
 * process 0 reads its config.json and tells the others. 0, or the exit status
 * (1 for a config.json it cannot take, 2 for flags that ask another model)
 * after a one-line error. */
static int take_hf_model(Run *run, int argc, char **argv) {
    TrainOptions *o = &run->o;
    if (!o->init_from[0]) return 0;
    struct { int hf; Verdict v; ModelConfig model; } mine = { 0 };
    HfGpt2 hf;
    char err[OPTION_PATH_MAX + 128];
    if (world()->proc == 0 && (mine.hf = hf_gpt2_at(o->init_from))) {
        if (hf_gpt2_open(o->init_from, &hf, err, sizeof err) != 0) {
            mine.v.status = 1;
            snprintf(mine.v.message, sizeof mine.v.message, "train: %s", err);
        }
        mine.model = hf.model;
    }
    world_broadcast(&mine, sizeof mine, "the Hugging Face model");
    if (!mine.hf) return 0;
    if (!mine.v.status)
        mine.v.status = options_take_hf_model(o, &mine.model, argc, argv, mine.v.message, sizeof mine.v.message);
    if (!mine.v.status && run->data.characters) {
        mine.v.status = 2;
        snprintf(mine.v.message, sizeof mine.v.message, "train: the Hugging Face --init-from=%.200s reads GPT-2's "
                 "token ids, and --data=%.200s is a text file, whose bytes are its tokens: make it a folder of ids "
                 "with bin/prepare", o->init_from, o->data);
    } else if (!mine.v.status && run->data.vocab > mine.model.vocab) {
        mine.v.status = 2;
        snprintf(mine.v.message, sizeof mine.v.message, "train: --data=%.200s has %d ids, more than the %d of the "
                 "Hugging Face --init-from=%.200s", o->data, run->data.vocab, mine.model.vocab, o->init_from);
    }
    if (mine.v.status && world()->proc == 0) fprintf(stderr, "%s\n", mine.v.message);
    return mine.v.status;
}

/* What the flags ask that no run can do: a model the GPT cannot be, a link too
 * slow to train on, a sample counted in the other unit than the data's
 * tokens. 0, or 2 after a one-line error. */
static int check_model(const Run *run, int argc, char **argv) {
    const TrainOptions *o = &run->o;
    char unit[160];
    if (options_check_sample_unit(o, TOOL_TRAIN, run->data.characters, argc, argv, unit, sizeof unit) != 0) {
        if (world()->proc == 0) fprintf(stderr, "%s\n", unit);
        return 2;
    }
    StrategyConfig sc = { .model = options_model(o, run->data.vocab), .nranks = o->gpus * world()->nprocs,
                          .shard_ranks = o->shard_ranks, .reduce_precision = options_reduce_precision(o),
                          .link = options_link(o), .link_inter = options_link_inter(o) };
    const char *bad = gpt_config_error(&sc.model);
    const StrategyKind *kind = strategy_kind(o->zero);  /* the flags' checks found it */
    double link_seconds = bad ? 0.0 : kind->link_cost(&sc, o->grad_clip > 0).seconds;
    int says = world()->proc == 0;  /* every process has the same flags */
    if (bad && says) fprintf(stderr, "train: %s\n", bad);
    else if (!bad && link_seconds > LINK_STEP_MAX_SECONDS && says)
        fprintf(stderr, "train: --link=%s would take %.0f s for one step's collectives (at most %d s)\n", o->link,
                link_seconds, LINK_STEP_MAX_SECONDS);
    return bad || link_seconds > LINK_STEP_MAX_SECONDS ? 2 : 0;
}

/* A run whose ranks on the CPU, all of them in this process, would hold more
 * than the machine has free (their state, working buffers and activations, as
 * bin/zero_memory --estimate counts them, which the allocator's counts match
 * within 1%): refused before anything is made, since the first rank's
 * activations could take minutes to zero before another rank's allocation
 * failed. 0, or the allocator's verdict (1, out of memory) in its words, which
 * the processes agree on. */
static int check_memory(const Run *run) {
    const TrainOptions *o = &run->o;
    Verdict v = { 0 };
    Placement where = options_placement(o);
    if (where == PLACE_CUDA || (where == PLACE_AUTO && device_cuda_count() > 0)) return agree(&v, 0, NULL);
    StrategyConfig sc = run_config(o, &run->data);
    const StrategyKind *kind = strategy_kind(o->zero);
    double rank[MEM_KINDS];
    strategy_estimate(kind, &sc, DEVICE_CPU, rank);
    double state = rank[MEM_WEIGHTS] + rank[MEM_GRADS] + rank[MEM_OPTIMIZER], all = 0;
    for (int k = 0; k < MEM_KINDS; k++) all += rank[k];
    double bytes = o->gpus * all;
    /* taken from the machine's count and given back at once: the allocator's own test */
    size_t need = bytes < (double)SIZE_MAX ? (size_t)bytes : SIZE_MAX;
    if (host_memory_take(need) == 0) {
        host_memory_give_back(need);
    } else {
        v.status = 1;
        snprintf(v.message, sizeof v.message, "error: out of memory on cpu for %s, N=%d: this process's %d rank(s) "
                 "need about %.1f MB (a rank: %.1f MB of state, %.1f MB of activations, as bin/zero_memory --estimate "
                 "counts them), of the %.1f MB the machine had free for the run; a smaller model or fewer rows "
                 "(--batch)", kind->name, sc.nranks, o->gpus, bytes / 1e6, state / 1e6, rank[MEM_ACTIVATIONS] / 1e6,
                 host_memory_budget() / 1e6);
    }
    return agree(&v, 0, NULL);
}

/* This process's data, and the tokenizer of a token folder's ids; its verdict. */
static Verdict load_data(Run *run) {
    const TrainOptions *o = &run->o;
    Verdict v = { 0 };
    char err[400];
    if (dataset_load(&run->data, o->data, o->block, err, sizeof err) != 0) {
        v.status = 1;
        snprintf(v.message, sizeof v.message, "train: %s", err);
    } else if (o->tokenizer[0] && run->data.characters) {
        v.status = 2;
        snprintf(v.message, sizeof v.message, "train: --tokenizer decodes a folder of token ids, and --data=%.300s is "
                 "a text file, whose bytes are its tokens", o->data);
    } else if (o->tokenizer[0] && !(run->tokenizer = tokenizer_load(o->tokenizer, err, sizeof err))) {
        v.status = 1;
        snprintf(v.message, sizeof v.message, "train: %s", err);
    } else if (run->tokenizer && tokenizer_vocab(run->tokenizer) != run->data.vocab) {
        v.status = 2;
        snprintf(v.message, sizeof v.message, "train: --tokenizer=%.200s has %d ids, and the vocabulary of %.200s is %d (its "
                 "meta.json's vocab_size, or GPT-2's %d without one)", o->tokenizer, tokenizer_vocab(run->tokenizer),
                 o->data, run->data.vocab, GPT2_VOCAB);
    }
    return v;
}

static void close_run(Run *run) {
    tokenizer_free(run->tokenizer);
    run->tokenizer = NULL;
    if (run->s) run->s->ops->destroy(run->s);
    trace_destroy(run->trace);
    profile_destroy(run->profile);
    if (run->log) fclose(run->log);
    dataset_free(&run->data);
}

/* The lines that say what is about to run. 0, or 1 after a one-line error
 * when they could not be written. */
static int print_header(const Run *run, const CpuSetup *cpu) {
    const TrainOptions *o = &run->o;
    const StrategyConfig *sc = &run->sc;
    Strategy *s = run->s;
    printf("device: %s\n", s->placement);
    if (world()->nprocs > 1)
        printf("world: %d processes x %d ranks through %s, a collective's --timeout %g s\n", world()->nprocs, o->gpus,
               world()->engine, o->timeout);
    if (sc->link.gbps > 0 && sc->link_inter.gbps > 0)
        printf("link: modeled, %g GB/s and %g us per hop inside each group of %d ranks, %g GB/s and %g us between "
               "the groups (simulated ranks share one device)\n", sc->link.gbps, sc->link.latency_us,
               strategy_shard_ranks(sc), sc->link_inter.gbps, sc->link_inter.latency_us);
    else if (sc->link.gbps > 0)
        printf("link: modeled, %g GB/s and %g us per hop, ring collectives (simulated ranks share one device)\n",
               sc->link.gbps, sc->link.latency_us);
    cpu_setup_print(cpu);
    if (s->device_kind == DEVICE_CUDA) {
        char libraries[1200];
        device_cuda_libraries(libraries, sizeof libraries);
        printf("gpu libraries: %s\n", libraries);
    }
    ArenaLayout layout;
    model_layout(&sc->model, 1, &layout);
    const Dataset *d = &run->data;
    if (d->characters)
        printf("data: %s, %zu characters, vocabulary %d, %zu train / %zu val tokens\n", o->data,
               d->len[SPLIT_TRAIN] + d->len[SPLIT_VAL], d->vocab, d->len[SPLIT_TRAIN], d->len[SPLIT_VAL]);
    else
        printf("data: %s, token ids (uint%d, memory-mapped), vocabulary %d, %zu train / %zu val tokens, %s\n",
               o->data, 8 * d->token_bytes, d->vocab, d->len[SPLIT_TRAIN], d->len[SPLIT_VAL],
               o->tokenizer[0] ? o->tokenizer : "no --tokenizer (no sample)");
    printf("model: preset %s, %d layers, %d heads, %d wide, block %d, vocabulary %d%s, GELU %s, %.2fM parameters\n",
           o->preset, o->layers, o->heads, o->embd, o->block, sc->model.vocab, o->bias ? ", biases" : "", o->gelu,
           layout.numel / 1e6);
    char hybrid[96] = "";
    if (strategy_shard_ranks(sc) < sc->nranks)
        snprintf(hybrid, sizeof hybrid, " sharded over %d groups of %d ranks (hybrid)",
                 sc->nranks / strategy_shard_ranks(sc), strategy_shard_ranks(sc));
    printf("training: %s%s, %d iters, batch %d x %d ranks x %d micro-steps, lr %g -> %g, warmup %d, dropout %g, "
           "grad clip %g, seed %d, overlap %s, units %s, at most %d live, made again: %s, %s%s\n", s->kind->name,
           hybrid, o->iters, o->batch, sc->nranks, o->grad_accum, o->lr, o->min_lr, o->warmup, o->dropout,
           o->grad_clip, o->seed, o->overlap ? "on" : "off", o->unit, o->max_live_units, options_recompute_text(o),
           sc->precision != DTYPE_BF16                  ? "fp32"
           : strategy_grads_held(sc) == DTYPE_BF16 ? "bf16 compute copy under autocast (fp32 master weights and "
                                                         "AdamW, bf16 gradients)"
                                                       : "bf16 compute copy under autocast (fp32 master weights, "
                                                         "gradients, AdamW)",
           sc->reduce_precision == DTYPE_BF16 ? ", gradients reduced in bf16" : "");
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
/* The allocator's high-water mark of each of this process's ranks: the
 * largest, and whose. */
static void print_peak_memory(Strategy *s) {
    int local = s->cfg.nranks / world()->nprocs, largest = 0;
    for (int r = 1; r < local; r++)
        if (s->ops->rank_peak_bytes(s, r) > s->ops->rank_peak_bytes(s, largest)) largest = r;
    printf("peak memory of a rank: %.1f MB, rank %d's, the most of %s%d (the allocator's high-water mark over the "
           "run)\n", s->ops->rank_peak_bytes(s, largest) / 1e6, world()->proc * local + largest,
           world()->nprocs > 1 ? "process 0's " : "", local);
    if (s->cfg.graphs)
        printf("graphs: %d micro-step(s) captured, %d run as a graph's launch\n", s->graph_captures, s->graph_launches);
}

static int train(Run *run) {
    const TrainOptions *o = &run->o;
    Strategy *s = run->s;
    TrainConfig tc = {
        .iters = o->iters, .start_iter = run->start_iter, .grad_accum = o->grad_accum,
        .out_dir = o->out[0] ? o->out : NULL, .always_save = o->always_save,
        .schedule = { o->lr, o->min_lr, o->warmup, o->decay_iters < 0 ? o->iters : o->decay_iters },
        .grad_clip = o->grad_clip, .eval_every = o->eval_every, .eval_iters = o->eval_iters,
        .log_every = o->log_every, .sample_chars = o->sample_count, .out = stdout, .log = run->log,
        .trace = run->trace, .trace_steps = o->trace_steps, .profile = run->profile,
        .skip_nonfinite = strcmp(o->on_nan, "skip") == 0, .max_skips = o->max_skips, .stop_signal = &stop_signal,
        .tokenizer = run->tokenizer,
    };
    TrainResult result = { 0 };
    int status = train_run(s, &tc, &run->data, &result);
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
    if (status == 0) print_peak_memory(s);
    if (status == 0 && run->profile) profile_print(run->profile, "rank 0's compute stream", stdout);
    int traced = o->iters - run->start_iter < o->trace_steps ? o->iters - run->start_iter : o->trace_steps;
    if (run->trace && write_trace(run->trace, o, traced) != 0 && status == 0) status = 1;
    return status;
}

int main(int argc, char **argv) {
    /* first: a signal in the start would otherwise end the run as by default */
    if (catch_stop_signals() != 0) return 1;
    const CpuSetup *cpu = cpu_setup(argv);
    if (world_init(&argc, &argv) != 0) return 1;
    Run run = { 0 };
    int status = parse_flags(&run.o, argc, argv);
    if (status) return finish(status == 1 ? 0 : status, 1);
    /* past one process, process 0 alone prints: the others' stdout is quiet */
    if (world()->proc != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "train: process %d: cannot quiet its output: %s\n", world()->proc, strerror(errno));
        return finish(1, 0);
    }
    world_set_timeout(run.o.timeout);
    world_set_local_ranks(run.o.gpus);
    if ((status = options_join_world(&run.o)) != 0) return finish(status, 1);

    Verdict data = load_data(&run);
    if ((status = agree(&data, 0, NULL)) || (status = same_run_everywhere(&run.o, &run.data)) ||
        (status = take_hf_model(&run, argc, argv)) || (status = check_model(&run, argc, argv)) ||
        (status = check_memory(&run))) {
        close_run(&run);
        return finish(status, 1);
    }
    Verdict files = world()->proc == 0 ? open_files(&run) : (Verdict){ 0 };
    int alone = 0;
    if ((status = agree(&files, 0, NULL)) || (status = open_run(&run, &alone))) {
        if (alone) finish(status, 0);  /* the others are waiting in a collective */
        close_run(&run);
        return finish(status, 1);
    }
    device_cuda_set_tf32(run.o.tf32);
    if (print_header(&run, cpu) != 0) {
        finish(1, 0);
        close_run(&run);
        return 1;
    }
    status = train(&run);
    FILE *log = run.log;
    run.log = NULL;  /* close_output closes it, checking the last writes */
    close_run(&run);
    int closed = close_output(log, status != 0);
    return finish(status ? status : closed, 1);
}
