/* zero_memory.c: bin/zero_memory, the memory each strategy holds per rank.
 *
 * Builds DDP and ZeRO-1, 2 and 3 for real at N = 1, 2, 4 and 8 simulated ranks,
 * without training, and prints what the allocator counted on each rank by kind:
 * weights, gradients, optimizer state (Adam m and v), and the working buffers
 * (gradient slots, gather buffers, clipping partials). The persistent state is
 * checked against the fp32 ZeRO formulas, P parameters, N ranks:
 *     DDP 16P, ZeRO-1 8P + 8P/N, ZeRO-2 4P + 12P/N, ZeRO-3 16P/N bytes;
 * the exit status is 1 if any rank is more than 1% off. Model flags are
 * bin/train's (default: the char preset), and --device places the ranks as
 * bin/train does. Activations are no part of this table (they are the same
 * under every strategy, and bin/train prints them); each rank is built for one
 * row, so that N = 8 fits in a small machine. On a GPU the allocator's counts
 * leave out what CUDA holds itself (its context, cuBLAS's workspaces, NCCL's
 * buffers), so a last column adds what CUDA reports in use on GPU 0.
 */
#include <stdio.h>

#include "../model/data.h"
#include "../model/gpt.h"
#include "../strategies/strategy.h"
#include "options.h"

int main(int argc, char **argv) {
    TrainOptions o;
    int rc = options_parse(&o, "zero_memory", "char", argc, argv);
    if (rc) return rc == 1 ? 0 : 2;
    Dataset data;
    char err[512];
    if (dataset_load(&data, o.data, o.block, err, sizeof err) != 0) {
        fprintf(stderr, "zero_memory: %s\n", err);
        return 1;
    }
    ModelConfig model = { data.vocab, o.block, o.layers, o.heads, o.embd, MODEL_GPT };
    dataset_free(&data);
    const char *bad = gpt_config_error(&model);
    if (bad) {
        fprintf(stderr, "zero_memory: %s\n", bad);
        return 2;
    }
    ArenaLayout layout;
    model_layout(&model, 1, &layout);
    double P = (double)layout.numel;
    printf("model: preset %s, %d layers, %d heads, %d wide, block %d, vocabulary %d: P = %.0f parameters\n",
           o.preset, o.layers, o.heads, o.embd, o.block, model.vocab, P);
    printf("per rank, MB = 10^6 bytes, counted by the allocator (fp32 everywhere); units %s; overlap %s\n\n",
           o.unit, o.overlap ? "on" : "off (one gradient slot and one gather buffer beside the root's)");
    if (o.overlap)
        printf("with overlap, %d gradient slots and %d gather buffers beside the root's (--max-live-units)\n\n",
               o.max_live_units, o.max_live_units);
    Placement where = options_placement(&o);
    /* any handle on GPU 0 reads what CUDA reports for the whole GPU */
    Device *gpu0 = where != PLACE_CPU && device_cuda_count() > 0 ? device_create_cuda(0) : NULL;
    if (where != PLACE_CPU && device_cuda_count() < 0) return 1;
    if (gpu0) printf("CUDA reports %.1f MB in use on GPU 0 before any strategy is built\n\n",
                     device_reported_bytes(gpu0) / 1e6);
    printf("| strategy | N | weights | gradients | optimizer | state | ZeRO formula | state / formula "
           "| working | total |%s\n", gpu0 ? " GPU 0 in use (CUDA) |" : "");
    printf("|---|---|---|---|---|---|---|---|---|---|%s\n", gpu0 ? "---|" : "");
    static const int ranks[4] = { 1, 2, 4, 8 };
    int off = 0;
    for (int k = 0; k < STRATEGY_KINDS; k++) {
        const StrategyKind *kind = &STRATEGIES[k];
        for (int i = 0; i < 4; i++) {
            int N = ranks[i];
            StrategyConfig sc = { .model = model, .nranks = N, .batch = 1, .seed = (uint32_t)o.seed,
                                  .beta1 = 0.9f, .beta2 = o.beta2, .eps = 1e-8f, .weight_decay = o.weight_decay,
                                  .overlap = o.overlap, .bucket_bytes = (size_t)(o.bucket_mb * 1e6),
                                  .unit = (UnitPolicy)unit_policy_parse(o.unit), .max_live_units = o.max_live_units,
                                  .device = where };
            Strategy *s = kind->create(&sc);
            if (!s) return 1;
            /* every rank holds the same; the table shows the largest */
            double kind_mb[MEM_KINDS] = { 0 };
            for (int r = 0; r < N; r++) {
                for (int k = 0; k < MEM_KINDS; k++) {
                    double mb = s->ops->rank_bytes(s, r, (MemKind)k) / 1e6;
                    if (mb > kind_mb[k]) kind_mb[k] = mb;
                }
                double state = (s->ops->rank_bytes(s, r, MEM_WEIGHTS) + s->ops->rank_bytes(s, r, MEM_GRADS) +
                                s->ops->rank_bytes(s, r, MEM_OPTIMIZER)) / (kind->state_bytes_per_param(N) * P);
                if (state < 0.99 || state > 1.01) off++;
            }
            double state = kind_mb[MEM_WEIGHTS] + kind_mb[MEM_GRADS] + kind_mb[MEM_OPTIMIZER];
            double want = kind->state_bytes_per_param(N) * P / 1e6;
            printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.4f | %.1f | %.1f |", kind->name, N,
                   kind_mb[MEM_WEIGHTS], kind_mb[MEM_GRADS], kind_mb[MEM_OPTIMIZER], state, want,
                   state / want, kind_mb[MEM_WORKING], state + kind_mb[MEM_WORKING]);
            if (gpu0) printf(" %.1f |", device_reported_bytes(gpu0) / 1e6);
            printf("\n");
            s->ops->destroy(s);
        }
    }
    printf("\nstate = weights + gradients + optimizer; total = state + working (gradient slots, gather\n"
           "buffers, clipping partials, the reductions' scratch). Activations are not in the table: the\n"
           "same under every strategy, they grow with the batch (bin/train prints them). On a GPU the\n"
           "table leaves out what CUDA holds itself: its context, cuBLAS's workspaces, NCCL's buffers.\n");
    if (gpu0)
        printf("GPU 0 in use (CUDA): what cudaMemGetInfo reports with the strategy built, for every rank on\n"
               "GPU 0 (all of them when simulated) and every process on it, the CUDA context included;\n"
               "cuBLAS's workspaces come at the first matmul, so a built strategy holds none yet.\n");
    device_destroy(gpu0);
    if (off) {
        fprintf(stderr, "zero_memory: %d rank(s) hold a state more than 1%% off the ZeRO formula\n", off);
        return 1;
    }
    return 0;
}
