/* bench_overlap.c: what overlapping the gradient collectives buys.
 *
 * For DDP and ZeRO-1, 2 and 3 on N = 1, 2 and 4 ranks, over a modeled link,
 * the median ms of a training step three ways, a step of each in turn: with
 * the gradient collectives switched off (the no_sync probe: the compute-only
 * step), with them and overlap off, with them and overlap on. Then per row:
 *   comm     = step (overlap off) - compute-only step: the gradient sync's time
 *   model    = what the ring cost model predicts for those collectives
 *   exposed  = step - compute-only step, for the row's overlap setting
 *   hidden   = 1 - exposed / comm
 * The weights' all-gathers (ZeRO-1/2 after the step, ZeRO-3 around each unit)
 * run in every variant, so they count as compute here. Simulated ranks share
 * one device: their compute shares it, and only the link is modeled.
 *
 * Without --link, the link is chosen so that DDP's all-reduce at N = 4 takes
 * as long as its backward: a forward and backward less a forward, timed in turn.
 * Writes the table as Markdown on stdout and as CSV to --log (if given), and
 * with --trace=PATH a Chrome trace of one more step of every variant, untimed
 * (processes "ZeRO-3 N=4 overlap on rank 2", ...).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/blas_setup.h"
#include "../runtime/trace.h"
#include "../tools/options.h"
#include "steps.h"

enum { TRACE_MAX_SPANS = 1 << 18 };

static const char *NAMES[4] = { "DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3" };

typedef struct { double nosync, off, on; } Times;

static Strategy *make(int zero, int nranks, const TrainOptions *o, const Dataset *data, int overlap, int sync,
                      double gbps, double latency_us, Trace *trace, const char *trace_label) {
    StrategyConfig sc = {
        .model = { data->vocab, o->block, o->layers, o->heads, o->embd, MODEL_GPT }, .nranks = nranks,
        .device = options_placement(o), .batch = o->batch, .dropout = o->dropout, .seed = 1, .beta1 = 0.9f,
        .beta2 = o->beta2, .eps = 1e-8f, .weight_decay = o->weight_decay, .overlap = overlap,
        .bucket_bytes = (size_t)(o->bucket_mb * 1e6), .link_gbps = gbps, .link_latency_us = latency_us,
        .trace = trace, .trace_label = trace_label,
    };
    Strategy *s = strategy_create(zero, &sc);
    if (!s) exit(1);
    s->sync_grads = sync;
    return s;
}

/* The three variants side by side, a step of each in turn, so that the
 * machine's drift touches all three alike; the median of each. With a trace,
 * one more step of each, recorded, not timed. */
static Times time_variants(int zero, int nranks, const TrainOptions *o, const Dataset *data, double gbps,
                           double latency_us, Trace *trace) {
    enum { WARMUP = 2 };
    static const char *variant[3] = { "no sync", "overlap off", "overlap on" };
    Strategy *s[3];
    for (int v = 0; v < 3; v++) {
        char label[64];
        snprintf(label, sizeof label, "%s N=%d %s", NAMES[zero], nranks, variant[v]);
        s[v] = make(zero, nranks, o, data, v == 2, v > 0, gbps, latency_us, trace, label);
    }
    double *ms[3];
    for (int v = 0; v < 3; v++) ms[v] = malloc(sizeof(double) * o->iters);
    int traced = WARMUP + o->iters;  /* the step recorded, if any */
    for (int i = 0; i < traced + (trace != NULL); i++)
        for (int v = 0; v < 3; v++) {
            if (trace) trace_record(trace, i == traced);
            double t = step_ms(s[v], data, (uint32_t)i, o->lr, o->grad_clip);
            if (i >= WARMUP && i < traced) ms[v][i - WARMUP] = t;
        }
    if (trace) trace_record(trace, 0);
    Times t = { median(ms[0], o->iters), median(ms[1], o->iters), median(ms[2], o->iters) };
    for (int v = 0; v < 3; v++) {
        s[v]->ops->destroy(s[v]);
        free(ms[v]);
    }
    return t;
}

/* DDP's backward at N ranks, in ms: a forward and backward (gradient sync off)
 * less a forward (evaluation's), each the median of runs taken in turn. */
static double backward_ms(int nranks, const TrainOptions *o, const Dataset *data) {
    enum { REPS = 9 };
    Strategy *s = make(0, nranks, o, data, 0, 0, 0, 0, NULL, NULL);
    int rows = s->cfg.batch * nranks, T = s->cfg.model.block_size;
    int *x = malloc(sizeof(int) * rows * T), *y = malloc(sizeof(int) * rows * T);
    dataset_batch(data, SPLIT_TRAIN, BATCH_TRAIN, 1, 0, 0, rows, T, x, y);
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
    return median(both, REPS) - median(forward, REPS);
}

/* The ring model's ms for one step's gradient collectives, overlap off: one
 * all-reduce (DDP) or reduce-scatter (ZeRO-1) of the arena, or a
 * reduce-scatter per unit (ZeRO-2/3). */
