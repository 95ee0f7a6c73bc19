/* trainer.c: the loop of trainer.h, as nanoGPT's train.py runs it. */
#include "trainer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../model/sample.h"
#include "../runtime/host.h"
#include "../runtime/inject.h"
#include "../runtime/world.h"
#include "checkpoint.h"

double wall_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Host buffers for one global batch. */
typedef struct { int *x, *y; int rows, T; } HostBatch;

static HostBatch batch_alloc(const Strategy *s) {
    HostBatch b = { NULL, NULL, s->cfg.batch * s->cfg.nranks, s->cfg.model.block_size };
    b.x = host_calloc((size_t)b.rows * b.T, sizeof(int));
    b.y = host_calloc((size_t)b.rows * b.T, sizeof(int));
    return b;
}

static void batch_free(HostBatch *b) { free(b->x); free(b->y); }

/* Whether a write of out or log failed (flush_output): only process 0 writes
 * them, and every process learns it here, to stop at the same point. */
static int output_failed(TrainResult *result) {
    int failed = world_first_nonzero(result->output_errno, NULL, "the failed writes");
    if (failed) result->output_errno = failed;
    return failed != 0;
}

/* Whether a stop signal reached any process of the run (the first one's goes
 * to result), or a write of out or log failed; every process asks at the same
 * points, so all stop at the same one. Never without cfg (evaluate). */
static int stop_requested(const TrainConfig *cfg, TrainResult *result) {
    if (!cfg) return 0;
    int sig = cfg->stop_signal ? world_first_nonzero(*cfg->stop_signal, &result->stopped_in, "the stop signals") : 0;
    if (sig) result->stopped_by = sig;
    return output_failed(result) || sig != 0;
}

/* The progress output's writes, flushed: the first that fails (a reader gone,
 * a full disk) goes to result, and stops the run at the next stop_requested,
 * which saves the steps done first. A record that silently stops is lost. */
static void flush_output(const TrainConfig *cfg, TrainResult *result) {
    const char *failed = NULL;
    if (cfg->out && (fflush(cfg->out) != 0 || ferror(cfg->out))) failed = "the progress output";
    else if (cfg->log && (fflush(cfg->log) != 0 || ferror(cfg->log))) failed = "the --log file";
    if (!failed || result->output_errno) return;
    result->output_errno = errno ? errno : EIO;
    result->failed_output = failed;
}

/* Seconds between the progress lines of a long evaluation: an 87M model's
 * evaluation on two cores is otherwise silent for minutes. */
enum { PROGRESS_SECONDS = 5 };

/* An evaluation's clock: the step it is for, its start, and its last
 * progress line (or its start). */
typedef struct {
    int iter;
    double start, last_line;
} EvalClock;

/* A progress line of the evaluation, once PROGRESS_SECONDS have passed since
 * the last one: `batch` of the split's eval_iters are done. */
static void say_eval_progress(const TrainConfig *cfg, TrainResult *result, EvalClock *clock, int split, int batch) {
    double now = wall_seconds();
    if (!cfg->out || now - clock->last_line < PROGRESS_SECONDS) return;
    fprintf(cfg->out, "eval iter %d: %s split, batch %d of %d (%.0f s)\n", clock->iter,
            split == SPLIT_TRAIN ? "train" : "val", batch, cfg->eval_iters, now - clock->start);
    flush_output(cfg, result);
    clock->last_line = now;
}

/* A window the data cannot give (an id past the vocabulary): every process
 * draws the same windows, so each meets it at once and process 0 says it. */
static int batch_failed(const char *err) {
    if (world()->proc == 0) fprintf(stderr, "error: %s; stopping\n", err);
    return -1;
}

/* The mean loss over eval_iters fixed batches of a split into *loss; 1 if a
 * stop (stop_requested, between batches) cut it short, -1 (said) if the data
 * could not give a batch. With a clock, a long one says how far it is. */
