/* bench_overlap.c: what overlapping the collectives buys.
 *
 * For DDP and ZeRO-1, 2 and 3 on N = 1, 2 and 4 ranks, the ms of a training
 * step three ways, a turn of two steps of each in turn (the second timed, as
 * a step of a run starts, with what the one before left in flight): with no
 * modeled link (every collective free: the baseline), and over the modeled
 * link with overlap off and on; then ZeRO-3 at N = 4 with one more live unit.
 * Every collective the link charges counts as communication: the gradients'
 * all-reduces and reduce-scatters, and the weights' all-gathers (ZeRO-1/2
 * after the step, ZeRO-3 around each unit). Then per row, from the
 * steps paired by index (turn i of each variant ran side by side):
 *   comm     = median of (step without overlap - baseline step)
 *   model    = what the ring cost model predicts for the collectives of the
 *              step without overlap
 *   exposed  = median of (the row's step - baseline step)
 *   hidden   = 1 - exposed (overlap on) / comm, shown within 0..100% (noise marked)
 * Each ms/step and comm comes with its quartiles; a comm more than 15% from
 * its model is marked, and the notes say why. Simulated ranks share one
 * device: their compute shares it, and only the link is modeled.
 *
 * Without --link, the link is chosen so that DDP's all-reduce at N = 4 takes
 * as long as its backward: a forward and backward less a forward, timed in
 * turn, the fastest of each.
 * Writes the table as Markdown on stdout and as CSV to --log (if given), and
 * with --trace=PATH a Chrome trace of one more turn (two steps) of every
 * variant, untimed (processes "ZeRO-3 N=4 overlap on rank 2", ...).
 *
 * With --link-inter (and --link, --shard-ranks=S, --gpus=N): the two-tier
 * table instead, N ranks as nodes of S on a link of two tiers, ZeRO-3 fully
 * sharded (its rings span the nodes) against hybrid sharding in groups of S
 * (one a node), the same three variants: what each moves between the nodes a
 * step (the model's bytes), its comm against the model, and what overlap hid.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_setup.h"
#include "../model/models.h"
#include "../runtime/host.h"
#include "../runtime/trace.h"
#include "../tools/options.h"
#include "steps.h"

enum { TRACE_MAX_SPANS = 1 << 18 };

enum { FREE, OFF, ON, VARIANTS };  /* no modeled link (overlap on); the link, overlap off; overlap on */

/* The median of some ms and their quartiles. */
typedef struct { double median, lo, hi; } Spread;

/* One strategy at N ranks: each variant's ms/step, and the differences to the
 * free-link step of the same index without overlap (comm) and with (exposed). */
typedef struct { Spread step[VARIANTS], comm, exposed; } Times;

static Spread spread(double *ms, int n) {
    return (Spread){ median(ms, n), quantile(ms, n, 0.25), quantile(ms, n, 0.75) };
}

/* How the ranks shard and the link's tiers: hybrid sharding's groups (0: full
 * sharding), and a second tier between nodes of node_ranks (inter.gbps 0: none). */
typedef struct {
    int shard_ranks, node_ranks;
    LinkModel inter;
} Tiers;

static const Tiers ONE_TIER = { 0, 0, { 0, 0 } };

static Strategy *make(int zero, int nranks, const TrainOptions *o, const Dataset *data, int overlap, int sync,
                      LinkModel link, Tiers tiers, Trace *trace, const char *trace_label) {
    StrategyConfig sc = bench_config(o, data, nranks);
    sc.overlap.enabled = overlap;
    sc.link = link;
    sc.shard_ranks = tiers.shard_ranks;
    sc.node_ranks = tiers.node_ranks;
    sc.link_inter = link.gbps > 0 ? tiers.inter : (LinkModel){ 0 };
    sc.diagnostics.trace = trace;
    sc.diagnostics.trace_label = trace_label;
    Strategy *s = strategy_create(zero, &sc);
    if (!s) exit(1);
    s->sync_grads = sync;
    return s;
}

