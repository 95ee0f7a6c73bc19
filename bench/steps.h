/* steps.h: timing a strategy's training steps, for the benchmarks. */
#ifndef ZF_BENCH_STEPS_H
#define ZF_BENCH_STEPS_H

#include "../strategies/trainer.h"

/* Wall ms of training step `step` (forward, backward, clipping, AdamW, and the
 * loss read back, which waits for it all) on that step's training batch. */
double step_ms(Strategy *s, const Dataset *data, uint32_t step, float lr, float grad_clip);

/* Median ms of `steps` such steps after three untimed ones. */
double median_step_ms(Strategy *s, const Dataset *data, int steps, float lr, float grad_clip);

/* The q-quantile (0..1) of n values, the nearest one in rank (sorts them). */
double quantile(double *values, int n, double q);

/* The median of n values (sorts them). */
double median(double *values, int n);

#endif
