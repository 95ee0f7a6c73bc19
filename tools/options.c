/* options.c: the tools' flag table, presets and validation for options.h. */
#include "options.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/arena.h"
#include "../runtime/rank_threads.h"
#include "../runtime/world.h"

/* nanoGPT's GPT-2 configs: name, layers, heads, width */
static const struct { const char *name; int layers, heads, embd; } GPT2_PRESETS[] = {
    { "gpt2", 12, 12, 768 }, { "gpt2-medium", 24, 16, 1024 }, { "gpt2-large", 36, 20, 1280 },
    { "gpt2-xl", 48, 25, 1600 },
};

int options_model_vocab(const TrainOptions *o, int data_vocab) {
    long padded = ((long)data_vocab + o->pad_vocab - 1) / o->pad_vocab * o->pad_vocab;
    return padded > (1 << 24) ? data_vocab : (int)padded;
}

ModelConfig options_model(const TrainOptions *o, int data_vocab) {
    int vocab = data_vocab > o->init_vocab ? data_vocab : o->init_vocab;
    return (ModelConfig){ options_model_vocab(o, vocab), o->block, o->layers, o->heads, o->embd, MODEL_GPT,
                          o->bias, strcmp(o->gelu, "tanh") == 0 };
}

int options_preset(TrainOptions *o, const char *name) {
    /* values the presets share: nanoGPT's shakespeare_char config */
    TrainOptions base = {
        .data = "data/tinyshakespeare.txt", .tokenizer = "", .newlines = "universal", .log = "", .trace = "",
        .trace_steps = 3,
        .warmup = 100, .decay_iters = -1, .eval_every = 250, .log_every = 10,
        .sample_count = 500, .seed = 1337, .zero = 0, .gpus = 1, .device = "auto", .overlap = 1, .bucket_mb = 25.0f, .link = "", .link_inter = "",
        .collectives = "ordered", .nodes = 1, .rendezvous = "", .unit = "block", .dtype = "fp32", .reduce_dtype = "fp32",
        .max_live_units = DEFAULT_LIVE_UNITS,
        .grad_accum = 1, .on_nan = "stop", .max_skips = 10, .timeout = 300.0f, .prompt = "\n", .temperature = 1.0f,
        .lr = 1e-3f, .min_lr = 1e-4f, .weight_decay = 0.1f, .beta2 = 0.99f, .grad_clip = 1.0f, .pad_vocab = 1,
        .gelu = "erf",
    };
    size_t gpt2 = 0, n_gpt2 = sizeof GPT2_PRESETS / sizeof *GPT2_PRESETS;
    while (gpt2 < n_gpt2 && strcmp(name, GPT2_PRESETS[gpt2].name) != 0) gpt2++;
    if (strcmp(name, "char") == 0) {
        base.layers = 6; base.heads = 6; base.embd = 384; base.block = 256; base.batch = 64;
        base.iters = 5000; base.eval_iters = 200; base.dropout = 0.2f;
    } else if (strcmp(name, "char-small") == 0) {
        /* nanoGPT's README recipe for a CPU */
        base.layers = 4; base.heads = 4; base.embd = 128; base.block = 64; base.batch = 12;
        base.iters = 2000; base.eval_iters = 20; base.dropout = 0.0f;
    } else if (gpt2 < n_gpt2) {
        /* nanoGPT's config/train_gpt2.py over train.py's defaults; biases as GPT-2 has them; its 40 micro-batches
         * of 12 over 8 ranks are 5 a rank; GPT-2's 50257 ids padded to 50304 */
        base.layers = GPT2_PRESETS[gpt2].layers; base.heads = GPT2_PRESETS[gpt2].heads;
        base.embd = GPT2_PRESETS[gpt2].embd; base.block = 1024; base.batch = 12; base.grad_accum = 5;
        base.bias = 1; base.pad_vocab = 64; base.dropout = 0.0f;
        snprintf(base.gelu, sizeof base.gelu, "tanh");
        base.iters = 600000; base.warmup = 2000; base.lr = 6e-4f; base.min_lr = 6e-5f; base.beta2 = 0.95f;
        base.eval_every = 1000; base.eval_iters = 200;
    } else {
        return -1;
    }
    snprintf(base.preset, sizeof base.preset, "%s", name);
    *o = base;
    return 0;
}

/* FLAG_SWITCH: an int of 0 or 1, and the flag alone (--estimate) is 1. */
typedef enum { FLAG_INT, FLAG_FLOAT, FLAG_TEXT, FLAG_SWITCH } FlagType;
/* A flag: the tools that take it (Tool bits), where its value goes, and for
 * text, how big that buffer is. A name may have a row for each meaning it has
 * in different tools (bin/prepare's --out is not bin/train's). */
typedef struct {
    const char *name;
    unsigned tools;
    FlagType type;
    void *value;
    size_t size;
    const char *help;
} Flag;

/* The tools that build a model from the flags (bin/zero_memory measures what
 * bin/train's run would hold). */
enum { MODEL_TOOLS = TOOL_TRAIN | TOOL_ZERO_MEMORY };

