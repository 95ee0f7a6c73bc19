/* trainer.h: the training loop over any strategy: schedule, eval, logging, sampling. */
#ifndef ZF_TRAINER_H
#define ZF_TRAINER_H

#include <signal.h>
#include <stdio.h>

#include "../model/data.h"
#include "../model/optim.h"
#include "../model/tokenizer.h"
#include "../strategies/strategy.h"

typedef struct {
    int iters;             /* optimizer steps: the run ends when `iters` are done */
    int start_iter;        /* steps already done (a resumed run) */
    int grad_accum;        /* micro-steps per step, 1 without accumulation */
    const char *out_dir;   /* NULL, or where DIR/ckpt.safetensors is saved */
    int always_save;       /* save at every eval, not only at a new best val loss */
    LRSchedule schedule;
    float grad_clip;       /* max global norm; 0 disables */
    int eval_every;        /* 0: only at the end */
    int eval_iters;        /* batches per split per eval */
    int log_every;
    int sample_chars;      /* generated at the end; 0 for none */
    FILE *out;             /* progress lines; NULL for none */
    FILE *log;             /* JSON lines; NULL for none */
    Trace *trace;          /* records the first trace_steps steps (the strategy's streams traced into it); NULL for none */
    int trace_steps;
    Profile *profile;      /* each step's op times are added to it (the strategy's streams profiled); NULL for none */
    /* A step whose loss or gradient is not finite is never applied: 0 stops the
     * run there; 1 skips it (no update) and goes on, at most max_skips times. */
    int skip_nonfinite, max_skips;
    /* NULL, or a flag a signal handler sets (to the signal's number): the run
     * stops after the step in flight, or the evaluation batch or the sample's
     * call of generate (trainer.h) in flight, or right after an evaluation
     * and its save, saving first with out_dir; every process of the run at
     * the same point, whichever caught it. */
    const volatile sig_atomic_t *stop_signal;
    /* How the sample is written for a token folder's ids (its text decoded);
     * NULL: a token folder's run samples nothing. A text file's bytes need none. */
    const Tokenizer *tokenizer;
} TrainConfig;

typedef struct {
    float last_loss;       /* training loss of the last step */
    float train_loss, val_loss;  /* of the last eval */
    double seconds;        /* wall time of the steps, evals excluded */
    int skipped;           /* steps skipped for a non-finite loss or gradient */
    int stopped_by;        /* the signal that stopped the run early; 0 if none */
    int stopped_in;        /* the first process that caught it */
    int iters_done;        /* steps done when the run ended (skipped ones included) */
    int saved_at;          /* the steps the run's last save holds; -1 for none */
    /* The first failed write of out or log (a reader gone, a full disk): its
     * errno, 0 for none, and which ("the progress output", "the --log file").
     * The run stops there as a signal stops it, saving first; only process 0
     * writes them, and the others learn the errno alone. */
    int output_errno;
    const char *failed_output;
    /* A failure every process of the run met at the same point (a step not
     * finite, a failed save, an injected step fault), process 0 saying why;
     * otherwise a failure of this process alone, which must end the others
     * (world_abort). */
    int every_process;
} TrainResult;

/* Run steps start_iter .. iters - 1 of s on data; each step's global batch is
 * grad_accum x nranks x batch rows, its micro-steps taking them in turn. With
 * out_dir, save a checkpoint at each eval (the best val loss so far, or every
 * eval with always_save) and at the end; a state that is not finite is never
 * saved. A stop_signal set stops the run after the step in flight, or right
 * after an evaluation and its save (a save first, with out_dir and a step
 * done since the start, unless the evaluation saved them; no sample), and
 * says which in result->stopped_by. A failed write of out or log stops the
 * run the same way, then says so and where it saved in one line on stderr.
 * Returns 0, or 1 when a rank failed, a step's loss or gradient was not
 * finite (past the skips allowed), a save or a write of out or log failed
 * (each named on stderr in one line). */
int train_run(Strategy *s, const TrainConfig *cfg, const Dataset *data, TrainResult *result);

/* New tokens per piece of a generated text, and per call of generate within
 * a piece (between calls, the text is written and a stop looked for). */
enum { SAMPLE_PIECE = 4096, SAMPLE_CALL = 64 };

/* Generate n_new tokens after prompt[0, n_prompt) with s->ops->generate, in
 * pieces of at most SAMPLE_PIECE, each piece continuing the last block_size
 * tokens before it, and hand each call's SAMPLE_CALL new tokens (or fewer) to
 * emit (0 to go on): memory stays bounded, and text appears as it comes,
 * however long. The first piece draws as one generate call would; each later
 * one from a key of its own. 0, or -1 when the model is no GPT or emit stopped it. */
int generate_pieces(Strategy *s, const int *prompt, int n_prompt, int n_new, Sampling how,
                    int (*emit)(void *ctx, const int *piece, int n), void *ctx);

/* Seconds on a monotonic clock, for timing steps. */
double wall_seconds(void);

/* Mean loss over eval_iters fixed batches of a split. */
float evaluate(Strategy *s, const Dataset *data, int split, int eval_iters);

#endif
