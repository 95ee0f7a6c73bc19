/* test_trace.c: overlap, read from a trace of real steps on the CPU simulator.
 *
 * The overlap gates in test_strategies.c prove that overlap changes no bit;
 * they would pass as well if overlap were switched off. These read the trace
 * (runtime/trace.h) of three training steps over a slow modeled link and
 * check that the collectives really run under the compute when overlap is on,
 * and never when it is off. They assert orders in time, never durations: the
 * link is slow enough (a block's all-reduce takes milliseconds) that overlap,
 * when on, is plain on a loaded machine too; and with overlap off, every
 * collective waits for its producers and the compute waits for it, so no
 * collective overlaps its rank's compute, whatever the machine does.
 *
 * With overlap on, a collective starts when the last rank has produced its
 * inputs, and that rank goes on computing under it. A rank ahead of the others
 * may have no compute left by then: under ASan on a loaded machine, rank 0
 * had no reduce-scatter under its compute in any of the three steps while
 * rank 1 had. So the overlap is asserted on some rank (the last to arrive,
 * whichever that is); with overlap off no rank has it.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../model/gpt.h"
#include "../runtime/trace.h"
#include "../strategies/buckets.h"
#include "../training/trainer.h"
#include "fixtures.h"
#include "reference.h"

static Dataset data;

static void setup(void) {
    char err[256];
    cr_assert_eq(dataset_load(&data, "data/tinyshakespeare.txt", 64, err, sizeof err), 0, "%s", err);
}

static void teardown(void) { dataset_free(&data); }

TestSuite(trace, .init = setup, .fini = teardown);

enum { RANKS = 2, STEPS = 3 };
enum { COMPUTE = 0, COMM = 1 };  /* a rank's two rows in a trace: its streams */
static const double EPS_US = 5e-4;  /* half a nanosecond: the file's ts and dur are whole ns */

/* The trace of STEPS training steps of a --zero stage on RANKS simulated ranks:
 * four blocks 64 wide, DDP buckets of 8 KB (a tensor or two), a link of 0.01 GB/s:
 * slow, so that a collective's hold is long beside a thread's late wake-up on a
 * busy machine (at 0.05 GB/s the link-model checks read x1.3 to x1.7 of the
 * model on an idle but noisy one). */
static StrategyConfig traced_config(int overlap, DType reduce) {
    return (StrategyConfig){
        .model = { data.vocab, 64, 4, 2, 64, MODEL_GPT, 0, 0 }, .nranks = RANKS, .batch = 8, .seed = 1,
        .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f, .reduce_precision = reduce,
        .overlap = { .enabled = overlap, .bucket_bytes = 8 << 10 }, .link = { 0.01, 20 },
    };
}

/* The trace of STEPS steps of a --zero stage under sc. */
static TraceSpan *trace_of(int zero, StrategyConfig sc, int *n) {
    Trace *t = trace_create(1 << 16);
    sc.diagnostics.trace = t;
    TrainConfig tc = {
        .iters = STEPS, .schedule = { 1e-3f, 1e-4f, 1, STEPS }, .grad_clip = 1.0f, .trace = t, .trace_steps = STEPS,
    };
    size_t floats;
    float *w = train_weights(zero, &sc, &tc, &data, &floats);
    cr_assert_not_null(w, "--zero=%d failed", zero);
    free(w);
    char path[64], err[512];
    snprintf(path, sizeof path, "/tmp/zf_trace_%d.json", (int)getpid());
    cr_assert_eq(trace_write(t, path, err, sizeof err), 0, "%s", err);
    trace_destroy(t);
    TraceSpan *spans = trace_read_spans(path, n, err, sizeof err);
    cr_assert_not_null(spans, "%s", err);
    unlink(path);
    return spans;
}

static TraceSpan *trace_steps(int zero, int overlap, DType reduce, int *n) {
    return trace_of(zero, traced_config(overlap, reduce), n);
}

static int overlap_in_time(const TraceSpan *a, const TraceSpan *b) {
    return a->ts < b->ts + b->dur - EPS_US && b->ts < a->ts + a->dur - EPS_US;
}

static int named(const TraceSpan *s, const char *prefix) { return strncmp(s->name, prefix, strlen(prefix)) == 0; }