/* The three variants side by side, a turn of each in turn, so that the
 * machine's drift touches all three alike. A turn is two steps, the second
 * timed: it starts as a step of a run does, with what the one before left in
 * flight (ZeRO-2's weight gathers run under the next forward), and the turn
 * ends once its collectives are done, so that none runs on under another
 * variant's steps. With a trace, one more turn of each, recorded, not timed. */
static Times time_variants(const StrategyKind *kind, int nranks, const TrainOptions *o, const Dataset *data, LinkModel link,
                           Tiers tiers, Trace *trace) {
    enum { WARMUP = 2 };
    static const char *variant[VARIANTS] = { [FREE] = "free link", [OFF] = "overlap off", [ON] = "overlap on" };
    int n = o->iters;
    Strategy *s[VARIANTS];
    for (int v = 0; v < VARIANTS; v++) {
        char label[64];
        snprintf(label, sizeof label, "%s N=%d %s", kind->name, nranks, variant[v]);
        s[v] = make(kind->stage, nranks, o, data, v != OFF, 1, v != FREE ? link : (LinkModel){ 0 }, tiers, trace,
                    label);
    }
    double *ms[VARIANTS], *comm = host_calloc(n, sizeof(double)), *exposed = host_calloc(n, sizeof(double));
    for (int v = 0; v < VARIANTS; v++) ms[v] = host_calloc(n, sizeof(double));
    int traced = WARMUP + n;  /* the turn recorded, if any */
    for (int i = 0; i < traced + (trace != NULL); i++)
        for (int v = 0; v < VARIANTS; v++) {
            if (trace) trace_record(trace, i == traced);
            step_ms(s[v], data, (uint32_t)(2 * i), o->lr, o->grad_clip);
            double t = step_ms(s[v], data, (uint32_t)(2 * i + 1), o->lr, o->grad_clip);
            s[v]->ops->synchronize(s[v]);
            if (i >= WARMUP && i < traced) ms[v][i - WARMUP] = t;
        }
    if (trace) trace_record(trace, 0);
    for (int i = 0; i < n; i++) {
        comm[i] = ms[OFF][i] - ms[FREE][i];
        exposed[i] = ms[ON][i] - ms[FREE][i];
    }
    Times t = { .comm = spread(comm, n), .exposed = spread(exposed, n) };
    for (int v = 0; v < VARIANTS; v++) {
        t.step[v] = spread(ms[v], n);
        s[v]->ops->destroy(s[v]);
        free(ms[v]);
    }
    free(comm);
    free(exposed);
    return t;
}

/* DDP's backward at N ranks, in ms: a forward and backward (gradient sync off)
 * less a forward (evaluation's), each the fastest of runs taken in turn, as
 * other jobs on the machine only ever add time (a median chose a link half as
 * fast once, when a slow spell took most of the runs); *median_ms gets the
 * same from the medians. */
static double backward_ms(int nranks, const TrainOptions *o, const Dataset *data, double *median_ms) {
    enum { REPS = 9 };
    Strategy *s = make(0, nranks, o, data, 0, 0, (LinkModel){ 0 }, ONE_TIER, NULL, NULL);
    int rows = s->cfg.batch * nranks, T = s->cfg.model.block_size;
    int *x = host_calloc(rows * T, sizeof(int)), *y = host_calloc(rows * T, sizeof(int));
    bench_batch(data, 0, rows, T, x, y);
    double both[REPS], forward[REPS];
    for (int i = 0; i < REPS; i++) {
        double t = wall_seconds();
        if (s->ops->forward_backward(s, x, y, 0, 0, 1) != 0) exit(1);
        s->ops->train_loss(s);
        both[i] = 1e3 * (wall_seconds() - t);
        t = wall_seconds();
        s->ops->eval_loss(s, x, y);
        forward[i] = 1e3 * (wall_seconds() - t);
    }
    s->ops->destroy(s);
    free(x);
    free(y);
    *median_ms = median(both, REPS) - median(forward, REPS);
    return quantile(both, REPS, 0.0) - quantile(forward, REPS, 0.0);
}

