/* ranks.c: the rank set every strategy shares, and the ops that do not depend
 * on how the state is split (ranks.h). */
#include "ranks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../model/gpt.h"
#include "../model/sample.h"
#include "../runtime/host.h"
#include "../runtime/world.h"

/* Each rank's device told who allocates there ("ZeRO-3, N=4, rank 2") and
 * what to try if it runs out. */
static void set_owner(Ranks *d, const char *hint) {
    for (int r = 0; r < d->local; r++) {
        char owner[96];
        snprintf(owner, sizeof owner, "%s, N=%d, rank %d", d->base.name, d->nranks, ranks_global(d, r));
        device_set_owner(d->pg->device[r], owner, hint);
    }
}

/* What a rank that runs out of memory past its models should try: under a
 * cap, the smallest stage whose state (the registry's formula) and unit-sized
 * buffers fit beside what the models hold already (activations, scratch);
 * fewer rows when that is no higher stage than this one, or none fits. */
static void set_memory_hint(Ranks *d) {
    Device *dev = d->pg->device[0];
    double cap = (double)device_limit(dev), P = (double)d->plain_layout.numel, unit_bytes = 0;
    for (int u = 0; u < d->layout->nunits; u++)
        unit_bytes = fmax(unit_bytes, (double)(d->layout->units[u].size * sizeof(float)));
    double buffers_per_kind = d->base.cfg.overlap ? strategy_live_units(&d->base.cfg) : 1;
    double models = (double)(device_bytes_in_use(dev, MEM_ACTIVATIONS) + device_bytes_in_use(dev, MEM_WORKING));
    int stage = 0;
    for (int k = 0; k < STRATEGY_KINDS; k++)
        if (strcmp(STRATEGIES[k].name, d->base.name) == 0) stage = STRATEGIES[k].stage;
    char hint[160] = "a higher --zero stage, more --gpus, or fewer rows (--batch)";
    if (cap > 0) snprintf(hint, sizeof hint, "no stage fits: more --gpus or fewer rows (--batch)");
    for (int k = 0; cap > 0 && k < STRATEGY_KINDS; k++) {
        double need = STRATEGIES[k].state_bytes_per_param(d->nranks) * P + models +
                      STRATEGIES[k].unit_buffers * buffers_per_kind * unit_bytes;
        if (need > cap) continue;
        if (STRATEGIES[k].stage <= stage)
            snprintf(hint, sizeof hint, "its working buffers pass the cap: fewer rows (--batch) or more --gpus");
        else
            snprintf(hint, sizeof hint, "--zero=%d (%s) fits: about %.1f MB a rank", STRATEGIES[k].stage,
                     STRATEGIES[k].name, need / 1e6);
        break;
    }
    set_owner(d, hint);
}

int ranks_init(Ranks *d, const StrategyConfig *cfg, const StrategyOps *ops, const char *name) {
    if (cfg->recompute && cfg->unit != UNIT_BLOCK) {
        fprintf(stderr, "error: --recompute=1 recomputes whole blocks: it needs --unit=block\n");
        return -1;
    }
    d->base.ops = ops;
    d->base.name = name;
    d->base.cfg = *cfg;
    d->nranks = cfg->nranks;
    d->pg = pg_create(cfg->nranks, cfg->device, cfg->own_cores);
    d->fibers = d->pg ? fibers_create(d->pg->nranks) : NULL;
    if (!d->pg || !d->fibers) {
        pg_destroy(d->pg);
        fibers_destroy(d->fibers);
        return -1;
    }
    d->local = d->pg->nranks;
    d->first = d->pg->first_rank;
    fibers_name_ranks_from(d->fibers, d->first);
    pg_set_link(d->pg, cfg->link_gbps, cfg->link_latency_us);
    pg_set_sums(d->pg, cfg->sums);
    if (cfg->trace) pg_trace(d->pg, cfg->trace, cfg->trace_label ? cfg->trace_label : "");
    d->base.sync_grads = 1;
    d->base.placement = d->pg->description;
    d->base.device_kind = device_kind(d->pg->device[0]);
    d->base.simulated = d->pg->simulated;
    model_layout(&cfg->model, 1, &d->plain_layout);
    for (int r = 0; r < d->local; r++) device_set_limit(d->pg->device[r], cfg->max_memory_bytes);
    set_owner(d, "the activations do not fit: fewer rows (--batch) or a smaller model");
    for (int r = 0; r < d->local; r++) {
        Model *m = model_create(&cfg->model, cfg->unit, cfg->recompute, d->nranks, d->pg->device[r], d->pg->compute[r],
                                cfg->batch,
                                cfg->model.block_size);
        m->dropout = cfg->dropout;
        m->seed = cfg->seed;
        m->rank = (uint32_t)ranks_global(d, r);
        d->ref[r] = (RankRef){ d, r };
        m->hooks.ctx = &d->ref[r];
        d->model[r] = m;
        d->norm_parts[r] = device_alloc(d->pg->device[r], MEM_WORKING, (size_t)d->nranks * sizeof(float));
    }
    d->layout = &d->model[0]->layout;
    set_memory_hint(d);
    return 0;
}