static int mean_eval_loss(Strategy *s, const Dataset *data, int split, int eval_iters, const TrainConfig *cfg,
                          TrainResult *result, EvalClock *clock, float *loss) {
    HostBatch b = batch_alloc(s);
    double total = 0.0;
    int i = 0, rc = 0;
    char err[768];
    for (; i < eval_iters && !stop_requested(cfg, result); i++) {
        if (dataset_batch(data, split, BATCH_EVAL, s->cfg.seed, (uint32_t)i, 0, b.rows, b.T, b.x, b.y, err,
                          sizeof err) != 0) {
            rc = batch_failed(err);
            break;
        }
        total += s->ops->eval_loss(s, b.x, b.y);
        if (clock) say_eval_progress(cfg, result, clock, split, i + 1);
    }
    batch_free(&b);
    *loss = (float)(total / eval_iters);
    return rc ? rc : i < eval_iters;
}

float evaluate(Strategy *s, const Dataset *data, int split, int eval_iters) {
    float loss;
    return mean_eval_loss(s, data, split, eval_iters, NULL, NULL, NULL, &loss) == 0 ? loss : NAN;
}

static void format_eta(double seconds, char *buf, size_t len) {
    long t = (long)(seconds + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%lds", t);
}

/* One character inside a JSON string, escaped as JSON asks. */
static void json_char(FILE *f, unsigned char c) {
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c == '\n') fputs("\\n", f);
    else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
}

int generate_pieces(Strategy *s, const int *prompt, int n_prompt, int n_new, Sampling how,
                    int (*emit)(void *ctx, const int *piece, int n), void *ctx) {
    int block = s->cfg.model.block_size, have = n_prompt, rc = 0;
    int *tokens = host_calloc((size_t)(n_prompt > block ? n_prompt : block) + SAMPLE_PIECE, sizeof(int));
    memcpy(tokens, prompt, (size_t)n_prompt * sizeof(int));
    for (int left = n_new; rc == 0 && left > 0;) {
        int n = left < SAMPLE_PIECE ? left : SAMPLE_PIECE;
        /* in calls of SAMPLE_CALL tokens, each continuing the last: the draws
         * are keyed by position, so they are one call's */
        for (int done = 0; rc == 0 && done < n; done += SAMPLE_CALL) {
            int k = n - done < SAMPLE_CALL ? n - done : SAMPLE_CALL;
            rc = s->ops->generate(s, tokens, have + done, k, how);
            if (rc == 0) rc = emit(ctx, tokens + have + done, k);
        }
        have += n;
        left -= n;
        if (have > block) {  /* the last block is all the next piece's forward sees */
            memmove(tokens, tokens + have - block, (size_t)block * sizeof(int));
            have = block;
        }
        /* the draws are keyed by the position in tokens, which the next piece
         * reuses: a key of its own (a golden-ratio step) keeps them independent */
        how.seed += 0x9E3779B9u;
    }
    free(tokens);
    return rc ? -1 : 0;
}

typedef struct { const TrainConfig *cfg; const Dataset *data; TrainResult *result; } SampleSink;

/* A part of the sample, to the progress lines and (as part of one JSON
 * string) to the log, each token as the bytes it stands for; then the sample
 * stops if a write failed or a stop signal came. */
static int emit_sample(void *ctx, const int *piece, int n) {
    SampleSink *sink = ctx;
    for (int i = 0; i < n; i++) {
        size_t len = 1;
        const unsigned char *bytes = sink->data->characters ? &sink->data->itos[piece[i]]
                                                            : tokenizer_bytes(sink->cfg->tokenizer, piece[i], &len);
        for (size_t k = 0; k < len; k++) {
            if (sink->cfg->out) fputc(bytes[k], sink->cfg->out);
            if (sink->cfg->log) json_char(sink->cfg->log, bytes[k]);
        }
    }
    flush_output(sink->cfg, sink->result);
    return stop_requested(sink->cfg, sink->result);
}

/* The token a sample starts from: a newline's, as nanoGPT's sample.py starts
 * ("\n" encoded); -1 where there is none to decode with. */
static int newline_token(const TrainConfig *cfg, const Dataset *data) {
    if (data->characters) return data->stoi['\n'] >= 0 ? data->stoi['\n'] : 0;  /* any first token will do */
    if (!cfg->tokenizer) return -1;
    TokenIds ids = { 0 };
    char err[128];
    int first = tokenizer_encode(cfg->tokenizer, "\n", 1, &ids, err, sizeof err) == 0 && ids.n > 0 ? ids.ids[0] : 0;
    token_ids_free(&ids);
    return first;
}

/* sample_chars tokens after a newline, up to a stop (a signal, a failed
 * write: in result). */
