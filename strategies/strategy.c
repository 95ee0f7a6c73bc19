/* strategy.c: the registry of strategies, by ZeRO stage (what each holds and
 * what its step costs on a modeled link), and the estimate. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../model/models.h"
#include "strategy.h"

LinkShape strategy_link_shape(const StrategyConfig *cfg) {
    int S = strategy_shard_ranks(cfg);
    return (LinkShape){ cfg->link, cfg->link_inter, cfg->nranks, S, cfg->node_ranks > 0 ? cfg->node_ranks : S };
}

/* A gather of n numbers in dtype on cfg's modeled link: the weights' (fp32,
 * or the compute copy in cfg's compute precision), or the norms'. */
static LinkCost gather(const StrategyConfig *cfg, size_t n, DType dtype) {
    LinkShape shape = strategy_link_shape(cfg);
    return link_cost(&shape, LINK_ALL_GATHER, n, dtype);
}

/* A reduction of n gradients there, in cfg's reduce precision. */
static LinkCost reduction(const StrategyConfig *cfg, LinkCollective what, size_t n) {
    LinkShape shape = strategy_link_shape(cfg);
    return link_cost(&shape, what, n, cfg->reduce_precision);
}

static void padded_layout(const StrategyConfig *cfg, ArenaLayout *layout) {
    model_layout_units(&cfg->model, cfg->units.cut, strategy_shard_ranks(cfg), layout);
}

/* Clipping's global norm: the partials (one exact sum a shard, square_sum.h)
 * all-gathered, where the gradient is sharded. */
static LinkCost norm_gather(const StrategyConfig *cfg, int clips) {
    size_t floats = (size_t)strategy_shard_ranks(cfg) * SQUARE_SUM_FLOATS;
    return clips ? gather(cfg, floats, DTYPE_FP32) : (LinkCost){ 0.0, 0.0 };
}

/* DDP: one all-reduce of every gradient (in buckets: the same bytes). */
static LinkCost ddp_link(const StrategyConfig *cfg, int clips) {
    ArenaLayout layout;
    padded_layout(cfg, &layout);
    (void)clips;  /* every rank holds the whole gradient: its norm needs no collective */
    return reduction(cfg, LINK_ALL_REDUCE, layout.total);
}

/* ZeRO-1: the gradient reduce-scattered, the updated weights all-gathered in
 * the compute's precision (bf16: its compute copy's 2 bytes a number). */
static LinkCost zero1_link(const StrategyConfig *cfg, int clips) {
    ArenaLayout layout;
    padded_layout(cfg, &layout);
    return link_cost_add(norm_gather(cfg, clips), link_cost_add(reduction(cfg, LINK_REDUCE_SCATTER, layout.total),
                                                                gather(cfg, layout.total, cfg->precision)));
}

/* ZeRO-2: each unit reduce-scattered, and its weights all-gathered after the
 * step, in the compute's precision (bf16: its compute copy's 2 bytes a number). */
static LinkCost zero2_link(const StrategyConfig *cfg, int clips) {
    ArenaLayout layout;
    padded_layout(cfg, &layout);
    LinkCost cost = norm_gather(cfg, clips);
    for (int u = 0; u < layout.nunits; u++) {
        cost = link_cost_add(cost, reduction(cfg, LINK_REDUCE_SCATTER, layout.units[u].size));
        cost = link_cost_add(cost, gather(cfg, layout.units[u].size, cfg->precision));
    }
    return cost;
}

/* ZeRO-3: each unit reduce-scattered, gathered for its forward, and gathered
 * again for its backward, but the root (gathered for the whole step) and the
 * last unit (still gathered at the turn); the gathers in the compute's
 * precision (bf16: the compute copy's 2 bytes a number). */
static LinkCost zero3_link(const StrategyConfig *cfg, int clips) {
    ArenaLayout layout;
    padded_layout(cfg, &layout);
    LinkCost cost = norm_gather(cfg, clips);
    for (int u = 0; u < layout.nunits; u++) {
        int gathers = u == 0 || u == layout.nunits - 1 ? 1 : 2;
        cost = link_cost_add(cost, reduction(cfg, LINK_REDUCE_SCATTER, layout.units[u].size));
        for (int g = 0; g < gathers; g++)
            cost = link_cost_add(cost, gather(cfg, layout.units[u].size, cfg->precision));
    }
    return cost;
}