void ranks_synchronize(Ranks *d) {
    for (int r = 0; r < d->local; r++) {
        stream_synchronize(d->pg->compute[r]);
        stream_synchronize(d->pg->comm[r]);
    }
}

void ranks_release(Ranks *d) {
    for (int r = 0; r < d->local; r++) {
        device_free(d->pg->device[r], MEM_WORKING, d->norm_parts[r], (size_t)d->nranks * sizeof(float));
        model_destroy(d->model[r]);
    }
    fibers_destroy(d->fibers);
    pg_destroy(d->pg);
}

int ranks_global(const Ranks *d, int rank) { return d->first + rank; }

size_t ranks_shard_offset(const Ranks *d, int unit, int rank) {
    const UnitSpec *u = &d->layout->units[unit];
    return u->offset + (size_t)ranks_global(d, rank) * (u->size / (size_t)d->nranks);
}

size_t ranks_shard_arena_offset(const Ranks *d, int unit) {
    return d->layout->units[unit].offset / (size_t)d->nranks;
}

/* A rank that --inject-fault stops at `where` of the step in flight (at the
 * rendezvous of that name, for a collective) fails as a real error there
 * would, through its fibers; 1 if so. */
static int injected_fault(Ranks *d, int rank, FaultSite where, const char *rendezvous) {
    if (!d->training || !fault_strikes(&d->base.cfg, ranks_global(d, rank), (int)d->step, where)) return 0;
    fibers_fail(d->fibers, rank, "injected fault (--inject-fault) at step %u in the %s%s%s%s", d->step,
                fault_site_name(where), rendezvous ? " '" : "", rendezvous ? rendezvous : "", rendezvous ? "'" : "");
    d->failed[rank] = 1;
    return 1;
}

/* --inject-fault=RANK:STEP:hang: the rank stops answering, as a stuck peer
 * would, for the timeout and a minute more (the other processes' timeout
 * ends the run first); then it fails, so that no test can hang for good. 1
 * if it struck. */
static int injected_hang(Ranks *d, int rank) {
    if (!d->training || !fault_strikes(&d->base.cfg, ranks_global(d, rank), (int)d->step, FAULT_HANG)) return 0;
    for (double slept = 0; slept < world()->timeout_s + 60.0; slept += 0.1)
        nanosleep(&(struct timespec){ 0, 100000000 }, NULL);
    return injected_fault(d, rank, FAULT_HANG, NULL);
}

void ranks_rendezvous(Ranks *d, int rank, const char *name, void (*collective)(Ranks *d, int index),
                      int index) {
    if (d->failed[rank] || injected_fault(d, rank, FAULT_COLLECTIVE, name)) return;
    int rc = fibers_arrive(d->fibers, rank, name);
    if (rc == 1) {
        collective(d, index);
        rc = fibers_depart(d->fibers, rank);
    }
    if (rc < 0) d->failed[rank] = 1;
}

void ranks_wait_all(Ranks *d, int rank, Event *const *done) {
    pg_wait_parts(d->pg, rank, d->pg->compute[rank], done);
}

void ranks_events_create(Ranks *d, Event **events) {
    for (int r = 0; r < d->local; r++) events[r] = event_create(d->pg->device[r]);
}

void ranks_events_destroy(Ranks *d, Event **events) {
    for (int r = 0; r < d->local; r++) event_destroy(events[r]);
}

/* One rank's part of a run: its rows forward, and backward when training. */
static int rank_body(Fibers *f, int rank, void *ctx) {
    (void)f;
    Ranks *d = ctx;
    Model *m = d->model[rank];
    int B = d->base.cfg.batch, T = d->base.cfg.model.block_size;
    size_t rows = (size_t)ranks_global(d, rank) * B * T;
    /* each micro-step its own dropout masks */
    uint32_t dropout_step = d->step * (uint32_t)d->micros + (uint32_t)d->micro;
    if (injected_hang(d, rank) || injected_fault(d, rank, FAULT_FORWARD, NULL)) return -1;
    m->ops->forward(m, d->x + rows, d->y + rows, B, T, dropout_step, d->training);
    if (d->training && !injected_fault(d, rank, FAULT_BACKWARD, NULL)) m->ops->backward(m, 1.0f / (float)d->micros);
    return d->failed[rank] ? -1 : 0;
}

