/* options.h: the tools' flags, their presets and their parsing.
 *
 * One table holds every flag, and each row says which tools take it: a tool
 * passes its own identity (Tool) to options_read and options_usage, takes
 * its own flags, lists them in --help and refuses another tool's by name. */
#ifndef ZF_OPTIONS_H
#define ZF_OPTIONS_H

#include <stdint.h>
#include <stdio.h>

#include "../runtime/process_group.h"
#include "../strategies/strategy.h"

enum { OPTION_PATH_MAX = 512, MAX_FLAGS = 72 };

/* The tools that read these flags, one bit each (a flag's row holds the bits
 * of the tools that take it). */
typedef enum {
    TOOL_TRAIN = 1 << 0,
    TOOL_SAMPLE = 1 << 1,
    TOOL_PREPARE = 1 << 2,
    TOOL_ZERO_MEMORY = 1 << 3,
    TOOL_BENCH = 1 << 4,  /* bench/: they time bin/train's runs, and take bin/train's flags */
} Tool;

typedef struct {
    char preset[32];
    char data[OPTION_PATH_MAX];      /* a text file, or a folder of token ids (model/data.h) */
    char tokenizer[OPTION_PATH_MAX]; /* a tokenizer.json for a token folder's ids; "" for none */
    char newlines[16];               /* bin/prepare: universal (Python's text mode: \r\n and \r as \n) or raw */
    char log[OPTION_PATH_MAX];
    char trace[OPTION_PATH_MAX];     /* a Chrome trace of the first trace_steps steps; "" for none */
    int trace_steps;
    int layers, heads, embd, block, batch;
    int bias;                        /* 1: biases in every Linear and LayerNorm (GPT-2's) */
    char gelu[8];                    /* erf (exact, nanoGPT's) or tanh (GPT-2's approximation) */
    int pad_vocab;                   /* the model's vocabulary, the data's rounded up to a multiple of this */
    int iters, warmup, decay_iters;  /* decay_iters < 0: the same as iters */
    int eval_every, eval_iters, log_every, seed;
    int sample_count;                /* characters, or tokens of a token model, sampled (bin/sample: generated) */
    int zero, gpus;                  /* ZeRO stage; ranks (simulated without GPUs) */
    int shard_ranks;                 /* ZeRO-1/2/3: ranks a group shards over (0: the world's) */
    char device[8];                  /* auto, cpu or cuda */
    char collectives[8];             /* ordered or nccl: how ranks on GPUs sum */
    int tf32;                        /* 1: TF32 tensor cores for the GPU's matmuls */
    char dtype[8];                   /* fp32, or bf16: mixed precision's compute, as torch.autocast */
    char reduce_dtype[8];            /* fp32, or bf16: the gradients' reductions, as FSDP's reduce_dtype */
    int overlap;                     /* 1: collectives under the backward */
    int graphs;                      /* 1: each kind of micro-step captured once as a graph, then run again */
    float bucket_mb;                 /* DDP's bucket size */
    char unit[8];                    /* block, half or tensor: how the blocks are cut into units */
    int max_live_units;              /* ZeRO-2/3: units gathered and gradient slots at once */
    int recompute;                   /* 1: each block's forward again before its backward */
    int recompute_gelu;              /* 1: GELU's output again before its backward, not kept */
    int recompute_norms;             /* 1: the LayerNorms' outputs again before their Linears' backward, not kept */
    char link[32];                   /* GBPS[,LATENCY_US]: a modeled link; "" for none */
    char link_inter[32];             /* the same, its tier between groups (nodes); "" for one tier */
    char out[OPTION_PATH_MAX];       /* checkpoints go to out/ckpt.safetensors; "" for none */
    char resume[OPTION_PATH_MAX];    /* a checkpoint to continue */
    char init_from[OPTION_PATH_MAX]; /* a checkpoint's weights to start from */
    int always_save, grad_accum;
    int overwrite;                   /* 1: a run that does not resume the checkpoint in --out may replace it */
    char on_nan[8];                  /* stop or skip: a step whose loss or gradient is not finite */
    int max_skips;                   /* steps --on-nan=skip may skip before the run stops */
    float max_memory_mb;             /* each rank's device memory cap; 0: none */
    float timeout;                   /* seconds a collective waits for the other processes */
    int nodes, node_rank;            /* processes of a run without mpirun, and this one's index */
    char rendezvous[OPTION_PATH_MAX];  /* file:PATH where they meet; "" for none */
    char inject_fault[32];           /* RANK:STEP:WHERE; "" for none */
    Fault fault;                     /* inject_fault parsed (FAULT_NONE for none) */
    int init_vocab;                  /* a Hugging Face --init-from's vocabulary, the least the model's; 0: none */
    /* bin/zero_memory */
    int estimate;                    /* 1: the rows from the formulas, nothing built */
    /* bin/sample */
    char ckpt[OPTION_PATH_MAX];
    char prompt[OPTION_PATH_MAX];    /* at most OPTION_PATH_MAX - 1 bytes */
    float temperature;
    int top_k;
    float lr, min_lr, dropout, weight_decay, beta2, grad_clip;
} TrainOptions;