const StrategyKind STRATEGIES[STRATEGY_KINDS] = {
    { .name = "DDP", .stage = 0, .create = replicated_create, .link_cost = ddp_link },
    { .name = "ZeRO-1", .stage = 1, .create = replicated_create, .shards_adam = 1, .link_cost = zero1_link },
    { .name = "ZeRO-2", .stage = 2, .create = sharded_create, .shards_grads = 1, .shards_adam = 1, .unit_buffers = 1,
      .link_cost = zero2_link },
    { .name = "ZeRO-3", .stage = 3, .create = sharded_create, .shards_weights = 1, .shards_grads = 1, .shards_adam = 1,
      .unit_buffers = 2, .link_cost = zero3_link },
};

double strategy_state_bytes_per_param(const StrategyKind *kind, int nranks, DType compute, DType reduce,
                                      double *whole, double *sharded) {
    int mixed = compute == DTYPE_BF16;
    double weights = (double)number_bytes(compute);
    double grads = (double)number_bytes(mixed ? reduce : compute);
    double optimizer = mixed ? 12.0 : 8.0;  /* m and v; and the fp32 master weights */
    double w = 0, s = 0;  /* held whole, held 1/N */
    if (kind->shards_weights) s += weights; else w += weights;
    if (kind->shards_grads) s += grads; else w += grads;
    if (kind->shards_adam) s += optimizer; else w += optimizer;
    if (whole) *whole = w;
    if (sharded) *sharded = s;
    return w + s / nranks;
}

void strategy_estimate(const StrategyKind *kind, const StrategyConfig *cfg, DeviceKind device,
                       double bytes[MEM_KINDS]) {
    ArenaLayout layout;
    model_layout_units(&cfg->model, cfg->units.cut, strategy_shard_ranks(cfg), &layout);
    double N = cfg->nranks, whole = (double)layout.total * sizeof(float), part = whole / strategy_shard_ranks(cfg);
    int copy = cfg->precision == DTYPE_BF16;
    double weights = copy ? 0.5 : 1.0;  /* of fp32's bytes: the bf16 copy's, or fp32 weights */
    double grads = strategy_grads_held(cfg) == DTYPE_BF16 ? 0.5 : 1.0;
    for (int k = 0; k < MEM_KINDS; k++) bytes[k] = 0;
    bytes[MEM_WEIGHTS] = weights * (kind->shards_weights ? part : whole);
    bytes[MEM_GRADS] = grads * (kind->shards_grads ? part : whole);
    bytes[MEM_OPTIMIZER] = (copy ? 3 : 2) * (kind->shards_adam ? part : whole);  /* m, v (and the master) */
    /* each kind of unit buffer: the root's own, and one (K with overlap) of the largest other unit's size; the
     * gradient slots as the gradients, the gather buffers as the weights */
    double root = (double)layout.units[0].size * sizeof(float), unit = 0;
    for (int u = 1; u < layout.nunits; u++) unit = fmax(unit, (double)layout.units[u].size * sizeof(float));
    int pool = cfg->overlap.enabled ? strategy_live_units(cfg) : 1;
    double slots = kind->unit_buffers >= 1 ? grads : 0.0, gathers = kind->unit_buffers >= 2 ? weights : 0.0;
    /* and the norms' partials */
    bytes[MEM_WORKING] = (slots + gathers) * (root + pool * unit) + N * sizeof(SquareSum);
    model_estimate(&cfg->model, cfg->units.cut, strategy_compute(kind, cfg), strategy_shard_ranks(cfg), device,
                   cfg->batch, cfg->model.block_size, bytes);
}

ComputePolicy strategy_compute(const StrategyKind *kind, const StrategyConfig *cfg) {
    /* every strategy holds its bf16 compute copy of every unit for the model (replicated.c, sharded.c), each
     * tensor on its operand boundary (arena.h): the model reads it in place; ZeRO-2/3 zero a unit's slot as
     * its backward begins (sharded.c), where DDP and ZeRO-1 add each micro-step's gradient into the last's */
    int in_place = cfg->precision == DTYPE_BF16;
    int fresh = kind->unit_buffers >= 1 && in_place && strategy_grads_held(cfg) == DTYPE_BF16;
    return (ComputePolicy){ .recompute = cfg->units.recompute, .recompute_gelu = cfg->units.recompute_gelu,
                            .recompute_norms = cfg->units.recompute_norms, .precision = cfg->precision,
                            .weights_in_place = in_place, .grads_fresh = fresh };
}

int strategy_shard_ranks(const StrategyConfig *cfg) {
    return cfg->shard_ranks > 0 ? cfg->shard_ranks : cfg->nranks;
}

/* The rules of --shard-ranks (S of N ranks): 0, or -1 with its line. */
static int shard_ranks_error(int zero, const StrategyConfig *cfg, char *err, size_t len) {
    int S = cfg->shard_ranks, N = cfg->nranks;
    if (S == 0 || S == N) return 0;
    if (S < 0 || S > N || N % S != 0)
        snprintf(err, len, "--shard-ranks=%d must divide the run's %d ranks", S, N);
    else if (zero == 0)
        snprintf(err, len, "--shard-ranks=%d shards ZeRO-1, 2 or 3's state over groups of ranks; DDP (--zero=0) "
                 "shards nothing", S);
    else
        return 0;
    return -1;
}

