/* zero_memory.c: bin/zero_memory, the memory each strategy holds per rank.
 *
 * Builds DDP and ZeRO-1, 2 and 3 for real at N = 1, 2, 4 and 8 simulated ranks
 * (with --gpus=K, at every N of 1..K),
 * runs one real training step on each, and prints what the allocator counted
 * on each rank by kind: weights, gradients, optimizer state (Adam m and v),
 * the working buffers (gradient slots, gather buffers, clipping partials) and
 * the activations; and the peak, the allocator's own high-water mark of
 * everything the rank held at once from its creation through that step. The
 * persistent state is checked against the ZeRO formulas, P parameters, N
 * ranks, in fp32:
 *     DDP 16P, ZeRO-1 8P + 8P/N, ZeRO-2 4P + 12P/N, ZeRO-3 16P/N bytes;
 * with --dtype=bf16, the paper's mixed precision with fp32 gradients (2 bytes
 * of bf16 weights; 4 of gradients; K = 12 of master weights, m and v): DDP 18P,
 * ZeRO-1 6P + 12P/N, ZeRO-2 2P + 16P/N, ZeRO-3 18P/N; the exit status is 1 if
 * any rank is more than 1% off. Model flags are
 * bin/train's (default: the char preset), and so are --unit, --max-live-units
 * and --overlap; --device places the ranks as bin/train does. Each rank is
 * built for --batch rows when the flag is given, else for one row, so that
 * N = 8 of the char preset fits and steps in seconds on a small machine. On a
 * GPU the allocator's counts leave out what CUDA holds itself (its context,
 * cuBLAS's workspaces, NCCL's buffers), so a last column adds what CUDA
 * reports in use on GPU 0. --estimate builds nothing: the same rows from the
 * formulas, then each stage's bytes per parameter in fp32 and in mixed
 * precision, and the ZeRO paper's Figure 1 beside the registry's figures.
 * --shard-ranks=S shards ZeRO-1/2/3 over
 * groups of S ranks (hybrid sharding) in the rows whose N it divides, each
 * held to its formula at S instead of N.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/data.h"
#include "../model/gpt.h"
#include "../model/models.h"
#include "../strategies/strategy.h"
#include "options.h"

/* The ZeRO paper's formula for what one rank of `kind` holds under sc,
 * bytes per parameter: the gradients in bf16 where the compute and the
 * reductions are (strategy_grads_held), else in fp32. */
static double held_state(const StrategyKind *kind, int N, const StrategyConfig *sc) {
    return strategy_state_bytes_per_param(kind, N, sc->precision, strategy_grads_held(sc), NULL, NULL);
}

/* One training step of s over its global batch (rows_per_rank rows a rank): 0, or -1. */
static int real_step(Strategy *s, const Dataset *data, int N, int batch, int T, uint32_t seed) {
    size_t n = (size_t)N * batch * T;
    int *x = malloc(n * sizeof(int)), *y = malloc(n * sizeof(int));
    if (!x || !y) {
        free(x);
        free(y);
        return -1;
    }
    char err[768];
    int rc = dataset_batch(data, SPLIT_TRAIN, BATCH_TRAIN, seed, 0, 0, N * batch, T, x, y, err, sizeof err);
    if (rc != 0) fprintf(stderr, "zero_memory: %s\n", err);
    s->ops->set_lr(s, 1e-3f);
    if (rc == 0) rc = s->ops->forward_backward(s, x, y, 0, 0, 1);
    if (rc == 0) {
        s->ops->clip_grads(s, 1.0f);
        s->ops->step(s);
        s->ops->train_loss(s);  /* waits for the step */
    }
    free(x);
    free(y);
    return rc;
}

/* The strategy config of one row of the table. */
/* The shards of kind's row at N under --shard-ranks=S (0: none): S where the
 * kind shards, N where it does not or S is 0; -1 where S does not divide N
 * (no such row). */
static int row_shards(const StrategyKind *kind, int N, int S) {
    if (!kind->shards_adam || S == 0) return N;
    return N % S == 0 ? S : -1;
}

static StrategyConfig row_config(const TrainOptions *o, ModelConfig model, int N, int shards, int batch,
                                 Placement where) {
    return (StrategyConfig){ .model = model, .nranks = N, .shard_ranks = shards, .seed = (uint32_t)o->seed, .beta1 = 0.9f, .beta2 = o->beta2,
                             .eps = 1e-8f, .weight_decay = o->weight_decay, .precision = options_precision(o),
                             .reduce_precision = options_reduce_precision(o), .overlap = options_overlap(o),
                             .units = options_units(o), .device = where, .batch = batch, .dropout = o->dropout };
}

