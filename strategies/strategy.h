/* strategy.h: one interface for every way of keeping ranks in step.
 *
 * The trainer drives a Strategy without naming one. Each step is
 *
 *     s->ops->set_lr(s, lr);
 *     s->ops->forward_backward(s, x, y, step, 0, 1);  // each rank's rows of the global batch
 *     s->ops->clip_grads(s, max_norm);          // global norm over every rank's part
 *     s->ops->step(s);                          // AdamW on what each rank owns, clipping as it reads
 *
 * The global batch has nranks * batch rows; rank r takes rows [r * batch, (r+1) * batch).
 */
#ifndef ZF_STRATEGY_H
#define ZF_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "../model/sample.h"
#include "../runtime/inject.h"
#include "../runtime/process_group.h"
#include "../runtime/profile.h"

/* How the collectives run under the compute: the same bits either way. */
typedef struct {
    /* 1: DDP all-reduces buckets of bucket_bytes (the first one 1 MB) as their
     * units finish; ZeRO-2/3 reduce-scatter each unit on the communication
     * stream and prefetch the next unit's gather. A bucket_bytes under 1 MB
     * makes the first bucket that small too. */
    int enabled;
    size_t bucket_bytes;
    /* ZeRO-2/3: units gathered and gradient slots at once, at most (FSDP's
     * limit_all_gathers); ZeRO-3 prefetches up to max_live_units - 1 units
     * ahead. 1..MAX_LIVE_UNITS; 0 is the default, 2. */
    int max_live_units;
} OverlapPolicy;

/* How the blocks are cut into units (model/model.h): the unit of every
 * collective and working buffer, with the same bits for each choice. */
typedef struct {
    UnitPolicy cut;
    /* 1: activation recompute (model/gpt.h), with cut UNIT_BLOCK only: each
     * block's forward runs again just before its backward. The same bits. */
    int recompute;
    /* 1: GELU's output is not kept but made again before its backward. The same bits. */
    int recompute_gelu;
    /* 1: the LayerNorms' outputs are not kept but made again, each before
     * its Linear's backward, from the kept input and statistics. The same bits. */
    int recompute_norms;
} UnitsPolicy;

/* What a run records or provokes to be looked at. */
typedef struct {
    /* Trace the ranks' streams there (runtime/trace.h; NULL: none), as processes
     * "rank r", or "LABEL rank r" with a trace_label; the trace outlives the
     * strategy, whose destroy collects it. */
    Trace *trace;
    const char *trace_label;
    /* Profile the ops of rank 0's compute stream there (runtime/profile.h;
     * NULL: none); the profile outlives the strategy, whose destroy lets the
     * stream go. */
    Profile *profile;
    Fault fault;            /* a failure to inject (runtime/inject.h); where FAULT_NONE for none */
} Diagnostics;

typedef struct {
    ModelConfig model;      /* a GPT, or the small MLP of the gates */
    int nranks;
    /* Hybrid sharding (--shard-ranks, FSDP's HYBRID_SHARD): ZeRO-1/2/3 shard
     * over groups of S consecutive ranks and replicate over the N / S groups,
     * every sum still over the N ranks in order (runtime/process_group.h); S
     * divides N; 0 (or N) is full sharding. DDP shards nothing. */
    int shard_ranks;
    Placement device;       /* where the ranks run (runtime/process_group.h) */
    /* 1: simulated ranks on the CPU each keep to cores of their own, so they
     * progress alike, as devices (pg_create_simulator): bin/train with a
     * modeled link, and the benches that time one against no link at all. */
    int own_cores;
    size_t max_memory_bytes;  /* each rank's device memory cap (--max-memory-mb); 0: none */
    SumOrder sums;          /* how ranks on GPUs through NCCL sum (--collectives; the zero value: in rank order) */
    int batch;              /* rows per rank */
    float dropout;
    uint32_t seed;
    float beta1, beta2, eps, weight_decay;
    DType precision;    /* the compute's (--dtype): fp32, or a bf16 copy under torch.autocast (model/gpt.h) */
    /* The gradients' reductions (--reduce-dtype, FSDP's reduce_dtype): fp32,
     * or bf16, summed in bf16 in rank order at half the bytes
     * (runtime/process_group.h); the mean gradient bf16 values, held in bf16
     * when the compute is bf16 too (strategy_grads_held), else in fp32. */
    DType reduce_precision;
    OverlapPolicy overlap;
    UnitsPolicy units;
    LinkModel link;         /* a modeled link for simulated ranks (runtime/link_model.h) */
    /* Its tier between nodes (--link-inter; gbps 0: one tier), nodes of
     * node_ranks consecutive ranks (0: the shard_ranks groups). */
    LinkModel link_inter;
    int node_ranks;
    /* 1: each kind of training micro-step captured once as a graph of every
     * local rank's work and run again (strategies/rank_graphs.h); the same bits. */
    int graphs;
    Diagnostics diagnostics;
} StrategyConfig;