int ranks_run(Ranks *d, const int *x, const int *y, uint32_t step, int micro, int micros, int training) {
    d->x = x;
    d->y = y;
    d->step = step;
    d->micro = micro;
    d->micros = micros;
    d->training = training;
    for (int r = 0; r < d->local; r++) d->failed[r] = 0;
    if (fibers_run(d->fibers, rank_body, d) == 0) return 0;
    if (world()->nprocs > 1) fprintf(stderr, "error: process %d: %s\n", world()->proc, fibers_error(d->fibers));
    else fprintf(stderr, "error: %s\n", fibers_error(d->fibers));
    return -1;
}

/* The value ZF_INJECT_NAN (ranks.h) poisons at this step, if any: rank 0's
 * loss, its gradient part or its weights (in process 0). */
static float *injected_nan_target(Ranks *d, uint32_t step) {
    const char *spec = d->first == 0 ? getenv("ZF_INJECT_NAN") : NULL;
    char what[8];
    unsigned first, count = 1;
    if (!spec || sscanf(spec, "%7[a-z]:%u:%u", what, &first, &count) < 2) return NULL;
    if (step < first || step - first >= count) return NULL;
    if (strcmp(what, "loss") == 0) return d->model[0]->mean_loss;
    if (strcmp(what, "grad") == 0) return d->grad_part[0];
    return strcmp(what, "weight") == 0 ? d->weights[0] : NULL;
}

int ranks_forward_backward(Strategy *s, const int *x, const int *y, uint32_t step, int micro, int micros) {
    Ranks *d = (Ranks *)s;
    int rc = ranks_run(d, x, y, step, micro, micros, 1);
    float *target = micro == micros - 1 ? injected_nan_target(d, step) : NULL;
    static const float nan_value = NAN;
    if (rc == 0 && target) stream_copy(d->pg->compute[0], target, &nan_value, sizeof nan_value);
    return rc;
}

void ranks_set_lr(Strategy *s, float lr) { s->lr = lr; }

/* Clip by the global norm: each rank sums the squares of its gradient part;
 * with one part per rank, the partials are all-gathered and summed in order. */
void ranks_clip_grads(Strategy *s, float max_norm) {
    Ranks *d = (Ranks *)s;
    if (max_norm <= 0.0f) return;
    int sharded = d->grad_parts_sharded;
    float *own_part[FIBERS_MAX_RANKS];
    for (int r = 0; r < d->local; r++) {
        own_part[r] = d->norm_parts[r] + (sharded ? ranks_global(d, r) : 0);
        sumsq_reduce(d->pg->compute[r], own_part[r], d->grad_part[r], d->grad_part_len,
                     d->model[r]->sumsq_scratch);
    }
    if (sharded) {
        pg_trace_next(d->pg, "norm", -1);
        pg_all_gather(d->pg, own_part, d->norm_parts, (size_t)d->nranks, NULL);
    }
    for (int r = 0; r < d->local; r++)
        clip_scale(d->pg->compute[r], d->grad_part[r], d->grad_part_len, d->norm_parts[r],
                   sharded ? d->nranks : 1, max_norm);
}

/* Mean over the world's ranks, in rank order, of each rank's mean loss. */
float ranks_train_loss(Strategy *s) {
    Ranks *d = (Ranks *)s;
    float mine[FIBERS_MAX_RANKS], all[FIBERS_MAX_RANKS];
    for (int r = 0; r < d->local; r++) mine[r] = model_read_loss(d->model[r]);
    world_all_gather(mine, all, (size_t)d->local * sizeof(float), "the losses");
    double total = 0.0;
    for (int g = 0; g < d->nranks; g++) total += all[g];
    return (float)(total / d->nranks);
}

/* Evaluation is split over the ranks: each runs its rows, without dropout. */
float ranks_eval_loss(Strategy *s, const int *x, const int *y) {
    Ranks *d = (Ranks *)s;
    if (ranks_run(d, x, y, 0, 0, 1, 0) != 0) return NAN;
    return ranks_train_loss(s);
}