/* Does a span of rank's comm stream named `collective...` overlap a span of its compute stream? */
static int collective_under_compute(const TraceSpan *spans, int n, int rank, const char *collective) {
    for (int i = 0; i < n; i++) {
        if (spans[i].pid != rank || spans[i].tid != COMM || !named(&spans[i], collective)) continue;
        for (int j = 0; j < n; j++)
            if (spans[j].pid == rank && spans[j].tid == COMPUTE && overlap_in_time(&spans[i], &spans[j])) return 1;
    }
    return 0;
}

static int by_start(const void *a, const void *b) {
    double x = ((const TraceSpan *)a)->ts, y = ((const TraceSpan *)b)->ts;
    return (x > y) - (x < y);
}

/* rank's units' forwards and backwards on its compute stream, in time order
 * (malloc'd, *m of them). */
static TraceSpan *units_of(const TraceSpan *spans, int n, int rank, int *m) {
    TraceSpan *units = calloc((size_t)n, sizeof *units);
    *m = 0;
    for (int i = 0; i < n; i++)
        if (spans[i].pid == rank && spans[i].tid == COMPUTE && (named(&spans[i], "forward") || named(&spans[i], "backward")))
            units[(*m)++] = spans[i];
    qsort(units, (size_t)*m, sizeof *units, by_start);
    return units;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Rank 0's collectives' time on the link in a trace: the least of the steps'.
 * A step starts with its first unit's forward on rank 0's compute stream. The
 * least, since a thread woken late, on two cores shared by every rank's
 * threads, only ever adds (measured: one step in three at x1.4 to x1.6 of the
 * model on an idle machine, the others near it); a model that missed or
 * doubled a collective is off in every step. */
static double held_us_a_step(const TraceSpan *spans, int n) {
    int m;
    TraceSpan *units = units_of(spans, n, 0, &m);
    double starts[STEPS], held_us[STEPS] = { 0 };
    int steps = 0;
    for (int i = 0; i < m; i++)
        if (named(&units[i], "forward") && (i == 0 || named(&units[i - 1], "backward"))) {
            cr_assert_lt(steps, STEPS, "more steps than %d in the trace", STEPS);
            starts[steps++] = units[i].ts;
        }
    free(units);
    cr_assert_eq(steps, STEPS, "%d steps in a trace of %d", steps, STEPS);
    for (int i = 0; i < n; i++) {
        if (spans[i].pid != 0 || spans[i].tid != COMM) continue;
        int step = 0;
        while (step + 1 < STEPS && spans[i].ts >= starts[step + 1]) step++;
        held_us[step] += spans[i].dur;
    }
    qsort(held_us, STEPS, sizeof(double), by_value);
    return held_us[0];
}

/* Does a `collective` start on rank's comm stream inside one of its backward
 * passes: after the first unit's backward starts, before the last one's ends? */
static int starts_inside_a_backward(const TraceSpan *spans, int n, int rank, const char *collective) {
    int m;
    TraceSpan *units = units_of(spans, n, rank, &m);
    int found = 0;
    for (int i = 0; i < m && !found; i++) {
        if (!named(&units[i], "backward") || (i > 0 && named(&units[i - 1], "backward"))) continue;
        int last = i;  /* the backward's units run from i to last */
        while (last + 1 < m && named(&units[last + 1], "backward")) last++;
        double begin = units[i].ts, end = units[last].ts + units[last].dur;
        for (int k = 0; k < n && !found; k++)
            found = spans[k].pid == rank && spans[k].tid == COMM && named(&spans[k], collective) &&
                    spans[k].ts > begin + EPS_US && spans[k].ts < end - EPS_US;
    }
    free(units);
    return found;
}

/* How many ranks a check of one rank's `collective...` (collective_under_compute,
 * starts_inside_a_backward) holds on. */
static int ranks_where(int (*holds)(const TraceSpan *, int, int, const char *), const TraceSpan *spans, int n,
                       const char *collective) {
    int ranks = 0;
    for (int r = 0; r < RANKS; r++) ranks += holds(spans, n, r, collective);
    return ranks;
}

static int distinct_names(const TraceSpan *spans, int n, const char *prefix) {
    int count = 0;
    for (int i = 0; i < n; i++) {
        if (!named(&spans[i], prefix)) continue;
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = strcmp(spans[j].name, spans[i].name) == 0;
        count += !seen;
    }
    return count;
}

Test(trace, ddp_all_reduces_buckets_under_the_backward, .timeout = 300) {
    int n;
    TraceSpan *spans = trace_steps(0, 1, DTYPE_FP32, &n);
    cr_expect_gt(distinct_names(spans, n, "all-reduce bucket"), 1, "DDP all-reduced a single bucket");
    cr_expect_gt(ranks_where(starts_inside_a_backward, spans, n, "all-reduce bucket"), 0,
                 "on no rank did a bucket's all-reduce start before its backward was over");
    free(spans);
}

/* PyTorch's buckets are made of tensors: with buckets smaller than a block,
 * each block's larger matrices are buckets of their own, whatever --unit is
 * (here whole blocks: 5 units). DDP all-reduces exactly the buckets of its
 * plan (strategies/buckets.h, whose every bucket test_strategies holds to
 * PyTorch's rule), more than units could make. */
Test(trace, ddp_buckets_are_made_of_tensors, .timeout = 300) {
    int n;
    TraceSpan *spans = trace_steps(0, 1, DTYPE_FP32, &n);
    ArenaLayout layout;
    gpt_layout(&(ModelConfig){ data.vocab, 64, 4, 2, 64, MODEL_GPT, 0, 0 }, RANKS, &layout);
    BucketSpan plan[ARENA_MAX_TENSORS];
    int buckets = distinct_names(spans, n, "all-reduce bucket"), blocks = 4;
    int planned = ddp_plan_buckets(&layout, 8 << 10, 1, plan);
    cr_expect_eq(buckets, planned, "DDP all-reduced %d buckets, and its plan has %d", buckets, planned);
    cr_expect_geq(buckets, 4 * blocks, "DDP all-reduced %d buckets: not a bucket for each of a block's 4 matrices",
                  buckets);
    free(spans);
}

/* In fp32, and with the gradients held in bf16 (bf16 compute, reduced in
 * bf16), whose reduce-scatters take a path of their own. */
Test(trace, zero2_and_zero3_reduce_scatter_under_the_compute, .timeout = 300) {
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        if (!STRATEGIES[k].shards_grads) continue;
        int zero = STRATEGIES[k].stage;
        for (int held = 0; held < 2; held++) {
            StrategyConfig sc = traced_config(1, held ? DTYPE_BF16 : DTYPE_FP32);
            if (held) sc.precision = DTYPE_BF16;
            int n;
            TraceSpan *spans = trace_of(zero, sc, &n);
            cr_expect_gt(ranks_where(collective_under_compute, spans, n, "reduce-scatter unit"), 0,
                         "--zero=%d, gradients held in %s: on no rank did a reduce-scatter run under the compute",
                         zero, held ? "bf16" : "fp32");
            free(spans);
        }
    }
}