enum { MAX_LIVE_UNITS = 8, DEFAULT_LIVE_UNITS = 2 };
/* cfg's max_live_units, its default filled in. */
int strategy_live_units(const StrategyConfig *cfg);
/* cfg's shards S: shard_ranks, or N for 0. */
int strategy_shard_ranks(const StrategyConfig *cfg);
/* cfg's ranks and modeled link, as the link model takes them. */
LinkShape strategy_link_shape(const StrategyConfig *cfg);
/* How the ranks hold the gradients under cfg: in bf16 (2 bytes a number,
 * the ZeRO paper's) when the compute and the reductions are both bf16,
 * which makes them and sums them in bf16; else in fp32, as FSDP keeps a
 * gradient it reduces in fp32. */
DType strategy_grads_held(const StrategyConfig *cfg);

typedef struct Strategy Strategy;
typedef struct StrategyKind StrategyKind;

/* How each rank's model computes under kind and cfg: its recompute and
 * precision, whether it reads the weights' bf16 copy in place (where cfg's
 * layout puts every tensor on its operand boundary), and whether each unit's
 * gradient is fresh (zero) as its backward begins (ZeRO-2/3's slots, held in
 * bf16). */
ComputePolicy strategy_compute(const StrategyKind *kind, const StrategyConfig *cfg);

/* What count_nonfinite looks at: each rank's part of the mean gradient (after
 * forward_backward), or what a checkpoint holds (weights and Adam's m and v). */
typedef enum { NONFINITE_GRADS, NONFINITE_STATE } NonfiniteOf;

/* What a checkpoint moves: the weights, or Adam's m (exp_avg) or v (exp_avg_sq). */
typedef enum { STATE_WEIGHTS, STATE_EXP_AVG, STATE_EXP_AVG_SQ, STATE_KINDS } StateOf;

typedef struct {
    void (*set_lr)(Strategy *s, float lr);
    /* Micro-step `micro` of `micros` of a step (1 without accumulation): the
     * gradient starts from zero at micro-step 0, the micro-steps' gradients add
     * up (each 1/micros of its batch's mean), and the ranks synchronise them at
     * the last (DDP and ZeRO-1: not before, as PyTorch's no_sync; ZeRO-2/3
     * reduce-scatter every micro-step into the shards, as FSDP does). 0, or -1
     * after printing the failing rank and why. */
    int (*forward_backward)(Strategy *s, const int *x, const int *y, uint32_t step, int micro, int micros);
    /* The global norm of the gradient for the next step's clip (max_norm <= 0:
     * none); the step scales each gradient as its AdamW reads it, and the
     * gradient itself is left as it is. */
    void (*clip_grads)(Strategy *s, float max_norm);
    void (*step)(Strategy *s);
    /* Mean over ranks of the training loss of the last forward_backward (waits). */
    float (*train_loss)(Strategy *s);
    /* Mean loss of a forward without dropout over a global batch (waits). */
    float (*eval_loss)(Strategy *s, const int *x, const int *y);
    /* Generate n_new tokens after the prompt tokens[0, n_prompt) on rank 0, as
     * gpt_generate does (model/sample.h); -1 when the model is no GPT. */
    int (*generate)(Strategy *s, int *tokens, int n_prompt, int n_new, Sampling how);
    /* Tensor t (of the model's layout) of a state, to the host of process 0
     * (its numel floats) from the ranks that hold its parts, or from process
     * 0's host to them. Every process calls it for the same tensor, the others
     * with host NULL; one tensor is the most any host holds of the state, and
     * only process 0's (checkpoints stream through it). Waits. */
    void (*read_tensor)(Strategy *s, StateOf what, int tensor, float *host);
    void (*write_tensor)(Strategy *s, StateOf what, int tensor, const float *host);
    /* Bytes one rank holds, per kind (weights, grads, optimizer, working). */
    size_t (*rank_bytes)(Strategy *s, int rank, MemKind kind);
    /* The most bytes of every kind together one rank held at once since the
     * strategy was made: its device's high-water mark. */
    size_t (*rank_peak_bytes)(Strategy *s, int rank);
    void (*destroy)(Strategy *s);
    /* How many values of `what` are NaN or infinite, over every rank's part:
     * one reduction per buffer on each rank's device, then the counts (waits).
     * The gradient's is its squared norm, which clip_grads then reuses. */
    size_t (*count_nonfinite)(Strategy *s, NonfiniteOf what);
    /* Wait until every rank's streams are idle: train_loss waits for the
     * compute alone, and collectives may still be running after a step (ZeRO-2's
     * weight gathers with overlap). The benchmarks end a timed turn with it. */
    void (*synchronize)(Strategy *s);
} StrategyOps;

struct Strategy {
    const StrategyOps *ops;
    const StrategyKind *kind;  /* its entry in STRATEGIES: its name, its stage, what sets it apart */
    const char *placement;  /* where the ranks run, in words */
    DeviceKind device_kind;
    int simulated;          /* 1: the ranks are simulated on one device */
    StrategyConfig cfg;
    float lr;
    int adam_step;          /* updates done so far */
    int sync_grads;         /* 1; 0 skips the gradient collectives (the no_sync probe of make bench) */
    int graph_captures;     /* --graphs=1: the micro-steps captured as graphs so far, */
    int graph_launches;     /* and those run as a graph's launch */
};