/* On rank 0, whose tokens every process then has. With sharded weights, they
 * are gathered once (by every process) into a GPT that lives for this call,
 * on rank 0's device. */
int ranks_generate(Strategy *s, int *tokens, int n_prompt, int n_new, Sampling how) {
    Ranks *d = (Ranks *)s;
    if (s->cfg.model.kind != MODEL_GPT) return -1;
    if (d->weights_held == HELD_FULL) {
        if (d->first == 0) gpt_generate((GPT *)d->model[0], tokens, n_prompt, n_new, how);
        world_broadcast(tokens + n_prompt, (size_t)n_new * sizeof(int), "the sample");
        return 0;
    }
    GPT *g = gpt_create(&s->cfg.model, UNIT_BLOCK, 0, 1, d->pg->device[0], d->pg->compute[0], 1, s->cfg.model.block_size);
    model_own_weights(&g->base);
    float *host = host_calloc(d->plain_layout.total, sizeof(float));
    ranks_read_weights(s, host);
    stream_copy(g->base.stream, g->base.params, host, d->plain_layout.total * sizeof(float));
    if (d->first == 0) gpt_generate(g, tokens, n_prompt, n_new, how);
    world_broadcast(tokens + n_prompt, (size_t)n_new * sizeof(int), "the sample");
    stream_synchronize(g->base.stream);  /* the copy above, when nothing was generated */
    model_destroy(&g->base);
    free(host);
    return 0;
}

/* Copy between the host layout of one rank and a padded host arena, tensor by
 * tensor; the host layout's own padding is zero. */
static void unpad(const Ranks *d, float *plain, const float *padded) {
    memset(plain, 0, d->plain_layout.total * sizeof(float));
    for (int i = 0; i < d->layout->ntensors; i++)
        memcpy(plain + d->plain_layout.tensors[i].offset, padded + d->layout->tensors[i].offset,
               d->layout->tensors[i].numel * sizeof(float));
}

static void pad(const Ranks *d, float *padded, const float *plain) {
    for (int i = 0; i < d->layout->ntensors; i++)
        memcpy(padded + d->layout->tensors[i].offset, plain + d->plain_layout.tensors[i].offset,
               d->layout->tensors[i].numel * sizeof(float));
}

/* Floats in a rank's buffer of a state held as `how`. */
static size_t held_length(const Ranks *d, Holding how) {
    return how == HELD_FULL ? d->layout->total : d->layout->total / (size_t)d->nranks;
}

/* Global rank g's copies, on stream s, between its buffer and the padded host
 * arena, as held. */
static void copy_rank(Ranks *d, Stream *s, int g, float *buf, Holding how, float *padded, int to_host) {
    size_t part = d->layout->total / (size_t)d->nranks;
    if (how == HELD_FULL) {
        size_t bytes = d->layout->total * sizeof(float);
        stream_copy(s, to_host ? padded : buf, to_host ? buf : padded, bytes);
    } else if (how == HELD_PARTS) {
        float *host = padded + (size_t)g * part;
        stream_copy(s, to_host ? host : buf, to_host ? buf : host, part * sizeof(float));
    } else {
        for (int u = 0; u < d->layout->nunits; u++) {
            const UnitSpec *unit = &d->layout->units[u];
            size_t shard = unit->size / (size_t)d->nranks;
            float *host = padded + unit->offset + (size_t)g * shard, *dev = buf + ranks_shard_arena_offset(d, u);
            stream_copy(s, to_host ? host : dev, to_host ? dev : host, shard * sizeof(float));
        }
    }
}

static void synchronize_compute(Ranks *d) {
    for (int r = 0; r < d->local; r++) stream_synchronize(d->pg->compute[r]);
}

/* Every process's ranks' buffers, all-gathered into one host array in global
 * rank order, then placed as held. */
static void gather_to_host(Ranks *d, float *const *bufs, Holding how, float *padded) {
    size_t len = held_length(d, how);
    float *mine = host_calloc((size_t)d->local * len, sizeof(float)), *all = host_calloc((size_t)d->nranks * len, sizeof(float));
    for (int r = 0; r < d->local; r++) stream_copy(d->pg->compute[r], mine + (size_t)r * len, bufs[r], len * sizeof(float));
    synchronize_compute(d);
    world_all_gather(mine, all, (size_t)d->local * len * sizeof(float), "the state's shards");
    for (int g = 0; g < d->nranks; g++) copy_rank(d, d->pg->compute[0], g, all + (size_t)g * len, how, padded, 1);
    synchronize_compute(d);
    free(mine);
    free(all);
}