/* "16", "4 + 12/N", "16/N": a state's bytes per parameter, whole + sharded / N. */
static void formula_text(double whole, double sharded, char *out, size_t len) {
    if (sharded == 0) snprintf(out, len, "%g", whole);
    else if (whole == 0) snprintf(out, len, "%g/N", sharded);
    else snprintf(out, len, "%g + %g/N", whole, sharded);
}

/* The ZeRO paper's Figure 1: per device, Psi = 7.5B parameters, N_d = 64,
 * K = 12, in GB (10^9 bytes), as the paper prints them: baseline, P_os,
 * P_os+g, P_os+g+p. */
static const double PAPER_PSI = 7.5e9, PAPER_FIGURE_1_GB[STRATEGY_KINDS] = { 120, 31.4, 16.6, 1.9 };
enum { PAPER_N = 64 };

/* Each strategy's state per parameter in both precisions, and mixed
 * precision's at the paper's Psi and N_d beside its Figure 1. */
static void print_precisions(void) {
    printf("\nState per rank, bytes per parameter at N ranks: fp32; mixed precision (bf16 weights and gradients,\n"
           "fp32 master weights, m and v: K = 12) with the gradients reduced in bf16, as the ZeRO paper counts,\n"
           "or in fp32 (the gradients then held in fp32: what a bf16 run holds today); and mixed precision at\n"
           "the paper's Psi = 7.5B parameters and N_d = 64, beside its Figure 1 (GB = 10^9 bytes):\n\n");
    printf("| strategy | fp32 | bf16 | bf16, reduced in fp32 | Psi = 7.5B, N_d = 64 | the paper's Figure 1 |\n");
    printf("|---|---|---|---|---|---|\n");
    static const DType compute[3] = { DTYPE_FP32, DTYPE_BF16, DTYPE_BF16 };
    static const DType reduce[3] = { DTYPE_FP32, DTYPE_BF16, DTYPE_FP32 };
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        const StrategyKind *kind = &STRATEGIES[k];
        char text[3][32];
        for (int i = 0; i < 3; i++) {
            double whole, sharded;
            strategy_state_bytes_per_param(kind, PAPER_N, compute[i], reduce[i], &whole, &sharded);
            formula_text(whole, sharded, text[i], sizeof text[i]);
        }
        double paper = strategy_state_bytes_per_param(kind, PAPER_N, DTYPE_BF16, DTYPE_BF16, NULL, NULL);
        printf("| %s | %s | %s | %s | %.1f GB | %g GB |\n", kind->name, text[0], text[1], text[2],
               paper * PAPER_PSI / 1e9, PAPER_FIGURE_1_GB[k]);
    }
}

/* --estimate: every strategy's row from the formulas alone. */
static void print_estimates(const TrainOptions *o, ModelConfig model, int counts, int every_n, int shard_ranks,
                            int batch, DeviceKind device) {
    printf("| strategy | N | weights | gradients | optimizer | state | working | activations | total |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        for (int i = 0; i < counts; i++) {
            int N = every_n ? i + 1 : 1 << i, S = row_shards(&STRATEGIES[k], N, shard_ranks);
            if (S < 0) continue;
            StrategyConfig sc = row_config(o, model, N, S, batch, PLACE_AUTO);
            double b[MEM_KINDS];
            strategy_estimate(&STRATEGIES[k], &sc, device, b);
            double state = b[MEM_WEIGHTS] + b[MEM_GRADS] + b[MEM_OPTIMIZER];
            printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", STRATEGIES[k].name, N,
                   b[MEM_WEIGHTS] / 1e6, b[MEM_GRADS] / 1e6, b[MEM_OPTIMIZER] / 1e6, state / 1e6,
                   b[MEM_WORKING] / 1e6, b[MEM_ACTIVATIONS] / 1e6, (state + b[MEM_WORKING] + b[MEM_ACTIVATIONS]) / 1e6);
        }
    }
    printf("\nMB = 10^6 bytes per rank, from the formulas over the padded layout (strategy_estimate),\n"
           "nothing allocated: state = weights + gradients + optimizer; working = gradient slots, gather\n"
           "buffers, clipping partials, the reductions' scratch; activations for the rows a rank is built\n"
           "for. Where a model fits, bin/zero_memory without --estimate holds these to the allocator's\n"
           "counts within 1%%.\n");
    print_precisions();
}

