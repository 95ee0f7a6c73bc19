/* steps.c: timing training steps, and the benches' common start (steps.h). */
#include "steps.h"

#include <stdio.h>
#include <stdlib.h>

#include "../runtime/host.h"

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double quantile(double *values, int n, double q) {
    qsort(values, (size_t)n, sizeof *values, compare_doubles);
    return values[(int)(q * (n - 1) + 0.5)];
}

double median(double *values, int n) { return quantile(values, n, 0.5); }

void bench_batch(const Dataset *data, uint32_t step, int rows, int T, int *x, int *y) {
    char err[768];
    if (dataset_batch(data, SPLIT_TRAIN, BATCH_TRAIN, 1, step, 0, rows, T, x, y, err, sizeof err) == 0) return;
    fprintf(stderr, "bench: %s\n", err);
    exit(1);
}

double step_ms(Strategy *s, const Dataset *data, uint32_t step, float lr, float grad_clip) {
    int rows = s->cfg.batch * s->cfg.nranks, T = s->cfg.model.block_size;
    int *x = host_calloc(rows * T, sizeof(int)), *y = host_calloc(rows * T, sizeof(int));
    bench_batch(data, step, rows, T, x, y);
    double t = wall_seconds();
    s->ops->set_lr(s, lr);
    if (s->ops->forward_backward(s, x, y, step, 0, 1) != 0) exit(1);
    s->ops->clip_grads(s, grad_clip);
    s->ops->step(s);
    s->ops->train_loss(s);
    t = wall_seconds() - t;
    free(x);
    free(y);
    return 1000.0 * t;
}

double median_step_ms(Strategy *s, const Dataset *data, int steps, float lr, float grad_clip) {
    enum { WARMUP = 3 };
    double *ms = host_calloc(steps, sizeof(double));
    for (int i = 0; i < WARMUP + steps; i++) {
        double t = step_ms(s, data, (uint32_t)i, lr, grad_clip);
        if (i >= WARMUP) ms[i - WARMUP] = t;
    }
    double m = median(ms, steps);
    free(ms);
    return m;
}

int bench_open(const char *prog, int iters, int argc, char **argv, TrainOptions *o, Dataset *data) {
    int rc = options_parse(o, TOOL_BENCH, "char-small", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (o->iters > 50) o->iters = iters;  /* the preset's count of optimizer steps is far too many */
    char err[512];
    if (dataset_load(data, o->data, o->block, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 1;
    }
    return -1;
}

StrategyConfig bench_config(const TrainOptions *o, const Dataset *data, int nranks) {
    StrategyConfig sc = {
        .model = options_model(o, data->vocab),
        .nranks = nranks,
        .device = options_placement(o), .batch = o->batch, .dropout = o->dropout, .seed = 1, .beta1 = 0.9f,
        .beta2 = o->beta2, .eps = 1e-8f, .weight_decay = o->weight_decay, .precision = options_precision(o),
        .reduce_precision = options_reduce_precision(o), .overlap = options_overlap(o), .own_cores = 1,
        .link = options_link(o),
    };
    sc.overlap.enabled = 1;  /* the benches time overlap on; bench_overlap sets each variant's own */
    return sc;
}