Test(trace, zero3_prefetches_gathers_under_the_compute, .timeout = 300) {
    int n;
    TraceSpan *spans = trace_steps(3, 1, DTYPE_FP32, &n);
    cr_expect_gt(ranks_where(collective_under_compute, spans, n, "all-gather prefetch unit"), 0,
                 "on no rank did a prefetched gather run under the compute");
    free(spans);
}

/* Overlap off, and ZeRO-1, which never overlaps: not a single collective of
 * any kind runs under its rank's compute. */
Test(trace, without_overlap_no_collective_runs_under_the_compute, .timeout = 300) {
    static const struct { int zero, overlap; } runs[] = { { 0, 0 }, { 1, 0 }, { 1, 1 }, { 2, 0 }, { 3, 0 } };
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        int n;
        TraceSpan *spans = trace_steps(runs[k].zero, runs[k].overlap, DTYPE_FP32, &n);
        int collectives = 0;
        for (int i = 0; i < n; i++) collectives += spans[i].tid == COMM;
        cr_expect_gt(collectives, 0, "--zero=%d: no collective traced", runs[k].zero);
        for (int r = 0; r < RANKS; r++)
            cr_expect(!collective_under_compute(spans, n, r, ""), "--zero=%d --overlap=%d rank %d: a collective ran "
                      "under the compute", runs[k].zero, runs[k].overlap, r);
        free(spans);
    }
}

