/* trainer.c: the loop of trainer.h, as nanoGPT's train.py runs it. */
#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../model/sample.h"
#include "../runtime/host.h"
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

float evaluate(Strategy *s, const Dataset *data, int split, int eval_iters) {
    HostBatch b = batch_alloc(s);
    double total = 0.0;
    for (int i = 0; i < eval_iters; i++) {
        dataset_batch(data, split, BATCH_EVAL, s->cfg.seed, (uint32_t)i, 0, b.rows, b.T, b.x, b.y);
        total += s->ops->eval_loss(s, b.x, b.y);
    }
    batch_free(&b);
    return (float)(total / eval_iters);
}

static void format_eta(double seconds, char *buf, size_t len) {
    long t = (long)(seconds + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ldh%02ldm", t / 3600, t / 60 % 60);
    else if (t >= 60) snprintf(buf, len, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, len, "%lds", t);
}

/* Write text as a JSON string (quotes and escapes included). */
static void json_string(FILE *f, const unsigned char *text, int n) {
    fputc('"', f);
    for (int i = 0; i < n; i++) {
        unsigned char c = text[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void sample_text(Strategy *s, const TrainConfig *cfg, const Dataset *data) {
    int n = cfg->sample_chars;
    int *tokens = host_calloc((size_t)n + 1, sizeof(int));
    unsigned char *text = host_calloc((size_t)n + 1, 1);
    /* nanoGPT's sample.py starts from a newline; any first token will do otherwise */
    tokens[0] = data->stoi['\n'] >= 0 ? data->stoi['\n'] : 0;
    if (s->ops->generate(s, tokens, 1, n, (Sampling){ 1.0f, 0, s->cfg.seed }) != 0) n = 0;  /* not a GPT */
    for (int i = 0; i < n; i++) text[i] = data->itos[tokens[i + 1]];
    if (cfg->out && n > 0) {
        fprintf(cfg->out, "sample:\n%.*s\n", n, (const char *)text);
        fflush(cfg->out);
    }
    if (cfg->log && n > 0) {
        fputs("{\"sample\": ", cfg->log);
        json_string(cfg->log, text, n);
        fputs("}\n", cfg->log);
    }
    free(tokens);
    free(text);
}

/* DIR/ckpt.safetensors, as of `iter` steps done. */
static int save(Strategy *s, const TrainConfig *cfg, const Dataset *data, int iter) {
    CheckpointInfo info = { .model = s->cfg.model, .iter = iter, .adam_step = s->adam_step, .seed = s->cfg.seed };
    memcpy(info.itos, data->itos, sizeof info.itos);
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/ckpt.safetensors", cfg->out_dir);
    if (checkpoint_save(s, path, &info, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return 1;
    }
    if (cfg->out) {
        fprintf(cfg->out, "saved %s (iter %d)\n", path, iter);
        fflush(cfg->out);
    }
    return 0;
}

int train_run(Strategy *s, const TrainConfig *cfg, const Dataset *data, TrainResult *result) {
    memset(result, 0, sizeof *result);
    HostBatch b = batch_alloc(s);
    int micros = cfg->grad_accum > 1 ? cfg->grad_accum : 1;
    size_t tokens_per_step = (size_t)b.rows * b.T * micros;
    double step_seconds = 0.0, window_start = wall_seconds();
    int window_steps = 0, status = 0;
    float best_val = INFINITY;

    for (int iter = cfg->start_iter; iter <= cfg->iters; iter++) {
        int eval_now = iter == cfg->iters || (cfg->eval_every > 0 && iter % cfg->eval_every == 0);
        if (eval_now && cfg->eval_iters > 0) {
            double t0 = wall_seconds();
            result->train_loss = evaluate(s, data, SPLIT_TRAIN, cfg->eval_iters);
            result->val_loss = evaluate(s, data, SPLIT_VAL, cfg->eval_iters);
            if (cfg->out) {
                fprintf(cfg->out, "eval iter %d: train loss %.4f, val loss %.4f\n",
                        iter, result->train_loss, result->val_loss);
                fflush(cfg->out);
            }
            if (cfg->log)
                fprintf(cfg->log, "{\"iter\": %d, \"train_loss\": %.6f, \"val_loss\": %.6f}\n",
                        iter, result->train_loss, result->val_loss);
            /* the end saves below, whatever its loss */
            if (cfg->out_dir && iter < cfg->iters && (cfg->always_save || result->val_loss < best_val) &&
                iter > cfg->start_iter && save(s, cfg, data, iter) != 0) {
                status = 1;
                break;
            }
            if (result->val_loss < best_val) best_val = result->val_loss;
            window_start += wall_seconds() - t0;  /* evals do not count as step time */
        }
        if (iter == cfg->iters) {
            if (cfg->out_dir) status = save(s, cfg, data, iter);
            break;
        }

        double t0 = wall_seconds();
        if (cfg->trace) trace_record(cfg->trace, iter - cfg->start_iter < cfg->trace_steps);
        float lr = lr_at(&cfg->schedule, iter);
        s->ops->set_lr(s, lr);
        double loss_sum = 0.0;
        for (int micro = 0; micro < micros && status == 0; micro++) {
            dataset_batch(data, SPLIT_TRAIN, BATCH_TRAIN, s->cfg.seed, (uint32_t)iter, micro * b.rows, b.rows, b.T,
                          b.x, b.y);
            if (s->ops->forward_backward(s, b.x, b.y, (uint32_t)iter, micro, micros) != 0) status = 1;
            else loss_sum += s->ops->train_loss(s);
        }
        if (status != 0) break;
        s->ops->clip_grads(s, cfg->grad_clip);
        s->ops->step(s);
        if (cfg->trace) trace_record(cfg->trace, 0);
        float loss = (float)(loss_sum / micros);
        step_seconds += wall_seconds() - t0;
        window_steps++;
        result->last_loss = loss;
        if (!isfinite(loss)) {
            fprintf(stderr, "error: the training loss is %s at iter %d; stopping\n",
                    isnan(loss) ? "NaN" : "infinite", iter);
            status = 1;
            break;
        }
        if (cfg->log_every > 0 && (iter % cfg->log_every == 0 || iter == cfg->iters - 1)) {
            double elapsed = wall_seconds() - window_start;
            double ms = 1000.0 * elapsed / window_steps;
            double tok_s = (double)tokens_per_step * window_steps / elapsed;
            char eta[32];
            format_eta(ms / 1000.0 * (cfg->iters - iter - 1), eta, sizeof eta);
            if (cfg->out) {
                fprintf(cfg->out, "iter %d: loss %.4f, lr %.2e, %.1f ms/iter, %.0f tok/s, eta %s\n",
                        iter, loss, lr, ms, tok_s, eta);
                fflush(cfg->out);
            }
            if (cfg->log)
                fprintf(cfg->log, "{\"iter\": %d, \"loss\": %.6f, \"lr\": %.6e, \"ms_per_iter\": %.3f, "
                        "\"tokens_per_s\": %.1f}\n", iter, loss, lr, ms, tok_s);
            window_start = wall_seconds();
            window_steps = 0;
        }
    }
    result->seconds = step_seconds;
    if (status == 0 && cfg->sample_chars > 0) sample_text(s, cfg, data);
    if (cfg->log) fflush(cfg->log);
    batch_free(&b);
    return status;
}
