/* bench_cpu.c: CPU training speed of both presets against this machine's sgemm.
 *
 * Prints the sgemm ceiling (2048^3, best of 3), then for each preset the median
 * ms per training step (forward, backward, clip, AdamW), tokens/s, and achieved
 * GFLOP/s counted as nanoGPT's estimate_mfu does (6N + 12 L H Q T per token, N
 * without the position embedding), as a fraction of the ceiling.
 * --quick takes fewer steps; --char-small times only that preset's step (its
 * line alone, for bench/torch_peer.sh); --gpt2=DIR times only the gpt2
 * preset's, at 1 x 1024 and 4 x 256 rows, on DIR's token ids (bench/gpt2.sh).
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_setup.h"
#include "../model/models.h"
#include "../runtime/host.h"
#include "../training/trainer.h"
#include "../tools/options.h"
#include "steps.h"

static double sgemm_gflops(int n) {
    size_t floats = (size_t)n * n;
    float *a = host_calloc(floats, sizeof(float)), *b = host_calloc(floats, sizeof(float)),
          *c = host_calloc(floats, sizeof(float));
    for (size_t i = 0; i < floats; i++) { a[i] = (float)(i % 7) * 1e-3f; b[i] = (float)(i % 5) * 1e-3f; }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t = wall_seconds();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        t = wall_seconds() - t;
        if (t < best) best = t;
    }
    free(a); free(b); free(c);
    return 2.0 * n * n * n / best / 1e9;
}

typedef struct {
    const char *preset;
    double ms, tokens_per_s, gflops;
    int steps;
    float dropout;
} BenchResult;

/* The preset on `nranks` simulated DDP ranks of `batch` rows each (0: the preset's batch), of `block`
 * tokens (0: the preset's). */
static BenchResult bench_preset(const char *preset, const Dataset *data, int steps, int nranks, int batch,
                                int block) {
    TrainOptions o;
    options_preset(&o, preset);
    if (block) o.block = block;
    StrategyConfig sc = {
        .model = options_model(&o, data->vocab),
        .nranks = nranks,
        .batch = batch ? batch : o.batch, .dropout = o.dropout, .seed = 1, .beta1 = 0.9f, .beta2 = o.beta2,
        .eps = 1e-8f, .weight_decay = o.weight_decay,
    };
    Strategy *s = strategy_create(0, &sc);
    int rows = sc.batch * nranks, T = o.block;
    BenchResult r = { preset, median_step_ms(s, data, steps, o.lr, o.grad_clip), 0, 0, steps, o.dropout };
    ArenaLayout layout;
    model_layout(&sc.model, 1, &layout);
    double N = (double)layout.numel - (double)o.block * o.embd;
    double flops_per_token = 6.0 * N + 12.0 * o.layers * o.heads * (o.embd / o.heads) * o.block;
    r.tokens_per_s = rows * T / (r.ms / 1000.0);
    r.gflops = flops_per_token * r.tokens_per_s / 1e9;
    s->ops->destroy(s);
    return r;
}

static void print_result(const BenchResult *r, double ceiling) {
    printf("%-11s %8.1f %10.0f %10.1f %9.0f%%   (median of %d steps, dropout %g)\n", r->preset, r->ms,
           r->tokens_per_s, r->gflops, 100.0 * r->gflops / ceiling, r->steps, r->dropout);
}

/* --gpt2=DIR: the gpt2 preset's step (124M, GPT-2's ids padded to 50304) on one rank at one row
 * of 1024 and four of 256, on DIR's token ids, against the sgemm ceiling measured after them. */
static int bench_gpt2(const char *dir, const CpuSetup *cpu) {
    Dataset data;
    char err[512];
    if (dataset_load(&data, dir, 1024, err, sizeof err) != 0) {
        fprintf(stderr, "bench_cpu: %s\n", err);
        return 1;
    }
    cpu_setup_print(cpu);
    BenchResult one = bench_preset("gpt2", &data, 5, 1, 1, 1024), four = bench_preset("gpt2", &data, 5, 1, 4, 256);
    double ceiling = sgemm_gflops(2048);
    printf("sgemm 2048^3: %.1f GFLOP/s (the ceiling)\n\n", ceiling);
    printf("%-11s %8s %10s %10s %10s\n", "gpt2 rows", "ms/iter", "tokens/s", "GFLOP/s", "of sgemm");
    one.preset = "1x1024";
    four.preset = "4x256";
    print_result(&one, ceiling);
    print_result(&four, ceiling);
    dataset_free(&data);
    return 0;
}

int main(int argc, char **argv) {
    const CpuSetup *cpu = cpu_setup(argv);
    int quick = 0, small_only = 0;
    const char *gpt2 = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--char-small") == 0) small_only = 1;
        else if (strncmp(argv[i], "--gpt2=", 7) == 0 && argv[i][7]) gpt2 = argv[i] + 7;
        else {
            fprintf(stderr, "bench_cpu: unknown flag '%s' (--quick, --char-small, --gpt2=DIR)\n", argv[i]);
            return 2;
        }
    }
    if (gpt2) return bench_gpt2(gpt2, cpu);
    Dataset data;
    char err[512];
    if (dataset_load(&data, "data/tinyshakespeare.txt", 256, err, sizeof err) != 0) {
        fprintf(stderr, "bench_cpu: %s\n", err);
        return 1;
    }
    cpu_setup_print(cpu);
    /* The presets run first: a 2048^3 sgemm before them slows the small
     * char-small matmuls after it by a quarter (measured here). */
    BenchResult small = bench_preset("char-small", &data, quick ? 10 : 50, 1, 0, 0);
    if (small_only) {
        printf("%-11s %8.1f ms/iter, %.0f tokens/s (median of %d steps)\n", small.preset, small.ms,
               small.tokens_per_s, small.steps);
        dataset_free(&data);
        return 0;
    }
    BenchResult full = bench_preset("char", &data, quick ? 2 : 5, 1, 0, 0);
    /* the simulator's overhead: the same global batch and work, on 4 ranks or 1 */
    BenchResult four_ranks = bench_preset("char-small", &data, quick ? 5 : 20, 4, 12, 0);
    BenchResult one_rank = bench_preset("char-small", &data, quick ? 5 : 20, 1, 48, 0);
    double ceiling = sgemm_gflops(2048);
    printf("sgemm 2048^3: %.1f GFLOP/s (the ceiling)\n\n", ceiling);
    printf("%-11s %8s %10s %10s %10s\n", "preset", "ms/iter", "tokens/s", "GFLOP/s", "of sgemm");
    print_result(&small, ceiling);
    print_result(&full, ceiling);
    printf("\nsimulator overhead, char-small: 4 ranks x 12 rows %.1f ms/iter, 1 rank x 48 rows "
           "%.1f ms/iter: %.2fx\n", four_ranks.ms, one_rank.ms, four_ranks.ms / one_rank.ms);
    dataset_free(&data);
    return 0;
}
