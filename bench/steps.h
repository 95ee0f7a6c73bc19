/* steps.h: timing a strategy's training steps, for the benchmarks, and what
 * the benches that train (bench_overlap, bench_units) start from. */
#ifndef ZF_BENCH_STEPS_H
#define ZF_BENCH_STEPS_H

#include "../training/trainer.h"
#include "../tools/options.h"

/* The training batch of `step` (rows x T), or the run ends with the data's line. */
void bench_batch(const Dataset *data, uint32_t step, int rows, int T, int *x, int *y);
/* Wall ms of training step `step` (forward, backward, clipping, AdamW, and the
 * loss read back, which waits for it all) on that step's training batch. */
double step_ms(Strategy *s, const Dataset *data, uint32_t step, float lr, float grad_clip);

/* Median ms of `steps` such steps after three untimed ones. */
double median_step_ms(Strategy *s, const Dataset *data, int steps, float lr, float grad_clip);

/* A bench's start: its flags over the char-small preset (--iters is the timed
 * steps, `iters` when the preset's count is left), then the data. Returns -1
 * to go on, or the status to exit with (0 after --help, 2 for a bad flag, 1
 * when the data cannot be read, said in one line). */
int bench_open(const char *prog, int iters, int argc, char **argv, TrainOptions *o, Dataset *data);

/* The strategy config of the model the flags make on nranks ranks, overlap on,
 * over the --link if one is given. Simulated ranks keep to cores of their own,
 * so that they progress alike, as devices, whatever link a bench then sets. */
StrategyConfig bench_config(const TrainOptions *o, const Dataset *data, int nranks);

/* The q-quantile (0..1) of n values, the nearest one in rank (sorts them). */
double quantile(double *values, int n, double q);

/* The median of n values (sorts them). */
double median(double *values, int n);

#endif