/* The share of comm that overlap hid, as measured, within 0..100%: noise (the
 * quartiles) can push the measure past either end, and then the share is the
 * end it passed, marked as noise (the exposed column keeps the measure). */
static void hidden_text(char *out, size_t len, int nranks, const Times *t, int overlap) {
    if (nranks == 1 || t->comm.median <= 0) {
        snprintf(out, len, "-");
        return;
    }
    double exposed = overlap ? t->exposed.median : t->comm.median, hidden = 100.0 * (1.0 - exposed / t->comm.median);
    int noise = hidden < -0.5 || hidden > 100.5;
    hidden = hidden < 0.0 ? 0.0 : (hidden > 100.0 ? 100.0 : hidden);
    snprintf(out, len, "%.0f%%%s", hidden, noise ? " (noise)" : "");
}

/* The two-tier table (--link-inter): --zero's stage on --gpus=N ranks as
 * nodes of --shard-ranks=S, fully sharded (its rings span the nodes) and in
 * groups of S (one a node), the main table's variants for each. */
static int two_tiers(const TrainOptions *o, const Dataset *data, const CpuSetup *cpu) {
    LinkModel intra = options_link(o), inter = options_link_inter(o);
    int N = o->gpus, S = o->shard_ranks;
    const StrategyKind *kind = strategy_kind(o->zero);
    if (intra.gbps <= 0 || !kind->shards_adam || S < 1 || S >= N) {
        fprintf(stderr, "bench_overlap: --link-inter compares a ZeRO stage fully sharded and in groups: it needs "
                        "--link, --zero=1, 2 or 3, --gpus=N and --shard-ranks=S (S dividing N, fewer)\n");
        return 2;
    }
    cpu_setup_print(cpu);
    printf("link: two tiers, modeled: %.3g GB/s and %g us a hop inside each node of %d ranks, %.3g GB/s and %g us "
           "between the %d nodes\n", intra.gbps, intra.latency_us, S, inter.gbps, inter.latency_us, N / S);
    printf("model: preset %s, %d layers, %d wide, block %d, batch %d per rank; %s on %d ranks; computing in %s, "
           "gradients reduced in %s; median of %d steps per variant, each the second of a turn of two\n\n",
           o->preset, o->layers, o->embd, o->block, o->batch, kind->name, N, o->dtype, o->reduce_dtype, o->iters);
    printf("| sharding | between nodes MB/step (model) | ms/step off (quartiles) | ms/step on (quartiles) | free link ms "
           "| comm ms (quartiles) | model ms | comm vs model | exposed ms | hidden |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int hybrid = 0; hybrid <= 1; hybrid++) {
        Tiers tiers = { hybrid ? S : 0, S, inter };
        Times t = time_variants(kind, N, o, data, intra, tiers, NULL);
        StrategyConfig linked = bench_config(o, data, N);
        linked.link = intra;
        linked.link_inter = inter;
        linked.shard_ranks = tiers.shard_ranks;
        linked.node_ranks = S;
        LinkCost model = kind->link_cost(&linked, o->grad_clip > 0);
        double apart = t.comm.median / (1e3 * model.seconds) - 1.0;
        char hidden[32], name[48];
        hidden_text(hidden, sizeof hidden, N, &t, 1);
        snprintf(name, sizeof name, hybrid ? "hybrid, groups of %d" : "full, over all %d", hybrid ? S : N);
        printf("| %s | %.2f | %.1f (%.1f-%.1f) | %.1f (%.1f-%.1f) | %.1f | %.1f (%.1f-%.1f) | %.1f | %+.0f%%%s | %.1f | "
               "%s |\n", name, model.inter_bytes / 1e6, t.step[OFF].median, t.step[OFF].lo, t.step[OFF].hi,
               t.step[ON].median, t.step[ON].lo, t.step[ON].hi, t.step[FREE].median, t.comm.median, t.comm.lo,
               t.comm.hi, 1e3 * model.seconds, 100.0 * apart, fabs(apart) > 0.15 ? " *" : "", t.exposed.median, hidden);
        fflush(stdout);
    }
    printf("\nbetween nodes = the bytes the step's collectives move over the slower tier, every rank's, by the link\n"
           "model (runtime/link_model.h): a ring that spans the nodes crosses between them once a node; hybrid\n"
           "sharding's chain carries each group's partial sums to the next group and the totals back. The other\n"
           "columns as in the one-tier table; * comm more than 15%% from the model.\n");
    return 0;
}

