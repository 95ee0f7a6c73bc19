/* strategy.c: the registry of strategies, by ZeRO stage. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "strategy.h"

static double ddp_state(int nranks) { (void)nranks; return 16.0; }
static double zero1_state(int nranks) { return 8.0 + 8.0 / nranks; }
static double zero2_state(int nranks) { return 4.0 + 12.0 / nranks; }
static double zero3_state(int nranks) { return 16.0 / nranks; }

const StrategyKind STRATEGIES[STRATEGY_KINDS] = {
    { .name = "DDP", .stage = 0, .create = ddp_create, .state_bytes_per_param = ddp_state },
    { .name = "ZeRO-1", .stage = 1, .create = zero1_create, .state_bytes_per_param = zero1_state, .shards_adam = 1 },
    { .name = "ZeRO-2", .stage = 2, .create = zero2_create, .state_bytes_per_param = zero2_state, .unit_buffers = 1,
      .shards_grads = 1, .shards_adam = 1 },
    { .name = "ZeRO-3", .stage = 3, .create = zero3_create, .state_bytes_per_param = zero3_state, .unit_buffers = 2,
      .shards_weights = 1, .shards_grads = 1, .shards_adam = 1 },
};

void strategy_estimate(const StrategyKind *kind, const StrategyConfig *cfg, DeviceKind device,
                       double bytes[MEM_KINDS]) {
    ArenaLayout layout;
    model_layout_units(&cfg->model, cfg->unit, cfg->nranks, &layout);
    double N = cfg->nranks, whole = (double)layout.total * sizeof(float), part = whole / N;
    for (int k = 0; k < MEM_KINDS; k++) bytes[k] = 0;
    bytes[MEM_WEIGHTS] = kind->shards_weights ? part : whole;
    bytes[MEM_GRADS] = kind->shards_grads ? part : whole;
    bytes[MEM_OPTIMIZER] = 2 * (kind->shards_adam ? part : whole);
    /* each kind of unit buffer: the root's own, and one (K with overlap) of the largest other unit's size */
    double root = (double)layout.units[0].size * sizeof(float), unit = 0;
    for (int u = 1; u < layout.nunits; u++) unit = fmax(unit, (double)layout.units[u].size * sizeof(float));
    int pool = cfg->overlap ? strategy_live_units(cfg) : 1;
    bytes[MEM_WORKING] = kind->unit_buffers * (root + pool * unit) + N * sizeof(float);  /* and the norms' partials */
    model_estimate(&cfg->model, cfg->unit, cfg->recompute, cfg->nranks, device, cfg->batch, cfg->model.block_size,
                   bytes);
}

int strategy_live_units(const StrategyConfig *cfg) {
    return cfg->max_live_units > 0 ? cfg->max_live_units : DEFAULT_LIVE_UNITS;
}

Strategy *strategy_create(int zero, const StrategyConfig *cfg) {
    for (int k = 0; k < STRATEGY_KINDS; k++)
        if (STRATEGIES[k].stage == zero) return STRATEGIES[k].create(cfg);
    fprintf(stderr, "error: --zero=%d: expected 0 (DDP), 1, 2 or 3\n", zero);
    return NULL;
}

void strategy_read_all(Strategy *s, StateOf what, float *host) {
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    memset(host, 0, layout.total * sizeof(float));
    for (int t = 0; t < layout.ntensors; t++) s->ops->read_tensor(s, what, t, host + layout.tensors[t].offset);
}

void strategy_write_all(Strategy *s, StateOf what, const float *host) {
    ArenaLayout layout;
    model_layout(&s->cfg.model, 1, &layout);
    for (int t = 0; t < layout.ntensors; t++) s->ops->write_tensor(s, what, t, host + layout.tensors[t].offset);
}