/* The registry's cost model (StrategyKind.link_cost) against the link's
 * hold in the trace: with overlap off, rank 0's collectives of the median
 * step, from the end of their waits to the end of the link's hold, take the
 * model's time and a little more (the sums' own work, and a sleep's
 * lateness), never less: a model that missed a collective, or counted one
 * twice, is off by a third or more. With the gradients reduced in bf16 too,
 * where DDP's all-reduce holds the link about half as long as in fp32. */
Test(trace, each_strategys_link_model_is_what_its_collectives_hold_the_link, .timeout = 300) {
    double ddp_held_us[DTYPES] = { 0 };
    for (int p = 0; p < DTYPES; p++)
        for (int k = 0; k < STRATEGY_KINDS; k++) {
            const StrategyKind *kind = &STRATEGIES[k];
            int n;
            TraceSpan *spans = trace_steps(kind->stage, 0, (DType)p, &n);
            double held_us = held_us_a_step(spans, n);
            StrategyConfig sc = traced_config(0, (DType)p);
            double model_us = 1e6 * kind->link_cost(&sc, 1).seconds, ratio = held_us / model_us;
            cr_expect(ratio > 0.99 && ratio < 1.3, "%s, reduced in %s: the link held %.0f us a step, the model says "
                      "%.0f us (x%.3f)", kind->name, p ? "bf16" : "fp32", held_us, model_us, ratio);
            if (kind->stage == 0) ddp_held_us[p] = held_us;
            free(spans);
        }
    double half = ddp_held_us[DTYPE_BF16] / ddp_held_us[DTYPE_FP32];
    cr_expect(half > 0.4 && half < 0.6, "DDP's all-reduce in bf16 held the link x%.3f of fp32's time, not half", half);
}

/* Computing in bf16, ZeRO-3's gathers carry the bf16 compute copy: its link
 * model charges a unit's two gathers half the bytes and its reduce-scatter
 * fp32's, about 2/3 of the fp32 step's cost; the other stages' gathers stay
 * fp32 and their costs are fp32's. The model, not a timing: the link's hold
 * under load drifts by as much as this parts them. */
Test(trace, bf16_copies_take_the_gathers_link_cost_down) {
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        const StrategyKind *kind = &STRATEGIES[k];
        StrategyConfig sc = traced_config(0, DTYPE_FP32);
        double fp32 = kind->link_cost(&sc, 1).seconds;
        sc.precision = DTYPE_BF16;
        double ratio = kind->link_cost(&sc, 1).seconds / fp32;
        /* an fp32 reduce-scatter beside gathers at half the bytes: ZeRO-3's two a unit, ZeRO-1/2's one; DDP none */
        double want = kind->shards_weights ? 2.0 / 3.0 : kind->shards_adam ? 3.0 / 4.0 : 1.0;
        cr_expect(ratio > want - 0.06 && ratio <= want + 0.04, "%s computing in bf16: x%.3f of fp32's link cost, "
                  "want about x%.3f", kind->name, ratio, want);
    }
}

/* The same under hybrid sharding on a two-tier link: 4 ranks in 2 groups (the
 * nodes), a slower link between them. Each ZeRO stage's collectives hold the
 * link for what the registry's model says, the chain between the groups
 * included, never less and under 1.3 times it. */
Test(trace, the_link_model_holds_under_hybrid_sharding_on_two_tiers, .timeout = 300) {
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        const StrategyKind *kind = &STRATEGIES[k];
        if (!kind->shards_adam) continue;
        StrategyConfig sc = traced_config(0, DTYPE_FP32);
        sc.nranks = 4;
        sc.shard_ranks = 2;
        sc.link_inter = (LinkModel){ 0.004, 40 };
        int n;
        TraceSpan *spans = trace_of(kind->stage, sc, &n);
        double held_us = held_us_a_step(spans, n), model_us = 1e6 * kind->link_cost(&sc, 1).seconds;
        cr_expect(model_us > 1e6 * kind->link_cost(&(StrategyConfig){ .model = sc.model, .nranks = 4,
                                                                     .shard_ranks = 2, .link = sc.link }, 1).seconds,
                  "%s: the slower tier between the groups costs nothing in the model", kind->name);
        cr_expect(held_us / model_us > 0.99 && held_us / model_us < 1.3, "%s, 2 groups of 2 on two tiers: the link "
                  "held %.0f us a step, the model says %.0f us (x%.3f)", kind->name, held_us, model_us,
                  held_us / model_us);
        free(spans);
    }
}