static double model_ms(int zero, int nranks, const ModelConfig *model, double gbps, double latency_us) {
    ArenaLayout layout;
    model_layout(model, nranks, &layout);
    if (zero <= 1) return 1e3 * ring_seconds(gbps, latency_us, nranks, zero == 0, layout.total);
    double total = 0;
    for (int u = 0; u < layout.nunits; u++) total += ring_seconds(gbps, latency_us, nranks, 0, layout.units[u].size);
    return 1e3 * total;
}

int main(int argc, char **argv) {
    const char *blas = blas_ensure_core(argv);
    TrainOptions o;
    int rc = options_parse(&o, "bench_overlap", "char-small", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    if (o.iters > 50) o.iters = 12;  /* --iters is the timed steps per variant; the preset's count is far too many */
    Dataset data;
    char err[512];
    if (dataset_load(&data, o.data, o.block, err, sizeof err) != 0) {
        fprintf(stderr, "bench_overlap: %s\n", err);
        return 1;
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
    ModelConfig model = { data.vocab, o.block, o.layers, o.heads, o.embd, MODEL_GPT };
    double gbps, latency_us;
    options_link(&o, &gbps, &latency_us);
    const char *chosen = "given by --link";
    if (gbps <= 0) {
        /* DDP at N = 4: its all-reduce as long as its backward */
        double backward_s = backward_ms(4, &o, &data) / 1e3;
        latency_us = 20;
        ArenaLayout layout;
        model_layout(&model, 4, &layout);
        double transfer_s = ring_seconds(1.0, 0, 4, 1, layout.total);  /* at 1 GB/s, no latency */
        gbps = transfer_s / (backward_s - 3 * latency_us * 1e-6);
        static char why[160];
        snprintf(why, sizeof why, "chosen so that DDP's all-reduce at N = 4 takes as long as its backward, %.1f ms",
                 backward_s * 1e3);
        chosen = why;
    }
    Strategy *probe = make(0, 4, &o, &data, 0, 1, 0, 0, NULL, NULL);
    printf("device: %s; simulated ranks share it: their compute shares it, only the link is modeled\n",
           probe->placement);
    probe->ops->destroy(probe);
    printf("blas: %s\n", blas);
    printf("link: modeled ring, %.3g GB/s, %g us per hop (%s)\n", gbps, latency_us, chosen);
    printf("model: preset %s, %d layers, %d wide, block %d, batch %d per rank; DDP buckets %g MB; "
           "median of %d steps per variant\n\n", o.preset, o.layers, o.embd, o.block, o.batch, o.bucket_mb, o.iters);
    printf("| strategy | N | overlap | ms/step | comm ms | model ms | exposed ms | hidden |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    if (csv) fprintf(csv, "strategy,ranks,overlap,ms_step,compute_ms,comm_ms,model_ms,exposed_ms,hidden\n");
    static const int ranks[3] = { 1, 2, 4 };
    for (int zero = 0; zero <= 3; zero++)
        for (int i = 0; i < 3; i++) {
            int N = ranks[i];
            Times t = time_variants(zero, N, &o, &data, gbps, latency_us, trace);
            double comm = t.off - t.nosync, predicted = model_ms(zero, N, &model, gbps, latency_us);
            for (int overlap = 0; overlap <= 1; overlap++) {
                double step = overlap ? t.on : t.off, exposed = step - t.nosync;
                char hidden[16] = "-";
                if (N > 1) snprintf(hidden, sizeof hidden, "%.0f%%", 100.0 * (1.0 - exposed / comm));
                printf("| %s | %d | %s | %.1f | %.1f | %.1f | %.1f | %s |\n", NAMES[zero], N, overlap ? "on" : "off",
                       step, comm, predicted, exposed, hidden);
                if (csv)
                    fprintf(csv, "%s,%d,%s,%.3f,%.3f,%.3f,%.3f,%.3f,%.4f\n", NAMES[zero], N, overlap ? "on" : "off",
                            step, t.nosync, comm, predicted, exposed, N > 1 ? 1.0 - exposed / comm : 0.0);
                fflush(stdout);
            }
        }
    printf("\ncomm = step with overlap off - compute-only step (gradient sync off, the no_sync probe); model = the\n"
           "ring cost model's time for the same collectives; exposed = step - compute-only step; hidden = 1 -\n"
           "exposed / comm. The weights' all-gathers (ZeRO-1/2 after the step, ZeRO-3 around each unit) run in\n"
           "every variant, so they count as compute here: ZeRO-3's prefetched gathers then make its overlapped\n"
           "step faster than the compute-only one, and its hidden share pass 100%%. ZeRO-1 does not overlap:\n"
           "its one reduce-scatter of the arena needs the whole backward.\n");
    if (csv) fclose(csv);
    dataset_free(&data);
    int status = 0;
    if (trace && trace_write(trace, o.trace, err, sizeof err) != 0) {
        fprintf(stderr, "bench_overlap: %s\n", err);
        status = 1;
    } else if (trace) {
        printf("trace: one untimed step of every variant, %zu spans, in %s\n", trace_spans(trace), o.trace);
    }
    trace_destroy(trace);
    return status;
}
