/* bench_units.c: what finer units, the live-unit limit and activation recompute cost.
 *
 * ZeRO-3 on --gpus ranks (simulated), overlap on, over the modeled --link if
 * one is given: the median ms of a training step, and rank 0's working
 * buffers, activations and peak (the allocator's high-water mark), for a row
 * per choice, each against the default (whole blocks, K = 2, no recompute):
 *   --unit = block, half, tensor                     (K = 2)
 *   --max-live-units = 1, 2, 3                       (finest units)
 *   --recompute = 0, 1                               (whole blocks)
 * Every row gives the same bits (the gates of make test); only time and memory
 * differ. Writes the table as Markdown on stdout.
 */
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/cpu/cpu_setup.h"
#include "../tools/options.h"
#include "steps.h"

typedef struct { UnitPolicy unit; int live_units, recompute; } Choice;

static const Choice CHOICES[] = {
    { .unit = UNIT_BLOCK, .live_units = 2, .recompute = 0 },
    { .unit = UNIT_HALF, .live_units = 2, .recompute = 0 },
    { .unit = UNIT_TENSOR, .live_units = 2, .recompute = 0 },
    { .unit = UNIT_TENSOR, .live_units = 1, .recompute = 0 },
    { .unit = UNIT_TENSOR, .live_units = 3, .recompute = 0 },
    { .unit = UNIT_BLOCK, .live_units = 2, .recompute = 1 },
};
enum { CHOICES_N = sizeof CHOICES / sizeof CHOICES[0] };

static Strategy *make(const Choice *c, const TrainOptions *o, const Dataset *data) {
    StrategyConfig sc = bench_config(o, data, o->gpus);
    sc.units.cut = c->unit;
    sc.overlap.max_live_units = c->live_units;
    sc.units.recompute = c->recompute;
    Strategy *s = strategy_create(3, &sc);
    if (!s) exit(1);
    return s;
}

int main(int argc, char **argv) {
    const CpuSetup *cpu = cpu_setup(argv);
    TrainOptions o;
    Dataset data;
    int rc = bench_open("bench_units", 10, argc, argv, &o, &data);  /* --iters: timed steps per row */
    if (rc >= 0) return rc;
    LinkModel link = options_link(&o);
    cpu_setup_print(cpu);
    if (link.gbps > 0) printf("link: modeled ring, %.3g GB/s, %g us per hop\n", link.gbps, link.latency_us);
    else printf("link: none modeled (every collective as fast as the simulator runs it)\n");
    printf("model: preset %s, %d layers, %d wide, block %d, batch %d per rank; ZeRO-3 on %d ranks, overlap on; "
           "median of %d steps per row\n\n", o.preset, o.layers, o.embd, o.block, o.batch, o.gpus, o.iters);
    printf("| --unit | --max-live-units | --recompute | ms/step | vs default | working MB | activations MB | peak MB |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    double base_ms = 0;
    for (int i = 0; i < CHOICES_N; i++) {
        const Choice *c = &CHOICES[i];
        Strategy *s = make(c, &o, &data);
        double ms = median_step_ms(s, &data, o.iters, o.lr, o.grad_clip);
        if (i == 0) base_ms = ms;
        printf("| %s | %d | %d | %.1f | %+.0f%% | %.2f | %.1f | %.1f |\n", unit_policy_name(c->unit), c->live_units,
               c->recompute, ms, 100.0 * (ms / base_ms - 1.0), s->ops->rank_bytes(s, 0, MEM_WORKING) / 1e6,
               s->ops->rank_bytes(s, 0, MEM_ACTIVATIONS) / 1e6, s->ops->rank_peak_bytes(s, 0) / 1e6);
        fflush(stdout);
        s->ops->destroy(s);
    }
    printf("\nvs default: against the first row (whole blocks, K = 2, no recompute). Every row gives the\n"
           "same bits; the machine is shared, so differences of a few percent are noise.\n");
    dataset_free(&data);
    return 0;
}