/* A strategy at N ranks timed (time_variants) and its two rows printed, the
 * overlap off and on, as Markdown and to the CSV (if any). */
static void time_rows(const StrategyKind *kind, const char *name, int N, const TrainOptions *o, const Dataset *data,
                      LinkModel link, Trace *trace, FILE *csv) {
    Times t = time_variants(kind, N, o, data, link, ONE_TIER, trace);
    StrategyConfig linked = bench_config(o, data, N);
    linked.link = link;
    double predicted = 1e3 * kind->link_cost(&linked, o->grad_clip > 0).seconds;
    char versus[16] = "-";
    double apart = predicted > 0 ? t.comm.median / predicted - 1.0 : 0.0;
    if (predicted > 0) snprintf(versus, sizeof versus, "%+.0f%%%s", 100.0 * apart, fabs(apart) > 0.15 ? " *" : "");
    for (int overlap = 0; overlap <= 1; overlap++) {
        Spread step = t.step[overlap ? ON : OFF];
        double exposed = overlap ? t.exposed.median : t.comm.median;
        char hidden[32];
        hidden_text(hidden, sizeof hidden, N, &t, overlap);
        printf("| %s | %d | %s | %.1f (%.1f-%.1f) | %.1f | %.1f (%.1f-%.1f) | %.1f | %s | %.1f | %s |\n", name, N,
               overlap ? "on" : "off", step.median, step.lo, step.hi, t.step[FREE].median, t.comm.median, t.comm.lo,
               t.comm.hi, predicted, versus, exposed, hidden);
        if (csv)
            fprintf(csv, "%s,%d,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f\n", name, N, overlap ? "on" : "off",
                    step.median, step.lo, step.hi, t.step[FREE].median, t.comm.median, t.comm.lo, t.comm.hi, predicted,
                    exposed, N > 1 && t.comm.median > 0 ? 1.0 - exposed / t.comm.median : 0.0);
        fflush(stdout);
    }
}