static int flag_table(TrainOptions *o, Flag *f) {
    Flag table[] = {
        { "preset", MODEL_TOOLS, FLAG_TEXT, o->preset, sizeof o->preset, "char (nanoGPT shakespeare_char), char-small (its CPU "
          "recipe), or gpt2, gpt2-medium, gpt2-large, gpt2-xl (nanoGPT's GPT-2 configs and train_gpt2 recipe)" },
        { "data", MODEL_TOOLS, FLAG_TEXT, o->data, sizeof o->data, "a text file (its bytes the tokens), or a folder of token "
          "ids: train.bin and val.bin as nanoGPT's prepare.py or bin/prepare writes them, memory-mapped" },
        { "tokenizer", TOOL_TRAIN | TOOL_SAMPLE | TOOL_PREPARE, FLAG_TEXT, o->tokenizer, sizeof o->tokenizer, "a Hugging Face tokenizer.json (byte-level "
          "BPE) of a token folder's ids: the sample decoded, bin/sample's --prompt encoded, bin/prepare's encoder" },
        { "newlines", TOOL_PREPARE, FLAG_TEXT, o->newlines, sizeof o->newlines, "universal (\\r\\n and a lone \\r "
          "read as \\n, as prepare.py's text mode reads them) or raw (the bytes as they are)" },
        { "zero", TOOL_TRAIN, FLAG_INT, &o->zero, 0, "0: DDP, 1: ZeRO-1 (Adam state sharded), 2: ZeRO-2 (+ gradients), 3: ZeRO-3 (+ weights)" },
        { "gpus", MODEL_TOOLS, FLAG_INT, &o->gpus, 0, "ranks, 1..64 (simulated where there are fewer GPUs)" },
        { "shard-ranks", TOOL_TRAIN | TOOL_ZERO_MEMORY, FLAG_INT, &o->shard_ranks, 0, "ZeRO-1/2/3: shard over groups of this "
          "many ranks and replicate over the groups (hybrid sharding; 0: every rank, full sharding; it divides the world's "
          "ranks; bin/zero_memory: in the rows whose N it divides)" },
        { "estimate", TOOL_ZERO_MEMORY, FLAG_SWITCH, &o->estimate, 0, "build nothing: the rows from the formulas alone "
          "(--estimate is --estimate=1)" },
        { "device", MODEL_TOOLS | TOOL_SAMPLE, FLAG_TEXT, o->device, sizeof o->device, "auto (GPUs if any, else the CPU), cpu or cuda" },
        { "collectives", TOOL_TRAIN, FLAG_TEXT, o->collectives, sizeof o->collectives, "ranks on GPUs through NCCL: ordered "
          "(sums in rank order, the simulator's bits at any split) or nccl (NCCL's own reduce-scatter: faster, bits "
          "that depend on the topology)" },
        { "tf32", TOOL_TRAIN, FLAG_INT, &o->tf32, 0, "1: TF32 tensor cores for fp32 matmuls on GPUs (0: exact fp32)" },
        { "dtype", MODEL_TOOLS, FLAG_TEXT, o->dtype, sizeof o->dtype, "fp32, or bf16: mixed precision as FSDP's "
          "param_dtype=bfloat16 under torch.autocast computes (the master weights and AdamW stay fp32; the "
          "gradients too, unless reduced in bf16)" },
        { "reduce-dtype", MODEL_TOOLS, FLAG_TEXT, o->reduce_dtype, sizeof o->reduce_dtype, "fp32, or bf16: the gradients' "
          "reductions summed in bf16 (rank order kept) at half the bytes, as FSDP's reduce_dtype (with --dtype=bf16, "
          "the gradients held in bf16, the ZeRO paper's)" },
        { "overlap", MODEL_TOOLS, FLAG_INT, &o->overlap, 0, "1: collectives under the backward, ZeRO-3 prefetch (same bits as 0)" },
        { "graphs", TOOL_TRAIN, FLAG_INT, &o->graphs, 0, "1: each kind of training micro-step captured once as a graph "
          "(CUDA's) of every rank's work and run again: one launch a micro-step (same bits as 0)" },
        { "bucket-mb", MODEL_TOOLS, FLAG_FLOAT, &o->bucket_mb, 0, "DDP's gradient bucket, MB (the first one 1 MB)" },
        { "unit", MODEL_TOOLS, FLAG_TEXT, o->unit, sizeof o->unit, "what a unit is: block, half (attention, MLP) or tensor (each "
          "weight matrix with its norm); same bits for each" },
        { "max-live-units", MODEL_TOOLS, FLAG_INT, &o->max_live_units, 0, "ZeRO-2/3 with overlap: units gathered and gradient "
          "slots at once, 1..8 (ZeRO-3 prefetches K-1 ahead; same bits for each)" },
        { "recompute", MODEL_TOOLS, FLAG_INT, &o->recompute, 0, "1: keep only each block's input, run its forward again before "
          "its backward (needs --unit=block; same bits as 0)" },
        { "recompute-gelu", MODEL_TOOLS, FLAG_INT, &o->recompute_gelu, 0, "1: keep GELU's input only, run GELU again before "
          "its backward (llm.c's default): 4 of a block's 15 numbers a position in bf16 not kept; same bits as 0" },
        { "recompute-norms", MODEL_TOOLS, FLAG_INT, &o->recompute_norms, 0, "1: keep the LayerNorms' inputs and "
          "statistics only, run each again before its Linear's backward: 2 of the 15 not kept; same bits as 0" },
        { "link", TOOL_TRAIN, FLAG_TEXT, o->link, sizeof o->link,
          "GBPS[,LATENCY_US]: model a link for simulated ranks (each then on cores of its own, so they progress alike)" },
        { "link-inter", TOOL_TRAIN, FLAG_TEXT, o->link_inter, sizeof o->link_inter, "GBPS[,LATENCY_US]: the modeled link's tier "
          "between the groups of --shard-ranks (nodes); --link is then the link inside one" },
        { "layers", MODEL_TOOLS, FLAG_INT, &o->layers, 0, "transformer blocks" },
        { "heads", MODEL_TOOLS, FLAG_INT, &o->heads, 0, "attention heads" },
        { "embd", MODEL_TOOLS, FLAG_INT, &o->embd, 0, "embedding width (divisible by --heads)" },
        { "bias", MODEL_TOOLS, FLAG_INT, &o->bias, 0, "1: a bias in every Linear and LayerNorm, as GPT-2's (0: none, as nanoGPT's "
          "char configs)" },
        { "gelu", MODEL_TOOLS, FLAG_TEXT, o->gelu, sizeof o->gelu, "erf (exact GELU, as nanoGPT's) or tanh (GPT-2's "
          "approximation, as transformers' gelu_new)" },
        { "pad-vocab", MODEL_TOOLS, FLAG_INT, &o->pad_vocab, 0, "round the model's vocabulary up to a multiple of this (nanoGPT "
          "pads GPT-2's 50257 to 50304; the extra ids never occur in the data)" },
        { "block", MODEL_TOOLS, FLAG_INT, &o->block, 0, "context length" },
        { "batch", MODEL_TOOLS, FLAG_INT, &o->batch, 0, "rows per batch" },
        { "iters", TOOL_TRAIN, FLAG_INT, &o->iters, 0, "optimizer steps" },
        { "lr", TOOL_TRAIN, FLAG_FLOAT, &o->lr, 0, "peak learning rate" },
        { "min-lr", TOOL_TRAIN, FLAG_FLOAT, &o->min_lr, 0, "learning rate at the end of the cosine decay" },
        { "warmup", TOOL_TRAIN, FLAG_INT, &o->warmup, 0, "linear warmup steps" },
        { "lr-decay-iters", TOOL_TRAIN, FLAG_INT, &o->decay_iters, 0, "steps of cosine decay (-1: --iters)" },
        { "dropout", MODEL_TOOLS, FLAG_FLOAT, &o->dropout, 0, "dropout rate, in [0, 1)" },
        { "weight-decay", MODEL_TOOLS, FLAG_FLOAT, &o->weight_decay, 0, "AdamW weight decay (2-D tensors only)" },
        { "beta2", MODEL_TOOLS, FLAG_FLOAT, &o->beta2, 0, "AdamW beta2" },
        { "grad-clip", TOOL_TRAIN, FLAG_FLOAT, &o->grad_clip, 0, "max global gradient norm (0: no clipping)" },
        { "seed", MODEL_TOOLS | TOOL_SAMPLE, FLAG_INT, &o->seed, 0, "seed of init, batches, dropout and sampling" },
        { "eval-every", TOOL_TRAIN, FLAG_INT, &o->eval_every, 0, "steps between evaluations (0: at the end only)" },
        { "eval-iters", TOOL_TRAIN, FLAG_INT, &o->eval_iters, 0, "batches per split per evaluation" },
        { "log-every", TOOL_TRAIN, FLAG_INT, &o->log_every, 0, "steps between progress lines" },
        { "sample-chars", TOOL_TRAIN, FLAG_INT, &o->sample_count, 0, "characters sampled at the end, from a text "
          "file's model (0: none)" },
        { "sample-tokens", TOOL_TRAIN, FLAG_INT, &o->sample_count, 0, "tokens sampled at the end, from a token "
          "folder's model (0: none)" },
        { "log", TOOL_TRAIN, FLAG_TEXT, o->log, sizeof o->log, "also write progress as JSON lines to this file" },
        { "trace", TOOL_TRAIN, FLAG_TEXT, o->trace, sizeof o->trace, "write every rank's stream work in the first --trace-steps steps "
          "as a Chrome trace (Perfetto)" },
        { "trace-steps", TOOL_TRAIN, FLAG_INT, &o->trace_steps, 0, "training steps --trace records, from the first" },
        { "out", TOOL_TRAIN, FLAG_TEXT, o->out, sizeof o->out, "save DIR/ckpt.safetensors at evals (best val loss) and at the end" },
        { "always-save", TOOL_TRAIN, FLAG_INT, &o->always_save, 0, "1: save at every eval, not only at a new best" },
        { "overwrite", TOOL_TRAIN, FLAG_INT, &o->overwrite, 0, "1: a run that does not --resume the checkpoint already in --out "
          "may replace it" },
        { "resume", TOOL_TRAIN, FLAG_TEXT, o->resume, sizeof o->resume, "continue the run a checkpoint holds (any strategy, any N)" },
        { "init-from", TOOL_TRAIN, FLAG_TEXT, o->init_from, sizeof o->init_from, "start from a checkpoint's weights, fresh optimizer" },
        { "grad-accum", TOOL_TRAIN, FLAG_INT, &o->grad_accum, 0, "micro-steps per step (gradient sync on the last)" },
        { "on-nan", TOOL_TRAIN, FLAG_TEXT, o->on_nan, sizeof o->on_nan, "a step with a NaN/inf loss or gradient: stop, or skip it (no update)" },
        { "max-skips", TOOL_TRAIN, FLAG_INT, &o->max_skips, 0, "--on-nan=skip: steps skipped at most, then the run stops" },
        { "max-memory-mb", TOOL_TRAIN, FLAG_FLOAT, &o->max_memory_mb, 0, "cap each rank's device memory, MB (0: none; on the "
          "CPU too)" },
        { "timeout", TOOL_TRAIN, FLAG_FLOAT, &o->timeout, 0, "seconds a collective waits for the other processes (mpirun), "
          "then every process stops" },
        { "nodes", TOOL_TRAIN, FLAG_INT, &o->nodes, 0, "processes of a run on GPUs without mpirun, each started with its "
          "--node-rank and the same --rendezvous" },
        { "node-rank", TOOL_TRAIN, FLAG_INT, &o->node_rank, 0, "this process's index, 0..--nodes-1 (0 makes the NCCL id)" },
        { "rendezvous", TOOL_TRAIN, FLAG_TEXT, o->rendezvous, sizeof o->rendezvous, "file:PATH: where --nodes processes meet "
          "(a shared filesystem; process 0 writes NCCL's id there, the others wait for it up to --timeout)" },
        { "inject-fault", TOOL_TRAIN, FLAG_TEXT, o->inject_fault, sizeof o->inject_fault, "RANK:STEP:WHERE: that rank fails at that "
          "step in the forward, backward, collective, step or save, or hangs (hang; a test of a setup)" },
        { "ckpt", TOOL_SAMPLE, FLAG_TEXT, o->ckpt, sizeof o->ckpt, "the checkpoint to sample from" },
        { "prompt", TOOL_SAMPLE, FLAG_TEXT, o->prompt, sizeof o->prompt, "the text to continue, at most 511 bytes" },
        { "chars", TOOL_SAMPLE, FLAG_INT, &o->sample_count, 0, "characters to generate, from a checkpoint of a text "
          "file's bytes" },
        { "tokens", TOOL_SAMPLE, FLAG_INT, &o->sample_count, 0, "tokens to generate, from a checkpoint of token ids "
          "(with --tokenizer)" },
        { "temperature", TOOL_SAMPLE, FLAG_FLOAT, &o->temperature, 0, "softmax temperature" },
        { "top-k", TOOL_SAMPLE, FLAG_INT, &o->top_k, 0, "sample among the k likeliest (0: all)" },
        { "data", TOOL_PREPARE, FLAG_TEXT, o->data, sizeof o->data, "the text file to encode" },
        { "out", TOOL_PREPARE, FLAG_TEXT, o->out, sizeof o->out, "the folder of train.bin, val.bin and meta.json "
          "(made if missing)" },
        { "overwrite", TOOL_PREPARE, FLAG_INT, &o->overwrite, 0, "1: replace the files already in --out" },
    };
    _Static_assert(sizeof table / sizeof table[0] <= MAX_FLAGS, "more flags than MAX_FLAGS");
    int n = (int)(sizeof table / sizeof table[0]);
    if (f) memcpy(f, table, sizeof table);
    return n;
}