/* Every strategy, by --zero stage: the one place where the stages differ.
 * Code that handles every strategy walks this table; a new strategy is one
 * more entry (and its create). */
struct StrategyKind {
    const char *name;       /* "DDP", "ZeRO-1", ... */
    int stage;              /* --zero */
    /* kind is this entry; the four creates are in replicated.c (DDP, ZeRO-1)
     * and sharded.c (ZeRO-2, ZeRO-3), and read the entry's flags below. */
    Strategy *(*create)(const StrategyKind *kind, const StrategyConfig *cfg);
    /* Which states a rank holds 1/N of (the rest whole). ZeRO-1 shards Adam's
     * m and v; ZeRO-2 the gradients too, each unit reduce-scattered into the
     * shards as its backward ends; ZeRO-3 the weights too, each unit gathered
     * for its forward and its backward (FSDP's FULL_SHARD; ZeRO-2 is its
     * SHARD_GRAD_OP, whose full weights are all-gathered after each step). */
    int shards_weights, shards_grads, shards_adam;
    /* Kinds of working buffer of the largest unit's size (ZeRO-2: gradient
     * slots; ZeRO-3: and gather buffers): max_live_units of each with overlap
     * on, one with it off. */
    int unit_buffers;
    /* What one step's collectives cost on cfg's modeled link
     * (strategy_link_shape; runtime/link_model.h, over cfg's units padded for
     * its shards, the gradients' reductions in cfg's reduce precision,
     * the weights' gathers in its compute precision, the rest in fp32), with
     * clipping's gather of the norms' partials where
     * `clips`: the seconds they hold it, what bench_overlap holds the
     * measured time to and bin/train refuses past a minute; and the bytes
     * they move between nodes on a two-tier link. */
    LinkCost (*link_cost)(const StrategyConfig *cfg, int clips);
};
enum { STRATEGY_KINDS = 4 };
/* DDP and ZeRO-1: full replicas, ZeRO-1's Adam state sharded (replicated.c). */
Strategy *replicated_create(const StrategyKind *kind, const StrategyConfig *cfg);
/* ZeRO-2 and ZeRO-3, unit by unit (sharded.c). */
Strategy *sharded_create(const StrategyKind *kind, const StrategyConfig *cfg);
extern const StrategyKind STRATEGIES[STRATEGY_KINDS];

/* What one rank of `kind` will hold under cfg on a device of that kind, by
 * MemKind, in bytes, without allocating anything (as DeepSpeed's
 * estimate_zero3_model_states_mem_needs, with the working buffers and the
 * activations too): the state over cfg's padded layout, the unit-sized
 * buffers, the clipping partials, and the model's activations and scratch
 * for cfg->batch rows (model_estimate). bin/zero_memory holds it to the
 * allocator's counts. */
void strategy_estimate(const StrategyKind *kind, const StrategyConfig *cfg, DeviceKind device,
                       double bytes[MEM_KINDS]);

/* The state one rank of `kind` holds at N ranks, in bytes per parameter, each
 * part whole or 1/N as the kind's shard flags say: in fp32, 4 of weights, 4 of
 * gradients and 8 of Adam's m and v (the paper's 16, 8 + 8/N, 4 + 12/N, 16/N);
 * in mixed precision (compute bf16), the paper's accounting: 2 of bf16
 * weights, the gradients in the reduce precision (bf16: the paper's 2), and
 * K = 12 of fp32 master weights, m and v. `whole` and `sharded` get the two
 * terms (bytes = whole + sharded / N); either may be NULL. */
double strategy_state_bytes_per_param(const StrategyKind *kind, int nranks, DType compute, DType reduce,
                                      double *whole, double *sharded);

/* The entry of a --zero stage; NULL for none. */
const StrategyKind *strategy_kind(int stage);
/* The stages there are, in words for a message: "0, 1, 2 or 3". */
void strategy_stages_text(char *out, size_t len);
/* What no strategy can run: no such stage, a max_live_units out of range
 * (0: the default), recompute with units other than whole blocks, bf16 on
 * the MLP, shard_ranks that do not divide N or that DDP is given, a second
 * tier of the link with no first or no nodes, graphs with what a graph
 * cannot hold (rank_graphs.h). 0, or -1 with the one line that says so in
 * err, in the flags' words. */
int strategy_config_error(int zero, const StrategyConfig *cfg, char *err, size_t len);
/* The strategy of a --zero stage; NULL with strategy_config_error's line. */
Strategy *strategy_create(int zero, const StrategyConfig *cfg);

/* The whole of a state in the layout of nranks = 1 (its padding zero), tensor
 * by tensor, to or from process 0's host: for the tests and small models (a
 * checkpoint streams instead, one tensor at a time). */
void strategy_read_all(Strategy *s, StateOf what, float *host);
void strategy_write_all(Strategy *s, StateOf what, const float *host);

#endif