static void sample_text(Strategy *s, const TrainConfig *cfg, const Dataset *data, TrainResult *result) {
    if (s->cfg.model.kind != MODEL_GPT) return;  /* the gates' MLP generates nothing */
    int first = newline_token(cfg, data);
    if (first < 0) {
        if (cfg->out) fputs("sample: none (token ids without --tokenizer to decode them)\n", cfg->out);
        flush_output(cfg, result);
        return;
    }
    SampleSink sink = { cfg, data, result };
    /* a GPT-2's hundreds of tokens take minutes on a CPU: say what comes */
    if (cfg->out)
        fprintf(cfg->out, "sample: %d %s (each one pass of the model; they appear %d at a time):\n",
                cfg->sample_chars, data->characters ? "characters" : "tokens", SAMPLE_CALL);
    if (cfg->log) fputs("{\"sample\": \"", cfg->log);
    generate_pieces(s, &first, 1, cfg->sample_chars, (Sampling){ 1.0f, 0, s->cfg.seed, data->vocab }, emit_sample, &sink);
    if (cfg->out) fputc('\n', cfg->out);
    if (cfg->log) fputs("\"}\n", cfg->log);
    flush_output(cfg, result);
}

/* DIR/ckpt.safetensors, as of `iter` steps done. A failed save fails every
 * process at once (they learn process 0's outcome). */
static int save(Strategy *s, const TrainConfig *cfg, const Dataset *data, int iter, TrainResult *result) {
    CheckpointInfo info = { .model = s->cfg.model, .chars = data->characters ? data->vocab : 0, .iter = iter,
                            .adam_step = s->adam_step, .seed = s->cfg.seed };
    memcpy(info.itos, data->itos, sizeof info.itos);
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s", cfg->out_dir, CHECKPOINT_FILE_NAME);
    int existed = access(path, F_OK) == 0;
    int injected = signal_injected_at(iter);
    if (injected) raise(injected);  /* a test's signal in the save (runtime/inject.h) */
    if (checkpoint_save(s, path, &info, err, sizeof err) != 0) {
        if (world()->proc == 0 && existed)
            fprintf(stderr, "error: saving at iter %d: %s (%s is as it was)\n", iter, err, path);
        else if (world()->proc == 0)
            fprintf(stderr, "error: saving at iter %d: %s (there is no %s)\n", iter, err, path);
        result->every_process = 1;
        return 1;
    }
    result->saved_at = iter;
    if (cfg->out) fprintf(cfg->out, "saved %s (iter %d)\n", path, iter);
    flush_output(cfg, result);
    return 0;
}

/* Whether the step of `iter` may be applied: its loss and every rank's gradient
 * finite. Otherwise it is skipped (skip_nonfinite, within max_skips) or the run
 * stops: 0 apply, 1 skip, -1 stop (each said in one line). */
static int check_step(Strategy *s, const TrainConfig *cfg, int iter, float loss, TrainResult *result) {
    size_t bad_grads = s->ops->count_nonfinite(s, NONFINITE_GRADS);
    if (isfinite(loss) && bad_grads == 0) return 0;
    char what[96];
    if (!isfinite(loss)) snprintf(what, sizeof what, "the training loss is %s", isnan(loss) ? "NaN" : "infinite");
    else snprintf(what, sizeof what, "the gradient is not finite (%zu NaN or infinite values)", bad_grads);
    if (cfg->skip_nonfinite && result->skipped < cfg->max_skips) {
        result->skipped++;
        if (cfg->out) fprintf(cfg->out, "iter %d: %s; step skipped (%d of at most %d)\n", iter, what,
                              result->skipped, cfg->max_skips);
        return 1;
    }
    if (world()->proc != 0) return -1;  /* every process stops here; process 0 says why */
    if (cfg->skip_nonfinite)
        fprintf(stderr, "error: %s at iter %d, after %d skipped steps (--max-skips=%d); stopping\n", what, iter,
                result->skipped, cfg->max_skips);
    else
        fprintf(stderr, "error: %s at iter %d; stopping\n", what, iter);
    return -1;
}

/* An evaluation at `iter`: both splits' losses said, and a save at a new best
 * val loss (every eval with always_save), but not at the end, which saves
 * whatever its loss. 0, or 1 when the data or the save failed. */