/* The benches take bin/train's flags. */
static unsigned tool_bit(Tool tool) { return tool == TOOL_BENCH ? TOOL_TRAIN : tool; }

const char *options_tool_name(Tool tool) {
    switch (tool) {
    case TOOL_TRAIN: return "train";
    case TOOL_SAMPLE: return "sample";
    case TOOL_PREPARE: return "prepare";
    case TOOL_ZERO_MEMORY: return "zero_memory";
    case TOOL_BENCH: return "bench";
    }
    return "?";
}

void options_usage(FILE *out, Tool tool, TrainOptions *o) {
    Flag flags[MAX_FLAGS];
    int n = flag_table(o, flags);
    fprintf(out, "usage: %s [--flag=value ...]\n\n", options_tool_name(tool));
    if (tool_bit(tool) & MODEL_TOOLS) fprintf(out, "flags (defaults of preset %s):\n", o->preset);
    else fprintf(out, "flags:\n");
    for (int i = 0; i < n; i++) {
        if (!(flags[i].tools & tool_bit(tool))) continue;
        char def[OPTION_PATH_MAX + 16];
        if (flags[i].type == FLAG_INT || flags[i].type == FLAG_SWITCH) snprintf(def, sizeof def, "%d", *(int *)flags[i].value);
        else if (flags[i].type == FLAG_FLOAT) snprintf(def, sizeof def, "%g", *(float *)flags[i].value);
        else snprintf(def, sizeof def, "%s", (char *)flags[i].value);
        fprintf(out, "  --%-16s %s (default: %s)\n", flags[i].name, flags[i].help, def[0] ? def : "none");
    }
    if (tool == TOOL_TRAIN)
        fprintf(out, "\nSIGINT, SIGTERM, SIGHUP, SIGUSR1 or SIGUSR2 stop the run after the step in flight, saved with "
                "--out (exit 128 + the signal).\nUnder mpirun, Ctrl-C or a kill of mpirun sends every process SIGTERM "
                "and, a second later, SIGKILL: give the\nstep in flight and the save longer with `mpirun --mca "
                "odls_base_sigkill_timeout 60 ...`, or stop the run with\n`kill -USR1 <mpirun's pid>`, which mpirun "
                "passes on to every process.\n");
}