int main(int argc, char **argv) {
    const CpuSetup *cpu = cpu_setup(argv);
    TrainOptions o;
    Dataset data;
    int rc = bench_open("bench_overlap", 12, argc, argv, &o, &data);  /* --iters: timed turns per variant */
    if (rc >= 0) return rc;
    if (o.link_inter[0]) {
        rc = two_tiers(&o, &data, cpu);
        dataset_free(&data);
        return rc;
    }
    FILE *csv = NULL;
    if (o.log[0] && !(csv = fopen(o.log, "w"))) {
        fprintf(stderr, "bench_overlap: cannot write --log file '%s'\n", o.log);
        return 1;
    }
    FILE *trace_file = o.trace[0] ? fopen(o.trace, "w") : NULL;
    if (o.trace[0] && !trace_file) {
        fprintf(stderr, "bench_overlap: cannot write --trace file '%s'\n", o.trace);
        return 1;
    }
    if (trace_file) fclose(trace_file);
    Trace *trace = o.trace[0] ? trace_create(TRACE_MAX_SPANS) : NULL;
    ModelConfig model = options_model(&o, data.vocab);
    LinkModel link = options_link(&o);
    const char *chosen = "given by --link";
    if (link.gbps <= 0) {
        /* DDP at N = 4: its all-reduce as long as its backward */
        double median_ms, backward_s = backward_ms(4, &o, &data, &median_ms) / 1e3;
        link.latency_us = 20;
        ArenaLayout layout;
        model_layout(&model, 4, &layout);
        double transfer_s = ring_seconds((LinkModel){ 1.0, 0 }, 4, 1, layout.total, DTYPE_FP32);  /* at 1 GB/s, no latency */
        link.gbps = transfer_s / (backward_s - 3 * link.latency_us * 1e-6);
        static char why[200];
        snprintf(why, sizeof why, "chosen so that DDP's all-reduce at N = 4 takes as long as its backward, %.1f ms "
                 "(the fastest of 9; from the medians %.1f ms)", backward_s * 1e3, median_ms);
        chosen = why;
    }
    Strategy *probe = make(0, 4, &o, &data, 0, 1, (LinkModel){ 0 }, ONE_TIER, NULL, NULL);
    printf("device: %s; simulated ranks share it: their compute shares it, only the link is modeled\n",
           probe->placement);
    probe->ops->destroy(probe);
    cpu_setup_print(cpu);
    printf("link: modeled ring, %.3g GB/s, %g us per hop (%s)\n", link.gbps, link.latency_us, chosen);
    printf("model: preset %s, %d layers, %d wide, block %d, batch %d per rank; DDP buckets %g MB; ZeRO-2/3 with K = %d "
           "live units (--max-live-units); computing in %s, gradients reduced in %s; median of %d steps per variant, "
           "each the second of a turn of two\n\n", o.preset, o.layers, o.embd, o.block, o.batch, o.bucket_mb,
           o.max_live_units, o.dtype, o.reduce_dtype, o.iters);
    printf("| strategy | N | overlap | ms/step (quartiles) | free link ms | comm ms (quartiles) | model ms | "
           "comm vs model | exposed ms | hidden |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    if (csv)
        fprintf(csv, "strategy,ranks,overlap,ms_step,ms_q1,ms_q3,free_ms,comm_ms,comm_q1,comm_q3,model_ms,"
                     "exposed_ms,hidden\n");
    static const int ranks[3] = { 1, 2, 4 };
    for (int k = 0; k < STRATEGY_KINDS; k++)
        for (int i = 0; i < 3; i++) time_rows(&STRATEGIES[k], STRATEGIES[k].name, ranks[i], &o, &data, link, trace, csv);
    /* ZeRO-3 at N = 4 with one more unit live: the last K units of the forward
     * stay gathered for the backward, so one more buffer keeps the link busy at
     * the forward-to-backward turn (docs/overlap.md) */
    TrainOptions deeper = o;
    deeper.max_live_units = o.max_live_units + 1;
    char name[64];
    snprintf(name, sizeof name, "ZeRO-3 (K=%d)", deeper.max_live_units);
    if (deeper.max_live_units <= MAX_LIVE_UNITS) time_rows(strategy_kind(3), name, 4, &deeper, &data, link, trace, csv);
    printf("\nfree link = the same step with no modeled link (every collective free, overlap on): the baseline.\n"
           "comm = median over the steps of (step with overlap off - free-link step), every collective the link\n"
           "charges counted (gradients and the weights' gathers); model = the ring cost model's time for those\n"
           "collectives; exposed = median of (step - free-link step); hidden = 1 - exposed / comm. Quartiles in\n"
           "brackets. A measure past 0 or 100%% is noise: the share shows that end, marked so. ZeRO-1 does not overlap: its one\n"
           "reduce-scatter of the arena needs the whole backward. ZeRO-3 (K=%d): one unit more live than the others\n"
           "run with, so the last K units of the forward stay gathered into the backward.\n"
           "* comm more than 15%% from the model: the simulation, not the link, parts them. Without overlap every\n"
           "collective is a barrier, and ranks sharing the cores reach it apart: that wait counts as comm, not in\n"
           "the model (more barriers, more of it: ZeRO-2 and 3 have one a unit); the other way, the baseline runs\n"
           "the collectives' data movement on the shared cores, which over the link runs inside the link's hold.\n",
           deeper.max_live_units);
    if (csv) fclose(csv);
    dataset_free(&data);
    int status = 0;
    char err[512];
    if (trace && trace_write(trace, o.trace, err, sizeof err) != 0) {
        fprintf(stderr, "bench_overlap: %s\n", err);
        status = 1;
    } else if (trace) {
        printf("trace: one untimed turn of every variant, %zu spans, in %s\n", trace_spans(trace), o.trace);
    }
    trace_destroy(trace);
    return status;
}