static int eval_and_save(Strategy *s, const TrainConfig *cfg, const Dataset *data, int iter, TrainResult *result,
                         float *best_val) {
    EvalClock clock = { iter, wall_seconds(), wall_seconds() };
    int rc = mean_eval_loss(s, data, SPLIT_TRAIN, cfg->eval_iters, cfg, result, &clock, &result->train_loss);
    if (rc == 0) rc = mean_eval_loss(s, data, SPLIT_VAL, cfg->eval_iters, cfg, result, &clock, &result->val_loss);
    if (rc < 0) {
        result->every_process = 1;
        return 1;
    }
    if (rc > 0) return 0;  /* a stop: the run saves and stops at this step */
    if (cfg->out)
        fprintf(cfg->out, "eval iter %d: train loss %.4f, val loss %.4f\n", iter, result->train_loss, result->val_loss);
    if (cfg->log)
        fprintf(cfg->log, "{\"iter\": %d, \"train_loss\": %.6f, \"val_loss\": %.6f}\n", iter, result->train_loss,
                result->val_loss);
    flush_output(cfg, result);
    if (cfg->out_dir && iter < cfg->iters && (cfg->always_save || result->val_loss < *best_val) &&
        iter > cfg->start_iter && save(s, cfg, data, iter, result) != 0)
        return 1;
    if (result->val_loss < *best_val) *best_val = result->val_loss;
    return 0;
}

/* The step of `iter`: its micro-steps' forward and backward, the check of its
 * loss and gradient, then clipping and AdamW unless it is skipped (*verdict,
 * as check_step's). 0, or 1 when the run must stop. */
static int train_step(Strategy *s, const TrainConfig *cfg, const Dataset *data, HostBatch *b, int iter,
                      TrainResult *result, int *verdict) {
    int micros = cfg->grad_accum > 1 ? cfg->grad_accum : 1;
    s->ops->set_lr(s, lr_at(&cfg->schedule, iter));
    double loss_sum = 0.0;
    for (int micro = 0; micro < micros; micro++) {
        char err[768];
        if (dataset_batch(data, SPLIT_TRAIN, BATCH_TRAIN, s->cfg.seed, (uint32_t)iter, micro * b->rows, b->rows, b->T,
                          b->x, b->y, err, sizeof err) != 0) {
            batch_failed(err);
            result->every_process = 1;
            return 1;
        }
        if (s->ops->forward_backward(s, b->x, b->y, (uint32_t)iter, micro, micros) != 0) return 1;
        loss_sum += s->ops->train_loss(s);
    }
    result->last_loss = (float)(loss_sum / micros);
    *verdict = check_step(s, cfg, iter, result->last_loss, result);
    if (*verdict > 0) flush_output(cfg, result);
    if (*verdict < 0) {
        result->every_process = 1;
        return 1;
    }
    int faulty_rank = s->cfg.diagnostics.fault.rank;
    char report[200];
    if (*verdict == 0 && faulty_rank < s->cfg.nranks &&
        fault_strikes(&s->cfg.diagnostics.fault, faulty_rank, iter, FAULT_STEP, NULL, report, sizeof report)) {
        if (world()->proc == 0) fprintf(stderr, "error: rank %d: %s; stopping\n", faulty_rank, report);
        result->every_process = 1;
        return 1;
    }
    if (*verdict == 0) {
        s->ops->clip_grads(s, cfg->grad_clip);
        s->ops->step(s);
    }
    return 0;
}

/* The steps since the last progress line, for its ms/iter and tokens/s. */
typedef struct {
    double start;
    int steps;
} Window;

/* The progress line of `iter`, over the window's steps, which start anew. */
static void log_progress(const TrainConfig *cfg, TrainResult *result, int iter, float lr, size_t tokens_per_step,
                         Window *window) {
    float loss = result->last_loss;
    double elapsed = wall_seconds() - window->start;
    double ms = 1000.0 * elapsed / window->steps;
    double tok_s = (double)tokens_per_step * window->steps / elapsed;
    char eta[32];
    format_eta(ms / 1000.0 * (cfg->iters - iter - 1), eta, sizeof eta);
    if (cfg->out)
        fprintf(cfg->out, "iter %d: loss %.4f, lr %.2e, %.1f ms/iter, %.0f tok/s, eta %s\n", iter, loss, lr, ms,
                tok_s, eta);
    if (cfg->log)
        fprintf(cfg->log, "{\"iter\": %d, \"loss\": %.6f, \"lr\": %.6e, \"ms_per_iter\": %.3f, "
                "\"tokens_per_s\": %.1f}\n", iter, loss, lr, ms, tok_s);
    *window = (Window){ wall_seconds(), 0 };
    flush_output(cfg, result);
}