/* An empty value is always a mistake (a script's unset variable), never "unset":
 * an empty --resume= would otherwise start from scratch over the checkpoint. */
static int empty_value(const char *prog, const char *name, const char *text, char *err, size_t errlen) {
    if (text[0]) return 0;
    snprintf(err, errlen, "%s: --%s has an empty value (see --help)", prog, name);
    return 2;
}

/* A number as people write one in decimal: digits, a sign, a point, an
 * exponent; not hex ("0x1p3"), "inf" or "nan", which strtof also takes. */
static int decimal_text(const char *text) {
    return text[strspn(text, "0123456789+-.eE")] == 0;
}

static int set_flag(const Flag *f, const char *prog, const char *text, char *err, size_t errlen) {
    char *end;
    errno = 0;
    if (empty_value(prog, f->name, text, err, errlen)) return 2;
    if (f->type == FLAG_INT || f->type == FLAG_SWITCH) {
        long v = strtol(text, &end, 10);
        if (end == text || *end || !decimal_text(text)) {
            snprintf(err, errlen, "%s: --%s expects an integer, got '%s' (see --help)", prog, f->name, text);
            return 2;
        }
        if (errno == ERANGE || v < -2147483647L || v > 2147483647L) {
            snprintf(err, errlen, "%s: --%s=%s is out of range (a 32-bit integer)", prog, f->name, text);
            return 2;
        }
        if (f->type == FLAG_SWITCH && v != 0 && v != 1) {
            snprintf(err, errlen, "%s: --%s=%s must be 0 or 1", prog, f->name, text);
            return 2;
        }
        *(int *)f->value = (int)v;
    } else if (f->type == FLAG_FLOAT) {
        float v = strtof(text, &end);
        if (end == text || *end || !decimal_text(text)) {
            snprintf(err, errlen, "%s: --%s expects a decimal number, got '%s' (see --help)", prog, f->name, text);
            return 2;
        }
        if (errno == ERANGE || !isfinite(v)) {
            snprintf(err, errlen, "%s: --%s=%s is out of range (a finite 32-bit float)", prog, f->name, text);
            return 2;
        }
        *(float *)f->value = v;
    } else {
        if (strlen(text) >= f->size) {
            snprintf(err, errlen, "%s: --%s value is too long (at most %zu bytes)", prog, f->name, f->size - 1);
            return 2;
        }
        snprintf((char *)f->value, f->size, "%s", text);
    }
    return 0;
}