/* Whether a measured kind is more than 1% off its estimate. */
static int off_estimate(double measured, double estimate) {
    return fabs(measured - estimate) > 0.01 * fmax(measured, estimate);
}

int main(int argc, char **argv) {
    TrainOptions o;
    int rc = options_parse(&o, TOOL_ZERO_MEMORY, "char", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    int estimate_only = o.estimate, shard_ranks = o.shard_ranks;
    Dataset data = { 0 };
    char err[512];
    int gpt2_vocab = estimate_only && strncmp(o.preset, "gpt2", 4) == 0 && !options_given(argc, argv, "data");
    if (!gpt2_vocab && dataset_load(&data, o.data, o.block, err, sizeof err) != 0) {
        fprintf(stderr, "zero_memory: %s\n", err);
        return 1;
    }
    ModelConfig model = options_model(&o, gpt2_vocab ? GPT2_VOCAB : data.vocab);
    const char *bad = gpt_config_error(&model);
    if (bad) {
        fprintf(stderr, "zero_memory: %s\n", bad);
        dataset_free(&data);
        return 2;
    }
    Placement where = options_placement(&o);
    int batch = options_given(argc, argv, "batch") ? o.batch : 1;
    int given = options_given(argc, argv, "gpus"), counts = given ? o.gpus : 4;
    if (estimate_only) {
        ArenaLayout plain;
        model_layout(&model, 1, &plain);
        printf("model: preset %s, %d layers, %d heads, %d wide, block %d, vocabulary %d: P = %zu parameters\n"
               "estimate for %d row(s) of %d a rank on the %s; units: %s; overlap %s (%d live units); made again: %s\n\n",
               o.preset, o.layers, o.heads, o.embd, o.block, model.vocab, plain.numel, batch, o.block,
               where == PLACE_CUDA ? "GPU" : "CPU", o.unit, o.overlap ? "on" : "off", o.overlap ? o.max_live_units : 1,
               options_recompute_text(&o));
        print_estimates(&o, model, counts, given, shard_ranks, batch, where == PLACE_CUDA ? DEVICE_CUDA : DEVICE_CPU);
        dataset_free(&data);
        return 0;
    }
    if (where == PLACE_CUDA && device_cuda_count() <= 0) {  /* before any line of the table */
        if (device_cuda_count() == 0)
            fprintf(stderr, "zero_memory: --device=cuda, but no GPU is visible (%s)\n", device_cuda_absence());
        dataset_free(&data);
        return options_no_strategy_status(&o);
    }
    ArenaLayout layout;
    model_layout(&model, 1, &layout);
    double P = (double)layout.numel;
    printf("model: preset %s, %d layers, %d heads, %d wide, block %d, vocabulary %d: P = %.0f parameters\n",
           o.preset, o.layers, o.heads, o.embd, o.block, model.vocab, P);
    DType compute = options_precision(&o), reduce = options_reduce_precision(&o);
    const char *held = compute == DTYPE_FP32 ? "fp32 everywhere"
                     : reduce == DTYPE_BF16 ? "computing in bf16: a bf16 copy of the weights beside fp32 master "
                                                  "weights; gradients bf16, reduced in bf16"
                                                : "computing in bf16: a bf16 copy of the weights beside fp32 master "
                                                  "weights; gradients fp32, reduced in fp32";
    printf("per rank, MB = 10^6 bytes, counted by the allocator (%s); %d row(s) of %d a rank;\n"
           "units: %s; overlap %s: %d gradient slot(s) and %d gather buffer(s) beside the root's; made again: %s\n\n",
           held,
           batch, o.block, o.unit, o.overlap ? "on" : "off", o.overlap ? o.max_live_units : 1,
           o.overlap ? o.max_live_units : 1, options_recompute_text(&o));
    if (shard_ranks)
        printf("ZeRO-1/2/3 sharded over groups of %d ranks (hybrid), at each N that %d divides: the formula at S = %d\n\n",
               shard_ranks, shard_ranks, shard_ranks);
    /* any handle on GPU 0 reads what CUDA reports for the whole GPU */
    Device *gpu0 = where != PLACE_CPU && device_cuda_count() > 0 ? device_create_cuda(0) : NULL;
    if (where != PLACE_CPU && device_cuda_count() < 0) {
        dataset_free(&data);
        return 1;
    }
    if (gpu0) printf("CUDA reports %.1f MB in use on GPU 0 before any strategy is built\n\n",
                     device_reported_bytes(gpu0) / 1e6);
    printf("| strategy | N | weights | gradients | optimizer | state | ZeRO formula | state / formula "
           "| working | total | activations | peak | estimate |%s\n", gpu0 ? " GPU 0 in use (CUDA) |" : "");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|%s\n", gpu0 ? "---|" : "");
    /* N = 1, 2, 4, 8; with --gpus=K, every N of 1..K */
    int off = 0, off_estimates = 0;
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        const StrategyKind *kind = &STRATEGIES[k];
        for (int i = 0; i < counts; i++) {
            int N = given ? i + 1 : 1 << i, S = row_shards(kind, N, shard_ranks);
            if (S < 0) continue;
            StrategyConfig sc = row_config(&o, model, N, S, batch, where);
            Strategy *s = kind->create(kind, &sc);
            if (!s || real_step(s, &data, N, batch, o.block, (uint32_t)o.seed) != 0) {
                if (s) s->ops->destroy(s);
                dataset_free(&data);
                return 1;
            }
            /* every rank holds the same; the table shows the largest */
            double kind_mb[MEM_KINDS] = { 0 }, peak_mb = 0;
            for (int r = 0; r < N; r++) {
                double rank_peak = s->ops->rank_peak_bytes(s, r) / 1e6;
                if (rank_peak > peak_mb) peak_mb = rank_peak;
                for (int k = 0; k < MEM_KINDS; k++) {
                    double mb = s->ops->rank_bytes(s, r, (MemKind)k) / 1e6;
                    if (mb > kind_mb[k]) kind_mb[k] = mb;
                }
                double state = (s->ops->rank_bytes(s, r, MEM_WEIGHTS) + s->ops->rank_bytes(s, r, MEM_GRADS) +
                                s->ops->rank_bytes(s, r, MEM_OPTIMIZER)) / (held_state(kind, S, &sc) * P);
                if (state < 0.99 || state > 1.01) off++;
            }
            double estimate[MEM_KINDS], estimate_total = 0;
            strategy_estimate(kind, &sc, s->device_kind, estimate);
            for (int k = 0; k < MEM_KINDS; k++) {
                off_estimates += off_estimate(kind_mb[k] * 1e6, estimate[k]);
                estimate_total += estimate[k];
            }
            double state = kind_mb[MEM_WEIGHTS] + kind_mb[MEM_GRADS] + kind_mb[MEM_OPTIMIZER];
            double want = held_state(kind, S, &sc) * P / 1e6;
            printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.4f | %.1f | %.1f | %.1f | %.1f | %.1f |", kind->name,
                   N, kind_mb[MEM_WEIGHTS], kind_mb[MEM_GRADS], kind_mb[MEM_OPTIMIZER], state, want, state / want,
                   kind_mb[MEM_WORKING], state + kind_mb[MEM_WORKING], kind_mb[MEM_ACTIVATIONS], peak_mb,
                   estimate_total / 1e6);
            if (gpu0) printf(" %.1f |", device_reported_bytes(gpu0) / 1e6);
            printf("\n");
            s->ops->destroy(s);
        }
    }
    printf("\nstate = weights + gradients + optimizer; total = state + working (gradient slots, gather\n"
           "buffers, clipping partials, the reductions' scratch); activations: the forward's, kept for\n"
           "the backward, and the backward's workspace, for the rows a rank was built for. peak: the\n"
           "allocator's high-water mark, everything the rank held at once from its creation through one\n"
           "real training step. On a GPU the table leaves out what CUDA holds itself: its context,\n"
           "cuBLAS's workspaces, NCCL's buffers. estimate: what --estimate gives for the whole rank,\n"
           "every kind of it held to the allocator's count within 1%%.\n");
    if (gpu0)
        printf("GPU 0 in use (CUDA): what cudaMemGetInfo reports with the strategy built, for every rank on\n"
               "GPU 0 (all of them when simulated) and every process on it, the CUDA context included;\n"
               "cuBLAS's workspaces come at the first matmul, so a built strategy holds none yet.\n");
    device_destroy(gpu0);
    dataset_free(&data);
    if (off) fprintf(stderr, "zero_memory: %d rank(s) hold a state more than 1%% off the ZeRO formula\n", off);
    if (off_estimates)
        fprintf(stderr, "zero_memory: %d count(s) of a kind more than 1%% off the estimate (--estimate)\n",
                off_estimates);
    if (off || off_estimates) return 1;
    return 0;
}