/* The one line of a run a failed write of out or log stopped, process 0's
 * for every process: where it stopped, and what it saved. Its status, 1. */
static int report_failed_output(const TrainConfig *cfg, TrainResult *result) {
    result->every_process = 1;
    if (world()->proc != 0) return 1;
    fprintf(stderr, "error: cannot write %s: %s; ", result->failed_output, strerror(result->output_errno));
    if (result->iters_done == cfg->start_iter)
        fprintf(stderr, "stopped before any step; nothing to save\n");
    else if (!cfg->out_dir)
        fprintf(stderr, "stopped after %d steps; nothing saved (no --out)\n", result->iters_done);
    else if (result->iters_done == cfg->iters)
        fprintf(stderr, "every step done, saved in %s/%s\n", cfg->out_dir, CHECKPOINT_FILE_NAME);
    else
        fprintf(stderr, "stopped after %d steps, saved in %s/%s (--resume it to go on)\n", result->iters_done,
                cfg->out_dir, CHECKPOINT_FILE_NAME);
    return 1;
}

int train_run(Strategy *s, const TrainConfig *cfg, const Dataset *data, TrainResult *result) {
    memset(result, 0, sizeof *result);
    result->saved_at = -1;
    HostBatch b = batch_alloc(s);
    size_t tokens_per_step = (size_t)b.rows * b.T * (cfg->grad_accum > 1 ? cfg->grad_accum : 1);
    double step_seconds = 0.0;
    Window window = { wall_seconds(), 0 };
    int status = 0;
    float best_val = INFINITY;

    for (int iter = cfg->start_iter; iter <= cfg->iters; iter++) {
        result->iters_done = iter;
        /* every process stops at the same step, whichever caught the signal */
        int stop = stop_requested(cfg, result);
        int eval_now = iter == cfg->iters || (cfg->eval_every > 0 && iter % cfg->eval_every == 0);
        if (eval_now && cfg->eval_iters > 0 && !stop) {
            double t0 = wall_seconds();
            if ((status = eval_and_save(s, cfg, data, iter, result, &best_val)) != 0) break;
            window.start += wall_seconds() - t0;  /* evals do not count as step time */
            stop = stop_requested(cfg, result);  /* one that came in the evaluation or its save */
        }
        if (stop || iter == cfg->iters) {
            /* a stop saves the steps done since the start, unless the
             * evaluation just saved them; the end, every run's */
            if (cfg->out_dir && result->saved_at != iter && (iter > cfg->start_iter || !stop))
                status = save(s, cfg, data, iter, result);
            break;
        }

        double t0 = wall_seconds();
        if (cfg->trace) trace_record(cfg->trace, iter - cfg->start_iter < cfg->trace_steps);
        int verdict = 0;
        if (cfg->profile) profile_step_begin(cfg->profile);
        if ((status = train_step(s, cfg, data, &b, iter, result, &verdict)) != 0) break;
        if (cfg->profile) profile_step_end(cfg->profile);
        if (cfg->trace) trace_record(cfg->trace, 0);
        step_seconds += wall_seconds() - t0;
        window.steps++;
        /* a skipped step has said so, and has no loss to log */
        if (verdict == 0 && cfg->log_every > 0 && (iter % cfg->log_every == 0 || iter == cfg->iters - 1))
            log_progress(cfg, result, iter, s->lr, tokens_per_step, &window);
    }
    result->seconds = step_seconds;
    if (status == 0 && !stop_requested(cfg, result) && cfg->sample_chars > 0) sample_text(s, cfg, data, result);
    flush_output(cfg, result);
    /* a signal's stop is said by the caller, a failed write here */
    if (status == 0 && output_failed(result) && !result->stopped_by) status = report_failed_output(cfg, result);
    batch_free(&b);
    return status;
}