/* The rules of --link-inter: a second tier needs a first, and nodes to lie
 * between (groups of --shard-ranks, or the config's node_ranks). */
static int link_inter_error(const StrategyConfig *cfg, char *err, size_t len) {
    LinkShape shape = strategy_link_shape(cfg);
    int node = shape.node_ranks;
    if (cfg->link_inter.gbps <= 0) return 0;
    if (cfg->link.gbps <= 0)
        snprintf(err, len, "--link-inter models the link between nodes; it needs --link, the link inside one");
    else if (node >= cfg->nranks)
        snprintf(err, len, "--link-inter models the link between groups of --shard-ranks, and all %d ranks are one "
                 "group: give --shard-ranks fewer", cfg->nranks);
    else if (node < 1 || cfg->nranks % node != 0 || (shape.shards % node != 0 && node % shape.shards != 0))
        snprintf(err, len, "nodes of %d ranks do not divide %d ranks into groups of %d", node, cfg->nranks,
                 shape.shards);
    else
        return 0;
    return -1;
}

DType strategy_grads_held(const StrategyConfig *cfg) {
    int both = cfg->precision == DTYPE_BF16 && cfg->reduce_precision == DTYPE_BF16;
    return both ? DTYPE_BF16 : DTYPE_FP32;
}

int strategy_live_units(const StrategyConfig *cfg) {
    return cfg->overlap.max_live_units > 0 ? cfg->overlap.max_live_units : DEFAULT_LIVE_UNITS;
}

const StrategyKind *strategy_kind(int stage) {
    for (int k = 0; k < STRATEGY_KINDS; k++)
        if (STRATEGIES[k].stage == stage) return &STRATEGIES[k];
    return NULL;
}

void strategy_stages_text(char *out, size_t len) {
    size_t used = 0;
    out[0] = 0;
    for (int k = 0; k < STRATEGY_KINDS && used < len; k++) {
        const char *joint = k == 0 ? "" : k == STRATEGY_KINDS - 1 ? " or " : ", ";
        used += (size_t)snprintf(out + used, len - used, "%s%d", joint, STRATEGIES[k].stage);
    }
}

/* What a graph cannot hold (rank_graphs.h), in the flags' words; NULL for none. */
static const char *graphs_refusal(const StrategyConfig *cfg) {
    if (!cfg->graphs) return NULL;
    if (cfg->link.gbps > 0 || cfg->link_inter.gbps > 0)
        return "--graphs=1 cannot run a modeled link, whose clock starts when the host enqueues";
    if (cfg->diagnostics.trace || cfg->diagnostics.profile)
        return "--graphs=1 cannot run under --trace or ZF_PROFILE, whose events the host reads each step";
    if (cfg->diagnostics.fault.where != FAULT_NONE) return "--graphs=1 cannot run an injected fault";
    return NULL;
}

int strategy_config_error(int zero, const StrategyConfig *cfg, char *err, size_t len) {
    const char *graphs = graphs_refusal(cfg);
    if (!strategy_kind(zero)) {
        char stages[64];
        strategy_stages_text(stages, sizeof stages);
        snprintf(err, len, "--zero=%d must be %s", zero, stages);
    } else if (cfg->overlap.max_live_units < 0 || cfg->overlap.max_live_units > MAX_LIVE_UNITS)
        snprintf(err, len, "--max-live-units=%d must be in 1..%d", cfg->overlap.max_live_units, MAX_LIVE_UNITS);
    else if (cfg->units.recompute && cfg->units.cut != UNIT_BLOCK)
        snprintf(err, len, "--recompute=1 recomputes whole blocks: it needs --unit=block, not %s",
                 unit_policy_name(cfg->units.cut));
    else if (cfg->precision == DTYPE_BF16 && cfg->model.kind != MODEL_GPT)
        snprintf(err, len, "--dtype=bf16 computes as autocast runs the GPT; the gates' MLP is fp32 only");
    else if (graphs)
        snprintf(err, len, "%s", graphs);
    else if (shard_ranks_error(zero, cfg, err, len) == 0)
        return link_inter_error(cfg, err, len);
    return -1;
}

Strategy *strategy_create(int zero, const StrategyConfig *cfg) {
    char err[160];
    if (strategy_config_error(zero, cfg, err, sizeof err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        return NULL;
    }
    const StrategyKind *kind = strategy_kind(zero);
    return kind->create(kind, cfg);
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