/* Fill o with the named preset (char, char-small, gpt2, gpt2-medium,
 * gpt2-large, gpt2-xl); -1 if unknown. */
int options_preset(TrainOptions *o, const char *name);
/* The model's vocabulary for data of data_vocab ids: rounded up to --pad-vocab. */
int options_model_vocab(const TrainOptions *o, int data_vocab);
/* The GPT the flags ask for, over data of data_vocab ids (and at least
 * init_vocab), its vocabulary rounded up to --pad-vocab. */
ModelConfig options_model(const TrainOptions *o, int data_vocab);
/* Whether argv gives --name (as --name=VALUE or --name VALUE), not the preset. */
int options_given(int argc, char **argv, const char *name);
/* A Hugging Face GPT-2 to start from (--init-from, model/hf_gpt2.h) sets the
 * model: its layers, heads, width, biases and GELU; its positions as --block,
 * unless the command line asks fewer (the first rows are kept); its
 * vocabulary as init_vocab. A shape flag of the command line (argv) that asks
 * another is refused. 0, or 2 with a one-line message naming the flag. */
int options_take_hf_model(TrainOptions *o, const ModelConfig *hf, int argc, char **argv, char *err,
                          size_t errlen);
/* The --link flag's bandwidth (GB/s) and latency (us); 0, 0 without one; and --link-inter's. */
LinkModel options_link(const TrainOptions *o);
LinkModel options_link_inter(const TrainOptions *o);
/* What --overlap, --bucket-mb and --max-live-units ask of the collectives. */
OverlapPolicy options_overlap(const TrainOptions *o);
/* What --unit and --recompute ask. */
UnitsPolicy options_units(const TrainOptions *o);
/* What --recompute, --recompute-gelu and --recompute-norms make again, in words:
 * "whole blocks", "GELU", "LayerNorms", "GELU and LayerNorms" or "nothing". */
const char *options_recompute_text(const TrainOptions *o);
/* Where --device asks the ranks to run. */
Placement options_placement(const TrainOptions *o);
/* The compute's precision --dtype asks; the reductions' --reduce-dtype asks. */
DType options_precision(const TrainOptions *o);
DType options_reduce_precision(const TrainOptions *o);
/* How --collectives asks NCCL's ranks to sum. */
SumOrder options_sums(const TrainOptions *o);
/* Join the processes of --nodes through --rendezvous (nothing for one): 0, or
 * the exit status with a message (2 where no GPU is visible, 1 where joining
 * failed). */
int options_join_world(const TrainOptions *o);
/* The exit status when no strategy could be made (the message is printed):
 * 1 when CUDA is there but failed (a run that could not go on), 2 for a
 * command line no run can use (--device=cuda without a GPU). */
int options_no_strategy_status(const TrainOptions *o);
/* The tool's name, as its messages begin ("train", "sample", ...). */
const char *options_tool_name(Tool tool);
/* Read tool's --flag=value / --flag value over a preset (--preset=NAME,
 * default default_preset), printing nothing: 0 to run, 1 for --help, or 2
 * with a one-line message naming the bad flag or value in err (a flag of
 * another tool named as such). */
int options_read(TrainOptions *o, Tool tool, const char *default_preset, int argc, char **argv, char *err,
                 size_t errlen);
/* options_read for a tool of one process: --help printed (1), or the message
 * (2) on stderr. */
int options_parse(TrainOptions *o, Tool tool, const char *default_preset, int argc, char **argv);
/* The help line of each flag tool takes, with the preset's defaults, to out. */
void options_usage(FILE *out, Tool tool, TrainOptions *o);
/* The sample's length names the model's unit: --chars (bin/train's
 * --sample-chars) for a model of a text's bytes, --tokens (--sample-tokens)
 * for one of token ids (characters: 1 for the former), the last of them
 * given naming the length; a length of 0, no sample, either. 0, or 2 with a one-line message naming the flag to use. */
int options_check_sample_unit(const TrainOptions *o, Tool tool, int characters, int argc, char **argv, char *err,
                              size_t errlen);
/* What a run's flags make it: each of bin/train's flags' value hashed into hashes[i] and its
 * name into names[i] (MAX_FLAGS of room each), --node-rank's hash 0 (each
 * process has its own); how many. Two processes run the same only if every
 * hash is equal, however the values were written (--lr=1e-3, --lr 0.001) and
 * in whatever order. */
int options_flag_hashes(TrainOptions *o, uint64_t *hashes, const char **names);
/* FNV-1a over bytes, from h (0xcbf29ce484222325 to start). */
uint64_t options_hash(uint64_t h, const void *data, size_t bytes);

#endif