/* "GBPS" or "GBPS,LATENCY_US", positive and finite, into link. */
static int link_parse(const char *text, LinkModel *link) {
    char *end;
    link->gbps = strtod(text, &end);
    link->latency_us = 0.0;
    if (end == text || !isfinite(link->gbps) || link->gbps <= 0) return 0;
    if (*end == ',') {
        const char *lat = end + 1;
        link->latency_us = strtod(lat, &end);
        if (end == lat || !isfinite(link->latency_us) || link->latency_us < 0) return 0;
    }
    return *end == 0;
}

static int link_valid(const char *text) {
    LinkModel link;
    return link_parse(text, &link);
}

/* A link flag's text as a LinkModel; 0, 0 for none. */
static LinkModel link_of(const char *text) {
    LinkModel link;
    if (!text[0] || !link_parse(text, &link)) return (LinkModel){ 0 };
    return link;
}

LinkModel options_link(const TrainOptions *o) { return link_of(o->link); }
LinkModel options_link_inter(const TrainOptions *o) { return link_of(o->link_inter); }

OverlapPolicy options_overlap(const TrainOptions *o) {
    return (OverlapPolicy){ .enabled = o->overlap, .bucket_bytes = (size_t)(o->bucket_mb * 1e6),
                            .max_live_units = o->max_live_units };
}

UnitsPolicy options_units(const TrainOptions *o) {
    return (UnitsPolicy){ .cut = (UnitPolicy)unit_policy_parse(o->unit), .recompute = o->recompute,
                          .recompute_gelu = o->recompute_gelu, .recompute_norms = o->recompute_norms };
}

const char *options_recompute_text(const TrainOptions *o) {
    if (o->recompute) return "whole blocks";
    if (o->recompute_gelu) return o->recompute_norms ? "GELU and LayerNorms" : "GELU";
    return o->recompute_norms ? "LayerNorms" : "nothing";
}

/* One-line complaints about values no run can use. */
/* The arena's tensor table holds 3 + 6 L tensors (runtime/arena.h). */
enum { MAX_LAYERS = (ARENA_MAX_TENSORS - 3) / 6 };