void ranks_to_host(Ranks *d, float *const *bufs, Holding how, float *host) {
    float *padded = host_calloc(d->layout->total, sizeof(float));
    if (how != HELD_FULL && d->local < d->nranks) {
        gather_to_host(d, bufs, how, padded);
    } else {
        for (int r = 0; r < (how == HELD_FULL ? 1 : d->local); r++)
            copy_rank(d, d->pg->compute[r], ranks_global(d, r), bufs[r], how, padded, 1);
        synchronize_compute(d);
        /* rank 0's replica, which process 0 holds */
        world_broadcast(padded, d->layout->total * sizeof(float), "the state");
    }
    unpad(d, host, padded);
    free(padded);
}

void ranks_from_host(Ranks *d, float *const *bufs, Holding how, const float *host) {
    float *padded = host_calloc(d->layout->total, sizeof(float));
    pad(d, padded, host);
    world_broadcast(padded, d->layout->total * sizeof(float), "the state");
    for (int r = 0; r < d->local; r++) copy_rank(d, d->pg->compute[r], ranks_global(d, r), bufs[r], how, padded, 0);
    synchronize_compute(d);
    free(padded);
}

void ranks_read_weights(Strategy *s, float *host) {
    Ranks *d = (Ranks *)s;
    ranks_to_host(d, d->weights, d->weights_held, host);
}

void ranks_write_weights(Strategy *s, const float *host) {
    Ranks *d = (Ranks *)s;
    ranks_from_host(d, d->weights, d->weights_held, host);
}

void ranks_read_state(Strategy *s, float *m, float *v) {
    Ranks *d = (Ranks *)s;
    ranks_to_host(d, d->m, d->adam_held, m);
    ranks_to_host(d, d->v, d->adam_held, v);
}

void ranks_write_state(Strategy *s, const float *m, const float *v) {
    Ranks *d = (Ranks *)s;
    ranks_from_host(d, d->m, d->adam_held, m);
    ranks_from_host(d, d->v, d->adam_held, v);
}

void ranks_init_weights(Ranks *d) {
    float *init = host_calloc(d->plain_layout.total, sizeof(float));
    model_init_params(&d->base.cfg.model, &d->plain_layout, d->base.cfg.seed, init);
    ranks_write_weights(&d->base, init);
    free(init);
}

size_t ranks_rank_bytes(Strategy *s, int rank, MemKind kind) {
    return device_bytes_in_use(((Ranks *)s)->pg->device[rank], kind);
}

size_t ranks_rank_peak_bytes(Strategy *s, int rank) { return device_peak_bytes(((Ranks *)s)->pg->device[rank]); }

/* Each count goes through the first float of the rank's norm_parts, free
 * between clippings, and the model's sumsq scratch (any part of the arena
 * fits): no allocation per step. The counts follow each other on the rank's
 * compute stream. */
size_t ranks_count_nonfinite(Strategy *s, NonfiniteOf what) {
    Ranks *d = (Ranks *)s;
    enum { MAX_BUFFERS = 3 };
    float counts[FIBERS_MAX_RANKS][MAX_BUFFERS] = { { 0 } };
    for (int r = 0; r < d->local; r++) {
        const float *bufs[MAX_BUFFERS] = { d->grad_part[r] };
        size_t lens[MAX_BUFFERS] = { d->grad_part_len };
        int nbufs = 1;
        if (what == NONFINITE_STATE) {
            bufs[0] = d->weights[r];
            bufs[1] = d->m[r];
            bufs[2] = d->v[r];
            lens[0] = held_length(d, d->weights_held);
            lens[1] = lens[2] = held_length(d, d->adam_held);
            nbufs = 3;
        }
        for (int b = 0; b < nbufs; b++) {
            count_nonfinite(d->pg->compute[r], d->norm_parts[r], bufs[b], lens[b], d->model[r]->sumsq_scratch);
            stream_copy(d->pg->compute[r], &counts[r][b], d->norm_parts[r], sizeof(float));
        }
    }
    size_t total = 0;
    for (int r = 0; r < d->local; r++) {
        stream_synchronize(d->pg->compute[r]);
        for (int b = 0; b < MAX_BUFFERS; b++) total += (size_t)counts[r][b];
    }
    size_t totals[FIBERS_MAX_RANKS];
    world_all_gather(&total, totals, sizeof total, "the non-finite counts");
    for (int p = 0; p < world()->nprocs; p++)
        if (p != world()->proc) total += totals[p];
    return total;
}