static int validate(TrainOptions *o, Tool tool, char *err, size_t errlen) {
    char bad[192] = "", why[160];
    Fault fault = { .where = FAULT_NONE };
    if (o->layers < 1 || o->layers > MAX_LAYERS)
        snprintf(bad, sizeof bad, "--layers=%d must be in 1..%d", o->layers, MAX_LAYERS);
    else if (o->heads < 1) snprintf(bad, sizeof bad, "--heads=%d must be at least 1", o->heads);
    else if (o->embd < 1) snprintf(bad, sizeof bad, "--embd=%d must be at least 1", o->embd);
    else if (o->embd % o->heads)
        snprintf(bad, sizeof bad, "--embd=%d is not divisible by --heads=%d", o->embd, o->heads);
    else if (o->block < 1) snprintf(bad, sizeof bad, "--block=%d must be at least 1", o->block);
    else if (o->bias != 0 && o->bias != 1) snprintf(bad, sizeof bad, "--bias=%d must be 0 or 1", o->bias);
    else if (strcmp(o->gelu, "erf") && strcmp(o->gelu, "tanh"))
        snprintf(bad, sizeof bad, "--gelu=%s must be erf or tanh", o->gelu);
    else if (o->pad_vocab < 1 || o->pad_vocab > 4096)
        snprintf(bad, sizeof bad, "--pad-vocab=%d must be in 1..4096", o->pad_vocab);
    else if (tool == TOOL_ZERO_MEMORY && (o->shard_ranks < 0 || o->shard_ranks > MAX_RANKS))
        snprintf(bad, sizeof bad, "--shard-ranks=%d must be a group's ranks, 1..%d (0: none)", o->shard_ranks, MAX_RANKS);
    else if (o->gpus < 1 || o->gpus > MAX_RANKS)
        snprintf(bad, sizeof bad, "--gpus=%d must be in 1..%d", o->gpus, MAX_RANKS);
    else if (strcmp(o->device, "auto") && strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        snprintf(bad, sizeof bad, "--device=%s must be auto, cpu or cuda", o->device);
    else if (strcmp(o->collectives, "ordered") && strcmp(o->collectives, "nccl"))
        snprintf(bad, sizeof bad, "--collectives=%s must be ordered or nccl", o->collectives);
    else if (o->tf32 != 0 && o->tf32 != 1) snprintf(bad, sizeof bad, "--tf32=%d must be 0 or 1", o->tf32);
    else if (o->overlap != 0 && o->overlap != 1) snprintf(bad, sizeof bad, "--overlap=%d must be 0 or 1", o->overlap);
    else if (o->graphs != 0 && o->graphs != 1) snprintf(bad, sizeof bad, "--graphs=%d must be 0 or 1", o->graphs);
    else if (dtype_named(o->dtype) < 0)
        snprintf(bad, sizeof bad, "--dtype=%s must be fp32 or bf16", o->dtype);
    else if (dtype_named(o->reduce_dtype) < 0)
        snprintf(bad, sizeof bad, "--reduce-dtype=%s must be fp32 or bf16", o->reduce_dtype);
    else if (unit_policy_parse(o->unit) < 0)
        snprintf(bad, sizeof bad, "--unit=%s must be block, half or tensor", o->unit);
    else if (o->max_live_units < 1)  /* 0 is the config's default, not the flag's; the top, strategy_config_error's */
        snprintf(bad, sizeof bad, "--max-live-units=%d must be in 1..%d", o->max_live_units, MAX_LIVE_UNITS);
    else if (o->recompute != 0 && o->recompute != 1)
        snprintf(bad, sizeof bad, "--recompute=%d must be 0 or 1", o->recompute);
    else if (o->recompute_gelu != 0 && o->recompute_gelu != 1)
        snprintf(bad, sizeof bad, "--recompute-gelu=%d must be 0 or 1", o->recompute_gelu);
    else if (o->recompute_norms != 0 && o->recompute_norms != 1)
        snprintf(bad, sizeof bad, "--recompute-norms=%d must be 0 or 1", o->recompute_norms);
    else if (!(o->bucket_mb > 0) || o->bucket_mb > 4096)
        snprintf(bad, sizeof bad, "--bucket-mb=%g must be in (0, 4096]", o->bucket_mb);
    else if (o->trace_steps < 1) snprintf(bad, sizeof bad, "--trace-steps=%d must be at least 1", o->trace_steps);
    else if (o->grad_accum < 1 || o->grad_accum > 1024)
        snprintf(bad, sizeof bad, "--grad-accum=%d must be in 1..1024", o->grad_accum);
    else if (o->always_save != 0 && o->always_save != 1)
        snprintf(bad, sizeof bad, "--always-save=%d must be 0 or 1", o->always_save);
    else if (o->overwrite != 0 && o->overwrite != 1)
        snprintf(bad, sizeof bad, "--overwrite=%d must be 0 or 1", o->overwrite);
    else if (strcmp(o->newlines, "universal") && strcmp(o->newlines, "raw"))
        snprintf(bad, sizeof bad, "--newlines=%s must be universal or raw", o->newlines);
    else if (strcmp(o->on_nan, "stop") && strcmp(o->on_nan, "skip"))
        snprintf(bad, sizeof bad, "--on-nan=%s must be stop or skip", o->on_nan);
    else if (o->max_skips < 0) snprintf(bad, sizeof bad, "--max-skips=%d must not be negative", o->max_skips);
    else if (o->resume[0] && o->init_from[0]) snprintf(bad, sizeof bad, "--resume and --init-from exclude each other");
    else if (!(o->temperature > 0)) snprintf(bad, sizeof bad, "--temperature=%g must be positive", o->temperature);
    else if (o->top_k < 0) snprintf(bad, sizeof bad, "--top-k=%d must not be negative", o->top_k);
    else if (o->max_memory_mb < 0)
        snprintf(bad, sizeof bad, "--max-memory-mb=%g must not be negative", o->max_memory_mb);
    else if (o->inject_fault[0] && fault_parse(o->inject_fault, &fault, why, sizeof why) != 0)
        snprintf(bad, sizeof bad, "--inject-fault=%s", why);
    else if (o->nodes < 1 || o->nodes > MAX_RANKS)
        snprintf(bad, sizeof bad, "--nodes=%d must be in 1..%d", o->nodes, MAX_RANKS);
    else if (o->node_rank < 0 || o->node_rank >= o->nodes)
        snprintf(bad, sizeof bad, "--node-rank=%d must be in 0..%d (--nodes=%d)", o->node_rank, o->nodes - 1, o->nodes);
    else if (o->nodes > 1 && world()->nprocs > 1)
        snprintf(bad, sizeof bad, "--nodes=%d: mpirun started %d processes already; use one or the other",
                 o->nodes, world()->nprocs);
    else if (o->rendezvous[0] && (strncmp(o->rendezvous, "file:", 5) != 0 || !o->rendezvous[5]))
        snprintf(bad, sizeof bad, "--rendezvous=%.64s must be file:PATH", o->rendezvous);
    else if (o->nodes > 1 && !o->rendezvous[0])
        snprintf(bad, sizeof bad, "--nodes=%d needs --rendezvous=file:PATH, where the processes meet", o->nodes);
    else if (o->nodes > 1 && strcmp(o->device, "cpu") == 0)
        snprintf(bad, sizeof bad, "--nodes=%d joins processes through NCCL; ranks on the CPU (--device=cpu) across "
                 "processes need mpirun", o->nodes);
    else if (o->inject_fault[0] && fault.rank >= o->gpus * world()->nprocs * o->nodes)
        snprintf(bad, sizeof bad, "--inject-fault=%s names rank %d, and the run has ranks 0..%d", o->inject_fault,
                 fault.rank, o->gpus * world()->nprocs * o->nodes - 1);
    else if (!(o->timeout >= 1) || o->timeout > 1e6)
        snprintf(bad, sizeof bad, "--timeout=%g must be in [1, 1e6] seconds (a process takes about a second to "
                 "start)", o->timeout);
    else if (o->rendezvous[0] && o->nodes == 1)
        snprintf(bad, sizeof bad, "--rendezvous=%.64s needs --nodes, the processes that meet there", o->rendezvous);
    else if (o->inject_fault[0] && (fault.where == FAULT_SAVE ? fault.step < 1 || fault.step > o->iters
                                                              : fault.step >= o->iters))
        snprintf(bad, sizeof bad, "--inject-fault=%s names step %d, and the run's %s %d..%d (--iters=%d)",
                 o->inject_fault, fault.step, fault.where == FAULT_SAVE ? "saves hold steps" : "steps are",
                 fault.where == FAULT_SAVE ? 1 : 0, fault.where == FAULT_SAVE ? o->iters : o->iters - 1, o->iters);
    else if (o->link[0] && !link_valid(o->link))
        snprintf(bad, sizeof bad, "--link=%s must be GBPS or GBPS,LATENCY_US, both positive numbers", o->link);
    else if (o->link_inter[0] && !link_valid(o->link_inter))
        snprintf(bad, sizeof bad, "--link-inter=%s must be GBPS or GBPS,LATENCY_US, both positive numbers",
                 o->link_inter);
    else if (o->batch < 1) snprintf(bad, sizeof bad, "--batch=%d (rows per rank) must be at least 1", o->batch);
    else if (o->iters < 0) snprintf(bad, sizeof bad, "--iters=%d must not be negative", o->iters);
    else if (o->warmup < 0) snprintf(bad, sizeof bad, "--warmup=%d must not be negative", o->warmup);
    else if (!(o->lr > 0)) snprintf(bad, sizeof bad, "--lr=%g must be positive", o->lr);
    else if (o->min_lr < 0) snprintf(bad, sizeof bad, "--min-lr=%g must not be negative", o->min_lr);
    else if (o->min_lr > o->lr)
        snprintf(bad, sizeof bad, "--min-lr=%g is above --lr=%g (the decay goes down to it)", o->min_lr, o->lr);
    else if (o->dropout < 0 || o->dropout >= 1)
        snprintf(bad, sizeof bad, "--dropout=%g must be in [0, 1)", o->dropout);
    else if (o->weight_decay < 0)
        snprintf(bad, sizeof bad, "--weight-decay=%g must not be negative", o->weight_decay);
    else if (o->beta2 < 0 || o->beta2 >= 1) snprintf(bad, sizeof bad, "--beta2=%g must be in [0, 1)", o->beta2);
    else if (o->grad_clip < 0) snprintf(bad, sizeof bad, "--grad-clip=%g must not be negative", o->grad_clip);
    else if (o->sample_count < 0)
        snprintf(bad, sizeof bad, "the sample's length (%s) is %d: it must not be negative",
                 tool == TOOL_SAMPLE ? "--chars or --tokens" : "--sample-chars or --sample-tokens", o->sample_count);
    else if (o->eval_every < 0 || o->eval_iters < 0 || o->log_every < 0)
        snprintf(bad, sizeof bad, "--eval-every, --eval-iters and --log-every must not be negative");
    /* the kernels index one batch's activations with int */
    else if ((double)o->batch * o->block * 4.0 * o->embd > INT_MAX ||
             (double)o->batch * o->heads * o->block * o->block > INT_MAX)
        snprintf(bad, sizeof bad, "--batch=%d --block=%d --embd=%d --heads=%d: one batch's activations "
                 "exceed 2^31 floats", o->batch, o->block, o->embd, o->heads);
    /* the rules of what a strategy can run are the strategies' own (bin/zero_memory's groups are its rows') */
    StrategyConfig asked = { .nranks = o->gpus * world()->nprocs,
                             .shard_ranks = tool == TOOL_ZERO_MEMORY ? 0 : o->shard_ranks,
                             .overlap = options_overlap(o), .units = options_units(o), .link = options_link(o),
                             .link_inter = options_link_inter(o) };
    if (!bad[0]) strategy_config_error(o->zero, &asked, bad, sizeof bad);
    o->fault = fault;
    if (!bad[0]) return 0;
    snprintf(err, errlen, "%s: %s", options_tool_name(tool), bad);
    return 2;
}

/* Whether arg is --name, as --name=VALUE or --name. */
static int names_flag(const char *arg, const char *name) {
    size_t len = strlen(name);
    return strncmp(arg, "--", 2) == 0 && strncmp(arg + 2, name, len) == 0 && (arg[2 + len] == '=' || arg[2 + len] == 0);
}

/* Whether row f is --name (its first len bytes). */
static int row_named(const Flag *f, const char *name, size_t len) {
    return strlen(f->name) == len && strncmp(f->name, name, len) == 0;
}

/* The row of --name (its first len bytes) that tool takes; NULL for none. */
static const Flag *find_flag(const Flag *flags, int n, Tool tool, const char *name, size_t len) {
    for (int k = 0; k < n; k++)
        if (row_named(&flags[k], name, len) && (flags[k].tools & tool_bit(tool))) return &flags[k];
    return NULL;
}

/* The message for a flag tool does not take: another tool's, named as such,
 * or one no tool has. */
static void refuse_flag(const Flag *flags, int n, Tool tool, const char *name, size_t len, char *err, size_t errlen) {
    unsigned owners = 0;
    for (int k = 0; k < n; k++)
        if (row_named(&flags[k], name, len)) owners |= flags[k].tools;
    const char *prog = options_tool_name(tool);
    if (!owners) {
        snprintf(err, errlen, "%s: unknown flag '--%.*s' (see --help)", prog, (int)len, name);
        return;
    }
    char list[96] = "";
    for (unsigned bit = TOOL_TRAIN; bit <= TOOL_ZERO_MEMORY; bit <<= 1)
        if (owners & bit)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%sbin/%s", list[0] ? ", " : "",
                     options_tool_name((Tool)bit));
    snprintf(err, errlen, "%s: --%.*s is a flag of %s, not of bin/%s (see --help)", prog, (int)len, name, list, prog);
}

/* The --preset the command line names (tool's default without one): the
 * preset goes first, whatever its place on the command line. */
static const char *preset_named(Tool tool, const char *default_preset, int argc, char **argv) {
    const char *preset = default_preset;
    if (!(tool_bit(tool) & MODEL_TOOLS)) return preset;  /* refused as another tool's flag */
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--preset=", 9) == 0) preset = argv[i] + 9;
        else if (strcmp(argv[i], "--preset") == 0 && i + 1 < argc) preset = argv[i + 1];
    }
    return preset;
}

int options_read(TrainOptions *o, Tool tool, const char *default_preset, int argc, char **argv, char *err,
                 size_t errlen) {
    err[0] = 0;
    const char *prog = options_tool_name(tool), *preset = preset_named(tool, default_preset, argc, argv);
    if (empty_value(prog, "preset", preset, err, errlen)) return 2;
    if (options_preset(o, preset) != 0) {
        snprintf(err, errlen, "%s: unknown --preset '%s' (char, char-small, gpt2, gpt2-medium, gpt2-large or gpt2-xl)",
                 prog, preset);
        return 2;
    }
    Flag flags[MAX_FLAGS];
    int n = flag_table(o, flags);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) return 1;
        if (strncmp(arg, "--", 2) != 0) {
            snprintf(err, errlen, "%s: unexpected argument '%s' (see --help)", prog, arg);
            return 2;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Flag *f = find_flag(flags, n, tool, name, len);
        if (!f) {
            refuse_flag(flags, n, tool, name, len, err, errlen);
            return 2;
        }
        const char *value = eq ? eq + 1 : f->type == FLAG_SWITCH ? "1" : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            snprintf(err, errlen, "%s: --%s needs a value (see --help)", prog, f->name);
            return 2;
        }
        int rc = set_flag(f, prog, value, err, errlen);
        if (rc) return rc;
    }
    return validate(o, tool, err, errlen);
}

int options_check_sample_unit(const TrainOptions *o, Tool tool, int characters, int argc, char **argv, char *err,
                              size_t errlen) {
    if (o->sample_count == 0) return 0;  /* no sample: no unit to name */
    const char *chars = tool == TOOL_SAMPLE ? "chars" : "sample-chars";
    const char *tokens = tool == TOOL_SAMPLE ? "tokens" : "sample-tokens";
    const char *wrong = characters ? tokens : chars, *last = NULL;  /* the last of the two names the length */
    for (int i = 1; i < argc; i++) {
        if (names_flag(argv[i], chars)) last = chars;
        if (names_flag(argv[i], tokens)) last = tokens;
    }
    if (last != wrong) return 0;
    snprintf(err, errlen, "%s: --%s counts %s, and this model's tokens are %s: use --%s",
             options_tool_name(tool), wrong, characters ? "tokens" : "characters",
             characters ? "a text file's bytes" : "ids of a tokenizer", characters ? chars : tokens);
    return 2;
}

int options_given(int argc, char **argv, const char *name) {
    for (int i = 1; i < argc; i++)
        if (names_flag(argv[i], name)) return 1;
    return 0;
}

int options_take_hf_model(TrainOptions *o, const ModelConfig *hf, int argc, char **argv, char *err,
                          size_t errlen) {
    const char *gelu = hf->gelu_tanh ? "tanh" : "erf";
    struct { const char *flag; int *ours; int theirs; } shape[] = {
        { "layers", &o->layers, hf->layers }, { "heads", &o->heads, hf->heads }, { "embd", &o->embd, hf->embd },
        { "bias", &o->bias, hf->bias },
    };
    for (size_t i = 0; i < sizeof shape / sizeof *shape; i++) {
        if (options_given(argc, argv, shape[i].flag) && *shape[i].ours != shape[i].theirs) {
            snprintf(err, errlen, "train: --%s=%d, and the Hugging Face --init-from=%.300s has %d", shape[i].flag,
                     *shape[i].ours, o->init_from, shape[i].theirs);
            return 2;
        }
        *shape[i].ours = shape[i].theirs;
    }
    if (options_given(argc, argv, "gelu") && strcmp(o->gelu, gelu) != 0) {
        snprintf(err, errlen, "train: --gelu=%s, and the Hugging Face --init-from=%.300s has GELU's %s form", o->gelu,
                 o->init_from, gelu);
        return 2;
    }
    snprintf(o->gelu, sizeof o->gelu, "%s", gelu);
    if (options_given(argc, argv, "block") && o->block > hf->block_size) {
        snprintf(err, errlen, "train: --block=%d, and the Hugging Face --init-from=%.300s has %d positions", o->block,
                 o->init_from, hf->block_size);
        return 2;
    }
    if (!options_given(argc, argv, "block")) o->block = hf->block_size;
    o->init_vocab = hf->vocab;
    return validate(o, TOOL_TRAIN, err, errlen);
}

int options_parse(TrainOptions *o, Tool tool, const char *default_preset, int argc, char **argv) {
    char err[OPTION_PATH_MAX + 256];
    int rc = options_read(o, tool, default_preset, argc, argv, err, sizeof err);
    if (rc == 1) options_usage(stdout, tool, o);
    if (rc == 2) fprintf(stderr, "%s\n", err);
    return rc;
}

/* FNV-1a, 64 bits: enough to tell two runs apart. */
uint64_t options_hash(uint64_t h, const void *data, size_t bytes) {
    const unsigned char *p = data;
    for (size_t i = 0; i < bytes; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int options_flag_hashes(TrainOptions *o, uint64_t *hashes, const char **names) {
    Flag flags[MAX_FLAGS];
    int n = flag_table(o, flags), kept = 0;
    for (int k = 0; k < n; k++) {
        const Flag *f = &flags[k];
        if (!(f->tools & TOOL_TRAIN)) continue;
        size_t bytes = f->type == FLAG_TEXT    ? strlen((const char *)f->value) + 1
                       : f->type == FLAG_FLOAT ? sizeof(float)
                                               : sizeof(int);
        names[kept] = f->name;
        /* --node-rank is each process's own */
        hashes[kept] = strcmp(f->name, "node-rank") == 0 ? 0 : options_hash(0xcbf29ce484222325ull, f->value, bytes);
        kept++;
    }
    return kept;
}

Placement options_placement(const TrainOptions *o) {
    if (strcmp(o->device, "cpu") == 0) return PLACE_CPU;
    if (strcmp(o->device, "cuda") == 0) return PLACE_CUDA;
    return PLACE_AUTO;
}

DType options_precision(const TrainOptions *o) { return (DType)dtype_named(o->dtype); }
DType options_reduce_precision(const TrainOptions *o) { return (DType)dtype_named(o->reduce_dtype); }

SumOrder options_sums(const TrainOptions *o) {
    return strcmp(o->collectives, "nccl") == 0 ? SUMS_NCCL : SUMS_ORDERED;
}

int options_join_world(const TrainOptions *o) {
    if (o->nodes == 1) return 0;
    if (device_cuda_count() == 0) {  /* no run of --nodes can start here: a command line's error */
        fprintf(stderr, "train: --nodes=%d joins processes through NCCL, and no GPU is visible (%s)\n", o->nodes,
                device_cuda_absence());
        return 2;
    }
    return world_join_file(o->nodes, o->node_rank, o->rendezvous + strlen("file:")) == 0 ? 0 : 1;
}

int options_no_strategy_status(const TrainOptions *o) {
    return options_placement(o) != PLACE_CPU && device_cuda_count() < 0 ? 1 : 2;
}
